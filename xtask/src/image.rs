//! `cargo xtask image`: the release agent in OCI images built `FROM scratch` (`Containerfile`),
//! one for linux/amd64 and one for linux/arm64, and the OCI index of both.
//!
//! Per architecture ([`LAYOUTS`]):
//! 1. Build the BPF object and the release agent with it embedded ([`build_all_for`]: arm64
//!    cross-built); check that the agent (arm64: under qemu-user) reports the crate version the
//!    image is tagged with.
//! 2. Fill `target/image/context-<arch>/rootfs` with the agent (its symbol table moved to
//!    `target/image/routewarden-<version>-<arch>.debug`, [`strip_into`]), exactly the shared libraries
//!    the loader lists (the glibc loader, libc, libm, libgcc_s; anything else fails the build,
//!    so a new dependency is a conscious change of [`LAYOUTS`]) from this machine's Debian
//!    packages (`libc6`, `libgcc-s1`; `libc6:arm64`, `libgcc-s1:arm64`), and Debian's CA
//!    bundle.
//! 3. Write the agent's SBOM ([`crate::sbom`]: CycloneDX 1.5 JSON of the crates it links for
//!    that target) beside the archive, `target/image/routewarden-<version>-<arch>.cdx.json`;
//!    the image names it and its SHA-256 digest in its labels `io.routewarden.sbom` and
//!    `io.routewarden.sbom.digest`. The agent carries the same graph in its `.dep-v0` section
//!    (`cargo auditable`).
//! 4. `podman build --platform linux/<arch>` (one layer, no emulation: `FROM scratch` and
//!    `COPY` run nothing; `--timestamp` of the commit: the same tree gives the same image id),
//!    tagged `routewarden:<version>-<arch>`; the image that held the tag before is removed when
//!    nothing else uses it, so repeated builds do not pile up.
//!
//! Then the manifest list `routewarden:<version>` of both, pushed with `podman manifest push
//! --all` as an OCI archive: `target/image/routewarden-<version>.oci.tar`, whose one index
//! names both images with their platforms.
//!
//! `cargo xtask test` builds the images the same way and hands their ids to
//! `agent/tests/privileged/image.rs`. No registry is reachable or needed: nothing is pulled.

use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::build::{build_all_for, Arch};
use crate::{display, run_cmd, workspace_root};

/// Debian packages `cargo xtask image` needs: podman (build, manifest push) and the CA bundle
/// it copies; for arm64, Debian's aarch64 Rust standard library (for the `debian` toolchain),
/// the cross linker and C library it links against, qemu-user (the agent's `--version` and
/// library list at build time), and the arm64 glibc and libgcc the image carries. The `:arm64`
/// packages need the architecture added to dpkg first ([`ensure_tools`] does).
pub const IMAGE_APT_PACKAGES: &[&str] = &[
    "podman",
    "ca-certificates",
    "libstd-rust-web-dev:arm64",
    "gcc-aarch64-linux-gnu",
    "libc6-dev-arm64-cross",
    "qemu-user-static",
    "libc6:arm64",
    "libgcc-s1:arm64",
];

/// Debian packages only the image tests need: runc, because podman's default runtime (crun
/// 1.8) refuses this machine's hybrid cgroup hierarchy ("cgroups in hybrid mode not
/// supported"); `podman --runtime runc run` works.
pub const IMAGE_TEST_APT_PACKAGES: &[&str] = &["runc"];

/// The image's repository name; the tag is the crate version. deploy/kustomization.yaml's
/// `images:` entry of the same name carries the same version (test-support/tests/deploy_manifests.rs).
pub const IMAGE_NAME: &str = "routewarden";

/// The crate version: the agent's (workspace version), checked against its `--version`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Where one architecture's image puts the loader and the libraries, and which it carries.
pub struct Layout {
    /// The architecture.
    pub arch: Arch,
    /// What the agent may link, by file name, sorted: the loader and libraries `ldd` lists.
    pub linked: &'static [&'static str],
    /// The glibc loader's path in the image (the agent's ELF interpreter).
    pub loader: &'static str,
    /// The libraries' directory in the image (Debian's multiarch directory).
    pub lib_dir: &'static str,
}

/// The layout of each architecture's image, as Debian lays out its own root filesystem.
pub const LAYOUTS: [Layout; 2] = [
    Layout {
        arch: Arch::Amd64,
        linked: &["ld-linux-x86-64.so.2", "libc.so.6", "libgcc_s.so.1", "libm.so.6"],
        loader: "/lib64/ld-linux-x86-64.so.2",
        lib_dir: "/lib/x86_64-linux-gnu",
    },
    Layout {
        arch: Arch::Arm64,
        linked: &["ld-linux-aarch64.so.1", "libc.so.6", "libgcc_s.so.1", "libm.so.6"],
        loader: "/lib/ld-linux-aarch64.so.1",
        lib_dir: "/lib/aarch64-linux-gnu",
    },
];

