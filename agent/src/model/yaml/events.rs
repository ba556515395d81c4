//! `saphyr-parser` driven one event at a time: a [`Parser`] over a borrowed input that yields
//! owned [`Event`]s, each with its 1-based line, and keeps the parser's look-ahead bounded.
//!
//! The look-ahead bound: saphyr-parser's scanner (as yaml-rust's, from which it descends) holds
//! back every token of a flow collection (`[...]`, `{...}`) that may still turn out to be a
//! simple key, and in a flow context it never gives that possibility up (libyaml and go-yaml
//! give it up after 1,024 characters or at a line break). A flow collection that starts a line
//! or a document (`- [1, 1, ...]`, a value on the line after its key, a JSON file) is therefore
//! tokenised whole before its first event, at about 120 bytes per token. The scanner reads its
//! input through [`Feed`], which weighs what has been read past the end of the last event
//! delivered (the characters that can start or separate tokens: see [`weight`]); past
//! [`MAX_LOOKAHEAD_WEIGHT`] the pending token is looked at in the text: comments before it, or
//! a quoted or block scalar (one token, however long), are let through; anything else (a flow
//! collection) stops the input. A document whose first node is a flow collection (a JSON file)
//! is read as `--- ` + the text ([`prepare`]), which makes that collection no simple key, so
//! its elements are held back one at a time, not the whole file.

use std::borrow::Cow;
use std::cell::Cell;
use std::rc::Rc;

use saphyr_parser::{BufferedInput, Event as SaphyrEvent, Parser as SaphyrParser, ScalarStyle, ScanError};

use super::bounds::YamlError;

/// Most look-ahead weight (see [`weight`]) the scanner may hold past the last event delivered.
/// A unit is at most about 2.5 tokens (`{a: 1, ...}`: key, scalar, value, scalar, entry for `:`
/// and `,`), so the scanner holds some tens of MB at most; a JSON object of 131,072 units is
/// about 1 MB of text (an IPAM block of 4,096 allocations, each with its attributes, weighs
/// about 106,000).
pub(super) const MAX_LOOKAHEAD_WEIGHT: u64 = 131_072;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Style {
    Plain,
    Quoted,
}

/// One parser event, owned. Anchors are saphyr-parser's ids: unique per anchor definition in
/// the stream (a redefined name gets a new id), 0 for none.
#[derive(Debug)]
pub(super) enum Event {
    StreamEnd,
    DocumentStart,
    DocumentEnd,
    Alias {
        id: usize,
        /// The alias as written (`*name`), for an error.
        name: String,
    },
    Scalar {
        anchor: usize,
        tag: Option<String>,
        value: String,
        style: Style,
    },
    SequenceStart {
        anchor: usize,
        tag: Option<String>,
    },
    SequenceEnd,
    MappingStart {
        anchor: usize,
        tag: Option<String>,
    },
    MappingEnd,
    /// Stream start and anything else that carries no content.
    Nothing,
}

/// What [`Feed`] and [`Parser`] share: where the last delivered event ends and how much the
/// scanner has read past it.
#[derive(Default)]
struct Gate {
    /// Byte offset where the last delivered event ends.
    delivered: Cell<usize>,
    /// Characters before this byte offset do not weigh (the inside of a long scalar let through).
    weigh_from: Cell<usize>,
    /// Weight read past `max(delivered, weigh_from)`, in half units (a quote weighs one half).
    half_units: Cell<u64>,
    /// Set when the input was cut short to bound the look-ahead: the byte offset of the token
    /// that could not be delivered.
    cut: Cell<Option<usize>>,
}

/// The scanner's input: the text's characters, weighed as they are read.
struct Feed<'a> {
    text: &'a str,
    pos: usize,
    gate: Rc<Gate>,
}

impl Iterator for Feed<'_> {
    type Item = char;

    fn next(&mut self) -> Option<char> {
        if self.gate.cut.get().is_some() {
            return None;
        }
        let c = self.text[self.pos..].chars().next()?;
        let at = self.pos;
        self.pos += c.len_utf8();
        if at >= self.gate.weigh_from.get() {
            let w = self.gate.half_units.get() + weight(c);
            self.gate.half_units.set(w);
            if w > 2 * MAX_LOOKAHEAD_WEIGHT && !self.let_through() {
                self.gate.cut.set(Some(pending_token(self.text, self.gate.delivered.get())));
                return None;
            }
        }
        Some(c)
    }
}

impl Feed<'_> {
    /// The look-ahead limit is reached: true when the scanner is still skipping spaces and
    /// comments before the pending token, or the pending token is a quoted or block scalar not
    /// yet let through; what was read up to there then weighs nothing.
    fn let_through(&self) -> bool {
        let start = pending_token(self.text, self.gate.delivered.get());
        let end = if start >= self.pos {
            start
        } else {
            match scalar_end(self.text, start) {
                Some(end) => end,
                None => return false,
            }
        };
        if self.gate.weigh_from.get() >= end {
            return false;
        }
        self.gate.weigh_from.set(end);
        let read = self.pos.max(end);
        self.gate.half_units.set(self.text[end..read].chars().map(weight).sum());
        true
    }
}

