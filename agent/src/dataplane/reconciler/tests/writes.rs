//! Writes and deletes of one apply: zero writes when nothing changed, foreign routes untouched, what the policy claims, what a report counts.

use super::*;

#[tokio::test]
async fn cold_start_then_zero_writes_on_resync_and_restart() {
    let (mut r, nl, clock) = setup(None);
    r.set_desired(&cluster());
    let rep = r.apply().await;
    assert!(rep.resynced);
    assert_eq!(rep.writes, 6, "{rep:?}");
    assert_eq!(rep.error_count(), 0);
    assert_eq!(nl.take_log().len(), 6);
    // No-change apply and no-change resync: nothing written.
    let rep = r.apply().await;
    assert_eq!((rep.writes, rep.deletes), (0, 0));
    clock.advance(Duration::from_secs(91));
    let rep = r.apply().await;
    assert!(rep.resynced);
    assert_eq!((rep.writes, rep.deletes), (0, 0));
    // Restart: a new reconciler over the same kernel, same input.
    let mut r2 = Reconciler::new(DataplaneConfig::default(), r.policy().clone(), nl.clone(), clock.clone());
    r2.set_datastore_synced(true);
    r2.set_desired(&cluster());
    let rep = r2.apply().await;
    assert_eq!((rep.writes, rep.deletes), (0, 0), "{rep:?}");
    assert!(nl.take_log().is_empty());
    let c = rep.by_class[&(Family::V4, PoolClass::Ipip, RoutePath::Tunnel)];
    assert_eq!((c.desired, c.programmed), (2, 2));
}

#[tokio::test]
async fn foreign_routes_survive() {
    let (mut r, nl, clock) = setup(None);
    let foreigners = [
        foreign("10.0.0.0/24", 2, Some(ETH0), RouteKind::Unicast),
        foreign("0.0.0.0/0", 4, Some(ETH0), RouteKind::Unicast),
        foreign("10.244.2.0/24", 17, Some(ETH0), RouteKind::Unicast),
        foreign("192.168.200.10/32", 12, Some(ETH0), RouteKind::Unicast),
        foreign("10.244.40.0/26", 12, Some(TUNL0), RouteKind::Unicast),
        foreign("10.244.50.0/26", 3, Some(TUNL0), RouteKind::Unicast),
        foreign("10.0.0.11/32", 80, Some(ETH0), RouteKind::Other(2)),
        foreign("fe80::/64", 80, Some(ETH0), RouteKind::Unicast),
    ];
    for f in &foreigners {
        nl.insert(f.clone());
    }
    r.set_desired(&cluster());
    for _ in 0..5 {
        r.apply().await;
        clock.advance(Duration::from_secs(100));
    }
    for f in &foreigners {
        assert_eq!(nl.state().routes.get(&f.key), Some(f), "{}", f.key);
    }
    assert!(nl.take_log().iter().all(|l| l.starts_with("create")));
}

#[tokio::test]
async fn stale_routes_deleted_only_when_synced() {
    let (mut r, nl, _clock) = setup(None);
    r.set_datastore_synced(false);
    nl.insert(foreign("10.244.90.0/26", 80, Some(TUNL0), RouteKind::Unicast));
    r.set_desired(&cluster());
    let rep = r.apply().await;
    assert_eq!(rep.deletes, 0);
    assert_eq!(rep.deletes_deferred_unsynced, 1);
    r.set_datastore_synced(true);
    let rep = r.apply().await;
    assert_eq!(rep.deletes, 1);
    assert!(!nl.state().routes.keys().any(|k| k.dst == block("10.244.90.0/26")));
}

#[tokio::test]
async fn attribute_change_is_one_replace_and_new_key_goes_in_before_old_goes_out() {
    let (mut r, nl, _clock) = setup(None);
    r.set_desired(&cluster());
    r.apply().await;
    nl.take_log();
    // Path change tunnel -> host NIC, and a node IP change.
    let mut c = cluster();
    c[2] = cr("10.244.30.0/26", RoutePath::HostNic, Some("10.0.0.13"));
    c[3] = cr("10.244.10.7/32", RoutePath::Tunnel, Some("10.0.1.99"));
    r.set_desired(&c);
    let rep = r.apply().await;
    assert_eq!((rep.writes, rep.deletes), (2, 0));
    let log = nl.take_log();
    assert!(log.iter().all(|l| l.starts_with("replace")), "{log:?}");
    // Metric change: new key created, then old deleted (breaker off: every old key goes).
    let cfg = DataplaneConfig { metric: 100, mass_deletion_percent: 100, ..DataplaneConfig::default() };
    let mut r2 = Reconciler::new(cfg, r.policy().clone(), nl.clone(), FakeClock::new());
    r2.set_datastore_synced(true);
    r2.set_desired(&c[..1]);
    r2.apply().await;
    let log = nl.take_log();
    let create = log.iter().position(|l| l == "create 10.244.10.0/26 table 254 metric 100").unwrap();
    let delete = log.iter().position(|l| l == "delete 10.244.10.0/26 table 254 metric 1024").unwrap();
    assert!(create < delete, "{log:?}");
}

