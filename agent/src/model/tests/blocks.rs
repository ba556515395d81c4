//! IPAM blocks and BlockAffinities: borrowed IPs, sparse and bounded allocations, deletion
//! markers.

use super::*;

/// The v1 CRD stores BlockAffinity `deleted` as a string; v3 as a bool. Both load.
#[test]
fn block_affinity_deleted_string_and_bool() {
    let text = r#"
apiVersion: crd.projectcalico.org/v1
kind: BlockAffinity
metadata: {name: node-b-10-244-1-0-26}
spec: {cidr: 10.244.1.0/26, node: node-b, type: host, state: confirmed, deleted: "false"}
---
apiVersion: projectcalico.org/v3
kind: BlockAffinity
metadata: {name: node-c-10-244-2-0-26}
spec: {cidr: 10.244.2.0/26, node: node-c, state: pendingDeletion, deleted: true}
"#;
    let (cluster, errors) = load(text);
    assert_eq!(errors, vec![]);
    let b = &cluster.block_affinities["node-b-10-244-1-0-26"];
    assert_eq!((b.deleted, b.state, b.node.as_str()), (false, AffinityState::Confirmed, "node-b"));
    assert!(b.is_active());
    let c = &cluster.block_affinities["node-c-10-244-2-0-26"];
    assert_eq!((c.deleted, c.state), (true, AffinityState::PendingDeletion));
    assert!(!c.is_active());
}

/// The reference §4.3 example: 10.244.1.3 is borrowed by node-c.
#[test]
fn ipam_block_borrowed_ip() {
    let text = r"
apiVersion: crd.projectcalico.org/v1
kind: IPAMBlock
metadata: {name: 10-244-1-0-28}
spec:
  cidr: 10.244.1.0/28
  affinity: host:node-b
  allocations: [0, 1, null, 2, null, null, null, null, null, null, null, null, null, null, null, null]
  unallocated: [4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 2]
  attributes:
    - {handle_id: ipip-tunnel-addr-node-b, secondary: {node: node-b, type: ipipTunnelAddress}}
    - {handle_id: k8s-pod-network.5c0f2e9b7a41, secondary: {namespace: default, node: node-b, pod: web}}
    - {handle_id: k8s-pod-network.a17be03c9d55, secondary: {namespace: default, node: node-c, pod: api}}
  sequenceNumber: 4
  deleted: false
";
    let (cluster, errors) = load(text);
    assert_eq!(errors, vec![]);
    let b = &cluster.ipam_blocks["10-244-1-0-28"];
    assert_eq!(b.host(), Some("node-b"));
    let allocated: Vec<IpAddr> = b.allocated().map(|a| a.ip).collect();
    assert_eq!(allocated, vec![ip("10.244.1.0"), ip("10.244.1.1"), ip("10.244.1.3")]);
    let borrowed: Vec<(IpAddr, Option<&str>)> = b.non_affine_allocations().map(|a| (a.ip, a.attributes.node())).collect();
    assert_eq!(borrowed, vec![(ip("10.244.1.3"), Some("node-c"))]);
    // Kept sparse: the 13 free ordinals are not stored, and of `secondary` only what a rule
    // reads (node, type) is (the rest is most of the memory of a large cluster's blocks).
    assert_eq!(b.allocations, vec![(0, 0), (1, 1), (3, 2)]);
    let secondary: Vec<Vec<(&str, &str)>> = b.attributes.iter().map(|a| a.secondary.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()).collect();
    assert_eq!(secondary, vec![vec![("node", "node-b"), ("type", "ipipTunnelAddress")], vec![("node", "node-b")], vec![("node", "node-c")]]);
    // Sized exactly (a growing Vec's least capacity is 4: ~27 MB of kube-100k's view).
    assert_eq!((b.allocations.capacity(), b.attributes.capacity()), (3, 3));
    let capacities: Vec<usize> = b.attributes.iter().map(|a| a.secondary.capacity()).collect();
    assert_eq!(capacities, vec![2, 1, 1]);
    assert_eq!(b.allocation_of(ip("10.244.1.3")).map(|a| (a.ordinal, a.attributes.node())), Some((3, Some("node-c"))));
    assert_eq!(b.allocation_of(ip("10.244.1.2")), None, "a free ordinal between allocated ones");
    assert_eq!(b.allocation_of(ip("10.244.1.15")), None, "the last, free ordinal");
    assert_eq!(b.allocation_of(ip("10.244.2.0")), None, "outside the block");
}

/// The dense `allocations` of a block of 4,096 addresses with one pod at the last ordinal is
/// one sparse entry, and the entry count is still checked against the block size (nulls
/// count: Calico writes one entry per address).
#[test]
fn ipam_block_allocations_are_sparse_and_bounded() {
    let dense = |n: usize| format!("[{}0]", "null, ".repeat(n - 1));
    let block = |cidr: &str, name: &str, n: usize| {
        format!("apiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {{name: {name}}}\nspec: {{cidr: {cidr}, affinity: 'host:node-b', allocations: {}, attributes: [{{secondary: {{node: node-c, pod: p}}}}]}}\n", dense(n))
    };
    let (cluster, errors) = load(&block("10.244.0.0/20", "10-244-0-0-20", 4096));
    assert_eq!(errors, vec![]);
    let b = &cluster.ipam_blocks["10-244-0-0-20"];
    assert_eq!(b.allocations, vec![(4095, 0)]);
    assert_eq!(b.non_affine_allocations().map(|a| a.ip).collect::<Vec<_>>(), vec![ip("10.244.15.255")]);
    let (cluster, errors) = load(&block("10.244.0.0/20", "10-244-0-0-20", 4097));
    assert_eq!(
        errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        vec![r#"IPAMBlock "10-244-0-0-20": spec.allocations: 4097 entries for a block of 4096 addresses (10.244.0.0/20)"#]
    );
    assert!(cluster.ipam_blocks.is_empty());
}

/// An allocation's `handle_id` is read by no rule and not kept: one of the wrong type (here a
/// mapping) costs its block nothing, and the borrowed IP behind it still names its node.
#[test]
fn a_malformed_handle_id_loses_nothing() {
    let text = r"
apiVersion: crd.projectcalico.org/v1
kind: IPAMBlock
metadata: {name: 10-244-1-0-28}
spec:
  cidr: 10.244.1.0/28
  affinity: host:node-b
  allocations: [0, 1]
  attributes:
    - {handle_id: {not: a-string}, secondary: {node: node-b}}
    - {handle_id: 7, secondary: {node: node-c}}
";
    let (cluster, errors) = load(text);
    assert_eq!(errors, vec![]);
    let b = &cluster.ipam_blocks["10-244-1-0-28"];
    let owners: Vec<(IpAddr, Option<&str>)> = b.allocated().map(|a| (a.ip, a.attributes.node())).collect();
    assert_eq!(owners, vec![(ip("10.244.1.0"), Some("node-b")), (ip("10.244.1.1"), Some("node-c"))]);
}
