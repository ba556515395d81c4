//! Two Felix route rules, as tables whose expectations are written by hand from the
//! Felix code paths (projectcalico/calico master 87c15906f20c), never from `routes::compute`.
//!
//! Rule 1, tunnel addresses in another node's block: `felix/calc/l3_route_resolver.go`
//! `onNodeUpdate` adds each Node tunnel address (IPIP, VXLAN, WireGuard) as a reference of its
//! node; `flush` lets a reference override the node of the IPAM entries it sits in and marks
//! it `REMOTE_TUNNEL`, `Borrowed` when the enclosing block is affine to another node;
//! `felix/dataplane/linux/route_mgr.go` `isRemoteTunnelRoute` then programs it for the
//! manager whose pool type it is, with the manager's usual path choice (`updateRoutes`: host
//! NIC when same-subnet or no-encap, else `ipip_mgr.go` `route`, onlink via `tunl0`).
//!
//! Rule 2, the tunnel gateway: `ipip_mgr.go` `route` takes the gateway from the per-host
//! address (`activeHostnameToIP`), which `felix/calc/dataplane_passthru.go`
//! `extractNodeAddress` fills from `net.ParseCIDR(spec.bgp.ipv4Address)` (a bare address does
//! not parse), else the first InternalIP, else the first ExternalIP; host-NIC routes and the
//! same-subnet test use the resolver's `DstNodeIp` (`cnet.ParseCIDROrIP`, bare accepted).
//!
//! Plus one netns test: the agent programs the borrowed tunnel-address /32 into a kernel.

mod lab_support;

use std::collections::BTreeSet;
use std::time::Duration;

use lab_support::{copy_examples, lab, metrics, routes, wait_for, wait_ready, Agent, NODE_A_IPIP};
use routewarden::model::Cluster;
use routewarden::routes::{desired_routes, ClusterRoute, RouteDevices, RouteProblem};
use routewarden::vocabulary::{PoolClass, RoutePath};
use routewarden_lab::skip_unless_root;

/// Pools: IPIP Always, IPIP CrossSubnet, no-encap, VXLAN. node-a (this node) and node-b on
/// 10.0.0.0/24, node-c on 10.0.1.0/24. Blocks: node-a's and node-c's in each IPIP pool.
const BASE: &str = r#"
apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: ipip}
spec: {cidr: 10.244.0.0/16, ipipMode: Always}
---
apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: cross}
spec: {cidr: 10.245.0.0/16, ipipMode: CrossSubnet}
---
apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: flat}
spec: {cidr: 10.246.0.0/16}
---
apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: vx}
spec: {cidr: 10.247.0.0/16, vxlanMode: Always}
---
apiVersion: projectcalico.org/v3
kind: Node
metadata: {name: node-a}
spec: {bgp: {ipv4Address: 10.0.0.11/24, ipv4IPIPTunnelAddr: 10.244.10.1}}
---
apiVersion: projectcalico.org/v3
kind: Node
metadata: {name: node-c}
spec: {bgp: {ipv4Address: 10.0.1.13/24}}
---
apiVersion: crd.projectcalico.org/v1
kind: IPAMBlockList
items:
  - metadata: {name: 10-244-10-0-26}
    spec: {cidr: 10.244.10.0/26, affinity: "host:node-a"}
  - metadata: {name: 10-244-30-0-26}
    spec: {cidr: 10.244.30.0/26, affinity: "host:node-c"}
  - metadata: {name: 10-245-30-0-26}
    spec: {cidr: 10.245.30.0/26, affinity: "host:node-c"}
"#;

/// The routes BASE alone gives node-a for every routable class.
const BASE_ROUTES: [&str; 3] =
    ["blackhole 10.244.10.0/26 [ipip]", "10.244.30.0/26 via 10.0.1.13 dev tunl0 [ipip]", "10.245.30.0/26 via 10.0.1.13 dev tunl0 [cross]"];

/// BASE plus `extra`, where a Node in `extra` replaces BASE's Node of that name.
fn with_base(extra: &str) -> String {
    let base: Vec<&str> = BASE
        .split("\n---\n")
        .filter(|doc| !(doc.contains("kind: Node\n") && extra.contains(doc.lines().find(|l| l.starts_with("metadata:")).unwrap())))
        .collect();
    format!("{}\n---\n{extra}", base.join("\n---\n"))
}

/// `ip route`-like one-liner.
fn line(r: &ClusterRoute) -> String {
    match r.path {
        RoutePath::Blackhole => format!("blackhole {} [{}]", r.dst, r.pool),
        _ => format!("{} via {} dev {} [{}]", r.dst, r.gateway.unwrap(), r.device.as_deref().unwrap(), r.pool),
    }
}

struct Row {
    name: &'static str,
    /// YAML documents added to BASE.
    extra: &'static str,
    /// Classes node-a computes.
    classes: &'static [PoolClass],
    /// Routes beyond BASE_ROUTES (of the classes asked), in destination order with them.
    routes: &'static [&'static str],
    /// Every problem, as `code: message`.
    problems: &'static [&'static str],
}

const ALL: &[PoolClass] = &[PoolClass::Ipip, PoolClass::NoEncap];

