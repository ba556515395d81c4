//! Checks of `deploy/` (manifests, alert rules, dashboard) and `docs/runbooks.md`.
//!
//! Pure-Rust checks always run. Checks that need an external tool print
//! `SKIPPED <name>: <tool> not installed` and return when the tool is missing (CI installs
//! them: Debian `prometheus` for promtool, PyPI `kubernetes-validate`, and `kubectl` or
//! `kustomize` for the kustomization build).
//!
//! Drift caught here: a metric used by a rule or the dashboard that the agent does not
//! register (and that no open issue plans), a planned metric that has since been registered
//! (remove it from the allow-list), an env var the agent does not read, an alert without a
//! runbook section or without a firing and a quiet promtool case, a manifest left out of the
//! kustomization, RBAC wider than the list/watch the Kubernetes datastore uses and the Node
//! Events' create/patch, a leftover
//! file-datastore ConfigMap.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_yaml_ng::Value;

/// Metrics used by the rules or the dashboard that the agent does not register yet, with the
/// issue that defines them. Once one is registered in `agent/src/observe/metrics/mod.rs` the
/// test prints a STALE line for it: remove it from here, so a later rename is caught.
const PLANNED_METRICS: &[(&str, &str)] = &[];

/// The shipped alerts; each needs a runbook section and
/// promtool cases.
const ALERTS: &[&str] = &[
    "RouteFlapping",
    "RouteOwnershipConflict",
    "RouteProgrammingErrors",
    "RouteDrift",
    "RoutesHeldByOtherWriter",
    "WrongPathForwarding",
    "ForwardingFlap",
    "RouteWatchDegraded",
    "RoutewardenDatastoreNotSynced",
    "RoutewardenDown",
    "RouteMassDeletionHeld",
    "RoutewardenInvalidInput",
    "RouteTableNotSelected",
    "RouteWriterFailing",
];

/// Kinds served by the Prometheus Operator's CRDs: the Kubernetes schemas do not cover them,
/// so they are checked structurally here instead.
const CRD_KINDS: &[&str] = &["PodMonitor", "PrometheusRule"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

fn deploy() -> PathBuf {
    root().join("deploy")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// All YAML documents of a file (empty documents dropped).
fn yaml_docs(text: &str, what: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| {
            use serde::Deserialize as _;
            Value::deserialize(d).unwrap_or_else(|e| panic!("{what}: invalid YAML: {e}"))
        })
        .filter(|v| !v.is_null())
        .collect()
}

fn yaml_file(path: &Path) -> Value {
    let mut docs = yaml_docs(&read(path), &path.display().to_string());
    assert_eq!(docs.len(), 1, "{}: expected one YAML document", path.display());
    docs.remove(0)
}

fn s<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_else(|| panic!("missing string field {key:?} in {v:?}"))
}

fn seq<'a>(v: &'a Value, key: &str) -> &'a Vec<Value> {
    v.get(key).and_then(Value::as_sequence).unwrap_or_else(|| panic!("missing list field {key:?} in {v:?}"))
}

fn strings(v: &Value) -> BTreeSet<String> {
    v.as_sequence().unwrap_or_else(|| panic!("expected a list of strings, got {v:?}")).iter().map(|x| x.as_str().expect("string").to_string()).collect()
}

/// `resources` of deploy/kustomization.yaml, each loaded.
fn resources() -> Vec<(String, Value)> {
    let k = yaml_file(&deploy().join("kustomization.yaml"));
    seq(&k, "resources")
        .iter()
        .map(|r| {
            let name = r.as_str().expect("resource is a path").to_string();
            let v = yaml_file(&deploy().join(&name));
            (name, v)
        })
        .collect()
}

/// The one `kind` named `name` in the kustomization (two ClusterRoles: the agent's and the status
/// reader's; two Roles: the calico-node env reader and the Node Events writer).
fn resource_named(kind: &str, name: &str) -> Value {
    let mut found: Vec<Value> = resources().into_iter().map(|(_, v)| v).filter(|v| s(v, "kind") == kind && s(&v["metadata"], "name") == name).collect();
    assert_eq!(found.len(), 1, "expected exactly one {kind} {name} in the kustomization");
    found.remove(0)
}

fn resource(kind: &str) -> Value {
    let mut found: Vec<Value> = resources().into_iter().map(|(_, v)| v).filter(|v| s(v, "kind") == kind).collect();
    assert_eq!(found.len(), 1, "expected exactly one {kind} in the kustomization");
    found.remove(0)
}

/// Find `tool` on PATH.
fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(tool)).find(|p| p.is_file())
}

/// A fresh scratch directory for one test (removed first if a previous run left it).
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("routewarden-deploy-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{cmd:?} failed ({}):\n{stdout}\n{stderr}", out.status);
    eprintln!("{stdout}{stderr}");
    stdout
}

/// The rule groups of the PrometheusRule as a plain Prometheus rules file (what promtool
/// and a non-operator Prometheus load).
fn write_plain_rules(dir: &Path) -> PathBuf {
    let rule = resource("PrometheusRule");
    let spec = rule.get("spec").expect("PrometheusRule has a spec");
    let path = dir.join("rules.yaml");
    std::fs::write(&path, serde_yaml_ng::to_string(spec).expect("serialize rules")).expect("write rules.yaml");
    path
}

fn rules() -> Vec<Value> {
    let rule = resource("PrometheusRule");
    seq(rule.get("spec").expect("spec"), "groups").iter().flat_map(|g| seq(g, "rules").clone()).collect()
}

fn promtool_test_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(deploy().join("tests"))
        .expect("deploy/tests exists")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no promtool test files in deploy/tests");
    files
}

