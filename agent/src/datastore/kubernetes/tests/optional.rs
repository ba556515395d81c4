//! Optional sources: the calico-node env and the operator's Installation.

use super::*;

/// `/apis/operator.tigera.io/v1` of an operator install.
pub(super) fn operator_resources() -> Json {
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "operator.tigera.io/v1", "resources": [
        {"name": "installations", "singularName": "installation", "namespaced": false, "kind": "Installation", "verbs": ["get", "list", "watch", "update"]},
        {"name": "installations/status", "singularName": "", "namespaced": false, "kind": "Installation", "verbs": ["get"]}
    ]})
}

pub(super) const CALICO_SYSTEM_DS: &str = "/apis/apps/v1/namespaces/calico-system/daemonsets";
pub(super) const INSTALLATIONS: &str = "/apis/operator.tigera.io/v1/installations";

pub(super) fn installation(rv: &str, mode: &str) -> Json {
    json!({"apiVersion": "operator.tigera.io/v1", "kind": "Installation",
           "metadata": {"name": "default", "resourceVersion": rv, "uid": "i1"},
           "spec": {"variant": "Calico", "calicoNetwork": {"clusterRoutingMode": mode, "ipPools": [{"cidr": "10.244.0.0/16"}]}},
           "status": {"computed": {}}})
}

fn forbidden_ds(ns: &str) -> Reply {
    Reply::Json(
        StatusCode::FORBIDDEN,
        status(403, "Forbidden", &format!("daemonsets.apps \"calico-node\" is forbidden: User \"system:serviceaccount:routewarden:routewarden\" cannot list resource \"daemonsets\" in API group \"apps\" in the namespace \"{ns}\"")),
    )
}

