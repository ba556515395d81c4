//! The etcd datastore against a real etcd (`/usr/bin/etcd`, Debian etcd-server) on a free
//! loopback port with its data in a temp dir: the bundled example cluster loaded in Calico's
//! etcdv3 layout reads as the file datastore reads it, block puts and deletes show within a
//! second, a dead etcd makes the datastore unsynced and a restarted one synced again, a
//! compaction leaves a current watch running and one past a watch held behind re-lists, and
//! mTLS (an etcd with `--client-cert-auth`, certificates made by rcgen) syncs with the right
//! CA and stays unsynced, naming the endpoint and the files, with a wrong one.
//!
//! The layout itself is proven against keys and bodies written as libcalico-go writes them
//! (`tests/fixtures/calico-etcdv3.kv`, hand-written with its sources cited, loaded with
//! `etcdctl put`); the other tests write with routewarden's own encoder (`etcd_entry`), which
//! only shows that reading undoes writing.

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
    /// With TLS: the certificates it serves and requires ([`Pki`]).
    tls: Option<Pki>,
}

impl Etcd {
    fn start() -> Etcd {
        Self::start_with(None)
    }

    /// An etcd serving https with `pki`'s server certificate and requiring a client
    /// certificate signed by its CA (`--client-cert-auth`).
    fn start_tls(pki: Pki) -> Etcd {
        Self::start_with(Some(pki))
    }

    fn start_with(tls: Option<Pki>) -> Etcd {
        let mut etcd = Etcd { dir: tempfile::tempdir().unwrap(), client_port: free_port(), peer_port: free_port(), child: None, tls };
        etcd.spawn();
        etcd
    }

    fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// The test's own client options: with TLS, the right CA and the client certificate.
    fn client_options(&self) -> Option<etcd_client::ConnectOptions> {
        let pki = self.tls.as_ref()?;
        let read = |f: &str| std::fs::read(pki.file(f)).unwrap();
        let tls = etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(read("ca.pem")))
            .identity(etcd_client::Identity::from_pem(read("client.pem"), read("client-key.pem")));
        Some(etcd_client::ConnectOptions::new().with_tls(tls))
    }

    fn spawn(&mut self) {
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.path().join("etcd.log")).unwrap();
        let mut cmd = Command::new(ETCD);
        if let Some(pki) = &self.tls {
            cmd.arg(format!("--cert-file={}", pki.file("server.pem").display()))
                .arg(format!("--key-file={}", pki.file("server-key.pem").display()))
                .arg(format!("--trusted-ca-file={}", pki.file("ca.pem").display()))
                .arg("--client-cert-auth");
        }
        let child = cmd
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
            if let Ok(mut c) = Client::connect([self.url()], self.client_options()).await {
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

type Task = tokio::task::JoinHandle<Result<(), routewarden::datastore::DatastoreError>>;

fn spawn(etcd: &Etcd) -> (mpsc::Receiver<DatastoreEvent>, Task) {
    spawn_with(options(etcd), 16)
}

/// The running datastore with `options`, its events in a channel of `capacity`.
fn spawn_with(options: EtcdOptions, capacity: usize) -> (mpsc::Receiver<DatastoreEvent>, Task) {
    let (tx, rx) = mpsc::channel(capacity);
    let described = format!("etcd:{}", options.endpoints.join(","));
    let ds = EtcdDatastore::new(options);
    assert_eq!(ds.describe(), described);
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
    let cidr = "10.244.99.0/26";
    client.put(block_key(cidr.parse().unwrap()), block(cidr, "node-a").to_string(), None).await.unwrap();
    let s = next_snapshot(&mut rx, Duration::from_secs(1)).await;
    assert_eq!(s.cluster.ipam_blocks.len(), first.cluster.ipam_blocks.len() + 1);
    let b = &s.cluster.ipam_blocks["10-244-99-0-26"];
    assert_eq!((b.cidr.to_string(), b.affinity.clone()), (cidr.to_owned(), Some(Affinity::Host("node-a".to_owned()))));
    // A broken value keeps the block and names the key.
    client.put(block_key(cidr.parse().unwrap()), "{\"cidr\": ", None).await.unwrap();
    let s = next_snapshot(&mut rx, Duration::from_secs(1)).await;
    assert!(s.cluster.ipam_blocks.contains_key("10-244-99-0-26"));
    assert_eq!(s.load_errors.iter().map(|e| e.file.clone()).collect::<Vec<_>>(), vec![PathBuf::from(block_key(cidr.parse().unwrap()))]);
    client.delete(block_key(cidr.parse().unwrap()), None).await.unwrap();
    let s = next_snapshot(&mut rx, Duration::from_secs(1)).await;
    assert_eq!(s.cluster, first.cluster);
    assert_eq!(s.load_errors, vec![]);
}

/// More keys than one page of the range read (1,000) and more bytes than gRPC's default
/// response limit (4 MiB), as a large cluster has (100,000 blocks are 110 MB): every key is
/// read, at one revision, and the watch goes on from there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_larger_than_one_response_is_read_whole_in_pages() {
    const BLOCKS: u32 = 2_500;
    let etcd = Etcd::start();
    let mut client = etcd.client().await;
    load_example(&mut client).await;
    let first = EtcdDatastore::new(options(&etcd)).load().await.unwrap();
    // Full blocks, as a node with 64 pods has them: ~2.5 KB each, 6 MB in all.
    let full = |cidr: &str| {
        let mut b = block(cidr, "node-b");
        b["attributes"] = (0..24)
            .map(|i| json!({"handle_id": format!("k8s-pod-network.{i:064x}"), "secondary": {"namespace": "default", "node": "node-b", "pod": format!("pod-{i:040}")}}))
            .collect();
        b.to_string()
    };
    // In the example's pools 10.245/16, 10.246/16 and 10.247/16 (1,024 /26 blocks each).
    let cidrs: Vec<String> = (0..BLOCKS).map(|i| format!("10.{}.{}.{}/26", 245 + i / 1024, (i % 1024) / 4, (i % 4) * 64)).collect();
    let mut bytes = 0;
    for chunk in cidrs.chunks(100) {
        let ops: Vec<etcd_client::TxnOp> = chunk
            .iter()
            .map(|c| {
                let value = full(c);
                bytes += value.len();
                etcd_client::TxnOp::put(block_key(c.parse().unwrap()), value, None)
            })
            .collect();
        client.txn(etcd_client::Txn::new().and_then(ops)).await.unwrap();
    }
    assert!(bytes > 4 << 20, "{bytes} bytes of blocks");
    let (mut rx, _task) = spawn(&etcd);
    let s = next_snapshot(&mut rx, Duration::from_secs(20)).await;
    assert_eq!((s.object_errors.len(), s.load_errors.len()), (0, 0), "{:?} {:?}", s.object_errors.first(), s.load_errors.first());
    // Every block: the example's (five of which these replace) and these.
    let mut want: std::collections::BTreeSet<String> = first.cluster.ipam_blocks.keys().map(ToString::to_string).collect();
    want.extend(cidrs.iter().map(|c| c.replace(['.', '/'], "-")));
    let names: std::collections::BTreeSet<String> = s.cluster.ipam_blocks.keys().map(ToString::to_string).collect();
    assert_eq!(names, want);
    assert!(names.len() > 2_500, "{}", names.len());
    assert_eq!(s.cluster.ipam_blocks["10-246-0-0-26"].affinity, Some(Affinity::Host("node-b".to_owned())), "the values of the later pages");
    assert_eq!(recv(&mut rx, Duration::from_secs(5)).await, DatastoreEvent::Synced);
    // The watch from the read's revision: one more block arrives.
    client.put(block_key("10.244.99.0/26".parse().unwrap()), block("10.244.99.0/26", "node-a").to_string(), None).await.unwrap();
    let s = next_snapshot(&mut rx, Duration::from_secs(2)).await;
    assert_eq!(s.cluster.ipam_blocks.len(), want.len() + 1);
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
    let cidr = "10.244.98.0/26";
    client.put(block_key(cidr.parse().unwrap()), block(cidr, "node-b").to_string(), None).await.unwrap();
    let s = next_snapshot(&mut rx, Duration::from_secs(2)).await;
    let mut expected = first.cluster.ipam_blocks.keys().cloned().collect::<Vec<_>>();
    expected.push("10-244-98-0-26".into());
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
    let cidr = "10.244.97.0/26";
    let put = client.put(block_key(cidr.parse().unwrap()), block(cidr, "node-c").to_string(), None).await.unwrap();
    let rev = put.header().unwrap().revision();
    let s = next_snapshot(&mut rx, Duration::from_secs(1)).await;
    assert!(s.cluster.ipam_blocks.contains_key("10-244-97-0-26"));
    client.compact(rev, Some(CompactionOptions::new().with_physical())).await.unwrap();
    // Compacting up to the current revision leaves a current watch running: the deletion
    // after it arrives as a watch event, with no Unsynced in between.
    client.delete(block_key(cidr.parse().unwrap()), None).await.unwrap();
    match recv(&mut rx, Duration::from_secs(1)).await {
        DatastoreEvent::Snapshot(s) => assert!(!s.cluster.ipam_blocks.contains_key("10-244-97-0-26")),
        other => panic!("expected the snapshot without the block, got {other:?}"),
    }
}

