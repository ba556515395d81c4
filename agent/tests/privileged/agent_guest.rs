//! The shipped agent on a stock kernel: the release `routewarden` binary, with the
//! BPF object embedded, run on node-a of the example cluster (file datastore) in a node
//! namespace whose `tunl0` is the kernel's own ipip device. Every kernel with BTF makes the
//! agent pick the fentry route-watch backend, which this host's kernel refuses; so the test runs
//! in the QEMU lane of `cargo xtask test` (Debian's 6.1 cloud kernel), which copies the release
//! agent and `examples/cluster` into its initramfs and names them in [`AGENT_ENV`] and
//! [`EXAMPLE_CLUSTER_ENV`]. Without a real ipip `tunl0` or without the release agent it prints
//! `SKIPPED` and returns.
//!
//! Each test runs the agent once: with the backend it picks (it must be fentry there), and
//! with `--route-watch-backend kprobe` (the backend of a kernel without fentry; the variant is
//! the flag, everything else as shipped). In each run:
//! - its seven IPIP routes are in the kernel, exactly, four of them on the real `tunl0`;
//! - `routewarden events -o json --agent-pid <agent>`, a process of its own started before the
//!   agent (so both watches see the same writes, the agent's first ones included), streams
//!   every write;
//! - a second writer, a long-lived process named `bird` (this test binary re-executed in a
//!   helper mode that renames itself), rewrites the agent's route to node-b's IPIP Always
//!   block with protocol 12 three times, a second after the agent has put its own back: one
//!   conflict episode and one flap episode, in the stream, the agent's log and `/metrics`,
//!   naming `bird`'s pid and comm; the agent's route is in the kernel at the end;
//! - a third process, named `rw-deleter`, deletes the agent's route to node-d's IPIP Always
//!   block: one conflict naming it (pid and comm) on the delete; the agent puts the route back.
//!   Its writer class is checked last, for the rule that takes the class from the process
//!   (`other`), not from the deleted route's protocol (80, `felix`);
//! - `bird` then tries three times to create the agent's route to node-b's block
//!   (create-exclusive, as BIRD looping on "File exists", Calico#10585): the kernel refuses each,
//!   and the agent and the stream report one failing-writer episode naming `bird` and `EEXIST`,
//!   the refused adds counted apart from writes.
//!
//! Every backend names a writer by its process (the thread group's leader: pid and name), so
//! the agent's writes, made by its batch sender thread, show as `routewarden`.
//!
//! The agent and the stream run with a 120 s window (the default is 30 s) so that the whole
//! scenario, at TCG speed, lies in one window: each prefix then has exactly one episode of
//! each kind, and the counts are exact. The test checks that premise.

mod lab_support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write as _};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lab_support::{example_dir, metrics, routes, wait_for, wait_ready, Agent, NODE_A_IPIP, PORT};
use routewarden::datastore::FileDatastore;
use routewarden_lab::{skip_unless_root, Lab, LabNodeSpec, LabSpec, NetNsGuard};
use serde_json::Value;

/// Set by the QEMU lane: the release agent in the guest (`xtask/src/qemu/mod.rs` `AGENT_ENV`).
const AGENT_ENV: &str = "ROUTEWARDEN_AGENT_BINARY";
/// Set by the QEMU lane: the example cluster in the guest (`EXAMPLE_CLUSTER_ENV`).
const EXAMPLE_CLUSTER_ENV: &str = "ROUTEWARDEN_EXAMPLE_CLUSTER";
/// The helper mode of this binary: `bird` or `rw-deleter` (see [`helper_bird`]).
const HELPER_ENV: &str = "ROUTEWARDEN_AGENT_GUEST_HELPER";
/// The network namespace (`/run/netns/<name>`) the helper writes in.
const HELPER_NETNS_ENV: &str = "ROUTEWARDEN_AGENT_GUEST_NETNS";

