//! The DaemonSet as shipped, in a cluster: `deploy/` rendered by kustomize
//! as a user applies it, the image run under podman with exactly the rendered container (args,
//! env, securityContext, mounts) plus what a kubelet gives every pod (the service-account
//! token, `ca.crt` and `namespace` under `/var/run/secrets/kubernetes.io/serviceaccount`, and
//! `KUBERNETES_SERVICE_HOST`/`KUBERNETES_SERVICE_PORT`), against the API-server stand-in
//! (`routewarden_lab::standin`) over TLS in the lab node's network namespace, which the container
//! joins as `hostNetwork` joins the node's.
//!
//! The stand-in serves the bundled example cluster (`examples/cluster`) as a
//! Kubernetes-datastore cluster serves it (the six Calico resources in
//! `crd.projectcalico.org/v1`, core Nodes with Calico's annotations, the calico-node
//! DaemonSet in kube-system), authenticates by bearer token and authorizes every request by
//! the rendered ClusterRole, Role and bindings for the agent's service account: any request
//! they do not allow is a 403, and any 403 fails the test.
//!
//! The only variant of the shipped configuration is what a kubelet fills in: the node name
//! (downward API, `node-a`) and the service-account files and env vars; plus what podman needs
//! on this machine to run the container at all (runc and rlimits, as `image.rs` explains).
//! `cargo xtask test` builds the image and passes `ROUTEWARDEN_IMAGE`; without it, and without
//! `kubectl` (kustomize), every test here prints SKIPPED.

mod lab_support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use lab_support::{example_dir, lab, metrics, routes, wait_for, NODE_A_IPIP, PORT};
use routewarden_lab::example::{calico, documents, serve_example};
use routewarden_lab::podman::{daemonset_podman_run, Container, DaemonSetRun};
use routewarden_lab::standin::tls::{Pki, TlsServer};
use routewarden_lab::standin::{ApiServer, Rbac, RequestKind, User};
use routewarden_lab::{deploy_dir, skip_unless_root, Lab};
use serde_json::Value;

/// The API server's Service address a kubelet puts in `KUBERNETES_SERVICE_HOST` (the first
/// address of kubeadm's default service CIDR 10.96.0.0/12), and its port.
const SERVICE_HOST: &str = "10.96.0.1";
const SERVICE_PORT: u16 = 443;

/// Where the kubelet mounts the service account's files.
const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// kube-client re-reads the token file when a request is made within 10 s of the token's
/// 60 s lifetime since the last read (kube-rs/kube `kube-client/src/client/auth/mod.rs`,
/// kube-client 5.0.0 as locked here, `TokenFile::token`: `expires_at = now + SIXTY_SEC`, `is_expiring` = `now + TEN_SEC >
/// expires_at`; "token-file refreshed at least once per minute"). The agent's API probe
/// (`GET /version` every 30 s) makes a request at least that often, so the new token is sent
/// at most 60 s + 30 s after a rotation.
const TOKEN_RELOAD: Duration = Duration::from_mins(1);
const PROBE_INTERVAL: Duration = Duration::from_secs(30);

fn image(test: &str) -> Option<String> {
    if skip_unless_root(test) {
        return None;
    }
    let Ok(id) = std::env::var("ROUTEWARDEN_IMAGE").map(|s| s.trim().to_owned()) else {
        routewarden_lab::skip(test, format_args!("no image (ROUTEWARDEN_IMAGE unset); `cargo xtask test` builds it unless given --no-image"));
        return None;
    };
    if id.is_empty() {
        routewarden_lab::skip(test, format_args!("no image (ROUTEWARDEN_IMAGE empty)"));
        return None;
    }
    if Command::new("kubectl").args(["version", "--client"]).output().map_or(true, |o| !o.status.success()) {
        routewarden_lab::skip(test, format_args!("no kubectl (its kustomize renders deploy/)"));
        return None;
    }
    Some(id)
}

