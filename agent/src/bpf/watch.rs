//! One shape for every BPF watch: the route watch, the forwarding watch and
//! `tc_count` implement [`Watch`]; the app runs each in a [`WatchHandler`], which does what
//! they used to repeat:
//!
//! - **start, degraded not fatal**: a watch that cannot start (no object, a load or attach
//!   refused, no backend) is logged at `warn`, shown as `bpf <name>: degraded: <why>` in
//!   `/readyz`, and the agent keeps programming routes;
//! - **attached gauge**: `routewarden_bpf_program_attached{program="<name>"}` is 1 while the
//!   watch runs attached, 0 otherwise;
//! - **health line**: `bpf <name>: ready` / `bpf <name>: degraded: <why>`, following
//!   [`Watch::detached_reason`] on every poll;
//! - **event stream**: the watch's ring-buffer reader feeds a channel, drained by
//!   [`WatchHandler::next_event`] (pending forever when there is none, for `tokio::select!`);
//! - **detach on drop**: dropping the handler stops the reader and drops the watch, whose
//!   owned links detach its programs.
//!
//! ```ignore
//! let mut route = WatchHandler::start(RouteWatch::start_in(&object), &metrics, &health);
//! // every second:         route.poll(&metrics);
//! // in the select! loop:  Some(ev) = route.next_event() => route.on_event(&metrics, &ev),
//! ```

use tokio::sync::mpsc;

use super::BpfError;
use crate::observe::{Health, Metrics, WatcherState};

/// Events buffered between a watch's reader and the app's loop.
const EVENT_QUEUE: usize = 1024;

/// A BPF watch as the app's loop sees it.
pub trait Watch {
    /// What its ring buffer yields.
    type Event: Send + 'static;
    /// Name in `/readyz` (`bpf <NAME>: ready`) and the `program` label of
    /// `routewarden_bpf_program_attached`: `route_watch`, `tc_forward`, `tc_count`.
    const NAME: &'static str;
    /// What the `warn` line says when the watch cannot start (the error is a field).
    const DEGRADED: &'static str;

    /// Start the ring-buffer reader on the current tokio runtime, sending to `tx`; `Ok(None)`
    /// when the watch has no events.
    ///
    /// # Errors
    /// Whatever stops the reader from starting; the handler keeps the watch (counters only).
    fn spawn_reader(&mut self, tx: mpsc::Sender<Self::Event>) -> Result<Option<tokio::task::JoinHandle<()>>, BpfError>;

    /// Called once after a successful start (the info line, metrics that name the backend).
    fn on_started(&mut self, _metrics: &Metrics) {}

    /// Called once when the watch could not start.
    fn on_degraded(_metrics: &Metrics) {}

    /// Timer (every second): read the kernel counters into the metrics, attach what appeared.
    fn poll(&mut self, metrics: &Metrics);

    /// One event from the reader.
    fn on_event(&mut self, _metrics: &Metrics, _event: &Self::Event) {}

    /// One line `/readyz` shows under the running watch's state (`bpf <NAME>: <note>`), e.g.
    /// how the route watch names writers; `None`: none.
    fn note(&self) -> Option<String> {
        None
    }

    /// Why the running watch is attached to nothing (every configured device gone), or
    /// `None` while it is attached.
    fn detached_reason(&self) -> Option<String> {
        None
    }
}

/// What a handler last published for its running watch.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Published {
    /// Gauge 1, `ready`.
    Attached,
    /// Gauge 0, `degraded: <why>`.
    Detached(String),
}

/// Runs one [`Watch`] for the app (see the module docs).
pub struct WatchHandler<W: Watch> {
    watch: Option<W>,
    events: Option<mpsc::Receiver<W::Event>>,
    reader: Option<tokio::task::JoinHandle<()>>,
    /// What the gauge and the health line say now (`None`: nothing published yet).
    published: Option<Published>,
}

impl<W: Watch> std::fmt::Debug for WatchHandler<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchHandler").field("name", &W::NAME).field("running", &self.watch.is_some()).finish_non_exhaustive()
    }
}

