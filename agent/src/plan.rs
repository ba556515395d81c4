//! The plan: the pure step from a datastore snapshot to everything the dataplane, the audit,
//! the forwarding watch and the metrics need. No I/O; unit-tested. The app (`app/`) runs it
//! on every snapshot and hands its parts to the handlers.
//!
//! ```text
//! Snapshot ─> ownership::decide ─> classes routewarden programs ─> routes::desired_routes
//!                    │                                                    │
//!                    ├─> OwnershipPolicy (BIRD leftovers we may claim)    ├─> DataplaneCommand
//!                    ├─> Handovers (classes we just lost, to whom)        │
//!                    └─> ExpectedRoute per writer (for the audit) <───────┘
//! ```

use std::collections::BTreeSet;
use std::sync::Arc;

use ipnet::IpNet;
use serde::Serialize;

use crate::dataplane::{AuditScope, ExpectedRoute, Handover, OwnershipPolicy, WireguardRoute};
use crate::datastore::Snapshot;
use crate::model::Cluster;
use crate::model::{Kind, MAX_FROZEN_PER_INPUT};
use crate::ownership::{decide, frozen_classes, FrozenClass, OwnershipConfig, OwnershipDecision, Role};
use crate::routes::{classed_routes, routable_classes, ClassedRoutes, ClusterRoute, RouteDevices, RouteMemo, RouteOrigin, RouteProblem};
use crate::vocabulary::{PoolClass, RoutePath, Writer, RTPROT_BIRD, RTPROT_FELIX};

/// Settings the plan needs from the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanConfig {
    /// This node.
    pub node: String,
    /// Role and release line.
    pub ownership: OwnershipConfig,
    /// Device names.
    pub devices: RouteDevices,
    /// routewarden's route protocol.
    pub protocol: u8,
    /// routewarden's table.
    pub table: u32,
}

/// Everything derived from one snapshot.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The ownership decision (Calico's: what Felix and BIRD do, fallbacks included).
    pub decision: OwnershipDecision,
    /// Classes whose owner cannot be known now ([`frozen_classes`]: the object that decides
    /// it is unreadable or holds a value routewarden cannot interpret): nothing new is
    /// programmed there, and their pools are frozen ground (nothing deleted or claimed).
    pub frozen_classes: Vec<FrozenClass>,
    /// The classes routewarden counts as its own after this plan: the decision's, less the
    /// frozen classes it did not program before, plus the frozen ones it did (a frozen class
    /// is neither taken up nor handed over). The next plan's `previous`.
    pub programmed: BTreeSet<PoolClass>,
    /// Routes routewarden programs (empty in audit mode).
    pub desired: Vec<ClusterRoute>,
    /// What could not be computed.
    pub problems: Vec<RouteProblem>,
    /// Which kernel routes are ours.
    pub policy: OwnershipPolicy,
    /// Classes routewarden stopped programming since the previous plan, and their new owner.
    pub handovers: Vec<Handover>,
    /// What every writer of every routable class should have in the kernel (for the audit).
    pub expected: Vec<ExpectedRoute>,
    /// What the audit looks at.
    pub audit_scope: AuditScope,
    /// Frozen ground: prefixes in which nothing is deleted or claimed, each with why (the
    /// broken object or input that mentions it, or the invalid IP pool that covers it).
    pub frozen: Vec<FrozenPrefix>,
    /// Why no route may be deleted anywhere now: an input that never loaded (nothing it
    /// would say is known). The agent stays ready.
    pub hold_all: Option<String>,
    /// This node's Node object is not in the datastore: the view cannot be this node's, so
    /// it counts as not synced (no deletions, not ready) until the Node is back.
    pub local_node_missing: bool,
    /// Pool CIDRs routewarden still owns although their pools are gone (given in, kept).
    pub retired: Vec<IpNet>,
}

/// One prefix of frozen ground.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct FrozenPrefix {
    /// The prefix (an address as a host prefix).
    pub cidr: IpNet,
    /// The object or input that freezes it (its error, naming object and field).
    pub reason: String,
}

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
fn pool_cidrs(decision: &OwnershipDecision, class: PoolClass) -> Vec<IpNet> {
    let mut v: Vec<IpNet> = decision.pools.iter().filter(|p| p.class == Some(class)).map(|p| p.cidr).collect();
    v.sort();
    v.dedup();
    v
}

