//! `cargo xtask run`: the agent on the example cluster, inside a throw-away lab, telling the
//! story routewarden exists for.
//!
//! Builds everything, creates one network namespace per node of the example cluster (host NIC
//! `eth0` with the node's BGP addresses on a shared bridge, a `tunl0` stand-in), starts the
//! agent for one node in its namespace, and then:
//! 1. prints the ownership decision as `routewarden explain` shows it and the routes the agent
//!    programmed into the kernel;
//! 2. starts a second writer in the node's namespace that fights the agent over one cluster
//!    route (the same key, another next hop, BIRD's protocol; `ip` run as `bird`, since the
//!    watch classes a writer by its process) for a few seconds, and shows the in-kernel watch
//!    catching it (`routewarden events` lines with both writers named by process, the conflict
//!    and flap counters from `/metrics`), the agent putting its route back, and the watch going
//!    quiet once the fight stops;
//! 3. sends a little traffic to every remote block and shows the forwarding watch's per-pool
//!    path counters;
//! 4. says where to look next.
//!
//! `--metrics` adds the full metrics dump; `--summary <file>` writes what was observed as JSON
//! (the test of this job reads it). The lab goes on Ctrl-C or after `--duration`; the
//! machine's own namespace is never touched.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::net::{IpAddr, UdpSocket};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
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
    /// Stop this many seconds after the story is told (default: run until Ctrl-C).
    #[arg(long)]
    pub duration: Option<u64>,
    /// The cluster description (file or directory of YAML).
    #[arg(long, default_value = "examples/cluster")]
    pub datastore: PathBuf,
    /// How long the second writer fights over the route, in seconds.
    #[arg(long, default_value_t = 5)]
    pub fight_seconds: u64,
    /// Also print every `routewarden_*` metric at the end.
    #[arg(long)]
    pub metrics: bool,
    /// Write what was observed (events, counters, the route put back) as JSON to this file.
    #[arg(long)]
    pub summary: Option<PathBuf>,
    /// Use this agent binary instead of building one (it must embed the BPF object).
    #[arg(long)]
    pub agent_bin: Option<PathBuf>,
    /// Extra arguments for `routewarden run` (after `--`).
    #[arg(trailing_var_arg = true)]
    pub agent_args: Vec<String>,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: nix::libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

const METRICS_PORT: u16 = 9695;

/// The route-watch window the job gives the agent (and `events`), seconds: short, so the watch
/// goes quiet within the run. The agent's default is 30 s.
const WATCH_WINDOW: u64 = 5;

/// Bail out of the story when Ctrl-C (or SIGTERM) arrived; the guards remove the lab.
fn check_stop() -> Result<()> {
    if STOP.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(())
}

/// Stops a child (SIGTERM, then SIGKILL after 10 s) on every exit path, before the lab is
/// removed.
struct ChildGuard(Child, &'static str);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        stop_child(&mut self.0, self.1);
    }
}

fn stop_child(child: &mut Child, what: &str) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(0));
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            if !status.success() {
                eprintln!("{what} exited: {status}");
            }
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// One `/metrics` scrape: `name{labels}` → value, for the `routewarden_*` series.
struct Scrape(BTreeMap<String, f64>);

impl Scrape {
    fn get(lab: &Lab, node: &str) -> Result<Scrape> {
        let (status, body) = lab.http_get(node, METRICS_PORT, "/metrics")?;
        if status != 200 {
            bail!("/metrics answered {status}");
        }
        let mut out = BTreeMap::new();
        for line in body.lines().filter(|l| l.starts_with("routewarden_")) {
            if let Some((series, value)) = line.rsplit_once(' ') {
                if let Ok(v) = value.parse() {
                    out.insert(series.to_owned(), v);
                }
            }
        }
        Ok(Scrape(out))
    }

    /// Series whose name (before `{`) is `name`.
    fn family<'a>(&'a self, name: &'a str) -> impl Iterator<Item = (&'a String, f64)> + 'a {
        self.0.iter().filter(move |(s, _)| s.split('{').next() == Some(name)).map(|(s, v)| (s, *v))
    }

    fn sum(&self, name: &str) -> f64 {
        self.family(name).map(|(_, v)| v).sum()
    }
}

