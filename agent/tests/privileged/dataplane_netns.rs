//! Route programming in a real kernel, each test in its own network namespace: exact routes,
//! updates, foreign routes, zero-write resync/restart and the scenarios S02–S13 that concern
//! the dataplane (`../shared/reference/scenarios.md`).

mod dataplane_support;

use std::time::{Duration, Instant};

use dataplane_support::{
    example_cluster, example_lines, ip, lines_stay, reconciler, route, route_map, routes, wait_for_lines, with_proto, Driver, Monitor, Netns, DEADLINE,
};
use routewarden::dataplane::{
    self, audit_kernel, AuditScope, DataplaneCommand, DataplaneConfig, ErrorKind, ExpectedRoute, FindingCode, OwnershipPolicy, RtNetlink,
};
use routewarden::routes::RouteDevices;
use routewarden::vocabulary::{RoutePath, Writer};
use routewarden_lab::skip_unless_root;

const SETTLE: Duration = Duration::from_millis(300);

#[test]
fn exact_routes_for_example_cluster() {
    if skip_unless_root("exact_routes_for_example_cluster") {
        return;
    }
    let ns = Netns::new();
    ns.rt.block_on(async {
        let mut r = reconciler(DataplaneConfig::default(), None);
        r.set_desired(&example_cluster());
        let rep = r.apply().await;
        assert_eq!(rep.writes, 6, "{rep:#?}");
        assert_eq!(rep.error_count(), 0, "{rep:#?}");
        assert_eq!(with_proto(254, "80"), example_lines());
        // Nothing else in the main table but the connected route.
        assert_eq!(
            routes(false, 254),
            [
                "10.0.0.0/24 dev eth0 proto kernel scope link src 10.0.0.11",
                "blackhole 10.244.10.0/26 proto 80 metric 1024",
                "10.244.10.7 via 10.0.1.13 dev tunl0 proto 80 metric 1024 onlink",
                "10.244.20.0/26 via 10.0.0.12 dev eth0 proto 80 metric 1024 onlink",
                "10.244.30.0/26 via 10.0.1.13 dev tunl0 proto 80 metric 1024 onlink",
            ]
        );
    });
}

#[test]
fn custom_table_protocol_and_metric() {
    if skip_unless_root("custom_table_protocol_and_metric") {
        return;
    }
    let ns = Netns::new();
    ns.rt.block_on(async {
        let cfg = DataplaneConfig { table: 48, protocol: 201, metric: 300, ..DataplaneConfig::default() };
        let mut r = reconciler(cfg, None);
        r.set_desired(&example_cluster());
        let rep = r.apply().await;
        assert_eq!(rep.writes, 6, "{rep:#?}");
        assert_eq!(
            with_proto(48, "201"),
            [
                "blackhole 10.244.10.0/26 proto 201 metric 300",
                "10.244.10.7 via 10.0.1.13 dev tunl0 proto 201 metric 300 onlink",
                "10.244.20.0/26 via 10.0.0.12 dev eth0 proto 201 metric 300 onlink",
                "10.244.30.0/26 via 10.0.1.13 dev tunl0 proto 201 metric 300 onlink",
                "blackhole fd00:10:244:10::/122 dev lo proto 201 metric 300 pref medium",
                "fd00:10:244:20::/122 via fd00::12 dev eth0 proto 201 metric 300 onlink pref medium",
            ]
        );
        assert!(with_proto(254, "201").is_empty());
        r.request_resync();
        let rep = r.apply().await;
        assert_eq!((rep.writes, rep.deletes), (0, 0));
    });
}

