//! Reconciler logic against the fake kernel (no root needed); the fault matrix in
//! `tests/fault_matrix.rs`.

mod fault_matrix;

use std::collections::BTreeMap;
use std::time::Duration;

use nix::errno::Errno;

use crate::dataplane::fake::{FakeClock, FakeNetlink};
use crate::dataplane::kernel::route::{Family, ObservedRoute, RouteKey, RouteKind};
use crate::dataplane::kernel::watcher::DataplaneEvent;
use crate::dataplane::reconciler::handover::{Handover, HandoverEnd};
use crate::dataplane::reconciler::report::ErrorKind;
use crate::dataplane::reconciler::Reconciler;
use crate::dataplane::settings::DataplaneConfig;
use crate::ownership::OwnershipPolicy;
use crate::routes::{ClusterRoute, RouteOrigin};
use crate::vocabulary::{PoolClass, RoutePath, Writer};

const ETH0: u32 = 2;
/// The IP pools of the test cluster: our routes inside them are ours.
const POOLS: &[&str] = &["10.244.0.0/16", "fd00:10:244::/48"];
const TUNL0: u32 = 3;

/// A remote block's route of pool `default` (also the fault matrix's).
pub(super) fn cr(dst: &str, path: RoutePath, gw: Option<&str>) -> ClusterRoute {
    ClusterRoute {
        dst: dst.parse().unwrap(),
        path,
        gateway: gw.map(|g| g.parse().unwrap()),
        device: None,
        class: if path == RoutePath::HostNic { PoolClass::NoEncap } else { PoolClass::Ipip },
        pool: "default".into(),
        origin: RouteOrigin::RemoteBlock { block: dst.into(), node: "n".into() },
    }
}

fn cluster() -> Vec<ClusterRoute> {
    vec![
        cr("10.244.10.0/26", RoutePath::Blackhole, None),
        cr("10.244.20.0/26", RoutePath::HostNic, Some("10.0.0.12")),
        cr("10.244.30.0/26", RoutePath::Tunnel, Some("10.0.1.13")),
        cr("10.244.10.7/32", RoutePath::Tunnel, Some("10.0.1.13")),
        cr("fd00:10:244:20::/122", RoutePath::HostNic, Some("fd00::12")),
        cr("fd00:10:244:10::/122", RoutePath::Blackhole, None),
    ]
}

fn foreign(dst: &str, proto: u8, oif: Option<u32>, kind: RouteKind) -> ObservedRoute {
    ObservedRoute {
        key: RouteKey::new(254, dst.parse().unwrap(), 0, 1024),
        kind,
        gateway: None,
        oif,
        onlink: false,
        nexthop: None,
        protocol: proto,
        scope: 0,
        extra: false,
        cloned: false,
    }
}

fn setup(policy: Option<OwnershipPolicy>) -> (Reconciler<FakeNetlink, FakeClock>, FakeNetlink, FakeClock) {
    let nl = FakeNetlink::with_links(&[(1, "lo"), (ETH0, "eth0"), (TUNL0, "tunl0")]);
    let clock = FakeClock::new();
    let cfg = DataplaneConfig::default();
    let policy = policy.unwrap_or_else(|| cfg.policy_owning(POOLS));
    let mut r = Reconciler::new(cfg, policy, nl.clone(), clock.clone());
    r.set_datastore_synced(true);
    (r, nl, clock)
}

fn block(d: &str) -> ipnet::IpNet {
    d.parse().unwrap()
}

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

/// One apply of the chunked-pass scenario: its report and the kernel's changes, as text.
async fn traced_apply(r: &mut Reconciler<FakeNetlink, FakeClock>, nl: &FakeNetlink, trace: &mut Vec<String>) {
    let rep = r.apply().await;
    trace.push(format!("{rep:?}"));
    trace.extend(nl.take_log());
}

