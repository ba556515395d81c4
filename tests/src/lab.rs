//! [`Lab`]: named network namespaces that mirror a small cluster.
//!
//! Layout for a lab with tag `T` and nodes `n0..nN`:
//!
//! ```text
//!   netns rw-T-underlay: bridge `br0`, one veth port per node (`p0`, `p1`, ...)
//!   netns rw-T-<node>:   `lo`, `<host_nic>` (veth to the bridge) with the node's addresses,
//!                        `<tunnel_device>`: a stand-in veth pair end named like the tunnel
//!                        device (this host's kernel has no ipip; the QEMU lane has a real tunl0)
//! ```
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
}

impl LabSpec {
    /// A spec with `eth0` and `tunl0`.
    pub fn new(nodes: Vec<LabNodeSpec>) -> Self {
        LabSpec { nodes, host_nic: "eth0".into(), tunnel_device: "tunl0".into() }
    }
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
        bail!(
            "`ip {}{}` failed: {}",
            netns.map(|n| format!("-n {n} ")).unwrap_or_default(),
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
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

    fn create(&mut self) -> Result<()> {
        let underlay = self.underlay_ns();
        self.add_ns(&underlay)?;
        run_ip(Some(&underlay), &["link", "add", "br0", "type", "bridge"])?;
        run_ip(Some(&underlay), &["link", "set", "br0", "up"])?;
        let nodes = self.spec.nodes.clone();
        for (i, node) in nodes.iter().enumerate() {
            let ns = self.node_ns(&node.name);
            self.add_ns(&ns)?;
            let port = format!("p{i}");
            // Create the veth in the underlay, then move the node end into the node namespace.
            let tmp = format!("n{i}");
            run_ip(Some(&underlay), &["link", "add", &port, "type", "veth", "peer", "name", &tmp])?;
            run_ip(Some(&underlay), &["link", "set", &tmp, "netns", &ns])?;
            run_ip(Some(&underlay), &["link", "set", &port, "master", "br0", "up"])?;
            run_ip(Some(&ns), &["link", "set", &tmp, "name", &self.spec.host_nic])?;
            for addr in &node.addresses {
                let mut args = vec!["addr", "add", addr.as_str(), "dev", self.spec.host_nic.as_str()];
                if addr.contains(':') {
                    args.push("nodad");
                }
                run_ip(Some(&ns), &args)?;
            }
            run_ip(Some(&ns), &["link", "set", &self.spec.host_nic, "up"])?;
            // Stand-in tunnel device: one end of a veth pair, named like the tunnel device.
            run_ip(Some(&ns), &["link", "add", &self.spec.tunnel_device, "type", "veth", "peer", "name", "tunpeer"])?;
            run_ip(Some(&ns), &["link", "set", "tunpeer", "up"])?;
            run_ip(Some(&ns), &["link", "set", &self.spec.tunnel_device, "up"])?;
        }
        // Nodes in other subnets (CrossSubnet) share the bridge; give each node an on-link
        // route to the other subnets so the underlay reaches every node. (The multi-node lab
        // of issue 9 replaces this with a router namespace.)
        let subnets: Vec<String> = nodes.iter().flat_map(|n| n.addresses.iter().filter_map(|a| subnet_of(a))).collect();
        for node in &nodes {
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
