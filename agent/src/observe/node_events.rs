//! Kubernetes Events on this node's Node object (`--node-events`), so that a route conflict, a
//! flap, an inconsistent ownership decision or a held mass deletion shows in `kubectl describe
//! node` and in every event exporter a cluster runs.
//!
//! The app hands [`NodeEvent`]s to a [`NodeEventSink`], which never waits: a full queue drops
//! the event and counts it (`routewarden_node_events_failed_total{error="dropped"}`). A task of
//! its own ([`spawn`]) folds them in an [`Aggregator`] and records what falls due with
//! kube-runtime's event [`Recorder`] (events.k8s.io/v1: a POST creates the Event, a merge PATCH
//! raises its `series.count`; RBAC `create` and `patch` on `events.k8s.io` `events`).
//!
//! Aggregation is per (reason, subject), a subject being a prefix and table, a pool class, or
//! the breaker: kube 5's recorder keys its cache by reason, action, reporter and the objects
//! referred to, not by the note, so one recorder serves one (reason, subject) and keeps that
//! Event's series (its cache forgets an Event 6 minutes after its last report, after which a
//! new Event starts). The recorder makes one API call per publish; the aggregator bounds them:
//! at most one call per (reason, subject) per [`PERIOD`], occurrences in between folded into
//! the next call, and at most [`MAX_SUBJECTS`] subjects tracked at once.
//!
//! The Event regards the Node as the kubelet's own Node Events do (`kind: Node`, `uid` = the
//! node's name, no namespace), which is what `kubectl describe node` searches for, so no `get`
//! on nodes is needed; cluster-scoped objects' Events live in namespace `default`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;

use crate::observe::Metrics;

/// At most one API call per (reason, subject) in this period.
pub const PERIOD: Duration = Duration::from_mins(1);

/// Most (reason, subject) pairs tracked at once; an occurrence of a new pair beyond them is
/// dropped and counted. A fight over thousands of prefixes has them all in the metrics and the
/// log; the Node gets the first ones.
pub const MAX_SUBJECTS: usize = 256;

/// A pair with nothing pending is forgotten this long after its last report: kube's recorder
/// forgets its Event after 6 minutes (`CACHE_TTL` in kube-runtime `events.rs`).
pub const FORGET_AFTER: Duration = Duration::from_mins(6);

/// Events queued between the app loop and the recorder task.
pub const QUEUE: usize = 256;

/// Time limit of one API call.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest note, in bytes (events.k8s.io/v1 `note`: "at most 1kB").
pub const NOTE_MAX: usize = 1024;

/// The reporting controller of every Event (`reportingController`).
pub const CONTROLLER: &str = "routewarden";

/// Why an Event is recorded: its `reason`, its `action`, its severity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NodeEventReason {
    /// A conflict episode began: two writers overwrite or delete each other's route.
    RouteConflict,
    /// A flap episode began: a prefix changed at least the threshold times in the window.
    RouteFlap,
    /// The ownership decision has an error finding (a class double-programmed or unowned).
    RouteOwnershipInconsistent,
    /// The mass-deletion breaker engaged.
    RouteMassDeletionHeld,
    /// A failing-writer episode began: the kernel keeps refusing one writer's writes to a
    /// prefix with the same error (fentry and kprobe backends).
    RouteWriterFailing,
}

impl NodeEventReason {
    /// Every reason, in label order.
    pub const ALL: [NodeEventReason; 5] = [
        NodeEventReason::RouteConflict,
        NodeEventReason::RouteFlap,
        NodeEventReason::RouteOwnershipInconsistent,
        NodeEventReason::RouteMassDeletionHeld,
        NodeEventReason::RouteWriterFailing,
    ];

    /// The Event's `reason` and the metrics' `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            NodeEventReason::RouteConflict => "RouteConflict",
            NodeEventReason::RouteFlap => "RouteFlap",
            NodeEventReason::RouteOwnershipInconsistent => "RouteOwnershipInconsistent",
            NodeEventReason::RouteMassDeletionHeld => "RouteMassDeletionHeld",
            NodeEventReason::RouteWriterFailing => "RouteWriterFailing",
        }
    }

    /// The Event's `action`: what routewarden was doing when it saw it.
    pub fn action(self) -> &'static str {
        match self {
            NodeEventReason::RouteConflict | NodeEventReason::RouteFlap | NodeEventReason::RouteWriterFailing => "WatchRoutes",
            NodeEventReason::RouteOwnershipInconsistent => "DecideOwnership",
            NodeEventReason::RouteMassDeletionHeld => "HoldDeletes",
        }
    }
}

/// One occurrence to record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeEvent {
    pub reason: NodeEventReason,
    /// What the Event is about, the aggregation key with the reason: `10.244.1.0/26 table
    /// 254`, a pool class, `breaker`. Not shown.
    pub subject: String,
    /// The Event's note (`kubectl describe`'s message), cut to [`NOTE_MAX`] bytes.
    pub note: String,
}

