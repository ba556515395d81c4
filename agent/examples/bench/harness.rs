//! The benchmarks behind `cargo xtask bench` (issue 10), in one file so that
//! `agent/tests/bench_smoke.rs` can include it with `#[path]` and run a tiny instance.
//!
//! Every measurement runs in a fresh network namespace ([`in_node_netns`]) or in a throw-away
//! lab ([`Lab`]); nothing touches the namespace the process started in. Each measurement is
//! repeated [`Options::runs`] times and the median is used: the machines are noisy, the
//! ratio against a reference measured in the same run is the figure that matters.

#![allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "figures are printed with a few significant digits")]

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::fmt::Write as _;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use ipnet::IpNet;
use routewarden::bpf::forward::{ForwardConfig, ForwardEntry, ForwardWatch};
use routewarden::bpf::route_watch::{RouteWatch, RouteWatchConfig, RouteWatchEvent};
use routewarden::dataplane::kernel_route::to_kernel_route;
use routewarden::dataplane::{
    spawn_watcher, DataplaneConfig, DataplaneEvent, Family, LinkInfo, NetlinkError, Reconciler, RouteNetlink, RouteOp, RtNetlink, SystemClock,
};
use routewarden::model::{Affinity, AllocationAttributes, Cluster, EncapMode, IpPool, IpamBlock, Node, NodeForm};
use routewarden::routes::{desired_routes, ClusterRoute, PoolClass, RouteDevices, RouteOrigin, RoutePath};
use routewarden_common::forward::ForwardPath;
use routewarden_lab::{Lab, LabNodeSpec, LabSpec, NetNsGuard};

/// Every benchmark, in the order a run of all of them goes.
pub const ALL: [&str; 11] = [
    "cold-program-10k",
    "cold-program-vs-bird",
    "resync-100k",
    "compute-100k",
    "watch-overhead",
    "tc-overhead",
    "detect-latency",
    "agent-footprint",
    "bad-input-worst",
    "all-nodes-5k",
    "kube-heartbeats",
];

/// BIRD 2 (Debian `bird2`).
pub const BIRD: &str = "/usr/sbin/bird";

/// Route protocol of routewarden's routes in every benchmark (the default, Felix's 80).
const PROTO_OURS: &str = "80";

/// Sizes and knobs of a run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Repetitions of each measurement; the median is reported.
    pub runs: usize,
    /// Cluster routes programmed by benchmarks 1-3 (10,000).
    pub routes: usize,
    /// Routes of other writers in the table of benchmark 3 (90,000: 100,000 in all).
    pub foreign: usize,
    /// Nodes, IPAM blocks and borrowed IPs of benchmark 4 (5,000 / 100,000 / 10,000); nodes
    /// and blocks of `all-nodes-5k` too.
    pub compute: ComputeSize,
    /// Conflicts timed by benchmark 7 (1,000).
    pub conflicts: usize,
    /// Nodes of the cluster of benchmark 8 (its node gets `routes` routes).
    pub footprint_nodes: usize,
    /// Idle window of benchmark 8 (60 s; 10 s with `--quick`).
    pub idle: Duration,
    /// Length of each UDP stream of benchmark 6 (2 s).
    pub stream: Duration,
    /// The release agent binary for benchmark 8 (`target/release/routewarden`).
    pub agent_bin: Option<PathBuf>,
    /// This harness's own binary, re-executed for the compute-only child of benchmark 4;
    /// `None` computes in-process (peak memory then includes the harness).
    pub child_exe: Option<PathBuf>,
}

/// The cluster of benchmark 4.
#[derive(Clone, Copy, Debug)]
pub struct ComputeSize {
    /// Nodes.
    pub nodes: usize,
    /// IPAM blocks (/26), spread round-robin over the nodes, half in an IPIP CrossSubnet pool,
    /// half in a no-encap pool.
    pub blocks: usize,
    /// Blocks with one IP borrowed by another node (a /32 route each).
    pub borrowed: usize,
}

impl Options {
    /// The sizes issue 10 names.
    pub fn full() -> Options {
        Options {
            runs: 5,
            routes: 10_000,
            foreign: 90_000,
            compute: ComputeSize { nodes: 5_000, blocks: 100_000, borrowed: 10_000 },
            conflicts: 1_000,
            footprint_nodes: 500,
            idle: Duration::from_mins(1),
            stream: Duration::from_secs(2),
            agent_bin: None,
            child_exe: None,
        }
    }

    /// A run small enough for a smoke test (well-formed lines, not figures).
    pub fn tiny() -> Options {
        Options {
            runs: 1,
            routes: 100,
            foreign: 900,
            compute: ComputeSize { nodes: 50, blocks: 1_000, borrowed: 100 },
            conflicts: 20,
            footprint_nodes: 10,
            idle: Duration::from_secs(1),
            stream: Duration::from_millis(200),
            agent_bin: None,
            child_exe: None,
        }
    }
}

/// Which way a ratio must go.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Target {
    /// ratio <= value.
    AtMost(f64),
    /// ratio >= value.
    AtLeast(f64),
}

impl Target {
    /// Whether `ratio` meets the target.
    pub fn met(self, ratio: f64) -> bool {
        match self {
            Target::AtMost(t) => ratio <= t,
            Target::AtLeast(t) => ratio >= t,
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::AtMost(t) => write!(f, "<={t}"),
            Target::AtLeast(t) => write!(f, ">={t}"),
        }
    }
}

/// What one benchmark produced.
#[derive(Clone, Debug)]
pub enum Outcome {
    /// A measurement.
    Measured {
        /// Benchmark name.
        name: String,
        /// The ratio the target applies to.
        ratio: f64,
        /// The target.
        target: Target,
        /// False when a side condition failed (e.g. writes during a no-change resync), even if
        /// the ratio is within the target.
        ok: bool,
        /// `key=value` details, units in the key (`_ms`, `_mb`, `_pct`).
        details: Vec<(String, String)>,
    },
    /// Not run, and why.
    Skipped {
        /// Benchmark name.
        name: String,
        /// Why.
        reason: String,
    },
    /// The benchmark could not run to the end.
    Failed {
        /// Benchmark name.
        name: String,
        /// The error.
        reason: String,
    },
}

impl fmt::Display for Outcome {
    /// The one line a benchmark prints: `bench <name> ratio=<value> target=<value> <details>`
    /// (or `bench <name> skipped reason="..."` / `bench <name> failed reason="..."`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Measured { name, ratio, target, ok, details } => {
                let met = *ok && target.met(*ratio);
                write!(f, "bench {name} ratio={} target={target} met={}", fmt_ratio(*ratio), if met { "yes" } else { "no" })?;
                for (k, v) in details {
                    write!(f, " {k}={v}")?;
                }
                Ok(())
            }
            Outcome::Skipped { name, reason } => write!(f, "bench {name} skipped reason={reason:?}"),
            Outcome::Failed { name, reason } => write!(f, "bench {name} failed reason={reason:?}"),
        }
    }
}

/// Three significant digits, at least three decimals below 1.
fn fmt_ratio(r: f64) -> String {
    if r.abs() >= 100.0 {
        format!("{r:.0}")
    } else if r.abs() >= 10.0 {
        format!("{r:.1}")
    } else if r.abs() >= 1.0 {
        format!("{r:.2}")
    } else {
        format!("{r:.4}")
    }
}

/// Milliseconds with two decimals.
fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

fn kv(k: &str, v: impl fmt::Display) -> (String, String) {
    (k.to_string(), v.to_string())
}

/// The median (upper median for an even count).
pub fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// Figures measured earlier in the same run, reused by later benchmarks.
#[derive(Debug, Default)]
pub struct Shared {
    /// Median time of routewarden's cold programming of `routes` routes (benchmark 1).
    pub rw_program: Option<(Duration, usize)>,
}

// ---------------------------------------------------------------------------------------
// Namespaces and routes
// ---------------------------------------------------------------------------------------

