//! [`OwnershipPolicy`]: which kernel routes this agent may replace and delete, built in one
//! place ([`OwnershipPolicy::from_decision`]) from the ownership decision and the flags, and
//! evaluated by the dataplane's reconciler on every route it dumps or hears about.
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
//!
//! Pure: the policy reads a route through [`PolicyRoute`] (the dataplane's kernel route
//! implements it), so it is tested here without the dataplane.

use ipnet::IpNet;
use serde::Serialize;

use super::OwnershipDecision;
use crate::routes::RouteDevices;
use crate::vocabulary::{PoolClass, PoolKind, Writer, RTPROT_BIRD};

#[cfg(test)]
mod tests;

/// Which kernel routes are ours. Plain data: [`from_decision`](Self::from_decision) builds it
/// for a plan, [`base`](Self::base) for the dataplane before the first plan.
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
    /// replaced in place by ours and deleted when the block goes.
    pub claim_bird_blackholes: Vec<IpNet>,
    /// Prefixes inside which a route with our protocol is ours (rule 3): valid IP pools of
    /// routable classes that no other writer programs with our protocol number.
    pub owned: Vec<IpNet>,
    /// Frozen ground: no BIRD leftover is claimed here (deletes are held by the reconciler).
    pub frozen: Vec<IpNet>,
    /// An input never loaded or cannot be read (the plan's `hold_all`): what it says is
    /// unknown, so a route already in the kernel at a desired key is not rewritten (a next-hop
    /// change is a deletion of the old path, and a replace of another writer's route a
    /// takeover); missing routes are still created.
    pub hold_rewrites: bool,
}

/// A route's type as the policy sees it: only unicast and blackhole routes are cluster routes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyRouteType {
    /// `RTN_UNICAST`.
    Unicast,
    /// `RTN_BLACKHOLE`.
    Blackhole,
    /// Any other type (local, broadcast, unreachable, ...).
    Other,
}

/// What the policy reads of a kernel route. Implemented by the dataplane's `KernelRoute`;
/// the device is its name (the reconciler resolves ifindexes before asking).
pub trait PolicyRoute {
    /// Routing table id.
    fn table(&self) -> u32;
    /// Destination prefix.
    fn dst(&self) -> IpNet;
    /// Route type.
    fn route_type(&self) -> PolicyRouteType;
    /// Output device name, if any.
    fn device(&self) -> Option<&str>;
    /// Route protocol (`proto`).
    fn protocol(&self) -> u8;
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

/// What [`OwnershipPolicy::from_decision`] needs besides the decision: the flags and what the
/// plan found (frozen ground, retired pools, held rewrites).
#[derive(Clone, Copy, Debug)]
pub struct PolicyInputs<'a> {
    /// Our route protocol (`--route-protocol`).
    pub protocol: u8,
    /// Our table (`--route-table`).
    pub table: u32,
    /// Device names (`--tunnel-device`, `--host-device`).
    pub devices: &'a RouteDevices,
    /// The protocol Felix writes on this node (80 unless its `deviceRouteProtocol` says
    /// otherwise): when it equals ours, a class Felix programs and we do not is never ours.
    pub felix_protocol: u8,
    /// Pool CIDRs we owned whose pools are gone: still ours, so our leftovers there go.
    pub retired: &'a [IpNet],
    /// Frozen ground (no claim there).
    pub frozen: &'a [IpNet],
    /// No route in the kernel may be rewritten now (an input never loaded or is unreadable).
    pub hold_rewrites: bool,
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

/// The CIDRs of the decision's IP pools of `class`, sorted, each once.
fn pool_cidrs(decision: &OwnershipDecision, class: PoolClass) -> Vec<IpNet> {
    let mut v: Vec<IpNet> = decision.pools.iter().filter(|p| p.class == Some(class)).map(|p| p.cidr).collect();
    v.sort();
    v.dedup();
    v
}

/// The pool CIDRs inside which a route with our protocol is ours (rule 3): valid pools of
/// IPIP and no-encap, except those of a class another writer programs with our protocol
/// number while we do not. Sorted.
fn owned_pools(decision: &OwnershipDecision, protocol: u8, felix_protocol: u8) -> Vec<IpNet> {
    let mut out: Vec<IpNet> = decision
        .pools
        .iter()
        .filter(|p| matches!(p.class, Some(PoolClass::Ipip | PoolClass::NoEncap)))
        .filter(|p| {
            let class = p.class.unwrap_or(PoolClass::Vxlan);
            !(felix_protocol == protocol && decision.writers_of(class).contains(&Writer::Felix) && !decision.programs(class))
        })
        .map(|p| p.cidr)
        .collect();
    out.sort();
    out
}

impl OwnershipPolicy {
    /// A policy with our protocol, table and devices, no owned pools and no claims: nothing is
    /// ours until the first plan names the pools.
    pub fn base(protocol: u8, table: u32, devices: &RouteDevices) -> OwnershipPolicy {
        OwnershipPolicy { protocol, table, tunnel_dev: devices.tunnel.clone(), host_nic: devices.host_nic.clone(), ..OwnershipPolicy::default() }
    }

