//! Building values from events one *object* at a time (a document, or one element of a
//! `List` document's `items`) and delivering each as a [`Chunk`] as soon as it is complete,
//! within the per-object budget: a sequence past its length limit, an object past its node
//! budget, aliases past the input's expansion budget, a duplicate key, a bad merge key or an
//! out-of-range integer makes that object [`Chunk::Invalid`] with the part built before the
//! problem. Elements of `items` that are not mappings are counted, not kept
//! ([`Chunk::NotObjects`]).

use std::collections::HashMap;

use serde_yaml_ng::{Mapping, Value};

use super::bounds::{Budget, YamlError, YamlLimits};
use super::events::{Event, Style};
use super::scalar::{local_tag, resolve_scalar};

/// One unit of a YAML stream, in input order.
#[derive(Clone, Debug, PartialEq)]
pub enum Chunk {
    /// A whole document whose root is not a mapping with an `items` sequence.
    Document(Value),
    /// One element of the `items` sequence of a document's root mapping (the document is
    /// probably a `List`; [`Chunk::ListHeader`] follows at the document's end and tells).
    /// Always a mapping: other elements are counted in [`Chunk::NotObjects`].
    ListItem(Value),
    /// The start of the `items` sequence of a document's root mapping: the entries of the root
    /// mapping written before it (a List's `kind` and `apiVersion`, when they come first).
    ListStart(Value),
    /// The end of a document whose root mapping had an `items` sequence: the root mapping
    /// without `items` (apiVersion, kind, metadata, ...).
    ListHeader(Value),
    /// The elements of one `items` sequence that are not mappings (scalars, sequences, aliases
    /// of either), delivered once at the end of the sequence: how many, and the first of them
    /// (no more is kept, whatever the count).
    NotObjects {
        /// How many elements are not mappings.
        count: usize,
        /// The first of them (`Null` when it was not built: an element past a budget).
        first: Value,
        /// 1-based line of the first.
        line: usize,
    },
    /// An object that broke a per-object limit or rule; `partial` holds what was built before
    /// the problem (for naming the object and the CIDRs it mentions).
    Invalid {
        /// The part of the object built before the problem.
        partial: Value,
        /// 1-based line where the problem was found.
        line: usize,
        /// What is wrong.
        reason: String,
        /// Whether the object was an element of a root mapping's `items`.
        in_list: bool,
    },
}

/// A value kept for its aliases, with the nodes it was charged (an upper bound of its node
/// count, aliases inside it counted expanded), so that an alias is charged before it is cloned.
struct Anchor {
    value: Value,
    nodes: usize,
}

/// An open collection. `anchor` is the parser's anchor id (0: none); `charged` is the object's
/// node count when the collection opened.
enum Node {
    Seq {
        items: Vec<Value>,
        anchor: usize,
        tag: Option<String>,
        streaming: bool,
        charged: usize,
    },
    Map {
        map: Mapping,
        key: Option<Value>,
        anchor: usize,
        tag: Option<String>,
        charged: usize,
        /// The key just read is the merge key `<<` (plain, untagged): its value is merged.
        merging: bool,
        /// Whether a merge key was seen (a second one is a duplicate key).
        merged_once: bool,
        /// Mappings to merge at the end, earlier first.
        merges: Vec<Mapping>,
    },
}

/// The non-mapping elements of the `items` sequence being streamed.
#[derive(Default)]
struct Strays {
    count: usize,
    first: Option<(Value, usize)>,
}

pub(super) struct Loader {
    limits: YamlLimits,
    stack: Vec<Node>,
    anchors: HashMap<usize, Anchor>,
    budget: Budget,
    /// The root mapping's budget while its `items` elements are built.
    outer: Option<Budget>,
    /// Whether the document's root mapping has an `items` sequence (streamed).
    streamed_items: bool,
    strays: Strays,
    /// Nodes cloned for aliases so far in this input, and the most allowed: the input's length
    /// in bytes, at least one object's node budget (work stays linear in the input whatever
    /// the anchors, as go-yaml bounds aliases by a ratio of the nodes decoded).
    alias_nodes: usize,
    max_alias_nodes: usize,
    /// A problem that ends the input, found while completing a value.
    fatal: Option<YamlError>,
    line: usize,
}

