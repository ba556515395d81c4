//! IPAM blocks checked as Calico's IPAM writes them ([`check_blocks`]): the blocks of a pool
//! are subnets of the pool of exactly its `blockSize`, and no two blocks overlap.
//!
//! Calico's sources of the rule:
//! - a block's CIDR is made only by `randomBlockGenerator` (called from `findUsableBlock`,
//!   `libcalico-go/lib/ipam/ipam_block_reader_writer.go`): the pool's CIDR cut into subnets
//!   whose mask is `net.CIDRMask(ipPool.Spec.BlockSize, …)`; `claimAffineBlock` creates the
//!   block at that CIDR, keyed by it, so two blocks of one pool never overlap, and pools do
//!   not overlap (`check_pools`);
//! - the pool side (`libcalico-go/lib/clientv3/ippool.go`): `validateAndSetDefaults` defaults
//!   `blockSize` to 26 (IPv4) or 122 (IPv6), keeps it within 20..=32 or 116..=128 and no
//!   larger than the pool, and refuses to change it ("IPPool BlockSize cannot be modified");
//!   `Create` refuses a pool that overlaps an existing block of another size ("IPPool
//!   blocksSize conflicts with existing allocations that use a different blockSize").
//!
//! A block that breaks the rule was not written by Calico's IPAM (`kubectl apply` of the CRD,
//! a file, an etcd write): it is invalid, and the ground it covers is frozen until it is
//! fixed. A block inside no valid pool is *not* refused: `ipPools.Delete` releases the pool's
//! affinities and deletes the pool, but a block that still has allocations stays (without
//! affinity) until its IPs are released, so blocks of a deleted pool are normal during a pool
//! migration; the route computation reports them (`block-outside-pools`) and routes nothing.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use super::block::IpamBlock;
use super::error::{FieldProblem, ModelError, Rejected};
use super::kind::Kind;
use super::names::MAX_FROZEN_PER_INPUT;
use super::pool::IpPool;
use super::shared_map::SharedMap;

/// Most other blocks one block's error names; the rest are counted ("and 95 more").
pub const MAX_NAMED_OVERLAPS: usize = 4;

/// A prefix as integers, ordered by family, first address, then prefix length: in that order
/// a block comes after every block that contains it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Span {
    v6: bool,
    first: u128,
    len: u8,
    last: u128,
}

impl Span {
    fn of(net: IpNet) -> Span {
        let (v6, first, last) = match (net.network(), net.broadcast()) {
            (IpAddr::V4(a), IpAddr::V4(b)) => (false, u128::from(u32::from(a)), u128::from(u32::from(b))),
            (a, b) => (true, ip_u128(a), ip_u128(b)),
        };
        Span { v6, first, len: net.prefix_len(), last }
    }

    /// Whether `other` lies inside this prefix (equal included).
    fn contains(&self, other: &Span) -> bool {
        self.v6 == other.v6 && self.first <= other.first && other.last <= self.last
    }
}

fn ip_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

/// What is wrong with one block.
#[derive(Debug, Default)]
struct Finding {
    /// Up to [`MAX_NAMED_OVERLAPS`] overlapping blocks (index into the sorted list).
    named: Vec<usize>,
    /// How many blocks it overlaps.
    overlaps: usize,
    /// The outermost block of its nest (index): the ground frozen for every block of an
    /// overlap, which covers them all.
    root: usize,
    /// The valid pool it lies in (or over) with another `blockSize`: (name, CIDR, blockSize).
    wrong_size: Option<(String, IpNet, u8)>,
}

impl Finding {
    fn overlap(&mut self, other: usize) {
        self.overlaps += 1;
        if self.named.len() < MAX_NAMED_OVERLAPS {
            self.named.push(other);
        }
    }
}

