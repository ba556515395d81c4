//! The `routewarden_` metric set (README "Metrics" lists every one).
//!
//! Every label value comes from a fixed set (`&'static str` produced by the `label()` methods
//! of the domain enums): never a prefix, pod name or error string, so cardinality is bounded.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

/// Labels `{code, class}` of `routewarden_ownership_findings`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FindingLabels {
    /// `consistent`, `double-programmed`, `unowned`, `deprecated`, `version-skew`.
    pub code: &'static str,
    /// `ipip`, `noencap`, `vxlan`, or `none` (version skew).
    pub class: &'static str,
}

/// Labels `{code}` of `routewarden_route_problems`. The block concerned is in the log line
/// and in `routewarden explain`, never a label (one series per block would grow without
/// bound).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProblemLabels {
    /// The problem's code (`affinity-conflict`, ...; `RouteProblem::code`).
    pub code: &'static str,
}

/// Labels `{reason}` of `routewarden_deletions_held`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HoldLabels {
    /// `not-synced` (the view is not current, this node's Node is missing, or an input never
    /// loaded), `frozen` (the prefix is frozen ground), `mass-deletion` (the breaker).
    pub reason: &'static str,
}

/// Labels `{family, class, state}` of `routewarden_routes`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// `ipv4` or `ipv6`.
    pub family: &'static str,
    /// `ipip`, `noencap`, `vxlan`.
    pub class: &'static str,
    /// `desired`, `programmed`, or `held` (another writer's route holds the key and
    /// routewarden will not overwrite it; not programmed, not missing).
    pub state: &'static str,
}

/// Labels `{op, result}` of `routewarden_route_operations_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    /// `replace` or `delete`.
    pub op: &'static str,
    /// `ok` or `error`.
    pub result: &'static str,
}

/// Labels `{op, kind}` of `routewarden_netlink_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NetlinkErrorLabels {
    /// `apply` (route writes, deletes, link and resync dumps of one apply pass) or `dump`
    /// (the audit's dumps).
    pub op: &'static str,
    /// Error kind from a fixed set (`dataplane::ErrorKind::label`): `dump-interrupted`,
    /// `foreign-route-at-key`, `no-device`, `device-down`, `net-unreachable`, `timeout`,
    /// `permission`, `invalid`, `bad-desired-route`, `other`.
    pub kind: &'static str,
}

/// Labels `{code}` of `routewarden_audit_findings`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AuditLabels {
    /// `missing`, `stale`, `duplicate`, `wrong-path`, `wrong-next-hop`, `foreign-writer`.
    pub code: &'static str,
}

/// Labels `{program}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProgramLabels {
    /// BPF program name (`tc_count`, ...).
    pub program: &'static str,
}

/// Labels `{reason}` of `routewarden_datastore_load_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LoadErrorLabels {
    /// An input failure's code (`datastore::LoadErrorKind::code`: `io`, `syntax`, `empty`,
    /// `too-large`, `not-regular-file`, `vanished`, `watch`), or `object` (an object failed
    /// validation).
    pub reason: &'static str,
}

/// Labels `{family, op, writer}` of `routewarden_route_writes_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteWriteLabels {
    /// `ipv4` or `ipv6`.
    pub family: &'static str,
    /// `add`, `replace`, `delete`.
    pub op: &'static str,
    /// Writer class: `self`, `felix`, `bird`, `kernel`, `boot`, `static`, `other`.
    pub writer: &'static str,
}

/// Labels `{family, writers}` of `routewarden_route_conflicts_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteConflictLabels {
    /// `ipv4` or `ipv6`.
    pub family: &'static str,
    /// The two writer classes in class order joined by `+` (`self+bird`, `bird+bird`): at most
    /// 28 values.
    pub writers: String,
}

/// Labels `{family}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FamilyLabels {
    /// `ipv4` or `ipv6`.
    pub family: &'static str,
}

/// Labels `{version, rules, source}` of `routewarden_calico_version_info`: one series, for the
/// Calico release line in force (`ownership::resolve_version`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CalicoVersionLabels {
    /// `3.<minor>` as detected or given (`3.34` stays `3.34`).
    pub version: String,
    /// Whose rules decide: `3.26-3.30`, `3.31`, `3.32` or `3.33`.
    pub rules: &'static str,
    /// `flag`, `cluster-information` or `assumed`.
    pub source: &'static str,
}

/// Labels `{backend}` of `routewarden_route_watch_backend_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendLabels {
    /// `fentry`, `kprobe`, `socket-filter`, or `none` (watch degraded).
    pub backend: &'static str,
}

/// Labels `{pool, path}` of `routewarden_forwarded_packets_total` / `_bytes_total` (issue 6).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ForwardPathLabels {
    /// IP pool name: bounded by the cluster's pools (a fixed set from the datastore), never a
    /// prefix.
    pub pool: String,
    /// Path taken: `tunnel`, `host` (`local` never leaves the node).
    pub path: &'static str,
}

