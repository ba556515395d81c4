//! The Kubernetes datastore: the Calico objects of a live cluster, read from the API server.
//!
//! ```text
//!  GET /apis ─> choose the Calico group ─> GET /apis/<group>/<version> (6 resources served?)
//!                                                    │
//!  per resource: kube-runtime watcher (list, then watch with allowWatchBookmarks)
//!      ippools, ipamblocks, blockaffinities,          │  Init/InitApply/InitDone/Apply/Delete
//!      felixconfigurations, bgpconfigurations,        ▼
//!      clusterinformations, core nodes  reflector store (stripped objects) ─┐
//!      optional: calico-node DaemonSets,              │                     │
//!      installations (failure = finding)              │                     │
//!                                                                           │ debounced (100 ms)
//!  parse each changed object alone (ClusterBuilder) ───────────────────────┘
//!            │ good: replaces that object in the kept Cluster; bad: the last good one stays
//!            └─> Cluster (updated in place) ─> Snapshot ─> DatastoreEvent::{Snapshot, Synced, Unsynced}
//! ```
//!
//! Rules, and where they come from:
//!
//! - **API group.** `--calico-api-group auto` (the default) lists `/apis` once at start and reads
//!   `crd.projectcalico.org/v1` when it is served (the common case, and also when the Calico API
//!   server serves `projectcalico.org/v3` on top of it), else `projectcalico.org/v3` (clusters on
//!   Calico's native v3 CRDs). This is the operator's rule (`tigera/operator`
//!   `useV3CRDs`: "v1 present stays v1", "both present stays v1"). A cluster that migrated to v3
//!   CRDs but still has the old v1 CRDs installed must be forced with
//!   `--calico-api-group projectcalico.org/v3` (the operator detects that case from its
//!   `DatastoreMigration` object, which routewarden has no RBAC to read). The chosen group must
//!   serve all six resources with `list` and `watch`, or the datastore stays not synced and
//!   retries, saying which are missing.
//! - **Watches.** One kube-runtime [`watcher`] per resource (a list from the watch cache,
//!   [`cache_lists`], then a watch from the list's resourceVersion with
//!   `allowWatchBookmarks=true`, 290 s server timeout), feeding a reflector [`Writer`]: a
//!   re-list replaces the store atomically at `InitDone`, so objects deleted while the watch
//!   was down disappear then, not before; and deletions wait [`DEFAULT_LIST_SETTLE`] after
//!   every list, since a cached list may lag etcd.
//! - **Errors.** Any watch error (API server unreachable, 5xx, 403, `410 Gone` from an expired
//!   resourceVersion) marks the resource failed and sends [`DatastoreEvent::Unsynced`]; the
//!   watcher is restarted after [`default_backoff`] (500 ms doubling to 5 s, each delay
//!   stretched by a random 0–100 %, so under 10 s and never in step across 5,000 agents;
//!   reset by every complete list) and re-lists, so recovery follows the API server within
//!   one step (issue 23). The resource counts as synced again
//!   only when that list is complete, and [`DatastoreEvent::Synced`] follows once every
//!   resource is. While not synced the last view is kept (snapshots still flow, with the failed
//!   resources in [`Snapshot::load_errors`], so the app deletes nothing).
//! - **Objects that do not parse** are logged with kind, name and field, listed in
//!   [`Snapshot::object_errors`] (the app counts them in `routewarden_datastore_invalid_objects`)
//!   and skipped. Their last good version stays in the model until the object is deleted or
//!   fixed. Both API forms and the core Node go through the one model parser
//!   ([`ClusterBuilder::add`]) the file datastore uses.
//! - **Live changes.** Every change is a new snapshot (debounced): a `programClusterRoutes`
//!   change in FelixConfiguration or BGPConfiguration takes effect without a restart, and so
//!   does a Calico upgrade (`ClusterInformation default` `spec.calicoVersion`, read by
//!   `--calico-version auto`).
//! - **A hung API server** (TCP up, nothing answered): `GET /version` every 30 s with a 10 s
//!   limit ([`DEFAULT_PROBE`]); no answer means `Unsynced` ("API server not answering") until
//!   one comes; a second miss in a row ([`PROBE_MISSES_BEFORE_RELIST`]) restarts every watch,
//!   and every resource is re-listed before `Synced` again. A watch that is
//!   silent because the server is hung would otherwise stay silent until its 290 s timeout
//!   (kube-runtime does not hand bookmarks to its consumer, so silence cannot be timed per
//!   watch).
//! - **Optional sources** ([`optional_sources`]): the calico-node DaemonSet's env (by name, in
//!   `kube-system`, and `calico-system` on operator installs) and the operator's
//!   `Installation`. Their failures (403 without the Role) go to [`Cluster::unread`] and become
//!   `source-unreadable` findings; they never make the datastore unsynced. Each is tried once
//!   before the first `Synced`, so the first decision already includes them.
//! - **Read-only.** Only `list` and `watch` are requested ([`RBAC`], [`NAMESPACED_RBAC`]); discovery uses the
//!   non-resource URLs every authenticated client may read (`system:discovery`).
//! - **Cost.** Each changed object is parsed once, on its own; the kept [`Cluster`] is updated
//!   in place and a snapshot is one clone of it, built only when something the model reads
//!   changed. The debounce window (100 ms) grows to twice the time the last snapshot took, so
//!   constant churn in a very large cluster is bounded (measured, release build: 10,000 IPAM
//!   blocks of 64 addresses and 32 pods each parse in 1.8 s once; a snapshot after one change
//!   takes about 0.5 s, mostly cloning the cluster).
//! - **Memory.** Stores keep only what the model reads: Calico objects their `metadata.name`
//!   and `spec`; Nodes their `projectcalico.org/*` annotations and `status.addresses`. Node
//!   status heartbeats therefore change nothing and produce no snapshot.

