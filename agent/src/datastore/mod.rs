//! Datastores: where the cluster model comes from. The I/O edge of the pure core.
//!
//! A datastore runs as a task and sends [`DatastoreEvent`]s: complete [`Snapshot`]s of the
//! cluster, [`DatastoreEvent::Synced`] after the first complete snapshot, and
//! [`DatastoreEvent::LoadFailed`] for every input it could not read. Until `Synced` arrives the
//! datastore is **not synced**: the app must not delete routes on its view (reference S10).
//! After `Synced`, a broken input keeps its last good content in every snapshot and is listed
//! in [`Snapshot::load_errors`]; a broken object keeps its last good version and is listed in
//! [`Snapshot::object_errors`]. Each carries the CIDRs it mentions: while no good version
//! stands in for it, those CIDRs are frozen ground for the app (no deletion, no claim), and an
//! input that never loaded holds every deletion (DESIGN.md, "Bad input"). A datastore that
//! loses its source (the Kubernetes API server going away; a file datastore's files
//! vanishing, until they have stayed gone for the settle period) sends
//! [`DatastoreEvent::Unsynced`], and `Synced` again once it has re-read everything.
//!
//! [`FileDatastore`] is the embedded default (a directory of YAML files or one multi-document
//! file, as calicoctl and kubectl print them); [`KubernetesDatastore`] watches the API server.
//! Both implement the same [`Datastore`] trait and feed the same model parser.
//!
//! What a datastore reports lives in `event.rs` ([`Snapshot`], [`DatastoreEvent`], the trait),
//! what can go wrong with its inputs in `error.rs` ([`LoadError`], [`ObjectError`],
//! [`DatastoreError`]); the two datastores are the folders `file/` and `kubernetes/`.

mod error;
pub mod etcd;
mod event;
mod file;
pub mod kubernetes;

pub use error::{DatastoreError, LoadError, LoadErrorKind, ObjectError};
pub use etcd::{EtcdDatastore, EtcdOptions};
pub use event::{Datastore, DatastoreEvent, Snapshot};
pub use file::{FileDatastore, FileOptions};
pub use kubernetes::{ApiGroupChoice, CalicoGroup, KubernetesDatastore, KubernetesError, KubernetesOptions};

/// The retry delays of the datastores that read an API server (Kubernetes, etcd): 500 ms
/// doubling to 5 s, each with up to 100 % random jitter added (backon's `with_jitter`), so every
/// delay is under 10 s and agents that failed together retry apart; endless. One
/// policy, so that "recovery follows the server within one backoff step" holds for both.
pub fn retry_delays() -> backon::ExponentialBuilder {
    backon::ExponentialBuilder::default()
        .with_min_delay(std::time::Duration::from_millis(500))
        .with_max_delay(std::time::Duration::from_secs(5))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
}

/// The file datastore's synchronous core, for tests that drive it at explicit times.
#[cfg(test)]
pub(crate) type TestLoader = file::Loader;

/// A file datastore core reading `root` with `settle` (no half-write re-read).
#[cfg(test)]
pub(crate) fn file_loader_for_tests(root: std::path::PathBuf, settle: std::time::Duration) -> TestLoader {
    file::Loader::new(root, FileOptions { settle, ..FileOptions::default() }, std::time::Duration::ZERO)
}

/// The file datastore's default size limit per file, bytes (16 MiB).
pub const fn file_default_max_size() -> u64 {
    file::DEFAULT_MAX_FILE_SIZE
}
