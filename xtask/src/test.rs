//! `cargo xtask test`: the whole suite.
//!
//! 1. Build the BPF object (so the agent under test embeds it and the BPF tests run).
//! 2. `cargo test --workspace --features routewarden/privileged-tests`: unit tests, property
//!    tests, the integration tests that need no root (`agent/tests/*.rs`), and, built only with
//!    that feature, the privileged ones (`agent/tests/privileged/`: each in namespaces it
//!    creates; root needed, as in CI). `docs/testing.md` says which runs where.
//! 3. Before that, the amd64 image ([`crate::image`], as `cargo xtask image`): its id goes to
//!    `agent/tests/privileged/image.rs` and `agent/tests/privileged/in_cluster.rs` (the
//!    rendered DaemonSet against the API-server stand-in; it also needs `kubectl` for
//!    kustomize) as `ROUTEWARDEN_IMAGE`. The arm64 image and the OCI archive of both build on
//!    a thread of their own at the lowest CPU priority while step 2 and the lane run; the image
//!    tests that need them ([`SECOND_PASS_TESTS`]) return at once in step 2 (saying so) and run
//!    in a second pass once they are built, with `ROUTEWARDEN_IMAGE_ARM64` and
//!    `ROUTEWARDEN_IMAGE_ARCHIVE`. Skip with `--no-image` (the image tests then print SKIPPED).
//! 4. The QEMU lane ([`crate::qemu`]): the privileged tests that need fentry, kprobes or a real
//!    `tunl0`, and step 3's release agent itself, under Debian's stock kernel in QEMU. Its
//!    guest boots once every test binary is built and runs while step 2's tests do (its console
//!    is printed after them). Skip with `--no-qemu`; run alone with `--qemu-only` (which builds
//!    the release agent itself).
//! 5. Skips: every host test that cannot run appends its `SKIPPED` line to a log
//!    ([`routewarden_lab::skip`], `target/host-skips.log`); the run prints the host lane's skip
//!    count beside the QEMU lane's and fails on any skip [`HOST_ALLOWED_SKIPS`] does not name.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::{build::build_bpf, run_cmd, workspace_root};

/// The cargo feature that builds the agent's privileged integration tests (the `[[test]]`
/// targets under `agent/tests/privileged/`, `agent/Cargo.toml`); without it `cargo test` builds
/// only the tests that need no root. Every cargo command here that builds or lints the tests
/// passes it, so that they all build the agent with one set of features.
pub const PRIVILEGED_TESTS_FEATURE: &str = "routewarden/privileged-tests";

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

