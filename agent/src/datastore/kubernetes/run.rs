//! The Kubernetes datastore itself: how to reach the API server ([`KubernetesOptions`],
//! [`KubernetesDatastore::connect`]), its settings, the one-shot load (`explain`, `audit`) and
//! the run loop, which moves watcher items, probe verdicts and debounce deadlines into the
//! [`View`] and the events it returns out. The decisions are the view's; this file does the I/O.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use std::collections::{BTreeMap, HashMap};

use futures::future::BoxFuture;
use futures::stream::{AbortHandle, BoxStream, SelectAll};
use futures::{FutureExt, StreamExt};
use kube::runtime::watcher::{self, Event};
use kube::Client;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::discovery::{discover, discover_operator, rediscover, ApiGroupChoice, Rediscovered};
use super::error::{KubernetesError, WatchFailure};
use super::probe::{spawn_probe, Probe, DEFAULT_PROBE, PROBE_MISSES_BEFORE_RELIST};
use super::resources::{optional_sources, CalicoGroup, OPERATOR_API_VERSION};
use super::trimmed::TrimmedObject;
use super::view::View;
use super::watch::{
    cache_lists, default_backoff, streaming_lists, trimmed_watch, BackoffFactory, WatchItem, WatchTarget, DEFAULT_LIST_SETTLE, DEFAULT_WATCH_SILENCE,
};
use crate::datastore::error::DatastoreError;
use crate::datastore::event::{Datastore, DatastoreEvent, Snapshot};
use crate::model::{CalicoGroupChange, OptionalSource};

/// `User-Agent: routewarden/<version>` on every request (kube sends none), so API server audit
/// logs and API Priority and Fairness can tell the agents apart (`deploy/flowschema.yaml`).
pub fn user_agent() -> (http::HeaderName, http::HeaderValue) {
    (http::header::USER_AGENT, http::HeaderValue::from_static(concat!("routewarden/", env!("CARGO_PKG_VERSION"))))
}

/// Default debounce window: at most one snapshot per window, so changes within it become one
/// snapshot (an initial list of 10,000 IPAM blocks is one snapshot, not 10,000); a change after
/// a quiet window is sent after [`QUIET_COALESCE`] (`flush_at`).
/// 50 ms: a snapshot and a plan that changes no route cost ~1 ms at 100,000 IPAM blocks, so
/// the window bounds how late a change is under churn (kube-100k's p99), while a
/// plan that is longer than the window only makes the app skip to the newest snapshot.
pub const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(50);

/// How long a change that finds the datastore quiet waits for others in flight with it (the
/// rest of one watch response, a node's several blocks) before its snapshot is sent.
pub const QUIET_COALESCE: Duration = Duration::from_millis(5);

/// When to flush a view that just became dirty at `now`, given the start of the last flush
/// and the debounce `window`: never sooner than `window` after the last flush (under churn one
/// snapshot per window, as before), but a change that finds the datastore quiet (the last
/// flush a window or more ago) goes after [`QUIET_COALESCE`] instead of waiting a whole window
/// (a lone block change reached the plan ≥ 100 ms late).
pub(crate) fn flush_at(now: Instant, last_flush: Option<Instant>, window: Duration) -> Instant {
    let quiet = now + QUIET_COALESCE.min(window);
    match last_flush {
        Some(last) => quiet.max(last + window),
        None => quiet,
    }
}

/// Default `--discovery-interval`: API discovery runs again every 5 minutes, so an API group
/// installed after the agent (the operator's `operator.tigera.io/v1`) is read without a
/// restart. Each run is one `GET /apis` when nothing changed ([`rediscover`]).
pub const DEFAULT_DISCOVERY_INTERVAL: Duration = Duration::from_mins(5);

/// How long one discovery run while the datastore runs may take before it is given up (as
/// the probe's limit); the next timer tick or 404 tries again.
const REDISCOVERY_TIMEOUT: Duration = Duration::from_secs(10);

