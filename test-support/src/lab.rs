//! [`Lab`]: named network namespaces that mirror a small cluster.
//!
//! Layout for a lab with tag `T` and nodes `n0..nN`:
//!
//! ```text
//!   netns T-underlay:  bridge `br0` (first IPv4 subnet), one veth port per node (`p0`, ...);
//!                      with `router`: one bridge `br<k>` per further IPv4 subnet;
//!                      with `tunnel_overlay`: bridge `brt`, one port per node (`t0`, ...)
//!   netns T-<node>:    `lo`, `<host_nic>` (veth to its subnet's bridge) with the node's
//!                      addresses, and `<tunnel_device>`: a stand-in veth named like the tunnel
//!                      device (this host's kernel has no ipip; the QEMU lane has a real tunl0)
//!                      whose peer is `tunpeer` in the node (default) or a port of `brt`; with
//!                      `kernel_tunnel`, the namespace's own ipip `tunl0` instead
//!   netns T-router:    (`router`) one leg `r<k>` per subnet bridge holding the subnet's first
//!                      host address (`10.0.1.1` for `10.0.1.0/24`), forwarding on
//!   netns T-<node>-w<i>: (`workloads`) a workload: `eth0` with its /32 (/128), default route
//!                      via 169.254.1.1 (IPv4) / fe80::ecee:eeff:feee:eeee (IPv6) as Calico's
//!                      CNI sets; the node side is `cali<i>` (MAC ee:ee:ee:ee:ee:ee) with a host
//!                      route `<ip> dev cali<i> proto static scope link`, as a CNI installs
//! ```
//!
//! Without `router`, nodes in other subnets share `br0` and get on-link routes to each other's
//! subnets. With `tunnel_overlay`, traffic a node routes `via <peer> dev tunl0 onlink` really
//! reaches the peer (ARP on the overlay is answered by the peer, which owns that address on
//! its NIC): an L2 stand-in for IPIP, which carries the same packets without the outer header.
//! Every node forwards (`ip_forward`, IPv6 forwarding) and has reverse-path filtering off.
//!
//! Every namespace is deleted when the [`Lab`] is dropped.

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{bail, Context, Result};

/// One node of the lab.
#[derive(Clone, Debug)]
pub struct LabNodeSpec {
    /// Calico node name (e.g. `node-a`).
    pub name: String,
    /// Addresses (CIDR form, e.g. `10.0.0.11/24`, `fd00::11/64`) put on the host NIC.
    pub addresses: Vec<String>,
}

/// What to build.
#[derive(Clone, Debug)]
pub struct LabSpec {
    /// The nodes; the lab holds up to 200.
    pub nodes: Vec<LabNodeSpec>,
    /// Name of the host NIC in each node namespace (default `eth0`).
    pub host_nic: String,
    /// Name of the tunnel device in each node namespace (default `tunl0`).
    pub tunnel_device: String,
    /// Put nodes of different IPv4 subnets on different bridges joined by a router namespace
    /// (CrossSubnet), instead of one bridge with on-link routes.
    pub router: bool,
    /// Join the nodes' tunnel stand-ins on an overlay bridge so tunnelled routes carry traffic.
    pub tunnel_overlay: bool,
    /// Workload addresses per node name (each gets its own namespace, see the module doc).
    pub workloads: std::collections::BTreeMap<String, Vec<std::net::IpAddr>>,
    /// Use the kernel's own ipip `tunl0` of each node namespace (the `ipip` module gives every
    /// network namespace one, down and without an address) instead of the veth stand-in: real
    /// IPIP, as in the QEMU lane. The build fails on a kernel without ipip, and with
    /// `tunnel_overlay` or another `tunnel_device` than `tunl0`.
    pub kernel_tunnel: bool,
}

impl LabSpec {
    /// A spec with `eth0` and `tunl0`, one bridge, no overlay, no workloads.
    pub fn new(nodes: Vec<LabNodeSpec>) -> Self {
        LabSpec {
            nodes,
            host_nic: "eth0".into(),
            tunnel_device: "tunl0".into(),
            router: false,
            tunnel_overlay: false,
            workloads: std::collections::BTreeMap::new(),
            kernel_tunnel: false,
        }
    }
}

/// The MAC of a workload interface's host side, as Calico sets it (so the IPv6 link-local
/// gateway `fe80::ecee:eeff:feee:eeee` is the host side's own EUI-64 address).
pub const WORKLOAD_HOST_MAC: &str = "ee:ee:ee:ee:ee:ee";

