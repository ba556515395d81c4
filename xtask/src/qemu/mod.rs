//! The QEMU lane of `cargo xtask test`: the privileged tests that need what this host's kernel
//! lacks (fentry, kprobes, a real `tunl0`), run under Debian's stock cloud kernel in QEMU with
//! software emulation (facts and the boot recipe: `../shared/reference/toolchain.md`).
//!
//! Steps, everything under `target/qemu/` (inside the repo):
//! 1. `apt-get download linux-image-<ver>-cloud-amd64-unsigned`, `dpkg-deb -x` it: `vmlinuz`
//!    and the modules the tests need (veth, bridge, dummy, ipip + deps, clsact, cls_bpf).
//! 2. `cargo test --no-run --message-format=json` for [`GUEST_TESTS`] with the BPF object
//!    embedded; the executables are found in cargo's JSON and stripped of debug info. And the
//!    release agent, `target/release/routewarden` with the object embedded, as the image ships
//!    it (`build::build_agent`: a no-op for cargo in `cargo xtask test`, whose image step has
//!    built it).
//! 3. A busybox initramfs (`busybox cpio -o -H newc`, gzip): busybox applets, iproute2's `ip`,
//!    the test binaries, the release agent at [`GUEST_AGENT`] (as built: the image ships the
//!    same code without its symbol table), the example cluster (`examples/cluster`) at
//!    [`GUEST_EXAMPLE_CLUSTER`], every shared library
//!    `ldd` lists, the modules, and an `/init` that mounts proc/sys/dev/bpffs/debugfs/tracefs,
//!    loads the modules and runs each test binary with
//!    `ROUTEWARDEN_REQUIRE_BACKENDS=fentry,kprobe,socket-filter` (a backend that fails to start
//!    there is a failure, not a skip), `ROUTEWARDEN_QEMU_GUEST=1`, and [`AGENT_ENV`] and
//!    [`EXAMPLE_CLUSTER_ENV`] naming the agent and the example cluster (`agent_guest` runs that
//!    agent: the shipped binary, on a stock kernel, with the backend it picks there).
//! 4. `qemu-system-x86_64 -accel tcg -cpu max -m 1024 -smp 2 ... -nographic -no-reboot` with a
//!    wall-clock timeout; the guest's console is echoed and saved to
//!    `target/qemu/console.log`, and each binary's `test result:` line is parsed.
//!
//! The lane fails when a test fails, when none passes, when a module of [`MODULES`] is neither
//! in the kernel package nor built in or fails to load, and when a test prints `SKIPPED` in the
//! guest, unless [`ALLOWED_SKIPS`] names it with the reason it may.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::{run_cmd, workspace_root};

mod init;

use init::init_script;

/// The Debian kernel package booted in the lane (6.1: fentry, kprobes, BTF, ipip as module).
/// Override with `ROUTEWARDEN_QEMU_KERNEL_PACKAGE`.
pub const KERNEL_PACKAGE: &str = "linux-image-6.1.0-50-cloud-amd64-unsigned";

/// Integration-test targets of the `routewarden` package run in the guest.
/// `dataplane_tunl0`, `forward_ipip` and `agent_guest` need the guest's real ipip `tunl0` (they
/// print `SKIPPED` on a host without it); `agent_guest` runs the release agent ([`AGENT_ENV`])
/// with fentry, the backend it picks on this kernel, and with kprobe.
pub const GUEST_TESTS: &[&str] = &[
    "bpf_tc_count",
    "route_watch_fentry",
    "route_watch_kprobe",
    "route_watch_socket_filter",
    "route_watch_events",
    "route_detector",
    "dataplane_tunl0",
    "forward_ipip",
    "agent_guest",
];

/// A test that may print `SKIPPED` in the guest without failing the lane.
#[derive(Clone, Copy, Debug)]
pub struct AllowedSkip {
    /// The test's name as it prints it (`SKIPPED <test>: <reason>`).
    pub test: &'static str,
    /// Text its reason must contain: another reason to skip still fails the lane.
    pub reason: &'static str,
    /// Why skipping is legitimate there (printed in the lane's summary).
    pub why: &'static str,
}