impl Loader {
    /// A loader for an input of `input_len` bytes.
    pub(super) fn new(limits: YamlLimits, input_len: usize) -> Loader {
        Loader {
            limits,
            stack: Vec::new(),
            anchors: HashMap::new(),
            budget: Budget::default(),
            outer: None,
            streamed_items: false,
            strays: Strays::default(),
            alias_nodes: 0,
            max_alias_nodes: input_len.max(limits.max_object_nodes),
            fatal: None,
            line: 1,
        }
    }

    /// True while the value being built is an element of the root's streamed `items`
    /// sequence, or is about to be one (stack: root map, items seq, ...).
    fn in_item(&self) -> bool {
        self.stack.len() >= 2 && matches!(self.stack[1], Node::Seq { streaming: true, .. })
    }

    /// The stack depth at which a completed value is an object of its own: 2 inside a
    /// streamed `items` (the element completes onto the items sequence), else 0 (the root).
    fn object_depth(&self) -> usize {
        if self.in_item() {
            2
        } else {
            0
        }
    }

    /// Whether the next value is an element of a streamed `items` sequence.
    fn at_item(&self) -> bool {
        self.in_item() && self.stack.len() == 2
    }

    fn fail(&mut self, reason: String) {
        if self.budget.problem.is_none() {
            self.budget.problem = Some((self.line, reason));
            self.budget.open_frames = self.stack.len();
        }
    }

    /// Count `n` more nodes of the current object; false when the object already has a
    /// problem or this breaks its budget (it is then marked invalid).
    fn admit(&mut self, n: usize) -> bool {
        if self.budget.problem.is_some() {
            return false;
        }
        self.budget.nodes = self.budget.nodes.saturating_add(n);
        if self.budget.nodes > self.limits.max_object_nodes {
            let max = self.limits.max_object_nodes;
            self.fail(format!("object has more than {max} YAML nodes"));
            return false;
        }
        true
    }

    /// A new object starts if the next value is one.
    fn maybe_start_object(&mut self) {
        if self.stack.len() == self.object_depth() {
            self.budget = Budget::default();
        }
    }

    /// One element of `items` that is not a mapping: counted, the first kept.
    fn stray(&mut self, first: impl FnOnce() -> Value) {
        if self.strays.first.is_none() {
            self.strays.first = Some((first(), self.line));
        }
        self.strays.count += 1;
    }

    /// Handle one event. Returns `Ok(true)` at the end of the stream or when `sink` asks to
    /// stop.
    pub(super) fn event(&mut self, (ev, line): (Event, usize), sink: &mut dyn FnMut(Chunk) -> bool) -> Result<bool, YamlError> {
        self.line = line;
        let mut more = true;
        match ev {
            Event::StreamEnd => return Ok(true),
            Event::DocumentStart => {
                self.anchors.clear();
                self.streamed_items = false;
                self.outer = None;
                self.budget = Budget::default();
            }
            Event::DocumentEnd | Event::Nothing => {}
            Event::Alias { id, name } => more = self.alias(id, &name, line, sink)?,
            Event::Scalar { anchor, tag, value, style } => {
                if self.at_item() && anchor == 0 {
                    // Not an object: counted, resolved only if it is the first.
                    self.stray(|| resolve_scalar(value, tag.as_deref(), style).unwrap_or(Value::Null));
                    return Ok(false);
                }
                self.maybe_start_object();
                let merge_key = style == Style::Plain && tag.is_none() && value == "<<";
                let keep = self.admit(1);
                let v = match resolve_scalar(value, tag.as_deref(), style) {
                    Ok(v) => Some(v),
                    Err(reason) => {
                        self.fail(reason);
                        None
                    }
                };
                if merge_key {
                    if let Some(Node::Map { key: None, merging, .. }) = self.stack.last_mut() {
                        *merging = true;
                    }
                }
                more = self.complete(v.filter(|_| keep), anchor, 1, false, sink);
            }
            Event::SequenceStart { anchor, tag } => {
                self.open(line)?;
                // The root mapping's `items` sequence is streamed: its elements are objects.
                let streaming = self.stack.len() == 1 && matches!(&self.stack[0], Node::Map { key: Some(Value::String(k)), .. } if k == "items");
                if streaming {
                    self.streamed_items = true;
                    self.strays = Strays::default();
                    self.outer = Some(std::mem::take(&mut self.budget));
                    if let Node::Map { map, .. } = &self.stack[0] {
                        more = sink(Chunk::ListStart(Value::Mapping(map.clone())));
                    }
                } else {
                    self.admit(1);
                }
                let charged = self.budget.nodes.saturating_sub(1);
                self.stack.push(Node::Seq { items: Vec::new(), anchor, tag, streaming, charged });
            }
            Event::MappingStart { anchor, tag } => {
                self.open(line)?;
                self.admit(1);
                let charged = self.budget.nodes.saturating_sub(1);
                self.stack.push(Node::Map { map: Mapping::new(), key: None, anchor, tag, charged, merging: false, merged_once: false, merges: Vec::new() });
            }
            Event::SequenceEnd => {
                let Some(Node::Seq { items, anchor, tag, streaming, charged }) = self.stack.pop() else {
                    return Err(YamlError { line: Some(line), message: "unbalanced sequence".into() });
                };
                if streaming {
                    // The elements went out as ListItems; the root keeps an empty marker that
                    // is removed before its header is delivered.
                    self.budget = self.outer.take().unwrap_or_default();
                    let strays = std::mem::take(&mut self.strays);
                    if let Some((first, first_line)) = strays.first {
                        more = sink(Chunk::NotObjects { count: strays.count, first, line: first_line });
                    }
                    self.attach(Value::Sequence(Vec::new()), anchor, 1, true);
                } else {
                    let nodes = self.budget.nodes.saturating_sub(charged);
                    more = self.complete(Some(wrap(Value::Sequence(items), tag.as_deref())), anchor, nodes, true, sink);
                }
            }
            Event::MappingEnd => {
                let Some(Node::Map { mut map, anchor, tag, charged, merges, .. }) = self.stack.pop() else {
                    return Err(YamlError { line: Some(line), message: "unbalanced mapping".into() });
                };
                // go-yaml v3 `decoder.merge`: keys written in the mapping win over merged ones;
                // of the merged mappings, the earlier wins.
                for merged in merges {
                    for (k, v) in merged {
                        if !map.contains_key(&k) {
                            map.insert(k, v);
                        }
                    }
                }
                let nodes = self.budget.nodes.saturating_sub(charged);
                more = self.complete(Some(wrap(Value::Mapping(map), tag.as_deref())), anchor, nodes, true, sink);
            }
        }
        match self.fatal.take() {
            Some(e) => Err(e),
            None => Ok(!more),
        }
    }

