//! `cargo xtask setup`: idempotent install of the BPF build chain on Debian/Ubuntu.
//!
//! Recipe and pitfalls: `../shared/reference/toolchain.md`. Steps:
//! 1. apt packages: Debian's `rustc-web` (1.96, LLVM 22) and `libstd-rust-web-dev-bpf` (the
//!    precompiled `core` for `bpfel-unknown-none`; rustup cannot download `rust-src` here),
//!    LLVM 22 dev files for bpf-linker, iproute2 for the lab.
//! 2. `rustup toolchain link debian /usr`, so the BPF crate builds with `rustup run debian`.
//! 3. `bpf-linker` 0.13.0 built against LLVM 22, and `cargo-auditable` (the release agent's
//!    embedded dependency list), installed into `target/tools` (inside the repo; nothing cached
//!    elsewhere).

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
    // The QEMU lane (xtask/src/qemu/mod.rs): emulator, static busybox for the initramfs.
    "qemu-system-x86",
    "busybox-static",
];

/// Debian packages only the test suite needs: `promtool` (alert rule tests), BIRD 2 (a real
/// second route writer), `etcd` (etcd-server: a real etcd for the etcd datastore's tests),
/// `etcd-client` (`etcdctl`: the raw Calico etcd fixture is loaded with it, as an operator would),
/// `python3-venv` (the virtual environment of [`TEST_PIP_PACKAGES`]). `kubectl` with kustomize
/// 5 is not among them: see [`check_kubectl`].
pub const TEST_APT_PACKAGES: &[&str] = &["prometheus", "bird2", "procps", "etcd-server", "etcd-client", "python3-venv"];

/// PyPI packages only the test suite needs, installed into [`venv_dir`] with the venv's own
/// pip: never into the system Python (Debian 12's is externally managed, PEP 668).
/// `kubernetes-validate`: offline Kubernetes schema validation. `helm-python-sdk` (import
/// `helm_python`): Helm's own Go SDK as a library in a manylinux wheel, so `helm lint` and
/// `helm template` of `charts/routewarden` run offline from a registry package, with no `helm`
/// binary to download (the `helm_chart` test of `routewarden-test-support`).
pub const TEST_PIP_PACKAGES: &[&str] = &["kubernetes-validate==1.37.0", "helm-python-sdk==0.2.2"];

/// Python statement that succeeds only when every [`TEST_PIP_PACKAGES`] entry is importable
/// in the venv (a venv made before a package was added gets it on the next run).
const TEST_PIP_IMPORTS: &str = "import kubernetes_validate, helm_python";

/// The Python virtual environment of the test tools (`<repo>/target/tools/venv`, inside the
/// repo like every other tool).
pub fn venv_dir() -> PathBuf {
    workspace_root().join("target/tools/venv")
}

/// `PATH` for the test run: the test tools' venv first, then the caller's `PATH`.
pub fn test_path() -> std::ffi::OsString {
    let mut dirs = vec![venv_dir().join("bin")];
    dirs.extend(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()));
    std::env::join_paths(dirs).unwrap_or_default()
}

/// The kustomize major version the kustomizations need (`kubectl kustomize`: components,
/// `labels`, `patches` with targets).
pub const KUSTOMIZE_MAJOR: u32 = 5;

/// Check for `kubectl` with kustomize [`KUSTOMIZE_MAJOR`] or later. It cannot be installed the
/// way the other tools are: Debian 12's `kubernetes-client` is 1.20 (kustomize 2.0), too old
/// for `deploy/`'s kustomizations, and its upstream packages are outside Debian's archive. The
/// machine image provides one; without it the run fails here, naming what is missing, rather
/// than letting the kustomize tests skip.
///
/// # Errors
/// `kubectl` missing, or its kustomize older than [`KUSTOMIZE_MAJOR`].
pub fn check_kubectl() -> Result<()> {
    let out = Command::new("kubectl").args(["version", "--client"]).output();
    let text = match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        _ => bail!(
            "kubectl not found: the tests build deploy/ with `kubectl kustomize` (kustomize {KUSTOMIZE_MAJOR}+). Install kubectl 1.27 or later from \
             the Kubernetes release binaries; Debian 12's kubernetes-client (1.20, kustomize 2.0) is too old for these kustomizations"
        ),
    };
    match kustomize_major(&text) {
        Some(major) if major >= KUSTOMIZE_MAJOR => Ok(()),
        found => bail!(
            "kubectl's kustomize is {}, the kustomizations need {KUSTOMIZE_MAJOR}+ (kubectl 1.27 or later; Debian 12's kubernetes-client 1.20 is too old)",
            found.map_or_else(|| "unknown (no `Kustomize Version:` line)".to_string(), |m| format!("v{m}"))
        ),
    }
}

/// The major version in `kubectl version --client`'s `Kustomize Version: v5.5.0` line.
fn kustomize_major(text: &str) -> Option<u32> {
    let v = text.lines().find_map(|l| l.trim().strip_prefix("Kustomize Version:"))?.trim().trim_start_matches('v');
    v.split('.').next()?.parse().ok()
}