/// Run `ip <args>` (whitespace-split) in the calling thread's namespace; stdout.
fn ip(args: &str) -> Result<String> {
    let out = Command::new("ip").args(args.split_whitespace()).output().context("run ip")?;
    ensure!(out.status.success(), "ip {args}: {}", String::from_utf8_lossy(&out.stderr).trim());
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// IPv4 routes of the main table with protocol `proto` in the calling thread's namespace.
fn count_routes(proto: &str) -> Result<usize> {
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

/// `n` cluster routes of node-a's kind: /26 blocks `10.128.0.0/26`, `10.128.0.64/26`, ...,
/// alternately through the tunnel to 10.0.1.13 (IPIP, other subnet) and through the host NIC
/// to 10.0.0.12 (no-encap, same subnet).
pub fn cluster_routes(n: usize) -> Vec<ClusterRoute> {
    (0..n)
        .map(|i| {
            let base = u32::from(Ipv4Addr::new(10, 128, 0, 0)) + (i as u32) * 64;
            let dst: IpNet = format!("{}/26", Ipv4Addr::from(base)).parse().expect("valid CIDR");
            let (path, gw, class) =
                if i % 2 == 0 { (RoutePath::Tunnel, [10, 0, 1, 13], PoolClass::Ipip) } else { (RoutePath::HostNic, [10, 0, 0, 12], PoolClass::NoEncap) };
            ClusterRoute {
                dst,
                path,
                gateway: Some(IpAddr::from(gw)),
                device: None,
                class,
                pool: "bench".into(),
                origin: RouteOrigin::RemoteBlock { block: dst.to_string(), node: "node-x".into() },
            }
        })
        .collect()
}

/// The `ip route` arguments of a cluster route as routewarden programs it (protocol 80,
/// metric 1024, onlink), without the leading `route add`.
fn ip_route_args(r: &ClusterRoute) -> String {
    let gw = r.gateway.map(|g| g.to_string()).unwrap_or_default();
    let dev = if r.path == RoutePath::Tunnel { "tunl0" } else { "eth0" };
    format!("{} via {gw} dev {dev} proto {PROTO_OURS} metric 1024 onlink", r.dst)
}

/// An `ip -batch` file adding `routes`.
fn write_ip_batch(dir: &Path, routes: &[ClusterRoute]) -> Result<PathBuf> {
    let mut s = String::with_capacity(routes.len() * 80);
    for r in routes {
        let _ = writeln!(s, "route add {}", ip_route_args(r));
    }
    let path = dir.join("routes.batch");
    std::fs::write(&path, s)?;
    Ok(path)
}

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
    ) -> impl Future<Output = Result<Vec<routewarden::dataplane::kernel_route::ObservedRoute>, NetlinkError>> + Send {
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

// ---------------------------------------------------------------------------------------
// 1. cold-program-10k
// ---------------------------------------------------------------------------------------

/// routewarden programs `routes` into the empty main table of a fresh namespace: connect,
/// set the desired set, one apply (its first resync included), in a task spawned on a
/// runtime shaped like the agent's. Returns the wall time.
fn rw_program_once(routes: Arc<Vec<ClusterRoute>>) -> Result<Duration> {
    rw_program_once_with(routes, false).map(|(d, _)| d)
}

/// [`rw_program_once`], with the churn watch attached first when `watch` is set (its events
/// drained by a task, as the agent does). Returns the time and the watch's backend.
fn rw_program_once_with(routes: Arc<Vec<ClusterRoute>>, watch: bool) -> Result<(Duration, String)> {
    in_node_netns(move |rt| {
        let n = routes.len();
        // Held until the programming is done; dropping it detaches the watch.
        let attached = if watch { Some(start_watch(rt)?) } else { None };
        let backend = attached.as_ref().map(|(w, _)| w.backend().to_string()).unwrap_or_default();
        let work = async move {
            let cfg = DataplaneConfig::default();
            let t = Instant::now();
            let mut r = Reconciler::new(cfg.clone(), cfg.policy_owning(&["10.0.0.0/8"]), RtNetlink::connect()?, SystemClock);
            r.set_datastore_synced(true);
            r.set_desired(&routes);
            let rep = r.apply().await;
            let took = t.elapsed();
            ensure!(
                rep.writes == routes.len() as u64 && rep.error_count() == 0,
                "routewarden wrote {} of {} routes: {:?}",
                rep.writes,
                routes.len(),
                rep.error_messages
            );
            Ok(took)
        };
        // A spawned task on the multi-thread runtime, as the agent runs `dataplane::run`.
        let took = rt.block_on(rt.spawn(work))??;
        let got = count_routes(PROTO_OURS)?;
        ensure!(got == n, "{got} routes of protocol {PROTO_OURS} in the kernel, expected {n}");
        drop(attached);
        Ok((took, backend))
    })
}

/// Start the churn watch in the calling thread's namespace as the agent does (best backend,
/// our protocol classified `self`), with its events going to the returned receiver.
fn start_watch(rt: &tokio::runtime::Runtime) -> Result<(RouteWatch, tokio::sync::mpsc::Receiver<RouteWatchEvent>)> {
    let object = routewarden::bpf::embedded_object().context("no BPF object embedded (build with `cargo xtask bench`)")?;
    let config = RouteWatchConfig { self_protocol: 80, ..RouteWatchConfig::default() };
    let mut w = RouteWatch::start(object, &config).map_err(|e| anyhow!("start the route watch: {e}"))?;
    let (tx, rx) = tokio::sync::mpsc::channel(100_000);
    let _enter = rt.enter();
    w.spawn_reader(tx).map_err(|e| anyhow!("route watch reader: {e}"))?;
    Ok((w, rx))
}

/// `ip -batch` adds the same routes into a fresh namespace. Returns the wall time of the
/// `ip` process.
fn ip_batch_once(batch: PathBuf, n: usize) -> Result<Duration> {
    in_node_netns(move |_| {
        let t = Instant::now();
        let status = Command::new("ip").arg("-batch").arg(&batch).stdout(Stdio::null()).status()?;
        let took = t.elapsed();
        ensure!(status.success(), "ip -batch failed: {status}");
        let got = count_routes(PROTO_OURS)?;
        ensure!(got == n, "ip -batch left {got} routes, expected {n}");
        Ok(took)
    })
}

/// Median of routewarden's cold programming, measured now or taken from earlier in the run.
fn rw_program_median(opts: &Options, shared: &mut Shared) -> Result<Duration> {
    if let Some((d, n)) = shared.rw_program {
        if n == opts.routes {
            return Ok(d);
        }
    }
    let routes = Arc::new(cluster_routes(opts.routes));
    let mut rw = Vec::new();
    for _ in 0..opts.runs {
        rw.push(rw_program_once(routes.clone())?);
    }
    let d = median(rw);
    shared.rw_program = Some((d, opts.routes));
    Ok(d)
}

/// Benchmark 1: routewarden's cold programming of 10,000 routes / `ip -batch` of the same.
pub fn cold_program(opts: &Options, shared: &mut Shared) -> Result<Outcome> {
    let routes = Arc::new(cluster_routes(opts.routes));
    let dir = tempfile::tempdir()?;
    let batch = write_ip_batch(dir.path(), &routes)?;
    let (mut rw, mut ipb) = (Vec::new(), Vec::new());
    // Alternate, so slow phases of a noisy machine hit both sides.
    for _ in 0..opts.runs {
        rw.push(rw_program_once(routes.clone())?);
        ipb.push(ip_batch_once(batch.clone(), routes.len())?);
    }
    let (rw_min, ip_min) = (rw.iter().min().copied().unwrap_or_default(), ipb.iter().min().copied().unwrap_or_default());
    let (rw, ipb) = (median(rw), median(ipb));
    shared.rw_program = Some((rw, opts.routes));
    Ok(Outcome::Measured {
        name: "cold-program-10k".into(),
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
        ],
    })
}

// ---------------------------------------------------------------------------------------
// 2. cold-program-vs-bird
// ---------------------------------------------------------------------------------------

/// A BIRD 2 configuration: a static protocol with `routes`, exported to the kernel's main
/// table with metric 1024 (as Calico's BIRD does), device scan, nothing imported.
fn bird_config(dir: &Path, routes: &[ClusterRoute]) -> String {
    let mut s = String::with_capacity(routes.len() * 60 + 512);
    let _ = writeln!(s, "log \"{}\" {{ info, remote, warning, error, auth, fatal, bug }};", dir.join("bird.log").display());
    s.push_str(
        "router id 10.0.0.11;\n\
         protocol device { }\n\
         protocol kernel {\n  ipv4 { import none; export all; };\n  metric 1024;\n  learn off;\n}\n\
         protocol static {\n  ipv4;\n",
    );
    for r in routes {
        let gw = r.gateway.map(|g| g.to_string()).unwrap_or_default();
        let dev = if r.path == RoutePath::Tunnel { "tunl0" } else { "eth0" };
        let _ = writeln!(s, "  route {} via {gw}%{dev} onlink;", r.dst);
    }
    s.push_str("}\n");
    s
}

/// Start BIRD in a fresh namespace and time from the spawn until all `n` routes of protocol
/// `bird` are in the kernel, counted from route notifications (a dump loop if the
/// notification socket overruns). Returns the time and whether the fallback was used.
fn bird_once(conf: PathBuf, dir: PathBuf, n: usize) -> Result<(Duration, bool)> {
    in_node_netns(move |rt| {
        let sock = dir.join("bird.ctl");
        let _ = std::fs::remove_file(&sock);
        let result = rt.block_on(async {
            let (tx, mut rx) = tokio::sync::mpsc::channel(200_000);
            let watcher = spawn_watcher(tx)?;
            let t0 = Instant::now();
            let mut child = Command::new(BIRD)
                .arg("-f")
                .arg("-c")
                .arg(&conf)
                .arg("-s")
                .arg(&sock)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .with_context(|| format!("start {BIRD}"))?;
            let deadline = tokio::time::Instant::now() + Duration::from_mins(2);
            let mut seen: HashSet<IpNet> = HashSet::new();
            let mut overrun = false;
            let outcome: Result<Duration> = async {
                while seen.len() < n {
                    match tokio::time::timeout_at(deadline, rx.recv()).await {
                        Ok(Some(DataplaneEvent::RouteAdded { route, .. })) if route.protocol == 12 => {
                            seen.insert(route.key.dst);
                        }
                        Ok(Some(DataplaneEvent::RouteRemoved { route, .. })) if route.protocol == 12 => {
                            seen.remove(&route.key.dst);
                        }
                        Ok(Some(DataplaneEvent::Overrun)) => {
                            overrun = true;
                            break;
                        }
                        Ok(Some(_)) => {}
                        Ok(None) => bail!("the route watcher stopped"),
                        Err(_) => bail!("only {} of {n} BIRD routes in the kernel after 120 s", seen.len()),
                    }
                }
                if overrun {
                    while count_routes("bird")? < n {
                        ensure!(tokio::time::Instant::now() < deadline, "BIRD routes incomplete after 120 s");
                        if let Some(status) = child.try_wait()? {
                            bail!("bird exited early: {status}");
                        }
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                }
                Ok(t0.elapsed())
            }
            .await;
            watcher.abort();
            let in_kernel = count_routes("bird");
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(0)), nix::sys::signal::Signal::SIGTERM);
            let _ = child.wait();
            let took = outcome?;
            let in_kernel = in_kernel?;
            ensure!(in_kernel == n, "{in_kernel} BIRD routes in the kernel, expected {n}");
            Ok((took, overrun))
        });
        result
    })
}

