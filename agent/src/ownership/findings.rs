//! Findings: what the engine says about a configuration, with stable codes and
//! severities, and the builders of each finding's text (version skew, ignored fields, classes
//! double-programmed or unowned, unreadable optional sources).

use std::collections::BTreeSet;
use std::fmt::Write as _;

use serde::Serialize;

use super::{CalicoVersion, ClusterRoutes, ComponentDecision, OwnershipConfig, ResolvedVersion, Role, Rules, VersionSource};
use crate::model::{Cluster, OptionalSource};
use crate::vocabulary::{PoolClass, Writer};

/// Severity of a finding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Severity {
    Info,
    Warning,
    Error,
}

/// What a finding says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "code", rename_all = "kebab-case")]
pub enum FindingKind {
    /// Exactly one writer for the class.
    Consistent { writer: Writer },
    /// Two or three writers for the class: they fight (reference §5.1).
    DoubleProgrammed { writers: Vec<Writer> },
    /// No writer for a class that has pools: no cluster routes (reference §5.3).
    Unowned,
    /// BIRD programs IPIP cluster routes: deprecated since Calico 3.33.
    Deprecated { bgp_value: String },
    /// A field holds a value the selected release line does not know.
    VersionSkew { object: String, value: String },
    /// A value is set where this release reads none (`programClusterRoutes` on 3.30 and
    /// earlier, `BGPConfiguration` on 3.31): reported, not applied.
    IgnoredByRelease { object: String, value: String },
    /// `--calico-version auto` found no usable `ClusterInformation default`: 3.33 assumed.
    VersionAssumed { reason: String },
    /// The release is newer than the newest line routewarden knows (3.33): decided as 3.33.
    VersionNewer { version: String },
    /// The release is older than the oldest supported line (3.26): decided as 3.26–3.30.
    VersionOlder { version: String },
    /// Felix's env value cannot be known: `valueFrom` a ConfigMap/Secret/field, or `envFrom`
    /// sources that may set it.
    EnvUnresolved { daemonset: String, detail: String },
    /// Two calico-node DaemonSets set different `FELIX_PROGRAMCLUSTERROUTES`.
    EnvDiffers { daemonsets: Vec<String> },
    /// The operator's `clusterRoutingMode` and the fields it should have written disagree.
    OperatorMismatch { mode: String },
    /// An optional source (calico-node env, the operator's Installation) exists but could not
    /// be read (`forbidden (403)`): what it says is unknown; the decision follows the rest.
    SourceUnreadable { source: String, reason: String },
    /// An optional source that was read is gone with its API group (`operator.tigera.io/v1`
    /// no longer served: the operator uninstalled): what it said is dropped, and nothing else
    /// changes (the Installation only ever yields findings).
    SourceWithdrawn { source: String, api_version: String },
    /// `--calico-api-group auto` would now choose another Calico group than the one read at
    /// start: routewarden keeps reading that one until a restart.
    ApiGroupChanged { read: String, discovered: String },
}

/// One finding. `code()` and `class_label()` are stable metric label values.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    #[serde(flatten)]
    pub kind: FindingKind,
    /// The class concerned; `None` for findings about configuration sources and versions.
    pub class: Option<PoolClass>,
    pub severity: Severity,
    /// A sentence for people.
    pub message: String,
}

impl Finding {
    /// `consistent`, `double-programmed`, `unowned`, `deprecated`, `version-skew`,
    /// `ignored-by-release`, `version-assumed`, `version-newer`, `version-older`,
    /// `env-unresolved`, `env-differs`, `operator-mismatch`, `source-unreadable`,
    /// `source-withdrawn` or `api-group-changed`.
    pub fn code(&self) -> &'static str {
        match self.kind {
            FindingKind::Consistent { .. } => "consistent",
            FindingKind::DoubleProgrammed { .. } => "double-programmed",
            FindingKind::Unowned => "unowned",
            FindingKind::Deprecated { .. } => "deprecated",
            FindingKind::VersionSkew { .. } => "version-skew",
            FindingKind::IgnoredByRelease { .. } => "ignored-by-release",
            FindingKind::VersionAssumed { .. } => "version-assumed",
            FindingKind::VersionNewer { .. } => "version-newer",
            FindingKind::VersionOlder { .. } => "version-older",
            FindingKind::EnvUnresolved { .. } => "env-unresolved",
            FindingKind::EnvDiffers { .. } => "env-differs",
            FindingKind::OperatorMismatch { .. } => "operator-mismatch",
            FindingKind::SourceUnreadable { .. } => "source-unreadable",
            FindingKind::SourceWithdrawn { .. } => "source-withdrawn",
            FindingKind::ApiGroupChanged { .. } => "api-group-changed",
        }
    }

    /// The class label (`ipip`, `noencap`, `vxlan`), or `none`.
    pub fn class_label(&self) -> &'static str {
        self.class.map_or("none", PoolClass::label)
    }

    /// Double-programmed and unowned are errors.
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// `could not read calico-node env (calico-system/calico-node): forbidden (403); <consequence>`:
/// a warning, not an error (the decision is still made from what was read).
pub(super) fn unreadable_finding(source: OptionalSource, reason: &str, consequence: &str) -> Finding {
    let label = source.label();
    Finding {
        kind: FindingKind::SourceUnreadable { source: label.clone(), reason: reason.to_owned() },
        class: None,
        severity: Severity::Warning,
        message: format!("could not read {label}: {reason}; {consequence}"),
    }
}

