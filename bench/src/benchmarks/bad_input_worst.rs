//! `bad-input-worst`: the agent against the worst inputs up to the size limit, for
//! its peak RSS, its parse time and the linearity of parsing. Target: at most 1. Needs
//! `--agent-bin`.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use routewarden_lab::{Lab, LabNodeSpec, LabSpec};

use crate::procfs::proc_mem_kib;
use crate::report::{fmt_ratio, kv};
use crate::{Benchmark, Options, Outcome, Shared, Target};

/// This benchmark's registry entry: its name and [`run`].
pub const BENCHMARK: Benchmark = Benchmark { name: "bad-input-worst", run };

/// Files of one object each written at once (re-reading each after its own pause made 5,000
/// of them take minutes to a first sync).
const MANY_FILES: usize = 5_000;
/// Their target: synced within this many seconds.
const MANY_FILES_S: f64 = 5.0;

/// The size every worst-case file is built to: just under the 16 MiB default limit.
const WORST_BYTES: usize = 16 * 1024 * 1024 - 4096;

/// A text of about `bytes` bytes: `head`, then `unit` repeated, then `tail`.
fn filled(head: &str, unit: &str, tail: &str, bytes: usize) -> String {
    let n = bytes.saturating_sub(head.len() + tail.len()) / unit.len();
    let mut s = String::with_capacity(head.len() + unit.len() * n + tail.len());
    s.push_str(head);
    for _ in 0..n {
        s.push_str(unit);
    }
    s.push_str(tail);
    s
}

/// `a: &a [x, ...]` of 10,000 elements, then `b: [*a, ...]` of 40,000 aliases.
fn alias_fanout() -> String {
    let mut s = String::from("a: &a [");
    s.push_str(&vec!["x"; 10_000].join(", "));
    s.push_str("]\nb: [");
    s.push_str(&vec!["*a"; 40_000].join(", "));
    s.push_str("]\n");
    s
}

/// Invalid IP pools (their `cidr` a list) naming 1,200 addresses each, about `bytes` long.
fn frozen_amplification(bytes: usize) -> String {
    let mut s = String::with_capacity(bytes + 32 * 1024);
    let mut p = 0u32;
    while s.len() < bytes.saturating_sub(32 * 1024) {
        let _ = write!(s, "---\napiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {{name: bad-{p}}}\nspec: {{cidr: [");
        for a in 0..1_200u32 {
            let _ = write!(s, "{}10.{}.{}.{}", if a == 0 { "" } else { ", " }, 100 + (p / 250) % 100, p % 250, a % 250);
        }
        s.push_str("]}\n");
        p += 1;
    }
    s
}

/// The worst shapes of bad input, each `bytes` long: what the parser must survive in bounded
/// memory and linear time.
pub fn worst_inputs(bytes: usize) -> Vec<(&'static str, String)> {
    let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..12 {
        let _ = writeln!(bomb, "a{i}: &a{i} [{}]", vec![format!("*a{}", i - 1); 10].join(", "));
    }
    vec![
        (
            "allocations-nulls",
            filled(
                "apiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {name: 10-244-99-0-26}\nspec: {cidr: 10.244.99.0/26, affinity: \"host:node-b\", allocations: [",
                "null, ",
                "0]}\n",
                bytes,
            ),
        ),
        (
            "many-invalid-objects",
            filled(
                "apiVersion: v1\nkind: List\nitems:\n",
                "- {apiVersion: projectcalico.org/v3, kind: IPPool, metadata: {name: p}, spec: {cidr: x}}\n",
                "",
                bytes,
            ),
        ),
        ("deep-nesting", filled("", "[", "", bytes)),
        // An alias fanned out 40,000 times over a 10,000-element anchor (180 KB; it
        // cost 21 s when every alias was cloned before the budget check), padded.
        ("alias-fanout", filled(&alias_fanout(), "# padding to the size limit ...........................................\n", "", bytes)),
        // A List of scalars: one rejection, not a value per item (2.55 GB at 16 MiB before).
        ("scalar-list", filled("apiVersion: v1\nkind: List\nitems: [", "1, ", "1]\n", bytes)),
        // Invalid pools naming 1,200 addresses each: one input freezes at most 1,024
        // prefixes one by one (1,000 objects froze 1,001,000 before).
        ("frozen-amplification", frozen_amplification(bytes)),
        ("alias-bomb", filled(&bomb, "# padding to the size limit ...........................................\n", "", bytes)),
        ("huge-name", filled("apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: \"", "a", "\"}\nspec: {cidr: 10.250.0.0/16}\n", bytes)),
        (
            // Kinds routewarden ignores, then one invalid object so the agent says it read it all.
            "unknown-kinds",
            filled(
                "apiVersion: v1\nkind: List\nitems:\n",
                "- {apiVersion: v1, kind: ConfigMap, metadata: {name: c}, data: {k: v}}\n",
                "- {apiVersion: projectcalico.org/v3, kind: IPPool, metadata: {name: last}, spec: {cidr: x}}\n",
                bytes,
            ),
        ),
    ]
}

