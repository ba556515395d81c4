//! The metric set as a whole: the exposition of one write of each kind, and the bounds on
//! label values.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use routewarden_common::forward::ForwardPath;
use routewarden_common::route_watch::{RouteWatchCounters, WriterClass};

use super::*;
use crate::dataplane::reconciler::report::ClassCount;
use crate::dataplane::table_rule::RuleCoverage;
use crate::dataplane::{ApplyReport, ErrorKind, Family};
use crate::datastore::{FileDatastore, LoadError, LoadErrorKind, Snapshot};
use crate::ownership::{CalicoVersion, OwnershipConfig, ResolvedVersion, Role, Rules, VersionSource};
use crate::plan::{plan, Plan, PlanConfig};
use crate::routes::RouteDevices;
use crate::vocabulary::{PoolClass, RoutePath};

fn render(r: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, r).unwrap();
    out
}

/// The exposition with the samples of each metric sorted (a family's series come out in hash
/// order); names, help texts, types, label sets and values stay as they are.
fn normalized(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut samples: Vec<String> = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') {
            samples.sort();
            out.append(&mut samples);
            out.push(line.to_owned());
        } else {
            samples.push(line.to_owned());
        }
    }
    samples.sort();
    out.append(&mut samples);
    out
}

/// `examples/cluster` with an IP pool that never had a good version (an invalid object:
/// frozen ground) and a block on an unknown node (a route problem), in `dir`.
fn example_with_problems(dir: &Path) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster");
    for f in ["calico.yaml", "ipam.yaml", "nodes.yaml"] {
        let mut text = std::fs::read_to_string(src.join(f)).unwrap();
        if f == "calico.yaml" {
            text.push_str(
                "\n---\napiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: broken}\nspec: {cidr: 10.250.0.0/16, ipipMode: Sometimes}\n",
            );
        }
        std::fs::write(dir.join(f), text).unwrap();
    }
    std::fs::write(
        dir.join("late.yaml"),
        "apiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {name: 10-244-50-0-26}\nspec: {cidr: 10.244.50.0/26, affinity: \"host:node-z\"}\n",
    )
    .unwrap();
}

fn plan_of(snap: &Snapshot) -> Plan {
    let ownership = OwnershipConfig { role: Role::Felix, version: "auto".parse().unwrap(), node: Some("node-a".into()) };
    let config = PlanConfig { node: "node-a".into(), ownership, devices: RouteDevices::default(), protocol: 80, table: 254 };
    plan(snap, &config, &BTreeSet::new(), &[])
}

