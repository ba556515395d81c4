//! Writer attribution under a storm of short-lived writers (issue 22), socket-filter backend,
//! in its own network namespace.
//!
//! 1,000 `ip route replace 10.77.x.y/32 dev lo` processes, one after the other from one shell
//! (so their fork/exec cost is the shell's, not ours), while 10 long-lived `ip -batch -`
//! writers each write one route at spread-out points of the storm and stay alive. Asserted:
//! - every write is seen, exactly once (1,000 + 10 write events, the kernel counters agree,
//!   nothing lost);
//! - the long-lived writers get their pid and `ip` as comm; a storm writer that was resolved
//!   got `ip` (and its pid, which is its port id unless the kernel picked another port); the
//!   others keep their port id;
//! - the CPU time of the attribution thread (`/proc/self/task/<tid>/schedstat`, ns, read
//!   before and after the storm) is at most 0.5 s; the whole process's CPU time is printed
//!   beside it, for comparison with the storm's length;
//! - the resolver did at most one `/proc` round per 200 ms, and no event waited longer than
//!   500 ms between the kernel's write and its arrival here (the bound is 200 ms and one round).

mod route_watch_common;

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use route_watch_common::{config, start_or_skip, ChildGuard, IpBatch};
use routewarden::bpf::route_watch::writer::{ATTRIBUTION_THREAD, ROUND_INTERVAL};
use routewarden::bpf::route_watch::{RouteWatchBackend, RouteWatchConfig, RouteWatchEvent, WriterInfo};
use routewarden_lab::NetNsGuard;
use tokio::sync::mpsc;

const TEST: &str = "socket_filter_writer_storm_attribution_is_cheap";
const STORM: u32 = 1000;
const LONG_LIVED: u32 = 10;
/// Attribution CPU budget for the whole storm.
const CPU_BUDGET: Duration = Duration::from_millis(500);
/// The rate limit issue 22 asks for: at most one `/proc` round per 200 ms. (Without it, this
/// storm costs ~1,000 rounds and ~0.4 s of CPU in a debug build: under the budget, so the
/// budget alone would not notice.)
const MIN_ROUND_GAP: Duration = Duration::from_millis(200);

/// CPU time of thread `tid` of this process, ns (scheduler's `sum_exec_runtime`).
fn thread_cpu_ns(tid: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).expect("schedstat");
    s.split_whitespace().next().and_then(|v| v.parse().ok()).expect("schedstat run time")
}

/// The tid of this process's thread named `name`.
fn thread_named(name: &str) -> Option<String> {
    std::fs::read_dir("/proc/self/task").ok()?.flatten().find_map(|t| {
        let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
        (comm.trim() == name).then(|| t.file_name().to_string_lossy().into_owned())
    })
}