fn run(row: &Row) {
    let (cluster, errors) = Cluster::from_yaml_str(&with_base(row.extra)).unwrap();
    assert_eq!(errors, vec![], "{}", row.name);
    let classes: BTreeSet<PoolClass> = row.classes.iter().copied().collect();
    let d = desired_routes(&cluster, "node-a", &classes, &RouteDevices::default());
    let mut want: Vec<String> =
        BASE_ROUTES.iter().filter(|r| classes.contains(&PoolClass::Ipip) || r.contains("[flat]")).chain(row.routes).map(|s| (*s).to_owned()).collect();
    // Destination order, the way desired_routes sorts (addresses compared numerically).
    want.sort_by_key(|l| {
        let dst = l.trim_start_matches("blackhole ").split(' ').next().unwrap().to_owned();
        dst.parse::<ipnet::IpNet>().unwrap()
    });
    let got: Vec<String> = d.routes.iter().map(line).collect();
    assert_eq!(got, want, "{}: routes", row.name);
    let problems: Vec<String> = d.problems.iter().map(|p| format!("{}: {p}", p.code())).collect();
    assert_eq!(problems, row.problems, "{}: problems", row.name);
}

/// node-b on node-a's subnet, with a tunnel address given as a YAML fragment.
macro_rules! node_b {
    ($spec:literal) => {
        concat!("apiVersion: projectcalico.org/v3\nkind: Node\nmetadata: {name: node-b}\nspec: ", $spec, "\n")
    };
}