/// Skips the lane accepts. None today: the guest runs as root, every test binary embeds the
/// BPF object, `ROUTEWARDEN_REQUIRE_BACKENDS` turns a backend that cannot start into a failure,
/// and the ipip module gives the `tunl0` tests their device.
pub const ALLOWED_SKIPS: &[AllowedSkip] = &[];

/// Kernel command-line marker of the lane's guest; with [`GUEST_ENV`] it tells a test it runs
/// in the throwaway guest, where it may change global kernel settings such as
/// `kernel.bpf_stats_enabled` (never on a host).
pub const GUEST_CMDLINE_MARKER: &str = "routewarden.qemu_lane=1";

/// Environment variable set (to `1`) for every test binary run in the guest.
pub const GUEST_ENV: &str = "ROUTEWARDEN_QEMU_GUEST";

/// Environment variable naming the release agent in the guest ([`GUEST_AGENT`]) for every test
/// binary run there.
pub const AGENT_ENV: &str = "ROUTEWARDEN_AGENT_BINARY";

/// Where the initramfs holds the release agent (`target/release/routewarden`).
pub const GUEST_AGENT: &str = "/usr/bin/routewarden";

/// Environment variable naming the example cluster in the guest ([`GUEST_EXAMPLE_CLUSTER`]) for
/// every test binary run there.
pub const EXAMPLE_CLUSTER_ENV: &str = "ROUTEWARDEN_EXAMPLE_CLUSTER";

/// Where the initramfs holds the repository's `examples/cluster` (the file datastore the agent
/// runs on in the guest).
pub const GUEST_EXAMPLE_CLUSTER: &str = "/usr/share/routewarden/examples/cluster";

/// Modules loaded in the guest, dependencies first. Each is required: one missing from the
/// kernel package must be built in (`modules.builtin`), and one that fails to load fails the
/// lane.
const MODULES: &[&str] = &[
    "drivers/net/veth",
    "drivers/net/dummy",
    "net/llc/llc",
    "net/802/stp",
    "net/bridge/bridge",
    "net/ipv4/tunnel4",
    "net/ipv4/ip_tunnel",
    "net/ipv4/ipip",
    "net/sched/sch_ingress",
    "net/sched/cls_bpf",
];

/// Busybox applets linked in the initramfs (`ip` is iproute2's, not busybox's).
const APPLETS: &[&str] = &[
    "sh", "mount", "insmod", "mkdir", "cat", "echo", "poweroff", "sleep", "sysctl", "uname", "ls", "rm", "cp", "ln", "true", "false", "grep", "kill", "ps",
    "dmesg", "env", "seq", "mv", "touch",
];

/// Guest wall-clock limit: a hang's bound, not a speed target. The lane runs under TCG, whose
/// speed follows the host: on 2026-12-03 two CI runs on this machine kind reached 7 min in
/// the last test binary (route_detector), every test until then passing; and `cargo xtask
/// test` boots it beside the host tests, which take their share of the CPU.
const GUEST_TIMEOUT: Duration = Duration::from_mins(15);

/// Result of the lane.
#[derive(Debug, Default)]
pub struct LaneSummary {
    /// Tests passed in the guest.
    pub passed: u32,
    /// Tests failed in the guest (plus binaries that crashed without a result line).
    pub failed: u32,
    /// `SKIPPED` lines printed in the guest.
    pub skipped: u32,
    /// Test binaries that exited non-zero.
    pub failed_binaries: Vec<String>,
    /// Every `SKIPPED` line, in order.
    pub skips: Vec<Skip>,
    /// Modules whose `insmod` failed in the guest (`RW-LANE-MODULE-FAILED <name>`).
    pub module_failures: Vec<String>,
}

/// One `SKIPPED <test>: <reason>` line of the guest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skip {
    /// The test binary that printed it (`?` outside one).
    pub binary: String,
    /// The test's name.
    pub test: String,
    /// Why it skipped.
    pub reason: String,
}

impl Skip {
    /// The allow-list entry that covers this skip, if any.
    pub fn allowed_by<'a>(&self, allowed: &'a [AllowedSkip]) -> Option<&'a AllowedSkip> {
        allowed.iter().find(|a| a.test == self.test && self.reason.contains(a.reason))
    }
}

