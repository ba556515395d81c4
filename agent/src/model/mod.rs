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
//! A left-out object is a [`Rejected`]: its error and the CIDRs it mentions, which the agent
//! treats as frozen ground while no good version stands in for it (DESIGN.md, "Bad input").
//! Names follow Kubernetes' object-name rule (a DNS-1123 subdomain), IPAM blocks are named
//! after their CIDR, and IP pools are checked as Calico's IP pool client checks them (strictly
//! masked, no link-local overlap, no overlap with another pool: [`check_pools`]). Unknown
//! fields and unknown kinds are ignored. Text is read by the bounded streaming loader
//! ([`yaml`]). No I/O here: the datastore reads the files.

use std::collections::BTreeMap;
use std::fmt;

use ipnet::IpNet;
use serde::Serialize;
use serde_yaml_ng::Value;

mod block;
mod config;
mod fields;
mod names;
mod node;
mod pool;
mod sources;
pub mod yaml;

pub use block::{nth_ip, Affinity, AffinityState, Allocation, AllocationAttributes, BlockAffinity, IpamBlock};
pub use config::{parse_go_duration, BgpConfiguration, FelixConfiguration, FelixScope};
pub use names::{block_name, cidrs_in_text, is_dns1123_subdomain, mentioned_cidrs};
pub use node::{Node, NodeAddress, NodeAddressSource, NodeAddressType, NodeForm, TunnelAddressKind};
pub use pool::{check_pools, AllowedUse, EncapMode, IpPool};
pub use sources::{
    CalicoNodeDaemonSet, ClusterInformation, EnvSetting, EnvValue, Installation, OptionalSource, CALICO_NODE, CALICO_NODE_NAMESPACES, FELIX_ENV,
};
pub use yaml::{YamlError, YamlLimits};

use fields::{type_name, Fields};

/// Most invalid objects one input may hold: past it the input is refused as a whole (its
/// last good content kept), so a file of a million broken objects costs one error, not a
/// million kept, logged and frozen.
pub const MAX_REJECTED_PER_INPUT: usize = 1000;

/// The object kinds the model reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Kind {
    IpPool,
    IpamBlock,
    BlockAffinity,
    Node,
    FelixConfiguration,
    BgpConfiguration,
    /// Calico's `ClusterInformation` (the release line, `spec.calicoVersion`).
    ClusterInformation,
    /// tigera/operator's `Installation` (`operator.tigera.io/v1`).
    Installation,
    /// The `calico-node` `DaemonSet` (`apps/v1`); DaemonSets of other names are not read.
    DaemonSet,
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
            Kind::ClusterInformation => "ClusterInformation",
            Kind::Installation => "Installation",
            Kind::DaemonSet => "DaemonSet",
        }
    }

    /// The `apiVersion`s an object of this kind is read in (an empty one is accepted for the
    /// Calico kinds, as calicoctl files omit it).
    pub fn api_versions(self) -> &'static str {
        match self {
            Kind::Node => "projectcalico.org/v3 or crd.projectcalico.org/v1, or v1 for the core Node",
            Kind::Installation => "operator.tigera.io/v1",
            Kind::DaemonSet => "apps/v1",
            _ => "projectcalico.org/v3 or crd.projectcalico.org/v1",
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
            "ClusterInformation" => Kind::ClusterInformation,
            "Installation" => Kind::Installation,
            "DaemonSet" => Kind::DaemonSet,
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
    /// A known kind under an API group routewarden does not read (for example an IPPool in
    /// `apps/v1`).
    #[error("{kind} {name:?}: unsupported apiVersion {api_version:?} (expected {})", kind.api_versions())]
    UnsupportedApiVersion { kind: Kind, name: String, api_version: String },
    /// A second object of the same kind and name; the first one is kept.
    #[error("{kind} {name:?}: defined more than once; the first definition is kept")]
    Duplicate { kind: Kind, name: String },
    /// An object the YAML loader stopped building: too large, a duplicate key, an integer out
    /// of range ([`yaml::Chunk::Invalid`]). Kind and name are those seen before the problem.
    #[error("{}line {line}: {reason}", object_label(*kind, name.as_deref()))]
    Unreadable { kind: Option<Kind>, name: Option<String>, line: usize, reason: String },
}

