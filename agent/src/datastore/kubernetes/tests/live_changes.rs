//! Live changes of a healthy cluster: `programClusterRoutes` in FelixConfiguration and
//! BGPConfiguration, a Calico upgrade in ClusterInformation, and Node heartbeats that change
//! nothing the model reads.

use super::*;

fn programmed(cluster: &Cluster, config: &OwnershipConfig) -> Vec<PoolClass> {
    decide(cluster, config).programmed.into_iter().collect()
}

fn felix_config(rv: &str, value: &str) -> Json {
    object(CalicoGroup::CrdV1, "felixconfigurations", "default", rv, &json!({"programClusterRoutes": value, "ipipEnabled": true}))
}

fn bgp_config(rv: &str, value: &str) -> Json {
    object(CalicoGroup::CrdV1, "bgpconfigurations", "default", rv, &json!({"programClusterRoutes": value}))
}

#[tokio::test]
async fn program_cluster_routes_changes_take_effect_live() {
    let group = CalicoGroup::CrdV1;
    let api = StdArc::new(FakeApi::default());
    script_discovery(&api, group);
    let mut objects = Objects::new();
    objects.insert(
        "ippools",
        vec![
            pool("ipip", "1", "10.244.0.0/16"),
            object(group, "ippools", "flat", "2", &json!({"cidr": "10.246.0.0/16", "ipipMode": "Never", "vxlanMode": "Never"})),
        ],
    );
    objects.insert("felixconfigurations", vec![felix_config("3", "EnabledIPIPOnly")]);
    objects.insert("bgpconfigurations", vec![bgp_config("4", "EnabledNoEncapOnly")]);
    let watches = script_lists(&api, group, &objects, "10");
    let mut ds = Running::start(&api, ApiGroupChoice::Auto);
    let s = ds.snapshot().await;
    assert_eq!(ds.next().await, DatastoreEvent::Synced);
    let bird = OwnershipConfig { role: Role::Bird, ..felix("n") };
    assert_eq!(programmed(&s.cluster, &felix("n")), vec![PoolClass::Ipip]);
    assert_eq!(programmed(&s.cluster, &bird), vec![PoolClass::NoEncap]);

    // FelixConfiguration default → Enabled: Felix's side now has both classes.
    watches["felixconfigurations"].unbounded_send(event("MODIFIED", &felix_config("11", "Enabled"))).unwrap();
    let s = ds.snapshot().await;
    assert_eq!(s.cluster.felix_default().unwrap().program_cluster_routes.as_deref(), Some("Enabled"));
    assert_eq!(programmed(&s.cluster, &felix("n")), vec![PoolClass::Ipip, PoolClass::NoEncap]);

    // BGPConfiguration default → Enabled: BIRD's side too.
    watches["bgpconfigurations"].unbounded_send(event("MODIFIED", &bgp_config("12", "Enabled"))).unwrap();
    let s = ds.snapshot().await;
    assert_eq!(programmed(&s.cluster, &bird), vec![PoolClass::Ipip, PoolClass::NoEncap]);

    // Same content, new resourceVersion (e.g. a status-only update): nothing sent.
    watches["bgpconfigurations"].unbounded_send(event("MODIFIED", &bgp_config("13", "Enabled"))).unwrap();
    ds.quiet(150).await;
}

fn cluster_info(group: CalicoGroup, rv: &str, version: &str) -> Json {
    object(group, "clusterinformations", "default", rv, &json!({"calicoVersion": version, "clusterType": "k8s,bgp,kdd", "datastoreReady": true}))
}

