//! Node: the Calico v3 Node (`libcalico-go/lib/apis/internalapi/node.go`) and the core
//! Kubernetes v1 Node with its `projectcalico.org/*` annotations, converted the way
//! `libcalico-go/lib/backend/k8s/resources/node.go` `K8sNodeToCalico` does.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::Serialize;

use super::error::{FieldProblem, ModelError};
use super::fields::{parse_ip_or_cidr, path_label, type_name, Fields};

/// Which object the node was read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeForm {
    /// `projectcalico.org/v3` (or `crd.projectcalico.org/v1`) `Node`.
    Calico,
    /// Core `v1` `Node` with `projectcalico.org/*` annotations and `status.addresses`.
    Kubernetes,
}

/// Type of a node address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum NodeAddressType {
    /// Built by Calico from the BGP address.
    CalicoNodeIP,
    InternalIP,
    ExternalIP,
}

/// One `spec.addresses[]` (Calico) or `status.addresses[]` (core) entry with an IP address.
/// `Hostname`, `InternalDNS` and `ExternalDNS` entries are not addresses and are skipped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NodeAddress {
    pub address: IpAddr,
    /// The subnet, when the entry is written as a CIDR (`10.0.0.11/24`).
    pub network: Option<IpNet>,
    pub kind: NodeAddressType,
}

/// Where a node's next-hop address came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeAddressSource {
    /// `spec.bgp.ipv4Address` / `ipv6Address` (annotation `projectcalico.org/IPv4Address`).
    Bgp,
    /// The first `InternalIP` of the family.
    InternalIp,
    /// The first `ExternalIP` of the family.
    ExternalIp,
}

/// Which of a node's tunnel addresses an address is (Felix `RefType` in
/// `felix/calc/l3_route_resolver.go`: every kind becomes a route reference of the node).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TunnelAddressKind {
    /// `spec.bgp.ipv4IPIPTunnelAddr` (annotation `projectcalico.org/IPv4IPIPTunnelAddr`).
    Ipip,
    /// `spec.ipv4VXLANTunnelAddr` or `spec.ipv6VXLANTunnelAddr`.
    Vxlan,
    /// `spec.wireguard.interfaceIPv4Address` or `interfaceIPv6Address`.
    Wireguard,
}

impl TunnelAddressKind {
    /// Stable lowercase name (`ipip`, `vxlan`, `wireguard`).
    pub fn label(self) -> &'static str {
        match self {
            TunnelAddressKind::Ipip => "ipip",
            TunnelAddressKind::Vxlan => "vxlan",
            TunnelAddressKind::Wireguard => "wireguard",
        }
    }
}

/// A cluster node as routing sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Node {
    pub name: std::sync::Arc<str>,
    pub form: NodeForm,
    /// `spec.bgp.ipv4Address`: the node's IPv4 address with its subnet prefix
    /// (`10.0.0.11/24`); a bare address is taken as /32, as Felix's `ParseCIDROrIP` does.
    pub bgp_ipv4: Option<IpNet>,
    /// Whether `spec.bgp.ipv4Address` was written with a prefix length (`10.0.0.11/24`, also
    /// `10.0.0.11/32`) rather than bare (`10.0.0.11`). Felix takes the IPIP tunnel gateway
    /// from it only then ([`Node::tunnel_gateway`]).
    pub bgp_ipv4_has_prefix: bool,
    /// `spec.bgp.ipv6Address` (`fd00:10::11/64`).
    pub bgp_ipv6: Option<IpNet>,
    /// Whether `spec.bgp.ipv6Address` was written with a prefix length.
    pub bgp_ipv6_has_prefix: bool,
    /// `spec.bgp.asNumber`.
    pub as_number: Option<u32>,
    /// `spec.bgp.ipv4IPIPTunnelAddr`: the address on this node's `tunl0`.
    pub ipv4_ipip_tunnel_addr: Option<IpAddr>,
    pub ipv4_vxlan_tunnel_addr: Option<IpAddr>,
    pub ipv6_vxlan_tunnel_addr: Option<IpAddr>,
    pub wireguard_ipv4: Option<IpAddr>,
    pub wireguard_ipv6: Option<IpAddr>,
    /// `spec.addresses` (Calico form) or `status.addresses` (core form), IP entries only.
    pub addresses: Vec<NodeAddress>,
}

