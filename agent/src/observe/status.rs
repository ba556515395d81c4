//! The agent's status document ([`StatusDocument`], version 1), served read-only at
//! [`STATUS_PATH`] next to `/metrics` by the same server, under the same limits.
//!
//! [`StatusBoard`] is the state behind it: the app sets the plan's ownership decision
//! ([`StatusBoard::set_decision`]), each apply's route counts ([`StatusBoard::set_routes`]),
//! each audit ([`StatusBoard::set_audit`]) and each route-watch conflict or flap
//! ([`StatusBoard::record_route_watch`]), and the HTTP handler renders the document from it and
//! from [`Health`]. No object bodies and no secrets: names, values, counts and prefixes only,
//! every list bounded ([`limits`]).

mod document;
mod episodes;

use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

pub use document::*;
pub use episodes::Episodes;

use super::Health;
use crate::bpf::route_watch::event::RouteWatchEvent;
use crate::dataplane::{ApplyReport, AuditReport};
use crate::ownership::{ComponentDecision, OwnershipDecision, Severity};
use crate::vocabulary::PoolClass;

/// The path of version 1 of the document.
pub const STATUS_PATH: &str = "/status/v1";

/// The bounds of the document.
pub mod limits {
    use std::time::Duration;

    /// Episodes kept (the most recently seen).
    pub const MAX_EPISODES: usize = 32;
    /// Writers kept per episode.
    pub const MAX_EPISODE_WRITERS: usize = 4;
    /// An episode is shown until this long after its last event.
    pub const EPISODE_WINDOW: Duration = Duration::from_hours(1);
    /// Ownership findings kept.
    pub const MAX_FINDINGS: usize = 32;
    /// Audit findings kept.
    pub const MAX_AUDIT_FINDINGS: usize = 32;
    /// `/readyz` lines kept.
    pub const MAX_READINESS_LINES: usize = 32;
}

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// What the document says that is not in [`Health`], set by the app as things happen.
#[derive(Debug)]
pub struct StatusBoard {
    node: String,
    mode: String,
    role: String,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    calico: Option<CalicoLine>,
    decision: Option<Decision>,
    classes: Vec<ClassStatus>,
    findings: Vec<OwnershipFinding>,
    findings_omitted: usize,
    routes: Option<RouteCounts>,
    audit: Option<AuditStatus>,
    episodes: Episodes,
}

fn severity_label(s: Severity) -> &'static str {
    match s {
        Severity::Info => "info",
        Severity::Warning => "warning",
        Severity::Error => "error",
    }
}

fn component(c: &ComponentDecision) -> ComponentValue {
    ComponentValue { value: c.value.as_str().to_owned(), source: c.source.kind().to_owned(), detail: c.source.to_string() }
}

impl StatusBoard {
    /// A board for `node`, in `mode` (`program`, `audit`) and `role` (`felix`, …).
    pub fn new(node: &str, mode: &str, role: &str) -> StatusBoard {
        StatusBoard { node: node.to_owned(), mode: mode.to_owned(), role: role.to_owned(), inner: Mutex::new(Inner::default()) }
    }

