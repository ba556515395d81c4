//! [`Claims`]: which keys define each object identity.

use std::collections::BTreeMap;

use super::{Identity, Key};

/// The keys whose last good object has each identity, in key order: the least held inline,
/// any others beside it. Two keys defining one object are rare (every definition is then
/// refused, as `ClusterBuilder::finish` refuses an object defined twice); a list per identity
/// cost a heap allocation and 8 bytes more for each of 205,000 keys.
#[derive(Debug, Default)]
pub(super) struct Claims {
    /// The least key defining each identity.
    first: BTreeMap<Identity, Key>,
    /// The other keys, sorted, for the identities more than one key defines; never empty.
    more: BTreeMap<Identity, Vec<Key>>,
}

impl Claims {
    /// `key` defines `id` (again: no change).
    pub(super) fn add(&mut self, id: &Identity, key: &Key) {
        let Some(first) = self.first.get_mut(id) else {
            self.first.insert(id.clone(), key.clone());
            return;
        };
        if first == key {
            return;
        }
        let other = if key < first { std::mem::replace(first, key.clone()) } else { key.clone() };
        let more = self.more.entry(id.clone()).or_default();
        if let Err(at) = more.binary_search(&other) {
            more.insert(at, other);
        }
    }

    /// `key` no longer defines `id` (if it did).
    pub(super) fn remove(&mut self, id: &Identity, key: &str) {
        let Some(first) = self.first.get_mut(id) else { return };
        if &**first == key {
            match self.more.get_mut(id) {
                Some(more) => {
                    *first = more.remove(0);
                    if more.is_empty() {
                        self.more.remove(id);
                    }
                }
                None => drop(self.first.remove(id)),
            }
        } else if let Some(more) = self.more.get_mut(id) {
            if let Ok(at) = more.binary_search_by(|k| (**k).cmp(key)) {
                more.remove(at);
            }
            if more.is_empty() {
                self.more.remove(id);
            }
        }
    }

    /// How many keys define `id`.
    pub(super) fn count(&self, id: &Identity) -> usize {
        usize::from(self.first.contains_key(id)) + self.more.get(id).map_or(0, Vec::len)
    }

    /// The least key defining `id`.
    pub(super) fn first(&self, id: &Identity) -> Option<&Key> {
        self.first.get(id)
    }

    /// Every key defining `id`, in key order.
    pub(super) fn keys<'a>(&'a self, id: &Identity) -> impl Iterator<Item = &'a Key> + 'a {
        self.first.get(id).into_iter().chain(self.more.get(id).into_iter().flatten())
    }

    /// Build the map again from its sorted entries: full tree nodes (after a re-list, which
    /// inserts in key order and leaves them half empty).
    pub(super) fn compact(&mut self) {
        self.first = std::mem::take(&mut self.first).into_iter().collect();
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::Arc;

    use proptest::prelude::*;

    use super::Claims;
    use crate::model::Kind;

    proptest! {
        /// Random claims and releases of a few identities by a few keys (a key's first claim,
        /// a key that sorts before the first, the first released while others stand) read
        /// back as a map of sorted key sets does, before and after compacting.
        #[test]
        fn claims_read_as_sorted_key_sets(ops in proptest::collection::vec((any::<bool>(), 0u8..3, 0u8..4), 0..60)) {
            let mut claims = Claims::default();
            let mut model: BTreeMap<(Kind, Arc<str>), BTreeSet<Arc<str>>> = BTreeMap::new();
            for (i, (add, id, key)) in ops.into_iter().enumerate() {
                let id = (Kind::IpamBlock, Arc::<str>::from(format!("b{id}")));
                let key: Arc<str> = Arc::from(format!("/k{key}"));
                if add {
                    claims.add(&id, &key);
                    model.entry(id.clone()).or_default().insert(key);
                } else {
                    claims.remove(&id, &key);
                    if let Some(keys) = model.get_mut(&id) {
                        keys.remove(&key);
                        if keys.is_empty() {
                            model.remove(&id);
                        }
                    }
                }
                if i % 7 == 0 {
                    claims.compact();
                }
                for n in 0..3u8 {
                    let id = (Kind::IpamBlock, Arc::<str>::from(format!("b{n}")));
                    let want: Vec<&Arc<str>> = model.get(&id).map(|k| k.iter().collect()).unwrap_or_default();
                    prop_assert_eq!(claims.keys(&id).collect::<Vec<_>>(), want.clone());
                    prop_assert_eq!(claims.count(&id), want.len());
                    prop_assert_eq!(claims.first(&id), want.first().copied());
                }
                prop_assert!(claims.more.values().all(|m| !m.is_empty()));
            }
        }
    }
}