mod view;

#[cfg(test)]
mod tests;

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{BoxStream, SelectAll};
use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::reflector::store::Writer;
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, Event};
use kube::Client;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{Datastore, DatastoreError, DatastoreEvent, Snapshot};
use crate::model::{Cluster, ClusterBuilder, Kind, OptionalSource};
pub(crate) use view::View;

/// A kube error in one line: the API server's answer as `message (code reason)`, anything else
/// with its causes once ([`crate::text::causes_once`]).
pub fn describe_kube_error(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({} {})", s.message, s.code, s.reason),
        other => crate::text::causes_once(other),
    }
}

/// `User-Agent: routewarden/<version>` on every request (kube sends none), so API server audit
/// logs and API Priority and Fairness can tell the agents apart (`deploy/flowschema.yaml`).
pub fn user_agent() -> (http::HeaderName, http::HeaderValue) {
    (http::header::USER_AGENT, http::HeaderValue::from_static(concat!("routewarden/", env!("CARGO_PKG_VERSION"))))
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

/// Default debounce window: changes within it become one snapshot (an initial list of 10,000
/// IPAM blocks is one snapshot, not 10,000).
pub const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(100);

/// The verbs routewarden uses on every resource it reads, and exactly the verbs
/// `deploy/clusterrole.yaml` grants (a test compares the two, so neither can drift).
pub const VERBS: [&str; 2] = ["list", "watch"];

/// A resource routewarden watches: the model kind and the plural resource name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Watched {
    pub kind: Kind,
    pub plural: &'static str,
}

/// The six Calico resources, in the order they are added to the model. The same plurals exist
/// in both Calico groups (`../shared/calico-testdata/crds/`). `clusterinformations` is read for
/// the release line (`ClusterInformation default` `spec.calicoVersion`, issue 19).
pub const CALICO_RESOURCES: [Watched; 6] = [
    Watched { kind: Kind::IpPool, plural: "ippools" },
    Watched { kind: Kind::IpamBlock, plural: "ipamblocks" },
    Watched { kind: Kind::BlockAffinity, plural: "blockaffinities" },
    Watched { kind: Kind::FelixConfiguration, plural: "felixconfigurations" },
    Watched { kind: Kind::BgpConfiguration, plural: "bgpconfigurations" },
    Watched { kind: Kind::ClusterInformation, plural: "clusterinformations" },
];

/// The core Node resource (group `""`, version `v1`).
pub const NODE_RESOURCE: Watched = Watched { kind: Kind::Node, plural: "nodes" };

