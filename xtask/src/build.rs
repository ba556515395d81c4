//! `cargo xtask build`: the BPF object, then the agent with the object embedded; for this
//! machine (x86-64) or, cross-built, for arm64 ([`Arch`]).

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result};

use crate::{run_cmd, setup::tools_bin, workspace_root};

/// A CPU architecture the release agent and its image are built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// x86-64: the build machine's own; built with rustup's toolchain.
    Amd64,
    /// 64-bit Arm: cross-built with Debian's toolchain (its aarch64 standard library) and
    /// `aarch64-linux-gnu-gcc` as linker and C compiler; run under `qemu-aarch64-static`.
    Arm64,
}

impl Arch {
    /// The OCI (and Debian) name: `amd64`, `arm64`.
    pub fn oci(self) -> &'static str {
        match self {
            Arch::Amd64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    /// The Rust target triple.
    pub fn triple(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86_64-unknown-linux-gnu",
            Arch::Arm64 => "aarch64-unknown-linux-gnu",
        }
    }

    /// aya-ebpf's `bpf_target_arch`: which `pt_regs` layout the kprobe programs read their
    /// arguments from (`aya_ebpf::args`; set through aya-build's `AYA_BPF_TARGET_ARCH`).
    fn bpf_target_arch(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86_64",
            Arch::Arm64 => "aarch64",
        }
    }

    /// The BPF object's cargo target directory: one per architecture, so that neither build
    /// invalidates the other's.
    fn bpf_target_dir(self) -> PathBuf {
        workspace_root().join(match self {
            Arch::Amd64 => "target/bpf",
            Arch::Arm64 => "target/bpf-arm64",
        })
    }
}

/// Build the kernel-side crate for `bpfel-unknown-none` with Debian's toolchain and BTF, for
/// an agent running on this machine's architecture (x86-64). Returns the path of the object
/// the agent embeds (`target/bpf/bpfel-unknown-none/release/routewarden-ebpf.o`, see
/// [`build_bpf_for`]).
pub fn build_bpf() -> Result<PathBuf> {
    build_bpf_for(Arch::Amd64)
}

/// Build the BPF object for an agent running on `arch` (`target/bpf` for amd64,
/// `target/bpf-arm64` for arm64). The object is bytecode either way; only the kprobe
/// programs differ, as they read the probed function's arguments from `arch`'s registers.
///
/// The recipe (toolchain.md): `RUSTC_BOOTSTRAP=aya_ebpf` scoped to the one crate that uses
/// `asm_experimental_arch`; `-Cdebuginfo=2 -Clink-arg=--btf` for BTF; the xtask's own cargo
/// variables removed so `rustup run debian cargo` picks Debian's rustc.
///
/// The object returned is cargo's output without its DWARF ([`strip_dwarf`]): BTF, which the
/// loader and the kernel read, stays.
pub fn build_bpf_for(arch: Arch) -> Result<PathBuf> {
    let root = workspace_root();
    let target_dir = arch.bpf_target_dir();
    let mut cmd = Command::new("rustup");
    cmd.args(["run", "debian", "cargo", "build", "-p", "routewarden-ebpf", "--release", "--target", "bpfel-unknown-none"])
        .current_dir(&root)
        .env("CARGO_TARGET_DIR", &target_dir)
        .env("RUSTC_BOOTSTRAP", "aya_ebpf")
        .env("AYA_BPF_TARGET_ARCH", arch.bpf_target_arch())
        .env("CARGO_ENCODED_RUSTFLAGS", "-Cdebuginfo=2\u{1f}-Clink-arg=--btf")
        .env("PATH", tools_path());
    for v in ["RUSTC", "RUSTC_WORKSPACE_WRAPPER", "RUSTUP_TOOLCHAIN", "CARGO", "RUSTFLAGS"] {
        cmd.env_remove(v);
    }
    run_cmd(&mut cmd)?;
    let built = target_dir.join("bpfel-unknown-none/release/routewarden-ebpf");
    let object = built.with_extension("o");
    strip_dwarf(&built, &object)?;
    Ok(object)
}

/// LLVM's tools, from Debian's `llvm-22` (a dependency of `llvm-22-dev`, [`crate::setup::APT_PACKAGES`]).
pub const LLVM_BIN: &str = "/usr/lib/llvm-22/bin";

/// Write `built` without its DWARF sections to `object` (`llvm-strip -g`, as libbpf-bootstrap
/// and cilium/ebpf's bpf2go strip their objects). The `-Cdebuginfo=2` that BTF needs leaves
/// about 2.2 MB of DWARF beside 0.6 MB of code, BTF and maps; nothing reads it (aya and the
/// kernel read `.BTF` and `.BTF.ext`), and embedded it was resident in every agent (read
/// whole at the load) and parsed at each start. `object` is rewritten only when its bytes
/// change, so an unchanged BPF crate rebuilds no agent (`agent/build.rs` watches the file).
pub fn strip_dwarf(built: &std::path::Path, object: &std::path::Path) -> Result<()> {
    let tmp = object.with_extension("o.tmp");
    run_cmd(Command::new(std::path::Path::new(LLVM_BIN).join("llvm-strip")).arg("-g").arg("-o").arg(&tmp).arg(built))?;
    let stripped = std::fs::read(&tmp).with_context(|| format!("read {}", tmp.display()))?;
    if std::fs::read(object).ok().as_deref() == Some(&stripped[..]) {
        std::fs::remove_file(&tmp)?;
    } else {
        std::fs::rename(&tmp, object).with_context(|| format!("write {}", object.display()))?;
    }
    Ok(())
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

/// Build the BPF object and the release agent for `arch`; returns the agent's path. amd64 is
/// [`build_all`]. arm64 is cross-built (`target/arm64/aarch64-unknown-linux-gnu/release/routewarden`:
/// a target directory of its own, so that it can build while `cargo test` holds `target/`, as
/// in `cargo xtask test`) with Debian's toolchain, the only one here with an aarch64 standard library
/// (`libstd-rust-web-dev:arm64`), `aarch64-linux-gnu-gcc` as linker and as the C compiler of
/// the crates with C code (ring, mimalloc), and `cargo auditable` as for amd64.
pub fn build_all_for(arch: Arch) -> Result<PathBuf> {
    if arch == Arch::Amd64 {
        return build_all();
    }
    let object = build_bpf_for(arch)?;
    let root = workspace_root();
    let triple = arch.triple();
    let env_triple = triple.replace('-', "_");
    let mut cmd = Command::new("rustup");
    let target_dir = root.join("target/arm64");
    cmd.args(["run", "debian", "cargo", "auditable", "build", "--locked", "--release", "-p", "routewarden", "--target", triple])
        .current_dir(&root)
        .env("CARGO_TARGET_DIR", &target_dir)
        .env("ROUTEWARDEN_BPF_OBJECT", &object)
        .env(format!("CARGO_TARGET_{}_LINKER", env_triple.to_uppercase()), "aarch64-linux-gnu-gcc")
        .env(format!("CC_{env_triple}"), "aarch64-linux-gnu-gcc")
        .env(format!("AR_{env_triple}"), "aarch64-linux-gnu-ar")
        .env("PATH", tools_path());
    for v in ["RUSTC", "RUSTC_WORKSPACE_WRAPPER", "RUSTUP_TOOLCHAIN", "CARGO", "RUSTFLAGS"] {
        cmd.env_remove(v);
    }
    run_cmd(&mut cmd)?;
    let bin = target_dir.join(triple).join("release/routewarden");
    eprintln!("built {} (BPF object {} embedded)", bin.display(), object.display());
    Ok(bin)
}
