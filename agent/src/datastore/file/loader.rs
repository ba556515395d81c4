//! The synchronous core of the file datastore: rescan the inputs, keep the last good content
//! per file and per object, hold removals for the settle period, and decide what to report
//! (snapshots, `Synced`, `Unsynced`, `LoadFailed`). Also the options it applies
//! ([`FileOptions`]: settle period, size limit, YAML limits). No notifications and no clock of
//! its own: callers pass the time, so tests drive it at explicit times.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::read::{hash, list_inputs, read_settled_all, Listed, ReadError};
use crate::datastore::error::{LoadError, LoadErrorKind, ObjectError};
use crate::datastore::event::{DatastoreEvent, Snapshot};
use crate::model::{cidrs_in_text, ClusterBuilder, Kind, ParsedObject, ParsedObjects, YamlError, YamlLimits};

/// Default settle period: how long the tree must stay unchanged before a vanished file's
/// objects are dropped (`--settle-period`); an unreadable file keeps its last good content.
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(30);
/// Default size limit of one input file, bytes (`--datastore-max-file-size`): 16 MiB.
pub const DEFAULT_MAX_FILE_SIZE: u64 = 16 * 1024 * 1024;

/// How the file datastore treats its inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileOptions {
    /// How long the tree must stay unchanged before a file that vanished is taken as removed
    /// (one that became unreadable keeps its last good content while it stays so). Default 30 s.
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
        // Every regular file read at once, settled together (one pause a round for the tree).
        let regular: Vec<(PathBuf, Option<u64>)> =
            listed.iter().filter(|(_, k)| matches!(k, Listed::Regular)).map(|(p, _)| (p.clone(), self.files.get(p).and_then(|f| f.seen))).collect();
        // A file never loaded is parsed while its read settles (a cold start's pause is then
        // the parse, not a sleep); its parse is kept if the settled text is the one parsed.
        // Files with good content wait as before, so a change of many files never holds two
        // parsed copies of each.
        let mut early: HashMap<PathBuf, (u64, Parsed)> = HashMap::new();
        let (files, yaml) = (&self.files, &self.options.yaml);
        let mut reads: HashMap<PathBuf, Result<String, ReadError>> =
            read_settled_all(regular, self.read_settle, self.options.max_file_size, |path, text, h| {
                if files.get(path).is_none_or(|f| f.good.is_none()) {
                    early.insert(path.to_path_buf(), (h, parse(text, yaml)));
                }
            })
            .0
            .into_iter()
            .collect();
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
                Listed::Regular => match reads.remove(&path).unwrap_or_else(|| Err(ReadError::Io(std::io::Error::other("not read")))) {
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
                        let parsed = settled_parse(early.remove(&path), h, &text, &self.options.yaml);
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

    /// The inputs currently broken, in path order.
    pub(crate) fn load_errors(&self) -> Vec<LoadError> {
        self.files.values().filter_map(|f| f.error.clone()).collect()
    }

    pub(crate) fn snapshot(&self) -> Snapshot {
        let mut builder = ClusterBuilder::default();
        let mut object_errors = Vec::new();
        // The file of each object's first definition: the rejections `finish` returns (an
        // overlapping pool, the first definition of an object defined twice) are its.
        let mut first_files: HashMap<(Kind, &str), &PathBuf> = HashMap::new();
        for (path, f) in &self.files {
            if let Some((_, parsed)) = &f.good {
                for item in parsed.items().iter().filter(|i| i.is_good()) {
                    if let Some(id) = item.identity() {
                        first_files.entry(id).or_insert(path);
                    }
                }
                let rejected = builder.add_parsed(parsed.items().iter().cloned());
                object_errors.extend(rejected.into_iter().map(|r| ObjectError::from_rejected(path.clone(), r)));
            }
        }
        let (cluster, rejected) = builder.finish();
        for r in rejected {
            let file = r.error.object().and_then(|id| first_files.get(&id)).map_or_else(|| self.root.clone(), |p| (*p).clone());
            object_errors.push(ObjectError::from_rejected(file, r));
        }
        Snapshot { cluster: Arc::new(cluster), object_errors, load_errors: self.load_errors(), inputs: self.files.len(), settled: self.settled }
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

/// A file that cannot be read: with good content it is held like a vanished file (a dangling
/// symlink) or kept for as long as it stays unreadable (an I/O error: the file is there, so
/// nothing says its objects are gone — the shipped DaemonSet drops every capability, so a
/// file mode of 0600 owned by another user is such a file, and so is an EIO); without good
/// content it is an input that never loaded. Either way an unreadable file holds every
/// deletion (the plan's `hold_all`): what it says now is unknown.
fn mark_unusable(path: &Path, state: &mut FileState, now: Instant, kind: LoadErrorKind, message: String) {
    if kind == LoadErrorKind::Io && state.good.is_some() {
        state.missing_since = None;
        state.seen = None;
        state.error = Some(LoadError::new(path, kind, message));
    } else if state.good.is_some() {
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

/// A file's text parsed: `None` when it holds no document, else the parse.
pub(super) type Parsed = Option<Result<ParsedObjects, YamlError>>;

/// The parse of a settled `text` (hash `h`): the one made while its read settled (`early`,
/// with the hash of the text it parsed) if that was the same text, else parsed now.
pub(super) fn settled_parse(early: Option<(u64, Parsed)>, h: u64, text: &str, limits: &YamlLimits) -> Parsed {
    match early {
        Some((parsed_hash, parsed)) if parsed_hash == h => parsed,
        _ => parse(text, limits),
    }
}

/// Parse `text` within `limits` ([`Parsed`]).
pub(super) fn parse(text: &str, limits: &YamlLimits) -> Parsed {
    has_document(text).then(|| ParsedObjects::from_yaml_str(text, limits))
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
