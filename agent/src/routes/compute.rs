//! Desired-route computation: the cluster routes one node needs for a set of pool classes.
//!
//! Rules (reference §2, Felix `felix/calc/l3_route_resolver.go` and
//! `felix/dataplane/linux/route_mgr.go`):
//! - one route per remote IPAM block to its affine node (`routesFromBlock`; the node from
//!   `AllocationBlock.Host()`, which strips `host:` or `virtual:`);
//! - one /32 (/128) per borrowed IP to the node in its allocation attributes'
//!   `secondary.node` (`AllocationBlock.NonAffineAllocations`), also for blocks without
//!   affinity; none for IPs the local node borrowed (its workload routes are the CNI's);
//! - a blackhole per own block, except /32 and /128 blocks (`route_mgr.go`
//!   `routeIsLocalBlock`);
//! - one /32 (/128) per node tunnel address (IPIP, VXLAN, WireGuard) that lies in an IPAM
//!   block affine to another node: Felix adds every tunnel address as a route reference of
//!   its node, a reference overrides the node of the entries it sits in, and its route
//!   manager programs a remote tunnel address that is borrowed (`l3_route_resolver.go`
//!   `onNodeUpdate` `AddRef`, `flush`; `route_mgr.go` `isRemoteTunnelRoute`;
//!   `ipip_mgr_test.go`). One /32 per address whichever source finds it; when an IPAM
//!   allocation names another node than the Node holding the address, the Node wins, as in
//!   Felix, and a [`RouteProblem::TunnelAddressConflict`] is reported;
//! - next hop of host-NIC routes and the address the same-subnet test checks: the remote
//!   node's BGP address, else its InternalIP, else its ExternalIP, per family
//!   ([`Node::next_hop`](crate::model::Node::next_hop), Felix's `DstNodeIp`);
//! - next hop of IPIP tunnel routes: the BGP address only when written with a prefix length,
//!   else InternalIP, else ExternalIP
//!   ([`Node::tunnel_gateway`](crate::model::Node::tunnel_gateway), Felix's `ipip_mgr.go`
//!   via `dataplane_passthru.go` `extractNodeAddress`); when that differs from the BGP
//!   address a [`RouteProblem::NextHopSourcesDisagree`] names both;
//! - IPIP: `via <node> dev <tunnel> onlink`, unless the pool is CrossSubnet and the next hop
//!   is inside this node's BGP subnet (`nodeInOurSubnet`), then `via <node> dev <host NIC>
//!   onlink`, as for no-encap pools, v4 and v6 (`route_mgr.go` `noEncapRoute`);
//! - host-NIC routes of a family only when this node has an address of that family in
//!   Felix's per-host address message
//!   ([`Node::host_address`](crate::model::Node::host_address)): Felix's parent device is
//!   the interface holding it, and without one it programs no native route of the family.
//!
//! VXLAN-class blocks are never routed here (they need VTEPs and `vxlan.calico`; Felix always
//! programs them), and LoadBalancer-only pools have no cluster routes. What cannot be computed

use std::collections::BTreeSet;

use ipnet::IpNet;
use serde::Serialize;

use super::block_index::{affinity_conflicts, cidr_key, BlockIndex};
use super::pass_context::Ctx;
use super::problem::{Problems, RouteProblem};
use super::tunnel_address::tunnel_address_routes;
use super::{ClusterRoute, RouteDevices, RouteMap, RouteOrigin};
use crate::model::{Cluster, IpamBlock};
use crate::vocabulary::{PoolClass, RoutePath};

/// Routes and problems for one node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NodeRoutes {
    /// Sorted by destination (IPv4 before IPv6); one route per destination.
    pub routes: Vec<ClusterRoute>,
    /// Sorted; what could not be computed, and data conflicts seen on the way.
    pub problems: Vec<RouteProblem>,
}

/// The classes routewarden can route: IPIP and no-encap (never VXLAN). Pass this to
/// [`desired_routes`] to get the expected path of every routable class (audit, TC watch).
pub fn routable_classes() -> BTreeSet<PoolClass> {
    BTreeSet::from([PoolClass::Ipip, PoolClass::NoEncap])
}