/// utime + stime of this whole process (every thread, living or gone), in clock ticks.
fn process_cpu_ticks() -> u64 {
    let s = std::fs::read_to_string("/proc/self/stat").expect("stat");
    // Fields after the parenthesised comm: state is field 3, utime 14, stime 15.
    let rest = &s[s.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// CLOCK_MONOTONIC in ns: the clock of the events' `at_ns`.
fn monotonic_ns() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("clock_gettime");
    u64::try_from(t.tv_sec()).unwrap() * 1_000_000_000 + u64::try_from(t.tv_nsec()).unwrap()
}

#[test]
fn socket_filter_writer_storm_attribution_is_cheap() {
    if routewarden_lab::skip_unless_root(TEST) {
        return;
    }
    let ns = NetNsGuard::new().expect("netns (root needed)");
    let cfg = RouteWatchConfig { stream_writes: true, ring_buffer_bytes: Some(1 << 22), ..config() };
    let Some(mut watch) = start_or_skip(TEST, RouteWatchBackend::SocketFilter, &cfg) else { return };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let (tx, mut rx) = mpsc::channel(65536);
        watch.spawn_reader(tx).expect("reader");
        let mut long_lived: Vec<IpBatch> = (0..LONG_LIVED).map(|_| IpBatch::spawn()).collect();
        // Let the writers open their sockets and the attribution thread start.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let attr_tid = thread_named(ATTRIBUTION_THREAD).unwrap_or_else(|| panic!("{TEST}: no thread named {ATTRIBUTION_THREAD}"));
        let counters_before = watch.counters().unwrap();
        let stats_before = watch.attribution_stats();
        let (cpu0, ticks0, t0) = (thread_cpu_ns(&attr_tid), process_cpu_ticks(), Instant::now());
        let script = format!("i=0; while [ $i -lt {STORM} ]; do ip route replace 10.77.$((i / 256)).$((i % 256))/32 dev lo || exit 1; i=$((i + 1)); done");
        let mut storm = ChildGuard(Command::new("sh").args(["-c", &script]).stdout(Stdio::null()).spawn().expect("spawn sh"));
        let mut storm_writers: Vec<WriterInfo> = Vec::new();
        let mut long_writers: HashMap<u8, WriterInfo> = HashMap::new();
        let mut sent = 0u32;
        let mut delays_ns: Vec<u64> = Vec::new();
        let mut storm_done = None;
        let deadline = Instant::now() + Duration::from_mins(2);
        while storm_writers.len() < STORM as usize || long_writers.len() < LONG_LIVED as usize {
            assert!(Instant::now() < deadline, "{TEST}: {} storm and {} long-lived writes seen after 120 s", storm_writers.len(), long_writers.len());
            // Long-lived writer k writes once the storm has shown k * 100 writes.
            #[expect(clippy::cast_possible_truncation, reason = "at most STORM")]
            while sent < LONG_LIVED && storm_writers.len() as u32 >= sent * (STORM / LONG_LIVED) {
                long_lived[sent as usize].send(&format!("route replace 10.78.0.{sent}/32 dev lo"));
                sent += 1;
            }
            if storm_done.is_none() {
                if let Some(status) = storm.0.try_wait().unwrap() {
                    assert!(status.success(), "{TEST}: the storm's shell failed: {status}");
                    storm_done = Some(t0.elapsed());
                }
            }
            let Ok(Some(ev)) = tokio::time::timeout(Duration::from_millis(100), rx.recv()).await else { continue };
            let RouteWatchEvent::Write { route } = ev else { panic!("{TEST}: only writes expected, got {ev:?}") };
            delays_ns.push(monotonic_ns().saturating_sub(route.at_ns));
            let dst = route.dst.to_string();
            if dst.starts_with("10.77.") {
                storm_writers.push(route.writer);
            } else if let Some(k) = dst.strip_prefix("10.78.0.").and_then(|s| s.strip_suffix("/32")) {
                let k: u8 = k.parse().unwrap();
                assert!(long_writers.insert(k, route.writer).is_none(), "{TEST}: write of 10.78.0.{k} seen twice");
            } else {
                panic!("{TEST}: unexpected write {route:?}");
            }
        }
        let elapsed = t0.elapsed();
        let cpu = Duration::from_nanos(thread_cpu_ns(&attr_tid) - cpu0);
        let ticks = process_cpu_ticks() - ticks0;
        let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).unwrap().unwrap_or(100);
        #[expect(clippy::cast_precision_loss, reason = "tick counts are small")]
        let process_cpu = Duration::from_secs_f64(ticks as f64 / hz as f64);
        let stats = watch.attribution_stats();
        // Nothing more arrives: each write was seen exactly once.
        assert!(tokio::time::timeout(Duration::from_millis(500), rx.recv()).await.is_err(), "{TEST}: more events than writes");
        let c = watch.counters().unwrap();
        let writes = c.writes.iter().flatten().flatten().sum::<u64>() - counters_before.writes.iter().flatten().flatten().sum::<u64>();
        assert_eq!(writes, u64::from(STORM + LONG_LIVED), "{TEST}: kernel counters: every write counted");
        assert_eq!(c.records_lost, counters_before.records_lost, "{TEST}: no record lost");
        assert_eq!(storm_writers.len(), STORM as usize);

        for (k, w) in &long_writers {
            let pid = long_lived[usize::from(*k)].pid();
            assert_eq!((w.pid, w.comm.as_deref()), (Some(pid), Some("ip")), "{TEST}: long-lived writer {k} (pid {pid}) resolved: {w:?}");
        }
        let mut resolved = 0;
        for w in &storm_writers {
            let port = w.netlink_port.unwrap_or_else(|| panic!("{TEST}: socket-filter writers carry their port id: {w:?}"));
            match (w.pid, w.comm.as_deref()) {
                (None, None) => {}
                (Some(pid), Some("ip")) => {
                    // The kernel gives a process's first netlink socket its pid as port id,
                    // unless taken; then it picks one from -4096 down.
                    assert!(pid == port || port >= 0x8000_0000, "{TEST}: port {port} resolved to pid {pid}");
                    resolved += 1;
                }
                _ => panic!("{TEST}: a storm writer resolved to something other than `ip`: {w:?}"),
            }
        }
        delays_ns.sort_unstable();
        let ms = |q: usize| Duration::from_nanos(delays_ns[(delays_ns.len() - 1) * q / 100]);
        let (p50, p99, max_delay) = (ms(50), ms(99), ms(100));
        let rounds = stats.rounds - stats_before.rounds;
        let walks = stats.walks - stats_before.walks;
        let max_rounds = 1 + elapsed.as_millis() / MIN_ROUND_GAP.as_millis();
        eprintln!(
            "{TEST}: {STORM} storm writes in {:?} ({resolved} resolved to `ip`), {LONG_LIVED} long-lived writers resolved; \
             attribution thread CPU {cpu:?}, whole process CPU {process_cpu:?} over {elapsed:?}; \
             {rounds} rounds, {walks} /proc walks (at most {max_rounds} allowed); event delay (kernel write to here) p50 {p50:?} p99 {p99:?} max {max_delay:?}",
            storm_done.unwrap_or(elapsed),
        );
        assert!(u128::from(rounds) <= max_rounds, "{TEST}: {rounds} rounds in {elapsed:?}: more than one per {MIN_ROUND_GAP:?}");
        assert!(cpu <= CPU_BUDGET, "{TEST}: attribution used {cpu:?} of CPU for {STORM} writers, budget {CPU_BUDGET:?}");
        assert!(max_delay <= Duration::from_millis(500), "{TEST}: an event waited {max_delay:?} (bound: {ROUND_INTERVAL:?} and one round)");
        drop(long_lived);
    });
    drop(ns);
}
