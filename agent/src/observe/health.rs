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
    first_apply_done: AtomicBool,
    watchers: Mutex<BTreeMap<&'static str, WatcherState>>,
    /// One more line per running watcher about how it works (the route watch: how writers
    /// are named), shown under its state.
    watcher_notes: Mutex<BTreeMap<&'static str, String>>,
    /// Whether the datastore view is synced, with the lines about the view for `/readyz`
    /// (why not synced; invalid inputs and objects, frozen ground, held deletions) shown after
    /// the first two lines. One lock for both, so a reader never sees "not synced" with the
    /// notes of the synced view before it (or the reverse).
    view: Mutex<ViewState>,
    /// Devices the last apply found missing or down, with how many desired routes wait for
    /// each (`tunl0` renamed or not created, the host NIC gone).
    waiting_devices: Mutex<BTreeMap<String, usize>>,
    /// Lines about the policy rules of routewarden's table (`dataplane::table_rule`): a family
    /// no rule selects, rules that select only some traffic, a rule that could not be made.
    table_rule_lines: Mutex<Vec<String>>,
}

/// The datastore half of `/readyz`: written together by [`Health::set_view`].
#[derive(Debug, Default)]
struct ViewState {
    synced: bool,
    notes: Vec<String>,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Health {
    /// Record that the main loop made progress now.
    pub fn progress(&self) {
        self.last_progress_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// Set whether the datastore view is synced and the lines `/readyz` shows about it (at
    /// most a few; each one line), in one step: `/readyz` shows both from the same moment.
    pub fn set_view(&self, synced: bool, notes: Vec<String>) {
        if let Ok(mut v) = self.view.lock() {
            *v = ViewState { synced, notes };
        }
    }

    /// Set the devices the last apply found missing or down (empty: none).
    pub fn set_waiting_devices(&self, waiting: &BTreeMap<String, usize>) {
        if let Ok(mut w) = self.waiting_devices.lock() {
            w.clone_from(waiting);
        }
    }

    /// Set the lines about the policy rules of routewarden's table (empty: none to show). They
    /// never make the agent unready: the routes are programmed as asked, and a rollout that
    /// adds the rule after the agent is ready would otherwise wait on itself.
    pub fn set_table_rule_lines(&self, lines: Vec<String>) {
        if let Ok(mut l) = self.table_rule_lines.lock() {
            *l = lines;
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

    /// Set (or clear, `None`) the line `/readyz` shows under a running watcher's state, as
    /// `bpf <name>: <note>`.
    pub fn set_watcher_note(&self, name: &'static str, note: Option<String>) {
        if let Ok(mut w) = self.watcher_notes.lock() {
            match note {
                Some(n) => w.insert(name, n),
                None => w.remove(name),
            };
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
        let applied = self.first_apply_done.load(Ordering::Relaxed);
        let (synced, notes) = self.view.lock().map(|v| (v.synced, v.notes.clone())).unwrap_or_default();
        let mut body = format!(
            "datastore: {}\nroutes: {}\n",
            if synced { "synced" } else { "not synced" },
            if applied { "first apply done" } else { "first apply pending" }
        );
        for line in &notes {
            let _ = writeln!(body, "{line}");
        }
        if let Ok(w) = self.waiting_devices.lock() {
            for (dev, n) in w.iter() {
                let _ = writeln!(body, "device {}: missing or down; {n} cluster route(s) wait for it", crate::text::escape(dev));
            }
        }
        if let Ok(l) = self.table_rule_lines.lock() {
            for line in l.iter() {
                let _ = writeln!(body, "{line}");
            }
        }
        if let (Ok(w), Ok(notes)) = (self.watchers.lock(), self.watcher_notes.lock()) {
            for (name, state) in w.iter() {
                let _ = match state {
                    WatcherState::Ready => writeln!(body, "bpf {name}: ready"),
                    WatcherState::Degraded(why) => writeln!(body, "bpf {name}: degraded: {why}"),
                };
                if let (WatcherState::Ready, Some(note)) = (state, notes.get(name)) {
                    let _ = writeln!(body, "bpf {name}: {note}");
                }
            }
        }
        (synced && applied, body)
    }
}

#[cfg(test)]
mod tests;
