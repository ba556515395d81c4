//! Whole objects: Node lists, definitions made twice, FelixConfiguration scopes, and the
//! ownership inputs (ClusterInformation, Installation, the calico-node DaemonSet's env).

use super::*;

/// `kubectl get nodes -o yaml` (core v1, a List) and `calicoctl get nodes -o yaml` (a
/// NodeList) both load, with next hops chosen BGP > InternalIP > ExternalIP per family.
#[test]
fn core_and_calico_node_lists() {
    let text = r#"
apiVersion: v1
kind: List
items:
  - apiVersion: v1
    kind: Node
    metadata:
      name: node-b
      annotations:
        projectcalico.org/IPv4Address: 10.0.0.12/24
        projectcalico.org/IPv6Address: fd00:10::12/64
        projectcalico.org/IPv4IPIPTunnelAddr: 10.244.20.1
        projectcalico.org/ASNumber: "64512"
    status:
      addresses:
        - {type: InternalIP, address: 10.0.0.12}
        - {type: Hostname, address: node-b}
  - apiVersion: v1
    kind: Node
    metadata: {name: node-e}
    status:
      addresses:
        - {type: ExternalIP, address: 203.0.113.5}
        - {type: InternalIP, address: 10.0.2.15}
        - {type: InternalIP, address: "fd00:20::15"}
---
apiVersion: projectcalico.org/v3
kind: NodeList
items:
  - metadata: {name: node-c}
    spec:
      bgp: {ipv4Address: 10.0.0.13/24}
      addresses: [{address: 10.0.0.13/24, type: CalicoNodeIP}]
"#;
    let (cluster, errors) = load(text);
    assert_eq!(errors, vec![]);
    let b = &cluster.nodes["node-b"];
    assert_eq!(b.form, NodeForm::Kubernetes);
    assert_eq!(b.next_hop(false), Some((ip("10.0.0.12"), NodeAddressSource::Bgp)));
    assert_eq!(b.next_hop(true), Some((ip("fd00:10::12"), NodeAddressSource::Bgp)));
    assert_eq!(b.subnet(false), Some("10.0.0.0/24".parse().unwrap()));
    assert_eq!(b.ipv4_ipip_tunnel_addr, Some(ip("10.244.20.1")));
    assert_eq!(b.as_number, Some(64512));
    let e = &cluster.nodes["node-e"];
    assert_eq!(e.next_hop(false), Some((ip("10.0.2.15"), NodeAddressSource::InternalIp)));
    assert_eq!(e.next_hop(true), Some((ip("fd00:20::15"), NodeAddressSource::InternalIp)));
    assert_eq!(e.subnet(false), None);
    let c = &cluster.nodes["node-c"];
    assert_eq!(c.form, NodeForm::Calico);
    assert_eq!(c.next_hop(false), Some((ip("10.0.0.13"), NodeAddressSource::Bgp)));
    assert_eq!(c.next_hop(true), None);
}

/// An object defined twice is refused in every definition (the first one won, so a
/// later file that sorts first could rewrite routes through its values). A Node too: none of
/// its definitions decides a route.
#[test]
fn duplicates_refuse_every_definition() {
    let text = "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: p}\nspec: {cidr: 10.1.0.0/16}\n---\napiVersion: crd.projectcalico.org/v1\nkind: IPPool\nmetadata: {name: p}\nspec: {cidr: 10.2.0.0/16}\n---\napiVersion: projectcalico.org/v3\nkind: Node\nmetadata: {name: n}\nspec: {bgp: {ipv4Address: 10.0.0.1/24}}\n---\napiVersion: projectcalico.org/v3\nkind: Node\nmetadata: {name: n}\nspec: {bgp: {ipv4Address: 10.0.0.99/24}}\n";
    let (cluster, errors) = load(text);
    let dup = |kind, name: &str| ModelError::Duplicate { kind, name: name.into() };
    assert_eq!(errors, vec![dup(Kind::IpPool, "p"), dup(Kind::Node, "n"), dup(Kind::IpPool, "p"), dup(Kind::Node, "n")]);
    assert!(cluster.ip_pools.is_empty() && cluster.nodes.is_empty());
}

