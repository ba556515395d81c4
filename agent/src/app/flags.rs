//! Command-line and environment configuration of `routewarden run`, and the cluster flags
//! every command shares ([`ClusterArgs`]); each command's own flags are in the binary's
//! `cli/<command>.rs`.
//!
//! Every flag can also be set with an environment variable `ROUTEWARDEN_<FLAG>` (as DaemonSet
//! manifests need); the flag wins over the variable.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::datastore::{ApiGroupChoice, EtcdOptions, KubernetesOptions};
use crate::observe::http::HttpLimits;

/// Where the cluster description comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DatastoreSpec {
    /// `file:<path>`: a YAML file or a directory of YAML files (calicoctl / kubectl output).
    File(PathBuf),
    /// `kubernetes`: the API server (in-cluster service account, or a kubeconfig). The options
    /// come from `--kubeconfig` and `--calico-api-group` ([`ClusterArgs::datastore_spec`]).
    Kubernetes(KubernetesOptions),
    /// `etcd`: Calico's etcdv3 datastore. The options come from `--etcd-endpoints` and the
    /// `--etcd-*-file` flags ([`ClusterArgs::datastore_spec`]).
    Etcd(EtcdOptions),
}

impl FromStr for DatastoreSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once(':') {
            Some(("file", path)) if !path.is_empty() => Ok(DatastoreSpec::File(PathBuf::from(path))),
            None if s == "kubernetes" => Ok(DatastoreSpec::Kubernetes(KubernetesOptions::default())),
            None if s == "etcd" => Ok(DatastoreSpec::Etcd(EtcdOptions::default())),
            _ => Err(format!("unknown datastore {s:?}: expected file:<path to a YAML file or directory>, kubernetes, or etcd")),
        }
    }
}

/// What the agent does with the routes it owns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Program the cluster routes of the classes routewarden owns.
    Program,
    /// Program nothing; compare the kernel with what each owner should have programmed.
    Audit,
}

/// Log output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable on a terminal, JSON otherwise.
    Auto,
    /// Human-readable.
    Text,
    /// One JSON object per line.
    Json,
}

/// Whether `run` records Kubernetes Events on its Node (`--node-events`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum NodeEventsMode {
    /// On when a Kubernetes client is available: `--datastore kubernetes`, or the in-cluster
    /// service account when the agent runs in a pod.
    Auto,
    /// Always; the agent does not start without a Kubernetes client.
    On,
    /// Never.
    Off,
}