#[test]
fn kustomization_lists_every_manifest_and_each_parses() {
    let k = yaml_file(&deploy().join("kustomization.yaml"));
    assert_eq!(s(&k, "kind"), "Kustomization");
    // Objects without a namespace go to routewarden; the calico-node env Role keeps kube-system
    // (a NamespaceTransformer with unsetOnly, not `namespace:`, which would move it).
    assert!(k.get("namespace").is_none(), "a kustomization `namespace:` would move the kube-system Role");
    let transformer = yaml_docs(seq(&k, "transformers")[0].as_str().expect("inline transformer"), "transformer").remove(0);
    assert_eq!((s(&transformer, "kind"), s(&transformer["metadata"], "namespace")), ("NamespaceTransformer", "routewarden"));
    assert_eq!(transformer["unsetOnly"].as_bool(), Some(true));
    let listed: BTreeSet<String> = strings(k.get("resources").expect("resources"));
    for (name, v) in resources() {
        for key in ["apiVersion", "kind"] {
            assert!(v.get(key).and_then(Value::as_str).is_some(), "{name}: no {key}");
        }
        assert!(v.get("metadata").and_then(|m| m.get("name")).and_then(Value::as_str).is_some(), "{name}: no metadata.name");
    }
    // Every top-level manifest is listed, so nothing in deploy/ is silently not applied.
    for entry in std::fs::read_dir(deploy()).expect("deploy/") {
        let p = entry.expect("entry").path();
        let file = p.file_name().expect("name").to_string_lossy().into_owned();
        if p.is_file() && p.extension().is_some_and(|e| e == "yaml") && file != "kustomization.yaml" {
            assert!(listed.contains(&file), "deploy/{file} is not in kustomization.yaml resources");
        }
    }
    // Generator inputs exist.
    for g in seq(&k, "configMapGenerator") {
        for f in seq(g, "files") {
            let f = f.as_str().expect("file entry");
            let path = f.split_once('=').map_or(f, |(_, p)| p);
            assert!(deploy().join(path).is_file(), "configMapGenerator file {path} missing");
        }
    }
    // The legacy-kernel component parses and patches the DaemonSet's capabilities.
    let c = yaml_file(&deploy().join("legacy-kernel/kustomization.yaml"));
    assert_eq!(s(&c, "kind"), "Component");
    // The large-cluster component: a FlowSchema for exactly the agent's ServiceAccount, every
    // verb and API group the datastore uses, pointing at the priority level it ships.
    let lc = yaml_file(&deploy().join("large-cluster/kustomization.yaml"));
    assert_eq!(s(&lc, "kind"), "Component");
    let fs = yaml_file(&deploy().join("large-cluster/flowschema.yaml"));
    let pl = yaml_file(&deploy().join("large-cluster/prioritylevel.yaml"));
    assert_eq!((s(&fs, "kind"), s(&pl, "kind")), ("FlowSchema", "PriorityLevelConfiguration"));
    assert_eq!(s(&fs["spec"]["priorityLevelConfiguration"], "name"), s(&pl["metadata"], "name"));
    let rule = &seq(&fs["spec"], "rules")[0];
    let sa = &seq(rule, "subjects")[0]["serviceAccount"];
    let account = resource("ServiceAccount");
    assert_eq!((s(sa, "name"), s(sa, "namespace")), (s(&account["metadata"], "name"), s(&account["metadata"], "namespace")));
    let groups = strings(&seq(rule, "resourceRules")[0]["apiGroups"]);
    let cluster_role = resource_named("ClusterRole", "routewarden");
    for r in seq(&cluster_role, "rules") {
        for g in strings(&r["apiGroups"]) {
            assert!(groups.contains(&g), "FlowSchema misses API group {g:?} of the ClusterRole");
        }
    }
    assert!(groups.contains("apps"), "the calico-node env read");
    // The etcd component patches the DaemonSet (the overlay generates the endpoints' ConfigMap).
    let etcd = yaml_file(&deploy().join("etcd/kustomization.yaml"));
    assert_eq!(s(&etcd, "kind"), "Component");
    assert_eq!(s(&yaml_file(&deploy().join("etcd/daemonset-etcd.yaml")), "kind"), "DaemonSet");
    // The operator component lists its Role and RoleBinding, in calico-system.
    let op = yaml_file(&deploy().join("operator/kustomization.yaml"));
    assert_eq!(s(&op, "kind"), "Component");
    for f in seq(&op, "resources") {
        let v = yaml_file(&deploy().join("operator").join(f.as_str().expect("path")));
        assert_eq!(s(&v["metadata"], "namespace"), "calico-system", "deploy/operator/{f:?}");
    }
    assert!(serde_yaml_ng::to_string(&c).expect("yaml").contains("SYS_ADMIN"));
}

