//! Each component's effective `programClusterRoutes` and where it came from: Felix's from
//! the calico-node env, then `FelixConfiguration node.<name>`, then `default`
//! (`felix/config/config_params.go`); BIRD's from `BGPConfiguration default` as confd reads
//! it (`confd/pkg/backends/calico/client.go`).

use super::findings::{ignored_finding, skew_finding, unreadable_finding, unset_reason};
use super::{ClusterRoutes, ComponentDecision, DecisionSource, Finding, FindingKind, ResolvedVersion, Rules, Severity};
use crate::model::{CalicoNodeDaemonSet, Cluster, EnvSetting, EnvValue, OptionalSource};
use crate::vocabulary::Writer;

/// Felix's effective value (`felix/config/config_params.go`): the highest source that sets the
/// field wins, in Felix's order (`SourcesInDescendingOrder` ~L86): the calico-node container's
/// env `FELIX_PROGRAMCLUSTERROUTES` (`env_var_loader.go`, any case), then `FelixConfiguration
/// node.<name>`, then `default` (selector-scoped objects, a tech preview between the two, are
/// not evaluated); the parse ignores case
/// (`param_types.go` `OneofListParam.Parse`); an unknown value in the winning source is
/// replaced by the built-in default, not by a lower source ("Replacing invalid value with
/// default", ~L845). Built-in default and accepted values per release line: see
/// [`Rules`]. On 3.30 and earlier Felix has no such field and programs only VXLAN
/// routes: every value set is reported as [`FindingKind::IgnoredByRelease`].
pub(super) fn felix_value(cluster: &Cluster, node: Option<&str>, version: &ResolvedVersion, findings: &mut Vec<Finding>) -> ComponentDecision {
    let (v, rules) = (version.version, version.rules);
    let decision = |value, source| ComponentDecision { field_of: Writer::Felix, value, source };
    let node_obj = node.and_then(|n| cluster.felix_for_node(n));
    let datastore = [node_obj, cluster.felix_default()]
        .into_iter()
        .flatten()
        .find_map(|fc| fc.program_cluster_routes.as_deref().map(|raw| (format!("FelixConfiguration {}", fc.name), raw)));
    let env = felix_env(cluster, findings);
    if !rules.felix_reads_field() {
        if let Some(e) = &env {
            findings.push(ignored_finding(&e.object(), &e.value, v, "Felix", "Felix programs only VXLAN cluster routes"));
        }
        for fc in [node_obj, cluster.felix_default()].into_iter().flatten() {
            if let Some(raw) = fc.program_cluster_routes.as_deref() {
                findings.push(ignored_finding(&format!("FelixConfiguration {}", fc.name), raw, v, "Felix", "Felix programs only VXLAN cluster routes"));
            }
        }
        return decision(
            ClusterRoutes::Disabled,
            DecisionSource::Fixed { reason: format!("Calico {v} has no programClusterRoutes: Felix programs only VXLAN cluster routes") },
        );
    }
    let default = if rules == Rules::V3_33 { ClusterRoutes::EnabledIpipOnly } else { ClusterRoutes::Disabled };
    let (object, raw, from_env) = match (&env, &datastore) {
        (Some(e), _) => (e.object(), e.value.as_str(), true),
        (None, Some((object, raw))) => (object.clone(), *raw, false),
        (None, None) => {
            let reason = match (node_obj, cluster.felix_default(), node) {
                (None, None, Some(n)) => format!("no FelixConfiguration default or node.{n}"),
                (None, None, None) => "no FelixConfiguration default".to_owned(),
                _ => "programClusterRoutes unset in FelixConfiguration".to_owned(),
            };
            return decision(default, DecisionSource::Default { reason });
        }
    };
    let parsed = ClusterRoutes::parse_ignore_case(raw);
    match parsed {
        Some(value) if value.known_in(rules) => {
            let source = match &env {
                Some(e) if from_env => DecisionSource::Env {
                    daemonset: e.daemonset.clone(),
                    name: e.name.clone(),
                    value: e.value.clone(),
                    overrides: datastore.as_ref().map(|(o, r)| format!("{o}: {r}")),
                },
                _ if value.as_str() == raw => DecisionSource::Field { object, value: raw.to_owned() },
                _ => DecisionSource::FieldIgnoringCase { object, value: raw.to_owned() },
            };
            decision(value, source)
        }
        _ => {
            let reason = format!("is not a value Felix {v} accepts; Felix uses its default {default}");
            findings.push(skew_finding(&object, raw, v, rules, "Felix", parsed, &format!("Felix uses its default {default}")));
            decision(default, DecisionSource::Fallback { object, value: raw.to_owned(), reason })
        }
    }
}

