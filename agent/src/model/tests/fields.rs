//! Each bad field named with its object, the rest of the input loaded; IP pools' defaults
//! and overlaps.

use super::*;

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
        // Names, IPAM block names, pools as Calico's IP pool client checks them.
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

/// Calico's IP pool client refuses a pool that overlaps another (`validateAndSetDefaults`):
/// both are invalid here, named together, and neither routes a block (row 6).
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