#[test]
fn kustomization_builds() {
    // Debian has no kustomize package; kubectl embeds it (`kubectl kustomize`).
    let (tool, mut base) = if let Some(k) = which("kustomize") {
        ("kustomize", {
            let mut c = Command::new(k);
            c.arg("build");
            c
        })
    } else if let Some(k) = which("kubectl") {
        ("kubectl", {
            let mut c = Command::new(k);
            c.arg("kustomize");
            c
        })
    } else {
        routewarden_lab::skip("kustomization_builds", format_args!("kustomize (or kubectl) not installed"));
        return;
    };
    let out = run(base.arg(deploy()));
    let docs = yaml_docs(&out, "kustomize output");
    let kinds: BTreeSet<String> = docs.iter().map(|d| format!("{}/{}", s(d, "kind"), s(d.get("metadata").expect("metadata"), "name"))).collect();
    for want in [
        "Namespace/routewarden",
        "ServiceAccount/routewarden",
        "ClusterRole/routewarden",
        "ClusterRoleBinding/routewarden",
        "ConfigMap/routewarden-grafana-dashboard",
        "DaemonSet/routewarden",
        "PodMonitor/routewarden",
        "PrometheusRule/routewarden",
    ] {
        assert!(kinds.contains(want), "{tool} build lacks {want}: {kinds:?}");
    }
    // The Kubernetes datastore reads the API server: the only ConfigMap is the dashboard (no
    // file-datastore `routewarden-cluster` snapshot left behind).
    assert!(!kinds.contains("ConfigMap/routewarden-cluster"), "{tool} build still has the file-datastore ConfigMap: {kinds:?}");
    let configmaps: Vec<&String> = kinds.iter().filter(|k| k.starts_with("ConfigMap/")).collect();
    assert_eq!(configmaps, ["ConfigMap/routewarden-grafana-dashboard"], "{tool} build: unexpected ConfigMaps");
    for d in &docs {
        let kind = s(d, "kind");
        if ["Role", "RoleBinding"].contains(&kind) {
            // The calico-node env read lives next to what it reads (manifest installs); the
            // Node Events where Events about cluster-scoped objects live.
            let want = if s(d.get("metadata").expect("metadata"), "name") == "routewarden-node-events" { "default" } else { "kube-system" };
            assert_eq!(s(d.get("metadata").expect("metadata"), "namespace"), want, "{kind} not in {want}");
        } else if !["Namespace", "ClusterRole", "ClusterRoleBinding"].contains(&kind) {
            assert_eq!(s(d.get("metadata").expect("metadata"), "namespace"), "routewarden", "{kind} not in namespace routewarden");
        }
        if kind == "ConfigMap" && s(d.get("metadata").expect("metadata"), "name") == "routewarden-grafana-dashboard" {
            let json = d.get("data").and_then(|x| x.get("routewarden.json")).and_then(Value::as_str).expect("dashboard data");
            let _: serde_json::Value = serde_json::from_str(json).expect("dashboard JSON in the ConfigMap parses");
        }
    }
    // The DaemonSet runs routewarden:<crate version> (kustomization.yaml `images:`).
    let ds = docs.iter().find(|d| s(d, "kind") == "DaemonSet").expect("DaemonSet");
    assert_eq!(
        s(&ds["spec"]["template"]["spec"]["containers"][0], "image"),
        format!("routewarden:{}", env!("CARGO_PKG_VERSION")),
        "{tool} build: DaemonSet image"
    );
    std::fs::write(scratch("build").join("built.yaml"), &out).expect("keep build output");

    // An overlay enabling the legacy-kernel component builds and grants SYS_ADMIN.
    let out = build_overlay(tool, "legacy", "components: [{rel}/legacy-kernel]\n");
    let ds = yaml_docs(&out, "legacy overlay").into_iter().find(|d| s(d, "kind") == "DaemonSet").expect("DaemonSet");
    let caps = strings(&ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]["add"]);
    assert_eq!(caps, ["NET_ADMIN", "SYS_ADMIN", "SYS_RESOURCE"].map(String::from).into(), "legacy-kernel capabilities");

    // An overlay enabling the large-cluster component raises the agent's memory (kube-100k's
    // peak is above the base 256Mi) and keeps the CPU settings and everything else.
    let base_ds = docs.iter().find(|d| s(d, "kind") == "DaemonSet").expect("DaemonSet");
    let out = build_overlay(tool, "large", "components: [{rel}/large-cluster]\n");
    let docs_large = yaml_docs(&out, "large-cluster overlay");
    let ds = docs_large.iter().find(|d| s(d, "kind") == "DaemonSet").expect("DaemonSet");
    let resources = &ds["spec"]["template"]["spec"]["containers"][0]["resources"];
    assert_eq!((s(&resources["requests"], "memory"), s(&resources["limits"], "memory")), ("256Mi", "512Mi"), "large-cluster memory");
    let base_resources = &base_ds["spec"]["template"]["spec"]["containers"][0]["resources"];
    assert_eq!((&resources["requests"]["cpu"], &resources["limits"]["cpu"]), (&base_resources["requests"]["cpu"], &base_resources["limits"]["cpu"]));
    assert!(docs_large.iter().any(|d| s(d, "kind") == "FlowSchema"), "large-cluster overlay has its FlowSchema");

    // An overlay enabling the operator component reads calico-node env in both namespaces;
    // everything else stays where it was.
    let out = build_overlay(tool, "operator", "components: [{rel}/operator]\n");
    let roles: BTreeSet<String> = yaml_docs(&out, "operator overlay")
        .iter()
        .filter(|d| ["Role", "RoleBinding"].contains(&s(d, "kind")) && s(&d["metadata"], "name") == "routewarden-calico-node-env")
        .map(|d| format!("{} {}/{}", s(d, "kind"), s(&d["metadata"], "namespace"), s(&d["metadata"], "name")))
        .collect();
    let want: BTreeSet<String> = ["Role calico-system", "RoleBinding calico-system", "Role kube-system", "RoleBinding kube-system"]
        .iter()
        .map(|k| format!("{k}/routewarden-calico-node-env"))
        .collect();
    assert_eq!(roles, want, "operator overlay");

    // An overlay that points the image at a registry (README "Deploy to a cluster") keeps
    // the tag: routewarden's crate version.
    let out = build_overlay(tool, "registry", "images:\n  - name: routewarden\n    newName: registry.example.com/ops/routewarden\n");
    let ds = yaml_docs(&out, "registry overlay").into_iter().find(|d| s(d, "kind") == "DaemonSet").expect("DaemonSet");
    assert_eq!(s(&ds["spec"]["template"]["spec"]["containers"][0], "image"), format!("registry.example.com/ops/routewarden:{}", env!("CARGO_PKG_VERSION")));
}

/// The kustomize of this machine: `kustomize`, else `kubectl` (its embedded kustomize).
fn kustomize_tool() -> Option<&'static str> {
    ["kustomize", "kubectl"].into_iter().find(|t| which(t).is_some())
}