/// Run `program args` in `node`'s namespace; fails with its stderr.
fn run_in(lab: &Lab, node: &str, program: &std::path::Path, args: &[&str]) -> Result<()> {
    let out = lab.command(node, &program.display().to_string()).args(args).output().with_context(|| format!("run {}", program.display()))?;
    anyhow::ensure!(out.status.success(), "{} {args:?}: {}", program.display(), String::from_utf8_lossy(&out.stderr));
    Ok(())
}

/// Poll until `f` returns Some, Ctrl-C, or `timeout`.
fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Result<Option<T>> {
    let deadline = Instant::now() + timeout;
    loop {
        check_stop()?;
        if let Some(v) = f() {
            return Ok(Some(v));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One route routewarden programmed, from `ip -j route show proto <p>`.
#[derive(Clone, Debug)]
struct KernelRoute {
    dst: String,
    gateway: Option<String>,
    dev: Option<String>,
    metric: u32,
}

fn our_routes(lab: &Lab, node: &str, protocol: &str) -> Result<Vec<KernelRoute>> {
    let text = lab.ip(node, &["-j", "route", "show", "proto", protocol])?;
    let v: serde_json::Value = serde_json::from_str(&text).context("parse ip -j route")?;
    Ok(v.as_array()
        .into_iter()
        .flatten()
        .map(|r| KernelRoute {
            dst: r["dst"].as_str().unwrap_or_default().to_owned(),
            gateway: r["gateway"].as_str().map(str::to_owned),
            dev: r["dev"].as_str().map(str::to_owned),
            metric: r["metric"].as_u64().and_then(|m| u32::try_from(m).ok()).unwrap_or(0),
        })
        .collect())
}

/// An address inside `dst` (a /26 block or a /32) to send probes to: the block's 7th address.
fn probe_address(dst: &str) -> Option<IpAddr> {
    let (addr, len) = dst.split_once('/').unwrap_or((dst, "32"));
    let IpAddr::V4(a) = addr.parse::<IpAddr>().ok()? else { return None };
    let offset = if len == "32" { 0 } else { 7 };
    Some(IpAddr::V4(std::net::Ipv4Addr::from(u32::from(a) + offset)))
}

/// Send `count` UDP datagrams from the node to `to:9` (discard).
fn send_udp(lab: &Lab, node: &str, to: IpAddr, count: u32) -> Result<()> {
    lab.in_netns(node, move || -> Result<()> {
        let sock = UdpSocket::bind(("0.0.0.0", 0))?;
        for i in 0..count {
            // A route via the tunnel stand-in may not deliver; the watch counts at egress.
            let _ = sock.send_to(format!("routewarden lab probe {i}").as_bytes(), (to, 9));
        }
        Ok(())
    })?
}

/// What the job observed, for `--summary`.
#[derive(Default)]
struct Observed {
    target: String,
    second_writer_gateway: String,
    events: Vec<String>,
    conflicts_total: f64,
    flaps_total: f64,
    flapping_peak: f64,
    bird_writes: f64,
    foreign_writes: u32,
    put_back_after_ms: Option<u128>,
    quiet_after_ms: Option<u128>,
    forwarded: BTreeMap<String, f64>,
}

impl Observed {
    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "target": self.target,
            "second_writer_gateway": self.second_writer_gateway,
            "events": self.events,
            "conflicts_total": self.conflicts_total,
            "flaps_total": self.flaps_total,
            "flapping_peak": self.flapping_peak,
            "bird_writes": self.bird_writes,
            "foreign_writes": self.foreign_writes,
            "put_back_after_ms": self.put_back_after_ms,
            "quiet_after_ms": self.quiet_after_ms,
            "forwarded_packets": self.forwarded,
        })
    }
}

fn heading(s: &str) {
    println!("\n=== {s} ===");
}

/// Run the main job.
pub fn run(args: &RunArgs) -> Result<()> {
    if !routewarden_lab::is_root() {
        bail!("`cargo xtask run` creates network namespaces and needs root");
    }
    let bin = match &args.agent_bin {
        Some(b) => b.clone(),
        None => build_all()?,
    };
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
    let ns = lab.node_ns(&args.node);
    eprintln!("lab: namespaces {}-*, agent runs in {ns}", lab.tag());
    let result = story(args, &bin, &datastore, &lab, &nodes);
    drop(lab);
    eprintln!("lab: removed");
    result
}