impl<W: Watch> WatchHandler<W> {
    /// Take the outcome of the watch's start: running (gauge 1, `ready`, reader started) or
    /// degraded (gauge 0, `degraded: <why>`, a warning). Never fails. Must run inside a tokio
    /// runtime (the reader is a task).
    pub fn start(started: Result<W, BpfError>, metrics: &Metrics, health: &Health) -> WatchHandler<W> {
        match started {
            Ok(mut watch) => {
                watch.on_started(metrics);
                let (tx, rx) = mpsc::channel(EVENT_QUEUE);
                let (events, reader) = match watch.spawn_reader(tx) {
                    Ok(Some(r)) => (Some(rx), Some(r)),
                    Ok(None) => (None, None),
                    Err(e) => {
                        tracing::warn!(watch = W::NAME, error = %e, "cannot read the watch's ring buffer; counters only");
                        (None, None)
                    }
                };
                let mut handler = WatchHandler { watch: Some(watch), events, reader, published: None };
                handler.publish(metrics, health);
                handler
            }
            Err(e) => {
                tracing::warn!(error = %e, "{}", W::DEGRADED);
                W::on_degraded(metrics);
                Self::degraded(metrics, health, &e.to_string());
                WatchHandler { watch: None, events: None, reader: None, published: None }
            }
        }
    }

    /// A handler whose watch is not started yet: nothing published (no gauge, no `/readyz`
    /// line) until [`WatchHandler::start`] replaces it or [`WatchHandler::follow`] starts it.
    pub fn not_started() -> WatchHandler<W> {
        WatchHandler { watch: None, events: None, reader: None, published: None }
    }

    fn degraded(metrics: &Metrics, health: &Health, why: &str) {
        metrics.set_program_attached(W::NAME, false);
        health.set_watcher(W::NAME, WatcherState::Degraded(why.to_owned()));
    }

    /// Publish the gauge and the health line when [`Watch::detached_reason`] changed.
    fn publish(&mut self, metrics: &Metrics, health: &Health) {
        let Some(w) = &self.watch else { return };
        let now = w.detached_reason().map_or(Published::Attached, Published::Detached);
        if self.published.as_ref() == Some(&now) {
            return;
        }
        match &now {
            Published::Attached => {
                metrics.set_program_attached(W::NAME, true);
                health.set_watcher_note(W::NAME, w.note());
                health.set_watcher(W::NAME, WatcherState::Ready);
            }
            Published::Detached(why) => Self::degraded(metrics, health, why),
        }
        self.published = Some(now);
    }

    /// Whether the watch started.
    pub fn is_running(&self) -> bool {
        self.watch.is_some()
    }

    /// The running watch.
    pub fn watch_mut(&mut self) -> Option<&mut W> {
        self.watch.as_mut()
    }

    /// Timer: [`Watch::poll`], then the gauge and the health line.
    pub fn poll(&mut self, metrics: &Metrics, health: &Health) {
        if let Some(w) = self.watch.as_mut() {
            w.poll(metrics);
        }
        self.publish(metrics, health);
    }

    /// Move the running watch (`retarget`, e.g. to a host NIC that changed), or start it again
    /// with `start` when it is not running (a start that failed for want of a device).
    pub fn follow(
        &mut self,
        metrics: &Metrics,
        health: &Health,
        retarget: impl FnOnce(&mut W) -> Result<(), BpfError>,
        start: impl FnOnce() -> Result<W, BpfError>,
    ) {
        match self.watch.as_mut() {
            Some(w) => {
                if let Err(e) = retarget(w) {
                    tracing::warn!(watch = W::NAME, error = %e, "moving the watch to its new devices failed; retried every second");
                }
                self.publish(metrics, health);
            }
            None => *self = Self::start(start(), metrics, health),
        }
    }

    /// The next event from the kernel; pending forever when the watch is not running or its
    /// reader stopped (logged once).
    pub async fn next_event(&mut self) -> Option<W::Event> {
        if let Some(rx) = self.events.as_mut() {
            if let Some(ev) = rx.recv().await {
                return Some(ev);
            }
            tracing::warn!(watch = W::NAME, "the watch's ring-buffer reader stopped; counters still work, events do not");
            self.events = None;
        }
        std::future::pending().await
    }

    /// Fold one event into the metrics and logs ([`Watch::on_event`]).
    pub fn on_event(&mut self, metrics: &Metrics, event: &W::Event) {
        if let Some(w) = self.watch.as_mut() {
            w.on_event(metrics, event);
        }
    }
}

impl<W: Watch> Drop for WatchHandler<W> {
    fn drop(&mut self) {
        if let Some(r) = self.reader.take() {
            r.abort();
        }
    }
}

#[cfg(test)]
mod tests;
