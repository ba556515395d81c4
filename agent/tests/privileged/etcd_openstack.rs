//! The agent with `--datastore etcd` in the network-namespace lab, on OpenStack's shape: IPAM
//! blocks affine to no node, so every workload IP is a /32 cluster route to the node that
//! holds it (Felix's `NonAffineAllocations`, `libcalico-go/lib/backend/model/block.go`). A real
//! etcd (Debian etcd-server) runs in node-a's namespace on its loopback, the agent beside it;
//! the routes are read back from that namespace's kernel. Nothing outside the lab's namespaces
//! is touched. The second test stops the agent (SIGSTOP) until etcd compacts past its watch.

mod lab_support;

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use etcd_client::Client;
use lab_support::{lab, routes, routes_stay, wait_for, wait_ready, Agent, PORT};
use routewarden::datastore::etcd::{block_key, etcd_entry};
use routewarden_lab::{skip_unless_root, Lab};
use serde_json::{json, Value};

const ETCD: &str = "/usr/bin/etcd";
/// etcd's client and peer ports on node-a's loopback (the namespace is the test's own).
const CLIENT_URL: &str = "http://127.0.0.1:23790";
const PEER_URL: &str = "http://127.0.0.1:23800";

/// etcd in `node`'s namespace, data in `dir`; killed on drop.
struct NodeEtcd(Child);

impl NodeEtcd {
    fn start(lab: &Lab, node: &str, dir: &Path) -> NodeEtcd {
        let log = std::fs::File::create(dir.join("etcd.log")).unwrap();
        let child = lab
            .command(node, ETCD)
            .arg("--name=default")
            .arg(format!("--data-dir={}", dir.join("data").display()))
            .arg(format!("--listen-client-urls={CLIENT_URL}"))
            .arg(format!("--advertise-client-urls={CLIENT_URL}"))
            .arg(format!("--listen-peer-urls={PEER_URL}"))
            .arg(format!("--initial-advertise-peer-urls={PEER_URL}"))
            .arg(format!("--initial-cluster=default={PEER_URL}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start /usr/bin/etcd (Debian etcd-server)");
        NodeEtcd(child)
    }
}

impl Drop for NodeEtcd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Put `kvs` into the etcd of `node`'s namespace (a client made inside it), waiting up to
/// 10 s for etcd to answer; `None` values are deletions.
fn put(lab: &Lab, node: &str, kvs: Vec<(String, Option<Value>)>) {
    lab.in_netns(node, move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            let mut client = loop {
                if let Ok(mut c) = Client::connect([CLIENT_URL], None).await {
                    if c.status().await.is_ok() {
                        break c;
                    }
                }
                assert!(std::time::Instant::now() < deadline, "etcd in the node namespace did not come up");
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            for (key, value) in kvs {
                match value {
                    Some(v) => drop(client.put(key, v.to_string(), None).await.unwrap()),
                    None => drop(client.delete(key, None).await.unwrap()),
                }
            }
        });
    })
    .unwrap();
}

fn node(name: &str, address: &str) -> Value {
    json!({"apiVersion": "projectcalico.org/v3", "kind": "Node", "metadata": {"name": name},
        "spec": {"bgp": {"ipv4Address": address}, "addresses": [{"address": address, "type": "CalicoNodeIP"}]}})
}

/// A non-affine block (`affinity` null, as networking-calico leaves it) whose allocation `i`
/// (ordinal i + 1) is used by `nodes[i]`.
fn open_block(cidr: &str, nodes: &[&str]) -> Value {
    let mut allocations = vec![Value::Null; 64];
    let mut attributes = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        allocations[i + 1] = json!(i);
        attributes.push(json!({"handle_id": format!("openstack-vm-{n}-{i}"), "secondary": {"node": n}}));
    }
    let unallocated: Vec<usize> = (0..64).filter(|o| *o == 0 || *o > nodes.len()).collect();
    json!({"cidr": cidr, "affinity": null, "strictAffinity": false, "allocations": allocations, "unallocated": unallocated,
        "attributes": attributes, "deleted": false})
}

