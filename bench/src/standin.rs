//! A stand-in Kubernetes API server in this process, for the benchmarks of the Kubernetes
//! datastore (issue 23): tower-test's mock service behind a real [`kube::Client`], no network.
//!
//! It serves what the datastore asks for, the way a real API server answers it:
//!
//! - discovery: `/version`, `/apis` (the Calico CRD group `crd.projectcalico.org/v1` only, so
//!   the operator's `Installation` is not watched) and `/apis/crd.projectcalico.org/v1` (the
//!   six Calico resources, with list and watch);
//! - lists ([`ListBody`]), paged like the API server pages an etcd read: with `limit` and no
//!   `resourceVersion=0`, `limit` items and a `metadata.continue` token (plus
//!   `remainingItemCount`) while items remain, the next page when the token is sent back; with
//!   `resourceVersion=0` from "the watch cache": the whole list in one answer whatever `limit`
//!   says (API servers before 1.33 serve cached lists unpaged; the reference is
//!   `staging/src/k8s.io/apiserver/pkg/storage/cacher/cacher.go` `GetList`, which delegates to
//!   etcd only when the request cannot be served from the cache). Bodies go out in 64 KiB frames, as
//!   hyper hands them to a client, so the client collects and copies them as it would;
//! - watches: the first watch of a path with a [`WatchFeed`] streams what the benchmark sends
//!   into that feed; every other watch stays open and silent (a watch with nothing to say);
//! - anything else: `404 NotFound` with a `Status` body.
//!
//! Every request is logged ([`RequestLog`]: method, path and the query parameters that decide
//! what a list costs the server), so a benchmark can report how many lists were made and
//! whether each came from the cache. The data is encoded before the benchmark's clock starts
//! and shared, not copied, when served ([`Bytes`] slices), so what the stand-in allocates
//! while the datastore runs is the request log and a few small headers.
//!
//! [`wait_drained`] waits until a feed's events have been handed out and this process is idle,
//! so CPU counted after it is the whole cost of the events.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use bytes::Bytes;
use futures::StreamExt as _;
use http_body_util::BodyExt;
use serde_json::json;

use crate::procfs::cpu_ticks;

/// The Calico CRD group and version the stand-in serves.
pub const CALICO: &str = "crd.projectcalico.org/v1";

/// The plurals of the six Calico resources the datastore lists and watches.
pub const CALICO_PLURALS: [&str; 6] = ["ippools", "ipamblocks", "blockaffinities", "felixconfigurations", "bgpconfigurations", "clusterinformations"];

/// The path of the core Nodes.
pub const NODES: &str = "/api/v1/nodes";

/// The path of the DaemonSets in `kube-system` (the datastore reads calico-node's env there).
pub const DAEMONSETS: &str = "/apis/apps/v1/namespaces/kube-system/daemonsets";

/// Size of the frames a body is sent in (hyper reads a socket in chunks of this order).
const FRAME: usize = 64 * 1024;

/// The path of Calico resource `plural` (`/apis/crd.projectcalico.org/v1/<plural>`).
pub fn calico_path(plural: &str) -> String {
    format!("/apis/{CALICO}/{plural}")
}

/// The response body type of the mock service.
type RespBody = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

/// A list the stand-in serves: the JSON body of the whole list (`<Kind>List` with
/// `metadata.resourceVersion`) and where each item is in it, so that a page is the same bytes
/// between a new header and footer.
#[derive(Clone, Debug)]
pub struct ListBody {
    api_version: String,
    kind: String,
    resource_version: String,
    body: Bytes,
    items: Vec<Range<usize>>,
}

impl ListBody {
    /// The list of `items` (each one JSON object, as the API server encodes it) of kind
    /// `<kind>List` in `api_version`, at list resourceVersion `resource_version`.
    pub fn new<S: AsRef<str>>(api_version: &str, kind: &str, resource_version: &str, items: impl IntoIterator<Item = S>) -> ListBody {
        let mut body = Self::header(api_version, kind, resource_version, None).into_bytes();
        let mut ranges = Vec::new();
        for (i, item) in items.into_iter().enumerate() {
            if i > 0 {
                body.push(b',');
            }
            let start = body.len();
            body.extend_from_slice(item.as_ref().as_bytes());
            ranges.push(start..body.len());
        }
        body.extend_from_slice(b"]}");
        ListBody {
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
            resource_version: resource_version.to_owned(),
            body: Bytes::from(body),
            items: ranges,
        }
    }