/// How to reach the API server and which Calico group to read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubernetesOptions {
    /// A kubeconfig file; `None`: `KUBECONFIG` / `~/.kube/config`, else the in-cluster service
    /// account (kube's `Config::infer`).
    pub kubeconfig: Option<PathBuf>,
    /// `--calico-api-group`.
    pub api_group: ApiGroupChoice,
    /// `--kube-watch-silence`: a watch that has had bookmarks and then neither an event nor a
    /// bookmark for this long is stale and re-listed; `None` never ([`DEFAULT_WATCH_SILENCE`]).
    pub watch_silence: Option<Duration>,
    /// `--discovery-interval`: API discovery runs again this often (besides when a watch
    /// answers 404); `None`: only on a 404 ([`DEFAULT_DISCOVERY_INTERVAL`]).
    pub discovery_interval: Option<Duration>,
}

impl Default for KubernetesOptions {
    fn default() -> KubernetesOptions {
        KubernetesOptions {
            kubeconfig: None,
            api_group: ApiGroupChoice::default(),
            watch_silence: Some(DEFAULT_WATCH_SILENCE),
            discovery_interval: Some(DEFAULT_DISCOVERY_INTERVAL),
        }
    }
}

/// The datastore. Cheap to clone (the client is shared).
#[derive(Clone)]
pub struct KubernetesDatastore {
    /// Shared with the tests, which call discovery through it.
    pub(super) client: Client,
    api_group: ApiGroupChoice,
    debounce: Duration,
    backoff: BackoffFactory,
    watcher_config: watcher::Config,
    list_settle: Duration,
    watch_silence: Option<Duration>,
    discovery_interval: Option<Duration>,
    probe: Probe,
    description: String,
}

impl fmt::Debug for KubernetesDatastore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubernetesDatastore")
            .field("api_group", &self.api_group)
            .field("debounce", &self.debounce)
            .field("description", &self.description)
            .finish_non_exhaustive()
    }
}

impl KubernetesDatastore {
    /// A datastore reading through `client` (tests pass a client over a mocked service).
    pub fn new(client: Client, api_group: ApiGroupChoice) -> KubernetesDatastore {
        KubernetesDatastore {
            client,
            api_group,
            debounce: DEFAULT_DEBOUNCE,
            backoff: Arc::new(default_backoff),
            watcher_config: cache_lists(),
            list_settle: DEFAULT_LIST_SETTLE,
            watch_silence: Some(DEFAULT_WATCH_SILENCE),
            discovery_interval: Some(DEFAULT_DISCOVERY_INTERVAL),
            probe: DEFAULT_PROBE,
            description: format!("kubernetes (calico api group: {api_group})"),
        }
    }

    /// Build the client from `--kubeconfig`, else `KUBECONFIG` / `~/.kube/config`, else the
    /// in-cluster service account. Makes no request.
    ///
    /// Errors: [`KubernetesError::Kubeconfig`], [`KubernetesError::InferConfig`],
    /// [`KubernetesError::Client`].
    pub async fn connect(options: &KubernetesOptions) -> Result<KubernetesDatastore, KubernetesError> {
        let config = match &options.kubeconfig {
            Some(path) => {
                let kc = kube::config::Kubeconfig::read_from(path).map_err(|source| KubernetesError::Kubeconfig { path: path.clone(), source })?;
                kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                    .await
                    .map_err(|source| KubernetesError::Kubeconfig { path: path.clone(), source })?
            }
            None => kube::Config::infer().await.map_err(|source| KubernetesError::InferConfig { source })?,
        };
        let url = config.cluster_url.to_string();
        let mut config = config;
        config.headers.push(user_agent());
        let client = Client::try_from(config).map_err(|source| KubernetesError::Client { source })?;
        let mut ds =
            KubernetesDatastore::new(client, options.api_group).with_watch_silence(options.watch_silence).with_discovery_interval(options.discovery_interval);
        ds.description = format!("kubernetes:{url} (calico api group: {})", options.api_group);
        // A live API server: streaming lists where it serves them; the tests' scripted fakes
        // (`new`) script cached lists.
        Ok(ds.with_streaming_lists(true))
    }

