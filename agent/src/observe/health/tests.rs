use super::*;

#[test]
fn readiness_needs_sync_and_first_apply() {
    let h = Health::default();
    assert!(!h.ready().0);
    h.set_view(true, Vec::new());
    assert!(!h.ready().0);
    h.set_first_apply_done();
    h.set_watcher("tc_count", WatcherState::Degraded("no BPF object".into()));
    let (ready, body) = h.ready();
    assert!(ready);
    assert_eq!(body, "datastore: synced\nroutes: first apply done\nbpf tc_count: degraded: no BPF object\n");
    h.set_view(false, Vec::new());
    assert_eq!(h.ready(), (false, "datastore: not synced\nroutes: first apply done\nbpf tc_count: degraded: no BPF object\n".to_string()));
}

/// A running watcher's note (how the route watch names writers) is the line under its
/// state, and only while it runs.
#[test]
fn a_running_watchers_note_follows_its_state() {
    let h = Health::default();
    h.set_view(true, Vec::new());
    h.set_first_apply_done();
    h.set_watcher("route_watch", WatcherState::Ready);
    h.set_watcher_note("route_watch", Some("socket-filter: writers named by process in the kernel".into()));
    assert_eq!(
        h.ready().1,
        "datastore: synced\nroutes: first apply done\nbpf route_watch: ready\nbpf route_watch: socket-filter: writers named by process in the kernel\n"
    );
    h.set_watcher("route_watch", WatcherState::Degraded("detached".into()));
    assert_eq!(h.ready().1, "datastore: synced\nroutes: first apply done\nbpf route_watch: degraded: detached\n");
    h.set_watcher("route_watch", WatcherState::Ready);
    h.set_watcher_note("route_watch", None);
    assert_eq!(h.ready().1, "datastore: synced\nroutes: first apply done\nbpf route_watch: ready\n");
}

#[test]
fn missing_devices_are_listed_until_the_next_apply_finds_them() {
    let h = Health::default();
    h.set_view(true, Vec::new());
    h.set_first_apply_done();
    h.set_waiting_devices(&BTreeMap::from([("ipip0".to_owned(), 3)]));
    assert_eq!(h.ready(), (true, "datastore: synced\nroutes: first apply done\ndevice ipip0: missing or down; 3 cluster route(s) wait for it\n".to_owned()));
    h.set_waiting_devices(&BTreeMap::new());
    assert_eq!(h.ready().1, "datastore: synced\nroutes: first apply done\n");
}

/// The app loop flips the view between synced and not synced while readers poll: every
/// body shows the flag with its own notes (the etcd lab test once read "not synced" with
/// the synced view's notes, when the flag and the notes were stored one after the other).
#[test]
fn readyz_never_mixes_the_flag_of_one_view_with_the_notes_of_another() {
    let h = std::sync::Arc::new(Health::default());
    let writer = {
        let h = h.clone();
        std::thread::spawn(move || {
            for _ in 0..20_000 {
                h.set_view(true, vec!["calico: 3.33".to_owned()]);
                h.set_view(false, vec!["not synced: etcd down".to_owned(), "calico: 3.33".to_owned()]);
            }
        })
    };
    let mut seen = std::collections::BTreeSet::new();
    while !writer.is_finished() {
        let body = h.ready().1;
        assert!(
            body == "datastore: synced\nroutes: first apply pending\ncalico: 3.33\n"
                || body == "datastore: not synced\nroutes: first apply pending\nnot synced: etcd down\ncalico: 3.33\n"
                || body == "datastore: not synced\nroutes: first apply pending\n",
            "{body}"
        );
        seen.insert(body);
    }
    writer.join().unwrap();
    assert!(!seen.is_empty());
}

#[test]
fn liveness_follows_progress() {
    let h = Health::default();
    assert!(!h.live(Duration::from_mins(1)));
    h.progress();
    assert!(h.live(Duration::from_mins(1)));
}
