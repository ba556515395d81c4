//! A streaming, bounded YAML loader for the datastore files (issue 22, "bounded work").
//!
//! `serde_yaml_ng` loads every event of a document into memory before it builds a value
//! (about 110 bytes per node), expands aliases up to 100 times the document, and its libyaml
//! scanner spends time quadratic in the nesting depth of flow collections: a 10 MB
//! allocations array took 1 GB of RSS and 200 KB of nested `[` 28 s of CPU. This module drives
//! the same libyaml parser (`unsafe-libyaml`, the C library's Rust translation that
//! `serde_yaml_ng` itself uses) one event at a time and builds `serde_yaml_ng::Value`s one
//! *object* at a time — a document, or one element of a `List` document's `items` — so that
//! memory is bounded by the largest object, not by the file, and work is linear in the input:
//!
//! - nesting deeper than [`YamlLimits::max_depth`] stops the file at once (the parser never
//!   gets deeper than the limit plus libyaml's 1024-character simple-key look-ahead);
//! - a sequence longer than [`YamlLimits::max_sequence_len`], or an object of more than
//!   [`YamlLimits::max_object_nodes`] nodes (aliases count with their full expansion), stops
//!   growing and is reported as an invalid object with the part built so far (so its kind,
//!   name and CIDRs can still be named);
//! - a duplicate mapping key or an integer out of 64-bit range makes that object invalid.
//!
//! Scalars resolve exactly as `serde_yaml_ng` resolves them into a `Value` (YAML 1.2 core
//! schema: `null`/`~`/empty, `true`/`false` in three casings, decimal/`0x`/`0o`/`0b`
//! integers, floats with `.inf`/`.nan`; a leading zero makes a string), checked against it by
//! the tests below.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::ptr::NonNull;

use serde_yaml_ng::value::{Tag, TaggedValue};
use serde_yaml_ng::{Mapping, Number, Value};
#[allow(clippy::unsafe_removed_from_name)] // the usual name of a C library binding; every call site is `unsafe` anyway
use unsafe_libyaml as sys;

/// Limits of one load. The defaults fit every object Calico writes with a wide margin: the
/// largest IPAM block (`/20` or `/116`) has 4,096 allocations, and such a block with one
/// attribute per allocation is about 60,000 nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct YamlLimits {
    /// Deepest nesting of sequences and mappings (the document's root is depth 1).
    pub max_depth: usize,
    /// Longest sequence kept inside one object (a `List`'s `items` are objects of their own
    /// and are not limited).
    pub max_sequence_len: usize,
    /// Most nodes (scalars, sequences, mappings) in one object, alias expansions included.
    pub max_object_nodes: usize,
}

impl Default for YamlLimits {
    fn default() -> Self {
        YamlLimits { max_depth: 64, max_sequence_len: 65_536, max_object_nodes: 250_000 }
    }
}

/// A problem that stops the whole input: a YAML syntax error, nesting past the limit, an
/// unknown alias. `line` is 1-based.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct YamlError {
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// What is wrong (libyaml's problem and context, or the limit that was hit).
    pub message: String,
}

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

/// Parse `text` into [`Chunk`]s, calling `sink` for each as soon as it is complete. Empty
/// documents are skipped.
///
/// # Errors
/// A [`YamlError`] that stops the input (syntax, depth, unknown alias); chunks before it were
/// delivered.
pub fn for_each_chunk(text: &str, limits: &YamlLimits, sink: &mut dyn FnMut(Chunk)) -> Result<(), YamlError> {
    let mut parser = Parser::new(text.as_bytes());
    let mut loader = Loader::new(*limits);
    loop {
        let ev = parser.next()?;
        if loader.event(ev, sink)? {
            return Ok(());
        }
    }
}

/// Split a multi-document YAML string into values with `serde_yaml_ng`. Empty documents are
/// skipped. Unbounded (the whole text in memory at once): for trusted input such as test
/// fixtures; datastore files go through [`ParsedObjects::from_yaml_str`](super::ParsedObjects::from_yaml_str).
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

