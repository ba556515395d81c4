//! What [`Trimmed`] decodes of realistic objects of every kind (exact values), and that it is
//! exactly what the datastore's earlier `strip()` of a whole `DynamicObject` gave the model
//! parser (kept below as the oracle).

use kube::api::{ApiResource, DynamicObject, TypeMeta};
use serde_json::{json, Value as Json};
use serde_yaml_ng::Value;

use super::super::resources::{api_resource, CalicoGroup, Watched, CALICO_RESOURCES, DAEMONSET_RESOURCE, INSTALLATION_RESOURCE, NODE_RESOURCE};
use super::super::trimmed::{CalicoNodeContainers, CalicoSpec, NodeAddresses, RoutingMode, Trimmed, TrimmedObject, NODE_ANNOTATION_PREFIX};
use crate::model::{Cluster, ClusterBuilder, Kind};

/// The datastore's `strip()` before objects were decoded trimmed (`view/trim.rs` at 7f4ca0f),
/// unchanged: what the model parser was given, and must still be given.
fn strip(kind: Kind, api: &ApiResource, obj: &mut DynamicObject) {
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
        m.annotations = None;
        let containers: Vec<Json> = obj
            .data
            .pointer("/spec/template/spec/containers")
            .and_then(Json::as_array)
            .map(|cs| {
                cs.iter()
                    .map(|c| {
                        let mut out = serde_json::Map::new();
                        for k in ["name", "env", "envFrom"] {
                            if let Some(v) = c.get(k) {
                                out.insert(k.to_owned(), v.clone());
                            }
                        }
                        Json::Object(out)
                    })
                    .collect()
            })
            .unwrap_or_default();
        obj.data = json!({ "spec": { "template": { "spec": { "containers": containers } } } });
    } else if kind == Kind::Installation {
        m.annotations = None;
        obj.data = match obj.data.pointer("/spec/calicoNetwork/clusterRoutingMode").cloned() {
            Some(mode) => json!({ "spec": { "calicoNetwork": { "clusterRoutingMode": mode } } }),
            None => json!({ "spec": {} }),
        };
    } else if kind == Kind::Node {
        if let Some(a) = &mut m.annotations {
            a.retain(|k, _| k.starts_with(NODE_ANNOTATION_PREFIX));
        }
        let addresses = obj.data.pointer("/status/addresses").cloned();
        obj.data = match addresses {
            Some(a) => json!({ "status": { "addresses": a } }),
            None => json!({}),
        };
    } else {
        m.annotations = None;
        let spec = obj.data.get("spec").cloned();
        obj.data = match spec {
            Some(s) => json!({ "spec": s }),
            None => json!({}),
        };
    }
}

/// The model input the old path built: `DynamicObject`, `strip()`, YAML value.
fn stripped(kind: Kind, api: &ApiResource, obj: &Json) -> Value {
    let mut d: DynamicObject = serde_json::from_value(obj.clone()).unwrap();
    strip(kind, api, &mut d);
    serde_yaml_ng::to_value(&d).unwrap()
}

/// Decode `obj` from its JSON text (as kube does) in the shape of `kind`.
pub(super) fn decode(kind: Kind, obj: &Json) -> TrimmedObject {
    let text = obj.to_string();
    match kind {
        Kind::Node => serde_json::from_str::<Trimmed<NodeAddresses>>(&text).unwrap().into_object(),
        Kind::DaemonSet => serde_json::from_str::<Trimmed<CalicoNodeContainers>>(&text).unwrap().into_object(),
        Kind::Installation => serde_json::from_str::<Trimmed<RoutingMode>>(&text).unwrap().into_object(),
        _ => serde_json::from_str::<Trimmed<CalicoSpec>>(&text).unwrap().into_object(),
    }
}

/// The model input the datastore builds now.
fn trimmed(kind: Kind, api: &ApiResource, obj: &Json) -> Value {
    decode(kind, obj).into_value(api)
}

fn yaml(j: &Json) -> Value {
    serde_yaml_ng::to_value(j).unwrap()
}