/// Conflict / flap window of the agent and of the stream, seconds (see the module doc).
const WINDOW_S: u64 = 120;
/// The prefix `bird` fights over: node-b's block of the IPIP Always pool.
const FOUGHT: &str = "10.245.20.0/26";
/// The prefix `rw-deleter` deletes: node-d's block of the IPIP Always pool.
const DELETED: &str = "10.245.40.0/26";
/// Rounds of the fight: `bird` writes, the agent puts its route back.
const ROUNDS: u64 = 3;
/// Times `bird` then tries to create [`FOUGHT`] while the agent holds it (each refused).
const REFUSALS: u64 = 3;
/// How long `bird` waits after the agent's repair before it writes again.
const BIRD_INTERVAL: Duration = Duration::from_secs(1);
/// A deadline for what takes well under a second on a host and a few under TCG.
const DEADLINE: Duration = Duration::from_mins(1);

#[test]
fn the_release_agent_picks_fentry_and_reports_a_bird_and_a_deleter() {
    run("the_release_agent_picks_fentry_and_reports_a_bird_and_a_deleter", None);
}

/// kprobe is what the agent falls back to on a kernel without fentry (or with it refused):
/// forced here, since this kernel has both.
#[test]
fn the_release_agent_with_kprobe_reports_a_bird_and_a_deleter() {
    run("the_release_agent_with_kprobe_reports_a_bird_and_a_deleter", Some("kprobe"));
}

/// Helper mode `bird` (run by [`run`], never on its own: ignored): names itself `bird`, enters
/// the node's namespace and, for every line on stdin, replaces [`FOUGHT`] with a protocol-12
/// route of the agent's shape over its one netlink socket, printing `RW-BIRD-WROTE <n>` once
/// the kernel has answered. Exits at the end of stdin.
#[test]
#[ignore = "helper process of the agent_guest tests, started by them"]
fn helper_bird() {
    let Some(netns) = helper("bird") else { return };
    runtime().block_on(async {
        let handle = netlink(&netns);
        let tunl0 = nix::net::if_::if_nametoindex("tunl0").expect("tunl0 in the node namespace");
        let (dst, len) = prefix(FOUGHT);
        let mut lines = BufReader::new(std::io::stdin()).lines();
        let (mut n, mut refused) = (0, 0);
        while let Some(Ok(line)) = lines.next() {
            let msg = rtnetlink::RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(dst, len)
                .gateway(Ipv4Addr::new(10, 0, 0, 12))
                .output_interface(tunl0)
                .onlink()
                .priority(1024)
                .protocol(12.into())
                .build();
            if line == "create" {
                // Create-exclusive (no NLM_F_REPLACE), as BIRD retrying after lost messages.
                let e = handle.route().add(msg).execute().await.expect_err("bird: creating a route the agent holds must be refused");
                refused += 1;
                println!("RW-BIRD-REFUSED {refused} {e}");
            } else {
                handle.route().add(msg).replace().execute().await.expect("bird: route replace");
                n += 1;
                println!("RW-BIRD-WROTE {n}");
            }
            std::io::stdout().flush().unwrap();
        }
    });
}

/// Helper mode `rw-deleter` (ignored, started by [`run`]): names itself `rw-deleter`, enters
/// the node's namespace and deletes the agent's route to [`DELETED`] (protocol 80, metric 1024).
#[test]
#[ignore = "helper process of the agent_guest tests, started by them"]
fn helper_deleter() {
    let Some(netns) = helper("rw-deleter") else { return };
    runtime().block_on(async {
        let handle = netlink(&netns);
        let (dst, len) = prefix(DELETED);
        let msg = rtnetlink::RouteMessageBuilder::<Ipv4Addr>::new().destination_prefix(dst, len).priority(1024).protocol(80.into()).build();
        handle.route().del(msg).execute().await.expect("rw-deleter: route delete");
    });
}