/// The operator's API group (`operator.tigera.io/v1`); served only on operator installs.
pub const OPERATOR_API_VERSION: &str = "operator.tigera.io/v1";

/// The operator's `Installation` (cluster-scoped; only `default` is reconciled).
pub const INSTALLATION_RESOURCE: Watched = Watched { kind: Kind::Installation, plural: "installations" };

/// `apps/v1` DaemonSets: only `calico-node`, only in the namespaces of [`NAMESPACED_RBAC`],
/// read with a `metadata.name=calico-node` field selector (which is what lets a `Role` name
/// the one object with `resourceNames`).
pub const DAEMONSET_RESOURCE: Watched = Watched { kind: Kind::DaemonSet, plural: "daemonsets" };

/// The field selector of the calico-node DaemonSet watches.
pub const CALICO_NODE_SELECTOR: &str = "metadata.name=calico-node";

/// The optional sources to read, given what discovery found (issue 19 part 2).
///
/// - `kube-system/calico-node` always (manifest installs put calico-node there, and the
///   operator migrates it from there);
/// - with the operator's group served (`operator.tigera.io/v1` lists `installations`): also
///   `Installation default` and `calico-system/calico-node` (tigera/operator renders
///   calico-node in `common.CalicoNamespace`, `calico-system`).
///
/// Without the operator, `calico-system` is not read at all: a manifest install has no such
/// namespace, and the RBAC for it lives in the `deploy/operator` component.
pub fn optional_sources(operator: bool) -> Vec<OptionalSource> {
    if operator {
        vec![OptionalSource::Installation, OptionalSource::CalicoNodeEnv("calico-system"), OptionalSource::CalicoNodeEnv("kube-system")]
    } else {
        vec![OptionalSource::CalicoNodeEnv("kube-system")]
    }
}

const CALICO_PLURALS: [&str; 6] = [
    CALICO_RESOURCES[0].plural,
    CALICO_RESOURCES[1].plural,
    CALICO_RESOURCES[2].plural,
    CALICO_RESOURCES[3].plural,
    CALICO_RESOURCES[4].plural,
    CALICO_RESOURCES[5].plural,
];

/// One RBAC rule: API group, resources, verbs (the shape of a ClusterRole `rules[]` entry).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RbacRule {
    pub api_group: &'static str,
    pub resources: &'static [&'static str],
    pub verbs: &'static [&'static str],
}

/// Everything the code requests from the API server: the single table the RBAC test compares
/// with `deploy/clusterrole.yaml`. Both Calico groups are listed because the group is chosen at
/// start (and may change when a cluster migrates).
pub const RBAC: [RbacRule; 4] = [
    RbacRule { api_group: CalicoGroup::CrdV1.group(), resources: &CALICO_PLURALS, verbs: &VERBS },
    RbacRule { api_group: CalicoGroup::V3.group(), resources: &CALICO_PLURALS, verbs: &VERBS },
    RbacRule { api_group: "", resources: &[NODE_RESOURCE.plural], verbs: &VERBS },
    RbacRule { api_group: "operator.tigera.io", resources: &[INSTALLATION_RESOURCE.plural], verbs: &VERBS },
];

/// One namespaced grant: a `Role` rule in `namespace` limited to `resource_names`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamespacedRbacRule {
    pub namespace: &'static str,
    /// The manifest of the Role, relative to `deploy/`; its RoleBinding is
    /// `rolebinding-calico-node-env.yaml` next to it.
    pub manifest: &'static str,
    pub rule: RbacRule,
    pub resource_names: &'static [&'static str],
}

/// The namespaced reads (the calico-node DaemonSet's env): one `Role` per namespace, granting
/// list and watch on `daemonsets` named `calico-node` only. `kube-system` is in the base
/// (`deploy/role-calico-node-env.yaml`); `calico-system` exists only on operator installs and
/// is the `deploy/operator` component (applying a Role into a missing namespace fails).
pub const NAMESPACED_RBAC: [NamespacedRbacRule; 2] = [
    NamespacedRbacRule {
        namespace: "kube-system",
        manifest: "role-calico-node-env.yaml",
        rule: RbacRule { api_group: "apps", resources: &[DAEMONSET_RESOURCE.plural], verbs: &VERBS },
        resource_names: &[crate::model::CALICO_NODE],
    },
    NamespacedRbacRule {
        namespace: "calico-system",
        manifest: "operator/role-calico-node-env.yaml",
        rule: RbacRule { api_group: "apps", resources: &[DAEMONSET_RESOURCE.plural], verbs: &VERBS },
        resource_names: &[crate::model::CALICO_NODE],
    },
];

