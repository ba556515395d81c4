//! `--host-device auto`: the host NIC is the link that holds this node's Calico
//! address, found over netlink rather than configured per node.
//!
//! Calico's node address is `Node.spec.bgp.ipv4Address` / `ipv6Address` (or the
//! `projectcalico.org/IPv4Address` / `IPv6Address` annotations of a core Node), the address
//! calico-node autodetects and Felix sends no-encap and same-subnet traffic from. The NIC
//! holding it is the device of those routes. [`pick_host_nic`] is the pure rule;
//! [`find_host_nic`] asks the kernel.

use std::fmt;
use std::net::IpAddr;

use crate::dataplane::kernel::dump::KernelDump;
use crate::dataplane::kernel::netlink::NetlinkError;
use crate::model::Node;

/// The setting that asks for autodetection.
pub const AUTO: &str = "auto";

/// A link and the addresses it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkAddresses {
    /// Interface name (`eth0`, `ens5`).
    pub name: String,
    /// Its addresses, both families.
    pub addresses: Vec<IpAddr>,
}

/// Why no host NIC was found.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HostNicError {
    /// The node has no Calico address (no BGP address, no annotation).
    #[error("node {node} has no Calico address (Node spec.bgp.ipv4Address/ipv6Address or the projectcalico.org/IPv4Address annotation)")]
    NoAddress {
        /// The node.
        node: String,
    },
    /// No link holds any of the node's addresses.
    #[error("no link holds node {node}'s Calico address {}; links seen: {}", join(wanted), links_text(links))]
    NotHeld {
        /// The node.
        node: String,
        /// Its Calico addresses, IPv4 first.
        wanted: Vec<IpAddr>,
        /// The links seen, with their addresses.
        links: Vec<LinkAddresses>,
    },
    /// The kernel could not be asked.
    #[error("listing links and addresses: {0}")]
    Netlink(String),
}

fn join(v: &[IpAddr]) -> String {
    v.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

fn links_text(links: &[LinkAddresses]) -> String {
    if links.is_empty() {
        return "none".into();
    }
    links.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

impl fmt::Display for LinkAddresses {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} [{}]", crate::text::escape(&self.name), join(&self.addresses))
    }
}

/// The node's Calico addresses, IPv4 first: its BGP addresses (spec or annotation form).
#[must_use]
pub fn node_addresses(node: &Node) -> Vec<IpAddr> {
    node.bgp_addresses().iter().map(ipnet::IpNet::addr).collect()
}

/// The link that holds the first of `wanted` (IPv4 before IPv6) that any link holds.
///
/// # Errors
/// [`HostNicError::NoAddress`] when `wanted` is empty; [`HostNicError::NotHeld`] with every
/// link seen when none holds any of them.
pub fn pick_host_nic(node: &str, wanted: &[IpAddr], links: &[LinkAddresses]) -> Result<String, HostNicError> {
    if wanted.is_empty() {
        return Err(HostNicError::NoAddress { node: node.to_owned() });
    }
    wanted.iter().find_map(|w| links.iter().find(|l| l.addresses.contains(w)).map(|l| l.name.clone())).ok_or_else(|| HostNicError::NotHeld {
        node: node.to_owned(),
        wanted: wanted.to_vec(),
        links: links.to_vec(),
    })
}

/// Every link of this network namespace with its addresses, by name.
///
/// # Errors
/// [`NetlinkError`] when a dump fails.
pub async fn link_addresses(nl: &KernelDump) -> Result<Vec<LinkAddresses>, NetlinkError> {
    let links = nl.links().await?;
    let addresses = nl.addresses().await?;
    let mut out: Vec<LinkAddresses> = links
        .iter()
        .map(|l| LinkAddresses { name: l.name.clone(), addresses: addresses.iter().filter(|(i, _)| *i == l.index).map(|(_, a)| *a).collect() })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// The host NIC of `node` in this network namespace: [`pick_host_nic`] over the kernel's links.
///
/// # Errors
/// As [`pick_host_nic`], and [`HostNicError::Netlink`] when the kernel cannot be asked.
pub async fn find_host_nic(nl: &KernelDump, name: &str, node: Option<&Node>) -> Result<String, HostNicError> {
    let wanted = node.map(node_addresses).unwrap_or_default();
    if wanted.is_empty() {
        return Err(HostNicError::NoAddress { node: name.to_owned() });
    }
    let links = link_addresses(nl).await.map_err(|e| HostNicError::Netlink(e.to_string()))?;
    pick_host_nic(name, &wanted, &links)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(name: &str, addrs: &[&str]) -> LinkAddresses {
        LinkAddresses { name: name.into(), addresses: addrs.iter().map(|a| a.parse().unwrap()).collect() }
    }

    #[test]
    fn the_link_holding_the_address_whatever_its_name() {
        let links = [link("lo", &["127.0.0.1", "::1"]), link("ens5", &["10.0.0.11", "fd00:10::11"]), link("tunl0", &["10.244.10.0"])];
        let v4: IpAddr = "10.0.0.11".parse().unwrap();
        let v6: IpAddr = "fd00:10::11".parse().unwrap();
        assert_eq!(pick_host_nic("node-a", &[v4, v6], &links), Ok("ens5".to_owned()));
        // IPv6-only node; and IPv4 preferred when both are held on different links.
        assert_eq!(pick_host_nic("node-a", &[v6], &links), Ok("ens5".to_owned()));
        let split = [link("eth1", &["fd00:10::11"]), link("eth0", &["10.0.0.11"])];
        assert_eq!(pick_host_nic("node-a", &[v4, v6], &split), Ok("eth0".to_owned()));
        // Only the v6 address is held: that link.
        assert_eq!(pick_host_nic("node-a", &[v4, v6], &split[..1]), Ok("eth1".to_owned()));
    }

    #[test]
    fn an_address_no_link_holds_names_the_address_and_the_links() {
        let links = [link("lo", &["127.0.0.1"]), link("eth0", &["10.9.9.9"])];
        let err = pick_host_nic("node-a", &["10.0.0.11".parse().unwrap()], &links).unwrap_err();
        assert_eq!(err.to_string(), "no link holds node node-a's Calico address 10.0.0.11; links seen: lo [127.0.0.1], eth0 [10.9.9.9]");
        assert_eq!(
            pick_host_nic("node-a", &[], &links).unwrap_err().to_string(),
            "node node-a has no Calico address (Node spec.bgp.ipv4Address/ipv6Address or the projectcalico.org/IPv4Address annotation)"
        );
    }
}
