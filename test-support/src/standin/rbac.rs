//! Authentication by bearer token ([`User`]) and authorization by RBAC rules ([`Rbac`]), the
//! way the API server's RBAC authorizer decides (k8s.io/kubernetes
//! `plugin/pkg/auth/authorizer/rbac/rbac.go` and `pkg/apis/rbac/v1/evaluation_helpers.go`):
//! a request is allowed when one rule of a role bound to the user, one of its groups or its
//! service account allows the verb on the API group, resource (or `resource/subresource`),
//! name (`resourceNames`; empty means every name) and namespace (a Role or a RoleBinding
//! only in its own namespace, a ClusterRole through a ClusterRoleBinding everywhere), or the
//! verb on a non-resource URL (`nonResourceURLs`, `*` suffix matching a prefix). Nothing
//! else: RBAC has no deny rules, so whatever no rule allows is refused (403).
//!
//! Besides the rules given, every authenticated user may read discovery and `/version`, as
//! the bootstrap ClusterRoles `system:discovery` and `system:public-info-viewer` bound to
//! `system:authenticated` allow (`plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go`),
//! and the group `system:masters` may do anything (the API server's privileged-group
//! authorizer).

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, Subject};

use super::request::RequestInfo;

/// An authenticated user: name and groups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    /// `system:serviceaccount:<namespace>:<name>` for a service account.
    pub name: String,
    pub groups: Vec<String>,
}

impl User {
    /// The user a service account's token authenticates as, with the groups the API server
    /// gives it (`system:serviceaccounts`, `system:serviceaccounts:<namespace>`,
    /// `system:authenticated`).
    pub fn service_account(namespace: &str, name: &str) -> User {
        User {
            name: format!("system:serviceaccount:{namespace}:{name}"),
            groups: vec!["system:serviceaccounts".into(), format!("system:serviceaccounts:{namespace}"), "system:authenticated".into()],
        }
    }

    /// A cluster administrator (group `system:masters`, allowed everything).
    pub fn admin() -> User {
        User { name: "system:admin".into(), groups: vec!["system:masters".into(), "system:authenticated".into()] }
    }

    /// `(namespace, name)` when this is a service account.
    fn service_account_parts(&self) -> Option<(&str, &str)> {
        self.name.strip_prefix("system:serviceaccount:")?.split_once(':')
    }
}

/// One granted rule and where it applies (`None`: every namespace and cluster scope).
#[derive(Clone, Debug)]
struct Grant {
    namespace: Option<String>,
    subjects: Vec<Subject>,
    rule: PolicyRule,
}

/// The RBAC objects of a cluster (roles and their bindings), evaluated per request.
#[derive(Clone, Debug, Default)]
pub struct Rbac {
    grants: Vec<Grant>,
}

impl Rbac {
    /// The ClusterRoles, Roles, ClusterRoleBindings and RoleBindings in `yaml` (a multi-document
    /// stream, as `kubectl kustomize` prints it); other kinds are ignored.
    ///
    /// Errors: YAML that does not parse, an RBAC object that does not decode, a binding whose
    /// role is not in `yaml`.
    pub fn from_manifests(yaml: &str) -> anyhow::Result<Rbac> {
        use serde::Deserialize as _;
        let (mut cluster_roles, mut namespaced_roles, mut cluster_bindings, mut role_bindings) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for doc in serde_yaml_ng::Deserializer::from_str(yaml) {
            let value = serde_json::Value::deserialize(doc)?;
            match value.get("kind").and_then(serde_json::Value::as_str) {
                Some("ClusterRole") => cluster_roles.push(serde_json::from_value::<ClusterRole>(value)?),
                Some("Role") => namespaced_roles.push(serde_json::from_value::<Role>(value)?),
                Some("ClusterRoleBinding") => cluster_bindings.push(serde_json::from_value::<ClusterRoleBinding>(value)?),
                Some("RoleBinding") => role_bindings.push(serde_json::from_value::<RoleBinding>(value)?),
                _ => {}
            }
        }
        let rules_of_cluster_role = |name: &str| -> anyhow::Result<Vec<PolicyRule>> {
            let role = cluster_roles.iter().find(|r| r.metadata.name.as_deref() == Some(name)).ok_or_else(|| anyhow::anyhow!("no ClusterRole {name}"))?;
            Ok(role.rules.clone().unwrap_or_default())
        };
        let mut grants = Vec::new();
        for b in &cluster_bindings {
            anyhow::ensure!(b.role_ref.kind == "ClusterRole", "ClusterRoleBinding {:?} refers to a {}", b.metadata.name, b.role_ref.kind);
            for rule in rules_of_cluster_role(&b.role_ref.name)? {
                grants.push(Grant { namespace: None, subjects: b.subjects.clone().unwrap_or_default(), rule });
            }
        }
        for b in &role_bindings {
            let ns = b.metadata.namespace.clone().ok_or_else(|| anyhow::anyhow!("RoleBinding {:?} has no namespace", b.metadata.name))?;
            let rules = if b.role_ref.kind == "ClusterRole" {
                rules_of_cluster_role(&b.role_ref.name)?
            } else {
                let role = namespaced_roles
                    .iter()
                    .find(|r| r.metadata.name.as_deref() == Some(b.role_ref.name.as_str()) && r.metadata.namespace.as_deref() == Some(ns.as_str()))
                    .ok_or_else(|| anyhow::anyhow!("no Role {ns}/{}", b.role_ref.name))?;
                role.rules.clone().unwrap_or_default()
            };
            for rule in rules {
                grants.push(Grant { namespace: Some(ns.clone()), subjects: b.subjects.clone().unwrap_or_default(), rule });
            }
        }
        Ok(Rbac { grants })
    }

