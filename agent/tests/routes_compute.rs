//! Desired-route computation: exact routes for a scenario cluster, and properties over random
//! clusters (never a route to an own block, exactly one route per remote block, every borrowed
//! IP covered by a /32 to its real node, output independent of input order).

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use proptest::prelude::*;
use routewarden::model::{Cluster, Kind, ModelError, ParsedObject, ParsedObjects, SharedMap, YamlLimits};
use routewarden::routes::{classed_routes, desired_routes, routable_classes, ClusterRoute, RouteDevices, RouteOrigin, RouteProblem};
use routewarden::vocabulary::{PoolClass, RoutePath};

/// node-a/b/c on 10.0.0.0/24, node-d on 10.0.1.0/24; one pool per class.
const SCENARIO: &str = r#"
apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: ipip-cross}
spec: {cidr: 10.244.0.0/16, ipipMode: CrossSubnet}
---
apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: ipip-always}
spec: {cidr: 10.245.0.0/16, ipipMode: Always}
---
apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: flat}
spec: {cidr: 10.246.0.0/16}
---
apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: flat-v6}
spec: {cidr: 'fd00:10:244::/48'}
---
apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: vx}
spec: {cidr: 10.247.0.0/16, vxlanMode: Always}
---
apiVersion: projectcalico.org/v3
kind: NodeList
items:
  - metadata: {name: node-a}
    spec: {bgp: {ipv4Address: 10.0.0.11/24, ipv6Address: 'fd00:10::11/64'}}
  - metadata: {name: node-b}
    spec: {bgp: {ipv4Address: 10.0.0.12/24, ipv6Address: 'fd00:10::12/64'}}
  - metadata: {name: node-d}
    spec: {bgp: {ipv4Address: 10.0.1.14/24}}
---
apiVersion: v1
kind: Node
metadata: {name: node-c}
status:
  addresses: [{type: InternalIP, address: 10.0.0.13}]
---
apiVersion: crd.projectcalico.org/v1
kind: IPAMBlockList
items:
  - metadata: {name: 10-244-10-0-26}
    spec: {cidr: 10.244.10.0/26, affinity: "host:node-a", allocations: [0, null, 1], attributes: [{secondary: {node: node-a}}, {secondary: {node: node-c}}]}
  - metadata: {name: 10-244-20-0-26}
    spec: {cidr: 10.244.20.0/26, affinity: "host:node-b", allocations: [0, 1, 2], attributes: [{secondary: {node: node-b}}, {secondary: {node: node-a}}, {secondary: {node: node-d}}]}
  - metadata: {name: 10-244-30-0-26}
    spec: {cidr: 10.244.30.0/26, affinity: "host:node-c"}
  - metadata: {name: 10-244-40-0-26}
    spec: {cidr: 10.244.40.0/26, affinity: "host:node-d", allocations: [0], attributes: [{handle_id: legacy}]}
  - metadata: {name: 10-245-20-0-26}
    spec: {cidr: 10.245.20.0/26, affinity: "host:node-b"}
  - metadata: {name: 10-246-20-0-26}
    spec: {cidr: 10.246.20.0/26, affinity: "host:node-b"}
  - metadata: {name: 10-246-50-0-26}
    spec: {cidr: 10.246.50.0/26, allocations: [null, 0], attributes: [{secondary: {node: node-c}}]}
  - metadata: {name: 10-246-60-0-26}
    spec: {cidr: 10.246.60.0/26, allocations: [0], attributes: [{handle_id: orphan}]}
  - metadata: {name: 10-247-20-0-26}
    spec: {cidr: 10.247.20.0/26, affinity: "host:node-b"}
  - metadata: {name: 10-99-0-0-26}
    spec: {cidr: 10.99.0.0/26, affinity: "host:node-b"}
  - metadata: {name: 10-244-70-0-26}
    spec: {cidr: 10.244.70.0/26, affinity: "host:node-z"}
  - metadata: {name: 10-244-80-0-26}
    spec: {cidr: 10.244.80.0/26, affinity: "host:node-b", deleted: true}
  - metadata: {name: fd00-10-244-0-20---122}
    spec: {cidr: 'fd00:10:244:0:20::/122', affinity: "host:node-b"}
  - metadata: {name: fd00-10-244-0-40---122}
    spec: {cidr: 'fd00:10:244:0:40::/122', affinity: "host:node-d"}
  - metadata: {name: fd00-10-244-0-10---122}
    spec: {cidr: 'fd00:10:244:0:10::/122', affinity: "host:node-a"}
---
apiVersion: crd.projectcalico.org/v1
kind: BlockAffinity
metadata: {name: node-b-10-244-30-0-26}
spec: {cidr: 10.244.30.0/26, node: node-b, state: confirmed, deleted: "false"}
"#;

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// `ip route`-like one-liner for compact exact assertions.
fn line(r: &ClusterRoute) -> String {
    match r.path {
        RoutePath::Blackhole => format!("blackhole {} [{}]", r.dst, r.pool),
        _ => format!("{} via {} dev {} [{}]", r.dst, r.gateway.map(|g| g.to_string()).unwrap_or_default(), r.device.clone().unwrap_or_default(), r.pool),
    }
}

