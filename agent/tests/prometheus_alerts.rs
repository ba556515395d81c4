//! The shipped alerts end to end (issue 8): a real Prometheus server (Debian package
//! `prometheus`) runs inside a lab node namespace next to the agent, scrapes it, evaluates the
//! rules of deploy/prometheusrule.yaml, and the alert becomes `firing` through Prometheus's HTTP
//! API while a conflict is induced, then resolves once it stops.
//!
//! Only the hold times are shortened (see [`write_rules`]); the expressions are the shipped ones.
//! Everything runs in the lab's namespaces: Prometheus listens on the node namespace's loopback.

mod lab_support;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lab_support::{copy_examples, example_dir, lab, metrics, wait_for, wait_ready, Agent, PORT};
use routewarden_lab::{skip_unless_root, Lab};
use serde_json::Value as Json;
use serde_yaml_ng::Value;

const PROMETHEUS: &str = "/usr/bin/prometheus";
/// Prometheus's port on the node namespace's loopback.
const PROM_PORT: u16 = 9090;
const NODE: &str = "node-a";

fn skip_without_prometheus(test: &str) -> bool {
    if Path::new(PROMETHEUS).exists() {
        false
    } else {
        eprintln!("SKIPPED {test}: {PROMETHEUS} missing (Debian package `prometheus`; `cargo xtask setup` lists it in TEST_APT_PACKAGES)");
        true
    }
}

/// The rule groups of deploy/prometheusrule.yaml as a plain rules file (as
/// tests/tests/deploy_manifests.rs extracts them for promtool), with test-speed timings for
/// the alerts under test. Each rewrite is asserted to apply, so a change of the shipped rule
/// that makes it stale fails here instead of silently testing something else.
fn write_rules(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheusrule.yaml")).unwrap();
    let mut doc: Value = serde_yaml_ng::from_str(&text).unwrap();
    let mut spec = doc.get_mut("spec").expect("PrometheusRule has a spec").clone();
    let (mut flapping, mut ownership) = (0, 0);
    for group in spec["groups"].as_sequence_mut().unwrap() {
        for rule in group["rules"].as_sequence_mut().unwrap() {
            let rule = rule.as_mapping_mut().unwrap();
            match rule.get("alert").and_then(Value::as_str) {
                Some("RouteFlapping") => {
                    flapping += 1;
                    // `for: 2m` -> `for: 2s`: two 1 s evaluations instead of two minutes.
                    rule.insert("for".into(), "2s".into());
                    // `changes(...[10m]) >= 3` -> `[8s]`: the slow-fight arms would hold the
                    // alert for 10 minutes after the last flap; 8 s still spans >= 3 of the
                    // 1 s scrapes, so the arms keep their meaning ("moved at 3 scrapes").
                    let expr = rule["expr"].as_str().unwrap();
                    assert_eq!(expr.matches("[10m]").count(), 2, "RouteFlapping expr changed: {expr}");
                    let expr = expr.replace("[10m]", "[8s]");
                    rule.insert("expr".into(), expr.into());
                }
                Some("RouteOwnershipConflict") => {
                    ownership += 1;
                    // `for: 3m` (unowned) and `for: 5m` (double-programmed) -> `for: 2s`. The
                    // expression is an instant gauge, so it resolves at the next evaluation.
                    rule.insert("for".into(), "2s".into());
                }
                _ => {}
            }
        }
    }
    assert_eq!((flapping, ownership), (1, 2), "alerts under test not found in deploy/prometheusrule.yaml");
    let path = dir.join("rules.yaml");
    std::fs::write(&path, serde_yaml_ng::to_string(&spec).unwrap()).unwrap();
    path
}

/// A Prometheus server in `node`'s namespace: config, rules and TSDB in a temp dir; killed on
/// drop, its log printed if the test is failing.
struct Prometheus {
    child: Child,
    dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(lab: &Lab, node: &str) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let rules = write_rules(dir.path());
        // Labels the PodMonitor adds in a cluster: `job` from its jobLabel (the job name here),
        // and `namespace`/`pod`/`node` that every rule aggregates by.
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             rule_files: [{rules}]\n\
             scrape_configs:\n  - job_name: routewarden\n    static_configs:\n      - targets: ['127.0.0.1:{PORT}']\n        \
             labels: {{namespace: routewarden, pod: routewarden-{node}, node: {node}}}\n",
            rules = rules.display()
        );
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).unwrap();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = lab
            .command(node, PROMETHEUS)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{PROM_PORT}"))
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
            matches!(lab.http_get(node, PROM_PORT, "/-/ready"), Ok((200, _))).then_some(())
        });
        eprintln!("prometheus ready in {:?}", started.elapsed());
        p
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

