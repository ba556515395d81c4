//! `kube-heartbeats` (issue 23): the Kubernetes datastore's CPU under 1,000 Node heartbeats a
//! second from a stand-in API server in the process, against 5 % of one core. Target: at most
//! 1, with no snapshot sent for a heartbeat.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};

use crate::procfs::cpu_ticks;
use crate::report::{kv, ms};
use crate::{Benchmark, Options, Outcome, Shared, Target};

/// This benchmark's registry entry: its name and [`run`].
pub const BENCHMARK: Benchmark = Benchmark { name: "kube-heartbeats", run };

/// Node status heartbeats per second in `kube-heartbeats` (5,000 nodes heartbeat about every
/// 5 s: ~1,000 updates/s on the Node watch).
const HEARTBEATS_PER_S: u64 = 1000;

/// Budget: the heartbeats may cost at most 5 % of one core.
const HEARTBEAT_CPU_BUDGET_PCT: f64 = 5.0;

/// The Kubernetes datastore under Node heartbeats, against a stand-in API server in this
/// process (tower-test's mock service: no network): `compute.nodes` Nodes, `compute.blocks`
/// IPAM blocks and as many affinities, one IP pool; once synced, the Node watch delivers
/// `HEARTBEATS_PER_S` heartbeats a second for the stream window (10 s; 1 s with `--tiny`), each
/// a Node whose status conditions and resourceVersion changed and nothing the model reads.
/// The events are encoded before the clock starts, so the CPU measured (utime + stime of this
/// process over the window) is the datastore's. ratio = CPU % of one core ÷ 5 %; side
/// condition: not one snapshot is sent for a heartbeat.
#[expect(clippy::too_many_lines, reason = "the stand-in API server, the stream and the report in one place")]
pub fn run(opts: &Options, _shared: &mut Shared) -> Result<Outcome> {
    use bytes::Bytes;
    use futures::StreamExt as _;
    use http_body_util::BodyExt;
    use routewarden::datastore::{ApiGroupChoice, DatastoreEvent, KubernetesDatastore};
    use serde_json::json;

    let name = BENCHMARK.name;
    let (nodes, blocks) = (opts.compute.nodes.max(2), opts.compute.blocks.max(1));
    let window = if blocks <= 1000 { Duration::from_secs(1) } else { Duration::from_secs(10) };
    let beats = HEARTBEATS_PER_S * window.as_secs();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async move {
        type RespBody = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;
        let node = |i: usize, rv: u64, beat: u64| {
            json!({"metadata": {"name": format!("node-{i:05}"), "resourceVersion": rv.to_string(),
                                "annotations": {"projectcalico.org/IPv4Address": format!("10.{}.{}.{}/16", 200 + i / 65536, (i / 256) % 256, i % 256)}},
                   "status": {"addresses": [{"type": "InternalIP", "address": format!("10.{}.{}.{}", 200 + i / 65536, (i / 256) % 256, i % 256)}],
                              "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": format!("2026-01-01T00:00:{:02}Z", beat % 60)}]}})
        };
        let list = |kind: &str, api_version: &str, items: Vec<serde_json::Value>| {
            Bytes::from(json!({"apiVersion": api_version, "kind": format!("{kind}List"), "metadata": {"resourceVersion": "10"}, "items": items}).to_string())
        };
        let crd = "crd.projectcalico.org/v1";
        let pools = list("IPPool", crd, vec![json!({"apiVersion": crd, "kind": "IPPool", "metadata": {"name": "p", "resourceVersion": "1"}, "spec": {"cidr": "10.0.0.0/8", "ipipMode": "Always", "vxlanMode": "Never", "blockSize": 26}})]);
        let block_items: Vec<serde_json::Value> = (0..blocks)
            .map(|b| {
                let cidr = format!("10.{}.{}.{}/26", b / 1024, (b / 4) % 256, (b % 4) * 64);
                json!({"apiVersion": crd, "kind": "IPAMBlock", "metadata": {"name": cidr.replace(['.', '/'], "-"), "resourceVersion": "2"},
                       "spec": {"cidr": cidr, "affinity": format!("host:node-{:05}", b % nodes), "allocations": [], "attributes": [], "deleted": false}})
            })
            .collect();
        let affinity_items: Vec<serde_json::Value> = block_items
            .iter()
            .map(|b| {
                let (cidr, host) = (b["spec"]["cidr"].as_str().unwrap_or_default(), b["spec"]["affinity"].as_str().unwrap_or_default().trim_start_matches("host:"));
                json!({"apiVersion": crd, "kind": "BlockAffinity", "metadata": {"name": format!("{host}-{}", cidr.replace(['.', '/'], "-")), "resourceVersion": "3"},
                       "spec": {"node": host, "cidr": cidr, "state": "confirmed", "deleted": "false"}})
            })
            .collect();
        let lists: BTreeMap<String, Bytes> = [
            (format!("/apis/{crd}/ippools"), pools),
            (format!("/apis/{crd}/ipamblocks"), list("IPAMBlock", crd, block_items)),
            (format!("/apis/{crd}/blockaffinities"), list("BlockAffinity", crd, affinity_items)),
            (format!("/apis/{crd}/felixconfigurations"), list("FelixConfiguration", crd, Vec::new())),
            (format!("/apis/{crd}/bgpconfigurations"), list("BGPConfiguration", crd, Vec::new())),
            (format!("/apis/{crd}/clusterinformations"), list("ClusterInformation", crd, Vec::new())),
            ("/api/v1/nodes".to_owned(), list("Node", "v1", (0..nodes).map(|i| node(i, 4, 0)).collect())),
            ("/apis/apps/v1/namespaces/kube-system/daemonsets".to_owned(), list("DaemonSet", "apps/v1", Vec::new())),
        ]
        .into_iter()
        .collect();
        // The heartbeats, encoded up front.
        let events: Vec<Bytes> = (0..beats)
            .map(|k| {
                let i = usize::try_from(k).unwrap_or(0) % nodes;
                Bytes::from(format!("{}\n", json!({"type": "MODIFIED", "object": node(i, 100 + k, k + 1)})))
            })
            .collect();
        let (beat_tx, beat_rx) = futures::channel::mpsc::unbounded::<Bytes>();
        let mut beat_rx = Some(beat_rx);
        let discovery = move |path: &str| -> Option<Bytes> {
            let resources = |group_version: &str, plurals: &[&str]| {
                let r: Vec<serde_json::Value> = plurals.iter().map(|p| json!({"name": p, "singularName": "", "namespaced": false, "kind": "X", "verbs": ["list", "watch"]})).collect();
                Bytes::from(json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": r}).to_string())
            };
            match path {
                "/apis" => Some(Bytes::from(
                    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [{"name": "crd.projectcalico.org", "versions": [{"groupVersion": crd, "version": "v1"}], "preferredVersion": {"groupVersion": crd, "version": "v1"}}]}).to_string(),
                )),
                p if p == format!("/apis/{crd}") => Some(resources(crd, &["ippools", "ipamblocks", "blockaffinities", "felixconfigurations", "bgpconfigurations", "clusterinformations"])),
                "/version" => Some(Bytes::from(json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0"}).to_string())),
                _ => None,
            }
        };
        let (service, mut handle) = tower_test::mock::pair::<http::Request<kube::client::Body>, http::Response<RespBody>>();
        tokio::spawn(async move {
            while let Some((req, send)) = handle.next_request().await {
                let path = req.uri().path().to_owned();
                let watch = req.uri().query().is_some_and(|q| q.split('&').any(|kv| kv == "watch=true"));
                let full = |b: Bytes| http_body_util::Full::new(b).map_err(|e| match e {}).boxed();
                if watch {
                    // The Node watch streams the heartbeats; every other watch stays idle.
                    let rx = if path == "/api/v1/nodes" { beat_rx.take() } else { None };
                    let body: RespBody = match rx {
                        Some(rx) => BodyExt::boxed(http_body_util::StreamBody::new(rx.map(|b| Ok::<_, std::io::Error>(http_body::Frame::data(b))))),
                        None => BodyExt::boxed(http_body_util::StreamBody::new(futures::stream::pending::<Result<http_body::Frame<Bytes>, std::io::Error>>())),
                    };
                    send.send_response(http::Response::builder().status(200).body(body).unwrap_or_default());
                } else if let Some(b) = lists.get(&path).cloned().or_else(|| discovery(&path)) {
                    send.send_response(http::Response::builder().status(200).body(full(b)).unwrap_or_default());
                } else {
                    let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "not found", "reason": "NotFound", "code": 404});
                    send.send_response(http::Response::builder().status(404).body(full(Bytes::from(status.to_string()))).unwrap_or_default());
                }
            }
        });
        let client = kube::Client::new(service, "default");
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
        let pid = std::process::id();
        let cpu0 = cpu_ticks(pid)?;
        let t0 = Instant::now();
        let per_tick = HEARTBEATS_PER_S / 10;
        let mut sent = 0;
        let mut snapshots = 0u64;
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        for chunk in events.chunks(usize::try_from(per_tick).unwrap_or(100)) {
            tick.tick().await;
            for e in chunk {
                beat_tx.unbounded_send(e.clone()).map_err(|_| anyhow!("the Node watch closed"))?;
                sent += 1;
            }
            while let Ok(ev) = rx.try_recv() {
                snapshots += u64::from(matches!(ev, DatastoreEvent::Snapshot(_)));
            }
        }
        // Give the last events time to be read and (not) turned into a snapshot.
        tokio::time::sleep(Duration::from_millis(500)).await;
        while let Ok(ev) = rx.try_recv() {
            snapshots += u64::from(matches!(ev, DatastoreEvent::Snapshot(_)));
        }
        let elapsed = t0.elapsed();
        let ticks = cpu_ticks(pid)? - cpu0;
        task.abort();
        let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)?.unwrap_or(100) as f64;
        let cpu_s = ticks as f64 / hz;
        let cpu_pct = cpu_s / elapsed.as_secs_f64() * 100.0;
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
            ],
        })
    })
}
