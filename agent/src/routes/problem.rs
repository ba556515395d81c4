//! What a route pass reports instead of guessing: a route that could not be computed, or an
//! inconsistency in the IPAM data, each with a stable code for metrics and JSON.

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::Serialize;

use crate::model::TunnelAddressKind;
use crate::vocabulary::PoolClass;

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

/// Problems found on the way, each with the pool class of the routes it concerns (`None`: a
/// problem of the data whatever the classes, such as a block in no pool), so that one pass
/// over every class can answer for a subset ([`super::ClassedRoutes::select`]).
pub(crate) type Problems = BTreeSet<(RouteProblem, Option<PoolClass>)>;
