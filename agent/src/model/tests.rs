use std::net::IpAddr;

use ipnet::IpNet;

use super::*;

fn load(text: &str) -> (Cluster, Vec<ModelError>) {
    Cluster::from_yaml_str(text).expect("valid YAML")
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test IP")
}

const GOOD: &str = r"
apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: good-pool}
spec: {cidr: 10.244.0.0/16, ipipMode: Always}
---
apiVersion: projectcalico.org/v3
kind: Node
metadata: {name: node-a}
spec:
  bgp: {ipv4Address: 10.0.0.11/24}
";

/// Each malformed field gives exactly one error naming kind, name and field; the good objects
/// of the same text still load.
#[test]
#[expect(clippy::too_many_lines, reason = "a table of cases")]
fn each_bad_field_is_named_and_the_rest_loads() {
    let cases: &[(&str, &str)] = &[
        (
            "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: pool-a}\nspec: {cidr: 10.0.0/8}",
            r#"IPPool "pool-a": spec.cidr: invalid CIDR "10.0.0/8""#,
        ),
        (
            "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: pool-b}\nspec: {ipipMode: Always}",
            r#"IPPool "pool-b": spec.cidr: missing"#,
        ),
        (
            "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: pool-c}\nspec: {cidr: 10.1.0.0/16, ipipMode: always}",
            r#"IPPool "pool-c": spec.ipipMode: invalid value "always" (expected Never, Always or CrossSubnet)"#,
        ),
        (
            "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: pool-d}\nspec: {cidr: 10.1.0.0/16, blockSize: 33}",
            r#"IPPool "pool-d": spec.blockSize: 33 is out of range 20..=32"#,
        ),
        (
            "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: pool-e}\nspec: {cidr: 'fd00::/48', ipipMode: Always}",
            r#"IPPool "pool-e": spec.ipipMode: IPIP is not supported on IPv6 pools"#,
        ),
        (
            "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: pool-f}\nspec: {cidr: 10.1.0.0/16, natOutgoing: maybe}",
            r#"IPPool "pool-f": spec.natOutgoing: invalid value "maybe" (expected true or false)"#,
        ),
        (
            "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: pool-g}\nspec: {cidr: [10.1.0.0/16]}",
            r#"IPPool "pool-g": spec.cidr: expected string, found list"#,
        ),
        (
            "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: pool-h}\nspec: {cidr: 10.1.0.0/16, ipipMode: Always, vxlanMode: Always}",
            r#"IPPool "pool-h": spec.vxlanMode: ipipMode and vxlanMode cannot both be enabled"#,
        ),
        (
            "apiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {name: 10-244-1-0-26}\nspec: {cidr: 10.244.1.0/26, affinity: node-b}",
            r#"IPAMBlock "10-244-1-0-26": spec.affinity: invalid value "node-b" (expected host:<node> or virtual:<name>)"#,
        ),
        (
            "apiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {name: 10-244-1-0-30}\nspec: {cidr: 10.244.1.0/30, allocations: [0, 3], attributes: [{secondary: {node: x}}]}",
            r#"IPAMBlock "10-244-1-0-30": spec.allocations[1]: attribute index 3 out of range (1 attributes)"#,
        ),
        (
            "apiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {name: 10-244-1-0-31}\nspec: {cidr: 10.244.1.0/31, allocations: [null, null, 0], attributes: [{}]}",
            r#"IPAMBlock "10-244-1-0-31": spec.allocations: 3 entries for a block of 2 addresses (10.244.1.0/31)"#,
        ),
        (
            "apiVersion: crd.projectcalico.org/v1\nkind: BlockAffinity\nmetadata: {name: a1}\nspec: {cidr: 10.244.1.0/26, node: node-b, deleted: perhaps}",
            r#"BlockAffinity "a1": spec.deleted: invalid value "perhaps" (expected true or false)"#,
        ),
        (
            "apiVersion: crd.projectcalico.org/v1\nkind: BlockAffinity\nmetadata: {name: a2}\nspec: {cidr: 10.244.1.0/26}",
            r#"BlockAffinity "a2": spec.node: missing"#,
        ),
        (
            "apiVersion: projectcalico.org/v3\nkind: Node\nmetadata: {name: node-x}\nspec: {bgp: {ipv4Address: 10.0.0.300/24}}",
            r#"Node "node-x": spec.bgp.ipv4Address: invalid CIDR "10.0.0.300/24""#,
        ),
        (
            "apiVersion: projectcalico.org/v3\nkind: Node\nmetadata: {name: node-y}\nspec: {bgp: {ipv6Address: 10.0.0.14/24}}",
            r#"Node "node-y": spec.bgp.ipv6Address: invalid value "10.0.0.14/24" (expected an IPv6 address)"#,
        ),
        (
            "apiVersion: v1\nkind: Node\nmetadata: {name: node-z, annotations: {projectcalico.org/IPv4Address: bogus}}",
            r#"Node "node-z": metadata.annotations[projectcalico.org/IPv4Address]: invalid CIDR "bogus""#,
        ),
        (
            "apiVersion: v1\nkind: Node\nmetadata: {name: node-w}\nstatus: {addresses: [{type: InternalIP, address: 10.0.0.1.1}]}",
            r#"Node "node-w": status.addresses[0].address: invalid IP address "10.0.0.1.1""#,
        ),
        (
            "apiVersion: projectcalico.org/v3\nkind: FelixConfiguration\nmetadata: {name: default}\nspec: {routeRefreshInterval: 90}",
            r#"FelixConfiguration "default": spec.routeRefreshInterval: expected string, found number"#,
        ),
        (
            "apiVersion: projectcalico.org/v3\nkind: FelixConfiguration\nmetadata: {name: default}\nspec: {deviceRouteProtocol: 300}",
            r#"FelixConfiguration "default": spec.deviceRouteProtocol: 300 is out of range 0..=255"#,
        ),
        (
            "apiVersion: projectcalico.org/v3\nkind: BGPConfiguration\nmetadata: {name: default}\nspec: {programClusterRoutes: 3}",
            r#"BGPConfiguration "default": spec.programClusterRoutes: expected string, found number"#,
        ),
        (
            "apiVersion: apps/v1\nkind: IPPool\nmetadata: {name: odd}\nspec: {cidr: 10.9.0.0/16}",
            r#"IPPool "odd": unsupported apiVersion "apps/v1" (expected projectcalico.org/v3 or crd.projectcalico.org/v1)"#,
        ),
        ("apiVersion: projectcalico.org/v3\nkind: IPPool\nspec: {cidr: 10.9.0.0/16}", "IPPool without metadata.name"),
        // Issue 22: names, IPAM block names, pools as Calico's IP pool client checks them.
        (
            "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: \"evil\\nname\"}\nspec: {cidr: 10.9.0.0/16}",
            r#"IPPool "evil\nname": metadata.name: invalid value "evil\nname" (expected a DNS-1123 subdomain: lower-case letters, digits, '-' and '.', at most 253 characters)"#,
        ),
        (
            "apiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {name: b1}\nspec: {cidr: 10.244.1.0/26}",
            r#"IPAMBlock "b1": metadata.name: an IPAM block for 10.244.1.0/26 is named "10-244-1-0-26""#,
        ),
        (
            "apiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {name: 10-244-1-0-26}\nspec: {cidr: 10.244.1.0/26, affinity: \"host:Node_B\"}",
            r#"IPAMBlock "10-244-1-0-26": spec.affinity: invalid value "host:Node_B" (expected host:<node> or virtual:<name> with a DNS-1123 name)"#,
        ),
        (
            "apiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {name: 10-244-1-0-26}\nspec: {cidr: 10.244.1.0/26, allocations: [0], attributes: [{secondary: {node: \"a\\u001b[31m\"}}]}",
            "IPAMBlock \"10-244-1-0-26\": spec.attributes[0].secondary.node: invalid value \"a\\u{1b}[31m\" (expected a node name (DNS-1123 subdomain))",
        ),
        (
            "apiVersion: crd.projectcalico.org/v1\nkind: BlockAffinity\nmetadata: {name: a3}\nspec: {cidr: 10.244.1.0/26, node: \"../etc\"}",
            r#"BlockAffinity "a3": spec.node: invalid value "../etc" (expected a node name (DNS-1123 subdomain))"#,
        ),
        (
            "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: hostbits}\nspec: {cidr: 10.9.1.0/16}",
            r#"IPPool "hostbits": spec.cidr: 10.9.1.0/16 is not strictly masked (host bits are set; the network is 10.9.0.0/16)"#,
        ),
        (
            "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: everything}\nspec: {cidr: 0.0.0.0/0}",
            r#"IPPool "everything": spec.cidr: 0.0.0.0/0 overlaps the link-local range 169.254.0.0/16"#,
        ),
        (
            "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: everything6}\nspec: {cidr: '::/0'}",
            r#"IPPool "everything6": spec.cidr: ::/0 overlaps the link-local range fe80::/10"#,
        ),
        (
            "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: apipa}\nspec: {cidr: 169.254.0.0/24}",
            r#"IPPool "apipa": spec.cidr: 169.254.0.0/24 overlaps the link-local range 169.254.0.0/16"#,
        ),
        (
            "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: p-dup}\nspec: {cidr: 10.9.0.0/16, cidr: 10.10.0.0/16}",
            "IPPool \"p-dup\": line 16: duplicate mapping key \"cidr\"",
        ),
    ];
    for (bad, want) in cases {
        let text = format!("{GOOD}---\n{bad}\n");
        let (cluster, errors) = load(&text);
        let rendered: Vec<String> = errors.iter().map(|e| crate::text::escape(&e.to_string()).into_owned()).collect();
        assert_eq!(rendered, vec![(*want).to_owned()], "input:\n{bad}");
        assert!(cluster.ip_pools.contains_key("good-pool"), "good pool lost for:\n{bad}");
        assert_eq!(cluster.nodes["node-a"].bgp_ipv4, Some("10.0.0.11/24".parse().unwrap()));
        // The bad object itself is left out.
        let bad_name = errors[0].object().map(|(_, n)| n.to_owned());
        if let Some(name) = bad_name.filter(|n| n != "default") {
            assert!(!cluster.ip_pools.contains_key(&name) && !cluster.ipam_blocks.contains_key(name.as_str()));
        }
    }
}

