//! The in-kernel route-churn detector (`ebpf/src/route_detector.rs`) replaying scripted write
//! sequences, with the exact conflict and flap events and counters its rules give, on every
//! backend: the socket filter on this host, fentry and kprobe in the QEMU lane (which requires
//! all three; elsewhere a backend the running kernel cannot load prints `SKIPPED`).
//!
//! The rules, as `route_detector.rs` states them (window W = [`WINDOW`], threshold [`T`]):
//! - R1, cold start: the first write of a prefix since the watch started, or since the LRU map
//!   evicted its state, creates the state; it is neither a conflict nor a change.
//! - R2, conflict: a replace or delete by a writer other than the prefix's last one, within W
//!   of the prefix's last write. One episode (event and counter) per prefix per W: once one is
//!   reported, the next is reported only when W has passed since it.
//! - R3, change and flap: a replace that changes the attributes or the writer, or a re-add
//!   after a writer's delete, is a change. Changes are counted per window: a window ends at the
//!   first write more than W after it began, and that write begins the next. The T-th change
//!   of a window is a flap; one flap episode per prefix per W.
//! - R4, flush: a removal the kernel made itself (IPv6, link down), or a plain add of a prefix
//!   believed present at the same metric (IPv4 removes a downed link's routes without a
//!   notification; the add reveals it), is a flush, never a change or a conflict. A re-add
//!   after the kernel's removal is recovery: neither a change nor another flush.
//!
//! The writers are long-lived `ip -batch` processes ([`IpWriter`]) run under the names the
//! watch classes by: A, `calico-node`, writes at protocol 80 (the watch's own protocol, but
//! another process: `felix`, not `self`), B, `bird`, at 12 (`bird`), each via its own gateway. Every write
//! is answered by the kernel before the next one is sent and the hooks run inside the write,
//! so the counters are compared exactly after every step; events come through the ring buffer
//! and the attribution thread, and each test waits for as many as the kernel counted, then
//! compares them in order. Sequences the expectations assume to lie within one window are
//! timed, and the test fails if one did not.

mod route_watch_common;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use aya::maps::MapType;
use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;
use route_watch_common::{config, ifindex, lab, runtime, sh, start_or_skip, Episode, Harness, IpWriter, EVENT_DEADLINE, SELF_PROTO, WINDOW};
use routewarden::bpf::route_watch::{RouteWatch, RouteWatchBackend, RouteWatchConfig, RouteWatchEvent};
use routewarden_common::route_watch::{PrefixKey, PrefixState, RouteWatchCounters, ROUTE_WATCH_STATE_MAP};
use routewarden_lab::NetNsGuard;

/// The flap threshold of [`config`].
const T: u32 = 3;
/// A pause longer than the window: after it, every prefix's last write, window start and last
/// episode are more than W old.
const GAP: Duration = Duration::from_millis(2_500);
const _: () = assert!(GAP.as_millis() > WINDOW.as_millis());

/// IPv4 counters of the detector, as differences from when the script started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Tally {
    /// Writes seen (every operation and writer class).
    writes: u64,
    /// Conflict episodes (every pair of writer classes).
    conflicts: u64,
    /// Flap episodes.
    flaps: u64,
    /// Flushes.
    flushes: u64,
}

impl Tally {
    fn of(c: &RouteWatchCounters) -> Tally {
        Tally { writes: c.writes[0].iter().flatten().sum(), conflicts: c.conflicts[0].iter().flatten().sum(), flaps: c.flaps[0], flushes: c.flushes[0] }
    }
}

/// The rules' expectation, checked against the counters after each step.
struct Steps<'a> {
    test: &'a str,
    base: Tally,
    want: Tally,
}