/// `GET <path>` on Prometheus's API; the `data` member of a `success` answer.
fn api(lab: &Lab, path: &str) -> Option<Json> {
    let (status, body) = lab.http_get(NODE, PROM_PORT, path).ok()?;
    let v: Json = serde_json::from_str(&body).ok()?;
    (status == 200 && v["status"] == "success").then(|| v["data"].clone())
}

/// Active (pending or firing) alerts named `name`, from `GET /api/v1/alerts`.
fn alerts(lab: &Lab, name: &str) -> Vec<Json> {
    let data = api(lab, "/api/v1/alerts").expect("GET /api/v1/alerts");
    data["alerts"].as_array().unwrap().iter().filter(|a| a["labels"]["alertname"] == name).cloned().collect()
}

/// Wait until Prometheus has scraped the agent (`up == 1` for the job) at least once.
fn wait_scraped(lab: &Lab) {
    wait_for("Prometheus to scrape the agent (up == 1)", Duration::from_secs(15), || {
        let data = api(lab, "/api/v1/query?query=up")?;
        data["result"].as_array()?.iter().any(|s| s["metric"]["job"] == "routewarden" && s["value"][1] == "1").then_some(())
    });
}

fn wait_firing(lab: &Lab, name: &str, timeout: Duration) -> Vec<Json> {
    let started = Instant::now();
    let firing = wait_for(&format!("{name} firing"), timeout, || {
        let a = alerts(lab, name);
        a.iter().any(|a| a["state"] == "firing").then_some(a)
    });
    eprintln!("{name} firing after {:?}", started.elapsed());
    firing
}

fn wait_resolved(lab: &Lab, name: &str, timeout: Duration) {
    let started = Instant::now();
    wait_for(&format!("{name} resolved"), timeout, || alerts(lab, name).is_empty().then_some(()));
    eprintln!("{name} resolved after {:?}", started.elapsed());
}