#[test]
fn two_bad_fields_in_one_object_are_both_reported() {
    let text = "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: p}\nspec: {cidr: nope, vxlanMode: Sometimes}\n";
    let (cluster, errors) = load(text);
    assert!(cluster.ip_pools.is_empty());
    let fields: Vec<&str> = errors
        .iter()
        .map(|e| match e {
            ModelError::Field { field, .. } => field.as_str(),
            _ => "",
        })
        .collect();
    assert_eq!(fields, vec!["spec.cidr", "spec.vxlanMode"]);
}

#[test]
fn unknown_fields_and_kinds_are_ignored() {
    let text = "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: p, uid: x}\nspec: {cidr: 10.1.0.0/16, futureField: {a: 1}, assignmentMode: Automatic}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: web}\n---\napiVersion: projectcalico.org/v3\nkind: IPAMHandle\nmetadata: {name: h}\n";
    let (cluster, errors) = load(text);
    assert_eq!(errors, vec![]);
    assert_eq!(cluster.ip_pools["p"].cidr, "10.1.0.0/16".parse::<IpNet>().unwrap());
}

#[test]
fn pool_defaults_and_normalisation() {
    let text = "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: v4}\nspec: {cidr: 10.1.0.0/16}\n---\napiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: v6}\nspec: {cidr: 'fd00:10:244::/48', allowedUses: [LoadBalancer]}\n";
    let (cluster, errors) = load(text);
    assert_eq!(errors, vec![]);
    let v4 = &cluster.ip_pools["v4"];
    assert_eq!(v4.cidr.to_string(), "10.1.0.0/16");
    assert_eq!((v4.block_size, v4.ipip_mode, v4.vxlan_mode), (26, EncapMode::Never, EncapMode::Never));
    assert_eq!(v4.node_selector, "all()");
    assert!(!v4.is_load_balancer_only());
    let v6 = &cluster.ip_pools["v6"];
    assert_eq!(v6.block_size, 122);
    assert!(v6.is_load_balancer_only());
}

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
    // reads (node, type) is (issue 23: the rest is most of the memory of 100,000 blocks).
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