#[test]
fn scenario_routes_for_node_a_all_classes() {
    let (cluster, errors) = Cluster::from_yaml_str(SCENARIO).unwrap();
    assert_eq!(errors, vec![]);
    let d = desired_routes(&cluster, "node-a", &routable_classes(), &RouteDevices::default());
    let got: Vec<String> = d.routes.iter().map(line).collect();
    assert_eq!(
        got,
        vec![
            // CrossSubnet: node-b and node-c share node-a's subnet -> host NIC; node-d -> tunnel.
            "blackhole 10.244.10.0/26 [ipip-cross]".to_owned(),
            "10.244.10.2/32 via 10.0.0.13 dev eth0 [ipip-cross]".into(), // borrowed by node-c (InternalIP)
            "10.244.20.0/26 via 10.0.0.12 dev eth0 [ipip-cross]".into(),
            "10.244.20.2/32 via 10.0.1.14 dev tunl0 [ipip-cross]".into(), // borrowed by node-d
            "10.244.30.0/26 via 10.0.0.13 dev eth0 [ipip-cross]".into(),
            "10.244.40.0/26 via 10.0.1.14 dev tunl0 [ipip-cross]".into(),
            "10.245.20.0/26 via 10.0.0.12 dev tunl0 [ipip-always]".into(),
            "10.246.20.0/26 via 10.0.0.12 dev eth0 [flat]".into(),
            "10.246.50.1/32 via 10.0.0.13 dev eth0 [flat]".into(), // no affinity, owner recorded
            "blackhole fd00:10:244:0:10::/122 [flat-v6]".into(),
            "fd00:10:244:0:20::/122 via fd00:10::12 dev eth0 [flat-v6]".into(),
        ]
    );
    // 10.244.20.1 is borrowed by node-a itself: no cluster route for it.
    assert!(d.routes.iter().all(|r| r.dst != net("10.244.20.1/32")));
    let b20 = d.routes.iter().find(|r| r.dst == net("10.244.20.0/26")).unwrap();
    assert_eq!(b20.origin, RouteOrigin::RemoteBlock { block: "10-244-20-0-26".into(), node: "node-b".into() });
    assert_eq!(b20.class, PoolClass::Ipip);
    let codes: Vec<(&str, String)> = d.problems.iter().map(|p| (p.code(), p.to_string())).collect();
    assert_eq!(
        codes,
        vec![
            ("block-outside-pools", "IPAM block 10-99-0-0-26 (10.99.0.0/26) is in no IP pool; no route computed".to_owned()),
            ("block-deleted", "IPAM block 10-244-80-0-26 (10.244.80.0/26) is marked deleted; no route computed".to_owned()),
            ("block-without-owner", "IPAM block 10-246-60-0-26 (10.246.60.0/26) has no affinity and no allocation with a node; no route computed".to_owned()),
            ("allocation-without-node", "IP 10.244.40.0 of IPAM block 10-244-40-0-26 has no node in its allocation attributes; no route computed".to_owned()),
            ("unknown-node", "no route to 10.244.70.0/26: node \"node-z\" (from IPAM block 10-244-70-0-26) is not in the cluster".to_owned()),
            ("node-without-address", "no route to fd00:10:244:0:40::/122: node \"node-d\" has no IPv6 address (BGP address, InternalIP or ExternalIP)".to_owned()),
            ("affinity-conflict", "IPAM block 10-244-30-0-26 (10.244.30.0/26) is affine to \"node-c\" but BlockAffinity node-b-10-244-30-0-26 claims it for \"node-b\"; routing follows the IPAM block".to_owned()),
        ]
    );
}

/// The plan computes every routable class in one pass and selects the programmed classes
/// from it: for every node of the scenario and every set of classes, the selection
/// (routes and problems) is exactly what a pass for those classes alone computes.
#[test]
fn one_pass_for_all_classes_splits_into_the_per_class_passes() {
    let (cluster, _) = Cluster::from_yaml_str(SCENARIO).unwrap();
    let devices = RouteDevices::default();
    let (mut routes, mut problems) = (0, 0);
    for node in cluster.nodes.keys() {
        let all = classed_routes(&cluster, node, &routable_classes(), &devices);
        for classes in class_sets() {
            let alone = desired_routes(&cluster, node, &classes, &devices);
            assert_eq!(all.select(&classes), alone, "node {node}, classes {classes:?}");
            routes += alone.routes.len();
            problems += alone.problems.len();
        }
    }
    assert!(routes > 10 && problems > 10, "the scenario has routes and problems of both classes ({routes}, {problems} compared)");
}

/// Every set of routable classes, the empty one included.
fn class_sets() -> [BTreeSet<PoolClass>; 4] {
    [BTreeSet::new(), BTreeSet::from([PoolClass::Ipip]), BTreeSet::from([PoolClass::NoEncap]), routable_classes()]
}

#[test]
fn scenario_only_the_requested_classes() {
    let (cluster, _) = Cluster::from_yaml_str(SCENARIO).unwrap();
    let devices = RouteDevices { tunnel: "tunl0".into(), host_nic: "bond0".into() };
    let d = desired_routes(&cluster, "node-b", &BTreeSet::from([PoolClass::NoEncap, PoolClass::Vxlan]), &devices);
    let got: Vec<String> = d.routes.iter().map(line).collect();
    assert_eq!(
        got,
        vec![
            "blackhole 10.246.20.0/26 [flat]",
            "10.246.50.1/32 via 10.0.0.13 dev bond0 [flat]",
            "fd00:10:244:0:10::/122 via fd00:10::11 dev bond0 [flat-v6]",
            "blackhole fd00:10:244:0:20::/122 [flat-v6]",
        ]
    );
    // No VXLAN routes, ever; problems only for the requested classes plus data conflicts.
    assert!(d.routes.iter().all(|r| r.class != PoolClass::Vxlan));
    let codes: Vec<&str> = d.problems.iter().map(RouteProblem::code).collect();
    assert_eq!(codes, vec!["block-outside-pools", "block-without-owner", "node-without-address", "affinity-conflict"]);
}

