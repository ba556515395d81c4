//! Listing and watching a healthy cluster: the exact model and requests, paging, the one-shot
//! load, unparseable objects, an object that does not decode, and the debounce (live changes
//! are `live_changes.rs`).

use super::*;

// ---------------------------------------------------------------------------------------------
// The expected models, written out by hand from the YAML they come from (never parsed by the
// code under test): what a Kubernetes-datastore cluster serving those objects must give.

fn net(s: &str) -> ipnet::IpNet {
    s.parse().unwrap()
}

fn pool_v(name: &str, cidr: &str, ipip: EncapMode, vxlan: EncapMode, nat_outgoing: bool, block_size: u8, allowed_uses: Vec<AllowedUse>) -> (String, IpPool) {
    let pool = IpPool {
        name: name.into(),
        cidr: net(cidr),
        ipip_mode: ipip,
        vxlan_mode: vxlan,
        nat_outgoing,
        disabled: false,
        disable_bgp_export: false,
        block_size,
        allowed_uses,
        node_selector: "all()".to_owned(),
    };
    (name.to_owned(), pool)
}

/// An IPAM block affine to `host`; `attributes` are (handle_id, secondary) pairs, of which
/// the model keeps `secondary`.
fn block_v(name: &str, cidr: &str, host: &str, allocations: &[Option<usize>], attributes: &[(&str, &[(&str, &str)])]) -> (String, IpamBlock) {
    let attributes = attributes
        .iter()
        .map(|(_handle, secondary)| AllocationAttributes { secondary: secondary.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect() })
        .collect();
    let block = IpamBlock {
        name: name.into(),
        cidr: net(cidr),
        affinity: Some(Affinity::Host(host.to_owned())),
        allocations: IpamBlock::dense_allocations(allocations),
        attributes,
        deleted: false,
    };
    (name.to_owned(), block)
}

/// A confirmed host BlockAffinity named `<node>-<block name>`.
fn affinity_v(node: &str, block: &str, cidr: &str) -> (String, BlockAffinity) {
    let name = format!("{node}-{block}");
    let affinity = BlockAffinity {
        name: name.as_str().into(),
        node: node.to_owned(),
        cidr: net(cidr),
        state: AffinityState::Confirmed,
        affinity_type: "host".to_owned(),
        deleted: false,
    };
    (name, affinity)
}

/// A core Node as the fake API server serves it: the Calico annotations and the InternalIPs of
/// `status.addresses` (bare addresses, no subnet).
fn node_v(name: &str, v4: &str, v6: Option<&str>, ipip_tunnel: Option<&str>, internal_ips: &[&str]) -> (String, Node) {
    let node = Node {
        name: name.into(),
        form: NodeForm::Kubernetes,
        bgp_ipv4: Some(net(v4)),
        bgp_ipv4_has_prefix: v4.contains('/'),
        bgp_ipv6: v6.map(net),
        bgp_ipv6_has_prefix: v6.is_some_and(|a| a.contains('/')),
        as_number: None,
        ipv4_ipip_tunnel_addr: ipip_tunnel.map(|a| a.parse().unwrap()),
        ipv4_vxlan_tunnel_addr: None,
        ipv6_vxlan_tunnel_addr: None,
        wireguard_ipv4: None,
        wireguard_ipv6: None,
        addresses: internal_ips.iter().map(|a| NodeAddress { address: a.parse().unwrap(), network: None, kind: NodeAddressType::InternalIP }).collect(),
    };
    (name.to_owned(), node)
}

fn bgp_v(program_cluster_routes: &str) -> (String, BgpConfiguration) {
    let bgp = BgpConfiguration {
        name: "default".to_owned(),
        program_cluster_routes: Some(program_cluster_routes.to_owned()),
        ipv4_normal_route_priority: None,
        ipv6_normal_route_priority: None,
    };
    ("default".to_owned(), bgp)
}

