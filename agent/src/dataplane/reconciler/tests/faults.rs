//! Failures: interrupted dumps, failed writes and resyncs, missing or flapping devices, routes removed by others; retries and backoff.

use super::*;

#[tokio::test]
async fn dump_interrupted_is_retried_and_errors_back_off() {
    let (mut r, nl, clock) = setup(None);
    nl.state().interrupt_dumps = 2;
    nl.state().fail_writes.insert(block("10.244.20.0/26"), (Errno::ENETUNREACH, 2));
    r.set_desired(&cluster());
    let rep = r.apply().await;
    assert!(rep.resynced && !rep.resync_failed);
    assert_eq!(rep.errors[&ErrorKind::DumpInterrupted], 2);
    assert_eq!(rep.errors[&ErrorKind::NetUnreachable], 1);
    assert_eq!(rep.writes, 5);
    // Not yet due: nothing retried.
    let rep = r.apply().await;
    assert_eq!(rep.writes + rep.error_count(), 0);
    clock.advance(Duration::from_millis(250));
    let rep = r.apply().await;
    assert_eq!(rep.errors[&ErrorKind::NetUnreachable], 1);
    clock.advance(Duration::from_millis(450));
    let rep = r.apply().await;
    assert_eq!(rep.writes, 1);
    assert_eq!(rep.pending, 0);
}

#[tokio::test]
async fn failed_resync_reports_and_retries() {
    let (mut r, nl, clock) = setup(None);
    nl.state().dump_errno = Some(Errno::EBUSY);
    r.set_desired(&cluster());
    let rep = r.apply().await;
    assert!(rep.resync_failed);
    assert_eq!(rep.writes, 0);
    nl.state().dump_errno = None;
    clock.advance(Duration::from_secs(1));
    let rep = r.apply().await;
    assert_eq!(rep.writes, 6);
}

#[tokio::test]
async fn missing_tunnel_device_reported_and_retried() {
    let (mut r, nl, clock) = setup(None);
    nl.state().links.remove(&TUNL0);
    r.set_desired(&cluster());
    let rep = r.apply().await;
    assert_eq!(rep.waiting_for_device["tunl0"], 2);
    assert_eq!(rep.errors[&ErrorKind::NoDevice], 2);
    assert_eq!(rep.writes, 4);
    nl.state().links.insert(9, crate::dataplane::kernel::netlink::LinkInfo { index: 9, name: "tunl0".into(), up: true });
    clock.advance(Duration::from_secs(1));
    let rep = r.apply().await;
    assert_eq!(rep.writes, 2, "{rep:?}");
    assert!(nl.state().routes.values().any(|o| o.oif == Some(9)));
}

#[tokio::test]
async fn link_flap_reinstalls_flushed_routes() {
    let (mut r, nl, _clock) = setup(None);
    r.set_desired(&cluster());
    r.apply().await;
    nl.take_log();
    // eth0 goes down: the kernel flushes IPv4 routes silently.
    nl.state().links.get_mut(&ETH0).unwrap().up = false;
    nl.state().routes.retain(|_, o| o.oif != Some(ETH0) || o.key.family == Family::V6);
    r.handle_event(&DataplaneEvent::LinkDown { index: ETH0, name: "eth0".into() });
    let rep = r.apply().await;
    assert_eq!(rep.writes, 0, "nothing written to a down device");
    nl.state().links.get_mut(&ETH0).unwrap().up = true;
    r.handle_event(&DataplaneEvent::LinkUp { index: ETH0, name: "eth0".into() });
    let rep = r.apply().await;
    assert_eq!(rep.writes, 2, "{rep:?}");
    assert!(nl.state().routes.contains_key(&RouteKey::new(254, block("10.244.20.0/26"), 0, 1024)));
}

#[tokio::test]
async fn route_deleted_by_someone_else_is_reinstalled() {
    let (mut r, nl, _clock) = setup(None);
    r.set_desired(&cluster());
    r.apply().await;
    let key = RouteKey::new(254, block("10.244.30.0/26"), 0, 1024);
    let gone = nl.state().routes.remove(&key).unwrap();
    r.handle_event(&DataplaneEvent::RouteRemoved { route: gone, writer_port: 4242 });
    assert!(r.needs_apply());
    let rep = r.apply().await;
    assert_eq!(rep.writes, 1);
    assert!(nl.state().routes.contains_key(&key));
}