/// Benchmark 2: BIRD's time from start until all routes are in the kernel / routewarden's
/// cold programming (benchmark 1's median, measured now if not yet).
pub fn vs_bird(opts: &Options, shared: &mut Shared) -> Result<Outcome> {
    if !Path::new(BIRD).exists() {
        return Ok(Outcome::Skipped {
            name: "cold-program-vs-bird".into(),
            reason: format!("{BIRD} not installed (Debian bird2; `cargo xtask test` installs it)"),
        });
    }
    let routes = cluster_routes(opts.routes);
    let dir = tempfile::tempdir()?;
    let conf = dir.path().join("bird.conf");
    std::fs::write(&conf, bird_config(dir.path(), &routes))?;
    let mut bird = Vec::new();
    let mut fallbacks = 0;
    for _ in 0..opts.runs {
        let (d, overrun) = bird_once(conf.clone(), dir.path().to_path_buf(), routes.len())?;
        bird.push(d);
        fallbacks += usize::from(overrun);
    }
    let bird = median(bird);
    let rw = rw_program_median(opts, shared)?;
    Ok(Outcome::Measured {
        name: "cold-program-vs-bird".into(),
        ratio: bird.as_secs_f64() / rw.as_secs_f64(),
        target: Target::AtLeast(2.0),
        ok: true,
        details: vec![
            kv("routes", routes.len()),
            kv("bird_ms", ms(bird)),
            kv("rw_ms", ms(rw)),
            kv("bird_watch", if fallbacks == 0 { "notifications" } else { "dump-loop" }),
            kv("runs", opts.runs),
        ],
    })
}

// ---------------------------------------------------------------------------------------
// 3. resync-100k
// ---------------------------------------------------------------------------------------

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
pub fn resync(opts: &Options) -> Result<Outcome> {
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
        name: "resync-100k".into(),
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

// ---------------------------------------------------------------------------------------
// 4. compute-100k
// ---------------------------------------------------------------------------------------

fn v4(a: u32) -> Ipv4Addr {
    Ipv4Addr::from(a)
}

/// A cluster of `size.nodes` nodes (BGP addresses 172.16.x.y/24, 250 per subnet, so
/// CrossSubnet matters), `size.blocks` /26 blocks round-robin over the nodes (first half in
/// the IPIP CrossSubnet pool 10.0.0.0/9, second half in the no-encap pool 10.128.0.0/9) and
/// `size.borrowed` blocks with one IP borrowed by the next node; each node's IPIP tunnel
/// address is the first IP of its first block. Built in code, not parsed.
pub fn compute_cluster(size: ComputeSize) -> Cluster {
    let mut c = Cluster::default();
    let pool = |name: &str, cidr: &str, ipip: EncapMode| IpPool {
        name: name.into(),
        cidr: cidr.parse().expect("valid CIDR"),
        ipip_mode: ipip,
        vxlan_mode: EncapMode::Never,
        nat_outgoing: true,
        disabled: false,
        disable_bgp_export: false,
        block_size: 26,
        allowed_uses: Vec::new(),
        node_selector: "all()".into(),
    };
    c.ip_pools.insert("ipip".into(), pool("ipip", "10.0.0.0/9", EncapMode::CrossSubnet));
    c.ip_pools.insert("flat".into(), pool("flat", "10.128.0.0/9", EncapMode::Never));
    let node_name = |i: usize| format!("node-{i:05}");
    for i in 0..size.nodes {
        let addr = u32::from(Ipv4Addr::new(172, 16, 0, 0)) + ((i / 250) as u32) * 256 + (i % 250) as u32 + 1;
        let name = node_name(i);
        c.nodes.insert(
            name.clone(),
            Node {
                name,
                form: NodeForm::Calico,
                bgp_ipv4: Some(format!("{}/24", v4(addr)).parse().expect("valid CIDR")),
                bgp_ipv4_has_prefix: true,
                bgp_ipv6: None,
                bgp_ipv6_has_prefix: false,
                as_number: None,
                // Calico's IPIP tunnel address: the first IP of the node's first block (block
                // i of the IPIP pool), so the tunnel-address rule (issue 21) runs per node.
                ipv4_ipip_tunnel_addr: (i < size.blocks.div_ceil(2)).then(|| IpAddr::V4(v4(u32::from(Ipv4Addr::new(10, 0, 0, 0)) + (i as u32) * 64))),
                ipv4_vxlan_tunnel_addr: None,
                ipv6_vxlan_tunnel_addr: None,
                wireguard_ipv4: None,
                wireguard_ipv6: None,
                addresses: Vec::new(),
            },
        );
    }
    let half = size.blocks.div_ceil(2);
    let every = (size.blocks / size.borrowed.max(1)).max(1);
    let mut borrowed = 0;
    for j in 0..size.blocks {
        let base =
            if j < half { u32::from(Ipv4Addr::new(10, 0, 0, 0)) + (j as u32) * 64 } else { u32::from(Ipv4Addr::new(10, 128, 0, 0)) + ((j - half) as u32) * 64 };
        let cidr: IpNet = format!("{}/26", v4(base)).parse().expect("valid CIDR");
        let name = format!("{}-26", v4(base).to_string().replace('.', "-"));
        let owner = j % size.nodes.max(1);
        let (allocations, attributes) = if borrowed < size.borrowed && j % every == 0 {
            borrowed += 1;
            let user = (owner + 1) % size.nodes.max(1);
            let attrs =
                AllocationAttributes { handle_id: Some(format!("k8s-pod-network.{j}")), secondary: BTreeMap::from([("node".to_string(), node_name(user))]) };
            (vec![None, None, None, None, None, Some(0)], vec![attrs])
        } else {
            (Vec::new(), Vec::new())
        };
        c.ipam_blocks.insert(name.clone(), IpamBlock { name, cidr, affinity: Some(Affinity::Host(node_name(owner))), allocations, attributes, deleted: false });
    }
    c
}

/// `VmHWM` (peak RSS) and `VmRSS` of `/proc/<pid>/status`, in KiB.
pub fn proc_mem_kib(pid: &str) -> Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> Result<u64> {
        let line = status.lines().find(|l| l.starts_with(name)).with_context(|| format!("no {name} in /proc/{pid}/status"))?;
        Ok(line.split_whitespace().nth(1).context("malformed line")?.parse()?)
    };
    Ok((field("VmHWM:")?, field("VmRSS:")?))
}

/// What the compute-only process measured.
#[derive(Clone, Copy, Debug)]
pub struct ComputeFigures {
    /// Routes computed.
    pub routes: usize,
    /// Median time of one `desired_routes`.
    pub median: Duration,
    /// Peak RSS after the cluster was built, before computing (KiB).
    pub model_peak_kib: u64,
    /// Peak RSS after computing (KiB).
    pub peak_kib: u64,
}

/// Build the cluster, compute node-00000's routes `runs` times. What the compute-only child
/// runs (and the smoke test, in-process).
pub fn compute_in_process(size: ComputeSize, runs: usize) -> Result<ComputeFigures> {
    let cluster = compute_cluster(size);
    let classes = BTreeSet::from([PoolClass::Ipip, PoolClass::NoEncap]);
    let devices = RouteDevices::default();
    let (model_peak_kib, _) = proc_mem_kib("self")?;
    let mut times = Vec::new();
    let mut routes = 0;
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        let d = desired_routes(&cluster, "node-00000", &classes, &devices);
        times.push(t.elapsed());
        routes = d.routes.len();
        ensure!(d.problems.is_empty(), "compute reported problems: {:?}", &d.problems[..d.problems.len().min(3)]);
        drop(d);
    }
    let (peak_kib, _) = proc_mem_kib("self")?;
    Ok(ComputeFigures { routes, median: median(times), model_peak_kib, peak_kib })
}

