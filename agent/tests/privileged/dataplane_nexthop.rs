//! `--nexthop-objects` in a real kernel, each test in its own network namespace: the
//! same reachability as classic routes, a node move as one nexthop write, zero
//! writes on resync and restart, switching the mode both ways in place, and nexthop objects
//! of other writers never reused or deleted.

mod dataplane_support;

use std::collections::BTreeMap;
use std::time::Duration;

use dataplane_support::{ip, reconciler, routes, Driver, Monitor, Netns};
use routewarden::dataplane::{audit_kernel, AuditScope, DataplaneConfig, ExpectedRoute, Handover, RtNetlink, NEXTHOP_IDS};
use routewarden::routes::{ClusterRoute, RouteDevices};
use routewarden::vocabulary::{PoolClass, RoutePath, Writer};
use routewarden_lab::cluster_routes::{blackhole, to_node};
use routewarden_lab::skip_unless_root;

const SETTLE: Duration = Duration::from_millis(300);
const POOL: &str = "default-ipv4-ippool";
const POOL_V6: &str = "default-ipv6-ippool";

fn nh_config() -> DataplaneConfig {
    DataplaneConfig { nexthop_objects: true, ..DataplaneConfig::default() }
}

/// node-a's view: its own blocks blackholed; node-b (same subnet, 10.0.0.12) with three
/// blocks and a borrowed IP via eth0; node-c (10.0.1.13, another subnet) with two blocks via
/// the tunnel; node-b's IPv6 block.
fn cluster() -> Vec<ClusterRoute> {
    vec![
        blackhole("10.244.10.0/26", POOL),
        to_node("10.244.20.0/26", RoutePath::HostNic, "10.0.0.12", "node-b", POOL),
        to_node("10.244.20.64/26", RoutePath::HostNic, "10.0.0.12", "node-b", POOL),
        to_node("10.244.20.128/26", RoutePath::HostNic, "10.0.0.12", "node-b", POOL),
        to_node("10.244.10.9/32", RoutePath::HostNic, "10.0.0.12", "node-b", POOL),
        to_node("10.244.30.0/26", RoutePath::Tunnel, "10.0.1.13", "node-c", POOL),
        to_node("10.244.30.64/26", RoutePath::Tunnel, "10.0.1.13", "node-c", POOL),
        blackhole("fd00:10:244:10::/122", POOL_V6),
        to_node("fd00:10:244:20::/122", RoutePath::HostNic, "fd00::12", "node-b", POOL_V6),
    ]
}

/// `ip route get` of the first address of every destination: `(via, dev)` or `blackhole`.
fn reachability(routes: &[ClusterRoute]) -> BTreeMap<String, String> {
    routes
        .iter()
        .map(|r| {
            let addr = r.dst.network().to_string();
            let out = std::process::Command::new("ip").args(["route", "get", &addr]).output().expect("ip route get");
            let line = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
            let words: Vec<&str> = line.split_whitespace().collect();
            let after = |w: &str| words.iter().position(|x| *x == w).and_then(|i| words.get(i + 1)).copied().unwrap_or("-");
            let shape = if line.contains("blackhole") || line.contains("Invalid argument") {
                "blackhole".to_string()
            } else {
                format!("via {} dev {}", after("via"), after("dev"))
            };
            (addr, shape)
        })
        .collect()
}

/// `ip nexthop` lines, trimmed, in kernel order.
fn nexthops() -> Vec<String> {
    ip("nexthop show").lines().map(|l| l.trim().to_string()).filter(|l| !l.is_empty()).collect()
}

/// Our route lines (protocol 80, main table), both families.
fn ours() -> Vec<String> {
    routes(false, 254).into_iter().chain(routes(true, 254)).filter(|l| l.contains(" proto 80 ")).collect()
}

/// A nexthop-mode reconciler that has programmed `routes` (one apply).
async fn programmed(routes: &[ClusterRoute]) -> dataplane_support::RealReconciler {
    let mut r = reconciler(nh_config(), None);
    r.set_desired(routes);
    r.apply().await;
    r
}

/// A full resync of `r` writes and deletes nothing, routes or nexthop objects.
async fn resync_writes_nothing(r: &mut dataplane_support::RealReconciler) {
    r.request_resync();
    let rep = r.apply().await;
    assert_eq!((rep.writes, rep.deletes, rep.nexthop_writes, rep.nexthop_deletes), (0, 0, 0, 0), "{rep:#?}");
}

fn id(n: u32) -> u32 {
    NEXTHOP_IDS.start() + n
}