    /// Everything before the first item: `{"apiVersion":..,"kind":"<kind>List","metadata":{..},"items":[`.
    fn header(api_version: &str, kind: &str, resource_version: &str, more: Option<(&str, usize)>) -> String {
        let mut metadata = json!({ "resourceVersion": resource_version });
        if let Some((token, remaining)) = more {
            metadata["continue"] = json!(token);
            metadata["remainingItemCount"] = json!(remaining);
        }
        let head = json!({ "apiVersion": api_version, "kind": format!("{kind}List"), "metadata": metadata }).to_string();
        // `{...}` without its closing brace, then the items array.
        format!("{},\"items\":[", &head[..head.len() - 1])
    }

    /// Items in the list.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether the list has no items.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Size of the whole list's body, in bytes.
    pub fn bytes(&self) -> usize {
        self.body.len()
    }

    /// The frames of the answer to a list request with `limit` from item `offset`: the whole
    /// body when `limit` is `None`, else a page with a continue token while items remain.
    fn answer(&self, offset: usize, limit: Option<usize>) -> Vec<Bytes> {
        let Some(limit) = limit.filter(|l| *l > 0) else { return frames(&self.body, 0..self.body.len()) };
        let end = (offset + limit).min(self.items.len());
        let more = (end < self.items.len()).then(|| (format!("standin-{end}"), self.items.len() - end));
        let header = Self::header(&self.api_version, &self.kind, &self.resource_version, more.as_ref().map(|(t, n)| (t.as_str(), *n)));
        let mut out = vec![Bytes::from(header)];
        if offset < end {
            out.extend(frames(&self.body, self.items[offset].start..self.items[end - 1].end));
        }
        out.push(Bytes::from_static(b"]}"));
        out
    }
}

/// `range` of `body` in frames of at most [`FRAME`] bytes (shared, not copied).
fn frames(body: &Bytes, range: Range<usize>) -> Vec<Bytes> {
    range.clone().step_by(FRAME).map(|start| body.slice(start..(start + FRAME).min(range.end))).collect()
}

/// What a logged request was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestKind {
    /// `/version`, `/apis`, `/apis/<group>/<version>`.
    Discovery,
    /// A list of a path the stand-in serves.
    List,
    /// A watch (`watch=true`).
    Watch,
    /// Anything else (answered 404).
    Other,
}

/// One request as the stand-in saw it: method, path and the query parameters that decide how
/// the API server serves it (raw, as sent).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedRequest {
    /// What it was.
    pub kind: RequestKind,
    /// `GET`, ...
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// `resourceVersion`.
    pub resource_version: Option<String>,
    /// `resourceVersionMatch` (`NotOlderThan`, `Exact`).
    pub resource_version_match: Option<String>,
    /// `limit` (page size).
    pub limit: Option<String>,
    /// `continue` (a page token).
    pub continue_token: Option<String>,
    /// `watch=true`.
    pub watch: bool,
    /// `allowWatchBookmarks=true`.
    pub allow_watch_bookmarks: bool,
    /// Bytes of the answer's body (0 for a watch).
    pub bytes: usize,
}

impl LoggedRequest {
    /// Parse `method`, `path` and `query` (`a=b&c=d`, values kept raw).
    fn new(method: &str, path: &str, query: Option<&str>) -> LoggedRequest {
        let mut r = LoggedRequest {
            kind: RequestKind::Other,
            method: method.to_owned(),
            path: path.to_owned(),
            resource_version: None,
            resource_version_match: None,
            limit: None,
            continue_token: None,
            watch: false,
            allow_watch_bookmarks: false,
            bytes: 0,
        };
        for pair in query.unwrap_or_default().split('&') {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "resourceVersion" => r.resource_version = Some(v.to_owned()),
                "resourceVersionMatch" => r.resource_version_match = Some(v.to_owned()),
                "limit" => r.limit = Some(v.to_owned()),
                "continue" => r.continue_token = Some(v.to_owned()),
                "watch" => r.watch = v == "true" || v == "1",
                "allowWatchBookmarks" => r.allow_watch_bookmarks = v == "true",
                _ => {}
            }
        }
        r
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
}

