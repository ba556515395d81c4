//! The etcd datastore's synchronous core: the last good object of every key, built into
//! [`Snapshot`]s. No I/O; the runner feeds it the range read and the watch events.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use crate::datastore::error::{LoadError, LoadErrorKind, ObjectError};
use crate::datastore::event::Snapshot;
use crate::model::{
    check_blocks, check_pools, cidrs_in_text, BlockAffinity, Cluster, IpamBlock, Kind, ModelError, Node, ParsedObject, ParsedObjects, Rejected,
};

use self::claims::Claims;
use super::layout::{classify, document, to_model, KeyKind};

/// A key's last good object as the view keeps it: IPAM blocks, affinities and Nodes (all but a
/// few of 100,000s of keys) shared with the cluster, one copy each, not two, and named by
/// their own `name` (a pointer: 16 bytes a key, not 32); the few others by value.
#[derive(Clone, Debug)]
enum Good {
    Block(Arc<IpamBlock>),
    Affinity(Arc<BlockAffinity>),
    Node(Arc<Node>),
    Other(Box<ParsedObject>),
}

impl Good {
    fn new(parsed: ParsedObject) -> Good {
        match parsed {
            ParsedObject::IpamBlock(name, o) if *o.name == *name => Good::Block(o),
            ParsedObject::BlockAffinity(name, o) if *o.name == *name => Good::Affinity(o),
            ParsedObject::Node(name, o) if *o.name == *name => Good::Node(o),
            other => Good::Other(Box::new(other)),
        }
    }

    /// Its kind and name; the name shared with the object's where the object keeps one.
    fn identity(&self) -> Option<Identity> {
        match self {
            Good::Block(b) => Some((Kind::IpamBlock, b.name.clone())),
            Good::Affinity(a) => Some((Kind::BlockAffinity, a.name.clone())),
            Good::Node(n) => Some((Kind::Node, n.name.clone())),
            Good::Other(p) => p.identity().map(|(k, n)| (k, Arc::from(n))),
        }
    }

    /// The CIDRs it routes or claims (`ParsedObject::cidrs`).
    fn cidrs(&self) -> Vec<ipnet::IpNet> {
        match self {
            Good::Block(b) => vec![b.cidr],
            Good::Affinity(a) => vec![a.cidr],
            Good::Node(..) => Vec::new(),
            Good::Other(p) => p.cidrs(),
        }
    }

    /// Put it in `cluster` in place of the object of its kind and name (a shared one: its
    /// `Arc`, not a copy).
    fn put_into(&self, cluster: &mut Cluster) {
        match self {
            Good::Block(b) => drop(cluster.ipam_blocks.insert(b.name.clone(), b.clone())),
            Good::Affinity(a) => drop(cluster.block_affinities.insert(a.name.clone(), a.clone())),
            Good::Node(n) => drop(cluster.nodes.insert(n.name.clone(), n.clone())),
            Good::Other(p) => cluster.put_parsed((**p).clone()),
        }
    }

    /// As the model parser gave it (the tests' rebuild).
    #[cfg(test)]
    fn to_parsed(&self) -> ParsedObject {
        match self {
            Good::Block(b) => ParsedObject::IpamBlock(b.name.to_string(), b.clone()),
            Good::Affinity(a) => ParsedObject::BlockAffinity(a.name.to_string(), a.clone()),
            Good::Node(n) => ParsedObject::Node(n.name.to_string(), n.clone()),
            Good::Other(p) => (**p).clone(),
        }
    }
}

/// One key's state.
#[derive(Debug, Default)]
struct Entry {
    /// The last good object read at this key.
    good: Option<Good>,
    /// Why the current value is not used: not JSON (a load error) or a rejected object (boxed:
    /// rare, and large).
    problem: Option<Box<Problem>>,
}

impl Entry {
    /// This key's problem as the snapshot reports it, named by `key`: a value that is not JSON
    /// a load error; rejections object errors, marked last-good (and without the CIDRs they
    /// would freeze) when a good version stands in.
    fn errors(&self, key: &str, object_errors: &mut Vec<ObjectError>, load_errors: &mut Vec<LoadError>) {
        match self.problem.as_deref() {
            Some(Problem::Syntax(err)) => load_errors.push(err.clone()),
            Some(Problem::Rejected(rs)) => object_errors.extend(rs.iter().map(|r| {
                let mut r = r.clone();
                r.last_good = self.good.is_some();
                if r.last_good {
                    r.cidrs.clear();
                }
                ObjectError::from_rejected(PathBuf::from(key), r)
            })),
            None => {}
        }
    }
}