#[test]
fn felix_configuration_scopes_and_fields() {
    let text = "apiVersion: projectcalico.org/v3\nkind: FelixConfiguration\nmetadata: {name: default}\nspec: {programClusterRoutes: enabled, routeRefreshInterval: 1m30s, deviceRouteProtocol: 3, ipv4NormalRoutePriority: 1024, removeExternalRoutes: true}\n---\napiVersion: projectcalico.org/v3\nkind: FelixConfiguration\nmetadata: {name: node.node-a}\nspec: {}\n";
    let (cluster, errors) = load(text);
    assert_eq!(errors, vec![]);
    let d = cluster.felix_default().unwrap();
    assert_eq!(d.scope, FelixScope::Global);
    assert_eq!(d.program_cluster_routes.as_deref(), Some("enabled"));
    assert_eq!(d.route_refresh_interval, Some(std::time::Duration::from_secs(90)));
    assert_eq!((d.device_route_protocol, d.ipv4_normal_route_priority, d.remove_external_routes), (Some(3), Some(1024), Some(true)));
    assert_eq!(cluster.felix_for_node("node-a").unwrap().scope, FelixScope::Node("node-a".into()));
}

/// ClusterInformation in both Calico groups and without an apiVersion (calicoctl); only the
/// fields routewarden reads.
#[test]
fn cluster_information_in_both_groups() {
    for group in ["crd.projectcalico.org/v1", "projectcalico.org/v3"] {
        let text = format!("apiVersion: {group}\nkind: ClusterInformation\nmetadata: {{name: default}}\nspec: {{calicoVersion: v3.30.2, clusterGUID: abc, clusterType: 'k8s,bgp,kubeadm,kdd', datastoreReady: true}}\n");
        let (cluster, errors) = load(&text);
        assert_eq!(errors, vec![], "{group}");
        assert_eq!(
            cluster.cluster_information_default(),
            Some(&ClusterInformation { name: "default".into(), calico_version: Some("v3.30.2".into()), variant: None }),
            "{group}"
        );
    }
    let (cluster, errors) = load("kind: ClusterInformation\nmetadata: {name: default}\nspec: {variant: Calico}\n");
    assert_eq!(errors, vec![]);
    assert_eq!(
        cluster.cluster_information_default(),
        Some(&ClusterInformation { name: "default".into(), calico_version: None, variant: Some("Calico".into()) })
    );
    let (_, errors) = load("apiVersion: crd.projectcalico.org/v1\nkind: ClusterInformation\nmetadata: {name: default}\nspec: {calicoVersion: 3.3}\n");
    assert_eq!(
        errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        vec![r#"ClusterInformation "default": spec.calicoVersion: expected string, found number"#]
    );
}

/// The operator's Installation: `operator.tigera.io/v1` only.
#[test]
fn installation_cluster_routing_mode() {
    let text = "apiVersion: operator.tigera.io/v1\nkind: Installation\nmetadata: {name: default}\nspec: {variant: Calico, calicoNetwork: {bgp: Enabled, clusterRoutingMode: FelixIPIPOnly, ipPools: [{cidr: 10.244.0.0/16}]}}\n";
    let (cluster, errors) = load(text);
    assert_eq!(errors, vec![]);
    assert_eq!(cluster.installation_default(), Some(&Installation { name: "default".into(), cluster_routing_mode: Some("FelixIPIPOnly".into()) }));
    let (cluster, errors) = load("apiVersion: operator.tigera.io/v1\nkind: Installation\nmetadata: {name: default}\nspec: {variant: Calico}\n");
    assert_eq!(errors, vec![]);
    assert_eq!(cluster.installation_default().unwrap().cluster_routing_mode, None);
    let (_, errors) = load("apiVersion: projectcalico.org/v3\nkind: Installation\nmetadata: {name: default}\nspec: {}\n");
    assert_eq!(
        errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        vec![r#"Installation "default": unsupported apiVersion "projectcalico.org/v3" (expected operator.tigera.io/v1)"#]
    );
}

/// Only the DaemonSet named calico-node is read, keyed by namespace; its calico-node
/// container's FELIX_PROGRAMCLUSTERROUTES (any case, the last entry) and envFrom. Other
/// DaemonSets, even malformed ones, are not read at all.
#[test]
fn calico_node_daemonset_env() {
    let text = "apiVersion: v1\nkind: List\nitems:\n\
- apiVersion: apps/v1\n  kind: DaemonSet\n  metadata: {name: kube-proxy, namespace: kube-system}\n  spec: {template: {spec: {containers: 7}}}\n\
- apiVersion: apps/v1\n  kind: DaemonSet\n  metadata: {name: calico-node, namespace: calico-system}\n  spec:\n    template:\n      spec:\n        initContainers: [{name: install-cni, env: [{name: FELIX_PROGRAMCLUSTERROUTES, value: Disabled}]}]\n        containers:\n        - name: calico-node\n          envFrom: [{configMapRef: {name: kubernetes-services-endpoint}, prefix: X_}]\n          env:\n          - {name: FELIX_PROGRAMCLUSTERROUTES, value: EnabledIPIPOnly}\n          - {name: Felix_ProgramClusterRoutes, value: Enabled}\n          - {name: CALICO_IPV4POOL_CIDR, value: 10.244.0.0/16}\n\
- apiVersion: apps/v1\n  kind: DaemonSet\n  metadata: {name: calico-node, namespace: kube-system}\n  spec:\n    template:\n      spec:\n        containers:\n        - {name: calico-node, env: [{name: FELIX_PROGRAMCLUSTERROUTES, valueFrom: {configMapKeyRef: {name: calico-config, key: routes}}}]}\n";
    let (cluster, errors) = load(text);
    assert_eq!(errors, vec![]);
    assert_eq!(cluster.calico_node_daemonsets.keys().collect::<Vec<_>>(), vec!["calico-system/calico-node", "kube-system/calico-node"]);
    assert_eq!(
        cluster.calico_node_daemonsets["calico-system/calico-node"],
        CalicoNodeDaemonSet {
            namespace: "calico-system".into(),
            container_found: true,
            program_cluster_routes: Some(EnvSetting { name: "Felix_ProgramClusterRoutes".into(), value: EnvValue::Literal("Enabled".into()) }),
            env_from: vec!["configMapRef kubernetes-services-endpoint (prefix X_)".into()],
        }
    );
    assert_eq!(
        cluster.calico_node_daemonsets["kube-system/calico-node"].program_cluster_routes,
        Some(EnvSetting { name: "FELIX_PROGRAMCLUSTERROUTES".into(), value: EnvValue::Reference("configMapKeyRef calico-config/routes".into()) })
    );
    assert_eq!(cluster.calico_node_daemonsets_preferred().iter().map(|d| d.namespace.as_str()).collect::<Vec<_>>(), vec!["calico-system", "kube-system"]);
    // No calico-node container (a renamed one): found, nothing read.
    let (cluster, errors) = load(
        "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: calico-node, namespace: kube-system}\nspec: {template: {spec: {containers: [{name: node}]}}}\n",
    );
    assert_eq!(errors, vec![]);
    assert!(!cluster.calico_node_daemonsets["kube-system/calico-node"].container_found);
    // A bad env: named by object (with its namespace) and field.
    let (_, errors) = load("apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: calico-node, namespace: kube-system}\nspec: {template: {spec: {containers: [{name: calico-node, env: {a: b}}]}}}\n");
    assert_eq!(
        errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        vec![r#"DaemonSet "kube-system/calico-node": spec.template.spec.containers[0].env: expected list, found mapping"#]
    );
    let (_, errors) = load("apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: calico-node, namespace: kube-system}\nspec: {template: {spec: {containers: [{name: calico-node, env: [{name: FELIX_PROGRAMCLUSTERROUTES, value: 1}]}]}}}\n");
    assert_eq!(
        errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        vec![r#"DaemonSet "kube-system/calico-node": spec.template.spec.containers[0].env[0].value: expected string, found number"#]
    );
    let (_, errors) = load("apiVersion: extensions/v1beta1\nkind: DaemonSet\nmetadata: {name: calico-node, namespace: kube-system}\nspec: {}\n");
    assert_eq!(
        errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        vec![r#"DaemonSet "calico-node": unsupported apiVersion "extensions/v1beta1" (expected apps/v1)"#]
    );
}
