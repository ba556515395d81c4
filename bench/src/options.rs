//! What a run is given: the sizes and knobs of every benchmark ([`Options`], full or tiny) and
//! the figures one benchmark measures for later ones ([`Shared`]).

use std::path::PathBuf;
use std::time::Duration;

/// Sizes and knobs of a run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Repetitions of each measurement; the median is reported.
    pub runs: usize,
    /// Cluster routes programmed by benchmarks 1-3 (10,000).
    pub routes: usize,
    /// Routes of other writers in the table of benchmark 3 (90,000: 100,000 in all).
    pub foreign: usize,
    /// Nodes, IPAM blocks and borrowed IPs of benchmark 4 (5,000 / 100,000 / 10,000); nodes
    /// and blocks of `all-nodes-5k` too.
    pub compute: ComputeSize,
    /// Conflicts timed by benchmark 7 (1,000).
    pub conflicts: usize,
    /// The IPAM block changes `kube-100k` streams once synced (1,000 a second for 10 s).
    pub kube_churn: KubeChurn,
    /// Nodes of the cluster of benchmark 8 (its node gets `routes` routes).
    pub footprint_nodes: usize,
    /// Idle window of benchmark 8 (185 s: two of the agent's default 90-s resyncs; 10 s with
    /// `--quick`).
    pub idle: Duration,
    /// Churn phase of benchmark 8, one datastore change a second (30 s; 5 s with `--quick`).
    pub churn: Duration,
    /// Length of each UDP stream of benchmark 6 (2 s).
    pub stream: Duration,
    /// The release agent binary for benchmark 8 (`target/release/routewarden`).
    pub agent_bin: Option<PathBuf>,
    /// This harness's own binary, re-executed for the compute-only child of benchmark 4;
    /// `None` computes in-process (peak memory then includes the harness).
    pub child_exe: Option<PathBuf>,
}

/// A stream of watch events: `per_s` a second for `window`.
#[derive(Clone, Copy, Debug)]
pub struct KubeChurn {
    /// Events a second.
    pub per_s: u64,
    /// How long the stream lasts.
    pub window: Duration,
}

/// The cluster of benchmark 4.
#[derive(Clone, Copy, Debug)]
pub struct ComputeSize {
    /// Nodes.
    pub nodes: usize,
    /// IPAM blocks (/26), spread round-robin over the nodes, half in an IPIP CrossSubnet pool,
    /// half in a no-encap pool.
    pub blocks: usize,
    /// Blocks with one IP borrowed by another node (a /32 route each).
    pub borrowed: usize,
}

impl Options {
    /// The sizes the benchmarks' targets are set for.
    pub fn full() -> Options {
        Options {
            runs: 5,
            routes: 10_000,
            foreign: 90_000,
            compute: ComputeSize { nodes: 5_000, blocks: 100_000, borrowed: 10_000 },
            conflicts: 1_000,
            kube_churn: KubeChurn { per_s: 1_000, window: Duration::from_secs(10) },
            footprint_nodes: 500,
            idle: crate::benchmarks::agent_footprint::IDLE_TWO_RESYNCS,
            churn: Duration::from_secs(30),
            stream: Duration::from_secs(2),
            agent_bin: None,
            child_exe: None,
        }
    }

    /// A run small enough for a smoke test (well-formed lines, not figures).
    pub fn tiny() -> Options {
        Options {
            runs: 1,
            routes: 100,
            foreign: 900,
            compute: ComputeSize { nodes: 50, blocks: 1_000, borrowed: 100 },
            conflicts: 20,
            kube_churn: KubeChurn { per_s: 100, window: Duration::from_secs(1) },
            footprint_nodes: 10,
            idle: Duration::from_secs(1),
            churn: Duration::from_secs(2),
            stream: Duration::from_millis(200),
            agent_bin: None,
            child_exe: None,
        }
    }
}

/// Figures measured earlier in the same run, reused by later benchmarks.
#[derive(Debug, Default)]
pub struct Shared {
    /// Median time of routewarden's cold programming of `routes` routes (benchmark 1).
    pub rw_program: Option<(Duration, usize)>,
    /// The same in nexthop-object mode (benchmark 1's `rw_nh_ms`), with its route count.
    pub rw_program_nh: Option<(Duration, usize)>,
}
