//! A Calico `Node` (`projectcalico.org/v3`, as `calicoctl get -o yaml` prints it) as the core
//! `Node` a Kubernetes-datastore cluster serves in its place, for tests that serve a cluster
//! written in calicoctl's format (the agent's unit tests, and `routewarden_lab::example` with
//! this crate's `test-support` feature). The agent itself only reads core Nodes.
//!
//! calico-node keeps a Calico Node's BGP fields as `projectcalico.org/*` annotations of the
//! core Node (libcalico-go `lib/backend/k8s/resources/node.go`); its addresses are the
//! kubelet's `status.addresses`.

use serde_json::{json, Value};

/// The `metadata.annotations` and `status.addresses` of the core Node that stands for `item`:
/// a core `v1` Node's own; for a Calico Node, `spec.bgp`'s `ipv4Address`, `ipv6Address` and
/// `ipv4IPIPTunnelAddr` as `projectcalico.org/IPv4Address`, `IPv6Address` and
/// `IPv4IPIPTunnelAddr`, and its `InternalIP` addresses (none when it lists no addresses).
#[must_use]
pub fn core_node_fields(item: &Value) -> (Value, Value) {
    if item["apiVersion"] == "v1" {
        return (item["metadata"]["annotations"].clone(), item["status"]["addresses"].clone());
    }
    let bgp = &item["spec"]["bgp"];
    let mut annotations = json!({});
    for (field, key) in [("ipv4Address", "IPv4Address"), ("ipv6Address", "IPv6Address"), ("ipv4IPIPTunnelAddr", "IPv4IPIPTunnelAddr")] {
        if let Some(v) = bgp.get(field) {
            annotations[format!("projectcalico.org/{key}")] = v.clone();
        }
    }
    let addresses: Vec<Value> =
        item["spec"]["addresses"].as_array().map(|a| a.iter().filter(|x| x["type"] == "InternalIP").cloned().collect()).unwrap_or_default();
    (annotations, Value::Array(addresses))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_calico_nodes_bgp_fields_become_annotations_and_its_internal_ips_its_addresses() {
        let calico = json!({"apiVersion": "projectcalico.org/v3", "kind": "Node", "metadata": {"name": "a"},
            "spec": {"bgp": {"ipv4Address": "10.0.0.11/24", "ipv4IPIPTunnelAddr": "10.244.10.1"},
                     "addresses": [{"address": "10.0.0.11", "type": "InternalIP"}, {"address": "1.2.3.4", "type": "ExternalIP"}]}});
        assert_eq!(
            core_node_fields(&calico),
            (
                json!({"projectcalico.org/IPv4Address": "10.0.0.11/24", "projectcalico.org/IPv4IPIPTunnelAddr": "10.244.10.1"}),
                json!([{"address": "10.0.0.11", "type": "InternalIP"}])
            )
        );
        let core = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "b", "annotations": {"x": "y"}}, "status": {"addresses": [{"address": "10.0.0.12", "type": "InternalIP"}]}});
        assert_eq!(core_node_fields(&core), (json!({"x": "y"}), json!([{"address": "10.0.0.12", "type": "InternalIP"}])));
        assert_eq!(core_node_fields(&json!({"kind": "Node", "spec": {}})), (json!({}), json!([])));
    }
}
