//! The file datastore's loader, driven with explicit times (no notifications, no sleeps
//! except the 50 ms half-write re-read, which these loaders turn off).

use std::path::PathBuf;
use std::time::{Duration, Instant};

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
const SETTLE: Duration = Duration::from_secs(30);

fn loader(root: PathBuf) -> Loader {
    Loader::new(root, FileOptions { settle: SETTLE, ..FileOptions::default() }, Duration::ZERO)
}

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
    events.iter().find_map(|e| if let DatastoreEvent::Snapshot(s) = e { Some(s) } else { None }).expect("a snapshot")
}

fn pools(s: &Snapshot) -> Vec<String> {
    s.cluster.ip_pools.values().map(|p| format!("{} {}", p.name, p.cidr)).collect()
}

#[test]
fn directory_lifecycle_keeps_last_good_state() {
    let dir = TempDir::new("life");
    dir.write("pools.yaml", POOL);
    dir.write("nodes.yml", NODE);
    dir.write("README.md", "not yaml: [");
    dir.write(".hidden.yaml", "also not: [");
    let mut l = loader(dir.0.clone());
    let t0 = Instant::now();

    let ev = l.rescan_at(t0);
    assert_eq!(kinds(&ev), vec!["snapshot", "synced"]);
    let s = snapshot(&ev);
    assert_eq!(s.inputs, 2);
    assert!(s.cluster.ip_pools.contains_key("p1") && s.cluster.nodes.contains_key("node-a"));

    // Nothing changed: nothing sent.
    assert_eq!(kinds(&l.rescan_at(t0)), Vec::<&str>::new());

    // A broken edit: reported with file and line, last good content kept, the CIDRs its
    // text names frozen (the LoadError carries them).
    let broken = dir.write("pools.yaml", "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: p2\nspec: {cidr: 10.99.0.0/16}\n");
    let ev = l.rescan_at(t0);
    assert_eq!(kinds(&ev), vec!["load-failed", "snapshot"]);
    let DatastoreEvent::LoadFailed(err) = &ev[0] else { unreachable!() };
    assert_eq!((err.file.clone(), err.line, err.code(), err.never_loaded), (broken, Some(4), "syntax", false));
    assert_eq!(err.cidrs, vec!["10.99.0.0/16".parse::<ipnet::IpNet>().unwrap()]);
    let s = snapshot(&ev);
    assert_eq!(pools(s), ["p1 10.244.0.0/16"], "last good pools kept");
    assert_eq!(s.load_errors, vec![err.clone()]);
    // The same failure is not reported twice.
    assert_eq!(kinds(&l.rescan_at(t0)), Vec::<&str>::new());

    // Fixed: a new snapshot without load errors.
    dir.write("pools.yaml", &POOL.replace("p1", "p3"));
    let ev = l.rescan_at(t0);
    assert_eq!(kinds(&ev), vec!["snapshot"]);
    let s = snapshot(&ev);
    assert_eq!(pools(s), ["p3 10.244.0.0/16"]);
    assert!(s.load_errors.is_empty());

    // A removed file keeps its objects and unsyncs until the tree is stable for the settle
    // period, then its objects go.
    std::fs::remove_file(dir.0.join("nodes.yml")).unwrap();
    let t1 = t0 + Duration::from_secs(100);
    let ev = l.rescan_at(t1);
    assert_eq!(kinds(&ev), vec!["load-failed", "unsynced", "snapshot"]);
    let DatastoreEvent::Unsynced { reason } = &ev[1] else { unreachable!() };
    assert!(reason.starts_with(&format!("{} vanished or unreadable", dir.0.join("nodes.yml").display())), "{reason}");
    assert!(snapshot(&ev).cluster.nodes.contains_key("node-a"), "kept while settling");
    assert_eq!(l.next_deadline(), Some(t1 + SETTLE));
    assert_eq!(kinds(&l.rescan_at((t1 + SETTLE).checked_sub(Duration::from_millis(1)).unwrap())), Vec::<&str>::new());
    let ev = l.rescan_at(t1 + SETTLE);
    assert_eq!(kinds(&ev), vec!["snapshot", "synced"]);
    assert!(snapshot(&ev).cluster.nodes.is_empty());
    assert_eq!(l.next_deadline(), None);
}