/// In helper mode `name`: rename this process (its main thread, which `/proc/<pid>/comm`
/// shows) and the test's thread (which writes, and which fentry and kprobe see) to `name`,
/// and return the namespace to write in. `None` outside helper mode.
fn helper(name: &str) -> Option<String> {
    if std::env::var(HELPER_ENV).ok().as_deref() != Some(name) {
        eprintln!("helper {name}: not started as one ({HELPER_ENV} unset); nothing to do");
        return None;
    }
    std::fs::write("/proc/self/comm", name).expect("rename the process");
    nix::sys::prctl::set_name(&std::ffi::CString::new(name).unwrap()).expect("prctl(PR_SET_NAME)");
    Some(std::env::var(HELPER_NETNS_ENV).expect("the helper's namespace"))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// An rtnetlink handle whose socket lives in `/run/netns/<netns>`; the connection runs on this
/// (current-thread) runtime, so every write is sent from this thread.
fn netlink(netns: &str) -> rtnetlink::Handle {
    let file = std::fs::File::open(format!("/run/netns/{netns}")).expect("open the node namespace");
    nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
    let (conn, handle, _) = rtnetlink::new_connection().expect("rtnetlink");
    tokio::spawn(conn);
    handle
}

fn prefix(p: &str) -> (Ipv4Addr, u8) {
    let (a, l) = p.split_once('/').unwrap();
    (a.parse().unwrap(), l.parse().unwrap())
}

/// The release agent and the example cluster, or `None` after `SKIPPED`: not root, no ipip
/// `tunl0` (this host's kernel), or no release agent named in [`AGENT_ENV`].
fn guest_or_skip(test: &str) -> Option<(PathBuf, PathBuf)> {
    if skip_unless_root(test) {
        return None;
    }
    let ipip = {
        let _ns = NetNsGuard::new().expect("create netns");
        Command::new("ip")
            .args(["-d", "link", "show", "tunl0"])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).lines().any(|l| l.trim_start().starts_with("ipip ")))
    };
    if !ipip {
        routewarden_lab::skip(test, "no ipip tunl0 on this kernel (covered by the QEMU lane)");
        return None;
    }
    let Some(agent) = std::env::var_os(AGENT_ENV).map(PathBuf::from) else {
        routewarden_lab::skip(test, format_args!("{AGENT_ENV} does not name the release agent (the QEMU lane sets it to the one in its initramfs)"));
        return None;
    };
    let cluster = std::env::var_os(EXAMPLE_CLUSTER_ENV).map_or_else(example_dir, PathBuf::from);
    Some((agent, cluster))
}

/// node-a alone, with its addresses from the cluster and the kernel's ipip `tunl0`.
fn node_a(cluster: &Path) -> Lab {
    let snap = FileDatastore::load(cluster).unwrap();
    let node = &snap.cluster.nodes.values().find(|n| n.name.to_string() == "node-a").expect("node-a in the example cluster");
    let spec = LabSpec {
        kernel_tunnel: true,
        ..LabSpec::new(vec![LabNodeSpec { name: "node-a".into(), addresses: node.bgp_addresses().iter().map(ToString::to_string).collect() }])
    };
    Lab::build(spec).unwrap()
}

/// A child killed on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `routewarden events -o json` in node-a's namespace; every line it prints, parsed.
struct Events {
    _child: Killed,
    lines: Arc<Mutex<Vec<Value>>>,
}

impl Events {
    fn start(lab: &Lab, agent: &Path, agent_pid: u32, backend: Option<&str>) -> Events {
        let mut cmd = lab.command("node-a", &agent.to_string_lossy());
        cmd.args(["events", "-o", "json", "--agent-pid", &agent_pid.to_string(), "--window-seconds", &WINDOW_S.to_string()]);
        if let Some(b) = backend {
            cmd.args(["--route-watch-backend", b]);
        }
        let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).spawn().expect("start routewarden events");
        let stdout = child.stdout.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("routewarden events printed {line:?}, not JSON: {e}"));
                sink.lock().unwrap().push(v);
            }
        });
        Events { _child: Killed(child), lines }
    }

    /// Every event so far about `dst`, in order.
    fn of(&self, dst: &str) -> Vec<Value> {
        self.lines.lock().unwrap().iter().filter(|e| e["route"]["dst"] == dst).cloned().collect()
    }

    /// Writes of `dst` by the agent (`self`) so far.
    fn self_writes(&self, dst: &str) -> u64 {
        self.of(dst).iter().filter(|e| e["event"] == "write" && e["route"]["writer"]["class"] == "self").map(|_| 1).sum()
    }
}