fn object_label(kind: Option<Kind>, name: Option<&str>) -> String {
    match (kind, name) {
        (Some(k), Some(n)) => format!("{k} {n:?}: "),
        (Some(k), None) => format!("{k} without a name: "),
        _ => String::new(),
    }
}

impl FieldProblem {
    /// The problem with every value it repeats cut to [`fields::MAX_TEXT`] characters.
    fn bounded(self) -> FieldProblem {
        use fields::bounded;
        match self {
            FieldProblem::InvalidCidr(v) => FieldProblem::InvalidCidr(bounded(&v)),
            FieldProblem::InvalidIp(v) => FieldProblem::InvalidIp(bounded(&v)),
            FieldProblem::InvalidValue { value, expected } => FieldProblem::InvalidValue { value: bounded(&value), expected },
            FieldProblem::OutOfRange { value, min, max } => FieldProblem::OutOfRange { value: bounded(&value), min, max },
            FieldProblem::Inconsistent(v) => FieldProblem::Inconsistent(bounded(&v)),
            other => other,
        }
    }
}

impl ModelError {
    /// Stable label for metrics: `field`, `missing-name`, `not-an-object`, `api-version`,
    /// `duplicate`, `unreadable`.
    pub fn code(&self) -> &'static str {
        match self {
            ModelError::Field { .. } => "field",
            ModelError::MissingName { .. } => "missing-name",
            ModelError::NotAnObject { .. } => "not-an-object",
            ModelError::UnsupportedApiVersion { .. } => "api-version",
            ModelError::Duplicate { .. } => "duplicate",
            ModelError::Unreadable { .. } => "unreadable",
        }
    }

    /// The object's kind and name, when known.
    pub fn object(&self) -> Option<(Kind, &str)> {
        match self {
            ModelError::Field { kind, name, .. }
            | ModelError::UnsupportedApiVersion { kind, name, .. }
            | ModelError::Duplicate { kind, name }
            | ModelError::Unreadable { kind: Some(kind), name: Some(name), .. } => Some((*kind, name)),
            ModelError::MissingName { .. } | ModelError::NotAnObject { .. } | ModelError::Unreadable { .. } => None,
        }
    }
}

/// An object left out of the [`Cluster`]: why, and the CIDRs and addresses it mentions
/// ([`mentioned_cidrs`]). While no good version of it is in force, nothing inside those
/// prefixes may be deleted or claimed (it could be the object that wants them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejected {
    pub error: ModelError,
    /// Sorted and deduplicated; addresses as host prefixes (`/32`, `/128`).
    pub cidrs: Vec<IpNet>,
    /// A last good version of the object is in the cluster in its place (the datastore sets
    /// this when it substitutes one).
    pub last_good: bool,
}

