//! The example cluster (`examples/cluster`) as a Kubernetes-datastore cluster serves it, loaded
//! into the API-server stand-in.
//!
//! The Calico Node → core Node conversion is the agent's own
//! (`routewarden::datastore::kubernetes::calico_node`, feature `test-support`), which its unit
//! tests use too.

use std::path::Path;

use serde_json::{json, Value};

use crate::standin::{ApiServer, ResourceType};

/// The Calico resources the agent watches, as (plural, kind): the agent's own table.
pub fn calico() -> impl Iterator<Item = (&'static str, &'static str)> {
    routewarden::datastore::kubernetes::CALICO_RESOURCES.iter().map(|w| (w.plural, w.kind.as_str()))
}

/// Core `v1` Nodes.
pub fn nodes_type() -> ResourceType {
    ResourceType::new("v1", "Node", "nodes", false)
}

/// `apps/v1` DaemonSets (namespaced).
pub fn daemonsets_type() -> ResourceType {
    ResourceType::new("apps/v1", "DaemonSet", "daemonsets", true)
}

/// Every document of a YAML stream, as JSON.
///
/// # Panics
/// When a document does not parse.
pub fn documents(yaml: &str) -> Vec<Value> {
    use serde::Deserialize as _;
    serde_yaml_ng::Deserializer::from_str(yaml).map(|d| Value::deserialize(d).unwrap()).collect()
}

/// Serve the example cluster in `dir` from `api` as a Kubernetes-datastore cluster serves it:
/// Calico kinds in `crd.projectcalico.org/v1`, Calico Nodes as core Nodes with the
/// `projectcalico.org/*` annotations calico-node writes (libcalico-go
/// `lib/backend/k8s/resources/node.go`), and calico-node's DaemonSet in kube-system (its env
/// without FELIX_PROGRAMCLUSTERROUTES, so FelixConfiguration decides).
///
/// # Panics
/// When a file of the example does not read or parse, or the stand-in refuses an object.
pub fn serve_example(api: &ApiServer, dir: &Path) {
    for (plural, kind) in calico() {
        api.register(&ResourceType::new("crd.projectcalico.org/v1", kind, plural, false));
    }
    api.register(&nodes_type());
    api.register(&daemonsets_type());
    let mut items = Vec::new();
    for f in ["calico.yaml", "ipam.yaml", "nodes.yaml"] {
        for doc in documents(&std::fs::read_to_string(dir.join(f)).unwrap()) {
            match doc.get("items") {
                Some(Value::Array(list)) => items.extend(list.iter().cloned()),
                _ => items.push(doc),
            }
        }
    }
    for item in items {
        let kind = item["kind"].as_str().unwrap();
        let name = item["metadata"]["name"].as_str().unwrap();
        if kind == "Node" {
            let (annotations, addresses) = routewarden::datastore::kubernetes::calico_node::core_node_fields(&item);
            let node =
                json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}, "annotations": annotations}, "status": {"addresses": addresses}});
            api.create(&nodes_type(), node).unwrap();
        } else {
            let (plural, kind) = calico().find(|(_, k)| *k == kind).unwrap();
            let rt = ResourceType::new("crd.projectcalico.org/v1", kind, plural, false);
            api.create(&rt, json!({"metadata": {"name": name}, "spec": item["spec"]})).unwrap();
        }
    }
    let env = json!([{"name": "DATASTORE_TYPE", "value": "kubernetes"}, {"name": "CALICO_NETWORKING_BACKEND", "value": "bird"}, {"name": "CALICO_IPV4POOL_IPIP", "value": "CrossSubnet"}]);
    let ds = json!({"metadata": {"name": "calico-node", "namespace": "kube-system", "labels": {"k8s-app": "calico-node"}},
        "spec": {"selector": {"matchLabels": {"k8s-app": "calico-node"}}, "template": {"spec": {"containers": [{"name": "calico-node", "image": "docker.io/calico/node:v3.33.0", "env": env}]}}}});
    api.create(&daemonsets_type(), ds).unwrap();
}