/// `class:comm[pid] proto P` of a writer in the stream.
fn who(w: &Value) -> String {
    format!("{}:{}[{}] proto {}", w["class"].as_str().unwrap_or("?"), w["comm"].as_str().unwrap_or("?"), w["pid"], w["protocol"])
}

/// One event of the stream in a line that names both writers and the verdict's count.
fn summary(e: &Value) -> String {
    let r = &e["route"];
    let head = format!("{} {} by {}", e["event"].as_str().unwrap_or("?"), r["op"].as_str().unwrap_or("?"), who(&r["writer"]));
    match e["event"].as_str() {
        Some("conflict") => format!("{head} over {} ({} writes in window)", who(&e["previous"]), e["writes_in_window"]),
        Some("flap") => format!("{head} after {} ({} changes in window)", who(&e["previous"]), e["changes_in_window"]),
        Some("write-failed") => format!("{head}: {}", e["error"].as_str().unwrap_or("?")),
        Some("failing-writer") => format!("{head}: {} ({} refused in window)", e["error"].as_str().unwrap_or("?"), e["failures_in_window"]),
        _ => head,
    }
}

/// The agent started behind a gate (`sh` waiting for a line, then exec'ing it: the pid stays),
/// so that `routewarden events --agent-pid` can be attached before the agent's first write.
fn gated_agent(lab: &Lab, agent: &Path, cluster: &Path, log: &Path, backend: Option<&str>) -> (Agent, ChildStdin) {
    let mut cmd = lab.command("node-a", "sh");
    cmd.args(["-c", "read -r _ && exec \"$0\" \"$@\""])
        .arg(agent)
        .args(["run", "--node", "node-a", "--metrics-addr", &format!("127.0.0.1:{PORT}"), "--log-format", "text"])
        .args(["--route-watch-window", &WINDOW_S.to_string(), "--datastore"])
        .arg(format!("file:{}", cluster.display()));
    if let Some(b) = backend {
        cmd.args(["--route-watch-backend", b]);
    }
    let file = std::fs::File::create(log).unwrap();
    let mut child = cmd.env("RUST_LOG", "info").stdin(Stdio::piped()).stdout(file.try_clone().unwrap()).stderr(file).spawn().expect("start the agent");
    let gate = child.stdin.take().unwrap();
    (Agent::from_child(child), gate)
}

/// The lines of `out` from `marker` on (libtest may print `test <name> ... ` before it).
fn marked_lines(out: impl std::io::Read + Send + 'static, marker: &'static str) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if let Some(at) = line.find(marker) {
                if tx.send(line[at..].to_string()).is_err() {
                    break;
                }
            }
        }
    });
    rx
}

/// This test binary in helper mode `mode` (`bird`, `rw-deleter`), in node-a's namespace.
fn helper_process(lab: &Lab, test: &str, mode: &str) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--ignored", "--exact", test, "--nocapture", "--test-threads=1"]).env(HELPER_ENV, mode).env(HELPER_NETNS_ENV, lab.node_ns("node-a"));
    cmd
}

/// Series and values as [`lab_support::Metrics::family`] lists them: sorted by series.
fn sorted(series: &[(String, u64)]) -> Vec<(&str, u64)> {
    series.iter().map(|(s, v)| (s.as_str(), *v)).collect::<BTreeMap<_, _>>().into_iter().collect()
}

/// One run of the agent (see the module doc), up to its routes programmed and streamed.
struct Scenario {
    /// The backend the agent must run: the one it picks (fentry) or the one forced.
    backend: &'static str,
    agent: Agent,
    agent_pid: u32,
    log: PathBuf,
    events: Events,
    /// When the agent was let go: the window's premise is checked from here.
    started: Instant,
    lab: Lab,
    _dir: tempfile::TempDir,
}

