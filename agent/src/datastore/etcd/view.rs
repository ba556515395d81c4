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
mod tests {
    use std::path::Path;

    use super::*;

    const POOL: &str = "/calico/resources/v3/projectcalico.org/ippools/pool-a";

    fn pool(cidr: &str) -> Vec<u8> {
        format!(r#"{{"apiVersion":"projectcalico.org/v3","kind":"IPPool","metadata":{{"name":"pool-a"}},"spec":{{"cidr":"{cidr}"}}}}"#).into_bytes()
    }

    fn pool_cidr(view: &View) -> Option<String> {
        view.snapshot().cluster.ip_pools.get("pool-a").map(|p| p.cidr.to_string())
    }

    /// Old Calico wrote affinities with no value; `block_affinity.go` reads one as `{}`. So does
    /// the view: a confirmed host affinity, no load error (a never-loaded error would hold
    /// every deletion). An empty value anywhere else is still not JSON.
    #[test]
    fn an_affinity_with_no_value_is_a_confirmed_affinity() {
        let mut view = View::default();
        let key = "/calico/ipam/v2/host/node-a/ipv4/block/10.0.0.0-26";
        assert!(view.put(key, b""));
        let s = view.snapshot();
        assert_eq!((s.load_errors.len(), s.object_errors.len()), (0, 0));
        let affinities: Vec<_> =
            s.cluster.block_affinities.values().map(|a| (a.node.as_str(), a.cidr.to_string(), a.state, a.affinity_type.as_str(), a.is_active())).collect();
        assert_eq!(affinities, vec![("node-a", "10.0.0.0/26".to_owned(), crate::model::AffinityState::Confirmed, "host", true)]);
        view.put(POOL, b"");
        let s = view.snapshot();
        assert_eq!(s.load_errors.len(), 1);
        assert!(s.load_errors[0].message.starts_with("value is not JSON: "), "{}", s.load_errors[0].message);
    }

    #[test]
    fn a_broken_value_keeps_the_last_good_object_and_names_the_key() {
        let mut view = View::default();
        assert!(view.put(POOL, &pool("10.0.0.0/16")));
        assert_eq!(pool_cidr(&view), Some("10.0.0.0/16".into()));
        // Not JSON: a load error named by the key; the last good pool stays.
        view.put(POOL, b"{\"apiVersion\": ");
        let s = view.snapshot();
        assert_eq!(pool_cidr(&view), Some("10.0.0.0/16".into()));
        assert_eq!(s.load_errors.len(), 1);
        assert_eq!((s.load_errors[0].file.as_path(), s.load_errors[0].never_loaded), (Path::new(POOL), false));
        assert!(s.load_errors[0].message.starts_with("value is not JSON: "), "{}", s.load_errors[0].message);
        // A bad field: an object error named by the key, marked last-good.
        view.put(POOL, &pool("10.0.0/16"));
        let s = view.snapshot();
        assert_eq!(pool_cidr(&view), Some("10.0.0.0/16".into()));
        assert_eq!(s.load_errors, vec![]);
        assert_eq!(s.object_errors.len(), 1);
        assert_eq!(s.object_errors[0].to_string(), format!("{POOL}: IPPool \"pool-a\": spec.cidr: invalid CIDR \"10.0.0/16\" (its last good version is kept)"));
        // A good value clears the error.
        view.put(POOL, &pool("10.1.0.0/16"));
        let s = view.snapshot();
        assert_eq!((pool_cidr(&view), s.object_errors.len()), (Some("10.1.0.0/16".into()), 0));
    }

    #[test]
    fn a_deletion_removes_the_object_and_a_relist_drops_absent_keys() {
        let mut view = View::default();
        view.put(POOL, &pool("10.0.0.0/16"));
        assert!(!view.put("/calico/felix/v2/ignored", b"x"));
        assert!(view.delete(POOL));
        assert_eq!((pool_cidr(&view), view.len()), (None, 0));
        view.put(POOL, &pool("10.0.0.0/16"));
        view.reset(Vec::new());
        assert_eq!((pool_cidr(&view), view.len()), (None, 0));
        // A re-list whose value is broken keeps the last good object.
        view.put(POOL, &pool("10.0.0.0/16"));
        view.reset(vec![(POOL.to_owned(), b"nope".to_vec())]);
        assert_eq!(pool_cidr(&view), Some("10.0.0.0/16".into()));
        assert_eq!(view.snapshot().load_errors.len(), 1);
    }

    /// Issue 48 case 4: what `finish` takes out is named by its object's key, also for IPAM
    /// blocks (the key lookup used to know only pools: a block's error had no key). A /27
    /// inside a /26 of another node: both refused, each error at its own key, both freezing the
    /// /26; a wrong-sized block alone at its key; an overlapping pool at its key still.
    #[test]
    fn rejections_of_the_whole_cluster_name_each_objects_key() {
        let block =
            |cidr: &str, node: &str| format!(r#"{{"cidr":"{cidr}","affinity":"host:{node}","allocations":[],"attributes":[],"deleted":false}}"#).into_bytes();
        let key = |cidr: &str| format!("/calico/ipam/v2/assignment/ipv4/block/{}", cidr.replace('/', "-"));
        let mut view = View::default();
        view.put(POOL, &pool("10.244.0.0/16"));
        view.put(&key("10.244.10.0/26"), &block("10.244.10.0/26", "node-a"));
        view.put(&key("10.244.10.32/27"), &block("10.244.10.32/27", "node-b"));
        view.put(&key("10.244.30.0/26"), &block("10.244.30.0/26", "node-c"));
        view.put(&key("10.244.64.0/24"), &block("10.244.64.0/24", "node-d"));
        let s = view.snapshot();
        let got: Vec<(String, String, Vec<String>)> = s
            .object_errors
            .iter()
            .map(|e| (e.file.display().to_string(), e.error.object().unwrap().1.to_owned(), e.cidrs.iter().map(ToString::to_string).collect()))
            .collect();
        let at = |cidr: &str, name: &str, frozen: &str| (key(cidr), name.to_owned(), vec![frozen.to_owned()]);
        assert_eq!(
            got,
            [
                at("10.244.10.0/26", "10-244-10-0-26", "10.244.10.0/26"),
                at("10.244.10.32/27", "10-244-10-32-27", "10.244.10.0/26"),
                at("10.244.64.0/24", "10-244-64-0-24", "10.244.64.0/24"),
            ]
        );
        assert!(s.object_errors.iter().all(|e| !e.last_good));
        assert_eq!(s.cluster.ipam_blocks.keys().map(ToString::to_string).collect::<Vec<_>>(), ["10-244-30-0-26"]);
        // An overlapping pool is still named by its key.
        view.put(
            "/calico/resources/v3/projectcalico.org/ippools/pool-b",
            br#"{"apiVersion":"projectcalico.org/v3","kind":"IPPool","metadata":{"name":"pool-b"},"spec":{"cidr":"10.0.0.0/8"}}"#,
        );
        let files: Vec<String> =
            view.snapshot().object_errors.iter().filter(|e| e.error.object().unwrap().0 == Kind::IpPool).map(|e| e.file.display().to_string()).collect();
        assert_eq!(files, [POOL, "/calico/resources/v3/projectcalico.org/ippools/pool-b"]);
    }

    #[test]
    fn a_never_good_broken_value_is_never_loaded() {
        let mut view = View::default();
        view.put(POOL, b"nope");
        let s = view.snapshot();
        assert_eq!((s.load_errors.len(), s.load_errors[0].never_loaded, s.cluster.ip_pools.len()), (1, true, 0));
    }
}
