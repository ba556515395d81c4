//! The Kubernetes datastore: the Calico objects of a live cluster, read from the API server.
//!
//! ```text
//!  GET /apis ─> choose the Calico group ─> GET /apis/<group>/<version> (6 resources served?)
//!                                                    │
//!  per resource: kube-runtime watcher (list, then watch with allowWatchBookmarks)
//!      ippools, ipamblocks, blockaffinities,          │  objects decoded trimmed (Trimmed<S>:
//!      felixconfigurations, bgpconfigurations,        │  only what the model reads; the rest skipped)
//!      clusterinformations, core nodes                ▼  Init/InitApply/InitDone/Apply/Delete
//!      optional: calico-node DaemonSets,   per object: name -> resourceVersion, content hash, errors
//!      installations (failure = finding)              │ same hash (a heartbeat): nothing
//!                                                     │ changed: parse it alone (ClusterBuilder)
//!            good: replaces that object in the kept Cluster; bad: the last good one stays
//!            a list: gathered aside, replaces the last one at InitDone
//!                                                     │ debounced (50 ms)
//!            Cluster (updated in place) ─> Snapshot ─> DatastoreEvent::{Snapshot, Synced, Unsynced}
//! ```
//!
//! Rules, and where they come from:
//!
//! - **API group.** `--calico-api-group auto` (the default) lists `/apis` once at start and reads
//!   `crd.projectcalico.org/v1` when it is served (the common case, and also when the Calico API
//!   server serves `projectcalico.org/v3` on top of it), else `projectcalico.org/v3` (clusters on
//!   Calico's native v3 CRDs). This is the operator's rule (`tigera/operator`
//!   `useV3CRDs`: "v1 present stays v1", "both present stays v1"). A cluster that migrated to v3
//!   CRDs but still has the old v1 CRDs installed must be forced with
//!   `--calico-api-group projectcalico.org/v3` (the operator detects that case from its
//!   `DatastoreMigration` object, which routewarden has no RBAC to read). The chosen group must
//!   serve all six resources with `list` and `watch`, or the datastore stays not synced and
//!   retries, saying which are missing.
//! - **Watches.** One kube-runtime [`watcher`] per resource (a list from the watch cache,
//!   [`cache_lists`], then a watch from the list's resourceVersion with
//!   `allowWatchBookmarks=true`, 290 s server timeout). A re-list is gathered aside and
//!   replaces the last one at `InitDone`, so objects deleted while the watch was down
//!   disappear then, not before (a list that fails half-way changes nothing); and deletions
//!   wait [`DEFAULT_LIST_SETTLE`] after every list, since a cached list may lag etcd.
//! - **Errors.** Any watch error (API server unreachable, 5xx, 403, `410 Gone` from an expired
//!   resourceVersion) marks the resource failed and sends [`DatastoreEvent::Unsynced`]; the
//!   watcher is restarted after [`default_backoff`] (500 ms doubling to 5 s, each delay
//!   stretched by a random 0–100 %, so under 10 s and never in step across 5,000 agents;
//!   reset by every complete list) and re-lists, so recovery follows the API server within
//!   one step (issue 23). The resource counts as synced again
//!   only when that list is complete, and [`DatastoreEvent::Synced`] follows once every
//!   resource is. While not synced the last view is kept (snapshots still flow, with the failed
//!   resources in [`Snapshot::load_errors`], so the app deletes nothing).
//! - **Objects that do not parse** are logged with kind, name and field, listed in
//!   [`Snapshot::object_errors`] (the app counts them in `routewarden_datastore_invalid_objects`)
//!   and skipped. Their last good version stays in the model until the object is deleted or
//!   fixed. Both API forms and the core Node go through the one model parser
//!   ([`ClusterBuilder::add`]) the file datastore uses.
//! - **Live changes.** Every change is a new snapshot (debounced): a `programClusterRoutes`
//!   change in FelixConfiguration or BGPConfiguration takes effect without a restart, and so
//!   does a Calico upgrade (`ClusterInformation default` `spec.calicoVersion`, read by
//!   `--calico-version auto`).
//! - **A hung API server** (TCP up, nothing answered): `GET /version` every 30 s with a 10 s
//!   limit ([`DEFAULT_PROBE`]); no answer means `Unsynced` ("API server not answering") until
//!   one comes; a second miss in a row ([`PROBE_MISSES_BEFORE_RELIST`]) restarts every watch,
//!   and every resource is re-listed before `Synced` again. A watch that is
//!   silent because the server is hung would otherwise stay silent until its 290 s timeout
//!   (kube-runtime does not hand bookmarks to its consumer, so silence cannot be timed per
//!   watch).
//! - **Optional sources** ([`optional_sources`]): the calico-node DaemonSet's env (by name, in
//!   `kube-system`, and `calico-system` on operator installs) and the operator's
//!   `Installation`. Their failures (403 without the Role) go to [`Cluster::unread`] and become
//!   `source-unreadable` findings; they never make the datastore unsynced. Each is tried once
//!   before the first `Synced`, so the first decision already includes them.
//! - **Read-only.** Only `list` and `watch` are requested ([`RBAC`], [`NAMESPACED_RBAC`]); discovery uses the
//!   non-resource URLs every authenticated client may read (`system:discovery`).
//! - **Cost.** An object is decoded trimmed (the fields the model does not read are skipped
//!   by the JSON decoder, not built), hashed, and parsed once on its own only when its
//!   trimmed content changed; the kept [`Cluster`] is updated in place and a snapshot is one
//!   clone of it (its blocks, affinities and Nodes are in `SharedMap`s: the chunks that did
//!   not change are shared, not copied), built only
//!   when something the model reads changed. A Node heartbeat costs its decode and a hash: no
//!   parse, no flush, no snapshot. Nothing scans every object per event or per flush. The
//!   debounce window (50 ms) grows to twice the time the last snapshot took, so constant
//!   churn in a very large cluster is bounded; a change that finds the datastore quiet is
//!   sent after 5 ms (kube-100k in BENCHMARKS.md: 5,000 Nodes and 100,000 blocks listed,
//!   parsed and first planned in 2.5–3 s; a change's plan p99 ~60 ms under 1,000 pod IP
//!   changes a second; 1,000 Node heartbeats a second cost ~1 % of a core).
//! - **Memory.** No object is kept: only what the model made of it (the [`Cluster`]) and, per
//!   object, its name, resourceVersion, content hash and errors. What is decoded at all is
//!   what the model reads (`trimmed.rs`): Calico objects their `metadata.name` and `spec`;
//!   Nodes their `projectcalico.org/*` annotations and `status.addresses`; the calico-node
//!   DaemonSet its containers' `name`/`env`/`envFrom`; the Installation its
//!   `clusterRoutingMode`.

