//! No edit, bad object or neighbour makes routewarden delete a route it should keep.
//! Each test is one row of the issue's table, run against the agent binary in the
//! network-namespace lab (`routewarden run --datastore file:<a copy of examples/cluster>
//! --node node-a`, seven proto-80 routes when healthy), asserting the kernel's routes before
//! and after, exactly. `docs/bad-input.md` lists every bad-input kind with the test that covers
//! it; `bad_input_doc_names_tests_that_exist` keeps the two in step.
//!
//! Settle periods are shortened with `--settle-period` so that a deliberate change can be seen
//! converging within the test; the default (30 s) is what `routewarden run` uses.

mod lab_support;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use lab_support::{copy_examples, lab, metrics, routes, wait_for, wait_ready, Agent, NODE_A_IPIP, PORT};
use routewarden_lab::{skip_unless_root, Lab};

/// The lab's settle period for these tests, seconds.
const SETTLE: u64 = 3;

fn settle_flag() -> [&'static str; 2] {
    ["--settle-period", "3"]
}

/// Route operations so far: (successful replaces/creates, successful deletes).
fn ops(lab: &Lab) -> (u64, u64) {
    let m = metrics(lab, "node-a");
    let replace = m.value(r#"routewarden_route_operations_total{op="replace",result="ok"}"#);
    let delete = m.value(r#"routewarden_route_operations_total{op="delete",result="ok"}"#);
    (replace, delete)
}

/// Poll node-a's proto-80 routes for `d`, requiring `want` every time (a delete-and-re-add
/// between two polls shows in [`ops`]).
fn routes_stay(lab: &Lab, want: &[&str], d: Duration) {
    let end = Instant::now() + d;
    while Instant::now() < end {
        assert_eq!(routes(lab, "node-a", "80"), want);
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn readyz(lab: &Lab) -> (u16, String) {
    lab.http_get("node-a", PORT, "/readyz").expect("readyz answers")
}

/// A healthy agent on a copy of the example cluster: (lab, datastore dir, agent).
fn healthy(extra: &[&str]) -> (Lab, tempfile::TempDir, Agent) {
    let lab = lab();
    let dir = copy_examples();
    let mut flags = settle_flag().to_vec();
    flags.extend_from_slice(extra);
    let agent = Agent::start(&lab, "node-a", dir.path(), &flags);
    wait_ready(&lab, "node-a");
    wait_for("node-a's seven routes", Duration::from_secs(20), || (routes(&lab, "node-a", "80") == NODE_A_IPIP).then_some(()));
    assert_eq!(ops(&lab), (7, 0));
    (lab, dir, agent)
}

fn file(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    dir.path().join(name)
}

/// Row 1: `: > ipam.yaml` deleted all seven routes with /readyz 200. An empty file is refused
/// (its last good content is kept), nothing is deleted, and the agent stays ready naming it.
#[test]
fn row01_emptied_file_deletes_nothing() {
    if skip_unless_root("row01_emptied_file_deletes_nothing") {
        return;
    }
    let (lab, dir, _agent) = healthy(&[]);
    let ipam = file(&dir, "ipam.yaml");
    let good = std::fs::read_to_string(&ipam).unwrap();
    std::fs::write(&ipam, "").unwrap();
    wait_for("the empty file reported", Duration::from_secs(10), || (metrics(&lab, "node-a").value("routewarden_datastore_invalid_inputs") == 1).then_some(()));
    routes_stay(&lab, &NODE_A_IPIP, Duration::from_secs(SETTLE * 2));
    let (status, body) = readyz(&lab);
    assert_eq!(status, 200, "{body}");
    let invalid: Vec<&str> = body.lines().filter(|l| l.starts_with("invalid: ")).collect();
    assert_eq!(
        invalid,
        [format!(
            "invalid: {}: no document (empty, whitespace or comments only): refused; write `kind: List` with `items: []` for an input that is empty on purpose",
            ipam.display()
        )]
    );
    std::fs::write(&ipam, good).unwrap();
    wait_for("the file good again", Duration::from_secs(10), || (metrics(&lab, "node-a").value("routewarden_datastore_invalid_inputs") == 0).then_some(()));
    routes_stay(&lab, &NODE_A_IPIP, Duration::from_secs(1));
    assert_eq!(ops(&lab), (7, 0), "no route was deleted or rewritten");
}

/// Row 2: a slow writer (truncate, 1.5 s later the content) cost 7 deletes and 7 re-adds.
#[test]
fn row02_slow_writer_costs_no_route_operation() {
    if skip_unless_root("row02_slow_writer_costs_no_route_operation") {
        return;
    }
    let (lab, dir, _agent) = healthy(&[]);
    let ipam = file(&dir, "ipam.yaml");
    let good = std::fs::read(&ipam).unwrap();
    let writer = {
        let ipam = ipam.clone();
        std::thread::spawn(move || {
            use std::io::Write as _;
            let mut f = std::fs::File::create(&ipam).unwrap(); // truncated
            std::thread::sleep(Duration::from_millis(1500));
            // Half of it, then a pause, then the rest (a writer flushing in pieces).
            f.write_all(&good[..good.len() / 2]).unwrap();
            f.flush().unwrap();
            std::thread::sleep(Duration::from_millis(1500));
            f.write_all(&good[good.len() / 2..]).unwrap();
        })
    };
    routes_stay(&lab, &NODE_A_IPIP, Duration::from_secs(4));
    writer.join().unwrap();
    routes_stay(&lab, &NODE_A_IPIP, Duration::from_secs(SETTLE + 2));
    assert_eq!(ops(&lab), (7, 0));
}

/// Row 3: `mv <dir> x; mkdir <dir>` deleted everything while logging "node-a is not in the
/// cluster". The vanished files are kept and the agent is not synced until the tree has been
/// stable; then their removal is applied, and without this node's Node nothing is deleted
/// either. Put back, the agent is ready with not one route touched.
#[test]
fn row03_replaced_directory_deletes_nothing() {
    if skip_unless_root("row03_replaced_directory_deletes_nothing") {
        return;
    }
    let (lab, dir, _agent) = healthy(&[]);
    let aside = dir.path().with_extension("aside");
    std::fs::rename(dir.path(), &aside).unwrap();
    std::fs::create_dir(dir.path()).unwrap();
    // Wait for the line that says why, not only the 503 (set by two events; see row 4).
    let body = wait_for("not synced", Duration::from_secs(40), || match readyz(&lab) {
        (503, b) if b.lines().any(|l| l.starts_with("not synced: ")) => Some(b),
        _ => None,
    });
    assert!(body.lines().any(|l| l.starts_with("not synced: ") && l.contains("vanished or unreadable")), "{body}");
    routes_stay(&lab, &NODE_A_IPIP, Duration::from_secs(SETTLE + 1));
    // Settled: the removal is applied, and this node is gone from the view.
    let body = wait_for("this node missing", Duration::from_secs(20), || {
        let (s, b) = readyz(&lab);
        (s == 503 && b.contains("this node \"node-a\" is not in the datastore")).then_some(b)
    });
    assert!(body.starts_with("datastore: not synced\n"), "{body}");
    routes_stay(&lab, &NODE_A_IPIP, Duration::from_secs(SETTLE * 2));
    std::fs::remove_dir(dir.path()).unwrap();
    std::fs::rename(&aside, dir.path()).unwrap();
    wait_ready(&lab, "node-a");
    routes_stay(&lab, &NODE_A_IPIP, Duration::from_secs(SETTLE + 1));
    assert_eq!(ops(&lab), (7, 0));
}

/// Row 4: `ln -sf /nonexistent nodes.yaml`, or deleting nodes.yaml, deleted node-b's and
/// node-c's four routes without a warning. The file is kept and reported; the removal, if it
/// stays, is applied after the settle period and the mass-deletion breaker (4 of 7), so a
/// deliberate removal still converges.
#[test]
fn row04_dangling_symlink_or_deleted_file_is_held_then_converges() {
    if skip_unless_root("row04_dangling_symlink_or_deleted_file_is_held_then_converges") {
        return;
    }
    let (lab, dir, _agent) = healthy(&[]);
    let nodes = file(&dir, "nodes.yaml");
    let good = std::fs::read_to_string(&nodes).unwrap();
    std::fs::remove_file(&nodes).unwrap();
    std::os::unix::fs::symlink("/nonexistent", &nodes).unwrap();
    // The 503 can come a moment before the line that says why (the health flag and the notes
    // are set by two events): wait for the line.
    let body = wait_for("not synced, naming the path", Duration::from_secs(10), || match readyz(&lab) {
        (503, b) if b.lines().any(|l| l.starts_with("not synced: ")) => Some(b),
        _ => None,
    });
    let reason = body.lines().find(|l| l.starts_with("not synced: ")).unwrap_or_default().to_owned();
    assert!(reason.starts_with(&format!("not synced: {} vanished or unreadable", nodes.display())), "{body}");
    routes_stay(&lab, &NODE_A_IPIP, Duration::from_secs(1));
    // Back within the settle period: nothing happened.
    std::fs::remove_file(&nodes).unwrap();
    std::fs::write(&nodes, &good).unwrap();
    wait_ready(&lab, "node-a");
    routes_stay(&lab, &NODE_A_IPIP, Duration::from_secs(SETTLE + 1));
    assert_eq!(ops(&lab), (7, 0));

    // Deleted for good: kept while settling, then node-b's and node-c's routes go.
    let holds = metrics(&lab, "node-a").value("routewarden_mass_deletion_holds_total");
    std::fs::remove_file(&nodes).unwrap();
    routes_stay(&lab, &NODE_A_IPIP, Duration::from_secs(SETTLE));
    let want: Vec<&str> = NODE_A_IPIP.iter().copied().filter(|r| !r.contains("via 10.0.0.12") && !r.contains("via 10.0.0.13")).collect();
    assert_eq!(want.len(), 3);
    wait_for("the deliberate removal converges", Duration::from_secs(SETTLE * 6 + 10), || (routes(&lab, "node-a", "80") == want).then_some(()));
    assert_eq!(ops(&lab), (7, 4));
    assert_eq!(metrics(&lab, "node-a").value("routewarden_mass_deletion_holds_total"), holds + 1, "4 of 7 at once went through the breaker");
}

/// Row 5: truncating a file at an item boundary (valid YAML with fewer objects) deleted six
/// routes. Nothing is deleted until the files have settled; put back in time, nothing
/// happened; left truncated, the six go one settle period and one breaker hold later.
#[test]
fn row05_truncation_at_an_item_boundary_waits_for_the_settle_period() {
    if skip_unless_root("row05_truncation_at_an_item_boundary_waits_for_the_settle_period") {
        return;
    }
    let (lab, dir, _agent) = healthy(&[]);
    let ipam = file(&dir, "ipam.yaml");
    let good = std::fs::read_to_string(&ipam).unwrap();
    // Cut right after node-a's own block: every other block and affinity is gone.
    let cut = good.find("  - apiVersion: crd.projectcalico.org/v1\n    kind: IPAMBlock\n    metadata: {name: 10-244-20-0-26}").unwrap();
    let truncated = &good[..cut];
    std::fs::write(&ipam, truncated).unwrap();
    routes_stay(&lab, &NODE_A_IPIP, Duration::from_secs(SETTLE - 1));
    std::fs::write(&ipam, &good).unwrap();
    routes_stay(&lab, &NODE_A_IPIP, Duration::from_secs(SETTLE + 2));
    assert_eq!(ops(&lab), (7, 0));

    std::fs::write(&ipam, truncated).unwrap();
    routes_stay(&lab, &NODE_A_IPIP, Duration::from_secs(SETTLE));
    wait_for("the breaker holding six deletes", Duration::from_secs(SETTLE * 3), || {
        (metrics(&lab, "node-a").value(r#"routewarden_deletions_held{reason="mass-deletion"}"#) == 6).then_some(())
    });
    assert_eq!(routes(&lab, "node-a", "80"), NODE_A_IPIP);
    wait_for("the deliberate cut converges", Duration::from_secs(SETTLE * 4), || (routes(&lab, "node-a", "80") == NODE_A_IPIP[..1]).then_some(()));
    assert_eq!(ops(&lab), (7, 6));
}

/// Row 6: an IP pool widened to 10.0.0.0/8 (overlapping the others) let the agent delete
/// BIRD's no-encap route; widened to 0.0.0.0/0 also foreign routes outside every pool; and
/// `explain` said "consistent". Overlapping and /0 pools are invalid: their CIDRs are frozen,
/// no route there is claimed or deleted, and `explain` exits 1 naming them.
#[test]
fn row06_widened_pool_freezes_its_ground_and_explain_fails() {
    if skip_unless_root("row06_widened_pool_freezes_its_ground_and_explain_fails") {
        return;
    }
    let (lab, dir, _agent) = healthy(&[]);
    lab.ip("node-a", &["route", "add", "10.246.30.0/26", "via", "10.0.0.13", "dev", "eth0", "proto", "bird", "metric", "1024"]).unwrap();
    lab.ip("node-a", &["route", "add", "192.168.50.0/24", "via", "10.0.0.1", "dev", "eth0", "proto", "80", "metric", "1024"]).unwrap();
    lab.ip("node-a", &["route", "add", "172.20.0.0/16", "via", "10.0.0.1", "dev", "eth0", "proto", "bird", "metric", "1024"]).unwrap();
    let foreign = |lab: &Lab| {
        let mut r = routes(lab, "node-a", "bird");
        r.extend(routes(lab, "node-a", "80").into_iter().filter(|l| l.starts_with("192.168.50.0/24")));
        r
    };
    let before = foreign(&lab);
    // Past the settle period (when a delete would go out), at every poll: our seven routes
    // and the foreign ones unchanged.
    let ours_and_foreign_stay = |lab: &Lab, what: &str| {
        let end = Instant::now() + Duration::from_secs(SETTLE + 2);
        while Instant::now() < end {
            assert_eq!(routes(lab, "node-a", "80").into_iter().filter(|l| !l.starts_with("192.168.50.0/24")).collect::<Vec<_>>(), NODE_A_IPIP, "{what}");
            assert_eq!(foreign(lab), before, "{what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    assert_eq!(
        before,
        [
            "10.246.30.0/26 via 10.0.0.13 dev eth0 metric 1024",
            "172.20.0.0/16 via 10.0.0.1 dev eth0 metric 1024",
            "192.168.50.0/24 via 10.0.0.1 dev eth0 metric 1024",
        ]
    );
    let calico = file(&dir, "calico.yaml");
    let good = std::fs::read_to_string(&calico).unwrap();
    for widened in ["10.0.0.0/8", "0.0.0.0/0"] {
        std::fs::write(&calico, good.replace("cidr: 10.244.0.0/16", &format!("cidr: {widened}"))).unwrap();
        wait_for("frozen ground", Duration::from_secs(10), || (metrics(&lab, "node-a").value("routewarden_frozen_prefixes") >= 1).then_some(()));
        ours_and_foreign_stay(&lab, widened);
        let out = Command::new(env!("CARGO_BIN_EXE_routewarden"))
            .args(["explain", "--node", "node-a", "--datastore"])
            .arg(format!("file:{}", dir.path().display()))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{widened}: {text}");
        assert!(text.lines().any(|l| l.trim_start().starts_with("ERROR  invalid-pool") && l.contains("IPPool \"default-ipv4-ippool\"")), "{widened}: {text}");
    }
    std::fs::write(&calico, &good).unwrap();
    wait_for("thawed", Duration::from_secs(10), || (metrics(&lab, "node-a").value("routewarden_frozen_prefixes") == 0).then_some(()));
    ours_and_foreign_stay(&lab, "restored");
    assert_eq!(ops(&lab).1, 0);
}

/// Row 7: a workload route with protocol 80 (Felix writes those when `deviceRouteProtocol` is
/// 80) and a proto-80 route outside every pool were deleted within 50 ms. Never ours.
#[test]
fn row07_our_protocol_on_a_workload_device_or_outside_every_pool_is_not_ours() {
    if skip_unless_root("row07_our_protocol_on_a_workload_device_or_outside_every_pool_is_not_ours") {
        return;
    }
    let (lab, _dir, _agent) = healthy(&["--resync-interval", "1"]);
    lab.ip("node-a", &["link", "add", "cali-x", "type", "veth", "peer", "name", "cali-x-peer"]).unwrap();
    lab.ip("node-a", &["link", "set", "cali-x", "up"]).unwrap();
    lab.ip("node-a", &["link", "set", "cali-x-peer", "up"]).unwrap();
    lab.ip("node-a", &["route", "add", "10.244.10.5", "dev", "cali-x", "scope", "link", "proto", "80"]).unwrap();
    lab.ip("node-a", &["route", "add", "192.168.77.0/24", "via", "10.0.0.1", "dev", "eth0", "proto", "80"]).unwrap();
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    let mut want: Vec<String> = NODE_A_IPIP.iter().map(ToString::to_string).collect();
    want.push("10.244.10.5 dev cali-x scope link".into());
    want.push("192.168.77.0/24 via 10.0.0.1 dev eth0".into());
    let want = sorted(want);
    // Many resyncs (1 s each), route events, and the settle period.
    let end = Instant::now() + Duration::from_secs(SETTLE + 3);
    while Instant::now() < end {
        assert_eq!(sorted(routes(&lab, "node-a", "80")), want);
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(ops(&lab), (7, 0));
}

/// Row 10: one invalid object anywhere deferred every deletion forever and made /readyz 503.
/// It freezes only the CIDRs it names: node-d's released block elsewhere goes, the agent stays
/// ready and names the object; a released block the invalid object mentions stays.
#[test]
fn row10_one_invalid_object_freezes_only_what_it_names() {
    if skip_unless_root("row10_one_invalid_object_freezes_only_what_it_names") {
        return;
    }
    let (lab, dir, _agent) = healthy(&[]);
    let calico = file(&dir, "calico.yaml");
    let ipam = file(&dir, "ipam.yaml");
    let good = std::fs::read_to_string(&ipam).unwrap();
    // A pool that never had a good version (ipipMode Sometimes), and a BlockAffinity for
    // node-c's block with an invalid state: both never good.
    let mut text = std::fs::read_to_string(&calico).unwrap();
    text.push_str("\n---\napiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: broken}\nspec: {cidr: 10.250.0.0/16, ipipMode: Sometimes}\n");
    std::fs::write(&calico, text).unwrap();
    let affinity = "  - {apiVersion: crd.projectcalico.org/v1, kind: BlockAffinity, metadata: {name: node-c-10-244-30-0-26-x}, spec: {cidr: 10.244.30.0/26, node: node-c, state: weird}}\n";
    let released = good
        .replace(
            "spec: {cidr: 10.245.40.0/26, affinity: \"host:node-d\", deleted: false}",
            "spec: {cidr: 10.245.40.0/26, affinity: \"host:node-d\", deleted: true}",
        )
        .replace(
            "spec: {cidr: 10.244.30.0/26, affinity: \"host:node-c\", allocations: [], attributes: [], deleted: false}",
            "spec: {cidr: 10.244.30.0/26, affinity: \"host:node-c\", allocations: [], attributes: [], deleted: true}",
        );
    assert_ne!(released, good);
    std::fs::write(&ipam, format!("{released}{affinity}")).unwrap();
    let want: Vec<&str> = NODE_A_IPIP.iter().copied().filter(|r| !r.starts_with("10.245.40.0/26")).collect();
    wait_for("node-d's released block deleted", Duration::from_secs(SETTLE * 3 + 10), || (routes(&lab, "node-a", "80") == want).then_some(()));
    let m = metrics(&lab, "node-a");
    assert_eq!(m.value("routewarden_datastore_invalid_objects"), 2, "{m}");
    assert_eq!(m.value("routewarden_frozen_prefixes"), 2, "{m}");
    assert_eq!(m.value(r#"routewarden_deletions_held{reason="frozen"}"#), 1, "{m}");
    let (status, body) = readyz(&lab);
    assert_eq!(status, 200, "{body}");
    let invalid: Vec<&str> = body.lines().filter(|l| l.starts_with("invalid: ")).collect();
    assert_eq!(invalid.len(), 2, "{body}");
    assert!(invalid.iter().any(|l| l.contains(r#"IPPool "broken": spec.ipipMode: invalid value "Sometimes""#)), "{body}");
    assert!(invalid.iter().any(|l| l.contains(r#"BlockAffinity "node-c-10-244-30-0-26-x": spec.state: invalid value "weird""#)), "{body}");
    routes_stay(&lab, &want, Duration::from_secs(SETTLE));
    assert_eq!(ops(&lab), (7, 1));
    // `audit` lists what it skipped and why, and is not clean because of it.
    let out = lab
        .command("node-a", env!("CARGO_BIN_EXE_routewarden"))
        .args(["audit", "--node", "node-a", "-o", "json", "--datastore"])
        .arg(format!("file:{}", dir.path().display()))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut skipped: Vec<(String, bool)> = report["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["error"].as_str().unwrap().split(':').next().unwrap().to_owned(), s["last_good_kept"].as_bool().unwrap()))
        .collect();
    skipped.sort();
    assert_eq!(skipped, [("BlockAffinity \"node-c-10-244-30-0-26-x\"".to_owned(), false), ("IPPool \"broken\"".to_owned(), false)]);
}

/// The agent's CPU time (user + system), seconds, from `/proc/<pid>/stat`.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

/// The agent's peak resident memory (`VmHWM`), MiB.
fn peak_rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: f64 = status.lines().find_map(|l| l.strip_prefix("VmHWM:")).unwrap().trim().trim_end_matches(" kB").trim().parse().unwrap();
    kb / 1024.0
}

/// Row 11: 200 KB of nested `[` took 28 s of CPU with every update blocked meanwhile. The
/// nesting limit stops the parse at once; the agent answers throughout.
#[test]
fn row11_deep_nesting_is_refused_at_once() {
    if skip_unless_root("row11_deep_nesting_is_refused_at_once") {
        return;
    }
    let (lab, dir, agent) = healthy(&[]);
    let before = cpu_seconds(agent.pid());
    std::fs::write(file(&dir, "deep.yaml"), "[".repeat(200 * 1024)).unwrap();
    wait_for("the file refused", Duration::from_secs(10), || (metrics(&lab, "node-a").value("routewarden_datastore_invalid_inputs") == 1).then_some(()));
    let (status, body) = readyz(&lab);
    assert_eq!(status, 200);
    assert!(body.lines().any(|l| l == format!("invalid: {}:1: YAML: nesting deeper than 64 levels", file(&dir, "deep.yaml").display())), "{body}");
    let used = cpu_seconds(agent.pid()) - before;
    assert!(used < 2.0, "parsing the nested file took {used} s of CPU");
    routes_stay(&lab, &NODE_A_IPIP, Duration::from_secs(1));
    assert_eq!(ops(&lab), (7, 0));
}

/// Row 12: a 10 MB allocations array took 1 GB of RSS (a 50 MB file 1.38 GB), far past the
/// DaemonSet's 256 Mi. The block stops growing at the sequence limit and keeps its last good
/// version; the agent's peak RSS stays below 200 MB.
#[test]
fn row12_huge_allocations_array_stays_within_memory() {
    if skip_unless_root("row12_huge_allocations_array_stays_within_memory") {
        return;
    }
    let (lab, dir, agent) = healthy(&[]);
    let ipam = file(&dir, "ipam.yaml");
    let good = std::fs::read_to_string(&ipam).unwrap();
    let huge = format!("allocations: [{}1]", "null, ".repeat(10 * 1024 * 1024 / 6));
    let bad = good.replacen("allocations: [0, null, null, null, null, 1]", &huge, 1);
    assert!(bad.len() > 10_000_000);
    std::fs::write(&ipam, bad).unwrap();
    wait_for("the block rejected", Duration::from_secs(30), || (metrics(&lab, "node-a").value("routewarden_datastore_invalid_objects") == 1).then_some(()));
    let rss = peak_rss_mib(agent.pid());
    assert!(rss < 200.0, "peak RSS {rss} MiB");
    let (_, body) = readyz(&lab);
    assert!(
        body.lines().any(
            |l| l.contains(r#"IPAMBlock "10-244-20-0-26": line "#) && l.ends_with("a sequence has more than 65536 entries (its last good version is kept)")
        ),
        "{body}"
    );
    routes_stay(&lab, &NODE_A_IPIP, Duration::from_secs(SETTLE + 1));
    assert_eq!(ops(&lab), (7, 0));
    eprintln!("row12: peak RSS {rss:.1} MiB with a {} MB allocations array", huge.len() / 1_000_000);
}

/// Row 14: deleting 300 pools left 1,800 pool-labelled series behind. Each deleted pool's
/// series go with it.
#[test]
fn row14_deleted_pools_take_their_series_with_them() {
    if skip_unless_root("row14_deleted_pools_take_their_series_with_them") {
        return;
    }
    if routewarden::bpf::embedded_object().is_none() {
        routewarden_lab::skip(
            "row14_deleted_pools_take_their_series_with_them",
            format_args!("built without the BPF object, so no forwarding watch; `cargo xtask test` embeds it"),
        );
        return;
    }
    let (lab, dir, _agent) = healthy(&[]);
    let m = metrics(&lab, "node-a");
    assert_eq!(m.value(r#"routewarden_bpf_program_attached{program="tc_forward"}"#), 1, "the forwarding watch runs: {m}");
    // 300 no-encap pools (BIRD's class for role felix: no route of ours), each with a block.
    let mut extra = String::new();
    for i in 0..300 {
        let (a, b) = (i / 100, i % 100);
        let o = 100 + a;
        let _ = write!(
            extra,
            "---\napiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {{name: extra-{i}}}\nspec: {{cidr: 10.{o}.{b}.0/24, blockSize: 26}}\n---\napiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {{name: 10-{o}-{b}-0-26}}\nspec: {{cidr: 10.{o}.{b}.0/26, affinity: \"host:node-b\"}}\n"
        );
    }
    let extra_file = file(&dir, "extra.yaml");
    std::fs::write(&extra_file, &extra).unwrap();
    let count = |lab: &Lab| metrics(lab, "node-a").series().filter(|s| s.contains("pool=\"extra-")).count();
    wait_for("the extra pools' series", Duration::from_secs(20), || (count(&lab) == 1800).then_some(()));
    std::fs::write(&extra_file, "apiVersion: v1\nkind: List\nitems: []\n").unwrap();
    wait_for("the extra pools' series gone", Duration::from_secs(20), || (count(&lab) == 0).then_some(()));
    let m = metrics(&lab, "node-a");
    assert!(m.has(r#"routewarden_forwarded_packets_total{pool="ipip-always",path="tunnel"}"#), "the remaining pools keep theirs: {m}");
}

/// Row 15: a block on an unknown node appearing at runtime produced no route problem (findings
/// refreshed only when the ownership decision changed).
#[test]
fn row15_block_on_an_unknown_node_at_runtime_is_reported() {
    if skip_unless_root("row15_block_on_an_unknown_node_at_runtime_is_reported") {
        return;
    }
    let (lab, dir, _agent) = healthy(&[]);
    let m = metrics(&lab, "node-a");
    assert!(!m.has(r#"routewarden_route_problems{code="unknown-node"}"#), "{m}");
    assert_eq!(m.sum("routewarden_route_problems"), 0, "{m}");
    std::fs::write(
        file(&dir, "late.yaml"),
        "apiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {name: 10-244-50-0-26}\nspec: {cidr: 10.244.50.0/26, affinity: \"host:node-z\"}\n",
    )
    .unwrap();
    wait_for("unknown-node counted", Duration::from_secs(10), || {
        metrics(&lab, "node-a").is(r#"routewarden_route_problems{code="unknown-node"}"#, 1).then_some(())
    });
    routes_stay(&lab, &NODE_A_IPIP, Duration::from_secs(1));
}

/// Row 16: a FIFO as the datastore path hung forever. It is refused without being opened:
/// `explain` fails at once naming it; the agent answers `/readyz` (not synced) and `/healthz`.
#[test]
fn row16_fifo_datastore_path_is_refused_not_opened() {
    if skip_unless_root("row16_fifo_datastore_path_is_refused_not_opened") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("cluster.yaml");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_routewarden")).args(["explain", "--datastore"]).arg(format!("file:{}", fifo.display())).output().unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("a FIFO is neither a regular file nor a directory: refused"), "{err}");
    let lab = lab();
    let _agent = Agent::start(&lab, "node-a", &fifo, &[]);
    let (status, body) = wait_for("readyz answers", Duration::from_secs(10), || lab.http_get("node-a", PORT, "/readyz").ok());
    assert_eq!((status, body.lines().next()), (503, Some("datastore: not synced")));
    assert_eq!(lab.http_get("node-a", PORT, "/healthz").unwrap().0, 200);
    assert!(routes(&lab, "node-a", "80").is_empty());
}

/// Rows 8 and 9 without a lab: `bird-filter` fails closed on a pool it cannot classify, and
/// nothing from the datastore reaches its output or `explain`'s table unescaped.
#[test]
fn row08_bird_filter_rejects_an_unclassifiable_pool_and_exits_1() {
    let dir = copy_examples();
    let calico = file(&dir, "calico.yaml");
    let text = std::fs::read_to_string(&calico)
        .unwrap()
        .replace("cidr: 10.246.0.0/16, blockSize: 26, ipipMode: Never", "cidr: 10.246.0.0/16, blockSize: 26, ipipMode: Sometimes");
    std::fs::write(&calico, text).unwrap();
    let out = bird_filter(dir.path());
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("error: skipped: ")
            && stderr.contains(r#"IPPool "flat": spec.ipipMode: invalid value "Sometimes" (expected Never, Always or CrossSubnet)"#),
        "{stderr}"
    );
    // In the v4 filter, the reject comes before any pool line.
    let v4: Vec<&str> = stdout.lines().skip_while(|l| !l.starts_with("filter routewarden_kernel_programming_v4")).take_while(|l| *l != "}").collect();
    let first_pool_line = v4.iter().position(|l| l.trim_start().starts_with("if (net ~")).unwrap();
    assert_eq!(
        v4[first_pool_line].trim(),
        r#"if (net ~ 10.246.0.0/16) then { reject; } # unclassified IP pool: IPPool "flat": spec.ipipMode: invalid value "Sometimes" (expected Never, Always or CrossSubnet)"#
    );
    bird_parses(&stdout);
}

/// Row 9: names with `\n` or terminal escapes went verbatim into `bird-filter` (a live
/// `accept`) and terminal tables. They are invalid objects now (DNS-1123 names), and every
/// string from the datastore is escaped on the way out.
#[test]
fn row09_injected_names_never_reach_bird_config_or_the_terminal() {
    let dir = copy_examples();
    let calico = file(&dir, "calico.yaml");
    let mut text = std::fs::read_to_string(&calico).unwrap();
    text.push_str(
        "\n---\napiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: \"x\\nif (net ~ 0.0.0.0/0) then { accept; }\"}\nspec: {cidr: 10.251.0.0/16}\n",
    );
    text.push_str("---\napiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: \"\\e[31mred\"}\nspec: {cidr: 10.252.0.0/16}\n");
    let injected = text.replace("programClusterRoutes: EnabledIPIPOnly", "programClusterRoutes: \"Enabled\\nif (net ~ 0.0.0.0/0) then { accept; }\"");
    assert_ne!(injected, text, "the example sets Felix's programClusterRoutes");
    std::fs::write(&calico, injected).unwrap();
    let out = bird_filter(dir.path());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.lines().any(|l| l.trim_start().starts_with("if (net ~ 0.0.0.0/0)")), "{stdout}");
    assert!(!stdout.contains('\u{1b}'), "{stdout}");
    assert_eq!(out.status.code(), Some(1), "both pools are unclassified: {stdout}");
    bird_parses(&stdout);
    let out = Command::new(env!("CARGO_BIN_EXE_routewarden"))
        .args(["explain", "--node", "node-a", "--datastore"])
        .arg(format!("file:{}", dir.path().display()))
        .output()
        .unwrap();
    for text in [String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)] {
        assert!(!text.contains('\u{1b}'), "{text}");
        assert!(!text.lines().any(|l| l.trim_start().starts_with("if (net ~")), "{text}");
    }
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(r#"IPPool "\u{1b}[31mred": metadata.name: invalid value"#),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn bird_filter(dir: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_routewarden"))
        .args(["bird-filter", "--node", "node-a", "--datastore"])
        .arg(format!("file:{}", dir.display()))
        .output()
        .unwrap()
}

/// `bird -p` accepts `snippet` included from a minimal bird.conf (skipped without BIRD).
fn bird_parses(snippet: &str) {
    const BIRD: &str = "/usr/sbin/bird";
    if !Path::new(BIRD).exists() {
        routewarden_lab::skip("bird -p check", format_args!("{BIRD} not installed"));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let inc = dir.path().join("routewarden.conf");
    std::fs::write(&inc, snippet).unwrap();
    let conf = dir.path().join("bird.conf");
    std::fs::write(
        &conf,
        format!("router id 192.0.2.1;\ninclude \"{}\";\nprotocol device {{ }}\nprotocol kernel k4 {{ ipv4 {{ export filter routewarden_kernel_programming_v4; }}; }}\nprotocol kernel k6 {{ ipv6 {{ export filter routewarden_kernel_programming_v6; }}; }}\n", inc.display()),
    )
    .unwrap();
    let out = Command::new(BIRD).arg("-p").arg("-c").arg(&conf).output().unwrap();
    assert!(out.status.success(), "bird -p: {}\n{snippet}", String::from_utf8_lossy(&out.stderr));
}

/// `docs/bad-input.md` lists at least 50 bad-input kinds, each with a test that exists, and
/// every test of this file is listed there.
/// The agent for node-a on `dir`, with the settle flag and `extra`, as the shipped DaemonSet
/// runs it when `daemonset_caps`: its three capabilities (NET_ADMIN, BPF, PERFMON) and no other,
/// so file modes apply to it (no CAP_DAC_OVERRIDE) — `setpriv` sets the bounding set the
/// DaemonSet's `drop: [ALL]` + `add:` gives a root container.
fn agent(lab: &Lab, dir: &Path, extra: &[&str], daemonset_caps: bool) -> Agent {
    let mut flags = settle_flag().to_vec();
    flags.extend_from_slice(extra);
    if !daemonset_caps {
        return Agent::start(lab, "node-a", dir, &flags);
    }
    let mut cmd = lab.command("node-a", "setpriv");
    cmd.args(["--inh-caps=-all", "--bounding-set=-all,+net_admin,+bpf,+perfmon", "--", env!("CARGO_BIN_EXE_routewarden")])
        .args(["run", "--node", "node-a", "--metrics-addr", &format!("127.0.0.1:{PORT}"), "--log-format", "text", "--datastore"])
        .arg(format!("file:{}", dir.display()))
        .args(&flags)
        .env("RUST_LOG", "info")
        .stdin(std::process::Stdio::null());
    Agent::from_child(cmd.spawn().unwrap())
}

/// Stop `old` and start the agent again on the same files (a node reboot, a DaemonSet roll):
/// the new process has no last good version of anything. Returns it once ready.
fn restart(lab: &Lab, old: Agent, dir: &Path, extra: &[&str], daemonset_caps: bool) -> Agent {
    assert!(old.stop().success());
    let agent = agent(lab, dir, extra, daemonset_caps);
    wait_ready(lab, "node-a");
    agent
}

/// Edit `name` in `dir` with `edit`.
fn edit(dir: &Path, name: &str, edit: impl Fn(String) -> String) {
    let path = dir.join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    let new = edit(text.clone());
    assert_ne!(new, text, "the edit of {name} changed nothing");
    std::fs::write(path, new).unwrap();
}

/// Row 17: a Node whose address does not parse, across a restart. Only its
/// own addresses were frozen, so node-a's routes to node-b's blocks were deleted by the
/// restarted agent. Its blocks are frozen ground: not one route operation after the restart.
#[test]
fn row17_restart_with_a_rejected_node_keeps_its_blocks_routes() {
    if skip_unless_root("row17_restart_with_a_rejected_node_keeps_its_blocks_routes") {
        return;
    }
    let (lab, dir, agent) = healthy(&[]);
    edit(dir.path(), "nodes.yaml", |t| t.replace("projectcalico.org/IPv4Address: 10.0.0.12/24", "projectcalico.org/IPv4Address: not-an-ip/99"));
    // While running, its last good version stands in.
    routes_stay(&lab, &NODE_A_IPIP, Duration::from_secs(SETTLE + 1));
    let _agent = restart(&lab, agent, dir.path(), &[], false);
    routes_stay(&lab, &NODE_A_IPIP, Duration::from_secs(SETTLE * 2 + 1));
    assert_eq!(ops(&lab), (0, 0), "the restarted agent wrote nothing");
    let (_, body) = readyz(&lab);
    assert!(body.lines().any(|l| l == "frozen ground: 7 prefixes (nothing deleted or claimed there)"), "{body}");
    assert_eq!(metrics(&lab, "node-a").value("routewarden_deletions_held{reason=\"frozen\"}"), 2);
}

/// Row 18: a FelixConfiguration whose programClusterRoutes is a list, across
/// a restart. Felix's default (EnabledIPIPOnly) decided in its place, so the no-encap routes
/// the agent programmed under `Enabled` were deleted with /readyz 200. Both classes are frozen:
/// every route stays, nothing is written, and /readyz and the metric name the classes.
#[test]
fn row18_restart_with_an_unparsable_felix_configuration_keeps_both_classes() {
    if skip_unless_root("row18_restart_with_an_unparsable_felix_configuration_keeps_both_classes") {
        return;
    }
    let lab = lab();
    let dir = copy_examples();
    edit(dir.path(), "calico.yaml", |t| {
        t.replace("programClusterRoutes: EnabledIPIPOnly", "programClusterRoutes: Enabled")
            .replace("programClusterRoutes: EnabledNoEncapOnly", "programClusterRoutes: Disabled")
    });
    let agent = agent(&lab, dir.path(), &[], false);
    wait_ready(&lab, "node-a");
    let before = wait_for("node-a's eleven routes", Duration::from_secs(20), || Some(routes(&lab, "node-a", "80")).filter(|r| r.len() == 11));
    for noencap in ["blackhole 10.246.10.0/26 metric 1024", "10.246.30.0/26 via 10.0.0.13 dev eth0 metric 1024 onlink"] {
        assert!(before.iter().any(|r| r == noencap), "{before:?}");
    }
    edit(dir.path(), "calico.yaml", |t| t.replace("programClusterRoutes: Enabled\n", "programClusterRoutes: [Enabled]\n"));
    let _agent = restart(&lab, agent, dir.path(), &[], false);
    let want: Vec<&str> = before.iter().map(String::as_str).collect();
    routes_stay(&lab, &want, Duration::from_secs(SETTLE * 2 + 1));
    assert_eq!(ops(&lab), (0, 0));
    let (status, body) = readyz(&lab);
    let frozen: Vec<&str> = body.lines().filter(|l| l.starts_with("frozen class ")).map(|l| l.split(':').next().unwrap()).collect();
    assert_eq!((status, frozen), (200, vec!["frozen class ipip", "frozen class noencap"]), "{body}");
    let m = metrics(&lab, "node-a");
    assert_eq!((m.value(r#"routewarden_frozen_classes{class="ipip"}"#), m.value(r#"routewarden_frozen_classes{class="noencap"}"#)), (1, 1));
    // Fixed: the classes thaw, and the routes are already right (still no write).
    edit(dir.path(), "calico.yaml", |t| t.replace("programClusterRoutes: [Enabled]\n", "programClusterRoutes: Enabled\n"));
    wait_for("the classes thawed", Duration::from_secs(10), || metrics(&lab, "node-a").is(r#"routewarden_frozen_classes{class="noencap"}"#, 0).then_some(()));
    routes_stay(&lab, &want, Duration::from_secs(SETTLE + 1));
    assert_eq!(ops(&lab), (0, 0));
}

/// Row 19: a ClusterInformation whose calicoVersion is a list, across a
/// restart, on a 3.30 cluster whose BIRD programs the IPIP and no-encap routes. 3.33 was
/// assumed and BIRD's routes were claimed and replaced by routewarden's. Nothing of BIRD's is
/// touched and nothing is programmed.
#[test]
fn row19_restart_with_an_unreadable_release_line_takes_no_bird_route() {
    if skip_unless_root("row19_restart_with_an_unreadable_release_line_takes_no_bird_route") {
        return;
    }
    let lab = lab();
    let dir = copy_examples();
    edit(dir.path(), "calico.yaml", |t| t.replace("calicoVersion: v3.33.0", "calicoVersion: v3.30.2"));
    // BIRD's routes on node-a, as its kernel protocol writes them.
    for route in [
        "10.244.20.0/26 via 10.0.0.12 dev eth0 proto bird onlink",
        "10.244.40.0/26 via 10.0.1.14 dev tunl0 proto bird onlink",
        "10.245.20.0/26 via 10.0.0.12 dev tunl0 proto bird onlink",
        "10.246.30.0/26 via 10.0.0.13 dev eth0 proto bird onlink",
    ] {
        let args: Vec<&str> = ["route", "add"].into_iter().chain(route.split(' ')).collect();
        lab.ip("node-a", &args).unwrap();
    }
    let bird = routes(&lab, "node-a", "bird");
    assert_eq!(bird.len(), 4, "{bird:?}");
    let agent = agent(&lab, dir.path(), &[], false);
    wait_ready(&lab, "node-a");
    // On 3.30 Felix programs only VXLAN: routewarden in Felix's role programs nothing.
    routes_stay(&lab, &[], Duration::from_secs(2));
    edit(dir.path(), "calico.yaml", |t| t.replace("calicoVersion: v3.30.2", "calicoVersion: [v3.30.2]"));
    let _agent = restart(&lab, agent, dir.path(), &[], false);
    let end = Instant::now() + Duration::from_secs(SETTLE * 2 + 1);
    while Instant::now() < end {
        assert_eq!((routes(&lab, "node-a", "bird"), routes(&lab, "node-a", "80")), (bird.clone(), Vec::<String>::new()));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(ops(&lab), (0, 0));
    let (_, body) = readyz(&lab);
    assert!(body.lines().any(|l| l.starts_with("frozen class ipip: ClusterInformation \"default\": spec.calicoVersion:")), "{body}");
}

/// Row 20: an unreadable file (mode 000) under the shipped DaemonSet's
/// capabilities, which have no CAP_DAC_OVERRIDE. After the settle period its objects were
/// "removed" and node-a's routes deleted. Its last good content is kept while it stays
/// unreadable, every deletion is held (named on /readyz), and a restart with the file still
/// unreadable (never loaded) deletes nothing either.
#[test]
fn row20_an_unreadable_file_under_the_daemonsets_capabilities_deletes_nothing() {
    if skip_unless_root("row20_an_unreadable_file_under_the_daemonsets_capabilities_deletes_nothing") {
        return;
    }
    let lab = lab();
    let dir = copy_examples();
    let agent = agent(&lab, dir.path(), &[], true);
    wait_ready(&lab, "node-a");
    wait_for("node-a's seven routes", Duration::from_secs(20), || (routes(&lab, "node-a", "80") == NODE_A_IPIP).then_some(()));
    let ipam = file(&dir, "ipam.yaml");
    let mode = |m: u32| std::fs::set_permissions(&ipam, std::os::unix::fs::PermissionsExt::from_mode(m)).unwrap();
    mode(0o000);
    wait_for("the unreadable file reported", Duration::from_secs(10), || {
        (metrics(&lab, "node-a").value("routewarden_datastore_invalid_inputs") == 1).then_some(())
    });
    routes_stay(&lab, &NODE_A_IPIP, Duration::from_secs(SETTLE * 2 + 1));
    assert_eq!(ops(&lab), (7, 0));
    let (status, body) = readyz(&lab);
    let held = format!("deletions held: input {} cannot be read (Permission denied (os error 13)): its last good content is kept, and no deletion or rewrite can be justified while it is unreadable", ipam.display());
    assert!(status == 200 && body.lines().any(|l| l == held), "{status} {body}");
    let agent = restart(&lab, agent, dir.path(), &[], true);
    routes_stay(&lab, &NODE_A_IPIP, Duration::from_secs(SETTLE * 2 + 1));
    assert_eq!(ops(&lab), (0, 0));
    mode(0o644);
    wait_for("the file read again", Duration::from_secs(10), || (metrics(&lab, "node-a").value("routewarden_datastore_invalid_inputs") == 0).then_some(()));
    routes_stay(&lab, &NODE_A_IPIP, Duration::from_secs(SETTLE + 1));
    assert_eq!(ops(&lab), (0, 0));
    drop(agent);
}

/// Row 21: a duplicate Node in a new file that sorts first, with a bogus
/// address. It won, node-a's routes to node-b were rewritten through 10.0.0.99, and the error
/// blamed nodes.yaml. Both definitions are refused and named with their files; node-b's blocks
/// are frozen: not one route operation, while running or after a restart.
#[test]
fn row21_a_node_defined_twice_rewrites_nothing() {
    if skip_unless_root("row21_a_node_defined_twice_rewrites_nothing") {
        return;
    }
    let (lab, dir, agent) = healthy(&[]);
    let extra = dir.path().join("00-extra.yaml");
    std::fs::write(&extra, "apiVersion: v1\nkind: Node\nmetadata:\n  name: node-b\n  annotations: {projectcalico.org/IPv4Address: 10.0.0.99/24}\n").unwrap();
    wait_for("both definitions refused", Duration::from_secs(10), || {
        (metrics(&lab, "node-a").value("routewarden_datastore_invalid_objects") == 2).then_some(())
    });
    routes_stay(&lab, &NODE_A_IPIP, Duration::from_secs(SETTLE * 2 + 1));
    assert_eq!(ops(&lab), (7, 0));
    let (_, body) = readyz(&lab);
    let invalid: Vec<&str> = body.lines().filter(|l| l.starts_with("invalid: ")).collect();
    let message = "Node \"node-b\": defined more than once; every definition is refused until one is left";
    assert_eq!(invalid, [format!("invalid: {}: {message}", file(&dir, "nodes.yaml").display()), format!("invalid: {}: {message}", extra.display())]);
    let _agent = restart(&lab, agent, dir.path(), &[], false);
    routes_stay(&lab, &NODE_A_IPIP, Duration::from_secs(SETTLE * 2 + 1));
    assert_eq!(ops(&lab), (0, 0));
}

#[test]
fn bad_input_doc_names_tests_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let doc = std::fs::read_to_string(root.join("docs/bad-input.md")).unwrap();
    let rows: Vec<Vec<String>> = doc
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| #") && !l.starts_with("|---"))
        .map(|l| l.trim_matches('|').split(" | ").map(|c| c.trim().to_owned()).collect())
        .collect();
    assert!(rows.len() >= 50, "{} bad-input kinds in docs/bad-input.md", rows.len());
    let mut listed = std::collections::BTreeSet::new();
    for row in &rows {
        assert_eq!(row.len(), 4, "a row has 4 columns (#, bad input, what routewarden does, test): {row:?}");
        let test = row[3].trim_matches('`');
        let (file, func) = test.rsplit_once("::").unwrap_or_else(|| panic!("test column is <file>::<fn>: {test}"));
        let src = std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(src.contains(&format!("fn {func}(")), "{file} has no fn {func}");
        listed.insert(func.to_owned());
    }
    let this = std::fs::read_to_string(root.join("agent/tests/privileged/bad_input.rs")).unwrap();
    for func in this.lines().filter_map(|l| l.strip_prefix("fn row")).filter_map(|l| l.split('(').next()) {
        assert!(listed.contains(&format!("row{func}")), "docs/bad-input.md does not list row{func}");
    }
}
