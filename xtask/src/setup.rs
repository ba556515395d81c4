//! `cargo xtask setup`: idempotent install of the BPF build chain on Debian/Ubuntu.
//!
//! Recipe and pitfalls: `../shared/reference/toolchain.md`. Steps:
//! 1. apt packages: Debian's `rustc-web` (1.96, LLVM 22) and `libstd-rust-web-dev-bpf` (the
//!    precompiled `core` for `bpfel-unknown-none`; rustup cannot download `rust-src` here),
//!    LLVM 22 dev files for bpf-linker, iproute2 for the lab.
//! 2. `rustup toolchain link debian /usr`, so the BPF crate builds with `rustup run debian`.
//! 3. `bpf-linker` 0.13.0 built against LLVM 22, installed into `target/tools` (inside the
//!    repo; nothing cached elsewhere).

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::{run_cmd, workspace_root};

/// Debian packages the build and the tests need.
pub const APT_PACKAGES: &[&str] = &[
    "rustc-web",
    "cargo-web",
    "libstd-rust-web-dev-bpf",
    "llvm-22-dev",
    "libclang-cpp22",
    "zlib1g-dev",
    "libzstd-dev",
    "iproute2",
    "bpftool",
    // protoc: etcd-client compiles etcd's gRPC protos at build time (the etcd datastore), and
    // they import Google's well-known types (`google/protobuf/descriptor.proto`), which are in
    // libprotobuf-dev, only a Recommends of protobuf-compiler (not installed here).
    "protobuf-compiler",
    "libprotobuf-dev",
    // The QEMU lane (xtask/src/qemu.rs): emulator, static busybox for the initramfs.
    "qemu-system-x86",
    "busybox-static",
];

/// Debian packages only the test suite needs: `promtool` (alert rule tests), BIRD 2 (a real
/// second route writer), `etcd` (etcd-server: a real etcd for the etcd datastore's tests),
/// `kubectl` comes with the machine image (kustomize builds).
pub const TEST_APT_PACKAGES: &[&str] = &["prometheus", "bird2", "procps", "etcd-server"];

/// PyPI packages only the test suite needs (offline Kubernetes schema validation).
pub const TEST_PIP_PACKAGES: &[&str] = &["kubernetes-validate==1.37.0"];

/// Install the test-only tools (root, Debian/Ubuntu); prints what it does. Without root,
/// prints the commands and carries on (the tests that need a missing tool print SKIPPED).
///
/// # Errors
/// An install command that fails.
pub fn ensure_test_tools() -> Result<()> {
    let missing: Vec<&str> = TEST_APT_PACKAGES.iter().copied().filter(|p| !dpkg_installed(p)).collect();
    let pip_missing = !Command::new("kubernetes-validate").arg("--version").output().is_ok_and(|o| o.status.success());
    if missing.is_empty() && !pip_missing {
        return Ok(());
    }
    if !nix_is_root() || !is_debian_like() {
        eprintln!(
            "setup: test tools missing; as root run: apt-get install -y {} && python3 -m pip install {}",
            TEST_APT_PACKAGES.join(" "),
            TEST_PIP_PACKAGES.join(" ")
        );
        return Ok(());
    }
    if !missing.is_empty() {
        eprintln!("setup: installing test tools: {}", missing.join(" "));
        run_cmd(Command::new("apt-get").arg("update"))?;
        // The prometheus package would start a server under systemd; nothing here runs one.
        run_cmd(Command::new("apt-get").args(["install", "-y", "--no-install-recommends"]).args(&missing).env("DEBIAN_FRONTEND", "noninteractive"))?;
    }
    if pip_missing {
        run_cmd(Command::new("python3").args(["-m", "pip", "install", "--quiet"]).args(TEST_PIP_PACKAGES))?;
    }
    Ok(())
}

pub(crate) fn dpkg_installed(p: &str) -> bool {
    let out = Command::new("dpkg-query").args(["-W", "-f=${Status}", p]).output();
    matches!(out, Ok(o) if String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
}

/// The bpf-linker release that works with LLVM 22 and rustc 1.95/1.96.
pub const BPF_LINKER_VERSION: &str = "0.13.0";

/// Where bpf-linker is installed (`<repo>/target/tools/bin`).
pub fn tools_bin() -> PathBuf {
    workspace_root().join("target/tools/bin")
}

fn missing_packages() -> Vec<&'static str> {
    APT_PACKAGES.iter().copied().filter(|p| !dpkg_installed(p)).collect()
}

