//! The shipped alerts end to end: a real Prometheus server (Debian package
//! `prometheus`) scrapes a routewarden agent on each of the lab's four nodes and evaluates the
//! rules of deploy/prometheusrule.yaml. The test causes the real condition behind every rule
//! (19 rules, 14 alert names; all but [`NOT_CAUSED_HERE`]), and asserts through Prometheus's HTTP API that each alert goes
//! to `firing` exactly once, with its exact labels, value and summary, and resolves after its
//! cause is removed, and that no other alert fires at all.
//!
//! **Time runs 30 times faster** ([`SPEEDUP`]). In a cluster the PodMonitor scrapes every
//! 30 s and Prometheus evaluates every 30 s (kube-prometheus-stack's default); here both take
//! 1 s, and every duration of the rules (each `for:`, each range window in an expression or an
//! annotation's query), Prometheus's lookback delta (5 m -> 10 s) and the agents' timing flags
//! (resync 90 s -> 3 s, settle period and handover grace 30 s -> 1 s, route-watch and
//! forwarding flap windows 30 s -> 1 s) are divided by 30, so every window spans as many
//! scrapes as it does in production. One rule cannot follow: RouteProgrammingErrors' `[5m]`
//! would become 10 s, but the agent retries a failing write with a backoff that doubles up to
//! 30 s (`dataplane/reconciler.rs` `BACKOFF_MAX`, a constant, not a flag), so a persistent
//! failure shows up at most every 30 s. Its window is 40 s instead ([`ERRORS_WINDOW`]: 30 s
//! and one scrape and evaluation; production's 5 minutes is longer than 30 s too) and its
//! `for:` 60 s ([`ERRORS_FOR`]): longer than the window by 20 s, so a one-off burst, which
//! keeps the rate above zero for one window at most, still cannot fire it (the shipped rule
//! holds for twice its window, 10 m and 5 m; twice 40 s would not fit the run in two
//! minutes). The rendered file is checked against the shipped one:
//! it differs only in these durations
//! (`scaled_rules_differ_from_the_shipped_ones_only_in_durations`).
//!
//! What causes what (each agent reads its own copy of the example cluster):
//!
//! | node | cause | alerts |
//! |---|---|---|
//! | node-a | a BIRD-protocol writer puts node-b's CrossSubnet block on `tunl0` every 100 ms and the agent claims it back onto `eth0` (a real fight), while node-a sends traffic to the block | RouteFlapping, ForwardingFlap, WrongPathForwarding (expected host, actual tunnel) |
//! | node-a | `ipam.yaml` emptied (`kind: List`, `items: []`), then restored | RouteMassDeletionHeld |
//! | node-a | node-a's Node deleted from `calico.yaml`, then restored | RoutewardenDatastoreNotSynced |
//! | node-b | a `proto static` route at the agent's key for node-d's `ipip-always` block, through `eth0`, with traffic to the block | RoutesHeldByOtherWriter, WrongPathForwarding (expected tunnel, actual host) |
//! | node-b | an IP pool with host bits set (`10.99.1.0/16`) in a new file, then corrected | RoutewardenInvalidInput |
//! | node-b | BGPConfiguration `programClusterRoutes: Enabled` next to Felix's `EnabledIPIPOnly` | RouteOwnershipConflict (double-programmed, ipip) |
//! | node-c | `tunl0` deleted, then recreated | RouteProgrammingErrors, RouteDrift (3 tunnel routes) |
//! | node-d | BGPConfiguration `programClusterRoutes: Disabled`: nobody programs no-encap | RouteOwnershipConflict (unowned, noencap) |
//! | node-d | a route storm: 6,000 prefixes rewritten three times by two route protocols, in four rounds 1.5 s apart (more conflict and flap records at once than the 256 KiB ring buffer holds) | RouteWatchDegraded (events-lost), RouteFlapping |
//! | node-d | the agent restarted with `--route-watch-backend fentry`, which this kernel cannot load, then without | RouteWatchDegraded (no-backend; program-detached for `route_watch`) |
//! | node-d | then restarted with `--route-table 48` and no `ip rule` selecting it, until the rule is added | RouteTableNotSelected (ipv4, table 48) |
//! | node-d | then its pod "evicted": the agent stopped and its target gone from service discovery, until phase 2 ends | RoutewardenDown (node-without-agent) |
//! | all | then (phase 2) every other agent stopped, their targets kept (pods that cannot be scraped), then all back | RoutewardenDown (scrape-failing x3, no-agent-reporting) |
//!
//! The `node-without-agent` arm joins routewarden's targets with kube-state-metrics'
//! `kube_node_info`. No Kubernetes runs in the lab, so the test serves that series itself
//! ([`KubeStateMetrics`]): the four lab nodes plus a Windows node, which must never be
//! reported. Everything runs in the lab's namespaces: Prometheus and the stand-in in node-a's,
//! scraping the agents over the nodes' `eth0` addresses.

mod lab_support;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use lab_support::{copy_examples, lab, metrics, routes, wait_for, wait_ready, Agent, NODE_A_IPIP, PORT};
use routewarden_lab::{skip_unless_root, Lab};
use serde_json::Value as Json;
use serde_yaml_ng::Value;

/// Rules this lab cannot cause, and where each is proved instead. The lab's agents run the
/// route watch this host kernel allows (the socket filter), which sees only writes that
/// succeeded.
const NOT_CAUSED_HERE: [(&str, &str); 1] = [(
    "RouteWriterFailing",
    "it needs refused writes, which only fentry and kprobe see (this host kernel loads neither); the QEMU lane's route_watch_fentry and route_watch_kprobe assert the episode, its event and routewarden_failing_writer_episodes_total, and promtool (deploy/tests/route_writer_failing.yaml) the rule",
)];

const PROMETHEUS: &str = "/usr/bin/prometheus";
/// Prometheus's port on node-a's loopback.
const PROM_PORT: u16 = 9090;
/// The kube-state-metrics stand-in's port on node-a's loopback.
const KSM_PORT: u16 = 9096;
/// Where Prometheus and the kube-state-metrics stand-in run.
const PROM_NODE: &str = "node-a";
/// Lab time: every duration of the rules and of the agents is divided by this (see the top).
const SPEEDUP: u64 = 30;
/// RouteProgrammingErrors' range window in the lab, seconds: the agent's longest retry
/// backoff (30 s) and one scrape and evaluation.
const ERRORS_WINDOW: u64 = 40;
/// RouteProgrammingErrors' `for:` in the lab, seconds: the window and 20 s (see the top).
const ERRORS_FOR: u64 = ERRORS_WINDOW + 20;
/// The example cluster's nodes and their `eth0` addresses (the agents' scrape targets).
const NODES: [(&str, &str); 4] = [("node-a", "10.0.0.11"), ("node-b", "10.0.0.12"), ("node-c", "10.0.0.13"), ("node-d", "10.0.1.14")];
/// The agents' timing flags divided by [`SPEEDUP`] (defaults 90, 30, 30, 30, 30 s).
const LAB_TIMING: [&str; 10] =
    ["--resync-interval", "3", "--handover-grace", "1", "--settle-period", "1", "--route-watch-window", "1", "--forward-flap-window", "1"];