/// Updates: a block moves to another node, a node IP changes, a borrowed IP appears and
/// disappears, a path changes tunnel -> host NIC, a route is removed. Attribute changes are a
/// single replace: the monitor sees no delete for those prefixes (S13).
#[test]
fn updates_are_exact_and_attribute_changes_never_delete() {
    if skip_unless_root("updates_are_exact_and_attribute_changes_never_delete") {
        return;
    }
    let ns = Netns::new();
    ns.rt.block_on(async {
        let mut r = reconciler(DataplaneConfig::default(), None);
        r.set_desired(&example_cluster());
        r.apply().await;
        let mut mon = Monitor::start();

        // Block 10.244.30.0/26 moves from node-c (10.0.1.13, tunnel) to node-b (10.0.0.12,
        // same subnet: host NIC); node-b's IP changes to 10.0.0.22; a borrowed IP appears.
        let mut c = example_cluster();
        c[1] = route("10.244.20.0/26", RoutePath::HostNic, Some("10.0.0.22"));
        c[2] = route("10.244.30.0/26", RoutePath::HostNic, Some("10.0.0.22"));
        c.push(route("10.244.10.9/32", RoutePath::Tunnel, Some("10.0.1.13")));
        r.set_desired(&c);
        let rep = r.apply().await;
        assert_eq!((rep.writes, rep.deletes, rep.error_count()), (3, 0, 0), "{rep:#?}");
        assert_eq!(
            with_proto(254, "80"),
            [
                "blackhole 10.244.10.0/26 proto 80 metric 1024",
                "10.244.10.7 via 10.0.1.13 dev tunl0 proto 80 metric 1024 onlink",
                "10.244.10.9 via 10.0.1.13 dev tunl0 proto 80 metric 1024 onlink",
                "10.244.20.0/26 via 10.0.0.22 dev eth0 proto 80 metric 1024 onlink",
                "10.244.30.0/26 via 10.0.0.22 dev eth0 proto 80 metric 1024 onlink",
                "blackhole fd00:10:244:10::/122 dev lo proto 80 metric 1024 pref medium",
                "fd00:10:244:20::/122 via fd00::12 dev eth0 proto 80 metric 1024 onlink pref medium",
            ]
        );
        let ev = mon.route_events(SETTLE).await;
        assert!(ev.iter().all(|e| e.starts_with('+')), "S13: no delete on an attribute change: {ev:?}");
        assert_eq!(ev.len(), 3, "{ev:?}");

        // The borrowed IP disappears, the IPv6 route is removed.
        c.retain(|x| x.dst.to_string() != "10.244.10.9/32" && x.dst.to_string() != "fd00:10:244:20::/122");
        r.set_desired(&c);
        let rep = r.apply().await;
        assert_eq!((rep.writes, rep.deletes), (0, 2), "{rep:#?}");
        assert_eq!(
            with_proto(254, "80"),
            [
                "blackhole 10.244.10.0/26 proto 80 metric 1024",
                "10.244.10.7 via 10.0.1.13 dev tunl0 proto 80 metric 1024 onlink",
                "10.244.20.0/26 via 10.0.0.22 dev eth0 proto 80 metric 1024 onlink",
                "10.244.30.0/26 via 10.0.0.22 dev eth0 proto 80 metric 1024 onlink",
                "blackhole fd00:10:244:10::/122 dev lo proto 80 metric 1024 pref medium",
            ]
        );
        // Path change host NIC -> tunnel (CrossSubnet peer left the subnet): one replace.
        c[2] = route("10.244.30.0/26", RoutePath::Tunnel, Some("10.0.1.22"));
        r.set_desired(&c);
        mon.drain(SETTLE).await;
        let rep = r.apply().await;
        assert_eq!((rep.writes, rep.deletes), (1, 0));
        assert_eq!(mon.route_events(SETTLE).await, ["+ 10.244.30.0/26 table 254 metric 1024 proto 80"]);
    });
}

fn add_foreign_routes() -> Vec<String> {
    ip("link add cali-x type veth peer name cali-xp");
    ip("link set cali-xp up");
    ip("link set cali-x up");
    for cmd in [
        "route add 10.1.0.0/24 dev eth0 proto kernel",
        "route add 10.2.0.0/24 dev eth0 proto boot",
        "route add 10.3.0.0/24 via 10.0.0.1 dev eth0 proto static",
        "route add 10.4.0.0/24 via 10.0.0.1 dev eth0 proto 17",
        "route add 10.5.0.0/24 via 10.0.0.1 dev eth0 proto bird",
        // S05: another daemon on a cluster prefix.
        "route add 10.244.2.0/24 via 10.0.0.12 dev eth0 proto 17",
        // S12: the host's default route.
        "route add default via 10.0.0.1 dev eth0 proto static",
        // S03: a route BIRD learned from a pod peer, on a workload interface.
        "route add 192.168.200.10 via 10.244.10.5 dev cali-x proto bird onlink",
        // A BIRD route on the tunnel device outside any claimed pool.
        "route add 10.244.40.0/26 via 10.0.1.14 dev tunl0 proto bird metric 1024 onlink",
        // Another protocol holding one of our keys (same prefix and metric).
        "route add 10.244.30.0/26 via 10.0.1.13 dev tunl0 proto 17 metric 1024 onlink",
        // IPv6 of other writers.
        "-6 route add fd00:99::/64 via fd00::1 dev eth0 proto static",
        "-6 route add fd00:10:244:30::/122 via fd00::13 dev eth0 proto 17",
    ] {
        ip(cmd);
    }
    let mut all = routes(false, 254);
    all.extend(routes(true, 254));
    all.extend(routes(false, 255));
    all.retain(|l| !l.contains("proto 80"));
    all
}

/// Foreign routes of every kind survive many resyncs untouched (S03, S05, S12); the key held
/// by another protocol is reported, never overwritten.
#[test]
fn foreign_routes_survive_many_resyncs() {
    if skip_unless_root("foreign_routes_survive_many_resyncs") {
        return;
    }
    let ns = Netns::new();
    ns.rt.block_on(async {
        let before = add_foreign_routes();
        let mut mon = Monitor::start();
        let mut r = reconciler(DataplaneConfig::default(), None);
        r.set_desired(&example_cluster());
        let rep = r.apply().await;
        assert_eq!(rep.writes, 5, "{rep:#?}");
        assert_eq!(rep.conflicts.len(), 1);
        assert_eq!(rep.conflicts[0].key.dst.to_string(), "10.244.30.0/26");
        mon.drain(SETTLE).await;
        for _ in 0..10 {
            r.request_resync();
            let rep = r.apply().await;
            assert_eq!((rep.writes, rep.deletes), (0, 0), "{rep:#?}");
        }
        assert_eq!(mon.route_events(SETTLE).await, Vec::<String>::new());
        let mut after = routes(false, 254);
        after.extend(routes(true, 254));
        after.extend(routes(false, 255));
        after.retain(|l| !l.contains("proto 80"));
        assert_eq!(after, before);
        assert!(routes(false, 254).contains(&"10.244.30.0/26 via 10.0.1.13 dev tunl0 proto 17 metric 1024 onlink".to_string()));
    });
}