/// The number of nodes of `v` (itself included).
fn count_nodes(v: &Value) -> usize {
    match v {
        Value::Sequence(s) => 1 + s.iter().map(count_nodes).sum::<usize>(),
        Value::Mapping(m) => 1 + m.iter().map(|(k, v)| count_nodes(k) + count_nodes(v)).sum::<usize>(),
        Value::Tagged(t) => count_nodes(&t.value),
        _ => 1,
    }
}

// ---------------------------------------------------------------------------------------------
// libyaml events

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Style {
    Plain,
    Quoted,
}

#[derive(Debug)]
enum Event {
    StreamEnd,
    DocumentStart,
    DocumentEnd,
    Alias {
        anchor: String,
    },
    Scalar {
        anchor: Option<String>,
        tag: Option<String>,
        value: String,
        style: Style,
    },
    SequenceStart {
        anchor: Option<String>,
        tag: Option<String>,
    },
    SequenceEnd,
    MappingStart {
        anchor: Option<String>,
        tag: Option<String>,
    },
    MappingEnd,
    /// Stream start and anything else that carries no content.
    Nothing,
}

/// A libyaml parser over a borrowed input. The parser is boxed: libyaml keeps a pointer to
/// itself as its read handler's data, so it must not move.
struct Parser<'a> {
    sys: Box<MaybeUninit<sys::yaml_parser_t>>,
    _input: &'a [u8],
    initialized: bool,
    failed: Option<YamlError>,
}

impl<'a> Parser<'a> {
    fn new(input: &'a [u8]) -> Parser<'a> {
        let mut sys = Box::new(MaybeUninit::<sys::yaml_parser_t>::uninit());
        let p = sys.as_mut_ptr();
        // SAFETY: `p` points to memory for one parser, which yaml_parser_initialize
        // zeroes and initializes; the input outlives the parser (lifetime 'a), and the box
        // keeps the parser at one address for its whole life.
        let ok = unsafe {
            let ok = sys::yaml_parser_initialize(p).ok;
            if ok {
                sys::yaml_parser_set_encoding(p, sys::YAML_UTF8_ENCODING);
                sys::yaml_parser_set_input_string(p, input.as_ptr(), u64::try_from(input.len()).unwrap_or(u64::MAX));
            }
            ok
        };
        let failed = (!ok).then(|| YamlError { line: None, message: "the YAML parser could not allocate memory".into() });
        Parser { sys, _input: input, initialized: ok, failed }
    }

    /// The next event; an error ends the stream.
    fn next(&mut self) -> Result<(Event, usize), YamlError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let p = self.sys.as_mut_ptr();
        let mut raw = MaybeUninit::<sys::yaml_event_t>::uninit();
        let ev = raw.as_mut_ptr();
        // SAFETY: the parser was initialized in `new` (else `failed` is set); on success
        // `ev` is a fully written event that we read and then free exactly once.
        unsafe {
            if sys::yaml_parser_parse(p, ev).fail {
                let e = parse_error(p);
                self.failed = Some(e.clone());
                return Err(e);
            }
            let line = usize::try_from((*ev).start_mark.line).unwrap_or(usize::MAX).saturating_add(1);
            let out = convert(&*ev);
            sys::yaml_event_delete(ev);
            Ok((out, line))
        }
    }
}

impl Drop for Parser<'_> {
    fn drop(&mut self) {
        if self.initialized {
            // SAFETY: initialized in `new`; deleted once.
            unsafe { sys::yaml_parser_delete(self.sys.as_mut_ptr()) }
        }
    }
}

/// libyaml's error of a failed parse, as `problem at line L, context`.
///
/// # Safety
/// `p` must point to an initialized parser whose last call failed.
unsafe fn parse_error(p: *const sys::yaml_parser_t) -> YamlError {
    // SAFETY: the caller guarantees `p` is valid; the strings are libyaml's static messages.
    unsafe {
        let prefix = &**p;
        let problem = c_text(prefix.problem.cast()).unwrap_or_else(|| "the YAML parser failed".into());
        let context = c_text(prefix.context.cast());
        let line = usize::try_from(prefix.problem_mark.line).unwrap_or(usize::MAX).saturating_add(1);
        let message = match context {
            Some(c) => format!("{problem}, {c}"),
            None => problem,
        };
        YamlError { line: Some(line), message }
    }
}