/// Labels `{pool, expected, actual}` of `routewarden_wrong_path_packets_total` (issue 6).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WrongPathLabels {
    /// IP pool name.
    pub pool: String,
    /// Expected path: `tunnel`, `host`, `local`.
    pub expected: &'static str,
    /// Path taken: `tunnel`, `host`.
    pub actual: &'static str,
}

/// Labels `{pool}` of `routewarden_forwarding_flaps_total` (issue 6).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    /// IP pool name.
    pub pool: String,
}

/// All metric handles. Cheap to share (`Arc<Metrics>`); updating a handle is lock-free.
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
    /// `routewarden_route_operations_total{op,result}`: netlink route writes.
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
    /// `routewarden_route_flushes_total{family}`: routes removed by the kernel without a writer.
    pub route_flushes: Family<FamilyLabels, Counter>,
    /// `routewarden_flapping_prefixes`: prefixes in flap or conflict now.
    pub flapping_prefixes: Gauge,
    /// `routewarden_route_watch_backend_info{backend}`: 1 for the running backend.
    pub route_watch_backend: Family<BackendLabels, Gauge>,
    /// `routewarden_calico_version_info{version,rules,source}`: 1 for the release line in
    /// force; write it only through [`Metrics::record_calico_version`] (one series).
    pub calico_version: Family<CalicoVersionLabels, Gauge>,
    /// `routewarden_route_watch_events_lost_total`: ring-buffer records dropped (buffer full).
    pub route_watch_events_lost: Counter,
    /// `routewarden_forwarded_packets_total{pool,path}`: packets to cluster destinations by
    /// path taken, each packet once (issue 6, `bpf::forward`).
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
    /// Set `routewarden_calico_version_info` to the one series of `labels` (the previous one,
    /// if different, is removed).
    pub fn record_calico_version(&self, labels: &CalicoVersionLabels) {
        if self.calico_version.get(labels).is_none() {
            self.calico_version.clear();
        }
        self.calico_version.get_or_create(labels).set(1);
    }

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
        r.register("route_operations", "Netlink route writes, by operation and result", m.route_operations.clone());
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
        r.register("route_flushes", "Routes removed by the kernel without a writer (link down flush)", m.route_flushes.clone());
        r.register("flapping_prefixes", "Prefixes in flap or conflict now", m.flapping_prefixes.clone());
        r.register("route_watch_backend_info", "In-kernel route watch backend in use (1), none when degraded", m.route_watch_backend.clone());
        r.register("route_watch_events_lost", "Route-watch ring-buffer records lost because the buffer was full", m.route_watch_events_lost.clone());
        r.register("forwarded_packets", "Packets leaving for cluster destinations, by IP pool and path taken (each packet once)", m.forwarded_packets.clone());
        r.register("forwarded_bytes", "Bytes leaving for cluster destinations, by IP pool and path taken", m.forwarded_bytes.clone());
        r.register("wrong_path_packets", "Packets to a cluster destination that left on a different path than expected", m.wrong_path_packets.clone());
        r.register("forwarding_flaps", "Blocks whose egress path changed at least threshold times within the window", m.forwarding_flaps.clone());
        r.register("forwarding_events_lost", "Forwarding-watch ring-buffer records lost because the buffer was full", m.forwarding_events_lost.clone());
        // Declared at 0 so that alerts see the first increase.
        for reason in ["not-synced", "frozen", "mass-deletion"] {
            m.deletions_held.get_or_create(&HoldLabels { reason }).set(0);
        }
        (r, m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One series at a time: a Calico upgrade replaces the series, it does not add one.
    #[test]
    fn calico_version_info_has_one_series() {
        let (r, m) = Metrics::new_registry();
        let render = || {
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, &r).unwrap();
            out.lines().filter(|l| l.starts_with("routewarden_calico_version_info")).map(str::to_owned).collect::<Vec<_>>()
        };
        assert_eq!(render(), Vec::<String>::new());
        m.record_calico_version(&CalicoVersionLabels { version: "3.30".into(), rules: "3.26-3.30", source: "cluster-information" });
        m.record_calico_version(&CalicoVersionLabels { version: "3.30".into(), rules: "3.26-3.30", source: "cluster-information" });
        assert_eq!(render(), vec![r#"routewarden_calico_version_info{version="3.30",rules="3.26-3.30",source="cluster-information"} 1"#]);
        m.record_calico_version(&CalicoVersionLabels { version: "3.33".into(), rules: "3.33", source: "assumed" });
        assert_eq!(render(), vec![r#"routewarden_calico_version_info{version="3.33",rules="3.33",source="assumed"} 1"#]);
    }
}
