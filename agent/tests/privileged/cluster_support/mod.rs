//! The multi-node lab: the example cluster's four nodes in namespaces (node-d
//! behind a router, in another subnet), workloads holding IPs from their nodes' IPAM blocks,
//! a real BIRD 2 per node in an iBGP full mesh whose kernel export filter and iBGP export
//! reject come from `routewarden bird-filter`, and routewarden per node in program mode on a
//! shared file datastore (a temp copy of `examples/cluster` the scenarios edit).
//!
//! One test binary holds several scenarios; labs are heavy (13 namespaces, 4 BIRDs, 4
//! agents), so scenarios take [`serial`] and run one at a time.
#![allow(dead_code)]

#[path = "../lab_support/mod.rs"]
mod lab_support;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

pub use lab_support::{copy_examples, metrics, wait_for, Agent, Metrics};
use routewarden::datastore::FileDatastore;
use routewarden_lab::bird::Bird;
use routewarden_lab::traffic::{echo_count, UdpEcho};
use routewarden_lab::{Lab, LabNodeSpec, LabSpec};

/// BGP AS of the mesh (the example BGPConfiguration's `asNumber`).
pub const AS: u32 = 64512;
/// Nodes of the example cluster.
pub const NODES: [&str; 4] = ["node-a", "node-b", "node-c", "node-d"];

/// One workload: its node, IP and IP pool.
#[derive(Clone, Copy, Debug)]
pub struct Workload {
    pub node: &'static str,
    pub ip: &'static str,
    pub pool: &'static str,
}

/// Workloads, one per (node, pool) with a block of that node (10.244.20.5 is the borrowed IP
/// of node-b's block that node-c's pod `api-7c8d` holds).
pub const WORKLOADS: [Workload; 10] = [
    Workload { node: "node-a", ip: "10.244.10.5", pool: "default-ipv4-ippool" },
    Workload { node: "node-b", ip: "10.244.20.6", pool: "default-ipv4-ippool" },
    Workload { node: "node-c", ip: "10.244.20.5", pool: "default-ipv4-ippool" },
    Workload { node: "node-d", ip: "10.244.40.5", pool: "default-ipv4-ippool" },
    Workload { node: "node-b", ip: "10.245.20.5", pool: "ipip-always" },
    Workload { node: "node-d", ip: "10.245.40.5", pool: "ipip-always" },
    Workload { node: "node-a", ip: "10.246.10.5", pool: "flat" },
    Workload { node: "node-c", ip: "10.246.30.5", pool: "flat" },
    Workload { node: "node-a", ip: "fd00:10:244:0:10::5", pool: "flat-ipv6" },
    Workload { node: "node-b", ip: "fd00:10:244:0:20::5", pool: "flat-ipv6" },
];

static SERIAL: Mutex<()> = Mutex::new(());

/// Run scenarios one at a time (a failed one does not poison the others).
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Skip (with the reason on stderr) unless root and BIRD 2 are available.
pub fn skip(test: &str) -> bool {
    if routewarden_lab::skip_unless_root(test) {
        return true;
    }
    if !routewarden_lab::bird::available() {
        routewarden_lab::skip(test, format_args!("BIRD 2 is not installed (apt-get install bird2; `cargo xtask setup` does)"));
        return true;
    }
    false
}

/// How a scenario sets the lab up.
#[derive(Clone, Debug)]
pub struct Options {
    /// Extra `routewarden run` flags for every node.
    pub agent_flags: Vec<String>,
    /// Start the agents (program mode).
    pub agents: bool,
    /// Call the generated `routewarden_reject_foreign_cluster_routes()` in the iBGP export.
    pub export_reject: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options { agent_flags: Vec::new(), agents: true, export_reject: true }
    }
}

/// The running lab.
pub struct ClusterLab {
    pub lab: Lab,
    /// The shared file datastore (a copy of `examples/cluster`).
    pub datastore: tempfile::TempDir,
    /// BIRD files.
    pub bird_dir: tempfile::TempDir,
    pub birds: BTreeMap<&'static str, Bird>,
    pub agents: BTreeMap<&'static str, Agent>,
    pub options: Options,
    _echo: Vec<UdpEcho>,
}

/// The node's addresses as the datastore has them (`10.0.0.11/24`, `fd00:10::11/64`).
fn node_addresses(dir: &Path) -> BTreeMap<String, Vec<String>> {
    let snap = FileDatastore::load(dir).unwrap();
    snap.cluster.nodes.values().map(|n| (n.name.to_string(), n.bgp_addresses().iter().map(ToString::to_string).collect())).collect()
}

