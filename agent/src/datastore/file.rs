//! The file datastore: one multi-document YAML file, or a directory of `*.yaml` / `*.yml` /
//! `*.json` files (hidden entries skipped, so a Kubernetes ConfigMap mount with its `..data`
//! symlinks works), each holding objects or `List`s as `calicoctl get -o yaml` and
//! `kubectl get -o yaml` print them. Reloaded on filesystem notifications (debounced) and on a
//! periodic rescan as a safety net.
//!
//! Deletions need positive evidence (issue 22), so ordinary mistakes lose nothing:
//!
//! | what the tree shows | what the datastore does |
//! |---|---|
//! | a file that is empty, whitespace or comments only | invalid (`empty`); its last good content is kept. `kind: List` with `items: []` is how a file says it is empty on purpose |
//! | a file that is not YAML, nested too deep, or over the size limit | invalid; last good content kept; the CIDRs its text mentions are frozen |
//! | an object that does not validate | that object's last good version is kept (per object, by kind and name) |
//! | any change (an edit, a truncation at an item or field boundary, a slow writer's half-written file) | applied at once, but snapshots say `settled: false` until the tree has been stable for the settle period: the app deletes no route meanwhile, so a transient state can add or change routes but never remove one |
//! | a file that vanished, a dangling symlink, an unreadable file, an emptied or replaced directory | last good content kept and the datastore **unsynced**, naming the paths, until the tree has been stable for the settle period (30 s); then the removal is applied |
//! | a FIFO, socket or device where a file was expected | refused without being opened |
//! | an input that never loaded | reported with `never_loaded`: the app holds every deletion while it is broken |
//!
//! A file caught mid-write is re-read until two reads agree (50 ms apart), so a writer that
//! truncates first and writes later is not seen half-done in the common case; a slow writer
//! that leaves an empty file is refused by the empty-file rule.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::io::Read as _;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use notify::RecursiveMode;
use notify_debouncer_mini::{new_debouncer, DebounceEventResult};
use tokio::sync::mpsc;

use super::{Datastore, DatastoreError, DatastoreEvent, LoadError, LoadErrorKind, ObjectError, Snapshot};
use crate::model::{cidrs_in_text, ClusterBuilder, Kind, ParsedObject, ParsedObjects, YamlLimits};

/// Default debounce window for filesystem notifications.
pub const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(300);
/// How long a changed file must stay unchanged before it is read as the new state.
const READ_SETTLE: Duration = Duration::from_millis(50);
/// Default periodic rescan (catches changes notifications miss, e.g. on network filesystems).
pub const DEFAULT_RESCAN: Duration = Duration::from_secs(30);
/// Default settle period: how long the tree must stay unchanged before a vanished or
/// unreadable file's objects are dropped (`--settle-period`).
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(30);
/// Default size limit of one input file, bytes (`--datastore-max-file-size`): 16 MiB.
pub const DEFAULT_MAX_FILE_SIZE: u64 = 16 * 1024 * 1024;

/// How the file datastore treats its inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileOptions {
    /// How long the tree must stay unchanged before a file that vanished (or became
    /// unreadable) is taken as removed. Default 30 s.
    pub settle: Duration,
    /// Largest file read, bytes; a larger one is refused unread. Default 16 MiB.
    pub max_file_size: u64,
    /// Limits of the YAML loader (depth, sequence length, nodes per object).
    pub yaml: YamlLimits,
}

impl Default for FileOptions {
    fn default() -> Self {
        FileOptions { settle: DEFAULT_SETTLE, max_file_size: DEFAULT_MAX_FILE_SIZE, yaml: YamlLimits::default() }
    }
}

/// A datastore backed by a file or a directory of files.
#[derive(Debug, Clone)]
pub struct FileDatastore {
    path: PathBuf,
    debounce: Duration,
    rescan: Duration,
    options: FileOptions,
}