#[test]
fn a_change_during_the_settle_period_restarts_it_and_a_return_cancels_the_removal() {
    let dir = TempDir::new("settle");
    dir.write("pools.yaml", POOL);
    let nodes = dir.write("nodes.yaml", NODE);
    let mut l = loader(dir.0.clone());
    let t0 = Instant::now();
    assert_eq!(kinds(&l.rescan_at(t0)), vec!["snapshot", "synced"]);
    std::fs::remove_file(&nodes).unwrap();
    assert_eq!(kinds(&l.rescan_at(t0)), vec!["load-failed", "unsynced", "snapshot"]);
    // Another change 20 s later: the tree is not stable, the removal waits 30 s from here.
    dir.write("pools.yaml", &POOL.replace("p1", "p9"));
    let t1 = t0 + Duration::from_secs(20);
    let ev = l.rescan_at(t1);
    assert_eq!(kinds(&ev), vec!["snapshot"]);
    assert_eq!(l.next_deadline(), Some(t1 + SETTLE));
    assert!(snapshot(&ev).cluster.nodes.contains_key("node-a"));
    // The file comes back before that: nothing is removed, synced again.
    std::fs::write(&nodes, NODE).unwrap();
    let ev = l.rescan_at(t1 + Duration::from_secs(10));
    assert_eq!(kinds(&ev), vec!["snapshot", "synced"]);
    assert!(snapshot(&ev).cluster.nodes.contains_key("node-a"));
    assert!(snapshot(&ev).load_errors.is_empty());
}

#[test]
fn empty_files_are_refused_unless_they_say_so() {
    let dir = TempDir::new("empty");
    let ipam = dir.write("ipam.yaml", POOL);
    let mut l = loader(dir.0.clone());
    let t0 = Instant::now();
    assert_eq!(kinds(&l.rescan_at(t0)), vec!["snapshot", "synced"]);
    for empty in ["", "   \n\t\n", "# all comments\n# here\n", "---\n"] {
        std::fs::write(&ipam, empty).unwrap();
        let ev = l.rescan_at(t0);
        let s = l.snapshot();
        assert_eq!(pools(&s), ["p1 10.244.0.0/16"], "{empty:?}: last good kept");
        assert_eq!(s.load_errors.len(), 1, "{empty:?}");
        assert_eq!((s.load_errors[0].code(), s.load_errors[0].never_loaded), ("empty", false));
        assert!(!ev.iter().any(|e| matches!(e, DatastoreEvent::Unsynced { .. })), "an empty file does not unsync");
        std::fs::write(&ipam, POOL).unwrap();
        l.rescan_at(t0);
    }
    // Empty on purpose.
    std::fs::write(&ipam, "apiVersion: v1\nkind: List\nitems: []\n").unwrap();
    let ev = l.rescan_at(t0);
    let s = snapshot(&ev);
    assert!(s.cluster.ip_pools.is_empty() && s.load_errors.is_empty());
}

#[test]
fn an_input_that_never_loaded_says_so() {
    let dir = TempDir::new("never");
    dir.write("a.yaml", POOL);
    dir.write("b.yaml", "kind: [");
    dir.write("c.yaml", "");
    let mut l = loader(dir.0.clone());
    let ev = l.rescan_at(Instant::now());
    assert_eq!(kinds(&ev), vec!["load-failed", "load-failed", "snapshot", "synced"]);
    let s = snapshot(&ev);
    assert_eq!(s.load_errors.iter().map(|e| (e.code(), e.never_loaded)).collect::<Vec<_>>(), [("syntax", true), ("empty", true)]);
    assert_eq!(pools(s), ["p1 10.244.0.0/16"]);
}

