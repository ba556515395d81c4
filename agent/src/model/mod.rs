//! Typed cluster model: what routewarden reads from a Calico cluster.
//!
//! Both API forms users have are accepted: `projectcalico.org/v3` (calicoctl output, etcd
//! mode, v3 CRDs) and `crd.projectcalico.org/v1` (what `kubectl get` shows in a
//! Kubernetes-datastore cluster; the spec field names are the same, reference §4.1), plus the
//! core Kubernetes `v1` Node with its `projectcalico.org/*` annotations. `kind: List` and
//! `kind: <Kind>List` documents are unpacked.
//!
//! Parsing never stops at the first problem: every object is parsed on its own, a bad object is
//! left out and reported with its kind, name and field
//! (`IPPool "pool-a": spec.cidr: invalid CIDR "10.0.0/8"`), and the good objects are kept.
//! Unknown fields and unknown kinds are ignored. No I/O here: the datastore reads the files.

use std::collections::BTreeMap;
use std::fmt;

use ipnet::IpNet;
use serde::Serialize;
use serde_yaml_ng::Value;

mod block;
mod config;
mod fields;
mod node;
mod pool;

pub use block::{nth_ip, Affinity, AffinityState, Allocation, AllocationAttributes, BlockAffinity, IpamBlock};
pub use config::{parse_go_duration, BgpConfiguration, FelixConfiguration, FelixScope};
pub use node::{Node, NodeAddress, NodeAddressSource, NodeAddressType, NodeForm};
pub use pool::{AllowedUse, EncapMode, IpPool};

use fields::{type_name, Fields};

/// The object kinds the model reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Kind {
    IpPool,
    IpamBlock,
    BlockAffinity,
    Node,
    FelixConfiguration,
    BgpConfiguration,
}

impl Kind {
    /// The Kubernetes `kind` string (`IPPool`, `IPAMBlock`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::IpPool => "IPPool",
            Kind::IpamBlock => "IPAMBlock",
            Kind::BlockAffinity => "BlockAffinity",
            Kind::Node => "Node",
            Kind::FelixConfiguration => "FelixConfiguration",
            Kind::BgpConfiguration => "BGPConfiguration",
        }
    }

    /// The model kind for a `kind` string; `None` for kinds routewarden does not read.
    pub fn from_kind(kind: &str) -> Option<Kind> {
        Some(match kind {
            "IPPool" => Kind::IpPool,
            "IPAMBlock" => Kind::IpamBlock,
            "BlockAffinity" => Kind::BlockAffinity,
            "Node" => Kind::Node,
            "FelixConfiguration" => Kind::FelixConfiguration,
            "BGPConfiguration" => Kind::BgpConfiguration,
            _ => return None,
        })
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What is wrong with one field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FieldProblem {
    #[error("missing")]
    Missing,
    #[error("empty")]
    Empty,
    #[error("expected {expected}, found {found}")]
    WrongType { expected: &'static str, found: &'static str },
    #[error("invalid CIDR {0:?}")]
    InvalidCidr(String),
    #[error("invalid IP address {0:?}")]
    InvalidIp(String),
    #[error("invalid value {value:?} (expected {expected})")]
    InvalidValue { value: String, expected: &'static str },
    #[error("{value} is out of range {min}..={max}")]
    OutOfRange { value: String, min: u64, max: u64 },
    #[error("{0}")]
    Inconsistent(String),
}

/// An object that could not be read. The object is left out of the [`Cluster`]; the other
/// objects are unaffected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// A field has a wrong type, a bad CIDR or address, or an impossible value.
    #[error("{kind} {name:?}: {field}: {problem}")]
    Field { kind: Kind, name: String, field: String, problem: FieldProblem },
    /// An object of a known kind without `metadata.name`.
    #[error("{kind} without metadata.name")]
    MissingName { kind: Kind },
    /// A document that is not a mapping, or has no `kind`.
    #[error("not a Kubernetes object: {reason}")]
    NotAnObject { reason: String },
    /// A known kind under an API group routewarden does not read (for example `apps/v1`).
    #[error("{kind} {name:?}: unsupported apiVersion {api_version:?} (expected projectcalico.org/v3 or crd.projectcalico.org/v1{core})", core = if *kind == Kind::Node { ", or v1 for the core Node" } else { "" })]
    UnsupportedApiVersion { kind: Kind, name: String, api_version: String },
    /// A second object of the same kind and name; the first one is kept.
    #[error("{kind} {name:?}: defined more than once; the first definition is kept")]
    Duplicate { kind: Kind, name: String },
}

impl ModelError {
    /// Stable label for metrics: `field`, `missing-name`, `not-an-object`, `api-version`,
    /// `duplicate`.
    pub fn code(&self) -> &'static str {
        match self {
            ModelError::Field { .. } => "field",
            ModelError::MissingName { .. } => "missing-name",
            ModelError::NotAnObject { .. } => "not-an-object",
            ModelError::UnsupportedApiVersion { .. } => "api-version",
            ModelError::Duplicate { .. } => "duplicate",
        }
    }

    /// The object's kind and name, when known.
    pub fn object(&self) -> Option<(Kind, &str)> {
        match self {
            ModelError::Field { kind, name, .. }
            | ModelError::UnsupportedApiVersion { kind, name, .. }
            | ModelError::Duplicate { kind, name } => Some((*kind, name)),
            ModelError::MissingName { .. } | ModelError::NotAnObject { .. } => None,
        }
    }
}

