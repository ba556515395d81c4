//! `compute-100k` (benchmark 4): the whole plan pass the agent runs per snapshot
//! (`routewarden::plan::plan` in Felix's role: the ownership decision, the routes of every
//! routable class in one pass, the audit's expectations, the policy) for one node of a
//! 5,000-node, 100,000-block cluster, against a reference that does not depend on routewarden:
//! the kernel floor for the same routes (the cheapest writer of exactly those routes into an
//! empty table, [`floor_once`] with [`FLOOR`]), measured in the same run. Target: at most 0.1.
//! Computed in a child process of the harness (`bench --compute-child ...`), so its peak
//! memory is the computation's alone.
//!
//! Also reported: `compute_ms`, `desired_routes` alone, and the old reference
//! (`program_est_ms`, that many routes at benchmark 1's per-route rate: routewarden's own
//! speed, so a slower reconciler made the old ratio look better).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use routewarden::datastore::Snapshot;
use routewarden::plan;
use routewarden::routes::{desired_routes, RouteDevices};
use routewarden::vocabulary::PoolClass;

use super::cold_program_vs_floor::{floor_once, FLOOR};
use crate::fixtures::{compute_cluster, felix_plan_config};
use crate::procfs::proc_mem_kib;
use crate::report::{kv, ms};
use crate::runs::rw_program_median;
use crate::{median, Benchmark, ComputeSize, Options, Outcome, Shared, Target};

/// This benchmark's registry entry: its name and [`run`].
pub const BENCHMARK: Benchmark = Benchmark { name: "compute-100k", run };

/// What the compute-only process measured.
#[derive(Clone, Copy, Debug)]
pub struct ComputeFigures {
    /// Routes computed.
    pub routes: usize,
    /// Median time of one `desired_routes`.
    pub median: Duration,
    /// Median time of one `plan::plan` of the same node.
    pub plan_median: Duration,
    /// Peak RSS after the cluster was built, before computing (KiB).
    pub model_peak_kib: u64,
    /// Peak RSS after computing (KiB).
    pub peak_kib: u64,
}

/// Build the cluster, compute node-00000's routes `runs` times. What the compute-only child
/// runs (and the smoke test, in-process).
pub fn compute_in_process(size: ComputeSize, runs: usize) -> Result<ComputeFigures> {
    let cluster = compute_cluster(size);
    let classes = BTreeSet::from([PoolClass::Ipip, PoolClass::NoEncap]);
    let devices = RouteDevices::default();
    let (model_peak_kib, _) = proc_mem_kib("self")?;
    let mut times = Vec::new();
    let mut routes = 0;
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        let d = desired_routes(&cluster, "node-00000", &classes, &devices);
        times.push(t.elapsed());
        routes = d.routes.len();
        ensure!(d.problems.is_empty(), "compute reported problems: {:?}", &d.problems[..d.problems.len().min(3)]);
        drop(d);
    }
    let plan_median = plan_median(Arc::new(cluster), runs.max(1));
    let (peak_kib, _) = proc_mem_kib("self")?;
    Ok(ComputeFigures { routes, median: median(times), plan_median, model_peak_kib, peak_kib })
}

/// The median time of `runs` plan passes of node-00000 in Felix's role over `cluster`, each
/// given the previous one's programmed classes and owned pools, as the app does.
fn plan_median(cluster: Arc<routewarden::model::Cluster>, runs: usize) -> Duration {
    let snapshot = Snapshot { cluster, object_errors: Vec::new(), load_errors: Vec::new(), inputs: 1, settled: true };
    let config = felix_plan_config("node-00000");
    let (mut programmed, mut owned, mut times) = (BTreeSet::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let t = Instant::now();
        let p = plan::plan(&snapshot, &config, &programmed, &owned);
        times.push(t.elapsed());
        programmed.clone_from(&p.decision.programmed);
        owned = p.policy.owned;
    }
    median(times)
}

