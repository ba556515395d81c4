//! The etcd datastore's synchronous core: the last good object of every key, built into
//! [`Snapshot`]s. No I/O; the runner feeds it the range read and the watch events.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use crate::datastore::error::{LoadError, LoadErrorKind, ObjectError};
use crate::datastore::event::Snapshot;
use crate::model::{cidrs_in_text, ClusterBuilder, Kind, ParsedObject, ParsedObjects, Rejected};

use super::layout::{classify, document, to_model, KeyKind};

/// One key's state.
#[derive(Debug, Default)]
struct Entry {
    /// The last good object read at this key.
    good: Option<ParsedObject>,
    /// Why the current value is not used: not JSON (a load error) or a rejected object.
    problem: Option<Problem>,
}

#[derive(Debug)]
enum Problem {
    Syntax(LoadError),
    Rejected(Vec<Rejected>),
}

/// Every key read, by key.
#[derive(Debug, Default)]
pub struct View {
    entries: BTreeMap<String, Entry>,
}

impl View {
    /// Apply a put of `value` at `key`. A value that is not JSON or not a good object keeps
    /// the key's last good object and records the problem, naming the key. Returns whether
    /// anything routewarden reads changed.
    pub fn put(&mut self, key: &str, value: &[u8]) -> bool {
        let Some(kind) = classify(key) else { return false };
        let entry = self.entries.entry(key.to_owned()).or_default();
        // An affinity stored with no value (Calico releases before affinities had a state)
        // reads as `{}`, as `BlockAffinityKey.parseValue` does
        // (`libcalico-go/lib/backend/model/block_affinity.go`): a confirmed affinity.
        let value = if value.is_empty() && matches!(kind, KeyKind::Affinity { .. }) { b"{}".as_slice() } else { value };
        let parsed = match serde_json::from_slice::<serde_json::Value>(value) {
            Ok(v) => ParsedObjects::from_values([&to_model(&document(&kind, v))]).into_items(),
            Err(e) => {
                let text = String::from_utf8_lossy(value);
                let mut err = LoadError::new(key, LoadErrorKind::Syntax, format!("value is not JSON: {e}"));
                err.cidrs = cidrs_in_text(&text);
                err.never_loaded = entry.good.is_none();
                entry.problem = Some(Problem::Syntax(err));
                return true;
            }
        };
        let (good, rejected): (Vec<_>, Vec<_>) = parsed.into_iter().partition(ParsedObject::is_good);
        let rejected: Vec<Rejected> = rejected
            .into_iter()
            .filter_map(|p| match p {
                ParsedObject::Error(r) => Some(r),
                _ => None,
            })
            .collect();
        if rejected.is_empty() {
            entry.problem = None;
            // Unknown kinds parse to nothing: the key then holds nothing routewarden reads.
            entry.good = good.into_iter().next();
        } else {
            entry.problem = Some(Problem::Rejected(rejected));
        }
        true
    }

    /// Apply a deletion of `key`: positive evidence the object is gone.
    pub fn delete(&mut self, key: &str) -> bool {
        self.entries.remove(key).is_some()
    }

    /// Replace everything with a complete range read (a re-list): keys absent from it are gone.
    pub fn reset(&mut self, kvs: impl IntoIterator<Item = (String, Vec<u8>)>) {
        let mut old = std::mem::take(&mut self.entries);
        for (key, value) in kvs {
            // Keep the last good version of a key whose new value is broken.
            if let Some(e) = old.remove(&key) {
                self.entries.insert(key.clone(), Entry { good: e.good, problem: None });
            }
            self.put(&key, &value);
        }
        self.entries.retain(|_, e| e.good.is_some() || e.problem.is_some());
    }

    /// Keys held (good or broken).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The snapshot of the current state: every key's last good object; errors named by key.
    pub fn snapshot(&self) -> Snapshot {
        let mut builder = ClusterBuilder::default();
        let mut object_errors = Vec::new();
        let mut load_errors = Vec::new();
        for (key, e) in &self.entries {
            let file = PathBuf::from(key);
            if let Some(good) = &e.good {
                for r in builder.add_parsed([good.clone()]) {
                    object_errors.push(ObjectError::from_rejected(file.clone(), r));
                }
            }
            match &e.problem {
                Some(Problem::Syntax(err)) => load_errors.push(err.clone()),
                Some(Problem::Rejected(rs)) => object_errors.extend(rs.iter().map(|r| {
                    let mut r = r.clone();
                    r.last_good = e.good.is_some();
                    if r.last_good {
                        r.cidrs.clear();
                    }
                    ObjectError::from_rejected(file.clone(), r)
                })),
                None => {}
            }
        }
        // What `finish` takes out (overlapping pools, overlapping or wrong-sized IPAM blocks,
        // an object at two keys) is named by the key of its object: looked up only for those
        // (a pass over the keys when there are any), not kept for every key of every snapshot.
        let (cluster, taken_out) = builder.finish();
        let mut keys: BTreeMap<(Kind, &str), Option<&String>> = taken_out.iter().filter_map(|r| r.error.object()).map(|id| (id, None)).collect();
        if !keys.is_empty() {
            for (key, e) in &self.entries {
                if let Some(slot) = e.good.as_ref().and_then(ParsedObject::identity).and_then(|id| keys.get_mut(&id)) {
                    slot.get_or_insert(key);
                }
            }
        }
        let keys: BTreeMap<(Kind, String), PathBuf> = keys.into_iter().filter_map(|((k, n), key)| Some(((k, n.to_owned()), PathBuf::from(key?)))).collect();
        for r in taken_out {
            let file = r.error.object().and_then(|(k, n)| keys.get(&(k, n.to_owned()))).cloned().unwrap_or_default();
            object_errors.push(ObjectError::from_rejected(file, r));
        }
        Snapshot { cluster: Arc::new(cluster), object_errors, load_errors, inputs: self.entries.len(), settled: true }
    }
}

#[cfg(test)]
mod tests;