//!
//! The parts, one file each: `sources.rs` what is read (groups, resources, optional sources),
//! `rbac.rs` the grants that needs, `discovery.rs` the group choice, `watch.rs` how one
//! resource is watched, `trimmed.rs` what is decoded of an object, `probe.rs` the API server
//! probe, `error.rs` the errors, `run.rs` the datastore and its async loop, and `view.rs`
//! (with `view/`) the synchronous core the loop feeds: per-object entries, last good objects,
//! sync state, snapshots.
//!
//! [`watcher`]: kube::runtime::watcher::watcher
//! [`DatastoreEvent::Unsynced`]: crate::datastore::DatastoreEvent::Unsynced
//! [`DatastoreEvent::Synced`]: crate::datastore::DatastoreEvent::Synced
//! [`Snapshot::load_errors`]: crate::datastore::Snapshot::load_errors
//! [`Snapshot::object_errors`]: crate::datastore::Snapshot::object_errors
//! [`ClusterBuilder::add`]: crate::model::ClusterBuilder::add
//! [`Cluster::unread`]: crate::model::Cluster::unread
//! [`Cluster`]: crate::model::Cluster

mod discovery;
mod error;
mod exact_value;
mod probe;
mod rbac;
mod run;
mod sources;
mod trimmed;
mod view;
mod watch;

#[cfg(test)]
mod tests;

pub use discovery::{discover, discover_operator, ApiGroupChoice};
pub use error::{describe_kube_error, KubernetesError};
pub use probe::{Probe, DEFAULT_PROBE, PROBE_MISSES_BEFORE_RELIST};
pub use rbac::{NamespacedRbacRule, RbacRule, NAMESPACED_RBAC, RBAC};
pub use run::{user_agent, KubernetesDatastore, KubernetesOptions, DEFAULT_DEBOUNCE, QUIET_COALESCE};
pub use sources::{
    optional_sources, CalicoGroup, Watched, CALICO_NODE_SELECTOR, CALICO_RESOURCES, DAEMONSET_RESOURCE, INSTALLATION_RESOURCE, NODE_RESOURCE,
    OPERATOR_API_VERSION, VERBS,
};
pub use watch::{cache_lists, default_backoff, BackoffFactory, DEFAULT_LIST_SETTLE};
