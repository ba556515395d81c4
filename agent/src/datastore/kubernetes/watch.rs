//! How one resource is watched: what a watcher reads ([`WatchTarget`]), the watcher settings
//! ([`cache_lists`]), the list settle ([`DEFAULT_LIST_SETTLE`]), the retry delays
//! ([`default_backoff`]), one list then watch that notices a silent watch ([`list_watch`],
//! [`WatchFailure`](super::error::WatchFailure)), the watcher that re-lists after every failure ([`relisting_watcher`]),
//! and the watch of one target in its kind's trimmed shape ([`trimmed_watch`]).

use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use kube::api::{Api, ApiResource, ListParams, VersionMatch, WatchEvent, WatchParams};
use kube::core::DynamicResourceScope;
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, Event, InitialListStrategy, ListSemantic};
use kube::ResourceExt;

use super::error::WatchFailure;

use super::trimmed::{CalicoNodeContainers, CalicoSpec, NodeAddresses, RoutingMode, Shape, Trimmed, TrimmedObject};
use crate::model::{Kind, OptionalSource};

/// What one watcher reads: the resource, in one namespace or cluster-wide, maybe narrowed by a
/// field selector; `optional` for the sources whose failure is a finding, not unsynced.
#[derive(Clone, Debug)]
pub(crate) struct WatchTarget {
    pub(crate) api: ApiResource,
    /// The model kind read (decides the trimmed shape, [`trimmed_watch`]).
    pub(crate) kind: Kind,
    pub(crate) namespace: Option<&'static str>,
    pub(crate) field_selector: Option<&'static str>,
    pub(crate) optional: Option<OptionalSource>,
}

impl WatchTarget {
    /// The API handle for objects decoded as `K`: namespaced when the target is.
    pub(crate) fn api<K: kube::Resource<DynamicType = ApiResource, Scope = DynamicResourceScope>>(&self, client: &kube::Client) -> kube::Api<K> {
        match self.namespace {
            Some(ns) => kube::Api::namespaced_with(client.clone(), ns, &self.api),
            None => kube::Api::all_with(client.clone(), &self.api),
        }
    }

    /// `base` with this target's field selector.
    pub(crate) fn config(&self, base: &watcher::Config) -> watcher::Config {
        match self.field_selector {
            Some(sel) => base.clone().fields(sel),
            None => base.clone(),
        }
    }
}

/// The watcher settings of the agent: a streaming list ([`list_watch`]: a watch from `0` with
/// `sendInitialEvents=true`, the API's WatchList, served from the watch cache object by
/// object), falling back to [`cache_lists`] where the API server refuses it (before 1.27, or
/// the `WatchList` feature gate off: `422 Invalid`). A cached list is one response of every
/// object (174 MB of JSON at 100,000 IPAM blocks, held whole while its objects are decoded);
/// a streaming list holds one object at a time.
pub fn streaming_lists() -> watcher::Config {
    cache_lists().streaming_lists()
}

/// The watcher settings: lists from the API server's watch cache
/// (`resourceVersion=0&resourceVersionMatch=NotOlderThan`), not quorum reads from etcd, since
/// every node lists at once when the DaemonSet rolls. Without a page size: kube
/// drops `resourceVersion=0` from a request with `limit` (kube-core `ListParams::populate_qp`),
/// and API servers before 1.33 serve cached lists whole anyway. Bookmarks on, 290 s watches.
pub fn cache_lists() -> watcher::Config {
    let mut config = watcher::Config::default().any_semantic();
    config.page_size = None;
    config
}

/// Deletions are held this long after every completed list: a list served from the watch
/// cache may lag etcd by a moment, and an object it lacks is evidence of a deletion only once
/// the watch from the list's resourceVersion has delivered what happened since.
pub const DEFAULT_LIST_SETTLE: Duration = Duration::from_secs(10);

