//! routewarden's own side of the routing benchmarks: its cold programming of cluster routes in
//! a fresh node namespace (benchmarks 1, 2, 4 and 5; the median shared through [`Shared`]),
//! classic or through nexthop objects ([`Mode`]), and the churn watch started as the agent
//! starts it (benchmarks 5 and 7).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, ensure, Context, Result};
use routewarden::bpf::route_watch::{RouteWatch, RouteWatchConfig, RouteWatchEvent};
use routewarden::dataplane::{DataplaneConfig, Reconciler, RtNetlink, SystemClock};
use routewarden::routes::ClusterRoute;

use crate::fixtures::{cluster_routes, PROTO_OURS};
use crate::netns::{check_exact_routes, count_nexthops, count_nhid_routes, count_routes, in_node_netns};
use crate::procfs::process_cpu;
use crate::{median, Options, Shared};

/// How routewarden programs cluster routes: classic routes (gateway, device and onlink flag
/// in each route; the default) or through one nexthop object per (remote node, IP pool)
/// (`DataplaneConfig::nexthop_objects`, `--nexthop-objects`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Classic routes (the agent's default).
    Classic,
    /// Routes through nexthop objects (`nhid`).
    Nexthops,
}

impl Mode {
    /// The dataplane settings of this mode: the defaults, with `nexthop_objects` set for
    /// [`Mode::Nexthops`].
    pub fn config(self) -> DataplaneConfig {
        DataplaneConfig { nexthop_objects: self == Mode::Nexthops, ..DataplaneConfig::default() }
    }
}

/// The nexthop objects routewarden's nexthop mode makes for `routes`: one per distinct
/// (remote node, IP pool) of the routes that have a remote node.
pub fn nexthop_objects(routes: &[ClusterRoute]) -> usize {
    routes.iter().filter_map(|r| r.origin.node().map(|n| (n.to_string(), r.pool.to_string()))).collect::<BTreeSet<_>>().len()
}

/// routewarden programs `routes` into the empty main table of a fresh namespace: connect,
/// set the desired set, one apply (its first resync included), in a task spawned on a
/// runtime shaped like the agent's. Returns the wall time.
pub fn rw_program_once(routes: Arc<Vec<ClusterRoute>>) -> Result<Duration> {
    rw_program_once_with(routes, Listener::Nothing).map(|(d, _)| d)
}

/// [`rw_program_once`] in nexthop mode ([`Mode::Nexthops`]): the apply must write every route
/// and one object per (remote node, pool) ([`nexthop_objects`]); afterwards (untimed) every
/// route of our protocol must go through a nexthop object (`nhid`, counted), and exactly that
/// many objects of our protocol must exist. Returns the wall time.
pub fn rw_program_once_nh(routes: Arc<Vec<ClusterRoute>>) -> Result<Duration> {
    rw_program_checked(routes, Listener::Nothing, Mode::Nexthops, |routes| {
        let (all, via_nh, objects) = (count_routes(PROTO_OURS)?, count_nhid_routes(PROTO_OURS)?, count_nexthops(PROTO_OURS)?);
        ensure!(all == routes.len(), "{all} routes of protocol {PROTO_OURS} in the kernel, expected {}", routes.len());
        ensure!(via_nh == routes.len(), "{via_nh} of {all} routes of protocol {PROTO_OURS} go through a nexthop object, expected all");
        let want = nexthop_objects(routes);
        ensure!(objects == want, "{objects} nexthop objects of protocol {PROTO_OURS} in the kernel, expected {want}");
        Ok(())
    })
    .map(|t| t.wall)
}

/// [`rw_program_once`], checking afterwards (outside the timed part) that the namespace holds
/// exactly `routes` with the attributes routewarden writes ([`check_exact_routes`]), not only
/// as many routes of our protocol.
/// Returns the wall time and the CPU time the process spent meanwhile (user and system, every
/// thread: the kernel's route inserts are system time of the thread that sends them).
pub fn rw_program_once_exact(routes: Arc<Vec<ClusterRoute>>) -> Result<(Duration, Duration)> {
    rw_program_checked(routes, Listener::Nothing, Mode::Classic, check_exact_routes).map(|t| (t.wall, t.cpu))
}

/// One timed programming: wall time, the process's CPU time meanwhile, the watch's backend.
struct Timed {
    wall: Duration,
    cpu: Duration,
    backend: String,
}

/// [`rw_program_once`], with `listener` attached first ([`attach`]). Returns the time and the
/// watch's backend (empty without the watch).
pub fn rw_program_once_with(routes: Arc<Vec<ClusterRoute>>, listener: Listener) -> Result<(Duration, String)> {
    rw_program_checked(routes, listener, Mode::Classic, |routes| {
        let got = count_routes(PROTO_OURS)?;
        ensure!(got == routes.len(), "{got} routes of protocol {PROTO_OURS} in the kernel, expected {}", routes.len());
        Ok(())
    })
    .map(|t| (t.wall, t.backend))
}