#[test]
#[allow(clippy::too_many_lines)] // one table, a row per case
fn rule_1_tunnel_addresses_inside_another_nodes_block() {
    let rows = [
        Row {
            // The issue's case: the allocation records no node, so IPAM alone gives no route
            // and the owner's block route would carry node-b's tunnel traffic to node-c.
            name: "IPIP tunnel address in node-c's block, allocation without a node",
            extra: concat!(
                node_b!("{bgp: {ipv4Address: 10.0.0.12/24, ipv4IPIPTunnelAddr: 10.244.31.5}}"),
                "---\napiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {name: 10-244-31-0-26}\n",
                "spec: {cidr: 10.244.31.0/26, affinity: \"host:node-c\", allocations: [null, null, null, null, null, 0], attributes: [{handle_id: ipip-tunnel-addr-node-b}]}\n"
            ),
            classes: ALL,
            routes: &["10.244.31.0/26 via 10.0.1.13 dev tunl0 [ipip]", "10.244.31.5/32 via 10.0.0.12 dev tunl0 [ipip]"],
            problems: &[],
        },
        Row {
            name: "no allocation at all (a hand-set tunnel address)",
            extra: node_b!("{bgp: {ipv4Address: 10.0.0.12/24, ipv4IPIPTunnelAddr: 10.244.30.5}}"),
            classes: ALL,
            routes: &["10.244.30.5/32 via 10.0.0.12 dev tunl0 [ipip]"],
            problems: &[],
        },
        Row {
            name: "allocation names node-b too: one /32, no duplicate",
            extra: concat!(
                node_b!("{bgp: {ipv4Address: 10.0.0.12/24, ipv4IPIPTunnelAddr: 10.244.31.5}}"),
                "---\napiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {name: 10-244-31-0-26}\n",
                "spec: {cidr: 10.244.31.0/26, affinity: \"host:node-c\", allocations: [null, null, null, null, null, 0], attributes: [{secondary: {node: node-b, type: ipipTunnelAddress}}]}\n"
            ),
            classes: ALL,
            routes: &["10.244.31.0/26 via 10.0.1.13 dev tunl0 [ipip]", "10.244.31.5/32 via 10.0.0.12 dev tunl0 [ipip]"],
            problems: &[],
        },
        Row {
            // The allocation sits at the address in node-c's own block; the reference says
            // node-b.
            name: "allocation names node-c: the Node wins, conflict reported",
            extra: concat!(
                node_b!("{bgp: {ipv4Address: 10.0.0.12/24, ipv4IPIPTunnelAddr: 10.244.31.5}}"),
                "---\napiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {name: 10-244-31-0-26}\n",
                "spec: {cidr: 10.244.31.0/26, affinity: \"host:node-c\", allocations: [null, null, null, null, null, 0], attributes: [{secondary: {node: node-c}}]}\n"
            ),
            classes: ALL,
            routes: &["10.244.31.0/26 via 10.0.1.13 dev tunl0 [ipip]", "10.244.31.5/32 via 10.0.0.12 dev tunl0 [ipip]"],
            problems: &[
                "tunnel-address-conflict: IP 10.244.31.5 is the ipip tunnel address of node \"node-b\" but IPAM block 10-244-31-0-26 records it for \"node-c\"; the route follows the Node, as Felix does",
            ],
        },
        Row {
            // flush: the borrowed /32's IPAM entry sets DstNodeName to node-d, the reference
            // then to node-b; IPAM's route via node-d is replaced, not doubled.
            name: "allocation borrowed by node-d: the Node wins",
            extra: concat!(
                node_b!("{bgp: {ipv4Address: 10.0.0.12/24, ipv4IPIPTunnelAddr: 10.244.31.5}}"),
                "---\napiVersion: projectcalico.org/v3\nkind: Node\nmetadata: {name: node-d}\nspec: {bgp: {ipv4Address: 10.0.1.14/24}}\n",
                "---\napiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {name: 10-244-31-0-26}\n",
                "spec: {cidr: 10.244.31.0/26, affinity: \"host:node-c\", allocations: [null, null, null, null, null, 0], attributes: [{secondary: {node: node-d}}]}\n"
            ),
            classes: ALL,
            routes: &["10.244.31.0/26 via 10.0.1.13 dev tunl0 [ipip]", "10.244.31.5/32 via 10.0.0.12 dev tunl0 [ipip]"],
            problems: &[
                "tunnel-address-conflict: IP 10.244.31.5 is the ipip tunnel address of node \"node-b\" but IPAM block 10-244-31-0-26 records it for \"node-d\"; the route follows the Node, as Felix does",
            ],
        },
        Row {
            // IPAM says this node's workload holds it (so IPAM alone gives no route).
            name: "allocation names this node: the Node wins",
            extra: concat!(
                node_b!("{bgp: {ipv4Address: 10.0.0.12/24, ipv4IPIPTunnelAddr: 10.244.31.5}}"),
                "---\napiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {name: 10-244-31-0-26}\n",
                "spec: {cidr: 10.244.31.0/26, affinity: \"host:node-c\", allocations: [null, null, null, null, null, 0], attributes: [{secondary: {node: node-a}}]}\n"
            ),
            classes: ALL,
            routes: &["10.244.31.0/26 via 10.0.1.13 dev tunl0 [ipip]", "10.244.31.5/32 via 10.0.0.12 dev tunl0 [ipip]"],
            problems: &[
                "tunnel-address-conflict: IP 10.244.31.5 is the ipip tunnel address of node \"node-b\" but IPAM block 10-244-31-0-26 records it for \"node-a\"; the route follows the Node, as Felix does",
            ],
        },
        Row {
            name: "inside node-b's own block: the block route covers it",
            extra: concat!(
                node_b!("{bgp: {ipv4Address: 10.0.0.12/24, ipv4IPIPTunnelAddr: 10.244.20.1}}"),
                "---\napiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {name: 10-244-20-0-26}\nspec: {cidr: 10.244.20.0/26, affinity: \"host:node-b\"}\n"
            ),
            classes: ALL,
            routes: &["10.244.20.0/26 via 10.0.0.12 dev tunl0 [ipip]"],
            problems: &[],
        },
        Row {
            // Borrowed from this node's block: the /32 beats node-a's own blackhole.
            name: "inside this node's block",
            extra: node_b!("{bgp: {ipv4Address: 10.0.0.12/24, ipv4IPIPTunnelAddr: 10.244.10.9}}"),
            classes: ALL,
            routes: &["10.244.10.9/32 via 10.0.0.12 dev tunl0 [ipip]"],
            problems: &[],
        },
        Row {
            // LOCAL_TUNNEL: not a remote route.
            name: "this node's own tunnel address in node-c's block",
            extra: concat!(
                node_b!("{bgp: {ipv4Address: 10.0.0.12/24}}"),
                "---\napiVersion: projectcalico.org/v3\nkind: Node\nmetadata: {name: node-a}\nspec: {bgp: {ipv4Address: 10.0.0.11/24, ipv4IPIPTunnelAddr: 10.244.30.7}}\n"
            ),
            classes: ALL,
            routes: &[],
            problems: &[],
        },
        Row {
            name: "in a block without affinity: no enclosing block of a node, no route",
            extra: concat!(
                node_b!("{bgp: {ipv4Address: 10.0.0.12/24, ipv4IPIPTunnelAddr: 10.244.40.3}}"),
                "---\napiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {name: 10-244-40-0-26}\nspec: {cidr: 10.244.40.0/26}\n"
            ),
            classes: ALL,
            routes: &[],
            problems: &["block-without-owner: IPAM block 10-244-40-0-26 (10.244.40.0/26) has no affinity and no allocation with a node; no route computed"],
        },
        Row {
            name: "in a VXLAN pool's block: Felix's VXLAN manager, never routewarden",
            extra: concat!(
                node_b!("{bgp: {ipv4Address: 10.0.0.12/24}, ipv4VXLANTunnelAddr: 10.247.30.2}"),
                "---\napiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {name: 10-247-30-0-26}\nspec: {cidr: 10.247.30.0/26, affinity: \"host:node-c\"}\n"
            ),
            classes: ALL,
            routes: &[],
            problems: &[],
        },
        Row {
            name: "in no pool",
            extra: node_b!("{bgp: {ipv4Address: 10.0.0.12/24, ipv4IPIPTunnelAddr: 10.99.0.1}}"),
            classes: ALL,
            routes: &[],
            problems: &[],
        },
        Row {
            // isRemoteTunnelRoute checks the pool type, not the tunnel type.
            name: "a WireGuard interface address in node-c's IPIP block",
            extra: node_b!("{bgp: {ipv4Address: 10.0.0.12/24}, wireguard: {interfaceIPv4Address: 10.244.30.9}}"),
            classes: ALL,
            routes: &["10.244.30.9/32 via 10.0.0.12 dev tunl0 [ipip]"],
            problems: &[],
        },
        Row {
            // RouteTrie.AddRef sorts references by node name: node-b before node-d.
            name: "two nodes claim one tunnel address",
            extra: concat!(
                node_b!("{bgp: {ipv4Address: 10.0.0.12/24, ipv4IPIPTunnelAddr: 10.244.30.5}}"),
                "---\napiVersion: projectcalico.org/v3\nkind: Node\nmetadata: {name: node-d}\nspec: {bgp: {ipv4Address: 10.0.1.14/24, ipv4IPIPTunnelAddr: 10.244.30.5}}\n"
            ),
            classes: ALL,
            routes: &["10.244.30.5/32 via 10.0.0.12 dev tunl0 [ipip]"],
            problems: &["tunnel-address-shared: IP 10.244.30.5 is the tunnel address of nodes [\"node-b\", \"node-d\"]; the route goes to \"node-b\", the first by name, as Felix does"],
        },
        Row {
            // updateRoutes: noEncapRoute first, SameSubnet from the pool's CrossSubnet.
            name: "CrossSubnet pool, holder in this node's subnet: host NIC",
            extra: node_b!("{bgp: {ipv4Address: 10.0.0.12/24, ipv4IPIPTunnelAddr: 10.245.30.4}}"),
            classes: ALL,
            routes: &["10.245.30.4/32 via 10.0.0.12 dev eth0 [cross]"],
            problems: &[],
        },
        Row {
            name: "CrossSubnet pool, holder in another subnet: tunnel",
            extra: "apiVersion: projectcalico.org/v3\nkind: Node\nmetadata: {name: node-d}\nspec: {bgp: {ipv4Address: 10.0.2.14/24, ipv4IPIPTunnelAddr: 10.245.30.4}}\n",
            classes: ALL,
            routes: &["10.245.30.4/32 via 10.0.2.14 dev tunl0 [cross]"],
            problems: &[],
        },
        Row {
            name: "no-encap pool: the noEncap manager, host NIC",
            extra: concat!(
                node_b!("{bgp: {ipv4Address: 10.0.0.12/24}, wireguard: {interfaceIPv4Address: 10.246.30.2}}"),
                "---\napiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {name: 10-246-30-0-26}\nspec: {cidr: 10.246.30.0/26, affinity: \"host:node-c\"}\n"
            ),
            classes: &[PoolClass::NoEncap],
            routes: &["10.246.30.0/26 via 10.0.1.13 dev eth0 [flat]", "10.246.30.2/32 via 10.0.0.12 dev eth0 [flat]"],
            problems: &[],
        },
        Row {
            name: "class not programmed here: nothing",
            extra: node_b!("{bgp: {ipv4Address: 10.0.0.12/24, ipv4IPIPTunnelAddr: 10.244.30.5}}"),
            classes: &[PoolClass::NoEncap],
            routes: &[],
            problems: &[],
        },
        Row {
            // OnResourceUpdate keeps no node info for a node without any address, so its
            // tunnel address is no reference; IPAM's view stands.
            name: "holder without any address",
            extra: concat!(
                "apiVersion: projectcalico.org/v3\nkind: Node\nmetadata: {name: node-b}\nspec: {bgp: {ipv4IPIPTunnelAddr: 10.244.31.5}}\n",
                "---\napiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {name: 10-244-31-0-26}\n",
                "spec: {cidr: 10.244.31.0/26, affinity: \"host:node-c\", allocations: [null, null, null, null, null, 0], attributes: [{handle_id: ipip-tunnel-addr-node-b}]}\n"
            ),
            classes: ALL,
            routes: &["10.244.31.0/26 via 10.0.1.13 dev tunl0 [ipip]"],
            problems: &["allocation-without-node: IP 10.244.31.5 of IPAM block 10-244-31-0-26 has no node in its allocation attributes; no route computed"],
        },
        Row {
            // A /32 block affine to node-c: its IPAM entry names node-c, the reference node-b.
            // In a pool of /32 blocks: a /32 block in a pool of /26 blocks is not one Calico's
            // IPAM writes, and is refused.
            name: "the whole /32 block of another node",
            extra: concat!(
                node_b!("{bgp: {ipv4Address: 10.0.0.12/24, ipv4IPIPTunnelAddr: 10.248.0.1}}"),
                "---\napiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: ipip32}\nspec: {cidr: 10.248.0.0/24, blockSize: 32, ipipMode: Always}\n",
                "---\napiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {name: 10-248-0-1-32}\nspec: {cidr: 10.248.0.1/32, affinity: \"host:node-c\"}\n"
            ),
            classes: ALL,
            routes: &["10.248.0.1/32 via 10.0.0.12 dev tunl0 [ipip32]"],
            problems: &["tunnel-address-conflict: IP 10.248.0.1 is the ipip tunnel address of node \"node-b\" but IPAM block 10-248-0-1-32 records it for \"node-c\"; the route follows the Node, as Felix does"],
        },
        Row {
            // This node's /32 block holding node-b's address: no blackhole (/32s never get
            // one), the Node's route, and the same conflict as for another node's /32 block.
            name: "this node's /32 block",
            extra: concat!(
                node_b!("{bgp: {ipv4Address: 10.0.0.12/24, ipv4IPIPTunnelAddr: 10.248.0.1}}"),
                "---\napiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: ipip32}\nspec: {cidr: 10.248.0.0/24, blockSize: 32, ipipMode: Always}\n",
                "---\napiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {name: 10-248-0-1-32}\nspec: {cidr: 10.248.0.1/32, affinity: \"host:node-a\"}\n"
            ),
            classes: ALL,
            routes: &["10.248.0.1/32 via 10.0.0.12 dev tunl0 [ipip32]"],
            problems: &["tunnel-address-conflict: IP 10.248.0.1 is the ipip tunnel address of node \"node-b\" but IPAM block 10-248-0-1-32 records it for \"node-a\"; the route follows the Node, as Felix does"],
        },
    ];
    for row in &rows {
        run(row);
    }
}

