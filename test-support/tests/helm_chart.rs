//! Checks of the Helm chart `charts/routewarden` with Helm's own code, offline.
//!
//! Helm runs as a library: the PyPI package `helm-python-sdk` (import name `helm_python`)
//! bundles Helm's Go SDK as a shared library, so its lint and template rendering are the real
//! `helm lint --strict` and `helm template`, with no `helm` binary and no cluster.
//! `cargo xtask test` installs it into the test tools' venv (`xtask/src/setup.rs`).
//!
//! The chart must render what `deploy/` does: with default values the same objects as
//! `kubectl kustomize deploy/`, and with each `charts/routewarden/ci/*-values.yaml` the same
//! objects as an overlay of `deploy/` that enables the matching kustomize component. Objects
//! are compared after parsing, keyed by kind, namespace and name; [`normalize`] lists exactly
//! what the comparison ignores. Every rendered object also passes `kubernetes-validate`, as
//! `deploy/`'s manifests do in `deploy_manifests.rs`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_yaml_ng::{Mapping, Value};

/// Labels Helm's conventions add to every object (and the instance label to the selectors)
/// that `deploy/` does not carry: the comparison drops them from `metadata.labels`,
/// `spec.selector.matchLabels` and `spec.template.metadata.labels`.
const HELM_LABELS: &[&str] = &["helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/version"];

/// The pod-template annotation with which the chart rolls the agents when the etcd endpoints
/// change (kustomize does it with a hashed ConfigMap name instead).
const HELM_ANNOTATIONS: &[&str] = &["checksum/etcd"];

/// Kinds of the Prometheus Operator's CRDs: no Kubernetes schema covers them, so they are
/// compared with `deploy/`'s (checked structurally in `deploy_manifests.rs`) or checked here.
const CRD_KINDS: &[&str] = &["PodMonitor", "PrometheusRule", "ServiceMonitor"];

/// Kinds whose API (flowcontrol.apiserver.k8s.io/v1) exists from Kubernetes 1.29 on: the
/// large-cluster variant is validated against the newest schema only.
const NEW_KINDS: &[&str] = &["FlowSchema", "PriorityLevelConfiguration"];

/// Release name and namespace of every rendering: `helm install routewarden charts/routewarden
/// -n routewarden`, which gives deploy/'s names and namespace.
const RELEASE: &str = "routewarden";

/// The Python side: `lint`, `render`, or `render-packaged` (`helm package`, then render the
/// archive) with `helm_python`, as release `argv[2]` in namespace `argv[3]`; prints JSON.
/// Values files are parsed by Helm's own values reader.
const HELPER: &str = r#"
import json, sys, tempfile
import helm_python as helm
helm.disable_logging()
what, release, namespace, chart, files = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
values = {}
for f in files:
    with open(f) as fh:
        values.update(helm.values_from_yaml(fh.read()))
if what == "lint":
    out = helm.lint(chart, values, strict=True, namespace=namespace)
elif what == "render-packaged":
    with tempfile.TemporaryDirectory() as d:
        with helm.Chart.load(helm.package(chart, destination=d)) as c:
            out = c.render(values, name=release, namespace=namespace, is_install=True)
else:
    with helm.Chart.load(chart) as c:
        out = c.render(values, name=release, namespace=namespace, is_install=True)
print(json.dumps(out, sort_keys=True))
"#;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("test-support/ has a parent").to_path_buf()
}

fn chart() -> PathBuf {
    root().join("charts/routewarden")
}

fn deploy() -> PathBuf {
    root().join("deploy")
}

/// Find `tool` on PATH, else in the test tools' venv (`target/tools/venv/bin`), where
/// `cargo xtask test` installs it and where a plain `cargo test` does not look.
fn tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).chain([root().join("target/tools/venv/bin")]).map(|d| d.join(name)).find(|p| p.is_file())
}

/// A Python that imports `helm_python` (the venv's, normally).
fn helm_python() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([root().join("target/tools/venv/bin")])
        .map(|d| d.join("python3"))
        .filter(|p| p.is_file())
        .find(|p| Command::new(p).args(["-c", "import helm_python"]).output().is_ok_and(|o| o.status.success()))
}