#[tokio::test]
async fn operator_install_env_outranks_the_datastore_and_a_forbidden_namespace_is_a_finding_not_unsynced() {
    let group = CalicoGroup::CrdV1;
    let objects = cluster_objects(&examples_cluster(), group);
    let api = StdArc::new(FakeApi::default());
    script_discovery(&api, group);
    api.json("GET /apis/operator.tigera.io/v1", operator_resources());
    let _w = script_lists(&api, group, &objects, "100");
    // calico-system: Felix's env says Enabled. The operator's mode is Felix.
    let env = json!([{"name": "DATASTORE_TYPE", "value": "kubernetes"}, {"name": "FELIX_PROGRAMCLUSTERROUTES", "value": "Enabled"}]);
    api.json(&format!("GET {CALICO_SYSTEM_DS}"), daemonset_list("100", &[calico_node_ds("calico-system", "100", &env)]));
    let _cs = api.watch(CALICO_SYSTEM_DS);
    api.json(&format!("GET {INSTALLATIONS}"), json!({"apiVersion": "operator.tigera.io/v1", "kind": "InstallationList", "metadata": {"resourceVersion": "100"}, "items": [installation("100", "Felix")]}));
    let _inst = api.watch(INSTALLATIONS);
    // kube-system: the Role is missing (not applied yet, or revoked): 403; once granted, the
    // retried list succeeds.
    api.replies_clear(&format!("GET {KUBE_SYSTEM_DS}"));
    api.on(&format!("GET {KUBE_SYSTEM_DS}"), forbidden_ds("kube-system"));
    let granted = api.deferred(&format!("GET {KUBE_SYSTEM_DS}"));

    let mut ds = Running::start(&api, ApiGroupChoice::Auto);
    let events = ds.until_synced().await;
    assert!(events.iter().all(|e| !matches!(e, DatastoreEvent::Unsynced { .. })), "a forbidden optional source never unsyncs: {events:?}");
    let Some(DatastoreEvent::Snapshot(snap)) = events.iter().rev().find(|e| matches!(e, DatastoreEvent::Snapshot(_))).cloned() else {
        panic!("no snapshot: {events:?}")
    };
    assert!(snap.load_errors.is_empty() && snap.object_errors.is_empty(), "{:?} {:?}", snap.load_errors, snap.object_errors);
    let reason = "list failed: daemonsets.apps \"calico-node\" is forbidden: User \"system:serviceaccount:routewarden:routewarden\" cannot list resource \"daemonsets\" in API group \"apps\" in the namespace \"kube-system\" (403 Forbidden)";
    assert_eq!(snap.cluster.unread, BTreeMap::from([(OptionalSource::CalicoNodeEnv("kube-system"), reason.to_owned())]));
    assert_eq!(snap.cluster.installations.keys().collect::<Vec<_>>(), ["default"]);
    assert_eq!(snap.cluster.installations["default"].cluster_routing_mode.as_deref(), Some("Felix"));
    assert_eq!(snap.cluster.calico_node_daemonsets.keys().collect::<Vec<_>>(), ["calico-system/calico-node"]);

    // The decision: Felix's value is the env's (it outranks FelixConfiguration default's
    // EnabledIPIPOnly), so routewarden in Felix's role programs IPIP and no-encap.
    let d = decide(&snap.cluster, &felix("node-a"));
    assert_eq!(d.felix.value, ClusterRoutes::Enabled);
    assert!(
        matches!(&d.felix.source, DecisionSource::Env { daemonset, value, .. } if daemonset == "calico-system/calico-node" && value == "Enabled"),
        "{:?}",
        d.felix.source
    );
    let codes: Vec<(&str, String)> = d.findings.iter().filter(|f| f.class.is_none()).map(|f| (f.code(), f.message.clone())).collect();
    assert!(codes.contains(&(
        "source-unreadable",
        format!("could not read calico-node env (kube-system/calico-node): {reason}; a FELIX_PROGRAMCLUSTERROUTES there outranks every FelixConfiguration, so the decision shown follows the datastore and may not be Felix's")
    )), "{codes:?}");
    assert!(codes.iter().any(|(c, _)| *c == "operator-mismatch"), "{codes:?}");

    // Permission granted: the retried list succeeds and the finding goes, live.
    granted.send(Reply::Json(StatusCode::OK, daemonset_list("101", &[]))).ok().unwrap();
    let snap = ds.snapshot().await;
    assert!(snap.cluster.unread.is_empty(), "{:?}", snap.cluster.unread);
    assert!(decide(&snap.cluster, &felix("node-a")).findings.iter().all(|f| f.code() != "source-unreadable"));

    // The exact requests of the optional reads: by name only, in their namespaces.
    let per = per_resource(&api.log());
    assert_eq!(
        per[CALICO_SYSTEM_DS][0],
        format!("GET {CALICO_SYSTEM_DS}?&fieldSelector=metadata.name%3Dcalico-node&resourceVersion=0&resourceVersionMatch=NotOlderThan")
    );
    assert_eq!(per[INSTALLATIONS][0], format!("GET {INSTALLATIONS}?&resourceVersion=0&resourceVersionMatch=NotOlderThan"));
    assert_eq!(per[KUBE_SYSTEM_DS].iter().filter(|l| !l.contains("watch=true")).count(), 2, "{:?}", per[KUBE_SYSTEM_DS]);
}

#[tokio::test]
async fn one_shot_load_with_an_unreadable_optional_source_still_loads() {
    let group = CalicoGroup::CrdV1;
    let objects = cluster_objects(&examples_cluster(), group);
    let api = StdArc::new(FakeApi::default());
    script_discovery(&api, group);
    for plural in CALICO_PLURALS.iter().copied().chain(["nodes"]) {
        api.json(&format!("GET {}", path(group, plural)), list(group, plural, "100", objects.get(plural).map_or(&[][..], Vec::as_slice)));
    }
    api.on(&format!("GET {KUBE_SYSTEM_DS}"), forbidden_ds("kube-system"));
    let snap = KubernetesDatastore::new(api.client(), ApiGroupChoice::Auto).load().await.unwrap();
    assert_eq!(snap.cluster.unread.keys().collect::<Vec<_>>(), [&OptionalSource::CalicoNodeEnv("kube-system")]);
    assert!(snap.load_errors.is_empty());
    // Without the operator's group, calico-system and installations are not even asked for.
    assert!(api.log().iter().all(|l| !l.contains("calico-system") && !l.contains("installations")), "{:?}", api.log());
}
