//! One watched resource ([`Resource`]): its sync [`Status`], what is known about each of its
//! objects ([`Entry`]: resourceVersion, content hash, last good or not, errors), and how a
//! watcher event changes the view's cluster ([`Resource::apply`]): an object whose trimmed
//! content did not change costs a hash; one that did is parsed alone, its last good version
//! kept when it does not parse; a list is gathered aside and replaces the old one only when
//! it is complete. No object is kept once it is looked at: only the [`Cluster`] it went into.

use std::collections::{BTreeMap, BTreeSet};

use kube::api::ApiResource;
use kube::runtime::watcher::Event;

use crate::datastore::kubernetes::resources::{api_resource, CalicoGroup, Watched};
use crate::datastore::kubernetes::trimmed::TrimmedObject;
use crate::model::{CalicoNodeDaemonSet, Cluster, ClusterBuilder, Kind, ModelError, OptionalSource, Rejected};

/// Sync state of one resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Status {
    /// Never listed completely yet.
    Listing,
    /// Listed; watching.
    Ready,
    /// The watch failed; the last view is kept until a re-list completes.
    Failed(String),
    /// An optional source whose API group is no longer served: not watched, nothing kept.
    Withdrawn,
}

/// What is known about one object (about 50 bytes besides its name: 100,000 IPAM blocks
/// cost about 10 MB here).
#[derive(Clone, Debug)]
pub(super) struct Entry {
    /// `metadata.resourceVersion` last looked at (the same one again is not even hashed).
    pub(super) resource_version: String,
    /// [`TrimmedObject::content_hash`] of the version last parsed: a version with the same
    /// hash (a Node heartbeat: only status conditions and resourceVersion changed) is not
    /// parsed again.
    pub(super) hash: u64,
    /// A version parsed once (it is in the view's cluster).
    pub(super) good: bool,
    /// Why the current version does not parse (`None` when it is the good one).
    pub(super) problem: Option<Box<Problem>>,
}

/// Why an object's current version does not parse.
#[derive(Clone, Debug)]
pub(super) struct Problem {
    /// The model's errors (kind, name, field).
    pub(super) errors: Vec<ModelError>,
    /// The CIDRs the version mentions: frozen ground while no good version stands in for it.
    pub(super) cidrs: Vec<ipnet::IpNet>,
}

/// A list in progress: from `Init` to `InitDone`, nothing of it is in the view yet.
#[derive(Default)]
struct Listing {
    /// Every listed object's entry as it will be once the list completes.
    entries: BTreeMap<String, Entry>,
    /// The listed objects that parsed and differ from the view's version.
    cluster: Cluster,
    /// Something the view shows will change at `InitDone` (a parse, good or bad).
    changed: bool,
}

/// What one watcher event did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Applied {
    /// The cluster or an object error changed (a snapshot may differ).
    pub(super) changed: bool,
    /// Object versions handed to the parser.
    pub(super) parses: u64,
    /// Of those, versions that failed to parse.
    pub(super) failures: u64,
}

/// One watched resource: its sync state and what is known about its objects.
pub(super) struct Resource {
    pub(super) watched: Watched,
    pub(super) api: ApiResource,
    /// The namespace read (the calico-node DaemonSets); `None`: cluster-wide.
    pub(super) namespace: Option<&'static str>,
    /// An optional source ([`OptionalSource`]): a failure to read it is recorded in
    /// [`Cluster::unread`] and never makes the datastore unsynced.
    pub(super) optional: Option<OptionalSource>,
    pub(super) status: Status,
    /// Every object of the last complete list and the watch since, by `metadata.name`.
    pub(super) entries: BTreeMap<String, Entry>,
    /// The names whose entry has a [`Problem`] (a snapshot lists only these, never every entry).
    pub(super) errored: BTreeSet<String>,
    listing: Option<Listing>,
}

/// How a changed object fared.
enum Outcome {
    /// Same resourceVersion or same content as the entry: nothing to do.
    Unchanged,
    /// Parsed: the one-object cluster.
    Good(Box<Cluster>),
    /// Did not parse.
    Bad(Problem),
}

impl Resource {
    /// Resource `w` in `group`, in `namespace` (or cluster-wide), nothing listed yet.
    pub(super) fn new(group: CalicoGroup, w: Watched, namespace: Option<&'static str>, optional: Option<OptionalSource>) -> Resource {
        let api = api_resource(group, w);
        Resource { watched: w, api, namespace, optional, status: Status::Listing, entries: BTreeMap::new(), errored: BTreeSet::new(), listing: None }
    }

