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
//!   ([`Node::next_hop`], Felix's `DstNodeIp`);
//! - next hop of IPIP tunnel routes: the BGP address only when written with a prefix length,
//!   else InternalIP, else ExternalIP ([`Node::tunnel_gateway`], Felix's `ipip_mgr.go` via
//!   `dataplane_passthru.go` `extractNodeAddress`); when that differs from the BGP address a
//!   [`RouteProblem::NextHopSourcesDisagree`] names both;
//! - IPIP: `via <node> dev <tunnel> onlink`, unless the pool is CrossSubnet and the next hop
//!   is inside this node's BGP subnet (`nodeInOurSubnet`), then `via <node> dev <host NIC>
//!   onlink`, as for no-encap pools, v4 and v6 (`route_mgr.go` `noEncapRoute`);
//! - host-NIC routes of a family only when this node has an address of that family in
//!   Felix's per-host address message ([`Node::host_address`]): Felix's parent device is the
//!   interface holding it, and without one it programs no native route of the family.
//!
//! VXLAN-class blocks are never routed here (they need VTEPs and `vxlan.calico`; Felix always
//! programs them), and LoadBalancer-only pools have no cluster routes. What cannot be computed
//! is reported as a [`RouteProblem`], never guessed. Output order is deterministic and does not
//! depend on input order.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use serde::Serialize;

use super::{ClusterRoute, RouteDevices, RouteOrigin};
use crate::model::{BlockAffinity, Cluster, IpPool, IpamBlock, Node, TunnelAddressKind};
use crate::vocabulary::{PoolClass, PoolKind, RoutePath};

/// Routes and problems for one node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DesiredRoutes {
    /// Sorted by destination (IPv4 before IPv6); one route per destination.
    pub routes: Vec<ClusterRoute>,
    /// Sorted; what could not be computed, and data conflicts seen on the way.
    pub problems: Vec<RouteProblem>,
}

