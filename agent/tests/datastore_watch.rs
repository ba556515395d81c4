//! The file datastore's watch loop with real filesystem notifications.

use std::time::Duration;

use routewarden::datastore::{DatastoreEvent, FileDatastore};
use tokio::sync::mpsc;
use tokio::time::timeout;

const POOL: &str = "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: p1}\nspec: {cidr: 10.244.0.0/16}\n";

async fn next(rx: &mut mpsc::Receiver<DatastoreEvent>) -> DatastoreEvent {
    // Long enough for a slow CI machine; the periodic rescan is set to 60 s so only
    // notifications can deliver the changes in time.
    timeout(Duration::from_secs(10), rx.recv()).await.expect("event in time").expect("datastore alive")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_on_change_and_keeps_last_good_state() {
    let dir = std::env::temp_dir().join(format!("routewarden-watch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("cluster.yaml");
    std::fs::write(&file, POOL).unwrap();

    let (tx, mut rx) = mpsc::channel(16);
    let handle = FileDatastore::new(&dir).with_debounce(Duration::from_millis(100)).with_rescan_interval(Duration::from_mins(1)).spawn(tx);

    let DatastoreEvent::Snapshot(s) = next(&mut rx).await else { panic!("first event must be a snapshot") };
    assert!(s.cluster.ip_pools.contains_key("p1"));
    assert_eq!(next(&mut rx).await, DatastoreEvent::Synced);

    // A broken edit: LoadFailed with file and line, then a snapshot that keeps p1.
    std::fs::write(&file, "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: [\n").unwrap();
    let DatastoreEvent::LoadFailed(err) = next(&mut rx).await else { panic!("expected LoadFailed") };
    assert_eq!(err.file, file);
    assert!(err.line.is_some(), "{err}");
    let DatastoreEvent::Snapshot(s) = next(&mut rx).await else { panic!("expected snapshot") };
    assert!(s.cluster.ip_pools.contains_key("p1"));
    assert_eq!(s.load_errors.len(), 1);

    // A good edit, replaced by rename as editors and ConfigMap updates do.
    let tmp = dir.join(".cluster.yaml.tmp");
    std::fs::write(&tmp, POOL.replace("p1", "p2")).unwrap();
    std::fs::rename(&tmp, &file).unwrap();
    let DatastoreEvent::Snapshot(s) = next(&mut rx).await else { panic!("expected snapshot") };
    assert_eq!(s.cluster.ip_pools.keys().collect::<Vec<_>>(), vec!["p2"]);
    assert!(s.load_errors.is_empty());

    drop(rx);
    let res = timeout(Duration::from_secs(5), handle).await.expect("stops when the receiver is dropped");
    assert!(res.expect("task").is_ok());
    let _ = std::fs::remove_dir_all(&dir);
}
