//! Deletions held: the mass-deletion breaker and frozen ground.

use super::*;

/// An input emptied or truncated (or an API server answering a re-list with
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