impl FileDatastore {
    /// A datastore reading `path` (a file or a directory).
    pub fn new(path: impl Into<PathBuf>) -> FileDatastore {
        FileDatastore { path: path.into(), debounce: DEFAULT_DEBOUNCE, rescan: DEFAULT_RESCAN, options: FileOptions::default() }
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
        let errors: Vec<LoadError> = loader.files.values().filter_map(|f| f.error.clone()).collect();
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
        let mut debouncer = new_debouncer(self.debounce, move |res: DebounceEventResult| {
            if let Err(e) = &res {
                tracing::warn!(error = %e, "datastore: filesystem notification error; rescanning");
            }
            let _ = ntx.send(());
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
                    let _ = debouncer.watcher().unwatch(&old);
                }
                match debouncer.watcher().watch(&dir, RecursiveMode::NonRecursive) {
                    Ok(()) => watching = Some((dir, id)),
                    Err(e) => tracing::warn!(dir = %dir.display(), error = %e, "datastore: cannot watch yet; relying on rescans"),
                }
            }
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
                    // Coalesce a burst into one rescan.
                    while nrx.try_recv().is_ok() {}
                }
                _ = ticker.tick() => {}
                () = tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)), if deadline.is_some() => {}
            }
        }
    }
}

/// One input file's state.
#[derive(Debug, Default)]
struct FileState {
    /// Hash of the content last read (good or not).
    seen: Option<u64>,
    /// The last content that parsed, with its hash: the typed objects, not the YAML values
    /// (those take about ten times the memory, and the agent keeps this for its lifetime).
    good: Option<(u64, ParsedObjects)>,
    /// The current failure, if the last read failed.
    error: Option<LoadError>,
    /// The file vanished or became unreadable at this time and had good content: it is kept
    /// until the tree has been stable for the settle period.
    missing_since: Option<Instant>,
}

/// What the root's listing shows for one input path.
enum Listed {
    /// A regular file (or a symlink to one).
    Regular,
    /// A symlink whose target does not exist.
    Dangling,
    /// A FIFO, socket, device or directory: never opened.
    NotRegular(&'static str),
}

/// The synchronous core of the file datastore: rescan, keep last good per file and per
/// object, hold removals for the settle period, and decide what to report. Tested without
/// notifications and with explicit times.
#[derive(Debug)]
pub(crate) struct Loader {
    root: PathBuf,
    options: FileOptions,
    /// How long a changed file must stay unchanged before it is used (zero: read once).
    read_settle: Duration,
    files: BTreeMap<PathBuf, FileState>,
    /// `Synced` was sent and no `Unsynced` since.
    synced: bool,
    /// Fingerprint of the last snapshot sent.
    last_sent: Option<u64>,
    /// The last failure reported for the root path itself.
    root_error: Option<String>,
    /// The last `Unsynced` reason sent.
    unsynced_reason: Option<String>,
    /// Fingerprint of the tree (paths, contents, failures) and when it last changed.
    tree: Option<(u64, Instant)>,
    /// The tree has been stable for the settle period (as of the last rescan).
    settled: bool,
}

impl Loader {
    pub(crate) fn new(root: PathBuf, options: FileOptions, read_settle: Duration) -> Loader {
        Loader {
            root,
            options,
            read_settle,
            files: BTreeMap::new(),
            synced: false,
            last_sent: None,
            root_error: None,
            unsynced_reason: None,
            tree: None,
            settled: false,
        }
    }

