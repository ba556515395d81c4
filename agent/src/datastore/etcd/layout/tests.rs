use super::*;

#[test]
fn keys_are_classified_as_calico_writes_them() {
    assert_eq!(classify("/calico/resources/v3/projectcalico.org/ippools/default-ipv4-ippool"), Some(KeyKind::Resource));
    assert_eq!(classify("/calico/resources/v3/projectcalico.org/networkpolicies/default/p"), None);
    assert_eq!(classify("/calico/resources/v3/projectcalico.org/ippools/"), None);
    assert_eq!(classify("/calico/ipam/v2/assignment/ipv4/block/10.0.0.0-26"), Some(KeyKind::Block("10.0.0.0/26".parse().unwrap())));
    assert_eq!(classify("/calico/ipam/v2/assignment/ipv6/block/fd00::-122"), Some(KeyKind::Block("fd00::/122".parse().unwrap())));
    assert_eq!(classify("/calico/ipam/v2/assignment/ipv6/block/10.0.0.0-26"), None);
    assert_eq!(
        classify("/calico/ipam/v2/host/node-a/ipv4/block/10.0.0.0-26"),
        Some(KeyKind::Affinity { affinity_type: "host", node: "node-a".into(), cidr: "10.0.0.0/26".parse().unwrap() })
    );
    assert_eq!(
        classify("/calico/ipam/v2/virtual/vm-1/ipv6/block/fd00::-122"),
        Some(KeyKind::Affinity { affinity_type: "virtual", node: "vm-1".into(), cidr: "fd00::/122".parse().unwrap() })
    );
    // Neither an affinity type nor the assignment tree, and not a block segment.
    assert_eq!(classify("/calico/ipam/v2/config/ipv4/block/10.0.0.0-26"), None);
    assert_eq!(classify("/calico/ipam/v2/host//ipv4/block/10.0.0.0-26"), None);
    assert_eq!(classify("/calico/ipam/v2/host/node-a/ipv4/block/10.0.0.0"), None);
    assert_eq!(classify("/calico/ipam/v2/host/node-a/ipv4/block/10.0.0.0-26/x"), None);
    assert_eq!(classify("/calico/ipam/v2/handle/k8s-pod-network.abc"), None);
    assert_eq!(classify("/calico/felix/v2/x"), None);
}

#[test]
fn backend_block_becomes_the_ipamblock_the_model_parses() {
    let value = json!({"cidr": "10.0.0.0/26", "affinity": "host:node-a", "allocations": [0, null], "unallocated": [1],
            "attributes": [{"handle_id": "h", "secondary": {"node": "node-a"}}], "deleted": false});
    let doc = document(&classify("/calico/ipam/v2/assignment/ipv4/block/10.0.0.0-26").unwrap(), value.clone());
    assert_eq!(doc, json!({"apiVersion": "crd.projectcalico.org/v1", "kind": "IPAMBlock", "metadata": {"name": "10-0-0-0-26"}, "spec": value}));
    let (cluster, errors) = crate::model::Cluster::from_values([&to_model(&doc)]);
    assert_eq!(errors, vec![]);
    let block = &cluster.ipam_blocks["10-0-0-0-26"];
    assert_eq!(block.cidr, "10.0.0.0/26".parse::<IpNet>().unwrap());
    assert_eq!(etcd_entry(&doc), Some(("/calico/ipam/v2/assignment/ipv4/block/10.0.0.0-26".into(), value)));
}

#[test]
fn backend_affinity_becomes_the_blockaffinity_the_model_parses() {
    let key = "/calico/ipam/v2/host/node-a/ipv4/block/10.0.0.0-26";
    let value = json!({"state": "confirmed", "deleted": false});
    let doc = document(&classify(key).unwrap(), value.clone());
    assert_eq!(
        doc,
        json!({"apiVersion": "crd.projectcalico.org/v1", "kind": "BlockAffinity", "metadata": {"name": "node-a-10-0-0-0-26"},
                "spec": {"node": "node-a", "cidr": "10.0.0.0/26", "state": "confirmed", "deleted": false, "type": "host"}})
    );
    let (cluster, errors) = crate::model::Cluster::from_values([&to_model(&doc)]);
    assert_eq!(errors, vec![]);
    let a = &cluster.block_affinities["node-a-10-0-0-0-26"];
    assert_eq!((a.node.as_str(), a.deleted, a.affinity_type.as_str()), ("node-a", false, "host"));
    assert_eq!(etcd_entry(&doc), Some((key.into(), value)));
}

