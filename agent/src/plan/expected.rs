//! The audit's expectations: what every writer of every routable class should have in the
//! kernel, the protocol each writer puts on its routes, and the WireGuard routes whoever stands
//! in BIRD's place leaves to Felix.

use std::sync::Arc;

use ipnet::IpNet;

use super::outputs::{ExpectedRoute, WireguardRoute};
use super::PlanConfig;
use crate::model::Cluster;
use crate::ownership::{OwnershipDecision, Role};
use crate::routes::{routable_classes, ClusterRoute, RouteOrigin};
use crate::vocabulary::{PoolClass, RoutePath, Writer, RTPROT_BIRD, RTPROT_FELIX};

/// The route protocol each writer puts on its routes: Felix 80 (its `deviceRouteProtocol`
/// when set to something other than 3/boot — `felix/dataplane/linux/route_mgr.go`
/// `calculateRouteProtocol`), BIRD 12 (`RTPROT_BIRD`), routewarden its own.
pub fn writer_protocol(writer: Writer, cluster: &Cluster, node: &str, ours: u8) -> u8 {
    match writer {
        Writer::Routewarden => ours,
        Writer::Bird => RTPROT_BIRD,
        Writer::Felix => {
            let configured =
                cluster.felix_for_node(node).and_then(|f| f.device_route_protocol).or_else(|| cluster.felix_default().and_then(|f| f.device_route_protocol));
            match configured {
                None | Some(3) => RTPROT_FELIX,
                Some(p) => p,
            }
        }
    }
}
/// The CIDRs of the decision's IP pools of `class`, sorted, each once.
pub(super) fn pool_cidrs(decision: &OwnershipDecision, class: PoolClass) -> Vec<IpNet> {
    let mut v: Vec<IpNet> = decision.pools.iter().filter(|p| p.class == Some(class)).map(|p| p.cidr).collect();
    v.sort();
    v.dedup();
    v
}
/// The WireGuard peer `route` leads to, if any: the peer's BGP address of the route's family
/// when this node and the peer both have a WireGuard interface address of that family
/// ([`crate::ownership::wireguard_peers`], confd `processWireguardPeerFilter`).
pub(super) fn wireguard_peer_of(route: &ClusterRoute, peers: &[(String, std::net::IpAddr)]) -> Option<WireguardRoute> {
    let node = route.origin.node()?;
    let v6 = route.dst.addr().is_ipv6();
    peers.iter().find(|(name, bgp)| name == node && bgp.is_ipv6() == v6).map(|(name, bgp)| WireguardRoute {
        prefix: route.dst,
        peer: name.clone(),
        bgp_address: *bgp,
    })
}

/// Whether Felix programs `route`, which routewarden computed: false exactly where
/// routewarden routes on purpose where Felix does not (DESIGN.md "Where routewarden differs
/// from Felix"). One place today: a tunnel route to a node whose BGP address has no prefix
/// length and that has no InternalIP or ExternalIP has no gateway in Felix's per-host address
/// message, so Felix's IPIP manager programs none (`felix/dataplane/linux/ipip_mgr.go`
/// `route`: no address, no route); routewarden routes via the bare BGP address and reports
/// `next-hop-sources-disagree`.
fn felix_programs(route: &ClusterRoute, cluster: &Cluster, gateway_of: &mut std::collections::HashMap<Arc<str>, bool>) -> bool {
    if route.path != RoutePath::Tunnel {
        return true;
    }
    match &route.origin {
        RouteOrigin::RemoteBlock { node, .. } | RouteOrigin::BorrowedIp { node, .. } | RouteOrigin::TunnelAddress { node, .. } => {
            *gateway_of.entry(node.clone()).or_insert_with(|| cluster.nodes.get(node).is_some_and(|n| n.tunnel_gateway().is_some()))
        }
        RouteOrigin::OwnBlock { .. } => true,
    }
}