/// The value of an etcd gauge of whole numbers from its `/metrics` (served on the client URL).
fn etcd_gauge(etcd: &Etcd, name: &str) -> u64 {
    use std::io::{Read as _, Write as _};
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", etcd.client_port)).unwrap();
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut body = String::new();
    conn.read_to_string(&mut body).unwrap();
    let line = body.lines().find(|l| l.split_whitespace().next() == Some(name)).unwrap_or_else(|| panic!("etcd /metrics has no {name}"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A watch held behind until etcd compacts past it: the agent stops reading (its event
/// channel full, as behind a slow plan), etcd turns its watcher into a slow one (its buffers
/// full, `etcd_debugging_mvcc_slow_watcher_total`), a block is deleted and another added while
/// the watch cannot deliver them, and etcd compacts past the watcher's revision. Once read
/// again the watch reports the compaction: `Unsynced` naming it, one complete re-list at a new
/// revision (the deletion learnt from the key's absence, the addition from its presence), then
/// `Synced`; nothing in between, so nothing is deleted on what the agent had not seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_held_behind_a_compaction_relists_at_a_new_revision() {
    let etcd = Etcd::start();
    let mut client = etcd.client().await;
    load_example(&mut client).await;
    let (held, fresh) = ("10.244.96.0/26", "10.244.95.0/26");
    client.put(block_key(held.parse().unwrap()), block(held, "node-c").to_string(), None).await.unwrap();
    // One event of room: after the first snapshot, `Synced` fills the channel and the next
    // snapshot blocks the datastore, so it stops reading its watch.
    let (mut rx, _task) = spawn_with(options(&etcd), 1);
    let first = next_snapshot(&mut rx, Duration::from_secs(10)).await;
    assert!(first.cluster.ipam_blocks.contains_key("10-244-96-0-26"));
    let extra = "10.244.94.0/26";
    client.put(block_key(extra.parse().unwrap()), block(extra, "node-b").to_string(), None).await.unwrap();
    // Felix-like status writes routewarden does not read, until etcd's buffers for the held
    // watch are full and it becomes a slow watcher (bounded: 60 MB).
    assert_eq!(etcd_gauge(&etcd, "etcd_debugging_mvcc_slow_watcher_total"), 0);
    let status = "x".repeat(10_000);
    let mut writes = 0;
    while etcd_gauge(&etcd, "etcd_debugging_mvcc_slow_watcher_total") < 1 {
        for _ in 0..100 {
            client.put("/calico/felix/v2/default/host/node-a/status", status.as_str(), None).await.unwrap();
        }
        writes += 100;
        assert!(writes < 6_000, "the held watch never became a slow watcher");
    }
    // Changes the held watch cannot deliver, then a compaction past its revision.
    client.delete(block_key(held.parse().unwrap()), None).await.unwrap();
    client.put(block_key(fresh.parse().unwrap()), block(fresh, "node-b").to_string(), None).await.unwrap();
    let put = client.put("/calico/felix/v2/default/host/node-a/status", "up", None).await.unwrap();
    let compacted = put.header().unwrap().revision();
    client.compact(compacted, Some(CompactionOptions::new().with_physical())).await.unwrap();
    // Read again: what was queued, then the compaction and the re-list.
    assert_eq!(recv(&mut rx, Duration::from_secs(5)).await, DatastoreEvent::Synced);
    let s = next_snapshot(&mut rx, Duration::from_secs(5)).await;
    let mut blocks: Vec<String> = first.cluster.ipam_blocks.keys().map(ToString::to_string).collect();
    blocks.push("10-244-94-0-26".into());
    blocks.sort();
    assert_eq!(s.cluster.ipam_blocks.keys().map(ToString::to_string).collect::<Vec<_>>(), blocks);
    match recv(&mut rx, Duration::from_secs(20)).await {
        DatastoreEvent::Unsynced { reason } => {
            assert_eq!(reason, format!("etcd {}: watch revision compacted (oldest kept {compacted}); re-listing /calico/", etcd.url()));
        }
        other => panic!("expected Unsynced for the compaction, got {other:?}"),
    }
    let relisted = match recv(&mut rx, Duration::from_secs(5)).await {
        DatastoreEvent::Snapshot(s) => s,
        other => panic!("expected the re-listed snapshot, got {other:?}"),
    };
    assert_eq!(recv(&mut rx, Duration::from_secs(5)).await, DatastoreEvent::Synced);
    blocks.retain(|b| b != "10-244-96-0-26");
    blocks.push("10-244-95-0-26".into());
    blocks.sort();
    assert_eq!(relisted.cluster.ipam_blocks.keys().map(ToString::to_string).collect::<Vec<_>>(), blocks);
    // The re-list is the cluster as a fresh read sees it, and explains as that read does.
    let fresh_read = EtcdDatastore::new(options(&etcd)).load().await.unwrap();
    assert_eq!(relisted.cluster, fresh_read.cluster);
    assert_eq!(explain_text(&relisted), explain_text(&fresh_read));
    assert_eq!((relisted.object_errors.len(), relisted.load_errors.len()), (0, 0));
    // And the new watch runs from the re-list's revision: a deletion shows within a second.
    client.delete(block_key(fresh.parse().unwrap()), None).await.unwrap();
    let s = next_snapshot(&mut rx, Duration::from_secs(1)).await;
    blocks.retain(|b| b != "10-244-95-0-26");
    assert_eq!(s.cluster.ipam_blocks.keys().map(ToString::to_string).collect::<Vec<_>>(), blocks);
    eprintln!("a_watch_held_behind_a_compaction_relists_at_a_new_revision: slow watcher after {writes} status writes of 10 kB");
}

/// A self-signed CA with a server certificate for 127.0.0.1 and a client certificate it
/// signed, and a second CA that signed neither: PEM files in a temp dir (`ca.pem`,
/// `server.pem`, `server-key.pem`, `client.pem`, `client-key.pem`, `wrong-ca.pem`).
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose};
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, pem: String| std::fs::write(dir.path().join(name), pem).unwrap();
        let ca = |cn: &str| {
            let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.distinguished_name.push(DnType::CommonName, cn);
            params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
            let key = KeyPair::generate().unwrap();
            let cert = params.self_signed(&key).unwrap();
            (cert.pem(), Issuer::new(params, key))
        };
        let (ca_pem, issuer) = ca("routewarden test CA");
        write("ca.pem", ca_pem);
        write("wrong-ca.pem", ca("some other CA").0);
        // etcd's own gateway dials itself with the server certificate: it is a client too.
        for (name, sans, usages) in [
            ("server", vec!["127.0.0.1".to_owned(), "localhost".to_owned()], vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth]),
            ("client", Vec::new(), vec![ExtendedKeyUsagePurpose::ClientAuth]),
        ] {
            let mut params = CertificateParams::new(sans).unwrap();
            params.distinguished_name.push(DnType::CommonName, format!("routewarden test {name}"));
            params.extended_key_usages = usages;
            let key = KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, &issuer).unwrap();
            write(&format!("{name}.pem"), cert.pem());
            write(&format!("{name}-key.pem"), key.serialize_pem());
        }
        Pki { dir }
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The agent's options for `etcd` with CA file `ca` and, with `client_cert`, the client
    /// certificate and key.
    fn options(&self, etcd: &Etcd, ca: &str, client_cert: bool) -> EtcdOptions {
        EtcdOptions {
            endpoints: vec![etcd.url()],
            ca_file: Some(self.file(ca)),
            cert_file: client_cert.then(|| self.file("client.pem")),
            key_file: client_cert.then(|| self.file("client-key.pem")),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_with_the_right_ca_and_client_certificate_syncs_the_cluster() {
    let etcd = Etcd::start_tls(Pki::new());
    let mut client = etcd.client().await;
    assert_eq!(load_example(&mut client).await, 33);
    let pki = etcd.tls.as_ref().unwrap();
    let file = file_snapshot();
    let loaded = EtcdDatastore::new(pki.options(&etcd, "ca.pem", true)).load().await.unwrap();
    assert_eq!(loaded.cluster, file.cluster);
    let (mut rx, _task) = spawn_with(pki.options(&etcd, "ca.pem", true), 16);
    let s = next_snapshot(&mut rx, Duration::from_secs(10)).await;
    assert_eq!(s.cluster, file.cluster);
    assert_eq!(recv(&mut rx, Duration::from_secs(5)).await, DatastoreEvent::Synced);
    // The watch runs over TLS too.
    let cidr = "10.244.93.0/26";
    client.put(block_key(cidr.parse().unwrap()), block(cidr, "node-b").to_string(), None).await.unwrap();
    let s = next_snapshot(&mut rx, Duration::from_secs(1)).await;
    assert!(s.cluster.ipam_blocks.contains_key("10-244-93-0-26"));
}

/// Only `Unsynced` events for `window` (no snapshot, no `Synced`): the reasons seen.
async fn only_unsynced(rx: &mut mpsc::Receiver<DatastoreEvent>, window: Duration) -> Vec<String> {
    let end = Instant::now() + window;
    let mut reasons = Vec::new();
    while let Ok(event) = timeout(end.saturating_duration_since(Instant::now()), rx.recv()).await {
        match event.expect("datastore alive") {
            DatastoreEvent::Unsynced { reason } => reasons.push(reason),
            other => panic!("expected only Unsynced, got {other:?}"),
        }
    }
    reasons
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_with_a_wrong_ca_or_no_client_certificate_stays_unsynced_naming_the_endpoint_and_files() {
    let etcd = Etcd::start_tls(Pki::new());
    let mut client = etcd.client().await;
    load_example(&mut client).await;
    let pki = etcd.tls.as_ref().unwrap();
    // A CA that did not sign the server certificate.
    let wrong = pki.options(&etcd, "wrong-ca.pem", true);
    let note = format!(" (TLS: CA file {}, client certificate {})", pki.file("wrong-ca.pem").display(), pki.file("client.pem").display());
    let reason = format!("etcd {}: range read of /calico/: invalid peer certificate: UnknownIssuer: transport error{note}", etcd.url());
    let err = EtcdDatastore::new(wrong.clone()).load().await.unwrap_err().to_string();
    assert_eq!(err, format!("datastore etcd: {reason}"));
    // Running: unsynced with that reason, retried (the same reason is not sent again), and
    // no snapshot, so nothing is planned and nothing deleted.
    let (mut rx, _task) = spawn_with(wrong, 16);
    assert_eq!(only_unsynced(&mut rx, Duration::from_secs(4)).await, vec![reason]);
    // The right CA but no client certificate: etcd refuses the handshake.
    let (mut rx, _task) = spawn_with(pki.options(&etcd, "ca.pem", false), 16);
    let reasons = only_unsynced(&mut rx, Duration::from_secs(4)).await;
    // An http:// endpoint with TLS files never connects: refused before anything is tried.
    let http = etcd.url().replace("https://", "http://");
    let (_rx, task) = spawn_with(EtcdOptions { endpoints: vec![http.clone()], ..pki.options(&etcd, "ca.pem", true) }, 1);
    assert_eq!(
        task.await.unwrap().unwrap_err().to_string(),
        format!(
            "datastore etcd: etcd endpoint {http} is http:// but --etcd-ca-file/--etcd-cert-file/--etcd-key-file are set: write it {} (TLS needs an https:// endpoint)",
            etcd.url()
        )
    );
    // Under TLS 1.3 the server's refusal reaches the client after its handshake, so the
    // cause varies (`received fatal alert: BadCertificate`, `connection closed`, `broken
    // pipe`); the endpoint and the files are always named.
    assert!(!reasons.is_empty());
    for r in &reasons {
        assert!(r.starts_with(&format!("etcd {}: range read of /calico/: ", etcd.url())), "{reasons:?}");
        assert!(r.ends_with(&format!(" (TLS: CA file {})", pki.file("ca.pem").display())), "{reasons:?}");
    }
}

/// `agent/tests/fixtures/calico-etcdv3.kv`: the example cluster as libcalico-go writes it to
/// etcd, hand-written (the file's header cites the keys and JSON bodies), as `(key, value)`.
fn calico_fixture() -> Vec<(String, String)> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/calico-etcdv3.kv");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (k, v) = l.split_once(' ').unwrap_or_else(|| panic!("fixture line without a value: {l}"));
            (k.to_string(), v.to_string())
        })
        .collect()
}