/// `kubectl get nodes -o yaml` (core v1, a List) and `calicoctl get nodes -o yaml` (a
/// NodeList) both load, with next hops chosen BGP > InternalIP > ExternalIP per family.
#[test]
fn core_and_calico_node_lists() {
    let text = r#"
apiVersion: v1
kind: List
items:
  - apiVersion: v1
    kind: Node
    metadata:
      name: node-b
      annotations:
        projectcalico.org/IPv4Address: 10.0.0.12/24
        projectcalico.org/IPv6Address: fd00:10::12/64
        projectcalico.org/IPv4IPIPTunnelAddr: 10.244.20.1
        projectcalico.org/ASNumber: "64512"
    status:
      addresses:
        - {type: InternalIP, address: 10.0.0.12}
        - {type: Hostname, address: node-b}
  - apiVersion: v1
    kind: Node
    metadata: {name: node-e}
    status:
      addresses:
        - {type: ExternalIP, address: 203.0.113.5}
        - {type: InternalIP, address: 10.0.2.15}
        - {type: InternalIP, address: "fd00:20::15"}
---
apiVersion: projectcalico.org/v3
kind: NodeList
items:
  - metadata: {name: node-c}
    spec:
      bgp: {ipv4Address: 10.0.0.13/24}
      addresses: [{address: 10.0.0.13/24, type: CalicoNodeIP}]
"#;
    let (cluster, errors) = load(text);
    assert_eq!(errors, vec![]);
    let b = &cluster.nodes["node-b"];
    assert_eq!(b.form, NodeForm::Kubernetes);
    assert_eq!(b.next_hop(false), Some((ip("10.0.0.12"), NodeAddressSource::Bgp)));
    assert_eq!(b.next_hop(true), Some((ip("fd00:10::12"), NodeAddressSource::Bgp)));
    assert_eq!(b.subnet(false), Some("10.0.0.0/24".parse().unwrap()));
    assert_eq!(b.ipv4_ipip_tunnel_addr, Some(ip("10.244.20.1")));
    assert_eq!(b.as_number, Some(64512));
    let e = &cluster.nodes["node-e"];
    assert_eq!(e.next_hop(false), Some((ip("10.0.2.15"), NodeAddressSource::InternalIp)));
    assert_eq!(e.next_hop(true), Some((ip("fd00:20::15"), NodeAddressSource::InternalIp)));
    assert_eq!(e.subnet(false), None);
    let c = &cluster.nodes["node-c"];
    assert_eq!(c.form, NodeForm::Calico);
    assert_eq!(c.next_hop(false), Some((ip("10.0.0.13"), NodeAddressSource::Bgp)));
    assert_eq!(c.next_hop(true), None);
}