    /// The model's key of object `name`: a DaemonSet is `namespace/name` (one calico-node per
    /// namespace), anything else its name.
    fn key(&self, name: &str) -> String {
        match self.namespace {
            Some(ns) if self.watched.kind == Kind::DaemonSet => CalicoNodeDaemonSet::key(ns),
            _ => name.to_owned(),
        }
    }

    /// Apply one watcher event to this resource and to `cluster` (the view's; `label` names
    /// the resource in logs):
    ///
    /// - `Init` starts a list aside; `InitApply` parses each object that differs from the
    ///   view's version into it; `InitDone` makes it the view: objects absent from it are
    ///   removed then, not before (a list that fails half-way changes nothing).
    /// - `Apply`: unchanged content costs nothing more; changed content is parsed alone and
    ///   replaces the object in `cluster`, or, when it does not parse, its last good version
    ///   stays and the errors are recorded.
    /// - `Delete`: the object leaves `cluster` and the entries.
    pub(super) fn apply(&mut self, event: Event<TrimmedObject>, label: &str, cluster: &mut Cluster) -> Applied {
        let mut out = Applied::default();
        match event {
            Event::Init => self.listing = Some(Listing::default()),
            Event::InitApply(obj) => {
                let (name, rv, hash, outcome) = self.examine(obj, label, &mut out);
                let old = self.entries.get(&name);
                let listing = self.listing.get_or_insert_with(Listing::default);
                let entry = match outcome {
                    Outcome::Unchanged => old.map_or_else(|| Entry { resource_version: String::new(), hash, good: false, problem: None }, Clone::clone),
                    Outcome::Good(one) => {
                        merge(&mut listing.cluster, *one);
                        listing.changed = true;
                        Entry { resource_version: String::new(), hash, good: true, problem: None }
                    }
                    Outcome::Bad(problem) => {
                        listing.changed = true;
                        Entry { resource_version: String::new(), hash, good: old.is_some_and(|e| e.good), problem: Some(Box::new(problem)) }
                    }
                };
                listing.entries.insert(name, Entry { resource_version: rv, ..entry });
            }
            Event::InitDone => out.changed = self.finish_list(cluster),
            Event::Apply(obj) => {
                let (name, rv, hash, outcome) = self.examine(obj, label, &mut out);
                let key = self.key(&name);
                let e = self.entries.entry(name.clone()).or_insert_with(|| Entry { resource_version: String::new(), hash, good: false, problem: None });
                e.resource_version = rv;
                match outcome {
                    Outcome::Unchanged => {}
                    Outcome::Good(one) => {
                        cluster.take_object(self.watched.kind, &key);
                        merge(cluster, *one);
                        *e = Entry { hash, good: true, problem: None, ..e.clone() };
                        self.errored.remove(&name);
                        out.changed = true;
                    }
                    Outcome::Bad(problem) => {
                        e.hash = hash;
                        e.problem = Some(Box::new(problem));
                        self.errored.insert(name);
                        out.changed = true;
                    }
                }
            }
            Event::Delete(obj) => {
                let name = obj.name();
                if self.entries.remove(name).is_some() {
                    cluster.take_object(self.watched.kind, &self.key(name));
                    self.errored.remove(name);
                    out.changed = true;
                }
            }
        }
        out
    }

    /// Forget every object of this resource and take each out of `cluster` (its source is
    /// withdrawn). True when the cluster changed.
    pub(super) fn drop_all(&mut self, cluster: &mut Cluster) -> bool {
        let kind = self.watched.kind;
        let changed = !self.entries.is_empty();
        for name in std::mem::take(&mut self.entries).keys() {
            cluster.take_object(kind, &self.key(name));
        }
        self.errored.clear();
        self.listing = None;
        changed
    }

    /// `InitDone`: the list gathered since `Init` becomes the view. True when the view changed.
    fn finish_list(&mut self, cluster: &mut Cluster) -> bool {
        let Listing { entries, cluster: listed, mut changed } = self.listing.take().unwrap_or_default();
        let kind = self.watched.kind;
        for name in self.entries.keys().filter(|name| !entries.contains_key(*name)) {
            cluster.take_object(kind, &self.key(name));
            changed = true;
        }
        merge(cluster, listed);
        self.errored = entries.iter().filter(|(_, e)| e.problem.is_some()).map(|(name, _)| name.clone()).collect();
        // Built again from its sorted entries: full tree nodes. A list arrives in name order,
        // and inserting in order leaves every node about half empty (at 100,000 blocks and
        // their affinities, ~11 MB of the datastore's steady memory).
        self.entries = entries.into_iter().collect();
        changed
    }

