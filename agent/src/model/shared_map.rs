//! [`SharedMap`]: the sorted map the cluster keeps its IPAM blocks, BlockAffinities and Nodes
//! in, whose copies share every part that did not change.
//!
//! At 100,000 blocks a [`BTreeMap`](std::collections::BTreeMap) copy is 205,000 entries
//! cloned and, when the last snapshot holding it goes, 205,000 freed: about 20 ms to build
//! every snapshot and 30 ms to drop one on this project's machines, both on the path from a
//! change to its routes (p99 event → plan ≤ 100 ms). A `SharedMap` is a sorted list
//! of chunks of at most [`MAX_CHUNK`] entries, each behind an [`Arc`]: a copy clones the list
//! of chunk pointers (1/64 of the entries), a change copies the one chunk it lands in
//! (copy-on-write, [`Arc::make_mut`]), and two maps that share chunks compare and
//! [`diff`](SharedMap::diff) by pointer, chunk by chunk. The permissive persistent-map crates
//! found (`im`, `rpds`) are MPL-2.0, which the agent does not take.
//!
//! Reads are those of a `BTreeMap` (`get`, `contains_key`, `iter`, `keys`, `values`, `len`,
//! `map[key]`), in key order, O(log n); `insert` and `remove` are O(log n + [`MAX_CHUNK`]).

use std::borrow::Borrow;
use std::fmt;
use std::sync::Arc;

use serde::{Serialize, Serializer};

/// Entries per chunk after a split or a bulk build: a chunk that grows past [`MAX_CHUNK`] is
/// cut in two halves of about this size.
pub const CHUNK: usize = 64;

/// The most entries a chunk holds.
pub const MAX_CHUNK: usize = 2 * CHUNK;

/// One chunk: entries sorted by key, never empty.
type Chunk<K, V> = Arc<Vec<(K, V)>>;

/// A sorted map of chunks shared between copies (see the module documentation).
pub struct SharedMap<K, V> {
    /// Sorted, none empty; every key of a chunk is below every key of the next.
    chunks: Vec<Chunk<K, V>>,
    len: usize,
}

impl<K, V> SharedMap<K, V> {
    /// An empty map.
    #[must_use]
    pub const fn new() -> SharedMap<K, V> {
        SharedMap { chunks: Vec::new(), len: 0 }
    }

    /// The number of entries.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the map has no entry.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The entries in key order.
    pub fn iter(&self) -> Iter<'_, K, V> {
        Iter { chunks: self.chunks.iter(), front: [].iter(), back: [].iter(), left: self.len }
    }

    /// The keys in order.
    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &K> + ExactSizeIterator + Clone + '_ {
        self.iter().map(|(k, _)| k)
    }

    /// The values in key order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &V> + ExactSizeIterator + Clone + '_ {
        self.iter().map(|(_, v)| v)
    }

    /// How many chunks the map is made of (for tests and benchmarks of the sharing).
    #[must_use]
    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// How many of this map's chunks are the same allocation as one of `other`'s at the same
    /// position in key order: the entries two copies share (for tests of the sharing).
    #[must_use]
    pub fn shared_chunks(&self, other: &SharedMap<K, V>) -> usize {
        self.chunks.iter().filter(|c| other.chunks.iter().any(|o| Arc::ptr_eq(c, o))).count()
    }
}

impl<K: Ord, V> SharedMap<K, V> {
    /// The index of the chunk `key` belongs in: the last whose first key is at most `key`
    /// (0 when `key` is below every key). The map must not be empty.
    fn chunk_of<Q: Ord + ?Sized>(&self, key: &Q) -> usize
    where
        K: Borrow<Q>,
    {
        self.chunks.partition_point(|c| c[0].0.borrow() <= key).saturating_sub(1)
    }

    /// The chunk `key` belongs in and the place of `key` in it (`Err`: where it would go).
    fn find<Q: Ord + ?Sized>(&self, key: &Q) -> Option<(usize, Result<usize, usize>)>
    where
        K: Borrow<Q>,
    {
        if self.chunks.is_empty() {
            return None;
        }
        let i = self.chunk_of(key);
        Some((i, self.chunks[i].binary_search_by(|(k, _)| k.borrow().cmp(key))))
    }

    /// The value at `key`.
    pub fn get<Q: Ord + ?Sized>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
    {
        self.get_key_value(key).map(|(_, v)| v)
    }