/// The affinity of a parsed `key` with `value`, or the model's errors as text.
fn parsed_affinity(key: &str, value: &Value) -> Result<crate::model::BlockAffinity, Vec<String>> {
    let doc = document(&classify(key).unwrap(), value.clone());
    let (cluster, errors) = crate::model::Cluster::from_values([&to_model(&doc)]);
    let first = cluster.block_affinities.values().next().map(|a| a.as_ref().clone());
    match first {
        Some(a) if errors.is_empty() => Ok(a),
        _ => Err(errors.iter().map(ToString::to_string).collect()),
    }
}

#[test]
fn a_virtual_affinity_keeps_its_type_and_a_name_of_its_own() {
    let key = "/calico/ipam/v2/virtual/vm-1/ipv4/block/10.0.0.0-26";
    let value = json!({"state": "pending", "deleted": false, "type": "host"});
    let a = parsed_affinity(key, &value).unwrap();
    assert_eq!(
        (&*a.name, a.node.as_str(), a.affinity_type.as_str(), a.state),
        ("virtual.vm-1-10-0-0-0-26", "vm-1", "virtual", crate::model::AffinityState::Pending)
    );
    // The key's type wins over one in the value; the round trip writes the virtual key.
    let doc = document(&classify(key).unwrap(), value);
    assert_eq!(etcd_entry(&doc), Some((key.into(), json!({"state": "pending", "deleted": false}))));
    // A host and a virtual affinity of the same name and CIDR are two objects.
    let host = document(&classify("/calico/ipam/v2/host/vm-1/ipv4/block/10.0.0.0-26").unwrap(), json!({"state": "confirmed"}));
    let (cluster, errors) = crate::model::Cluster::from_values([&to_model(&doc), &to_model(&host)]);
    assert_eq!(errors, vec![]);
    assert_eq!(cluster.block_affinities.keys().map(|k| &**k).collect::<Vec<_>>(), ["virtual.vm-1-10-0-0-0-26", "vm-1-10-0-0-0-26"]);
}

#[test]
fn affinity_node_names_are_taken_verbatim_from_the_key() {
    // A dotted FQDN (OpenStack compute hosts) is an ordinary node name.
    let a = parsed_affinity("/calico/ipam/v2/host/compute-1.openstack.example.org/ipv4/block/10.0.0.0-26", &json!({"state": "confirmed"})).unwrap();
    assert_eq!((&*a.name, a.node.as_str()), ("compute-1.openstack.example.org-10-0-0-0-26", "compute-1.openstack.example.org"));
    // Calico writes the name unescaped, so a name Kubernetes would refuse reaches the key;
    // the model refuses it as spec.node (and the name made of it), naming the object (the
    // view adds the key).
    assert_eq!(
            parsed_affinity("/calico/ipam/v2/host/Compute_1/ipv4/block/10.0.0.0-26", &json!({"state": "confirmed"})),
            Err(vec![
                "BlockAffinity \"Compute_1-10-0-0-0-26\": metadata.name: invalid value \"Compute_1-10-0-0-0-26\" (expected a DNS-1123 subdomain: lower-case letters, digits, '-' and '.', at most 253 characters)".to_owned(),
                "BlockAffinity \"Compute_1-10-0-0-0-26\": spec.node: invalid value \"Compute_1\" (expected a node name (DNS-1123 subdomain))".to_owned(),
            ])
        );
    // A node name near the 253-character limit: the affinity's name is shortened and
    // hashed as Calico's converter does, and parses.
    let long = format!("{}.example.org", "n".repeat(237));
    assert_eq!(long.len(), 249);
    let a = parsed_affinity(&format!("/calico/ipam/v2/host/{long}/ipv4/block/10.0.0.0-26"), &json!({})).unwrap();
    assert_eq!(a.node, long);
    assert_eq!(a.name.len(), 252);
    assert_eq!(&*a.name, affinity_name(&long, "10.0.0.0/26".parse().unwrap()));
    // 252 - len("10-0-0-0-26") - 13 = 228 characters kept; the hash is SHA-256 of
    // "<node>+10-0-0-0-26" (checked with Python's hashlib).
    assert_eq!(&*a.name, format!("{}-10-0-0-0-26-cfc927d101a", "n".repeat(228)));
    // Percent signs, colons and spaces stay as written (no unescaping), and are refused.
    assert!(parsed_affinity("/calico/ipam/v2/host/node%2Da/ipv4/block/10.0.0.0-26", &json!({})).is_err());
    assert_eq!(
        classify("/calico/ipam/v2/host/node a:1/ipv4/block/10.0.0.0-26"),
        Some(KeyKind::Affinity { affinity_type: "host", node: "node a:1".into(), cidr: "10.0.0.0/26".parse().unwrap() })
    );
}