/// The look-ahead weight of one character, in half units: the characters that start or
/// separate tokens in a flow context weigh one unit (`, [ ] { } : ? * & !`), quotes half a unit
/// (a quoted scalar is one token for two quotes), everything else nothing (a plain scalar's
/// characters, spaces, line breaks).
fn weight(c: char) -> u64 {
    match c {
        ',' | '[' | ']' | '{' | '}' | ':' | '?' | '*' | '&' | '!' => 2,
        '"' | '\'' => 1,
        _ => 0,
    }
}

/// Byte offset of the first token after `from`: spaces, line breaks, comments, the indicators
/// `-`, `?`, `:`, `,` and document markers, anchors and tags skipped.
fn pending_token(text: &str, from: usize) -> usize {
    let b = text.as_bytes();
    let mut i = from;
    while i < b.len() {
        match b[i] {
            b' ' | b'\t' | b'\r' | b'\n' | b',' => i += 1,
            b'-' | b'?' | b':' if b.get(i + 1).is_none_or(|n| matches!(n, b' ' | b'\t' | b'\r' | b'\n')) => i += 1,
            b'-' | b'.' if b.get(i..i + 3).is_some_and(|m| m == b"---" || m == b"...") => i += 3,
            b'#' => i = text[i..].find('\n').map_or(b.len(), |n| i + n),
            b'&' | b'!' => i = text[i..].find([' ', '\t', '\r', '\n']).map_or(b.len(), |n| i + n),
            _ => return i,
        }
    }
    i
}

/// The end of the quoted or block scalar starting at `start` (an upper bound for a block
/// scalar: the next line indented no more than the line of its `|` or `>`), `None` for any
/// other token.
fn scalar_end(text: &str, start: usize) -> Option<usize> {
    let rest = &text[start..];
    match rest.as_bytes().first()? {
        b'\'' => {
            // '' is a quote inside single quotes.
            let mut i = 1;
            loop {
                let q = rest[i..].find('\'')? + i;
                if rest.as_bytes().get(q + 1) == Some(&b'\'') {
                    i = q + 2;
                } else {
                    return Some(start + q + 1);
                }
            }
        }
        b'"' => {
            let mut escaped = false;
            for (i, c) in rest.char_indices().skip(1) {
                match c {
                    '\\' if !escaped => escaped = true,
                    '"' if !escaped => return Some(start + i + 1),
                    _ => escaped = false,
                }
            }
            None
        }
        b'|' | b'>' => {
            let line_start = text[..start].rfind('\n').map_or(0, |n| n + 1);
            let indent = text[line_start..].bytes().take_while(|&c| c == b' ').count();
            let mut at = start + rest.find('\n')? + 1;
            while at < text.len() {
                let line = &text[at..];
                let end = line.find('\n').map_or(line.len(), |n| n + 1);
                let content = line[..end].trim_start_matches(' ');
                let blank = content.trim().is_empty();
                if !blank && line.len() - content.len() <= indent {
                    return Some(at);
                }
                at += end;
            }
            Some(text.len())
        }
        _ => None,
    }
}

/// The text as the parser reads it: `--- ` before a first node that is a flow collection (a
/// JSON document), so that it is no simple key; lines are unchanged.
pub(super) fn prepare(text: &str) -> Cow<'_, str> {
    match first_content(text) {
        Some(i) if matches!(text.as_bytes()[i], b'[' | b'{') => Cow::Owned(format!("{}--- {}", &text[..i], &text[i..])),
        _ => Cow::Borrowed(text),
    }
}

/// A saphyr-parser parser over a borrowed input (from [`prepare`]), one event at a time.
pub(super) struct Parser<'a> {
    sys: SaphyrParser<'a, BufferedInput<Feed<'a>>>,
    text: &'a str,
    gate: Rc<Gate>,
    /// Maps the parser's character indices to byte offsets, moving forward only.
    cursor: Cursor,
    max_depth: usize,
    failed: Option<YamlError>,
}

/// A character index to byte offset map that walks the text forward (restarting from the
/// start for an index behind it), taking the weight of what it passes off the gate.
#[derive(Default)]
struct Cursor {
    chars: usize,
    bytes: usize,
}