/// A NUL-terminated C string as text (lossy), `None` for a null pointer.
///
/// # Safety
/// `s` is null or points to a NUL-terminated string.
unsafe fn c_text(s: *const u8) -> Option<String> {
    let ptr = NonNull::new(s.cast_mut())?;
    // SAFETY: guaranteed by the caller.
    let c = unsafe { std::ffi::CStr::from_ptr(ptr.as_ptr().cast()) };
    Some(c.to_string_lossy().into_owned())
}

/// Copy a libyaml event into an owned [`Event`].
///
/// # Safety
/// `e` is an event just returned by `yaml_parser_parse`.
unsafe fn convert(e: &sys::yaml_event_t) -> Event {
    // SAFETY: the union member read is the one `type_` selects; pointers are libyaml's own
    // NUL-terminated strings or (value, length) buffers, valid until the event is deleted.
    unsafe {
        match e.type_ {
            sys::YAML_STREAM_END_EVENT => Event::StreamEnd,
            sys::YAML_DOCUMENT_START_EVENT => Event::DocumentStart,
            sys::YAML_DOCUMENT_END_EVENT => Event::DocumentEnd,
            sys::YAML_ALIAS_EVENT => Event::Alias { anchor: c_text(e.data.alias.anchor).unwrap_or_default() },
            sys::YAML_SCALAR_EVENT => {
                let s = &e.data.scalar;
                let len = usize::try_from(s.length).unwrap_or(0);
                let bytes = if s.value.is_null() || len == 0 { &[][..] } else { std::slice::from_raw_parts(s.value, len) };
                Event::Scalar {
                    anchor: c_text(s.anchor),
                    tag: c_text(s.tag),
                    value: String::from_utf8_lossy(bytes).into_owned(),
                    style: if s.style == sys::YAML_PLAIN_SCALAR_STYLE { Style::Plain } else { Style::Quoted },
                }
            }
            sys::YAML_SEQUENCE_START_EVENT => Event::SequenceStart { anchor: c_text(e.data.sequence_start.anchor), tag: c_text(e.data.sequence_start.tag) },
            sys::YAML_SEQUENCE_END_EVENT => Event::SequenceEnd,
            sys::YAML_MAPPING_START_EVENT => Event::MappingStart { anchor: c_text(e.data.mapping_start.anchor), tag: c_text(e.data.mapping_start.tag) },
            sys::YAML_MAPPING_END_EVENT => Event::MappingEnd,
            _ => Event::Nothing,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Scalars, as serde_yaml_ng resolves them into a Value

const TAG_NULL: &str = "tag:yaml.org,2002:null";
const TAG_BOOL: &str = "tag:yaml.org,2002:bool";
const TAG_INT: &str = "tag:yaml.org,2002:int";
const TAG_FLOAT: &str = "tag:yaml.org,2002:float";

fn is_null(s: &str) -> bool {
    matches!(s, "null" | "Null" | "NULL" | "~")
}

fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "true" | "True" | "TRUE" => Some(true),
        "false" | "False" | "FALSE" => Some(false),
        _ => None,
    }
}

/// Leading zero(s) followed by digits is a string in YAML 1.2 (`007`, `-01`).
fn digits_but_not_number(s: &str) -> bool {
    let s = s.strip_prefix(['-', '+']).unwrap_or(s);
    s.len() > 1 && s.starts_with('0') && s[1..].bytes().all(|b| b.is_ascii_digit())
}

/// An integer in the forms serde_yaml_ng accepts: `[+]digits`, `-digits`, `0x`/`0o`/`0b`
/// with an optional sign. `Err(())` for an integer out of 64-bit range.
fn parse_int(s: &str) -> Option<Result<Number, ()>> {
    let (neg, body) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if body.starts_with(['+', '-']) {
        return None;
    }
    let (radix, digits) = if let Some(r) = body.strip_prefix("0x") {
        (16, r)
    } else if let Some(r) = body.strip_prefix("0o") {
        (8, r)
    } else if let Some(r) = body.strip_prefix("0b") {
        (2, r)
    } else {
        if digits_but_not_number(s) {
            return None;
        }
        (10, body)
    };
    if digits.is_empty() || digits.starts_with(['+', '-']) || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    // serde_yaml_ng tries u64, i64, then u128 and i128, which a Value cannot hold (an error);
    // past 128 bits the scalar is a string.
    let magnitude = u128::from_str_radix(digits, radix).ok()?;
    Some(if neg {
        if magnitude > 1u128 << 127 {
            return None;
        }
        match i64::try_from(magnitude) {
            Ok(m) => Ok(Number::from(-m)),
            Err(_) if magnitude == 1u128 << 63 => Ok(Number::from(i64::MIN)),
            Err(_) => Err(()),
        }
    } else {
        u64::try_from(magnitude).map(Number::from).map_err(|_| ())
    })
}

fn parse_float(s: &str) -> Option<f64> {
    let unsigned = match s.strip_prefix('+') {
        Some(rest) if rest.starts_with(['+', '-']) => return None,
        Some(rest) => rest,
        None => s,
    };
    if matches!(unsigned, ".inf" | ".Inf" | ".INF") {
        return Some(f64::INFINITY);
    }
    if matches!(s, "-.inf" | "-.Inf" | "-.INF") {
        return Some(f64::NEG_INFINITY);
    }
    if matches!(s, ".nan" | ".NaN" | ".NAN") {
        return Some(f64::NAN);
    }
    unsigned.parse::<f64>().ok().filter(|f| f.is_finite())
}

/// A plain, untagged scalar (serde_yaml_ng `visit_untagged_scalar`).
fn resolve_plain(s: String) -> Result<Value, String> {
    if s.is_empty() || is_null(&s) {
        return Ok(Value::Null);
    }
    if let Some(b) = parse_bool(&s) {
        return Ok(Value::Bool(b));
    }
    match parse_int(&s) {
        Some(Ok(n)) => return Ok(Value::Number(n)),
        Some(Err(())) => return Err(format!("integer {s} is out of range")),
        None => {}
    }
    if !digits_but_not_number(&s) {
        if let Some(f) = parse_float(&s) {
            return Ok(Value::Number(Number::from(f)));
        }
    }
    Ok(Value::String(s))
}

/// A scalar with its tag and style (serde_yaml_ng `visit_scalar`, and `visit_enum` for local
/// `!tags`, which become `Value::Tagged`).
fn resolve_scalar(value: String, tag: Option<&str>, style: Style) -> Result<Value, String> {
    match tag {
        Some(TAG_BOOL) => parse_bool(&value).map(Value::Bool).ok_or_else(|| format!("{value:?} is not a boolean")),
        Some(TAG_INT) => match parse_int(&value) {
            Some(Ok(n)) => Ok(Value::Number(n)),
            _ => Err(format!("{value:?} is not an integer")),
        },
        Some(TAG_FLOAT) => parse_float(&value).map(|f| Value::Number(Number::from(f))).ok_or_else(|| format!("{value:?} is not a float")),
        Some(TAG_NULL) => {
            if is_null(&value) {
                Ok(Value::Null)
            } else {
                Err(format!("{value:?} is not null"))
            }
        }
        Some(t) if t.starts_with('!') => {
            let inner = if style == Style::Plain { resolve_plain(value)? } else { Value::String(value) };
            Ok(local_tag(t, inner))
        }
        None if style == Style::Plain => resolve_plain(value),
        Some(_) | None => Ok(Value::String(value)),
    }
}

/// `!name` around `value` (serde_yaml_ng: the tag without its leading `!`).
fn local_tag(tag: &str, value: Value) -> Value {
    let name = tag.strip_prefix('!').filter(|r| !r.is_empty()).unwrap_or(tag);
    Value::Tagged(Box::new(TaggedValue { tag: Tag::new(name), value }))
}

// ---------------------------------------------------------------------------------------------
// Building objects from events

enum Node {
    Seq { items: Vec<Value>, anchor: Option<String>, tag: Option<String>, streaming: bool },
    Map { map: Mapping, key: Option<Value>, anchor: Option<String>, tag: Option<String> },
}

/// Budget state of the object being built.
#[derive(Default)]
struct Budget {
    /// Nodes of the object so far.
    nodes: usize,
    /// The object's first problem (line, reason): it is still closed normally but stops
    /// growing, and is delivered as [`Chunk::Invalid`].
    problem: Option<(usize, String)>,
    /// With a problem: frames below this stack depth were open when it happened; only they
    /// are still attached to their parents as they close (so the partial keeps what was
    /// built before the problem, `metadata` and the `spec` fields before the bad one).
    open_frames: usize,
}

struct Loader {
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
    fn new(limits: YamlLimits) -> Loader {
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
    fn event(&mut self, (ev, line): (Event, usize), sink: &mut dyn FnMut(Chunk)) -> Result<bool, YamlError> {
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn chunks(text: &str, limits: &YamlLimits) -> Result<Vec<Chunk>, YamlError> {
        let mut out = Vec::new();
        for_each_chunk(text, limits, &mut |c| out.push(c))?;
        Ok(out)
    }

    fn docs(text: &str) -> Vec<Value> {
        chunks(text, &YamlLimits::default())
            .unwrap()
            .into_iter()
            .map(|c| match c {
                Chunk::Document(v) => v,
                other => panic!("not a document: {other:?}"),
            })
            .collect()
    }

    /// The oracle: serde_yaml_ng's own reading of the same documents.
    fn serde_docs(text: &str) -> Vec<Value> {
        crate::model::parse_yaml_documents(text).unwrap()
    }

    #[test]
    fn documents_match_serde_yaml_ng() {
        let text = "\
a: 1
b: [0x1f, 0o17, 0b101, -5, +7, 007, -01, 1.5, -.inf, .nan, 1e3, 1_000]
c: {t: true, f: False, n: ~, e: , s: 'quoted 1', d: \"x\\ty\"}
d: !!str 123
e: !custom {k: v}
f: !!int 42
g: |
  literal
  block
h: >-
  folded
  text
i: 18446744073709551615
j: -9223372036854775808
---
- plain
- &anchor {x: 1}
- *anchor
---
just a string
";
        let ours = docs(text);
        let theirs = serde_docs(text);
        assert_eq!(ours.len(), 3);
        // NaN != NaN: compare the debug text of both.
        assert_eq!(format!("{ours:?}"), format!("{theirs:?}"));
    }

    #[test]
    fn list_items_stream_and_the_header_follows() {
        let text = "apiVersion: v1\nitems:\n- {kind: IPPool, metadata: {name: a}}\n- {kind: IPPool, metadata: {name: b}}\nkind: List\n";
        let got = chunks(text, &YamlLimits::default()).unwrap();
        assert_eq!(got.len(), 3, "{got:?}");
        let Chunk::ListItem(a) = &got[0] else { panic!("{got:?}") };
        assert_eq!(a["metadata"]["name"], Value::String("a".into()));
        let Chunk::ListHeader(h) = &got[2] else { panic!("{got:?}") };
        assert_eq!(h["kind"], Value::String("List".into()));
        assert!(h.get("items").is_none());
    }

    #[test]
    fn depth_limit_stops_the_file_quickly() {
        let deep = "[".repeat(200_000);
        let started = std::time::Instant::now();
        let err = chunks(&deep, &YamlLimits::default()).unwrap_err();
        assert_eq!(err.message, "nesting deeper than 64 levels");
        assert_eq!(err.line, Some(1));
        assert!(started.elapsed() < std::time::Duration::from_secs(2), "{:?}", started.elapsed());
    }

    #[test]
    fn long_sequences_and_big_objects_become_invalid_objects_with_their_start() {
        let limits = YamlLimits { max_sequence_len: 4, max_object_nodes: 1_000, ..YamlLimits::default() };
        let text =
            "items:\n- kind: IPAMBlock\n  metadata: {name: x}\n  spec: {cidr: 10.0.0.0/30, allocations: [0, 1, 2, 3, 4, 5]}\n- kind: IPPool\nkind: List\n";
        let got = chunks(text, &limits).unwrap();
        let Chunk::Invalid { partial, line, reason, in_list } = &got[0] else { panic!("{got:?}") };
        assert_eq!(reason, "a sequence has more than 4 entries");
        assert_eq!((*line, *in_list), (4, true));
        assert_eq!(partial["metadata"]["name"], Value::String("x".into()));
        assert_eq!(partial["spec"]["cidr"], Value::String("10.0.0.0/30".into()));
        assert!(matches!(&got[1], Chunk::ListItem(_)), "the next item is unaffected: {got:?}");
        // Aliases count with their expansion.
        let bomb = "a: &a [1, 1, 1, 1]\nb: &b [*a, *a, *a, *a]\nc: &c [*b, *b, *b, *b]\nd: [*c, *c, *c, *c]\n";
        let limits = YamlLimits { max_object_nodes: 100, ..YamlLimits::default() };
        let got = chunks(bomb, &limits).unwrap();
        let Chunk::Invalid { reason, .. } = &got[0] else { panic!("{got:?}") };
        assert_eq!(reason, "object has more than 100 YAML nodes");
    }

    #[test]
    fn duplicate_keys_and_huge_integers_make_the_object_invalid() {
        let got = chunks("a: 1\na: 2\n", &YamlLimits::default()).unwrap();
        assert!(matches!(&got[0], Chunk::Invalid { reason, .. } if reason == "duplicate mapping key \"a\""), "{got:?}");
        let got = chunks("a: 99999999999999999999999\n", &YamlLimits::default()).unwrap();
        assert!(matches!(&got[0], Chunk::Invalid { reason, .. } if reason == "integer 99999999999999999999999 is out of range"), "{got:?}");
    }

    #[test]
    fn syntax_errors_carry_the_line() {
        let err = chunks("a: 1\nb: [\n", &YamlLimits::default()).unwrap_err();
        assert_eq!(err.line, Some(3), "{err:?}");
        let err = chunks("a: *nope\n", &YamlLimits::default()).unwrap_err();
        assert_eq!(err.message, "unknown alias *nope");
    }

    #[test]
    fn empty_and_comment_only_inputs_have_no_chunks() {
        for text in ["", "   \n\n", "# only a comment\n", "---\n...\n"] {
            assert_eq!(chunks(text, &YamlLimits::default()).unwrap(), Vec::new(), "{text:?}");
        }
    }

    proptest! {
        /// Any plain scalar resolves as serde_yaml_ng resolves it.
        #[test]
        fn plain_scalars_resolve_as_serde_yaml_ng(s in "[-+0-9a-fxobA-FXOB._eEinfatrulsNTRUEFLS~]{1,12}") {
            let text = format!("k: {s}\n");
            let theirs = serde_yaml_ng::from_str::<Value>(&text);
            let ours = chunks(&text, &YamlLimits::default());
            match (theirs, ours) {
                (Ok(t), Ok(o)) => {
                    let Some(Chunk::Document(o)) = o.into_iter().next() else { panic!("no document for {s:?}") };
                    prop_assert_eq!(format!("{:?}", o), format!("{:?}", t), "{:?}", s);
                }
                (Err(_), Err(_)) => {}
                (Err(_), Ok(o)) => prop_assert!(matches!(o.first(), Some(Chunk::Invalid { .. })), "{:?}: serde_yaml_ng fails, we accept {:?}", s, o),
                (Ok(t), Err(e)) => prop_assert!(false, "{:?}: serde_yaml_ng reads {:?}, we fail: {}", s, t, e),
            }
        }
    }
}
