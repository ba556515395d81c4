//! `cargo xtask test`: the whole suite.
//!
//! 1. Build the BPF object (so the agent under test embeds it and the BPF tests run).
//! 2. `cargo test --workspace`: unit tests, property tests, and the privileged network-namespace
//!    integration tests (each in namespaces it creates; root needed, as in CI).

use std::process::Command;

use anyhow::Result;
use clap::Args;

use crate::{build::build_bpf, run_cmd, workspace_root};

/// Options of `cargo xtask test`.
#[derive(Args)]
pub struct TestArgs {
    /// Extra arguments passed to `cargo test` after `--` (test name filters, `--nocapture`).
    #[arg(trailing_var_arg = true)]
    pub cargo_test_args: Vec<String>,
}

/// Run the suite.
pub fn test(args: &TestArgs) -> Result<()> {
    let root = workspace_root();
    let object = build_bpf()?;
    if !routewarden_lab::is_root() {
        eprintln!("NOTE: not root: the network-namespace and BPF tests will print SKIPPED; CI runs as root");
    }
    let mut cmd = Command::new("cargo");
    cmd.args(["test", "--workspace"])
        .current_dir(&root)
        .env("CARGO_TARGET_DIR", root.join("target"))
        .env("ROUTEWARDEN_BPF_OBJECT", &object);
    if !args.cargo_test_args.is_empty() {
        cmd.arg("--").args(&args.cargo_test_args);
    }
    run_cmd(&mut cmd)
}