/// The router's address in `subnet` (`10.0.1.0/24` -> `10.0.1.1`): its first host address.
fn router_address(subnet: &str) -> Option<std::net::Ipv4Addr> {
    let (net, _) = subnet.split_once('/')?;
    let net: std::net::Ipv4Addr = net.parse().ok()?;
    Some(std::net::Ipv4Addr::from(u32::from(net) + 1))
}

/// The network of an address in CIDR form (`10.0.1.14/24` -> `10.0.1.0/24`), IPv4 and IPv6.
fn subnet_of(cidr: &str) -> Option<String> {
    let (addr, len) = cidr.split_once('/')?;
    let len: u32 = len.parse().ok()?;
    match addr.parse::<std::net::IpAddr>().ok()? {
        std::net::IpAddr::V4(a) => {
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len.min(32)) };
            Some(format!("{}/{len}", std::net::Ipv4Addr::from(u32::from(a) & mask)))
        }
        std::net::IpAddr::V6(a) => {
            let mask = if len == 0 { 0 } else { u128::MAX << (128 - len.min(128)) };
            Some(format!("{}/{len}", std::net::Ipv6Addr::from(u128::from(a) & mask)))
        }
    }
}

/// A built lab; dropping it deletes every namespace it created.
#[derive(Debug)]
pub struct Lab {
    tag: String,
    spec: LabSpec,
    namespaces: Vec<String>,
}

static LAB_COUNTER: AtomicU32 = AtomicU32::new(0);