/// `FELIX_PROGRAMCLUSTERROUTES` as the calico-node DaemonSet sets it.
struct EnvRead {
    /// `calico-system/calico-node`.
    daemonset: String,
    /// The variable's name as written.
    name: String,
    value: String,
}

impl EnvRead {
    /// `calico-node env (calico-system/calico-node) FELIX_PROGRAMCLUSTERROUTES`.
    fn object(&self) -> String {
        format!("calico-node env ({}) {}", self.daemonset, self.name)
    }
}

/// Felix's env value from the preferred calico-node DaemonSet (`calico-system`, then
/// `kube-system`): a literal, non-empty value [an empty one is taken as unset, inferred].
/// Findings: a value Felix has but routewarden cannot know (`valueFrom`, or `envFrom` sources
/// when the variable is not set directly) and DaemonSets that disagree.
fn felix_env(cluster: &Cluster, findings: &mut Vec<Finding>) -> Option<EnvRead> {
    for (source, reason) in &cluster.unread {
        if let OptionalSource::CalicoNodeEnv(_) = source {
            findings.push(unreadable_finding(
                *source,
                reason,
                "a FELIX_PROGRAMCLUSTERROUTES there outranks every FelixConfiguration, so the decision shown follows the datastore and may not be Felix's",
            ));
        }
    }
    let dss = cluster.calico_node_daemonsets_preferred();
    let settings: Vec<(String, Option<&EnvValue>)> = dss
        .iter()
        .filter(|d| d.container_found)
        .map(|d| (CalicoNodeDaemonSet::key(&d.namespace), d.program_cluster_routes.as_ref().map(|s| &s.value)))
        .collect();
    if settings.windows(2).any(|w| w[0].1 != w[1].1) {
        let daemonsets: Vec<String> = settings.iter().map(|(k, _)| k.clone()).collect();
        let shown: Vec<String> = settings
            .iter()
            .map(|(k, s)| match s {
                None => format!("{k} unset"),
                Some(EnvValue::Literal(v)) => format!("{k} {v:?}"),
                Some(EnvValue::Reference(r)) => format!("{k} from {r}"),
            })
            .collect();
        findings.push(Finding {
            kind: FindingKind::EnvDiffers { daemonsets: daemonsets.clone() },
            class: None,
            severity: Severity::Warning,
            message: format!(
                "the calico-node DaemonSets set FELIX_PROGRAMCLUSTERROUTES differently ({}); each node runs one of them, so Felix's value differs between nodes; deciding with {}'s",
                shown.join(", "),
                daemonsets[0]
            ),
        });
    }
    let ds = dss.into_iter().find(|d| d.container_found)?;
    let key = CalicoNodeDaemonSet::key(&ds.namespace);
    match &ds.program_cluster_routes {
        Some(EnvSetting { name, value: EnvValue::Literal(v) }) if !v.is_empty() => Some(EnvRead { daemonset: key, name: name.clone(), value: v.clone() }),
        Some(EnvSetting { name, value: EnvValue::Reference(r) }) => {
            findings.push(Finding {
                kind: FindingKind::EnvUnresolved { daemonset: key.clone(), detail: r.clone() },
                class: None,
                severity: Severity::Warning,
                message: format!(
                    "calico-node env ({key}): {name} comes from {r}, which routewarden does not read; Felix's value there outranks every FelixConfiguration and is unknown, so the decision shown follows the datastore"
                ),
            });
            None
        }
        None if !ds.env_from.is_empty() => {
            let from = ds.env_from.join(", ");
            findings.push(Finding {
                kind: FindingKind::EnvUnresolved { daemonset: key.clone(), detail: from.clone() },
                class: None,
                severity: Severity::Info,
                message: format!(
                    "calico-node env ({key}): envFrom {from} is not read; a FELIX_PROGRAMCLUSTERROUTES from there would outrank every FelixConfiguration"
                ),
            });
            None
        }
        _ => None,
    }
}

