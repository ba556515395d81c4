//! [`ViewState`]: what the agent makes of its datastore's events and its last plan — whether
//! the view is current (readiness, `routewarden_datastore_synced`), whether any route may be
//! deleted, and what `/readyz` says about it. Pure; the cluster handler and the bad-input
//! property test drive it the same way.

use crate::datastore::{DatastoreEvent, Snapshot};
use crate::plan::Plan;

/// Invalid inputs and objects named one by one on `/readyz` (the rest are counted).
const READYZ_NAMED: usize = 5;

/// See the module docs.
#[derive(Clone, Debug, Default)]
pub struct ViewState {
    /// The datastore said `Synced` and not `Unsynced` since.
    pub synced: bool,
    /// Why the datastore last said it is not synced.
    pub unsynced_reason: Option<String>,
    /// The current broken inputs and invalid objects, one line each.
    pub invalid_inputs: Vec<String>,
    pub invalid_objects: Vec<String>,
    /// The last snapshot's inputs had been stable for the settle period.
    pub settled: bool,
}

impl ViewState {
    /// Fold a datastore event in (a snapshot's lists; the sync state).
    pub fn on_event(&mut self, ev: &DatastoreEvent) {
        match ev {
            DatastoreEvent::Synced => {
                self.synced = true;
                self.unsynced_reason = None;
            }
            DatastoreEvent::Unsynced { reason } => {
                self.synced = false;
                self.unsynced_reason = Some(reason.clone());
            }
            DatastoreEvent::Snapshot(s) => self.on_snapshot(s),
            DatastoreEvent::LoadFailed(_) => {}
        }
    }

    fn on_snapshot(&mut self, snap: &Snapshot) {
        self.invalid_inputs = snap.load_errors.iter().map(ToString::to_string).collect();
        self.invalid_objects = snap.object_errors.iter().map(ToString::to_string).collect();
        self.settled = snap.settled;
    }

    /// The view is current and is this node's: synced, with this node's Node in it. What
    /// readiness and `routewarden_datastore_synced` report.
    pub fn current(&self, plan: Option<&Plan>) -> bool {
        self.synced && plan.is_some_and(|p| !p.local_node_missing)
    }

    /// Deletes are allowed when the view is current, the inputs have settled, and no input
    /// that never loaded is broken (frozen ground and the mass-deletion breaker are the
    /// dataplane's).
    pub fn deletions_allowed(&self, plan: Option<&Plan>) -> bool {
        self.current(plan) && self.settled && plan.is_some_and(|p| p.hold_all.is_none())
    }

    /// The `/readyz` lines about the view: the Calico release line in force and where it came
    /// from (`calico: 3.30 (ClusterInformation default: v3.30.2)`), why the view is not
    /// current, what is held, what is broken (named up to [`READYZ_NAMED`], control characters
    /// escaped).
    pub fn notes(&self, plan: Option<&Plan>, node: &str) -> Vec<String> {
        use crate::text::one_line;
        let mut notes = Vec::new();
        if !self.synced {
            match &self.unsynced_reason {
                Some(r) => notes.push(format!("not synced: {}", one_line(r))),
                // A first sync of thousands of files takes a while: say what it waits for.
                None => notes.push(
                    "not synced: waiting for the datastore's first complete view (reading and settling its inputs, or listing every resource)".to_owned(),
                ),
            }
        }
        let Some(p) = plan else { return notes };
        notes.push(format!("calico: {}", one_line(&p.decision.version.to_string())));
        if p.local_node_missing {
            notes.push(format!("not synced: this node {} is not in the datastore; deleting nothing until it is back", one_line(&format!("{node:?}"))));
        }
        if let Some(h) = &p.hold_all {
            notes.push(format!("deletions held: {}", one_line(h)));
        }
        for f in &p.frozen_classes {
            notes.push(format!("frozen class {}: {}", f.class.label(), one_line(&f.reason)));
        }
        if !p.frozen.is_empty() {
            notes.push(format!("frozen ground: {} prefixes (nothing deleted or claimed there)", p.frozen.len()));
        }
        if !self.settled {
            notes.push("deletions held: the inputs changed (or were listed again) less than the settle period ago; routes are added and changed, none deleted, until they are stable".to_owned());
        }
        let all: Vec<&String> = self.invalid_inputs.iter().chain(self.invalid_objects.iter()).collect();
        for line in all.iter().take(READYZ_NAMED) {
            notes.push(format!("invalid: {}", one_line(line)));
        }
        if all.len() > READYZ_NAMED {
            notes.push(format!("... and {} more (see the log and routewarden explain)", all.len() - READYZ_NAMED));
        }
        notes
    }
}
