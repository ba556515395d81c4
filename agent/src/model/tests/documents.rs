//! Documents as kubectl reads them: merge keys, and `List` items that are not objects or
//! name no kind.

use super::*;

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
