//! Turns route-watch counters and events into the `routewarden_route_*` metrics: the state
//! between reads; the metrics and their labels are written by
//! [`crate::observe::metrics::route_watch`].
//!
//! Counters come from the kernel (cumulative per-CPU sums; applied as deltas from the previous
//! read, since prometheus counters only increase). `routewarden_flapping_prefixes` comes from events: a
//! prefix counts from its last conflict/flap event until `window + max(window / 4, 1 s)` later.
//! The kernel re-emits at most one event per prefix per window while the fight goes on, so
//! the gauge stays up during a fight and returns to 0 about one window after it stops.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use routewarden_common::route_watch::RouteWatchCounters;

use super::event::{RouteChange, RouteWatchEvent, WriterInfo};
use super::RouteWatchBackend;
/// Re-exported from where the label set is: `writers` label of a conflict.
pub use crate::observe::metrics::writers_label;
use crate::observe::metrics::Metrics;

/// Where a conflict or a flap means something : a prefix inside an IP pool
/// of the cluster (any class: cluster routes are what two writers fight over), or a key of
/// routewarden's own (its protocol in its table, on either side of the episode). A VPN client,
/// a DHCP client or an operator adding and deleting routes elsewhere is not a fight over
/// cluster routes: its writes are counted (`routewarden_route_writes_total`) but raise no
/// episode, log line or alert.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EpisodeScope {
    /// The cluster's valid IP pool CIDRs, sorted.
    pub pools: Vec<IpNet>,
    /// routewarden's route protocol.
    pub protocol: u8,
    /// routewarden's table.
    pub table: u32,
}

impl EpisodeScope {
    /// Whether an episode on `route`, whose previous writer was `previous`, is judged.
    pub fn judges(&self, route: &RouteChange, previous: &WriterInfo) -> bool {
        self.pools.iter().any(|p| p.contains(&route.dst))
            || (route.table == self.table && (route.writer.protocol == self.protocol || previous.protocol == self.protocol))
    }
}

/// Most conflict and flap lines logged per [`EPISODE_LOG_PERIOD`].
const EPISODE_LINES: u32 = 20;
/// The period of [`EPISODE_LINES`].
const EPISODE_LOG_PERIOD: Duration = Duration::from_secs(10);

/// State between calls: the last counter snapshot, the prefixes in flap/conflict, and where
/// episodes are judged.
#[derive(Debug)]
pub struct RouteWatchMetrics {
    last: RouteWatchCounters,
    hold: Duration,
    /// (table, prefix) -> when it stops counting as flapping.
    active: HashMap<(u32, IpNet), Instant>,
    /// `None` until the first plan: every episode is judged.
    scope: Option<EpisodeScope>,
    /// Episode log lines of the current period: (its start, lines logged, lines held back).
    logged: (Instant, u32, u64),
    /// Episodes outside the scope, dropped (for tests and the debug log).
    unjudged: u64,
}

impl RouteWatchMetrics {
    /// For a watch with conflict/flap window `window`.
    pub fn new(window: Duration) -> RouteWatchMetrics {
        RouteWatchMetrics {
            last: RouteWatchCounters::default(),
            hold: window + (window / 4).max(Duration::from_secs(1)),
            active: HashMap::new(),
            scope: None,
            unjudged: 0,
            logged: (Instant::now(), 0, 0),
        }
    }

    /// Whether an episode may be logged at `now`: at most [`EPISODE_LINES`] a
    /// [`EPISODE_LOG_PERIOD`]; the period after, one line says how many were held back. A
    /// fight over 24,000 prefixes is 24,000 episodes in a second: their counters and the
    /// flapping gauge have them all, the log a sample.
    fn may_log(&mut self, now: Instant) -> bool {
        let (start, lines, held) = &mut self.logged;
        if now.saturating_duration_since(*start) >= EPISODE_LOG_PERIOD {
            if *held > 0 {
                tracing::warn!(held = *held, period_s = EPISODE_LOG_PERIOD.as_secs(), "more route conflicts and flaps than logged one by one (routewarden_route_conflicts_total and routewarden_route_flaps_total count them all)");
            }
            (*start, *lines, *held) = (now, 0, 0);
        }
        if *lines < EPISODE_LINES {
            *lines += 1;
            true
        } else {
            *held += 1;
            false
        }
    }

