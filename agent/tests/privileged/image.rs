//! The OCI image (`Containerfile`, `cargo xtask image`): what it holds, and that the agent runs
//! from it with nothing from the build machine.
//!
//! `cargo xtask test` builds the image first and passes its id (`ROUTEWARDEN_IMAGE`) and OCI
//! archive (`ROUTEWARDEN_IMAGE_ARCHIVE`); without them (plain `cargo test`, or
//! `cargo xtask test --no-image`) every test here prints SKIPPED.
//!
//! Self-containment is shown three ways:
//! - the image's root filesystem (`podman image mount`) is exactly the agent, the glibc loader,
//!   libc, libm, libgcc_s and the CA bundle: no shell, no package manager, nothing else;
//! - the agent runs `chroot`ed into that root filesystem, where nothing of the build machine
//!   is visible (only `/proc`, `/sys`, a bpffs and the example cluster are mounted, in a mount
//!   namespace of its own): the loader resolves every library inside it, `--version` and
//!   `explain` work, and `run` in a lab node namespace programs node-a's routes and answers
//!   `/readyz` with its BPF watchers loaded from the embedded object;
//! - the image runs as a container under `podman run` with the DaemonSet's args, environment,
//!   capabilities, read-only root and volume mounts (deploy/daemonset.yaml), joined to a lab
//!   node namespace as `hostNetwork` joins the node's.
//!
//! Its supply chain: the image's labels name the SBOM beside the archive and its digest, and
//! the crates the SBOM lists are those `cargo auditable` embedded in the image's agent.
//!
//! arm64: the archive is the OCI index of the amd64 and the arm64 image
//! (`ROUTEWARDEN_IMAGE_ARM64`); the arm64 image holds exactly its agent and what it links at
//! Debian's arm64 paths, and its agent, run under qemu-user inside that root filesystem, prints
//! what the amd64 agent prints.

mod lab_support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use lab_support::{example_dir, lab, metrics, routes, wait_for, wait_ready, Agent, NODE_A_IPIP, PORT};
use routewarden_lab::podman::{self, Container, DaemonSetRun};
use routewarden_lab::skip_unless_root;

/// Where the image puts the agent (the Containerfile's ENTRYPOINT).
const AGENT: &str = "/usr/local/bin/routewarden";

/// Every file of the amd64 image's root filesystem: the agent and exactly what it needs to run.
const FILES: [&str; 6] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/lib/x86_64-linux-gnu/libc.so.6",
    "/lib/x86_64-linux-gnu/libgcc_s.so.1",
    "/lib/x86_64-linux-gnu/libm.so.6",
    "/lib64/ld-linux-x86-64.so.2",
    AGENT,
];

/// Every file of the arm64 image's root filesystem: the same, at Debian's arm64 paths.
const FILES_ARM64: [&str; 6] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/lib/aarch64-linux-gnu/libc.so.6",
    "/lib/aarch64-linux-gnu/libgcc_s.so.1",
    "/lib/aarch64-linux-gnu/libm.so.6",
    "/lib/ld-linux-aarch64.so.1",
    AGENT,
];

/// The user-mode emulator the arm64 agent runs under here (qemu-user-static: a static binary,
/// so it runs inside the image's root filesystem, which has no library of its own for it).
const QEMU_ARM64: &str = "/usr/bin/qemu-aarch64-static";

/// Names that would mean a shell or a package manager slipped in (checked on every path
/// component, although [`FILES`] already pins the whole content).
const FORBIDDEN: &[&str] = &["sh", "bash", "dash", "ash", "zsh", "busybox", "toybox", "apt", "apt-get", "dpkg", "rpm", "yum", "dnf", "microdnf", "apk", "pip"];

/// The image's upper bound, in bytes. The first budget was 30 MB; the etcd datastore's gRPC
/// client (etcd-client: tonic, prost, h2) took the image from 25.9 to 31.6 MB, so the bound is
/// 35 MB until that client is trimmed (its unused features) or made a build feature.
const MAX_SIZE: u64 = 35_000_000;

/// The image id from `cargo xtask test`, or `None` (after printing SKIPPED) when this test
/// cannot run.
fn image(test: &str) -> Option<String> {
    if skip_unless_root(test) {
        return None;
    }
    match std::env::var("ROUTEWARDEN_IMAGE") {
        Ok(id) if !id.is_empty() => Some(id),
        _ => {
            routewarden_lab::skip(test, format_args!("no image (ROUTEWARDEN_IMAGE unset); `cargo xtask test` builds it unless given --no-image"));
            None
        }
    }
}

