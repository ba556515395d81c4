//! The ownership engine: which component programs the cluster routes of each IP pool class,
//! mirroring Calico's own decision exactly (reference `calico-cluster-routes.md` §1), and
//! whether the configuration is consistent.
//!
//! Inputs: Felix's classes (the calico-node container's env `FELIX_PROGRAMCLUSTERROUTES`
//! first, then `FelixConfiguration.spec.programClusterRoutes` of `node.<name>`, then
//! `default`), `BGPConfiguration.spec.programClusterRoutes` of the object named `default`
//! (BIRD's classes), the IP pools, the Calico release line (`--calico-version`, or
//! `ClusterInformation default` with `auto`: [`resolve_version`]), the operator's
//! `Installation default` (checked against the fields it writes) and routewarden's own
//! [`Role`]. Output: an [`OwnershipDecision`] with the classes routewarden
//! programs, every writer of every class, findings with stable codes, and a per-pool table.
//! Every decision records its [`DecisionSource`] (field value, default or fallback) for
//! `routewarden explain`. Pure: no I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fmt::Write as _;
use std::str::FromStr;

use ipnet::IpNet;
use serde::Serialize;

use crate::model::{CalicoNodeDaemonSet, Cluster, EnvSetting, EnvValue, OptionalSource};
use crate::vocabulary::{PoolClass, PoolKind, Writer};

#[cfg(test)]
mod tests;
mod version;

pub use version::{resolve_version, CalicoVersion, ResolvedVersion, Rules, VersionChoice, VersionSource};

/// Errors of this module: CLI values that do not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OwnershipError {
    #[error("invalid --role {value:?}: expected felix, bird, audit or explicit:<Disabled|EnabledIPIPOnly|EnabledNoEncapOnly|Enabled>")]
    InvalidRole { value: String },
    #[error("invalid --calico-version {value:?}: expected auto or a release line 3.26 or later (3.26 to 3.30 have no programClusterRoutes fields; 3.34 and later behave as 3.33)")]
    InvalidVersion { value: String },
}

/// A value of `programClusterRoutes`: the classes *this* component programs
/// (`api/pkg/apis/projectcalico/v3/felixconfig.go` ~L628, `bgpconfig.go` ~L155). VXLAN is never
/// covered: Felix always programs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum ClusterRoutes {
    Disabled,
    #[serde(rename = "EnabledIPIPOnly")]
    EnabledIpipOnly,
    EnabledNoEncapOnly,
    Enabled,
}

impl ClusterRoutes {
    /// The four values, in the enum's order.
    pub const ALL: [ClusterRoutes; 4] = [ClusterRoutes::Disabled, ClusterRoutes::EnabledIpipOnly, ClusterRoutes::EnabledNoEncapOnly, ClusterRoutes::Enabled];

    /// Canonical spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ClusterRoutes::Disabled => "Disabled",
            ClusterRoutes::EnabledIpipOnly => "EnabledIPIPOnly",
            ClusterRoutes::EnabledNoEncapOnly => "EnabledNoEncapOnly",
            ClusterRoutes::Enabled => "Enabled",
        }
    }

    /// Exact-case parse (confd's `switch`, `bgp_processor.go` `clusterRoutePolicyFromBGPConfig`).
    pub fn parse_exact(s: &str) -> Option<ClusterRoutes> {
        ClusterRoutes::ALL.into_iter().find(|v| v.as_str() == s)
    }

    /// Case-insensitive parse (Felix's `OneofListParam.Parse`, `felix/config/param_types.go`
    /// L707).
    pub fn parse_ignore_case(s: &str) -> Option<ClusterRoutes> {
        ClusterRoutes::ALL.into_iter().find(|v| v.as_str().eq_ignore_ascii_case(s))
    }

    /// Whether the value covers `class` (`ProgramIPIPClusterRoutes()` /
    /// `ProgramNoEncapClusterRoutes()`, `felix/config/config_params.go` ~L608; confd
    /// `programsPool`). Always false for VXLAN.
    pub fn covers(self, class: PoolClass) -> bool {
        match class {
            PoolClass::Ipip => matches!(self, ClusterRoutes::Enabled | ClusterRoutes::EnabledIpipOnly),
            PoolClass::NoEncap => matches!(self, ClusterRoutes::Enabled | ClusterRoutes::EnabledNoEncapOnly),
            PoolClass::Vxlan => false,
        }
    }

    /// Values a release line's rules know (3.31 and 3.32: only `Enabled` and `Disabled`;
    /// 3.30 and earlier: none).
    pub fn known_in(self, rules: Rules) -> bool {
        match rules {
            Rules::Legacy => false,
            Rules::V3_31 | Rules::V3_32 => matches!(self, ClusterRoutes::Enabled | ClusterRoutes::Disabled),
            Rules::V3_33 => true,
        }
    }
}

