//! The benchmark harness (the `routewarden-bench` crate in `bench/`, run by `cargo xtask
//! bench`) cannot rot: a tiny instance of each benchmark that exists (100 routes, one run, in
//! its own network namespaces) prints one well-formed `bench <name> ratio=<value> target=<value> ...` line.
//! Figures are not checked here: the benchmarks are too slow and noisy for CI. Every
//! benchmark runs, except those documented as unable to run in this context
//! ([`DOCUMENTED_SKIPS`]); a benchmark that fails to run fails the test.

use routewarden_bench::{self as harness, Options, Outcome, Shared, ALL, BIRD};
use routewarden_lab::skip_unless_root;

/// Whether a documented reason to skip is true here.
type Holds = fn() -> bool;

/// The benchmarks that may skip in this test, by name, with the reason the benchmark prints
/// and the condition under which it does; a skip of any other benchmark, or for another
/// reason, or while the condition does not hold, fails the test. `agent-footprint` and
/// `bad-input-worst` need the agent binary: this test passes Cargo's build of it, so they
/// run.
const DOCUMENTED_SKIPS: &[(&str, &str, Holds)] = &[
    // A test binary built by a plain `cargo test` embeds no BPF object (`cargo xtask test` does).
    ("watch-overhead", "no BPF object embedded", no_bpf_object),
    ("tc-overhead", "no BPF object embedded", no_bpf_object),
    ("detect-latency", "no BPF object embedded", no_bpf_object),
    // BIRD 2 is a test tool `cargo xtask test` installs.
    ("cold-program-vs-bird", "not installed", no_bird),
    // So is etcd (Debian etcd-server).
    ("etcd-100k", "not installed", no_etcd),
];

fn no_bpf_object() -> bool {
    routewarden::bpf::embedded_object().is_none()
}

fn no_etcd() -> bool {
    !std::path::Path::new(harness::ETCD).exists()
}

fn no_bird() -> bool {
    !std::path::Path::new(BIRD).exists()
}

/// Whether `name` may skip here with `reason` (see [`DOCUMENTED_SKIPS`]).
fn documented_skip(name: &str, reason: &str) -> bool {
    DOCUMENTED_SKIPS.iter().any(|(n, why, applies)| *n == name && reason.contains(why) && applies())
}

/// Check `line` is `bench <name> ratio=<number> target=<op><number> met=<yes|no> k=v...` or
/// `bench <name> skipped reason="..."`.
fn well_formed(name: &str, line: &str) -> Result<(), String> {
    let rest = line.strip_prefix(&format!("bench {name} ")).ok_or("no `bench <name> ` prefix")?;
    if let Some(reason) = rest.strip_prefix("skipped reason=") {
        return if reason.len() > 2 && reason.starts_with('"') && reason.ends_with('"') { Ok(()) } else { Err("bad reason".into()) };
    }
    let mut fields = rest.split(' ');
    let ratio: f64 = fields.next().and_then(|f| f.strip_prefix("ratio=")).and_then(|v| v.parse().ok()).ok_or("no numeric ratio")?;
    if !ratio.is_finite() || ratio < 0.0 {
        return Err(format!("ratio {ratio}"));
    }
    let target = fields.next().and_then(|f| f.strip_prefix("target=")).ok_or("no target")?;
    let value = target.strip_prefix("<=").or_else(|| target.strip_prefix(">=")).ok_or("target without <= or >=")?;
    value.parse::<f64>().map_err(|e| format!("target {value:?}: {e}"))?;
    match fields.next() {
        Some("met=yes" | "met=no") => {}
        other => return Err(format!("met field {other:?}")),
    }
    for f in fields {
        let (k, v) = f.split_once('=').ok_or_else(|| format!("detail {f:?} is not key=value"))?;
        if k.is_empty() || v.is_empty() {
            return Err(format!("detail {f:?}"));
        }
    }
    Ok(())
}

#[test]
fn line_format_checker_accepts_and_rejects() {
    assert!(well_formed("x", "bench x ratio=1.02 target=<=1.5 met=yes routes=100 rw_ms=1.5").is_ok());
    assert!(well_formed("x", "bench x skipped reason=\"pending\"").is_ok());
    assert!(well_formed("x", "bench x ratio=NaN target=<=1.5 met=yes").is_err());
    assert!(well_formed("x", "bench x ratio=1 target=1.5 met=yes").is_err());
    assert!(well_formed("x", "bench x failed reason=\"boom\"").is_err());
}

#[test]
fn tiny_run_of_every_benchmark_prints_one_well_formed_line() {
    if skip_unless_root("tiny_run_of_every_benchmark_prints_one_well_formed_line") {
        return;
    }
    // The agent binary is not built by `cargo test`'s example/test build in release mode;
    // agent-footprint is exercised with the debug binary Cargo builds for integration tests.
    let mut opts = Options::tiny();
    opts.agent_bin = Some(env!("CARGO_BIN_EXE_routewarden").into());
    let mut shared = Shared::default();
    let mut skipped = Vec::new();
    for name in ALL {
        let out = harness::run_one(name, &opts, &mut shared);
        let line = out.to_string();
        eprintln!("{line}");
        assert!(!line.contains('\n'), "one line: {line}");
        if let Err(e) = well_formed(name, &line) {
            panic!("{name}: malformed line ({e}): {line}");
        }
        match &out {
            Outcome::Measured { ok, details, .. } => {
                assert!(*ok, "{name}: a side condition failed: {line}");
                if name == "resync-100k" {
                    assert!(details.iter().any(|(k, v)| k == "writes" && v == "0"), "{line}");
                }
            }
            Outcome::Skipped { reason, .. } => {
                let documented: Vec<String> = DOCUMENTED_SKIPS.iter().map(|(n, why, _)| format!("{n} ({why})")).collect();
                assert!(documented_skip(name, reason), "{name}: skipped, and only {documented:?} may, when their condition holds: {line}");
                skipped.push(name);
            }
            Outcome::Failed { .. } => panic!("{name}: failed: {line}"),
        }
    }
    eprintln!("bench_smoke: {} of {} benchmarks measured; documented skips here: {skipped:?}", ALL.len() - skipped.len(), ALL.len());
}

#[test]
fn documented_skips_name_real_benchmarks() {
    for (name, why, _) in DOCUMENTED_SKIPS {
        assert!(ALL.contains(name), "{name} is not a benchmark");
        assert!(!why.is_empty());
    }
    assert!(!documented_skip("agent-footprint", "no --agent-bin (cargo xtask bench passes target/release/routewarden)"));
    assert!(!documented_skip("bad-input-worst", "no --agent-bin (cargo xtask bench passes target/release/routewarden)"));
    assert!(!documented_skip("cold-program-10k", "not implemented"));
    assert_eq!(documented_skip("watch-overhead", "no BPF object embedded (`cargo xtask bench` builds one)"), no_bpf_object());
    assert!(!documented_skip("watch-overhead", "not implemented"));
}
