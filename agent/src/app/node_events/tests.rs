//! The triggers and the aggregator together, on a manual clock: a scripted fight of two
//! writers over one prefix for 60 s gives exactly two Events of two reports each; a quiet
//! node, and episodes outside the scope, give none; ownership errors and the breaker give one
//! occurrence per start.

use std::time::Instant;

use super::*;
use crate::bpf::route_watch::WriterInfo;
use crate::observe::node_events::{Aggregator, Report, PERIOD};

const PREFIX: &str = "10.244.1.0/26";

fn bird() -> WriterInfo {
    WriterInfo { protocol: 12, class: "bird", class_inferred: false, kernel: false, netlink_port: None, pid: Some(4242), comm: Some("bird".into()) }
}

fn ip() -> WriterInfo {
    WriterInfo { protocol: 4, class: "other", class_inferred: false, kernel: false, netlink_port: None, pid: Some(4343), comm: Some("ip".into()) }
}

fn change(dst: &str, writer: WriterInfo) -> RouteChange {
    RouteChange {
        at_ns: 0,
        family: "ipv4",
        op: "replace",
        table: 254,
        dst: dst.parse().unwrap(),
        metric: 1024,
        oif: 3,
        gateway: None,
        nexthop_id: None,
        writer,
    }
}

/// Writer of second `s` of the fight: BIRD on even seconds, `ip` on odd ones.
fn writers_at(s: u64) -> (WriterInfo, WriterInfo) {
    if s.is_multiple_of(2) {
        (bird(), ip())
    } else {
        (ip(), bird())
    }
}

fn conflict_at(dst: &str, s: u64) -> RouteWatchEvent {
    let (w, p) = writers_at(s);
    RouteWatchEvent::Conflict { route: change(dst, w), previous: p, writes_in_window: 2 }
}

fn flap_at(dst: &str, s: u64) -> RouteWatchEvent {
    let (w, p) = writers_at(s);
    RouteWatchEvent::Flap { route: change(dst, w), previous: p, changes_in_window: 3 }
}

/// Triggers inside the pool 10.244.0.0/16 (IPIP), window 30 s.
fn triggers() -> NodeEventTriggers {
    let pool: IpNet = "10.244.0.0/16".parse().unwrap();
    NodeEventTriggers {
        window: Duration::from_secs(30),
        scope: Some(EpisodeScope { pools: vec![pool], protocol: 80, table: 254 }),
        pools: vec![(pool, Some(PoolClass::Ipip))],
        ..NodeEventTriggers::default()
    }
}

/// Feed `events` (second, event) through the triggers and an aggregator on a manual clock,
/// ticking every second up to `until`: the reports, each with its second.
fn run(events: &[(u64, RouteWatchEvent)], until: u64) -> Vec<(u64, Report)> {
    let t0 = Instant::now();
    let triggers = triggers();
    let mut agg = Aggregator::new(PERIOD, 256);
    let mut out = Vec::new();
    for s in 0..=until {
        let now = t0 + Duration::from_secs(s);
        for (_, e) in events.iter().filter(|(at, _)| *at == s) {
            if let Some(ev) = triggers.on_route_watch(e) {
                out.extend(agg.observe(ev, now).unwrap().map(|r| (s, r)));
            }
        }
        out.extend(agg.due(now).into_iter().map(|r| (s, r)));
    }
    out
}

const CONFLICT_NOTE: &str = "10.244.1.0/26 in table 254 (pool class ipip): other(proto 4, ip[4343]) overwrote or deleted the route of bird(proto 12, bird[4242]): two writers program this prefix";
const FLAP_NOTE: &str =
    "10.244.1.0/26 in table 254 (pool class ipip): 3 changes within the 30 s window, the last by other(proto 4, ip[4343]) after bird(proto 12, bird[4242])";

fn expected(conflict_later: u32, flap_later: u32) -> Vec<(u64, Report)> {
    let r = |reason, note: &str, occurrences| Report { reason, subject: format!("{PREFIX} table 254"), note: note.into(), occurrences };
    vec![
        (1, r(NodeEventReason::RouteConflict, CONFLICT_NOTE, 1)),
        (3, r(NodeEventReason::RouteFlap, FLAP_NOTE, 1)),
        (61, r(NodeEventReason::RouteConflict, CONFLICT_NOTE, conflict_later)),
        (63, r(NodeEventReason::RouteFlap, FLAP_NOTE, flap_later)),
    ]
}

/// BIRD and `ip` overwrite each other's route every second for 60 s (seconds 0 to 59). The
/// detector (`ebpf/src/route_detector.rs`, window 30 s, threshold 3) reports a conflict at the
/// first overwrite (1 s) and again a window later (31 s), a flap at the third change (3 s) and
/// again a window later (33 s): two reports per reason, the second at the end of the period.
#[test]
fn a_sixty_second_fight_is_two_events_of_two_reports() {
    let kernel = [(1, conflict_at(PREFIX, 1)), (3, flap_at(PREFIX, 3)), (31, conflict_at(PREFIX, 31)), (33, flap_at(PREFIX, 33))];
    assert_eq!(run(&kernel, 300), expected(1, 1));
}

