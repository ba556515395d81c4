//! What a datastore reports: complete [`Snapshot`]s of the cluster and the sync transitions
//! around them ([`DatastoreEvent`]), and the [`Datastore`] trait every source implements.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::mpsc;

use super::error::{DatastoreError, LoadError, ObjectError};
use crate::model::Cluster;

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
    /// The inputs have been stable for the settle period, so what is absent from them is
    /// evidence for deleting routes. The file datastore sends `false` after every change
    /// (files are written in pieces: a half-written or truncated file can read as a valid
    /// one that lacks objects or fields) and a new snapshot once settled; the Kubernetes
    /// datastore (whole objects, no partial writes) always `true`.
    pub settled: bool,
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
