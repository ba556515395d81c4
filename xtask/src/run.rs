//! `cargo xtask run`: the agent on the example cluster, inside a throw-away lab.
//!
//! Builds everything, creates one network namespace per node of the example cluster (host NIC
//! `eth0` with the node's BGP addresses on a shared bridge, a `tunl0` stand-in), starts the
//! agent for one node in its namespace, sends a little UDP traffic between lab nodes so the
//! TC probe has something to count, prints the node's routes and the agent's metrics, and
//! tears the lab down on Ctrl-C or after `--duration`. The machine's own namespace is never
//! touched.

use std::net::UdpSocket;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use routewarden_lab::{Lab, LabSpec};

use crate::{build::build_all, workspace_root};

/// Options of `cargo xtask run`.
#[derive(Args)]
pub struct RunArgs {
    /// The node the agent runs as (a Node of the example cluster).
    #[arg(long, default_value = "node-a")]
    pub node: String,
    /// Stop after this many seconds (default: run until Ctrl-C).
    #[arg(long)]
    pub duration: Option<u64>,
    /// The cluster description (file or directory of YAML).
    #[arg(long, default_value = "examples/cluster")]
    pub datastore: PathBuf,
    /// Extra arguments for `routewarden run` (after `--`).
    #[arg(trailing_var_arg = true)]
    pub agent_args: Vec<String>,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: nix::libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

const METRICS_PORT: u16 = 9695;

/// Fetch `path` from the agent's HTTP server on the node's loopback.
fn http_get(lab: &Lab, node: &str, path: &str) -> Result<String> {
    lab.http_get(node, METRICS_PORT, path).map(|(_, body)| body)
}

/// Send `count` UDP datagrams from `from` to `to_addr:9` (discard) across the lab bridge.
fn send_udp(lab: &Lab, from: &str, to_addr: std::net::IpAddr, count: u32) -> Result<()> {
    lab.in_netns(from, move || -> Result<()> {
        let sock = UdpSocket::bind(("0.0.0.0", 0))?;
        for i in 0..count {
            sock.send_to(format!("routewarden lab probe {i}").as_bytes(), (to_addr, 9))?;
        }
        Ok(())
    })?
}

/// Stops the agent (SIGTERM, then SIGKILL after 10 s) on every exit path, before the lab is
/// removed.
struct AgentGuard(Child);

impl Drop for AgentGuard {
    fn drop(&mut self) {
        stop_child(&mut self.0);
    }
}

fn stop_child(child: &mut Child) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(0));
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            eprintln!("agent exited: {status}");
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Run the main job.
pub fn run(args: &RunArgs) -> Result<()> {
    if !routewarden_lab::is_root() {
        bail!("`cargo xtask run` creates network namespaces and needs root");
    }
    let bin = build_all()?;
    let root = workspace_root();
    let datastore = if args.datastore.is_absolute() { args.datastore.clone() } else { root.join(&args.datastore) };
    let nodes = crate::lab_nodes::from_cluster(&datastore)?;
    if !nodes.iter().any(|n| n.name == args.node) {
        bail!("node {:?} is not in {} (nodes: {})", args.node, datastore.display(), nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>().join(", "));
    }
    for sig in [nix::sys::signal::Signal::SIGINT, nix::sys::signal::Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::Handler(on_signal)).context("install signal handler")?;
        }
    }
    eprintln!("lab: building {} node namespaces ({})", nodes.len(), nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>().join(", "));
    let lab = Lab::build(LabSpec::new(nodes.clone()))?;
    eprintln!("lab: namespaces {}-*, agent runs in {}", lab.tag(), lab.node_ns(&args.node));

    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &lab.node_ns(&args.node)])
        .arg(&bin)
        .args(["run", "--datastore"])
        .arg(format!("file:{}", datastore.display()))
        .args(["--node", &args.node, "--metrics-addr", &format!("127.0.0.1:{METRICS_PORT}"), "--log-format", "text"])
        .args(&args.agent_args)
        .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()));
    eprintln!("+ {}", crate::display(&cmd));
    let mut agent = AgentGuard(cmd.spawn().context("start the agent")?);
    let child = &mut agent.0;

    // Give the agent time to load, program and attach; then show the result.
    std::thread::sleep(Duration::from_secs(3));
    if let Ok(Some(status)) = child.try_wait() {
        bail!("the agent exited early: {status}");
    }
    for peer in nodes.iter().filter(|n| n.name != args.node) {
        if let Some(addr) = peer.addresses.iter().find(|a| !a.contains(':')) {
            let ip: std::net::IpAddr = addr.split('/').next().unwrap_or_default().parse()?;
            if let Err(e) = send_udp(&lab, &args.node, ip, 5) {
                eprintln!("lab: UDP probe from {} to {} ({ip}) failed: {e}", args.node, peer.name);
            }
        }
    }
    std::thread::sleep(Duration::from_secs(2));
    println!("\n=== routes in {} (ip route show; ip -6 route show) ===", args.node);
    print!("{}", lab.ip(&args.node, &["route", "show"])?);
    print!("{}", lab.ip(&args.node, &["-6", "route", "show"])?);
    println!("\n=== /readyz ===");
    print!("{}", http_get(&lab, &args.node, "/readyz").unwrap_or_else(|e| format!("unreachable: {e}\n")));
    println!("\n=== /metrics (routewarden_*) ===");
    let metrics = http_get(&lab, &args.node, "/metrics").unwrap_or_else(|e| format!("unreachable: {e}\n"));
    for line in metrics.lines().filter(|l| l.starts_with("routewarden_")) {
        println!("{line}");
    }
    println!(
        "\nThe agent keeps running in {}; metrics: `ip netns exec {} curl -s 127.0.0.1:{METRICS_PORT}/metrics`. {}",
        lab.node_ns(&args.node),
        lab.node_ns(&args.node),
        match args.duration {
            Some(d) => format!("Stopping after {d} s."),
            None => "Ctrl-C stops it and removes the lab.".into(),
        }
    );

    let started = Instant::now();
    while !STOP.load(Ordering::SeqCst) {
        if args.duration.is_some_and(|d| started.elapsed() >= Duration::from_secs(d)) {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            eprintln!("agent exited: {status}");
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(agent);
    drop(lab);
    eprintln!("lab: removed");
    Ok(())
}