fn story(args: &RunArgs, bin: &std::path::Path, datastore: &std::path::Path, lab: &Lab, nodes: &[routewarden_lab::LabNodeSpec]) -> Result<()> {
    let node = args.node.as_str();
    let ns = lab.node_ns(node);
    let file_ds = format!("file:{}", datastore.display());
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &ns])
        .arg(bin)
        .args(["run", "--datastore", &file_ds])
        .args(["--node", node, "--metrics-addr", &format!("127.0.0.1:{METRICS_PORT}"), "--log-format", "text"])
        .args(&args.agent_args)
        // An environment default, so `-- --route-watch-window N` still wins.
        .env("ROUTEWARDEN_ROUTE_WATCH_WINDOW", WATCH_WINDOW.to_string())
        .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()));
    eprintln!("+ {}", crate::display(&cmd));
    let mut agent = ChildGuard(cmd.spawn().context("start the agent")?, "agent");
    let started = Instant::now();
    let ready = wait_for(Duration::from_secs(30), || match lab.http_get(node, METRICS_PORT, "/readyz") {
        Ok((200, body)) => Some(body),
        _ => None,
    })?;
    if let Ok(Some(status)) = agent.0.try_wait() {
        bail!("the agent exited early: {status}");
    }
    let Some(ready) = ready else { bail!("the agent did not become ready within 30 s") };
    println!("routewarden is running as {node} in namespace {ns}; ready after {:.1} s:", started.elapsed().as_secs_f64());
    print!("{}", indent(&ready));

    // 1. Who programs what.
    heading(&format!("1. Who programs what on {node} (routewarden explain)"));
    let explain = Command::new(bin).args(["explain", "--datastore", &file_ds, "--node", node]).output().context("run routewarden explain")?;
    print!("{}", String::from_utf8_lossy(&explain.stdout));
    let protocol = "80";
    println!("\nIn the kernel now (ip route show proto {protocol}, routewarden's protocol in the Felix role):");
    print!("{}", indent(&lab.ip(node, &["route", "show", "proto", protocol])?));
    check_stop()?;

    // 2. A fight.
    let routes = our_routes(lab, node, protocol)?;
    let Some(target) = routes.iter().find(|r| r.dev.as_deref() == Some("tunl0") && r.gateway.is_some() && r.dst.ends_with("/26")).cloned() else {
        bail!("no tunnel route of routewarden's to fight over on {node}");
    };
    let own_gw = target.gateway.clone().unwrap_or_default();
    let other_gw = nodes
        .iter()
        .filter(|n| n.name != node)
        .flat_map(|n| n.addresses.iter())
        .filter_map(|a| a.split('/').next())
        .find(|a| !a.contains(':') && *a != own_gw)
        .unwrap_or("10.0.0.99")
        .to_owned();
    let mut observed = Observed { target: target.dst.clone(), second_writer_gateway: other_gw.clone(), ..Observed::default() };
    fight(lab, bin, agent.0.id(), node, protocol, &target, &other_gw, args.fight_seconds, &mut observed)?;
    check_stop()?;
    traffic(lab, node, protocol, &mut observed)?;

    // 4. Where to look next.
    heading("4. Where to look next");
    println!(
        "- `routewarden explain --datastore file:examples/cluster --node {node}`: who programs which pool class and why, and the routes.\n\
         - `routewarden audit`: the kernel's routes against what each owner should have programmed (missing, stale, duplicate, wrong next hop).\n\
         - `routewarden events`: route writes, conflicts and flaps live, with the writing process; add `--datastore` for wrong-path samples.\n\
         - deploy/: the DaemonSet, alerts (deploy/prometheusrule.yaml, runbooks in docs/runbooks.md) and the Grafana dashboard."
    );
    if args.metrics {
        heading("/metrics (routewarden_*)");
        for (series, v) in &Scrape::get(lab, node)?.0 {
            println!("{series} {v}");
        }
    }
    if let Some(path) = &args.summary {
        std::fs::write(path, serde_json::to_string_pretty(&observed.json())?).with_context(|| format!("write {}", path.display()))?;
    }
    println!(
        "\nThe agent keeps running in {ns}; metrics: `ip netns exec {ns} curl -s 127.0.0.1:{METRICS_PORT}/metrics`. {}",
        match args.duration {
            Some(d) => format!("Stopping after {d} s."),
            None => "Ctrl-C stops it and removes the lab.".into(),
        }
    );
    let idle = Instant::now();
    while !STOP.load(Ordering::SeqCst) {
        if args.duration.is_some_and(|d| idle.elapsed() >= Duration::from_secs(d)) {
            break;
        }
        if let Ok(Some(status)) = agent.0.try_wait() {
            eprintln!("agent exited: {status}");
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(agent);
    Ok(())
}

/// Part 2: the second writer fights over `target` for `seconds`; what the watch and the agent
/// did goes into `observed`.
#[allow(clippy::too_many_arguments)]
fn fight(
    lab: &Lab,
    bin: &std::path::Path,
    agent_pid: u32,
    node: &str,
    protocol: &str,
    target: &KernelRoute,
    other_gw: &str,
    seconds: u64,
    observed: &mut Observed,
) -> Result<()> {
    let ns = lab.node_ns(node);
    let own_gw = target.gateway.clone().unwrap_or_default();
    let fight_seconds = seconds;
    heading(&format!("2. A second writer fights routewarden over {} for {} s", target.dst, fight_seconds));
    println!(
        "routewarden's route: {} via {own_gw} dev tunl0 metric {} proto {protocol}. The second writer, a BIRD-like process in {ns}\n(`ip` run under the name `bird`: the watch names and classes each writer by its process), replaces it at the same key\n(table, destination, metric) with `via {other_gw} ... proto bird`, every 500 ms.",
        target.dst, target.metric
    );
    let bird = routewarden_lab::program_named("ip", "bird");
    let mut events_stream = lab.command(node, &bin.display().to_string());
    events_stream
        // The agent's writes are `self` (`ip netns exec` execs it: its pid is the agent's).
        .args(["events", "--window-seconds", &WATCH_WINDOW.to_string(), "--route-protocol", protocol, "--agent-pid", &agent_pid.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .stdin(Stdio::null());
    let mut events = ChildGuard(events_stream.spawn().context("start routewarden events")?, "routewarden events");
    let stdout = events.0.stdout.take().context("events stdout")?;
    let (tx, rx) = mpsc::channel::<(Instant, String)>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send((Instant::now(), line)).is_err() {
                break;
            }
        }
    });
    // The watch is up when it prints its header line.
    let header = wait_for(Duration::from_secs(15), || rx.try_recv().ok())?.context("routewarden events printed nothing")?;
    println!("\n`routewarden events` in {ns} ({}):", header.1.trim_start_matches("# "));
    let mut lines: Vec<(Instant, String)> = Vec::new();
    let mut peak = 0.0_f64;
    let fight_start = Instant::now();
    let metric = target.metric.to_string();
    while fight_start.elapsed() < Duration::from_secs(fight_seconds) {
        check_stop()?;
        run_in(lab, node, &bird, &["route", "replace", &target.dst, "via", other_gw, "dev", "tunl0", "onlink", "metric", &metric, "proto", "bird"])?;
        observed.foreign_writes += 1;
        let next = Instant::now() + Duration::from_millis(500);
        while Instant::now() < next {
            lines.extend(rx.try_iter());
            if let Ok(s) = Scrape::get(lab, node) {
                peak = peak.max(s.sum("routewarden_flapping_prefixes"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let fight_end = Instant::now();
    // routewarden puts its route back.
    let put_back = wait_for(Duration::from_secs(15), || {
        let r = our_routes(lab, node, protocol).ok()?;
        r.iter().any(|r| r.dst == target.dst && r.gateway.as_deref() == Some(own_gw.as_str())).then(Instant::now)
    })?;
    observed.put_back_after_ms = put_back.map(|t| t.duration_since(fight_end).as_millis());
    // The watch goes quiet: no flapping prefix once the window has passed without a change.
    let quiet = wait_for(Duration::from_secs(WATCH_WINDOW + 15), || {
        lines.extend(rx.try_iter());
        let s = Scrape::get(lab, node).ok()?;
        peak = peak.max(s.sum("routewarden_flapping_prefixes"));
        (s.sum("routewarden_flapping_prefixes") == 0.0).then(Instant::now)
    })?;
    observed.quiet_after_ms = quiet.map(|t| t.duration_since(fight_end).as_millis());
    std::thread::sleep(Duration::from_millis(300));
    lines.extend(rx.try_iter());
    drop(events);
    let verdicts: Vec<&(Instant, String)> = lines.iter().filter(|(_, l)| l.starts_with("CONFLICT") || l.starts_with("FLAP")).collect();
    let writes = lines.iter().filter(|(_, l)| l.starts_with("write")).count();
    let on_target = |l: &str| l.split_whitespace().nth(2) == Some(target.dst.as_str());
    let writes_on_target = lines.iter().filter(|(_, l)| l.starts_with("write") && on_target(l));
    for (t, l) in writes_on_target.take(2).chain(verdicts.iter().copied()) {
        println!("  +{:>5.2}s {l}", t.saturating_duration_since(fight_start).as_secs_f64());
    }
    println!("  ({writes} route writes seen in all; the first two to {} and every verdict shown)", target.dst);
    observed.events = verdicts.iter().map(|(_, l)| l.clone()).collect();
    let s = Scrape::get(lab, node)?;
    observed.conflicts_total = s.sum("routewarden_route_conflicts_total");
    observed.flaps_total = s.sum("routewarden_route_flaps_total");
    observed.flapping_peak = peak;
    observed.bird_writes = s.family("routewarden_route_writes_total").filter(|(k, _)| k.contains("writer=\"bird\"")).map(|(_, v)| v).sum();
    println!("\nThe agent's /metrics:");
    for name in ["routewarden_route_conflicts_total", "routewarden_route_flaps_total", "routewarden_route_writes_total"] {
        for (series, v) in s.family(name).filter(|(k, v)| *v > 0.0 && (name != "routewarden_route_writes_total" || k.contains("writer=\"bird\""))) {
            println!("  {series} {v}");
        }
    }
    println!(
        "  routewarden_route_writes_unattributed_total {} (writes whose process the watch could not name, classed by the route protocol)",
        s.sum("routewarden_route_writes_unattributed_total")
    );
    println!("  routewarden_flapping_prefixes peaked at {peak} during the fight");
    match observed.put_back_after_ms {
        Some(ms) => println!("\nroutewarden put its route back {ms} ms after the last foreign write:"),
        None => println!("\nroutewarden did NOT put its route back within 15 s:"),
    }
    print!("{}", indent(&lab.ip(node, &["route", "show", &target.dst])?));
    match observed.quiet_after_ms {
        Some(ms) => println!(
            "The watch went quiet: routewarden_flapping_prefixes back to 0 {:.1} s after the fight stopped (a flap lasts one window, {WATCH_WINDOW} s here, from the flap).",
            Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX)).as_secs_f64()
        ),
        None => println!("The watch did not go quiet within {} s.", WATCH_WINDOW + 15),
    }
    Ok(())
}

/// Part 3: traffic to every remote destination of ours and the forwarding watch's counters.
fn traffic(lab: &Lab, node: &str, protocol: &str, observed: &mut Observed) -> Result<()> {
    heading("3. Traffic to every remote block, and the forwarding watch's path counters");
    // The lab's tunl0 is a veth stand-in (the host kernel may lack ipip): give its next hops
    // static neighbours, as a real IPIP device needs none, so datagrams leave at once
    // instead of queueing for ARP that nobody answers.
    for gw in our_routes(lab, node, protocol)?.iter().filter(|r| r.dev.as_deref() == Some("tunl0")).filter_map(|r| r.gateway.clone()) {
        lab.ip(node, &["neigh", "replace", &gw, "lladdr", "02:00:00:00:00:01", "dev", "tunl0", "nud", "permanent"])?;
    }
    let before = Scrape::get(lab, node)?;
    let mut probed = Vec::new();
    for r in our_routes(lab, node, protocol)?.iter().filter(|r| r.gateway.is_some()) {
        if let Some(to) = probe_address(&r.dst) {
            send_udp(lab, node, to, 10)?;
            probed.push(to.to_string());
        }
    }
    println!("10 UDP datagrams from {node} to each of {}", probed.join(", "));
    let after = wait_for(Duration::from_secs(10), || {
        let s = Scrape::get(lab, node).ok()?;
        (s.sum("routewarden_forwarded_packets_total")
            >= before.sum("routewarden_forwarded_packets_total") + 10.0 * f64::from(u32::try_from(probed.len()).unwrap_or(u32::MAX)))
        .then_some(s)
    })?
    .map_or_else(|| Scrape::get(lab, node), Ok)?;
    println!("routewarden_forwarded_packets_total (by IP pool and the path taken; counted at egress, each packet once):");
    for (series, v) in after.family("routewarden_forwarded_packets_total") {
        println!("  {series} {v}");
        observed.forwarded.insert(series.clone(), v);
    }

    Ok(())
}

fn indent(text: &str) -> String {
    text.lines().fold(String::new(), |mut out, l| {
        out.push_str("  ");
        out.push_str(l);
        out.push('\n');
        out
    })
}