#[test]
fn objects_keep_their_last_good_version_per_object() {
    let dir = TempDir::new("perobject");
    let two = format!("{POOL}---\n{}", POOL.replace("p1", "p2").replace("10.244.0.0/16", "10.245.0.0/16"));
    let f = dir.write("pools.yaml", &two);
    let mut l = loader(dir.0.clone());
    let t0 = Instant::now();
    l.rescan_at(t0);
    // p2 breaks (invalid mode), p1 changes, p3 is new and bad, p4 new and good.
    let edited = format!(
        "{}---\n{}---\n{}---\n{}",
        POOL.replace("10.244.0.0/16", "10.246.0.0/16"),
        POOL.replace("p1", "p2").replace("10.244.0.0/16", "10.245.0.0/16").replace("spec: {", "spec: {ipipMode: Sometimes, "),
        POOL.replace("p1", "p3").replace("10.244.0.0/16", "10.247.0.0/16").replace("spec: {", "spec: {vxlanMode: Maybe, "),
        POOL.replace("p1", "p4").replace("10.244.0.0/16", "10.248.0.0/16"),
    );
    std::fs::write(&f, edited).unwrap();
    let ev = l.rescan_at(t0);
    let s = snapshot(&ev);
    assert_eq!(pools(s), ["p1 10.246.0.0/16", "p2 10.245.0.0/16", "p4 10.248.0.0/16"]);
    let errs: Vec<(String, bool, Vec<String>)> =
        s.object_errors.iter().map(|e| (e.error.to_string(), e.last_good, e.cidrs.iter().map(ToString::to_string).collect())).collect();
    assert_eq!(
        errs,
        [
            (
                r#"IPPool "p2": spec.ipipMode: invalid value "Sometimes" (expected Never, Always or CrossSubnet)"#.to_string(),
                true,
                vec!["10.245.0.0/16".to_string()]
            ),
            (
                r#"IPPool "p3": spec.vxlanMode: invalid value "Maybe" (expected Never, Always or CrossSubnet)"#.to_string(),
                false,
                vec!["10.247.0.0/16".to_string()]
            ),
        ]
    );
    // Still bad on the next edit: the same last good version (not the first one) is kept.
    std::fs::write(&f, std::fs::read_to_string(&f).unwrap().replace("p4", "p5")).unwrap();
    let ev = l.rescan_at(t0);
    assert_eq!(pools(snapshot(&ev)), ["p1 10.246.0.0/16", "p2 10.245.0.0/16", "p5 10.248.0.0/16"]);
}

#[test]
fn overlapping_pools_are_object_errors_of_their_file() {
    let dir = TempDir::new("overlap");
    dir.write("a.yaml", POOL);
    let b = dir.write("b.yaml", &POOL.replace("p1", "wide").replace("10.244.0.0/16", "10.0.0.0/8"));
    let mut l = loader(dir.0.clone());
    let ev = l.rescan_at(Instant::now());
    let s = snapshot(&ev);
    assert!(s.cluster.ip_pools.is_empty());
    let files: Vec<(PathBuf, String)> = s.object_errors.iter().map(|e| (e.file.clone(), e.cidrs[0].to_string())).collect();
    assert_eq!(files, [(dir.0.join("a.yaml"), "10.244.0.0/16".to_string()), (b, "10.0.0.0/8".to_string())]);
}

/// Node b's /27 written into a file of its own, inside node a's /26 of
/// another file. Both blocks are refused, each an object error of the file that defines it
/// (through the first-definition map, `Loader::snapshot`), each naming the other block, both
/// freezing node a's /26; node c's block in node a's file stays.
#[test]
fn overlapping_blocks_are_object_errors_of_their_own_files() {
    let dir = TempDir::new("block-overlap");
    let block = |cidr: &str, node: &str| {
        let name = crate::model::block_name(cidr.parse().unwrap());
        format!("---\napiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {{name: {name}}}\nspec: {{cidr: {cidr}, affinity: 'host:{node}'}}\n")
    };
    dir.write("calico.yaml", POOL);
    let a = dir.write("ipam.yaml", &(block("10.244.10.0/26", "node-a") + &block("10.244.30.0/26", "node-c")));
    let b = dir.write("node-b.yaml", &block("10.244.10.32/27", "node-b"));
    let mut l = loader(dir.0.clone());
    let s = snapshot(&l.rescan_at(Instant::now())).clone();
    assert_eq!(s.cluster.ipam_blocks.keys().map(|k| &**k).collect::<Vec<_>>(), ["10-244-30-0-26"]);
    let got: Vec<(PathBuf, &str, Vec<String>, bool)> =
        s.object_errors.iter().map(|e| (e.file.clone(), e.error.object().unwrap().1, e.cidrs.iter().map(ToString::to_string).collect(), e.last_good)).collect();
    let frozen = vec!["10.244.10.0/26".to_owned()];
    assert_eq!(got, [(a, "10-244-10-0-26", frozen.clone(), false), (b, "10-244-10-32-27", frozen, false)]);
    assert!(s.object_errors[0].error.to_string().contains("overlaps IPAM block 10-244-10-32-27 (10.244.10.32/27)"), "{}", s.object_errors[0]);
    assert!(s.object_errors[1].error.to_string().contains("overlaps IPAM block 10-244-10-0-26 (10.244.10.0/26)"), "{}", s.object_errors[1]);
}

