//! `etcd-100k`: the etcd datastore at fleet scale, against a real etcd (Debian etcd-server,
//! `/usr/bin/etcd`, on this machine's loopback, its data in a temporary directory) holding the
//! kube-100k cluster as Calico's etcdv3 datastore stores it
//! ([`crate::fixtures::kube::etcd_cluster`]: 5,000 Nodes, 100,000 IPAM blocks and their
//! affinities, two IP pools and the configuration; `--tiny`: 50 nodes, 1,000 blocks). The
//! datastore runs in this process, as the agent runs it (`EtcdDatastore`), and every snapshot is
//! planned for `node-00000` in Felix's role, as kube-100k does.
//!
//! Measured (targets in brackets, kube-100k's):
//!
//! - `first_plan_ms`: from starting the datastore to the first plan [≤ 5 s];
//! - `peak_rss_mb` / `steady_rss_mb`: `VmHWM` / `VmRSS` of this process after the changes,
//!   less the baseline measured before starting the datastore (with `VmHWM` reset there); the
//!   datastore still running and the free heap given back first, as the agent does [steady ≤
//!   150 MB];
//! - `change_p50_ms` / `change_p99_ms` / `change_max_ms`: [`CHANGES`] new IPAM blocks of other
//!   nodes, one at a time (affinity, then block, as Calico's IPAM claims one), each from the
//!   block's write to the plan that routes it [p99 ≤ 100 ms]; `snapshot_p50_ms`: from the
//!   write to the datastore's snapshot alone (etcd's watch, the view's put and its snapshot),
//!   and `plan_ms`: the median plan.
//!
//! Each of `--runs` runs (default 5) starts a fresh datastore and planner against the same
//! etcd and writes its own new blocks. ratio = the worst of the runs' median first plan ÷ 5 s,
//! median steady RSS ÷ 150 MB (`steady_rss_runs_mb` lists each run's) and the p99 of every
//! run's changes together ÷ 100 ms (`worst` names it). Skipped when etcd is not installed.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use etcd_client::{Client, Txn, TxnOp};
use routewarden::datastore::{DatastoreEvent, EtcdDatastore, EtcdOptions, Snapshot};
use routewarden::plan::{self, Plan};
use routewarden::vocabulary::PoolClass;
use tokio::sync::mpsc;

use crate::fixtures::felix_plan_config;
use crate::fixtures::kube::{etcd_cluster, etcd_new_block, first_sync, node_name};
use crate::procfs::{proc_mem_kib, reset_peak_rss};
use crate::report::{kv, mb, ms, quantile};
use crate::{median, Benchmark, Options, Outcome, Shared, Target};

/// This benchmark's registry entry: its name and [`run`].
pub const BENCHMARK: Benchmark = Benchmark { name: "etcd-100k", run };

/// etcd (Debian etcd-server).
pub const ETCD: &str = "/usr/bin/etcd";

/// New blocks written one after another.
pub const CHANGES: usize = 50;

/// Puts per etcd transaction while loading (etcd's default `--max-txn-ops` is 128).
const TXN_OPS: usize = 128;

/// Target: the first plan within 5 s of starting.
const FIRST_PLAN_TARGET: Duration = Duration::from_secs(5);
/// Target: steady RSS at most 150 MB.
const STEADY_RSS_TARGET_MB: f64 = 150.0;
/// Target: p99 write → plan at most 100 ms.
const P99_TARGET: Duration = Duration::from_millis(100);
/// How long the first sync and each change may take.
const LIMIT: Duration = Duration::from_mins(5);

/// etcd on two free loopback ports, its data in `dir`; killed on drop.
struct Etcd {
    child: Child,
    url: String,
}