    /// An alias: charged its anchor's node count (to the object and to the input's alias
    /// budget) before it is cloned; an element of `items` that is not a mapping is only
    /// counted.
    fn alias(&mut self, id: usize, name: &str, line: usize, sink: &mut dyn FnMut(Chunk) -> bool) -> Result<bool, YamlError> {
        let Some(anchor) = self.anchors.get(&id) else {
            return Err(YamlError { line: Some(line), message: format!("unknown alias {name}") });
        };
        let nodes = anchor.nodes;
        if self.at_item() && !anchor.value.is_mapping() {
            // Not an object: counted; only a scalar is worth keeping as the first.
            let first = if nodes == 1 { anchor.value.clone() } else { Value::Null };
            self.stray(|| first);
            return Ok(true);
        }
        self.maybe_start_object();
        let mut keep = self.admit(nodes);
        if keep && self.alias_nodes.saturating_add(nodes) > self.max_alias_nodes {
            let max = self.max_alias_nodes;
            self.fail(format!("aliases expand to more than {max} YAML nodes in this input"));
            keep = false;
        }
        let v = if keep {
            self.alias_nodes += nodes;
            self.anchors.get(&id).map(|a| a.value.clone())
        } else {
            None
        };
        Ok(self.complete(v, 0, nodes, false, sink))
    }

    /// A sequence or mapping opens: a new object when at object depth; depth checked.
    fn open(&mut self, line: usize) -> Result<(), YamlError> {
        self.maybe_start_object();
        if self.stack.len() >= self.limits.max_depth {
            return Err(YamlError { line: Some(line), message: format!("nesting deeper than {} levels", self.limits.max_depth) });
        }
        Ok(())
    }

