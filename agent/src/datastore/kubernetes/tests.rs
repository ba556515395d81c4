//! Tests of the Kubernetes datastore against a mocked API server (tower-test) that asserts
//! the exact requests. This file holds the mocked server (`fake`) and the scripting helpers
//! the topics share; the tests are in `tests/`: `rbac.rs` (the RBAC table against the
//! manifest), `discovery.rs`, `sync.rs` (lists, paging, parsing, live changes), `failures.rs`
//! (410, silent watches, outages, backoff), `optional.rs` (calico-node env, Installation),
//! `rediscovery.rs` (API groups that appear and vanish while the datastore runs),
//! `trimmed_decode.rs` and `view_events.rs`.

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

mod discovery;
mod failures;
mod live_changes;
mod optional;
mod rbac;
mod rediscovery;
mod sync;
mod trimmed_decode;
mod view_events;

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

/// The collection path of a resource: `/apis/<group>/<version>/<plural>`, `/api/v1/nodes`.
fn path(group: CalicoGroup, plural: &str) -> String {
    if plural == "nodes" {
        "/api/v1/nodes".to_owned()
    } else {
        format!("/apis/{}/{plural}", group.api_version())
    }
}

fn kind_of(plural: &str) -> &'static str {
    super::resources::CALICO_RESOURCES.iter().find(|w| w.plural == plural).map_or("Node", |w| w.kind.as_str())
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
            let (ann, addrs) = super::calico_node::core_node_fields(item);
            out.entry("nodes").or_default().push(node(name, &rv, &ann, &addrs));
        } else {
            let plural = super::resources::CALICO_RESOURCES.iter().find(|w| w.kind.as_str() == kind).map(|w| w.plural).unwrap();
            out.entry(plural).or_default().push(object(group, plural, name, &rv, &item["spec"]));
        }
    }
    out
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

    /// With deletions held for `settle` after each list (no discovery on a timer).
    fn start_settling(api: &StdArc<FakeApi>, choice: ApiGroupChoice, settle: Duration) -> Running {
        Running::start_with(api, choice, settle, None)
    }

    /// With deletions held for `settle` after each list and discovery again every `discovery`.
    fn start_with(api: &StdArc<FakeApi>, choice: ApiGroupChoice, settle: Duration, discovery: Option<Duration>) -> Running {
        let (tx, rx) = mpsc::channel(64);
        let ds = KubernetesDatastore::new(api.client(), choice)
            .with_debounce(Duration::from_millis(30))
            .with_list_settle(settle)
            .with_discovery_interval(discovery)
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

fn pool(name: &str, rv: &str, cidr: &str) -> Json {
    object(CalicoGroup::CrdV1, "ippools", name, rv, &json!({"cidr": cidr, "ipipMode": "Always", "vxlanMode": "Never"}))
}

/// Discovery, IP pool `p` and two IPAM blocks (10.244.1.0/26 of node a, 10.244.2.0/26 of b)
/// scripted at resourceVersion 100: the API, each resource's watch, and the blocks' path for
/// scripting the re-lists a test needs.
fn two_blocks_scripted(group: CalicoGroup) -> (StdArc<FakeApi>, BTreeMap<&'static str, UnboundedSender<Bytes>>, String) {
    let api = StdArc::new(FakeApi::default());
    script_discovery(&api, group);
    let mut objects = Objects::new();
    objects.insert("ippools", vec![pool("p", "1", "10.244.0.0/16")]);
    objects.insert("ipamblocks", vec![block("10-244-1-0-26", "2", "10.244.1.0/26", "a"), block("10-244-2-0-26", "3", "10.244.2.0/26", "b")]);
    let watches = script_lists(&api, group, &objects, "100");
    let blocks = path(group, "ipamblocks");
    (api, watches, blocks)
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