impl Scenario {
    /// Build node-a, start the stream and then the agent (`forced`: its
    /// `--route-watch-backend`), and check its routes, backend and first writes; `None` after
    /// `SKIPPED` (see [`guest_or_skip`]).
    fn start(name: &str, forced: Option<&'static str>) -> Option<Scenario> {
        let (agent_bin, cluster) = guest_or_skip(name)?;
        let lab = node_a(&cluster);
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("agent.log");
        let (agent, mut gate) = gated_agent(&lab, &agent_bin, &cluster, &log, forced);
        let agent_pid = agent.pid();

        // The stream first; it is attached once it shows a write of the test's own.
        let events = Events::start(&lab, &agent_bin, agent_pid, forced);
        wait_for("routewarden events attached", DEADLINE, || {
            let _ = lab.ip("node-a", &["route", "replace", "192.0.2.1", "dev", "lo", "proto", "static"]);
            std::thread::sleep(Duration::from_millis(200));
            (!events.of("192.0.2.1/32").is_empty()).then_some(())
        });
        lab.ip("node-a", &["route", "del", "192.0.2.1", "dev", "lo", "proto", "static"]).unwrap();
        eprintln!("agent_guest: routewarden events attached; starting the agent (pid {agent_pid})");
        writeln!(gate, "go").unwrap();
        let scenario = Scenario { backend: forced.unwrap_or("fentry"), agent, agent_pid, log, events, started: Instant::now(), lab, _dir: dir };
        scenario.check_start();
        Some(scenario)
    }

    /// The agent's routes on the real tunl0, the backend it runs, and its writes in the stream.
    fn check_start(&self) {
        let ready = wait_ready(&self.lab, "node-a");
        // The backend sees each write's result and, beside it, the rule filter names rule
        // writers as it names route writers: the note says nothing is missing.
        assert!(ready.contains(&format!("bpf route_watch: ready\nbpf route_watch: {}: writers named by process in the kernel\n", self.backend)), "{ready}");
        assert_eq!(routes(&self.lab, "node-a", "80"), NODE_A_IPIP);
        let m = metrics(&self.lab, "node-a");
        let backends = ["fentry", "kprobe", "none", "socket-filter"]
            .map(|b| (format!("routewarden_route_watch_backend_info{{backend=\"{b}\"}}"), u64::from(b == self.backend)));
        assert_eq!(m.family("routewarden_route_watch_backend_info"), sorted(&backends), "{m}");
        // Its log says so too, and that the backend was its first choice (no fallback).
        let log = std::fs::read_to_string(&self.log).unwrap();
        let running: Vec<&str> = log.lines().filter(|l| l.contains("route watch running")).collect();
        assert!(!running.is_empty(), "{log}");
        for line in &running {
            assert!(line.contains(&format!("backend=\"{}\"", self.backend)) || line.contains(&format!("backend={} ", self.backend)), "{line}");
        }
        assert_eq!(running.iter().filter(|l| l.contains("fallbacks=[]")).count(), 1, "{log}");
        assert!(!log.contains("route-watch backend unavailable"), "{log}");
        wait_for("the stream shows the agent's seven writes", DEADLINE, || {
            (NODE_A_IPIP.iter().map(|r| r.trim_start_matches("blackhole ").split(' ').next().unwrap()).all(|dst| {
                let dst = if dst.contains('/') { dst.to_string() } else { format!("{dst}/32") };
                self.events.self_writes(&dst) == 1
            }))
            .then_some(())
        });
        eprintln!("agent_guest: the agent runs {} and programmed its routes", self.backend);
    }