impl Rejected {
    /// A rejection with no last good version.
    pub fn new(error: ModelError, cidrs: Vec<IpNet>) -> Rejected {
        Rejected { error, cidrs, last_good: false }
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
    pub cluster_informations: BTreeMap<String, ClusterInformation>,
    pub installations: BTreeMap<String, Installation>,
    /// calico-node DaemonSets by `namespace/calico-node` ([`CalicoNodeDaemonSet::key`]).
    pub calico_node_daemonsets: BTreeMap<String, CalicoNodeDaemonSet>,
    /// Optional sources the datastore could not read, with why (`forbidden (403)`): what they
    /// would say is unknown, and the decision says so ([`OptionalSource`]). Always empty from
    /// the file datastore, which reads what the files hold.
    #[serde(skip_serializing_if = "BTreeMap::is_empty", serialize_with = "serialize_unread")]
    pub unread: BTreeMap<OptionalSource, String>,
}

/// `unread` as `{"calico-node env (kube-system/calico-node)": "forbidden (403)"}`: JSON map
/// keys are strings.
fn serialize_unread<S: serde::Serializer>(unread: &BTreeMap<OptionalSource, String>, s: S) -> Result<S::Ok, S::Error> {
    s.collect_map(unread.iter().map(|(k, v)| (k.label(), v)))
}

impl Cluster {
    /// Build a cluster from parsed YAML documents. Returns the cluster of every good object and
    /// one error per bad object (or per bad field of it), pool overlaps included.
    pub fn from_values<'a>(docs: impl IntoIterator<Item = &'a Value>) -> (Cluster, Vec<ModelError>) {
        let mut b = ClusterBuilder::default();
        let mut errors = Vec::new();
        for doc in docs {
            errors.extend(b.add(doc).into_iter().map(|r| r.error));
        }
        let (cluster, rejected) = b.finish();
        errors.extend(rejected.into_iter().map(|r| r.error));
        (cluster, errors)
    }

    /// Parse a multi-document YAML string with the bounded loader and default limits (pure;
    /// the datastore does the file reading).
    ///
    /// Errors: a YAML syntax error (or nesting past the limit) fails the whole text; object
    /// errors are returned alongside the cluster.
    pub fn from_yaml_str(text: &str) -> Result<(Cluster, Vec<ModelError>), YamlError> {
        let parsed = ParsedObjects::from_yaml_str(text, &YamlLimits::default())?;
        let mut b = ClusterBuilder::default();
        let mut errors: Vec<ModelError> = b.add_parsed(parsed.items).into_iter().map(|r| r.error).collect();
        let (cluster, rejected) = b.finish();
        errors.extend(rejected.into_iter().map(|r| r.error));
        Ok((cluster, errors))
    }

    /// The IP pool containing `cidr`: the most specific one when pools overlap, ties broken
    /// by name.
    pub fn pool_for(&self, cidr: IpNet) -> Option<&IpPool> {
        self.ip_pools.values().filter(|p| p.cidr.contains(&cidr)).max_by(|a, b| a.cidr.prefix_len().cmp(&b.cidr.prefix_len()).then_with(|| b.name.cmp(&a.name)))
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

    /// The ClusterInformation named `default` (the only one calico-node writes).
    pub fn cluster_information_default(&self) -> Option<&ClusterInformation> {
        self.cluster_informations.get("default")
    }

    /// The Installation named `default` (the only one the operator reconciles).
    pub fn installation_default(&self) -> Option<&Installation> {
        self.installations.get("default")
    }

    /// The calico-node DaemonSets, preferred first: `calico-system`, then `kube-system`, then
    /// any other namespace by name.
    pub fn calico_node_daemonsets_preferred(&self) -> Vec<&CalicoNodeDaemonSet> {
        let rank = |ds: &CalicoNodeDaemonSet| CALICO_NODE_NAMESPACES.iter().position(|n| *n == ds.namespace).unwrap_or(CALICO_NODE_NAMESPACES.len());
        let mut v: Vec<&CalicoNodeDaemonSet> = self.calico_node_daemonsets.values().collect();
        v.sort_by(|a, b| rank(a).cmp(&rank(b)).then_with(|| a.namespace.cmp(&b.namespace)));
        v
    }
}

/// Split a multi-document YAML string into values with `serde_yaml_ng`. Empty documents are
/// skipped. Unbounded (the whole text in memory at once): for trusted input such as test
/// fixtures; datastore files go through [`ParsedObjects::from_yaml_str`].
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
    /// Returns the rejections of this document's objects.
    pub fn add(&mut self, doc: &Value) -> Vec<Rejected> {
        let mut parsed = ParsedObjects::default();
        parsed.add(doc);
        self.add_parsed(parsed.items)
    }