/// The house rules: the supply chain ([`crate::licences`]: licences, sources, bans), the whole tree formatted (`rustfmt.toml`), and clippy with the
/// workspace lints (pedantic, `Cargo.toml` `[workspace.lints]`) and `-D warnings` on every
/// host crate and target, and on the BPF crate. Debian's BPF toolchain ships no clippy, so the
/// BPF crate is linted for the host target with panic=abort (aya-ebpf builds there; the lints
/// are about the source, which is the same).
///
/// # Errors
/// The first rule broken, naming the command.
pub fn lint(root: &std::path::Path) -> Result<()> {
    crate::licences::check(root)?;
    run_cmd(Command::new("cargo").args(["fmt", "--all", "--", "--check"]).current_dir(root))?;
    run_cmd(
        Command::new("cargo")
            .args(["clippy", "--all-targets", "--features", PRIVILEGED_TESTS_FEATURE, "--", "-D", "warnings"])
            .current_dir(root)
            .env("CARGO_TARGET_DIR", root.join("target")),
    )?;
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
    crate::setup::check_kubectl()?;
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
    // The amd64 image before the host tests (they run it); a failed build fails the run, but
    // after the other tests have run. The arm64 image and the archive of both build on a
    // thread of their own while the host tests and the QEMU lane run ([`Background`]); the
    // tests that need them wait for the second pass.
    let amd64 =
        if args.no_image { Ok(None) } else { crate::image::ensure_tools(true).and_then(|()| crate::image::build_arch(crate::build::Arch::Amd64)).map(Some) };
    let cargo_test = || {
        let mut cmd = Command::new("cargo");
        cmd.args(["test", "--workspace", "--features", PRIVILEGED_TESTS_FEATURE])
            .current_dir(&root)
            .env("CARGO_TARGET_DIR", root.join("target"))
            .env("ROUTEWARDEN_BPF_OBJECT", &object)
            .env("PATH", crate::setup::test_path());
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
    let (amd64, rest) = match amd64 {
        Ok(Some(image)) => (Ok(Some(image.id.clone())), Some(Background::spawn(image))),
        Ok(None) => (Ok(None), None),
        Err(e) => (Err(e), None),
    };
    let mut cmd = cargo_test();
    // --no-fail-fast: one failing test binary must not hide the results of the others.
    cmd.arg("--no-fail-fast");
    let skip_log = root.join("target/host-skips.log");
    match std::fs::remove_file(&skip_log) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e).with_context(|| format!("remove {}", skip_log.display())),
        _ => {}
    }
    cmd.env(routewarden_lab::SKIP_LOG_ENV, &skip_log);
    match &amd64 {
        Ok(Some(id)) => {
            cmd.env("ROUTEWARDEN_IMAGE", id).env(SECOND_PASS_ENV, "1");
        }
        Ok(None) => {}
        Err(e) => eprintln!("image build failed, its tests will print SKIPPED: {e:#}"),
    }
    if !args.cargo_test_args.is_empty() {
        cmd.arg("--").args(&args.cargo_test_args);
    }
    let host = amd64.map(|_| ()).and(run_cmd(&mut cmd));
    // The second pass: the image tests that need the arm64 image or the archive.
    let host = match rest {
        None => host,
        Some(rest) => host.and(rest.join().and_then(|image| {
            eprint!("{}", crate::image::summary(&image));
            let id = |arch: crate::build::Arch| image.platforms.iter().find(|p| p.arch == arch).map(|p| p.id.clone()).unwrap_or_default();
            let mut second = cargo_test();
            second
                .args(["--test", "image"])
                .env(routewarden_lab::SKIP_LOG_ENV, &skip_log)
                .env("ROUTEWARDEN_IMAGE", id(crate::build::Arch::Amd64))
                .env("ROUTEWARDEN_IMAGE_ARM64", id(crate::build::Arch::Arm64))
                .env("ROUTEWARDEN_IMAGE_ARCHIVE", &image.archive)
                .arg("--")
                .args(SECOND_PASS_TESTS)
                .arg("--exact");
            run_cmd(&mut second)
        })),
    };
    let skips = judge_host_skips(&skip_log, args.no_image);
    let host = host.and(skips);
    let Some(lane) = lane else { return host };
    // The lane's result counts even when host tests failed: both are useful in one CI run.
    let lane = lane.and_then(|guest| {
        let (lane, lines) = guest.join().map_err(|_| anyhow::anyhow!("the qemu lane's thread panicked"))??;
        crate::qemu::Lane::echo(&lines);
        lane.report(&lines)
    });
    host.and(lane.map(|_| ()))
}

/// Set in the first pass of the host tests when the arm64 image and the archive are still being
/// built: the tests of [`SECOND_PASS_TESTS`] return at once, saying they run in the second.
pub const SECOND_PASS_ENV: &str = "ROUTEWARDEN_IMAGE_SECOND_PASS";

/// The image tests that need the arm64 image or the OCI archive of both
/// (`agent/tests/privileged/image.rs`): run, after the first pass, once they are built.
pub const SECOND_PASS_TESTS: &[&str] = &[
    "image_is_tagged_labelled_small_and_archived",
    "image_names_its_sbom_which_lists_what_the_agent_links",
    "image_rootfs_is_the_agent_and_what_it_links",
    "image_arm64_agent_prints_what_the_amd64_agent_prints",
];

/// The arm64 image and the archive of both, built on a thread whose processes run at the
/// lowest CPU priority (nice 19): the host tests mostly wait and the lane's guest keeps about
/// one of two cores busy, so the cross build takes what they leave and slows neither much.
struct Background(std::thread::JoinHandle<Result<crate::image::Image>>);

impl Background {
    /// Start building; `amd64` is the amd64 image, which the index names first.
    fn spawn(amd64: crate::image::PlatformImage) -> Background {
        Background(std::thread::spawn(move || {
            lowest_priority();
            let arm64 = crate::image::build_arch(crate::build::Arch::Arm64)?;
            crate::image::index(vec![amd64, arm64])
        }))
    }

