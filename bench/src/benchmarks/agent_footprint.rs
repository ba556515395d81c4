//! `agent-footprint` (benchmark 8): the release agent binary holding 10,000 routes in a lab node
//! namespace, idle over at least two of its default 90-s resyncs: its memory (RSS plus the
//! kernel memory of its BPF maps, one figure; the maps' pages the agent maps, its ring buffers,
//! are in both and counted once) against 50 MB and its CPU against 1 % of one core.
//! Target: the larger of the two ratios at most 1. Then a churn phase (one datastore change a
//! second), reported beside. Needs `--agent-bin`.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use routewarden_lab::{Lab, LabNodeSpec, LabSpec};

use crate::fixtures::{write_footprint_cluster, PROTO_OURS};
use crate::procfs::{cpu_ticks, proc_mem_kib};
use crate::report::{fmt_ratio, kv, ms};
use crate::{Benchmark, Options, Outcome, Shared, Target};

/// This benchmark's registry entry: its name and [`run`].
pub const BENCHMARK: Benchmark = Benchmark { name: "agent-footprint", run };

/// The BPF maps `pid` holds: how many map fds (`/proc/<pid>/fd` entries linking to
/// `anon_inode:bpf-map`) and the sum of their `memlock` (bytes, the kernel's estimate of the
/// map's memory, from `/proc/<pid>/fdinfo/<fd>`). A map held through two fds counts twice (the
/// agent holds one fd per map).
fn bpf_map_memlock(pid: u32) -> Result<(usize, u64)> {
    let (mut maps, mut bytes) = (0, 0);
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        let entry = entry?;
        let Ok(link) = std::fs::read_link(entry.path()) else { continue };
        if link.as_os_str() != "anon_inode:bpf-map" {
            continue;
        }
        let Ok(info) = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{}", entry.file_name().to_string_lossy())) else { continue };
        maps += 1;
        bytes += info.lines().find_map(|l| l.strip_prefix("memlock:")).and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(0);
    }
    Ok((maps, bytes))
}

/// RSS of `pid`'s mappings of BPF maps (kB, `Rss:` of the `/proc/<pid>/smaps` entries named
/// `anon_inode:bpf-map`): the ring buffers' pages the agent reads events from. They are map
/// memory, already in the maps' `memlock`, so the one figure counts them once.
fn bpf_map_mapped_kib(pid: u32) -> Result<u64> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps"))?;
    let (mut in_map, mut kib) = (false, 0);
    for line in smaps.lines() {
        if let Some(rss) = line.strip_prefix("Rss:") {
            if in_map {
                kib += rss.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap_or(0);
            }
        } else if line.split_whitespace().next().is_some_and(|f| f.contains('-') && f.chars().all(|c| c.is_ascii_hexdigit() || c == '-')) {
            in_map = line.ends_with("anon_inode:bpf-map");
        }
    }
    Ok(kib)
}

/// The idle window that covers two of the agent's default 90-s resyncs wherever it starts
/// (`--resync-interval`'s default, which the benchmark runs with, as the DaemonSet does).
pub const IDLE_TWO_RESYNCS: Duration = Duration::from_secs(2 * 90 + 5);

/// What the churn phase measured.
struct Churn {
    elapsed: Duration,
    changes: u32,
    ticks: u64,
    rss_kib: u64,
}

