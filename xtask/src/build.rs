//! `cargo xtask build`: the BPF object, then the agent with the object embedded.

use std::path::PathBuf;
use std::process::Command;

use anyhow::Result;

use crate::{run_cmd, setup::tools_bin, workspace_root};

/// Build the kernel-side crate for `bpfel-unknown-none` with Debian's toolchain and BTF.
/// Returns the object's path (`target/bpf/bpfel-unknown-none/release/routewarden-ebpf`).
///
/// The recipe (toolchain.md): `RUSTC_BOOTSTRAP=aya_ebpf` scoped to the one crate that uses
/// `asm_experimental_arch`; `-Cdebuginfo=2 -Clink-arg=--btf` for BTF; the xtask's own cargo
/// variables removed so `rustup run debian cargo` picks Debian's rustc.
pub fn build_bpf() -> Result<PathBuf> {
    let root = workspace_root();
    let target_dir = root.join("target/bpf");
    let mut cmd = Command::new("rustup");
    cmd.args(["run", "debian", "cargo", "build", "-p", "routewarden-ebpf", "--release", "--target", "bpfel-unknown-none"])
        .current_dir(&root)
        .env("CARGO_TARGET_DIR", &target_dir)
        .env("RUSTC_BOOTSTRAP", "aya_ebpf")
        .env("CARGO_ENCODED_RUSTFLAGS", "-Cdebuginfo=2\u{1f}-Clink-arg=--btf")
        .env("PATH", tools_path());
    for v in ["RUSTC", "RUSTC_WORKSPACE_WRAPPER", "RUSTUP_TOOLCHAIN", "CARGO", "RUSTFLAGS"] {
        cmd.env_remove(v);
    }
    run_cmd(&mut cmd)?;
    Ok(target_dir.join("bpfel-unknown-none/release/routewarden-ebpf"))
}

/// `PATH` with the tools of `target/tools/bin` (bpf-linker, cargo-auditable) first.
fn tools_path() -> String {
    format!("{}:{}", tools_bin().display(), std::env::var("PATH").unwrap_or_default())
}

/// Build the BPF object and the agent (release), embedding the object. Returns the agent's path.
pub fn build_all() -> Result<PathBuf> {
    build_agent(&build_bpf()?)
}

/// Build the release agent with the BPF object `object` embedded (`target/release/routewarden`,
/// the binary the image ships). A no-op for cargo when it is already built from this tree, as
/// in `cargo xtask test`, whose image step builds it before the QEMU lane copies it.
///
/// Built with `cargo auditable` ([`crate::setup::CARGO_AUDITABLE_VERSION`], in `target/tools`):
/// the binary carries its dependency graph (crate names, versions, sources) compressed in a
/// `.dep-v0` section, which trivy, grype, syft and `cargo audit bin` read.
pub fn build_agent(object: &std::path::Path) -> Result<PathBuf> {
    let root = workspace_root();
    run_cmd(
        Command::new("cargo")
            .args(["auditable", "build", "--locked", "--release", "-p", "routewarden"])
            .current_dir(&root)
            .env("CARGO_TARGET_DIR", root.join("target"))
            .env("ROUTEWARDEN_BPF_OBJECT", object)
            .env("PATH", tools_path()),
    )?;
    let bin = root.join("target/release/routewarden");
    eprintln!("built {} (BPF object {} embedded)", bin.display(), object.display());
    Ok(bin)
}
