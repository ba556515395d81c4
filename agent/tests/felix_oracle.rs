//! An oracle for the Felix side of route computation: for one cluster, the `ip route` lines
//! Felix's IPIP and no-encap route managers program on each node, written by hand from Felix's
//! code paths (as `../shared/reference/calico-cluster-routes.md` §2 quotes them, with line
//! numbers of `projectcalico/calico` master 87c15906f20c), and compared with what
//! `routes::desired_routes` computes. Nothing here calls routewarden to build an expectation;
//! routewarden's routes are only rendered in Felix's `ip route` shape to be compared.
//!
//! The paths the expectations follow:
//! - `felix/calc/l3_route_resolver.go` `routesFromBlock` (~L655–691): a block yields a route
//!   to its `Host()` (none without affinity) and one /32 (/128) per non-affine allocation to
//!   the allocation's node (`NonAffineAllocations`, `model/block.go` ~L234); an allocation with
//!   no recorded node gets "Unable to create route for IP; the node it belongs to was not
//!   recorded in IPAM" and no route.
//! - `OnResourceUpdate` (~L335–440): a node's address and subnet come from
//!   `bgp.ipv4Address`/`ipv6Address`; without a BGP address, from its InternalIP, whose CIDR
//!   is then the /32 of the bare address.
//! - `flush` (~L693–895): the innermost block entry names the destination node (a borrowed
//!   /32 overrides the block around it), `DstNodeIp` is that node's address of the family (empty
//!   when it has none), `SameSubnet = poolAllowsCrossSubnet && nodeInOurSubnet(dst)` (L885;
//!   `nodeInOurSubnet` ~L900: the local node's CIDR contains the remote node's address).
//! - `felix/dataplane/linux/route_mgr.go`: a manager keeps `REMOTE_WORKLOAD` updates of its pool
//!   type (`OnUpdate`); a `LOCAL_WORKLOAD` update that is not an exact /32 or /128 is a local
//!   IPAM block and becomes a blackhole (`routeIsLocalBlock` ~L266), so an own /32 block and an
//!   IP this node borrowed get nothing; `updateRoutes` (~L372) takes `noEncapRoute` (~L444:
//!   via `DstNodeIp` on the parent NIC, for the no-encap manager or a same-subnet update) or
//!   else the manager's tunnel route, or else skips the route ("Not enough information to
//!   program route").
//! - `ipip_mgr.go` `tunnelRoute` (~L168): `TargetTypeOnLink` via the node's IPv4 on `tunl0`;
//!   `routetable/defs.go`: onlink and no-encap targets carry `RTNH_F_ONLINK`, blackholes are
//!   `RTN_BLACKHOLE`.
//! - Protocol 80 (`calculateRouteProtocol`, route_mgr.go L137, `deviceRouteProtocol` default
//!   3); no priority, so metric 0 on IPv4 (not printed) and 1024 on IPv6 (`route_table.go`
//!   `normalizeRouteKey` L1287). The FV tests assert exactly `blackhole 10.65.0.0/26 proto 80`
//!   and `10.65.1.0/26 via <ip> dev eth0 proto 80 onlink` (`felix/fv/routing_test.go` ~L385,
//!   ~L425–432).
//!
//! Left out: the IPIP MTU attribute (inferred in the reference, not computed by routewarden),
//! VXLAN (always Felix's, never routewarden's), and tunnel-address /32s.

use routewarden::model::Cluster;
use routewarden::routes::{desired_routes, routable_classes, ClusterRoute, RouteDevices};
use routewarden::vocabulary::RoutePath;

