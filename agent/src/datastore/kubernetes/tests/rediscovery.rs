//! API groups that appear and vanish while the datastore runs: discovery again on the timer
//! and at once on a 404, the operator's sources started and withdrawn (a finding, never
//! unsynced, no other watch touched), the Calico group read kept with a finding. Virtual time
//! from the first sync on.

use super::optional::{installation, operator_resources, CALICO_SYSTEM_DS, INSTALLATIONS};
use super::*;
use crate::model::CalicoGroupChange;

/// `/apis` serving the `calico` groups and, with `operator`, `operator.tigera.io/v1`.
fn groups(calico: &[CalicoGroup], operator: bool) -> Json {
    let mut doc = api_groups(calico);
    if operator {
        let v = json!({"groupVersion": "operator.tigera.io/v1", "version": "v1"});
        doc["groups"].as_array_mut().unwrap().push(json!({"name": "operator.tigera.io", "versions": [v.clone()], "preferredVersion": v}));
    }
    doc
}

fn installations(rv: &str, items: &[Json]) -> Json {
    json!({"apiVersion": "operator.tigera.io/v1", "kind": "InstallationList", "metadata": {"resourceVersion": rv}, "items": items})
}

/// The requests since the last call but the probe's and the watches from the first sync's
/// version 100 resumed (a watch with no event for its timeout plus 5 s, 295 s, is started
/// again from where it was, as kube's watcher does).
fn log_since(api: &FakeApi) -> Vec<String> {
    api.take_log().into_iter().filter(|l| !(l.starts_with("GET /version") || l.contains("watch=true") && l.ends_with("resourceVersion=100"))).collect()
}

/// [`log_since`] by path.
fn requests(api: &FakeApi) -> BTreeMap<String, Vec<String>> {
    per_resource(&log_since(api))
}

/// The findings about sources and versions (no class), as (code, message).
fn source_findings(snap: &Snapshot) -> Vec<(&'static str, String)> {
    decide(&snap.cluster, &felix("a")).findings.into_iter().filter(|f| f.class.is_none()).map(|f| (f.code(), f.message)).collect()
}

/// Events until a snapshot `done` accepts; every event before it must be a snapshot that
/// `before` accepts (never `Unsynced`, never `Synced` again).
async fn snapshot_until(ds: &mut Running, before: impl Fn(&Snapshot), done: impl Fn(&Snapshot) -> bool) -> Snapshot {
    loop {
        match tokio::time::timeout(Duration::from_mins(10), ds.rx.recv()).await.expect("an event").expect("running") {
            DatastoreEvent::Snapshot(s) if done(&s) => return s,
            DatastoreEvent::Snapshot(s) => before(&s),
            other => panic!("only snapshots while optional sources come and go, got {other:?}"),
        }
    }
}

fn list_of(path: &str, selector: &str) -> String {
    format!("GET {path}?{selector}&resourceVersion=0&resourceVersionMatch=NotOlderThan")
}

fn watch_of(path: &str, selector: &str, rv: &str) -> String {
    format!("GET {path}?&watch=true&timeoutSeconds=290{selector}&allowWatchBookmarks=true&resourceVersion={rv}")
}

