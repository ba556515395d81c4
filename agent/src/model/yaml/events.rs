//! libyaml driven one event at a time: a [`Parser`] over a borrowed input (the only `unsafe`
//! code of the loader) and the owned [`Event`]s it yields, each with its 1-based line.

use std::mem::MaybeUninit;
use std::ptr::NonNull;

#[allow(clippy::unsafe_removed_from_name)] // the usual name of a C library binding; every call site is `unsafe` anyway
use unsafe_libyaml as sys;

use super::bounds::YamlError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Style {
    Plain,
    Quoted,
}

#[derive(Debug)]
pub(super) enum Event {
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
pub(super) struct Parser<'a> {
    sys: Box<MaybeUninit<sys::yaml_parser_t>>,
    _input: &'a [u8],
    initialized: bool,
    failed: Option<YamlError>,
}

impl<'a> Parser<'a> {
    pub(super) fn new(input: &'a [u8]) -> Parser<'a> {
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
    pub(super) fn next(&mut self) -> Result<(Event, usize), YamlError> {
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