/// An API call due: the Event to create or update.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    pub reason: NodeEventReason,
    pub subject: String,
    /// The note of the latest occurrence (kube's recorder keeps the note an Event was created
    /// with and only raises its count).
    pub note: String,
    /// Occurrences folded into this report (1 when reported at once).
    pub occurrences: u32,
}

/// State of one (reason, subject).
#[derive(Debug)]
struct Subject {
    note: String,
    last_call: Instant,
    /// Occurrences since the last call.
    pending: u32,
}

/// Occurrences in, API calls out: the first occurrence of a (reason, subject) at once, then at
/// most one call per [`PERIOD`] carrying the occurrences since the last one. Pure: the caller
/// passes the time.
#[derive(Debug)]
pub struct Aggregator {
    subjects: HashMap<(NodeEventReason, String), Subject>,
    period: Duration,
    max_subjects: usize,
}

impl Default for Aggregator {
    fn default() -> Aggregator {
        Aggregator::new(PERIOD, MAX_SUBJECTS)
    }
}

impl Aggregator {
    /// At most one report per (reason, subject) per `period`, at most `max_subjects` tracked.
    pub fn new(period: Duration, max_subjects: usize) -> Aggregator {
        Aggregator { subjects: HashMap::new(), period, max_subjects }
    }

    /// Fold in `event`, seen at `now`: the report to make at once (the first occurrence, or
    /// one after a quiet period), else `Ok(None)` (it waits for [`Aggregator::due`]).
    ///
    /// # Errors
    /// `Err(event)` when `event` is of a new (reason, subject) and `max_subjects` are tracked.
    pub fn observe(&mut self, event: NodeEvent, now: Instant) -> Result<Option<Report>, NodeEvent> {
        let key = (event.reason, event.subject);
        if self.subjects.len() >= self.max_subjects {
            self.forget(now);
        }
        let full = self.subjects.len() >= self.max_subjects;
        match self.subjects.get_mut(&key) {
            Some(s) => {
                s.note = event.note;
                s.pending += 1;
                if now.saturating_duration_since(s.last_call) < self.period {
                    return Ok(None);
                }
                let occurrences = std::mem::take(&mut s.pending);
                s.last_call = now;
                Ok(Some(Report { reason: key.0, subject: key.1, note: s.note.clone(), occurrences }))
            }
            None if full => Err(NodeEvent { reason: key.0, subject: key.1, note: event.note }),
            None => {
                self.subjects.insert(key.clone(), Subject { note: event.note.clone(), last_call: now, pending: 0 });
                Ok(Some(Report { reason: key.0, subject: key.1, note: event.note, occurrences: 1 }))
            }
        }
    }

    /// The reports due at `now` (pending occurrences whose period has passed), ordered by
    /// reason and subject; forgets the pairs with nothing pending [`FORGET_AFTER`] after their
    /// last report.
    pub fn due(&mut self, now: Instant) -> Vec<Report> {
        let mut out = Vec::new();
        for (key, s) in &mut self.subjects {
            if s.pending > 0 && now.saturating_duration_since(s.last_call) >= self.period {
                let occurrences = std::mem::take(&mut s.pending);
                s.last_call = now;
                out.push(Report { reason: key.0, subject: key.1.clone(), note: s.note.clone(), occurrences });
            }
        }
        self.forget(now);
        out.sort_by(|a, b| (a.reason, &a.subject).cmp(&(b.reason, &b.subject)));
        out
    }

    /// Forget the pairs with nothing pending [`FORGET_AFTER`] after their last report.
    fn forget(&mut self, now: Instant) {
        self.subjects.retain(|_, s| s.pending > 0 || now.saturating_duration_since(s.last_call) < FORGET_AFTER);
    }

    /// When the next pending report falls due, if one is pending.
    pub fn next_due(&self) -> Option<Instant> {
        self.subjects.values().filter(|s| s.pending > 0).map(|s| s.last_call + self.period).min()
    }

    /// Whether (reason, subject) is tracked.
    pub fn tracks(&self, reason: NodeEventReason, subject: &str) -> bool {
        self.subjects.contains_key(&(reason, subject.to_owned()))
    }
}

/// `note` cut to [`NOTE_MAX`] bytes at a character boundary (`...` when cut).
pub fn cut_note(note: &str) -> String {
    if note.len() <= NOTE_MAX {
        return note.to_owned();
    }
    let mut end = NOTE_MAX - 3;
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &note[..end])
}

/// The app's end of the queue to the recorder task. Never waits.
#[derive(Clone, Debug)]
pub struct NodeEventSink {
    tx: mpsc::Sender<NodeEvent>,
    metrics: Arc<Metrics>,
}