/// Run [`compute_in_process`] in a child process of this harness (so peak memory is the
/// computation's alone) and parse its answer.
fn compute_in_child(exe: &Path, size: ComputeSize, runs: usize) -> Result<ComputeFigures> {
    let out = Command::new(exe)
        .args(["--compute-child", &size.nodes.to_string(), &size.blocks.to_string(), &size.borrowed.to_string(), &runs.to_string()])
        .stderr(Stdio::inherit())
        .output()
        .context("start the compute child")?;
    ensure!(out.status.success(), "compute child failed: {}", out.status);
    let text = String::from_utf8_lossy(&out.stdout);
    let mut f = BTreeMap::new();
    for kv in text.split_whitespace() {
        if let Some((k, v)) = kv.split_once('=') {
            f.insert(k.to_string(), v.parse::<u64>().with_context(|| format!("compute child: {kv}"))?);
        }
    }
    let get = |k: &str| f.get(k).copied().with_context(|| format!("compute child did not report {k}: {text}"));
    Ok(ComputeFigures {
        routes: usize::try_from(get("routes")?)?,
        median: Duration::from_nanos(get("median_ns")?),
        plan_median: Duration::from_nanos(get("plan_median_ns")?),
        model_peak_kib: get("model_peak_kib")?,
        peak_kib: get("peak_kib")?,
    })
}

/// The compute child's entry point: `--compute-child <nodes> <blocks> <borrowed> <runs>`.
pub fn child_main(args: &[String]) -> Result<()> {
    let num = |i: usize| -> Result<usize> { Ok(args.get(i).context("--compute-child needs 4 numbers")?.parse()?) };
    let size = ComputeSize { nodes: num(0)?, blocks: num(1)?, borrowed: num(2)? };
    let f = compute_in_process(size, num(3)?)?;
    println!(
        "routes={} median_ns={} plan_median_ns={} model_peak_kib={} peak_kib={}",
        f.routes,
        f.median.as_nanos(),
        f.plan_median.as_nanos(),
        f.model_peak_kib,
        f.peak_kib
    );
    Ok(())
}

/// The kernel floor for node-00000's routes of the compute cluster: the routes computed again
/// here (untimed), written `runs` times into fresh namespaces by the floor writer; the median.
fn kernel_floor(size: ComputeSize, runs: usize) -> Result<(Duration, usize)> {
    let cluster = compute_cluster(size);
    let classes = BTreeSet::from([PoolClass::Ipip, PoolClass::NoEncap]);
    let routes = Arc::new(desired_routes(&cluster, "node-00000", &classes, &RouteDevices::default()).routes);
    drop(cluster);
    let mut times = Vec::new();
    for _ in 0..runs.max(1) {
        times.push(floor_once(Arc::clone(&routes), FLOOR)?.0);
    }
    Ok((median(times), routes.len()))
}

/// Benchmark 4: the plan pass of one node of a 5,000-node, 100,000-block cluster / the kernel
/// floor for the routes it plans.
pub fn run(opts: &Options, shared: &mut Shared) -> Result<Outcome> {
    let f = match &opts.child_exe {
        Some(exe) => compute_in_child(exe, opts.compute, opts.runs)?,
        None => compute_in_process(opts.compute, opts.runs)?,
    };
    let (floor, floor_routes) = kernel_floor(opts.compute, opts.runs)?;
    ensure!(floor_routes == f.routes, "the floor wrote {floor_routes} routes, the plan computed {}", f.routes);
    let rw = rw_program_median(opts, shared)?;
    let per_route = rw.as_secs_f64() / opts.routes as f64;
    let program = per_route * f.routes as f64;
    Ok(Outcome::Measured {
        name: BENCHMARK.name.into(),
        ratio: f.plan_median.as_secs_f64() / floor.as_secs_f64(),
        target: Target::AtMost(0.1),
        ok: true,
        details: vec![
            kv("nodes", opts.compute.nodes),
            kv("blocks", opts.compute.blocks),
            kv("borrowed", opts.compute.borrowed),
            kv("routes", f.routes),
            kv("plan_ms", ms(f.plan_median)),
            kv("kernel_floor_ms", ms(floor)),
            kv("compute_ms", ms(f.median)),
            kv("program_est_ms", format!("{:.1}", program * 1e3)),
            kv("program_us_per_route", format!("{:.2}", per_route * 1e6)),
            kv("peak_rss_mb", format!("{:.1}", f.peak_kib as f64 / 1024.0)),
            kv("model_rss_mb", format!("{:.1}", f.model_peak_kib as f64 / 1024.0)),
            kv("process", if opts.child_exe.is_some() { "compute-only-child" } else { "in-process" }),
            kv("runs", opts.runs),
        ],
    })
}
