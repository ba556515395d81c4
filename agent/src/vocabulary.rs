//! The shared vocabulary of the pure core: the words `ownership/`, `routes/`, `plan` and the
//! dataplane all speak, defined once so that none of them imports another for a name.
//!
//! - [`PoolKind`]: how routing treats one IP pool (IPIP Always/CrossSubnet, no-encap v4/v6,
//!   VXLAN, LoadBalancer-only), and its [`PoolClass`], the unit at which Felix and BIRD split
//!   cluster-route programming.
//! - [`Writer`]: a component that programs cluster routes (Felix, BIRD, routewarden).
//! - [`RoutePath`]: the path a packet to a cluster destination takes (tunnel, host NIC,
//!   blackhole).
//! - The route protocols and the table the field's writers use ([`RTPROT_FELIX`],
//!   [`RTPROT_BIRD`], …, [`RT_TABLE_MAIN`]).
//!
//! Every `label()` here is a fixed metric label value.

use ipnet::IpNet;
use serde::Serialize;

use crate::model::{EncapMode, IpPool};

/// `RTPROT_KERNEL`: routes the kernel made (connected subnets, `lo`).
pub const RTPROT_KERNEL: u8 = 2;
/// `RTPROT_BOOT`: routes added by `ip route` without `proto` (and Felix's device routes).
pub const RTPROT_BOOT: u8 = 3;
/// `RTPROT_STATIC`: routes an administrator marked static.
pub const RTPROT_STATIC: u8 = 4;
/// `RTPROT_BIRD`: routes BIRD programs (Calico's BGP daemon; confd's
/// `calico_kernel_programming` export).
pub const RTPROT_BIRD: u8 = 12;
/// Felix's cluster-route protocol with the default `deviceRouteProtocol` 3
/// (`dataplanedefs.DefaultRouteProto`; `calculateRouteProtocol`,
/// `felix/dataplane/linux/route_mgr.go` L137; reference §2.5).
pub const RTPROT_FELIX: u8 = 80;
/// `RT_TABLE_MAIN`: the table Felix and BIRD program cluster routes into.
pub const RT_TABLE_MAIN: u32 = 254;

/// How routing treats one IP pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PoolKind {
    IpipAlways,
    IpipCrossSubnet,
    /// IPv4 with both modes `Never`.
    NoEncap,
    /// IPv6 with both modes `Never` (IPv6 pools cannot be IPIP).
    NoEncapV6,
    /// `vxlanMode` `Always` or `CrossSubnet` (v4 or v6).
    Vxlan,
    /// `allowedUses: [LoadBalancer]`: no cluster routes (`l3_route_resolver.go`
    /// `isLoadBalancerOnlyPool`).
    LoadBalancerOnly,
}

impl PoolKind {
    /// Classify a pool: VXLAN first (`vxlanMode != Never`), then IPIP, else no-encap
    /// (`l3_route_resolver.go` `poolTypeForPool`; confd `programsPool`, `poolUsesVXLAN`,
    /// `poolUsesIPIP`).
    pub fn of(pool: &IpPool) -> PoolKind {
        if pool.is_load_balancer_only() {
            PoolKind::LoadBalancerOnly
        } else if pool.vxlan_mode.enabled() {
            PoolKind::Vxlan
        } else if pool.ipip_mode == EncapMode::Always {
            PoolKind::IpipAlways
        } else if pool.ipip_mode == EncapMode::CrossSubnet {
            PoolKind::IpipCrossSubnet
        } else if matches!(pool.cidr, IpNet::V6(_)) {
            PoolKind::NoEncapV6
        } else {
            PoolKind::NoEncap
        }
    }

    /// The ownership class; `None` for LoadBalancer-only pools.
    pub fn class(self) -> Option<PoolClass> {
        match self {
            PoolKind::IpipAlways | PoolKind::IpipCrossSubnet => Some(PoolClass::Ipip),
            PoolKind::NoEncap | PoolKind::NoEncapV6 => Some(PoolClass::NoEncap),
            PoolKind::Vxlan => Some(PoolClass::Vxlan),
            PoolKind::LoadBalancerOnly => None,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            PoolKind::IpipAlways => "ipip-always",
            PoolKind::IpipCrossSubnet => "ipip-cross-subnet",
            PoolKind::NoEncap => "no-encap",
            PoolKind::NoEncapV6 => "no-encap-v6",
            PoolKind::Vxlan => "vxlan",
            PoolKind::LoadBalancerOnly => "load-balancer-only",
        }
    }
}

/// Ownership class of an IP pool: the unit at which Felix and BIRD split cluster-route
/// programming (`confd/pkg/backends/calico/bgp_processor.go` `programsPool`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PoolClass {
    /// `ipipMode: Always` or `CrossSubnet` (IPv4 only).
    Ipip,
    /// `ipipMode` and `vxlanMode` both `Never` or unset (IPv4 and IPv6).
    NoEncap,
    /// `vxlanMode: Always` or `CrossSubnet`: always Felix's, never routewarden's or BIRD's.
    Vxlan,
}

impl PoolClass {
    /// Stable lowercase name, used as a metric label value (`ipip`, `noencap`, `vxlan`).
    pub fn label(self) -> &'static str {
        match self {
            PoolClass::Ipip => "ipip",
            PoolClass::NoEncap => "noencap",
            PoolClass::Vxlan => "vxlan",
        }
    }
}

/// The path a packet to a cluster destination takes from this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RoutePath {
    /// Encapsulated: `via <node> dev <tunnel device> onlink` (IPIP, `tunl0` by default).
    Tunnel,
    /// Native: `via <node> dev <host NIC> onlink` (no-encap, or IPIP CrossSubnet to a node in
    /// this node's BGP subnet).
    HostNic,
    /// `blackhole <own block>`: this node's own IPAM blocks.
    Blackhole,
}

impl RoutePath {
    /// Stable lowercase name, used as a metric label value (`tunnel`, `host-nic`, `blackhole`).
    pub fn label(self) -> &'static str {
        match self {
            RoutePath::Tunnel => "tunnel",
            RoutePath::HostNic => "host-nic",
            RoutePath::Blackhole => "blackhole",
        }
    }
}

/// A component that programs cluster routes into the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Writer {
    /// Calico Felix (route protocol 80 by default, `felix/dataplane/linux/dataplanedefs`).
    Felix,
    /// BIRD via confd's `calico_kernel_programming` filter (route protocol 12, `RTPROT_BIRD`).
    Bird,
    /// This agent (route protocol from `--route-protocol`).
    Routewarden,
}

impl Writer {
    /// Stable lowercase name, used as a metric label value.
    pub fn label(self) -> &'static str {
        match self {
            Writer::Felix => "felix",
            Writer::Bird => "bird",
            Writer::Routewarden => "routewarden",
        }
    }
}
