//! `route-change-100k`: what a change that changes a route costs past the datastore's debounce
//! window, at fleet scale, through the kernel. Node-00000 of compute-100k's cluster
//! ([`crate::fixtures::compute_cluster`]: 5,000 nodes, 100,000 blocks, 10,000 borrowed IPs;
//! 55,000 routes in Felix's role; `--tiny`: 50 nodes, 1,000 blocks) is planned and programmed
//! by the reconciler into a fresh node namespace (untimed). Then [`CHANGES`] IPAM block
//! changes follow one at a time, each an IP of a block of the IPIP pool (the class
//! routewarden programs in Felix's role here) borrowed by another node (a new /32 cluster
//! route), each timed from the snapshot handed over to the route in the
//! kernel through the steps the agent runs on a snapshot:
//!
//! - `plan_with` (the plan, patched where routes changed);
//! - the forwarding watch's entries (`EntriesMemo`: patched where routes changed);
//! - the dataplane hand-off: the plan's route map as `SetDesired` carries it, and
//!   `set_desired_routes`;
//! - one `apply`: the one route write, and the report over every desired route.
//!
//! Not timed: building the snapshot (the datastore's part: etcd-100k's `snapshot_p50_ms`,
//! kube-100k's event → plan), the datastore's debounce window and the dataplane's burst window
//! (50 ms from the first command): the issue's target is "within the debounce window plus
//! ≤ 10 ms at p99". ratio = p99 ÷ 10 ms; the reference is that absolute target, as kube-100k's.
//! Also reported: p50, max, and each step's p99. Side conditions (`met=no` whatever the ratio):
//! every change writes exactly one route, and afterwards the kernel holds exactly the planned
//! routes (every route of our protocol compared).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use routewarden::bpf::forward::EntriesMemo;
use routewarden::dataplane::{Reconciler, RtNetlink, SystemClock};
use routewarden::datastore::Snapshot;
use routewarden::model::{AllocationAttributes, Cluster};
use routewarden::plan::{plan_with, PlanMemo};
use routewarden::routes::ClusterRoute;

use crate::fixtures::{compute_cluster, felix_plan_config};
use crate::netns::{check_exact_routes, in_node_netns, ip};
use crate::report::{kv, ms, quantile};
use crate::runs::Mode;
use crate::{Benchmark, Options, Outcome, Shared, Target};

/// This benchmark's registry entry: its name and [`run`].
pub const BENCHMARK: Benchmark = Benchmark { name: "route-change-100k", run };

/// Routed changes timed (`--tiny`: a tenth).
const CHANGES: usize = 200;

/// The target past the debounce window, at p99.
const P99_TARGET: Duration = Duration::from_millis(10);

/// One change's step times: plan, entries, hand-off, apply.
type Steps = [Duration; 4];

/// A settled snapshot of `cluster`.
fn snapshot(cluster: &Cluster) -> Snapshot {
    Snapshot { cluster: Arc::new(cluster.clone()), object_errors: Vec::new(), load_errors: Vec::new(), inputs: 1, settled: true }
}

/// Change `k`: in block `k * 7919 mod names` of the IPIP pool's (each change another block), the IP at
/// ordinal 40 (the fixture allocates ordinal 5 at most) is allocated to a pod of node-00001,
/// or node-00002 when the block is node-00001's: a borrowed IP, so node-00000 gets a /32.
fn borrow(cluster: &mut Cluster, names: &[Arc<str>], k: usize) -> Result<()> {
    let name = &names[(k * 7919) % names.len()];
    let mut block = (**cluster.ipam_blocks.get(name).context("a block of the cluster")?).clone();
    let node = if block.host() == Some("node-00001") { "node-00002" } else { "node-00001" };
    block.attributes.push(AllocationAttributes { secondary: vec![("node".into(), node.into())] });
    let attribute = u32::try_from(block.attributes.len() - 1)?;
    block.allocations.push((40, attribute));
    cluster.ipam_blocks.insert(name.clone(), Arc::new(block));
    Ok(())
}

