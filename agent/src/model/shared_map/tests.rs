use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

/// One edit of both maps.
#[derive(Clone, Debug)]
enum Edit {
    Insert(u16, u32),
    Remove(u16),
    /// Take a copy (later edits must not show in it), kept to the end.
    Copy,
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        4 => (0u16..600, any::<u32>()).prop_map(|(k, v)| Edit::Insert(k, v)),
        3 => (0u16..600).prop_map(Edit::Remove),
        1 => Just(Edit::Copy),
    ]
}

fn assert_same(shared: &SharedMap<u16, u32>, model: &BTreeMap<u16, u32>) {
    assert_eq!(shared.len(), model.len());
    assert_eq!(shared.iter().map(|(k, v)| (*k, *v)).collect::<Vec<_>>(), model.iter().map(|(k, v)| (*k, *v)).collect::<Vec<_>>());
    assert_eq!(shared.iter().rev().map(|(k, _)| *k).collect::<Vec<_>>(), model.keys().rev().copied().collect::<Vec<_>>());
    // The exact size at every step, taking from both ends in turn.
    let mut it = shared.iter();
    for step in 0..=model.len() {
        assert_eq!(it.size_hint(), (model.len() - step, Some(model.len() - step)), "size after {step}");
        let _ = if step % 2 == 0 { it.next() } else { it.next_back() };
    }
    assert_eq!((it.len(), it.next(), it.next_back()), (0, None, None));
    for k in 0..600 {
        assert_eq!(shared.get(&k), model.get(&k), "get {k}");
    }
    for c in &shared.chunks {
        assert!(!c.is_empty() && c.len() <= MAX_CHUNK, "chunk of {}", c.len());
    }
    assert!(shared.chunks.windows(2).all(|w| w[0].last().map(|e| e.0) < w[1].first().map(|e| e.0)), "chunks out of order");
}

proptest! {
    /// Against `BTreeMap` over random edits, from a bulk build: same answers to every read,
    /// chunks within bounds and in order, and every copy taken keeps what it had.
    #[test]
    fn reads_as_a_btreemap_and_copies_keep_their_entries(start in proptest::collection::vec((0u16..600, any::<u32>()), 0..400), edits in proptest::collection::vec(edit(), 0..400)) {
        let mut model: BTreeMap<u16, u32> = start.iter().copied().collect();
        let mut shared: SharedMap<u16, u32> = start.into_iter().collect();
        assert_same(&shared, &model);
        let mut copies = Vec::new();
        for e in edits {
            match e {
                Edit::Insert(k, v) => prop_assert_eq!(shared.insert(k, v), model.insert(k, v)),
                Edit::Remove(k) => prop_assert_eq!(shared.remove(&k), model.remove(&k)),
                Edit::Copy => copies.push((shared.clone(), model.clone())),
            }
            assert_same(&shared, &model);
        }
        for (s, m) in &copies {
            assert_same(s, m);
            prop_assert_eq!(s == &shared, m == &model);
        }
        // Equal entries in other chunks (built in one piece) are equal; one value off is not.
        let rebuilt: SharedMap<u16, u32> = model.iter().map(|(k, v)| (*k, *v)).collect();
        prop_assert!(rebuilt == shared);
        if let Some((k, v)) = model.iter().next() {
            let mut off = rebuilt.clone();
            off.insert(*k, v.wrapping_add(1));
            prop_assert!(off != shared);
        }
    }

    /// `diff` reports exactly the names whose entry differs, in order, with both sides,
    /// between a map and its edited copy.
    #[test]
    fn diff_reports_exactly_the_changed_names(start in proptest::collection::vec((0u16..600, 0u32..4), 0..400), edits in proptest::collection::vec(edit(), 0..60)) {
        let name = |k: u16| -> Arc<str> { Arc::from(format!("{k:04}")) };
        let before: SharedMap<Arc<str>, Arc<u32>> = start.into_iter().map(|(k, v)| (name(k), Arc::new(v))).collect();
        let mut after = before.clone();
        for e in edits {
            match e {
                // Values 0..4: many a put is of an equal value, in a fresh allocation.
                Edit::Insert(k, v) => drop(after.insert(name(k), Arc::new(v % 4))),
                Edit::Remove(k) => drop(after.remove(name(k).as_ref())),
                Edit::Copy => {}
            }
        }
        let mut got = Vec::new();
        before.diff(&after, |k, x, y| got.push((k.to_string(), x.map(|v| **v), y.map(|v| **v))));
        let (b, a): (BTreeMap<String, u32>, BTreeMap<String, u32>) =
            (before.iter().map(|(k, v)| (k.to_string(), **v)).collect(), after.iter().map(|(k, v)| (k.to_string(), **v)).collect());
        let names: std::collections::BTreeSet<&String> = b.keys().chain(a.keys()).collect();
        let want: Vec<_> = names.into_iter().filter(|n| b.get(*n) != a.get(*n)).map(|n| (n.clone(), b.get(n).copied(), a.get(n).copied())).collect();
        prop_assert_eq!(got, want);
    }
}

/// A copy shares every chunk; one insert into a 100,000-entry map copies one chunk, and the
/// copy taken before still holds what it held.
#[test]
fn a_change_copies_one_chunk() {
    let mut map: SharedMap<u32, u32> = (0..100_000u32).map(|k| (k * 2, k)).collect();
    assert_eq!(map.chunk_count(), 100_000 / CHUNK + 1);
    let before = map.clone();
    assert_eq!(map.shared_chunks(&before), map.chunk_count());
    map.insert(5_001, 7);
    assert_eq!(map.shared_chunks(&before), map.chunk_count() - 1);
    assert_eq!((before.get(&5_001), map.get(&5_001), before.len() + 1), (None, Some(&7), map.len()));
}

/// A map built one insert at a time (a datastore's first list) holds what a bulk build holds:
/// in key order, full chunks of [`CHUNK`] with no spare capacity; in reverse order (every
/// insert splits the first chunk in time), no chunk keeps more than twice the room its
/// entries need.
#[test]
fn a_map_built_by_inserts_keeps_no_spare_capacity() {
    let mut ascending = SharedMap::default();
    for k in 0..10_000u32 {
        assert_eq!(ascending.insert(k, k), None);
    }
    assert_eq!(ascending.chunks.len(), 10_000usize.div_ceil(CHUNK));
    for c in &ascending.chunks[..ascending.chunks.len() - 1] {
        assert_eq!((c.len(), c.capacity()), (CHUNK, CHUNK));
    }
    let mut descending = SharedMap::default();
    for k in (0..10_000u32).rev() {
        descending.insert(k, k);
    }
    assert_eq!(descending.iter().map(|(k, _)| *k).collect::<Vec<_>>(), (0..10_000).collect::<Vec<_>>());
    for c in &descending.chunks {
        assert!(c.capacity() <= 2 * c.len().max(CHUNK / 2), "a chunk of {} entries keeps room for {}", c.len(), c.capacity());
    }
    // Ascending inserts into a map that also holds smaller keys append too.
    let mut mixed: SharedMap<u32, u32> = (0..1_000).map(|k| (k * 2, k)).collect();
    for k in 2_000..3_000 {
        mixed.insert(k, k);
    }
    assert_eq!(mixed.len(), 2_000);
    assert!(mixed.chunks.iter().all(|c| c.capacity() <= MAX_CHUNK), "{:?}", mixed.chunks.iter().map(|c| c.capacity()).collect::<Vec<_>>());
}