/// The stand-in's request log, shared with the serving task.
#[derive(Clone, Debug, Default)]
pub struct RequestLog(Arc<Mutex<Vec<LoggedRequest>>>);

impl RequestLog {
    fn push(&self, r: LoggedRequest) {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(r);
    }

    /// Every request so far, in order.
    pub fn entries(&self) -> Vec<LoggedRequest> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
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
}

/// What the benchmark sends into one watch: each [`WatchFeed::send`] is one chunk of the watch
/// body (one or more `{"type":..,"object":..}\n` lines).
#[derive(Clone, Debug)]
pub struct WatchFeed {
    tx: futures::channel::mpsc::UnboundedSender<Bytes>,
    sent: Arc<AtomicU64>,
    handed_out: Arc<AtomicU64>,
}

impl WatchFeed {
    /// Queue `chunk` for the watch.
    ///
    /// # Errors
    /// The watch body was dropped (the client closed it).
    pub fn send(&self, chunk: Bytes) -> Result<()> {
        self.tx.unbounded_send(chunk).map_err(|_| anyhow!("the watch closed"))?;
        self.sent.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Chunks sent so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Chunks the client has read out of the watch body so far.
    pub fn handed_out(&self) -> u64 {
        self.handed_out.load(Ordering::Relaxed)
    }
}

/// The receiving end of a [`WatchFeed`], until a watch takes it.
struct FeedBody {
    rx: futures::channel::mpsc::UnboundedReceiver<Bytes>,
    handed_out: Arc<AtomicU64>,
}

/// The stand-in API server, being set up: add lists and feeds, then [`StandIn::client`].
#[derive(Default)]
pub struct StandIn {
    lists: BTreeMap<String, ListBody>,
    feeds: BTreeMap<String, FeedBody>,
    log: RequestLog,
}

impl StandIn {
    /// A stand-in with discovery only.
    pub fn new() -> StandIn {
        StandIn::default()
    }

    /// Serve `body` as the list of `path`.
    pub fn list(&mut self, path: &str, body: ListBody) {
        self.lists.insert(path.to_owned(), body);
    }

    /// The feed of the first watch of `path`.
    pub fn feed(&mut self, path: &str) -> WatchFeed {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let handed_out = Arc::new(AtomicU64::new(0));
        self.feeds.insert(path.to_owned(), FeedBody { rx, handed_out: handed_out.clone() });
        WatchFeed { tx, sent: Arc::new(AtomicU64::new(0)), handed_out }
    }

    /// The request log (shared: it fills while the client is used).
    pub fn log(&self) -> RequestLog {
        self.log.clone()
    }