/// One write of every kind gives, sample for sample, the exposition the writers scattered over
/// `app/` and `bpf/` gave before they moved here (`one_of_each.prom`, captured from them).
#[test]
fn exposition_of_one_write_of_each_kind_is_unchanged() {
    let (registry, m) = Metrics::new_registry();
    let dir = tempfile::tempdir().unwrap();
    example_with_problems(dir.path());
    let snap = FileDatastore::load(dir.path()).unwrap();

    // Datastore and plan.
    m.record_load_failed(&LoadError::new("ipam.yaml", LoadErrorKind::Syntax, "bad"));
    m.record_snapshot(&snap);
    let plan = plan_of(&snap);
    assert!(!plan.problems.is_empty() && !plan.frozen.is_empty() && !plan.decision.findings.is_empty());
    m.record_plan(&plan);
    m.set_synced(true);

    // Two applies; the breaker engaged once.
    let by_class = BTreeMap::from([
        ((Family::V4, PoolClass::Ipip, RoutePath::Tunnel), ClassCount { desired: 5, programmed: 4, held: 1 }),
        ((Family::V4, PoolClass::NoEncap, RoutePath::HostNic), ClassCount { desired: 6, programmed: 5, held: 2 }),
    ]);
    let report = ApplyReport {
        writes: 3,
        deletes: 2,
        deletes_already_gone: 1,
        errors: BTreeMap::from([(ErrorKind::NoDevice, 2), (ErrorKind::Invalid, 1)]),
        desired_sets: 1,
        write_errors: 2,
        delete_errors: 1,
        nexthop_writes: 1,
        nexthop_deletes: 2,
        nexthop_write_errors: 3,
        nexthop_delete_errors: 4,
        deletes_deferred_unsynced: 1,
        deletes_deferred_frozen: 2,
        deletes_held_mass: 3,
        mass_deletion: Some((10, 12)),
        by_class,
        duration: Duration::from_millis(25),
        ..ApplyReport::default()
    };
    m.record_apply(&report);
    m.record_mass_deletion_hold();
    m.record_apply(&report);

    // An audit of an empty kernel, then a failed one.
    let audit = crate::dataplane::audit(&[], plan.expected.values(), &plan.audit_scope);
    assert!(!audit.findings.is_empty());
    m.record_audit(&audit);
    m.record_audit_failed();

    // BPF watches.
    m.set_program_attached("tc_forward", true);
    m.set_program_attached("route_watch", false);
    m.record_tc_count(7, 700);

    // Route watch: two reads of the kernel counters.
    m.set_route_watch_backend(Some("kprobe"));
    let first = {
        let mut c = RouteWatchCounters::default();
        c.writes[0][1][WriterClass::Bird as usize] = 5;
        c.writes[1][0][WriterClass::SelfAgent as usize] = 2;
        c.conflicts[0][WriterClass::Bird as usize][WriterClass::SelfAgent as usize] = 1;
        c.flaps[1] = 2;
        c.flushes[0] = 3;
        c.unattributed[0] = 6;
        c.records_lost = 4;
        c.rule_writes[0][1][WriterClass::Other as usize] = 2;
        c.write_failures[0][0][WriterClass::Bird as usize] = 9;
        c
    };
    let mut second = first;
    second.writes[0][1][WriterClass::Bird as usize] = 8;
    m.record_route_watch(&first, &RouteWatchCounters::default());
    m.record_route_watch(&second, &first);
    // Conflicts and flaps come from their events (the kernel's counters of them are not used).
    m.record_route_conflict("ipv4", WriterClass::Bird, WriterClass::SelfAgent);
    m.record_route_flap("ipv6");
    m.record_route_flap("ipv6");
    m.record_failing_writer("ipv4", WriterClass::Bird);
    m.set_flapping_prefixes(0);
    m.set_flapping_prefixes(2);

    // Table rules: table 48 checked for both families, then IPv6's routes gone.
    let check = |family, coverage| crate::dataplane::table_rule::TableRuleCheck { family, table: 48, routes: 3, coverage, rules: vec![] };
    m.record_table_rules(&[check(Family::V4, RuleCoverage::None), check(Family::V6, RuleCoverage::Some)]);
    m.record_table_rules(&[check(Family::V4, RuleCoverage::All)]);

    // Forwarding watch: the plan's destinations declared, a pool that came and went, one
    // read (the NIC's IPIP view of tunnelled packets is left out by the caller).
    let entries = crate::bpf::forward::entries_from_routes(plan.desired.values().map(|r| &**r), plan.expected.values(), &plan.programmed);
    for e in &entries {
        m.declare_forward_destination(&e.pool, e.expected);
    }
    m.declare_forward_destination("gone", ForwardPath::Tunnel);
    m.forget_forward_pool("gone");
    m.record_forwarded("default-ipv4-ippool", ForwardPath::Tunnel, ForwardPath::Tunnel, 10, 1000);
    m.record_forwarded("default-ipv4-ippool", ForwardPath::Tunnel, ForwardPath::Host, 4, 400);
    m.record_forwarded("flat", ForwardPath::Host, ForwardPath::Host, 7, 700);
    m.record_forwarded("flat", ForwardPath::Host, ForwardPath::Tunnel, 0, 0);
    m.record_forwarding_flaps("default-ipv4-ippool", 1);
    m.record_forwarding_flaps("flat", 0);
    m.record_forwarding_events_lost(3);

    // Node Events: on; one recorded, one refused.
    m.declare_node_events(true);
    m.record_node_event("RouteConflict");
    m.record_node_event_failed("RouteFlap", "api");

    let want = include_str!("one_of_each.prom").replace("@VERSION@", env!("CARGO_PKG_VERSION"));
    assert_eq!(normalized(&render(&registry)), normalized(&want));
}

