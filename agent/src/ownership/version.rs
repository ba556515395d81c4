//! Calico release lines (reference §1.3): which one a cluster runs, and whose rules decide.
//!
//! | line | Felix field | confd (BIRD) field |
//! |---|---|---|
//! | 3.26–3.30 | absent: Felix programs only VXLAN routes | absent: BIRD programs IPIP and no-encap |
//! | 3.31 | `Enabled`/`Disabled`, default `Disabled` | absent: BIRD programs IPIP and no-encap |
//! | 3.32 | `Enabled`/`Disabled`, default `Disabled` | anything but the exact `Disabled` is `Enabled` |
//! | 3.33 (and 3.34+, assumed the same) | 4 values, default `EnabledIPIPOnly` | 4 values, default `EnabledNoEncapOnly` |
//!
//! `--calico-version auto` (the default) reads the release from `ClusterInformation default`
//! `spec.calicoVersion` (written by calico-node at start,
//! `libcalico-go/lib/clientv3/client.go` `EnsureInitialized`, e.g. `v3.30.2`); without a
//! usable one it assumes 3.33 and says why ([`VersionSource::Assumed`]).

use std::fmt;
use std::str::FromStr;

use serde::{Serialize, Serializer};

use super::OwnershipError;
use crate::model::Cluster;

/// A Calico release line `3.<minor>` (3.26 or later when given on the command line).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CalicoVersion {
    minor: u16,
}

/// Whose rules a release line follows (the rows of the module table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Rules {
    /// 3.30 and earlier: no `programClusterRoutes` field anywhere.
    #[serde(rename = "3.26-3.30")]
    Legacy,
    #[serde(rename = "3.31")]
    V3_31,
    #[serde(rename = "3.32")]
    V3_32,
    /// 3.33 (master, release-v3.33) and every later line.
    #[serde(rename = "3.33")]
    V3_33,
}

impl Rules {
    /// `3.26-3.30`, `3.31`, `3.32`, `3.33`.
    pub fn label(self) -> &'static str {
        match self {
            Rules::Legacy => "3.26-3.30",
            Rules::V3_31 => "3.31",
            Rules::V3_32 => "3.32",
            Rules::V3_33 => "3.33",
        }
    }

    /// Whether Felix reads `FelixConfiguration.spec.programClusterRoutes` (and its env var).
    pub fn felix_reads_field(self) -> bool {
        self != Rules::Legacy
    }

    /// Whether confd reads `BGPConfiguration.spec.programClusterRoutes`.
    pub fn confd_reads_field(self) -> bool {
        matches!(self, Rules::V3_32 | Rules::V3_33)
    }
}

impl CalicoVersion {
    /// The oldest line `--calico-version` accepts.
    pub const OLDEST: CalicoVersion = CalicoVersion { minor: 26 };
    pub const V3_30: CalicoVersion = CalicoVersion { minor: 30 };
    pub const V3_31: CalicoVersion = CalicoVersion { minor: 31 };
    pub const V3_32: CalicoVersion = CalicoVersion { minor: 32 };
    pub const V3_33: CalicoVersion = CalicoVersion { minor: 33 };
    /// The newest line whose rules are known; later lines are decided by its rules.
    pub const NEWEST_KNOWN: CalicoVersion = CalicoVersion::V3_33;

    /// `3.<minor>`.
    pub const fn new(minor: u16) -> CalicoVersion {
        CalicoVersion { minor }
    }

    /// The minor number (`30` for 3.30).
    pub fn minor(self) -> u16 {
        self.minor
    }

    /// The rules this line follows.
    pub fn rules(self) -> Rules {
        match self.minor {
            0..=30 => Rules::Legacy,
            31 => Rules::V3_31,
            32 => Rules::V3_32,
            _ => Rules::V3_33,
        }
    }

    /// Parse a release as calico-node writes it or a person types it: `3.30`, `v3.30.2`,
    /// `3.33.0-0.dev-12-gabc`. Any line of major 3, however old (see [`FromStr`] for the
    /// range the command line accepts).
    ///
    /// Errors: [`OwnershipError::InvalidVersion`] for anything else (`master`, `v4.0.0`, `3`).
    pub fn parse_release(s: &str) -> Result<CalicoVersion, OwnershipError> {
        let err = || OwnershipError::InvalidVersion { value: s.to_owned() };
        let t = s.strip_prefix('v').unwrap_or(s);
        let mut parts = t.splitn(3, '.');
        let major: u32 = parts.next().filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())).and_then(|p| p.parse().ok()).ok_or_else(err)?;
        let minor: u16 = parts.next().filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())).and_then(|p| p.parse().ok()).ok_or_else(err)?;
        if let Some(rest) = parts.next() {
            // `2`, `0-0.dev`, `1-12-gabc`: the patch starts with digits, and the rest is
            // semver pre-release or build text (so a detected value shown as is in `explain`,
            // logs and BIRD config comments holds no control or space).
            let digits = rest.split(['-', '+', '.']).next().unwrap_or("");
            if digits.is_empty()
                || !digits.bytes().all(|b| b.is_ascii_digit())
                || !rest.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'+' | b'.'))
            {
                return Err(err());
            }
        }
        if major != 3 {
            return Err(err());
        }
        Ok(CalicoVersion { minor })
    }
}