#[derive(Debug)]
enum Problem {
    Syntax(LoadError),
    Rejected(Vec<Rejected>),
}

/// An object's kind and name: what two keys may both define (a duplicate).
type Identity = (Kind, Arc<str>);

/// A key as the view holds it: one allocation shared by its entry, its claim and the set of
/// keys with a problem.
type Key = Arc<str>;

/// Every key read, by key, and the cluster they make, kept as keys change: one put or delete
/// costs O(log n) and a snapshot O(chunks of the cluster's maps) plus the whole-cluster checks
/// (overlapping pools and blocks), not a rebuild from every key.
///
/// Memory, at 205,000 keys (100,000 blocks and their affinities): each key and each object name
/// is held once ([`Key`], the [`Identity`]'s name shared with the object), and the two maps are
/// rebuilt with full tree nodes after a re-list (a first list inserts in key order, which
/// leaves every node half empty).
#[derive(Debug, Default)]
pub struct View {
    entries: BTreeMap<Key, Entry>,
    /// Every key's last good object, less the identities more than one key defines.
    cluster: Cluster,
    /// The keys whose last good object has each identity.
    claims: Claims,
    /// The identities more than one key claims.
    contested: BTreeSet<Identity>,
    /// The keys whose current value is not used (a load error or a rejected object).
    errored: BTreeSet<Key>,
}