/// The chunked-pass scenario with `chunk` writes per chunk: a cold start of 40 routes with two
/// failed writes, a foreign route at one key and a stale route of ours; the retries; then the
/// IPIP routes handed over to BIRD (each steps aside to metric+1 before it goes) while a
/// no-encap route changes its gateway. Returns every report, every kernel change in order,
/// and the kernel's routes at the end.
async fn chunked_pass_scenario(chunk: usize) -> Vec<String> {
    let (mut r, nl, clock) = setup(None);
    nl.state().write_chunk = Some(chunk);
    let dst = |i: u32| format!("10.244.{}.{}/26", i / 4, (i % 4) * 64);
    let route = |i: u32| {
        if i.is_multiple_of(2) {
            cr(&dst(i), RoutePath::HostNic, Some("10.0.0.12"))
        } else {
            cr(&dst(i), RoutePath::Tunnel, Some("10.0.1.13"))
        }
    };
    nl.insert(ObservedRoute { protocol: 80, ..foreign("10.244.200.0/26", 80, Some(TUNL0), RouteKind::Unicast) });
    nl.insert(foreign(&dst(9), 4, Some(ETH0), RouteKind::Unicast));
    nl.state().fail_writes.insert(block(&dst(3)), (Errno::ENETUNREACH, 1));
    nl.state().fail_writes.insert(block(&dst(30)), (Errno::ENOBUFS, 1));
    let mut trace = Vec::new();
    r.set_desired(&(0..40).rev().map(route).collect::<Vec<_>>());
    traced_apply(&mut r, &nl, &mut trace).await;
    clock.advance(Duration::from_secs(5));
    traced_apply(&mut r, &nl, &mut trace).await;
    let mut next: Vec<ClusterRoute> = (0..40).step_by(2).map(route).collect();
    next[3] = cr(&dst(6), RoutePath::HostNic, Some("10.0.0.14"));
    r.set_desired_with_handover(&next, &[Handover { class: PoolClass::Ipip, to: Writer::Bird, protocol: 12, table: 254, metric: None }]);
    clock.advance(Duration::from_secs(1));
    traced_apply(&mut r, &nl, &mut trace).await;
    trace.push(format!("{:?}", nl.state().routes));
    trace
}

/// A write pass handed to the kernel in chunks, pipelined (a chunk's results come back with
/// the next call, so the reconciler plans one chunk and records another while the kernel
/// inserts a third), ends exactly as the pass in one chunk: the same changes in the same
/// order, the same reports, the same routes; from one write per chunk to all at once.
#[tokio::test]
async fn a_write_pass_in_chunks_ends_exactly_as_in_one() {
    let whole = chunked_pass_scenario(usize::MAX).await;
    // The scenario does what it says: written, failed, held, stepped aside, changed.
    assert!(whole[0].contains("writes: 37, ") && whole[0].contains("write_errors: 3, "), "{}", whole[0]);
    assert_eq!(whole.iter().filter(|l| l.starts_with("create ") && l.ends_with(" metric 1025")).count(), 19, "{whole:#?}");
    assert!(whole.contains(&"replace 10.244.1.128/26 table 254 metric 1024".to_string()), "{whole:#?}");
    for chunk in [1, 2, 3, 5, 16] {
        assert_eq!(chunked_pass_scenario(chunk).await, whole, "{chunk} writes a chunk");
    }
}

/// The `i`th of many /26 blocks (1,024 a /16, from 10.244.0.0/16 on), in ascending order.
fn many_dst(i: u32) -> String {
    format!("10.{}.{}.{}/26", 244 + i / 1024, (i / 4) % 256, (i % 4) * 64)
}