#[test]
fn unknown_local_node_is_reported_and_cross_subnet_uses_the_tunnel() {
    let (cluster, _) = Cluster::from_yaml_str(SCENARIO).unwrap();
    let d = desired_routes(&cluster, "node-x", &BTreeSet::from([PoolClass::Ipip]), &RouteDevices::default());
    assert_eq!(d.problems[0], RouteProblem::LocalNodeUnknown { node: "node-x".into() });
    let b20 = d.routes.iter().find(|r| r.dst == net("10.244.20.0/26")).unwrap();
    assert_eq!((b20.path, b20.device.as_deref(), b20.gateway), (RoutePath::Tunnel, Some("tunl0"), Some(ip("10.0.0.12"))));
}

#[test]
fn block_without_any_owner_is_reported() {
    let text = "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: p}\nspec: {cidr: 10.244.0.0/16}\n---\napiVersion: projectcalico.org/v3\nkind: IPAMBlock\nmetadata: {name: 10-244-1-0-26}\nspec: {cidr: 10.244.1.0/26}\n";
    let (cluster, _) = Cluster::from_yaml_str(text).unwrap();
    let d = desired_routes(&cluster, "node-a", &routable_classes(), &RouteDevices::default());
    assert!(d.routes.is_empty());
    assert_eq!(
        d.problems,
        vec![
            RouteProblem::LocalNodeUnknown { node: "node-a".into() },
            RouteProblem::BlockWithoutOwner { block: "10-244-1-0-26".into(), cidr: net("10.244.1.0/26") }
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// Property tests

/// A random cluster: nodes (with or without an address, in one of two subnets), one pool of a
/// random mode, /28 blocks affine to a random node or none, with allocations owned by random
/// nodes (index == nodes.len() means "no node recorded").
#[derive(Clone, Debug)]
struct Spec {
    nodes: Vec<(bool, u8)>,
    mode: &'static str,
    blocks: Vec<(Option<usize>, Vec<Option<usize>>)>,
    local: usize,
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        prop::collection::vec((prop::bool::weighted(0.85), 0u8..2), 2..6),
        prop::sample::select(vec!["Always", "CrossSubnet", "Never"]),
        prop::collection::vec((prop::option::weighted(0.85, 0usize..8), prop::collection::vec(prop::option::of(0usize..8), 0..16)), 1..10),
        0usize..8,
    )
        .prop_map(|(nodes, mode, blocks, local)| {
            let n = nodes.len();
            let blocks = blocks.into_iter().map(|(h, allocs)| (h.map(|h| h % n), allocs.into_iter().map(|a| a.map(|a| a % (n + 1))).collect())).collect();
            Spec { local: local % n, nodes, mode, blocks }
        })
}

fn node_name(i: usize) -> String {
    format!("node-{i}")
}

fn node_ip(i: usize, subnet: u8) -> String {
    format!("10.0.{subnet}.{}", 10 + i)
}

fn block_cidr(i: usize) -> IpNet {
    format!("10.244.{}.{}/28", i / 16, (i % 16) * 16).parse().unwrap()
}

/// The spec as YAML documents (one per object).
fn docs(s: &Spec) -> Vec<String> {
    let mut out = vec![format!(
        "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {{name: pool}}\nspec: {{cidr: 10.244.0.0/16, ipipMode: {}, blockSize: 28}}\n",
        s.mode
    )];
    for (i, (has_addr, subnet)) in s.nodes.iter().enumerate() {
        let spec = if *has_addr { format!("{{bgp: {{ipv4Address: {}/24}}}}", node_ip(i, *subnet)) } else { "{}".to_owned() };
        out.push(format!("apiVersion: projectcalico.org/v3\nkind: Node\nmetadata: {{name: {}}}\nspec: {spec}\n", node_name(i)));
    }
    for (i, (host, allocs)) in s.blocks.iter().enumerate() {
        let cidr = block_cidr(i);
        let affinity = host.map(|h| format!("affinity: \"host:{}\", ", node_name(h))).unwrap_or_default();
        let mut attrs = Vec::new();
        let mut allocations = Vec::new();
        for a in allocs {
            match a {
                None => allocations.push("null".to_owned()),
                Some(n) => {
                    allocations.push(attrs.len().to_string());
                    if *n < s.nodes.len() {
                        attrs.push(format!("{{secondary: {{node: {}}}}}", node_name(*n)));
                    } else {
                        attrs.push("{handle_id: h}".to_owned());
                    }
                }
            }
        }
        out.push(format!(
            "apiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {{name: {name}}}\nspec: {{cidr: {cidr}, {affinity}allocations: [{}], attributes: [{}]}}\n",
            allocations.join(", "),
            attrs.join(", "),
            name = routewarden::model::block_name(cidr),
        ));
    }
    out
}

fn load(docs: &[String]) -> Cluster {
    let (cluster, errors) = Cluster::from_yaml_str(&docs.join("---\n")).unwrap();
    assert_eq!(errors, vec![]);
    cluster
}

fn spec_and_shuffled() -> impl Strategy<Value = (Spec, Vec<String>)> {
    spec().prop_flat_map(|s| {
        let d = docs(&s);
        (Just(s), Just(d).prop_shuffle())
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn route_properties((s, shuffled) in spec_and_shuffled()) {
        let cluster = load(&docs(&s));
        let local = node_name(s.local);
        let d = desired_routes(&cluster, &local, &routable_classes(), &RouteDevices::default());
        let addr = |n: usize| s.nodes[n].0.then(|| ip(&node_ip(n, s.nodes[n].1)));
        // Without an address of its own, the local node gets no native route (Felix's manager
        // has no parent device); without one it cannot be in a subnet either, so CrossSubnet
        // still tunnels.
        let no_native = s.mode == "Never" && addr(s.local).is_none();
        if no_native && !d.routes.iter().all(|r| r.path == RoutePath::Blackhole) {
            prop_assert!(false, "a native route from a node without an address: {:?}", d.routes);
        }
        let local_problem = RouteProblem::LocalNodeWithoutAddress { node: node_name(s.local), family: 4 };

        // One destination, one route.
        let dsts: BTreeSet<IpNet> = d.routes.iter().map(|r| r.dst).collect();
        prop_assert_eq!(dsts.len(), d.routes.len());

        for (i, (host, allocs)) in s.blocks.iter().enumerate() {
            let cidr = block_cidr(i);
            let to_block: Vec<&ClusterRoute> = d.routes.iter().filter(|r| r.dst == cidr).collect();
            match host {
                // Never a route to an own block: only its blackhole.
                Some(h) if *h == s.local => {
                    prop_assert_eq!(to_block.len(), 1);
                    prop_assert_eq!(to_block[0].path, RoutePath::Blackhole);
                    prop_assert_eq!(to_block[0].gateway, None);
                }
                // Exactly one route per remote block, to its affine node (or a problem when
                // that node has no address).
                Some(h) => match addr(*h) {
                    Some(_) if no_native => {
                        prop_assert!(to_block.is_empty());
                        prop_assert!(d.problems.contains(&local_problem));
                    }
                    Some(gw) => {
                        prop_assert_eq!(to_block.len(), 1);
                        prop_assert_eq!(to_block[0].gateway, Some(gw));
                        prop_assert_ne!(to_block[0].path, RoutePath::Blackhole);
                    }
                    None => {
                        prop_assert!(to_block.is_empty());
                        let problem = RouteProblem::NodeWithoutAddress { node: node_name(*h), family: 4, dst: cidr };
                        prop_assert!(d.problems.contains(&problem));
                    }
                },
                None => prop_assert!(to_block.is_empty()),
            }
            // Every borrowed IP is covered by a /32 to its real node.
            for (ordinal, a) in allocs.iter().enumerate() {
                let Some(n) = a else { continue };
                let ipn = IpNet::from(routewarden::model::nth_ip(cidr, ordinal).unwrap());
                let route = d.routes.iter().find(|r| r.dst == ipn);
                if *n == s.nodes.len() {
                    // No node recorded: never guessed.
                    prop_assert!(route.is_none());
                } else if Some(*n) == *host || *n == s.local {
                    prop_assert!(route.is_none(), "unexpected /32 {}", ipn);
                } else if no_native {
                    prop_assert!(route.is_none());
                } else if let Some(gw) = addr(*n) {
                    let route = route.expect("borrowed IP route");
                    prop_assert_eq!(route.gateway, Some(gw));
                    prop_assert_eq!(&route.origin, &RouteOrigin::BorrowedIp { block: routewarden::model::block_name(cidr).into(), node: node_name(*n).into() });
                } else {
                    prop_assert!(route.is_none());
                }
            }
        }
        // Tunnel vs host NIC follows the pool mode and the local subnet.
        for r in d.routes.iter().filter(|r| r.path != RoutePath::Blackhole) {
            let gw = r.gateway.unwrap();
            let local_subnet = addr(s.local).map(|_| net(&format!("10.0.{}.0/24", s.nodes[s.local].1)));
            let same = local_subnet.is_some_and(|n| n.contains(&gw));
            let want = match s.mode {
                "Never" => RoutePath::HostNic,
                "CrossSubnet" if same => RoutePath::HostNic,
                _ => RoutePath::Tunnel,
            };
            prop_assert_eq!(r.path, want, "{}", r.dst);
        }

        // One pass for every class answers for any set of them.
        let all = classed_routes(&cluster, &local, &routable_classes(), &RouteDevices::default());
        for classes in class_sets() {
            prop_assert_eq!(all.select(&classes), desired_routes(&cluster, &local, &classes, &RouteDevices::default()));
        }

        // Output independent of input order.
        let shuffled_cluster = load(&shuffled);
        let d2 = desired_routes(&shuffled_cluster, &local, &routable_classes(), &RouteDevices::default());
        prop_assert_eq!(d, d2);
    }
}

// ---------------------------------------------------------------------------------------------
// The route pass kept between snapshots (`RouteMemo`) against the full pass

/// One IPAM block of a [`MemoSpec`]: CIDR slot (0..4 in the IPIP pool, 4..6 in the no-encap
/// pool, 6 in no pool), a /32 inside the slot instead of its /28 (its address is the /28's
/// ordinal 1), its affine node (`MEMO_NODES`: a node not in the cluster), allocations (node
/// index, `MEMO_NODES` = no node recorded) and the `deleted` flag.
#[derive(Clone, Debug, PartialEq)]
struct MemoBlock {
    slot: usize,
    slash32: bool,
    host: Option<usize>,
    allocs: Vec<Option<usize>>,
    deleted: bool,
}

/// A cluster of four nodes, two pools and up to a dozen blocks and affinities, with /32 blocks
/// inside /28 blocks (two routes to one destination), blocks in no pool or of a node not in the
/// cluster, tunnel addresses inside blocks and conflicting affinities: the
/// shapes the kept pass must get right when one of them changes.
#[derive(Clone, Debug)]
struct MemoSpec {
    nodes: Vec<MemoNode>,
    mode: &'static str,
    blocks: Vec<MemoBlock>,
    /// (slot, node, state).
    affinities: Vec<(usize, usize, &'static str)>,
}

const MEMO_NODES: usize = 4;

/// A node of a [`MemoSpec`]: has an address, its subnet, its IPIP tunnel address as (slot,
/// ordinal).
type MemoNode = (bool, u8, Option<(usize, usize)>);

fn memo_block() -> impl Strategy<Value = MemoBlock> {
    (
        0usize..7,
        prop::bool::weighted(0.2),
        prop::option::weighted(0.8, 0..=MEMO_NODES),
        prop::collection::vec(prop::option::of(0..=MEMO_NODES), 0..6),
        prop::bool::weighted(0.1),
    )
        .prop_map(|(slot, slash32, host, allocs, deleted)| MemoBlock { slot, slash32, host, allocs, deleted })
}

fn memo_nodes() -> impl Strategy<Value = Vec<MemoNode>> {
    prop::collection::vec((prop::bool::weighted(0.85), 0u8..2, prop::option::weighted(0.4, (0usize..6, 0usize..6))), MEMO_NODES)
}

fn memo_affinity() -> impl Strategy<Value = (usize, usize, &'static str)> {
    (0usize..6, 0..MEMO_NODES, prop::sample::select(vec!["confirmed", "pending", "pendingDeletion"]))
}

/// One change to a spec.
#[derive(Clone, Debug)]
enum MemoEdit {
    SetBlock(usize, MemoBlock),
    RemoveBlock(usize),
    AddBlock(MemoBlock),
    AddAffinity((usize, usize, &'static str)),
    RemoveAffinity(usize),
    Nodes(Vec<MemoNode>),
    Mode(&'static str),
}

fn memo_edit() -> impl Strategy<Value = MemoEdit> {
    prop_oneof![
        4 => (0usize..16, memo_block()).prop_map(|(i, b)| MemoEdit::SetBlock(i, b)),
        2 => (0usize..16).prop_map(MemoEdit::RemoveBlock),
        2 => memo_block().prop_map(MemoEdit::AddBlock),
        1 => memo_affinity().prop_map(MemoEdit::AddAffinity),
        1 => (0usize..8).prop_map(MemoEdit::RemoveAffinity),
        1 => memo_nodes().prop_map(MemoEdit::Nodes),
        1 => prop::sample::select(vec!["Always", "CrossSubnet"]).prop_map(MemoEdit::Mode),
    ]
}

impl MemoEdit {
    fn apply(&self, s: &mut MemoSpec) {
        match self {
            MemoEdit::SetBlock(i, b) if !s.blocks.is_empty() => {
                let n = s.blocks.len();
                s.blocks[i % n] = b.clone();
            }
            MemoEdit::RemoveBlock(i) if !s.blocks.is_empty() => {
                let n = s.blocks.len();
                s.blocks.remove(i % n);
            }
            MemoEdit::SetBlock(_, b) | MemoEdit::AddBlock(b) => s.blocks.push(b.clone()),
            MemoEdit::AddAffinity(a) => s.affinities.push(*a),
            MemoEdit::RemoveAffinity(i) if !s.affinities.is_empty() => {
                let n = s.affinities.len();
                s.affinities.remove(i % n);
            }
            MemoEdit::RemoveBlock(_) | MemoEdit::RemoveAffinity(_) => {}
            MemoEdit::Nodes(nodes) => s.nodes.clone_from(nodes),
            MemoEdit::Mode(m) => s.mode = m,
        }
    }
}

fn slot_cidr(slot: usize, slash32: bool) -> IpNet {
    let pool = match slot {
        0..4 => 244,
        4..6 => 245,
        _ => 99,
    };
    let base = (slot % 4) * 16;
    if slash32 {
        format!("10.{pool}.0.{}/32", base + 1).parse().unwrap()
    } else {
        format!("10.{pool}.0.{base}/28").parse().unwrap()
    }
}

/// The spec as one YAML text; of blocks with the same name the last is kept.
fn memo_yaml(s: &MemoSpec) -> String {
    let mut out = vec![
        format!(
            "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {{name: tunnel}}\nspec: {{cidr: 10.244.0.0/16, ipipMode: {}, blockSize: 28}}\n",
            s.mode
        ),
        "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: flat}\nspec: {cidr: 10.245.0.0/16, blockSize: 28}\n".to_owned(),
    ];
    for (i, (has_addr, subnet, tunnel)) in s.nodes.iter().enumerate() {
        let mut bgp = Vec::new();
        if *has_addr {
            bgp.push(format!("ipv4Address: {}/24", node_ip(i, *subnet)));
        }
        if let Some((slot, ordinal)) = tunnel {
            bgp.push(format!("ipv4IPIPTunnelAddr: {}", routewarden::model::nth_ip(slot_cidr(*slot, false), *ordinal).unwrap()));
        }
        out.push(format!("apiVersion: projectcalico.org/v3\nkind: Node\nmetadata: {{name: {}}}\nspec: {{bgp: {{{}}}}}\n", node_name(i), bgp.join(", ")));
    }
    let mut blocks = std::collections::BTreeMap::new();
    for b in &s.blocks {
        let cidr = slot_cidr(b.slot, b.slash32);
        blocks.insert(routewarden::model::block_name(cidr), (cidr, b));
    }
    for (name, (cidr, b)) in blocks {
        let affinity =
            b.host.map(|h| format!("affinity: \"host:{}\", ", if h < MEMO_NODES { node_name(h) } else { "node-gone".to_owned() })).unwrap_or_default();
        let (mut attrs, mut allocations) = (Vec::new(), Vec::new());
        let size = if b.slash32 { 1 } else { b.allocs.len() };
        for a in b.allocs.iter().take(size) {
            match a {
                None => allocations.push("null".to_owned()),
                Some(n) => {
                    allocations.push(attrs.len().to_string());
                    attrs.push(if *n < MEMO_NODES { format!("{{secondary: {{node: {}}}}}", node_name(*n)) } else { "{handle_id: h}".to_owned() });
                }
            }
        }
        out.push(format!(
            "apiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {{name: {name}}}\nspec: {{cidr: {cidr}, {affinity}deleted: {}, allocations: [{}], attributes: [{}]}}\n",
            b.deleted,
            allocations.join(", "),
            attrs.join(", "),
        ));
    }
    for (i, (slot, node, state)) in s.affinities.iter().enumerate() {
        out.push(format!(
            "apiVersion: crd.projectcalico.org/v1\nkind: BlockAffinity\nmetadata: {{name: aff-{i}}}\nspec: {{cidr: {}, node: {}, state: {state}, deleted: \"false\"}}\n",
            slot_cidr(*slot, false),
            node_name(*node)
        ));
    }
    out.join("---\n")
}

/// `next` made as the Kubernetes datastore makes it: `prev`'s maps (sharing their chunks) with
/// the objects that differ taken out or put in, so that every unchanged object is `prev`'s
/// pointer.
fn share_unchanged(prev: &Cluster, mut next: Cluster) -> Cluster {
    fn share<T: PartialEq>(prev: &SharedMap<Arc<str>, Arc<T>>, next: &SharedMap<Arc<str>, Arc<T>>) -> SharedMap<Arc<str>, Arc<T>> {
        let mut out = prev.clone();
        for name in prev.keys().filter(|name| !next.contains_key(*name)) {
            out.remove(name);
        }
        for (name, v) in next.iter().filter(|(name, v)| prev.get(*name) != Some(*v)) {
            out.insert(name.clone(), v.clone());
        }
        out
    }
    next.ipam_blocks = share(&prev.ipam_blocks, &next.ipam_blocks);
    next.block_affinities = share(&prev.block_affinities, &next.block_affinities);
    next.nodes = share(&prev.nodes, &next.nodes);
    next
}

/// The steps of a random case: the start, then each edit with the cluster after it. Each
/// cluster is built as a datastore builds it: with `share`, every object that did not change
/// is the previous cluster's pointer (the Kubernetes datastore), else an equal copy (files).
fn memo_steps(mut spec: MemoSpec, edits: &[MemoEdit], share: bool) -> Vec<(Option<&MemoEdit>, Cluster)> {
    let mut prev = Cluster::default();
    let mut out = Vec::new();
    for edit in std::iter::once(None).chain(edits.iter().map(Some)) {
        if let Some(e) = edit {
            e.apply(&mut spec);
        }
        let text = memo_yaml(&spec);
        let (mut cluster, errors) = Cluster::from_yaml_str(&text).unwrap();
        // The model refuses the /32 blocks inside /28 blocks (overlapping, and not of their
        // pool's blockSize: `check_blocks`), so no datastore hands them to the route
        // pass any more; the pass must still be right for any cluster, so they are put back.
        assert!(
            errors.iter().all(|e| matches!(e, ModelError::Field { kind: Kind::IpamBlock, field, .. } if field == "spec.cidr")),
            "after {edit:?}: {errors:?}"
        );
        for item in ParsedObjects::from_yaml_str(&text, &YamlLimits::default()).unwrap().into_items() {
            if let ParsedObject::IpamBlock(name, b) = item {
                if !cluster.ipam_blocks.contains_key(name.as_str()) {
                    cluster.ipam_blocks.insert(name.into(), b);
                }
            }
        }
        let cluster = if share { share_unchanged(&prev, cluster) } else { cluster };
        prev = cluster.clone();
        out.push((edit, cluster));
    }
    out
}

fn memo_case() -> impl Strategy<Value = (MemoSpec, Vec<MemoEdit>, usize, bool)> {
    (
        memo_nodes(),
        prop::sample::select(vec!["Always", "CrossSubnet"]),
        prop::collection::vec(memo_block(), 0..10),
        prop::collection::vec(memo_affinity(), 0..4),
        prop::collection::vec(memo_edit(), 1..12),
        0..MEMO_NODES,
        any::<bool>(),
    )
        .prop_map(|(nodes, mode, blocks, affinities, edits, local, share)| (MemoSpec { nodes, mode, blocks, affinities }, edits, local, share))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// After every change of a random sequence (blocks set, added, removed; affinities added
    /// and removed; Nodes and pool modes changed), the kept pass answers exactly what the full
    /// pass answers: the same routes in the same order and the same problems. Unchanged
    /// objects keep their pointers (as from the Kubernetes datastore) or are equal copies (as
    /// from the file datastore).
    #[test]
    fn kept_pass_equals_the_full_pass_after_every_change((spec, edits, local, share) in memo_case()) {
        let local = node_name(local);
        let devices = RouteDevices::default();
        let classes = routable_classes();
        let mut memo = routewarden::routes::RouteMemo::default();
        let mut last = None;
        for (step, (edit, cluster)) in memo_steps(spec, &edits, share).into_iter().enumerate() {
            let full = classed_routes(&cluster, &local, &classes, &devices);
            let cluster = std::sync::Arc::new(cluster);
            let changed = memo.update(&cluster, &local, &classes, &devices);
            let kept = memo.answer();
            prop_assert_eq!(kept.routes(), full.routes(), "step {} ({:?})", step, edit);
            prop_assert_eq!(&kept, &full, "step {} ({:?})", step, edit);
            // "Unchanged" is a promise the plan skips on: the answer must be the last one.
            if !changed {
                prop_assert_eq!(Some(&kept), last.as_ref(), "step {} ({:?}) said unchanged", step, edit);
            }
            last = Some(kept);
        }
    }

    /// The agent's plan (`plan_with`, which answers `None` for "the same as the last plan",
    /// and patches the last plan where only routes changed) equals the full plan after every
    /// change of the same random sequences (IPAM blocks and affinities, and the Nodes and IP
    /// pools it must notice as well), in Felix's role or BIRD's (whose expectations differ:
    /// BIRD's next hops, no tunnel addresses); the classes it programmed are handed to the next
    /// call as the app does. The forwarding watch's entries, kept from the agent's plans as the
    /// app keeps them (`EntriesMemo`), equal those of the full plan.
    #[test]
    fn the_agents_plan_equals_the_full_plan_after_every_change((spec, edits, local, share) in memo_case(), bird in any::<bool>()) {
        use routewarden::datastore::Snapshot;
        use routewarden::ownership::Role;
        use routewarden::plan::{plan, plan_with, PlanMemo};
        let mut config = felix_config(local);
        if bird {
            config.ownership.role = Role::Bird;
        }
        let mut memo = PlanMemo::default();
        let mut entries = routewarden::bpf::forward::EntriesMemo::default();
        let mut agents = None;
        let (mut programmed, mut owned, mut last): (BTreeSet<PoolClass>, Vec<IpNet>, Option<String>) = Default::default();
        for (step, (edit, cluster)) in memo_steps(spec, &edits, share).into_iter().enumerate() {
            let snapshot = Snapshot { cluster: Arc::new(cluster), object_errors: vec![], load_errors: vec![], inputs: 1, settled: true };
            let full = plan(&snapshot, &config, &programmed, &owned);
            let full_text = format!("{full:?}");
            if let Some(p) = plan_with(&mut memo, &snapshot, &config, &programmed, &owned) {
                prop_assert_eq!(&format!("{p:?}"), &full_text, "step {} ({:?})", step, edit);
                agents = Some(p);
            } else {
                prop_assert_eq!(last.as_ref(), Some(&full_text), "step {} ({:?}) kept the last plan", step, edit);
            }
            let p = agents.as_ref().expect("the first call plans");
            let kept: Vec<_> = entries.entries(&p.desired, &p.expected, &p.programmed).into_iter().map(|(_, e)| e).collect();
            let want = routewarden::bpf::forward::entries_from_routes(full.desired.values().map(|r| &**r), full.expected.values(), &full.programmed);
            prop_assert_eq!(kept, want, "step {} ({:?}): forwarding entries", step, edit);
            programmed.clone_from(&full.decision.programmed);
            owned.clone_from(&full.policy.owned);
            last = Some(full_text);
        }
    }
}

/// The plan settings of the tests below: routewarden in Felix's role on node `i`.
fn felix_config(i: usize) -> routewarden::plan::PlanConfig {
    use routewarden::ownership::{OwnershipConfig, Role};
    routewarden::plan::PlanConfig {
        node: node_name(i),
        ownership: OwnershipConfig { role: Role::Felix, ..Default::default() },
        devices: RouteDevices::default(),
        protocol: 80,
        table: 254,
    }
}

/// A settled snapshot of `yaml`, which must parse whole.
fn snapshot_of(yaml: &str) -> routewarden::datastore::Snapshot {
    let (cluster, errors) = Cluster::from_yaml_str(yaml).unwrap();
    assert_eq!(errors, vec![]);
    routewarden::datastore::Snapshot { cluster: Arc::new(cluster), object_errors: vec![], load_errors: vec![], inputs: 1, settled: true }
}

/// A pod's IP allocated in its own node's block changes no route: the agent makes no plan for
/// it (`plan_with` answers `None`); the same IP borrowed by another node is a /32, a new plan.
#[test]
fn an_ip_allocated_in_its_own_nodes_block_makes_no_new_plan() {
    use routewarden::plan::{plan_with, PlanMemo};
    let spec = |allocs: Vec<Option<usize>>| MemoSpec {
        nodes: vec![(true, 0, None); MEMO_NODES],
        mode: "Always",
        blocks: vec![MemoBlock { slot: 1, slash32: false, host: Some(1), allocs, deleted: false }],
        affinities: vec![],
    };
    let config = felix_config(0);
    let mut memo = PlanMemo::default();
    let mut plan_of = |allocs: Vec<Option<usize>>| {
        plan_with(&mut memo, &snapshot_of(&memo_yaml(&spec(allocs))), &config, &BTreeSet::from([PoolClass::Ipip]), &[])
            .map(|p| p.desired.values().map(|r| r.dst.to_string()).collect::<Vec<_>>())
    };
    assert_eq!(plan_of(vec![Some(1)]), Some(vec!["10.244.0.16/28".to_owned()]));
    assert_eq!(plan_of(vec![Some(1), Some(1)]), None, "node-1's pod in node-1's block");
    assert_eq!(plan_of(vec![Some(1), Some(1), None]), None, "a free ordinal");
    assert_eq!(plan_of(vec![Some(1), Some(1), Some(2)]), Some(vec!["10.244.0.16/28".to_owned(), "10.244.0.18/32".to_owned()]), "node-2 borrows .18");
}

/// Everything the plan reads besides IPAM blocks and affinities makes a new plan when it
/// changes, with no IPAM change at all: a broken input's frozen ground appearing and going,
/// a FelixConfiguration, the classes programmed before, the pool CIDRs owned before, the
/// agent's settings. The same content again (shared or copied) makes none.
#[test]
fn a_plan_input_besides_ipam_changing_makes_a_new_plan() {
    use routewarden::datastore::{LoadError, LoadErrorKind};
    use routewarden::plan::{plan_with, PlanConfig, PlanMemo};
    let spec = MemoSpec {
        nodes: vec![(true, 0, None); MEMO_NODES],
        mode: "Always",
        blocks: vec![MemoBlock { slot: 1, slash32: false, host: Some(1), allocs: vec![Some(1)], deleted: false }],
        affinities: vec![],
    };
    let snapshot = |extra: &str| snapshot_of(&format!("{}{extra}", memo_yaml(&spec)));
    let config = felix_config(0);
    let ipip = BTreeSet::from([PoolClass::Ipip]);
    let mut memo = PlanMemo::default();
    let base = snapshot("");
    let first = plan_with(&mut memo, &base, &config, &ipip, &[]).expect("the first plan");
    assert_eq!(first.desired.values().map(|r| r.dst.to_string()).collect::<Vec<_>>(), ["10.244.0.16/28"]);
    assert!(plan_with(&mut memo, &base, &config, &ipip, &[]).is_none(), "the same snapshot");
    assert!(plan_with(&mut memo, &snapshot(""), &config, &ipip, &[]).is_none(), "an equal copy");

    let mut broken = base.clone();
    let mut error = LoadError::new("calico.yaml", LoadErrorKind::Syntax, "truncated");
    error.cidrs = vec!["10.244.0.16/28".parse().unwrap()];
    broken.load_errors = vec![error];
    let frozen = plan_with(&mut memo, &broken, &config, &ipip, &[]).expect("a broken input");
    assert_eq!(frozen.frozen.iter().map(|f| f.cidr.to_string()).collect::<Vec<_>>(), ["10.244.0.16/28"]);
    assert!(plan_with(&mut memo, &base, &config, &ipip, &[]).expect("the input mended").frozen.is_empty());

    let felix = "---\napiVersion: projectcalico.org/v3\nkind: FelixConfiguration\nmetadata: {name: default}\nspec: {programClusterRoutes: Disabled}\n";
    assert!(plan_with(&mut memo, &snapshot(felix), &config, &ipip, &[]).is_some(), "a FelixConfiguration");
    assert!(plan_with(&mut memo, &base, &config, &ipip, &[]).is_some(), "the FelixConfiguration gone");
    assert!(plan_with(&mut memo, &base, &config, &BTreeSet::new(), &[]).is_some(), "other classes programmed before");
    assert!(plan_with(&mut memo, &base, &config, &BTreeSet::new(), &["10.99.0.0/16".parse().unwrap()]).is_some(), "a pool CIDR owned before");
    let other = PlanConfig { protocol: 201, ..config.clone() };
    assert!(plan_with(&mut memo, &base, &other, &BTreeSet::new(), &["10.99.0.0/16".parse().unwrap()]).is_some(), "another route protocol");
    assert!(plan_with(&mut memo, &base, &other, &BTreeSet::new(), &["10.99.0.0/16".parse().unwrap()]).is_none(), "nothing changed");
}

/// A node's tunnel address inside another node's block, then allocated in that block to the
/// block's own node: the block's routes stay the same, but the tunnel-address rule now finds
/// a conflict (IPAM records the address for another node than the Node that holds it), and
/// the agent must make a new plan for it.
#[test]
fn a_tunnel_address_allocated_to_another_node_makes_a_new_plan() {
    use routewarden::plan::{plan_with, PlanMemo};
    let spec = |allocs: Vec<Option<usize>>| {
        let mut nodes = vec![(true, 0, None); MEMO_NODES];
        nodes[2].2 = Some((1, 5)); // node-2's tunnel address: 10.244.0.21, in node-1's block
        MemoSpec { nodes, mode: "Always", blocks: vec![MemoBlock { slot: 1, slash32: false, host: Some(1), allocs, deleted: false }], affinities: vec![] }
    };
    let config = felix_config(0);
    let mut memo = PlanMemo::default();
    let mut plan_of = |allocs: Vec<Option<usize>>| {
        plan_with(&mut memo, &snapshot_of(&memo_yaml(&spec(allocs))), &config, &BTreeSet::from([PoolClass::Ipip]), &[])
            .map(|p| (p.desired.values().map(|r| r.dst.to_string()).collect::<Vec<_>>(), p.problems.iter().map(RouteProblem::code).collect::<Vec<_>>()))
    };
    let routes = vec!["10.244.0.16/28".to_owned(), "10.244.0.21/32".to_owned()];
    assert_eq!(plan_of(vec![Some(1)]), Some((routes.clone(), vec![])));
    assert_eq!(plan_of(vec![Some(1), Some(1)]), None, "node-1's pod at .17");
    let conflict = plan_of(vec![Some(1), Some(1), None, None, None, Some(1)]);
    assert_eq!(conflict, Some((routes, vec!["tunnel-address-conflict"])), "node-2's tunnel address allocated to node-1");
}