    /// When the tree becomes settled (stable for the settle period: held removals become due,
    /// deletions allowed), if it is not yet.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        match self.tree {
            Some((_, changed)) if !self.settled => Some(changed + self.options.settle),
            _ => None,
        }
    }

    /// Re-read every input at time `now` and return the events to send.
    pub(crate) fn rescan_at(&mut self, now: Instant) -> Vec<DatastoreEvent> {
        let before: BTreeMap<PathBuf, Option<LoadError>> = self.files.iter().map(|(p, f)| (p.clone(), f.error.clone())).collect();
        let mut events = Vec::new();
        if let Err(e) = self.scan(now) {
            // The path is gone, unreadable or not a file or directory: keep the last good
            // state (reference S10); once synced, the view is not current any more.
            let message = e.to_string();
            if self.root_error.as_deref() != Some(message.as_str()) {
                tracing::warn!(path = %self.root.display(), error = %message, "datastore: cannot read; keeping the last good state");
                events.push(DatastoreEvent::LoadFailed(LoadError::new(self.root.clone(), LoadErrorKind::Io, message.clone())));
                self.root_error = Some(message.clone());
            }
            if self.last_sent.is_some() {
                self.unsync(format!("datastore path {}: {message}; keeping the last good state", self.root.display()), &mut events);
            }
            return events;
        }
        self.root_error = None;
        for (path, state) in &self.files {
            if let Some(err) = &state.error {
                if before.get(path).and_then(Option::as_ref) != Some(err) {
                    tracing::warn!(
                        file = %err.file.display(),
                        line = err.line,
                        error = %err.message,
                        kept_last_good = state.good.is_some(),
                        "datastore: cannot load file"
                    );
                    events.push(DatastoreEvent::LoadFailed(err.clone()));
                }
            }
        }
        // Held removals: due once the tree has been stable for the settle period.
        let stable = self.tree.is_some_and(|(_, changed)| now.saturating_duration_since(changed) >= self.options.settle);
        self.settled = stable;
        if stable {
            let due: Vec<PathBuf> = self.files.iter().filter(|(_, f)| f.missing_since.is_some()).map(|(p, _)| p.clone()).collect();
            for p in due {
                tracing::warn!(file = %p.display(), "datastore: file stayed gone for the settle period; its objects are removed");
                self.files.remove(&p);
            }
        }
        let missing: Vec<String> = self.files.iter().filter(|(_, f)| f.missing_since.is_some()).map(|(p, _)| p.display().to_string()).collect();
        if !missing.is_empty() {
            let settle = self.options.settle.as_secs();
            self.unsync(
                format!("{} vanished or unreadable; keeping its last good content until the tree is stable for {settle} s", missing.join(", ")),
                &mut events,
            );
        }
        let fp = {
            let mut h = DefaultHasher::new();
            (self.fingerprint(), self.settled).hash(&mut h);
            h.finish()
        };
        if self.last_sent != Some(fp) {
            let snap = self.snapshot();
            for e in snap.object_errors.iter().take(20) {
                tracing::debug!(file = %e.file.display(), error = %e.error, last_good = e.last_good, "datastore: object left out");
            }
            events.push(DatastoreEvent::Snapshot(snap));
            self.last_sent = Some(fp);
        }
        if missing.is_empty() && !self.synced {
            self.synced = true;
            self.unsynced_reason = None;
            events.push(DatastoreEvent::Synced);
        }
        events
    }

    fn unsync(&mut self, reason: String, events: &mut Vec<DatastoreEvent>) {
        if self.synced || self.unsynced_reason.as_deref() != Some(reason.as_str()) {
            tracing::warn!(%reason, "datastore: not synced");
            events.push(DatastoreEvent::Unsynced { reason: reason.clone() });
        }
        self.synced = false;
        self.unsynced_reason = Some(reason);
    }

    /// Read the inputs at time `now`. Errors only when the root cannot be listed or read, or
    /// is neither a regular file nor a directory.
    pub(crate) fn scan(&mut self, now: Instant) -> std::io::Result<()> {
        let listed = list_inputs(&self.root)?;
        // Files that are no longer listed: vanished.
        for (path, state) in &mut self.files {
            if !listed.iter().any(|(p, _)| p == path) {
                mark_missing(path, state, now, "vanished (deleted, renamed away, or its directory replaced)");
            }
        }
        // A vanished file that never had good content has nothing to keep.
        self.files.retain(|_, f| !(f.missing_since.is_some() && f.good.is_none()));
        for (path, kind) in listed {
            let state = self.files.entry(path.clone()).or_default();
            match kind {
                Listed::Dangling => mark_unusable(&path, state, now, LoadErrorKind::Vanished, "a symlink to nothing".into()),
                Listed::NotRegular(what) => {
                    let message = format!("{what}, not a regular file: refused (never opened)");
                    if state.good.is_some() {
                        mark_missing(&path, state, now, &message);
                    } else {
                        state.error = Some(LoadError::new(&path, LoadErrorKind::NotRegularFile, message));
                    }
                }
                Listed::Regular => match read_settled(&path, state.seen, self.read_settle, self.options.max_file_size) {
                    Err(ReadError::TooLarge(len)) => {
                        state.missing_since = None;
                        state.seen = None;
                        let max = self.options.max_file_size;
                        let mut e = LoadError::new(&path, LoadErrorKind::TooLarge, format!("{len} bytes is over the size limit of {max} bytes; not read"));
                        e.never_loaded = state.good.is_none();
                        state.error = Some(e);
                    }
                    Err(ReadError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                        mark_missing(&path, state, now, "vanished while being read");
                    }
                    Err(ReadError::Io(e)) => mark_unusable(&path, state, now, LoadErrorKind::Io, e.to_string()),
                    Ok(text) => {
                        state.missing_since = None;
                        let h = hash(&text);
                        if state.seen == Some(h) {
                            continue;
                        }
                        state.seen = Some(h);
                        let parsed = if has_document(&text) { Some(ParsedObjects::from_yaml_str(&text, &self.options.yaml)) } else { None };
                        match parsed {
                            None => {
                                let mut e = LoadError::new(
                                    &path,
                                    LoadErrorKind::Empty,
                                    "no document (empty, whitespace or comments only): refused; write `kind: List` with `items: []` for an input that is empty on purpose",
                                );
                                e.never_loaded = state.good.is_none();
                                state.error = Some(e);
                            }
                            Some(Ok(parsed)) => {
                                let parsed = keep_last_good_objects(state.good.as_ref().map(|g| &g.1), parsed);
                                state.good = Some((h, parsed));
                                state.error = None;
                            }
                            Some(Err(e)) => {
                                state.error = Some(LoadError {
                                    file: path.clone(),
                                    line: e.line,
                                    message: format!("YAML: {}", e.message),
                                    kind: LoadErrorKind::Syntax,
                                    cidrs: cidrs_in_text(&text),
                                    never_loaded: state.good.is_none(),
                                });
                            }
                        }
                    }
                },
            }
        }
        let fp = self.tree_fingerprint();
        if self.tree.is_none_or(|(old, _)| old != fp) {
            self.tree = Some((fp, now));
        }
        Ok(())
    }

    /// Fingerprint of what the snapshot is built from.
    fn fingerprint(&self) -> u64 {
        let mut h = DefaultHasher::new();
        for (p, f) in &self.files {
            p.hash(&mut h);
            f.good.as_ref().map(|g| g.0).hash(&mut h);
            f.error.as_ref().map(|e| (&e.message, e.line, e.never_loaded)).hash(&mut h);
        }
        h.finish()
    }

    /// Fingerprint of the tree for the settle period: also which files are missing.
    fn tree_fingerprint(&self) -> u64 {
        let mut h = DefaultHasher::new();
        self.fingerprint().hash(&mut h);
        for (p, f) in &self.files {
            (p, f.seen, f.missing_since.is_some()).hash(&mut h);
        }
        h.finish()
    }

    pub(crate) fn snapshot(&self) -> Snapshot {
        let mut builder = ClusterBuilder::default();
        let mut object_errors = Vec::new();
        let mut pool_files: HashMap<String, PathBuf> = HashMap::new();
        for (path, f) in &self.files {
            if let Some((_, parsed)) = &f.good {
                for item in parsed.items() {
                    if let ParsedObject::IpPool(name, _) = item {
                        pool_files.entry(name.clone()).or_insert_with(|| path.clone());
                    }
                }
                let rejected = builder.add_parsed(parsed.items().iter().cloned());
                object_errors.extend(rejected.into_iter().map(|r| ObjectError::from_rejected(path.clone(), r)));
            }
        }
        let (cluster, rejected) = builder.finish();
        for r in rejected {
            let file = r.error.object().and_then(|(_, n)| pool_files.get(n)).cloned().unwrap_or_else(|| self.root.clone());
            object_errors.push(ObjectError::from_rejected(file, r));
        }
        Snapshot {
            cluster: Arc::new(cluster),
            object_errors,
            load_errors: self.files.values().filter_map(|f| f.error.clone()).collect(),
            inputs: self.files.len(),
            settled: self.settled,
        }
    }
}