/// The CA bundle of Debian's ca-certificates package.
const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// One architecture's image.
pub struct PlatformImage {
    /// Its architecture.
    pub arch: Arch,
    /// `routewarden:<version>-<arch>` (podman stores it as `localhost/routewarden:...`).
    pub tag: String,
    /// podman's image id (sha256 of the image config, without the `sha256:` prefix).
    pub id: String,
    /// Unpacked size in bytes, as podman reports it (the sum of the layers).
    pub size: u64,
    /// What the context held, in bytes: the agent, the loader and libraries, the CA bundle.
    pub parts: [(&'static str, u64); 3],
    /// The agent's SBOM beside the archive.
    pub sbom: PathBuf,
    /// How many crates the SBOM lists besides the agent.
    pub sbom_components: usize,
}

/// The built images: one per architecture, and the OCI index of both.
pub struct Image {
    /// `routewarden:<version>`: podman's manifest list of the per-architecture images.
    pub tag: String,
    /// The OCI archive of the index and both images (`podman manifest push --all`).
    pub archive: PathBuf,
    /// The images, in [`LAYOUTS`]' order (amd64 first).
    pub platforms: Vec<PlatformImage>,
}

/// Install podman and the arm64 build chain (and, with `tests`, runc) when missing. Root on Debian/Ubuntu; elsewhere
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
    let foreign = output(Command::new("dpkg").arg("--print-foreign-architectures"))?;
    if missing.iter().any(|p| p.ends_with(":arm64")) && !foreign.lines().any(|a| a.trim() == "arm64") {
        run_cmd(Command::new("dpkg").args(["--add-architecture", "arm64"]))?;
    }
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

/// What `cargo xtask image` prints: the archive, then per architecture the tag, id, size and SBOM.
pub fn summary(image: &Image) -> String {
    let archive_size = std::fs::metadata(&image.archive).map_or(0, |m| m.len());
    let mut out = format!("archive: {} ({}): OCI index {} of linux/amd64 and linux/arm64\n", image.archive.display(), mb(archive_size), image.tag);
    for p in &image.platforms {
        let [(agent_what, agent), (libs_what, libs), (ca_what, ca)] = p.parts;
        let _ = writeln!(
            out,
            "{}:   {} (id {}), {} ({} bytes unpacked: {agent_what} {}, {libs_what} {}, {ca_what} {}); sbom {} ({} crates besides the agent)",
            p.arch.oci(),
            p.tag,
            &p.id[..12.min(p.id.len())],
            mb(p.size),
            p.size,
            mb(agent),
            mb(libs),
            mb(ca),
            p.sbom.display(),
            p.sbom_components,
        );
    }
    out
}

/// Bytes as decimal megabytes with one decimal (`25.9 MB`).
fn mb(bytes: u64) -> String {
    let tenths = (bytes + 50_000) / 100_000;
    format!("{}.{} MB", tenths / 10, tenths % 10)
}

/// Build the release agent and the image of each architecture, their index, and save the
/// archive. See the module documentation.
///
/// # Errors
/// A failing build, an agent whose version or linked libraries are not what the image
/// expects, or a failing podman command.
pub fn build() -> Result<Image> {
    let platforms = LAYOUTS.iter().map(|layout| build_arch(layout.arch)).collect::<Result<Vec<_>>>()?;
    index(platforms)
}

/// Steps 1–4 for one architecture: its agent, context, SBOM and image.
///
/// # Errors
/// As [`build`].
pub fn build_arch(arch: Arch) -> Result<PlatformImage> {
    let root = workspace_root();
    let layout = LAYOUTS.iter().find(|l| l.arch == arch).context("no layout for the architecture")?;
    build_platform(&root, &root.join("target/image"), layout)
}

/// The manifest list of `platforms` (one image per architecture, in [`LAYOUTS`]' order) and its
/// OCI archive.
///
/// # Errors
/// A failing podman command.
pub fn index(platforms: Vec<PlatformImage>) -> Result<Image> {
    let dir = workspace_root().join("target/image");
    let tag = format!("{IMAGE_NAME}:{VERSION}");
    // A manifest list is not rebuilt in place: drop the last one (nothing else uses it). An
    // image that holds the name (an image of this name before there were two architectures)
    // loses it, and is removed when nothing else uses it.
    let _ = Command::new("podman").args(["manifest", "rm", &tag]).output();
    if let Some(old) = image_id(&tag) {
        run_cmd(Command::new("podman").args(["untag", &old, &format!("localhost/{tag}")]))?;
        let _ = Command::new("podman").args(["rmi", &old]).output();
    }
    run_cmd(Command::new("podman").args(["manifest", "create", &tag]).stdout(std::io::stderr()))?;
    for p in &platforms {
        run_cmd(Command::new("podman").args(["manifest", "add", &tag, &format!("containers-storage:localhost/{}", p.tag)]).stdout(std::io::stderr()))?;
    }
    let archive = dir.join(format!("{IMAGE_NAME}-{VERSION}.oci.tar"));
    if archive.exists() {
        std::fs::remove_file(&archive).with_context(|| format!("remove {}", archive.display()))?;
    }
    let destination = format!("oci-archive:{}:localhost/{tag}", archive.display());
    run_cmd(Command::new("podman").args(["manifest", "push", "--all", "--format", "oci", &tag, &destination]).stdout(std::io::stderr()))?;
    Ok(Image { tag, archive, platforms })
}

/// Build the agent for `layout.arch`, fill its context, write its SBOM and build its image.
fn build_platform(root: &Path, dir: &Path, layout: &Layout) -> Result<PlatformImage> {
    let arch = layout.arch;
    let bin = build_all_for(arch)?;
    let reported = output(run_on(arch, &bin).arg("--version"))?;
    if reported.trim() != format!("routewarden {VERSION}") {
        bail!("{} reports {:?}, but the image would be tagged {VERSION}", bin.display(), reported.trim());
    }
    let libs = linked_libraries(&bin, layout)?;
    let context = dir.join(format!("context-{}", arch.oci()));
    if context.exists() {
        std::fs::remove_dir_all(&context).with_context(|| format!("remove {}", context.display()))?;
    }
    let rootfs = context.join("rootfs");
    let lib_dir = rootfs.join(layout.lib_dir.trim_start_matches('/'));
    let loader = rootfs.join(layout.loader.trim_start_matches('/'));
    for d in [&lib_dir, &rootfs.join("usr/local/bin"), &rootfs.join("etc/ssl/certs"), &loader.parent().context("loader in a directory")?.to_path_buf()] {
        std::fs::create_dir_all(d).with_context(|| format!("create {}", d.display()))?;
    }
    let agent = strip_into(&bin, &rootfs.join("usr/local/bin/routewarden"), &dir.join(format!("{IMAGE_NAME}-{VERSION}-{}.debug", arch.oci())), arch)?;
    let mut lib_bytes = 0;
    for lib in &libs {
        let name = lib.file_name().context("library path without a file name")?;
        let to = if loader.file_name() == Some(name) { loader.clone() } else { lib_dir.join(name) };
        lib_bytes += copy(lib, &to)?;
    }
    let ca = copy(Path::new(CA_BUNDLE), &rootfs.join("etc/ssl/certs/ca-certificates.crt")).context("the CA bundle comes from Debian's ca-certificates")?;
    let sbom_name = format!("{IMAGE_NAME}-{VERSION}-{}.cdx.json", arch.oci());
    let sbom = dir.join(&sbom_name);
    let (sbom_components, sbom_digest) = crate::sbom::write(root, arch.triple(), &sbom)?;

    let tag = format!("{IMAGE_NAME}:{VERSION}-{}", arch.oci());
    let before = image_id(&tag);
    let (revision, timestamp) = revision(root);
    run_cmd(
        Command::new("podman")
            .args(["build", "--layers=false", "--pull=never", "--platform", &format!("linux/{}", arch.oci()), "--timestamp", &timestamp.to_string()])
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
    Ok(PlatformImage { arch, tag, id, size, parts: [("agent", agent), ("loader and libraries", lib_bytes), ("CA certificates", ca)], sbom, sbom_components })
}

/// A command running the agent `bin` built for `arch` here: itself on amd64, under
/// `qemu-aarch64-static` (with Debian's arm64 libraries, `libc6:arm64`) on arm64.
pub fn run_on(arch: Arch, bin: &Path) -> Command {
    match arch {
        Arch::Amd64 => Command::new(bin),
        Arch::Arm64 => {
            let mut cmd = Command::new("qemu-aarch64-static");
            cmd.arg(bin);
            cmd
        }
    }
}

/// The shared objects the loader resolves for `bin` (see [`parse_ldd`]): `ldd` on amd64, the
/// arm64 loader's `--list` under qemu-user on arm64.
fn linked_libraries(bin: &Path, layout: &Layout) -> Result<Vec<PathBuf>> {
    let text = match layout.arch {
        Arch::Amd64 => output(Command::new("ldd").arg(bin))?,
        Arch::Arm64 => output(Command::new("qemu-aarch64-static").arg(layout.loader).arg("--list").arg(bin))?,
    };
    parse_ldd(&text, layout.linked).with_context(|| format!("the libraries {} links", bin.display()))
}

/// The paths in `ldd` output (the loader included, the vDSO left out), which must be exactly
/// `linked` by file name: the image carries those names and no others.
fn parse_ldd(text: &str, linked: &[&str]) -> Result<Vec<PathBuf>> {
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
    if names != linked {
        bail!("the agent links {names:?}, the image carries {linked:?}: update LAYOUTS in xtask/src/image.rs");
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
/// Put the agent `bin` into the image as `to` without its symbol table (7 MB of the 33 MB
/// binary: the image keeps its size budget), and its symbols beside the archive as `symbols`
/// (`objcopy --only-keep-debug`), which `to` names in its `.gnu_debuglink`: a backtrace's
/// addresses are resolved with it (`gdb`, `addr2line -e <symbols>`). The `.dep-v0` section
/// (`cargo auditable`) stays. Returns `to`'s size in bytes.
fn strip_into(bin: &Path, to: &Path, symbols: &Path, arch: crate::build::Arch) -> Result<u64> {
    let objcopy = match arch {
        crate::build::Arch::Amd64 => "objcopy",
        crate::build::Arch::Arm64 => "aarch64-linux-gnu-objcopy",
    };
    run_cmd(Command::new(objcopy).arg("--only-keep-debug").arg(bin).arg(symbols))?;
    run_cmd(Command::new(objcopy).arg("--strip-all").arg(format!("--add-gnu-debuglink={}", symbols.display())).arg(bin).arg(to))?;
    Ok(std::fs::metadata(to).with_context(|| format!("stat {}", to.display()))?.len())
}

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

    use super::{mb, parse_ldd, LAYOUTS};

    const LDD: &str = "\tlinux-vdso.so.1 (0x00007ffd0b5f2000)
\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f1bd25f3000)
\tlibm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x00007f1bd2513000)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f1bd121e000)
\t/lib64/ld-linux-x86-64.so.2 (0x00007f1bd2627000)
";

    #[test]
    fn ldd_gives_the_loader_and_the_libraries_but_not_the_vdso() {
        let libs = parse_ldd(LDD, LAYOUTS[0].linked).unwrap();
        let want = ["/lib/x86_64-linux-gnu/libgcc_s.so.1", "/lib/x86_64-linux-gnu/libm.so.6", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"];
        assert_eq!(libs, want.map(PathBuf::from));
    }

    /// The arm64 loader's `--list` under qemu-user: the vDSO has no name there.
    #[test]
    fn the_arm64_loaders_list_gives_the_arm64_libraries() {
        let list = "\t (0x0000005502850000)
\tlibgcc_s.so.1 => /lib/aarch64-linux-gnu/libgcc_s.so.1 (0x00000055028a0000)
\tlibm.so.6 => /lib/aarch64-linux-gnu/libm.so.6 (0x00000055028d0000)
\tlibc.so.6 => /lib/aarch64-linux-gnu/libc.so.6 (0x00000055029a0000)
\t/lib/ld-linux-aarch64.so.1 (0x0000005500000000)
";
        let libs = parse_ldd(list, LAYOUTS[1].linked).unwrap();
        let want =
            ["/lib/aarch64-linux-gnu/libgcc_s.so.1", "/lib/aarch64-linux-gnu/libm.so.6", "/lib/aarch64-linux-gnu/libc.so.6", "/lib/ld-linux-aarch64.so.1"];
        assert_eq!(libs, want.map(PathBuf::from));
        assert!(parse_ldd(LDD, LAYOUTS[1].linked).is_err(), "the amd64 loader in an arm64 image");
    }

    #[test]
    fn a_library_the_image_does_not_carry_or_cannot_resolve_fails() {
        let extra = format!("{LDD}\tlibssl.so.3 => /lib/x86_64-linux-gnu/libssl.so.3 (0x00007f1bd1000000)\n");
        assert!(parse_ldd(&extra, LAYOUTS[0].linked).unwrap_err().to_string().contains("\"libssl.so.3\""));
        let missing = format!("{LDD}\tlibfoo.so.1 => not found\n");
        assert!(parse_ldd(&missing, LAYOUTS[0].linked).unwrap_err().to_string().contains("cannot resolve"));
        let without_libm = LDD.lines().filter(|l| !l.contains("libm")).collect::<Vec<_>>().join("\n");
        assert!(parse_ldd(&without_libm, LAYOUTS[0].linked).is_err());
    }

    #[test]
    fn sizes_are_decimal_megabytes_with_one_decimal() {
        assert_eq!(mb(25_893_772), "25.9 MB");
        assert_eq!(mb(219_597), "0.2 MB");
        assert_eq!(mb(0), "0.0 MB");
        assert_eq!(mb(30_000_000), "30.0 MB");
    }
}
