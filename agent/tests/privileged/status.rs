//! `routewarden status` end to end: real agents in lab node namespaces, each serving its status
//! document on its `metrics` port, behind the API-server stand-in over TLS, which lists their
//! pods and the Nodes and implements the pod proxy (`routewarden_lab::standin::proxy`), reaching
//! each agent from its node's namespace. The command authenticates with a token bound to the
//! shipped `deploy/clusterrole-status.yaml` and nothing else: a request it does not allow is a
//! 403 and fails the test.
//!
//! The cluster: node-a's agent fights a second writer (`ip` run as `bird`, one process writing
//! the agent's route to node-b's IPIP block three times, 300 ms apart), node-b's is quiet,
//! node-c's was started and stopped (its port refuses), node-d has no agent pod. The table and
//! the JSON are compared exactly; what varies from run to run is normalized, and only that: the
//! writers' process ids, the episode's age and node-a's conflict and flap counts (the kernel
//! and the agent race, so the count of alternations is not fixed; each is checked ≥ 1 first).

mod lab_support;

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use lab_support::{example_dir, lab, wait_for, wait_ready, Agent, PORT};
use routewarden_lab::standin::tls::{Pki, TlsServer};
use routewarden_lab::standin::{ApiServer, Rbac, ResourceType, User};
use routewarden_lab::{deploy_dir, skip_unless_root, Lab};
use serde_json::{json, Value};

const NS: &str = "routewarden";
const TOKEN: &str = "token-of-alice";
const FOUGHT: &str = "10.245.20.0/26";

/// The agent pod of `node`, as the DaemonSet makes it (labels, node, the `metrics` port,
/// hostNetwork: the pod's IP is the node's).
fn agent_pod(node: &str, ip: &str) -> Value {
    json!({
        "metadata": {"name": format!("routewarden-{}", &node[node.len() - 1..]), "namespace": NS,
                     "labels": {"app.kubernetes.io/name": "routewarden", "app.kubernetes.io/component": "node-agent"}},
        "spec": {"nodeName": node, "hostNetwork": true,
                 "containers": [{"name": "routewarden", "image": "routewarden:0.1.0",
                                 "ports": [{"name": "metrics", "containerPort": PORT, "protocol": "TCP"}]}]},
        "status": {"phase": "Running", "podIP": ip, "hostIP": ip}
    })
}

/// The stand-in: the agent pods of node-a, -b and -c (plus a pod the selector must leave out),
/// the four Nodes; alice's token, authorized by the shipped status role alone.
fn standin(lab: &Lab) -> ApiServer {
    let role = std::fs::read_to_string(deploy_dir().join("clusterrole-status.yaml")).unwrap();
    let binding = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: alice-status}\n\
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: routewarden-status-reader}\n\
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: alice}]\n";
    let api = ApiServer::new().with_rbac(Rbac::from_manifests(&format!("{role}\n---\n{binding}")).unwrap());
    api.set_tokens([(TOKEN.to_owned(), User { name: "alice".into(), groups: vec!["system:authenticated".into()] })]);
    let pods = ResourceType::new("v1", "Pod", "pods", true);
    let nodes = ResourceType::new("v1", "Node", "nodes", false);
    api.register(&pods);
    api.register(&nodes);
    for node in ["node-a", "node-b", "node-c", "node-d"] {
        api.create(&nodes, json!({"metadata": {"name": node}})).unwrap();
    }
    for (node, ip) in [("node-a", "10.0.0.11"), ("node-b", "10.0.0.12"), ("node-c", "10.0.0.13")] {
        let pod = agent_pod(node, ip);
        api.create(&pods, pod.clone()).unwrap();
        api.reach_pod_from(NS, pod["metadata"]["name"].as_str().unwrap(), &lab.node_ns(node));
    }
    let mut other = agent_pod("node-d", "10.0.1.14");
    other["metadata"]["name"] = json!("calico-node-x");
    other["metadata"]["labels"] = json!({"k8s-app": "calico-node"});
    api.create(&pods, other).unwrap();
    api
}

