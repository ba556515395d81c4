//! Kubernetes Events on the Node through the agent's own recorder path (the app's triggers,
//! the queue, the aggregator and kube-runtime's `Recorder` in `observe::node_events`) against
//! the API-server stand-in, as the agent's service account under exactly the RBAC `deploy/`
//! ships (`kubectl kustomize deploy/`, authorized by the stand-in): a scripted fight records
//! exactly two Events whose counts rise once each; without the Role, or with a failing API
//! server, every Event is counted as failed and nothing waits; a quiet node records nothing.
//!
//! The script runs on a scaled clock ([`SECOND`] of real time per second of the script), the
//! aggregator's period scaled with it.

use std::time::Duration;

use ipnet::IpNet;
use routewarden::app::node_events::NodeEventTriggers;
use routewarden::bpf::route_watch::{EpisodeScope, RouteChange, RouteWatchEvent, WriterInfo};
use routewarden::observe::metrics::{NodeEventFailureLabels, NodeEventLabels};
use routewarden::observe::node_events::{spawn_with, Aggregator, NodeEventSink};
use routewarden::observe::Metrics;
use routewarden::vocabulary::PoolClass;
use routewarden_lab::standin::{ApiServer, Rbac, User};
use serde_json::{json, Value};

/// One second of the script in real time.
const SECOND: Duration = Duration::from_millis(25);

const NODE: &str = "node-a";
const PREFIX: &str = "10.244.1.0/26";
const TOKEN: &str = "agent-token";

/// `kubectl kustomize deploy/` (`None`, with a SKIPPED line, without kubectl).
fn rendered(test: &str) -> Option<String> {
    let Ok(out) = std::process::Command::new("kubectl").arg("kustomize").arg(routewarden_lab::deploy_dir()).output() else {
        routewarden_lab::skip(test, "no kubectl (its kustomize renders deploy/)");
        return None;
    };
    assert!(out.status.success(), "kubectl kustomize deploy/: {}", String::from_utf8_lossy(&out.stderr));
    Some(String::from_utf8(out.stdout).unwrap())
}

/// The stand-in authorizing by `manifests`' RBAC, and a client of it that authenticates as the
/// DaemonSet's service account (routewarden/routewarden).
fn standin(manifests: &str) -> (ApiServer, kube::Client) {
    let api = ApiServer::new().with_rbac(Rbac::from_manifests(manifests).unwrap());
    api.set_tokens([(TOKEN.to_owned(), User::service_account("routewarden", "routewarden"))]);
    let service = tower::ServiceBuilder::new()
        .map_request(|mut r: http::Request<kube::client::Body>| {
            r.headers_mut().insert(http::header::AUTHORIZATION, http::HeaderValue::from_static("Bearer agent-token"));
            r
        })
        .service(api.service::<kube::client::Body>());
    (api, kube::Client::new(service, "default"))
}

/// The recorder task with the period scaled to the script's clock.
fn recorder(client: kube::Client, metrics: &std::sync::Arc<Metrics>) -> NodeEventSink {
    metrics.declare_node_events(true);
    spawn_with(client, NODE, metrics.clone(), Aggregator::new(SECOND * 60, 256)).0
}

/// The app's triggers inside the IPIP pool 10.244.0.0/16, window 30 s.
fn triggers() -> NodeEventTriggers {
    let pool: IpNet = "10.244.0.0/16".parse().unwrap();
    let mut t = NodeEventTriggers::new(Duration::from_secs(30));
    t.set_scope(EpisodeScope { pools: vec![pool], protocol: 80, table: 254 }, vec![(pool, Some(PoolClass::Ipip))]);
    t
}

fn writer(class: &'static str, protocol: u8, pid: u32, comm: &str) -> WriterInfo {
    WriterInfo { protocol, class, class_inferred: false, kernel: false, netlink_port: None, pid: Some(pid), comm: Some(comm.into()) }
}