/// `kubectl kustomize <dir>`: the manifests a user would apply.
fn render(dir: &Path) -> String {
    let out = Command::new("kubectl").arg("kustomize").arg(dir).output().unwrap();
    assert!(out.status.success(), "kubectl kustomize {}: {}", dir.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// An overlay of `deploy/` in `dir` (a temp dir), as a user writes one: `deploy/` as its
/// resource (by a relative path: kustomize refuses absolute ones) and a strategic-merge patch
/// of the agent's container env.
fn program_overlay(dir: &Path) -> PathBuf {
    let up = "../".repeat(dir.components().count() - 1);
    let deploy = deploy_dir();
    let relative = format!("{up}{}", deploy.strip_prefix("/").unwrap().display());
    let text = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [{relative}]\npatches:\n  - patch: |-\n      apiVersion: apps/v1\n      kind: DaemonSet\n      metadata: {{name: routewarden, namespace: routewarden}}\n      spec:\n        template:\n          spec:\n            containers:\n              - name: routewarden\n                env:\n                  - {{name: ROUTEWARDEN_MODE, value: program}}\n"
    );
    std::fs::write(dir.join("kustomization.yaml"), text).unwrap();
    dir.to_path_buf()
}

/// The rendered DaemonSet of the agent.
fn daemonset(docs: &[Value]) -> Value {
    let ds: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "DaemonSet" && d["metadata"]["name"] == "routewarden").collect();
    assert_eq!(ds.len(), 1, "one routewarden DaemonSet in the rendered manifests");
    ds[0].clone()
}

/// A service-account volume as the kubelet writes it (its AtomicWriter): the files in a
/// timestamped directory, `..data` a symlink to it, and `token`, `ca.crt`, `namespace`
/// symlinks through `..data`; [`ServiceAccountDir::rotate`] swaps `..data` atomically.
struct ServiceAccountDir {
    dir: tempfile::TempDir,
    generation: u32,
}

impl ServiceAccountDir {
    fn new(token: &str, ca_pem: &str, namespace: &str) -> ServiceAccountDir {
        let mut sa = ServiceAccountDir { dir: tempfile::tempdir().unwrap(), generation: 0 };
        sa.write(token, ca_pem, namespace);
        for f in ["token", "ca.crt", "namespace"] {
            std::os::unix::fs::symlink(format!("..data/{f}"), sa.dir.path().join(f)).unwrap();
        }
        sa
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A new timestamped directory with the files, then `..data` renamed over to point at it,
    /// then the old directory removed (what the kubelet's AtomicWriter does).
    fn write(&mut self, token: &str, ca_pem: &str, namespace: &str) {
        let old = std::fs::read_link(self.dir.path().join("..data")).ok();
        self.generation += 1;
        let ts = format!("..2026_12_06_00_00_{:02}.{}", self.generation, std::process::id());
        let data = self.dir.path().join(&ts);
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("token"), token).unwrap();
        std::fs::write(data.join("ca.crt"), ca_pem).unwrap();
        std::fs::write(data.join("namespace"), namespace).unwrap();
        let tmp = self.dir.path().join("..data_tmp");
        std::os::unix::fs::symlink(&ts, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.path().join("..data")).unwrap();
        if let Some(old) = old {
            std::fs::remove_dir_all(self.dir.path().join(old)).unwrap();
        }
    }

    fn rotate(&mut self, token: &str, ca_pem: &str, namespace: &str) {
        self.write(token, ca_pem, namespace);
    }
}

/// SIGTERM, as the kubelet stops a pod; the agent exits 0.
fn stop(mut c: Container) {
    let status = c.stop();
    assert!(status.success(), "podman run exited {status}:\n{}", c.log());
}

fn s<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or_else(|| panic!("no string {key:?} in {v}"))
}