/// A route whose write failed waits out its backoff, unless it changes meanwhile: the changed
/// route is written by the next apply at once, the unchanged one still waits.
#[tokio::test]
async fn a_failed_route_that_changes_is_written_without_waiting_for_its_backoff() {
    let (mut r, nl, _clock) = setup(None);
    nl.state().fail_writes.insert(block("10.244.30.0/26"), (Errno::ENOBUFS, 1));
    nl.state().fail_writes.insert(block("10.244.10.7/32"), (Errno::ENOBUFS, 1));
    r.set_desired(&cluster());
    let rep = r.apply().await;
    assert_eq!((rep.writes, rep.write_errors), (4, 2), "{rep:?}");
    nl.take_log();
    // Same instant: both still in their 200-ms backoff; one of them now has a new next hop.
    let moved: Vec<ClusterRoute> = cluster()
        .into_iter()
        .map(|c| if c.dst.to_string() == "10.244.30.0/26" { cr("10.244.30.0/26", RoutePath::Tunnel, Some("10.0.1.14")) } else { c })
        .collect();
    r.set_desired(&moved);
    let rep = r.apply().await;
    assert_eq!((rep.writes, rep.write_errors), (1, 0), "{rep:?}");
    assert_eq!(nl.take_log(), ["create 10.244.30.0/26 table 254 metric 1024"]);
    let key = RouteKey::new(254, block("10.244.30.0/26"), 0, 1024);
    assert_eq!(nl.state().routes[&key].gateway, Some("10.0.1.14".parse().unwrap()));
    assert!(!nl.state().routes.contains_key(&RouteKey::new(254, block("10.244.10.7/32"), 0, 1024)), "the unchanged one waits");
}

/// A key held by another writer is looked at again at the resync interval (90 s),
/// not at every backoff step, and reported once per hold.
#[tokio::test]
async fn held_key_is_retried_at_the_resync_interval_not_every_backoff_step() {
    let (mut r, nl, clock) = setup(None);
    let f = ObservedRoute { gateway: Some("10.0.0.12".parse().unwrap()), ..foreign("10.244.20.0/26", 17, Some(ETH0), RouteKind::Unicast) };
    nl.insert(f.clone());
    r.set_desired(&cluster());
    let rep = r.apply().await;
    assert_eq!(rep.conflicts.len(), 1, "{rep:?}");
    assert_eq!(rep.write_errors, 1, "the hold is one error when first seen");
    let attempts = || std::mem::take(&mut nl.state().refused).iter().filter(|k| k.dst.to_string() == "10.244.20.0/26").count();
    assert_eq!(attempts(), 1);
    // Past every backoff step (the longest is 30 s), before the resync interval: not tried.
    let mut at = 0;
    for s in [1, 5, 30, 60, 89] {
        clock.advance(Duration::from_secs(s - at));
        at = s;
        let rep = r.apply().await;
        assert!(rep.conflicts.is_empty(), "{rep:?}");
        assert_eq!(attempts(), 0, "tried again after {s} s");
    }
    // At the resync interval: one more try, still not reported again, and not counted as
    // another error (a long hold must not also page as RouteProgrammingErrors).
    clock.advance(Duration::from_secs(91 - at));
    let rep = r.apply().await;
    assert!(rep.conflicts.is_empty(), "{rep:?}");
    assert_eq!((rep.write_errors, rep.error_count()), (0, 0), "{rep:?}");
    assert_eq!(attempts(), 1);
    assert_eq!(nl.state().routes[&f.key], f);
}

