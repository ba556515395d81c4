//! Handovers: kept until the new owner's route is seen, released in place, the step aside for BIRD and a restart in the middle of one.

use super::*;

#[tokio::test]
async fn handover_keeps_route_until_new_owner_seen() {
    let (mut r, nl, clock) = setup(None);
    r.set_desired(&cluster());
    r.apply().await;
    let handover = Handover { class: PoolClass::Ipip, to: Writer::Bird, protocol: 12, table: 254, metric: Some(0) };
    let without_ipip: Vec<ClusterRoute> = cluster().into_iter().filter(|c| c.class != PoolClass::Ipip).collect();
    r.set_desired_with_handover(&without_ipip, &[handover]);
    let rep = r.apply().await;
    assert_eq!(rep.deletes, 0);
    assert_eq!(rep.deletes_deferred_handover, 4);
    // BIRD's route for one prefix shows up at metric 0 (another key).
    let bird = ObservedRoute { key: RouteKey::new(254, block("10.244.30.0/26"), 0, 0), ..foreign("10.244.30.0/26", 12, Some(TUNL0), RouteKind::Unicast) };
    nl.insert(bird.clone());
    r.handle_event(&DataplaneEvent::RouteAdded { route: bird, writer_port: 7 });
    clock.advance(Duration::from_secs(2));
    let rep = r.apply().await;
    assert_eq!(rep.deletes, 1);
    assert_eq!(rep.handovers.len(), 1);
    assert_eq!(rep.handovers[0].end, HandoverEnd::Seen);
    assert_eq!(rep.handovers[0].waited, Duration::from_secs(2));
    // The others expire after the grace period.
    assert!(r.next_wakeup() <= crate::dataplane::kernel::netlink::Clock::now(&clock) + Duration::from_secs(28));
    clock.advance(Duration::from_secs(29));
    let rep = r.apply().await;
    assert_eq!(rep.deletes, 3);
    assert_eq!(rep.handovers.len(), 3);
    assert!(rep.handovers.iter().all(|h| h.end == HandoverEnd::GraceExpired));
}

#[tokio::test]
async fn handover_to_same_protocol_releases_in_place() {
    let (mut r, nl, _clock) = setup(None);
    r.set_desired(&cluster());
    r.apply().await;
    nl.insert(ObservedRoute { key: RouteKey::new(254, block("10.244.30.0/26"), 0, 0), ..foreign("10.244.30.0/26", 80, Some(TUNL0), RouteKind::Unicast) });
    let cfg_policy = OwnershipPolicy { protocol: 80, ..r.policy().clone() };
    r.set_policy(cfg_policy);
    // Felix at protocol 80 in table 254 == ours: released in place, nothing deleted.
    let handover = Handover { class: PoolClass::Ipip, to: Writer::Felix, protocol: 80, table: 254, metric: None };
    let without_ipip: Vec<ClusterRoute> = cluster().into_iter().filter(|c| c.class != PoolClass::Ipip).collect();
    // Felix programs IPIP with our protocol: its pools are not ours any more (only the
    // no-encap prefixes stay owned).
    let mut disowning = r.policy().clone();
    disowning.owned = vec![block("10.244.20.0/26"), block("fd00:10:244:20::/122")];
    r.set_desired_with_handover(&without_ipip, &[handover]);
    r.set_policy(disowning);
    let rep = r.apply().await;
    assert_eq!(rep.deletes, 0, "{rep:?}");
    assert!(rep.handovers.iter().all(|h| h.end == HandoverEnd::Released));
}

fn ipip_to_bird() -> (Vec<ClusterRoute>, Handover) {
    let without_ipip: Vec<ClusterRoute> = cluster().into_iter().filter(|c| c.class != PoolClass::Ipip).collect();
    (without_ipip, Handover { class: PoolClass::Ipip, to: Writer::Bird, protocol: 12, table: 254, metric: None })
}

fn bird_at(dst: &str, metric: u32) -> ObservedRoute {
    ObservedRoute { key: RouteKey::new(254, block(dst), 0, metric), ..foreign(dst, 12, Some(TUNL0), RouteKind::Unicast) }
}