/// Run [`compute_in_process`] in a child process of this harness (so peak memory is the
/// computation's alone) and parse its answer.
fn compute_in_child(exe: &Path, size: ComputeSize, runs: usize) -> Result<ComputeFigures> {
    let out = Command::new(exe)
        .args(["--compute-child", &size.nodes.to_string(), &size.blocks.to_string(), &size.borrowed.to_string(), &runs.to_string()])
        .stderr(Stdio::inherit())
        .output()
        .context("start the compute child")?;
    ensure!(out.status.success(), "compute child failed: {}", out.status);
    let text = String::from_utf8_lossy(&out.stdout);
    let mut f = BTreeMap::new();
    for kv in text.split_whitespace() {
        if let Some((k, v)) = kv.split_once('=') {
            f.insert(k.to_string(), v.parse::<u64>().with_context(|| format!("compute child: {kv}"))?);
        }
    }
    let get = |k: &str| f.get(k).copied().with_context(|| format!("compute child did not report {k}: {text}"));
    Ok(ComputeFigures {
        routes: usize::try_from(get("routes")?)?,
        median: Duration::from_nanos(get("median_ns")?),
        model_peak_kib: get("model_peak_kib")?,
        peak_kib: get("peak_kib")?,
    })
}

/// The compute child's entry point: `--compute-child <nodes> <blocks> <borrowed> <runs>`.
fn compute_child_main(args: &[String]) -> Result<()> {
    let num = |i: usize| -> Result<usize> { Ok(args.get(i).context("--compute-child needs 4 numbers")?.parse()?) };
    let size = ComputeSize { nodes: num(0)?, blocks: num(1)?, borrowed: num(2)? };
    let f = compute_in_process(size, num(3)?)?;
    println!("routes={} median_ns={} model_peak_kib={} peak_kib={}", f.routes, f.median.as_nanos(), f.model_peak_kib, f.peak_kib);
    Ok(())
}

/// Benchmark 4: computing the desired routes of one node of a 5,000-node, 100,000-block
/// cluster / the time to program that many routes at benchmark 1's per-route rate.
pub fn compute(opts: &Options, shared: &mut Shared) -> Result<Outcome> {
    let f = match &opts.child_exe {
        Some(exe) => compute_in_child(exe, opts.compute, opts.runs)?,
        None => compute_in_process(opts.compute, opts.runs)?,
    };
    let rw = rw_program_median(opts, shared)?;
    let per_route = rw.as_secs_f64() / opts.routes as f64;
    let program = per_route * f.routes as f64;
    Ok(Outcome::Measured {
        name: "compute-100k".into(),
        ratio: f.median.as_secs_f64() / program,
        target: Target::AtMost(0.1),
        ok: true,
        details: vec![
            kv("nodes", opts.compute.nodes),
            kv("blocks", opts.compute.blocks),
            kv("borrowed", opts.compute.borrowed),
            kv("routes", f.routes),
            kv("compute_ms", ms(f.median)),
            kv("program_est_ms", format!("{:.1}", program * 1e3)),
            kv("program_us_per_route", format!("{:.2}", per_route * 1e6)),
            kv("peak_rss_mb", format!("{:.1}", f.peak_kib as f64 / 1024.0)),
            kv("model_rss_mb", format!("{:.1}", f.model_peak_kib as f64 / 1024.0)),
            kv("process", if opts.child_exe.is_some() { "compute-only-child" } else { "in-process" }),
            kv("runs", opts.runs),
        ],
    })
}

// ---------------------------------------------------------------------------------------
// 8. agent-footprint
// ---------------------------------------------------------------------------------------

/// A cluster directory (calicoctl/kubectl YAML) in which node `node-0000` (192.168.0.10/24)
/// has exactly `routes` IPIP routes: `nodes` nodes (200 per /24, so some are reached through
/// the tunnel and some natively: the pool is CrossSubnet) and `routes` /26 blocks
/// round-robin over them; node-0000's own blocks become blackholes.
pub fn write_footprint_cluster(dir: &Path, nodes: usize, routes: usize) -> Result<()> {
    let mut calico = String::from(
        "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: ipip}\n\
         spec: {cidr: 10.128.0.0/9, blockSize: 26, ipipMode: CrossSubnet, vxlanMode: Never}\n---\n\
         apiVersion: projectcalico.org/v3\nkind: FelixConfiguration\nmetadata: {name: default}\n\
         spec: {programClusterRoutes: EnabledIPIPOnly}\n---\n\
         apiVersion: projectcalico.org/v3\nkind: BGPConfiguration\nmetadata: {name: default}\n\
         spec: {programClusterRoutes: EnabledNoEncapOnly}\n---\n\
         apiVersion: projectcalico.org/v3\nkind: NodeList\nitems:\n",
    );
    for i in 0..nodes {
        let _ = writeln!(calico, "  - metadata: {{name: node-{i:04}}}\n    spec: {{bgp: {{ipv4Address: 192.168.{}.{}/24}}}}", i / 200, i % 200 + 10);
    }
    let mut ipam = String::from("apiVersion: crd.projectcalico.org/v1\nkind: IPAMBlockList\nitems:\n");
    for j in 0..routes {
        let base = v4(u32::from(Ipv4Addr::new(10, 128, 0, 0)) + (j as u32) * 64);
        let _ = writeln!(
            ipam,
            "  - metadata: {{name: {}-26}}\n    spec: {{cidr: {base}/26, affinity: \"host:node-{:04}\"}}",
            base.to_string().replace('.', "-"),
            j % nodes
        );
    }
    std::fs::write(dir.join("calico.yaml"), calico)?;
    std::fs::write(dir.join("ipam.yaml"), ipam)?;
    Ok(())
}

