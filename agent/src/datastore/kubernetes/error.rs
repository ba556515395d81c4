//! Errors of the Kubernetes datastore ([`KubernetesError`]) and the one-line descriptions of
//! kube and watcher errors used in them, in logs and in `Unsynced` reasons.

use std::path::PathBuf;
use std::time::Duration;

use kube::runtime::watcher;

use super::resources::CalicoGroup;

/// A kube error in one line: the API server's answer as `message (code reason)`, anything else
/// with its causes once ([`crate::text::causes_once`]).
pub fn describe_kube_error(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({} {})", s.message, s.code, s.reason),
        other => crate::text::causes_once(other),
    }
}

/// Errors of the Kubernetes datastore.
#[derive(Debug, thiserror::Error)]
pub enum KubernetesError {
    /// `--kubeconfig` could not be read or used.
    #[error("kubeconfig {}: {source}", path.display())]
    Kubeconfig { path: PathBuf, source: kube::config::KubeconfigError },
    /// Neither a kubeconfig nor the in-cluster service account is available.
    #[error("no Kubernetes client configuration (KUBECONFIG, ~/.kube/config or the in-cluster service account): {source}")]
    InferConfig { source: kube::config::InferConfigError },
    /// The HTTP client could not be built from the configuration (TLS, proxy).
    #[error("Kubernetes client: {source}")]
    Client { source: kube::Error },
    /// A discovery request failed. The cause is printed with each link of its chain once
    /// ([`crate::text::causes_once`]), and is deliberately not an error `source` (printers that walk the
    /// chain would repeat it).
    #[error("API discovery {request}: {}", describe_kube_error(cause))]
    Discovery { request: String, cause: kube::Error },
    /// `/apis` lists neither Calico group.
    #[error("the API server serves neither crd.projectcalico.org/v1 nor projectcalico.org/v3: are Calico's CRDs installed?")]
    NoCalicoGroup,
    /// The chosen group lacks resources routewarden reads.
    #[error("{group} does not serve {} with list and watch{hint}", missing.join(", "), hint = match group { CalicoGroup::V3 => " (the Calico API server may not serve IPAM objects; try --calico-api-group crd.projectcalico.org/v1)", CalicoGroup::CrdV1 => "" })]
    MissingResources { group: CalicoGroup, missing: Vec<&'static str> },
    /// A one-shot list failed (`explain`, `audit`); printed as [`KubernetesError::Discovery`].
    #[error("list {resource}: {}", cause.describe())]
    List { resource: String, cause: WatchFailure },
    /// `--calico-api-group` value.
    #[error("unknown Calico API group {0:?}: expected auto, crd.projectcalico.org/v1 or projectcalico.org/v3")]
    UnknownApiGroup(String),
}

/// A one-line description of a watcher error (each cause once): what failed, then the API server's message,
/// HTTP code and reason (`list failed: apiserver is shutting down (503 ServiceUnavailable)`).
pub(crate) fn describe_watch_error(e: &watcher::Error) -> String {
    let status = |s: &kube::core::Status| format!("{} ({} {})", s.message, s.code, s.reason);
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s)) => format!("list failed: {}", status(s)),
        watcher::Error::InitialListFailed(other) => format!("list failed: {}", crate::text::causes_once(other)),
        watcher::Error::WatchStartFailed(kube::Error::Api(s)) => format!("watch failed to start: {}", status(s)),
        watcher::Error::WatchStartFailed(other) => format!("watch failed to start: {}", crate::text::causes_once(other)),
        watcher::Error::WatchError(s) => format!("watch ended with an error: {}", status(s)),
        watcher::Error::WatchFailed(other) => format!("watch failed: {}", crate::text::causes_once(other)),
        watcher::Error::NoResourceVersion => e.to_string(),
    }
}

/// Why one resource's list and watch ended ([`super::watch::list_watch`]).
#[derive(Debug)]
pub enum WatchFailure {
    /// The list or the watch failed (kube-runtime's error kinds, so that they read the same
    /// as kube's own watcher's).
    Kube(watcher::Error),
    /// The watch delivered neither an event nor a bookmark for `silent`, although the API
    /// server had sent it bookmarks: the watch is hung (the server's watch cache stalled, a
    /// proxy holding the stream) and the view may be missing changes.
    Silent { silent: Duration },
}

impl From<watcher::Error> for WatchFailure {
    fn from(e: watcher::Error) -> WatchFailure {
        WatchFailure::Kube(e)
    }
}

impl WatchFailure {
    /// The API server answered `404 Not Found` to the list or the watch: the resource is not
    /// served (its CRD or its API group went away), which calls for discovery again.
    pub fn is_not_found(&self) -> bool {
        match self {
            WatchFailure::Kube(
                watcher::Error::InitialListFailed(kube::Error::Api(s)) | watcher::Error::WatchStartFailed(kube::Error::Api(s)) | watcher::Error::WatchError(s),
            ) => s.code == 404,
            _ => false,
        }
    }

    /// One line, each cause once: [`describe_watch_error`], or `stale: no event and no
    /// bookmark for 90 s (…)`.
    pub fn describe(&self) -> String {
        match self {
            WatchFailure::Kube(e) => describe_watch_error(e),
            WatchFailure::Silent { silent } => {
                format!("stale: no event and no bookmark for {} s although the API server sends a bookmark every 60 s; re-listing", silent.as_secs())
            }
        }
    }
}