/// Frozen ground of `snapshot`: the CIDRs of every rejected object without a last good version
/// (invalid IP pools included) and of every broken input's text, and what a rejected Node
/// routes (below). Sorted, one entry per prefix.
///
/// A Node rejected with no last good version (unparsable, invalid, or defined twice) is
/// absent from the cluster, so its blocks' routes and the routes of the IPs it borrowed are not
/// computed, and without this their routes would be deleted (after a restart, when there is
/// no last good version to stand in) or rewritten through another definition's address. Every
/// IPAM block affine to it and every allocation attributed to it (`secondary.node`, its
/// borrowed IPs and tunnel addresses) is frozen ground until a good version is back.
pub fn frozen_ground(snapshot: &Snapshot) -> Vec<FrozenPrefix> {
    let mut out: Vec<FrozenPrefix> = Vec::new();
    let mut rejected_nodes: std::collections::BTreeMap<&str, String> = std::collections::BTreeMap::new();
    // Per input, at most MAX_FROZEN_PER_INPUT prefixes one by one: 1,000 invalid objects of
    // 1,000 addresses each froze 1,001,000 prefixes (the cap was per object), which the
    // reconciler compares every route against.
    let mut per_input: std::collections::BTreeMap<&std::path::Path, std::collections::BTreeSet<IpNet>> = std::collections::BTreeMap::new();
    let mut whole: std::collections::BTreeSet<&std::path::Path> = std::collections::BTreeSet::new();
    for e in snapshot.object_errors.iter().filter(|e| !e.last_good) {
        if !whole.contains(e.file.as_path()) {
            let seen = per_input.entry(e.file.as_path()).or_default();
            seen.extend(e.cidrs.iter().copied());
            if seen.len() > MAX_FROZEN_PER_INPUT {
                per_input.remove(e.file.as_path());
                whole.insert(e.file.as_path());
            }
        }
        // No good definition stands in for it: a kept one marks the error `last_good`, and
        // one in another input is refused with it (`ClusterBuilder::finish`).
        if let Some((Kind::Node, name)) = e.error.object() {
            rejected_nodes.entry(name).or_insert_with(|| e.to_string());
        }
    }
    for e in snapshot.object_errors.iter().filter(|e| !e.last_good && !whole.contains(e.file.as_path()) && !e.cidrs.is_empty()) {
        let reason = e.to_string();
        out.extend(e.cidrs.iter().map(|c| FrozenPrefix { cidr: *c, reason: reason.clone() }));
    }
    for file in &whole {
        let reason = format!(
            "{}: its invalid objects name more than {MAX_FROZEN_PER_INPUT} prefixes: the whole address space is frozen until they are fixed (routewarden explain lists them)",
            file.display()
        );
        for space in ["0.0.0.0/0", "::/0"] {
            out.push(FrozenPrefix { cidr: space.parse().unwrap_or_default(), reason: reason.clone() });
        }
    }
    for e in &snapshot.load_errors {
        out.extend(e.cidrs.iter().map(|c| FrozenPrefix { cidr: *c, reason: e.to_string() }));
    }
    if !rejected_nodes.is_empty() {
        for block in snapshot.cluster.ipam_blocks.values() {
            if let Some(reason) = block.host().and_then(|h| rejected_nodes.get(h)) {
                out.push(FrozenPrefix { cidr: block.cidr, reason: format!("IPAM block {} of a rejected Node: {reason}", block.cidr) });
            }
            for a in block.allocated() {
                if let Some(reason) = a.attributes.node().and_then(|n| rejected_nodes.get(n)) {
                    out.push(FrozenPrefix { cidr: IpNet::from(a.ip), reason: format!("{} allocated to a rejected Node: {reason}", a.ip) });
                }
            }
        }
    }
    out.sort();
    out.dedup_by(|a, b| a.cidr == b.cidr);
    out
}

/// Why no route may be deleted or rewritten anywhere now, if so: an input that never loaded,
/// or a file that is there but cannot be read (its last good content stands in, but what it
/// says now is unknown). Either could want any route, or define an object again (a second
/// definition is refused with the first, so a route through the one that loaded could be
/// wrong): deletions and rewrites of routes in the kernel wait; missing routes are added.
fn hold_all(snapshot: &Snapshot) -> Option<String> {
    snapshot.load_errors.iter().find(|e| e.never_loaded || e.kind == crate::datastore::LoadErrorKind::Io).map(|e| {
        if e.never_loaded {
            format!("input {} never loaded ({}): no deletion or rewrite can be justified while it is broken", e.file.display(), e.message)
        } else {
            format!(
                "input {} cannot be read ({}): its last good content is kept, and no deletion or rewrite can be justified while it is unreadable",
                e.file.display(),
                e.message
            )
        }
    })
}

/// The pool CIDRs inside which a route with our protocol is ours (policy rule 3): valid pools
/// of IPIP and no-encap, except those of a class another writer programs with our protocol
/// number while we do not.
fn owned_pools(decision: &OwnershipDecision, cluster: &Cluster, config: &PlanConfig) -> Vec<IpNet> {
    let felix_proto = writer_protocol(Writer::Felix, cluster, &config.node, config.protocol);
    let mut out: Vec<IpNet> = decision
        .pools
        .iter()
        .filter(|p| matches!(p.class, Some(PoolClass::Ipip | PoolClass::NoEncap)))
        .filter(|p| {
            let class = p.class.unwrap_or(PoolClass::Vxlan);
            !(felix_proto == config.protocol && decision.writers_of(class).contains(&Writer::Felix) && !decision.programs(class))
        })
        .map(|p| p.cidr)
        .collect();
    out.sort();
    out
}

/// Most pool CIDRs kept owned after their pools are gone.
const MAX_RETIRED: usize = 1024;

/// The BIRD leftovers the policy claims: only for a class we program and BIRD does not.
fn set_bird_claims(policy: &mut OwnershipPolicy, decision: &OwnershipDecision) {
    let bird_writes = |c: PoolClass| decision.writers_of(c).contains(&Writer::Bird);
    if decision.programs(PoolClass::Ipip) && !bird_writes(PoolClass::Ipip) {
        policy.claim_bird_on_tunnel = pool_cidrs(decision, PoolClass::Ipip);
        // CrossSubnet: BIRD routed same-subnet peers natively (confd sets `krt_tunnel=""` when
        // the next hop is in the local subnet), so its leftovers there are on the host NIC.
        policy.claim_bird_on_nic = decision.pools.iter().filter(|p| p.kind == crate::vocabulary::PoolKind::IpipCrossSubnet).map(|p| p.cidr).collect();
    }
    if decision.programs(PoolClass::NoEncap) && !bird_writes(PoolClass::NoEncap) {
        policy.claim_bird_on_nic.extend(pool_cidrs(decision, PoolClass::NoEncap));
    }
    // BIRD's blackholes for this node's own blocks (confd's bird_aggr.cfg static routes,
    // exported to the kernel): the same guard, any class we program and BIRD does not.
    for class in [PoolClass::Ipip, PoolClass::NoEncap] {
        if decision.programs(class) && !bird_writes(class) {
            policy.claim_bird_blackholes.extend(pool_cidrs(decision, class));
        }
    }
}