#[test]
fn a_block_without_affinity_or_with_a_virtual_one_parses() {
    for (affinity, want) in [
        (Value::Null, None),
        (json!("virtual:vm-1"), Some(crate::model::Affinity::Virtual("vm-1".into()))),
        (json!("host:compute-1.example.org"), Some(crate::model::Affinity::Host("compute-1.example.org".into()))),
    ] {
        let value = json!({"cidr": "10.0.0.0/30", "affinity": affinity, "allocations": [0, 1, null, null], "unallocated": [2, 3],
                "attributes": [{"handle_id": "a", "secondary": {"node": "compute-1"}}, {"handle_id": "b", "secondary": {"node": "compute-2"}}]});
        let doc = document(&classify("/calico/ipam/v2/assignment/ipv4/block/10.0.0.0-30").unwrap(), value);
        let (cluster, errors) = crate::model::Cluster::from_values([&to_model(&doc)]);
        assert_eq!(errors, vec![]);
        let b = &cluster.ipam_blocks["10-0-0-0-30"];
        assert_eq!(b.affinity, want);
        let nodes: Vec<_> = b.allocated().map(|a| (a.ip.to_string(), a.attributes.node().map(str::to_owned))).collect();
        assert_eq!(nodes, [("10.0.0.0".to_owned(), Some("compute-1".to_owned())), ("10.0.0.1".to_owned(), Some("compute-2".to_owned()))]);
    }
}

/// The range read covers every key `classify` accepts and skips what a live cluster's
/// `/calico/` mostly holds: keys of Calico's shapes, each slot filled with Calico's segments,
/// are either under a read prefix or ignored.
#[test]
fn the_read_prefixes_cover_every_key_read_and_skip_the_rest() {
    let prefixes = read_prefixes();
    assert!(prefixes.windows(2).all(|w| w[0] < w[1] && !w[1].starts_with(&w[0])), "{prefixes:?}");
    let under = |key: &str| prefixes.iter().any(|p| key.starts_with(p.as_str()));
    for skipped in [
        "/calico/resources/v3/projectcalico.org/workloadendpoints/ns/node--k8s-pod-eth0",
        "/calico/resources/v3/projectcalico.org/networkpolicies/default/p",
        "/calico/resources/v3/projectcalico.org/profiles/kns.default",
        "/calico/ipam/v2/handle/k8s-pod-network.abc",
        "/calico/ipam/v2/config",
        "/calico/felix/v2/no-region/host/node-a/status",
    ] {
        assert!(!under(skipped), "{skipped} is read");
        assert_eq!(classify(skipped), None);
    }
    let segments = [
        "resources",
        "v3",
        "projectcalico.org",
        "ippools",
        "nodes",
        "felixconfigurations",
        "bgpconfigurations",
        "clusterinformations",
        "workloadendpoints",
        "ipam",
        "v2",
        "assignment",
        "host",
        "virtual",
        "handle",
        "ipv4",
        "ipv6",
        "block",
        "10.0.0.0-26",
        "fd00::-122",
        "node-a",
        "",
    ];
    let mut keys: Vec<String> = Vec::new();
    for a in segments {
        for b in segments {
            keys.push(format!("/calico/resources/v3/projectcalico.org/{a}/{b}"));
            keys.push(format!("/calico/{a}/{b}"));
            for c in segments {
                keys.push(format!("/calico/ipam/v2/{a}/{b}/{c}"));
            }
        }
        for node in ["node-a", "", "host"] {
            for family in ["ipv4", "ipv6", "block"] {
                for block in ["block", "ipv4"] {
                    for cidr in ["10.0.0.0-26", "fd00::-122", ""] {
                        keys.push(format!("/calico/ipam/v2/{a}/{node}/{family}/{block}/{cidr}"));
                    }
                }
            }
        }
    }
    let mut checked = 0;
    for k in &keys {
        if classify(k).is_some() {
            assert!(under(k), "{k} is read by classify but not by the range read");
            checked += 1;
        }
    }
    assert!(checked > 20, "only {checked} keys read");
}
