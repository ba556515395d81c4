//! The file datastore: one multi-document YAML file, or a directory of `*.yaml` / `*.yml` /
//! `*.json` files (hidden entries skipped, so a Kubernetes ConfigMap mount with its `..data`
//! symlinks works), each holding objects or `List`s as `calicoctl get -o yaml` and
//! `kubectl get -o yaml` print them. Reloaded on filesystem notifications (debounced) and on a
//! periodic rescan as a safety net.
//!
//! Deletions need positive evidence, so ordinary mistakes lose nothing:
//!
//! | what the tree shows | what the datastore does |
//! |---|---|
//! | a file that is empty, whitespace or comments only | invalid (`empty`); its last good content is kept. `kind: List` with `items: []` is how a file says it is empty on purpose |
//! | a file that is not YAML, nested too deep, or over the size limit | invalid; last good content kept; the CIDRs its text mentions are frozen |
//! | an object that does not validate | that object's last good version is kept (per object, by kind and name) |
//! | any change (an edit, a truncation at an item or field boundary, a slow writer's half-written file) | applied at once, but snapshots say `settled: false` until the tree has been stable for the settle period: the app deletes no route meanwhile, so a transient state can add or change routes but never remove one |
//! | a file that vanished, a dangling symlink, an emptied or replaced directory | last good content kept and the datastore **unsynced**, naming the paths, until the tree has been stable for the settle period (30 s); then the removal is applied |
//! | a file that is there but cannot be read (EACCES, EIO, not UTF-8) | last good content kept for as long as it stays so; synced; the plan holds every deletion and rewrite meanwhile |
//! | a FIFO, socket or device where a file was expected | refused without being opened |
//! | an input that never loaded | reported with `never_loaded`: the app holds every deletion while it is broken |
//!
//! A file caught mid-write is re-read until two reads agree (50 ms apart), so a writer that
//! truncates first and writes later is not seen half-done in the common case; a slow writer
//! that leaves an empty file is refused by the empty-file rule.
//!
//! The parts: `loader.rs` is the synchronous core (per-file and per-object last good state,
//! the settle period, what to report) with the options it applies ([`FileOptions`]);
//! `read.rs` lists the inputs and reads one file, bounded and settled. This file holds the
//! datastore handle and its watch loop (notifications, rescans, deadlines).

mod loader;
mod read;

#[cfg(test)]
mod tests;

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use notify::event::{AccessKind, AccessMode, EventKind};
use notify::{RecursiveMode, Watcher as _};
use tokio::sync::mpsc;

pub(crate) use loader::Loader;
pub use loader::{FileOptions, DEFAULT_MAX_FILE_SIZE};

use super::error::DatastoreError;
use super::event::{Datastore, DatastoreEvent, Snapshot};

/// Default debounce window for filesystem notifications.
pub const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(300);
/// How long a changed file must stay unchanged before it is read as the new state.
const READ_SETTLE: Duration = Duration::from_millis(50);
/// Default periodic rescan (catches changes notifications miss, e.g. on network filesystems).
pub const DEFAULT_RESCAN: Duration = Duration::from_secs(30);

/// A datastore backed by a file or a directory of files.
#[derive(Debug, Clone)]
pub struct FileDatastore {
    path: PathBuf,
    debounce: Duration,
    rescan: Duration,
    options: FileOptions,
    /// Scans of the inputs [`Datastore::run`] made so far (each reads every input file).
    scans: Arc<AtomicU64>,
}

impl FileDatastore {
    /// A datastore reading `path` (a file or a directory).
    pub fn new(path: impl Into<PathBuf>) -> FileDatastore {
        FileDatastore { path: path.into(), debounce: DEFAULT_DEBOUNCE, rescan: DEFAULT_RESCAN, options: FileOptions::default(), scans: Arc::default() }
    }

    /// Debounce window for notifications (default 300 ms).
    #[must_use]
    pub fn with_debounce(mut self, debounce: Duration) -> FileDatastore {
        self.debounce = debounce;
        self
    }

    /// Periodic rescan interval (default 30 s).
    #[must_use]
    pub fn with_rescan_interval(mut self, rescan: Duration) -> FileDatastore {
        self.rescan = rescan;
        self
    }

    /// Input handling: settle period, size limit, YAML limits.
    #[must_use]
    pub fn with_options(mut self, options: FileOptions) -> FileDatastore {
        self.options = options;
        self
    }

