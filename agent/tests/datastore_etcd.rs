//! The etcd datastore against a real etcd (`/usr/bin/etcd`, Debian etcd-server) on a free
//! loopback port with its data in a temp dir: the bundled example cluster loaded in Calico's
//! etcdv3 layout reads as the file datastore reads it, block puts and deletes show within a
//! second, a dead etcd makes the datastore unsynced and a restarted one synced again, and a
//! compaction leaves a current watch running.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use etcd_client::{Client, CompactionOptions};
use routewarden::datastore::etcd::{block_key, etcd_entry};
use routewarden::datastore::{Datastore, DatastoreEvent, EtcdDatastore, EtcdOptions, FileDatastore, Snapshot};
use routewarden::explain::{explain_all_nodes, OutputFormat};
use routewarden::model::Affinity;
use routewarden::ownership::OwnershipConfig;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::timeout;

const ETCD: &str = "/usr/bin/etcd";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A single-member etcd; killed on drop.
struct Etcd {
    dir: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

impl Etcd {
    fn start() -> Etcd {
        let mut etcd = Etcd { dir: tempfile::tempdir().unwrap(), client_port: free_port(), peer_port: free_port(), child: None };
        etcd.spawn();
        etcd
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    fn spawn(&mut self) {
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.path().join("etcd.log")).unwrap();
        let child = Command::new(ETCD)
            .arg("--name=default")
            .arg(format!("--data-dir={}", self.dir.path().join("data").display()))
            .arg(format!("--listen-client-urls={}", self.url()))
            .arg(format!("--advertise-client-urls={}", self.url()))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=default={peer}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start /usr/bin/etcd (Debian etcd-server)");
        self.child = Some(child);
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// A client once etcd answers (up to 10 s).
    async fn client(&self) -> Client {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut c) = Client::connect([self.url()], None).await {
                if c.status().await.is_ok() {
                    return c;
                }
            }
            assert!(Instant::now() < deadline, "etcd did not come up: {}", std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}

fn examples() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/cluster"))
}

/// The example files with an etcd form: Calico's v3 objects and its IPAM (the core
/// Kubernetes Nodes of nodes.yaml do not live in Calico's etcd).
const ETCD_FILES: [&str; 2] = ["calico.yaml", "ipam.yaml"];

/// Every object of the example files, as JSON, `List`s unpacked.
fn example_objects() -> Vec<Value> {
    let mut out = Vec::new();
    for f in ETCD_FILES {
        let text = std::fs::read_to_string(examples().join(f)).unwrap();
        for doc in routewarden::model::parse_yaml_documents(&text).unwrap() {
            let doc: Value = serde_json::to_value(&doc).unwrap();
            match doc.get("items").and_then(Value::as_array) {
                Some(items) => out.extend(items.iter().cloned()),
                None => out.push(doc),
            }
        }
    }
    out
}

/// Put the example cluster into etcd in Calico's etcdv3 layout.
async fn load_example(client: &mut Client) -> usize {
    let mut n = 0;
    for object in example_objects() {
        let (key, value) = etcd_entry(&object).unwrap_or_else(|| panic!("no etcd form for {object}"));
        client.put(key, value.to_string(), None).await.unwrap();
        n += 1;
    }
    n
}

/// The file datastore over the same example files.
fn file_snapshot() -> Snapshot {
    let dir = tempfile::tempdir().unwrap();
    for f in ETCD_FILES {
        std::fs::copy(examples().join(f), dir.path().join(f)).unwrap();
    }
    FileDatastore::load(dir.path()).unwrap()
}

fn explain_text(s: &Snapshot) -> String {
    explain_all_nodes(&s.cluster, &s.object_errors, &OwnershipConfig::default(), OutputFormat::Table).unwrap().text
}

fn options(etcd: &Etcd) -> EtcdOptions {
    EtcdOptions { endpoints: vec![etcd.url()], ..EtcdOptions::default() }
}

async fn recv(rx: &mut mpsc::Receiver<DatastoreEvent>, within: Duration) -> DatastoreEvent {
    timeout(within, rx.recv()).await.expect("event in time").expect("datastore alive")
}

/// The next snapshot, skipping other events; fails after `within`.
async fn next_snapshot(rx: &mut mpsc::Receiver<DatastoreEvent>, within: Duration) -> Snapshot {
    let deadline = Instant::now() + within;
    loop {
        if let DatastoreEvent::Snapshot(s) = recv(rx, deadline.saturating_duration_since(Instant::now())).await {
            return s;
        }
    }
}

fn spawn(etcd: &Etcd) -> (mpsc::Receiver<DatastoreEvent>, tokio::task::JoinHandle<Result<(), routewarden::datastore::DatastoreError>>) {
    let (tx, rx) = mpsc::channel(16);
    let ds = EtcdDatastore::new(options(etcd));
    assert_eq!(ds.describe(), format!("etcd:{}", etcd.url()));
    (rx, ds.spawn(tx))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_cluster_reads_as_the_file_datastore_reads_it() {
    let etcd = Etcd::start();
    let mut client = etcd.client().await;
    assert_eq!(load_example(&mut client).await, 33);
    // Keys routewarden does not read are ignored.
    client.put("/calico/ipam/v2/handle/k8s-pod-network.x", "{}", None).await.unwrap();
    client.put("/calico/resources/v3/projectcalico.org/networkpolicies/default/p", "{}", None).await.unwrap();
    let file = file_snapshot();
    let from_etcd = EtcdDatastore::new(options(&etcd)).load().await.unwrap();
    assert_eq!(from_etcd.object_errors, vec![]);
    assert_eq!(from_etcd.load_errors, vec![]);
    assert_eq!(from_etcd.inputs, 33);
    assert_eq!(from_etcd.cluster, file.cluster);
    assert_eq!(explain_text(&from_etcd), explain_text(&file));
    // The running datastore: the same snapshot, then Synced.
    let (mut rx, _task) = spawn(&etcd);
    let s = next_snapshot(&mut rx, Duration::from_secs(10)).await;
    assert_eq!(s.cluster, file.cluster);
    assert!(s.settled);
    assert_eq!(recv(&mut rx, Duration::from_secs(5)).await, DatastoreEvent::Synced);
}

fn block(cidr: &str, node: &str) -> Value {
    json!({"cidr": cidr, "affinity": format!("host:{node}"), "strictAffinity": false, "allocations": [0, null, null, null],
        "unallocated": [1, 2, 3], "attributes": [{"handle_id": "ipip-tunnel-addr-node-a", "secondary": {"node": node, "type": "ipipTunnelAddress"}}],
        "deleted": false})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_put_and_delete_change_the_snapshot_within_a_second() {
    let etcd = Etcd::start();
    let mut client = etcd.client().await;
    load_example(&mut client).await;
    let (mut rx, _task) = spawn(&etcd);
    let first = next_snapshot(&mut rx, Duration::from_secs(10)).await;
    assert_eq!(recv(&mut rx, Duration::from_secs(5)).await, DatastoreEvent::Synced);
    let cidr = "10.244.99.0/30";
    client.put(block_key(cidr.parse().unwrap()), block(cidr, "node-a").to_string(), None).await.unwrap();
    let s = next_snapshot(&mut rx, Duration::from_secs(1)).await;
    assert_eq!(s.cluster.ipam_blocks.len(), first.cluster.ipam_blocks.len() + 1);
    let b = &s.cluster.ipam_blocks["10-244-99-0-30"];
    assert_eq!((b.cidr.to_string(), b.affinity.clone()), (cidr.to_owned(), Some(Affinity::Host("node-a".to_owned()))));
    // A broken value keeps the block and names the key.
    client.put(block_key(cidr.parse().unwrap()), "{\"cidr\": ", None).await.unwrap();
    let s = next_snapshot(&mut rx, Duration::from_secs(1)).await;
    assert!(s.cluster.ipam_blocks.contains_key("10-244-99-0-30"));
    assert_eq!(s.load_errors.iter().map(|e| e.file.clone()).collect::<Vec<_>>(), vec![PathBuf::from(block_key(cidr.parse().unwrap()))]);
    client.delete(block_key(cidr.parse().unwrap()), None).await.unwrap();
    let s = next_snapshot(&mut rx, Duration::from_secs(1)).await;
    assert_eq!(s.cluster, first.cluster);
    assert_eq!(s.load_errors, vec![]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_etcd_unsyncs_and_a_restarted_one_syncs_the_same_cluster() {
    let mut etcd = Etcd::start();
    let mut client = etcd.client().await;
    load_example(&mut client).await;
    drop(client);
    let (mut rx, _task) = spawn(&etcd);
    let first = next_snapshot(&mut rx, Duration::from_secs(10)).await;
    assert_eq!(recv(&mut rx, Duration::from_secs(5)).await, DatastoreEvent::Synced);
    etcd.kill();
    match recv(&mut rx, Duration::from_secs(15)).await {
        DatastoreEvent::Unsynced { reason } => assert!(reason.starts_with(&format!("etcd {}: ", etcd.url())), "{reason}"),
        other => panic!("expected Unsynced, got {other:?}"),
    }
    etcd.spawn();
    // Back within the backoff cap (10 s) plus etcd's start: Synced, and no snapshot in
    // between since nothing changed.
    let deadline = Instant::now() + Duration::from_secs(25);
    loop {
        match recv(&mut rx, deadline.saturating_duration_since(Instant::now())).await {
            DatastoreEvent::Synced => break,
            DatastoreEvent::Unsynced { .. } => {}
            other => panic!("expected Synced, got {other:?}"),
        }
    }
    // Still the same cluster: a new block shows on top of it.
    let mut client = etcd.client().await;
    let cidr = "10.244.98.0/30";
    client.put(block_key(cidr.parse().unwrap()), block(cidr, "node-b").to_string(), None).await.unwrap();
    let s = next_snapshot(&mut rx, Duration::from_secs(2)).await;
    let mut expected = first.cluster.ipam_blocks.keys().cloned().collect::<Vec<_>>();
    expected.push("10-244-98-0-30".into());
    expected.sort();
    assert_eq!(s.cluster.ipam_blocks.keys().cloned().collect::<Vec<_>>(), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_does_not_disturb_a_current_watch() {
    let etcd = Etcd::start();
    let mut client = etcd.client().await;
    load_example(&mut client).await;
    let (mut rx, _task) = spawn(&etcd);
    next_snapshot(&mut rx, Duration::from_secs(10)).await;
    assert_eq!(recv(&mut rx, Duration::from_secs(5)).await, DatastoreEvent::Synced);
    let cidr = "10.244.97.0/30";
    let put = client.put(block_key(cidr.parse().unwrap()), block(cidr, "node-c").to_string(), None).await.unwrap();
    let rev = put.header().unwrap().revision();
    let s = next_snapshot(&mut rx, Duration::from_secs(1)).await;
    assert!(s.cluster.ipam_blocks.contains_key("10-244-97-0-30"));
    client.compact(rev, Some(CompactionOptions::new().with_physical())).await.unwrap();
    // Compacting up to the current revision leaves a current watch running: the deletion
    // after it arrives as a watch event, with no Unsynced in between.
    client.delete(block_key(cidr.parse().unwrap()), None).await.unwrap();
    match recv(&mut rx, Duration::from_secs(1)).await {
        DatastoreEvent::Snapshot(s) => assert!(!s.cluster.ipam_blocks.contains_key("10-244-97-0-30")),
        other => panic!("expected the snapshot without the block, got {other:?}"),
    }
}