/// A Calico API group routewarden can read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CalicoGroup {
    /// `crd.projectcalico.org/v1`: the CRDs of a Kubernetes-datastore cluster.
    CrdV1,
    /// `projectcalico.org/v3`: Calico's native v3 CRDs (or the Calico API server).
    V3,
}

impl CalicoGroup {
    /// The API group (`crd.projectcalico.org`).
    pub const fn group(self) -> &'static str {
        match self {
            CalicoGroup::CrdV1 => "crd.projectcalico.org",
            CalicoGroup::V3 => "projectcalico.org",
        }
    }

    /// The version (`v1`).
    pub const fn version(self) -> &'static str {
        match self {
            CalicoGroup::CrdV1 => "v1",
            CalicoGroup::V3 => "v3",
        }
    }

    /// `group/version`, as in `apiVersion`.
    pub const fn api_version(self) -> &'static str {
        match self {
            CalicoGroup::CrdV1 => "crd.projectcalico.org/v1",
            CalicoGroup::V3 => "projectcalico.org/v3",
        }
    }
}

impl fmt::Display for CalicoGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.api_version())
    }
}

/// `--calico-api-group`: discover the group, or force one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ApiGroupChoice {
    /// Discover at start (see the module docs for the rule).
    #[default]
    Auto,
    /// Use this group without looking at `/apis`.
    Forced(CalicoGroup),
}

impl FromStr for ApiGroupChoice {
    type Err = KubernetesError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(ApiGroupChoice::Auto),
            "crd.projectcalico.org/v1" => Ok(ApiGroupChoice::Forced(CalicoGroup::CrdV1)),
            "projectcalico.org/v3" => Ok(ApiGroupChoice::Forced(CalicoGroup::V3)),
            other => Err(KubernetesError::UnknownApiGroup(other.to_owned())),
        }
    }
}

impl fmt::Display for ApiGroupChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ApiGroupChoice::Auto => f.write_str("auto"),
            ApiGroupChoice::Forced(g) => g.fmt(f),
        }
    }
}

/// How to reach the API server and which Calico group to read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KubernetesOptions {
    /// A kubeconfig file; `None`: `KUBECONFIG` / `~/.kube/config`, else the in-cluster service
    /// account (kube's `Config::infer`).
    pub kubeconfig: Option<PathBuf>,
    /// `--calico-api-group`.
    pub api_group: ApiGroupChoice,
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
    #[error("list {resource}: {}", view::describe_watch_error(cause))]
    List { resource: String, cause: watcher::Error },
    /// `--calico-api-group` value.
    #[error("unknown Calico API group {0:?}: expected auto, crd.projectcalico.org/v1 or projectcalico.org/v3")]
    UnknownApiGroup(String),
}

/// The retry delays of discovery and of a failed watcher: 500 ms doubling to 5 s, each with
/// up to 100 % random jitter added (backon's `with_jitter`), so every delay is under 10 s and
/// agents that failed together retry apart; endless. kube-runtime's `DefaultBackoff` grows to
/// 30 s (+ jitter) and resets only after 120 s without errors: after a 20 s outage an agent
/// could stay unsynced for most of a minute after the server was back.
pub fn default_backoff() -> Box<dyn Backoff> {
    let builder = backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(500))
        .with_max_delay(Duration::from_secs(5))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times();
    Box::new(watcher::ExponentialBackoff::from(builder))
}

/// Makes the backoff policy of one watcher (one per resource, plus one for discovery).
pub type BackoffFactory = Arc<dyn Fn() -> Box<dyn Backoff> + Send + Sync>;