/// A route that could not be computed, or an inconsistency in the IPAM data.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, thiserror::Error)]
#[serde(tag = "problem", rename_all = "kebab-case")]
pub enum RouteProblem {
    /// The node routes are computed for is not in the cluster. Blackholes still follow the
    /// blocks' affinity; with no local subnet known, CrossSubnet pools use the tunnel, as Felix
    /// does.
    #[error("this node {node:?} is not in the cluster; CrossSubnet pools are routed through the tunnel")]
    LocalNodeUnknown { node: String },
    /// An IPAM block whose CIDR is in no IP pool.
    #[error("IPAM block {block} ({cidr}) is in no IP pool; no route computed")]
    BlockOutsidePools { block: String, cidr: IpNet },
    /// An IPAM block marked `deleted`.
    #[error("IPAM block {block} ({cidr}) is marked deleted; no route computed")]
    BlockDeleted { block: String, cidr: IpNet },
    /// An IPAM block with no affinity and no allocation that names a node.
    #[error("IPAM block {block} ({cidr}) has no affinity and no allocation with a node; no route computed")]
    BlockWithoutOwner { block: String, cidr: IpNet },
    /// An allocation whose attributes record no node (Felix: "Unable to create route for IP;
    /// the node it belongs to was not recorded in IPAM").
    #[error("IP {ip} of IPAM block {block} has no node in its allocation attributes; no route computed")]
    AllocationWithoutNode { block: String, ip: IpAddr },
    /// A route's node is not in the cluster.
    #[error("no route to {dst}: node {node:?} (from IPAM block {block}) is not in the cluster")]
    UnknownNode { block: String, dst: IpNet, node: String },
    /// This node has no address of the family in Felix's per-host address message (BGP
    /// address with a prefix length, InternalIP or ExternalIP), so Felix's route manager of
    /// that family has no parent device and programs no host-NIC route (`route_mgr.go`
    /// `noEncapRoute` needs it; the no-encap manager has no tunnel route): neither does
    /// routewarden. Tunnel routes and blackholes need no parent device.
    #[error("this node {node:?} has no IPv{family} address with a prefix length, InternalIP or ExternalIP, so (as in Felix) no native IPv{family} route is computed")]
    LocalNodeWithoutAddress { node: String, family: u8 },
    /// A route's node has no address of the destination's family.
    #[error("no route to {dst}: node {node:?} has no IPv{family} address (BGP address, InternalIP or ExternalIP)")]
    NodeWithoutAddress { node: String, family: u8, dst: IpNet },
    /// A BlockAffinity claims a block for another node than the IPAM block's `affinity`; the
    /// route follows the IPAM block, as Felix does (reference S08).
    #[error("IPAM block {block} ({cidr}) is affine to {ipam_node} but BlockAffinity {affinity} claims it for {claimant:?}; routing follows the IPAM block")]
    AffinityConflict { block: String, cidr: IpNet, ipam_node: String, affinity: String, claimant: String },
    /// Two sources produce the same destination; the first (in block order) is kept. Only two
    /// overlapping blocks can (a block's /32 over another's borrowed IP, one CIDR twice), and
    /// the model refuses overlapping blocks (`model::check_blocks`): no datastore's cluster
    /// has them, so this is reported only for a cluster built otherwise.
    #[error("two routes to {dst} (from IPAM blocks {kept} and {dropped}); the one from {kept} is kept")]
    DuplicateDestination { dst: IpNet, kept: String, dropped: String },
    /// An IP that is a Node's tunnel address is recorded in IPAM for another node (or the
    /// address of an IPAM /32 block affine to another node); the route follows the Node, as
    /// Felix's route resolver does (a reference overrides the block's node,
    /// `l3_route_resolver.go` `flush`). `tunnel_node` is this node when the address is ours:
    /// then no route is computed (the kernel delivers it locally).
    #[error("IP {ip} is the {} tunnel address of node {tunnel_node:?} but IPAM block {block} records it for {ipam_node:?}; the route follows the Node, as Felix does", .kind.label())]
    TunnelAddressConflict { ip: IpAddr, kind: TunnelAddressKind, tunnel_node: String, ipam_node: String, block: String },
    /// Several Nodes claim one tunnel address; the route goes to the first by name, as Felix
    /// sorts its references (`RouteTrie.AddRef`).
    #[error("IP {ip} is the tunnel address of nodes {nodes:?}; the route goes to {kept:?}, the first by name, as Felix does")]
    TunnelAddressShared { ip: IpAddr, nodes: Vec<String>, kept: String },
    /// A node's BGP IPv4 address has no prefix length, so Felix uses it for host-NIC routes
    /// and the same-subnet test but not as the IPIP tunnel gateway, which comes from the
    /// node's InternalIP or ExternalIP (`dataplane_passthru.go` `extractNodeAddress`). Without
    /// either, Felix programs no tunnel route to the node; routewarden then uses the BGP
    /// address (BIRD's next hop too) rather than leave the node unreachable.
    #[error("{}", next_hop_disagreement(.node, *.bgp_address, *.tunnel_gateway))]
    NextHopSourcesDisagree { node: String, bgp_address: IpAddr, tunnel_gateway: Option<IpAddr> },
}

fn next_hop_disagreement(node: &str, bgp: IpAddr, gateway: Option<IpAddr>) -> String {
    match gateway {
        Some(gw) => format!(
            "node {node:?}: BGP address {bgp} has no prefix length, so Felix routes through the tunnel via its node address {gw} and natively via {bgp}; routewarden does the same"
        ),
        None => format!(
            "node {node:?}: BGP address {bgp} has no prefix length and the node has no IPv4 InternalIP or ExternalIP, so Felix programs no tunnel route to it; routewarden routes via {bgp}"
        ),
    }
}

impl RouteProblem {
    /// The IPAM block concerned (its object name), or `""` when the problem has none.
    pub fn block(&self) -> &str {
        match self {
            RouteProblem::BlockOutsidePools { block, .. }
            | RouteProblem::BlockDeleted { block, .. }
            | RouteProblem::BlockWithoutOwner { block, .. }
            | RouteProblem::AllocationWithoutNode { block, .. }
            | RouteProblem::UnknownNode { block, .. }
            | RouteProblem::AffinityConflict { block, .. }
            | RouteProblem::TunnelAddressConflict { block, .. } => block,
            _ => "",
        }
    }

