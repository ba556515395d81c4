//! Shared helpers for the dataplane's network-namespace tests.
#![allow(dead_code, reason = "each test file uses a different subset")]

use std::process::Command;
use std::time::Duration;

use routewarden::dataplane::{
    self, spawn_watcher, ApplyReport, DataplaneCommand, DataplaneConfig, DataplaneEvent, OwnershipPolicy, Reconciler, RtNetlink, SystemClock,
};
use routewarden::routes::ClusterRoute;
use routewarden::vocabulary::{PoolClass, RoutePath};
use routewarden_lab::{cluster_routes, NetNsGuard};
use tokio::sync::mpsc;

/// A fresh network namespace with `lo`, an `eth0` stand-in (10.0.0.11/24, fd00::11/64) and a
/// `tunl0` stand-in (veth), all up, plus a current-thread runtime whose sockets live there.
pub struct Netns {
    pub guard: NetNsGuard,
    pub rt: tokio::runtime::Runtime,
}

impl Netns {
    pub fn new() -> Netns {
        let guard = NetNsGuard::new().expect("create netns");
        for cmd in [
            "link add eth0 type veth peer name eth0p",
            "addr add 10.0.0.11/24 dev eth0",
            "addr add fd00::11/64 dev eth0 nodad",
            "link set eth0p up",
            "link set eth0 up",
            "link add tunl0 type veth peer name tunpeer",
            "link set tunpeer up",
            "link set tunl0 up",
        ] {
            ip(cmd);
        }
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        Netns { guard, rt }
    }
}