impl Etcd {
    fn start(dir: &Path) -> Result<Etcd> {
        let port = || -> Result<u16> { Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port()) };
        let (client, peer) = (port()?, port()?);
        let url = format!("http://127.0.0.1:{client}");
        let peer = format!("http://127.0.0.1:{peer}");
        let log = std::fs::File::create(dir.join("etcd.log"))?;
        let child = Command::new(ETCD)
            .arg("--name=default")
            .arg(format!("--data-dir={}", dir.join("data").display()))
            .arg(format!("--listen-client-urls={url}"))
            .arg(format!("--advertise-client-urls={url}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=default={peer}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("start {ETCD}"))?;
        Ok(Etcd { child, url })
    }

    async fn client(&self, dir: &Path) -> Result<Client> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(mut c) = Client::connect([self.url.as_str()], None).await {
                if c.status().await.is_ok() {
                    return Ok(c);
                }
            }
            ensure!(Instant::now() < deadline, "etcd did not come up: {}", std::fs::read_to_string(dir.join("etcd.log")).unwrap_or_default());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Put `kvs` in transactions of [`TXN_OPS`].
async fn put_all(client: &mut Client, kvs: &[(String, String)]) -> Result<()> {
    for chunk in kvs.chunks(TXN_OPS) {
        let ops: Vec<TxnOp> = chunk.iter().map(|(k, v)| TxnOp::put(k.as_str(), v.as_str(), None)).collect();
        client.txn(Txn::new().and_then(ops)).await.context("etcd txn")?;
    }
    Ok(())
}

/// What the agent keeps between snapshots and the plan it runs on each (kube-100k's).
struct Planner {
    config: plan::PlanConfig,
    programmed: BTreeSet<PoolClass>,
    last: Option<Plan>,
    memo: plan::PlanMemo,
    times: Vec<Duration>,
}

impl Planner {
    fn plan(&mut self, snap: &Snapshot) {
        let t = Instant::now();
        let previous_owned = self.last.as_ref().map(|p| p.policy.owned.clone()).unwrap_or_default();
        if let Some(plan) = plan::plan_with(&mut self.memo, snap, &self.config, &self.programmed, &previous_owned) {
            self.programmed.clone_from(&plan.decision.programmed);
            self.last = Some(plan);
            self.times.push(t.elapsed());
        }
    }

    fn routes(&self, dst: ipnet::IpNet) -> bool {
        self.last.as_ref().is_some_and(|p| p.desired.contains_key(&dst))
    }
}

/// What one run (a fresh datastore and planner against the loaded etcd) measured.
struct RunFigures {
    first_plan: Duration,
    routes: usize,
    peak_kib: u64,
    steady_kib: u64,
    baseline_kib: u64,
    peak_reset: bool,
    to_plan: Vec<Duration>,
    to_snapshot: Vec<Duration>,
    plans: Vec<Duration>,
}

/// One run: start the datastore, plan its first snapshot, then write [`CHANGES`] new blocks
/// (numbered from `first_change`, so that no run writes another's) one at a time, each timed
/// to the plan that routes it; memory read with the datastore still running.
async fn one_run(etcd: &Etcd, client: &mut Client, size: crate::options::ComputeSize, first_change: usize) -> Result<RunFigures> {
    let mut planner =
        Planner { config: felix_plan_config(&node_name(0)), programmed: BTreeSet::new(), last: None, memo: plan::PlanMemo::default(), times: Vec::new() };
    routewarden::app::memory::release_free_heap();
    let peak_reset = reset_peak_rss().is_ok();
    let (_, baseline_kib) = proc_mem_kib("self")?;

    // The first sync and its plan.
    let started = Instant::now();
    let (tx, mut rx) = mpsc::channel(16);
    let task = EtcdDatastore::new(EtcdOptions { endpoints: vec![etcd.url.clone()], ..EtcdOptions::default() }).spawn(tx);
    // The cluster and the blocks earlier runs added.
    let first_plan = first_sync(&mut rx, started, (size.blocks + first_change, size.nodes), LIMIT, |s| {
        ensure!(s.object_errors.is_empty() && s.load_errors.is_empty(), "the cluster does not load cleanly: {:?}", s.object_errors.first());
        planner.plan(s);
        Ok(())
    })
    .await?;
    let routes = planner.last.as_ref().map_or(0, |p| p.desired.len());
    ensure!(routes > 0, "the first plan has no routes");

    // New blocks, one at a time: write → snapshot → the plan that routes it.
    let (mut to_snapshot, mut to_plan) = (Vec::new(), Vec::new());
    for k in first_change..first_change + CHANGES {
        let (kvs, cidr) = etcd_new_block(k, size);
        let dst = ipnet::IpNet::V4(cidr);
        put_all(client, &kvs[..1]).await?;
        let sent = Instant::now();
        put_all(client, &kvs[1..]).await?;
        let mut snapshot_at = None;
        while !planner.routes(dst) {
            match tokio::time::timeout(LIMIT, rx.recv()).await {
                Ok(Some(DatastoreEvent::Snapshot(s))) => {
                    if s.cluster.ipam_blocks.values().any(|b| b.cidr == dst) {
                        snapshot_at.get_or_insert(sent.elapsed());
                    }
                    planner.plan(&s);
                }
                Ok(Some(DatastoreEvent::Unsynced { reason })) => bail!("the datastore is not synced: {reason}"),
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => bail!("no plan routed the new block {dst}"),
            }
        }
        to_plan.push(sent.elapsed());
        to_snapshot.push(snapshot_at.unwrap_or_default());
    }
    // Steady memory with the datastore still running, as the agent keeps it: its view of
    // every key, the planner's memo and last plan.
    routewarden::app::memory::release_free_heap();
    let (hwm_kib, rss_kib) = proc_mem_kib("self")?;
    task.abort();
    let _ = task.await;
    drop((planner.last.take(), rx));
    let plans = std::mem::take(&mut planner.times);
    drop(planner);
    Ok(RunFigures {
        first_plan,
        routes,
        peak_kib: hwm_kib.saturating_sub(baseline_kib),
        steady_kib: rss_kib.saturating_sub(baseline_kib),
        baseline_kib,
        peak_reset,
        to_plan,
        to_snapshot,
        plans,
    })
}

/// The benchmark: see the module docs.
pub fn run(opts: &Options, _shared: &mut Shared) -> Result<Outcome> {
    if !Path::new(ETCD).exists() {
        return Ok(Outcome::Skipped { name: BENCHMARK.name.into(), reason: format!("{ETCD} not installed (Debian etcd-server; `cargo xtask test` installs it)") });
    }
    let size = opts.compute;
    ensure!(size.nodes > 1 && size.blocks > 0, "etcd-100k needs nodes and blocks");
    let dir = tempfile::tempdir()?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let runs = opts.runs.max(1);
    rt.block_on(async move {
        let etcd = Etcd::start(dir.path())?;
        let mut client = etcd.client(dir.path()).await?;
        let cluster = etcd_cluster(size);
        let keys = cluster.len();
        let load = Instant::now();
        put_all(&mut client, &cluster).await?;
        let load_s = load.elapsed().as_secs_f64();
        drop(cluster);

        let mut figures = Vec::with_capacity(runs);
        for r in 0..runs {
            figures.push(one_run(&etcd, &mut client, size, r * CHANGES).await?);
        }
        // Medians of the runs' first plans and memory; the latencies of every run's changes
        // pooled (runs × CHANGES samples for the p99).
        let median_kib = |f: fn(&RunFigures) -> u64| {
            let mut v: Vec<u64> = figures.iter().map(f).collect();
            v.sort_unstable();
            v[v.len() / 2]
        };
        let (peak_kib, steady_kib, baseline_kib) = (median_kib(|f| f.peak_kib), median_kib(|f| f.steady_kib), median_kib(|f| f.baseline_kib));
        let first_plan = median(figures.iter().map(|f| f.first_plan).collect());
        let mut to_plan: Vec<Duration> = figures.iter().flat_map(|f| f.to_plan.iter().copied()).collect();
        let mut to_snapshot: Vec<Duration> = figures.iter().flat_map(|f| f.to_snapshot.iter().copied()).collect();
        to_plan.sort();
        to_snapshot.sort();
        let p99 = quantile(&to_plan, 0.99);
        let parts = [
            ("first_plan", first_plan.as_secs_f64() / FIRST_PLAN_TARGET.as_secs_f64()),
            ("steady_rss", steady_kib as f64 / 1024.0 / STEADY_RSS_TARGET_MB),
            ("change_p99", p99.as_secs_f64() / P99_TARGET.as_secs_f64()),
        ];
        let (worst, ratio) = parts.iter().copied().fold(("none", 0.0), |w, p| if p.1 > w.1 { p } else { w });
        let steady_runs: Vec<String> = figures.iter().map(|f| mb(f.steady_kib)).collect();
        Ok(Outcome::Measured {
            name: BENCHMARK.name.into(),
            ratio,
            target: Target::AtMost(1.0),
            ok: true,
            details: vec![
                kv("nodes", size.nodes),
                kv("blocks", size.blocks),
                kv("keys", keys),
                kv("load_s", format!("{load_s:.1}")),
                kv("first_plan_ms", ms(first_plan)),
                kv("routes", figures.first().map_or(0, |f| f.routes)),
                kv("peak_rss_mb", mb(peak_kib)),
                kv("steady_rss_mb", mb(steady_kib)),
                kv("steady_rss_runs_mb", steady_runs.join("/")),
                kv("baseline_rss_mb", mb(baseline_kib)),
                kv("peak_reset", if figures.iter().all(|f| f.peak_reset) { "yes" } else { "no" }),
                kv("runs", runs),
                kv("changes", to_plan.len()),
                kv("change_p50_ms", ms(quantile(&to_plan, 0.5))),
                kv("change_p99_ms", ms(p99)),
                kv("change_max_ms", ms(to_plan.last().copied().unwrap_or_default())),
                kv("snapshot_p50_ms", ms(quantile(&to_snapshot, 0.5))),
                kv("plan_ms", ms(median(figures.iter().flat_map(|f| f.plans.iter().copied()).collect()))),
                kv("worst", worst),
            ],
        })
    })
}
