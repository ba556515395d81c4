//! The cluster handler's pure step: from a datastore snapshot to everything the dataplane,
//! the audit and the metrics need. No I/O; unit-tested.
//!
//! ```text
//! Snapshot ─> ownership::decide ─> classes routewarden programs ─> routes::desired_routes
//!                    │                                                    │
//!                    ├─> OwnershipPolicy (BIRD leftovers we may claim)    ├─> DataplaneCommand
//!                    ├─> Handovers (classes we just lost, to whom)        │
//!                    └─> ExpectedRoute per writer (for the audit) <───────┘
//! ```

use std::collections::BTreeSet;

use ipnet::IpNet;

use crate::dataplane::model::{RTPROT_BIRD, RTPROT_FELIX};
use crate::dataplane::{AuditScope, ExpectedRoute, Handover, OwnershipPolicy};
use crate::datastore::Snapshot;
use crate::model::Cluster;
use crate::ownership::{decide, OwnershipConfig, OwnershipDecision};
use crate::routes::{desired_routes, routable_classes, ClusterRoute, PoolClass, RouteDevices, RoutePath, RouteProblem, Writer};

/// Settings the plan needs from the command line.
#[derive(Clone, Debug)]
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
    /// The ownership decision.
    pub decision: OwnershipDecision,
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
    /// True when the input is incomplete (a file or object failed to load): the dataplane must
    /// then not delete anything (a broken input never removes routes).
    pub input_incomplete: bool,
}

/// The route protocol each writer puts on its routes: Felix 80 (its `deviceRouteProtocol`
/// when set to something other than 3/boot — `felix/dataplane/linux/route_mgr.go`
/// `calculateRouteProtocol`), BIRD 12 (`RTPROT_BIRD`), routewarden its own.
pub fn writer_protocol(writer: Writer, cluster: &Cluster, node: &str, ours: u8) -> u8 {
    match writer {
        Writer::Routewarden => ours,
        Writer::Bird => RTPROT_BIRD,
        Writer::Felix => {
            let configured = cluster
                .felix_for_node(node)
                .and_then(|f| f.device_route_protocol)
                .or_else(|| cluster.felix_default().and_then(|f| f.device_route_protocol));
            match configured {
                None | Some(3) => RTPROT_FELIX,
                Some(p) => p,
            }
        }
    }
}

fn pool_cidrs(cluster: &Cluster, decision: &OwnershipDecision, class: PoolClass) -> Vec<IpNet> {
    let mut v: Vec<IpNet> = decision.pools.iter().filter(|p| p.class == Some(class)).map(|p| p.cidr).collect();
    // Pools the decision did not see (none today) still count by CIDR.
    v.sort();
    v.dedup();
    let _ = cluster;
    v
}

