//! The reconciler's dirty keys (the keys the next apply looks at), held the way they were last
//! changed: a sorted vector while they were only set in bulk since the set was last empty (a cold
//! start marks all 10,000 desired keys at once, the resync's sweep adds the keys it found, and the
//! write pass takes the written ones out a chunk at a time), an ordered set once single keys come
//! and go (events, failures, retries) until it is empty again. A cold start so never builds a tree
//! of 10,000 keys before its first write: that build (`BTreeSet::from_iter` sorts, then allocates a
//! node per 11 keys) was a third of `set_desired`, on the clock before the kernel gets its first
//! batch. The vector is shared with the write pass's snapshot of the keys, and
//! the written keys it takes off the front only move an offset, so a cold start copies its keys
//! neither before its first write nor while the kernel inserts its first batches. Both forms are
//! ascending and hold each key once; every operation answers exactly as a `BTreeSet` would
//! (checked against one in the tests below).

use std::collections::BTreeSet;
use std::sync::Arc;

use itertools::{Either, EitherOrBoth, Itertools};

use crate::dataplane::kernel::route::RouteKey;

/// Fewer keys than this leave the tree one removal at a time in
/// [`remove_all`](DirtyKeys::remove_all) (a search each); more are taken out in one ordered
/// pass that rebuilds the rest.
const ONE_BY_ONE: usize = 64;

/// A set of route keys in ascending order (see the module documentation for its two forms):
/// the keys are in the vector form or in `tree`, never in both (at most one of them is not
/// empty).
#[derive(Debug, Default)]
pub(super) struct DirtyKeys {
    /// The vector form, `sorted[start..]`: ascending, no key twice, the keys while they were
    /// only set in bulk since the set was last empty. Shared with the write pass's
    /// [`snapshot`](DirtyKeys::snapshot); a change after it builds a vector of its own, except
    /// taking keys off the front, which only moves `start`.
    sorted: Arc<Vec<RouteKey>>,
    /// How many keys at the front of `sorted` have left the set (a cold start's write pass
    /// takes its written keys out chunk by chunk, in key order): no copy of the rest while the
    /// write pass's snapshot shares the vector.
    start: usize,
    /// The keys once a single key was added or removed.
    tree: BTreeSet<RouteKey>,
    /// Bumped by every call that may take keys out ([`remove`](DirtyKeys::remove),
    /// [`remove_all`](DirtyKeys::remove_all)): two equal readings mean no key left between them.
    removals: u64,
}

/// The dirty keys at one moment, ascending ([`DirtyKeys::snapshot`]); later changes to the set
/// do not show in it.
#[derive(Debug)]
pub(super) struct DirtySnapshot {
    keys: Arc<Vec<RouteKey>>,
    start: usize,
}

impl std::ops::Deref for DirtySnapshot {
    type Target = [RouteKey];

    fn deref(&self) -> &[RouteKey] {
        &self.keys[self.start..]
    }
}

impl DirtyKeys {
    /// The keys of the vector form.
    fn front(&self) -> &[RouteKey] {
        &self.sorted[self.start..]
    }

    /// Make `keys` (ascending, no key twice) the vector form.
    fn set_sorted(&mut self, keys: Vec<RouteKey>) {
        self.sorted = Arc::new(keys);
        self.start = 0;
    }

    /// A reading of the removal count: equal readings mean no key left the set in between.
    pub(super) fn removals(&self) -> u64 {
        self.removals
    }

    /// How many keys are dirty.
    pub(super) fn len(&self) -> usize {
        self.front().len() + self.tree.len()
    }

    /// Whether `key` is dirty (O(log n)).
    pub(super) fn contains(&self, key: &RouteKey) -> bool {
        if self.tree.is_empty() {
            self.front().binary_search(key).is_ok()
        } else {
            self.tree.contains(key)
        }
    }