/// Wait (real time) until every resource of the first sync is watched: 8 watches (six Calico
/// resources, Nodes, kube-system's DaemonSet), so that the log holds no request from the sync.
async fn all_watching(api: &FakeApi) {
    for _ in 0..1000 {
        if api.log().iter().filter(|l| l.contains("watch=true")).count() >= 8 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("not every resource watched: {:?}", api.log());
}

const DS_SELECTOR: &str = "&fieldSelector=metadata.name%3Dcalico-node";

#[tokio::test]
async fn the_operators_group_installed_later_is_read_and_its_removal_is_a_finding() {
    let group = CalicoGroup::CrdV1;
    let (api, _watches, _) = two_blocks_scripted(group);
    let mut ds = Running::start_with(&api, ApiGroupChoice::Auto, Duration::ZERO, Some(Duration::from_mins(5)));
    let events = ds.until_synced().await;
    let Some(DatastoreEvent::Snapshot(synced)) = events.iter().rev().find(|e| matches!(e, DatastoreEvent::Snapshot(_))).cloned() else { panic!("{events:?}") };
    assert_eq!(source_findings(&synced), []);
    all_watching(&api).await;
    ds.quiet(100).await;
    tokio::time::pause();
    api.take_log();
    let started = tokio::time::Instant::now();
    // What the routes are made of never changes below.
    let same_routes = |s: &Snapshot| {
        assert_eq!(s.cluster.ip_pools, synced.cluster.ip_pools);
        assert_eq!(s.cluster.ipam_blocks, synced.cluster.ipam_blocks);
        assert_eq!(s.cluster.nodes, synced.cluster.nodes);
        assert!(s.load_errors.is_empty() && s.object_errors.is_empty(), "{:?} {:?}", s.load_errors, s.object_errors);
    };

    // The operator installed: the next run (5 minutes on) sees its group and reads the
    // Installation and calico-system's calico-node; the view stays synced throughout.
    api.json("GET /apis", groups(&[group], true));
    api.json("GET /apis/operator.tigera.io/v1", operator_resources());
    api.json(&format!("GET {INSTALLATIONS}"), installations("200", &[installation("200", "Felix")]));
    let installation_watch = api.watch(INSTALLATIONS);
    api.json(&format!("GET {CALICO_SYSTEM_DS}"), daemonset_list("200", &[]));
    let _calico_system = api.watch(CALICO_SYSTEM_DS);
    let snap = snapshot_until(&mut ds, &same_routes, |s| !s.cluster.installations.is_empty()).await;
    let took = started.elapsed();
    // On the 5-minute timer, which started with the datastore, just before the first sync.
    assert!(took > Duration::from_secs(299) && took <= Duration::from_mins(5), "read after {took:?}");
    same_routes(&snap);
    assert_eq!(snap.cluster.installations["default"].cluster_routing_mode.as_deref(), Some("Felix"));
    assert!(snap.cluster.api_changes.is_empty());
    let appeared = vec![(
        "operator-mismatch",
        "Installation default: clusterRoutingMode Felix means programClusterRoutes FelixConfiguration default Enabled and BGPConfiguration default Disabled, but FelixConfiguration default has none and BGPConfiguration default has none; the operator rewrites them on its next reconcile, or they were changed by hand".to_owned(),
    )];
    assert_eq!(source_findings(&snap), appeared);
    ds.quiet(100).await;
    // Exactly: one GET /apis, the operator's resources, a list and a watch of each new source;
    // no Calico resource listed or watched again.
    let want: BTreeMap<String, Vec<String>> = [
        ("/apis".to_owned(), vec!["GET /apis".to_owned()]),
        ("/apis/operator.tigera.io/v1".to_owned(), vec!["GET /apis/operator.tigera.io/v1".to_owned()]),
        (INSTALLATIONS.to_owned(), vec![list_of(INSTALLATIONS, ""), watch_of(INSTALLATIONS, "", "200")]),
        (CALICO_SYSTEM_DS.to_owned(), vec![list_of(CALICO_SYSTEM_DS, DS_SELECTOR), watch_of(CALICO_SYSTEM_DS, DS_SELECTOR, "200")]),
    ]
    .into_iter()
    .collect();
    assert_eq!(requests(&api), want);

    // The operator uninstalled: deleting its CRD deletes the Installation (the CRD finalizer)
    // and ends the watch; watching again answers 404, which runs discovery at once: the group
    // is gone, so the Installation is withdrawn with a finding naming the group.
    api.on(&format!("WATCH {INSTALLATIONS}"), Reply::Json(StatusCode::NOT_FOUND, status(404, "NotFound", "the server could not find the requested resource")));
    api.json("GET /apis", groups(&[group], false));
    installation_watch.unbounded_send(event("DELETED", &installation("201", "Felix"))).unwrap();
    drop(installation_watch);
    let at = tokio::time::Instant::now();
    let snap = snapshot_until(&mut ds, |s| same_routes(s), |s| !s.cluster.api_changes.is_empty()).await;
    assert!(at.elapsed() < Duration::from_secs(1), "at once, not on the timer: {:?}", at.elapsed());
    same_routes(&snap);
    assert!(snap.cluster.installations.is_empty() && snap.cluster.unread.is_empty());
    assert_eq!(snap.cluster.api_changes.withdrawn, BTreeMap::from([(OptionalSource::Installation, "operator.tigera.io/v1")]));
    let disappeared = vec![(
        "source-withdrawn",
        "operator.tigera.io/v1 is no longer served: Installation default, read until then, is dropped; the operator's clusterRoutingMode is no longer compared with the fields it writes".to_owned(),
    )];
    assert_eq!(source_findings(&snap), disappeared);
    ds.quiet(100).await;
    let want: BTreeMap<String, Vec<String>> =
        [("/apis".to_owned(), vec!["GET /apis".to_owned()]), (INSTALLATIONS.to_owned(), vec![watch_of(INSTALLATIONS, "", "201")])].into_iter().collect();
    assert_eq!(requests(&api), want);

    // Two more runs find nothing new: one GET /apis each, the withdrawn watch stays stopped,
    // nothing is sent.
    api.json("GET /apis", groups(&[group], false));
    api.json("GET /apis", groups(&[group], false));
    tokio::time::sleep(Duration::from_secs(601)).await;
    ds.quiet(1).await;
    let per = requests(&api);
    assert_eq!(per["/apis"], ["GET /apis", "GET /apis"]);
    // Besides, only calico-system's watch resumed after 295 s without events (as kube does):
    // none of the withdrawn Installation's.
    let resumed =
        |per: &BTreeMap<String, Vec<String>>| per.get(CALICO_SYSTEM_DS).is_none_or(|l| l.iter().all(|l| *l == watch_of(CALICO_SYSTEM_DS, DS_SELECTOR, "200")));
    assert!(resumed(&per), "{per:?}");
    assert_eq!(per.len(), 2, "{per:?}");

    // Installed again: read again, the finding goes; calico-system's DaemonSet was never
    // stopped, so it is not listed again.
    api.json("GET /apis", groups(&[group], true));
    api.json("GET /apis/operator.tigera.io/v1", operator_resources());
    api.json(&format!("GET {INSTALLATIONS}"), installations("300", &[installation("300", "FelixIPIPOnly")]));
    let _again = api.watch(INSTALLATIONS);
    let snap = snapshot_until(&mut ds, &same_routes, |s| !s.cluster.installations.is_empty()).await;
    assert!(snap.cluster.api_changes.is_empty());
    assert_eq!(source_findings(&snap).iter().map(|(c, _)| *c).collect::<Vec<_>>(), ["operator-mismatch"]);
    ds.quiet(100).await;
    let mut per = requests(&api);
    assert!(resumed(&per), "{per:?}");
    per.remove(CALICO_SYSTEM_DS);
    assert_eq!(per.keys().collect::<Vec<_>>(), ["/apis", "/apis/operator.tigera.io/v1", INSTALLATIONS]);
    assert_eq!(per["/apis"], ["GET /apis"]);
    assert_eq!(per[INSTALLATIONS], [list_of(INSTALLATIONS, ""), watch_of(INSTALLATIONS, "", "300")]);
}

#[tokio::test]
async fn a_calico_group_auto_would_now_choose_is_a_finding_and_the_group_read_stays() {
    let group = CalicoGroup::V3;
    let api = StdArc::new(FakeApi::default());
    script_discovery(&api, group);
    let _watches = script_lists(&api, group, &Objects::new(), "100");
    let mut ds = Running::start_with(&api, ApiGroupChoice::Auto, Duration::ZERO, Some(Duration::from_mins(5)));
    ds.until_synced().await;
    all_watching(&api).await;
    ds.quiet(100).await;
    tokio::time::pause();
    api.take_log();

    // crd.projectcalico.org/v1 appears next to v3: auto would choose it now. A finding; no
    // resource is listed again.
    api.json("GET /apis", groups(&[CalicoGroup::V3, CalicoGroup::CrdV1], false));
    api.json("GET /apis/crd.projectcalico.org/v1", api_resources(CalicoGroup::CrdV1, &CALICO_PLURALS));
    let snap = snapshot_until(&mut ds, |_| {}, |_| true).await;
    assert_eq!(snap.cluster.api_changes.calico_group, Some(CalicoGroupChange { read: "projectcalico.org/v3", discovered: "crd.projectcalico.org/v1" }));
    assert_eq!(
        source_findings(&snap),
        [(
            "api-group-changed",
            "API discovery now chooses crd.projectcalico.org/v1 for the Calico objects, but routewarden reads projectcalico.org/v3, chosen at start; restart routewarden to read crd.projectcalico.org/v1".to_owned()
        )]
    );
    ds.quiet(100).await;
    let log = log_since(&api);
    assert_eq!(log, ["GET /apis", "GET /apis/crd.projectcalico.org/v1"]);

    // Gone again on the next run: so is the finding.
    api.json("GET /apis", groups(&[CalicoGroup::V3], false));
    let snap = snapshot_until(&mut ds, |_| {}, |_| true).await;
    assert!(snap.cluster.api_changes.is_empty());
    assert_eq!(source_findings(&snap), []);
    let log = log_since(&api);
    assert_eq!(log, ["GET /apis"]);

    // A forced group is never reported: the run only looks for the operator.
    let api = StdArc::new(FakeApi::default());
    api.json("GET /apis/projectcalico.org/v3", api_resources(CalicoGroup::V3, &CALICO_PLURALS));
    let _watches = script_lists(&api, group, &Objects::new(), "100");
    let mut ds = Running::start_with(&api, ApiGroupChoice::Forced(CalicoGroup::V3), Duration::ZERO, Some(Duration::from_mins(5)));
    tokio::time::resume();
    ds.until_synced().await;
    all_watching(&api).await;
    ds.quiet(100).await;
    tokio::time::pause();
    api.take_log();
    api.json("GET /apis", groups(&[CalicoGroup::V3, CalicoGroup::CrdV1], false));
    tokio::time::sleep(Duration::from_secs(301)).await;
    ds.quiet(100).await;
    let log = log_since(&api);
    assert_eq!(log, ["GET /apis"]);
}

/// A 404 from an optional source whose group is still served (here kube-system's DaemonSet
/// read: `apps/v1` is always served) runs discovery at once; only then is it the source's
/// own error (`source-unreadable`), so no finding flickers while discovery runs.
#[tokio::test]
async fn a_404_runs_discovery_at_once_and_a_source_still_served_is_unreadable() {
    let group = CalicoGroup::CrdV1;
    let (api, mut watches, _) = two_blocks_scripted(group);
    let mut ds = Running::start_with(&api, ApiGroupChoice::Auto, Duration::ZERO, Some(Duration::from_mins(5)));
    ds.until_synced().await;
    all_watching(&api).await;
    ds.quiet(100).await;
    tokio::time::pause();
    api.take_log();

    let reason = "watch failed to start: the server could not find the requested resource (404 NotFound)";
    api.on(&format!("WATCH {KUBE_SYSTEM_DS}"), Reply::Json(StatusCode::NOT_FOUND, status(404, "NotFound", "the server could not find the requested resource")));
    api.json("GET /apis", groups(&[group], false));
    let relist = api.deferred(&format!("GET {KUBE_SYSTEM_DS}"));
    drop(watches.remove("daemonsets"));
    let snap = snapshot_until(&mut ds, |_| {}, |_| true).await;
    assert_eq!(snap.cluster.unread, BTreeMap::from([(OptionalSource::CalicoNodeEnv("kube-system"), reason.to_owned())]));
    assert!(snap.cluster.api_changes.is_empty());
    ds.quiet(100).await;
    let log: Vec<String> = api.take_log().into_iter().filter(|l| !l.starts_with("GET /version")).collect();
    assert_eq!(log, [watch_of(KUBE_SYSTEM_DS, DS_SELECTOR, "100"), "GET /apis".to_owned(), list_of(KUBE_SYSTEM_DS, DS_SELECTOR)]);

    // Listed again: the finding goes.
    let _w = api.watch(KUBE_SYSTEM_DS);
    relist.send(Reply::Json(StatusCode::OK, daemonset_list("300", &[]))).ok().unwrap();
    let snap = snapshot_until(&mut ds, |_| {}, |_| true).await;
    assert!(snap.cluster.unread.is_empty());
}