/// A file that had good content is gone or unreadable: keep it, note since when.
fn mark_missing(path: &Path, state: &mut FileState, now: Instant, why: &str) {
    if state.missing_since.is_none() {
        state.missing_since = Some(now);
    }
    state.seen = None;
    state.error = Some(LoadError::new(path, LoadErrorKind::Vanished, why.to_owned()));
}

/// A file that cannot be read: with good content it is held like a vanished file; without, it
/// is an input that never loaded.
fn mark_unusable(path: &Path, state: &mut FileState, now: Instant, kind: LoadErrorKind, message: String) {
    if state.good.is_some() {
        mark_missing(path, state, now, &message);
        if let Some(e) = &mut state.error {
            e.kind = kind;
        }
    } else {
        state.seen = None;
        let mut e = LoadError::new(path, kind, message);
        e.never_loaded = true;
        state.error = Some(e);
    }
}

/// Whether `text` holds anything but whitespace, comments and document markers (`---`,
/// `...`): a file without is empty, whatever the YAML parser would make of it (a tab is a
/// syntax error to it).
fn has_document(text: &str) -> bool {
    text.lines().any(|l| {
        let t = l.trim();
        !t.is_empty() && !t.starts_with('#') && t != "---" && t != "..."
    })
}

/// Objects that failed in the new parse but were good in the previous one are kept in their
/// last good version (by kind and name), with the rejection marked `last_good`.
fn keep_last_good_objects(previous: Option<&ParsedObjects>, parsed: ParsedObjects) -> ParsedObjects {
    let Some(previous) = previous else { return parsed };
    let good: HashMap<(Kind, &str), &ParsedObject> = previous.items().iter().filter(|i| i.is_good()).filter_map(|i| i.identity().map(|id| (id, i))).collect();
    let mut kept: std::collections::HashSet<(Kind, String)> = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(parsed.items().len());
    for item in parsed.into_items() {
        match item {
            ParsedObject::Error(mut r) => {
                if let Some((kind, name)) = r.error.object() {
                    if let Some(old) = good.get(&(kind, name)) {
                        if kept.insert((kind, name.to_owned())) {
                            out.push((*old).clone());
                        }
                        r.last_good = true;
                    }
                }
                out.push(ParsedObject::Error(r));
            }
            other => out.push(other),
        }
    }
    ParsedObjects::from_items(out)
}