/// The datastore. Cheap to clone (the client is shared).
#[derive(Clone)]
pub struct KubernetesDatastore {
    client: Client,
    api_group: ApiGroupChoice,
    debounce: Duration,
    backoff: BackoffFactory,
    watcher_config: watcher::Config,
    list_settle: Duration,
    probe: Probe,
    description: String,
}

/// The API server probe: `GET /version` every `interval`; no answer within `timeout` means the
/// server is hung (TCP up, nothing answered: watches would stay silent until their 290 s
/// timeout while `/readyz` said synced).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    pub interval: Duration,
    pub timeout: Duration,
}

/// Probes in a row without an answer before every watch is restarted (the first miss only
/// makes the datastore unsynced).
pub const PROBE_MISSES_BEFORE_RELIST: u32 = 2;

/// Probe every 30 s, allow 10 s.
pub const DEFAULT_PROBE: Probe = Probe { interval: Duration::from_secs(30), timeout: Duration::from_secs(10) };

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
        let mut ds = KubernetesDatastore::new(client, options.api_group);
        ds.description = format!("kubernetes:{url} (calico api group: {})", options.api_group);
        Ok(ds)
    }

    /// Debounce window (default 100 ms).
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

    /// The API server probe (default [`DEFAULT_PROBE`]).
    #[must_use]
    pub fn with_probe(mut self, probe: Probe) -> KubernetesDatastore {
        self.probe = probe;
        self
    }

    /// Watcher settings (default [`cache_lists`]).
    #[must_use]
    pub fn with_watcher_config(mut self, config: watcher::Config) -> KubernetesDatastore {
        self.watcher_config = config;
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
            let mut stream = watcher::watcher(target.api(&self.client), target.config(&self.watcher_config)).boxed();
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
            let mut streams: SelectAll<BoxStream<'static, (usize, watcher::Result<Event<DynamicObject>>)>> = SelectAll::new();
            for (index, target) in view.targets().into_iter().enumerate() {
                let (api, config) = (target.api(&self.client), target.config(&self.watcher_config));
                streams.push(relisting_watcher(api, config, (self.backoff)()).map(move |item| (index, item)).boxed());
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
                    events
                }
            };
            for ev in events {
                if tx.send(ev).await.is_err() {
                    return Ok(());
                }
            }
            if view.is_dirty() && deadline.is_none() {
                deadline = Some(Instant::now() + window);
            }
        }
    }
}

/// The [`ApiResource`] of a watched resource in `group` (core v1 for Nodes).
pub(crate) fn api_resource(group: CalicoGroup, w: Watched) -> ApiResource {
    let fixed = |group: &str, version: &str| ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: if group.is_empty() { version.into() } else { format!("{group}/{version}") },
        kind: w.kind.as_str().into(),
        plural: w.plural.into(),
    };
    match w.kind {
        Kind::Installation => return fixed("operator.tigera.io", "v1"),
        Kind::DaemonSet => return fixed("apps", "v1"),
        _ => {}
    }
    if w.kind == Kind::Node {
        ApiResource { group: String::new(), version: "v1".into(), api_version: "v1".into(), kind: w.kind.as_str().into(), plural: w.plural.into() }
    } else {
        ApiResource {
            group: group.group().into(),
            version: group.version().into(),
            api_version: group.api_version().into(),
            kind: w.kind.as_str().into(),
            plural: w.plural.into(),
        }
    }
}

/// Choose the Calico group (`GET /apis`, unless forced) and check that it serves the six
/// resources with list and watch (`GET /apis/<group>/<version>`).
///
/// Errors: [`KubernetesError::Discovery`] (request failed), [`KubernetesError::NoCalicoGroup`],
/// [`KubernetesError::MissingResources`].
pub async fn discover(client: &Client, choice: ApiGroupChoice) -> Result<CalicoGroup, KubernetesError> {
    let group = match choice {
        ApiGroupChoice::Forced(g) => g,
        ApiGroupChoice::Auto => {
            let list = client.list_api_groups().await.map_err(|cause| KubernetesError::Discovery { request: "GET /apis".into(), cause })?;
            let served = |g: CalicoGroup| list.groups.iter().any(|ag| ag.name == g.group() && ag.versions.iter().any(|v| v.version == g.version()));
            if served(CalicoGroup::CrdV1) {
                CalicoGroup::CrdV1
            } else if served(CalicoGroup::V3) {
                CalicoGroup::V3
            } else {
                return Err(KubernetesError::NoCalicoGroup);
            }
        }
    };
    let resources = client
        .list_api_group_resources(group.api_version())
        .await
        .map_err(|source| KubernetesError::Discovery { request: format!("GET /apis/{}", group.api_version()), cause: source })?;
    let missing: Vec<&'static str> = CALICO_RESOURCES
        .iter()
        .map(|w| w.plural)
        .filter(|plural| !resources.resources.iter().any(|r| r.name == *plural && VERBS.iter().all(|verb| r.verbs.iter().any(|v| v == verb))))
        .collect();
    if !missing.is_empty() {
        return Err(KubernetesError::MissingResources { group, missing });
    }
    Ok(group)
}

