//! `cold-program-vs-bird` (benchmark 2): both processes on the same start line. BIRD 2 started
//! on its configuration (a static protocol with the routes) and the release agent started on a
//! file datastore whose cluster gives node-0000 the same routes, each in a fresh namespace,
//! each timed from its spawn until the last of its routes is in the kernel (counted from route
//! notifications). Ratio = BIRD ÷ agent. Target: at least 1 (a node whose agent starts cold
//! has its routes no later than with BIRD). Needs `--agent-bin`.
//!
//! Beside it, named as such, the in-process figures: BIRD against routewarden's cold
//! programming of benchmark 1's routes in-process from a precomputed list (`ratio_in_process`,
//! and `ratio_nh` in nexthop-object mode), each against at least 2 (the programming twice
//! BIRD's speed): `met_in_process`, `met_nh`. Reported, not the row's target: the in-process
//! ratio has BIRD's start-up on BIRD's side only, so it is the programming claim, never the
//! start-up one.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use ipnet::IpNet;
use routewarden::dataplane::{spawn_watcher, DataplaneEvent};
use routewarden::datastore::FileDatastore;
use routewarden::ownership::{OwnershipConfig, Role};
use routewarden::plan::{plan, PlanConfig};
use routewarden::routes::{ClusterRoute, RouteDevices};
use routewarden::vocabulary::RoutePath;

use crate::fixtures::write_footprint_cluster;
use crate::netns::{count_routes, in_node_netns};
use crate::report::{fmt_ratio, kv, ms};
use crate::runs::{rw_program_median, rw_program_median_nh, Listener};
use crate::{median, Benchmark, Options, Outcome, Shared, Target};

/// BIRD 2 (Debian `bird2`).
pub const BIRD: &str = "/usr/sbin/bird";

/// This benchmark's registry entry: its name and [`run`].
pub const BENCHMARK: Benchmark = Benchmark { name: "cold-program-vs-bird", run };

/// A BIRD 2 configuration: a static protocol with `routes`, exported to the kernel's main
/// table with metric 1024 (as Calico's BIRD does), device scan, nothing imported.
pub(crate) fn bird_config(dir: &Path, routes: &[ClusterRoute]) -> String {
    let mut s = String::with_capacity(routes.len() * 60 + 512);
    let _ = writeln!(s, "log \"{}\" {{ info, remote, warning, error, auth, fatal, bug }};", dir.join("bird.log").display());
    s.push_str(
        "router id 10.0.0.11;\n\
         protocol device { }\n\
         protocol kernel {\n  ipv4 { import none; export all; };\n  metric 1024;\n  learn off;\n}\n\
         protocol static {\n  ipv4;\n",
    );
    for r in routes {
        if r.path == RoutePath::Blackhole {
            let _ = writeln!(s, "  route {} blackhole;", r.dst);
            continue;
        }
        let gw = r.gateway.map(|g| g.to_string()).unwrap_or_default();
        let dev = if r.path == RoutePath::Tunnel { "tunl0" } else { "eth0" };
        let _ = writeln!(s, "  route {} via {gw}%{dev} onlink;", r.dst);
    }
    s.push_str("}\n");
    s
}

/// Start BIRD in a fresh namespace and time from the spawn until all `n` routes of protocol
/// `bird` are in the kernel ([`spawn_until_routes`]). Returns the time and whether the
/// notification socket overran (then a dump loop counted).
fn bird_once(conf: &Path, dir: &Path, n: usize) -> Result<(Duration, bool)> {
    bird_once_with(conf, dir, n, Listener::Nothing)
}

/// [`bird_once`], with `listener` attached in the namespace before BIRD starts
/// ([`crate::runs::attach`]), for benchmark 5.
pub(crate) fn bird_once_with(conf: &Path, dir: &Path, n: usize, listener: Listener) -> Result<(Duration, bool)> {
    let sock = dir.join("bird.ctl");
    let _ = std::fs::remove_file(&sock);
    let mut cmd = Command::new(BIRD);
    cmd.arg("-f").arg("-c").arg(conf).arg("-s").arg(&sock);
    spawn_until_routes_with(cmd, 12, "bird", n, listener)
}