impl fmt::Display for CalicoVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "3.{}", self.minor)
    }
}

impl Serialize for CalicoVersion {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl Default for CalicoVersion {
    fn default() -> Self {
        CalicoVersion::NEWEST_KNOWN
    }
}

impl FromStr for CalicoVersion {
    type Err = OwnershipError;

    /// `3.26` … `3.33`, `3.34` and later, with or without `v` and a patch (`v3.32.1`).
    ///
    /// Errors: [`OwnershipError::InvalidVersion`] for a line older than 3.26 or not a Calico
    /// 3 release.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let v = CalicoVersion::parse_release(s)?;
        if v < CalicoVersion::OLDEST {
            return Err(OwnershipError::InvalidVersion { value: s.to_owned() });
        }
        Ok(v)
    }
}

/// `--calico-version`: a fixed release line, or `auto` (read ClusterInformation `default`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum VersionChoice {
    /// From `ClusterInformation default`, else 3.33 with a warning.
    #[default]
    Auto,
    /// As given; wins over the cluster's own.
    Fixed(CalicoVersion),
}

impl From<CalicoVersion> for VersionChoice {
    fn from(v: CalicoVersion) -> Self {
        VersionChoice::Fixed(v)
    }
}

impl FromStr for VersionChoice {
    type Err = OwnershipError;

    /// `auto`, or a release line ([`CalicoVersion`]'s `FromStr`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "auto" {
            Ok(VersionChoice::Auto)
        } else {
            s.parse().map(VersionChoice::Fixed)
        }
    }
}

impl fmt::Display for VersionChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VersionChoice::Auto => f.write_str("auto"),
            VersionChoice::Fixed(v) => v.fmt(f),
        }
    }
}

/// Where the release line in force came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "source", rename_all = "kebab-case")]
pub enum VersionSource {
    /// `--calico-version <line>`.
    Flag,
    /// `ClusterInformation default` `spec.calicoVersion`, raw.
    ClusterInformation { value: String },
    /// `auto` without a usable ClusterInformation: 3.33 assumed; `reason` names what was
    /// missing (`no ClusterInformation default`, `spec.calicoVersion "master" is not a
    /// Calico 3 release`).
    Assumed { reason: String },
}

impl VersionSource {
    /// `flag`, `cluster-information` or `assumed` (the `source` label of
    /// `routewarden_calico_version_info`).
    pub fn label(&self) -> &'static str {
        match self {
            VersionSource::Flag => "flag",
            VersionSource::ClusterInformation { .. } => "cluster-information",
            VersionSource::Assumed { .. } => "assumed",
        }
    }
}

impl fmt::Display for VersionSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VersionSource::Flag => f.write_str("--calico-version"),
            VersionSource::ClusterInformation { value } => {
                write!(f, "ClusterInformation default: {value}")
            }
            VersionSource::Assumed { reason } => write!(f, "assumed: {reason}"),
        }
    }
}

/// The release line in force, its rules and where it came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ResolvedVersion {
    /// The release (`3.34` stays `3.34`).
    pub version: CalicoVersion,
    /// Whose rules decide (`3.33` for 3.34).
    pub rules: Rules,
    pub source: VersionSource,
}

impl fmt::Display for ResolvedVersion {
    /// `3.30 (ClusterInformation default: v3.30.2)`, `3.34, decided as 3.33 (...)`,
    /// `3.33 (assumed: no ClusterInformation default)`, `3.31 (--calico-version)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.version)?;
        if self.version > CalicoVersion::NEWEST_KNOWN {
            write!(f, ", decided as {}", self.rules.label())?;
        }
        write!(f, " ({})", self.source)
    }
}

/// The release line for `choice` in `cluster`: the flag's, else `ClusterInformation default`'s
/// `spec.calicoVersion` (any Calico 3 release; a non-`Calico` `spec.variant` is not an
/// open-source line), else 3.33 with the reason.
pub fn resolve_version(cluster: &Cluster, choice: VersionChoice) -> ResolvedVersion {
    let assumed = |reason: String| ResolvedVersion { version: CalicoVersion::NEWEST_KNOWN, rules: Rules::V3_33, source: VersionSource::Assumed { reason } };
    match choice {
        VersionChoice::Fixed(version) => ResolvedVersion { version, rules: version.rules(), source: VersionSource::Flag },
        VersionChoice::Auto => {
            let Some(info) = cluster.cluster_information_default() else {
                return assumed("no ClusterInformation default".to_owned());
            };
            if let Some(variant) = info.variant.as_deref().filter(|v| !v.is_empty() && *v != "Calico") {
                return assumed(format!(
                    "ClusterInformation default: spec.variant {variant:?} is not Calico open source, whose release lines routewarden knows"
                ));
            }
            match info.calico_version.as_deref().filter(|v| !v.is_empty()) {
                None => assumed("ClusterInformation default has no spec.calicoVersion (no calico-node has started yet)".to_owned()),
                Some(raw) => match CalicoVersion::parse_release(raw) {
                    Ok(version) => ResolvedVersion { version, rules: version.rules(), source: VersionSource::ClusterInformation { value: raw.to_owned() } },
                    Err(_) => assumed(format!("ClusterInformation default: spec.calicoVersion {raw:?} is not a Calico 3 release")),
                },
            }
        }
    }
}
