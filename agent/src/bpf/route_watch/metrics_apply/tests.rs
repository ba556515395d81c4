use super::*;
use crate::bpf::route_watch::event::{RouteChange, WriterInfo};
use prometheus_client::encoding::text::encode;
use routewarden_common::route_watch::WriterClass;

fn writer(class: &'static str, protocol: u8) -> WriterInfo {
    WriterInfo { protocol, class, class_inferred: false, kernel: false, netlink_port: Some(7), pid: None, comm: None }
}

fn conflict() -> RouteWatchEvent {
    RouteWatchEvent::Conflict {
        route: RouteChange {
            at_ns: 1,
            family: "ipv4",
            op: "replace",
            table: 254,
            dst: "10.244.20.0/26".parse().unwrap(),
            metric: 1024,
            oif: 2,
            gateway: None,
            nexthop_id: None,
            writer: writer("bird", 12),
        },
        previous: writer("self", 80),
        writes_in_window: 2,
    }
}

fn flap(family: &'static str) -> RouteWatchEvent {
    let RouteWatchEvent::Conflict { mut route, previous, .. } = conflict() else { unreachable!() };
    route.family = family;
    route.dst = if family == "ipv6" { "fd00:10:244::/122".parse().unwrap() } else { route.dst };
    RouteWatchEvent::Flap { route, previous, changes_in_window: 3 }
}

/// 2,000 adds and deletes of `proto static` /32s outside every IP pool by
/// another program were 2,001 conflicts and flaps, and as many WARN lines. Outside the
/// scope (the pools, routewarden's own keys) an episode counts nowhere; inside, as before;
/// a foreign writer overwriting routewarden's own key outside the pools (a retired pool)
/// still counts.
#[test]
fn episodes_count_only_inside_the_pools_and_on_our_keys() {
    let (registry, metrics) = Metrics::new_registry();
    let mut state = RouteWatchMetrics::new(Duration::from_secs(30));
    state.set_scope(EpisodeScope { pools: vec!["10.244.0.0/16".parse().unwrap(), "fd00:10:244::/48".parse().unwrap()], protocol: 80, table: 254 });
    let outside = |i: u32, writer: WriterInfo, previous: WriterInfo| {
        let RouteWatchEvent::Conflict { mut route, .. } = conflict() else { unreachable!() };
        route.dst = IpNet::new(std::net::Ipv4Addr::from(0xc0a8_0000 + i).into(), 32).unwrap();
        route.writer = writer;
        RouteWatchEvent::Conflict { route, previous, writes_in_window: 2 }
    };
    let t = Instant::now();
    for i in 0..2_000 {
        state.apply_event(&metrics, &outside(i, writer("static", 4), writer("static", 4)), t);
        let RouteWatchEvent::Conflict { route, previous, .. } = outside(i, writer("static", 4), writer("static", 4)) else { unreachable!() };
        state.apply_event(&metrics, &RouteWatchEvent::Flap { route, previous, changes_in_window: 3 }, t);
    }
    assert_eq!((state.unjudged(), state.flapping()), (4_000, 0));
    state.apply_event(&metrics, &conflict(), t);
    state.apply_event(&metrics, &flap("ipv6"), t);
    state.apply_event(&metrics, &outside(7, writer("static", 4), writer("self", 80)), t);
    assert_eq!((state.unjudged(), state.flapping()), (4_000, 3));
    let mut out = String::new();
    encode(&mut out, &registry).unwrap();
    let mut series: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("routewarden_route_conflicts_total") || l.starts_with("routewarden_route_flaps_total"))
        .filter(|l| !l.ends_with(" 0"))
        .collect();
    series.sort_unstable();
    assert_eq!(
        series,
        [
            r#"routewarden_route_conflicts_total{family="ipv4",writers="self+bird"} 1"#,
            r#"routewarden_route_conflicts_total{family="ipv4",writers="self+static"} 1"#,
            r#"routewarden_route_flaps_total{family="ipv6"} 1"#,
        ]
    );
}

/// A fight over thousands of prefixes logs at most 20 episode lines each 10 s, then one
/// line with how many were held back; the counters have every episode.
#[test]
fn episode_lines_are_rate_limited() {
    let (_registry, metrics) = Metrics::new_registry();
    let mut state = RouteWatchMetrics::new(Duration::from_secs(30));
    let t0 = Instant::now();
    state.logged.0 = t0;
    let logged = (0..5_000).filter(|_| state.may_log(t0)).count();
    assert_eq!((logged, state.logged.2), (20, 4_980));
    assert!(state.may_log(t0 + Duration::from_secs(10)));
    assert_eq!((state.logged.1, state.logged.2), (1, 0));
    for _ in 0..3 {
        state.apply_event(&metrics, &conflict(), t0 + Duration::from_secs(11));
    }
    assert_eq!(metrics.route_conflicts.get_or_create(&crate::observe::metrics::RouteConflictLabels { family: "ipv4", writers: "self+bird".into() }).get(), 3);
}

#[test]
fn counters_become_labelled_deltas() {
    let (registry, metrics) = Metrics::new_registry();
    let mut state = RouteWatchMetrics::new(Duration::from_secs(30));
    state.set_backend(&metrics, Some(RouteWatchBackend::SocketFilter));
    let mut c = RouteWatchCounters::default();
    c.writes[0][1][WriterClass::Bird as usize] = 5;
    c.conflicts[0][WriterClass::Bird as usize][WriterClass::SelfAgent as usize] = 1;
    c.flaps[1] = 2;
    c.flushes[0] = 3;
    c.records_lost = 4;
    state.apply_counters(&metrics, &c);
    c.writes[0][1][WriterClass::Bird as usize] = 8;
    state.apply_counters(&metrics, &c);
    // The kernel's conflict and flap counters are not used: their events count.
    state.apply_event(&metrics, &conflict(), Instant::now());
    state.apply_event(&metrics, &flap("ipv6"), Instant::now());
    state.apply_event(&metrics, &flap("ipv6"), Instant::now());
    let mut out = String::new();
    encode(&mut out, &registry).unwrap();
    assert!(out.contains(r#"routewarden_route_writes_total{family="ipv4",op="replace",writer="bird"} 8"#), "{out}");
    assert!(out.contains(r#"routewarden_route_conflicts_total{family="ipv4",writers="self+bird"} 1"#), "{out}");
    assert!(out.contains(r#"routewarden_route_flaps_total{family="ipv6"} 2"#), "{out}");
    assert!(out.contains(r#"routewarden_route_flushes_total{family="ipv4"} 3"#), "{out}");
    assert!(out.contains("routewarden_route_watch_events_lost_total 4"), "{out}");
    assert!(out.contains(r#"routewarden_route_watch_backend_info{backend="socket-filter"} 1"#), "{out}");
    assert!(out.contains(r#"routewarden_route_watch_backend_info{backend="fentry"} 0"#), "{out}");
}

#[test]
fn flapping_gauge_holds_then_clears() {
    let (_r, metrics) = Metrics::new_registry();
    let mut state = RouteWatchMetrics::new(Duration::from_secs(4));
    let t0 = Instant::now();
    state.apply_event(&metrics, &conflict(), t0);
    assert_eq!(metrics.flapping_prefixes.get(), 1);
    state.apply_event(&metrics, &conflict(), t0 + Duration::from_secs(3));
    state.tick(&metrics, t0 + Duration::from_secs(6));
    assert_eq!(metrics.flapping_prefixes.get(), 1, "re-emitted within the window: still flapping");
    state.tick(&metrics, t0 + Duration::from_secs(9));
    assert_eq!(metrics.flapping_prefixes.get(), 0);
}