/// The WireGuard peer `route` leads to, if any: the peer's BGP address of the route's family
/// when this node and the peer both have a WireGuard interface address of that family
/// ([`crate::bird_filter::wireguard_peers`], confd `processWireguardPeerFilter`).
fn wireguard_peer_of(route: &ClusterRoute, peers: &[(String, std::net::IpAddr)]) -> Option<WireguardRoute> {
    let node = route.origin.node()?;
    let v6 = route.dst.addr().is_ipv6();
    peers.iter().find(|(name, bgp)| name == node && bgp.is_ipv6() == v6).map(|(name, bgp)| WireguardRoute {
        prefix: route.dst,
        peer: name.clone(),
        bgp_address: *bgp,
    })
}

/// The audit's expectations: per routable class, every writer's routes (BIRD's as BIRD learns
/// them; none to WireGuard peers from whoever stands in BIRD's place, those are returned
/// apart); for a class nobody programs, its prefixes with the ownership finding's reason.
fn audit_expectations(
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
    // those `desired_routes` computes for that class alone (issue 23). The routes are moved
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
                    // tunnel routes use `extractNodeAddress` (issue 21).
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

/// Build the plan for `snapshot`. `previous` is the set of classes routewarden programmed
/// under the previous plan (empty at start); `previous_owned` the previous plan's
/// [`OwnershipPolicy::owned`]: a pool CIDR in it whose pool is gone (no valid pool covers it,
/// nothing froze it) stays owned ("retired"), so the routes we left in it are still ours to
/// remove. Retired CIDRs are forgotten on restart (the audit then reports such routes as
/// stale).
pub fn plan(snapshot: &Snapshot, config: &PlanConfig, previous: &BTreeSet<PoolClass>, previous_owned: &[IpNet]) -> Plan {
    // One pass over the IPAM blocks for every routable class: the programmed classes' routes
    // are taken from it, and the audit's expectations of every writer.
    let every_class = classed_routes(&snapshot.cluster, &config.node, &routable_classes(), &config.devices);
    plan_from(snapshot, config, previous, previous_owned, every_class)
}

/// What [`plan_with`] keeps between snapshots: the route pass ([`RouteMemo`]) and what the
/// last plan was made from besides the IPAM blocks and BlockAffinities the route pass
/// follows. Starts empty; the first call plans.
#[derive(Debug, Default)]
pub struct PlanMemo {
    routes: RouteMemo,
    last: Option<PlanInputs>,
}

/// The arguments of a [`plan_with`] call, but for the cluster's IPAM blocks and affinities.
#[derive(Debug)]
struct PlanInputs {
    cluster: Arc<Cluster>,
    object_errors: Vec<crate::datastore::ObjectError>,
    load_errors: Vec<crate::datastore::LoadError>,
    config: PlanConfig,
    previous: BTreeSet<PoolClass>,
    previous_owned: Vec<IpNet>,
}

impl PlanInputs {
    fn of(snapshot: &Snapshot, config: &PlanConfig, previous: &BTreeSet<PoolClass>, previous_owned: &[IpNet]) -> PlanInputs {
        PlanInputs {
            cluster: snapshot.cluster.clone(),
            object_errors: snapshot.object_errors.clone(),
            load_errors: snapshot.load_errors.clone(),
            config: config.clone(),
            previous: previous.clone(),
            previous_owned: previous_owned.to_vec(),
        }
    }

    /// Whether a plan of these arguments reads the same as one of `self`'s wherever it does not
    /// read the IPAM blocks and BlockAffinities (what [`RouteMemo::update`] answers for).
    /// Every other part of the cluster is compared: the destructuring is exhaustive, so a
    /// field added to [`Cluster`] must be placed here to compile. The snapshot's `inputs` and
    /// `settled` are not read by the plan.
    fn same_besides_ipam(&self, snapshot: &Snapshot, config: &PlanConfig, previous: &BTreeSet<PoolClass>, previous_owned: &[IpNet]) -> bool {
        let Cluster {
            ip_pools,
            ipam_blocks: _,
            block_affinities: _,
            nodes,
            felix_configurations,
            bgp_configurations,
            cluster_informations,
            installations,
            calico_node_daemonsets,
            unread,
        } = &*snapshot.cluster;
        let was = &*self.cluster;
        *ip_pools == was.ip_pools
            && *nodes == was.nodes
            && *felix_configurations == was.felix_configurations
            && *bgp_configurations == was.bgp_configurations
            && *cluster_informations == was.cluster_informations
            && *installations == was.installations
            && *calico_node_daemonsets == was.calico_node_daemonsets
            && *unread == was.unread
            && snapshot.object_errors == self.object_errors
            && snapshot.load_errors == self.load_errors
            && *config == self.config
            && *previous == self.previous
            && previous_owned == self.previous_owned.as_slice()
    }
}

/// [`plan`], with the route pass kept in `memo` between snapshots ([`PlanMemo`]): what the
/// agent runs on every snapshot, so that a change of one IPAM block costs that block's routes
/// rather than a pass over every block, and a change that alters no input of the plan but
/// IPAM blocks and affinities whose routes, problems and conflicts stay the same (a pod's IP
/// allocated in its own node's block, most of a large cluster's churn) costs no plan at all.
///
/// Returns [`plan`] of the same arguments, or `None` when that plan is equal to the one this
/// memo answered last (the caller keeps that one: the dataplane, the audit and the forwarding
/// watch have nothing new to do). `agent/tests/routes_compute.rs` checks both against the full
/// plan over random sequences of changes.
pub fn plan_with(memo: &mut PlanMemo, snapshot: &Snapshot, config: &PlanConfig, previous: &BTreeSet<PoolClass>, previous_owned: &[IpNet]) -> Option<Plan> {
    let routes_changed = memo.routes.update(&snapshot.cluster, &config.node, &routable_classes(), &config.devices);
    let same = memo.last.as_ref().is_some_and(|l| l.same_besides_ipam(snapshot, config, previous, previous_owned));
    if same && !routes_changed {
        // Keep the newest cluster, so that what the last plan's memo holds is this snapshot's.
        if let Some(l) = memo.last.as_mut() {
            l.cluster = snapshot.cluster.clone();
        }
        return None;
    }
    memo.last = Some(PlanInputs::of(snapshot, config, previous, previous_owned));
    Some(plan_from(snapshot, config, previous, previous_owned, memo.routes.answer()))
}

/// The plan of `snapshot` given the routes of every routable class (`every_class`).
fn plan_from(snapshot: &Snapshot, config: &PlanConfig, previous: &BTreeSet<PoolClass>, previous_owned: &[IpNet], every_class: ClassedRoutes) -> Plan {
    let cluster = &snapshot.cluster;
    let decision = decide(cluster, &config.ownership);
    // Classes whose owner cannot be known (issue 48): neither taken up nor handed over, nothing
    // new programmed there; their pools join the frozen ground below.
    let frozen_classes = frozen_classes(&decision, cluster, &config.ownership, snapshot.object_errors.iter().filter(|e| !e.last_good).map(|e| &e.error));
    let is_frozen = |c: &PoolClass| frozen_classes.iter().any(|f| f.class == *c);
    let programs_now: BTreeSet<PoolClass> = decision.programmed.iter().filter(|c| !is_frozen(c)).copied().collect();
    let programmed: BTreeSet<PoolClass> = programs_now.iter().chain(previous.iter().filter(|c| is_frozen(c))).copied().collect();
    let mut computed = every_class.select(&programs_now);
    // WireGuard (reference §1, confd `processWireguardPeerFilter`): BIRD's kernel filter rejects
    // every route whose next hop is a WireGuard peer of this node ("WireGuard routes handled by
    // Felix"), so in BIRD's role routewarden does not program them either. Felix's route
    // managers program their main-table routes whatever WireGuard does
    // (`felix/dataplane/linux/route_mgr.go` `updateRoutes` has no WireGuard case; WireGuard
    // steers traffic with its own table and rule, `felix/wireguard/wireguard.go`), and so does
    // routewarden in Felix's role.
    let wireguard_peers = crate::bird_filter::wireguard_peers(cluster, &config.node);
    if config.ownership.role == Role::Bird {
        computed.routes.retain(|r| wireguard_peer_of(r, &wireguard_peers).is_none());
    }
    let mut frozen = frozen_ground(snapshot);
    if !frozen_classes.is_empty() {
        for p in decision.pools.iter().filter(|p| p.class.as_ref().is_some_and(is_frozen)) {
            let reason = frozen_classes.iter().find(|f| Some(f.class) == p.class).map(|f| f.reason.clone()).unwrap_or_default();
            frozen.push(FrozenPrefix { cidr: p.cidr, reason: format!("IP pool {}: {reason}", p.pool) });
        }
        frozen.sort();
        frozen.dedup_by(|a, b| a.cidr == b.cidr);
    }
    let frozen_cidrs: Vec<IpNet> = frozen.iter().map(|f| f.cidr).collect();
    let touches_frozen = |c: &IpNet| frozen_cidrs.iter().any(|f| f.contains(c) || c.contains(f));

    // Ownership policy: our protocol in our table inside the pools we own (never Felix's
    // classes when our protocol equals Felix's, so we never delete Felix's routes); BIRD
    // leftovers only for a class we program and BIRD does not (Calico's OwnBIRDIPIPRoutes,
    // `felix/routetable` ownership policy, and the no-encap gap it left open); nothing claimed
    // in frozen ground.
    let mut owned = owned_pools(&decision, cluster, config);
    // A pool CIDR we owned stays ours while no valid pool (of any class) covers it and
    // nothing froze it.
    let mut retired: Vec<IpNet> = previous_owned
        .iter()
        .copied()
        .filter(|r| !cluster.ip_pools.values().any(|p| p.cidr.contains(r) || r.contains(&p.cidr)) && !touches_frozen(r))
        .collect();
    retired.truncate(MAX_RETIRED);
    owned.extend(retired.iter().copied());
    owned.sort();
    owned.dedup();
    let hold_all = hold_all(snapshot);
    let mut policy = OwnershipPolicy {
        hold_rewrites: hold_all.is_some(),
        protocol: config.protocol,
        table: config.table,
        tunnel_dev: config.devices.tunnel.clone(),
        host_nic: config.devices.host_nic.clone(),
        owned,
        frozen: frozen_cidrs.clone(),
        ..OwnershipPolicy::default()
    };
    set_bird_claims(&mut policy, &decision);

    // Handovers: a class we programmed and no longer do goes to its new writer; we keep our
    // routes per prefix until that writer's route is seen (bounded by the grace period). A
    // class nobody owns any more has no one to hand to: its routes go, as Calico's would, and
    // the `unowned` finding says so.
    let mut handovers = Vec::new();
    for class in previous.difference(&decision.programmed).filter(|c| !is_frozen(c)) {
        if let Some(to) = decision.writers_of(*class).into_iter().find(|w| *w != Writer::Routewarden) {
            handovers.push(Handover {
                class: *class,
                to,
                protocol: writer_protocol(to, cluster, &config.node, config.protocol),
                table: crate::vocabulary::RT_TABLE_MAIN,
                // BIRD's metric is set by confd's bird.cfg, not known here: a hand-over to BIRD
                // steps aside (safe at any metric).
                metric: None,
            });
        }
    }

    let (expected, unowned, wireguard) = audit_expectations(cluster, config, &decision, every_class.into_routes(), &wireguard_peers);
    let mut cluster_cidrs: Vec<IpNet> = routable_classes().into_iter().flat_map(|c| pool_cidrs(&decision, c)).collect();
    cluster_cidrs.sort();
    let audit_scope = AuditScope { table: config.table, cluster_cidrs, devices: config.devices.clone(), our_protocol: config.protocol, unowned, wireguard };

    Plan {
        frozen,
        frozen_classes,
        programmed,
        hold_all,
        local_node_missing: !cluster.nodes.contains_key(config.node.as_str()),
        retired,
        desired: computed.routes,
        problems: computed.problems,
        decision,
        policy,
        handovers,
        expected,
        audit_scope,
    }
}

#[cfg(test)]
mod claim_tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    use super::{plan, PlanConfig};
    use crate::datastore::FileDatastore;
    use crate::ownership::{CalicoVersion, OwnershipConfig, Role};
    use crate::routes::RouteDevices;

    /// The example cluster in a temporary directory, with `edit` applied to calico.yaml.
    fn claims(role: Role, edit: impl Fn(String) -> String) -> (Vec<String>, Vec<String>) {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster");
        let dir = tempfile::tempdir().unwrap();
        for f in ["calico.yaml", "ipam.yaml", "nodes.yaml"] {
            let text = std::fs::read_to_string(src.join(f)).unwrap();
            std::fs::write(dir.path().join(f), if f == "calico.yaml" { edit(text) } else { text }).unwrap();
        }
        let snapshot = FileDatastore::load(dir.path()).unwrap();
        let ownership = OwnershipConfig { role, version: CalicoVersion::V3_33.into(), node: Some("node-a".into()) };
        let config = PlanConfig { node: "node-a".into(), ownership, devices: RouteDevices::default(), protocol: 80, table: 254 };
        let p = plan(&snapshot, &config, &BTreeSet::new(), &[]);
        let show = |v: &[ipnet::IpNet]| v.iter().map(ToString::to_string).collect::<Vec<_>>();
        (show(&p.policy.claim_bird_blackholes), show(&p.policy.claim_bird_on_tunnel))
    }

    /// Issue 19 part 5: BIRD's own-block blackholes are claimed exactly in the pools of the
    /// classes routewarden programs and BIRD does not, the guard of the tunnel claim.
    #[test]
    fn bird_blackholes_are_claimed_only_where_bird_does_not_program_the_class() {
        // Felix role, the complementary pair: IPIP is ours, no-encap BIRD's.
        let (blackholes, tunnel) = claims(Role::Felix, |t| t);
        assert_eq!(blackholes, ["10.244.0.0/16", "10.245.0.0/16"]);
        assert_eq!(tunnel, ["10.244.0.0/16", "10.245.0.0/16"]);
        // BIRD also programs IPIP (a wrong pair): nothing of BIRD's is claimed.
        let (blackholes, tunnel) = claims(Role::Felix, |t| t.replace("programClusterRoutes: EnabledNoEncapOnly", "programClusterRoutes: Enabled"));
        assert_eq!((blackholes, tunnel), (Vec::<String>::new(), Vec::<String>::new()));
    }
}

