//! The status document, version 1: what one agent tells about itself at
//! [`STATUS_PATH`](super::STATUS_PATH), read by `routewarden status` for the whole cluster.
//!
//! Plain data with `Serialize` and `Deserialize`, field names in camelCase as Kubernetes
//! objects spell theirs. A field is only ever added to version 1 (readers ignore unknown
//! fields); removing or changing one makes version 2, served at its own path next to this one.
//! Every list is bounded ([`limits`](super::limits)), so the document's size does not grow with
//! the cluster: at most a few tens of KiB.

use serde::{Deserialize, Serialize};

/// `apiVersion` of the document.
pub const API_VERSION: &str = "routewarden.io/v1";
/// `kind` of the document.
pub const KIND: &str = "AgentStatus";

/// One agent's status.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusDocument {
    /// [`API_VERSION`].
    pub api_version: String,
    /// [`KIND`].
    pub kind: String,
    /// The node the agent runs for (`--node`).
    pub node: String,
    /// The agent's version (`routewarden --version`).
    pub agent_version: String,
    /// When the document was made, seconds since the Unix epoch (the agent's clock).
    pub generated_at: u64,
    /// `program` or `audit` (`--mode`).
    pub mode: String,
    /// `felix`, `bird`, `explicit:<value>` or `audit` (`--role`).
    pub role: String,
    /// What `/readyz` answers: ready, and its lines (datastore, first apply, held inputs,
    /// devices waited for, BPF watches).
    pub readiness: Readiness,
    /// The Calico release line in force and where it came from; `None` before the first plan.
    pub calico: Option<CalicoLine>,
    /// Each component's effective `programClusterRoutes` and its source; `None` before the
    /// first plan.
    pub decision: Option<Decision>,
    /// One row per pool class (`ipip`, `noencap`, `vxlan`) that has IP pools, in that order.
    pub classes: Vec<ClassStatus>,
    /// Cluster routes of the classes routewarden programs, after the last apply; `None` in
    /// audit mode and before the first apply.
    pub routes: Option<RouteCounts>,
    /// The ownership findings that are not `consistent` (double-programmed, unowned, version,
    /// sources), at most [`MAX_FINDINGS`](super::limits::MAX_FINDINGS).
    pub findings: Vec<OwnershipFinding>,
    /// Ownership findings left out by the bound.
    pub findings_omitted: usize,
    /// The last audit of the kernel (`--mode audit`); `None` in program mode and before the
    /// first audit.
    pub audit: Option<AuditStatus>,
    /// Route-watch episodes (conflicts and flaps) seen in the last
    /// [`EPISODE_WINDOW`](super::limits::EPISODE_WINDOW), newest last seen first, at most
    /// [`MAX_EPISODES`](super::limits::MAX_EPISODES).
    pub episodes: Vec<Episode>,
    /// Episodes left out by the bound: those of the window past the newest `MAX_EPISODES`, plus
    /// those dropped from the agent's memory since it started (it holds twice as many).
    pub episodes_omitted: usize,
}

/// The readiness of the agent, as `/readyz` says it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Readiness {
    /// `/readyz` answers 200.
    pub ready: bool,
    /// `/readyz`'s body, a line each.
    pub reasons: Vec<String>,
}

/// The Calico release line in force.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CalicoLine {
    /// The release line, `3.30`.
    pub line: String,
    /// Whose rules decide when the line is newer than the newest known (`3.33` for `3.34`).
    pub rules: String,
    /// `flag`, `cluster-information` or `assumed`.
    pub source: String,
    /// The source in words (`ClusterInformation default: v3.30.2`).
    pub detail: String,
}

/// Each component's effective `programClusterRoutes`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    /// Felix's value and source.
    pub felix: ComponentValue,
    /// BIRD's value and source (confd's reading of BGPConfiguration `default`).
    pub bird: ComponentValue,
    /// routewarden's own value in the `explicit` role.
    pub explicit: Option<ComponentValue>,
}