    /// Judge episodes only inside `scope` from now on ([`EpisodeScope`]).
    pub fn set_scope(&mut self, scope: EpisodeScope) {
        self.scope = Some(scope);
    }

    /// Conflict and flap episodes dropped as outside the scope so far.
    pub fn unjudged(&self) -> u64 {
        self.unjudged
    }

    /// Set `routewarden_route_watch_backend_info`: 1 for `backend` (`none` when degraded), 0
    /// for the others ([`Metrics::set_route_watch_backend`]).
    pub fn set_backend(&self, metrics: &Metrics, backend: Option<RouteWatchBackend>) {
        metrics.set_route_watch_backend(backend.map(RouteWatchBackend::label));
    }

    /// Apply a counter snapshot from [`super::RouteWatch::counters`] (cumulative since start):
    /// the differences from the previous one are added ([`Metrics::record_route_watch`]).
    /// Conflicts and flaps are counted from their events instead ([`Self::apply_event`]), which
    /// the kernel sends exactly when it counts one, so that only episodes in the scope count.
    pub fn apply_counters(&mut self, metrics: &Metrics, now: &RouteWatchCounters) {
        metrics.record_route_watch(now, &self.last);
        self.last = *now;
    }

    /// Apply one event (conflict/flap events mark their prefix as flapping; a failing-writer
    /// episode is counted, `routewarden_failing_writer_episodes_total`) and log it.
    pub fn apply_event(&mut self, metrics: &Metrics, event: &RouteWatchEvent, now: Instant) {
        if let Some((route, previous)) = event.episode() {
            if self.scope.as_ref().is_some_and(|s| !s.judges(route, previous)) {
                self.unjudged += 1;
                return;
            }
        }
        match event {
            RouteWatchEvent::Conflict { route, previous, writes_in_window } => {
                metrics.record_route_conflict(route.family, route.writer.writer_class(), previous.writer_class());
                if self.may_log(now) {
                    tracing::warn!(prefix = %route.dst, table = route.table, metric = route.metric, op = route.op,
                    writer = %route.writer, previous = %previous, writes_in_window, "route conflict: two writers program the same prefix");
                }
                self.active.insert((route.table, route.dst), now + self.hold);
            }
            RouteWatchEvent::Flap { route, previous, changes_in_window } => {
                metrics.record_route_flap(route.family);
                if self.may_log(now) {
                    tracing::warn!(prefix = %route.dst, table = route.table, metric = route.metric, op = route.op,
                    writer = %route.writer, previous = %previous, changes_in_window, "route flap");
                }
                self.active.insert((route.table, route.dst), now + self.hold);
            }
            RouteWatchEvent::LinkDown { ifindex, .. } => {
                tracing::info!(ifindex, "link down: the kernel flushes its IPv4 routes without notifications");
            }
            RouteWatchEvent::RuleChange { rule } => {
                // Rules change rarely; every change is logged (the app re-checks the table's
                // rules on each, `routewarden_route_table_rule`).
                tracing::info!(family = rule.family, op = rule.op, priority = rule.priority, table = rule.table, writer = %rule.writer, "policy rule change");
            }
            RouteWatchEvent::FailingWriter { route, error, failures_in_window } => {
                // Not a flapping prefix: the route is unchanged, one writer cannot get its way.
                metrics.record_failing_writer(route.family, route.writer.writer_class());
                if self.may_log(now) {
                    tracing::warn!(prefix = %route.dst, table = route.table, metric = route.metric, op = route.op,
                    writer = %route.writer, error = %error, failures_in_window, "failing writer: the kernel keeps refusing one writer's writes to this prefix");
                }
            }
            RouteWatchEvent::Write { .. } | RouteWatchEvent::Flush { .. } | RouteWatchEvent::WriteFailed { .. } => {}
        }
        self.tick(metrics, now);
    }

    /// Expire prefixes whose hold time passed and set `routewarden_flapping_prefixes`.
    pub fn tick(&mut self, metrics: &Metrics, now: Instant) {
        self.active.retain(|_, until| *until > now);
        metrics.set_flapping_prefixes(self.active.len());
    }

    /// Prefixes in flap or conflict now (as of the last call).
    pub fn flapping(&self) -> usize {
        self.active.len()
    }
}

#[cfg(test)]
mod tests;