    /// `bird` rewrites [`FOUGHT`] [`ROUNDS`] times, each once the agent's route is back.
    /// Returns it (still running) with its stdin and pid.
    fn fight(&self) -> (Killed, ChildStdin, u32, std::sync::mpsc::Receiver<String>) {
        let mut bird = helper_process(&self.lab, "helper_bird", "bird").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("start bird");
        let pid = bird.id();
        let mut stdin = bird.stdin.take().unwrap();
        let said = marked_lines(bird.stdout.take().unwrap(), "RW-BIRD-");
        let bird = Killed(bird);
        for round in 1..=ROUNDS {
            writeln!(stdin, "write").unwrap();
            let line = said.recv_timeout(DEADLINE).unwrap_or_else(|e| panic!("bird did not write in round {round}: {e}"));
            assert_eq!(line, format!("RW-BIRD-WROTE {round}"));
            wait_for(&format!("the agent's route to {FOUGHT} back after round {round}"), DEADLINE, || {
                (self.events.self_writes(FOUGHT) == 1 + round).then_some(())
            });
            if round < ROUNDS {
                // The rival's pace (BIRD writes again at its next kernel scan), not a wait.
                std::thread::sleep(BIRD_INTERVAL);
            }
        }
        assert_eq!(routes(&self.lab, "node-a", "80"), NODE_A_IPIP, "the agent's route is back");
        assert_eq!(self.lab.ip("node-a", &["route", "show", FOUGHT]).unwrap().trim(), "10.245.20.0/26 via 10.0.0.12 dev tunl0 proto 80 metric 1024 onlink");
        (bird, stdin, pid, said)
    }

    /// `bird`, still running, tries [`REFUSALS`] times to create [`FOUGHT`] while the agent
    /// holds it; the kernel refuses each with `EEXIST` and the agent's route stays.
    fn refuse(&self, stdin: &mut ChildStdin, said: &std::sync::mpsc::Receiver<String>) {
        for i in 1..=REFUSALS {
            writeln!(stdin, "create").unwrap();
            let line = said.recv_timeout(DEADLINE).unwrap_or_else(|e| panic!("bird did not answer create {i}: {e}"));
            assert!(line.starts_with(&format!("RW-BIRD-REFUSED {i} ")) && line.contains("File exists"), "{line}");
        }
        assert_eq!(self.lab.ip("node-a", &["route", "show", FOUGHT]).unwrap().trim(), "10.245.20.0/26 via 10.0.0.12 dev tunl0 proto 80 metric 1024 onlink");
    }