/// Nodes: node-a and node-b in 192.168.10.0/24 with IPv6; node-c in another subnet, IPv4
/// only; node-d without a BGP address, known by its InternalIP (in node-a's subnet).
/// Pools: IPIP CrossSubnet, IPIP Always, no-encap v4 (/26 blocks and a /32-block pool),
/// no-encap v6.
const CLUSTER: &str = r#"
apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: ipip-cross}
spec: {cidr: 10.244.0.0/16, ipipMode: CrossSubnet, vxlanMode: Never}
---
apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: ipip-always}
spec: {cidr: 10.245.0.0/16, ipipMode: Always, vxlanMode: Never}
---
apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: flat}
spec: {cidr: 10.246.0.0/16, ipipMode: Never, vxlanMode: Never}
---
apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: flat-32}
spec: {cidr: 10.247.0.0/24, blockSize: 32}
---
apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: flat-v6}
spec: {cidr: "fd00:10:244::/48", blockSize: 122}
---
apiVersion: projectcalico.org/v3
kind: Node
metadata: {name: node-a}
spec: {bgp: {ipv4Address: 192.168.10.11/24, ipv6Address: "fd00:10::11/64"}}
---
apiVersion: projectcalico.org/v3
kind: Node
metadata: {name: node-b}
spec: {bgp: {ipv4Address: 192.168.10.12/24, ipv6Address: "fd00:10::12/64"}}
---
apiVersion: projectcalico.org/v3
kind: Node
metadata: {name: node-c}
spec: {bgp: {ipv4Address: 192.168.20.13/24}}
---
apiVersion: projectcalico.org/v3
kind: Node
metadata: {name: node-d}
spec: {addresses: [{address: 192.168.10.14, type: InternalIP}]}
---
apiVersion: crd.projectcalico.org/v1
kind: IPAMBlockList
items:
  # node-a's block; ordinal 5 (10.244.1.5) borrowed by node-b.
  - metadata: {name: 10-244-1-0-26}
    spec: {cidr: 10.244.1.0/26, affinity: "host:node-a", allocations: [0, null, null, null, null, 1], attributes: [{secondary: {node: node-a}}, {secondary: {node: node-b}}]}
  # node-b's block; 10.244.2.7 borrowed by node-c, 10.244.2.9 by node-a.
  - metadata: {name: 10-244-2-0-26}
    spec: {cidr: 10.244.2.0/26, affinity: "host:node-b", allocations: [0, null, null, null, null, null, null, 1, null, 2], attributes: [{secondary: {node: node-b}}, {secondary: {node: node-c}}, {secondary: {node: node-a}}]}
  - metadata: {name: 10-244-3-0-26}
    spec: {cidr: 10.244.3.0/26, affinity: "host:node-c"}
  - metadata: {name: 10-244-4-0-26}
    spec: {cidr: 10.244.4.0/26, affinity: "host:node-d"}
  - metadata: {name: 10-245-1-0-26}
    spec: {cidr: 10.245.1.0/26, affinity: "host:node-a"}
  - metadata: {name: 10-245-2-0-26}
    spec: {cidr: 10.245.2.0/26, affinity: "host:node-b"}
  - metadata: {name: 10-245-3-0-26}
    spec: {cidr: 10.245.3.0/26, affinity: "host:node-c"}
  - metadata: {name: 10-246-1-0-26}
    spec: {cidr: 10.246.1.0/26, affinity: "host:node-a"}
  - metadata: {name: 10-246-2-0-26}
    spec: {cidr: 10.246.2.0/26, affinity: "host:node-b"}
  - metadata: {name: 10-246-3-0-26}
    spec: {cidr: 10.246.3.0/26, affinity: "host:node-c"}
  # No affinity: 10.246.9.3 is node-b's; 10.246.9.4 records no node.
  - metadata: {name: 10-246-9-0-26}
    spec: {cidr: 10.246.9.0/26, allocations: [null, null, null, 0, 1], attributes: [{secondary: {node: node-b}}, {handle_id: orphan}]}
  # A single-address block of node-a.
  - metadata: {name: 10-247-0-1-32}
    spec: {cidr: 10.247.0.1/32, affinity: "host:node-a"}
  - metadata: {name: fd00-10-244-0-1---122}
    spec: {cidr: "fd00:10:244:0:1::/122", affinity: "host:node-a"}
  - metadata: {name: fd00-10-244-0-2---122}
    spec: {cidr: "fd00:10:244:0:2::/122", affinity: "host:node-b"}
  - metadata: {name: fd00-10-244-0-3---122}
    spec: {cidr: "fd00:10:244:0:3::/122", affinity: "host:node-c"}