    /// The entry at `key`.
    pub fn get_key_value<Q: Ord + ?Sized>(&self, key: &Q) -> Option<(&K, &V)>
    where
        K: Borrow<Q>,
    {
        match self.find(key)? {
            (i, Ok(j)) => self.chunks[i].get(j).map(|(k, v)| (k, v)),
            (_, Err(_)) => None,
        }
    }

    /// Whether `key` is in the map.
    pub fn contains_key<Q: Ord + ?Sized>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        self.get(key).is_some()
    }
}

impl<K: Ord + Clone, V: Clone> SharedMap<K, V> {
    /// Set `key`, above every key of the map, to `value`, in O(1): onto the last chunk while it
    /// holds fewer than [`CHUNK`] entries, else into a new one (what a build from entries in
    /// ascending order does, one at a time). A key not above the last is set as
    /// [`SharedMap::insert`] sets it.
    pub fn push_last(&mut self, key: K, value: V) {
        if self.chunks.last().and_then(|c| c.last()).is_some_and(|(last, _)| *last >= key) {
            self.insert(key, value);
            return;
        }
        match self.chunks.last_mut() {
            Some(c) if c.len() < CHUNK => Arc::make_mut(c).push((key, value)),
            _ => {
                let mut chunk = Vec::with_capacity(CHUNK);
                chunk.push((key, value));
                self.chunks.push(Arc::new(chunk));
            }
        }
        self.len += 1;
    }

    /// Set `key` to `value`; the value it had. Copies the chunk it lands in when another map
    /// shares it.
    ///
    /// Memory: a key above every other goes where [`SharedMap::push_last`] puts it (chunks of
    /// [`CHUNK`], full), and a split gives the first half back the capacity it no longer
    /// uses. Without both, a map built one insert at a time in key order (a datastore's
    /// first list) kept chunks of 64 entries in vectors grown to 256: four times the memory.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        let Some((i, at)) = self.find(&key) else {
            let mut chunk = Vec::with_capacity(CHUNK);
            chunk.push((key, value));
            self.chunks.push(Arc::new(chunk));
            self.len = 1;
            return None;
        };
        if at == Err(self.chunks[i].len()) && i + 1 == self.chunks.len() {
            self.push_last(key, value);
            return None;
        }
        let chunk = Arc::make_mut(&mut self.chunks[i]);
        match at {
            Ok(j) => Some(std::mem::replace(&mut chunk[j].1, value)),
            Err(j) => {
                chunk.insert(j, (key, value));
                self.len += 1;
                if chunk.len() > MAX_CHUNK {
                    let tail = chunk.split_off(chunk.len() / 2);
                    chunk.shrink_to_fit();
                    self.chunks.insert(i + 1, Arc::new(tail));
                }
                None
            }
        }
    }

    /// Take `key` out; its value. Copies the chunk it was in when another map shares it (an
    /// absent key copies nothing); a chunk left small is merged with the next when both fit
    /// in one.
    pub fn remove<Q: Ord + ?Sized>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        let (i, Ok(j)) = self.find(key)? else { return None };
        let chunk = Arc::make_mut(&mut self.chunks[i]);
        let (_, value) = chunk.remove(j);
        self.len -= 1;
        if chunk.is_empty() {
            self.chunks.remove(i);
        } else if chunk.len() < CHUNK / 2 && self.chunks.get(i + 1).is_some_and(|next| self.chunks[i].len() + next.len() <= CHUNK) {
            let next = self.chunks.remove(i + 1);
            let next = Arc::try_unwrap(next).unwrap_or_else(|shared| (*shared).clone());
            Arc::make_mut(&mut self.chunks[i]).extend(next);
        }
        Some(value)
    }

    /// A map of sorted, distinct entries, cut into chunks of [`CHUNK`].
    fn from_sorted(entries: Vec<(K, V)>) -> SharedMap<K, V> {
        let len = entries.len();
        let mut chunks = Vec::with_capacity(len.div_ceil(CHUNK));
        let mut entries = entries.into_iter().peekable();
        while entries.peek().is_some() {
            chunks.push(Arc::new(entries.by_ref().take(CHUNK).collect()));
        }
        SharedMap { chunks, len }
    }
}

