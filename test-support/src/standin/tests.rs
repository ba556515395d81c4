//! The stand-in's semantics, each with exact values: list resourceVersion semantics, paging and
//! expiring continue tokens, watches (from a version, 410, bookmarks, initial events), field
//! selectors, authentication and RBAC, discovery, the in-process client, Event writes.

use http_body_util::BodyExt as _;
use serde_json::{json, Value};

use super::*;

fn nodes() -> ResourceType {
    ResourceType::new("v1", "Node", "nodes", false)
}

fn daemonsets() -> ResourceType {
    ResourceType::new("apps/v1", "DaemonSet", "daemonsets", true)
}

/// Nodes n0..n4 at versions 1..5.
fn five_nodes() -> ApiServer {
    let api = ApiServer::new();
    api.register(&nodes());
    for i in 0..5 {
        api.create(&nodes(), json!({"metadata": {"name": format!("n{i}")}})).unwrap();
    }
    api
}

fn request(api: &ApiServer, uri: &str, token: Option<&str>) -> http::Response<Body> {
    let mut headers = http::HeaderMap::new();
    if let Some(t) = token {
        headers.insert(http::header::AUTHORIZATION, http::HeaderValue::from_str(&format!("Bearer {t}")).unwrap());
    }
    api.handle(&http::Method::GET, &uri.parse().unwrap(), &headers, &[])
}

/// Status and JSON body of a request that is not a watch.
fn get_as(api: &ApiServer, uri: &str, token: Option<&str>) -> (u16, Value) {
    let r = request(api, uri, token);
    let status = r.status().as_u16();
    let bytes = futures::executor::block_on(r.into_body().collect()).unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&bytes))))
}

fn get(api: &ApiServer, uri: &str) -> (u16, Value) {
    get_as(api, uri, None)
}

fn names(list: &Value) -> Vec<&str> {
    list["items"].as_array().unwrap().iter().map(|i| i["metadata"]["name"].as_str().unwrap()).collect()
}