impl View {
    /// Apply a put of `value` at `key`. A value that is not JSON or not a good object keeps
    /// the key's last good object and records the problem, naming the key. Returns whether
    /// anything routewarden reads changed.
    pub fn put(&mut self, key: &str, value: &[u8]) -> bool {
        let Some(kind) = classify(key) else { return false };
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
                let (key, entry) = self.entry(key);
                err.never_loaded = entry.good.is_none();
                entry.problem = Some(Box::new(Problem::Syntax(err)));
                self.errored.insert(key);
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
            self.errored.remove(key);
            let (key, entry) = self.entry(key);
            entry.problem = None;
            // Unknown kinds parse to nothing: the key then holds nothing routewarden reads.
            self.set_good(&key, good.into_iter().next().map(Good::new));
        } else {
            let (key, entry) = self.entry(key);
            entry.problem = Some(Box::new(Problem::Rejected(rejected)));
            self.errored.insert(key);
        }
        true
    }

    /// The entry of `key`, made empty if there is none, and the key as the view holds it.
    fn entry(&mut self, key: &str) -> (Key, &mut Entry) {
        let held = match self.entries.get_key_value(key) {
            Some((held, _)) => held.clone(),
            None => Key::from(key),
        };
        let entry = self.entries.entry(held.clone()).or_default();
        (held, entry)
    }

    /// Apply a deletion of `key`: positive evidence the object is gone.
    pub fn delete(&mut self, key: &str) -> bool {
        let Some(entry) = self.entries.remove(key) else { return false };
        self.errored.remove(key);
        if let Some(id) = identity(entry.good.as_ref()) {
            self.unclaim(&id, key);
        }
        true
    }

    /// Replace everything with a complete range read in one page (a re-list): keys absent from
    /// it are gone. The runner reads in pages ([`View::relist_page`], [`View::end_relist`]).
    #[cfg(test)]
    pub fn reset(&mut self, kvs: impl IntoIterator<Item = (String, Vec<u8>)>) {
        let mut seen = BTreeSet::new();
        self.relist_page(kvs, &mut seen);
        self.end_relist(&seen);
    }

    /// One page of a re-list (`seen` gathers its keys): each key as a put ([`View::put`]
    /// keeps the last good version of a key whose new value is broken, and replaces its old
    /// problem with the new value's). Pages are applied as they come, so a re-list holds one page's values at a time,
    /// not every key's; until [`View::end_relist`] no key is gone.
    pub fn relist_page(&mut self, kvs: impl IntoIterator<Item = (String, Vec<u8>)>, seen: &mut BTreeSet<String>) {
        for (key, value) in kvs {
            self.put(&key, &value);
            seen.insert(key);
        }
    }

    /// The re-list is complete: every key it did not hold (`seen`) is gone. Then the key and
    /// claim maps are built again from their sorted entries, with full tree nodes.
    pub fn end_relist(&mut self, seen: &BTreeSet<String>) {
        let gone: Vec<Key> = self.entries.keys().filter(|k| !seen.contains(&***k)).cloned().collect();
        for key in gone {
            self.delete(&key);
        }
        self.entries = std::mem::take(&mut self.entries).into_iter().filter(|(_, e)| e.good.is_some() || e.problem.is_some()).collect();
        self.claims.compact();
    }

    /// Keys held (good or broken).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Make `good` the last good object of `key` (an entry exists), moving the key's claim
    /// from the old object's identity to the new one's.
    fn set_good(&mut self, key: &Key, good: Option<Good>) {
        let Some(entry) = self.entries.get_mut(key) else { return };
        let old = identity(entry.good.as_ref());
        let new = identity(good.as_ref());
        entry.good = good;
        if old == new {
            // The same object changed (most puts): its claim stands, the cluster takes the
            // new version.
            if let Some(id) = new {
                self.refresh(&id);
            }
            return;
        }
        if let Some(id) = old {
            self.unclaim(&id, key);
        }
        if let Some(id) = new {
            self.claims.add(&id, key);
            self.refresh(&id);
        }
    }

    /// `key` no longer defines `id`.
    fn unclaim(&mut self, id: &Identity, key: &str) {
        self.claims.remove(id, key);
        self.refresh(id);
    }

    /// Put the cluster right for `id` after its claims changed: the object of its one key, or
    /// nothing when no key or more than one defines it.
    fn refresh(&mut self, id: &Identity) {
        match self.claims.count(id) {
            0 => {
                self.contested.remove(id);
                self.cluster.take_object(id.0, &id.1);
            }
            1 => {
                self.contested.remove(id);
                if let Some(good) = self.claims.first(id).and_then(|k| self.entries.get(k)).and_then(|e| e.good.as_ref()) {
                    good.put_into(&mut self.cluster);
                }
            }
            _ => {
                self.contested.insert(id.clone());
                self.cluster.take_object(id.0, &id.1);
            }
        }
    }

    /// The snapshot of the current state: every key's last good object; errors named by key.
    /// Costs a clone of the cluster (its large maps share their chunks) and the checks that
    /// need every object: an object defined at two keys is refused at both (every key but the
    /// first, then the first), then overlapping pools, then overlapping or wrong-sized blocks
    /// (`ClusterBuilder::finish`'s checks and order).
    pub fn snapshot(&self) -> Snapshot {
        let mut cluster = self.cluster.clone();
        let mut object_errors = Vec::new();
        let mut load_errors = Vec::new();
        for (key, e) in self.errored.iter().filter_map(|k| Some((k, self.entries.get(k)?))) {
            e.errors(key, &mut object_errors, &mut load_errors);
        }
        let cidrs_at = |key: &Key| self.entries.get(key).and_then(|e| e.good.as_ref()).map(Good::cidrs).unwrap_or_default();
        for id in &self.contested {
            let duplicate = |key: &Key| {
                ObjectError::from_rejected(PathBuf::from(&**key), Rejected::new(ModelError::Duplicate { kind: id.0, name: id.1.to_string() }, cidrs_at(key)))
            };
            object_errors.extend(self.claims.keys(id).skip(1).map(duplicate));
            object_errors.extend(self.claims.first(id).map(duplicate));
        }
        let pools = check_pools(&mut cluster.ip_pools);
        let blocks = check_blocks(&cluster.ip_pools, &mut cluster.ipam_blocks);
        for r in pools.into_iter().chain(blocks) {
            let key = r.error.object().and_then(|(k, n)| self.claims.first(&(k, Arc::from(n))));
            object_errors.push(ObjectError::from_rejected(key.map(|k| PathBuf::from(&**k)).unwrap_or_default(), r));
        }
        Snapshot { cluster: Arc::new(cluster), object_errors, load_errors, inputs: self.entries.len(), settled: true }
    }
}

/// The identity of a good object (`None` for none).
fn identity(good: Option<&Good>) -> Option<Identity> {
    good.and_then(Good::identity)
}

mod claims;
#[cfg(test)]
mod tests;