/// One datastore change a second for `window`: a file of the datastore directory alternately
/// holds one more IPAM block of another node (one route more) and none (that route deleted
/// again). Returns the changes made, the agent's CPU ticks and its RSS at the end.
fn churn_phase(data: &std::path::Path, pid: u32, window: Duration) -> Result<Churn> {
    let file = data.join("churn.yaml");
    let block = "apiVersion: crd.projectcalico.org/v1\nkind: IPAMBlockList\nitems:\n  - metadata: {name: 10-255-255-0-26}\n    spec: {cidr: 10.255.255.0/26, affinity: \"host:node-0001\"}\n";
    let empty = "apiVersion: v1\nkind: List\nitems: []\n";
    let ticks0 = cpu_ticks(pid)?;
    let t = Instant::now();
    let mut changes = 0u32;
    while t.elapsed() < window {
        std::fs::write(&file, if changes.is_multiple_of(2) { block } else { empty })?;
        changes += 1;
        std::thread::sleep(Duration::from_secs(1));
    }
    let ticks = cpu_ticks(pid)? - ticks0;
    let elapsed = t.elapsed();
    let (_, rss_kib) = proc_mem_kib(&pid.to_string())?;
    Ok(Churn { elapsed, changes, ticks, rss_kib })
}

/// The agent's applies so far: every apply is one more `reconcile_duration_seconds` sample;
/// idle, only the resyncs apply, so the count's growth over a window is the resyncs it covered.
fn applies(lab: &Lab) -> Result<u64> {
    let (status, body) = lab.http_get("node-0000", 9695, "/metrics")?;
    ensure!(status == 200, "GET /metrics answered {status}");
    body.lines()
        .find_map(|l| l.strip_prefix("routewarden_reconcile_duration_seconds_count "))
        .and_then(|v| v.trim().parse().ok())
        .context("no routewarden_reconcile_duration_seconds_count in /metrics")
}