/// Issue 48 case 1: after a restart there is no last good version of a broken object, so what
/// it decides must be frozen by the plan itself. Each test plans the example cluster with one
/// object broken, as a restarted agent's first plan (`previous` empty) and as a running
/// agent's (`previous` the classes it programmed).
#[cfg(test)]
mod restart_tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    use super::{plan, Plan, PlanConfig};
    use crate::datastore::{FileDatastore, LoadError, LoadErrorKind, Snapshot};
    use crate::ownership::{OwnershipConfig, Role, VersionChoice};
    use crate::routes::RouteDevices;
    use crate::vocabulary::PoolClass;

    /// The example cluster in a temporary directory with `edit(file name, text)` applied, loaded.
    fn snapshot(edit: impl Fn(&str, String) -> String) -> Snapshot {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster");
        let dir = tempfile::tempdir().unwrap();
        for f in ["calico.yaml", "ipam.yaml", "nodes.yaml"] {
            let text = std::fs::read_to_string(src.join(f)).unwrap();
            std::fs::write(dir.path().join(f), edit(f, text)).unwrap();
        }
        FileDatastore::load(dir.path()).unwrap()
    }

    fn plan_of(snapshot: &Snapshot, previous: &[PoolClass]) -> Plan {
        let ownership = OwnershipConfig { role: Role::Felix, version: VersionChoice::Auto, node: Some("node-a".into()) };
        let config = PlanConfig { node: "node-a".into(), ownership, devices: RouteDevices::default(), protocol: 80, table: 254 };
        plan(snapshot, &config, &previous.iter().copied().collect::<BTreeSet<_>>(), &[])
    }

    fn desired(p: &Plan) -> Vec<String> {
        p.desired.iter().map(|r| r.dst.to_string()).collect()
    }

    fn frozen(p: &Plan) -> Vec<String> {
        p.frozen.iter().map(|f| f.cidr.to_string()).collect()
    }

    fn classes(p: &Plan) -> Vec<(PoolClass, bool)> {
        p.frozen_classes.iter().map(|f| (f.class, f.reason.contains("nothing new programmed, deleted or claimed"))).collect()
    }

    const BOTH: [(PoolClass, bool); 2] = [(PoolClass::Ipip, true), (PoolClass::NoEncap, true)];
    const POOLS: [&str; 4] = ["10.244.0.0/16", "10.245.0.0/16", "10.246.0.0/16", "fd00:10:244::/48"];

    fn felix_value(value: &'static str) -> impl Fn(&str, String) -> String {
        move |f: &str, t: String| {
            if f == "calico.yaml" {
                t.replace("programClusterRoutes: EnabledIPIPOnly", &format!("programClusterRoutes: {value}"))
            } else {
                t
            }
        }
    }

    /// The healthy cluster freezes nothing: the frozen ground and classes are empty, and node-a
    /// programs its seven IPIP routes.
    #[test]
    fn the_example_freezes_nothing() {
        let p = plan_of(&snapshot(|_, t| t), &[]);
        assert_eq!((classes(&p), frozen(&p), p.desired.len(), p.hold_all.clone()), (vec![], Vec::<String>::new(), 7, None));
        assert_eq!(p.programmed, [PoolClass::Ipip].into_iter().collect());
    }

    /// A FelixConfiguration whose programClusterRoutes is a list does not parse: the object is
    /// rejected, and Felix's default (EnabledIPIPOnly on 3.33) used to decide in its place, so
    /// an agent that had programmed no-encap too (`Enabled`) deleted those routes after a
    /// restart. Both classes are frozen: nothing programmed, their pools frozen ground, no
    /// handover, and a running agent keeps counting what it programmed as its own.
    #[test]
    fn an_unparsable_felix_configuration_freezes_both_classes() {
        let s = snapshot(felix_value("[Enabled]"));
        assert_eq!(s.object_errors.len(), 1, "{:?}", s.object_errors);
        let restarted = plan_of(&s, &[]);
        assert_eq!(classes(&restarted), BOTH);
        assert!(
            restarted.frozen_classes[0].reason.starts_with("FelixConfiguration \"default\": spec.programClusterRoutes:"),
            "{}",
            restarted.frozen_classes[0].reason
        );
        assert_eq!(desired(&restarted), Vec::<String>::new());
        assert_eq!(frozen(&restarted), POOLS);
        assert!(restarted.programmed.is_empty() && restarted.handovers.is_empty());
        let running = plan_of(&s, &[PoolClass::Ipip, PoolClass::NoEncap]);
        assert_eq!(running.programmed, [PoolClass::Ipip, PoolClass::NoEncap].into_iter().collect());
        assert!(running.handovers.is_empty());
        // Calico's own reading is unchanged: what explain and audit expect Felix to do.
        assert_eq!(running.decision.felix.source.kind(), "default");
    }

    /// A value routewarden cannot interpret (`Bogus`) falls back to Felix's default in Calico's
    /// decision (explain, audit), but moves no class for routewarden.
    #[test]
    fn an_unknown_value_freezes_both_classes_and_keeps_calicos_fallback() {
        let p = plan_of(&snapshot(felix_value("Bogus")), &[]);
        assert_eq!(classes(&p), BOTH);
        assert_eq!((p.decision.felix.source.kind(), p.decision.programmed.len()), ("fallback", 1));
        assert_eq!(desired(&p), Vec::<String>::new());
        // BIRD's unknown value the same.
        let bird = |f: &str, t: String| {
            if f == "calico.yaml" {
                t.replace("programClusterRoutes: EnabledNoEncapOnly", "programClusterRoutes: enablednoencaponly")
            } else {
                t
            }
        };
        let p = plan_of(&snapshot(bird), &[]);
        assert_eq!((classes(&p), p.decision.bird.source.kind()), (BOTH.to_vec(), "fallback"));
    }

    /// A ClusterInformation that does not parse (calicoVersion a list) or names no Calico 3
    /// release: 3.33 was assumed, so on a 3.30 cluster BIRD's routes were claimed and
    /// replaced. Both classes are frozen (and no BIRD route is claimed there).
    #[test]
    fn an_unreadable_release_line_freezes_both_classes() {
        for version in ["[v3.30.2]", "banana"] {
            let edit = move |f: &str, t: String| if f == "calico.yaml" { t.replace("calicoVersion: v3.33.0", &format!("calicoVersion: {version}")) } else { t };
            let p = plan_of(&snapshot(edit), &[]);
            assert_eq!(classes(&p), BOTH, "{version}");
            assert_eq!(desired(&p), Vec::<String>::new(), "{version}");
            assert_eq!(frozen(&p), POOLS, "{version}");
        }
        // An absent one is not a broken one: Calico's default (3.33 assumed) decides.
        let absent = |f: &str, t: String| if f == "calico.yaml" { t.replace("  calicoVersion: v3.33.0\n", "") } else { t };
        assert_eq!(classes(&plan_of(&snapshot(absent), &[])), vec![]);
    }

    /// A Node whose address does not parse is rejected; only its addresses were frozen, so its
    /// blocks' routes were deleted. Its blocks (node-b: 10.244.20.0/26, 10.245.20.0/26, the
    /// VXLAN 10.247.20.0/26 and fd00:10:244:0:20::/122) and its tunnel address are frozen ground; node-c's borrowed IP in
    /// node-b's block is node-c's and is still programmed.
    #[test]
    fn a_rejected_node_freezes_its_blocks_and_its_ips() {
        let edit = |f: &str, t: String| {
            if f == "nodes.yaml" {
                t.replace("projectcalico.org/IPv4Address: 10.0.0.12/24", "projectcalico.org/IPv4Address: not-an-ip/99")
            } else {
                t
            }
        };
        let p = plan_of(&snapshot(edit), &[]);
        // Its own addresses (as before), then its IPv4 and IPv6 blocks and its tunnel address.
        assert_eq!(
            frozen(&p),
            ["10.0.0.12/32", "10.244.20.0/26", "10.244.20.0/32", "10.245.20.0/26", "10.247.20.0/26", "fd00:10::/64", "fd00:10:244:0:20::/122"]
        );
        assert_eq!(desired(&p), ["10.244.10.0/26", "10.244.20.5/32", "10.244.30.0/26", "10.244.40.0/26", "10.245.40.0/26"]);
        assert!(p.frozen[1].reason.starts_with("IPAM block 10.244.20.0/26 of a rejected Node: "), "{}", p.frozen[1].reason);
    }

    /// The same Node in a second file (a new one that sorts first, with a bogus address): the
    /// first definition won and node-a's routes to node-b were rewritten through it. Both are
    /// refused; node-b's blocks are frozen as for a rejected Node.
    #[test]
    fn a_node_defined_twice_freezes_its_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster");
        for f in ["calico.yaml", "ipam.yaml", "nodes.yaml"] {
            std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
        }
        std::fs::write(
            dir.path().join("00-extra.yaml"),
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: node-b\n  annotations: {projectcalico.org/IPv4Address: 10.0.0.99/24}\n",
        )
        .unwrap();
        let s = FileDatastore::load(dir.path()).unwrap();
        let files: Vec<String> = s.object_errors.iter().map(|e| e.file.file_name().unwrap().to_string_lossy().into_owned()).collect();
        // The later definition's error, then the first's (taken out when the cluster is built).
        assert_eq!(files, ["nodes.yaml", "00-extra.yaml"]);
        let p = plan_of(&s, &[]);
        assert_eq!(frozen(&p), ["10.244.20.0/26", "10.244.20.0/32", "10.245.20.0/26", "10.247.20.0/26", "fd00:10:244:0:20::/122"]);
        assert!(p.desired.iter().all(|r| r.gateway != Some("10.0.0.99".parse().unwrap())));
    }

    /// A file that is there but cannot be read keeps its last good content (the datastore) and
    /// holds every deletion (the plan): what it says now is unknown.
    #[test]
    fn an_unreadable_input_holds_every_deletion() {
        let mut s = snapshot(|_, t| t);
        s.load_errors.push(LoadError::new("/cluster/ipam.yaml", LoadErrorKind::Io, "Permission denied (os error 13)"));
        let p = plan_of(&s, &[]);
        assert_eq!(
            p.hold_all.as_deref(),
            Some("input /cluster/ipam.yaml cannot be read (Permission denied (os error 13)): its last good content is kept, and no deletion or rewrite can be justified while it is unreadable")
        );
        assert_eq!(p.desired.len(), 7);
    }
}