/// S02 and S04: a no-change resync and a restart with unchanged input write nothing: the
/// monitoring socket sees zero route notifications.
#[test]
fn zero_writes_on_resync_and_restart() {
    if skip_unless_root("zero_writes_on_resync_and_restart") {
        return;
    }
    let ns = Netns::new();
    ns.rt.block_on(async {
        let mut r = reconciler(DataplaneConfig::default(), None);
        r.set_desired(&example_cluster());
        r.apply().await;
        let mut mon = Monitor::start();
        mon.drain(SETTLE).await;
        for _ in 0..5 {
            r.request_resync();
            let rep = r.apply().await;
            assert!(rep.resynced);
            assert_eq!((rep.writes, rep.deletes, rep.error_count()), (0, 0, 0), "{rep:#?}");
        }
        drop(r);
        // Restart: new connection, empty state, same input.
        let mut r = reconciler(DataplaneConfig::default(), None);
        r.set_desired(&example_cluster());
        let rep = r.apply().await;
        assert_eq!((rep.writes, rep.deletes, rep.error_count()), (0, 0, 0), "{rep:#?}");
        assert_eq!(mon.route_events(SETTLE).await, Vec::<String>::new());
        assert_eq!(with_proto(254, "80"), example_lines());
    });
}

/// S09: while the agent was down node-c left (its block released) and node-b's IP changed.
#[test]
fn restart_with_changed_input() {
    if skip_unless_root("restart_with_changed_input") {
        return;
    }
    let ns = Netns::new();
    ns.rt.block_on(async {
        let mut r = reconciler(DataplaneConfig::default(), None);
        r.set_desired(&example_cluster());
        r.apply().await;
        drop(r);
        let mut c = example_cluster();
        c.retain(|x| x.dst.to_string() != "10.244.30.0/26" && x.dst.to_string() != "10.244.10.7/32");
        c[1] = route("10.244.20.0/26", RoutePath::HostNic, Some("10.0.0.22"));
        let mut r = reconciler(DataplaneConfig::default(), None);
        r.set_desired(&c);
        let rep = r.apply().await;
        assert_eq!((rep.writes, rep.deletes), (1, 2), "{rep:#?}");
        assert_eq!(
            with_proto(254, "80"),
            [
                "blackhole 10.244.10.0/26 proto 80 metric 1024",
                "10.244.20.0/26 via 10.0.0.22 dev eth0 proto 80 metric 1024 onlink",
                "blackhole fd00:10:244:10::/122 dev lo proto 80 metric 1024 pref medium",
                "fd00:10:244:20::/122 via fd00::12 dev eth0 proto 80 metric 1024 onlink pref medium",
            ]
        );
    });
}

/// Nothing is deleted while the datastore is not synced (S10's dataplane half).
#[test]
fn no_deletes_while_datastore_unsynced() {
    if skip_unless_root("no_deletes_while_datastore_unsynced") {
        return;
    }
    let ns = Netns::new();
    ns.rt.block_on(async {
        // The mass-deletion breaker off: this is about the datastore's sync state alone.
        let mut r = reconciler(DataplaneConfig { mass_deletion_percent: 100, ..DataplaneConfig::default() }, None);
        r.set_desired(&example_cluster());
        r.apply().await;
        r.set_datastore_synced(false);
        r.set_desired(&[]);
        let rep = r.apply().await;
        assert_eq!((rep.deletes, rep.deletes_deferred_unsynced), (0, 6));
        assert_eq!(with_proto(254, "80"), example_lines());
        r.set_datastore_synced(true);
        let rep = r.apply().await;
        assert_eq!(rep.deletes, 6);
        assert!(with_proto(254, "80").is_empty());
    });
}

/// S11: eth0 down for 2 s, then up: the kernel flushes the routes via eth0 (IPv4 without a
/// notification) and nothing puts them back while it is down; the event path re-installs them
/// once the link is back, and a route of ours deleted by another process, with the periodic
/// resync more than an hour away. How long each repair took is printed (the latency target is
/// the benchmarks').
#[test]
fn link_flap_and_a_foreign_delete_are_repaired_by_the_event_path() {
    if skip_unless_root("link_flap_and_a_foreign_delete_are_repaired_by_the_event_path") {
        return;
    }
    let ns = Netns::new();
    ns.rt.block_on(async {
        let cfg = DataplaneConfig { resync_interval: Duration::from_secs(1 << 12), ..DataplaneConfig::default() };
        let r = reconciler(cfg, None);
        let Driver { commands: cmd_tx, reports: mut rep_rx, task: driver } = Driver::start(r, example_cluster()).await;
        // The driver may apply once before it has read the commands; wait for the programmed state.
        tokio::time::timeout(DEADLINE, async {
            while with_proto(254, "80") != example_lines() {
                rep_rx.recv().await.unwrap();
            }
        })
        .await
        .expect("initial programming");

        ip("link set eth0 down");
        let down: Vec<String> = example_lines().into_iter().filter(|l| !l.contains(" dev eth0 ")).collect();
        assert_eq!(down.len(), 4);
        lines_stay("routes via eth0 are flushed while it is down", 254, "80", &down, Duration::from_secs(2)).await;
        ip("link set eth0 up");
        let took = wait_for_lines("routes via eth0 re-installed after link up", 254, "80", &example_lines()).await;
        eprintln!("S11: routes via eth0 re-installed {took:?} after link up");

        // A route of ours deleted by someone else comes back too.
        ip("route del 10.244.30.0/26 proto 80");
        let took = wait_for_lines("route deleted by another process re-installed", 254, "80", &example_lines()).await;
        eprintln!("route deleted by another process re-installed after {took:?}");
        drop(cmd_tx);
        driver.await.unwrap();
    });
}

