//! The route-watch handler: starts the in-kernel route-churn watch (`bpf::route_watch`), turns
//! its counters and events into metrics and logs. If no backend loads, the watch is reported
//! as degraded (`/readyz`, `routewarden_route_watch_backend_info{backend="none"}`) and the
//! agent keeps programming routes.

use std::time::Instant;

use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::bpf::route_watch::{RouteWatch, RouteWatchConfig, RouteWatchEvent, RouteWatchMetrics};
use crate::observe::metrics::ProgramLabels;
use crate::observe::{Health, Metrics, WatcherState};

/// Name of the watcher in `/readyz` and of the program label in
/// `routewarden_bpf_program_attached`.
pub const WATCHER: &str = "route_watch";

/// Owns the watch, its event channel and its metric state.
pub struct RouteWatchHandler {
    watch: Option<RouteWatch>,
    events: Option<mpsc::Receiver<RouteWatchEvent>>,
    metrics_state: RouteWatchMetrics,
    reader: Option<tokio::task::JoinHandle<()>>,
}

impl RouteWatchHandler {
    /// Start the watch with the best backend that loads (or the forced one). Never fails:
    /// problems become a degraded state.
    pub fn start(config: &RouteWatchConfig, metrics: &Metrics, health: &Health) -> RouteWatchHandler {
        let metrics_state = RouteWatchMetrics::new(config.window);
        let attached = metrics.bpf_program_attached.get_or_create(&ProgramLabels { program: WATCHER }).clone();
        let started = match crate::bpf::embedded_object() {
            None => Err(crate::bpf::route_watch::RouteWatchError::NoObject),
            Some(object) => RouteWatch::start(object, config),
        };
        match started {
            Ok(mut watch) => {
                // `RouteWatch::start` already logged each backend it could not use and why.
                info!(backend = watch.backend().label(), window_s = config.window.as_secs(), flap_threshold = config.flap_threshold, "route watch running");
                metrics_state.set_backend(metrics, Some(watch.backend()));
                let (tx, rx) = mpsc::channel(1024);
                let reader = match watch.spawn_reader(tx) {
                    Ok(r) => Some(r),
                    Err(e) => {
                        warn!(error = %e, "route watch: cannot read its ring buffer; counters only");
                        None
                    }
                };
                attached.set(1);
                health.set_watcher(WATCHER, WatcherState::Ready);
                RouteWatchHandler { watch: Some(watch), events: Some(rx), metrics_state, reader }
            }
            Err(e) => {
                warn!(error = %e, "route watch degraded: no backend runs; routes are still programmed");
                metrics_state.set_backend(metrics, None);
                attached.set(0);
                health.set_watcher(WATCHER, WatcherState::Degraded(e.to_string()));
                RouteWatchHandler { watch: None, events: None, metrics_state, reader: None }
            }
        }
    }

    /// The next event from the kernel (pending forever when the watch is not running).
    pub async fn next_event(&mut self) -> Option<RouteWatchEvent> {
        match self.events.as_mut() {
            Some(rx) => rx.recv().await,
            None => std::future::pending().await,
        }
    }

    /// Fold one event into the metrics (and the conflict/flap warn logs).
    pub fn on_event(&mut self, metrics: &Metrics, event: &RouteWatchEvent) {
        self.metrics_state.apply_event(metrics, event, Instant::now());
    }

    /// Read the kernel counters and expire the flapping-prefixes gauge.
    pub fn poll(&mut self, metrics: &Metrics) {
        if let Some(w) = &mut self.watch {
            // Sockets the agent opened since: its writes must stay `self`.
            if let Err(e) = w.refresh_self_ports() {
                warn!(error = %e, "route watch: refreshing this process's netlink ports");
            }
            match w.counters() {
                Ok(c) => self.metrics_state.apply_counters(metrics, &c),
                Err(e) => warn!(error = %e, "route watch: reading counters"),
            }
        }
        self.metrics_state.tick(metrics, Instant::now());
    }
}

impl Drop for RouteWatchHandler {
    fn drop(&mut self) {
        if let Some(r) = self.reader.take() {
            r.abort();
        }
    }
}
