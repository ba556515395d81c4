//! `resync-100k` (benchmark 3): a no-change full resync of routewarden's 10,000 routes in a
//! table of 100,000, against `ip route show proto 80` of the same table. Target: at most 2, with
//! zero writes.

use std::fmt::Write as _;
use std::future::Future;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{ensure, Result};
use routewarden::dataplane::kernel_route::ObservedRoute;
use routewarden::dataplane::{DataplaneConfig, Family, LinkInfo, NetlinkError, Reconciler, RouteNetlink, RouteOp, RtNetlink, SystemClock};

use crate::fixtures::{cluster_routes, PROTO_OURS};
use crate::netns::{in_node_netns, ip};
use crate::report::{kv, ms};
use crate::{median, Benchmark, Options, Outcome, Shared, Target};

/// This benchmark's registry entry: its name and [`run`].
pub const BENCHMARK: Benchmark = Benchmark { name: "resync-100k", run };

/// [`RouteNetlink`] that counts what goes through it: route writes and deletes sent to the
/// kernel, and dumps.
pub struct Counting<N> {
    inner: N,
    /// Route writes and deletes handed to the kernel.
    pub ops: u64,
    /// Route dumps.
    pub dumps: u64,
}

impl<N> Counting<N> {
    /// Wrap `inner`.
    pub fn new(inner: N) -> Self {
        Counting { inner, ops: 0, dumps: 0 }
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

    fn dump_links(&mut self) -> impl Future<Output = Result<Vec<LinkInfo>, NetlinkError>> + Send {
        self.inner.dump_links()
    }

    fn execute(&mut self, ops: &[RouteOp]) -> impl Future<Output = Vec<Result<(), NetlinkError>>> + Send {
        self.ops += ops.len() as u64;
        self.inner.execute(ops)
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

/// Benchmark 3: a no-change full resync with `routes + foreign` routes in the table /
/// `ip route show proto 80` of the same table; zero writes required.
pub fn run(opts: &Options, _shared: &mut Shared) -> Result<Outcome> {
    let routes = Arc::new(cluster_routes(opts.routes));
    let dir = tempfile::tempdir()?;
    let foreign = write_foreign_batch(dir.path(), opts.foreign)?;
    let (runs, n, n_foreign) = (opts.runs, opts.routes, opts.foreign);
    let (rw_times, ip_times, writes, dumps, table) = in_node_netns(move |rt| {
        let status = Command::new("ip").arg("-batch").arg(&foreign).status()?;
        ensure!(status.success(), "ip -batch of the foreign routes failed");
        rt.block_on(async {
            let cfg = DataplaneConfig::default();
            let mut r = Reconciler::new(cfg.clone(), cfg.policy_owning(&["10.0.0.0/8"]), Counting::new(RtNetlink::connect()?), SystemClock);
            r.set_datastore_synced(true);
            r.set_desired(&routes);
            let rep = r.apply().await;
            ensure!(rep.writes == n as u64 && rep.error_count() == 0, "setup: {:?}", rep.error_messages);
            let table = ip("route show table main")?.lines().count();
            ensure!(table >= n + n_foreign, "{table} routes in the main table, expected at least {}", n + n_foreign);
            let (ops0, dumps0) = (r.netlink().ops, r.netlink().dumps);
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
            Ok((rw, ipd, r.netlink().ops - ops0, r.netlink().dumps - dumps0, table))
        })
    })?;
    let (rw, ip_show) = (median(rw_times), median(ip_times));
    Ok(Outcome::Measured {
        name: BENCHMARK.name.into(),
        ratio: rw.as_secs_f64() / ip_show.as_secs_f64(),
        target: Target::AtMost(2.0),
        ok: writes == 0,
        details: vec![
            kv("table_routes", table),
            kv("ours", opts.routes),
            kv("writes", writes),
            kv("rw_ms", ms(rw)),
            kv("ip_show_ms", ms(ip_show)),
            kv("route_dumps_per_resync", dumps / opts.runs as u64),
            kv("runs", opts.runs),
        ],
    })
}
