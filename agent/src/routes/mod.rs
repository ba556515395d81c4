//! Desired cluster routes: pure computation of the routes one node needs for the pool classes
//! routewarden programs. No I/O. The contract between the ownership engine (which decides the
//! classes) and the dataplane (which programs them).
//!
//! Rules mirror Felix: `felix/calc/l3_route_resolver.go` (blocks, borrowed IPs, next hop
//! selection, same-subnet test) and `felix/dataplane/linux/route_mgr.go` (route shapes,
//! blackholes for own blocks). See `../shared/reference/calico-cluster-routes.md` §2.
//!
//! The parts: `compute.rs` the pass (its rules in its header), `pass_context.rs` the route to
//! one node (path, gateway, device), `tunnel_address.rs` the tunnel-address rule,
//! `block_index.rs` the blocks by CIDR and affinity conflicts, `problem.rs` what a pass
//! reports, `memo.rs` the pass kept between snapshots.

use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use crate::model::TunnelAddressKind;
use crate::vocabulary::{PoolClass, RoutePath};

mod block_index;
pub mod compute;
mod memo;
mod pass_context;
mod problem;
mod tunnel_address;

pub use compute::{classed_routes, desired_routes, routable_classes, ClassedRoutes, NodeRoutes};
pub use memo::RouteMemo;
pub use problem::RouteProblem;

/// Cluster routes by destination, one per destination, in a map whose copies share what did
/// not change ([`crate::model::SharedMap`]): the route pass's answer and the plan's routes,
/// handed on and compared chunk by chunk ([`crate::model::SharedMap::diff`]). Each route is
/// held once (`Arc`) by the route pass, its answer, the plan's desired routes and the
/// audit's expectations: at 100,000 routes a copy in each is tens of MB.
pub type RouteMap = crate::model::SharedMap<IpNet, Arc<ClusterRoute>>;

/// Why a cluster route exists.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum RouteOrigin {
    /// A remote IPAM block affine to `node` (`affinity: host:<node>`).
    RemoteBlock { block: Arc<str>, node: Arc<str> },
    /// An IP of `block` borrowed by `node` (the allocation's `secondary.node`).
    BorrowedIp { block: Arc<str>, node: Arc<str> },
    /// One of this node's own IPAM blocks (a blackhole).
    OwnBlock { block: Arc<str> },
    /// A tunnel address of `node` (its Node's `tunnel` address) inside IPAM block `block`,
    /// which is affine to another node or records the address for another node (Felix's
    /// borrowed remote tunnel route, `route_mgr.go` `isRemoteTunnelRoute`).
    TunnelAddress { block: Arc<str>, node: Arc<str>, tunnel: TunnelAddressKind },
}

impl RouteOrigin {
    /// The IPAM block the route comes from.
    pub fn block(&self) -> &Arc<str> {
        match self {
            RouteOrigin::RemoteBlock { block, .. }
            | RouteOrigin::BorrowedIp { block, .. }
            | RouteOrigin::OwnBlock { block }
            | RouteOrigin::TunnelAddress { block, .. } => block,
        }
    }

    /// The node the route leads to; `None` for an own block (a blackhole).
    pub fn node(&self) -> Option<&str> {
        self.node_shared().map(|n| &**n)
    }

    /// [`node`](Self::node) as the model shares the name: cloning it copies no string (a
    /// nexthop object's key is built per route, `dataplane::kernel::nexthop::NexthopKey`).
    pub fn node_shared(&self) -> Option<&Arc<str>> {
        match self {
            RouteOrigin::RemoteBlock { node, .. } | RouteOrigin::BorrowedIp { node, .. } | RouteOrigin::TunnelAddress { node, .. } => Some(node),
            RouteOrigin::OwnBlock { .. } => None,
        }
    }
}

/// One cluster route this node should have, independent of protocol, metric and table (those
/// are the dataplane's settings).
///
/// Shapes (Felix `route_mgr.go`, reference §2.6):
/// - [`RoutePath::Tunnel`]: `dst via gateway dev device onlink`
/// - [`RoutePath::HostNic`]: `dst via gateway dev device onlink`
/// - [`RoutePath::Blackhole`]: `blackhole dst` (`gateway` and `device` are `None`)
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct ClusterRoute {
    /// Destination: an IPAM block CIDR, or a /32 (/128) for a borrowed IP or a node's
    /// tunnel address in another node's block.
    pub dst: IpNet,
    /// Tunnel, host NIC or blackhole.
    pub path: RoutePath,
    /// Next hop: the remote node's address. Host-NIC routes: BGP address, else InternalIP,
    /// else ExternalIP ([`crate::model::Node::next_hop`]); tunnel routes: BGP address only
    /// when written with a prefix length, else InternalIP, else ExternalIP
    /// ([`crate::model::Node::tunnel_gateway`]).
    pub gateway: Option<IpAddr>,
    /// Output device name (`tunl0`, `eth0`, ...); resolved to an ifindex at apply time.
    pub device: Option<Arc<str>>,
    /// Class of the pool the destination belongs to.
    pub class: PoolClass,
    /// Name of the IP pool the destination belongs to.
    pub pool: Arc<str>,
    /// Why the route exists.
    pub origin: RouteOrigin,
}

/// Names of the devices cluster routes use on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteDevices {
    /// The IPIP tunnel device (`tunl0`).
    pub tunnel: String,
    /// The host NIC that holds the node's address (`eth0`).
    pub host_nic: String,
}

/// A device name routewarden would write into a route or a BIRD filter is not a Linux
/// interface name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--{flag} {name:?}: not an interface name (1 to 15 characters of letters, digits, '.', '_', '-', '@')")]
pub struct DeviceNameError {
    /// `tunnel-device` or `host-device`.
    pub flag: &'static str,
    /// The rejected name (escape before printing).
    pub name: String,
}

impl RouteDevices {
    /// Check both names as the kernel limits interface names (`IFNAMSIZ` 16 with the NUL,
    /// no `/` or whitespace; `dev_valid_name`), narrowed to the characters that need no
    /// quoting in a BIRD string.
    ///
    /// # Errors
    /// The first invalid name.
    pub fn validate(&self) -> Result<(), DeviceNameError> {
        for (flag, name) in [("tunnel-device", &self.tunnel), ("host-device", &self.host_nic)] {
            let ok = (1..=15).contains(&name.len())
                && name != "."
                && name != ".."
                && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@'));
            if !ok {
                return Err(DeviceNameError { flag, name: crate::text::escape(name).into_owned() });
            }
        }
        Ok(())
    }
}

impl Default for RouteDevices {
    fn default() -> Self {
        RouteDevices { tunnel: "tunl0".into(), host_nic: "eth0".into() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device name goes into routes and into `bird-filter`'s `ifname = "..."`: only real
    /// interface names pass (nothing reaches BIRD config unchecked).
    #[test]
    fn device_names_are_interface_names() {
        let ok = RouteDevices { tunnel: "tunl0".into(), host_nic: "bond0.100".into() };
        assert_eq!(ok.validate(), Ok(()));
        for bad in ["", "a\"; accept; \"", "eth0\nx", "averyveryverylongname", "a b", "x/y", "..", "."] {
            let d = RouteDevices { tunnel: bad.into(), ..RouteDevices::default() };
            let err = d.validate().unwrap_err();
            assert_eq!(err.flag, "tunnel-device", "{bad:?}");
            assert!(!err.to_string().contains('\n'), "{err}");
        }
    }
}
