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

use crate::plan::{Expectations, ExpectedRoute};
use crate::routes::{ClusterRoute, RouteMap};
use crate::vocabulary::{PoolClass, RoutePath, Writer};

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

/// The forwarding watch's destinations by prefix, in a map whose copies share what did not
/// change ([`crate::model::SharedMap`]): handed to the watch, which writes what differs from
/// the last map it wrote, found chunk by chunk.
pub type ForwardEntries = crate::model::SharedMap<IpNet, ForwardEntry>;

/// [`entries_from_routes`] kept from one plan to the next: a plan whose programmed classes are
/// the last one's costs the destinations whose desired route or expectation changed (found
/// chunk by chunk in the plan's maps), not a pass over every route. Starts empty; the first
/// call, and any whose programmed classes differ, computes every entry.
#[derive(Debug, Default)]
pub struct EntriesMemo {
    last: Option<(RouteMap, Expectations, BTreeSet<PoolClass>, ForwardEntries)>,
}

impl EntriesMemo {
    /// The entries of a plan's desired routes, expectations and programmed classes; equal to
    /// [`entries_from_routes`] of the same (`agent/tests/routes_compute.rs` compares them over
    /// random sequences of changes).
    pub fn entries(&mut self, desired: &RouteMap, expected: &Expectations, programmed: &BTreeSet<PoolClass>) -> ForwardEntries {
        let out = match &self.last {
            Some((was_desired, was_expected, was_programmed, was)) if was_programmed == programmed => {
                patched(was_desired, was_expected, was, desired, expected, programmed)
            }
            _ => None,
        }
        .unwrap_or_else(|| entries_from_routes(desired.values().map(|r| &**r), expected.values(), programmed).into_iter().map(|e| (e.prefix, e)).collect());
        self.last = Some((desired.clone(), expected.clone(), programmed.clone(), out.clone()));
        out
    }
}

/// `was` brought to the new desired routes and expectations at the destinations that changed;
/// `None` when one is not in network form (keys would not meet).
fn patched(
    was_desired: &RouteMap,
    was_expected: &Expectations,
    was: &ForwardEntries,
    desired: &RouteMap,
    expected: &Expectations,
    programmed: &BTreeSet<PoolClass>,
) -> Option<ForwardEntries> {
    let mut changed: BTreeSet<IpNet> = BTreeSet::new();
    was_desired.diff(desired, |dst, _, _| {
        changed.insert(*dst);
    });
    was_expected.diff(expected, |(_, _, dst), _, _| {
        changed.insert(*dst);
    });
    if changed.iter().any(|d| *d != d.trunc()) {
        return None;
    }
    let mut out = was.clone();
    for prefix in changed {
        match entry_at(prefix, desired, expected, programmed) {
            Some(e) => {
                if out.get(&prefix) != Some(&e) {
                    out.insert(prefix, e);
                }
            }
            None => {
                out.remove(&prefix);
            }
        }
    }
    Some(out)
}

/// The entry of `prefix` as [`entries_from_routes`] picks it: the desired route of a
/// programmed class, else the first expectation of another class in the expectations' order
/// (class, then writer).
fn entry_at(prefix: IpNet, desired: &RouteMap, expected: &Expectations, programmed: &BTreeSet<PoolClass>) -> Option<ForwardEntry> {
    let ours = desired.get(&prefix).filter(|r| programmed.contains(&r.class)).map(|r| &**r);
    let route = ours.or_else(|| {
        every_class()
            .into_iter()
            .filter(|c| !programmed.contains(c))
            .flat_map(|c| every_writer().map(|w| (c, w)))
            .find_map(|(c, w)| expected.get(&(c, w, prefix)).map(|e| &*e.route))
    })?;
    Some(ForwardEntry { prefix, pool: route.pool.to_string(), class: route.class, expected: forward_path(route.path) })
}

/// Every pool class, in order (the match fails to compile when one is added).
fn every_class() -> [PoolClass; 3] {
    let all = [PoolClass::Ipip, PoolClass::NoEncap, PoolClass::Vxlan];
    for c in all {
        match c {
            PoolClass::Ipip | PoolClass::NoEncap | PoolClass::Vxlan => {}
        }
    }
    all
}

/// Every writer, in order (the match fails to compile when one is added).
fn every_writer() -> [Writer; 3] {
    let all = [Writer::Felix, Writer::Bird, Writer::Routewarden];
    for w in all {
        match w {
            Writer::Felix | Writer::Bird | Writer::Routewarden => {}
        }
    }
    all
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