impl fmt::Display for ClusterRoutes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// routewarden's own place in Calico's contract (`--role`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(tag = "role", content = "value", rename_all = "kebab-case")]
pub enum Role {
    /// routewarden is the Felix side: it programs the classes `FelixConfiguration` assigns to
    /// Felix; Felix itself is assumed absent or not programming cluster routes (VXLAN stays
    /// Felix's).
    #[default]
    Felix,
    /// routewarden is BIRD's kernel programmer: it programs the classes the `default`
    /// `BGPConfiguration` assigns to BIRD (BIRD runs without kernel export).
    Bird,
    /// routewarden is a third writer with its own value; Felix and BIRD keep their fields.
    Explicit(ClusterRoutes),
    /// routewarden programs nothing and judges Felix against BIRD.
    Audit,
}

impl FromStr for Role {
    type Err = OwnershipError;

    /// `felix`, `bird`, `audit`, `explicit:<value>` (value case-insensitive).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || OwnershipError::InvalidRole { value: s.to_owned() };
        match s {
            "felix" => Ok(Role::Felix),
            "bird" => Ok(Role::Bird),
            "audit" => Ok(Role::Audit),
            _ => {
                let v = s.strip_prefix("explicit:").ok_or_else(err)?;
                ClusterRoutes::parse_ignore_case(v).map(Role::Explicit).ok_or_else(err)
            }
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Role::Felix => f.write_str("felix"),
            Role::Bird => f.write_str("bird"),
            Role::Audit => f.write_str("audit"),
            Role::Explicit(v) => write!(f, "explicit:{v}"),
        }
    }
}

/// What the engine needs besides the cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct OwnershipConfig {
    pub role: Role,
    /// `--calico-version`: a release line, or `auto` (the default: `ClusterInformation
    /// default`, else 3.33 with a warning).
    pub version: VersionChoice,
    /// The node whose Felix view is decided (`FelixConfiguration node.<node>` overrides
    /// `default` field by field). `None`: only `default`.
    pub node: Option<String>,
}

/// Where a component's effective value came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "source", rename_all = "kebab-case")]
pub enum DecisionSource {
    /// A field value, written in the canonical spelling.
    Field { object: String, value: String },
    /// A field value Felix accepted in another case (`enabled`): Felix ignores case, confd
    /// would not.
    FieldIgnoringCase { object: String, value: String },
    /// The built-in default: no object, or the field unset.
    Default { reason: String },
    /// The field holds a value the component does not accept here; it uses its fallback.
    Fallback { object: String, value: String, reason: String },
    /// `--role explicit:<value>`.
    Role { value: String },
    /// Not configurable on this release line.
    Fixed { reason: String },
    /// `FELIX_PROGRAMCLUSTERROUTES` in the calico-node container's env, which outranks every
    /// datastore object in Felix's config loader (`felix/config/config_params.go`
    /// `SourcesInDescendingOrder`); `overrides` names the datastore value it beats, if any.
    Env { daemonset: String, name: String, value: String, overrides: Option<String> },
}

impl DecisionSource {
    /// `field`, `default`, `fallback`, `role`, `fixed` or `env`.
    pub fn kind(&self) -> &'static str {
        match self {
            DecisionSource::Field { .. } | DecisionSource::FieldIgnoringCase { .. } => "field",
            DecisionSource::Default { .. } => "default",
            DecisionSource::Fallback { .. } => "fallback",
            DecisionSource::Role { .. } => "role",
            DecisionSource::Fixed { .. } => "fixed",
            DecisionSource::Env { .. } => "env",
        }
    }
}

impl fmt::Display for DecisionSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecisionSource::Field { object, value } => write!(f, "{object}: programClusterRoutes: {value}"),
            DecisionSource::FieldIgnoringCase { object, value } => {
                write!(f, "{object}: programClusterRoutes: {value:?} (Felix ignores case)")
            }
            DecisionSource::Default { reason } => write!(f, "default ({reason})"),
            DecisionSource::Fallback { object, value, reason } => {
                write!(f, "fallback: {object}: programClusterRoutes: {value:?} {reason}")
            }
            DecisionSource::Role { value } => write!(f, "--role explicit:{value}"),
            DecisionSource::Fixed { reason } => write!(f, "fixed ({reason})"),
            DecisionSource::Env { daemonset, name, value, overrides } => {
                write!(f, "calico-node env ({daemonset}): {name}={value}")?;
                match overrides {
                    Some(o) => write!(f, ", over {o}"),
                    None => Ok(()),
                }
            }
        }
    }
}