/// `examples/cluster/` (calico.yaml, ipam.yaml, nodes.yaml) as the model of a cluster serving
/// it: every Calico Node became a core Node (annotations + InternalIP), so all are
/// [`NodeForm::Kubernetes`]; pools take Calico's defaults (block size 26 / 122, `all()`).
fn examples_model() -> Cluster {
    use EncapMode::{Always, CrossSubnet, Never};
    let tunnel = |node: &str| -> (String, &'static [(&'static str, &'static str)]) {
        let secondary: &'static [(&str, &str)] = match node {
            "node-a" => &[("node", "node-a"), ("type", "ipipTunnelAddress")],
            "node-b" => &[("node", "node-b"), ("type", "ipipTunnelAddress")],
            _ => &[("node", "node-d"), ("type", "ipipTunnelAddress")],
        };
        (format!("ipip-tunnel-addr-{node}"), secondary)
    };
    let (ta, tb, td) = (tunnel("node-a"), tunnel("node-b"), tunnel("node-d"));
    let web0: &[(&str, &str)] = &[("node", "node-a")];
    // 10.244.20.5 (ordinal 5 of node-b's block) is borrowed by node-c's pod api-7c8d.
    let api: &[(&str, &str)] = &[("node", "node-c")];
    let blocks = [
        block_v("10-244-10-0-26", "10.244.10.0/26", "node-a", &[Some(0), Some(1)], &[(&ta.0, ta.1), ("k8s-pod-network.1f0c", web0)]),
        block_v("10-244-20-0-26", "10.244.20.0/26", "node-b", &[Some(0), None, None, None, None, Some(1)], &[(&tb.0, tb.1), ("k8s-pod-network.a17b", api)]),
        block_v("10-244-30-0-26", "10.244.30.0/26", "node-c", &[], &[]),
        block_v("10-244-40-0-26", "10.244.40.0/26", "node-d", &[Some(0)], &[(&td.0, td.1)]),
        block_v("10-245-20-0-26", "10.245.20.0/26", "node-b", &[], &[]),
        block_v("10-245-40-0-26", "10.245.40.0/26", "node-d", &[], &[]),
        block_v("10-246-10-0-26", "10.246.10.0/26", "node-a", &[], &[]),
        block_v("10-246-30-0-26", "10.246.30.0/26", "node-c", &[], &[]),
        block_v("10-247-20-0-26", "10.247.20.0/26", "node-b", &[], &[]),
        block_v("fd00-10-244-0-10---122", "fd00:10:244:0:10::/122", "node-a", &[], &[]),
        block_v("fd00-10-244-0-20---122", "fd00:10:244:0:20::/122", "node-b", &[], &[]),
    ];
    let block_affinities =
        blocks.iter().map(|(name, b)| affinity_v(b.host().unwrap(), name, &b.cidr.to_string())).map(|(k, v)| (k.into(), Arc::new(v))).collect();
    let felix = FelixConfiguration {
        name: "default".to_owned(),
        scope: FelixScope::Global,
        program_cluster_routes: Some("EnabledIPIPOnly".to_owned()),
        device_route_protocol: None,
        route_refresh_interval: Some(std::time::Duration::from_secs(90)),
        ipv4_normal_route_priority: None,
        ipv6_normal_route_priority: None,
        remove_external_routes: Some(true),
    };
    Cluster {
        ip_pools: [
            pool_v("default-ipv4-ippool", "10.244.0.0/16", CrossSubnet, Never, true, 26, vec![]),
            pool_v("ipip-always", "10.245.0.0/16", Always, Never, true, 26, vec![]),
            pool_v("flat", "10.246.0.0/16", Never, Never, false, 26, vec![]),
            pool_v("vxlan", "10.247.0.0/16", Never, Always, false, 26, vec![]),
            pool_v("flat-ipv6", "fd00:10:244::/48", Never, Never, false, 122, vec![]),
            pool_v("loadbalancers", "10.96.100.0/24", Never, Never, false, 26, vec![AllowedUse::LoadBalancer]),
        ]
        .into_iter()
        .collect(),
        ipam_blocks: blocks.into_iter().map(|(k, v)| (k.into(), Arc::new(v))).collect(),
        block_affinities,
        nodes: [
            node_v("node-a", "10.0.0.11/24", Some("fd00:10::11/64"), Some("10.244.10.0"), &["10.0.0.11"]),
            node_v("node-b", "10.0.0.12/24", Some("fd00:10::12/64"), Some("10.244.20.0"), &["10.0.0.12"]),
            node_v("node-c", "10.0.0.13/24", Some("fd00:10::13/64"), None, &["10.0.0.13"]),
            node_v("node-d", "10.0.1.14/24", None, Some("10.244.40.0"), &["10.0.1.14"]),
        ]
        .into_iter()
        .map(|(k, v)| (k.into(), Arc::new(v)))
        .collect(),
        felix_configurations: [("default".to_owned(), felix)].into_iter().collect(),
        bgp_configurations: [bgp_v("EnabledNoEncapOnly")].into_iter().collect(),
        cluster_informations: [(
            "default".to_owned(),
            ClusterInformation { name: "default".to_owned(), calico_version: Some("v3.33.0".to_owned()), variant: None },
        )]
        .into_iter()
        .collect(),
        ..Cluster::default()
    }
}