/// One component's value and where it came from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ComponentValue {
    /// `Disabled`, `EnabledIPIPOnly`, `EnabledNoEncapOnly` or `Enabled`.
    pub value: String,
    /// `field`, `default`, `fallback`, `role`, `fixed` or `env`.
    pub source: String,
    /// The source in words (`FelixConfiguration default: programClusterRoutes: Enabled`).
    pub detail: String,
}

/// One pool class.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClassStatus {
    /// `ipip`, `noencap` or `vxlan` (the metric label values).
    pub class: String,
    /// Who programs the class's cluster routes: `felix`, `bird`, `routewarden` (sorted).
    pub writers: Vec<String>,
    /// routewarden programs the class on this node.
    pub programmed_here: bool,
    /// `consistent` (one writer), `double-programmed` or `unowned`.
    pub state: String,
}

/// Cluster routes of the programmed classes, summed over classes and families.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteCounts {
    /// Routes routewarden wants.
    pub desired: usize,
    /// Desired routes in the kernel as desired.
    pub programmed: usize,
    /// Desired routes whose key holds another writer's route routewarden may not overwrite.
    pub held: usize,
    /// Deletions the mass-deletion breaker holds.
    pub deletions_held: usize,
}

/// One ownership finding.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnershipFinding {
    /// `double-programmed`, `unowned`, `version-skew`, … (`Finding::code`).
    pub code: String,
    /// `info`, `warning` or `error`.
    pub severity: String,
    /// The class concerned, if any.
    pub class: Option<String>,
    /// A sentence for people.
    pub message: String,
}

/// The last audit.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditStatus {
    /// When it ran, seconds since the Unix epoch.
    pub at: u64,
    /// Routes expected in the audited table.
    pub expected: usize,
    /// Findings, at most [`MAX_AUDIT_FINDINGS`](super::limits::MAX_AUDIT_FINDINGS).
    pub findings: Vec<AuditFindingStatus>,
    /// Findings left out by the bound.
    pub findings_omitted: usize,
}

/// One audit finding.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditFindingStatus {
    /// `missing`, `stale`, `duplicate`, `wrong-path`, `foreign-writer`, …
    pub code: String,
    /// The prefix.
    pub prefix: String,
    /// Who should program it, if anybody.
    pub owner: Option<String>,
    /// One line for people.
    pub detail: String,
}

/// A run of conflicts or flaps on one prefix.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Episode {
    /// `conflict` (two writers overwrote or deleted each other's route) or `flap`.
    pub kind: String,
    /// The prefix.
    pub prefix: String,
    /// The routing table.
    pub table: u32,
    /// The writers seen, in the order first seen, at most
    /// [`MAX_EPISODE_WRITERS`](super::limits::MAX_EPISODE_WRITERS).
    pub writers: Vec<EpisodeWriter>,
    /// First and last event of the episode, seconds since the Unix epoch.
    pub first_seen: u64,
    /// See `first_seen`.
    pub last_seen: u64,
    /// Conflict or flap events of the episode.
    pub count: u64,
}

/// A writer in an episode.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EpisodeWriter {
    /// Writer class: `self`, `felix`, `bird`, `kernel`, `boot`, `static` or `other`.
    pub class: String,
    /// Route protocol of its route.
    pub protocol: u8,
    /// Process id, when known.
    pub pid: Option<u32>,
    /// Process name, when known.
    pub comm: Option<String>,
}

impl EpisodeWriter {
    /// `felix`, `calico-node[4242]`, `bird(proto 12)`: the process when known, else the class.
    pub fn label(&self) -> String {
        match (&self.comm, self.pid) {
            (Some(c), Some(p)) => format!("{c}[{p}]"),
            (None, Some(p)) => format!("{}[{p}]", self.class),
            _ => format!("{}(proto {})", self.class, self.protocol),
        }
    }
}
