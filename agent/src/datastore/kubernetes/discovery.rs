//! API discovery: which Calico group to read (`--calico-api-group`, [`ApiGroupChoice`]), whether
//! it serves the six resources ([`discover`]), and whether the operator's `Installation` is
//! served ([`discover_operator`]), and the same again while the datastore runs
//! ([`rediscover`]). Only the non-resource discovery URLs every authenticated client may read.

use std::fmt;
use std::str::FromStr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIGroupList;
use kube::Client;

use super::error::KubernetesError;
use super::resources::{CalicoGroup, CALICO_RESOURCES, INSTALLATION_RESOURCE, OPERATOR_API_VERSION, VERBS};

/// `--calico-api-group`: discover the group, or force one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ApiGroupChoice {
    /// Discover at start ([`discover`]). Discovery while running never switches: another group
    /// it would choose is the `api-group-changed` finding.
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
        ApiGroupChoice::Auto => auto_group(&api_groups(client).await?).ok_or(KubernetesError::NoCalicoGroup)?,
    };
    check_resources(client, group).await
}

/// `GET /apis`.
async fn api_groups(client: &Client) -> Result<APIGroupList, KubernetesError> {
    client.list_api_groups().await.map_err(|cause| KubernetesError::Discovery { request: "GET /apis".into(), cause })
}

/// Whether `list` serves `group` at `version`.
fn serves(list: &APIGroupList, group: &str, version: &str) -> bool {
    list.groups.iter().any(|ag| ag.name == group && ag.versions.iter().any(|v| v.version == version))
}

/// The group `auto` chooses from `/apis`: `crd.projectcalico.org/v1` when served, else
/// `projectcalico.org/v3`, else none. Calico's own rule (`libcalico-go/lib/backend/k8s/
/// discovery.go` `UsingV3CRDs`): v3 only when v1 is absent, since a v3 group next to v1 is
/// the aggregated API server in front of it.
fn auto_group(list: &APIGroupList) -> Option<CalicoGroup> {
    [CalicoGroup::CrdV1, CalicoGroup::V3].into_iter().find(|g| serves(list, g.group(), g.version()))
}

/// Check that `group` serves the six resources with list and watch (`GET /apis/<group>/<version>`).
async fn check_resources(client: &Client, group: CalicoGroup) -> Result<CalicoGroup, KubernetesError> {
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

/// What discovery run again found ([`rediscover`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rediscovered {
    /// The Calico group `auto` would choose now, checked to serve the six resources (it may be
    /// the group read); `None` with a forced group, or when `/apis` lists no Calico group or
    /// the group lacks resources (the Calico watches say so themselves).
    pub(crate) calico: Option<CalicoGroup>,
    /// `operator.tigera.io/v1` serves `installations` with list and watch.
    pub(crate) operator: bool,
}

/// API discovery again, while the datastore runs: on a timer (`--discovery-interval`) and when
/// a watch answers 404. Cheap when nothing changed: one `GET /apis`. Then
/// `GET /apis/<group>/<version>` only when `auto` would choose another group than `read` (is
/// every resource there?), and `GET /apis/operator.tigera.io/v1` only when `/apis` lists the
/// operator's group and its sources are not read yet, or `confirm` (a watch of them answered
/// 404: is `installations` still served?). A group absent from `/apis` is not served.
///
/// Errors: [`KubernetesError::Discovery`] when a request failed (nothing is concluded then).
pub(crate) async fn rediscover(
    client: &Client,
    choice: ApiGroupChoice,
    read: CalicoGroup,
    reading_operator: bool,
    confirm: bool,
) -> Result<Rediscovered, KubernetesError> {
    let list = api_groups(client).await?;
    let calico = match (choice, auto_group(&list)) {
        (ApiGroupChoice::Forced(_), _) | (ApiGroupChoice::Auto, None) => None,
        (ApiGroupChoice::Auto, Some(g)) if g == read => Some(g),
        (ApiGroupChoice::Auto, Some(g)) => match check_resources(client, g).await {
            Ok(g) => Some(g),
            Err(KubernetesError::MissingResources { .. }) => None,
            Err(e) => return Err(e),
        },
    };
    let (group, version) = OPERATOR_API_VERSION.split_once('/').unwrap_or((OPERATOR_API_VERSION, ""));
    let operator = if !serves(&list, group, version) {
        false
    } else if reading_operator && !confirm {
        true
    } else {
        discover_operator(client).await?
    };
    Ok(Rediscovered { calico, operator })
}
