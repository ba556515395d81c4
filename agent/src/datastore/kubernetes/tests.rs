//! Tests of the Kubernetes datastore: the RBAC table against the manifest, and the datastore
//! against a mocked API server (tower-test) that asserts the exact requests.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kube::runtime::utils::Backoff;
use tokio::sync::mpsc;

use super::rbac::CALICO_PLURALS;
use super::view::View;
use super::*;
use crate::datastore::{Datastore, DatastoreError, DatastoreEvent, LoadError, LoadErrorKind, Snapshot};

mod trimmed_decode;
mod view_events;

/// `(apiGroup, resource, verb)` triples of a ClusterRole's rules.
fn triples<'a>(rules: impl IntoIterator<Item = (&'a str, Vec<&'a str>, Vec<&'a str>)>) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for (group, resources, verbs) in rules {
        for r in &resources {
            for v in &verbs {
                out.insert((group.to_owned(), (*r).to_owned(), (*v).to_owned()));
            }
        }
    }
    out
}

#[test]
fn rbac_table_matches_deploy_clusterrole_exactly() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/clusterrole.yaml");
    let text = std::fs::read_to_string(path).expect("deploy/clusterrole.yaml");
    let role: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("YAML");
    assert_eq!(role["kind"].as_str(), Some("ClusterRole"));
    let strs =
        |v: &serde_yaml_ng::Value| -> Vec<String> { v.as_sequence().expect("a list").iter().map(|s| s.as_str().expect("a string").to_owned()).collect() };
    let rules: Vec<(Vec<String>, Vec<String>, Vec<String>)> = role["rules"]
        .as_sequence()
        .expect("rules")
        .iter()
        .map(|r| {
            assert!(r.get("nonResourceURLs").is_none() && r.get("resourceNames").is_none(), "unexpected rule shape: {r:?}");
            (strs(&r["apiGroups"]), strs(&r["resources"]), strs(&r["verbs"]))
        })
        .collect();
    let mut manifest = BTreeSet::new();
    for (groups, resources, verbs) in &rules {
        for g in groups {
            manifest.extend(triples([(g.as_str(), resources.iter().map(String::as_str).collect(), verbs.iter().map(String::as_str).collect())]));
        }
    }
    // Exactly what the code requests: no verb granted without use.
    let code = triples(RBAC.iter().map(|r| (r.api_group, r.resources.to_vec(), r.verbs.to_vec())));
    assert_eq!(manifest, code, "deploy/clusterrole.yaml and kubernetes::RBAC differ");

    // The table is the one the watchers use: every watched resource in both groups, and nothing
    // the code does not watch.
    let watched: BTreeSet<(String, String)> = [CalicoGroup::CrdV1, CalicoGroup::V3]
        .into_iter()
        .flat_map(|g| View::new(g, &optional_sources(true)).targets())
        .filter(|t| t.namespace.is_none())
        .map(|t| (t.api.group, t.api.plural))
        .collect();
    let table: BTreeSet<(String, String)> = RBAC.iter().flat_map(|r| r.resources.iter().map(|res| (r.api_group.to_owned(), (*res).to_owned()))).collect();
    assert_eq!(watched, table);
    // Read-only.
    for v in VERBS.iter().chain(RBAC.iter().flat_map(|r| r.verbs)) {
        assert!(["get", "list", "watch"].contains(v), "{v} is not a read verb");
    }
}

/// The namespaced reads both ways: the `Role` (and its `RoleBinding`, the file next to it) in
/// `deploy/` (base) and `deploy/operator/` (the operator component)
/// grants exactly a rule of [`NAMESPACED_RBAC`] in its namespace, bound to the agent's
/// ServiceAccount; and every namespaced watch the code starts (with or without the operator)
/// is covered by one of them, with the field selector that `resourceNames` needs.
#[test]
fn namespaced_rbac_matches_the_roles_in_deploy_exactly() {
    let deploy = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy"));
    let strs =
        |v: &serde_yaml_ng::Value| -> Vec<String> { v.as_sequence().expect("a list").iter().map(|s| s.as_str().expect("a string").to_owned()).collect() };
    for want in &NAMESPACED_RBAC {
        let one = |file: &str, kind: &str| {
            let path = deploy.join(want.manifest).with_file_name(file);
            let docs = parse_yaml_documents(&std::fs::read_to_string(&path).expect("manifest")).expect("YAML");
            assert_eq!(docs.len(), 1, "{}: one object", path.display());
            assert_eq!(docs[0]["kind"].as_str(), Some(kind), "{}", path.display());
            docs.into_iter().next().unwrap()
        };
        let role = one("role-calico-node-env.yaml", "Role");
        let binding = one("rolebinding-calico-node-env.yaml", "RoleBinding");
        assert_eq!(role["metadata"]["namespace"].as_str(), Some(want.namespace), "{}", want.manifest);
        assert_eq!(binding["metadata"]["namespace"].as_str(), Some(want.namespace), "{}", want.manifest);
        assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"], "{}", want.manifest);
        assert_eq!(binding["roleRef"]["kind"].as_str(), Some("Role"));
        let subjects = binding["subjects"].as_sequence().expect("subjects");
        assert_eq!(subjects.len(), 1);
        assert_eq!(
            (subjects[0]["kind"].as_str(), subjects[0]["name"].as_str(), subjects[0]["namespace"].as_str()),
            (Some("ServiceAccount"), Some("routewarden"), Some("routewarden"))
        );
        let rules = role["rules"].as_sequence().expect("rules");
        assert_eq!(rules.len(), 1, "{}: one rule", want.manifest);
        let r = &rules[0];
        assert_eq!(strs(&r["apiGroups"]), [want.rule.api_group]);
        assert_eq!(strs(&r["resources"]), want.rule.resources);
        assert_eq!(strs(&r["verbs"]), want.rule.verbs);
        assert_eq!(strs(&r["resourceNames"]), want.resource_names);
    }
    // The code's namespaced watches, with and without the operator: each is granted.
    let mut seen = BTreeSet::new();
    for operator in [false, true] {
        for t in View::new(CalicoGroup::CrdV1, &optional_sources(operator)).targets() {
            let Some(ns) = t.namespace else { continue };
            let grant = NAMESPACED_RBAC.iter().find(|g| g.namespace == ns).unwrap_or_else(|| panic!("no Role for the watch in {ns}"));
            assert_eq!((grant.rule.api_group, grant.rule.resources), (t.api.group.as_str(), &[t.api.plural.as_str()][..]));
            assert_eq!(t.field_selector, Some("metadata.name=calico-node"), "resourceNames needs the field selector");
            seen.insert(ns);
        }
    }
    // And no Role grants what no watch uses.
    assert_eq!(seen, NAMESPACED_RBAC.iter().map(|g| g.namespace).collect::<BTreeSet<_>>());
}

// ---------------------------------------------------------------------------------------------
// The mocked API server.

mod fake {
    use std::collections::{HashMap, VecDeque};
    use std::sync::{Arc, Mutex};

    use bytes::Bytes;
    use futures::channel::mpsc::{unbounded, UnboundedReceiver, UnboundedSender};
    use futures::StreamExt;
    use http::{Request, Response, StatusCode};
    use http_body::Frame;
    use http_body_util::combinators::BoxBody;
    use http_body_util::{BodyExt, Full, StreamBody};
    use kube::client::Body;
    use kube::Client;
    use serde_json::{json, Value};

    type RespBody = BoxBody<Bytes, std::io::Error>;

    /// One scripted answer.
    pub enum Reply {
        /// A complete JSON response.
        Json(StatusCode, Value),
        /// A streaming (watch) response, one chunk per sent line; ends when the sender drops.
        Stream(UnboundedReceiver<Bytes>),
        /// A transport error (the API server is unreachable).
        Unreachable,
        /// Hold the request until the test sends the reply.
        Deferred(tokio::sync::oneshot::Receiver<Reply>),
    }

    /// A fake API server: scripted replies per `"GET <path>"` / `"WATCH <path>"`, and a log of
    /// every request as `"GET <path and query>"`. An unscripted watch hangs (as an idle watch
    /// does); an unscripted GET is answered 404.
    #[derive(Default)]
    pub struct FakeApi {
        replies: Mutex<HashMap<String, VecDeque<Reply>>>,
        log: Mutex<Vec<String>>,
        parked: Mutex<Vec<UnboundedSender<Bytes>>>,
    }

    impl FakeApi {
        /// Script the next reply for `key` (`"GET /apis"`, `"WATCH /api/v1/nodes"`).
        pub fn on(&self, key: &str, reply: Reply) {
            self.replies.lock().unwrap().entry(key.to_owned()).or_default().push_back(reply);
        }

        /// Script a JSON 200.
        pub fn json(&self, key: &str, body: Value) {
            self.on(key, Reply::Json(StatusCode::OK, body));
        }

        /// Script a watch stream and return its sender.
        pub fn watch(&self, path: &str) -> UnboundedSender<Bytes> {
            let (tx, rx) = unbounded();
            self.on(&format!("WATCH {path}"), Reply::Stream(rx));
            tx
        }

        /// Script a deferred reply and return the trigger.
        pub fn deferred(&self, key: &str) -> tokio::sync::oneshot::Sender<Reply> {
            let (tx, rx) = tokio::sync::oneshot::channel();
            self.on(key, Reply::Deferred(rx));
            tx
        }

        /// Drop the scripted replies of `key`.
        pub fn replies_clear(&self, key: &str) {
            self.replies.lock().unwrap().remove(key);
        }

        /// Every request so far, in arrival order.
        pub fn log(&self) -> Vec<String> {
            self.log.lock().unwrap().clone()
        }

        /// The requests since the last call.
        pub fn take_log(&self) -> Vec<String> {
            std::mem::take(&mut *self.log.lock().unwrap())
        }

        fn next_reply(&self, req: &Request<Body>) -> Reply {
            let uri = req.uri();
            let watch = uri.query().is_some_and(|q| q.split('&').any(|kv| kv == "watch=true"));
            let key = format!("{} {}", if watch { "WATCH" } else { "GET" }, uri.path());
            assert_eq!(req.method(), http::Method::GET, "the datastore is read-only: {} {uri}", req.method());
            self.log.lock().unwrap().push(format!("GET {}", uri.path_and_query().map_or("", |p| p.as_str())));
            let next = self.replies.lock().unwrap().get_mut(&key).and_then(VecDeque::pop_front);
            match next {
                Some(r) => r,
                None if watch => {
                    let (tx, rx) = unbounded();
                    self.parked.lock().unwrap().push(tx);
                    Reply::Stream(rx)
                }
                None => Reply::Json(StatusCode::NOT_FOUND, status(404, "NotFound", &format!("unscripted {key}"))),
            }
        }

        /// A kube client served by this fake.
        pub fn client(self: &Arc<FakeApi>) -> Client {
            let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<RespBody>>();
            let api = self.clone();
            tokio::spawn(async move {
                while let Some((req, send)) = handle.next_request().await {
                    let mut reply = Some(api.next_reply(&req));
                    tokio::spawn(async move {
                        while let Some(Reply::Deferred(rx)) = reply {
                            reply = rx.await.ok();
                        }
                        match reply {
                            Some(Reply::Json(code, body)) => {
                                let full = Full::new(Bytes::from(body.to_string())).map_err(|e| match e {});
                                send.send_response(Response::builder().status(code).body(full.boxed()).unwrap());
                            }
                            Some(Reply::Stream(rx)) => {
                                let body = StreamBody::new(rx.map(|b| Ok::<_, std::io::Error>(Frame::data(b))));
                                send.send_response(Response::builder().status(StatusCode::OK).body(BodyExt::boxed(body)).unwrap());
                            }
                            Some(Reply::Unreachable) | None => send.send_error("connection refused"),
                            Some(Reply::Deferred(_)) => unreachable!(),
                        }
                    });
                }
            });
            Client::new(service, "default")
        }
    }

    /// A `Status` object.
    pub fn status(code: u16, reason: &str, message: &str) -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code})
    }

    /// One watch event line.
    pub fn event(kind: &str, object: &Value) -> Bytes {
        Bytes::from(format!("{}\n", json!({"type": kind, "object": object})))
    }
}

use std::collections::BTreeMap;
use std::sync::Arc as StdArc;

use bytes::Bytes;
use fake::{event, status, FakeApi, Reply};
use futures::channel::mpsc::UnboundedSender;
use http::StatusCode;
use serde_json::{json, Value as Json};

use crate::model::{
    parse_yaml_documents, Affinity, AffinityState, AllocationAttributes, AllowedUse, BgpConfiguration, BlockAffinity, Cluster, ClusterInformation, EncapMode,
    FelixConfiguration, FelixScope, IpPool, IpamBlock, Node, NodeAddress, NodeAddressType, NodeForm, OptionalSource,
};
use crate::ownership::{decide, CalicoVersion, ClusterRoutes, ComponentDecision, DecisionSource, OwnershipConfig, Role, VersionChoice};
use crate::vocabulary::PoolClass;
use crate::vocabulary::Writer as RouteWriter;

