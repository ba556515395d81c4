//! One watched resource ([`Resource`]): its reflector store, its sync [`Status`], what is known
//! about each of its objects ([`Entry`]), and bringing the view's cluster in line with the
//! store ([`refresh`]: parse what changed, one object at a time, keep the last good version of
//! what does not parse, drop what was deleted).

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};

use kube::api::{ApiResource, DynamicObject};
use kube::runtime::reflector::store::{Store, Writer};
use kube::ResourceExt;
use serde_yaml_ng::Value;

use crate::datastore::kubernetes::sources::{api_resource, CalicoGroup, Watched};
use crate::model::{mentioned_cidrs, CalicoNodeDaemonSet, Cluster, ClusterBuilder, Kind, ModelError, OptionalSource, Rejected};

/// A resource's reflector store writer (the run loop's watcher events go in through it).
pub(super) type StoreWriter = Writer<DynamicObject>;

/// Sync state of one resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Status {
    /// Never listed completely yet.
    Listing,
    /// Listed; watching.
    Ready,
    /// The watch failed; the last view is kept until a re-list completes.
    Failed(String),
}

/// What is known about one object.
#[derive(Debug)]
pub(super) struct Entry {
    /// `metadata.resourceVersion` last looked at.
    pub(super) resource_version: String,
    /// Hash of the stripped object last looked at (an update that changes nothing the model
    /// reads, such as a Node heartbeat, keeps the hash).
    pub(super) hash: u64,
    /// A version parsed once (it is in the view's cluster).
    pub(super) good: bool,
    /// The errors of the current version (empty when it is the good one).
    pub(super) errors: Vec<ModelError>,
    /// The CIDRs the current (failing) version mentions: frozen ground while no good
    /// version stands in for it.
    pub(super) cidrs: Vec<ipnet::IpNet>,
}

/// One watched resource: its store and its objects' last good versions.
pub(super) struct Resource {
    pub(super) watched: Watched,
    pub(super) api: ApiResource,
    /// The namespace read (the calico-node DaemonSets); `None`: cluster-wide.
    pub(super) namespace: Option<&'static str>,
    /// An optional source ([`OptionalSource`]): a failure to read it is recorded in
    /// [`Cluster::unread`] and never makes the datastore unsynced.
    pub(super) optional: Option<OptionalSource>,
    pub(super) writer: StoreWriter,
    pub(super) reader: Store<DynamicObject>,
    pub(super) status: Status,
    pub(super) entries: BTreeMap<String, Entry>,
    /// The store changed since the last refresh: only such resources are scanned (a Node
    /// heartbeat must not cost a pass over 100,000 IPAM blocks).
    pub(super) changed: bool,
}

impl Resource {
    /// Resource `w` in `group`, in `namespace` (or cluster-wide), nothing listed yet.
    pub(super) fn new(group: CalicoGroup, w: Watched, namespace: Option<&'static str>, optional: Option<OptionalSource>) -> Resource {
        let api = api_resource(group, w);
        let writer = StoreWriter::new(api.clone());
        let reader = writer.as_reader();
        Resource { watched: w, api, namespace, optional, writer, reader, status: Status::Listing, entries: BTreeMap::new(), changed: true }
    }
}