/// The tools every test here needs, or the skip that says which is missing.
fn tools(test: &str) -> Option<(PathBuf, PathBuf)> {
    let Some(python) = helm_python() else {
        routewarden_lab::skip(test, "helm-python-sdk (import helm_python) not installed: `cargo xtask test` installs it into target/tools/venv");
        return None;
    };
    let Some(kubectl) = tool("kubectl") else {
        routewarden_lab::skip(test, "kubectl (kustomize 5) not installed");
        return None;
    };
    Some((python, kubectl))
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{cmd:?} failed ({}):\n{stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    stdout
}

/// Run the Python helper ([`HELPER`]) as release [`RELEASE`] in namespace [`RELEASE`].
fn helm(python: &Path, what: &str, values: &[PathBuf]) -> Result<serde_json::Value, String> {
    helm_as(python, what, (RELEASE, RELEASE), values)
}

/// Run the Python helper ([`HELPER`]) as `release` in `namespace`; returns its JSON, or the
/// error text when it fails.
fn helm_as(python: &Path, what: &str, (release, namespace): (&str, &str), values: &[PathBuf]) -> Result<serde_json::Value, String> {
    let out = Command::new(python).arg("-c").arg(HELPER).args([what, release, namespace]).arg(chart()).args(values).output().expect("spawn python");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(serde_json::from_slice(&out.stdout).expect("helper prints JSON"))
}

/// `charts/routewarden/ci/<name>-values.yaml`.
fn ci_values(name: &str) -> PathBuf {
    let p = chart().join(format!("ci/{name}-values.yaml"));
    assert!(p.is_file(), "{} missing", p.display());
    p
}

/// All YAML documents of a text (empty documents dropped).
fn yaml_docs(text: &str, what: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| {
            use serde::Deserialize as _;
            Value::deserialize(d).unwrap_or_else(|e| panic!("{what}: invalid YAML: {e}"))
        })
        .filter(|v| !v.is_null())
        .collect()
}

/// The chart's objects with these values files, in template order: the manifests (not
/// NOTES.txt) of `helm template`.
fn render(python: &Path, values: &[PathBuf]) -> Vec<Value> {
    render_as(python, "render", (RELEASE, RELEASE), values)
}

/// [`render`] with the helper's `what`, release and namespace.
fn render_as(python: &Path, what: &str, release: (&str, &str), values: &[PathBuf]) -> Vec<Value> {
    let out = helm_as(python, what, release, values).unwrap_or_else(|e| panic!("helm template ({what}) with {values:?} failed:\n{e}"));
    let manifests = out.as_object().expect("template name -> manifest");
    let mut docs = Vec::new();
    for (name, text) in manifests {
        if Path::new(name).extension().is_some_and(|e| e == "yaml") {
            docs.extend(yaml_docs(text.as_str().expect("manifest text"), name));
        }
    }
    docs
}

/// Every values set the tests render: the defaults, then each `ci/*-values.yaml`.
fn value_sets() -> Vec<Vec<PathBuf>> {
    let mut sets: Vec<Vec<PathBuf>> = vec![vec![]];
    for entry in std::fs::read_dir(chart().join("ci")).expect("charts/routewarden/ci") {
        sets.push(vec![entry.expect("entry").path()]);
    }
    sets.sort();
    sets
}