/// Inputs shared by every command (`run`, `explain`, `audit`, `events`, `bird-filter`).
#[derive(Args, Clone, Debug)]
pub struct ClusterArgs {
    /// Cluster description: `file:<path>` (YAML file or directory), `kubernetes` (watch the
    /// API server), or `etcd` (watch Calico's etcdv3 datastore).
    /// Required by every command but `events`, which streams route events without one.
    #[arg(long, env = "ROUTEWARDEN_DATASTORE", required = true)]
    pub datastore: Option<DatastoreSpec>,
    /// With `--datastore kubernetes`: a kubeconfig file. Default: `KUBECONFIG` or
    /// `~/.kube/config` when present, else the in-cluster service account.
    #[arg(long, env = "ROUTEWARDEN_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// With `--datastore kubernetes`: the Calico API group to read: `auto` (crd.projectcalico.org/v1
    /// when served, else projectcalico.org/v3), `crd.projectcalico.org/v1` or `projectcalico.org/v3`.
    #[arg(long, env = "ROUTEWARDEN_CALICO_API_GROUP", default_value = "auto")]
    pub calico_api_group: ApiGroupChoice,
    /// With `--datastore kubernetes`: seconds a watch that has had bookmarks may go without an
    /// event or a bookmark before it is stale (not synced, deletions held, re-listed). The API
    /// server sends a bookmark every 60 s; 0 turns the check off.
    #[arg(long, env = "ROUTEWARDEN_KUBE_WATCH_SILENCE", default_value_t = 90, value_name = "SECONDS")]
    pub kube_watch_silence: u64,
    /// With `--datastore kubernetes`: seconds between runs of API discovery while the agent
    /// runs (one `GET /apis` when nothing changed), so that an API group installed later (the
    /// operator's) is read and one removed is dropped with a finding, without a restart. A
    /// watch answering 404 runs it at once; 0: only then.
    #[arg(long, env = "ROUTEWARDEN_DISCOVERY_INTERVAL", default_value_t = 300, value_name = "SECONDS")]
    pub discovery_interval: u64,
    /// This node's name (the Calico Node name). Defaults to the host name.
    #[arg(long, env = "ROUTEWARDEN_NODE")]
    pub node: Option<String>,
    /// routewarden's role: `felix` (program what FelixConfiguration gives Felix; the default
    /// for `run` and `explain`), `bird` (what BGPConfiguration gives BIRD),
    /// `explicit:<Disabled|EnabledIPIPOnly|EnabledNoEncapOnly|Enabled>` (a third writer), or
    /// `audit` (program nothing, judge Felix against BIRD; the default for `audit`).
    #[arg(long, env = "ROUTEWARDEN_ROLE")]
    pub role: Option<String>,
    /// Calico release line the cluster runs (changes which fields exist, their defaults and
    /// values): `auto` (ClusterInformation default's spec.calicoVersion; 3.33 with a warning
    /// when there is none), or a line from 3.26 on (3.26 to 3.30 have no programClusterRoutes;
    /// 3.34 and later behave as 3.33). An explicit line wins over the cluster's.
    #[arg(long, env = "ROUTEWARDEN_CALICO_VERSION", default_value = "auto")]
    pub calico_version: String,
    /// IPIP tunnel device.
    #[arg(long, env = "ROUTEWARDEN_TUNNEL_DEVICE", default_value = "tunl0")]
    pub tunnel_device: String,
    /// Host NIC used for no-encap and same-subnet routes; `auto`: the link holding this
    /// node's Calico address (Node spec.bgp.ipv4Address/ipv6Address or its annotation), found
    /// over netlink and looked up again as links change.
    #[arg(long, env = "ROUTEWARDEN_HOST_DEVICE", default_value = "auto")]
    pub host_device: String,
    /// Route protocol of the routes routewarden writes (1-255; 80 = Felix's, so a handover
    /// to or from Felix is an atomic replace).
    #[arg(long, env = "ROUTEWARDEN_ROUTE_PROTOCOL", default_value_t = 80, value_parser = clap::value_parser!(u8).range(1..=255))]
    pub route_protocol: u8,
    /// Metric (priority) of the routes routewarden writes (1024 as BIRD and Calico's normal
    /// priority use).
    #[arg(long, env = "ROUTEWARDEN_ROUTE_METRIC", default_value_t = 1024)]
    pub route_metric: u32,
    /// Routing table id (254 = main; e.g. 48 for a dedicated cluster-route table).
    #[arg(long, env = "ROUTEWARDEN_ROUTE_TABLE", default_value_t = 254)]
    pub route_table: u32,
    /// With `--datastore file:`: largest input file read, in bytes (a larger one is refused
    /// unread and its last good content kept).
    #[arg(long, env = "ROUTEWARDEN_DATASTORE_MAX_FILE_SIZE", default_value_t = crate::datastore::file_default_max_size())]
    pub datastore_max_file_size: u64,
    /// With `--datastore etcd`: etcd URLs, comma-separated (`https://10.0.0.1:2379,...`).
    /// calicoctl's `ETCD_ENDPOINTS` is read when neither the flag nor its variable is set.
    #[arg(long, env = "ROUTEWARDEN_ETCD_ENDPOINTS", value_delimiter = ',')]
    pub etcd_endpoints: Vec<String>,
    /// With `--datastore etcd`: PEM CA bundle for the server certificate (enables TLS).
    /// Fallback: calicoctl's `ETCD_CA_CERT_FILE`.
    #[arg(long, env = "ROUTEWARDEN_ETCD_CA_FILE")]
    pub etcd_ca_file: Option<PathBuf>,
    /// With `--datastore etcd`: PEM client certificate (mTLS). Fallback: `ETCD_CERT_FILE`.
    #[arg(long, env = "ROUTEWARDEN_ETCD_CERT_FILE")]
    pub etcd_cert_file: Option<PathBuf>,
    /// With `--datastore etcd`: PEM key of the client certificate. Fallback: `ETCD_KEY_FILE`.
    #[arg(long, env = "ROUTEWARDEN_ETCD_KEY_FILE")]
    pub etcd_key_file: Option<PathBuf>,
}