/// What the one model parser makes of `v`: the cluster and the errors, as text.
fn parsed(v: &Value) -> (Cluster, Vec<String>) {
    let mut b = ClusterBuilder::default();
    let errors = b.add(v).into_iter().map(|r| r.error.to_string()).collect();
    (b.finish().0, errors)
}

fn managed_fields(manager: &str, api_version: &str) -> Json {
    json!([{"manager": manager, "operation": "Update", "apiVersion": api_version, "time": "2026-11-30T08:00:00Z",
            "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}}, "f:spec": {"f:cidr": {}}}}])
}

/// A core Node as a list item (no apiVersion/kind), with everything a kubelet writes.
fn full_node() -> Json {
    json!({
        "metadata": {
            "name": "node-a", "uid": "8c5e7d1a-0000-4000-8000-000000000001", "resourceVersion": "81234",
            "creationTimestamp": "2026-11-01T00:00:00Z",
            "labels": {"kubernetes.io/hostname": "node-a", "kubernetes.io/os": "linux", "node-role.kubernetes.io/worker": ""},
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "projectcalico.org/IPv4Address": "10.0.0.11/24",
                "projectcalico.org/IPv4IPIPTunnelAddr": "10.244.1.1",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true"
            },
            "managedFields": managed_fields("kubelet", "v1")
        },
        "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"], "taints": [{"key": "k", "effect": "NoSchedule"}]},
        "status": {
            "capacity": {"cpu": "4", "memory": "16318012Ki", "pods": "110"},
            "allocatable": {"cpu": "4", "memory": "16215612Ki", "pods": "110"},
            "conditions": [
                {"type": "MemoryPressure", "status": "False", "lastHeartbeatTime": "2026-12-01T10:00:00Z", "lastTransitionTime": "2026-11-01T00:00:00Z", "reason": "KubeletHasSufficientMemory", "message": "kubelet has sufficient memory available"},
                {"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-12-01T10:00:00Z", "lastTransitionTime": "2026-11-01T00:00:00Z", "reason": "KubeletReady", "message": "kubelet is posting ready status"}
            ],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.11"}, {"type": "Hostname", "address": "node-a"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b", "kernelVersion": "6.8.0", "osImage": "Ubuntu", "containerRuntimeVersion": "containerd://1.7", "kubeletVersion": "v1.33.1", "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
            "images": [{"names": ["docker.io/calico/node@sha256:00", "docker.io/calico/node:v3.30.0"], "sizeBytes": 150_000_000}],
            "volumesInUse": [], "volumesAttached": []
        }
    })
}

fn calico_meta(name: &str, rv: &str, api_version: &str) -> Json {
    json!({"name": name, "resourceVersion": rv, "uid": format!("uid-{name}"), "generation": 3, "creationTimestamp": "2026-11-01T00:00:00Z",
           "labels": {"app": "calico"}, "annotations": {"projectcalico.org/metadata": "{\"creationTimestamp\":null}"},
           "managedFields": managed_fields("calico-node", api_version)})
}

/// An IPAM block as calico-node writes it (crd.projectcalico.org/v1).
fn full_block() -> Json {
    let v1 = CalicoGroup::CrdV1.api_version();
    let mut allocations = vec![Json::Null; 64];
    allocations[0] = json!(0);
    allocations[5] = json!(1);
    json!({
        "apiVersion": v1, "kind": "IPAMBlock", "metadata": calico_meta("10-244-1-0-26", "5511", v1),
        "spec": {
            "cidr": "10.244.1.0/26", "affinity": "host:node-a", "allocations": allocations,
            "attributes": [
                {"handle_id": "ipip-tunnel-addr-node-a", "secondary": {"node": "node-a", "type": "ipipTunnelAddress"}},
                {"handle_id": "k8s-pod-network.0123", "secondary": {"namespace": "default", "node": "node-a", "pod": "web-1", "timestamp": "2026-11-30 08:00:00 +0000 UTC"}}
            ],
            "unallocated": [1, 2, 3, 4, 6], "strictAffinity": false, "sequenceNumber": 12, "sequenceNumberForAllocation": {"0": 10, "5": 11}, "deleted": false
        }
    })
}

