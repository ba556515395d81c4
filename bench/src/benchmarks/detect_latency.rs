//! `detect-latency` (benchmark 7): the time from a second writer overwriting one of our routes
//! until the churn watch's conflict event for it is in userspace. Target: p99 at most 10 ms.
//! Needs the embedded BPF object.

use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use routewarden::bpf::route_watch::RouteWatchEvent;
use routewarden::dataplane::kernel::route::to_kernel_route;
use routewarden::dataplane::{DataplaneConfig, RouteNetlink, RouteOp, RtNetlink};

use crate::fixtures::cluster_routes;
use crate::netns::in_node_netns;
use crate::report::kv;
use crate::runs::start_watch;
use crate::{Benchmark, Options, Outcome, Shared, Target};

/// This benchmark's registry entry: its name and [`run`].
pub const BENCHMARK: Benchmark = Benchmark { name: "detect-latency", run };

/// Benchmark 7: `conflicts` prefixes written by us (protocol 80), then each overwritten by a
/// second writer (another netlink socket, protocol 12, a replace); latency from just before
/// the second writer's request is sent until the watch's conflict event for that prefix is
/// received in userspace. Target p99 <= 10 ms.
pub fn run(opts: &Options, _shared: &mut Shared) -> Result<Outcome> {
    let name = BENCHMARK.name;
    if routewarden::bpf::embedded_object().is_none() {
        return Ok(Outcome::Skipped { name: name.into(), reason: "no BPF object embedded (`cargo xtask bench` builds one)".into() });
    }
    let n = opts.conflicts;
    let (mut lat, missed, backend) = in_node_netns(move |rt| {
        let (watch, mut rx) = start_watch(rt)?;
        let backend = watch.backend().to_string();
        let work = async move {
            let routes = cluster_routes(n);
            let mut ours = RtNetlink::connect()?;
            let mut other = RtNetlink::connect()?;
            let links = ours.dump_links().await?;
            let oif = |dev: Option<&str>| dev.and_then(|d| links.iter().find(|l| l.name == d).map(|l| l.index));
            let s80 = DataplaneConfig::default().route_settings();
            let s12 = routewarden::dataplane::RouteSettings { protocol: 12, ..s80.clone() };
            let mut writes = Vec::new();
            for r in &routes {
                let k = to_kernel_route(r, &s80)?.route;
                let o = oif(k.target.device.as_deref());
                writes.push(RouteOp::Write { route: k, oif: o, nexthop: None, exclusive: true });
            }
            for res in ours.execute(&writes).await {
                res?;
            }
            // Our own writes are no conflict; let their records pass.
            tokio::time::sleep(Duration::from_millis(200)).await;
            while rx.try_recv().is_ok() {}
            let (mut lat, mut missed) = (Vec::new(), 0usize);
            for r in &routes {
                let k = to_kernel_route(r, &s12)?.route;
                let op = RouteOp::Write { oif: oif(k.target.device.as_deref()), route: k, nexthop: None, exclusive: false };
                let t = Instant::now();
                for res in other.execute(std::slice::from_ref(&op)).await {
                    res?;
                }
                let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
                let got = loop {
                    match tokio::time::timeout_at(deadline, rx.recv()).await {
                        Ok(Some(RouteWatchEvent::Conflict { route, .. })) if route.dst == r.dst => break Some(t.elapsed()),
                        Ok(Some(_)) => {}
                        Ok(None) | Err(_) => break None,
                    }
                };
                match got {
                    Some(d) => lat.push(d),
                    None => missed += 1,
                }
            }
            Ok::<_, anyhow::Error>((lat, missed))
        };
        let (lat, missed) = rt.block_on(rt.spawn(work))??;
        drop(watch);
        Ok((lat, missed, backend))
    })?;
    ensure!(!lat.is_empty(), "no conflict event in {n} conflicts (backend {backend})");
    lat.sort();
    let pct = |p: f64| lat[((lat.len() - 1) as f64 * p).round() as usize];
    let (p50, p99) = (pct(0.50), pct(0.99));
    Ok(Outcome::Measured {
        name: name.into(),
        ratio: p99.as_secs_f64() / 0.010,
        target: Target::AtMost(1.0),
        ok: missed == 0,
        details: vec![
            kv("conflicts", n),
            kv("missed", missed),
            kv("p50_ms", format!("{:.3}", p50.as_secs_f64() * 1e3)),
            kv("p99_ms", format!("{:.3}", p99.as_secs_f64() * 1e3)),
            kv("max_ms", format!("{:.3}", lat[lat.len() - 1].as_secs_f64() * 1e3)),
            kv("target_p99_ms", 10),
            kv("backend", backend),
        ],
    })
}
