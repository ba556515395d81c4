//! Field access on one YAML object with error collection: every problem names the object's
//! kind, name and the field path, and parsing carries on so that one object reports all of its
//! bad fields at once.

use std::net::IpAddr;

use ipnet::IpNet;
use serde_yaml_ng::Value;

use super::error::{FieldProblem, ModelError};
use super::kind::Kind;

/// One object being parsed: its kind, name, root value and the errors found so far.
pub(crate) struct Fields<'a> {
    pub(crate) kind: Kind,
    pub(crate) name: &'a str,
    root: &'a Value,
    pub(crate) errors: Vec<ModelError>,
}

/// Longest name or value an error message repeats, characters.
pub(crate) const MAX_TEXT: usize = 200;

/// `s` cut to [`MAX_TEXT`] characters (with `...`).
pub(crate) fn bounded(s: &str) -> String {
    if s.chars().count() <= MAX_TEXT {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(MAX_TEXT).collect();
    out.push_str("...");
    out
}

impl FieldProblem {
    /// The problem with every value it repeats cut to [`MAX_TEXT`] characters.
    fn bounded(self) -> FieldProblem {
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

/// Render a field path: `spec.cidr`, `metadata.annotations[projectcalico.org/IPv4Address]`.
pub(crate) fn path_label(path: &[&str]) -> String {
    let mut out = String::new();
    for (i, part) in path.iter().enumerate() {
        if part.contains('.') || part.contains('/') {
            out.push('[');
            out.push_str(part);
            out.push(']');
        } else {
            if i > 0 {
                out.push('.');
            }
            out.push_str(part);
        }
    }
    out
}

/// Name of a YAML value's type, for "expected X, found Y" messages.
pub(crate) fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Sequence(_) => "list",
        Value::Mapping(_) => "mapping",
        Value::Tagged(_) => "tagged value",
    }
}

impl<'a> Fields<'a> {
    pub(crate) fn new(kind: Kind, name: &'a str, root: &'a Value) -> Self {
        Fields { kind, name, root, errors: Vec::new() }
    }

    /// Record a problem with `field` (a rendered path). Names and values are cut to
    /// [`MAX_TEXT`] characters in the error: a 16 MiB name stays a short message.
    pub(crate) fn fail(&mut self, field: impl Into<String>, problem: FieldProblem) {
        self.errors.push(ModelError::Field { kind: self.kind, name: bounded(self.name), field: field.into(), problem: problem.bounded() });
    }

    /// The value at `path`; `None` when absent or null. A non-mapping on the way is an error.
    pub(crate) fn get(&mut self, path: &[&str]) -> Option<&'a Value> {
        get_in(self.root, path).unwrap_or_else(|(depth, found)| {
            let field = path_label(&path[..=depth]);
            self.fail(field, FieldProblem::WrongType { expected: "mapping", found });
            None
        })
    }

    pub(crate) fn string(&mut self, path: &[&str]) -> Option<&'a str> {
        match self.get(path)? {
            Value::String(s) => Some(s.as_str()),
            other => {
                let found = type_name(other);
                self.fail(path_label(path), FieldProblem::WrongType { expected: "string", found });
                None
            }
        }
    }

    /// A required non-empty string.
    pub(crate) fn required_string(&mut self, path: &[&str]) -> Option<&'a str> {
        let present = self.get(path).is_some();
        match self.string(path) {
            Some(s) if !s.is_empty() => Some(s),
            Some(_) => {
                self.fail(path_label(path), FieldProblem::Empty);
                None
            }
            None => {
                if !present {
                    self.fail(path_label(path), FieldProblem::Missing);
                }
                None
            }
        }
    }

    /// A boolean; `"true"`/`"false"` strings are accepted too (the v1 BlockAffinity CRD stores
    /// `deleted` as a string). Absent is `None`.
    pub(crate) fn bool_lenient(&mut self, path: &[&str]) -> Option<bool> {
        match self.get(path)? {
            Value::Bool(b) => Some(*b),
            Value::String(s) if s.eq_ignore_ascii_case("true") => Some(true),
            Value::String(s) if s.eq_ignore_ascii_case("false") || s.is_empty() => Some(false),
            Value::String(s) => {
                let value = s.clone();
                self.fail(path_label(path), FieldProblem::InvalidValue { value, expected: "true or false" });
                None
            }
            other => {
                let found = type_name(other);
                self.fail(path_label(path), FieldProblem::WrongType { expected: "bool", found });
                None
            }
        }
    }

    /// An unsigned integer within `min..=max`.
    pub(crate) fn uint(&mut self, path: &[&str], min: u64, max: u64) -> Option<u64> {
        let v = self.get(path)?;
        let Some(n) = v.as_u64() else {
            let found = type_name(v);
            let problem = if let Value::Number(n) = v {
                FieldProblem::OutOfRange { value: n.to_string(), min, max }
            } else {
                FieldProblem::WrongType { expected: "unsigned integer", found }
            };
            self.fail(path_label(path), problem);
            return None;
        };
        if n < min || n > max {
            self.fail(path_label(path), FieldProblem::OutOfRange { value: n.to_string(), min, max });
            return None;
        }
        Some(n)
    }

    /// A CIDR (`10.244.0.0/16`). Host bits are kept as written (a node's BGP address carries
    /// its subnet: `10.0.0.11/24`).
    pub(crate) fn cidr(&mut self, path: &[&str]) -> Option<IpNet> {
        let s = self.string(path)?;
        let parsed = s.parse::<IpNet>().ok();
        if parsed.is_none() {
            self.fail(path_label(path), FieldProblem::InvalidCidr(s.to_owned()));
        }
        parsed
    }

    /// An IP address; a CIDR is accepted and its address part taken (Calico stores some tunnel
    /// addresses either way).
    pub(crate) fn ip(&mut self, path: &[&str]) -> Option<IpAddr> {
        let s = self.string(path)?;
        let parsed = parse_ip_or_cidr(s).map(|(ip, _)| ip);
        if parsed.is_none() {
            self.fail(path_label(path), FieldProblem::InvalidIp(s.to_owned()));
        }
        parsed
    }

    /// A sequence; absent is an empty slice.
    pub(crate) fn seq(&mut self, path: &[&str]) -> &'a [Value] {
        match self.get(path) {
            None => &[],
            Some(Value::Sequence(items)) => items.as_slice(),
            Some(other) => {
                let found = type_name(other);
                self.fail(path_label(path), FieldProblem::WrongType { expected: "list", found });
                &[]
            }
        }
    }

    /// The recorded errors, moved out.
    pub(crate) fn take_errors(&mut self) -> Vec<ModelError> {
        std::mem::take(&mut self.errors)
    }

    /// `Ok(value)` when no problem was recorded, else the recorded errors (moved out).
    pub(crate) fn take_result<T>(&mut self, value: T) -> Result<T, Vec<ModelError>> {
        if self.errors.is_empty() {
            Ok(value)
        } else {
            Err(std::mem::take(&mut self.errors))
        }
    }
}

/// Walk `path` through nested mappings. `Ok(None)` when a key is absent or the value is null;
/// `Err((depth, type))` when the value at `path[depth]`'s parent is not a mapping.
pub(crate) fn get_in<'a>(root: &'a Value, path: &[&str]) -> Result<Option<&'a Value>, (usize, &'static str)> {
    let mut cur = root;
    for (depth, key) in path.iter().enumerate() {
        match cur {
            Value::Mapping(m) => match m.get(*key) {
                Some(Value::Null) | None => return Ok(None),
                Some(v) => cur = v,
            },
            Value::Null => return Ok(None),
            other => return Err((depth.saturating_sub(1), type_name(other))),
        }
    }
    Ok(Some(cur))
}

/// Parse `10.0.0.11` or `10.0.0.11/24` into the address and, for the CIDR form, the network.
pub(crate) fn parse_ip_or_cidr(s: &str) -> Option<(IpAddr, Option<IpNet>)> {
    if s.contains('/') {
        s.parse::<IpNet>().ok().map(|n| (n.addr(), Some(n)))
    } else {
        s.parse::<IpAddr>().ok().map(|ip| (ip, None))
    }
}