/// The cluster as routewarden sees it. Maps are keyed by object name (deterministic order).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Cluster {
    pub ip_pools: BTreeMap<String, IpPool>,
    pub ipam_blocks: BTreeMap<String, IpamBlock>,
    pub block_affinities: BTreeMap<String, BlockAffinity>,
    pub nodes: BTreeMap<String, Node>,
    pub felix_configurations: BTreeMap<String, FelixConfiguration>,
    pub bgp_configurations: BTreeMap<String, BgpConfiguration>,
}

impl Cluster {
    /// Build a cluster from parsed YAML documents. Returns the cluster of every good object and
    /// one error per bad object (or per bad field of it).
    pub fn from_values<'a>(docs: impl IntoIterator<Item = &'a Value>) -> (Cluster, Vec<ModelError>) {
        let mut b = ClusterBuilder::default();
        let mut errors = Vec::new();
        for doc in docs {
            errors.extend(b.add(doc));
        }
        (b.finish(), errors)
    }

    /// Parse a multi-document YAML string (pure; the datastore does the file reading).
    ///
    /// Errors: a YAML syntax error fails the whole text; object errors are returned alongside
    /// the cluster.
    pub fn from_yaml_str(text: &str) -> Result<(Cluster, Vec<ModelError>), serde_yaml_ng::Error> {
        let docs = parse_yaml_documents(text)?;
        Ok(Cluster::from_values(docs.iter()))
    }

    /// The IP pool containing `cidr`: the most specific one when pools overlap, ties broken
    /// by name.
    pub fn pool_for(&self, cidr: IpNet) -> Option<&IpPool> {
        self.ip_pools
            .values()
            .filter(|p| p.cidr.contains(&cidr))
            .max_by(|a, b| a.cidr.prefix_len().cmp(&b.cidr.prefix_len()).then_with(|| b.name.cmp(&a.name)))
    }

    /// The BGPConfiguration named `default`, the only one that affects ownership.
    pub fn bgp_default(&self) -> Option<&BgpConfiguration> {
        self.bgp_configurations.get("default")
    }

    /// The FelixConfiguration named `default`.
    pub fn felix_default(&self) -> Option<&FelixConfiguration> {
        self.felix_configurations.get("default")
    }

    /// The FelixConfiguration named `node.<node>`.
    pub fn felix_for_node(&self, node: &str) -> Option<&FelixConfiguration> {
        self.felix_configurations.get(&format!("node.{node}"))
    }
}