/// Issue 48: an object defined twice is refused in every definition (the first one won, so a
/// later file that sorts first could rewrite routes through its values). A Node too: none of
/// its definitions decides a route.
#[test]
fn duplicates_refuse_every_definition() {
    let text = "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: p}\nspec: {cidr: 10.1.0.0/16}\n---\napiVersion: crd.projectcalico.org/v1\nkind: IPPool\nmetadata: {name: p}\nspec: {cidr: 10.2.0.0/16}\n---\napiVersion: projectcalico.org/v3\nkind: Node\nmetadata: {name: n}\nspec: {bgp: {ipv4Address: 10.0.0.1/24}}\n---\napiVersion: projectcalico.org/v3\nkind: Node\nmetadata: {name: n}\nspec: {bgp: {ipv4Address: 10.0.0.99/24}}\n";
    let (cluster, errors) = load(text);
    let dup = |kind, name: &str| ModelError::Duplicate { kind, name: name.into() };
    assert_eq!(errors, vec![dup(Kind::IpPool, "p"), dup(Kind::Node, "n"), dup(Kind::IpPool, "p"), dup(Kind::Node, "n")]);
    assert!(cluster.ip_pools.is_empty() && cluster.nodes.is_empty());
}

#[test]
fn felix_configuration_scopes_and_fields() {
    let text = "apiVersion: projectcalico.org/v3\nkind: FelixConfiguration\nmetadata: {name: default}\nspec: {programClusterRoutes: enabled, routeRefreshInterval: 1m30s, deviceRouteProtocol: 3, ipv4NormalRoutePriority: 1024, removeExternalRoutes: true}\n---\napiVersion: projectcalico.org/v3\nkind: FelixConfiguration\nmetadata: {name: node.node-a}\nspec: {}\n";
    let (cluster, errors) = load(text);
    assert_eq!(errors, vec![]);
    let d = cluster.felix_default().unwrap();
    assert_eq!(d.scope, FelixScope::Global);
    assert_eq!(d.program_cluster_routes.as_deref(), Some("enabled"));
    assert_eq!(d.route_refresh_interval, Some(std::time::Duration::from_secs(90)));
    assert_eq!((d.device_route_protocol, d.ipv4_normal_route_priority, d.remove_external_routes), (Some(3), Some(1024), Some(true)));
    assert_eq!(cluster.felix_for_node("node-a").unwrap().scope, FelixScope::Node("node-a".into()));
}

