//! Where the routing benchmarks run: a fresh network namespace shaped like a node
//! ([`in_node_netns`]), `ip` in the calling thread's namespace, and the check that exactly the
//! expected cluster routes are in its kernel ([`check_exact_routes`]).

use std::process::Command;

use anyhow::{anyhow, ensure, Context, Result};
use routewarden::routes::ClusterRoute;
use routewarden::vocabulary::RoutePath;
use routewarden_lab::NetNsGuard;
use serde_json::Value;

use crate::fixtures::PROTO_OURS;

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

/// IPv4 routes of the main table with protocol `proto` that go through a nexthop object
/// (`nhid` in `ip route`'s line) in the calling thread's namespace.
pub fn count_nhid_routes(proto: &str) -> Result<usize> {
    Ok(ip(&format!("route show proto {proto}"))?.lines().filter(|l| l.contains(" nhid ")).count())
}

/// IPv4 routes of the main table with protocol `proto` whose line in `ip route` (with or
/// without a nexthop object) says `via <gateway> `, in the calling thread's namespace.
pub fn count_routes_via(proto: &str, gateway: &str) -> Result<usize> {
    let via = format!(" via {gateway} ");
    Ok(ip(&format!("route show proto {proto}"))?.lines().filter(|l| l.contains(&via)).count())
}

/// Nexthop objects of protocol `proto` (`ip nexthop show`) in the calling thread's namespace.
pub fn count_nexthops(proto: &str) -> Result<usize> {
    let mark = format!(" proto {proto} ");
    Ok(ip("nexthop show")?.lines().filter(|l| format!("{l} ").contains(&mark)).count())
}

/// One route as `ip -j route` prints it, rendered as one comparable line:
/// `<type> <dst> via <gw> dev <dev> metric <m> table <table> flags <f,...>` (type `unicast` and
/// table `main` where `ip` leaves them out; a host prefix with its length).
fn route_line(r: &Value) -> String {
    let s = |k: &str, default: &str| r.get(k).and_then(Value::as_str).unwrap_or(default).to_string();
    let mut dst = s("dst", "?");
    if !dst.contains('/') && dst != "default" {
        dst.push_str(if dst.contains(':') { "/128" } else { "/32" });
    }
    let metric = r.get("metric").and_then(Value::as_u64).unwrap_or(0);
    let flags: Vec<&str> = r.get("flags").and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    format!(
        "{} {dst} via {} dev {} metric {metric} table {} flags {}",
        s("type", "unicast"),
        s("gateway", "-"),
        s("dev", "-"),
        s("table", "main"),
        flags.join(",")
    )
}

/// The line [`route_line`] gives for `r` as written with protocol [`PROTO_OURS`], metric 1024,
/// in the main table: tunnel routes via `tunl0`, host-NIC routes via `eth0`, both onlink.
fn expected_line(r: &ClusterRoute) -> String {
    let gw = r.gateway.map_or_else(|| "-".to_string(), |g| g.to_string());
    let dev = |default: &str| r.device.as_deref().unwrap_or(default).to_string();
    match r.path {
        RoutePath::Blackhole => format!("blackhole {} via - dev - metric 1024 table main flags ", r.dst),
        RoutePath::Tunnel => format!("unicast {} via {gw} dev {} metric 1024 table main flags onlink", r.dst, dev("tunl0")),
        RoutePath::HostNic => format!("unicast {} via {gw} dev {} metric 1024 table main flags onlink", r.dst, dev("eth0")),
    }
}

/// Check that the routes of protocol [`PROTO_OURS`] in every table of the calling thread's
/// namespace (`ip -j route show table all`, both families) are exactly `routes`, each with the
/// type, gateway, device, metric, table and flags routewarden writes for it.
///
/// # Errors
/// When `ip` fails or prints something else than JSON, or a route is missing, extra or
/// different (the first few of each are named).
pub fn check_exact_routes(routes: &[ClusterRoute]) -> Result<()> {
    let out = ip("-j route show table all")?;
    let all: Vec<Value> = serde_json::from_str(&out).context("parse `ip -j route show table all`")?;
    let mut got: Vec<String> = all.iter().filter(|r| r.get("protocol").and_then(Value::as_str) == Some(PROTO_OURS)).map(route_line).collect();
    let mut want: Vec<String> = routes.iter().map(expected_line).collect();
    got.sort_unstable();
    want.sort_unstable();
    if got == want {
        return Ok(());
    }
    let missing: Vec<&String> = want.iter().filter(|w| got.binary_search(w).is_err()).take(3).collect();
    let extra: Vec<&String> = got.iter().filter(|g| want.binary_search(g).is_err()).take(3).collect();
    Err(anyhow!("{} routes of protocol {PROTO_OURS} in the kernel, {} expected; missing e.g. {missing:?}, extra e.g. {extra:?}", got.len(), want.len()))
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