#[test]
fn not_regular_files_and_dangling_symlinks() {
    let dir = TempDir::new("special");
    dir.write("pools.yaml", POOL);
    let nodes = dir.write("nodes.yaml", NODE);
    nix::unistd::mkfifo(&dir.0.join("fifo.yaml"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    std::fs::create_dir(dir.0.join("dir.yaml")).unwrap();
    let mut l = loader(dir.0.clone());
    let t0 = Instant::now();
    let ev = l.rescan_at(t0); // must not block on the FIFO
    let s = snapshot(&ev);
    let mut codes: Vec<(String, &str, bool)> =
        s.load_errors.iter().map(|e| (e.file.file_name().unwrap().to_string_lossy().into_owned(), e.code(), e.never_loaded)).collect();
    codes.sort();
    assert_eq!(codes, [("dir.yaml".into(), "not-regular-file", false), ("fifo.yaml".into(), "not-regular-file", false)]);
    assert!(kinds(&ev).contains(&"synced"), "refused special files hold nothing");
    // nodes.yaml replaced by a dangling symlink: kept, unsynced until settled.
    std::fs::remove_file(&nodes).unwrap();
    std::os::unix::fs::symlink("/nonexistent/nodes.yaml", &nodes).unwrap();
    let ev = l.rescan_at(t0);
    assert!(kinds(&ev).contains(&"unsynced"), "{:?}", kinds(&ev));
    let s = l.snapshot();
    assert!(s.cluster.nodes.contains_key("node-a"));
    let e = s.load_errors.iter().find(|e| e.file == nodes).unwrap();
    assert_eq!((e.code(), e.message.as_str()), ("vanished", "a symlink to nothing"));
}

#[test]
fn a_fifo_or_missing_root_is_refused_and_state_kept() {
    let dir = TempDir::new("root");
    let fifo = dir.0.join("cluster.yaml");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let mut l = loader(fifo.clone());
    let ev = l.rescan_at(Instant::now());
    assert_eq!(kinds(&ev), vec!["load-failed"]);
    let DatastoreEvent::LoadFailed(e) = &ev[0] else { unreachable!() };
    assert_eq!(e.message, "a FIFO is neither a regular file nor a directory: refused");
    assert!(matches!(FileDatastore::load(&fifo), Err(DatastoreError::Io { .. })));
    // A file root that goes away after loading: kept, unsynced.
    std::fs::remove_file(&fifo).unwrap();
    let file = dir.write("cluster.yaml", POOL);
    let mut l = loader(file.clone());
    assert_eq!(kinds(&l.rescan_at(Instant::now())), vec!["snapshot", "synced"]);
    std::fs::remove_file(&file).unwrap();
    let ev = l.rescan_at(Instant::now());
    assert_eq!(kinds(&ev), vec!["load-failed", "unsynced"]);
    assert_eq!(kinds(&l.rescan_at(Instant::now())), Vec::<&str>::new());
    assert!(l.snapshot().cluster.ip_pools.contains_key("p1"));
}

#[test]
fn oversized_and_deeply_nested_files_are_refused() {
    let dir = TempDir::new("limits");
    let f = dir.write("pools.yaml", POOL);
    let mut l = Loader::new(dir.0.clone(), FileOptions { max_file_size: 1000, ..FileOptions::default() }, Duration::ZERO);
    l.rescan_at(Instant::now());
    std::fs::write(&f, format!("{POOL}# {}\n", "x".repeat(2000))).unwrap();
    l.rescan_at(Instant::now());
    let s = l.snapshot();
    assert_eq!(pools(&s), ["p1 10.244.0.0/16"]);
    assert_eq!(s.load_errors[0].code(), "too-large");
    assert_eq!(s.load_errors[0].message, format!("{} bytes is over the size limit of 1000 bytes; not read", POOL.len() + 2003));
    std::fs::write(&f, format!("a: {}", "[".repeat(500))).unwrap();
    l.rescan_at(Instant::now());
    let s = l.snapshot();
    assert_eq!((s.load_errors[0].code(), s.load_errors[0].message.as_str()), ("syntax", "YAML: nesting deeper than 64 levels"));
}

#[test]
fn object_errors_name_the_file() {
    let dir = TempDir::new("objerr");
    let f =
        dir.write("bad.yaml", &format!("{POOL}---\napiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {{name: pool-a}}\nspec: {{cidr: 10.0.0/8}}\n"));
    let snap = FileDatastore::load(&dir.0).expect("loads");
    assert_eq!(snap.object_errors.len(), 1);
    assert_eq!(snap.object_errors[0].file, f);
    assert_eq!(snap.object_errors[0].to_string(), format!("{}: IPPool \"pool-a\": spec.cidr: invalid CIDR \"10.0.0/8\"", f.display()));
    assert!(snap.cluster.ip_pools.contains_key("p1"));
}

/// The same object in two files. Were the first definition to win, a new file
/// that sorts first would rewrite routes through its bogus values, and the error blamed the
/// established file. Every definition is refused, each error naming its own file and the CIDRs
/// it routes or claims (frozen ground, so nothing is rewritten or deleted there).
#[test]
fn duplicates_across_files_refuse_every_definition_and_name_each_file() {
    // The files are kept as typed objects; merging them must still behave as one pass over
    // the documents in file order.
    let dir = TempDir::new("dup");
    let a = dir.write("a.yaml", POOL);
    let b = dir.write("b.yaml", &POOL.replace("10.244.0.0/16", "10.99.0.0/16"));
    let mut l = loader(dir.0.clone());
    let ev = l.rescan_at(Instant::now());
    let s = snapshot(&ev);
    assert!(s.cluster.ip_pools.is_empty());
    let errors: Vec<(PathBuf, &str, Vec<String>, String)> =
        s.object_errors.iter().map(|e| (e.file.clone(), e.error.code(), e.cidrs.iter().map(ToString::to_string).collect(), e.error.to_string())).collect();
    let message = "IPPool \"p1\": defined more than once; every definition is refused until one is left".to_owned();
    assert_eq!(
        errors,
        [(b.clone(), "duplicate", vec!["10.99.0.0/16".to_owned()], message.clone()), (a, "duplicate", vec!["10.244.0.0/16".to_owned()], message)]
    );
    // Rebuilt from the kept objects (a.yaml broken): the same result.
    dir.write("a.yaml", "kind: [");
    let again = l.rescan_at(Instant::now());
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
    let e = dir.write("e.yaml", "");
    let err = FileDatastore::load(&e).unwrap_err();
    assert!(err.to_string().contains("no document (empty, whitespace or comments only)"), "{err}");
}

/// Every change makes the snapshot unsettled (no deletion may follow from it) until the tree
/// has been stable for the settle period; then a settled snapshot of the same content follows.
#[test]
fn snapshots_settle_once_the_tree_is_stable() {
    let dir = TempDir::new("settled");
    let f = dir.write("pools.yaml", POOL);
    let mut l = loader(dir.0.clone());
    let t0 = Instant::now();
    let ev = l.rescan_at(t0);
    assert_eq!(kinds(&ev), vec!["snapshot", "synced"]);
    assert!(!snapshot(&ev).settled, "a tree just read is not settled");
    assert_eq!(l.next_deadline(), Some(t0 + SETTLE));
    assert_eq!(kinds(&l.rescan_at((t0 + SETTLE).checked_sub(Duration::from_millis(1)).unwrap())), Vec::<&str>::new());
    let ev = l.rescan_at(t0 + SETTLE);
    assert_eq!(kinds(&ev), vec!["snapshot"]);
    let s = snapshot(&ev);
    assert!(s.settled);
    assert_eq!(pools(s), ["p1 10.244.0.0/16"]);
    assert_eq!(l.next_deadline(), None);
    // A truncation that still parses (the pool cut before its CIDR would be a syntax or
    // field error; here the second document is cut away): applied, but unsettled.
    std::fs::write(&f, format!("{POOL}---\n{}", POOL.replace("p1", "p2").replace("10.244", "10.245"))).unwrap();
    let t1 = t0 + Duration::from_mins(1);
    l.rescan_at(t1);
    std::fs::write(&f, POOL).unwrap();
    let ev = l.rescan_at(t1 + Duration::from_secs(1));
    let s = snapshot(&ev);
    assert_eq!((pools(s), s.settled), (vec!["p1 10.244.0.0/16".to_string()], false));
    assert_eq!(l.next_deadline(), Some(t1 + Duration::from_secs(1) + SETTLE));
    assert!(snapshot(&l.rescan_at(t1 + Duration::from_secs(31))).settled);
}

/// A file that is not UTF-8 (a binary dropped into the directory, a wrong encoding) is an
/// input that cannot be read: last good content kept, nothing guessed — and kept past the
/// settle period (the file is there, so nothing says its objects are gone; dropping it after
/// 30 s would delete their routes). The datastore stays synced; the plan holds every
/// deletion while it is unreadable (`plan::tests`).
#[test]
fn a_file_that_is_not_utf8_keeps_its_last_good_content() {
    let dir = TempDir::new("utf8");
    let f = dir.write("pools.yaml", POOL);
    let mut l = loader(dir.0.clone());
    let t0 = Instant::now();
    l.rescan_at(t0);
    std::fs::write(&f, b"kind: IPPool\n\xff\xfe garbage\n").unwrap();
    let ev = l.rescan_at(t0);
    assert_eq!(kinds(&ev), ["load-failed", "snapshot"]);
    let s = l.snapshot();
    assert_eq!(pools(&s), ["p1 10.244.0.0/16"]);
    assert_eq!(s.load_errors[0].code(), "io");
    assert!(s.load_errors[0].message.starts_with("not UTF-8"), "{}", s.load_errors[0].message);
    // Past the settle period: still kept, and settled (nothing pending).
    let ev = l.rescan_at(t0 + SETTLE + Duration::from_secs(1));
    assert!(!kinds(&ev).contains(&"unsynced"), "{:?}", kinds(&ev));
    let s = l.snapshot();
    assert_eq!((pools(&s), s.settled), (vec!["p1 10.244.0.0/16".to_owned()], true));
}

/// A file that is there but cannot be opened (the shipped DaemonSet drops
/// every capability, so a mode its user may not read is EACCES; here a symlink loop, ELOOP,
/// since root reads any mode) kept its last good content only for the settle period, then its
/// objects were "removed" and their routes deleted. It is kept for as long as it stays
/// unreadable, and readable again with the same content, nothing happened.
#[test]
fn an_unreadable_file_keeps_its_last_good_content_past_the_settle_period() {
    let dir = TempDir::new("unreadable");
    let f = dir.write("pools.yaml", POOL);
    let mut l = loader(dir.0.clone());
    let t0 = Instant::now();
    l.rescan_at(t0);
    std::fs::remove_file(&f).unwrap();
    std::os::unix::fs::symlink(&f, &f).unwrap();
    let ev = l.rescan_at(t0);
    assert_eq!(kinds(&ev), ["load-failed", "snapshot"]);
    for after in [SETTLE, SETTLE * 10] {
        let ev = l.rescan_at(t0 + after + Duration::from_secs(1));
        assert!(!kinds(&ev).contains(&"unsynced"), "{:?}", kinds(&ev));
        let s = l.snapshot();
        assert_eq!(
            (pools(&s), s.load_errors.len(), s.load_errors[0].code(), s.load_errors[0].never_loaded),
            (vec!["p1 10.244.0.0/16".to_owned()], 1, "io", false)
        );
    }
    std::fs::remove_file(&f).unwrap();
    std::fs::write(&f, POOL).unwrap();
    l.rescan_at(t0 + SETTLE * 11);
    let s = l.snapshot();
    assert_eq!((pools(&s), s.load_errors.len()), (vec!["p1 10.244.0.0/16".to_owned()], 0));
}

/// The running datastore reads its inputs when they change, not because it read them: its
/// own opens and closes of the input (inotify `IN_OPEN`, `IN_CLOSE_NOWRITE`) were
/// notifications, so every rescan brought the next one, every debounce window for ever. Idle
/// for a second with a 50 ms debounce: no scan after the first (the loop made ~15). A write
/// after that is still seen: one new snapshot with the new pool.
#[tokio::test]
async fn the_running_datastore_does_not_rescan_on_its_own_reads() {
    let dir = TempDir::new("own-reads");
    let file = dir.write("pools.yaml", POOL);
    let ds = FileDatastore::new(&dir.0).with_debounce(Duration::from_millis(50)).with_rescan_interval(Duration::from_mins(10));
    let scans = Arc::clone(&ds.scans);
    let (tx, mut rx) = mpsc::channel(16);
    let handle = ds.spawn(tx);
    let next = async |rx: &mut mpsc::Receiver<DatastoreEvent>| {
        tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.expect("event in time").expect("datastore alive")
    };
    let first = [next(&mut rx).await, next(&mut rx).await];
    assert_eq!(kinds(&first), ["snapshot", "synced"]);
    // A read settles for 50 ms; notifications of the first scan arrive within the debounce.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let settled = scans.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(scans.load(Ordering::Relaxed), settled, "scans while nothing changed (the first scan was {settled})");
    assert!(rx.try_recv().is_err(), "no event while nothing changed");

    std::fs::write(&file, POOL.replace("10.244.0.0/16", "10.245.0.0/16")).expect("write");
    let ev = next(&mut rx).await;
    assert_eq!(pools(snapshot(std::slice::from_ref(&ev))), ["p1 10.245.0.0/16"]);
    assert!(scans.load(Ordering::Relaxed) > settled, "the write was scanned");
    handle.abort();
}

/// A cold load parses each new file while its read settles. What it loads must be what a
/// load that parses after the pause gives: the same snapshot (objects, object errors, a
/// broken file's load error with its line) and the same events. A file changed after it was
/// loaded takes the old path (no early parse) and still loads its new content.
#[test]
fn a_cold_load_parsed_during_the_read_pause_loads_what_a_load_after_it_does() {
    let dir = TempDir::new("early-parse");
    dir.write("pools.yaml", POOL);
    dir.write("nodes.yaml", NODE);
    dir.write("broken.yaml", "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: p2\nspec: {cidr: 10.9.0.0/16}\n");
    dir.write("bad-object.yaml", "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: pool-a}\nspec: {cidr: 10.0.0/8}\n");
    let options = FileOptions { settle: SETTLE, ..FileOptions::default() };
    let mut early = Loader::new(dir.0.clone(), options, Duration::from_millis(20));
    let mut after = Loader::new(dir.0.clone(), options, Duration::ZERO);
    let now = Instant::now();
    let (early_events, after_events) = (early.rescan_at(now), after.rescan_at(now));
    assert_eq!(kinds(&early_events), kinds(&after_events));
    assert_eq!(early.snapshot(), after.snapshot());
    let s = early.snapshot();
    assert_eq!(pools(&s), ["p1 10.244.0.0/16"]);
    assert_eq!(s.load_errors.len(), 1);
    assert_eq!((s.load_errors[0].code(), s.load_errors[0].file.file_name().and_then(|n| n.to_str())), ("syntax", Some("broken.yaml")));
    assert_eq!(s.object_errors.len(), 1);
    // Loaded files change: parsed after their pause, as before.
    dir.write("broken.yaml", "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: p2}\nspec: {cidr: 10.9.0.0/16}\n");
    dir.write("pools.yaml", &POOL.replace("10.244.0.0/16", "10.245.0.0/16"));
    let later = now + Duration::from_secs(1);
    assert_eq!(kinds(&early.rescan_at(later)), kinds(&after.rescan_at(later)));
    assert_eq!(early.snapshot(), after.snapshot());
    assert_eq!(pools(&early.snapshot()), ["p1 10.245.0.0/16", "p2 10.9.0.0/16"]);
}

/// The parse made during the pause is kept only for the text it parsed: a settled text that
/// differs (the file was rewritten between the reads) is parsed again.
#[test]
fn a_parse_made_during_the_pause_is_dropped_for_a_different_settled_text() {
    let limits = crate::model::YamlLimits::default();
    let first = POOL;
    let settled = POOL.replace("10.244.0.0/16", "10.245.0.0/16");
    let early = Some((super::read::hash(first), super::loader::parse(first, &limits)));
    let got = super::loader::settled_parse(early.clone(), super::read::hash(&settled), &settled, &limits);
    assert_eq!(got, super::loader::parse(&settled, &limits));
    assert_ne!(got, early.clone().and_then(|e| e.1));
    let same = super::loader::settled_parse(early.clone(), super::read::hash(first), first, &limits);
    assert_eq!(same, early.and_then(|e| e.1));
}