"#;

/// A route computed by routewarden in the shape `ip route` prints a route Felix programmed:
/// protocol 80, IPv4 at metric 0 (not printed), IPv6 at 1024 with `pref medium`, IPv6
/// blackholes on `lo`, host routes without their /32 or /128.
fn felix_shape(r: &ClusterRoute) -> String {
    let v6 = r.dst.addr().is_ipv6();
    let dst = if r.dst.prefix_len() == r.dst.max_prefix_len() { r.dst.addr().to_string() } else { r.dst.to_string() };
    let (metric, pref) = if v6 { (" metric 1024", " pref medium") } else { ("", "") };
    match r.path {
        RoutePath::Blackhole => format!("blackhole {dst}{} proto 80{metric}{pref}", if v6 { " dev lo" } else { "" }),
        RoutePath::Tunnel | RoutePath::HostNic => {
            let gw = r.gateway.map_or_else(|| "<none>".to_owned(), |g| g.to_string());
            let dev = r.device.as_deref().unwrap_or("<none>");
            format!("{dst} via {gw} dev {dev} proto 80{metric} onlink{pref}")
        }
    }
}

/// routewarden's routes of every routable class (IPIP and no-encap, as Felix programs them
/// when it owns both) for `node`, in Felix's shape: (IPv4 lines, IPv6 lines), each sorted.
fn computed(node: &str) -> (Vec<String>, Vec<String>) {
    let (cluster, errors) = Cluster::from_yaml_str(CLUSTER).unwrap();
    assert_eq!(errors, vec![]);
    let d = desired_routes(&cluster, node, &routable_classes(), &RouteDevices::default());
    let (mut v4, mut v6): (Vec<String>, Vec<String>) = (Vec::new(), Vec::new());
    for r in &d.routes {
        if r.dst.addr().is_ipv6() { &mut v6 } else { &mut v4 }.push(felix_shape(r));
    }
    v4.sort();
    v6.sort();
    (v4, v6)
}

fn sorted(lines: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = lines.iter().map(|l| (*l).to_owned()).collect();
    v.sort();
    v
}

/// node-a (192.168.10.11/24): CrossSubnet natively to node-b and node-d (in its subnet),
/// through the tunnel to node-c; IPIP Always through the tunnel to everyone, same subnet or
/// not (`poolAllowsCrossSubnet` false); no-encap on eth0 to everyone; own blocks blackholed.
#[test]
fn node_a_felix_routes() {
    let (v4, v6) = computed("node-a");
    assert_eq!(
        v4,
        sorted(&[
            // Own CrossSubnet block: LOCAL_WORKLOAD, not exact -> blackhole.
            "blackhole 10.244.1.0/26 proto 80",
            // Own block's IP borrowed by node-b: the /32's block entry names node-b
            // (REMOTE_WORKLOAD), same subnet -> no-encap route on the parent NIC.
            "10.244.1.5 via 192.168.10.12 dev eth0 proto 80 onlink",
            "10.244.2.0/26 via 192.168.10.12 dev eth0 proto 80 onlink",
            // node-b's block, IP borrowed by node-c (other subnet): tunnel to node-c.
            "10.244.2.7 via 192.168.20.13 dev tunl0 proto 80 onlink",
            // (10.244.2.9 is borrowed by node-a itself: a LOCAL_WORKLOAD /32, no route.)
            "10.244.3.0/26 via 192.168.20.13 dev tunl0 proto 80 onlink",
            // node-d's address is its InternalIP 192.168.10.14, inside node-a's /24.
            "10.244.4.0/26 via 192.168.10.14 dev eth0 proto 80 onlink",
            "blackhole 10.245.1.0/26 proto 80",
            "10.245.2.0/26 via 192.168.10.12 dev tunl0 proto 80 onlink",
            "10.245.3.0/26 via 192.168.20.13 dev tunl0 proto 80 onlink",
            "blackhole 10.246.1.0/26 proto 80",
            "10.246.2.0/26 via 192.168.10.12 dev eth0 proto 80 onlink",
            // No-encap to another subnet is still on the parent NIC (no tunnel route).
            "10.246.3.0/26 via 192.168.20.13 dev eth0 proto 80 onlink",
            // Block without affinity: no block route, a /32 for the allocation with a node;
            // none for 10.246.9.4 (no node recorded).
            "10.246.9.3 via 192.168.10.12 dev eth0 proto 80 onlink",
            // (Own /32 block 10.247.0.1: exact, so no blackhole.)
        ])
    );
    assert_eq!(
        v6,
        sorted(&[
            "blackhole fd00:10:244:0:1::/122 dev lo proto 80 metric 1024 pref medium",
            "fd00:10:244:0:2::/122 via fd00:10::12 dev eth0 proto 80 metric 1024 onlink pref medium",
            // (fd00:10:244:0:3::/122 is node-c's, which has no IPv6 address: DstNodeIp empty,
            // no route.)
        ])
    );
}