/// One series at a time: a Calico upgrade replaces the series, it does not add one.
#[test]
fn calico_version_info_has_one_series() {
    let (r, m) = Metrics::new_registry();
    let lines = || render(&r).lines().filter(|l| l.starts_with("routewarden_calico_version_info")).map(str::to_owned).collect::<Vec<_>>();
    assert_eq!(lines(), Vec::<String>::new());
    let v3_30 = CalicoVersion::parse_release("v3.30.2").unwrap();
    let from_cluster = ResolvedVersion { version: v3_30, rules: v3_30.rules(), source: VersionSource::ClusterInformation { value: "v3.30.2".into() } };
    m.record_calico_version(&from_cluster);
    m.record_calico_version(&from_cluster);
    assert_eq!(lines(), vec![r#"routewarden_calico_version_info{version="3.30",rules="3.26-3.30",source="cluster-information"} 1"#]);
    m.record_calico_version(&ResolvedVersion {
        version: CalicoVersion::NEWEST_KNOWN,
        rules: Rules::V3_33,
        source: VersionSource::Assumed { reason: "test".into() },
    });
    assert_eq!(lines(), vec![r#"routewarden_calico_version_info{version="3.33",rules="3.33",source="assumed"} 1"#]);
}

/// `routewarden_route_problems` has one series per problem code however many blocks have
/// problems: 500 blocks on unknown nodes are one series of value 500, and a plan without them
/// removes it.
#[test]
fn route_problems_stay_one_series_per_code_under_many_blocks() {
    let (r, m) = Metrics::new_registry();
    let dir = tempfile::tempdir().unwrap();
    example_with_problems(dir.path());
    let mut blocks = String::new();
    for i in 0..500 {
        let (a, b) = (100 + i / 4, (i % 4) * 64);
        let _ = writeln!(
            blocks,
            "  - {{apiVersion: crd.projectcalico.org/v1, kind: IPAMBlock, metadata: {{name: 10-244-{a}-{b}-26}}, spec: {{cidr: 10.244.{a}.{b}/26, affinity: \"host:gone-{i}\"}}}}"
        );
    }
    std::fs::write(dir.path().join("many.yaml"), format!("apiVersion: v1\nkind: List\nitems:\n{blocks}")).unwrap();
    let plan = plan_of(&FileDatastore::load(dir.path()).unwrap());
    let blocks_with_problems: BTreeSet<&str> = plan.problems.iter().map(crate::routes::RouteProblem::block).collect();
    assert!(blocks_with_problems.len() > 500, "{} blocks with problems", blocks_with_problems.len());
    m.record_plan(&plan);
    let series = |text: &str| text.lines().filter(|l| l.starts_with("routewarden_route_problems{")).map(str::to_owned).collect::<Vec<_>>();
    let codes: BTreeSet<&str> = plan.problems.iter().map(crate::routes::RouteProblem::code).collect();
    let text = render(&r);
    assert_eq!(series(&text).len(), codes.len(), "{text}");
    assert!(series(&text).contains(&r#"routewarden_route_problems{code="unknown-node"} 501"#.to_owned()), "{text}");

    let dir = tempfile::tempdir().unwrap();
    example_with_problems(dir.path());
    std::fs::remove_file(dir.path().join("late.yaml")).unwrap();
    m.record_plan(&plan_of(&FileDatastore::load(dir.path()).unwrap()));
    assert_eq!(series(&render(&r)), Vec::<String>::new());
}

#[test]
fn writers_label_is_ordered() {
    assert_eq!(writers_label(WriterClass::Bird, WriterClass::SelfAgent), "self+bird");
    assert_eq!(writers_label(WriterClass::Bird, WriterClass::Bird), "bird+bird");
}

/// A fresh registry already has every series of the counters with fixed label sets, at 0:
/// 42 route-write series (2 families × 3 ops × 7 writer classes) and as many refused-write
/// series, 14 failing-writer series (2 × 7), 28 rule-write series (2 × 2 ops × 7), 56 conflict series (2 × the
/// 28 writer pairs), 2 each of flaps, flushes and unattributed writes, 8 route operations,
/// 11 netlink errors, 9 datastore load errors; and no pool-labelled forwarding series.
#[test]
fn counters_with_known_labels_start_at_zero() {
    let (registry, _m) = Metrics::new_registry();
    let text = render(&registry);
    let count = |prefix: &str| text.lines().filter(|l| l.starts_with(prefix) && l.ends_with(" 0")).count();
    assert_eq!(count("routewarden_route_writes_total{"), 42);
    assert_eq!(count("routewarden_route_write_failures_total{"), 42);
    assert_eq!(count("routewarden_failing_writer_episodes_total{"), 14);
    assert_eq!(count("routewarden_route_conflicts_total{"), 56);
    assert_eq!(count("routewarden_route_flaps_total{"), 2);
    assert_eq!(count("routewarden_route_flushes_total{"), 2);
    assert_eq!(count("routewarden_route_writes_unattributed_total{"), 2);
    assert_eq!(count("routewarden_rule_writes_total{"), 28);
    assert_eq!(count("routewarden_route_operations_total{"), 8);
    assert_eq!(count("routewarden_netlink_errors_total{"), 11);
    assert_eq!(count("routewarden_datastore_load_errors_total{"), 9);
    assert_eq!(count("routewarden_forwarding_flaps_total{"), 0);
    for line in [
        "routewarden_route_flaps_total{family=\"ipv6\"} 0",
        "routewarden_failing_writer_episodes_total{family=\"ipv4\",writer=\"bird\"} 0",
        "routewarden_route_write_failures_total{family=\"ipv6\",op=\"delete\",writer=\"felix\"} 0",
        "routewarden_route_writes_total{family=\"ipv4\",op=\"replace\",writer=\"bird\"} 0",
        "routewarden_route_conflicts_total{family=\"ipv4\",writers=\"felix+bird\"} 0",
        "routewarden_netlink_errors_total{op=\"dump\",kind=\"other\"} 0",
        "routewarden_datastore_load_errors_total{reason=\"object\"} 0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing from\n{text}");
    }
}
