//! Streaming lists (`sendInitialEvents=true`, the API's WatchList) as the agent reads a live API
//! server (`KubernetesDatastore::connect`: `with_streaming_lists(true)`), against the API-server
//! stand-in: the first sync reads every resource through one watch each, no list request, and
//! gives exactly the cluster a cached list gives; the same watch then carries the changes.
//! Where the API server refuses streaming lists (before 1.27, or the `WatchList` feature gate
//! off: `422 Invalid`), each resource is read with a cached list instead, never unsynced.

use std::time::Duration;

use routewarden::datastore::{ApiGroupChoice, DatastoreEvent, KubernetesDatastore, Snapshot};
use routewarden_lab::example::serve_example;
use routewarden_lab::example_cluster_dir;
use routewarden_lab::standin::{ApiServer, ResourceType};
use serde_json::json;
use tokio::sync::mpsc;

/// Start a datastore on `api` and return its last snapshot before `Synced`, the receiver and
/// the task.
async fn synced(api: &ApiServer, streaming: bool) -> (Snapshot, mpsc::Receiver<DatastoreEvent>, tokio::task::JoinHandle<()>) {
    let (tx, mut rx) = mpsc::channel(64);
    let ds = KubernetesDatastore::new(api.client(), ApiGroupChoice::Auto).with_list_settle(Duration::ZERO).with_streaming_lists(streaming);
    let task = ds.spawn(tx);
    let mut last = None;
    loop {
        match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.expect("synced within 10 s").expect("running") {
            DatastoreEvent::Snapshot(s) => last = Some(s),
            DatastoreEvent::Synced => break,
            other => panic!("only snapshots before Synced, got {other:?}"),
        }
    }
    let task = tokio::spawn(async move {
        let _ = task.await;
    });
    (last.expect("a snapshot before Synced"), rx, task)
}

/// The next snapshot `done` accepts; never `Unsynced`.
async fn until(rx: &mut mpsc::Receiver<DatastoreEvent>, done: impl Fn(&Snapshot) -> bool) -> Snapshot {
    loop {
        match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.expect("an event within 10 s").expect("running") {
            DatastoreEvent::Snapshot(s) if done(&s) => return s,
            DatastoreEvent::Snapshot(_) => {}
            other => panic!("only snapshots after Synced, got {other:?}"),
        }
    }
}

fn ipam_blocks() -> ResourceType {
    ResourceType::new("crd.projectcalico.org/v1", "IPAMBlock", "ipamblocks", false)
}

/// The (resource, status, sendInitialEvents) of every watch the log holds, and the resources
/// listed, each sorted.
fn requests(api: &ApiServer) -> (Vec<(String, u16, bool)>, Vec<String>) {
    let entries = api.log().entries();
    let mut watches: Vec<(String, u16, bool)> = entries.iter().filter(|r| r.watch).map(|r| (r.resource.clone(), r.status, r.send_initial_events)).collect();
    watches.sort();
    let mut lists: Vec<String> = api.log().lists().iter().map(|r| r.resource.clone()).collect();
    lists.sort();
    (watches, lists)
}