    /// The refusals, seen by the agent and the stream as one failing-writer episode naming
    /// `bird`: in `/metrics` (the episode and the three refused adds, and no write more than
    /// before), the log, and the stream (three `write-failed`, one `failing-writer`).
    fn check_failing(&self, bird_pid: u32, checked: usize) {
        let episode = (r#"routewarden_failing_writer_episodes_total{family="ipv4",writer="bird"}"#.to_string(), 1);
        let m = wait_for("the agent counts the failing writer", DEADLINE, || {
            let m = metrics(&self.lab, "node-a");
            (m.sum("routewarden_failing_writer_episodes_total") == 1 && m.sum("routewarden_route_write_failures_total") == REFUSALS).then_some(m)
        });
        assert_eq!(m.counted("routewarden_failing_writer_episodes_total"), sorted(&[episode]), "{m}");
        let refused = (r#"routewarden_route_write_failures_total{family="ipv4",op="add",writer="bird"}"#.to_string(), REFUSALS);
        assert_eq!(m.counted("routewarden_route_write_failures_total"), sorted(&[refused]), "{m}");
        assert_eq!(m.sum("routewarden_route_writes_total"), 7 + 2 * ROUNDS + 2, "a refused write is not a write: {m}");
        let log = std::fs::read_to_string(&self.log).unwrap();
        let failing: Vec<&str> = log.lines().filter(|l| l.contains("failing writer")).collect();
        assert_eq!(failing.len(), 1, "{log}");
        for want in [FOUGHT, &format!("bird(proto 12, bird[{bird_pid}])"), "EEXIST (File exists)", "failures_in_window=3"] {
            assert!(failing[0].contains(want), "{want} not in {}", failing[0]);
        }
        let b = format!("bird:bird[{bird_pid}] proto 12");
        let mut want: Vec<String> = (0..REFUSALS).map(|_| format!("write-failed add by {b}: EEXIST (File exists)")).collect();
        want.insert(3, format!("failing-writer add by {b}: EEXIST (File exists) (3 refused in window)"));
        let events = wait_for("the stream shows the refusals", DEADLINE, || {
            let of = self.events.of(FOUGHT);
            (of.len() >= checked + want.len()).then_some(of)
        });
        assert_eq!(events[checked..].iter().map(summary).collect::<Vec<_>>(), want, "events of {FOUGHT} after the fight");
        for e in events[checked..].iter().filter(|e| e["event"] == "failing-writer") {
            println!("AGENT-GUEST-EVENT {} {e}", self.backend);
        }
    }

    /// `rw-deleter` deletes [`DELETED`]; the agent puts it back. Returns the deleter's pid.
    fn delete(&self) -> u32 {
        let child = helper_process(&self.lab, "helper_deleter", "rw-deleter").stdout(Stdio::null()).spawn().expect("start rw-deleter");
        let pid = child.id();
        let mut child = Killed(child);
        let status = child.0.wait().unwrap();
        assert!(status.success(), "rw-deleter: {status}");
        wait_for(&format!("the agent's route to {DELETED} back"), DEADLINE, || {
            (self.events.self_writes(DELETED) == 2 && routes(&self.lab, "node-a", "80") == NODE_A_IPIP).then_some(())
        });
        pid
    }

    /// The stream's events naming the foreign writers, printed for the console (the lane's
    /// log), then every event of the two prefixes, exactly. Returns the class the stream gave
    /// the deleter's delete (checked last, by [`run`]).
    fn check_stream(&self, bird_pid: u32, deleter_pid: u32) -> String {
        for e in self.events.lines.lock().unwrap().iter().filter(|e| [bird_pid, deleter_pid].iter().any(|p| e["route"]["writer"]["pid"] == *p)) {
            println!("AGENT-GUEST-EVENT {} {e}", self.backend);
        }
        // The writer is the process (its leader's name), not the agent's sender thread.
        let me = format!("self:routewarden[{}] proto 80", self.agent_pid);
        let b = format!("bird:bird[{bird_pid}] proto 12");
        // Its cold start creates the route (`add`); its repairs replace bird's.
        let mut want = vec![format!("write add by {me}")];
        for round in 1..=ROUNDS {
            want.push(format!("write replace by {b}"));
            match round {
                1 => want.push(format!("conflict replace by {b} over {me} (2 writes in window)")),
                2 => want.push(format!("flap replace by {b} after {me} (3 changes in window)")),
                _ => {}
            }
            want.push(format!("write replace by {me}"));
        }
        assert_eq!(self.events.of(FOUGHT).iter().map(summary).collect::<Vec<_>>(), want, "events of {FOUGHT}");
        let of_deleted = self.events.of(DELETED);
        // The delete carries the deleted route's protocol (80).
        let class = of_deleted.get(1).and_then(|e| e["route"]["writer"]["class"].as_str()).unwrap_or("?").to_string();
        let d = format!("{class}:rw-deleter[{deleter_pid}] proto 80");
        assert_eq!(
            of_deleted.iter().map(summary).collect::<Vec<_>>(),
            [
                format!("write add by {me}"),
                format!("write delete by {d}"),
                format!("conflict delete by {d} over {me} (2 writes in window)"),
                format!("write add by {me}"),
            ],
            "events of {DELETED}"
        );
        class
    }

    /// The agent's `/metrics` and log: the same two conflicts and one flap, and every write.
    fn check_agent(&self, bird_pid: u32, deleter_pid: u32, deleter_class: &str) {
        let m = wait_for("the agent counts two conflicts", DEADLINE, || {
            let m = metrics(&self.lab, "node-a");
            (m.sum("routewarden_route_conflicts_total") == 2).then_some(m)
        });
        let took = self.started.elapsed();
        assert!(took < Duration::from_secs(WINDOW_S), "the scenario took {took:?}, longer than the window its exact counts assume");
        let conflicts = [
            (r#"routewarden_route_conflicts_total{family="ipv4",writers="self+bird"}"#.to_string(), 1),
            (format!(r#"routewarden_route_conflicts_total{{family="ipv4",writers="self+{deleter_class}"}}"#), 1),
        ];
        assert_eq!(m.counted("routewarden_route_conflicts_total"), sorted(&conflicts), "{m}");
        assert_eq!(m.counted("routewarden_route_flaps_total"), [(r#"routewarden_route_flaps_total{family="ipv4"}"#, 1)], "{m}");
        assert_eq!(m.value("routewarden_flapping_prefixes"), 2, "{m}");
        // Every write the kernel counted: the agent's seven adds, bird's replaces and the
        // agent's repairs, the delete and the agent's add back.
        let m = wait_for("the kernel's write counters read", DEADLINE, || {
            let m = metrics(&self.lab, "node-a");
            (m.sum("routewarden_route_writes_total") == 7 + 2 * ROUNDS + 2).then_some(m)
        });
        let writes = [
            (r#"routewarden_route_writes_total{family="ipv4",op="add",writer="self"}"#.to_string(), 8),
            (format!(r#"routewarden_route_writes_total{{family="ipv4",op="delete",writer="{deleter_class}"}}"#), 1),
            (r#"routewarden_route_writes_total{family="ipv4",op="replace",writer="bird"}"#.to_string(), ROUNDS),
            (r#"routewarden_route_writes_total{family="ipv4",op="replace",writer="self"}"#.to_string(), ROUNDS),
        ];
        assert_eq!(m.counted("routewarden_route_writes_total"), sorted(&writes), "{m}");
        let log = std::fs::read_to_string(&self.log).unwrap();
        let conflicts: Vec<&str> = log.lines().filter(|l| l.contains("route conflict: two writers")).collect();
        let flaps: Vec<&str> = log.lines().filter(|l| l.contains("route flap") && !l.contains("conflicts and flaps")).collect();
        assert_eq!((conflicts.len(), flaps.len()), (2, 1), "{log}");
        let bird = format!("bird(proto 12, bird[{bird_pid}])");
        assert!(conflicts[0].contains(&bird) && conflicts[0].contains(FOUGHT), "{}", conflicts[0]);
        assert!(flaps[0].contains(&bird) && flaps[0].contains(FOUGHT), "{}", flaps[0]);
        assert!(conflicts[1].contains(&format!("(proto 80, rw-deleter[{deleter_pid}])")) && conflicts[1].contains(DELETED), "{}", conflicts[1]);
        assert_eq!(routes(&self.lab, "node-a", "80"), NODE_A_IPIP);
    }

    /// Stop the agent (SIGTERM: a clean exit), then the stream, then remove node-a.
    fn stop(self) {
        let Scenario { agent, events, lab, _dir, .. } = self;
        assert!(agent.stop().success());
        drop(events);
        drop(lab);
    }
}

fn run(name: &str, forced: Option<&'static str>) {
    let Some(scenario) = Scenario::start(name, forced) else { return };
    let (bird, mut bird_stdin, bird_pid, said) = scenario.fight();
    let deleter_pid = scenario.delete();
    let deleter_class = scenario.check_stream(bird_pid, deleter_pid);
    scenario.check_agent(bird_pid, deleter_pid, &deleter_class);
    let checked = scenario.events.of(FOUGHT).len();
    scenario.refuse(&mut bird_stdin, &said);
    scenario.check_failing(bird_pid, checked);
    drop((bird_stdin, bird));
    scenario.stop();

    // The writer class of the deleter: the class comes from the process, not the route
    // protocol (a known process that is neither routewarden, calico-node nor BIRD is `other`;
    // classed by the protocol, this delete of a protocol-80 route would blame Felix).
    assert_eq!(deleter_class, "other", "class of rw-deleter's delete of a protocol-80 route");
}