fn skip_without_prometheus(test: &str) -> bool {
    if Path::new(PROMETHEUS).exists() {
        false
    } else {
        routewarden_lab::skip(test, format_args!("{PROMETHEUS} missing (Debian package `prometheus`; `cargo xtask setup` lists it in TEST_APT_PACKAGES)"));
        true
    }
}

// ---------------------------------------------------------------------------------------------
// The rule file, scaled.

/// The `spec` of deploy/prometheusrule.yaml: its rule groups, as promtool and Prometheus read them.
fn shipped_rules() -> Value {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheusrule.yaml")).unwrap();
    let doc: Value = serde_yaml_ng::from_str(&text).unwrap();
    doc.get("spec").expect("PrometheusRule has a spec").clone()
}

/// Seconds of a Prometheus duration as the rule file writes them (`30s`, `10m`, `1h`).
fn seconds(d: &str) -> u64 {
    let (n, unit) = d.split_at(d.len() - 1);
    let n: u64 = n.parse().unwrap_or_else(|_| panic!("duration {d:?}: expected <number><s|m|h>"));
    match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => panic!("duration {d:?}: expected <number><s|m|h>"),
    }
}

/// Shipped `seconds` in lab time (exact: a duration that does not divide would be a rounding).
fn lab_seconds(shipped: u64) -> u64 {
    assert_eq!(shipped % SPEEDUP, 0, "{shipped} s does not divide by {SPEEDUP}");
    shipped / SPEEDUP
}

/// Split a PromQL text into the text around its range windows and the windows: `a[5m]b` ->
/// (`["a[", "]b"]`, `["5m"]`).
fn windows(text: &str) -> (Vec<String>, Vec<String>) {
    let (mut rest, mut windows) = (Vec::new(), Vec::new());
    let mut cur = String::new();
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        cur.push(c);
        if c != '[' {
            continue;
        }
        // A window is `[<digits><s|m|h>]`; anything else (a label matcher's regex class) is text.
        let tail = &text[i + 1..];
        let Some(end) = tail.find(']') else { continue };
        let inner = &tail[..end];
        let is_window = inner.len() >= 2 && inner[..inner.len() - 1].bytes().all(|b| b.is_ascii_digit()) && inner.ends_with(['s', 'm', 'h']);
        if is_window {
            rest.push(std::mem::take(&mut cur));
            windows.push(inner.to_string());
            for _ in 0..inner.len() {
                chars.next();
            }
        }
    }
    rest.push(cur);
    (rest, windows)
}

/// Rewrite every range window of `text` with `f(alert, shipped seconds)`.
fn scale_windows(text: &str, f: impl Fn(u64) -> u64) -> String {
    let (rest, windows) = windows(text);
    let mut out = rest[0].clone();
    for (w, r) in windows.iter().zip(&rest[1..]) {
        let _ = write!(out, "{}s", f(seconds(w)));
        out.push_str(r);
    }
    out
}

/// Lab seconds of a range window of `alert`'s expression (see [`ERRORS_WINDOW`]).
fn lab_expr_window(alert: &str, shipped: u64) -> u64 {
    if alert == "RouteProgrammingErrors" {
        assert_eq!(shipped, 300, "RouteProgrammingErrors' window changed: revisit ERRORS_WINDOW");
        ERRORS_WINDOW
    } else {
        lab_seconds(shipped)
    }
}

/// Lab seconds of `alert`'s `for:` (see [`ERRORS_FOR`]).
fn lab_for(alert: &str, shipped: u64) -> u64 {
    if alert == "RouteProgrammingErrors" {
        assert_eq!(shipped, 600, "RouteProgrammingErrors' for changed: revisit ERRORS_FOR");
        ERRORS_FOR
    } else {
        lab_seconds(shipped)
    }
}

/// The rule groups in lab time: every `for:` and every range window (expressions and the
/// queries inside annotations) divided by [`SPEEDUP`], RouteProgrammingErrors' expression
/// window and `for:` set from [`ERRORS_WINDOW`] and [`ERRORS_FOR`]. Nothing else changes.
fn lab_rules() -> Value {
    let mut spec = shipped_rules();
    for group in spec["groups"].as_sequence_mut().unwrap() {
        for rule in group["rules"].as_sequence_mut().unwrap() {
            let rule = rule.as_mapping_mut().unwrap();
            let alert = rule["alert"].as_str().unwrap().to_string();
            if let Some(f) = rule.get("for").and_then(Value::as_str) {
                let f = format!("{}s", lab_for(&alert, seconds(f)));
                rule.insert("for".into(), f.into());
            }
            let expr = scale_windows(rule["expr"].as_str().unwrap(), |s| lab_expr_window(&alert, s));
            rule.insert("expr".into(), expr.into());
            if let Some(annotations) = rule.get_mut("annotations").and_then(Value::as_mapping_mut) {
                for (_, v) in annotations.iter_mut() {
                    let text = scale_windows(v.as_str().unwrap(), lab_seconds);
                    *v = text.into();
                }
            }
        }
    }
    spec
}

/// The rules of the shipped file: (alert, its routing labels), in file order.
fn rule_identities(spec: &Value) -> Vec<(String, Labels)> {
    let mut out = Vec::new();
    for group in spec["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            let labels: Labels = serde_yaml_ng::from_value(rule["labels"].clone()).unwrap();
            out.push((rule["alert"].as_str().unwrap().to_string(), labels));
        }
    }
    out
}

#[test]
fn scaled_rules_differ_from_the_shipped_ones_only_in_durations() {
    let (shipped, scaled) = (shipped_rules(), lab_rules());
    let names: BTreeSet<String> = rule_identities(&shipped).into_iter().map(|(a, _)| a).collect();
    assert_eq!(rule_identities(&shipped).len(), 19, "rules in deploy/prometheusrule.yaml: update the lab test's causes");
    assert_eq!(names.len(), 14);
    let (sg, lg) = (shipped["groups"].as_sequence().unwrap(), scaled["groups"].as_sequence().unwrap());
    assert_eq!(sg.len(), lg.len());
    let mut windows_seen = 0;
    for (s, l) in sg.iter().zip(lg) {
        assert_eq!(s["name"], l["name"]);
        let (sr, lr) = (s["rules"].as_sequence().unwrap(), l["rules"].as_sequence().unwrap());
        assert_eq!(sr.len(), lr.len());
        for (s, l) in sr.iter().zip(lr) {
            let (s, l) = (s.as_mapping().unwrap(), l.as_mapping().unwrap());
            let alert = s["alert"].as_str().unwrap();
            let keys = |m: &serde_yaml_ng::Mapping| m.keys().map(|k| k.as_str().unwrap().to_string()).collect::<Vec<_>>();
            assert_eq!(keys(s), keys(l), "{alert}: the same fields, in the same order");
            for (field, sv) in s {
                let lv = &l[field];
                let k = field.as_str().unwrap();
                match k {
                    "for" => {
                        let (shipped, lab) = (seconds(sv.as_str().unwrap()), seconds(lv.as_str().unwrap()));
                        assert_eq!(lab, lab_for(alert, shipped), "{alert}: for");
                        if alert != "RouteProgrammingErrors" {
                            assert_eq!(lab * SPEEDUP, shipped, "{alert}: for");
                        }
                    }
                    "expr" | "annotations" => {
                        let pairs: Vec<(&str, &str, bool)> = if k == "expr" {
                            vec![(sv.as_str().unwrap(), lv.as_str().unwrap(), true)]
                        } else {
                            sv.as_mapping().unwrap().iter().map(|(name, text)| (text.as_str().unwrap(), lv[name].as_str().unwrap(), false)).collect()
                        };
                        for (st, lt, is_expr) in pairs {
                            let ((s_rest, s_win), (l_rest, l_win)) = (windows(st), windows(lt));
                            assert_eq!(s_rest, l_rest, "{alert}: only the windows of {k} may differ:\n{st}\n{lt}");
                            assert_eq!(s_win.len(), l_win.len());
                            for (sw, lw) in s_win.iter().zip(&l_win) {
                                windows_seen += 1;
                                let want = if is_expr { lab_expr_window(alert, seconds(sw)) } else { lab_seconds(seconds(sw)) };
                                assert_eq!(seconds(lw), want, "{alert}: {k} window {sw}");
                                if !(is_expr && alert == "RouteProgrammingErrors") {
                                    assert_eq!(seconds(lw) * SPEEDUP, seconds(sw), "{alert}: {k} window {sw}");
                                }
                            }
                        }
                    }
                    _ => assert_eq!(sv, lv, "{alert}: {k} is not a duration and must be the shipped one"),
                }
            }
        }
    }
    // RouteFlapping 2 + 1 in its description, RouteProgrammingErrors 2 + 1, WrongPathForwarding,
    // ForwardingFlap, RouteWriterFailing, RouteMassDeletionHeld, RouteWatchDegraded (events-lost).
    assert_eq!(windows_seen, 11, "range windows rewritten");
    // The rendered file as Prometheus reads it.
    let text = serde_yaml_ng::to_string(&scaled).unwrap();
    assert!(text.contains("[40s]") && text.contains("for: 60s") && !text.contains("m]"), "{text}");
}