/// Were an event sent for every offending write, the API calls would be the same: the
/// occurrences are folded into the same two reports per reason.
#[test]
fn an_event_per_write_makes_no_more_reports() {
    let mut per_write = Vec::new();
    for s in 1..60 {
        per_write.push((s, conflict_at(PREFIX, s)));
        if s >= 3 {
            per_write.push((s, flap_at(PREFIX, s)));
        }
    }
    assert_eq!(run(&per_write, 300), expected(58, 56));
}

/// No episode, no report; episodes outside the pools and off routewarden's keys are not the
/// cluster's and are not reported either (as the route watch does not count them).
#[test]
fn quiet_or_out_of_scope_reports_nothing() {
    assert_eq!(run(&[], 600), []);
    let outside = [(1, conflict_at("192.168.7.0/24", 1)), (3, flap_at("192.168.7.0/24", 3))];
    assert_eq!(run(&outside, 600), []);
    assert_eq!(triggers().on_route_watch(&RouteWatchEvent::LinkDown { at_ns: 1, ifindex: 2 }), None);
    assert_eq!(triggers().on_route_watch(&RouteWatchEvent::Write { route: change(PREFIX, bird()) }), None);
}

/// The breaker: one occurrence when it engages, none while it holds, one when it engages again.
#[test]
fn mass_deletion_is_reported_when_the_breaker_engages() {
    let mut t = triggers();
    let held = ApplyReport { mass_deletion: Some((40, 50)), deletes_held_mass: 40, ..ApplyReport::default() };
    let want = NodeEvent {
        reason: NodeEventReason::RouteMassDeletionHeld,
        subject: "breaker".into(),
        note: "one change would delete 40 of routewarden's 50 routes, more than 50 %: each delete waits until it has been wanted for 30 s".into(),
    };
    assert_eq!(t.on_report(&ApplyReport::default(), 50, Duration::from_secs(30)), None);
    assert_eq!(t.on_report(&held, 50, Duration::from_secs(30)), Some(want.clone()));
    assert_eq!(t.on_report(&held, 50, Duration::from_secs(30)), None);
    assert_eq!(t.on_report(&ApplyReport::default(), 50, Duration::from_secs(30)), None);
    assert_eq!(t.on_report(&held, 50, Duration::from_secs(30)), Some(want));
}

/// `examples/cluster` planned for node-a in `role`.
fn example_plan(role: &str) -> Plan {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster");
    let snap = crate::datastore::FileDatastore::load(&dir).unwrap();
    let ownership = crate::ownership::OwnershipConfig { role: role.parse().unwrap(), version: "auto".parse().unwrap(), node: Some("node-a".into()) };
    let config = crate::plan::PlanConfig { node: "node-a".into(), ownership, devices: crate::routes::RouteDevices::default(), protocol: 80, table: 254 };
    crate::plan::plan(&snap, &config, &std::collections::BTreeSet::new(), &[])
}

/// An error finding is one occurrence when it appears, none while it stays, one again when it
/// comes back; a consistent decision gives none.
#[test]
fn ownership_errors_are_reported_when_they_appear() {
    let (consistent, double) = (example_plan("felix"), example_plan("explicit:Enabled"));
    assert!(!consistent.decision.has_errors());
    let mut t = NodeEventTriggers::new(Duration::from_secs(30));
    let scope = EpisodeScope::default;
    assert_eq!(t.on_plan(&consistent, scope()), []);
    let inconsistent = |class: &str, note: &str| NodeEvent { reason: NodeEventReason::RouteOwnershipInconsistent, subject: class.into(), note: note.into() };
    let want = [
        inconsistent("ipip", "pool class ipip: double-programmed: felix and routewarden all program the IPIP cluster routes of pools default-ipv4-ippool, ipip-always and fight over them: Felix field EnabledIPIPOnly (field), BIRD field EnabledNoEncapOnly (field), routewarden Enabled"),
        inconsistent("noencap", "pool class noencap: double-programmed: bird and routewarden all program the no-encap cluster routes of pools flat, flat-ipv6 and fight over them: Felix field EnabledIPIPOnly (field), BIRD field EnabledNoEncapOnly (field), routewarden Enabled"),
    ];
    assert_eq!(t.on_plan(&double, scope()), want);
    assert_eq!(t.on_plan(&double, scope()), []);
    assert_eq!(t.on_plan(&consistent, scope()), []);
    assert_eq!(t.on_plan(&double, scope()), want);
}
