//! The Kubernetes datastore itself: how to reach the API server ([`KubernetesOptions`],
//! [`KubernetesDatastore::connect`]), its settings, the one-shot load (`explain`, `audit`) and
//! the run loop, which moves watcher items, probe verdicts and debounce deadlines into the
//! [`View`] and the events it returns out. The decisions are the view's; this file does the I/O.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{BoxStream, SelectAll};
use futures::StreamExt;
use kube::runtime::watcher::{self, Event};
use kube::Client;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::discovery::{discover, discover_operator, ApiGroupChoice};
use super::error::KubernetesError;
use super::probe::{spawn_probe, Probe, DEFAULT_PROBE, PROBE_MISSES_BEFORE_RELIST};
use super::resources::{optional_sources, CalicoGroup};
use super::trimmed::TrimmedObject;
use super::view::View;
use super::watch::{cache_lists, default_backoff, trimmed_watch, BackoffFactory, WatchItem, DEFAULT_LIST_SETTLE, DEFAULT_WATCH_SILENCE};
use crate::datastore::error::DatastoreError;
use crate::datastore::event::{Datastore, DatastoreEvent, Snapshot};

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
}

impl Default for KubernetesOptions {
    fn default() -> KubernetesOptions {
        KubernetesOptions { kubeconfig: None, api_group: ApiGroupChoice::default(), watch_silence: Some(DEFAULT_WATCH_SILENCE) }
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
        let mut ds = KubernetesDatastore::new(client, options.api_group).with_watch_silence(options.watch_silence);
        ds.description = format!("kubernetes:{url} (calico api group: {})", options.api_group);
        Ok(ds)
    }

    /// The client it reads with (shared: the agent's Node Events use it too).
    pub fn client(&self) -> Client {
        self.client.clone()
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
        let start_watches = |view: &View| {
            let mut streams: SelectAll<BoxStream<'static, (usize, WatchItem<TrimmedObject>)>> = SelectAll::new();
            for (index, target) in view.targets().into_iter().enumerate() {
                let config = target.config(&self.watcher_config);
                streams.push(trimmed_watch(&target, &self.client, config, self.watch_silence, Some((self.backoff)())).map(move |item| (index, item)).boxed());
            }
            streams
        };
        let mut streams = start_watches(&view);
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
                next = streams.next() => {
                    let Some((index, item)) = next else { return Ok(()) };
                    view.apply(index, item)
                }
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
                            streams = start_watches(&view);
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