/// One component's effective `programClusterRoutes`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ComponentDecision {
    /// Whose field: [`Writer::Felix`] (FelixConfiguration), [`Writer::Bird`]
    /// (BGPConfiguration) or [`Writer::Routewarden`] (`--role explicit:<value>`).
    pub field_of: Writer,
    /// The value the component acts on.
    pub value: ClusterRoutes,
    pub source: DecisionSource,
}

/// confd's verdict for a pool in BIRD's `calico_kernel_programming` filter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KernelFilter {
    /// `accept` (with `krt_tunnel` for IPIP): BIRD programs the pool's cluster routes.
    Accept,
    /// `reject` ("Cluster routes are handled by Felix." / "VXLAN routes are handled by Felix.").
    Reject,
}

/// One row of the per-pool table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PoolOwnership {
    pub pool: String,
    pub cidr: IpNet,
    pub kind: PoolKind,
    pub class: Option<PoolClass>,
    /// Every component that programs the pool's cluster routes (sorted).
    pub writers: Vec<Writer>,
    /// What confd renders for this pool in BIRD's kernel filter (`bgp_processor.go`
    /// `processIPPool`), from the `default` BGPConfiguration. Applies to BIRD's kernel export
    /// whatever routewarden's role.
    pub bird_kernel_filter: KernelFilter,
}

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
    /// `env-unresolved`, `env-differs`, `operator-mismatch` or `source-unreadable`.
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

/// The engine's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OwnershipDecision {
    pub config: OwnershipConfig,
    /// The release line in force and where it came from.
    pub version: ResolvedVersion,
    /// Felix's effective value.
    pub felix: ComponentDecision,
    /// BIRD's effective value (confd's reading of BGPConfiguration `default`).
    pub bird: ComponentDecision,
    /// routewarden's own value in the `explicit` role.
    pub explicit: Option<ComponentDecision>,
    /// The classes routewarden programs (never VXLAN).
    pub programmed: BTreeSet<PoolClass>,
    /// Every writer of every class (all three classes, with or without pools).
    pub writers: BTreeMap<PoolClass, BTreeSet<Writer>>,
    /// Findings: per class with pools (consistent / double-programmed / unowned), then
    /// deprecation, then the version's, then the sources' (version skew, values ignored by
    /// this release, env, operator).
    pub findings: Vec<Finding>,
    /// One row per IP pool, by pool name.
    pub pools: Vec<PoolOwnership>,
}

impl OwnershipDecision {
    /// Whether routewarden programs `class`.
    pub fn programs(&self, class: PoolClass) -> bool {
        self.programmed.contains(&class)
    }

    /// The writers of `class`.
    pub fn writers_of(&self, class: PoolClass) -> Vec<Writer> {
        self.writers.get(&class).map(|w| w.iter().copied().collect()).unwrap_or_default()
    }

    /// True when a finding is an error (double-programmed, unowned).
    pub fn has_errors(&self) -> bool {
        self.findings.iter().any(Finding::is_error)
    }
}

/// Decide ownership for `cluster` under `config`.
pub fn decide(cluster: &Cluster, config: &OwnershipConfig) -> OwnershipDecision {
    let version = resolve_version(cluster, config.version);
    let mut sources = Vec::new();
    version_findings(&version, &mut sources);
    let felix = felix_value(cluster, config.node.as_deref(), &version, &mut sources);
    let bird = bird_value(cluster, &version, &mut sources);
    operator_findings(cluster, &version, &mut sources);
    let explicit = match config.role {
        Role::Explicit(v) => Some(ComponentDecision { field_of: Writer::Routewarden, value: v, source: DecisionSource::Role { value: v.as_str().to_owned() } }),
        _ => None,
    };

    let mut writers: BTreeMap<PoolClass, BTreeSet<Writer>> = BTreeMap::new();
    for class in [PoolClass::Ipip, PoolClass::NoEncap, PoolClass::Vxlan] {
        writers.insert(class, class_writers(class, config.role, felix.value, bird.value));
    }
    let programmed: BTreeSet<PoolClass> = writers.iter().filter(|(_, w)| w.contains(&Writer::Routewarden)).map(|(c, _)| *c).collect();

    let pools: Vec<PoolOwnership> = cluster
        .ip_pools
        .values()
        .map(|p| {
            let kind = PoolKind::of(p);
            let class = kind.class();
            let bird_accepts = match kind {
                // confd's `programsPool` looks at encapsulation only [inferred for LB-only].
                PoolKind::Vxlan => false,
                PoolKind::IpipAlways | PoolKind::IpipCrossSubnet => bird.value.covers(PoolClass::Ipip),
                PoolKind::NoEncap | PoolKind::NoEncapV6 | PoolKind::LoadBalancerOnly => bird.value.covers(PoolClass::NoEncap),
            };
            PoolOwnership {
                pool: p.name.clone(),
                cidr: p.cidr,
                kind,
                class,
                writers: class.and_then(|c| writers.get(&c)).map(|w| w.iter().copied().collect()).unwrap_or_default(),
                bird_kernel_filter: if bird_accepts { KernelFilter::Accept } else { KernelFilter::Reject },
            }
        })
        .collect();

    let mut findings = Vec::new();
    for (class, ws) in &writers {
        let class_pools: Vec<&str> = pools.iter().filter(|p| p.class == Some(*class)).map(|p| p.pool.as_str()).collect();
        if class_pools.is_empty() {
            continue;
        }
        findings.push(class_finding(*class, ws, &class_pools, config, &felix, &bird, explicit.as_ref()));
    }
    if version.rules == Rules::V3_33 && bird.value.covers(PoolClass::Ipip) && pools.iter().any(|p| p.class == Some(PoolClass::Ipip)) {
        findings.push(deprecated_finding(&bird));
    }
    findings.extend(sources);

    OwnershipDecision { config: config.clone(), version, felix, bird, explicit, programmed, writers, findings, pools }
}

