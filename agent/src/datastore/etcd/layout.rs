//! Calico's etcdv3 key layout, and the documents the model parses made from its values.
//!
//! Two families of keys under `/calico/` are read; every other key is ignored:
//!
//! - v3 resources, `/calico/resources/v3/projectcalico.org/<plural>/<name>` (the key scheme of
//!   `libcalico-go/lib/backend/model/resource.go`, `keyFromDefaultPath` / `ResourceKey`), whose
//!   values are whole resources (`apiVersion`, `kind`, `metadata`, `spec`) exactly as calicoctl
//!   prints them: handed to the model as they are.
//! - IPAM in backend-model form (`libcalico-go/lib/backend/model/block.go`,
//!   `BlockKey.defaultPath`): `/calico/ipam/v2/assignment/ipv4/block/<cidr, / as ->` (and
//!   `ipv6`), value an `AllocationBlock` (`cidr`, `affinity`, `allocations`, `unallocated`,
//!   `attributes` with `handle_id` and `secondary`, `deleted`, ...; the IPAMBlock CRD's spec
//!   uses the same JSON names); and block affinities (`model/block_affinity.go`,
//!   `BlockAffinityKey.defaultPath`): `/calico/ipam/v2/host/<node>/ipv4/block/<cidr, / as ->`,
//!   value `{"state":"confirmed","deleted":false}`, the node and CIDR being in the key. Both are
//!   wrapped as the `IPAMBlock` / `BlockAffinity` objects the model parses ([`block_document`],
//!   [`affinity_document`]), so one parse path serves every datastore.

use ipnet::IpNet;
use serde_json::{json, Value};

use crate::model::block_name;

/// The prefix read and watched.
pub const PREFIX: &str = "/calico/";

/// v3 resources read, by the plural of their key (`resource.go`): the kinds the model reads.
pub const RESOURCE_PLURALS: [&str; 5] = ["ippools", "nodes", "felixconfigurations", "bgpconfigurations", "clusterinformations"];

const RESOURCES: &str = "/calico/resources/v3/projectcalico.org/";
const BLOCKS: &str = "/calico/ipam/v2/assignment/";
const HOSTS: &str = "/calico/ipam/v2/host/";

/// What a key holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyKind {
    /// A whole v3 resource (`resource.go`).
    Resource,
    /// An `AllocationBlock` for this CIDR (`block.go`).
    Block(IpNet),
    /// The affinity of `node` for block `cidr` (`block_affinity.go`).
    Affinity { node: String, cidr: IpNet },
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
    if let Some(rest) = key.strip_prefix(HOSTS) {
        let [node, family, "block", segment] = rest.split('/').collect::<Vec<_>>()[..] else { return None };
        let cidr = segment_cidr(segment)?;
        return (family_matches(family, cidr) && !node.is_empty()).then(|| KeyKind::Affinity { node: node.to_owned(), cidr });
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

/// The `BlockAffinity` object for an affinity value (`state`, `deleted`) stored under the key
/// of `node` and `cidr`.
pub fn affinity_document(node: &str, cidr: IpNet, value: &Value) -> Value {
    let mut spec = json!({ "node": node, "cidr": cidr.to_string() });
    for field in ["state", "deleted", "type"] {
        if let Some(v) = value.get(field) {
            spec[field] = v.clone();
        }
    }
    json!({
        "apiVersion": "crd.projectcalico.org/v1",
        "kind": "BlockAffinity",
        "metadata": { "name": format!("{node}-{}", block_name(cidr)) },
        "spec": spec,
    })
}

/// The document the model parses for `value` at `key` (classified as `kind`).
pub fn document(kind: &KeyKind, value: Value) -> Value {
    match kind {
        KeyKind::Resource => value,
        KeyKind::Block(cidr) => block_document(*cidr, value),
        KeyKind::Affinity { node, cidr } => affinity_document(node, *cidr, &value),
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

/// The backend key of a block affinity (`block_affinity.go`).
pub fn affinity_key(node: &str, cidr: IpNet) -> String {
    let family = if matches!(cidr, IpNet::V4(_)) { "ipv4" } else { "ipv6" };
    format!("{HOSTS}{node}/{family}/block/{}", cidr.to_string().replace('/', "-"))
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
            Some((affinity_key(node, cidr), json!({ "state": state, "deleted": deleted })))
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
            Some(KeyKind::Affinity { node: "node-a".into(), cidr: "10.0.0.0/26".parse().unwrap() })
        );
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
                "spec": {"node": "node-a", "cidr": "10.0.0.0/26", "state": "confirmed", "deleted": false}})
        );
        let (cluster, errors) = crate::model::Cluster::from_values([&to_model(&doc)]);
        assert_eq!(errors, vec![]);
        let a = &cluster.block_affinities["node-a-10-0-0-0-26"];
        assert_eq!((a.node.as_str(), a.deleted), ("node-a", false));
        assert_eq!(etcd_entry(&doc), Some((key.into(), value)));
    }
}
