//! Unit tests of `dirty.rs`.

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
    /// The first n keys of the set (a write pass's chunk written in full).
    RemoveFront(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let keys = || proptest::collection::vec(0u16..300, 0..120);
    prop_oneof![
        1 => (0u16..300).prop_map(Op::Insert),
        1 => (0u16..300).prop_map(Op::Remove),
        1 => keys().prop_map(Op::Extend),
        3 => keys().prop_map(Op::AddSorted),
        3 => keys().prop_map(Op::RemoveAll),
        3 => (0usize..40).prop_map(Op::RemoveFront),
    ]
}

proptest! {
    /// Any sequence of operations answers and ends exactly as a `BTreeSet` does, in
    /// whichever form the keys are held at each step, and counts every step that took a key
    /// out.
    #[test]
    fn answers_exactly_as_a_btreeset(ops in proptest::collection::vec(op(), 1..40)) {
        let (mut dirty, mut model) = (DirtyKeys::default(), BTreeSet::new());
        for (i, op) in ops.into_iter().enumerate() {
            // A snapshot (the write pass's) keeps the keys of its moment through any change;
            // every other step changes the set with no snapshot out.
            let before = (i % 2 == 0).then(|| (dirty.snapshot(), model.iter().copied().collect::<Vec<_>>()));
            let (removals, model_before) = (dirty.removals(), model.clone());
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
                Op::RemoveFront(n) => {
                    let gone: Vec<RouteKey> = model.iter().take(n).copied().collect();
                    dirty.remove_all(gone.clone());
                    for k in &gone {
                        model.remove(k);
                    }
                }
            }
            prop_assert_eq!(dirty.len(), model.len());
            prop_assert!(dirty.iter().eq(model.iter()));
            for i in (0u16..300).step_by(7) {
                prop_assert_eq!(dirty.contains(&key(i)), model.contains(&key(i)), "key {}", i);
            }
            // A key that left shows in the removal count.
            if !model_before.is_subset(&model) {
                prop_assert_ne!(dirty.removals(), removals);
            }
            prop_assert_eq!(&*dirty.snapshot(), &model.iter().copied().collect::<Vec<_>>());
            if let Some((before, model_before)) = before {
                prop_assert_eq!(&*before, &model_before);
            }
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
    assert_eq!((dirty.front().len(), dirty.tree.len()), (140, 0));
    assert!(dirty.remove(&key(10)));
    assert_eq!((dirty.front().len(), dirty.tree.len()), (0, 139));
    assert_eq!(dirty.tree.first(), Some(&key(11)));
    // Removing every key (the end of a cold start's write pass) from either form.
    dirty.remove_all((0..150).map(key).collect());
    assert_eq!(dirty.len(), 0);
    let mut sorted = DirtyKeys::default();
    sorted.add_sorted((0..3000).map(key).collect());
    sorted.remove_all((0..3000).rev().map(key).collect());
    assert_eq!((sorted.len(), sorted.iter().count()), (0, 0));
}

/// A cold start's write pass: the snapshot is taken, the written chunks leave the front
/// of the set in key order without a copy, a chunk with a key left behind (a failed
/// write) makes the rest a vector of its own, and the snapshot never changes.
#[test]
fn written_chunks_leave_the_front_without_a_copy() {
    let mut dirty = DirtyKeys::default();
    dirty.add_sorted((0..3000).map(key).collect());
    let snapshot = dirty.snapshot();
    for chunk in (0..1000).collect::<Vec<u16>>().chunks(128) {
        dirty.remove_all(chunk.iter().rev().map(|i| key(*i)).collect());
    }
    assert!(Arc::ptr_eq(&dirty.sorted, &snapshot.keys), "chunks taken off the front copy nothing");
    assert_eq!((dirty.start, dirty.len(), dirty.iter().next()), (1000, 2000, Some(&key(1000))));
    // Key 1000's write failed: it stays, the rest of the chunk goes.
    dirty.remove_all((1001..1128).map(key).collect());
    assert!(!Arc::ptr_eq(&dirty.sorted, &snapshot.keys));
    assert_eq!((dirty.start, dirty.len()), (0, 1873));
    assert!(dirty.iter().copied().eq(std::iter::once(key(1000)).chain((1128..3000).map(key))));
    assert!(snapshot.iter().copied().eq((0..3000).map(key)), "the snapshot keeps its keys");
    dirty.remove_all((1000..3000).map(key).collect());
    assert_eq!((dirty.len(), dirty.sorted.len(), dirty.start), (0, 0, 0));
}