/// Calico's IP pool client refuses a pool that overlaps another (`validateAndSetDefaults`):
/// both are invalid here, named together, and neither routes a block (issue 22, row 6).
#[test]
fn overlapping_pools_are_both_invalid() {
    let text = "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: wide}\nspec: {cidr: 10.0.0.0/8}\n---\napiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: narrow}\nspec: {cidr: 10.244.0.0/16}\n---\napiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: twin}\nspec: {cidr: 10.244.0.0/16}\n---\napiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: apart}\nspec: {cidr: 192.168.0.0/16}\n---\napiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: v6}\nspec: {cidr: 'fd00::/48'}\n";
    let (cluster, errors) = load(text);
    assert_eq!(cluster.ip_pools.keys().collect::<Vec<_>>(), ["apart", "v6"]);
    assert_eq!(
        errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            r#"IPPool "narrow": spec.cidr: 10.244.0.0/16 overlaps IPPool "wide" (10.0.0.0/8), IPPool "twin" (10.244.0.0/16); overlapping pools are invalid and their CIDRs are frozen until fixed"#,
            r#"IPPool "twin": spec.cidr: 10.244.0.0/16 overlaps IPPool "wide" (10.0.0.0/8), IPPool "narrow" (10.244.0.0/16); overlapping pools are invalid and their CIDRs are frozen until fixed"#,
            r#"IPPool "wide": spec.cidr: 10.0.0.0/8 overlaps IPPool "narrow" (10.244.0.0/16), IPPool "twin" (10.244.0.0/16); overlapping pools are invalid and their CIDRs are frozen until fixed"#,
        ]
    );
    assert!(cluster.pool_for("10.244.1.0/26".parse().unwrap()).is_none());
    assert_eq!(cluster.pool_for("192.168.3.0/26".parse().unwrap()).map(|p| &*p.name), Some("apart"));
}