impl LaneSummary {
    /// Why the lane fails (empty: it passes), given the skips it accepts.
    pub fn problems(&self, allowed: &[AllowedSkip]) -> Vec<String> {
        let mut out = Vec::new();
        if self.failed > 0 {
            let failing = if self.failed_binaries.is_empty() { String::new() } else { format!(" (failing: {})", self.failed_binaries.join(", ")) };
            out.push(format!("{} tests failed{failing}", self.failed));
        }
        if self.passed == 0 {
            out.push("no test passed".into());
        }
        for m in &self.module_failures {
            out.push(format!("module {m} failed to load"));
        }
        for s in self.skips.iter().filter(|s| s.allowed_by(allowed).is_none()) {
            out.push(format!("{} skipped in {} (not in ALLOWED_SKIPS): {}", s.test, s.binary, s.reason));
        }
        out
    }
}

fn qemu_dir() -> PathBuf {
    workspace_root().join("target/qemu")
}

/// Fetch and unpack the kernel package; returns (vmlinuz, modules dir).
fn kernel() -> Result<(PathBuf, PathBuf)> {
    let dir = qemu_dir();
    std::fs::create_dir_all(&dir)?;
    let package = std::env::var("ROUTEWARDEN_QEMU_KERNEL_PACKAGE").unwrap_or_else(|_| KERNEL_PACKAGE.to_string());
    let unpacked = dir.join(&package);
    if !unpacked.join("boot").is_dir() {
        let has_deb = |d: &Path| {
            std::fs::read_dir(d).ok().and_then(|rd| {
                rd.flatten().map(|e| e.path()).find(|p| {
                    p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&format!("{package}_"))) && p.extension().is_some_and(|e| e == "deb")
                })
            })
        };
        if has_deb(&dir).is_none() {
            run_cmd(Command::new("apt-get").args(["download", &package]).current_dir(&dir))
                .with_context(|| format!("download {package} (run `apt-get update` first; list candidates with `apt-cache search cloud-amd64-unsigned`)"))?;
        }
        let deb = has_deb(&dir).context("downloaded kernel .deb not found")?;
        let tmp = dir.join(format!("{package}.tmp"));
        let _ = std::fs::remove_dir_all(&tmp);
        run_cmd(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&tmp))?;
        std::fs::rename(&tmp, &unpacked)?;
    }
    let vmlinuz = std::fs::read_dir(unpacked.join("boot"))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("vmlinuz-")))
        .context("no boot/vmlinuz-* in the kernel package")?;
    let modules = std::fs::read_dir(unpacked.join("lib/modules"))?.flatten().map(|e| e.path()).next().context("no lib/modules/<ver>")?;
    Ok((vmlinuz, modules.join("kernel")))
}

/// Build the guest test binaries with the object embedded; return their paths by target name.
fn build_tests(object: &Path) -> Result<Vec<(String, PathBuf)>> {
    let root = workspace_root();
    let mut cmd = Command::new("cargo");
    // `--workspace`, as the host lane's build: features are unified over the same packages, so
    // this reuses its artifacts (`-p routewarden` resolved other features of rustls, ring and
    // more, and rebuilt them: two minutes of every CI run).
    cmd.args(["test", "--workspace", "--no-run", "--message-format=json", "--features", crate::test::PRIVILEGED_TESTS_FEATURE])
        .current_dir(&root)
        .env("CARGO_TARGET_DIR", root.join("target"))
        .env("ROUTEWARDEN_BPF_OBJECT", object)
        // The host lane's `PATH` too: a build script that reads it must not see a change.
        .env("PATH", crate::setup::test_path())
        .stderr(Stdio::inherit());
    for t in GUEST_TESTS {
        cmd.args(["--test", t]);
    }
    eprintln!("+ {}", crate::display(&cmd));
    let out = cmd.output().context("cargo test --no-run")?;
    if !out.status.success() {
        bail!("building the guest tests failed");
    }
    let mut found = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if !line.contains(r#""reason":"compiler-artifact""#) {
            continue;
        }
        let Some(exe) = json_str(line, "executable") else { continue };
        if let Some(name) = GUEST_TESTS.iter().find(|t| line.contains(&format!(r#""name":"{t}""#))) {
            found.push(((*name).to_string(), PathBuf::from(exe)));
        }
    }
    for t in GUEST_TESTS {
        if !found.iter().any(|(n, _)| n == t) {
            bail!("cargo did not report an executable for test target {t}");
        }
    }
    Ok(found)
}

/// The string value of `"key":"..."` in one line of cargo's JSON (paths have no quotes).
fn json_str<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!(r#""{key}":""#);
    let start = line.find(&pat)? + pat.len();
    let end = line[start..].find('"')? + start;
    Some(&line[start..end])
}

/// Shared libraries `ldd` lists for `bin` (absolute paths).
fn shared_libs(bin: &Path) -> Result<BTreeSet<PathBuf>> {
    let out = Command::new("ldd").arg(bin).output().context("ldd")?;
    let mut libs = BTreeSet::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let path = match line.split_once("=>") {
            Some((_, rhs)) => rhs.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.insert(PathBuf::from(p));
        }
    }
    Ok(libs)
}