    fn join(self) -> Result<crate::image::Image> {
        self.0.join().map_err(|_| anyhow::anyhow!("the arm64 image's thread panicked"))?
    }
}

/// Lower the calling thread's CPU priority to nice 19; the processes it starts inherit it.
fn lowest_priority() {
    // SAFETY: setpriority with `who` 0 changes the calling thread only (Linux: a thread is a
    // task); no memory is passed.
    let r = unsafe { nix::libc::setpriority(nix::libc::PRIO_PROCESS, 0, 19) };
    if r != 0 {
        eprintln!("arm64 image: could not lower the build's priority: {}", std::io::Error::last_os_error());
    }
}

/// A host test that may print `SKIPPED` without failing `cargo xtask test`.
#[derive(Clone, Copy, Debug)]
pub struct HostAllowedSkip {
    /// The test binary (cargo target name, e.g. `route_watch_fentry`).
    pub binary: &'static str,
    /// Text the skip's reason must contain: any other reason to skip still fails the run.
    pub reason: &'static str,
    /// Why the skip is legitimate, and where the test runs instead.
    pub why: &'static str,
}

/// The host lane's allow-list: only what this kind of host kernel cannot do, each covered by
/// the QEMU lane ([`crate::qemu::GUEST_TESTS`] runs these binaries under Debian's stock kernel,
/// where a skip fails). Facts: `../shared/reference/toolchain.md` (the host refuses fentry, has
/// no kprobes and no ipip module).
pub const HOST_ALLOWED_SKIPS: &[HostAllowedSkip] = &[
    HostAllowedSkip {
        binary: "route_watch_fentry",
        reason: "the fentry backend cannot run on this kernel",
        why: "the host kernel refuses fentry attachment; the QEMU lane runs this binary",
    },
    HostAllowedSkip {
        binary: "route_watch_kprobe",
        reason: "the kprobe backend cannot run on this kernel",
        why: "the host kernel has no kprobes; the QEMU lane runs this binary",
    },
    HostAllowedSkip {
        binary: "route_detector",
        reason: "backend cannot run on this kernel",
        why: "its fentry and kprobe cases need what the host kernel lacks; the QEMU lane runs this binary",
    },
    HostAllowedSkip {
        binary: "dataplane_tunl0",
        reason: "no ipip tunl0 on this kernel",
        why: "the host kernel has no ipip module; the QEMU lane runs this binary",
    },
    HostAllowedSkip {
        binary: "forward_ipip",
        reason: "no ipip tunl0 on this kernel",
        why: "the host kernel has no ipip module; the QEMU lane runs this binary",
    },
    HostAllowedSkip {
        binary: "agent_guest",
        reason: "no ipip tunl0 on this kernel",
        why: "the release agent on a stock kernel's fentry, kprobes and ipip tunl0; the QEMU lane runs this binary",
    },
];

/// With `--no-image` the tests of the image skip by request; nothing else may skip because of it.
const NO_IMAGE_SKIPS: &[HostAllowedSkip] = &[
    HostAllowedSkip { binary: "image", reason: "no image (ROUTEWARDEN_IMAGE unset)", why: "`--no-image` was given: the image was not built" },
    HostAllowedSkip { binary: "in_cluster", reason: "no image (ROUTEWARDEN_IMAGE unset)", why: "`--no-image` was given: the image was not built" },
];

/// One line of the host skip log (`<binary>\t<test>\t<reason>`, [`routewarden_lab::skip`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostSkip {
    /// The test binary.
    pub binary: String,
    /// The test.
    pub test: String,
    /// Why it skipped.
    pub reason: String,
}

impl HostSkip {
    /// The allow-list entry that covers this skip, if any.
    pub fn allowed_by<'a>(&self, allowed: &'a [HostAllowedSkip]) -> Option<&'a HostAllowedSkip> {
        allowed.iter().find(|a| a.binary == self.binary && self.reason.contains(a.reason))
    }
}

/// Parse the skip log's text; a line without three tab-separated fields is kept whole as the
/// reason (it still counts, and nothing allows it).
pub fn parse_host_skips(text: &str) -> Vec<HostSkip> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let mut f = l.splitn(3, '\t');
            match (f.next(), f.next(), f.next()) {
                (Some(b), Some(t), Some(r)) => HostSkip { binary: b.into(), test: t.into(), reason: r.into() },
                _ => HostSkip { binary: "?".into(), test: "?".into(), reason: l.into() },
            }
        })
        .collect()
}