/// S12: a BIRD leftover on the tunnel device inside an IPIP pool is replaced (and a stale one
/// deleted) only when routewarden owns IPIP and BIRD does not; a proto-static route on a
/// cluster prefix is reported, not touched, in both cases.
#[test]
fn bird_leftovers_claimed_only_when_policy_says_so() {
    if skip_unless_root("bird_leftovers_claimed_only_when_policy_says_so") {
        return;
    }
    let ns = Netns::new();
    ns.rt.block_on(async {
        ip("route add 10.244.30.0/26 via 10.0.1.13 dev tunl0 proto bird metric 1024 onlink");
        ip("route add 10.244.40.0/26 via 10.0.1.14 dev tunl0 proto bird metric 1024 onlink");
        ip("route add 10.244.20.0/26 via 10.0.0.1 dev eth0 proto static metric 1024");
        let cfg = DataplaneConfig::default();
        // BIRD still owns IPIP: no claim.
        let mut r = reconciler(cfg.clone(), None);
        r.set_desired(&example_cluster());
        let rep = r.apply().await;
        let mut conflicts: Vec<String> = rep.conflicts.iter().map(|c| c.key.dst.to_string()).collect();
        conflicts.sort();
        assert_eq!(conflicts, ["10.244.20.0/26", "10.244.30.0/26"]);
        let main = routes(false, 254);
        for l in [
            "10.244.30.0/26 via 10.0.1.13 dev tunl0 proto bird metric 1024 onlink",
            "10.244.40.0/26 via 10.0.1.14 dev tunl0 proto bird metric 1024 onlink",
            "10.244.20.0/26 via 10.0.0.1 dev eth0 proto static metric 1024",
        ] {
            assert!(main.contains(&l.to_string()), "{l} missing from {main:#?}");
        }
        // routewarden owns IPIP, BIRD does not: BIRD's tunnel routes in the pool are ours.
        let policy = OwnershipPolicy { claim_bird_on_tunnel: vec!["10.244.0.0/16".parse().unwrap()], ..cfg.policy_owning(dataplane_support::POOLS) };
        r.set_policy(policy);
        let rep = r.apply().await;
        assert_eq!(rep.overwrote.len(), 1, "{rep:#?}");
        assert_eq!(rep.overwrote[0].previous, "10.244.30.0/26 via 10.0.1.13 dev tunl0 proto 12 metric 1024 onlink");
        assert_eq!(rep.deletes, 1);
        // The static route's key stays blocked (re-reported whenever its retry comes due).
        assert!(rep.conflicts.iter().all(|c| c.key.dst.to_string() == "10.244.20.0/26"), "{rep:#?}");
        assert_eq!(
            routes(false, 254),
            [
                "10.0.0.0/24 dev eth0 proto kernel scope link src 10.0.0.11",
                "blackhole 10.244.10.0/26 proto 80 metric 1024",
                "10.244.10.7 via 10.0.1.13 dev tunl0 proto 80 metric 1024 onlink",
                "10.244.20.0/26 via 10.0.0.1 dev eth0 proto static metric 1024",
                "10.244.30.0/26 via 10.0.1.13 dev tunl0 proto 80 metric 1024 onlink",
            ]
        );
        // The audit names the static writer on the cluster prefix.
        let mut nl = RtNetlink::connect().unwrap();
        let expected: Vec<ExpectedRoute> =
            example_cluster().into_iter().map(|route| ExpectedRoute { route: route.into(), owner: Writer::Routewarden, protocol: 80 }).collect();
        let scope = AuditScope {
            table: 254,
            cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap(), "fd00:10:244::/48".parse().unwrap()],
            devices: RouteDevices::default(),
            our_protocol: 80,
            unowned: Vec::new(),
            wireguard: Vec::new(),
        };
        let audit = audit_kernel(&mut nl, &expected, &scope).await.unwrap();
        let codes: Vec<(String, &str)> = audit.findings.iter().map(|f| (f.prefix.to_string(), f.code.as_str())).collect();
        assert_eq!(codes, [("10.244.20.0/26".to_string(), "missing"), ("10.244.20.0/26".to_string(), "foreign-writer")]);
        assert_eq!(audit.findings[1].found, ["10.244.20.0/26 via 10.0.0.1 dev eth0 proto 4 metric 1024"]);
        assert_eq!(audit.counts().get(&FindingCode::ForeignWriter), Some(&1));
    });
}

