//! Route programming onto a REAL IPIP `tunl0`, in a network namespace the test
//! creates. With the `ipip` module loaded every new network namespace gets its own fallback
//! `tunl0` (type ipip); this host's kernel has no ipip, so the test runs in the QEMU lane of
//! `cargo xtask test` and prints `SKIPPED` here. `dataplane_netns.rs` covers the same
//! behaviour with a veth stand-in named `tunl0`.

mod dataplane_support;

use std::process::Command;
use std::time::Duration;

use dataplane_support::{example_cluster, example_lines, ip, lines_stay, reconciler, routes, wait_for_lines, with_proto, Driver, Monitor, Netns, DEADLINE};
use routewarden::dataplane::DataplaneConfig;
use routewarden_lab::{skip_unless_root, NetNsGuard};

const SETTLE: Duration = Duration::from_millis(300);

/// Whether the current namespace has a `tunl0` that is a real IPIP device (`ip -d link show`
/// prints `link/ipip` and the `ipip ...` details line).
fn real_ipip_tunl0() -> bool {
    let Ok(out) = Command::new("ip").args(["-d", "link", "show", "tunl0"]).output() else { return false };
    out.status.success() && String::from_utf8_lossy(&out.stdout).lines().any(|l| l.trim_start().starts_with("ipip "))
}

