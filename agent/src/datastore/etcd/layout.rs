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

/// The key prefixes the range read covers: every key [`classify`] accepts is under one of them,
/// and none of the keys it ignores that are most of a live cluster's `/calico/` (workload
/// endpoints, IPAM handles, policies, status): a resource plural's directory, the IPAM blocks',
/// and each affinity type's. Sorted and disjoint.
pub fn read_prefixes() -> Vec<String> {
    let mut prefixes: Vec<String> = RESOURCE_PLURALS.iter().map(|p| format!("{RESOURCES}{p}/")).collect();
    prefixes.push(BLOCKS.to_owned());
    prefixes.extend(AFFINITY_TYPES.iter().map(|t| format!("{AFFINITIES}{t}/")));
    prefixes.sort();
    prefixes
}

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
mod tests;