    /// Start serving on the current Tokio runtime; a client in namespace `default` whose
    /// every request this stand-in answers. Serving ends when the client is dropped.
    pub fn client(self) -> kube::Client {
        let (service, mut handle) = tower_test::mock::pair::<http::Request<kube::client::Body>, http::Response<RespBody>>();
        let StandIn { lists, mut feeds, log } = self;
        tokio::spawn(async move {
            while let Some((req, send)) = handle.next_request().await {
                let mut entry = LoggedRequest::new(req.method().as_str(), req.uri().path(), req.uri().query());
                let response = answer(&mut entry, &lists, &mut feeds);
                log.push(entry);
                send.send_response(response);
            }
        });
        kube::Client::new(service, "default")
    }
}

/// The answer to `req` (and its kind and size recorded in it).
fn answer(req: &mut LoggedRequest, lists: &BTreeMap<String, ListBody>, feeds: &mut BTreeMap<String, FeedBody>) -> http::Response<RespBody> {
    let ok = |body: RespBody| http::Response::builder().status(200).body(body).unwrap_or_default();
    let full = |b: Bytes| http_body_util::Full::new(b).map_err(|e| match e {}).boxed();
    if req.watch {
        req.kind = RequestKind::Watch;
        let body: RespBody = match feeds.remove(&req.path) {
            Some(FeedBody { rx, handed_out }) => streamed(rx.map(move |b| {
                handed_out.fetch_add(1, Ordering::Relaxed);
                b
            })),
            None => streamed(futures::stream::pending()),
        };
        return ok(body);
    }
    if let Some(list) = lists.get(&req.path) {
        req.kind = RequestKind::List;
        let offset = match req.continue_token.as_deref().map(|t| t.strip_prefix("standin-").and_then(|n| n.parse::<usize>().ok())) {
            None => Some(0),
            Some(Some(n)) if n <= list.len() => Some(n),
            Some(_) => None,
        };
        let Some(offset) = offset else { return status(400, "BadRequest", "invalid continue token") };
        // From the watch cache (resourceVersion=0): whole; otherwise paged when asked.
        let limit = if req.resource_version.as_deref() == Some("0") { None } else { req.limit.as_deref().and_then(|l| l.parse().ok()) };
        let frames = list.answer(offset, limit);
        req.bytes = frames.iter().map(Bytes::len).sum();
        return ok(streamed(futures::stream::iter(frames)));
    }
    if let Some(b) = discovery(&req.path) {
        req.kind = RequestKind::Discovery;
        req.bytes = b.len();
        return ok(full(b));
    }
    status(404, "NotFound", "not found")
}

/// A body of the chunks of `chunks`, each one frame.
fn streamed(chunks: impl futures::Stream<Item = Bytes> + Send + Sync + 'static) -> RespBody {
    BodyExt::boxed(http_body_util::StreamBody::new(chunks.map(|b| Ok::<_, std::io::Error>(http_body::Frame::data(b)))))
}

/// A `Status` answer with HTTP `code`.
fn status(code: u16, reason: &str, message: &str) -> http::Response<RespBody> {
    let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason, "code": code}).to_string();
    http::Response::builder().status(code).body(http_body_util::Full::new(Bytes::from(body)).map_err(|e| match e {}).boxed()).unwrap_or_default()
}

/// The discovery documents: `/apis` (the Calico CRD group only), the group's resources and
/// `/version`.
fn discovery(path: &str) -> Option<Bytes> {
    let doc = match path {
        "/apis" => {
            json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [{"name": "crd.projectcalico.org", "versions": [{"groupVersion": CALICO, "version": "v1"}], "preferredVersion": {"groupVersion": CALICO, "version": "v1"}}]})
        }
        p if p.strip_prefix("/apis/") == Some(CALICO) => {
            let r: Vec<serde_json::Value> =
                CALICO_PLURALS.iter().map(|p| json!({"name": p, "singularName": "", "namespaced": false, "kind": "X", "verbs": ["list", "watch"]})).collect();
            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": CALICO, "resources": r})
        }
        "/version" => json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0"}),
        _ => return None,
    };
    Some(Bytes::from(doc.to_string()))
}

/// How long draining took ([`wait_drained`]).
#[derive(Clone, Copy, Debug)]
pub struct Drained {
    /// Until the client had read every chunk sent into the feeds.
    pub handed_out: Duration,
    /// Until this process was idle after that (the end of the quiet period, counted from the
    /// call).
    pub idle: Duration,
}