/// Install the test-only tools (root, Debian/Ubuntu); prints what it does. Without root,
/// prints the commands and carries on (the run then fails on the skips of the tests that need
/// them).
///
/// # Errors
/// An install command that fails.
pub fn ensure_test_tools() -> Result<()> {
    let missing: Vec<&str> = TEST_APT_PACKAGES.iter().copied().filter(|p| !dpkg_installed(p)).collect();
    let venv_python = venv_dir().join("bin/python3");
    let pip_missing = !Command::new(&venv_python).args(["-c", TEST_PIP_IMPORTS]).output().is_ok_and(|o| o.status.success());
    if missing.is_empty() && !pip_missing {
        return Ok(());
    }
    if !nix_is_root() || !is_debian_like() {
        eprintln!(
            "setup: test tools missing; as root run: apt-get install -y {} && /usr/bin/python3 -m venv {venv} && {venv}/bin/pip install {}",
            TEST_APT_PACKAGES.join(" "),
            TEST_PIP_PACKAGES.join(" "),
            venv = venv_dir().display()
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
        if !venv_python.exists() {
            // Debian's interpreter, whatever else is first on PATH.
            run_cmd(Command::new("/usr/bin/python3").arg("-m").arg("venv").arg(venv_dir()))?;
        }
        run_cmd(Command::new(&venv_python).args(["-m", "pip", "install", "--quiet"]).args(TEST_PIP_PACKAGES))?;
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

/// The cargo-auditable release the release agent is built with ([`crate::build::build_agent`]).
pub const CARGO_AUDITABLE_VERSION: &str = "0.7.7";

/// Whether `target/tools` holds that release (its `--version` prints cargo's own version, so
/// ask `cargo install --list`).
fn has_cargo_auditable() -> bool {
    let wanted = format!("cargo-auditable v{CARGO_AUDITABLE_VERSION}:");
    tools_bin().join("cargo-auditable").exists()
        && Command::new("cargo")
            .args(["install", "--list", "--root"])
            .arg(workspace_root().join("target/tools"))
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).lines().any(|l| l == wanted))
}

/// `cargo install cargo-auditable` into `target/tools` (about 20 s on two cores).
fn cargo_auditable_install_cmd() -> Command {
    let mut cmd = Command::new("cargo");
    cmd.args(["install", "cargo-auditable", "--version", CARGO_AUDITABLE_VERSION, "--locked", "--root"]).arg(workspace_root().join("target/tools"));
    for v in ["RUSTC", "RUSTC_WORKSPACE_WRAPPER", "RUSTUP_TOOLCHAIN", "CARGO_TARGET_DIR"] {
        cmd.env_remove(v);
    }
    cmd
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
    let path = format!("{}:{}", crate::build::LLVM_BIN, std::env::var("PATH").unwrap_or_default());
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
    let auditable = has_cargo_auditable();
    eprintln!(
        "setup: apt packages {}; rustup toolchain `debian` {}; bpf-linker {BPF_LINKER_VERSION} {}; cargo-auditable {CARGO_AUDITABLE_VERSION} {}",
        if missing.is_empty() { "ok".to_string() } else { format!("missing: {}", missing.join(" ")) },
        if toolchain { "ok" } else { "missing" },
        if linker { "ok" } else { "missing" },
        if auditable { "ok" } else { "missing" }
    );
    if missing.is_empty() && toolchain && linker && auditable {
        return Ok(());
    }
    let root = nix_is_root();
    if !root || !is_debian_like() {
        eprintln!("setup: cannot install here ({}). Run these as root on Debian 12 / Ubuntu:", if root { "not Debian/Ubuntu" } else { "not root" });
        eprintln!("  apt-get update && apt-get install -y {}", APT_PACKAGES.join(" "));
        eprintln!("  rustup toolchain link debian /usr");
        let c = bpf_linker_install_cmd();
        eprintln!("  PATH=/usr/lib/llvm-22/bin:$PATH LLVM_SYS_220_PREFIX=/usr/lib/llvm-22 {}", crate::display(&c));
        eprintln!("  {}", crate::display(&cargo_auditable_install_cmd()));
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
    if !has_cargo_auditable() {
        eprintln!("setup: building cargo-auditable {CARGO_AUDITABLE_VERSION} (about 20 s)");
        run_cmd(&mut cargo_auditable_install_cmd()).context("install cargo-auditable")?;
    }
    eprintln!("setup: done");
    Ok(())
}

fn nix_is_root() -> bool {
    routewarden_lab::is_root()
}

#[cfg(test)]
mod tests {
    use super::kustomize_major;

    #[test]
    fn kustomize_major_is_read_from_kubectl_version() {
        assert_eq!(kustomize_major("Client Version: v1.32.4\nKustomize Version: v5.5.0\n"), Some(5));
        assert_eq!(kustomize_major("Client Version: version.Info{Major:\"1\", Minor:\"20\"}\n"), None);
        assert_eq!(kustomize_major("Kustomize Version: v4.5.7"), Some(4));
    }
}