/// A cold start's chunks start small and double up to the collaborator's batch, so the kernel
/// starts inserting at once, and halve again at the end, so little is left to record once the
/// kernel is done; every route is written once.
#[tokio::test]
async fn a_cold_start_ramps_its_chunks_up_to_the_batch_size_and_down_again() {
    let (mut r, nl, _clock) = setup(None);
    nl.state().write_chunk = Some(512);
    let routes: Vec<ClusterRoute> = (0..3000u32).map(|i| cr(&many_dst(i), RoutePath::Tunnel, Some("10.0.1.13"))).collect();
    r.set_desired(&routes);
    let rep = r.apply().await;
    assert_eq!((rep.writes, rep.error_count()), (3000, 0), "{rep:?}");
    // Up: 128, 256, 512; full while more than two are left (1,080 → 512); then half of what
    // is left (568 → 284, 142), the first size again, and the rest.
    assert_eq!(nl.state().chunk_sizes, [128, 256, 512, 512, 512, 512, 284, 142, 128, 14]);
    assert_eq!(nl.take_log().len(), 3000);
}

/// A cold start of 3,000 routes with `chunk` writes a chunk, its bad input in the chunks of
/// the ramp's two ends: a foreign route at a desired key in the first chunk and in the last
/// ones, a failed write in a halved chunk, a stale route of ours; then the retry. Returns
/// every report, every kernel change in order, and the kernel's routes at the end.
async fn ramped_pass_scenario(chunk: usize) -> Vec<String> {
    // 3,000 blocks reach 10.246.0.0/16 (`many_dst`): the pools own where they go.
    let (mut r, nl, clock) = setup(Some(DataplaneConfig::default().policy_owning(&["10.244.0.0/14"])));
    nl.state().write_chunk = Some(chunk);
    nl.insert(foreign(&many_dst(5), 4, Some(ETH0), RouteKind::Unicast));
    nl.insert(foreign(&many_dst(2990), 12, Some(ETH0), RouteKind::Unicast));
    nl.insert(ObservedRoute { protocol: 80, ..foreign("10.244.7.32/27", 80, Some(TUNL0), RouteKind::Unicast) });
    nl.state().fail_writes.insert(block(&many_dst(2900)), (Errno::ENOBUFS, 1));
    let mut trace = Vec::new();
    r.set_desired(&(0..3000u32).map(|i| cr(&many_dst(i), RoutePath::Tunnel, Some("10.0.1.13"))).collect::<Vec<_>>());
    traced_apply(&mut r, &nl, &mut trace).await;
    clock.advance(Duration::from_secs(5));
    traced_apply(&mut r, &nl, &mut trace).await;
    trace.push(format!("{:?}", nl.state().routes));
    trace
}