/// The retry delays of discovery and of a failed watcher: [`crate::datastore::retry_delays`]
/// (500 ms doubling to 5 s, each with up to 100 % random jitter added, so every delay is under
/// 10 s and agents that failed together retry apart; endless). kube-runtime's `DefaultBackoff` grows to
/// 30 s (+ jitter) and resets only after 120 s without errors: after a 20 s outage an agent
/// could stay unsynced for most of a minute after the server was back.
pub fn default_backoff() -> Box<dyn Backoff> {
    Box::new(watcher::ExponentialBackoff::from(crate::datastore::retry_delays()))
}

/// Makes the backoff policy of one watcher (one per resource, plus one for discovery).
pub type BackoffFactory = Arc<dyn Fn() -> Box<dyn Backoff> + Send + Sync>;

/// How long a watch may deliver neither an event nor a bookmark, once its API server has sent
/// it a bookmark, before it is stale and re-listed (`--kube-watch-silence`): the API server's
/// watch cache sends every bookmark-enabled watch a bookmark each minute and one just before
/// the watch's timeout (k8s.io/apiserver `pkg/storage/cacher/cacher.go`,
/// `defaultBookmarkFrequency`), so 90 s is one interval plus a 30 s margin.
pub const DEFAULT_WATCH_SILENCE: Duration = Duration::from_secs(90);

/// What one list then watch of a resource yields.
pub(crate) type WatchItem<K> = Result<Event<K>, WatchFailure>;