/// Start the release agent on the file datastore `data` for node-0000 (its devices named, as
/// the namespace has them) in a fresh namespace and time from the spawn until all `n` of its
/// routes (protocol 80) are in the kernel.
fn agent_once(agent: &Path, data: &Path, n: usize) -> Result<(Duration, bool)> {
    let mut cmd = Command::new(agent);
    cmd.args(["run", "--node", "node-0000", "--host-device", "eth0", "--tunnel-device", "tunl0", "--metrics-addr", "127.0.0.1:0", "--log-format", "text"])
        .arg("--datastore")
        .arg(format!("file:{}", data.display()))
        .env("RUST_LOG", "warn")
        // As the image runs it (Containerfile: the allocator's start-up option).
        .env("MIMALLOC_ARENA_EAGER_COMMIT", "0");
    spawn_until_routes_with(cmd, 80, "80", n, Listener::Nothing)
}

/// Spawn `cmd` in a fresh namespace and time from the spawn until `n` routes of `protocol`
/// are in the kernel, counted from route notifications (a dump loop by `protocol_name` if the
/// notification socket overruns); then SIGTERM it and check the kernel holds exactly `n`.
/// `listener` is attached in the namespace first and held until then.
fn spawn_until_routes_with(mut cmd: Command, protocol: u8, protocol_name: &'static str, n: usize, listener: Listener) -> Result<(Duration, bool)> {
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    in_node_netns(move |rt| {
        // Held until the writer is done; dropping it detaches the listener.
        let attached = crate::runs::attach(listener, rt)?;
        let out = rt.block_on(async {
            let (tx, mut rx) = tokio::sync::mpsc::channel(200_000);
            let watcher = spawn_watcher(tx)?;
            let t0 = Instant::now();
            let mut child = cmd.spawn().with_context(|| format!("start {}", cmd.get_program().display()))?;
            let deadline = tokio::time::Instant::now() + Duration::from_mins(2);
            let mut seen: HashSet<IpNet> = HashSet::new();
            let mut overrun = false;
            let outcome: Result<Duration> = async {
                while seen.len() < n {
                    match tokio::time::timeout_at(deadline, rx.recv()).await {
                        Ok(Some(DataplaneEvent::RouteAdded { route, .. })) if route.protocol == protocol => {
                            seen.insert(route.key.dst);
                        }
                        Ok(Some(DataplaneEvent::RouteRemoved { route, .. })) if route.protocol == protocol => {
                            seen.remove(&route.key.dst);
                        }
                        Ok(Some(DataplaneEvent::Overrun)) => {
                            overrun = true;
                            break;
                        }
                        Ok(Some(_)) => {}
                        Ok(None) => bail!("the route watcher stopped"),
                        Err(_) => bail!("only {} of {n} routes of protocol {protocol} in the kernel after 120 s", seen.len()),
                    }
                }
                if overrun {
                    while count_routes(protocol_name)? < n {
                        ensure!(tokio::time::Instant::now() < deadline, "routes of protocol {protocol} incomplete after 120 s");
                        if let Some(status) = child.try_wait()? {
                            bail!("{} exited early: {status}", cmd.get_program().display());
                        }
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                }
                Ok(t0.elapsed())
            }
            .await;
            watcher.abort();
            let in_kernel = count_routes(protocol_name);
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(0)), nix::sys::signal::Signal::SIGTERM);
            let _ = child.wait();
            let took = outcome?;
            let in_kernel = in_kernel?;
            ensure!(in_kernel == n, "{in_kernel} routes of protocol {protocol} in the kernel, expected {n}");
            Ok((took, overrun))
        });
        drop(attached);
        out
    })
}