/// The first `n` events of a watch (one JSON per line).
async fn events(body: &mut Body, n: usize) -> Vec<Value> {
    let mut text = String::new();
    while text.matches('\n').count() < n {
        let frame = tokio::time::timeout(std::time::Duration::from_secs(5), body.frame()).await.expect("an event in time").expect("the watch is open").unwrap();
        text.push_str(std::str::from_utf8(frame.data_ref().unwrap()).unwrap());
    }
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn event_summary(e: &Value) -> String {
    format!(
        "{} {} {}",
        e["type"].as_str().unwrap(),
        e["object"]["metadata"]["name"].as_str().unwrap_or("-"),
        e["object"]["metadata"]["resourceVersion"].as_str().unwrap_or("-")
    )
}

#[test]
fn list_resource_versions_follow_the_documented_semantics() {
    let api = five_nodes();
    // Unset: most recent.
    let (code, l) = get(&api, "/api/v1/nodes");
    assert_eq!((code, l["kind"].as_str(), l["metadata"]["resourceVersion"].as_str()), (200, Some("NodeList"), Some("5")));
    assert_eq!(names(&l), ["n0", "n1", "n2", "n3", "n4"]);
    // 0: any version, from the watch cache, whole whatever the limit.
    let (code, l) = get(&api, "/api/v1/nodes?resourceVersion=0&resourceVersionMatch=NotOlderThan&limit=2");
    assert_eq!((code, names(&l).len(), l["metadata"].get("continue")), (200, 5, None));
    // NotOlderThan 3: the current state.
    let (_, l) = get(&api, "/api/v1/nodes?resourceVersion=3&resourceVersionMatch=NotOlderThan");
    assert_eq!((l["metadata"]["resourceVersion"].as_str(), names(&l).len()), (Some("5"), 5));
    // Exact 3: the state at 3.
    let (_, l) = get(&api, "/api/v1/nodes?resourceVersion=3&resourceVersionMatch=Exact");
    assert_eq!((l["metadata"]["resourceVersion"].as_str(), names(&l)), (Some("3"), vec!["n0", "n1", "n2"]));
    // Newer than the store: 504 ResourceVersionTooLarge.
    let (code, s) = get(&api, "/api/v1/nodes?resourceVersion=9&resourceVersionMatch=NotOlderThan");
    assert_eq!((code, s["reason"].as_str(), s["message"].as_str()), (504, Some("Timeout"), Some("Too large resource version: 9, current: 5")));
    assert_eq!(s["details"]["causes"][0]["reason"], "ResourceVersionTooLarge");
    // Invalid combinations: 422.
    for uri in [
        "/api/v1/nodes?resourceVersionMatch=NotOlderThan",
        "/api/v1/nodes?resourceVersion=0&resourceVersionMatch=Exact",
        "/api/v1/nodes?sendInitialEvents=true",
    ] {
        let (code, s) = get(&api, uri);
        assert_eq!((code, s["reason"].as_str()), (422, Some("Invalid")), "{uri}: {s}");
    }
    // Compacted: an exact read of an older version is 410 Expired.
    assert_eq!(api.compact(), 5);
    let (code, s) = get(&api, "/api/v1/nodes?resourceVersion=3&resourceVersionMatch=Exact");
    assert_eq!((code, s["reason"].as_str(), s["message"].as_str()), (410, Some("Expired"), Some("The resourceVersion for the provided list is too old.")));
    // The object at a version: get.
    let (code, o) = get(&api, "/api/v1/nodes/n3");
    assert_eq!((code, o["metadata"]["resourceVersion"].as_str()), (200, Some("4")));
    let (code, s) = get(&api, "/api/v1/nodes/nx");
    assert_eq!((code, s["message"].as_str()), (404, Some("nodes \"nx\" not found")));
}

#[test]
fn pages_are_consistent_and_continue_tokens_expire_with_compaction() {
    let api = five_nodes();
    let (_, p1) = get(&api, "/api/v1/nodes?limit=2");
    assert_eq!((names(&p1), p1["metadata"]["remainingItemCount"].as_u64()), (vec!["n0", "n1"], Some(3)));
    let token = p1["metadata"]["continue"].as_str().unwrap().to_owned();
    // A change between pages is not seen: every page is of version 5.
    api.delete(&nodes(), None, "n3").unwrap();
    let (_, p2) = get(&api, &format!("/api/v1/nodes?limit=2&continue={token}"));
    assert_eq!((names(&p2), p2["metadata"]["resourceVersion"].as_str()), (vec!["n2", "n3"], Some("5")));
    let (_, p3) = get(&api, &format!("/api/v1/nodes?limit=2&continue={}", p2["metadata"]["continue"].as_str().unwrap()));
    assert_eq!((names(&p3), p3["metadata"].get("continue")), (vec!["n4"], None));
    // Compacted past version 5: the token has expired (410), and the answer carries a token
    // for an inconsistent continuation at the current version (6: n3 is gone).
    assert_eq!(api.compact(), 6);
    let (code, s) = get(&api, &format!("/api/v1/nodes?limit=2&continue={token}"));
    assert_eq!((code, s["reason"].as_str()), (410, Some("Expired")));
    assert!(s["message"].as_str().unwrap().starts_with("The provided continue parameter is too old"), "{s}");
    let fresh = s["metadata"]["continue"].as_str().unwrap();
    let (_, rest) = get(&api, &format!("/api/v1/nodes?limit=5&continue={fresh}"));
    assert_eq!((names(&rest), rest["metadata"]["resourceVersion"].as_str()), (vec!["n2", "n4"], Some("6")));
    // A continue token with a version is refused; a made-up one too.
    assert_eq!(get(&api, &format!("/api/v1/nodes?resourceVersion=6&continue={fresh}")).0, 400);
    assert_eq!(get(&api, "/api/v1/nodes?continue=bm90LWEtdG9rZW4").0, 400);
}

#[tokio::test]
async fn watches_start_at_a_version_expire_and_bookmark() {
    let api = five_nodes();
    // From version 5: only later changes.
    let mut w = request(&api, "/api/v1/nodes?watch=true&resourceVersion=5&allowWatchBookmarks=true", None).into_body();
    api.create(&nodes(), json!({"metadata": {"name": "n5"}})).unwrap();
    api.update(&nodes(), json!({"metadata": {"name": "n0", "labels": {"a": "b"}}})).unwrap();
    api.delete(&nodes(), None, "n1").unwrap();
    api.bookmark();
    let got: Vec<String> = events(&mut w, 4).await.iter().map(event_summary).collect();
    assert_eq!(got, ["ADDED n5 6", "MODIFIED n0 7", "DELETED n1 8", "BOOKMARK - 8"]);
    // From version 6 (kept): the changes after it, then live.
    let mut w2 = request(&api, "/api/v1/nodes?watch=true&resourceVersion=6", None).into_body();
    let got: Vec<String> = events(&mut w2, 2).await.iter().map(event_summary).collect();
    assert_eq!(got, ["MODIFIED n0 7", "DELETED n1 8"]);
    // Unset: the current state as ADDED.
    let mut w3 = request(&api, "/api/v1/nodes?watch=true", None).into_body();
    let got: Vec<String> = events(&mut w3, 5).await.iter().map(event_summary).collect();
    assert_eq!(got, ["ADDED n0 7", "ADDED n2 3", "ADDED n3 4", "ADDED n4 5", "ADDED n5 6"]);
    // Compacted: an ERROR event with 410 Expired, on a 200 stream.
    api.compact();
    let r = request(&api, "/api/v1/nodes?watch=true&resourceVersion=6", None);
    assert_eq!(r.status(), 200);
    let e = events(&mut r.into_body(), 1).await.remove(0);
    assert_eq!((e["type"].as_str(), e["object"]["code"].as_u64(), e["object"]["reason"].as_str()), (Some("ERROR"), Some(410), Some("Expired")));
    assert_eq!(e["object"]["message"], "too old resource version: 6 (8)");
    // Closing every watch ends the streams.
    assert_eq!(api.watches(), 3);
    api.close_watches();
    assert!(w.frame().await.is_none());
}

#[tokio::test]
async fn initial_events_end_with_an_annotated_bookmark() {
    let api = five_nodes();
    let mut w = request(&api, "/api/v1/nodes?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true", None).into_body();
    let got = events(&mut w, 6).await;
    assert_eq!(got.iter().map(event_summary).collect::<Vec<_>>(), ["ADDED n0 1", "ADDED n1 2", "ADDED n2 3", "ADDED n3 4", "ADDED n4 5", "BOOKMARK - 5"]);
    assert_eq!(got[5]["object"]["metadata"]["annotations"], json!({INITIAL_EVENTS_END: "true"}));
    assert_eq!(got[5]["object"]["kind"], "Node");
    for uri in [
        "/api/v1/nodes?watch=true&sendInitialEvents=true&allowWatchBookmarks=true",
        "/api/v1/nodes?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan",
        "/api/v1/nodes?watch=true&resourceVersionMatch=NotOlderThan&resourceVersion=0",
    ] {
        let (code, s) = get(&api, uri);
        assert_eq!((code, s["reason"].as_str()), (422, Some("Invalid")), "{uri}");
    }
}

#[tokio::test]
async fn field_selectors_select_by_name_and_namespace() {
    let api = five_nodes();
    let (_, l) = get(&api, "/api/v1/nodes?fieldSelector=metadata.name%3Dn1");
    assert_eq!(names(&l), ["n1"]);
    let (_, l) = get(&api, "/api/v1/nodes?fieldSelector=metadata.name!%3Dn1,metadata.name!%3Dn2");
    assert_eq!(names(&l), ["n0", "n3", "n4"]);
    let (code, s) = get(&api, "/api/v1/nodes?fieldSelector=spec.unschedulable%3Dtrue");
    assert_eq!((code, s["message"].as_str()), (400, Some("field label not supported: spec.unschedulable")));
    api.register(&daemonsets());
    for (ns, name) in [("kube-system", "calico-node"), ("kube-system", "kube-proxy"), ("calico-system", "calico-node")] {
        api.create(&daemonsets(), json!({"metadata": {"name": name, "namespace": ns}})).unwrap();
    }
    let (_, l) = get(&api, "/apis/apps/v1/namespaces/kube-system/daemonsets?fieldSelector=metadata.name%3Dcalico-node");
    assert_eq!(l["items"].as_array().unwrap().iter().map(|i| i["metadata"]["namespace"].as_str().unwrap()).collect::<Vec<_>>(), ["kube-system"]);
    let (_, l) = get(&api, "/apis/apps/v1/daemonsets?fieldSelector=metadata.namespace%3Dcalico-system");
    assert_eq!(names(&l), ["calico-node"]);
    // A watch sees only what its selector selects.
    let mut w = request(&api, "/apis/apps/v1/namespaces/kube-system/daemonsets?watch=true&resourceVersion=8&fieldSelector=metadata.name%3Dcalico-node", None)
        .into_body();
    api.update(&daemonsets(), json!({"metadata": {"name": "kube-proxy", "namespace": "kube-system"}})).unwrap();
    api.update(&daemonsets(), json!({"metadata": {"name": "calico-node", "namespace": "calico-system"}})).unwrap();
    api.update(&daemonsets(), json!({"metadata": {"name": "calico-node", "namespace": "kube-system"}})).unwrap();
    assert_eq!(events(&mut w, 1).await.iter().map(event_summary).collect::<Vec<_>>(), ["MODIFIED calico-node 11"]);
}

const MANIFESTS: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: reader}
rules:
  - {apiGroups: [""], resources: ["nodes"], verbs: ["list", "watch"]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: reader}
