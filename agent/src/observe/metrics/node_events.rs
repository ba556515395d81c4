//! The metrics of the Kubernetes Events recorded on this node's Node
//! (`routewarden_node_events_*`), written by the recorder task of `observe::node_events`.
//! Every series of the fixed label sets exists at 0 from start, so an alert on a failure rate
//! needs no `absent()`.

use prometheus_client::encoding::EncodeLabelSet;

use super::Metrics;

/// The Event reasons, the values of the `reason` label (`observe::node_events::NodeEventReason`
/// labels).
pub const NODE_EVENT_REASONS: [&str; 5] = ["RouteConflict", "RouteFlap", "RouteOwnershipInconsistent", "RouteMassDeletionHeld", "RouteWriterFailing"];

/// Why an Event was not recorded, the values of the `error` label: `api` (the API server
/// answered with an error status: forbidden, invalid, a server error), `unreachable` (no
/// answer: connection refused or reset, TLS, the request's time limit), `dropped` (never sent:
/// the recorder's queue was full, or it tracked as many (reason, subject) pairs as it may).
pub const NODE_EVENT_ERRORS: [&str; 3] = ["api", "unreachable", "dropped"];

/// Labels `{reason}` of `routewarden_node_events_recorded_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeEventLabels {
    /// One of [`NODE_EVENT_REASONS`].
    pub reason: &'static str,
}

/// Labels `{reason,error}` of `routewarden_node_events_failed_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeEventFailureLabels {
    /// One of [`NODE_EVENT_REASONS`].
    pub reason: &'static str,
    /// One of [`NODE_EVENT_ERRORS`].
    pub error: &'static str,
}

impl Metrics {
    /// Every series of the node-event metrics at 0, and `routewarden_node_events_enabled` to
    /// `enabled` (whether the agent records Events at all, `--node-events`).
    pub fn declare_node_events(&self, enabled: bool) {
        self.node_events_enabled.set(i64::from(enabled));
        for reason in NODE_EVENT_REASONS {
            self.node_events_recorded.get_or_create(&NodeEventLabels { reason }).inc_by(0);
            for error in NODE_EVENT_ERRORS {
                self.node_events_failed.get_or_create(&NodeEventFailureLabels { reason, error }).inc_by(0);
            }
        }
    }

    /// One API call creating or updating an Event of `reason` succeeded.
    pub fn record_node_event(&self, reason: &'static str) {
        self.node_events_recorded.get_or_create(&NodeEventLabels { reason }).inc();
    }

    /// An Event of `reason` was not recorded, for `error` (one of [`NODE_EVENT_ERRORS`]).
    pub fn record_node_event_failed(&self, reason: &'static str, error: &'static str) {
        self.node_events_failed.get_or_create(&NodeEventFailureLabels { reason, error }).inc();
    }
}