/// Issue 48 case 6: frozen ground is bounded per input, not per object.
#[cfg(test)]
mod bound_tests {
    use std::fmt::Write as _;

    use super::frozen_ground;
    use crate::datastore::FileDatastore;

    /// 1,000 invalid pools naming 1,000 addresses each froze 1,001,000 prefixes (the cap of
    /// 1,024 was per object), which the reconciler compares every route against. One input's
    /// invalid objects freeze at most 1,024 prefixes one by one; past that, the whole address
    /// space (two prefixes) with one reason naming the input. Another input's stay as they are.
    #[test]
    fn an_inputs_invalid_objects_freeze_at_most_1024_prefixes_one_by_one() {
        let dir = tempfile::tempdir().unwrap();
        let mut text = String::new();
        for p in 0..1_000u32 {
            let _ = write!(text, "---\napiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {{name: bad-{p}}}\nspec: {{cidr: [");
            for a in 0..1_000u32 {
                let _ = write!(text, "{}10.{}.{}.{}", if a == 0 { "" } else { ", " }, 100 + p / 250, p % 250, a % 250);
            }
            text.push_str("]}\n");
        }
        std::fs::write(dir.path().join("bomb.yaml"), text).unwrap();
        std::fs::write(
            dir.path().join("small.yaml"),
            "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: small}\nspec: {cidr: 10.9.0.0/16, ipipMode: Sometimes}\n",
        )
        .unwrap();
        let snapshot = FileDatastore::load(dir.path()).unwrap();
        assert_eq!(snapshot.object_errors.len(), 1_001);
        let frozen = frozen_ground(&snapshot);
        let got: Vec<String> = frozen.iter().map(|f| f.cidr.to_string()).collect();
        assert_eq!(got, ["0.0.0.0/0", "10.9.0.0/16", "::/0"]);
        assert!(frozen[0].reason.ends_with("bomb.yaml: its invalid objects name more than 1024 prefixes: the whole address space is frozen until they are fixed (routewarden explain lists them)"), "{}", frozen[0].reason);
    }
}

