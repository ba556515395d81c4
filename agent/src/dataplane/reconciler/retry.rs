//! When the reconciler tries again: [`Retries`], the per-key exponential backoff after a failed
//! write or delete, and [`ResyncTimer`], the full-resync schedule (every resync interval, sooner
//! on request, with backoff after a failed resync), as Felix's routetable retries failed keys
//! and resyncs on a timer and after failures (`felix/routetable/route_table.go`).
//!
//! Every timer here goes through [`later`], so "never" (a huge interval) does not overflow
//! [`Instant`].

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::dataplane::kernel::route::RouteKey;

/// First retry delay after a failed write or resync; doubles per failure.
const BACKOFF_BASE: Duration = Duration::from_millis(200);
/// Longest retry delay.
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// About a year (2^25 s): "never" for timers, without overflowing `Instant`.
const FAR_FUTURE: Duration = Duration::from_secs(1 << 25);

/// `now + d`, saturating at [`FAR_FUTURE`] instead of overflowing `Instant`.
pub(super) fn later(now: Instant, d: Duration) -> Instant {
    now.checked_add(d).unwrap_or_else(|| now + FAR_FUTURE)
}

/// The delay before the next try after `failures` consecutive failures (1 or more): 200 ms,
/// doubling per failure, at most 30 s.
pub(super) fn backoff(failures: u32) -> Duration {
    let shift = failures.saturating_sub(1).min(16);
    BACKOFF_BASE.saturating_mul(1 << shift).min(BACKOFF_MAX)
}

#[derive(Clone, Copy, Debug)]
struct Retry {
    failures: u32,
    not_before: Instant,
}

/// Keys whose last write or delete failed: how often in a row, and when to try again.
#[derive(Debug, Default)]
pub(super) struct Retries {
    by_key: HashMap<RouteKey, Retry>,
}

impl Retries {
    /// One more failure at `key`: the next try waits [`backoff`] of the failure count from `now`.
    pub(super) fn fail(&mut self, key: RouteKey, now: Instant) {
        let failures = self.failures(&key) + 1;
        self.by_key.insert(key, Retry { failures, not_before: now + backoff(failures) });
    }

    /// One more failure at `key`, with the next try not before `not_before` (a key another
    /// writer's route holds waits for the resync interval, not the backoff).
    pub(super) fn fail_until(&mut self, key: RouteKey, not_before: Instant) {
        let failures = self.failures(&key) + 1;
        self.by_key.insert(key, Retry { failures, not_before });
    }

    /// Whether no key is waiting for a retry (every key converged or never failed).
    pub(super) fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// `key` converged, changed or was freed: its next try may go at once.
    pub(super) fn clear(&mut self, key: &RouteKey) {
        // Nothing to hash for when nothing failed (every key of a cold start passes here).
        if !self.by_key.is_empty() {
            self.by_key.remove(key);
        }
    }

    /// How many keys wait for a retry.
    pub(super) fn len(&self) -> usize {
        self.by_key.len()
    }

    /// The earliest retry of the keys `keys` yields (`None`: none of them failed).
    pub(super) fn earliest_of<'a>(&self, keys: impl Iterator<Item = &'a RouteKey>) -> Option<Instant> {
        keys.filter_map(|k| self.not_before(k)).min()
    }

    /// The earliest retry of the failed keys `dirty` accepts (`None`: none).
    pub(super) fn earliest_where(&self, dirty: impl Fn(&RouteKey) -> bool) -> Option<Instant> {
        self.by_key.iter().filter(|(k, _)| dirty(k)).map(|(_, r)| r.not_before).min()
    }

    /// Whether `key` must still wait at `now`.
    pub(super) fn waiting(&self, key: &RouteKey, now: Instant) -> bool {
        !self.by_key.is_empty() && self.by_key.get(key).is_some_and(|r| r.not_before > now)
    }

    /// When `key` may be tried again, if it failed.
    pub(super) fn not_before(&self, key: &RouteKey) -> Option<Instant> {
        self.by_key.get(key).map(|r| r.not_before)
    }

    fn failures(&self, key: &RouteKey) -> u32 {
        self.by_key.get(key).map_or(0, |r| r.failures)
    }
}

/// When the next full resync is due.
#[derive(Debug)]
pub(super) struct ResyncTimer {
    due: Instant,
    failures: u32,
}

impl ResyncTimer {
    /// A timer with the first resync due at `now`.
    pub(super) fn new(now: Instant) -> Self {
        ResyncTimer { due: now, failures: 0 }
    }

    /// When the next resync is due.
    pub(super) fn due(&self) -> Instant {
        self.due
    }

    /// Whether a resync is due at `now`.
    pub(super) fn is_due(&self, now: Instant) -> bool {
        now >= self.due
    }

