//! How one resource is watched: what a watcher reads ([`WatchTarget`]), the watcher settings
//! ([`cache_lists`]), the list settle ([`DEFAULT_LIST_SETTLE`]), the retry delays
//! ([`default_backoff`]), the watcher that re-lists after every error
//! ([`relisting_watcher`]), and the watch of one target in its kind's trimmed shape
//! ([`trimmed_watch`]).

use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::StreamExt;
use kube::api::{Api, ApiResource};
use kube::core::DynamicResourceScope;
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, Event};

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

/// The watcher settings: lists from the API server's watch cache
/// (`resourceVersion=0&resourceVersionMatch=NotOlderThan`), not quorum reads from etcd, since
/// every node lists at once when the DaemonSet rolls (issue 23). Without a page size: kube
/// drops `resourceVersion=0` from a request with `limit` (kube-core `ListParams::populate_qp`),
/// and API servers before 1.33 serve cached lists whole anyway. Bookmarks on, 290 s watches.
pub fn cache_lists() -> watcher::Config {
    let mut config = watcher::Config::default().any_semantic();
    config.page_size = None;
    config
}

/// Deletions are held this long after every completed list: a list served from the watch
/// cache may lag etcd by a moment, and an object it lacks is evidence of a deletion only once
/// the watch from the list's resourceVersion has delivered what happened since (issue 23).
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

/// A watcher that restarts (and so re-lists) after every error, after the next backoff delay.
///
/// kube-runtime's own watcher resumes a failed watch from its last resourceVersion without
/// telling its consumer when the resumed watch is healthy again; restarting gives an explicit
/// `Init` … `InitDone` after every failure, which is what "synced again" means here. `410
/// Gone` re-lists either way. The stream never ends.
pub(super) fn relisting_watcher<K>(
    api: Api<K>,
    config: watcher::Config,
    backoff: Box<dyn Backoff>,
) -> impl futures::Stream<Item = watcher::Result<Event<K>>> + Send
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    struct State<K> {
        api: Api<K>,
        config: watcher::Config,
        backoff: Box<dyn Backoff>,
        inner: Option<BoxStream<'static, watcher::Result<Event<K>>>>,
        wait: Option<Duration>,
    }
    let state = State { api, config, backoff, inner: None, wait: None };
    futures::stream::unfold(state, |mut s| async move {
        if let Some(wait) = s.wait.take() {
            tokio::time::sleep(wait).await;
        }
        let inner = s.inner.get_or_insert_with(|| watcher::watcher(s.api.clone(), s.config.clone()).boxed());
        let item = inner.next().await?;
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
/// `relist`, a [`relisting_watcher`] with that backoff (the run loop); without, kube's
/// watcher (the one-shot load, which stops at the first `InitDone`).
pub(super) fn trimmed_watch(
    target: &WatchTarget,
    client: &kube::Client,
    config: watcher::Config,
    relist: Option<Box<dyn Backoff>>,
) -> BoxStream<'static, watcher::Result<Event<TrimmedObject>>> {
    fn shaped<S: Shape>(
        api: Api<Trimmed<S>>,
        config: watcher::Config,
        relist: Option<Box<dyn Backoff>>,
    ) -> BoxStream<'static, watcher::Result<Event<TrimmedObject>>> {
        let erase = |item: watcher::Result<Event<Trimmed<S>>>| {
            item.map(|event| match event {
                Event::Apply(o) => Event::Apply(o.into_object()),
                Event::Delete(o) => Event::Delete(o.into_object()),
                Event::InitApply(o) => Event::InitApply(o.into_object()),
                Event::Init => Event::Init,
                Event::InitDone => Event::InitDone,
            })
        };
        match relist {
            Some(backoff) => relisting_watcher(api, config, backoff).map(erase).boxed(),
            None => watcher::watcher(api, config).map(erase).boxed(),
        }
    }
    match target.kind {
        Kind::Node => shaped::<NodeAddresses>(target.api(client), config, relist),
        Kind::DaemonSet => shaped::<CalicoNodeContainers>(target.api(client), config, relist),
        Kind::Installation => shaped::<RoutingMode>(target.api(client), config, relist),
        _ => shaped::<CalicoSpec>(target.api(client), config, relist),
    }
}
