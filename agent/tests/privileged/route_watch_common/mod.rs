//! Scenarios shared by the route-watch backend tests (`route_watch_socket_filter.rs`,
//! `route_watch_fentry.rs`, `route_watch_kprobe.rs`): the same assertions for every backend,
//! each run in a fresh network namespace.
//!
//! A backend the running kernel cannot load prints `SKIPPED <test>: <why>` and returns, unless
//! `ROUTEWARDEN_REQUIRE_BACKENDS` lists it (the QEMU lane sets `fentry,kprobe,socket-filter`):
//! then failing to start is a test failure.
#![allow(dead_code, reason = "each test binary uses a subset of the scenarios")]

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::net::Ipv4Addr;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::registry::Registry;
use routewarden::bpf::route_watch::metrics_apply::writers_label;
use routewarden::bpf::route_watch::{RouteWatch, RouteWatchBackend, RouteWatchConfig, RouteWatchEvent, RouteWatchMetrics};
use routewarden::observe::metrics::Metrics;
use routewarden_common::route_watch::WriterClass;
use routewarden_lab::NetNsGuard;
use tokio::sync::mpsc;

/// Route protocol of the routewarden-like writer (classified `self` by the watch).
pub const SELF_PROTO: u8 = 80;
/// Test window: short, so "the gauge returns to 0" happens within seconds.
pub const WINDOW: Duration = Duration::from_secs(2);
/// How long a test waits for an event the kernel has already counted. The watch delivers one
/// within 200 ms plus one `/proc` round (DESIGN.md); this is a deadline for a wedged reader, not
/// a latency target (those are benchmarks: `detect-latency` in BENCHMARKS.md).
pub const EVENT_DEADLINE: Duration = Duration::from_secs(10);