#[test]
fn rule_2_the_tunnel_gateway_follows_extract_node_address() {
    // node-b's block in each class: 10.244.20.0/26 (IPIP Always: tunnel), 10.246.20.0/26
    // (no-encap: host NIC), 10.245.20.0/26 (CrossSubnet: host NIC when node-b's DstNodeIp is
    // in 10.0.0.0/24, else tunnel).
    const B_BLOCKS: &str = "---\napiVersion: crd.projectcalico.org/v1\nkind: IPAMBlockList\nitems:\n  - metadata: {name: 10-244-20-0-26}\n    spec: {cidr: 10.244.20.0/26, affinity: \"host:node-b\"}\n  - metadata: {name: 10-245-20-0-26}\n    spec: {cidr: 10.245.20.0/26, affinity: \"host:node-b\"}\n  - metadata: {name: 10-246-20-0-26}\n    spec: {cidr: 10.246.20.0/26, affinity: \"host:node-b\"}\n";
    struct Case {
        name: &'static str,
        node_b: &'static str,
        routes: [&'static str; 3],
        problems: &'static [&'static str],
    }
    let cases = [
        Case {
            name: "BGP address with a prefix: every source agrees",
            node_b: node_b!("{bgp: {ipv4Address: 10.0.0.12/24}, addresses: [{address: 10.0.5.12, type: InternalIP}]}"),
            routes: ["10.244.20.0/26 via 10.0.0.12 dev tunl0 [ipip]", "10.245.20.0/26 via 10.0.0.12 dev eth0 [cross]", "10.246.20.0/26 via 10.0.0.12 dev eth0 [flat]"],
            problems: &[],
        },
        Case {
            // net.ParseCIDR accepts an explicit /32.
            name: "BGP address written /32",
            node_b: node_b!("{bgp: {ipv4Address: 10.0.0.12/32}, addresses: [{address: 10.0.5.12, type: InternalIP}]}"),
            routes: ["10.244.20.0/26 via 10.0.0.12 dev tunl0 [ipip]", "10.245.20.0/26 via 10.0.0.12 dev eth0 [cross]", "10.246.20.0/26 via 10.0.0.12 dev eth0 [flat]"],
            problems: &[],
        },
        Case {
            // The issue's case. Tunnel: InternalIP; native: the bare BGP address, also for
            // the same-subnet test (10.0.0.12 is in node-a's 10.0.0.0/24).
            name: "bare BGP address, other InternalIP",
            node_b: node_b!("{bgp: {ipv4Address: 10.0.0.12}, addresses: [{address: 10.0.5.12, type: InternalIP}]}"),
            routes: ["10.244.20.0/26 via 10.0.5.12 dev tunl0 [ipip]", "10.245.20.0/26 via 10.0.0.12 dev eth0 [cross]", "10.246.20.0/26 via 10.0.0.12 dev eth0 [flat]"],
            problems: &["next-hop-sources-disagree: node \"node-b\": BGP address 10.0.0.12 has no prefix length, so Felix routes through the tunnel via its node address 10.0.5.12 and natively via 10.0.0.12; routewarden does the same"],
        },
        Case {
            name: "bare BGP address equal to the InternalIP",
            node_b: node_b!("{bgp: {ipv4Address: 10.0.0.12}, addresses: [{address: 10.0.0.12, type: InternalIP}]}"),
            routes: ["10.244.20.0/26 via 10.0.0.12 dev tunl0 [ipip]", "10.245.20.0/26 via 10.0.0.12 dev eth0 [cross]", "10.246.20.0/26 via 10.0.0.12 dev eth0 [flat]"],
            problems: &[],
        },
        Case {
            // FindNodeAddress(InternalIP) first, then ExternalIP; the first of each kind.
            name: "bare BGP address, ExternalIP only (after a v6 InternalIP)",
            node_b: node_b!("{bgp: {ipv4Address: 10.0.0.12}, addresses: [{address: 'fd00::12', type: InternalIP}, {address: 203.0.113.12, type: ExternalIP}, {address: 203.0.113.99, type: ExternalIP}]}"),
            routes: ["10.244.20.0/26 via 203.0.113.12 dev tunl0 [ipip]", "10.245.20.0/26 via 10.0.0.12 dev eth0 [cross]", "10.246.20.0/26 via 10.0.0.12 dev eth0 [flat]"],
            problems: &["next-hop-sources-disagree: node \"node-b\": BGP address 10.0.0.12 has no prefix length, so Felix routes through the tunnel via its node address 203.0.113.12 and natively via 10.0.0.12; routewarden does the same"],
        },
        Case {
            // Felix programs no tunnel route (ipip_mgr.go route returns nil); routewarden keeps
            // the node reachable via the BGP address, BIRD's next hop, and says so.
            name: "bare BGP address and no other address",
            node_b: node_b!("{bgp: {ipv4Address: 10.0.0.12}}"),
            routes: ["10.244.20.0/26 via 10.0.0.12 dev tunl0 [ipip]", "10.245.20.0/26 via 10.0.0.12 dev eth0 [cross]", "10.246.20.0/26 via 10.0.0.12 dev eth0 [flat]"],
            problems: &["next-hop-sources-disagree: node \"node-b\": BGP address 10.0.0.12 has no prefix length and the node has no IPv4 InternalIP or ExternalIP, so Felix programs no tunnel route to it; routewarden routes via 10.0.0.12"],
        },
        Case {
            // Other subnet by the bare address: CrossSubnet tunnels too, via the InternalIP.
            name: "bare BGP address in another subnet",
            node_b: node_b!("{bgp: {ipv4Address: 10.0.3.12}, addresses: [{address: 10.0.5.12, type: InternalIP}]}"),
            routes: ["10.244.20.0/26 via 10.0.5.12 dev tunl0 [ipip]", "10.245.20.0/26 via 10.0.5.12 dev tunl0 [cross]", "10.246.20.0/26 via 10.0.3.12 dev eth0 [flat]"],
            problems: &["next-hop-sources-disagree: node \"node-b\": BGP address 10.0.3.12 has no prefix length, so Felix routes through the tunnel via its node address 10.0.5.12 and natively via 10.0.3.12; routewarden does the same"],
        },
        Case {
            name: "no BGP address: InternalIP everywhere, and never same-subnet",
            node_b: node_b!("{addresses: [{address: 10.0.0.12, type: InternalIP}]}"),
            routes: ["10.244.20.0/26 via 10.0.0.12 dev tunl0 [ipip]", "10.245.20.0/26 via 10.0.0.12 dev eth0 [cross]", "10.246.20.0/26 via 10.0.0.12 dev eth0 [flat]"],
            problems: &[],
        },
        Case {
            // A core Node: the annotation is the BGP address, status.addresses the rest.
            name: "Kubernetes Node, bare annotation",
            node_b: "apiVersion: v1\nkind: Node\nmetadata: {name: node-b, annotations: {projectcalico.org/IPv4Address: 10.0.0.12}}\nstatus: {addresses: [{type: InternalIP, address: 10.0.5.12}]}\n",
            routes: ["10.244.20.0/26 via 10.0.5.12 dev tunl0 [ipip]", "10.245.20.0/26 via 10.0.0.12 dev eth0 [cross]", "10.246.20.0/26 via 10.0.0.12 dev eth0 [flat]"],
            problems: &["next-hop-sources-disagree: node \"node-b\": BGP address 10.0.0.12 has no prefix length, so Felix routes through the tunnel via its node address 10.0.5.12 and natively via 10.0.0.12; routewarden does the same"],
        },
    ];
    for c in &cases {
        let (cluster, errors) = Cluster::from_yaml_str(&with_base(&format!("{}{B_BLOCKS}", c.node_b))).unwrap();
        assert_eq!(errors, vec![], "{}", c.name);
        let d = desired_routes(&cluster, "node-a", &ALL.iter().copied().collect(), &RouteDevices::default());
        let got: Vec<String> = d.routes.iter().filter(|r| r.dst.to_string().contains(".20.0/26")).map(line).collect();
        assert_eq!(got, c.routes, "{}", c.name);
        let problems: Vec<String> = d.problems.iter().map(|p| format!("{}: {p}", p.code())).collect();
        assert_eq!(problems, c.problems, "{}", c.name);
        // The problem carries both addresses as fields too (for JSON and metrics).
        if let Some(RouteProblem::NextHopSourcesDisagree { node, bgp_address, .. }) = d.problems.first() {
            assert_eq!((node.as_str(), bgp_address.is_ipv4()), ("node-b", true), "{}", c.name);
        }
    }
}