/// Issue 48 case 4: an IPAM block overlapping another node's block was accepted and routed.
/// Planned from the example cluster through the file datastore, and applied by the
/// reconciler on a fake kernel.
#[cfg(test)]
mod block_overlap_tests {
    use std::collections::BTreeSet;
    use std::path::Path;
    use std::time::Duration;

    use super::{plan, Plan, PlanConfig};
    use crate::dataplane::fake::{FakeClock, FakeNetlink};
    use crate::dataplane::{DataplaneConfig, Reconciler};
    use crate::datastore::{FileDatastore, Snapshot};
    use crate::ownership::{OwnershipConfig, Role, VersionChoice};
    use crate::routes::RouteDevices;

    /// The example cluster, plus `extra` as `extra.yaml` when given, loaded.
    fn load(dir: &Path, extra: Option<&str>) -> Snapshot {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster");
        for f in ["calico.yaml", "ipam.yaml", "nodes.yaml"] {
            std::fs::copy(src.join(f), dir.join(f)).unwrap();
        }
        match extra {
            Some(text) => std::fs::write(dir.join("extra.yaml"), text).unwrap(),
            None => drop(std::fs::remove_file(dir.join("extra.yaml"))),
        }
        FileDatastore::load(dir).unwrap()
    }

    fn plan_of(s: &Snapshot, previous: &Plan) -> Plan {
        let ownership = OwnershipConfig { role: Role::Felix, version: VersionChoice::Auto, node: Some("node-a".into()) };
        let config = PlanConfig { node: "node-a".into(), ownership, devices: RouteDevices::default(), protocol: 80, table: 254 };
        plan(s, &config, &previous.programmed, &previous.policy.owned)
    }