/// Run `ip [-n ns] <args>`; return stdout, fail with stderr.
pub(crate) fn run_ip(netns: Option<&str>, args: &[&str]) -> Result<String> {
    let mut cmd = Command::new("ip");
    if let Some(ns) = netns {
        cmd.args(["-n", ns]);
    }
    cmd.args(args);
    let out = cmd.output().with_context(|| format!("run ip {}", args.join(" ")))?;
    if !out.status.success() {
        bail!("`ip {}{}` failed: {}", netns.map(|n| format!("-n {n} ")).unwrap_or_default(), args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Lab {
    /// Build the lab. Namespace names are `rw<pid>x<n>-<node>`; unique per process and call.
    ///
    /// # Errors
    /// Fails without root or when an `ip` command fails; whatever was created is removed.
    pub fn build(spec: LabSpec) -> Result<Lab> {
        if spec.nodes.len() > 200 {
            bail!("a lab holds at most 200 nodes, got {}", spec.nodes.len());
        }
        if spec.kernel_tunnel && (spec.tunnel_overlay || spec.tunnel_device != "tunl0") {
            bail!("kernel_tunnel is the kernel's ipip tunl0: no overlay, no other tunnel device name (got {:?})", spec.tunnel_device);
        }
        let tag = format!("rw{}x{}", std::process::id(), LAB_COUNTER.fetch_add(1, Ordering::Relaxed));
        let mut lab = Lab { tag, spec, namespaces: Vec::new() };
        lab.create().inspect_err(|_| lab.teardown())?;
        Ok(lab)
    }

    fn add_ns(&mut self, name: &str) -> Result<()> {
        run_ip(None, &["netns", "add", name])?;
        self.namespaces.push(name.to_string());
        run_ip(Some(name), &["link", "set", "lo", "up"])?;
        Ok(())
    }

    fn sysctl(ns: &str, settings: &[(&str, &str)]) -> Result<()> {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns, "sysctl", "-q"]);
        for (k, v) in settings {
            cmd.arg(format!("{k}={v}"));
        }
        let out = cmd.output().context("run sysctl")?;
        if !out.status.success() {
            bail!("sysctl in {ns} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(())
    }

    /// The IPv4 subnets of the nodes, first-seen order (index = bridge number).
    fn v4_subnets(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for n in &self.spec.nodes {
            for s in n.addresses.iter().filter(|a| !a.contains(':')).filter_map(|a| subnet_of(a)) {
                if !out.contains(&s) {
                    out.push(s);
                }
            }
        }
        out
    }

    fn create(&mut self) -> Result<()> {
        let underlay = self.underlay_ns();
        self.add_ns(&underlay)?;
        let subnets = self.v4_subnets();
        let bridges = if self.spec.router { subnets.len().max(1) } else { 1 };
        for k in 0..bridges {
            let br = format!("br{k}");
            run_ip(Some(&underlay), &["link", "add", &br, "type", "bridge"])?;
            run_ip(Some(&underlay), &["link", "set", &br, "up"])?;
        }
        if self.spec.tunnel_overlay {
            run_ip(Some(&underlay), &["link", "add", "brt", "type", "bridge"])?;
            run_ip(Some(&underlay), &["link", "set", "brt", "up"])?;
        }
        let nodes = self.spec.nodes.clone();
        for (i, node) in nodes.iter().enumerate() {
            let ns = self.node_ns(&node.name);
            self.add_ns(&ns)?;
            let forwarding = [
                ("net.ipv4.ip_forward", "1"),
                ("net.ipv6.conf.all.forwarding", "1"),
                ("net.ipv4.conf.all.rp_filter", "0"),
                ("net.ipv4.conf.default.rp_filter", "0"),
            ];
            Self::sysctl(&ns, &forwarding)?;
            let port = format!("p{i}");
            let own = node.addresses.iter().filter(|a| !a.contains(':')).find_map(|a| subnet_of(a));
            let k = if self.spec.router { own.and_then(|o| subnets.iter().position(|s| *s == o)).unwrap_or(0) } else { 0 };
            let bridge = format!("br{k}");
            // Create the veth in the underlay, then move the node end into the node namespace.
            let tmp = format!("n{i}");
            run_ip(Some(&underlay), &["link", "add", &port, "type", "veth", "peer", "name", &tmp])?;
            run_ip(Some(&underlay), &["link", "set", &tmp, "netns", &ns])?;
            run_ip(Some(&underlay), &["link", "set", &port, "master", &bridge, "up"])?;
            run_ip(Some(&ns), &["link", "set", &tmp, "name", &self.spec.host_nic])?;
            for addr in &node.addresses {
                let mut args = vec!["addr", "add", addr.as_str(), "dev", self.spec.host_nic.as_str()];
                if addr.contains(':') {
                    args.push("nodad");
                }
                run_ip(Some(&ns), &args)?;
            }
            run_ip(Some(&ns), &["link", "set", &self.spec.host_nic, "up"])?;
            if self.spec.kernel_tunnel {
                // The namespace's own fallback tunl0, made by the ipip module.
                let details = run_ip(Some(&ns), &["-d", "link", "show", "tunl0"]).context("no tunl0 in a new namespace: the kernel has no ipip")?;
                if !details.lines().any(|l| l.trim_start().starts_with("ipip ")) {
                    bail!("tunl0 in {ns} is not an ipip device:\n{details}");
                }
            } else if self.spec.tunnel_overlay {
                // Stand-in tunnel device: a veth whose peer is a port of the overlay bridge.
                let (bridge_port, node_end) = (format!("t{i}"), format!("u{i}"));
                run_ip(Some(&underlay), &["link", "add", &bridge_port, "type", "veth", "peer", "name", &node_end])?;
                run_ip(Some(&underlay), &["link", "set", &node_end, "netns", &ns])?;
                run_ip(Some(&underlay), &["link", "set", &bridge_port, "master", "brt", "up"])?;
                run_ip(Some(&ns), &["link", "set", &node_end, "name", &self.spec.tunnel_device])?;
            } else {
                // Stand-in tunnel device: one end of a veth pair, named like the tunnel device.
                run_ip(Some(&ns), &["link", "add", &self.spec.tunnel_device, "type", "veth", "peer", "name", "tunpeer"])?;
                run_ip(Some(&ns), &["link", "set", "tunpeer", "up"])?;
            }
            run_ip(Some(&ns), &["link", "set", &self.spec.tunnel_device, "up"])?;
        }
        if self.spec.router {
            self.create_router(&subnets)?;
        } else {
            self.add_onlink_subnet_routes(&nodes)?;
        }
        let workloads = self.spec.workloads.clone();
        for (node, ips) in &workloads {
            for (i, ip) in ips.iter().enumerate() {
                self.create_workload(node, i, *ip)?;
            }
        }
        Ok(())
    }

    /// Nodes in other subnets share the bridge: give each node an on-link route to the other
    /// subnets so the underlay reaches every node.
    fn add_onlink_subnet_routes(&self, nodes: &[LabNodeSpec]) -> Result<()> {
        let subnets: Vec<String> = nodes.iter().flat_map(|n| n.addresses.iter().filter_map(|a| subnet_of(a))).collect();
        for node in nodes {
            let own: Vec<String> = node.addresses.iter().filter_map(|a| subnet_of(a)).collect();
            let mut added = Vec::new();
            for subnet in subnets.iter().filter(|s| !own.contains(s)) {
                if added.contains(subnet) {
                    continue;
                }
                added.push(subnet.clone());
                run_ip(Some(&self.node_ns(&node.name)), &["route", "add", subnet, "dev", &self.spec.host_nic])?;
            }
        }
        Ok(())
    }

    /// The router namespace: one leg per IPv4 subnet bridge at the subnet's first host
    /// address; every node gets a route to each other subnet via its own subnet's router leg.
    fn create_router(&mut self, subnets: &[String]) -> Result<()> {
        let router = self.router_ns();
        let underlay = self.underlay_ns();
        self.add_ns(&router)?;
        Self::sysctl(&router, &[("net.ipv4.ip_forward", "1"), ("net.ipv4.conf.all.rp_filter", "0")])?;
        for (k, subnet) in subnets.iter().enumerate() {
            let (leg, tmp) = (format!("r{k}"), format!("q{k}"));
            run_ip(Some(&underlay), &["link", "add", &tmp, "type", "veth", "peer", "name", &leg])?;
            run_ip(Some(&underlay), &["link", "set", &leg, "netns", &router])?;
            run_ip(Some(&underlay), &["link", "set", &tmp, "master", &format!("br{k}"), "up"])?;
            let gw = router_address(subnet).with_context(|| format!("router address for {subnet}"))?;
            let len = subnet.split_once('/').map_or("24", |(_, l)| l);
            run_ip(Some(&router), &["addr", "add", &format!("{gw}/{len}"), "dev", &leg])?;
            run_ip(Some(&router), &["link", "set", &leg, "up"])?;
        }
        for node in &self.spec.nodes {
            let Some(own) = node.addresses.iter().filter(|a| !a.contains(':')).find_map(|a| subnet_of(a)) else { continue };
            let gw = router_address(&own).with_context(|| format!("router address for {own}"))?;
            for other in subnets.iter().filter(|s| **s != own) {
                run_ip(Some(&self.node_ns(&node.name)), &["route", "add", other, "via", &gw.to_string()])?;
            }
        }
        Ok(())
    }

    fn create_workload(&mut self, node: &str, i: usize, ip: std::net::IpAddr) -> Result<()> {
        let node_ns = self.node_ns(node);
        let wl = self.workload_ns(node, i);
        self.add_ns(&wl)?;
        let host = format!("cali{i}");
        run_ip(Some(&node_ns), &["link", "add", &host, "address", WORKLOAD_HOST_MAC, "type", "veth", "peer", "name", "wl-tmp"])?;
        run_ip(Some(&node_ns), &["link", "set", "wl-tmp", "netns", &wl])?;
        run_ip(Some(&node_ns), &["link", "set", &host, "up"])?;
        run_ip(Some(&wl), &["link", "set", "wl-tmp", "name", "eth0"])?;
        run_ip(Some(&wl), &["link", "set", "eth0", "up"])?;
        if ip.is_ipv4() {
            run_ip(Some(&wl), &["addr", "add", &format!("{ip}/32"), "dev", "eth0"])?;
            run_ip(Some(&wl), &["route", "add", "169.254.1.1", "dev", "eth0", "scope", "link"])?;
            run_ip(Some(&wl), &["route", "add", "default", "via", "169.254.1.1", "dev", "eth0"])?;
            // Calico answers for 169.254.1.1 by proxy ARP; a permanent entry does the same here.
            run_ip(Some(&wl), &["neigh", "add", "169.254.1.1", "lladdr", WORKLOAD_HOST_MAC, "dev", "eth0", "nud", "permanent"])?;
            run_ip(Some(&node_ns), &["route", "add", &format!("{ip}/32"), "dev", &host, "proto", "static", "scope", "link"])?;
        } else {
            run_ip(Some(&wl), &["addr", "add", &format!("{ip}/128"), "dev", "eth0", "nodad"])?;
            run_ip(Some(&wl), &["-6", "route", "add", "default", "via", "fe80::ecee:eeff:feee:eeee", "dev", "eth0"])?;
            run_ip(Some(&node_ns), &["-6", "route", "add", &format!("{ip}/128"), "dev", &host, "proto", "static"])?;
        }
        Ok(())
    }

    fn teardown(&mut self) {
        for ns in self.namespaces.drain(..).rev() {
            if let Err(e) = run_ip(None, &["netns", "del", &ns]) {
                eprintln!("lab teardown: {e}");
            }
        }
    }

    /// The lab's unique tag (prefix of every namespace name).
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// Name of the underlay namespace that holds the bridge.
    pub fn underlay_ns(&self) -> String {
        format!("{}-underlay", self.tag)
    }

    /// Name of the router namespace (`router` labs).
    pub fn router_ns(&self) -> String {
        format!("{}-router", self.tag)
    }

    /// Name of the namespace of `node`'s `i`-th workload (`workloads` labs).
    pub fn workload_ns(&self, node: &str, i: usize) -> String {
        format!("{}-{node}-w{i}", self.tag)
    }

    /// The namespace of the workload holding `ip`, if the spec has one.
    pub fn workload_ns_of(&self, ip: std::net::IpAddr) -> Option<String> {
        self.spec.workloads.iter().find_map(|(node, ips)| ips.iter().position(|w| *w == ip).map(|i| self.workload_ns(node, i)))
    }

    /// Name of the network namespace of `node`.
    pub fn node_ns(&self, node: &str) -> String {
        format!("{}-{node}", self.tag)
    }

    /// The spec this lab was built from.
    pub fn spec(&self) -> &LabSpec {
        &self.spec
    }

    /// Run `ip <args>` in `node`'s namespace and return stdout.
    ///
    /// # Errors
    /// Fails if `ip` fails (stderr in the error).
    pub fn ip(&self, node: &str, args: &[&str]) -> Result<String> {
        run_ip(Some(&self.node_ns(node)), args)
    }

    /// A `Command` that runs `program` inside `node`'s namespace (`ip netns exec`).
    pub fn command(&self, node: &str, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.node_ns(node), program]);
        cmd
    }
}

impl Lab {
    /// Run `f` on a new thread that has entered `node`'s network namespace, and return its
    /// result. Sockets `f` opens live in that namespace (used to talk to an agent's loopback
    /// HTTP server and to send test traffic between nodes).
    ///
    /// # Errors
    /// Fails if the namespace cannot be entered or the thread panics.
    pub fn in_netns<T: Send + 'static>(&self, node: &str, f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
        in_named_netns(&self.node_ns(node), f)
    }
}