/// One list of the resource (`Init`, an `InitApply` per object, `InitDone`), then a watch from
/// the list's resourceVersion (`Apply`, `Delete`), restarted from the last resourceVersion seen
/// (an event's or a bookmark's) whenever the server closes it, as kube-runtime's watcher does.
/// Ends after the first failure, which it yields ([`relisting_watcher`] starts it again).
///
/// Unlike kube-runtime's watcher, whose bookmarks its consumer never sees, it tells a quiet
/// watch from a hung one: once the server has sent a bookmark on this watch, `silence` (if
/// `Some`) without an event or a bookmark yields [`WatchFailure::Silent`]. A server that never
/// sends bookmarks (an old one, an aggregated API server without a watch cache) never arms
/// it; such a watch is only restarted after `timeoutSeconds` + 5 s of silence, quietly, as kube
/// does, and a hung server is the `/version` probe's to notice.
#[expect(
    clippy::too_many_lines,
    reason = "one state machine: a list and a streaming list are two ways into the same watch, and each transition is read in one place"
)]
pub(crate) fn list_watch<K>(api: Api<K>, config: watcher::Config, silence: Option<Duration>) -> impl futures::Stream<Item = WatchItem<K>> + Send
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    enum Phase<K> {
        Start,
        /// Listing the page after `continue_token` (`None`: the first).
        List {
            continue_token: Option<String>,
        },
        /// Handing out one page's objects; then the next page, or `InitDone` at `version`.
        Page {
            objects: ListPage<K>,
            continue_token: Option<String>,
            version: Option<String>,
        },
        /// Starting a watch from `version`.
        Watch {
            version: String,
        },
        Watching {
            version: String,
            stream: BoxStream<'static, kube::Result<WatchEvent<K>>>,
        },
        /// Starting a streaming list: a watch from `0` with `sendInitialEvents=true`.
        StreamStart,
        /// A streaming list's initial events (`any`: one was handed out), until the bookmark
        /// that ends them; then the same watch goes on as [`Phase::Watching`].
        Streaming {
            stream: BoxStream<'static, kube::Result<WatchEvent<K>>>,
            any: bool,
        },
        Ended,
    }
    struct State<K> {
        api: Api<K>,
        list: ListParams,
        watch: WatchParams,
        /// The streaming list's watch, or `None` for a list then a watch.
        stream_list: Option<WatchParams>,
        silence: Option<Duration>,
        /// The server sent a bookmark on this watch: silence is a fault from now on.
        bookmarked: bool,
        phase: Phase<K>,
    }
    impl<K> State<K> {
        /// The silence that fails the watch: armed once the server has sent a bookmark.
        fn armed(&self) -> Option<Duration> {
            self.silence.filter(|_| self.bookmarked)
        }

        /// How long to wait for the watch's next event: the armed silence, else kube's
        /// dead-connection window (the server's timeout plus 5 s).
        fn wait_limit(&self) -> Duration {
            self.armed().unwrap_or_else(|| Duration::from_secs(u64::from(self.watch.timeout.unwrap_or(290)) + 5))
        }
    }
    let streaming = config.initial_list_strategy == InitialListStrategy::StreamingList;
    let (list, watch) = request_params(config);
    let stream_list = streaming.then(|| WatchParams { send_initial_events: true, bookmarks: true, ..watch.clone() });
    let state = State { api, list, watch, stream_list, silence, bookmarked: false, phase: Phase::Start };
    futures::stream::unfold(state, |mut s| async move {
        loop {
            let (item, next) = match std::mem::replace(&mut s.phase, Phase::Ended) {
                Phase::Ended => return None,
                Phase::Start if s.stream_list.is_some() => (Some(Ok(Event::Init)), Phase::StreamStart),
                Phase::Start => (Some(Ok(Event::Init)), Phase::List { continue_token: None }),
                Phase::StreamStart => {
                    let params = s.stream_list.clone().unwrap_or_default();
                    match s.api.watch(&params, "0").await {
                        Ok(stream) => (None, Phase::Streaming { stream: stream.boxed(), any: false }),
                        Err(kube::Error::Api(status)) if refuses_streaming(&status) => {
                            tracing::debug!(code = status.code, message = %status.message, "kubernetes datastore: streaming list refused; a cached list instead");
                            s.stream_list = None;
                            (None, Phase::List { continue_token: None })
                        }
                        Err(e) => (Some(Err(watcher::Error::WatchStartFailed(e).into())), Phase::Ended),
                    }
                }
                Phase::Streaming { mut stream, any } => {
                    let armed = s.armed();
                    match tokio::time::timeout(s.wait_limit(), stream.next()).await {
                        Err(_) => match armed {
                            Some(silent) => (Some(Err(WatchFailure::Silent { silent })), Phase::Ended),
                            // Closed or idle before the list ended: list again from the start.
                            None => (Some(Ok(Event::Init)), Phase::StreamStart),
                        },
                        Ok(None) => (Some(Ok(Event::Init)), Phase::StreamStart),
                        Ok(Some(Ok(WatchEvent::Added(o) | WatchEvent::Modified(o)))) => (Some(Ok(Event::InitApply(o))), Phase::Streaming { stream, any: true }),
                        // Not part of a current state; the end bookmark's version covers it.
                        Ok(Some(Ok(WatchEvent::Deleted(_)))) => (None, Phase::Streaming { stream, any }),
                        Ok(Some(Ok(WatchEvent::Bookmark(b)))) => {
                            s.bookmarked = true;
                            let end = b.metadata.annotations.get(INITIAL_EVENTS_END).is_some_and(|v| v == "true");
                            match (end, b.metadata.resource_version) {
                                (true, version) if !version.is_empty() => (Some(Ok(Event::InitDone)), Phase::Watching { version, stream }),
                                (true, _) => (Some(Err(watcher::Error::NoResourceVersion.into())), Phase::Ended),
                                (false, _) => (None, Phase::Streaming { stream, any }),
                            }
                        }
                        Ok(Some(Ok(WatchEvent::Error(status)))) if !any && refuses_streaming(&status) => {
                            s.stream_list = None;
                            (None, Phase::List { continue_token: None })
                        }
                        Ok(Some(Ok(WatchEvent::Error(status)))) => (Some(Err(watcher::Error::WatchError(status).into())), Phase::Ended),
                        Ok(Some(Err(e))) => (Some(Err(watcher::Error::WatchFailed(e).into())), Phase::Ended),
                    }
                }
                Phase::List { continue_token } => {
                    let mut lp = s.list.clone();
                    lp.continue_token = continue_token;
                    match ListPage::fetch(&s.api, &lp).await {
                        Ok((objects, metadata)) => (
                            None,
                            Phase::Page {
                                objects,
                                continue_token: metadata.continue_.filter(|c| !c.is_empty()),
                                version: metadata.resource_version.filter(|v| !v.is_empty()),
                            },
                        ),
                        Err(e) => (Some(Err(watcher::Error::InitialListFailed(e).into())), Phase::Ended),
                    }
                }
                Phase::Page { mut objects, continue_token, version } => match (objects.next(), continue_token, version) {
                    (Some(Ok(o)), continue_token, version) => (Some(Ok(Event::InitApply(o))), Phase::Page { objects, continue_token, version }),
                    // What `Api::list` would have failed the whole list with.
                    (Some(Err(e)), ..) => (Some(Err(watcher::Error::InitialListFailed(kube::Error::SerdeError(e)).into())), Phase::Ended),
                    (None, Some(token), _) => (None, Phase::List { continue_token: Some(token) }),
                    (None, None, Some(version)) => (Some(Ok(Event::InitDone)), Phase::Watch { version }),
                    (None, None, None) => (Some(Err(watcher::Error::NoResourceVersion.into())), Phase::Ended),
                },
                Phase::Watch { version } => match s.api.watch(&s.watch, &version).await {
                    Ok(stream) => (None, Phase::Watching { version, stream: stream.boxed() }),
                    Err(e) => (Some(Err(watcher::Error::WatchStartFailed(e).into())), Phase::Ended),
                },
                Phase::Watching { version, mut stream } => {
                    let armed = s.armed();
                    match tokio::time::timeout(s.wait_limit(), stream.next()).await {
                        Err(_) => match armed {
                            Some(silent) => (Some(Err(WatchFailure::Silent { silent })), Phase::Ended),
                            None => (None, Phase::Watch { version }),
                        },
                        // Closed by the server (its timeout): resume where it ended.
                        Ok(None) => (None, Phase::Watch { version }),
                        Ok(Some(Ok(WatchEvent::Added(o) | WatchEvent::Modified(o)))) => match o.resource_version().filter(|v| !v.is_empty()) {
                            Some(version) => (Some(Ok(Event::Apply(o))), Phase::Watching { version, stream }),
                            None => (Some(Err(watcher::Error::NoResourceVersion.into())), Phase::Ended),
                        },
                        Ok(Some(Ok(WatchEvent::Deleted(o)))) => match o.resource_version().filter(|v| !v.is_empty()) {
                            Some(version) => (Some(Ok(Event::Delete(o))), Phase::Watching { version, stream }),
                            None => (Some(Err(watcher::Error::NoResourceVersion.into())), Phase::Ended),
                        },
                        Ok(Some(Ok(WatchEvent::Bookmark(b)))) => {
                            s.bookmarked = true;
                            (None, Phase::Watching { version: b.metadata.resource_version, stream })
                        }
                        // 410 Gone and every other error: re-list (the caller restarts).
                        Ok(Some(Ok(WatchEvent::Error(status)))) => (Some(Err(watcher::Error::WatchError(status).into())), Phase::Ended),
                        Ok(Some(Err(e))) => (Some(Err(watcher::Error::WatchFailed(e).into())), Phase::Ended),
                    }
                }
            };
            s.phase = next;
            if let Some(item) = item {
                return Some((item, s));
            }
        }
    })
}