fn full_calico(w: Watched, group: CalicoGroup) -> Json {
    let v = group.api_version();
    let (name, spec) = match w.kind {
        Kind::IpPool => (
            "default-ipv4-ippool",
            json!({"cidr": "10.244.0.0/16", "ipipMode": "Always", "vxlanMode": "Never", "natOutgoing": true, "blockSize": 26, "nodeSelector": "all()", "allowedUses": ["Workload", "Tunnel"]}),
        ),
        Kind::IpamBlock => return full_block(),
        Kind::BlockAffinity => ("node-a-10-244-1-0-26", json!({"state": "confirmed", "node": "node-a", "cidr": "10.244.1.0/26", "deleted": "false"})),
        Kind::FelixConfiguration => {
            ("default", json!({"programClusterRoutes": "Enabled", "ipipEnabled": true, "logSeverityScreen": "Info", "reportingInterval": "0s"}))
        }
        Kind::BgpConfiguration => ("default", json!({"programClusterRoutes": "Disabled", "nodeToNodeMeshEnabled": true, "asNumber": 64512})),
        _ => ("default", json!({"calicoVersion": "v3.30.0", "clusterGUID": "f00", "clusterType": "k8s,bgp,kubeadm,kdd", "datastoreReady": true})),
    };
    json!({"apiVersion": v, "kind": super::kind_of(w.plural), "metadata": calico_meta(name, "700", v), "spec": spec, "status": {"conditions": []}})
}

fn full_daemonset() -> Json {
    json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "calico-node", "namespace": "calico-system", "resourceVersion": "4242", "uid": "u1", "generation": 2,
                     "labels": {"k8s-app": "calico-node"}, "annotations": {"deprecated.daemonset.template.generation": "2"},
                     "ownerReferences": [{"apiVersion": "operator.tigera.io/v1", "kind": "Installation", "name": "default", "uid": "i1"}],
                     "managedFields": managed_fields("operator", "apps/v1")},
        "spec": {
            "selector": {"matchLabels": {"k8s-app": "calico-node"}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {
                "metadata": {"labels": {"k8s-app": "calico-node"}, "annotations": {"hash.operator.tigera.io/cni-config": "abc"}},
                "spec": {
                    "initContainers": [{"name": "install-cni", "image": "calico/cni:v3.30.0", "env": [{"name": "CNI_CONF_NAME", "value": "10-calico.conflist"}]}],
                    "containers": [{
                        "name": "calico-node", "image": "calico/node:v3.30.0",
                        "env": [{"name": "DATASTORE_TYPE", "value": "kubernetes"}, {"name": "FELIX_PROGRAMCLUSTERROUTES", "value": "Enabled"},
                                {"name": "NODENAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}}}],
                        "envFrom": [{"configMapRef": {"name": "calico-env", "optional": true}}],
                        "resources": {}, "securityContext": {"privileged": true},
                        "volumeMounts": [{"name": "lib-modules", "mountPath": "/lib/modules", "readOnly": true}],
                        "readinessProbe": {"exec": {"command": ["/bin/calico-node", "-felix-ready"]}, "periodSeconds": 10}
                    }, {"name": "csi-sidecar", "image": "x"}],
                    "volumes": [{"name": "lib-modules", "hostPath": {"path": "/lib/modules"}}],
                    "hostNetwork": true, "serviceAccountName": "calico-node"
                }
            }
        },
        "status": {"currentNumberScheduled": 4, "numberReady": 4, "observedGeneration": 2}
    })
}

fn full_installation() -> Json {
    json!({"apiVersion": "operator.tigera.io/v1", "kind": "Installation",
           "metadata": {"name": "default", "resourceVersion": "99", "uid": "i1", "generation": 4, "finalizers": ["tigera.io/operator-cleanup"],
                        "managedFields": managed_fields("operator", "operator.tigera.io/v1")},
           "spec": {"variant": "Calico", "registry": "quay.io/", "cni": {"type": "Calico", "ipam": {"type": "Calico"}},
                    "calicoNetwork": {"bgp": "Enabled", "mtu": 1440, "clusterRoutingMode": "Felix", "ipPools": [{"cidr": "10.244.0.0/16", "encapsulation": "IPIP"}]}},
           "status": {"variant": "Calico", "computed": {"variant": "Calico"}, "conditions": [{"type": "Ready", "status": "True"}]}})
}