    /// Stable label for metrics (`route_problems{code}`) and JSON output.
    pub fn code(&self) -> &'static str {
        match self {
            RouteProblem::LocalNodeUnknown { .. } => "local-node-unknown",
            RouteProblem::BlockOutsidePools { .. } => "block-outside-pools",
            RouteProblem::BlockDeleted { .. } => "block-deleted",
            RouteProblem::BlockWithoutOwner { .. } => "block-without-owner",
            RouteProblem::AllocationWithoutNode { .. } => "allocation-without-node",
            RouteProblem::UnknownNode { .. } => "unknown-node",
            RouteProblem::NodeWithoutAddress { .. } => "node-without-address",
            RouteProblem::LocalNodeWithoutAddress { .. } => "local-node-without-address",
            RouteProblem::AffinityConflict { .. } => "affinity-conflict",
            RouteProblem::DuplicateDestination { .. } => "duplicate-destination",
            RouteProblem::TunnelAddressConflict { .. } => "tunnel-address-conflict",
            RouteProblem::TunnelAddressShared { .. } => "tunnel-address-shared",
            RouteProblem::NextHopSourcesDisagree { .. } => "next-hop-sources-disagree",
        }
    }
}

/// The classes routewarden can route: IPIP and no-encap (never VXLAN). Pass this to
/// [`desired_routes`] to get the expected path of every routable class (audit, TC watch).
pub fn routable_classes() -> BTreeSet<PoolClass> {
    BTreeSet::from([PoolClass::Ipip, PoolClass::NoEncap])
}

/// Problems found on the way, each with the pool class of the routes it concerns (`None`: a
/// problem of the data whatever the classes, such as a block in no pool), so that one pass
/// over every class can answer for a subset ([`ClassedRoutes::select`]).
pub(super) type Problems = BTreeSet<(RouteProblem, Option<PoolClass>)>;

/// One route per destination from `found` (each route with the name of the IPAM block it
/// came from, in the order the pass found them), in place: the first found stays, and each
/// later one is a [`RouteProblem::DuplicateDestination`] naming both blocks. Leaves `found`
/// sorted by destination. A stable sort of the list, not a map the routes go into one by one:
/// at 110,000 routes the map's two searches per route were a fifth of the pass.
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
pub fn desired_routes(cluster: &Cluster, node_name: &str, classes: &BTreeSet<PoolClass>, devices: &RouteDevices) -> DesiredRoutes {
    // Everything computed for `classes` is of those classes: no selection (nor copy) needed.
    let ClassedRoutes { routes, problems } = classed_routes(cluster, node_name, classes, devices);
    let problems: BTreeSet<RouteProblem> = problems.into_iter().map(|(p, _)| p).collect();
    DesiredRoutes { routes, problems: problems.into_iter().collect() }
}

/// The routes and problems of several pool classes from one pass over the IPAM blocks, to
/// answer for any subset of them ([`ClassedRoutes::select`]): the plan needs the classes
/// routewarden programs and, for the audit, every routable class, and at 100,000 blocks a
/// pass is ~85 ms (issue 23). A subset's answer equals [`desired_routes`] for that subset:
/// IP pools do not overlap (overlapping ones are taken out before planning), so a
/// destination, and every problem about it, belongs to one class.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClassedRoutes {
    /// Sorted by destination, one route per destination.
    pub(super) routes: Vec<ClusterRoute>,
    pub(super) problems: Problems,
}

impl ClassedRoutes {
    /// Every route computed, sorted by destination.
    pub fn routes(&self) -> &[ClusterRoute] {
        &self.routes
    }

    /// Every route computed, sorted by destination, taken out.
    pub fn into_routes(self) -> Vec<ClusterRoute> {
        self.routes
    }