/// What API discovery found changed while the datastore ran ([`ApiChanges`](crate::model::ApiChanges)),
/// as warnings: each optional source withdrawn with its API group (`source-withdrawn`), and a
/// Calico group that `auto` would now choose instead of the one read (`api-group-changed`).
pub(super) fn api_change_findings(cluster: &Cluster, findings: &mut Vec<Finding>) {
    for (source, api_version) in &cluster.api_changes.withdrawn {
        let label = source.label();
        let consequence = match source {
            OptionalSource::Installation => "the operator's clusterRoutingMode is no longer compared with the fields it writes",
            OptionalSource::CalicoNodeEnv(_) => "a FELIX_PROGRAMCLUSTERROUTES there is no longer known",
        };
        findings.push(Finding {
            kind: FindingKind::SourceWithdrawn { source: label.clone(), api_version: (*api_version).to_owned() },
            class: None,
            severity: Severity::Warning,
            message: format!("{api_version} is no longer served: {label}, read until then, is dropped; {consequence}"),
        });
    }
    if let Some(change) = cluster.api_changes.calico_group {
        let (read, discovered) = (change.read, change.discovered);
        findings.push(Finding {
            kind: FindingKind::ApiGroupChanged { read: read.to_owned(), discovered: discovered.to_owned() },
            class: None,
            severity: Severity::Warning,
            message: format!(
                "API discovery now chooses {discovered} for the Calico objects, but routewarden reads {read}, chosen at start; restart routewarden to read {discovered}"
            ),
        });
    }
}

/// The version's own findings: assumed (warning), newer than the newest known line (info),
/// older than the oldest supported (warning).
pub(super) fn version_findings(version: &ResolvedVersion, findings: &mut Vec<Finding>) {
    let v = version.version;
    if let VersionSource::Assumed { reason } = &version.source {
        findings.push(Finding {
            kind: FindingKind::VersionAssumed { reason: reason.clone() },
            class: None,
            severity: Severity::Warning,
            message: format!("Calico release not detected ({reason}): assuming {v}; set --calico-version if the cluster runs another line"),
        });
    } else if v > CalicoVersion::NEWEST_KNOWN {
        findings.push(Finding {
            kind: FindingKind::VersionNewer { version: v.to_string() },
            class: None,
            severity: Severity::Info,
            message: format!("Calico {v} is newer than the newest line routewarden knows ({}); deciding by its rules", CalicoVersion::NEWEST_KNOWN),
        });
    } else if v < CalicoVersion::OLDEST {
        findings.push(Finding {
            kind: FindingKind::VersionOlder { version: v.to_string() },
            class: None,
            severity: Severity::Warning,
            message: format!(
                "Calico {v} is older than the oldest line routewarden supports ({}); deciding by the 3.26-3.30 rules (no programClusterRoutes fields)",
                CalicoVersion::OLDEST
            ),
        });
    }
}

pub(super) fn ignored_finding(object: &str, raw: &str, version: CalicoVersion, reader: &str, consequence: &str) -> Finding {
    Finding {
        kind: FindingKind::IgnoredByRelease { object: object.to_owned(), value: raw.to_owned() },
        class: None,
        severity: Severity::Warning,
        message: format!("{object}: {raw:?} is set but ignored by this release: {reader} {version} does not read it, and {consequence}"),
    }
}

pub(super) fn unset_reason(cluster: &Cluster) -> String {
    if cluster.bgp_default().is_some() {
        "programClusterRoutes unset in BGPConfiguration default".into()
    } else {
        "no BGPConfiguration default".into()
    }
}

