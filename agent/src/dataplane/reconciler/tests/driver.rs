//! The driver (`dataplane::tasks::driver::run`) over the reconciler and the fake kernel: when
//! it applies.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::*;
use crate::dataplane::tasks::driver::{run, DataplaneCommand};
use crate::routes::RouteMap;

fn route_map(routes: &[ClusterRoute]) -> RouteMap {
    let mut map = RouteMap::new();
    for r in routes {
        map.insert(r.dst, Arc::new(r.clone()));
    }
    map
}

/// The first desired set is applied at once once the datastore is synced, whatever the
/// debounce (before that it waits as any burst); later sets wait for the debounce.
#[tokio::test]
async fn the_first_desired_set_is_applied_at_once_and_later_ones_are_debounced() {
    let (mut r, nl, _clock) = setup(None);
    r.set_datastore_synced(false);
    let (commands, cmd_rx) = mpsc::channel(16);
    let (_events, ev_rx) = mpsc::channel(16);
    let (rep_tx, mut reports) = mpsc::channel(16);
    let debounce = Duration::from_secs(30);
    let task = tokio::spawn(run(r, cmd_rx, ev_rx, rep_tx, debounce));
    // The reconciler's first resync is due at its start: one apply, nothing desired yet.
    let first = tokio::time::timeout(Duration::from_secs(5), reports.recv()).await.expect("the start-up resync").expect("a report");
    assert_eq!((first.resynced, first.writes), (true, 0), "{first:?}");
    let routes = cluster();
    // As the app sends them: the desired set, then whether the datastore is synced.
    commands.send(DataplaneCommand::SetDesired { routes: route_map(&routes), handovers: vec![] }).await.unwrap();
    commands.send(DataplaneCommand::SetDatastoreSynced(false)).await.unwrap();
    assert!(tokio::time::timeout(Duration::from_millis(300), reports.recv()).await.is_err(), "not synced: debounced");
    commands.send(DataplaneCommand::SetDatastoreSynced(true)).await.unwrap();
    let applied = tokio::time::timeout(Duration::from_secs(5), reports.recv()).await.expect("applied before the 30-s debounce").expect("a report");
    assert_eq!(applied.writes, routes.len() as u64, "{applied:?}");
    assert_eq!(nl.state().routes.values().filter(|r| r.protocol == 80).count(), routes.len());
    // A second set (one route fewer) waits for the debounce.
    commands.send(DataplaneCommand::SetDesired { routes: route_map(&routes[1..]), handovers: vec![] }).await.unwrap();
    assert!(tokio::time::timeout(Duration::from_millis(300), reports.recv()).await.is_err(), "a later set is debounced");
    drop(commands);
    task.await.unwrap();
}