    /// The policy of one plan: our protocol in our table inside the pools we own (never a
    /// class Felix programs while our protocol is Felix's, so we never delete Felix's routes),
    /// plus `retired`; BIRD leftovers only for a class we program and BIRD does not (Calico's
    /// `OwnBIRDIPIPRoutes`, `felix/routetable` ownership policy, and the no-encap gap it left
    /// open); nothing claimed in frozen ground.
    pub fn from_decision(decision: &OwnershipDecision, inputs: &PolicyInputs<'_>) -> OwnershipPolicy {
        let mut owned = owned_pools(decision, inputs.protocol, inputs.felix_protocol);
        owned.extend(inputs.retired.iter().copied());
        owned.sort();
        owned.dedup();
        let mut policy = OwnershipPolicy {
            hold_rewrites: inputs.hold_rewrites,
            owned,
            frozen: inputs.frozen.to_vec(),
            ..OwnershipPolicy::base(inputs.protocol, inputs.table, inputs.devices)
        };
        policy.set_bird_claims(decision);
        policy
    }

    /// The BIRD leftovers the policy claims: only for a class we program and BIRD does not.
    fn set_bird_claims(&mut self, decision: &OwnershipDecision) {
        let bird_writes = |c: PoolClass| decision.writers_of(c).contains(&Writer::Bird);
        if decision.programs(PoolClass::Ipip) && !bird_writes(PoolClass::Ipip) {
            self.claim_bird_on_tunnel = pool_cidrs(decision, PoolClass::Ipip);
            // CrossSubnet: BIRD routed same-subnet peers natively (confd sets `krt_tunnel=""`
            // when the next hop is in the local subnet), so its leftovers there are on the
            // host NIC.
            self.claim_bird_on_nic = decision.pools.iter().filter(|p| p.kind == PoolKind::IpipCrossSubnet).map(|p| p.cidr).collect();
        }
        if decision.programs(PoolClass::NoEncap) && !bird_writes(PoolClass::NoEncap) {
            self.claim_bird_on_nic.extend(pool_cidrs(decision, PoolClass::NoEncap));
        }
        // BIRD's blackholes for this node's own blocks (confd's bird_aggr.cfg static routes,
        // exported to the kernel): the same guard, any class we program and BIRD does not.
        for class in [PoolClass::Ipip, PoolClass::NoEncap] {
            if decision.programs(class) && !bird_writes(class) {
                self.claim_bird_blackholes.extend(pool_cidrs(decision, class));
            }
        }
    }

    /// Decide about one kernel route (device already resolved to a name).
    pub fn verdict(&self, route: &impl PolicyRoute) -> Verdict {
        if route.table() != self.table {
            return Verdict::OtherTable;
        }
        let kind = route.route_type();
        if kind == PolicyRouteType::Other {
            return Verdict::NotClusterType;
        }
        let dst = route.dst();
        if kernel_managed_v6(&dst) {
            return Verdict::KernelManaged;
        }
        let dev = route.device();
        let protocol = route.protocol();
        let cluster_device = kind == PolicyRouteType::Blackhole || dev == Some(self.tunnel_dev.as_str()) || dev == Some(self.host_nic.as_str());
        if protocol == self.protocol {
            if !cluster_device {
                return Verdict::OtherDevice;
            }
            if !inside(&self.owned, &dst) {
                return Verdict::OutsideOwnedPools;
            }
            return Verdict::OursByProtocol;
        }
        if protocol == RTPROT_BIRD && kind == PolicyRouteType::Blackhole && !overlaps_any(&self.frozen, &dst) && inside(&self.claim_bird_blackholes, &dst) {
            return Verdict::ClaimedBirdBlackhole;
        }
        if protocol == RTPROT_BIRD && kind == PolicyRouteType::Unicast && !overlaps_any(&self.frozen, &dst) {
            if dev == Some(self.tunnel_dev.as_str()) && inside(&self.claim_bird_on_tunnel, &dst) {
                return Verdict::ClaimedBirdTunnel;
            }
            if dev == Some(self.host_nic.as_str()) && inside(&self.claim_bird_on_nic, &dst) {
                return Verdict::ClaimedBirdNic;
            }
        }
        Verdict::Foreign
    }

    /// Whether `route` is ours.
    pub fn is_ours(&self, route: &impl PolicyRoute) -> bool {
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