/// An episode at second `s` of a fight between BIRD (even seconds) and `ip` (odd ones).
fn episode(flap: bool, dst: &str, s: u64) -> RouteWatchEvent {
    let (bird, ip) = (writer("bird", 12, 4242, "bird"), writer("other", 4, 4343, "ip"));
    let (w, previous) = if s.is_multiple_of(2) { (bird, ip) } else { (ip, bird) };
    let route = RouteChange {
        at_ns: s * 1_000_000_000,
        family: "ipv4",
        op: "replace",
        table: 254,
        dst: dst.parse().unwrap(),
        metric: 1024,
        oif: 3,
        gateway: None,
        nexthop_id: None,
        writer: w,
    };
    if flap {
        RouteWatchEvent::Flap { route, previous, changes_in_window: 3 }
    } else {
        RouteWatchEvent::Conflict { route, previous, writes_in_window: 2 }
    }
}

/// Play `(second, event)`s through the triggers into `sink` on the scaled clock, then wait
/// until second `until`.
async fn play(sink: &NodeEventSink, script: &[(u64, RouteWatchEvent)], until: u64) {
    let triggers = triggers();
    let start = tokio::time::Instant::now();
    for (s, ev) in script {
        tokio::time::sleep_until(start + SECOND * u32::try_from(*s).unwrap()).await;
        if let Some(e) = triggers.on_route_watch(ev) {
            sink.record(e);
        }
    }
    tokio::time::sleep_until(start + SECOND * u32::try_from(until).unwrap()).await;
}

/// (method, status) of every Event request the stand-in answered.
fn event_requests(api: &ApiServer) -> Vec<(String, u16)> {
    api.log().entries().into_iter().filter(|r| r.path.contains("/events")).map(|r| (r.method, r.status)).collect()
}

fn recorded(metrics: &Metrics, reason: &'static str) -> u64 {
    metrics.node_events_recorded.get_or_create(&NodeEventLabels { reason }).get()
}

fn failed(metrics: &Metrics, reason: &'static str, error: &'static str) -> u64 {
    metrics.node_events_failed.get_or_create(&NodeEventFailureLabels { reason, error }).get()
}

/// An Event as `kubectl describe node` shows it: reason, note, count.
fn summary(e: &Value) -> (String, String, u64) {
    (e["reason"].as_str().unwrap().to_owned(), e["note"].as_str().unwrap().to_owned(), e["series"]["count"].as_u64().unwrap_or(1))
}

/// BIRD and `ip` fight over 10.244.1.0/26 for 60 s. The route watch reports a conflict at 1 s
/// and 31 s and a flap at 3 s and 33 s (`ebpf/src/route_detector.rs`: one of each per prefix per
/// 30 s window): two Events, created at once and raised to count 2 at the end of the minute,
/// in four API calls, all allowed by the shipped Role.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scripted_fight_records_two_events_counted_twice() {
    let Some(manifests) = rendered("a_scripted_fight_records_two_events_counted_twice") else { return };
    let (api, client) = standin(&manifests);
    let (_registry, metrics) = Metrics::new_registry();
    let sink = recorder(client, &metrics);
    let script = [(1, episode(false, PREFIX, 1)), (3, episode(true, PREFIX, 3)), (31, episode(false, PREFIX, 31)), (33, episode(true, PREFIX, 33))];
    play(&sink, &script, 100).await;

    let events = api.events();
    for e in &events {
        eprintln!("{:?}", summary(e));
    }
    let conflict = "10.244.1.0/26 in table 254 (pool class ipip): other(proto 4, ip[4343]) overwrote or deleted the route of bird(proto 12, bird[4242]): two writers program this prefix";
    let flap =
        "10.244.1.0/26 in table 254 (pool class ipip): 3 changes within the 30 s window, the last by other(proto 4, ip[4343]) after bird(proto 12, bird[4242])";
    let mut got: Vec<_> = events.iter().map(summary).collect();
    got.sort();
    assert_eq!(got, [("RouteConflict".to_owned(), conflict.to_owned(), 2), ("RouteFlap".to_owned(), flap.to_owned(), 2)]);
    for e in &events {
        assert_eq!(e["regarding"], json!({"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": NODE}));
        assert_eq!(e["metadata"]["namespace"], "default");
        assert_eq!((e["type"].as_str(), e["action"].as_str()), (Some("Warning"), Some("WatchRoutes")));
        assert_eq!((e["reportingController"].as_str(), e["reportingInstance"].as_str()), (Some("routewarden"), Some("routewarden-node-a")));
        assert!(e["series"]["lastObservedTime"].is_string(), "{e}");
    }
    let mut calls = event_requests(&api);
    calls.sort();
    assert_eq!(calls, [("PATCH".to_owned(), 200), ("PATCH".to_owned(), 200), ("POST".to_owned(), 201), ("POST".to_owned(), 201)]);
    assert_eq!((recorded(&metrics, "RouteConflict"), recorded(&metrics, "RouteFlap")), (2, 2));
    assert_eq!(failed(&metrics, "RouteConflict", "api") + failed(&metrics, "RouteFlap", "api"), 0);
}