impl Node {
    /// The BGP addresses with their prefix length (`spec.bgp.ipv4Address`, then
    /// `ipv6Address`), those that are set.
    pub fn bgp_addresses(&self) -> Vec<IpNet> {
        [self.bgp_ipv4, self.bgp_ipv6].into_iter().flatten().collect()
    }

    /// The node's BGP address of the family, with its subnet.
    pub fn bgp_address(&self, v6: bool) -> Option<IpNet> {
        if v6 {
            self.bgp_ipv6
        } else {
            self.bgp_ipv4
        }
    }

    /// The node address Felix's route resolver sends as `DstNodeIp`, for one family: the BGP
    /// address (bare or with a prefix), else the first InternalIP, else the first ExternalIP
    /// (`felix/calc/l3_route_resolver.go` `OnResourceUpdate`, `cnet.ParseCIDROrIP` and
    /// `FindNodeAddress`). It is the next hop of host-NIC routes (no-encap, and CrossSubnet to
    /// a node in this node's subnet; `route_mgr.go` `noEncapRoute`) and the address the
    /// same-subnet test checks. IPIP tunnel routes use [`Node::tunnel_gateway`] instead.
    pub fn next_hop(&self, v6: bool) -> Option<(IpAddr, NodeAddressSource)> {
        if let Some(net) = self.bgp_address(v6) {
            return Some((net.addr(), NodeAddressSource::Bgp));
        }
        self.first_address(v6)
    }

    /// The gateway of IPIP tunnel routes to this node: the BGP IPv4 address only when it is
    /// written with a prefix length, else the first IPv4 InternalIP, else the first IPv4
    /// ExternalIP. Felix's IPIP manager takes the gateway from the per-host address message
    /// (`felix/dataplane/linux/ipip_mgr.go` `route`, `activeHostnameToIP`), which
    /// `felix/calc/dataplane_passthru.go` `extractNodeAddress` fills with `net.ParseCIDR` of
    /// the BGP address (a bare address fails to parse) before falling back to the Node's
    /// addresses. So a bare BGP address makes this differ from [`Node::next_hop`].
    pub fn tunnel_gateway(&self) -> Option<(IpAddr, NodeAddressSource)> {
        self.host_address(false)
    }

    /// The node's address in Felix's per-host address message, for one family: the BGP
    /// address only when written with a prefix length, else the first InternalIP, else the
    /// first ExternalIP (`felix/calc/dataplane_passthru.go` `extractNodeAddress`). For a
    /// remote node it is the IPIP tunnel gateway ([`Node::tunnel_gateway`]); for this node it
    /// is the address whose interface is the route managers' parent device
    /// (`route_mgr.go` `detectParentIface`): without one, Felix programs no host-NIC route of
    /// the family.
    pub fn host_address(&self, v6: bool) -> Option<(IpAddr, NodeAddressSource)> {
        let has_prefix = if v6 { self.bgp_ipv6_has_prefix } else { self.bgp_ipv4_has_prefix };
        if let Some(net) = self.bgp_address(v6).filter(|_| has_prefix) {
            return Some((net.addr(), NodeAddressSource::Bgp));
        }
        self.first_address(v6)
    }

    /// The first InternalIP of the family, else the first ExternalIP.
    fn first_address(&self, v6: bool) -> Option<(IpAddr, NodeAddressSource)> {
        for (kind, source) in [(NodeAddressType::InternalIP, NodeAddressSource::InternalIp), (NodeAddressType::ExternalIP, NodeAddressSource::ExternalIp)] {
            if let Some(a) = self.addresses.iter().find(|a| a.kind == kind && a.address.is_ipv6() == v6) {
                return Some((a.address, source));
            }
        }
        None
    }

