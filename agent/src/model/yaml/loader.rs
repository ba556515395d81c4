//! Building values from events one *object* at a time (a document, or one element of a
//! `List` document's `items`) and delivering each as a [`Chunk`] as soon as it is complete,
//! within the per-object budget: a sequence past its length limit, an object past its node
//! budget, a duplicate key or an out-of-range integer makes that object [`Chunk::Invalid`]
//! with the part built before the problem.

use std::collections::HashMap;

use serde_yaml_ng::{Mapping, Value};

use super::bounds::{count_nodes, Budget, YamlError, YamlLimits};
use super::events::Event;
use super::scalar::{local_tag, resolve_scalar};

/// One unit of a YAML stream, in input order.
#[derive(Clone, Debug, PartialEq)]
pub enum Chunk {
    /// A whole document whose root is not a mapping with an `items` sequence.
    Document(Value),
    /// One element of the `items` sequence of a document's root mapping (the document is
    /// probably a `List`; [`Chunk::ListHeader`] follows at the document's end and tells).
    ListItem(Value),
    /// The end of a document whose root mapping had an `items` sequence: the root mapping
    /// without `items` (apiVersion, kind, metadata, ...).
    ListHeader(Value),
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

enum Node {
    Seq { items: Vec<Value>, anchor: Option<String>, tag: Option<String>, streaming: bool },
    Map { map: Mapping, key: Option<Value>, anchor: Option<String>, tag: Option<String> },
}

pub(super) struct Loader {
    limits: YamlLimits,
    stack: Vec<Node>,
    anchors: HashMap<String, Value>,
    budget: Budget,
    /// The root mapping's budget while its `items` elements are built.
    outer: Option<Budget>,
    /// Whether the document's root mapping has an `items` sequence (streamed).
    streamed_items: bool,
    /// A problem that ends the input, found while completing a value.
    fatal: Option<YamlError>,
    line: usize,
}

impl Loader {
    pub(super) fn new(limits: YamlLimits) -> Loader {
        Loader { limits, stack: Vec::new(), anchors: HashMap::new(), budget: Budget::default(), outer: None, streamed_items: false, fatal: None, line: 1 }
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

    /// Handle one event. Returns `Ok(true)` at the end of the stream.
    pub(super) fn event(&mut self, (ev, line): (Event, usize), sink: &mut dyn FnMut(Chunk)) -> Result<bool, YamlError> {
        self.line = line;
        match ev {
            Event::StreamEnd => return Ok(true),
            Event::DocumentStart => {
                self.anchors.clear();
                self.streamed_items = false;
                self.outer = None;
                self.budget = Budget::default();
            }
            Event::DocumentEnd | Event::Nothing => {}
            Event::Alias { anchor } => {
                self.maybe_start_object();
                let Some(v) = self.anchors.get(&anchor).cloned() else {
                    return Err(YamlError { line: Some(line), message: format!("unknown alias *{anchor}") });
                };
                let keep = self.admit(count_nodes(&v));
                self.complete(keep.then_some(v), None, false, sink);
            }
            Event::Scalar { anchor, tag, value, style } => {
                self.maybe_start_object();
                let keep = self.admit(1);
                let v = match resolve_scalar(value, tag.as_deref(), style) {
                    Ok(v) => Some(v),
                    Err(reason) => {
                        self.fail(reason);
                        None
                    }
                };
                self.complete(v.filter(|_| keep), anchor, false, sink);
            }
            Event::SequenceStart { anchor, tag } => {
                self.open(line)?;
                // The root mapping's `items` sequence is streamed: its elements are objects.
                let streaming = self.stack.len() == 1 && matches!(&self.stack[0], Node::Map { key: Some(Value::String(k)), .. } if k == "items");
                if streaming {
                    self.streamed_items = true;
                    self.outer = Some(std::mem::take(&mut self.budget));
                } else {
                    self.admit(1);
                }
                self.stack.push(Node::Seq { items: Vec::new(), anchor, tag, streaming });
            }
            Event::MappingStart { anchor, tag } => {
                self.open(line)?;
                self.admit(1);
                self.stack.push(Node::Map { map: Mapping::new(), key: None, anchor, tag });
            }
            Event::SequenceEnd => {
                let Some(Node::Seq { items, anchor, tag, streaming }) = self.stack.pop() else {
                    return Err(YamlError { line: Some(line), message: "unbalanced sequence".into() });
                };
                if streaming {
                    // The elements went out as ListItems; the root keeps an empty marker that
                    // is removed before its header is delivered.
                    self.budget = self.outer.take().unwrap_or_default();
                    self.attach(Value::Sequence(Vec::new()), anchor, true);
                } else {
                    self.complete(Some(wrap(Value::Sequence(items), tag.as_deref())), anchor, true, sink);
                }
            }
            Event::MappingEnd => {
                let Some(Node::Map { map, anchor, tag, .. }) = self.stack.pop() else {
                    return Err(YamlError { line: Some(line), message: "unbalanced mapping".into() });
                };
                self.complete(Some(wrap(Value::Mapping(map), tag.as_deref())), anchor, true, sink);
            }
        }
        match self.fatal.take() {
            Some(e) => Err(e),
            None => Ok(false),
        }
    }

    /// A sequence or mapping opens: a new object when at object depth; depth checked.
    fn open(&mut self, line: usize) -> Result<(), YamlError> {
        self.maybe_start_object();
        if self.stack.len() >= self.limits.max_depth {
            return Err(YamlError { line: Some(line), message: format!("nesting deeper than {} levels", self.limits.max_depth) });
        }
        Ok(())
    }

    /// A value completed (`None`: dropped by a problem; `closing`: a sequence or mapping just
    /// closed): deliver it when it is an object, else attach it to its parent.
    fn complete(&mut self, v: Option<Value>, anchor: Option<String>, closing: bool, sink: &mut dyn FnMut(Chunk)) {
        if self.stack.len() != self.object_depth() {
            if let Some(v) = v {
                self.attach(v, anchor, closing);
            }
            return;
        }
        let v = v.unwrap_or(Value::Null);
        if let Some(a) = anchor {
            self.anchors.insert(a, v.clone());
        }
        let in_list = self.in_item();
        let problem = self.budget.problem.take();
        let chunk = match problem {
            Some((line, reason)) if !in_list && self.streamed_items => {
                // A List whose own header is broken (a duplicate `kind`, ...): nothing in
                // the document can be trusted.
                self.fatal = Some(YamlError { line: Some(line), message: reason });
                return;
            }
            Some((line, reason)) => Chunk::Invalid { partial: v, line, reason, in_list },
            None if in_list => Chunk::ListItem(v),
            None if self.streamed_items => Chunk::ListHeader(strip_items(v)),
            None if v.is_null() => return,
            None => Chunk::Document(v),
        };
        sink(chunk);
    }

    /// Attach a completed value to its parent node, unless the object stopped growing: then
    /// only a collection that was open at the time of the problem is still attached.
    fn attach(&mut self, v: Value, anchor: Option<String>, closing: bool) {
        if let Some(a) = anchor {
            self.anchors.insert(a, v.clone());
        }
        if self.budget.problem.is_some() {
            // The closed frame sat at index `stack.len()`: it existed at the problem if that
            // index is below the frames open then.
            if closing && self.stack.len() < self.budget.open_frames {
                self.budget.open_frames = self.stack.len();
                match self.stack.last_mut() {
                    Some(Node::Map { map, key, .. }) => {
                        if let Some(k) = key.take() {
                            map.insert(k, v);
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
            Some(Node::Map { map, key, .. }) => match key.take() {
                None => *key = Some(v),
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