/// Benchmark 8: the agent binary holding 10,000 routes in a lab node namespace, idle.
pub fn run(opts: &Options, _shared: &mut Shared) -> Result<Outcome> {
    let name = BENCHMARK.name;
    let Some(agent) = &opts.agent_bin else {
        return Ok(Outcome::Skipped { name: name.into(), reason: "no --agent-bin (cargo xtask bench passes target/release/routewarden)".into() });
    };
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("cluster");
    std::fs::create_dir(&data)?;
    write_footprint_cluster(&data, opts.footprint_nodes, opts.routes)?;
    let lab = Lab::build(LabSpec::new(vec![LabNodeSpec { name: "node-0000".into(), addresses: vec!["192.168.0.10/24".into()] }]))?;
    let log = std::fs::File::create(dir.path().join("agent.log"))?;
    let t0 = Instant::now();
    let mut child = lab
        .command("node-0000", &agent.display().to_string())
        .args(["run", "--node", "node-0000", "--metrics-addr", "127.0.0.1:9695", "--log-format", "text", "--datastore"])
        .arg(format!("file:{}", data.display()))
        .env("RUST_LOG", "warn")
        // As the image runs it (Containerfile: the allocator's start-up option).
        .env("MIMALLOC_ARENA_EAGER_COMMIT", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("start the agent")?;
    let pid = child.id();
    let result = (|| -> Result<Outcome> {
        let count = || -> Result<usize> { Ok(lab.ip("node-0000", &["route", "show", "proto", PROTO_OURS])?.lines().filter(|l| !l.trim().is_empty()).count()) };
        let startup = loop {
            if let Some(status) = child.try_wait()? {
                bail!("the agent exited: {status}; log: {}", std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default());
            }
            if count()? >= opts.routes {
                break t0.elapsed();
            }
            ensure!(t0.elapsed() < Duration::from_mins(2), "only {} of {} routes after 120 s", count()?, opts.routes);
            std::thread::sleep(Duration::from_millis(50));
        };
        // `ip netns exec` execs the agent in place: by now the pid is the agent's.
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        ensure!(comm.trim().starts_with("routewarden"), "pid {pid} is {:?}, not the agent", comm.trim());
        // Let start-up work (first metrics, BPF attach, debounced reloads) finish.
        std::thread::sleep(Duration::from_secs(2));
        let applies0 = applies(&lab)?;
        let ticks0 = cpu_ticks(pid)?;
        let t = Instant::now();
        std::thread::sleep(opts.idle);
        let ticks = cpu_ticks(pid)? - ticks0;
        let elapsed = t.elapsed();
        let resyncs = applies(&lab)? - applies0;
        if opts.idle >= IDLE_TWO_RESYNCS {
            ensure!(resyncs >= 2, "the idle window of {:?} covered {resyncs} applies, not the two resyncs it is sized for", opts.idle);
        }
        let (hwm_kib, rss_kib) = proc_mem_kib(&pid.to_string())?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let status_mb = |field: &str| status_field_mb(&status, field);
        let (bpf_maps, bpf_map_bytes) = bpf_map_memlock(pid)?;
        let mapped_kib = bpf_map_mapped_kib(pid)?;
        let held = count()?;
        ensure!(held == opts.routes, "the agent holds {held} routes, expected {}", opts.routes);
        let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)?.unwrap_or(100) as f64;
        let cpu_pct = ticks as f64 / hz / elapsed.as_secs_f64() * 100.0;
        let rss_mb = rss_kib as f64 / 1024.0;
        let bpf_mb = bpf_map_bytes as f64 / (1024.0 * 1024.0);
        let mapped_mb = mapped_kib as f64 / 1024.0;
        let memory_mb = rss_mb - mapped_mb + bpf_mb;
        let (memory_target_mb, cpu_target_pct) = (50.0, 1.0);
        let churn = churn_phase(&data, pid, opts.churn)?;
        let held = count()?;
        ensure!(held == opts.routes || held == opts.routes + 1, "after the churn the agent holds {held} routes, expected {} or one more", opts.routes);
        Ok(Outcome::Measured {
            name: name.into(),
            ratio: (memory_mb / memory_target_mb).max(cpu_pct / cpu_target_pct),
            target: Target::AtMost(1.0),
            ok: true,
            details: vec![
                kv("routes", opts.routes),
                kv("memory_mb", format!("{memory_mb:.1}")),
                kv("memory_ratio", fmt_ratio(memory_mb / memory_target_mb)),
                kv("rss_mb", format!("{rss_mb:.1}")),
                kv("peak_rss_mb", format!("{:.1}", hwm_kib as f64 / 1024.0)),
                kv("rss_anon_mb", status_mb("RssAnon:")),
                kv("rss_file_mb", status_mb("RssFile:")),
                kv("threads", status.lines().find_map(|l| l.strip_prefix("Threads:")).map_or("?", str::trim)),
                kv("cpu_pct", format!("{cpu_pct:.3}")),
                kv("cpu_ratio", fmt_ratio(cpu_pct / cpu_target_pct)),
                kv("cpu_ticks", ticks),
                kv("idle_s", format!("{:.1}", elapsed.as_secs_f64())),
                kv("resyncs", resyncs),
                kv("start_to_all_routes_ms", ms(startup)),
                kv("bpf_maps", bpf_maps),
                kv("bpf_map_memlock_mb", format!("{bpf_mb:.1}")),
                kv("bpf_map_mapped_mb", format!("{mapped_mb:.1}")),
                kv("churn_s", format!("{:.1}", churn.elapsed.as_secs_f64())),
                kv("churn_changes", churn.changes),
                kv("churn_cpu_pct", format!("{:.3}", churn.ticks as f64 / hz / churn.elapsed.as_secs_f64() * 100.0)),
                kv("churn_rss_mb", format!("{:.1}", churn.rss_kib as f64 / 1024.0)),
            ],
        })
    })();
    stop_agent(&mut child, pid)?;
    drop(lab);
    result
}

/// A kB field of `/proc/<pid>/status` in MB with one decimal (`?` when absent).
fn status_field_mb(status: &str, field: &str) -> String {
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .map_or_else(|| "?".into(), |kib| format!("{:.1}", kib / 1024.0))
}

/// SIGTERM the agent and wait up to 10 s for it, then kill it.
fn stop_agent(child: &mut std::process::Child, pid: u32) -> Result<()> {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap_or(0)), nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}
