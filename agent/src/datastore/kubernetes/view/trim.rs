//! What a store keeps of an object: only what the model reads ([`strip`]), so Node status
//! heartbeats change nothing and memory stays small.

use kube::api::{ApiResource, DynamicObject, TypeMeta};

use crate::model::Kind;

/// Annotation prefix the model reads on core Nodes (`libcalico-go/lib/backend/k8s/resources/node.go`).
const NODE_ANNOTATION_PREFIX: &str = "projectcalico.org/";

/// Keep only what the model reads, and give every object its `apiVersion`/`kind` (list items
/// of core types come without them).
///
/// - Calico kinds: `metadata.name`, `metadata.resourceVersion`, `spec`.
/// - Nodes: the same metadata plus `projectcalico.org/*` annotations, and `status.addresses`.
pub(crate) fn strip(kind: Kind, api: &ApiResource, obj: &mut DynamicObject) {
    obj.types = Some(TypeMeta { api_version: api.api_version.clone(), kind: api.kind.clone() });
    let m = &mut obj.metadata;
    m.managed_fields = None;
    m.labels = None;
    m.owner_references = None;
    m.finalizers = None;
    m.generate_name = None;
    m.creation_timestamp = None;
    m.uid = None;
    m.generation = None;
    if kind == Kind::DaemonSet {
        // Only the containers' names, env and envFrom (what Felix's value can depend on).
        m.annotations = None;
        let containers: Vec<serde_json::Value> = obj
            .data
            .pointer("/spec/template/spec/containers")
            .and_then(serde_json::Value::as_array)
            .map(|cs| {
                cs.iter()
                    .map(|c| {
                        let mut out = serde_json::Map::new();
                        for k in ["name", "env", "envFrom"] {
                            if let Some(v) = c.get(k) {
                                out.insert(k.to_owned(), v.clone());
                            }
                        }
                        serde_json::Value::Object(out)
                    })
                    .collect()
            })
            .unwrap_or_default();
        obj.data = serde_json::json!({ "spec": { "template": { "spec": { "containers": containers } } } });
    } else if kind == Kind::Installation {
        m.annotations = None;
        obj.data = match obj.data.pointer("/spec/calicoNetwork/clusterRoutingMode").cloned() {
            Some(mode) => serde_json::json!({ "spec": { "calicoNetwork": { "clusterRoutingMode": mode } } }),
            None => serde_json::json!({ "spec": {} }),
        };
    } else if kind == Kind::Node {
        if let Some(a) = &mut m.annotations {
            a.retain(|k, _| k.starts_with(NODE_ANNOTATION_PREFIX));
        }
        let addresses = obj.data.pointer("/status/addresses").cloned();
        obj.data = match addresses {
            Some(a) => serde_json::json!({ "status": { "addresses": a } }),
            None => serde_json::json!({}),
        };
    } else {
        m.annotations = None;
        let spec = obj.data.get("spec").cloned();
        obj.data = match spec {
            Some(s) => serde_json::json!({ "spec": s }),
            None => serde_json::json!({}),
        };
    }
}
