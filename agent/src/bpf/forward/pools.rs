//! The pool filter of the forwarding watch: a few disjoint prefixes ("pool
//! ranges") covering every destination, each with the prefix lengths of the destinations
//! inside it, longest first. The TC program tests a packet's destination against the ranges
//! before any map lookup (non-cluster traffic exits there) and then does one hash lookup per
//! length of its range. Pure; no I/O.
//!
//! The ranges are derived from the destinations themselves, not from the IP pools' CIDRs
//! (which the plan's routes do not carry): for Calico's shape — blocks of one size per pool
//! and borrowed /32s, all inside the pool's CIDR — they come out as one range per pool or
//! tighter. Derivation: the maximal destination prefixes (those inside no other) are the
//! starting ranges; while there are more than four (the filter holds eight IPv4 and four
//! IPv6 ranges), ranges are grouped by a common prefix of length `L` for `L` = 128, 127, ...
//! (in the family's bits), taking the longest `L` that gets there. Grouping keeps the ranges disjoint, and every destination stays
//! inside exactly one range, so "longest length of its range that hits" is the longest match
//! over all destinations, exactly as the LPM trie it replaces.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use routewarden_common::forward::{PoolFilter, PoolRangeV4, PoolRangeV6, TargetKeyV4, TargetKeyV6, POOL_RANGES_V4, POOL_RANGES_V6, RANGE_LENGTHS};

/// Ranges the grouping goes down to when it can: every range is a compare for every
/// non-cluster packet, and Calico clusters have a handful of pools per family.
const PREFERRED_RANGES: usize = 4;

/// A prefix of one family, its address left-aligned in 128 bits (IPv4 in the top 32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Prefix {
    addr: u128,
    len: u8,
}

fn mask(len: u8) -> u128 {
    if len == 0 {
        0
    } else {
        u128::MAX << (128 - u32::from(len))
    }
}

impl Prefix {
    fn contains(self, other: Prefix) -> bool {
        other.len >= self.len && other.addr & mask(self.len) == self.addr
    }

    fn truncate(self, len: u8) -> Prefix {
        let len = len.min(self.len);
        Prefix { addr: self.addr & mask(len), len }
    }
}

/// A set of prefix lengths (0..=128) as bits: copied and joined without allocating, so the
/// grouping below costs a few word operations per range and length tried.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Lengths([u64; 3]);

impl Lengths {
    fn one(len: u8) -> Lengths {
        let mut set = Lengths::default();
        set.0[usize::from(len / 64)] |= 1 << (len % 64);
        set
    }

    fn join(self, other: Lengths) -> Lengths {
        Lengths([self.0[0] | other.0[0], self.0[1] | other.0[1], self.0[2] | other.0[2]])
    }

    fn contains(self, len: u8) -> bool {
        self.0[usize::from(len / 64)] & (1 << (len % 64)) != 0
    }

    fn without(self, len: u8) -> Lengths {
        let mut set = self;
        set.0[usize::from(len / 64)] &= !(1 << (len % 64));
        set
    }

    fn len(self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The lengths, shortest first.
    fn ascending(self) -> impl DoubleEndedIterator<Item = u8> {
        (0..=128u8).filter(move |&l| self.contains(l))
    }
}

/// A pool range: the prefix, the lengths of the destinations inside it, and the destinations
/// themselves as indexes into the sorted destinations [`cover`] works on (a range's are
/// always adjacent there; meaningless outside it).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Range {
    net: Prefix,
    lengths: Lengths,
    destinations: std::ops::Range<usize>,
}

/// Disjoint ranges covering `prefixes` (family lengths, `width` = 32 or 128), at most
/// `max_ranges` of at most [`RANGE_LENGTHS`] lengths each. Returns the ranges, sorted by
/// address, and the prefixes no range could take (more distinct lengths than a range holds in
/// one place: never for Calico's shape).
///
/// O(destinations × 129) word operations and no allocation per step: it runs on the agent's
/// main loop whenever a destination comes or goes (10,000 destinations: ~140 ms when each
/// step copied every range's sets and lists, a few ms now).
fn cover(prefixes: &[Prefix], max_ranges: usize) -> (Vec<Range>, Vec<Prefix>) {
    let mut sorted = prefixes.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    // Maximal prefixes: sorted by (address, length), a prefix's container comes first.
    let mut ranges: Vec<Range> = Vec::new();
    for (i, p) in sorted.iter().enumerate() {
        match ranges.last_mut() {
            Some(r) if r.net.contains(*p) => {
                r.lengths = r.lengths.join(Lengths::one(p.len));
                r.destinations.end = i + 1;
            }
            _ => ranges.push(Range { net: *p, lengths: Lengths::one(p.len), destinations: i..i + 1 }),
        }
    }
    let fits = |rs: &[Range]| rs.iter().all(|r| r.lengths.len() <= RANGE_LENGTHS);
    if !fits(&ranges) {
        // Only a single destination's nesting can do this: its shortest lengths go out until
        // the range fits, and the rest is covered again.
        let (mut left, mut rest) = (Vec::new(), Vec::new());
        for r in &ranges {
            let mut kept = r.lengths;
            while kept.len() > RANGE_LENGTHS {
                kept = kept.without(kept.ascending().next().unwrap_or(0));
            }
            for d in &sorted[r.destinations.clone()] {
                if kept.contains(d.len) {
                    rest.push(*d);
                } else {
                    left.push(*d);
                }
            }
        }
        let (rs, more) = cover(&rest, max_ranges);
        left.extend(more);
        return (rs, left);
    }
    let mut best = ranges;
    let mut grouped: Vec<Range> = Vec::with_capacity(best.len());
    for len in (0..=128u8).rev() {
        if best.len() <= max_ranges.min(PREFERRED_RANGES) {
            break;
        }
        grouped.clear();
        for r in &best {
            let key = r.net.truncate(len);
            match grouped.last_mut() {
                Some(g) if g.net == key => {
                    g.lengths = g.lengths.join(r.lengths);
                    g.destinations.end = r.destinations.end;
                }
                _ => grouped.push(Range { net: key, lengths: r.lengths, destinations: r.destinations.clone() }),
            }
        }
        if !fits(&grouped) {
            break;
        }
        std::mem::swap(&mut best, &mut grouped);
    }
    if best.len() <= max_ranges {
        return (best, Vec::new());
    }
    // Still too many (the lengths stopped the grouping): keep the ranges with most destinations.
    let mut order: Vec<usize> = (0..best.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(best[i].destinations.len()));
    let keep: BTreeSet<usize> = order.into_iter().take(max_ranges).collect();
    let mut kept = Vec::new();
    let mut left = Vec::new();
    for (i, r) in best.into_iter().enumerate() {
        if keep.contains(&i) {
            kept.push(r);
        } else {
            left.extend_from_slice(&sorted[r.destinations]);
        }
    }
    (kept, left)
}