/// The report's counts per class and path, when routes of different classes, paths and
/// devices interleave in key order (counted in a short list first, devices resolved through a
/// memo): exactly what counting each route on its own gives, held and unresolved routes
/// included.
#[tokio::test]
async fn the_report_counts_each_class_and_path_exactly_when_they_interleave() {
    let (mut r, nl, _clock) = setup(None);
    let held = ObservedRoute { gateway: Some("10.0.1.13".parse().unwrap()), ..foreign("10.244.1.0/26", 17, Some(TUNL0), RouteKind::Unicast) };
    nl.insert(held.clone());
    let missing_device = ClusterRoute { device: Some("vxlan.calico".into()), ..cr("10.244.1.64/26", RoutePath::Tunnel, Some("10.0.1.14")) };
    let routes = vec![
        cr("10.244.0.0/26", RoutePath::Tunnel, Some("10.0.1.13")),
        cr("10.244.0.64/26", RoutePath::HostNic, Some("10.0.0.12")),
        cr("10.244.0.128/26", RoutePath::Tunnel, Some("10.0.1.13")),
        cr("10.244.0.192/26", RoutePath::Blackhole, None),
        cr("10.244.1.0/26", RoutePath::Tunnel, Some("10.0.1.13")),
        missing_device,
        cr("10.244.1.128/26", RoutePath::HostNic, Some("10.0.0.12")),
        cr("fd00:10:244:10::/122", RoutePath::Blackhole, None),
        cr("fd00:10:244:20::/122", RoutePath::HostNic, Some("fd00::12")),
    ];
    r.set_desired(&routes);
    let rep = r.apply().await;
    assert_eq!(rep.writes, 7, "{rep:?}");
    let counts = |rep: &crate::dataplane::reconciler::report::ApplyReport| -> BTreeMap<(Family, PoolClass, RoutePath), (usize, usize, usize)> {
        rep.by_class.iter().map(|(k, c)| (*k, (c.desired, c.programmed, c.held))).collect()
    };
    let want = BTreeMap::from([
        ((Family::V4, PoolClass::Ipip, RoutePath::Tunnel), (4, 2, 1)),
        ((Family::V4, PoolClass::Ipip, RoutePath::Blackhole), (1, 1, 0)),
        ((Family::V4, PoolClass::NoEncap, RoutePath::HostNic), (2, 2, 0)),
        ((Family::V6, PoolClass::Ipip, RoutePath::Blackhole), (1, 1, 0)),
        ((Family::V6, PoolClass::NoEncap, RoutePath::HostNic), (1, 1, 0)),
    ]);
    assert_eq!(counts(&rep), want);
    // The foreign route stays; the next apply (nothing written) counts the same.
    assert_eq!(nl.state().routes[&held.key], held);
    let rep = r.apply().await;
    assert_eq!(rep.writes, 0, "{rep:?}");
    assert_eq!(counts(&rep), want);
}

