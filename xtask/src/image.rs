//! `cargo xtask image`: the release agent in an OCI image built `FROM scratch` (`Containerfile`).
//!
//! 1. Build the BPF object and the release agent with it embedded ([`build_all`]); check that
//!    the agent reports the crate version the image is tagged with.
//! 2. Fill `target/image/context` with the agent, exactly the shared libraries `ldd` lists
//!    (the glibc loader, libc, libm, libgcc_s; anything else fails the build, so a new
//!    dependency is a conscious Containerfile change) and Debian's CA bundle.
//! 3. `podman build` (one layer, `--timestamp` of the commit: the same tree gives the same
//!    image id), tagged `routewarden:<crate version>`; the image that held the tag before is
//!    removed when nothing else uses it, so repeated builds do not pile up.
//! 4. `podman save` it as an OCI archive, `target/image/routewarden-<version>.oci.tar`.
//!
//! Beside the archive, the agent's SBOM ([`crate::sbom`]: CycloneDX 1.5 JSON of the crates it
//! links), `target/image/routewarden-<version>-amd64.cdx.json`; the image names it and its
//! SHA-256 digest in its labels `io.routewarden.sbom` and `io.routewarden.sbom.digest`. The
//! agent itself carries the same dependency graph in its `.dep-v0` section (`cargo auditable`).
//!
//! `cargo xtask test` builds the image the same way and hands its id to
//! `agent/tests/privileged/image.rs`. No registry is reachable or needed: nothing is pulled.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::{build::build_all, display, run_cmd, workspace_root};

/// Debian packages `cargo xtask image` needs: podman (build, save) and the CA bundle it copies.
pub const IMAGE_APT_PACKAGES: &[&str] = &["podman", "ca-certificates"];

/// Debian packages only the image tests need: runc, because podman's default runtime (crun
/// 1.8) refuses this machine's hybrid cgroup hierarchy ("cgroups in hybrid mode not
/// supported"); `podman --runtime runc run` works.
pub const IMAGE_TEST_APT_PACKAGES: &[&str] = &["runc"];

/// The image's repository name; the tag is the crate version. deploy/kustomization.yaml's
/// `images:` entry of the same name carries the same version (test-support/tests/deploy_manifests.rs).
pub const IMAGE_NAME: &str = "routewarden";

/// The crate version: the agent's (workspace version), checked against its `--version`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// What the agent may link, by file name: the names the Containerfile copies.
const LINKED: &[&str] = &["ld-linux-x86-64.so.2", "libc.so.6", "libgcc_s.so.1", "libm.so.6"];