/// node-a's plan in `role` for BASE plus `extra`, with `programClusterRoutes` of the `default`
/// FelixConfiguration and BGPConfiguration set to `felix` and `bgp` (protocol 201, main table).
fn plan_of(extra: &str, role: routewarden::ownership::Role, felix: &str, bgp: &str) -> routewarden::plan::Plan {
    use routewarden::datastore::Snapshot;
    use routewarden::ownership::OwnershipConfig;
    use routewarden::plan::{plan, PlanConfig};
    let text = format!(
        "{}\n---\napiVersion: projectcalico.org/v3\nkind: FelixConfiguration\nmetadata: {{name: default}}\nspec: {{programClusterRoutes: {felix}}}\n---\napiVersion: projectcalico.org/v3\nkind: BGPConfiguration\nmetadata: {{name: default}}\nspec: {{programClusterRoutes: {bgp}}}\n",
        with_base(extra)
    );
    let (cluster, errors) = Cluster::from_yaml_str(&text).unwrap();
    assert_eq!(errors, vec![]);
    let snapshot = Snapshot { cluster: std::sync::Arc::new(cluster), object_errors: vec![], load_errors: vec![], inputs: 1, settled: true };
    let config = PlanConfig {
        node: "node-a".into(),
        ownership: OwnershipConfig { role, ..Default::default() },
        devices: RouteDevices::default(),
        protocol: 201,
        table: 254,
    };
    plan(&snapshot, &config, &BTreeSet::new(), &[])
}