/// One route per destination from `found` (each route with the name of the IPAM block it
/// came from, in the order the pass found them), in place: the first found stays, and each
/// later one is a [`RouteProblem::DuplicateDestination`] naming both blocks. Leaves `found`
/// sorted by destination. A stable sort of the list, not a map the routes go into one by one:
/// the map's two searches per route cost more than the sort.
fn first_per_destination(found: &mut Vec<(ClusterRoute, &str)>, problems: &mut Problems) {
    // `cidr_key` orders as `IpNet` does, compared inline (ipnet's comparison is a call).
    found.sort_by_key(|(r, _)| cidr_key(r.dst));
    // `dedup_by` hands each element with the last one kept before it.
    found.dedup_by(|(later, dropped), (first, kept)| {
        let duplicate = later.dst == first.dst;
        if duplicate {
            problems
                .insert((RouteProblem::DuplicateDestination { dst: later.dst, kept: (*kept).to_owned(), dropped: (*dropped).to_owned() }, Some(later.class)));
        }
        duplicate
    });
}

/// The cluster routes node `node_name` needs for the pool `classes` given, with the devices
/// named in `devices`. [`PoolClass::Vxlan`] in `classes` has no effect.
pub fn desired_routes(cluster: &Cluster, node_name: &str, classes: &BTreeSet<PoolClass>, devices: &RouteDevices) -> NodeRoutes {
    // Everything computed for `classes` is of those classes: no selection (nor copy) needed.
    let ClassedRoutes { routes, problems } = classed_routes(cluster, node_name, classes, devices);
    let problems: BTreeSet<RouteProblem> = problems.into_iter().map(|(p, _)| p).collect();
    NodeRoutes { routes: routes.values().map(|r| (**r).clone()).collect(), problems: problems.into_iter().collect() }
}

/// The routes and problems of several pool classes from one pass over the IPAM blocks, to
/// answer for any subset of them ([`ClassedRoutes::select`]): the plan needs the classes
/// routewarden programs and, for the audit, every routable class, and a pass over a large
/// cluster is too costly to run twice. A subset's answer equals [`desired_routes`] for that
/// subset: IP pools do not overlap (overlapping ones are taken out before planning), so a
/// destination, and every problem about it, belongs to one class.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClassedRoutes {
    /// One route per destination.
    pub(super) routes: RouteMap,
    pub(super) problems: Problems,
}

impl ClassedRoutes {
    /// Every route computed, by destination.
    pub fn routes(&self) -> &RouteMap {
        &self.routes
    }

    /// The routes of `classes` (cloned) and the problems that concern them or no class.
    pub fn select(&self, classes: &BTreeSet<PoolClass>) -> NodeRoutes {
        let mut routes = Vec::with_capacity(self.routes.len());
        routes.extend(self.routes.values().filter(|r| classes.contains(&r.class)).map(|r| (**r).clone()));
        NodeRoutes { routes, problems: self.select_problems(classes) }
    }

    /// The problems that concern `classes` or no class, sorted, each once.
    pub fn select_problems(&self, classes: &BTreeSet<PoolClass>) -> Vec<RouteProblem> {
        let problems: BTreeSet<&RouteProblem> = self.problems.iter().filter(|(_, c)| c.is_none_or(|c| classes.contains(&c))).map(|(p, _)| p).collect();
        problems.into_iter().cloned().collect()
    }
}

