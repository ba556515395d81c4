//! The objects the stand-in serves, with the history of their changes: one global
//! resourceVersion (etcd's revision), every change kept until [`Store::compact`], and the
//! state of a collection at any version still kept ([`Store::state_at`]).
//!
//! Objects are kept encoded (JSON [`Bytes`]), so that serving a list or a watch event shares
//! the bytes instead of encoding them again; a collection's whole list at the current version
//! is kept encoded too (as a [`ListBody`]) once built, so that lists from the "watch cache" of
//! a large collection cost no copy.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use serde_json::json;

use super::request::FieldSelector;

/// A resource type the stand-in serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceType {
    /// `""` for the core group.
    pub group: String,
    pub version: String,
    /// `Node`.
    pub kind: String,
    /// `nodes`.
    pub plural: String,
    pub namespaced: bool,
}

impl ResourceType {
    /// `api_version` as in objects (`v1`, `crd.projectcalico.org/v1`).
    pub fn new(api_version: &str, kind: &str, plural: &str, namespaced: bool) -> ResourceType {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        ResourceType { group: group.into(), version: version.into(), kind: kind.into(), plural: plural.into(), namespaced }
    }

    /// `group/version`, or `version` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The path of the collection: `/api/v1/nodes`, `/apis/apps/v1/namespaces/kube-system/daemonsets`.
    pub fn path(&self, namespace: Option<&str>) -> String {
        let base = if self.group.is_empty() { format!("/api/{}", self.version) } else { format!("/apis/{}/{}", self.group, self.version) };
        match namespace {
            Some(ns) => format!("{base}/namespaces/{ns}/{}", self.plural),
            None => format!("{base}/{}", self.plural),
        }
    }
}

/// An object's key: namespace (`""` when cluster-scoped) and name.
pub type Key = (String, String);

/// An object as stored: the version it was last written at and its JSON.
#[derive(Clone, Debug)]
pub struct Stored {
    pub rv: u64,
    pub body: Bytes,
}

/// The type of a watch event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    /// The start of the watch line up to the object (`{"type":"ADDED","object":`).
    pub(crate) fn prefix(self) -> Bytes {
        Bytes::from_static(match self {
            EventType::Added => br#"{"type":"ADDED","object":"#,
            EventType::Modified => br#"{"type":"MODIFIED","object":"#,
            EventType::Deleted => br#"{"type":"DELETED","object":"#,
        })
    }
}

/// One change, kept until compacted.
#[derive(Clone, Debug)]
struct Change {
    rv: u64,
    collection: usize,
    kind: EventType,
    key: Key,
    object: Bytes,
    previous: Option<Stored>,
}

/// A list body: the JSON of a whole `<Kind>List` and where each item is in it, so that a page
/// is the same bytes between a new header and footer.
#[derive(Clone, Debug)]
pub struct ListBody {
    pub(crate) resource_version: String,
    pub(crate) body: Bytes,
    pub(crate) items: Vec<Range<usize>>,
}

impl ListBody {
    /// The list of `items` (each one JSON object, as the API server encodes it) of kind
    /// `<kind>List` in `api_version`, at list resourceVersion `resource_version`.
    pub fn new<S: AsRef<[u8]>>(api_version: &str, kind: &str, resource_version: &str, items: impl IntoIterator<Item = S>) -> ListBody {
        let mut body = Self::header(api_version, kind, resource_version, None).into_bytes();
        let mut ranges = Vec::new();
        for (i, item) in items.into_iter().enumerate() {
            if i > 0 {
                body.push(b',');
            }
            let start = body.len();
            body.extend_from_slice(item.as_ref());
            ranges.push(start..body.len());
        }
        body.extend_from_slice(b"]}");
        ListBody { resource_version: resource_version.to_owned(), body: Bytes::from(body), items: ranges }
    }

    /// Everything before the first item: `{"apiVersion":..,"kind":"<kind>List","metadata":{..},"items":[`.
    pub(crate) fn header(api_version: &str, kind: &str, resource_version: &str, more: Option<(&str, Option<usize>)>) -> String {
        let mut metadata = json!({ "resourceVersion": resource_version });
        if let Some((token, remaining)) = more {
            metadata["continue"] = json!(token);
            if let Some(n) = remaining {
                metadata["remainingItemCount"] = json!(n);
            }
        }
        let head = json!({ "apiVersion": api_version, "kind": format!("{kind}List"), "metadata": metadata }).to_string();
        format!("{},\"items\":[", &head[..head.len() - 1])
    }

    /// Items in the list.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether the list has no items.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Size of the whole list's body, in bytes.
    pub fn bytes(&self) -> usize {
        self.body.len()
    }

    /// The item `i`'s JSON (shared).
    pub fn item(&self, i: usize) -> Bytes {
        self.body.slice(self.items[i].clone())
    }
}