#[tokio::test]
async fn foreign_route_at_our_key_is_reported_not_overwritten() {
    let (mut r, nl, _clock) = setup(None);
    let f = ObservedRoute { gateway: Some("10.0.0.12".parse().unwrap()), ..foreign("10.244.20.0/26", 17, Some(ETH0), RouteKind::Unicast) };
    nl.insert(f.clone());
    r.set_desired(&cluster());
    let rep = r.apply().await;
    assert_eq!(rep.conflicts.len(), 1, "{rep:?}");
    assert_eq!(rep.errors[&ErrorKind::ForeignRouteAtKey], 1);
    assert_eq!(nl.state().routes[&f.key], f);
    // Counted as held by another writer, not as programmed.
    let held: usize = rep.by_class.values().map(|c| c.held).sum();
    assert_eq!(held, 1, "{rep:?}");
    assert_eq!(rep.by_class.values().map(|c| c.desired - c.programmed).sum::<usize>(), 1);
    // Many more applies (including resyncs) never overwrite it, and report it only once.
    for _ in 0..3 {
        r.request_resync();
        let rep = r.apply().await;
        assert!(rep.conflicts.is_empty(), "{rep:?}");
    }
    assert_eq!(nl.state().routes[&f.key], f);
    // The foreign writer removes it: we install ours promptly.
    nl.state().routes.remove(&f.key);
    r.handle_event(&DataplaneEvent::RouteRemoved { route: f.clone(), writer_port: 1 });
    let rep = r.apply().await;
    assert_eq!(rep.writes, 1);
    assert_eq!(nl.state().routes[&f.key].protocol, 80);
    assert_eq!(rep.by_class.values().map(|c| c.held).sum::<usize>(), 0);
}

#[tokio::test]
async fn bird_leftover_claimed_only_with_policy() {
    let bird = ObservedRoute { gateway: Some("10.0.1.13".parse().unwrap()), onlink: true, ..foreign("10.244.30.0/26", 12, Some(TUNL0), RouteKind::Unicast) };
    let stale_bird =
        ObservedRoute { gateway: Some("10.0.1.14".parse().unwrap()), onlink: true, ..foreign("10.244.40.0/26", 12, Some(TUNL0), RouteKind::Unicast) };
    // Without the claim: untouched.
    let (mut r, nl, _c) = setup(None);
    nl.insert(bird.clone());
    nl.insert(stale_bird.clone());
    r.set_desired(&cluster());
    let rep = r.apply().await;
    assert_eq!(nl.state().routes[&bird.key], bird);
    assert_eq!(nl.state().routes[&stale_bird.key], stale_bird);
    assert_eq!(rep.conflicts.len(), 1);
    // With the claim (routewarden owns IPIP, BIRD does not): replaced and the stale one deleted.
    let policy = OwnershipPolicy { claim_bird_on_tunnel: vec![block("10.244.0.0/16")], ..DataplaneConfig::default().policy_owning(POOLS) };
    r.set_policy(policy);
    let rep = r.apply().await;
    assert_eq!(nl.state().routes[&bird.key].protocol, 80);
    assert!(!nl.state().routes.contains_key(&stale_bird.key));
    assert_eq!(rep.overwrote.len(), 1, "{rep:?}");
    assert!(rep.overwrote[0].previous.contains("proto 12"));
    assert_eq!(rep.deletes, 1);
}

/// A cold start that writes most of the view builds it in one pass: what it overwrote (BIRD's
/// route at a claimed key, in the first chunk of writes) is reported and replaced in the view
/// by ours, foreign routes stay, and the next apply finds everything in sync (no write, no
/// delete).
#[tokio::test]
async fn a_cold_start_over_claimed_routes_leaves_the_view_in_sync() {
    let bird = ObservedRoute { gateway: Some("10.0.1.99".parse().unwrap()), onlink: true, ..foreign("10.244.10.7/32", 12, Some(TUNL0), RouteKind::Unicast) };
    let stale_bird =
        ObservedRoute { gateway: Some("10.0.1.14".parse().unwrap()), onlink: true, ..foreign("10.244.40.0/26", 12, Some(TUNL0), RouteKind::Unicast) };
    let outside = foreign("10.99.0.0/26", 12, None, RouteKind::Blackhole);
    let (mut r, nl, _c) = setup(None);
    for route in [&bird, &stale_bird, &outside] {
        nl.insert(route.clone());
    }
    r.set_policy(OwnershipPolicy { claim_bird_on_tunnel: vec![block("10.244.0.0/16")], ..DataplaneConfig::default().policy_owning(POOLS) });
    r.set_desired(&cluster());
    let rep = r.apply().await;
    assert!(rep.writes >= 3, "{rep:?}");
    assert_eq!(rep.overwrote.iter().map(|o| o.previous.contains("proto 12")).collect::<Vec<_>>(), [true], "{rep:?}");
    assert_eq!(nl.state().routes[&bird.key].protocol, 80);
    assert!(!nl.state().routes.contains_key(&stale_bird.key));
    assert_eq!(nl.state().routes[&outside.key], outside);
    nl.take_log();
    let rep = r.apply().await;
    assert_eq!((rep.writes, rep.deletes, rep.overwrote.len()), (0, 0, 0), "{rep:?}");
    assert_eq!(nl.take_log(), Vec::<String>::new(), "no change, no write");
    // The view holds our route at BIRD's old key: its removal by another writer is seen and
    // the route put back.
    let gone = nl.state().routes.remove(&bird.key).unwrap();
    r.handle_event(&DataplaneEvent::RouteRemoved { route: gone, writer_port: 4242 });
    let rep = r.apply().await;
    assert_eq!(rep.writes, 1, "{rep:?}");
    assert_eq!(nl.state().routes[&bird.key].protocol, 80);
}

