//! The whole product on routing we did not write: four nodes (node-d behind a
//! router, in another subnet), workloads holding IPs from their nodes' blocks, a real BIRD 2
//! iBGP full mesh using the filters `routewarden bird-filter` prints, and routewarden on every
//! node in program mode on one shared file datastore. Scenarios run one at a time (each builds
//! its own lab: 14 namespaces, 4 BIRDs, 4 agents); see `cluster_support` for the layout.
//!
//! `RW_LAB_QUIET_SECS` sets scenario 1's no-flap window (default 60 s, as the issue asks).

mod cluster_support;

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cluster_support::{serial, set_program_cluster_routes, skip, wait_for, ClusterLab, Options, NODES, WORKLOADS};
use routewarden_lab::traffic::Probe;

/// The IPIP-class routes routewarden programs on node-a and node-d in the example cluster
/// (CrossSubnet: node-b/node-c natively on eth0, node-d through tunl0), exactly.
const NODE_A_IPIP: [&str; 7] = [
    "10.244.20.0/26 via 10.0.0.12 dev eth0 proto 80 metric 1024 onlink",
    "10.244.20.5 via 10.0.0.13 dev eth0 proto 80 metric 1024 onlink",
    "10.244.30.0/26 via 10.0.0.13 dev eth0 proto 80 metric 1024 onlink",
    "10.244.40.0/26 via 10.0.1.14 dev tunl0 proto 80 metric 1024 onlink",
    "10.245.20.0/26 via 10.0.0.12 dev tunl0 proto 80 metric 1024 onlink",
    "10.245.40.0/26 via 10.0.1.14 dev tunl0 proto 80 metric 1024 onlink",
    "blackhole 10.244.10.0/26 proto 80 metric 1024",
];

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

fn sorted_strs(v: &[&str]) -> Vec<String> {
    sorted(v.iter().map(|s| (*s).to_string()).collect())
}

/// Every same-pool pair of workloads on different nodes answers `tries` of `tries` echoes.
fn assert_all_pairs_talk(cl: &ClusterLab, tries: u32) {
    let mut failed = Vec::new();
    for (a, b) in ClusterLab::same_pool_pairs() {
        let ok = cl.echo(a.ip, b.ip, tries);
        if ok != tries {
            failed.push(format!("{} ({}) -> {} ({}): {ok}/{tries}", a.ip, a.node, b.ip, b.node));
        }
    }
    assert!(failed.is_empty(), "cross-node workload traffic failed: {failed:#?}");
}

