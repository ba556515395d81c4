//! The WireGuard routing rule: which peers' routes are Felix's WireGuard routing rather than
//! BIRD's (confd `processWireguardPeerFilter`). The plan applies it to whoever stands in BIRD's
//! place, the BIRD filter renders it, `explain` lists it.

use std::net::IpAddr;

use crate::model::{Cluster, Node};

/// The WireGuard peers of `node`, both families, as confd finds them
/// (`processWireguardPeerFilter`, `confd/pkg/backends/calico/bgp_processor.go` ~L1013; keys
/// `/calico/bgp/v1/host/<host>/{ip_addr_v4,wireguard_addr_v4}` and the v6 pair): nothing for a
/// family in which this node has no WireGuard address (`spec.wireguard.interfaceIPv4Address` /
/// `interfaceIPv6Address` or the node annotation); otherwise every other node that has a
/// WireGuard address and a BGP address of that family, as `(name, BGP address)`. A node
/// without a BGP address has no route BIRD could learn through it and is left out, as in
/// confd. Sorted by name, IPv4 first.
pub fn wireguard_peers(cluster: &Cluster, node: &str) -> Vec<(String, IpAddr)> {
    let Some(local) = cluster.nodes.get(node) else { return Vec::new() };
    let mut out = Vec::new();
    for v6 in [false, true] {
        let wg = |n: &Node| if v6 { n.wireguard_ipv6 } else { n.wireguard_ipv4 };
        if wg(local).is_none() {
            continue;
        }
        for (name, peer) in cluster.nodes.iter().filter(|(name, _)| &***name != node) {
            if let (Some(_), Some(bgp)) = (wg(peer), peer.bgp_address(v6)) {
                out.push((name.to_string(), bgp.addr()));
            }
        }
    }
    out
}