    /// The routes of `classes` (cloned) and the problems that concern them or no class.
    pub fn select(&self, classes: &BTreeSet<PoolClass>) -> DesiredRoutes {
        let mut routes = Vec::with_capacity(self.routes.len());
        routes.extend(self.routes.iter().filter(|r| classes.contains(&r.class)).cloned());
        let problems: BTreeSet<&RouteProblem> = self.problems.iter().filter(|(_, c)| c.is_none_or(|c| classes.contains(&c))).map(|(p, _)| p).collect();
        DesiredRoutes { routes, problems: problems.into_iter().cloned().collect() }
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
    // route per block and as many borrowed IPs again: grown from empty, the list (~13 MB at
    // 110,000 routes) was copied and faulted in again at each doubling, a sixth of the pass;
    // room never used is never touched, so it costs address space, not memory.
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
        let mut over = overlay.routes.into_iter().peekable();
        for (route, _) in all {
            let mut replaced = false;
            while let Some((dst, replacement)) = over.next_if(|(dst, _)| *dst <= route.dst) {
                routes.extend(replacement);
                if dst == route.dst {
                    replaced = true;
                    break;
                }
            }
            if !replaced {
                routes.push(route);
            }
        }
        routes.extend(over.filter_map(|(_, r)| r));
        routes
    };
    problems.extend(affinity_conflicts(&index, cluster).into_iter().map(|p| (p, None)));
    ClassedRoutes { routes, problems }
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

/// What the tunnel-address rule does to the routes of the blocks: per destination, the route
/// that replaces the blocks' (`None`: no route there), and the addresses Nodes hold (an
/// allocation of one without a node is no longer a problem).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct TunnelOverlay {
    pub(super) routes: BTreeMap<IpNet, Option<ClusterRoute>>,
    held: BTreeSet<IpAddr>,
}

impl TunnelOverlay {
    /// Drop the [`RouteProblem::AllocationWithoutNode`] of addresses a Node holds: the Node
    /// records who holds them.
    pub(super) fn clear_held(&self, problems: &mut Problems) {
        if !self.held.is_empty() {
            problems.retain(|(p, _)| !matches!(p, RouteProblem::AllocationWithoutNode { ip, .. } if self.held.contains(ip)));
        }
    }
}

/// The IPAM blocks of a pass by CIDR, as the tunnel-address rule looks them up.
pub(super) trait BlocksByCidr<'a> {
    /// The (IPv6, prefix length) pairs of the CIDRs of blocks not deleted, ascending.
    fn lengths(&self) -> Vec<(bool, u8)>;
    /// The first block by name whose CIDR is `cidr` and that is not deleted.
    fn first_live(&self, cidr: IpNet) -> Option<&'a IpamBlock>;
}

impl<'a> BlocksByCidr<'a> for BlockIndex<'a> {
    fn lengths(&self) -> Vec<(bool, u8)> {
        self.lengths.iter().copied().collect()
    }

    fn first_live(&self, cidr: IpNet) -> Option<&'a IpamBlock> {
        self.with_cidr(cidr).iter().copied().find(|b| !b.deleted)
    }
}