/// The CA bundle of Debian's ca-certificates package.
const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// A built image.
pub struct Image {
    /// `routewarden:<version>` (podman stores it as `localhost/routewarden:<version>`).
    pub tag: String,
    /// podman's image id (sha256 of the image config, without the `sha256:` prefix).
    pub id: String,
    /// The OCI archive (`podman save --format oci-archive`).
    pub archive: PathBuf,
    /// Unpacked size in bytes, as podman reports it (the sum of the layers).
    pub size: u64,
    /// What the context held, in bytes: the agent, the loader and libraries, the CA bundle.
    pub parts: [(&'static str, u64); 3],
    /// The SBOM beside the archive.
    pub sbom: PathBuf,
    /// How many crates the SBOM lists besides the agent.
    pub sbom_components: usize,
}

/// Install podman (and, with `tests`, runc) when missing. Root on Debian/Ubuntu; elsewhere
/// prints the command and fails if podman is missing.
///
/// # Errors
/// An install that fails, or podman missing where it cannot be installed.
pub fn ensure_tools(tests: bool) -> Result<()> {
    let wanted: Vec<&str> = IMAGE_APT_PACKAGES.iter().chain(if tests { IMAGE_TEST_APT_PACKAGES } else { &[] }).copied().collect();
    let missing: Vec<&str> = wanted.iter().copied().filter(|p| !crate::setup::dpkg_installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !routewarden_lab::is_root() || !crate::setup::is_debian_like() {
        if Command::new("podman").arg("--version").output().is_ok_and(|o| o.status.success()) {
            eprintln!("image: not installed: {} (as root: apt-get install -y {}); carrying on with the podman found", missing.join(" "), missing.join(" "));
            return Ok(());
        }
        bail!("podman is needed to build the image; as root run: apt-get install -y --no-install-recommends {}", wanted.join(" "));
    }
    eprintln!("image: installing {}", missing.join(" "));
    run_cmd(Command::new("apt-get").arg("update"))?;
    run_cmd(Command::new("apt-get").args(["install", "-y", "--no-install-recommends"]).args(&missing).env("DEBIAN_FRONTEND", "noninteractive"))
}

/// `cargo xtask image`: build, then print the archive, the tag and the size.
///
/// # Errors
/// Any step of [`build`].
pub fn image() -> Result<()> {
    ensure_tools(false)?;
    let image = build()?;
    print!("{}", summary(&image));
    Ok(())
}

/// The four lines `cargo xtask image` prints.
pub fn summary(image: &Image) -> String {
    let archive_size = std::fs::metadata(&image.archive).map_or(0, |m| m.len());
    let [(agent_what, agent), (libs_what, libs), (ca_what, ca)] = image.parts;
    format!(
        "archive: {} ({})\nsbom:    {} ({} crates besides the agent)\ntag:     {} (podman: localhost/{}, id {})\nsize:    {} ({} bytes unpacked: {agent_what} {}, {libs_what} {}, {ca_what} {})\n",
        image.archive.display(),
        mb(archive_size),
        image.sbom.display(),
        image.sbom_components,
        image.tag,
        image.tag,
        &image.id[..12.min(image.id.len())],
        mb(image.size),
        image.size,
        mb(agent),
        mb(libs),
        mb(ca),
    )
}

/// Bytes as decimal megabytes with one decimal (`25.9 MB`).
fn mb(bytes: u64) -> String {
    let tenths = (bytes + 50_000) / 100_000;
    format!("{}.{} MB", tenths / 10, tenths % 10)
}

/// Build the release agent and the image, save the archive. See the module documentation.
///
/// # Errors
/// A failing build, an agent whose version or linked libraries are not what the image
/// expects, or a failing podman command.
pub fn build() -> Result<Image> {
    let root = workspace_root();
    let bin = build_all()?;
    let reported = output(Command::new(&bin).arg("--version"))?;
    if reported.trim() != format!("routewarden {VERSION}") {
        bail!("{} reports {:?}, but the image would be tagged {VERSION}", bin.display(), reported.trim());
    }

    let libs = linked_libraries(&bin)?;
    let dir = root.join("target/image");
    let context = dir.join("context");
    if context.exists() {
        std::fs::remove_dir_all(&context).with_context(|| format!("remove {}", context.display()))?;
    }
    std::fs::create_dir_all(context.join("lib")).with_context(|| format!("create {}", context.display()))?;
    let agent = copy(&bin, &context.join("routewarden"))?;
    let mut lib_bytes = 0;
    for lib in &libs {
        let name = lib.file_name().context("library path without a file name")?;
        lib_bytes += copy(lib, &context.join("lib").join(name))?;
    }
    let ca = copy(Path::new(CA_BUNDLE), &context.join("ca-certificates.crt")).context("the CA bundle comes from Debian's ca-certificates")?;
    let sbom_name = format!("{IMAGE_NAME}-{VERSION}-amd64.cdx.json");
    let sbom = dir.join(&sbom_name);
    let (sbom_components, sbom_digest) = crate::sbom::write(&root, "x86_64-unknown-linux-gnu", &sbom)?;

    let tag = format!("{IMAGE_NAME}:{VERSION}");
    let before = image_id(&tag);
    let (revision, timestamp) = revision(&root);
    run_cmd(
        Command::new("podman")
            .args(["build", "--layers=false", "--pull=never", "--timestamp", &timestamp.to_string()])
            .args(["--build-arg", &format!("VERSION={VERSION}"), "--build-arg", &format!("REVISION={revision}")])
            .args(["--build-arg", &format!("SBOM={sbom_name}"), "--build-arg", &format!("SBOM_DIGEST=sha256:{sbom_digest}")])
            .arg("-f")
            .arg(root.join("Containerfile"))
            .args(["-t", &tag])
            .arg(&context)
            // podman prints its steps on stdout: keep stdout for the summary.
            .stdout(std::io::stderr()),
    )?;
    let id = image_id(&tag).with_context(|| format!("podman built no image tagged {tag}"))?;
    if let Some(old) = before.filter(|old| *old != id) {
        // Untagged now; removal fails (and it stays) while a container still uses it.
        let rm = Command::new("podman").args(["rmi", &old]).output();
        if !rm.is_ok_and(|o| o.status.success()) {
            eprintln!("image: the previous {tag} ({}) is still in use; left in place", &old[..12.min(old.len())]);
        }
    }
    let size: u64 = output(Command::new("podman").args(["image", "inspect", "--format", "{{.Size}}", &id]))?.trim().parse().context("podman image size")?;

    let archive = dir.join(format!("{IMAGE_NAME}-{VERSION}.oci.tar"));
    if archive.exists() {
        std::fs::remove_file(&archive).with_context(|| format!("remove {}", archive.display()))?;
    }
    run_cmd(Command::new("podman").args(["save", "--format", "oci-archive", "-o"]).arg(&archive).arg(&tag).stdout(std::io::stderr()))?;
    Ok(Image { tag, id, archive, size, parts: [("agent", agent), ("loader and libraries", lib_bytes), ("CA certificates", ca)], sbom, sbom_components })
}

/// The shared objects `ldd` resolves for `bin` (see [`parse_ldd`]).
fn linked_libraries(bin: &Path) -> Result<Vec<PathBuf>> {
    parse_ldd(&output(Command::new("ldd").arg(bin))?).with_context(|| format!("the libraries {} links", bin.display()))
}

/// The paths in `ldd` output (the loader included, the vDSO left out), which must be exactly
/// [`LINKED`] by file name: the Containerfile copies those names and no others.
fn parse_ldd(text: &str) -> Result<Vec<PathBuf>> {
    let mut libs = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)`, `/lib64/ld-linux-x86-64.so.2 (0x...)`,
        // `linux-vdso.so.1 (0x...)`, or `libfoo.so => not found`.
        let target = line.split_once("=>").map_or(line, |(_, t)| t.trim());
        let path = target.split_whitespace().next().unwrap_or_default();
        if path.starts_with('/') {
            libs.push(PathBuf::from(path));
        } else if line.contains("not found") {
            bail!("ldd cannot resolve {line:?}");
        }
    }
    let mut names: Vec<String> = libs.iter().filter_map(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()).collect();
    names.sort();
    if names != LINKED {
        bail!("the agent links {names:?}, the image carries {LINKED:?}: update LINKED in xtask/src/image.rs and the Containerfile's COPY lines together");
    }
    Ok(libs)
}

/// The commit (`-dirty` with uncommitted changes to tracked files) and its time, for the
/// revision label and the image's timestamps; `unknown` and `SOURCE_DATE_EPOCH` (else now)
/// outside a git checkout.
fn revision(root: &Path) -> (String, u64) {
    let git = |args: &[&str]| output(Command::new("git").arg("-C").arg(root).args(args)).ok().map(|s| s.trim().to_string());
    if let (Some(commit), Some(time)) = (git(&["rev-parse", "HEAD"]), git(&["log", "-1", "--format=%ct"]).and_then(|t| t.parse().ok())) {
        let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
        return (if dirty { format!("{commit}-dirty") } else { commit }, time);
    }
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    ("unknown".into(), std::env::var("SOURCE_DATE_EPOCH").ok().and_then(|s| s.parse().ok()).unwrap_or(now))
}

/// podman's id of the image `name` refers to, if there is one.
fn image_id(name: &str) -> Option<String> {
    output(Command::new("podman").args(["image", "inspect", "--format", "{{.Id}}", name])).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

/// Copy `from` (following symlinks) to `to`; returns the bytes copied.
fn copy(from: &Path, to: &Path) -> Result<u64> {
    std::fs::copy(from, to).with_context(|| format!("copy {} to {}", from.display(), to.display()))
}

/// Run `cmd` and return its stdout; fail with its stderr on a non-zero exit.
fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("cannot start {}", display(cmd)))?;
    if !out.status.success() {
        bail!("`{}` failed ({}): {}", display(cmd), out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::{mb, parse_ldd};

    const LDD: &str = "\tlinux-vdso.so.1 (0x00007ffd0b5f2000)
\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f1bd25f3000)
\tlibm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x00007f1bd2513000)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f1bd121e000)
\t/lib64/ld-linux-x86-64.so.2 (0x00007f1bd2627000)
";

    #[test]
    fn ldd_gives_the_loader_and_the_libraries_but_not_the_vdso() {
        let libs = parse_ldd(LDD).unwrap();
        let want = ["/lib/x86_64-linux-gnu/libgcc_s.so.1", "/lib/x86_64-linux-gnu/libm.so.6", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"];
        assert_eq!(libs, want.map(PathBuf::from));
    }

    #[test]
    fn a_library_the_image_does_not_carry_or_cannot_resolve_fails() {
        let extra = format!("{LDD}\tlibssl.so.3 => /lib/x86_64-linux-gnu/libssl.so.3 (0x00007f1bd1000000)\n");
        assert!(parse_ldd(&extra).unwrap_err().to_string().contains("\"libssl.so.3\""));
        let missing = format!("{LDD}\tlibfoo.so.1 => not found\n");
        assert!(parse_ldd(&missing).unwrap_err().to_string().contains("cannot resolve"));
        let without_libm = LDD.lines().filter(|l| !l.contains("libm")).collect::<Vec<_>>().join("\n");
        assert!(parse_ldd(&without_libm).is_err());
    }

    #[test]
    fn sizes_are_decimal_megabytes_with_one_decimal() {
        assert_eq!(mb(25_893_772), "25.9 MB");
        assert_eq!(mb(219_597), "0.2 MB");
        assert_eq!(mb(0), "0.0 MB");
        assert_eq!(mb(30_000_000), "30.0 MB");
    }
}
