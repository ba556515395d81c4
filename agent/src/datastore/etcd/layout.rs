//! Calico's etcdv3 key layout, and the documents the model parses made from its values.
//!
//! Three families of keys under `/calico/` are read; every other key is ignored (Felix's
//! status and IPAM handles, policies, workload endpoints, ...). Each is written by
//! `libcalico-go/lib/backend/etcdv3/etcdv3.go` at `model.KeyToDefaultPath(key)` with the value
//! `model.SerializeValue` gives (plain JSON, no envelope):
//!
//! - v3 resources, `/calico/resources/v3/projectcalico.org/<plural>/<name>`
//!   (`libcalico-go/lib/backend/model/resource.go`, `ResourceKey.defaultDeletePath`: the
//!   lower-case plural of `registerResourceInfo`, then the name; a namespaced kind adds a
//!   namespace segment, and none of the five read is namespaced). The value is the whole
//!   resource (`apiVersion`, `kind`, `metadata`, `spec`) as calicoctl prints it: handed to the
//!   model as it is.
//! - IPAM blocks (`model/block.go`, `BlockKey.defaultPath`, read back by the `matchBlock`
//!   regex `^/?calico/ipam/v2/assignment/ipv./block/([^/]+)$`):
//!   `/calico/ipam/v2/assignment/ipv<4|6>/block/<cidr with its one / written as ->`, value an
//!   `AllocationBlock` (`cidr`, `affinity`, `allocations`, `unallocated`, `attributes` with
//!   `handle_id` and `secondary`, `deleted`, ...; the IPAMBlock CRD's spec uses the same JSON
//!   names). A block's `affinity` may be absent or `null` (not affine: OpenStack's shape,
//!   where every allocation is a /32 cluster route), `host:<node>` or `virtual:<name>`
//!   (`AllocationBlock.Host`/`AffinityType`); the model parses all three.
//! - Block affinities (`model/block_affinity.go`, `BlockAffinityKey.defaultPath`, read back by
//!   `matchBlockAffinity`): `/calico/ipam/v2/<type>/<node>/ipv<4|6>/block/<cidr, / as ->`,
//!   `<type>` being `host` (every release; the only one before Calico grew virtual
//!   affinities) or `virtual`; value `{"state":"confirmed","deleted":false}`, the node and CIDR
//!   being in the key (releases before affinities had a state stored no value, which
//!   `parseValue` reads as `{}`: the view does too, a confirmed affinity). The node segment is the node name verbatim (Calico neither escapes
//!   nor checks it: `[^/]+`), so a name the model refuses (not a DNS-1123 subdomain, e.g.
//!   upper case) is refused as `spec.node`, the error naming the key; a dotted FQDN is an
//!   ordinary name. The IPAM code reads and writes these backend keys directly
//!   (`libcalico-go/lib/ipam`); v3 `blockaffinities` resources are not read.
//!
//! Blocks and affinities are wrapped as the `IPAMBlock` / `BlockAffinity` objects the model
//! parses ([`block_document`], [`affinity_document`]), so one parse path serves every
//! datastore.

// The documents are made only by the view, which is the client half's (the `etcd` feature).
#![cfg_attr(not(feature = "etcd"), allow(dead_code, reason = "the documents are read only by the etcd feature's view"))]

use std::fmt::Write as _;

use ipnet::IpNet;
use serde_json::{json, Value};

use crate::model::block_name;

/// The prefix read and watched.
pub const PREFIX: &str = "/calico/";

/// v3 resources read, by the plural of their key (`resource.go`): the kinds the model reads.
pub const RESOURCE_PLURALS: [&str; 5] = ["ippools", "nodes", "felixconfigurations", "bgpconfigurations", "clusterinformations"];

const RESOURCES: &str = "/calico/resources/v3/projectcalico.org/";
const BLOCKS: &str = "/calico/ipam/v2/assignment/";
/// Where affinities live: `/calico/ipam/v2/<type>/...` (`block_affinity.go`).
const AFFINITIES: &str = "/calico/ipam/v2/";

/// The affinity types of `block_affinity.go` (`IPAMAffinityTypeHost`, `IPAMAffinityTypeVirtual`
/// in `block.go`), as key segments and as the model's `spec.type`.
pub const AFFINITY_TYPES: [&str; 2] = ["host", "virtual"];