/// Take every IPAM block out of `cluster` that Calico's IPAM could not have written, and return
/// one rejection per such block (in block-name order), naming its object (`IPAMBlock`, its
/// name) and field (`spec.cidr`):
///
/// - a block that overlaps another block (one contains the other, or both have one CIDR):
///   every block of the overlap is invalid, each error naming the blocks it overlaps (the
///   first [`MAX_NAMED_OVERLAPS`], then a count). Which one is right is not known here, so
///   none is routed; the rejection's CIDR is the outermost block of the overlap, which covers
///   every block of it, so nothing there is deleted or claimed (an existing route for any of
///   them stays as it is) and the frozen ground is one prefix per overlap, however many blocks
///   it nests;
/// - a block that lies in (or over) a valid IP pool of `cluster` with a prefix length other
///   than that pool's `blockSize` ([`IpPool::block_size`](super::IpPool::block_size), 26 or
///   122 when unset): invalid, naming the pool; its own CIDR is frozen. More than
///   [`MAX_FROZEN_PER_INPUT`] such blocks (a pool's `blockSize` edited past Calico's client,
///   which refuses the change) freeze their pools' CIDRs instead: one prefix per pool, not one
///   per block, for the reconciler to compare.
///
/// A block in no valid pool is kept (see the module documentation). Run after
/// [`check_pools`](super::check_pools): only valid pools, which do not overlap, are compared. Pure;
/// O(n log n) in the number of blocks (one sort, one pass, a binary search per block among
/// the pools; measured by `model::block_check::tests::blocks_100k_are_checked_in_n_log_n`).
pub fn check_blocks(ip_pools: &BTreeMap<String, IpPool>, ipam_blocks: &mut SharedMap<Arc<str>, Arc<IpamBlock>>) -> Vec<Rejected> {
    let found = find(ip_pools, ipam_blocks);
    let coarse = found.values().filter(|f| f.1.wrong_size.is_some() && f.1.overlaps == 0).count() > MAX_FROZEN_PER_INPUT;
    let mut out = Vec::with_capacity(found.len());
    for (name, (cidr, f, others, root)) in found {
        if ipam_blocks.remove(name.as_ref()).is_none() {
            continue;
        }
        let mut problems = Vec::new();
        if f.overlaps > 0 {
            let list = others.iter().map(|(n, c)| format!("IPAM block {n} ({c})")).collect::<Vec<_>>().join(", ");
            let more = f.overlaps - others.len();
            let more = if more > 0 { format!(" and {more} more") } else { String::new() };
            problems.push(format!("{cidr} overlaps {list}{more}; Calico's IPAM never writes overlapping blocks, so every block of an overlap is invalid"));
        }
        if let Some((pool, pool_cidr, size)) = &f.wrong_size {
            problems.push(format!(
                "{cidr} is a /{} block in IPPool {pool:?} ({pool_cidr}) whose blockSize is {size}; Calico's IPAM writes only blocks of its pool's blockSize",
                cidr.prefix_len()
            ));
        }
        let frozen = match (&f.wrong_size, f.overlaps) {
            (_, 1..) => root,
            (Some((_, pool_cidr, _)), 0) if coarse => *pool_cidr,
            _ => cidr,
        };
        let error = ModelError::Field {
            kind: Kind::IpamBlock,
            name: name.to_string(),
            field: "spec.cidr".into(),
            problem: FieldProblem::Inconsistent(format!("{}; its ground ({frozen}) is frozen until fixed", problems.join("; "))),
        };
        out.push(Rejected::new(error, vec![frozen]));
    }
    out
}

/// Whether `error` is one [`check_blocks`] returns: an IPAM block's `spec.cidr` found
/// inconsistent with the other blocks or its pool (parsing reports a block's `spec.cidr` only
/// as missing, of the wrong type or not a CIDR). For `explain`'s `invalid-block` finding.
pub fn is_invalid_block(error: &ModelError) -> bool {
    matches!(error, ModelError::Field { kind: Kind::IpamBlock, field, problem: FieldProblem::Inconsistent(_), .. } if field == "spec.cidr")
}

/// A found block: its CIDR, what is wrong, the blocks it names (name, CIDR) and its frozen
/// root CIDR.
type Found = (IpNet, Finding, Vec<(Arc<str>, IpNet)>, IpNet);

