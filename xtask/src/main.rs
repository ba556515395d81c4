//! `cargo xtask`: set up the toolchain, build, run the lab, test.
//!
//! Every command first checks the build toolchain ([`setup::ensure`]) and installs what is
//! missing, so a fresh Debian machine needs no extra step.

mod bench;
mod build;
mod image;
mod lab_nodes;
mod licences;
mod plugin;
mod qemu;
mod run;
mod sbom;
mod setup;
mod test;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "routewarden's build, lab and test tasks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install what the build needs (root, Debian/Ubuntu): Debian's rustc-web with the BPF
    /// core library registered as the rustup toolchain `debian`, LLVM 22, bpf-linker 0.13.
    Setup,
    /// Build the BPF object (with BTF) and the agent in release mode, embedding the object.
    Build,
    /// Build, create a throw-away lab of network namespaces mirroring the example cluster,
    /// run the agent for one node in it, show what it found and did; tear down on exit.
    Run(run::RunArgs),
    /// The whole test suite: unit tests, network-namespace integration tests.
    Test(test::TestArgs),
    /// The OCI image (Containerfile): build the release agent, then the image FROM scratch
    /// with podman; write target/image/routewarden-<version>.oci.tar, tag
    /// routewarden:<version>, print the archive, the tag and the size.
    Image,
    /// `kubectl routewarden` as a krew plugin: the release binary packed as
    /// target/image/kubectl-routewarden-linux-amd64.tar.gz and deploy/krew/routewarden.yaml
    /// rendered with its uri and sha256 into target/image/krew-routewarden.yaml.
    Plugin(plugin::PluginArgs),
    /// Benchmarks (root): build in release mode, run each in network namespaces it creates,
    /// print one `bench <name> ratio=<value> target=<value> <details>` line each.
    Bench(bench::BenchArgs),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Setup => setup::ensure(),
        Command::Build => {
            setup::ensure()?;
            build::build_all().map(|_| ())
        }
        Command::Run(args) => {
            setup::ensure()?;
            run::run(&args)
        }
        Command::Test(args) => {
            setup::ensure()?;
            test::test(&args)
        }
        Command::Image => {
            setup::ensure()?;
            image::image()
        }
        Command::Plugin(args) => {
            setup::ensure()?;
            plugin::plugin(&args)
        }
        Command::Bench(args) => {
            setup::ensure()?;
            bench::bench(&args)
        }
    }
}

/// The workspace root (xtask lives in `<root>/xtask`).
///
/// # Panics
/// Never in practice: `CARGO_MANIFEST_DIR` of xtask always has a parent.
pub fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask is inside the workspace").to_path_buf()
}

/// Run a command, echoing it first; fail on non-zero exit.
pub fn run_cmd(cmd: &mut std::process::Command) -> Result<()> {
    eprintln!("+ {}", display(cmd));
    let status = cmd.status().map_err(|e| anyhow::anyhow!("cannot start {}: {e}", display(cmd)))?;
    if !status.success() {
        anyhow::bail!("`{}` failed: {status}", display(cmd));
    }
    Ok(())
}

/// A command as a shell-like string, for logs.
pub fn display(cmd: &std::process::Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}