impl<'a> Parser<'a> {
    /// A parser over `text` (as [`prepare`] returns it); `max_depth` only words the error of
    /// the scanner's own nesting limit (255 flow levels).
    pub(super) fn new(text: &'a str, max_depth: usize) -> Parser<'a> {
        let gate = Rc::new(Gate::default());
        let feed = Feed { text, pos: 0, gate: Rc::clone(&gate) };
        let sys = SaphyrParser::new(BufferedInput::new(feed));
        Parser { sys, text, gate, cursor: Cursor::default(), max_depth, failed: None }
    }

    /// The next event and its 1-based line; an error ends the stream.
    pub(super) fn next(&mut self) -> Result<(Event, usize), YamlError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let next = self.sys.next_event();
        if let Some(at) = self.gate.cut.get() {
            return Err(self.fail(YamlError {
                line: Some(line_of(self.text, at)),
                message: format!(
                    "a flow collection too large to parse in bounded memory (more than {MAX_LOOKAHEAD_WEIGHT} of , [ ] {{ }} : ? * & ! or quote pairs before it can be delivered)"
                ),
            }));
        }
        let (ev, span) = match next {
            None => return Ok((Event::StreamEnd, 0)),
            Some(Err(e)) => {
                let e = self.scan_error(&e);
                return Err(self.fail(e));
            }
            Some(Ok(x)) => x,
        };
        let line = span.start.line();
        let start = self.byte_at(span.start.index());
        let end = self.byte_at(span.end.index());
        if end > self.gate.delivered.get() {
            let from = self.gate.delivered.get().max(self.gate.weigh_from.get());
            let passed: u64 = if end > from { self.text[from..end].chars().map(weight).sum() } else { 0 };
            self.gate.half_units.set(self.gate.half_units.get().saturating_sub(passed));
            self.gate.delivered.set(end);
        }
        let out = match ev {
            SaphyrEvent::StreamEnd => Event::StreamEnd,
            SaphyrEvent::DocumentStart(_) => Event::DocumentStart,
            SaphyrEvent::DocumentEnd => Event::DocumentEnd,
            SaphyrEvent::Alias(id) => Event::Alias { id, name: alias_text(&self.text[start..]) },
            SaphyrEvent::Scalar(value, style, anchor, tag) => Event::Scalar {
                anchor,
                tag: tag.map(|t| tag_text(&t)),
                value: value.into_owned(),
                style: if style == ScalarStyle::Plain { Style::Plain } else { Style::Quoted },
            },
            SaphyrEvent::SequenceStart(anchor, tag) => Event::SequenceStart { anchor, tag: tag.map(|t| tag_text(&t)) },
            SaphyrEvent::SequenceEnd => Event::SequenceEnd,
            SaphyrEvent::MappingStart(anchor, tag) => Event::MappingStart { anchor, tag: tag.map(|t| tag_text(&t)) },
            SaphyrEvent::MappingEnd => Event::MappingEnd,
            SaphyrEvent::StreamStart | SaphyrEvent::Nothing => Event::Nothing,
        };
        Ok((out, line))
    }

    fn fail(&mut self, e: YamlError) -> YamlError {
        self.failed = Some(e.clone());
        e
    }

    /// saphyr-parser's error as ours, with its 1-based line; its nesting limit and its unknown
    /// anchor worded as the loader words them.
    fn scan_error(&mut self, e: &ScanError) -> YamlError {
        let line = Some(e.marker().line());
        let message = match e.info() {
            "recursion limit exceeded" if self.max_depth < 255 => format!("nesting deeper than {} levels", self.max_depth),
            "recursion limit exceeded" => "nesting deeper than 255 flow levels".to_owned(),
            "while parsing node, found unknown anchor" => {
                let at = self.byte_at(e.marker().index());
                format!("unknown alias {}", alias_text(&self.text[at..]))
            }
            other => other.to_owned(),
        };
        YamlError { line, message }
    }

    /// The byte offset of character index `at` of the text, walked to from the last one asked
    /// for (events come in text order, so the walks add up to the text's length).
    fn byte_at(&mut self, at: usize) -> usize {
        let c = &mut self.cursor;
        if at >= c.chars {
            let rest = &self.text[c.bytes..];
            c.bytes += rest.char_indices().nth(at - c.chars).map_or(rest.len(), |(b, _)| b);
        } else {
            let before = &self.text[..c.bytes];
            c.bytes = before.char_indices().rev().nth(c.chars - at - 1).map_or(0, |(b, _)| b);
        }
        c.chars = at;
        c.bytes
    }
}

/// The alias (`*name`, at most 256 bytes of it) at the start of `rest`.
fn alias_text(rest: &str) -> String {
    let end = rest.find([' ', '\t', '\r', '\n', ',', ']', '}']).unwrap_or(rest.len());
    let mut cut = end.min(256);
    while !rest.is_char_boundary(cut) {
        cut -= 1;
    }
    rest[..cut].to_owned()
}

/// The byte offset of the first character that is not a space, line break or comment.
fn first_content(text: &str) -> Option<usize> {
    let mut i = 0;
    let b = text.as_bytes();
    while i < b.len() {
        match b[i] {
            b' ' | b'\t' | b'\r' | b'\n' => i += 1,
            b'#' => i = text[i..].find('\n').map_or(b.len(), |n| i + n),
            _ => return Some(i),
        }
    }
    None
}

fn line_of(text: &str, at: usize) -> usize {
    text[..at.min(text.len())].matches('\n').count() + 1
}

/// A tag as libyaml spells it: `tag:yaml.org,2002:str` for `!!str`, `!name` for a local tag.
fn tag_text(t: &saphyr_parser::Tag) -> String {
    if t.handle == "!" {
        format!("!{}", t.suffix)
    } else {
        format!("{}{}", t.handle, t.suffix)
    }
}