/// BIRD's effective value, as confd derives it from the BGPConfiguration named `default` only
/// (`confd/pkg/backends/calico/client.go` `getBGPConfig`):
/// - 3.33+: exact-case `switch`, absent or unknown means `EnabledNoEncapOnly`
///   (`bgp_processor.go` `clusterRoutePolicyFromBGPConfig` ~L1158).
/// - 3.32: BIRD programs unless the value is exactly `Disabled` (`bgp_processor.go` ~L911 at
///   v3.32.1).
/// - 3.31 and earlier: no field; the BIRD templates program every IPIP and no-encap pool
///   (`bird_ipam.cfg.template` at v3.31.7 and v3.30.7); a value set is reported as
///   [`FindingKind::IgnoredByRelease`].
pub(super) fn bird_value(cluster: &Cluster, version: &ResolvedVersion, findings: &mut Vec<Finding>) -> ComponentDecision {
    let (v, rules) = (version.version, version.rules);
    let object = "BGPConfiguration default".to_owned();
    let raw = cluster.bgp_default().and_then(|b| b.program_cluster_routes.as_deref());
    let decision = |value, source| ComponentDecision { field_of: Writer::Bird, value, source };
    match rules {
        Rules::Legacy | Rules::V3_31 => {
            if let Some(raw) = raw {
                findings.push(ignored_finding(&object, raw, v, "confd", "BIRD programs IPIP and no-encap routes regardless"));
            }
            decision(ClusterRoutes::Enabled, DecisionSource::Fixed { reason: format!("Calico {v} BIRD templates program every IPIP and no-encap pool") })
        }
        Rules::V3_32 => match raw {
            None => decision(ClusterRoutes::Enabled, DecisionSource::Default { reason: unset_reason(cluster) }),
            Some("Disabled") => decision(ClusterRoutes::Disabled, DecisionSource::Field { object, value: "Disabled".into() }),
            Some("Enabled") => decision(ClusterRoutes::Enabled, DecisionSource::Field { object, value: "Enabled".into() }),
            Some(raw) => {
                findings.push(skew_finding(
                    &object,
                    raw,
                    v,
                    rules,
                    "confd",
                    ClusterRoutes::parse_exact(raw),
                    &format!("confd {v} turns BIRD's kernel programming off only for the exact value Disabled, so BIRD programs everything"),
                ));
                decision(
                    ClusterRoutes::Enabled,
                    DecisionSource::Fallback {
                        object,
                        value: raw.to_owned(),
                        reason: format!("is not the exact value Disabled, which is all confd {v} checks for; BIRD programs everything"),
                    },
                )
            }
        },
        Rules::V3_33 => match raw {
            None => decision(ClusterRoutes::EnabledNoEncapOnly, DecisionSource::Default { reason: unset_reason(cluster) }),
            Some(raw) => {
                if let Some(value) = ClusterRoutes::parse_exact(raw) {
                    decision(value, DecisionSource::Field { object, value: raw.to_owned() })
                } else {
                    findings.push(skew_finding(
                        &object,
                        raw,
                        v,
                        rules,
                        "confd",
                        None,
                        "confd compares case-sensitively and uses its default EnabledNoEncapOnly",
                    ));
                    decision(
                        ClusterRoutes::EnabledNoEncapOnly,
                        DecisionSource::Fallback {
                            object,
                            value: raw.to_owned(),
                            reason: format!("is not a value confd {v} knows (exact case); confd uses its default EnabledNoEncapOnly"),
                        },
                    )
                }
            }
        },
    }
}
