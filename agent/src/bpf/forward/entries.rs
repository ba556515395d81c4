//! What goes into the forwarding watch's destination maps (`FORWARD_TARGETS_V4`/`_V6`): one [`ForwardEntry`] per IPAM block
//! and borrowed IP, with its pool, class and the path it should take from this node. Pure; no
//! I/O.
//!
//! Source per class: routewarden's desired routes for the classes it programs, the ownership
//! matrix's expectation (the plan's [`ExpectedRoute`]s: the routes Felix/BIRD should have) for
//! the others, so the watch works the same in audit mode. The app passes both in from its plan
//! (`app::forward_entries`); this file reads the plan's route types, not the plan itself.

use std::collections::{BTreeMap, BTreeSet};

use ipnet::IpNet;
use routewarden_common::forward::{ForwardPath, V4_MAPPED_PREFIX_LEN};

use crate::plan::ExpectedRoute;
use crate::routes::ClusterRoute;
use crate::vocabulary::{PoolClass, RoutePath};

/// One cluster destination as the kernel watch sees it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ForwardEntry {
    /// IPAM block CIDR, or a /32 (/128) borrowed IP.
    pub prefix: IpNet,
    /// IP pool name (metric label `pool`).
    pub pool: String,
    /// Pool class.
    pub class: PoolClass,
    /// Path packets to `prefix` should take from this node.
    pub expected: ForwardPath,
}

/// The watch's path for a route path: tunnel → tunnel, host NIC → host, blackhole → local.
pub fn forward_path(p: RoutePath) -> ForwardPath {
    match p {
        RoutePath::Tunnel => ForwardPath::Tunnel,
        RoutePath::HostNic => ForwardPath::Host,
        RoutePath::Blackhole => ForwardPath::Local,
    }
}

/// Class byte stored in the trie: 0 IPIP, 1 no-encap, 2 VXLAN.
pub fn class_byte(c: PoolClass) -> u8 {
    match c {
        PoolClass::Ipip => 0,
        PoolClass::NoEncap => 1,
        PoolClass::Vxlan => 2,
    }
}

/// Entries from routewarden's `desired` routes for the classes in `programmed`, and from the
/// `expected` routes of every other class. One entry per prefix (the first seen wins; the
/// expectation of two writers of a class is the same route), sorted by prefix.
pub fn entries_from_routes<'r>(
    desired: impl IntoIterator<Item = &'r ClusterRoute>,
    expected: impl IntoIterator<Item = &'r ExpectedRoute>,
    programmed: &BTreeSet<PoolClass>,
) -> Vec<ForwardEntry> {
    let mut out: BTreeMap<IpNet, ForwardEntry> = BTreeMap::new();
    let ours = desired.into_iter().filter(|r| programmed.contains(&r.class));
    let others = expected.into_iter().map(|e| &*e.route).filter(|r| !programmed.contains(&r.class));
    for r in ours.chain(others) {
        out.entry(r.dst.trunc()).or_insert_with(|| ForwardEntry {
            prefix: r.dst.trunc(),
            pool: r.pool.to_string(),
            class: r.class,
            expected: forward_path(r.path),
        });
    }
    out.into_values().collect()
}

/// `prefix` in trie form: (prefix length, 16 address bytes), IPv4 as `::ffff:a.b.c.d` with
/// the length + 96.
pub fn trie_key(prefix: &IpNet) -> (u32, [u8; 16]) {
    match prefix {
        IpNet::V4(n) => (u32::from(n.prefix_len()) + V4_MAPPED_PREFIX_LEN, n.network().to_ipv6_mapped().octets()),
        IpNet::V6(n) => (u32::from(n.prefix_len()), n.network().octets()),
    }
}

/// Inverse of [`trie_key`]; `None` for a length over 128.
pub fn prefix_from_trie(len: u32, addr: [u8; 16]) -> Option<IpNet> {
    let v6 = std::net::Ipv6Addr::from(addr);
    let len = u8::try_from(len).ok()?;
    match v6.to_ipv4_mapped() {
        Some(v4) if u32::from(len) >= V4_MAPPED_PREFIX_LEN => ipnet::Ipv4Net::new(v4, len - 96).ok().map(IpNet::V4),
        _ => ipnet::Ipv6Net::new(v6, len).ok().map(IpNet::V6),
    }
}

