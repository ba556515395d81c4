//! The file datastore: one multi-document YAML file, or a directory of `*.yaml` / `*.yml` /
//! `*.json` files (hidden entries skipped, so a Kubernetes ConfigMap mount with its `..data`
//! symlinks works), each holding objects or `List`s as `calicoctl get -o yaml` and
//! `kubectl get -o yaml` print them. Reloaded on filesystem notifications (debounced) and on a
//! periodic rescan as a safety net.

use std::collections::hash_map::DefaultHasher;
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::RecursiveMode;
use notify_debouncer_mini::{new_debouncer, DebounceEventResult};
use tokio::sync::mpsc;

use super::{Datastore, DatastoreError, DatastoreEvent, LoadError, ObjectError, Snapshot};
use crate::model::{parse_yaml_documents, ClusterBuilder, ParsedObjects};

/// Default debounce window for filesystem notifications.
pub const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(300);
/// How long a changed file must stay unchanged before it is read as the new state.
const SETTLE: Duration = Duration::from_millis(50);
/// Default periodic rescan (catches changes notifications miss, e.g. on network filesystems).
pub const DEFAULT_RESCAN: Duration = Duration::from_secs(30);

/// A datastore backed by a file or a directory of files.
#[derive(Debug, Clone)]
pub struct FileDatastore {
    path: PathBuf,
    debounce: Duration,
    rescan: Duration,
}

