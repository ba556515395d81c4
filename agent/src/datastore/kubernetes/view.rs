//! The synchronous core of the Kubernetes datastore: watcher events of trimmed objects
//! ([`TrimmedObject`]) in, the last good version of every object kept in one [`Cluster`]
//! updated in place, sync state, and what to send. No I/O; the async loop (`run.rs`) only
//! moves events in and out. No object is kept once it is looked at: per object only its
//! name, resourceVersion, content hash and errors ([`store::Entry`]).
//!
//! The parts: `view/store.rs` owns one resource's entries and how an event changes the
//! cluster (a heartbeat costs a hash, a change one parse, a list is gathered aside until
//! `InitDone`). This file holds the view over all resources: sync state, list settle, probe
//! staleness, and building snapshots.
//!
//! [`TrimmedObject`]: super::trimmed::TrimmedObject

mod store;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::runtime::watcher::Event;

use super::error::WatchFailure;
use super::resources::{CalicoGroup, CALICO_NODE_SELECTOR, CALICO_RESOURCES, DAEMONSET_RESOURCE, INSTALLATION_RESOURCE, NODE_RESOURCE};
use super::trimmed::TrimmedObject;
use super::watch::{WatchItem, WatchTarget};
use crate::datastore::error::{LoadError, LoadErrorKind, ObjectError};
use crate::datastore::event::{DatastoreEvent, Snapshot};
use crate::model::{check_blocks, check_pools, CalicoGroupChange, Cluster, Kind, OptionalSource};
use store::{Resource, Status};

/// See the module docs.
#[expect(clippy::struct_excessive_bools, reason = "independent flags of one state machine, each documented")]
pub(crate) struct View {
    /// The Calico group read.
    group: CalicoGroup,
    resources: Vec<Resource>,
    /// The last good version of every object, updated in place (a snapshot is a clone, never
    /// a re-parse of every object).
    cluster: Cluster,
    /// Something changed since the last flush.
    dirty: bool,
    /// The cluster or an object error changed since the last snapshot was considered.
    model_changed: bool,
    /// A resource's sync status changed since the last refresh.
    status_changed: bool,
    /// `Synced` was sent and no `Unsynced` since.
    announced_synced: bool,
    /// A first complete view was reached (snapshots may flow from then on).
    ever_synced: bool,
    /// The last `Unsynced` reason sent (not repeated while unchanged).
    last_unsynced: Option<String>,
    /// The last snapshot sent.
    last_sent: Option<Snapshot>,
    /// Object versions handed to the model parser, since start (a heartbeat is never one).
    pub(crate) parses: u64,
    /// Of those, versions that failed to parse.
    pub(crate) parse_failures: u64,
    /// How long after a list completes its absences are not yet evidence for deleting routes
    /// (lists come from the API server's watch cache, which may lag etcd).
    list_settle: Duration,
    /// Until when the last completed list is settling (`None`: settled).
    settling_until: Option<Instant>,
    /// The API server does not answer the probe: not synced whatever the watches say.
    stale: Option<String>,
}

impl View {
    /// A view of the six Calico resources in `group`, the core Nodes and the `optional`
    /// sources (in that order), nothing listed yet.
    pub(crate) fn new(group: CalicoGroup, optional: &[OptionalSource]) -> View {
        let resources = CALICO_RESOURCES
            .iter()
            .chain(std::iter::once(&NODE_RESOURCE))
            .map(|w| Resource::new(group, *w, None, None))
            .chain(optional.iter().map(|source| optional_resource(group, *source)))
            .collect();
        View {
            group,
            resources,
            cluster: Cluster::default(),
            dirty: false,
            model_changed: false,
            status_changed: false,
            announced_synced: false,
            ever_synced: false,
            last_unsynced: None,
            last_sent: None,
            parses: 0,
            parse_failures: 0,
            list_settle: Duration::ZERO,
            settling_until: None,
            stale: None,
        }
    }

    /// Hold deletions for `settle` after every completed list ([`Snapshot::settled`] false).
    #[must_use]
    pub(crate) fn with_list_settle(mut self, settle: Duration) -> View {
        self.list_settle = settle;
        self
    }

    /// When the current list settle ends, if one is running: the run loop flushes then, so
    /// that a snapshot with `settled: true` follows.
    pub(crate) fn settle_deadline(&self) -> Option<Instant> {
        self.settling_until
    }

    /// What each watcher reads, indexed as [`View::apply`] expects.
    pub(crate) fn targets(&self) -> Vec<WatchTarget> {
        self.resources
            .iter()
            .map(|r| WatchTarget {
                api: r.api.clone(),
                namespace: r.namespace,
                kind: r.watched.kind,
                field_selector: (r.watched.kind == Kind::DaemonSet).then_some(CALICO_NODE_SELECTOR),
                optional: r.optional,
            })
            .collect()
    }

