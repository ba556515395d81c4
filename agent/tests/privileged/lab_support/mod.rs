//! Helpers shared by the lab tests that run the agent binary inside a node namespace
//! (`agent_lab.rs`, `bad_input.rs`, `forward_agent.rs`, `prometheus_alerts.rs`, and
//! `cluster_support`): the example cluster, the lab built from it, the
//! agent process, polling, and reading its `/metrics` ([`Metrics`]).
// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use routewarden::datastore::FileDatastore;
use routewarden_lab::{Lab, LabNodeSpec, LabSpec};

/// The agent's metrics port on the node's loopback.
pub const PORT: u16 = 9695;

/// node-a's routes in the example cluster (`--role felix`: the IPIP classes), as
/// [`routes`] prints them for protocol 80: the IPIP CrossSubnet pool's same-subnet peers via
/// eth0, node-d (10.0.1.0/24) via tunl0, the IPIP Always pool through tunl0, node-a's own block
/// blackholed, node-c's borrowed 10.244.20.5.
pub const NODE_A_IPIP: [&str; 7] = [
    "blackhole 10.244.10.0/26 metric 1024",
    "10.244.20.0/26 via 10.0.0.12 dev eth0 metric 1024 onlink",
    "10.244.20.5 via 10.0.0.13 dev eth0 metric 1024 onlink",
    "10.244.30.0/26 via 10.0.0.13 dev eth0 metric 1024 onlink",
    "10.244.40.0/26 via 10.0.1.14 dev tunl0 metric 1024 onlink",
    "10.245.20.0/26 via 10.0.0.12 dev tunl0 metric 1024 onlink",
    "10.245.40.0/26 via 10.0.1.14 dev tunl0 metric 1024 onlink",
];

pub fn example_dir() -> PathBuf {
    routewarden_lab::example_cluster_dir()
}

/// A copy of the example cluster in a temp dir the test can edit.
pub fn copy_examples() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(example_dir()).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
    }
    dir
}

/// A lab with one namespace per node of the example cluster.
pub fn lab() -> Lab {
    let snap = FileDatastore::load(example_dir()).unwrap();
    let nodes = snap
        .cluster
        .nodes
        .values()
        .map(|n| LabNodeSpec { name: n.name.to_string(), addresses: n.bgp_addresses().iter().map(ToString::to_string).collect() })
        .collect();
    Lab::build(LabSpec::new(nodes)).unwrap()
}

/// The agent process; SIGTERM on drop.
pub struct Agent(Child);

impl Agent {
    /// The agent for `node` on the node's loopback ([`PORT`]), logging to the test's stderr.
    pub fn start(lab: &Lab, node: &str, datastore: &Path, extra: &[&str]) -> Agent {
        Self::spawn(lab, node, datastore, &format!("127.0.0.1:{PORT}"), extra, None)
    }

    /// The agent for `node` serving `/metrics` on `metrics_addr`; with `log`, its output is
    /// appended to that file instead of the test's stderr (for agents that log thousands of
    /// lines on purpose).
    pub fn spawn(lab: &Lab, node: &str, datastore: &Path, metrics_addr: &str, extra: &[&str], log: Option<&Path>) -> Agent {
        let mut cmd = lab.command(node, env!("CARGO_BIN_EXE_routewarden"));
        cmd.args(["run", "--node", node, "--metrics-addr", metrics_addr, "--log-format", "text", "--datastore"])
            .arg(format!("file:{}", datastore.display()))
            .args(extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null());
        if let Some(log) = log {
            let file = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
            cmd.stdout(file.try_clone().unwrap()).stderr(file);
        }
        Agent(cmd.spawn().unwrap())
    }

    /// An agent started some other way (e.g. chrooted into the image's rootfs), with the same
    /// stop and drop behaviour.
    pub fn from_child(child: Child) -> Agent {
        Agent(child)
    }

    /// The agent's process id (`ip netns exec` execs it, so this is routewarden itself).
    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    pub fn stop(mut self) -> std::process::ExitStatus {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.0.id()).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = self.0.wait().unwrap();
        std::mem::forget(self);
        status
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Poll until `f` returns Some, or panic after `timeout` naming `what`.
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One scrape of the agent's `/metrics` on `node`. Taking it asserts that the agent answered
/// 200, so no check can pass against an agent that is down or a port nobody serves; reading a
/// series asserts that it exists (a missing series is a failure, never 0).
pub fn metrics(lab: &Lab, node: &str) -> Metrics {
    match lab.http_get(node, PORT, "/metrics") {
        Ok((200, body)) => Metrics { node: node.to_owned(), body },
        Ok((status, body)) => panic!("{node}: GET /metrics answered {status}:\n{body}"),
        Err(e) => panic!("{node}: GET /metrics failed (is the agent running?): {e:#}"),
    }
}

/// A `/metrics` body that was served with status 200 (see [`metrics`]). `Display` prints it.
/// Values are read as counts: every series the tests read is a counter or a gauge of whole,
/// non-negative numbers (a histogram's `_sum` is never read).
pub struct Metrics {
    node: String,
    body: String,
}

impl Metrics {
    /// The value of the series `name{labels}` (the exact text before the value, as the agent
    /// prints it). Panics, showing the scrape, when the agent does not export it, exports it
    /// twice, or its value is not a count.
    pub fn value(&self, series: &str) -> u64 {
        let found: Vec<&str> = self.raw().filter(|(s, _)| *s == series).map(|(_, v)| v).collect();
        match found[..] {
            [v] => self.count(series, v),
            [] => panic!("{}: /metrics has no series {series}:\n{}", self.node, self.body),
            _ => panic!("{}: /metrics has {} samples of {series}:\n{}", self.node, found.len(), self.body),
        }
    }