fn copy_into(stage: &Path, src: &Path, dest_rel: &str) -> Result<()> {
    let dest = stage.join(dest_rel.trim_start_matches('/'));
    std::fs::create_dir_all(dest.parent().context("dest parent")?)?;
    std::fs::copy(src, &dest).with_context(|| format!("copy {} -> {}", src.display(), dest.display()))?;
    Ok(())
}

/// Whether `modules.builtin` (one `kernel/<path>.ko` a line) lists module `m` (`net/ipv4/ipip`).
fn is_builtin(builtin: &str, m: &str) -> bool {
    let want = format!("kernel/{m}.ko");
    builtin.lines().any(|l| l.trim() == want)
}

/// Build the initramfs with the test binaries `tests` and the release `agent`; returns its path.
fn initramfs(tests: &[(String, PathBuf)], agent: &Path, modules_dir: &Path) -> Result<PathBuf> {
    let dir = qemu_dir();
    let stage = dir.join("initramfs");
    let _ = std::fs::remove_dir_all(&stage);
    for d in ["bin", "sbin", "usr/bin", "usr/sbin", "tests", "lib/modules", "proc", "sys", "dev", "tmp", "run", "etc"] {
        std::fs::create_dir_all(stage.join(d))?;
    }
    copy_into(&stage, Path::new("/bin/busybox"), "/bin/busybox").context("busybox-static not installed?")?;
    for a in APPLETS {
        std::os::unix::fs::symlink("busybox", stage.join("bin").join(a))?;
    }
    let ip = ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"].into_iter().map(Path::new).find(|p| p.exists()).context("iproute2 `ip` not found")?;
    copy_into(&stage, ip, "/usr/sbin/ip")?;
    let mut libs = shared_libs(ip)?;
    for (name, bin) in tests {
        let dest = stage.join("tests").join(name);
        run_cmd(Command::new("strip").arg("--strip-debug").arg("-o").arg(&dest).arg(bin))?;
        libs.extend(shared_libs(bin)?);
    }
    // The agent as built: the code the image ships (there without its symbol table).
    copy_into(&stage, agent, GUEST_AGENT)?;
    run_cmd(Command::new("chmod").arg("755").arg(stage.join(GUEST_AGENT.trim_start_matches('/'))))?;
    libs.extend(shared_libs(agent)?);
    for lib in &libs {
        copy_into(&stage, lib, &lib.to_string_lossy())?;
    }
    let examples = workspace_root().join("examples/cluster");
    for entry in std::fs::read_dir(&examples).with_context(|| format!("read {}", examples.display()))? {
        let path = entry?.path();
        if let Some(name) = path.file_name().and_then(|n| n.to_str()).filter(|_| path.is_file()) {
            copy_into(&stage, &path, &format!("{GUEST_EXAMPLE_CLUSTER}/{name}"))?;
        }
    }
    let builtin_list = modules_dir.parent().context("modules dir parent")?.join("modules.builtin");
    let builtin = std::fs::read_to_string(&builtin_list).with_context(|| format!("read {}", builtin_list.display()))?;
    let mut loaded = Vec::new();
    for m in MODULES {
        let src = modules_dir.join(format!("{m}.ko"));
        if src.exists() {
            let base = m.rsplit('/').next().unwrap_or(m).to_string();
            copy_into(&stage, &src, &format!("/lib/modules/{base}.ko"))?;
            loaded.push(base);
        } else if is_builtin(&builtin, m) {
            eprintln!("qemu lane: module {m} is built into this kernel");
        } else {
            bail!("module {m} is neither in the kernel package nor built in ({})", builtin_list.display());
        }
    }
    std::fs::write(stage.join("etc/passwd"), "root:x:0:0:root:/:/bin/sh\n")?;
    let init = stage.join("init");
    std::fs::write(&init, init_script(tests, &loaded))?;
    run_cmd(Command::new("chmod").arg("755").arg(&init))?;
    let out = dir.join("initrd.gz");
    run_cmd(Command::new("sh").arg("-c").arg(format!(
        "cd '{}' && find . | /bin/busybox cpio -o -H newc 2>/dev/null | gzip -1 > '{}'",
        stage.display(),
        out.display()
    )))?;
    eprintln!("qemu lane: initramfs {} ({} MiB)", out.display(), std::fs::metadata(&out)?.len() >> 20);
    Ok(out)
}