    /// The Calico group read.
    pub(crate) fn group(&self) -> CalicoGroup {
        self.group
    }

    /// Whether resource `index` is read (a withdrawn source is not: no watch for it).
    pub(crate) fn is_read(&self, index: usize) -> bool {
        self.resources.get(index).is_some_and(|r| r.status != Status::Withdrawn)
    }

    /// The optional source resource `index` reads, if it is one.
    pub(crate) fn optional_at(&self, index: usize) -> Option<OptionalSource> {
        self.resources.get(index).and_then(|r| r.optional)
    }

    /// Whether resource `index` has failed with `description` ([`WatchFailure::describe`]) and
    /// not listed since.
    pub(crate) fn failed_with(&self, index: usize, description: &str) -> bool {
        let Some(r) = self.resources.get(index) else { return false };
        match &r.status {
            Status::Failed(f) if r.optional.is_some() => f == description,
            Status::Failed(f) => *f == format!("{}: {description}", self.resource_label(index)),
            _ => false,
        }
    }

    /// Whether optional `source` is read now (added, and not withdrawn since).
    pub(crate) fn reads(&self, source: OptionalSource) -> bool {
        self.resources.iter().any(|r| r.optional == Some(source) && r.status != Status::Withdrawn)
    }

    /// Start reading optional `source` (its API group is served now): a resource that lists
    /// from scratch, appended or the withdrawn one again; its `source-withdrawn` finding goes.
    /// Returns its index (the run loop starts its watch), or `None` when it is read already.
    /// The view stays synced meanwhile: an optional source never unsyncs it, and `Synced` is
    /// not sent again (the snapshot gains the source's objects when its list completes).
    pub(crate) fn add_source(&mut self, source: OptionalSource) -> Option<usize> {
        if self.reads(source) {
            return None;
        }
        let index = self.resources.iter().position(|r| r.optional == Some(source)).unwrap_or_else(|| {
            self.resources.push(optional_resource(self.group, source));
            self.resources.len() - 1
        });
        self.resources[index] = optional_resource(self.group, source);
        if self.cluster.api_changes.withdrawn.remove(&source).is_some() {
            self.model_changed = true;
        }
        self.status_changed = true;
        self.dirty = true;
        Some(index)
    }

    /// Stop reading optional `source`: its API group `api_version` is no longer served. Its
    /// objects leave the cluster (they only ever yield findings or an env Felix reads, never
    /// a route by themselves), its `source-unreadable` finding goes, and `source-withdrawn`
    /// names the group. Returns its index (the run loop stops its watch), or `None` when it
    /// was not read. Never unsyncs: the Calico resources and their watches are untouched.
    pub(crate) fn withdraw_source(&mut self, source: OptionalSource, api_version: &'static str) -> Option<usize> {
        let index = self.resources.iter().position(|r| r.optional == Some(source) && r.status != Status::Withdrawn)?;
        let r = &mut self.resources[index];
        r.drop_all(&mut self.cluster);
        r.status = Status::Withdrawn;
        self.cluster.unread.remove(&source);
        self.cluster.api_changes.withdrawn.insert(source, api_version);
        self.model_changed = true;
        self.status_changed = true;
        self.dirty = true;
        Some(index)
    }

    /// The Calico group `auto` would choose now, when it is not the one read (`None`: it is,
    /// or the group is forced): the `api-group-changed` finding.
    /// True when it changed.
    pub(crate) fn set_calico_group_change(&mut self, change: Option<CalicoGroupChange>) -> bool {
        if self.cluster.api_changes.calico_group == change {
            return false;
        }
        self.cluster.api_changes.calico_group = change;
        self.model_changed = true;
        self.dirty = true;
        true
    }

    /// `ipamblocks.crd.projectcalico.org` (kubectl's resource.group form); `nodes` for Nodes;
    /// `daemonsets.apps/kube-system` for a namespaced read.
    pub(crate) fn resource_label(&self, index: usize) -> String {
        let r = &self.resources[index];
        let base = if r.api.group.is_empty() { r.api.plural.clone() } else { format!("{}.{}", r.api.plural, r.api.group) };
        match r.namespace {
            Some(ns) => format!("{base}/{ns}"),
            None => base,
        }
    }

    /// True when every required resource has completed a list since its last failure and
    /// every optional one was tried once (listed, or failed and recorded as unread).
    pub(crate) fn all_ready(&self) -> bool {
        self.stale.is_none() && self.resources.iter().all(|r| r.status == Status::Ready || (r.optional.is_some() && r.status != Status::Listing))
    }