    /// Add objects parsed earlier ([`ParsedObjects`]), in their document order, exactly as
    /// [`ClusterBuilder::add`] of the documents they came from would. Returns their
    /// rejections (including duplicates of objects added before).
    pub fn add_parsed(&mut self, items: impl IntoIterator<Item = ParsedObject>) -> Vec<Rejected> {
        let c = &mut self.cluster;
        let mut errors = Vec::new();
        for item in items {
            let cidrs = item.cidrs();
            let dup = match item {
                ParsedObject::IpPool(name, o) => insert(&mut c.ip_pools, Kind::IpPool, name, o),
                ParsedObject::IpamBlock(name, o) => insert(&mut c.ipam_blocks, Kind::IpamBlock, name, o),
                ParsedObject::BlockAffinity(name, o) => insert(&mut c.block_affinities, Kind::BlockAffinity, name, o),
                ParsedObject::Node(name, o) => insert(&mut c.nodes, Kind::Node, name, o),
                ParsedObject::FelixConfiguration(name, o) => insert(&mut c.felix_configurations, Kind::FelixConfiguration, name, o),
                ParsedObject::BgpConfiguration(name, o) => insert(&mut c.bgp_configurations, Kind::BgpConfiguration, name, o),
                ParsedObject::ClusterInformation(name, o) => insert(&mut c.cluster_informations, Kind::ClusterInformation, name, o),
                ParsedObject::Installation(name, o) => insert(&mut c.installations, Kind::Installation, name, o),
                ParsedObject::DaemonSet(name, o) => insert(&mut c.calico_node_daemonsets, Kind::DaemonSet, name, o),
                ParsedObject::Error(r) => {
                    errors.push(r);
                    continue;
                }
            };
            errors.extend(dup.map(|e| Rejected::new(e, cidrs)));
        }
        errors
    }

    /// The cluster built so far, with the checks that need every object applied: IP pools
    /// that overlap another pool are taken out and returned as rejections ([`check_pools`]).
    pub fn finish(self) -> (Cluster, Vec<Rejected>) {
        let mut cluster = self.cluster;
        let rejected = check_pools(&mut cluster);
        (cluster, rejected)
    }
}

/// One parsed object (or one object's rejection), not yet in a [`Cluster`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParsedObject {
    IpPool(String, IpPool),
    IpamBlock(String, IpamBlock),
    BlockAffinity(String, BlockAffinity),
    Node(String, Node),
    FelixConfiguration(String, FelixConfiguration),
    BgpConfiguration(String, BgpConfiguration),
    ClusterInformation(String, ClusterInformation),
    Installation(String, Installation),
    /// The calico-node DaemonSet, named `namespace/calico-node`.
    DaemonSet(String, CalicoNodeDaemonSet),
    /// An object left out, with why and the CIDRs it mentions.
    Error(Rejected),
}

impl ParsedObject {
    /// The object's kind and name (for a rejection: when known).
    pub fn identity(&self) -> Option<(Kind, &str)> {
        Some(match self {
            ParsedObject::IpPool(n, _) => (Kind::IpPool, n.as_str()),
            ParsedObject::IpamBlock(n, _) => (Kind::IpamBlock, n.as_str()),
            ParsedObject::BlockAffinity(n, _) => (Kind::BlockAffinity, n.as_str()),
            ParsedObject::Node(n, _) => (Kind::Node, n.as_str()),
            ParsedObject::FelixConfiguration(n, _) => (Kind::FelixConfiguration, n.as_str()),
            ParsedObject::BgpConfiguration(n, _) => (Kind::BgpConfiguration, n.as_str()),
            ParsedObject::ClusterInformation(n, _) => (Kind::ClusterInformation, n.as_str()),
            ParsedObject::Installation(n, _) => (Kind::Installation, n.as_str()),
            ParsedObject::DaemonSet(n, _) => (Kind::DaemonSet, n.as_str()),
            ParsedObject::Error(r) => return r.error.object(),
        })
    }