/// utime + stime of `/proc/<pid>/stat`, in clock ticks.
fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may contain spaces) start at field 3 (state).
    let rest = stat.rsplit_once(')').context("malformed /proc/<pid>/stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 (1-based), i.e. 11 and 12 after the state (3).
    Ok(f.get(11).context("no utime")?.parse::<u64>()? + f.get(12).context("no stime")?.parse::<u64>()?)
}

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
pub fn footprint(opts: &Options) -> Result<Outcome> {
    let name = "agent-footprint";
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

// ---------------------------------------------------------------------------------------
// 5. watch-overhead
// ---------------------------------------------------------------------------------------

/// Benchmark 5: benchmark 1's programming with the churn watch attached / without it.
pub fn watch_overhead(opts: &Options) -> Result<Outcome> {
    let name = "watch-overhead";
    if routewarden::bpf::embedded_object().is_none() {
        return Ok(Outcome::Skipped { name: name.into(), reason: "no BPF object embedded (`cargo xtask bench` builds one)".into() });
    }
    let routes = Arc::new(cluster_routes(opts.routes));
    let (mut with, mut without, mut backend) = (Vec::new(), Vec::new(), String::new());
    for _ in 0..opts.runs {
        without.push(rw_program_once(routes.clone())?);
        let (d, b) = rw_program_once_with(routes.clone(), true)?;
        with.push(d);
        backend = b;
    }
    let (with, without) = (median(with), median(without));
    Ok(Outcome::Measured {
        name: name.into(),
        ratio: with.as_secs_f64() / without.as_secs_f64(),
        target: Target::AtMost(1.05),
        ok: true,
        details: vec![kv("routes", routes.len()), kv("with_watch_ms", ms(with)), kv("without_ms", ms(without)), kv("backend", backend), kv("runs", opts.runs)],
    })
}

// ---------------------------------------------------------------------------------------
// 7. detect-latency
// ---------------------------------------------------------------------------------------

/// Benchmark 7: `conflicts` prefixes written by us (protocol 80), then each overwritten by a
/// second writer (another netlink socket, protocol 12, a replace); latency from just before
/// the second writer's request is sent until the watch's conflict event for that prefix is
/// received in userspace. Target p99 <= 10 ms.
pub fn detect_latency(opts: &Options) -> Result<Outcome> {
    let name = "detect-latency";
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
                writes.push(RouteOp::Write { route: k, oif: o, exclusive: true });
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
                let op = RouteOp::Write { oif: oif(k.target.device.as_deref()), route: k, exclusive: false };
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

// ---------------------------------------------------------------------------------------
// 6. tc-overhead
// ---------------------------------------------------------------------------------------

/// The forwarding watch's destinations for benchmark 6: the load of `agent/tests/forward_cost.rs`
/// (6,000 /26 blocks, 2,000 borrowed /32s) plus node-b's address as a no-encap /32, so every
/// packet of the stream is looked up and classified (right path), not a trie miss.
fn tc_entries() -> Vec<ForwardEntry> {
    let mut entries = Vec::new();
    for (base, pool, class, expected) in [
        (u32::from_be_bytes([10, 0, 0, 0]), "ipip-pool", PoolClass::Ipip, ForwardPath::Tunnel),
        (u32::from_be_bytes([10, 100, 0, 0]), "flat", PoolClass::NoEncap, ForwardPath::Host),
    ] {
        for i in 0..3000u32 {
            entries.push(ForwardEntry { prefix: IpNet::new(IpAddr::V4(v4(base + i * 64)), 26).expect("/26"), pool: pool.into(), class, expected });
        }
    }
    for i in 0..2000u32 {
        let [_, _, b, c] = i.to_be_bytes();
        let ip = IpAddr::V4(Ipv4Addr::new(10, 200, b, c));
        entries.push(ForwardEntry { prefix: IpNet::new(ip, 32).expect("/32"), pool: "flat".into(), class: PoolClass::NoEncap, expected: ForwardPath::Host });
    }
    let ip = IpAddr::V4(Ipv4Addr::new(192, 168, 0, 11));
    entries.push(ForwardEntry { prefix: IpNet::new(ip, 32).expect("/32"), pool: "flat".into(), class: PoolClass::NoEncap, expected: ForwardPath::Host });
    entries
}

/// Packets received by `eth0` in namespace `ns` (`ip -s -j link`).
fn rx_packets(ns: &str) -> Result<u64> {
    let out = Command::new("ip").args(["-n", ns, "-s", "-j", "link", "show", "eth0"]).output()?;
    ensure!(out.status.success(), "ip -s link in {ns}: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    v[0]["stats64"]["rx"]["packets"].as_u64().context("no stats64.rx.packets")
}

/// Send 1,400-byte UDP datagrams on `tx` for `window`; return the packets per second that
/// arrived on the receiver's `eth0` (namespace `rx_ns`). Counted at the device, not at the
/// socket: a receiving socket that falls behind would otherwise cap the figure, and a slower
/// sender would then look faster (fewer socket drops).
fn udp_stream(tx: &std::net::UdpSocket, rx_ns: &str, window: Duration) -> Result<f64> {
    let buf = [0u8; 1400];
    let before = rx_packets(rx_ns)?;
    let t = Instant::now();
    while t.elapsed() < window {
        for _ in 0..64 {
            let _ = tx.send(&buf); // ENOBUFS under overload: the datagram is lost, as on a link
        }
    }
    let elapsed = t.elapsed();
    std::thread::sleep(Duration::from_millis(50)); // what is in flight
    Ok((rx_packets(rx_ns)? - before) as f64 / elapsed.as_secs_f64())
}

/// An Ethernet frame around an IPv4 packet `src -> dst` of protocol `proto` with `payload`.
fn tc_frame(src: [u8; 4], dst: [u8; 4], proto: u8, payload: &[u8]) -> Vec<u8> {
    let total = u16::try_from(20 + payload.len()).unwrap_or(u16::MAX).to_be_bytes();
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00];
    f.extend_from_slice(&[0x45, 0, total[0], total[1], 0, 0, 0x40, 0, 64, proto, 0, 0]);
    f.extend_from_slice(&src);
    f.extend_from_slice(&dst);
    f.extend_from_slice(payload);
    f
}

/// The frames whose cost benchmark 6 reports, by key: a cluster destination (a /26 block of
/// pool `flat`, right path), a non-cluster destination (8.8.8.8) and an IPIP packet whose inner
/// destination is an `ipip-pool` block (right path), each a 100-byte UDP datagram on the NIC.
fn tc_cost_frames() -> Vec<(&'static str, Vec<u8>)> {
    let mut udp = vec![0x30, 0x39, 0x13, 0x89, 0, 108, 0, 0];
    udp.resize(108, 0);
    let inner = {
        let mut p = vec![0x45, 0, 0, 128, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 1, 5];
        p.extend_from_slice(&udp);
        p
    };
    vec![
        ("cluster", tc_frame([192, 168, 0, 10], [10, 100, 0, 9], 17, &udp)),
        ("non_cluster", tc_frame([192, 168, 0, 10], [8, 8, 8, 8], 17, &udp)),
        ("ipip", tc_frame([192, 168, 0, 10], [192, 168, 0, 11], 4, &inner)),
    ]
}

/// Repetitions of `BPF_PROG_TEST_RUN` per figure.
const TEST_RUN_REPEAT: u32 = 1_000_000;

/// Average run time in ns of program `id` on `frame`, from `BPF_PROG_TEST_RUN`
/// (`bpftool prog run ... repeat` [`TEST_RUN_REPEAT`]); `None` without bpftool.
fn test_run_ns(id: u32, frame: &[u8]) -> Option<f64> {
    let dir = tempfile::tempdir().ok()?;
    let path = dir.path().join("frame.bin");
    std::fs::write(&path, frame).ok()?;
    let out = Command::new("bpftool")
        .args(["prog", "run", "id", &id.to_string(), "data_in"])
        .arg(&path)
        .args(["repeat", &TEST_RUN_REPEAT.to_string()])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    // "Return value: 4294967295, duration (average): 27ns"
    let avg = text.split("duration (average):").nth(1)?.trim();
    avg.split("ns").next()?.trim().parse().ok()
}

/// Benchmark 6: UDP throughput from node-a to node-b (lab namespaces on a bridge) with the
/// forwarding watch attached to node-a's `eth0` and `tunl0` (destinations loaded), divided by
/// without it; runs alternate. Side figures: the host-NIC program's per-packet cost from
/// `BPF_PROG_TEST_RUN` on the frames of [`tc_cost_frames`] (median over the runs, each the
/// average of [`TEST_RUN_REPEAT`] repetitions), with targets of their own (issue 15: at most
/// 50 ns for a cluster destination, 20 ns for a non-cluster one). The kernel's run-time
/// statistics (`run_time_ns / run_cnt`) need the global `kernel.bpf_stats_enabled`, which is
/// not touched on the host: that figure comes from the QEMU lane (`agent/tests/forward_ipip.rs`).
pub fn tc_overhead(opts: &Options) -> Result<Outcome> {
    // Packets per second with and without the watch, and each frame's test-run costs (ns).
    type Runs = (Vec<f64>, Vec<f64>, Vec<Vec<f64>>);
    let name = "tc-overhead";
    let Some(obj) = routewarden::bpf::embedded_object() else {
        return Ok(Outcome::Skipped { name: name.into(), reason: "no BPF object embedded (`cargo xtask bench` builds one)".into() });
    };
    let lab = Lab::build(LabSpec::new(vec![
        LabNodeSpec { name: "node-a".into(), addresses: vec!["192.168.0.10/24".into()] },
        LabNodeSpec { name: "node-b".into(), addresses: vec!["192.168.0.11/24".into()] },
    ]))?;
    let rx = lab.in_netns("node-b", || std::net::UdpSocket::bind("192.168.0.11:5001"))??;
    let tx = lab.in_netns("node-a", || -> std::io::Result<std::net::UdpSocket> {
        let s = std::net::UdpSocket::bind("192.168.0.10:0")?;
        s.connect("192.168.0.11:5001")?;
        Ok(s)
    })??;
    // Bound so the stream draws no ICMP port unreachable; never read (the device counts).
    let rx_ns = lab.node_ns("node-b");
    let entries = Arc::new(tc_entries());
    let window = opts.stream;
    let frames = Arc::new(tc_cost_frames());
    let result = (|| -> Result<Runs> {
        let (mut with, mut without) = (Vec::new(), Vec::new());
        let mut cost: Vec<Vec<f64>> = vec![Vec::new(); frames.len()];
        // Warm-up (ARP, caches), not counted.
        udp_stream(&tx, &rx_ns, window / 4)?;
        for run in 0..opts.runs {
            for attached in if run % 2 == 0 { [false, true] } else { [true, false] } {
                if !attached {
                    without.push(udp_stream(&tx, &rx_ns, window)?);
                    continue;
                }
                let (tx, rx_ns, entries, frames) = (tx.try_clone()?, rx_ns.clone(), entries.clone(), frames.clone());
                // Attach, stream and detach inside node-a: TC detach works on the calling
                // thread's namespace.
                let (pps, ns) = lab.in_netns("node-a", move || -> Result<(f64, Vec<Option<f64>>)> {
                    let cfg = ForwardConfig::for_devices(&["tunl0".into()], &["eth0".into()]);
                    let mut watch = ForwardWatch::start(obj, &cfg).context("start the forwarding watch")?;
                    let up = watch.set_destinations(&entries).context("load destinations")?;
                    ensure!(up.failed.is_empty(), "{} destinations failed to load", up.failed.len());
                    let pps = udp_stream(&tx, &rx_ns, window)?;
                    let host_id = watch.program_ids()?.get(1).map(|(_, id)| *id).context("no tc_forward_host id")?;
                    let ns = frames.iter().map(|(_, frame)| test_run_ns(host_id, frame)).collect();
                    let counts = watch.counts()?;
                    ensure!(
                        counts.observed("flat", routewarden_common::forward::Observation::HostNative).packets > 0,
                        "the host-NIC program saw none of the stream"
                    );
                    drop(watch);
                    Ok((pps, ns))
                })??;
                with.push(pps);
                for (all, one) in cost.iter_mut().zip(ns) {
                    all.extend(one);
                }
            }
        }
        Ok((with, without, cost))
    })();
    drop(rx);
    drop(lab);
    let (with, without, cost) = result?;
    let median_f = |mut v: Vec<f64>| -> f64 {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let cost: Vec<Option<f64>> = cost.into_iter().map(|v| (!v.is_empty()).then(|| median_f(v))).collect();
    // Issue 15's per-packet targets (ns), in the order of `tc_cost_frames`; `None`: no target.
    let cost_targets = [Some(50.0), Some(20.0), None];
    let costs_met = cost.iter().zip(cost_targets).all(|(c, t)| match (c, t) {
        (Some(c), Some(t)) => *c <= t,
        (None, Some(_)) => false,
        (_, None) => true,
    });
    let (with_pps, without_pps) = (median_f(with), median_f(without));
    ensure!(without_pps > 0.0, "no datagram arrived without the watch");
    let ratio = with_pps / without_pps;
    Ok(Outcome::Measured {
        name: name.into(),
        ratio,
        target: Target::AtLeast(0.98),
        // `ok` is for side conditions that invalidate a run (bench_smoke requires it); the
        // per-packet targets are targets, reported on their own.
        ok: true,
        details: {
            let mut d = vec![
                kv("with_pps", format!("{with_pps:.0}")),
                kv("without_pps", format!("{without_pps:.0}")),
                kv("payload_bytes", 1400),
                kv("destinations", entries.len()),
            ];
            for ((key, _), ns) in frames.iter().zip(&cost) {
                d.push(kv(&format!("{key}_ns"), ns.map_or_else(|| "unavailable".into(), |ns| format!("{ns:.1}"))));
            }
            d.push(kv("cost_targets_ns", "cluster<=50,non_cluster<=20"));
            d.push(kv("cost_targets_met", if costs_met { "yes" } else { "no" }));
            d.push(kv("test_run_repeat", TEST_RUN_REPEAT));
            d.push(kv("run_time_ns", "qemu-lane"));
            d.push(kv("stream_s", format!("{:.1}", window.as_secs_f64())));
            d.push(kv("runs", opts.runs));
            d
        },
    })
}

// ---------------------------------------------------------------------------------------
// bad-input-worst (issue 22): the agent against the worst inputs up to the size limit
// ---------------------------------------------------------------------------------------

/// The size every worst-case file is built to: just under the 16 MiB default limit.
const WORST_BYTES: usize = 16 * 1024 * 1024 - 4096;

/// A text of about `bytes` bytes: `head`, then `unit` repeated, then `tail`.
fn filled(head: &str, unit: &str, tail: &str, bytes: usize) -> String {
    let n = bytes.saturating_sub(head.len() + tail.len()) / unit.len();
    let mut s = String::with_capacity(head.len() + unit.len() * n + tail.len());
    s.push_str(head);
    for _ in 0..n {
        s.push_str(unit);
    }
    s.push_str(tail);
    s
}

/// The worst shapes of bad input, each `bytes` long: what the parser must survive in bounded
/// memory and linear time.
pub fn worst_inputs(bytes: usize) -> Vec<(&'static str, String)> {
    let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..12 {
        let _ = writeln!(bomb, "a{i}: &a{i} [{}]", vec![format!("*a{}", i - 1); 10].join(", "));
    }
    vec![
        (
            "allocations-nulls",
            filled(
                "apiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {name: 10-244-99-0-26}\nspec: {cidr: 10.244.99.0/26, affinity: \"host:node-b\", allocations: [",
                "null, ",
                "0]}\n",
                bytes,
            ),
        ),
        (
            "many-invalid-objects",
            filled(
                "apiVersion: v1\nkind: List\nitems:\n",
                "- {apiVersion: projectcalico.org/v3, kind: IPPool, metadata: {name: p}, spec: {cidr: x}}\n",
                "",
                bytes,
            ),
        ),
        ("deep-nesting", filled("", "[", "", bytes)),
        ("alias-bomb", filled(&bomb, "# padding to the size limit ...........................................\n", "", bytes)),
        ("huge-name", filled("apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: \"", "a", "\"}\nspec: {cidr: 10.250.0.0/16}\n", bytes)),
        (
            // Kinds routewarden ignores, then one invalid object so the agent says it read it all.
            "unknown-kinds",
            filled(
                "apiVersion: v1\nkind: List\nitems:\n",
                "- {apiVersion: v1, kind: ConfigMap, metadata: {name: c}, data: {k: v}}\n",
                "- {apiVersion: projectcalico.org/v3, kind: IPPool, metadata: {name: last}, spec: {cidr: x}}\n",
                bytes,
            ),
        ),
    ]
}

/// Issue 22's target: agent RSS <= 200 MB and parse <= 2 s for any input up to the size limit,
/// with parse time linear in the input. The agent (release, in a one-node lab on the example
/// cluster) is given each worst shape in turn as a new file; the time from the write to the
/// agent reporting it on /metrics bounds its parse (debounce and half-write re-read included);
/// its peak RSS (VmHWM) covers all of them. Linearity: the harness parses each shape in-process
/// at 1 MiB and at 16 MiB; the ratio of their per-byte costs is the reference measured in the
/// same run. ratio = the largest of rss/200 MB, parse/2 s and per-byte(16 MiB)/per-byte(1 MiB)/1.5.
#[expect(clippy::too_many_lines, reason = "one benchmark, its shapes and its report in order; the harness is split per benchmark in issue 16")]
pub fn bad_input_worst(opts: &Options) -> Result<Outcome> {
    let name = "bad-input-worst";
    let Some(agent) = &opts.agent_bin else {
        return Ok(Outcome::Skipped { name: name.into(), reason: "no --agent-bin (cargo xtask bench passes target/release/routewarden)".into() });
    };
    let bytes = if opts.routes < 1_000 { 1024 * 1024 } else { WORST_BYTES };
    // Linearity, in-process (the median of `runs`).
    let mut linear = Vec::new();
    for ((shape, small), (_, big)) in worst_inputs(bytes / 16).into_iter().zip(worst_inputs(bytes)) {
        let time = |text: &str| -> f64 {
            let mut v: Vec<f64> = (0..opts.runs.max(1))
                .map(|_| {
                    let t = Instant::now();
                    let _ = routewarden::model::ParsedObjects::from_yaml_str(text, &routewarden::model::YamlLimits::default());
                    t.elapsed().as_secs_f64()
                })
                .collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (ts, tb) = (time(&small), time(&big));
        let per_byte = (tb / big.len() as f64) / (ts / small.len() as f64).max(f64::MIN_POSITIVE);
        linear.push((shape, ts, tb, per_byte));
    }
    // The agent.
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster");
    let snap = routewarden::datastore::FileDatastore::load(&examples)?;
    let node = snap.cluster.nodes.get("node-a").context("node-a in the examples")?;
    let lab = Lab::build(LabSpec::new(vec![LabNodeSpec { name: "node-a".into(), addresses: node.bgp_addresses().iter().map(ToString::to_string).collect() }]))?;
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("cluster");
    std::fs::create_dir(&data)?;
    for e in std::fs::read_dir(&examples)? {
        let e = e?;
        std::fs::copy(e.path(), data.join(e.file_name()))?;
    }
    let log = std::fs::File::create(dir.path().join("agent.log"))?;
    let mut child = lab
        .command("node-a", &agent.display().to_string())
        // A short settle period: each shape's file is removed again before the next.
        .args(["run", "--node", "node-a", "--metrics-addr", "127.0.0.1:9695", "--log-format", "text", "--settle-period", "2", "--datastore"])
        .arg(format!("file:{}", data.display()))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("start the agent")?;
    let pid = child.id();
    let result = (|| -> Result<Vec<(&'static str, Duration)>> {
        let invalid = || -> Option<f64> {
            let (code, body) = lab.http_get("node-a", 9695, "/metrics").ok()?;
            (code == 200).then_some(())?;
            let get = |series: &str| body.lines().find_map(|l| l.strip_prefix(series).and_then(|r| r.trim().parse::<f64>().ok()));
            Some(get("routewarden_datastore_invalid_objects ")? + get("routewarden_datastore_invalid_inputs ")?)
        };
        let wait = |what: &str, limit: Duration, f: &dyn Fn() -> bool| -> Result<Duration> {
            let t = Instant::now();
            while !f() {
                ensure!(t.elapsed() < limit, "timed out after {limit:?} waiting for {what}");
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(t.elapsed())
        };
        wait("the agent's first snapshot", Duration::from_secs(30), &|| invalid() == Some(0.0))?;
        let mut out = Vec::new();
        for (shape, text) in worst_inputs(bytes) {
            if let Some(status) = child.try_wait()? {
                bail!("the agent exited during {shape}: {status}");
            }
            let path = data.join("bad.yaml");
            let t = Instant::now();
            std::fs::write(&path, &text)?;
            wait(shape, Duration::from_mins(1), &|| invalid().is_some_and(|n| n >= 1.0))?;
            out.push((shape, t.elapsed()));
            std::fs::remove_file(&path)?;
            // Removing a file holds its content for the settle period: wait it out.
            wait("the file's removal", Duration::from_secs(90), &|| invalid() == Some(0.0))?;
        }
        Ok(out)
    })();
    let (hwm_kib, _) = proc_mem_kib(&pid.to_string()).unwrap_or((0, 0));
    let _ = child.kill();
    let _ = child.wait();
    let detect = result.map_err(|e| {
        anyhow!(
            "{e:#}; agent log: {}",
            std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default().lines().rev().take(5).collect::<Vec<_>>().join(" | ")
        )
    })?;
    drop(lab);
    let peak_mb = hwm_kib as f64 / 1024.0;
    let worst_parse = detect.iter().map(|(_, d)| d.as_secs_f64()).fold(0.0, f64::max);
    let worst_linear = linear.iter().map(|l| l.3).fold(0.0, f64::max);
    let ratio = (peak_mb / 200.0).max(worst_parse / 2.0).max(worst_linear / 1.5);
    let mut details = vec![
        kv("peak_rss_mb", format!("{peak_mb:.1}")),
        kv("worst_parse_s", format!("{worst_parse:.2}")),
        kv("worst_per_byte_ratio", fmt_ratio(worst_linear)),
        kv("bytes", bytes),
    ];
    for (shape, d) in &detect {
        details.push(kv(&format!("{shape}_s"), format!("{:.2}", d.as_secs_f64())));
    }
    for (shape, ts, tb, r) in &linear {
        details.push(kv(&format!("{shape}_inproc_ms"), format!("{:.1}/{:.1}", ts * 1e3, tb * 1e3)));
        details.push(kv(&format!("{shape}_per_byte_ratio"), fmt_ratio(*r)));
    }
    details.push(kv("runs", opts.runs));
    Ok(Outcome::Measured { name: name.into(), ratio, target: Target::AtMost(1.0), ok: true, details })
}

// ---------------------------------------------------------------------------------------
// all-nodes-5k
// ---------------------------------------------------------------------------------------

/// The budget of `routewarden explain --all-nodes` on 5,000 nodes and 100,000 blocks (issue 19
/// part 4).
const ALL_NODES_BUDGET: Duration = Duration::from_secs(2);

/// `routewarden explain --all-nodes` on `opts.compute.nodes` nodes and `opts.compute.blocks`
/// IPAM blocks in files (as `write_footprint_cluster` writes them, one IPIP pool) plus one
/// `FelixConfiguration node.<name>` override that leaves IPIP unowned on that node: the file
/// load and the table, in-process (what the command does, minus process start). ratio = the
/// median time / 2 s. Side condition: exactly that one node is reported inconsistent. Pure
/// (no routes, links or namespaces).
pub fn all_nodes(opts: &Options) -> Result<Outcome> {
    let dir = tempfile::tempdir()?;
    let (nodes, blocks) = (opts.compute.nodes.max(2), opts.compute.blocks);
    write_footprint_cluster(dir.path(), nodes, blocks)?;
    std::fs::write(
        dir.path().join("override.yaml"),
        "apiVersion: projectcalico.org/v3\nkind: FelixConfiguration\nmetadata: {name: node.node-0001}\nspec: {programClusterRoutes: Disabled}\n",
    )?;
    let config = routewarden::ownership::OwnershipConfig::default();
    let (mut total, mut load, mut render) = (Vec::new(), Vec::new(), Vec::new());
    let mut ok = true;
    let mut lines = 0;
    for _ in 0..opts.runs.max(1) {
        let t = Instant::now();
        let snap = routewarden::datastore::FileDatastore::load(dir.path())?;
        let loaded = t.elapsed();
        let e = routewarden::explain::explain_all_nodes(&snap.cluster, &snap.object_errors, &config, routewarden::explain::OutputFormat::Table)?;
        let done = t.elapsed();
        ensure!(snap.cluster.ipam_blocks.len() == blocks && snap.cluster.nodes.len() == nodes, "the cluster did not load whole");
        ok &= e.has_errors && e.text.lines().last() == Some(&format!("1 of {nodes} nodes inconsistent: node-0001")[..]);
        lines = e.text.lines().count();
        total.push(done);
        load.push(loaded);
        render.push(done.saturating_sub(loaded));
    }
    let total = median(total);
    Ok(Outcome::Measured {
        name: "all-nodes-5k".into(),
        ratio: total.as_secs_f64() / ALL_NODES_BUDGET.as_secs_f64(),
        target: Target::AtMost(1.0),
        ok,
        details: vec![
            kv("nodes", nodes),
            kv("blocks", blocks),
            kv("total_ms", ms(total)),
            kv("load_ms", ms(median(load))),
            kv("table_ms", ms(median(render))),
            kv("lines", lines),
            kv("runs", opts.runs),
        ],
    })
}

// ---------------------------------------------------------------------------------------
// kube-heartbeats (issue 23)
// ---------------------------------------------------------------------------------------

/// Node status heartbeats per second in `kube-heartbeats` (5,000 nodes heartbeat about every
/// 5 s: ~1,000 updates/s on the Node watch).
const HEARTBEATS_PER_S: u64 = 1000;

/// Budget: the heartbeats may cost at most 5 % of one core.
const HEARTBEAT_CPU_BUDGET_PCT: f64 = 5.0;

/// The Kubernetes datastore under Node heartbeats, against a stand-in API server in this
/// process (tower-test's mock service: no network): `compute.nodes` Nodes, `compute.blocks`
/// IPAM blocks and as many affinities, one IP pool; once synced, the Node watch delivers
/// `HEARTBEATS_PER_S` heartbeats a second for the stream window (10 s; 1 s with `--tiny`), each
/// a Node whose status conditions and resourceVersion changed and nothing the model reads.
/// The events are encoded before the clock starts, so the CPU measured (utime + stime of this
/// process over the window) is the datastore's. ratio = CPU % of one core ÷ 5 %; side
/// condition: not one snapshot is sent for a heartbeat.
#[expect(clippy::too_many_lines, reason = "the stand-in API server, the stream and the report in one place; the harness is split per benchmark in issue 16")]
pub fn kube_heartbeats(opts: &Options) -> Result<Outcome> {
    use bytes::Bytes;
    use futures::StreamExt as _;
    use http_body_util::BodyExt;
    use routewarden::datastore::{ApiGroupChoice, DatastoreEvent, KubernetesDatastore};
    use serde_json::json;

    let name = "kube-heartbeats";
    let (nodes, blocks) = (opts.compute.nodes.max(2), opts.compute.blocks.max(1));
    let window = if blocks <= 1000 { Duration::from_secs(1) } else { Duration::from_secs(10) };
    let beats = HEARTBEATS_PER_S * window.as_secs();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async move {
        type RespBody = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;
        let node = |i: usize, rv: u64, beat: u64| {
            json!({"metadata": {"name": format!("node-{i:05}"), "resourceVersion": rv.to_string(),
                                "annotations": {"projectcalico.org/IPv4Address": format!("10.{}.{}.{}/16", 200 + i / 65536, (i / 256) % 256, i % 256)}},
                   "status": {"addresses": [{"type": "InternalIP", "address": format!("10.{}.{}.{}", 200 + i / 65536, (i / 256) % 256, i % 256)}],
                              "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": format!("2026-01-01T00:00:{:02}Z", beat % 60)}]}})
        };
        let list = |kind: &str, api_version: &str, items: Vec<serde_json::Value>| {
            Bytes::from(json!({"apiVersion": api_version, "kind": format!("{kind}List"), "metadata": {"resourceVersion": "10"}, "items": items}).to_string())
        };
        let crd = "crd.projectcalico.org/v1";
        let pools = list("IPPool", crd, vec![json!({"apiVersion": crd, "kind": "IPPool", "metadata": {"name": "p", "resourceVersion": "1"}, "spec": {"cidr": "10.0.0.0/8", "ipipMode": "Always", "vxlanMode": "Never", "blockSize": 26}})]);
        let block_items: Vec<serde_json::Value> = (0..blocks)
            .map(|b| {
                let cidr = format!("10.{}.{}.{}/26", b / 1024, (b / 4) % 256, (b % 4) * 64);
                json!({"apiVersion": crd, "kind": "IPAMBlock", "metadata": {"name": cidr.replace(['.', '/'], "-"), "resourceVersion": "2"},
                       "spec": {"cidr": cidr, "affinity": format!("host:node-{:05}", b % nodes), "allocations": [], "attributes": [], "deleted": false}})
            })
            .collect();
        let affinity_items: Vec<serde_json::Value> = block_items
            .iter()
            .map(|b| {
                let (cidr, host) = (b["spec"]["cidr"].as_str().unwrap_or_default(), b["spec"]["affinity"].as_str().unwrap_or_default().trim_start_matches("host:"));
                json!({"apiVersion": crd, "kind": "BlockAffinity", "metadata": {"name": format!("{host}-{}", cidr.replace(['.', '/'], "-")), "resourceVersion": "3"},
                       "spec": {"node": host, "cidr": cidr, "state": "confirmed", "deleted": "false"}})
            })
            .collect();
        let lists: BTreeMap<String, Bytes> = [
            (format!("/apis/{crd}/ippools"), pools),
            (format!("/apis/{crd}/ipamblocks"), list("IPAMBlock", crd, block_items)),
            (format!("/apis/{crd}/blockaffinities"), list("BlockAffinity", crd, affinity_items)),
            (format!("/apis/{crd}/felixconfigurations"), list("FelixConfiguration", crd, Vec::new())),
            (format!("/apis/{crd}/bgpconfigurations"), list("BGPConfiguration", crd, Vec::new())),
            (format!("/apis/{crd}/clusterinformations"), list("ClusterInformation", crd, Vec::new())),
            ("/api/v1/nodes".to_owned(), list("Node", "v1", (0..nodes).map(|i| node(i, 4, 0)).collect())),
            ("/apis/apps/v1/namespaces/kube-system/daemonsets".to_owned(), list("DaemonSet", "apps/v1", Vec::new())),
        ]
        .into_iter()
        .collect();
        // The heartbeats, encoded up front.
        let events: Vec<Bytes> = (0..beats)
            .map(|k| {
                let i = usize::try_from(k).unwrap_or(0) % nodes;
                Bytes::from(format!("{}\n", json!({"type": "MODIFIED", "object": node(i, 100 + k, k + 1)})))
            })
            .collect();
        let (beat_tx, beat_rx) = futures::channel::mpsc::unbounded::<Bytes>();
        let mut beat_rx = Some(beat_rx);
        let discovery = move |path: &str| -> Option<Bytes> {
            let resources = |group_version: &str, plurals: &[&str]| {
                let r: Vec<serde_json::Value> = plurals.iter().map(|p| json!({"name": p, "singularName": "", "namespaced": false, "kind": "X", "verbs": ["list", "watch"]})).collect();
                Bytes::from(json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": r}).to_string())
            };
            match path {
                "/apis" => Some(Bytes::from(
                    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [{"name": "crd.projectcalico.org", "versions": [{"groupVersion": crd, "version": "v1"}], "preferredVersion": {"groupVersion": crd, "version": "v1"}}]}).to_string(),
                )),
                p if p == format!("/apis/{crd}") => Some(resources(crd, &["ippools", "ipamblocks", "blockaffinities", "felixconfigurations", "bgpconfigurations", "clusterinformations"])),
                "/version" => Some(Bytes::from(json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0"}).to_string())),
                _ => None,
            }
        };
        let (service, mut handle) = tower_test::mock::pair::<http::Request<kube::client::Body>, http::Response<RespBody>>();
        tokio::spawn(async move {
            while let Some((req, send)) = handle.next_request().await {
                let path = req.uri().path().to_owned();
                let watch = req.uri().query().is_some_and(|q| q.split('&').any(|kv| kv == "watch=true"));
                let full = |b: Bytes| http_body_util::Full::new(b).map_err(|e| match e {}).boxed();
                if watch {
                    // The Node watch streams the heartbeats; every other watch stays idle.
                    let rx = if path == "/api/v1/nodes" { beat_rx.take() } else { None };
                    let body: RespBody = match rx {
                        Some(rx) => BodyExt::boxed(http_body_util::StreamBody::new(rx.map(|b| Ok::<_, std::io::Error>(http_body::Frame::data(b))))),
                        None => BodyExt::boxed(http_body_util::StreamBody::new(futures::stream::pending::<Result<http_body::Frame<Bytes>, std::io::Error>>())),
                    };
                    send.send_response(http::Response::builder().status(200).body(body).unwrap_or_default());
                } else if let Some(b) = lists.get(&path).cloned().or_else(|| discovery(&path)) {
                    send.send_response(http::Response::builder().status(200).body(full(b)).unwrap_or_default());
                } else {
                    let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "not found", "reason": "NotFound", "code": 404});
                    send.send_response(http::Response::builder().status(404).body(full(Bytes::from(status.to_string()))).unwrap_or_default());
                }
            }
        });
        let client = kube::Client::new(service, "default");
        let (tx, mut rx) = tokio::sync::mpsc::channel(64);
        let started = Instant::now();
        // No list settle: it only delays the first `settled` snapshot, and this measures the
        // watch path.
        let task = KubernetesDatastore::new(client, ApiGroupChoice::Auto).with_list_settle(Duration::ZERO).spawn(tx);
        let mut first = None;
        loop {
            match tokio::time::timeout(Duration::from_mins(5), rx.recv()).await {
                Ok(Some(DatastoreEvent::Synced)) => break,
                Ok(Some(DatastoreEvent::Snapshot(s))) => first = Some(s),
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => bail!("the datastore did not sync"),
            }
        }
        let synced_ms = ms(started.elapsed());
        let first = first.context("no snapshot before Synced")?;
        ensure!(first.cluster.ipam_blocks.len() == blocks && first.cluster.nodes.len() == nodes, "the cluster did not load whole");
        // Anything still in flight from the lists is not a heartbeat's.
        while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(500), rx.recv()).await {}
        let pid = std::process::id();
        let cpu0 = cpu_ticks(pid)?;
        let t0 = Instant::now();
        let per_tick = HEARTBEATS_PER_S / 10;
        let mut sent = 0;
        let mut snapshots = 0u64;
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        for chunk in events.chunks(usize::try_from(per_tick).unwrap_or(100)) {
            tick.tick().await;
            for e in chunk {
                beat_tx.unbounded_send(e.clone()).map_err(|_| anyhow!("the Node watch closed"))?;
                sent += 1;
            }
            while let Ok(ev) = rx.try_recv() {
                snapshots += u64::from(matches!(ev, DatastoreEvent::Snapshot(_)));
            }
        }
        // Give the last events time to be read and (not) turned into a snapshot.
        tokio::time::sleep(Duration::from_millis(500)).await;
        while let Ok(ev) = rx.try_recv() {
            snapshots += u64::from(matches!(ev, DatastoreEvent::Snapshot(_)));
        }
        let elapsed = t0.elapsed();
        let ticks = cpu_ticks(pid)? - cpu0;
        task.abort();
        let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)?.unwrap_or(100) as f64;
        let cpu_s = ticks as f64 / hz;
        let cpu_pct = cpu_s / elapsed.as_secs_f64() * 100.0;
        Ok(Outcome::Measured {
            name: name.into(),
            ratio: cpu_pct / HEARTBEAT_CPU_BUDGET_PCT,
            target: Target::AtMost(1.0),
            ok: snapshots == 0,
            details: vec![
                kv("nodes", nodes),
                kv("blocks", blocks),
                kv("heartbeats", sent),
                kv("rate_per_s", HEARTBEATS_PER_S),
                kv("cpu_pct", format!("{cpu_pct:.2}")),
                kv("cpu_ms_per_1000", format!("{:.1}", cpu_s * 1_000_000.0 / f64::from(u32::try_from(sent).unwrap_or(u32::MAX)).max(1.0))),
                kv("snapshots", snapshots),
                kv("synced_ms", synced_ms),
                kv("cpu_ticks", ticks),
            ],
        })
    })
}

