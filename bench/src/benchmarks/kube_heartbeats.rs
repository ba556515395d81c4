//! `kube-heartbeats`: the Kubernetes datastore's CPU under 1,000 Node heartbeats a
//! second from a stand-in API server in the process, against 5 % of one core. Target: at most
//! 1, with no snapshot sent for a heartbeat.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use crate::procfs::cpu_ticks;
use crate::report::{kv, ms};
use crate::fixtures::kube::{calico, daemonsets, nodes as node_type, standin, wait_drained, CALICO};
use routewarden_lab::standin::{EventType, ListBody};
use crate::{Benchmark, Options, Outcome, Shared, Target};

/// This benchmark's registry entry: its name and [`run`].
pub const BENCHMARK: Benchmark = Benchmark { name: "kube-heartbeats", run };

/// Node status heartbeats per second in `kube-heartbeats` (5,000 nodes heartbeat about every
/// 5 s: ~1,000 updates/s on the Node watch).
const HEARTBEATS_PER_S: u64 = 1000;

/// Budget: the heartbeats may cost at most 5 % of one core.
const HEARTBEAT_CPU_BUDGET_PCT: f64 = 5.0;

/// After the last heartbeat is read, this process must be idle this long before the CPU
/// counter is read: three debounce windows (100 ms each), so the flush they end is counted.
const DRAIN_QUIET: Duration = Duration::from_millis(300);

/// How long the datastore may take to read the last heartbeats and go idle.
const DRAIN_LIMIT: Duration = Duration::from_mins(2);