/// Boot the guest and run the tests; returns the console lines.
/// Boot the guest and collect its console until it powers off or [`GUEST_TIMEOUT`]; every
/// line is saved to `target/qemu/console.log`, and echoed as `guest| <line>` when `echo`
/// (else the caller prints them, so that a lane run beside the host tests does not interleave
/// with their output).
fn boot(vmlinuz: &Path, initrd: &Path, echo: bool) -> Result<Vec<String>> {
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args(["-accel", "tcg", "-cpu", "max", "-m", "1024", "-smp", "2", "-kernel"])
        .arg(vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        .args(["-append", &format!("console=ttyS0 quiet panic=-1 {GUEST_CMDLINE_MARKER}"), "-nographic", "-no-reboot"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    eprintln!("+ {}", crate::display(&cmd));
    let mut child = cmd.spawn().context("start qemu-system-x86_64 (apt-get install qemu-system-x86)")?;
    let stdout = child.stdout.take().context("qemu stdout")?;
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut log = std::fs::File::create(qemu_dir().join("console.log"))?;
    let started = Instant::now();
    let mut lines = Vec::new();
    let mut timed_out = false;
    loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => {
                let line = line.trim_end_matches('\r').to_string();
                if echo {
                    println!("guest| {line}");
                }
                writeln!(log, "{line}")?;
                lines.push(line);
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
        }
        if started.elapsed() > GUEST_TIMEOUT {
            timed_out = true;
            let _ = child.kill();
            break;
        }
    }
    let _ = child.wait();
    let _ = reader.join();
    eprintln!("qemu lane: guest ran {:.1} s", started.elapsed().as_secs_f64());
    if timed_out {
        lines.push(format!("RW-LANE-TIMEOUT after {GUEST_TIMEOUT:?}"));
    }
    Ok(lines)
}

/// Parse the guest console: libtest `test result:` lines, `SKIPPED` lines, module load
/// failures, exit codes.
pub fn parse_console(lines: &[String]) -> LaneSummary {
    let mut s = LaneSummary::default();
    let mut current: Option<String> = None;
    let mut saw_result = false;
    for line in lines {
        if let Some(name) = line.strip_prefix("RW-LANE-BEGIN ") {
            current = Some(name.trim().to_string());
            saw_result = false;
        } else if let Some(rest) = line.strip_prefix("RW-LANE-EXIT ") {
            let mut it = rest.split_whitespace();
            let (name, code) = (it.next().unwrap_or("?"), it.next().unwrap_or("?"));
            if code != "0" {
                s.failed_binaries.push(name.to_string());
                if !saw_result {
                    s.failed += 1; // crashed before libtest's summary
                }
            }
            current = None;
        } else if let Some(module) = line.strip_prefix("RW-LANE-MODULE-FAILED ") {
            s.module_failures.push(module.trim().to_string());
        } else if let Some(idx) = line.find("test result: ") {
            saw_result = true;
            for part in line[idx..].split(';') {
                let n = part.split_whitespace().rev().nth(1).and_then(|x| x.parse::<u32>().ok()).unwrap_or(0);
                if part.trim_end().ends_with("passed") {
                    s.passed += n;
                } else if part.trim_end().ends_with("failed") {
                    s.failed += n;
                }
            }
        } else if let Some(idx) = line.find("SKIPPED ") {
            // With --nocapture the line may start with libtest's `test <name> ... `.
            let rest = line[idx + "SKIPPED ".len()..].trim();
            let (test, reason) = rest.split_once(": ").unwrap_or((rest, ""));
            s.skipped += 1;
            s.skips.push(Skip { binary: current.clone().unwrap_or_else(|| "?".into()), test: test.trim().to_string(), reason: reason.trim().to_string() });
        }
    }
    if current.is_some() || !lines.iter().any(|l| l.starts_with("RW-LANE-DONE")) {
        s.failed += 1;
        s.failed_binaries.push(current.unwrap_or_else(|| "guest (did not finish)".into()));
    }
    s
}

/// Run the lane. Prints `qemu lane: N passed, N failed, N skipped` with the allow-list and
/// every skip, and fails on any of [`LaneSummary::problems`].
pub fn run(object: &Path) -> Result<LaneSummary> {
    let lane = Lane::prepare(object)?;
    let lines = boot(&lane.vmlinuz, &lane.initrd, true)?;
    lane.report(&lines)
}

/// The lane's guest, ready to boot: steps 1–3 done.
pub struct Lane {
    started: Instant,
    vmlinuz: PathBuf,
    initrd: PathBuf,
}

impl Lane {
    /// Steps 1–3: the kernel, the guest tests and the release agent (both built with the BPF
    /// object `object`) and the initramfs.
    pub fn prepare(object: &Path) -> Result<Lane> {
        let started = Instant::now();
        let (vmlinuz, modules) = kernel()?;
        let tests = build_tests(object)?;
        let agent = crate::build::build_agent(object)?;
        let initrd = initramfs(&tests, &agent, &modules)?;
        Ok(Lane { started, vmlinuz, initrd })
    }

    /// Boot the guest on a thread of its own, its console not echoed; the thread returns the
    /// console's lines.
    pub fn spawn(self) -> std::thread::JoinHandle<Result<(Lane, Vec<String>)>> {
        std::thread::spawn(move || {
            let lines = boot(&self.vmlinuz, &self.initrd, false)?;
            Ok((self, lines))
        })
    }

    /// Print what the guest printed (`guest| <line>`), as [`Lane::report`] judges it.
    pub fn echo(lines: &[String]) {
        for line in lines {
            println!("guest| {line}");
        }
    }

    /// Judge the console `lines`: the summary, or why the lane failed.
    pub fn report(&self, lines: &[String]) -> Result<LaneSummary> {
        report(self.started, &self.vmlinuz, lines)
    }
}

/// The lane's verdict on the console `lines` of a guest booted from `vmlinuz`, the lane having
/// started at `t0`.
fn report(t0: Instant, vmlinuz: &Path, lines: &[String]) -> Result<LaneSummary> {
    let s = parse_console(lines);
    let allowed = s.skips.iter().filter(|k| k.allowed_by(ALLOWED_SKIPS).is_some()).count();
    eprintln!(
        "qemu lane ({}): {} passed, {} failed, {} skipped ({allowed} allowed) in {:.0} s{}",
        vmlinuz.file_name().and_then(|n| n.to_str()).unwrap_or("?"),
        s.passed,
        s.failed,
        s.skipped,
        t0.elapsed().as_secs_f64(),
        if s.failed_binaries.is_empty() { String::new() } else { format!(" (failing: {})", s.failed_binaries.join(", ")) }
    );
    if ALLOWED_SKIPS.is_empty() {
        eprintln!("qemu lane: allowed skips: none (any SKIPPED fails the lane)");
    } else {
        eprintln!("qemu lane: allowed skips:");
        for a in ALLOWED_SKIPS {
            eprintln!("  {} when \"{}\": {}", a.test, a.reason, a.why);
        }
    }
    for k in &s.skips {
        let verdict = if k.allowed_by(ALLOWED_SKIPS).is_some() { "allowed" } else { "NOT ALLOWED" };
        eprintln!("qemu lane: skipped ({verdict}) in {}: {}: {}", k.binary, k.test, k.reason);
    }
    let problems = s.problems(ALLOWED_SKIPS);
    if !problems.is_empty() {
        bail!("qemu lane failed: {} (console: target/qemu/console.log)", problems.join("; "));
    }
    Ok(s)
}

#[cfg(test)]
mod tests;