/// confd's `cluster_routes/enabled/input.yaml` as the model of a v3 cluster serving it: three
/// Calico Nodes as core Nodes with only their BGP annotations (the input has no
/// `spec.addresses`), five pools, BGPConfiguration `Enabled`, no FelixConfiguration.
fn confd_enabled_model() -> Cluster {
    use EncapMode::{Always, CrossSubnet, Never};
    let node = |name: &str, v4: &str, v6: &str| node_v(name, v4, Some(v6), None, &[]);
    Cluster {
        ip_pools: [
            pool_v("ippoolv4-1", "192.168.0.0/16", Always, Never, true, 26, vec![]),
            pool_v("ippoolv4-2", "172.16.0.0/16", CrossSubnet, Never, true, 26, vec![]),
            pool_v("ippoolv4-3", "172.17.0.0/16", Never, Never, false, 26, vec![]),
            pool_v("ippoolv6-1", "2002::/64", Never, Never, true, 122, vec![]),
            pool_v("ippoolv6-2", "2010::/64", Never, Never, false, 122, vec![]),
        ]
        .into_iter()
        .collect(),
        nodes: [
            node("kube-master", "10.192.0.2/16", "2001::103/64"),
            node("kube-node-1", "10.192.0.3/16", "2001::102/64"),
            node("kube-node-2", "10.192.0.4/16", "2001::104/64"),
        ]
        .into_iter()
        .map(|(k, v)| (k.into(), Arc::new(v)))
        .collect(),
        bgp_configurations: [bgp_v("Enabled")].into_iter().collect(),
        ..Cluster::default()
    }
}

/// A component's decision read from its field (`FelixConfiguration default`, ...).
fn from_field(field_of: RouteWriter, object: &str, value: ClusterRoutes) -> ComponentDecision {
    ComponentDecision { field_of, value, source: DecisionSource::Field { object: object.to_owned(), value: value.as_str().to_owned() } }
}

/// Writers per class: IPIP, no-encap, VXLAN.
fn writers(ipip: &[RouteWriter], noencap: &[RouteWriter], vxlan: &[RouteWriter]) -> BTreeMap<PoolClass, BTreeSet<RouteWriter>> {
    [(PoolClass::Ipip, ipip), (PoolClass::NoEncap, noencap), (PoolClass::Vxlan, vxlan)].into_iter().map(|(c, w)| (c, w.iter().copied().collect())).collect()
}

