//! What the agent records as Kubernetes Events on its Node (`--node-events`,
//! [`crate::observe::node_events`]): a conflict or flap episode of the route watch inside the
//! episode scope (what `routewarden_route_conflicts_total` and `routewarden_route_flaps_total`
//! count: at most one per prefix per window), an ownership decision gaining an error finding
//! (double-programmed, unowned), the mass-deletion breaker engaging. [`NodeEventTriggers`] turns
//! the loop's plans, route-watch events and apply reports into [`NodeEvent`]s (pure);
//! [`NodeEvents`] hands them to the recorder task, never waiting.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use tracing::info;

use super::flags::NodeEventsMode;
use crate::bpf::route_watch::{EpisodeScope, RouteChange, RouteWatchEvent};
use crate::dataplane::ApplyReport;
use crate::observe::node_events::{cut_note, NodeEvent, NodeEventReason, NodeEventSink};
use crate::observe::Metrics;
use crate::plan::Plan;
use crate::vocabulary::PoolClass;

/// The loop's events in, [`NodeEvent`]s out. Holds what tells an occurrence from a
/// continuation: the error findings of the last plan, whether the breaker held deletes in the
/// last apply; and the last plan's scope and IP pools, which name a prefix's class.
#[derive(Debug, Default)]
pub struct NodeEventTriggers {
    /// The route watch's conflict/flap window (`--route-watch-window`), named in flap notes.
    window: Duration,
    /// `None` until the first plan: every episode counts (as the route watch judges them).
    scope: Option<EpisodeScope>,
    /// The valid IP pools' CIDRs and classes.
    pools: Vec<(IpNet, Option<PoolClass>)>,
    /// (code, class) of the last plan's error findings.
    ownership_errors: BTreeSet<(&'static str, &'static str)>,
    /// The breaker held deletes in the last apply.
    mass_held: bool,
}

impl NodeEventTriggers {
    /// For a route watch with conflict/flap window `window`.
    pub fn new(window: Duration) -> NodeEventTriggers {
        NodeEventTriggers { window, ..NodeEventTriggers::default() }
    }

    /// A new plan: its scope and pools from now on, and one `RouteOwnershipInconsistent` per
    /// error finding (code, class) the previous plan did not have.
    pub fn on_plan(&mut self, plan: &Plan, scope: EpisodeScope) -> Vec<NodeEvent> {
        self.set_scope(scope, plan.decision.pools.iter().map(|p| (p.cidr, p.class)).collect());
        let errors: Vec<_> = plan.decision.findings.iter().filter(|f| f.is_error()).collect();
        let now: BTreeSet<(&'static str, &'static str)> = errors.iter().map(|f| (f.code(), f.class_label())).collect();
        let out = errors
            .iter()
            .filter(|f| !self.ownership_errors.contains(&(f.code(), f.class_label())))
            .map(|f| NodeEvent {
                reason: NodeEventReason::RouteOwnershipInconsistent,
                subject: f.class_label().to_owned(),
                note: cut_note(&format!("pool class {}: {}: {}", f.class_label(), f.code(), crate::text::one_line(&f.message))),
            })
            .collect();
        self.ownership_errors = now;
        out
    }

    /// Judge route episodes inside `scope` from now on, naming a prefix's class from `pools`
    /// (each valid IP pool's CIDR and class; what [`NodeEventTriggers::on_plan`] sets).
    pub fn set_scope(&mut self, scope: EpisodeScope, pools: Vec<(IpNet, Option<PoolClass>)>) {
        self.scope = Some(scope);
        self.pools = pools;
    }

    /// A `RouteConflict`, `RouteFlap` or `RouteWriterFailing` for a conflict, flap or
    /// failing-writer episode inside the scope; `None` for anything else.
    pub fn on_route_watch(&self, event: &RouteWatchEvent) -> Option<NodeEvent> {
        let (reason, route, previous, what) = match event {
            RouteWatchEvent::Conflict { route, previous, .. } => (
                NodeEventReason::RouteConflict,
                route,
                previous,
                format!("{} overwrote or deleted the route of {previous}: two writers program this prefix", route.writer),
            ),
            RouteWatchEvent::Flap { route, previous, changes_in_window } => (
                NodeEventReason::RouteFlap,
                route,
                previous,
                format!("{changes_in_window} changes within the {} s window, the last by {} after {previous}", self.window.as_secs(), route.writer),
            ),
            RouteWatchEvent::FailingWriter { route, error, failures_in_window } => (
                NodeEventReason::RouteWriterFailing,
                route,
                &route.writer,
                format!(
                    "the kernel refused {failures_in_window} {} writes by {} within the {} s window: {error}",
                    route.op,
                    route.writer,
                    self.window.as_secs()
                ),
            ),
            _ => return None,
        };
        if self.scope.as_ref().is_some_and(|s| !s.judges(route, previous)) {
            return None;
        }
        Some(NodeEvent { reason, subject: subject(route), note: cut_note(&format!("{}: {what}", self.place(route))) })
    }