    fn first_plan(s: &Snapshot) -> Plan {
        let ownership = OwnershipConfig { role: Role::Felix, version: VersionChoice::Auto, node: Some("node-a".into()) };
        let config = PlanConfig { node: "node-a".into(), ownership, devices: RouteDevices::default(), protocol: 80, table: 254 };
        plan(s, &config, &BTreeSet::new(), &[])
    }

    /// node-c's /27 written inside node-b's 10.244.20.0/26 (an IPIP block node-a routes via
    /// node-b): before, the /27 was routed to node-c beside the /26. Now both are refused and
    /// neither is desired (nor the /32 of 10.244.20.5, which node-c borrowed in the /26), the
    /// /26 is frozen ground, and node-a's routes there — in the kernel from the valid cluster —
    /// are neither deleted nor rewritten, however long the settle period and the breaker wait;
    /// the other five routes stay and nothing is written. Removed, the /26 is desired again and
    /// nothing is written either.
    #[tokio::test]
    async fn the_existing_route_of_an_overlapped_block_is_frozen_not_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let valid = load(dir.path(), None);
        let p0 = first_plan(&valid);
        let desired = |p: &Plan| p.desired.iter().map(|r| r.dst.to_string()).collect::<Vec<_>>();
        assert!(desired(&p0).contains(&"10.244.20.0/26".to_owned()));