/// Every kind, full objects: exactly these values reach the parser.
#[test]
fn full_objects_of_every_kind_decode_to_exactly_what_the_model_reads() {
    let node_api = api_resource(CalicoGroup::CrdV1, NODE_RESOURCE);
    assert_eq!(
        trimmed(Kind::Node, &node_api, &full_node()),
        yaml(&json!({"apiVersion": "v1", "kind": "Node",
                     "metadata": {"annotations": {"projectcalico.org/IPv4Address": "10.0.0.11/24", "projectcalico.org/IPv4IPIPTunnelAddr": "10.244.1.1"},
                                  "name": "node-a", "resourceVersion": "81234"},
                     "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.11"}, {"type": "Hostname", "address": "node-a"}]}}))
    );
    let mut allocations = vec![Json::Null; 64];
    allocations[0] = json!(0);
    allocations[5] = json!(1);
    assert_eq!(
        trimmed(Kind::IpamBlock, &api_resource(CalicoGroup::CrdV1, CALICO_RESOURCES[1]), &full_block()),
        yaml(&json!({"apiVersion": "crd.projectcalico.org/v1", "kind": "IPAMBlock", "metadata": {"name": "10-244-1-0-26", "resourceVersion": "5511"},
                     "spec": {"cidr": "10.244.1.0/26", "affinity": "host:node-a", "allocations": allocations,
                              "attributes": [
                                  {"handle_id": "ipip-tunnel-addr-node-a", "secondary": {"node": "node-a", "type": "ipipTunnelAddress"}},
                                  {"handle_id": "k8s-pod-network.0123", "secondary": {"namespace": "default", "node": "node-a", "pod": "web-1", "timestamp": "2026-11-30 08:00:00 +0000 UTC"}}
                              ],
                              "unallocated": [1, 2, 3, 4, 6], "strictAffinity": false, "sequenceNumber": 12, "sequenceNumberForAllocation": {"0": 10, "5": 11}, "deleted": false}}))
    );
    let pools = api_resource(CalicoGroup::V3, CALICO_RESOURCES[0]);
    assert_eq!(
        trimmed(Kind::IpPool, &pools, &full_calico(CALICO_RESOURCES[0], CalicoGroup::V3)),
        yaml(&json!({"apiVersion": "projectcalico.org/v3", "kind": "IPPool", "metadata": {"name": "default-ipv4-ippool", "resourceVersion": "700"},
                     "spec": {"cidr": "10.244.0.0/16", "ipipMode": "Always", "vxlanMode": "Never", "natOutgoing": true, "blockSize": 26, "nodeSelector": "all()", "allowedUses": ["Workload", "Tunnel"]}}))
    );
    let ds_api = api_resource(CalicoGroup::CrdV1, DAEMONSET_RESOURCE);
    assert_eq!(
        trimmed(Kind::DaemonSet, &ds_api, &full_daemonset()),
        yaml(
            &json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "calico-node", "namespace": "calico-system", "resourceVersion": "4242"},
                     "spec": {"template": {"spec": {"containers": [
                         {"name": "calico-node",
                          "env": [{"name": "DATASTORE_TYPE", "value": "kubernetes"}, {"name": "FELIX_PROGRAMCLUSTERROUTES", "value": "Enabled"},
                                  {"name": "NODENAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}}}],
                          "envFrom": [{"configMapRef": {"name": "calico-env", "optional": true}}]},
                         {"name": "csi-sidecar"}]}}}})
        )
    );
    let inst_api = api_resource(CalicoGroup::CrdV1, INSTALLATION_RESOURCE);
    assert_eq!(
        trimmed(Kind::Installation, &inst_api, &full_installation()),
        yaml(&json!({"apiVersion": "operator.tigera.io/v1", "kind": "Installation", "metadata": {"name": "default", "resourceVersion": "99"},
                     "spec": {"calicoNetwork": {"clusterRoutingMode": "Felix"}}}))
    );
}

