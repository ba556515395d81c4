//! Datastores: where the cluster model comes from. The I/O edge of the pure core.
//!
//! A datastore runs as a task and sends [`DatastoreEvent`]s: complete [`Snapshot`]s of the
//! cluster, [`DatastoreEvent::Synced`] after the first complete snapshot, and
//! [`DatastoreEvent::LoadFailed`] for every input it could not read. Until `Synced` arrives the
//! datastore is **not synced**: the app must not delete routes on its view (reference S10).
//! After `Synced`, a broken input keeps its last good content in every snapshot and is listed
//! in [`Snapshot::load_errors`]. A datastore that loses its source (the Kubernetes API server
//! going away) sends [`DatastoreEvent::Unsynced`], and `Synced` again once it has re-read
//! everything.
//!
//! [`FileDatastore`] is the embedded default (a directory of YAML files or one multi-document
//! file, as calicoctl and kubectl print them); [`KubernetesDatastore`] watches the API server.
//! Both implement the same [`Datastore`] trait and feed the same model parser.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;
use tokio::sync::mpsc;

use crate::model::{Cluster, ModelError};

mod file;
pub mod kubernetes;

pub use file::FileDatastore;
pub use kubernetes::{ApiGroupChoice, CalicoGroup, KubernetesDatastore, KubernetesError, KubernetesOptions};

/// Errors of the datastore module.
#[derive(Debug, thiserror::Error)]
pub enum DatastoreError {
    /// The path itself cannot be read (missing, permissions).
    #[error("datastore {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// One or more inputs could not be parsed; no snapshot was produced.
    #[error("datastore: {} input(s) could not be loaded: {}", errors.len(), errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Load { errors: Vec<LoadError> },
    /// Filesystem notifications could not be set up.
    #[error("datastore {path}: cannot watch for changes: {source}")]
    Watch { path: PathBuf, source: notify::Error },
    /// The Kubernetes datastore could not be configured or read.
    #[error(transparent)]
    Kubernetes(#[from] KubernetesError),
}

/// An input that could not be read or parsed, with the position of the problem.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, thiserror::Error)]
#[error("{}{}: {message}", file.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct LoadError {
    /// The file (or, for the Kubernetes datastore, the resource).
    pub file: PathBuf,
    /// 1-based line of a YAML syntax error, when known.
    pub line: Option<usize>,
    pub message: String,
}

impl LoadError {
    /// Stable label for metrics: `io` (unreadable) or `syntax` (not YAML).
    pub fn code(&self) -> &'static str {
        if self.line.is_some() || self.message.starts_with("YAML") {
            "syntax"
        } else {
            "io"
        }
    }
}

/// An object error ([`ModelError`]) tied to the input it came from.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {error}", file.display())]
pub struct ObjectError {
    pub file: PathBuf,
    pub error: ModelError,
}

/// A complete view of the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// Every good object of every input (broken inputs contribute their last good content).
    pub cluster: Arc<Cluster>,
    /// Objects left out, with the reason (kind, name, field).
    pub object_errors: Vec<ObjectError>,
    /// Inputs currently broken (their last good content is in `cluster`, if they had one).
    pub load_errors: Vec<LoadError>,
    /// Inputs read (files).
    pub inputs: usize,
}

/// What a datastore reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DatastoreEvent {
    /// A new complete view; sent only when something changed.
    Snapshot(Snapshot),
    /// Sent right after the first snapshot: from now on the view is trustworthy. Sent again
    /// after an [`DatastoreEvent::Unsynced`] once the view is complete and current again.
    Synced,
    /// The view stopped being current (the API server is unreachable, a watch failed and the
    /// kind is being re-listed): keep every route, delete nothing, until the next `Synced`.
    /// `reason` names the resource and the error. Sent on the transition and when the reason
    /// changes, not on every retry.
    Unsynced { reason: String },
    /// An input could not be loaded (sent once per distinct failure). Before `Synced` this
    /// means the datastore stays not synced; after, the last good state is kept.
    LoadFailed(LoadError),
}

/// A source of cluster snapshots. Implementations run until the receiver is dropped.
pub trait Datastore: Send + 'static {
    /// Human-readable description for logs (`file:/etc/routewarden/cluster`).
    fn describe(&self) -> String;

    /// Send events to `tx` until it is closed. Errors: setup failures only; load failures are
    /// reported as events.
    fn run(self, tx: mpsc::Sender<DatastoreEvent>) -> impl Future<Output = Result<(), DatastoreError>> + Send;
}