/// A missing tunnel device is reported and retried; once it exists the routes go in.
/// BIRD's blackhole for this node's own block, left in the kernel after a
/// BIRD -> routewarden handover (BIRD's kernel protocol persists its routes), is held and
/// untouched while BIRD owns the class; once routewarden programs the class and BIRD does not,
/// it is replaced in place by ours (no delete), and it goes when the block is released. A BIRD
/// blackhole outside the claimed pools is never touched.
#[test]
fn bird_own_block_blackhole_claimed_in_place_and_removed_with_the_block() {
    if skip_unless_root("bird_own_block_blackhole_claimed_in_place_and_removed_with_the_block") {
        return;
    }
    let ns = Netns::new();
    ns.rt.block_on(async {
        ip("route add blackhole 10.244.10.0/26 proto bird metric 1024");
        ip("route add blackhole 10.99.0.0/26 proto bird metric 1024");
        let held = "blackhole 10.244.10.0/26 proto bird metric 1024";
        let outside = "blackhole 10.99.0.0/26 proto bird metric 1024";
        let cfg = DataplaneConfig::default();
        // BIRD still owns the class: held and reported, never replaced.
        let mut r = reconciler(cfg.clone(), None);
        r.set_desired(&example_cluster());
        let rep = r.apply().await;
        let conflicts: Vec<String> = rep.conflicts.iter().map(|c| c.key.dst.to_string()).collect();
        assert_eq!(conflicts, ["10.244.10.0/26"], "{rep:#?}");
        let main = routes(false, 254);
        assert!(main.contains(&held.to_string()) && main.contains(&outside.to_string()), "{main:#?}");
        // routewarden programs the class and BIRD does not: claimed, replaced in place.
        let mut monitor = Monitor::start();
        let claim = OwnershipPolicy { claim_bird_blackholes: vec!["10.244.0.0/16".parse().unwrap()], ..cfg.policy_owning(dataplane_support::POOLS) };
        r.set_policy(claim);
        let rep = r.apply().await;
        assert_eq!(rep.overwrote.iter().map(|o| o.previous.as_str()).collect::<Vec<_>>(), ["blackhole 10.244.10.0/26 proto 12 metric 1024"], "{rep:#?}");
        assert_eq!(rep.deletes, 0, "{rep:#?}");
        assert!(rep.conflicts.is_empty(), "{rep:#?}");
        let mut want: Vec<String> = vec!["10.0.0.0/24 dev eth0 proto kernel scope link src 10.0.0.11".into()];
        want.extend(example_lines().into_iter().filter(|l| !l.contains(':')));
        want.insert(1, outside.to_string());
        assert_eq!(routes(false, 254), want);
        // Replace, never delete-then-add: the kernel saw one new route and no removal.
        assert_eq!(monitor.route_events(SETTLE).await, ["+ 10.244.10.0/26 table 254 metric 1024 proto 80"]);
        // The block is released: our blackhole goes with it; BIRD's outside the pools stays.
        let without: Vec<_> = example_cluster().into_iter().filter(|c| c.dst.to_string() != "10.244.10.0/26").collect();
        r.set_desired(&without);
        let rep = r.apply().await;
        assert_eq!(rep.deletes, 1, "{rep:#?}");
        let main = routes(false, 254);
        assert!(!main.iter().any(|l| l.contains("10.244.10.0/26")), "{main:#?}");
        assert!(main.contains(&outside.to_string()), "{main:#?}");
    });
}

#[test]
fn missing_tunnel_device_reported_then_programmed() {
    if skip_unless_root("missing_tunnel_device_reported_then_programmed") {
        return;
    }
    let ns = Netns::new();
    ns.rt.block_on(async {
        ip("link del tunl0");
        let mut r = reconciler(DataplaneConfig::default(), None);
        r.set_desired(&example_cluster());
        let rep = r.apply().await;
        assert_eq!(rep.waiting_for_device.get("tunl0"), Some(&2), "{rep:#?}");
        assert_eq!(rep.errors.get(&ErrorKind::NoDevice), Some(&2));
        assert_eq!(rep.writes, 4);
        ip("link add tunl0 type veth peer name tunpeer");
        ip("link set tunpeer up");
        ip("link set tunl0 up");
        tokio::time::sleep(r.next_wakeup().saturating_duration_since(Instant::now())).await;
        let rep = r.apply().await;
        assert_eq!(rep.writes, 2, "{rep:#?}");
        assert_eq!(with_proto(254, "80"), example_lines());
    });
}

/// Cold start of 10,000 routes into an empty table: pipelined writes on one connection.
#[test]
fn cold_start_10k_routes_timing() {
    if skip_unless_root("cold_start_10k_routes_timing") {
        return;
    }
    let ns = Netns::new();
    ns.rt.block_on(async {
        let cluster: Vec<_> = (0..10_000u32)
            .map(|i| {
                let dst = format!("10.{}.{}.{}/26", 128 + i / 1024, (i / 4) % 256, (i % 4) * 64);
                let (path, gw) = if i % 2 == 0 { (RoutePath::Tunnel, "10.0.1.13") } else { (RoutePath::HostNic, "10.0.0.12") };
                route(&dst, path, Some(gw))
            })
            .collect();
        let mut r = reconciler(DataplaneConfig::default(), None);
        r.set_desired(&cluster);
        let t = Instant::now();
        let rep = r.apply().await;
        let cold = t.elapsed();
        assert_eq!((rep.writes, rep.error_count()), (10_000, 0), "{:?}", rep.error_messages);
        assert_eq!(with_proto(254, "80").len(), 10_000);
        r.request_resync();
        let t = Instant::now();
        let rep = r.apply().await;
        let resync = t.elapsed();
        assert_eq!(rep.writes, 0);
        eprintln!("10,000 routes cold start: {cold:?}; no-change full resync of 10,000: {resync:?}");
        assert!(cold < Duration::from_secs(30), "sanity bound");
        // The same without pipelining (one request in flight), into another table, for scale.
        let cfg = DataplaneConfig { table: 49, ..DataplaneConfig::default() };
        let nl = RtNetlink::connect().unwrap().with_window(1);
        let mut serial =
            routewarden::dataplane::Reconciler::new(cfg.clone(), cfg.policy_owning(dataplane_support::POOLS), nl, routewarden::dataplane::SystemClock);
        serial.set_desired(&cluster);
        let t = Instant::now();
        let rep = serial.apply().await;
        assert_eq!(rep.writes, 10_000);
        eprintln!("10,000 routes cold start, one request at a time: {:?}", t.elapsed());
    });
}

