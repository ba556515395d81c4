//! The `routewarden_` metric set (README "Metrics" lists every one): the handles
//! ([`Metrics`]), their registration with names and help texts ([`Metrics::new_registry`]), and
//! one file per domain holding that domain's label sets and the only methods that write its
//! metrics, each taking the domain's own values:
//!
//! | file | writers | metrics |
//! |---|---|---|
//! | [`datastore`] | [`Metrics::set_synced`], [`Metrics::record_load_failed`], [`Metrics::record_snapshot`] | `datastore_*` |
//! | [`routes`] | [`Metrics::record_plan`], [`Metrics::record_apply`], [`Metrics::record_mass_deletion_hold`], [`Metrics::record_audit`], [`Metrics::record_audit_failed`] | `calico_version_info`, `frozen_prefixes`, `frozen_classes`, `ownership_findings`, `route_problems`, `routes`, `deletions_held`, `mass_deletion_holds`, `route_operations`, `netlink_errors`, `reconcile_duration_seconds`, `audit_findings` |
//! | [`bpf`] | [`Metrics::set_program_attached`], [`Metrics::record_tc_count`] | `bpf_program_attached`, `tc_count_*` |
//! | [`route_watch`] | [`Metrics::set_route_watch_backend`], [`Metrics::record_route_watch`], [`Metrics::set_flapping_prefixes`] | `route_writes`, `route_writes_unattributed`, `route_conflicts`, `route_flaps`, `route_flushes`, `flapping_prefixes`, `route_watch_backend_info`, `route_watch_events_lost` |
//! | [`node_events`] | [`Metrics::declare_node_events`], [`Metrics::record_node_event`], [`Metrics::record_node_event_failed`] | `node_events_*` |
//! | [`table_rule`] | [`Metrics::record_table_rules`], [`Metrics::record_route_watch`] (rule counters) | `route_table_rule`, `rule_writes` |
//! | [`forward`] | [`Metrics::declare_forward_destination`], [`Metrics::forget_forward_pool`], [`Metrics::record_forwarded`], [`Metrics::record_forwarding_flaps`], [`Metrics::record_forwarding_events_lost`] | `forwarded_*`, `wrong_path_packets`, `forwarding_*` |
//!
//! Every label value comes from a fixed set (`&'static str` produced by the `label()` methods
//! of the domain enums; a conflict's `writers` pairs two of them, at most 28 values; the Calico
//! `version` has one series at a time), or from a set the cluster bounds and whose series are
//! removed when its member goes (IP pool names, [`forward`]): never a prefix, block, pod name or
//! error string, so cardinality is bounded. The blocks and prefixes concerned are in the log
//! lines and in `routewarden explain`.
//!
//! Like kube-rs controller-rs (`Metrics` with `set_failure`/`count_and_measure`), callers say
//! what happened (`record_apply(&report)`), never which series to bump.

pub mod bpf;
pub mod datastore;
pub mod forward;
mod known_series;
pub mod node_events;
pub mod route_watch;
pub mod routes;
pub mod table_rule;

#[cfg(test)]
mod tests;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

pub use bpf::ProgramLabels;
pub use datastore::LoadErrorLabels;
pub use forward::{ForwardPathLabels, PoolLabels, WrongPathLabels};
pub use node_events::{NodeEventFailureLabels, NodeEventLabels};
pub use route_watch::{writers_label, BackendLabels, FailingWriterLabels, FamilyLabels, RouteConflictLabels, RouteWriteLabels};
pub use routes::{AuditLabels, CalicoVersionLabels, FindingLabels, HoldLabels, NetlinkErrorLabels, OperationLabels, ProblemLabels, RouteLabels};
pub use table_rule::{RuleWriteLabels, TableRuleLabels};