/// The audit's expectations per writer: Felix's follow both rules; BIRD's next hop is the
/// peer's BGP address (bare or not) and BIRD has no route for a tunnel address.
#[test]
fn audit_expectations_follow_each_writer() {
    use routewarden::ownership::Role;
    use routewarden::vocabulary::Writer;

    let extra = concat!(
        node_b!("{bgp: {ipv4Address: 10.0.0.12, ipv4IPIPTunnelAddr: 10.244.30.5}, addresses: [{address: 10.0.5.12, type: InternalIP}]}"),
        "---\napiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {name: 10-244-20-0-26}\nspec: {cidr: 10.244.20.0/26, affinity: \"host:node-b\"}\n",
    );
    let expected_for = |felix: &str, bgp: &str| -> Vec<(Writer, String)> {
        let p = plan_of(extra, Role::Audit, felix, bgp);
        p.expected.values().filter(|e| e.route.class == PoolClass::Ipip).map(|e| (e.owner, line(&e.route))).collect()
    };
    // Felix programs IPIP: tunnel gateway from extractNodeAddress, and the tunnel address.
    assert_eq!(
        expected_for("Enabled", "Disabled"),
        [
            (Writer::Felix, "blackhole 10.244.10.0/26 [ipip]".to_owned()),
            (Writer::Felix, "10.244.20.0/26 via 10.0.5.12 dev tunl0 [ipip]".into()),
            (Writer::Felix, "10.244.30.0/26 via 10.0.1.13 dev tunl0 [ipip]".into()),
            (Writer::Felix, "10.244.30.5/32 via 10.0.5.12 dev tunl0 [ipip]".into()),
            (Writer::Felix, "10.245.30.0/26 via 10.0.1.13 dev tunl0 [cross]".into()),
        ]
    );
    // BIRD programs IPIP: via the BGP peer address, and no tunnel-address /32.
    assert_eq!(
        expected_for("EnabledNoEncapOnly", "EnabledIPIPOnly"),
        [
            (Writer::Bird, "blackhole 10.244.10.0/26 [ipip]".to_owned()),
            (Writer::Bird, "10.244.20.0/26 via 10.0.0.12 dev tunl0 [ipip]".into()),
            (Writer::Bird, "10.244.30.0/26 via 10.0.1.13 dev tunl0 [ipip]".into()),
            (Writer::Bird, "10.245.30.0/26 via 10.0.1.13 dev tunl0 [cross]".into()),
        ]
    );
}

