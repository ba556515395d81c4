//! `resync-100k` (benchmark 3): a no-change full resync of routewarden's 10,000 routes in a
//! table of 100,000, against `ip route show proto 80` of the same table. Target: at most 2, with
//! zero writes.
//!
//! Also in nexthop-object mode, in a namespace of its own: the same 10,000
//! routes through two nexthop objects (`nhid`), the same no-change resync; `_nh` keys, with
//! the target of at most 1.5 route dumps per resync in `met_nh` (the resync also dumps
//! the nexthop objects once: `nexthop_dumps_per_resync_nh`). The line's `ratio` and `met`
//! stay classic mode's (plus zero writes in nexthop mode).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::future::Future;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use routewarden::dataplane::kernel::route::ObservedRoute;
use routewarden::dataplane::{ChunkPlace, Executed, Family, LinkInfo, NetlinkError, NexthopOp, ObservedNexthop, Reconciler, RouteNetlink, RouteOp, RtNetlink, SystemClock};
use routewarden::routes::ClusterRoute;

use crate::fixtures::{cluster_routes, PROTO_OURS};
use crate::netns::{count_nhid_routes, in_node_netns, ip};
use crate::report::{fmt_ratio, kv, ms};
use crate::runs::{nexthop_objects, Mode};
use crate::{median, Benchmark, Options, Outcome, Shared, Target};

/// This benchmark's registry entry: its name and [`run`].
pub const BENCHMARK: Benchmark = Benchmark { name: "resync-100k", run };

/// [`RouteNetlink`] that counts what goes through it: route writes and deletes sent to the
/// kernel, route dumps, and the nexthop-object calls (forwarded too: the trait's defaults
/// would silently turn nexthop mode off).
pub struct Counting<N> {
    inner: N,
    /// Route writes and deletes handed to the kernel.
    pub ops: u64,
    /// Route dumps (one per request: a family, or both families at once).
    pub dumps: u64,
    /// Nexthop object writes and deletes handed to the kernel.
    pub nexthop_ops: u64,
    /// Nexthop object dumps.
    pub nexthop_dumps: u64,
    /// Checks which nexthop objects a route of any table goes through (each a route dump of
    /// every table, per family, inside the collaborator).
    pub in_use_checks: u64,
}

impl<N> Counting<N> {
    /// Wrap `inner`.
    pub fn new(inner: N) -> Self {
        Counting { inner, ops: 0, dumps: 0, nexthop_ops: 0, nexthop_dumps: 0, in_use_checks: 0 }
    }
}

impl<N: RouteNetlink> RouteNetlink for Counting<N> {
    fn dump_routes(
        &mut self,
        family: Family,
        table: u32,
        protocol: u8,
    ) -> impl Future<Output = Result<Vec<ObservedRoute>, NetlinkError>> + Send {
        self.dumps += 1;
        self.inner.dump_routes(family, table, protocol)
    }

    fn dump_routes_both_families(&mut self, table: u32, protocol: u8) -> impl Future<Output = Result<Vec<ObservedRoute>, NetlinkError>> + Send {
        self.dumps += 1;
        self.inner.dump_routes_both_families(table, protocol)
    }

    fn dump_links(&mut self) -> impl Future<Output = Result<Vec<LinkInfo>, NetlinkError>> + Send {
        self.inner.dump_links()
    }

    fn execute(&mut self, ops: &[RouteOp]) -> impl Future<Output = Vec<Result<(), NetlinkError>>> + Send {
        self.ops += ops.len() as u64;
        self.inner.execute(ops)
    }

    fn write_chunk(&self) -> usize {
        self.inner.write_chunk()
    }

    fn execute_chunk(&mut self, ops: Vec<RouteOp>, place: ChunkPlace) -> impl Future<Output = Vec<Executed>> + Send {
        self.ops += ops.len() as u64;
        self.inner.execute_chunk(ops, place)
    }