impl<K: Ord, V: PartialEq> SharedMap<K, V> {
    /// Call `f(key, before, after)` for every key whose entry differs between `self` (before)
    /// and `after` (`None`: absent on that side), in key order. Chunks the two maps share are
    /// skipped whole, so two copies of a large map that differ in a few entries compare in
    /// O(chunks + changed chunks × [`MAX_CHUNK`]); inside the others values are compared by
    /// value (an `Arc` of an `Eq` type by pointer first: two equal copies are no change).
    pub fn diff<'m>(&'m self, after: &'m SharedMap<K, V>, mut f: impl FnMut(&'m K, Option<&'m V>, Option<&'m V>)) {
        use std::cmp::Ordering;
        let mut old = Cursor { chunks: &self.chunks, chunk: 0, entry: 0 };
        let mut new = Cursor { chunks: &after.chunks, chunk: 0, entry: 0 };
        loop {
            if old.entry == 0 && new.entry == 0 && old.chunk_is(new.current_chunk()) {
                old.skip_chunk();
                new.skip_chunk();
                continue;
            }
            match (old.current(), new.current()) {
                (None, None) => return,
                (Some((name, before)), None) => {
                    f(name, Some(before), None);
                    old.step();
                }
                (None, Some((name, now))) => {
                    f(name, None, Some(now));
                    new.step();
                }
                (Some((name, before)), Some((other, now))) => match name.cmp(other) {
                    Ordering::Less => {
                        f(name, Some(before), None);
                        old.step();
                    }
                    Ordering::Greater => {
                        f(other, None, Some(now));
                        new.step();
                    }
                    Ordering::Equal => {
                        if before != now {
                            f(name, Some(before), Some(now));
                        }
                        old.step();
                        new.step();
                    }
                },
            }
        }
    }
}

/// A place in a map's chunks, for [`SharedMap::diff`].
struct Cursor<'m, K, V> {
    chunks: &'m [Chunk<K, V>],
    chunk: usize,
    entry: usize,
}

impl<'m, K, V> Cursor<'m, K, V> {
    fn current(&self) -> Option<(&'m K, &'m V)> {
        self.chunks.get(self.chunk).map(|c| (&c[self.entry].0, &c[self.entry].1))
    }

    fn current_chunk(&self) -> Option<&'m Chunk<K, V>> {
        self.chunks.get(self.chunk)
    }

    /// Whether the cursor's chunk is `other` (the same allocation).
    fn chunk_is(&self, other: Option<&Chunk<K, V>>) -> bool {
        matches!((self.current_chunk(), other), (Some(a), Some(b)) if Arc::ptr_eq(a, b))
    }

    fn skip_chunk(&mut self) {
        (self.chunk, self.entry) = (self.chunk + 1, 0);
    }

    fn step(&mut self) {
        self.entry += 1;
        if self.chunks.get(self.chunk).is_some_and(|c| self.entry == c.len()) {
            self.skip_chunk();
        }
    }
}

impl<K, V> Clone for SharedMap<K, V> {
    /// A copy sharing every chunk: O(chunks), no entry cloned.
    fn clone(&self) -> SharedMap<K, V> {
        SharedMap { chunks: self.chunks.clone(), len: self.len }
    }
}

impl<K, V> Default for SharedMap<K, V> {
    fn default() -> SharedMap<K, V> {
        SharedMap::new()
    }
}

impl<K: PartialEq, V: PartialEq> PartialEq for SharedMap<K, V> {
    /// Equal entries; the chunks both maps share are skipped without reading an entry, so a
    /// copy compares in O(chunks + entries of the chunks that differ).
    fn eq(&self, other: &SharedMap<K, V>) -> bool {
        if self.len != other.len {
            return false;
        }
        let mut mine = Cursor { chunks: &self.chunks, chunk: 0, entry: 0 };
        let mut theirs = Cursor { chunks: &other.chunks, chunk: 0, entry: 0 };
        loop {
            if mine.entry == 0 && theirs.entry == 0 && mine.chunk_is(theirs.current_chunk()) {
                mine.skip_chunk();
                theirs.skip_chunk();
                continue;
            }
            match (mine.current(), theirs.current()) {
                (None, None) => return true,
                (Some(x), Some(y)) if x == y => {
                    mine.step();
                    theirs.step();
                }
                _ => return false,
            }
        }
    }
}

impl<K: Eq, V: Eq> Eq for SharedMap<K, V> {}

impl<K: fmt::Debug, V: fmt::Debug> fmt::Debug for SharedMap<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<K: Serialize, V: Serialize> Serialize for SharedMap<K, V> {
    /// As a map, in key order (as a `BTreeMap` serializes).
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.iter())
    }
}

