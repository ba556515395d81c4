//! `cold-program-10k` (benchmark 1): routewarden's cold programming of 10,000 cluster routes
//! into an empty table, against `ip -batch` adding the same routes. Target: at most 1.5.
//!
//! Also measured in the same runs: the same programming in nexthop-object
//! mode (`rw_nh_ms`, every route checked to go through an object afterwards) and its ratio
//! against the same `ip -batch` (`ratio_nh`; the line's `ratio` and `met` stay classic mode's).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use routewarden::routes::ClusterRoute;
use routewarden::vocabulary::RoutePath;

use crate::fixtures::{cluster_routes, PROTO_OURS};
use crate::netns::{count_routes, in_node_netns};
use crate::report::{fmt_ratio, kv, ms};
use crate::runs::{attach, nexthop_objects, rw_program_once, rw_program_once_nh, Listener};
use crate::{median, Benchmark, Options, Outcome, Shared, Target};

/// This benchmark's registry entry: its name and [`run`].
pub const BENCHMARK: Benchmark = Benchmark { name: "cold-program-10k", run };

/// The `ip route` arguments of a cluster route as routewarden programs it (protocol 80,
/// metric 1024, onlink), without the leading `route add`.
fn ip_route_args(r: &ClusterRoute) -> String {
    let gw = r.gateway.map(|g| g.to_string()).unwrap_or_default();
    let dev = if r.path == RoutePath::Tunnel { "tunl0" } else { "eth0" };
    format!("{} via {gw} dev {dev} proto {PROTO_OURS} metric 1024 onlink", r.dst)
}

/// An `ip -batch` file adding `routes`.
pub(crate) fn write_ip_batch(dir: &Path, routes: &[ClusterRoute]) -> Result<PathBuf> {
    let mut s = String::with_capacity(routes.len() * 80);
    for r in routes {
        let _ = writeln!(s, "route add {}", ip_route_args(r));
    }
    let path = dir.join("routes.batch");
    std::fs::write(&path, s)?;
    Ok(path)
}

/// `ip -batch` adds the same routes into a fresh namespace. Returns the wall time of the
/// `ip` process.
fn ip_batch_once(batch: PathBuf, n: usize) -> Result<Duration> {
    ip_batch_once_with(batch, n, Listener::Nothing).map(|(d, _)| d)
}

/// [`ip_batch_once`] with `listener` attached in the namespace first ([`attach`]). Returns the
/// wall time of the `ip` process and the watch's backend (empty without the watch).
pub(crate) fn ip_batch_once_with(batch: PathBuf, n: usize, listener: Listener) -> Result<(Duration, String)> {
    in_node_netns(move |rt| {
        // Held until `ip` is done; dropping it detaches the listener.
        let attached = attach(listener, rt)?;
        let backend = attached.backend();
        let t = Instant::now();
        let status = Command::new("ip").arg("-batch").arg(&batch).stdout(Stdio::null()).status()?;
        let took = t.elapsed();
        ensure!(status.success(), "ip -batch failed: {status}");
        let got = count_routes(PROTO_OURS)?;
        ensure!(got == n, "ip -batch left {got} routes, expected {n}");
        drop(attached);
        Ok((took, backend))
    })
}

/// Benchmark 1: routewarden's cold programming of 10,000 routes / `ip -batch` of the same;
/// nexthop mode's programming of the same routes / the same `ip -batch` as `ratio_nh`.
pub fn run(opts: &Options, shared: &mut Shared) -> Result<Outcome> {
    let routes = Arc::new(cluster_routes(opts.routes));
    let dir = tempfile::tempdir()?;
    let batch = write_ip_batch(dir.path(), &routes)?;
    let (mut rw, mut rw_nh, mut ipb) = (Vec::new(), Vec::new(), Vec::new());
    // Alternate, so slow phases of a noisy machine hit every side.
    for _ in 0..opts.runs {
        rw.push(rw_program_once(routes.clone())?);
        rw_nh.push(rw_program_once_nh(routes.clone())?);
        ipb.push(ip_batch_once(batch.clone(), routes.len())?);
    }
    let min = |v: &[Duration]| v.iter().min().copied().unwrap_or_default();
    let (rw_min, rw_nh_min, ip_min) = (min(&rw), min(&rw_nh), min(&ipb));
    let (rw, rw_nh, ipb) = (median(rw), median(rw_nh), median(ipb));
    shared.rw_program = Some((rw, opts.routes));
    shared.rw_program_nh = Some((rw_nh, opts.routes));
    Ok(Outcome::Measured {
        name: BENCHMARK.name.into(),
        ratio: rw.as_secs_f64() / ipb.as_secs_f64(),
        target: Target::AtMost(1.5),
        ok: true,
        details: vec![
            kv("routes", routes.len()),
            kv("rw_ms", ms(rw)),
            kv("ip_batch_ms", ms(ipb)),
            kv("rw_min_ms", ms(rw_min)),
            kv("ip_batch_min_ms", ms(ip_min)),
            kv("runs", opts.runs),
            kv("rw_nh_ms", ms(rw_nh)),
            kv("rw_nh_min_ms", ms(rw_nh_min)),
            kv("ratio_nh", fmt_ratio(rw_nh.as_secs_f64() / ipb.as_secs_f64())),
            kv("nexthop_objects", nexthop_objects(&routes)),
        ],
    })
}