/// A non-empty environment variable.
fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

impl ClusterArgs {
    /// `--datastore` with the Kubernetes flags applied (they are ignored for `file:`); `None`
    /// only where the command leaves `--datastore` optional (`events`).
    pub fn datastore_spec(&self) -> Option<DatastoreSpec> {
        Some(match self.datastore.as_ref()? {
            DatastoreSpec::File(p) => DatastoreSpec::File(p.clone()),
            DatastoreSpec::Kubernetes(_) => DatastoreSpec::Kubernetes(KubernetesOptions {
                kubeconfig: self.kubeconfig.clone(),
                api_group: self.calico_api_group,
                watch_silence: (self.kube_watch_silence > 0).then(|| Duration::from_secs(self.kube_watch_silence)),
                discovery_interval: (self.discovery_interval > 0).then(|| Duration::from_secs(self.discovery_interval)),
            }),
            DatastoreSpec::Etcd(_) => DatastoreSpec::Etcd(self.etcd_options(env_nonempty)),
        })
    }

    /// [`ClusterArgs::datastore_spec`] where the command needs one.
    ///
    /// # Errors
    /// `--datastore` is missing (only `events` leaves it optional).
    pub fn required_datastore_spec(&self) -> anyhow::Result<DatastoreSpec> {
        self.datastore_spec().ok_or_else(|| anyhow::anyhow!("--datastore is required"))
    }

    /// The etcd flags, each falling back to calicoctl's variable (read through `env`).
    fn etcd_options(&self, env: impl Fn(&str) -> Option<String>) -> EtcdOptions {
        let endpoints = if self.etcd_endpoints.is_empty() {
            env("ETCD_ENDPOINTS").map(|v| v.split(',').map(str::trim).filter(|e| !e.is_empty()).map(str::to_owned).collect()).unwrap_or_default()
        } else {
            self.etcd_endpoints.clone()
        };
        let file = |flag: &Option<PathBuf>, var: &str| flag.clone().or_else(|| env(var).map(PathBuf::from));
        EtcdOptions {
            endpoints,
            ca_file: file(&self.etcd_ca_file, "ETCD_CA_CERT_FILE"),
            cert_file: file(&self.etcd_cert_file, "ETCD_CERT_FILE"),
            key_file: file(&self.etcd_key_file, "ETCD_KEY_FILE"),
        }
    }
}