/// For a test that needs the arm64 image or the archive: the image id, or `None` when this
/// test cannot run (after printing SKIPPED), or in `cargo xtask test`'s first pass
/// (`ROUTEWARDEN_IMAGE_SECOND_PASS`, while they are still being built: it says so and returns;
/// the second pass, which `cargo xtask test` runs with them, is where it runs; the xtask's
/// `SECOND_PASS_TESTS` names it).
fn image_and_arm64(test: &str) -> Option<String> {
    let id = image(test)?;
    if std::env::var_os("ROUTEWARDEN_IMAGE_ARM64").is_none() && std::env::var_os("ROUTEWARDEN_IMAGE_SECOND_PASS").is_some() {
        eprintln!("{test}: runs in the second pass of `cargo xtask test`, once the arm64 image and the archive are built");
        return None;
    }
    Some(id)
}

/// The arm64 image's id from `cargo xtask test` (which builds both whenever it builds one).
fn image_arm64() -> String {
    std::env::var("ROUTEWARDEN_IMAGE_ARM64").ok().filter(|id| !id.is_empty()).expect("cargo xtask test sets ROUTEWARDEN_IMAGE_ARM64 with ROUTEWARDEN_IMAGE")
}

fn output(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"))
}

fn ok(cmd: &mut Command) -> String {
    let out = output(cmd);
    assert!(out.status.success(), "{cmd:?} failed ({}):\n{}{}", out.status, String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn inspect(id: &str) -> serde_json::Value {
    let text = ok(Command::new("podman").args(["image", "inspect", id]));
    let mut all: Vec<serde_json::Value> = serde_json::from_str(&text).expect("podman image inspect prints JSON");
    assert_eq!(all.len(), 1, "{text}");
    all.remove(0)
}

/// The image's root filesystem, mounted read-only by podman for the life of the value.
struct Mounted {
    id: String,
    root: PathBuf,
}

impl Mounted {
    fn new(id: &str) -> Mounted {
        let root = PathBuf::from(ok(Command::new("podman").args(["image", "mount", id])).trim());
        assert!(root.is_dir(), "podman image mount gave {}", root.display());
        Mounted { id: id.to_owned(), root }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        // podman counts mounts: this only unmounts when no other test holds the image.
        let _ = Command::new("podman").args(["image", "unmount", &self.id]).output();
    }
}

/// Mounts the image root (read-only) under an overlay in a scratch dir, adds `/proc`, `/sys`,
/// a bpffs at `/sys/fs/bpf` and the example cluster read-only at `/cluster`, and execs
/// `chroot <root> <program> <args>`. Runs in a mount namespace of its own (`ip netns exec`
/// makes one; without a netns, `unshare --mount`), so every mount goes away with the process.
/// With `QEMU` set (an arm64 image, [`in_arm64_image_root`]) the emulator is copied into the
/// overlay's root and runs the program: every file the program opens is the image's.
const CHROOT_SCRIPT: &str = r#"set -e
lower=$1 scratch=$2 cluster=$3; shift 3
r=$scratch/root
mkdir -p "$scratch/upper" "$scratch/work" "$r"
mount -t overlay overlay -o "lowerdir=$lower,upperdir=$scratch/upper,workdir=$scratch/work" "$r"
mkdir -p "$r/proc" "$r/sys" "$r/cluster"
mount -t proc proc "$r/proc"
mount -t sysfs sysfs "$r/sys"
mount -t bpf bpf "$r/sys/fs/bpf"
mount --bind "$cluster" "$r/cluster"
mount -o remount,bind,ro "$r/cluster"
if [ -n "${QEMU:-}" ]; then
  cp "$QEMU" "$r/qemu"
  exec chroot "$r" /qemu "$@"
fi
exec chroot "$r" "$@""#;

/// A command running `program args` chrooted into the image's root filesystem (see
/// [`CHROOT_SCRIPT`]), in the named network namespace when `netns` is given. The environment
/// is only `PATH` (the image's, then the host's for the script's own tools) and `RUST_LOG`.
fn in_image_root(image: &Mounted, scratch: &Path, netns: Option<&str>, program: &str, args: &[&str]) -> Command {
    let mut cmd = if let Some(ns) = netns {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns]);
        c
    } else {
        let mut c = Command::new("unshare");
        c.args(["--mount", "--propagation", "private"]);
        c
    };
    cmd.args(["sh", "-c", CHROOT_SCRIPT, "sh"])
        .arg(&image.root)
        .arg(scratch)
        .arg(example_dir())
        .arg(program)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        .env("RUST_LOG", "info");
    cmd
}

