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

use super::event::RouteWatchEvent;
use super::RouteWatchBackend;
/// Re-exported from where the label set is: `writers` label of a conflict.
pub use crate::observe::metrics::writers_label;
use crate::observe::metrics::Metrics;

/// State between calls: the last counter snapshot and the prefixes in flap/conflict.
#[derive(Debug)]
pub struct RouteWatchMetrics {
    last: RouteWatchCounters,
    hold: Duration,
    /// (table, prefix) -> when it stops counting as flapping.
    active: HashMap<(u32, IpNet), Instant>,
}

impl RouteWatchMetrics {
    /// For a watch with conflict/flap window `window`.
    pub fn new(window: Duration) -> RouteWatchMetrics {
        RouteWatchMetrics { last: RouteWatchCounters::default(), hold: window + (window / 4).max(Duration::from_secs(1)), active: HashMap::new() }
    }

    /// Set `routewarden_route_watch_backend_info`: 1 for `backend` (`none` when degraded), 0
    /// for the others ([`Metrics::set_route_watch_backend`]).
    pub fn set_backend(&self, metrics: &Metrics, backend: Option<RouteWatchBackend>) {
        metrics.set_route_watch_backend(backend.map(RouteWatchBackend::label));
    }

    /// Apply a counter snapshot from [`super::RouteWatch::counters`] (cumulative since start):
    /// the differences from the previous one are added ([`Metrics::record_route_watch`]).
    pub fn apply_counters(&mut self, metrics: &Metrics, now: &RouteWatchCounters) {
        metrics.record_route_watch(now, &self.last);
        self.last = *now;
    }

    /// Apply one event (conflict/flap events mark their prefix as flapping) and log it.
    pub fn apply_event(&mut self, metrics: &Metrics, event: &RouteWatchEvent, now: Instant) {
        match event {
            RouteWatchEvent::Conflict { route, previous, writes_in_window } => {
                tracing::warn!(prefix = %route.dst, table = route.table, metric = route.metric, op = route.op,
                    writer = %route.writer, previous = %previous, writes_in_window, "route conflict: two writers program the same prefix");
                self.active.insert((route.table, route.dst), now + self.hold);
            }
            RouteWatchEvent::Flap { route, previous, changes_in_window } => {
                tracing::warn!(prefix = %route.dst, table = route.table, metric = route.metric, op = route.op,
                    writer = %route.writer, previous = %previous, changes_in_window, "route flap");
                self.active.insert((route.table, route.dst), now + self.hold);
            }
            RouteWatchEvent::LinkDown { ifindex, .. } => {
                tracing::info!(ifindex, "link down: the kernel flushes its IPv4 routes without notifications");
            }
            RouteWatchEvent::Write { .. } | RouteWatchEvent::Flush { .. } => {}
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
mod tests {
    use super::*;
    use crate::bpf::route_watch::event::{RouteChange, WriterInfo};
    use prometheus_client::encoding::text::encode;
    use routewarden_common::route_watch::WriterClass;

    fn writer(class: &'static str, protocol: u8) -> WriterInfo {
        WriterInfo { protocol, class, kernel: false, netlink_port: Some(7), pid: None, comm: None }
    }

    fn conflict() -> RouteWatchEvent {
        RouteWatchEvent::Conflict {
            route: RouteChange {
                at_ns: 1,
                family: "ipv4",
                op: "replace",
                table: 254,
                dst: "10.244.20.0/26".parse().unwrap(),
                metric: 1024,
                oif: 2,
                gateway: None,
                nexthop_id: None,
                writer: writer("bird", 12),
            },
            previous: writer("self", 80),
            writes_in_window: 2,
        }
    }

    #[test]
    fn counters_become_labelled_deltas() {
        let (registry, metrics) = Metrics::new_registry();
        let mut state = RouteWatchMetrics::new(Duration::from_secs(30));
        state.set_backend(&metrics, Some(RouteWatchBackend::SocketFilter));
        let mut c = RouteWatchCounters::default();
        c.writes[0][1][WriterClass::Bird as usize] = 5;
        c.conflicts[0][WriterClass::Bird as usize][WriterClass::SelfAgent as usize] = 1;
        c.flaps[1] = 2;
        c.flushes[0] = 3;
        c.records_lost = 4;
        state.apply_counters(&metrics, &c);
        c.writes[0][1][WriterClass::Bird as usize] = 8;
        state.apply_counters(&metrics, &c);
        let mut out = String::new();
        encode(&mut out, &registry).unwrap();
        assert!(out.contains(r#"routewarden_route_writes_total{family="ipv4",op="replace",writer="bird"} 8"#), "{out}");
        assert!(out.contains(r#"routewarden_route_conflicts_total{family="ipv4",writers="self+bird"} 1"#), "{out}");
        assert!(out.contains(r#"routewarden_route_flaps_total{family="ipv6"} 2"#), "{out}");
        assert!(out.contains(r#"routewarden_route_flushes_total{family="ipv4"} 3"#), "{out}");
        assert!(out.contains("routewarden_route_watch_events_lost_total 4"), "{out}");
        assert!(out.contains(r#"routewarden_route_watch_backend_info{backend="socket-filter"} 1"#), "{out}");
        assert!(out.contains(r#"routewarden_route_watch_backend_info{backend="fentry"} 0"#), "{out}");
    }

    #[test]
    fn flapping_gauge_holds_then_clears() {
        let (_r, metrics) = Metrics::new_registry();
        let mut state = RouteWatchMetrics::new(Duration::from_secs(4));
        let t0 = Instant::now();
        state.apply_event(&metrics, &conflict(), t0);
        assert_eq!(metrics.flapping_prefixes.get(), 1);
        state.apply_event(&metrics, &conflict(), t0 + Duration::from_secs(3));
        state.tick(&metrics, t0 + Duration::from_secs(6));
        assert_eq!(metrics.flapping_prefixes.get(), 1, "re-emitted within the window: still flapping");
        state.tick(&metrics, t0 + Duration::from_secs(9));
        assert_eq!(metrics.flapping_prefixes.get(), 0);
    }
}