/// Split a multi-document YAML string into values. Empty documents are skipped.
///
/// Errors: the first YAML syntax error; its `location()` gives the line in `text`.
pub fn parse_yaml_documents(text: &str) -> Result<Vec<Value>, serde_yaml_ng::Error> {
    use serde::Deserialize;
    let mut out = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(text) {
        let v = Value::deserialize(doc)?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

/// Incremental [`Cluster`] construction, one document at a time (the datastore uses it to tie
/// errors to files).
#[derive(Debug, Default)]
pub struct ClusterBuilder {
    cluster: Cluster,
}

impl ClusterBuilder {
    /// Add one document: a Kubernetes object, or a `List` of them. Unknown kinds are ignored.
    /// Returns the errors of this document's objects.
    pub fn add(&mut self, doc: &Value) -> Vec<ModelError> {
        let mut errors = Vec::new();
        self.add_inner(doc, None, &mut errors);
        errors
    }

    /// The cluster built so far.
    pub fn finish(self) -> Cluster {
        self.cluster
    }

    fn add_inner(&mut self, doc: &Value, inherited: Option<(&str, &str)>, errors: &mut Vec<ModelError>) {
        let Value::Mapping(m) = doc else {
            errors.push(ModelError::NotAnObject { reason: format!("document is a {}", type_name(doc)) });
            return;
        };
        let api_version = m.get("apiVersion").and_then(Value::as_str).or(inherited.map(|i| i.0)).unwrap_or("");
        let Some(kind_str) = m.get("kind").and_then(Value::as_str).or(inherited.map(|i| i.1)) else {
            errors.push(ModelError::NotAnObject { reason: "no kind".into() });
            return;
        };
        if kind_str == "List" || (kind_str.ends_with("List") && m.contains_key("items")) {
            let item_kind = kind_str.strip_suffix("List").filter(|k| !k.is_empty());
            match m.get("items") {
                Some(Value::Sequence(items)) => {
                    for item in items {
                        self.add_inner(item, item_kind.map(|k| (api_version, k)), errors);
                    }
                }
                None | Some(Value::Null) => {}
                Some(other) => errors.push(ModelError::NotAnObject {
                    reason: format!("{kind_str} items is a {}", type_name(other)),
                }),
            }
            return;
        }
        let Some(kind) = Kind::from_kind(kind_str) else { return };
        let name = match fields::get_in(doc, &["metadata", "name"]) {
            Ok(Some(Value::String(n))) if !n.is_empty() => n.as_str(),
            _ => {
                errors.push(ModelError::MissingName { kind });
                return;
            }
        };
        let calico = matches!(api_version, "projectcalico.org/v3" | "crd.projectcalico.org/v1");
        let core_node = kind == Kind::Node && api_version == "v1";
        if !(calico || core_node || (api_version.is_empty() && kind != Kind::Node)) {
            errors.push(ModelError::UnsupportedApiVersion {
                kind,
                name: name.to_owned(),
                api_version: api_version.to_owned(),
            });
            return;
        }
        let mut f = Fields::new(kind, name, doc);
        let c = &mut self.cluster;
        let result = match kind {
            Kind::IpPool => IpPool::parse(&mut f, name).map(|o| insert(&mut c.ip_pools, kind, name, o)),
            Kind::IpamBlock => IpamBlock::parse(&mut f, name).map(|o| insert(&mut c.ipam_blocks, kind, name, o)),
            Kind::BlockAffinity => {
                BlockAffinity::parse(&mut f, name).map(|o| insert(&mut c.block_affinities, kind, name, o))
            }
            Kind::Node if core_node => Node::parse_kubernetes(&mut f, name).map(|o| insert(&mut c.nodes, kind, name, o)),
            Kind::Node => Node::parse_calico(&mut f, name).map(|o| insert(&mut c.nodes, kind, name, o)),
            Kind::FelixConfiguration => FelixConfiguration::parse(&mut f, name)
                .map(|o| insert(&mut c.felix_configurations, kind, name, o)),
            Kind::BgpConfiguration => {
                BgpConfiguration::parse(&mut f, name).map(|o| insert(&mut c.bgp_configurations, kind, name, o))
            }
        };
        match result {
            Ok(None) => {}
            Ok(Some(dup)) => errors.push(dup),
            Err(errs) => errors.extend(errs),
        }
    }
}

/// Insert unless the name is taken; a duplicate is reported and the first kept.
fn insert<T>(map: &mut BTreeMap<String, T>, kind: Kind, name: &str, obj: T) -> Option<ModelError> {
    if map.contains_key(name) {
        return Some(ModelError::Duplicate { kind, name: name.to_owned() });
    }
    map.insert(name.to_owned(), obj);
    None
}

#[cfg(test)]
mod tests;