/// S04 through the production path: a driver with its own netlink watcher, restarted with
/// unchanged input, writes nothing, also when links send unrelated notifications.
#[test]
fn driver_restart_with_watcher_writes_nothing() {
    if skip_unless_root("driver_restart_with_watcher_writes_nothing") {
        return;
    }
    let ns = Netns::new();
    ns.rt.block_on(async {
        let mut r = reconciler(DataplaneConfig::default(), None);
        r.set_desired(&example_cluster());
        r.apply().await;
        drop(r);
        let mut mon = Monitor::start();
        let r = reconciler(DataplaneConfig::default(), None);
        let Driver { commands: cmd_tx, reports: mut rep_rx, task: driver } = Driver::start(r, example_cluster()).await;
        // The first apply, whenever the driver gets to it.
        let first = tokio::time::timeout(DEADLINE, rep_rx.recv()).await.expect("a first apply").expect("driver running");
        // Unrelated link notifications (the watcher has not seen these links before), then a
        // second of watching: nothing may be written for them.
        ip("link set eth0 mtu 1400");
        ip("link set tunl0 mtu 1400");
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(cmd_tx);
        driver.await.unwrap();
        let mut writes = first.writes + first.deletes;
        let mut applies = 1;
        while let Ok(rep) = rep_rx.try_recv() {
            applies += 1;
            writes += rep.writes + rep.deletes;
        }
        eprintln!("driver restart with unchanged input: {applies} applies, {writes} writes");
        assert_eq!(writes, 0);
        // The MTU changes make the kernel re-announce its own IPv6 routes (proto 2); none of ours.
        let ours: Vec<String> = mon.route_events(SETTLE).await.into_iter().filter(|e| e.ends_with("proto 80")).collect();
        assert_eq!(ours, Vec::<String>::new());
        assert_eq!(with_proto(254, "80"), example_lines());
    });
}