    /// The node's tunnel addresses, each with its kind, in Felix's order (IPIP, VXLAN v4,
    /// VXLAN v6, WireGuard v4, WireGuard v6; `l3_route_resolver.go` `onNodeUpdate`, which adds
    /// each as a route reference of the node).
    pub fn tunnel_addresses(&self) -> Vec<(TunnelAddressKind, IpAddr)> {
        [
            (TunnelAddressKind::Ipip, self.ipv4_ipip_tunnel_addr),
            (TunnelAddressKind::Vxlan, self.ipv4_vxlan_tunnel_addr),
            (TunnelAddressKind::Vxlan, self.ipv6_vxlan_tunnel_addr),
            (TunnelAddressKind::Wireguard, self.wireguard_ipv4),
            (TunnelAddressKind::Wireguard, self.wireguard_ipv6),
        ]
        .into_iter()
        .filter_map(|(kind, a)| a.map(|a| (kind, a)))
        .collect()
    }

    /// The node's subnet for the CrossSubnet test: the network of the BGP address of the
    /// family (`l3_route_resolver.go` `nodeInOurSubnet`). `None` without a BGP address, so
    /// same-subnet is then never true, as in Felix.
    pub fn subnet(&self, v6: bool) -> Option<IpNet> {
        self.bgp_address(v6).map(|n| n.trunc())
    }

    pub(crate) fn parse_calico(f: &mut Fields<'_>, name: &str) -> Result<Node, Vec<ModelError>> {
        let mut node = Node::empty(name, NodeForm::Calico);
        (node.bgp_ipv4, node.bgp_ipv4_has_prefix) = bgp_cidr(f, &["spec", "bgp", "ipv4Address"], false);
        (node.bgp_ipv6, node.bgp_ipv6_has_prefix) = bgp_cidr(f, &["spec", "bgp", "ipv6Address"], true);
        node.as_number = as_number(f, &["spec", "bgp", "asNumber"]);
        node.ipv4_ipip_tunnel_addr = f.ip(&["spec", "bgp", "ipv4IPIPTunnelAddr"]);
        node.ipv4_vxlan_tunnel_addr = f.ip(&["spec", "ipv4VXLANTunnelAddr"]);
        node.ipv6_vxlan_tunnel_addr = f.ip(&["spec", "ipv6VXLANTunnelAddr"]);
        node.wireguard_ipv4 = f.ip(&["spec", "wireguard", "interfaceIPv4Address"]);
        node.wireguard_ipv6 = f.ip(&["spec", "wireguard", "interfaceIPv6Address"]);
        node.addresses = addresses(f, &["spec", "addresses"]);
        f.take_result(node)
    }

    pub(crate) fn parse_kubernetes(f: &mut Fields<'_>, name: &str) -> Result<Node, Vec<ModelError>> {
        const A: &str = "annotations";
        let mut node = Node::empty(name, NodeForm::Kubernetes);
        (node.bgp_ipv4, node.bgp_ipv4_has_prefix) = bgp_cidr(f, &["metadata", A, "projectcalico.org/IPv4Address"], false);
        (node.bgp_ipv6, node.bgp_ipv6_has_prefix) = bgp_cidr(f, &["metadata", A, "projectcalico.org/IPv6Address"], true);
        node.as_number = as_number(f, &["metadata", A, "projectcalico.org/ASNumber"]);
        node.ipv4_ipip_tunnel_addr = f.ip(&["metadata", A, "projectcalico.org/IPv4IPIPTunnelAddr"]);
        node.ipv4_vxlan_tunnel_addr = f.ip(&["metadata", A, "projectcalico.org/IPv4VXLANTunnelAddr"]);
        node.ipv6_vxlan_tunnel_addr = f.ip(&["metadata", A, "projectcalico.org/IPv6VXLANTunnelAddr"]);
        node.wireguard_ipv4 = f.ip(&["metadata", A, "projectcalico.org/IPv4WireguardInterfaceAddr"]);
        node.wireguard_ipv6 = f.ip(&["metadata", A, "projectcalico.org/IPv6WireguardInterfaceAddr"]);
        node.addresses = addresses(f, &["status", "addresses"]);
        f.take_result(node)
    }