/// One collection: its type, its objects now, and its whole list at `whole.0` once built.
#[derive(Debug)]
pub(crate) struct Collection {
    pub(crate) rt: ResourceType,
    pub(crate) objects: BTreeMap<Key, Stored>,
    whole: Option<(u64, ListBody)>,
    /// Served: in discovery and answering requests. A removed type is not (404); its place
    /// stays, so that the history and the watches keep their collection indexes.
    pub(crate) served: bool,
}

/// A registered watch: what it selects and where its events go.
pub(crate) struct Watcher {
    pub(crate) id: u64,
    pub(crate) collection: usize,
    pub(crate) namespace: Option<String>,
    pub(crate) selector: FieldSelector,
    pub(crate) bookmarks: bool,
    pub(crate) tx: futures::channel::mpsc::UnboundedSender<Bytes>,
    /// Frames sent into this watch (the counter shared with its body, which counts the
    /// frames the client read).
    pub(crate) sent: Arc<AtomicU64>,
}

impl Watcher {
    pub(crate) fn selects(&self, key: &Key) -> bool {
        self.namespace.as_deref().is_none_or(|ns| ns == key.0) && self.selector.matches(&key.0, &key.1)
    }

    /// Queue `frames`; false when the client has gone.
    pub(crate) fn send(&self, frames: &[Bytes]) -> bool {
        for f in frames {
            if self.tx.unbounded_send(f.clone()).is_err() {
                return false;
            }
            self.sent.fetch_add(1, Ordering::Relaxed);
        }
        true
    }
}

/// Every collection, the global version, the kept history and the open watches.
#[derive(Default)]
pub(crate) struct Store {
    pub(crate) collections: Vec<Collection>,
    /// The version of the last change (etcd's revision).
    pub(crate) rv: u64,
    /// The oldest version whose state can still be served: every change after it is kept.
    pub(crate) compacted: u64,
    history: VecDeque<Change>,
    pub(crate) watchers: Vec<Watcher>,
    pub(crate) next_watch: u64,
}

/// Why a change was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum StoreError {
    /// The resource type is not registered.
    UnknownResource(String),
    /// The object has no `metadata.name` (or a namespaced one no `metadata.namespace`).
    NoName,
    /// Create of an object that exists (409 AlreadyExists on a real server).
    AlreadyExists(Key),
    /// Update or delete of an object that does not exist (404 NotFound).
    NotFound(Key),
    /// A change committed at a version not newer than the store's.
    OldVersion { rv: u64, current: u64 },
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::UnknownResource(r) => write!(f, "resource {r} is not registered"),
            StoreError::NoName => f.write_str("object without metadata.name (or metadata.namespace for a namespaced resource)"),
            StoreError::AlreadyExists((ns, n)) => write!(f, "{ns}/{n} already exists"),
            StoreError::NotFound((ns, n)) => write!(f, "{ns}/{n} not found"),
            StoreError::OldVersion { rv, current } => write!(f, "version {rv} is not newer than the store's {current}"),
        }
    }
}

impl std::error::Error for StoreError {}

impl Store {
    pub(crate) fn register(&mut self, rt: ResourceType) -> usize {
        if let Some(i) = self.find(&rt.group, &rt.version, &rt.plural) {
            return i;
        }
        self.collections.push(Collection { rt, objects: BTreeMap::new(), whole: None, served: true });
        self.collections.len() - 1
    }

    pub(crate) fn find(&self, group: &str, version: &str, plural: &str) -> Option<usize> {
        self.collections.iter().position(|c| c.served && c.rt.group == group && c.rt.version == version && c.rt.plural == plural)
    }

    /// The resource types served (what discovery lists).
    pub(crate) fn served_types(&self) -> impl Iterator<Item = &ResourceType> {
        self.collections.iter().filter(|c| c.served).map(|c| &c.rt)
    }

    /// Stop serving collection `i`, as deleting its CRD does: every object is deleted first
    /// (a `DELETED` event each, at a new version), then its watches end and it is no longer
    /// found (404). Returns the versions of the deletions.
    pub(crate) fn unserve(&mut self, i: usize) -> Result<Vec<u64>, StoreError> {
        let rt = self.collections[i].rt.clone();
        let mut versions = Vec::new();
        for (key, stored) in self.collections[i].objects.clone() {
            let mut object: serde_json::Value = serde_json::from_slice(&stored.body).map_err(|_| StoreError::NoName)?;
            let rv = self.rv + 1;
            object["metadata"]["resourceVersion"] = json!(rv.to_string());
            self.commit(&rt, EventType::Deleted, key, rv, Bytes::from(object.to_string()))?;
            versions.push(rv);
        }
        self.watchers.retain(|w| w.collection != i);
        self.collections[i].served = false;
        self.collections[i].whole = None;
        Ok(versions)
    }

    fn index(&self, rt: &ResourceType) -> Result<usize, StoreError> {
        self.find(&rt.group, &rt.version, &rt.plural).ok_or_else(|| StoreError::UnknownResource(rt.path(None)))
    }

