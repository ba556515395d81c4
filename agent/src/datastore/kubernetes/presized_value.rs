//! [`PresizedValue`]: decode any JSON value into a `serde_yaml_ng` [`Value`] whose sequences and
//! mappings are allocated once, at their final length.
//!
//! `Value`'s own `Deserialize` pushes each element into a growing `Vec` (and each entry into a
//! growing `Mapping`): JSON gives no length up front, so a 64-entry `allocations` array of an
//! IPAM block is reallocated and copied six times, and over a list of many blocks that growth
//! is a large part of decoding it (BENCHMARKS.md, "kube-100k and the plan pass").
//! Here the elements are gathered in a scratch buffer kept per thread and per nesting depth,
//! then moved into a collection of exactly their count.
//!
//! The value is the one `Value::deserialize` gives (same variants, numbers, key order), and
//! a mapping with a repeated key is refused with the same message
//! (`duplicate entry with key "k"`).

use std::cell::RefCell;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_yaml_ng::{Mapping, Value};

/// Seed for [`Value`] with collections sized exactly (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PresizedValue;

thread_local! {
    /// Scratch buffers for sequences, one per nesting depth in use (their capacity is kept).
    static SEQUENCES: RefCell<Vec<Vec<Value>>> = const { RefCell::new(Vec::new()) };
    /// Scratch buffers for mappings' entries, likewise.
    static ENTRIES: RefCell<Vec<Vec<(Value, Value)>>> = const { RefCell::new(Vec::new()) };
}

/// A scratch buffer from `pool` (empty, with whatever capacity it had).
fn take<T>(pool: &'static std::thread::LocalKey<RefCell<Vec<Vec<T>>>>) -> Vec<T> {
    pool.with(|p| p.borrow_mut().pop()).unwrap_or_default()
}

/// Give an emptied scratch buffer back to `pool`.
fn give<T>(pool: &'static std::thread::LocalKey<RefCell<Vec<Vec<T>>>>, buf: Vec<T>) {
    debug_assert!(buf.is_empty());
    pool.with(|p| p.borrow_mut().push(buf));
}

/// `duplicate entry with key "k"`: `serde_yaml_ng`'s message for a repeated mapping key.
fn duplicate_key(key: &Value) -> String {
    match key {
        Value::Null => "duplicate entry with null key".to_owned(),
        Value::Bool(b) => format!("duplicate entry with key `{b}`"),
        Value::Number(n) => format!("duplicate entry with key {n}"),
        Value::String(s) => format!("duplicate entry with key {s:?}"),
        Value::Sequence(_) | Value::Mapping(_) | Value::Tagged(_) => "duplicate entry in YAML map".to_owned(),
    }
}

impl<'de> DeserializeSeed<'de> for PresizedValue {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for PresizedValue {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }

    fn visit_i64<E: de::Error>(self, i: i64) -> Result<Value, E> {
        Ok(Value::Number(i.into()))
    }

    fn visit_u64<E: de::Error>(self, u: u64) -> Result<Value, E> {
        Ok(Value::Number(u.into()))
    }

    fn visit_f64<E: de::Error>(self, f: f64) -> Result<Value, E> {
        Ok(Value::Number(f.into()))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_owned()))
    }

    fn visit_string<E: de::Error>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut buf = take(&SEQUENCES);
        // On an error the buffer is dropped, not given back: the pool only ever holds empties.
        while let Some(v) = seq.next_element_seed(PresizedValue)? {
            buf.push(v);
        }
        let mut out = Vec::with_capacity(buf.len());
        out.append(&mut buf);
        give(&SEQUENCES, buf);
        Ok(Value::Sequence(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut buf = take(&ENTRIES);
        while let Some(k) = map.next_key_seed(PresizedValue)? {
            let v = map.next_value_seed(PresizedValue)?;
            buf.push((k, v));
        }
        let mut out = Mapping::with_capacity(buf.len());
        for (k, v) in buf.drain(..) {
            if out.contains_key(&k) {
                return Err(de::Error::custom(duplicate_key(&k)));
            }
            out.insert(k, v);
        }
        give(&ENTRIES, buf);
        Ok(Value::Mapping(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exact(json: &str) -> Result<Value, String> {
        let mut d = serde_json::Deserializer::from_str(json);
        PresizedValue.deserialize(&mut d).map_err(|e| e.to_string())
    }

    fn stock(json: &str) -> Result<Value, String> {
        serde_json::from_str::<Value>(json).map_err(|e| e.to_string())
    }

    #[test]
    fn decodes_as_values_own_deserialize_with_collections_at_their_length() {
        let block = r#"{"cidr":"10.0.0.0/26","affinity":"host:node-1","allocations":[0,null,1,null,2],
            "unallocated":[3,4,5],"attributes":[{"handle_id":"k8s-pod-network.x","secondary":{"node":"n","pod":"p"}},
            {"handle_id":null,"secondary":{}}],"deleted":false,"sequenceNumber":18446744073709551615,
            "neg":-3,"f":1.5,"empty":[],"nested":[[],[[1]],{"a":[{}]}],"s":"\u00e9\"x"}"#;
        let v = exact(block).unwrap();
        assert_eq!(v, stock(block).unwrap());
        // Same key order as the stock decoder, and no spare capacity.
        let keys: Vec<&str> = v.as_mapping().unwrap().keys().map(|k| k.as_str().unwrap()).collect();
        assert_eq!(keys, ["cidr", "affinity", "allocations", "unallocated", "attributes", "deleted", "sequenceNumber", "neg", "f", "empty", "nested", "s"]);
        let Value::Sequence(allocations) = &v["allocations"] else { panic!("allocations is not a sequence") };
        assert_eq!((allocations.len(), allocations.capacity()), (5, 5));
        for json in ["null", "true", "0", "-1", "1e300", "\"\"", "[]", "{}", "[null,[true,[{\"k\":[]}]]]"] {
            assert_eq!(exact(json), stock(json), "{json}");
        }
    }

    #[test]
    fn a_repeated_key_is_refused_as_the_stock_decoder_refuses_it() {
        let e = exact(r#"{"spec":{"cidr":"a","cidr":"b"}}"#).unwrap_err();
        assert!(e.starts_with("duplicate entry with key \"cidr\""), "{e}");
        assert!(stock(r#"{"spec":{"cidr":"a","cidr":"b"}}"#).unwrap_err().starts_with("duplicate entry with key \"cidr\""));
        // The pools hold only empty buffers after an error: the next decode is whole.
        assert_eq!(exact(r#"[1,[2,3],{"a":4}]"#), stock(r#"[1,[2,3],{"a":4}]"#));
    }

    #[test]
    fn malformed_json_fails_and_leaves_the_next_decode_whole() {
        for bad in ["[1,2", r#"{"a":[1,{"b":}]}"#, r#"{"a" 1}"#, "[1,]"] {
            assert!(exact(bad).is_err(), "{bad}");
        }
        assert_eq!(exact(r#"{"a":[1,{"b":2}]}"#), stock(r#"{"a":[1,{"b":2}]}"#));
    }
}
