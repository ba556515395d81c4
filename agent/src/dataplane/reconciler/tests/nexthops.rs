//! Nexthop objects: ids taken by others, kernels without them, a node's move.

use super::*;

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
