//! A Kubernetes API server stand-in for routewarden's tests and benchmarks: one
//! [`ApiServer`] that serves the same answers in-process (a tower service behind a real
//! [`kube::Client`], [`ApiServer::client`]) and over TCP+TLS ([`tls::TlsServer`]: hyper per
//! connection, rustls with ring, certificates made at run time).
//!
//! No real kube-apiserver can be run where these tests run, so the stand-in follows the
//! documented API semantics. Each rule cites the Kubernetes API concepts page,
//! <https://kubernetes.io/docs/reference/using-api/api-concepts/> ("concepts" below), or the
//! API server's source where the page is silent:
//!
//! - **resourceVersion on lists** (concepts, "Semantics for get and list"): unset is *Most
//!   Recent* (a consistent read at the current version); `0` with `NotOlderThan` or no match is
//!   *Any*, served from the watch cache, whole, whatever `limit` says (API servers before 1.33
//!   serve cached lists unpaged: k8s.io/apiserver `pkg/storage/cacher/cacher.go` `GetList`);
//!   a version with `NotOlderThan` (or no match and no `limit`) is *Not older than*, served at
//!   the current version; `Exact` (or no match with `limit`, the legacy rule of KEP-2523) is
//!   the state at exactly that version. A version the store no longer keeps is `410 Gone`
//!   (reason `Expired`, concepts "Unavailable resource versions"); one newer than the store's is `504`
//!   (reason `Timeout`, cause `ResourceVersionTooLarge`: "Too large resource version", the same section),
//!   answered at once where the API server first waits up to 3 s for its cache.
//!   `resourceVersionMatch` without `resourceVersion`, with `continue`, or `Exact` with `0` is
//!   `422 Invalid` (k8s.io/apimachinery `pkg/apis/meta/internalversion/validation`).
//! - **Paged lists** (concepts, "Retrieving large results sets in chunks"): `limit` items and
//!   a `continue` token while items remain (with `remainingItemCount` when there is no field
//!   selector); the token holds the list's version, so every page is of the same consistent
//!   state. Tokens expire when their version is compacted ("continue tokens expire after a
//!   short amount of time (by default 5 minutes) and return a `410 Gone`": etcd compacts every
//!   5 minutes; here [`ApiServer::compact`]); the 410 carries a fresh token for an inconsistent
//!   continuation, as the API server's does.
//! - **Watches** (concepts, "Efficient detection of changes", "Semantics for watch"): from a
//!   version, every change after it; unset or `0`, synthetic `ADDED` events of the current
//!   state first. A version no longer kept is an `ERROR` event with a `410 Expired` status
//!   ("too old resource version"), on a `200` stream, as the API server's watch cache answers
//!   (`cacher.go` `Watch`: `newErrWatcher`). `timeoutSeconds` ends the stream.
//! - **Bookmarks** (concepts, "Watch bookmarks"): with `allowWatchBookmarks=true`, `BOOKMARK`
//!   events carrying only the current `resourceVersion`, on [`ApiServer::bookmark`] (the TLS
//!   server sends one to every watch each minute, the watch cache's `defaultBookmarkFrequency`).
//! - **Streaming lists** (concepts, "Streaming lists"): `sendInitialEvents=true` (which needs
//!   `resourceVersionMatch=NotOlderThan` and `allowWatchBookmarks=true`, else `422`) starts
//!   with `ADDED` events of the current state, then a `BOOKMARK` annotated
//!   `k8s.io/initial-events-end: "true"`, then changes.
//! - **Field selectors** (concepts, "Field selectors" on the "Working with objects" pages):
//!   `metadata.name` and `metadata.namespace` with `=`, `==`, `!=`; any other field is
//!   `400 BadRequest` (`field label not supported`).
//! - **Authentication and RBAC** ([`rbac`]): with tokens set ([`ApiServer::set_tokens`]),
//!   a request without a known bearer token is `401 Unauthorized`; with RBAC set
//!   ([`ApiServer::with_rbac`], the rendered manifests' roles and bindings), a request no rule
//!   allows is `403 Forbidden` with the API server's message.
//! - **Discovery**: `/api` (`APIVersions`), `/api/v1` and `/apis/<group>/<version>`
//!   (`APIResourceList`), `/apis` (`APIGroupList`), `/apis/<group>` (`APIGroup`), `/version`.
//!   Anything else is `404 NotFound`; the stand-in serves reads only (`405` for other methods),
//!   but for Event writes ([`events`]).
//! - **Label selectors** ([`labels`]): the equality-based terms, on lists.
//! - **The pod proxy** ([`proxy`]): `GET .../pods/<name>[:<port>]/proxy/<path>` reaches the
//!   pod's HTTP server at its `status.podIP`, from the network namespace a test names
//!   ([`ApiServer::reach_pod_from`]); `503 ServiceUnavailable` when it cannot.
//!
//! Every request is logged ([`RequestLog`]): method, path, the parameters that decide how it
//! is served, the token it carried, the user, the status. Bodies go out in 64 KiB frames, as
//! hyper hands them to a client. Objects are kept encoded and shared, not copied, when served
//! ([`store`]), so a benchmark that loads its lists before its clock starts measures the
//! client, not the stand-in.