#[test]
fn etcd_component_builds() {
    let Some(tool) = kustomize_tool() else {
        routewarden_lab::skip("etcd_component_builds", format_args!("kustomize (or kubectl) not installed"));
        return;
    };
    // An overlay enabling the etcd component (generating its endpoints' ConfigMap, as deploy/etcd's
    // header shows): `--datastore etcd`, the endpoints from the generated ConfigMap, the
    // client certificate files from the Secret mounted read-only with mode 0400.
    let out = build_overlay(
        tool,
        "etcd",
        "components: [{rel}/etcd]\nconfigMapGenerator:\n  - name: routewarden-etcd\n    namespace: routewarden\n    literals: [\"endpoints=https://10.0.0.1:2379,https://10.0.0.2:2379\"]\n",
    );
    let docs = yaml_docs(&out, "etcd overlay");
    let cm = docs.iter().find(|d| s(d, "kind") == "ConfigMap" && s(&d["metadata"], "name").starts_with("routewarden-etcd-")).expect("etcd ConfigMap");
    assert_eq!(s(&cm["data"], "endpoints"), "https://10.0.0.1:2379,https://10.0.0.2:2379");
    let ds = docs.iter().find(|d| s(d, "kind") == "DaemonSet").expect("DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let env: Vec<String> = seq(container, "env")
        .iter()
        .filter(|e| s(e, "name").starts_with("ROUTEWARDEN_DATASTORE") || s(e, "name").starts_with("ROUTEWARDEN_ETCD"))
        .map(|e| match e.get("value") {
            Some(v) => format!("{}={}", s(e, "name"), v.as_str().expect("value")),
            None => format!("{}<-{}/{}", s(e, "name"), s(&e["valueFrom"]["configMapKeyRef"], "name"), s(&e["valueFrom"]["configMapKeyRef"], "key")),
        })
        .collect();
    assert_eq!(
        env,
        [
            "ROUTEWARDEN_DATASTORE=etcd".to_owned(),
            format!("ROUTEWARDEN_ETCD_ENDPOINTS<-{}/endpoints", s(&cm["metadata"], "name")),
            "ROUTEWARDEN_ETCD_CA_FILE=/etc/routewarden/etcd/ca.crt".to_owned(),
            "ROUTEWARDEN_ETCD_CERT_FILE=/etc/routewarden/etcd/tls.crt".to_owned(),
            "ROUTEWARDEN_ETCD_KEY_FILE=/etc/routewarden/etcd/tls.key".to_owned(),
        ],
        "etcd overlay env"
    );
    let mount = seq(container, "volumeMounts").iter().find(|m| s(m, "name") == "etcd-certs").expect("etcd-certs mount");
    assert_eq!((s(mount, "mountPath"), mount["readOnly"].as_bool()), ("/etc/routewarden/etcd", Some(true)));
    let volume = seq(pod, "volumes").iter().find(|v| s(v, "name") == "etcd-certs").expect("etcd-certs volume");
    assert_eq!((s(&volume["secret"], "secretName"), volume["secret"]["defaultMode"].as_u64()), ("routewarden-etcd-certs", Some(0o400)));
}

/// Build an overlay of deploy/ (`kustomize build`, or `kubectl kustomize` when `tool` is
/// `kubectl`) whose kustomization is `resources: [deploy/]` plus `extra` (`{rel}` in it stands
/// for the path to deploy/), in a scratch dir named `name`; returns the output. kustomize
/// refuses absolute paths: deploy/ is reached relatively from the scratch dir.
fn build_overlay(tool: &str, name: &str, extra: &str) -> String {
    let dir = scratch(name);
    let up = "../".repeat(dir.components().count() - 1);
    let rel = format!("{up}{}", deploy().display().to_string().trim_start_matches('/'));
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [{rel}]\n{}", extra.replace("{rel}", &rel)),
    )
    .expect("write overlay");
    let mut c = Command::new(which(tool).expect("kustomize or kubectl"));
    c.arg(if tool == "kustomize" { "build" } else { "kustomize" });
    let out = run(c.arg(&dir).arg("--load-restrictor=LoadRestrictionsNone"));
    let _ = std::fs::remove_dir_all(&dir);
    out
}

/// The DaemonSet's image tag and the crate version come from one place, kustomization.yaml's
/// `images:`: the DaemonSet names the bare image, the kustomization tags it with the version
/// `cargo xtask image` tags the image with (the workspace version, which the agent uses).
#[test]
fn image_tag_is_the_crate_version() {
    let k = yaml_file(&deploy().join("kustomization.yaml"));
    let images = seq(&k, "images");
    assert_eq!(images.len(), 1, "one image in kustomization.yaml: {images:?}");
    assert_eq!(s(&images[0], "name"), "routewarden");
    assert_eq!(
        s(&images[0], "newTag"),
        env!("CARGO_PKG_VERSION"),
        "deploy/kustomization.yaml `images:` newTag must be the crate version (Cargo.toml workspace.package.version): bump them together"
    );
    // The registry is the user's (an overlay's newName): a base newName would change the name
    // such an overlay has to match.
    assert!(images[0].get("newName").is_none(), "no newName in the base kustomization");
    let ds = resource("DaemonSet");
    let containers = seq(&ds["spec"]["template"]["spec"], "containers");
    assert_eq!(s(&containers[0], "image"), "routewarden", "the DaemonSet names the image without tag or registry: kustomization.yaml sets them");
    let agent = read(&root().join("agent/Cargo.toml"));
    assert!(agent.lines().any(|l| l.trim() == "version.workspace = true"), "agent/Cargo.toml must use the workspace version");
}