/// Wait until the client has read every chunk sent into `feeds`, then until this process has
/// been idle for `quiet` (its CPU time, utime + stime, advanced by at most one clock tick in
/// that long: whatever the datastore does with the last events, including a debounce window
/// and the flush after it, is done).
///
/// # Errors
/// Not drained or not idle within `limit`; `/proc/self/stat` unreadable.
pub async fn wait_drained(feeds: &[&WatchFeed], quiet: Duration, limit: Duration) -> Result<Drained> {
    let t0 = Instant::now();
    let step = Duration::from_millis(10);
    while feeds.iter().any(|f| f.handed_out() < f.sent()) {
        if t0.elapsed() > limit {
            let (read, sent): (u64, u64) = feeds.iter().fold((0, 0), |(r, s), f| (r + f.handed_out(), s + f.sent()));
            bail!("the datastore read {read} of {sent} watch chunks within {} s", limit.as_secs());
        }
        tokio::time::sleep(step).await;
    }
    let handed_out = t0.elapsed();
    let pid = std::process::id();
    let mut samples: Vec<(Instant, u64)> = vec![(Instant::now(), cpu_ticks(pid)?)];
    loop {
        tokio::time::sleep(step * 5).await;
        let now = (Instant::now(), cpu_ticks(pid)?);
        samples.push(now);
        // The oldest sample at least `quiet` ago, and the ticks since.
        if let Some(old) = samples.iter().rev().find(|(t, _)| now.0.duration_since(*t) >= quiet) {
            if now.1 - old.1 <= 1 {
                return Ok(Drained { handed_out, idle: t0.elapsed() });
            }
        }
        if t0.elapsed() > limit {
            bail!("this process did not go idle within {} s of the last watch chunk being read", limit.as_secs());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(frames: &[Bytes]) -> serde_json::Value {
        serde_json::from_slice(&frames.concat()).expect("valid JSON")
    }

    #[test]
    fn lists_page_with_continue_tokens_and_whole_without_limit() {
        let l = ListBody::new("v1", "Node", "7", (0..5).map(|i| json!({"metadata": {"name": format!("n{i}")}}).to_string()));
        let whole = body(&l.answer(0, None));
        assert_eq!(whole["kind"], "NodeList");
        assert_eq!(whole["metadata"]["resourceVersion"], "7");
        assert_eq!(whole["items"].as_array().map(Vec::len), Some(5));
        let first = body(&l.answer(0, Some(2)));
        assert_eq!(first["items"][1]["metadata"]["name"], "n1");
        assert_eq!(first["metadata"]["continue"], "standin-2");
        assert_eq!(first["metadata"]["remainingItemCount"], 3);
        let last = body(&l.answer(4, Some(2)));
        assert_eq!(last["items"].as_array().map(Vec::len), Some(1));
        assert!(last["metadata"].get("continue").is_none());
        let empty = ListBody::new("v1", "Node", "7", Vec::<String>::new());
        assert_eq!(body(&empty.answer(0, Some(2)))["items"], json!([]));
        assert_eq!(body(&empty.answer(0, None))["items"], json!([]));
    }

    #[test]
    fn requests_are_logged_with_their_list_semantics() {
        let r = LoggedRequest::new("GET", "/api/v1/nodes", Some("resourceVersion=0&resourceVersionMatch=NotOlderThan"));
        assert!(r.from_cache());
        assert_eq!(r.version_label(), "rv0+NotOlderThan");
        let r = LoggedRequest::new("GET", "/api/v1/nodes", Some("limit=500"));
        assert!(!r.from_cache());
        assert_eq!((r.limit.as_deref(), r.version_label().as_str()), (Some("500"), "rvnone+none"));
        let w = LoggedRequest::new("GET", "/api/v1/nodes", Some("watch=true&timeoutSeconds=290&allowWatchBookmarks=true&resourceVersion=10"));
        assert!(w.watch && w.allow_watch_bookmarks);
    }

    #[test]
    fn the_served_client_pages_etcd_reads_and_serves_cached_lists_whole() {
        use kube::api::{Api, DynamicObject, ListParams};
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            let mut s = StandIn::new();
            let items = (0..5).map(|i| json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": format!("n{i}")}}).to_string());
            s.list(NODES, ListBody::new("v1", "Node", "7", items));
            let log = s.log();
            let client = s.client();
            let nodes = kube::api::ApiResource::from_gvk_with_plural(&kube::api::GroupVersionKind::gvk("", "v1", "Node"), "nodes");
            let api: Api<DynamicObject> = Api::all_with(client, &nodes);
            let mut names = Vec::new();
            let mut lp = ListParams::default().limit(2);
            loop {
                let page = api.list(&lp).await.expect("page");
                names.extend(page.items.into_iter().filter_map(|o| o.metadata.name));
                match page.metadata.continue_ {
                    Some(t) if !t.is_empty() => lp = lp.continue_token(&t),
                    _ => break,
                }
            }
            assert_eq!(names, ["n0", "n1", "n2", "n3", "n4"]);
            let cached = api.list(&ListParams::default().match_any()).await.expect("cached list");
            assert_eq!(cached.items.len(), 5);
            let lists = log.lists();
            assert_eq!(lists.len(), 4, "{lists:?}");
            assert!(lists[..3].iter().all(|r| !r.from_cache()) && lists[3].from_cache());
            assert_eq!(log.list_versions(), "rv0+NotOlderThan:1,rvnone+none:3");
        });
    }
}