/// A fresh namespace with its own real `tunl0` (address 10.244.10.1/32, up) and the same
/// `eth0` stand-in as [`Netns::new`]; `None` (after printing `SKIPPED`) without ipip.
fn netns_with_real_tunl0(test: &str) -> Option<Netns> {
    if skip_unless_root(test) {
        return None;
    }
    let guard = NetNsGuard::new().expect("create netns");
    if !real_ipip_tunl0() {
        routewarden_lab::skip(test, format_args!("no ipip tunl0 on this kernel (covered by the QEMU lane)"));
        return None;
    }
    for cmd in [
        "link add eth0 type veth peer name eth0p",
        "addr add 10.0.0.11/24 dev eth0",
        "addr add fd00::11/64 dev eth0 nodad",
        "link set eth0p up",
        "link set eth0 up",
        "addr add 10.244.10.1/32 dev tunl0",
        "link set tunl0 up",
    ] {
        ip(cmd);
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    Some(Netns { guard, rt })
}

/// Exact routes on the real tunnel device, zero writes on a no-change resync and on restart
/// (S02, S04), and tunl0 down/up re-installs the tunnel routes through the event path (S11;
/// the time it took is printed, the latency target is the benchmarks').
#[test]
fn real_tunl0_exact_routes_zero_write_resync_and_link_flap() {
    let Some(ns) = netns_with_real_tunl0("real_tunl0_exact_routes_zero_write_resync_and_link_flap") else { return };
    ns.rt.block_on(async {
        let mut r = reconciler(DataplaneConfig::default(), None);
        r.set_desired(&example_cluster());
        let rep = r.apply().await;
        assert_eq!((rep.writes, rep.deletes, rep.error_count()), (6, 0, 0), "{rep:#?}");
        assert_eq!(with_proto(254, "80"), example_lines());
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
        // The kernel resolves the tunnel routes through the ipip device.
        let get = ip("route get 10.244.30.5");
        assert!(get.contains("via 10.0.1.13 dev tunl0"), "{get}");

        // No-change resyncs and a restart write nothing: zero route notifications.
        let mut mon = Monitor::start();
        mon.drain(SETTLE).await;
        for _ in 0..3 {
            r.request_resync();
            let rep = r.apply().await;
            assert!(rep.resynced);
            assert_eq!((rep.writes, rep.deletes, rep.error_count()), (0, 0, 0), "{rep:#?}");
        }
        drop(r);
        let mut r = reconciler(DataplaneConfig::default(), None);
        r.set_desired(&example_cluster());
        let rep = r.apply().await;
        assert_eq!((rep.writes, rep.deletes, rep.error_count()), (0, 0, 0), "{rep:#?}");
        assert_eq!(mon.route_events(SETTLE).await, Vec::<String>::new());
        drop(r);
        drop(mon);

        // tunl0 down: the kernel flushes the two routes via tunl0 (IPv4: no notification);
        // up again: the event path re-installs them, the periodic resync being far away.
        let cfg = DataplaneConfig { resync_interval: Duration::from_secs(1 << 12), ..DataplaneConfig::default() };
        let r = reconciler(cfg, None);
        let Driver { commands: cmd_tx, reports: mut rep_rx, task: driver } = Driver::start(r, example_cluster()).await;
        tokio::time::timeout(DEADLINE, async {
            while with_proto(254, "80") != example_lines() {
                rep_rx.recv().await.unwrap();
            }
        })
        .await
        .expect("programmed state with the driver");

        ip("link set tunl0 down");
        let down: Vec<String> = example_lines().into_iter().filter(|l| !l.contains(" dev tunl0 ")).collect();
        assert_eq!(down.len(), 4);
        lines_stay("routes via tunl0 are flushed while it is down", 254, "80", &down, SETTLE).await;
        ip("link set tunl0 up");
        let took = wait_for_lines("routes via tunl0 re-installed after link up", 254, "80", &example_lines()).await;
        eprintln!("real tunl0: routes via tunl0 re-installed {took:?} after link up");
        drop(cmd_tx);
        driver.await.unwrap();
    });
}

/// `--nexthop-objects` on the real ipip `tunl0`: node-c's blocks go through one
/// nexthop object `via 10.0.1.13 dev tunl0 onlink`; node-c's address change and then its move
/// into this node's subnet (CrossSubnet: the host NIC) are one nexthop replace each, and the
/// kernel resolves every block through the tunnel, then through eth0.
#[test]
fn real_tunl0_nexthop_objects_node_move_and_crosssubnet_switch() {
    use routewarden::routes::ClusterRoute;
    use routewarden::vocabulary::{PoolClass, RoutePath};
    use routewarden_lab::cluster_routes;
    let Some(ns) = netns_with_real_tunl0("real_tunl0_nexthop_objects_node_move_and_crosssubnet_switch") else { return };
    let to_c = |gw: &str, path: RoutePath| -> Vec<ClusterRoute> {
        ["10.244.30.0/26", "10.244.30.64/26", "10.244.10.9/32"]
            .iter()
            .map(|dst| cluster_routes::route(dst, path, Some(gw), PoolClass::Ipip, "default-ipv4-ippool", cluster_routes::remote_block(dst, "node-c")))
            .collect()
    };
    let via = |dst: &str| {
        let get = ip(&format!("route get {dst}"));
        let w: Vec<&str> = get.split_whitespace().collect();
        let after = |k: &str| w.iter().position(|x| *x == k).and_then(|i| w.get(i + 1)).copied().unwrap_or("-").to_string();
        format!("via {} dev {}", after("via"), after("dev"))
    };
    ns.rt.block_on(async {
        let mut r = reconciler(DataplaneConfig { nexthop_objects: true, ..DataplaneConfig::default() }, None);
        r.set_desired(&to_c("10.0.1.13", RoutePath::Tunnel));
        let rep = r.apply().await;
        assert_eq!((rep.writes, rep.nexthop_writes, rep.error_count()), (3, 1, 0), "{rep:#?}");
        let objects = ip("nexthop show");
        assert!(objects.contains("via 10.0.1.13 dev tunl0 scope link proto 80 onlink"), "{objects}");
        for dst in ["10.244.30.5", "10.244.30.70", "10.244.10.9"] {
            assert_eq!(via(dst), "via 10.0.1.13 dev tunl0", "{dst}");
        }
        r.set_desired(&to_c("10.0.1.23", RoutePath::Tunnel));
        let rep = r.apply().await;
        assert_eq!((rep.writes, rep.nexthop_writes, rep.error_count()), (0, 1, 0), "{rep:#?}");
        for dst in ["10.244.30.5", "10.244.30.70", "10.244.10.9"] {
            assert_eq!(via(dst), "via 10.0.1.23 dev tunl0", "{dst}");
        }
        r.set_desired(&to_c("10.0.0.23", RoutePath::HostNic));
        let rep = r.apply().await;
        assert_eq!((rep.writes, rep.nexthop_writes, rep.error_count()), (0, 1, 0), "{rep:#?}");
        for dst in ["10.244.30.5", "10.244.30.70", "10.244.10.9"] {
            assert_eq!(via(dst), "via 10.0.0.23 dev eth0", "{dst}");
        }
        r.request_resync();
        let rep = r.apply().await;
        assert_eq!((rep.writes, rep.nexthop_writes, rep.deletes), (0, 0, 0), "{rep:#?}");
    });
}