#[tokio::test]
async fn v1_cluster_not_synced_until_every_resource_listed_then_exact_requests() {
    let group = CalicoGroup::CrdV1;
    let objects = cluster_objects(&examples_cluster(), group);
    let api = StdArc::new(FakeApi::default());
    script_discovery(&api, group);
    // Everything but the Nodes answers at once; the Node list is held back.
    let mut watches = BTreeMap::new();
    for plural in CALICO_PLURALS {
        api.json(&format!("GET {}", path(group, plural)), list(group, plural, "100", objects.get(plural).map_or(&[][..], Vec::as_slice)));
        watches.insert(plural, api.watch(&path(group, plural)));
    }
    let nodes_list = api.deferred("GET /api/v1/nodes");
    let _node_watch = api.watch("/api/v1/nodes");
    api.json(&format!("GET {KUBE_SYSTEM_DS}"), daemonset_list("100", &[]));
    let _ds_watch = api.watch(KUBE_SYSTEM_DS);
    let mut ds = Running::start(&api, ApiGroupChoice::Auto);

    // Five of six listed: nothing is sent (no snapshot, not synced).
    ds.quiet(300).await;
    nodes_list.send(Reply::Json(StatusCode::OK, list(group, "nodes", "100", &objects["nodes"]))).ok().unwrap();
    let snap = ds.snapshot().await;
    assert_eq!(ds.next().await, DatastoreEvent::Synced);

    // The exact model, written out by hand from examples/cluster/.
    assert_eq!(*snap.cluster, examples_model());
    assert!(snap.object_errors.is_empty() && snap.load_errors.is_empty());
    assert_eq!(snap.cluster.ip_pools.len(), 6);
    assert_eq!(snap.cluster.ipam_blocks.len(), objects["ipamblocks"].len());
    assert_eq!(snap.cluster.nodes.keys().map(|k| &**k).collect::<Vec<_>>(), vec!["node-a", "node-b", "node-c", "node-d"]);
    assert_eq!(snap.cluster.nodes["node-b"].bgp_ipv4.unwrap().to_string(), "10.0.0.12/24");
    assert_eq!(snap.inputs, objects.values().map(Vec::len).sum::<usize>());
    // The examples' pair, read from both fields: Felix (routewarden in role felix) IPIP, BIRD
    // no-encap, VXLAN always Felix's.
    let d = decide(&snap.cluster, &felix("node-a"));
    assert_eq!(d.felix, from_field(RouteWriter::Felix, "FelixConfiguration default", ClusterRoutes::EnabledIpipOnly));
    assert_eq!(d.bird, from_field(RouteWriter::Bird, "BGPConfiguration default", ClusterRoutes::EnabledNoEncapOnly));
    assert_eq!(d.programmed.into_iter().collect::<Vec<_>>(), [PoolClass::Ipip]);
    assert_eq!(d.writers, writers(&[RouteWriter::Routewarden], &[RouteWriter::Bird], &[RouteWriter::Felix]));

    // Exact requests: discovery in order, then per resource one list and one watch from the
    // list's resourceVersion with bookmarks.
    let log = api.log();
    assert_eq!(log[..3], ["GET /apis".to_owned(), "GET /apis/crd.projectcalico.org/v1".to_owned(), "GET /apis/operator.tigera.io/v1".to_owned()]);
    let per = per_resource(&log[3..]);
    let mut want = BTreeMap::new();
    for plural in CALICO_PLURALS.iter().copied().chain(["nodes"]) {
        want.insert(path(group, plural), vec![list_url(group, plural), watch_url(group, plural, "100")]);
    }
    // No operator: only kube-system's calico-node, by name (what the Role's resourceNames allows).
    want.insert(
        KUBE_SYSTEM_DS.to_owned(),
        vec![
            format!("GET {KUBE_SYSTEM_DS}?&fieldSelector=metadata.name%3Dcalico-node&resourceVersion=0&resourceVersionMatch=NotOlderThan"),
            format!(
                "GET {KUBE_SYSTEM_DS}?&watch=true&timeoutSeconds=290&fieldSelector=metadata.name%3Dcalico-node&allowWatchBookmarks=true&resourceVersion=100"
            ),
        ],
    );
    assert_eq!(per, want);
    drop(watches);
}