impl ClusterLab {
    /// Build the lab, start BIRD on every node and wait for the full mesh, then (with
    /// `options.agents`) start routewarden on every node and wait until each is ready.
    pub fn start(options: Options) -> ClusterLab {
        Self::start_with(options, |_| {})
    }

    /// [`start`](Self::start) after `edit` changed the datastore copy.
    pub fn start_with(options: Options, edit: impl FnOnce(&Path)) -> ClusterLab {
        let datastore = copy_examples();
        edit(datastore.path());
        let addrs = node_addresses(datastore.path());
        let nodes = NODES.iter().map(|n| LabNodeSpec { name: (*n).to_string(), addresses: addrs[*n].clone() }).collect();
        let mut spec = LabSpec::new(nodes);
        spec.router = true;
        spec.tunnel_overlay = true;
        for w in WORKLOADS {
            spec.workloads.entry(w.node.to_string()).or_default().push(w.ip.parse().unwrap());
        }
        let lab = Lab::build(spec).unwrap();
        let mut echo = Vec::new();
        for w in WORKLOADS {
            let ip: IpAddr = w.ip.parse().unwrap();
            echo.push(UdpEcho::start(&lab.workload_ns_of(ip).unwrap(), ip).unwrap());
        }
        let bird_dir = tempfile::tempdir().unwrap();
        let mut cl = ClusterLab { lab, datastore, bird_dir, birds: BTreeMap::new(), agents: BTreeMap::new(), options, _echo: echo };
        for node in NODES {
            let conf = cl.bird_conf(node);
            let bird = Bird::start(Some(&cl.lab.node_ns(node)), cl.bird_dir.path(), node, &conf).unwrap();
            cl.birds.insert(node, bird);
        }
        cl.wait_mesh();
        if cl.options.agents {
            for node in NODES {
                cl.start_agent(node);
            }
            for node in NODES {
                cl.wait_ready(node);
            }
        }
        cl
    }

    pub fn start_agent(&mut self, node: &'static str) {
        let mut flags: Vec<&str> = self.options.agent_flags.iter().map(String::as_str).collect();
        // The lab edits its datastore on purpose and times handovers: its agents take a file
        // change as settled after 2 s instead of 30 s (the default is tested in bad_input.rs).
        if !flags.contains(&"--settle-period") {
            flags.extend(["--settle-period", "2"]);
        }
        let agent = Agent::start(&self.lab, node, self.datastore.path(), &flags);
        self.agents.insert(node, agent);
    }

    pub fn wait_ready(&self, node: &str) {
        lab_support::wait_ready(&self.lab, node);
    }

    /// BGP sessions every node should have: IPv4 to every other node, IPv6 to every other
    /// node with an IPv6 address.
    fn expected_sessions(&self, node: &str) -> usize {
        let addrs = node_addresses(self.datastore.path());
        let v6 = |n: &str| addrs[n].iter().any(|a| a.contains(':'));
        NODES.iter().filter(|p| **p != node).map(|p| 1 + usize::from(v6(node) && v6(p))).sum()
    }

    /// Wait until every BIRD has all its sessions Established.
    pub fn wait_mesh(&self) {
        for node in NODES {
            let want = self.expected_sessions(node);
            wait_for(&format!("{node}: {want} BGP sessions Established"), Duration::from_secs(30), || {
                (self.birds[node].established().map_or(0, |e| e.len()) == want).then_some(())
            });
        }
    }

