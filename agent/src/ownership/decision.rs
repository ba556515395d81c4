//! The engine's words and its answer: the values of `programClusterRoutes`
//! ([`ClusterRoutes`]), routewarden's [`Role`], the [`OwnershipConfig`] it is given, where each
//! component's value came from ([`DecisionSource`]), and the [`OwnershipDecision`] with its
//! per-pool table.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use ipnet::IpNet;
use serde::Serialize;

use super::{Finding, ResolvedVersion, Rules, VersionChoice};
use crate::vocabulary::{PoolClass, PoolKind, Writer};

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
