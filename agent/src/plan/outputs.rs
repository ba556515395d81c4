//! What the plan hands to the layers below it: the handovers the dataplane carries out, the
//! expectations and scope the audit compares the kernel with, and the WireGuard routes left to
//! Felix. Plain data; the dataplane and the forwarding watch import these, never the reverse.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::Serialize;

use crate::routes::{ClusterRoute, RouteDevices};
use crate::vocabulary::{PoolClass, Writer};

/// A new owner for a class routewarden stops programming: its routes are kept until the new
/// owner's route for the same prefix (`protocol` in `table`) is seen, at most the grace period.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Handover {
    /// The class being handed over.
    pub class: PoolClass,
    /// Who programs it from now on.
    pub to: Writer,
    /// The protocol the new owner's routes carry (Felix 80, BIRD 12).
    pub protocol: u8,
    /// The table the new owner writes (254 for Felix and BIRD).
    pub table: u32,
    /// The metric of the new owner's routes, when known. A hand-over to BIRD in our route's
    /// table steps aside (ours moves to metric+1 before BIRD's add) unless this is known to
    /// differ from our route's metric; `None` (unknown, e.g. set by confd's `bird.cfg`) steps
    /// aside, which costs two writes and is safe at any BIRD metric.
    pub metric: Option<u32>,
}

/// What one owner should have programmed for one prefix.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ExpectedRoute {
    /// The route (shared with the plan's routes where the owner's is the same).
    pub route: std::sync::Arc<ClusterRoute>,
    /// Who should program it.
    pub owner: Writer,
    /// The protocol that owner writes (Felix 80, BIRD 12, routewarden's configured one).
    pub protocol: u8,
}

/// What the audit needs besides routes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditScope {
    /// The table to audit (254 main).
    pub table: u32,
    /// Pool CIDRs of the audited classes: a route inside one with no expectation is stale or
    /// foreign.
    pub cluster_cidrs: Vec<IpNet>,
    /// Device names, for expected routes without a device.
    pub devices: RouteDevices,
    /// routewarden's protocol (a known writer).
    pub our_protocol: u8,
    /// Cluster prefixes of classes nobody programs, each with the ownership finding's reason.
    pub unowned: Vec<(IpNet, String)>,
    /// Prefixes BIRD would own that lead to a WireGuard peer (reported, not expected).
    pub wireguard: Vec<WireguardRoute>,
}

/// A cluster prefix routed over WireGuard, not by BIRD's kernel protocol.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct WireguardRoute {
    /// The prefix (an IPAM block or a borrowed IP of the peer).
    pub prefix: IpNet,
    /// The peer node's name.
    pub peer: String,
    /// The peer's BGP address of the prefix's family: what confd's reject line names.
    pub bgp_address: IpAddr,
}