/// A hand-over to BIRD at our key steps aside make-before-break: copy at metric+1, then the
/// original deleted (BIRD's create-exclusive add can now succeed), then the copy deleted once
/// BIRD's route is seen. Later `set_desired` calls and resyncs keep the copy.
#[tokio::test]
async fn handover_to_bird_steps_aside_to_metric_plus_one() {
    let (mut r, nl, clock) = setup(None);
    r.set_desired(&cluster());
    r.apply().await;
    nl.take_log();
    let (without_ipip, handover) = ipip_to_bird();
    r.set_desired_with_handover(&without_ipip, &[handover]);
    let rep = r.apply().await;
    assert_eq!((rep.writes, rep.deletes, rep.error_count()), (4, 4, 0), "{rep:?}");
    let log = nl.take_log();
    for dst in ["10.244.30.0/26", "10.244.10.7/32", "10.244.10.0/26", "fd00:10:244:10::/122"] {
        let create = log.iter().position(|l| *l == format!("create {dst} table 254 metric 1025"));
        let delete = log.iter().position(|l| *l == format!("delete {dst} table 254 metric 1024"));
        assert!(create.is_some() && delete.is_some() && create < delete, "{dst}: {log:?}");
    }
    let copy = RouteKey::new(254, block("10.244.30.0/26"), 0, 1025);
    assert_eq!(nl.state().routes[&copy].gateway, Some("10.0.1.13".parse().unwrap()));
    assert_eq!(nl.state().routes[&copy].oif, Some(TUNL0));
    // Another set_desired and a resync: the copies stay, nothing is rewritten.
    r.set_desired(&without_ipip);
    r.request_resync();
    clock.advance(Duration::from_secs(1));
    let rep = r.apply().await;
    assert_eq!((rep.writes, rep.deletes), (0, 0), "{rep:?}");
    assert_eq!(rep.deletes_deferred_handover, 4);
    // BIRD's add at metric 1024 now succeeds; its route is seen and our copy goes.
    let bird = bird_at("10.244.30.0/26", 1024);
    nl.insert(bird.clone());
    r.handle_event(&DataplaneEvent::RouteAdded { route: bird, writer_port: 7 });
    clock.advance(Duration::from_secs(1));
    let rep = r.apply().await;
    assert_eq!(nl.take_log(), ["delete 10.244.30.0/26 table 254 metric 1025"]);
    assert_eq!(rep.handovers.len(), 1);
    assert_eq!(rep.handovers[0].end, HandoverEnd::Seen);
    assert_eq!(rep.handovers[0].waited, Duration::from_secs(2));
    assert_eq!(nl.state().routes[&RouteKey::new(254, block("10.244.30.0/26"), 0, 1024)].protocol, 12);
    // The others' copies go when the grace period ends.
    clock.advance(Duration::from_secs(29));
    let rep = r.apply().await;
    assert_eq!(rep.deletes, 3);
    assert!(rep.handovers.iter().all(|h| h.end == HandoverEnd::GraceExpired), "{rep:?}");
    assert!(nl.state().routes.keys().all(|k| k.metric != 1025));
}

/// A class handed over to BIRD comes back before BIRD's routes are seen: its routes go back in
/// at our metric and only then do the stepped-aside copies at metric+1 go (each prefix keeps a
/// route throughout); no copy waits out the grace period.
#[tokio::test]
async fn a_class_taken_back_mid_handover_returns_make_before_break() {
    let (mut r, nl, clock) = setup(None);
    r.set_desired(&cluster());
    r.apply().await;
    let (without_ipip, handover) = ipip_to_bird();
    r.set_desired_with_handover(&without_ipip, &[handover]);
    r.apply().await;
    nl.take_log();
    clock.advance(Duration::from_secs(1));
    r.set_desired(&cluster());
    let rep = r.apply().await;
    assert_eq!((rep.writes, rep.deletes, rep.deletes_deferred_handover, rep.error_count()), (4, 4, 0, 0), "{rep:?}");
    let log = nl.take_log();
    assert_eq!(log.len(), 8, "{log:?}");
    for dst in ["10.244.30.0/26", "10.244.10.7/32", "10.244.10.0/26", "fd00:10:244:10::/122"] {
        let create = log.iter().position(|l| *l == format!("create {dst} table 254 metric 1024"));
        let delete = log.iter().position(|l| *l == format!("delete {dst} table 254 metric 1025"));
        assert!(create.is_some() && delete.is_some() && create < delete, "{dst}: {log:?}");
    }
    // The copies' grace is cut short where the class came back (reported as its end).
    let ends: Vec<(String, HandoverEnd, Duration)> = rep.handovers.iter().map(|h| (h.dst.to_string(), h.end, h.waited)).collect();
    let cut = |dst: &str| (dst.to_string(), HandoverEnd::GraceExpired, Duration::from_secs(1));
    assert_eq!(ends, [cut("10.244.10.0/26"), cut("10.244.10.7/32"), cut("10.244.30.0/26"), cut("fd00:10:244:10::/122")]);
    // Exactly the cluster's routes, ours, at our metric.
    let routes = nl.state().routes.clone();
    assert_eq!(routes.len(), cluster().len(), "{routes:?}");
    assert!(routes.iter().all(|(k, r)| k.metric == 1024 && r.protocol == 80), "{routes:?}");
    assert_eq!(rep.pending, 0, "{rep:?}");
}