#[tokio::test]
async fn custom_table_and_protocol() {
    let nl = FakeNetlink::with_links(&[(ETH0, "eth0"), (TUNL0, "tunl0")]);
    let cfg = DataplaneConfig { table: 48, protocol: 201, ..DataplaneConfig::default() };
    let mut r = Reconciler::new(cfg.clone(), cfg.policy_owning(POOLS), nl.clone(), FakeClock::new());
    r.set_datastore_synced(true);
    // Our protocol in the main table is not ours in table 48.
    nl.insert(ObservedRoute { protocol: 201, ..foreign("10.244.90.0/26", 201, Some(TUNL0), RouteKind::Unicast) });
    r.set_desired(&cluster());
    let rep = r.apply().await;
    assert_eq!((rep.writes, rep.deletes), (6, 0));
    assert!(nl.state().routes.keys().filter(|k| k.table == 48).count() == 6);
}

#[tokio::test]
async fn bad_desired_route_is_reported() {
    let (mut r, _nl, _clock) = setup(None);
    let mut c = cluster();
    c.push(cr("10.244.60.0/26", RoutePath::Tunnel, None));
    r.set_desired(&c);
    let rep = r.apply().await;
    assert_eq!(rep.errors[&ErrorKind::BadDesiredRoute], 1);
    assert_eq!(rep.writes, 6);
}

/// Our protocol is not enough (docs/bad-input.md row 7): a workload route Felix writes with protocol
/// 80 on a `cali*` device, and a route outside every pool, are never ours, through any number
/// of resyncs.
#[tokio::test]
async fn our_protocol_outside_owned_pools_or_on_a_workload_device_is_never_touched() {
    let nl = FakeNetlink::with_links(&[(1, "lo"), (ETH0, "eth0"), (TUNL0, "tunl0"), (9, "cali-x")]);
    let clock = FakeClock::new();
    let cfg = DataplaneConfig::default();
    let mut r = Reconciler::new(cfg.clone(), cfg.policy_owning(POOLS), nl.clone(), clock.clone());
    r.set_datastore_synced(true);
    let workload = ObservedRoute { key: RouteKey::new(254, block("10.244.10.5/32"), 0, 1024), ..foreign("10.244.10.5/32", 80, Some(9), RouteKind::Unicast) };
    let outside = ObservedRoute { gateway: Some("10.0.0.1".parse().unwrap()), ..foreign("192.168.77.0/24", 80, Some(ETH0), RouteKind::Unicast) };
    nl.insert(workload.clone());
    nl.insert(outside.clone());
    r.set_desired(&cluster());
    for _ in 0..3 {
        let rep = r.apply().await;
        assert_eq!(rep.deletes, 0, "{rep:?}");
        clock.advance(Duration::from_secs(100));
    }
    assert_eq!(nl.state().routes[&workload.key], workload);
    assert_eq!(nl.state().routes[&outside.key], outside);
}