#[test]
fn nexthop_mode_programs_the_same_reachability_and_switches_both_ways_in_place() {
    if skip_unless_root("nexthop_mode_programs_the_same_reachability_and_switches_both_ways_in_place") {
        return;
    }
    let ns = Netns::new();
    ns.rt.block_on(async {
        let c = cluster();
        let mut classic = reconciler(DataplaneConfig::default(), None);
        classic.set_desired(&c);
        let rep = classic.apply().await;
        assert_eq!((rep.writes, rep.nexthop_writes, rep.error_count()), (9, 0, 0), "{rep:#?}");
        let want = reachability(&c);
        assert_eq!(want["10.244.20.64"], "via 10.0.0.12 dev eth0");
        assert_eq!(want["10.244.30.0"], "via 10.0.1.13 dev tunl0");
        assert!(nexthops().is_empty());
        drop(classic);

        // Classic -> nexthop objects: every route replaced in place, never deleted.
        let mut mon = Monitor::start();
        let mut r = reconciler(nh_config(), None);
        r.set_desired(&c);
        let rep = r.apply().await;
        assert_eq!((rep.writes, rep.deletes, rep.nexthop_writes, rep.error_count()), (7, 0, 3, 0), "{rep:#?}");
        assert_eq!(reachability(&c), want, "same next hop and device for every destination");
        assert_eq!(
            nexthops(),
            [
                format!("id {} via 10.0.0.12 dev eth0 scope link proto 80 onlink", id(0)),
                format!("id {} via fd00::12 dev eth0 scope link proto 80 onlink", id(1)),
                format!("id {} via 10.0.1.13 dev tunl0 scope link proto 80 onlink", id(2)),
            ]
        );
        let (b, b6, cc) = (id(0), id(1), id(2));
        assert_eq!(
            ours(),
            [
                "blackhole 10.244.10.0/26 proto 80 metric 1024".to_string(),
                format!("10.244.10.9 nhid {b} via 10.0.0.12 dev eth0 proto 80 metric 1024 onlink"),
                format!("10.244.20.0/26 nhid {b} via 10.0.0.12 dev eth0 proto 80 metric 1024 onlink"),
                format!("10.244.20.64/26 nhid {b} via 10.0.0.12 dev eth0 proto 80 metric 1024 onlink"),
                format!("10.244.20.128/26 nhid {b} via 10.0.0.12 dev eth0 proto 80 metric 1024 onlink"),
                format!("10.244.30.0/26 nhid {cc} via 10.0.1.13 dev tunl0 proto 80 metric 1024 onlink"),
                format!("10.244.30.64/26 nhid {cc} via 10.0.1.13 dev tunl0 proto 80 metric 1024 onlink"),
                "blackhole fd00:10:244:10::/122 dev lo proto 80 metric 1024 pref medium".to_string(),
                format!("fd00:10:244:20::/122 nhid {b6} via fd00::12 dev eth0 proto 80 metric 1024 onlink pref medium"),
            ]
        );
        let ev = mon.route_events(SETTLE).await;
        assert!(ev.iter().all(|e| e.starts_with('+')), "no route deleted on the way to nexthop objects: {ev:?}");

        // A resync, and a restart, write nothing.
        resync_writes_nothing(&mut r).await;
        drop(r);
        let mut r = reconciler(nh_config(), None);
        r.set_desired(&c);
        let rep = r.apply().await;
        assert_eq!((rep.writes, rep.deletes, rep.nexthop_writes, rep.nexthop_deletes, rep.error_count()), (0, 0, 0, 0, 0), "{rep:#?}");

        // With nexthop_compat_mode off the kernel reports only the nexthop id: a resync still
        // writes nothing, and the audit judges each route by its object's gateway and device.
        std::fs::write("/proc/sys/net/ipv4/nexthop_compat_mode", "0").expect("nexthop_compat_mode");
        assert!(routes(false, 254).iter().any(|l| l == &format!("10.244.30.0/26 nhid {cc} proto 80 metric 1024")), "{:#?}", routes(false, 254));
        r.request_resync();
        let rep = r.apply().await;
        assert_eq!((rep.writes, rep.deletes, rep.nexthop_writes, rep.error_count()), (0, 0, 0, 0), "{rep:#?}");
        let expected: Vec<ExpectedRoute> =
            c.iter().cloned().map(|route| ExpectedRoute { route: route.into(), owner: Writer::Routewarden, protocol: 80 }).collect();
        let scope = AuditScope {
            table: 254,
            cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap(), "fd00:10:244::/48".parse().unwrap()],
            devices: RouteDevices::default(),
            our_protocol: 80,
            unowned: Vec::new(),
            wireguard: Vec::new(),
        };
        let audit = audit_kernel(&mut RtNetlink::connect().unwrap(), &expected, &scope).await.unwrap();
        assert!(audit.findings.is_empty(), "{:#?}", audit.findings);
        std::fs::write("/proc/sys/net/ipv4/nexthop_compat_mode", "1").expect("nexthop_compat_mode");
        drop(r);

        // Nexthop objects -> classic: replaced in place, then our unused objects go.
        mon.drain(SETTLE).await;
        let mut classic = reconciler(DataplaneConfig::default(), None);
        classic.set_desired(&c);
        let rep = classic.apply().await;
        assert_eq!((rep.writes, rep.deletes, rep.nexthop_deletes, rep.error_count()), (7, 0, 3, 0), "{rep:#?}");
        assert_eq!(reachability(&c), want);
        assert!(nexthops().is_empty(), "{:?}", nexthops());
        assert!(ours().iter().all(|l| !l.contains("nhid")), "{:?}", ours());
        let ev = mon.route_events(SETTLE).await;
        assert!(ev.iter().all(|e| e.starts_with('+')), "no route deleted on the way back: {ev:?}");
    });
}

