use super::*;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// What the TC program does with `filter` and the hash keys of `installed`: the matched
/// destination of `dst`, or `None`.
fn kernel_lookup(filter: &PoolFilter, installed: &BTreeSet<IpNet>, dst: IpAddr) -> Option<IpNet> {
    let v4: std::collections::HashMap<TargetKeyV4, IpNet> =
        installed.iter().filter_map(|p| if let IpNet::V4(n) = p { Some((target_key_v4(n), *p)) } else { None }).collect();
    let v6: BTreeMap<(u32, [u64; 2]), IpNet> =
        installed.iter().filter_map(|p| if let IpNet::V6(n) = p { Some(((u32::from(n.prefix_len()), target_key_v6(n).addr), *p)) } else { None }).collect();
    match dst {
        IpAddr::V4(a) => {
            let addr = ne_u32(a);
            let range = filter.v4[..filter.v4_ranges as usize].iter().find(|r| addr & r.mask == r.net)?;
            (0..range.lengths as usize).find_map(|j| v4.get(&TargetKeyV4 { prefix_len: range.prefix_lens[j], addr: addr & range.masks[j] }).copied())
        }
        IpAddr::V6(a) => {
            let addr = ne_u64s(a);
            let range = filter.v6[..filter.v6_ranges as usize].iter().find(|r| addr[0] & r.mask[0] == r.net[0] && addr[1] & r.mask[1] == r.net[1])?;
            (0..range.lengths as usize).find_map(|j| {
                let m = range.masks[j];
                v6.get(&(range.prefix_lens[j], [addr[0] & m[0], addr[1] & m[1]])).copied()
            })
        }
    }
}

/// The longest destination containing `dst` (what the LPM trie returned).
fn longest_match(dests: &[IpNet], dst: IpAddr) -> Option<IpNet> {
    dests.iter().filter(|p| p.contains(&dst)).max_by_key(|p| p.prefix_len()).copied()
}

fn nets(v: &[&str]) -> Vec<IpNet> {
    v.iter().map(|s| s.parse().unwrap()).collect()
}

#[test]
fn calico_shape_gives_few_ranges_and_the_longest_match() {
    let mut dests = nets(&["10.250.1.9/32", "fd00:10::/122", "fd00:10::7/128"]);
    for i in 0..3000u32 {
        dests.push(IpNet::V4(ipnet::Ipv4Net::new(Ipv4Addr::from(u32::from_be_bytes([10, 0, 0, 0]) + i * 64), 26).unwrap()));
        dests.push(IpNet::V4(ipnet::Ipv4Net::new(Ipv4Addr::from(u32::from_be_bytes([10, 250, 0, 0]) + i * 64), 26).unwrap()));
    }
    let (filter, left) = pool_filter(dests.clone());
    assert!(left.is_empty(), "{left:?}");
    // Each pool spans 10.x.0.0 - 10.(x+2).238.255: two /15s each.
    assert_eq!(filter.v4_ranges, 4, "{:?}", filter.v4);
    // The range with the borrowed /32 looks it up first, then the /26 blocks.
    let flat = filter.v4[2];
    assert_eq!(flat.net, ne_u32(Ipv4Addr::new(10, 250, 0, 0)));
    assert_eq!(flat.mask, ne_u32(Ipv4Addr::new(255, 254, 0, 0)));
    assert_eq!((flat.lengths, flat.prefix_lens), (2, [32, 26, 0, 0]));
    assert_eq!(filter.v4[0].prefix_lens, [26, 0, 0, 0]);
    assert_eq!(filter.v6_ranges, 1);
    assert_eq!(filter.v6[0].prefix_lens[..2], [128, 122]);
    let installed: BTreeSet<IpNet> = dests.iter().copied().collect();
    for dst in ["10.0.1.5", "10.250.1.9", "10.250.1.10", "10.250.47.1", "8.8.8.8", "10.1.0.0", "fd00:10::7", "fd00:10::8", "fd00:11::1"] {
        let dst: IpAddr = dst.parse().unwrap();
        assert_eq!(kernel_lookup(&filter, &installed, dst), longest_match(&dests, dst), "{dst}");
    }
}