    /// A `RouteMassDeletionHeld` when the breaker engages (it held nothing in the last apply).
    pub fn on_report(&mut self, report: &ApplyReport, threshold_percent: u8, settle: Duration) -> Option<NodeEvent> {
        let was = std::mem::replace(&mut self.mass_held, report.mass_deletion.is_some());
        let (wanted, ours) = report.mass_deletion.filter(|_| !was)?;
        Some(NodeEvent {
            reason: NodeEventReason::RouteMassDeletionHeld,
            subject: "breaker".to_owned(),
            note: format!(
                "one change would delete {wanted} of routewarden's {ours} routes, more than {threshold_percent} %: each delete waits until it has been wanted for {} s",
                settle.as_secs()
            ),
        })
    }

    /// `10.244.1.0/26 in table 254 (pool class ipip)`: the prefix, its table and the class of
    /// the narrowest valid IP pool holding it.
    fn place(&self, route: &RouteChange) -> String {
        let pool = self.pools.iter().filter(|(cidr, _)| cidr.contains(&route.dst)).max_by_key(|(cidr, _)| cidr.prefix_len());
        let class = match pool {
            Some((_, Some(class))) => format!("pool class {}", class.label()),
            Some((cidr, None)) => format!("IP pool {cidr}, no route class"),
            None => "outside every IP pool".to_owned(),
        };
        format!("{} in table {} ({class})", route.dst, route.table)
    }
}

/// The aggregation subject of a route episode: prefix and table.
fn subject(route: &RouteChange) -> String {
    format!("{} table {}", route.dst, route.table)
}

/// The app's handle: [`NodeEventTriggers`] feeding the recorder task's sink; does nothing
/// when Events are off.
#[derive(Debug)]
pub struct NodeEvents {
    triggers: NodeEventTriggers,
    sink: Option<NodeEventSink>,
}

impl NodeEvents {
    /// Events off.
    pub fn off() -> NodeEvents {
        NodeEvents { triggers: NodeEventTriggers::default(), sink: None }
    }

    /// Events through `sink` (a recorder task, [`crate::observe::node_events::spawn`]).
    pub fn new(sink: NodeEventSink, window: Duration) -> NodeEvents {
        NodeEvents { triggers: NodeEventTriggers::new(window), sink: Some(sink) }
    }

    /// See [`NodeEventTriggers::on_plan`].
    pub fn on_plan(&mut self, plan: &Plan) {
        if let Some(sink) = &self.sink {
            self.triggers.on_plan(plan, super::episode_scope(plan)).into_iter().for_each(|e| sink.record(e));
        }
    }

    /// See [`NodeEventTriggers::on_route_watch`].
    pub fn on_route_watch(&self, event: &RouteWatchEvent) {
        if let (Some(sink), Some(e)) = (&self.sink, self.triggers.on_route_watch(event)) {
            sink.record(e);
        }
    }

    /// See [`NodeEventTriggers::on_report`].
    pub fn on_report(&mut self, report: &ApplyReport, threshold_percent: u8, settle: Duration) {
        if let Some(sink) = &self.sink {
            if let Some(e) = self.triggers.on_report(report, threshold_percent, settle) {
                sink.record(e);
            }
        }
    }
}

/// Start recording Events on Node `node` as `--node-events` says: `off`; `on` (a Kubernetes
/// client is needed); `auto` (on when there is one). The client is `datastore_client`
/// (`--datastore kubernetes`'s), else the in-cluster service account's when the agent runs in a
/// pod ([`in_cluster_client`]). Logs the outcome and sets `routewarden_node_events_enabled`.
///
/// # Errors
/// `on` without a client, naming the flag.
pub fn start(mode: NodeEventsMode, datastore_client: Option<kube::Client>, node: &str, window: Duration, metrics: &Arc<Metrics>) -> anyhow::Result<NodeEvents> {
    let client = match mode {
        NodeEventsMode::Off => None,
        NodeEventsMode::Auto | NodeEventsMode::On => datastore_client.or_else(in_cluster_client),
    };
    let client = match (mode, client) {
        (NodeEventsMode::Off, _) => None,
        (NodeEventsMode::On, None) => {
            anyhow::bail!("--node-events on: no Kubernetes client (use --datastore kubernetes, or run in a pod with a service account)")
        }
        (_, client) => client,
    };
    metrics.declare_node_events(client.is_some());
    let Some(client) = client else {
        info!(mode = ?mode, "not recording Kubernetes Events on the Node (--node-events off, or no Kubernetes client)");
        return Ok(NodeEvents::off());
    };
    info!(node, "recording Kubernetes Events on the Node: RouteConflict, RouteFlap, RouteOwnershipInconsistent, RouteMassDeletionHeld");
    let (sink, _task) = crate::observe::node_events::spawn(client, node, metrics.clone());
    Ok(NodeEvents::new(sink, window))
}

/// The client `--node-events auto` uses without `--datastore kubernetes`: the in-cluster
/// service account's, when the agent runs in a pod (`KUBERNETES_SERVICE_HOST` and the token
/// are there); `None` otherwise, or when the client cannot be built (logged).
pub fn in_cluster_client() -> Option<kube::Client> {
    let mut config = kube::Config::incluster().ok()?;
    config.headers.push(crate::datastore::kubernetes::user_agent());
    kube::Client::try_from(config).map_err(|e| tracing::warn!(error = %e, "in-cluster Kubernetes client for Node Events")).ok()
}

#[cfg(test)]
mod tests;