/// Why a file could not be read.
enum ReadError {
    /// Over the size limit (its length in bytes); not read.
    TooLarge(u64),
    Io(std::io::Error),
}

/// Read `path` (at most `max` bytes, never blocking on a FIFO swapped in after the listing);
/// when its content differs from `seen`, re-read after `settle` until two reads agree (at
/// most 10 rounds), so a file caught mid-write is not used.
fn read_settled(path: &Path, seen: Option<u64>, settle: Duration, max: u64) -> Result<String, ReadError> {
    let mut text = read_bounded(path, max)?;
    if settle.is_zero() || seen == Some(hash(&text)) {
        return Ok(text);
    }
    for _ in 0..10 {
        std::thread::sleep(settle);
        let again = read_bounded(path, max)?;
        if again == text {
            break;
        }
        text = again;
    }
    Ok(text)
}

fn read_bounded(path: &Path, max: u64) -> Result<String, ReadError> {
    let file = std::fs::OpenOptions::new().read(true).custom_flags(nix::libc::O_NONBLOCK).open(path).map_err(ReadError::Io)?;
    let meta = file.metadata().map_err(ReadError::Io)?;
    if !meta.is_file() {
        return Err(ReadError::Io(std::io::Error::other("not a regular file")));
    }
    if meta.len() > max {
        return Err(ReadError::TooLarge(meta.len()));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(max.saturating_add(1)).read_to_end(&mut bytes).map_err(ReadError::Io)?;
    if bytes.len() as u64 > max {
        return Err(ReadError::TooLarge(bytes.len() as u64));
    }
    String::from_utf8(bytes).map_err(|e| ReadError::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("not UTF-8: {e}"))))
}

fn hash(text: &str) -> u64 {
    let mut h = DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

/// What a non-regular file is, for the error message.
fn describe_type(t: std::fs::FileType) -> &'static str {
    if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_block_device() || t.is_char_device() {
        "a device"
    } else if t.is_dir() {
        "a directory"
    } else {
        "a special file"
    }
}

/// The input paths under `root`, sorted: `root` itself if it is a regular file, else its
/// `*.yaml`/`*.yml`/`*.json` entries (skipping hidden names), each with what it is. Never opens
/// anything but the directory.
///
/// Errors: `root` is missing or unreadable, or is neither a regular file nor a directory.
fn list_inputs(root: &Path) -> std::io::Result<Vec<(PathBuf, Listed)>> {
    let meta = std::fs::metadata(root)?;
    if meta.is_file() {
        return Ok(vec![(root.to_path_buf(), Listed::Regular)]);
    }
    if !meta.is_dir() {
        return Err(std::io::Error::other(format!("{} is neither a regular file nor a directory: refused", describe_type(meta.file_type()))));
    }
    let mut out = Vec::new();
    for entry in std::fs::read_dir(root)? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else { continue };
        if name.starts_with('.') {
            continue;
        }
        let ext_ok = Path::new(name).extension().and_then(|e| e.to_str()).is_some_and(|e| matches!(e, "yaml" | "yml" | "json"));
        if !ext_ok {
            continue;
        }
        let listed = match std::fs::metadata(&path) {
            Ok(m) if m.is_file() => Listed::Regular,
            Ok(m) => Listed::NotRegular(describe_type(m.file_type())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Listed::Dangling,
            Err(_) => Listed::Regular, // unreadable metadata: reading it reports why
        };
        out.push((path, listed));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

#[cfg(test)]
mod tests;