/// The example's pools and configuration (its calico.yaml), its four nodes as Calico v3
/// Nodes, and two non-affine blocks: one in the IPIP CrossSubnet pool, one in IPIP Always.
fn openstack_cluster() -> Vec<(String, Option<Value>)> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster/calico.yaml")).unwrap();
    let mut kvs = Vec::new();
    for doc in routewarden::model::parse_yaml_documents(&text).unwrap() {
        let doc: Value = serde_json::to_value(&doc).unwrap();
        let objects = doc.get("items").and_then(Value::as_array).cloned().unwrap_or_else(|| vec![doc.clone()]);
        for o in objects.into_iter().filter(|o| o["kind"] != "Node") {
            let (k, v) = etcd_entry(&o).unwrap();
            kvs.push((k, Some(v)));
        }
    }
    for (name, address) in [("node-a", "10.0.0.11/24"), ("node-b", "10.0.0.12/24"), ("node-c", "10.0.0.13/24"), ("node-d", "10.0.1.14/24")] {
        let (k, v) = etcd_entry(&node(name, address)).unwrap();
        kvs.push((k, Some(v)));
    }
    kvs.push((block_key("10.244.200.0/26".parse().unwrap()), Some(open_block("10.244.200.0/26", &["node-b", "node-d", "node-a"]))));
    kvs.push((block_key("10.245.200.0/26".parse().unwrap()), Some(open_block("10.245.200.0/26", &["node-b", "node-c"]))));
    kvs
}

fn start_agent(lab: &Lab, node: &str) -> Agent {
    let child = lab
        .command(node, env!("CARGO_BIN_EXE_routewarden"))
        .args(["run", "--node", node, "--metrics-addr", &format!("127.0.0.1:{PORT}"), "--log-format", "text"])
        .args(["--datastore", "etcd", "--etcd-endpoints", CLIENT_URL])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    Agent::from_child(child)
}

#[test]
fn openstack_shape_non_affine_blocks_give_a_32_per_workload() {
    if skip_unless_root("openstack_shape_non_affine_blocks_give_a_32_per_workload") {
        return;
    }
    if !Path::new(ETCD).exists() {
        routewarden_lab::skip("openstack_shape_non_affine_blocks_give_a_32_per_workload", format_args!("{ETCD} missing (Debian etcd-server)"));
        return;
    }
    let lab = lab();
    let dir = tempfile::tempdir().unwrap();
    let etcd = NodeEtcd::start(&lab, "node-a", dir.path());
    put(&lab, "node-a", openstack_cluster());
    let _agent = start_agent(&lab, "node-a");
    let ready = wait_ready(&lab, "node-a");
    assert!(ready.starts_with("datastore: synced\n"), "{ready}");
    // One /32 per remote workload, by the pool's IPIP mode and the node's subnet; node-a's own
    // workload (10.244.200.3) is local, so no cluster route; no block is node-a's, so no
    // blackhole.
    let want = [
        "10.244.200.1 via 10.0.0.12 dev eth0 metric 1024 onlink",
        "10.244.200.2 via 10.0.1.14 dev tunl0 metric 1024 onlink",
        "10.245.200.1 via 10.0.0.12 dev tunl0 metric 1024 onlink",
        "10.245.200.2 via 10.0.0.13 dev tunl0 metric 1024 onlink",
    ];
    wait_for("node-a's OpenStack /32s", Duration::from_secs(10), || (routes(&lab, "node-a", "80") == want).then_some(()));
    // A VM on node-c goes away (its IP released in the block): its /32 goes, the rest stay,
    // in the kernel within 1 s of etcd acknowledging the put.
    put(&lab, "node-a", vec![(block_key("10.245.200.0/26".parse().unwrap()), Some(open_block("10.245.200.0/26", &["node-b"])))]);
    wait_for("node-c's /32 removed", Duration::from_secs(1), || (routes(&lab, "node-a", "80") == want[..3]).then_some(()));
    // The block deleted: its last /32 goes too, within 1 s as well.
    put(&lab, "node-a", vec![(block_key("10.245.200.0/26".parse().unwrap()), None)]);
    wait_for("the deleted block's /32 removed", Duration::from_secs(1), || (routes(&lab, "node-a", "80") == want[..2]).then_some(()));
    // etcd gone: unsynced, /readyz names the endpoint, and every route stays.
    drop(etcd);
    let body = wait_for("/readyz 503", Duration::from_secs(20), || match lab.http_get("node-a", PORT, "/readyz") {
        Ok((503, body)) => Some(body),
        _ => None,
    });
    assert!(body.contains(&format!("not synced: etcd {CLIENT_URL}: ")), "{body}");
    routes_stay(&lab, "node-a", "80", &want[..2], Duration::from_secs(3));
    // Back (same data dir): synced again, with the same routes.
    let _etcd = NodeEtcd::start(&lab, "node-a", dir.path());
    wait_ready(&lab, "node-a");
    assert_eq!(routes(&lab, "node-a", "80"), want[..2]);
}