/// `ip -o monitor route` in every node namespace, for a replay of what happened to prefixes.
struct RouteMonitor(Vec<(&'static str, Child, std::path::PathBuf)>);

impl RouteMonitor {
    fn start(cl: &ClusterLab) -> RouteMonitor {
        let mut v = Vec::new();
        for node in NODES {
            let path = cl.bird_dir.path().join(format!("{node}.monitor"));
            let out = std::fs::File::create(&path).unwrap();
            let child = cl.lab.command(node, "ip").args(["-o", "monitor", "route"]).stdout(out).stderr(Stdio::null()).spawn().unwrap();
            v.push((node, child, path));
        }
        std::thread::sleep(Duration::from_millis(200));
        RouteMonitor(v)
    }

    /// Wait until no node has seen a route event for `quiet` (panic after `deadline`): what is
    /// still settling after the lab started must not count as a change under test.
    fn wait_quiet(cl: &ClusterLab, quiet: Duration, deadline: Duration) {
        let mon = RouteMonitor::start(cl);
        let started = Instant::now();
        let size = |mon: &RouteMonitor| mon.0.iter().map(|(_, _, p)| std::fs::metadata(p).map_or(0, |m| m.len())).sum::<u64>();
        let (mut last_change, mut last_size) = (Instant::now(), size(&mon));
        loop {
            let now = size(&mon);
            if now != last_size {
                (last_change, last_size) = (Instant::now(), now);
            } else if last_change.elapsed() >= quiet {
                break;
            }
            assert!(started.elapsed() < deadline, "route events did not stop for {quiet:?} within {deadline:?}: {:#?}", mon.finish());
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("lab quiet (no route event for {quiet:?}) {:?} after the check began", started.elapsed());
        mon.finish();
    }

    /// Stop and return each node's event lines.
    fn finish(mut self) -> BTreeMap<&'static str, Vec<String>> {
        std::thread::sleep(Duration::from_millis(200));
        let mut out = BTreeMap::new();
        for (node, child, path) in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
            out.insert(*node, std::fs::read_to_string(&*path).unwrap().lines().map(str::to_string).collect());
        }
        out
    }
}

/// The destination of an `ip route` line as a prefix (`blackhole` skipped, `/32` added).
fn dst_of(route: &str) -> String {
    let dst = route.split_whitespace().find(|w| *w != "blackhole").unwrap_or("");
    if dst.contains('/') {
        dst.to_string()
    } else {
        format!("{dst}/32")
    }
}

/// The metric of an `ip route` line (0 when not shown).
fn metric_of(route: &str) -> u32 {
    let ws: Vec<&str> = route.split_whitespace().collect();
    ws.iter().position(|w| *w == "metric").and_then(|i| ws.get(i + 1)).and_then(|m| m.parse().ok()).unwrap_or(0)
}

/// Replay monitor lines for `prefixes` (kernel key: prefix + metric), starting from `start`
/// (prefix -> metrics present); panic naming the line after which a prefix had no route.
fn assert_never_absent(node: &str, lines: &[String], start: BTreeMap<String, BTreeSet<u32>>) {
    let mut present = start;
    for line in lines {
        let (deleted, route) = match line.strip_prefix("Deleted ") {
            Some(r) => (true, r),
            None => (false, line.as_str()),
        };
        let dst = dst_of(route);
        let Some(set) = present.get_mut(&dst) else { continue };
        let metric = metric_of(route);
        if deleted {
            set.remove(&metric);
        } else {
            set.insert(metric);
        }
        assert!(!set.is_empty(), "{node}: {dst} had no route after `{line}`; events: {lines:#?}");
    }
}

/// Scenario 1: the consistent split of the example cluster (routewarden programs IPIP, BIRD
/// no-encap). Each node has exactly its owners' routes, every same-pool workload pair talks
/// across nodes (IPv4 and IPv6, same subnet and through the router's other subnet), nothing
/// reports a conflict or flap for a full minute of traffic, and `routewarden audit` is clean.
#[test]
fn s1_consistent_split_traffic_flows_no_flap_audit_clean() {
    const TEST: &str = "s1_consistent_split_traffic_flows_no_flap_audit_clean";
    if skip(TEST) {
        return;
    }
    let _serial = serial();
    let cl = ClusterLab::start(Options::default());
    assert_eq!(sorted(cl.routes("node-a", "main", Some("80"))), sorted_strs(&NODE_A_IPIP));
    assert_eq!(
        sorted(cl.routes("node-a", "main", Some("bird"))),
        sorted_strs(&[
            "10.246.30.0/26 via 10.0.0.13 dev eth0 proto bird metric 1024",
            "blackhole 10.246.10.0/26 proto bird",
            "fd00:10:244:0:20::/122 via fd00:10::12 dev eth0 proto bird metric 1024 pref medium",
            "blackhole fd00:10:244:0:10::/122 dev lo proto bird metric 1024 pref medium",
            "fd00:10::/64 dev eth0 proto bird metric 1024 pref medium",
        ]),
        "node-a: BIRD programs no-encap (and its direct route), nothing of the IPIP class"
    );
    // node-d, in the other subnet: IPIP through the tunnel; BIRD resolves no-encap through
    // the router (`gateway recursive`), and has no IPv6 address, so no IPv6 routes.
    assert_eq!(
        sorted(cl.routes("node-d", "main", Some("bird"))),
        sorted_strs(&["10.246.10.0/26 via 10.0.1.1 dev eth0 proto bird metric 1024", "10.246.30.0/26 via 10.0.1.1 dev eth0 proto bird metric 1024"])
    );
    assert_eq!(
        sorted(cl.routes("node-d", "main", Some("80"))),
        sorted_strs(&[
            "10.244.10.0/26 via 10.0.0.11 dev tunl0 proto 80 metric 1024 onlink",
            "10.244.20.0/26 via 10.0.0.12 dev tunl0 proto 80 metric 1024 onlink",
            "10.244.20.5 via 10.0.0.13 dev tunl0 proto 80 metric 1024 onlink",
            "10.244.30.0/26 via 10.0.0.13 dev tunl0 proto 80 metric 1024 onlink",
            "10.245.20.0/26 via 10.0.0.12 dev tunl0 proto 80 metric 1024 onlink",
            "blackhole 10.244.40.0/26 proto 80 metric 1024",
            "blackhole 10.245.40.0/26 proto 80 metric 1024",
        ])
    );

    let quiet = Duration::from_secs(std::env::var("RW_LAB_QUIET_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(60));
    let a = WORKLOADS[0];
    let d = WORKLOADS[3];
    let probe =
        Probe::start(&cl.lab.workload_ns_of(a.ip.parse().unwrap()).unwrap(), a.ip.parse().unwrap(), d.ip.parse().unwrap(), Duration::from_millis(20)).unwrap();
    let started = Instant::now();
    assert_all_pairs_talk(&cl, 3);
    std::thread::sleep(quiet.saturating_sub(started.elapsed()));
    let result = probe.finish().unwrap();
    eprintln!("{TEST}: probe node-a -> node-d over {quiet:?}: {} sent, {} echoed", result.sent, result.echoed);
    assert!(result.sent > 0 && result.lost.is_empty(), "{result:?}");
    for node in NODES {
        let m = cl.metrics(node);
        assert!(m.sum("routewarden_route_writes_total") > 0, "{node}: the churn watch counted no write at all:\n{m}");
        for name in ["routewarden_route_conflicts_total", "routewarden_route_flaps_total"] {
            assert_eq!(m.sum(name), 0, "{node}: {name}\n{m}");
        }
        assert_eq!(m.value("routewarden_flapping_prefixes"), 0, "{node}\n{m}");
        assert_eq!(cl.routes_in_state(node, "held"), 0, "{node}: held routes\n{m}");
        let (clean, out) = cl.audit(node, &[]);
        assert!(clean, "{node}: audit:\n{out}");
    }
}

/// Scenario 2: an inconsistent pair (FelixConfiguration `Enabled`: routewarden programs
/// IPIP and no-encap; BGPConfiguration gives BIRD no-encap too). `explain` reports it before
/// anything runs. Running, BIRD holds the no-encap keys and routewarden, which writes new
/// keys create-exclusive, refuses to overwrite them: no fight, but every node reports the
/// routes held by another writer and the double-programmed finding. Fixing the pair clears
/// both, with no write conflict or flap at any time.
#[test]
fn s2_inconsistent_pair_reported_then_fixed() {
    const TEST: &str = "s2_inconsistent_pair_reported_then_fixed";
    if skip(TEST) {
        return;
    }
    let _serial = serial();
    // A short hand-over grace: node-d has no IPv6 address, so its BIRD never takes over the
    // IPv6 no-encap routes routewarden hands back; they go when the grace period ends.
    let options = Options { agents: false, agent_flags: vec!["--handover-grace".into(), "3".into()], ..Options::default() };
    let cl = ClusterLab::start_with(options, |dir| set_program_cluster_routes(dir, "Enabled", "EnabledNoEncapOnly"));
    let out = Command::new(env!("CARGO_BIN_EXE_routewarden"))
        .args(["explain", "--node", "node-a", "--datastore"])
        .arg(format!("file:{}", cl.datastore.path().display()))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "explain exits 1 on double-programmed:\n{text}");
    let findings: Vec<&str> = text.lines().skip_while(|l| *l != "Findings").skip(1).take_while(|l| !l.is_empty()).collect();
    assert_eq!(
        findings,
        [
            "  ok     consistent         ipip     routewarden alone programs the IPIP cluster routes of pools default-ipv4-ippool, ipip-always",
            "  ERROR  double-programmed  noencap  bird and routewarden all program the no-encap cluster routes of pools flat, flat-ipv6 and fight over them: Felix field Enabled (field), BIRD field EnabledNoEncapOnly (field) (routewarden in Felix's place)",
            "  ok     consistent         vxlan    felix alone programs the VXLAN cluster routes of pools vxlan",
        ],
        "explain:\n{text}"
    );
    // BIRD has programmed no-encap everywhere; now the agents start.
    wait_for("BIRD's no-encap route on node-a", Duration::from_secs(30), || {
        cl.routes("node-a", "main", Some("bird")).iter().any(|r| r.starts_with("10.246.30.0/26")).then_some(())
    });
    let mut cl = cl;
    for node in NODES {
        cl.start_agent(node);
    }
    for node in NODES {
        cl.wait_ready(node);
    }
    // Held routes per node: BIRD's no-encap routes at routewarden's key (metric 1024), as the
    // kernel shows them (IPv4 blackholes of BIRD's static protocol have metric 0: no clash).
    let held = |node: &str| -> u64 {
        let flat = |r: &&String| r.trim_start_matches("blackhole ").starts_with("10.246.") || r.trim_start_matches("blackhole ").starts_with("fd00:10:244:");
        cl.routes(node, "main", Some("bird")).iter().filter(flat).filter(|r| r.contains(" metric 1024")).count() as u64
    };
    for node in NODES {
        let got = wait_for(&format!("{node}: routes held by BIRD reported"), Duration::from_secs(20), || {
            let n = cl.routes_in_state(node, "held");
            (n > 0 && n == held(node)).then_some(n)
        });
        eprintln!("{TEST}: {node}: {got} routes held by BIRD");
        let m = cl.metrics(node);
        assert_eq!(m.value(r#"routewarden_ownership_findings{code="double-programmed",class="noencap"}"#), 1, "{node}\n{m}");
    }
    // routewarden overwrote none of BIRD's routes; only its own block's IPv4 blackhole got in
    // (BIRD's static blackhole sits at metric 0, another key: a duplicate the audit reports).
    let ours: Vec<String> = cl.routes("node-a", "main", Some("80")).into_iter().filter(|r| r.contains("10.246.")).collect();
    assert_eq!(ours, ["blackhole 10.246.10.0/26 proto 80 metric 1024"]);
    // Fix: routewarden back to IPIP only.
    cl.set_program_cluster_routes("EnabledIPIPOnly", "EnabledNoEncapOnly");
    for node in NODES {
        wait_for(&format!("{node}: nothing held after the fix"), Duration::from_secs(20), || {
            (cl.routes_in_state(node, "held") == 0 && !cl.metrics(node).has(r#"routewarden_ownership_findings{code="double-programmed",class="noencap"}"#))
                .then_some(())
        });
        let m = cl.metrics(node);
        let findings = m.family("routewarden_ownership_findings");
        assert_eq!(
            findings,
            [
                (r#"routewarden_ownership_findings{code="consistent",class="ipip"}"#, 1),
                (r#"routewarden_ownership_findings{code="consistent",class="noencap"}"#, 1),
                (r#"routewarden_ownership_findings{code="consistent",class="vxlan"}"#, 1),
            ],
            "{node}: only consistent findings after the fix\n{m}"
        );
        assert_eq!(cl.route_conflicts(node), 0, "{node}: no write conflict at any time");
        wait_for(&format!("{node}: audit clean after the fix"), Duration::from_secs(30), || cl.audit(node, &[]).0.then_some(()));
    }
    assert_all_pairs_talk(&cl, 2);
}

/// Scenario 3: no component owns no-encap (FelixConfiguration `EnabledIPIPOnly`,
/// BGPConfiguration `Disabled`). The audit reports every missing no-encap route with the
/// reason, and traffic to the flat pools fails while IPIP traffic flows.
#[test]
fn s3_unowned_class_audit_says_why_and_traffic_fails() {
    const TEST: &str = "s3_unowned_class_audit_says_why_and_traffic_fails";
    if skip(TEST) {
        return;
    }
    let _serial = serial();
    let cl = ClusterLab::start_with(Options::default(), |dir| set_program_cluster_routes(dir, "EnabledIPIPOnly", "Disabled"));
    let (clean, out) = cl.audit("node-a", &[]);
    eprintln!("{TEST}: audit node-a:\n{out}");
    assert!(!clean, "{out}");
    // Routewarden's seven IPIP routes are there; node-a's two remote no-encap blocks have no
    // route, and the audit says that nobody programs them and why.
    let why = "no component programs the no-encap cluster routes of pools flat, flat-ipv6: Felix field EnabledIPIPOnly (field), BIRD field Disabled (field); cross-node traffic to these pools fails";
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "audit of table 254: 7 expected routes, 7 kernel routes on cluster prefixes".to_owned(),
            format!("unowned          10.246.30.0/26       nobody programs 10.246.30.0/26: {why}"),
            format!("unowned          fd00:10:244:0:20::/122 nobody programs fd00:10:244:0:20::/122: {why}"),
        ]
    );
    assert_eq!(cl.echo("10.246.10.5", "10.246.30.5", 2), 0, "no-encap traffic needs routes nobody programs");
    assert_eq!(cl.echo("fd00:10:244:0:10::5", "fd00:10:244:0:20::5", 2), 0);
    assert_eq!(cl.echo("10.244.10.5", "10.244.40.5", 2), 2, "IPIP traffic is unaffected");
    let m = cl.metrics("node-a");
    assert_eq!(m.value(r#"routewarden_ownership_findings{code="unowned",class="noencap"}"#), 1, "{m}");
}

/// The IPIP-pool cluster routes of `node` now: prefix -> metrics.
fn ipip_routes_now(cl: &ClusterLab, node: &str) -> BTreeMap<String, BTreeSet<u32>> {
    let mut out: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
    for r in cl.routes(node, "main", None) {
        if !(r.starts_with("10.244.") || r.starts_with("10.245.")) || r.contains(" dev cali") {
            continue;
        }
        out.entry(dst_of(&r)).or_default().insert(metric_of(&r));
    }
    out
}

fn ipip_probes(cl: &ClusterLab) -> Vec<(String, Probe)> {
    [("10.244.10.5", "10.244.40.5"), ("10.244.10.5", "10.244.20.6"), ("10.245.20.5", "10.245.40.5"), ("10.244.40.5", "10.244.20.5")]
        .iter()
        .map(|(a, b)| {
            let from = a.parse().unwrap();
            (format!("{a} -> {b}"), Probe::start(&cl.lab.workload_ns_of(from).unwrap(), from, b.parse().unwrap(), Duration::from_millis(10)).unwrap())
        })
        .collect()
}

/// Scenario 4: live handover of the IPIP class BIRD -> routewarden and back, by editing the
/// cluster files (and regenerating BIRD's filter) while four probes run; each handover
/// loses no packet and no IPIP prefix is ever without a route on any node.
#[test]
fn s4_live_handover_bird_to_routewarden_and_back_loses_nothing() {
    const TEST: &str = "s4_live_handover_bird_to_routewarden_and_back_loses_nothing";
    if skip(TEST) {
        return;
    }
    let _serial = serial();
    let cl = ClusterLab::start_with(Options::default(), |dir| set_program_cluster_routes(dir, "Disabled", "Enabled"));
    wait_for("BIRD's IPIP route via tunl0 on node-a", Duration::from_secs(30), || {
        cl.routes("node-a", "main", Some("bird")).iter().any(|r| r == "10.244.40.0/26 via 10.0.1.14 dev tunl0 proto bird metric 1024 onlink").then_some(())
    });
    assert_all_pairs_talk(&cl, 2);
    let all_ipip = |proto: &str, node: &str| {
        cl.routes(node, "main", Some(proto))
            .iter()
            .filter(|r| r.starts_with("10.244.") || r.starts_with("10.245."))
            .filter(|r| !r.starts_with("blackhole") && !r.contains(" dev cali"))
            .count()
    };

    for (phase, felix, bgp, proto) in
        [("BIRD -> routewarden", "EnabledIPIPOnly", "EnabledNoEncapOnly", "80"), ("routewarden -> BIRD", "Disabled", "Enabled", "bird")]
    {
        // Every node's IPIP-pool routes (not blackholes, not workloads) before the handover.
        let before: BTreeMap<&str, BTreeMap<String, BTreeSet<u32>>> = NODES.iter().map(|n| (*n, ipip_routes_now(&cl, n))).collect();
        let counts: BTreeMap<&str, usize> = NODES.iter().map(|n| (*n, all_ipip("80", n) + all_ipip("bird", n))).collect();
        let mon = RouteMonitor::start(&cl);
        let probes = ipip_probes(&cl);
        std::thread::sleep(Duration::from_millis(300));
        let started = Instant::now();
        // The operator's order: the cluster files first (routewarden claims BIRD's routes by
        // replace, or steps aside for BIRD), then BIRD's regenerated filter.
        cl.set_program_cluster_routes(felix, bgp);
        let other = if proto == "80" { "bird" } else { "80" };
        let converged = |node: &str| all_ipip(proto, node) == counts[node] && all_ipip(other, node) == 0;
        if proto == "80" {
            // Every node's routewarden holds the class before any BIRD lets go of it.
            for node in NODES {
                wait_for(&format!("{phase}: {node} IPIP routes proto {proto}"), Duration::from_secs(20), || converged(node).then_some(()));
            }
        }
        cl.reconfigure_birds();
        for node in NODES {
            wait_for(&format!("{phase}: {node} IPIP routes proto {proto} only"), Duration::from_secs(20), || converged(node).then_some(()));
        }
        let took = started.elapsed();
        std::thread::sleep(Duration::from_millis(500));
        let mut lost = 0;
        for (name, p) in probes {
            let r = p.finish().unwrap();
            eprintln!("{TEST}: {phase}: {name}: {} sent, {} echoed, lost {:?}", r.sent, r.echoed, r.lost);
            assert!(r.sent > 50, "{name}: {r:?}");
            lost += r.lost.len();
        }
        let events = mon.finish();
        for node in NODES {
            assert_never_absent(node, &events[node], before[node].clone());
        }
        eprintln!("{TEST}: {phase}: handed over in {took:?}, {lost} packets lost");
        assert_eq!(lost, 0, "{phase}: packets lost during the handover");
    }
    assert_eq!(sorted(cl.routes("node-a", "main", Some("80"))), Vec::<String>::new(), "routewarden programs nothing after handing IPIP back");
    assert_all_pairs_talk(&cl, 2);
}

/// Scenario 5: upgrade-style handover. BIRD (owning IPIP) is killed on every node, one after
/// another (each leaves the routes it had, the ones still running withdraw those learned from
/// a dead peer); meanwhile node-d's `ipip-always` block is released. routewarden becomes the
/// IPIP owner: it removes BIRD's leftover for the released block and replaces the rest, and
/// scenario 4's probes on the live blocks lose nothing right after the takeover.
#[test]
fn s5_upgrade_handover_after_bird_killed_removes_released_leftovers() {
    const TEST: &str = "s5_upgrade_handover_after_bird_killed_removes_released_leftovers";
    if skip(TEST) {
        return;
    }
    let _serial = serial();
    let mut cl = ClusterLab::start_with(Options::default(), |dir| set_program_cluster_routes(dir, "Disabled", "Enabled"));
    wait_for("BIRD's IPIP routes on node-a", Duration::from_secs(30), || {
        cl.routes("node-a", "main", Some("bird")).iter().any(|r| r.starts_with("10.245.40.0/26 via 10.0.1.14 dev tunl0")).then_some(())
    });
    for b in cl.birds.values_mut() {
        b.kill();
    }
    // BIRD's routes persist after SIGKILL: watched for a second. (Only the routes a BIRD had
    // when it died: the BIRDs still running withdraw what they learned from a dead peer, so
    // node-d's, killed last, keeps none of its peers' routes, and traffic to and from node-d
    // is cut until routewarden takes over there.)
    let end = Instant::now() + Duration::from_secs(1);
    while Instant::now() < end {
        assert!(
            cl.routes("node-a", "main", Some("bird")).iter().any(|r| r.starts_with("10.245.40.0/26 via 10.0.1.14 dev tunl0")),
            "BIRD's routes persist after SIGKILL"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Release node-d's ipip-always block (IPAMBlock and its affinity), then hand IPIP over.
    let ipam = cl.file("ipam.yaml");
    let text = std::fs::read_to_string(&ipam).unwrap();
    let kept: Vec<&str> = text.split("\n  - ").filter(|item| !item.contains("10-245-40-0-26") && !item.contains("cidr: 10.245.40.0/26")).collect();
    // Atomically (write + rename), as set_program_cluster_routes does: an agent reading a
    // half-written ipam.yaml could see a shorter but valid block list.
    let tmp = cl.file(".ipam.yaml.tmp");
    std::fs::write(&tmp, kept.join("\n  - ")).unwrap();
    std::fs::rename(&tmp, &ipam).unwrap();
    cl.set_program_cluster_routes("EnabledIPIPOnly", "EnabledNoEncapOnly");
    let want: Vec<String> = sorted_strs(&NODE_A_IPIP).into_iter().filter(|r| !r.contains("10.245.40.0/26")).collect();
    wait_for("node-a: routewarden owns IPIP, leftovers gone", Duration::from_secs(20), || {
        (sorted(cl.routes("node-a", "main", Some("80"))) == want
            && !cl.routes("node-a", "main", Some("bird")).iter().any(|r| r.starts_with("10.244.") || r.starts_with("10.245.")))
        .then_some(())
    });
    // Every node has taken over: BIRD's IPIP routes gone or replaced, and every IPIP route the
    // agent wants programmed. (Waiting for the first alone passes at once on a node that had
    // no BIRD route left, node-d: the first echoes then raced routewarden's first write there,
    // which is how "about one run in fifteen" lost one of them.)
    for node in NODES {
        wait_for(&format!("{node}: routewarden programs every IPIP route, no BIRD IPIP route left"), Duration::from_secs(20), || {
            let bird = cl.routes(node, "main", Some("bird"));
            let m = cl.metrics(node);
            let series = |state: &str| format!(r#"routewarden_routes{{family="ipv4",class="ipip",state="{state}"}}"#);
            let programmed = m.has(&series("desired")) && m.value(&series("desired")) > 0 && m.is(&series("programmed"), m.value(&series("desired")));
            (programmed && !bird.iter().any(|r| (r.starts_with("10.244.") || r.starts_with("10.245.")) && !r.starts_with("blackhole"))).then_some(())
        });
    }
    // Traffic to the live blocks right after the takeover, with scenario 4's probes for a
    // second: not one datagram may be lost. The released block's pair is left out: it is
    // meant to stop.
    let probes: Vec<(String, Probe)> = ipip_probes(&cl).into_iter().filter(|(name, _)| !name.contains("10.245.40.5")).collect();
    assert_eq!(probes.len(), 3);
    std::thread::sleep(Duration::from_secs(1));
    let mut lost = 0;
    for (name, p) in probes {
        let r = p.finish().unwrap();
        eprintln!("{TEST}: {name}: {} sent, {} echoed, lost {:?}", r.sent, r.echoed, r.lost);
        assert!(r.sent > 50, "{name}: {r:?}");
        lost += r.lost.len();
    }
    assert_eq!(lost, 0, "packets lost right after the takeover");
    assert_eq!(cl.echo("10.245.20.5", "10.245.40.5", 2), 0, "the released block is routed nowhere");
}

/// Scenario 6: a dedicated cluster-route table. routewarden programs IPIP into table 48 (a
/// rule looks it up after main), BIRD no-encap into main; neither touches the other's table,
/// all traffic flows, and the audit checks each writer in its own table.
#[test]
fn s6_table_48_for_routewarden_bird_in_main() {
    const TEST: &str = "s6_table_48_for_routewarden_bird_in_main";
    if skip(TEST) {
        return;
    }
    let _serial = serial();
    let options = Options { agent_flags: vec!["--route-table".into(), "48".into()], ..Options::default() };
    let cl = ClusterLab::start_with(Options { agents: false, ..options.clone() }, |_| {});
    let mut cl = cl;
    for node in NODES {
        // After main (32766), so workload /32s in main win over the block blackholes in 48.
        cl.lab.ip(node, &["rule", "add", "pref", "32767", "lookup", "48"]).unwrap();
        cl.start_agent(node);
    }
    for node in NODES {
        cl.wait_ready(node);
    }
    let table48: Vec<String> = NODE_A_IPIP.iter().map(|r| (*r).to_string()).collect();
    assert_eq!(sorted(cl.routes("node-a", "48", None)), sorted(table48));
    assert_eq!(cl.routes("node-a", "main", Some("80")), Vec::<String>::new(), "nothing of routewarden's in main");
    let bird_main = sorted_strs(&[
        "10.246.30.0/26 via 10.0.0.13 dev eth0 proto bird metric 1024",
        "blackhole 10.246.10.0/26 proto bird",
        "fd00:10:244:0:20::/122 via fd00:10::12 dev eth0 proto bird metric 1024 pref medium",
        "blackhole fd00:10:244:0:10::/122 dev lo proto bird metric 1024 pref medium",
        "fd00:10::/64 dev eth0 proto bird metric 1024 pref medium",
    ]);
    wait_for("BIRD's no-encap routes (and its direct route) in main on node-a", Duration::from_secs(30), || {
        (sorted(cl.routes("node-a", "main", Some("bird"))) == bird_main).then_some(())
    });
    assert_all_pairs_talk(&cl, 2);
    for node in NODES {
        assert_eq!(cl.routes_in_state(node, "held"), 0);
        assert_eq!(cl.route_conflicts(node), 0);
        // With the agents' role, routewarden's routes are audited in 48 and BIRD's in main.
        let (clean, out) = cl.audit(node, &["--role", "felix", "--route-table", "48"]);
        assert!(clean, "{node}: audit:\n{out}");
    }
}

/// BIRD's BGP routes per prefix on `node`: prefix -> the peers (protocol names) it came from.
fn bgp_sources(cl: &ClusterLab, node: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for table in ["master4", "master6"] {
        let text = cl.birds[node].birdc(&["show", "route", "table", table]).unwrap();
        let mut current = String::new();
        for line in text.lines() {
            let t = line.trim_start();
            if !line.starts_with(char::is_whitespace) && !line.starts_with("Table") && !line.is_empty() {
                current = t.split_whitespace().next().unwrap_or("").to_string();
            }
            if let Some(p) = t.split('[').nth(1).and_then(|r| r.split_whitespace().next()) {
                if p.starts_with("node_") {
                    out.entry(current.clone()).or_default().insert(p.to_string());
                }
            }
        }
    }
    out
}

/// Scenario 7 (S07): with the generated iBGP export reject, every node learns each block
/// only from its owner; without it, the routes routewarden programmed (which BIRD's kernel
/// protocol learns) are re-advertised by every node.
#[test]
fn s7_blocks_learned_only_from_their_owner() {
    const TEST: &str = "s7_blocks_learned_only_from_their_owner";
    if skip(TEST) {
        return;
    }
    let _serial = serial();
    let owner = |prefix: &str| -> &'static str {
        match prefix {
            p if p.starts_with("10.244.10.") || p.starts_with("10.246.10.") || p.starts_with("fd00:10:244:0:10:") => "node_a",
            p if p.starts_with("10.244.20.5/") => "node_c",
            p if p.starts_with("10.244.20.") || p.starts_with("10.245.20.") || p.starts_with("10.247.20.") || p.starts_with("fd00:10:244:0:20:") => "node_b",
            p if p.starts_with("10.244.30.") || p.starts_with("10.246.30.") => "node_c",
            p if p.starts_with("10.244.40.") || p.starts_with("10.245.40.") => "node_d",
            _ => "",
        }
    };
    let survivors = ["node-a", "node-b", "node-c"];
    // Every BGP route of a cluster prefix the survivors learn from another node than its owner.
    let wrong = |cl: &ClusterLab| -> Vec<String> {
        let mut wrong = Vec::new();
        for node in survivors {
            for (prefix, from) in bgp_sources(cl, node) {
                let o = owner(&prefix);
                if o.is_empty() {
                    continue;
                }
                for peer in from.iter().filter(|p| !p.starts_with(o)) {
                    wrong.push(format!("{node} learns {prefix} from {peer} (owner {o})"));
                }
            }
        }
        wrong
    };
    for reject in [true, false] {
        let mut cl = ClusterLab::start(Options { export_reject: reject, ..Options::default() });
        wait_for("node-a learns node-d's block from node-d", Duration::from_secs(30), || {
            bgp_sources(&cl, "node-a").get("10.244.40.0/26").is_some_and(|from| from.contains("node_d_v4")).then_some(())
        });
        // The owner's BIRD goes away (crash, upgrade): its peers withdraw what it advertised,
        // and the route routewarden programmed, which each BIRD's kernel protocol learned,
        // becomes their best route for the block.
        cl.birds.get_mut("node-d").unwrap().kill();
        let killed = Instant::now();
        wait_for("the survivors dropped what node-d advertised", Duration::from_secs(30), || {
            survivors.iter().all(|n| bgp_sources(&cl, n).values().all(|from| !from.contains("node_d_v4"))).then_some(())
        });
        if reject {
            // Nothing is re-advertised: watched for 4 s (BIRD's kernel scan is 1 s) at every poll.
            let end = Instant::now() + Duration::from_secs(4);
            while Instant::now() < end {
                let w = wrong(&cl);
                assert!(w.is_empty(), "{w:#?}");
                assert!(!bgp_sources(&cl, "node-b").contains_key("10.244.40.0/26"), "nobody else advertises node-d's block");
                std::thread::sleep(Duration::from_millis(250));
            }
            eprintln!("{TEST}: export reject on: no re-advertisement in the 4 s after node-d's routes were withdrawn");
        } else {
            // Which node's re-advertisement wins is a race; that one happens is not.
            let w = wait_for("a survivor re-advertising node-d's block", Duration::from_secs(30), || {
                let w = wrong(&cl);
                w.iter().any(|w| w.contains(" learns 10.244.40.0/26 from node_")).then_some(w)
            });
            eprintln!(
                "{TEST}: export reject off: {} re-advertisements once node-d's routes were withdrawn ({:?} after its BIRD was killed): {w:#?}",
                w.len(),
                killed.elapsed()
            );
        }
    }
}

/// S04: restarting routewarden on node-b (SIGTERM, start again with the same state) makes no
/// node delete, re-add or rewrite any route.
#[test]
fn s04_agent_restart_changes_no_route_on_any_node() {
    const TEST: &str = "s04_agent_restart_changes_no_route_on_any_node";
    if skip(TEST) {
        return;
    }
    let _serial = serial();
    let mut cl = ClusterLab::start(Options::default());
    RouteMonitor::wait_quiet(&cl, Duration::from_secs(2), Duration::from_mins(1));
    let mon = RouteMonitor::start(&cl);
    let agent = cl.agents.remove("node-b").unwrap();
    assert!(agent.stop().success());
    cl.start_agent("node-b");
    cl.wait_ready("node-b");
    std::thread::sleep(Duration::from_secs(2));
    let events = mon.finish();
    for (node, lines) in events {
        assert_eq!(lines, Vec::<String>::new(), "{node}: route events during node-b's agent restart");
    }
}

/// S08: a stale BlockAffinity names node-b for node-d's block `10.244.40.0/26`; routes follow
/// the IPAMBlock's affinity (node-d), never ECMP, and the conflict is reported.
#[test]
fn s08_stale_affinity_follows_the_block() {
    const TEST: &str = "s08_stale_affinity_follows_the_block";
    if skip(TEST) {
        return;
    }
    let _serial = serial();
    let cl = ClusterLab::start_with(Options::default(), |dir| {
        let path = dir.join("ipam.yaml");
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("  - {apiVersion: crd.projectcalico.org/v1, kind: BlockAffinity, metadata: {name: node-b-10-244-40-0-26}, spec: {cidr: 10.244.40.0/26, node: node-b, type: host, state: confirmed, deleted: \"false\"}}\n");
        std::fs::write(&path, text).unwrap();
    });
    let on_a: Vec<String> = cl.routes("node-a", "main", None).into_iter().filter(|r| r.contains("10.244.40.0/26")).collect();
    assert_eq!(on_a, ["10.244.40.0/26 via 10.0.1.14 dev tunl0 proto 80 metric 1024 onlink"]);
    assert_eq!(cl.echo("10.244.10.5", "10.244.40.5", 2), 2);
    let m = cl.metrics("node-a");
    // The block is named in the log and in explain; the metric counts by code.
    assert_eq!(m.value(r#"routewarden_route_problems{code="affinity-conflict"}"#), 1, "{m}");
}

/// S06: a second writer adds the same no-encap prefix at metric 0 beside BIRD's 1024 (as
/// Felix did before PR 13856), and a remote route that out-ranks a local workload's /32; the
/// audit reports the duplicate and the out-ranking route.
#[test]
fn s06_duplicate_at_another_metric_is_reported() {
    const TEST: &str = "s06_duplicate_at_another_metric_is_reported";
    if skip(TEST) {
        return;
    }
    let _serial = serial();
    let cl = ClusterLab::start(Options::default());
    cl.lab.ip("node-a", &["route", "add", "10.246.30.0/26", "via", "10.0.0.13", "dev", "eth0", "proto", "static", "metric", "0"]).unwrap();
    let (clean, out) = cl.audit("node-a", &[]);
    eprintln!("{TEST}: {out}");
    assert!(!clean);
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "audit of table 254: 11 expected routes, 12 kernel routes on cluster prefixes",
            "duplicate        10.246.30.0/26       2 routes for 10.246.30.0/26 (protocol, metric): {(4, 0), (12, 1024)}",
            "foreign-writer   10.246.30.0/26       proto 4 writes cluster prefix 10.246.30.0/26",
        ]
    );
    // The metric-0 route wins: traffic still reaches node-c (same next hop), nothing flaps.
    assert_eq!(cl.echo("10.246.10.5", "10.246.30.5", 2), 2);
    assert_eq!(cl.route_conflicts("node-a"), 0);
}

/// S01: a second BIRD on node-a exports node-c's no-encap block at the same key (table,
/// prefix, metric 1024) with another next hop. Each BIRD's kernel scan finds the other's
/// route where its own should be and replaces it (BIRD 2: delete, then add), every second.
/// The churn watch reports the conflict as `bird+bird` and the prefix as flapping; once the
/// second BIRD is gone the gauge returns to 0 and the lab BIRD's route stays; routewarden,
/// which shares no protocol with them, deletes nothing meanwhile.
#[test]
fn s01_two_birds_fight_over_a_block() {
    const TEST: &str = "s01_two_birds_fight_over_a_block";
    if skip(TEST) {
        return;
    }
    let _serial = serial();
    let window = ["--route-watch-window".to_string(), "3".to_string()];
    let cl = ClusterLab::start(Options { agent_flags: window.to_vec(), ..Options::default() });
    let deletes = r#"routewarden_route_operations_total{op="delete",result="ok"}"#;
    let deletes_before = cl.metrics("node-a").value(deletes);
    let conf = "router id 10.0.0.111;\n\
                protocol device { scan time 2; }\n\
                protocol kernel { learn off; metric 0; scan time 1; ipv4 { import none; export filter { krt_metric = 1024; accept; }; }; }\n\
                protocol static { ipv4; route 10.246.30.0/26 via 10.0.0.12; }\n";
    let mut second = routewarden_lab::bird::Bird::start(Some(&cl.lab.node_ns("node-a")), cl.bird_dir.path(), "node-a-second", conf).unwrap();
    let started = Instant::now();
    let conflict = r#"routewarden_route_conflicts_total{family="ipv4",writers="bird+bird"}"#;
    wait_for("bird+bird conflict and a flapping prefix on node-a", Duration::from_secs(15), || {
        let m = cl.metrics("node-a");
        (m.at_least(conflict, 1) && m.value("routewarden_flapping_prefixes") >= 1).then_some(())
    });
    eprintln!("{TEST}: bird+bird conflict and flap reported {:?} after the second BIRD started", started.elapsed());
    second.kill();
    wait_for("flapping gauge back to 0", Duration::from_secs(20), || (cl.metrics("node-a").value("routewarden_flapping_prefixes") == 0).then_some(()));
    wait_for("the lab BIRD's route back", Duration::from_secs(20), || {
        (cl.routes("node-a", "main", Some("bird")).iter().any(|r| r == "10.246.30.0/26 via 10.0.0.13 dev eth0 proto bird metric 1024")).then_some(())
    });
    let deletes_after = cl.metrics("node-a").value(deletes);
    assert_eq!(deletes_after, deletes_before, "routewarden deleted routes during the BIRD fight");
}
