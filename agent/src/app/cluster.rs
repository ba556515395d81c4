//! The cluster handler: holds the last plan and turns datastore events into plans, dataplane
//! commands, the datastore and plan metrics, readiness notes, and (with `--host-device auto`)
//! the host NIC found from this node's Calico address.

use std::collections::BTreeSet;
use std::sync::Arc;

use tokio::sync::mpsc;
use tracing::{error, info, warn};

use super::flags::Mode;
use super::view;
use crate::dataplane::{DataplaneCommand, KernelDump};
use crate::datastore::{DatastoreEvent, Snapshot};
use crate::observe::{Health, Metrics, StatusBoard};
use crate::plan::{self, Plan, PlanConfig};
use crate::vocabulary::PoolClass;

/// Invalid objects (and inputs) logged one by one per change of the set.
const LOGGED_ERRORS: usize = 20;

/// Longest reason a log line carries, in bytes: an object's error can quote a long value.
const LOGGED_REASON: usize = 512;

/// `reason` cut to [`LOGGED_REASON`] bytes (at a character boundary) with `...` when longer.
fn truncated(reason: &str) -> std::borrow::Cow<'_, str> {
    if reason.len() <= LOGGED_REASON {
        return reason.into();
    }
    let mut end = LOGGED_REASON;
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &reason[..end]).into()
}

/// The cluster handler: holds the last plan, turns snapshots into dataplane commands and
/// ownership metrics.
pub(super) struct ClusterHandler {
    pub(super) config: PlanConfig,
    pub(super) mode: Mode,
    pub(super) metrics: Arc<Metrics>,
    pub(super) health: Arc<Health>,
    /// The status document's state: each new plan's ownership decision.
    pub(super) status: Arc<StatusBoard>,
    pub(super) programmed: BTreeSet<PoolClass>,
    pub(super) view: view::ViewState,
    pub(super) last: Option<Plan>,
    /// The route pass and the last plan's inputs, kept between snapshots
    /// ([`crate::plan::plan_with`]).
    pub(super) plan_memo: crate::plan::PlanMemo,
    pub(super) commands: Option<mpsc::Sender<DataplaneCommand>>,
    /// `--host-device auto`: the host NIC found from this node's Calico address.
    pub(super) host_nic: Option<HostNicAuto>,
}

/// State of `--host-device auto` ([`crate::dataplane::tasks::host_nic`]).
pub(super) struct HostNicAuto {
    /// A read-only socket for the link and address dumps.
    pub(super) nl: KernelDump,
    /// Why the last lookup failed (logged once per distinct reason); `None` after a success.
    pub(super) error: Option<String>,
    /// The last snapshot, to plan again when the NIC changes between snapshots.
    pub(super) snapshot: Option<Snapshot>,
    /// The NIC changed since the watches last attached (the app restarts them).
    pub(super) changed: bool,
}

impl ClusterHandler {
    /// `--host-device auto`: look up the link holding this node's Calico address and adopt it.
    /// Returns whether a plan can be made (a NIC is known: found now, or the previous one
    /// kept when the lookup fails, which is logged with the address and the links seen).
    async fn resolve_host_nic(&mut self, snap: &Snapshot) -> bool {
        let Some(auto) = self.host_nic.as_mut() else { return true };
        let node = self.config.node.clone();
        match crate::dataplane::tasks::host_nic::find_host_nic(&auto.nl, &node, snap.cluster.nodes.get(node.as_str()).map(AsRef::as_ref)).await {
            Ok(name) => {
                if name != self.config.devices.host_nic {
                    info!(host_device = %name, previous = %self.config.devices.host_nic, "host NIC found: the link holding this node's Calico address");
                    self.config.devices.host_nic = name;
                    auto.changed = true;
                }
                auto.error = None;
            }
            Err(e) => {
                let why = e.to_string();
                if auto.error.as_deref() != Some(why.as_str()) {
                    if self.config.devices.host_nic.is_empty() {
                        error!(error = %why, "--host-device auto: no host NIC; not programming routes and not ready until one is found");
                    } else {
                        error!(error = %why, keeping = %self.config.devices.host_nic, "--host-device auto: the host NIC is gone; keeping the previous one");
                    }
                }
                auto.error = Some(why);
            }
        }
        !self.config.devices.host_nic.is_empty()
    }