// ---------------------------------------------------------------------------------------------
// Prometheus, its targets, and the kube-state-metrics stand-in.

type Labels = BTreeMap<String, String>;

/// file_sd targets: one per node in `nodes`, with the labels the PodMonitor gives a pod's
/// series in a cluster (`job` from its jobLabel: the job name here; `namespace`, `pod`, `node`).
fn write_targets(path: &Path, nodes: &[&str]) {
    let targets: Vec<Json> = NODES
        .iter()
        .filter(|(n, _)| nodes.contains(n))
        .map(|(n, addr)| serde_json::json!({"targets": [format!("{addr}:{PORT}")], "labels": {"namespace": "routewarden", "pod": format!("routewarden-{n}"), "node": n}}))
        .collect();
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_string_pretty(&targets).unwrap()).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A Prometheus server in node-a's namespace: config, rules, targets and TSDB in a temp dir;
/// killed on drop, its log printed if the test is failing.
struct Prometheus {
    child: Child,
    dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(lab: &Lab) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let rules = dir.path().join("rules.yaml");
        std::fs::write(&rules, serde_yaml_ng::to_string(&lab_rules()).unwrap()).unwrap();
        let targets = dir.path().join("targets.json");
        write_targets(&targets, &NODES.map(|(n, _)| n));
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             rule_files: [{rules}]\n\
             scrape_configs:\n\
             \x20 - job_name: routewarden\n    file_sd_configs: [{{files: [{targets}], refresh_interval: 1s}}]\n\
             \x20 - job_name: kube-state-metrics\n    static_configs: [{{targets: ['127.0.0.1:{KSM_PORT}']}}]\n",
            rules = rules.display(),
            targets = targets.display()
        );
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).unwrap();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = lab
            .command(PROM_NODE, PROMETHEUS)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{PROM_PORT}"))
            // 5 minutes in lab time.
            .arg("--query.lookback-delta=10s")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut p = Prometheus { child, dir };
        let started = Instant::now();
        wait_for("Prometheus /-/ready", Duration::from_secs(20), || {
            if let Ok(Some(status)) = p.child.try_wait() {
                panic!("prometheus exited with {status}:\n{}", p.log());
            }
            matches!(lab.http_get(PROM_NODE, PROM_PORT, "/-/ready"), Ok((200, _))).then_some(())
        });
        eprintln!("prometheus ready in {:?}", started.elapsed());
        p
    }

    fn targets(&self) -> PathBuf {
        self.dir.path().join("targets.json")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(30).collect::<Vec<_>>().into_iter().rev().collect();
            eprintln!("--- prometheus log (last 30 lines) ---\n{}", tail.join("\n"));
        }
    }
}

/// kube-state-metrics stand-in: `kube_node_info` as kube-state-metrics 2 exports it, for the
/// four lab nodes and a Windows node (which has no agent and must not be reported), served on
/// node-a's loopback until dropped.
struct KubeStateMetrics {
    stop: std::sync::Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl KubeStateMetrics {
    fn start(lab: &Lab) -> KubeStateMetrics {
        let listener = lab.in_netns(PROM_NODE, || std::net::TcpListener::bind(("127.0.0.1", KSM_PORT))).unwrap().unwrap();
        listener.set_nonblocking(true).unwrap();
        let mut body = String::from("# HELP kube_node_info Information about a cluster node.\n# TYPE kube_node_info gauge\n");
        let linux = NODES.iter().map(|(n, addr)| (n.to_string(), "Debian GNU/Linux 12 (bookworm)", addr.to_string()));
        for (node, os, addr) in linux.chain([("win-e".to_string(), "Windows Server 2022 Datacenter", "10.0.0.15".to_string())]) {
            let _ = writeln!(
                body,
                "kube_node_info{{node=\"{node}\",kernel_version=\"6.1.0\",os_image=\"{os}\",container_runtime_version=\"containerd://1.7.24\",kubelet_version=\"v1.31.4\",kubeproxy_version=\"deprecated\",provider_id=\"\",pod_cidr=\"\",system_uuid=\"\",internal_ip=\"{addr}\"}} 1"
            );
        }
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut s, _)) => {
                        let _ = s.set_nonblocking(false);
                        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
                        let mut buf = [0u8; 4096];
                        let _ = s.read(&mut buf);
                        let _ = write!(s, "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n{body}", body.len());
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        KubeStateMetrics { stop, thread: Some(thread) }
    }
}

impl Drop for KubeStateMetrics {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `GET <path>` on Prometheus's API; the `data` member of a `success` answer.
fn api(lab: &Lab, path: &str) -> Option<Json> {
    let (status, body) = lab.http_get(PROM_NODE, PROM_PORT, path).ok()?;
    let v: Json = serde_json::from_str(&body).ok()?;
    (status == 200 && v["status"] == "success").then(|| v["data"].clone())
}

// ---------------------------------------------------------------------------------------------
// What Prometheus's alert list went through, polled every 250 ms for the whole run.

/// One alert (its full label set) as seen over the run.
#[derive(Clone, Debug, Default)]
struct Seen {
    /// First poll that showed it firing.
    fired_at: Option<Instant>,
    /// Times it went from not firing to firing.
    firing_episodes: u32,
    /// Firing at the last poll.
    firing: bool,
    /// Listed (pending or firing) at the last poll.
    active: bool,
    /// When it first went from listed to not listed after it fired (an agent restarted later
    /// can list it as pending again).
    resolved_at: Option<Instant>,
    /// Its value when it first fired.
    value: Option<f64>,
    /// Its annotations at the last poll that listed it firing.
    annotations: Json,
}

#[derive(Default)]
struct Timeline {
    seen: BTreeMap<Labels, Seen>,
    /// When the test removed each alert's cause.
    removed: BTreeMap<Labels, Instant>,
    polls: u64,
}

/// Set when any script fails: the others stop waiting.
static FAILED: AtomicBool = AtomicBool::new(false);

struct Alerts<'a> {
    lab: &'a Lab,
    /// The start of the test, for the times printed.
    t0: Instant,
    timeline: Mutex<Timeline>,
}

