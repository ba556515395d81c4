//! Where the routing benchmarks run: a fresh network namespace shaped like a node
//! ([`in_node_netns`]), and `ip` in the calling thread's namespace.

use std::process::Command;

use anyhow::{anyhow, ensure, Context, Result};
use routewarden_lab::NetNsGuard;

/// Run `ip <args>` (whitespace-split) in the calling thread's namespace; stdout.
pub fn ip(args: &str) -> Result<String> {
    let out = Command::new("ip").args(args.split_whitespace()).output().context("run ip")?;
    ensure!(out.status.success(), "ip {args}: {}", String::from_utf8_lossy(&out.stderr).trim());
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// IPv4 routes of the main table with protocol `proto` in the calling thread's namespace.
pub fn count_routes(proto: &str) -> Result<usize> {
    Ok(ip(&format!("route show proto {proto}"))?.lines().filter(|l| !l.trim().is_empty()).count())
}

/// Run `f` on a new thread inside a fresh network namespace holding `lo`, an `eth0` stand-in
/// (veth, 10.0.0.11/24) and a `tunl0` stand-in (veth), all up, with a tokio runtime shaped
/// like the agent's (multi-thread, 2 workers). Sockets, threads and child processes made by
/// `f` live in that namespace; it disappears when `f` has returned and they are gone.
pub fn in_node_netns<T: Send + 'static>(f: impl FnOnce(&tokio::runtime::Runtime) -> Result<T> + Send + 'static) -> Result<T> {
    std::thread::spawn(move || -> Result<T> {
        let guard = NetNsGuard::new()?;
        for cmd in [
            "link add eth0 type veth peer name eth0p",
            "addr add 10.0.0.11/24 dev eth0",
            "link set eth0p up",
            "link set eth0 up",
            "link add tunl0 type veth peer name tunpeer",
            "link set tunpeer up",
            "link set tunl0 up",
        ] {
            ip(cmd)?;
        }
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
        let out = f(&rt);
        drop(rt);
        drop(guard);
        out
    })
    .join()
    .map_err(|_| anyhow!("benchmark thread panicked"))?
}
