//! `cargo xtask bench [NAME...]`: the benchmarks, as ratios against references
//! measured in the same run.
//!
//! 1. Build the BPF object and the release agent (as `cargo xtask build`, into `target/`).
//! 2. Build the harness (the `bench` binary of `bench/`, crate `routewarden-bench`) in release
//!    mode with the same settings.
//! 3. Run it as root: every benchmark in network namespaces or a lab it creates, never the
//!    machine's own namespace. Each prints one line on stdout,
//!    `bench <name> ratio=<value> target=<value> <details>`; progress goes to stderr.
//!
//! Not part of `cargo xtask test` (too slow and noisy for CI); `agent/tests/privileged/bench_smoke.rs`
//! runs a tiny instance there so the harness cannot rot. Each run records its lines in
//! `bench/current-results.txt` and regenerates the table BENCHMARKS.md opens with
//! (`routewarden_bench::results`); the sections below it are written by hand.

use std::process::Command;

use anyhow::{bail, Result};
use clap::Args;

use crate::{build::build_all, run_cmd, workspace_root};

/// Options of `cargo xtask bench`.
#[derive(Args)]
pub struct BenchArgs {
    /// Benchmarks to run (default: all): cold-program-10k, cold-program-vs-bird,
    /// cold-program-vs-floor, resync-100k, node-move, compute-100k, watch-overhead, tc-overhead,
    /// detect-latency, agent-footprint, bad-input-worst, all-nodes-5k, kube-heartbeats,
    /// kube-100k, etcd-100k.
    pub names: Vec<String>,
    /// Short idle window for agent-footprint (10 s instead of 60 s).
    #[arg(long)]
    pub quick: bool,
    /// Fail when a benchmark of the run misses its target, is skipped or fails (without it a
    /// missed target is reported in the table, not an error).
    #[arg(long)]
    pub check: bool,
    /// Repetitions of each measurement (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub runs: u32,
}

/// Build and run the benchmarks.
pub fn bench(args: &BenchArgs) -> Result<()> {
    if !routewarden_lab::is_root() {
        bail!("`cargo xtask bench` creates network namespaces and needs root");
    }
    crate::setup::ensure_test_tools()?; // bird2 for cold-program-vs-bird
    let agent = build_all()?;
    let root = workspace_root();
    // The same environment as build_all, so the agent library is not rebuilt differently.
    let object = root.join("target/bpf/bpfel-unknown-none/release/routewarden-ebpf.o");
    run_cmd(
        Command::new("cargo")
            .args(["build", "--release", "-p", "routewarden-bench", "--bin", "bench"])
            .current_dir(&root)
            .env("CARGO_TARGET_DIR", root.join("target"))
            .env("ROUTEWARDEN_BPF_OBJECT", &object),
    )?;
    let harness = root.join("target/release/bench");
    let uname = Command::new("uname").arg("-r").output().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()).unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    eprintln!("bench: machine: {cores} cores, kernel {uname}; {} run(s) per measurement, median reported", args.runs);
    let mut cmd = Command::new(&harness);
    cmd.args(&args.names).arg("--agent-bin").arg(&agent).args(["--runs", &args.runs.to_string()]).arg("--record").arg(&root);
    if args.quick {
        cmd.arg("--quick");
    }
    if args.check {
        cmd.arg("--check");
    }
    run_cmd(&mut cmd)
}