/// For every kind, full objects and odd ones (parts missing, `null`, a foreign type where a
/// mapping or list belongs): the value equals the old `strip()`'s, and so does what the model
/// parser makes of it.
#[test]
fn trimmed_values_equal_what_strip_gave_for_every_kind() {
    let mut cases: Vec<(Kind, ApiResource, Json)> = Vec::new();
    for group in [CalicoGroup::CrdV1, CalicoGroup::V3] {
        for w in CALICO_RESOURCES {
            let full = full_calico(w, group);
            let mut no_spec = full.clone();
            no_spec.as_object_mut().unwrap().remove("spec");
            let mut null_spec = full.clone();
            null_spec["spec"] = Json::Null;
            let mut bad_spec = full.clone();
            bad_spec["spec"]["cidr"] = json!(["not", "a", "cidr"]);
            for obj in [full, no_spec, null_spec, bad_spec] {
                cases.push((w.kind, api_resource(group, w), obj));
            }
        }
    }
    let node_api = api_resource(CalicoGroup::CrdV1, NODE_RESOURCE);
    let full = full_node();
    let edit = |f: &dyn Fn(&mut Json)| {
        let mut n = full.clone();
        f(&mut n);
        n
    };
    for obj in [
        full.clone(),
        edit(&|n| drop(n["metadata"].as_object_mut().unwrap().remove("annotations"))),
        edit(&|n| n["metadata"]["annotations"] = json!({"node.alpha.kubernetes.io/ttl": "0"})),
        edit(&|n| n["metadata"]["annotations"]["projectcalico.org/IPv4Address"] = json!("banana")),
        edit(&|n| drop(n.as_object_mut().unwrap().remove("status"))),
        edit(&|n| n["status"] = Json::Null),
        edit(&|n| n["status"] = json!("up")),
        edit(&|n| n["status"]["addresses"] = Json::Null),
        edit(&|n| n["status"]["addresses"] = json!({"type": "InternalIP"})),
        edit(&|n| {
            n["apiVersion"] = json!("v1");
            n["kind"] = json!("Node");
        }),
    ] {
        cases.push((Kind::Node, node_api.clone(), obj));
    }
    let ds_api = api_resource(CalicoGroup::CrdV1, DAEMONSET_RESOURCE);
    let full = full_daemonset();
    let edit = |f: &dyn Fn(&mut Json)| {
        let mut n = full.clone();
        f(&mut n);
        n
    };
    for obj in [
        full.clone(),
        edit(&|d| drop(d.as_object_mut().unwrap().remove("spec"))),
        edit(&|d| d["spec"]["template"] = json!("x")),
        edit(&|d| d["spec"]["template"]["spec"]["containers"] = json!({"name": "calico-node"})),
        edit(&|d| d["spec"]["template"]["spec"]["containers"] = json!(["calico-node", 3, null, {"env": null}])),
        edit(&|d| d["spec"]["template"]["spec"]["containers"][0]["env"] = json!([{"name": "FELIX_PROGRAMCLUSTERROUTES", "value": 7}])),
    ] {
        cases.push((Kind::DaemonSet, ds_api.clone(), obj));
    }
    let inst_api = api_resource(CalicoGroup::CrdV1, INSTALLATION_RESOURCE);
    let full = full_installation();
    let edit = |f: &dyn Fn(&mut Json)| {
        let mut n = full.clone();
        f(&mut n);
        n
    };
    for obj in [
        full.clone(),
        edit(&|i| drop(i.as_object_mut().unwrap().remove("spec"))),
        edit(&|i| drop(i["spec"].as_object_mut().unwrap().remove("calicoNetwork"))),
        edit(&|i| i["spec"]["calicoNetwork"]["clusterRoutingMode"] = Json::Null),
        edit(&|i| i["spec"]["calicoNetwork"]["clusterRoutingMode"] = json!(["BIRD"])),
        edit(&|i| i["spec"]["calicoNetwork"] = json!(true)),
    ] {
        cases.push((Kind::Installation, inst_api.clone(), obj));
    }
    assert_eq!(cases.len(), 48 + 10 + 6 + 6);
    for (kind, api, obj) in &cases {
        let (old, new) = (stripped(*kind, api, obj), trimmed(*kind, api, obj));
        assert_eq!(new, old, "{kind} {obj}");
        assert_eq!(parsed(&new), parsed(&old), "{kind} {obj}");
    }
}