#[tokio::test]
async fn v3_cluster_loads_and_bgp_decision_matches_the_calicoctl_input() {
    let group = CalicoGroup::V3;
    // `../shared` beside the repository, as the other oracle tests find it (not a path of
    // one machine).
    let input = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/calico-testdata/confd/cluster_routes/enabled/input.yaml"))
        .expect("confd test input in ../shared/calico-testdata beside the repository");
    let objects = cluster_objects(&input, group);
    let api = StdArc::new(FakeApi::default());
    api.json("GET /apis", api_groups(&[CalicoGroup::V3]));
    api.json("GET /apis/projectcalico.org/v3", api_resources(group, &CALICO_PLURALS));
    let _w = script_lists(&api, group, &objects, "7");
    let mut ds = Running::start(&api, ApiGroupChoice::Auto);
    let snap = ds.snapshot().await;
    assert_eq!(ds.next().await, DatastoreEvent::Synced);

    // The exact model, written out by hand from confd's input.yaml.
    assert_eq!(*snap.cluster, confd_enabled_model());
    assert_eq!(snap.cluster.ip_pools.len(), 5);
    assert_eq!(snap.cluster.bgp_default().and_then(|b| b.program_cluster_routes.as_deref()), Some("Enabled"));
    assert_eq!(snap.cluster.nodes["kube-node-1"].bgp_ipv4.unwrap().to_string(), "10.192.0.3/16");
    // programClusterRoutes: Enabled gives BIRD (routewarden in role bird) IPIP and no-encap;
    // with no FelixConfiguration, Felix keeps its 3.33 default EnabledIPIPOnly, so IPIP has two
    // writers.
    let bird = OwnershipConfig { role: Role::Bird, ..felix("kube-node-1") };
    let d = decide(&snap.cluster, &bird);
    assert_eq!(d.bird, from_field(RouteWriter::Bird, "BGPConfiguration default", ClusterRoutes::Enabled));
    assert_eq!(
        d.felix,
        ComponentDecision {
            field_of: RouteWriter::Felix,
            value: ClusterRoutes::EnabledIpipOnly,
            source: DecisionSource::Default { reason: "no FelixConfiguration default or node.kube-node-1".to_owned() },
        }
    );
    assert_eq!(d.programmed.into_iter().collect::<Vec<_>>(), [PoolClass::Ipip, PoolClass::NoEncap]);
    assert_eq!(d.writers, writers(&[RouteWriter::Felix, RouteWriter::Routewarden], &[RouteWriter::Routewarden], &[RouteWriter::Felix]));
    // v3 URLs.
    assert!(api.log().contains(&list_url(group, "ipamblocks")));
    assert!(api.log().contains(&watch_url(group, "bgpconfigurations", "7")));
}

fn cidr_of(s: &Snapshot, pool: &str) -> Option<String> {
    s.cluster.ip_pools.get(pool).map(|p| p.cidr.to_string())
}