    fn dump_nexthops(&mut self) -> impl Future<Output = Result<Vec<ObservedNexthop>, NetlinkError>> + Send {
        self.nexthop_dumps += 1;
        self.inner.dump_nexthops()
    }

    fn execute_nexthops(&mut self, ops: &[NexthopOp]) -> impl Future<Output = Vec<Result<(), NetlinkError>>> + Send {
        self.nexthop_ops += ops.len() as u64;
        self.inner.execute_nexthops(ops)
    }

    fn nexthops_in_use(&mut self, ids: &[u32]) -> impl Future<Output = Result<BTreeSet<u32>, NetlinkError>> + Send {
        self.in_use_checks += 1;
        self.inner.nexthops_in_use(ids)
    }
}

/// `n` routes of other writers (static, boot, BIRD, protocol 17), /24s in 20.0.0.0/8 and up,
/// as an `ip -batch` file.
fn write_foreign_batch(dir: &Path, n: usize) -> Result<PathBuf> {
    let mut s = String::with_capacity(n * 64);
    for i in 0..n {
        let base = u32::from(Ipv4Addr::new(20, 0, 0, 0)) + (i as u32) * 256;
        let proto = ["static", "boot", "bird", "17"][i % 4];
        let _ = writeln!(s, "route add {}/24 via 10.0.0.1 dev eth0 proto {proto}", Ipv4Addr::from(base));
    }
    let path = dir.join("foreign.batch");
    std::fs::write(&path, s)?;
    Ok(path)
}

/// What one mode's side of benchmark 3 measured: the resync and `ip route show` times of each
/// run, and what went through the [`Counting`] wrapper during the resyncs (setup excluded).
struct Side {
    /// Wall time of each no-change resync.
    rw: Vec<Duration>,
    /// Wall time of each `ip route show proto 80`.
    ip_show: Vec<Duration>,
    /// Route writes and deletes during the resyncs (must be 0).
    writes: u64,
    /// Nexthop object writes and deletes during the resyncs (must be 0).
    nexthop_ops: u64,
    /// Route dumps during the resyncs.
    dumps: u64,
    /// Nexthop dumps during the resyncs.
    nexthop_dumps: u64,
    /// Nexthop in-use checks during the resyncs.
    in_use_checks: u64,
    /// Routes in the main table after the setup.
    table: usize,
}

/// One mode's side: a fresh namespace with the `foreign` batch and `routes` programmed by
/// routewarden in `mode` (in nexthop mode every route checked to carry `nhid`), then `runs`
/// no-change resyncs, each after an `ip route show proto 80`.
fn measure(mode: Mode, routes: Arc<Vec<ClusterRoute>>, foreign: PathBuf, runs: usize, n_foreign: usize) -> Result<Side> {
    let n = routes.len();
    in_node_netns(move |rt| {
        let status = Command::new("ip").arg("-batch").arg(&foreign).status()?;
        ensure!(status.success(), "ip -batch of the foreign routes failed");
        rt.block_on(async {
            let cfg = mode.config();
            let mut r = Reconciler::new(cfg.clone(), cfg.policy_owning(&["10.0.0.0/8"]), Counting::new(RtNetlink::connect()?), SystemClock);
            r.set_datastore_synced(true);
            r.set_desired(&routes);
            let rep = r.apply().await;
            ensure!(rep.writes == n as u64 && rep.error_count() == 0, "setup: {:?}", rep.error_messages);
            if mode == Mode::Nexthops {
                let objects = nexthop_objects(&routes) as u64;
                ensure!(rep.nexthop_writes == objects, "setup wrote {} nexthop objects, expected {objects}", rep.nexthop_writes);
                let via_nh = count_nhid_routes(PROTO_OURS)?;
                ensure!(via_nh == n, "{via_nh} of {n} routes of ours go through a nexthop object");
            }
            let table = ip("route show table main")?.lines().count();
            ensure!(table >= n + n_foreign, "{table} routes in the main table, expected at least {}", n + n_foreign);
            let c = r.netlink();
            let before = (c.ops, c.nexthop_ops, c.dumps, c.nexthop_dumps, c.in_use_checks);
            let (mut rw, mut ipd) = (Vec::new(), Vec::new());
            for _ in 0..runs {
                let t = Instant::now();
                let status = Command::new("ip").args(["route", "show", "proto", PROTO_OURS]).stdout(Stdio::null()).status()?;
                ipd.push(t.elapsed());
                ensure!(status.success());
                r.request_resync();
                let t = Instant::now();
                let rep = r.apply().await;
                rw.push(t.elapsed());
                ensure!(rep.resynced && rep.error_count() == 0, "resync failed: {:?}", rep.error_messages);
                ensure!(rep.kernel_routes == n, "resync found {} routes of ours, expected {n}", rep.kernel_routes);
            }
            let c = r.netlink();
            Ok(Side {
                rw,
                ip_show: ipd,
                writes: c.ops - before.0,
                nexthop_ops: c.nexthop_ops - before.1,
                dumps: c.dumps - before.2,
                nexthop_dumps: c.nexthop_dumps - before.3,
                in_use_checks: c.in_use_checks - before.4,
                table,
            })
        })
    })
}

