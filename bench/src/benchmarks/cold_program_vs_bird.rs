//! `cold-program-vs-bird` (benchmark 2): BIRD 2's time from its start until all routes of a
//! static protocol are in the kernel, against routewarden's cold programming of the same routes
//! (benchmark 1's median). Target: at least 2.
//!
//! Also against routewarden in nexthop-object mode (benchmark 1's `rw_nh_ms`):
//! `ratio_nh` = BIRD ÷ nexthop mode, with the same target, reported as `met_nh`; the line's
//! `ratio` and `met` stay classic mode's.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use ipnet::IpNet;
use routewarden::dataplane::{spawn_watcher, DataplaneEvent};
use routewarden::routes::ClusterRoute;
use routewarden::vocabulary::RoutePath;

use crate::fixtures::cluster_routes;
use crate::netns::{count_routes, in_node_netns};
use crate::report::{fmt_ratio, kv, ms};
use crate::runs::{rw_program_median, rw_program_median_nh};
use crate::{median, Benchmark, Options, Outcome, Shared, Target};

/// BIRD 2 (Debian `bird2`).
pub const BIRD: &str = "/usr/sbin/bird";

/// This benchmark's registry entry: its name and [`run`].
pub const BENCHMARK: Benchmark = Benchmark { name: "cold-program-vs-bird", run };

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
/// cold programming (benchmark 1's median, measured now if not yet), classic and, as
/// `ratio_nh`, in nexthop mode.
pub fn run(opts: &Options, shared: &mut Shared) -> Result<Outcome> {
    if !Path::new(BIRD).exists() {
        return Ok(Outcome::Skipped {
            name: BENCHMARK.name.into(),
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
    let rw_nh = rw_program_median_nh(opts, shared)?;
    let target = Target::AtLeast(2.0);
    let ratio_nh = bird.as_secs_f64() / rw_nh.as_secs_f64();
    Ok(Outcome::Measured {
        name: BENCHMARK.name.into(),
        ratio: bird.as_secs_f64() / rw.as_secs_f64(),
        target,
        ok: true,
        details: vec![
            kv("routes", routes.len()),
            kv("bird_ms", ms(bird)),
            kv("rw_ms", ms(rw)),
            kv("bird_watch", if fallbacks == 0 { "notifications" } else { "dump-loop" }),
            kv("runs", opts.runs),
            kv("rw_nh_ms", ms(rw_nh)),
            kv("ratio_nh", fmt_ratio(ratio_nh)),
            kv("met_nh", if target.met(ratio_nh) { "yes" } else { "no" }),
        ],
    })
}