/// The /32s (/128s) for node tunnel addresses in blocks affine to another node (the module
/// documentation's tunnel-address rule).
///
/// Felix (`felix/calc/l3_route_resolver.go`): `onNodeUpdate` adds each tunnel address of a
/// node it has address information for as a reference of that node; in `flush`, a reference
/// at a CIDR overrides the node an IPAM entry there names, and its route is a remote tunnel
/// route, `Borrowed` when the enclosing block is affine to another node.
/// `felix/dataplane/linux/route_mgr.go` `isRemoteTunnelRoute` programs it when the pool type
/// is the manager's, with the same path choice as any route (`updateRoutes`: host NIC when
/// same-subnet, else the tunnel). Asserted by `felix/dataplane/linux/ipip_mgr_test.go`.
pub(super) fn tunnel_address_routes<'a>(ctx: &Ctx<'a>, index: &impl BlocksByCidr<'a>, classes: &BTreeSet<PoolClass>, problems: &mut Problems) -> TunnelOverlay {
    // Address -> its holders (node, kind), by node name then kind: Felix's reference order.
    let mut refs: BTreeMap<IpAddr, Vec<(&str, TunnelAddressKind)>> = BTreeMap::new();
    for node in ctx.cluster.nodes.values() {
        // Felix keeps no node information (so adds no references) for a node without any
        // address (`OnResourceUpdate` leaves `nodeInfo` nil).
        if node.next_hop(false).is_none() && node.next_hop(true).is_none() {
            continue;
        }
        for (kind, addr) in node.tunnel_addresses() {
            refs.entry(addr).or_default().push((&*node.name, kind));
        }
    }
    let mut overlay = TunnelOverlay { routes: BTreeMap::new(), held: refs.keys().copied().collect() };
    if refs.is_empty() {
        return overlay;
    }
    // The blocks holding `addr` (the first not deleted of each CIDR), most specific first:
    // one lookup per prefix length in use, no scan per address.
    let lengths = index.lengths();
    let holding = |addr: IpAddr| -> Vec<&IpamBlock> {
        lengths.iter().rev().filter(|(v6, _)| *v6 == addr.is_ipv6()).filter_map(|&(_, len)| index.first_live(IpNet::new(addr, len).ok()?.trunc())).collect()
    };

    for (addr, mut holders) in refs {
        holders.sort();
        holders.dedup();
        let winner = holders[0].0;
        let kind = holders.iter().filter(|h| h.0 == winner).map(|h| h.1).min().unwrap_or(TunnelAddressKind::Ipip);
        let nodes: BTreeSet<&str> = holders.iter().map(|h| h.0).collect();
        if nodes.len() > 1 {
            problems.insert((
                RouteProblem::TunnelAddressShared { ip: addr, nodes: nodes.iter().map(|n| (*n).to_owned()).collect(), kept: winner.to_owned() },
                None,
            ));
        }
        let dst = IpNet::from(addr);
        let Some((pool, class)) = ctx.routed_class(dst, classes) else { continue };
        let blocks_here = holding(addr);
        // The node IPAM records for the address: its allocation's node, or the node of a /32
        // block that is the address. Felix puts a non-affine allocation (and a /32 block) at
        // the address itself, where the reference overrides it.
        let recorded = blocks_here.iter().find_map(|b| {
            let node = b.allocation_of(addr).and_then(|a| a.attributes.node()).or(if b.cidr == dst { b.host() } else { None })?;
            Some((node, *b))
        });
        if let Some((node, block)) = recorded.filter(|(n, _)| *n != winner) {
            problems.insert((
                RouteProblem::TunnelAddressConflict {
                    ip: addr,
                    kind,
                    tunnel_node: winner.to_owned(),
                    ipam_node: node.to_owned(),
                    block: block.name.to_string(),
                },
                Some(class),
            ));
        }
        // Whether the address needs its own route: IPAM gave it one to another node (now
        // overridden), or the enclosing block is another node's (Felix `Borrowed`).
        let enclosing = blocks_here.iter().find(|b| b.host().is_some()).copied();
        let origin_block = match (recorded, enclosing) {
            (Some((node, _)), _) if node == winner => continue, // the IPAM pass routed it (or said why not)
            (Some((_, block)), _) => block,
            (None, Some(block)) if block.host() != Some(winner) => block,
            _ => continue, // no block of a node holds it, or the holder's own block covers it
        };
        if winner == ctx.local_name {
            overlay.routes.insert(dst, None); // our own tunnel address (Felix: LOCAL_TUNNEL), delivered locally
            continue;
        }
        let origin = |node| RouteOrigin::TunnelAddress { block: origin_block.name.clone(), node, tunnel: kind };
        let route = ctx.route(&origin_block.name, dst, winner, pool, class, origin, problems);
        overlay.routes.insert(dst, route);
    }
    overlay
}

