//! The pod proxy and label selectors, with exact answers: a pod's own answer relayed, the API
//! server's 503 for a pod that refuses, 404 for a pod that does not exist, 403 without
//! `pods/proxy`; lists by label. The pods here listen on this namespace's loopback.

use std::io::{Read as _, Write as _};

use http_body_util::BodyExt as _;
use serde_json::{json, Value};

use super::super::*;

fn pods() -> ResourceType {
    ResourceType::new("v1", "Pod", "pods", true)
}

fn pod(name: &str, labels: &Value, port: u16) -> Value {
    json!({"metadata": {"name": name, "namespace": "rw", "labels": labels},
           "spec": {"containers": [{"name": "c", "ports": [{"name": "metrics", "containerPort": port}]}]},
           "status": {"podIP": "127.0.0.1"}})
}

/// A server on loopback that answers one request with `answer` and returns what it was asked.
fn one_answer(answer: &'static str) -> (u16, std::thread::JoinHandle<String>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut asked = Vec::new();
        let mut buf = [0u8; 1024];
        while !asked.ends_with(b"\r\n\r\n") {
            let n = s.read(&mut buf).unwrap();
            asked.extend_from_slice(&buf[..n]);
        }
        s.write_all(answer.as_bytes()).unwrap();
        String::from_utf8(asked).unwrap()
    });
    (port, t)
}

/// A port nothing listens on (bound, then closed).
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

async fn get(api: &ApiServer, uri: &str, token: Option<&str>) -> (u16, Option<String>, String) {
    let mut headers = http::HeaderMap::new();
    if let Some(t) = token {
        headers.insert(http::header::AUTHORIZATION, http::HeaderValue::from_str(&format!("Bearer {t}")).unwrap());
    }
    let r = api.serve(&http::Method::GET, &uri.parse().unwrap(), &headers, &[]).await;
    let status = r.status().as_u16();
    let ct = r.headers().get(http::header::CONTENT_TYPE).map(|v| v.to_str().unwrap().to_owned());
    let body = r.into_body().collect().await.unwrap().to_bytes();
    (status, ct, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test]
async fn the_pods_answer_comes_back_as_is_and_a_refusal_is_the_api_servers_503() {
    let api = ApiServer::new();
    api.register(&pods());
    let (port, asked) = one_answer("HTTP/1.1 418 I'm a teapot\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nshort");
    api.create(&pods(), pod("up", &json!({}), port)).unwrap();
    let (status, ct, body) = get(&api, &format!("/api/v1/namespaces/rw/pods/up:{port}/proxy/status/v1?x=1"), None).await;
    assert_eq!((status, ct.as_deref(), body.as_str()), (418, Some("text/plain"), "short"));
    assert!(asked.join().unwrap().starts_with("GET /status/v1?x=1 HTTP/1.0\r\n"));
    // No port in the path: the first container port.
    let (port, asked) = one_answer("HTTP/1.0 200 OK\r\n\r\n{}");
    api.create(&pods(), pod("first-port", &json!({}), port)).unwrap();
    assert_eq!(get(&api, "/api/v1/namespaces/rw/pods/first-port/proxy/", None).await.0, 200);
    assert!(asked.join().unwrap().starts_with("GET / HTTP/1.0\r\n"));

    let closed = closed_port();
    api.create(&pods(), pod("down", &json!({}), closed)).unwrap();
    let (status, _, body) = get(&api, &format!("/api/v1/namespaces/rw/pods/down:{closed}/proxy/status/v1"), None).await;
    let want = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "code": 503, "reason": "ServiceUnavailable",
                      "message": format!("error trying to reach service: dial tcp 127.0.0.1:{closed}: connect: connection refused")});
    assert_eq!((status, serde_json::from_str::<Value>(&body).unwrap()), (503, want));
    let (status, _, body) = get(&api, "/api/v1/namespaces/rw/pods/gone:80/proxy/status/v1", None).await;
    assert_eq!((status, serde_json::from_str::<Value>(&body).unwrap()["message"].as_str()), (404, Some("pods \"gone\" not found")));
    let logged: Vec<(String, u16)> = api.log().entries().iter().map(|e| (e.verb.clone(), e.status)).collect();
    assert_eq!(logged, [("get".to_owned(), 418), ("get".to_owned(), 200), ("get".to_owned(), 503), ("get".to_owned(), 404)]);
}

#[tokio::test]
async fn the_proxy_needs_get_on_pods_proxy() {
    let role = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: r}\nrules:\n- {apiGroups: [\"\"], resources: [pods], verbs: [get, list]}\n\
---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: b}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: r}\n\
subjects: [{kind: User, name: bob}]\n";
    let api = ApiServer::new().with_rbac(Rbac::from_manifests(role).unwrap());
    api.set_tokens([("t".to_owned(), User { name: "bob".into(), groups: vec!["system:authenticated".into()] })]);
    api.register(&pods());
    api.create(&pods(), pod("p", &json!({}), closed_port())).unwrap();
    let (status, _, body) = get(&api, "/api/v1/namespaces/rw/pods/p:1/proxy/status/v1", Some("t")).await;
    assert_eq!(status, 403);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["message"],
        "pods \"p:1\" is forbidden: User \"bob\" cannot get resource \"pods/proxy\" in API group \"\" in the namespace \"rw\""
    );
}

#[tokio::test]
async fn lists_select_by_label() {
    let api = ApiServer::new();
    api.register(&pods());
    api.create(&pods(), pod("agent", &json!({"app.kubernetes.io/name": "routewarden", "tier": "node"}), 1)).unwrap();
    api.create(&pods(), pod("other", &json!({"app.kubernetes.io/name": "calico-node"}), 1)).unwrap();
    api.create(&pods(), pod("bare", &json!({}), 1)).unwrap();
    let names = |body: &str| -> Vec<String> {
        serde_json::from_str::<Value>(body).unwrap()["items"].as_array().unwrap().iter().map(|i| i["metadata"]["name"].as_str().unwrap().to_owned()).collect()
    };
    for (selector, want) in [
        ("app.kubernetes.io%2Fname%3Droutewarden", vec!["agent"]),
        ("app.kubernetes.io%2Fname%3D%3Droutewarden%2Ctier", vec!["agent"]),
        ("app.kubernetes.io%2Fname%21%3Droutewarden", vec!["bare", "other"]),
        ("%21tier", vec!["bare", "other"]),
    ] {
        let (status, _, body) = get(&api, &format!("/api/v1/namespaces/rw/pods?labelSelector={selector}"), None).await;
        assert_eq!((status, names(&body)), (200, want.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()), "{selector}");
    }
    let (status, _, _) = get(&api, "/api/v1/namespaces/rw/pods?labelSelector=tier+in+%28node%29", None).await;
    assert_eq!(status, 400);
}