/// Run `ip <args>` (whitespace-split) in the current thread's namespace; panic on failure.
pub fn ip(args: &str) -> String {
    let out = Command::new("ip").args(args.split_whitespace()).output().expect("run ip");
    assert!(out.status.success(), "ip {args}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Lines of `ip [-6] route show table <table>`, trimmed, in kernel order (empty when the
/// table does not exist). Runs iproute2's `ip` directly: in the QEMU guest `sh` is busybox,
/// whose shell runs its own `ip` applet, which prints nothing for `route show table <id>`.
pub fn routes(v6: bool, table: u32) -> Vec<String> {
    let table = table.to_string();
    let mut args = vec!["route", "show", "table", table.as_str()];
    if v6 {
        args.insert(0, "-6");
    }
    let out = Command::new("ip").args(&args).output().expect("run ip route");
    String::from_utf8_lossy(&out.stdout).lines().map(|l| l.trim().to_string()).filter(|l| !l.is_empty()).collect()
}

/// Lines of both families in `table` that carry `proto <p>`.
pub fn with_proto(table: u32, proto: &str) -> Vec<String> {
    let needle = format!(" proto {proto} ");
    let mut v: Vec<String> = routes(false, table).into_iter().chain(routes(true, table)).collect();
    v.retain(|l| format!("{l} ").contains(&needle));
    v
}

pub fn route(dst: &str, path: RoutePath, gw: Option<&str>) -> ClusterRoute {
    route_class(dst, path, gw, cluster_routes::class_of(path))
}

pub fn route_class(dst: &str, path: RoutePath, gw: Option<&str>, class: PoolClass) -> ClusterRoute {
    let origin = match path {
        RoutePath::Blackhole => cluster_routes::own_block(dst),
        _ => cluster_routes::remote_block(dst, "node-x"),
    };
    cluster_routes::route(dst, path, gw, class, "default-ipv4-ippool", origin)
}

/// The example node-a view: own block blackholed, node-b (same subnet) via eth0, node-c
/// (other subnet) via the tunnel, a borrowed /32 of node-a's block used on node-c, IPv6 too.
pub fn example_cluster() -> Vec<ClusterRoute> {
    vec![
        route("10.244.10.0/26", RoutePath::Blackhole, None),
        route("10.244.20.0/26", RoutePath::HostNic, Some("10.0.0.12")),
        route("10.244.30.0/26", RoutePath::Tunnel, Some("10.0.1.13")),
        route("10.244.10.7/32", RoutePath::Tunnel, Some("10.0.1.13")),
        route("fd00:10:244:10::/122", RoutePath::Blackhole, None),
        route("fd00:10:244:20::/122", RoutePath::HostNic, Some("fd00::12")),
    ]
}

/// `ip route` lines routewarden should leave for [`example_cluster`] (protocol 80, table
/// main), IPv4 then IPv6, each in kernel order.
pub fn example_lines() -> Vec<String> {
    [
        "blackhole 10.244.10.0/26 proto 80 metric 1024",
        "10.244.10.7 via 10.0.1.13 dev tunl0 proto 80 metric 1024 onlink",
        "10.244.20.0/26 via 10.0.0.12 dev eth0 proto 80 metric 1024 onlink",
        "10.244.30.0/26 via 10.0.1.13 dev tunl0 proto 80 metric 1024 onlink",
        "blackhole fd00:10:244:10::/122 dev lo proto 80 metric 1024 pref medium",
        "fd00:10:244:20::/122 via fd00::12 dev eth0 proto 80 metric 1024 onlink pref medium",
    ]
    .iter()
    .map(ToString::to_string)
    .collect()
}

/// A deadline for waits on the kernel reaching a state: generous, since a loaded 2-core
/// machine (or the QEMU lane under TCG) can take many times the usual milliseconds; latency
/// targets belong in the benchmarks. Tests print the time it took.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// Poll [`with_proto`]`(table, proto)` every 10 ms until it equals `want`; panic naming `what`
/// (with the last state) after [`DEADLINE`]. Returns how long it took.
pub async fn wait_for_lines(what: &str, table: u32, proto: &str, want: &[String]) -> Duration {
    let started = std::time::Instant::now();
    loop {
        let got = with_proto(table, proto);
        if got == want {
            return started.elapsed();
        }
        assert!(started.elapsed() < DEADLINE, "{what}: not within {DEADLINE:?}; now {got:#?}, want {want:#?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Poll [`with_proto`]`(table, proto)` every 10 ms for `window`, requiring `want` at every
/// poll: for what must not happen, a fixed observation window watched throughout.
pub async fn lines_stay(what: &str, table: u32, proto: &str, want: &[String], window: Duration) {
    let end = std::time::Instant::now() + window;
    while std::time::Instant::now() < end {
        assert_eq!(with_proto(table, proto), want, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub type RealReconciler = Reconciler<RtNetlink, SystemClock>;

/// The IP pools of the test cluster (`cluster()`): our routes inside them are ours.
pub const POOLS: &[&str] = &["10.244.0.0/16", "fd00:10:244::/48"];

/// A reconciler on a fresh rtnetlink connection, datastore synced. Must run inside the
/// namespace's runtime.
pub fn reconciler(cfg: DataplaneConfig, policy: Option<OwnershipPolicy>) -> RealReconciler {
    let policy = policy.unwrap_or_else(|| cfg.policy_owning(POOLS));
    let nl = RtNetlink::connect().expect("rtnetlink");
    let mut r = Reconciler::new(cfg, policy, nl, SystemClock);
    r.set_datastore_synced(true);
    r
}

/// The dataplane driven as the agent drives it: [`dataplane::run`] over a reconciler, fed by
/// the route and link watcher, with the commands, the apply reports and the driver's task at
/// hand. Close `commands` and await `task` to stop it.
pub struct Driver {
    pub commands: mpsc::Sender<DataplaneCommand>,
    pub reports: mpsc::Receiver<ApplyReport>,
    pub task: tokio::task::JoinHandle<RealReconciler>,
}

impl Driver {
    /// Start the watcher and the driver over `r` (default debounce), tell it the datastore is
    /// synced and `routes` are desired. Must run inside the namespace's runtime.
    pub async fn start(r: RealReconciler, routes: Vec<ClusterRoute>) -> Driver {
        let (commands, cmd_rx) = mpsc::channel(16);
        let (ev_tx, ev_rx) = mpsc::channel(10_000);
        let (rep_tx, reports) = mpsc::channel(1000);
        spawn_watcher(ev_tx).expect("route and link watcher");
        let task = tokio::spawn(dataplane::run(r, cmd_rx, ev_rx, rep_tx, dataplane::DEFAULT_DEBOUNCE));
        commands.send(DataplaneCommand::SetDatastoreSynced(true)).await.expect("driver running");
        commands.send(DataplaneCommand::SetDesired { routes: route_map(&routes), handovers: vec![] }).await.expect("driver running");
        Driver { commands, reports, task }
    }
}

/// Route notifications seen on a monitoring socket (the test's own watcher).
pub struct Monitor {
    rx: mpsc::Receiver<DataplaneEvent>,
}

impl Monitor {
    pub fn start() -> Monitor {
        let (tx, rx) = mpsc::channel(100_000);
        spawn_watcher(tx).expect("subscribe");
        Monitor { rx }
    }

    /// Wait `settle`, then return every event received so far.
    pub async fn drain(&mut self, settle: Duration) -> Vec<DataplaneEvent> {
        tokio::time::sleep(settle).await;
        let mut v = Vec::new();
        while let Ok(e) = self.rx.try_recv() {
            v.push(e);
        }
        v
    }

    /// Route notifications only (adds and removes), rendered `+ dst proto p` / `- dst proto p`.
    ///
    /// Kernel-protocol (2) routes are left out: the kernel adds IPv6 `fe80::/64` and
    /// `ff00::/8` for a link some time after it comes up (later still on a loaded machine),
    /// and those are nobody's writes.
    pub async fn route_events(&mut self, settle: Duration) -> Vec<String> {
        self.drain(settle)
            .await
            .into_iter()
            .filter(|e| match e {
                DataplaneEvent::RouteAdded { route, .. } | DataplaneEvent::RouteRemoved { route, .. } => route.protocol != 2,
                _ => true,
            })
            .filter_map(|e| match e {
                DataplaneEvent::RouteAdded { route, .. } => Some(format!("+ {} proto {}", route.key, route.protocol)),
                DataplaneEvent::RouteRemoved { route, .. } => Some(format!("- {} proto {}", route.key, route.protocol)),
                _ => None,
            })
            .collect()
    }
}

/// `routes` as the app hands them to the dataplane task: by destination, the first of a
/// destination kept (the plan has one route per destination).
pub fn route_map(routes: &[ClusterRoute]) -> routewarden::routes::RouteMap {
    let mut map = routewarden::routes::RouteMap::new();
    for r in routes {
        if !map.contains_key(&r.dst) {
            map.insert(r.dst, std::sync::Arc::new(r.clone()));
        }
    }
    map
}
