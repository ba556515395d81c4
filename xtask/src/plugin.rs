//! `cargo xtask plugin`: `kubectl routewarden` as a krew plugin.
//!
//! 1. Build the release agent ([`build_all`]); it is the plugin: run as `kubectl-routewarden`
//!    it names itself `kubectl routewarden` (agent/src/main.rs).
//! 2. Pack it as `kubectl-routewarden` into [`ARCHIVE`] under `target/image/`: GNU tar with
//!    the entries' owner, order and time fixed (the commit's time) and `gzip -n`, so the same
//!    tree gives the same bytes and the same sha256.
//! 3. Fill `deploy/krew/routewarden.yaml`'s `${URI}` (`--base-url` + the archive's name) and
//!    `${SHA256}` (of the archive) into `target/image/krew-routewarden.yaml`, check that the
//!    archive holds exactly the files the manifest installs, and print both paths.
//!
//! Nothing is published: the archive goes wherever `--base-url` says, or is installed straight
//! from the two files (`kubectl krew install --manifest=... --archive=...`).

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::{build::build_all, display, workspace_root};

/// The archive's file name.
pub const ARCHIVE: &str = "kubectl-routewarden-linux-amd64.tar.gz";
/// The plugin's executable, the name kubectl looks for on `PATH`.
pub const BIN: &str = "kubectl-routewarden";
/// The manifest template.
pub const TEMPLATE: &str = "deploy/krew/routewarden.yaml";

/// `cargo xtask plugin`.
#[derive(Args, Clone, Debug)]
pub struct PluginArgs {
    /// Where the archive will be published (the manifest's `uri` is this, `/`, the archive's
    /// name).
    #[arg(long, default_value = concat!("https://example.invalid/routewarden/releases/download/v", env!("CARGO_PKG_VERSION")))]
    pub base_url: String,
}

/// Build the archive and the manifest; print their paths and the sha256.
///
/// # Errors
/// The build, tar or gzip failing, or an archive whose files are not the manifest's.
pub fn plugin(args: &PluginArgs) -> Result<()> {
    let root = workspace_root();
    let bin = build_all()?;
    let dir = root.join("target/image");
    let stage = dir.join("plugin");
    if stage.exists() {
        std::fs::remove_dir_all(&stage).with_context(|| format!("remove {}", stage.display()))?;
    }
    std::fs::create_dir_all(&stage).with_context(|| format!("create {}", stage.display()))?;
    std::fs::copy(&bin, stage.join(BIN)).with_context(|| format!("copy {} to {}", bin.display(), stage.display()))?;
    let archive = dir.join(ARCHIVE);
    pack(&stage, &archive, &commit_time(&root))?;
    let listed = output(Command::new("tar").arg("-tzf").arg(&archive))?;
    let files: Vec<&str> = listed.lines().collect();
    if files != [BIN] {
        bail!("{} holds {files:?}, the manifest installs exactly [{BIN:?}]", archive.display());
    }
    let sha = output(Command::new("sha256sum").arg(&archive))?.split_whitespace().next().unwrap_or_default().to_owned();
    let template = std::fs::read_to_string(root.join(TEMPLATE)).with_context(|| format!("read {TEMPLATE}"))?;
    let manifest = render(&template, &format!("{}/{ARCHIVE}", args.base_url.trim_end_matches('/')), &sha)?;
    let out = dir.join("krew-routewarden.yaml");
    std::fs::write(&out, manifest).with_context(|| format!("write {}", out.display()))?;
    println!("archive:  {} (sha256 {sha})\nmanifest: {}", archive.display(), out.display());
    Ok(())
}

/// The template with `${URI}` and `${SHA256}` filled in.
///
/// # Errors
/// A template without either placeholder, or a sha256 that is not 64 hex digits.
pub fn render(template: &str, uri: &str, sha256: &str) -> Result<String> {
    if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!("sha256 {sha256:?} is not 64 hex digits");
    }
    for p in ["${URI}", "${SHA256}"] {
        if !template.contains(p) {
            bail!("{TEMPLATE} has no {p}");
        }
    }
    Ok(template.replace("${URI}", uri).replace("${SHA256}", sha256))
}

/// `tar` the one file of `stage` into `archive`, reproducibly (`--mtime` = `mtime`).
fn pack(stage: &Path, archive: &Path, mtime: &str) -> Result<()> {
    let tar = Command::new("tar")
        .args(["--sort=name", "--owner=0", "--group=0", "--numeric-owner", "--format=gnu"])
        .arg(format!("--mtime={mtime}"))
        .arg("-C")
        .arg(stage)
        .args(["-cf", "-", BIN])
        .output()
        .context("run tar")?;
    if !tar.status.success() {
        bail!("tar failed: {}", String::from_utf8_lossy(&tar.stderr));
    }
    let mut gzip =
        Command::new("gzip").args(["-n", "-9"]).stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).spawn().context("run gzip")?;
    let mut stdin = gzip.stdin.take().context("gzip stdin")?;
    let writer = std::thread::spawn(move || std::io::Write::write_all(&mut stdin, &tar.stdout));
    let out = gzip.wait_with_output().context("gzip")?;
    writer.join().map_err(|_| anyhow::anyhow!("gzip writer panicked"))?.context("write to gzip")?;
    if !out.status.success() {
        bail!("gzip failed");
    }
    std::fs::write(archive, out.stdout).with_context(|| format!("write {}", archive.display()))
}

/// `@<seconds>` of the last commit (the archive's entry time), or `@0` outside git.
fn commit_time(root: &Path) -> String {
    let t = Command::new("git").args(["log", "-1", "--format=%ct"]).current_dir(root).output().ok().filter(|o| o.status.success());
    format!("@{}", t.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned()).filter(|s| !s.is_empty()).unwrap_or_else(|| "0".into()))
}

fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("run {}", display(cmd)))?;
    if !out.status.success() {
        bail!("`{}` failed: {}", display(cmd), String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_renders_with_the_archive_and_its_digest_and_nothing_else() {
        let template = std::fs::read_to_string(workspace_root().join(TEMPLATE)).unwrap();
        let sha = "a".repeat(64);
        let m = render(&template, "https://x.example/kubectl-routewarden-linux-amd64.tar.gz", &sha).unwrap();
        assert!(!m.contains("${"), "{m}");
        assert!(m.contains(&format!("      uri: https://x.example/{ARCHIVE}\n      sha256: {sha}\n")), "{m}");
        assert!(m.contains(&format!("        - from: {BIN}\n          to: .\n      bin: {BIN}\n")), "{m}");
        assert!(render(&template, "u", "not-a-digest").is_err());
        assert!(render("no placeholders", "u", &sha).is_err());
    }
}
