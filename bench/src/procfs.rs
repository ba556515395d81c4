//! What `/proc` (and `getrusage`) says about a process: its memory and its CPU time.

use anyhow::{Context, Result};

/// `VmHWM` (peak RSS) and `VmRSS` of `/proc/<pid>/status`, in KiB.
pub fn proc_mem_kib(pid: &str) -> Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> Result<u64> {
        let line = status.lines().find(|l| l.starts_with(name)).with_context(|| format!("no {name} in /proc/{pid}/status"))?;
        Ok(line.split_whitespace().nth(1).context("malformed line")?.parse()?)
    };
    Ok((field("VmHWM:")?, field("VmRSS:")?))
}

/// utime + stime of `/proc/<pid>/stat`, in clock ticks.
pub fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may contain spaces) start at field 3 (state).
    let rest = stat.rsplit_once(')').context("malformed /proc/<pid>/stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 (1-based), i.e. 11 and 12 after the state (3).
    Ok(f.get(11).context("no utime")?.parse::<u64>()? + f.get(12).context("no stime")?.parse::<u64>()?)
}

/// This process's CPU time so far: user and system time of all its threads (`getrusage`, in
/// microseconds; [`cpu_ticks`] counts 10 ms ticks, too coarse for a 40 ms programming).
///
/// # Errors
/// When `getrusage` fails.
pub fn process_cpu() -> Result<std::time::Duration> {
    use nix::sys::time::TimeValLike;
    let u = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF).context("getrusage")?;
    let micros = u.user_time().num_microseconds() + u.system_time().num_microseconds();
    Ok(std::time::Duration::from_micros(u64::try_from(micros).unwrap_or(0)))
}

/// Reset this process's `VmHWM` (peak RSS) to its current RSS (`echo 5 >
/// /proc/self/clear_refs`, Linux 4.0 and later), so a later `VmHWM` is the peak since now.
///
/// # Errors
/// `/proc/self/clear_refs` not writable (older kernel, no procfs).
pub fn reset_peak_rss() -> Result<()> {
    std::fs::write("/proc/self/clear_refs", "5").context("reset VmHWM through /proc/self/clear_refs")
}