// ---------------------------------------------------------------------------------------
// Driver
// ---------------------------------------------------------------------------------------

/// Run benchmark `name`.
pub fn run_one(name: &str, opts: &Options, shared: &mut Shared) -> Outcome {
    let r = match name {
        "cold-program-10k" => cold_program(opts, shared),
        "cold-program-vs-bird" => vs_bird(opts, shared),
        "resync-100k" => resync(opts),
        "compute-100k" => compute(opts, shared),
        "agent-footprint" => footprint(opts),
        "tc-overhead" => tc_overhead(opts),
        "watch-overhead" => watch_overhead(opts),
        "detect-latency" => detect_latency(opts),
        "bad-input-worst" => bad_input_worst(opts),
        "all-nodes-5k" => all_nodes(opts),
        "kube-heartbeats" => kube_heartbeats(opts),
        other => Ok(Outcome::Skipped { name: other.into(), reason: "not implemented".into() }),
    };
    r.unwrap_or_else(|e| Outcome::Failed { name: name.into(), reason: format!("{e:#}") })
}

fn usage() -> String {
    format!(
        "usage: bench [NAME...] [--agent-bin PATH] [--quick] [--runs N] [--tiny]\n  names: {}\n  \
         --quick: 10 s idle window for agent-footprint instead of 60 s\n  \
         --tiny: 100 routes, one run (checks the harness, not the figures)\n",
        ALL.join(", ")
    )
}