    /// Replace collection `rt`'s objects with `list`'s items (each item's key and version read
    /// from its metadata), with no history: the store's version becomes at least the list's,
    /// and nothing before it can be watched from (as after a compaction).
    pub(crate) fn load(&mut self, rt: &ResourceType, list: ListBody) -> Result<(), StoreError> {
        #[derive(serde::Deserialize)]
        struct Meta {
            metadata: MetaInner,
        }
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct MetaInner {
            name: Option<String>,
            namespace: Option<String>,
            resource_version: Option<String>,
        }
        let i = self.index(rt)?;
        let list_rv: u64 = list.resource_version.parse().unwrap_or(0);
        let mut objects = BTreeMap::new();
        for k in 0..list.len() {
            let body = list.item(k);
            let meta: Meta = serde_json::from_slice(&body).map_err(|_| StoreError::NoName)?;
            let name = meta.metadata.name.ok_or(StoreError::NoName)?;
            let ns = if rt.namespaced { meta.metadata.namespace.ok_or(StoreError::NoName)? } else { String::new() };
            let rv = meta.metadata.resource_version.and_then(|v| v.parse().ok()).unwrap_or(list_rv);
            objects.insert((ns, name), Stored { rv, body });
        }
        self.rv = self.rv.max(list_rv);
        self.compacted = self.rv;
        self.history.clear();
        let current = self.rv;
        let c = &mut self.collections[i];
        c.objects = objects;
        // The given body is the whole list only at its own version.
        c.whole = (list_rv == current).then_some((list_rv, list));
        Ok(())
    }

    /// Commit one change at version `rv` (> the store's): store it, keep it in the history,
    /// and send it to every watch that selects it.
    pub(crate) fn commit(&mut self, rt: &ResourceType, kind: EventType, key: Key, rv: u64, object: Bytes) -> Result<(), StoreError> {
        let i = self.index(rt)?;
        if rv <= self.rv {
            return Err(StoreError::OldVersion { rv, current: self.rv });
        }
        let c = &mut self.collections[i];
        let previous = match kind {
            EventType::Added => {
                if c.objects.contains_key(&key) {
                    return Err(StoreError::AlreadyExists(key));
                }
                c.objects.insert(key.clone(), Stored { rv, body: object.clone() })
            }
            EventType::Modified => {
                if !c.objects.contains_key(&key) {
                    return Err(StoreError::NotFound(key));
                }
                c.objects.insert(key.clone(), Stored { rv, body: object.clone() })
            }
            EventType::Deleted => Some(c.objects.remove(&key).ok_or_else(|| StoreError::NotFound(key.clone()))?),
        };
        c.whole = None;
        self.rv = rv;
        let frames = [kind.prefix(), object.clone(), Bytes::from_static(b"}\n")];
        self.watchers.retain(|w| w.collection != i || !w.selects(&key) || w.send(&frames));
        self.history.push_back(Change { rv, collection: i, kind, key, object, previous });
        Ok(())
    }

    /// Drop the history up to the current version (what etcd's compaction does): versions
    /// before it can no longer be listed exactly, watched from, or continued (410).
    pub(crate) fn compact(&mut self) -> u64 {
        self.history.clear();
        self.compacted = self.rv;
        self.rv
    }

    /// Collection `i`'s objects at version `rv` (the current state with every later change
    /// undone); `None` when `rv` was compacted.
    pub(crate) fn state_at(&self, i: usize, rv: u64) -> Option<BTreeMap<Key, Stored>> {
        if rv < self.compacted {
            return None;
        }
        let mut objects = self.collections[i].objects.clone();
        for ch in self.history.iter().rev().filter(|c| c.rv > rv && c.collection == i) {
            match &ch.previous {
                Some(prev) => objects.insert(ch.key.clone(), prev.clone()),
                None => objects.remove(&ch.key),
            };
        }
        Some(objects)
    }

    /// The changes of collection `i` after `rv` that `w` selects, as watch frames; `None`
    /// when `rv` was compacted (the watch must fail with 410 Expired).
    pub(crate) fn changes_since(&self, i: usize, rv: u64, w: &Watcher) -> Option<Vec<Bytes>> {
        if rv < self.compacted {
            return None;
        }
        let mut out = Vec::new();
        for ch in self.history.iter().filter(|c| c.rv > rv && c.collection == i && w.selects(&c.key)) {
            out.extend([ch.kind.prefix(), ch.object.clone(), Bytes::from_static(b"}\n")]);
        }
        Some(out)
    }

    /// The whole current list of collection `i`, built once per version.
    pub(crate) fn whole(&mut self, i: usize) -> ListBody {
        let rv = self.rv;
        let c = &mut self.collections[i];
        if let Some((at, body)) = &c.whole {
            if *at == rv {
                return body.clone();
            }
        }
        let body = ListBody::new(&c.rt.api_version(), &c.rt.kind, &rv.to_string(), c.objects.values().map(|s| s.body.clone()));
        c.whole = Some((rv, body.clone()));
        body
    }
}
