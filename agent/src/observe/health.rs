//! Liveness and readiness state shared between the app loop and the HTTP server.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// State of one BPF watcher, as `/readyz` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatcherState {
    /// Loaded, attached and delivering.
    Ready,
    /// Not running; the agent carries on without it. The string says why.
    Degraded(String),
}

/// What `/healthz` and `/readyz` answer from.
#[derive(Debug, Default)]
pub struct Health {
    /// Unix time (ms) of the last main-loop iteration.
    last_progress_ms: AtomicU64,
    datastore_synced: AtomicBool,
    first_apply_done: AtomicBool,
    watchers: Mutex<BTreeMap<&'static str, WatcherState>>,
    /// Lines about the view for `/readyz` (why not synced; invalid inputs and objects,
    /// frozen ground, held deletions), shown after the first two lines.
    notes: Mutex<Vec<String>>,
    /// Devices the last apply found missing or down, with how many desired routes wait for
    /// each (`tunl0` renamed or not created, the host NIC gone).
    waiting_devices: Mutex<BTreeMap<String, usize>>,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Health {
    /// Record that the main loop made progress now.
    pub fn progress(&self) {
        self.last_progress_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// Set whether the datastore view is synced.
    pub fn set_datastore_synced(&self, synced: bool) {
        self.datastore_synced.store(synced, Ordering::Relaxed);
    }

    /// Set the lines `/readyz` shows about the view (at most a few; each one line).
    pub fn set_notes(&self, notes: Vec<String>) {
        if let Ok(mut n) = self.notes.lock() {
            *n = notes;
        }
    }

    /// Set the devices the last apply found missing or down (empty: none).
    pub fn set_waiting_devices(&self, waiting: &BTreeMap<String, usize>) {
        if let Ok(mut w) = self.waiting_devices.lock() {
            w.clone_from(waiting);
        }
    }

    /// Record that the first route apply finished.
    pub fn set_first_apply_done(&self) {
        self.first_apply_done.store(true, Ordering::Relaxed);
    }

    /// Set the state of a BPF watcher (`tc_count`, ...).
    pub fn set_watcher(&self, name: &'static str, state: WatcherState) {
        if let Ok(mut w) = self.watchers.lock() {
            w.insert(name, state);
        }
    }

    /// Liveness: the main loop made progress within `max_age`.
    pub fn live(&self, max_age: Duration) -> bool {
        let last = self.last_progress_ms.load(Ordering::Relaxed);
        last != 0 && now_ms().saturating_sub(last) <= u64::try_from(max_age.as_millis()).unwrap_or(u64::MAX)
    }

    /// Readiness: `(ready, body)`. Ready means the datastore is synced and the first apply is
    /// done; degraded BPF watchers are listed but do not make the agent unready (it still
    /// programs routes).
    pub fn ready(&self) -> (bool, String) {
        let synced = self.datastore_synced.load(Ordering::Relaxed);
        let applied = self.first_apply_done.load(Ordering::Relaxed);
        let mut body = format!(
            "datastore: {}\nroutes: {}\n",
            if synced { "synced" } else { "not synced" },
            if applied { "first apply done" } else { "first apply pending" }
        );
        if let Ok(n) = self.notes.lock() {
            for line in n.iter() {
                let _ = writeln!(body, "{line}");
            }
        }
        if let Ok(w) = self.waiting_devices.lock() {
            for (dev, n) in w.iter() {
                let _ = writeln!(body, "device {}: missing or down; {n} cluster route(s) wait for it", crate::text::escape(dev));
            }
        }
        if let Ok(w) = self.watchers.lock() {
            for (name, state) in w.iter() {
                let _ = match state {
                    WatcherState::Ready => writeln!(body, "bpf {name}: ready"),
                    WatcherState::Degraded(why) => writeln!(body, "bpf {name}: degraded: {why}"),
                };
            }
        }
        (synced && applied, body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_needs_sync_and_first_apply() {
        let h = Health::default();
        assert!(!h.ready().0);
        h.set_datastore_synced(true);
        assert!(!h.ready().0);
        h.set_first_apply_done();
        h.set_watcher("tc_count", WatcherState::Degraded("no BPF object".into()));
        let (ready, body) = h.ready();
        assert!(ready);
        assert_eq!(body, "datastore: synced\nroutes: first apply done\nbpf tc_count: degraded: no BPF object\n");
        h.set_datastore_synced(false);
        assert_eq!(h.ready(), (false, "datastore: not synced\nroutes: first apply done\nbpf tc_count: degraded: no BPF object\n".to_string()));
    }

    #[test]
    fn missing_devices_are_listed_until_the_next_apply_finds_them() {
        let h = Health::default();
        h.set_datastore_synced(true);
        h.set_first_apply_done();
        h.set_waiting_devices(&BTreeMap::from([("ipip0".to_owned(), 3)]));
        assert_eq!(
            h.ready(),
            (true, "datastore: synced\nroutes: first apply done\ndevice ipip0: missing or down; 3 cluster route(s) wait for it\n".to_owned())
        );
        h.set_waiting_devices(&BTreeMap::new());
        assert_eq!(h.ready().1, "datastore: synced\nroutes: first apply done\n");
    }

    #[test]
    fn liveness_follows_progress() {
        let h = Health::default();
        assert!(!h.live(Duration::from_mins(1)));
        h.progress();
        assert!(h.live(Duration::from_mins(1)));
    }
}
