//! routewarden's benchmarks: the library behind the `bench` binary that
//! `cargo xtask bench` builds in release mode and runs, and that `agent/tests/privileged/bench_smoke.rs`
//! runs a tiny instance of ([`Options::tiny`]), so the harness cannot rot.
//!
//! Every measurement runs in a fresh network namespace ([`netns::in_node_netns`]) or in a
//! throw-away lab ([`routewarden_lab::Lab`]); nothing touches the namespace the process started
//! in. Each measurement is repeated [`Options::runs`] times and the median is used: the machines
//! are noisy, the ratio against a reference measured in the same run is the figure that matters.
//! Each benchmark gives one [`Outcome`], printed as one line:
//! `bench <name> ratio=<value> target=<value> <details>` (BENCHMARKS.md at the repository root).
//!
//! # Layout
//!
//! - [`benchmarks`]: one file per benchmark, named after it, and the registry ([`BENCHMARKS`]).
//! - [`options`]: the sizes and knobs of a run, and figures one benchmark leaves for later ones.
//! - [`report`]: the result line ([`Outcome`], [`Target`]) and the number formats in it.
//! - [`results`]: the recorded last result of each benchmark and the table BENCHMARKS.md opens with.
//! - [`netns`]: the node namespace the routing benchmarks run in, and `ip`.
//! - [`fixtures`]: the cluster routes and clusters the benchmarks are fed.
//! - [`runs`]: routewarden's cold programming (the side most benchmarks time) and the churn watch.
//! - [`procfs`]: a process's memory and CPU time from `/proc`.
//!
//! A helper that only one benchmark uses (the `ip -batch` and BIRD reference runners) lives
//! in that benchmark's file.
//!
//! # Adding a benchmark
//!
//! 1. Add `src/benchmarks/<name>.rs` (the name with `-` as `_`), with a module doc saying what is
//!    measured, against which reference measured in the same run, and the target (its source),
//!    and:
//!    ```ignore
//!    pub const BENCHMARK: Benchmark = Benchmark { name: "<name>", run };
//!
//!    pub fn run(opts: &Options, shared: &mut Shared) -> Result<Outcome> { ... }
//!    ```
//!    Its sizes come from [`Options`] (add a field there if none fits, with a full and a tiny
//!    value); what cannot run here is an [`Outcome::Skipped`] with the reason, an error is
//!    reported as [`Outcome::Failed`].
//! 2. Add `<name>` to the `registry!` list in `src/benchmarks/mod.rs`, where a run of all of
//!    them should take it.
//!
//! The command line (`bench <name>`, `--help`), `cargo xtask bench <name>` and the smoke test
//! pick it up from there. Also list it in `cargo xtask bench --help` (`xtask/src/bench.rs`) and
//! BENCHMARKS.md; if it cannot run in the smoke test's context, add it to `DOCUMENTED_SKIPS` in
//! `agent/tests/privileged/bench_smoke.rs` with the reason it prints.

#![allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "figures are printed with a few significant digits")]

pub mod benchmarks;
pub mod fixtures;
pub mod netns;
pub mod options;
pub mod procfs;
pub mod report;
pub mod results;
pub mod runs;

use anyhow::Result;

pub use benchmarks::cold_program_vs_bird::BIRD;
pub use benchmarks::etcd_100k::ETCD;
pub use benchmarks::BENCHMARKS;
pub use options::{ComputeSize, KubeChurn, Options, Shared};
pub use report::{median, median_f64, Outcome, Target};

/// One benchmark: its name and what runs it.
#[derive(Clone, Copy, Debug)]
pub struct Benchmark {
    /// The name, as given on the command line and printed in `bench <name> ...`.
    pub name: &'static str,
    /// Run it with the run's options; `shared` holds figures earlier benchmarks of the run
    /// measured. An `Err` is reported as `bench <name> failed reason="..."`.
    pub run: fn(&Options, &mut Shared) -> Result<Outcome>,
}

/// Every benchmark's name, in the order a run of all of them goes ([`BENCHMARKS`]).
pub const ALL: [&str; BENCHMARKS.len()] = {
    let mut names = [""; BENCHMARKS.len()];
    let mut i = 0;
    while i < names.len() {
        names[i] = BENCHMARKS[i].name;
        i += 1;
    }
    names
};

/// Run benchmark `name`: its [`Outcome`], `Skipped` ("not implemented") for a name no
/// benchmark has, `Failed` when it could not run to the end.
pub fn run_one(name: &str, opts: &Options, shared: &mut Shared) -> Outcome {
    let r = match BENCHMARKS.iter().find(|b| b.name == name) {
        Some(b) => (b.run)(opts, shared),
        None => Ok(Outcome::Skipped { name: name.into(), reason: "not implemented".into() }),
    };
    r.unwrap_or_else(|e| Outcome::Failed { name: name.into(), reason: format!("{e:#}") })
}