#[tokio::test]
async fn unparseable_object_is_skipped_and_its_last_good_version_kept() {
    let group = CalicoGroup::CrdV1;
    let api = StdArc::new(FakeApi::default());
    script_discovery(&api, group);
    let mut objects = Objects::new();
    // A bad object among good ones in the initial list: skipped, the others load, synced.
    objects.insert("ippools", vec![pool("pool-a", "1", "10.244.0.0/16"), pool("pool-x", "2", "banana"), pool("pool-b", "3", "10.245.0.0/16")]);
    let watches = script_lists(&api, group, &objects, "10");
    let mut ds = Running::start(&api, ApiGroupChoice::Auto);
    let s = ds.snapshot().await;
    assert_eq!(ds.next().await, DatastoreEvent::Synced);
    assert_eq!(s.cluster.ip_pools.keys().collect::<Vec<_>>(), vec!["pool-a", "pool-b"]);
    assert_eq!(
        s.object_errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        vec!["ippools.crd.projectcalico.org/pool-x: IPPool \"pool-x\": spec.cidr: invalid CIDR \"banana\""]
    );

    let w = &watches["ippools"];
    // A good object turns bad: its last good version stays.
    w.unbounded_send(event("MODIFIED", &pool("pool-a", "11", "10.0.0/8"))).unwrap();
    let s = ds.snapshot().await;
    assert_eq!(cidr_of(&s, "pool-a").as_deref(), Some("10.244.0.0/16"));
    assert_eq!(cidr_of(&s, "pool-b").as_deref(), Some("10.245.0.0/16"));
    assert_eq!(
        s.object_errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        vec![
            "ippools.crd.projectcalico.org/pool-a: IPPool \"pool-a\": spec.cidr: invalid CIDR \"10.0.0/8\" (its last good version is kept)",
            "ippools.crd.projectcalico.org/pool-x: IPPool \"pool-x\": spec.cidr: invalid CIDR \"banana\"",
        ]
    );
    // The one with a last good version freezes nothing; the other names no CIDR either.
    assert_eq!(s.object_errors.iter().map(|e| (e.last_good, e.cidrs.len())).collect::<Vec<_>>(), vec![(true, 0), (false, 0)]);
    // A never-good object freezes the CIDRs it mentions (its spec's, and the block name's).
    w.unbounded_send(event("ADDED", &object(group, "ippools", "pool-y", "111", &json!({"cidr": "10.252.0.0/16", "ipipMode": "Sometimes"})))).unwrap();
    let s = ds.snapshot().await;
    let y = s.object_errors.iter().find(|e| e.file.ends_with("pool-y")).expect("pool-y rejected");
    assert_eq!((y.last_good, y.cidrs.iter().map(ToString::to_string).collect::<Vec<_>>()), (false, vec!["10.252.0.0/16".to_string()]));
    w.unbounded_send(event("DELETED", &object(group, "ippools", "pool-y", "112", &json!({"cidr": "10.252.0.0/16", "ipipMode": "Sometimes"})))).unwrap();
    let s = ds.snapshot().await;
    assert!(s.object_errors.iter().all(|e| !e.file.ends_with("pool-y")));
    // Fixed: the new version replaces the last good one; deleting the bad one clears its error.
    w.unbounded_send(event("MODIFIED", &pool("pool-a", "12", "10.250.0.0/16"))).unwrap();
    w.unbounded_send(event("DELETED", &pool("pool-x", "13", "banana"))).unwrap();
    let s = ds.snapshot().await;
    assert_eq!(cidr_of(&s, "pool-a").as_deref(), Some("10.250.0.0/16"));
    assert!(s.object_errors.is_empty());
    // Added, then deleted: gone.
    w.unbounded_send(event("ADDED", &pool("pool-c", "14", "10.251.0.0/16"))).unwrap();
    let s = ds.snapshot().await;
    assert_eq!(cidr_of(&s, "pool-c").as_deref(), Some("10.251.0.0/16"));
    w.unbounded_send(event("DELETED", &pool("pool-c", "15", "10.251.0.0/16"))).unwrap();
    let s = ds.snapshot().await;
    assert_eq!(s.cluster.ip_pools.keys().collect::<Vec<_>>(), vec!["pool-a", "pool-b"]);
    // Never unsynced by bad objects.
    ds.quiet(100).await;
}

#[tokio::test]
async fn initial_list_in_pages_is_one_snapshot() {
    let group = CalicoGroup::CrdV1;
    let api = StdArc::new(FakeApi::default());
    script_discovery(&api, group);
    let blocks: Vec<Json> =
        (0..1200u32).map(|i| block(&format!("10-{}-{}-0-26", 100 + i / 256, i % 256), "1", &format!("10.{}.{}.0/26", 100 + i / 256, i % 256), "n")).collect();
    let mut objects = Objects::new();
    objects.insert("ippools", vec![pool("p", "1", "10.0.0.0/8")]);
    let _w = script_lists(&api, group, &objects, "100");
    // Replace the block list with three pages.
    let bpath = path(group, "ipamblocks");
    api.replies_clear(&format!("GET {bpath}"));
    for (i, chunk) in blocks.chunks(500).enumerate() {
        let mut page = list(group, "ipamblocks", "100", chunk);
        if i < 2 {
            page["metadata"]["continue"] = json!(format!("page{}", i + 1));
        }
        api.json(&format!("GET {bpath}"), page);
    }
    let mut ds = Running::start(&api, ApiGroupChoice::Auto);
    let s = ds.snapshot().await;
    assert_eq!(ds.next().await, DatastoreEvent::Synced);
    assert_eq!(s.cluster.ipam_blocks.len(), 1200);
    ds.quiet(200).await;
    let per = per_resource(&api.log());
    assert_eq!(
        per[&bpath],
        vec![
            list_url(group, "ipamblocks"),
            format!("GET {bpath}?&continue=page1"),
            format!("GET {bpath}?&continue=page2"),
            watch_url(group, "ipamblocks", "100"),
        ]
    );
}