/// Every block of `ipam_blocks` that breaks a rule (among themselves, or against the valid
/// `ip_pools`), by name.
fn find(ip_pools: &BTreeMap<String, IpPool>, ipam_blocks: &SharedMap<Arc<str>, Arc<IpamBlock>>) -> BTreeMap<Arc<str>, Found> {
    // Valid pools do not overlap (check_pools ran), so sorted by first address their last
    // addresses are sorted too: the pools a block overlaps are found by binary search.
    let mut pools: Vec<(Span, &IpPool)> = ip_pools.values().map(|p| (Span::of(p.cidr), p)).collect();
    pools.sort_unstable_by_key(|p| p.0);

    let blocks: Vec<(&Arc<str>, IpNet)> = ipam_blocks.iter().map(|(n, b)| (n, b.cidr)).collect();
    let sorted = sorted_spans(&blocks);

    // Keyed by place in `sorted`.
    let mut findings: BTreeMap<usize, Finding> = BTreeMap::new();
    // The blocks that contain the current one, outermost first: in sorted order each block
    // comes after every block that contains it, and a block that does not contain the
    // current one ends before it (prefixes nest or are disjoint), so it contains no later one.
    let mut open: Vec<usize> = Vec::new();
    for (i, (span, _)) in sorted.iter().enumerate() {
        while open.last().is_some_and(|&top| !sorted[top].0.contains(span)) {
            open.pop();
        }
        if let Some(&root) = open.first() {
            for &o in &open {
                findings.entry(o).or_insert_with(|| Finding { root: o, ..Finding::default() }).overlap(i);
                findings.entry(i).or_insert_with(|| Finding { root, ..Finding::default() }).overlap(o);
            }
        }
        open.push(i);

        let from = pools.partition_point(|(p, _)| (p.v6, p.last) < (span.v6, span.first));
        for (_, pool) in pools[from..].iter().take_while(|(p, _)| p.v6 == span.v6 && p.first <= span.last) {
            // Same family, neither ends before the other starts: one contains the other.
            if span.len != pool.block_size {
                let f = findings.entry(i).or_insert_with(|| Finding { root: i, ..Finding::default() });
                f.wrong_size.get_or_insert_with(|| (pool.name.to_string(), pool.cidr, pool.block_size));
            }
        }
    }
    let at = |i: usize| blocks[sorted[i].1];
    findings
        .into_iter()
        .map(|(i, f)| {
            let (name, cidr) = at(i);
            let others = f.named.iter().map(|&o| (at(o).0.clone(), at(o).1)).collect();
            let root = at(f.root).1;
            (name.clone(), (cidr, f, others, root))
        })
        .collect()
}

/// The spans of `blocks` (given in name order) sorted as [`Span`] orders them, ties in name
/// order, each with its index in `blocks`. IPv4 blocks, nearly all of them, are sorted as one
/// `u64` each (address, prefix length, index): at 100,000 blocks that sort is a few times
/// quicker than one of spans.
fn sorted_spans(blocks: &[(&Arc<str>, IpNet)]) -> Vec<(Span, usize)> {
    sorted_spans_packed(blocks, blocks.len() < 1 << INDEX_BITS)
}

/// Bits of a block's index in its packed IPv4 key (16,777,216 blocks; past that, unpacked).
const INDEX_BITS: u32 = 24;

/// [`sorted_spans`], with IPv4 blocks packed or not.
fn sorted_spans_packed(blocks: &[(&Arc<str>, IpNet)], packable: bool) -> Vec<(Span, usize)> {
    let mut v4: Vec<u64> = Vec::with_capacity(blocks.len());
    let mut other: Vec<(Span, usize)> = Vec::new();
    for (i, (_, cidr)) in blocks.iter().enumerate() {
        match cidr {
            IpNet::V4(n) if packable => {
                v4.push((u64::from(u32::from(n.network())) << 32) | (u64::from(n.prefix_len()) << INDEX_BITS) | i as u64);
            }
            _ => other.push((Span::of(*cidr), i)),
        }
    }
    v4.sort_unstable();
    other.sort_unstable();
    let mut out = Vec::with_capacity(blocks.len());
    for key in v4 {
        let first = u128::from(key >> 32);
        let len = ((key >> INDEX_BITS) & 0xff) as u8;
        let last = first | (u128::from(u32::MAX) >> len);
        out.push((Span { v6: false, first, len, last }, (key & ((1 << INDEX_BITS) - 1)) as usize));
    }
    // IPv4 spans sort before IPv6 ones; without packing, every block is in `other`.
    out.extend(other);
    out
}

#[cfg(test)]
mod tests;