    /// `routewarden bird-filter` for `node` on the current datastore (what the lab includes).
    pub fn bird_filter(&self, node: &str) -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_routewarden"))
            .args(["bird-filter", "--node", node, "--datastore"])
            .arg(format!("file:{}", self.datastore.path().display()))
            .output()
            .unwrap();
        assert!(out.status.success(), "bird-filter {node}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    /// BIRD's configuration for `node`: device/direct protocols, the generated filters
    /// (included), kernel protocols with `learn` exporting through the generated filter (as
    /// Calico's bird.cfg does with confd's), this node's blocks as static blackholes (confd's
    /// bird_aggr.cfg) and an iBGP full mesh whose export accepts the pools' routes after the
    /// generated reject (Calico's `calico_export_to_bgp_peers` accepts every route in a pool).
    pub fn bird_conf(&self, node: &str) -> String {
        let snap = FileDatastore::load(self.datastore.path()).unwrap();
        let me = &snap.cluster.nodes[node];
        let v4 = me.bgp_address(false).map(|a| a.addr());
        let v6 = me.bgp_address(true).map(|a| a.addr());
        let filter_path = self.bird_dir.path().join(format!("{node}-routewarden.conf"));
        std::fs::write(&filter_path, self.bird_filter(node)).unwrap();
        let mut blocks: [Vec<String>; 2] = [Vec::new(), Vec::new()];
        for b in snap.cluster.ipam_blocks.values().filter(|b| !b.deleted) {
            if b.host() == Some(node) {
                blocks[usize::from(b.cidr.addr().is_ipv6())].push(b.cidr.to_string());
            }
        }
        let mut pools: [Vec<String>; 2] = [Vec::new(), Vec::new()];
        for p in snap.cluster.ip_pools.values() {
            pools[usize::from(p.cidr.addr().is_ipv6())].push(format!("{}+", p.cidr));
        }
        let mut c = String::new();
        let _ = writeln!(c, "router id {};", v4.expect("IPv4 BGP address"));
        let _ = writeln!(c, "log stderr all;");
        let _ = writeln!(c, "protocol device {{ scan time 2; }}");
        let _ = writeln!(c, "protocol direct {{ ipv4; ipv6; interface \"eth0\"; }}");
        let _ = writeln!(c, "include \"{}\";", filter_path.display());
        let _ = writeln!(
            c,
            "protocol kernel k4 {{ learn; persist; metric 0; scan time 1; ipv4 {{ import all; export filter routewarden_kernel_programming_v4; }}; }}"
        );
        let _ = writeln!(
            c,
            "protocol kernel k6 {{ learn; persist; metric 0; scan time 1; ipv6 {{ import all; export filter routewarden_kernel_programming_v6; }}; }}"
        );
        for (i, fam) in ["ipv4", "ipv6"].iter().enumerate() {
            let _ = writeln!(c, "protocol static blocks{} {{ {fam};", if i == 0 { 4 } else { 6 });
            for b in &blocks[i] {
                let _ = writeln!(c, "  route {b} blackhole;");
            }
            let _ = writeln!(c, "}}");
            let reject = if self.options.export_reject { "routewarden_reject_foreign_cluster_routes(); " } else { "" };
            let pools_match = if pools[i].is_empty() { String::new() } else { format!("if (net ~ [ {} ]) then accept; ", pools[i].join(", ")) };
            let n = if i == 0 { 4 } else { 6 };
            // confd's calico_aggr: advertise own blocks, not the workload /32s inside them.
            let aggr = blocks[i].iter().fold(String::new(), |mut out, b| {
                let _ = write!(out, "if (net ~ {b}) then reject; ");
                out
            });
            let _ = writeln!(c, "filter mesh_export_v{n} {{ {reject}if (proto = \"blocks{n}\") then accept; {aggr}{pools_match}reject; }}");
        }
        let timers = "multihop; connect delay time 1; connect retry time 1; error wait time 1, 5; hold time 9; keepalive time 3; graceful restart off;";
        let addrs = node_addresses(self.datastore.path());
        for (fam, local) in [("ipv4", v4), ("ipv6", v6)] {
            let Some(local) = local else { continue };
            let n = if fam == "ipv4" { 4 } else { 6 };
            let _ = writeln!(
                c,
                "template bgp mesh{n} {{ local {local} as {AS}; {timers} {fam} {{ import all; export filter mesh_export_v{n}; gateway recursive; next hop self; }}; }}"
            );
            for peer in NODES.iter().filter(|p| **p != node) {
                let Some(addr) = addrs[*peer].iter().find(|a| a.contains(':') == (fam == "ipv6")) else {
                    continue;
                };
                let ip = addr.split('/').next().unwrap();
                let _ = writeln!(c, "protocol bgp {}_v{n} from mesh{n} {{ neighbor {ip} as {AS}; }}", peer.replace('-', "_"));
            }
        }
        c
    }

    /// Regenerate every node's BIRD configuration from the datastore and reconfigure BIRD.
    pub fn reconfigure_birds(&self) {
        for node in NODES {
            if let Some(b) = self.birds.get(node) {
                if b.pid().is_some() {
                    b.configure(&self.bird_conf(node)).unwrap();
                }
            }
        }
    }

    /// Round trips of `tries` UDP datagrams from workload `from` to workload `to`.
    pub fn echo(&self, from: &str, to: &str, tries: u32) -> u32 {
        let (f, t): (IpAddr, IpAddr) = (from.parse().unwrap(), to.parse().unwrap());
        echo_count(&self.lab.workload_ns_of(f).unwrap(), f, t, tries, Duration::from_millis(300)).unwrap()
    }

    /// Every pair of workloads in the same pool on different nodes (each checked once; an
    /// echo is a round trip).
    pub fn same_pool_pairs() -> Vec<(Workload, Workload)> {
        let mut out = Vec::new();
        for (i, a) in WORKLOADS.iter().enumerate() {
            for b in &WORKLOADS[i + 1..] {
                if a.pool == b.pool && a.node != b.node {
                    out.push((*a, *b));
                }
            }
        }
        out
    }

    /// `ip route show` (both families, table `table`) of `node`, with `proto` if given.
    pub fn routes(&self, node: &str, table: &str, proto: Option<&str>) -> Vec<String> {
        let mut out = Vec::new();
        for fam in ["-4", "-6"] {
            // A table with no route of a family does not exist for it: empty.
            let text = self.lab.ip(node, &[fam, "route", "show", "table", table]).unwrap_or_default();
            let proto_is = |l: &str| proto.is_none_or(|p| l.contains(&format!(" proto {p} ")) || l.ends_with(&format!(" proto {p}")));
            out.extend(text.lines().map(|l| l.trim().to_string()).filter(|l| proto_is(l)));
        }
        out
    }

    /// `routewarden audit` on `node`: (exit success, output).
    pub fn audit(&self, node: &str, extra: &[&str]) -> (bool, String) {
        let out = self
            .lab
            .command(node, env!("CARGO_BIN_EXE_routewarden"))
            .args(["audit", "--node", node, "--datastore"])
            .arg(format!("file:{}", self.datastore.path().display()))
            .args(extra)
            .output()
            .unwrap();
        (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    }

    /// `node`'s `/metrics` (asserts a 200 answer; see [`Metrics`]).
    pub fn metrics(&self, node: &str) -> Metrics {
        metrics(&self.lab, node)
    }

    /// Sum of every sample of the metric `name` (all label sets) on `node`; panics unless the
    /// agent declares the metric ([`Metrics::sum`]).
    pub fn metric_sum(&self, node: &str, name: &str) -> u64 {
        self.metrics(node).sum(name)
    }

    /// Conflict episodes the route watch on `node` has counted (all families and writer pairs),
    /// asserting that the watch runs (a backend is attached), so that 0 is a measurement.
    pub fn route_conflicts(&self, node: &str) -> u64 {
        let m = self.metrics(node);
        assert_eq!(m.value(r#"routewarden_route_watch_backend_info{backend="none"}"#), 0, "{node}: the route watch is not running:\n{m}");
        m.sum("routewarden_route_conflicts_total")
    }

    /// Sum over families and classes of `routewarden_routes{state="<state>"}` on `node`: the
    /// four series (IPv4 and IPv6, IPIP and no-encap) must all be exported.
    pub fn routes_in_state(&self, node: &str, state: &str) -> u64 {
        let m = self.metrics(node);
        let mut sum = 0;
        for family in ["ipv4", "ipv6"] {
            for class in ["ipip", "noencap"] {
                sum += m.value(&format!("routewarden_routes{{family=\"{family}\",class=\"{class}\",state=\"{state}\"}}"));
            }
        }
        sum
    }

    /// Path of a datastore file.
    pub fn file(&self, name: &str) -> PathBuf {
        self.datastore.path().join(name)
    }

    /// Set both `programClusterRoutes` fields in `calico.yaml` (atomically: write + rename).
    pub fn set_program_cluster_routes(&self, felix: &str, bgp: &str) {
        set_program_cluster_routes(self.datastore.path(), felix, bgp);
    }
}

/// Set `FelixConfiguration` and `BGPConfiguration` `programClusterRoutes` in `dir/calico.yaml`.
pub fn set_program_cluster_routes(dir: &Path, felix: &str, bgp: &str) {
    let path = dir.join("calico.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut out = String::new();
    let mut kind = "";
    for line in text.lines() {
        if line.starts_with("kind: FelixConfiguration") {
            kind = "felix";
        } else if line.starts_with("kind: BGPConfiguration") {
            kind = "bgp";
        }
        if line.trim_start().starts_with("programClusterRoutes:") {
            let indent = &line[..line.len() - line.trim_start().len()];
            let v = if kind == "felix" { felix } else { bgp };
            let _ = writeln!(out, "{indent}programClusterRoutes: {v}");
        } else {
            let _ = writeln!(out, "{line}");
        }
    }
    let tmp = dir.join(".calico.yaml.tmp");
    std::fs::write(&tmp, out).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
}