/// Print the host lane's skips (count, allow-list, each skip with its verdict) and fail on any
/// the allow-list does not cover.
fn judge_host_skips(log: &Path, no_image: bool) -> Result<()> {
    let text = match std::fs::read_to_string(log) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("read {}", log.display())),
    };
    let mut allowed: Vec<HostAllowedSkip> = HOST_ALLOWED_SKIPS.to_vec();
    if no_image {
        allowed.extend_from_slice(NO_IMAGE_SKIPS);
    }
    let skips = parse_host_skips(&text);
    let refused: Vec<&HostSkip> = skips.iter().filter(|s| s.allowed_by(&allowed).is_none()).collect();
    eprintln!("host lane: {} skipped ({} allowed, {} not allowed; log {})", skips.len(), skips.len() - refused.len(), refused.len(), log.display());
    for a in &allowed {
        let n = skips.iter().filter(|s| s.allowed_by(&allowed).is_some_and(|x| x.binary == a.binary && x.reason == a.reason)).count();
        if n > 0 {
            eprintln!("host lane: allowed skip x{n} in {} when \"{}\": {}", a.binary, a.reason, a.why);
        }
    }
    for s in &refused {
        eprintln!("host lane: skipped (NOT ALLOWED) in {}: {}: {}", s.binary, s.test, s.reason);
    }
    if !refused.is_empty() {
        bail!("{} host tests skipped without being on HOST_ALLOWED_SKIPS (xtask/src/test.rs): install what they name, or run as root", refused.len());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each test the second pass runs exists in `image.rs` and waits for it there.
    #[test]
    fn second_pass_tests_are_the_image_tests_that_wait_for_it() {
        let source = std::fs::read_to_string(crate::workspace_root().join("agent/tests/privileged/image.rs")).unwrap();
        for name in SECOND_PASS_TESTS {
            assert!(source.contains(&format!("fn {name}()")), "{name} is not a test of image.rs");
            assert!(source.contains(&format!("image_and_arm64(\"{name}\")")), "{name} does not wait for the second pass");
        }
        assert_eq!(source.matches("image_and_arm64(\"").count(), SECOND_PASS_TESTS.len(), "a test waits for a second pass that does not run it");
        // And every test that needs the arm64 image or the archive is one of them.
        for test in source.split("#[test]\nfn ").skip(1) {
            let name = test.split('(').next().unwrap();
            let body = test.split("\n}\n").next().unwrap();
            if body.contains("image_arm64()") || body.contains("ROUTEWARDEN_IMAGE_ARCHIVE") {
                assert!(SECOND_PASS_TESTS.contains(&name), "{name} needs the arm64 image or the archive but runs in the first pass");
            }
        }
    }

    #[test]
    fn a_host_skip_is_allowed_only_by_its_binary_and_reason() {
        let skips = parse_host_skips(
            "route_watch_fentry\tfentry::writes\tthe fentry backend cannot run on this kernel: EINVAL\n\
             route_watch_fentry\tfentry::writes\tthis test binary was built without the BPF object\n\
             agent_lab\tx\tthe fentry backend cannot run on this kernel\n\
             garbage line\n",
        );
        assert_eq!(skips.len(), 4);
        assert_eq!(
            skips[0],
            HostSkip {
                binary: "route_watch_fentry".into(),
                test: "fentry::writes".into(),
                reason: "the fentry backend cannot run on this kernel: EINVAL".into()
            }
        );
        let verdicts: Vec<bool> = skips.iter().map(|s| s.allowed_by(HOST_ALLOWED_SKIPS).is_some()).collect();
        assert_eq!(verdicts, [true, false, false, false]);
        assert_eq!(skips[3], HostSkip { binary: "?".into(), test: "?".into(), reason: "garbage line".into() });
    }

    #[test]
    fn image_skips_are_allowed_only_with_no_image() {
        let dir = std::env::temp_dir().join(format!("rw-skips-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("skips.log");
        std::fs::write(&log, "image\truns_as_daemonset\tno image (ROUTEWARDEN_IMAGE unset); `cargo xtask test` builds it\n").unwrap();
        assert!(judge_host_skips(&log, true).is_ok());
        assert!(judge_host_skips(&log, false).is_err());
        assert!(judge_host_skips(&dir.join("absent.log"), false).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
