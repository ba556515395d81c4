//! routewarden in a table other than main (`--route-table 48`): whether an `ip rule` selects
//! it (`audit`, `/readyz`, `routewarden_route_table_rule`), rule writes seen by the route
//! watch with their writer (`RuleChange` events, `routewarden_rule_writes_total`), and the
//! opt-in rule (`--route-table-rule-priority`). Every test in namespaces it creates.

mod lab_support;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lab_support::{example_dir, lab, metrics, wait_for, wait_ready, Agent, PORT};
use routewarden::bpf::route_watch::events_stream::{stream_events_with, EventsFormat, EventsOptions};
use routewarden_lab::{skip_unless_root, Lab, NetNsGuard};

/// node-a's line when no rule selects table 48: its 7 IPv4 IPIP routes (`--role felix`).
const NO_RULE_LINE: &str = "no-rule-for-table: table 48 has 7 IPv4 cluster routes and no ip rule selects it (ip -4 rule add from all lookup 48)";
/// The audit's first line: routewarden's 7 routes in table 48 and BIRD's 4 in main.
const AUDIT_HEADER: &str = "audit of table 48: 11 expected routes, 11 kernel routes on cluster prefixes";
/// node-a's no-encap routes BIRD programs in main (the example cluster, `--role felix`).
const BIRD_ROUTES: [&str; 4] = [
    "blackhole 10.246.10.0/26",
    "10.246.30.0/26 via 10.0.0.13 dev eth0",
    "blackhole fd00:10:244:0:10::/122",
    "fd00:10:244:0:20::/122 via fd00:10::12 dev eth0",
];
const GAUGE: &str = r#"routewarden_route_table_rule{family="ipv4",table="48"}"#;

fn readyz(lab: &Lab) -> String {
    match lab.http_get("node-a", PORT, "/readyz") {
        Ok((_, body)) => body,
        Err(e) => panic!("GET /readyz: {e:#}"),
    }
}

/// `ip rule show` of one family in node-a, one rule a line.
fn rules(lab: &Lab, family: &str) -> Vec<String> {
    lab.ip("node-a", &[family, "rule", "show"]).unwrap().lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")).collect()
}