#[test]
fn manifests_validate_against_kubernetes_schemas() {
    let Some(kv) = which("kubernetes-validate") else {
        routewarden_lab::skip("manifests_validate_against_kubernetes_schemas", format_args!("kubernetes-validate not installed"));
        return;
    };
    let mut files = Vec::new();
    for (name, v) in resources() {
        if CRD_KINDS.contains(&s(&v, "kind")) {
            eprintln!(
                "note: {name} ({}) is a Prometheus Operator CRD: no Kubernetes schema, checked structurally by crd_objects_are_structurally_sound",
                s(&v, "kind")
            );
        } else {
            files.push(deploy().join(name));
        }
    }
    // Oldest and newest Kubernetes schemas the validator ships: the manifests must be valid on both.
    for version in ["1.25.0", "1.37.0"] {
        run(Command::new(&kv).args(["--strict", "--kubernetes-version", version]).args(&files));
    }
}

#[test]
fn crd_objects_are_structurally_sound() {
    let ds = resource("DaemonSet");
    let pod = &ds["spec"]["template"];
    let pod_labels = pod["metadata"]["labels"].as_mapping().expect("pod labels").clone();
    let container = &pod["spec"]["containers"][0];

    let pm = resource("PodMonitor");
    assert_eq!(s(&pm, "apiVersion"), "monitoring.coreos.com/v1");
    for (k, v) in pm["spec"]["selector"]["matchLabels"].as_mapping().expect("PodMonitor selector") {
        assert_eq!(pod_labels.get(k), Some(v), "PodMonitor selector {k:?} does not match the DaemonSet's pods");
    }
    let job_label = s(&pm["spec"], "jobLabel");
    assert_eq!(pod_labels.get(job_label).and_then(Value::as_str), Some("routewarden"), "jobLabel must give job=\"routewarden\" (the rules select on it)");
    let endpoints = seq(&pm["spec"], "podMetricsEndpoints");
    assert_eq!(endpoints.len(), 1);
    let port = s(&endpoints[0], "port");
    assert!(seq(container, "ports").iter().any(|p| s(p, "name") == port), "PodMonitor port {port} is not a container port");
    assert_eq!(s(&endpoints[0], "path"), "/metrics");
    assert!(
        seq(&endpoints[0], "relabelings").iter().any(|r| r.get("targetLabel").and_then(Value::as_str) == Some("node")),
        "PodMonitor must add the node label the alerts use"
    );

    let pr = resource("PrometheusRule");
    assert_eq!(s(&pr, "apiVersion"), "monitoring.coreos.com/v1");
    let runbook = read(&root().join("docs/runbooks.md"));
    let anchors: BTreeSet<String> = runbook.lines().filter(|l| l.starts_with('#')).map(|l| github_anchor(l.trim_start_matches('#'))).collect();
    let mut seen = BTreeSet::new();
    for r in rules() {
        let alert = s(&r, "alert");
        seen.insert(alert.to_string());
        assert!(!s(&r, "expr").trim().is_empty(), "{alert}: empty expr");
        let for_ = s(&r, "for");
        assert!(for_.ends_with('m') || for_.ends_with('s'), "{alert}: for {for_:?} is not a duration");
        let severity = s(&r["labels"], "severity");
        assert!(["critical", "warning"].contains(&severity), "{alert}: severity {severity}");
        let ann = &r["annotations"];
        assert!(!s(ann, "summary").is_empty() && !s(ann, "description").is_empty(), "{alert}: summary/description");
        let url = s(ann, "runbook_url");
        let (base, anchor) = url.split_once('#').unwrap_or_else(|| panic!("{alert}: runbook_url without anchor"));
        assert!(base.ends_with("/docs/runbooks.md"), "{alert}: runbook_url {url} does not point into docs/runbooks.md");
        assert_eq!(anchor, alert.to_lowercase(), "{alert}: runbook anchor");
        assert!(anchors.contains(anchor), "{alert}: docs/runbooks.md has no section #{anchor}");
    }
    let want: BTreeSet<String> = ALERTS.iter().map(|a| (*a).to_string()).collect();
    assert_eq!(seen, want, "alerts in the PrometheusRule");
}

/// GitHub's heading anchor: lower case, spaces to '-', punctuation other than '-' and '_' dropped.
fn github_anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn every_alert_has_a_firing_and_a_quiet_promtool_case() {
    let mut fires: BTreeMap<String, usize> = BTreeMap::new();
    let mut quiet: BTreeMap<String, usize> = BTreeMap::new();
    for f in promtool_test_files() {
        let t = yaml_file(&f);
        assert_eq!(strings(&t["rule_files"]), BTreeSet::from(["rules.yaml".to_string()]), "{}: rule_files", f.display());
        for group in seq(&t, "tests") {
            for case in seq(group, "alert_rule_test") {
                let name = s(case, "alertname").to_string();
                let n = case.get("exp_alerts").and_then(Value::as_sequence).map_or(0, Vec::len);
                *(if n > 0 { &mut fires } else { &mut quiet }).entry(name).or_default() += 1;
            }
        }
    }
    for a in ALERTS {
        assert!(fires.contains_key(*a), "no promtool case where {a} fires");
        assert!(quiet.contains_key(*a), "no promtool case where {a} stays quiet");
    }
}