    /// Look at one object against its entry: unchanged (same resourceVersion, or same
    /// content hash), or parsed alone. Returns its name, resourceVersion, hash and outcome,
    /// and counts the parse in `out`.
    fn examine(&self, obj: TrimmedObject, label: &str, out: &mut Applied) -> (String, String, u64, Outcome) {
        let name = obj.name().to_owned();
        let rv = obj.metadata.resource_version.clone().unwrap_or_default();
        let old = self.entries.get(&name);
        if let Some(e) = old.filter(|e| !rv.is_empty() && e.resource_version == rv) {
            return (name, rv, e.hash, Outcome::Unchanged);
        }
        let hash = obj.content_hash();
        if let Some(e) = old.filter(|e| e.hash == hash) {
            return (name, rv, e.hash, Outcome::Unchanged); // nothing the model reads changed (a Node heartbeat)
        }
        out.parses += 1;
        let outcome = match parse_alone(&obj.into_value(&self.api)) {
            Ok(one) => Outcome::Good(Box::new(one)),
            Err(rejected) => {
                out.failures += 1;
                let mut cidrs: Vec<ipnet::IpNet> = rejected.iter().flat_map(|r| r.cidrs.iter().copied()).collect();
                cidrs.sort();
                cidrs.dedup();
                let errors: Vec<ModelError> = rejected.into_iter().map(|r| r.error).collect();
                for error in &errors {
                    tracing::warn!(
                        kind = %self.watched.kind,
                        name = %name,
                        resource = %label,
                        error = %error,
                        kept_last_good = old.is_some_and(|e| e.good),
                        "kubernetes datastore: object does not parse; skipped"
                    );
                }
                Outcome::Bad(Problem { errors, cidrs })
            }
        };
        (name, rv, hash, outcome)
    }
}

/// Add every object of `other` to `cluster`, replacing those of the same name.
fn merge(cluster: &mut Cluster, other: Cluster) {
    join(&mut cluster.ip_pools, other.ip_pools);
    join(&mut cluster.ipam_blocks, other.ipam_blocks);
    join(&mut cluster.block_affinities, other.block_affinities);
    join(&mut cluster.nodes, other.nodes);
    join(&mut cluster.felix_configurations, other.felix_configurations);
    join(&mut cluster.bgp_configurations, other.bgp_configurations);
    join(&mut cluster.cluster_informations, other.cluster_informations);
    join(&mut cluster.installations, other.installations);
    join(&mut cluster.calico_node_daemonsets, other.calico_node_daemonsets);
}

/// `into` plus `from` (`from`'s value wins): taken whole when `into` is empty (a first list of
/// 100,000 blocks moves one map), else inserted one by one (one changed object costs
/// O(log n), not a pass over the map as `BTreeMap::append` would).
fn join<M: Default + IsEmpty + Extend<<M as IntoIterator>::Item> + IntoIterator>(into: &mut M, from: M) {
    if into.is_empty() {
        *into = from;
    } else {
        into.extend(from);
    }
}

/// The maps [`join`] joins: `BTreeMap` and [`SharedMap`](crate::model::SharedMap).
trait IsEmpty {
    fn is_empty(&self) -> bool;
}

impl<K, V> IsEmpty for BTreeMap<K, V> {
    fn is_empty(&self) -> bool {
        BTreeMap::is_empty(self)
    }
}

impl<K, V> IsEmpty for crate::model::SharedMap<K, V> {
    fn is_empty(&self) -> bool {
        crate::model::SharedMap::is_empty(self)
    }
}

/// Parse one object alone with the model parser: the one-object [`Cluster`] when it is good,
/// its errors (kind, name, field) when not.
fn parse_alone(value: &serde_yaml_ng::Value) -> Result<Cluster, Vec<Rejected>> {
    let mut builder = ClusterBuilder::default();
    let errors = builder.add(value);
    if errors.is_empty() {
        Ok(builder.finish().0)
    } else {
        Err(errors)
    }
}