    /// The client it reads with (shared: the agent's Node Events use it too).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// Read each resource first with a streaming list (`sendInitialEvents=true`, falling back
    /// to a cached list where the API server refuses it), as [`KubernetesDatastore::connect`]
    /// does, or (`false`, the default of [`KubernetesDatastore::new`]) with a cached list.
    #[must_use]
    pub fn with_streaming_lists(mut self, on: bool) -> KubernetesDatastore {
        self.watcher_config = if on { streaming_lists() } else { cache_lists() };
        self
    }

    /// Debounce window (default [`DEFAULT_DEBOUNCE`], 50 ms).
    #[must_use]
    pub fn with_debounce(mut self, debounce: Duration) -> KubernetesDatastore {
        self.debounce = debounce;
        self
    }

    /// Backoff between retries of discovery and restarts of a failed watcher (default:
    /// [`default_backoff`]).
    #[must_use]
    pub fn with_backoff(mut self, backoff: BackoffFactory) -> KubernetesDatastore {
        self.backoff = backoff;
        self
    }

    /// Deletions held after every completed list (default [`DEFAULT_LIST_SETTLE`]).
    #[must_use]
    pub fn with_list_settle(mut self, settle: Duration) -> KubernetesDatastore {
        self.list_settle = settle;
        self
    }

    /// How long a watch that has had bookmarks may stay silent before it is stale and
    /// re-listed (default [`DEFAULT_WATCH_SILENCE`]; `None`: never).
    #[must_use]
    pub fn with_watch_silence(mut self, silence: Option<Duration>) -> KubernetesDatastore {
        self.watch_silence = silence;
        self
    }

    /// How often API discovery runs again (default [`DEFAULT_DISCOVERY_INTERVAL`]; `None`:
    /// only when a watch answers 404).
    #[must_use]
    pub fn with_discovery_interval(mut self, interval: Option<Duration>) -> KubernetesDatastore {
        self.discovery_interval = interval;
        self
    }

    /// The API server probe (default [`DEFAULT_PROBE`]).
    #[must_use]
    pub fn with_probe(mut self, probe: Probe) -> KubernetesDatastore {
        self.probe = probe;
        self
    }

    /// One-shot load (for `explain` and `audit`): discovery, then one complete list of every
    /// resource. No watch is started.
    ///
    /// Errors: discovery errors, and [`KubernetesError::List`] for the first resource that
    /// could not be listed. Object errors do not fail the load; they are in
    /// [`Snapshot::object_errors`].
    pub async fn load(&self) -> Result<Snapshot, DatastoreError> {
        let group = discover(&self.client, self.api_group).await?;
        let operator = discover_operator(&self.client).await?;
        let mut view = View::new(group, &optional_sources(operator));
        for (index, target) in view.targets().into_iter().enumerate() {
            let mut stream = trimmed_watch(&target, &self.client, target.config(&self.watcher_config), None, None);
            while let Some(item) = stream.next().await {
                match item {
                    Ok(event) => {
                        let done = matches!(event, Event::InitDone);
                        view.apply(index, Ok(event));
                        if done {
                            break;
                        }
                    }
                    // An optional source that cannot be read is a finding, not a failure.
                    Err(source) if target.optional.is_some() => {
                        view.apply(index, Err(source));
                        break;
                    }
                    Err(source) => {
                        return Err(KubernetesError::List { resource: view.resource_label(index), cause: source }.into());
                    }
                }
            }
        }
        Ok(view.snapshot())
    }

    /// Spawn [`Datastore::run`] on the current Tokio runtime.
    pub fn spawn(self, tx: mpsc::Sender<DatastoreEvent>) -> tokio::task::JoinHandle<Result<(), DatastoreError>> {
        tokio::spawn(self.run(tx))
    }

