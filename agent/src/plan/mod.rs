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

mod expected;
mod frozen;
mod outputs;

#[cfg(test)]
mod tests;

pub use expected::{writer_protocol, ExpectationKey, Expectations};
pub use frozen::{frozen_ground, FrozenPrefix};
pub use outputs::{AuditScope, ExpectedRoute, Handover, WireguardRoute};

use std::collections::BTreeSet;
use std::sync::Arc;

use ipnet::IpNet;

use crate::datastore::Snapshot;
use crate::model::Cluster;
use crate::ownership::{decide, frozen_classes, FrozenClass, OwnershipConfig, OwnershipDecision, OwnershipPolicy, PolicyInputs, Role};
use crate::routes::{classed_routes, routable_classes, ClassedRoutes, ClusterRoute, RouteDevices, RouteMap, RouteMemo, RouteProblem};
use crate::vocabulary::{PoolClass, Writer};
use expected::{audit_expectations, pool_cidrs, wireguard_peer_of, Expectation, ExpectationRules};
use frozen::hold_all;

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
    /// Routes routewarden programs (empty in audit mode), by destination.
    pub desired: RouteMap,
    /// What could not be computed.
    pub problems: Vec<RouteProblem>,
    /// Which kernel routes are ours.
    pub policy: OwnershipPolicy,
    /// Classes routewarden stopped programming since the previous plan, and their new owner.
    pub handovers: Vec<Handover>,
    /// What every writer of every routable class should have in the kernel (for the audit),
    /// per class, writer and destination.
    pub expected: Expectations,
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

/// Most pool CIDRs kept owned after their pools are gone.
const MAX_RETIRED: usize = 1024;
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
    plan_from(snapshot, config, previous, previous_owned, &every_class)
}

/// What [`plan_with`] keeps between snapshots: the route pass ([`RouteMemo`]) and what the
/// last plan was made from besides the IPAM blocks and BlockAffinities the route pass
/// follows. Starts empty; the first call plans.
#[derive(Debug, Default)]
pub struct PlanMemo {
    routes: RouteMemo,
    last: Option<PlanInputs>,
    /// The last plan made and the route pass's answer it was made from: a plan whose inputs
    /// but the IPAM blocks and affinities are the same is this one patched where the answer
    /// changed ([`patched`]).
    made: Option<(Plan, RouteMap)>,
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
            api_changes,
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
            && *api_changes == was.api_changes
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
    let answer = memo.routes.answer();
    let plan = match (memo.made.take(), same) {
        (Some((last, was)), true) => patched(last, &was, &answer, snapshot, config),
        _ => None,
    }
    .unwrap_or_else(|| plan_from(snapshot, config, previous, previous_owned, &answer));
    memo.last = Some(PlanInputs::of(snapshot, config, previous, previous_owned));
    memo.made = Some((plan.clone(), answer.routes().clone()));
    Some(plan)
}

/// The plan of `answer` made from `plan`, the last one (made from `was` and the same inputs but
/// the IPAM blocks and affinities): only what depends on the routes can differ (the desired
/// routes, the expectations, the problems), and only at the destinations whose route
/// changed, found chunk by chunk ([`crate::model::SharedMap::diff`]); everything else is
/// `plan`'s. `None` when a changed route is of a class nobody programs or leads to a
/// WireGuard peer whoever stands in BIRD's place leaves alone (lists the full plan sorts):
/// the caller then makes the full plan. Equal to [`plan`] of the same arguments
/// (`agent/tests/routes_compute.rs` compares them over random sequences of changes).
fn patched(mut plan: Plan, was: &RouteMap, answer: &ClassedRoutes, snapshot: &Snapshot, config: &PlanConfig) -> Option<Plan> {
    let is_frozen = |c: &PoolClass| plan.frozen_classes.iter().any(|f| f.class == *c);
    let programs_now: BTreeSet<PoolClass> = plan.decision.programmed.iter().filter(|c| !is_frozen(c)).copied().collect();
    let wireguard_peers = crate::ownership::wireguard_peers(&snapshot.cluster, &config.node);
    let mut rules = ExpectationRules::new(&snapshot.cluster, config, &plan.decision, &wireguard_peers);
    let mut listed = false;
    let mut expected = Vec::new();
    was.diff(answer.routes(), |dst, before, after| {
        if let Some(b) = before {
            rules.of_route(b, None, &mut |e| listed |= !matches!(e, Expectation::Expected(..)));
            for (w, _) in rules.writers(b.class) {
                plan.expected.remove(&(b.class, w, *dst));
            }
        }
        plan.desired.remove(dst);
        if let Some(a) = after {
            rules.of_route(a, None, &mut |e| match e {
                Expectation::Expected(k, e) => expected.push((k, e)),
                _ => listed = true,
            });
            if desired_in(a, &programs_now, config, &wireguard_peers) {
                plan.desired.insert(*dst, a.clone());
            }
        }
    });
    if listed {
        return None;
    }
    for (k, e) in expected {
        plan.expected.insert(k, e);
    }
    plan.problems = answer.select_problems(&programs_now);
    Some(plan)
}

