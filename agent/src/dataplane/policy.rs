//! [`OwnershipPolicy`]: which kernel routes this agent may replace and delete.
//!
//! Mirrors Felix `felix/routetable/ownershippol/main_route_table_policy.go` (`RouteIsOurs`),
//! narrowed to what a cluster-route agent needs (reference §3.4):
//!
//! 1. Only routes in our table, of type unicast or blackhole, are ever considered.
//! 2. A route is a cluster route only if it is a blackhole or leaves through the tunnel device
//!    or the host NIC: a route on any other device (a workload's `cali*` route, whatever its
//!    protocol — Felix writes those with `deviceRouteProtocol`, which can be 80) is never ours.
//! 3. A route with our protocol is ours only inside `owned`: the CIDRs of the valid IP pools of
//!    the classes routewarden programs, or hands over, or programmed before (IPIP and no-encap,
//!    never VXLAN), minus pools of a class another writer programs with our protocol number
//!    (Felix with 80). Never outside every pool (a `192.168.77.0/24 ... proto 80` is someone
//!    else's), never in an invalid pool (those CIDRs are frozen ground).
//! 4. A `RTPROT_BIRD` (12) route on the tunnel device inside an IPIP pool we program while BIRD
//!    does not is ours (Felix `OwnBIRDIPIPRoutes`, limited here to the pool CIDRs); the same on
//!    the host NIC inside a no-encap pool (a gap Felix leaves open, reference §5.2). Never
//!    inside frozen ground.
//! 5. Nothing else, ever: kernel (2), boot (3), static (4) and every other protocol, local and
//!    broadcast routes, IPv6 link-local and multicast destinations, cloned entries, other
//!    tables.

use ipnet::IpNet;
use serde::Serialize;

use super::kernel_route::{KernelRoute, RouteKind};
use crate::vocabulary::RTPROT_BIRD;

/// Which kernel routes are ours. Built from plain data; the app derives it from the
/// ownership decision (which classes routewarden programs, which BIRD programs, pool CIDRs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnershipPolicy {
    /// Our route protocol (1..=255).
    pub protocol: u8,
    /// Our table id (254 = main).
    pub table: u32,
    /// Name of the IPIP tunnel device (`tunl0`).
    pub tunnel_dev: String,
    /// Name of the host NIC (`eth0`).
    pub host_nic: String,
    /// IPIP pool CIDRs whose BIRD (proto 12) routes on the tunnel device we claim: set only
    /// while routewarden programs the IPIP class and BIRD does not.
    pub claim_bird_on_tunnel: Vec<IpNet>,
    /// No-encap pool CIDRs whose BIRD routes on the host NIC we claim: set only while
    /// routewarden programs the no-encap class and BIRD does not.
    pub claim_bird_on_nic: Vec<IpNet>,
    /// Pool CIDRs whose BIRD (proto 12) blackholes we claim (BIRD's blackholes for this
    /// node's own blocks, left behind when BIRD's kernel protocol persists routes after a
    /// handover): pools of the classes routewarden programs and BIRD does not, so they are
    /// replaced in place by ours and deleted when the block goes (issue 19).
    pub claim_bird_blackholes: Vec<IpNet>,
    /// Prefixes inside which a route with our protocol is ours (rule 3): valid IP pools of
    /// routable classes that no other writer programs with our protocol number.
    pub owned: Vec<IpNet>,
    /// Frozen ground: no BIRD leftover is claimed here (deletes are held by the reconciler).
    pub frozen: Vec<IpNet>,
    /// An input never loaded or cannot be read (the plan's `hold_all`): what it says is
    /// unknown, so a route already in the kernel at a desired key is not rewritten (a next-hop
    /// change is a deletion of the old path, and a replace of another writer's route a
    /// takeover); missing routes are still created (issue 48).
    pub hold_rewrites: bool,
}

/// Why a route is ours, or why not. Stable kebab-case codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Our protocol in our table.
    OursByProtocol,
    /// A BIRD leftover on the tunnel device inside an IPIP pool we program.
    ClaimedBirdTunnel,
    /// A BIRD leftover on the host NIC inside a no-encap pool we program.
    ClaimedBirdNic,
    /// A BIRD blackhole (an own block's) inside a pool of a class we program and BIRD does not.
    ClaimedBirdBlackhole,
    /// Another table.
    OtherTable,
    /// Local, broadcast, unreachable, ... (only unicast and blackhole routes are cluster
    /// routes).
    NotClusterType,
    /// IPv6 link-local or multicast destination, or a cloned (exception) entry.
    KernelManaged,
    /// Our protocol, but on a device that carries no cluster route (a workload interface).
    OtherDevice,
    /// Our protocol, but outside the pools we own: outside every valid pool, in a VXLAN pool,
    /// or in a pool another writer with our protocol programs.
    OutsideOwnedPools,
    /// Any other protocol.
    Foreign,
}