/// All metric handles. Cheap to share (`Arc<Metrics>`); updating a handle is lock-free.
///
/// The fields are public so that tests and benchmarks can read a value; they are written only
/// by the `record_*`/`set_*` methods of this module's domain files (the module table names
/// each metric's file), so that every metric has one writer and every label set is built in one
/// place.
#[derive(Debug, Default)]
pub struct Metrics {
    /// `routewarden_datastore_synced`: 1 when the datastore view is complete and current.
    pub datastore_synced: Gauge,
    /// `routewarden_datastore_load_errors_total{reason}`: broken files / objects seen.
    pub datastore_load_errors: Family<LoadErrorLabels, Counter>,
    /// `routewarden_datastore_invalid_objects`: objects currently skipped as invalid (those
    /// whose last good version stands in included).
    pub datastore_invalid_objects: Gauge,
    /// `routewarden_datastore_invalid_inputs`: inputs (files, watched resources) currently
    /// broken.
    pub datastore_invalid_inputs: Gauge,
    /// `routewarden_frozen_prefixes`: prefixes of frozen ground now (no deletion, no claim).
    pub frozen_prefixes: Gauge,
    /// `routewarden_frozen_classes{class}`: 1 while the class's owner cannot be known (the
    /// object that decides it is unreadable or holds a value routewarden cannot interpret).
    pub frozen_classes: Family<routes::FrozenClassLabels, Gauge>,
    /// `routewarden_deletions_held{reason}`: route deletions held back in the last apply.
    pub deletions_held: Family<HoldLabels, Gauge>,
    /// `routewarden_mass_deletion_holds_total`: times the mass-deletion breaker engaged.
    pub mass_deletion_holds: Counter,
    /// `routewarden_ownership_findings{code,class}`: findings of the current decision.
    pub ownership_findings: Family<FindingLabels, Gauge>,
    /// `routewarden_route_problems{code}`: problems of the cluster data that change routes
    /// (S08: a BlockAffinity naming another node than its IPAMBlock), by code, recomputed on
    /// every snapshot; the log line and `explain` name the block and both nodes.
    pub route_problems: Family<ProblemLabels, Gauge>,
    /// `routewarden_routes{family,class,state}`: desired vs programmed vs held cluster routes.
    pub routes: Family<RouteLabels, Gauge>,
    /// `routewarden_route_operations_total{op,result}`: netlink route writes (`replace`,
    /// `delete`) and nexthop object writes (`nexthop-replace`, `nexthop-delete`).
    pub route_operations: Family<OperationLabels, Counter>,
    /// `routewarden_netlink_errors_total{op,kind}`.
    pub netlink_errors: Family<NetlinkErrorLabels, Counter>,
    /// `routewarden_reconcile_duration_seconds`: one apply pass (seconds).
    pub reconcile_duration: ReconcileHistogram,
    /// `routewarden_audit_findings{code}`: findings of the last audit (`--mode audit`).
    pub audit_findings: Family<AuditLabels, Gauge>,
    /// `routewarden_bpf_program_attached{program}`: 1 attached, 0 not.
    pub bpf_program_attached: Family<ProgramLabels, Gauge>,
    /// `routewarden_tc_count_packets_total`: packets seen by the `tc_count` probe.
    pub tc_count_packets: Counter,
    /// `routewarden_tc_count_bytes_total`: bytes seen by the `tc_count` probe.
    pub tc_count_bytes: Counter,
    /// `routewarden_route_writes_total{family,op,writer}`: kernel route writes seen by the watch.
    pub route_writes: Family<RouteWriteLabels, Counter>,
    /// `routewarden_route_conflicts_total{family,writers}`: conflict episodes (a prefix entering
    /// conflict; at most one per prefix per window).
    pub route_conflicts: Family<RouteConflictLabels, Counter>,
    /// `routewarden_route_flaps_total{family}`: flap episodes (at most one per prefix per window).
    pub route_flaps: Family<FamilyLabels, Counter>,
    /// `routewarden_route_write_failures_total{family,op,writer}`: route writes the kernel
    /// refused (fentry and kprobe backends), by the refused operation and the writer's class.
    pub route_write_failures: Family<RouteWriteLabels, Counter>,
    /// `routewarden_failing_writer_episodes_total{family,writer}`: failing-writer episodes in
    /// the episode scope (one writer's writes to one prefix refused with one errno at least
    /// threshold times within the window; at most one per prefix per window).
    pub failing_writer_episodes: Family<FailingWriterLabels, Counter>,
    /// `routewarden_route_flushes_total{family}`: routes removed by the kernel without a writer.
    pub route_flushes: Family<FamilyLabels, Counter>,
    /// `routewarden_route_writes_unattributed_total{family}`: writes by a sender whose process
    /// the kernel side did not know, classed by the route protocol instead.
    pub route_writes_unattributed: Family<FamilyLabels, Counter>,
    /// `routewarden_flapping_prefixes`: prefixes in flap or conflict now.
    pub flapping_prefixes: Gauge,
    /// `routewarden_route_watch_backend_info{backend}`: 1 for the running backend.
    pub route_watch_backend: Family<BackendLabels, Gauge>,
    /// `routewarden_calico_version_info{version,rules,source}`: 1 for the release line in
    /// force (one series).
    pub calico_version: Family<CalicoVersionLabels, Gauge>,
    /// `routewarden_route_watch_events_lost_total`: ring-buffer records dropped (buffer full).
    pub route_watch_events_lost: Counter,
    /// `routewarden_forwarded_packets_total{pool,path}`: packets to cluster destinations by
    /// path taken, each packet once (`bpf::forward`).
    pub forwarded_packets: Family<ForwardPathLabels, Counter>,
    /// `routewarden_forwarded_bytes_total{pool,path}`: bytes (`skb->len` at the hook), likewise.
    pub forwarded_bytes: Family<ForwardPathLabels, Counter>,
    /// `routewarden_wrong_path_packets_total{pool,expected,actual}`.
    pub wrong_path_packets: Family<WrongPathLabels, Counter>,
    /// `routewarden_forwarding_flaps_total{pool}`: blocks whose egress path changed at least
    /// threshold times within the window (one per block per window).
    pub forwarding_flaps: Family<PoolLabels, Counter>,
    /// `routewarden_forwarding_events_lost_total`: forwarding-watch ring-buffer records lost.
    pub forwarding_events_lost: Counter,
    /// `routewarden_node_events_enabled`: 1 when the agent records Kubernetes Events on its
    /// Node (`--node-events`), else 0.
    pub node_events_enabled: Gauge,
    /// `routewarden_node_events_recorded_total{reason}`: API calls that created or updated an
    /// Event on the Node.
    pub node_events_recorded: Family<NodeEventLabels, Counter>,
    /// `routewarden_node_events_failed_total{reason,error}`: Events not recorded.
    pub node_events_failed: Family<NodeEventFailureLabels, Counter>,
    /// `routewarden_route_table_rule{family,table}`: 1 when an ip rule sends traffic of the
    /// family to routewarden's table (other than main), 0 when none does.
    pub route_table_rule: Family<TableRuleLabels, Gauge>,
    /// The series of `route_table_rule` now set (removed when no longer checked).
    table_rule_series: std::sync::Mutex<Vec<TableRuleLabels>>,
    /// `routewarden_rule_writes_total{family,op,writer}`: policy rule writes seen by the
    /// route watch.
    pub rule_writes: Family<RuleWriteLabels, Counter>,
}