/// The agent in the netns lab (node-a, `--role felix`): node-b's IPIP tunnel address moved
/// into node-d's block of the IPIP Always pool, and node-b's BGP address written bare with
/// another InternalIP. The kernel gets the tunnel-address /32 and node-b's tunnel routes via
/// the InternalIP; moving the address home removes the /32, and a BGP address with its
/// prefix moves the gateway back, each with exactly one write.
#[test]
fn both_rules_reach_the_kernel_in_a_netns() {
    if skip_unless_root("both_rules_reach_the_kernel_in_a_netns") {
        return;
    }
    let lab = lab();
    let dir = copy_examples();
    let nodes = dir.path().join("nodes.yaml");
    let original = std::fs::read_to_string(&nodes).unwrap();
    let edit = |from: &str, to: &str, text: &str| {
        let out = text.replace(from, to);
        assert_ne!(out, text, "{from}");
        out
    };
    let moved = edit("projectcalico.org/IPv4IPIPTunnelAddr: 10.244.20.0", "projectcalico.org/IPv4IPIPTunnelAddr: 10.245.40.9", &original);
    let moved = edit("projectcalico.org/IPv4Address: 10.0.0.12/24", "projectcalico.org/IPv4Address: 10.0.0.12", &moved);
    let moved = edit("- {type: InternalIP, address: 10.0.0.12}", "- {type: InternalIP, address: 10.0.5.12}", &moved);
    std::fs::write(&nodes, &moved).unwrap();

    let _agent = Agent::start(&lab, "node-a", dir.path(), &["--settle-period", "2"]);
    wait_ready(&lab, "node-a");
    // NODE_A_IPIP with node-b's IPIP Always block through its InternalIP and the /32 for its
    // tunnel address (node-d's block would carry it to node-d otherwise). The CrossSubnet
    // block still goes natively via the bare BGP address (same subnet by it).
    let want: Vec<String> = NODE_A_IPIP
        .iter()
        .map(|r| r.replace("10.245.20.0/26 via 10.0.0.12 dev tunl0", "10.245.20.0/26 via 10.0.5.12 dev tunl0"))
        .chain(["10.245.40.9 via 10.0.5.12 dev tunl0 metric 1024 onlink".to_owned()])
        .collect();
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    assert_eq!(sorted(routes(&lab, "node-a", "80")), sorted(want.clone()));
    let m = metrics(&lab, "node-a");
    assert_eq!(m.value(r#"routewarden_route_problems{code="next-hop-sources-disagree"}"#), 1);
    assert_eq!(m.value(r#"routewarden_route_operations_total{op="replace",result="ok"}"#), 8);
    // Traffic to the tunnel address takes the /32, not node-d's block route.
    let get = lab.ip("node-a", &["route", "get", "10.245.40.9"]).unwrap();
    assert!(get.starts_with("10.245.40.9 via 10.0.5.12 dev tunl0"), "{get}");

    // The address goes home (node-b's own block): its /32 goes, nothing else is written.
    let home = edit("projectcalico.org/IPv4IPIPTunnelAddr: 10.245.40.9", "projectcalico.org/IPv4IPIPTunnelAddr: 10.244.20.0", &moved);
    std::fs::write(&nodes, &home).unwrap();
    wait_for("the tunnel-address /32 removed", Duration::from_secs(15), || {
        (!routes(&lab, "node-a", "80").iter().any(|r| r.starts_with("10.245.40.9 "))).then_some(())
    });
    let m = metrics(&lab, "node-a");
    assert_eq!(m.value(r#"routewarden_route_operations_total{op="delete",result="ok"}"#), 1);
    assert_eq!(m.value(r#"routewarden_route_operations_total{op="replace",result="ok"}"#), 8);

    // The BGP address with its prefix again: one replace moves the gateway back.
    std::fs::write(&nodes, edit("projectcalico.org/IPv4Address: 10.0.0.12\n", "projectcalico.org/IPv4Address: 10.0.0.12/24\n", &home)).unwrap();
    wait_for("node-b's tunnel routes via its BGP address", Duration::from_secs(15), || {
        routes(&lab, "node-a", "80").iter().any(|r| r.starts_with("10.245.20.0/26 via 10.0.0.12 dev tunl0")).then_some(())
    });
    assert_eq!(routes(&lab, "node-a", "80"), NODE_A_IPIP);
    let m = metrics(&lab, "node-a");
    assert_eq!(m.value(r#"routewarden_route_operations_total{op="replace",result="ok"}"#), 9);
    assert_eq!(m.value(r#"routewarden_route_operations_total{op="delete",result="ok"}"#), 1);
    assert!(!m.has(r#"routewarden_route_problems{code="next-hop-sources-disagree"}"#), "the problem is gone");
}

/// WireGuard peers: node-a and node-b have WireGuard addresses, node-c has
/// none. BIRD's kernel filter rejects routes via node-b (confd `processWireguardPeerFilter`),
/// so the audit expects none from BIRD and lists them as WireGuard routing; Felix's route
/// managers program their main-table routes to node-b anyway (`route_mgr.go` `updateRoutes`
/// has no WireGuard case; WireGuard steers traffic with its own table and rule), and so does
/// routewarden in Felix's role; routewarden in BIRD's role leaves them out as BIRD would.
#[test]
fn wireguard_peers_felix_keeps_its_routes_bird_leaves_them_to_wireguard() {
    use routewarden::ownership::Role;
    use routewarden::plan::Plan;
    use routewarden::vocabulary::Writer;

    let extra = r#"apiVersion: projectcalico.org/v3
kind: Node
metadata: {name: node-a}
spec: {bgp: {ipv4Address: 10.0.0.11/24, ipv4IPIPTunnelAddr: 10.244.10.1}, wireguard: {interfaceIPv4Address: 10.244.10.2}}
---
apiVersion: projectcalico.org/v3
kind: Node
metadata: {name: node-b}
spec: {bgp: {ipv4Address: 10.0.0.12/24}, wireguard: {interfaceIPv4Address: 10.244.20.2}}
---
apiVersion: crd.projectcalico.org/v1
kind: IPAMBlockList
items:
  - metadata: {name: 10-244-20-0-26}
    spec: {cidr: 10.244.20.0/26, affinity: "host:node-b"}
  - metadata: {name: 10-246-20-0-26}
    spec: {cidr: 10.246.20.0/26, affinity: "host:node-b"}
  - metadata: {name: 10-246-30-0-26}
    spec: {cidr: 10.246.30.0/26, affinity: "host:node-c"}
"#;
    let plan_for = |role: Role, felix: &str, bgp: &str| plan_of(extra, role, felix, bgp);
    let wg = |p: &Plan| -> Vec<String> { p.audit_scope.wireguard.iter().map(|w| format!("{} {} {}", w.prefix, w.peer, w.bgp_address)).collect() };
    let expected = |p: &Plan| -> Vec<(Writer, String)> {
        p.expected
            .values()
            .filter(|e| e.route.dst.to_string().contains(".20.0/26") || e.route.dst.to_string().starts_with("10.246.30"))
            .map(|e| (e.owner, line(&e.route)))
            .collect()
    };

    // Audit, the 3.33 pair (Felix IPIP, BIRD no-encap): Felix's IPIP route to node-b is expected;
    // BIRD's no-encap route to node-b is not (WireGuard), to node-c it is.
    let p = plan_for(Role::Audit, "EnabledIPIPOnly", "EnabledNoEncapOnly");
    assert_eq!(
        expected(&p),
        [
            (Writer::Felix, "10.244.20.0/26 via 10.0.0.12 dev tunl0 [ipip]".to_owned()),
            (Writer::Bird, "10.246.30.0/26 via 10.0.1.13 dev eth0 [flat]".to_owned()),
        ]
    );
    assert_eq!(wg(&p), ["10.246.20.0/26 node-b 10.0.0.12"]);

    // routewarden in Felix's role with Felix programming both: it programs node-b's routes.
    let p = plan_for(Role::Felix, "Enabled", "Disabled");
    let desired: Vec<String> = p.desired.values().filter(|r| r.dst.to_string().contains(".20.0/26")).map(|r| line(r)).collect();
    assert_eq!(desired, ["10.244.20.0/26 via 10.0.0.12 dev tunl0 [ipip]", "10.246.20.0/26 via 10.0.0.12 dev eth0 [flat]"]);
    assert!(wg(&p).is_empty(), "nobody in BIRD's place: {:?}", wg(&p));

    // routewarden in BIRD's role (no-encap): node-b's no-encap route is WireGuard's, node-c's is ours.
    let p = plan_for(Role::Bird, "EnabledIPIPOnly", "EnabledNoEncapOnly");
    let desired: Vec<String> = p.desired.values().filter(|r| r.path != RoutePath::Blackhole).map(|r| line(r)).collect();
    assert_eq!(desired, ["10.246.30.0/26 via 10.0.1.13 dev eth0 [flat]"]);
    assert_eq!(wg(&p), ["10.246.20.0/26 node-b 10.0.0.12"]);

    // Without a WireGuard address on node-a, nothing is WireGuard's (confd emits no reject):
    // BIRD's route to node-b is expected again.
    let no_local_wg = extra.replacen(", wireguard: {interfaceIPv4Address: 10.244.10.2}", "", 1);
    assert_ne!(no_local_wg, extra);
    let p = plan_of(&no_local_wg, Role::Audit, "EnabledIPIPOnly", "EnabledNoEncapOnly");
    assert!(wg(&p).is_empty());
    assert!(expected(&p).contains(&(Writer::Bird, "10.246.20.0/26 via 10.0.0.12 dev eth0 [flat]".to_owned())), "{:?}", expected(&p));
}
