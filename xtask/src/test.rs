//! `cargo xtask test`: the whole suite.
//!
//! 1. Build the BPF object (so the agent under test embeds it and the BPF tests run).
//! 2. `cargo test --workspace`: unit tests, property tests, and the privileged network-namespace
//!    integration tests (each in namespaces it creates; root needed, as in CI).
//! 3. Before that, the image ([`crate::image`], as `cargo xtask image`): its id and archive go to
//!    `agent/tests/image.rs` and `agent/tests/in_cluster.rs` (the rendered DaemonSet against the
//!    API-server stand-in; it also needs `kubectl` for kustomize) as `ROUTEWARDEN_IMAGE` /
//!    `ROUTEWARDEN_IMAGE_ARCHIVE`. Skip with `--no-image` (those tests then print SKIPPED).
//! 4. The QEMU lane ([`crate::qemu`]): the privileged tests that need fentry, kprobes or a real
//!    `tunl0`, under Debian's stock kernel in QEMU. Its guest boots once every test binary is
//!    built and runs while step 2's tests do (its console is printed after them). Skip with
//!    `--no-qemu`; run alone with `--qemu-only`.

use std::process::Command;

use anyhow::Result;
use clap::Args;

use crate::{build::build_bpf, run_cmd, workspace_root};

/// Options of `cargo xtask test`.
#[derive(Args)]
#[expect(clippy::struct_excessive_bools, reason = "independent command-line switches")]
pub struct TestArgs {
    /// Do not run the QEMU lane.
    #[arg(long)]
    pub no_qemu: bool,
    /// Do not build the image (saves the release build; the image tests print SKIPPED).
    #[arg(long)]
    pub no_image: bool,
    /// Run only the QEMU lane.
    #[arg(long, conflicts_with = "no_qemu")]
    pub qemu_only: bool,
    /// Skip the house rules (`cargo fmt --check`, clippy with `-D warnings`); CI runs them.
    #[arg(long)]
    pub no_lint: bool,
    #[expect(clippy::struct_field_names, reason = "the flag is `cargo test`'s arguments; renaming it would change the CLI")]
    /// Extra arguments passed to `cargo test` after `--` (test name filters, `--nocapture`).
    #[arg(trailing_var_arg = true)]
    pub cargo_test_args: Vec<String>,
}

/// The house rules (issue 15): the whole tree formatted (`rustfmt.toml`), and clippy with the
/// workspace lints (pedantic, `Cargo.toml` `[workspace.lints]`) and `-D warnings` on every
/// host crate and target, and on the BPF crate. Debian's BPF toolchain ships no clippy, so the
/// BPF crate is linted for the host target with panic=abort (aya-ebpf builds there; the lints
/// are about the source, which is the same).
///
/// # Errors
/// The first rule broken, naming the command.
pub fn lint(root: &std::path::Path) -> Result<()> {
    run_cmd(Command::new("cargo").args(["fmt", "--all", "--", "--check"]).current_dir(root))?;
    run_cmd(Command::new("cargo").args(["clippy", "--all-targets", "--", "-D", "warnings"]).current_dir(root).env("CARGO_TARGET_DIR", root.join("target")))?;
    run_cmd(
        Command::new("cargo")
            .args(["clippy", "-p", "routewarden-ebpf", "--config", "profile.dev.panic=\"abort\"", "--", "-D", "warnings"])
            .current_dir(root)
            .env("CARGO_TARGET_DIR", root.join("target/clippy-ebpf")),
    )
}

/// Run the suite.
pub fn test(args: &TestArgs) -> Result<()> {
    let root = workspace_root();
    crate::setup::ensure_test_tools()?;
    let object = build_bpf()?;
    if args.qemu_only {
        return crate::qemu::run(&object).map(|_| ());
    }
    if !args.no_lint {
        lint(&root)?;
    }
    if !routewarden_lab::is_root() {
        eprintln!("NOTE: not root: the network-namespace and BPF tests will print SKIPPED; CI runs as root");
    }
    // A failed image build fails the run, but after the other tests have run.
    let image = if args.no_image { Ok(None) } else { crate::image::ensure_tools(true).and_then(|()| crate::image::build()).map(Some) };
    let cargo_test = || {
        let mut cmd = Command::new("cargo");
        cmd.args(["test", "--workspace"]).current_dir(&root).env("CARGO_TARGET_DIR", root.join("target")).env("ROUTEWARDEN_BPF_OBJECT", &object);
        cmd
    };
    // The lane's guest runs beside the host tests: it is CPU-bound (TCG), they mostly wait
    // (BIRD's sessions, Prometheus' rule evaluation, the agent's timers), so the two take
    // about as long as the longer one instead of their sum. Every test binary is built first,
    // so that neither compiles while the other runs and the lane's own build is a no-op.
    let lane = if args.no_qemu {
        None
    } else {
        run_cmd(cargo_test().arg("--no-run"))?;
        Some(crate::qemu::Lane::prepare(&object).map(crate::qemu::Lane::spawn))
    };
    let mut cmd = cargo_test();
    // --no-fail-fast: one failing test binary must not hide the results of the others.
    cmd.arg("--no-fail-fast");
    match &image {
        Ok(Some(image)) => {
            eprint!("{}", crate::image::summary(image));
            cmd.env("ROUTEWARDEN_IMAGE", &image.id).env("ROUTEWARDEN_IMAGE_ARCHIVE", &image.archive);
        }
        Ok(None) => {}
        Err(e) => eprintln!("image build failed, its tests will print SKIPPED: {e:#}"),
    }
    if !args.cargo_test_args.is_empty() {
        cmd.arg("--").args(&args.cargo_test_args);
    }
    let host = image.and(run_cmd(&mut cmd));
    let Some(lane) = lane else { return host };
    // The lane's result counts even when host tests failed: both are useful in one CI run.
    let lane = lane.and_then(|guest| {
        let (lane, lines) = guest.join().map_err(|_| anyhow::anyhow!("the qemu lane's thread panicked"))??;
        crate::qemu::Lane::echo(&lines);
        lane.report(&lines)
    });
    host.and(lane.map(|_| ()))
}