/// Run the rendered DaemonSet's container as a kubelet would on node-a: its image's
/// entrypoint with its args, its env (the downward-API node name filled in), its
/// securityContext and volume mounts, the service-account volume `sa` and the in-cluster env
/// vars, in the lab node namespace (`hostNetwork`). Output goes to `<log_dir>/<name>.log`.
fn run_daemonset(ds: &Value, lab: &Lab, image: &str, sa: &Path, name: &str, log_dir: &Path) -> Container {
    let pod = &ds["spec"]["template"]["spec"];
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    assert_eq!(pod["hostNetwork"], true, "the lab node namespace stands in for the host network");
    assert_eq!(pod["automountServiceAccountToken"], true, "the agent reads the API server with its service account");
    assert!(c.get("command").is_none(), "the DaemonSet uses the image's entrypoint");
    let sc = &c["securityContext"];
    assert_eq!(sc["privileged"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(s(&sc["seccompProfile"], "type"), "RuntimeDefault", "podman's default profile is the runtime default");
    // The kubelet's service-account volume (read-only) and the Service env vars it sets.
    let mut extra_args = vec![format!("--volume={}:{SA_DIR}:ro", sa.display())];
    for (k, v) in [
        ("KUBERNETES_SERVICE_HOST", SERVICE_HOST.to_owned()),
        ("KUBERNETES_SERVICE_PORT", SERVICE_PORT.to_string()),
        ("KUBERNETES_SERVICE_PORT_HTTPS", SERVICE_PORT.to_string()),
        ("KUBERNETES_PORT", format!("tcp://{SERVICE_HOST}:{SERVICE_PORT}")),
    ] {
        extra_args.push(format!("--env={k}={v}"));
    }
    let netns = lab.node_ns("node-a");
    let mut cmd =
        daemonset_podman_run(&DaemonSetRun { daemonset: ds, name, netns: &netns, image, node: "node-a", env_overrides: &[], security_opts: &[], extra_args });
    let log = log_dir.join(format!("{name}.log"));
    let file = std::fs::File::create(&log).unwrap();
    cmd.stdout(file.try_clone().unwrap()).stderr(file);
    eprintln!("in-cluster: {cmd:?}");
    Container::spawn(name, &mut cmd, Some(log))
}

/// The rendered metrics port (the container's `metrics` port) must be the one read here.
fn assert_metrics_port(ds: &Value) {
    let c = &ds["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["ports"][0]["containerPort"], u64::from(PORT));
}

fn wait_ready(lab: &Lab, c: &mut Container) -> String {
    wait_for("/readyz 200 from the container", Duration::from_mins(1), || {
        assert!(c.running(), "the container exited before the agent was ready:\n{}", c.log());
        match lab.http_get("node-a", PORT, "/readyz") {
            Ok((200, body)) => Some(body),
            _ => None,
        }
    })
}

/// The stand-in in node-a's namespace on the Service address, over TLS, with the rendered
/// RBAC and `token` as the agent's service account.
fn standin(lab: &Lab, docs: &[Value], rendered: &str, pki: &Pki, token: &str) -> (ApiServer, TlsServer) {
    let ds = daemonset(docs);
    let namespace = s(&ds["metadata"], "namespace").to_owned();
    let account = s(&ds["spec"]["template"]["spec"], "serviceAccountName").to_owned();
    let api = ApiServer::new().with_rbac(Rbac::from_manifests(rendered).unwrap());
    api.set_tokens([(token.to_owned(), User::service_account(&namespace, &account))]);
    serve_example(&api, &example_dir());
    lab.ip("node-a", &["addr", "add", &format!("{SERVICE_HOST}/32"), "dev", "lo"]).unwrap();
    let listener = lab.in_netns("node-a", || std::net::TcpListener::bind((SERVICE_HOST, SERVICE_PORT))).unwrap().unwrap();
    // Bookmarks each minute, as the API server's watch cache sends them.
    let server = TlsServer::start(api.clone(), listener, pki, Some(Duration::from_mins(1))).unwrap();
    (api, server)
}

fn pki() -> Pki {
    Pki::generate(&["kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", SERVICE_HOST]).unwrap()
}

/// Every resource the agent watches on this cluster (the operator's group is not served, so
/// its Installation is not read): the six Calico collections, Nodes, and calico-node in
/// kube-system.
fn watched() -> BTreeSet<String> {
    let mut out: BTreeSet<String> = calico().map(|(p, _)| p.to_owned()).collect();
    out.insert("nodes".into());
    out.insert("daemonsets/kube-system".into());
    out
}

fn assert_no_refusal(api: &ApiServer) {
    let refused: Vec<String> =
        api.log().entries().iter().filter(|r| r.refused()).map(|r| format!("{} {} {}: {}", r.status, r.verb, r.path, r.token.is_some())).collect();
    assert!(refused.is_empty(), "requests refused: {refused:#?}");
}

#[test]
fn shipped_daemonset_audits_in_cluster_with_rbac_and_token_rotation() {
    let test = "shipped_daemonset_audits_in_cluster_with_rbac_and_token_rotation";
    let Some(image) = image(test) else { return };
    let started = Instant::now();
    let rendered = render(&deploy_dir());
    let docs = documents(&rendered);
    let ds = daemonset(&docs);
    assert_metrics_port(&ds);
    let env = ds["spec"]["template"]["spec"]["containers"][0]["env"].as_array().unwrap().clone();
    let mode = env.iter().find(|e| e["name"] == "ROUTEWARDEN_MODE").unwrap();
    assert_eq!(mode["value"], "audit", "the shipped mode");
    let lab = lab();
    let pki = pki();
    let (old_token, new_token) = ("token-before-rotation", "token-after-rotation");
    let (api, _server) = standin(&lab, &docs, &rendered, &pki, old_token);
    let logs = tempfile::tempdir().unwrap();
    let mut sa = ServiceAccountDir::new(old_token, &pki.ca_pem, "routewarden");
    let mut c = run_daemonset(&ds, &lab, &image, sa.path(), &format!("routewarden-in-cluster-{}", std::process::id()), logs.path());

    let ready = wait_ready(&lab, &mut c);
    assert!(ready.starts_with("datastore: synced\n"), "{ready}");
    // In-cluster config: every request carried the mounted token over TLS verified by the
    // mounted CA (a wrong CA fails: the test below), as the service account.
    let log = api.log().entries();
    assert!(!log.is_empty());
    for r in &log {
        assert_eq!(r.token.as_deref(), Some(old_token), "{r:?}");
        assert_eq!(r.user.as_deref(), Some("system:serviceaccount:routewarden:routewarden"), "{r:?}");
    }
    assert_no_refusal(&api);
    assert!(api.log().tls_failures().is_empty(), "{:?}", api.log().tls_failures());
    // Every resource read with a streaming list (one watch with sendInitialEvents from the
    // watch cache, which then carries the changes), no list request.
    let streamed: BTreeSet<String> =
        log.iter().filter(|r| r.watch && r.send_initial_events && r.status == 200).map(routewarden_lab::standin::LoggedRequest::target).collect();
    assert_eq!(streamed, watched());
    assert!(log.iter().all(|r| r.kind != RequestKind::List), "{log:#?}");
    // calico-node's DaemonSet is read by its name (the field selector that lets the Role's
    // resourceNames apply).
    assert!(log.iter().filter(|r| r.resource == "daemonsets").all(|r| r.name.as_deref() == Some("calico-node")));

    // Audit mode: nothing written; Felix (IPIP, node-a's 7 routes) and BIRD (no-encap, 2 v4
    // and 2 v6) have programmed nothing in the lab: 11 routes missing, nothing else.
    let m = wait_for("the first audit", Duration::from_secs(100), || {
        let m = metrics(&lab, "node-a");
        m.has(r#"routewarden_audit_findings{code="missing"}"#).then_some(m)
    });
    assert_eq!(
        m.family("routewarden_audit_findings"),
        [
            (r#"routewarden_audit_findings{code="duplicate"}"#, 0),
            (r#"routewarden_audit_findings{code="foreign-writer"}"#, 0),
            (r#"routewarden_audit_findings{code="missing"}"#, 11),
            (r#"routewarden_audit_findings{code="stale"}"#, 0),
            (r#"routewarden_audit_findings{code="unowned"}"#, 0),
            (r#"routewarden_audit_findings{code="wrong-next-hop"}"#, 0),
            (r#"routewarden_audit_findings{code="wrong-path"}"#, 0),
        ],
        "{m}"
    );
    assert_eq!(m.value("routewarden_datastore_synced"), 1, "{m}");
    assert!(routes(&lab, "node-a", "80").is_empty(), "audit mode programs nothing");

    // Token rotation, as the kubelet does it: a new token behind an atomic `..data` swap. From
    // the swap on, the stand-in accepts only the new token.
    let before_swap = api.log().entries().len();
    api.set_tokens([(new_token.to_owned(), User::service_account("routewarden", "routewarden"))]);
    let swapped = Instant::now();
    sa.rotate(new_token, &pki.ca_pem, "routewarden");
    let first_new = wait_for("a request with the rotated token", TOKEN_RELOAD + PROBE_INTERVAL + Duration::from_secs(10), || {
        api.log().entries().iter().position(|r| r.token.as_deref() == Some(new_token))
    });
    let reloaded = swapped.elapsed();
    // The API server ends watches at their timeout; the agent watches again, with the new
    // token, from where it was.
    api.close_watches();
    wait_for("every resource watched again with the rotated token", Duration::from_secs(30), || {
        let again: BTreeSet<String> = api.log().entries()[first_new..]
            .iter()
            .filter(|r| r.kind == RequestKind::Watch && r.status == 200 && r.token.as_deref() == Some(new_token))
            .map(routewarden_lab::standin::LoggedRequest::target)
            .collect();
        (again == watched()).then_some(())
    });
    let after = api.log().entries();
    // Nothing sent the new token before the swap, nothing the old one after the new one was
    // first sent; in between, only the API probe (GET /version) carried the old one, refused
    // with 401 as a rotated-out token is.
    assert!(after[..before_swap].iter().all(|r| r.token.as_deref() == Some(old_token)));
    assert!(after[first_new..].iter().all(|r| r.token.as_deref() == Some(new_token)), "{:#?}", &after[first_new..]);
    let stale: Vec<_> = after[before_swap..first_new].iter().filter(|r| r.token.as_deref() == Some(old_token)).collect();
    assert!(stale.iter().all(|r| r.path == "/version" && r.status == 401), "{stale:#?}");
    assert!(after[first_new..].iter().all(|r| r.status == 200), "{:#?}", &after[first_new..]);
    // Not a restart: the same container and agent, still ready and synced, no re-list.
    assert!(c.running());
    assert_eq!(after[first_new..].iter().filter(|r| r.kind == RequestKind::List).count(), 0, "a rotation is not a re-list");
    let m = metrics(&lab, "node-a");
    assert_eq!(m.value(r#"routewarden_audit_findings{code="missing"}"#), 11, "{m}");
    assert_eq!(m.value("routewarden_datastore_synced"), 1, "{m}");
    eprintln!("in-cluster: token rotated; first request with the new token {} ms after the swap (kube-client re-reads within {} s + the 30 s probe); {} requests with the old token in between, each GET /version answered 401", reloaded.as_millis(), TOKEN_RELOAD.as_secs(), stale.len());
    stop(c);
    assert_eq!(after.iter().filter(|r| r.status == 401).count(), stale.len());
    eprintln!("IN-CLUSTER-REQUESTS audit: {}", api.log().summary());

    // The wrong CA in ca.crt: TLS fails, the agent says so in its log, nothing is served.
    let served = api.log().entries().len();
    let wrong = ServiceAccountDir::new(new_token, &pki.wrong_ca_pem, "routewarden");
    let mut c = run_daemonset(&ds, &lab, &image, wrong.path(), &format!("routewarden-in-cluster-ca-{}", std::process::id()), logs.path());
    // The event loop's own line (it runs by then, so SIGTERM below is handled: a signal that
    // reaches PID 1 before the agent installs its handler is ignored).
    let line = wait_for("the agent's TLS error", Duration::from_secs(30), || {
        assert!(c.running(), "{}", c.log());
        c.log().lines().find(|l| l.contains("datastore not synced; keeping every route")).map(str::to_owned)
    });
    let entry: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    let error = entry["reason"].as_str().unwrap_or_else(|| panic!("{entry}"));
    assert_eq!(error, "API discovery GET /apis: ServiceError: client error (Connect): invalid peer certificate: UnknownIssuer");
    assert_eq!(api.log().entries().len(), served, "no request got through TLS");
    assert!(!api.log().tls_failures().is_empty());
    assert!(matches!(lab.http_get("node-a", PORT, "/readyz"), Ok((503, _))));
    stop(c);
    eprintln!("in-cluster: with a wrong ca.crt the agent logs {error:?}; TLS failures seen by the stand-in: {:?}", api.log().tls_failures());
    eprintln!("in-cluster: audit run, rotation and wrong CA took {} ms", started.elapsed().as_millis());
}

#[test]
fn program_overlay_programs_node_a_in_cluster() {
    let test = "program_overlay_programs_node_a_in_cluster";
    let Some(image) = image(test) else { return };
    let started = Instant::now();
    let overlay = tempfile::tempdir().unwrap();
    let rendered = render(&program_overlay(overlay.path()));
    let docs = documents(&rendered);
    let ds = daemonset(&docs);
    let env = ds["spec"]["template"]["spec"]["containers"][0]["env"].as_array().unwrap().clone();
    assert_eq!(env.iter().find(|e| e["name"] == "ROUTEWARDEN_MODE").unwrap()["value"], "program");
    let lab = lab();
    let pki = pki();
    let token = "program-token";
    let (api, _server) = standin(&lab, &docs, &rendered, &pki, token);
    let logs = tempfile::tempdir().unwrap();
    let sa = ServiceAccountDir::new(token, &pki.ca_pem, "routewarden");
    let mut c = run_daemonset(&ds, &lab, &image, sa.path(), &format!("routewarden-in-cluster-program-{}", std::process::id()), logs.path());
    let ready = wait_ready(&lab, &mut c);
    assert!(ready.starts_with("datastore: synced\nroutes: first apply done\n"), "{ready}");
    assert_eq!(routes(&lab, "node-a", "80"), NODE_A_IPIP);
    let m = metrics(&lab, "node-a");
    assert_eq!(m.value(r#"routewarden_routes{family="ipv4",class="ipip",state="programmed"}"#), 7, "{m}");
    assert_no_refusal(&api);
    let log = api.log().entries();
    assert!(log.iter().all(|r| r.token.as_deref() == Some(token)));
    // Every request served, but the discovery of the operator's group, which this cluster
    // does not serve (the agent then reads no Installation).
    let not_ok: Vec<(u16, &str)> = log.iter().filter(|r| r.status != 200).map(|r| (r.status, r.path.as_str())).collect();
    assert_eq!(not_ok, [(404, "/apis/operator.tigera.io/v1")]);
    stop(c);
    assert_eq!(routes(&lab, "node-a", "80"), NODE_A_IPIP, "routes after SIGTERM");
    eprintln!("IN-CLUSTER-REQUESTS program: {}", api.log().summary());
    eprintln!("in-cluster: program overlay took {} ms", started.elapsed().as_millis());
}