    /// Resync at `now` (on request, an event overrun, or a policy change).
    pub(super) fn request(&mut self, now: Instant) {
        self.due = now;
    }

    /// Resync no later than `at`.
    pub(super) fn no_later_than(&mut self, at: Instant) {
        self.due = self.due.min(at);
    }

    /// A resync finished at `now`: the next is one `interval` later (the resync period,
    /// Felix `RouteRefreshInterval`).
    pub(super) fn succeeded(&mut self, now: Instant, interval: Duration) {
        self.failures = 0;
        self.due = later(now, interval);
    }

    /// A resync failed at `now`: try again after the backoff of the failures in a row.
    pub(super) fn failed(&mut self, now: Instant) {
        self.failures += 1;
        self.due = now + backoff(self.failures);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> RouteKey {
        RouteKey::new(254, "10.244.1.0/26".parse().unwrap(), 0, 1024)
    }

    #[test]
    fn backoff_doubles_from_200ms_up_to_30s() {
        let ms = |f| backoff(f).as_millis();
        assert_eq!([ms(0), ms(1), ms(2), ms(3), ms(8)], [200, 200, 400, 800, 25_600]);
        assert_eq!([ms(9), ms(17), ms(u32::MAX)], [30_000, 30_000, 30_000]);
    }

    #[test]
    fn later_saturates_instead_of_overflowing() {
        let now = Instant::now();
        assert_eq!(later(now, Duration::from_secs(5)), now + Duration::from_secs(5));
        assert_eq!(later(now, Duration::MAX), now + FAR_FUTURE);
    }

    #[test]
    fn retries_back_off_per_key_until_cleared() {
        let (now, k) = (Instant::now(), key());
        let mut r = Retries::default();
        assert!(!r.waiting(&k, now));
        r.fail(k, now);
        r.fail(k, now);
        assert_eq!(r.not_before(&k), Some(now + Duration::from_millis(400)));
        assert!(r.waiting(&k, now + Duration::from_millis(399)));
        assert!(!r.waiting(&k, now + Duration::from_millis(400)));
        r.fail_until(k, now + Duration::from_secs(90));
        assert_eq!(r.not_before(&k), Some(now + Duration::from_secs(90)));
        r.fail(k, now);
        assert_eq!(r.not_before(&k), Some(now + Duration::from_millis(1600)), "fail_until counts as a failure");
        r.clear(&k);
        assert_eq!(r.not_before(&k), None);
    }

    /// The earliest retry of the dirty keys is the same whichever set is walked: the failed
    /// keys filtered by the dirty ones, or the dirty keys looked up in the failed ones.
    #[test]
    fn earliest_retry_of_a_set_either_way() {
        let now = Instant::now();
        let k = |i: u32| RouteKey::new(254, ipnet::IpNet::V4(ipnet::Ipv4Net::new(std::net::Ipv4Addr::from(0x0af4_0000 + (i << 6)), 26).unwrap()), 0, 1024);
        let mut r = Retries::default();
        let dirty: std::collections::BTreeSet<RouteKey> = (0..50).map(k).collect();
        assert_eq!((r.earliest_of(dirty.iter()), r.earliest_where(|key| dirty.contains(key))), (None, None));
        // Failed: 40..60 (20 of them dirty), the earliest dirty one 45 (3 s), an earlier one
        // (55, 1 s) not dirty.
        for i in 40..60 {
            r.fail_until(k(i), now + Duration::from_secs(10 + u64::from(i)));
        }
        r.fail_until(k(45), now + Duration::from_secs(3));
        r.fail_until(k(55), now + Duration::from_secs(1));
        let want = Some(now + Duration::from_secs(3));
        assert_eq!(r.earliest_of(dirty.iter()), want);
        assert_eq!(r.earliest_where(|key| dirty.contains(key)), want);
        assert_eq!(r.len(), 20);
    }

    #[test]
    fn resync_timer_schedule() {
        let now = Instant::now();
        let mut t = ResyncTimer::new(now);
        assert!(t.is_due(now));
        t.failed(now);
        t.failed(now);
        assert_eq!(t.due(), now + Duration::from_millis(400));
        t.succeeded(now, Duration::from_secs(90));
        assert_eq!(t.due(), now + Duration::from_secs(90));
        t.no_later_than(now + Duration::from_secs(100));
        assert_eq!(t.due(), now + Duration::from_secs(90));
        t.no_later_than(now + Duration::from_secs(1));
        assert_eq!(t.due(), now + Duration::from_secs(1));
        t.request(now);
        assert!(t.is_due(now));
        t.failed(now);
        assert_eq!(t.due(), now + Duration::from_millis(200), "a success resets the failure count");
    }
}