subjects: [{kind: ServiceAccount, name: agent, namespace: agents}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: one-ds, namespace: kube-system}
rules:
  - {apiGroups: ["apps"], resources: ["daemonsets"], resourceNames: ["calico-node"], verbs: ["list", "watch"]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: one-ds, namespace: kube-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: one-ds}
subjects: [{kind: ServiceAccount, name: agent, namespace: agents}]
"#;

#[test]
fn tokens_authenticate_and_rbac_rules_authorize() {
    let api = five_nodes().with_rbac(Rbac::from_manifests(MANIFESTS).unwrap());
    api.register(&daemonsets());
    api.set_tokens([("t1".to_owned(), User::service_account("agents", "agent"))]);
    let code = |uri: &str, token: Option<&str>| get_as(&api, uri, token).0;
    assert_eq!(code("/api/v1/nodes", None), 401);
    assert_eq!(code("/api/v1/nodes", Some("t0")), 401);
    assert_eq!(code("/api/v1/nodes", Some("t1")), 200);
    assert_eq!(request(&api, "/api/v1/nodes?watch=true&resourceVersion=5", Some("t1")).status(), 200);
    // Discovery and /version: every authenticated user.
    assert_eq!(code("/apis", Some("t1")), 200);
    assert_eq!(code("/version", Some("t1")), 200);
    // Not granted: get, another path, a namespaced list without the one name, another namespace.
    let (c, s) = get_as(&api, "/api/v1/nodes/n1", Some("t1"));
    assert_eq!(
        (c, s["message"].as_str()),
        (
            403,
            Some("nodes \"n1\" is forbidden: User \"system:serviceaccount:agents:agent\" cannot get resource \"nodes\" in API group \"\" at the cluster scope")
        )
    );
    let (c, s) = get_as(&api, "/metrics", Some("t1"));
    assert_eq!((c, s["message"].as_str()), (403, Some("forbidden: User \"system:serviceaccount:agents:agent\" cannot get path \"/metrics\"")));
    assert_eq!(code("/apis/apps/v1/namespaces/kube-system/daemonsets?fieldSelector=metadata.name%3Dcalico-node", Some("t1")), 200);
    let (c, s) = get_as(&api, "/apis/apps/v1/namespaces/kube-system/daemonsets", Some("t1"));
    assert_eq!((c, s["message"].as_str()), (403, Some("daemonsets is forbidden: User \"system:serviceaccount:agents:agent\" cannot list resource \"daemonsets\" in API group \"apps\" in the namespace \"kube-system\"")));
    assert_eq!(code("/apis/apps/v1/namespaces/calico-system/daemonsets?fieldSelector=metadata.name%3Dcalico-node", Some("t1")), 403);
    assert_eq!(code("/apis/apps/v1/daemonsets?fieldSelector=metadata.name%3Dcalico-node", Some("t1")), 403);
    // Rotation: the new token only.
    api.set_tokens([("t2".to_owned(), User::service_account("agents", "agent"))]);
    assert_eq!((code("/api/v1/nodes", Some("t1")), code("/api/v1/nodes", Some("t2"))), (401, 200));
    let log = api.log();
    assert_eq!(log.entries().iter().filter(|r| r.token.as_deref() == Some("t1")).count(), 11);
    assert_eq!(
        log.summary(),
        "get /apis=1 /metrics=1 /version=1 nodes=1 list daemonsets=1 daemonsets/calico-system=1 daemonsets/kube-system=2 nodes=5 watch nodes=1 refused=5 unauthorized=3"
    );
}

