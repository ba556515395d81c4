//! The Kubernetes datastore: the Calico objects of a live cluster, read from the API server
//! with `list` and `watch` only ([`RBAC`], [`NAMESPACED_RBAC`]).
//!
//! - **API group.** `--calico-api-group auto` reads `crd.projectcalico.org/v1` when served,
//!   else `projectcalico.org/v3`: the operator's rule (`tigera/operator` `useV3CRDs`). The
//!   chosen group must serve all six resources, or the datastore stays not synced, naming them.
//! - **Watches.** One [`watcher`] per resource: a streaming list (`sendInitialEvents=true`,
//!   [`streaming_lists`]: the current state as the watch's first events, one object at a time),
//!   falling back to a cached list ([`cache_lists`]) then a watch where the API server refuses
//!   it; bookmarks on. A re-list is gathered aside and replaces the last at
//!   `InitDone`, so a list that fails half-way changes nothing, and deletions wait
//!   [`DEFAULT_LIST_SETTLE`] after every list, since a cached list may lag etcd.
//! - **Errors.** A watch error sends [`DatastoreEvent::Unsynced`] and restarts the watcher after
//!   [`default_backoff`] (jittered, so 5,000 agents never re-list in step); [`DatastoreEvent::Synced`]
//!   follows once every resource has a complete list. The last view is kept meanwhile, with
//!   the failed resources in [`Snapshot::load_errors`], so the app deletes nothing. A hung
//!   server is found by [`DEFAULT_PROBE`] (kube-runtime hands no bookmarks to its consumer,
//!   so silence cannot be timed per watch); [`PROBE_MISSES_BEFORE_RELIST`] misses restart every
//!   watch.
//! - **Objects.** Decoded trimmed to what the model reads (`trimmed.rs`), hashed, and parsed
//!   alone ([`ClusterBuilder::add`], the file datastore's parser) only when that changed: a
//!   Node heartbeat is no parse and no snapshot. One that does not parse is in
//!   [`Snapshot::object_errors`] and its last good version stays. No object is kept, only the
//!   [`Cluster`] (updated in place, its large maps sharing unchanged chunks) and per object its
//!   name, resourceVersion, hash and errors. Snapshots are debounced (50 ms, or twice the last
//!   flush's time, so constant churn stays bounded; 5 ms when the datastore was quiet).
//! - **Optional sources** ([`optional_sources`]): the calico-node DaemonSet's env and the
//!   operator's `Installation`. A failure (403) goes to [`Cluster::unread`] as a finding, never
//!   unsyncs; each is tried once before the first `Synced`.
//!
//! The parts, one file each: `resources.rs` what is read (groups, resources, optional sources),
//! `rbac.rs` the grants that needs, `discovery.rs` the group choice, `watch.rs` how one
//! resource is watched, `trimmed.rs` what is decoded of an object (`presized_value.rs` its
//! `spec`), `probe.rs` the API server probe, `error.rs` the errors, `run.rs` the datastore and
//! its async loop, and `view.rs` (with `view/`) the synchronous core the loop feeds.
//!
//! [`watcher`]: kube::runtime::watcher::watcher
//! [`DatastoreEvent::Unsynced`]: crate::datastore::DatastoreEvent::Unsynced
//! [`DatastoreEvent::Synced`]: crate::datastore::DatastoreEvent::Synced
//! [`Snapshot::load_errors`]: crate::datastore::Snapshot::load_errors
//! [`Snapshot::object_errors`]: crate::datastore::Snapshot::object_errors
//! [`ClusterBuilder::add`]: crate::model::ClusterBuilder::add
//! [`Cluster::unread`]: crate::model::Cluster::unread
//! [`Cluster`]: crate::model::Cluster

/// Calico Nodes as the core Nodes a Kubernetes-datastore cluster serves: for tests only.
#[cfg(any(test, feature = "test-support"))]
pub mod calico_node;
mod discovery;
mod error;
mod presized_value;
mod probe;
mod rbac;
mod resources;
mod run;
mod trimmed;
mod view;
mod watch;

#[cfg(test)]
mod tests;

pub use discovery::{discover, discover_operator, ApiGroupChoice};
pub use error::{describe_kube_error, KubernetesError};
pub use probe::{Probe, DEFAULT_PROBE, PROBE_MISSES_BEFORE_RELIST};
pub use rbac::{NamespacedRbacRule, RbacRule, NAMESPACED_RBAC, RBAC};
pub use resources::{
    optional_sources, CalicoGroup, Watched, CALICO_NODE_SELECTOR, CALICO_RESOURCES, DAEMONSET_RESOURCE, INSTALLATION_RESOURCE, NODE_RESOURCE,
    OPERATOR_API_VERSION, VERBS,
};
pub use run::{user_agent, KubernetesDatastore, KubernetesOptions, DEFAULT_DEBOUNCE, DEFAULT_DISCOVERY_INTERVAL, QUIET_COALESCE};
pub use watch::{cache_lists, default_backoff, streaming_lists, BackoffFactory, DEFAULT_LIST_SETTLE};
