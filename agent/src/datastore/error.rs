//! What can go wrong with a datastore's inputs: the datastore's own errors
//! ([`DatastoreError`]), an input that could not be read or parsed ([`LoadError`], with its
//! stable [`LoadErrorKind`] code), and an object the model left out, tied to its input
//! ([`ObjectError`]).

use std::path::PathBuf;

use ipnet::IpNet;
use serde::Serialize;

use super::kubernetes::KubernetesError;
use crate::model::ModelError;

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
    /// The etcd datastore is misconfigured.
    #[error("datastore etcd: {0}")]
    Etcd(String),
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
    /// The view was found stale: a Kubernetes watch delivered neither an event nor a bookmark
    /// for longer than `--kube-watch-silence`, or the API server did not answer the probe.
    Stale,
}

impl LoadErrorKind {
    /// Every kind, in the enum's order (with `object`, the `reason` label values of
    /// `routewarden_datastore_load_errors_total`, declared at 0 from the start).
    pub const ALL: [LoadErrorKind; 8] = [
        LoadErrorKind::Io,
        LoadErrorKind::Syntax,
        LoadErrorKind::Empty,
        LoadErrorKind::TooLarge,
        LoadErrorKind::NotRegularFile,
        LoadErrorKind::Vanished,
        LoadErrorKind::Watch,
        LoadErrorKind::Stale,
    ];

    /// `io`, `syntax`, `empty`, `too-large`, `not-regular-file`, `vanished`, `watch`, `stale`.
    pub fn code(self) -> &'static str {
        match self {
            LoadErrorKind::Io => "io",
            LoadErrorKind::Syntax => "syntax",
            LoadErrorKind::Empty => "empty",
            LoadErrorKind::TooLarge => "too-large",
            LoadErrorKind::NotRegularFile => "not-regular-file",
            LoadErrorKind::Vanished => "vanished",
            LoadErrorKind::Watch => "watch",
            LoadErrorKind::Stale => "stale",
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