    /// True when a flush may have something to send.
    pub(crate) fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// Apply one watcher item for resource `index`. Returns what must be sent now (an
    /// `Unsynced` on a failure); everything else waits for [`View::flush`]. An object whose
    /// trimmed content did not change (a Node heartbeat) leaves the view clean: no parse, no
    /// flush, no snapshot.
    pub(crate) fn apply(&mut self, index: usize, item: WatchItem<TrimmedObject>) -> Vec<DatastoreEvent> {
        let label = self.resource_label(index);
        let r = &mut self.resources[index];
        if r.status == Status::Withdrawn {
            // An item its watch had in flight when it was stopped.
            return Vec::new();
        }
        match item {
            Ok(event) => {
                let done = matches!(event, Event::InitDone);
                let applied = r.apply(event, &label, &mut self.cluster);
                self.parses += applied.parses;
                self.parse_failures += applied.failures;
                if applied.changed {
                    self.model_changed = true;
                    self.dirty = true;
                }
                if done {
                    if r.status != Status::Ready {
                        tracing::info!(resource = %label, objects = r.entries.len(), "kubernetes datastore: listed");
                        self.status_changed = true;
                    }
                    if let Some(source) = r.optional {
                        self.cluster.unread.remove(&source);
                    }
                    if !self.list_settle.is_zero() {
                        self.settling_until = Some(Instant::now() + self.list_settle);
                    }
                    r.status = Status::Ready;
                    self.dirty = true;
                }
                Vec::new()
            }
            Err(e) if r.optional.is_some() => {
                // An optional source: recorded as unread (a finding), never unsynced. What was
                // read before stays (the entries keep it until a re-list completes).
                let reason = e.describe();
                if r.status != Status::Failed(reason.clone()) {
                    tracing::warn!(resource = %label, error = %reason, "kubernetes datastore: cannot read an optional source; deciding without it (finding source-unreadable), retrying after backoff");
                    r.status = Status::Failed(reason.clone());
                    self.status_changed = true;
                    self.dirty = true;
                    if let Some(source) = r.optional {
                        self.cluster.unread.insert(source, reason);
                    }
                }
                Vec::new()
            }
            Err(e) => {
                let reason = format!("{label}: {}", e.describe());
                tracing::warn!(resource = %label, error = %e.describe(), "kubernetes datastore: watch failed; keeping the last view, re-listing after backoff");
                r.status = Status::Failed(reason.clone());
                self.dirty = true;
                self.status_changed = true;
                let mut out = self.unsynced(&reason);
                if matches!(e, WatchFailure::Silent { .. }) {
                    out.push(stale_event(label, &reason));
                }
                out
            }
        }
    }

    /// The API server stopped answering and every watch was restarted: every resource lists
    /// again (required ones count as failed with `reason` until then, so no `Synced` and no
    /// deletion before every list is complete). Returns the `Unsynced` to send.
    pub(crate) fn restart_all(&mut self, reason: &str) -> Vec<DatastoreEvent> {
        for r in self.resources.iter_mut().filter(|r| r.status != Status::Withdrawn) {
            r.status = if r.optional.is_some() { Status::Listing } else { Status::Failed(reason.to_owned()) };
        }
        self.dirty = true;
        self.status_changed = true;
        self.unsynced(reason)
    }

    /// The probe's verdict: `Some(reason)` when the API server did not answer (not synced
    /// until it does; returns the `Unsynced` to send), `None` when it answered (a flush sends
    /// `Synced` again once every resource is listed).
    pub(crate) fn set_stale(&mut self, reason: Option<&str>) -> Vec<DatastoreEvent> {
        let changed = self.stale.as_deref() != reason;
        self.stale = reason.map(str::to_owned);
        if !changed {
            return Vec::new();
        }
        self.dirty = true;
        self.status_changed = true;
        match reason {
            Some(reason) => {
                let mut out = self.unsynced(reason);
                out.push(stale_event("kubernetes API server".to_owned(), reason));
                out
            }
            None => Vec::new(),
        }
    }

    /// Not synced for `reason`: the `Unsynced` to send, unless it was just sent.
    fn unsynced(&mut self, reason: &str) -> Vec<DatastoreEvent> {
        let send = self.announced_synced || self.last_unsynced.as_deref() != Some(reason);
        self.announced_synced = false;
        if send {
            self.last_unsynced = Some(reason.to_owned());
            vec![DatastoreEvent::Unsynced { reason: reason.to_owned() }]
        } else {
            Vec::new()
        }
    }

