//! The objects besides FelixConfiguration and BGPConfiguration that change how a cluster
//! decides cluster-route ownership (reference §1.3, §1.4, §1.9):
//!
//! - [`ClusterInformation`] `default`: the Calico release the cluster runs
//!   (`spec.calicoVersion`, e.g. `v3.30.2`), which decides which fields exist and their
//!   defaults;
//! - the calico-node [`CalicoNodeDaemonSet`]'s container environment: Felix reads
//!   `FELIX_PROGRAMCLUSTERROUTES` before any datastore object (`felix/config/env_var_loader.go`,
//!   `config_params.go` `SourcesInDescendingOrder`);
//! - the operator's [`Installation`] `default`: `spec.calicoNetwork.clusterRoutingMode`, from
//!   which tigera/operator writes both fields (`pkg/controller/installation/core_controller.go`).
//!
//! Only the fields that matter are read; everything else in these (large) objects is ignored.
//! Pure: no I/O.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_yaml_ng::Value;

use super::error::{FieldProblem, ModelError};
use super::fields::{get_in, path_label, type_name, Fields};

/// The name of Calico's node DaemonSet, in `calico-system` (operator installs) and
/// `kube-system` (manifest installs).
pub const CALICO_NODE: &str = "calico-node";

/// The namespaces routewarden looks for the calico-node DaemonSet in, the preferred first
/// (the operator migrates a manifest install from `kube-system` to `calico-system`).
pub const CALICO_NODE_NAMESPACES: [&str; 2] = ["calico-system", "kube-system"];

/// The environment variable Felix reads `programClusterRoutes` from. Felix matches the name in
/// any case: `env_var_loader.go` lower-cases every variable and strips the `felix_` prefix.
pub const FELIX_ENV: &str = "FELIX_PROGRAMCLUSTERROUTES";

/// A source besides the Calico objects that the Kubernetes datastore reads when the API
/// serves it and RBAC allows it; without it the decision is still made, with a finding
/// (`source-unreadable`) saying what could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(tag = "source", content = "namespace", rename_all = "kebab-case")]
pub enum OptionalSource {
    /// The calico-node DaemonSet in this namespace (`FELIX_PROGRAMCLUSTERROUTES`).
    CalicoNodeEnv(&'static str),
    /// The operator's `Installation default` (`clusterRoutingMode`).
    Installation,
}

impl OptionalSource {
    /// `calico-node env (kube-system/calico-node)`, `Installation default`.
    pub fn label(self) -> String {
        match self {
            OptionalSource::CalicoNodeEnv(ns) => format!("calico-node env ({})", CalicoNodeDaemonSet::key(ns)),
            OptionalSource::Installation => "Installation default".to_owned(),
        }
    }
}

/// What API discovery, run again while the Kubernetes datastore runs, found changed since it
/// started: the findings `source-withdrawn` and `api-group-changed`. Empty from the other
/// datastores and until something changed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ApiChanges {
    /// Optional sources that were read and whose API group is no longer served, each with that
    /// `group/version` (`operator.tigera.io/v1`): what they said is no longer in the cluster.
    /// A source read again when its group comes back leaves this map.
    #[serde(skip_serializing_if = "BTreeMap::is_empty", serialize_with = "serialize_withdrawn")]
    pub withdrawn: BTreeMap<OptionalSource, &'static str>,
    /// `--calico-api-group auto` would now choose another Calico group than the one read:
    /// routewarden keeps reading the one it chose at start until a restart (as Calico's own
    /// components, which discover the group once, `libcalico-go/lib/backend/k8s/discovery.go`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calico_group: Option<CalicoGroupChange>,
}

/// The Calico group read, and the one discovery would choose now (`apiVersion` form).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct CalicoGroupChange {
    /// `crd.projectcalico.org/v1`.
    pub read: &'static str,
    /// `projectcalico.org/v3`.
    pub discovered: &'static str,
}

impl ApiChanges {
    /// Nothing changed.
    pub fn is_empty(&self) -> bool {
        self.withdrawn.is_empty() && self.calico_group.is_none()
    }
}

/// `withdrawn` as `{"Installation default": "operator.tigera.io/v1"}`: JSON map keys are strings.
fn serialize_withdrawn<S: serde::Serializer>(withdrawn: &BTreeMap<OptionalSource, &'static str>, s: S) -> Result<S::Ok, S::Error> {
    s.collect_map(withdrawn.iter().map(|(k, v)| (k.label(), v)))
}

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
    pub(crate) fn parse(f: &mut Fields<'_>, name: &str) -> Result<ClusterInformation, Vec<ModelError>> {
        let calico_version = f.string(&["spec", "calicoVersion"]).map(str::to_owned);
        let variant = f.string(&["spec", "variant"]).map(str::to_owned);
        f.take_result(ClusterInformation { name: name.to_owned(), calico_version, variant })
    }
}

/// The operator's `Installation` (`operator.tigera.io/v1`, tigera/operator
/// `api/v1/installation_types.go`); only `default` is reconciled.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Installation {
    pub name: String,
    /// `spec.calicoNetwork.clusterRoutingMode`, raw (`BIRD`, `Felix`, `FelixIPIPOnly`; absent:
    /// the operator writes neither field).
    pub cluster_routing_mode: Option<String>,
}

impl Installation {
    pub(crate) fn parse(f: &mut Fields<'_>, name: &str) -> Result<Installation, Vec<ModelError>> {
        let cluster_routing_mode = f.string(&["spec", "calicoNetwork", "clusterRoutingMode"]).map(str::to_owned);
        f.take_result(Installation { name: name.to_owned(), cluster_routing_mode })
    }
}