/// The audit's expectations: per routable class, every writer's routes (BIRD's as BIRD learns
/// them; none to WireGuard peers from whoever stands in BIRD's place, those are returned
/// apart); for a class nobody programs, its prefixes with the ownership finding's reason.
pub(super) fn audit_expectations(
    cluster: &Cluster,
    config: &PlanConfig,
    decision: &OwnershipDecision,
    every_class: Vec<ClusterRoute>,
    wireguard_peers: &[(String, std::net::IpAddr)],
) -> (Vec<ExpectedRoute>, Vec<(IpNet, String)>, Vec<WireguardRoute>) {
    let mut unowned = Vec::new();
    let mut wireguard: Vec<WireguardRoute> = Vec::new();
    let me = cluster.nodes.get(config.node.as_str());
    // The plan's one pass over the blocks for every routable class, split by class: a
    // destination is in one pool (overlapping pools are rejected), so each class's routes are
    // those `desired_routes` computes for that class alone. The routes are moved
    // into the expectations of a class's last writer and copied for the others: at 100,000
    // blocks a copy of a route is a few cache misses (its shared names' counts).
    let mut by_class: std::collections::BTreeMap<PoolClass, Vec<ClusterRoute>> = std::collections::BTreeMap::new();
    for r in every_class {
        by_class.entry(r.class).or_default().push(r);
    }
    // Sized for every route of every class from each of its writers: at 100,000 blocks the
    // vector would otherwise be copied a dozen times as it grows, and the plan keeps it.
    let mut expected = Vec::with_capacity(by_class.iter().map(|(c, routes)| routes.len() * decision.writers_of(*c).len()).sum());
    // BIRD's next hop per node (its BGP address of the family), looked up once per node.
    let mut bgp_of: std::collections::HashMap<(Arc<str>, bool), Option<std::net::IpAddr>> = std::collections::HashMap::new();
    // Whether Felix has an IPIP tunnel gateway for a node, looked up once per node.
    let mut felix_gateway_of: std::collections::HashMap<Arc<str>, bool> = std::collections::HashMap::new();
    for class in routable_classes() {
        let routes = by_class.remove(&class).unwrap_or_default();
        let writers = decision.writers_of(class);
        if writers.is_empty() {
            let Some(f) = decision.findings.iter().find(|f| f.code() == "unowned" && f.class == Some(class)) else { continue };
            unowned.extend(routes.iter().filter(|r| r.path != RoutePath::Blackhole).map(|r| (r.dst, f.message.clone())));
            continue;
        }
        let mut routes = Some(routes);
        let last = writers.len() - 1;
        for (i, w) in writers.into_iter().enumerate() {
            let protocol = writer_protocol(w, cluster, &config.node, config.protocol);
            // BIRD learns a family's routes only over BGP sessions of that family, which peer
            // from this node's BGP address of the family (confd's mesh peers are rendered from
            // `Node.spec.bgp.ipv4Address` / `ipv6Address`): without one, it programs none.
            let speaks = |r: &ClusterRoute| w != Writer::Bird || me.is_none_or(|n| n.bgp_address(r.dst.addr().is_ipv6()).is_some());
            // Whoever takes BIRD's place (BIRD, or routewarden in BIRD's role) leaves routes to
            // WireGuard peers to Felix's WireGuard routing: listed, not expected.
            let bird_like = w == Writer::Bird || (w == Writer::Routewarden && config.ownership.role == Role::Bird);
            let these = if i == last { routes.take().unwrap_or_default() } else { routes.clone().unwrap_or_default() };
            for mut route in these {
                if bird_like {
                    if let Some(wg) = wireguard_peer_of(&route, wireguard_peers) {
                        wireguard.push(wg);
                        continue;
                    }
                }
                if !speaks(&route) {
                    continue;
                }
                if w == Writer::Felix && !felix_programs(&route, cluster, &mut felix_gateway_of) {
                    continue;
                }
                if w == Writer::Bird {
                    // BIRD learns routes from the node that exports them, so a node's tunnel
                    // address is not among them: it is an address on that node's tunl0, not a
                    // route BIRD's kernel protocol learns there [inferred from confd's
                    // bird.cfg.template: kernel routes and IPAM blocks are exported].
                    if matches!(route.origin, RouteOrigin::TunnelAddress { .. }) {
                        continue;
                    }
                    // Its next hop is the peer's BGP address, bare or not (confd renders mesh
                    // peers from `spec.bgp.ipv4Address` without its prefix), where Felix's
                    // tunnel routes use `extractNodeAddress`.
                    let v6 = route.dst.addr().is_ipv6();
                    let bgp = match &route.origin {
                        RouteOrigin::RemoteBlock { node, .. } | RouteOrigin::BorrowedIp { node, .. } | RouteOrigin::TunnelAddress { node, .. } => {
                            *bgp_of.entry((node.clone(), v6)).or_insert_with(|| cluster.nodes.get(node).and_then(|n| n.bgp_address(v6)).map(|a| a.addr()))
                        }
                        RouteOrigin::OwnBlock { .. } => None,
                    };
                    if let (Some(bgp), true) = (bgp, route.gateway.is_some()) {
                        route.gateway = Some(bgp);
                    }
                }
                expected.push(ExpectedRoute { route, owner: w, protocol });
            }
        }
    }
    wireguard.sort();
    wireguard.dedup();
    (expected, unowned, wireguard)
}
