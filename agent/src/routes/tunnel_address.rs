//! The tunnel-address rule: a Node's tunnel address (IPIP, VXLAN, WireGuard) inside an IPAM
//! block affine to another node gets a /32 (/128) to its Node, overriding what IPAM records
//! there, as Felix's route resolver does (see [`tunnel_address_routes`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;

use super::block_index::BlocksByCidr;
use super::pass_context::Ctx;
use super::problem::{Problems, RouteProblem};
use super::{ClusterRoute, RouteOrigin};
use crate::model::{IpamBlock, TunnelAddressKind};
use crate::vocabulary::PoolClass;

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
    /// `routes` (ascending by destination, one per destination) with this overlay applied, in
    /// destination order, each handed to `out`: a destination the overlay names takes its
    /// route (`wrap`ped) or none, and the overlay's other destinations are added in order.
    /// The full pass and the kept pass ([`super::RouteMemo`]) both merge through this.
    pub(super) fn apply<R>(&self, routes: impl IntoIterator<Item = R>, dst: impl Fn(&R) -> IpNet, wrap: impl Fn(&ClusterRoute) -> R, mut out: impl FnMut(R)) {
        let mut over = self.routes.iter().peekable();
        for r in routes {
            let d = dst(&r);
            while let Some((_, replacement)) = over.next_if(|(o, _)| **o < d) {
                if let Some(t) = replacement {
                    out(wrap(t));
                }
            }
            match over.next_if(|(o, _)| **o == d) {
                Some((_, replacement)) => replacement.iter().for_each(|t| out(wrap(t))),
                None => out(r),
            }
        }
        for t in over.filter_map(|(_, replacement)| replacement.as_ref()) {
            out(wrap(t));
        }
    }

    pub(super) fn clear_held(&self, problems: &mut Problems) {
        if !self.held.is_empty() {
            problems.retain(|(p, _)| !matches!(p, RouteProblem::AllocationWithoutNode { ip, .. } if self.held.contains(ip)));
        }
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