#[test]
fn a_node_move_and_a_crosssubnet_switch_are_one_nexthop_write_each() {
    if skip_unless_root("a_node_move_and_a_crosssubnet_switch_are_one_nexthop_write_each") {
        return;
    }
    let ns = Netns::new();
    ns.rt.block_on(async {
        let blocks = |gw: &str, path: RoutePath| -> Vec<ClusterRoute> {
            let mut v: Vec<ClusterRoute> = (0..20).map(|i| to_node(&format!("10.244.{}.{}/26", 20 + i / 4, (i % 4) * 64), path, gw, "node-b", POOL)).collect();
            v.push(to_node("10.244.10.9/32", path, gw, "node-b", POOL));
            v.push(to_node("10.244.99.0/26", RoutePath::HostNic, "10.0.0.13", "node-c", POOL));
            v
        };
        let mut r = reconciler(nh_config(), None);
        r.set_desired(&blocks("10.0.0.12", RoutePath::HostNic));
        let rep = r.apply().await;
        assert_eq!((rep.writes, rep.nexthop_writes, rep.error_count()), (22, 2, 0), "{rep:#?}");

        // node-b's address changes: one nexthop replace re-points its 20 blocks and its /32.
        let mut mon = Monitor::start();
        let moved = blocks("10.0.0.22", RoutePath::HostNic);
        r.set_desired(&moved);
        let rep = r.apply().await;
        assert_eq!((rep.writes, rep.deletes, rep.nexthop_writes, rep.error_count()), (0, 0, 1, 0), "{rep:#?}");
        let got = reachability(&moved);
        assert_eq!(got.values().filter(|s| *s == "via 10.0.0.22 dev eth0").count(), 21, "{got:#?}");
        assert_eq!(got["10.244.99.0"], "via 10.0.0.13 dev eth0");
        assert!(mon.route_events(SETTLE).await.iter().all(|e| e.starts_with('+')), "no route deleted");

        // node-b leaves the subnet (CrossSubnet): the tunnel, one nexthop replace again.
        let tunnel = blocks("10.0.1.22", RoutePath::Tunnel);
        r.set_desired(&tunnel);
        let rep = r.apply().await;
        assert_eq!((rep.writes, rep.deletes, rep.nexthop_writes, rep.error_count()), (0, 0, 1, 0), "{rep:#?}");
        let got = reachability(&tunnel);
        assert_eq!(got.values().filter(|s| *s == "via 10.0.1.22 dev tunl0").count(), 21, "{got:#?}");

        // Resync: nothing to write.
        resync_writes_nothing(&mut r).await;

        // node-c goes: its route, then its nexthop object.
        let mut gone = tunnel.clone();
        gone.pop();
        r.set_desired(&gone);
        let rep = r.apply().await;
        assert_eq!((rep.writes, rep.deletes, rep.nexthop_writes, rep.nexthop_deletes, rep.error_count()), (0, 1, 0, 1, 0), "{rep:#?}");
        assert_eq!(nexthops(), [format!("id {} via 10.0.1.22 dev tunl0 scope link proto 80 onlink", id(0))]);
    });
}

#[test]
fn nexthop_objects_of_other_writers_are_never_reused_or_deleted() {
    if skip_unless_root("nexthop_objects_of_other_writers_are_never_reused_or_deleted") {
        return;
    }
    let ns = Netns::new();
    ns.rt.block_on(async {
        // Another writer's objects with node-b's gateway: one at our first id (another
        // protocol), one with our protocol outside our ids.
        ip(&format!("nexthop add id {} via 10.0.0.12 dev eth0 onlink proto 17", id(0)));
        ip("nexthop add id 7 via 10.0.0.12 dev eth0 onlink proto 80");
        let foreign = nexthops();
        let c = cluster();
        let mut r = reconciler(nh_config(), None);
        r.set_desired(&c);
        let rep = r.apply().await;
        assert_eq!((rep.writes, rep.nexthop_writes, rep.error_count()), (9, 3, 0), "{rep:#?}");
        let all = nexthops();
        for f in &foreign {
            assert!(all.contains(f), "{f} untouched: {all:#?}");
        }
        assert_eq!(all.len(), 5, "{all:#?}");
        let line = ours().into_iter().find(|l| l.starts_with("10.244.20.0/26")).unwrap();
        assert_eq!(line, format!("10.244.20.0/26 nhid {} via 10.0.0.12 dev eth0 proto 80 metric 1024 onlink", id(1)));

        // Another writer's route goes through node-c's object of ours: when node-c goes, its
        // routes of ours go, but the object stays while that route uses it.
        let node_c = id(3);
        ip(&format!("route add 192.168.50.0/24 nhid {node_c} proto 17"));
        let without_c: Vec<ClusterRoute> = c.iter().filter(|x| x.origin.node() != Some("node-c")).cloned().collect();
        r.set_desired(&without_c);
        let rep = r.apply().await;
        assert_eq!((rep.deletes, rep.nexthop_deletes, rep.error_count()), (2, 0, 0), "{rep:#?}");
        assert!(nexthops().iter().any(|l| l.starts_with(&format!("id {node_c} "))), "{:#?}", nexthops());
        assert_eq!(routes(false, 254).iter().filter(|l| l.starts_with("192.168.50.0/24")).count(), 1);

        // Once that route is gone, the object goes with the next apply.
        ip("route del 192.168.50.0/24");
        r.request_resync();
        let rep = r.apply().await;
        assert_eq!((rep.nexthop_deletes, rep.error_count()), (1, 0), "{rep:#?}");
        let all = nexthops();
        for f in &foreign {
            assert!(all.contains(f), "{f} still untouched: {all:#?}");
        }
        assert_eq!(all.len(), 4, "{all:#?}");
    });
}

