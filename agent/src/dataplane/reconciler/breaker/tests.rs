//! Unit tests of `breaker.rs`.

use super::*;

fn keys(n: u8) -> Vec<RouteKey> {
    (0..n).map(|i| RouteKey::new(254, format!("10.244.{i}.0/26").parse().unwrap(), 0, 1024)).collect()
}

#[test]
fn at_or_under_the_threshold_everything_passes() {
    let now = Instant::now();
    let mut b = MassDeletionBreaker::new(50, Duration::from_secs(30));
    let v = b.check(keys(5), &[], 10, now);
    assert_eq!((v.pass.len(), v.held.len(), v.wanted), (5, 0, 5));
    assert_eq!(b.next_release(), None);
}

#[test]
fn over_the_threshold_deletes_wait_for_the_settle_period() {
    let now = Instant::now();
    let settle = Duration::from_secs(30);
    let mut b = MassDeletionBreaker::new(50, settle);
    let v = b.check(keys(6), &[], 10, now);
    assert_eq!((v.pass.len(), v.held.len(), v.wanted), (0, 6, 6));
    assert_eq!(b.next_release(), Some(now + settle));
    assert_eq!(b.held().count(), 6);
    let v = b.check(keys(6), &[], 10, now + Duration::from_secs(29));
    assert_eq!(v.held.len(), 6);
    let v = b.check(keys(6), &[], 10, now + settle);
    assert_eq!((v.pass.len(), v.held.len()), (6, 0));
}

#[test]
fn a_delete_no_longer_wanted_starts_over() {
    let now = Instant::now();
    let settle = Duration::from_secs(30);
    let mut b = MassDeletionBreaker::new(50, settle);
    b.check(keys(6), &[], 10, now);
    // Five of the six are wanted later (still over half of 8): the sixth's hold is gone.
    b.check(keys(5), &[], 8, now + Duration::from_secs(10));
    assert_eq!(b.held().count(), 5);
    let v = b.check(keys(6), &[], 10, now + settle);
    assert_eq!((v.pass.len(), v.held.len()), (5, 1), "{v:?}");
    b.forget(&keys(6)[5]);
    assert_eq!(b.next_release(), Some(now + settle));
}

#[test]
fn a_held_delete_deferred_for_another_reason_keeps_its_hold_and_start_time() {
    let now = Instant::now();
    let settle = Duration::from_secs(30);
    let mut b = MassDeletionBreaker::new(50, settle);
    b.check(keys(6), &[], 10, now);
    // The datastore goes unsynced at 10 s: every delete is deferred before the breaker.
    let v = b.check(Vec::new(), &keys(6), 10, now + Duration::from_secs(10));
    assert_eq!((v.pass.len(), v.held.len(), v.paused), (0, 0, 6), "{v:?}");
    assert_eq!(b.held().count(), 6, "paused, not forgotten");
    assert_eq!(b.next_release(), None, "a paused hold has no release time: no wake-up loop while unsynced");
    // Synced again at 20 s: still held, from the first time (released at 30 s, not 50 s).
    let v = b.check(keys(6), &[], 10, now + Duration::from_secs(20));
    assert_eq!((v.pass.len(), v.held.len(), v.paused), (0, 6, 0), "{v:?}");
    assert_eq!(b.next_release(), Some(now + settle));
    let v = b.check(keys(6), &[], 10, now + settle);
    assert_eq!((v.pass.len(), v.held.len()), (6, 0));
}

#[test]
fn a_paused_hold_whose_route_is_wanted_again_is_dropped() {
    let now = Instant::now();
    let mut b = MassDeletionBreaker::new(50, Duration::from_secs(30));
    b.check(keys(6), &[], 10, now);
    b.check(Vec::new(), &keys(6), 10, now + Duration::from_secs(10));
    // Back in the desired set: neither wanted gone nor deferred in this apply.
    let v = b.check(Vec::new(), &[], 10, now + Duration::from_secs(40));
    assert_eq!((v.pass.len(), v.held.len(), v.paused), (0, 0, 0), "{v:?}");
    assert_eq!(b.held().count(), 0);
    // Wanted gone again later: a fresh hold, not a release on the old start time.
    let v = b.check(keys(6), &[], 10, now + Duration::from_secs(50));
    assert_eq!((v.pass.len(), v.held.len()), (0, 6), "{v:?}");
}

#[test]
fn one_hundred_percent_turns_the_breaker_off() {
    let mut b = MassDeletionBreaker::new(100, Duration::from_secs(30));
    let v = b.check(keys(10), &[], 10, Instant::now());
    assert_eq!((v.pass.len(), v.held.len()), (10, 0));
}
