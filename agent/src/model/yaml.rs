//! A streaming, bounded YAML loader for the datastore files, reading YAML as Kubernetes
//! reads it (kubectl through sigs.k8s.io/yaml over go-yaml).
//!
//! `serde_yaml_ng` loads every event of a document into memory before it builds a value
//! (about 110 bytes per node) and expands aliases up to 100 times the document. This module
//! drives a pure-Rust event parser (`saphyr-parser`, `events.rs`) one event at a time and
//! builds `serde_yaml_ng::Value`s one *object* at a time — a document, or one element of a
//! `List` document's `items` — so that memory is bounded by the largest object, not by the
//! file, and work is linear in the input:
//!
//! - nesting deeper than [`YamlLimits::max_depth`] stops the file at once (the parser's own
//!   limit of 255 flow levels stops deeper flow nesting before its first event);
//! - the parser's look-ahead is bounded (`events.rs`): a flow collection that the parser would
//!   have to hold whole, past about 1 MB of JSON, stops the file;
//! - a sequence longer than [`YamlLimits::max_sequence_len`], or an object of more than
//!   [`YamlLimits::max_object_nodes`] nodes, stops growing and is reported as an invalid object
//!   with the part built so far (so its kind, name and CIDRs can still be named). An alias is
//!   charged its anchor's node count (kept when the anchor completes) *before* it is cloned,
//!   and the aliases of one input may clone at most as many nodes as the input has bytes (at
//!   least one object's budget), as go-yaml refuses "excessive aliasing";
//! - a duplicate mapping key or an integer out of 64-bit range makes that object invalid;
//! - elements of a `List`'s `items` that are not mappings are counted, not kept
//!   ([`Chunk::NotObjects`]).
//!
//! Merge keys are honoured as go-yaml v3 does (`decode.go`, `decoder.merge`, the YAML merge-key
//! type): a plain `<<` key whose value is a mapping (usually an alias) or a sequence of mappings
//! merges their keys into the mapping; keys written in the mapping win wherever they appear, and
//! of a sequence the earlier mapping wins; any other value makes the object invalid ("map merge
//! requires map or sequence of maps as the value"). A key both written and merged is no
//! duplicate. (go-yaml v2, under sigs.k8s.io/yaml, applies a merge where it is written, so a
//! `<<` after a written key overrides it there.)
//!
//! Scalars resolve exactly as `serde_yaml_ng` resolves them into a `Value` (YAML 1.2 core
//! schema: `null`/`~`/empty, `true`/`false` in three casings, decimal/`0x`/`0o`/`0b`
//! integers, floats with `.inf`/`.nan`; a leading zero makes a string), checked against it by
//! the tests (`yaml/tests.rs`).
//!
//! The parts: `events.rs` drives the parser, `scalar.rs` resolves scalars, `loader.rs` builds
//! the objects and delivers [`Chunk`]s, `bounds.rs` holds the limits and the per-object budget.

mod bounds;
mod events;
mod loader;
mod scalar;

use serde_yaml_ng::Value;

pub use bounds::{YamlError, YamlLimits};
use events::Parser;
pub use loader::Chunk;
use loader::Loader;

/// Parse `text` into [`Chunk`]s, calling `sink` for each as soon as it is complete; `sink`
/// returns false to stop the parse there. Empty documents are skipped.
///
/// # Errors
/// A [`YamlError`] that stops the input (syntax, depth, unknown alias, the parser's
/// look-ahead bound); chunks before it were delivered.
pub fn for_each_chunk(text: &str, limits: &YamlLimits, sink: &mut dyn FnMut(Chunk) -> bool) -> Result<(), YamlError> {
    let prepared = events::prepare(text);
    let mut parser = Parser::new(&prepared, limits.max_depth);
    let mut loader = Loader::new(*limits, text.len());
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

#[cfg(test)]
mod tests;