impl<'a> Steps<'a> {
    fn new(test: &'a str, h: &Harness) -> Steps<'a> {
        Steps { test, base: Tally::of(&h.watch.counters().expect("counters")), want: Tally::default() }
    }

    fn check(&self, h: &Harness, step: &str) {
        let c = h.watch.counters().expect("counters");
        let now = Tally::of(&c);
        let got = Tally {
            writes: now.writes - self.base.writes,
            conflicts: now.conflicts - self.base.conflicts,
            flaps: now.flaps - self.base.flaps,
            flushes: now.flushes - self.base.flushes,
        };
        assert_eq!(got, self.want, "{}: IPv4 counters after {step}", self.test);
        assert_eq!((c.records_lost, c.decode_errors), (0, 0), "{}: records lost, decode errors after {step}", self.test);
        // The lab's own IPv6 routes (link-local, multicast) come and go, but none is a
        // conflict or a change.
        assert_eq!(c.conflicts[1].iter().flatten().sum::<u64>(), 0, "{}: IPv6 conflicts after {step}", self.test);
        assert_eq!(c.flaps[1], 0, "{}: IPv6 flaps after {step}", self.test);
    }
}

/// Writer A (`calico-node`, protocol 80, via 10.0.0.12) or B (`bird`, protocol 12, via
/// 10.0.0.13).
struct Writer {
    ip: IpWriter,
    /// The process id, as events carry it.
    pid: Option<u32>,
    proto: u8,
    gw: &'static str,
}

impl Writer {
    fn a() -> Writer {
        Writer::new("calico-node", SELF_PROTO, "10.0.0.12")
    }

    fn b() -> Writer {
        Writer::new("bird", 12, "10.0.0.13")
    }

    fn new(name: &str, proto: u8, gw: &'static str) -> Writer {
        let ip = IpWriter::spawn_as(name);
        Writer { pid: Some(ip.pid()), ip, proto, gw }
    }

    fn replace(&mut self, p: &str) {
        let gw = self.gw;
        self.replace_via(p, gw);
    }

    fn replace_via(&mut self, p: &str, gw: &str) {
        self.ip.run(&format!("route replace {p} via {gw} dev veth0 proto {} metric 1024", self.proto));
    }