/// BlockAffinities (confirmed or pending, not deleted) that name another node than their
/// IPAM block's `affinity` (reference S08, https://github.com/projectcalico/calico/issues/6486),
/// over `blocks` sorted by (CIDR, name): of blocks with the same CIDR the last by name is
/// compared. The affinities, sorted on the same integer CIDR keys, are walked alongside the
/// pass's [`BlockIndex`] (a binary search per affinity was ~11 % of kube-100k's pass at
/// 100,000 affinities; issue 23). Returned in no particular order (the caller sorts).
fn affinity_conflicts(index: &BlockIndex<'_>, cluster: &Cluster) -> Vec<RouteProblem> {
    let mut affinities: Vec<(CidrKey, &BlockAffinity)> =
        cluster.block_affinities.values().filter(|a| a.is_active()).map(|a| (cidr_key(a.cidr), a.as_ref())).collect();
    affinities.sort_unstable_by_key(|(k, _)| *k);
    let mut out = Vec::new();
    // `start`: the first block whose key is not below the current affinity's.
    let mut start = 0;
    for (key, aff) in affinities {
        start += index.keys[start..].iter().take_while(|k| **k < key).count();
        let end = start + index.keys[start..].iter().take_while(|k| **k == key).count();
        let Some(block) = index.blocks[start..end].last() else { continue };
        out.extend(affinity_conflict(block, aff));
    }
    out
}

/// The [`RouteProblem::AffinityConflict`] of active affinity `aff` whose CIDR is that of
/// `block` (the last block by name of the CIDR), if it names another node.
pub(super) fn affinity_conflict(block: &IpamBlock, aff: &BlockAffinity) -> Option<RouteProblem> {
    (block.host() != Some(aff.node.as_str())).then(|| RouteProblem::AffinityConflict {
        block: block.name.to_string(),
        cidr: block.cidr,
        ipam_node: block.affinity.as_ref().map_or_else(|| "no node".to_owned(), |a| format!("{:?}", a.name())),
        affinity: aff.name.clone(),
        claimant: aff.node.clone(),
    })
}

/// A CIDR as an integer key that sorts as [`IpNet`] does (IPv4 before IPv6, then address,
/// then prefix length), compared without touching the block it belongs to.
pub(super) type CidrKey = (bool, u128, u8);

pub(super) fn cidr_key(cidr: IpNet) -> CidrKey {
    match cidr {
        IpNet::V4(n) => (false, u128::from(u32::from(n.addr())), n.prefix_len()),
        IpNet::V6(n) => (true, u128::from(n.addr()), n.prefix_len()),
    }
}

/// The IPAM blocks of one pass, sorted by (CIDR, name), with their CIDR keys alongside for
/// lookups by binary search, and the (family, prefix length) pairs in use. Names are unique,
/// so the order is total and does not depend on the input's.
pub(super) struct BlockIndex<'a> {
    keys: Vec<CidrKey>,
    blocks: Vec<&'a IpamBlock>,
    lengths: BTreeSet<(bool, u8)>,
}

impl<'a> BlockIndex<'a> {
    fn new(cluster: &'a Cluster) -> BlockIndex<'a> {
        let mut keyed: Vec<(CidrKey, &IpamBlock)> = cluster.ipam_blocks.values().map(|b| (cidr_key(b.cidr), b.as_ref())).collect();
        keyed.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.name.cmp(&b.1.name)));
        // The pairs in use, marked in a table of every possible one (a set built from 100,000
        // pairs sorts them all first).
        let mut in_use = [[false; 129]; 2];
        for (k, _) in keyed.iter().filter(|(_, b)| !b.deleted) {
            in_use[usize::from(k.0)][usize::from(k.2)] = true;
        }
        let lengths = (0..2).flat_map(|v6| (0..=128u8).filter(move |&len| in_use[v6][usize::from(len)]).map(move |len| (v6 == 1, len))).collect();
        let (keys, blocks) = keyed.into_iter().unzip();
        BlockIndex { keys, blocks, lengths }
    }

    /// The blocks whose CIDR is `cidr`, by name.
    fn with_cidr(&self, cidr: IpNet) -> &[&'a IpamBlock] {
        let key = cidr_key(cidr);
        let start = self.keys.partition_point(|k| *k < key);
        let end = start + self.keys[start..].partition_point(|k| *k == key);
        &self.blocks[start..end]
    }
}

