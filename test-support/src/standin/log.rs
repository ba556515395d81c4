//! The stand-in's request log: every request with what decides how it is served and who made
//! it with which token, and every TLS handshake that failed.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use super::request::{Query, RequestInfo};

/// What a logged request was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestKind {
    /// A non-resource URL: `/version`, `/api`, `/apis`, `/apis/<group>/<version>`.
    Discovery,
    /// A list of a collection.
    List,
    /// A watch (`watch=true`).
    Watch,
    /// A get of one object.
    Get,
    /// Anything else (refused, or not served).
    Other,
}

/// One request as the stand-in saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedRequest {
    /// When it arrived.
    pub at: Instant,
    pub kind: RequestKind,
    /// `GET`, ...
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The authorizer's verb (`get`, `list`, `watch`).
    pub verb: String,
    /// `""` for non-resource URLs.
    pub resource: String,
    pub api_group: String,
    pub namespace: Option<String>,
    /// The object's name (from the path, or a `metadata.name` field selector).
    pub name: Option<String>,
    /// `resourceVersion`.
    pub resource_version: Option<String>,
    /// `resourceVersionMatch` (`NotOlderThan`, `Exact`).
    pub resource_version_match: Option<String>,
    /// `limit` (page size).
    pub limit: Option<String>,
    /// `continue` (a page token).
    pub continue_token: Option<String>,
    /// `fieldSelector`.
    pub field_selector: Option<String>,
    /// `watch=true`.
    pub watch: bool,
    /// `allowWatchBookmarks=true`.
    pub allow_watch_bookmarks: bool,
    /// `sendInitialEvents=true`.
    pub send_initial_events: bool,
    /// The bearer token sent, if any.
    pub token: Option<String>,
    /// The user it authenticated as (`None`: not authenticated, answered 401).
    pub user: Option<String>,
    /// The HTTP status of the answer (200 for a watch that started, even when its first event
    /// is an error).
    pub status: u16,
    /// Bytes of the answer's body (0 for a watch).
    pub bytes: usize,
}

impl LoggedRequest {
    pub(crate) fn new(method: &http::Method, info: &RequestInfo, query: &Query, token: Option<String>) -> LoggedRequest {
        let owned = |k: &str| query.get(k).map(str::to_owned);
        LoggedRequest {
            at: Instant::now(),
            kind: RequestKind::Other,
            method: method.as_str().to_owned(),
            path: info.path.clone(),
            verb: info.verb.clone(),
            resource: info.resource.clone(),
            api_group: info.api_group.clone(),
            namespace: info.namespace.clone(),
            name: info.name.clone(),
            resource_version: owned("resourceVersion"),
            resource_version_match: owned("resourceVersionMatch"),
            limit: owned("limit"),
            continue_token: owned("continue"),
            field_selector: owned("fieldSelector"),
            watch: query.flag("watch"),
            allow_watch_bookmarks: query.flag("allowWatchBookmarks"),
            send_initial_events: query.flag("sendInitialEvents"),
            token,
            user: None,
            status: 0,
            bytes: 0,
        }
    }

    /// A list the API server serves from its watch cache: `resourceVersion=0` (any version,
    /// `NotOlderThan` or unset match), not a quorum read from etcd.
    pub fn from_cache(&self) -> bool {
        self.resource_version.as_deref() == Some("0") && self.resource_version_match.as_deref().is_none_or(|m| m == "NotOlderThan")
    }

    /// `rv<resourceVersion>+<resourceVersionMatch>` (`none` for an absent one), e.g.
    /// `rv0+NotOlderThan`, for a result line.
    pub fn version_label(&self) -> String {
        format!("rv{}+{}", self.resource_version.as_deref().unwrap_or("none"), self.resource_version_match.as_deref().unwrap_or("none"))
    }

    /// What the request was for, in a summary: the plural (`nodes`, `daemonsets/kube-system`
    /// for a namespaced one), or the path of a non-resource URL (`/version`).
    pub fn target(&self) -> String {
        if self.resource.is_empty() {
            self.path.clone()
        } else {
            match &self.namespace {
                Some(ns) => format!("{}/{ns}", self.resource),
                None => self.resource.clone(),
            }
        }
    }

    /// Refused by authentication (401) or authorization (403).
    pub fn refused(&self) -> bool {
        matches!(self.status, 401 | 403)
    }
}

/// The request log, shared by every clone of the server.
#[derive(Clone, Debug, Default)]
pub struct RequestLog {
    requests: Arc<Mutex<Vec<LoggedRequest>>>,
    tls_failures: Arc<Mutex<Vec<String>>>,
}

impl RequestLog {
    pub(crate) fn push(&self, r: LoggedRequest) {
        self.requests.lock().unwrap_or_else(PoisonError::into_inner).push(r);
    }

    pub(crate) fn tls_failure(&self, what: String) {
        self.tls_failures.lock().unwrap_or_else(PoisonError::into_inner).push(what);
    }

    /// Every request so far, in order.
    pub fn entries(&self) -> Vec<LoggedRequest> {
        self.requests.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The TLS handshakes that failed (`<peer>: <rustls error>`), in order.
    pub fn tls_failures(&self) -> Vec<String> {
        self.tls_failures.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The list requests so far.
    pub fn lists(&self) -> Vec<LoggedRequest> {
        self.entries().into_iter().filter(|r| r.kind == RequestKind::List).collect()
    }

    /// The list requests counted by [`LoggedRequest::version_label`], for a result line:
    /// `rv0+NotOlderThan:8` (labels joined by `,`; `none` without lists).
    pub fn list_versions(&self) -> String {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for r in self.lists() {
            *counts.entry(r.version_label()).or_default() += 1;
        }
        if counts.is_empty() {
            return "none".into();
        }
        counts.iter().map(|(k, n)| format!("{k}:{n}")).collect::<Vec<_>>().join(",")
    }

    /// The requests by verb and target, then how many the authorizer refused (403) and how
    /// many carried no valid token (401):
    /// `get /apis=1 /version=2 list nodes=1 ipamblocks=1 watch ipamblocks=3 refused=0 unauthorized=0`
    /// (verbs and targets sorted).
    pub fn summary(&self) -> String {
        let entries = self.entries();
        let mut counts: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
        for r in &entries {
            *counts.entry(r.verb.clone()).or_default().entry(r.target()).or_default() += 1;
        }
        let mut out = String::new();
        for (verb, targets) in counts {
            out.push_str(&verb);
            for (t, n) in targets {
                let _ = write!(out, " {t}={n}");
            }
            out.push(' ');
        }
        let count = |code: u16| entries.iter().filter(|r| r.status == code).count();
        let _ = write!(out, "refused={} unauthorized={}", count(403), count(401));
        out
    }
}
