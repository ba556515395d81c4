//! The fault matrix, as Felix's route-table tests re-run every behaviour under one-shot
//! netlink faults (`felix/routetable/route_table_test.go`, its `failureScenarios`): each
//! reconciler scenario below runs once per injected fault, and after every apply the
//! invariants hold — no foreign route is touched, no route that stays desired and was in the
//! kernel goes missing — and, the fault over, the kernel converges to exactly what the same
//! scenario reaches without a fault.

use std::collections::BTreeMap;
use std::time::Duration;

use nix::errno::Errno;

use crate::dataplane::fake::{observed, FakeClock, FakeNetlink};
use crate::dataplane::kernel::route::{ObservedRoute, RouteKey, RouteKind};
use crate::dataplane::kernel::watcher::DataplaneEvent;
use crate::dataplane::reconciler::tests::cr;
use crate::dataplane::reconciler::Reconciler;
use crate::dataplane::settings::DataplaneConfig;
use crate::routes::ClusterRoute;
use crate::vocabulary::RoutePath;

const ETH0: u32 = 2;
const TUNL0: u32 = 3;
const POOLS: &[&str] = &["10.244.0.0/16", "fd00:10:244::/48"];

/// One fault, injected once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    None,
    /// The route dump comes back marked `NLM_F_DUMP_INTR`.
    DumpInterrupted,
    /// The route dump fails with `EINTR`.
    DumpEintr,
    /// The next three writes of a batch fail with `ENOBUFS`.
    BatchEnobufs,
    /// The next write fails with `ENOMEM`.
    Enomem,
    /// The netlink socket closes after one op of the next batch (the rest fail; the next call
    /// has a new connection).
    SocketClosedMidBatch,
    /// The route watcher's socket overran (`ENOBUFS` on the multicast socket): the watcher
    /// reports an overrun, and a change it did not see (our route deleted by hand) is only
    /// found by the resync that follows.
    WatcherEnobufs,
    /// `eth0` vanishes between plan and write (its routes go with it), and comes back.
    LinkVanishes,
    /// Another writer's route appears at one of our keys just before our create.
    ForeignAtOurKey,
}

const FAULTS: [Fault; 9] = [
    Fault::None,
    Fault::DumpInterrupted,
    Fault::DumpEintr,
    Fault::BatchEnobufs,
    Fault::Enomem,
    Fault::SocketClosedMidBatch,
    Fault::WatcherEnobufs,
    Fault::LinkVanishes,
    Fault::ForeignAtOurKey,
];

/// The desired routes before the scenario's change.
fn before() -> Vec<ClusterRoute> {
    vec![
        cr("10.244.10.0/26", RoutePath::Blackhole, None),
        cr("10.244.20.0/26", RoutePath::HostNic, Some("10.0.0.12")),
        cr("10.244.30.0/26", RoutePath::Tunnel, Some("10.0.1.13")),
        cr("10.244.40.0/26", RoutePath::Tunnel, Some("10.0.1.14")),
        cr("fd00:10:244:20::/122", RoutePath::HostNic, Some("fd00::12")),
    ]
}

/// After: a next hop changed (node moved), a block released, a block added.
fn after() -> Vec<ClusterRoute> {
    vec![
        cr("10.244.10.0/26", RoutePath::Blackhole, None),
        cr("10.244.20.0/26", RoutePath::HostNic, Some("10.0.0.22")),
        cr("10.244.30.0/26", RoutePath::Tunnel, Some("10.0.1.13")),
        cr("10.244.50.0/26", RoutePath::HostNic, Some("10.0.0.15")),
        cr("fd00:10:244:20::/122", RoutePath::HostNic, Some("fd00::12")),
    ]
}

/// The scenarios: what the kernel holds when the fault comes, and the desired set then.
#[derive(Clone, Copy, Debug)]
enum Scenario {
    /// A cold start on a kernel with foreign routes only.
    ColdStart,
    /// A running agent whose desired set changes (replace, delete, create).
    Change,
    /// A restart: a new reconciler over the converged kernel, the same desired set.
    Restart,
}

/// A foreign route (BIRD's at metric 0, others at 1024).
fn foreign(dst: &str, proto: u8, gateway: Option<&str>, oif: Option<u32>) -> ObservedRoute {
    observed(dst, if proto == 12 { 0 } else { 1024 }, proto, gateway, oif, RouteKind::Unicast)
}

/// Foreign routes every scenario starts with: outside the pools, BIRD's in a pool at another
/// metric, a static one in a pool at our metric (not ours: another protocol).
fn foreigners() -> Vec<ObservedRoute> {
    vec![
        foreign("192.168.77.0/24", 4, Some("10.0.0.1"), Some(ETH0)),
        foreign("10.244.60.0/26", 12, Some("10.0.0.16"), Some(ETH0)),
        foreign("10.244.70.0/26", 4, Some("10.0.0.17"), Some(ETH0)),
    ]
}

fn new_reconciler(nl: &FakeNetlink, clock: &FakeClock) -> Reconciler<FakeNetlink, FakeClock> {
    let cfg = DataplaneConfig::default();
    let policy = cfg.policy_owning(POOLS);
    let mut r = Reconciler::new(cfg, policy, nl.clone(), clock.clone());
    r.set_datastore_synced(true);
    r
}