/// Whether routewarden programs `route` when it programs `classes`.
///
/// WireGuard (reference §1, confd `processWireguardPeerFilter`): BIRD's kernel filter rejects
/// every route whose next hop is a WireGuard peer of this node ("WireGuard routes handled by
/// Felix"), so in BIRD's role routewarden does not program them either. Felix's route
/// managers program their main-table routes whatever WireGuard does
/// (`felix/dataplane/linux/route_mgr.go` `updateRoutes` has no WireGuard case; WireGuard
/// steers traffic with its own table and rule, `felix/wireguard/wireguard.go`), and so does
/// routewarden in Felix's role.
fn desired_in(route: &ClusterRoute, classes: &BTreeSet<PoolClass>, config: &PlanConfig, wireguard_peers: &[(String, std::net::IpAddr)]) -> bool {
    classes.contains(&route.class) && (config.ownership.role != Role::Bird || wireguard_peer_of(route, wireguard_peers).is_none())
}

/// The plan of `snapshot` given the routes of every routable class (`every_class`).
fn plan_from(snapshot: &Snapshot, config: &PlanConfig, previous: &BTreeSet<PoolClass>, previous_owned: &[IpNet], every_class: &ClassedRoutes) -> Plan {
    let cluster = &snapshot.cluster;
    let decision = decide(cluster, &config.ownership);
    // Classes whose owner cannot be known: neither taken up nor handed over, nothing
    // new programmed there; their pools join the frozen ground below.
    let frozen_classes = frozen_classes(&decision, cluster, &config.ownership, snapshot.object_errors.iter().filter(|e| !e.last_good).map(|e| &e.error));
    let is_frozen = |c: &PoolClass| frozen_classes.iter().any(|f| f.class == *c);
    let programs_now: BTreeSet<PoolClass> = decision.programmed.iter().filter(|c| !is_frozen(c)).copied().collect();
    let programmed: BTreeSet<PoolClass> = programs_now.iter().chain(previous.iter().filter(|c| is_frozen(c))).copied().collect();
    let wireguard_peers = crate::ownership::wireguard_peers(cluster, &config.node);
    let desired: RouteMap =
        every_class.routes().iter().filter(|(_, r)| desired_in(r, &programs_now, config, &wireguard_peers)).map(|(d, r)| (*d, r.clone())).collect();
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

    // A pool CIDR we owned stays ours while no valid pool (of any class) covers it and
    // nothing froze it.
    let mut retired: Vec<IpNet> = previous_owned
        .iter()
        .copied()
        .filter(|r| !cluster.ip_pools.values().any(|p| p.cidr.contains(r) || r.contains(&p.cidr)) && !touches_frozen(r))
        .collect();
    retired.truncate(MAX_RETIRED);
    let hold_all = hold_all(snapshot);
    let policy = OwnershipPolicy::from_decision(
        &decision,
        &PolicyInputs {
            protocol: config.protocol,
            table: config.table,
            devices: &config.devices,
            felix_protocol: writer_protocol(Writer::Felix, cluster, &config.node, config.protocol),
            retired: &retired,
            frozen: &frozen_cidrs,
            hold_rewrites: hold_all.is_some(),
        },
    );

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

    let (expected, unowned, wireguard) = audit_expectations(ExpectationRules::new(cluster, config, &decision, &wireguard_peers), every_class.routes().values());
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
        desired,
        problems: every_class.select_problems(&programs_now),
        decision,
        policy,
        handovers,
        expected,
        audit_scope,
    }
}