/// A version-skew finding for `raw` in `object`'s field, read by `reader` on `version` (whose
/// rules are `rules`).
pub(super) fn skew_finding(
    object: &str,
    raw: &str,
    version: CalicoVersion,
    rules: Rules,
    reader: &str,
    parsed: Option<ClusterRoutes>,
    consequence: &str,
) -> Finding {
    let why = match ClusterRoutes::parse_ignore_case(raw) {
        Some(v) if v.as_str() != raw && reader == "confd" => {
            format!("is {v} in the wrong case, which {reader} {version} does not accept")
        }
        Some(v) if !v.known_in(rules) || parsed.is_some_and(|p| !p.known_in(rules)) => {
            format!("is a Calico 3.33+ value that {reader} {version} does not know")
        }
        Some(_) => format!("is not read by {reader} {version}"),
        None => format!("is not a programClusterRoutes value of any Calico release ({reader} {version})"),
    };
    Finding {
        kind: FindingKind::VersionSkew { object: object.to_owned(), value: raw.to_owned() },
        class: None,
        severity: Severity::Warning,
        message: format!("{object}: programClusterRoutes {raw:?} {why}; {consequence}"),
    }
}

/// Most pool names a finding's message lists; the rest are counted. A cluster of 10,000
/// pools made one 80 KB log line per finding; `explain` lists every pool in
/// its table.
const LISTED_POOLS: usize = 10;

/// `a, b, c` for at most [`LISTED_POOLS`] names, then `and N more`.
fn pool_list(pools: &[&str]) -> String {
    let mut out = pools.iter().take(LISTED_POOLS).copied().collect::<Vec<_>>().join(", ");
    if pools.len() > LISTED_POOLS {
        let _ = write!(out, " and {} more", pools.len() - LISTED_POOLS);
    }
    out
}

pub(super) fn class_finding(
    class: PoolClass,
    writers: &BTreeSet<Writer>,
    pools: &[&str],
    config: &OwnershipConfig,
    felix: &ComponentDecision,
    bird: &ComponentDecision,
    explicit: Option<&ComponentDecision>,
) -> Finding {
    let class_name = class_display(class);
    let pools = pool_list(pools);
    let mut basis = format!("Felix field {} ({}), BIRD field {} ({})", felix.value, felix.source.kind(), bird.value, bird.source.kind());
    if let Some(e) = explicit {
        let _ = write!(basis, ", routewarden {}", e.value);
    }
    let felix_side = match config.role {
        Role::Felix => " (routewarden in Felix's place)",
        _ => "",
    };
    match writers.len() {
        0 => Finding {
            kind: FindingKind::Unowned,
            class: Some(class),
            severity: Severity::Error,
            message: format!(
                "no component programs the {class_name} cluster routes of pools {pools}: {basis}{felix_side}; cross-node traffic to these pools fails"
            ),
        },
        1 => {
            let writer = writers.iter().next().copied().unwrap_or(Writer::Felix);
            Finding {
                kind: FindingKind::Consistent { writer },
                class: Some(class),
                severity: Severity::Info,
                message: format!("{} alone programs the {class_name} cluster routes of pools {pools}", writer.label()),
            }
        }
        _ => {
            let ws: Vec<Writer> = writers.iter().copied().collect();
            let names: Vec<&str> = ws.iter().map(|w| w.label()).collect();
            Finding {
                kind: FindingKind::DoubleProgrammed { writers: ws.clone() },
                class: Some(class),
                severity: Severity::Error,
                message: format!(
                    "{} all program the {class_name} cluster routes of pools {pools} and fight over them: {basis}{felix_side}",
                    names.join(" and ")
                ),
            }
        }
    }
}

pub(super) fn deprecated_finding(bird: &ComponentDecision) -> Finding {
    Finding {
        kind: FindingKind::Deprecated { bgp_value: bird.value.as_str().to_owned() },
        class: Some(PoolClass::Ipip),
        severity: Severity::Warning,
        message: format!(
            "BIRD programs the IPIP cluster routes (BGPConfiguration default programClusterRoutes {}, {}). Calico 3.33 deprecates \
             handing IPIP routes to BIRD and drops it in 3.35. Move them to Felix: set FelixConfiguration programClusterRoutes \
             to EnabledIPIPOnly (or Enabled) and BGPConfiguration programClusterRoutes to EnabledNoEncapOnly (or Disabled).",
            bird.value,
            bird.source.kind()
        ),
    }
}

pub(super) fn class_display(class: PoolClass) -> &'static str {
    match class {
        PoolClass::Ipip => "IPIP",
        PoolClass::NoEncap => "no-encap",
        PoolClass::Vxlan => "VXLAN",
    }
}
