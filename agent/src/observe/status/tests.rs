use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use http_body_util::BodyExt as _;
use tower::ServiceExt as _;

use super::*;
use crate::bpf::route_watch::event::{RouteChange, WriterInfo};
use crate::dataplane::reconciler::report::ClassCount;
use crate::dataplane::{Family, FindingCode};
use crate::datastore::FileDatastore;
use crate::ownership::{OwnershipConfig, Role};
use crate::plan::{plan, PlanConfig};
use crate::routes::RouteDevices;
use crate::vocabulary::{RoutePath, Writer};

fn example_decision(role: Role) -> OwnershipDecision {
    let snap = FileDatastore::load(Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster")).unwrap();
    let ownership = OwnershipConfig { role, version: "auto".parse().unwrap(), node: Some("node-a".into()) };
    let config = PlanConfig { node: "node-a".into(), ownership, devices: RouteDevices::default(), protocol: 80, table: 254 };
    plan(&snap, &config, &BTreeSet::new(), &[]).decision
}

fn writer(class: &'static str, protocol: u8, pid: u32, comm: &str) -> WriterInfo {
    WriterInfo { protocol, class, class_inferred: false, kernel: false, netlink_port: None, pid: Some(pid), comm: Some(comm.into()) }
}

fn change(dst: &str, w: WriterInfo) -> RouteChange {
    RouteChange {
        at_ns: 0,
        family: "ipv4",
        op: "replace",
        table: 254,
        dst: dst.parse().unwrap(),
        metric: 0,
        oif: 2,
        gateway: None,
        nexthop_id: None,
        writer: w,
    }
}

fn conflict(dst: &str, by: WriterInfo, previous: WriterInfo) -> RouteWatchEvent {
    RouteWatchEvent::Conflict { route: change(dst, by), previous, writes_in_window: 2 }
}

fn felix() -> WriterInfo {
    writer("felix", 80, 4242, "calico-node")
}

fn bird() -> WriterInfo {
    writer("bird", 12, 77, "bird")
}

fn ew(class: &str, protocol: u8, pid: u32, comm: &str) -> EpisodeWriter {
    EpisodeWriter { class: class.into(), protocol, pid: Some(pid), comm: Some(comm.into()) }
}

/// The example cluster (Felix EnabledIPIPOnly, BIRD EnabledNoEncapOnly, release line from
/// ClusterInformation) in the felix role: the line, both values with their sources, one row
/// per class with pools, and no finding but `consistent` ones (which are left out).
#[test]
fn decision_of_the_example_cluster() {
    let board = StatusBoard::new("node-a", "program", "felix");
    board.set_decision(&example_decision(Role::Felix));
    let doc = board.document(&Health::default(), 1_000);
    assert_eq!(doc.api_version, "routewarden.io/v1");
    assert_eq!(doc.kind, "AgentStatus");
    assert_eq!((doc.node.as_str(), doc.mode.as_str(), doc.role.as_str(), doc.generated_at), ("node-a", "program", "felix", 1_000));
    let calico = doc.calico.unwrap();
    assert_eq!((calico.source.as_str(), calico.line.as_str()), ("cluster-information", "3.33"), "{calico:?}");
    let d = doc.decision.unwrap();
    assert_eq!((d.felix.value.as_str(), d.felix.source.as_str()), ("EnabledIPIPOnly", "field"));
    assert_eq!(d.felix.detail, "FelixConfiguration default: programClusterRoutes: EnabledIPIPOnly");
    assert_eq!((d.bird.value.as_str(), d.bird.source.as_str()), ("EnabledNoEncapOnly", "field"));
    assert_eq!(d.explicit, None);
    let rows: Vec<(&str, Vec<&str>, bool, &str)> =
        doc.classes.iter().map(|c| (c.class.as_str(), c.writers.iter().map(String::as_str).collect(), c.programmed_here, c.state.as_str())).collect();
    assert_eq!(
        rows,
        [("ipip", vec!["routewarden"], true, "consistent"), ("noencap", vec!["bird"], false, "consistent"), ("vxlan", vec!["felix"], false, "consistent")]
    );
    assert_eq!(doc.findings, []);
    assert_eq!((doc.routes, doc.audit, doc.episodes.len()), (None, None, 0));
}

/// Before the first plan the document still answers, with readiness and nothing decided.
#[test]
fn document_before_the_first_plan() {
    let health = Health::default();
    health.set_view(false, vec!["datastore: waiting for the first list".into()]);
    let doc = StatusBoard::new("node-b", "audit", "audit").document(&health, 5);
    assert_eq!(
        doc.readiness,
        Readiness {
            ready: false,
            reasons: vec!["datastore: not synced".into(), "routes: first apply pending".into(), "datastore: waiting for the first list".into()]
        }
    );
    assert_eq!((doc.calico, doc.decision, doc.classes.len()), (None, None, 0));
}

/// An inconsistent pair (`explicit:Enabled` next to Felix's IPIP and BIRD's no-encap) shows as
/// two double-programmed classes and their findings.
#[test]
fn double_programmed_classes_and_their_findings() {
    let board = StatusBoard::new("node-a", "program", "explicit:Enabled");
    board.set_decision(&example_decision(Role::Explicit(crate::ownership::ClusterRoutes::Enabled)));
    let doc = board.document(&Health::default(), 1);
    let states: Vec<(&str, &str)> = doc.classes.iter().map(|c| (c.class.as_str(), c.state.as_str())).collect();
    assert_eq!(states, [("ipip", "double-programmed"), ("noencap", "double-programmed"), ("vxlan", "consistent")]);
    let codes: Vec<(&str, &str, Option<&str>)> = doc.findings.iter().map(|f| (f.code.as_str(), f.severity.as_str(), f.class.as_deref())).collect();
    assert_eq!(codes, [("double-programmed", "error", Some("ipip")), ("double-programmed", "error", Some("noencap"))]);
    assert_eq!(doc.decision.unwrap().explicit.unwrap().source, "role");
}

/// Route counts are the apply's per-class counts summed, with the breaker's held deletions.
#[test]
fn route_counts_sum_the_classes() {
    let board = StatusBoard::new("node-a", "program", "felix");
    let mut report = ApplyReport { deletes_held_mass: 3, ..ApplyReport::default() };
    report.by_class.insert((Family::V4, PoolClass::Ipip, RoutePath::Tunnel), ClassCount { desired: 10, programmed: 8, held: 1 });
    report.by_class.insert((Family::V4, PoolClass::NoEncap, RoutePath::HostNic), ClassCount { desired: 5, programmed: 5, held: 0 });
    board.set_routes(&report);
    assert_eq!(board.document(&Health::default(), 1).routes, Some(RouteCounts { desired: 15, programmed: 13, held: 1, deletions_held: 3 }));
}

/// The audit's findings, with their codes, prefixes and owners.
#[test]
fn audit_findings() {
    let board = StatusBoard::new("node-a", "audit", "audit");
    let report = AuditReport {
        table: 254,
        expected: 4,
        findings: vec![crate::dataplane::AuditFinding {
            prefix: "10.244.1.0/26".parse().unwrap(),
            code: FindingCode::Missing,
            owner: Some(Writer::Felix),
            expected: Some("10.244.1.0/26 via 192.168.1.2 dev tunl0 proto 80 onlink".into()),
            found: vec![],
            detail: "Felix should program it".into(),
        }],
        ..AuditReport::default()
    };
    board.set_audit(&report, 77);
    assert_eq!(
        board.document(&Health::default(), 80).audit,
        Some(AuditStatus {
            at: 77,
            expected: 4,
            findings: vec![AuditFindingStatus {
                code: "missing".into(),
                prefix: "10.244.1.0/26".into(),
                owner: Some("felix".into()),
                detail: "Felix should program it".into()
            }],
            findings_omitted: 0
        })
    );
}

/// A scripted fight: Felix and BIRD overwrite each other's route for one prefix four times,
/// then one flap; another prefix once. One episode per (kind, prefix), writers in the order
/// they were seen, first/last seen and counts exact; an hour after its last event an episode
/// is gone.
#[test]
fn a_fight_is_one_episode_per_kind_and_prefix() {
    let board = StatusBoard::new("node-a", "program", "felix");
    for (i, t) in [100u64, 110, 120, 130].into_iter().enumerate() {
        let ev = if i % 2 == 0 { conflict("10.244.1.0/26", bird(), felix()) } else { conflict("10.244.1.0/26", felix(), bird()) };
        board.record_route_watch(&ev, t);
    }
    board.record_route_watch(&RouteWatchEvent::Flap { route: change("10.244.1.0/26", felix()), previous: bird(), changes_in_window: 3 }, 131);
    board.record_route_watch(&conflict("10.244.2.0/26", bird(), felix()), 125);
    board.record_route_watch(&RouteWatchEvent::LinkDown { at_ns: 1, ifindex: 2 }, 126);
    let doc = board.document(&Health::default(), 200);
    assert_eq!(
        doc.episodes,
        [
            Episode {
                kind: "flap".into(),
                prefix: "10.244.1.0/26".into(),
                table: 254,
                writers: vec![ew("bird", 12, 77, "bird"), ew("felix", 80, 4242, "calico-node")],
                first_seen: 131,
                last_seen: 131,
                count: 1
            },
            Episode {
                kind: "conflict".into(),
                prefix: "10.244.1.0/26".into(),
                table: 254,
                writers: vec![ew("felix", 80, 4242, "calico-node"), ew("bird", 12, 77, "bird")],
                first_seen: 100,
                last_seen: 130,
                count: 4
            },
            Episode {
                kind: "conflict".into(),
                prefix: "10.244.2.0/26".into(),
                table: 254,
                writers: vec![ew("felix", 80, 4242, "calico-node"), ew("bird", 12, 77, "bird")],
                first_seen: 125,
                last_seen: 125,
                count: 1
            },
        ]
    );
    assert_eq!(doc.episodes_omitted, 0);
    assert_eq!(doc.episodes[1].writers[0].label(), "calico-node[4242]");
    // 3600 s after 125 the second prefix's episode has ended; the others are younger.
    let later = board.document(&Health::default(), 125 + 3600);
    assert_eq!(
        later.episodes.iter().map(|e| (e.kind.as_str(), e.prefix.as_str())).collect::<Vec<_>>(),
        [("flap", "10.244.1.0/26"), ("conflict", "10.244.1.0/26")]
    );
    assert!(board.document(&Health::default(), 131 + 3600).episodes.is_empty());
}

/// However many prefixes fight, the document holds at most MAX_EPISODES episodes (the most
/// recently seen) and says how many it left out; each keeps at most MAX_EPISODE_WRITERS writers.
#[test]
fn episodes_are_bounded() {
    let board = StatusBoard::new("node-a", "program", "felix");
    for i in 0..1000u32 {
        let dst = format!("10.{}.{}.0/24", i / 256, i % 256);
        board.record_route_watch(&conflict(&dst, bird(), felix()), u64::from(i));
    }
    for pid in 0..10 {
        board.record_route_watch(&conflict("10.3.231.0/24", writer("other", 3, 1000 + pid, "ip"), felix()), 2000);
    }
    let doc = board.document(&Health::default(), 2000);
    assert_eq!(doc.episodes.len(), limits::MAX_EPISODES);
    assert_eq!(doc.episodes_omitted, 1000 - limits::MAX_EPISODES);
    assert_eq!(doc.episodes[0].prefix, "10.3.231.0/24");
    assert_eq!(doc.episodes[0].writers.len(), limits::MAX_EPISODE_WRITERS);
    assert_eq!(doc.episodes[1].prefix, "10.3.230.0/24");
    let body = serde_json::to_string(&doc).unwrap();
    assert!(body.len() < 16 * 1024, "{} bytes", body.len());
}

/// The server answers the document at /status/v1 as JSON, and it reads back as the same
/// document (what `routewarden status` does).
#[tokio::test]
async fn served_at_the_versioned_path() {
    let health = Arc::new(Health::default());
    health.set_view(true, Vec::new());
    health.set_first_apply_done();
    let board = Arc::new(StatusBoard::new("node-a", "program", "felix"));
    board.set_decision(&example_decision(Role::Felix));
    let (registry, _metrics) = crate::observe::Metrics::new_registry();
    let app = crate::observe::http::router(registry, health, board);
    let resp = app.oneshot(axum::http::Request::get(STATUS_PATH).body(axum::body::Body::empty()).unwrap()).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/json");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let doc: StatusDocument = serde_json::from_slice(&body).unwrap();
    assert!(doc.readiness.ready);
    assert_eq!(doc.classes.len(), 3);
    let raw: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(raw["apiVersion"], "routewarden.io/v1");
    assert_eq!(raw["classes"][0]["programmedHere"], true);
}