    /// The CIDRs a good object routes or claims (pool, block, affinity); the rejection's own
    /// list for a rejection. Used when a later duplicate is rejected.
    pub fn cidrs(&self) -> Vec<IpNet> {
        match self {
            ParsedObject::IpPool(_, p) => vec![p.cidr],
            ParsedObject::IpamBlock(_, b) => vec![b.cidr],
            ParsedObject::BlockAffinity(_, a) => vec![a.cidr],
            ParsedObject::Error(r) => r.cidrs.clone(),
            ParsedObject::Node(..)
            | ParsedObject::FelixConfiguration(..)
            | ParsedObject::BgpConfiguration(..)
            | ParsedObject::ClusterInformation(..)
            | ParsedObject::Installation(..)
            | ParsedObject::DaemonSet(..) => Vec::new(),
        }
    }

    /// Whether this is a good object (not a rejection).
    pub fn is_good(&self) -> bool {
        !matches!(self, ParsedObject::Error(_))
    }
}

/// The objects of some documents, parsed into the model's types in document order, before
/// duplicates across inputs are resolved. The file datastore keeps a file's last good content
/// in this form: a `serde_yaml_ng::Value` tree takes about ten times the memory of the typed
/// objects (about 18 MB against under 3 MB for 10,000 IPAM blocks, heap profile of the agent).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParsedObjects {
    items: Vec<ParsedObject>,
}