/// One pass over the IPAM blocks for `classes` ([`ClassedRoutes`]); the rules are the
/// module's. [`crate::routes::RouteMemo`] gives the same answer from the previous pass and
/// what changed since.
pub fn classed_routes(cluster: &Cluster, node_name: &str, classes: &BTreeSet<PoolClass>, devices: &RouteDevices) -> ClassedRoutes {
    let ctx = Ctx::new(cluster, node_name, devices);
    let mut problems = Problems::new();
    problems.extend(ctx.local_problem());

    // Blocks in CIDR order (names break ties), so "first" is independent of input order.
    let index = BlockIndex::new(cluster);

    // Every route with the name of the IPAM block it came from, in block order. Sized for a
    // route per block and as many borrowed IPs again: grown from empty, the list would be
    // copied and faulted in again at each doubling; room never used is never touched, so it costs address space, not memory.
    let mut all = Vec::with_capacity(index.blocks.len().saturating_mul(2));
    let mut found_problems = Vec::new();
    for &block in &index.blocks {
        block_routes(&ctx, block, classes, &mut FromBlock { all: &mut all, block: &block.name }, &mut found_problems);
        problems.extend(found_problems.drain(..));
    }
    first_per_destination(&mut all, &mut problems);
    let overlay = tunnel_address_routes(&ctx, &index, classes, &mut problems);
    overlay.clear_held(&mut problems);
    let routes = if overlay.routes.is_empty() {
        // No tunnel address in another node's block (the usual case): the routes found are
        // the answer, taken out of the list where they lie (an in-place collect).
        all.into_iter().map(|(route, _)| route).collect()
    } else {
        // The overlay's destinations replace the blocks' routes there (or remove them): a
        // merge of two lists sorted by destination.
        let mut routes = Vec::with_capacity(all.len() + overlay.routes.len());
        overlay.apply(all.into_iter().map(|(route, _)| route), |r| r.dst, Clone::clone, |r| routes.push(r));
        routes
    };
    problems.extend(affinity_conflicts(&index, cluster).into_iter().map(|p| (p, None)));
    ClassedRoutes { routes: routes.into_iter().map(|r| (r.dst, std::sync::Arc::new(r))).collect(), problems }
}

/// The pass's list of found routes as one block adds to it: each route goes in with the
/// block's name, built in place rather than gathered and moved over.
struct FromBlock<'l, 'n> {
    all: &'l mut Vec<(ClusterRoute, &'n str)>,
    block: &'n str,
}

impl Extend<ClusterRoute> for FromBlock<'_, '_> {
    fn extend<I: IntoIterator<Item = ClusterRoute>>(&mut self, routes: I) {
        let block = self.block;
        self.all.extend(routes.into_iter().map(|r| (r, block)));
    }
}

/// What IPAM block `block` contributes to a pass for `classes`, appended to `routes` in the
/// order the pass adds them (its own route first, then one per borrowed IP in allocation
/// order) and to `problems`. A pure function of the block and of `ctx`'s IP pools and Nodes.
pub(super) fn block_routes(
    ctx: &Ctx<'_>,
    block: &IpamBlock,
    classes: &BTreeSet<PoolClass>,
    routes: &mut impl Extend<ClusterRoute>,
    problems: &mut Vec<(RouteProblem, Option<PoolClass>)>,
) {
    let Some((pool, class)) = ctx.routed_class(block.cidr, classes) else {
        if ctx.cluster.pool_for(block.cidr).is_none() {
            problems.push((RouteProblem::BlockOutsidePools { block: block.name.to_string(), cidr: block.cidr }, None));
        }
        return;
    };
    if block.deleted {
        problems.push((RouteProblem::BlockDeleted { block: block.name.to_string(), cidr: block.cidr }, Some(class)));
        return;
    }
    match block.host() {
        Some(h) if h == ctx.local_name => {
            if block.cidr.prefix_len() < block.cidr.max_prefix_len() {
                routes.extend([ClusterRoute {
                    dst: block.cidr,
                    path: RoutePath::Blackhole,
                    gateway: None,
                    device: None,
                    class,
                    pool: pool.name.clone(),
                    origin: RouteOrigin::OwnBlock { block: block.name.clone() },
                }]);
            }
        }
        Some(h) => {
            let origin = |node| RouteOrigin::RemoteBlock { block: block.name.clone(), node };
            routes.extend(ctx.route(&block.name, block.cidr, h, pool, class, origin, problems));
        }
        None => {
            if !block.allocated().any(|a| a.attributes.node().is_some()) {
                problems.push((RouteProblem::BlockWithoutOwner { block: block.name.to_string(), cidr: block.cidr }, Some(class)));
                return;
            }
        }
    }
    for alloc in block.non_affine_allocations() {
        let Some(owner) = alloc.attributes.node() else {
            problems.push((RouteProblem::AllocationWithoutNode { block: block.name.to_string(), ip: alloc.ip }, Some(class)));
            continue;
        };
        if owner == ctx.local_name {
            continue; // our own workload: its route is the CNI's, not a cluster route
        }
        let dst = IpNet::from(alloc.ip);
        let origin = |node| RouteOrigin::BorrowedIp { block: block.name.clone(), node };
        routes.extend(ctx.route(&block.name, dst, owner, pool, class, origin, problems));
    }
}