/// A failed metric+1 write keeps the original route (no hole); the step aside is retried.
#[tokio::test]
async fn failed_step_aside_keeps_original() {
    let (mut r, nl, clock) = setup(None);
    r.set_desired(&cluster());
    r.apply().await;
    nl.take_log();
    nl.state().fail_writes.insert(block("10.244.30.0/26"), (Errno::ENOBUFS, 1));
    let (without_ipip, handover) = ipip_to_bird();
    r.set_desired_with_handover(&without_ipip, &[handover]);
    let rep = r.apply().await;
    assert_eq!((rep.writes, rep.write_errors, rep.deletes), (3, 1, 3), "{rep:?}");
    let original = RouteKey::new(254, block("10.244.30.0/26"), 0, 1024);
    assert_eq!(nl.state().routes[&original].protocol, 80, "the original stays");
    assert!(!nl.take_log().iter().any(|l| l.starts_with("delete 10.244.30.0/26")));
    clock.advance(Duration::from_secs(1));
    let rep = r.apply().await;
    assert_eq!((rep.writes, rep.deletes), (1, 1), "{rep:?}");
    assert_eq!(nl.take_log(), ["create 10.244.30.0/26 table 254 metric 1025", "delete 10.244.30.0/26 table 254 metric 1024"]);
}

/// A hand-over to BIRD known to write at another metric, or to Felix, does not step aside.
#[tokio::test]
async fn handover_to_other_metric_does_not_step_aside() {
    let (mut r, nl, _clock) = setup(None);
    r.set_desired(&cluster());
    r.apply().await;
    nl.take_log();
    let (without_ipip, handover) = ipip_to_bird();
    r.set_desired_with_handover(&without_ipip, &[Handover { metric: Some(32), ..handover }]);
    let rep = r.apply().await;
    assert_eq!((rep.writes, rep.deletes, rep.deletes_deferred_handover), (0, 0, 4), "{rep:?}");
    assert!(nl.take_log().is_empty());
}

/// A restart during a hand-over: the new run finds our metric+1 copies, nothing desires them,
/// and no handover names them (the app starts with no previous classes). They are kept as
/// handovers to BIRD until BIRD's route is seen or the grace period ends, not deleted at once.
#[tokio::test]
async fn restart_keeps_stepped_aside_copies_until_bird_seen() {
    let (mut r, nl, clock) = setup(None);
    r.set_desired(&cluster());
    r.apply().await;
    let (without_ipip, handover) = ipip_to_bird();
    r.set_desired_with_handover(&without_ipip, std::slice::from_ref(&handover));
    r.apply().await;
    nl.take_log();
    drop(r);
    let cfg = DataplaneConfig::default();
    let mut r = Reconciler::new(cfg.clone(), cfg.policy_owning(POOLS), nl.clone(), clock.clone());
    r.set_datastore_synced(true);
    // The app may send the same handover again: no desired key of that class exists, so it
    // changes nothing; the copies are adopted either way.
    r.set_desired_with_handover(&without_ipip, &[handover]);
    let rep = r.apply().await;
    assert_eq!((rep.writes, rep.deletes, rep.deletes_deferred_handover), (0, 0, 4), "{rep:?}");
    let bird = bird_at("10.244.10.7/32", 1024);
    nl.insert(bird.clone());
    r.handle_event(&DataplaneEvent::RouteAdded { route: bird, writer_port: 7 });
    let rep = r.apply().await;
    assert_eq!(nl.take_log(), ["delete 10.244.10.7/32 table 254 metric 1025"]);
    assert_eq!(rep.handovers[0].end, HandoverEnd::Seen);
    clock.advance(Duration::from_secs(30));
    let rep = r.apply().await;
    assert_eq!(rep.deletes, 3);
}

/// While deletes are held (the files not settled, the datastore unsynced), a hand-over to BIRD
/// still steps aside: the copy at metric+1 goes in and the original goes, so BIRD can add at
/// the freed key, and the prefix is never without a route. The grace period's own deletes wait.
#[tokio::test]
async fn stepping_aside_is_not_held_with_other_deletes() {
    let (mut r, nl, clock) = setup(None);
    r.set_desired(&cluster());
    r.apply().await;
    nl.take_log();
    let (without_ipip, handover) = ipip_to_bird();
    r.set_datastore_synced(false);
    r.set_desired_with_handover(&without_ipip, &[handover]);
    let rep = r.apply().await;
    assert_eq!((rep.writes, rep.deletes), (4, 4), "{rep:?}");
    let log = nl.take_log();
    assert!(log.iter().filter(|l| l.starts_with("create")).all(|l| l.ends_with("metric 1025")), "{log:?}");
    assert!(log.iter().filter(|l| l.starts_with("delete")).all(|l| l.ends_with("metric 1024")), "{log:?}");
    // The grace period ends: those deletes are held until the view allows deletes.
    clock.advance(Duration::from_secs(31));
    let rep = r.apply().await;
    assert_eq!((rep.deletes, rep.deletes_deferred_unsynced), (0, 4), "{rep:?}");
    r.set_datastore_synced(true);
    let rep = r.apply().await;
    assert_eq!(rep.deletes, 4, "{rep:?}");
}
