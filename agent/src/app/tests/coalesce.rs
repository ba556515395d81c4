use std::sync::Arc;

use tokio::sync::mpsc;

use crate::app::newest_adjacent;
use crate::datastore::{DatastoreEvent, Snapshot};

fn snap(inputs: usize) -> DatastoreEvent {
    DatastoreEvent::Snapshot(Snapshot { cluster: Arc::default(), object_errors: Vec::new(), load_errors: Vec::new(), inputs, settled: true })
}

fn label(ev: &DatastoreEvent) -> String {
    match ev {
        DatastoreEvent::Snapshot(s) => format!("snapshot {}", s.inputs),
        DatastoreEvent::Synced => "synced".into(),
        DatastoreEvent::Unsynced { reason } => format!("unsynced {reason}"),
        DatastoreEvent::LoadFailed(_) => "load-failed".into(),
    }
}

/// Adjacent snapshots collapse to the newest; a snapshot never moves past `Synced` or
/// `Unsynced`; nothing is lost or reordered otherwise.
#[test]
fn only_the_newest_of_adjacent_snapshots_is_handled_and_order_is_kept() {
    let (tx, mut rx) = mpsc::channel(16);
    for ev in [snap(2), snap(3), DatastoreEvent::Synced, snap(4), DatastoreEvent::Unsynced { reason: "x".into() }, snap(5), snap(6)] {
        tx.try_send(ev).unwrap();
    }
    let mut handled = Vec::new();
    let mut first = Some(snap(1));
    while let Some(ev) = first.take().or_else(|| rx.try_recv().ok()) {
        handled.push(newest_adjacent(ev, &mut rx).iter().map(label).collect::<Vec<_>>());
    }
    assert_eq!(handled, vec![vec!["snapshot 3", "synced"], vec!["snapshot 4", "unsynced x"], vec!["snapshot 6"]],);
    // A non-snapshot first is handled alone, whatever waits behind it.
    tx.try_send(snap(7)).unwrap();
    assert_eq!(newest_adjacent(DatastoreEvent::Synced, &mut rx).iter().map(label).collect::<Vec<_>>(), vec!["synced"]);
    assert_eq!(rx.try_recv().map(|e| label(&e)).ok(), Some("snapshot 7".to_owned()));
}