fn show(k: &Labels) -> String {
    let name = k.get("alertname").map_or("?", String::as_str);
    let rest: Vec<String> = k.iter().filter(|(l, _)| *l != "alertname").map(|(l, v)| format!("{l}={v}")).collect();
    format!("{name}{{{}}}", rest.join(","))
}

impl Alerts<'_> {
    fn poll(&self) {
        let Some(data) = api(self.lab, "/api/v1/alerts") else { return };
        let now = Instant::now();
        let at = now - self.t0;
        let mut listed: BTreeMap<Labels, (bool, Option<f64>, Json)> = BTreeMap::new();
        for a in data["alerts"].as_array().unwrap() {
            let labels: Labels = serde_json::from_value(a["labels"].clone()).unwrap();
            let value = a["value"].as_str().and_then(|v| v.parse().ok());
            listed.insert(labels, (a["state"] == "firing", value, a["annotations"].clone()));
        }
        let mut tl = self.timeline.lock().unwrap();
        tl.polls += 1;
        for (k, (firing, value, annotations)) in &listed {
            let s = tl.seen.entry(k.clone()).or_default();
            if *firing {
                if !s.firing {
                    s.firing_episodes += 1;
                    eprintln!("{at:>7.1?} firing: {} = {value:?}", show(k));
                }
                if s.fired_at.is_none() {
                    s.fired_at = Some(now);
                    s.value = *value;
                }
                s.annotations = annotations.clone();
            }
            s.firing = *firing;
            s.active = true;
        }
        for (k, s) in &mut tl.seen {
            if s.active && !listed.contains_key(k) {
                s.active = false;
                s.firing = false;
                if s.fired_at.is_some() && s.resolved_at.is_none() {
                    s.resolved_at = Some(now);
                }
                eprintln!("{at:>7.1?} {}: {}", if s.fired_at.is_some() { "resolved" } else { "no longer pending" }, show(k));
            }
        }
    }

    /// Wait until every alert of `keys` has fired (panic after `timeout`, or when another
    /// script failed).
    fn wait_firing(&self, keys: &[Labels], timeout: Duration) {
        let started = Instant::now();
        self.wait(&format!("firing: {}", keys.iter().map(show).collect::<Vec<_>>().join(", ")), timeout, |tl| {
            keys.iter().all(|k| tl.seen.get(k).is_some_and(|s| s.fired_at.is_some()))
        });
        eprintln!("{} firing after {:?}", keys.iter().map(show).collect::<Vec<_>>().join(", "), started.elapsed());
    }

    /// Wait until every alert of `keys` has fired and is no longer listed.
    fn wait_resolved(&self, keys: &[Labels], timeout: Duration) {
        self.wait(&format!("resolved: {}", keys.iter().map(show).collect::<Vec<_>>().join(", ")), timeout, |tl| {
            keys.iter().all(|k| tl.seen.get(k).is_some_and(|s| s.fired_at.is_some() && !s.active))
        });
    }

    fn wait(&self, what: &str, timeout: Duration, done: impl Fn(&Timeline) -> bool) {
        let deadline = Instant::now() + timeout;
        loop {
            if done(&self.timeline.lock().unwrap()) {
                return;
            }
            assert!(!FAILED.load(Ordering::Relaxed), "stopped waiting for {what}: another part of the test failed");
            if Instant::now() > deadline {
                let tl = self.timeline.lock().unwrap();
                let listed: Vec<String> = tl
                    .seen
                    .iter()
                    .filter(|(_, s)| s.active)
                    .map(|(k, s)| format!("{} ({})", show(k), if s.fired_at.is_some() { "fired" } else { "pending" }))
                    .collect();
                panic!("timed out after {timeout:?} waiting for {what}; listed now: {listed:#?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The causes of `keys` are gone from now on.
    fn cause_removed(&self, keys: &[Labels]) {
        let now = Instant::now();
        let mut tl = self.timeline.lock().unwrap();
        for k in keys {
            tl.removed.insert(k.clone(), now);
        }
    }
}

/// An alert's labels: `alertname` and `labels`.
fn alert(name: &str, labels: &[(&str, &str)]) -> Labels {
    let mut l: Labels = labels.iter().map(|(k, v)| ((*k).to_string(), (*v).to_string())).collect();
    l.insert("alertname".into(), name.into());
    l
}

/// An alert of the agent on `node` (the rules aggregate by namespace, pod, node).
fn node_alert(name: &str, node: &str, labels: &[(&str, &str)]) -> Labels {
    let mut l = alert(name, labels);
    l.insert("namespace".into(), "routewarden".into());
    l.insert("pod".into(), format!("routewarden-{node}"));
    l.insert("node".into(), node.into());
    l
}

// ---------------------------------------------------------------------------------------------
// The nodes and what the test does on each.

struct Node {
    name: &'static str,
    dir: tempfile::TempDir,
    log: PathBuf,
    agent: Mutex<Option<Agent>>,
}

impl Node {
    fn start(&self, lab: &Lab, extra: &[&str]) {
        let mut flags: Vec<&str> = LAB_TIMING.to_vec();
        flags.extend(extra);
        let agent = Agent::spawn(lab, self.name, self.dir.path(), &format!("0.0.0.0:{PORT}"), &flags, Some(&self.log));
        *self.agent.lock().unwrap() = Some(agent);
        wait_ready(lab, self.name);
    }

    fn stop(&self) {
        if let Some(a) = self.agent.lock().unwrap().take() {
            a.stop();
        }
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Replace `name` atomically (write + rename), as an editor or a ConfigMap update does.
    fn write(&self, name: &str, text: &str) {
        let tmp = self.file(&format!(".{name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.file(name)).unwrap();
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.file(name)).unwrap()
    }

    /// `calico.yaml` with BGPConfiguration `programClusterRoutes` set to `value`.
    fn set_bgp_program_cluster_routes(&self, value: &str) {
        let text = self.read("calico.yaml");
        let (head, tail) = text.split_once("kind: BGPConfiguration").unwrap();
        let old = "programClusterRoutes: EnabledNoEncapOnly";
        assert!(tail.contains(old), "{tail}");
        self.write("calico.yaml", &format!("{head}kind: BGPConfiguration{}", tail.replacen(old, &format!("programClusterRoutes: {value}"), 1)));
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(20).collect::<Vec<_>>().into_iter().rev().collect();
        tail.join("\n")
    }
}

/// Datagrams from `node` to `to:9` every 10 ms until `stop`.
fn traffic(lab: &Lab, node: &str, to: &str, stop: &AtomicBool) -> u64 {
    let sock = lab.in_netns(node, || std::net::UdpSocket::bind("0.0.0.0:0")).unwrap().unwrap();
    let mut sent = 0;
    while !stop.load(Ordering::Relaxed) {
        let _ = sock.send_to(&[0u8; 64], (to, 9));
        sent += 1;
        std::thread::sleep(Duration::from_millis(10));
    }
    sent
}

/// Run `cause` with `background` running beside it until `cause` returns or fails.
fn with_background<T>(background: &[&(dyn Fn(&AtomicBool) + Sync)], cause: impl FnOnce() -> T) -> T {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for b in background {
            let stop = &stop;
            s.spawn(move || b(stop));
        }
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(cause));
        stop.store(true, Ordering::Relaxed);
        r.unwrap_or_else(|e| std::panic::resume_unwind(e))
    })
}

const WAIT: Duration = Duration::from_mins(1);

/// node-a: a fight over node-b's CrossSubnet block with traffic; a mass deletion; its Node gone.
fn node_a(lab: &Lab, alerts: &Alerts, n: &Node) {
    // The block's route is ours through eth0; a BIRD-protocol route through tunl0 is a BIRD
    // leftover routewarden claims (it programs IPIP, BIRD does not), so it writes its own back.
    let ours = "10.244.20.0/26 via 10.0.0.12 dev eth0 proto 80 metric 1024 onlink";
    let show_block = || lab.ip("node-a", &["route", "show", "10.244.20.0/26"]).unwrap().trim().to_string();
    assert_eq!(show_block(), ours);
    // tunl0's stand-in has nobody to answer ARP: a permanent neighbour lets packets leave.
    lab.ip("node-a", &["neigh", "replace", "10.0.0.12", "lladdr", "02:00:00:00:00:12", "dev", "tunl0", "nud", "permanent"]).unwrap();
    let fight = [
        node_alert("RouteFlapping", "node-a", &[("severity", "warning")]),
        node_alert("ForwardingFlap", "node-a", &[("severity", "critical"), ("pool", "default-ipv4-ippool")]),
        node_alert("WrongPathForwarding", "node-a", &[("severity", "critical"), ("pool", "default-ipv4-ippool"), ("expected", "host"), ("actual", "tunnel")]),
    ];
    let writes = std::sync::atomic::AtomicU32::new(0);
    // BIRD-like: `ip` run as `bird` (the watch classes a writer by its process).
    let bird_ip = routewarden_lab::program_named("ip", "bird");
    let bird = |stop: &AtomicBool| {
        while !stop.load(Ordering::Relaxed) {
            let st = lab
                .command("node-a", &bird_ip.display().to_string())
                .args(["route", "replace", "10.244.20.0/26", "via", "10.0.0.12", "dev", "tunl0", "onlink", "metric", "1024", "proto", "bird"])
                .status()
                .unwrap();
            assert!(st.success(), "the BIRD-like writer failed: {st}");
            writes.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let send = |stop: &AtomicBool| {
        traffic(lab, "node-a", "10.244.20.9", stop);
    };
    with_background(&[&bird, &send], || {
        alerts.wait_firing(&fight, WAIT);
        // The description is rendered at every evaluation; once the conflict counter has been
        // scraped it names the writer pair.
        let want = "The route watch on node node-a sees cluster routes rewritten over and over. Prefixes in flap or conflict now: 1. \
                    Writer pairs in conflict in the last 10 minutes: self+bird. Writer classes are the writing processes (felix is calico-node, \
                    bird is BIRD, other any other program, whatever protocol the route has). Run `routewarden events` on the node to see the \
                    prefixes and processes.";
        alerts.wait("RouteFlapping's description to name self+bird", WAIT, |tl| tl.seen[&fight[0]].annotations["description"] == want);
    });
    alerts.cause_removed(&fight);
    eprintln!("node-a: the BIRD-protocol writer wrote {} times", writes.load(Ordering::Relaxed));
    wait_for("node-a: routewarden's route for 10.244.20.0/26 back", Duration::from_secs(10), || (show_block() == ours).then_some(()));
    let m = metrics(lab, "node-a");
    assert!(m.value(r#"routewarden_route_conflicts_total{family="ipv4",writers="self+bird"}"#) >= 3, "{m}");

    // The whole IPAM file emptied on purpose: every route of node-a would go at once.
    let mass = [node_alert("RouteMassDeletionHeld", "node-a", &[("severity", "warning")])];
    let ipam = n.read("ipam.yaml");
    n.write("ipam.yaml", "apiVersion: v1\nkind: List\nitems: []\n");
    alerts.wait_firing(&mass, WAIT);
    // The breaker holds each delete until it has stayed wanted for the settle period (1 s
    // here), then lets it go: restored only after that, so the restore is what brings the
    // routes back (restored earlier, a restore the agent has not read yet races the release).
    wait_for("node-a: the held deletion goes out after the settle period", Duration::from_secs(10), || routes(lab, "node-a", "80").is_empty().then_some(()));
    alerts.cause_removed(&mass);
    n.write("ipam.yaml", &ipam);
    wait_for("node-a: its routes back after the IPAM file is restored", Duration::from_secs(10), || (routes(lab, "node-a", "80") == NODE_A_IPIP).then_some(()));
    let m = metrics(lab, "node-a");
    assert_eq!(m.value("routewarden_mass_deletion_holds_total"), 1, "{m}");

    // node-a's own Node deleted: the view is not current until it is back.
    let not_synced = [node_alert("RoutewardenDatastoreNotSynced", "node-a", &[("severity", "warning")])];
    let calico = n.read("calico.yaml");
    let docs: Vec<&str> = calico.split("\n---\n").filter(|d| !d.contains("kind: Node\nmetadata: {name: node-a}")).collect();
    assert_eq!(docs.len(), calico.split("\n---\n").count() - 1, "node-a's Node in calico.yaml");
    n.write("calico.yaml", &docs.join("\n---\n"));
    wait_for("node-a: datastore not synced", Duration::from_secs(10), || metrics(lab, "node-a").is("routewarden_datastore_synced", 0).then_some(()));
    alerts.wait_firing(&not_synced, WAIT);
    // Nothing is deleted while the view is not current. (Without its own Node the agent does
    // not know node-a's subnet, so CrossSubnet routes may move to the tunnel meanwhile.)
    let prefixes = |rs: &[String]| rs.iter().map(|r| r.split(" via ").next().unwrap().to_string()).collect::<Vec<_>>();
    let want: Vec<String> = NODE_A_IPIP.iter().map(ToString::to_string).collect();
    assert_eq!(prefixes(&routes(lab, "node-a", "80")), prefixes(&want), "no route of node-a deleted while its Node is missing");
    alerts.cause_removed(&not_synced);
    n.write("calico.yaml", &calico);
    wait_for("node-a: datastore synced again", Duration::from_secs(10), || metrics(lab, "node-a").is("routewarden_datastore_synced", 1).then_some(()));
    wait_for("node-a: its routes as before the Node was deleted", Duration::from_secs(10), || (routes(lab, "node-a", "80") == NODE_A_IPIP).then_some(()));
}

/// node-b: a foreign route held at our key with traffic through it; an invalid IP pool; BIRD
/// told to program IPIP too.
fn node_b(lab: &Lab, alerts: &Alerts, n: &Node) {
    let held = [
        node_alert("RoutesHeldByOtherWriter", "node-b", &[("severity", "warning"), ("family", "ipv4"), ("class", "ipip")]),
        node_alert("WrongPathForwarding", "node-b", &[("severity", "critical"), ("pool", "ipip-always"), ("expected", "tunnel"), ("actual", "host")]),
        node_alert("RoutewardenInvalidInput", "node-b", &[("severity", "warning")]),
        alert("RouteOwnershipConflict", &[("severity", "warning"), ("namespace", "routewarden"), ("code", "double-programmed"), ("class", "ipip")]),
    ];
    let ours = "10.245.40.0/26 via 10.0.1.14 dev tunl0 proto 80 metric 1024 onlink";
    let show_block = || lab.ip("node-b", &["route", "show", "10.245.40.0/26"]).unwrap().trim().to_string();
    assert_eq!(show_block(), ours);
    // Another writer replaces our route to node-d's ipip-always block at its key, natively.
    lab.ip("node-b", &["route", "replace", "10.245.40.0/26", "via", "10.0.1.14", "dev", "eth0", "onlink", "metric", "1024", "proto", "static"]).unwrap();
    let pool = "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: extra}\nspec: {cidr: CIDR, ipipMode: Never, vxlanMode: Never}\n";
    n.write("extra-pool.yaml", &pool.replace("CIDR", "10.99.1.0/16"));
    n.set_bgp_program_cluster_routes("Enabled");
    let send = |stop: &AtomicBool| {
        traffic(lab, "node-b", "10.245.40.9", stop);
    };
    // The held route goes as soon as its two alerts fire: every retry of the held key is a
    // failed write (kind="foreign-route-at-key"), so RouteProgrammingErrors on node-b is
    // pending meanwhile; its errors leave its 40 s window before its 60 s `for:` (the hold
    // lasts about 11 s: both alerts hold for 10 s).
    with_background(&[&send], || alerts.wait_firing(&held[..2], WAIT));
    let m = metrics(lab, "node-b");
    assert_eq!(m.value(r#"routewarden_routes{family="ipv4",class="ipip",state="held"}"#), 1, "{m}");
    assert_eq!(show_block(), "10.245.40.0/26 via 10.0.1.14 dev eth0 proto static metric 1024 onlink", "routewarden never overwrites the held route");
    alerts.cause_removed(&held[..2]);
    lab.ip("node-b", &["route", "del", "10.245.40.0/26", "proto", "static", "metric", "1024"]).unwrap();
    wait_for("node-b: routewarden's route to node-d's block back", Duration::from_secs(10), || (show_block() == ours).then_some(()));
    alerts.wait_firing(&held[2..], WAIT);
    alerts.cause_removed(&held[2..]);
    n.write("extra-pool.yaml", &pool.replace("CIDR", "10.99.0.0/16"));
    n.set_bgp_back();
}

/// node-c: its tunnel device deleted, then recreated.
fn node_c(lab: &Lab, alerts: &Alerts) {
    let broken = [
        node_alert("RouteProgrammingErrors", "node-c", &[("severity", "warning")]),
        node_alert("RouteDrift", "node-c", &[("severity", "critical"), ("family", "ipv4"), ("class", "ipip")]),
    ];
    let before = routes(lab, "node-c", "80");
    assert_eq!(before.iter().filter(|r| r.contains(" dev tunl0 ")).count(), 3, "{before:#?}");
    lab.ip("node-c", &["link", "del", "tunl0"]).unwrap();
    alerts.wait_firing(&broken, Duration::from_mins(2));
    let m = metrics(lab, "node-c");
    assert!(m.value(r#"routewarden_netlink_errors_total{op="apply",kind="no-device"}"#) > 0, "{m}");
    // The lab's stand-in again: a veth pair, both ends up.
    alerts.cause_removed(&broken);
    lab.ip("node-c", &["link", "add", "tunl0", "type", "veth", "peer", "name", "tunpeer"]).unwrap();
    lab.ip("node-c", &["link", "set", "tunpeer", "up"]).unwrap();
    lab.ip("node-c", &["link", "set", "tunl0", "up"]).unwrap();
    wait_for("node-c: its tunnel routes back", Duration::from_secs(10), || (routes(lab, "node-c", "80") == before).then_some(()));
}

/// One round of the route storm: two `ip -batch` writers at once (10.246.100.0 and up, in the
/// `flat` pool, and 10.247.100.0 and up, in the `vxlan` pool: conflicts and flaps are judged
/// only inside the IP pools), each writing `count` /32 routes through `lo` three times, by
/// route protocol 20, 21, then 20 again: every prefix enters conflict (two writers within the
/// window) and flap (three changes), one ring-buffer record each. Two writers, so that the
/// records come faster than one agent drains them on a 2-core machine whatever the agent's
/// own speed (one writer alone was not always enough).
fn storm_round(lab: &Lab, dir: &Path, count: u32) {
    let children: Vec<Child> = [246, 247]
        .into_iter()
        .map(|net| {
            let path = dir.join(format!("storm-{net}.batch"));
            let mut text = String::new();
            for proto in [20, 21, 20] {
                for i in 0..count {
                    let _ = writeln!(text, "route replace 10.{net}.{}.{}/32 dev lo proto {proto}", 100 + i / 250, i % 250 + 1);
                }
            }
            std::fs::write(&path, text).unwrap();
            lab.command("node-d", "ip").args(["-batch", path.to_str().unwrap()]).stdout(Stdio::null()).spawn().unwrap()
        })
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success(), "ip -batch of the route storm failed");
    }
}

/// node-d: nobody programs no-encap; a route storm; the agent without a route-watch backend;
/// then its pod evicted until phase 2 brings every agent back (`targets`: Prometheus's
/// file_sd file).
fn node_d(lab: &Lab, alerts: &Alerts, n: &Node, targets: &Path) {
    let storm = [
        alert("RouteOwnershipConflict", &[("severity", "critical"), ("namespace", "routewarden"), ("code", "unowned"), ("class", "noencap")]),
        node_alert("RouteWatchDegraded", "node-d", &[("severity", "warning"), ("reason", "events-lost")]),
        node_alert("RouteFlapping", "node-d", &[("severity", "warning")]),
    ];
    n.set_bgp_program_cluster_routes("Disabled");
    // Rounds 1.5 s apart (more than the 1 s window, so each round is new episodes): 24,000
    // records per round from two writers within a few hundred milliseconds; the 256 KiB ring
    // buffer holds about 2,300.
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let lost = || metrics(lab, "node-d").at_least("routewarden_route_watch_events_lost_total", 1);
    let mut rounds = 0;
    // At least four rounds; more (up to twelve) while the loss has not shown, so the test
    // depends on the ring buffer overflowing, not on how fast this machine runs the agent.
    while rounds < 4 || (rounds < 12 && !lost()) {
        storm_round(lab, dir.path(), 6_000);
        std::thread::sleep(Duration::from_millis(1500));
        rounds += 1;
    }
    eprintln!("node-d: route storm of {rounds} x 2 x 3 x 6,000 writes in {:?}", started.elapsed());
    alerts.cause_removed(&storm[1..]);
    // The agent reads the watch's counters between batches of records: the loss shows once
    // it has worked through the records that did fit.
    wait_for("node-d: ring-buffer records lost in the storm", Duration::from_secs(30), || lost().then_some(()));
    alerts.wait_firing(&storm, WAIT);
    alerts.cause_removed(&storm[..1]);
    n.set_bgp_back();
    alerts.wait_resolved(&storm, WAIT);

    // Restarted with a backend this kernel cannot load (this host's kernel allows only the
    // socket filter, see DESIGN.md "Route watch"): no route watch at all.
    let degraded = [
        node_alert("RouteWatchDegraded", "node-d", &[("severity", "warning"), ("reason", "no-backend")]),
        node_alert("RouteWatchDegraded", "node-d", &[("severity", "warning"), ("reason", "program-detached"), ("program", "route_watch")]),
    ];
    n.stop();
    n.start(lab, &["--route-watch-backend", "fentry"]);
    let m = metrics(lab, "node-d");
    assert_eq!(
        m.value(r#"routewarden_route_watch_backend_info{backend="none"}"#),
        1,
        "this kernel loaded fentry: the no-backend cause needs another backend that cannot load\n{m}"
    );
    assert_eq!(m.value(r#"routewarden_bpf_program_attached{program="route_watch"}"#), 0, "{m}");
    alerts.wait_firing(&degraded, WAIT);
    // Stopping the agent removes the cause (its series go); the restart brings them back healthy.
    alerts.cause_removed(&degraded);
    n.stop();
    n.start(lab, &[]);
    alerts.wait_resolved(&degraded, WAIT);

    // Restarted in table 48 with no ip rule selecting it: its routes carry no traffic. The
    // rule the rollout would add removes the cause.
    let unselected = [node_alert("RouteTableNotSelected", "node-d", &[("severity", "critical"), ("family", "ipv4"), ("table", "48")])];
    n.stop();
    n.start(lab, &["--route-table", "48"]);
    alerts.wait_firing(&unselected, WAIT);
    alerts.cause_removed(&unselected);
    lab.ip("node-d", &["-4", "rule", "add", "from", "all", "lookup", "48", "priority", "100"]).unwrap();
    alerts.wait_resolved(&unselected, WAIT);

    // Its pod evicted: no agent, and no target for it any more (kube-state-metrics still lists
    // the node). Phase 2 waits for its alert, with the others of every agent gone.
    write_targets(targets, &["node-a", "node-b", "node-c"]);
    n.stop();
}

impl Node {
    /// BGPConfiguration `programClusterRoutes` back to the example's `EnabledNoEncapOnly`.
    fn set_bgp_back(&self) {
        let text = self.read("calico.yaml");
        let (head, tail) = text.split_once("kind: BGPConfiguration").unwrap();
        let start = tail.find("programClusterRoutes: ").unwrap() + "programClusterRoutes: ".len();
        let end = start + tail[start..].find('\n').unwrap_or(tail.len() - start);
        self.write("calico.yaml", &format!("{head}kind: BGPConfiguration{}EnabledNoEncapOnly{}", &tail[..start], &tail[end..]));
    }
}

/// The summary each alert renders (hand-written from the templates).
fn expected_summary(k: &Labels) -> String {
    let l = |name: &str| k.get(name).cloned().unwrap_or_default();
    let node = l("node");
    match k["alertname"].as_str() {
        "RouteFlapping" => format!("Cluster routes on {node} are flapping between writers."),
        "RouteOwnershipConflict" if l("code") == "unowned" => format!("No component programs {} cluster routes on 1 node(s).", l("class")),
        "RouteOwnershipConflict" => format!("Two components program {} cluster routes on 1 node(s).", l("class")),
        "RouteProgrammingErrors" => format!("routewarden keeps failing to write routes on {node}."),
        "RouteDrift" => format!("{} {} cluster routes on {node} differ from what they should be.", l("class"), l("family")),
        "RoutesHeldByOtherWriter" => format!("1 {} {} cluster routes on {node} are held by another writer.", l("family"), l("class")),
        "RouteMassDeletionHeld" => format!("routewarden on {node} held a mass deletion of its routes."),
        "RouteTableNotSelected" => format!("No ip rule selects routing table {} for {} on {node}.", l("table"), l("family")),
        "RoutewardenInvalidInput" => format!("routewarden on {node} reads 1 invalid datastore inputs or objects."),
        "WrongPathForwarding" => format!("Pod traffic for pool {} leaves {node} on the wrong path.", l("pool")),
        "ForwardingFlap" => format!("Pod traffic for pool {} on {node} keeps flipping between paths.", l("pool")),
        "RouteWatchDegraded" => match l("reason").as_str() {
            "program-detached" => format!("BPF program {} is not attached on {node}.", l("program")),
            "no-backend" => format!("No route-watch backend could attach on {node}."),
            _ => format!("The route watch on {node} is losing events."),
        },
        "RoutewardenDatastoreNotSynced" => format!("routewarden on {node} has no current view of the cluster."),
        "RoutewardenDown" => match l("reason").as_str() {
            "scrape-failing" => format!("routewarden on {node} cannot be scraped."),
            "no-agent-reporting" => "No routewarden agent is reporting metrics.".to_string(),
            _ => format!("Node {node} has no routewarden agent."),
        },
        other => panic!("no expected summary for {other}"),
    }
}

#[test]
#[allow(clippy::too_many_lines, reason = "one run, in the order it happens")]
fn every_alert_fires_and_resolves_through_prometheus() {
    const TEST: &str = "every_alert_fires_and_resolves_through_prometheus";
    if skip_unless_root(TEST) || skip_without_prometheus(TEST) {
        return;
    }
    if routewarden::bpf::embedded_object().is_none() {
        routewarden_lab::skip(TEST, format_args!("built without the BPF object; `cargo xtask test` embeds it"));
        return;
    }
    let started = Instant::now();
    // Declared in this order so they drop in reverse: Prometheus, agents, then the namespaces.
    let lab = lab();
    let logs = tempfile::tempdir().unwrap();
    let nodes: Vec<Node> =
        NODES.iter().map(|(name, _)| Node { name, dir: copy_examples(), log: logs.path().join(format!("{name}.log")), agent: Mutex::new(None) }).collect();
    for n in &nodes {
        n.start(&lab, &[]);
    }
    let _ksm = KubeStateMetrics::start(&lab);
    let prom = Prometheus::start(&lab);
    wait_for("Prometheus to scrape every target (up == 1)", Duration::from_secs(20), || {
        let data = api(&lab, "/api/v1/query?query=up")?;
        let up: Vec<&Json> = data["result"].as_array()?.iter().filter(|s| s["value"][1] == "1").collect();
        (up.len() == 5).then_some(())
    });
    let alerts = Alerts { lab: &lab, t0: started, timeline: Mutex::new(Timeline::default()) };
    let stop_polling = AtomicBool::new(false);
    let result = std::thread::scope(|s| {
        s.spawn(|| {
            while !stop_polling.load(Ordering::Relaxed) {
                alerts.poll();
                std::thread::sleep(Duration::from_millis(250));
            }
        });
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // Nothing is wrong yet. (Prometheus evaluates its rules before the first scrapes are
            // stored, so `absent(routewarden_build_info)` can be pending for a moment at start.)
            alerts.wait("no alert listed at start", Duration::from_secs(10), |tl| tl.polls >= 2 && tl.seen.values().all(|s| !s.active));
            let listed: Vec<String> = alerts.timeline.lock().unwrap().seen.keys().map(show).collect();
            eprintln!("listed while Prometheus started: {listed:?}");
            alerts.timeline.lock().unwrap().seen.clear();
            let polls = alerts.timeline.lock().unwrap().polls;
            alerts.wait("two more polls", Duration::from_secs(10), |tl| tl.polls >= polls + 2);
            let listed: Vec<String> = alerts.timeline.lock().unwrap().seen.keys().map(show).collect();
            assert!(listed.is_empty(), "alerts before any cause: {listed:#?}");

            // Phase 1: a script per node, at the same time.
            let phase1 = Instant::now();
            let targets = prom.targets();
            std::thread::scope(|s| {
                let guard = |f: &(dyn Fn() + Sync)| {
                    if let Err(e) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
                        FAILED.store(true, Ordering::Relaxed);
                        std::panic::resume_unwind(e);
                    }
                };
                let (a, b, d) = (&nodes[0], &nodes[1], &nodes[3]);
                let (lab, alerts, targets) = (&lab, &alerts, targets.as_path());
                let scripts: [Box<dyn Fn() + Send + Sync + '_>; 4] = [
                    Box::new(move || node_a(lab, alerts, a)),
                    Box::new(move || node_b(lab, alerts, b)),
                    Box::new(move || node_c(lab, alerts)),
                    Box::new(move || node_d(lab, alerts, d, targets)),
                ];
                let handles: Vec<_> = scripts.into_iter().map(|f| s.spawn(move || guard(&*f))).collect();
                for h in handles {
                    if let Err(e) = h.join() {
                        std::panic::resume_unwind(e);
                    }
                }
            });
            // Every alert of phase 1 resolved, but RouteProgrammingErrors: it resolves once its
            // last error has left its 40 s window, which phase 2 does not change (its range
            // keeps the samples of a stopped agent); the end of the run waits for it.
            let phase1_keys: Vec<Labels> =
                alerts.timeline.lock().unwrap().removed.keys().filter(|k| k["alertname"] != "RouteProgrammingErrors").cloned().collect();
            alerts.wait_resolved(&phase1_keys, WAIT);
            eprintln!("phase 1 (every alert but RoutewardenDown) fired and resolved in {:?}", phase1.elapsed());

            // Phase 2: node-d's pod is evicted (since the end of its script), and every other
            // agent stops: their pods exist (their targets stay) but cannot be scraped, and no
            // agent reports at all.
            let phase2 = Instant::now();
            let mut gone: Vec<Labels> = NODES[..3]
                .iter()
                .map(|(node, addr)| {
                    let mut l = node_alert("RoutewardenDown", node, &[("severity", "critical"), ("reason", "scrape-failing"), ("job", "routewarden")]);
                    l.insert("instance".into(), format!("{addr}:{PORT}"));
                    l
                })
                .collect();
            gone.push(alert("RoutewardenDown", &[("severity", "critical"), ("reason", "no-agent-reporting"), ("job", "routewarden")]));
            gone.push(alert("RoutewardenDown", &[("severity", "critical"), ("reason", "node-without-agent"), ("node", "node-d")]));
            for n in &nodes {
                n.stop();
            }
            alerts.wait_firing(&gone, WAIT);
            alerts.cause_removed(&gone);
            write_targets(&targets, &NODES.map(|(n, _)| n));
            for n in &nodes {
                n.start(&lab, &[]);
            }
            alerts.wait_resolved(&gone, WAIT);
            eprintln!("phase 2 (RoutewardenDown) fired and resolved in {:?}", phase2.elapsed());
            alerts.wait("no alert listed", WAIT, |tl| tl.seen.values().all(|s| !s.active));
        }));
        stop_polling.store(true, Ordering::Relaxed);
        r
    });
    if let Err(e) = result {
        for n in &nodes {
            eprintln!("--- {} agent log (last 20 lines) ---\n{}", n.name, n.log_tail());
        }
        std::panic::resume_unwind(e);
    }

    // What Prometheus went through, alert by alert.
    let tl = alerts.timeline.into_inner().unwrap();
    let fired: BTreeSet<Labels> = tl.seen.iter().filter(|(_, s)| s.fired_at.is_some()).map(|(k, _)| k.clone()).collect();
    let caused: BTreeSet<Labels> = tl.removed.keys().cloned().collect();
    let pending_only: Vec<String> = tl.seen.iter().filter(|(_, s)| s.fired_at.is_none()).map(|(k, _)| show(k)).collect();
    eprintln!("pending but never fired (hold times not reached): {pending_only:#?}");
    assert_eq!(fired.iter().map(show).collect::<Vec<_>>(), caused.iter().map(show).collect::<Vec<_>>(), "the alerts that fired are exactly those caused");
    // Every rule of the shipped file fired at least once: (alert, routing labels) of each rule
    // are in some alert that fired.
    for (name, labels) in rule_identities(&shipped_rules()) {
        if let Some((_, why)) = NOT_CAUSED_HERE.iter().find(|(n, _)| *n == name) {
            eprintln!("rule {name} not caused in this lab: {why}");
            continue;
        }
        assert!(fired.iter().any(|k| k["alertname"] == name && labels.iter().all(|(l, v)| k.get(l) == Some(v))), "rule {name} {labels:?} never fired");
    }
    let values: BTreeMap<&str, f64> = [
        ("RouteDrift", 3.0),
        ("RoutesHeldByOtherWriter", 1.0),
        ("RouteOwnershipConflict", 1.0),
        ("RoutewardenInvalidInput", 1.0),
        ("RoutewardenDatastoreNotSynced", 0.0),
        ("RoutewardenDown", 0.0),
    ]
    .into_iter()
    .collect();
    for k in &fired {
        let s = &tl.seen[k];
        let name = k["alertname"].as_str();
        assert_eq!(s.firing_episodes, 1, "{}: fired once, no flicker", show(k));
        assert!(!s.active, "{}", show(k));
        let (fired_at, resolved_at, removed_at) = (s.fired_at.unwrap(), s.resolved_at.unwrap(), tl.removed[k]);
        assert!(resolved_at > removed_at, "{}: resolved {:?} before its cause was removed", show(k), removed_at - resolved_at);
        assert_eq!(s.annotations["summary"], expected_summary(k), "{}", show(k));
        let runbook = format!("https://github.com/routewarden/routewarden/blob/main/docs/runbooks.md#{}", name.to_lowercase());
        assert_eq!(s.annotations["runbook_url"], runbook.as_str(), "{}", show(k));
        if let Some(v) = values.get(name) {
            let v = if name == "RoutewardenDown" && k["reason"] != "scrape-failing" { 1.0 } else { *v };
            assert_eq!(s.value, Some(v), "{}: value", show(k));
        }
        // Held for 10 minutes after one engagement (20 s here): the alert stays that long.
        if name == "RouteMassDeletionHeld" || k.get("reason").is_some_and(|r| r == "events-lost") {
            assert!(resolved_at - fired_at >= Duration::from_secs(15), "{}: resolved {:?} after it fired", show(k), resolved_at - fired_at);
        }
        eprintln!(
            "{}: fired at {:.1?}, cause removed at {:.1?}, resolved {:.1?} later",
            show(k),
            fired_at - started,
            removed_at - started,
            resolved_at - removed_at
        );
    }
    assert_eq!(fired.len(), 22);
    drop(prom);
    eprintln!("{TEST}: {:?}", started.elapsed());
}