    /// End of a debounce window: a snapshot when the view changed (never before the first
    /// complete list of every resource), then `Synced` when every resource is listed and it was
    /// not announced yet.
    pub(crate) fn flush(&mut self) -> Vec<DatastoreEvent> {
        self.dirty = false;
        let settle_ended = self.settling_until.is_some_and(|t| Instant::now() >= t);
        if settle_ended {
            self.settling_until = None;
        }
        let ready = self.all_ready();
        if !ready && !self.ever_synced {
            return Vec::new();
        }
        let mut out = Vec::new();
        // Building a snapshot clones the cluster: only when something the model reads changed
        // (or the list settle ended, which changes `settled`).
        if self.take_changed() || self.last_sent.is_none() || settle_ended {
            let snap = self.build();
            if self.last_sent.as_ref() != Some(&snap) {
                self.last_sent = Some(snap.clone());
                out.push(DatastoreEvent::Snapshot(snap));
            }
        }
        if ready && !self.announced_synced {
            self.announced_synced = true;
            self.ever_synced = true;
            self.last_unsynced = None;
            out.push(DatastoreEvent::Synced);
        }
        out
    }

    /// The current snapshot: every object's last good version, the objects that do not parse,
    /// and the resources whose watch is failing.
    pub(crate) fn snapshot(&mut self) -> Snapshot {
        self.take_changed();
        self.build()
    }

    /// True when the model, an object error or a sync status changed since the last call.
    /// Nothing is scanned: the events marked it as they were applied.
    fn take_changed(&mut self) -> bool {
        std::mem::take(&mut self.status_changed) | std::mem::take(&mut self.model_changed)
    }

    /// The snapshot of the current state (clones the cluster: its IPAM blocks, affinities and
    /// Nodes share their maps' chunks, so O(chunks), ~3,200 at 100,000 blocks). IP pools that
    /// overlap another are taken out here ([`check_pools`]), then IPAM blocks that overlap
    /// another block or are not of their pool's `blockSize` ([`check_blocks`]), as the file
    /// datastore does (`ClusterBuilder::finish`), each named `<resource>/<name>`.
    fn build(&self) -> Snapshot {
        let mut object_errors = Vec::new();
        let mut load_errors = Vec::new();
        let mut inputs = 0;
        let (mut pool_resource, mut block_resource) = (String::new(), String::new());
        for (index, r) in self.resources.iter().enumerate() {
            let label = self.resource_label(index);
            match r.watched.kind {
                Kind::IpPool => pool_resource.clone_from(&label),
                Kind::IpamBlock => block_resource.clone_from(&label),
                _ => {}
            }
            inputs += r.entries.len();
            for (name, e) in r.errored.iter().filter_map(|name| Some((name, r.entries.get(name)?))) {
                let Some(problem) = &e.problem else { continue };
                let file = PathBuf::from(format!("{label}/{name}"));
                object_errors.extend(problem.errors.iter().map(|error| ObjectError {
                    file: file.clone(),
                    error: error.clone(),
                    cidrs: if e.good { Vec::new() } else { problem.cidrs.clone() },
                    last_good: e.good,
                }));
            }
            if let (Status::Failed(reason), None) = (&r.status, r.optional) {
                load_errors.push(LoadError::new(label, LoadErrorKind::Watch, reason.clone()));
            }
        }
        let mut cluster = self.cluster.clone();
        let pools = check_pools(&mut cluster.ip_pools);
        let blocks = check_blocks(&cluster.ip_pools, &mut cluster.ipam_blocks);
        for (resource, r) in pools.into_iter().map(|r| (&pool_resource, r)).chain(blocks.into_iter().map(|r| (&block_resource, r))) {
            let name = r.error.object().map(|(_, n)| n.to_owned()).unwrap_or_default();
            object_errors.push(ObjectError::from_rejected(PathBuf::from(format!("{resource}/{name}")), r));
        }
        // A list served from the watch cache is a consistent view at its resourceVersion, which
        // may be behind etcd: what it lacks is evidence for deleting routes only once the
        // watch from that version has had time to deliver what happened since.
        let settled = self.settling_until.is_none_or(|t| Instant::now() >= t);
        Snapshot { cluster: Arc::new(cluster), object_errors, load_errors, inputs, settled }
    }
}

/// The resource that reads optional `source`, nothing listed yet.
fn optional_resource(group: CalicoGroup, source: OptionalSource) -> Resource {
    match source {
        OptionalSource::Installation => Resource::new(group, INSTALLATION_RESOURCE, None, Some(source)),
        OptionalSource::CalicoNodeEnv(ns) => Resource::new(group, DAEMONSET_RESOURCE, Some(ns), Some(source)),
    }
}

/// The view was found stale (a watch went silent, or the API server stopped answering):
/// counted as `routewarden_datastore_load_errors_total{reason="stale"}` (the `Unsynced` sent
/// with it is what holds deletions).
fn stale_event(resource: String, reason: &str) -> DatastoreEvent {
    DatastoreEvent::LoadFailed(LoadError::new(resource, LoadErrorKind::Stale, reason))
}