impl NodeEventSink {
    /// Queue `event`; when the queue is full, drop it and count it
    /// (`routewarden_node_events_failed_total{error="dropped"}`).
    pub fn record(&self, event: NodeEvent) {
        if let Err(e) = self.tx.try_send(event) {
            let event = match e {
                mpsc::error::TrySendError::Full(ev) | mpsc::error::TrySendError::Closed(ev) => ev,
            };
            tracing::debug!(reason = event.reason.label(), subject = %event.subject, "node event dropped: the recorder's queue is full");
            self.metrics.record_node_event_failed(event.reason.label(), "dropped");
        }
    }
}

/// The reference to Node `node` that Events regard: as the kubelet's (`uid` = the name).
pub fn node_reference(node: &str) -> ObjectReference {
    ObjectReference { api_version: Some("v1".into()), kind: Some("Node".into()), name: Some(node.into()), uid: Some(node.into()), ..ObjectReference::default() }
}

/// Start the recorder task on the current runtime: Events about Node `node` through `client`,
/// reported by `routewarden` instance `routewarden-<node>`. The task ends when every sink is
/// dropped.
pub fn spawn(client: kube::Client, node: &str, metrics: Arc<Metrics>) -> (NodeEventSink, tokio::task::JoinHandle<()>) {
    spawn_with(client, node, metrics, Aggregator::default())
}

/// [`spawn`] with `aggregator`'s period and bound (tests).
pub fn spawn_with(client: kube::Client, node: &str, metrics: Arc<Metrics>, aggregator: Aggregator) -> (NodeEventSink, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(QUEUE);
    let recorder = RecorderTask {
        client,
        reporter: Reporter { controller: CONTROLLER.into(), instance: Some(format!("{CONTROLLER}-{node}")) },
        node: node_reference(node),
        metrics: metrics.clone(),
        recorders: HashMap::new(),
        aggregator,
    };
    (NodeEventSink { tx, metrics }, tokio::spawn(recorder.run(rx)))
}

struct RecorderTask {
    client: kube::Client,
    reporter: Reporter,
    node: ObjectReference,
    metrics: Arc<Metrics>,
    /// One recorder per (reason, subject): its cache holds that Event's series.
    recorders: HashMap<(NodeEventReason, String), Recorder>,
    aggregator: Aggregator,
}

impl RecorderTask {
    async fn run(mut self, mut rx: mpsc::Receiver<NodeEvent>) {
        loop {
            // With nothing pending, still once a period: forgotten pairs' recorders are dropped.
            let wake =
                tokio::time::Instant::from_std(self.aggregator.next_due().unwrap_or_else(|| tokio::time::Instant::now().into_std() + self.aggregator.period));
            tokio::select! {
                ev = rx.recv() => {
                    let Some(ev) = ev else { return };
                    match self.aggregator.observe(ev, tokio::time::Instant::now().into_std()) {
                        Ok(Some(report)) => self.publish(report).await,
                        Ok(None) => {}
                        Err(ev) => {
                            tracing::debug!(reason = ev.reason.label(), subject = %ev.subject, "node event dropped: too many subjects tracked");
                            self.metrics.record_node_event_failed(ev.reason.label(), "dropped");
                        }
                    }
                }
                () = tokio::time::sleep_until(wake) => {
                    for report in self.aggregator.due(tokio::time::Instant::now().into_std()) {
                        self.publish(report).await;
                    }
                    let aggregator = &self.aggregator;
                    self.recorders.retain(|(reason, subject), _| aggregator.tracks(*reason, subject));
                }
            }
        }
    }

    /// One API call: create the Event, or raise its count.
    async fn publish(&mut self, report: Report) {
        let key = (report.reason, report.subject);
        let recorder = self.recorders.entry(key.clone()).or_insert_with(|| Recorder::new(self.client.clone(), self.reporter.clone()));
        let event = Event {
            type_: EventType::Warning,
            reason: key.0.label().into(),
            note: Some(cut_note(&report.note)),
            action: key.0.action().into(),
            secondary: None,
        };
        let error = match tokio::time::timeout(CALL_TIMEOUT, recorder.publish(&event, &self.node)).await {
            Ok(Ok(())) => {
                self.metrics.record_node_event(key.0.label());
                tracing::debug!(reason = key.0.label(), subject = %key.1, occurrences = report.occurrences, "node event recorded");
                return;
            }
            Ok(Err(kube::Error::Api(status))) => ("api", format!("{} ({} {})", status.message, status.code, status.reason)),
            Ok(Err(e)) => ("unreachable", crate::text::causes_once(&e)),
            Err(_) => ("unreachable", format!("no answer within {} s", CALL_TIMEOUT.as_secs())),
        };
        self.metrics.record_node_event_failed(key.0.label(), error.0);
        tracing::warn!(reason = key.0.label(), subject = %key.1, error = %error.1, "could not record a Kubernetes Event on the Node; carrying on");
    }
}

#[cfg(test)]
mod tests;