/// A kubeconfig for alice at `server`, trusting `ca` (a file).
fn kubeconfig(dir: &Path, server: &str, ca: &Path) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: lab\n  cluster: {{server: \"{server}\", certificate-authority: \"{}\"}}\n\
users:\n- name: alice\n  user: {{token: {TOKEN}}}\ncontexts:\n- name: lab\n  context: {{cluster: lab, user: alice}}\ncurrent-context: lab\n",
        ca.display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// `program args…` with `KUBECONFIG` (and `PATH` led by `path`); stdout, asserting exit 0.
fn run(program: &Path, args: &[&str], config: &Path, path: Option<&Path>) -> String {
    let mut cmd = Command::new(program);
    cmd.args(args).env("KUBECONFIG", config).env_remove("RUST_LOG");
    if let Some(p) = path {
        cmd.env("PATH", format!("{}:{}", p.display(), std::env::var("PATH").unwrap_or_default()));
    }
    let out = cmd.output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(out.status.success(), "{} {args:?}: {}\n{stdout}\n{stderr}", program.display(), out.status);
    stdout
}

/// `word[<digits>]` → `word[PID]`, `<digits>s ago` → `Ns ago` (what varies between runs).
fn normalize_pids_and_ages(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find('[') {
        out.push_str(&rest[..=i]);
        rest = &rest[i + 1..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 && rest[digits..].starts_with(']') {
            out.push_str("PID");
            rest = &rest[digits..];
        }
    }
    out.push_str(rest);
    out.split('\n')
        .map(|line| {
            let words: Vec<&str> = line.split(' ').collect();
            (0..words.len())
                .map(|i| {
                    let w = words[i];
                    if words.get(i + 1) == Some(&"ago") && w.ends_with('s') && w[..w.len() - 1].bytes().all(|b| b.is_ascii_digit()) {
                        "Ns"
                    } else {
                        w
                    }
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The table with node-a's CONFLICTS(1h) and FLAPS(1h) cells replaced by `N` (each checked ≥ 1
/// first) and pids and ages normalized.
fn normalize_table(table: &str) -> String {
    let header = table.lines().next().unwrap();
    let cols = [header.find("CONFLICTS(1h)").unwrap(), header.find("FLAPS(1h)").unwrap()];
    let lines: Vec<String> = table
        .lines()
        .map(|line| {
            if !line.starts_with("node-a ") {
                return line.to_owned();
            }
            let mut l = line.to_owned();
            for c in cols.iter().rev() {
                let n = l[*c..].bytes().take_while(u8::is_ascii_digit).count();
                let v: u64 = l[*c..*c + n].parse().unwrap_or_else(|_| panic!("no count at column {c}: {line}"));
                assert!(v >= 1, "node-a has fought and flapped: {line}");
                l.replace_range(*c..*c + n, &format!("{:<n$}", "N"));
            }
            l
        })
        .collect();
    normalize_pids_and_ages(&(lines.join("\n") + "\n"))
}

/// One process named `bird` replacing node-a's route to node-b's IPIP block three times, 300 ms
/// apart (an `ip -batch` fed line by line): the agent puts its route back each time.
fn fight(lab: &Lab) {
    let bird = routewarden_lab::program_named("ip", "bird");
    let mut child = lab.command("node-a", bird.to_str().unwrap()).args(["-batch", "-"]).stdin(Stdio::piped()).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    for _ in 0..3 {
        writeln!(stdin, "route replace {FOUGHT} via 10.0.0.12 dev tunl0 onlink metric 1024 proto bird").unwrap();
        stdin.flush().unwrap();
        std::thread::sleep(Duration::from_millis(300));
    }
    drop(stdin);
    assert!(child.wait().unwrap().success());
}

fn status_doc(lab: &Lab, node: &str) -> Value {
    let (code, body) = lab.http_get(node, PORT, "/status/v1").unwrap();
    assert_eq!(code, 200, "{node}: {body}");
    serde_json::from_str(&body).unwrap()
}

#[test]
fn status_shows_every_node_a_fight_a_stopped_agent_and_a_node_without_one() {
    if skip_unless_root("status_shows_every_node_a_fight_a_stopped_agent_and_a_node_without_one") {
        return;
    }
    if routewarden::bpf::embedded_object().is_none() {
        routewarden_lab::skip(
            "status_shows_every_node_a_fight_a_stopped_agent_and_a_node_without_one",
            format_args!("built without the BPF object; `cargo xtask test` embeds it"),
        );
        return;
    }
    let lab = lab();
    let watch = ["--route-watch-window", "2", "--route-watch-backend", "socket-filter"];
    let addr = format!("0.0.0.0:{PORT}");
    let node_a = Agent::spawn(&lab, "node-a", &example_dir(), &addr, &watch, None);
    let _node_b = Agent::spawn(&lab, "node-b", &example_dir(), &addr, &watch, None);
    let node_c = Agent::spawn(&lab, "node-c", &example_dir(), &addr, &watch, None);
    for node in ["node-a", "node-b", "node-c"] {
        wait_ready(&lab, node);
    }
    node_c.stop();
    let refused = lab.http_get("node-c", PORT, "/status/v1").unwrap_err();
    assert!(format!("{refused:#}").contains("Connection refused"), "node-c's agent is stopped: {refused:#}");
    fight(&lab);
    wait_for("node-a's status to show the fight", Duration::from_secs(20), || {
        let doc = status_doc(&lab, "node-a");
        doc["episodes"].as_array().unwrap().iter().any(|e| e["kind"] == "conflict" && e["prefix"] == FOUGHT).then_some(())
    });

    let api = standin(&lab);
    let pki = Pki::generate(&["127.0.0.1"]).unwrap();
    let server = TlsServer::start(api.clone(), std::net::TcpListener::bind("127.0.0.1:0").unwrap(), &pki, None).unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.crt"), &pki.ca_pem).unwrap();
    let config = kubeconfig(dir.path(), &format!("https://{}", server.addr()), &dir.path().join("ca.crt"));
    let bin = Path::new(env!("CARGO_BIN_EXE_routewarden"));

    let table = run(bin, &["status"], &config, None);
    eprintln!("routewarden status:\n{table}");
    let want = "\
NODE     READY   MODE      ROLE    CALICO   PROGRAMS   FINDINGS   CONFLICTS(1h)   FLAPS(1h)   LAST-FIGHT
node-a   yes     program   felix   3.33     ipip       -          N               N           routewarden[PID] vs bird[PID] 10.245.20.0/26 Ns ago
node-b   yes     program   felix   3.33     ipip       -          0               0           -
node-c   ?       no answer: error trying to reach service: dial tcp 10.0.0.13:9695: connect: connection refused (503 ServiceUnavailable)
node-d   -       no agent pod on this node
2 of 4 nodes answer (no answer: node-c; no agent: node-d); node-a: routewarden[PID] vs bird[PID] fight over 10.245.20.0/26
";
    assert_eq!(normalize_table(&table), want, "as printed:\n{table}\n{:?}", api.log().entries().iter().map(|e| (e.path.clone(), e.status)).collect::<Vec<_>>());
    assert!(table.contains(&format!("routewarden[{}] vs bird[", node_a.pid())), "{table}");

    check_plugin(bin, dir.path(), &config, want);
    check_json(&lab, &run(bin, &["status", "-o", "json"], &config, None), node_a.pid());
    check_node_and_watch(bin, &config);
    check_requests(&api);
    check_timeout(&lab, &api, bin, &config);
}

/// An agent that takes the connection and never answers (a listener nobody accepts from, in
/// node-b's namespace, as the pod of a node-e) is a row once `--timeout` has passed.
fn check_timeout(lab: &Lab, api: &ApiServer, bin: &Path, config: &Path) {
    let listener = lab.in_netns("node-b", || std::net::TcpListener::bind("10.0.0.12:9696").unwrap()).unwrap();
    let mut pod = agent_pod("node-e", "10.0.0.12");
    pod["spec"]["containers"][0]["ports"][0]["containerPort"] = json!(9696);
    api.create(&ResourceType::new("v1", "Pod", "pods", true), pod).unwrap();
    api.reach_pod_from(NS, "routewarden-e", &lab.node_ns("node-b"));
    let started = std::time::Instant::now();
    let table = run(bin, &["status", "--node", "node-e", "--timeout", "1"], config, None);
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    assert_eq!(
        table,
        "\
NODE     READY   MODE   ROLE   CALICO   PROGRAMS   FINDINGS   CONFLICTS(1h)   FLAPS(1h)   LAST-FIGHT
node-e   ?       no answer: no answer within 1s
0 of 1 nodes answer (no answer: node-e)
"
    );
    drop(listener);
}

/// The same binary as the kubectl plugin, by its name alone, and through kubectl itself.
fn check_plugin(bin: &Path, dir: &Path, config: &Path, want: &str) {
    let plugins = dir.join("bin");
    std::fs::create_dir(&plugins).unwrap();
    std::os::unix::fs::symlink(bin, plugins.join("kubectl-routewarden")).unwrap();
    let as_plugin = run(&plugins.join("kubectl-routewarden"), &["status"], config, None);
    assert_eq!(normalize_table(&as_plugin), want, "as kubectl-routewarden:\n{as_plugin}");
    let help = run(&plugins.join("kubectl-routewarden"), &["status", "--help"], config, None);
    assert!(help.starts_with("Every agent's status in one table") && help.contains("Usage: kubectl routewarden status [OPTIONS]"), "{help}");
    if Command::new("kubectl").args(["version", "--client"]).output().is_ok_and(|o| o.status.success()) {
        let via_kubectl = run(Path::new("kubectl"), &["routewarden", "status"], config, Some(&plugins));
        assert_eq!(normalize_table(&via_kubectl), want, "as `kubectl routewarden status`:\n{via_kubectl}");
    }
}

/// JSON: every document as the agent served it, and the rows that have none.
fn check_json(lab: &Lab, text: &str, node_a_pid: u32) {
    eprintln!("routewarden status -o json:\n{text}");
    let v: Value = serde_json::from_str(text).unwrap();
    assert_eq!((v["apiVersion"].as_str(), v["kind"].as_str(), v["ok"].as_bool()), (Some("routewarden.io/v1"), Some("ClusterStatus"), Some(false)));
    assert_eq!(v["nodesUnlisted"], Value::Null);
    assert_eq!(
        normalize_pids_and_ages(v["verdict"].as_str().unwrap()),
        "2 of 4 nodes answer (no answer: node-c; no agent: node-d); node-a: routewarden[PID] vs bird[PID] fight over 10.245.20.0/26"
    );
    let nodes = v["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 4);
    let rows: Vec<(&str, &str, &str)> =
        nodes.iter().map(|n| (n["node"].as_str().unwrap(), n["state"].as_str().unwrap(), n["pod"].as_str().unwrap_or("-"))).collect();
    assert_eq!(
        rows,
        [("node-a", "answered", "routewarden-a"), ("node-b", "answered", "routewarden-b"), ("node-c", "noAnswer", "routewarden-c"), ("node-d", "noAgent", "-")]
    );
    let a = &nodes[0]["status"];
    assert_eq!((a["apiVersion"].as_str(), a["kind"].as_str(), a["node"].as_str()), (Some("routewarden.io/v1"), Some("AgentStatus"), Some("node-a")));
    let fought = a["episodes"].as_array().unwrap().iter().find(|e| e["kind"] == "conflict").unwrap();
    assert_eq!((fought["prefix"].as_str(), fought["table"].as_u64()), (Some(FOUGHT), Some(254)));
    let writers: Vec<(&str, u64, &str)> = fought["writers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| (w["class"].as_str().unwrap(), w["protocol"].as_u64().unwrap(), w["comm"].as_str().unwrap()))
        .collect();
    assert_eq!(writers, [("self", 80, "routewarden"), ("bird", 12, "bird")]);
    assert_eq!(fought["writers"][0]["pid"].as_u64(), Some(u64::from(node_a_pid)));
    assert!(fought["count"].as_u64().unwrap() >= 1);
    // node-b's document is the one its agent serves (but for the time it was made).
    let mut b = nodes[1]["status"].clone();
    let mut as_served = status_doc(lab, "node-b");
    b["generatedAt"] = json!(0);
    as_served["generatedAt"] = json!(0);
    assert_eq!(b, as_served);
    assert_eq!(b["episodes"], json!([]));
    assert_eq!(
        nodes[2]["reason"].as_str(),
        Some("error trying to reach service: dial tcp 10.0.0.13:9695: connect: connection refused (503 ServiceUnavailable)")
    );
    assert_eq!(nodes[2].get("status"), None);
    assert_eq!(nodes[3], json!({"node": "node-d", "state": "noAgent"}));
}

/// `--node`, and `--watch` twice (one JSON document per poll).
fn check_node_and_watch(bin: &Path, config: &Path) {
    let only_b = run(bin, &["status", "--node", "node-b"], config, None);
    assert_eq!(
        only_b,
        "\
NODE     READY   MODE      ROLE    CALICO   PROGRAMS   FINDINGS   CONFLICTS(1h)   FLAPS(1h)   LAST-FIGHT
node-b   yes     program   felix   3.33     ipip       -          0               0           -
ok: 1 node, no fights
"
    );
    let watched = run(bin, &["status", "--node", "node-b", "-o", "json", "--watch", "--interval", "1", "--count", "2"], config, None);
    let polls: Vec<Value> = serde_json::Deserializer::from_str(&watched).into_iter::<Value>().map(Result::unwrap).collect();
    assert_eq!(polls.len(), 2, "{watched}");
    assert!(polls.iter().all(|p| p["verdict"] == "ok: 1 node, no fights"), "{watched}");
}

/// Only what the role allows was asked, and it was all allowed.
fn check_requests(api: &ApiServer) {
    let log = api.log().entries();
    assert!(!log.is_empty());
    for e in &log {
        assert_eq!(e.user.as_deref(), Some("alice"), "{e:?}");
        assert!(e.status != 401 && e.status != 403, "refused: {e:?}");
    }
    let proxied: Vec<(String, u16)> = log.iter().filter(|e| e.path.contains("/proxy/")).take(3).map(|e| (e.path.clone(), e.status)).collect();
    let mut proxied_sorted = proxied.clone();
    proxied_sorted.sort();
    assert_eq!(
        proxied_sorted,
        [
            ("/api/v1/namespaces/routewarden/pods/routewarden-a:9695/proxy/status/v1".to_owned(), 200),
            ("/api/v1/namespaces/routewarden/pods/routewarden-b:9695/proxy/status/v1".to_owned(), 200),
            ("/api/v1/namespaces/routewarden/pods/routewarden-c:9695/proxy/status/v1".to_owned(), 503),
        ]
    );
}