    fn empty(name: &str, form: NodeForm) -> Node {
        Node {
            name: name.into(),
            form,
            bgp_ipv4: None,
            bgp_ipv4_has_prefix: false,
            bgp_ipv6: None,
            bgp_ipv6_has_prefix: false,
            as_number: None,
            ipv4_ipip_tunnel_addr: None,
            ipv4_vxlan_tunnel_addr: None,
            ipv6_vxlan_tunnel_addr: None,
            wireguard_ipv4: None,
            wireguard_ipv6: None,
            addresses: Vec::new(),
        }
    }
}

/// A BGP address: CIDR or bare IP (taken as a host prefix), of the right family, and whether
/// it was written with a prefix length.
fn bgp_cidr(f: &mut Fields<'_>, path: &[&str], v6: bool) -> (Option<IpNet>, bool) {
    let Some(s) = f.string(path) else { return (None, false) };
    if s.is_empty() {
        return (None, false);
    }
    let parsed = parse_ip_or_cidr(s).map(|(ip, net)| (net.unwrap_or_else(|| IpNet::from(ip)), net.is_some()));
    match parsed {
        Some((net, has_prefix)) if net.addr().is_ipv6() == v6 => (Some(net), has_prefix),
        Some(_) => {
            let expected = if v6 { "an IPv6 address" } else { "an IPv4 address" };
            f.fail(path_label(path), FieldProblem::InvalidValue { value: s.to_owned(), expected });
            (None, false)
        }
        None => {
            f.fail(path_label(path), FieldProblem::InvalidCidr(s.to_owned()));
            (None, false)
        }
    }
}

/// An AS number: integer, or a string of digits (annotations are strings).
fn as_number(f: &mut Fields<'_>, path: &[&str]) -> Option<u32> {
    let v = f.get(path)?;
    let parsed = match v {
        serde_yaml_ng::Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
        serde_yaml_ng::Value::String(s) => s.parse::<u32>().ok(),
        _ => None,
    };
    if parsed.is_none() {
        let value = match v {
            serde_yaml_ng::Value::String(s) => s.clone(),
            serde_yaml_ng::Value::Number(n) => n.to_string(),
            other => type_name(other).to_owned(),
        };
        f.fail(path_label(path), FieldProblem::InvalidValue { value, expected: "an AS number (0-4294967295)" });
    }
    parsed
}

fn addresses(f: &mut Fields<'_>, path: &[&str]) -> Vec<NodeAddress> {
    let mut out = Vec::new();
    let base = path_label(path);
    for (i, item) in f.seq(path).iter().enumerate() {
        let kind = item.get("type").and_then(|t| t.as_str());
        let address = item.get("address").and_then(|a| a.as_str());
        let kind = match kind {
            Some("CalicoNodeIP") => NodeAddressType::CalicoNodeIP,
            Some("InternalIP") => NodeAddressType::InternalIP,
            Some("ExternalIP") => NodeAddressType::ExternalIP,
            // Hostname, InternalDNS, ExternalDNS: names, not addresses.
            Some(_) => continue,
            None => {
                f.fail(format!("{base}[{i}].type"), FieldProblem::Missing);
                continue;
            }
        };
        let Some(address) = address else {
            f.fail(format!("{base}[{i}].address"), FieldProblem::Missing);
            continue;
        };
        match parse_ip_or_cidr(address) {
            Some((ip, network)) => out.push(NodeAddress { address: ip, network, kind }),
            None => f.fail(format!("{base}[{i}].address"), FieldProblem::InvalidIp(address.to_owned())),
        }
    }
    out
}