fn v4_prefix(p: ipnet::Ipv4Net) -> Prefix {
    Prefix { addr: u128::from(u32::from(p.network())) << 96, len: p.prefix_len() }
}

fn v6_prefix(p: &ipnet::Ipv6Net) -> Prefix {
    Prefix { addr: u128::from(p.network()), len: p.prefix_len() }
}

/// The kernel's form of an IPv4 address: its bytes in packet order as a native `u32`.
fn ne_u32(a: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(a.octets())
}

/// The kernel's form of an IPv6 address: bytes 0..8 and 8..16 as native `u64`s.
fn ne_u64s(a: Ipv6Addr) -> [u64; 2] {
    let o = a.octets();
    let (mut hi, mut lo) = ([0u8; 8], [0u8; 8]);
    hi.copy_from_slice(&o[..8]);
    lo.copy_from_slice(&o[8..]);
    [u64::from_ne_bytes(hi), u64::from_ne_bytes(lo)]
}

fn v4_of(p: Prefix) -> ipnet::Ipv4Net {
    // An IPv4 prefix's address is in the top 32 bits.
    let addr = Ipv4Addr::from((p.addr >> 96) as u32);
    ipnet::Ipv4Net::new(addr, p.len).unwrap_or_default()
}

fn v6_of(p: Prefix) -> ipnet::Ipv6Net {
    ipnet::Ipv6Net::new(Ipv6Addr::from(p.addr), p.len).unwrap_or_default()
}

/// The hash key of an IPv4 destination in `FORWARD_TARGETS_V4`.
pub fn target_key_v4(p: &ipnet::Ipv4Net) -> TargetKeyV4 {
    TargetKeyV4 { prefix_len: u32::from(p.prefix_len()), addr: ne_u32(p.network()) }
}

/// The hash key of an IPv6 destination in `FORWARD_TARGETS_V6`.
pub fn target_key_v6(p: &ipnet::Ipv6Net) -> TargetKeyV6 {
    TargetKeyV6 { prefix_len: u32::from(p.prefix_len()), _pad: 0, addr: ne_u64s(p.network()) }
}

/// The filter for `destinations` (both families), and the destinations it cannot hold (see
/// the module doc; empty for Calico's shape), which must not be written to the hash maps.
pub fn pool_filter(destinations: impl IntoIterator<Item = IpNet>) -> (PoolFilter, Vec<IpNet>) {
    let (mut v4, mut v6) = (Vec::new(), Vec::new());
    for d in destinations {
        match d {
            IpNet::V4(n) => v4.push(v4_prefix(n.trunc())),
            IpNet::V6(n) => v6.push(v6_prefix(&n.trunc())),
        }
    }
    let mut filter = PoolFilter::default();
    let mut left = Vec::new();
    let (ranges, more) = cover(&v4, POOL_RANGES_V4);
    left.extend(more.into_iter().map(|p| IpNet::V4(v4_of(p))));
    filter.v4_ranges = u32::try_from(ranges.len()).unwrap_or(0);
    for (slot, r) in filter.v4.iter_mut().zip(&ranges) {
        let net = v4_of(r.net);
        *slot = PoolRangeV4 {
            net: ne_u32(net.network()),
            mask: ne_u32(net.netmask()),
            lengths: u32::try_from(r.lengths.len()).unwrap_or(0),
            ..PoolRangeV4::default()
        };
        for (j, len) in r.lengths.ascending().rev().enumerate() {
            slot.prefix_lens[j] = u32::from(len);
            slot.masks[j] = ne_u32(ipnet::Ipv4Net::new(Ipv4Addr::UNSPECIFIED, len).unwrap_or_default().netmask());
        }
    }
    let (ranges, more) = cover(&v6, POOL_RANGES_V6);
    left.extend(more.into_iter().map(|p| IpNet::V6(v6_of(p))));
    filter.v6_ranges = u32::try_from(ranges.len()).unwrap_or(0);
    for (slot, r) in filter.v6.iter_mut().zip(&ranges) {
        let net = v6_of(r.net);
        *slot = PoolRangeV6 {
            net: ne_u64s(net.network()),
            mask: ne_u64s(net.netmask()),
            lengths: u32::try_from(r.lengths.len()).unwrap_or(0),
            ..PoolRangeV6::default()
        };
        for (j, len) in r.lengths.ascending().rev().enumerate() {
            slot.prefix_lens[j] = u32::from(len);
            slot.masks[j] = ne_u64s(ipnet::Ipv6Net::new(Ipv6Addr::UNSPECIFIED, len).unwrap_or_default().netmask());
        }
    }
    (filter, left)
}

#[cfg(test)]
mod tests;