/// Put every fixture key with `etcdctl`, as an operator restoring a datastore would: nothing
/// of routewarden's encoder (`etcd_entry`, `block_key`) is involved.
fn etcdctl_put_all(etcd: &Etcd, entries: &[(String, String)]) {
    for (key, value) in entries {
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", etcd.url()))
            .args(["put", key, value])
            .output()
            .expect("etcdctl (Debian etcd-client) runs");
        assert!(out.status.success(), "etcdctl put {key}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "OK", "etcdctl put {key}");
    }
}

/// The etcd layout proven against Calico's own writing, not a round trip through
/// routewarden's encoder: the hand-written keys and bodies read as the same cluster the file
/// datastore reads from `examples/cluster`, and give node-a exactly the example's routes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_as_libcalico_go_writes_them_give_the_exact_routes() {
    let entries = calico_fixture();
    assert_eq!(entries.len(), 38);
    let etcd = Etcd::start();
    etcd.client().await; // up and answering
    etcdctl_put_all(&etcd, &entries);
    let from_etcd = EtcdDatastore::new(options(&etcd)).load().await.unwrap();
    assert_eq!(from_etcd.object_errors, vec![]);
    assert_eq!(from_etcd.load_errors, vec![]);
    // 6 pools, 4 nodes, 3 configurations, 11 blocks, 11 affinities; handles and the IPAM
    // config are not inputs.
    assert_eq!(from_etcd.inputs, 35);
    // All three example files: with etcd, node-b and node-c are Calico Nodes too.
    let file = FileDatastore::load(examples()).unwrap();
    assert_eq!(file.object_errors, vec![]);
    assert_eq!(explain_text(&from_etcd), explain_text(&file));
    // Every class routewarden can route (never VXLAN, which is always Felix's).
    let routes = routewarden::routes::desired_routes(
        &from_etcd.cluster,
        "node-a",
        &routewarden::routes::routable_classes(),
        &routewarden::routes::RouteDevices::default(),
    );
    let got: Vec<String> = routes
        .routes
        .iter()
        .map(|r| match r.gateway {
            Some(g) => format!("{} via {g} dev {} [{}]", r.dst, r.device.clone().unwrap_or_default(), r.pool),
            None => format!("{} {:?} [{}]", r.dst, r.path, r.pool),
        })
        .collect();
    assert_eq!(
        got,
        [
            "10.244.10.0/26 Blackhole [default-ipv4-ippool]",
            "10.244.20.0/26 via 10.0.0.12 dev eth0 [default-ipv4-ippool]",
            "10.244.20.5/32 via 10.0.0.13 dev eth0 [default-ipv4-ippool]",
            "10.244.30.0/26 via 10.0.0.13 dev eth0 [default-ipv4-ippool]",
            "10.244.40.0/26 via 10.0.1.14 dev tunl0 [default-ipv4-ippool]",
            "10.245.20.0/26 via 10.0.0.12 dev tunl0 [ipip-always]",
            "10.245.40.0/26 via 10.0.1.14 dev tunl0 [ipip-always]",
            "10.246.10.0/26 Blackhole [flat]",
            "10.246.30.0/26 via 10.0.0.13 dev eth0 [flat]",
            "fd00:10:244:0:10::/122 Blackhole [flat-ipv6]",
            "fd00:10:244:0:20::/122 via fd00:10::12 dev eth0 [flat-ipv6]",
        ]
    );
    assert_eq!(routes.problems, vec![]);
}