/// BIRD's blackhole for this node's own block, left after a BIRD -> routewarden
/// handover, is claimed (replaced in place by ours) when routewarden programs the class and
/// BIRD does not, and goes with the block; without the claim it is held, never touched.
#[tokio::test]
async fn bird_blackhole_of_an_own_block_is_claimed_replaced_and_removed_with_the_block() {
    let bird_bh = foreign("10.244.10.0/26", 12, None, RouteKind::Blackhole);
    let other = foreign("10.99.0.0/26", 12, None, RouteKind::Blackhole);
    let (mut r, nl, _c) = setup(None);
    nl.insert(bird_bh.clone());
    nl.insert(other.clone());
    r.set_desired(&cluster());
    // BIRD still owns the class (no claim): held, reported, untouched.
    let rep = r.apply().await;
    assert_eq!(rep.conflicts.iter().map(|c| c.key.dst.to_string()).collect::<Vec<_>>(), ["10.244.10.0/26"], "{rep:?}");
    assert_eq!(nl.state().routes[&bird_bh.key], bird_bh);
    // routewarden programs the class and BIRD does not: replaced in place, nothing deleted.
    let policy = OwnershipPolicy { claim_bird_blackholes: vec![block("10.244.0.0/16")], ..DataplaneConfig::default().policy_owning(POOLS) };
    r.set_policy(policy);
    nl.take_log();
    let rep = r.apply().await;
    let ours = nl.state().routes[&bird_bh.key].clone();
    assert_eq!((ours.protocol, ours.kind), (80, RouteKind::Blackhole));
    assert_eq!(rep.overwrote.iter().map(|o| o.previous.as_str()).collect::<Vec<_>>(), ["blackhole 10.244.10.0/26 proto 12 metric 1024"], "{rep:?}");
    assert_eq!(rep.deletes, 0);
    let log = nl.take_log();
    assert!(log.iter().all(|l| !l.starts_with("delete")), "replace, never delete-then-add: {log:?}");
    // Outside the claimed pools: never touched.
    assert_eq!(nl.state().routes[&other.key], other);
    // The block is released: our blackhole goes with it.
    let without: Vec<ClusterRoute> = cluster().into_iter().filter(|c| c.dst.to_string() != "10.244.10.0/26").collect();
    r.set_desired(&without);
    let rep = r.apply().await;
    assert_eq!(rep.deletes, 1, "{rep:?}");
    assert!(!nl.state().routes.contains_key(&bird_bh.key));
    assert_eq!(nl.state().routes[&other.key], other);
}

/// The order the routes come in changes nothing: a destination given twice goes to the first
/// route in `ClusterRoute` order and conversion failures are reported in that order, whether
/// the input is sorted (the plan's), reversed, by destination with the later route of a key
/// ahead, or sorted but for two failures swapped (the destinations that convert still
/// ascending); with a destination given twice and without.
#[tokio::test]
async fn set_desired_answers_the_same_for_any_input_order() {
    let dst = |i: u32| format!("10.244.{}.{}/26", i / 4, (i % 4) * 64);
    for twice in [false, true] {
        let mut sorted: Vec<ClusterRoute> = (0..40).map(|i| cr(&dst(i), RoutePath::Tunnel, Some("10.0.1.13"))).collect();
        if twice {
            // Tunnel sorts before HostNic: the tunnel route of destination 7 wins.
            sorted.push(cr(&dst(7), RoutePath::HostNic, Some("10.0.0.12")));
        }
        // No gateway: each is reported, neither is programmed.
        sorted.push(cr(&dst(50), RoutePath::Tunnel, None));
        sorted.push(cr(&dst(60), RoutePath::HostNic, None));
        sorted.sort();
        let reversed: Vec<ClusterRoute> = sorted.iter().rev().cloned().collect();
        let mut later_first = sorted.clone();
        later_first.sort_by(|a, b| a.dst.cmp(&b.dst).then(b.cmp(a)));
        let mut failures_swapped = sorted.clone();
        let at = |d: u32| sorted.iter().position(|r| r.dst == block(&dst(d))).unwrap();
        failures_swapped.swap(at(50), at(60));
        let outcome = |routes: Vec<ClusterRoute>| async move {
            let (mut r, nl, _clock) = setup(None);
            r.set_desired(&routes);
            let rep = r.apply().await;
            let routes = nl.state().routes.clone();
            (rep.writes, rep.error_messages, routes)
        };
        let want = outcome(sorted).await;
        assert_eq!(want.0, 40, "{want:?}");
        let bad: Vec<&String> = want.1.iter().filter(|m| m.contains("gateway")).collect();
        assert_eq!(bad.len(), 2, "{:?}", want.1);
        assert!(bad[0].contains(&dst(50)) && bad[1].contains(&dst(60)), "{bad:?}");
        assert_eq!(want.2[&RouteKey::new(254, block(&dst(7)), 0, 1024)].oif, Some(TUNL0), "the first route of a key wins");
        for (name, input) in [("reversed", reversed), ("later first", later_first), ("failures swapped", failures_swapped)] {
            assert_eq!(outcome(input).await, want, "{name}, a destination twice: {twice}");
        }
    }
}