#[test]
fn too_many_lengths_in_one_place_are_left_out_not_mismatched() {
    let dests = nets(&["10.0.0.0/8", "10.0.0.0/9", "10.0.0.0/10", "10.0.0.0/11", "10.0.0.0/12", "192.168.0.0/16"]);
    let (filter, left) = pool_filter(dests.clone());
    assert_eq!(left, nets(&["10.0.0.0/8"]));
    let kept: Vec<IpNet> = dests.iter().filter(|d| !left.contains(d)).copied().collect();
    let installed: BTreeSet<IpNet> = kept.iter().copied().collect();
    for dst in ["10.0.0.1", "10.200.0.1", "192.168.3.3", "11.0.0.1"] {
        let dst: IpAddr = dst.parse().unwrap();
        assert_eq!(kernel_lookup(&filter, &installed, dst), longest_match(&kept, dst), "{dst}");
    }
    assert_eq!(pool_filter(Vec::new()), (PoolFilter::default(), Vec::new()));
}

/// The grouping as first written (sets and lists copied at every step): the oracle the
/// allocation-free [`cover`] must agree with.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ReferenceRange {
    net: Prefix,
    lengths: BTreeSet<u8>,
    destinations: Vec<Prefix>,
}

/// Disjoint ranges covering `prefixes` (family lengths, `width` = 32 or 128), at most
/// `max_ranges` of at most [`RANGE_LENGTHS`] lengths each. Returns the ranges, sorted by
/// address, and the prefixes no range could take (more distinct lengths than a range holds
/// in one place: never for Calico's shape).
fn reference_cover(prefixes: &[Prefix], max_ranges: usize) -> (Vec<ReferenceRange>, Vec<Prefix>) {
    let mut sorted = prefixes.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    // Maximal prefixes: sorted by (address, length), a prefix's container comes first.
    let mut ranges: Vec<ReferenceRange> = Vec::new();
    for p in sorted {
        match ranges.last_mut() {
            Some(r) if r.net.contains(p) => {
                r.lengths.insert(p.len);
                r.destinations.push(p);
            }
            _ => ranges.push(ReferenceRange { net: p, lengths: BTreeSet::from([p.len]), destinations: vec![p] }),
        }
    }
    let fits = |rs: &[ReferenceRange]| rs.iter().all(|r| r.lengths.len() <= RANGE_LENGTHS);
    if !fits(&ranges) {
        // Only a single destination's nesting can do this; split those out.
        let mut left = Vec::new();
        for r in &mut ranges {
            while r.lengths.len() > RANGE_LENGTHS {
                let shortest = *r.lengths.iter().next().unwrap_or(&0);
                r.lengths.remove(&shortest);
                left.extend(r.destinations.iter().filter(|d| d.len == shortest));
                r.destinations.retain(|d| d.len != shortest);
            }
        }
        let (rs, more) = reference_cover(&ranges.iter().flat_map(|r| r.destinations.clone()).collect::<Vec<_>>(), max_ranges);
        left.extend(more);
        return (rs, left);
    }
    let mut best = ranges;
    for len in (0..=128u8).rev() {
        if best.len() <= max_ranges.min(PREFERRED_RANGES) {
            break;
        }
        let mut grouped: Vec<ReferenceRange> = Vec::new();
        for r in &best {
            let key = r.net.truncate(len);
            match grouped.last_mut() {
                Some(g) if g.net == key => {
                    g.lengths.extend(r.lengths.iter().copied());
                    g.destinations.extend(r.destinations.iter().copied());
                }
                _ => grouped.push(ReferenceRange { net: key, lengths: r.lengths.clone(), destinations: r.destinations.clone() }),
            }
        }
        if !fits(&grouped) {
            break;
        }
        best = grouped;
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
            left.extend(r.destinations);
        }
    }
    (kept, left)
}