mod events;
mod groups;
pub mod labels;
mod list;
pub mod log;
pub mod proxy;
pub mod rbac;
mod reply;
pub mod request;
pub mod store;
pub mod tls;
mod watch;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt as _;
use http_body_util::BodyExt;
use serde_json::{json, Value};

pub use log::{LoggedRequest, RequestKind, RequestLog};
pub use rbac::{Rbac, User};
pub use request::{FieldSelector, Query, RequestInfo};
pub use store::{EventType, Key, ListBody, ResourceType, StoreError};

use list::list;
use reply::{bookmark, error_event, full, invalid, not_found, ok, status};
use store::{Store, Watcher};

/// The response body: frames of shared bytes.
pub type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// Size of the frames a body is sent in (hyper reads a socket in chunks of this order).
pub const FRAME: usize = 64 * 1024;

/// The annotation of the bookmark that ends a watch's initial events (concepts, "Streaming lists").
pub const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// The stand-in. Cheap to clone: every clone serves the same store and log.
#[derive(Clone, Default)]
pub struct ApiServer {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    store: Mutex<Store>,
    log: RequestLog,
    /// `None`: no authentication, every request is [`User::admin`].
    tokens: Mutex<Option<HashMap<String, User>>>,
    /// `None`: every authenticated request is allowed.
    rbac: Mutex<Option<Rbac>>,
    /// Frames the clients have read out of watch bodies.
    handed_out: Arc<AtomicU64>,
    /// Frames sent into watch bodies.
    sent: Arc<AtomicU64>,
    /// Bytes the clients have read out of watch bodies.
    handed_out_bytes: Arc<AtomicU64>,
    /// Streaming lists refused as an API server without the `WatchList` feature gate refuses
    /// them ([`ApiServer::refuse_streaming_lists`]).
    no_watch_list: std::sync::atomic::AtomicBool,
    event_writes: events::EventWrites,
    /// The network namespace each pod (namespace, name) is reached from by the pod proxy.
    pod_netns: Mutex<HashMap<(String, String), String>>,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer").field("resource_version", &self.resource_version()).finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The bearer token of a request, if any.
fn bearer(headers: &http::HeaderMap) -> Option<String> {
    headers.get(http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer ")).map(str::to_owned)
}

impl ApiServer {
    /// A stand-in serving nothing but discovery, with no authentication and no RBAC.
    pub fn new() -> ApiServer {
        ApiServer::default()
    }

    /// Authorize every request by `rbac` (see [`rbac`]).
    #[must_use]
    pub fn with_rbac(self, rbac: Rbac) -> ApiServer {
        *lock(&self.inner.rbac) = Some(rbac);
        self
    }

    /// From now on, authenticate requests by their bearer token: each of `tokens` is the
    /// user given; any other token, or none, is refused with 401. Replaces the tokens set
    /// before (a rotated token replaces the old one, which is refused from then on).
    pub fn set_tokens(&self, tokens: impl IntoIterator<Item = (String, User)>) {
        *lock(&self.inner.tokens) = Some(tokens.into_iter().collect());
    }

    /// Serve resource type `rt` (empty until [`ApiServer::load`] or [`ApiServer::create`]).
    pub fn register(&self, rt: &ResourceType) {
        lock(&self.inner.store).register(rt.clone());
    }

    /// Serve `list` as collection `rt`'s objects (registering `rt`), with no history before
    /// the list's version.
    ///
    /// Errors: an item without `metadata.name` (or `metadata.namespace` when namespaced).
    pub fn load(&self, rt: &ResourceType, list: ListBody) -> Result<(), StoreError> {
        let mut store = lock(&self.inner.store);
        store.register(rt.clone());
        store.load(rt, list)
    }

    /// The version of the last change.
    pub fn resource_version(&self) -> u64 {
        lock(&self.inner.store).rv
    }

    /// Create `object` (JSON) in `rt` at the next version, which is written into its
    /// `metadata.resourceVersion` and returned; watches see `ADDED`.
    ///
    /// Errors: [`StoreError`] (unregistered type, no name, already exists).
    pub fn create(&self, rt: &ResourceType, object: Value) -> Result<u64, StoreError> {
        self.write(rt, EventType::Added, object)
    }

    /// Replace `object` (JSON) in `rt` at the next version; watches see `MODIFIED`.
    ///
    /// Errors: [`StoreError`] (unregistered type, no name, not found).
    pub fn update(&self, rt: &ResourceType, object: Value) -> Result<u64, StoreError> {
        self.write(rt, EventType::Modified, object)
    }

    /// Delete `namespace`/`name` of `rt` at the next version; watches see `DELETED` with the
    /// object at the deletion's version.
    ///
    /// Errors: [`StoreError`] (unregistered type, not found).
    pub fn delete(&self, rt: &ResourceType, namespace: Option<&str>, name: &str) -> Result<u64, StoreError> {
        let mut store = lock(&self.inner.store);
        let i = store.find(&rt.group, &rt.version, &rt.plural).ok_or_else(|| StoreError::UnknownResource(rt.path(None)))?;
        let key = (namespace.unwrap_or_default().to_owned(), name.to_owned());
        let old = store.collections[i].objects.get(&key).ok_or_else(|| StoreError::NotFound(key.clone()))?.body.clone();
        let mut object: Value = serde_json::from_slice(&old).map_err(|_| StoreError::NoName)?;
        let rv = store.rv + 1;
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        store.commit(rt, EventType::Deleted, key, rv, Bytes::from(object.to_string()))?;
        Ok(rv)
    }

    fn write(&self, rt: &ResourceType, kind: EventType, mut object: Value) -> Result<u64, StoreError> {
        let mut store = lock(&self.inner.store);
        let name = object["metadata"]["name"].as_str().ok_or(StoreError::NoName)?.to_owned();
        let ns = if rt.namespaced { object["metadata"]["namespace"].as_str().ok_or(StoreError::NoName)?.to_owned() } else { String::new() };
        let rv = store.rv + 1;
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        object["apiVersion"] = json!(rt.api_version());
        object["kind"] = json!(rt.kind);
        store.commit(rt, kind, (ns, name), rv, Bytes::from(object.to_string()))?;
        Ok(rv)
    }

    /// Commit a change whose object is already encoded, at version `rv` (which its
    /// `metadata.resourceVersion` must say): for benchmarks that encode their changes before
    /// the clock starts. The watch event shares `object`'s bytes.
    ///
    /// Errors: [`StoreError`] (unregistered type, `rv` not newer than the store's, the
    /// object's existence contradicting `kind`).
    pub fn commit_encoded(&self, rt: &ResourceType, kind: EventType, namespace: Option<&str>, name: &str, rv: u64, object: Bytes) -> Result<(), StoreError> {
        lock(&self.inner.store).commit(rt, kind, (namespace.unwrap_or_default().to_owned(), name.to_owned()), rv, object)
    }

    /// Compact the history up to the current version (etcd's compaction): older versions
    /// are no longer served (410), and continue tokens of older lists expire. Returns the
    /// version compacted to.
    pub fn compact(&self) -> u64 {
        lock(&self.inner.store).compact()
    }

    /// Send a `BOOKMARK` at the current version to every watch that allows bookmarks.
    pub fn bookmark(&self) {
        let mut store = lock(&self.inner.store);
        let rv = store.rv;
        let frames: Vec<(usize, Bytes)> = (0..store.collections.len()).map(|i| (i, bookmark(&store.collections[i].rt, rv, false))).collect();
        store.watchers.retain(|w| !w.bookmarks || w.send(std::slice::from_ref(&frames[w.collection].1)));
    }

    /// End every open watch, as the API server does when a watch's timeout passes (clients
    /// start a new watch from the last version they saw).
    pub fn close_watches(&self) {
        lock(&self.inner.store).watchers.clear();
    }

    /// Open watches.
    pub fn watches(&self) -> usize {
        lock(&self.inner.store).watchers.len()
    }

    /// Bytes the clients have read out of watch bodies so far (list bodies are in the log,
    /// [`LoggedRequest::bytes`](log::LoggedRequest::bytes)).
    pub fn watch_bytes_handed_out(&self) -> u64 {
        self.inner.handed_out_bytes.load(Ordering::Relaxed)
    }

    /// From now on, answer a watch with `sendInitialEvents=true` as an API server without the
    /// `WatchList` feature gate does (1.27–1.31 by default; before 1.27 `resourceVersionMatch`
    /// on a watch is refused the same way): `422 Invalid`, `sendInitialEvents is forbidden for
    /// watch unless the WatchList feature gate is enabled` (k8s.io/apimachinery
    /// `ValidateListOptions`).
    pub fn refuse_streaming_lists(&self) {
        self.inner.no_watch_list.store(true, Ordering::Relaxed);
    }

    /// Watch frames sent but not yet read by their client (0: every watch is drained).
    pub fn undelivered(&self) -> u64 {
        self.inner.sent.load(Ordering::Relaxed).saturating_sub(self.inner.handed_out.load(Ordering::Relaxed))
    }

    /// The request log (shared: it fills while clients are served).
    pub fn log(&self) -> RequestLog {
        self.inner.log.clone()
    }

    /// Reach pod `namespace`/`pod` through the pod proxy from the named network namespace
    /// `netns` (`/run/netns/<netns>`, a lab node's); pods not named here are reached from the
    /// stand-in's own namespace.
    pub fn reach_pod_from(&self, namespace: &str, pod: &str, netns: &str) {
        lock(&self.inner.pod_netns).insert((namespace.to_owned(), pod.to_owned()), netns.to_owned());
    }

    /// The stand-in as a tower service (what [`ApiServer::client`] and the TLS server use); a
    /// request's body is read whole ([`events::MAX_BODY`] at most) before it is answered.
    pub fn service<B>(
        &self,
    ) -> impl tower::Service<
        http::Request<B>,
        Response = http::Response<Body>,
        Error = Infallible,
        Future = futures::future::BoxFuture<'static, Result<http::Response<Body>, Infallible>>,
    > + Clone
           + Send
           + 'static
    where
        B: http_body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let api = self.clone();
        tower::service_fn(move |req: http::Request<B>| {
            let api = api.clone();
            let fut: futures::future::BoxFuture<'static, _> = Box::pin(async move {
                let (parts, body) = req.into_parts();
                let body = events::read_body(body).await;
                Ok(api.serve(&parts.method, &parts.uri, &parts.headers, &body).await)
            });
            fut
        })
    }

    /// Answer one request (logged): the pod proxy, which waits for the pod, or [`ApiServer::handle`].
    pub async fn serve(&self, method: &http::Method, uri: &http::Uri, headers: &http::HeaderMap, body: &[u8]) -> http::Response<Body> {
        let query = Query::parse(uri.query());
        let info = RequestInfo::parse(method, uri.path(), &query);
        let Some(request) = proxy::ProxyRequest::of(&info).filter(|_| *method == http::Method::GET) else {
            return self.handle(method, uri, headers, body);
        };
        let token = bearer(headers);
        let mut entry = LoggedRequest::new(method, &info, &query, token.clone());
        let response = if let Some(refused) = self.refusal(&info, token.as_deref(), &mut entry) {
            refused
        } else {
            entry.kind = RequestKind::Get;
            self.proxy(request, &info, uri.query()).await
        };
        entry.status = response.status().as_u16();
        entry.bytes = usize::try_from(http_body::Body::size_hint(response.body()).exact().unwrap_or(0)).unwrap_or(usize::MAX);
        self.inner.log.push(entry);
        response
    }

    /// The answer of an authorized pod proxy request: 404 for a pod not stored, else the pod's
    /// answer or the 503 of [`proxy`].
    async fn proxy(&self, request: proxy::ProxyRequest, info: &RequestInfo, query: Option<&str>) -> http::Response<Body> {
        let key = (request.namespace.clone(), request.pod.clone());
        let pod = {
            let store = lock(&self.inner.store);
            store.find("", &info.api_version, "pods").and_then(|i| store.collections[i].objects.get(&key).map(|s| s.body.clone()))
        };
        let Some(pod) = pod.and_then(|b| serde_json::from_slice::<Value>(&b).ok()) else {
            return status(404, "NotFound", &format!("pods \"{}\" not found", request.pod), Some(json!({"name": request.pod, "kind": "pods"})));
        };
        match proxy::target(&request, &pod) {
            Err(why) => proxy::unavailable(&why),
            Ok(addr) => {
                let netns = lock(&self.inner.pod_netns).get(&key).cloned();
                proxy::forward(request, query.map(str::to_owned), addr, netns).await
            }
        }
    }

    /// A kube client in namespace `default` whose every request this stand-in answers, in
    /// this process (no network; must be used on a Tokio runtime). It sends no token: use it
    /// without [`ApiServer::set_tokens`].
    pub fn client(&self) -> kube::Client {
        kube::Client::new(self.service::<kube::client::Body>(), "default")
    }

    /// Answer one request (logged).
    pub fn handle(&self, method: &http::Method, uri: &http::Uri, headers: &http::HeaderMap, body: &[u8]) -> http::Response<Body> {
        let query = Query::parse(uri.query());
        let info = RequestInfo::parse(method, uri.path(), &query);
        let token = bearer(headers);
        let mut entry = LoggedRequest::new(method, &info, &query, token.clone());
        let response = self.answer(method, &info, &query, (token.as_deref(), headers, body), &mut entry);
        entry.status = response.status().as_u16();
        self.inner.log.push(entry);
        response
    }

    /// Authenticate and authorize a request, noting its user in `entry`: the 401 or 403, if
    /// refused.
    fn refusal(&self, info: &RequestInfo, token: Option<&str>, entry: &mut LoggedRequest) -> Option<http::Response<Body>> {
        let user = match &*lock(&self.inner.tokens) {
            None => User::admin(),
            Some(tokens) => match token.and_then(|t| tokens.get(t)) {
                Some(u) => u.clone(),
                None => return Some(status(401, "Unauthorized", "Unauthorized", None)),
            },
        };
        entry.user = Some(user.name.clone());
        if let Some(rbac) = &*lock(&self.inner.rbac) {
            if !rbac.allows(&user, info) {
                let details =
                    info.resource_request.then(|| json!({"name": info.name.clone().unwrap_or_default(), "group": info.api_group, "kind": info.resource}));
                return Some(status(403, "Forbidden", &Rbac::forbidden_message(&user, info), details));
            }
        }
        None
    }

    fn answer(
        &self,
        method: &http::Method,
        info: &RequestInfo,
        query: &Query,
        request: (Option<&str>, &http::HeaderMap, &[u8]),
        entry: &mut LoggedRequest,
    ) -> http::Response<Body> {
        let (token, headers, body) = request;
        if let Some(refused) = self.refusal(info, token, entry) {
            return refused;
        }
        if let Some(r) = self.write_event(info, headers, body, entry) {
            return r;
        }
        if *method != http::Method::GET {
            return status(405, "MethodNotAllowed", &format!("the stand-in serves reads only, not {method}"), None);
        }
        if !info.resource_request {
            return match self.discovery(&info.path) {
                Some(doc) => {
                    entry.kind = RequestKind::Discovery;
                    let b = Bytes::from(doc.to_string());
                    entry.bytes = b.len();
                    ok(full(b))
                }
                None => not_found(),
            };
        }
        let mut store = lock(&self.inner.store);
        let Some(i) = store.find(&info.api_group, &info.api_version, &info.resource) else { return not_found() };
        let rt = store.collections[i].rt.clone();
        if info.subresource.is_some() || (!rt.namespaced && info.namespace.is_some()) {
            return not_found();
        }
        match info.verb.as_str() {
            "get" => {
                entry.kind = RequestKind::Get;
                let name = info.name.clone().unwrap_or_default();
                match store.collections[i].objects.get(&(info.namespace.clone().unwrap_or_default(), name.clone())) {
                    Some(s) => {
                        entry.bytes = s.body.len();
                        ok(full(s.body.clone()))
                    }
                    None => status(
                        404,
                        "NotFound",
                        &format!("{} \"{name}\" not found", info.resource_label()),
                        Some(json!({"name": name, "group": rt.group, "kind": rt.plural})),
                    ),
                }
            }
            "list" => {
                entry.kind = RequestKind::List;
                let r = list(&mut store, i, info, query);
                if r.status() == 200 {
                    entry.bytes = usize::try_from(http_body::Body::size_hint(r.body()).exact().unwrap_or(0)).unwrap_or(usize::MAX);
                }
                r
            }
            "watch" => {
                entry.kind = RequestKind::Watch;
                self.watch(&mut store, i, info, query)
            }
            _ => status(405, "MethodNotAllowed", "the stand-in serves reads only", None),
        }
    }

    /// The discovery document at `path`, from the registered resource types.
    fn discovery(&self, path: &str) -> Option<Value> {
        let store = lock(&self.inner.store);
        let types: Vec<&ResourceType> = store.served_types().collect();
        let resources = |group: &str, version: &str| -> Vec<Value> {
            types
                .iter()
                .filter(|t| t.group == group && t.version == version)
                .map(|t| json!({"name": t.plural, "singularName": t.kind.to_lowercase(), "namespaced": t.namespaced, "kind": t.kind, "verbs": ["get", "list", "watch"]}))
                .collect()
        };
        let mut groups: Vec<(String, Vec<String>)> = Vec::new();
        for t in types.iter().filter(|t| !t.group.is_empty()) {
            match groups.iter_mut().find(|(g, _)| *g == t.group) {
                Some((_, vs)) if !vs.contains(&t.version) => vs.push(t.version.clone()),
                Some(_) => {}
                None => groups.push((t.group.clone(), vec![t.version.clone()])),
            }
        }
        let group_doc = |name: &str, versions: &[String]| {
            let vs: Vec<Value> = versions.iter().map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v})).collect();
            json!({"name": name, "versions": vs, "preferredVersion": vs[0]})
        };
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        Some(match parts[..] {
            ["version"] => json!({"major": "1", "minor": "35", "gitVersion": "v1.35.0", "platform": "linux/amd64"}),
            ["api"] => {
                json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "10.96.0.1:443"}]})
            }
            ["api", "v1"] => json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "v1", "resources": resources("", "v1")}),
            ["apis"] => json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups.iter().map(|(g, vs)| group_doc(g, vs)).collect::<Vec<_>>()}),
            ["apis", g] => {
                let (name, vs) = groups.iter().find(|(n, _)| n == g)?;
                let mut doc = group_doc(name, vs);
                doc["kind"] = json!("APIGroup");
                doc["apiVersion"] = json!("v1");
                doc
            }
            ["apis", g, v] => {
                groups.iter().find(|(n, vs)| n == g && vs.iter().any(|x| x == v))?;
                json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("{g}/{v}"), "resources": resources(g, v)})
            }
            _ => return None,
        })
    }
}