    /// Whether `user` may make the request `info`.
    pub fn allows(&self, user: &User, info: &RequestInfo) -> bool {
        if user.groups.iter().any(|g| g == "system:masters") {
            return true;
        }
        if !info.resource_request
            && info.verb == "get"
            && user.groups.iter().any(|g| g == "system:authenticated")
            && DISCOVERY_URLS.iter().any(|u| url_matches(u, &info.path))
        {
            return true;
        }
        self.grants.iter().any(|g| {
            g.subjects.iter().any(|s| subject_matches(s, user, g.namespace.as_deref()))
                && (g.namespace.is_none() || (info.resource_request && g.namespace == info.namespace))
                && rule_allows(&g.rule, info)
        })
    }

    /// The message of the API server's 403 for `user` and `info` (`nodes is forbidden: User
    /// "…" cannot list resource "nodes" in API group "" at the cluster scope`).
    pub fn forbidden_message(user: &User, info: &RequestInfo) -> String {
        if !info.resource_request {
            return format!("forbidden: User \"{}\" cannot {} path \"{}\"", user.name, info.verb, info.path);
        }
        let resource = match &info.subresource {
            Some(sub) => format!("{}/{sub}", info.resource),
            None => info.resource.clone(),
        };
        // `errors.NewForbidden` names the resource without its subresource (`pods "p" is
        // forbidden: ... cannot get resource "pods/proxy"`).
        let what = match &info.name {
            Some(name) => format!("{} \"{name}\"", info.resource),
            None => info.resource.clone(),
        };
        let scope = match &info.namespace {
            Some(ns) => format!("in the namespace \"{ns}\""),
            None => "at the cluster scope".to_owned(),
        };
        format!("{what} is forbidden: User \"{}\" cannot {} resource \"{resource}\" in API group \"{}\" {scope}", user.name, info.verb, info.api_group)
    }
}

/// The non-resource URLs `system:discovery` and `system:public-info-viewer` allow to every
/// authenticated user (bootstrappolicy `policy.go`).
const DISCOVERY_URLS: [&str; 10] = ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/readyz", "/version", "/version/", "/openapi/*"];

fn subject_matches(s: &Subject, user: &User, binding_namespace: Option<&str>) -> bool {
    match s.kind.as_str() {
        "User" => s.name == user.name,
        "Group" => user.groups.contains(&s.name),
        // A ServiceAccount subject without a namespace means the binding's (RoleBinding only).
        "ServiceAccount" => user.service_account_parts().is_some_and(|(ns, name)| name == s.name && Some(ns) == s.namespace.as_deref().or(binding_namespace)),
        _ => false,
    }
}

fn has(list: Option<&Vec<String>>, want: &str) -> bool {
    list.is_some_and(|l| l.iter().any(|x| x == want || x == "*"))
}

/// `evaluation_helpers.go` `RuleAllows`.
fn rule_allows(rule: &PolicyRule, info: &RequestInfo) -> bool {
    if !rule.verbs.iter().any(|v| *v == info.verb || v == "*") {
        return false;
    }
    if !info.resource_request {
        return rule.non_resource_urls.as_ref().is_some_and(|urls| urls.iter().any(|u| url_matches(u, &info.path)));
    }
    let combined = match &info.subresource {
        Some(sub) => format!("{}/{sub}", info.resource),
        None => info.resource.clone(),
    };
    let resource_ok = rule
        .resources
        .as_ref()
        .is_some_and(|rs| rs.iter().any(|r| *r == combined || r == "*" || info.subresource.as_ref().is_some_and(|sub| *r == format!("*/{sub}"))));
    let names_ok = match rule.resource_names.as_ref().filter(|n| !n.is_empty()) {
        None => true,
        Some(names) => info.name.as_ref().is_some_and(|n| names.contains(n)),
    };
    has(rule.api_groups.as_ref(), &info.api_group) && resource_ok && names_ok
}

/// `NonResourceURLMatches`: exact, `*`, or a `prefix*`.
fn url_matches(rule: &str, path: &str) -> bool {
    rule == "*" || rule == path || rule.strip_suffix('*').is_some_and(|prefix| path.starts_with(prefix))
}