/// The event path in nexthop mode: a link that goes down takes its nexthop objects and the
/// routes through them with it (`nexthop_flush_dev`); another writer deletes a nexthop object
/// of ours (and with it its routes). Both come back without waiting for a resync.
#[test]
fn a_flushed_or_deleted_nexthop_object_is_repaired_by_the_event_path() {
    if skip_unless_root("a_flushed_or_deleted_nexthop_object_is_repaired_by_the_event_path") {
        return;
    }
    let ns = Netns::new();
    ns.rt.block_on(async {
        use dataplane_support::{wait_for_lines, DEADLINE};
        let cfg = DataplaneConfig { resync_interval: Duration::from_secs(1 << 12), ..nh_config() };
        let r = reconciler(cfg, None);
        let Driver { commands: cmd_tx, reports: mut rep_rx, task: driver } = Driver::start(r, cluster()).await;
        tokio::time::timeout(DEADLINE, async {
            while ours().len() != 9 || nexthops().len() != 3 {
                rep_rx.recv().await.unwrap();
            }
        })
        .await
        .expect("initial programming");
        let lines = ours();
        let objects = nexthops();

        ip("link set eth0 down");
        tokio::time::sleep(Duration::from_millis(200)).await;
        ip("link set eth0 up");
        let took = wait_for_lines("routes through eth0's objects back after link up", 254, "80", &lines).await;
        assert_eq!(nexthops(), objects);
        eprintln!("routes through eth0's nexthop objects back {took:?} after link up");

        ip(&format!("nexthop del id {}", id(2)));
        let took = wait_for_lines("node-c's object and routes back after another writer deleted it", 254, "80", &lines).await;
        assert_eq!(nexthops(), objects);
        eprintln!("node-c's nexthop object and routes back {took:?} after it was deleted");

        // Another writer replaces node-c's object of ours in place, our protocol kept: put
        // back as we wrote it.
        ip(&format!("nexthop replace id {} via 10.0.1.99 dev tunl0 onlink proto 80", id(2)));
        let took = wait_for_lines("node-c's object put back after another writer replaced it", 254, "80", &lines).await;
        assert_eq!(nexthops(), objects);
        eprintln!("node-c's nexthop object put back {took:?} after it was replaced");
        // With another protocol: theirs now, left alone; our routes move to a new object.
        ip(&format!("nexthop replace id {} via 10.0.1.99 dev tunl0 onlink proto 17", id(2)));
        let theirs = format!("id {} via 10.0.1.99 dev tunl0 scope link proto 17 onlink", id(2));
        let started = std::time::Instant::now();
        while reachability(&cluster())["10.244.30.0"] != "via 10.0.1.13 dev tunl0" {
            assert!(started.elapsed() < DEADLINE, "node-c's routes not back on 10.0.1.13: {:#?}", ours());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(nexthops().contains(&theirs), "{:#?}", nexthops());
        assert!(nexthops().contains(&format!("id {} via 10.0.1.13 dev tunl0 scope link proto 80 onlink", id(3))), "{:#?}", nexthops());
        eprintln!("node-c's routes on a new object of ours {:?} after another writer took the old one", started.elapsed());
        drop(cmd_tx);
        driver.await.unwrap();
    });
}

/// Both families' route lines of `table`.
fn all_routes(table: u32) -> Vec<String> {
    routes(false, table).into_iter().chain(routes(true, table)).collect()
}

/// An apply report's counts, for messages.
fn sum(rep: &routewarden::dataplane::ApplyReport) -> String {
    format!(
        "writes {} deletes {} nh_writes {} nh_deletes {} errors {} unsynced {} held_mass {} handover {}",
        rep.writes,
        rep.deletes,
        rep.nexthop_writes,
        rep.nexthop_deletes,
        rep.error_count(),
        rep.deletes_deferred_unsynced,
        rep.deletes_held_mass,
        rep.deletes_deferred_handover
    )
}

/// A link that loses its carrier but stays up: the kernel flushes the nexthop objects on it and
/// the routes through them (IPv4 ones without a word, `nh_netdev_event` `NETDEV_CHANGE`) and
/// refuses new objects until the carrier is back. The routes go back in classic (`linkdown`,
/// as classic routes stay) at once, and through their object once the carrier is back, not at
/// the next resync.
#[test]
fn a_carrier_flap_puts_the_routes_back_classic_then_through_their_object() {
    if skip_unless_root("a_carrier_flap_puts_the_routes_back_classic_then_through_their_object") {
        return;
    }
    let ns = Netns::new();
    ns.rt.block_on(async {
        let cfg = DataplaneConfig { resync_interval: Duration::from_secs(1 << 12), ..nh_config() };
        let r = reconciler(cfg, None);
        let v4: Vec<ClusterRoute> = cluster().into_iter().filter(|r| r.dst.addr().is_ipv4()).collect();
        let Driver { commands: cmd_tx, reports: mut rep_rx, task: driver } = Driver::start(r, v4).await;
        tokio::time::timeout(Duration::from_secs(10), async {
            while ours().len() != 7 || nexthops().len() != 2 {
                rep_rx.recv().await.unwrap();
            }
        })
        .await
        .expect("initial");
        let lines = ours();
        ip("link set eth0p down");
        // node-b's routes back at once, classic, as classic routes stay on a link without carrier.
        let classic = |l: &String| l.ends_with(" onlink linkdown") && !l.contains("nhid");
        let start = std::time::Instant::now();
        while ours().iter().filter(|l| classic(l)).count() != 4 && start.elapsed() < Duration::from_secs(8) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(ours().iter().filter(|l| classic(l)).count(), 4, "{:#?}", ours());
        assert_eq!(nexthops().len(), 1, "{:#?}", nexthops());
        ip("link set eth0p up");
        let start = std::time::Instant::now();
        while ours() != lines && start.elapsed() < Duration::from_secs(8) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(ours(), lines, "routes back after carrier up; nexthops {:#?}", nexthops());
        drop(cmd_tx);
        driver.await.unwrap();
    });
}

/// Another writer replaces an object of ours with its own (another protocol and gateway): the
/// resync leaves it to that writer and moves our routes to a new object of ours; a replace
/// with our protocol is put back in place. Then the node goes: our object goes, theirs stays.
#[test]
fn an_object_of_ours_another_writer_replaced_is_left_to_it_and_ours_move_to_a_new_one() {
    if skip_unless_root("an_object_of_ours_another_writer_replaced_is_left_to_it_and_ours_move_to_a_new_one") {
        return;
    }
    let ns = Netns::new();
    ns.rt.block_on(async {
        let c = cluster();
        let mut r = reconciler(nh_config(), None);
        r.set_desired(&c);
        let rep = r.apply().await;
        assert_eq!(rep.error_count(), 0, "{rep:#?}");
        ip(&format!("nexthop replace id {} via 10.0.1.99 dev tunl0 onlink proto 17", id(2)));
        let foreign = format!("id {} via 10.0.1.99 dev tunl0 scope link proto 17 onlink", id(2));
        r.request_resync();
        let rep = r.apply().await;
        assert!(nexthops().contains(&foreign));
        assert_eq!((rep.writes, rep.nexthop_writes, rep.nexthop_deletes, rep.error_count()), (2, 1, 0, 0), "{rep:#?}");
        resync_writes_nothing(&mut r).await;
        drop(r);
        let mut r = reconciler(nh_config(), None);
        r.set_desired(&c);
        let rep = r.apply().await;
        assert_eq!((rep.writes, rep.nexthop_writes, rep.nexthop_deletes, rep.deletes), (0, 0, 0, 0), "restart {rep:#?}");
        // same protocol, other gateway: ours, put back in place
        ip(&format!("nexthop replace id {} via 10.0.0.99 dev eth0 onlink proto 80", id(0)));
        r.request_resync();
        let rep = r.apply().await;
        assert_eq!((rep.writes, rep.nexthop_writes, rep.nexthop_deletes, rep.deletes), (0, 1, 0, 0), "{rep:#?}");
        let without_c: Vec<ClusterRoute> = c.iter().filter(|x| x.origin.node() != Some("node-c")).cloned().collect();
        r.set_desired(&without_c);
        let rep = r.apply().await;
        assert!(nexthops().contains(&foreign));
        assert_eq!((rep.deletes, rep.nexthop_deletes, rep.error_count()), (2, 1, 0), "{rep:#?}");
    });
}

/// `nexthop_compat_mode` 0 before the start, table 48 (not there yet), protocol 201, metric
/// 77, both families: zero writes on resync and restart; a node that moved while the agent was
/// down is one object replace per family; the switch back to classic removes the objects.
#[test]
fn table_protocol_metric_compat_mode_off_restart_node_moved_while_down_and_back_to_classic() {
    if skip_unless_root("table_protocol_metric_compat_mode_off_restart_node_moved_while_down_and_back_to_classic") {
        return;
    }
    let ns = Netns::new();
    ns.rt.block_on(async {
        std::fs::write("/proc/sys/net/ipv4/nexthop_compat_mode", "0").unwrap();
        let cfg = DataplaneConfig { table: 48, protocol: 201, metric: 77, ..nh_config() };
        let c = cluster();
        let mut r = reconciler(cfg.clone(), None);
        r.set_desired(&c);
        let rep = r.apply().await;
        assert_eq!((rep.writes, rep.nexthop_writes, rep.error_count()), (9, 3, 0), "{rep:#?}");
        resync_writes_nothing(&mut r).await;
        drop(r);
        let mut r = reconciler(cfg.clone(), None);
        r.set_desired(&c);
        let rep = r.apply().await;
        assert_eq!((rep.writes, rep.nexthop_writes, rep.nexthop_deletes, rep.deletes, rep.error_count()), (0, 0, 0, 0, 0), "restart {rep:#?}");
        drop(r);
        // node-b moved while down (v4 and v6)
        let moved: Vec<ClusterRoute> = c
            .iter()
            .cloned()
            .map(|mut x| {
                if x.origin.node() == Some("node-b") {
                    x.gateway = Some(if x.dst.addr().is_ipv4() { "10.0.0.22".parse().unwrap() } else { "fd00::22".parse().unwrap() });
                }
                x
            })
            .collect();
        let mut r = reconciler(cfg.clone(), None);
        r.set_desired(&moved);
        let rep = r.apply().await;
        assert_eq!((rep.writes, rep.nexthop_writes, rep.nexthop_deletes, rep.deletes, rep.error_count()), (0, 2, 0, 0, 0), "moved {rep:#?}");
        drop(r);
        let mut r = reconciler(DataplaneConfig { nexthop_objects: false, ..cfg.clone() }, None);
        r.set_desired(&moved);
        let rep = r.apply().await;
        assert_eq!((rep.writes, rep.nexthop_deletes, rep.deletes, rep.error_count()), (7, 3, 0, 0), "classic {rep:#?}");
        assert_eq!(all_routes(48).len(), 9);
        resync_writes_nothing(&mut r).await;
    });
}

/// While the datastore is not synced a node that went keeps its routes and its object (a new
/// node gets a new one); once synced, both go.
#[test]
fn an_unsynced_datastore_keeps_a_gone_nodes_routes_and_object() {
    if skip_unless_root("an_unsynced_datastore_keeps_a_gone_nodes_routes_and_object") {
        return;
    }
    let ns = Netns::new();
    ns.rt.block_on(async {
        let c = cluster();
        let mut r = programmed(&c).await;
        let before = nexthops();
        r.set_datastore_synced(false);
        let mut next: Vec<ClusterRoute> = c.iter().filter(|x| x.origin.node() != Some("node-c")).cloned().collect();
        next.push(to_node("10.244.40.0/26", RoutePath::Tunnel, "10.0.1.14", "node-d", POOL));
        r.set_desired(&next);
        let rep = r.apply().await;
        assert_eq!((rep.deletes, rep.nexthop_deletes, rep.nexthop_writes, rep.error_count()), (0, 0, 1, 0), "{rep:#?}");
        for b in &before {
            assert!(nexthops().contains(b));
        }
        r.request_resync();
        let rep = r.apply().await;
        assert_eq!((rep.writes, rep.deletes, rep.nexthop_deletes, rep.nexthop_writes), (0, 0, 0, 0), "{rep:#?}");
        r.set_datastore_synced(true);
        let rep = r.apply().await;
        assert_eq!((rep.deletes, rep.nexthop_deletes, rep.error_count()), (2, 1, 0), "{rep:#?}");
    });
}

/// A mass deletion held by the breaker keeps the node's object; the node coming back writes
/// nothing.
#[test]
fn a_held_mass_deletion_keeps_the_object_and_the_node_coming_back_writes_nothing() {
    if skip_unless_root("a_held_mass_deletion_keeps_the_object_and_the_node_coming_back_writes_nothing") {
        return;
    }
    let ns = Netns::new();
    ns.rt.block_on(async {
        let mut c: Vec<ClusterRoute> =
            (0..20).map(|i| to_node(&format!("10.244.{}.{}/26", 20 + i / 4, (i % 4) * 64), RoutePath::HostNic, "10.0.0.12", "node-b", POOL)).collect();
        c.push(to_node("10.244.99.0/26", RoutePath::Tunnel, "10.0.1.13", "node-c", POOL));
        let mut r = programmed(&c).await;
        let lines = ours();
        let objs = nexthops();
        r.set_desired(&c[20..]);
        let rep = r.apply().await;
        assert_eq!((rep.deletes, rep.nexthop_deletes), (0, 0), "{rep:#?}");
        assert_eq!(ours(), lines);
        assert_eq!(nexthops(), objs);
        r.request_resync();
        let rep = r.apply().await;
        assert_eq!((rep.deletes, rep.nexthop_deletes), (0, 0), "{rep:#?}");
        assert_eq!(nexthops(), objs);
        // node-b returns: zero writes
        r.set_desired(&c);
        let rep = r.apply().await;
        assert_eq!((rep.writes, rep.deletes, rep.nexthop_writes, rep.nexthop_deletes), (0, 0, 0, 0), "{rep:#?}");
    });
}

/// IPIP handed over to BIRD: our routes step aside to metric+1 through the same object, go
/// once BIRD's are in, and then the unused object goes; a resync writes nothing.
#[test]
fn a_handover_to_bird_steps_aside_through_the_object_then_the_object_goes() {
    if skip_unless_root("a_handover_to_bird_steps_aside_through_the_object_then_the_object_goes") {
        return;
    }
    let ns = Netns::new();
    ns.rt.block_on(async {
        let c = cluster();
        let mut r = programmed(&c).await;
        let mut mon = Monitor::start();
        let h = Handover { class: PoolClass::Ipip, to: Writer::Bird, protocol: 12, table: 254, metric: None };
        let rest: Vec<ClusterRoute> = c.iter().filter(|x| x.class != PoolClass::Ipip || x.path == RoutePath::Blackhole).cloned().collect();
        r.set_desired_with_handover(&rest, &[h]);
        let rep = r.apply().await;
        assert_eq!((rep.writes, rep.nexthop_deletes, rep.error_count()), (2, 0, 0), "the copies at metric+1: {}", sum(&rep));
        for e in mon.drain(SETTLE).await {
            r.handle_event(&e);
        }
        r.apply().await;
        let copies: Vec<String> = ours().into_iter().filter(|l| l.starts_with("10.244.30.")).collect();
        assert_eq!(copies.len(), 2, "{:#?}", ours());
        assert!(copies.iter().all(|l| l.contains(" metric 1025") && l.contains(&format!("nhid {} ", id(2)))), "{copies:#?}");
        ip("route add 10.244.30.0/26 via 10.0.1.13 dev tunl0 onlink proto 12 metric 1024");
        ip("route add 10.244.30.64/26 via 10.0.1.13 dev tunl0 onlink proto 12 metric 1024");
        for e in mon.drain(SETTLE).await {
            r.handle_event(&e);
        }
        let rep = r.apply().await;
        assert_eq!(rep.error_count(), 0, "{rep:#?}");
        assert_eq!(all_routes(254).iter().filter(|l| l.contains("proto bird")).count(), 2, "{:#?}", all_routes(254));
        assert_eq!(ours().iter().filter(|l| l.starts_with("10.244.30.")).count(), 0, "{:#?}", ours());
        assert_eq!(nexthops().len(), 2, "{:#?}", nexthops());
        resync_writes_nothing(&mut r).await;
    });
}

/// Another writer replaces one of our routes through an object with a classic route; when the
/// node goes, its route stays and our object goes (nothing goes through it).
#[test]
fn a_classic_route_of_another_writer_over_ours_survives_its_node_going() {
    if skip_unless_root("a_classic_route_of_another_writer_over_ours_survives_its_node_going") {
        return;
    }
    let ns = Netns::new();
    ns.rt.block_on(async {
        let c = cluster();
        let mut r = programmed(&c).await;
        let mut mon = Monitor::start();
        ip("route replace 10.244.30.0/26 via 10.0.1.13 dev tunl0 onlink proto 17 metric 1024");
        for e in mon.drain(SETTLE).await {
            r.handle_event(&e);
        }
        let rep = r.apply().await;
        assert_eq!(rep.writes, 0, "never fight: {}", sum(&rep));
        let without_c: Vec<ClusterRoute> = c.iter().filter(|x| x.origin.node() != Some("node-c")).cloned().collect();
        r.set_desired(&without_c);
        let rep = r.apply().await;
        assert!(all_routes(254).contains(&"10.244.30.0/26 via 10.0.1.13 dev tunl0 proto 17 metric 1024 onlink".to_string()));
        assert_eq!((rep.deletes, rep.nexthop_deletes), (1, 1), "{rep:#?}");
    });
}

/// The tunnel device missing at the start, created later, then deleted and created again: the
/// object and the routes through it follow the link events.
#[test]
fn a_tunnel_device_created_late_or_recreated_gets_its_object_and_routes() {
    if skip_unless_root("a_tunnel_device_created_late_or_recreated_gets_its_object_and_routes") {
        return;
    }
    let ns = Netns::new();
    ns.rt.block_on(async {
        ip("link del tunl0");
        let c = cluster();
        let mut r = reconciler(nh_config(), None);
        r.set_desired(&c);
        let rep = r.apply().await;
        assert_eq!((rep.writes, rep.nexthop_writes, rep.error_count()), (7, 2, 2), "node-c's two routes wait for tunl0: {}", sum(&rep));
        let mut mon = Monitor::start();
        ip("link add tunl0 type veth peer name tunpeer");
        ip("link set tunpeer up");
        ip("link set tunl0 up");
        for e in mon.drain(SETTLE).await {
            r.handle_event(&e);
        }
        let rep = r.apply().await;
        assert_eq!(rep.error_count(), 0, "{rep:#?}");
        assert_eq!(nexthops().len(), 3);
        assert_eq!(ours().iter().filter(|l| l.contains("nhid")).count(), 7, "{:#?}", ours());
        resync_writes_nothing(&mut r).await;
        // link removed with routes through it, then back
        ip("link del tunl0");
        ip("link add tunl0 type veth peer name tunpeer");
        ip("link set tunpeer up");
        ip("link set tunl0 up");
        for e in mon.drain(SETTLE).await {
            r.handle_event(&e);
        }
        let rep = r.apply().await;
        assert_eq!(rep.error_count(), 0, "{rep:#?}");
        assert_eq!(ours().iter().filter(|l| l.contains("nhid")).count(), 7, "{:#?}", ours());
    });
}

/// Another writer's nexthop group holds an object of ours and its route goes through the
/// group: the kernel would delete the group, and its route, with our object, so the object
/// stays while the group holds it, and goes once the group is gone.
#[test]
fn an_object_of_ours_in_another_writers_group_is_never_deleted() {
    if skip_unless_root("an_object_of_ours_in_another_writers_group_is_never_deleted") {
        return;
    }
    let ns = Netns::new();
    ns.rt.block_on(async {
        let c = cluster();
        let mut r = programmed(&c).await;
        ip(&format!("nexthop add id 100 group {} proto 17", id(2)));
        ip("route add 192.168.50.0/24 nhid 100 proto 17");
        let before_group = nexthops().into_iter().find(|l| l.starts_with("id 100 ")).unwrap();
        let without_c: Vec<ClusterRoute> = c.iter().filter(|x| x.origin.node() != Some("node-c")).cloned().collect();
        r.set_desired(&without_c);
        let rep = r.apply().await;
        assert!(nexthops().contains(&before_group), "{:#?}", nexthops());
        assert_eq!(routes(false, 254).iter().filter(|l| l.starts_with("192.168.50.0/24 nhid 100")).count(), 1, "{:#?}", routes(false, 254));
        assert_eq!((rep.deletes, rep.nexthop_deletes), (2, 0), "{rep:#?}");
        ip("route del 192.168.50.0/24");
        ip("nexthop del id 100");
        r.request_resync();
        let rep = r.apply().await;
        assert_eq!((rep.nexthop_deletes, rep.error_count()), (1, 0), "{rep:#?}");
    });
}

/// A link that is up without a carrier from the start: the kernel refuses nexthop objects on
/// it (`ENETDOWN`, "Carrier for nexthop device is down"). Its node's routes go in classic
/// (`linkdown`, as classic routes stay on such a link) and that is no error: the object waits
/// for the carrier, later applies write nothing and report nothing (no retry every backoff step
/// that would page as RouteProgrammingErrors), and the objects on other links are written at
/// once. When the carrier comes, the routes move onto their object.
#[test]
fn a_link_without_carrier_waits_for_it_without_errors_or_holding_up_other_objects() {
    if skip_unless_root("a_link_without_carrier_waits_for_it_without_errors_or_holding_up_other_objects") {
        return;
    }
    let ns = Netns::new();
    ip("link set eth0p down");
    ns.rt.block_on(async {
        let cfg = DataplaneConfig { resync_interval: Duration::from_secs(1 << 12), ..nh_config() };
        let mut r = reconciler(cfg.clone(), None);
        let v4: Vec<ClusterRoute> = cluster().into_iter().filter(|r| r.dst.addr().is_ipv4()).collect();
        r.set_desired(&v4);
        let rep = r.apply().await;
        assert_eq!((rep.error_count(), rep.nexthop_write_errors, rep.writes, rep.nexthop_writes), (0, 0, 7, 1), "{rep:#?}");
        let classic = |l: &String| l.ends_with(" onlink linkdown") && !l.contains("nhid");
        assert_eq!(ours().iter().filter(|l| classic(l)).count(), 4, "{:#?}", ours());
        assert_eq!(ours().iter().filter(|l| l.contains("nhid")).count(), 2, "node-c's routes through its object: {:#?}", ours());
        assert_eq!(nexthops().len(), 1, "{:#?}", nexthops());
        assert_eq!(rep.nexthops_waiting_for_carrier, BTreeMap::from([("eth0".to_string(), 1)]));
        // A new node behind the tunnel right away: its object is written at once, no backoff.
        let mut more = v4.clone();
        more.push(to_node("10.244.40.0/26", RoutePath::Tunnel, "10.0.1.14", "node-d", POOL));
        r.set_desired(&more);
        let rep = r.apply().await;
        assert_eq!((rep.error_count(), rep.writes, rep.nexthop_writes), (0, 1, 1), "{rep:#?}");
        assert_eq!(nexthops().len(), 2, "{:#?}", nexthops());
        r.set_desired(&v4);
        let rep = r.apply().await;
        assert_eq!((rep.error_count(), rep.deletes, rep.nexthop_deletes), (0, 1, 1), "{rep:#?}");
        // Long after any backoff: nothing written, nothing reported.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        for _ in 0..3 {
            let rep = r.apply().await;
            assert_eq!((rep.error_count(), rep.writes, rep.nexthop_writes), (0, 0, 0), "{rep:#?}");
            assert_eq!(rep.nexthops_waiting_for_carrier, BTreeMap::from([("eth0".to_string(), 1)]));
        }
        drop(r);
        // With the event path running: the carrier comes and node-b's routes move onto its object.
        let r = reconciler(cfg, None);
        let Driver { commands: cmd_tx, reports: mut rep_rx, task: driver } = Driver::start(r, v4).await;
        ip("link set eth0p up");
        tokio::time::timeout(Duration::from_secs(10), async {
            while ours().iter().filter(|l| l.contains("nhid")).count() != 6 || nexthops().len() != 2 {
                rep_rx.recv().await.unwrap();
            }
        })
        .await
        .unwrap_or_else(|_| panic!("routes through both objects after the carrier came: {:#?} {:#?}", ours(), nexthops()));
        drop(cmd_tx);
        driver.await.unwrap();
    });
}