/// [`in_image_root`] for the arm64 image: `program` runs under qemu-user inside the root.
fn in_arm64_image_root(image: &Mounted, scratch: &Path, program: &str, args: &[&str]) -> Command {
    let mut cmd = in_image_root(image, scratch, None, program, args);
    cmd.env("QEMU", QEMU_ARM64);
    cmd
}

/// Every path under `root` (as absolute paths inside it), directories marked with a
/// trailing `/`, symlinks with ` -> target`.
fn tree(root: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
            let e = e.unwrap();
            let path = e.path();
            let inside = format!("/{}", path.strip_prefix(root).unwrap().display());
            let kind = e.file_type().unwrap();
            if kind.is_dir() {
                out.insert(format!("{inside}/"));
                todo.push(path);
            } else if kind.is_symlink() {
                out.insert(format!("{inside} -> {}", std::fs::read_link(&path).unwrap().display()));
            } else {
                out.insert(inside);
            }
        }
    }
    out
}

#[test]
fn image_is_tagged_labelled_small_and_archived() {
    let Some(id) = image_and_arm64("image_is_tagged_labelled_small_and_archived") else { return };
    let version = env!("CARGO_PKG_VERSION");
    let info = inspect(&id);
    let tags: Vec<&str> = info["RepoTags"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert!(tags.contains(&format!("localhost/routewarden:{version}-amd64").as_str()), "tagged {tags:?}, not routewarden:{version}-amd64");
    let arm64 = image_arm64();
    let info_arm64 = inspect(&arm64);
    assert_eq!(info_arm64["RepoTags"], serde_json::json!([format!("localhost/routewarden:{version}-arm64")]));
    assert_eq!((&info["Os"], &info["Architecture"]), (&serde_json::json!("linux"), &serde_json::json!("amd64")));
    assert_eq!((&info_arm64["Os"], &info_arm64["Architecture"]), (&serde_json::json!("linux"), &serde_json::json!("arm64")));
    // The two differ only in the agent, the libraries and the SBOM they name.
    let mut config_arm64 = info_arm64["Config"].clone();
    assert_eq!(config_arm64["Labels"]["io.routewarden.sbom"], format!("routewarden-{version}-arm64.cdx.json"));
    for label in ["io.routewarden.sbom", "io.routewarden.sbom.digest"] {
        config_arm64["Labels"][label] = info["Config"]["Labels"][label].clone();
    }
    assert_eq!(config_arm64, info["Config"], "the arm64 image's config but for its SBOM labels");
    let config = &info["Config"];
    // Exec form, no shell: the agent is PID 1.
    assert_eq!(config["Entrypoint"], serde_json::json!([AGENT]));
    assert_eq!(config["Cmd"], serde_json::json!(["--help"]));
    assert_eq!(config["Env"], serde_json::json!(["PATH=/usr/local/bin", "MIMALLOC_ARENA_EAGER_COMMIT=0"]));
    let labels = &config["Labels"];
    assert_eq!(labels["org.opencontainers.image.version"], version);
    assert_eq!(labels["org.opencontainers.image.licenses"], env!("CARGO_PKG_LICENSE"));
    assert_eq!(labels["org.opencontainers.image.source"], "https://github.com/routewarden/routewarden");
    let revision = labels["org.opencontainers.image.revision"].as_str().unwrap();
    assert!(revision.len() >= 40 && revision[..40].bytes().all(|b| b.is_ascii_hexdigit()), "revision label {revision:?}");
    assert_eq!(info["RootFS"]["Layers"].as_array().unwrap().len(), 1, "one layer");
    assert_eq!(info_arm64["RootFS"]["Layers"].as_array().unwrap().len(), 1, "one layer");
    for (info, arch) in [(&info, "amd64"), (&info_arm64, "arm64")] {
        let size = info["Size"].as_u64().unwrap();
        eprintln!("image {} routewarden:{version}-{arch}: {size} bytes unpacked", &info["Id"].as_str().unwrap()[..12]);
        assert!(size <= MAX_SIZE, "the {arch} image is {size} bytes, more than {MAX_SIZE}");
    }

    // The OCI archive is the index of both images: its one manifest is an index whose
    // manifests name each image's config (its id) with its platform.
    let archive = PathBuf::from(std::env::var("ROUTEWARDEN_IMAGE_ARCHIVE").expect("cargo xtask test sets ROUTEWARDEN_IMAGE_ARCHIVE with ROUTEWARDEN_IMAGE"));
    assert_eq!(archive.file_name().unwrap().to_string_lossy(), format!("routewarden-{version}.oci.tar"));
    let blob = |name: &str| -> serde_json::Value { serde_json::from_str(&ok(Command::new("tar").arg("-xOf").arg(&archive).arg(name))).unwrap() };
    assert_eq!(blob("oci-layout")["imageLayoutVersion"], "1.0.0");
    let index = blob("index.json");
    let manifests = index["manifests"].as_array().unwrap();
    assert_eq!(manifests.len(), 1, "{index}");
    assert_eq!(manifests[0]["annotations"]["org.opencontainers.image.ref.name"], format!("localhost/routewarden:{version}"));
    assert_eq!(manifests[0]["mediaType"], "application/vnd.oci.image.index.v1+json");
    let blob_of = |descriptor: &serde_json::Value| blob(&format!("blobs/{}", descriptor["digest"].as_str().unwrap().replace(':', "/")));
    let platforms = blob_of(&manifests[0]);
    let listed: Vec<(String, String)> = platforms["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                format!("{}/{}", m["platform"]["os"].as_str().unwrap(), m["platform"]["architecture"].as_str().unwrap()),
                blob_of(m)["config"]["digest"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(listed, [("linux/amd64".to_owned(), format!("sha256:{id}")), ("linux/arm64".to_owned(), format!("sha256:{arm64}"))], "{platforms}");
    let archive_size = std::fs::metadata(&archive).unwrap().len();
    eprintln!("archive {}: {archive_size} bytes (layer compressed)", archive.display());
}

/// `(name, version)` of every package of `cargo metadata --filter-platform <target>` whose
/// library is a proc macro: it runs in the compiler, the agent does not link it.
fn proc_macros(target: &str) -> BTreeSet<(String, String)> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let text =
        ok(Command::new(cargo).args(["metadata", "--format-version", "1", "--locked", "--filter-platform", target]).current_dir(env!("CARGO_MANIFEST_DIR")));
    let metadata: serde_json::Value = serde_json::from_str(&text).unwrap();
    let kinds = |p: &serde_json::Value| p["targets"].as_array().unwrap().iter().flat_map(|t| t["kind"].as_array().unwrap().clone()).collect::<Vec<_>>();
    metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| kinds(p).iter().any(|k| k == "proc-macro"))
        .map(|p| (p["name"].as_str().unwrap().to_owned(), p["version"].as_str().unwrap().to_owned()))
        .collect()
}

/// The crates the binary at `bin` links by the graph `cargo auditable` embedded in it: from the
/// root, runtime dependencies, not into proc macros (cargo auditable 0.7 records a proc macro
/// with test targets as a runtime dependency).
fn audited(bin: &Path, target: &str) -> BTreeSet<(String, String)> {
    let info = auditable_info::audit_info_from_file(bin, auditable_info::Limits::default())
        .unwrap_or_else(|e| panic!("{}: no cargo auditable data: {e}", bin.display()));
    let skip = proc_macros(target);
    let roots: Vec<usize> = info.packages.iter().enumerate().filter(|(_, p)| p.root).map(|(i, _)| i).collect();
    assert_eq!(roots.len(), 1, "one root package");
    let mut seen = BTreeSet::new();
    let mut todo = roots;
    while let Some(i) = todo.pop() {
        let p = &info.packages[i];
        let key = (p.name.clone(), p.version.to_string());
        if p.kind != auditable_serde::DependencyKind::Runtime || skip.contains(&key) || !seen.insert(key) {
            continue;
        }
        todo.extend(&p.dependencies);
    }
    seen
}

/// The SBOM beside the archive that the image's labels name, checked against its digest label;
/// returns `(name, version)` of the agent and every component, and the components' count.
fn sbom_named_by(labels: &serde_json::Value, archive: &Path, file: &str) -> (BTreeSet<(String, String)>, usize) {
    assert_eq!(labels["io.routewarden.sbom"], file);
    let bytes = std::fs::read(archive.with_file_name(file)).unwrap();
    let digest = ring::digest::digest(&ring::digest::SHA256, &bytes).as_ref().iter().fold(String::new(), |hex, b| hex + &format!("{b:02x}"));
    assert_eq!(labels["io.routewarden.sbom.digest"], format!("sha256:{digest}"));
    let doc: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!((&doc["bomFormat"], &doc["specVersion"]), (&serde_json::json!("CycloneDX"), &serde_json::json!("1.5")));
    let components = doc["components"].as_array().unwrap();
    let mut listed = BTreeSet::new();
    for c in components.iter().chain([&doc["metadata"]["component"]]) {
        let (name, version) = (c["name"].as_str().unwrap(), c["version"].as_str().unwrap());
        assert_eq!(c["purl"], format!("pkg:cargo/{name}@{version}"));
        let licence = c["licenses"][0]["expression"].as_str().unwrap_or_else(|| panic!("{name} {version}: no licence expression"));
        assert!(!licence.is_empty());
        listed.insert((name.to_owned(), version.to_owned()));
    }
    assert_eq!(doc["metadata"]["component"]["name"], "routewarden");
    assert_eq!(listed.len(), components.len() + 1, "each crate listed once");
    (listed, components.len())
}

#[test]
fn image_names_its_sbom_which_lists_what_the_agent_links() {
    let Some(id) = image_and_arm64("image_names_its_sbom_which_lists_what_the_agent_links") else { return };
    let version = env!("CARGO_PKG_VERSION");
    let archive = PathBuf::from(std::env::var("ROUTEWARDEN_IMAGE_ARCHIVE").expect("cargo xtask test sets ROUTEWARDEN_IMAGE_ARCHIVE with ROUTEWARDEN_IMAGE"));
    for (id, arch, target) in [(id, "amd64", "x86_64-unknown-linux-gnu"), (image_arm64(), "arm64", "aarch64-unknown-linux-gnu")] {
        let (listed, count) = sbom_named_by(&inspect(&id)["Config"]["Labels"], &archive, &format!("routewarden-{version}-{arch}.cdx.json"));
        let mounted = Mounted::new(&id);
        let agent = mounted.root.join(AGENT.trim_start_matches('/'));
        assert_eq!(audited(&agent, target), listed, "the crates cargo auditable embedded in the {arch} image's agent, and its SBOM's");
        eprintln!("image {arch}: the SBOM lists {count} crates besides the agent, as the agent's .dep-v0 section does");
    }
}

#[test]
fn image_rootfs_is_the_agent_and_what_it_links() {
    let Some(id) = image_and_arm64("image_rootfs_is_the_agent_and_what_it_links") else { return };
    let mounted = Mounted::new(&id);
    let all = tree(&mounted.root);
    let files: BTreeSet<&str> = all.iter().map(String::as_str).filter(|p| !p.ends_with('/')).collect();
    assert_eq!(files, FILES.into(), "the image's files (symlinks show as `path -> target`)");
    let dirs: BTreeSet<&str> = all.iter().map(String::as_str).filter(|p| p.ends_with('/')).collect();
    assert_eq!(dirs, ["/etc/", "/etc/ssl/", "/etc/ssl/certs/", "/lib/", "/lib/x86_64-linux-gnu/", "/lib64/", "/usr/", "/usr/local/", "/usr/local/bin/"].into());
    for path in &all {
        for part in path.trim_end_matches('/').split('/') {
            assert!(!FORBIDDEN.contains(&part), "{path}: a shell or package manager in the image");
        }
    }
    eprintln!("image rootfs: {} files, no shell, no package manager: {files:?}", files.len());

    // The arm64 image: the same, at Debian's arm64 paths.
    let mounted_arm64 = Mounted::new(&image_arm64());
    let all = tree(&mounted_arm64.root);
    let files: BTreeSet<&str> = all.iter().map(String::as_str).filter(|p| !p.ends_with('/')).collect();
    assert_eq!(files, FILES_ARM64.into(), "the arm64 image's files");
    let dirs: BTreeSet<&str> = all.iter().map(String::as_str).filter(|p| p.ends_with('/')).collect();
    assert_eq!(dirs, ["/etc/", "/etc/ssl/", "/etc/ssl/certs/", "/lib/", "/lib/aarch64-linux-gnu/", "/usr/", "/usr/local/", "/usr/local/bin/"].into());
    for path in &all {
        for part in path.trim_end_matches('/').split('/') {
            assert!(!FORBIDDEN.contains(&part), "{path}: a shell or package manager in the arm64 image");
        }
    }

    // In the image's root, the loader resolves every library the agent needs inside it.
    let scratch = tempfile::tempdir().unwrap();
    let listed = ok(&mut in_arm64_image_root(&mounted_arm64, &scratch.path().join("arm64"), "/lib/ld-linux-aarch64.so.1", &["--list", AGENT]));
    let resolved: BTreeSet<&str> = listed.lines().filter_map(|l| l.split_once("=> ")).map(|(_, t)| t.split_whitespace().next().unwrap()).collect();
    assert_eq!(resolved, ["/lib/aarch64-linux-gnu/libc.so.6", "/lib/aarch64-linux-gnu/libgcc_s.so.1", "/lib/aarch64-linux-gnu/libm.so.6"].into(), "{listed}");
    assert!(listed.contains("/lib/ld-linux-aarch64.so.1"), "{listed}");
    assert!(!listed.contains("not found"), "{listed}");
    let listed = ok(&mut in_image_root(&mounted, scratch.path(), None, "/lib64/ld-linux-x86-64.so.2", &["--list", AGENT]));
    let resolved: BTreeSet<&str> = listed.lines().filter_map(|l| l.split_once("=> ")).map(|(_, t)| t.split_whitespace().next().unwrap()).collect();
    assert_eq!(resolved, ["/lib/x86_64-linux-gnu/libc.so.6", "/lib/x86_64-linux-gnu/libgcc_s.so.1", "/lib/x86_64-linux-gnu/libm.so.6"].into(), "{listed}");
    assert!(listed.contains("/lib64/ld-linux-x86-64.so.2"), "{listed}");
    assert!(!listed.contains("not found"), "{listed}");
}

#[test]
fn image_agent_runs_version_and_explain_from_its_rootfs() {
    let Some(id) = image("image_agent_runs_version_and_explain_from_its_rootfs") else { return };
    let mounted = Mounted::new(&id);
    let scratch = tempfile::tempdir().unwrap();
    let version = ok(&mut in_image_root(&mounted, &scratch.path().join("v"), None, AGENT, &["--version"]));
    assert_eq!(version, format!("routewarden {}\n", env!("CARGO_PKG_VERSION")));

    // `explain` from the image prints what the agent built with this test prints.
    let args = ["explain", "--datastore", "file:/cluster", "--node", "node-a"];
    let from_image = output(&mut in_image_root(&mounted, &scratch.path().join("e"), None, AGENT, &args));
    let here = output(
        Command::new(env!("CARGO_BIN_EXE_routewarden")).args(["explain", "--node", "node-a", "--datastore"]).arg(format!("file:{}", example_dir().display())),
    );
    let text = String::from_utf8_lossy(&from_image.stdout);
    assert_eq!(from_image.status.code(), Some(0), "{text}{}", String::from_utf8_lossy(&from_image.stderr));
    assert!(text.starts_with("role felix, Calico 3.33 (ClusterInformation default: v3.33.0), node node-a\n"), "{text}");
    assert_eq!(text, String::from_utf8_lossy(&here.stdout), "explain from the image differs from the test build's");
    eprintln!("image: --version and explain run chrooted into the image's rootfs");
}

/// The arm64 agent, under qemu-user in its image's root filesystem, prints exactly what the
/// amd64 agent prints in its own: `--version`, `explain` and `bird-filter` on the example
/// cluster, stdout and exit status.
#[test]
fn image_arm64_agent_prints_what_the_amd64_agent_prints() {
    let Some(id) = image_and_arm64("image_arm64_agent_prints_what_the_amd64_agent_prints") else { return };
    let (amd64, arm64) = (Mounted::new(&id), Mounted::new(&image_arm64()));
    let scratch = tempfile::tempdir().unwrap();
    let runs: [&[&str]; 3] = [
        &["--version"],
        &["explain", "--datastore", "file:/cluster", "--node", "node-a"],
        &["bird-filter", "--datastore", "file:/cluster", "--node", "node-a"],
    ];
    for (i, args) in runs.iter().enumerate() {
        let here = output(&mut in_image_root(&amd64, &scratch.path().join(format!("amd64-{i}")), None, AGENT, args));
        let emulated = output(&mut in_arm64_image_root(&arm64, &scratch.path().join(format!("arm64-{i}")), AGENT, args));
        let text = String::from_utf8_lossy(&here.stdout);
        assert_eq!(here.status.code(), Some(0), "amd64 {args:?}: {text}{}", String::from_utf8_lossy(&here.stderr));
        assert!(text.lines().count() >= 1, "amd64 {args:?} printed nothing");
        assert_eq!(emulated.status.code(), here.status.code(), "arm64 {args:?}: {}", String::from_utf8_lossy(&emulated.stderr));
        assert_eq!(String::from_utf8_lossy(&emulated.stdout), text, "arm64 {args:?} printed otherwise than amd64");
    }
    eprintln!("image: the arm64 agent under qemu-user prints what the amd64 agent prints for --version, explain and bird-filter");
}

#[test]
fn image_agent_programs_a_lab_node_from_its_rootfs() {
    let Some(id) = image("image_agent_programs_a_lab_node_from_its_rootfs") else { return };
    let mounted = Mounted::new(&id);
    let lab = lab();
    let scratch = tempfile::tempdir().unwrap();
    let ns = lab.node_ns("node-a");
    let metrics_addr = format!("127.0.0.1:{PORT}");
    // --tc-count: off by default; the probe's attach is part of what is checked.
    let args = ["run", "--datastore", "file:/cluster", "--node", "node-a", "--metrics-addr", &metrics_addr, "--log-format", "text", "--tc-count"];
    let mut cmd = in_image_root(&mounted, scratch.path(), Some(&ns), AGENT, &args);
    // `ip netns exec`, `sh` and `chroot` each exec the next: the child is the agent itself.
    let agent = Agent::from_child(cmd.stdin(Stdio::null()).spawn().unwrap());
    let ready = wait_ready(&lab, "node-a");
    assert!(ready.starts_with("datastore: synced\nroutes: first apply done\n"), "{ready}");
    assert_eq!(routes(&lab, "node-a", "80"), NODE_A_IPIP);
    // The BPF object embedded in the image's agent loads: the socket-filter route watch (the
    // backend this kernel allows) and the TC probes attach.
    for line in ["bpf route_watch: ready", "bpf tc_forward: ready", "bpf tc_count: ready"] {
        assert!(ready.lines().any(|l| l == line), "no {line:?} in /readyz:\n{ready}");
    }
    let m = metrics(&lab, "node-a");
    assert_eq!(m.value(r#"routewarden_routes{family="ipv4",class="ipip",state="programmed"}"#), 7, "{m}");
    assert_eq!(m.value(r#"routewarden_route_watch_backend_info{backend="socket-filter"}"#), 1, "{m}");
    let status = agent.stop();
    assert!(status.success(), "the agent from the image exited {status}");
    eprintln!("image: run chrooted into the image's rootfs in {ns} programmed node-a's {} routes; /readyz:\n{ready}", NODE_A_IPIP.len());
}

/// `podman run` arguments for the DaemonSet's container (deploy/daemonset.yaml): its args,
/// environment, securityContext and volume mounts, as a kubelet hands them to the runtime,
/// with the container in the lab node namespace `netns` (the DaemonSet's `hostNetwork`).
/// Three env vars are changed: the example cluster's files (mounted at `/cluster`) stand in
/// for the API server, which the lab has not; program mode (the shipped audit mode programs
/// nothing) shows the routes written from the container; node-a is the node.
fn daemonset_podman_run(name: &str, netns: &str, image: &str, security_opts: &[String]) -> Command {
    let ds: serde_json::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/daemonset.yaml")).unwrap()).unwrap();
    let pod = &ds["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(pod["hostNetwork"].as_bool(), Some(true), "the lab node namespace stands in for the host network");
    assert!(c.get("command").is_none(), "the DaemonSet uses the image's entrypoint");
    let sc = &c["securityContext"];
    assert_eq!(sc["privileged"].as_bool(), Some(false));
    assert_eq!(sc["seccompProfile"]["type"].as_str(), Some("RuntimeDefault"));
    let extra_args = vec![
        // tc_count is off by default; these tests still check that the image's object
        // attaches it, so turn it on.
        "--env=ROUTEWARDEN_TC_COUNT=true".to_owned(),
        format!("--volume={}:/cluster:ro", example_dir().canonicalize().unwrap().display()),
    ];
    podman::daemonset_podman_run(&DaemonSetRun {
        daemonset: &ds,
        name,
        netns,
        image,
        node: "node-a",
        env_overrides: &[("ROUTEWARDEN_DATASTORE", "file:/cluster"), ("ROUTEWARDEN_MODE", "program"), ("ROUTEWARDEN_NODE", "node-a")],
        security_opts,
        extra_args,
    })
}

/// Start `cmd` (a [`daemonset_podman_run`]), wait for its agent's `/readyz` 200 in node-a,
/// and check the routes it programmed; returns the container and the `/readyz` body.
fn start_container(lab: &routewarden_lab::Lab, name: &str, mut cmd: Command) -> (Container, String) {
    eprintln!("image: {cmd:?}");
    let mut container = Container::spawn(name, &mut cmd, None);
    let ready = wait_for("/readyz 200 from the container", Duration::from_mins(1), || {
        if let Some(status) = container.run.as_mut().unwrap().try_wait().unwrap() {
            panic!("podman run exited {status} before the agent was ready");
        }
        match lab.http_get("node-a", PORT, "/readyz") {
            Ok((200, body)) => Some(body),
            _ => None,
        }
    });
    assert!(ready.starts_with("datastore: synced\nroutes: first apply done\n"), "{ready}");
    assert_eq!(routes(lab, "node-a", "80"), NODE_A_IPIP);
    (container, ready)
}

/// SIGTERM, as the kubelet stops a pod (`podman stop`): the agent exits 0, its routes stay.
fn stop_container(lab: &routewarden_lab::Lab, mut container: Container) {
    let status = container.stop();
    assert!(status.success(), "podman run exited {status}");
    assert_eq!(routes(lab, "node-a", "80"), NODE_A_IPIP, "routes after SIGTERM");
}

/// podman's default seccomp profile (containers-common) with `bpf` allowed to a container
/// holding CAP_BPF and `perf_event_open` to one holding CAP_PERFMON, as containerd's and
/// Docker's default profiles allow them; CAP_SYS_ADMIN keeps both. Written into `dir`.
fn seccomp_with_bpf_caps(dir: &Path) -> PathBuf {
    let mut profile: serde_json::Value = serde_json::from_str(&std::fs::read_to_string("/usr/share/containers/seccomp.json").unwrap()).unwrap();
    let rules = profile["syscalls"].as_array_mut().unwrap();
    for rule in rules.iter_mut() {
        rule["names"].as_array_mut().unwrap().retain(|n| n != "bpf" && n != "perf_event_open");
    }
    rules.retain(|r| !r["names"].as_array().unwrap().is_empty());
    for (names, cap) in [(vec!["bpf"], "CAP_BPF"), (vec!["perf_event_open"], "CAP_PERFMON"), (vec!["bpf", "perf_event_open"], "CAP_SYS_ADMIN")] {
        rules.push(serde_json::json!({"names": names, "action": "SCMP_ACT_ALLOW", "includes": {"caps": [cap]}}));
    }
    let path = dir.join("seccomp-bpf-caps.json");
    std::fs::write(&path, serde_json::to_string(&profile).unwrap()).unwrap();
    path
}

#[test]
fn image_runs_under_podman_with_the_daemonsets_settings() {
    let Some(id) = image("image_runs_under_podman_with_the_daemonsets_settings") else { return };
    let lab = lab();
    let ns = lab.node_ns("node-a");
    let name = format!("routewarden-image-test-{}", std::process::id());

    // 1. podman's own RuntimeDefault. podman 4.3's profile (Debian 12's containers-common)
    //    allows bpf() and perf_event_open() only with CAP_SYS_ADMIN, which the DaemonSet does
    //    not grant: the agent programs its routes and is ready, and reports every BPF watcher
    //    degraded, as deploy/daemonset.yaml says happens on a runtime whose profile predates
    //    CAP_BPF/CAP_PERFMON.
    let (container, ready) = start_container(&lab, &name, daemonset_podman_run(&name, &ns, &id, &[]));
    for watcher in ["route_watch", "tc_count", "tc_forward"] {
        let line = ready.lines().find(|l| l.starts_with(&format!("bpf {watcher}: "))).unwrap_or_else(|| panic!("no bpf {watcher} in /readyz:\n{ready}"));
        assert!(line.starts_with(&format!("bpf {watcher}: degraded: ")) && line.contains("failed to create map"), "{line}");
    }
    // What `kubectl exec ds/routewarden -- routewarden ...` does: PATH finds the agent.
    let exec = ok(Command::new("podman").args(["exec", &name, "routewarden", "--version"]));
    assert_eq!(exec, format!("routewarden {}\n", env!("CARGO_PKG_VERSION")));
    stop_container(&lab, container);
    eprintln!("image: podman run with the DaemonSet's settings and podman 4.3's seccomp profile: routes programmed, BPF watchers degraded (bpf() needs CAP_SYS_ADMIN in that profile); /readyz:\n{ready}");

    // 2. A profile that allows bpf()/perf_event_open() to CAP_BPF/CAP_PERFMON (containerd's and
    //    Docker's rule): with the DaemonSet's capabilities the embedded BPF object loads and
    //    every watcher runs (the socket-filter route watch: this kernel allows no fentry/kprobe).
    let dir = tempfile::tempdir().unwrap();
    let profile = seccomp_with_bpf_caps(dir.path());
    let (container, ready) = start_container(&lab, &name, daemonset_podman_run(&name, &ns, &id, &[format!("seccomp={}", profile.display())]));
    for line in ["bpf route_watch: ready", "bpf tc_count: ready", "bpf tc_forward: ready"] {
        assert!(ready.lines().any(|l| l == line), "no {line:?} in /readyz:\n{ready}");
    }
    assert_eq!(metrics(&lab, "node-a").value(r#"routewarden_route_watch_backend_info{backend="socket-filter"}"#), 1);
    stop_container(&lab, container);
    eprintln!(
        "image: podman run with the DaemonSet's settings, bpf()/perf_event_open() allowed for CAP_BPF/CAP_PERFMON: every BPF watcher ready; /readyz:\n{ready}"
    );
}