impl<K: Ord + Clone, V: Clone> FromIterator<(K, V)> for SharedMap<K, V> {
    /// As `BTreeMap`'s: the last value given for a key wins.
    ///
    /// Entries given in ascending key order, each key once (a route pass's or a plan's) go
    /// straight into chunks, without a list of them all first: at 100,000 routes that list and
    /// its sorted copy were tens of MB at once. Any other order is collected and sorted.
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> SharedMap<K, V> {
        let mut iter = iter.into_iter();
        let mut map = SharedMap::new();
        while let Some((k, v)) = iter.next() {
            if map.chunks.last().and_then(|c| c.last()).is_some_and(|(last, _)| *last >= k) {
                let mut entries: Vec<(K, V)> = map.into_iter().collect();
                entries.push((k, v));
                entries.extend(iter);
                return SharedMap::from_unsorted(entries);
            }
            map.push_last(k, v);
        }
        map
    }
}

impl<K: Ord + Clone, V: Clone> SharedMap<K, V> {
    /// The map of `entries` in any order; of equal keys the last given wins.
    fn from_unsorted(mut entries: Vec<(K, V)>) -> SharedMap<K, V> {
        // Stable, so that of equal keys the last given is the last here.
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut distinct: Vec<(K, V)> = Vec::with_capacity(entries.len());
        for e in entries {
            match distinct.last_mut() {
                Some(last) if last.0 == e.0 => *last = e,
                _ => distinct.push(e),
            }
        }
        SharedMap::from_sorted(distinct)
    }
}

impl<K: Ord + Clone, V: Clone> Extend<(K, V)> for SharedMap<K, V> {
    /// Insert every entry; into an empty map, built in one piece.
    fn extend<I: IntoIterator<Item = (K, V)>>(&mut self, iter: I) {
        if self.is_empty() {
            *self = iter.into_iter().collect();
        } else {
            for (k, v) in iter {
                self.insert(k, v);
            }
        }
    }
}

impl<'a, K, V> IntoIterator for &'a SharedMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = Iter<'a, K, V>;

    fn into_iter(self) -> Iter<'a, K, V> {
        self.iter()
    }
}

impl<K: Clone, V: Clone> IntoIterator for SharedMap<K, V> {
    type Item = (K, V);
    type IntoIter = std::vec::IntoIter<(K, V)>;

    /// The entries in key order; the chunks no other map shares are moved, the others copied.
    fn into_iter(self) -> std::vec::IntoIter<(K, V)> {
        let mut out = Vec::with_capacity(self.len);
        for c in self.chunks {
            out.extend(Arc::try_unwrap(c).unwrap_or_else(|shared| (*shared).clone()));
        }
        out.into_iter()
    }
}

impl<K: Ord + Borrow<Q>, Q: Ord + ?Sized, V> std::ops::Index<&Q> for SharedMap<K, V> {
    type Output = V;

    /// The value at `key`. Panics when the key is absent, as `BTreeMap`'s index does.
    fn index(&self, key: &Q) -> &V {
        self.get(key).expect("no entry found for key")
    }
}

/// The entries of a [`SharedMap`] in key order.
pub struct Iter<'a, K, V> {
    chunks: std::slice::Iter<'a, Chunk<K, V>>,
    front: std::slice::Iter<'a, (K, V)>,
    back: std::slice::Iter<'a, (K, V)>,
    /// Entries not yet returned from either end: the exact size, so that a `collect` sizes
    /// its vector once (100,000 IPAM blocks collected from a size hint of 0 grew it by
    /// doubling, each step copied and faulted in).
    left: usize,
}

impl<K, V> Clone for Iter<'_, K, V> {
    fn clone(&self) -> Self {
        Iter { chunks: self.chunks.clone(), front: self.front.clone(), back: self.back.clone(), left: self.left }
    }
}

impl<'a, K, V> Iterator for Iter<'a, K, V> {
    type Item = (&'a K, &'a V);

    fn next(&mut self) -> Option<(&'a K, &'a V)> {
        let (k, v) = loop {
            if let Some(entry) = self.front.next() {
                break entry;
            }
            let Some(c) = self.chunks.next() else { break self.back.next()? };
            self.front = c.iter();
        };
        self.left -= 1;
        Some((k, v))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl<K, V> ExactSizeIterator for Iter<'_, K, V> {}

impl<'a, K, V> DoubleEndedIterator for Iter<'a, K, V> {
    fn next_back(&mut self) -> Option<(&'a K, &'a V)> {
        let (k, v) = loop {
            if let Some(entry) = self.back.next_back() {
                break entry;
            }
            let Some(c) = self.chunks.next_back() else { break self.front.next_back()? };
            self.back = c.iter();
        };
        self.left -= 1;
        Some((k, v))
    }
}

#[cfg(test)]
mod tests;