impl FileDatastore {
    /// A datastore reading `path` (a file or a directory).
    pub fn new(path: impl Into<PathBuf>) -> FileDatastore {
        FileDatastore { path: path.into(), debounce: DEFAULT_DEBOUNCE, rescan: DEFAULT_RESCAN }
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

    /// One-shot load (for `explain` and `audit`).
    ///
    /// Errors: [`DatastoreError::Io`] when `path` cannot be read; [`DatastoreError::Load`] with
    /// every file and line that is not valid YAML (no partial snapshot is returned). Object
    /// errors do not fail the load; they are in [`Snapshot::object_errors`].
    pub fn load(path: impl AsRef<Path>) -> Result<Snapshot, DatastoreError> {
        let mut loader = Loader::new(path.as_ref().to_path_buf());
        loader.scan().map_err(|source| DatastoreError::Io { path: path.as_ref().to_path_buf(), source })?;
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
        let mut watching = false;
        let mut loader = Loader::with_settle(self.path.clone(), SETTLE);
        let mut ticker = tokio::time::interval(self.rescan);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if !watching {
                let dir = self.watch_dir();
                match debouncer.watcher().watch(&dir, RecursiveMode::NonRecursive) {
                    Ok(()) => watching = true,
                    Err(e) => tracing::warn!(dir = %dir.display(), error = %e, "datastore: cannot watch yet; relying on rescans"),
                }
            }
            let (back, events) = tokio::task::spawn_blocking(move || {
                let events = loader.rescan();
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
}

/// The synchronous core of the file datastore: rescan, keep last good per file, and decide what
/// to report. Tested without notifications.
#[derive(Debug)]
pub(crate) struct Loader {
    root: PathBuf,
    files: BTreeMap<PathBuf, FileState>,
    synced: bool,
    /// Fingerprint of the last snapshot sent.
    last_sent: Option<u64>,
    /// The last failure reported for the root path itself.
    root_error: Option<String>,
    /// How long a changed file must stay unchanged before it is used: `std::fs::write` and
    /// most editors truncate first, and a half-written (even empty) file must never be taken
    /// for the new state (it would drop every object in it). Zero for one-shot loads.
    settle: Duration,
}

impl Loader {
    pub(crate) fn new(root: PathBuf) -> Loader {
        Loader { root, files: BTreeMap::new(), synced: false, last_sent: None, root_error: None, settle: Duration::ZERO }
    }

    /// A loader that waits `settle` for changed files to stop changing.
    pub(crate) fn with_settle(root: PathBuf, settle: Duration) -> Loader {
        Loader { settle, ..Loader::new(root) }
    }

    /// Re-read every input and return the events to send.
    pub(crate) fn rescan(&mut self) -> Vec<DatastoreEvent> {
        let before: BTreeMap<PathBuf, Option<LoadError>> =
            self.files.iter().map(|(p, f)| (p.clone(), f.error.clone())).collect();
        let mut events = Vec::new();
        if let Err(e) = self.scan() {
            // The path is gone or unreadable: keep the last good state (reference S10).
            let message = e.to_string();
            if self.root_error.as_deref() != Some(message.as_str()) {
                tracing::warn!(path = %self.root.display(), error = %message, "datastore: cannot read; keeping the last good state");
                events.push(DatastoreEvent::LoadFailed(LoadError { file: self.root.clone(), line: None, message: message.clone() }));
                self.root_error = Some(message);
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
        let complete = self.files.values().all(|f| f.good.is_some() || (self.synced && f.error.is_some()));
        if !complete {
            return events; // not synced yet: some file never loaded
        }
        let fp = self.fingerprint();
        if self.last_sent != Some(fp) {
            let snap = self.snapshot();
            for e in &snap.object_errors {
                tracing::warn!(file = %e.file.display(), error = %e.error, "datastore: object left out");
            }
            events.push(DatastoreEvent::Snapshot(snap));
            self.last_sent = Some(fp);
            if !self.synced {
                self.synced = true;
                events.push(DatastoreEvent::Synced);
            }
        }
        events
    }

    /// Read the inputs. Errors only when the root cannot be listed or read.
    pub(crate) fn scan(&mut self) -> std::io::Result<()> {
        let paths = list_inputs(&self.root)?;
        self.files.retain(|p, _| paths.contains(p));
        for path in paths {
            let state = self.files.entry(path.clone()).or_default();
            match read_settled(&path, state.seen, self.settle) {
                Err(e) => {
                    state.seen = None;
                    state.error = Some(LoadError { file: path, line: None, message: e.to_string() });
                }
                Ok(text) => {
                    let h = hash(&text);
                    if state.seen == Some(h) {
                        continue;
                    }
                    state.seen = Some(h);
                    match parse_yaml_documents(&text) {
                        Ok(docs) => {
                            state.good = Some((h, ParsedObjects::from_values(&docs)));
                            state.error = None;
                        }
                        Err(e) => {
                            let line = e.location().map(|l| l.line());
                            let message = format!("YAML: {e}");
                            state.error = Some(LoadError { file: path, line, message });
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn fingerprint(&self) -> u64 {
        let mut h = DefaultHasher::new();
        for (p, f) in &self.files {
            p.hash(&mut h);
            f.good.as_ref().map(|g| g.0).hash(&mut h);
            f.error.as_ref().map(|e| (&e.message, e.line)).hash(&mut h);
        }
        h.finish()
    }

    pub(crate) fn snapshot(&self) -> Snapshot {
        let mut builder = ClusterBuilder::default();
        let mut object_errors = Vec::new();
        for (path, f) in &self.files {
            if let Some((_, parsed)) = &f.good {
                let errors = builder.add_parsed(parsed.items().iter().cloned());
                object_errors.extend(errors.into_iter().map(|error| ObjectError { file: path.clone(), error }));
            }
        }
        Snapshot {
            cluster: Arc::new(builder.finish()),
            object_errors,
            load_errors: self.files.values().filter_map(|f| f.error.clone()).collect(),
            inputs: self.files.len(),
        }
    }
}

/// Read `path`; when its content differs from `seen`, re-read after `settle` until two reads
/// agree (at most 10 rounds), so a file caught mid-write is not used.
fn read_settled(path: &Path, seen: Option<u64>, settle: Duration) -> std::io::Result<String> {
    let mut text = std::fs::read_to_string(path)?;
    if settle.is_zero() || seen == Some(hash(&text)) {
        return Ok(text);
    }
    for _ in 0..10 {
        std::thread::sleep(settle);
        let again = std::fs::read_to_string(path)?;
        if again == text {
            break;
        }
        text = again;
    }
    Ok(text)
}

fn hash(text: &str) -> u64 {
    let mut h = DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

/// The input files under `root`, sorted: `root` itself if it is a file, else its
/// `*.yaml`/`*.yml`/`*.json` entries (following symlinks, skipping hidden names).
fn list_inputs(root: &Path) -> std::io::Result<Vec<PathBuf>> {
    let meta = std::fs::metadata(root)?;
    if !meta.is_dir() {
        return Ok(vec![root.to_path_buf()]);
    }
    let mut out = Vec::new();
    for entry in std::fs::read_dir(root)? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else { continue };
        if name.starts_with('.') {
            continue;
        }
        let ext_ok = Path::new(name)
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"));
        if ext_ok && std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> TempDir {
            let p = std::env::temp_dir().join(format!("routewarden-ds-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).expect("temp dir");
            TempDir(p)
        }
        fn write(&self, name: &str, text: &str) -> PathBuf {
            let p = self.0.join(name);
            std::fs::write(&p, text).expect("write");
            p
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    const POOL: &str = "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: p1}\nspec: {cidr: 10.244.0.0/16}\n";
    const NODE: &str = "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Node\n  metadata: {name: node-a, annotations: {projectcalico.org/IPv4Address: 10.0.0.11/24}}\n";

    fn kinds(events: &[DatastoreEvent]) -> Vec<&'static str> {
        events
            .iter()
            .map(|e| match e {
                DatastoreEvent::Snapshot(_) => "snapshot",
                DatastoreEvent::Synced => "synced",
                DatastoreEvent::LoadFailed(_) => "load-failed",
                DatastoreEvent::Unsynced { .. } => "unsynced",
            })
            .collect()
    }

    fn snapshot(events: &[DatastoreEvent]) -> &Snapshot {
        events
            .iter()
            .find_map(|e| if let DatastoreEvent::Snapshot(s) = e { Some(s) } else { None })
            .expect("a snapshot")
    }

    #[test]
    fn directory_lifecycle_keeps_last_good_state() {
        let dir = TempDir::new("life");
        dir.write("pools.yaml", POOL);
        dir.write("nodes.yml", NODE);
        dir.write("README.md", "not yaml: [");
        dir.write(".hidden.yaml", "also not: [");
        let mut l = Loader::new(dir.0.clone());

        let ev = l.rescan();
        assert_eq!(kinds(&ev), vec!["snapshot", "synced"]);
        let s = snapshot(&ev);
        assert_eq!(s.inputs, 2);
        assert!(s.cluster.ip_pools.contains_key("p1") && s.cluster.nodes.contains_key("node-a"));

        // Nothing changed: nothing sent.
        assert_eq!(kinds(&l.rescan()), Vec::<&str>::new());

        // A broken edit: reported with file and line, last good content kept.
        let broken = dir.write("pools.yaml", "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: p2\nspec: {}\n");
        let ev = l.rescan();
        assert_eq!(kinds(&ev), vec!["load-failed", "snapshot"]);
        let DatastoreEvent::LoadFailed(err) = &ev[0] else { unreachable!() };
        assert_eq!(err.file, broken);
        assert_eq!(err.line, Some(4));
        assert_eq!(err.code(), "syntax");
        let s = snapshot(&ev);
        assert!(s.cluster.ip_pools.contains_key("p1"), "last good pools kept");
        assert_eq!(s.load_errors, vec![err.clone()]);
        // The same failure is not reported twice.
        assert_eq!(kinds(&l.rescan()), Vec::<&str>::new());

        // Fixed: a new snapshot without load errors.
        dir.write("pools.yaml", &POOL.replace("p1", "p3"));
        let ev = l.rescan();
        assert_eq!(kinds(&ev), vec!["snapshot"]);
        let s = snapshot(&ev);
        assert_eq!(s.cluster.ip_pools.keys().collect::<Vec<_>>(), vec!["p3"]);
        assert!(s.load_errors.is_empty());

        // A removed file takes its objects with it.
        std::fs::remove_file(dir.0.join("nodes.yml")).unwrap();
        let s = snapshot(&l.rescan()).clone();
        assert!(s.cluster.nodes.is_empty());
    }

    #[test]
    fn not_synced_until_every_file_loads() {
        let dir = TempDir::new("unsynced");
        dir.write("a.yaml", POOL);
        dir.write("b.yaml", "kind: [");
        let mut l = Loader::new(dir.0.clone());
        assert_eq!(kinds(&l.rescan()), vec!["load-failed"]);
        assert_eq!(kinds(&l.rescan()), Vec::<&str>::new());
        dir.write("b.yaml", NODE);
        assert_eq!(kinds(&l.rescan()), vec!["snapshot", "synced"]);
    }

    #[test]
    fn missing_path_is_reported_once_and_state_kept() {
        let dir = TempDir::new("missing");
        let file = dir.write("cluster.yaml", POOL);
        let mut l = Loader::new(file.clone());
        assert_eq!(kinds(&l.rescan()), vec!["snapshot", "synced"]);
        std::fs::remove_file(&file).unwrap();
        let ev = l.rescan();
        assert_eq!(kinds(&ev), vec!["load-failed"]);
        assert_eq!(kinds(&l.rescan()), Vec::<&str>::new());
        assert!(l.snapshot().cluster.ip_pools.contains_key("p1"));
    }

    #[test]
    fn object_errors_name_the_file() {
        let dir = TempDir::new("objerr");
        let f = dir.write("bad.yaml", &format!("{POOL}---\napiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {{name: pool-a}}\nspec: {{cidr: 10.0.0/8}}\n"));
        let snap = FileDatastore::load(&dir.0).expect("loads");
        assert_eq!(snap.object_errors.len(), 1);
        assert_eq!(snap.object_errors[0].file, f);
        assert_eq!(
            snap.object_errors[0].to_string(),
            format!("{}: IPPool \"pool-a\": spec.cidr: invalid CIDR \"10.0.0/8\"", f.display())
        );
        assert!(snap.cluster.ip_pools.contains_key("p1"));
    }

    #[test]
    fn duplicates_across_files_keep_the_first_and_name_the_later_file() {
        // The files are kept as typed objects; merging them must still behave as one pass over
        // the documents in file order.
        let dir = TempDir::new("dup");
        dir.write("a.yaml", POOL);
        let b = dir.write("b.yaml", &POOL.replace("10.244.0.0/16", "10.99.0.0/16"));
        let mut l = Loader::new(dir.0.clone());
        let ev = l.rescan();
        let s = snapshot(&ev);
        assert_eq!(s.cluster.ip_pools["p1"].cidr.to_string(), "10.244.0.0/16");
        assert_eq!(s.object_errors.len(), 1);
        assert_eq!(s.object_errors[0].file, b);
        assert_eq!(s.object_errors[0].error.code(), "duplicate");
        // Rebuilt from the kept objects (a.yaml broken): the same result.
        dir.write("a.yaml", "kind: [");
        let again = l.rescan();
        let s2 = snapshot(&again);
        assert_eq!(s2.cluster, s.cluster);
        assert_eq!(s2.object_errors, s.object_errors);
    }

    #[test]
    fn one_shot_load_fails_on_broken_yaml_with_position() {
        let dir = TempDir::new("oneshot");
        let f = dir.write("x.yaml", "a: 1\nb: [\n");
        let err = FileDatastore::load(&f).unwrap_err();
        let DatastoreError::Load { errors } = &err else { panic!("{err}") };
        assert_eq!(errors[0].file, f);
        assert!(errors[0].line.is_some());
        assert!(matches!(FileDatastore::load(dir.0.join("nope")), Err(DatastoreError::Io { .. })));
    }
}