    /// Every dirty key, ascending.
    pub(super) fn iter(&self) -> impl Iterator<Item = &RouteKey> + '_ {
        if self.tree.is_empty() {
            Either::Left(self.front().iter())
        } else {
            Either::Right(self.tree.iter())
        }
    }

    /// Every dirty key now, ascending, unchanged by later changes to the set. The vector form
    /// is shared, not copied: a cold start's 10,000 keys (280 KB of fresh memory to fault in)
    /// are taken by the write pass before its first write, and its written keys leave the
    /// front of the vector without a copy.
    pub(super) fn snapshot(&self) -> DirtySnapshot {
        if self.tree.is_empty() {
            DirtySnapshot { keys: Arc::clone(&self.sorted), start: self.start }
        } else {
            DirtySnapshot { keys: Arc::new(self.tree.iter().copied().collect()), start: 0 }
        }
    }

    /// The keys as a tree, built from the vector the first time a single key comes or goes.
    fn tree(&mut self) -> &mut BTreeSet<RouteKey> {
        if !self.front().is_empty() {
            debug_assert!(self.tree.is_empty(), "dirty keys in both forms");
            self.tree = self.front().iter().copied().collect();
            self.set_sorted(Vec::new());
        }
        &mut self.tree
    }

    /// Mark `key`; whether it was not marked yet.
    pub(super) fn insert(&mut self, key: RouteKey) -> bool {
        self.tree().insert(key)
    }

    /// Unmark `key`; whether it was marked. A key that is not marked changes nothing (the
    /// vector stays a vector).
    pub(super) fn remove(&mut self, key: &RouteKey) -> bool {
        self.removals += 1;
        if self.tree.is_empty() && self.front().binary_search(key).is_err() {
            return false;
        }
        self.tree().remove(key)
    }

    /// Mark every key of `keys` (any order, repeats allowed). None leaves the form as it is.
    pub(super) fn extend(&mut self, keys: impl IntoIterator<Item = RouteKey>) {
        let mut keys = keys.into_iter().peekable();
        if keys.peek().is_some() {
            self.tree().extend(keys);
        }
    }

    /// Mark the keys of `added`, which must be ascending with no key twice (checked in debug
    /// builds): into an empty set it is taken as it is, into the vector merged in one pass,
    /// into the tree appended in one pass.
    pub(super) fn add_sorted(&mut self, added: Vec<RouteKey>) {
        debug_assert!(added.is_sorted_by(|a, b| a < b), "keys not in strict ascending order");
        if added.is_empty() {
            return;
        }
        if !self.tree.is_empty() {
            self.tree.append(&mut added.into_iter().collect());
        } else if self.front().is_empty() {
            self.set_sorted(added);
        } else {
            let merged = self.front().iter().copied().merge(added).dedup().collect();
            self.set_sorted(merged);
        }
    }

    /// Unmark every key of `gone` (any order; keys not marked are ignored). From the vector:
    /// the keys at its front (a cold start's written chunk) by moving past them, any others
    /// in one ordered pass that keeps the rest; from the tree, one removal each when they are
    /// few, else one pass that rebuilds the rest (a cold start's written keys leave the set
    /// chunk by chunk).
    pub(super) fn remove_all(&mut self, mut gone: Vec<RouteKey>) {
        if gone.is_empty() {
            return;
        }
        self.removals += 1;
        gone.sort_unstable();
        if self.tree.is_empty() {
            if self.front().starts_with(&gone) {
                self.start += gone.len();
            } else {
                let mut gone = gone.into_iter().peekable();
                let mut keep = |k: &RouteKey| {
                    while gone.next_if(|g| g < k).is_some() {}
                    gone.peek() != Some(k)
                };
                match Arc::get_mut(&mut self.sorted) {
                    Some(sorted) if self.start == 0 => sorted.retain(keep),
                    // Shared with a snapshot, or past keys taken off the front: what stays goes
                    // into a vector of its own.
                    _ => {
                        let kept = self.front().iter().copied().filter(|k| keep(k)).collect();
                        self.set_sorted(kept);
                    }
                }
            }
            if self.front().is_empty() {
                // Nothing left: the vector (and the snapshot's keys, once it is dropped) goes.
                self.set_sorted(Vec::new());
            }
        } else if gone.len() < ONE_BY_ONE || gone.len() * 4 < self.tree.len() {
            for key in &gone {
                self.tree.remove(key);
            }
        } else {
            self.tree = std::mem::take(&mut self.tree).into_iter().merge_join_by(gone, Ord::cmp).filter_map(EitherOrBoth::just_left).collect();
        }
    }
}

#[cfg(test)]
mod tests;
