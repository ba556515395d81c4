//! What the Kubernetes datastore reads: the two Calico API groups ([`CalicoGroup`]), the
//! watched resources ([`Watched`]: the six Calico ones, core Nodes, and the optional sources'
//! Installation and calico-node DaemonSet), the verbs used on them ([`VERBS`]), which optional
//! sources to read ([`optional_sources`]) and each resource's [`ApiResource`].

use std::fmt;

use kube::api::ApiResource;

use crate::model::{Kind, OptionalSource};

/// The verbs routewarden uses on every resource it reads, and exactly the verbs
/// `deploy/clusterrole.yaml` grants (a test compares the two, so neither can drift).
pub const VERBS: [&str; 2] = ["list", "watch"];

/// A resource routewarden watches: the model kind and the plural resource name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Watched {
    pub kind: Kind,
    pub plural: &'static str,
}

/// The six Calico resources, in the order they are added to the model. The same plurals exist
/// in both Calico groups (`../shared/calico-testdata/crds/`). `clusterinformations` is read for
/// the release line (`ClusterInformation default` `spec.calicoVersion`).
pub const CALICO_RESOURCES: [Watched; 6] = [
    Watched { kind: Kind::IpPool, plural: "ippools" },
    Watched { kind: Kind::IpamBlock, plural: "ipamblocks" },
    Watched { kind: Kind::BlockAffinity, plural: "blockaffinities" },
    Watched { kind: Kind::FelixConfiguration, plural: "felixconfigurations" },
    Watched { kind: Kind::BgpConfiguration, plural: "bgpconfigurations" },
    Watched { kind: Kind::ClusterInformation, plural: "clusterinformations" },
];

/// The core Node resource (group `""`, version `v1`).
pub const NODE_RESOURCE: Watched = Watched { kind: Kind::Node, plural: "nodes" };

/// The operator's API group (`operator.tigera.io/v1`); served only on operator installs.
pub const OPERATOR_API_VERSION: &str = "operator.tigera.io/v1";

/// The operator's `Installation` (cluster-scoped; only `default` is reconciled).
pub const INSTALLATION_RESOURCE: Watched = Watched { kind: Kind::Installation, plural: "installations" };

/// `apps/v1` DaemonSets: only `calico-node`, only in the namespaces of [`NAMESPACED_RBAC`](super::NAMESPACED_RBAC),
/// read with a `metadata.name=calico-node` field selector (which is what lets a `Role` name
/// the one object with `resourceNames`).
pub const DAEMONSET_RESOURCE: Watched = Watched { kind: Kind::DaemonSet, plural: "daemonsets" };

/// The field selector of the calico-node DaemonSet watches.
pub const CALICO_NODE_SELECTOR: &str = "metadata.name=calico-node";

/// The optional sources to read, given what discovery found.
///
/// - `kube-system/calico-node` always (manifest installs put calico-node there, and the
///   operator migrates it from there);
/// - with the operator's group served (`operator.tigera.io/v1` lists `installations`): also
///   `Installation default` and `calico-system/calico-node` (tigera/operator renders
///   calico-node in `common.CalicoNamespace`, `calico-system`).
///
/// Without the operator, `calico-system` is not read at all: a manifest install has no such
/// namespace, and the RBAC for it lives in the `deploy/operator` component.
pub fn optional_sources(operator: bool) -> Vec<OptionalSource> {
    if operator {
        vec![OptionalSource::Installation, OptionalSource::CalicoNodeEnv("calico-system"), OptionalSource::CalicoNodeEnv("kube-system")]
    } else {
        vec![OptionalSource::CalicoNodeEnv("kube-system")]
    }
}

/// A Calico API group routewarden can read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CalicoGroup {
    /// `crd.projectcalico.org/v1`: the CRDs of a Kubernetes-datastore cluster.
    CrdV1,
    /// `projectcalico.org/v3`: Calico's native v3 CRDs (or the Calico API server).
    V3,
}

impl CalicoGroup {
    /// The API group (`crd.projectcalico.org`).
    pub const fn group(self) -> &'static str {
        match self {
            CalicoGroup::CrdV1 => "crd.projectcalico.org",
            CalicoGroup::V3 => "projectcalico.org",
        }
    }

    /// The version (`v1`).
    pub const fn version(self) -> &'static str {
        match self {
            CalicoGroup::CrdV1 => "v1",
            CalicoGroup::V3 => "v3",
        }
    }

    /// `group/version`, as in `apiVersion`.
    pub const fn api_version(self) -> &'static str {
        match self {
            CalicoGroup::CrdV1 => "crd.projectcalico.org/v1",
            CalicoGroup::V3 => "projectcalico.org/v3",
        }
    }
}

impl fmt::Display for CalicoGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.api_version())
    }
}

/// The [`ApiResource`] of a watched resource in `group` (core v1 for Nodes).
pub(crate) fn api_resource(group: CalicoGroup, w: Watched) -> ApiResource {
    let fixed = |group: &str, version: &str| ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: if group.is_empty() { version.into() } else { format!("{group}/{version}") },
        kind: w.kind.as_str().into(),
        plural: w.plural.into(),
    };
    match w.kind {
        Kind::Installation => return fixed("operator.tigera.io", "v1"),
        Kind::DaemonSet => return fixed("apps", "v1"),
        _ => {}
    }
    if w.kind == Kind::Node {
        ApiResource { group: String::new(), version: "v1".into(), api_version: "v1".into(), kind: w.kind.as_str().into(), plural: w.plural.into() }
    } else {
        ApiResource {
            group: group.group().into(),
            version: group.version().into(),
            api_version: group.api_version().into(),
            kind: w.kind.as_str().into(),
            plural: w.plural.into(),
        }
    }
}
