use std::sync::Arc;

use super::*;
use crate::model::{Affinity, AffinityState};

fn block(name: &str, cidr: &str, host: Option<&str>) -> IpamBlock {
    IpamBlock {
        name: name.into(),
        cidr: cidr.parse().unwrap(),
        affinity: host.map(|h| Affinity::Host(h.to_owned())),
        allocations: Vec::new(),
        attributes: Vec::new(),
        deleted: false,
    }
}

fn affinity(name: &str, node: &str, cidr: &str, state: AffinityState) -> BlockAffinity {
    BlockAffinity { name: name.into(), node: node.to_owned(), cidr: cidr.parse().unwrap(), state, affinity_type: "host".to_owned(), deleted: false }
}

/// The walk of sorted affinities alongside the block index finds what a lookup per
/// affinity finds: the last block by name of the affinity's CIDR, none for a CIDR without
/// a block, every affinity of a CIDR claimed twice, IPv4 before IPv6, pending deletions
/// ignored.
#[test]
fn affinity_conflicts_walk_equals_a_lookup_per_affinity() {
    let mut c = Cluster::default();
    for b in [
        block("b-1", "10.0.0.0/26", Some("node-a")),
        block("a-dup", "10.0.0.64/26", Some("node-x")),
        block("z-dup", "10.0.0.64/26", Some("node-b")),
        block("b-3", "10.0.1.0/26", None),
        block("b-6", "fd00::/122", Some("node-c")),
    ] {
        c.ipam_blocks.insert(b.name.clone(), Arc::new(b));
    }
    for a in [
        affinity("a1", "node-a", "10.0.0.0/26", AffinityState::Confirmed),
        affinity("a2", "node-b", "10.0.0.64/26", AffinityState::Confirmed),
        affinity("a3", "node-x", "10.0.0.64/26", AffinityState::Pending),
        affinity("a4", "node-d", "10.0.1.0/26", AffinityState::Confirmed),
        affinity("a5", "node-e", "10.9.9.0/26", AffinityState::Confirmed),
        affinity("a6", "node-f", "fd00::/122", AffinityState::Confirmed),
        affinity("a7", "node-g", "10.0.0.0/26", AffinityState::PendingDeletion),
    ] {
        c.block_affinities.insert(a.name.clone(), Arc::new(a));
    }
    let index = BlockIndex::new(&c);
    let mut walked = affinity_conflicts(&index, &c);
    walked.sort();
    let mut looked_up: Vec<RouteProblem> =
        c.block_affinities.values().filter(|a| a.is_active()).filter_map(|a| affinity_conflict(index.with_cidr(a.cidr).last()?, a)).collect();
    looked_up.sort();
    assert_eq!(walked, looked_up);
    let named: Vec<(&str, &str)> = walked
        .iter()
        .map(|p| match p {
            RouteProblem::AffinityConflict { block, affinity, .. } => (block.as_str(), affinity.as_str()),
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(named, [("b-3", "a4"), ("b-6", "a6"), ("z-dup", "a3")]);
}
