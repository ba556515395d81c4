//! [`MassDeletionBreaker`]: when one apply would delete more than a threshold share of our
//! routes in the kernel (default half), each such delete waits until it has been wanted
//! continuously for the settle period (default 30 s), so an emptied or truncated input costs no
//! route while a deliberate large change still converges one settle period later.
//!
//! A held delete that an apply defers for another reason (the datastore went unsynced, its
//! prefix became frozen ground, a handover is pending) keeps its hold and the time it was
//! first wanted: it is *paused*, not forgotten, so a blip of the API server neither restarts
//! the settle period nor counts as a second engagement of the breaker.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::dataplane::kernel::route::RouteKey;
use crate::dataplane::reconciler::retry::later;

/// The breaker's state: the deletes it holds, each with the time it was first wanted.
#[derive(Debug)]
pub(super) struct MassDeletionBreaker {
    /// Engage above this percentage of our routes (100: never).
    percent: u8,
    /// How long a held delete must stay wanted.
    settle: Duration,
    held: BTreeMap<RouteKey, Instant>,
    /// Held deletes the last apply deferred for another reason (kept, not released by time).
    paused: BTreeSet<RouteKey>,
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
    /// Holds kept while their deletes are deferred for another reason.
    pub(super) paused: usize,
}

impl MassDeletionBreaker {
    /// A breaker engaging above `percent` of our routes, releasing after `settle`.
    pub(super) fn new(percent: u8, settle: Duration) -> Self {
        MassDeletionBreaker { percent, settle, held: BTreeMap::new(), paused: BTreeSet::new() }
    }

    /// Sort the plain deletes of one apply at `now`, with `ours` routes of ours in the kernel:
    /// under the threshold all pass (and every hold clears); over it only those wanted
    /// continuously for the settle period pass. `deferred` are the delete candidates of this
    /// apply that did not get as far as the breaker (unsynced, frozen, handover pending): a
    /// hold on one of them is paused, keeping its start time. A delete that is neither wanted
    /// nor deferred any more (the route came back into the desired set) starts over if it is
    /// wanted again.
    pub(super) fn check(&mut self, deletes: Vec<RouteKey>, deferred: &[RouteKey], ours: usize, now: Instant) -> BreakerVerdict {
        let wanted: BTreeSet<RouteKey> = deletes.iter().copied().collect();
        let deferred: BTreeSet<RouteKey> = deferred.iter().copied().collect();
        self.held.retain(|k, _| wanted.contains(k) || deferred.contains(k));
        self.paused = self.held.keys().filter(|k| deferred.contains(*k)).copied().collect();
        let paused = self.paused.len();
        let percent = usize::from(self.percent);
        let over = ours > 0 && percent < 100 && deletes.len().saturating_mul(100) > percent.saturating_mul(ours);
        if !over {
            let keep = &self.paused;
            self.held.retain(|k, _| keep.contains(k));
            return BreakerVerdict { pass: deletes, held: Vec::new(), wanted: wanted.len(), paused };
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
        BreakerVerdict { pass, held, wanted: wanted.len(), paused }
    }

    /// The deletes held now, paused ones included (they come back for another look on every
    /// apply, so a paused hold whose route is wanted again is dropped).
    pub(super) fn held(&self) -> impl Iterator<Item = &RouteKey> {
        self.held.keys()
    }

    /// The route at `key` is gone: nothing to hold there.
    pub(super) fn forget(&mut self, key: &RouteKey) {
        self.held.remove(key);
        self.paused.remove(key);
    }

    /// The earliest time a held delete is released; paused holds have no release time (their
    /// deletes come back when the reason they were deferred for goes away).
    pub(super) fn next_release(&self) -> Option<Instant> {
        self.held.iter().filter(|(k, _)| !self.paused.contains(*k)).map(|(_, first)| later(*first, self.settle)).min()
    }
}

#[cfg(test)]
mod tests;