/// An address in trie form back to an `IpAddr` (IPv4-mapped → IPv4).
pub fn addr_from_trie(addr: [u8; 16]) -> std::net::IpAddr {
    let v6 = std::net::Ipv6Addr::from(addr);
    v6.to_ipv4_mapped().map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routes::RouteOrigin;
    use crate::vocabulary::Writer;

    fn route(dst: &str, path: RoutePath, class: PoolClass, pool: &str) -> ClusterRoute {
        ClusterRoute {
            dst: dst.parse().unwrap(),
            path,
            gateway: None,
            device: None,
            class,
            pool: pool.into(),
            origin: RouteOrigin::OwnBlock { block: dst.into() },
        }
    }

    #[test]
    fn desired_for_programmed_classes_expectation_for_the_rest() {
        let desired = vec![
            route("10.244.1.0/26", RoutePath::Tunnel, PoolClass::Ipip, "ipip-pool"),
            // A desired route of a class we no longer program is ignored.
            route("10.250.0.0/26", RoutePath::HostNic, PoolClass::NoEncap, "flat"),
        ];
        let expected = vec![
            ExpectedRoute { route: route("10.250.0.0/26", RoutePath::Tunnel, PoolClass::NoEncap, "flat").into(), owner: Writer::Bird, protocol: 12 },
            ExpectedRoute { route: route("10.250.0.0/26", RoutePath::Tunnel, PoolClass::NoEncap, "flat").into(), owner: Writer::Felix, protocol: 80 },
            ExpectedRoute { route: route("10.244.1.0/26", RoutePath::HostNic, PoolClass::Ipip, "ipip-pool").into(), owner: Writer::Bird, protocol: 12 },
            ExpectedRoute { route: route("fd00:10::/122", RoutePath::HostNic, PoolClass::NoEncap, "v6").into(), owner: Writer::Bird, protocol: 12 },
            ExpectedRoute { route: route("10.244.0.0/26", RoutePath::Blackhole, PoolClass::Ipip, "ipip-pool").into(), owner: Writer::Bird, protocol: 12 },
        ];
        let got = entries_from_routes(&desired, &expected, &BTreeSet::from([PoolClass::Ipip]));
        let want = vec![
            ForwardEntry { prefix: "10.244.1.0/26".parse().unwrap(), pool: "ipip-pool".into(), class: PoolClass::Ipip, expected: ForwardPath::Tunnel },
            ForwardEntry { prefix: "10.250.0.0/26".parse().unwrap(), pool: "flat".into(), class: PoolClass::NoEncap, expected: ForwardPath::Tunnel },
            ForwardEntry { prefix: "fd00:10::/122".parse().unwrap(), pool: "v6".into(), class: PoolClass::NoEncap, expected: ForwardPath::Host },
        ];
        assert_eq!(got, want);
        // Audit mode (no class programmed): the expectation alone, blackholes as `local`.
        let audit = entries_from_routes(&desired, &expected, &BTreeSet::new());
        assert_eq!(audit.len(), 4);
        assert_eq!(audit[0].expected, ForwardPath::Local);
        assert_eq!(audit[1].expected, ForwardPath::Host);
    }

    #[test]
    fn trie_keys_round_trip() {
        for p in ["10.244.1.0/26", "10.244.1.7/32", "0.0.0.0/0", "fd00:10::/122", "::/0", "2001:db8::1/128"] {
            let net: IpNet = p.parse().unwrap();
            let (len, addr) = trie_key(&net);
            assert_eq!(prefix_from_trie(len, addr), Some(net), "{p}");
        }
        assert_eq!(trie_key(&"10.244.1.0/26".parse().unwrap()), (122, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 244, 1, 0]));
        assert_eq!(prefix_from_trie(129, [0; 16]), None);
        assert_eq!(addr_from_trie(trie_key(&"10.1.2.3/32".parse().unwrap()).1), "10.1.2.3".parse::<std::net::IpAddr>().unwrap());
    }
}