    /// Look for the host NIC again (link and address changes) and plan again when it moved.
    pub(super) async fn recheck_host_nic(&mut self) {
        let Some(snap) = self.host_nic.as_ref().and_then(|a| a.snapshot.clone()) else { return };
        let before = self.config.devices.host_nic.clone();
        let error_before = self.host_nic.as_ref().is_some_and(|a| a.error.is_some());
        let usable = self.resolve_host_nic(&snap).await;
        let error_now = self.host_nic.as_ref().is_some_and(|a| a.error.is_some());
        if usable && (before != self.config.devices.host_nic || self.last.is_none()) {
            self.on_snapshot(&snap, false).await;
        } else if error_before != error_now {
            self.publish_synced().await;
        }
    }

    /// Whether the host NIC changed since the last call (the watches must move to it).
    pub(super) fn take_host_nic_change(&mut self) -> Option<String> {
        let auto = self.host_nic.as_mut()?;
        std::mem::take(&mut auto.changed).then(|| self.config.devices.host_nic.clone())
    }

    /// Handle one datastore event; whether it made a new plan (a snapshot that changes
    /// nothing the plan reads, or no snapshot, makes none: `self.last` stands).
    pub(super) async fn on_datastore(&mut self, ev: DatastoreEvent) -> bool {
        let before = (self.view.invalid_objects.clone(), self.view.invalid_inputs.clone());
        self.view.on_event(&ev);
        let errors_changed = self.last.is_none() || before != (self.view.invalid_objects.clone(), self.view.invalid_inputs.clone());
        match ev {
            DatastoreEvent::LoadFailed(e) => {
                error!(file = %e.file.display(), line = e.line, error = %e.message, code = e.code(), "cluster description failed to load; keeping the last good state");
                self.metrics.record_load_failed(&e);
                false
            }
            DatastoreEvent::Synced => {
                info!("datastore synced");
                self.publish_synced().await;
                false
            }
            DatastoreEvent::Unsynced { reason } => {
                warn!(%reason, "datastore not synced; keeping every route, deleting none");
                self.publish_synced().await;
                false
            }
            DatastoreEvent::Snapshot(s) => self.on_snapshot(&s, errors_changed).await,
        }
    }

    async fn publish_synced(&self) {
        let plan = self.last.as_ref();
        let current = self.view.current(plan);
        self.metrics.set_synced(current);
        let mut notes = self.view.notes(plan, &self.config.node);
        if let Some(why) = self.host_nic.as_ref().and_then(|a| a.error.as_deref()) {
            let state = if self.config.devices.host_nic.is_empty() { "none found".to_owned() } else { format!("keeping {}", self.config.devices.host_nic) };
            notes.push(format!("host device: {state}: {}", crate::text::one_line(why)));
        }
        self.health.set_view(current, notes);
        if let Some(tx) = &self.commands {
            let _ = tx.send(DataplaneCommand::SetDatastoreSynced(self.view.deletions_allowed(plan))).await;
        }
    }