impl ParsedObjects {
    /// Parse documents (objects or `List`s of them). Unknown kinds are ignored.
    pub fn from_values<'a>(docs: impl IntoIterator<Item = &'a Value>) -> ParsedObjects {
        let mut parsed = ParsedObjects::default();
        for doc in docs {
            parsed.add(doc);
        }
        parsed.items.shrink_to_fit();
        parsed
    }

    /// Parse YAML text with the bounded streaming loader: each object is converted as soon as
    /// the loader completes it, so memory is bounded by the largest object (module [`yaml`]).
    /// An object the loader stopped building becomes a [`ModelError::Unreadable`] rejection.
    ///
    /// Errors: a [`YamlError`] that stops the text (syntax, nesting depth, unknown alias).
    pub fn from_yaml_str(text: &str, limits: &YamlLimits) -> Result<ParsedObjects, YamlError> {
        let mut parsed = ParsedObjects::default();
        // The elements of a document's `items`, converted now when they name their own
        // apiVersion and kind; kept as values to inherit the List's when they do not.
        let mut list_items = ParsedObjects::default();
        let mut inheriting: Vec<Value> = Vec::new();
        yaml::for_each_chunk(text, limits, &mut |chunk| match chunk {
            yaml::Chunk::Document(v) => parsed.add(&v),
            yaml::Chunk::ListItem(v) => {
                let own = v.get("apiVersion").is_some_and(Value::is_string) && v.get("kind").is_some_and(Value::is_string);
                if own {
                    list_items.add(&v);
                } else {
                    inheriting.push(v);
                }
            }
            yaml::Chunk::ListHeader(header) => {
                let items = std::mem::take(&mut list_items);
                let rest = std::mem::take(&mut inheriting);
                let kind = header.get("kind").and_then(Value::as_str).unwrap_or("");
                if kind == "List" || kind.ends_with("List") {
                    let api_version = header.get("apiVersion").and_then(Value::as_str).unwrap_or("");
                    let item_kind = kind.strip_suffix("List").filter(|k| !k.is_empty());
                    parsed.items.extend(items.items);
                    for v in &rest {
                        parsed.add_inner(v, item_kind.map(|k| (api_version, k)));
                    }
                } else {
                    // Not a List: the root is an object of its own; a root-level `items`
                    // is not a field the model reads.
                    parsed.add(&header);
                }
            }
            yaml::Chunk::Invalid { partial, line, reason, in_list: _ } => parsed.unreadable(&partial, line, reason),
        })?;
        // A document cut short by an error never delivers its header; its items are dropped
        // with it (the error fails the whole text).
        let rejected = parsed.items.iter().filter(|i| !i.is_good()).count();
        if rejected > MAX_REJECTED_PER_INPUT {
            return Err(YamlError {
                line: None,
                message: format!("{rejected} invalid objects, more than {MAX_REJECTED_PER_INPUT}: the input as a whole is refused"),
            });
        }
        parsed.items.shrink_to_fit();
        Ok(parsed)
    }

    /// The parsed objects and errors, in document order.
    pub fn items(&self) -> &[ParsedObject] {
        &self.items
    }

    /// The objects and errors, moved out.
    pub fn into_items(self) -> Vec<ParsedObject> {
        self.items
    }

    /// Parsed objects from items.
    pub fn from_items(items: Vec<ParsedObject>) -> ParsedObjects {
        ParsedObjects { items }
    }

    fn add(&mut self, doc: &Value) {
        self.add_inner(doc, None);
    }

    fn error(&mut self, e: ModelError, doc: &Value) {
        let cidrs = mentioned_cidrs(doc, e.object().map(|o| o.0), e.object().map(|o| o.1));
        self.items.push(ParsedObject::Error(Rejected::new(e, cidrs)));
    }

    /// An object the loader stopped building: named from what was built before the problem;
    /// ignored when that shows a kind routewarden does not read.
    fn unreadable(&mut self, partial: &Value, line: usize, reason: String) {
        let kind_str = partial.get("kind").and_then(Value::as_str);
        if kind_str.is_some_and(|k| Kind::from_kind(k).is_none() && !k.ends_with("List")) {
            return;
        }
        let kind = kind_str.and_then(Kind::from_kind);
        let name = fields::get_in(partial, &["metadata", "name"]).ok().flatten().and_then(Value::as_str).map(fields::bounded);
        // A DaemonSet other than calico-node is not read, broken or not.
        if kind == Some(Kind::DaemonSet) && name.as_deref().is_some_and(|n| n != CALICO_NODE) {
            return;
        }
        let cidrs = mentioned_cidrs(partial, kind, name.as_deref());
        self.items.push(ParsedObject::Error(Rejected::new(ModelError::Unreadable { kind, name, line, reason }, cidrs)));
    }

    fn add_inner(&mut self, doc: &Value, inherited: Option<(&str, &str)>) {
        let Value::Mapping(m) = doc else {
            self.error(ModelError::NotAnObject { reason: format!("document is a {}", type_name(doc)) }, doc);
            return;
        };
        let api_version = m.get("apiVersion").and_then(Value::as_str).or(inherited.map(|i| i.0)).unwrap_or("");
        let Some(kind_str) = m.get("kind").and_then(Value::as_str).or(inherited.map(|i| i.1)) else {
            self.error(ModelError::NotAnObject { reason: "no kind".into() }, doc);
            return;
        };
        if kind_str == "List" || (kind_str.ends_with("List") && m.contains_key("items")) {
            let item_kind = kind_str.strip_suffix("List").filter(|k| !k.is_empty());
            match m.get("items") {
                Some(Value::Sequence(items)) => {
                    for item in items {
                        self.add_inner(item, item_kind.map(|k| (api_version, k)));
                    }
                }
                None | Some(Value::Null) => {}
                Some(other) => self.error(ModelError::NotAnObject { reason: format!("{kind_str} items is a {}", type_name(other)) }, doc),
            }
            return;
        }
        let Some(kind) = Kind::from_kind(kind_str) else { return };
        let name = match fields::get_in(doc, &["metadata", "name"]) {
            Ok(Some(Value::String(n))) if !n.is_empty() => n.as_str(),
            // Only the DaemonSet named calico-node is read; any other is ignored, named or not.
            _ if kind == Kind::DaemonSet => return,
            _ => {
                self.error(ModelError::MissingName { kind }, doc);
                return;
            }
        };
        if kind == Kind::DaemonSet && name != CALICO_NODE {
            return;
        }
        let calico = matches!(api_version, "projectcalico.org/v3" | "crd.projectcalico.org/v1");
        let core_node = kind == Kind::Node && api_version == "v1";
        let accepted = match kind {
            Kind::Installation => matches!(api_version, "operator.tigera.io/v1" | ""),
            Kind::DaemonSet => api_version == "apps/v1",
            Kind::Node => calico || core_node,
            _ => calico || api_version.is_empty(),
        };
        if !accepted {
            let e = ModelError::UnsupportedApiVersion { kind, name: fields::bounded(name), api_version: fields::bounded(api_version) };
            self.error(e, doc);
            return;
        }
        // A DaemonSet is named `namespace/name`: one per namespace.
        let namespace = fields::get_in(doc, &["metadata", "namespace"]).ok().flatten().and_then(Value::as_str).unwrap_or("");
        let key = (kind == Kind::DaemonSet).then(|| CalicoNodeDaemonSet::key(namespace));
        let mut f = Fields::new(kind, key.as_deref().unwrap_or(name), doc);
        let n = key.clone().unwrap_or_else(|| name.to_owned());
        // Kubernetes object names (`k8s.io/apimachinery/pkg/util/validation`
        // `IsDNS1123Subdomain`); an IPAM block is named after its CIDR (checked in its parser).
        if !is_dns1123_subdomain(name) {
            f.fail(
                "metadata.name",
                FieldProblem::InvalidValue {
                    value: name.to_owned(),
                    expected: "a DNS-1123 subdomain: lower-case letters, digits, '-' and '.', at most 253 characters",
                },
            );
        }
        let result = match kind {
            Kind::IpPool => IpPool::parse(&mut f, name).map(|o| ParsedObject::IpPool(n, o)),
            Kind::IpamBlock => IpamBlock::parse(&mut f, name).map(|o| ParsedObject::IpamBlock(n, o)),
            Kind::BlockAffinity => BlockAffinity::parse(&mut f, name).map(|o| ParsedObject::BlockAffinity(n, o)),
            Kind::Node if core_node => Node::parse_kubernetes(&mut f, name).map(|o| ParsedObject::Node(n, o)),
            Kind::Node => Node::parse_calico(&mut f, name).map(|o| ParsedObject::Node(n, o)),
            Kind::FelixConfiguration => FelixConfiguration::parse(&mut f, name).map(|o| ParsedObject::FelixConfiguration(n, o)),
            Kind::BgpConfiguration => BgpConfiguration::parse(&mut f, name).map(|o| ParsedObject::BgpConfiguration(n, o)),
            Kind::ClusterInformation => ClusterInformation::parse(&mut f, name).map(|o| ParsedObject::ClusterInformation(n, o)),
            Kind::Installation => Installation::parse(&mut f, name).map(|o| ParsedObject::Installation(n, o)),
            Kind::DaemonSet => CalicoNodeDaemonSet::parse(&mut f, namespace).map(|o| ParsedObject::DaemonSet(n, o)),
        };
        let result = result.and_then(|obj| if f.errors.is_empty() { Ok(obj) } else { Err(f.take_errors()) });
        match result {
            Ok(obj) => self.items.push(obj),
            Err(errs) => {
                let cidrs = mentioned_cidrs(doc, Some(kind), Some(name));
                self.items.extend(errs.into_iter().map(|e| ParsedObject::Error(Rejected::new(e, cidrs.clone()))));
            }
        }
    }
}

/// Insert unless the name is taken; a duplicate is reported and the first kept.
fn insert<T>(map: &mut BTreeMap<String, T>, kind: Kind, name: String, obj: T) -> Option<ModelError> {
    match map.entry(name) {
        std::collections::btree_map::Entry::Occupied(e) => Some(ModelError::Duplicate { kind, name: e.key().clone() }),
        std::collections::btree_map::Entry::Vacant(e) => {
            e.insert(obj);
            None
        }
    }
}

#[cfg(test)]
mod tests;
