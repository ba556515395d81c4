//! Scalars, as serde_yaml_ng resolves them into a `Value` (YAML 1.2 core schema; serde_yaml_ng
//! `visit_untagged_scalar`, `visit_scalar`, and `visit_enum` for local `!tags`).

use serde_yaml_ng::value::{Tag, TaggedValue};
use serde_yaml_ng::{Number, Value};

use super::events::Style;

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
pub(super) fn resolve_scalar(value: String, tag: Option<&str>, style: Style) -> Result<Value, String> {
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
pub(super) fn local_tag(tag: &str, value: Value) -> Value {
    let name = tag.strip_prefix('!').filter(|r| !r.is_empty()).unwrap_or(tag);
    Value::Tagged(Box::new(TaggedValue { tag: Tag::new(name), value }))
}
