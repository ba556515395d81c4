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
//! - next hop: the remote node's BGP address, else its InternalIP, else its ExternalIP, per
//!   family ([`Node::next_hop`]);
//! - IPIP: `via <node> dev <tunnel> onlink`, unless the pool is CrossSubnet and the next hop
//!   is inside this node's BGP subnet (`nodeInOurSubnet`), then `via <node> dev <host NIC>
//!   onlink`, as for no-encap pools, v4 and v6 (`route_mgr.go` `noEncapRoute`).
//!
//! VXLAN-class blocks are never routed here (they need VTEPs and `vxlan.calico`; Felix always
//! programs them), and LoadBalancer-only pools have no cluster routes. What cannot be computed
//! is reported as a [`RouteProblem`], never guessed. Output order is deterministic and does not
//! depend on input order.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use serde::Serialize;

use super::{ClusterRoute, PoolClass, RouteDevices, RouteOrigin, RoutePath};
use crate::model::{Cluster, IpPool, IpamBlock, Node};
use crate::ownership::PoolKind;

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
    /// A route's node has no address of the destination's family.
    #[error("no route to {dst}: node {node:?} has no IPv{family} address (BGP address, InternalIP or ExternalIP)")]
    NodeWithoutAddress { node: String, family: u8, dst: IpNet },
    /// A BlockAffinity claims a block for another node than the IPAM block's `affinity`; the
    /// route follows the IPAM block, as Felix does (reference S08).
    #[error("IPAM block {block} ({cidr}) is affine to {ipam_node} but BlockAffinity {affinity} claims it for {claimant:?}; routing follows the IPAM block")]
    AffinityConflict { block: String, cidr: IpNet, ipam_node: String, affinity: String, claimant: String },
    /// Two sources produce the same destination; the first (in block order) is kept.
    #[error("two routes to {dst} (from IPAM blocks {kept} and {dropped}); the one from {kept} is kept")]
    DuplicateDestination { dst: IpNet, kept: String, dropped: String },
}

impl RouteProblem {
    /// Stable label for metrics.
    /// The IPAM block concerned (its object name), or `""` when the problem has none.
    pub fn block(&self) -> &str {
        match self {
            RouteProblem::BlockOutsidePools { block, .. }
            | RouteProblem::BlockDeleted { block, .. }
            | RouteProblem::BlockWithoutOwner { block, .. }
            | RouteProblem::AllocationWithoutNode { block, .. }
            | RouteProblem::UnknownNode { block, .. }
            | RouteProblem::AffinityConflict { block, .. } => block,
            _ => "",
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            RouteProblem::LocalNodeUnknown { .. } => "local-node-unknown",
            RouteProblem::BlockOutsidePools { .. } => "block-outside-pools",
            RouteProblem::BlockDeleted { .. } => "block-deleted",
            RouteProblem::BlockWithoutOwner { .. } => "block-without-owner",
            RouteProblem::AllocationWithoutNode { .. } => "allocation-without-node",
            RouteProblem::UnknownNode { .. } => "unknown-node",
            RouteProblem::NodeWithoutAddress { .. } => "node-without-address",
            RouteProblem::AffinityConflict { .. } => "affinity-conflict",
            RouteProblem::DuplicateDestination { .. } => "duplicate-destination",
        }
    }
}

/// The classes routewarden can route: IPIP and no-encap (never VXLAN). Pass this to
/// [`desired_routes`] to get the expected path of every routable class (audit, TC watch).
pub fn routable_classes() -> BTreeSet<PoolClass> {
    BTreeSet::from([PoolClass::Ipip, PoolClass::NoEncap])
}