impl Verdict {
    /// Whether the verdict makes the route ours (replaceable and deletable).
    pub fn is_ours(self) -> bool {
        matches!(self, Verdict::OursByProtocol | Verdict::ClaimedBirdTunnel | Verdict::ClaimedBirdNic | Verdict::ClaimedBirdBlackhole)
    }
}

fn inside(pools: &[IpNet], dst: &IpNet) -> bool {
    pools.iter().any(|p| p.contains(dst))
}

fn overlaps_any(prefixes: &[IpNet], dst: &IpNet) -> bool {
    prefixes.iter().any(|p| p.contains(dst) || dst.contains(p))
}

fn kernel_managed_v6(dst: &IpNet) -> bool {
    match dst {
        IpNet::V6(n) => {
            let seg0 = n.addr().segments()[0];
            // fe80::/10 link-local, ff00::/8 multicast.
            (seg0 & 0xffc0) == 0xfe80 || (seg0 & 0xff00) == 0xff00
        }
        IpNet::V4(_) => false,
    }
}

impl OwnershipPolicy {
    /// Decide about one kernel route (device already resolved to a name).
    pub fn verdict(&self, route: &KernelRoute) -> Verdict {
        let t = &route.target;
        if route.key.table != self.table {
            return Verdict::OtherTable;
        }
        if !matches!(t.kind, RouteKind::Unicast | RouteKind::Blackhole) {
            return Verdict::NotClusterType;
        }
        if kernel_managed_v6(&route.key.dst) {
            return Verdict::KernelManaged;
        }
        let dev = t.device.as_deref();
        let cluster_device = t.kind == RouteKind::Blackhole || dev == Some(self.tunnel_dev.as_str()) || dev == Some(self.host_nic.as_str());
        if t.protocol == self.protocol {
            if !cluster_device {
                return Verdict::OtherDevice;
            }
            if !inside(&self.owned, &route.key.dst) {
                return Verdict::OutsideOwnedPools;
            }
            return Verdict::OursByProtocol;
        }
        if t.protocol == RTPROT_BIRD
            && t.kind == RouteKind::Blackhole
            && !overlaps_any(&self.frozen, &route.key.dst)
            && inside(&self.claim_bird_blackholes, &route.key.dst)
        {
            return Verdict::ClaimedBirdBlackhole;
        }
        if t.protocol == RTPROT_BIRD && t.kind == RouteKind::Unicast && !overlaps_any(&self.frozen, &route.key.dst) {
            if dev == Some(self.tunnel_dev.as_str()) && inside(&self.claim_bird_on_tunnel, &route.key.dst) {
                return Verdict::ClaimedBirdTunnel;
            }
            if dev == Some(self.host_nic.as_str()) && inside(&self.claim_bird_on_nic, &route.key.dst) {
                return Verdict::ClaimedBirdNic;
            }
        }
        Verdict::Foreign
    }

    /// Whether `route` is ours.
    pub fn is_ours(&self, route: &KernelRoute) -> bool {
        self.verdict(route).is_ours()
    }