/// `--calico-version auto` follows `ClusterInformation default` live, in both groups: a
/// cluster on 3.30 (no fields: BIRD has IPIP and no-encap) upgraded to 3.33 hands IPIP to
/// Felix's side; without the object 3.33 is assumed and said so.
#[tokio::test]
async fn calico_upgrade_in_cluster_information_changes_the_decision_live() {
    for group in [CalicoGroup::CrdV1, CalicoGroup::V3] {
        let api = StdArc::new(FakeApi::default());
        script_discovery(&api, group);
        let mut objects = Objects::new();
        objects.insert("ippools", vec![object(group, "ippools", "ipip", "1", &json!({"cidr": "10.244.0.0/16", "ipipMode": "Always"}))]);
        objects.insert("felixconfigurations", vec![object(group, "felixconfigurations", "default", "3", &json!({"programClusterRoutes": "EnabledIPIPOnly"}))]);
        objects.insert("clusterinformations", vec![cluster_info(group, "5", "v3.30.2")]);
        let watches = script_lists(&api, group, &objects, "10");
        let mut ds = Running::start(&api, ApiGroupChoice::Auto);
        let s = ds.snapshot().await;
        assert_eq!(ds.next().await, DatastoreEvent::Synced);
        let auto = OwnershipConfig { role: Role::Felix, version: VersionChoice::Auto, node: Some("n".into()) };
        let bird = OwnershipConfig { role: Role::Bird, ..auto.clone() };
        let d = decide(&s.cluster, &auto);
        assert_eq!(d.version.to_string(), "3.30 (ClusterInformation default: v3.30.2)", "{group}");
        assert_eq!(programmed(&s.cluster, &auto), vec![], "{group}");
        assert_eq!(programmed(&s.cluster, &bird), vec![PoolClass::Ipip, PoolClass::NoEncap], "{group}");
        assert_eq!(
            d.findings.iter().filter(|f| f.code() == "ignored-by-release").map(|f| f.message.as_str()).collect::<Vec<_>>(),
            vec!["FelixConfiguration default: \"EnabledIPIPOnly\" is set but ignored by this release: Felix 3.30 does not read it, and Felix programs only VXLAN cluster routes"],
            "{group}"
        );

        watches["clusterinformations"].unbounded_send(event("MODIFIED", &cluster_info(group, "11", "v3.33.1"))).unwrap();
        let s = ds.snapshot().await;
        assert_eq!(decide(&s.cluster, &auto).version.to_string(), "3.33 (ClusterInformation default: v3.33.1)", "{group}");
        assert_eq!(programmed(&s.cluster, &auto), vec![PoolClass::Ipip], "{group}");
        assert_eq!(programmed(&s.cluster, &bird), vec![PoolClass::NoEncap], "{group}");

        watches["clusterinformations"].unbounded_send(event("DELETED", &cluster_info(group, "12", "v3.33.1"))).unwrap();
        let s = ds.snapshot().await;
        assert_eq!(decide(&s.cluster, &auto).version.to_string(), "3.33 (assumed: no ClusterInformation default)", "{group}");
        drop(watches);
    }
}

#[tokio::test]
async fn node_heartbeats_change_nothing_and_annotations_do() {
    let group = CalicoGroup::CrdV1;
    let api = StdArc::new(FakeApi::default());
    script_discovery(&api, group);
    let addrs = json!([{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": "a"}]);
    let mut objects = Objects::new();
    objects.insert("nodes", vec![node("a", "5", &json!({"projectcalico.org/IPv4Address": "10.0.0.1/24"}), &addrs)]);
    let watches = script_lists(&api, group, &objects, "100");
    let mut ds = Running::start(&api, ApiGroupChoice::Auto);
    let s = ds.snapshot().await;
    assert_eq!(ds.next().await, DatastoreEvent::Synced);
    assert_eq!(s.cluster.nodes["a"].bgp_ipv4.unwrap().to_string(), "10.0.0.1/24");

    let mut beat = node("a", "6", &json!({"projectcalico.org/IPv4Address": "10.0.0.1/24", "other/annotation": "x"}), &addrs);
    beat["status"]["conditions"][0]["lastHeartbeatTime"] = json!("2026-01-01T00:05:00Z");
    watches["nodes"].unbounded_send(event("MODIFIED", &beat)).unwrap();
    ds.quiet(150).await;

    let moved = node("a", "7", &json!({"projectcalico.org/IPv4Address": "10.0.1.1/24"}), &addrs);
    watches["nodes"].unbounded_send(event("MODIFIED", &moved)).unwrap();
    let s = ds.snapshot().await;
    assert_eq!(s.cluster.nodes["a"].bgp_ipv4.unwrap().to_string(), "10.0.1.1/24");
}