/// The annotation of the bookmark that ends a streaming list's initial events.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// Whether the API server refused a streaming list as such (`422 Invalid`: before 1.27
/// `resourceVersionMatch` is forbidden for a watch; from 1.27 `sendInitialEvents` is, unless
/// the `WatchList` feature gate is on; `400` from servers that reject unknown parameters):
/// then a cached list is made instead.
fn refuses_streaming(status: &kube::core::Status) -> bool {
    matches!(status.code, 400 | 422)
}

/// One list response, kept as its JSON text and the place of each object in it; each object is
/// decoded (as `K`) only when it is handed out, then dropped by the consumer.
///
/// `Api::list` decodes every object of a response before the first is handed out: a whole
/// list of 100,000 IPAM blocks lived at once as decoded objects, about 1.7 GB (kube-100k's
/// peak RSS). Here the peak is the text, and the objects one at a time.
pub(crate) struct ListPage<K> {
    text: String,
    /// Byte ranges of `text`, one per `items` element, in order.
    items: std::vec::IntoIter<std::ops::Range<usize>>,
    /// The index in `items` of the next object.
    next: usize,
    object: std::marker::PhantomData<fn() -> K>,
}

/// A list response with its objects left undecoded (`items: null` reads as none).
#[derive(serde::Deserialize)]
struct RawList<'a> {
    #[serde(default)]
    metadata: ListMeta,
    #[serde(borrow, default)]
    items: Option<Vec<&'a serde_json::value::RawValue>>,
}