/// Without the shipped Role the API server refuses the Event (403); with it but a failing API
/// server, 500. Each refusal is counted once, nothing is stored, and 10,000 episodes queued in
/// a burst cost the caller no wait: every one is recorded, refused or dropped, and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_events_are_counted_and_never_block() {
    let Some(manifests) = rendered("refused_events_are_counted_and_never_block") else { return };
    // The rendered manifests without the Node Events' Role and RoleBinding.
    let without: Vec<&str> = manifests.split("\n---\n").filter(|doc| !doc.contains("name: routewarden-node-events")).collect();
    let (api, client) = standin(&without.join("\n---\n"));
    let (_registry, metrics) = Metrics::new_registry();
    let sink = recorder(client, &metrics);
    play(&sink, &[(1, episode(false, PREFIX, 1))], 10).await;
    assert_eq!(event_requests(&api), [("POST".to_owned(), 403)]);
    assert_eq!((recorded(&metrics, "RouteConflict"), failed(&metrics, "RouteConflict", "api")), (0, 1));

    let (api, client) = standin(&manifests);
    api.fail_event_writes(Some(500));
    let (_registry, metrics) = Metrics::new_registry();
    let sink = recorder(client, &metrics);
    let triggers = triggers();
    let burst: Vec<_> = (0..10_000u32).map(|i| episode(false, &format!("10.244.{}.{}/32", i / 256, i % 256), 1)).collect();
    let started = std::time::Instant::now();
    for ev in &burst {
        sink.record(triggers.on_route_watch(ev).unwrap());
    }
    let spent = started.elapsed();
    assert!(spent < Duration::from_secs(1), "queueing 10,000 episodes took {spent:?}");
    tokio::time::sleep(SECOND * 20).await;
    assert!(api.events().is_empty());
    let (api_failed, dropped) = (failed(&metrics, "RouteConflict", "api"), failed(&metrics, "RouteConflict", "dropped"));
    // The first 256 subjects are tried (and refused); every other episode is dropped.
    assert_eq!((recorded(&metrics, "RouteConflict"), api_failed, dropped), (0, 256, 10_000 - 256));
    assert_eq!(event_requests(&api).len(), 256);
    assert!(event_requests(&api).iter().all(|r| *r == ("POST".to_owned(), 500)));
}

/// A node where nobody fights records nothing: single writes and link events are no episodes,
/// and episodes outside the IP pools are not the cluster's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_node_records_nothing() {
    let Some(manifests) = rendered("a_quiet_node_records_nothing") else { return };
    let (api, client) = standin(&manifests);
    let (_registry, metrics) = Metrics::new_registry();
    let sink = recorder(client, &metrics);
    let RouteWatchEvent::Conflict { route, .. } = episode(false, PREFIX, 0) else { unreachable!() };
    let script = [
        (1, RouteWatchEvent::Write { route: route.clone() }),
        (2, RouteWatchEvent::LinkDown { at_ns: 2, ifindex: 3 }),
        (3, episode(false, "192.168.7.0/24", 3)),
        (5, episode(true, "192.168.7.0/24", 5)),
    ];
    play(&sink, &script, 130).await;
    assert!(api.events().is_empty());
    assert_eq!(event_requests(&api), []);
    for reason in ["RouteConflict", "RouteFlap", "RouteOwnershipInconsistent", "RouteMassDeletionHeld", "RouteWriterFailing"] {
        assert_eq!((recorded(&metrics, reason), failed(&metrics, reason, "api"), failed(&metrics, reason, "dropped")), (0, 0, 0), "{reason}");
    }
}
