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

/// The key of an audit expectation: class, writer, destination. Expectations in key order
/// are per routable class, each writer's routes in destination order.
pub type ExpectationKey = (PoolClass, Writer, IpNet);

/// The audit's expectations by [`ExpectationKey`], in a map whose copies share what did not
/// change (the plan's, patched where routes changed).
pub type Expectations = crate::model::SharedMap<ExpectationKey, ExpectedRoute>;

/// A class's writers with the protocol each writes (`Err`: nobody writes it, with the
/// ownership finding's reason when there is one).
type ClassWriters = Result<Vec<(Writer, u8)>, Option<String>>;

/// What one route adds to the audit's view.
pub(super) enum Expectation {
    /// A writer should have it in the kernel.
    Expected(ExpectationKey, ExpectedRoute),
    /// Its class has no writer: the ownership finding's reason.
    Unowned(IpNet, String),
    /// It leads to a WireGuard peer and whoever stands in BIRD's place leaves it to Felix.
    Wireguard(WireguardRoute),
}

/// The audit's rules for one plan, applied route by route ([`ExpectationRules::of_route`]):
/// per routable class, every writer's route (BIRD's as BIRD learns it; none to WireGuard
/// peers from whoever stands in BIRD's place, those are listed apart); for a class nobody
/// programs, its prefixes with the ownership finding's reason. A pure function of the route
/// and of the cluster's Nodes and configuration, the decision and the settings, so that a plan
/// can apply it to the routes that changed alone.
pub(super) struct ExpectationRules<'a> {
    cluster: &'a Cluster,
    config: &'a PlanConfig,
    wireguard_peers: &'a [(String, std::net::IpAddr)],
    /// Per class, its writers with the protocol each writes; or the reason nobody does.
    writers: std::collections::BTreeMap<PoolClass, ClassWriters>,
    /// BIRD's next hop per node (its BGP address of the family), looked up once per node.
    bgp_of: std::collections::HashMap<(Arc<str>, bool), Option<std::net::IpAddr>>,
    /// Whether Felix has an IPIP tunnel gateway for a node, looked up once per node.
    felix_gateway_of: std::collections::HashMap<Arc<str>, bool>,
}

impl<'a> ExpectationRules<'a> {
    pub(super) fn new(cluster: &'a Cluster, config: &'a PlanConfig, decision: &OwnershipDecision, wireguard_peers: &'a [(String, std::net::IpAddr)]) -> Self {
        let writers = routable_classes()
            .into_iter()
            .map(|class| {
                let ws = decision.writers_of(class);
                let entry = if ws.is_empty() {
                    Err(decision.findings.iter().find(|f| f.code() == "unowned" && f.class == Some(class)).map(|f| f.message.clone()))
                } else {
                    Ok(ws.into_iter().map(|w| (w, writer_protocol(w, cluster, &config.node, config.protocol))).collect())
                };
                (class, entry)
            })
            .collect();
        ExpectationRules {
            cluster,
            config,
            wireguard_peers,
            writers,
            bgp_of: std::collections::HashMap::default(),
            felix_gateway_of: std::collections::HashMap::default(),
        }
    }

    /// The writers of `class` and the protocol each writes (none: nobody programs it).
    pub(super) fn writers(&self, class: PoolClass) -> Vec<(Writer, u8)> {
        match self.writers.get(&class) {
            Some(Ok(w)) => w.clone(),
            _ => Vec::new(),
        }
    }

