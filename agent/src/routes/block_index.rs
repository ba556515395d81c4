//! The IPAM blocks of one route pass sorted by CIDR, as the tunnel-address rule and the
//! affinity check look them up, and the BlockAffinities that contradict their block.

use std::collections::BTreeSet;

use ipnet::IpNet;

use super::problem::RouteProblem;
use crate::model::{BlockAffinity, Cluster, IpamBlock};

/// The IPAM blocks of a pass by CIDR, as the tunnel-address rule looks them up.
pub(super) trait BlocksByCidr<'a> {
    /// The (IPv6, prefix length) pairs of the CIDRs of blocks not deleted, ascending.
    fn lengths(&self) -> Vec<(bool, u8)>;
    /// The first block by name whose CIDR is `cidr` and that is not deleted.
    fn first_live(&self, cidr: IpNet) -> Option<&'a IpamBlock>;
}

impl<'a> BlocksByCidr<'a> for BlockIndex<'a> {
    fn lengths(&self) -> Vec<(bool, u8)> {
        self.lengths.iter().copied().collect()
    }

    fn first_live(&self, cidr: IpNet) -> Option<&'a IpamBlock> {
        self.with_cidr(cidr).iter().copied().find(|b| !b.deleted)
    }
}

/// BlockAffinities (confirmed or pending, not deleted) that name another node than their
/// IPAM block's `affinity` (reference S08, https://github.com/projectcalico/calico/issues/6486),
/// over `blocks` sorted by (CIDR, name): of blocks with the same CIDR the last by name is
/// compared. The affinities, sorted on the same integer CIDR keys, are walked alongside the
/// pass's [`BlockIndex`] rather than searched for one by one (a binary search per affinity
/// is a large part of a pass at fleet scale). Returned in no particular order (the caller sorts).
pub(super) fn affinity_conflicts(index: &BlockIndex<'_>, cluster: &Cluster) -> Vec<RouteProblem> {
    let mut affinities: Vec<(CidrKey, &BlockAffinity)> =
        cluster.block_affinities.values().filter(|a| a.is_active()).map(|a| (cidr_key(a.cidr), a.as_ref())).collect();
    affinities.sort_unstable_by_key(|(k, _)| *k);
    let mut out = Vec::new();
    // `start`: the first block whose key is not below the current affinity's.
    let mut start = 0;
    for (key, aff) in affinities {
        start += index.keys[start..].iter().take_while(|k| **k < key).count();
        let end = start + index.keys[start..].iter().take_while(|k| **k == key).count();
        let Some(block) = index.blocks[start..end].last() else { continue };
        out.extend(affinity_conflict(block, aff));
    }
    out
}

/// The [`RouteProblem::AffinityConflict`] of active affinity `aff` whose CIDR is that of
/// `block` (the last block by name of the CIDR), if it names another node.
pub(super) fn affinity_conflict(block: &IpamBlock, aff: &BlockAffinity) -> Option<RouteProblem> {
    (block.host() != Some(aff.node.as_str())).then(|| RouteProblem::AffinityConflict {
        block: block.name.to_string(),
        cidr: block.cidr,
        ipam_node: block.affinity.as_ref().map_or_else(|| "no node".to_owned(), |a| format!("{:?}", a.name())),
        affinity: aff.name.to_string(),
        claimant: aff.node.clone(),
    })
}

/// A CIDR as an integer key that sorts as [`IpNet`] does (IPv4 before IPv6, then address,
/// then prefix length), compared without touching the block it belongs to.
pub(super) type CidrKey = (bool, u128, u8);

pub(super) fn cidr_key(cidr: IpNet) -> CidrKey {
    match cidr {
        IpNet::V4(n) => (false, u128::from(u32::from(n.addr())), n.prefix_len()),
        IpNet::V6(n) => (true, u128::from(n.addr()), n.prefix_len()),
    }
}

/// The IPAM blocks of one pass, sorted by (CIDR, name), with their CIDR keys alongside for
/// lookups by binary search, and the (family, prefix length) pairs in use. Names are unique,
/// so the order is total and does not depend on the input's.
pub(super) struct BlockIndex<'a> {
    pub(super) keys: Vec<CidrKey>,
    pub(super) blocks: Vec<&'a IpamBlock>,
    lengths: BTreeSet<(bool, u8)>,
}

impl<'a> BlockIndex<'a> {
    pub(super) fn new(cluster: &'a Cluster) -> BlockIndex<'a> {
        let mut keyed: Vec<(CidrKey, &IpamBlock)> = cluster.ipam_blocks.values().map(|b| (cidr_key(b.cidr), b.as_ref())).collect();
        keyed.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.name.cmp(&b.1.name)));
        // The pairs in use, marked in a table of every possible one (a set built from one pair
        // per block sorts them all first).
        let mut in_use = [[false; 129]; 2];
        for (k, _) in keyed.iter().filter(|(_, b)| !b.deleted) {
            in_use[usize::from(k.0)][usize::from(k.2)] = true;
        }
        let lengths = (0..2).flat_map(|v6| (0..=128u8).filter(move |&len| in_use[v6][usize::from(len)]).map(move |len| (v6 == 1, len))).collect();
        let (keys, blocks) = keyed.into_iter().unzip();
        BlockIndex { keys, blocks, lengths }
    }

    /// The blocks whose CIDR is `cidr`, by name.
    pub(super) fn with_cidr(&self, cidr: IpNet) -> &[&'a IpamBlock] {
        let key = cidr_key(cidr);
        let start = self.keys.partition_point(|k| *k < key);
        let end = start + self.keys[start..].partition_point(|k| *k == key);
        &self.blocks[start..end]
    }
}

#[cfg(test)]
mod tests;
