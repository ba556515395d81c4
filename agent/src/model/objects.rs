//! Documents to typed objects: one [`ParsedObject`] per object (or one rejection per bad
//! object or field), in document order, before duplicates across inputs are resolved
//! ([`ParsedObjects`]). `List`s are unpacked, unknown kinds ignored, names and `apiVersion`s
//! checked here; each kind's fields are parsed by its own module.

use std::sync::Arc;

use ipnet::IpNet;
use serde_yaml_ng::Value;

use super::block::{BlockAffinity, IpamBlock};
use super::configurations::{BgpConfiguration, FelixConfiguration};
use super::error::{FieldProblem, ModelError, Rejected};
use super::fields::{self, type_name, Fields};
use super::kind::Kind;
use super::names::{is_dns1123_subdomain, mentioned_cidrs};
use super::node::Node;
use super::ownership_inputs::{CalicoNodeDaemonSet, ClusterInformation, Installation, CALICO_NODE};
use super::pool::IpPool;
use super::yaml::{self, YamlError, YamlLimits};

/// Most invalid objects one input may hold: past it the input is refused as a whole (its
/// last good content kept), so a file of a million broken objects costs one error, not a
/// million kept, logged and frozen.
pub const MAX_REJECTED_PER_INPUT: usize = 1000;

/// One parsed object (or one object's rejection), not yet in a [`Cluster`](super::Cluster).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParsedObject {
    IpPool(String, IpPool),
    /// This and the next two are shared (`Arc`) with the [`Cluster`](super::Cluster) they go
    /// into: a file datastore keeps its files' parsed objects, and each snapshot's model takes
    /// them without a copy.
    IpamBlock(String, Arc<IpamBlock>),
    BlockAffinity(String, Arc<BlockAffinity>),
    Node(String, Arc<Node>),
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
        // The List's apiVersion and item kind, when its header names them before `items`: the
        // items that name no kind are then converted at once.
        let mut early: Option<(String, Option<String>)> = None;
        // Nodes of the items kept in `inheriting` (about 250 bytes a node as values): past one
        // object's budget the input is refused.
        let mut inheriting_nodes = 0usize;
        let mut too_many_inheriting = false;
        // The elements of `items` that are not objects, rejected once the header says List.
        let mut strays: Option<(usize, Value, usize)> = None;
        // Rejections so far; past the limit the parse stops (the input is refused below).
        let mut rejected = 0usize;
        yaml::for_each_chunk(text, limits, &mut |chunk| {
            let before = (parsed.items.len(), list_items.items.len());
            // List items moved into `parsed` at the header, counted when they were added.
            let mut moved = 0;
            match chunk {
                yaml::Chunk::Document(v) => parsed.add(&v),
                yaml::Chunk::ListStart(start) => {
                    let kind = start.get("kind").and_then(Value::as_str).filter(|k| *k == "List" || k.ends_with("List"));
                    early = kind.map(|k| {
                        let api_version = start.get("apiVersion").and_then(Value::as_str).unwrap_or("").to_owned();
                        (api_version, k.strip_suffix("List").filter(|k| !k.is_empty()).map(str::to_owned))
                    });
                }
                yaml::Chunk::ListItem(v) => {
                    let own = v.get("apiVersion").is_some_and(Value::is_string) && v.get("kind").is_some_and(Value::is_string);
                    if own {
                        list_items.add(&v);
                    } else if let Some((api_version, item_kind)) = &early {
                        list_items.add_inner(&v, item_kind.as_deref().map(|k| (api_version.as_str(), k)));
                    } else {
                        inheriting_nodes += count_nodes(&v);
                        too_many_inheriting |= inheriting_nodes > limits.max_object_nodes;
                        inheriting.push(v);
                    }
                }
                yaml::Chunk::NotObjects { count, first, line } => strays = Some((count, first, line)),
                yaml::Chunk::ListHeader(header) => {
                    let items = std::mem::take(&mut list_items);
                    let rest = std::mem::take(&mut inheriting);
                    let kind = header.get("kind").and_then(Value::as_str).unwrap_or("");
                    if kind == "List" || kind.ends_with("List") {
                        let api_version = header.get("apiVersion").and_then(Value::as_str).unwrap_or("");
                        let item_kind = kind.strip_suffix("List").filter(|k| !k.is_empty());
                        moved = items.items.len();
                        parsed.items.extend(items.items);
                        for v in &rest {
                            parsed.add_inner(v, item_kind.map(|k| (api_version, k)));
                        }
                        if let Some((count, first, line)) = strays.take() {
                            let reason =
                                format!("{count} of the {} items are not objects (the first, line {line}, is a {})", fields::bounded(kind), type_name(&first));
                            parsed.error(ModelError::NotAnObject { reason }, &first);
                        }
                    } else {
                        // Not a List: the root is an object of its own; a root-level `items`
                        // is not a field the model reads.
                        strays = None;
                        parsed.add(&header);
                    }
                }
                yaml::Chunk::Invalid { partial, line, reason, in_list: _ } => parsed.unreadable(&partial, line, reason),
            }
            rejected += parsed.items[(before.0 + moved).min(parsed.items.len())..].iter().filter(|i| !i.is_good()).count();
            rejected += list_items.items[before.1.min(list_items.items.len())..].iter().filter(|i| !i.is_good()).count();
            rejected <= MAX_REJECTED_PER_INPUT && !too_many_inheriting
        })?;
        if too_many_inheriting {
            return Err(YamlError {
                line: None,
                message: format!(
                    "List items that name no kind hold more than {} YAML nodes before the List's kind: the input as a whole is refused",
                    limits.max_object_nodes
                ),
            });
        }
        // A document cut short by an error never delivers its header; its items are dropped
        // with it (the error fails the whole text).
        if rejected > MAX_REJECTED_PER_INPUT {
            return Err(YamlError { line: None, message: format!("more than {MAX_REJECTED_PER_INPUT} invalid objects: the input as a whole is refused") });
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

    /// Add one document (an object or a `List` of them) at the end.
    pub(super) fn add(&mut self, doc: &Value) {
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
            Kind::IpamBlock => IpamBlock::parse(&mut f, name).map(|o| ParsedObject::IpamBlock(n, Arc::new(o))),
            Kind::BlockAffinity => BlockAffinity::parse(&mut f, name).map(|o| ParsedObject::BlockAffinity(n, Arc::new(o))),
            Kind::Node if core_node => Node::parse_kubernetes(&mut f, name).map(|o| ParsedObject::Node(n, Arc::new(o))),
            Kind::Node => Node::parse_calico(&mut f, name).map(|o| ParsedObject::Node(n, Arc::new(o))),
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

/// The number of nodes of `v` (itself included; a tagged value counts its value).
fn count_nodes(v: &Value) -> usize {
    match v {
        Value::Sequence(s) => 1 + s.iter().map(count_nodes).sum::<usize>(),
        Value::Mapping(m) => 1 + m.iter().map(|(k, v)| count_nodes(k) + count_nodes(v)).sum::<usize>(),
        Value::Tagged(t) => count_nodes(&t.value),
        _ => 1,
    }
}