/// The target: agent RSS <= 200 MB and parse <= 2 s for any input up to the size limit,
/// with parse time linear in the input. The agent (release, in a one-node lab on the example
/// cluster) is given each worst shape in turn as a new file; the time from the write to the
/// agent reporting it on /metrics bounds its parse (debounce and half-write re-read included);
/// its peak RSS (VmHWM) covers all of them. Linearity: the harness parses each shape in-process
/// at 1 MiB and at 16 MiB; the ratio of their per-byte costs is the reference measured in the
/// same run. Then 5,000 one-object files at once, to be synced within 5 s. ratio = the largest
/// of rss/200 MB, parse/2 s, per-byte(16 MiB)/per-byte(1 MiB)/1.5 and many-files/5 s.
#[expect(clippy::too_many_lines, reason = "one benchmark, its shapes and its report in order")]
pub fn run(opts: &Options, _shared: &mut Shared) -> Result<Outcome> {
    let name = BENCHMARK.name;
    let Some(agent) = &opts.agent_bin else {
        return Ok(Outcome::Skipped { name: name.into(), reason: "no --agent-bin (cargo xtask bench passes target/release/routewarden)".into() });
    };
    let bytes = if opts.routes < 1_000 { 1024 * 1024 } else { WORST_BYTES };
    // A tenth as many files in a tiny run (the smoke test's debug agent).
    let many = if opts.routes < 1_000 { MANY_FILES / 10 } else { MANY_FILES };
    // Linearity, in-process (the median of `runs`).
    let mut linear = Vec::new();
    for ((shape, small), (_, big)) in worst_inputs(bytes / 16).into_iter().zip(worst_inputs(bytes)) {
        let time = |text: &str| -> f64 {
            let mut v: Vec<f64> = (0..opts.runs.max(1))
                .map(|_| {
                    let t = Instant::now();
                    let _ = routewarden::model::ParsedObjects::from_yaml_str(text, &routewarden::model::YamlLimits::default());
                    t.elapsed().as_secs_f64()
                })
                .collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (ts, tb) = (time(&small), time(&big));
        let per_byte = (tb / big.len() as f64) / (ts / small.len() as f64).max(f64::MIN_POSITIVE);
        linear.push((shape, ts, tb, per_byte));
    }
    // The agent.
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster");
    let snap = routewarden::datastore::FileDatastore::load(&examples)?;
    let node = snap.cluster.nodes.get("node-a").context("node-a in the examples")?;
    let lab = Lab::build(LabSpec::new(vec![LabNodeSpec { name: "node-a".into(), addresses: node.bgp_addresses().iter().map(ToString::to_string).collect() }]))?;
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("cluster");
    std::fs::create_dir(&data)?;
    for e in std::fs::read_dir(&examples)? {
        let e = e?;
        std::fs::copy(e.path(), data.join(e.file_name()))?;
    }
    let log = std::fs::File::create(dir.path().join("agent.log"))?;
    let mut child = lab
        .command("node-a", &agent.display().to_string())
        // A short settle period: each shape's file is removed again before the next.
        .args(["run", "--node", "node-a", "--metrics-addr", "127.0.0.1:9695", "--log-format", "text", "--settle-period", "2", "--datastore"])
        .arg(format!("file:{}", data.display()))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("start the agent")?;
    let pid = child.id();
    let result = (|| -> Result<Vec<(&'static str, Duration)>> {
        let invalid = || -> Option<f64> {
            let (code, body) = lab.http_get("node-a", 9695, "/metrics").ok()?;
            (code == 200).then_some(())?;
            let get = |series: &str| body.lines().find_map(|l| l.strip_prefix(series).and_then(|r| r.trim().parse::<f64>().ok()));
            Some(get("routewarden_datastore_invalid_objects ")? + get("routewarden_datastore_invalid_inputs ")?)
        };
        let wait = |what: &str, limit: Duration, f: &dyn Fn() -> bool| -> Result<Duration> {
            let t = Instant::now();
            while !f() {
                ensure!(t.elapsed() < limit, "timed out after {limit:?} waiting for {what}");
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(t.elapsed())
        };
        wait("the agent's first snapshot", Duration::from_secs(30), &|| invalid() == Some(0.0))?;
        let mut out = Vec::new();
        for (shape, text) in worst_inputs(bytes) {
            if let Some(status) = child.try_wait()? {
                bail!("the agent exited during {shape}: {status}");
            }
            let path = data.join("bad.yaml");
            let t = Instant::now();
            std::fs::write(&path, &text)?;
            wait(shape, Duration::from_mins(1), &|| invalid().is_some_and(|n| n >= 1.0))?;
            out.push((shape, t.elapsed()));
            std::fs::remove_file(&path)?;
            // Removing a file holds its content for the settle period: wait it out.
            wait("the file's removal", Duration::from_secs(90), &|| invalid() == Some(0.0))?;
        }
        // 5,000 one-object files (each re-read after its own 50-ms pause took 252 s
        // to sync): the time from the first write to the agent reporting all 5,000. The
        // writing alone is reported beside it (`many-files-write_s`): on a filesystem this
        // benchmark has just filled and emptied, ext4's inode allocation skips recently
        // deleted inodes (`recently_deleted`, `find_inode_bit`) and the writer's own creates
        // took 0.2-4 s of CPU, the agent running or not.
        let t = Instant::now();
        for i in 0..many {
            std::fs::write(data.join(format!("many-{i}.yaml")), format!("apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {{name: many-{i}}}\nspec: {{cidr: x}}\n"))?;
        }
        out.push(("many-files-write", t.elapsed()));
        wait("the many files", Duration::from_mins(5), &|| invalid().is_some_and(|n| n >= many as f64))?;
        out.push(("many-files", t.elapsed()));
        for i in 0..many {
            std::fs::remove_file(data.join(format!("many-{i}.yaml")))?;
        }
        wait("the files' removal", Duration::from_secs(90), &|| invalid() == Some(0.0))?;
        Ok(out)
    })();
    let (hwm_kib, _) = proc_mem_kib(&pid.to_string()).unwrap_or((0, 0));
    let _ = child.kill();
    let _ = child.wait();
    let detect = result.map_err(|e| {
        anyhow!(
            "{e:#}; agent log: {}",
            std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default().lines().rev().take(5).collect::<Vec<_>>().join(" | ")
        )
    })?;
    drop(lab);
    let peak_mb = hwm_kib as f64 / 1024.0;
    let worst_parse = detect.iter().filter(|(s, _)| !s.starts_with("many-files")).map(|(_, d)| d.as_secs_f64()).fold(0.0, f64::max);
    let many_files = detect.iter().find(|(s, _)| *s == "many-files").map_or(0.0, |(_, d)| d.as_secs_f64());
    let worst_linear = linear.iter().map(|l| l.3).fold(0.0, f64::max);
    let ratio = (peak_mb / 200.0).max(worst_parse / 2.0).max(worst_linear / 1.5).max(many_files / MANY_FILES_S);
    let mut details = vec![
        kv("peak_rss_mb", format!("{peak_mb:.1}")),
        kv("worst_parse_s", format!("{worst_parse:.2}")),
        kv("worst_per_byte_ratio", fmt_ratio(worst_linear)),
        kv("bytes", bytes),
    ];
    for (shape, d) in &detect {
        details.push(kv(&format!("{shape}_s"), format!("{:.2}", d.as_secs_f64())));
    }
    for (shape, ts, tb, r) in &linear {
        details.push(kv(&format!("{shape}_inproc_ms"), format!("{:.1}/{:.1}", ts * 1e3, tb * 1e3)));
        details.push(kv(&format!("{shape}_per_byte_ratio"), fmt_ratio(*r)));
    }
    details.push(kv("many_files", many));
    details.push(kv("runs", opts.runs));
    Ok(Outcome::Measured { name: name.into(), ratio, target: Target::AtMost(1.0), ok: true, details })
}
