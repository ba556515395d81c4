//! The objects besides FelixConfiguration and BGPConfiguration that change how a cluster
//! decides cluster-route ownership (issue 19, reference §1.3): [`ClusterInformation`]
//! `default`, the Calico release the cluster runs (`spec.calicoVersion`, e.g. `v3.30.2`),
//! which decides which fields exist and their defaults.
//!
//! Only the fields that matter are read. Pure: no I/O.

use serde::Serialize;

use super::fields::Fields;
use super::ModelError;

/// `ClusterInformation` (`api/pkg/apis/projectcalico/v3/clusterinfo.go`), as calico-node writes
/// it at start (`libcalico-go/lib/clientv3/client.go` `EnsureInitialized`). Only the object
/// named `default` exists in a healthy cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ClusterInformation {
    pub name: String,
    /// `spec.calicoVersion`, raw (`v3.30.2`; empty or absent until a calico-node has started).
    pub calico_version: Option<String>,
    /// `spec.variant` (`Calico`, `TigeraSecureEnterprise`): Enterprise versions are not
    /// open-source release lines.
    pub variant: Option<String>,
}

impl ClusterInformation {
    pub(crate) fn parse(
        f: &mut Fields<'_>,
        name: &str,
    ) -> Result<ClusterInformation, Vec<ModelError>> {
        let calico_version = f.string(&["spec", "calicoVersion"]).map(str::to_owned);
        let variant = f.string(&["spec", "variant"]).map(str::to_owned);
        f.take_result(ClusterInformation {
            name: name.to_owned(),
            calico_version,
            variant,
        })
    }
}