    /// Take the ownership decision of a new plan: release line, component values, classes,
    /// findings.
    pub fn set_decision(&self, d: &OwnershipDecision) {
        let calico = CalicoLine {
            line: d.version.version.to_string(),
            rules: d.version.rules.label().to_owned(),
            source: d.version.source.label().to_owned(),
            detail: d.version.source.to_string(),
        };
        let decision = Decision { felix: component(&d.felix), bird: component(&d.bird), explicit: d.explicit.as_ref().map(component) };
        let classes = [PoolClass::Ipip, PoolClass::NoEncap, PoolClass::Vxlan]
            .into_iter()
            .filter(|class| d.pools.iter().any(|p| p.class == Some(*class)))
            .map(|class| {
                let writers: Vec<String> = d.writers_of(class).into_iter().map(|w| w.label().to_owned()).collect();
                let state = match writers.len() {
                    0 => "unowned",
                    1 => "consistent",
                    _ => "double-programmed",
                };
                ClassStatus { class: class.label().to_owned(), writers, programmed_here: d.programs(class), state: state.to_owned() }
            })
            .collect();
        let mut findings: Vec<OwnershipFinding> = d
            .findings
            .iter()
            .filter(|f| f.code() != "consistent")
            .map(|f| OwnershipFinding {
                code: f.code().to_owned(),
                severity: severity_label(f.severity).to_owned(),
                class: f.class.map(|c| c.label().to_owned()),
                message: f.message.clone(),
            })
            .collect();
        let omitted = findings.len().saturating_sub(limits::MAX_FINDINGS);
        findings.truncate(limits::MAX_FINDINGS);
        if let Ok(mut i) = self.inner.lock() {
            i.calico = Some(calico);
            i.decision = Some(decision);
            i.classes = classes;
            i.findings = findings;
            i.findings_omitted = omitted;
        }
    }

    /// Take the route counts of an apply (summed over classes, families and paths).
    pub fn set_routes(&self, report: &ApplyReport) {
        let mut counts = RouteCounts { deletions_held: report.deletes_held_mass, ..RouteCounts::default() };
        for c in report.by_class.values() {
            counts.desired += c.desired;
            counts.programmed += c.programmed;
            counts.held += c.held;
        }
        if let Ok(mut i) = self.inner.lock() {
            i.routes = Some(counts);
        }
    }

    /// Take an audit's result, run at `now` (Unix seconds).
    pub fn set_audit(&self, report: &AuditReport, now: u64) {
        let mut findings: Vec<AuditFindingStatus> = report
            .findings
            .iter()
            .map(|f| AuditFindingStatus {
                code: f.code.as_str().to_owned(),
                prefix: f.prefix.to_string(),
                owner: f.owner.map(|w| w.label().to_owned()),
                detail: f.detail.clone(),
            })
            .collect();
        let omitted = findings.len().saturating_sub(limits::MAX_AUDIT_FINDINGS);
        findings.truncate(limits::MAX_AUDIT_FINDINGS);
        if let Ok(mut i) = self.inner.lock() {
            i.audit = Some(AuditStatus { at: now, expected: report.expected, findings, findings_omitted: omitted });
        }
    }

    /// Count a route-watch event seen at `now` (Unix seconds) into its episode: conflicts and
    /// flaps only; other events are ignored.
    pub fn record_route_watch(&self, event: &RouteWatchEvent, now: u64) {
        if let Ok(mut i) = self.inner.lock() {
            i.episodes.record(event, now);
        }
    }

    /// The document at `now` (Unix seconds), with `/readyz`'s answer from `health`.
    pub fn document(&self, health: &Health, now: u64) -> StatusDocument {
        let (ready, body) = health.ready();
        let mut reasons: Vec<String> = body.lines().map(str::to_owned).collect();
        reasons.truncate(limits::MAX_READINESS_LINES);
        let mut doc = StatusDocument {
            api_version: API_VERSION.to_owned(),
            kind: KIND.to_owned(),
            node: self.node.clone(),
            agent_version: env!("CARGO_PKG_VERSION").to_owned(),
            generated_at: now,
            mode: self.mode.clone(),
            role: self.role.clone(),
            readiness: Readiness { ready, reasons },
            ..StatusDocument::default()
        };
        if let Ok(mut i) = self.inner.lock() {
            doc.calico.clone_from(&i.calico);
            doc.decision.clone_from(&i.decision);
            doc.classes.clone_from(&i.classes);
            doc.findings.clone_from(&i.findings);
            doc.findings_omitted = i.findings_omitted;
            doc.routes = i.routes;
            doc.audit.clone_from(&i.audit);
            (doc.episodes, doc.episodes_omitted) = i.episodes.current(now);
        }
        doc
    }
}

#[cfg(test)]
mod tests;