        let nl = FakeNetlink::with_links(&[(1, "lo"), (2, "eth0"), (3, "tunl0")]);
        let clock = FakeClock::new();
        let cfg = DataplaneConfig::default();
        let mut r = Reconciler::new(cfg.clone(), cfg.base_policy(), nl.clone(), clock.clone());
        r.set_datastore_synced(true);
        r.set_policy(p0.policy.clone());
        r.set_desired(&p0.desired);
        r.apply().await;
        let kernel = nl.state().routes.clone();
        assert_eq!(kernel.len(), 7);
        nl.take_log();

        let overlap = "apiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {name: 10-244-20-32-27}\nspec: {cidr: 10.244.20.32/27, affinity: 'host:node-c'}\n";
        let s = load(dir.path(), Some(overlap));
        let errors: Vec<(String, Vec<String>)> = s
            .object_errors
            .iter()
            .map(|e| (e.file.file_name().unwrap().to_string_lossy().into_owned(), e.cidrs.iter().map(ToString::to_string).collect()))
            .collect();
        let frozen_26 = vec!["10.244.20.0/26".to_owned()];
        assert_eq!(errors, [("ipam.yaml".to_owned(), frozen_26.clone()), ("extra.yaml".to_owned(), frozen_26.clone())]);
        let p1 = plan_of(&s, &p0);
        let mut expected = desired(&p0);
        expected.retain(|d| d != "10.244.20.0/26" && d != "10.244.20.5/32");
        assert_eq!(desired(&p1), expected);
        assert_eq!(p1.frozen.iter().map(|f| f.cidr.to_string()).collect::<Vec<_>>(), frozen_26);
        assert_eq!(p1.policy.frozen, ["10.244.20.0/26".parse::<ipnet::IpNet>().unwrap()]);
        assert!(
            p1.frozen[0].reason.ends_with("extra.yaml: IPAMBlock \"10-244-20-32-27\": spec.cidr: 10.244.20.32/27 overlaps IPAM block 10-244-20-0-26 (10.244.20.0/26); Calico's IPAM never writes overlapping blocks, so every block of an overlap is invalid; 10.244.20.32/27 is a /27 block in IPPool \"default-ipv4-ippool\" (10.244.0.0/16) whose blockSize is 26; Calico's IPAM writes only blocks of its pool's blockSize; its ground (10.244.20.0/26) is frozen until fixed"),
            "{}",
            p1.frozen[0].reason
        );
        r.set_policy(p1.policy.clone());
        r.set_desired(&p1.desired);
        for _ in 0..4 {
            let rep = r.apply().await;
            assert_eq!(rep.deletes, 0, "{rep:?}");
            clock.advance(Duration::from_mins(1));
        }
        assert!(nl.state().routes == kernel, "the kernel changed");
        assert_eq!(nl.take_log().into_iter().filter(|l| !l.starts_with("dump")).collect::<Vec<_>>(), Vec::<String>::new());

        let fixed = load(dir.path(), None);
        let p2 = plan_of(&fixed, &p1);
        assert_eq!((desired(&p2), p2.frozen.len()), (desired(&p0), 0));
        r.set_policy(p2.policy.clone());
        r.set_desired(&p2.desired);
        r.apply().await;
        assert!(nl.state().routes == kernel, "the kernel changed");
        assert_eq!(nl.take_log().into_iter().filter(|l| !l.starts_with("dump")).collect::<Vec<_>>(), Vec::<String>::new());
    }
}