    /// The protocols whose routes a resync must dump: ours, plus BIRD's when any claim is set.
    pub fn dump_protocols(&self) -> Vec<u8> {
        let mut p = vec![self.protocol];
        if self.protocol != RTPROT_BIRD
            && (!self.claim_bird_on_tunnel.is_empty() || !self.claim_bird_on_nic.is_empty() || !self.claim_bird_blackholes.is_empty())
        {
            p.push(RTPROT_BIRD);
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::kernel_route::{RouteKey, RouteTarget, RT_SCOPE_UNIVERSE};

    fn policy() -> OwnershipPolicy {
        OwnershipPolicy {
            protocol: 80,
            table: 254,
            tunnel_dev: "tunl0".into(),
            host_nic: "eth0".into(),
            claim_bird_on_tunnel: vec!["10.244.0.0/16".parse().unwrap()],
            claim_bird_on_nic: vec!["10.245.0.0/16".parse().unwrap()],
            claim_bird_blackholes: vec!["10.246.0.0/16".parse().unwrap()],
            owned: vec!["10.244.0.0/16".parse().unwrap(), "10.245.0.0/16".parse().unwrap(), "fd00:10::/48".parse().unwrap()],
            frozen: vec!["10.244.99.0/26".parse().unwrap(), "10.246.99.0/26".parse().unwrap()],
            hold_rewrites: false,
        }
    }

    fn route(dst: &str, kind: RouteKind, dev: Option<&str>, proto: u8, table: u32) -> KernelRoute {
        KernelRoute {
            key: RouteKey::new(table, dst.parse().unwrap(), 0, 1024),
            target: RouteTarget { kind, gateway: None, device: dev.map(Into::into), onlink: false, protocol: proto, scope: RT_SCOPE_UNIVERSE },
        }
    }

    #[test]
    fn verdicts() {
        let p = policy();
        let u = RouteKind::Unicast;
        let cases: &[(KernelRoute, Verdict)] = &[
            (route("10.244.20.0/26", u, Some("tunl0"), 80, 254), Verdict::OursByProtocol),
            (route("10.245.20.0/26", u, Some("eth0"), 80, 254), Verdict::OursByProtocol),
            (route("10.244.20.0/26", RouteKind::Blackhole, None, 80, 254), Verdict::OursByProtocol),
            (route("fd00:10:0:1::/122", u, Some("eth0"), 80, 254), Verdict::OursByProtocol),
            // Our protocol outside every owned pool, or on a workload device (issue 22 row 7).
            (route("192.168.77.0/24", u, Some("eth0"), 80, 254), Verdict::OutsideOwnedPools),
            (route("10.250.1.0/26", RouteKind::Blackhole, None, 80, 254), Verdict::OutsideOwnedPools),
            (route("10.244.10.5/32", u, Some("cali-x"), 80, 254), Verdict::OtherDevice),
            (route("0.0.0.0/0", u, Some("eth0"), 80, 254), Verdict::OutsideOwnedPools),
            (route("10.244.20.0/26", u, Some("tunl0"), 80, 48), Verdict::OtherTable),
            (route("10.244.20.0/26", u, Some("tunl0"), 12, 254), Verdict::ClaimedBirdTunnel),
            (route("10.245.20.0/26", u, Some("eth0"), 12, 254), Verdict::ClaimedBirdNic),
            // BIRD outside the claimed pools, or on the wrong device: never ours (S03).
            (route("192.168.200.10/32", u, Some("cali-x"), 12, 254), Verdict::Foreign),
            (route("10.244.20.0/26", u, Some("eth0"), 12, 254), Verdict::Foreign),
            (route("10.245.20.0/26", u, Some("tunl0"), 12, 254), Verdict::Foreign),
            (route("10.244.20.0/26", RouteKind::Blackhole, None, 12, 254), Verdict::Foreign),
            // BIRD's own-block blackholes only inside the pools claimed for them (issue 19),
            // never in frozen ground, never another protocol's.
            (route("10.246.7.0/26", RouteKind::Blackhole, None, 12, 254), Verdict::ClaimedBirdBlackhole),
            (route("10.246.7.0/26", RouteKind::Blackhole, None, 17, 254), Verdict::Foreign),
            (route("10.246.7.0/26", u, Some("eth0"), 12, 254), Verdict::Foreign),
            // Other protocols on cluster prefixes (S05) and anywhere (S12).
            (route("10.244.20.0/26", u, Some("tunl0"), 17, 254), Verdict::Foreign),
            (route("10.244.20.0/26", u, Some("tunl0"), 4, 254), Verdict::Foreign),
            (route("0.0.0.0/0", u, Some("eth0"), 4, 254), Verdict::Foreign),
            (route("10.0.0.0/24", u, Some("eth0"), 2, 254), Verdict::Foreign),
            (route("10.0.0.0/24", u, Some("eth0"), 3, 254), Verdict::Foreign),
            (route("10.0.0.11/32", RouteKind::Other(2), Some("eth0"), 80, 254), Verdict::NotClusterType),
            (route("10.0.0.255/32", RouteKind::Other(3), Some("eth0"), 80, 254), Verdict::NotClusterType),
            (route("fe80::/64", u, Some("eth0"), 80, 254), Verdict::KernelManaged),
            (route("ff00::/8", u, Some("eth0"), 80, 254), Verdict::KernelManaged),
            // No claim in frozen ground.
            (route("10.244.99.0/26", u, Some("tunl0"), 12, 254), Verdict::Foreign),
            (route("10.246.99.0/26", RouteKind::Blackhole, None, 12, 254), Verdict::Foreign),
            (route("10.244.99.0/26", u, Some("tunl0"), 80, 254), Verdict::OursByProtocol),
        ];
        for (r, want) in cases {
            assert_eq!(p.verdict(r), *want, "{r}");
        }
    }

    #[test]
    fn no_claims_no_bird() {
        let p = OwnershipPolicy { claim_bird_on_tunnel: vec![], claim_bird_on_nic: vec![], claim_bird_blackholes: vec![], ..policy() };
        assert_eq!(p.verdict(&route("10.244.20.0/26", RouteKind::Unicast, Some("tunl0"), 12, 254)), Verdict::Foreign);
        assert_eq!(p.dump_protocols(), vec![80]);
        assert_eq!(policy().dump_protocols(), vec![80, 12]);
    }
}