/// etcd's `etcd_debugging_mvcc_slow_watcher_total` (its `/metrics`, on the client URL), read
/// from inside the namespace the caller runs in.
fn slow_watchers() -> u64 {
    use std::io::{Read as _, Write as _};
    let mut conn = std::net::TcpStream::connect("127.0.0.1:23790").unwrap();
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut body = String::new();
    conn.read_to_string(&mut body).unwrap();
    let line = body.lines().find(|l| l.starts_with("etcd_debugging_mvcc_slow_watcher_total ")).expect("slow watcher gauge");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// In `node`'s etcd: status writes routewarden does not read until etcd holds a slow watcher
/// (the stopped agent's), then `kvs`, then a compaction up to the newest revision.
fn flood_change_and_compact(lab: &Lab, node: &str, kvs: Vec<(String, Option<Value>)>) -> usize {
    lab.in_netns(node, move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let mut client = Client::connect([CLIENT_URL], None).await.unwrap();
            let status = "x".repeat(10_000);
            let mut writes = 0;
            while slow_watchers() < 1 {
                for _ in 0..100 {
                    client.put("/calico/felix/v2/default/host/node-a/status", status.as_str(), None).await.unwrap();
                }
                writes += 100;
                assert!(writes < 6_000, "the stopped agent's watch never became a slow watcher");
            }
            let mut revision = 0;
            for (key, value) in kvs {
                revision = match value {
                    Some(v) => client.put(key, v.to_string(), None).await.unwrap().header().unwrap().revision(),
                    None => client.delete(key, None).await.unwrap().header().unwrap().revision(),
                };
            }
            client.compact(revision, Some(etcd_client::CompactionOptions::new().with_physical())).await.unwrap();
            writes
        })
    })
    .unwrap()
}

/// The agent stopped (SIGSTOP: a hung or starved agent) while etcd's status writes pile up
/// behind its watch, a workload VM moves away and etcd compacts past the watch: once resumed,
/// the agent's watch reports the compaction, it re-lists and programs the change; at every
/// poll on the way the kernel held either the old routes or the new ones, never fewer.
#[test]
fn a_stopped_agent_past_a_compaction_relists_and_keeps_every_route_until_then() {
    if skip_unless_root("a_stopped_agent_past_a_compaction_relists_and_keeps_every_route_until_then") {
        return;
    }
    if !Path::new(ETCD).exists() {
        routewarden_lab::skip(
            "a_stopped_agent_past_a_compaction_relists_and_keeps_every_route_until_then",
            format_args!("{ETCD} missing (Debian etcd-server)"),
        );
        return;
    }
    let lab = lab();
    let dir = tempfile::tempdir().unwrap();
    let _etcd = NodeEtcd::start(&lab, "node-a", dir.path());
    put(&lab, "node-a", openstack_cluster());
    let agent = start_agent(&lab, "node-a");
    wait_ready(&lab, "node-a");
    let before = [
        "10.244.200.1 via 10.0.0.12 dev eth0 metric 1024 onlink",
        "10.244.200.2 via 10.0.1.14 dev tunl0 metric 1024 onlink",
        "10.245.200.1 via 10.0.0.12 dev tunl0 metric 1024 onlink",
        "10.245.200.2 via 10.0.0.13 dev tunl0 metric 1024 onlink",
    ];
    wait_for("node-a's OpenStack /32s", Duration::from_secs(10), || (routes(&lab, "node-a", "80") == before).then_some(()));
    let pid = nix::unistd::Pid::from_raw(i32::try_from(agent.pid()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    // node-c's VM moves to node-d: same IP, another node.
    let moved = open_block("10.245.200.0/26", &["node-b", "node-d"]);
    let writes = flood_change_and_compact(&lab, "node-a", vec![(block_key("10.245.200.0/26".parse().unwrap()), Some(moved))]);
    eprintln!("slow watcher after {writes} status writes of 10 kB");
    assert_eq!(routes(&lab, "node-a", "80"), before, "a stopped agent changed routes");
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let after = [before[0], before[1], before[2], "10.245.200.2 via 10.0.1.14 dev tunl0 metric 1024 onlink"];
    wait_for("the moved VM's /32 via node-d", Duration::from_secs(20), || {
        let now = routes(&lab, "node-a", "80");
        assert!(now == before || now == after, "routes between the old and the new set: {now:?}");
        (now == after).then_some(())
    });
    let ready = wait_ready(&lab, "node-a");
    assert!(ready.starts_with("datastore: synced\n"), "{ready}");
}