fn arb_v4_net() -> impl Strategy<Value = IpNet> {
    // A narrow space (10.0.0.0/14) so destinations nest and collide.
    (0u32..(1 << 18), prop::sample::select(vec![14u8, 20, 24, 26, 26, 26, 32, 32]))
        .prop_map(|(a, len)| IpNet::V4(ipnet::Ipv4Net::new(Ipv4Addr::from(u32::from_be_bytes([10, 0, 0, 0]) + a * 4), len).unwrap().trunc()))
}

fn arb_v6_net() -> impl Strategy<Value = IpNet> {
    (0u128..(1 << 20), prop::sample::select(vec![64u8, 112, 122, 122, 128]))
        .prop_map(|(a, len)| IpNet::V6(ipnet::Ipv6Net::new(Ipv6Addr::from((0xfd00_u128 << 112) + (a << 4)), len).unwrap().trunc()))
}

proptest! {
    /// Whatever the destinations, the filter plus the hash lookups give the LPM trie's
    /// answer for every address (over the destinations the filter holds), and a
    /// destination is left out only when a range cannot hold its length.
    #[test]
    fn filter_and_hashes_equal_longest_prefix_match(
        dests in prop::collection::vec(prop_oneof![3 => arb_v4_net(), 1 => arb_v6_net()], 0..60),
        probes in prop::collection::vec((0u32..(1 << 20), 0u128..(1 << 24)), 40),
    ) {
        let (filter, left) = pool_filter(dests.clone());
        let kept: Vec<IpNet> = dests.iter().filter(|d| !left.contains(d)).copied().collect();
        let installed: BTreeSet<IpNet> = kept.iter().copied().collect();
        for (a, b) in probes {
            for dst in [IpAddr::V4(Ipv4Addr::from(u32::from_be_bytes([10, 0, 0, 0]) + a)), IpAddr::V6(Ipv6Addr::from((0xfd00_u128 << 112) + b))] {
                prop_assert_eq!(kernel_lookup(&filter, &installed, dst), longest_match(&kept, dst), "{}", dst);
            }
        }
        for d in &kept {
            let dst = d.network();
            prop_assert_eq!(kernel_lookup(&filter, &installed, dst), longest_match(&kept, dst));
        }
    }

    /// The allocation-free grouping gives what the first one gave: the same ranges (prefix
    /// and lengths), the same destinations left out, in both families, for destinations that
    /// nest and collide, and for the "too many lengths in one place" split.
    #[test]
    fn cover_equals_the_reference_grouping(
        dests in prop::collection::vec(prop_oneof![3 => arb_v4_net(), 1 => arb_v6_net()], 0..80),
        max_ranges in prop::sample::select(vec![1usize, 2, 4, 8]),
    ) {
        for family_v4 in [true, false] {
            let prefixes: Vec<Prefix> = dests
                .iter()
                .filter_map(|d| match d {
                    IpNet::V4(n) if family_v4 => Some(v4_prefix(n.trunc())),
                    IpNet::V6(n) if !family_v4 => Some(v6_prefix(&n.trunc())),
                    _ => None,
                })
                .collect();
            let (ranges, left) = cover(&prefixes, max_ranges);
            let (want, want_left) = reference_cover(&prefixes, max_ranges);
            let got: Vec<(Prefix, Vec<u8>)> = ranges.iter().map(|r| (r.net, r.lengths.ascending().collect())).collect();
            let want: Vec<(Prefix, Vec<u8>)> = want.iter().map(|r| (r.net, r.lengths.iter().copied().collect())).collect();
            prop_assert_eq!(got, want);
            let (mut left, mut want_left) = (left, want_left);
            left.sort_unstable();
            want_left.sort_unstable();
            prop_assert_eq!(left, want_left);
        }
    }
}