/// Writers of one class under a role. VXLAN: always Felix (`bgp_processor.go` `programsPool`
/// returns false for VXLAN; Felix's `vxlanManager` always runs), never routewarden.
fn class_writers(class: PoolClass, role: Role, felix: ClusterRoutes, bird: ClusterRoutes) -> BTreeSet<Writer> {
    let mut out = BTreeSet::new();
    if class == PoolClass::Vxlan {
        out.insert(Writer::Felix);
        return out;
    }
    let (felix_writer, bird_writer) = match role {
        Role::Felix => (Writer::Routewarden, Writer::Bird),
        Role::Bird => (Writer::Felix, Writer::Routewarden),
        Role::Explicit(_) | Role::Audit => (Writer::Felix, Writer::Bird),
    };
    if felix.covers(class) {
        out.insert(felix_writer);
    }
    if bird.covers(class) {
        out.insert(bird_writer);
    }
    if let Role::Explicit(v) = role {
        if v.covers(class) {
            out.insert(Writer::Routewarden);
        }
    }
    out
}

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
fn felix_value(cluster: &Cluster, node: Option<&str>, version: &ResolvedVersion, findings: &mut Vec<Finding>) -> ComponentDecision {
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
fn bird_value(cluster: &Cluster, version: &ResolvedVersion, findings: &mut Vec<Finding>) -> ComponentDecision {
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

/// `could not read calico-node env (calico-system/calico-node): forbidden (403); <consequence>`:
/// a warning, not an error (the decision is still made from what was read).
fn unreadable_finding(source: OptionalSource, reason: &str, consequence: &str) -> Finding {
    let label = source.label();
    Finding {
        kind: FindingKind::SourceUnreadable { source: label.clone(), reason: reason.to_owned() },
        class: None,
        severity: Severity::Warning,
        message: format!("could not read {label}: {reason}; {consequence}"),
    }
}

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
fn operator_findings(cluster: &Cluster, version: &ResolvedVersion, findings: &mut Vec<Finding>) {
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

/// The version's own findings: assumed (warning), newer than the newest known line (info),
/// older than the oldest supported (warning).
fn version_findings(version: &ResolvedVersion, findings: &mut Vec<Finding>) {
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

fn ignored_finding(object: &str, raw: &str, version: CalicoVersion, reader: &str, consequence: &str) -> Finding {
    Finding {
        kind: FindingKind::IgnoredByRelease { object: object.to_owned(), value: raw.to_owned() },
        class: None,
        severity: Severity::Warning,
        message: format!("{object}: {raw:?} is set but ignored by this release: {reader} {version} does not read it, and {consequence}"),
    }
}

fn unset_reason(cluster: &Cluster) -> String {
    if cluster.bgp_default().is_some() {
        "programClusterRoutes unset in BGPConfiguration default".into()
    } else {
        "no BGPConfiguration default".into()
    }
}

/// A version-skew finding for `raw` in `object`'s field, read by `reader` on `version` (whose
/// rules are `rules`).
fn skew_finding(object: &str, raw: &str, version: CalicoVersion, rules: Rules, reader: &str, parsed: Option<ClusterRoutes>, consequence: &str) -> Finding {
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

fn class_finding(
    class: PoolClass,
    writers: &BTreeSet<Writer>,
    pools: &[&str],
    config: &OwnershipConfig,
    felix: &ComponentDecision,
    bird: &ComponentDecision,
    explicit: Option<&ComponentDecision>,
) -> Finding {
    let class_name = class_display(class);
    let pools = pools.join(", ");
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

fn deprecated_finding(bird: &ComponentDecision) -> Finding {
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

fn class_display(class: PoolClass) -> &'static str {
    match class {
        PoolClass::Ipip => "IPIP",
        PoolClass::NoEncap => "no-encap",
        PoolClass::Vxlan => "VXLAN",
    }
}