    /// What `route` adds (of writer `only`'s expectations, when given), handed to `out`.
    pub(super) fn of_route(&mut self, route: &Arc<ClusterRoute>, only: Option<Writer>, out: &mut impl FnMut(Expectation)) {
        let (cluster, config) = (self.cluster, self.config);
        let writers = match self.writers.get(&route.class) {
            None | Some(Err(None)) => return,
            Some(Err(Some(reason))) => {
                if route.path != RoutePath::Blackhole {
                    out(Expectation::Unowned(route.dst, reason.clone()));
                }
                return;
            }
            Some(Ok(writers)) => writers,
        };
        let me = cluster.nodes.get(config.node.as_str());
        let v6 = route.dst.addr().is_ipv6();
        for &(w, protocol) in writers.iter().filter(|(w, _)| only.is_none_or(|o| o == *w)) {
            // Whoever takes BIRD's place (BIRD, or routewarden in BIRD's role) leaves routes to
            // WireGuard peers to Felix's WireGuard routing: listed, not expected.
            let bird_like = w == Writer::Bird || (w == Writer::Routewarden && config.ownership.role == Role::Bird);
            if bird_like {
                if let Some(wg) = wireguard_peer_of(route, self.wireguard_peers) {
                    out(Expectation::Wireguard(wg));
                    continue;
                }
            }
            // BIRD learns a family's routes only over BGP sessions of that family, which peer
            // from this node's BGP address of the family (confd's mesh peers are rendered from
            // `Node.spec.bgp.ipv4Address` / `ipv6Address`): without one, it programs none.
            if w == Writer::Bird && me.is_some_and(|n| n.bgp_address(v6).is_none()) {
                continue;
            }
            if w == Writer::Felix && !felix_programs(route, cluster, &mut self.felix_gateway_of) {
                continue;
            }
            let mut route = Arc::clone(route);
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
                let bgp = match &route.origin {
                    RouteOrigin::RemoteBlock { node, .. } | RouteOrigin::BorrowedIp { node, .. } | RouteOrigin::TunnelAddress { node, .. } => {
                        *self.bgp_of.entry((node.clone(), v6)).or_insert_with(|| cluster.nodes.get(node).and_then(|n| n.bgp_address(v6)).map(|a| a.addr()))
                    }
                    RouteOrigin::OwnBlock { .. } => None,
                };
                // A copy only where the next hop differs; else the route is shared.
                if let (Some(bgp), true) = (bgp, route.gateway.is_some_and(|g| Some(g) != bgp)) {
                    Arc::make_mut(&mut route).gateway = Some(bgp);
                }
            }
            out(Expectation::Expected((route.class, w, route.dst), ExpectedRoute { route, owner: w, protocol }));
        }
    }
}

/// The audit's expectations of every route in `routes` ([`ExpectationRules`]), the unowned
/// prefixes (per class in [`routable_classes`] order, then by destination) and the WireGuard
/// routes (sorted, each once).
pub(super) fn audit_expectations<'r>(
    mut rules: ExpectationRules<'_>,
    routes: impl Iterator<Item = &'r Arc<ClusterRoute>>,
) -> (Expectations, Vec<(IpNet, String)>, Vec<WireguardRoute>) {
    // Per class, per writer, every route of the class in destination order: the expectations
    // reach the map in key order, each straight into its chunks (no list of them all).
    let routes: Vec<&Arc<ClusterRoute>> = routes.collect();
    let mut expected = Expectations::new();
    let mut unowned: Vec<(IpNet, String)> = Vec::new();
    let mut wireguard: Vec<WireguardRoute> = Vec::new();
    for class in routable_classes() {
        let writers: Vec<Option<Writer>> = match rules.writers(class) {
            w if w.is_empty() => vec![None],
            w => w.into_iter().map(|(w, _)| Some(w)).collect(),
        };
        for only in writers {
            for route in routes.iter().filter(|r| r.class == class) {
                rules.of_route(route, only, &mut |e| match e {
                    Expectation::Expected(k, e) => expected.push_last(k, e),
                    Expectation::Unowned(dst, reason) => unowned.push((dst, reason)),
                    Expectation::Wireguard(w) => wireguard.push(w),
                });
            }
        }
    }
    wireguard.sort();
    wireguard.dedup();
    (expected, unowned, wireguard)
}