/// Where an environment variable's value comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "from", content = "value", rename_all = "kebab-case")]
pub enum EnvValue {
    /// `value:` (absent means the empty string, as Kubernetes reads it).
    Literal(String),
    /// `valueFrom:` a ConfigMap, Secret or field, described (`configMapKeyRef calico-config/x`):
    /// routewarden does not read those objects, so the value is unknown.
    Reference(String),
}

/// `FELIX_PROGRAMCLUSTERROUTES` as the calico-node container sets it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EnvSetting {
    /// The variable's name as written (Felix matches it in any case).
    pub name: String,
    pub value: EnvValue,
}

/// The calico-node DaemonSet, reduced to what Felix's value can depend on: the
/// `calico-node` container's `FELIX_PROGRAMCLUSTERROUTES` and its `envFrom` sources.
/// DaemonSets of any other name are not read at all.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CalicoNodeDaemonSet {
    /// `metadata.namespace` (empty when the object has none).
    pub namespace: String,
    /// `spec.template.spec.containers[name=calico-node]` exists.
    pub container_found: bool,
    /// The last `env` entry whose name is `FELIX_PROGRAMCLUSTERROUTES` in any case (a later
    /// entry of one name overrides an earlier one in the kubelet; between spellings of
    /// different case the last one is taken [inferred]).
    pub program_cluster_routes: Option<EnvSetting>,
    /// `envFrom` sources (`configMapRef calico-env`): a variable from them is not seen.
    pub env_from: Vec<String>,
}

impl CalicoNodeDaemonSet {
    /// `namespace/name` (the key in [`Cluster::calico_node_daemonsets`](super::Cluster::calico_node_daemonsets)).
    pub fn key(namespace: &str) -> String {
        if namespace.is_empty() {
            CALICO_NODE.to_owned()
        } else {
            format!("{namespace}/{CALICO_NODE}")
        }
    }

    /// `DaemonSet calico-system/calico-node`.
    pub fn label(&self) -> String {
        format!("DaemonSet {}", CalicoNodeDaemonSet::key(&self.namespace))
    }

    pub(crate) fn parse(f: &mut Fields<'_>, namespace: &str) -> Result<CalicoNodeDaemonSet, Vec<ModelError>> {
        let mut ds = CalicoNodeDaemonSet { namespace: namespace.to_owned(), container_found: false, program_cluster_routes: None, env_from: Vec::new() };
        let containers = f.seq(&["spec", "template", "spec", "containers"]);
        let base = path_label(&["spec", "template", "spec", "containers"]);
        let Some((index, container)) = containers.iter().enumerate().find(|(_, c)| c.get("name").and_then(Value::as_str) == Some(CALICO_NODE)) else {
            return f.take_result(ds);
        };
        ds.container_found = true;
        let at = format!("{base}[{index}]");
        match container.get("env") {
            None | Some(Value::Null) => {}
            Some(Value::Sequence(env)) => {
                for (i, e) in env.iter().enumerate() {
                    let field = format!("{at}.env[{i}]");
                    let Some(name) = e.get("name").and_then(Value::as_str) else {
                        let found = e.get("name").map_or("nothing", type_name);
                        f.fail(format!("{field}.name"), FieldProblem::WrongType { expected: "string", found });
                        continue;
                    };
                    if !name.eq_ignore_ascii_case(FELIX_ENV) {
                        continue;
                    }
                    let value = match (e.get("value"), e.get("valueFrom")) {
                        (_, Some(from)) if !from.is_null() => EnvValue::Reference(describe_value_from(from)),
                        (None | Some(Value::Null), _) => EnvValue::Literal(String::new()),
                        (Some(Value::String(s)), _) => EnvValue::Literal(s.clone()),
                        (Some(other), _) => {
                            f.fail(format!("{field}.value"), FieldProblem::WrongType { expected: "string", found: type_name(other) });
                            continue;
                        }
                    };
                    ds.program_cluster_routes = Some(EnvSetting { name: name.to_owned(), value });
                }
            }
            Some(other) => f.fail(format!("{at}.env"), FieldProblem::WrongType { expected: "list", found: type_name(other) }),
        }
        if let Some(Value::Sequence(from)) = container.get("envFrom") {
            ds.env_from = from.iter().map(describe_env_from).collect();
        }
        f.take_result(ds)
    }
}

/// `configMapKeyRef calico-config/key`, `secretKeyRef s/k`, `fieldRef metadata.name`, ...
fn describe_value_from(from: &Value) -> String {
    let Value::Mapping(m) = from else {
        return format!("valueFrom ({})", type_name(from));
    };
    let Some((Value::String(kind), spec)) = m.iter().next() else {
        return "valueFrom".to_owned();
    };
    let get = |k: &str| get_in(spec, &[k]).ok().flatten().and_then(Value::as_str).unwrap_or("?");
    match kind.as_str() {
        "configMapKeyRef" | "secretKeyRef" => format!("{kind} {}/{}", get("name"), get("key")),
        "fieldRef" => format!("{kind} {}", get("fieldPath")),
        "resourceFieldRef" => format!("{kind} {}", get("resource")),
        other => other.to_owned(),
    }
}

/// `configMapRef calico-env`, `secretRef s` (with `prefix P` when set).
fn describe_env_from(from: &Value) -> String {
    let prefix = from.get("prefix").and_then(Value::as_str).filter(|p| !p.is_empty());
    let source = ["configMapRef", "secretRef"]
        .iter()
        .find_map(|k| from.get(*k).map(|r| format!("{k} {}", r.get("name").and_then(Value::as_str).unwrap_or("?"))))
        .unwrap_or_else(|| "envFrom".to_owned());
    match prefix {
        Some(p) => format!("{source} (prefix {p})"),
        None => source,
    }
}