#[test]
fn promtool_checks_the_rules() {
    let Some(promtool) = which("promtool") else {
        routewarden_lab::skip("promtool_checks_the_rules", format_args!("promtool not installed"));
        return;
    };
    let dir = scratch("check");
    let rules = write_plain_rules(&dir);
    let out = run(Command::new(promtool).arg("check").arg("rules").arg(&rules));
    assert!(out.contains("SUCCESS"), "promtool check rules: {out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn promtool_unit_tests_pass() {
    let Some(promtool) = which("promtool") else {
        routewarden_lab::skip("promtool_unit_tests_pass", format_args!("promtool not installed"));
        return;
    };
    // promtool resolves rule_files relative to each test file: put the extracted rules and
    // copies of the tests side by side.
    let dir = scratch("test");
    write_plain_rules(&dir);
    let mut copies = Vec::new();
    for f in promtool_test_files() {
        let to = dir.join(f.file_name().expect("file name"));
        std::fs::copy(&f, &to).expect("copy test file");
        copies.push(to);
    }
    let out = run(Command::new(promtool).args(["test", "rules"]).args(&copies));
    assert_eq!(out.matches("SUCCESS").count(), copies.len(), "promtool test rules: {out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn daemonset_is_least_privilege_and_configured_by_env() {
    let ds = resource("DaemonSet");
    let spec = &ds["spec"]["template"]["spec"];
    assert_eq!(spec["hostNetwork"].as_bool(), Some(true));
    assert_eq!(s(spec, "priorityClassName"), "system-node-critical");
    assert_eq!(s(spec, "serviceAccountName"), "routewarden");
    // The Kubernetes datastore authenticates with the service account token.
    assert_eq!(spec["automountServiceAccountToken"].as_bool(), Some(true), "the Kubernetes datastore needs the service account token");
    assert!(
        seq(spec, "tolerations").iter().any(|t| t.get("operator").and_then(Value::as_str) == Some("Exists") && t.get("key").is_none()),
        "must tolerate every taint"
    );
    assert_eq!(s(&ds["spec"]["updateStrategy"], "type"), "RollingUpdate");
    assert_eq!(ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"].as_u64(), Some(1));

    let containers = seq(spec, "containers");
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    let sc = &c["securityContext"];
    assert_ne!(sc.get("privileged").and_then(Value::as_bool), Some(true), "privileged: true is not allowed");
    assert_eq!(sc["allowPrivilegeEscalation"].as_bool(), Some(false));
    assert_eq!(sc["readOnlyRootFilesystem"].as_bool(), Some(true));
    assert_eq!(strings(&sc["capabilities"]["drop"]), BTreeSet::from(["ALL".to_string()]));
    assert_eq!(
        strings(&sc["capabilities"]["add"]),
        ["NET_ADMIN", "BPF", "PERFMON"].map(String::from).into(),
        "capabilities (SYS_ADMIN only via deploy/legacy-kernel)"
    );

    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        assert_eq!(s(&c[probe]["httpGet"], "path"), path);
        assert_eq!(s(&c[probe]["httpGet"], "port"), "metrics");
    }
    let port = seq(c, "ports").iter().find(|p| s(p, "name") == "metrics").expect("metrics port");
    assert_eq!(port["containerPort"].as_u64(), Some(9695));
    for k in ["requests", "limits"] {
        for r in ["cpu", "memory"] {
            assert!(c["resources"][k].get(r).is_some(), "resources.{k}.{r} missing");
        }
    }

    let mounts: BTreeMap<String, bool> =
        seq(c, "volumeMounts").iter().map(|m| (s(m, "mountPath").to_string(), m.get("readOnly").and_then(Value::as_bool).unwrap_or(false))).collect();
    for path in ["/sys/fs/bpf", "/sys/kernel/btf"] {
        assert_eq!(mounts.get(path), Some(&true), "{path} must be mounted read-only");
    }
    // Nothing else is mounted: no file-datastore ConfigMap at /etc/routewarden/cluster.
    assert_eq!(mounts.keys().map(String::as_str).collect::<Vec<_>>(), ["/sys/fs/bpf", "/sys/kernel/btf"], "volume mounts");
    for v in seq(spec, "volumes") {
        assert!(v.get("configMap").is_none(), "volume {} mounts a ConfigMap: the agent reads the API server", s(v, "name"));
    }

    // Every env var is a ROUTEWARDEN_* variable the agent actually reads (clap `env = ...`).
    let agent_src = collect_sources(&root().join("agent/src"));
    let mut env = BTreeMap::new();
    for e in seq(c, "env") {
        let name = s(e, "name");
        assert!(name.starts_with("ROUTEWARDEN_"), "{name}: only ROUTEWARDEN_* variables configure the agent");
        assert!(agent_src.contains(&format!("\"{name}\"")), "{name} is not read anywhere in agent/src");
        env.insert(name.to_string(), e.clone());
    }
    assert_eq!(s(&env["ROUTEWARDEN_NODE"]["valueFrom"]["fieldRef"], "fieldPath"), "spec.nodeName");
    assert_eq!(s(&env["ROUTEWARDEN_DATASTORE"], "value"), "kubernetes");
    // In-cluster service account, not a kubeconfig.
    assert!(!env.contains_key("ROUTEWARDEN_KUBECONFIG"), "ROUTEWARDEN_KUBECONFIG must not be set: the agent uses its service account");
    if let Some(g) = env.get("ROUTEWARDEN_CALICO_API_GROUP") {
        let g = s(g, "value");
        assert!(["auto", "crd.projectcalico.org/v1", "projectcalico.org/v3"].contains(&g), "ROUTEWARDEN_CALICO_API_GROUP {g:?}");
    }
    assert!(["program", "audit"].contains(&s(&env["ROUTEWARDEN_MODE"], "value")));
    assert!(s(&env["ROUTEWARDEN_METRICS_ADDR"], "value").ends_with(":9695"), "metrics address must match the container port");
    assert_eq!(s(&env["ROUTEWARDEN_LOG_FORMAT"], "value"), "json");
    for name in [
        "ROUTEWARDEN_ROLE",
        "ROUTEWARDEN_ROUTE_PROTOCOL",
        "ROUTEWARDEN_ROUTE_METRIC",
        "ROUTEWARDEN_ROUTE_TABLE",
        "ROUTEWARDEN_TUNNEL_DEVICE",
        "ROUTEWARDEN_HOST_DEVICE",
    ] {
        assert!(env.contains_key(name), "{name} not set in the DaemonSet");
    }
}

fn collect_sources(dir: &Path) -> String {
    let mut all = String::new();
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
        let p = entry.expect("entry").path();
        if p.is_dir() {
            all.push_str(&collect_sources(&p));
        } else if p.extension().is_some_and(|e| e == "rs") {
            all.push_str(&read(&p));
        }
    }
    all
}

#[test]
fn clusterrole_is_read_only_on_exactly_the_watched_resources() {
    let role = resource_named("ClusterRole", "routewarden");
    let calico: BTreeSet<String> =
        ["ippools", "ipamblocks", "blockaffinities", "felixconfigurations", "bgpconfigurations", "clusterinformations"].map(String::from).into();
    // Exactly the verbs the Kubernetes datastore requests (`VERBS` in
    // agent/src/datastore/kubernetes/sources.rs): list and watch, not even `get`.
    let read_only: BTreeSet<String> = ["list", "watch"].map(String::from).into();
    let mut got: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in seq(&role, "rules") {
        assert_eq!(strings(&r["verbs"]), read_only, "verbs must be list/watch only: {r:?}");
        assert!(r.get("resourceNames").is_none() && r.get("nonResourceURLs").is_none());
        for g in strings(&r["apiGroups"]) {
            got.entry(g).or_default().extend(strings(&r["resources"]));
        }
    }
    let want = BTreeMap::from([
        ("crd.projectcalico.org".to_string(), calico.clone()),
        ("projectcalico.org".to_string(), calico),
        (String::new(), BTreeSet::from(["nodes".to_string()])),
        ("operator.tigera.io".to_string(), BTreeSet::from(["installations".to_string()])),
    ]);
    assert_eq!(got, want, "ClusterRole resources per API group");
    // The namespaced read: one Role, list/watch on the calico-node DaemonSet only.
    let role = resource_named("Role", "routewarden-calico-node-env");
    let rules = seq(&role, "rules");
    assert_eq!(rules.len(), 1);
    assert_eq!(strings(&rules[0]["verbs"]), read_only);
    assert_eq!(
        (strings(&rules[0]["apiGroups"]), strings(&rules[0]["resources"]), strings(&rules[0]["resourceNames"])),
        (["apps".to_string()].into(), ["daemonsets".to_string()].into(), ["calico-node".to_string()].into())
    );

    // The one write: create and patch of events.k8s.io Events in `default` (the Node's).
    let role = resource_named("Role", "routewarden-node-events");
    assert_eq!(s(&role["metadata"], "namespace"), "default");
    let rules = seq(&role, "rules");
    assert_eq!(rules.len(), 1);
    assert_eq!(
        (strings(&rules[0]["apiGroups"]), strings(&rules[0]["resources"]), strings(&rules[0]["verbs"])),
        (["events.k8s.io".to_string()].into(), ["events".to_string()].into(), ["create".to_string(), "patch".to_string()].into())
    );
    assert!(rules[0].get("resourceNames").is_none());
    let binding = resource_named("RoleBinding", "routewarden-node-events");
    assert_eq!((s(&binding["metadata"], "namespace"), s(&binding["roleRef"], "name")), ("default", "routewarden-node-events"));
    let subject = &seq(&binding, "subjects")[0];
    assert_eq!((s(subject, "kind"), s(subject, "name"), s(subject, "namespace")), ("ServiceAccount", "routewarden", "routewarden"));

    let binding = resource("ClusterRoleBinding");
    assert_eq!(s(&binding["roleRef"], "name"), "routewarden");
    let subject = &seq(&binding, "subjects")[0];
    assert_eq!((s(subject, "kind"), s(subject, "name"), s(subject, "namespace")), ("ServiceAccount", "routewarden", "routewarden"));
}

/// The krew manifest template (`cargo xtask plugin` fills in `${URI}` and `${SHA256}` from the
/// archive it builds, xtask/src/plugin.rs): one platform, linux/amd64 (the one target the
/// release build makes), installing the one file the archive holds, `kubectl-routewarden`, the
/// name agent/src/main.rs answers to as a kubectl plugin; the version is the crate's.
#[test]
fn krew_manifest_installs_the_plugin_binary_the_archive_holds() {
    let m = yaml_file(&deploy().join("krew/routewarden.yaml"));
    assert_eq!((s(&m, "apiVersion"), s(&m, "kind"), s(&m["metadata"], "name")), ("krew.googlecontainertools.github.com/v1alpha2", "Plugin", "routewarden"));
    assert_eq!(s(&m["spec"], "version"), format!("v{}", env!("CARGO_PKG_VERSION")));
    assert!(!s(&m["spec"], "shortDescription").is_empty());
    let platforms = seq(&m["spec"], "platforms");
    assert_eq!(platforms.len(), 1, "linux/amd64 only: {platforms:?}");
    let p = &platforms[0];
    assert_eq!(serde_yaml_ng::to_string(&p["selector"]).expect("yaml"), "matchLabels:\n  os: linux\n  arch: amd64\n", "the platform's selector");
    assert_eq!((s(p, "uri"), s(p, "sha256"), s(p, "bin")), ("${URI}", "${SHA256}", "kubectl-routewarden"));
    let files = seq(p, "files");
    assert_eq!(files.len(), 1);
    assert_eq!((s(&files[0], "from"), s(&files[0], "to")), ("kubectl-routewarden", "."));
    let xtask = read(&root().join("xtask/src/plugin.rs"));
    assert!(xtask.contains("pub const ARCHIVE: &str = \"kubectl-routewarden-linux-amd64.tar.gz\";"), "xtask packs the archive the manifest names");
    assert!(xtask.contains("pub const BIN: &str = \"kubectl-routewarden\";"), "xtask packs the binary the manifest installs");
    let main = read(&root().join("agent/src/main.rs"));
    assert!(main.contains("const KUBECTL_PLUGIN: &str = \"kubectl-routewarden\";"), "the agent answers to the plugin's name");
}

/// `routewarden status` reads the agent pods and their status through the pod proxy, and lists
/// Nodes: exactly those reads (agent/src/cli/status.rs), and nothing in `deploy/` binds the role
/// (a user binds it, deploy/README.md).
#[test]
fn status_reader_role_allows_exactly_what_the_status_command_reads_and_is_not_bound() {
    let role = resource_named("ClusterRole", "routewarden-status-reader");
    let rules: Vec<(BTreeSet<String>, BTreeSet<String>, BTreeSet<String>)> =
        seq(&role, "rules").iter().map(|r| (strings(&r["apiGroups"]), strings(&r["resources"]), strings(&r["verbs"]))).collect();
    let set = |xs: &[&str]| xs.iter().map(|x| (*x).to_string()).collect::<BTreeSet<String>>();
    assert_eq!(
        rules,
        vec![
            (set(&[""]), set(&["pods"]), set(&["get", "list"])),
            (set(&[""]), set(&["pods/proxy"]), set(&["get"])),
            (set(&[""]), set(&["nodes"]), set(&["list"])),
        ]
    );
    for (file, v) in resources() {
        if s(&v, "kind").ends_with("Binding") {
            assert_ne!(s(&v["roleRef"], "name"), "routewarden-status-reader", "{file} binds the status reader: users bind it");
        }
    }
    let readme = read(&deploy().join("README.md"));
    assert!(readme.contains("--clusterrole routewarden-status-reader"), "deploy/README.md shows how to bind the status reader");
}

/// Sample names the agent exposes, from `agent/src/observe/metrics/mod.rs`: each
/// `r.register("name", ...)` with its handle's type (counter -> `_total`, info -> `_info`,
/// histogram -> `_bucket`/`_sum`/`_count`, gauge -> as is).
fn registered_metrics() -> BTreeSet<String> {
    let src = read(&root().join("agent/src/observe/metrics/mod.rs"));
    assert!(src.contains("Registry::with_prefix(\"routewarden\")"), "metrics/mod.rs no longer registers with the routewarden prefix");
    let field_type = |field: &str| -> String {
        let needle = format!("pub {field}: ");
        let line = src.lines().find(|l| l.trim_start().starts_with(&needle)).unwrap_or_else(|| panic!("metrics/mod.rs: no field {field}"));
        line.trim_start()[needle.len()..].to_string()
    };
    let mut names = BTreeSet::new();
    for call in src.split("r.register(").skip(1) {
        let call = &call[..call.find(");").expect("register call ends")];
        let name = call.split('"').nth(1).expect("metric name literal");
        let base = format!("routewarden_{name}");
        let kind = if call.contains("Info::new") {
            "info".to_string()
        } else {
            let field = call.split("m.").nth(1).expect("handle m.<field>").split(|c: char| !(c.is_alphanumeric() || c == '_')).next().expect("field");
            field_type(field)
        };
        if kind == "info" {
            names.insert(format!("{base}_info"));
        } else if kind.contains("Histogram") {
            for suffix in ["_bucket", "_sum", "_count"] {
                names.insert(format!("{base}{suffix}"));
            }
        } else if kind.contains("Counter") {
            names.insert(format!("{base}_total"));
        } else if kind.contains("Gauge") {
            names.insert(base);
        } else {
            panic!("metrics/mod.rs: unknown metric type {kind:?} for {name}: teach registered_metrics() about it");
        }
    }
    names
}

/// Every `routewarden_*` token in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("routewarden_") {
        let tail = &rest[i..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        out.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

#[test]
fn dashboard_parses_and_every_metric_is_registered_or_planned() {
    let dash: serde_json::Value = serde_json::from_str(&read(&deploy().join("grafana-dashboard.json"))).expect("dashboard JSON parses");
    assert_eq!(dash["uid"], "routewarden-overview");
    let panels = dash["panels"].as_array().expect("panels");
    let mut exprs = Vec::new();
    for p in panels.iter().filter(|p| p["type"] != "row") {
        let targets = p["targets"].as_array().unwrap_or_else(|| panic!("panel {} has no targets", p["title"]));
        assert!(!targets.is_empty(), "panel {} has no targets", p["title"]);
        for t in targets {
            exprs.push(t["expr"].as_str().expect("expr").to_string());
        }
    }
    for titled in ["writer pair", "desired vs programmed", "by pool and path", "Wrong-path", "Ownership findings"] {
        assert!(panels.iter().any(|p| p["title"].as_str().is_some_and(|t| t.contains(titled))), "dashboard lacks a panel about {titled}");
    }

    let registered = registered_metrics();
    let planned: BTreeMap<&str, &str> = PLANNED_METRICS.iter().copied().collect();
    let mut used = metric_names(&exprs.join("\n"));
    for r in rules() {
        used.extend(metric_names(s(&r, "expr")));
        used.extend(metric_names(&serde_yaml_ng::to_string(&r["annotations"]).expect("yaml")));
    }
    for name in &used {
        assert!(
            registered.contains(name) || planned.contains_key(name.as_str()),
            "{name} is used by a rule or the dashboard but is neither registered in agent/src/observe/metrics/mod.rs nor planned in PLANNED_METRICS"
        );
    }
    // Not fatal: the issues' metrics land while this file is edited elsewhere. A stale entry
    // would hide a later rename, so it is called out on every run.
    for (name, issue) in &planned {
        if registered.contains(*name) {
            eprintln!("STALE PLANNED_METRICS entry: {name} (planned by {issue}) is now registered in metrics/mod.rs; remove it");
        }
    }

    // The README's metric table lists every registered and planned metric.
    let readme = read(&deploy().join("README.md"));
    for name in registered.iter().map(String::as_str).chain(planned.keys().copied()) {
        let family = name.trim_end_matches("_bucket").trim_end_matches("_sum").trim_end_matches("_count");
        assert!(readme.contains(&format!("`{family}")), "deploy/README.md metric table lacks {family}");
    }
}