/// `routewarden audit` of node-a with routewarden in table 48: its exit code and stdout.
fn audit(lab: &Lab) -> (i32, String) {
    let out = lab
        .command("node-a", env!("CARGO_BIN_EXE_routewarden"))
        .args(["audit", "--node", "node-a", "--role", "felix", "--route-table", "48", "--datastore"])
        .arg(format!("file:{}", example_dir().display()))
        .output()
        .unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn table_48_without_a_rule_is_reported_until_a_rule_selects_it_and_again_once_deleted() {
    let test = "table_48_without_a_rule_is_reported_until_a_rule_selects_it_and_again_once_deleted";
    if skip_unless_root(test) {
        return;
    }
    let lab = lab();
    let _agent = Agent::start(&lab, "node-a", &example_dir(), &["--route-table", "48"]);
    wait_ready(&lab, "node-a");
    // BIRD's no-encap routes in main, as BIRD would program them (no BIRD runs here), so that
    // the audit's only finding can be the table's rule.
    for r in BIRD_ROUTES {
        let mut args: Vec<&str> = if r.contains(':') { vec!["-6", "route", "add"] } else { vec!["route", "add"] };
        args.extend(r.split(' '));
        args.extend(["proto", "bird", "metric", "1024"]);
        lab.ip("node-a", &args).unwrap();
    }
    let m = wait_for("the table-rule gauge", Duration::from_secs(10), || Some(metrics(&lab, "node-a")).filter(|m| m.has(GAUGE)));
    assert_eq!(m.value(GAUGE), 0, "{m}");
    assert!(!m.has(r#"routewarden_route_table_rule{family="ipv6",table="48"}"#), "no IPv6 routes, no IPv6 check: {m}");
    let ready = readyz(&lab);
    assert!(ready.lines().any(|l| l == NO_RULE_LINE), "{ready}");
    let (code, out) = audit(&lab);
    assert_eq!(code, 1, "{out}");
    assert_eq!(out.lines().collect::<Vec<_>>(), [AUDIT_HEADER, NO_RULE_LINE]);

    // The rollout's rule: selected, clean.
    lab.ip("node-a", &["-4", "rule", "add", "from", "all", "lookup", "48", "priority", "100"]).unwrap();
    // The gauge follows the rule-change event; the counters are read every second.
    let added = r#"routewarden_rule_writes_total{family="ipv4",op="add",writer="other"}"#;
    let m = wait_for("the gauge at 1, the add counted", Duration::from_secs(10), || {
        Some(metrics(&lab, "node-a")).filter(|m| m.value(GAUGE) == 1 && m.value(added) == 1)
    });
    assert_eq!(m.counted("routewarden_rule_writes_total"), [(r#"routewarden_rule_writes_total{family="ipv4",op="add",writer="other"}"#, 1)], "{m}");
    assert!(!readyz(&lab).contains("no-rule-for-table"), "{}", readyz(&lab));
    let (code, out) = audit(&lab);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out.lines().collect::<Vec<_>>(), [AUDIT_HEADER, "clean: every owner's routes are present and nothing else writes cluster prefixes"]);

    // Deleted by another process under live routes: the gauge falls back at once.
    lab.ip("node-a", &["-4", "rule", "del", "from", "all", "lookup", "48", "priority", "100"]).unwrap();
    let deleted = r#"routewarden_rule_writes_total{family="ipv4",op="delete",writer="other"}"#;
    let m = wait_for("the gauge back at 0, the delete counted", Duration::from_secs(10), || {
        Some(metrics(&lab, "node-a")).filter(|m| m.value(GAUGE) == 0 && m.value(deleted) == 1)
    });
    assert_eq!(
        m.counted("routewarden_rule_writes_total"),
        [
            (r#"routewarden_rule_writes_total{family="ipv4",op="add",writer="other"}"#, 1),
            (r#"routewarden_rule_writes_total{family="ipv4",op="delete",writer="other"}"#, 1)
        ],
        "{m}"
    );
    let ready = readyz(&lab);
    assert!(ready.lines().any(|l| l == NO_RULE_LINE), "{ready}");
}

#[test]
fn the_opt_in_rule_is_made_once_beside_another_writers_rule_and_a_restart_writes_nothing() {
    let test = "the_opt_in_rule_is_made_once_beside_another_writers_rule_and_a_restart_writes_nothing";
    if skip_unless_root(test) {
        return;
    }
    let lab = lab();
    // Another writer's rule at the priority routewarden is given.
    lab.ip("node-a", &["-4", "rule", "add", "from", "all", "lookup", "100", "priority", "100", "proto", "static"]).unwrap();
    let before = rules(&lab, "-4");
    let args = ["--route-table", "48", "--route-table-rule-priority", "100"];
    let agent = Agent::start(&lab, "node-a", &example_dir(), &args);
    wait_ready(&lab, "node-a");
    let added = r#"routewarden_rule_writes_total{family="ipv4",op="add",writer="self"}"#;
    let m = wait_for("our rule counted", Duration::from_secs(10), || Some(metrics(&lab, "node-a")).filter(|m| m.value(added) == 1));
    assert_eq!(m.value(GAUGE), 1, "{m}");
    assert_eq!(m.counted("routewarden_rule_writes_total"), [(added, 1)], "{m}");
    assert!(!readyz(&lab).contains("rule"), "{}", readyz(&lab));
    let with_ours = rules(&lab, "-4");
    let mut want = before.clone();
    // After the other's rule at the same priority (the kernel appends among equals).
    let at = want.iter().position(|r| r.starts_with("100:")).unwrap() + 1;
    want.insert(at, "100: from all lookup 48 proto 80".into());
    assert_eq!(with_ours, want);
    assert_eq!(rules(&lab, "-6").iter().filter(|r| r.contains("lookup 48")).count(), 0, "no IPv6 routes, no IPv6 rule");
    assert!(agent.stop().success());
    assert_eq!(rules(&lab, "-4"), with_ours, "the rule outlives the agent, as its routes do");

    // A restart finds it and writes nothing.
    let _agent = Agent::start(&lab, "node-a", &example_dir(), &args);
    wait_ready(&lab, "node-a");
    wait_for("the gauge at 1", Duration::from_secs(10), || Some(metrics(&lab, "node-a")).filter(|m| m.is(GAUGE, 1)));
    // Counters are read every second: two reads after the check.
    std::thread::sleep(Duration::from_secs(2));
    let m = metrics(&lab, "node-a");
    assert_eq!(m.counted("routewarden_rule_writes_total"), [], "{m}");
    assert_eq!(rules(&lab, "-4"), with_ours);
}

/// The stream's output, shared with the test while the stream runs.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl Shared {
    fn events(&self) -> Vec<serde_json::Value> {
        let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        text.lines().map(|l| serde_json::from_str(l).expect("one JSON object per line")).collect()
    }
}

impl Write for Shared {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Run `ip <args>` in this thread's namespace; its pid.
fn ip(args: &[&str]) -> u32 {
    let mut child = std::process::Command::new("ip").args(args).spawn().unwrap();
    let pid = child.id();
    assert!(child.wait().unwrap().success(), "ip {args:?}");
    pid
}

fn rule_changes(events: &[serde_json::Value]) -> Vec<serde_json::Value> {
    events
        .iter()
        .filter(|v| v["event"] == "rule-change")
        .map(|v| {
            let mut v = v.clone();
            v["rule"].as_object_mut().unwrap().remove("at_ns");
            v
        })
        .collect()
}

#[test]
fn a_rule_deleted_by_another_process_is_an_event_naming_it() {
    let test = "a_rule_deleted_by_another_process_is_an_event_naming_it";
    if skip_unless_root(test) {
        return;
    }
    let Some(object) = routewarden::bpf::embedded_object() else {
        routewarden_lab::skip(test, format_args!("built without the BPF object; `cargo xtask test` embeds it"));
        return;
    };
    let _ns = NetNsGuard::new().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let out = Shared::default();
    let opts = EventsOptions { format: EventsFormat::Json, duration: Some(Duration::from_mins(1)), ..EventsOptions::default() };
    let deadline = Duration::from_secs(20);
    let pids = rt.block_on(async {
        let seen = out.clone();
        let writer = tokio::spawn(async move {
            // Until the stream shows a rule change the watch may not be attached yet: add and
            // delete a warm-up rule until one is seen.
            let started = Instant::now();
            while rule_changes(&seen.events()).is_empty() {
                assert!(started.elapsed() < deadline, "no rule change streamed within {deadline:?}");
                ip(&["-6", "rule", "add", "from", "all", "lookup", "77", "priority", "77"]);
                ip(&["-6", "rule", "del", "from", "all", "lookup", "77", "priority", "77"]);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let warm_up = rule_changes(&seen.events()).len();
            let add = ip(&["-4", "rule", "add", "from", "all", "lookup", "48", "priority", "100"]);
            let del = ip(&["-4", "rule", "del", "from", "all", "lookup", "48", "priority", "100"]);
            let started = Instant::now();
            while rule_changes(&seen.events()).len() < warm_up + 2 {
                assert!(started.elapsed() < deadline, "not both rule changes within {deadline:?}: {:#?}", seen.events());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGTERM).unwrap();
            (warm_up, add, del)
        });
        stream_events_with(object, &opts, out.clone()).await.expect("stream");
        writer.await.unwrap()
    });
    let (warm_up, add, del) = pids;
    let changes = rule_changes(&out.events());
    let writer = |pid: u32| serde_json::json!({"protocol": 0, "class": "other", "class_inferred": false, "kernel": false, "pid": pid, "comm": "ip"});
    assert_eq!(
        changes[warm_up..],
        [
            serde_json::json!({"event": "rule-change", "rule": {"family": "ipv4", "op": "add", "table": 48, "priority": 100, "writer": writer(add)}}),
            serde_json::json!({"event": "rule-change", "rule": {"family": "ipv4", "op": "delete", "table": 48, "priority": 100, "writer": writer(del)}}),
        ]
    );
}