fn has_debian_toolchain() -> bool {
    Command::new("rustup")
        .args(["toolchain", "list"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).lines().any(|l| l.split_whitespace().next() == Some("debian")))
}

fn has_bpf_linker() -> bool {
    Command::new(tools_bin().join("bpf-linker")).arg("--version").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(BPF_LINKER_VERSION))
}

pub(crate) fn is_debian_like() -> bool {
    std::fs::read_to_string("/etc/os-release")
        .is_ok_and(|s| s.lines().any(|l| (l.starts_with("ID=") || l.starts_with("ID_LIKE=")) && (l.contains("debian") || l.contains("ubuntu"))))
}

fn bpf_linker_install_cmd() -> Command {
    let mut cmd = Command::new("cargo");
    cmd.args(["install", "bpf-linker", "--version", BPF_LINKER_VERSION, "--locked", "--no-default-features", "--features", "llvm-22", "--root"])
        .arg(workspace_root().join("target/tools"));
    let path = format!("/usr/lib/llvm-22/bin:{}", std::env::var("PATH").unwrap_or_default());
    // Without llvm-config-22 first on PATH the link fails with `unable to find library -lLLVM`.
    cmd.env("PATH", path).env("LLVM_SYS_220_PREFIX", "/usr/lib/llvm-22");
    // Never inherit the xtask's own cargo/rustc selection.
    for v in ["RUSTC", "RUSTC_WORKSPACE_WRAPPER", "RUSTUP_TOOLCHAIN", "CARGO_TARGET_DIR"] {
        cmd.env_remove(v);
    }
    cmd
}

/// Check every step; install what is missing. Prints each step.
///
/// # Errors
/// Without root or off Debian/Ubuntu, prints the exact commands and fails.
pub fn ensure() -> Result<()> {
    let missing = missing_packages();
    let toolchain = has_debian_toolchain();
    let linker = has_bpf_linker();
    eprintln!(
        "setup: apt packages {}; rustup toolchain `debian` {}; bpf-linker {BPF_LINKER_VERSION} {}",
        if missing.is_empty() { "ok".to_string() } else { format!("missing: {}", missing.join(" ")) },
        if toolchain { "ok" } else { "missing" },
        if linker { "ok" } else { "missing" }
    );
    if missing.is_empty() && toolchain && linker {
        return Ok(());
    }
    let root = nix_is_root();
    if !root || !is_debian_like() {
        eprintln!("setup: cannot install here ({}). Run these as root on Debian 12 / Ubuntu:", if root { "not Debian/Ubuntu" } else { "not root" });
        eprintln!("  apt-get update && apt-get install -y {}", APT_PACKAGES.join(" "));
        eprintln!("  rustup toolchain link debian /usr");
        let c = bpf_linker_install_cmd();
        eprintln!("  PATH=/usr/lib/llvm-22/bin:$PATH LLVM_SYS_220_PREFIX=/usr/lib/llvm-22 {}", crate::display(&c));
        bail!("build toolchain incomplete");
    }
    if !missing.is_empty() {
        eprintln!("setup: step 1/3: installing apt packages");
        run_cmd(Command::new("apt-get").arg("update"))?;
        run_cmd(Command::new("apt-get").args(["install", "-y", "--no-install-recommends"]).args(&missing).env("DEBIAN_FRONTEND", "noninteractive"))?;
    }
    if !has_debian_toolchain() {
        eprintln!("setup: step 2/3: registering Debian's rustc as the rustup toolchain `debian`");
        run_cmd(Command::new("rustup").args(["toolchain", "link", "debian", "/usr"]))?;
    }
    if !has_bpf_linker() {
        eprintln!("setup: step 3/3: building bpf-linker {BPF_LINKER_VERSION} against LLVM 22 (about a minute)");
        run_cmd(&mut bpf_linker_install_cmd()).context("install bpf-linker")?;
    }
    eprintln!("setup: done");
    Ok(())
}

fn nix_is_root() -> bool {
    routewarden_lab::is_root()
}