impl Lab {
    /// HTTP/1.0 GET `http://127.0.0.1:<port><path>` from inside `node`'s namespace (the agent's
    /// metrics server listens on the node's loopback). Returns the status code and the body.
    ///
    /// # Errors
    /// Connection refused or timed out (5 s), or a malformed response.
    pub fn http_get(&self, node: &str, port: u16, path: &str) -> Result<(u16, String)> {
        use std::io::{Read, Write};
        let path = path.to_string();
        self.in_netns(node, move || -> Result<(u16, String)> {
            let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
            s.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
            write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
            let mut raw = String::new();
            s.read_to_string(&mut raw)?;
            let (head, body) = raw.split_once("\r\n\r\n").context("no end of HTTP headers")?;
            let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).context("no HTTP status")?;
            Ok((status, body.to_string()))
        })?
    }
}

/// Run `f` on a new thread inside the named network namespace `/run/netns/<name>`.
///
/// # Errors
/// Fails if the namespace cannot be opened or entered, or the thread panics.
pub fn in_named_netns<T: Send + 'static>(name: &str, f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    let path = format!("/run/netns/{name}");
    let file = std::fs::File::open(&path).with_context(|| format!("open {path}"))?;
    let handle = std::thread::spawn(move || -> Result<T> {
        nix::sched::setns(std::os::fd::AsFd::as_fd(&file), nix::sched::CloneFlags::CLONE_NEWNET).context("setns")?;
        Ok(f())
    });
    handle.join().map_err(|_| anyhow::anyhow!("thread in netns {name} panicked"))?
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.teardown();
    }
}

#[cfg(test)]
mod tests {
    use super::subnet_of;

    #[test]
    fn subnet_of_masks_host_bits() {
        assert_eq!(subnet_of("10.0.1.14/24").as_deref(), Some("10.0.1.0/24"));
        assert_eq!(subnet_of("10.0.0.11/16").as_deref(), Some("10.0.0.0/16"));
        assert_eq!(subnet_of("fd00:10::11/64").as_deref(), Some("fd00:10::/64"));
        assert_eq!(subnet_of("10.0.0.1"), None);
    }
}