/// Build the plan for `snapshot`. `previous` is the set of classes routewarden programmed
/// under the previous plan (empty at start).
pub fn plan(snapshot: &Snapshot, config: &PlanConfig, previous: &BTreeSet<PoolClass>) -> Plan {
    let cluster = &snapshot.cluster;
    let decision = decide(cluster, &config.ownership);
    let computed = desired_routes(cluster, &config.node, &decision.programmed, &config.devices);

    // Ownership policy: our protocol in our table; BIRD leftovers only for a class we program
    // and BIRD does not (Calico's OwnBIRDIPIPRoutes, `felix/routetable` ownership policy, and
    // the no-encap gap it left open); disown the pools of classes Felix writes when our
    // protocol equals Felix's, so we never delete Felix's routes.
    let bird_writes = |c: PoolClass| decision.writers_of(c).contains(&Writer::Bird);
    let felix_writes = |c: PoolClass| decision.writers_of(c).contains(&Writer::Felix);
    let mut policy = OwnershipPolicy {
        protocol: config.protocol,
        table: config.table,
        tunnel_dev: config.devices.tunnel.clone(),
        host_nic: config.devices.host_nic.clone(),
        ..OwnershipPolicy::default()
    };
    if decision.programs(PoolClass::Ipip) && !bird_writes(PoolClass::Ipip) {
        policy.claim_bird_on_tunnel = pool_cidrs(cluster, &decision, PoolClass::Ipip);
        // CrossSubnet: BIRD routed same-subnet peers natively (confd sets `krt_tunnel=""` when
        // the next hop is in the local subnet), so its leftovers there are on the host NIC.
        policy.claim_bird_on_nic = decision.pools.iter().filter(|p| p.kind == crate::ownership::PoolKind::IpipCrossSubnet).map(|p| p.cidr).collect();
    }
    if decision.programs(PoolClass::NoEncap) && !bird_writes(PoolClass::NoEncap) {
        policy.claim_bird_on_nic.extend(pool_cidrs(cluster, &decision, PoolClass::NoEncap));
    }
    let felix_proto = writer_protocol(Writer::Felix, cluster, &config.node, config.protocol);
    if felix_proto == config.protocol {
        for class in [PoolClass::Ipip, PoolClass::NoEncap, PoolClass::Vxlan] {
            if felix_writes(class) && !decision.programs(class) {
                policy.disown.extend(pool_cidrs(cluster, &decision, class));
            }
        }
    }

    // Handovers: a class we programmed and no longer do goes to its new writer; we keep our
    // routes per prefix until that writer's route is seen (bounded by the grace period). A
    // class nobody owns any more has no one to hand to: its routes go, as Calico's would, and
    // the `unowned` finding says so.
    let mut handovers = Vec::new();
    for class in previous.difference(&decision.programmed) {
        if let Some(to) = decision.writers_of(*class).into_iter().find(|w| *w != Writer::Routewarden) {
            handovers.push(Handover {
                class: *class,
                to,
                protocol: writer_protocol(to, cluster, &config.node, config.protocol),
                table: crate::dataplane::model::RT_TABLE_MAIN,
                // BIRD's metric is set by confd's bird.cfg, not known here: a hand-over to BIRD
                // steps aside (safe at any metric).
                metric: None,
            });
        }
    }

    // Expectations for the audit: per routable class, every writer's routes; for a class
    // nobody programs, its prefixes with the ownership finding's reason.
    let mut expected = Vec::new();
    let mut unowned = Vec::new();
    let me = cluster.nodes.get(&config.node);
    for class in routable_classes() {
        let routes = desired_routes(cluster, &config.node, &BTreeSet::from([class]), &config.devices).routes;
        let writers = decision.writers_of(class);
        if writers.is_empty() {
            let Some(f) = decision.findings.iter().find(|f| f.code() == "unowned" && f.class == Some(class)) else { continue };
            unowned.extend(routes.iter().filter(|r| r.path != RoutePath::Blackhole).map(|r| (r.dst, f.message.clone())));
            continue;
        }
        for w in writers {
            let protocol = writer_protocol(w, cluster, &config.node, config.protocol);
            // BIRD learns a family's routes only over BGP sessions of that family, which peer
            // from this node's BGP address of the family (confd's mesh peers are rendered from
            // `Node.spec.bgp.ipv4Address` / `ipv6Address`): without one, it programs none.
            let speaks = |r: &ClusterRoute| w != Writer::Bird || me.is_none_or(|n| n.bgp_address(r.dst.addr().is_ipv6()).is_some());
            expected.extend(routes.iter().filter(|r| speaks(r)).map(|r| ExpectedRoute { route: r.clone(), owner: w, protocol }));
        }
    }
    let mut cluster_cidrs: Vec<IpNet> = routable_classes().into_iter().flat_map(|c| pool_cidrs(cluster, &decision, c)).collect();
    cluster_cidrs.sort();
    let audit_scope = AuditScope { table: config.table, cluster_cidrs, devices: config.devices.clone(), our_protocol: config.protocol, unowned };

    Plan {
        input_incomplete: !snapshot.load_errors.is_empty() || !snapshot.object_errors.is_empty(),
        desired: computed.routes,
        problems: computed.problems,
        decision,
        policy,
        handovers,
        expected,
        audit_scope,
    }
}