/// The Kubernetes datastore under Node heartbeats, against the stand-in API server in this
/// process ([`routewarden_lab::standin::ApiServer`] as a tower service, no network): `compute.nodes` Nodes,
/// `compute.blocks` IPAM blocks and as many affinities, one IP pool; once synced, the Node
/// watch delivers `HEARTBEATS_PER_S` heartbeats a second for the stream window (10 s; 1 s with
/// `--tiny`), each a Node whose status conditions and resourceVersion changed and nothing the
/// model reads. The events are encoded before the clock starts, so the CPU measured (utime +
/// stime of this process from the first heartbeat until the datastore has read the last one
/// and this process has been idle for [`DRAIN_QUIET`], [`wait_drained`]) is the datastore's.
/// `cpu_pct` is that CPU per second of offered load (heartbeats ÷ rate); `drain_ms` is how
/// long after the last heartbeat was sent the datastore had read them all. ratio = CPU % of
/// one core ÷ 5 %; side condition: not one snapshot is sent for a heartbeat.
#[expect(clippy::too_many_lines, reason = "the stand-in API server, the stream and the report in one place")]
pub fn run(opts: &Options, _shared: &mut Shared) -> Result<Outcome> {
    use bytes::Bytes;
    use routewarden::datastore::{ApiGroupChoice, DatastoreEvent, KubernetesDatastore};
    use serde_json::json;

    let name = BENCHMARK.name;
    let (nodes, blocks) = (opts.compute.nodes.max(2), opts.compute.blocks.max(1));
    let window = if blocks <= 1000 { Duration::from_secs(1) } else { Duration::from_secs(10) };
    let beats = HEARTBEATS_PER_S * window.as_secs();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async move {
        let node = |i: usize, rv: u64, beat: u64| {
            json!({"metadata": {"name": format!("node-{i:05}"), "resourceVersion": rv.to_string(),
                                "annotations": {"projectcalico.org/IPv4Address": format!("10.{}.{}.{}/16", 200 + i / 65536, (i / 256) % 256, i % 256)}},
                   "status": {"addresses": [{"type": "InternalIP", "address": format!("10.{}.{}.{}", 200 + i / 65536, (i / 256) % 256, i % 256)}],
                              "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": format!("2026-01-01T00:00:{:02}Z", beat % 60)}]}})
        };
        let list = |kind: &str, api_version: &str, items: Vec<serde_json::Value>| ListBody::new(api_version, kind, "10", items.iter().map(serde_json::Value::to_string));
        let pools = list("IPPool", CALICO, vec![json!({"apiVersion": CALICO, "kind": "IPPool", "metadata": {"name": "p", "resourceVersion": "1"}, "spec": {"cidr": "10.0.0.0/8", "ipipMode": "Always", "vxlanMode": "Never", "blockSize": 26}})]);
        let block_items: Vec<serde_json::Value> = (0..blocks)
            .map(|b| {
                let cidr = format!("10.{}.{}.{}/26", b / 1024, (b / 4) % 256, (b % 4) * 64);
                json!({"apiVersion": CALICO, "kind": "IPAMBlock", "metadata": {"name": cidr.replace(['.', '/'], "-"), "resourceVersion": "2"},
                       "spec": {"cidr": cidr, "affinity": format!("host:node-{:05}", b % nodes), "allocations": [], "attributes": [], "deleted": false}})
            })
            .collect();
        let affinity_items: Vec<serde_json::Value> = block_items
            .iter()
            .map(|b| {
                let (cidr, host) = (b["spec"]["cidr"].as_str().unwrap_or_default(), b["spec"]["affinity"].as_str().unwrap_or_default().trim_start_matches("host:"));
                json!({"apiVersion": CALICO, "kind": "BlockAffinity", "metadata": {"name": format!("{host}-{}", cidr.replace(['.', '/'], "-")), "resourceVersion": "3"},
                       "spec": {"node": host, "cidr": cidr, "state": "confirmed", "deleted": "false"}})
            })
            .collect();
        let api = standin(vec![
            (calico("ippools"), pools),
            (calico("ipamblocks"), list("IPAMBlock", CALICO, block_items)),
            (calico("blockaffinities"), list("BlockAffinity", CALICO, affinity_items)),
            (calico("felixconfigurations"), list("FelixConfiguration", CALICO, Vec::new())),
            (calico("bgpconfigurations"), list("BGPConfiguration", CALICO, Vec::new())),
            (calico("clusterinformations"), list("ClusterInformation", CALICO, Vec::new())),
            (node_type(), list("Node", "v1", (0..nodes).map(|i| node(i, 4, 0)).collect())),
            (daemonsets(), list("DaemonSet", "apps/v1", Vec::new())),
        ])?;
        // The heartbeats, encoded up front (node name, version, object); the Node watch
        // streams them, every other watch stays idle.
        let events: Vec<(String, u64, Bytes)> = (0..beats)
            .map(|k| {
                let i = usize::try_from(k).unwrap_or(0) % nodes;
                (format!("node-{i:05}"), 100 + k, Bytes::from(node(i, 100 + k, k + 1).to_string()))
            })
            .collect();
        let client = api.client();
        let (tx, mut rx) = tokio::sync::mpsc::channel(64);
        let started = Instant::now();
        // No list settle: it only delays the first `settled` snapshot, and this measures the
        // watch path.
        let task = KubernetesDatastore::new(client, ApiGroupChoice::Auto).with_list_settle(Duration::ZERO).spawn(tx);
        let mut first = None;
        loop {
            match tokio::time::timeout(Duration::from_mins(5), rx.recv()).await {
                Ok(Some(DatastoreEvent::Synced)) => break,
                Ok(Some(DatastoreEvent::Snapshot(s))) => first = Some(s),
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => bail!("the datastore did not sync"),
            }
        }
        let synced_ms = ms(started.elapsed());
        let first = first.context("no snapshot before Synced")?;
        ensure!(first.cluster.ipam_blocks.len() == blocks && first.cluster.nodes.len() == nodes, "the cluster did not load whole");
        // Anything still in flight from the lists is not a heartbeat's.
        while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(500), rx.recv()).await {}
        // Snapshots are counted by a task of their own, so the datastore never waits on a
        // full channel while the harness sends or drains.
        let counter = tokio::spawn(async move {
            let mut snapshots = 0u64;
            while let Some(ev) = rx.recv().await {
                snapshots += u64::from(matches!(ev, DatastoreEvent::Snapshot(_)));
            }
            snapshots
        });
        let pid = std::process::id();
        let cpu0 = cpu_ticks(pid)?;
        let per_tick = HEARTBEATS_PER_S / 10;
        let mut sent = 0u64;
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        for chunk in events.chunks(usize::try_from(per_tick).unwrap_or(100)) {
            tick.tick().await;
            for (name, rv, object) in chunk {
                api.commit_encoded(&node_type(), EventType::Modified, None, name, *rv, object.clone()).context("the heartbeat")?;
                sent += 1;
            }
            // The API server's storage compacts its history; here after every tick.
            api.compact();
        }
        // The CPU counter is read once the datastore has read every heartbeat and gone idle
        // (the last debounce window flushed): on a loaded machine it falls behind the stream.
        let drained = wait_drained(&api, DRAIN_QUIET, DRAIN_LIMIT).await?;
        let ticks = cpu_ticks(pid)? - cpu0;
        task.abort();
        let snapshots = tokio::time::timeout(Duration::from_secs(10), counter).await.context("the datastore task did not end")??;
        let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)?.unwrap_or(100) as f64;
        let cpu_s = ticks as f64 / hz;
        // Per second of the offered load (heartbeats ÷ rate), not of the wall time including
        // the drain: a datastore that falls behind must not look cheaper for it.
        let cpu_pct = cpu_s / (sent as f64 / HEARTBEATS_PER_S as f64) * 100.0;
        Ok(Outcome::Measured {
            name: name.into(),
            ratio: cpu_pct / HEARTBEAT_CPU_BUDGET_PCT,
            target: Target::AtMost(1.0),
            ok: snapshots == 0,
            details: vec![
                kv("nodes", nodes),
                kv("blocks", blocks),
                kv("heartbeats", sent),
                kv("rate_per_s", HEARTBEATS_PER_S),
                kv("cpu_pct", format!("{cpu_pct:.2}")),
                kv("cpu_ms_per_1000", format!("{:.1}", cpu_s * 1_000_000.0 / f64::from(u32::try_from(sent).unwrap_or(u32::MAX)).max(1.0))),
                kv("snapshots", snapshots),
                kv("synced_ms", synced_ms),
                kv("cpu_ticks", ticks),
                kv("drain_ms", ms(drained.handed_out)),
            ],
        })
    })
}