/// What `strip()` kept and the model never reads (`deletionTimestamp`,
/// `deletionGracePeriodSeconds` of an object being deleted) is no longer decoded: the values
/// differ by exactly those fields, and the parser makes the same of both.
#[test]
fn deletion_fields_strip_kept_are_not_read_and_change_no_parse() {
    let node_api = api_resource(CalicoGroup::CrdV1, NODE_RESOURCE);
    let mut deleting = full_node();
    deleting["metadata"]["deletionTimestamp"] = json!("2026-12-01T10:00:00Z");
    deleting["metadata"]["deletionGracePeriodSeconds"] = json!(0);
    deleting["metadata"]["finalizers"] = json!(["example.com/hold"]);
    let old = stripped(Kind::Node, &node_api, &deleting);
    let new = trimmed(Kind::Node, &node_api, &deleting);
    let mut old_without = old.clone();
    let meta = old_without.get_mut("metadata").and_then(Value::as_mapping_mut).unwrap();
    assert_eq!(meta.remove("deletionTimestamp"), Some(Value::String("2026-12-01T10:00:00Z".into())));
    assert_eq!(meta.remove("deletionGracePeriodSeconds"), Some(Value::Number(0.into())));
    assert_eq!(new, old_without);
    let (cluster, errors) = parsed(&new);
    assert_eq!((cluster.nodes.keys().map(|k| &**k).collect::<Vec<_>>(), errors.len()), (vec!["node-a"], 0));
    assert_eq!(parsed(&new), parsed(&old));
}

/// Through kube's own list and watch-event types (the watcher's decode path), and the
/// hash: equal for a heartbeat (conditions, images and resourceVersion changed), different
/// for an annotation or address change.
#[test]
fn lists_and_watch_events_decode_trimmed_and_the_hash_ignores_heartbeats() {
    let list = json!({"apiVersion": "v1", "kind": "NodeList", "metadata": {"resourceVersion": "90000"}, "items": [full_node(), full_node()]});
    let decoded: kube::core::ObjectList<Trimmed<NodeAddresses>> = serde_json::from_str(&list.to_string()).unwrap();
    assert_eq!(decoded.metadata.resource_version.as_deref(), Some("90000"));
    assert_eq!(decoded.items.iter().map(|t| t.object.clone()).collect::<Vec<_>>(), vec![decode(Kind::Node, &full_node()); 2]);
    let ev = json!({"type": "MODIFIED", "object": full_calico(CALICO_RESOURCES[0], CalicoGroup::CrdV1)});
    let kube::core::WatchEvent::Modified(t) = serde_json::from_str::<kube::core::WatchEvent<Trimmed<CalicoSpec>>>(&ev.to_string()).unwrap() else {
        panic!("expected Modified")
    };
    assert_eq!(t.into_object(), decode(Kind::IpPool, &full_calico(CALICO_RESOURCES[0], CalicoGroup::CrdV1)));

    let base = decode(Kind::Node, &full_node());
    let mut beat = full_node();
    beat["metadata"]["resourceVersion"] = json!("81299");
    beat["metadata"]["managedFields"][0]["time"] = json!("2026-12-01T10:00:40Z");
    beat["status"]["conditions"][1]["lastHeartbeatTime"] = json!("2026-12-01T10:00:40Z");
    beat["status"]["images"] = json!([]);
    let beat = decode(Kind::Node, &beat);
    assert_eq!(beat.metadata.resource_version.as_deref(), Some("81299"));
    assert_eq!(beat.content_hash(), base.content_hash());
    let mut moved = full_node();
    moved["metadata"]["annotations"]["projectcalico.org/IPv4Address"] = json!("10.0.1.11/24");
    assert_ne!(decode(Kind::Node, &moved).content_hash(), base.content_hash());
    let mut readdressed = full_node();
    readdressed["status"]["addresses"][0]["address"] = json!("10.0.0.12");
    assert_ne!(decode(Kind::Node, &readdressed).content_hash(), base.content_hash());
}