    /// Whether the agent exports the series `name{labels}`: for a series that appears later
    /// (with [`wait_for`]) or one the agent must have dropped.
    pub fn has(&self, series: &str) -> bool {
        self.raw().any(|(s, _)| s == series)
    }

    /// Whether the series is exported with exactly the value `v` (not yet, while absent): for
    /// waiting on a series the agent creates when it has something to count.
    pub fn is(&self, series: &str, v: u64) -> bool {
        self.has(series) && self.value(series) == v
    }

    /// Whether the series is exported with a value of at least `min` (not yet, while absent):
    /// for waiting on a counter that is created at its first increment.
    pub fn at_least(&self, series: &str, min: u64) -> bool {
        self.has(series) && self.value(series) >= min
    }

    /// The sum over every label set of the metric `name` (`routewarden_route_writes_total`
    /// sums `routewarden_route_writes_total{...}`). Panics unless the agent declares the
    /// metric (its `# TYPE` line): a counter labelled by the cluster (an IP pool) that never
    /// counted has no series, but it is declared, so its sum is a real 0.
    pub fn sum(&self, name: &str) -> u64 {
        self.family(name).iter().map(|(_, v)| v).sum()
    }

    /// Every series of the metric `name` with its value, sorted by series; panics unless the
    /// agent declares the metric.
    pub fn family(&self, name: &str) -> Vec<(&str, u64)> {
        let family = name.strip_suffix("_total").unwrap_or(name);
        let declared = self.body.lines().any(|l| l.strip_prefix("# TYPE ").and_then(|t| t.split_whitespace().next()) == Some(family));
        assert!(declared, "{}: /metrics does not declare {name} (no `# TYPE {family}`):\n{}", self.node, self.body);
        let mut out: Vec<(&str, u64)> = self
            .raw()
            .filter(|(s, _)| s.strip_prefix(name).is_some_and(|rest| rest.is_empty() || rest.starts_with('{')))
            .map(|(s, v)| (s, self.count(s, v)))
            .collect();
        out.sort_unstable();
        out
    }

    /// The series of the metric `name` that counted something (value above 0), with their
    /// values, sorted: for counters whose every label set is exported at 0 from the start.
    pub fn counted(&self, name: &str) -> Vec<(&str, u64)> {
        self.family(name).into_iter().filter(|(_, v)| *v > 0).collect()
    }

    /// Every series exported (the text before each value).
    pub fn series(&self) -> impl Iterator<Item = &str> + '_ {
        self.raw().map(|(s, _)| s)
    }

    /// Sample lines as (series, value text).
    fn raw(&self) -> impl Iterator<Item = (&str, &str)> + '_ {
        self.body.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).filter_map(|l| l.rsplit_once(' '))
    }

    fn count(&self, series: &str, v: &str) -> u64 {
        v.trim().parse().unwrap_or_else(|_| panic!("{}: {series} is {v:?}, not a count:\n{}", self.node, self.body))
    }
}

impl std::fmt::Display for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.body)
    }
}

pub fn wait_ready(lab: &Lab, node: &str) -> String {
    wait_for(&format!("{node} /readyz 200"), Duration::from_secs(30), || match lab.http_get(node, PORT, "/readyz") {
        Ok((200, body)) => Some(body),
        _ => None,
    })
}

/// Poll [`routes`] of `node` for `window`, requiring `want` at every poll: for what must not
/// happen, a fixed observation window watched throughout (not one look at its end).
pub fn routes_stay(lab: &Lab, node: &str, proto: &str, want: &[&str], window: Duration) {
    let end = Instant::now() + window;
    while Instant::now() < end {
        assert_eq!(routes(lab, node, proto), want, "{node}: routes changed within the {window:?} watched");
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn routes(lab: &Lab, node: &str, proto: &str) -> Vec<String> {
    let mut out: Vec<String> = lab.ip(node, &["route", "show", "proto", proto]).unwrap().lines().map(|l| l.trim().to_string()).collect();
    out.extend(lab.ip(node, &["-6", "route", "show", "proto", proto]).unwrap().lines().map(|l| l.trim().to_string()));
    out
}