/// Histogram wrapper with the reconcile buckets (1 ms .. ~16 s).
#[derive(Debug)]
pub struct ReconcileHistogram(pub Histogram);

impl Default for ReconcileHistogram {
    fn default() -> Self {
        ReconcileHistogram(Histogram::new(exponential_buckets(0.001, 2.0, 15)))
    }
}

impl Metrics {
    /// Create the handles and register them in a fresh registry with the `routewarden` prefix.
    pub fn new_registry() -> (Registry, std::sync::Arc<Metrics>) {
        let m = std::sync::Arc::new(Metrics::default());
        let mut r = Registry::with_prefix("routewarden");
        r.register("build", "Build information", Info::new(vec![("version".to_string(), env!("CARGO_PKG_VERSION").to_string())]));
        r.register("calico_version_info", "Calico release line in force (1): the version, whose rules decide, and where it came from (--calico-version, ClusterInformation default, or assumed)", m.calico_version.clone());
        r.register("datastore_synced", "1 when the datastore view is complete and current, else 0", m.datastore_synced.clone());
        r.register("datastore_load_errors", "Broken datastore files or objects seen, by reason", m.datastore_load_errors.clone());
        r.register("datastore_invalid_objects", "Datastore objects currently skipped because they failed validation", m.datastore_invalid_objects.clone());
        r.register(
            "datastore_invalid_inputs",
            "Datastore inputs (files, watched resources) currently broken; their last good content is used",
            m.datastore_invalid_inputs.clone(),
        );
        r.register(
            "frozen_prefixes",
            "Prefixes of frozen ground: named by a broken object or input, or covered by an invalid IP pool; nothing there is deleted or claimed",
            m.frozen_prefixes.clone(),
        );
        r.register(
            "frozen_classes",
            "1 while the owner of the class cannot be known: the object that decides it cannot be read or holds a value routewarden cannot interpret; nothing new is programmed there and nothing deleted or claimed",
            m.frozen_classes.clone(),
        );
        r.register("deletions_held", "Route deletions held back in the last apply, by reason", m.deletions_held.clone());
        r.register(
            "mass_deletion_holds",
            "Times the mass-deletion breaker engaged: one change would have deleted more than the threshold of routewarden's routes at once",
            m.mass_deletion_holds.clone(),
        );
        r.register("ownership_findings", "Findings of the current ownership decision, by code and pool class", m.ownership_findings.clone());
        r.register("route_problems", "Problems in the IPAM data that change routes, by code", m.route_problems.clone());
        r.register(
            "routes",
            "Cluster routes routewarden wants (desired), has in the kernel (programmed), and finds held by another writer it will not overwrite (held)",
            m.routes.clone(),
        );
        r.register("route_operations", "Netlink route and nexthop object writes, by operation and result", m.route_operations.clone());
        r.register("netlink_errors", "Netlink errors, by operation and errno kind", m.netlink_errors.clone());
        r.register("reconcile_duration_seconds", "Duration of one route-table apply pass", m.reconcile_duration.0.clone());
        r.register("audit_findings", "Findings of the last audit of the kernel against the ownership matrix, by code (--mode audit)", m.audit_findings.clone());
        r.register("bpf_program_attached", "1 when the BPF program is loaded and attached, else 0", m.bpf_program_attached.clone());
        r.register("tc_count_packets", "Packets seen by the tc_count probe on the watched devices", m.tc_count_packets.clone());
        r.register("tc_count_bytes", "Bytes seen by the tc_count probe on the watched devices", m.tc_count_bytes.clone());
        r.register("route_writes", "Kernel route writes seen by the route watch, by family, operation and writer class", m.route_writes.clone());
        r.register(
            "route_conflicts",
            "Conflict episodes: two writers overwrote or deleted each other's route for a prefix within the window",
            m.route_conflicts.clone(),
        );
        r.register("route_flaps", "Flap episodes: a prefix changed at least threshold times within the window", m.route_flaps.clone());
        r.register(
            "route_write_failures",
            "Route writes the kernel refused (fentry and kprobe backends; a socket filter sees only writes that succeeded), by family, operation and writer class",
            m.route_write_failures.clone(),
        );
        r.register(
            "failing_writer_episodes",
            "Failing-writer episodes: one writer's writes to a cluster prefix refused with the same errno at least threshold times within the window",
            m.failing_writer_episodes.clone(),
        );
        r.register("route_flushes", "Routes removed by the kernel without a writer (link down flush)", m.route_flushes.clone());
        r.register(
            "route_writes_unattributed",
            "Route writes whose writing process was not known when counted (the socket filter naming senders by netlink port): their writer class in routewarden_route_writes_total was inferred from the route protocol",
            m.route_writes_unattributed.clone(),
        );
        r.register("flapping_prefixes", "Prefixes in flap or conflict now", m.flapping_prefixes.clone());
        r.register("route_watch_backend_info", "In-kernel route watch backend in use (1), none when degraded", m.route_watch_backend.clone());
        r.register("route_watch_events_lost", "Route-watch ring-buffer records lost because the buffer was full", m.route_watch_events_lost.clone());
        r.register("forwarded_packets", "Packets leaving for cluster destinations, by IP pool and path taken (each packet once)", m.forwarded_packets.clone());
        r.register("forwarded_bytes", "Bytes leaving for cluster destinations, by IP pool and path taken", m.forwarded_bytes.clone());
        r.register("wrong_path_packets", "Packets to a cluster destination that left on a different path than expected", m.wrong_path_packets.clone());
        r.register("forwarding_flaps", "Blocks whose egress path changed at least threshold times within the window", m.forwarding_flaps.clone());
        r.register("forwarding_events_lost", "Forwarding-watch ring-buffer records lost because the buffer was full", m.forwarding_events_lost.clone());
        r.register("node_events_enabled", "1 when the agent records Kubernetes Events on its Node (--node-events), else 0", m.node_events_enabled.clone());
        r.register(
            "node_events_recorded",
            "API calls that created or updated a Kubernetes Event on this node's Node, by Event reason",
            m.node_events_recorded.clone(),
        );
        r.register(
            "node_events_failed",
            "Kubernetes Events on this node's Node not recorded, by Event reason and error: api (refused by the API server), unreachable, dropped (queue full or too many subjects)",
            m.node_events_failed.clone(),
        );
        r.register(
            "route_table_rule",
            "1 when an ip rule sends traffic of the family to routewarden's table (other than main), 0 when none does and its routes there carry no traffic",
            m.route_table_rule.clone(),
        );
        r.register(
            "rule_writes",
            "Policy rule writes (ip rule add and delete) seen by the route watch, by family, operation and writer class",
            m.rule_writes.clone(),
        );
        m.declare_deletions_held();
        m.declare_known_series();
        m.declare_node_events(false);
        (r, m)
    }
}

/// A count as a gauge value (saturating at `i64::MAX`).
fn gauge_value(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