#[test]
fn discovery_lists_the_registered_groups_and_resources() {
    let api = five_nodes();
    api.register(&daemonsets());
    api.register(&ResourceType::new("crd.projectcalico.org/v1", "IPPool", "ippools", false));
    let (_, groups) = get(&api, "/apis");
    let names: Vec<&str> = groups["groups"].as_array().unwrap().iter().map(|g| g["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["apps", "crd.projectcalico.org"]);
    assert_eq!(groups["groups"][1]["preferredVersion"], json!({"groupVersion": "crd.projectcalico.org/v1", "version": "v1"}));
    let (_, r) = get(&api, "/apis/crd.projectcalico.org/v1");
    assert_eq!(
        r["resources"],
        json!([{"name": "ippools", "singularName": "ippool", "namespaced": false, "kind": "IPPool", "verbs": ["get", "list", "watch"]}])
    );
    let (_, r) = get(&api, "/api/v1");
    assert_eq!(r["resources"][0]["name"], "nodes");
    assert_eq!(get(&api, "/api").1["versions"], json!(["v1"]));
    assert_eq!(get(&api, "/apis/apps").1["kind"], "APIGroup");
    assert_eq!(get(&api, "/apis/operator.tigera.io/v1").0, 404);
    assert_eq!(get(&api, "/apis/apps/v1/namespaces/x/nodes").0, 404);
}

#[tokio::test]
async fn the_in_process_client_reads_through_kube() {
    use kube::api::{Api, DynamicObject, ListParams};
    let api = five_nodes();
    let client = api.client();
    let ar = kube::api::ApiResource::from_gvk_with_plural(&kube::api::GroupVersionKind::gvk("", "v1", "Node"), "nodes");
    let nodes: Api<DynamicObject> = Api::all_with(client, &ar);
    let mut lp = ListParams::default().limit(2);
    let mut seen = Vec::new();
    loop {
        let page = nodes.list(&lp).await.unwrap();
        seen.extend(page.items.into_iter().filter_map(|o| o.metadata.name));
        match page.metadata.continue_ {
            Some(t) if !t.is_empty() => lp = lp.continue_token(&t),
            _ => break,
        }
    }
    assert_eq!(seen, ["n0", "n1", "n2", "n3", "n4"]);
    let cached = nodes.list(&ListParams::default().match_any()).await.unwrap();
    assert_eq!(cached.items.len(), 5);
    assert_eq!(api.log().list_versions(), "rv0+NotOlderThan:1,rvnone+none:3");
}

/// A kube client for `https://<addr>` trusting `ca_pem` and sending `token`, as an
/// in-cluster configuration is built.
fn tls_client(addr: std::net::SocketAddr, ca_pem: &str, token: &str) -> kube::Client {
    use tokio_rustls::rustls::pki_types::{pem::PemObject as _, CertificateDer};
    let mut config = kube::Config::new(format!("https://{addr}").parse().unwrap());
    config.root_cert = Some(vec![CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap().to_vec()]);
    config.headers.push((http::header::AUTHORIZATION, http::HeaderValue::from_str(&format!("Bearer {token}")).unwrap()));
    kube::Client::try_from(config).unwrap()
}

#[test]
fn the_tls_server_serves_clients_that_trust_its_ca_only() {
    use kube::api::{Api, DynamicObject, ListParams};
    let pki = tls::Pki::generate(&["127.0.0.1"]).unwrap();
    let api = five_nodes();
    api.set_tokens([("t1".to_owned(), User::admin())]);
    let server = tls::TlsServer::start(api.clone(), std::net::TcpListener::bind("127.0.0.1:0").unwrap(), &pki, None).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let ar = kube::api::ApiResource::from_gvk_with_plural(&kube::api::GroupVersionKind::gvk("", "v1", "Node"), "nodes");
    rt.block_on(async {
        let nodes: Api<DynamicObject> = Api::all_with(tls_client(server.addr(), &pki.ca_pem, "t1"), &ar);
        let list = nodes.list(&ListParams::default()).await.unwrap();
        assert_eq!(list.items.iter().filter_map(|o| o.metadata.name.as_deref()).collect::<Vec<_>>(), ["n0", "n1", "n2", "n3", "n4"]);
        let wrong: Api<DynamicObject> = Api::all_with(tls_client(server.addr(), &pki.wrong_ca_pem, "t1"), &ar);
        let err = wrong.list(&ListParams::default()).await.unwrap_err();
        assert!(format!("{err:?}").contains("UnknownIssuer"), "{err:?}");
    });
    let entries = api.log().entries();
    assert_eq!(entries.len(), 1, "the wrong CA's request never reached HTTP");
    assert_eq!((entries[0].token.as_deref(), entries[0].user.as_deref(), entries[0].status), (Some("t1"), Some("system:admin"), 200));
    for _ in 0..100 {
        if !api.log().tls_failures().is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let failures = api.log().tls_failures();
    assert_eq!(failures.len(), 1);
    assert!(failures[0].ends_with("received fatal alert: UnknownCA"), "{failures:?}");
}

/// Answer a write of `body` with `content_type`: status and JSON body.
fn write(api: &ApiServer, method: &http::Method, uri: &str, content_type: &str, body: &Value) -> (u16, Value) {
    let mut headers = http::HeaderMap::new();
    headers.insert(http::header::CONTENT_TYPE, http::HeaderValue::from_str(content_type).unwrap());
    let r = api.handle(method, &uri.parse().unwrap(), &headers, body.to_string().as_bytes());
    let status = r.status().as_u16();
    let bytes = futures::executor::block_on(r.into_body().collect()).unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap())
}

/// Event writes: a create (checked as `ValidateEventCreate` checks it), a merge patch of its
/// series, a patch type the API server does not take for it, a forced failure; other writes
/// stay refused.
#[test]
fn event_creates_and_merge_patches_are_served_and_checked() {
    let api = ApiServer::new();
    let events = "/apis/events.k8s.io/v1/namespaces/default/events";
    let event = json!({"metadata": {"name": "n.1"}, "eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": "rw", "reportingInstance": "rw-n",
        "action": "WatchRoutes", "reason": "RouteConflict", "note": "x", "type": "Warning", "regarding": {"kind": "Node", "name": "n", "uid": "n"}});
    let mut no_time = event.clone();
    no_time.as_object_mut().unwrap().remove("eventTime");
    let (code, body) = write(&api, &http::Method::POST, events, "application/json", &no_time);
    assert_eq!((code, body["message"].as_str()), (422, Some("Event.events.k8s.io \"n.1\" is invalid: eventTime: Required value")));
    let (code, body) = write(&api, &http::Method::POST, events, "application/json", &event);
    assert_eq!((code, body["metadata"]["namespace"].as_str(), body["metadata"]["resourceVersion"].as_str()), (201, Some("default"), Some("1")));
    assert_eq!(write(&api, &http::Method::POST, events, "application/json", &event).0, 409);
    let series = json!({"series": {"count": 2, "lastObservedTime": "2026-01-01T00:01:00.000000Z"}, "note": "y"});
    let (code, body) = write(&api, &http::Method::PATCH, &format!("{events}/n.1"), "application/merge-patch+json", &series);
    assert_eq!((code, &body["series"]["count"], &body["note"], &body["reason"]), (200, &json!(2), &json!("y"), &json!("RouteConflict")));
    assert_eq!(write(&api, &http::Method::PATCH, &format!("{events}/n.1"), "application/json-patch+json", &json!([])).0, 415);
    assert_eq!(write(&api, &http::Method::PATCH, &format!("{events}/n.2"), "application/merge-patch+json", &series).0, 404);
    assert_eq!(api.events().len(), 1);
    api.fail_event_writes(Some(500));
    assert_eq!(write(&api, &http::Method::PATCH, &format!("{events}/n.1"), "application/merge-patch+json", &series).0, 500);
    assert_eq!(write(&api, &http::Method::POST, "/api/v1/namespaces/default/events", "application/json", &event).0, 405);
}