#[test]
fn route_flapping_fires_through_prometheus_while_a_second_writer_fights_and_resolves_after() {
    const TEST: &str = "route_flapping_fires_through_prometheus_while_a_second_writer_fights_and_resolves_after";
    if skip_unless_root(TEST) || skip_without_prometheus(TEST) {
        return;
    }
    if routewarden::bpf::embedded_object().is_none() {
        eprintln!("SKIPPED {TEST}: built without the BPF object; `cargo xtask test` embeds it");
        return;
    }
    let started = Instant::now();
    // Declared in this order so they drop in reverse: Prometheus, agent, then the namespaces.
    let lab = lab();
    let _agent = Agent::start(&lab, NODE, &example_dir(), &["--route-watch-window", "2", "--route-watch-backend", "socket-filter"]);
    let ready = wait_ready(&lab, NODE);
    assert!(ready.contains("bpf route_watch: ready\n"), "{ready}");
    let prom = Prometheus::start(&lab, NODE);
    wait_scraped(&lab);
    assert!(alerts(&lab, "RouteFlapping").is_empty(), "RouteFlapping before any fight: {:?}", alerts(&lab, "RouteFlapping"));

    // A BIRD-like writer overwrites our route to node-b's IPIP block and it is put back as ours
    // would look, every 100 ms, until the alert fires (as in agent_lab.rs, but kept up for
    // longer than the alert's hold time).
    let stop = AtomicBool::new(false);
    let firing = std::thread::scope(|s| {
        let fight = s.spawn(|| {
            let mut i = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let proto = if i.is_multiple_of(2) { "bird" } else { "80" };
                lab.ip(NODE, &["route", "replace", "10.245.20.0/26", "via", "10.0.0.12", "dev", "tunl0", "onlink", "metric", "1024", "proto", proto]).unwrap();
                i += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            // End on our version of the route, so nothing is left to repair.
            lab.ip(NODE, &["route", "replace", "10.245.20.0/26", "via", "10.0.0.12", "dev", "tunl0", "onlink", "metric", "1024", "proto", "80"]).unwrap();
            i
        });
        // The alert can fire on the flapping gauge one evaluation before the conflict counter's
        // increase is scraped; keep the fight up until the firing alert's description names
        // the writer pair too (its annotation is re-rendered at every evaluation).
        let firing = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wait_firing(&lab, "RouteFlapping", Duration::from_secs(30));
            wait_for("RouteFlapping's description to name self+bird", Duration::from_secs(20), || {
                let a = alerts(&lab, "RouteFlapping");
                a.iter()
                    .any(|a| a["state"] == "firing" && a["annotations"]["description"].as_str().is_some_and(|d| d.contains("self+bird")))
                    .then_some(a)
            })
        }));
        stop.store(true, Ordering::Relaxed);
        let writes = fight.join().unwrap();
        eprintln!("fight: {writes} replaces");
        firing.unwrap_or_else(|e| std::panic::resume_unwind(e))
    });
    // One alert, for this agent, with the labels the rule keeps and the routing label.
    assert_eq!(firing.len(), 1, "{firing:#?}");
    let a = &firing[0];
    assert_eq!(a["state"], "firing");
    let labels: std::collections::BTreeMap<String, String> = serde_json::from_value(a["labels"].clone()).unwrap();
    let expected: std::collections::BTreeMap<String, String> =
        [("alertname", "RouteFlapping"), ("severity", "warning"), ("namespace", "routewarden"), ("pod", "routewarden-node-a"), ("node", "node-a")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    assert_eq!(labels, expected);
    assert_eq!(a["annotations"]["summary"], "Cluster routes on node-a are flapping between writers.");
    // The description as the shipped template renders it while the fight is on: one prefix
    // (node-b's IPIP block) in conflict, the writer pair named.
    assert_eq!(
        a["annotations"]["description"],
        "The route watch on node node-a sees cluster routes rewritten over and over. Prefixes in flap or conflict now: 1. \
         Writer pairs in conflict in the last 10 minutes: self+bird. Run `routewarden events` on the node to see the prefixes and processes."
    );
    let m = metrics(&lab, NODE);
    assert!(m.value(r#"routewarden_route_conflicts_total{family="ipv4",writers="self+bird"}"#) >= 1, "{m}");

    // The fight has stopped: the detector window (2 s) empties and the `changes()` arms (8 s
    // here) fall below 3, and Prometheus drops the alert from the active list.
    wait_resolved(&lab, "RouteFlapping", Duration::from_secs(30));
    assert_eq!(metrics(&lab, NODE).value("routewarden_flapping_prefixes"), 0);
    drop(prom);
    eprintln!("{TEST}: {:?}", started.elapsed());
}

#[test]
fn route_ownership_conflict_fires_through_prometheus_for_a_double_programmed_class_and_resolves_when_fixed() {
    const TEST: &str = "route_ownership_conflict_fires_through_prometheus_for_a_double_programmed_class_and_resolves_when_fixed";
    if skip_unless_root(TEST) || skip_without_prometheus(TEST) {
        return;
    }
    if routewarden::bpf::embedded_object().is_none() {
        eprintln!("SKIPPED {TEST}: built without the BPF object; `cargo xtask test` embeds it");
        return;
    }
    let started = Instant::now();
    let lab = lab();
    let dir = copy_examples();
    let _agent = Agent::start(&lab, NODE, dir.path(), &[]);
    wait_ready(&lab, NODE);
    let prom = Prometheus::start(&lab, NODE);
    wait_scraped(&lab);
    assert!(alerts(&lab, "RouteOwnershipConflict").is_empty(), "with the complementary pair: {:?}", alerts(&lab, "RouteOwnershipConflict"));

    // BIRD is told to program every class (BGPConfiguration `Enabled`) while Felix keeps
    // `EnabledIPIPOnly`: routewarden (the Felix side) and BIRD both program IPIP.
    let calico = dir.path().join("calico.yaml");
    let good = std::fs::read_to_string(&calico).unwrap();
    let bad = good.replace("programClusterRoutes: EnabledNoEncapOnly", "programClusterRoutes: Enabled");
    assert_ne!(bad, good);
    std::fs::write(&calico, &bad).unwrap();
    wait_for("double-programmed ipip in /metrics", Duration::from_secs(10), || {
        metrics(&lab, NODE).is(r#"routewarden_ownership_findings{code="double-programmed",class="ipip"}"#, 1).then_some(())
    });
    let firing = wait_firing(&lab, "RouteOwnershipConflict", Duration::from_secs(20));
    // One alert: the IPIP class is double-programmed; no-encap (BIRD only) is consistent.
    assert_eq!(firing.len(), 1, "{firing:#?}");
    let a = &firing[0];
    assert_eq!(a["state"], "firing");
    let labels: std::collections::BTreeMap<String, String> = serde_json::from_value(a["labels"].clone()).unwrap();
    let expected: std::collections::BTreeMap<String, String> = [
        ("alertname", "RouteOwnershipConflict"),
        ("severity", "warning"),
        ("namespace", "routewarden"),
        ("code", "double-programmed"),
        ("class", "ipip"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(labels, expected);
    assert_eq!(a["annotations"]["summary"], "Two components program ipip cluster routes on 1 node(s).");

    // The operator restores the complementary pair: the finding goes and the alert resolves.
    std::fs::write(&calico, &good).unwrap();
    wait_resolved(&lab, "RouteOwnershipConflict", Duration::from_secs(20));
    // The agent drops the finding's series (it no longer exists), it does not report 0.
    let m = metrics(&lab, NODE);
    assert!(!m.has(r#"routewarden_ownership_findings{code="double-programmed",class="ipip"}"#), "{m}");
    assert_eq!(m.value(r#"routewarden_ownership_findings{code="consistent",class="ipip"}"#), 1, "{m}");
    drop(prom);
    eprintln!("{TEST}: {:?}", started.elapsed());
}