    /// Discover the Calico group, retrying with backoff until it succeeds or `tx` closes.
    /// Each distinct failure is sent once as [`DatastoreEvent::Unsynced`].
    async fn discover_until_ok(&self, tx: &mpsc::Sender<DatastoreEvent>) -> Option<(CalicoGroup, bool)> {
        let mut backoff = (self.backoff)();
        let mut last: Option<String> = None;
        loop {
            let found = match discover(&self.client, self.api_group).await {
                Ok(group) => discover_operator(&self.client).await.map(|operator| (group, operator)),
                Err(e) => Err(e),
            };
            match found {
                Ok(found) => return Some(found),
                Err(e) => {
                    let reason = e.to_string();
                    tracing::warn!(error = %reason, "kubernetes datastore: API discovery failed; retrying");
                    if last.as_deref() != Some(reason.as_str()) {
                        if tx.send(DatastoreEvent::Unsynced { reason: reason.clone() }).await.is_err() {
                            return None;
                        }
                        last = Some(reason);
                    }
                }
            }
            let wait = backoff.next().unwrap_or(Duration::from_secs(30));
            tokio::select! {
                () = tx.closed() => return None,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// The watch of `target` (a relisting watcher with this datastore's settings).
    fn watch(&self, target: &WatchTarget) -> BoxStream<'static, WatchItem<TrimmedObject>> {
        trimmed_watch(target, &self.client, target.config(&self.watcher_config), self.watch_silence, Some((self.backoff)()))
    }

    /// A watch of every resource `view` reads (a withdrawn source is not).
    fn watch_all(&self, view: &View) -> Watches {
        let mut watches = Watches::default();
        for (index, target) in view.targets().iter().enumerate().filter(|(i, _)| view.is_read(*i)) {
            watches.start(index, self.watch(target));
        }
        watches
    }

    /// One discovery run ([`rediscover`]) for `view`, given up after [`REDISCOVERY_TIMEOUT`].
    /// Errors: the failure in one line.
    fn rediscovery(&self, view: &View, confirm: bool) -> BoxFuture<'static, Result<Rediscovered, String>> {
        let (client, choice, read, reading) = (self.client.clone(), self.api_group, view.group(), view.reads(OptionalSource::Installation));
        async move {
            match tokio::time::timeout(REDISCOVERY_TIMEOUT, rediscover(&client, choice, read, reading, confirm)).await {
                Ok(found) => found.map_err(|e| e.to_string()),
                Err(_) => Err(format!("API discovery took longer than {} s", REDISCOVERY_TIMEOUT.as_secs())),
            }
        }
        .boxed()
    }

    /// Follow what discovery found: the operator's group served now starts its sources'
    /// watches (each lists, then is in the snapshots); gone, it stops the Installation's and
    /// withdraws it (`source-withdrawn`). The calico-node DaemonSet watches stay: they read
    /// `apps/v1`, which does not go with the operator. A Calico group `auto` would choose now
    /// instead of the one read is the `api-group-changed` finding; the group read stays (see
    /// DESIGN.md, "Datastores"). No other watch is touched.
    fn follow_discovery(&self, found: Rediscovered, view: &mut View, watches: &mut Watches) {
        if let Some(now) = found.calico {
            let read = view.group();
            let change = (now != read).then(|| CalicoGroupChange { read: read.api_version(), discovered: now.api_version() });
            if view.set_calico_group_change(change) {
                if change.is_some() {
                    tracing::warn!(%read, discovered = %now, "kubernetes datastore: API discovery now chooses another Calico group; still reading the one chosen at start (finding api-group-changed): restart to switch");
                } else {
                    tracing::info!(%read, "kubernetes datastore: API discovery chooses the Calico group read again");
                }
            }
        }
        let reading = view.reads(OptionalSource::Installation);
        if found.operator && !reading {
            tracing::info!(api_version = OPERATOR_API_VERSION, "kubernetes datastore: the operator's API group is served now; reading its sources");
            for source in optional_sources(true) {
                if let Some(index) = view.add_source(source) {
                    tracing::info!(source = %source.label(), "kubernetes datastore: reading an optional source");
                    watches.start(index, self.watch(&view.targets()[index]));
                }
            }
        } else if !found.operator && reading {
            tracing::warn!(
                api_version = OPERATOR_API_VERSION,
                "kubernetes datastore: the operator's API group is no longer served; Installation default dropped (finding source-withdrawn)"
            );
            if let Some(index) = view.withdraw_source(OptionalSource::Installation, OPERATOR_API_VERSION) {
                watches.stop(index);
            }
        }
    }
    /// Resource `index` answered 404 (`e`): discovery runs now, or again after the run in
    /// flight. An optional source's error waits for it ([`Again`]); a required one's is
    /// applied at once. Returns what to send.
    fn not_found(&self, again: &mut Again, view: &mut View, index: usize, e: WatchFailure) -> Vec<DatastoreEvent> {
        tracing::info!(resource = %view.resource_label(index), error = %e.describe(), "kubernetes datastore: a resource is not served; running API discovery again");
        if again.running.is_some() {
            again.rerun = true;
        } else {
            again.running = Some(self.rediscovery(view, true));
        }
        if view.optional_at(index).is_some() {
            again.held.insert(index, e);
            Vec::new()
        } else {
            view.apply(index, Err(e))
        }
    }

    /// A discovery run ended with `found`: follow it; then run again when a 404 asked for it
    /// meanwhile, else give the held errors to the sources still read. Returns what to send.
    fn discovered(&self, again: &mut Again, found: Result<Rediscovered, String>, view: &mut View, watches: &mut Watches) -> Vec<DatastoreEvent> {
        match found {
            Ok(found) => self.follow_discovery(found, view, watches),
            Err(reason) => tracing::warn!(%reason, "kubernetes datastore: API discovery failed; the view is kept as it is, trying again later"),
        }
        if std::mem::take(&mut again.rerun) {
            again.running = Some(self.rediscovery(view, true));
            return Vec::new();
        }
        let mut out = Vec::new();
        for (index, e) in std::mem::take(&mut again.held) {
            if view.is_read(index) {
                out.extend(view.apply(index, Err(e)));
            }
        }
        out
    }
}

/// API discovery again while the datastore runs: when the timer is due next, the run in flight
/// (one at a time; a 404 during a run asks for another), and the 404s of optional sources held
/// until a run says whether their group is still served: gone, they are withdrawn; still
/// there, the error is theirs (`source-unreadable`), so no finding flickers while discovery
/// runs.
#[derive(Default)]
struct Again {
    next: Option<Instant>,
    running: Option<BoxFuture<'static, Result<Rediscovered, String>>>,
    rerun: bool,
    held: BTreeMap<usize, WatchFailure>,
}

impl Again {
    /// The end of the run in flight (pending while there is none).
    async fn finished(&mut self) -> Result<Rediscovered, String> {
        let found = match self.running.as_mut() {
            Some(run) => run.await,
            None => std::future::pending().await,
        };
        self.running = None;
        found
    }
}

/// The running watches, one per resource read, each stoppable alone (a withdrawn source's)
/// without touching the others.
#[derive(Default)]
struct Watches {
    streams: SelectAll<BoxStream<'static, (usize, WatchItem<TrimmedObject>)>>,
    stops: HashMap<usize, AbortHandle>,
}

impl Watches {
    /// Run `stream` as resource `index`'s watch (stopping the one it had).
    fn start(&mut self, index: usize, stream: BoxStream<'static, WatchItem<TrimmedObject>>) {
        self.stop(index);
        let (stream, stop) = futures::stream::abortable(stream);
        self.stops.insert(index, stop);
        self.streams.push(stream.map(move |item| (index, item)).boxed());
    }