/// `kubectl kustomize` of an overlay of deploy/ whose kustomization is `resources: [deploy/]`
/// plus `extra` (`{rel}` in it stands for the path to deploy/), written with `files` in a
/// scratch dir. kustomize refuses absolute paths: deploy/ is reached relatively.
fn kustomize(kubectl: &Path, name: &str, extra: &str, files: &[(&str, &str)]) -> Vec<Value> {
    let dir = std::env::temp_dir().join(format!("routewarden-helm-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    let up = "../".repeat(dir.components().count() - 1);
    let rel = format!("{up}{}", deploy().display().to_string().trim_start_matches('/'));
    let kustomization = format!("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [{rel}]\n{}", extra.replace("{rel}", &rel));
    std::fs::write(dir.join("kustomization.yaml"), kustomization).expect("write overlay");
    for (file, text) in files {
        std::fs::write(dir.join(file), text).expect("write overlay file");
    }
    let out = run(Command::new(kubectl).arg("kustomize").arg(&dir).arg("--load-restrictor=LoadRestrictionsNone"));
    let _ = std::fs::remove_dir_all(&dir);
    yaml_docs(&out, &format!("kustomize {name}"))
}

fn s<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_else(|| panic!("missing string field {key:?} in {v:?}"))
}

/// `Kind namespace/name`, the identity objects are compared by.
fn key(v: &Value) -> String {
    let m = &v["metadata"];
    format!("{} {}/{}", s(v, "kind"), m.get("namespace").and_then(Value::as_str).unwrap_or(""), s(m, "name"))
}

/// Drop `names` from the mapping at `path` (and the mapping itself when that empties it).
fn drop_keys(v: &mut Value, path: &[&str], names: &[&str]) {
    let (last, parents) = path.split_last().expect("non-empty path");
    let mut at = v;
    for p in parents {
        match at.get_mut(*p) {
            Some(next) => at = next,
            None => return,
        }
    }
    let Some(map) = at.as_mapping_mut() else { return };
    if let Some(Value::Mapping(inner)) = map.get_mut(*last) {
        for n in names {
            inner.remove(*n);
        }
        if inner.is_empty() {
            map.remove(*last);
        }
    }
}

/// A list of mappings as a mapping keyed by each item's `field` (order dropped).
fn keyed(list: &mut Value, field: &str) {
    if let Value::Sequence(items) = list {
        let map: Mapping = items.iter().map(|i| (i[field].clone(), i.clone())).collect();
        assert_eq!(map.len(), items.len(), "duplicate {field} in {items:?}");
        *list = Value::Mapping(map);
    }
}

/// What the comparison ignores, and nothing else:
/// - [`HELM_LABELS`] in `metadata.labels`, `spec.selector.matchLabels` and
///   `spec.template.metadata.labels` (a label map left empty is dropped);
/// - [`HELM_ANNOTATIONS`] in `spec.template.metadata.annotations`;
/// - the order of the DaemonSet container's `env` and `volumeMounts` and of the pod's
///   `volumes`, merge-keyed lists whose order a kustomize strategic-merge patch changes (its
///   entries go first) and whose meaning it does not (no `$(VAR)` references): compared as
///   maps by `name` / `mountPath`.
fn normalize(mut v: Value) -> Value {
    drop_keys(&mut v, &["metadata", "labels"], HELM_LABELS);
    drop_keys(&mut v, &["spec", "selector", "matchLabels"], HELM_LABELS);
    drop_keys(&mut v, &["spec", "template", "metadata", "labels"], HELM_LABELS);
    drop_keys(&mut v, &["spec", "template", "metadata", "annotations"], HELM_ANNOTATIONS);
    if s(&v, "kind") == "DaemonSet" {
        let pod = &mut v["spec"]["template"]["spec"];
        keyed(&mut pod["volumes"], "name");
        if let Some(Value::Sequence(containers)) = pod.get_mut("containers") {
            for c in containers {
                keyed(&mut c["env"], "name");
                keyed(&mut c["volumeMounts"], "mountPath");
            }
        }
    }
    v
}

fn by_key(docs: Vec<Value>) -> BTreeMap<String, Value> {
    let mut map = BTreeMap::new();
    for d in docs {
        let k = key(&d);
        assert!(map.insert(k.clone(), normalize(d)).is_none(), "{k} twice");
    }
    map
}

/// Where `a` and `b` differ, as paths with both values (for the failure message).
fn diff(path: &str, chart: &Value, built: &Value, out: &mut Vec<String>) {
    match (chart, built) {
        (Value::Mapping(ours), Value::Mapping(theirs)) => {
            for (name, ours_v) in ours {
                let at = format!("{path}.{}", name.as_str().map_or_else(|| format!("{name:?}"), str::to_string));
                match theirs.get(name) {
                    Some(theirs_v) => diff(&at, ours_v, theirs_v, out),
                    None => out.push(format!("{at}: chart {} / kustomize absent", one_line(ours_v))),
                }
            }
            for (name, theirs_v) in theirs {
                if !ours.contains_key(name) {
                    out.push(format!("{path}.{}: chart absent / kustomize {}", name.as_str().unwrap_or("?"), one_line(theirs_v)));
                }
            }
        }
        (Value::Sequence(ours), Value::Sequence(theirs)) if ours.len() == theirs.len() => {
            for (i, (ours_v, theirs_v)) in ours.iter().zip(theirs).enumerate() {
                diff(&format!("{path}[{i}]"), ours_v, theirs_v, out);
            }
        }
        _ if chart != built => out.push(format!("{path}: chart {} / kustomize {}", one_line(chart), one_line(built))),
        _ => {}
    }
}

fn one_line(v: &Value) -> String {
    let t = serde_yaml_ng::to_string(v).unwrap_or_default().replace('\n', " ");
    if t.chars().count() > 300 {
        format!("{}...", t.chars().take(300).collect::<String>())
    } else {
        t
    }
}

/// Compare the chart's objects with kustomize's, object by object; `not_rendered`: keys of
/// kustomize objects the chart leaves to Helm (the Namespace). Returns the number compared.
fn assert_same(variant: &str, chart: Vec<Value>, kustomize: Vec<Value>, not_rendered: &[&str]) -> usize {
    let chart = by_key(chart);
    let mut kustomize = by_key(kustomize);
    for k in not_rendered {
        assert!(kustomize.remove(*k).is_some(), "{variant}: kustomize renders no {k}");
    }
    let only_chart: Vec<&String> = chart.keys().filter(|k| !kustomize.contains_key(*k)).collect();
    let only_kustomize: Vec<&String> = kustomize.keys().filter(|k| !chart.contains_key(*k)).collect();
    assert!(only_chart.is_empty() && only_kustomize.is_empty(), "{variant}: objects only in the chart: {only_chart:?}; only in kustomize: {only_kustomize:?}");
    let mut problems = Vec::new();
    for (k, v) in &chart {
        let mut d = Vec::new();
        diff("", v, &kustomize[k], &mut d);
        problems.extend(d.into_iter().map(|line| format!("{k}: {line}")));
    }
    assert!(problems.is_empty(), "{variant}: the chart differs from kustomize:\n{}", problems.join("\n"));
    eprintln!("{variant}: {} objects identical to kustomize's ({})", chart.len(), chart.keys().cloned().collect::<Vec<_>>().join(", "));
    chart.len()
}

/// The kustomize build the chart's default values must reproduce has this Namespace, which
/// the chart does not render (`helm install --create-namespace` makes the release namespace,
/// and a chart that also rendered it would fail on an existing one).
const NAMESPACE: &str = "Namespace /routewarden";

#[test]
fn chart_lints_clean_in_strict_mode() {
    let Some((python, _)) = tools("chart_lints_clean_in_strict_mode") else { return };
    for values in value_sets() {
        let report = helm(&python, "lint", &values).unwrap_or_else(|e| panic!("helm lint with {values:?} failed:\n{e}"));
        eprintln!("helm lint --strict {values:?}: {report}");
        assert_eq!(report["total_charts_linted"], 1, "{values:?}: {report}");
        assert!(report["errors"].as_array().is_some_and(Vec::is_empty), "helm lint --strict with {values:?}: {report}");
        // Severity 1 is INFO (`icon is recommended`); WARNING (2) and ERROR (3) must not occur.
        let serious: Vec<&serde_json::Value> = report["messages"].as_array().expect("messages").iter().filter(|m| m["severity"].as_u64() != Some(1)).collect();
        assert!(serious.is_empty(), "helm lint --strict with {values:?}: {serious:?}");
    }
}

#[test]
fn default_values_render_what_kustomize_builds() {
    let Some((python, kubectl)) = tools("default_values_render_what_kustomize_builds") else { return };
    let first = render(&python, &[]);
    // Deterministic: a second rendering gives the very same objects in the same order.
    assert_eq!(first, render(&python, &[]), "two renderings of the chart differ");
    let base = yaml_docs(&run(Command::new(&kubectl).arg("kustomize").arg(deploy())), "kubectl kustomize deploy/");
    let n = assert_same("default", first, base, &[NAMESPACE]);
    assert_eq!(n, 12, "objects of the default rendering");
}

/// The etcd overlay of deploy/README.md, with the endpoints' ConfigMap under a fixed name (the
/// chart's; the README's generator hashes it) and the chart's `ci/etcd-values.yaml` endpoints.
const ETCD_OVERLAY: &str = "components: [{rel}/etcd]\nconfigMapGenerator:\n  - name: routewarden-etcd\n    namespace: routewarden\n    literals: [\"endpoints=https://10.0.0.1:2379,https://10.0.0.2:2379\"]\n    options:\n      disableNameSuffixHash: true\n      labels:\n        app.kubernetes.io/name: routewarden\n";

/// `$patch: delete` of the three monitoring objects: deploy/'s kustomization without them.
const MONITORING_OFF_OVERLAY: &str = "patches:\n  - patch: |-\n      {apiVersion: monitoring.coreos.com/v1, kind: PodMonitor, metadata: {name: routewarden, namespace: routewarden}, $patch: delete}\n  - patch: |-\n      {apiVersion: monitoring.coreos.com/v1, kind: PrometheusRule, metadata: {name: routewarden, namespace: routewarden}, $patch: delete}\n  - patch: |-\n      {apiVersion: v1, kind: ConfigMap, metadata: {name: routewarden-grafana-dashboard, namespace: routewarden}, $patch: delete}\n";

/// deploy/'s kustomization without the Node Events' Role and RoleBinding, and the agent told
/// not to record them (`nodeEvents.enabled: false`).
const NODE_EVENTS_OFF_OVERLAY: &str = "patches:\n  - patch: |-\n      {apiVersion: rbac.authorization.k8s.io/v1, kind: Role, metadata: {name: routewarden-node-events, namespace: default}, $patch: delete}\n  - patch: |-\n      {apiVersion: rbac.authorization.k8s.io/v1, kind: RoleBinding, metadata: {name: routewarden-node-events, namespace: default}, $patch: delete}\n  - patch: |-\n      {apiVersion: apps/v1, kind: DaemonSet, metadata: {name: routewarden, namespace: routewarden}, spec: {template: {spec: {containers: [{name: routewarden, env: [{name: ROUTEWARDEN_NODE_EVENTS, value: \"off\"}]}]}}}}\n";

#[test]
fn each_variant_renders_what_its_kustomize_component_adds() {
    let Some((python, kubectl)) = tools("each_variant_renders_what_its_kustomize_component_adds") else { return };
    let variants: [(&str, &str, usize); 6] = [
        ("etcd", ETCD_OVERLAY, 13),
        ("large-cluster", "components: [{rel}/large-cluster]\n", 14),
        ("legacy-kernel", "components: [{rel}/legacy-kernel]\n", 12),
        ("operator", "components: [{rel}/operator]\n", 14),
        ("monitoring-off", MONITORING_OFF_OVERLAY, 9),
        ("node-events-off", NODE_EVENTS_OFF_OVERLAY, 10),
    ];
    for (name, overlay, count) in variants {
        let chart = render(&python, &[ci_values(name)]);
        let built = kustomize(&kubectl, name, overlay, &[]);
        assert_eq!(assert_same(name, chart, built, &[NAMESPACE]), count, "{name}: objects");
    }
}

#[test]
fn service_monitor_replaces_the_pod_monitor() {
    let Some((python, kubectl)) = tools("service_monitor_replaces_the_pod_monitor") else { return };
    let docs = render(&python, &[ci_values("servicemonitor")]);
    let (monitoring, rest): (Vec<Value>, Vec<Value>) = docs.into_iter().partition(|d| ["Service", "ServiceMonitor"].contains(&s(d, "kind")));
    // Everything else is deploy/ less its PodMonitor.
    let base = kustomize(&kubectl, "servicemonitor", "patches:\n  - patch: |-\n      {apiVersion: monitoring.coreos.com/v1, kind: PodMonitor, metadata: {name: routewarden, namespace: routewarden}, $patch: delete}\n", &[]);
    let ds = rest.iter().find(|d| s(d, "kind") == "DaemonSet").expect("DaemonSet").clone();
    assert_same("servicemonitor", rest, base, &[NAMESPACE]);

    let svc = monitoring.iter().find(|d| s(d, "kind") == "Service").expect("Service");
    let sm = monitoring.iter().find(|d| s(d, "kind") == "ServiceMonitor").expect("ServiceMonitor");
    assert_eq!(s(sm, "apiVersion"), "monitoring.coreos.com/v1");
    let pod_labels = ds["spec"]["template"]["metadata"]["labels"].as_mapping().expect("pod labels");
    for (k, v) in svc["spec"]["selector"].as_mapping().expect("Service selector") {
        assert_eq!(pod_labels.get(k), Some(v), "Service selector {k:?} does not match the agents' pods");
    }
    let svc_labels = svc["metadata"]["labels"].as_mapping().expect("Service labels");
    for (k, v) in sm["spec"]["selector"]["matchLabels"].as_mapping().expect("ServiceMonitor selector") {
        assert_eq!(svc_labels.get(k), Some(v), "ServiceMonitor selector {k:?} does not match the Service");
    }
    assert_eq!(svc_labels.get(s(&sm["spec"], "jobLabel")).and_then(Value::as_str), Some("routewarden"), "job=\"routewarden\": the rules select on it");
    assert_eq!(s(&svc["spec"], "clusterIP"), "None", "headless: one target per agent");
    let endpoint = &sm["spec"]["endpoints"][0];
    assert_eq!((s(endpoint, "port"), s(endpoint, "path")), ("metrics", "/metrics"));
    assert!(svc["spec"]["ports"].as_sequence().expect("ports").iter().any(|p| s(p, "name") == "metrics" && s(p, "targetPort") == "metrics"));
    let relabel = &endpoint["relabelings"][0];
    assert_eq!(
        (s(relabel, "targetLabel"), relabel["sourceLabels"][0].as_str()),
        ("node", Some("__meta_kubernetes_pod_node_name")),
        "the node label the alerts use"
    );
}

#[test]
fn contradictory_or_missing_values_fail_the_rendering() {
    let Some((python, _)) = tools("contradictory_or_missing_values_fail_the_rendering") else { return };
    let dir = std::env::temp_dir().join(format!("routewarden-helm-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    for (name, values, says) in [
        ("both-monitors", "serviceMonitor: {enabled: true}\n", "choose one"),
        ("etcd-without-endpoints", "datastore: {type: etcd}\n", "datastore.etcd.endpoints"),
        // values.schema.json: enums, and closed keys so that a misspelt toggle is no silent no-op.
        ("unknown-datastore", "datastore: {type: consul}\n", "value must be one of 'kubernetes', 'etcd'"),
        ("unknown-mode", "mode: programm\n", "value must be one of 'audit', 'program'"),
        ("misspelt-toggle", "legacykernel: true\n", "additional properties 'legacykernel' not allowed"),
    ] {
        let f = dir.join(format!("{name}.yaml"));
        std::fs::write(&f, values).expect("write values");
        let err = helm(&python, "render", &[f]).expect_err(name);
        assert!(err.contains(says), "{name}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_rendered_object_validates_against_kubernetes_schemas() {
    let Some((python, _)) = tools("every_rendered_object_validates_against_kubernetes_schemas") else { return };
    let Some(kv) = tool("kubernetes-validate") else {
        routewarden_lab::skip("every_rendered_object_validates_against_kubernetes_schemas", "kubernetes-validate not installed");
        return;
    };
    let dir = std::env::temp_dir().join(format!("routewarden-helm-validate-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let (mut old, mut new) = (Vec::new(), Vec::new());
    for values in &value_sets() {
        for (i, d) in render(&python, values).into_iter().enumerate() {
            let kind = s(&d, "kind");
            if CRD_KINDS.contains(&kind) {
                continue;
            }
            let stem = values.first().and_then(|p| p.file_stem()).map_or_else(|| "default".into(), |n| n.to_string_lossy().into_owned());
            let f = dir.join(format!("{stem}-{i}-{kind}.yaml"));
            // As JSON (which is YAML): the validator reads YAML 1.1, where an unquoted `off`
            // (ROUTEWARDEN_NODE_EVENTS) would be a boolean.
            std::fs::write(&f, serde_json::to_string(&d).expect("json")).expect("write object");
            if !NEW_KINDS.contains(&kind) {
                old.push(f.clone());
            }
            new.push(f);
        }
    }
    // Oldest and newest schemas the validator ships, as for deploy/ (APF v1 only on the newest).
    run(Command::new(&kv).args(["--strict", "--kubernetes-version", "1.25.0"]).args(&old));
    run(Command::new(&kv).args(["--strict", "--kubernetes-version", "1.37.0"]).args(&new));
    eprintln!("kubernetes-validate: {} objects on 1.25.0, {} on 1.37.0", old.len(), new.len());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The rules and dashboard are deploy/'s files, linked from the chart's `files/`: `helm
/// package` must carry their content, so a packaged chart renders the same objects.
#[test]
fn packaged_chart_renders_the_same_objects() {
    let Some((python, _)) = tools("packaged_chart_renders_the_same_objects") else { return };
    for link in ["files/prometheusrule.yaml", "files/grafana-dashboard.json"] {
        let target = std::fs::read_link(chart().join(link)).unwrap_or_else(|e| panic!("{link} is a link into deploy/: {e}"));
        assert!(target.starts_with("../../../deploy"), "{link} -> {}", target.display());
    }
    let packaged = render_as(&python, "render-packaged", (RELEASE, RELEASE), &[]);
    assert_eq!(packaged, render(&python, &[]), "the packaged chart renders other objects than its directory");
    assert!(packaged.iter().any(|d| s(d, "kind") == "PrometheusRule" && d["spec"]["groups"].as_sequence().is_some_and(|g| !g.is_empty())));
}

/// Another release name and namespace: every name the objects refer to (role bindings'
/// roles, subjects, the priority level, the endpoints' ConfigMap, the service account) is
/// the one the chart renders, in the release namespace.
#[test]
fn references_follow_the_release_name_and_namespace() {
    let Some((python, _)) = tools("references_follow_the_release_name_and_namespace") else { return };
    let (release, namespace) = ("edge", "net-agents");
    for values in value_sets() {
        let docs = render_as(&python, "render", (release, namespace), &values);
        let names: std::collections::BTreeSet<String> = docs.iter().map(key).collect();
        let sa = format!("{release}-routewarden");
        assert!(names.contains(&format!("ServiceAccount {namespace}/{sa}")), "{values:?}: {names:?}");
        for d in &docs {
            let kind = s(d, "kind");
            let ns = d["metadata"].get("namespace").and_then(Value::as_str).unwrap_or("");
            assert!(s(&d["metadata"], "name").starts_with(&sa), "{values:?}: {} not named after the release", key(d));
            if !["ClusterRole", "ClusterRoleBinding", "FlowSchema", "PriorityLevelConfiguration", "Role", "RoleBinding"].contains(&kind) {
                assert_eq!(ns, namespace, "{values:?}: {} not in the release namespace", key(d));
            }
            if kind.ends_with("Binding") {
                let role_ns = if kind == "RoleBinding" { ns } else { "" };
                let role = format!("{} {role_ns}/{}", s(&d["roleRef"], "kind"), s(&d["roleRef"], "name"));
                assert!(names.contains(&role), "{values:?}: {} binds missing {role}", key(d));
                let subject = &d["subjects"][0];
                assert_eq!((s(subject, "name"), s(subject, "namespace")), (sa.as_str(), namespace), "{values:?}: {}", key(d));
            }
            if kind == "FlowSchema" {
                assert!(names.contains(&format!("PriorityLevelConfiguration /{}", s(&d["spec"]["priorityLevelConfiguration"], "name"))));
                let subject = &d["spec"]["rules"][0]["subjects"][0]["serviceAccount"];
                assert_eq!((s(subject, "name"), s(subject, "namespace")), (sa.as_str(), namespace));
            }
            if kind == "DaemonSet" {
                let pod = &d["spec"]["template"]["spec"];
                assert_eq!(s(pod, "serviceAccountName"), sa);
                for env in pod["containers"][0]["env"].as_sequence().expect("env") {
                    if let Some(cm) = env.get("valueFrom").and_then(|v| v.get("configMapKeyRef")) {
                        assert!(names.contains(&format!("ConfigMap {namespace}/{}", s(cm, "name"))), "{values:?}: env reads a ConfigMap not rendered: {cm:?}");
                    }
                }
            }
        }
    }
}