/// The chunks of the ramp (up from 128 and halving at the end) end exactly as one write a
/// chunk does, with foreign routes held, a failed write retried and a stale route deleted.
#[tokio::test]
async fn a_ramped_write_pass_with_bad_input_ends_exactly_as_one_write_a_chunk() {
    let ramped = ramped_pass_scenario(512).await;
    // The scenario does what it says: two keys held by other writers, one write failed, the
    // stale route gone after the writes; the failed write in again on the retry.
    assert!(ramped[0].contains("writes: 2997, ") && ramped[0].contains("write_errors: 3, ") && ramped[0].contains("deletes: 1, "), "{}", ramped[0]);
    // Its counts, tallied between chunks while later chunks were still out: every route
    // desired, the two held keys held, the failed write neither programmed nor held.
    assert!(ramped[0].contains("ClassCount { desired: 3000, programmed: 2997, held: 2 }"), "{}", ramped[0]);
    let retry = ramped.iter().filter(|l| l.starts_with("ApplyReport")).nth(1).unwrap();
    assert!(
        retry.contains("writes: 1, ") && retry.contains("write_errors: 0, ") && retry.contains("ClassCount { desired: 3000, programmed: 2998, held: 2 }"),
        "{retry}"
    );
    assert!(ramped.contains(&format!("create {} table 254 metric 1024", many_dst(2900))), "the failed write is retried");
    assert!(ramped.last().unwrap().contains("protocol: 12") && ramped.last().unwrap().contains("protocol: 4"), "the other writers' routes stay");
    assert_eq!(ramped_pass_scenario(1).await, ramped);
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

/// Issue 22: an input emptied or truncated (or an API server answering a re-list with
/// nothing) must cost no route. More than half of our routes wanted gone at once: each delete
/// waits until it has been wanted for the settle period; the input restored meanwhile, nothing
/// is deleted; a deliberate change still converges.
#[tokio::test]
async fn mass_deletion_is_held_for_the_settle_period() {
    let (mut r, nl, clock) = setup(None);
    r.set_desired(&cluster());
    r.apply().await;
    nl.take_log();
    // Everything wanted gone: held.
    r.set_desired(&[]);
    let rep = r.apply().await;
    assert_eq!((rep.deletes, rep.deletes_held_mass, rep.mass_deletion), (0, 6, Some((6, 6))), "{rep:?}");
    assert!(nl.take_log().is_empty());
    assert_eq!(r.next_wakeup(), crate::dataplane::kernel::netlink::Clock::now(&clock) + Duration::from_secs(30));
    // Restored before the settle period ends: nothing was ever deleted, the hold clears.
    clock.advance(Duration::from_secs(20));
    r.set_desired(&cluster());
    let rep = r.apply().await;
    assert_eq!((rep.writes, rep.deletes, rep.deletes_held_mass, rep.mass_deletion), (0, 0, 0, None), "{rep:?}");
    // Emptied again: the 30 s start over from here.
    r.set_desired(&[]);
    let rep = r.apply().await;
    assert_eq!(rep.deletes_held_mass, 6);
    clock.advance(Duration::from_secs(29));
    let rep = r.apply().await;
    assert_eq!((rep.deletes, rep.deletes_held_mass), (0, 6), "{rep:?}");
    clock.advance(Duration::from_secs(1));
    let rep = r.apply().await;
    assert_eq!((rep.deletes, rep.deletes_held_mass, rep.mass_deletion), (6, 0, None), "{rep:?}");
    assert!(nl.state().routes.is_empty());
}

/// A held mass deletion survives the datastore going unsynced meanwhile (an API server blip
/// while the breaker holds): the hold is paused, not restarted, so the deletes go out at the
/// first settle deadline after the datastore is synced again, the breaker counts as engaged
/// throughout (one engagement, not two) and nothing wakes the reconciler while unsynced.
#[tokio::test]
async fn a_mass_deletion_hold_is_paused_not_restarted_while_unsynced() {
    let (mut r, nl, clock) = setup(None);
    r.set_desired(&cluster());
    r.apply().await;
    nl.take_log();
    r.set_desired(&[]);
    let rep = r.apply().await;
    assert_eq!((rep.deletes, rep.deletes_held_mass, rep.mass_deletion), (0, 6, Some((6, 6))), "{rep:?}");
    let first_wanted = crate::dataplane::kernel::netlink::Clock::now(&clock);
    clock.advance(Duration::from_secs(10));
    r.set_datastore_synced(false);
    let rep = r.apply().await;
    assert_eq!((rep.deletes, rep.deletes_deferred_unsynced, rep.deletes_held_mass, rep.mass_deletion), (0, 6, 0, Some((6, 6))), "{rep:?}");
    assert!(!r.needs_apply(), "nothing to do while unsynced");
    assert_eq!(r.next_wakeup(), first_wanted + Duration::from_secs(90), "a paused hold sets no wake-up: only the resync timer (90 s) does");
    clock.advance(Duration::from_secs(10));
    r.set_datastore_synced(true);
    let rep = r.apply().await;
    assert_eq!((rep.deletes, rep.deletes_held_mass, rep.mass_deletion), (0, 6, Some((6, 6))), "held from the first time it was wanted: {rep:?}");
    assert_eq!(r.next_wakeup(), first_wanted + Duration::from_secs(30), "released 30 s after first wanted, not 30 s after the resync");
    clock.advance(Duration::from_secs(10));
    let rep = r.apply().await;
    assert_eq!((rep.deletes, rep.deletes_held_mass, rep.mass_deletion), (6, 0, None), "{rep:?}");
    assert!(nl.state().routes.is_empty());
}

/// At or below the threshold (half of our routes) deletes go out at once; the percentage is a
/// setting and 100 turns the breaker off.
#[tokio::test]
async fn deletes_up_to_the_threshold_go_out_at_once() {
    let (mut r, nl, _clock) = setup(None);
    r.set_desired(&cluster());
    r.apply().await;
    nl.take_log();
    r.set_desired(&cluster()[..3]);
    let rep = r.apply().await;
    assert_eq!((rep.deletes, rep.deletes_held_mass), (3, 0), "3 of 6 is not more than half: {rep:?}");
    let cfg = DataplaneConfig { mass_deletion_percent: 100, ..DataplaneConfig::default() };
    let mut r = Reconciler::new(cfg.clone(), cfg.policy_owning(POOLS), nl.clone(), FakeClock::new());
    r.set_datastore_synced(true);
    r.set_desired(&[]);
    let rep = r.apply().await;
    assert_eq!((rep.deletes, rep.deletes_held_mass), (3, 0));
}

/// Frozen ground (a broken object mentions the prefix, or an invalid pool covers it): nothing
/// there is deleted, the rest is; unfrozen, the held delete goes.
#[tokio::test]
async fn nothing_is_deleted_in_frozen_ground() {
    let (mut r, nl, clock) = setup(None);
    r.set_desired(&cluster());
    r.apply().await;
    nl.take_log();
    let frozen = OwnershipPolicy { frozen: vec![block("10.244.30.0/26"), block("10.244.10.7/32")], ..r.policy().clone() };
    r.set_policy(frozen);
    // 10.244.10.0/26 contains the frozen /32: frozen too (a route over a frozen prefix).
    r.set_desired(&cluster()[4..]);
    let rep = r.apply().await;
    assert_eq!((rep.deletes, rep.deletes_deferred_frozen), (1, 3), "{rep:?}");
    assert_eq!(nl.take_log(), ["delete 10.244.20.0/26 table 254 metric 1024"]);
    let thawed = OwnershipPolicy { frozen: Vec::new(), ..r.policy().clone() };
    r.set_policy(thawed);
    // Thawed, the three are more than half of the five left: the breaker holds them too.
    let rep = r.apply().await;
    assert_eq!((rep.deletes, rep.deletes_deferred_frozen, rep.deletes_held_mass), (0, 0, 3), "{rep:?}");
    clock.advance(Duration::from_secs(30));
    let rep = r.apply().await;
    assert_eq!(rep.deletes, 3, "{rep:?}");
}

/// Our protocol is not enough (issue 22, row 7): a workload route Felix writes with protocol
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

/// Issue 19: a key held by another writer is looked at again at the resync interval (90 s),
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

/// Issue 19: BIRD's blackhole for this node's own block, left after a BIRD -> routewarden
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

fn nexthop_setup() -> (Reconciler<FakeNetlink, FakeClock>, FakeNetlink, FakeClock) {
    let nl = FakeNetlink::with_links(&[(1, "lo"), (ETH0, "eth0"), (TUNL0, "tunl0")]);
    let clock = FakeClock::new();
    let cfg = DataplaneConfig { nexthop_objects: true, ..DataplaneConfig::default() };
    let policy = cfg.policy_owning(POOLS);
    let mut r = Reconciler::new(cfg, policy, nl.clone(), clock.clone());
    r.set_datastore_synced(true);
    (r, nl, clock)
}

/// Node `n`'s two blocks via eth0.
fn node_n() -> Vec<ClusterRoute> {
    vec![cr("10.244.20.0/26", RoutePath::HostNic, Some("10.0.0.12")), cr("10.244.20.64/26", RoutePath::HostNic, Some("10.0.0.12"))]
}

/// Another writer creates a nexthop object at the id we were about to take, after our dump:
/// our create-exclusive is refused, the object stays untouched, the routes go in classic
/// meanwhile, and after the backoff they go through the next free id.
#[tokio::test]
async fn a_nexthop_id_taken_after_the_dump_is_never_overwritten_and_the_routes_go_in_classic() {
    use crate::dataplane::kernel::nexthop::{ObservedNexthop, NEXTHOP_IDS};
    let (mut r, nl, clock) = nexthop_setup();
    r.set_desired(&[]);
    r.apply().await;
    let first = *NEXTHOP_IDS.start();
    let theirs = ObservedNexthop { id: first, protocol: 17, gateway: Some("10.0.0.99".parse().unwrap()), oif: Some(ETH0), onlink: true, other: false };
    nl.state().nexthops.insert(first, theirs.clone());
    r.set_desired(&node_n());
    let rep = r.apply().await;
    assert_eq!((rep.writes, rep.nexthop_writes, rep.nexthop_write_errors), (2, 0, 1), "{rep:#?}");
    assert!(nl.state().routes.values().all(|x| x.nexthop.is_none() && x.gateway == Some("10.0.0.12".parse().unwrap())));
    assert_eq!(nl.state().nexthops[&first], theirs, "the other writer's object is untouched");
    assert!(!r.needs_apply(), "the retry waits for its backoff");
    clock.advance(Duration::from_secs(5));
    assert!(r.needs_apply());
    let rep = r.apply().await;
    assert_eq!((rep.writes, rep.nexthop_writes, rep.error_count()), (2, 1, 0), "{rep:#?}");
    assert!(nl.state().routes.values().all(|x| x.nexthop == Some(first + 1)), "{:?}", nl.state().routes);
    assert_eq!(nl.state().nexthops[&first], theirs);
    // Settled: nothing more to do.
    let rep = r.apply().await;
    assert_eq!((rep.writes, rep.nexthop_writes), (0, 0));
}

/// A kernel without nexthop objects (before 5.3: the dump fails): the routes go in classic and
/// the reason is reported; nothing is written to nexthop objects.
#[tokio::test]
async fn without_nexthop_objects_in_the_kernel_routes_go_in_classic() {
    let (mut r, nl, _clock) = nexthop_setup();
    nl.state().nexthop_dump_errno = Some(Errno::EOPNOTSUPP);
    r.set_desired(&node_n());
    let rep = r.apply().await;
    assert_eq!((rep.writes, rep.nexthop_writes), (2, 0), "{rep:#?}");
    assert_eq!(rep.errors.get(&ErrorKind::Invalid), Some(&1), "{rep:#?}");
    assert!(nl.state().nexthop_log.is_empty());
    assert!(nl.state().routes.values().all(|x| x.nexthop.is_none()));
}

/// A node moves: one nexthop replace, no route write; its object stays ours across a
/// restart, which writes nothing.
#[tokio::test]
async fn a_node_move_is_one_nexthop_replace_and_a_restart_writes_nothing() {
    let (mut r, nl, clock) = nexthop_setup();
    r.set_desired(&node_n());
    let rep = r.apply().await;
    assert_eq!((rep.writes, rep.nexthop_writes, rep.error_count()), (2, 1, 0), "{rep:#?}");
    nl.take_log();
    let moved: Vec<ClusterRoute> = node_n()
        .into_iter()
        .map(|mut x| {
            x.gateway = Some("10.0.0.22".parse().unwrap());
            x
        })
        .collect();
    r.set_desired(&moved);
    let rep = r.apply().await;
    assert_eq!((rep.writes, rep.nexthop_writes, rep.error_count()), (0, 1, 0), "{rep:#?}");
    assert!(nl.take_log().is_empty(), "no route write");
    assert!(nl.state().routes.values().all(|x| x.gateway == Some("10.0.0.22".parse().unwrap())));
    let cfg = DataplaneConfig { nexthop_objects: true, ..DataplaneConfig::default() };
    let mut r2 = Reconciler::new(cfg, r.policy().clone(), nl.clone(), clock.clone());
    r2.set_datastore_synced(true);
    r2.set_desired(&moved);
    let rep = r2.apply().await;
    assert_eq!((rep.writes, rep.nexthop_writes, rep.deletes, rep.nexthop_deletes, rep.error_count()), (0, 0, 0, 0, 0), "{rep:#?}");
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