#[tokio::test]
async fn one_shot_load_lists_everything_and_watches_nothing() {
    let group = CalicoGroup::CrdV1;
    let objects = cluster_objects(&examples_cluster(), group);
    let api = StdArc::new(FakeApi::default());
    script_discovery(&api, group);
    for plural in CALICO_PLURALS.iter().copied().chain(["nodes"]) {
        api.json(&format!("GET {}", path(group, plural)), list(group, plural, "100", objects.get(plural).map_or(&[][..], Vec::as_slice)));
    }
    api.json(&format!("GET {KUBE_SYSTEM_DS}"), daemonset_list("100", &[]));
    let ds = KubernetesDatastore::new(api.client(), ApiGroupChoice::Auto);
    let snap = ds.load().await.unwrap();
    assert_eq!(*snap.cluster, examples_model());
    let log = api.log();
    // Discovery (2 + the operator's group), 7 lists, the kube-system calico-node list.
    assert_eq!(log.len(), 3 + 7 + 1, "{log:?}");
    assert!(log.iter().all(|l| !l.contains("watch=true")), "{log:?}");

    // A list that fails fails the load, naming the resource.
    let api = StdArc::new(FakeApi::default());
    script_discovery(&api, group);
    api.on("GET /apis/crd.projectcalico.org/v1/ippools", Reply::Json(StatusCode::FORBIDDEN, status(403, "Forbidden", "ippools is forbidden")));
    let err = KubernetesDatastore::new(api.client(), ApiGroupChoice::Auto).load().await.unwrap_err();
    assert_eq!(err.to_string(), "list ippools.crd.projectcalico.org: list failed: ippools is forbidden (403 Forbidden)");
    // Printed as the CLI prints it (the whole chain): each cause once, one short line.
    let line = format!("{:#}", anyhow::Error::from(err));
    assert_eq!(line.matches("ippools is forbidden").count(), 1, "{line}");
    assert!(line.len() < 200, "{} characters: {line}", line.len());
}

/// A list's objects are decoded one at a time as they are handed out (`ListPage`), not all
/// before the first: an object that does not decode (a `metadata.name` that is not a string)
/// fails that list as `Api::list` failed it, after its earlier objects were read. Nothing of
/// the failed list reaches the view: every snapshot keeps both blocks until a good re-list,
/// and only that one applies the deletion.
#[tokio::test]
async fn an_object_that_does_not_decode_fails_its_list_and_loses_nothing() {
    let group = CalicoGroup::CrdV1;
    let (api, watches, blocks) = two_blocks_scripted(group);
    let mut broken = block("10-244-3-0-26", "4", "10.244.3.0/26", "c");
    broken["metadata"]["name"] = json!(5);
    api.json(&format!("GET {blocks}"), list(group, "ipamblocks", "200", &[block("10-244-1-0-26", "2", "10.244.1.0/26", "a"), broken]));
    api.json(&format!("GET {blocks}"), list(group, "ipamblocks", "201", &[block("10-244-1-0-26", "2", "10.244.1.0/26", "a")]));
    let _relisted_watch = api.watch(&blocks);
    let mut ds = Running::start(&api, ApiGroupChoice::Auto);
    assert_eq!(ds.snapshot().await.cluster.ipam_blocks.len(), 2);
    assert_eq!(ds.next().await, DatastoreEvent::Synced);
    api.take_log();

    watches["ipamblocks"].unbounded_send(event("ERROR", &status(410, "Expired", "too old resource version: 100 (190)"))).unwrap();
    let DatastoreEvent::Unsynced { .. } = ds.next().await else { panic!("expected Unsynced") };
    let events = ds.until_synced().await;
    let reasons: Vec<&str> = events.iter().filter_map(|e| if let DatastoreEvent::Unsynced { reason } = e { Some(reason.as_str()) } else { None }).collect();
    assert_eq!(
        reasons,
        vec!["ipamblocks.crd.projectcalico.org: list failed: Error deserializing response: items[1]: invalid type: integer `5`, expected a string at line 1 column 331"]
    );
    assert_deletion_only_after_the_relist(&events);
    // The broken list, then a good one and a watch from its version.
    assert_eq!(api.take_log(), vec![list_url(group, "ipamblocks"), list_url(group, "ipamblocks"), watch_url(group, "ipamblocks", "201")]);
}