/// Many routes, so the one-pass paths run (the cold start's bulk-built kernel view and dirty
/// set, the resync's merged marking, set_desired's merged diff): unsorted input with a
/// duplicate destination, failed writes in the middle of the cold start, a foreign route at
/// one of our keys and a stale route of ours. Every route must still be accounted for
/// exactly: the failures retried (and only they), the foreign route never touched, the stale
/// route deleted, and a no-change resync writing nothing.
#[tokio::test]
async fn a_large_cold_start_with_failures_then_changes_keeps_every_invariant() {
    let (mut r, nl, clock) = setup(None);
    let dst = |i: u32| format!("10.244.{}.{}/26", i / 4, (i % 4) * 64);
    let mut routes: Vec<ClusterRoute> = (0..600).map(|i| cr(&dst(i), RoutePath::Tunnel, Some("10.0.1.13"))).collect();
    routes.reverse();
    // A second route for one destination, ahead of the first in the input: the first in
    // ClusterRoute order (Tunnel sorts before HostNic) wins, whatever the input order.
    routes.insert(0, cr(&dst(7), RoutePath::HostNic, Some("10.0.0.12")));
    // Stale: ours, not desired. Foreign: another protocol at a desired key.
    nl.insert(ObservedRoute { protocol: 80, ..foreign("10.244.200.0/26", 80, Some(TUNL0), RouteKind::Unicast) });
    nl.insert(foreign(&dst(9), 4, Some(ETH0), RouteKind::Unicast));
    nl.state().fail_writes.insert(block(&dst(300)), (Errno::ENETUNREACH, 1));
    nl.state().fail_writes.insert(block(&dst(301)), (Errno::ENOBUFS, 1));
    r.set_desired(&routes);
    let rep = r.apply().await;
    // 600 destinations: 2 failed, 1 held by the foreign route, 597 written; the stale one goes.
    assert_eq!((rep.writes, rep.write_errors, rep.deletes), (597, 3, 1), "{rep:?}");
    assert_eq!(rep.conflicts.len(), 1);
    {
        let st = nl.state();
        assert_eq!(st.routes[&RouteKey::new(254, block(&dst(9)), 0, 1024)].protocol, 4, "the foreign route is untouched");
        assert_eq!(st.routes[&RouteKey::new(254, block(&dst(7)), 0, 1024)].oif, Some(TUNL0), "the first route of a key wins");
        assert!(!st.routes.contains_key(&RouteKey::new(254, block("10.244.200.0/26"), 0, 1024)), "the stale route is deleted");
    }
    nl.take_log();
    // The retries write exactly the two failed routes.
    clock.advance(Duration::from_secs(5));
    let rep = r.apply().await;
    assert_eq!((rep.writes, rep.deletes), (2, 0), "{rep:?}");
    let log = nl.take_log();
    assert_eq!(log.len(), 2, "{log:?}");
    // Drop every other route and move one to the host NIC: one replace, and 299 deletes (the
    // odd destinations but the foreign-held one), held by the mass-deletion breaker or not.
    let mut next: Vec<ClusterRoute> = (0..600).step_by(2).map(|i| cr(&dst(i), RoutePath::Tunnel, Some("10.0.1.13"))).collect();
    next[1] = cr(&dst(2), RoutePath::HostNic, Some("10.0.0.12"));
    r.set_desired(&next);
    let rep = r.apply().await;
    assert_eq!(rep.writes, 1, "{rep:?}");
    assert_eq!(rep.deletes + rep.deletes_held_mass as u64, 299, "{rep:?}");
    // A no-change resync writes nothing (held deletes may still go out after the settle).
    clock.advance(Duration::from_secs(91));
    let rep = r.apply().await;
    assert!(rep.resynced);
    assert_eq!(rep.writes, 0, "{rep:?}");
    assert_eq!(nl.state().routes[&RouteKey::new(254, block(&dst(9)), 0, 1024)].protocol, 4);
}

/// A cold start whose devices are all down writes nothing and leaves its keys to the link-up
/// event or the next resync; with no event (the link came up unseen), the next resync marks
/// every desired key again although set_desired marked them once (the keys left the dirty
/// set meanwhile) and the routes go in.
#[tokio::test]
async fn a_cold_start_on_down_devices_is_written_by_the_next_resync() {
    let (mut r, nl, clock) = setup(None);
    for index in [ETH0, TUNL0] {
        nl.state().links.get_mut(&index).unwrap().up = false;
    }
    let routes = vec![
        cr("10.244.0.0/26", RoutePath::Tunnel, Some("10.0.1.13")),
        cr("10.244.0.64/26", RoutePath::HostNic, Some("10.0.0.12")),
        cr("10.244.0.128/26", RoutePath::Tunnel, Some("10.0.1.14")),
    ];
    r.set_desired(&routes);
    let rep = r.apply().await;
    assert_eq!((rep.writes, rep.pending), (0, 0), "{rep:?}");
    assert_eq!((rep.waiting_for_device["tunl0"], rep.waiting_for_device["eth0"]), (2, 1), "{rep:?}");
    for index in [ETH0, TUNL0] {
        nl.state().links.get_mut(&index).unwrap().up = true;
    }
    clock.advance(Duration::from_secs(91));
    let rep = r.apply().await;
    assert!(rep.resynced, "{rep:?}");
    assert_eq!((rep.writes, rep.error_count()), (3, 0), "{rep:?}");
    assert_eq!(nl.state().routes.len(), 3);
}