/// Bring a resource's entries and its objects in `cluster` in line with its store: parse what
/// changed, keep the last good version of what does not parse, drop what was deleted. Returns
/// the number of object versions that failed to parse, and whether anything changed.
pub(super) fn refresh(r: &mut Resource, label: &str, cluster: &mut Cluster) -> (u64, bool) {
    let kind = r.watched.kind;
    // The model's key: a DaemonSet is `namespace/name` (one calico-node per namespace).
    let namespace = r.namespace;
    let key = move |name: &str| match namespace {
        Some(ns) if kind == Kind::DaemonSet => CalicoNodeDaemonSet::key(ns),
        _ => name.to_owned(),
    };
    let mut failures = 0;
    let mut changed = false;
    let mut seen = BTreeSet::new();
    for obj in r.reader.state() {
        let name = obj.name_any();
        let rv = obj.resource_version().unwrap_or_default();
        seen.insert(name.clone());
        if let Some(e) = r.entries.get(&name) {
            if !rv.is_empty() && e.resource_version == rv {
                continue;
            }
        }
        let e = r.entries.entry(name.clone()).or_insert_with(|| Entry {
            resource_version: String::new(),
            hash: 0,
            good: false,
            errors: Vec::new(),
            cidrs: Vec::new(),
        });
        e.resource_version = rv;
        let parsed = match serde_yaml_ng::to_value(&*obj) {
            Ok(value) => {
                let hash = hash_value(&value);
                if e.hash == hash && (e.good || !e.errors.is_empty()) {
                    continue; // nothing the model reads changed (a Node heartbeat)
                }
                e.hash = hash;
                changed = true;
                parse_alone(&value)
            }
            // Not expected: a DynamicObject always serializes.
            Err(err) => {
                changed = true;
                let cidrs = mentioned_cidrs(&serde_yaml_ng::Value::Null, Some(kind), Some(&name));
                Err(vec![Rejected::new(ModelError::NotAnObject { reason: format!("{label}/{name}: {err}") }, cidrs)])
            }
        };
        match parsed {
            Ok(one) => {
                remove(cluster, kind, &key(&name));
                merge(cluster, one);
                e.good = true;
                e.errors.clear();
                e.cidrs.clear();
            }
            Err(rejected) => {
                failures += 1;
                e.cidrs = rejected.iter().flat_map(|r| r.cidrs.iter().copied()).collect();
                e.cidrs.sort();
                e.cidrs.dedup();
                let errors: Vec<ModelError> = rejected.into_iter().map(|r| r.error).collect();
                for error in &errors {
                    tracing::warn!(
                        kind = %kind,
                        name = %name,
                        resource = %label,
                        error = %error,
                        kept_last_good = e.good,
                        "kubernetes datastore: object does not parse; skipped"
                    );
                }
                e.errors = errors;
            }
        }
    }
    r.entries.retain(|name, _| {
        let keep = seen.contains(name);
        if !keep {
            remove(cluster, kind, &key(name));
            changed = true;
        }
        keep
    });
    (failures, changed)
}

/// Remove object `name` of `kind` from `cluster`.
fn remove(cluster: &mut Cluster, kind: Kind, name: &str) {
    match kind {
        Kind::IpPool => drop(cluster.ip_pools.remove(name)),
        Kind::IpamBlock => drop(cluster.ipam_blocks.remove(name)),
        Kind::BlockAffinity => drop(cluster.block_affinities.remove(name)),
        Kind::Node => drop(cluster.nodes.remove(name)),
        Kind::FelixConfiguration => drop(cluster.felix_configurations.remove(name)),
        Kind::BgpConfiguration => drop(cluster.bgp_configurations.remove(name)),
        Kind::ClusterInformation => drop(cluster.cluster_informations.remove(name)),
        Kind::Installation => drop(cluster.installations.remove(name)),
        Kind::DaemonSet => drop(cluster.calico_node_daemonsets.remove(name)),
    }
}

/// Add every object of `one` (a one-object cluster) to `cluster`.
fn merge(cluster: &mut Cluster, one: Cluster) {
    cluster.ip_pools.extend(one.ip_pools);
    cluster.ipam_blocks.extend(one.ipam_blocks);
    cluster.block_affinities.extend(one.block_affinities);
    cluster.nodes.extend(one.nodes);
    cluster.felix_configurations.extend(one.felix_configurations);
    cluster.bgp_configurations.extend(one.bgp_configurations);
    cluster.cluster_informations.extend(one.cluster_informations);
    cluster.installations.extend(one.installations);
    cluster.calico_node_daemonsets.extend(one.calico_node_daemonsets);
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

fn hash_value(v: &Value) -> u64 {
    let mut h = DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}
