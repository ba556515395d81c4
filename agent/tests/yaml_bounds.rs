//! The bounded YAML loader on the worst inputs the file datastore admits, through the real
//! binary (`routewarden explain --datastore file:<input>`): peak RSS of the child, from
//! `getrusage(RUSAGE_CHILDREN)` (the largest child waited for so far, so every case is held to
//! the bound), and CPU time per child (the difference of the children's user + system time;
//! the cases run one after another in this one test, the only one of its binary).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use nix::sys::resource::{getrusage, UsageWho};

/// The file datastore's size limit (`--datastore-max-file-size`, 16 MiB).
const SIXTEEN_MIB: usize = 16 * 1024 * 1024;

/// Peak RSS allowed for any input the size limit admits (the DaemonSet's limit is 256 Mi).
const MAX_RSS_MIB: i64 = 200;

struct Run {
    stdout: String,
    stderr: String,
    code: Option<i32>,
    cpu: Duration,
}

fn children_cpu() -> Duration {
    let u = getrusage(UsageWho::RUSAGE_CHILDREN).expect("getrusage");
    let t = |tv: nix::sys::time::TimeVal| Duration::new(u64::try_from(tv.tv_sec()).unwrap(), u32::try_from(tv.tv_usec()).unwrap() * 1000);
    t(u.user_time()) + t(u.system_time())
}

fn children_peak_rss_mib() -> i64 {
    // Linux reports ru_maxrss in KiB.
    getrusage(UsageWho::RUSAGE_CHILDREN).expect("getrusage").max_rss() / 1024
}

fn explain(input: &Path) -> Run {
    let before = children_cpu();
    let out = Command::new(env!("CARGO_BIN_EXE_routewarden"))
        .args(["explain", "--node", "node-a", "--datastore"])
        .arg(format!("file:{}", input.display()))
        .output()
        .expect("run routewarden explain");
    Run {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        code: out.status.code(),
        cpu: children_cpu().saturating_sub(before),
    }
}

/// A `kind: List` of at most `size` bytes: `header`, `item` repeated, `footer`; and how many
/// times `item` is there.
fn list(size: usize, header: &str, item: &str, footer: &str) -> (String, usize) {
    let n = (size - header.len() - footer.len()) / item.len();
    (format!("{header}{}{footer}", item.repeat(n)), n)
}

#[test]
fn sixteen_mib_inputs_stay_under_200_mib_and_the_alias_bomb_costs_no_time() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("input.yaml");
    let write = |text: &str| {
        assert!(text.len() <= SIXTEEN_MIB, "{}", text.len());
        std::fs::write(&path, text).unwrap();
    };
    let header = "apiVersion: v1\nkind: List\nitems:\n";

    // 4,194,295 one-digit items, block style: one rejection with the count.
    let (text, n) = list(SIXTEEN_MIB, header, "- 1\n", "");
    assert_eq!(n, 4_194_295);
    write(&text);
    let r = explain(&path);
    let want = format!("warning: skipped: {}: not a Kubernetes object: {n} of the List items are not objects (the first, line 4, is a number)", path.display());
    assert!(r.stderr.lines().any(|l| l == want), "{}", r.stderr);
    assert_eq!(r.code, Some(0), "{}", r.stdout);
    let block_rss = children_peak_rss_mib();
    assert!(block_rss < MAX_RSS_MIB, "block list: peak RSS {block_rss} MiB");

    // The same as one flow sequence on the key's line.
    let (text, n) = list(SIXTEEN_MIB, "apiVersion: v1\nkind: List\nitems: [", "1,", "1]\n");
    write(&text);
    let r = explain(&path);
    let want =
        format!("warning: skipped: {}: not a Kubernetes object: {} of the List items are not objects (the first, line 3, is a number)", path.display(), n + 1);
    assert!(r.stderr.lines().any(|l| l == want), "{}", r.stderr);
    let flow_rss = children_peak_rss_mib();
    assert!(flow_rss < MAX_RSS_MIB, "flow list: peak RSS {flow_rss} MiB");

    // On a line of its own the flow sequence is one token stream the parser holds until it
    // ends: refused at the look-ahead bound, with the line it starts on.
    write(&list(SIXTEEN_MIB, "apiVersion: v1\nkind: List\nitems:\n  [", "1,", "1]\n").0);
    let r = explain(&path);
    assert_eq!(r.code, Some(2), "{}", r.stdout);
    assert!(r.stderr.contains(&format!("{}:4: YAML: a flow collection too large to parse in bounded memory", path.display())), "{}", r.stderr);
    let held_rss = children_peak_rss_mib();
    assert!(held_rss < MAX_RSS_MIB, "flow list on its own line: peak RSS {held_rss} MiB");

    // Many small broken objects: the parse stops past 1,000 rejections.
    write(&list(SIXTEEN_MIB, header, "- {kind: IPPool, metadata: {name: p}, a: 1, a: 2}\n", "").0);
    let r = explain(&path);
    assert_eq!(r.code, Some(2), "{}", r.stdout);
    assert!(r.stderr.contains("more than 1000 invalid objects: the input as a whole is refused"), "{}", r.stderr);
    let broken_rss = children_peak_rss_mib();
    assert!(broken_rss < MAX_RSS_MIB, "broken objects: peak RSS {broken_rss} MiB");

    // Items that name no kind: converted one at a time after the List's kind; before it, kept
    // only up to one object's node budget, then the input is refused.
    let item = "- {metadata: {name: p}}\n";
    write(&list(SIXTEEN_MIB, "apiVersion: projectcalico.org/v3\nkind: IPPoolList\nitems:\n", item, "").0);
    let r = explain(&path);
    assert_eq!(r.code, Some(2), "{}", r.stdout);
    assert!(r.stderr.contains("more than 1000 invalid objects: the input as a whole is refused"), "{}", r.stderr);
    write(&list(SIXTEEN_MIB, "apiVersion: projectcalico.org/v3\nitems:\n", item, "kind: IPPoolList\n").0);
    let r = explain(&path);
    assert_eq!(r.code, Some(2), "{}", r.stdout);
    assert!(r.stderr.contains("List items that name no kind hold more than 250000 YAML nodes before the List's kind"), "{}", r.stderr);
    let kindless_rss = children_peak_rss_mib();
    assert!(kindless_rss < MAX_RSS_MIB, "items that name no kind: peak RSS {kindless_rss} MiB");

    // An alias bomb: 40,000 aliases of a 10,000-element anchor, refused as an invalid object
    // at its node budget.
    let anchor = vec!["1"; 10_000].join(",");
    let aliases = vec!["*a"; 40_000].join(", ");
    write(&format!(
        "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {{name: bomb}}\nspec: {{cidr: 10.9.0.0/16}}\na: &a [{anchor}]\nb: [{aliases}]\n"
    ));
    let r = explain(&path);
    let want = format!("warning: skipped: {}: IPPool \"bomb\": line 6: object has more than 250000 YAML nodes", path.display());
    assert!(r.stderr.lines().any(|l| l == want), "{}", r.stderr);
    assert!(r.cpu < Duration::from_secs(2), "alias bomb: {:?} of CPU", r.cpu);
    eprintln!(
        "peak RSS (MiB, cumulative max): block list {block_rss}, flow list {flow_rss}, held flow {held_rss}, broken objects {broken_rss}, items naming no kind {kindless_rss}; alias bomb CPU {:?}",
        r.cpu
    );
}
