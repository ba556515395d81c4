//! API discovery while the Kubernetes datastore runs, against the API-server stand-in: the
//! operator's group (`operator.tigera.io/v1`) installed after the datastore started is read
//! at the next discovery run; removed (its CRD deleted), the Installation is withdrawn with a
//! finding. The plan's routes stay exactly the same throughout, and the datastore is never
//! unsynced.

use std::collections::BTreeSet;
use std::time::Duration;

use routewarden::datastore::{ApiGroupChoice, DatastoreEvent, KubernetesDatastore, Snapshot};
use routewarden::ownership::{CalicoVersion, OwnershipConfig, Role};
use routewarden::plan::{plan, PlanConfig};
use routewarden::routes::{ClusterRoute, RouteDevices};
use routewarden_lab::example::serve_example;
use routewarden_lab::example_cluster_dir;
use routewarden_lab::standin::{ApiServer, ResourceType};
use serde_json::json;
use tokio::sync::mpsc;

fn config() -> PlanConfig {
    PlanConfig {
        node: "node-a".to_owned(),
        ownership: OwnershipConfig { role: Role::Felix, version: CalicoVersion::V3_33.into(), node: Some("node-a".to_owned()) },
        devices: RouteDevices::default(),
        protocol: 80,
        table: 254,
    }
}

/// The plan's routes and its findings about sources (no class), as (code, message).
fn planned(snap: &Snapshot) -> (Vec<ClusterRoute>, Vec<(&'static str, String)>) {
    let p = plan(snap, &config(), &BTreeSet::new(), &[]);
    let findings = p.decision.findings.iter().filter(|f| f.class.is_none()).map(|f| (f.code(), f.message.clone())).collect();
    (p.desired.values().map(|r| (**r).clone()).collect(), findings)
}

/// Snapshots until one that `done` accepts; `Synced` is not sent again and `Unsynced` never.
async fn until(rx: &mut mpsc::Receiver<DatastoreEvent>, routes: &[ClusterRoute], done: impl Fn(&Snapshot) -> bool) -> Snapshot {
    loop {
        match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.expect("an event within 10 s").expect("running") {
            DatastoreEvent::Snapshot(s) => {
                assert_eq!(planned(&s).0, routes, "the routes never change");
                if done(&s) {
                    return s;
                }
            }
            other => panic!("only snapshots while the operator comes and goes, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_group_added_and_removed_at_run_time_changes_findings_only() {
    let api = ApiServer::new();
    serve_example(&api, &example_cluster_dir());
    let (tx, mut rx) = mpsc::channel(64);
    let ds =
        KubernetesDatastore::new(api.client(), ApiGroupChoice::Auto).with_list_settle(Duration::ZERO).with_discovery_interval(Some(Duration::from_millis(200)));
    let task = ds.spawn(tx);

    let mut first = None;
    loop {
        match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.expect("synced within 10 s").expect("running") {
            DatastoreEvent::Snapshot(s) => first = Some(s),
            DatastoreEvent::Synced => break,
            other => panic!("{other:?}"),
        }
    }
    let first = first.expect("a snapshot before Synced");
    let (routes, findings) = planned(&first);
    assert!(!routes.is_empty());
    assert_eq!(findings, []);

    // The operator installed: its CRD, then its Installation (Felix's mode, which the example's
    // fields contradict).
    let installations = ResourceType::new("operator.tigera.io/v1", "Installation", "installations", false);
    api.register(&installations);
    api.create(&installations, json!({"metadata": {"name": "default"}, "spec": {"calicoNetwork": {"clusterRoutingMode": "Felix"}}})).unwrap();
    let snap = until(&mut rx, &routes, |s| !s.cluster.installations.is_empty()).await;
    assert_eq!(
        planned(&snap).1,
        [(
            "operator-mismatch",
            "Installation default: clusterRoutingMode Felix means programClusterRoutes FelixConfiguration default Enabled and BGPConfiguration default Disabled, but FelixConfiguration default has \"EnabledIPIPOnly\" and BGPConfiguration default has \"EnabledNoEncapOnly\"; the operator rewrites them on its next reconcile, or they were changed by hand".to_owned()
        )]
    );

    // The operator uninstalled: its group removed (the Installation deleted first, as the
    // CRD's finalizer does, then the group no longer served).
    api.remove_group("operator.tigera.io/v1").unwrap();
    let snap = until(&mut rx, &routes, |s| !s.cluster.api_changes.is_empty()).await;
    assert!(snap.cluster.installations.is_empty());
    assert_eq!(
        planned(&snap).1,
        [(
            "source-withdrawn",
            "operator.tigera.io/v1 is no longer served: Installation default, read until then, is dropped; the operator's clusterRoutingMode is no longer compared with the fields it writes".to_owned()
        )]
    );
    // Nothing more: no unsynced, no re-list of a Calico resource, no request to the group.
    let log = api.log();
    let mark = log.entries().len();
    if let Ok(Some(ev)) = tokio::time::timeout(Duration::from_secs(1), rx.recv()).await {
        panic!("nothing more after the withdrawal, got {ev:?}");
    }
    let after: Vec<String> = log.entries()[mark..].iter().map(|e| e.path.clone()).collect();
    assert!(after.iter().all(|p| p == "/apis" || p == "/version"), "{after:?}");
    task.abort();
}