    fn add(&mut self, p: &str) {
        self.ip.run(&format!("route add {p} via {} dev veth0 proto {} metric 1024", self.gw, self.proto));
    }
}

/// Fail unless what started at `started` lies within one window.
fn within_window(test: &str, what: &str, started: Instant) {
    let took = started.elapsed();
    assert!(took < WINDOW, "{test}: {what} took {took:?}, longer than the window ({WINDOW:?}) the expected counts assume");
}

/// The lab (after `prepare`), then the forced backend; `None` when the test is skipped.
fn setup(test: &str, backend: RouteWatchBackend, cfg: &RouteWatchConfig, prepare: impl FnOnce(&NetNsGuard)) -> Option<(NetNsGuard, RouteWatch)> {
    if routewarden_lab::skip_unless_root(test) {
        return None;
    }
    assert_eq!(cfg.flap_threshold, T);
    let ns = lab();
    prepare(&ns);
    let watch = start_or_skip(test, backend, cfg)?;
    Some((ns, watch))
}

/// N alternations of A and B within one window, N = 1, 2, T and 6, each on a prefix of its
/// own. Write 0 (A) creates the prefix's state (R1). Every later write overwrites the other
/// writer's route within W: a conflict (R2), reported for write 1 only, with 2 writes in the
/// window; and a change (R3: other writer, other gateway), so write T is the one flap and the
/// writes past it add no second flap in the window.
fn alternating_writers(test: &str, backend: RouteWatchBackend) {
    let Some((ns, watch)) = setup(test, backend, &config(), |_| {}) else { return };
    runtime().block_on(async {
        let mut h = Harness::new(watch);
        let (mut a, mut b) = (Writer::a(), Writer::b());
        let mut steps = Steps::new(test, &h);
        let mut want = Vec::new();
        for (n, p) in [(1, "10.244.1.0/26"), (2, "10.244.2.0/26"), (T, "10.244.3.0/26"), (6, "10.244.4.0/26")] {
            let started = Instant::now();
            for i in 0..=n {
                let w = if i % 2 == 0 { &mut a } else { &mut b };
                w.replace(p);
                steps.want.writes += 1;
                steps.want.conflicts += u64::from(i == 1);
                steps.want.flaps += u64::from(i == T);
                steps.check(&h, &format!("{p}: write {i} of {n} alternations"));
            }
            within_window(test, &format!("{n} alternations on {p}"), started);
            want.push(Episode::Conflict { dst: p.into(), op: "replace", writer: b.pid, previous: a.pid, writes: 2 });
            if n >= T {
                // Write T = 3 is B's (odd), over A's.
                want.push(Episode::Flap { dst: p.into(), op: "replace", writer: b.pid, previous: a.pid, changes: T });
            }
        }
        h.pump_counted_episodes(test).await;
        assert_eq!(h.episodes(), want, "{test}: {:#?}", h.events);
        h.assert_episodes_exported(test);
        let expo = h.exposition();
        assert!(expo.contains(r#"routewarden_route_conflicts_total{family="ipv4",writers="felix+bird"} 4"#), "{expo}");
        assert!(expo.contains(r#"routewarden_route_flaps_total{family="ipv4"} 2"#), "{expo}");
        // The four prefixes' episodes arrive within the gauge's hold of each other.
        assert_eq!(h.peak_flapping, 4, "{test}: four prefixes in conflict");
        eprintln!("{test}: {} writes, 4 conflict and 2 flap episodes, as the rules say", steps.want.writes);
    });
    drop(ns);
}

/// One writer alone. On P1, A writes the same route 5 times: after R1, a replace by the last
/// writer with the same attributes is neither a change (R3) nor a conflict (R2). The socket
/// filter does not even see it: the kernel sends no notification for a replace that changes
/// nothing (toolchain.md), while fentry and kprobe see every call. On P2, A moves its route
/// between two gateways T + 2 times: each move is a change (R3) and never a conflict (same
/// writer), the T-th is the one flap.
fn same_writer(test: &str, backend: RouteWatchBackend) {
    let Some((ns, watch)) = setup(test, backend, &config(), |_| {}) else { return };
    runtime().block_on(async {
        let mut h = Harness::new(watch);
        let mut a = Writer::a();
        let mut steps = Steps::new(test, &h);
        let (p1, p2) = ("10.244.11.0/26", "10.244.12.0/26");
        for i in 0..5 {
            a.replace(p1);
            steps.want.writes += if backend == RouteWatchBackend::SocketFilter { u64::from(i == 0) } else { 1 };
            steps.check(&h, &format!("{p1}: write {i} of the same route"));
        }
        let started = Instant::now();
        for i in 0..=T + 2 {
            a.replace_via(p2, if i % 2 == 0 { "10.0.0.12" } else { "10.0.0.13" });
            steps.want.writes += 1;
            steps.want.flaps += u64::from(i == T);
            steps.check(&h, &format!("{p2}: move {i}"));
        }
        within_window(test, &format!("{} moves of {p2}", T + 3), started);
        h.pump_counted_episodes(test).await;
        let want = vec![Episode::Flap { dst: p2.into(), op: "replace", writer: a.pid, previous: a.pid, changes: T }];
        assert_eq!(h.episodes(), want, "{test}: {:#?}", h.events);
        h.assert_episodes_exported(test);
        assert_eq!(h.peak_flapping, 1, "{test}: one flapping prefix");
        eprintln!("{test}: {} writes seen, no conflict, one flap", steps.want.writes);
    });
    drop(ns);
}

/// T times within one window, B deletes A's route and A adds it back. R2: a delete by another
/// writer is a conflict, reported for the first. R3: a delete is no change, each re-add after a
/// writer's delete is one, and the T-th re-add is the flap. The delete names protocol 80 (the
/// socket filter reports a delete with the deleted route's protocol, fentry/kprobe with the
/// request's), but the class is the deleting process's: B is `bird`, on every backend, and
/// the conflict is `felix+bird`, not `felix+felix`.
fn delete_and_readd(test: &str, backend: RouteWatchBackend) {
    let Some((ns, watch)) = setup(test, backend, &config(), |_| {}) else { return };
    runtime().block_on(async {
        let mut h = Harness::new(watch);
        let (mut a, mut b) = (Writer::a(), Writer::b());
        let mut steps = Steps::new(test, &h);
        let p = "10.244.21.0/26";
        let started = Instant::now();
        a.replace(p);
        steps.want.writes += 1;
        steps.check(&h, "A's first write");
        for k in 1..=T {
            b.ip.run(&format!("route del {p} proto {SELF_PROTO} metric 1024"));
            steps.want.writes += 1;
            steps.want.conflicts += u64::from(k == 1);
            steps.check(&h, &format!("B's delete {k}"));
            a.add(p);
            steps.want.writes += 1;
            steps.want.flaps += u64::from(k == T);
            steps.check(&h, &format!("A's re-add {k}"));
        }
        within_window(test, "the deletes and re-adds", started);
        h.pump_counted_episodes(test).await;
        let want = vec![
            Episode::Conflict { dst: p.into(), op: "delete", writer: b.pid, previous: a.pid, writes: 2 },
            Episode::Flap { dst: p.into(), op: "add", writer: a.pid, previous: b.pid, changes: T },
        ];
        assert_eq!(h.episodes(), want, "{test}: {:#?}", h.events);
        h.assert_episodes_exported(test);
        let expo = h.exposition();
        assert!(expo.contains(r#"routewarden_route_conflicts_total{family="ipv4",writers="felix+bird"} 1"#), "{expo}");
        assert_eq!(h.peak_flapping, 1, "{test}: one flapping prefix");
    });
    drop(ns);
}

/// R4 on a link of its own, `rw0`, with no IPv4 address (so the kernel adds and removes no
/// IPv4 route of its own there; its peer has IPv6 off). A adds P4 (IPv4) and P6 (IPv6) via
/// rw0; then M = 2 times the link goes down and up and A adds both back. Per cycle: IPv4
/// removes P4 without a notification and A's plain add of a prefix the detector believes
/// present, at the same metric, is one flush; IPv6 removes P6 with a kernel-made delete, one
/// flush, and A's re-add is recovery. No conflict, no change, no flap. Write streaming is on,
/// to see each flush with its prefix: the IPv6 counter also holds the link's own link-local and
/// multicast routes, as many as the kernel makes. The socket filter also reports each time the
/// link goes down (fentry and kprobe hook only the FIB functions).
fn link_flush(test: &str, backend: RouteWatchBackend) {
    const M: usize = 2;
    let cfg = RouteWatchConfig { stream_writes: true, ..config() };
    let prepare = |ns: &NetNsGuard| {
        ns.ip(&["link", "add", "rw0", "type", "veth", "peer", "name", "rw1"]).unwrap();
        sh("sysctl", &["-qw", "net.ipv6.conf.rw1.disable_ipv6=1"]);
        ns.ip(&["link", "set", "rw0", "up"]).unwrap();
        ns.ip(&["link", "set", "rw1", "up"]).unwrap();
    };
    let Some((ns, watch)) = setup(test, backend, &cfg, prepare) else { return };
    runtime().block_on(async {
        let mut h = Harness::new(watch);
        let mut a = Writer::a();
        let mut steps = Steps::new(test, &h);
        let (p4, p6) = ("10.244.31.0/26", "fd00:244:31::/122");
        let add = |a: &mut Writer, p: &str| a.ip.run(&format!("route add {p} dev rw0 proto {SELF_PROTO} metric 1024"));
        add(&mut a, p4);
        add(&mut a, p6);
        steps.want.writes += 1;
        steps.check(&h, "A's first writes");
        let rw0 = ifindex("rw0");
        for cycle in 1..=M {
            sh("ip", &["link", "set", "rw0", "down"]);
            steps.check(&h, &format!("link down {cycle}: IPv4 says nothing"));
            sh("ip", &["link", "set", "rw0", "up"]);
            add(&mut a, p4);
            steps.want.writes += 1;
            steps.want.flushes += 1;
            steps.check(&h, &format!("A's re-add {cycle} of {p4}"));
            add(&mut a, p6);
            steps.check(&h, &format!("A's re-add {cycle} of {p6}"));
        }
        let c = h.watch.counters().unwrap();
        assert!(c.flushes[1] >= M as u64, "{test}: at least P6's {M} IPv6 flushes: {:?}", c.flushes);
        let link_downs = if backend == RouteWatchBackend::SocketFilter { M } else { 0 };
        let flushes_of = |h: &Harness, p: &str| {
            h.events
                .iter()
                .filter_map(|(_, e)| if let RouteWatchEvent::Flush { route } = e { Some(route) } else { None })
                .filter(|r| r.dst.to_string() == p)
                .cloned()
                .collect::<Vec<_>>()
        };
        let downs = |h: &Harness| h.events.iter().filter(|(_, e)| matches!(e, RouteWatchEvent::LinkDown { ifindex, .. } if *ifindex == rw0)).count();
        let arrived = h.pump_until(EVENT_DEADLINE, |h| flushes_of(h, p4).len() >= M && flushes_of(h, p6).len() >= M && downs(h) >= link_downs).await;
        assert!(arrived.is_some(), "{test}: flush records after {EVENT_DEADLINE:?}: {:#?}", h.events);
        h.pump(Duration::from_millis(100)).await;
        let (f4, f6) = (flushes_of(&h, p4), flushes_of(&h, p6));
        assert_eq!(f4.len(), M, "{test}: one flush of {p4} per cycle: {f4:#?}");
        assert!(f4.iter().all(|r| r.op == "add" && r.writer.pid == a.pid && !r.writer.kernel), "{test}: revealed by A's re-add: {f4:#?}");
        assert_eq!(f6.len(), M, "{test}: one flush of {p6} per cycle: {f6:#?}");
        assert!(f6.iter().all(|r| r.op == "delete" && r.writer.kernel), "{test}: the kernel's own delete: {f6:#?}");
        assert_eq!(downs(&h), link_downs, "{test}: link-down events for rw0: {:#?}", h.events);
        assert_eq!(h.episodes(), Vec::new(), "{test}: a flush is neither conflict nor flap");
        assert_eq!(h.peak_flapping, 0);
        eprintln!("{test}: flushes ipv4 {} (exactly {M}), ipv6 {} ({M} of P6 and the link's own); no conflict, no flap", c.flushes[0], c.flushes[1]);
    });
    drop(ns);
}

/// Changes spread beyond the window, in three bursts a [`GAP`] (longer than W) apart.
/// - S1, A then B in every burst: B's write is a conflict each time (R2: within W of A's, and
///   the previous episode is more than W old), 3 in all; A's is none (more than W after the
///   last write). Each burst begins a new window, so a window holds 2 changes: no flap (R3).
/// - S2, one write per burst, A and B in turn: no write is within W of the last, so no
///   conflict; each begins a window with 1 change: no flap.
/// - S3, A, B, A, B in burst 0 and A, B, A in burst 1: in burst 0 B's first write is the
///   conflict and the third change the flap; in burst 1 A's first write only begins a window
///   (change 1), B's is a new conflict episode and the third change a new flap episode: one per
///   prefix per window, not one for good.
fn spread_beyond_the_window(test: &str, backend: RouteWatchBackend) {
    let Some((ns, watch)) = setup(test, backend, &config(), |_| {}) else { return };
    runtime().block_on(async {
        let mut h = Harness::new(watch);
        let (mut a, mut b) = (Writer::a(), Writer::b());
        let mut steps = Steps::new(test, &h);
        let (s1, s2, s3) = ("10.244.41.0/26", "10.244.42.0/26", "10.244.43.0/26");
        let mut want = Vec::new();
        for burst in 0..3 {
            let started = Instant::now();
            a.replace(s1);
            steps.want.writes += 1;
            steps.check(&h, &format!("burst {burst}: A on {s1}"));
            b.replace(s1);
            steps.want.writes += 1;
            steps.want.conflicts += 1;
            steps.check(&h, &format!("burst {burst}: B on {s1}"));
            want.push(Episode::Conflict { dst: s1.into(), op: "replace", writer: b.pid, previous: a.pid, writes: 2 });
            (if burst % 2 == 0 { &mut a } else { &mut b }).replace(s2);
            steps.want.writes += 1;
            steps.check(&h, &format!("burst {burst}: {s2}"));
            let s3_writes = match burst {
                0 => T + 1,
                1 => T,
                _ => 0,
            };
            for i in 0..s3_writes {
                (if i % 2 == 0 { &mut a } else { &mut b }).replace(s3);
                steps.want.writes += 1;
                // Burst 0: write 0 is R1, writes 1.. are changes 1..; burst 1: write 0 is change 1.
                let change = if burst == 0 { i } else { i + 1 };
                steps.want.conflicts += u64::from(i == 1);
                steps.want.flaps += u64::from(change == T);
                steps.check(&h, &format!("burst {burst}: write {i} on {s3}"));
                if i == 1 {
                    want.push(Episode::Conflict { dst: s3.into(), op: "replace", writer: b.pid, previous: a.pid, writes: 2 });
                }
                if change == T {
                    let (w, prev) = if i % 2 == 0 { (a.pid, b.pid) } else { (b.pid, a.pid) };
                    want.push(Episode::Flap { dst: s3.into(), op: "replace", writer: w, previous: prev, changes: T });
                }
            }
            within_window(test, &format!("burst {burst}"), started);
            if burst < 2 {
                h.pump(GAP).await;
            }
        }
        assert_eq!((steps.want.conflicts, steps.want.flaps), (5, 2));
        h.pump_counted_episodes(test).await;
        assert_eq!(h.episodes(), want, "{test}: {:#?}", h.events);
        h.assert_episodes_exported(test);
        eprintln!("{test}: {} writes in 3 bursts {GAP:?} apart: 5 conflict and 2 flap episodes, as the rules say", steps.want.writes);
    });
    drop(ns);
}

/// Entries of the detector's per-prefix LRU map (`ROUTE_WATCH_STATE`, declared in
/// `ebpf/src/route_detector.rs`), read from the kernel's description of the loaded map (it
/// keeps 15 characters of a map's name).
fn state_capacity(test: &str) -> u32 {
    let name = &ROUTE_WATCH_STATE_MAP[..15];
    let sizes: BTreeSet<u32> = aya::maps::loaded_maps()
        .filter_map(Result::ok)
        .filter(|m| m.name_as_str() == Some(name) && matches!(m.map_type(), Ok(MapType::LruHash)))
        .filter(|m| m.key_size() as usize == size_of::<PrefixKey>() && m.value_size() as usize == size_of::<PrefixState>())
        .map(|m| m.max_entries())
        .collect();
    assert_eq!(sizes.len(), 1, "{test}: sizes of the detector's state maps loaded now: {sizes:?}");
    sizes.into_iter().next().unwrap()
}

/// The calling thread, and the processes it starts from now on, run on one CPU; the thread's
/// own CPU set is restored on drop.
struct OnOneCpu(CpuSet);

impl OnOneCpu {
    fn pin() -> OnOneCpu {
        let this_thread = Pid::from_raw(0);
        let all = sched_getaffinity(this_thread).expect("sched_getaffinity");
        let cpu = (0..CpuSet::count()).find(|&c| all.is_set(c).unwrap_or(false)).expect("a CPU");
        let mut one = CpuSet::new();
        one.set(cpu).unwrap();
        sched_setaffinity(this_thread, &one).expect("sched_setaffinity");
        OnOneCpu(all)
    }
}

impl Drop for OnOneCpu {
    fn drop(&mut self) {
        let _ = sched_setaffinity(Pid::from_raw(0), &self.0);
    }
}

/// LRU pressure: A writes `cold`, then one `ip -batch` adds a quarter more /32s than the state
/// map holds, each a first write (R1) that needs a state; the LRU makes room by evicting the
/// least recently used, and `cold`'s state, used once before all of them, goes first. B's
/// replace of `cold` is then a first write again (R1): no conflict. A prefix written after the
/// pressure, `fresh`, keeps its state: B's replace of A's `fresh` is the one conflict.
///
/// Every writer runs on one CPU. The kernel's LRU (`kernel/bpf/bpf_lru_list.c`, common LRU)
/// puts a new entry on a pending list of the CPU that made it and moves it to the global list,
/// where eviction happens, only when that CPU next runs out of free entries: an entry made on a CPU
/// that makes nothing more is never evicted, whatever the pressure on the other CPUs (this test
/// saw it happen). On one CPU, `cold` reaches the global list within the first 128 fillers and
/// is its oldest entry; a quarter of the map (8,192 entries) is far more than the free entries the
/// other CPUs can hold back (128 each).
fn lru_pressure(test: &str, backend: RouteWatchBackend) {
    let pinned = OnOneCpu::pin();
    let Some((ns, watch)) = setup(test, backend, &config(), |_| {}) else { return };
    runtime().block_on(async {
        let mut h = Harness::new(watch);
        let (mut a, mut b) = (Writer::a(), Writer::b());
        let mut steps = Steps::new(test, &h);
        let capacity = state_capacity(test);
        let fillers = capacity + capacity / 4;
        assert!(fillers <= 65_536, "{test}: {fillers} /32s do not fit 10.128.0.0/16");
        let (cold, fresh) = ("10.244.51.0/26", "10.244.52.0/26");
        a.replace(cold);
        steps.want.writes += 1;
        steps.check(&h, &format!("A on {cold}"));
        let file = std::env::temp_dir().join(format!("rw-lru-{}-{}", std::process::id(), backend.label()));
        let mut batch = String::new();
        for i in 0..fillers {
            let _ = writeln!(batch, "route add 10.128.{}.{}/32 dev veth0 proto {SELF_PROTO}", i / 256, i % 256);
        }
        std::fs::write(&file, batch).unwrap();
        let t0 = Instant::now();
        sh("ip", &["-batch", file.to_str().unwrap()]);
        let took = t0.elapsed();
        let _ = std::fs::remove_file(&file);
        steps.want.writes += u64::from(fillers);
        steps.check(&h, &format!("{fillers} first writes"));
        b.replace(cold);
        steps.want.writes += 1;
        steps.check(&h, &format!("B on {cold}, whose state was evicted"));
        let started = Instant::now();
        a.replace(fresh);
        b.replace(fresh);
        within_window(test, &format!("A then B on {fresh}"), started);
        steps.want.writes += 2;
        steps.want.conflicts += 1;
        steps.check(&h, &format!("A then B on {fresh}"));
        h.pump_counted_episodes(test).await;
        let want = vec![Episode::Conflict { dst: fresh.into(), op: "replace", writer: b.pid, previous: a.pid, writes: 2 }];
        assert_eq!(h.episodes(), want, "{test}: {:#?}", h.events);
        h.assert_episodes_exported(test);
        eprintln!(
            "{test}: state map of {capacity} entries, {fillers} more prefixes written in {took:?}; the evicted prefix restarts cold, the fresh one conflicts"
        );
    });
    drop(ns);
    drop(pinned);
}

/// One test module per backend, each running every scenario above.
macro_rules! backend_tests {
    ($module:ident, $backend:ident, [$($test:ident),* $(,)?]) => {
        mod $module {
            use routewarden::bpf::route_watch::RouteWatchBackend;
            $(
                #[test]
                fn $test() {
                    super::$test(concat!(stringify!($module), "::", stringify!($test)), RouteWatchBackend::$backend);
                }
            )*
        }
    };
}

macro_rules! on_every_backend {
    ($($test:ident),* $(,)?) => {
        backend_tests!(socket_filter, SocketFilter, [$($test),*]);
        backend_tests!(fentry, Fentry, [$($test),*]);
        backend_tests!(kprobe, Kprobe, [$($test),*]);
    };
}

on_every_backend!(alternating_writers, same_writer, delete_and_readd, link_flush, spread_beyond_the_window, lru_pressure);
