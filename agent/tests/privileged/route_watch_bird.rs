//! A real BIRD 2 as the second writer: its static protocol exports 10.244.20.0/26 to the
//! kernel (proto bird, metric 1024, kernel scan every second) while routewarden (proto 80)
//! overwrites the same route. BIRD 2.0.12 does not overwrite a foreign route at the same
//! metric (its add fails with EEXIST) but re-installs its route within a scan once the
//! foreign one is deleted, so the fight is: routewarden replaces, routewarden deletes, BIRD
//! re-adds, and again. The watch reports a conflict naming `self` and `bird` (BIRD's process
//! name resolved from its netlink socket), the flapping gauge rises to 1 (one prefix) and
//! returns to 0 once the fight stops. Runs with the best backend this kernel has (socket
//! filter here).

mod route_watch_common;

use std::time::{Duration, Instant};

use route_watch_common::{config, ifindex, lab, Harness, SelfWriter, EVENT_DEADLINE};
use routewarden::bpf::route_watch::{RouteWatch, RouteWatchEvent};
use routewarden_lab::bird::Bird;

const TEST: &str = "bird_and_routewarden_fight_is_a_conflict";

#[test]
fn bird_and_routewarden_fight_is_a_conflict() {
    if routewarden_lab::skip_unless_root(TEST) {
        return;
    }
    if !routewarden_lab::bird::available() {
        routewarden_lab::skip(TEST, format_args!("BIRD 2 is not installed (apt-get install bird2)"));
        return;
    }
    let Some(object) = routewarden::bpf::embedded_object() else {
        routewarden_lab::skip(TEST, format_args!("built without the BPF object; `cargo xtask test` embeds it"));
        return;
    };
    let ns = lab();
    let dir = std::env::temp_dir().join(format!("rw-bird-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = "router id 10.0.0.11;\n\
         protocol device { scan time 10; }\n\
         protocol kernel { ipv4 { import none; export all; }; scan time 1; metric 1024; learn off; }\n\
         protocol static { ipv4; route 10.244.20.0/26 via 10.0.0.13; }\n";
    let watch = RouteWatch::start(object, &config()).expect("route watch");
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
        let mut h = Harness::new(watch);
        // In this thread's namespace (the lab's).
        let bird = Bird::start(None, &dir, "bird", conf).expect("start bird");
        let me = SelfWriter::new();
        // Its socket is new: tell the watch it is this process's (socket-filter backend).
        h.watch.refresh_self_ports().expect("self ports");
        let oif = ifindex("veth0");
        let bird_route = || route_watch_common::sh("ip", &["route", "show", "10.244.20.0/26", "proto", "bird"]).contains("10.244.20.0/26");
        let conflicts_counted = |h: &Harness| h.watch.counters().unwrap().conflicts.iter().flatten().flatten().sum::<u64>();
        let (dst, gw) = ("10.244.20.0".parse().unwrap(), "10.0.0.12".parse().unwrap());
        let mut t0 = Instant::now();
        let mut counted = false;
        for _ in 0..3 {
            let wait = Instant::now();
            while !bird_route() {
                assert!(wait.elapsed() < Duration::from_secs(5), "{TEST}: BIRD did not (re-)install its route");
                h.pump(Duration::from_millis(100)).await;
            }
            t0 = Instant::now();
            me.replace_v4(dst, 26, gw, oif).await.unwrap();
            // The overwrite is a conflict when BIRD's route is younger than the window; the
            // kernel counts it during the write. Otherwise take our route back (through the
            // same socket: no conflict of our own) and overwrite BIRD's next install.
            if conflicts_counted(&h) > 0 {
                counted = true;
                break;
            }
            me.delete_v4(dst, 26).await.unwrap();
        }
        assert!(counted, "{TEST}: no conflict counted in 3 overwrites of BIRD's route: {:?}", h.events);
        let arrived = h.pump_until(EVENT_DEADLINE, |h| !h.conflicts().is_empty()).await;
        assert!(arrived.is_some(), "{TEST}: the counted conflict did not arrive in {EVENT_DEADLINE:?}: {:?}", h.events);
        let latency = h.events.iter().find(|(_, e)| matches!(e, RouteWatchEvent::Conflict { .. })).map(|(t, _)| t.duration_since(t0)).unwrap();
        let conflict = h.conflicts().first().copied().cloned().unwrap();
        let RouteWatchEvent::Conflict { route, previous, .. } = &conflict else { unreachable!() };
        let mut classes = [route.writer.class, previous.class];
        classes.sort_unstable();
        assert_eq!(classes, ["bird", "self"], "{TEST}: {conflict:?}");
        let bird_writer = if route.writer.class == "bird" { &route.writer } else { previous };
        if bird_writer.netlink_port.is_some() {
            assert_eq!(bird_writer.comm.as_deref(), Some("bird"), "{TEST}: BIRD's port resolved to its process: {bird_writer:?}");
        } else {
            assert_eq!(bird_writer.comm.as_deref(), Some("bird"));
        }
        eprintln!("{TEST}: conflict {latency:?} after the overwrite: {conflict}");
        drop(bird);
        let t1 = Instant::now();
        while h.metrics.flapping_prefixes.get() != 0 && t1.elapsed() < Duration::from_secs(8) {
            h.pump(Duration::from_millis(200)).await;
        }
        // One prefix is fought over: the gauge rose to exactly 1, and fell back to 0.
        assert_eq!(h.peak_flapping, 1, "{TEST}: peak of the flapping gauge");
        assert_eq!(h.metrics.flapping_prefixes.get(), 0, "{TEST}: gauge back to 0 after BIRD stopped");
    });
    let _ = std::fs::remove_dir_all(&dir);
    drop(ns);
}
