//! The reconciler's dirty keys (the keys the next apply looks at), held the way they were last
//! changed: a sorted vector while they were only set in bulk since the set was last empty (a cold
//! start marks all 10,000 desired keys at once, the resync's sweep adds the keys it found, and the
//! write pass takes the written ones out a chunk at a time), an ordered set once single keys come
//! and go (events, failures, retries) until it is empty again. A cold start so never builds a tree
//! of 10,000 keys before its first write: that build (`BTreeSet::from_iter` sorts, then allocates a
//! node per 11 keys) was a third of `set_desired`, on the clock before the kernel gets its first
//! batch (issue 18 part 1). Both forms are ascending and hold each key once; every operation
//! answers exactly as a `BTreeSet` would (checked against one in the tests below).

use std::collections::BTreeSet;

use itertools::{Either, EitherOrBoth, Itertools};

use crate::dataplane::kernel_route::RouteKey;

/// Fewer keys than this leave the tree one removal at a time in
/// [`remove_all`](DirtyKeys::remove_all) (a search each); more are taken out in one ordered
/// pass that rebuilds the rest.
const ONE_BY_ONE: usize = 64;

/// A set of route keys in ascending order (see the module documentation for its two forms):
/// the keys are in `sorted` or in `tree`, never in both (at most one of them is not empty).
#[derive(Debug, Default)]
pub(super) struct DirtyKeys {
    /// Ascending, no key twice: the keys while they were only set in bulk since the set was
    /// last empty.
    sorted: Vec<RouteKey>,
    /// The keys once a single key was added or removed.
    tree: BTreeSet<RouteKey>,
}

impl DirtyKeys {
    /// How many keys are dirty.
    pub(super) fn len(&self) -> usize {
        self.sorted.len() + self.tree.len()
    }

    /// Every dirty key, ascending.
    pub(super) fn iter(&self) -> impl Iterator<Item = &RouteKey> + '_ {
        if self.tree.is_empty() {
            Either::Left(self.sorted.iter())
        } else {
            Either::Right(self.tree.iter())
        }
    }

    /// The keys as a tree, built from the vector the first time a single key comes or goes.
    fn tree(&mut self) -> &mut BTreeSet<RouteKey> {
        if !self.sorted.is_empty() {
            debug_assert!(self.tree.is_empty(), "dirty keys in both forms");
            self.tree = std::mem::take(&mut self.sorted).into_iter().collect();
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
        if self.tree.is_empty() && self.sorted.binary_search(key).is_err() {
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
        } else if self.sorted.is_empty() {
            self.sorted = added;
        } else {
            self.sorted = std::mem::take(&mut self.sorted).into_iter().merge(added).dedup().collect();
        }
    }

    /// Unmark every key of `gone` (any order; keys not marked are ignored). From the vector,
    /// one ordered pass that keeps the rest; from the tree, one removal each when they are
    /// few, else one pass that rebuilds the rest (a cold start's written keys leave the set
    /// chunk by chunk).
    pub(super) fn remove_all(&mut self, mut gone: Vec<RouteKey>) {
        if gone.is_empty() {
            return;
        }
        gone.sort_unstable();
        if self.tree.is_empty() {
            let mut gone = gone.into_iter().peekable();
            self.sorted.retain(|k| {
                while gone.next_if(|g| g < k).is_some() {}
                gone.peek() != Some(k)
            });
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
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(i: u16) -> RouteKey {
        RouteKey::new(254, ipnet::IpNet::V4(ipnet::Ipv4Net::new(std::net::Ipv4Addr::from(0x0a00_0000 + (u32::from(i) << 6)), 26).unwrap()), 0, 1024)
    }

    /// One operation on the set, with keys drawn from a small range so that they repeat.
    #[derive(Clone, Debug)]
    enum Op {
        Insert(u16),
        Remove(u16),
        Extend(Vec<u16>),
        AddSorted(Vec<u16>),
        RemoveAll(Vec<u16>),
    }

    fn op() -> impl Strategy<Value = Op> {
        let keys = || proptest::collection::vec(0u16..300, 0..120);
        prop_oneof![
            1 => (0u16..300).prop_map(Op::Insert),
            1 => (0u16..300).prop_map(Op::Remove),
            1 => keys().prop_map(Op::Extend),
            3 => keys().prop_map(Op::AddSorted),
            3 => keys().prop_map(Op::RemoveAll),
        ]
    }

    proptest! {
        /// Any sequence of operations answers and ends exactly as a `BTreeSet` does, in
        /// whichever form the keys are held at each step.
        #[test]
        fn answers_exactly_as_a_btreeset(ops in proptest::collection::vec(op(), 1..40)) {
            let (mut dirty, mut model) = (DirtyKeys::default(), BTreeSet::new());
            for op in ops {
                match op {
                    Op::Insert(i) => prop_assert_eq!(dirty.insert(key(i)), model.insert(key(i))),
                    Op::Remove(i) => prop_assert_eq!(dirty.remove(&key(i)), model.remove(&key(i))),
                    Op::Extend(is) => {
                        dirty.extend(is.iter().map(|i| key(*i)));
                        model.extend(is.iter().map(|i| key(*i)));
                    }
                    Op::AddSorted(is) => {
                        let added: BTreeSet<RouteKey> = is.iter().map(|i| key(*i)).collect();
                        dirty.add_sorted(added.iter().copied().collect());
                        model.extend(added);
                    }
                    Op::RemoveAll(is) => {
                        dirty.remove_all(is.iter().map(|i| key(*i)).collect());
                        for i in &is {
                            model.remove(&key(*i));
                        }
                    }
                }
                prop_assert_eq!(dirty.len(), model.len());
                prop_assert!(dirty.iter().eq(model.iter()));
            }
        }
    }

    #[test]
    fn bulk_changes_keep_the_vector_and_single_keys_make_the_tree() {
        let mut dirty = DirtyKeys::default();
        dirty.add_sorted((0..100).map(key).collect());
        dirty.add_sorted((50..150).map(key).collect());
        dirty.remove_all((0..10).map(key).collect());
        dirty.extend(std::iter::empty());
        assert!(!dirty.remove(&key(500)), "not marked");
        assert_eq!((dirty.sorted.len(), dirty.tree.len()), (140, 0));
        assert!(dirty.remove(&key(10)));
        assert_eq!((dirty.sorted.len(), dirty.tree.len()), (0, 139));
        assert_eq!(dirty.tree.first(), Some(&key(11)));
        // Removing every key (the end of a cold start's write pass) from either form.
        dirty.remove_all((0..150).map(key).collect());
        assert_eq!(dirty.len(), 0);
        let mut sorted = DirtyKeys::default();
        sorted.add_sorted((0..3000).map(key).collect());
        sorted.remove_all((0..3000).rev().map(key).collect());
        assert_eq!((sorted.len(), sorted.iter().count()), (0, 0));
    }
}