/// The footprint cluster (`write_footprint_cluster`, `nodes` nodes, `routes` blocks) in `dir`,
/// and node-0000's desired routes from it as routewarden plans them (felix role: the IPIP
/// class; devices `tunl0` and `eth0`): the one input both processes start from.
fn same_routes_cluster(dir: &Path, nodes: usize, routes: usize) -> Result<Vec<ClusterRoute>> {
    write_footprint_cluster(dir, nodes, routes)?;
    let snapshot = FileDatastore::load(dir).context("load the generated cluster")?;
    let ownership = OwnershipConfig { role: Role::Felix, version: "auto".parse().map_err(|e| anyhow::anyhow!("{e}"))?, node: Some("node-0000".into()) };
    let config = PlanConfig {
        node: "node-0000".into(),
        ownership,
        devices: RouteDevices { tunnel: "tunl0".into(), host_nic: "eth0".into() },
        protocol: 80,
        table: 254,
    };
    Ok(plan(&snapshot, &config, &std::collections::BTreeSet::new(), &[]).desired.values().map(|r| (**r).clone()).collect())
}

/// Benchmark 2: BIRD's time from start until all its routes are in the kernel / the agent's,
/// both started cold on their own input for the same routes; the in-process ratios beside it.
pub fn run(opts: &Options, shared: &mut Shared) -> Result<Outcome> {
    if !Path::new(BIRD).exists() {
        return Ok(Outcome::Skipped {
            name: BENCHMARK.name.into(),
            reason: format!("{BIRD} not installed (Debian bird2; `cargo xtask test` installs it)"),
        });
    }
    let Some(agent) = opts.agent_bin.clone() else {
        return Ok(Outcome::Skipped { name: BENCHMARK.name.into(), reason: "no --agent-bin (cargo xtask bench passes target/release/routewarden)".into() });
    };
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("cluster");
    std::fs::create_dir(&data)?;
    let routes = same_routes_cluster(&data, opts.footprint_nodes, opts.routes)?;
    let conf = dir.path().join("bird.conf");
    std::fs::write(&conf, bird_config(dir.path(), &routes))?;
    let (mut bird, mut agent_times) = (Vec::new(), Vec::new());
    let mut fallbacks = 0;
    // Alternate, so slow phases of a noisy machine hit both sides.
    for _ in 0..opts.runs {
        let (d, overrun) = bird_once(&conf, dir.path(), routes.len())?;
        bird.push(d);
        fallbacks += usize::from(overrun);
        let (d, overrun) = agent_once(&agent, &data, routes.len())?;
        agent_times.push(d);
        fallbacks += usize::from(overrun);
    }
    let (bird, agent_ms) = (median(bird), median(agent_times));
    // In-process: benchmark 1's routes from a precomputed list, routewarden's work only.
    let rw = rw_program_median(opts, shared)?;
    let rw_nh = rw_program_median_nh(opts, shared)?;
    // The same start line: the agent's start (its BPF watches loaded and verified before its
    // first write, which BIRD has no counterpart of) is in its time.
    let target = Target::AtLeast(1.0);
    // In-process: the programming alone against BIRD's whole start.
    let in_process = Target::AtLeast(2.0);
    let ratio_in_process = bird.as_secs_f64() / rw.as_secs_f64();
    let ratio_nh = bird.as_secs_f64() / rw_nh.as_secs_f64();
    let yes_no = |met: bool| if met { "yes" } else { "no" };
    Ok(Outcome::Measured {
        name: BENCHMARK.name.into(),
        ratio: bird.as_secs_f64() / agent_ms.as_secs_f64(),
        target,
        ok: true,
        details: vec![
            kv("routes", routes.len()),
            kv("bird_ms", ms(bird)),
            kv("agent_ms", ms(agent_ms)),
            kv("watch", if fallbacks == 0 { "notifications" } else { "dump-loop" }),
            kv("runs", opts.runs),
            kv("rw_in_process_ms", ms(rw)),
            kv("ratio_in_process", fmt_ratio(ratio_in_process)),
            kv("target_in_process", ">=2"),
            kv("met_in_process", yes_no(in_process.met(ratio_in_process))),
            kv("rw_nh_in_process_ms", ms(rw_nh)),
            kv("ratio_nh", fmt_ratio(ratio_nh)),
            kv("met_nh", yes_no(in_process.met(ratio_nh))),
        ],
    })
}
