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

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use ipnet::IpNet;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::model::{Cluster, ModelError};

mod file;
pub mod kubernetes;

pub use file::{FileDatastore, FileOptions};

/// The file datastore's synchronous core, for tests that drive it at explicit times.
#[cfg(test)]
pub(crate) type TestLoader = file::Loader;

/// A file datastore core reading `root` with `settle` (no half-write re-read).
#[cfg(test)]
pub(crate) fn file_loader_for_tests(root: PathBuf, settle: std::time::Duration) -> TestLoader {
    file::Loader::new(root, FileOptions { settle, ..FileOptions::default() }, std::time::Duration::ZERO)
}

/// The file datastore's default size limit per file, bytes (16 MiB).
pub const fn file_default_max_size() -> u64 {
    file::DEFAULT_MAX_FILE_SIZE
}
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

/// Why an input could not be used. Stable kebab-case codes ([`LoadErrorKind::code`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LoadErrorKind {
    /// The file or directory cannot be read (permissions, I/O error).
    Io,
    /// Not valid YAML (or nested past the depth limit): the line says where.
    Syntax,
    /// No document at all: empty, whitespace or comments only. An input that is empty on
    /// purpose says so with `kind: List` and `items: []`.
    Empty,
    /// Larger than the size limit (`--datastore-max-file-size`); not read.
    TooLarge,
    /// A FIFO, socket, device or directory where a file was expected; never opened.
    NotRegularFile,
    /// A file that was read before and is gone (deleted, renamed away, its directory
    /// replaced), or a symlink that now points nowhere.
    Vanished,
    /// A Kubernetes resource's watch is failing.
    Watch,
}

impl LoadErrorKind {
    /// `io`, `syntax`, `empty`, `too-large`, `not-regular-file`, `vanished`, `watch`.
    pub fn code(self) -> &'static str {
        match self {
            LoadErrorKind::Io => "io",
            LoadErrorKind::Syntax => "syntax",
            LoadErrorKind::Empty => "empty",
            LoadErrorKind::TooLarge => "too-large",
            LoadErrorKind::NotRegularFile => "not-regular-file",
            LoadErrorKind::Vanished => "vanished",
            LoadErrorKind::Watch => "watch",
        }
    }
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
    /// What kind of failure.
    pub kind: LoadErrorKind,
    /// The CIDRs and addresses the broken text mentions (as host prefixes): frozen ground
    /// while the input is broken, since the new version may want them.
    pub cidrs: Vec<IpNet>,
    /// The input never loaded: nothing it would contain is known, so no deletion anywhere can
    /// be justified while it is broken.
    pub never_loaded: bool,
}

impl LoadError {
    /// A failure of `kind` for `file` with no position, no CIDRs, that had loaded before.
    pub fn new(file: impl Into<PathBuf>, kind: LoadErrorKind, message: impl Into<String>) -> LoadError {
        LoadError { file: file.into(), line: None, message: message.into(), kind, cidrs: Vec::new(), never_loaded: false }
    }

    /// Stable label for metrics ([`LoadErrorKind::code`]).
    pub fn code(&self) -> &'static str {
        self.kind.code()
    }
}

/// An object error ([`ModelError`]) tied to the input it came from, with the CIDRs the object
/// mentions and whether its last good version stands in for it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {error}{}", file.display(), if *last_good { " (its last good version is kept)" } else { "" })]
pub struct ObjectError {
    pub file: PathBuf,
    pub error: ModelError,
    /// CIDRs and addresses the object mentions; frozen ground unless `last_good`.
    pub cidrs: Vec<IpNet>,
    /// The object's last good version is in the cluster in its place.
    pub last_good: bool,
}

impl ObjectError {
    /// The error of `rejected`, found in `file`.
    pub fn from_rejected(file: PathBuf, rejected: crate::model::Rejected) -> ObjectError {
        ObjectError { file, error: rejected.error, cidrs: rejected.cidrs, last_good: rejected.last_good }
    }
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
