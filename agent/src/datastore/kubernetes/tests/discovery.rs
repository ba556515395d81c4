//! API discovery (the served group, forced groups, what is missing, retries) and the client built from a kubeconfig (TLS, `User-Agent`).

use super::*;

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

/// Every request carries `User-Agent: routewarden/<version>`: a kubeconfig pointing
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
