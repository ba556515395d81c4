//! `ClusterRoute` builders for tests: one constructor with every field, the origins by name, and
//! the two shapes the dataplane tests build most (a route to another node, a blackholed own
//! block). Addresses and prefixes are given as text and panic when they do not parse: a test's
//! literal that does not parse is a bug in the test.

use std::sync::Arc;

use routewarden::routes::{ClusterRoute, RouteOrigin};
use routewarden::vocabulary::{PoolClass, RoutePath};

/// The pool class a route on `path` has in the example clusters: no-encap on the host NIC,
/// IPIP otherwise (tunnel, and blackholes of IPIP pools).
pub fn class_of(path: RoutePath) -> PoolClass {
    if path == RoutePath::HostNic {
        PoolClass::NoEncap
    } else {
        PoolClass::Ipip
    }
}

/// One of this node's own IPAM blocks, `block` (what a blackhole route comes from).
pub fn own_block(block: &str) -> RouteOrigin {
    RouteOrigin::OwnBlock { block: block.into() }
}

/// The IPAM block `block`, affine to `node`.
pub fn remote_block(block: &str, node: &str) -> RouteOrigin {
    RouteOrigin::RemoteBlock { block: block.into(), node: node.into() }
}

/// A borrowed IP of `node` when `dst` is a host prefix (/32, /128), else the block `dst`
/// affine to `node`.
///
/// # Panics
/// When `dst` is not a CIDR.
pub fn block_or_borrowed_ip(dst: &str, node: &str) -> RouteOrigin {
    let net: ipnet::IpNet = dst.parse().unwrap_or_else(|e| panic!("{dst}: {e}"));
    let node: Arc<str> = node.into();
    if net.prefix_len() == net.max_prefix_len() {
        RouteOrigin::BorrowedIp { block: dst.into(), node }
    } else {
        RouteOrigin::RemoteBlock { block: dst.into(), node }
    }
}

/// A cluster route with every field given but the device (none: resolved at apply time).
///
/// # Panics
/// When `dst` is not a CIDR or `gw` not an address.
pub fn route(dst: &str, path: RoutePath, gw: Option<&str>, class: PoolClass, pool: &str, origin: RouteOrigin) -> ClusterRoute {
    ClusterRoute {
        dst: dst.parse().unwrap_or_else(|e| panic!("{dst}: {e}")),
        path,
        gateway: gw.map(|g| g.parse().unwrap_or_else(|e| panic!("{g}: {e}"))),
        device: None,
        class,
        pool: pool.into(),
        origin,
    }
}

/// A route to `dst` via `node` at `gw` on `path`, in `pool`, of [`class_of`] `path`; a
/// borrowed IP when `dst` is a /32 or /128 ([`block_or_borrowed_ip`]).
///
/// # Panics
/// When `dst` is not a CIDR or `gw` not an address.
pub fn to_node(dst: &str, path: RoutePath, gw: &str, node: &str, pool: &str) -> ClusterRoute {
    route(dst, path, Some(gw), class_of(path), pool, block_or_borrowed_ip(dst, node))
}

/// This node's own block `dst` of an IPIP pool `pool`, blackholed.
///
/// # Panics
/// When `dst` is not a CIDR.
pub fn blackhole(dst: &str, pool: &str) -> ClusterRoute {
    route(dst, RoutePath::Blackhole, None, PoolClass::Ipip, pool, own_block(dst))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_prefix_is_a_borrowed_ip_and_a_block_is_a_block() {
        let r = to_node("10.244.10.9/32", RoutePath::Tunnel, "10.0.1.13", "node-c", "p");
        assert_eq!(r.origin, RouteOrigin::BorrowedIp { block: "10.244.10.9/32".into(), node: "node-c".into() });
        assert_eq!(r.class, PoolClass::Ipip);
        let r = to_node("10.244.30.0/26", RoutePath::HostNic, "10.0.0.12", "node-b", "p");
        assert_eq!(r.origin, RouteOrigin::RemoteBlock { block: "10.244.30.0/26".into(), node: "node-b".into() });
        assert_eq!(r.class, PoolClass::NoEncap);
        assert_eq!(blackhole("10.244.10.0/26", "p").gateway, None);
    }
}
