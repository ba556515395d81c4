//! API discovery: which Calico group to read (`--calico-api-group`, [`ApiGroupChoice`]), whether
//! it serves the six resources ([`discover`]), and whether the operator's `Installation` is
//! served ([`discover_operator`]). Only the non-resource discovery URLs every authenticated
//! client may read.

use std::fmt;
use std::str::FromStr;

use kube::Client;

use super::error::KubernetesError;
use super::resources::{CalicoGroup, CALICO_RESOURCES, INSTALLATION_RESOURCE, OPERATOR_API_VERSION, VERBS};

/// `--calico-api-group`: discover the group, or force one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ApiGroupChoice {
    /// Discover at start (see the module docs for the rule).
    #[default]
    Auto,
    /// Use this group without looking at `/apis`.
    Forced(CalicoGroup),
}

impl FromStr for ApiGroupChoice {
    type Err = KubernetesError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(ApiGroupChoice::Auto),
            "crd.projectcalico.org/v1" => Ok(ApiGroupChoice::Forced(CalicoGroup::CrdV1)),
            "projectcalico.org/v3" => Ok(ApiGroupChoice::Forced(CalicoGroup::V3)),
            other => Err(KubernetesError::UnknownApiGroup(other.to_owned())),
        }
    }
}

impl fmt::Display for ApiGroupChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ApiGroupChoice::Auto => f.write_str("auto"),
            ApiGroupChoice::Forced(g) => g.fmt(f),
        }
    }
}

/// Choose the Calico group (`GET /apis`, unless forced) and check that it serves the six
/// resources with list and watch (`GET /apis/<group>/<version>`).
///
/// Errors: [`KubernetesError::Discovery`] (request failed), [`KubernetesError::NoCalicoGroup`],
/// [`KubernetesError::MissingResources`].
pub async fn discover(client: &Client, choice: ApiGroupChoice) -> Result<CalicoGroup, KubernetesError> {
    let group = match choice {
        ApiGroupChoice::Forced(g) => g,
        ApiGroupChoice::Auto => {
            let list = client.list_api_groups().await.map_err(|cause| KubernetesError::Discovery { request: "GET /apis".into(), cause })?;
            let served = |g: CalicoGroup| list.groups.iter().any(|ag| ag.name == g.group() && ag.versions.iter().any(|v| v.version == g.version()));
            if served(CalicoGroup::CrdV1) {
                CalicoGroup::CrdV1
            } else if served(CalicoGroup::V3) {
                CalicoGroup::V3
            } else {
                return Err(KubernetesError::NoCalicoGroup);
            }
        }
    };
    let resources = client
        .list_api_group_resources(group.api_version())
        .await
        .map_err(|source| KubernetesError::Discovery { request: format!("GET /apis/{}", group.api_version()), cause: source })?;
    let missing: Vec<&'static str> = CALICO_RESOURCES
        .iter()
        .map(|w| w.plural)
        .filter(|plural| !resources.resources.iter().any(|r| r.name == *plural && VERBS.iter().all(|verb| r.verbs.iter().any(|v| v == verb))))
        .collect();
    if !missing.is_empty() {
        return Err(KubernetesError::MissingResources { group, missing });
    }
    Ok(group)
}

/// Is the operator's `Installation` served (`GET /apis/operator.tigera.io/v1` lists
/// `installations` with list and watch)? A 404 (or any other answer from the API server)
/// means no operator: its sources are then not read at all.
///
/// Errors: [`KubernetesError::Discovery`] when the request itself failed (transport).
pub async fn discover_operator(client: &Client) -> Result<bool, KubernetesError> {
    match client.list_api_group_resources(OPERATOR_API_VERSION).await {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == INSTALLATION_RESOURCE.plural && VERBS.iter().all(|verb| r.verbs.iter().any(|v| v == verb)))),
        Err(kube::Error::Api(status)) => {
            tracing::debug!(code = status.code, "kubernetes datastore: {OPERATOR_API_VERSION} not served; no operator sources");
            Ok(false)
        }
        Err(cause) => Err(KubernetesError::Discovery { request: format!("GET /apis/{OPERATOR_API_VERSION}"), cause }),
    }
}