const CALICO_PLURAL_KINDS: [(&str, &str); 6] = [
    ("ippools", "IPPool"),
    ("ipamblocks", "IPAMBlock"),
    ("blockaffinities", "BlockAffinity"),
    ("felixconfigurations", "FelixConfiguration"),
    ("bgpconfigurations", "BGPConfiguration"),
    ("clusterinformations", "ClusterInformation"),
];

/// The collection path of a resource: `/apis/<group>/<version>/<plural>`, `/api/v1/nodes`.
fn path(group: CalicoGroup, plural: &str) -> String {
    if plural == "nodes" {
        "/api/v1/nodes".to_owned()
    } else {
        format!("/apis/{}/{plural}", group.api_version())
    }
}

fn kind_of(plural: &str) -> &'static str {
    CALICO_PLURAL_KINDS.iter().find(|(p, _)| *p == plural).map_or("Node", |(_, k)| k)
}

fn api_version_of(group: CalicoGroup, plural: &str) -> &'static str {
    if plural == "nodes" {
        "v1"
    } else {
        group.api_version()
    }
}

/// `/apis` serving the given groups.
fn api_groups(groups: &[CalicoGroup]) -> Json {
    let groups: Vec<Json> = groups
        .iter()
        .map(|g| {
            let v = json!({"groupVersion": g.api_version(), "version": g.version()});
            json!({"name": g.group(), "versions": [v.clone()], "preferredVersion": v})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/<group>/<version>` serving `plurals`.
fn api_resources(group: CalicoGroup, plurals: &[&str]) -> Json {
    let resources: Vec<Json> = plurals
        .iter()
        .map(|p| {
            json!({"name": p, "singularName": "", "namespaced": false, "kind": kind_of(p),
                   "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]})
        })
        .collect();
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group.api_version(), "resources": resources})
}

/// Script discovery of a cluster serving `group` with all six resources.
fn script_discovery(api: &FakeApi, group: CalicoGroup) {
    api.json("GET /apis", api_groups(&[group]));
    api.json(&format!("GET /apis/{}", group.api_version()), api_resources(group, &CALICO_PLURALS));
}

/// A list response as the API server sends it (items of core types without apiVersion/kind).
fn list(group: CalicoGroup, plural: &str, rv: &str, items: &[Json]) -> Json {
    let items: Vec<Json> = items
        .iter()
        .map(|o| {
            let mut o = o.clone();
            if plural == "nodes" {
                let m = o.as_object_mut().unwrap();
                m.remove("apiVersion");
                m.remove("kind");
            }
            o
        })
        .collect();
    json!({"apiVersion": api_version_of(group, plural), "kind": format!("{}List", kind_of(plural)),
           "metadata": {"resourceVersion": rv}, "items": items})
}

/// Objects by plural.
type Objects = BTreeMap<&'static str, Vec<Json>>;

/// Script one list per resource and a watch stream per resource; returns the watch senders.
fn script_lists(api: &FakeApi, group: CalicoGroup, objects: &Objects, rv: &str) -> BTreeMap<&'static str, UnboundedSender<Bytes>> {
    let mut watches = BTreeMap::new();
    for plural in CALICO_PLURALS.iter().copied().chain(["nodes"]) {
        let items = objects.get(plural).cloned().unwrap_or_default();
        api.json(&format!("GET {}", path(group, plural)), list(group, plural, rv, &items));
        watches.insert(plural, api.watch(&path(group, plural)));
    }
    // No operator (GET /apis/operator.tigera.io/v1 is unscripted: 404): the one optional
    // source is kube-system's calico-node DaemonSet, here without FELIX_PROGRAMCLUSTERROUTES.
    let items = objects.get("daemonsets").cloned().unwrap_or_default();
    api.json(&format!("GET {KUBE_SYSTEM_DS}"), daemonset_list(rv, &items));
    watches.insert("daemonsets", api.watch(KUBE_SYSTEM_DS));
    watches
}

/// The collection path of the kube-system calico-node read.
const KUBE_SYSTEM_DS: &str = "/apis/apps/v1/namespaces/kube-system/daemonsets";

/// A DaemonSet list.
fn daemonset_list(rv: &str, items: &[Json]) -> Json {
    json!({"apiVersion": "apps/v1", "kind": "DaemonSetList", "metadata": {"resourceVersion": rv}, "items": items})
}

/// A calico-node DaemonSet in `namespace` whose calico-node container has `env`, with the usual
/// noise (other containers, volumes, status).
fn calico_node_ds(namespace: &str, rv: &str, env: &Json) -> Json {
    json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "calico-node", "namespace": namespace, "resourceVersion": rv, "uid": "u1", "labels": {"k8s-app": "calico-node"}},
        "spec": {"selector": {}, "template": {"spec": {
            "initContainers": [{"name": "install-cni", "image": "calico/cni"}],
            "containers": [{"name": "calico-node", "image": "calico/node:v3.33.0", "env": env, "resources": {}}],
            "volumes": [{"name": "lib-modules", "hostPath": {"path": "/lib/modules"}}]
        }}},
        "status": {"numberReady": 4}
    })
}

/// A Kubernetes object of `plural` in `group`, with server-side metadata the model must not
/// need (uid, managedFields, labels, status).
fn object(group: CalicoGroup, plural: &str, name: &str, rv: &str, spec: &Json) -> Json {
    json!({
        "apiVersion": api_version_of(group, plural),
        "kind": kind_of(plural),
        "metadata": {
            "name": name, "resourceVersion": rv, "uid": format!("uid-{name}"), "generation": 1,
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"app": "x"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"},
            "managedFields": [{"manager": "calico", "operation": "Update", "apiVersion": api_version_of(group, plural)}]
        },
        "spec": spec,
        "status": {"whatever": true}
    })
}

/// A core Node with Calico's annotations, `status.addresses` and the usual noise.
fn node(name: &str, rv: &str, annotations: &Json, addresses: &Json) -> Json {
    let mut ann = json!({"node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true"});
    for (k, v) in annotations.as_object().unwrap() {
        ann[k] = v.clone();
    }
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "resourceVersion": rv, "uid": format!("uid-{name}"), "labels": {"kubernetes.io/hostname": name}, "annotations": ann},
        "spec": {"podCIDR": "10.0.0.0/24"},
        "status": {
            "addresses": addresses,
            "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-01-01T00:00:00Z"}],
            "images": [{"names": ["registry/x:1"], "sizeBytes": 1}]
        }
    })
}

/// Convert a calicoctl-format cluster (v3 Calico objects, Calico Nodes, core Nodes) into the
/// objects a Kubernetes-datastore cluster serves in `group`: Calico kinds in `group`, Calico
/// Nodes as core Nodes with `projectcalico.org/*` annotations (as calico-node writes them,
/// `libcalico-go/lib/backend/k8s/resources/node.go`).
fn cluster_objects(yaml: &str, group: CalicoGroup) -> Objects {
    let mut out: Objects = BTreeMap::new();
    let mut items = Vec::new();
    for doc in parse_yaml_documents(yaml).unwrap() {
        let doc: Json = serde_json::to_value(&doc).unwrap();
        match doc.get("items") {
            Some(Json::Array(list)) => items.extend(list.iter().cloned()),
            _ => items.push(doc),
        }
    }
    for (i, item) in items.iter().enumerate() {
        let kind = item["kind"].as_str().unwrap();
        let name = item["metadata"]["name"].as_str().unwrap();
        let rv = format!("{}", 10 + i);
        if kind == "Node" {
            let (ann, addrs) = if item["apiVersion"] == "v1" {
                (item["metadata"]["annotations"].clone(), item["status"]["addresses"].clone())
            } else {
                let bgp = &item["spec"]["bgp"];
                let mut ann = json!({});
                for (field, key) in [("ipv4Address", "IPv4Address"), ("ipv6Address", "IPv6Address"), ("ipv4IPIPTunnelAddr", "IPv4IPIPTunnelAddr")] {
                    if let Some(v) = bgp.get(field) {
                        ann[format!("projectcalico.org/{key}")] = v.clone();
                    }
                }
                let addrs: Vec<Json> =
                    item["spec"]["addresses"].as_array().map(|a| a.iter().filter(|x| x["type"] == "InternalIP").cloned().collect()).unwrap_or_default();
                (ann, Json::Array(addrs))
            };
            out.entry("nodes").or_default().push(node(name, &rv, &ann, &addrs));
        } else {
            let plural = CALICO_PLURAL_KINDS.iter().find(|(_, k)| *k == kind).map(|(p, _)| *p).unwrap();
            out.entry(plural).or_default().push(object(group, plural, name, &rv, &item["spec"]));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The expected models, written out by hand from the YAML they come from (never parsed by the
// code under test): what a Kubernetes-datastore cluster serving those objects must give.

fn net(s: &str) -> ipnet::IpNet {
    s.parse().unwrap()
}

fn pool_v(name: &str, cidr: &str, ipip: EncapMode, vxlan: EncapMode, nat_outgoing: bool, block_size: u8, allowed_uses: Vec<AllowedUse>) -> (String, IpPool) {
    let pool = IpPool {
        name: name.into(),
        cidr: net(cidr),
        ipip_mode: ipip,
        vxlan_mode: vxlan,
        nat_outgoing,
        disabled: false,
        disable_bgp_export: false,
        block_size,
        allowed_uses,
        node_selector: "all()".to_owned(),
    };
    (name.to_owned(), pool)
}

/// An IPAM block affine to `host`; `attributes` are (handle_id, secondary) pairs.
fn block_v(name: &str, cidr: &str, host: &str, allocations: &[Option<usize>], attributes: &[(&str, &[(&str, &str)])]) -> (String, IpamBlock) {
    let attributes = attributes
        .iter()
        .map(|(handle, secondary)| AllocationAttributes {
            handle_id: Some((*handle).to_owned()),
            secondary: secondary.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
        })
        .collect();
    let block = IpamBlock {
        name: name.into(),
        cidr: net(cidr),
        affinity: Some(Affinity::Host(host.to_owned())),
        allocations: IpamBlock::dense_allocations(allocations),
        attributes,
        deleted: false,
    };
    (name.to_owned(), block)
}

/// A confirmed host BlockAffinity named `<node>-<block name>`.
fn affinity_v(node: &str, block: &str, cidr: &str) -> (String, BlockAffinity) {
    let name = format!("{node}-{block}");
    let affinity = BlockAffinity {
        name: name.clone(),
        node: node.to_owned(),
        cidr: net(cidr),
        state: AffinityState::Confirmed,
        affinity_type: "host".to_owned(),
        deleted: false,
    };
    (name, affinity)
}

/// A core Node as the fake API server serves it: the Calico annotations and the InternalIPs of
/// `status.addresses` (bare addresses, no subnet).
fn node_v(name: &str, v4: &str, v6: Option<&str>, ipip_tunnel: Option<&str>, internal_ips: &[&str]) -> (String, Node) {
    let node = Node {
        name: name.into(),
        form: NodeForm::Kubernetes,
        bgp_ipv4: Some(net(v4)),
        bgp_ipv4_has_prefix: v4.contains('/'),
        bgp_ipv6: v6.map(net),
        bgp_ipv6_has_prefix: v6.is_some_and(|a| a.contains('/')),
        as_number: None,
        ipv4_ipip_tunnel_addr: ipip_tunnel.map(|a| a.parse().unwrap()),
        ipv4_vxlan_tunnel_addr: None,
        ipv6_vxlan_tunnel_addr: None,
        wireguard_ipv4: None,
        wireguard_ipv6: None,
        addresses: internal_ips.iter().map(|a| NodeAddress { address: a.parse().unwrap(), network: None, kind: NodeAddressType::InternalIP }).collect(),
    };
    (name.to_owned(), node)
}

fn bgp_v(program_cluster_routes: &str) -> (String, BgpConfiguration) {
    let bgp = BgpConfiguration {
        name: "default".to_owned(),
        program_cluster_routes: Some(program_cluster_routes.to_owned()),
        ipv4_normal_route_priority: None,
        ipv6_normal_route_priority: None,
    };
    ("default".to_owned(), bgp)
}

/// `examples/cluster/` (calico.yaml, ipam.yaml, nodes.yaml) as the model of a cluster serving
/// it: every Calico Node became a core Node (annotations + InternalIP), so all are
/// [`NodeForm::Kubernetes`]; pools take Calico's defaults (block size 26 / 122, `all()`).
fn examples_model() -> Cluster {
    use EncapMode::{Always, CrossSubnet, Never};
    let tunnel = |node: &str| -> (String, &'static [(&'static str, &'static str)]) {
        let secondary: &'static [(&str, &str)] = match node {
            "node-a" => &[("node", "node-a"), ("type", "ipipTunnelAddress")],
            "node-b" => &[("node", "node-b"), ("type", "ipipTunnelAddress")],
            _ => &[("node", "node-d"), ("type", "ipipTunnelAddress")],
        };
        (format!("ipip-tunnel-addr-{node}"), secondary)
    };
    let (ta, tb, td) = (tunnel("node-a"), tunnel("node-b"), tunnel("node-d"));
    let web0: &[(&str, &str)] = &[("node", "node-a")];
    // 10.244.20.5 (ordinal 5 of node-b's block) is borrowed by node-c's pod api-7c8d.
    let api: &[(&str, &str)] = &[("node", "node-c")];
    let blocks = [
        block_v("10-244-10-0-26", "10.244.10.0/26", "node-a", &[Some(0), Some(1)], &[(&ta.0, ta.1), ("k8s-pod-network.1f0c", web0)]),
        block_v("10-244-20-0-26", "10.244.20.0/26", "node-b", &[Some(0), None, None, None, None, Some(1)], &[(&tb.0, tb.1), ("k8s-pod-network.a17b", api)]),
        block_v("10-244-30-0-26", "10.244.30.0/26", "node-c", &[], &[]),
        block_v("10-244-40-0-26", "10.244.40.0/26", "node-d", &[Some(0)], &[(&td.0, td.1)]),
        block_v("10-245-20-0-26", "10.245.20.0/26", "node-b", &[], &[]),
        block_v("10-245-40-0-26", "10.245.40.0/26", "node-d", &[], &[]),
        block_v("10-246-10-0-26", "10.246.10.0/26", "node-a", &[], &[]),
        block_v("10-246-30-0-26", "10.246.30.0/26", "node-c", &[], &[]),
        block_v("10-247-20-0-26", "10.247.20.0/26", "node-b", &[], &[]),
        block_v("fd00-10-244-0-10---122", "fd00:10:244:0:10::/122", "node-a", &[], &[]),
        block_v("fd00-10-244-0-20---122", "fd00:10:244:0:20::/122", "node-b", &[], &[]),
    ];
    let block_affinities =
        blocks.iter().map(|(name, b)| affinity_v(b.host().unwrap(), name, &b.cidr.to_string())).map(|(k, v)| (k.into(), Arc::new(v))).collect();
    let felix = FelixConfiguration {
        name: "default".to_owned(),
        scope: FelixScope::Global,
        program_cluster_routes: Some("EnabledIPIPOnly".to_owned()),
        device_route_protocol: None,
        route_refresh_interval: Some(std::time::Duration::from_secs(90)),
        ipv4_normal_route_priority: None,
        ipv6_normal_route_priority: None,
        remove_external_routes: Some(true),
    };
    Cluster {
        ip_pools: [
            pool_v("default-ipv4-ippool", "10.244.0.0/16", CrossSubnet, Never, true, 26, vec![]),
            pool_v("ipip-always", "10.245.0.0/16", Always, Never, true, 26, vec![]),
            pool_v("flat", "10.246.0.0/16", Never, Never, false, 26, vec![]),
            pool_v("vxlan", "10.247.0.0/16", Never, Always, false, 26, vec![]),
            pool_v("flat-ipv6", "fd00:10:244::/48", Never, Never, false, 122, vec![]),
            pool_v("loadbalancers", "10.96.100.0/24", Never, Never, false, 26, vec![AllowedUse::LoadBalancer]),
        ]
        .into_iter()
        .collect(),
        ipam_blocks: blocks.into_iter().map(|(k, v)| (k.into(), Arc::new(v))).collect(),
        block_affinities,
        nodes: [
            node_v("node-a", "10.0.0.11/24", Some("fd00:10::11/64"), Some("10.244.10.0"), &["10.0.0.11"]),
            node_v("node-b", "10.0.0.12/24", Some("fd00:10::12/64"), Some("10.244.20.0"), &["10.0.0.12"]),
            node_v("node-c", "10.0.0.13/24", Some("fd00:10::13/64"), None, &["10.0.0.13"]),
            node_v("node-d", "10.0.1.14/24", None, Some("10.244.40.0"), &["10.0.1.14"]),
        ]
        .into_iter()
        .map(|(k, v)| (k.into(), Arc::new(v)))
        .collect(),
        felix_configurations: [("default".to_owned(), felix)].into_iter().collect(),
        bgp_configurations: [bgp_v("EnabledNoEncapOnly")].into_iter().collect(),
        cluster_informations: [(
            "default".to_owned(),
            ClusterInformation { name: "default".to_owned(), calico_version: Some("v3.33.0".to_owned()), variant: None },
        )]
        .into_iter()
        .collect(),
        ..Cluster::default()
    }
}

/// confd's `cluster_routes/enabled/input.yaml` as the model of a v3 cluster serving it: three
/// Calico Nodes as core Nodes with only their BGP annotations (the input has no
/// `spec.addresses`), five pools, BGPConfiguration `Enabled`, no FelixConfiguration.
fn confd_enabled_model() -> Cluster {
    use EncapMode::{Always, CrossSubnet, Never};
    let node = |name: &str, v4: &str, v6: &str| node_v(name, v4, Some(v6), None, &[]);
    Cluster {
        ip_pools: [
            pool_v("ippoolv4-1", "192.168.0.0/16", Always, Never, true, 26, vec![]),
            pool_v("ippoolv4-2", "172.16.0.0/16", CrossSubnet, Never, true, 26, vec![]),
            pool_v("ippoolv4-3", "172.17.0.0/16", Never, Never, false, 26, vec![]),
            pool_v("ippoolv6-1", "2002::/64", Never, Never, true, 122, vec![]),
            pool_v("ippoolv6-2", "2010::/64", Never, Never, false, 122, vec![]),
        ]
        .into_iter()
        .collect(),
        nodes: [
            node("kube-master", "10.192.0.2/16", "2001::103/64"),
            node("kube-node-1", "10.192.0.3/16", "2001::102/64"),
            node("kube-node-2", "10.192.0.4/16", "2001::104/64"),
        ]
        .into_iter()
        .map(|(k, v)| (k.into(), Arc::new(v)))
        .collect(),
        bgp_configurations: [bgp_v("Enabled")].into_iter().collect(),
        ..Cluster::default()
    }
}

/// A component's decision read from its field (`FelixConfiguration default`, ...).
fn from_field(field_of: RouteWriter, object: &str, value: ClusterRoutes) -> ComponentDecision {
    ComponentDecision { field_of, value, source: DecisionSource::Field { object: object.to_owned(), value: value.as_str().to_owned() } }
}

/// Writers per class: IPIP, no-encap, VXLAN.
fn writers(ipip: &[RouteWriter], noencap: &[RouteWriter], vxlan: &[RouteWriter]) -> BTreeMap<PoolClass, BTreeSet<RouteWriter>> {
    [(PoolClass::Ipip, ipip), (PoolClass::NoEncap, noencap), (PoolClass::Vxlan, vxlan)].into_iter().map(|(c, w)| (c, w.iter().copied().collect())).collect()
}

fn examples_cluster() -> String {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/cluster");
    ["calico.yaml", "ipam.yaml", "nodes.yaml"].iter().map(|f| std::fs::read_to_string(format!("{dir}/{f}")).unwrap()).collect::<Vec<_>>().join("\n---\n")
}

/// A backoff of 10 ms, always (the production one starts at 800 ms).
struct Quick;
impl Iterator for Quick {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        Some(Duration::from_millis(10))
    }
}
impl Backoff for Quick {
    fn reset(&mut self) {}
}

/// A running datastore over a fake API server.
struct Running {
    rx: mpsc::Receiver<DatastoreEvent>,
    task: tokio::task::JoinHandle<Result<(), DatastoreError>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Running {
    fn start(api: &StdArc<FakeApi>, choice: ApiGroupChoice) -> Running {
        Running::start_settling(api, choice, Duration::ZERO)
    }

    /// With deletions held for `settle` after each list.
    fn start_settling(api: &StdArc<FakeApi>, choice: ApiGroupChoice, settle: Duration) -> Running {
        let (tx, rx) = mpsc::channel(64);
        let ds = KubernetesDatastore::new(api.client(), choice)
            .with_debounce(Duration::from_millis(30))
            .with_list_settle(settle)
            .with_backoff(Arc::new(|| Box::new(Quick)));
        let task = ds.spawn(tx);
        Running { rx, task }
    }

    async fn next(&mut self) -> DatastoreEvent {
        tokio::time::timeout(Duration::from_secs(10), self.rx.recv()).await.expect("an event within 10 s").expect("datastore running")
    }

    async fn snapshot(&mut self) -> Snapshot {
        match self.next().await {
            DatastoreEvent::Snapshot(s) => s,
            other => panic!("expected a snapshot, got {other:?}"),
        }
    }

    /// Assert nothing is sent for `ms` milliseconds.
    async fn quiet(&mut self, ms: u64) {
        if let Ok(ev) = tokio::time::timeout(Duration::from_millis(ms), self.rx.recv()).await {
            panic!("expected no event, got {ev:?}");
        }
    }

    /// Events up to and including the next `Synced`, each within 10 s.
    async fn until_synced(&mut self) -> Vec<DatastoreEvent> {
        events_until_synced(&mut self.rx, Duration::from_secs(10)).await
    }
}

/// Events from `rx` up to and including the next `Synced`, each within `limit`.
async fn events_until_synced(rx: &mut mpsc::Receiver<DatastoreEvent>, limit: Duration) -> Vec<DatastoreEvent> {
    let mut out = Vec::new();
    loop {
        let ev = tokio::time::timeout(limit, rx.recv()).await.expect("an event in time").expect("datastore running");
        let done = ev == DatastoreEvent::Synced;
        out.push(ev);
        if done {
            return out;
        }
    }
}

fn felix(node: &str) -> OwnershipConfig {
    OwnershipConfig { role: Role::Felix, version: CalicoVersion::V3_33.into(), node: Some(node.to_owned()) }
}

fn programmed(cluster: &Cluster, config: &OwnershipConfig) -> Vec<PoolClass> {
    decide(cluster, config).programmed.into_iter().collect()
}

/// The request log with the discovery requests first (in order), then per resource its
/// requests (in order); resources interleave freely.
fn per_resource(log: &[String]) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in log {
        let p = line.trim_start_matches("GET ").split('?').next().unwrap().to_owned();
        out.entry(p).or_default().push(line.clone());
    }
    out
}

fn list_url(group: CalicoGroup, plural: &str) -> String {
    format!("GET {}?&resourceVersion=0&resourceVersionMatch=NotOlderThan", path(group, plural))
}

fn watch_url(group: CalicoGroup, plural: &str, rv: &str) -> String {
    format!("GET {}?&watch=true&timeoutSeconds=290&allowWatchBookmarks=true&resourceVersion={rv}", path(group, plural))
}

// ---------------------------------------------------------------------------------------------
// Discovery.

async fn discover_with(script: impl FnOnce(&FakeApi), choice: ApiGroupChoice) -> (Result<CalicoGroup, KubernetesError>, Vec<String>) {
    let api = StdArc::new(FakeApi::default());
    script(&api);
    let got = discover(&api.client(), choice).await;
    (got, api.log())
}

#[tokio::test]
async fn discovery_picks_the_served_group_and_prefers_crd_v1() {
    use CalicoGroup::{CrdV1, V3};
    // v1 only, v3 only, both.
    for (served, want) in [(vec![CrdV1], CrdV1), (vec![V3], V3), (vec![V3, CrdV1], CrdV1)] {
        let (got, log) = discover_with(
            |api| {
                api.json("GET /apis", api_groups(&served));
                api.json(&format!("GET /apis/{}", want.api_version()), api_resources(want, &CALICO_PLURALS));
            },
            ApiGroupChoice::Auto,
        )
        .await;
        assert_eq!(got.unwrap(), want, "served {served:?}");
        assert_eq!(log, vec!["GET /apis".to_owned(), format!("GET /apis/{}", want.api_version())]);
    }
}

#[tokio::test]
async fn discovery_errors_name_what_is_missing() {
    // Neither group: one request, a clear error.
    let (got, log) = discover_with(|api| api.json("GET /apis", api_groups(&[])), ApiGroupChoice::Auto).await;
    assert!(matches!(got, Err(KubernetesError::NoCalicoGroup)), "{got:?}");
    assert_eq!(log, vec!["GET /apis"]);

    // A v3 group without IPAM resources (the Calico API server).
    let (got, _) = discover_with(
        |api| {
            api.json("GET /apis", api_groups(&[CalicoGroup::V3]));
            api.json("GET /apis/projectcalico.org/v3", api_resources(CalicoGroup::V3, &["ippools", "felixconfigurations", "bgpconfigurations"]));
        },
        ApiGroupChoice::Auto,
    )
    .await;
    let err = got.unwrap_err();
    assert_eq!(
        err.to_string(),
        "projectcalico.org/v3 does not serve ipamblocks, blockaffinities, clusterinformations with list and watch (the Calico API server may not serve IPAM objects; try --calico-api-group crd.projectcalico.org/v1)"
    );

    // API server down.
    let (got, _) = discover_with(|api| api.on("GET /apis", Reply::Unreachable), ApiGroupChoice::Auto).await;
    assert!(matches!(got, Err(KubernetesError::Discovery { ref request, .. }) if request == "GET /apis"), "{got:?}");
}

#[tokio::test]
async fn forced_group_skips_the_group_list() {
    let (got, log) = discover_with(
        |api| api.json("GET /apis/projectcalico.org/v3", api_resources(CalicoGroup::V3, &CALICO_PLURALS)),
        ApiGroupChoice::Forced(CalicoGroup::V3),
    )
    .await;
    assert_eq!(got.unwrap(), CalicoGroup::V3);
    assert_eq!(log, vec!["GET /apis/projectcalico.org/v3"]);
}

// ---------------------------------------------------------------------------------------------
// Watching.

#[tokio::test]
async fn v1_cluster_not_synced_until_every_resource_listed_then_exact_requests() {
    let group = CalicoGroup::CrdV1;
    let objects = cluster_objects(&examples_cluster(), group);
    let api = StdArc::new(FakeApi::default());
    script_discovery(&api, group);
    // Everything but the Nodes answers at once; the Node list is held back.
    let mut watches = BTreeMap::new();
    for plural in CALICO_PLURALS {
        api.json(&format!("GET {}", path(group, plural)), list(group, plural, "100", objects.get(plural).map_or(&[][..], Vec::as_slice)));
        watches.insert(plural, api.watch(&path(group, plural)));
    }
    let nodes_list = api.deferred("GET /api/v1/nodes");
    let _node_watch = api.watch("/api/v1/nodes");
    api.json(&format!("GET {KUBE_SYSTEM_DS}"), daemonset_list("100", &[]));
    let _ds_watch = api.watch(KUBE_SYSTEM_DS);
    let mut ds = Running::start(&api, ApiGroupChoice::Auto);

    // Five of six listed: nothing is sent (no snapshot, not synced).
    ds.quiet(300).await;
    nodes_list.send(Reply::Json(StatusCode::OK, list(group, "nodes", "100", &objects["nodes"]))).ok().unwrap();
    let snap = ds.snapshot().await;
    assert_eq!(ds.next().await, DatastoreEvent::Synced);

    // The exact model, written out by hand from examples/cluster/.
    assert_eq!(*snap.cluster, examples_model());
    assert!(snap.object_errors.is_empty() && snap.load_errors.is_empty());
    assert_eq!(snap.cluster.ip_pools.len(), 6);
    assert_eq!(snap.cluster.ipam_blocks.len(), objects["ipamblocks"].len());
    assert_eq!(snap.cluster.nodes.keys().map(|k| &**k).collect::<Vec<_>>(), vec!["node-a", "node-b", "node-c", "node-d"]);
    assert_eq!(snap.cluster.nodes["node-b"].bgp_ipv4.unwrap().to_string(), "10.0.0.12/24");
    assert_eq!(snap.inputs, objects.values().map(Vec::len).sum::<usize>());
    // The examples' pair, read from both fields: Felix (routewarden in role felix) IPIP, BIRD
    // no-encap, VXLAN always Felix's.
    let d = decide(&snap.cluster, &felix("node-a"));
    assert_eq!(d.felix, from_field(RouteWriter::Felix, "FelixConfiguration default", ClusterRoutes::EnabledIpipOnly));
    assert_eq!(d.bird, from_field(RouteWriter::Bird, "BGPConfiguration default", ClusterRoutes::EnabledNoEncapOnly));
    assert_eq!(d.programmed.into_iter().collect::<Vec<_>>(), [PoolClass::Ipip]);
    assert_eq!(d.writers, writers(&[RouteWriter::Routewarden], &[RouteWriter::Bird], &[RouteWriter::Felix]));

    // Exact requests: discovery in order, then per resource one list and one watch from the
    // list's resourceVersion with bookmarks.
    let log = api.log();
    assert_eq!(log[..3], ["GET /apis".to_owned(), "GET /apis/crd.projectcalico.org/v1".to_owned(), "GET /apis/operator.tigera.io/v1".to_owned()]);
    let per = per_resource(&log[3..]);
    let mut want = BTreeMap::new();
    for plural in CALICO_PLURALS.iter().copied().chain(["nodes"]) {
        want.insert(path(group, plural), vec![list_url(group, plural), watch_url(group, plural, "100")]);
    }
    // No operator: only kube-system's calico-node, by name (what the Role's resourceNames allows).
    want.insert(
        KUBE_SYSTEM_DS.to_owned(),
        vec![
            format!("GET {KUBE_SYSTEM_DS}?&fieldSelector=metadata.name%3Dcalico-node&resourceVersion=0&resourceVersionMatch=NotOlderThan"),
            format!(
                "GET {KUBE_SYSTEM_DS}?&watch=true&timeoutSeconds=290&fieldSelector=metadata.name%3Dcalico-node&allowWatchBookmarks=true&resourceVersion=100"
            ),
        ],
    );
    assert_eq!(per, want);
    drop(watches);
}

#[tokio::test]
async fn v3_cluster_loads_and_bgp_decision_matches_the_calicoctl_input() {
    let group = CalicoGroup::V3;
    let input = std::fs::read_to_string("/work/shared/calico-testdata/confd/cluster_routes/enabled/input.yaml")
        .or_else(|_| std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/calico-testdata/confd/cluster_routes/enabled/input.yaml")))
        .expect("confd test input");
    let objects = cluster_objects(&input, group);
    let api = StdArc::new(FakeApi::default());
    api.json("GET /apis", api_groups(&[CalicoGroup::V3]));
    api.json("GET /apis/projectcalico.org/v3", api_resources(group, &CALICO_PLURALS));
    let _w = script_lists(&api, group, &objects, "7");
    let mut ds = Running::start(&api, ApiGroupChoice::Auto);
    let snap = ds.snapshot().await;
    assert_eq!(ds.next().await, DatastoreEvent::Synced);

    // The exact model, written out by hand from confd's input.yaml.
    assert_eq!(*snap.cluster, confd_enabled_model());
    assert_eq!(snap.cluster.ip_pools.len(), 5);
    assert_eq!(snap.cluster.bgp_default().and_then(|b| b.program_cluster_routes.as_deref()), Some("Enabled"));
    assert_eq!(snap.cluster.nodes["kube-node-1"].bgp_ipv4.unwrap().to_string(), "10.192.0.3/16");
    // programClusterRoutes: Enabled gives BIRD (routewarden in role bird) IPIP and no-encap;
    // with no FelixConfiguration, Felix keeps its 3.33 default EnabledIPIPOnly, so IPIP has two
    // writers.
    let bird = OwnershipConfig { role: Role::Bird, ..felix("kube-node-1") };
    let d = decide(&snap.cluster, &bird);
    assert_eq!(d.bird, from_field(RouteWriter::Bird, "BGPConfiguration default", ClusterRoutes::Enabled));
    assert_eq!(
        d.felix,
        ComponentDecision {
            field_of: RouteWriter::Felix,
            value: ClusterRoutes::EnabledIpipOnly,
            source: DecisionSource::Default { reason: "no FelixConfiguration default or node.kube-node-1".to_owned() },
        }
    );
    assert_eq!(d.programmed.into_iter().collect::<Vec<_>>(), [PoolClass::Ipip, PoolClass::NoEncap]);
    assert_eq!(d.writers, writers(&[RouteWriter::Felix, RouteWriter::Routewarden], &[RouteWriter::Routewarden], &[RouteWriter::Felix]));
    // v3 URLs.
    assert!(api.log().contains(&list_url(group, "ipamblocks")));
    assert!(api.log().contains(&watch_url(group, "bgpconfigurations", "7")));
}

fn pool(name: &str, rv: &str, cidr: &str) -> Json {
    object(CalicoGroup::CrdV1, "ippools", name, rv, &json!({"cidr": cidr, "ipipMode": "Always", "vxlanMode": "Never"}))
}

fn cidr_of(s: &Snapshot, pool: &str) -> Option<String> {
    s.cluster.ip_pools.get(pool).map(|p| p.cidr.to_string())
}

#[tokio::test]
async fn unparseable_object_is_skipped_and_its_last_good_version_kept() {
    let group = CalicoGroup::CrdV1;
    let api = StdArc::new(FakeApi::default());
    script_discovery(&api, group);
    let mut objects = Objects::new();
    // A bad object among good ones in the initial list: skipped, the others load, synced.
    objects.insert("ippools", vec![pool("pool-a", "1", "10.244.0.0/16"), pool("pool-x", "2", "banana"), pool("pool-b", "3", "10.245.0.0/16")]);
    let watches = script_lists(&api, group, &objects, "10");
    let mut ds = Running::start(&api, ApiGroupChoice::Auto);
    let s = ds.snapshot().await;
    assert_eq!(ds.next().await, DatastoreEvent::Synced);
    assert_eq!(s.cluster.ip_pools.keys().collect::<Vec<_>>(), vec!["pool-a", "pool-b"]);
    assert_eq!(
        s.object_errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        vec!["ippools.crd.projectcalico.org/pool-x: IPPool \"pool-x\": spec.cidr: invalid CIDR \"banana\""]
    );

    let w = &watches["ippools"];
    // A good object turns bad: its last good version stays.
    w.unbounded_send(event("MODIFIED", &pool("pool-a", "11", "10.0.0/8"))).unwrap();
    let s = ds.snapshot().await;
    assert_eq!(cidr_of(&s, "pool-a").as_deref(), Some("10.244.0.0/16"));
    assert_eq!(cidr_of(&s, "pool-b").as_deref(), Some("10.245.0.0/16"));
    assert_eq!(
        s.object_errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        vec![
            "ippools.crd.projectcalico.org/pool-a: IPPool \"pool-a\": spec.cidr: invalid CIDR \"10.0.0/8\" (its last good version is kept)",
            "ippools.crd.projectcalico.org/pool-x: IPPool \"pool-x\": spec.cidr: invalid CIDR \"banana\"",
        ]
    );
    // The one with a last good version freezes nothing; the other names no CIDR either.
    assert_eq!(s.object_errors.iter().map(|e| (e.last_good, e.cidrs.len())).collect::<Vec<_>>(), vec![(true, 0), (false, 0)]);
    // A never-good object freezes the CIDRs it mentions (its spec's, and the block name's).
    w.unbounded_send(event("ADDED", &object(group, "ippools", "pool-y", "111", &json!({"cidr": "10.252.0.0/16", "ipipMode": "Sometimes"})))).unwrap();
    let s = ds.snapshot().await;
    let y = s.object_errors.iter().find(|e| e.file.ends_with("pool-y")).expect("pool-y rejected");
    assert_eq!((y.last_good, y.cidrs.iter().map(ToString::to_string).collect::<Vec<_>>()), (false, vec!["10.252.0.0/16".to_string()]));
    w.unbounded_send(event("DELETED", &object(group, "ippools", "pool-y", "112", &json!({"cidr": "10.252.0.0/16", "ipipMode": "Sometimes"})))).unwrap();
    let s = ds.snapshot().await;
    assert!(s.object_errors.iter().all(|e| !e.file.ends_with("pool-y")));
    // Fixed: the new version replaces the last good one; deleting the bad one clears its error.
    w.unbounded_send(event("MODIFIED", &pool("pool-a", "12", "10.250.0.0/16"))).unwrap();
    w.unbounded_send(event("DELETED", &pool("pool-x", "13", "banana"))).unwrap();
    let s = ds.snapshot().await;
    assert_eq!(cidr_of(&s, "pool-a").as_deref(), Some("10.250.0.0/16"));
    assert!(s.object_errors.is_empty());
    // Added, then deleted: gone.
    w.unbounded_send(event("ADDED", &pool("pool-c", "14", "10.251.0.0/16"))).unwrap();
    let s = ds.snapshot().await;
    assert_eq!(cidr_of(&s, "pool-c").as_deref(), Some("10.251.0.0/16"));
    w.unbounded_send(event("DELETED", &pool("pool-c", "15", "10.251.0.0/16"))).unwrap();
    let s = ds.snapshot().await;
    assert_eq!(s.cluster.ip_pools.keys().collect::<Vec<_>>(), vec!["pool-a", "pool-b"]);
    // Never unsynced by bad objects.
    ds.quiet(100).await;
}

fn felix_config(rv: &str, value: &str) -> Json {
    object(CalicoGroup::CrdV1, "felixconfigurations", "default", rv, &json!({"programClusterRoutes": value, "ipipEnabled": true}))
}

fn bgp_config(rv: &str, value: &str) -> Json {
    object(CalicoGroup::CrdV1, "bgpconfigurations", "default", rv, &json!({"programClusterRoutes": value}))
}

#[tokio::test]
async fn program_cluster_routes_changes_take_effect_live() {
    let group = CalicoGroup::CrdV1;
    let api = StdArc::new(FakeApi::default());
    script_discovery(&api, group);
    let mut objects = Objects::new();
    objects.insert(
        "ippools",
        vec![
            pool("ipip", "1", "10.244.0.0/16"),
            object(group, "ippools", "flat", "2", &json!({"cidr": "10.246.0.0/16", "ipipMode": "Never", "vxlanMode": "Never"})),
        ],
    );
    objects.insert("felixconfigurations", vec![felix_config("3", "EnabledIPIPOnly")]);
    objects.insert("bgpconfigurations", vec![bgp_config("4", "EnabledNoEncapOnly")]);
    let watches = script_lists(&api, group, &objects, "10");
    let mut ds = Running::start(&api, ApiGroupChoice::Auto);
    let s = ds.snapshot().await;
    assert_eq!(ds.next().await, DatastoreEvent::Synced);
    let bird = OwnershipConfig { role: Role::Bird, ..felix("n") };
    assert_eq!(programmed(&s.cluster, &felix("n")), vec![PoolClass::Ipip]);
    assert_eq!(programmed(&s.cluster, &bird), vec![PoolClass::NoEncap]);

    // FelixConfiguration default → Enabled: Felix's side now has both classes.
    watches["felixconfigurations"].unbounded_send(event("MODIFIED", &felix_config("11", "Enabled"))).unwrap();
    let s = ds.snapshot().await;
    assert_eq!(s.cluster.felix_default().unwrap().program_cluster_routes.as_deref(), Some("Enabled"));
    assert_eq!(programmed(&s.cluster, &felix("n")), vec![PoolClass::Ipip, PoolClass::NoEncap]);

    // BGPConfiguration default → Enabled: BIRD's side too.
    watches["bgpconfigurations"].unbounded_send(event("MODIFIED", &bgp_config("12", "Enabled"))).unwrap();
    let s = ds.snapshot().await;
    assert_eq!(programmed(&s.cluster, &bird), vec![PoolClass::Ipip, PoolClass::NoEncap]);

    // Same content, new resourceVersion (e.g. a status-only update): nothing sent.
    watches["bgpconfigurations"].unbounded_send(event("MODIFIED", &bgp_config("13", "Enabled"))).unwrap();
    ds.quiet(150).await;
}

fn cluster_info(group: CalicoGroup, rv: &str, version: &str) -> Json {
    object(group, "clusterinformations", "default", rv, &json!({"calicoVersion": version, "clusterType": "k8s,bgp,kdd", "datastoreReady": true}))
}

/// `--calico-version auto` follows `ClusterInformation default` live, in both groups: a
/// cluster on 3.30 (no fields: BIRD has IPIP and no-encap) upgraded to 3.33 hands IPIP to
/// Felix's side; without the object 3.33 is assumed and said so.
#[tokio::test]
async fn calico_upgrade_in_cluster_information_changes_the_decision_live() {
    for group in [CalicoGroup::CrdV1, CalicoGroup::V3] {
        let api = StdArc::new(FakeApi::default());
        script_discovery(&api, group);
        let mut objects = Objects::new();
        objects.insert("ippools", vec![object(group, "ippools", "ipip", "1", &json!({"cidr": "10.244.0.0/16", "ipipMode": "Always"}))]);
        objects.insert("felixconfigurations", vec![object(group, "felixconfigurations", "default", "3", &json!({"programClusterRoutes": "EnabledIPIPOnly"}))]);
        objects.insert("clusterinformations", vec![cluster_info(group, "5", "v3.30.2")]);
        let watches = script_lists(&api, group, &objects, "10");
        let mut ds = Running::start(&api, ApiGroupChoice::Auto);
        let s = ds.snapshot().await;
        assert_eq!(ds.next().await, DatastoreEvent::Synced);
        let auto = OwnershipConfig { role: Role::Felix, version: VersionChoice::Auto, node: Some("n".into()) };
        let bird = OwnershipConfig { role: Role::Bird, ..auto.clone() };
        let d = decide(&s.cluster, &auto);
        assert_eq!(d.version.to_string(), "3.30 (ClusterInformation default: v3.30.2)", "{group}");
        assert_eq!(programmed(&s.cluster, &auto), vec![], "{group}");
        assert_eq!(programmed(&s.cluster, &bird), vec![PoolClass::Ipip, PoolClass::NoEncap], "{group}");
        assert_eq!(
            d.findings.iter().filter(|f| f.code() == "ignored-by-release").map(|f| f.message.as_str()).collect::<Vec<_>>(),
            vec!["FelixConfiguration default: \"EnabledIPIPOnly\" is set but ignored by this release: Felix 3.30 does not read it, and Felix programs only VXLAN cluster routes"],
            "{group}"
        );

        watches["clusterinformations"].unbounded_send(event("MODIFIED", &cluster_info(group, "11", "v3.33.1"))).unwrap();
        let s = ds.snapshot().await;
        assert_eq!(decide(&s.cluster, &auto).version.to_string(), "3.33 (ClusterInformation default: v3.33.1)", "{group}");
        assert_eq!(programmed(&s.cluster, &auto), vec![PoolClass::Ipip], "{group}");
        assert_eq!(programmed(&s.cluster, &bird), vec![PoolClass::NoEncap], "{group}");

        watches["clusterinformations"].unbounded_send(event("DELETED", &cluster_info(group, "12", "v3.33.1"))).unwrap();
        let s = ds.snapshot().await;
        assert_eq!(decide(&s.cluster, &auto).version.to_string(), "3.33 (assumed: no ClusterInformation default)", "{group}");
        drop(watches);
    }
}

fn block(name: &str, rv: &str, cidr: &str, node: &str) -> Json {
    object(
        CalicoGroup::CrdV1,
        "ipamblocks",
        name,
        rv,
        &json!({"cidr": cidr, "affinity": format!("host:{node}"), "allocations": [], "attributes": [], "deleted": false}),
    )
}

/// A synced datastore over a pool and two IPAM blocks (lists at resourceVersion 100), with the
/// ipamblocks re-list scripted (at 200, one block deleted meanwhile) and its watch after it.
/// Returns the fake, the first watches, the re-listed watch (kept open) and the datastore.
async fn two_blocks_then_one_relisted(
    group: CalicoGroup,
) -> (StdArc<FakeApi>, BTreeMap<&'static str, UnboundedSender<Bytes>>, UnboundedSender<Bytes>, Running) {
    let api = StdArc::new(FakeApi::default());
    script_discovery(&api, group);
    let mut objects = Objects::new();
    objects.insert("ippools", vec![pool("p", "1", "10.244.0.0/16")]);
    objects.insert("ipamblocks", vec![block("10-244-1-0-26", "2", "10.244.1.0/26", "a"), block("10-244-2-0-26", "3", "10.244.2.0/26", "b")]);
    let watches = script_lists(&api, group, &objects, "100");
    let blocks = path(group, "ipamblocks");
    api.json(&format!("GET {blocks}"), list(group, "ipamblocks", "200", &[block("10-244-1-0-26", "2", "10.244.1.0/26", "a")]));
    let relisted_watch = api.watch(&blocks);
    let mut ds = Running::start(&api, ApiGroupChoice::Auto);
    let s = ds.snapshot().await;
    assert_eq!(ds.next().await, DatastoreEvent::Synced);
    assert_eq!(s.cluster.ipam_blocks.len(), 2);
    api.take_log();
    (api, watches, relisted_watch, ds)
}

/// The events up to `Synced` after [`two_blocks_then_one_relisted`]'s re-list: until the
/// re-list completes, every snapshot keeps both blocks and names the broken resource (the app
/// deletes nothing); the last one, after the re-list, has the deletion and no load error.
fn assert_deletion_only_after_the_relist(events: &[DatastoreEvent]) {
    let snaps: Vec<&Snapshot> = events.iter().filter_map(|e| if let DatastoreEvent::Snapshot(s) = e { Some(s) } else { None }).collect();
    let (last, before) = snaps.split_last().expect("a snapshot after the re-list");
    for s in before {
        assert_eq!(s.cluster.ipam_blocks.len(), 2, "nothing lost before the re-list");
        assert_eq!(s.load_errors.len(), 1);
    }
    assert_eq!(last.cluster.ipam_blocks.keys().map(|k| &**k).collect::<Vec<_>>(), vec!["10-244-1-0-26"]);
    assert!(last.load_errors.is_empty());
}

#[tokio::test]
async fn gone_410_during_watch_relists_and_applies_deletions_only_then() {
    let group = CalicoGroup::CrdV1;
    let (api, watches, _relisted_watch, mut ds) = two_blocks_then_one_relisted(group).await;

    // A bookmark moves the resourceVersion on; then the server says 410 Gone.
    let w = &watches["ipamblocks"];
    w.unbounded_send(event("BOOKMARK", &json!({"apiVersion": "crd.projectcalico.org/v1", "kind": "IPAMBlock", "metadata": {"resourceVersion": "150"}})))
        .unwrap();
    w.unbounded_send(event("ERROR", &status(410, "Expired", "too old resource version: 150 (190)"))).unwrap();
    let DatastoreEvent::Unsynced { reason } = ds.next().await else { panic!("expected Unsynced") };
    assert_eq!(reason, "ipamblocks.crd.projectcalico.org: watch ended with an error: too old resource version: 150 (190) (410 Expired)");
    let events = ds.until_synced().await;
    assert_deletion_only_after_the_relist(&events);
    // Exactly one re-list of that resource, then a watch from the new list's version.
    assert_eq!(api.take_log(), vec![list_url(group, "ipamblocks"), watch_url(group, "ipamblocks", "200")]);
}

/// A hung watch (issue 23): the API server answers, but one resource's watch stops delivering.
/// Once the watch has had a bookmark, events keep it alive; silence past
/// `--kube-watch-silence` (90 s) makes the datastore unsynced with a `stale` reason, counts it
/// (`LoadFailed` with code `stale`), and re-lists that resource only; every snapshot before
/// the re-list keeps every object. Watches that never had a bookmark (a server that sends
/// none) are never called stale. Virtual time from the first sync on.
#[tokio::test]
async fn a_silent_watch_after_a_bookmark_is_stale_and_relisted() {
    let group = CalicoGroup::CrdV1;
    let (api, watches, _relisted_watch, mut ds) = two_blocks_then_one_relisted(group).await;
    tokio::time::pause();
    let lists_and_watches = |log: Vec<String>| log.into_iter().filter(|l| !l.contains("/version")).collect::<Vec<_>>();

    // A bookmark arms the check; an event every 60 s for 3 minutes keeps the watch current.
    let w = &watches["ipamblocks"];
    w.unbounded_send(event("BOOKMARK", &json!({"apiVersion": "crd.projectcalico.org/v1", "kind": "IPAMBlock", "metadata": {"resourceVersion": "150"}})))
        .unwrap();
    for rv in ["151", "152", "153"] {
        tokio::time::sleep(Duration::from_mins(1)).await;
        w.unbounded_send(event("MODIFIED", &block("10-244-1-0-26", rv, "10.244.1.0/26", "a"))).unwrap();
    }
    let last_event = tokio::time::Instant::now();
    ds.quiet(1).await;

    // Then nothing: stale 90 s after the last event; the other watches, silent for 4.5 minutes
    // but never bookmarked, are not.
    let mut next = async || tokio::time::timeout(Duration::from_mins(5), ds.rx.recv()).await.expect("an event").expect("running");
    let reason = "ipamblocks.crd.projectcalico.org: stale: no event and no bookmark for 90 s although the API server sends a bookmark every 60 s; re-listing";
    assert_eq!(next().await, DatastoreEvent::Unsynced { reason: reason.to_owned() });
    let noticed = last_event.elapsed();
    assert!(noticed >= Duration::from_secs(90) && noticed <= Duration::from_secs(91), "noticed after {noticed:?}");
    assert_eq!(next().await, DatastoreEvent::LoadFailed(LoadError::new("ipamblocks.crd.projectcalico.org", LoadErrorKind::Stale, reason)));
    let events = ds.until_synced().await;
    assert_deletion_only_after_the_relist(&events);
    // The ipamblocks watch from 100, then exactly one re-list of that resource and a watch
    // from the new list's version; no other resource was touched.
    assert_eq!(lists_and_watches(api.take_log()), vec![list_url(group, "ipamblocks"), watch_url(group, "ipamblocks", "200")]);
}

#[tokio::test]
async fn api_server_away_keeps_the_view_and_recovery_syncs_again() {
    let group = CalicoGroup::CrdV1;
    let api = StdArc::new(FakeApi::default());
    script_discovery(&api, group);
    let mut objects = Objects::new();
    objects.insert("ippools", vec![pool("p", "1", "10.244.0.0/16")]);
    objects.insert(
        "nodes",
        vec![node("a", "5", &json!({"projectcalico.org/IPv4Address": "10.0.0.1/24"}), &json!([{"type": "InternalIP", "address": "10.0.0.1"}]))],
    );
    let mut watches = script_lists(&api, group, &objects, "100");
    let mut ds = Running::start(&api, ApiGroupChoice::Auto);
    let _ = ds.snapshot().await;
    assert_eq!(ds.next().await, DatastoreEvent::Synced);
    api.take_log();

    // The API server goes away: the pool watch ends, re-watching fails, then listing fails
    // with 503, then the list works again.
    let pools = path(group, "ippools");
    api.on(&format!("WATCH {pools}"), Reply::Unreachable);
    api.on(&format!("GET {pools}"), Reply::Json(StatusCode::SERVICE_UNAVAILABLE, status(503, "ServiceUnavailable", "apiserver is shutting down")));
    let back = api.deferred(&format!("GET {pools}"));
    let _w2 = api.watch(&pools);
    drop(watches.remove("ippools"));

    // While it is away: Unsynced (the watch could not be restarted), again when the reason
    // changes (the list fails with 503), and a snapshot that keeps every object and names the
    // broken resource (so the app deletes nothing).
    let mut reasons = Vec::new();
    let outage = loop {
        match ds.next().await {
            DatastoreEvent::Unsynced { reason } => reasons.push(reason),
            DatastoreEvent::Snapshot(s) => break s,
            other => panic!("unexpected {other:?}"),
        }
    };
    while reasons.len() < 2 {
        let DatastoreEvent::Unsynced { reason } = ds.next().await else { panic!("expected Unsynced") };
        reasons.push(reason);
    }
    assert_eq!(
        reasons,
        vec![
            "ippools.crd.projectcalico.org: watch failed to start: ServiceError: connection refused".to_owned(),
            "ippools.crd.projectcalico.org: list failed: apiserver is shutting down (503 ServiceUnavailable)".to_owned(),
        ]
    );
    assert!(outage.cluster.ip_pools.contains_key("p") && outage.cluster.nodes.contains_key("a"));
    assert_eq!(outage.load_errors.len(), 1);
    assert_eq!(outage.load_errors[0].file, PathBuf::from("ippools.crd.projectcalico.org"));
    // Retries of a list that keeps failing the same way are not reported again.
    ds.quiet(100).await;

    // Back: one snapshot without the load error, then Synced.
    back.send(Reply::Json(StatusCode::OK, list(group, "ippools", "300", &[pool("p", "1", "10.244.0.0/16")]))).ok().unwrap();
    let events = ds.until_synced().await;
    let [DatastoreEvent::Snapshot(s), DatastoreEvent::Synced] = &events[..] else { panic!("{events:?}") };
    assert!(s.load_errors.is_empty() && s.cluster.ip_pools.contains_key("p"));
    // Requests: re-watch from the last version (kube-runtime), failed; a fresh list (503);
    // the held list (ok), then a watch from it.
    assert_eq!(
        api.take_log(),
        vec![watch_url(group, "ippools", "100"), list_url(group, "ippools"), list_url(group, "ippools"), watch_url(group, "ippools", "300"),]
    );
    ds.quiet(100).await;
}

#[tokio::test]
async fn node_heartbeats_change_nothing_and_annotations_do() {
    let group = CalicoGroup::CrdV1;
    let api = StdArc::new(FakeApi::default());
    script_discovery(&api, group);
    let addrs = json!([{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": "a"}]);
    let mut objects = Objects::new();
    objects.insert("nodes", vec![node("a", "5", &json!({"projectcalico.org/IPv4Address": "10.0.0.1/24"}), &addrs)]);
    let watches = script_lists(&api, group, &objects, "100");
    let mut ds = Running::start(&api, ApiGroupChoice::Auto);
    let s = ds.snapshot().await;
    assert_eq!(ds.next().await, DatastoreEvent::Synced);
    assert_eq!(s.cluster.nodes["a"].bgp_ipv4.unwrap().to_string(), "10.0.0.1/24");

    let mut beat = node("a", "6", &json!({"projectcalico.org/IPv4Address": "10.0.0.1/24", "other/annotation": "x"}), &addrs);
    beat["status"]["conditions"][0]["lastHeartbeatTime"] = json!("2026-01-01T00:05:00Z");
    watches["nodes"].unbounded_send(event("MODIFIED", &beat)).unwrap();
    ds.quiet(150).await;

    let moved = node("a", "7", &json!({"projectcalico.org/IPv4Address": "10.0.1.1/24"}), &addrs);
    watches["nodes"].unbounded_send(event("MODIFIED", &moved)).unwrap();
    let s = ds.snapshot().await;
    assert_eq!(s.cluster.nodes["a"].bgp_ipv4.unwrap().to_string(), "10.0.1.1/24");
}

#[tokio::test]
async fn initial_list_in_pages_is_one_snapshot() {
    let group = CalicoGroup::CrdV1;
    let api = StdArc::new(FakeApi::default());
    script_discovery(&api, group);
    let blocks: Vec<Json> =
        (0..1200u32).map(|i| block(&format!("10-{}-{}-0-26", 100 + i / 256, i % 256), "1", &format!("10.{}.{}.0/26", 100 + i / 256, i % 256), "n")).collect();
    let mut objects = Objects::new();
    objects.insert("ippools", vec![pool("p", "1", "10.0.0.0/8")]);
    let _w = script_lists(&api, group, &objects, "100");
    // Replace the block list with three pages.
    let bpath = path(group, "ipamblocks");
    api.replies_clear(&format!("GET {bpath}"));
    for (i, chunk) in blocks.chunks(500).enumerate() {
        let mut page = list(group, "ipamblocks", "100", chunk);
        if i < 2 {
            page["metadata"]["continue"] = json!(format!("page{}", i + 1));
        }
        api.json(&format!("GET {bpath}"), page);
    }
    let mut ds = Running::start(&api, ApiGroupChoice::Auto);
    let s = ds.snapshot().await;
    assert_eq!(ds.next().await, DatastoreEvent::Synced);
    assert_eq!(s.cluster.ipam_blocks.len(), 1200);
    ds.quiet(200).await;
    let per = per_resource(&api.log());
    assert_eq!(
        per[&bpath],
        vec![
            list_url(group, "ipamblocks"),
            format!("GET {bpath}?&continue=page1"),
            format!("GET {bpath}?&continue=page2"),
            watch_url(group, "ipamblocks", "100"),
        ]
    );
}

#[tokio::test]
async fn one_shot_load_lists_everything_and_watches_nothing() {
    let group = CalicoGroup::CrdV1;
    let objects = cluster_objects(&examples_cluster(), group);
    let api = StdArc::new(FakeApi::default());
    script_discovery(&api, group);
    for plural in CALICO_PLURALS.iter().copied().chain(["nodes"]) {
        api.json(&format!("GET {}", path(group, plural)), list(group, plural, "100", objects.get(plural).map_or(&[][..], Vec::as_slice)));
    }
    api.json(&format!("GET {KUBE_SYSTEM_DS}"), daemonset_list("100", &[]));
    let ds = KubernetesDatastore::new(api.client(), ApiGroupChoice::Auto);
    let snap = ds.load().await.unwrap();
    assert_eq!(*snap.cluster, examples_model());
    let log = api.log();
    // Discovery (2 + the operator's group), 7 lists, the kube-system calico-node list.
    assert_eq!(log.len(), 3 + 7 + 1, "{log:?}");
    assert!(log.iter().all(|l| !l.contains("watch=true")), "{log:?}");

    // A list that fails fails the load, naming the resource.
    let api = StdArc::new(FakeApi::default());
    script_discovery(&api, group);
    api.on("GET /apis/crd.projectcalico.org/v1/ippools", Reply::Json(StatusCode::FORBIDDEN, status(403, "Forbidden", "ippools is forbidden")));
    let err = KubernetesDatastore::new(api.client(), ApiGroupChoice::Auto).load().await.unwrap_err();
    assert_eq!(err.to_string(), "list ippools.crd.projectcalico.org: list failed: ippools is forbidden (403 Forbidden)");
    // Printed as the CLI prints it (the whole chain): each cause once, one short line.
    let line = format!("{:#}", anyhow::Error::from(err));
    assert_eq!(line.matches("ippools is forbidden").count(), 1, "{line}");
    assert!(line.len() < 200, "{} characters: {line}", line.len());
}

#[tokio::test]
async fn discovery_failure_is_reported_unsynced_and_retried() {
    let group = CalicoGroup::CrdV1;
    let api = StdArc::new(FakeApi::default());
    api.on("GET /apis", Reply::Unreachable);
    api.on("GET /apis", Reply::Unreachable);
    script_discovery(&api, group);
    let _w = script_lists(&api, group, &Objects::new(), "1");
    let mut ds = Running::start(&api, ApiGroupChoice::Auto);
    let DatastoreEvent::Unsynced { reason } = ds.next().await else { panic!("expected Unsynced") };
    assert!(reason.starts_with("API discovery GET /apis:"), "{reason}");
    // The same failure again is not repeated; then discovery succeeds and the view syncs.
    let _ = ds.snapshot().await;
    assert_eq!(ds.next().await, DatastoreEvent::Synced);
    assert_eq!(api.log()[..4], ["GET /apis", "GET /apis", "GET /apis", "GET /apis/crd.projectcalico.org/v1"]);
}

#[tokio::test]
async fn connect_builds_a_tls_client_from_a_kubeconfig_without_requests() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: \"https://10.96.0.1:6443\", insecure-skip-tls-verify: true}\n\
         users:\n- name: u\n  user: {token: abc}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n",
    )
    .unwrap();
    let opts = KubernetesOptions { kubeconfig: Some(path.clone()), api_group: ApiGroupChoice::Forced(CalicoGroup::CrdV1), ..KubernetesOptions::default() };
    let ds = KubernetesDatastore::connect(&opts).await.expect("rustls (ring) client");
    assert_eq!(ds.describe(), "kubernetes:https://10.96.0.1:6443/ (calico api group: crd.projectcalico.org/v1)");

    let missing = KubernetesOptions { kubeconfig: Some(dir.path().join("nope")), ..KubernetesOptions::default() };
    let err = KubernetesDatastore::connect(&missing).await.unwrap_err();
    assert!(err.to_string().starts_with(&format!("kubeconfig {}:", dir.path().join("nope").display())), "{err}");
}

/// Issue 22, row 17: the API server answers a re-list with an empty IPAMBlock list (CRDs
/// reinstalled, a restored backup, a broken aggregation layer). The agent's pipeline — this
/// datastore, the view, the plan and the reconciler over a fake kernel — deletes none of
/// node-a's seven routes: the mass-deletion breaker holds them; the list restored within the
/// settle period costs no route and no write. (That a deletion wanted for the whole settle
/// period goes through is `dataplane::reconciler_tests::mass_deletion_is_held_for_the_settle_period`.)
#[tokio::test]
async fn empty_relist_is_held_by_the_breaker_and_a_restored_list_costs_nothing() {
    use crate::app::view::ViewState;
    use crate::dataplane::fake::{FakeClock, FakeNetlink};
    use crate::dataplane::{DataplaneConfig, Reconciler};
    use crate::plan::{plan, Plan, PlanConfig};
    use crate::routes::RouteDevices;

    struct Pipeline {
        view: ViewState,
        config: PlanConfig,
        last: Option<Plan>,
        r: Reconciler<FakeNetlink, FakeClock>,
    }
    impl Pipeline {
        async fn feed(&mut self, ev: &DatastoreEvent) -> crate::dataplane::ApplyReport {
            self.view.on_event(ev);
            if let DatastoreEvent::Snapshot(s) = ev {
                let previous = self.last.as_ref().map(|p| p.decision.programmed.clone()).unwrap_or_default();
                let owned = self.last.as_ref().map(|p| p.policy.owned.clone()).unwrap_or_default();
                let p = plan(s, &self.config, &previous, &owned);
                self.r.set_policy(p.policy.clone());
                self.r.set_desired_with_handover(&p.desired, &p.handovers);
                self.last = Some(p);
            }
            self.r.set_datastore_synced(self.view.deletions_allowed(self.last.as_ref()));
            self.r.apply().await
        }
    }

    let group = CalicoGroup::CrdV1;
    let objects = cluster_objects(&examples_cluster(), group);
    let api = StdArc::new(FakeApi::default());
    script_discovery(&api, group);
    let watches = script_lists(&api, group, &objects, "100");
    let blocks_path = path(group, "ipamblocks");
    // The re-list after the first 410: empty. After the second: everything back.
    api.json(&format!("GET {blocks_path}"), list(group, "ipamblocks", "200", &[]));
    let second_watch = api.watch(&blocks_path);
    api.json(&format!("GET {blocks_path}"), list(group, "ipamblocks", "300", &objects["ipamblocks"]));
    let _third_watch = api.watch(&blocks_path);

    let nl = FakeNetlink::with_links(&[(1, "lo"), (2, "eth0"), (3, "tunl0")]);
    let clock = FakeClock::new();
    let cfg = DataplaneConfig::default();
    let ownership = felix("node-a");
    let mut p = Pipeline {
        view: ViewState::default(),
        config: PlanConfig { node: "node-a".into(), ownership, devices: RouteDevices::default(), protocol: 80, table: 254 },
        last: None,
        r: Reconciler::new(cfg.clone(), cfg.base_policy(), nl.clone(), clock.clone()),
    };
    let mut ds = Running::start(&api, ApiGroupChoice::Auto);
    for ev in ds.until_synced().await {
        p.feed(&ev).await;
    }
    let healthy = nl.state().routes.clone();
    assert_eq!(healthy.len(), 7, "node-a's IPIP routes: {healthy:#?}");
    let lines = |nl: &FakeNetlink| nl.state().routes.keys().map(ToString::to_string).collect::<Vec<_>>();
    let healthy_lines = lines(&nl);
    nl.take_log();

    // 410, then the empty re-list.
    watches["ipamblocks"].unbounded_send(event("ERROR", &status(410, "Expired", "too old resource version"))).unwrap();
    let mut held = 0;
    for ev in ds.until_synced().await {
        let rep = p.feed(&ev).await;
        held = held.max(rep.deletes_held_mass);
    }
    assert!(p.last.as_ref().unwrap().desired.is_empty(), "the empty list wants no route");
    assert_eq!(held, 7, "all seven deletes held by the breaker");
    assert_eq!(lines(&nl), healthy_lines);
    clock.advance(Duration::from_secs(20));
    let rep = p.r.apply().await;
    assert_eq!((rep.deletes, rep.deletes_held_mass), (0, 7), "{rep:?}");
    assert!(nl.take_log().is_empty(), "no write and no delete while held");

    // Restored (another 410 and a full re-list) within the settle period: nothing changes.
    second_watch.unbounded_send(event("ERROR", &status(410, "Expired", "too old resource version"))).unwrap();
    let mut last = None;
    for ev in ds.until_synced().await {
        last = Some(p.feed(&ev).await);
    }
    let rep = last.unwrap();
    assert_eq!((rep.writes, rep.deletes, rep.deletes_held_mass, rep.mass_deletion), (0, 0, 0, None), "{rep:?}");
    clock.advance(Duration::from_mins(1));
    let rep = p.r.apply().await;
    assert_eq!((rep.writes, rep.deletes), (0, 0));
    assert_eq!(nl.state().routes, healthy);
    assert!(nl.take_log().is_empty(), "the outage cost no route operation");
}

// ---------------------------------------------------------------------------------------------
// Optional sources: the calico-node env and the operator's Installation (issue 19 part 2).

/// `/apis/operator.tigera.io/v1` of an operator install.
fn operator_resources() -> Json {
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "operator.tigera.io/v1", "resources": [
        {"name": "installations", "singularName": "installation", "namespaced": false, "kind": "Installation", "verbs": ["get", "list", "watch", "update"]},
        {"name": "installations/status", "singularName": "", "namespaced": false, "kind": "Installation", "verbs": ["get"]}
    ]})
}

const CALICO_SYSTEM_DS: &str = "/apis/apps/v1/namespaces/calico-system/daemonsets";
const INSTALLATIONS: &str = "/apis/operator.tigera.io/v1/installations";

fn installation(rv: &str, mode: &str) -> Json {
    json!({"apiVersion": "operator.tigera.io/v1", "kind": "Installation",
           "metadata": {"name": "default", "resourceVersion": rv, "uid": "i1"},
           "spec": {"variant": "Calico", "calicoNetwork": {"clusterRoutingMode": mode, "ipPools": [{"cidr": "10.244.0.0/16"}]}},
           "status": {"computed": {}}})
}

fn forbidden_ds(ns: &str) -> Reply {
    Reply::Json(
        StatusCode::FORBIDDEN,
        status(403, "Forbidden", &format!("daemonsets.apps \"calico-node\" is forbidden: User \"system:serviceaccount:routewarden:routewarden\" cannot list resource \"daemonsets\" in API group \"apps\" in the namespace \"{ns}\"")),
    )
}

#[tokio::test]
async fn operator_install_env_outranks_the_datastore_and_a_forbidden_namespace_is_a_finding_not_unsynced() {
    let group = CalicoGroup::CrdV1;
    let objects = cluster_objects(&examples_cluster(), group);
    let api = StdArc::new(FakeApi::default());
    script_discovery(&api, group);
    api.json("GET /apis/operator.tigera.io/v1", operator_resources());
    let _w = script_lists(&api, group, &objects, "100");
    // calico-system: Felix's env says Enabled. The operator's mode is Felix.
    let env = json!([{"name": "DATASTORE_TYPE", "value": "kubernetes"}, {"name": "FELIX_PROGRAMCLUSTERROUTES", "value": "Enabled"}]);
    api.json(&format!("GET {CALICO_SYSTEM_DS}"), daemonset_list("100", &[calico_node_ds("calico-system", "100", &env)]));
    let _cs = api.watch(CALICO_SYSTEM_DS);
    api.json(&format!("GET {INSTALLATIONS}"), json!({"apiVersion": "operator.tigera.io/v1", "kind": "InstallationList", "metadata": {"resourceVersion": "100"}, "items": [installation("100", "Felix")]}));
    let _inst = api.watch(INSTALLATIONS);
    // kube-system: the Role is missing (not applied yet, or revoked): 403; once granted, the
    // retried list succeeds.
    api.replies_clear(&format!("GET {KUBE_SYSTEM_DS}"));
    api.on(&format!("GET {KUBE_SYSTEM_DS}"), forbidden_ds("kube-system"));
    let granted = api.deferred(&format!("GET {KUBE_SYSTEM_DS}"));

    let mut ds = Running::start(&api, ApiGroupChoice::Auto);
    let events = ds.until_synced().await;
    assert!(events.iter().all(|e| !matches!(e, DatastoreEvent::Unsynced { .. })), "a forbidden optional source never unsyncs: {events:?}");
    let Some(DatastoreEvent::Snapshot(snap)) = events.iter().rev().find(|e| matches!(e, DatastoreEvent::Snapshot(_))).cloned() else {
        panic!("no snapshot: {events:?}")
    };
    assert!(snap.load_errors.is_empty() && snap.object_errors.is_empty(), "{:?} {:?}", snap.load_errors, snap.object_errors);
    let reason = "list failed: daemonsets.apps \"calico-node\" is forbidden: User \"system:serviceaccount:routewarden:routewarden\" cannot list resource \"daemonsets\" in API group \"apps\" in the namespace \"kube-system\" (403 Forbidden)";
    assert_eq!(snap.cluster.unread, BTreeMap::from([(OptionalSource::CalicoNodeEnv("kube-system"), reason.to_owned())]));
    assert_eq!(snap.cluster.installations.keys().collect::<Vec<_>>(), ["default"]);
    assert_eq!(snap.cluster.installations["default"].cluster_routing_mode.as_deref(), Some("Felix"));
    assert_eq!(snap.cluster.calico_node_daemonsets.keys().collect::<Vec<_>>(), ["calico-system/calico-node"]);

    // The decision: Felix's value is the env's (it outranks FelixConfiguration default's
    // EnabledIPIPOnly), so routewarden in Felix's role programs IPIP and no-encap.
    let d = decide(&snap.cluster, &felix("node-a"));
    assert_eq!(d.felix.value, ClusterRoutes::Enabled);
    assert!(
        matches!(&d.felix.source, DecisionSource::Env { daemonset, value, .. } if daemonset == "calico-system/calico-node" && value == "Enabled"),
        "{:?}",
        d.felix.source
    );
    let codes: Vec<(&str, String)> = d.findings.iter().filter(|f| f.class.is_none()).map(|f| (f.code(), f.message.clone())).collect();
    assert!(codes.contains(&(
        "source-unreadable",
        format!("could not read calico-node env (kube-system/calico-node): {reason}; a FELIX_PROGRAMCLUSTERROUTES there outranks every FelixConfiguration, so the decision shown follows the datastore and may not be Felix's")
    )), "{codes:?}");
    assert!(codes.iter().any(|(c, _)| *c == "operator-mismatch"), "{codes:?}");

    // Permission granted: the retried list succeeds and the finding goes, live.
    granted.send(Reply::Json(StatusCode::OK, daemonset_list("101", &[]))).ok().unwrap();
    let snap = ds.snapshot().await;
    assert!(snap.cluster.unread.is_empty(), "{:?}", snap.cluster.unread);
    assert!(decide(&snap.cluster, &felix("node-a")).findings.iter().all(|f| f.code() != "source-unreadable"));

    // The exact requests of the optional reads: by name only, in their namespaces.
    let per = per_resource(&api.log());
    assert_eq!(
        per[CALICO_SYSTEM_DS][0],
        format!("GET {CALICO_SYSTEM_DS}?&fieldSelector=metadata.name%3Dcalico-node&resourceVersion=0&resourceVersionMatch=NotOlderThan")
    );
    assert_eq!(per[INSTALLATIONS][0], format!("GET {INSTALLATIONS}?&resourceVersion=0&resourceVersionMatch=NotOlderThan"));
    assert_eq!(per[KUBE_SYSTEM_DS].iter().filter(|l| !l.contains("watch=true")).count(), 2, "{:?}", per[KUBE_SYSTEM_DS]);
}

#[tokio::test]
async fn one_shot_load_with_an_unreadable_optional_source_still_loads() {
    let group = CalicoGroup::CrdV1;
    let objects = cluster_objects(&examples_cluster(), group);
    let api = StdArc::new(FakeApi::default());
    script_discovery(&api, group);
    for plural in CALICO_PLURALS.iter().copied().chain(["nodes"]) {
        api.json(&format!("GET {}", path(group, plural)), list(group, plural, "100", objects.get(plural).map_or(&[][..], Vec::as_slice)));
    }
    api.on(&format!("GET {KUBE_SYSTEM_DS}"), forbidden_ds("kube-system"));
    let snap = KubernetesDatastore::new(api.client(), ApiGroupChoice::Auto).load().await.unwrap();
    assert_eq!(snap.cluster.unread.keys().collect::<Vec<_>>(), [&OptionalSource::CalicoNodeEnv("kube-system")]);
    assert!(snap.load_errors.is_empty());
    // Without the operator's group, calico-system and installations are not even asked for.
    assert!(api.log().iter().all(|l| !l.contains("calico-system") && !l.contains("installations")), "{:?}", api.log());
}

/// Lists come from the watch cache (issue 23): each completed list, the first and a re-list
/// after 410, holds deletions for the settle period (`settled: false`), and a snapshot with
/// `settled: true` follows when it ends, without any new event.
#[tokio::test]
async fn cache_lists_hold_deletions_for_the_settle_period_after_every_list() {
    let group = CalicoGroup::CrdV1;
    let api = StdArc::new(FakeApi::default());
    script_discovery(&api, group);
    let mut objects = Objects::new();
    objects.insert("ippools", vec![pool("p", "1", "10.244.0.0/16")]);
    objects.insert("ipamblocks", vec![block("10-244-1-0-26", "2", "10.244.1.0/26", "a"), block("10-244-2-0-26", "3", "10.244.2.0/26", "b")]);
    let watches = script_lists(&api, group, &objects, "100");
    let blocks = path(group, "ipamblocks");
    api.json(&format!("GET {blocks}"), list(group, "ipamblocks", "200", &[block("10-244-1-0-26", "2", "10.244.1.0/26", "a")]));
    let _relisted = api.watch(&blocks);
    let settle = Duration::from_millis(400);
    let mut ds = Running::start_settling(&api, ApiGroupChoice::Auto, settle);
    let first = ds.snapshot().await;
    assert!(!first.settled, "the first list settles first");
    assert_eq!(ds.next().await, DatastoreEvent::Synced);
    let started = std::time::Instant::now();
    let settled = ds.snapshot().await;
    assert!(settled.settled && started.elapsed() < settle + Duration::from_millis(300), "settled after {:?}", started.elapsed());
    assert_eq!(*settled.cluster, *first.cluster);

    // 410 Gone, re-list without one block: the deletion arrives unsettled, then settles.
    watches["ipamblocks"].unbounded_send(event("ERROR", &status(410, "Expired", "too old resource version"))).unwrap();
    let events = ds.until_synced().await;
    let last = events.iter().rev().find_map(|e| if let DatastoreEvent::Snapshot(s) = e { Some(s.clone()) } else { None }).expect("a snapshot");
    assert_eq!(last.cluster.ipam_blocks.len(), 1);
    assert!(!last.settled, "a re-list's absences are not evidence yet");
    let s = ds.snapshot().await;
    assert!(s.settled);
    assert_eq!(s.cluster.ipam_blocks.len(), 1);
    // Every list asked the watch cache.
    let lists: Vec<String> = api.log().into_iter().filter(|l| l.contains(&blocks) && !l.contains("watch=true")).collect();
    assert_eq!(lists, [list_url(group, "ipamblocks"), list_url(group, "ipamblocks")]);
    assert!(lists[0].contains("resourceVersion=0&resourceVersionMatch=NotOlderThan"));
}

/// Retry delays (issue 23): every delay of [`default_backoff`] is its step (500 ms doubling to
/// 5 s) plus up to 100 % jitter, so under 10 s; and agents that fail together do not retry
/// together (1,000 agents' first retries spread over the step).
#[test]
fn backoff_is_capped_and_jittered_across_agents() {
    let mut b = default_backoff();
    let delays: Vec<Duration> = (0..12).map(|_| b.next().expect("endless")).collect();
    let steps = [500u64, 1000, 2000, 4000, 5000, 5000, 5000, 5000, 5000, 5000, 5000, 5000];
    for (d, step) in delays.iter().zip(steps) {
        let step = Duration::from_millis(step);
        assert!(*d >= step && *d < step * 2, "{d:?} for step {step:?}");
    }
    assert!(delays.iter().all(|d| *d < Duration::from_secs(10)));
    // 1,000 agents failing at the same instant: their first retries are spread, not in step.
    let firsts: Vec<u128> = (0..1000).map(|_| default_backoff().next().unwrap().as_millis()).collect();
    let distinct: BTreeSet<u128> = firsts.iter().copied().collect();
    assert!(distinct.len() > 300, "only {} distinct first delays among 1,000 agents", distinct.len());
    let (min, max) = (firsts.iter().min().unwrap(), firsts.iter().max().unwrap());
    assert!(*min < 600 && *max > 900, "first retries span {min}..{max} ms");
    // A complete list resets it.
    b.reset();
    assert!(b.next().unwrap() < Duration::from_secs(1));
}

/// A 20 s API outage during which a block was deleted (issue 23): with the capped backoff the
/// datastore is synced again, with the deletion, within 30 s of the outage's start; and it
/// never claims to be synced while the list fails. Virtual time (tokio's paused clock) from
/// the first sync on.
#[tokio::test]
async fn a_20_s_outage_is_followed_within_one_backoff_step() {
    let group = CalicoGroup::CrdV1;
    let api = StdArc::new(FakeApi::default());
    script_discovery(&api, group);
    let mut objects = Objects::new();
    objects.insert("ippools", vec![pool("p", "1", "10.244.0.0/16")]);
    objects.insert("ipamblocks", vec![block("10-244-1-0-26", "2", "10.244.1.0/26", "a"), block("10-244-2-0-26", "3", "10.244.2.0/26", "b")]);
    let mut watches = script_lists(&api, group, &objects, "100");
    let (tx, mut rx) = mpsc::channel(64);
    let ds = KubernetesDatastore::new(api.client(), ApiGroupChoice::Auto).with_debounce(Duration::from_millis(30)).with_list_settle(Duration::ZERO);
    let task = ds.spawn(tx);
    let mut next = async || tokio::time::timeout(Duration::from_mins(1), rx.recv()).await.expect("an event").expect("running");
    while next().await != DatastoreEvent::Synced {}
    // From here on, virtual time: the clock only moves when every task waits.
    tokio::time::pause();

    // The outage: the block watch ends, re-watching is refused, and every list is refused
    // with 500 until t = 20 s.
    let blocks = path(group, "ipamblocks");
    api.on(&format!("WATCH {blocks}"), Reply::Unreachable);
    for _ in 0..200 {
        api.on(&format!("GET {blocks}"), Reply::Json(StatusCode::INTERNAL_SERVER_ERROR, status(500, "InternalError", "etcdserver: request timed out")));
    }
    api.take_log();
    let start = tokio::time::Instant::now();
    drop(watches.remove("ipamblocks"));
    let recovery = {
        let api = api.clone();
        let blocks = blocks.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(20)).await;
            api.replies_clear(&format!("GET {blocks}"));
            api.json(&format!("GET {blocks}"), list(group, "ipamblocks", "300", &[block("10-244-1-0-26", "2", "10.244.1.0/26", "a")]));
            api.watch(&blocks)
        })
    };
    let mut last = None;
    loop {
        match next().await {
            DatastoreEvent::Synced => break,
            DatastoreEvent::Snapshot(s) => last = Some(s),
            DatastoreEvent::Unsynced { .. } | DatastoreEvent::LoadFailed(_) => {}
        }
    }
    let took = start.elapsed();
    let _watch = recovery.await.unwrap();
    assert!(took >= Duration::from_secs(20) && took <= Duration::from_secs(30), "synced again {took:?} after the outage began");
    let last = last.expect("a snapshot with the re-list");
    assert_eq!(last.cluster.ipam_blocks.keys().map(|k| &**k).collect::<Vec<_>>(), ["10-244-1-0-26"]);
    // Retries during the 20 s: at most one per backoff step (0.5, 1, 2, 4, 5, 5 … s, each + up
    // to 100 %): between 3 and 12 lists, not a storm.
    let lists = api.log().iter().filter(|l| l.contains(&blocks) && !l.contains("watch=true")).count();
    assert!((3..=12).contains(&lists), "{lists} lists during the outage");
    task.abort();
}

/// Every request carries `User-Agent: routewarden/<version>` (issue 23): a kubeconfig pointing
/// at a one-shot HTTP server on loopback, which records the request line and headers.
#[tokio::test]
async fn requests_carry_the_routewarden_user_agent() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 8192];
        let mut got = Vec::new();
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = sock.read(&mut buf).await.unwrap();
            assert!(n > 0, "connection closed before the headers ended");
            got.extend_from_slice(&buf[..n]);
        }
        let body = r#"{"kind":"APIGroupList","apiVersion":"v1","groups":[]}"#;
        let reply = format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len());
        sock.write_all(reply.as_bytes()).await.unwrap();
        String::from_utf8(got).unwrap()
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    std::fs::write(
        &path,
        format!("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: \"http://127.0.0.1:{port}\"}}\nusers:\n- name: u\n  user: {{token: abc}}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n"),
    )
    .unwrap();
    let ds = KubernetesDatastore::connect(&KubernetesOptions { kubeconfig: Some(path), api_group: ApiGroupChoice::Auto, ..KubernetesOptions::default() })
        .await
        .unwrap();
    let err = discover(&ds.client, ApiGroupChoice::Auto).await.unwrap_err();
    assert!(matches!(err, KubernetesError::NoCalicoGroup), "{err}");
    let request = server.await.unwrap();
    assert!(request.starts_with("GET /apis HTTP/1.1\r\n"), "{request}");
    let ua: Vec<&str> = request.lines().filter(|l| l.to_ascii_lowercase().starts_with("user-agent:")).collect();
    assert_eq!(ua, [format!("user-agent: routewarden/{}", env!("CARGO_PKG_VERSION"))], "{request}");
}

/// A hung API server (issue 23): the connection is up but `GET /version` gets no answer. After
/// one probe interval plus its timeout the datastore says Unsynced (so `/readyz` stops saying
/// synced and nothing is deleted); an answer to the next probe makes it synced again without
/// any re-list; a second silent probe in a row restarts every watch, and it is synced again
/// only once every resource has listed. Virtual time from the first sync on.
#[tokio::test]
async fn a_hung_api_server_is_noticed_and_every_resource_relisted() {
    let group = CalicoGroup::CrdV1;
    let api = StdArc::new(FakeApi::default());
    script_discovery(&api, group);
    let mut objects = Objects::new();
    objects.insert("ippools", vec![pool("p", "1", "10.244.0.0/16")]);
    let _w = script_lists(&api, group, &objects, "100");
    // Probes 1 and 3 and 4 hang; probe 2 is answered (404 from the fake: an answer all the same).
    let hung1 = api.deferred("GET /version");
    api.on("GET /version", Reply::Json(StatusCode::NOT_FOUND, status(404, "NotFound", "no version")));
    let hung3 = api.deferred("GET /version");
    let hung4 = api.deferred("GET /version");
    let (tx, mut rx) = mpsc::channel(64);
    let probe = Probe { interval: Duration::from_secs(30), timeout: Duration::from_secs(10) };
    let ds = KubernetesDatastore::new(api.client(), ApiGroupChoice::Auto)
        .with_debounce(Duration::from_millis(30))
        .with_list_settle(Duration::ZERO)
        .with_probe(probe);
    let task = ds.spawn(tx);
    let mut next = async || tokio::time::timeout(Duration::from_mins(5), rx.recv()).await.expect("an event").expect("running");
    while next().await != DatastoreEvent::Synced {}
    tokio::time::pause();
    let start = tokio::time::Instant::now();
    api.take_log();
    let silent = "API server not answering: GET /version got no answer within 10 s";

    // Probe 1 (t ≈ 30 s) hangs: Unsynced at ≈ 40 s; probe 2 (≈ 70 s) answers: Synced, no re-list.
    assert_eq!(next().await, DatastoreEvent::Unsynced { reason: silent.to_owned() });
    let noticed = start.elapsed();
    // One interval (30 s, started before the clock was paused) plus the 10 s timeout.
    assert!(noticed >= Duration::from_secs(39) && noticed <= Duration::from_secs(41), "noticed after {noticed:?}");
    // Counted as stale (`routewarden_datastore_load_errors_total{reason="stale"}`).
    let stale = DatastoreEvent::LoadFailed(LoadError::new("kubernetes API server", LoadErrorKind::Stale, silent));
    assert_eq!(next().await, stale);
    assert_eq!(next().await, DatastoreEvent::Synced);
    assert!(api.take_log().iter().all(|l| l.contains("/version")), "an answer again re-lists nothing");

    // Probes 3 and 4 hang: Unsynced, then every watch restarted; the re-lists are answered.
    let _again = script_lists(&api, group, &objects, "200");
    assert_eq!(next().await, DatastoreEvent::Unsynced { reason: silent.to_owned() });
    assert_eq!(next().await, stale);
    let events = events_until_synced(&mut rx, Duration::from_mins(5)).await;
    assert!(events.iter().all(|e| !matches!(e, DatastoreEvent::Unsynced { .. })), "{events:?}");
    let lists: BTreeSet<String> =
        api.log().iter().filter(|l| !l.contains("watch=true") && !l.contains("/version")).map(|l| l.split('?').next().unwrap().to_owned()).collect();
    let mut want: BTreeSet<String> = CALICO_PLURALS.iter().chain(&["nodes"]).map(|p| format!("GET {}", path(group, p))).collect();
    want.insert(format!("GET {KUBE_SYSTEM_DS}"));
    assert_eq!(lists, want, "every resource listed again");
    drop((hung1, hung3, hung4));
    task.abort();
}

/// A list's objects are decoded one at a time as they are handed out (`ListPage`), not all
/// before the first: an object that does not decode (a `metadata.name` that is not a string)
/// fails that list as `Api::list` failed it, after its earlier objects were read. Nothing of
/// the failed list reaches the view: every snapshot keeps both blocks until a good re-list,
/// and only that one applies the deletion.
#[tokio::test]
async fn an_object_that_does_not_decode_fails_its_list_and_loses_nothing() {
    let group = CalicoGroup::CrdV1;
    let api = StdArc::new(FakeApi::default());
    script_discovery(&api, group);
    let mut objects = Objects::new();
    objects.insert("ippools", vec![pool("p", "1", "10.244.0.0/16")]);
    objects.insert("ipamblocks", vec![block("10-244-1-0-26", "2", "10.244.1.0/26", "a"), block("10-244-2-0-26", "3", "10.244.2.0/26", "b")]);
    let watches = script_lists(&api, group, &objects, "100");
    let blocks = path(group, "ipamblocks");
    let mut broken = block("10-244-3-0-26", "4", "10.244.3.0/26", "c");
    broken["metadata"]["name"] = json!(5);
    api.json(&format!("GET {blocks}"), list(group, "ipamblocks", "200", &[block("10-244-1-0-26", "2", "10.244.1.0/26", "a"), broken]));
    api.json(&format!("GET {blocks}"), list(group, "ipamblocks", "201", &[block("10-244-1-0-26", "2", "10.244.1.0/26", "a")]));
    let _relisted_watch = api.watch(&blocks);
    let mut ds = Running::start(&api, ApiGroupChoice::Auto);
    assert_eq!(ds.snapshot().await.cluster.ipam_blocks.len(), 2);
    assert_eq!(ds.next().await, DatastoreEvent::Synced);
    api.take_log();

    watches["ipamblocks"].unbounded_send(event("ERROR", &status(410, "Expired", "too old resource version: 100 (190)"))).unwrap();
    let DatastoreEvent::Unsynced { .. } = ds.next().await else { panic!("expected Unsynced") };
    let events = ds.until_synced().await;
    let reasons: Vec<&str> = events.iter().filter_map(|e| if let DatastoreEvent::Unsynced { reason } = e { Some(reason.as_str()) } else { None }).collect();
    assert_eq!(
        reasons,
        vec!["ipamblocks.crd.projectcalico.org: list failed: Error deserializing response: items[1]: invalid type: integer `5`, expected a string at line 1 column 331"]
    );
    assert_deletion_only_after_the_relist(&events);
    // The broken list, then a good one and a watch from its version.
    assert_eq!(api.take_log(), vec![list_url(group, "ipamblocks"), list_url(group, "ipamblocks"), watch_url(group, "ipamblocks", "201")]);
}