/// Benchmark 3: a no-change full resync with `routes + foreign` routes in the table /
/// `ip route show proto 80` of the same table; zero writes required. Then the same with our
/// routes through nexthop objects (`_nh` keys, in a namespace of its own; `met_nh`: ratio at
/// most 2, zero writes of routes and objects, at most 1.5 route dumps per resync).
pub fn run(opts: &Options, _shared: &mut Shared) -> Result<Outcome> {
    let routes = Arc::new(cluster_routes(opts.routes));
    let dir = tempfile::tempdir()?;
    let foreign = write_foreign_batch(dir.path(), opts.foreign)?;
    let classic = measure(Mode::Classic, Arc::clone(&routes), foreign.clone(), opts.runs, opts.foreign)?;
    let nh = measure(Mode::Nexthops, routes, foreign, opts.runs, opts.foreign)?;
    let (rw, ip_show) = (median(classic.rw), median(classic.ip_show));
    let (rw_nh, ip_show_nh) = (median(nh.rw), median(nh.ip_show));
    let target = Target::AtMost(2.0);
    let ratio_nh = rw_nh.as_secs_f64() / ip_show_nh.as_secs_f64();
    let runs = opts.runs as f64;
    let dumps_nh = nh.dumps as f64 / runs;
    let met_nh = target.met(ratio_nh) && nh.writes == 0 && nh.nexthop_ops == 0 && dumps_nh <= 1.5;
    Ok(Outcome::Measured {
        name: BENCHMARK.name.into(),
        ratio: rw.as_secs_f64() / ip_show.as_secs_f64(),
        target,
        ok: classic.writes == 0 && nh.writes == 0 && nh.nexthop_ops == 0,
        details: vec![
            kv("table_routes", classic.table),
            kv("ours", opts.routes),
            kv("writes", classic.writes),
            kv("rw_ms", ms(rw)),
            kv("ip_show_ms", ms(ip_show)),
            kv("route_dumps_per_resync", classic.dumps / opts.runs as u64),
            kv("runs", opts.runs),
            kv("ratio_nh", fmt_ratio(ratio_nh)),
            kv("met_nh", if met_nh { "yes" } else { "no" }),
            kv("table_routes_nh", nh.table),
            kv("writes_nh", nh.writes),
            kv("nexthop_writes_nh", nh.nexthop_ops),
            kv("rw_nh_ms", ms(rw_nh)),
            kv("ip_show_nh_ms", ms(ip_show_nh)),
            kv("route_dumps_per_resync_nh", format!("{dumps_nh:.2}")),
            kv("nexthop_dumps_per_resync_nh", format!("{:.2}", nh.nexthop_dumps as f64 / runs)),
            kv("in_use_checks_nh", nh.in_use_checks),
        ],
    })
}
