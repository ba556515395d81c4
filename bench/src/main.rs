//! routewarden's benchmark harness (`cargo xtask bench` builds it in release mode and runs it;
//! the benchmarks are the library of this crate).
//!
//! Kept out of the shipped CLI on purpose: it is a crate of its own, so `cargo test` compiles it
//! (it cannot rot), and `agent/tests/privileged/bench_smoke.rs` runs a tiny instance of it.
//!
//! ```text
//! bench [NAME...] [--agent-bin PATH] [--quick] [--runs N] [--tiny] [--record ROOT] [--check]
//! ```
//!
//! `--record ROOT` (what `cargo xtask bench` passes): after the run, record each line in
//! `ROOT/bench/current-results.txt` and regenerate the current-results table at the top of
//! `ROOT/BENCHMARKS.md` ([`routewarden_bench::results`]). `--check`: exit 3 when a benchmark
//! of the run missed its target, was skipped or failed (each named on stderr); without it a
//! missed target is a figure, not a failure of the harness.
//!
//! Each benchmark runs in network namespaces it creates (never the machine's own) and prints
//! exactly one line on stdout: `bench <name> ratio=<value> target=<value> <details>`.
//! Everything else goes to stderr. See BENCHMARKS.md at the repository root.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use routewarden_bench::benchmarks::compute_100k;
use routewarden_bench::{run_one, Options, Outcome, Shared, ALL};

/// The agent's allocator, so that what is measured in this process is what the agent does
/// (`routewarden::app::memory`).
#[global_allocator]
static ALLOCATOR: routewarden::app::memory::Allocator = routewarden::app::memory::Allocator {};

/// The `--help` text, with the name of every benchmark.
fn usage() -> String {
    format!(
        "usage: bench [NAME...] [--agent-bin PATH] [--quick] [--runs N] [--tiny] [--record ROOT] [--check]\n  names: {}\n  \
         --quick: 10 s idle window and 5 s churn for agent-footprint instead of 185 s and 30 s\n  \
         --tiny: 100 routes, one run (checks the harness, not the figures)\n  \
         --record ROOT: record the results in ROOT/bench/current-results.txt and the table of ROOT/BENCHMARKS.md\n  \
         --check: exit 3 if a benchmark missed its target, was skipped or failed\n",
        ALL.join(", ")
    )
}

/// Parse the command line, run the benchmarks, print one line each. Exit 1 if one failed
/// to run (a missed target is not a failure of the harness).
fn main() -> ExitCode {
    routewarden::app::memory::configure_allocator();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--compute-child") {
        return match compute_100k::child_main(&args[1..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("compute child: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    let tiny = args.iter().any(|a| a == "--tiny");
    let mut opts = if tiny { Options::tiny() } else { Options::full() };
    opts.child_exe = std::env::current_exe().ok();
    let mut names = Vec::new();
    let mut record_root: Option<PathBuf> = None;
    let mut check = false;
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--agent-bin" => opts.agent_bin = it.next().map(PathBuf::from),
            "--quick" => {
                opts.idle = Duration::from_secs(10);
                opts.churn = Duration::from_secs(5);
            }
            "--tiny" => {}
            "--check" => check = true,
            "--record" => {
                let Some(root) = it.next() else {
                    eprint!("--record needs the repository root\n{}", usage());
                    return ExitCode::from(2);
                };
                record_root = Some(PathBuf::from(root));
            }
            "--runs" => match it.next().and_then(|v| v.parse().ok()) {
                Some(n) if n > 0 => opts.runs = n,
                _ => {
                    eprint!("--runs needs a positive number\n{}", usage());
                    return ExitCode::from(2);
                }
            },
            "-h" | "--help" => {
                print!("{}", usage());
                return ExitCode::SUCCESS;
            }
            "all" => names.extend(ALL.iter().map(ToString::to_string)),
            n if ALL.contains(&n) => names.push(n.to_string()),
            other => {
                eprint!("unknown benchmark or option {other:?}\n{}", usage());
                return ExitCode::from(2);
            }
        }
    }
    if names.is_empty() {
        names.extend(ALL.iter().map(ToString::to_string));
    }
    if !routewarden_lab::is_root() {
        eprintln!("bench: needs root (it creates network namespaces)");
        return ExitCode::from(2);
    }
    let run = record_root.as_deref().map(routewarden_bench::results::this_run);
    let mut shared = Shared::default();
    let mut failed = false;
    let mut lines = Vec::new();
    let mut missed = Vec::new();
    for name in &names {
        eprintln!("bench: running {name} ...");
        let t = Instant::now();
        let out = run_one(name, &opts, &mut shared);
        eprintln!("bench: {name} took {:.1} s", t.elapsed().as_secs_f64());
        failed |= matches!(out, Outcome::Failed { .. });
        println!("{out}");
        if !out.met() {
            missed.push(out.name().to_string());
        }
        lines.push(out.to_string());
    }
    if let (Some(root), Some(run)) = (record_root, run) {
        // A tiny run checks the harness; its figures are not results.
        if tiny {
            eprintln!("bench: --record ignored for a --tiny run");
        } else if let Err(e) = routewarden_bench::results::record(&root, &run, &lines, &ALL) {
            eprintln!("bench: recording the results failed: {e:#}");
            failed = true;
        }
    }
    if failed {
        ExitCode::FAILURE
    } else if check && !missed.is_empty() {
        eprintln!("bench: --check: not met (missed, skipped or failed): {}", missed.join(", "));
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    }
}