/// What every route of a pass for one node is computed from besides the IPAM blocks.
pub(super) struct Ctx<'a> {
    cluster: &'a Cluster,
    local_name: &'a str,
    local: Option<&'a Node>,
    /// The devices' names, shared by every route of the pass.
    tunnel: Arc<str>,
    host_nic: Arc<str>,
    /// The Nodes this pass found by name. The cluster's map finds one by a binary search of
    /// name comparisons (~0.2 µs at 5,000 Nodes), and each Node is asked for again by each
    /// of its blocks and borrowed IPs: at 100,000 blocks those searches were ~30 % of the
    /// pass (compute-100k).
    found_nodes: RefCell<HashMap<&'a str, &'a Node>>,
}

impl<'a> Ctx<'a> {
    pub(super) fn new(cluster: &'a Cluster, local_name: &'a str, devices: &RouteDevices) -> Ctx<'a> {
        let local = cluster.nodes.get(local_name).map(AsRef::as_ref);
        Ctx { cluster, local_name, local, tunnel: devices.tunnel.as_str().into(), host_nic: devices.host_nic.as_str().into(), found_nodes: RefCell::default() }
    }

    /// The Node named `name`, if the cluster has it (remembered for the rest of the pass).
    fn node(&self, name: &str) -> Option<&'a Node> {
        if let Some(node) = self.found_nodes.borrow().get(name) {
            return Some(node);
        }
        let (name, node) = self.cluster.nodes.get_key_value(name)?;
        self.found_nodes.borrow_mut().insert(name, node);
        Some(node)
    }

    /// [`RouteProblem::LocalNodeUnknown`] when this node is not in the cluster.
    pub(super) fn local_problem(&self) -> Option<(RouteProblem, Option<PoolClass>)> {
        self.local.is_none().then(|| (RouteProblem::LocalNodeUnknown { node: self.local_name.to_owned() }, None))
    }
}