    /// One-shot load (for `explain`, `audit`, `bird-filter`).
    ///
    /// Errors: [`DatastoreError::Io`] when `path` cannot be read (or is not a regular file or
    /// directory); [`DatastoreError::Load`] with every file (and line) that is not valid
    /// YAML, is empty, too large or not a regular file (no partial snapshot is returned).
    /// Object errors do not fail the load; they are in [`Snapshot::object_errors`].
    pub fn load(path: impl AsRef<Path>) -> Result<Snapshot, DatastoreError> {
        let mut loader = Loader::new(path.as_ref().to_path_buf(), FileOptions::default(), Duration::ZERO);
        loader.scan(Instant::now()).map_err(|source| DatastoreError::Io { path: path.as_ref().to_path_buf(), source })?;
        let errors = loader.load_errors();
        if !errors.is_empty() {
            return Err(DatastoreError::Load { errors });
        }
        Ok(loader.snapshot())
    }

    /// Spawn [`Datastore::run`] on the current Tokio runtime.
    pub fn spawn(self, tx: mpsc::Sender<DatastoreEvent>) -> tokio::task::JoinHandle<Result<(), DatastoreError>> {
        tokio::spawn(self.run(tx))
    }

    /// The directory notifications are watched on: the directory itself, or a file's parent
    /// (editors and ConfigMap updates replace files by rename, which a file watch misses).
    fn watch_dir(&self) -> PathBuf {
        if self.path.is_dir() {
            self.path.clone()
        } else {
            self.path.parent().filter(|p| !p.as_os_str().is_empty()).map_or_else(|| PathBuf::from("."), Path::to_path_buf)
        }
    }
}

/// Whether a filesystem notification can mean that an input changed. inotify (through
/// `notify`) also reports every open of a file in the watched directory and every close
/// without writing (`IN_OPEN`, `IN_CLOSE_NOWRITE`), among them the datastore's own reads: each
/// rescan's read brought the next rescan, and an idle agent read and hashed its inputs every
/// debounce window for ever (1.2 % of a core at 10,000 routes, `bench agent-footprint`). A
/// close after writing (`IN_CLOSE_WRITE`) is a change.
fn is_change(kind: EventKind) -> bool {
    !matches!(kind, EventKind::Access(AccessKind::Open(_) | AccessKind::Read | AccessKind::Close(AccessMode::Read)))
}

/// `(device, inode)` of a path, following symlinks.
fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

impl Datastore for FileDatastore {
    fn describe(&self) -> String {
        format!("file:{}", self.path.display())
    }

    async fn run(self, tx: mpsc::Sender<DatastoreEvent>) -> Result<(), DatastoreError> {
        let (ntx, mut nrx) = mpsc::unbounded_channel::<()>();
        let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| match res {
            Ok(ev) if !is_change(ev.kind) => {}
            Ok(_) => {
                let _ = ntx.send(());
            }
            Err(e) => {
                tracing::warn!(error = %e, "datastore: filesystem notification error; rescanning");
                let _ = ntx.send(());
            }
        })
        .map_err(|source| DatastoreError::Watch { path: self.path.clone(), source })?;
        // The watched directory and its (device, inode): a directory replaced under the same
        // name (`mv dir x; mkdir dir`) is watched again.
        let mut watching: Option<(PathBuf, Option<(u64, u64)>)> = None;
        let mut loader = Loader::new(self.path.clone(), self.options, READ_SETTLE);
        let mut ticker = tokio::time::interval(self.rescan);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let dir = self.watch_dir();
            let id = identity(&dir);
            if watching.as_ref().is_none_or(|(d, i)| *d != dir || *i != id) {
                if let Some((old, _)) = watching.take() {
                    let _ = watcher.unwatch(&old);
                }
                match watcher.watch(&dir, RecursiveMode::NonRecursive) {
                    Ok(()) => watching = Some((dir, id)),
                    Err(e) => tracing::warn!(dir = %dir.display(), error = %e, "datastore: cannot watch yet; relying on rescans"),
                }
            }
            self.scans.fetch_add(1, Ordering::Relaxed);
            let (back, events) = tokio::task::spawn_blocking(move || {
                let events = loader.rescan_at(Instant::now());
                (loader, events)
            })
            .await
            .map_err(|e| DatastoreError::Io { path: self.path.clone(), source: std::io::Error::other(e) })?;
            loader = back;
            for ev in events {
                if tx.send(ev).await.is_err() {
                    return Ok(());
                }
            }
            let deadline = loader.next_deadline().map(tokio::time::Instant::from_std);
            tokio::select! {
                () = tx.closed() => return Ok(()),
                got = nrx.recv() => {
                    if got.is_none() {
                        return Ok(());
                    }
                    // Coalesce a burst into one rescan: wait out the debounce window, then
                    // take every notification that came meanwhile.
                    tokio::time::sleep(self.debounce).await;
                    while nrx.try_recv().is_ok() {}
                }
                _ = ticker.tick() => {}
                () = tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)), if deadline.is_some() => {}
            }
        }
    }
}
