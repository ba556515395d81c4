//! One file per benchmark, named after it (`-` as `_`), and the registry: which benchmarks
//! exist and the order a run of all of them goes.
//!
//! Each file holds `pub const BENCHMARK: Benchmark` (its name and its `run`) and its `run`; the
//! crate doc says how to add one.

use crate::Benchmark;

/// Declares each benchmark's module and lists its `BENCHMARK` in [`BENCHMARKS`], in order.
macro_rules! registry {
    ($($module:ident),+ $(,)?) => {
        $(pub mod $module;)+

        /// Every benchmark, in the order a run of all of them goes.
        pub const BENCHMARKS: &[Benchmark] = &[$($module::BENCHMARK),+];
    };
}

registry! {
    cold_program_10k,
    cold_program_vs_bird,
    cold_program_vs_floor,
    resync_100k,
    node_move,
    compute_100k,
    watch_overhead,
    tc_overhead,
    detect_latency,
    agent_footprint,
    bad_input_worst,
    all_nodes_5k,
    kube_heartbeats,
    kube_100k,
    etcd_100k,
    route_change_100k,
}