/// Handover without a gap: routewarden stops programming IPIP, BIRD takes over. Our routes stay
/// until BIRD's route for the same prefix is in the kernel; then ours go. The monitor sees
/// BIRD's add before our delete, for every prefix (no instant without a route).
#[test]
fn handover_to_bird_keeps_routes_until_bird_route_seen() {
    if skip_unless_root("handover_to_bird_keeps_routes_until_bird_route_seen") {
        return;
    }
    let ns = Netns::new();
    ns.rt.block_on(async {
        // A grace period far beyond the waits below: the routes must go because BIRD's were
        // seen (HandoverEnd::Seen), never because the grace period ended.
        let cfg = DataplaneConfig { handover_grace: Duration::from_mins(1), ..DataplaneConfig::default() };
        let r = reconciler(cfg, None);
        let Driver { commands: cmd_tx, reports: mut rep_rx, task: driver } = Driver::start(r, example_cluster()).await;
        tokio::time::timeout(DEADLINE, async {
            while with_proto(254, "80") != example_lines() {
                rep_rx.recv().await.unwrap();
            }
        })
        .await
        .expect("initial programming");
        let mut mon = Monitor::start();

        // IPIP goes to BIRD: routewarden keeps only the no-encap routes.
        let no_encap: Vec<_> = example_cluster().into_iter().filter(|c| c.class == routewarden::vocabulary::PoolClass::NoEncap).collect();
        let handover = dataplane::Handover {
            class: routewarden::vocabulary::PoolClass::Ipip,
            to: Writer::Bird,
            protocol: 12,
            table: 254,
            // BIRD here writes at metric 0 (IPv4) and 1: no step aside needed.
            metric: Some(0),
        };
        let started = Instant::now();
        cmd_tx.send(DataplaneCommand::SetDesired { routes: route_map(&no_encap), handovers: vec![handover] }).await.unwrap();
        lines_stay("nothing removed before BIRD's routes exist", 254, "80", &example_lines(), Duration::from_millis(500)).await;
        // BIRD installs its routes (metric 0 here, so both keys coexist for a moment).
        for cmd in [
            "route add 10.244.30.0/26 via 10.0.1.13 dev tunl0 proto bird onlink",
            "route add 10.244.10.7/32 via 10.0.1.13 dev tunl0 proto bird onlink",
            "route add blackhole 10.244.10.0/26 proto bird",
            "-6 route add blackhole fd00:10:244:10::/122 proto bird metric 1",
        ] {
            ip(cmd);
        }
        let seen_at = Instant::now();
        tokio::time::timeout(DEADLINE, async {
            while with_proto(254, "80").len() != 2 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("our IPIP routes removed once BIRD's are seen");
        eprintln!("handover: our routes removed {:?} after BIRD's appeared ({:?} after the handover began)", seen_at.elapsed(), started.elapsed());
        assert_eq!(
            with_proto(254, "80"),
            [
                "10.244.20.0/26 via 10.0.0.12 dev eth0 proto 80 metric 1024 onlink",
                "fd00:10:244:20::/122 via fd00::12 dev eth0 proto 80 metric 1024 onlink pref medium",
            ],
            "the no-encap routes stay"
        );
        let ev = mon.route_events(SETTLE).await;
        for dst in ["10.244.30.0/26", "10.244.10.7/32", "10.244.10.0/26", "fd00:10:244:10::/122"] {
            let add = ev.iter().position(|e| e.starts_with(&format!("+ {dst} ")) && e.ends_with("proto 12"));
            let del = ev.iter().position(|e| e.starts_with(&format!("- {dst} ")) && e.ends_with("proto 80"));
            assert!(add.is_some() && del.is_some() && add < del, "{dst}: {ev:#?}");
        }
        let mut handovers = Vec::new();
        while let Ok(rep) = rep_rx.try_recv() {
            handovers.extend(rep.handovers);
        }
        assert_eq!(handovers.len(), 4, "{handovers:#?}");
        assert!(handovers.iter().all(|h| h.end == dataplane::HandoverEnd::Seen));
        drop(cmd_tx);
        driver.await.unwrap();
    });
}

/// Writes and deletes are packed into one `sendmsg` per batch; each op still gets its own
/// result, errors in the middle of a batch do not affect the ops after them, and the ops run
/// in order (a delete after a write of the same key sees the write), also across batch
/// boundaries.
#[test]
fn batched_ops_keep_per_op_results_and_order() {
    use nix::errno::Errno;
    use routewarden::dataplane::{Family, KernelRoute, RouteKey, RouteKind, RouteNetlink, RouteOp, RouteTarget};
    if skip_unless_root("batched_ops_keep_per_op_results_and_order") {
        return;
    }
    let ns = Netns::new();
    ns.rt.block_on(async {
        let key = |dst: &str| RouteKey { table: 254, family: Family::V4, dst: dst.parse().unwrap(), tos: 0, metric: 1024 };
        let via = |dst: &str, gw: &str, onlink: bool| KernelRoute {
            key: key(dst),
            target: RouteTarget { kind: RouteKind::Unicast, gateway: Some(gw.parse().unwrap()), device: Some("eth0".into()), onlink, protocol: 80, scope: 0 },
        };
        for window in [dataplane::kernel::DEFAULT_WINDOW, 2, 1] {
            let mut nl = RtNetlink::connect().unwrap().with_window(window);
            let links = nl.dump_links().await.unwrap();
            let eth0 = links.iter().find(|l| l.name == "eth0").unwrap().index;
            let write = |route: KernelRoute, oif: u32, exclusive: bool| RouteOp::Write { route, oif: Some(oif), nexthop: None, exclusive };
            let ops = vec![
                write(via("10.244.1.0/26", "10.0.0.12", true), eth0, true),
                write(via("10.244.1.0/26", "10.0.0.12", true), eth0, true),
                RouteOp::Delete { key: key("10.244.2.0/26"), protocol: 80 },
                write(via("10.244.3.0/26", "10.0.0.12", true), 99_999, false),
                write(via("10.244.4.0/26", "10.99.0.1", false), eth0, false),
                RouteOp::Delete { key: key("10.244.1.0/26"), protocol: 80 },
                write(via("10.244.5.0/26", "10.0.0.12", true), eth0, false),
            ];
            let results = nl.execute(&ops).await;
            let errnos: Vec<Option<Errno>> = results.iter().map(|r| r.as_ref().err().map(|e| e.errno().expect("a kernel errno"))).collect();
            assert_eq!(
                errnos,
                [None, Some(Errno::EEXIST), Some(Errno::ESRCH), Some(Errno::ENODEV), Some(Errno::ENETUNREACH), None, None],
                "window {window}: {results:?}"
            );
            assert_eq!(with_proto(254, "80"), ["10.244.5.0/26 via 10.0.0.12 dev eth0 proto 80 metric 1024 onlink"]);
            ip("route del 10.244.5.0/26 proto 80");
        }
    });
}

/// A write of the `i`-th /26 from 10.244.0.0 via 10.0.0.12 onlink on `eth0` (ifindex `oif`),
/// with `protocol`, create-exclusive or replace.
fn block_write(i: u32, protocol: u8, oif: u32, exclusive: bool) -> routewarden::dataplane::RouteOp {
    use routewarden::dataplane::{Family, KernelRoute, RouteKey, RouteKind, RouteOp, RouteTarget};
    let dst = ipnet::IpNet::V4(ipnet::Ipv4Net::new(std::net::Ipv4Addr::from(0x0af4_0000 + (i << 6)), 26).unwrap());
    let target =
        RouteTarget { kind: RouteKind::Unicast, gateway: Some("10.0.0.12".parse().unwrap()), device: Some("eth0".into()), onlink: true, protocol, scope: 0 };
    RouteOp::Write {
        route: KernelRoute { key: RouteKey { table: 254, family: Family::V4, dst, tos: 0, metric: 1024 }, target },
        oif: Some(oif),
        nexthop: None,
        exclusive,
    }
}

/// A write pass handed to the kernel in pipelined chunks: each chunk comes back exactly once,
/// in order, with its own ops and one result per op (the failures where they were), whether
/// it spans batches, is answered while a plain `execute` runs between chunks, or comes back
/// with the last chunk; a chunk left out by a pass dropped before its end is not handed to the
/// next pass (its routes are written all the same).
#[test]
fn pipelined_chunks_come_back_once_each_in_order_with_their_own_results() {
    use nix::errno::Errno;
    use routewarden::dataplane::{ChunkPlace, Executed, RouteNetlink};
    if skip_unless_root("pipelined_chunks_come_back_once_each_in_order_with_their_own_results") {
        return;
    }
    let ns = Netns::new();
    ns.rt.block_on(async {
        let mut nl = RtNetlink::connect().unwrap();
        let eth0 = nl.dump_links().await.unwrap().iter().find(|l| l.name == "eth0").unwrap().index;
        let write = |i: u32, protocol: u8| block_write(i, protocol, eth0, true);
        let ours = |keys: std::ops::Range<u32>| keys.map(|i| write(i, 80)).collect::<Vec<_>>();
        // Which ops of a chunk failed, and how.
        let failures = |c: &Executed| -> Vec<(usize, Errno)> {
            c.results.iter().enumerate().filter_map(|(i, r)| r.as_ref().err().map(|e| (i, e.errno().expect("a kernel errno")))).collect()
        };
        // Another writer (protocol 12) holds three keys.
        assert!(nl.execute(&[write(5, 12), write(1200, 12), write(2100, 12)]).await.iter().all(Result::is_ok));
        let (a, b, c) = (ours(0..1500), ours(1500..2200), ours(2200..2210));
        // A: two batches; nothing back yet (its second batch is in the kernel).
        assert!(nl.execute_chunk(a.clone(), ChunkPlace { first: true, last: false }).await.is_empty());
        // B: A comes back, complete.
        let back = nl.execute_chunk(b.clone(), ChunkPlace { first: false, last: false }).await;
        assert_eq!(back.len(), 1);
        assert!(back[0].ops == a && back[0].results.len() == a.len());
        assert_eq!(failures(&back[0]), [(5, Errno::EEXIST), (1200, Errno::EEXIST)]);
        // A plain execute meanwhile gets its own result; B's answers are kept for the pass.
        let extra = nl.execute(&ours(5000..5001)).await;
        assert!(extra.len() == 1 && extra[0].is_ok(), "{extra:?}");
        // The last chunk brings back B and itself.
        let back = nl.execute_chunk(c.clone(), ChunkPlace { first: false, last: true }).await;
        assert_eq!(back.len(), 2);
        assert!(back[0].ops == b && back[1].ops == c);
        assert_eq!(failures(&back[0]), [(600, Errno::EEXIST)]);
        assert!(back[1].results.len() == c.len() && failures(&back[1]).is_empty());
        assert_eq!(with_proto(254, "80").len(), 2210 - 3 + 1);
        // A pass dropped after its first chunk: the next pass gets only its own.
        assert!(nl.execute_chunk(ours(3000..3010), ChunkPlace { first: true, last: false }).await.is_empty());
        let back = nl.execute_chunk(ours(3010..3020), ChunkPlace { first: true, last: true }).await;
        assert!(back.len() == 1 && back[0].ops == ours(3010..3020) && failures(&back[0]).is_empty());
        assert_eq!(with_proto(254, "80").len(), 2210 - 3 + 1 + 20);
        assert_eq!(with_proto(254, "bird").len(), 3);
    });
}

/// A write pass in which every op fails spans several batches, all but the last sent from the
/// sending thread while the next is built: each op gets its own errno (none lost to a full
/// receive buffer as `ENOBUFS`, none read as done), the ops after the failures are written,
/// and the other writer's routes are untouched.
#[test]
fn every_failure_of_a_multi_batch_pass_is_reported() {
    use nix::errno::Errno;
    use routewarden::dataplane::{RouteNetlink, RouteOp};
    // More than two batches of the default window.
    const HELD: u32 = 2600;
    if skip_unless_root("every_failure_of_a_multi_batch_pass_is_reported") {
        return;
    }
    let ns = Netns::new();
    ns.rt.block_on(async {
        let mut nl = RtNetlink::connect().unwrap();
        let eth0 = nl.dump_links().await.unwrap().iter().find(|l| l.name == "eth0").unwrap().index;
        let write = |i: u32, protocol: u8, exclusive: bool| block_write(i, protocol, eth0, exclusive);
        // Another writer (protocol 12, BIRD's) holds HELD keys.
        let theirs: Vec<RouteOp> = (0..HELD).map(|i| write(i, 12, false)).collect();
        assert!(nl.execute(&theirs).await.iter().all(Result::is_ok));
        // Ours: create-exclusive on every held key, then three free keys.
        let ours: Vec<RouteOp> = (0..HELD + 3).map(|i| write(i, 80, true)).collect();
        let results = nl.execute(&ours).await;
        let errnos: Vec<Option<Errno>> = results.iter().map(|r| r.as_ref().err().map(|e| e.errno().expect("a kernel errno"))).collect();
        let mut want = vec![Some(Errno::EEXIST); HELD as usize];
        want.extend([None, None, None]);
        assert!(errnos == want, "first unexpected result: {:?}", errnos.iter().zip(&want).enumerate().find(|(_, (got, want))| got != want));
        assert_eq!(with_proto(254, "bird").len(), HELD as usize);
        assert_eq!(
            with_proto(254, "80"),
            ["10.246.138.0/26", "10.246.138.64/26", "10.246.138.128/26"].map(|d| format!("{d} via 10.0.0.12 dev eth0 proto 80 metric 1024 onlink"))
        );
    });
}