/// Is the operator's `Installation` served (`GET /apis/operator.tigera.io/v1` lists
/// `installations` with list and watch)? A 404 (or any other answer from the API server)
/// means no operator: its sources are then not read at all.
///
/// Errors: [`KubernetesError::Discovery`] when the request itself failed (transport).
pub async fn discover_operator(client: &Client) -> Result<bool, KubernetesError> {
    match client.list_api_group_resources(OPERATOR_API_VERSION).await {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == INSTALLATION_RESOURCE.plural && VERBS.iter().all(|verb| r.verbs.iter().any(|v| v == verb)))),
        Err(kube::Error::Api(status)) => {
            tracing::debug!(code = status.code, "kubernetes datastore: {OPERATOR_API_VERSION} not served; no operator sources");
            Ok(false)
        }
        Err(cause) => Err(KubernetesError::Discovery { request: format!("GET /apis/{OPERATOR_API_VERSION}"), cause }),
    }
}

/// Probe the API server every `probe.interval` in a task of its own; send `Ok` when it
/// answered (any HTTP answer, even an error status: it is not hung) and `Err(reason)` when it
/// did not within `probe.timeout` or could not be reached. Ends when the receiver is dropped.
fn spawn_probe(client: Client, probe: Probe) -> mpsc::Receiver<Result<(), String>> {
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = tx.closed() => return,
                () = tokio::time::sleep(probe.interval) => {}
            }
            let answered = match tokio::time::timeout(probe.timeout, client.apiserver_version()).await {
                Ok(Ok(_) | Err(kube::Error::Api(_))) => Ok(()),
                Ok(Err(e)) => Err(format!("API server not reachable: GET /version: {}", describe_kube_error(&e))),
                Err(_) => Err(format!("API server not answering: GET /version got no answer within {} s", probe.timeout.as_secs())),
            };
            if tx.send(answered).await.is_err() {
                return;
            }
        }
    });
    rx
}

/// A watcher that restarts (and so re-lists) after every error, after the next backoff delay.
///
/// kube-runtime's own watcher resumes a failed watch from its last resourceVersion without
/// telling its consumer when the resumed watch is healthy again; restarting gives an explicit
/// `Init` … `InitDone` after every failure, which is what "synced again" means here. `410
/// Gone` re-lists either way. The stream never ends.
fn relisting_watcher(
    api: Api<DynamicObject>,
    config: watcher::Config,
    backoff: Box<dyn Backoff>,
) -> impl futures::Stream<Item = watcher::Result<Event<DynamicObject>>> + Send {
    struct State {
        api: Api<DynamicObject>,
        config: watcher::Config,
        backoff: Box<dyn Backoff>,
        inner: Option<BoxStream<'static, watcher::Result<Event<DynamicObject>>>>,
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

/// Parse one object alone with the model parser: the one-object [`Cluster`] when it is good,
/// its errors (kind, name, field) when not.
pub(crate) fn parse_alone(value: &serde_yaml_ng::Value) -> Result<Cluster, Vec<crate::model::Rejected>> {
    let mut builder = ClusterBuilder::default();
    let errors = builder.add(value);
    if errors.is_empty() {
        Ok(builder.finish().0)
    } else {
        Err(errors)
    }
}

/// Keep a store's writer type nameable for the view.
pub(crate) type StoreWriter = Writer<DynamicObject>;