/// ClusterInformation in both Calico groups and without an apiVersion (calicoctl); only the
/// fields routewarden reads.
#[test]
fn cluster_information_in_both_groups() {
    for group in ["crd.projectcalico.org/v1", "projectcalico.org/v3"] {
        let text = format!("apiVersion: {group}\nkind: ClusterInformation\nmetadata: {{name: default}}\nspec: {{calicoVersion: v3.30.2, clusterGUID: abc, clusterType: 'k8s,bgp,kubeadm,kdd', datastoreReady: true}}\n");
        let (cluster, errors) = load(&text);
        assert_eq!(errors, vec![], "{group}");
        assert_eq!(
            cluster.cluster_information_default(),
            Some(&ClusterInformation { name: "default".into(), calico_version: Some("v3.30.2".into()), variant: None }),
            "{group}"
        );
    }
    let (cluster, errors) = load("kind: ClusterInformation\nmetadata: {name: default}\nspec: {variant: Calico}\n");
    assert_eq!(errors, vec![]);
    assert_eq!(
        cluster.cluster_information_default(),
        Some(&ClusterInformation { name: "default".into(), calico_version: None, variant: Some("Calico".into()) })
    );
    let (_, errors) = load("apiVersion: crd.projectcalico.org/v1\nkind: ClusterInformation\nmetadata: {name: default}\nspec: {calicoVersion: 3.3}\n");
    assert_eq!(
        errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        vec![r#"ClusterInformation "default": spec.calicoVersion: expected string, found number"#]
    );
}

/// The operator's Installation: `operator.tigera.io/v1` only.
#[test]
fn installation_cluster_routing_mode() {
    let text = "apiVersion: operator.tigera.io/v1\nkind: Installation\nmetadata: {name: default}\nspec: {variant: Calico, calicoNetwork: {bgp: Enabled, clusterRoutingMode: FelixIPIPOnly, ipPools: [{cidr: 10.244.0.0/16}]}}\n";
    let (cluster, errors) = load(text);
    assert_eq!(errors, vec![]);
    assert_eq!(cluster.installation_default(), Some(&Installation { name: "default".into(), cluster_routing_mode: Some("FelixIPIPOnly".into()) }));
    let (cluster, errors) = load("apiVersion: operator.tigera.io/v1\nkind: Installation\nmetadata: {name: default}\nspec: {variant: Calico}\n");
    assert_eq!(errors, vec![]);
    assert_eq!(cluster.installation_default().unwrap().cluster_routing_mode, None);
    let (_, errors) = load("apiVersion: projectcalico.org/v3\nkind: Installation\nmetadata: {name: default}\nspec: {}\n");
    assert_eq!(
        errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        vec![r#"Installation "default": unsupported apiVersion "projectcalico.org/v3" (expected operator.tigera.io/v1)"#]
    );
}

/// Only the DaemonSet named calico-node is read, keyed by namespace; its calico-node
/// container's FELIX_PROGRAMCLUSTERROUTES (any case, the last entry) and envFrom. Other
/// DaemonSets, even malformed ones, are not read at all.
#[test]
fn calico_node_daemonset_env() {
    let text = "apiVersion: v1\nkind: List\nitems:\n\
- apiVersion: apps/v1\n  kind: DaemonSet\n  metadata: {name: kube-proxy, namespace: kube-system}\n  spec: {template: {spec: {containers: 7}}}\n\
- apiVersion: apps/v1\n  kind: DaemonSet\n  metadata: {name: calico-node, namespace: calico-system}\n  spec:\n    template:\n      spec:\n        initContainers: [{name: install-cni, env: [{name: FELIX_PROGRAMCLUSTERROUTES, value: Disabled}]}]\n        containers:\n        - name: calico-node\n          envFrom: [{configMapRef: {name: kubernetes-services-endpoint}, prefix: X_}]\n          env:\n          - {name: FELIX_PROGRAMCLUSTERROUTES, value: EnabledIPIPOnly}\n          - {name: Felix_ProgramClusterRoutes, value: Enabled}\n          - {name: CALICO_IPV4POOL_CIDR, value: 10.244.0.0/16}\n\
- apiVersion: apps/v1\n  kind: DaemonSet\n  metadata: {name: calico-node, namespace: kube-system}\n  spec:\n    template:\n      spec:\n        containers:\n        - {name: calico-node, env: [{name: FELIX_PROGRAMCLUSTERROUTES, valueFrom: {configMapKeyRef: {name: calico-config, key: routes}}}]}\n";
    let (cluster, errors) = load(text);
    assert_eq!(errors, vec![]);
    assert_eq!(cluster.calico_node_daemonsets.keys().collect::<Vec<_>>(), vec!["calico-system/calico-node", "kube-system/calico-node"]);
    assert_eq!(
        cluster.calico_node_daemonsets["calico-system/calico-node"],
        CalicoNodeDaemonSet {
            namespace: "calico-system".into(),
            container_found: true,
            program_cluster_routes: Some(EnvSetting { name: "Felix_ProgramClusterRoutes".into(), value: EnvValue::Literal("Enabled".into()) }),
            env_from: vec!["configMapRef kubernetes-services-endpoint (prefix X_)".into()],
        }
    );
    assert_eq!(
        cluster.calico_node_daemonsets["kube-system/calico-node"].program_cluster_routes,
        Some(EnvSetting { name: "FELIX_PROGRAMCLUSTERROUTES".into(), value: EnvValue::Reference("configMapKeyRef calico-config/routes".into()) })
    );
    assert_eq!(cluster.calico_node_daemonsets_preferred().iter().map(|d| d.namespace.as_str()).collect::<Vec<_>>(), vec!["calico-system", "kube-system"]);
    // No calico-node container (a renamed one): found, nothing read.
    let (cluster, errors) = load(
        "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: calico-node, namespace: kube-system}\nspec: {template: {spec: {containers: [{name: node}]}}}\n",
    );
    assert_eq!(errors, vec![]);
    assert!(!cluster.calico_node_daemonsets["kube-system/calico-node"].container_found);
    // A bad env: named by object (with its namespace) and field.
    let (_, errors) = load("apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: calico-node, namespace: kube-system}\nspec: {template: {spec: {containers: [{name: calico-node, env: {a: b}}]}}}\n");
    assert_eq!(
        errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        vec![r#"DaemonSet "kube-system/calico-node": spec.template.spec.containers[0].env: expected list, found mapping"#]
    );
    let (_, errors) = load("apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: calico-node, namespace: kube-system}\nspec: {template: {spec: {containers: [{name: calico-node, env: [{name: FELIX_PROGRAMCLUSTERROUTES, value: 1}]}]}}}\n");
    assert_eq!(
        errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        vec![r#"DaemonSet "kube-system/calico-node": spec.template.spec.containers[0].env[0].value: expected string, found number"#]
    );
    let (_, errors) = load("apiVersion: extensions/v1beta1\nkind: DaemonSet\nmetadata: {name: calico-node, namespace: kube-system}\nspec: {}\n");
    assert_eq!(
        errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        vec![r#"DaemonSet "calico-node": unsupported apiVersion "extensions/v1beta1" (expected apps/v1)"#]
    );
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

/// A merge key (`<<: *base`) is read as kubectl reads it (go-yaml): the pool that merges
/// `ipipMode: Always` is an IPIP pool, not a no-encap one with a stray `<<` field; a key written
/// in the pool wins over the merged one, and of a merged sequence the earlier mapping wins.
#[test]
fn merge_keys_decide_the_pool_class_as_kubectl_reads_them() {
    use crate::vocabulary::{PoolClass, PoolKind};
    let text = "\
apiVersion: projectcalico.org/v3
kind: List
metadata:
  ipip: &ipip {ipipMode: Always, natOutgoing: true}
  vxlan: &vxlan {vxlanMode: CrossSubnet}
items:
- apiVersion: projectcalico.org/v3
  kind: IPPool
  metadata: {name: merged}
  spec:
    <<: *ipip
    cidr: 10.1.0.0/16
- apiVersion: projectcalico.org/v3
  kind: IPPool
  metadata: {name: overridden}
  spec:
    ipipMode: Never
    <<: *ipip
    cidr: 10.2.0.0/16
- apiVersion: projectcalico.org/v3
  kind: IPPool
  metadata: {name: sequence}
  spec:
    <<: [{vxlanMode: Never}, *vxlan, *ipip]
    cidr: 10.3.0.0/16
";
    let (cluster, errors) = load(text);
    assert_eq!(errors, vec![]);
    let got: Vec<_> =
        cluster.ip_pools.values().map(|p| (&*p.name, PoolKind::of(p), PoolKind::of(p).class(), p.ipip_mode, p.vxlan_mode, p.nat_outgoing)).collect();
    assert_eq!(
        got,
        [
            ("merged", PoolKind::IpipAlways, Some(PoolClass::Ipip), EncapMode::Always, EncapMode::Never, true),
            ("overridden", PoolKind::NoEncap, Some(PoolClass::NoEncap), EncapMode::Never, EncapMode::Never, true),
            ("sequence", PoolKind::IpipAlways, Some(PoolClass::Ipip), EncapMode::Always, EncapMode::Never, true),
        ]
    );
}

/// A merge key whose value is neither a mapping nor a sequence of mappings makes the pool an
/// invalid object naming the line, its CIDR frozen as any invalid object's.
#[test]
fn a_bad_merge_value_makes_the_pool_invalid_with_its_line() {
    let text = "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: bad-merge}\nspec:\n  cidr: 10.4.0.0/16\n  <<: Always\n";
    let parsed = ParsedObjects::from_yaml_str(text, &YamlLimits::default()).unwrap();
    let [ParsedObject::Error(r)] = parsed.items() else { panic!("{parsed:?}") };
    assert_eq!(r.error.to_string(), "IPPool \"bad-merge\": line 6: the merge key << needs a mapping or a sequence of mappings, found a string");
    assert_eq!(r.cidrs, vec!["10.4.0.0/16".parse::<IpNet>().unwrap()]);
}

/// A List of 100,000 scalars is one rejection naming the count and the first, not 100,000.
#[test]
fn list_items_that_are_not_objects_are_one_rejection() {
    let text = format!("apiVersion: v1\nkind: List\nitems:\n{}", "- 10.5.0.0/16\n".repeat(100_000));
    let parsed = ParsedObjects::from_yaml_str(&text, &YamlLimits::default()).unwrap();
    let [ParsedObject::Error(r)] = parsed.items() else { panic!("{} items", parsed.items().len()) };
    assert_eq!(r.error.to_string(), "not a Kubernetes object: 100000 of the List items are not objects (the first, line 4, is a string)");
    assert_eq!(r.cidrs, vec!["10.5.0.0/16".parse::<IpNet>().unwrap()]);
}

/// Items of a `List` that name no kind take the List's: converted one at a time when the
/// List's `kind` comes before `items` (calicoctl), kept as values until it comes when it comes
/// after them, and past one object's node budget (250,000) kept so the input is refused, not
/// held in memory.
#[test]
fn list_items_that_name_no_kind_are_bounded_until_the_list_names_it() {
    let item = "- {metadata: {name: p}, spec: {cidr: 10.6.0.0/16}}\n";
    let first = format!("apiVersion: projectcalico.org/v3\nkind: IPPoolList\nitems:\n{item}");
    let parsed = ParsedObjects::from_yaml_str(&first, &YamlLimits::default()).unwrap();
    let [ParsedObject::IpPool(name, pool)] = parsed.items() else { panic!("{parsed:?}") };
    assert_eq!((name.as_str(), pool.cidr), ("p", "10.6.0.0/16".parse::<IpNet>().unwrap()));
    let last = format!("apiVersion: projectcalico.org/v3\nitems:\n{item}kind: IPPoolList\n");
    assert_eq!(ParsedObjects::from_yaml_str(&last, &YamlLimits::default()).unwrap(), parsed);
    // 9 nodes an item: 27,778 items are more than 250,000 nodes.
    let many = format!("apiVersion: projectcalico.org/v3\nitems:\n{}kind: IPPoolList\n", item.repeat(27_778));
    let err = ParsedObjects::from_yaml_str(&many, &YamlLimits::default()).unwrap_err();
    assert_eq!(err.to_string(), "List items that name no kind hold more than 250000 YAML nodes before the List's kind: the input as a whole is refused");
    let fewer = format!("apiVersion: projectcalico.org/v3\nitems:\n{}kind: IPPoolList\n", item.repeat(27_777));
    assert_eq!(ParsedObjects::from_yaml_str(&fewer, &YamlLimits::default()).unwrap().items().len(), 27_777);
    let kind_first = format!("apiVersion: projectcalico.org/v3\nkind: IPPoolList\nitems:\n{}", item.repeat(27_778));
    assert_eq!(ParsedObjects::from_yaml_str(&kind_first, &YamlLimits::default()).unwrap().items().len(), 27_778);
}

/// The rejections of one input are counted once each, wherever they come from: 600 invalid
/// List items are 600 rejections (the input is refused only past 1,000), 1,001 refuse it.
#[test]
fn invalid_list_items_count_once_towards_the_input_limit() {
    let list = |n: usize| {
        let item = "- {apiVersion: projectcalico.org/v3, kind: IPPool, metadata: {name: p}, spec: {cidr: x}}\n";
        format!("apiVersion: v1\nitems:\n{}kind: List\n", item.repeat(n))
    };
    let parsed = ParsedObjects::from_yaml_str(&list(600), &YamlLimits::default()).unwrap();
    assert_eq!(parsed.items().iter().filter(|i| !i.is_good()).count(), 600);
    let err = ParsedObjects::from_yaml_str(&list(1001), &YamlLimits::default()).unwrap_err();
    assert_eq!(err.to_string(), "more than 1000 invalid objects: the input as a whole is refused");
}