/// Benchmark: the p99 of a routed change from snapshot to kernel ÷ 10 ms.
pub fn run(opts: &Options, _shared: &mut Shared) -> Result<Outcome> {
    let size = opts.compute;
    let changes = if size.blocks < 100_000 { CHANGES / 10 } else { CHANGES };
    let mut cluster = compute_cluster(size);
    // The IPIP pool's blocks: the class routewarden programs in Felix's role here (the
    // no-encap pool's are BIRD's: a borrowed IP there changes expectations, not routes).
    let ipip: ipnet::IpNet = "10.0.0.0/9".parse()?;
    let names: Vec<Arc<str>> = cluster.ipam_blocks.iter().filter(|(_, b)| ipip.contains(&b.cidr)).map(|(n, _)| n.clone()).collect();
    let config = felix_plan_config("node-00000");
    let mut memo = PlanMemo::default();
    let first = plan_with(&mut memo, &snapshot(&cluster), &config, &BTreeSet::new(), &[]).context("the first plan")?;
    // The changes' snapshots, built before the clock starts (the datastore's part).
    let mut snapshots = Vec::with_capacity(changes);
    for k in 0..changes {
        borrow(&mut cluster, &names, k)?;
        snapshots.push(snapshot(&cluster));
    }
    drop(cluster);
    let (times, routes) = in_node_netns(move |rt| {
        // Node-00000's address, so that its host-NIC routes' next hops are on the link.
        ip("addr add 172.16.0.1/24 dev eth0")?;
        let (times, routes) = rt.block_on(rt.spawn(async move {
            let cfg = Mode::Classic.config();
            let mut r = Reconciler::new(cfg.clone(), cfg.policy_owning(&["10.0.0.0/8"]), RtNetlink::connect()?, SystemClock);
            r.set_datastore_synced(true);
            let (programmed, owned) = (first.programmed.clone(), first.policy.owned.clone());
            let mut entries = EntriesMemo::default();
            entries.entries(&first.desired, &first.expected, &first.programmed);
            r.set_desired_routes(&first.desired, &first.handovers);
            let cold = r.apply().await;
            ensure!(cold.writes == first.desired.len() as u64 && cold.error_count() == 0, "cold programming: {} of {} routes: {:?}", cold.writes, first.desired.len(), cold.error_messages);
            let mut last = first;
            let mut times: Vec<(Duration, Steps)> = Vec::with_capacity(snapshots.len());
            for (k, snap) in snapshots.iter().enumerate() {
                let t0 = Instant::now();
                let plan = plan_with(&mut memo, snap, &config, &programmed, &owned).with_context(|| format!("change {k} made no plan"))?;
                let t1 = Instant::now();
                let e = entries.entries(&plan.desired, &plan.expected, &plan.programmed);
                let t2 = Instant::now();
                r.set_desired_routes(&plan.desired, &plan.handovers);
                let t3 = Instant::now();
                let rep = r.apply().await;
                let t4 = Instant::now();
                ensure!(rep.writes == 1 && rep.error_count() == 0, "change {k}: {} writes, {:?}", rep.writes, rep.error_messages);
                drop(e);
                times.push((t4 - t0, [t1 - t0, t2 - t1, t3 - t2, t4 - t3]));
                last = plan;
            }
            let routes: Vec<ClusterRoute> = last.desired.values().map(|r| (**r).clone()).collect();
            Ok::<_, anyhow::Error>((times, routes))
        }))??;
        check_exact_routes(&routes)?;
        Ok((times, routes))
    })?;
    let mut total: Vec<Duration> = times.iter().map(|(t, _)| *t).collect();
    total.sort();
    let step = |i: usize| {
        let mut v: Vec<Duration> = times.iter().map(|(_, s)| s[i]).collect();
        v.sort();
        quantile(&v, 0.99)
    };
    let p99 = quantile(&total, 0.99);
    Ok(Outcome::Measured {
        name: BENCHMARK.name.into(),
        ratio: p99.as_secs_f64() / P99_TARGET.as_secs_f64(),
        target: Target::AtMost(1.0),
        ok: true,
        details: vec![
            kv("nodes", size.nodes),
            kv("blocks", size.blocks),
            kv("routes", routes.len()),
            kv("changes", total.len()),
            kv("p50_ms", ms(quantile(&total, 0.5))),
            kv("p99_ms", ms(p99)),
            kv("max_ms", ms(total.last().copied().unwrap_or_default())),
            kv("plan_p99_ms", ms(step(0))),
            kv("entries_p99_ms", ms(step(1))),
            kv("handoff_p99_ms", ms(step(2))),
            kv("apply_p99_ms", ms(step(3))),
            kv("target_p99_ms", P99_TARGET.as_millis()),
        ],
    })
}