/// node-b (192.168.10.12/24): the mirror of node-a, plus the /32 to the IP node-a borrowed
/// from node-b's block and the route to node-a's single-address block.
#[test]
fn node_b_felix_routes() {
    let (v4, v6) = computed("node-b");
    assert_eq!(
        v4,
        sorted(&[
            "10.244.1.0/26 via 192.168.10.11 dev eth0 proto 80 onlink",
            // (10.244.1.5 is node-b's own borrowed IP: no route.)
            "blackhole 10.244.2.0/26 proto 80",
            // Inside node-b's own blackholed block, the IPs other nodes borrowed are routed.
            "10.244.2.7 via 192.168.20.13 dev tunl0 proto 80 onlink",
            "10.244.2.9 via 192.168.10.11 dev eth0 proto 80 onlink",
            "10.244.3.0/26 via 192.168.20.13 dev tunl0 proto 80 onlink",
            "10.244.4.0/26 via 192.168.10.14 dev eth0 proto 80 onlink",
            "10.245.1.0/26 via 192.168.10.11 dev tunl0 proto 80 onlink",
            "blackhole 10.245.2.0/26 proto 80",
            "10.245.3.0/26 via 192.168.20.13 dev tunl0 proto 80 onlink",
            "10.246.1.0/26 via 192.168.10.11 dev eth0 proto 80 onlink",
            "blackhole 10.246.2.0/26 proto 80",
            "10.246.3.0/26 via 192.168.20.13 dev eth0 proto 80 onlink",
            // (10.246.9.3 is node-b's own: LOCAL_WORKLOAD /32, no route.)
            // A remote /32 block is REMOTE_WORKLOAD like any block.
            "10.247.0.1 via 192.168.10.11 dev eth0 proto 80 onlink",
        ])
    );
    assert_eq!(
        v6,
        sorted(&[
            "fd00:10:244:0:1::/122 via fd00:10::11 dev eth0 proto 80 metric 1024 onlink pref medium",
            "blackhole fd00:10:244:0:2::/122 dev lo proto 80 metric 1024 pref medium",
        ])
    );
}