fn inject(nl: &FakeNetlink, fault: Fault) {
    let mut s = nl.state();
    match fault {
        Fault::None | Fault::WatcherEnobufs | Fault::ForeignAtOurKey => {}
        Fault::DumpInterrupted => s.interrupt_dumps = 1,
        Fault::DumpEintr => s.dump_errno_once = Some(Errno::EINTR),
        Fault::BatchEnobufs => s.fail_next_writes = Some((Errno::ENOBUFS, 3)),
        Fault::Enomem => s.fail_next_writes = Some((Errno::ENOMEM, 1)),
        Fault::SocketClosedMidBatch => s.connection_lost_after = Some(1),
        Fault::LinkVanishes => s.vanish_link_on_write = Some(ETH0),
    }
}

/// Run `scenario` under `fault`; check the invariants after every apply; return the kernel
/// once converged.
async fn run(scenario: Scenario, fault: Fault) -> BTreeMap<RouteKey, ObservedRoute> {
    let nl = FakeNetlink::with_links(&[(1, "lo"), (ETH0, "eth0"), (TUNL0, "tunl0")]);
    let clock = FakeClock::new();
    let others = foreigners();
    for f in &others {
        nl.insert(f.clone());
    }
    let mut r = new_reconciler(&nl, &clock);
    let desired = match scenario {
        Scenario::ColdStart => before(),
        Scenario::Change | Scenario::Restart => {
            r.set_desired(&before());
            r.apply().await;
            if matches!(scenario, Scenario::Restart) {
                r = new_reconciler(&nl, &clock);
            }
            if matches!(scenario, Scenario::Change) {
                after()
            } else {
                before()
            }
        }
    };
    // What must never go missing: routes of ours in the kernel now whose destination stays
    // desired (their attributes may change: a replace is atomic).
    let kept: Vec<RouteKey> = nl.state().routes.keys().filter(|k| desired.iter().any(|d| d.dst == k.dst)).copied().collect();
    inject(&nl, fault);
    let mut foreign_at_ours: Option<ObservedRoute> = None;
    if fault == Fault::ForeignAtOurKey {
        // The key of a route we are about to create: 10.244.40.0/26 (cold start) or the new
        // 10.244.50.0/26 (change); a restart creates nothing, so the one it would recreate.
        let dst = match scenario {
            Scenario::Change => "10.244.50.0/26",
            Scenario::ColdStart | Scenario::Restart => "10.244.40.0/26",
        };
        let f = ObservedRoute { key: RouteKey::new(254, dst.parse().unwrap(), 0, 1024), ..foreign(dst, 4, Some("10.0.0.99"), Some(ETH0)) };
        if matches!(scenario, Scenario::Restart) {
            // Ours was there: another writer replaced it while we were down.
            nl.state().routes.insert(f.key, f.clone());
        } else {
            nl.insert(f.clone());
        }
        foreign_at_ours = Some(f);
    }
    r.set_desired(&desired);
    for step in 0..40 {
        if fault == Fault::WatcherEnobufs && step == 1 {
            // A change the watcher did not report: our route removed by hand.
            let gone = *nl.state().routes.keys().find(|k| k.dst.to_string() == "10.244.30.0/26").unwrap();
            nl.state().routes.remove(&gone);
            r.handle_event(&DataplaneEvent::Overrun);
        }
        r.apply().await;
        let kernel = nl.state().routes.clone();
        let vanished = !nl.state().vanished.is_empty();
        for f in others.iter().chain(foreign_at_ours.as_ref()) {
            // While eth0 is gone, the kernel took every route through it, foreign ones too.
            if vanished && f.oif == Some(ETH0) {
                continue;
            }
            assert_eq!(kernel.get(&f.key), Some(f), "{scenario:?} under {fault:?}, step {step}: foreign route {} touched", f.key);
        }
        if !vanished {
            for k in &kept {
                let hand_removed = fault == Fault::WatcherEnobufs && step == 1 && k.dst.to_string() == "10.244.30.0/26";
                assert!(hand_removed || kernel.keys().any(|have| have.dst == k.dst), "{scenario:?} under {fault:?}, step {step}: {k} went missing");
            }
        }
        if vanished && step >= 1 {
            // The link was gone for a while; it comes back with its events.
            let link = nl.state().vanished.pop().unwrap();
            r.handle_event(&DataplaneEvent::LinkRemoved { index: link.index, name: link.name.clone() });
            nl.state().links.insert(link.index, link.clone());
            // Their writers put the foreign routes through it back.
            for f in others.iter().filter(|f| f.oif == Some(link.index)) {
                nl.insert(f.clone());
            }
            r.handle_event(&DataplaneEvent::LinkUp { index: link.index, name: link.name.clone() });
        }
        clock.advance(Duration::from_secs(10));
    }
    let kernel = nl.state().routes.clone();
    kernel
}

/// Every scenario under every fault converges to what it reaches without one (but for the key
/// another writer took, which stays theirs), and the invariants hold after every apply.
#[tokio::test]
async fn every_scenario_under_every_one_shot_fault() {
    for scenario in [Scenario::ColdStart, Scenario::Change, Scenario::Restart] {
        let reference = run(scenario, Fault::None).await;
        assert_eq!(reference.values().filter(|r| r.protocol == 80).count(), 5, "{scenario:?}");
        for fault in FAULTS {
            let got = run(scenario, fault).await;
            let mut want = reference.clone();
            if fault == Fault::ForeignAtOurKey {
                let taken: Vec<RouteKey> = got.values().filter(|r| r.gateway == Some("10.0.0.99".parse().unwrap())).map(|r| r.key).collect();
                assert_eq!(taken.len(), 1, "{scenario:?}: the foreign route at our key is kept");
                want.insert(taken[0], got[&taken[0]].clone());
            }
            assert_eq!(got, want, "{scenario:?} under {fault:?}: converged to something else");
        }
    }
}