/// Parse the command line, run the benchmarks, print one line each. Exit 1 if one failed
/// to run (a missed target is not a failure of the harness).
pub fn main_cli() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--compute-child") {
        return match compute_child_main(&args[1..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("compute child: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    let mut opts = if args.iter().any(|a| a == "--tiny") { Options::tiny() } else { Options::full() };
    opts.child_exe = std::env::current_exe().ok();
    let mut names = Vec::new();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--agent-bin" => opts.agent_bin = it.next().map(PathBuf::from),
            "--quick" => opts.idle = Duration::from_secs(10),
            "--tiny" => {}
            "--runs" => match it.next().and_then(|v| v.parse().ok()) {
                Some(n) if n > 0 => opts.runs = n,
                _ => {
                    eprint!("--runs needs a positive number\n{}", usage());
                    return ExitCode::from(2);
                }
            },
            "-h" | "--help" => {
                print!("{}", usage());
                return ExitCode::SUCCESS;
            }
            "all" => names.extend(ALL.iter().map(ToString::to_string)),
            n if ALL.contains(&n) => names.push(n.to_string()),
            other => {
                eprint!("unknown benchmark or option {other:?}\n{}", usage());
                return ExitCode::from(2);
            }
        }
    }
    if names.is_empty() {
        names.extend(ALL.iter().map(ToString::to_string));
    }
    if !routewarden_lab::is_root() {
        eprintln!("bench: needs root (it creates network namespaces)");
        return ExitCode::from(2);
    }
    let mut shared = Shared::default();
    let mut failed = false;
    for name in &names {
        eprintln!("bench: running {name} ...");
        let t = Instant::now();
        let out = run_one(name, &opts, &mut shared);
        eprintln!("bench: {name} took {:.1} s", t.elapsed().as_secs_f64());
        failed |= matches!(out, Outcome::Failed { .. });
        println!("{out}");
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