/// node-c (192.168.20.13/24), alone in its subnet: every IPIP route, CrossSubnet or Always,
/// goes through the tunnel; no-encap stays on eth0. Its IPv6 view: see
/// [`node_without_ipv6_address_programs_only_its_own_ipv6_blackholes`].
#[test]
fn node_c_felix_routes_ipv4() {
    let (v4, _) = computed("node-c");
    assert_eq!(
        v4,
        sorted(&[
            "10.244.1.0/26 via 192.168.10.11 dev tunl0 proto 80 onlink",
            "10.244.1.5 via 192.168.10.12 dev tunl0 proto 80 onlink",
            "10.244.2.0/26 via 192.168.10.12 dev tunl0 proto 80 onlink",
            // (10.244.2.7 is node-c's own borrowed IP: no route.)
            "10.244.2.9 via 192.168.10.11 dev tunl0 proto 80 onlink",
            "blackhole 10.244.3.0/26 proto 80",
            "10.244.4.0/26 via 192.168.10.14 dev tunl0 proto 80 onlink",
            "10.245.1.0/26 via 192.168.10.11 dev tunl0 proto 80 onlink",
            "10.245.2.0/26 via 192.168.10.12 dev tunl0 proto 80 onlink",
            "blackhole 10.245.3.0/26 proto 80",
            "10.246.1.0/26 via 192.168.10.11 dev eth0 proto 80 onlink",
            "10.246.2.0/26 via 192.168.10.12 dev eth0 proto 80 onlink",
            "blackhole 10.246.3.0/26 proto 80",
            "10.246.9.3 via 192.168.10.12 dev eth0 proto 80 onlink",
            "10.247.0.1 via 192.168.10.11 dev eth0 proto 80 onlink",
        ])
    );
}

/// node-d, known only by its InternalIP: its CIDR is the /32 of that address, so
/// `nodeInOurSubnet` is never true and CrossSubnet goes through the tunnel even to node-a and
/// node-b on the same wire; no IPv6 address, see
/// [`node_without_ipv6_address_programs_only_its_own_ipv6_blackholes`].
#[test]
fn node_d_felix_routes_ipv4() {
    let (v4, _) = computed("node-d");
    assert_eq!(
        v4,
        sorted(&[
            "10.244.1.0/26 via 192.168.10.11 dev tunl0 proto 80 onlink",
            "10.244.1.5 via 192.168.10.12 dev tunl0 proto 80 onlink",
            "10.244.2.0/26 via 192.168.10.12 dev tunl0 proto 80 onlink",
            "10.244.2.7 via 192.168.20.13 dev tunl0 proto 80 onlink",
            "10.244.2.9 via 192.168.10.11 dev tunl0 proto 80 onlink",
            "10.244.3.0/26 via 192.168.20.13 dev tunl0 proto 80 onlink",
            "blackhole 10.244.4.0/26 proto 80",
            "10.245.1.0/26 via 192.168.10.11 dev tunl0 proto 80 onlink",
            "10.245.2.0/26 via 192.168.10.12 dev tunl0 proto 80 onlink",
            "10.245.3.0/26 via 192.168.20.13 dev tunl0 proto 80 onlink",
            "10.246.1.0/26 via 192.168.10.11 dev eth0 proto 80 onlink",
            "10.246.2.0/26 via 192.168.10.12 dev eth0 proto 80 onlink",
            "10.246.3.0/26 via 192.168.20.13 dev eth0 proto 80 onlink",
            "10.246.9.3 via 192.168.10.12 dev eth0 proto 80 onlink",
            "10.247.0.1 via 192.168.10.11 dev eth0 proto 80 onlink",
        ])
    );
}

/// On a node without an address of a family, Felix's manager of that family has no parent
/// device (`route_mgr.go`: the data interface is the one holding the local node's address;
/// `noEncapRoute` ~L444 needs it) and no-encap has no tunnel route, so every remote route of
/// the family is skipped ("Not enough information to program route"); only its own blocks'
/// blackholes, which need no device, are programmed.
#[test]
fn node_without_ipv6_address_programs_only_its_own_ipv6_blackholes() {
    let (_, v6) = computed("node-c");
    assert_eq!(v6, sorted(&["blackhole fd00:10:244:0:3::/122 dev lo proto 80 metric 1024 pref medium"]));
    let (_, v6) = computed("node-d");
    assert_eq!(v6, Vec::<String>::new());
}
