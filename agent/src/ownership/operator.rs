//! tigera/operator's `Installation default`: the fields its `clusterRoutingMode` writes, checked
//! against the FelixConfiguration and BGPConfiguration the cluster has (`operator-mismatch`).

use super::findings::unreadable_finding;
use super::{ClusterRoutes, Finding, FindingKind, ResolvedVersion, Severity};
use crate::model::{Cluster, OptionalSource};

/// The fields tigera/operator writes for `clusterRoutingMode` (reference §1.9;
/// `pkg/controller/installation/core_controller.go` ~L1825–1930): `Felix` → `Enabled` /
/// `Disabled`, `FelixIPIPOnly` (tigera/operator#5150) → `EnabledIPIPOnly` /
/// `EnabledNoEncapOnly`, `BIRD` and any other value (the `switch`'s default branch) →
/// `Disabled` / `Enabled`. Unset: the operator writes neither field, nothing to check.
pub fn operator_fields(mode: &str) -> (ClusterRoutes, ClusterRoutes) {
    match mode {
        "Felix" => (ClusterRoutes::Enabled, ClusterRoutes::Disabled),
        "FelixIPIPOnly" => (ClusterRoutes::EnabledIpipOnly, ClusterRoutes::EnabledNoEncapOnly),
        _ => (ClusterRoutes::Disabled, ClusterRoutes::Enabled),
    }
}

/// Findings about the operator's `Installation default`: a `clusterRoutingMode` whose fields
/// (the `default` FelixConfiguration and, from 3.32, BGPConfiguration, compared exactly as the
/// operator writes them) say otherwise; a mode on a release without the fields.
pub(super) fn operator_findings(cluster: &Cluster, version: &ResolvedVersion, findings: &mut Vec<Finding>) {
    if let Some(reason) = cluster.unread.get(&OptionalSource::Installation) {
        findings.push(unreadable_finding(OptionalSource::Installation, reason, "the operator's clusterRoutingMode is not compared with the fields it writes"));
    }
    let Some(mode) = cluster.installation_default().and_then(|i| i.cluster_routing_mode.as_deref()) else { return };
    let (v, rules) = (version.version, version.rules);
    if !rules.felix_reads_field() {
        findings.push(Finding {
            kind: FindingKind::IgnoredByRelease { object: "Installation default clusterRoutingMode".to_owned(), value: mode.to_owned() },
            class: None,
            severity: Severity::Warning,
            message: format!("Installation default: clusterRoutingMode {mode:?} is set but ignored by this release: Calico {v} has no programClusterRoutes fields for the operator to write"),
        });
        return;
    }
    let (felix_want, bgp_want) = operator_fields(mode);
    let mut wrong = Vec::new();
    let felix_raw = cluster.felix_default().and_then(|f| f.program_cluster_routes.as_deref());
    if felix_raw != Some(felix_want.as_str()) {
        wrong.push(format!("FelixConfiguration default has {}", felix_raw.map_or_else(|| "none".to_owned(), |r| format!("{r:?}"))));
    }
    let bgp_raw = cluster.bgp_default().and_then(|b| b.program_cluster_routes.as_deref());
    if rules.confd_reads_field() && bgp_raw != Some(bgp_want.as_str()) {
        wrong.push(format!("BGPConfiguration default has {}", bgp_raw.map_or_else(|| "none".to_owned(), |r| format!("{r:?}"))));
    }
    if wrong.is_empty() {
        return;
    }
    let known = if matches!(mode, "BIRD" | "Felix" | "FelixIPIPOnly") {
        String::new()
    } else {
        " (not a mode the operator knows; its switch treats it as BIRD)".to_owned()
    };
    let bgp = if rules.confd_reads_field() { format!(" and BGPConfiguration default {bgp_want}") } else { String::new() };
    findings.push(Finding {
        kind: FindingKind::OperatorMismatch { mode: mode.to_owned() },
        class: None,
        severity: Severity::Warning,
        message: format!(
            "Installation default: clusterRoutingMode {mode}{known} means programClusterRoutes FelixConfiguration default {felix_want}{bgp}, but {}; the operator rewrites them on its next reconcile, or they were changed by hand",
            wrong.join(" and ")
        ),
    });
}