impl<K: kube::Resource + Clone + serde::de::DeserializeOwned> ListPage<K> {
    /// The list request `Api::list` makes (`GET <resource url>?<lp>`, kube's `list` request
    /// extension for its metrics), and the response's list metadata.
    ///
    /// Errors: kube's, as `Api::list` returns them (the request, an API status, JSON that is
    /// not a list: `Error::SerdeError`).
    pub(crate) async fn fetch(api: &Api<K>, lp: &ListParams) -> kube::Result<(ListPage<K>, ListMeta)> {
        let mut request = kube::core::Request::new(api.resource_url()).list(lp).map_err(kube::Error::BuildRequest)?;
        request.extensions_mut().insert("list");
        let text = api.clone().into_client().request_text(request).await?;
        let raw: RawList<'_> = serde_json::from_str(&text).map_err(kube::Error::SerdeError)?;
        let base = text.as_ptr().addr();
        let items: Vec<_> = raw
            .items
            .unwrap_or_default()
            .iter()
            .map(|item| {
                let start = item.get().as_ptr().addr() - base;
                start..start + item.get().len()
            })
            .collect();
        let metadata = raw.metadata;
        Ok((ListPage { text, items: items.into_iter(), next: 0, object: std::marker::PhantomData }, metadata))
    }
}

impl<K: serde::de::DeserializeOwned> Iterator for ListPage<K> {
    /// The next object; an error names it by its index (`items[3]: invalid type: …`, the
    /// line and column counted within that object).
    type Item = Result<K, serde_json::Error>;

    fn next(&mut self) -> Option<Self::Item> {
        let range = self.items.next()?;
        let index = self.next;
        self.next += 1;
        Some(serde_json::from_str(&self.text[range]).map_err(|e| <serde_json::Error as serde::de::Error>::custom(format!("items[{index}]: {e}"))))
    }
}

/// The list and watch parameters of `config`, the requests kube-runtime's watcher makes
/// (`to_list_params`, `to_watch_params` in kube-runtime `watcher.rs`), so a list served from
/// the watch cache reads `?&resourceVersion=0&resourceVersionMatch=NotOlderThan` and a watch
/// `?&watch=true&timeoutSeconds=290&allowWatchBookmarks=true&resourceVersion=<v>`.
fn request_params(config: watcher::Config) -> (ListParams, WatchParams) {
    let (resource_version, version_match) = match config.list_semantic {
        ListSemantic::Any => (Some("0".to_owned()), Some(VersionMatch::NotOlderThan)),
        ListSemantic::MostRecent => (None, None),
    };
    let list = ListParams {
        label_selector: config.label_selector.clone(),
        field_selector: config.field_selector.clone(),
        resource_version,
        version_match,
        limit: config.page_size,
        ..ListParams::default()
    };
    let watch = WatchParams {
        label_selector: config.label_selector,
        field_selector: config.field_selector,
        timeout: config.timeout,
        bookmarks: config.bookmarks,
        send_initial_events: false,
    };
    (list, watch)
}