    /// Plan `snap` and hand the plan's parts out; whether a new plan was made.
    async fn on_snapshot(&mut self, snap: &Snapshot, errors_changed: bool) -> bool {
        if let Some(auto) = self.host_nic.as_mut() {
            auto.snapshot = Some(snap.clone());
        }
        if !self.resolve_host_nic(snap).await {
            // No host NIC yet: no plan (no route is written, none deleted), not ready.
            self.publish_synced().await;
            return false;
        }
        // Logged when they change, at most LOGGED_ERRORS of each (the rest counted): a file of
        // a thousand broken objects is one burst of lines, not one per snapshot.
        if errors_changed {
            for e in snap.object_errors.iter().take(LOGGED_ERRORS) {
                warn!(file = %e.file.display(), error = %e.error, last_good_kept = e.last_good, "object skipped");
            }
            for e in snap.load_errors.iter().take(LOGGED_ERRORS) {
                warn!(file = %e.file.display(), line = e.line, error = %e.message, never_loaded = e.never_loaded, "input broken; its last good content is used");
            }
            let more = snap.object_errors.len().saturating_sub(LOGGED_ERRORS) + snap.load_errors.len().saturating_sub(LOGGED_ERRORS);
            if more > 0 {
                warn!(more, "more invalid objects and inputs not logged one by one (routewarden explain lists them)");
            }
        }
        self.metrics.record_snapshot(snap);
        let previous_owned = self.last.as_ref().map(|p| p.policy.owned.clone()).unwrap_or_default();
        let Some(plan) = plan::plan_with(&mut self.plan_memo, snap, &self.config, &self.programmed, &previous_owned) else {
            // The plan of this snapshot is the last one (a pod's IP allocated in its own node's
            // block): the dataplane, the audit and the forwarding watch have it already.
            self.publish_synced().await;
            return false;
        };
        if self.last.as_ref().is_none_or(|l| l.frozen != plan.frozen) {
            // At most LOGGED_ERRORS lines, whatever the frozen ground's size (a few hundred
            // broken pools would otherwise write a line per frozen prefix in every apply).
            for f in plan.frozen.iter().take(LOGGED_ERRORS) {
                warn!(prefix = %f.cidr, reason = %crate::text::one_line(&truncated(&f.reason)), "frozen ground: no route here is deleted or claimed until the input is fixed");
            }
            if plan.frozen.len() > LOGGED_ERRORS {
                warn!(
                    more = plan.frozen.len() - LOGGED_ERRORS,
                    "more prefixes of frozen ground not logged one by one (routewarden explain and /readyz count them)"
                );
            }
        }
        if self.last.as_ref().is_none_or(|l| l.frozen_classes != plan.frozen_classes) {
            for f in &plan.frozen_classes {
                warn!(class = f.class.label(), reason = %f.reason, "frozen class: nothing new programmed, deleted or claimed in it until the object is fixed");
            }
        }
        if let Some(h) = &plan.hold_all {
            if self.last.as_ref().is_none_or(|l| l.hold_all.as_ref() != Some(h)) {
                warn!(reason = %h, "holding every route deletion");
            }
        }
        if plan.local_node_missing && self.last.as_ref().is_none_or(|l| !l.local_node_missing) {
            error!(node = %self.config.node, "this node is not in the datastore; deleting nothing and not ready until it is back");
        }
        self.report_plan(&plan, snap);
        let classes = plan.programmed.clone();
        if let Some(tx) = &self.commands {
            let _ = tx.send(DataplaneCommand::SetPolicy(plan.policy.clone())).await;
            let _ = tx.send(DataplaneCommand::SetDesired { routes: plan.desired.clone(), handovers: plan.handovers.clone() }).await;
        }
        if self.mode == Mode::Program {
            self.programmed = classes;
        }
        self.last = Some(plan);
        self.publish_synced().await;
        true
    }

    fn report_plan(&self, plan: &Plan, snap: &Snapshot) {
        let d = &plan.decision;
        let changed = self.last.as_ref().is_none_or(|l| l.decision.programmed != d.programmed || l.decision.findings != d.findings);
        if changed {
            info!(
                node = %self.config.node,
                role = ?self.config.ownership.role,
                calico = %d.version,
                felix = %d.felix.value.as_str(),
                bird = %d.bird.value.as_str(),
                programs = ?d.programmed.iter().map(|c| c.label()).collect::<Vec<_>>(),
                pools = d.pools.len(),
                blocks = snap.cluster.ipam_blocks.len(),
                nodes = snap.cluster.nodes.len(),
                "ownership decided"
            );
            for f in &d.findings {
                if f.is_error() {
                    error!(code = f.code(), class = f.class_label(), "{}", f.message);
                } else {
                    info!(code = f.code(), class = f.class_label(), "{}", f.message);
                }
            }
            for h in &plan.handovers {
                info!(class = h.class.label(), to = h.to.label(), protocol = h.protocol, "handing class over; keeping our routes until the new owner's appear");
            }
        }
        // Problems: logged when they change, counted on every new plan (a block on an unknown
        // node appearing at runtime changes no ownership decision, but must be reported; a
        // snapshot that makes no new plan has the last plan's problems).
        if self.last.as_ref().is_none_or(|l| l.problems != plan.problems) {
            for p in &plan.problems {
                warn!(code = p.code(), block = p.block(), "{p}");
            }
        }
        self.metrics.record_plan(plan);
        self.status.set_decision(d);
    }
}