/// The cluster routes node `node_name` needs for the pool `classes` given, with the devices
/// named in `devices`. [`PoolClass::Vxlan`] in `classes` has no effect.
pub fn desired_routes(
    cluster: &Cluster,
    node_name: &str,
    classes: &BTreeSet<PoolClass>,
    devices: &RouteDevices,
) -> DesiredRoutes {
    let local = cluster.nodes.get(node_name);
    let mut problems = BTreeSet::new();
    if local.is_none() {
        problems.insert(RouteProblem::LocalNodeUnknown { node: node_name.to_owned() });
    }
    let ctx = Ctx { cluster, local_name: node_name, local, devices };

    // Blocks in CIDR order (names break ties), so "first" is independent of input order.
    let mut blocks: Vec<&IpamBlock> = cluster.ipam_blocks.values().collect();
    blocks.sort_by(|a, b| (a.cidr, &a.name).cmp(&(b.cidr, &b.name)));

    let mut routes: BTreeMap<IpNet, (ClusterRoute, String)> = BTreeMap::new();
    let mut add = |route: ClusterRoute, block: &str, problems: &mut BTreeSet<RouteProblem>| {
        if let Some((_, kept)) = routes.get(&route.dst) {
            problems.insert(RouteProblem::DuplicateDestination {
                dst: route.dst,
                kept: kept.clone(),
                dropped: block.to_owned(),
            });
        } else {
            routes.insert(route.dst, (route, block.to_owned()));
        }
    };

    for block in blocks {
        let Some(pool) = cluster.pool_for(block.cidr) else {
            problems.insert(RouteProblem::BlockOutsidePools { block: block.name.clone(), cidr: block.cidr });
            continue;
        };
        let Some(class) = PoolKind::of(pool).class() else { continue };
        if class == PoolClass::Vxlan || !classes.contains(&class) {
            continue;
        }
        if block.deleted {
            problems.insert(RouteProblem::BlockDeleted { block: block.name.clone(), cidr: block.cidr });
            continue;
        }
        let host = block.host();
        match host {
            Some(h) if h == node_name => {
                if block.cidr.prefix_len() < block.cidr.max_prefix_len() {
                    add(
                        ClusterRoute {
                            dst: block.cidr,
                            path: RoutePath::Blackhole,
                            gateway: None,
                            device: None,
                            class,
                            pool: pool.name.clone(),
                            origin: RouteOrigin::OwnBlock { block: block.name.clone() },
                        },
                        &block.name,
                        &mut problems,
                    );
                }
            }
            Some(h) => {
                let origin = RouteOrigin::RemoteBlock { block: block.name.clone(), node: h.to_owned() };
                match ctx.route(block, block.cidr, h, pool, class, origin) {
                    Ok(r) => add(r, &block.name, &mut problems),
                    Err(p) => {
                        problems.insert(p);
                    }
                }
            }
            None => {
                if !block.allocated().any(|a| a.attributes.node().is_some()) {
                    problems.insert(RouteProblem::BlockWithoutOwner { block: block.name.clone(), cidr: block.cidr });
                    continue;
                }
            }
        }
        for alloc in block.non_affine_allocations() {
            let Some(owner) = alloc.attributes.node() else {
                problems.insert(RouteProblem::AllocationWithoutNode { block: block.name.clone(), ip: alloc.ip });
                continue;
            };
            if owner == node_name {
                continue; // our own workload: its route is the CNI's, not a cluster route
            }
            let dst = IpNet::from(alloc.ip);
            let origin = RouteOrigin::BorrowedIp { block: block.name.clone(), node: owner.to_owned() };
            match ctx.route(block, dst, owner, pool, class, origin) {
                Ok(r) => add(r, &block.name, &mut problems),
                Err(p) => {
                    problems.insert(p);
                }
            }
        }
    }
    problems.extend(affinity_conflicts(cluster));
    DesiredRoutes {
        routes: routes.into_values().map(|(r, _)| r).collect(),
        problems: problems.into_iter().collect(),
    }
}

/// BlockAffinities (confirmed or pending, not deleted) that name another node than their
/// IPAM block's `affinity` (reference S08, https://github.com/projectcalico/calico/issues/6486).
pub fn affinity_conflicts(cluster: &Cluster) -> Vec<RouteProblem> {
    let by_cidr: BTreeMap<IpNet, &IpamBlock> = cluster.ipam_blocks.values().map(|b| (b.cidr, b)).collect();
    let mut out = Vec::new();
    for aff in cluster.block_affinities.values().filter(|a| a.is_active()) {
        let Some(block) = by_cidr.get(&aff.cidr) else { continue };
        if block.host() != Some(aff.node.as_str()) {
            out.push(RouteProblem::AffinityConflict {
                block: block.name.clone(),
                cidr: block.cidr,
                ipam_node: block.affinity.as_ref().map_or_else(|| "no node".to_owned(), |a| format!("{:?}", a.name())),
                affinity: aff.name.clone(),
                claimant: aff.node.clone(),
            });
        }
    }
    out
}

struct Ctx<'a> {
    cluster: &'a Cluster,
    local_name: &'a str,
    local: Option<&'a Node>,
    devices: &'a RouteDevices,
}

impl Ctx<'_> {
    /// A route to `dst` via node `node`.
    fn route(
        &self,
        block: &IpamBlock,
        dst: IpNet,
        node: &str,
        pool: &IpPool,
        class: PoolClass,
        origin: RouteOrigin,
    ) -> Result<ClusterRoute, RouteProblem> {
        debug_assert_ne!(node, self.local_name);
        let v6 = dst.addr().is_ipv6();
        let remote = self.cluster.nodes.get(node).ok_or_else(|| RouteProblem::UnknownNode {
            block: block.name.clone(),
            dst,
            node: node.to_owned(),
        })?;
        let (gateway, _) = remote.next_hop(v6).ok_or_else(|| RouteProblem::NodeWithoutAddress {
            node: node.to_owned(),
            family: if v6 { 6 } else { 4 },
            dst,
        })?;
        let same_subnet = pool.cross_subnet()
            && self.local.and_then(|l| l.subnet(v6)).is_some_and(|subnet| subnet.contains(&gateway));
        let path = match class {
            PoolClass::Ipip if !same_subnet => RoutePath::Tunnel,
            _ => RoutePath::HostNic,
        };
        let device = match path {
            RoutePath::Tunnel => self.devices.tunnel.clone(),
            _ => self.devices.host_nic.clone(),
        };
        Ok(ClusterRoute {
            dst,
            path,
            gateway: Some(gateway),
            device: Some(device),
            class,
            pool: pool.name.clone(),
            origin,
        })
    }
}