    /// Stop resource `index`'s watch: it yields nothing more.
    fn stop(&mut self, index: usize) {
        if let Some(stop) = self.stops.remove(&index) {
            stop.abort();
        }
    }
}

impl Datastore for KubernetesDatastore {
    fn describe(&self) -> String {
        self.description.clone()
    }

    async fn run(self, tx: mpsc::Sender<DatastoreEvent>) -> Result<(), DatastoreError> {
        let Some((group, operator)) = self.discover_until_ok(&tx).await else { return Ok(()) };
        let optional = optional_sources(operator);
        tracing::info!(group = %group, optional = ?optional.iter().map(|s| s.label()).collect::<Vec<_>>(), "kubernetes datastore: watching Calico objects and Nodes");
        let mut view = View::new(group, &optional).with_list_settle(self.list_settle);
        let mut watches = self.watch_all(&view);
        let mut again = Again { next: self.discovery_interval.map(|every| Instant::now() + every), ..Again::default() };
        let mut probes = spawn_probe(self.client.clone(), self.probe);
        // Probes in a row without an answer.
        let mut misses = 0u32;
        let mut deadline: Option<Instant> = None;
        // The window grows to twice the time the last flush took, so that a huge cluster under
        // constant churn spends at most about a third of a core building snapshots.
        let mut window = self.debounce;
        let mut last_flush: Option<Instant> = None;
        loop {
            // Every branch yields what to send; then one send and one debounce rule.
            let events = tokio::select! {
                () = tx.closed() => return Ok(()),
                next = watches.streams.next() => {
                    let Some((index, item)) = next else { return Ok(()) };
                    match item {
                        Err(e) if e.is_not_found() && view.is_read(index) && !view.failed_with(index, &e.describe()) => self.not_found(&mut again, &mut view, index, e),
                        item => view.apply(index, item),
                    }
                }
                () = tokio::time::sleep_until(again.next.unwrap_or_else(Instant::now)), if again.next.is_some() => {
                    again.next = self.discovery_interval.map(|every| Instant::now() + every);
                    if again.running.is_none() {
                        again.running = Some(self.rediscovery(&view, !again.held.is_empty()));
                    }
                    Vec::new()
                }
                found = again.finished(), if again.running.is_some() => self.discovered(&mut again, found, &mut view, &mut watches),
                Some(answered) = probes.recv() => match answered {
                    Ok(()) => {
                        if misses > 0 {
                            tracing::info!(misses, "kubernetes datastore: the API server answers again");
                        }
                        misses = 0;
                        view.set_stale(None)
                    }
                    Err(reason) => {
                        misses += 1;
                        if misses == 1 {
                            // Unsynced at once (nothing is deleted on a view nobody can
                            // confirm); the watches are left alone, a slow server is not
                            // helped by every agent re-listing.
                            tracing::warn!(%reason, "kubernetes datastore: the API server does not answer; deletions held");
                            view.set_stale(Some(&reason))
                        } else if misses == PROBE_MISSES_BEFORE_RELIST {
                            // Still silent: restart every watch (a hung one would stay
                            // silent until its own timeout); each re-lists, and the view is
                            // synced again only when every list completes.
                            tracing::warn!(%reason, misses, "kubernetes datastore: the API server is still silent; re-listing every resource");
                            watches = self.watch_all(&view);
                            view.restart_all(&reason)
                        } else {
                            Vec::new()
                        }
                    }
                },
                () = tokio::time::sleep_until(view.settle_deadline().map_or_else(Instant::now, Instant::from_std)), if deadline.is_none() && view.settle_deadline().is_some() => view.flush(),
                () = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                    deadline = None;
                    let started = Instant::now();
                    let events = view.flush();
                    window = self.debounce.max(started.elapsed() * 2);
                    last_flush = Some(started);
                    events
                }
            };
            for ev in events {
                if tx.send(ev).await.is_err() {
                    return Ok(());
                }
            }
            if view.is_dirty() && deadline.is_none() {
                deadline = Some(flush_at(Instant::now(), last_flush, window));
            }
        }
    }
}