/// The resources the example cluster's datastore reads.
const RESOURCES: [&str; 7] = ["bgpconfigurations", "blockaffinities", "clusterinformations", "daemonsets", "felixconfigurations", "ipamblocks", "ippools"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_list_reads_what_a_cached_list_reads_then_watches_on() {
    let api = ApiServer::new();
    serve_example(&api, &example_cluster_dir());
    let (cached, _rx, cached_task) = synced(&api, false).await;
    cached_task.abort();
    let mark = api.log().entries().len();

    let streaming = ApiServer::new();
    serve_example(&streaming, &example_cluster_dir());
    let (first, mut rx, task) = synced(&streaming, true).await;
    assert_eq!(first.cluster, cached.cluster, "the same cluster from a streaming list as from a cached list");
    assert_eq!((first.object_errors.len(), first.load_errors.len()), (0, 0));
    assert!(mark > 0);
    // One streaming watch per resource read, and no list at all.
    let (watches, lists) = requests(&streaming);
    let mut resources: Vec<&str> = watches.iter().map(|(r, _, _)| r.as_str()).collect();
    resources.dedup();
    assert!(watches.iter().all(|(_, status, initial)| *status == 200 && *initial), "{watches:?}");
    assert!(resources.iter().all(|r| RESOURCES.contains(r) || *r == "nodes"), "{resources:?}");
    assert!(resources.contains(&"ipamblocks") && resources.contains(&"nodes"), "{resources:?}");
    assert_eq!(lists, Vec::<String>::new());

    // The same watch carries what changes after the initial events: a new block, then its
    // deletion (no re-list: still one watch of IPAM blocks).
    let block = json!({
        "apiVersion": "crd.projectcalico.org/v1", "kind": "IPAMBlock", "metadata": {"name": "10-244-99-0-26"},
        "spec": {"cidr": "10.244.99.0/26", "affinity": "host:node-b", "allocations": [], "attributes": [], "deleted": false}
    });
    streaming.create(&ipam_blocks(), block).unwrap();
    let s = until(&mut rx, |s| s.cluster.ipam_blocks.contains_key("10-244-99-0-26")).await;
    assert_eq!(s.cluster.ipam_blocks.get("10-244-99-0-26").map(|b| b.cidr.to_string()), Some("10.244.99.0/26".to_owned()));
    streaming.delete(&ipam_blocks(), None, "10-244-99-0-26").unwrap();
    let s = until(&mut rx, |s| !s.cluster.ipam_blocks.contains_key("10-244-99-0-26")).await;
    assert_eq!(s.cluster, cached.cluster);
    let (watches, lists) = requests(&streaming);
    assert_eq!(watches.iter().filter(|(r, _, _)| r == "ipamblocks").count(), 1, "{watches:?}");
    assert_eq!(lists, Vec::<String>::new());
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_refuses_streaming_lists_is_read_with_cached_lists() {
    let api = ApiServer::new();
    serve_example(&api, &example_cluster_dir());
    let (cached, _rx, cached_task) = synced(&api, false).await;
    cached_task.abort();

    let refusing = ApiServer::new();
    serve_example(&refusing, &example_cluster_dir());
    refusing.refuse_streaming_lists();
    let (first, mut rx, task) = synced(&refusing, true).await;
    assert_eq!(first.cluster, cached.cluster);
    assert_eq!((first.object_errors.len(), first.load_errors.len()), (0, 0));
    // Per resource: the streaming watch refused (422), a cached list, then a plain watch.
    let (watches, lists) = requests(&refusing);
    let refused: Vec<&str> = watches.iter().filter(|(_, status, initial)| *status == 422 && *initial).map(|(r, _, _)| r.as_str()).collect();
    let plain: Vec<&str> = watches.iter().filter(|(_, status, initial)| *status == 200 && !*initial).map(|(r, _, _)| r.as_str()).collect();
    assert_eq!(watches.len(), refused.len() + plain.len(), "{watches:?}");
    assert_eq!(refused, lists.iter().map(String::as_str).collect::<Vec<_>>(), "every refused streaming list is followed by one list");
    assert_eq!(refused, plain);
    assert!(refused.contains(&"ipamblocks"), "{refused:?}");
    assert!(refusing.log().lists().iter().all(routewarden_lab::standin::LoggedRequest::from_cache), "every list from the watch cache");
    // And changes still arrive.
    let block = json!({
        "apiVersion": "crd.projectcalico.org/v1", "kind": "IPAMBlock", "metadata": {"name": "10-244-98-0-26"},
        "spec": {"cidr": "10.244.98.0/26", "affinity": "host:node-b", "allocations": [], "attributes": [], "deleted": false}
    });
    refusing.create(&ipam_blocks(), block).unwrap();
    until(&mut rx, |s| s.cluster.ipam_blocks.contains_key("10-244-98-0-26")).await;
    task.abort();
}

/// Broken objects read through a streaming list cost what they cost through a cached list,
/// and nothing more: an IP pool with a bad CIDR and an IPAM block that is not JSON-shaped as a
/// block are each named with their field, the cluster (so every route) is the one a cached
/// list of the same objects gives, and nothing is unsynced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_objects_streamed_are_named_and_lose_nothing() {
    let broken = |api: &ApiServer| {
        let pools = ResourceType::new("crd.projectcalico.org/v1", "IPPool", "ippools", false);
        api.create(&pools, json!({"apiVersion": "crd.projectcalico.org/v1", "kind": "IPPool", "metadata": {"name": "bad"}, "spec": {"cidr": "10.0.0/16"}}))
            .unwrap();
        api.create(
            &ipam_blocks(),
            json!({"apiVersion": "crd.projectcalico.org/v1", "kind": "IPAMBlock", "metadata": {"name": "10-244-97-0-26"}, "spec": {"cidr": "not a cidr", "affinity": "host:node-b"}}),
        )
        .unwrap();
    };
    let api = ApiServer::new();
    serve_example(&api, &example_cluster_dir());
    broken(&api);
    let (cached, _rx, cached_task) = synced(&api, false).await;
    cached_task.abort();
    let streaming = ApiServer::new();
    serve_example(&streaming, &example_cluster_dir());
    broken(&streaming);
    let (first, _rx, task) = synced(&streaming, true).await;
    let errors = |s: &Snapshot| s.object_errors.iter().map(ToString::to_string).collect::<Vec<_>>();
    assert_eq!(errors(&first), errors(&cached));
    assert_eq!(first.object_errors.len(), 2, "{:?}", errors(&first));
    assert!(errors(&first).iter().any(|e| e.contains("\"bad\"") && e.contains("spec.cidr")), "{:?}", errors(&first));
    assert!(errors(&first).iter().any(|e| e.contains("10-244-97-0-26") && e.contains("spec.cidr")), "{:?}", errors(&first));
    assert_eq!(first.cluster, cached.cluster);
    assert!(!first.cluster.ip_pools.contains_key("bad") && !first.cluster.ipam_blocks.contains_key("10-244-97-0-26"));
    assert_eq!(first.load_errors, vec![]);
    task.abort();
}
