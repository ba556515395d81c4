//! [`MassDeletionBreaker`]: when one apply would delete more than a threshold share of our
//! routes in the kernel (default half), each such delete waits until it has been wanted
//! continuously for the settle period (default 30 s), so an emptied or truncated input costs no
//! route while a deliberate large change still converges one settle period later.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::kernel_route::RouteKey;
use super::retry::later;

/// The breaker's state: the deletes it holds, each with the time it was first wanted.
#[derive(Debug)]
pub(super) struct MassDeletionBreaker {
    /// Engage above this percentage of our routes (100: never).
    percent: u8,
    /// How long a held delete must stay wanted.
    settle: Duration,
    held: BTreeMap<RouteKey, Instant>,
}

/// What the breaker let through in one apply.
#[derive(Debug)]
pub(super) struct BreakerVerdict {
    /// Deletes that may go out now.
    pub(super) pass: Vec<RouteKey>,
    /// Deletes held back (not yet wanted for the settle period).
    pub(super) held: Vec<RouteKey>,
    /// How many distinct deletes were wanted.
    pub(super) wanted: usize,
}

impl MassDeletionBreaker {
    /// A breaker engaging above `percent` of our routes, releasing after `settle`.
    pub(super) fn new(percent: u8, settle: Duration) -> Self {
        MassDeletionBreaker { percent, settle, held: BTreeMap::new() }
    }

    /// Sort the plain deletes of one apply at `now`, with `ours` routes of ours in the kernel:
    /// under the threshold all pass (and every hold clears); over it only those wanted
    /// continuously for the settle period pass. A delete that is not wanted any more (the
    /// route came back into the desired set) starts over if it is wanted again.
    pub(super) fn check(&mut self, deletes: Vec<RouteKey>, ours: usize, now: Instant) -> BreakerVerdict {
        let wanted: BTreeSet<RouteKey> = deletes.iter().copied().collect();
        self.held.retain(|k, _| wanted.contains(k));
        let percent = usize::from(self.percent);
        let over = ours > 0 && percent < 100 && deletes.len().saturating_mul(100) > percent.saturating_mul(ours);
        if !over {
            self.held.clear();
            return BreakerVerdict { pass: deletes, held: Vec::new(), wanted: wanted.len() };
        }
        let (mut pass, mut held) = (Vec::new(), Vec::new());
        for key in deletes {
            let since = *self.held.entry(key).or_insert(now);
            if now.saturating_duration_since(since) >= self.settle {
                pass.push(key);
            } else {
                held.push(key);
            }
        }
        BreakerVerdict { pass, held, wanted: wanted.len() }
    }

    /// The deletes held now (they come back for another look on every apply).
    pub(super) fn held(&self) -> impl Iterator<Item = &RouteKey> {
        self.held.keys()
    }

    /// The route at `key` is gone: nothing to hold there.
    pub(super) fn forget(&mut self, key: &RouteKey) {
        self.held.remove(key);
    }

    /// The earliest time a held delete is released.
    pub(super) fn next_release(&self) -> Option<Instant> {
        self.held.values().min().map(|first| later(*first, self.settle))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(n: u8) -> Vec<RouteKey> {
        (0..n).map(|i| RouteKey::new(254, format!("10.244.{i}.0/26").parse().unwrap(), 0, 1024)).collect()
    }

    #[test]
    fn at_or_under_the_threshold_everything_passes() {
        let now = Instant::now();
        let mut b = MassDeletionBreaker::new(50, Duration::from_secs(30));
        let v = b.check(keys(5), 10, now);
        assert_eq!((v.pass.len(), v.held.len(), v.wanted), (5, 0, 5));
        assert_eq!(b.next_release(), None);
    }

    #[test]
    fn over_the_threshold_deletes_wait_for_the_settle_period() {
        let now = Instant::now();
        let settle = Duration::from_secs(30);
        let mut b = MassDeletionBreaker::new(50, settle);
        let v = b.check(keys(6), 10, now);
        assert_eq!((v.pass.len(), v.held.len(), v.wanted), (0, 6, 6));
        assert_eq!(b.next_release(), Some(now + settle));
        assert_eq!(b.held().count(), 6);
        let v = b.check(keys(6), 10, now + Duration::from_secs(29));
        assert_eq!(v.held.len(), 6);
        let v = b.check(keys(6), 10, now + settle);
        assert_eq!((v.pass.len(), v.held.len()), (6, 0));
    }

    #[test]
    fn a_delete_no_longer_wanted_starts_over() {
        let now = Instant::now();
        let settle = Duration::from_secs(30);
        let mut b = MassDeletionBreaker::new(50, settle);
        b.check(keys(6), 10, now);
        // Five of the six are wanted later (still over half of 8): the sixth's hold is gone.
        b.check(keys(5), 8, now + Duration::from_secs(10));
        assert_eq!(b.held().count(), 5);
        let v = b.check(keys(6), 10, now + settle);
        assert_eq!((v.pass.len(), v.held.len()), (5, 1), "{v:?}");
        b.forget(&keys(6)[5]);
        assert_eq!(b.next_release(), Some(now + settle));
    }

    #[test]
    fn one_hundred_percent_turns_the_breaker_off() {
        let mut b = MassDeletionBreaker::new(100, Duration::from_secs(30));
        let v = b.check(keys(10), 10, Instant::now());
        assert_eq!((v.pass.len(), v.held.len()), (10, 0));
    }
}
