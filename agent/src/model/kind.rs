//! The object kinds the model reads ([`Kind`]), with their Kubernetes `kind` strings and the
//! `apiVersion`s each is read in.

use std::fmt;

use serde::Serialize;

/// The object kinds the model reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Kind {
    IpPool,
    IpamBlock,
    BlockAffinity,
    Node,
    FelixConfiguration,
    BgpConfiguration,
    /// Calico's `ClusterInformation` (the release line, `spec.calicoVersion`).
    ClusterInformation,
    /// tigera/operator's `Installation` (`operator.tigera.io/v1`).
    Installation,
    /// The `calico-node` `DaemonSet` (`apps/v1`); DaemonSets of other names are not read.
    DaemonSet,
}

impl Kind {
    /// The Kubernetes `kind` string (`IPPool`, `IPAMBlock`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::IpPool => "IPPool",
            Kind::IpamBlock => "IPAMBlock",
            Kind::BlockAffinity => "BlockAffinity",
            Kind::Node => "Node",
            Kind::FelixConfiguration => "FelixConfiguration",
            Kind::BgpConfiguration => "BGPConfiguration",
            Kind::ClusterInformation => "ClusterInformation",
            Kind::Installation => "Installation",
            Kind::DaemonSet => "DaemonSet",
        }
    }

    /// The `apiVersion`s an object of this kind is read in (an empty one is accepted for the
    /// Calico kinds, as calicoctl files omit it).
    pub fn api_versions(self) -> &'static str {
        match self {
            Kind::Node => "projectcalico.org/v3 or crd.projectcalico.org/v1, or v1 for the core Node",
            Kind::Installation => "operator.tigera.io/v1",
            Kind::DaemonSet => "apps/v1",
            _ => "projectcalico.org/v3 or crd.projectcalico.org/v1",
        }
    }

    /// The model kind for a `kind` string; `None` for kinds routewarden does not read.
    pub fn from_kind(kind: &str) -> Option<Kind> {
        Some(match kind {
            "IPPool" => Kind::IpPool,
            "IPAMBlock" => Kind::IpamBlock,
            "BlockAffinity" => Kind::BlockAffinity,
            "Node" => Kind::Node,
            "FelixConfiguration" => Kind::FelixConfiguration,
            "BGPConfiguration" => Kind::BgpConfiguration,
            "ClusterInformation" => Kind::ClusterInformation,
            "Installation" => Kind::Installation,
            "DaemonSet" => Kind::DaemonSet,
            _ => return None,
        })
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
