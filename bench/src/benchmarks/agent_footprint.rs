//! `agent-footprint` (benchmark 8): the release agent binary holding 10,000 routes in a lab node
//! namespace, idle: its RSS against 50 MB and its CPU against 1 % of one core. Target: the
//! larger of the two ratios at most 1. Needs `--agent-bin`.

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
        let ticks0 = cpu_ticks(pid)?;
        let t = Instant::now();
        std::thread::sleep(opts.idle);
        let ticks = cpu_ticks(pid)? - ticks0;
        let elapsed = t.elapsed();
        let (hwm_kib, rss_kib) = proc_mem_kib(&pid.to_string())?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let status_mb = |field: &str| -> String {
            status
                .lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
                .map_or_else(|| "?".into(), |kib| format!("{:.1}", kib / 1024.0))
        };
        let (bpf_maps, bpf_map_bytes) = bpf_map_memlock(pid)?;
        let held = count()?;
        ensure!(held == opts.routes, "the agent holds {held} routes, expected {}", opts.routes);
        let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)?.unwrap_or(100) as f64;
        let cpu_pct = ticks as f64 / hz / elapsed.as_secs_f64() * 100.0;
        let rss_mb = rss_kib as f64 / 1024.0;
        let (rss_target_mb, cpu_target_pct) = (50.0, 1.0);
        Ok(Outcome::Measured {
            name: name.into(),
            ratio: (rss_mb / rss_target_mb).max(cpu_pct / cpu_target_pct),
            target: Target::AtMost(1.0),
            ok: true,
            details: vec![
                kv("routes", held),
                kv("rss_mb", format!("{rss_mb:.1}")),
                kv("rss_ratio", fmt_ratio(rss_mb / rss_target_mb)),
                kv("peak_rss_mb", format!("{:.1}", hwm_kib as f64 / 1024.0)),
                kv("rss_anon_mb", status_mb("RssAnon:")),
                kv("rss_file_mb", status_mb("RssFile:")),
                kv("threads", status.lines().find_map(|l| l.strip_prefix("Threads:")).map_or("?", str::trim)),
                kv("cpu_pct", format!("{cpu_pct:.3}")),
                kv("cpu_ratio", fmt_ratio(cpu_pct / cpu_target_pct)),
                kv("cpu_ticks", ticks),
                kv("idle_s", format!("{:.1}", elapsed.as_secs_f64())),
                kv("start_to_all_routes_ms", ms(startup)),
                kv("bpf_maps", bpf_maps),
                kv("bpf_map_memlock_mb", format!("{:.1}", bpf_map_bytes as f64 / (1024.0 * 1024.0))),
            ],
        })
    })();
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
    drop(lab);
    result
}
