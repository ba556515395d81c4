//! Text from the datastore on its way to a terminal, a log line, `/readyz` or a BIRD
//! configuration: object names, field values and error messages are escaped, so a name with a
//! newline cannot add a line to `bird-filter`'s output (a live `accept`) and a terminal escape
//! cannot repaint `explain`'s table (docs/bad-input.md row 9). Names are validated at parse as well
//! (`model::is_dns1123_subdomain`); this is the second line of defence for every other string.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether `c` must not reach a terminal or a config file as is: C0 and C1 control
/// characters (newline and escape included), DEL, and the Unicode bidirectional overrides and
/// isolates that reorder what a reader sees.
fn is_unsafe(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}')
}

/// `s` with every unsafe character written as `\u{..}` (`\n` → `\u{a}`); borrowed when
/// there is nothing to escape.
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_unsafe) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if is_unsafe(c) {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// [`escape`]d and cut to at most 300 characters (with `...`): one line of a status page.
pub fn one_line(s: &str) -> String {
    let e = escape(s);
    if e.chars().count() <= 300 {
        return e.into_owned();
    }
    let mut out: String = e.chars().take(297).collect();
    out.push_str("...");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_controls_and_bidi_only() {
        assert_eq!(escape("node-a"), "node-a");
        assert!(matches!(escape("plain ascii: [x] {y} 10.0.0.0/8"), Cow::Borrowed(_)));
        assert_eq!(escape("a\nif (net ~ 0.0.0.0/0) then { accept; }"), "a\\u{a}if (net ~ 0.0.0.0/0) then { accept; }");
        assert_eq!(escape("\u{1b}[31mred"), "\\u{1b}[31mred");
        assert_eq!(escape("x\u{202e}y\r\t\u{7f}"), "x\\u{202e}y\\u{d}\\u{9}\\u{7f}");
        assert_eq!(escape("ünïcode ok"), "ünïcode ok");
        assert_eq!(one_line(&"x".repeat(400)).len(), 300);
    }
}

/// An error and its causes, `error: cause: cause …` down to the OS error, each printed once: a
/// cause whose text the line already holds (kube, hyper and aya errors often restate their
/// source in their own message) is left out, so one failure reads as one short line. Used for
/// the messages operators read: Kubernetes datastore errors and BPF load errors.
pub fn causes_once(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    append_causes(&mut out, e.source());
    out
}

/// Append `: <cause>` to `out` for `source` and every cause under it, leaving out a cause whose
/// text `out` already holds ([`causes_once`] from a line of the caller's own, such as a gRPC
/// status's message without tonic's verbose rendering of it).
pub fn append_causes(out: &mut String, mut source: Option<&(dyn std::error::Error + 'static)>) {
    while let Some(cause) = source {
        let text = cause.to_string();
        if !text.is_empty() && !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = cause.source();
    }
}

#[cfg(test)]
mod causes_tests {
    use super::causes_once;

    #[derive(Debug, thiserror::Error)]
    #[error("permission denied (os error 1)")]
    struct Os;

    #[derive(Debug, thiserror::Error)]
    #[error("the BPF_PROG_LOAD syscall returned {source}")]
    struct Syscall {
        source: Os,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("load route_watch_fentry")]
    struct Load {
        source: Syscall,
    }

    #[test]
    fn each_cause_once_down_to_the_os_error() {
        // The syscall error restates the OS error: it is printed once, the chain in full.
        let e = Load { source: Syscall { source: Os } };
        assert_eq!(causes_once(&e), "load route_watch_fentry: the BPF_PROG_LOAD syscall returned permission denied (os error 1)");
        assert_eq!(causes_once(&Os), "permission denied (os error 1)");
    }
}