/// A [`list_watch`] that starts again (and so re-lists) after every failure, after the next
/// backoff delay.
///
/// kube-runtime's own watcher resumes a failed watch from its last resourceVersion without
/// telling its consumer when the resumed watch is healthy again; starting again gives an
/// explicit `Init` … `InitDone` after every failure, which is what "synced again" means here.
/// `410 Gone` and a silent watch re-list either way. The stream never ends.
pub(super) fn relisting_watcher<K>(
    api: Api<K>,
    config: watcher::Config,
    silence: Option<Duration>,
    backoff: Box<dyn Backoff>,
) -> impl futures::Stream<Item = WatchItem<K>> + Send
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    struct State<K> {
        api: Api<K>,
        config: watcher::Config,
        silence: Option<Duration>,
        backoff: Box<dyn Backoff>,
        inner: Option<BoxStream<'static, WatchItem<K>>>,
        wait: Option<Duration>,
    }
    let state = State { api, config, silence, backoff, inner: None, wait: None };
    futures::stream::unfold(state, |mut s| async move {
        if let Some(wait) = s.wait.take() {
            tokio::time::sleep(wait).await;
        }
        let item = loop {
            let inner = s.inner.get_or_insert_with(|| list_watch(s.api.clone(), s.config.clone(), s.silence).boxed());
            match inner.next().await {
                Some(item) => break item,
                // Only after a failure, which was yielded: start again.
                None => s.inner = None,
            }
        };
        if matches!(item, Ok(Event::InitDone)) {
            // A complete list: the server is back; the next failure starts from the shortest delay.
            s.backoff.reset();
        }
        if item.is_err() {
            s.inner = None;
            s.wait = Some(s.backoff.next().unwrap_or(Duration::from_secs(30)));
        }
        Some((item, s))
    })
}

/// The watcher items of `target`, each object decoded as [`Trimmed`] in the shape of its
/// kind (Nodes: [`NodeAddresses`]; the calico-node DaemonSet: [`CalicoNodeContainers`]; the
/// Installation: [`RoutingMode`]; Calico kinds: [`CalicoSpec`]), then made shape-free. With
/// `relist`, a [`relisting_watcher`] with that backoff and `silence` (the run loop); without,
/// one [`list_watch`] (the one-shot load, which stops at the first `InitDone`).
pub(super) fn trimmed_watch(
    target: &WatchTarget,
    client: &kube::Client,
    config: watcher::Config,
    silence: Option<Duration>,
    relist: Option<Box<dyn Backoff>>,
) -> BoxStream<'static, WatchItem<TrimmedObject>> {
    fn shaped<S: Shape>(
        api: Api<Trimmed<S>>,
        config: watcher::Config,
        silence: Option<Duration>,
        relist: Option<Box<dyn Backoff>>,
    ) -> BoxStream<'static, WatchItem<TrimmedObject>> {
        let erase = |item: WatchItem<Trimmed<S>>| {
            item.map(|event| match event {
                Event::Apply(o) => Event::Apply(o.into_object()),
                Event::Delete(o) => Event::Delete(o.into_object()),
                Event::InitApply(o) => Event::InitApply(o.into_object()),
                Event::Init => Event::Init,
                Event::InitDone => Event::InitDone,
            })
        };
        match relist {
            Some(backoff) => relisting_watcher(api, config, silence, backoff).map(erase).boxed(),
            None => list_watch(api, config, silence).map(erase).boxed(),
        }
    }
    match target.kind {
        Kind::Node => shaped::<NodeAddresses>(target.api(client), config, silence, relist),
        Kind::DaemonSet => shaped::<CalicoNodeContainers>(target.api(client), config, silence, relist),
        Kind::Installation => shaped::<RoutingMode>(target.api(client), config, silence, relist),
        _ => shaped::<CalicoSpec>(target.api(client), config, silence, relist),
    }
}
