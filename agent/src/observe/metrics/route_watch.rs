//! The route watch's metrics (`bpf::route_watch`): kernel route writes by family,
//! operation and writer class, conflict and flap episodes, flushes, the prefixes in flap or
//! conflict now, the backend in use and the ring-buffer records lost.
//!
//! The kernel's counters are cumulative per-CPU sums; `bpf::route_watch::RouteWatchMetrics`
//! keeps the previous read and hands both to [`Metrics::record_route_watch`], which adds the
//! differences (Prometheus counters only increase). A difference of 0 creates no series.

use prometheus_client::encoding::EncodeLabelSet;
use routewarden_common::route_watch::{RouteWatchCounters, WriteOp, WriterClass, FAMILIES, OPS, WRITER_CLASSES};

use super::{gauge_value, Metrics};

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
    /// The two writer classes in class order joined by `+` (`self+bird`, `bird+bird`,
    /// [`writers_label`]): at most 28 values.
    pub writers: String,
}

/// Labels `{family, writer}` of `routewarden_failing_writer_episodes_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailingWriterLabels {
    /// `ipv4` or `ipv6`.
    pub family: &'static str,
    /// Writer class of the failing writer: `self`, `felix`, `bird`, `kernel`, `boot`,
    /// `static`, `other`.
    pub writer: &'static str,
}

/// Labels `{family}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FamilyLabels {
    /// `ipv4` or `ipv6`.
    pub family: &'static str,
}

/// Labels `{backend}` of `routewarden_route_watch_backend_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendLabels {
    /// `fentry`, `kprobe`, `socket-filter`, or `none` (watch degraded).
    pub backend: &'static str,
}

/// The `family` label values by the kernel counters' family index.
pub(super) const FAMILY_LABELS: [&str; FAMILIES] = ["ipv4", "ipv6"];
/// The operations by the kernel counters' operation index.
pub(super) const OP_LABELS: [WriteOp; OPS] = [WriteOp::Add, WriteOp::Replace, WriteOp::Delete];
/// The `backend` label values (`RouteWatchBackend::label`, and `none`), every one declared.
const BACKENDS: [&str; 4] = ["fentry", "kprobe", "socket-filter", "none"];

/// `writers` label of a conflict: both classes in class order, joined by `+`.
pub fn writers_label(a: WriterClass, b: WriterClass) -> String {
    let (x, y) = if a <= b { (a, b) } else { (b, a) };
    format!("{}+{}", x.label(), y.label())
}

impl Metrics {
    /// `routewarden_route_watch_backend_info`: 1 for the `running` backend
    /// (`RouteWatchBackend::label`; `None` when the watch is degraded: `none`), 0 for the
    /// others.
    pub fn set_route_watch_backend(&self, running: Option<&'static str>) {
        let running = running.unwrap_or("none");
        debug_assert!(BACKENDS.contains(&running), "unknown route-watch backend {running}");
        for backend in BACKENDS {
            self.route_watch_backend.get_or_create(&BackendLabels { backend }).set(i64::from(backend == running));
        }
    }

    /// Add what the route watch's kernel counters counted between two reads (`before`, then
    /// `now`; both cumulative since the watch started): writes by family, operation and
    /// writer class, writes the kernel refused (`routewarden_route_write_failures_total`), writes not attributed to a process, flushes, records lost, and policy rule
    /// writes (`routewarden_rule_writes_total`). Conflicts and flaps are counted from their events, in
    /// the episode scope ([`Metrics::record_route_conflict`], [`Metrics::record_route_flap`]).
    pub fn record_route_watch(&self, now: &RouteWatchCounters, before: &RouteWatchCounters) {
        let delta = |new: u64, old: u64| new.saturating_sub(old);
        for (fi, family) in FAMILY_LABELS.into_iter().enumerate() {
            for (oi, op) in OP_LABELS.into_iter().enumerate() {
                for ci in 0..WRITER_CLASSES {
                    let writer = WriterClass::ALL[ci].label();
                    let d = delta(now.writes[fi][oi][ci], before.writes[fi][oi][ci]);
                    if d > 0 {
                        self.route_writes.get_or_create(&RouteWriteLabels { family, op: op.label(), writer }).inc_by(d);
                    }
                    let d = delta(now.write_failures[fi][oi][ci], before.write_failures[fi][oi][ci]);
                    if d > 0 {
                        self.route_write_failures.get_or_create(&RouteWriteLabels { family, op: op.label(), writer }).inc_by(d);
                    }
                }
            }
            let d = delta(now.flushes[fi], before.flushes[fi]);
            if d > 0 {
                self.route_flushes.get_or_create(&FamilyLabels { family }).inc_by(d);
            }
            let d = delta(now.unattributed[fi], before.unattributed[fi]);
            if d > 0 {
                self.route_writes_unattributed.get_or_create(&FamilyLabels { family }).inc_by(d);
            }
        }
        let d = delta(now.records_lost, before.records_lost);
        if d > 0 {
            self.route_watch_events_lost.inc_by(d);
        }
        self.record_rule_writes(now, before);
    }

    /// One conflict episode judged (inside the episode scope): `routewarden_route_conflicts_total`
    /// `{family, writers}`, the two writer classes in class order ([`writers_label`]). The
    /// kernel's own conflict counters are not used: they count episodes everywhere.
    pub fn record_route_conflict(&self, family: &'static str, a: WriterClass, b: WriterClass) {
        self.route_conflicts.get_or_create(&RouteConflictLabels { family, writers: writers_label(a, b) }).inc();
    }

    /// One flap episode judged: `routewarden_route_flaps_total{family}`.
    pub fn record_route_flap(&self, family: &'static str) {
        self.route_flaps.get_or_create(&FamilyLabels { family }).inc();
    }

    /// One failing-writer episode judged: `routewarden_failing_writer_episodes_total{family,writer}`.
    pub fn record_failing_writer(&self, family: &'static str, writer: WriterClass) {
        self.failing_writer_episodes.get_or_create(&FailingWriterLabels { family, writer: writer.label() }).inc();
    }

    /// `routewarden_flapping_prefixes`: the prefixes in flap or conflict now.
    pub fn set_flapping_prefixes(&self, prefixes: usize) {
        self.flapping_prefixes.set(gauge_value(prefixes));
    }
}