/// Run `cmd args` and fail with its stderr.
pub fn sh(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("spawn {cmd}: {e}"));
    assert!(out.status.success(), "{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A child process killed on drop.
pub struct ChildGuard(pub Child);
impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A shell loop in the test's namespace (children inherit the thread's namespace).
pub fn shell_loop(script: &str) -> ChildGuard {
    ChildGuard(Command::new("sh").args(["-c", script]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("spawn sh"))
}

/// A long-lived `ip -batch -` process: one process, one netlink socket, commands fed by line.
pub struct IpBatch(ChildGuard);
impl IpBatch {
    pub fn spawn() -> IpBatch {
        IpBatch::spawn_as("ip")
    }
    /// An `ip -batch -` process run as `name` ([`routewarden_lab::program_named`]), whose
    /// `comm` is `name`.
    pub fn spawn_as(name: &str) -> IpBatch {
        let program = if name == "ip" { "ip".into() } else { routewarden_lab::program_named("ip", name) };
        let child = Command::new(program)
            .args(["-force", "-batch", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ip -batch");
        IpBatch(ChildGuard(child))
    }
    pub fn pid(&self) -> u32 {
        self.0 .0.id()
    }
    pub fn send(&mut self, line: &str) {
        let stdin = self.0 .0.stdin.as_mut().expect("stdin");
        writeln!(stdin, "{line}").expect("write to ip -batch");
        stdin.flush().expect("flush");
    }
}

/// A writer that answers: one `ip -force -batch -` process (one process and one netlink
/// socket for its life, so one writer to every backend), fed one command at a time. Each
/// command is followed by a line `ip` cannot parse; `ip` reports it on stderr, which is
/// unbuffered, as `Command failed -:<line>` after the command before it has been answered by
/// the kernel. So [`IpWriter::run`] returns once the write and the hooks it triggers have run
/// (the counters already show it), and panics with `ip`'s own message if the command failed.
pub struct IpWriter {
    child: ChildGuard,
    stdin: ChildStdin,
    stderr: std::sync::mpsc::Receiver<String>,
    lines: u32,
}

impl IpWriter {
    /// The line sent after every command: an object `ip` does not know.
    const SYNC: &'static str = "rw-sync";

    pub fn spawn() -> IpWriter {
        IpWriter::spawn_as("ip")
    }

    /// An `ip` writer run as `name` ([`routewarden_lab::program_named`]): `bird` is classed
    /// `bird`, `calico-node` `felix`.
    pub fn spawn_as(name: &str) -> IpWriter {
        let program = if name == "ip" { "ip".into() } else { routewarden_lab::program_named("ip", name) };
        let mut child = Command::new(program)
            .args(["-force", "-batch", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ip -batch");
        let stdin = child.stdin.take().expect("stdin");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        IpWriter { child: ChildGuard(child), stdin, stderr: rx, lines: 0 }
    }

    pub fn pid(&self) -> u32 {
        self.child.0.id()
    }

    /// Run `ip <cmd>` (e.g. `route replace ...`) and wait for the kernel's answer.
    pub fn run(&mut self, cmd: &str) {
        let (failed, said) = self.exchange(cmd);
        assert!(!failed, "ip {cmd}: {}", said.join(" / "));
    }

    /// Run `ip <cmd>`, which the kernel must refuse, and wait for the answer; what `ip` said
    /// about it (`RTNETLINK answers: File exists`).
    pub fn run_refused(&mut self, cmd: &str) -> String {
        let (failed, said) = self.exchange(cmd);
        assert!(failed, "ip {cmd} was expected to fail: {}", said.join(" / "));
        said.into_iter().filter(|l| l.starts_with("RTNETLINK answers")).collect::<Vec<_>>().join(" / ")
    }

    /// Send `cmd` and the sync line; whether `ip` said the command failed, and every line it
    /// said before the sync line's failure.
    fn exchange(&mut self, cmd: &str) -> (bool, Vec<String>) {
        let (cmd_line, sync_line) = (self.lines + 1, self.lines + 2);
        self.lines += 2;
        writeln!(self.stdin, "{cmd}\n{}", Self::SYNC).and_then(|()| self.stdin.flush()).unwrap_or_else(|e| panic!("ip -batch: write `{cmd}`: {e}"));
        let (failed, synced) = (format!("Command failed -:{cmd_line}"), format!("Command failed -:{sync_line}"));
        let mut said = Vec::new();
        loop {
            let line = self
                .stderr
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|e| panic!("ip -batch (pid {}) did not answer `{cmd}` in 30 s ({e}); it said {said:?}", self.pid()));
            if line == synced {
                break;
            }
            said.push(line);
        }
        (said.contains(&failed), said)
    }
}

/// Namespace with `veth0` (10.0.0.11/24, fd00::11/64) <-> `veth1` (10.0.0.12/24), both up.
pub fn lab() -> NetNsGuard {
    let ns = NetNsGuard::new().expect("netns (root needed)");
    ns.ip(&["link", "add", "veth0", "type", "veth", "peer", "name", "veth1"]).unwrap();
    ns.ip(&["addr", "add", "10.0.0.11/24", "dev", "veth0"]).unwrap();
    ns.ip(&["addr", "add", "10.0.0.12/24", "dev", "veth1"]).unwrap();
    // Keep the IPv6 address over a link down/up (S11), as a node's static address does.
    sh("sysctl", &["-qw", "net.ipv6.conf.veth0.keep_addr_on_down=1"]);
    ns.ip(&["-6", "addr", "add", "fd00::11/64", "dev", "veth0", "nodad"]).unwrap();
    ns.ip(&["link", "set", "veth0", "up"]).unwrap();
    ns.ip(&["link", "set", "veth1", "up"]).unwrap();
    ns
}

/// ifindex of `dev` in the current namespace.
pub fn ifindex(dev: &str) -> u32 {
    let out = sh("ip", &["-o", "link", "show", dev]);
    out.split(':').next().and_then(|s| s.trim().parse().ok()).expect("ifindex")
}

/// Start the forced backend or explain why this kernel cannot (returns None: skip).
pub fn start_or_skip(test: &str, backend: RouteWatchBackend, config: &RouteWatchConfig) -> Option<RouteWatch> {
    if routewarden_lab::skip_unless_root(test) {
        return None;
    }
    let Some(object) = routewarden::bpf::embedded_object() else {
        routewarden_lab::skip(test, format_args!("this test binary was built without the BPF object; `cargo xtask test` embeds it"));
        return None;
    };
    let config = RouteWatchConfig { backend: Some(backend), ..config.clone() };
    match RouteWatch::start(object, &config) {
        Ok(w) => Some(w),
        Err(e) => {
            let required = std::env::var("ROUTEWARDEN_REQUIRE_BACKENDS").unwrap_or_default();
            assert!(!required.split(',').any(|b| b == backend.label()), "{test}: backend {backend} is required here but failed: {e}");
            routewarden_lab::skip(test, format_args!("the {backend} backend cannot run on this kernel: {e}"));
            None
        }
    }
}

/// Default test config: short window, threshold 3, self protocol 80.
pub fn config() -> RouteWatchConfig {
    RouteWatchConfig { window: WINDOW, flap_threshold: 3, self_protocol: SELF_PROTO, ..RouteWatchConfig::default() }
}

/// The routewarden-like writer: an in-process rtnetlink handle writing at protocol 80.
pub struct SelfWriter {
    handle: rtnetlink::Handle,
}

impl SelfWriter {
    pub fn new() -> SelfWriter {
        let (mut conn, handle, _) = rtnetlink::new_connection().expect("rtnetlink");
        // Bound now, so `RouteWatch::refresh_self_ports` finds its port before the first write.
        rtnetlink::sys::AsyncSocket::socket_mut(conn.socket_mut()).bind_auto().expect("bind");
        tokio::spawn(conn);
        SelfWriter { handle }
    }

    pub async fn replace_v4(&self, dst: Ipv4Addr, len: u8, gw: Ipv4Addr, oif: u32) -> Result<(), rtnetlink::Error> {
        let msg = rtnetlink::RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(dst, len)
            .gateway(gw)
            .output_interface(oif)
            .priority(1024)
            .protocol(SELF_PROTO.into())
            .build();
        self.handle.route().add(msg).replace().execute().await
    }

    /// Replace `dst/len` with a route through nexthop object `id` (`--nexthop-objects`: no
    /// gateway or device in the write, the object carries them).
    pub async fn replace_v4_through(&self, dst: Ipv4Addr, len: u8, id: u32) -> Result<(), rtnetlink::Error> {
        let mut msg = rtnetlink::RouteMessageBuilder::<Ipv4Addr>::new().destination_prefix(dst, len).priority(1024).protocol(SELF_PROTO.into()).build();
        msg.attributes.push(rtnetlink::packet_route::route::RouteAttribute::NhId(id));
        self.handle.route().add(msg).replace().execute().await
    }

    /// Delete our route for `dst/len` (protocol 80, metric 1024) through the same socket, so the
    /// detector sees the writer of the route delete it (no conflict).
    pub async fn delete_v4(&self, dst: Ipv4Addr, len: u8) -> Result<(), rtnetlink::Error> {
        let msg = rtnetlink::RouteMessageBuilder::<Ipv4Addr>::new().destination_prefix(dst, len).priority(1024).protocol(SELF_PROTO.into()).build();
        self.handle.route().del(msg).execute().await
    }

    pub async fn replace_v6(&self, dst: std::net::Ipv6Addr, len: u8, gw: std::net::Ipv6Addr, oif: u32) -> Result<(), rtnetlink::Error> {
        let msg = rtnetlink::RouteMessageBuilder::<std::net::Ipv6Addr>::new()
            .destination_prefix(dst, len)
            .gateway(gw)
            .output_interface(oif)
            .priority(1024)
            .protocol(SELF_PROTO.into())
            .build();
        self.handle.route().add(msg).replace().execute().await
    }
}

/// Collected events, counters applied to a fresh metrics registry.
pub struct Harness {
    pub watch: RouteWatch,
    pub rx: mpsc::Receiver<RouteWatchEvent>,
    pub events: Vec<(Instant, RouteWatchEvent)>,
    pub metrics: Arc<Metrics>,
    pub registry: Registry,
    pub state: RouteWatchMetrics,
    /// The highest `routewarden_flapping_prefixes` seen after any event or tick.
    pub peak_flapping: i64,
}

impl Harness {
    /// Start the ring-buffer reader and the metrics state (must run inside the runtime).
    pub fn new(mut watch: RouteWatch) -> Harness {
        let (tx, rx) = mpsc::channel(65536);
        watch.spawn_reader(tx).expect("reader");
        let (registry, metrics) = Metrics::new_registry();
        let state = RouteWatchMetrics::new(watch.window());
        state.set_backend(&metrics, Some(watch.backend()));
        Harness { watch, rx, events: Vec::new(), metrics, registry, state, peak_flapping: 0 }
    }

    /// Drain pending events (waiting up to `wait` for the first) and apply counters.
    pub async fn pump(&mut self, wait: Duration) {
        let deadline = tokio::time::Instant::now() + wait;
        while let Ok(Some(ev)) = tokio::time::timeout_at(deadline, self.rx.recv()).await {
            let now = Instant::now();
            self.state.apply_event(&self.metrics, &ev, now);
            self.peak_flapping = self.peak_flapping.max(self.metrics.flapping_prefixes.get());
            self.events.push((now, ev));
        }
        let c = self.watch.counters().expect("counters");
        self.state.apply_counters(&self.metrics, &c);
        self.state.tick(&self.metrics, Instant::now());
        self.peak_flapping = self.peak_flapping.max(self.metrics.flapping_prefixes.get());
    }

    /// Pump (at least once, so the counters are applied) until `cond` holds; how long that
    /// took, or `None` after `limit`.
    pub async fn pump_until(&mut self, limit: Duration, cond: impl Fn(&Harness) -> bool) -> Option<Duration> {
        let t0 = Instant::now();
        loop {
            self.pump(Duration::from_millis(50)).await;
            if cond(self) {
                return Some(t0.elapsed());
            }
            if t0.elapsed() >= limit {
                return None;
            }
        }
    }

    /// Pump until every conflict and flap episode the kernel counted (IPv4 and IPv6) has
    /// arrived as an event (each counted episode is one ring-buffer record), within
    /// [`EVENT_DEADLINE`]. Fails if a record was lost, so the events are all there is.
    pub async fn pump_counted_episodes(&mut self, test: &str) {
        let c = self.watch.counters().expect("counters");
        assert_eq!(c.records_lost, 0, "{test}: ring-buffer records lost");
        let counted = usize::try_from(c.conflicts.iter().flatten().flatten().sum::<u64>() + c.flaps.iter().sum::<u64>()).unwrap();
        let got = self.pump_until(EVENT_DEADLINE, |h| h.conflicts().len() + h.flaps().len() >= counted).await;
        assert!(
            got.is_some(),
            "{test}: {counted} episodes counted, {} events after {EVENT_DEADLINE:?}: {:?}",
            self.conflicts().len() + self.flaps().len(),
            self.events
        );
    }

    /// The streamed writes of `dst` (a prefix as `Display` shows it), in order.
    pub fn writes_of(&self, dst: &str) -> Vec<routewarden::bpf::route_watch::RouteChange> {
        self.events
            .iter()
            .filter_map(|(_, e)| match e {
                RouteWatchEvent::Write { route } if route.dst.to_string() == dst => Some(route.clone()),
                _ => None,
            })
            .collect()
    }

    pub fn conflicts(&self) -> Vec<&RouteWatchEvent> {
        self.events.iter().map(|(_, e)| e).filter(|e| matches!(e, RouteWatchEvent::Conflict { .. })).collect()
    }

    pub fn flaps(&self) -> Vec<&RouteWatchEvent> {
        self.events.iter().map(|(_, e)| e).filter(|e| matches!(e, RouteWatchEvent::Flap { .. })).collect()
    }

    pub fn exposition(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).unwrap();
        out
    }

    /// The conflict and flap events, in the order the kernel emitted them.
    pub fn episodes(&self) -> Vec<Episode> {
        self.events.iter().filter_map(|(_, e)| Episode::of(e)).collect()
    }

    /// Every conflict and flap the exported counters hold is one event and the other way
    /// round: `routewarden_route_conflicts_total` per (family, writers) and
    /// `routewarden_route_flaps_total` per family equal the events received (call after
    /// [`Harness::pump_counted_episodes`]).
    pub fn assert_episodes_exported(&self, test: &str) {
        let mut from_events: BTreeMap<String, u64> = BTreeMap::new();
        for e in self.conflicts().into_iter().chain(self.flaps()) {
            let key = match e {
                RouteWatchEvent::Conflict { route, previous, .. } => {
                    format!(
                        r#"routewarden_route_conflicts_total{{family="{}",writers="{}"}}"#,
                        route.family,
                        writers_label(route.writer.writer_class(), previous.writer_class())
                    )
                }
                RouteWatchEvent::Flap { route, .. } => format!(r#"routewarden_route_flaps_total{{family="{}"}}"#, route.family),
                _ => unreachable!(),
            };
            *from_events.entry(key).or_default() += 1;
        }
        let expo = self.exposition();
        let exported: BTreeMap<String, u64> = expo
            .lines()
            .filter(|l| l.starts_with("routewarden_route_conflicts_total{") || l.starts_with("routewarden_route_flaps_total{"))
            .filter_map(|l| l.rsplit_once(' ').and_then(|(k, v)| Some((k.to_string(), v.parse().ok()?))))
            .filter(|(_, v)| *v > 0)
            .collect();
        assert_eq!(exported, from_events, "{test}: exported counters vs events");
    }
}

/// A conflict or flap event as the tests compare it: prefix, operation, the two writers'
/// process ids (from the hook, or resolved from the netlink port) and the count it carries
/// (writes in the window for a conflict, changes in the window for a flap).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Episode {
    Conflict { dst: String, op: &'static str, writer: Option<u32>, previous: Option<u32>, writes: u32 },
    Flap { dst: String, op: &'static str, writer: Option<u32>, previous: Option<u32>, changes: u32 },
}

impl Episode {
    fn of(e: &RouteWatchEvent) -> Option<Episode> {
        match e {
            RouteWatchEvent::Conflict { route, previous, writes_in_window } => Some(Episode::Conflict {
                dst: route.dst.to_string(),
                op: route.op,
                writer: route.writer.pid,
                previous: previous.pid,
                writes: *writes_in_window,
            }),
            RouteWatchEvent::Flap { route, previous, changes_in_window } => {
                Some(Episode::Flap { dst: route.dst.to_string(), op: route.op, writer: route.writer.pid, previous: previous.pid, changes: *changes_in_window })
            }
            _ => None,
        }
    }
}

/// `n` lines of an `ip -batch` file.
fn batch_lines(n: u32, line: impl Fn(u32) -> String) -> String {
    (0..n).map(|i| line(i) + "\n").collect()
}

/// Run `lines` through one `ip -batch -` process (one writer to every backend) and wait for
/// it; fails with `ip`'s stderr.
pub fn ip_batch(lines: &str) {
    let mut child = Command::new("ip").args(["-batch", "-"]).stdin(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn ip -batch");
    child.stdin.take().expect("stdin").write_all(lines.as_bytes()).expect("write to ip -batch");
    let out = child.wait_with_output().expect("ip -batch");
    assert!(out.status.success(), "ip -batch: {}", String::from_utf8_lossy(&out.stderr));
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

fn gw(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

/// Wait until the flapping gauge is 0 (bounded by `limit`); returns how long it took.
async fn gauge_clears(h: &mut Harness, limit: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        h.pump(Duration::from_millis(200)).await;
        if h.metrics.flapping_prefixes.get() == 0 {
            return Some(t0.elapsed());
        }
    }
    None
}

/// Scenario: routewarden (proto 80, in-process netlink) and a shell loop running
/// `ip route replace ... proto 12` fight over 10.244.20.0/26 at metric 1024 for 3 s. A conflict
/// naming both writers is reported, the fight is a flap too, and the flapping gauge, which
/// counts this one prefix, goes to exactly 1 and returns to 0 after the fight stops. How many
/// episodes the fight makes depends on how the two loops interleave; the detector's rule bounds
/// it (at most one conflict and one flap episode per prefix per window, so episodes of a kind
/// are at least a window apart), and every episode the kernel counts is one event and one
/// step of the exported counters. `route_detector.rs` has the exact counts of scripted fights.
pub fn fight(test: &str, backend: RouteWatchBackend) {
    fight_with(test, backend, false);
}

/// [`fight`] with routewarden's route written through a nexthop object of its own
/// (`--nexthop-objects`): the write carries only the object's id, and the fight is still one
/// conflict and one flap with both writers named.
pub fn fight_through_nexthop(test: &str, backend: RouteWatchBackend) {
    fight_with(test, backend, true);
}

/// The nexthop object id of [`fight_through_nexthop`] (in routewarden's range).
const NHID: u32 = 0x5257_0001;

fn fight_with(test: &str, backend: RouteWatchBackend, through_nexthop: bool) {
    if routewarden_lab::skip_unless_root(test) {
        return;
    }
    let ns = lab();
    let Some(watch) = start_or_skip(test, backend, &config()) else { return };
    if through_nexthop {
        sh("ip", &["nexthop", "add", "id", &NHID.to_string(), "via", "10.0.0.14", "dev", "veth0", "onlink", "proto", "80"]);
    }
    runtime().block_on(async {
        let mut h = Harness::new(watch);
        let me = SelfWriter::new();
        // Its socket is new: tell the watch it is this process's (socket-filter backend).
        h.watch.refresh_self_ports().expect("self ports");
        let oif = ifindex("veth0");
        let write = || async {
            if through_nexthop {
                me.replace_v4_through(gw("10.244.20.0"), 26, NHID).await
            } else {
                me.replace_v4(gw("10.244.20.0"), 26, gw("10.0.0.12"), oif).await
            }
        };
        write().await.unwrap();
        if through_nexthop {
            let shown = sh("ip", &["route", "show", "10.244.20.0/26"]);
            assert!(shown.contains(&format!("nhid {NHID} ")), "{test}: our route goes through the object: {shown}");
        }
        h.pump(Duration::from_millis(100)).await;
        let started = Instant::now();
        // BIRD-like: `ip` run as `bird` (the class is the process's).
        let bird = routewarden_lab::program_named("ip", "bird");
        let fighter =
            shell_loop(&format!("while :; do {} route replace 10.244.20.0/26 via 10.0.0.13 dev veth0 proto 12 metric 1024; sleep 0.2; done", bird.display()));
        while started.elapsed() < Duration::from_secs(3) {
            write().await.unwrap();
            h.pump(Duration::from_millis(150)).await;
        }
        drop(fighter);
        // The first conflict is counted in the kernel during the fight; wait for its event.
        let waited = h.pump_until(EVENT_DEADLINE, |h| !h.conflicts().is_empty()).await;
        assert!(waited.is_some(), "{test}: no conflict {EVENT_DEADLINE:?} after a 3 s fight; events {:?}", h.events);
        h.pump_counted_episodes(test).await;
        // Every write of the fight was made before now (the loop's last `ip` ends within
        // milliseconds of the kill): an upper bound of the span the episodes lie in.
        let span = started.elapsed();
        let latency = h.events.iter().find(|(_, e)| matches!(e, RouteWatchEvent::Conflict { .. })).map(|(t, _)| t.duration_since(started)).unwrap();
        let RouteWatchEvent::Conflict { route, previous, .. } = h.conflicts()[0] else { unreachable!() };
        assert_eq!(route.dst.to_string(), "10.244.20.0/26");
        assert_eq!((route.table, route.metric), (254, 1024));
        let protos: HashSet<u8> = [route.writer.protocol, previous.protocol].into();
        assert_eq!(protos, HashSet::from([SELF_PROTO, 12]), "{test}: both writers named: {route:?} over {previous:?}");
        let classes: HashSet<&str> = [route.writer.class, previous.class].into();
        assert_eq!(classes, HashSet::from(["self", "bird"]));
        // Every backend names both processes in the kernel (the socket filter from the task
        // that sent the request).
        let bird_writer = if route.writer.protocol == 12 { &route.writer } else { previous };
        assert_eq!((bird_writer.comm.as_deref(), bird_writer.class_inferred), (Some("bird"), false), "{test}: process name from the kernel");
        let me_writer = if route.writer.protocol == 12 { previous } else { &route.writer };
        assert_eq!(
            (me_writer.pid, me_writer.netlink_port, me_writer.class_inferred),
            (Some(std::process::id()), None, false),
            "{test}: our pid from the kernel"
        );
        // Each side writes every 150-200 ms: three changes fall in the first window, a flap.
        assert!(!h.flaps().is_empty(), "{test}: the fight is a flap too: {:?}", h.events);
        let at_most = 1 + usize::try_from(span.as_nanos() / WINDOW.as_nanos()).unwrap();
        assert!(
            h.conflicts().len() <= at_most,
            "{test}: {} conflict episodes in {span:?}, at most one per {WINDOW:?}: {:?}",
            h.conflicts().len(),
            h.conflicts()
        );
        assert!(h.flaps().len() <= at_most, "{test}: {} flap episodes in {span:?}, at most one per {WINDOW:?}: {:?}", h.flaps().len(), h.flaps());
        h.assert_episodes_exported(test);
        let expo = h.exposition();
        assert!(
            expo.lines().any(|l| l.strip_prefix(r#"routewarden_route_conflicts_total{family="ipv4",writers="self+bird"} "#).is_some_and(|v| v != "0")),
            "{expo}"
        );
        assert_eq!(h.peak_flapping, 1, "{test}: one prefix fought over, one flapping prefix");
        let cleared = gauge_clears(&mut h, WINDOW * 3).await;
        assert!(cleared.is_some(), "{test}: flapping gauge still {} after the fight stopped", h.metrics.flapping_prefixes.get());
        eprintln!(
            "{test}: conflict after {latency:?}; {} conflict and {} flap episodes in {span:?}; gauge back to 0 {cleared:?} after the fight stopped",
            h.conflicts().len(),
            h.flaps().len()
        );
    });
    drop(ns);
}

/// Scenario S01: two long-lived processes, same protocol 12, overwrite each other's route for
/// 10.244.30.0/26: eight rounds of A then B, each write answered by the kernel before the next
/// ([`IpWriter`]); then B stops and A writes once more, all of it within one window.
/// The detector's rules (`ebpf/src/route_detector.rs`) give the exact outcome: the first write
/// creates the prefix's state; each later one overwrites the other writer's route within the
/// window (a conflict, one episode per prefix per window: reported at write 1, with 2 writes in
/// the window, `bird+bird`) and changes the prefix (other writer, other gateway: the third
/// change, write 3, is the one flap; later changes add none). The gauge counts this one prefix
/// and returns to 0; A's route stays.
pub fn s01(test: &str, backend: RouteWatchBackend) {
    if routewarden_lab::skip_unless_root(test) {
        return;
    }
    let ns = lab();
    let Some(watch) = start_or_skip(test, backend, &config()) else { return };
    runtime().block_on(async {
        let mut h = Harness::new(watch);
        // Both BIRD-like: `ip` run as `bird`.
        let mut a = IpWriter::spawn_as("bird");
        let mut b = IpWriter::spawn_as("bird");
        let started = Instant::now();
        for _ in 0..8 {
            a.run("route replace 10.244.30.0/26 via 10.0.0.12 dev veth0 proto 12 metric 1024");
            b.run("route replace 10.244.30.0/26 via 10.0.0.13 dev veth0 proto 12 metric 1024");
        }
        // B stops writing (its process stays until its events are in: the socket filter
        // names a writer by its netlink port, resolved to the process through /proc). A is the
        // survivor: its next export stands.
        a.run("route replace 10.244.30.0/26 via 10.0.0.12 dev veth0 proto 12 metric 1024");
        let span = started.elapsed();
        assert!(span < WINDOW, "{test}: the 17 writes took {span:?}, not within one window ({WINDOW:?}): the counts below assume they fit");
        let c = h.watch.counters().unwrap();
        assert_eq!(c.writes[0].iter().flatten().sum::<u64>(), 17, "{test}: every write seen (each one changes the route)");
        assert_eq!(c.conflicts[0][WriterClass::Bird as usize][WriterClass::Bird as usize], 1, "{test}: {:?}", c.conflicts[0]);
        assert_eq!(c.conflicts.iter().flatten().flatten().sum::<u64>(), 1, "{test}: one conflict episode in one window");
        assert_eq!(c.flaps, [1, 0], "{test}: one flap episode in one window");
        h.pump_counted_episodes(test).await;
        let dst = "10.244.30.0/26".to_string();
        let want = vec![
            Episode::Conflict { dst: dst.clone(), op: "replace", writer: Some(b.pid()), previous: Some(a.pid()), writes: 2 },
            Episode::Flap { dst, op: "replace", writer: Some(b.pid()), previous: Some(a.pid()), changes: 3 },
        ];
        assert_eq!(h.episodes(), want, "{test}: {:?}", h.events);
        drop(b);
        let RouteWatchEvent::Conflict { route, previous, .. } = h.conflicts()[0] else { unreachable!() };
        assert_eq!((route.writer.protocol, previous.protocol), (12, 12));
        assert!(!route.writer.same_identity(previous), "{test}: two distinct writers: {route:?} / {previous:?}");
        h.assert_episodes_exported(test);
        assert!(h.exposition().contains(r#"routewarden_route_conflicts_total{family="ipv4",writers="bird+bird"} 1"#));
        assert_eq!(h.peak_flapping, 1, "{test}: one prefix in conflict");
        let cleared = gauge_clears(&mut h, WINDOW * 3).await;
        assert!(cleared.is_some(), "{test}: gauge did not clear after one writer stopped");
        let routes = sh("ip", &["route", "show", "10.244.30.0/26"]);
        assert!(routes.contains("via 10.0.0.12") && routes.contains("proto bird"), "{test}: A's route stays: {routes}");
        drop(a);
    });
    drop(ns);
}

/// Scenario S11: `ip link set veth0 down; up` flushes the routes via veth0 (IPv4 silently,
/// IPv6 with notifications); routewarden re-adds them. Reported as flushes, never as a
/// conflict or flap.
pub fn s11(test: &str, backend: RouteWatchBackend) {
    if routewarden_lab::skip_unless_root(test) {
        return;
    }
    let ns = lab();
    let Some(watch) = start_or_skip(test, backend, &config()) else { return };
    runtime().block_on(async {
        let mut h = Harness::new(watch);
        let me = SelfWriter::new();
        // Its socket is new: tell the watch it is this process's (socket-filter backend).
        h.watch.refresh_self_ports().expect("self ports");
        let oif = ifindex("veth0");
        let v4 = [gw("10.244.20.0"), gw("10.244.30.0"), gw("10.244.40.0")];
        let v6: std::net::Ipv6Addr = "fd00:244:20::".parse().unwrap();
        let v6gw: std::net::Ipv6Addr = "fd00::12".parse().unwrap();
        let install = || async {
            for d in v4 {
                me.replace_v4(d, 26, gw("10.0.0.12"), oif).await?;
            }
            me.replace_v6(v6, 122, v6gw, oif).await
        };
        install().await.unwrap();
        h.pump(Duration::from_millis(200)).await;
        for _ in 0..2 {
            sh("ip", &["link", "set", "veth0", "down"]);
            h.pump(Duration::from_millis(300)).await;
            sh("ip", &["link", "set", "veth0", "up"]);
            // Re-install as soon as the kernel accepts the gateways again (S11: within 1 s).
            let t0 = Instant::now();
            while let Err(e) = install().await {
                assert!(t0.elapsed() < Duration::from_secs(5), "{test}: cannot re-install after link up: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            h.pump(Duration::from_millis(300)).await;
        }
        h.pump(Duration::from_millis(300)).await;
        let c = h.watch.counters().unwrap();
        assert!(h.conflicts().is_empty(), "{test}: a flush is not a conflict: {:?}", h.conflicts());
        assert!(h.flaps().is_empty(), "{test}: a flush is not a flap: {:?}", h.flaps());
        assert_eq!(h.metrics.flapping_prefixes.get(), 0);
        assert_eq!(h.peak_flapping, 0, "{test}: never a flapping prefix");
        // Lower bounds: the link's own routes (connected, local, link-local, multicast) are
        // flushed and re-added by the kernel too, as many as this kernel makes. The exact
        // count for routes of ours alone is `route_detector.rs`'s link-flush test.
        assert!(c.flushes[1] >= 2, "{test}: IPv6 flushes counted (kernel deletes): {:?}", c.flushes);
        if backend == RouteWatchBackend::SocketFilter {
            assert!(c.flushes[0] >= 6, "{test}: IPv4 silent flushes revealed by the re-adds: {:?}", c.flushes);
            let link_downs = h.events.iter().filter(|(_, e)| matches!(e, RouteWatchEvent::LinkDown { ifindex, .. } if *ifindex == oif)).count();
            assert_eq!(link_downs, 2, "{test}: one link-down event per down: {:?}", h.events);
        }
        let expo = h.exposition();
        assert!(expo.lines().any(|l| l.strip_prefix(r#"routewarden_route_flushes_total{family="ipv6"} "#).is_some_and(|v| v != "0")), "{expo}");
        assert!(expo.lines().filter(|l| l.starts_with("routewarden_route_conflicts_total{")).all(|l| l.ends_with(" 0")), "{expo}");
        eprintln!("{test}: flushes ipv4 {} ipv6 {}, no conflict, no flap", c.flushes[0], c.flushes[1]);
    });
    drop(ns);
}

/// Scenario: a cold start of 10,000 routes (one `ip -batch` writer) raises neither flap nor
/// conflict; every write is counted. Prints the measured write rate.
pub fn cold_start(test: &str, backend: RouteWatchBackend) {
    if routewarden_lab::skip_unless_root(test) {
        return;
    }
    let ns = lab();
    let Some(watch) = start_or_skip(test, backend, &config()) else { return };
    runtime().block_on(async {
        let mut h = Harness::new(watch);
        let dir = std::env::temp_dir().join(format!("rw-cold-{}-{}", std::process::id(), backend.label()));
        // 10,000 distinct /24s: 10.100.0.0/24 .. 10.139.15.0/24.
        let batch = batch_lines(10_000, |i| format!("route add 10.{}.{}.0/24 via 10.0.0.12 dev veth0 proto 80 metric 1024", 100 + i / 256, i % 256));
        std::fs::write(&dir, batch).unwrap();
        let before = h.watch.counters().unwrap();
        let t0 = Instant::now();
        sh("ip", &["-batch", dir.to_str().unwrap()]);
        let took = t0.elapsed();
        let _ = std::fs::remove_file(&dir);
        h.pump(Duration::from_millis(500)).await;
        let c = h.watch.counters().unwrap();
        let adds = c.writes[0][0].iter().sum::<u64>() - before.writes[0][0].iter().sum::<u64>();
        assert_eq!(adds, 10_000, "{test}: every add counted");
        assert!(h.conflicts().is_empty() && h.flaps().is_empty(), "{test}: cold start is neither: {:?}", &h.events[..h.events.len().min(5)]);
        assert_eq!(c.flaps, [0, 0]);
        assert_eq!(c.conflicts.iter().flatten().flatten().sum::<u64>(), 0);
        assert_eq!(h.metrics.flapping_prefixes.get(), 0);
        let rate = 10_000.0 / took.as_secs_f64();
        eprintln!("{test}: 10,000 route adds in {took:?} ({rate:.0} writes/s through the detector), no flap, no conflict");
    });
    drop(ns);
}

/// Scenario: with write streaming on and a one-page ring buffer nobody reads, records that
/// do not fit are counted as lost (and exported), not dropped silently; what was kept plus
/// what was lost accounts for every record.
pub fn ring_overflow(test: &str, backend: RouteWatchBackend) {
    if routewarden_lab::skip_unless_root(test) {
        return;
    }
    let ns = lab();
    let cfg = RouteWatchConfig { stream_writes: true, ring_buffer_bytes: Some(4096), ..config() };
    let Some(mut watch) = start_or_skip(test, backend, &cfg) else { return };
    let dir = std::env::temp_dir().join(format!("rw-ring-{}-{}", std::process::id(), backend.label()));
    let batch = batch_lines(300, |i| format!("route add 10.200.{}.{}/32 dev veth0 proto 80", i / 256, i % 256));
    std::fs::write(&dir, batch).unwrap();
    sh("ip", &["-batch", dir.to_str().unwrap()]);
    let _ = std::fs::remove_file(&dir);
    runtime().block_on(async {
        let c = watch.counters().unwrap();
        assert!(c.records_lost > 0, "{test}: overflow must be counted: {c:?}");
        let (tx, mut rx) = mpsc::channel(65536);
        watch.spawn_reader(tx).unwrap();
        let mut kept = 0u64;
        let mut writes = 0u64;
        while let Ok(Some(ev)) = tokio::time::timeout(Duration::from_millis(500), rx.recv()).await {
            kept += 1;
            if matches!(ev, RouteWatchEvent::Write { ref route } if route.writer.protocol == SELF_PROTO) {
                writes += 1;
            }
        }
        let c = watch.counters().unwrap();
        let total: u64 = c.writes.iter().flatten().flatten().sum();
        assert!(kept + c.records_lost >= 300, "{test}: kept {kept} + lost {} < 300 writes", c.records_lost);
        assert!(kept + c.records_lost <= total + 8, "{test}: kept {kept} + lost {} vs {total} writes", c.records_lost);
        assert!(writes > 0 && writes < 300, "{test}: some records kept, the rest lost: {writes}");
        let (registry, metrics) = Metrics::new_registry();
        let mut state = RouteWatchMetrics::new(WINDOW);
        state.apply_counters(&metrics, &c);
        let mut expo = String::new();
        prometheus_client::encoding::text::encode(&mut expo, &registry).unwrap();
        assert!(expo.contains(&format!("routewarden_route_watch_events_lost_total {}", c.records_lost)), "{expo}");
        eprintln!("{test}: ring of 4096 bytes kept {kept} records, counted {} lost", c.records_lost);
    });
    drop(ns);
}

/// A `tracing` writer into a shared buffer, to read the log lines a test caused.
#[derive(Clone, Default)]
pub struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// Everything captured.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// The captured lines of target `bpf`.
    pub fn bpf_lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap()).lines().filter(|l| l.contains(" bpf: ")).map(str::to_owned).collect()
    }
}

/// Whether `net.core.optmem_max` is a per-namespace setting here (Linux >= 6.9, the same
/// release that raised its default from 20 KiB to 128 KiB), so a test may lower it in its own
/// namespace without touching the machine's.
fn optmem_max_is_per_netns() -> bool {
    let release = sh("uname", &["-r"]);
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit()).filter_map(|p| p.parse::<u32>().ok());
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (6, 9)
}

/// Scenario (aya-log): the ring overflow of [`ring_overflow`] with
/// `--bpf-log-level warn` reaches the log as the kernel's exact line, once per second per CPU
/// at most however many records are lost; with the level `off` (the default) the same
/// overflow writes no line at all.
///
/// Socket-filter backend: a socket filter is charged to the socket's option memory, and the
/// program with logging (about 30 KB) is larger than `net.core.optmem_max` allows before
/// Linux 6.9 (20 KiB). There the watch must still run, without kernel logs, and say so in one
/// warning. Where the limit is per namespace the test also lowers it to 20 KiB in its own
/// namespace, so both paths run on every kernel.
pub fn ring_full_is_logged(test: &str, backend: RouteWatchBackend) {
    use routewarden::bpf::bpf_log::BpfLogLevel;
    if routewarden_lab::skip_unless_root(test) {
        return;
    }
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let mut cases = vec![(BpfLogLevel::Warn, None), (BpfLogLevel::Off, None)];
    if backend == RouteWatchBackend::SocketFilter && optmem_max_is_per_netns() {
        cases.push((BpfLogLevel::Warn, Some(20_480u32)));
    }
    for (level, optmem_max) in cases {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber =
            tracing_subscriber::fmt().with_writer(move || writer.clone()).with_ansi(false).without_time().with_max_level(tracing::Level::DEBUG).finish();
        let run = tracing::subscriber::with_default(subscriber, || {
            let ns = lab();
            if let Some(bytes) = optmem_max {
                sh("sysctl", &["-qw", &format!("net.core.optmem_max={bytes}")]);
            }
            // Before 6.9 the setting is global and not visible from other namespaces.
            let limit = std::fs::read_to_string("/proc/sys/net/core/optmem_max").map_or_else(|_| "unknown".to_owned(), |s| s.trim().to_owned());
            let cfg = RouteWatchConfig { stream_writes: true, ring_buffer_bytes: Some(4096), log_level: level, ..config() };
            let watch = start_or_skip(test, backend, &cfg)?;
            let effective = watch.log_level();
            let file = std::env::temp_dir().join(format!("rw-ringlog-{}-{}", std::process::id(), backend.label()));
            std::fs::write(&file, batch_lines(300, |i| format!("route add 10.201.{}.{}/32 dev veth0 proto 80", i / 256, i % 256))).unwrap();
            sh("ip", &["-batch", file.to_str().unwrap()]);
            let _ = std::fs::remove_file(&file);
            let lost = watch.counters().unwrap().records_lost;
            // The forwarder polls every 250 ms; give it a few rounds, then stop it (drop).
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while effective != BpfLogLevel::Off && captured.bpf_lines().is_empty() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            std::thread::sleep(Duration::from_millis(600));
            drop(watch);
            drop(ns);
            Some((lost, effective, limit))
        });
        let Some((lost, effective, limit)) = run else { return };
        assert!(lost > 0, "{test}: the one-page ring must overflow");
        let lines = captured.bpf_lines();
        eprintln!("{test}: level {level:?} (in effect {effective:?}, optmem_max {limit}): {lost} records lost, {} bpf line(s): {lines:?}", lines.len());
        if level == BpfLogLevel::Off {
            assert_eq!(effective, BpfLogLevel::Off, "{test}");
            assert_eq!(lines, Vec::<String>::new(), "{test}: nothing is logged with the level off");
            continue;
        }
        let fallback = "route watch: the socket-filter program with kernel logs is larger than this kernel lets a socket hold (net.core.optmem_max); running it without kernel logs";
        if optmem_max.is_some() {
            assert_eq!(effective, BpfLogLevel::Off, "{test}: with optmem_max {limit} the logging program cannot attach");
        }
        if effective == BpfLogLevel::Off {
            assert_eq!(backend, RouteWatchBackend::SocketFilter, "{test}: only a socket filter is limited by optmem_max");
            let log = captured.text();
            let said: Vec<&str> = log.lines().filter(|l| l.contains(fallback)).collect();
            assert_eq!(said.len(), 1, "{test}: one warning says the watch runs without kernel logs: {log}");
            assert!(said[0].contains("requested=Warn") && said[0].contains(&format!("optmem_max={limit}")), "{test}: {}", said[0]);
            assert!(said[0].contains("Cannot allocate memory (os error 12)"), "{test}: the errno is in the warning: {}", said[0]);
            assert_eq!(lines, Vec::<String>::new(), "{test}: no kernel log line without the logging program");
            eprintln!("{test}: optmem_max {limit} is too small for the logging socket filter here; the watch ran without kernel logs, as it must");
            continue;
        }
        let want = r#" WARN bpf: route watch: ring buffer full, record lost (kind 0); userspace is not keeping up watch="route-watch" module="routewarden_ebpf::route_detector""#;
        assert!(!lines.is_empty() && lines.len() <= cpus, "{test}: one line per CPU at most for a burst under a second: {lines:?}");
        for l in &lines {
            assert_eq!(l.trim_start(), want.trim_start(), "{test}");
        }
    }
}

/// Scenario: one process (`ip -batch`) writes an IPv6 route through a nexthop object
/// (`ip -6 nexthop`, `nhid`) and replaces it in place four times. Every write shows the
/// gateway and device this backend can see — the socket filter the object's, from the
/// notification (`nexthop_compat_mode`, on by default), fentry and kprobe none (the route has
/// no `fib6_nh` of its own, and the hooks do not follow the object: as IPv4's `fib_config`,
/// only its id is the route's) — and the same route written again by the same writer changes
/// nothing: no flap, no conflict.
pub fn v6_through_nexthop_rewritten(test: &str, backend: RouteWatchBackend) {
    if routewarden_lab::skip_unless_root(test) {
        return;
    }
    let ns = lab();
    let Some(watch) = start_or_skip(test, backend, &RouteWatchConfig { stream_writes: true, ..config() }) else { return };
    sh("ip", &["-6", "nexthop", "add", "id", "7001", "via", "fd00::12", "dev", "veth0", "proto", "12"]);
    let dst = "fd00:10:244:20::/122";
    runtime().block_on(async {
        let mut h = Harness::new(watch);
        ip_batch(&batch_lines(5, |_| format!("route replace {dst} nhid 7001 proto 12 metric 1024")));
        let waited = h.pump_until(EVENT_DEADLINE, |h| h.writes_of(dst).len() >= 5).await;
        assert!(waited.is_some(), "{test}: 5 writes of {dst} expected: {:?}", h.events);
        h.pump(Duration::from_millis(200)).await;
        let (gateway, oif) = match backend {
            RouteWatchBackend::SocketFilter => (Some("fd00::12".parse().unwrap()), ifindex("veth0")),
            RouteWatchBackend::Fentry | RouteWatchBackend::Kprobe => (None, 0),
        };
        let seen = h.writes_of(dst);
        assert_eq!(seen.len(), 5, "{test}: {seen:?}");
        for w in &seen {
            assert_eq!((w.gateway, w.oif, w.nexthop_id, w.metric, w.writer.protocol), (gateway, oif, Some(7001), 1024, 12), "{test}: {w:?}");
        }
        assert!(h.flaps().is_empty() && h.conflicts().is_empty(), "{test}: one writer rewriting one route: {:?}", h.episodes());
        let c = h.watch.counters().unwrap();
        assert_eq!((c.flaps, c.decode_errors), ([0, 0], 0), "{test}: {c:?}");
    });
    drop(ns);
}

/// Scenario: one process (`ip -batch`) writes one IPv4 and one IPv6 route six times each,
/// alternating between two nexthop objects that have the same gateway and device (7101/7102,
/// 7201/7202). Nothing but the object's id tells the writes apart (the socket filter sees the
/// objects' gateway and device, identical; fentry and kprobe see neither), and a route
/// re-pointed between objects five times is a flap like one re-pointed between gateways: each
/// write after the first changes the route, the third change (the fourth write) crosses the
/// threshold of 3, one flap episode per prefix in the window, no conflict (one writer).
pub fn switching_nexthop_objects_is_a_flap(test: &str, backend: RouteWatchBackend) {
    if routewarden_lab::skip_unless_root(test) {
        return;
    }
    let ns = lab();
    let Some(watch) = start_or_skip(test, backend, &RouteWatchConfig { stream_writes: true, ..config() }) else { return };
    for id in ["7101", "7102"] {
        sh("ip", &["nexthop", "add", "id", id, "via", "10.0.0.12", "dev", "veth0", "proto", "12"]);
    }
    for id in ["7201", "7202"] {
        sh("ip", &["-6", "nexthop", "add", "id", id, "via", "fd00::12", "dev", "veth0", "proto", "12"]);
    }
    let (v4, v6) = ("10.244.21.0/26", "fd00:10:244:21::/122");
    runtime().block_on(async {
        let mut h = Harness::new(watch);
        let lines = batch_lines(12, |i| {
            let (dst, base) = if i % 2 == 0 { (v4, 7101) } else { (v6, 7201) };
            format!("route replace {dst} nhid {} proto 12 metric 1024", base + (i / 2) % 2)
        });
        let started = Instant::now();
        ip_batch(&lines);
        let span = started.elapsed();
        assert!(span < WINDOW, "{test}: the 12 writes took {span:?}, not within one window ({WINDOW:?})");
        let waited = h.pump_until(EVENT_DEADLINE, |h| h.writes_of(v4).len() >= 6 && h.writes_of(v6).len() >= 6 && h.flaps().len() >= 2).await;
        assert!(waited.is_some(), "{test}: 6 writes of each prefix and 2 flaps expected: {:?}", h.events);
        h.pump_counted_episodes(test).await;
        h.pump(Duration::from_millis(200)).await;
        let oif = ifindex("veth0");
        for (dst, base, gateway) in [(v4, 7101, "10.0.0.12"), (v6, 7201, "fd00::12")] {
            let (gateway, oif) = match backend {
                RouteWatchBackend::SocketFilter => (Some(gateway.parse().unwrap()), oif),
                RouteWatchBackend::Fentry | RouteWatchBackend::Kprobe => (None, 0),
            };
            let seen: Vec<_> = h.writes_of(dst).iter().map(|w| (w.op, w.nexthop_id, w.gateway, w.oif, w.metric, w.writer.protocol)).collect();
            // The first write creates the route: the kernel's notification says so (socket
            // filter), the request the hooks see carries `ip route replace`'s NLM_F_REPLACE.
            let first = if backend == RouteWatchBackend::SocketFilter { "add" } else { "replace" };
            let expected: Vec<_> = (0..6).map(|i| (if i == 0 { first } else { "replace" }, Some(base + i % 2), gateway, oif, 1024, 12)).collect();
            assert_eq!(seen, expected, "{test}: {dst}");
        }
        let me = |e: &RouteWatchEvent| match e {
            RouteWatchEvent::Flap { route, previous, changes_in_window } => {
                (route.dst.to_string(), route.nexthop_id, route.writer.pid == previous.pid, *changes_in_window)
            }
            other => panic!("{other:?}"),
        };
        let flaps: Vec<_> = h.flaps().into_iter().map(me).collect();
        assert_eq!(flaps, [(v4.to_string(), Some(7102), true, 3), (v6.to_string(), Some(7202), true, 3)], "{test}: {:?}", h.events);
        assert!(h.conflicts().is_empty(), "{test}: one writer: {:?}", h.episodes());
        let c = h.watch.counters().unwrap();
        assert_eq!((c.flaps, c.decode_errors, c.records_lost), ([1, 1], 0, 0), "{test}: {c:?}");
        h.assert_episodes_exported(test);
    });
    drop(ns);
}

/// Scenario: a nexthop replace is not a route write, on every backend. One process
/// ([`IpWriter`]) writes three IPv4 routes through object 7301 and three IPv6 routes through
/// 7401; other processes then re-point both objects four times (gateway .13, .12, .13, .12),
/// as a node moving back and forth would, the first process rewriting one IPv6 route as it is
/// after each; it finally re-points one IPv4 route to object 7302. fentry and kprobe see no
/// route write in a nexthop replace; the kernel re-sends every route through the object to
/// the socket filter (compat mode, the replacing process's port), and the filter drops those
/// re-sent routes. A route through an object is the object's whatever its gateway: the
/// rewrites change nothing. So every backend counts exactly the 11 route writes, all by one
/// writer: no conflict, no flap.
pub fn a_nexthop_replace_is_not_a_route_write(test: &str, backend: RouteWatchBackend) {
    if routewarden_lab::skip_unless_root(test) {
        return;
    }
    let ns = lab();
    assert_eq!(sh("sysctl", &["-n", "net.ipv4.nexthop_compat_mode"]).trim(), "1", "{test}: the kernel re-sends routes only in compat mode");
    let Some(watch) = start_or_skip(test, backend, &RouteWatchConfig { stream_writes: true, ..config() }) else { return };
    for id in ["7301", "7302"] {
        sh("ip", &["nexthop", "add", "id", id, "via", "10.0.0.12", "dev", "veth0", "proto", "12"]);
    }
    sh("ip", &["-6", "nexthop", "add", "id", "7401", "via", "fd00::12", "dev", "veth0", "proto", "12"]);
    let v4 = ["10.244.22.0/26", "10.244.22.64/26", "10.244.22.128/26"];
    let v6 = ["fd00:10:244:22::/122", "fd00:10:244:23::/122", "fd00:10:244:24::/122"];
    runtime().block_on(async {
        let mut h = Harness::new(watch);
        let mut writer = IpWriter::spawn_as("bird");
        for dst in v4 {
            writer.run(&format!("route add {dst} nhid 7301 proto 12 metric 1024"));
        }
        for dst in v6 {
            writer.run(&format!("route add {dst} nhid 7401 proto 12 metric 1024"));
        }
        for last in [13, 12, 13, 12] {
            sh("ip", &["nexthop", "replace", "id", "7301", "via", &format!("10.0.0.{last}"), "dev", "veth0", "proto", "12"]);
            sh("ip", &["-6", "nexthop", "replace", "id", "7401", "via", &format!("fd00::{last}"), "dev", "veth0", "proto", "12"]);
            // The same route again (IPv6 notifies an identical replace): the object's new
            // gateway in the notification is no change of the route.
            writer.run(&format!("route replace {} nhid 7401 proto 12 metric 1024", v6[0]));
        }
        // Through another object: IPv4 answers a replace with an identical route without a
        // write or a notification (`fib_table_insert`).
        writer.run(&format!("route replace {} nhid 7302 proto 12 metric 1024", v4[0]));
        let ours = |h: &Harness| -> Vec<(String, &'static str, Option<u32>)> {
            h.events
                .iter()
                .filter_map(|(_, e)| match e {
                    RouteWatchEvent::Write { route } if route.writer.protocol == 12 => Some((route.dst.to_string(), route.op, route.nexthop_id)),
                    _ => None,
                })
                .collect()
        };
        let waited = h.pump_until(EVENT_DEADLINE, |h| ours(h).len() >= 11).await;
        assert!(waited.is_some(), "{test}: 11 writes expected: {:?}", h.events);
        h.pump_counted_episodes(test).await;
        h.pump(Duration::from_millis(300)).await;
        let mut expected: Vec<_> = v4.iter().map(|d| (d.to_string(), "add", Some(7301))).collect();
        expected.extend(v6.iter().map(|d| (d.to_string(), "add", Some(7401))));
        expected.extend((0..4).map(|_| (v6[0].to_string(), "replace", Some(7401))));
        expected.push((v4[0].to_string(), "replace", Some(7302)));
        assert_eq!(ours(&h), expected, "{test}: the route writes, and nothing from the 8 nexthop replaces");
        assert!(h.episodes().is_empty(), "{test}: one writer of every route: {:?}", h.episodes());
        let c = h.watch.counters().unwrap();
        // Protocol 12's writes (the kernel adds link-local routes of its own meanwhile).
        let per_family: Vec<u64> = c.writes.iter().map(|f| f.iter().map(|op| op[WriterClass::Bird as usize]).sum()).collect();
        assert_eq!((per_family, c.flaps, c.decode_errors), (vec![4, 7], [0, 0], 0), "{test}: {c:?}");
        drop(writer);
    });
    drop(ns);
}

/// The writers of [`writers_named_by_process`], each one process for its life.
struct NamedWriters {
    felix: IpWriter,
    deleter: IpWriter,
    bird: IpWriter,
}

/// Scenario: every writer is named by its process and classed by it, not by the route it
/// touched. In one window, a process named `calico-node` adds 10.244.40.0/26 at protocol 80
/// (`felix`); a process named `rw-deleter` deletes it (a protocol-80 route, but `other`: one
/// conflict, `felix+other`); a process named `bird` adds 10.244.41.0/26 at protocol 12
/// (`bird`); this process adds 10.244.42.0/26 at protocol 80 (`self`). Each of the four
/// writes is one event with the writer's pid and `comm`, and one count of
/// `routewarden_route_writes_total` under its class; no IPv4 write is counted otherwise.
///
/// `task_senders` false (socket filter naming senders by port): the kernel cannot name the
/// three `ip` processes, so it counts their writes under the protocol's class (`felix` for the
/// delete too) and as unattributed (3, exactly); user space then names the long-lived processes
/// through `/proc` and decides their events' class from the process.
pub fn writers_named_by_process(test: &str, backend: RouteWatchBackend, task_senders: bool) {
    if routewarden_lab::skip_unless_root(test) {
        return;
    }
    let ns = lab();
    let cfg = RouteWatchConfig { stream_writes: true, task_senders, ..config() };
    let Some(watch) = start_or_skip(test, backend, &cfg) else { return };
    let (p_felix, p_bird, p_self) = ("10.244.40.0/26", "10.244.41.0/26", "10.244.42.0/26");
    runtime().block_on(async {
        let mut h = Harness::new(watch);
        let me = SelfWriter::new();
        h.watch.refresh_self_ports().expect("self ports");
        let mut w = NamedWriters { felix: IpWriter::spawn_as("calico-node"), deleter: IpWriter::spawn_as("rw-deleter"), bird: IpWriter::spawn_as("bird") };
        let started = Instant::now();
        w.felix.run(&format!("route add {p_felix} via 10.0.0.12 dev veth0 proto 80 metric 1024"));
        w.deleter.run(&format!("route del {p_felix} proto 80 metric 1024"));
        w.bird.run(&format!("route add {p_bird} via 10.0.0.12 dev veth0 proto 12 metric 1024"));
        me.replace_v4(gw("10.244.42.0"), 26, gw("10.0.0.12"), ifindex("veth0")).await.unwrap();
        assert!(started.elapsed() < WINDOW, "{test}: the writes took {:?}, longer than the window", started.elapsed());
        let seen = |h: &Harness| h.writes_of(p_felix).len() + h.writes_of(p_bird).len() + h.writes_of(p_self).len();
        assert!(h.pump_until(EVENT_DEADLINE, |h| seen(h) >= 4).await.is_some(), "{test}: 4 writes expected: {:?}", h.events);
        h.pump_counted_episodes(test).await;
        h.pump(Duration::from_millis(300)).await;
        let who = |r: &routewarden::bpf::route_watch::RouteChange| {
            (r.op, r.writer.protocol, r.writer.class, r.writer.class_inferred, r.writer.pid, r.writer.comm.clone())
        };
        let named = |name: &str| Some(name.to_owned());
        let felix = h.writes_of(p_felix);
        assert_eq!(
            felix.iter().map(who).collect::<Vec<_>>(),
            [
                ("add", 80, "felix", false, Some(w.felix.pid()), named("calico-node")),
                ("delete", 80, "other", false, Some(w.deleter.pid()), named("rw-deleter")),
            ],
            "{test}: a program deleting a protocol-80 route is not Felix"
        );
        assert_eq!(h.writes_of(p_bird).iter().map(who).collect::<Vec<_>>(), [("add", 12, "bird", false, Some(w.bird.pid()), named("bird"))], "{test}");
        let mine = h.writes_of(p_self);
        assert_eq!(
            (mine.len(), mine[0].writer.class, mine[0].writer.pid, mine[0].writer.class_inferred),
            (1, "self", Some(std::process::id()), false),
            "{test}: {mine:?}"
        );
        // The process's name (its thread group leader's), not the writing thread's.
        let comm = std::fs::read_to_string("/proc/self/comm").unwrap();
        assert_eq!(mine[0].writer.comm.as_deref(), Some(comm.trim()), "{test}: {mine:?}");
        assert!(!felix[1].to_string().contains("inferred"), "{test}: {}", felix[1]);
        let port = felix[1].writer.netlink_port.map(|p| format!(", port {p}")).unwrap_or_default();
        assert_eq!(felix[1].writer.netlink_port.is_some(), !task_senders, "{test}: the port is known only when the task is not");
        assert!(felix[1].to_string().ends_with(&format!("by other(proto 80, rw-deleter[{}]{port})", w.deleter.pid())), "{test}: {}", felix[1]);
        // The conflict is the deleter's over Felix's route.
        let RouteWatchEvent::Conflict { route, previous, .. } = h.conflicts()[0] else { unreachable!() };
        assert_eq!(
            (h.conflicts().len(), route.writer.class, previous.class, route.writer.comm.as_deref()),
            (1, "other", "felix", Some("rw-deleter")),
            "{test}"
        );
        // The kernel's counters: the class is decided before counting.
        let (delete_class, unattributed) = if task_senders { ("other", 0) } else { ("felix", 3) };
        let c = h.watch.counters().unwrap();
        assert_eq!(c.unattributed, [unattributed, 0], "{test}: writes counted without a process");
        let expo = h.exposition();
        let mut writes: Vec<&str> = expo.lines().filter(|l| l.starts_with(r#"routewarden_route_writes_total{family="ipv4""#) && !l.ends_with(" 0")).collect();
        writes.sort_unstable();
        // A replace that created the route: the notification says add (EXCL|CREATE), the
        // hooks see the request's NLM_F_REPLACE.
        let self_op = if backend == RouteWatchBackend::SocketFilter { "add" } else { "replace" };
        let mut want = vec![
            r#"routewarden_route_writes_total{family="ipv4",op="add",writer="bird"} 1"#.to_owned(),
            r#"routewarden_route_writes_total{family="ipv4",op="add",writer="felix"} 1"#.to_owned(),
            format!(r#"routewarden_route_writes_total{{family="ipv4",op="{self_op}",writer="self"}} 1"#),
            format!(r#"routewarden_route_writes_total{{family="ipv4",op="delete",writer="{delete_class}"}} 1"#),
        ];
        want.sort_unstable();
        assert_eq!(writes, want, "{test}: {expo}");
        let unattributed_line = format!(r#"routewarden_route_writes_unattributed_total{{family="ipv4"}} {unattributed}"#);
        // Exported from the start (at 0 until a write is counted without a process).
        assert!(expo.lines().any(|l| l == unattributed_line), "{test}: {expo}");
        eprintln!("{test}: {} / {} / {} / {}", felix[0], felix[1], h.writes_of(p_bird)[0], mine[0]);
        drop(w);
    });
    drop(ns);
}

/// The non-zero series of `names` in `expo`, sorted; the kernel's own writes left out (the
/// lab's link-local IPv6 routes appear once duplicate address detection ends, at a time of
/// the kernel's choosing).
fn nonzero_series(expo: &str, names: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = expo
        .lines()
        .filter(|l| names.iter().any(|n| l.starts_with(&format!("{n}{{")) && !l.ends_with(" 0")) && !l.contains(r#"writer="kernel""#))
        .map(str::to_owned)
        .collect();
    out.sort_unstable();
    out
}

/// The series [`failing_writer`] checks.
const FAILING_SERIES: [&str; 4] = [
    "routewarden_route_write_failures_total",
    "routewarden_failing_writer_episodes_total",
    "routewarden_route_writes_total",
    "routewarden_route_flushes_total",
];

/// The failing-writer events received.
fn failing_events(h: &Harness) -> Vec<RouteWatchEvent> {
    h.events.iter().map(|(_, e)| e).filter(|e| matches!(e, RouteWatchEvent::FailingWriter { .. })).cloned().collect()
}

/// A failing-writer event as [`failing_writer`] compares it.
#[derive(Debug, PartialEq, Eq)]
struct Failing {
    dst: String,
    family: &'static str,
    op: &'static str,
    errno: u16,
    failures: u32,
    pid: Option<u32>,
    comm: Option<String>,
    class: &'static str,
    protocol: u8,
}

/// fentry and kprobe: one episode per prefix, the refused writes counted apart.
async fn refused_writes_seen(test: &str, h: &mut Harness, bird: u32, (held, absent, held6): (&str, &str, &str)) {
    assert!(h.pump_until(EVENT_DEADLINE, |h| failing_events(h).len() >= 3).await.is_some(), "{test}: 3 failing writers expected: {:?}", h.events);
    h.pump(Duration::from_millis(500)).await;
    let got: Vec<Failing> = failing_events(h)
        .iter()
        .map(|e| {
            let RouteWatchEvent::FailingWriter { route, error, failures_in_window } = e else { unreachable!() };
            Failing {
                dst: route.dst.to_string(),
                family: route.family,
                op: route.op,
                errno: error.errno,
                failures: *failures_in_window,
                pid: route.writer.pid,
                comm: route.writer.comm.clone(),
                class: route.writer.class,
                protocol: route.writer.protocol,
            }
        })
        .collect();
    let want = |dst: &str, family, op, errno| Failing {
        dst: dst.to_owned(),
        family,
        op,
        errno,
        failures: 3,
        pid: Some(bird),
        comm: Some("bird".to_owned()),
        class: "bird",
        protocol: 12,
    };
    assert_eq!(got, [want(held, "ipv4", "add", 17), want(absent, "ipv4", "delete", 3), want(held6, "ipv6", "add", 17)], "{test}: {:?}", h.events);
    for e in failing_events(h) {
        eprintln!("{test}: events line: {}", serde_json::to_string(&e).unwrap());
        eprintln!("{test}: events text: {e}");
    }
    assert_eq!(
        nonzero_series(&h.exposition(), &FAILING_SERIES),
        [
            r#"routewarden_failing_writer_episodes_total{family="ipv4",writer="bird"} 2"#,
            r#"routewarden_failing_writer_episodes_total{family="ipv6",writer="bird"} 1"#,
            r#"routewarden_route_write_failures_total{family="ipv4",op="add",writer="bird"} 5"#,
            r#"routewarden_route_write_failures_total{family="ipv4",op="delete",writer="bird"} 4"#,
            r#"routewarden_route_write_failures_total{family="ipv6",op="add",writer="bird"} 3"#,
            r#"routewarden_route_writes_total{family="ipv4",op="add",writer="felix"} 1"#,
            r#"routewarden_route_writes_total{family="ipv6",op="add",writer="felix"} 1"#,
        ],
        "{test}"
    );
    let note = routewarden::bpf::watch::Watch::note(&h.watch).unwrap_or_default();
    assert!(!note.contains("outcomes not visible"), "{test}: {note}");
}

/// The socket filter: the two writes that succeeded, nothing of the refused ones, and a note
/// that says so.
async fn refused_writes_unseen(test: &str, h: &mut Harness) {
    assert!(
        h.pump_until(EVENT_DEADLINE, |h| h.watch.counters().is_ok_and(|c| c.writes.iter().flatten().flatten().sum::<u64>() >= 2)).await.is_some(),
        "{test}"
    );
    h.pump(Duration::from_millis(500)).await;
    assert_eq!(failing_events(h).len(), 0, "{test}: {:?}", h.events);
    assert_eq!(
        nonzero_series(&h.exposition(), &FAILING_SERIES),
        [
            r#"routewarden_route_writes_total{family="ipv4",op="add",writer="felix"} 1"#,
            r#"routewarden_route_writes_total{family="ipv6",op="add",writer="felix"} 1"#
        ],
        "{test}"
    );
    let note = routewarden::bpf::watch::Watch::note(&h.watch).unwrap_or_default();
    assert!(note.contains("route write outcomes not visible"), "{test}: {note}");
}

/// Scenario (Calico#10585: BIRD looping on "File exists", never converging): a writer that
/// keeps failing. One `ip -force -batch` process named `bird` retries a create-exclusive of
/// an IPv4 route that `calico-node` holds 5 times, deletes an absent IPv4 route 4 times, and
/// retries an IPv6 create-exclusive 3 times, within one window. fentry (fexit) and kprobe
/// (kretprobe) see each result: exactly one `failing-writer` event per prefix (threshold 3; at
/// most one per prefix per window) naming the process, its errno and 3 refusals; every refused
/// write in `routewarden_route_write_failures_total` by family, operation and class, and none of
/// them counted as a write, a flush, a conflict or a flap (observing at entry counted each
/// refused add as an add that revealed a flush). The socket filter sees only the two writes
/// that succeeded, and its note says refused writes are not visible.
pub fn failing_writer(test: &str, backend: RouteWatchBackend) {
    if routewarden_lab::skip_unless_root(test) {
        return;
    }
    let ns = lab();
    // A longer window than the other scenarios': twelve answered writes under TCG.
    let cfg = RouteWatchConfig { window: Duration::from_secs(10), failing_threshold: 3, ..config() };
    let Some(watch) = start_or_skip(test, backend, &cfg) else { return };
    let (held, absent, held6) = ("10.244.50.0/26", "10.244.51.0/26", "fd00:10:244:50::/122");
    runtime().block_on(async {
        let mut h = Harness::new(watch);
        let mut felix = IpWriter::spawn_as("calico-node");
        let mut bird = IpWriter::spawn_as("bird");
        felix.run(&format!("route add {held} via 10.0.0.12 dev veth0 proto 80 metric 1024"));
        felix.run(&format!("route add {held6} via fd00::12 dev veth0 proto 80 metric 1024"));
        let started = Instant::now();
        let mut said = Vec::new();
        for _ in 0..5 {
            said.push(bird.run_refused(&format!("route add {held} via 10.0.0.12 dev veth0 proto 12 metric 1024")));
        }
        for _ in 0..4 {
            said.push(bird.run_refused(&format!("route del {absent} proto 12 metric 1024")));
        }
        for _ in 0..3 {
            said.push(bird.run_refused(&format!("route add {held6} via fd00::12 dev veth0 proto 12 metric 1024")));
        }
        assert!(started.elapsed() < cfg.window, "{test}: the refused writes took {:?}, longer than the window", started.elapsed());
        let (exists, no_such) = ("RTNETLINK answers: File exists", "RTNETLINK answers: No such process");
        assert_eq!(said, [[exists; 5].as_slice(), &[no_such; 4], &[exists; 3]].concat(), "{test}: what ip was told");
        if backend.sees_outcomes() {
            refused_writes_seen(test, &mut h, bird.pid(), (held, absent, held6)).await;
        } else {
            refused_writes_unseen(test, &mut h).await;
        }
        let c = h.watch.counters().unwrap();
        assert_eq!((c.flushes, c.flaps, c.conflicts.iter().flatten().flatten().sum::<u64>(), c.records_lost), ([0, 0], [0, 0], 0, 0), "{test}");
        drop((felix, bird));
    });
    drop(ns);
}

/// Scenario: policy rule writes on every backend, named by process. `ip` adds
/// `from all lookup 48 priority 100` and a process named `networkd` deletes it (as
/// systemd-networkd removes foreign rules, kube-router#1815): two `RuleChange` events with
/// their writers, and `routewarden_rule_writes_total` counts both. fentry and kprobe hook no rule
/// function; the socket filter beside them on the rule groups sees them, so the note never says
/// rule writes are not watched.
pub fn rule_writes_named(test: &str, backend: RouteWatchBackend) {
    use routewarden::bpf::watch::Watch as _;
    if routewarden_lab::skip_unless_root(test) {
        return;
    }
    let ns = lab();
    let Some(watch) = start_or_skip(test, backend, &config()) else { return };
    runtime().block_on(async {
        let mut h = Harness::new(watch);
        let mut adder = IpWriter::spawn();
        let mut networkd = IpWriter::spawn_as("networkd");
        adder.run("rule add from all lookup 48 priority 100");
        networkd.run("rule del from all lookup 48 priority 100");
        let rules = |h: &Harness| -> Vec<routewarden::bpf::route_watch::RuleChange> {
            h.events
                .iter()
                .filter_map(|(_, e)| match e {
                    RouteWatchEvent::RuleChange { rule } => Some(rule.clone()),
                    _ => None,
                })
                .collect()
        };
        assert!(h.pump_until(EVENT_DEADLINE, |h| rules(h).len() >= 2).await.is_some(), "{test}: 2 rule changes expected: {:?}", h.events);
        h.pump(Duration::from_millis(300)).await;
        let got: Vec<_> = rules(&h).iter().map(|r| (r.family, r.op, r.table, r.priority, r.writer.class, r.writer.pid, r.writer.comm.clone())).collect();
        assert_eq!(
            got,
            [
                ("ipv4", "add", 48, 100, "other", Some(adder.pid()), Some("ip".to_owned())),
                ("ipv4", "delete", 48, 100, "other", Some(networkd.pid()), Some("networkd".to_owned())),
            ],
            "{test}"
        );
        assert_eq!(
            nonzero_series(&h.exposition(), &["routewarden_rule_writes_total"]),
            [
                r#"routewarden_rule_writes_total{family="ipv4",op="add",writer="other"} 1"#,
                r#"routewarden_rule_writes_total{family="ipv4",op="delete",writer="other"} 1"#
            ],
            "{test}"
        );
        let note = h.watch.note().unwrap_or_default();
        assert!(!note.contains("not watched"), "{test}: {note}");
        eprintln!("{test}: {} / {} ({note})", rules(&h)[0], rules(&h)[1]);
        drop((adder, networkd));
    });
    drop(ns);
}