/// What a key holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyKind {
    /// A whole v3 resource (`resource.go`).
    Resource,
    /// An `AllocationBlock` for this CIDR (`block.go`).
    Block(IpNet),
    /// The affinity of `node` for block `cidr` (`block_affinity.go`); `affinity_type` is one
    /// of [`AFFINITY_TYPES`].
    Affinity { affinity_type: &'static str, node: String, cidr: IpNet },
}

/// The CIDR of a key segment, `/` written as `-` (`10.0.0.0-26`, `fd00::-122`).
fn segment_cidr(segment: &str) -> Option<IpNet> {
    let (addr, len) = segment.rsplit_once('-')?;
    format!("{addr}/{len}").parse().ok()
}

/// `ipv4`/`ipv6` matching the CIDR's family.
fn family_matches(family: &str, cidr: IpNet) -> bool {
    matches!((family, cidr), ("ipv4", IpNet::V4(_)) | ("ipv6", IpNet::V6(_)))
}

/// What `key` holds, `None` for a key routewarden does not read.
pub fn classify(key: &str) -> Option<KeyKind> {
    if let Some(rest) = key.strip_prefix(RESOURCES) {
        let (plural, name) = rest.split_once('/')?;
        return (RESOURCE_PLURALS.contains(&plural) && !name.is_empty() && !name.contains('/')).then_some(KeyKind::Resource);
    }
    if let Some(rest) = key.strip_prefix(BLOCKS) {
        let [family, "block", segment] = rest.split('/').collect::<Vec<_>>()[..] else { return None };
        let cidr = segment_cidr(segment)?;
        return family_matches(family, cidr).then_some(KeyKind::Block(cidr));
    }
    if let Some(rest) = key.strip_prefix(AFFINITIES) {
        let [kind, node, family, "block", segment] = rest.split('/').collect::<Vec<_>>()[..] else { return None };
        let affinity_type = AFFINITY_TYPES.into_iter().find(|t| *t == kind)?;
        let cidr = segment_cidr(segment)?;
        return (family_matches(family, cidr) && !node.is_empty()).then(|| KeyKind::Affinity { affinity_type, node: node.to_owned(), cidr });
    }
    None
}

/// The `IPAMBlock` object for a backend `AllocationBlock` value stored under the key of
/// `cidr`: named after the key's CIDR, the value as its spec (the CRD's field names are the
/// backend's). A value whose own `cidr` differs is still parsed; the model checks the name
/// against `spec.cidr` and reports a mismatch.
pub fn block_document(cidr: IpNet, value: Value) -> Value {
    let mut doc = json!({
        "apiVersion": "crd.projectcalico.org/v1",
        "kind": "IPAMBlock",
        "metadata": { "name": block_name(cidr) },
    });
    doc["spec"] = value;
    doc
}

/// The name Calico gives the v3 form of an affinity of `owner` for `cidr` (libcalico-go's
/// `BlockAffinityConverter.ParseKey`, package `converter`, 2020; the same rule as the
/// KDD objects' names):
/// `<owner>-<block name>`; one of 253 characters or more keeps the first
/// `252 - len(block name) - 13` characters of `owner`, then `-<block name>-` and 11 hex digits
/// of SHA-256 of `<owner>+<block name>`, so it stays a valid object name (at most 253).
pub fn affinity_name(owner: &str, cidr: IpNet) -> String {
    let block = block_name(cidr);
    let name = format!("{owner}-{block}");
    if name.len() < 253 {
        return name;
    }
    let keep: String = owner.chars().take(252usize.saturating_sub(block.len() + 13)).collect();
    let digest = ring::digest::digest(&ring::digest::SHA256, format!("{owner}+{block}").as_bytes());
    let hex = digest.as_ref().iter().fold(String::new(), |mut hex, b| {
        let _ = write!(hex, "{b:02x}");
        hex
    });
    format!("{keep}-{block}-{}", &hex[..11])
}

/// The `BlockAffinity` object for an affinity value (`state`, `deleted`) stored under the key
/// of `affinity_type`, `node` and `cidr` (the key's type wins over any in the value). A host
/// affinity is named as Calico names it ([`affinity_name`] of the node); a virtual one is
/// named after `virtual.<node>`, so it never takes the name of a host affinity for the same
/// CIDR.
pub fn affinity_document(affinity_type: &str, node: &str, cidr: IpNet, value: &Value) -> Value {
    let mut spec = json!({ "node": node, "cidr": cidr.to_string() });
    for field in ["state", "deleted"] {
        if let Some(v) = value.get(field) {
            spec[field] = v.clone();
        }
    }
    spec["type"] = json!(affinity_type);
    let name = match affinity_type {
        "host" => affinity_name(node, cidr),
        other => affinity_name(&format!("{other}.{node}"), cidr),
    };
    json!({
        "apiVersion": "crd.projectcalico.org/v1",
        "kind": "BlockAffinity",
        "metadata": { "name": name },
        "spec": spec,
    })
}

