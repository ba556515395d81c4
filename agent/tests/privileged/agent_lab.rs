//! The agent binary end to end in the network-namespace lab: the example cluster, one node
//! namespace per node, `routewarden run` started as a process inside a node namespace, and its
//! effects read back from the kernel (`ip route`) and from its own `/metrics` and `/readyz`.

mod lab_support;

use std::fmt::Write as _;
use std::io::BufRead;
use std::time::{Duration, Instant};

use lab_support::{copy_examples, example_dir, lab, metrics, routes, routes_stay, wait_for, wait_ready, Agent, NODE_A_IPIP, PORT};
use routewarden_lab::skip_unless_root;

#[test]
fn felix_role_programs_ipip_and_a_restart_writes_nothing() {
    if skip_unless_root("felix_role_programs_ipip_and_a_restart_writes_nothing") {
        return;
    }
    let lab = lab();
    let agent = Agent::start(&lab, "node-a", &example_dir(), &[]);
    let ready = wait_ready(&lab, "node-a");
    // The release line from the example's ClusterInformation (`--calico-version auto`).
    assert!(ready.starts_with("datastore: synced\nroutes: first apply done\ncalico: 3.33 (ClusterInformation default: v3.33.0)\n"), "{ready}");
    // IPIP CrossSubnet pool: same-subnet peers via eth0, node-d (10.0.1.0/24) via tunl0;
    // IPIP Always pool: everything via tunl0; own block blackholed; borrowed /32 to node-c.
    assert_eq!(routes(&lab, "node-a", "80"), NODE_A_IPIP);
    let m = metrics(&lab, "node-a");
    assert_eq!(m.value(r#"routewarden_routes{family="ipv4",class="ipip",state="desired"}"#), 7, "{m}");
    assert_eq!(m.value(r#"routewarden_routes{family="ipv4",class="ipip",state="programmed"}"#), 7, "{m}");
    assert_eq!(m.value(r#"routewarden_route_operations_total{op="replace",result="ok"}"#), 7, "{m}");
    assert_eq!(m.value("routewarden_datastore_synced"), 1);
    assert_eq!(m.value(r#"routewarden_calico_version_info{version="3.33",rules="3.33",source="cluster-information"}"#), 1, "{m}");
    assert_eq!(m.value(r#"routewarden_ownership_findings{code="consistent",class="ipip"}"#), 1);
    assert_eq!(m.value(r#"routewarden_ownership_findings{code="consistent",class="noencap"}"#), 1);
    assert!(agent.stop().success());
    // Routes survive the agent (S04: a restart must not remove them) ...
    assert_eq!(routes(&lab, "node-a", "80"), NODE_A_IPIP);
    // ... and the restarted agent finds them in place and writes nothing.
    let agent = Agent::start(&lab, "node-a", &example_dir(), &[]);
    wait_ready(&lab, "node-a");
    let m = metrics(&lab, "node-a");
    assert_eq!(m.value(r#"routewarden_route_operations_total{op="replace",result="ok"}"#), 0, "{m}");
    assert_eq!(m.value(r#"routewarden_route_operations_total{op="delete",result="ok"}"#), 0, "{m}");
    assert_eq!(m.value(r#"routewarden_routes{family="ipv4",class="ipip",state="programmed"}"#), 7, "{m}");
    assert!(agent.stop().success());
}

#[test]
fn bird_role_programs_noencap_v4_and_v6() {
    if skip_unless_root("bird_role_programs_noencap_v4_and_v6") {
        return;
    }
    let lab = lab();
    let _agent = Agent::start(&lab, "node-b", &example_dir(), &["--role", "bird", "--route-protocol", "201"]);
    wait_ready(&lab, "node-b");
    assert_eq!(
        routes(&lab, "node-b", "201"),
        [
            "10.246.10.0/26 via 10.0.0.11 dev eth0 metric 1024 onlink",
            "10.246.30.0/26 via 10.0.0.13 dev eth0 metric 1024 onlink",
            "fd00:10:244:0:10::/122 via fd00:10::11 dev eth0 metric 1024 onlink pref medium",
            "blackhole fd00:10:244:0:20::/122 dev lo metric 1024 pref medium",
        ]
    );
    let m = metrics(&lab, "node-b");
    assert_eq!(m.value(r#"routewarden_routes{family="ipv6",class="noencap",state="programmed"}"#), 2, "{m}");
    assert_eq!(m.value(r#"routewarden_routes{family="ipv4",class="noencap",state="programmed"}"#), 2, "{m}");
}

#[test]
fn broken_input_keeps_routes_and_freezes_what_it_names_until_fixed() {
    if skip_unless_root("broken_input_keeps_routes_and_freezes_what_it_names_until_fixed") {
        return;
    }
    let lab = lab();
    let dir = copy_examples();
    // Files settle after 2 s (this is about frozen ground; bad_input.rs tests the default).
    let _agent = Agent::start(&lab, "node-a", dir.path(), &["--settle-period", "2"]);
    wait_ready(&lab, "node-a");
    assert_eq!(routes(&lab, "node-a", "80"), NODE_A_IPIP);

    // Break one file (S10 for the file datastore) and release node-d's block in another.
    let calico = dir.path().join("calico.yaml");
    let good = std::fs::read_to_string(&calico).unwrap();
    std::fs::write(&calico, format!("{good}\n---\nkind: IPPool\nspec: [unclosed\n")).unwrap();
    let ipam = dir.path().join("ipam.yaml");
    let ipam_good = std::fs::read_to_string(&ipam).unwrap();
    let released = ipam_good.replace(
        "spec: {cidr: 10.245.40.0/26, affinity: \"host:node-d\", deleted: false}",
        "spec: {cidr: 10.245.40.0/26, affinity: \"host:node-d\", deleted: true}",
    );
    assert_ne!(released, ipam_good);
    std::fs::write(&ipam, &released).unwrap();
    // One broken input does not unready the agent: its last good content is used and the
    // CIDRs its text names (every pool's) are frozen ground.
    wait_for("one invalid input", Duration::from_secs(20), || (metrics(&lab, "node-a").value("routewarden_datastore_invalid_inputs") == 1).then_some(()));
    let m = metrics(&lab, "node-a");
    assert_eq!(m.value("routewarden_datastore_synced"), 1, "{m}");
    let (status, body) = lab.http_get("node-a", PORT, "/readyz").unwrap();
    assert_eq!(status, 200, "{body}");
    let invalid: Vec<&str> = body.lines().filter(|l| l.starts_with("invalid: ")).collect();
    assert_eq!(invalid.len(), 1, "{body}");
    assert!(invalid[0].starts_with(&format!("invalid: {}:", calico.display())), "{body}");
    wait_for("the released block's delete held in frozen ground", Duration::from_secs(20), || {
        (metrics(&lab, "node-a").value(r#"routewarden_deletions_held{reason="frozen"}"#) == 1).then_some(())
    });
    // Nothing deleted while the input is broken: the released block's route stays, watched for
    // twice the settle period (2 s), past which a delete outside frozen ground would go out.
    routes_stay(&lab, "node-a", "80", &NODE_A_IPIP, Duration::from_secs(4));

    // Fixed: the frozen ground thaws and the released block's route goes.
    std::fs::write(&calico, good).unwrap();
    wait_for("route to the released block removed", Duration::from_secs(20), || (routes(&lab, "node-a", "80").len() == NODE_A_IPIP.len() - 1).then_some(()));
    let expected: Vec<&str> = NODE_A_IPIP.iter().copied().filter(|r| !r.starts_with("10.245.40.0/26")).collect();
    assert_eq!(routes(&lab, "node-a", "80"), expected);
    let m = metrics(&lab, "node-a");
    assert_eq!((m.value("routewarden_datastore_synced"), m.value("routewarden_datastore_invalid_inputs")), (1, 0), "{m}");
}

#[test]
fn explain_and_audit_commands_report_the_lab() {
    if skip_unless_root("explain_and_audit_commands_report_the_lab") {
        return;
    }
    let lab = lab();
    let ds = format!("file:{}", example_dir().display());
    // Before anything is programmed, the one-shot audit (Felix vs BIRD) finds every route missing.
    let out = lab.command("node-a", env!("CARGO_BIN_EXE_routewarden")).args(["audit", "--node", "node-a", "--datastore", &ds, "-o", "json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((report["table"].as_u64(), report["expected"].as_u64(), report["kernel_routes"].as_u64()), (Some(254), Some(11), Some(0)), "{report:#}");
    assert_eq!(report["skipped"], serde_json::json!([]), "{report:#}");
    // Felix's seven IPIP routes and BIRD's four no-encap ones (two v4, two v6), each missing.
    let findings: Vec<(&str, &str, &str)> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["code"].as_str().unwrap(), f["owner"].as_str().unwrap(), f["expected"].as_str().unwrap()))
        .collect();
    assert_eq!(
        findings,
        [
            ("missing", "felix", "blackhole 10.244.10.0/26 proto 80 (felix)"),
            ("missing", "felix", "10.244.20.0/26 via 10.0.0.12 dev eth0 proto 80 (felix)"),
            ("missing", "felix", "10.244.20.5/32 via 10.0.0.13 dev eth0 proto 80 (felix)"),
            ("missing", "felix", "10.244.30.0/26 via 10.0.0.13 dev eth0 proto 80 (felix)"),
            ("missing", "felix", "10.244.40.0/26 via 10.0.1.14 dev tunl0 proto 80 (felix)"),
            ("missing", "felix", "10.245.20.0/26 via 10.0.0.12 dev tunl0 proto 80 (felix)"),
            ("missing", "felix", "10.245.40.0/26 via 10.0.1.14 dev tunl0 proto 80 (felix)"),
            ("missing", "bird", "blackhole 10.246.10.0/26 proto 12 (bird)"),
            ("missing", "bird", "10.246.30.0/26 via 10.0.0.13 dev eth0 proto 12 (bird)"),
            ("missing", "bird", "blackhole fd00:10:244:0:10::/122 proto 12 (bird)"),
            ("missing", "bird", "fd00:10:244:0:20::/122 via fd00:10::12 dev eth0 proto 12 (bird)"),
        ],
        "{report:#}"
    );
    // After routewarden programs IPIP (role felix) and a stand-in BIRD programs no-encap, the
    // audit with routewarden as the Felix side is clean.
    let agent = Agent::start(&lab, "node-a", &example_dir(), &[]);
    wait_ready(&lab, "node-a");
    for r in [
        "blackhole 10.246.10.0/26",
        "10.246.30.0/26 via 10.0.0.13 dev eth0",
        "blackhole fd00:10:244:0:10::/122",
        "fd00:10:244:0:20::/122 via fd00:10::12 dev eth0",
    ] {
        let mut args: Vec<&str> = if r.contains(':') { vec!["-6", "route", "add"] } else { vec!["route", "add"] };
        args.extend(r.split(' '));
        args.extend(["proto", "bird", "metric", "1024"]);
        lab.ip("node-a", &args).unwrap();
    }
    let out =
        lab.command("node-a", env!("CARGO_BIN_EXE_routewarden")).args(["audit", "--node", "node-a", "--role", "felix", "--datastore", &ds]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        text.lines().collect::<Vec<_>>(),
        [
            "audit of table 254: 11 expected routes, 11 kernel routes on cluster prefixes",
            "clean: every owner's routes are present and nothing else writes cluster prefixes",
        ]
    );
    drop(agent);
}

#[test]
fn audit_mode_programs_nothing_and_reports_findings() {
    if skip_unless_root("audit_mode_programs_nothing_and_reports_findings") {
        return;
    }
    let lab = lab();
    let _agent = Agent::start(&lab, "node-a", &example_dir(), &["--mode", "audit", "--resync-interval", "1"]);
    wait_ready(&lab, "node-a");
    // Felix (IPIP, 7 routes on node-a) and BIRD (no-encap: 2 v4 + 2 v6) have programmed
    // nothing yet: 11 missing, and routewarden itself wrote nothing.
    let m = wait_for("first audit", Duration::from_secs(20), || {
        let m = metrics(&lab, "node-a");
        m.has(r#"routewarden_audit_findings{code="missing"}"#).then_some(m)
    });
    assert_eq!(m.value(r#"routewarden_audit_findings{code="missing"}"#), 11, "{m}");
    assert_eq!(m.value(r#"routewarden_audit_findings{code="foreign-writer"}"#), 0, "{m}");
    assert!(routes(&lab, "node-a", "80").is_empty());
    // Felix's and BIRD's routes appear (written here by `ip` with their protocols), plus a
    // foreign proto-17 route on a cluster prefix (S05): the audit follows within a resync.
    for r in NODE_A_IPIP {
        let mut args = vec!["route", "add"];
        args.extend(r.split(' '));
        args.extend(["proto", "80"]);
        lab.ip("node-a", &args).unwrap();
    }
    for r in [
        "blackhole 10.246.10.0/26",
        "10.246.30.0/26 via 10.0.0.13 dev eth0",
        "blackhole fd00:10:244:0:10::/122",
        "fd00:10:244:0:20::/122 via fd00:10::12 dev eth0",
    ] {
        let mut args: Vec<&str> = if r.contains(':') { vec!["-6", "route", "add"] } else { vec!["route", "add"] };
        args.extend(r.split(' '));
        args.extend(["proto", "bird", "metric", "1024"]);
        lab.ip("node-a", &args).unwrap();
    }
    lab.ip("node-a", &["route", "add", "10.246.99.0/26", "via", "10.0.0.12", "dev", "eth0", "proto", "17"]).unwrap();
    let m = wait_for("audit with only the foreign writer left", Duration::from_secs(20), || {
        let m = metrics(&lab, "node-a");
        (m.value(r#"routewarden_audit_findings{code="missing"}"#) == 0).then_some(m)
    });
    assert_eq!(m.value(r#"routewarden_audit_findings{code="foreign-writer"}"#), 1, "{m}");
    assert_eq!(m.value(r#"routewarden_audit_findings{code="duplicate"}"#), 0, "{m}");
    // Audit mode writes nothing: the operations counter is declared and has counted nothing.
    assert_eq!(m.value(r#"routewarden_route_operations_total{op="replace",result="ok"}"#), 0, "audit mode must not write: {m}");
    assert_eq!(m.sum("routewarden_route_operations_total"), 0, "audit mode must not write: {m}");
}

#[test]
fn losing_ipip_to_bird_hands_over_per_prefix_without_a_gap() {
    if skip_unless_root("losing_ipip_to_bird_hands_over_per_prefix_without_a_gap") {
        return;
    }
    let lab = lab();
    let dir = copy_examples();
    // Files settle after 2 s: the grace period's end deletes, and deletes wait for the files to
    // settle (30 s by default); stepping aside and the release by BIRD's route do not. The grace
    // period (10 s) is far beyond what stepping aside and the release take, even loaded.
    let grace = Duration::from_secs(10);
    let _agent = Agent::start(&lab, "node-a", dir.path(), &["--handover-grace", "10", "--settle-period", "2"]);
    wait_ready(&lab, "node-a");
    assert_eq!(routes(&lab, "node-a", "80"), NODE_A_IPIP);

    // The operator hands IPIP to BIRD (Felix Disabled, BGP Enabled: the pre-3.33 default).
    let calico = dir.path().join("calico.yaml");
    let text = std::fs::read_to_string(&calico).unwrap();
    let edited = text
        .replace("programClusterRoutes: EnabledIPIPOnly", "programClusterRoutes: Disabled")
        .replace("programClusterRoutes: EnabledNoEncapOnly", "programClusterRoutes: Enabled");
    assert_ne!(edited, text);
    let started = Instant::now();
    std::fs::write(&calico, edited).unwrap();
    wait_for("ownership change seen", Duration::from_secs(20), || {
        (metrics(&lab, "node-a").value(r#"routewarden_routes{family="ipv4",class="ipip",state="desired"}"#) == 0).then_some(())
    });
    // Our routes step aside to metric 1025 (make before break: BIRD 2 adds with NLM_F_EXCL and
    // would get EEXIST at our key) and stay there while BIRD has not programmed its own yet.
    let stepped: Vec<String> = NODE_A_IPIP.iter().map(|r| r.replace("metric 1024", "metric 1025")).collect();
    wait_for("routes stepped aside to metric 1025", Duration::from_secs(20), || (routes(&lab, "node-a", "80") == stepped).then_some(()));
    // ... BIRD adds its route for one prefix at 1024, the key we freed: ours for that prefix
    // goes, the others stay.
    lab.ip("node-a", &["route", "add", "10.245.20.0/26", "via", "10.0.0.12", "dev", "tunl0", "onlink", "proto", "bird", "metric", "1024"]).unwrap();
    wait_for("our 10.245.20.0/26 released", Duration::from_secs(20), || {
        (!routes(&lab, "node-a", "80").iter().any(|r| r.starts_with("10.245.20.0/26"))).then_some(())
    });
    let released = started.elapsed();
    eprintln!("10.245.20.0/26 released {released:?} after the ownership change");
    // Released by the new owner's route, not by the grace period: before it ended, and the
    // others (which the grace period would have taken at the same moment) are all still there.
    assert!(released < grace, "released after {released:?}, not before the grace period ({grace:?})");
    let rest: Vec<&String> = stepped.iter().filter(|r| !r.starts_with("10.245.20.0/26")).collect();
    assert_eq!(routes(&lab, "node-a", "80").iter().collect::<Vec<_>>(), rest);
    assert_eq!(routes(&lab, "node-a", "bird"), ["10.245.20.0/26 via 10.0.0.12 dev tunl0 metric 1024 onlink"]);
    // The grace period bounds the wait for the prefixes BIRD never programmed.
    wait_for("grace period over", grace + Duration::from_secs(20), || routes(&lab, "node-a", "80").is_empty().then_some(()));
    assert!(started.elapsed() >= grace, "the rest went after {:?}, before the grace period ended", started.elapsed());
    assert_eq!(routes(&lab, "node-a", "bird"), ["10.245.20.0/26 via 10.0.0.12 dev tunl0 metric 1024 onlink"]);
}

#[test]
fn the_agent_attaches_its_tc_probe_in_the_lab_and_counts() {
    if skip_unless_root("the_agent_attaches_its_tc_probe_in_the_lab_and_counts") {
        return;
    }
    if routewarden::bpf::embedded_object().is_none() {
        routewarden_lab::skip(
            "the_agent_attaches_its_tc_probe_in_the_lab_and_counts",
            format_args!("built without the BPF object; `cargo xtask test` embeds it"),
        );
        return;
    }
    let lab = lab();
    // The probe is off by default: --tc-count turns it on.
    let _agent = Agent::start(&lab, "node-a", &example_dir(), &["--tc-count", "--tc-devices", "eth0"]);
    let ready = wait_ready(&lab, "node-a");
    assert!(ready.contains("bpf tc_count: ready\n"), "{ready}");
    lab.in_netns("node-a", || {
        let s = std::net::UdpSocket::bind("10.0.0.11:0").unwrap();
        for _ in 0..20 {
            s.send_to(b"probe", "10.0.0.12:9").unwrap();
        }
    })
    .unwrap();
    // 20 datagrams plus the ARP/ND packets the kernel sends on its own: at least 20.
    let m = wait_for("tc_count to see the datagrams", Duration::from_secs(20), || {
        let m = metrics(&lab, "node-a");
        (m.value("routewarden_tc_count_packets_total") >= 20).then_some(m)
    });
    assert_eq!(m.value(r#"routewarden_bpf_program_attached{program="tc_count"}"#), 1);
}

#[test]
fn the_agent_reports_a_second_writer_fighting_over_its_route() {
    if skip_unless_root("the_agent_reports_a_second_writer_fighting_over_its_route") {
        return;
    }
    if routewarden::bpf::embedded_object().is_none() {
        routewarden_lab::skip(
            "the_agent_reports_a_second_writer_fighting_over_its_route",
            format_args!("built without the BPF object; `cargo xtask test` embeds it"),
        );
        return;
    }
    let lab = lab();
    let _agent = Agent::start(&lab, "node-a", &example_dir(), &["--route-watch-window", "2", "--route-watch-backend", "socket-filter"]);
    let ready = wait_ready(&lab, "node-a");
    assert!(
        ready.contains(
            "bpf route_watch: ready\nbpf route_watch: socket-filter: writers named by process in the kernel; route write outcomes not visible: a socket filter sees the kernel's notifications, sent only for writes that succeeded, so refused writes (a failing writer) are not seen (fentry and kprobe see them)\n"
        ),
        "{ready}"
    );
    let m = metrics(&lab, "node-a");
    assert_eq!(m.value(r#"routewarden_route_watch_backend_info{backend="socket-filter"}"#), 1, "{m}");
    assert_eq!(m.value("routewarden_flapping_prefixes"), 0, "a cold start is no flap: {m}");
    // A BIRD-like writer overwrites our route to node-b's IPIP block, then another program
    // puts it back as ours would look, five writes in all.
    fight(&lab);
    // The gauge and the episode counters follow the events at once; the kernel's write
    // counters are read every second.
    let m = wait_for("conflict and flap reported", Duration::from_secs(20), || {
        let m = metrics(&lab, "node-a");
        let flapping = m.value("routewarden_flapping_prefixes") >= 1;
        let conflicts = m.at_least(r#"routewarden_route_conflicts_total{family="ipv4",writers="self+bird"}"#, 1);
        let writes = m.at_least(r#"routewarden_route_writes_total{family="ipv4",op="replace",writer="bird"}"#, 3);
        (flapping && conflicts && writes).then_some(m)
    });
    assert!(m.value(r#"routewarden_route_flaps_total{family="ipv4"}"#) >= 1, "{m}");
    // Classed by process: `bird`'s three writes exactly. The other program's writes at
    // protocol 80 are `other` (`felix` before, by the protocol) when the kernel sees them: one
    // that finds the agent has already put its route back is identical to it, and the kernel
    // sends no notification for an identical IPv4 replace.
    assert_eq!(m.value(r#"routewarden_route_writes_total{family="ipv4",op="replace",writer="bird"}"#), 3, "{m}");
    assert_eq!(m.value(r#"routewarden_route_writes_total{family="ipv4",op="replace",writer="felix"}"#), 0, "{m}");
    assert_eq!(m.sum("routewarden_route_writes_unattributed_total"), 0, "{m}");
    // The fight stops: the gauge returns to 0 once the window (2 s) has passed.
    wait_for("flapping_prefixes back to 0", Duration::from_secs(20), || (metrics(&lab, "node-a").value("routewarden_flapping_prefixes") == 0).then_some(()));
}

/// The fight of the route-watch tests: over node-a's route to node-b's IPIP block, a
/// BIRD-like writer (`ip` run as `bird`, protocol 12) replaces it three times and another
/// program (`ip`, protocol 80, as ours would look) twice, alternately, 50 ms apart.
fn fight(lab: &routewarden_lab::Lab) {
    let bird = routewarden_lab::program_named("ip", "bird");
    for i in 0..5 {
        let (program, proto) = if i % 2 == 0 { (bird.to_str().unwrap(), "bird") } else { ("ip", "80") };
        let out = lab
            .command("node-a", program)
            .args(["route", "replace", "10.245.20.0/26", "via", "10.0.0.12", "dev", "tunl0", "onlink", "metric", "1024", "proto", proto])
            .output()
            .unwrap();
        assert!(out.status.success(), "{program}: {}", String::from_utf8_lossy(&out.stderr));
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Another program's 4,000 adds and deletes of `proto static` /32s outside
/// every IP pool (a VPN client, say) were 2,001 conflicts (`static+static`), 2,001 flapping
/// prefixes and as many WARN lines: a routing watch that pages on them gets switched off.
/// They are counted as writes and raise no episode; a fight over a cluster route right after
/// still does. The agent runs as shipped (default window and backend).
#[test]
fn foreign_writes_outside_the_pools_raise_no_episode() {
    if skip_unless_root("foreign_writes_outside_the_pools_raise_no_episode") {
        return;
    }
    if routewarden::bpf::embedded_object().is_none() {
        routewarden_lab::skip("foreign_writes_outside_the_pools_raise_no_episode", format_args!("built without the BPF object; `cargo xtask test` embeds it"));
        return;
    }
    let lab = lab();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("agent.log");
    let _agent = Agent::spawn(&lab, "node-a", &example_dir(), &format!("127.0.0.1:{PORT}"), &[], Some(&log));
    let ready = wait_ready(&lab, "node-a");
    assert!(ready.contains("bpf route_watch: ready\n"), "{ready}");
    // Two processes: one adds 1,000 /32s, the other deletes, re-adds and deletes them.
    let prefix = |i: usize| format!("192.168.{}.{}/32", 76 + i / 250, i % 250 + 1);
    let batch = |name: &str, ops: &[&str]| {
        let path = dir.path().join(name);
        let mut text = String::new();
        for op in ops {
            for i in 0..1_000 {
                let _ = writeln!(text, "route {op} {} dev eth0 proto static", prefix(i));
            }
        }
        std::fs::write(&path, text).unwrap();
        let out = lab.command("node-a", "ip").arg("-batch").arg(&path).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    batch("add.batch", &["add"]);
    batch("churn.batch", &["del", "add", "del"]);
    // Both `ip` processes are `other` (not `static`, the routes' protocol): 2,000 adds and
    // 2,000 deletes, every one attributed.
    let (adds, deletes) = (
        r#"routewarden_route_writes_total{family="ipv4",op="add",writer="other"}"#,
        r#"routewarden_route_writes_total{family="ipv4",op="delete",writer="other"}"#,
    );
    let m = wait_for("the 4,000 writes counted", Duration::from_secs(20), || {
        let m = metrics(&lab, "node-a");
        (m.at_least(adds, 2_000) && m.at_least(deletes, 2_000)).then_some(m)
    });
    assert_eq!((m.value(adds), m.value(deletes), m.sum("routewarden_route_writes_unattributed_total")), (2_000, 2_000, 0), "{m}");
    assert_eq!(m.value(r#"routewarden_route_writes_total{family="ipv4",op="add",writer="static"}"#), 0, "{m}");
    assert_eq!(
        (m.sum("routewarden_route_conflicts_total"), m.sum("routewarden_route_flaps_total"), m.value("routewarden_flapping_prefixes")),
        (0, 0, 0),
        "{m}"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    let warned = text.lines().filter(|l| l.contains("route conflict") || l.contains("route flap")).count();
    assert_eq!(warned, 0);
    // A BIRD-like writer over node-a's own route to node-b's IPIP block is still a fight.
    fight(&lab);
    let m = wait_for("the fight reported", Duration::from_secs(20), || {
        let m = metrics(&lab, "node-a");
        m.at_least(r#"routewarden_route_conflicts_total{family="ipv4",writers="self+bird"}"#, 1).then_some(m)
    });
    assert_eq!(m.value(r#"routewarden_route_conflicts_total{family="ipv4",writers="other+other"}"#), 0, "{m}");
}

/// `eth0`'s address removed and put back. Removing a link's last IPv4 address
/// makes the kernel flush the routes through it (`fib_disable_ip`) without a notification, and
/// they came back only at the next periodic resync (~80 s) with `/readyz` 200 meanwhile.
/// Address events now start a resync: the three routes via eth0 are written again within a
/// second or two (onlink routes need no address), and putting the address back costs nothing.
#[test]
fn routes_flushed_with_an_address_come_back_at_once() {
    if skip_unless_root("routes_flushed_with_an_address_come_back_at_once") {
        return;
    }
    let lab = lab();
    let _agent = Agent::start(&lab, "node-a", &example_dir(), &[]);
    wait_ready(&lab, "node-a");
    wait_for("node-a's seven routes", Duration::from_secs(20), || (routes(&lab, "node-a", "80") == NODE_A_IPIP).then_some(()));
    let writes = || metrics(&lab, "node-a").value(r#"routewarden_route_operations_total{op="replace",result="ok"}"#);
    assert_eq!(writes(), 7);
    lab.ip("node-a", &["addr", "del", "10.0.0.11/24", "dev", "eth0"]).unwrap();
    let gone = Instant::now();
    wait_for("the three routes via eth0 written again", Duration::from_secs(10), || {
        (writes() == 10 && routes(&lab, "node-a", "80") == NODE_A_IPIP).then_some(())
    });
    assert!(gone.elapsed() < Duration::from_secs(3), "repaired after {:?}", gone.elapsed());
    lab.ip("node-a", &["addr", "add", "10.0.0.11/24", "dev", "eth0"]).unwrap();
    routes_stay(&lab, "node-a", "80", &NODE_A_IPIP, Duration::from_secs(3));
    assert_eq!(writes(), 10);
}

#[test]
fn events_command_streams_wrong_path_samples_with_the_block() {
    if skip_unless_root("events_command_streams_wrong_path_samples_with_the_block") {
        return;
    }
    if routewarden::bpf::embedded_object().is_none() {
        routewarden_lab::skip(
            "events_command_streams_wrong_path_samples_with_the_block",
            format_args!("built without the BPF object; `cargo xtask test` embeds it"),
        );
        return;
    }
    let lab = lab();
    // node-a's IPIP Always block of node-b must go through tunl0; send it out of eth0 instead.
    lab.ip("node-a", &["route", "add", "10.245.20.0/26", "via", "10.0.0.12", "dev", "eth0"]).unwrap();
    let mut child = lab
        .command("node-a", env!("CARGO_BIN_EXE_routewarden"))
        .args(["events", "-o", "json", "--datastore"])
        .arg(format!("file:{}", example_dir().display()))
        .args(["--node", "node-a", "--route-watch-backend", "socket-filter"])
        .stdout(std::process::Stdio::piped())
        .stdin(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // Traffic until the sample arrives (the watch needs a moment to attach).
    let deadline = Instant::now() + Duration::from_secs(30);
    let event = loop {
        assert!(Instant::now() < deadline, "no wrong-path event from `routewarden events`");
        lab.in_netns("node-a", || {
            let s = std::net::UdpSocket::bind("10.0.0.11:0").unwrap();
            for _ in 0..5 {
                let _ = s.send_to(b"probe", "10.245.20.7:9");
            }
        })
        .unwrap();
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(300)) {
            let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            if v["event"] == "wrong-path" {
                break v;
            }
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(event["block"], "10.245.20.0/26", "{event}");
    assert_eq!(event["dst"], "10.245.20.7", "{event}");
    assert_eq!(event["pool"], "ipip-always", "{event}");
    assert_eq!((event["expected"].as_str(), event["actual"].as_str()), (Some("tunnel"), Some("host")), "{event}");
    assert_eq!(event["device"], "eth0", "{event}");
}

#[test]
fn every_example_node_gets_exactly_its_routes() {
    if skip_unless_root("every_example_node_gets_exactly_its_routes") {
        return;
    }
    let lab = lab();
    // node-a is covered above; one agent per other node, each in its own namespace.
    let expected: [(&str, &[&str]); 3] = [
        (
            "node-b",
            &[
                "10.244.10.0/26 via 10.0.0.11 dev eth0 metric 1024 onlink",
                "blackhole 10.244.20.0/26 metric 1024",
                // node-b's own block, IP borrowed by node-c: a /32 to node-c (Felix's
                // NonAffineAllocations), native because node-c shares node-b's subnet.
                "10.244.20.5 via 10.0.0.13 dev eth0 metric 1024 onlink",
                "10.244.30.0/26 via 10.0.0.13 dev eth0 metric 1024 onlink",
                "10.244.40.0/26 via 10.0.1.14 dev tunl0 metric 1024 onlink",
                "blackhole 10.245.20.0/26 metric 1024",
                "10.245.40.0/26 via 10.0.1.14 dev tunl0 metric 1024 onlink",
            ],
        ),
        (
            // node-c holds the borrowed 10.244.20.5 itself: no cluster route for it.
            "node-c",
            &[
                "10.244.10.0/26 via 10.0.0.11 dev eth0 metric 1024 onlink",
                "10.244.20.0/26 via 10.0.0.12 dev eth0 metric 1024 onlink",
                "blackhole 10.244.30.0/26 metric 1024",
                "10.244.40.0/26 via 10.0.1.14 dev tunl0 metric 1024 onlink",
                "10.245.20.0/26 via 10.0.0.12 dev tunl0 metric 1024 onlink",
                "10.245.40.0/26 via 10.0.1.14 dev tunl0 metric 1024 onlink",
            ],
        ),
        (
            // node-d is in another subnet: CrossSubnet goes through the tunnel to everyone.
            "node-d",
            &[
                "10.244.10.0/26 via 10.0.0.11 dev tunl0 metric 1024 onlink",
                "10.244.20.0/26 via 10.0.0.12 dev tunl0 metric 1024 onlink",
                "10.244.20.5 via 10.0.0.13 dev tunl0 metric 1024 onlink",
                "10.244.30.0/26 via 10.0.0.13 dev tunl0 metric 1024 onlink",
                "blackhole 10.244.40.0/26 metric 1024",
                "10.245.20.0/26 via 10.0.0.12 dev tunl0 metric 1024 onlink",
                "blackhole 10.245.40.0/26 metric 1024",
            ],
        ),
    ];
    let agents: Vec<Agent> = expected.iter().map(|(node, _)| Agent::start(&lab, node, &example_dir(), &[])).collect();
    for (node, routes_expected) in expected {
        wait_ready(&lab, node);
        assert_eq!(routes(&lab, node, "80"), routes_expected, "{node}");
    }
    drop(agents);
}

/// With `--host-device auto` (the default) the host NIC is the link holding
/// node-a's Calico address, whatever it is called: node-a's NIC renamed `ens5` carries the
/// same-subnet routes. When no link holds the address, the agent names the address and the
/// links it saw in `/readyz`, programs nothing and stays unready; fixing the address lets it
/// go on.
#[test]
fn host_device_auto_is_the_link_holding_the_node_address() {
    if skip_unless_root("host_device_auto_is_the_link_holding_the_node_address") {
        return;
    }
    let lab = lab();
    // Rename node-a's NIC; put back the lab's routes through it (a link down drops them).
    let before: Vec<String> = lab.ip("node-a", &["route", "show", "dev", "eth0"]).unwrap().lines().map(|l| l.trim().to_owned()).collect();
    for args in [&["link", "set", "eth0", "down"][..], &["link", "set", "eth0", "name", "ens5"], &["link", "set", "ens5", "up"]] {
        lab.ip("node-a", args).unwrap();
    }
    for r in before.iter().filter(|r| !r.contains("proto kernel")) {
        let mut args: Vec<&str> = vec!["route", "replace"];
        args.extend(r.split_whitespace());
        args.extend(["dev", "ens5"]);
        lab.ip("node-a", &args).unwrap();
    }
    let want: Vec<String> = NODE_A_IPIP.iter().map(|l| l.replace("dev eth0", "dev ens5")).collect();

    // The address on a link named ens5.
    let agent = Agent::start(&lab, "node-a", &example_dir(), &[]);
    wait_ready(&lab, "node-a");
    wait_for("node-a's routes via ens5", Duration::from_secs(30), || (routes(&lab, "node-a", "80") == want).then_some(()));
    assert!(agent.stop().success());

    // No link holds the address: named in /readyz, nothing programmed, not ready.
    let dir = copy_examples();
    let calico = dir.path().join("calico.yaml");
    let good = std::fs::read_to_string(&calico).unwrap();
    std::fs::write(
        &calico,
        good.replacen("ipv4Address: 10.0.0.11/24", "ipv4Address: 10.0.0.99/24", 1).replacen("ipv6Address: fd00:10::11/64", "ipv6Address: fd00:10::99/64", 1),
    )
    .unwrap();
    lab.ip("node-a", &["route", "flush", "proto", "80"]).unwrap();
    let _agent = Agent::start(&lab, "node-a", dir.path(), &[]);
    let body = wait_for("node-a /readyz names the missing address", Duration::from_secs(30), || match lab.http_get("node-a", PORT, "/readyz") {
        Ok((503, b)) if b.contains("host device:") => Some(b),
        _ => None,
    });
    let note = body.lines().find(|l| l.starts_with("host device:")).unwrap();
    assert!(note.starts_with("host device: none found: no link holds node node-a's Calico address 10.0.0.99, fd00:10::99; links seen: "), "{note}");
    assert!(note.contains("ens5 [10.0.0.11"), "{note}");
    routes_stay(&lab, "node-a", "80", &[], Duration::from_secs(2));
    // The address fixed: the NIC is found and the routes go in.
    std::fs::write(&calico, &good).unwrap();
    wait_for("node-a ready with its routes via ens5", Duration::from_secs(30), || {
        (matches!(lab.http_get("node-a", PORT, "/readyz"), Ok((200, _))) && routes(&lab, "node-a", "80") == want).then_some(())
    });
}

/// A tunnel device that does not exist (a cluster that renamed tunl0, or a typo in
/// `--tunnel-device`) while routewarden owns IPIP: `/readyz` names it with the number of
/// routes waiting, nothing else is programmed through it; once the device appears the routes
/// go in and the line goes away.
#[test]
fn missing_tunnel_device_is_named_in_readyz_until_it_appears() {
    if skip_unless_root("missing_tunnel_device_is_named_in_readyz_until_it_appears") {
        return;
    }
    let lab = lab();
    let _agent = Agent::start(&lab, "node-a", &example_dir(), &["--tunnel-device", "ipip9"]);
    let body = wait_for("node-a /readyz names ipip9", Duration::from_secs(30), || match lab.http_get("node-a", PORT, "/readyz") {
        Ok((200, b)) if b.contains("device ipip9") => Some(b),
        _ => None,
    });
    assert!(body.lines().any(|l| l == "device ipip9: missing or down; 3 cluster route(s) wait for it"), "{body}");
    // The routes through the host NIC are in; none through the missing device.
    let native: Vec<String> = NODE_A_IPIP.iter().filter(|l| !l.contains("tunl0")).map(|l| (*l).to_owned()).collect();
    wait_for("node-a's host-NIC routes", Duration::from_secs(30), || (routes(&lab, "node-a", "80") == native).then_some(()));
    // The device appears: its three routes go in at the next resync, and the line goes.
    // (A veth stands in for it, as for the lab's tunl0: this kernel has no ipip or dummy.)
    lab.ip("node-a", &["link", "add", "ipip9", "type", "veth", "peer", "name", "ipip9peer"]).unwrap();
    for dev in ["ipip9", "ipip9peer"] {
        lab.ip("node-a", &["link", "set", dev, "up"]).unwrap();
    }
    let want: Vec<String> = NODE_A_IPIP.iter().map(|l| l.replace("dev tunl0", "dev ipip9")).collect();
    wait_for("node-a's routes via ipip9 and a clean /readyz", Duration::from_mins(1), || {
        let ok = routes(&lab, "node-a", "80") == want && matches!(lab.http_get("node-a", PORT, "/readyz"), Ok((200, b)) if !b.contains("device ipip9"));
        ok.then_some(())
    });
}

/// A child killed (SIGKILL) and reaped when the test ends, however it ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// SIGTERM (15) in a `SigCgt` mask (bit `signal - 1`).
const SIGTERM_BIT: u64 = 1 << (15 - 1);

/// `/proc/<pid>/status`'s `SigCgt` mask: the signals the process has a handler for.
fn caught_signals(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let mask = status.lines().find_map(|l| l.strip_prefix("SigCgt:"))?.trim();
    u64::from_str_radix(mask, 16).ok()
}

/// In its container the agent is PID 1, for which the kernel drops a signal that has no
/// handler: a SIGTERM during start-up would be lost and the pod killed after its grace period.
/// So the agent takes SIGTERM before it does anything else. Shown deterministically: its stderr
/// is a pipe the test has filled, so the agent stops at its first log line (before the BPF
/// load, the datastore, the loop); there it must already catch SIGTERM, and a SIGTERM sent
/// there must end it cleanly (exit 0, "SIGTERM" in its log) once the log drains.
#[test]
fn a_sigterm_during_start_up_stops_the_agent_cleanly() {
    use std::io::{Read as _, Write as _};
    use std::os::fd::AsRawFd as _;

    use nix::fcntl::{fcntl, FcntlArg, OFlag};

    if skip_unless_root("a_sigterm_during_start_up_stops_the_agent_cleanly") {
        return;
    }
    let lab = lab();
    let (read_end, write_end) = nix::unistd::pipe().unwrap();
    // Fill the pipe to the last byte (non-blocking, so the test sees where it is full), then
    // make it blocking again: the flag belongs to the open file the agent inherits.
    fcntl(write_end.as_raw_fd(), FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).unwrap();
    let mut w = std::fs::File::from(write_end);
    let mut filled = 0usize;
    for chunk in [4096usize, 1] {
        let bytes = vec![b'.'; chunk];
        while w.write(&bytes).is_ok() {
            filled += chunk;
        }
    }
    assert!(filled >= 4096, "the pipe took {filled} bytes");
    fcntl(w.as_raw_fd(), FcntlArg::F_SETFL(OFlag::empty())).unwrap();
    let mut cmd = lab.command("node-a", env!("CARGO_BIN_EXE_routewarden"));
    cmd.args(["run", "--node", "node-a", "--metrics-addr", &format!("127.0.0.1:{PORT}"), "--log-format", "text", "--datastore"])
        .arg(format!("file:{}", example_dir().display()))
        .env("RUST_LOG", "info")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(w);
    let mut child = KillOnDrop(cmd.spawn().unwrap());
    drop(cmd); // the test's copy of the write end goes, so the drain below ends with the agent
    let pid = child.0.id();
    wait_for("the agent to catch SIGTERM while held at its first log line", Duration::from_secs(10), || {
        caught_signals(pid).filter(|m| m & SIGTERM_BIT != 0).map(|_| ())
    });
    assert_eq!(child.0.try_wait().unwrap(), None, "the agent is still starting (held at its log)");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()), nix::sys::signal::Signal::SIGTERM).unwrap();
    let drain = std::thread::spawn(move || {
        let mut log = Vec::new();
        std::fs::File::from(read_end).read_to_end(&mut log).unwrap();
        String::from_utf8_lossy(&log[filled.min(log.len())..]).into_owned()
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the agent did not stop within 30 s of a SIGTERM during its start-up");
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = drain.join().unwrap();
    assert_eq!(status.code(), Some(0), "a SIGTERM during start-up ends the agent cleanly: {status}\n{log}");
    assert!(log.contains("SIGTERM"), "the agent says it stopped on SIGTERM:\n{log}");
}
