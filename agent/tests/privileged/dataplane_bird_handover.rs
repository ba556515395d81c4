//! A real BIRD 2 takes over the IPIP class at routewarden's key (table 254, metric 1024).
//! BIRD's kernel protocol adds create-exclusive, so routewarden steps aside: each of its routes
//! is copied to metric 1025, then the original deleted, and the copy deleted once BIRD's route
//! is seen. The hand-over completes within a few BIRD scans (not at the grace period), and a
//! netlink monitor running throughout never sees a prefix without a route.

mod dataplane_support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use dataplane_support::{example_cluster, reconciler, route_map, with_proto, Driver, Monitor, Netns};
use routewarden::dataplane::{self, DataplaneCommand, DataplaneConfig, DataplaneEvent};
use routewarden::vocabulary::{PoolClass, Writer};
use routewarden_lab::bird::Bird;
use routewarden_lab::skip_unless_root;

const TEST: &str = "handover_to_bird_at_same_metric_steps_aside";

/// The IPv4 IPIP-class prefixes of [`example_cluster`]: what BIRD takes over.
const IPIP: [&str; 3] = ["10.244.10.0/26", "10.244.10.7/32", "10.244.30.0/26"];

#[test]
fn handover_to_bird_at_same_metric_steps_aside() {
    if skip_unless_root(TEST) {
        return;
    }
    if !routewarden_lab::bird::available() {
        routewarden_lab::skip(TEST, format_args!("BIRD 2 is not installed (apt-get install bird2)"));
        return;
    }
    let dir = std::env::temp_dir().join(format!("rw-bird-handover-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = "router id 10.0.0.11;\n\
         protocol device { scan time 10; }\n\
         protocol kernel { ipv4 { import none; export all; }; scan time 1; metric 1024; learn off; }\n\
         protocol static { ipv4;\n\
           route 10.244.30.0/26 via 10.0.1.13%'tunl0' onlink;\n\
           route 10.244.10.7/32 via 10.0.1.13%'tunl0' onlink;\n\
           route 10.244.10.0/26 blackhole;\n\
         }\n";
    let ns = Netns::new();
    ns.rt.block_on(async {
        // IPv4 only for the handed-over class (BIRD here exports IPv4); the no-encap routes stay.
        let cluster: Vec<_> = example_cluster().into_iter().filter(|c| c.class == PoolClass::NoEncap || c.dst.addr().is_ipv4()).collect();
        let cfg = DataplaneConfig { handover_grace: Duration::from_secs(20), ..DataplaneConfig::default() };
        let Driver { commands: cmd_tx, reports: mut rep_rx, task: driver } = Driver::start(reconciler(cfg, None), cluster.clone()).await;
        tokio::time::timeout(Duration::from_secs(5), async {
            while with_proto(254, "80").len() != cluster.len() {
                rep_rx.recv().await.unwrap();
            }
        })
        .await
        .expect("initial programming");
        while rep_rx.try_recv().is_ok() {}
        let mut mon = Monitor::start();

        let no_encap: Vec<_> = cluster.iter().filter(|c| c.class == PoolClass::NoEncap).cloned().collect();
        let handover = dataplane::Handover { class: PoolClass::Ipip, to: Writer::Bird, protocol: 12, table: 254, metric: Some(1024) };
        let started = Instant::now();
        cmd_tx.send(DataplaneCommand::SetDesired { routes: route_map(&no_encap), handovers: vec![handover] }).await.unwrap();
        // In this thread's namespace (the test's).
        let _bird = Bird::start(None, &dir, "bird", conf).expect("start bird");
        let mut outcomes = Vec::new();
        let waited = tokio::time::timeout(Duration::from_secs(25), async {
            while outcomes.len() < IPIP.len() {
                outcomes.extend(rep_rx.recv().await.expect("reports").handovers);
            }
            started.elapsed()
        })
        .await
        .expect("hand-over finished");
        eprintln!("{TEST}: hand-over of {} prefixes finished after {waited:?}: {outcomes:?}", IPIP.len());
        assert!(outcomes.iter().all(|h| h.end == dataplane::HandoverEnd::Seen), "{outcomes:#?}");
        assert!(waited < Duration::from_secs(5), "{TEST}: took {waited:?} (grace 20 s)");

        // BIRD's routes are in at metric 1024; none of ours for the class remains.
        let bird = with_proto(254, "bird");
        for dst in IPIP {
            let plain = dst.trim_end_matches("/32");
            assert!(bird.iter().any(|l| l.contains(&format!("{plain} ")) && l.contains(" metric 1024")), "{dst}: BIRD's route: {bird:?}");
        }
        let ours = with_proto(254, "80");
        assert_eq!(
            ours,
            [
                "10.244.20.0/26 via 10.0.0.12 dev eth0 proto 80 metric 1024 onlink",
                "fd00:10:244:20::/122 via fd00::12 dev eth0 proto 80 metric 1024 onlink pref medium",
            ],
            "only the no-encap routes stay"
        );

        // Replay the monitor: every IPIP prefix had our route (metric 1024) when it started;
        // it must never have been without a route.
        let events = mon.drain(Duration::from_millis(300)).await;
        let mut present: BTreeMap<String, BTreeSet<(u32, u8)>> = IPIP.iter().map(|d| ((*d).to_string(), BTreeSet::from([(1024, 80)]))).collect();
        let mut trace = Vec::new();
        for e in &events {
            let (added, route) = match e {
                DataplaneEvent::RouteAdded { route, .. } => (true, route),
                DataplaneEvent::RouteRemoved { route, .. } => (false, route),
                _ => continue,
            };
            let dst = route.key.dst.to_string();
            let Some(set) = present.get_mut(&dst) else { continue };
            let id = (route.key.metric, route.protocol);
            if added {
                set.insert(id);
            } else {
                set.remove(&id);
            }
            trace.push(format!("{} {dst} metric {} proto {}", if added { '+' } else { '-' }, id.0, id.1));
            assert!(!set.is_empty(), "{TEST}: {dst} had no route: {trace:#?}");
        }
        for dst in IPIP {
            assert_eq!(present[dst], BTreeSet::from([(1024, 12)]), "{dst}: {trace:#?}");
        }
        eprintln!("{TEST}: monitor trace {trace:?}");
        drop(cmd_tx);
        driver.await.unwrap();
    });
    let _ = std::fs::remove_dir_all(&dir);
    drop(ns);
}