impl Ctx<'_> {
    /// The pool holding `dst` and its class, when that class is requested and routable here
    /// (not VXLAN, not LoadBalancer-only).
    fn routed_class<'c>(&'c self, dst: IpNet, classes: &BTreeSet<PoolClass>) -> Option<(&'c IpPool, PoolClass)> {
        let pool = self.cluster.pool_for(dst)?;
        let class = PoolKind::of(pool).class()?;
        (class != PoolClass::Vxlan && classes.contains(&class)).then_some((pool, class))
    }

    /// A route to `dst` via node `node`, its origin made by `origin` from the Node's name, or
    /// `None` with the reason in `problems`. Problems found on the way (next-hop sources that
    /// disagree) are added too. The route's names are the model's own (`Arc<str>`, shared):
    /// at 100,000 blocks a route pass allocates no string per route (issue 23).
    #[allow(clippy::too_many_arguments)]
    fn route(
        &self,
        block: &str,
        dst: IpNet,
        node: &str,
        pool: &IpPool,
        class: PoolClass,
        origin: impl FnOnce(Arc<str>) -> RouteOrigin,
        problems: &mut impl Extend<(RouteProblem, Option<PoolClass>)>,
    ) -> Option<ClusterRoute> {
        debug_assert_ne!(node, self.local_name);
        let v6 = dst.addr().is_ipv6();
        let Some(remote) = self.node(node) else {
            problems.extend([(RouteProblem::UnknownNode { block: block.to_owned(), dst, node: node.to_owned() }, Some(class))]);
            return None;
        };
        let Some((node_ip, _)) = remote.next_hop(v6) else {
            problems.extend([(RouteProblem::NodeWithoutAddress { node: node.to_owned(), family: if v6 { 6 } else { 4 }, dst }, Some(class))]);
            return None;
        };
        let same_subnet = pool.cross_subnet() && self.local.and_then(|l| l.subnet(v6)).is_some_and(|subnet| subnet.contains(&node_ip));
        let path = match class {
            PoolClass::Ipip if !same_subnet => RoutePath::Tunnel,
            _ => RoutePath::HostNic,
        };
        if path == RoutePath::HostNic && self.local.is_some_and(|l| l.host_address(v6).is_none()) {
            problems.extend([(RouteProblem::LocalNodeWithoutAddress { node: self.local_name.to_owned(), family: if v6 { 6 } else { 4 } }, Some(class))]);
            return None;
        }
        let (gateway, device) = match path {
            RoutePath::Tunnel => {
                let tunnel_gateway = remote.tunnel_gateway().map(|(gw, _)| gw);
                if tunnel_gateway != Some(node_ip) {
                    problems.extend([(RouteProblem::NextHopSourcesDisagree { node: node.to_owned(), bgp_address: node_ip, tunnel_gateway }, Some(class))]);
                }
                (tunnel_gateway.unwrap_or(node_ip), self.tunnel.clone())
            }
            _ => (node_ip, self.host_nic.clone()),
        };
        Some(ClusterRoute { dst, path, gateway: Some(gateway), device: Some(device), class, pool: pool.name.clone(), origin: origin(remote.name.clone()) })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::model::{Affinity, AffinityState};

    fn block(name: &str, cidr: &str, host: Option<&str>) -> IpamBlock {
        IpamBlock {
            name: name.into(),
            cidr: cidr.parse().unwrap(),
            affinity: host.map(|h| Affinity::Host(h.to_owned())),
            allocations: Vec::new(),
            attributes: Vec::new(),
            deleted: false,
        }
    }

    fn affinity(name: &str, node: &str, cidr: &str, state: AffinityState) -> BlockAffinity {
        BlockAffinity { name: name.to_owned(), node: node.to_owned(), cidr: cidr.parse().unwrap(), state, affinity_type: "host".to_owned(), deleted: false }
    }

    /// The walk of sorted affinities alongside the block index finds what a lookup per
    /// affinity finds: the last block by name of the affinity's CIDR, none for a CIDR without
    /// a block, every affinity of a CIDR claimed twice, IPv4 before IPv6, pending deletions
    /// ignored.
    #[test]
    fn affinity_conflicts_walk_equals_a_lookup_per_affinity() {
        let mut c = Cluster::default();
        for b in [
            block("b-1", "10.0.0.0/26", Some("node-a")),
            block("a-dup", "10.0.0.64/26", Some("node-x")),
            block("z-dup", "10.0.0.64/26", Some("node-b")),
            block("b-3", "10.0.1.0/26", None),
            block("b-6", "fd00::/122", Some("node-c")),
        ] {
            c.ipam_blocks.insert(b.name.clone(), Arc::new(b));
        }
        for a in [
            affinity("a1", "node-a", "10.0.0.0/26", AffinityState::Confirmed),
            affinity("a2", "node-b", "10.0.0.64/26", AffinityState::Confirmed),
            affinity("a3", "node-x", "10.0.0.64/26", AffinityState::Pending),
            affinity("a4", "node-d", "10.0.1.0/26", AffinityState::Confirmed),
            affinity("a5", "node-e", "10.9.9.0/26", AffinityState::Confirmed),
            affinity("a6", "node-f", "fd00::/122", AffinityState::Confirmed),
            affinity("a7", "node-g", "10.0.0.0/26", AffinityState::PendingDeletion),
        ] {
            c.block_affinities.insert(a.name.as_str().into(), Arc::new(a));
        }
        let index = BlockIndex::new(&c);
        let mut walked = affinity_conflicts(&index, &c);
        walked.sort();
        let mut looked_up: Vec<RouteProblem> =
            c.block_affinities.values().filter(|a| a.is_active()).filter_map(|a| affinity_conflict(index.with_cidr(a.cidr).last()?, a)).collect();
        looked_up.sort();
        assert_eq!(walked, looked_up);
        let named: Vec<(&str, &str)> = walked
            .iter()
            .map(|p| match p {
                RouteProblem::AffinityConflict { block, affinity, .. } => (block.as_str(), affinity.as_str()),
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(named, [("b-3", "a4"), ("b-6", "a6"), ("z-dup", "a3")]);
    }
}