    /// A value of `nodes` nodes completed (`None`: dropped by a problem; `closing`: a sequence
    /// or mapping just closed): deliver it when it is an object, else attach it to its parent.
    /// Returns false when the sink asks to stop.
    fn complete(&mut self, v: Option<Value>, anchor: usize, nodes: usize, closing: bool, sink: &mut dyn FnMut(Chunk) -> bool) -> bool {
        if self.stack.len() != self.object_depth() {
            if let Some(v) = v {
                self.attach(v, anchor, nodes, closing);
            }
            return true;
        }
        let v = v.unwrap_or(Value::Null);
        let in_list = self.in_item();
        let problem = self.budget.problem.take();
        if in_list && problem.is_none() && !v.is_mapping() {
            if anchor != 0 {
                self.anchors.insert(anchor, Anchor { value: v.clone(), nodes });
            }
            self.stray(|| v);
            return true;
        }
        if anchor != 0 {
            self.anchors.insert(anchor, Anchor { value: v.clone(), nodes });
        }
        let chunk = match problem {
            Some((line, reason)) if !in_list && self.streamed_items => {
                // A List whose own header is broken (a duplicate `kind`, ...): nothing in
                // the document can be trusted.
                self.fatal = Some(YamlError { line: Some(line), message: reason });
                return true;
            }
            Some((line, reason)) => Chunk::Invalid { partial: v, line, reason, in_list },
            None if in_list => Chunk::ListItem(v),
            None if self.streamed_items => Chunk::ListHeader(strip_items(v)),
            None if v.is_null() => return true,
            None => Chunk::Document(v),
        };
        sink(chunk)
    }

    /// Attach a completed value to its parent node, unless the object stopped growing: then
    /// only a collection that was open at the time of the problem is still attached.
    fn attach(&mut self, v: Value, anchor: usize, nodes: usize, closing: bool) {
        if anchor != 0 {
            self.anchors.insert(anchor, Anchor { value: v.clone(), nodes });
        }
        if self.budget.problem.is_some() {
            // The closed frame sat at index `stack.len()`: it existed at the problem if that
            // index is below the frames open then.
            if closing && self.stack.len() < self.budget.open_frames {
                self.budget.open_frames = self.stack.len();
                match self.stack.last_mut() {
                    Some(Node::Map { map, key, merging, .. }) => {
                        if let Some(k) = key.take() {
                            if !std::mem::take(merging) {
                                map.insert(k, v);
                            }
                        }
                    }
                    Some(Node::Seq { items, streaming: false, .. }) => items.push(v),
                    _ => {}
                }
            }
            return;
        }
        let max_seq = self.limits.max_sequence_len;
        let mut problem = None;
        match self.stack.last_mut() {
            Some(Node::Seq { items, streaming: false, .. }) => {
                if items.len() < max_seq {
                    items.push(v);
                } else {
                    problem = Some(format!("a sequence has more than {max_seq} entries"));
                }
            }
            Some(Node::Seq { streaming: true, .. }) | None => {}
            Some(Node::Map { map, key, merging, merged_once, merges, .. }) => match key.take() {
                None => *key = Some(v),
                Some(_) if std::mem::take(merging) => {
                    if std::mem::replace(merged_once, true) {
                        problem = Some("duplicate mapping key \"<<\"".to_owned());
                    } else {
                        match merge_sources(v) {
                            Ok(ms) => merges.extend(ms),
                            Err(found) => problem = Some(format!("the merge key << needs a mapping or a sequence of mappings, found {found}")),
                        }
                    }
                }
                Some(k) => {
                    if map.contains_key(&k) {
                        problem = Some(format!("duplicate mapping key {}", key_text(&k)));
                    } else {
                        map.insert(k, v);
                    }
                }
            },
        }
        if let Some(p) = problem {
            self.fail(p);
        }
    }
}

/// The mappings a merge key's value merges, in order (go-yaml v3 `decoder.merge`: a mapping,
/// or a sequence of mappings); else what was found instead.
fn merge_sources(v: Value) -> Result<Vec<Mapping>, &'static str> {
    match v {
        Value::Mapping(m) => Ok(vec![m]),
        Value::Sequence(items) => items
            .into_iter()
            .map(|i| match i {
                Value::Mapping(m) => Ok(m),
                other => Err(kind_text(&other)),
            })
            .collect(),
        other => Err(kind_text(&other)),
    }
}

fn kind_text(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a sequence",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

/// Put a local `!tag` around a collection (core `!!seq`/`!!map` tags are no-ops).
fn wrap(v: Value, tag: Option<&str>) -> Value {
    match tag {
        Some(t) if t.starts_with('!') => local_tag(t, v),
        _ => v,
    }
}

/// The root mapping of a streamed `List` without its `items` marker.
fn strip_items(mut v: Value) -> Value {
    if let Value::Mapping(m) = &mut v {
        m.remove("items");
    }
    v
}

fn key_text(k: &Value) -> String {
    match k {
        Value::String(s) => format!("{s:?}"),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Null => "null".into(),
        _ => "(a collection)".into(),
    }
}