/// The debounce: a change that finds the datastore quiet is sent after
/// [`QUIET_COALESCE`], not a whole window later; a change right after a snapshot waits for
/// the window to end (one snapshot per window under churn); changes sent together are one
/// snapshot. Virtual time from the first sync on.
#[tokio::test]
async fn a_change_after_quiet_goes_at_once_and_churn_gets_one_snapshot_a_window() {
    use crate::datastore::kubernetes::QUIET_COALESCE;
    let group = CalicoGroup::CrdV1;
    let (api, watches, _) = two_blocks_scripted(group);
    let window = Duration::from_millis(100);
    let (tx, mut rx) = mpsc::channel(64);
    let ds = KubernetesDatastore::new(api.client(), ApiGroupChoice::Auto).with_debounce(window).with_list_settle(Duration::ZERO);
    let task = ds.spawn(tx);
    let mut next = async || tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.expect("an event").expect("running");
    while next().await != DatastoreEvent::Synced {}
    tokio::time::pause();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let blocks_of = |e: DatastoreEvent| match e {
        DatastoreEvent::Snapshot(s) => s.cluster.ipam_blocks.keys().map(ToString::to_string).collect::<Vec<_>>(),
        other => panic!("expected a snapshot, got {other:?}"),
    };

    // Quiet for a second: the new block is sent after QUIET_COALESCE.
    let sent = tokio::time::Instant::now();
    watches["ipamblocks"].unbounded_send(event("ADDED", &block("10-244-3-0-26", "4", "10.244.3.0/26", "c"))).unwrap();
    assert_eq!(blocks_of(next().await), ["10-244-1-0-26", "10-244-2-0-26", "10-244-3-0-26"]);
    // tokio's timer ticks in whole milliseconds, and rounds a deadline up to the next one.
    let tick = Duration::from_millis(1);
    let first = sent.elapsed();
    assert!(first >= QUIET_COALESCE && first <= QUIET_COALESCE + tick, "a change after a quiet window sent after {first:?}");

    // Right after that snapshot: the next change waits for the window to end, and the two
    // changes sent with it meanwhile are in the same snapshot.
    let sent = tokio::time::Instant::now();
    watches["ipamblocks"].unbounded_send(event("ADDED", &block("10-244-4-0-26", "5", "10.244.4.0/26", "d"))).unwrap();
    tokio::time::sleep(Duration::from_millis(40)).await;
    watches["ipamblocks"].unbounded_send(event("DELETED", &block("10-244-1-0-26", "6", "10.244.1.0/26", "a"))).unwrap();
    watches["ipamblocks"].unbounded_send(event("ADDED", &block("10-244-5-0-26", "7", "10.244.5.0/26", "e"))).unwrap();
    assert_eq!(blocks_of(next().await), ["10-244-2-0-26", "10-244-3-0-26", "10-244-4-0-26", "10-244-5-0-26"]);
    let second = sent.elapsed();
    assert!(second >= window && second <= window + tick, "the window runs from the last flush: sent after {second:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(rx.try_recv().is_err(), "one snapshot for the three changes");
    task.abort();
}
