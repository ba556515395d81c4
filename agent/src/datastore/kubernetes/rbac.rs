//! The RBAC the Kubernetes datastore needs, as data: the cluster-wide rules ([`RBAC`]) and the
//! namespaced calico-node reads ([`NAMESPACED_RBAC`]). Tests compare both with the manifests
//! under `deploy/`, so the code and the grants cannot drift.

use super::resources::{CalicoGroup, CALICO_RESOURCES, DAEMONSET_RESOURCE, INSTALLATION_RESOURCE, NODE_RESOURCE, VERBS};

/// The plurals of the six Calico resources, in [`CALICO_RESOURCES`] order.
pub(super) const CALICO_PLURALS: [&str; 6] = [
    CALICO_RESOURCES[0].plural,
    CALICO_RESOURCES[1].plural,
    CALICO_RESOURCES[2].plural,
    CALICO_RESOURCES[3].plural,
    CALICO_RESOURCES[4].plural,
    CALICO_RESOURCES[5].plural,
];

/// One RBAC rule: API group, resources, verbs (the shape of a ClusterRole `rules[]` entry).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RbacRule {
    pub api_group: &'static str,
    pub resources: &'static [&'static str],
    pub verbs: &'static [&'static str],
}

/// Everything the code requests from the API server: the single table the RBAC test compares
/// with `deploy/clusterrole.yaml`. Both Calico groups are listed because the group is chosen at
/// start (and may change when a cluster migrates).
pub const RBAC: [RbacRule; 4] = [
    RbacRule { api_group: CalicoGroup::CrdV1.group(), resources: &CALICO_PLURALS, verbs: &VERBS },
    RbacRule { api_group: CalicoGroup::V3.group(), resources: &CALICO_PLURALS, verbs: &VERBS },
    RbacRule { api_group: "", resources: &[NODE_RESOURCE.plural], verbs: &VERBS },
    RbacRule { api_group: "operator.tigera.io", resources: &[INSTALLATION_RESOURCE.plural], verbs: &VERBS },
];

/// One namespaced grant: a `Role` rule in `namespace` limited to `resource_names`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamespacedRbacRule {
    pub namespace: &'static str,
    /// The manifest of the Role, relative to `deploy/`; its RoleBinding is
    /// `rolebinding-calico-node-env.yaml` next to it.
    pub manifest: &'static str,
    pub rule: RbacRule,
    pub resource_names: &'static [&'static str],
}

/// The namespaced reads (the calico-node DaemonSet's env): one `Role` per namespace, granting
/// list and watch on `daemonsets` named `calico-node` only. `kube-system` is in the base
/// (`deploy/role-calico-node-env.yaml`); `calico-system` exists only on operator installs and
/// is the `deploy/operator` component (applying a Role into a missing namespace fails).
pub const NAMESPACED_RBAC: [NamespacedRbacRule; 2] = [
    NamespacedRbacRule {
        namespace: "kube-system",
        manifest: "role-calico-node-env.yaml",
        rule: RbacRule { api_group: "apps", resources: &[DAEMONSET_RESOURCE.plural], verbs: &VERBS },
        resource_names: &[crate::model::CALICO_NODE],
    },
    NamespacedRbacRule {
        namespace: "calico-system",
        manifest: "operator/role-calico-node-env.yaml",
        rule: RbacRule { api_group: "apps", resources: &[DAEMONSET_RESOURCE.plural], verbs: &VERBS },
        resource_names: &[crate::model::CALICO_NODE],
    },
];
