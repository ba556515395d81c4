//! Node Events from a real fight: in a network namespace of the test's own, the route watch
//! (socket filter, which every kernel loads) sees `ip` run as `bird` and a plain `ip` overwrite
//! each other's route to 10.244.20.0/26; the app's triggers and the recorder task record
//! exactly one `RouteConflict` and one `RouteFlap` Event on the Node in the API-server
//! stand-in, under the RBAC `deploy/` ships, each naming both writers by class, protocol,
//! process and pid.

mod route_watch_common;

use std::time::{Duration, Instant};

use ipnet::IpNet;
use route_watch_common::{config, lab, runtime, start_or_skip, Harness, IpWriter, WINDOW};
use routewarden::app::node_events::NodeEventTriggers;
use routewarden::bpf::route_watch::{EpisodeScope, RouteWatchBackend};
use routewarden::observe::node_events::{spawn_with, Aggregator};
use routewarden::observe::Metrics;
use routewarden::vocabulary::PoolClass;
use routewarden_lab::standin::{ApiServer, Rbac, User};

/// `kubectl kustomize deploy/` (`None`, with a SKIPPED line, without kubectl).
fn rendered(test: &str) -> Option<String> {
    let Ok(out) = std::process::Command::new("kubectl").arg("kustomize").arg(routewarden_lab::deploy_dir()).output() else {
        routewarden_lab::skip(test, "no kubectl (its kustomize renders deploy/)");
        return None;
    };
    assert!(out.status.success(), "kubectl kustomize deploy/: {}", String::from_utf8_lossy(&out.stderr));
    Some(String::from_utf8(out.stdout).unwrap())
}

#[test]
fn a_real_fight_records_one_conflict_and_one_flap_event() {
    let test = "a_real_fight_records_one_conflict_and_one_flap_event";
    let Some(manifests) = rendered(test) else { return };
    if routewarden_lab::skip_unless_root(test) {
        return;
    }
    let _ns = lab();
    let Some(watch) = start_or_skip(test, RouteWatchBackend::SocketFilter, &config()) else { return };
    runtime().block_on(async {
        let mut h = Harness::new(watch);
        let api = ApiServer::new().with_rbac(Rbac::from_manifests(&manifests).unwrap());
        api.set_tokens([("agent-token".to_owned(), User::service_account("routewarden", "routewarden"))]);
        let service = tower::ServiceBuilder::new()
            .map_request(|mut r: http::Request<kube::client::Body>| {
                r.headers_mut().insert(http::header::AUTHORIZATION, http::HeaderValue::from_static("Bearer agent-token"));
                r
            })
            .service(api.service::<kube::client::Body>());
        let (_registry, metrics) = Metrics::new_registry();
        metrics.declare_node_events(true);
        // A period longer than the test: one call per reason, the first occurrence.
        let (sink, _task) = spawn_with(kube::Client::new(service, "default"), "node-a", metrics.clone(), Aggregator::new(Duration::from_hours(1), 256));
        let pool: IpNet = "10.244.0.0/16".parse().unwrap();
        let mut triggers = NodeEventTriggers::new(WINDOW);
        triggers.set_scope(EpisodeScope { pools: vec![pool], protocol: 80, table: 254 }, vec![(pool, Some(PoolClass::Ipip))]);

        let (mut bird, mut other) = (IpWriter::spawn_as("bird"), IpWriter::spawn());
        for _ in 0..15 {
            bird.run("route replace 10.244.20.0/26 via 10.0.0.12 dev veth0 proto 12 metric 1024");
            other.run("route replace 10.244.20.0/26 via 10.0.0.13 dev veth0 proto static metric 1024");
            h.pump(Duration::from_millis(50)).await;
        }
        h.pump_counted_episodes(test).await;
        assert!(!h.conflicts().is_empty() && !h.flaps().is_empty(), "{test}: a conflict and a flap: {:?}", h.events);
        for (_, ev) in &h.events {
            if let Some(e) = triggers.on_route_watch(ev) {
                sink.record(e);
            }
        }
        let started = Instant::now();
        while api.events().len() < 2 && started.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let b = format!("bird(proto 12, bird[{}])", bird.pid());
        let o = format!("other(proto 4, ip[{}])", other.pid());
        let place = "10.244.20.0/26 in table 254 (pool class ipip)";
        let conflicts = [b.as_str(), o.as_str()].map(|w| {
            let p = if w == b { &o } else { &b };
            format!("{place}: {w} overwrote or deleted the route of {p}: two writers program this prefix")
        });
        let flaps = [b.as_str(), o.as_str()].map(|w| {
            let p = if w == b { &o } else { &b };
            format!("{place}: 3 changes within the {} s window, the last by {w} after {p}", WINDOW.as_secs())
        });
        let mut events = api.events();
        events.sort_by_key(|e| e["reason"].as_str().unwrap().to_owned());
        for e in &events {
            eprintln!("{} {:?} count {}", e["reason"], e["note"], e["series"]["count"].as_u64().unwrap_or(1));
        }
        assert_eq!(events.len(), 2, "{test}: {events:?}");
        assert_eq!((events[0]["reason"].as_str(), events[1]["reason"].as_str()), (Some("RouteConflict"), Some("RouteFlap")));
        assert!(conflicts.iter().any(|n| events[0]["note"] == n.as_str()), "{test}: {} is none of {conflicts:?}", events[0]["note"]);
        assert!(flaps.iter().any(|n| events[1]["note"] == n.as_str()), "{test}: {} is none of {flaps:?}", events[1]["note"]);
        for e in &events {
            assert_eq!(e["regarding"], serde_json::json!({"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "node-a"}));
            assert!(e.get("series").is_none_or(serde_json::Value::is_null), "{test}: one call per reason: {e}");
        }
        let calls: Vec<(String, u16)> = api.log().entries().into_iter().filter(|r| r.path.contains("/events")).map(|r| (r.method, r.status)).collect();
        assert_eq!(calls, [("POST".to_owned(), 201), ("POST".to_owned(), 201)]);
    });
}