/// `routewarden run`.
#[derive(Args, Clone, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// `program` (default) or `audit` (program nothing, report).
    #[arg(long, env = "ROUTEWARDEN_MODE", value_enum, default_value = "program")]
    pub mode: Mode,
    /// Full resync with the kernel every this many seconds.
    #[arg(long, env = "ROUTEWARDEN_RESYNC_INTERVAL", default_value_t = 90)]
    pub resync_interval: u64,
    /// Seconds to keep routes of a class routewarden lost until the new owner's route appears.
    #[arg(long, env = "ROUTEWARDEN_HANDOVER_GRACE", default_value_t = 30)]
    pub handover_grace: u64,
    /// Settle period, seconds: how long the file datastore's tree must stay unchanged before a
    /// vanished file's objects are dropped (an unreadable one keeps its last good content for
    /// as long as it stays unreadable), and how long a mass deletion must stay wanted before it
    /// goes out.
    #[arg(long, env = "ROUTEWARDEN_SETTLE_PERIOD", default_value_t = 30)]
    pub settle_period: u64,
    /// Mass-deletion breaker, percent: an apply that would delete more than this share of
    /// routewarden's routes holds each delete for the settle period (100 turns it off).
    #[arg(long, env = "ROUTEWARDEN_MASS_DELETION_THRESHOLD", default_value_t = 50, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub mass_deletion_threshold: u8,
    /// Program cluster routes through nexthop objects (`ip nexthop`, Linux 5.3+), one per
    /// remote node and IP pool: a node's address change or CrossSubnet path switch is then
    /// one nexthop replace, whatever its number of blocks. Off by default (Felix, BIRD and
    /// `ip route` users expect classic routes); turning it off replaces the routes in place.
    #[arg(long, env = "ROUTEWARDEN_NEXTHOP_OBJECTS")]
    pub nexthop_objects: bool,
    /// With `--route-table` other than main: keep the policy rule `from all lookup <table>
    /// priority <this>` in each family routewarden programs routes of, made with its route
    /// protocol when missing, never replaced or deleted (another writer's rule is left alone).
    /// Absent: no rule is made; `audit`, `/readyz` and `routewarden_route_table_rule` say
    /// whether one selects the table.
    #[arg(long, env = "ROUTEWARDEN_ROUTE_TABLE_RULE_PRIORITY", value_parser = clap::value_parser!(u32).range(1..=32765))]
    pub route_table_rule_priority: Option<u32>,
    /// Address of the HTTP server (/metrics, /healthz, /readyz, /status/v1).
    #[arg(long, env = "ROUTEWARDEN_METRICS_ADDR", default_value = "0.0.0.0:9695")]
    pub metrics_addr: SocketAddr,
    /// Seconds a client of the HTTP server has to send a whole request head, from connecting
    /// or from the first byte of its next request; slower connections are closed.
    #[arg(long, env = "ROUTEWARDEN_HTTP_HEADER_TIMEOUT", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    pub http_header_timeout: u64,
    /// Seconds a kept-alive HTTP connection may sit between requests before it is closed.
    #[arg(long, env = "ROUTEWARDEN_HTTP_IDLE_TIMEOUT", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub http_idle_timeout: u64,
    /// Most HTTP connections held open at once; a new client at the cap closes the oldest
    /// (slow or idle) connection instead of waiting.
    #[arg(long, env = "ROUTEWARDEN_HTTP_MAX_CONNECTIONS", default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=65_536))]
    pub http_max_connections: u64,
    /// Seconds a /metrics, /healthz, /readyz or /status/v1 handler may take before the request is
    /// answered 503.
    #[arg(long, env = "ROUTEWARDEN_HTTP_REQUEST_TIMEOUT", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub http_request_timeout: u64,
    /// Run the `tc_count` probe (`routewarden_tc_count_*`): the demo classifier that proves the
    /// BPF build chain. Off by default: every packet on its devices pays a second classifier
    /// next to the forwarding watch's.
    #[arg(long, env = "ROUTEWARDEN_TC_COUNT")]
    pub tc_count: bool,
    /// Devices the `tc_count` probe attaches to (egress) with `--tc-count`, comma separated.
    /// Empty: the tunnel device and the host NIC.
    #[arg(long, env = "ROUTEWARDEN_TC_DEVICES", value_delimiter = ',')]
    pub tc_devices: Vec<String>,
    /// Tunnel devices the forwarding watch attaches to (egress), comma separated. Empty: the
    /// tunnel device (`--tunnel-device`).
    #[arg(long, env = "ROUTEWARDEN_FORWARD_TUNNEL_DEVICES", value_delimiter = ',')]
    pub forward_tunnel_devices: Vec<String>,
    /// Host NICs the forwarding watch attaches to (egress), comma separated (e.g. both members'
    /// of a bond, or the NIC of each node pool). Empty: the host device (`--host-device`).
    #[arg(long, env = "ROUTEWARDEN_FORWARD_HOST_DEVICES", value_delimiter = ',')]
    pub forward_host_devices: Vec<String>,
    /// A destination block whose egress path changes this many times within
    /// `--forward-flap-window` is a forwarding flap.
    #[arg(long, env = "ROUTEWARDEN_FORWARD_FLAP_THRESHOLD", default_value_t = 3, value_parser = clap::value_parser!(u32).range(2..))]
    pub forward_flap_threshold: u32,
    /// Window of the forwarding-flap detector, in seconds.
    #[arg(long, env = "ROUTEWARDEN_FORWARD_FLAP_WINDOW", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub forward_flap_window: u64,
    /// Force one route-watch backend (`fentry`, `kprobe`, `socket-filter`); default: the best
    /// that loads and attaches, in that order.
    #[arg(long, env = "ROUTEWARDEN_ROUTE_WATCH_BACKEND")]
    pub route_watch_backend: Option<crate::bpf::route_watch::RouteWatchBackend>,
    /// Kernel-side log lines of the BPF watches (a full ring buffer or map, offsets that do not
    /// match the kernel, an unparsable packet), forwarded to the log under target `bpf`:
    /// `off` (the programs write nothing), `error`, `warn`, `info`, `debug`.
    #[arg(long, env = "ROUTEWARDEN_BPF_LOG_LEVEL", value_enum, default_value = "off")]
    pub bpf_log_level: crate::bpf::bpf_log::BpfLogLevel,
    /// Route-watch conflict/flap window, in seconds.
    #[arg(long, env = "ROUTEWARDEN_ROUTE_WATCH_WINDOW", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub route_watch_window: u64,
    /// Changes of one prefix within the window that make a route flap.
    #[arg(long, env = "ROUTEWARDEN_ROUTE_WATCH_FLAP_THRESHOLD", default_value_t = 3, value_parser = clap::value_parser!(u32).range(2..))]
    pub route_watch_flap_threshold: u32,
    /// Writes of one prefix by one writer that the kernel refuses with the same error within
    /// the window (`--route-watch-window`) that make a failing writer (a `failing-writer`
    /// event, `routewarden_failing_writer_episodes_total`). fentry and kprobe backends only:
    /// a socket filter does not see refused writes.
    #[arg(long, env = "ROUTEWARDEN_ROUTE_WATCH_FAILING_THRESHOLD", default_value_t = 3, value_parser = clap::value_parser!(u32).range(2..))]
    pub route_watch_failing_threshold: u32,
    /// Record a Kubernetes Event on this node's Node when a route conflict or flap episode
    /// starts, the ownership decision becomes inconsistent, or the mass-deletion breaker
    /// engages (`RouteConflict`, `RouteFlap`, `RouteOwnershipInconsistent`,
    /// `RouteMassDeletionHeld`; at most one API call per reason and prefix a minute): `auto`
    /// (when a Kubernetes client is available), `on`, `off`. Needs `create` and `patch` on
    /// `events.k8s.io` `events` in namespace `default`.
    #[arg(long, env = "ROUTEWARDEN_NODE_EVENTS", value_enum, default_value = "auto")]
    pub node_events: NodeEventsMode,
    /// Log format.
    #[arg(long, env = "ROUTEWARDEN_LOG_FORMAT", value_enum, default_value = "auto")]
    pub log_format: LogFormat,
}

impl RunArgs {
    /// The HTTP server's limits from the `--http-*` flags.
    pub fn http_limits(&self) -> HttpLimits {
        HttpLimits {
            header_read_timeout: Duration::from_secs(self.http_header_timeout),
            idle_timeout: Duration::from_secs(self.http_idle_timeout),
            max_connections: usize::try_from(self.http_max_connections).unwrap_or(usize::MAX),
            request_timeout: Duration::from_secs(self.http_request_timeout),
        }
    }
}

#[cfg(test)]
mod tests;