/// The document the model parses for `value` at `key` (classified as `kind`).
pub fn document(kind: &KeyKind, value: Value) -> Value {
    match kind {
        KeyKind::Resource => value,
        KeyKind::Block(cidr) => block_document(*cidr, value),
        KeyKind::Affinity { affinity_type, node, cidr } => affinity_document(affinity_type, node, *cidr, &value),
    }
}

/// The model's form of a document (the YAML value tree it parses; JSON is a subset).
pub fn to_model(doc: &Value) -> serde_yaml_ng::Value {
    // A JSON tree always converts: every JSON value is a YAML value.
    serde_yaml_ng::to_value(doc).unwrap_or(serde_yaml_ng::Value::Null)
}

/// The backend key of an IPAM block (`block.go`): the inverse of [`classify`], for tests
/// and tools that load a cluster into etcd.
pub fn block_key(cidr: IpNet) -> String {
    let family = if matches!(cidr, IpNet::V4(_)) { "ipv4" } else { "ipv6" };
    format!("{BLOCKS}{family}/block/{}", cidr.to_string().replace('/', "-"))
}

/// The backend key of a block affinity of `affinity_type` (`host`, `virtual`;
/// `block_affinity.go`, whose `defaultPath` writes `host` for an empty type).
pub fn affinity_key(affinity_type: &str, node: &str, cidr: IpNet) -> String {
    let family = if matches!(cidr, IpNet::V4(_)) { "ipv4" } else { "ipv6" };
    let affinity_type = if affinity_type.is_empty() { "host" } else { affinity_type };
    format!("{AFFINITIES}{affinity_type}/{node}/{family}/block/{}", cidr.to_string().replace('/', "-"))
}

/// The etcd key and value of a parsed-form object (calicoctl/kubectl YAML turned to JSON), as
/// Calico's etcdv3 backend stores it: v3 resources whole under their plural, `IPAMBlock` and
/// `BlockAffinity` converted to the backend shapes. `None` for a kind not stored in etcd or
/// an object without the fields its key needs.
pub fn etcd_entry(object: &Value) -> Option<(String, Value)> {
    let kind = object.get("kind")?.as_str()?;
    let name = object.pointer("/metadata/name")?.as_str()?;
    let spec = object.get("spec").cloned().unwrap_or_else(|| json!({}));
    match kind {
        "IPAMBlock" => {
            let cidr: IpNet = spec.get("cidr")?.as_str()?.parse().ok()?;
            Some((block_key(cidr), spec))
        }
        "BlockAffinity" => {
            let cidr: IpNet = spec.get("cidr")?.as_str()?.parse().ok()?;
            let node = spec.get("node")?.as_str()?;
            let deleted = match spec.get("deleted") {
                Some(Value::String(s)) => s == "true",
                Some(Value::Bool(b)) => *b,
                _ => false,
            };
            let state = spec.get("state").cloned().unwrap_or_else(|| json!("confirmed"));
            let affinity_type = spec.get("type").and_then(Value::as_str).unwrap_or("host");
            Some((affinity_key(affinity_type, node, cidr), json!({ "state": state, "deleted": deleted })))
        }
        "IPPool" | "Node" | "FelixConfiguration" | "BGPConfiguration" | "ClusterInformation" => {
            let plural = format!("{}s", kind.to_ascii_lowercase());
            let mut v3 = object.clone();
            v3["apiVersion"] = json!("projectcalico.org/v3");
            Some((format!("{RESOURCES}{plural}/{name}"), v3))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
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
            (a.name.as_str(), a.node.as_str(), a.affinity_type.as_str(), a.state),
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
        assert_eq!((a.name.as_str(), a.node.as_str()), ("compute-1.openstack.example.org-10-0-0-0-26", "compute-1.openstack.example.org"));
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
        assert_eq!(a.name, affinity_name(&long, "10.0.0.0/26".parse().unwrap()));
        // 252 - len("10-0-0-0-26") - 13 = 228 characters kept; the hash is SHA-256 of
        // "<node>+10-0-0-0-26" (checked with Python's hashlib).
        assert_eq!(a.name, format!("{}-10-0-0-0-26-cfc927d101a", "n".repeat(228)));
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
}