/// [`rw_program_once_with`] in `mode`, with `check` run on the routes in the namespace once
/// they are programmed (untimed).
fn rw_program_checked(routes: Arc<Vec<ClusterRoute>>, listener: Listener, mode: Mode, check: fn(&[ClusterRoute]) -> Result<()>) -> Result<Timed> {
    in_node_netns(move |rt| {
        let checked = Arc::clone(&routes);
        // Held until the programming is done; dropping it detaches the listener.
        let attached = attach(listener, rt)?;
        let backend = attached.backend();
        let work = async move {
            let cfg = mode.config();
            let objects = if mode == Mode::Nexthops { nexthop_objects(&routes) as u64 } else { 0 };
            let (t, cpu) = (Instant::now(), process_cpu()?);
            let mut r = Reconciler::new(cfg.clone(), cfg.policy_owning(&["10.0.0.0/8"]), RtNetlink::connect()?, SystemClock);
            r.set_datastore_synced(true);
            r.set_desired(&routes);
            let rep = r.apply().await;
            let took = (t.elapsed(), process_cpu()?.saturating_sub(cpu));
            ensure!(
                rep.writes == routes.len() as u64 && rep.nexthop_writes == objects && rep.error_count() == 0,
                "routewarden wrote {} of {} routes and {} of {objects} nexthop objects: {:?}",
                rep.writes,
                routes.len(),
                rep.nexthop_writes,
                rep.error_messages
            );
            Ok(took)
        };
        // A spawned task on the multi-thread runtime, as the agent runs `dataplane::run`.
        let (wall, cpu) = rt.block_on(rt.spawn(work))??;
        check(&checked)?;
        drop(attached);
        Ok(Timed { wall, cpu, backend })
    })
}

/// What listens to the namespace's route notifications while a writer runs (`watch-overhead`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listener {
    /// Nothing: the writer alone.
    Nothing,
    /// The listener floor ([`routewarden::bpf::route_watch::listener_floor`]): the
    /// socket-filter backend's socket with a classic filter that drops every message, the
    /// price of any one more listener of route notifications.
    Floor,
    /// The churn watch, started as the agent starts it ([`start_watch`]).
    Watch,
}

/// A [`Listener`] attached in the calling thread's namespace; dropping it detaches it.
pub enum Attached {
    /// [`Listener::Nothing`].
    Nothing,
    /// [`Listener::Floor`]: the socket, closed on drop.
    Floor(std::os::fd::OwnedFd),
    /// [`Listener::Watch`]: the watch and its events (drained by nobody: the channel holds
    /// 100,000), boxed (the watch is large beside a descriptor).
    Watch(Box<(RouteWatch, tokio::sync::mpsc::Receiver<RouteWatchEvent>)>),
}

impl Attached {
    /// The watch's backend (`socket-filter`, `fentry`, `kprobe`); `floor` for the floor, empty
    /// for nothing.
    pub fn backend(&self) -> String {
        match self {
            Attached::Nothing => String::new(),
            Attached::Floor(_) => "floor".into(),
            Attached::Watch(w) => w.0.backend().to_string(),
        }
    }
}

/// Attach `listener` in the calling thread's namespace.
///
/// # Errors
/// The floor's socket or the watch could not be started.
pub fn attach(listener: Listener, rt: &tokio::runtime::Runtime) -> Result<Attached> {
    Ok(match listener {
        Listener::Nothing => Attached::Nothing,
        Listener::Floor => Attached::Floor(routewarden::bpf::route_watch::listener_floor().map_err(|e| anyhow!("the listener floor: {e}"))?),
        Listener::Watch => Attached::Watch(Box::new(start_watch(rt)?)),
    })
}

/// Start the churn watch in the calling thread's namespace as the agent does (best backend,
/// our protocol classified `self`), with its events going to the returned receiver.
pub fn start_watch(rt: &tokio::runtime::Runtime) -> Result<(RouteWatch, tokio::sync::mpsc::Receiver<RouteWatchEvent>)> {
    let object = routewarden::bpf::embedded_object().context("no BPF object embedded (build with `cargo xtask bench`)")?;
    let config = RouteWatchConfig { self_protocol: 80, ..RouteWatchConfig::default() };
    let mut w = RouteWatch::start(object, &config).map_err(|e| anyhow!("start the route watch: {e}"))?;
    let (tx, rx) = tokio::sync::mpsc::channel(100_000);
    let _enter = rt.enter();
    w.spawn_reader(tx).map_err(|e| anyhow!("route watch reader: {e}"))?;
    Ok((w, rx))
}

/// Median of routewarden's cold programming in nexthop mode ([`rw_program_once_nh`]), measured
/// now or taken from earlier in the run.
pub fn rw_program_median_nh(opts: &Options, shared: &mut Shared) -> Result<Duration> {
    if let Some((d, n)) = shared.rw_program_nh {
        if n == opts.routes {
            return Ok(d);
        }
    }
    let routes = Arc::new(cluster_routes(opts.routes));
    let mut rw = Vec::new();
    for _ in 0..opts.runs {
        rw.push(rw_program_once_nh(routes.clone())?);
    }
    let d = median(rw);
    shared.rw_program_nh = Some((d, opts.routes));
    Ok(d)
}

/// Median of routewarden's cold programming, measured now or taken from earlier in the run.
pub fn rw_program_median(opts: &Options, shared: &mut Shared) -> Result<Duration> {
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
