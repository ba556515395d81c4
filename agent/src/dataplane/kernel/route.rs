//! The kernel route: routes keyed exactly as the kernel FIB keys them, their target
//! attributes, and the conversion from [`ClusterRoute`]s. Their wire encoding (the rtnetlink
//! messages that dump, write and delete them, and the parse of what the kernel sends back) is
//! in `route_wire.rs`.
//!
//! Keying mirrors Felix `felix/routetable/defs.go` (`RouteKey{CIDR, TOS, Priority}`) plus the
//! table and address family, because this agent programs one table of either family. The IPv4
//! FIB key is (table, dst/len, tos, priority) (`fib_table_insert`); the IPv6 key is
//! (table, dst/len, metric) (`fib6_add_rt2node`). IPv6 has no TOS (always 0) and the kernel
//! stores an IPv6 metric of 0 as 1024 (`IP6_RT_PRIO_USER`), so keys are normalised the same way
//! (Felix `normalizeRouteKey`, route_table.go).

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use rtnetlink::packet_route::route::RouteType;
use rtnetlink::packet_route::AddressFamily;
use serde::Serialize;

use crate::dataplane::kernel::nexthop::NexthopKey;
use crate::ownership::{PolicyRoute, PolicyRouteType};
use crate::routes::{ClusterRoute, RouteDevices};
use crate::vocabulary::{PoolClass, RoutePath, RTPROT_FELIX, RT_TABLE_MAIN};

#[cfg(test)]
mod tests;
/// `RT_TABLE_COMPAT`: what `rtm_table` holds for tables above 255 (the real id is in `RTA_TABLE`).
pub(super) const RT_TABLE_COMPAT: u8 = 252;
/// The metric the kernel gives an IPv6 route written with metric 0 (`IP6_RT_PRIO_USER`).
pub const IP6_RT_PRIO_USER: u32 = 1024;

/// Address family of a route.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// `AF_INET`.
    V4,
    /// `AF_INET6`.
    V6,
}

impl Family {
    /// The family of `net`.
    pub fn of(net: &IpNet) -> Family {
        match net {
            IpNet::V4(_) => Family::V4,
            IpNet::V6(_) => Family::V6,
        }
    }

    /// Stable lowercase name (`v4`, `v6`), usable as a metric label value.
    pub fn label(self) -> &'static str {
        match self {
            Family::V4 => "v4",
            Family::V6 => "v6",
        }
    }

    pub(super) fn address_family(self) -> AddressFamily {
        match self {
            Family::V4 => AddressFamily::Inet,
            Family::V6 => AddressFamily::Inet6,
        }
    }
}

/// The kernel's identity of a route: two routes with the same key cannot coexist, and a route
/// replace overwrites whatever route holds the key, whichever process wrote it.
///
/// Routes that differ only in `metric` are different keys (they coexist; the lower metric
/// wins). Build keys with [`RouteKey::new`] so IPv6 metric 0 becomes 1024 and host bits of
/// `dst` are cleared, as the kernel does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct RouteKey {
    /// Routing table id (254 = main).
    pub table: u32,
    /// Address family (always equal to the family of `dst`).
    pub family: Family,
    /// Destination prefix.
    pub dst: IpNet,
    /// IPv4 TOS (always 0 for IPv6 and for routes this agent writes).
    pub tos: u8,
    /// Route priority (`metric` in `ip route`).
    pub metric: u32,
}

impl RouteKey {
    /// A normalised key: host bits of `dst` cleared, IPv6 TOS 0 and metric 0 -> 1024.
    #[inline]
    pub fn new(table: u32, dst: IpNet, tos: u8, metric: u32) -> RouteKey {
        let family = Family::of(&dst);
        let (tos, metric) = match family {
            Family::V4 => (tos, metric),
            Family::V6 => (0, if metric == 0 { IP6_RT_PRIO_USER } else { metric }),
        };
        RouteKey { table, family, dst: dst.trunc(), tos, metric }
    }
}

impl Ord for RouteKey {
    /// The order `#[derive(Ord)]` gives: table, family, `dst` as `IpNet` orders it (IPv4
    /// before IPv6, then address, then prefix length), TOS, metric. Written out so that it
    /// inlines: ipnet's derived comparison is a call into another crate, made about 14 times
    /// per binary search and once per step of every merged walk.
    #[inline]
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        #[inline]
        fn dst(n: &IpNet) -> (u8, u128, u8) {
            match n {
                IpNet::V4(v) => (0, u128::from(v.addr().to_bits()), v.prefix_len()),
                IpNet::V6(v) => (1, v.addr().to_bits(), v.prefix_len()),
            }
        }
        self.table
            .cmp(&other.table)
            .then_with(|| self.family.cmp(&other.family))
            .then_with(|| dst(&self.dst).cmp(&dst(&other.dst)))
            .then_with(|| self.tos.cmp(&other.tos))
            .then_with(|| self.metric.cmp(&other.metric))
    }
}

impl PartialOrd for RouteKey {
    #[inline]
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for RouteKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} table {} metric {}", self.dst, self.table, self.metric)?;
        if self.tos != 0 {
            write!(f, " tos {:#x}", self.tos)?;
        }
        Ok(())
    }
}

/// Route type (`rtm_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RouteKind {
    /// `RTN_UNICAST`: a gateway or direct route.
    Unicast,
    /// `RTN_BLACKHOLE`: drop silently.
    Blackhole,
    /// Any other type (local, broadcast, unreachable, ...), never written by this agent.
    Other(u8),
}

impl RouteKind {
    pub(super) fn from_kernel(kind: RouteType) -> RouteKind {
        match kind {
            RouteType::Unicast => RouteKind::Unicast,
            RouteType::BlackHole => RouteKind::Blackhole,
            other => RouteKind::Other(u8::from(other)),
        }
    }

    pub(super) fn to_kernel(self) -> RouteType {
        match self {
            RouteKind::Unicast => RouteType::Unicast,
            RouteKind::Blackhole => RouteType::BlackHole,
            RouteKind::Other(n) => RouteType::from(n),
        }
    }
}

/// `RT_SCOPE_UNIVERSE`: the scope of gateway, onlink and blackhole routes.
pub const RT_SCOPE_UNIVERSE: u8 = 0;

/// What a route does: everything about a route except its key.
///
/// Felix `TargetType` -> attributes (`felix/routetable/defs.go`): onlink and no-encap targets
/// are `RTN_UNICAST` with `RTNH_F_ONLINK`, scope universe; blackholes are `RTN_BLACKHOLE`,
/// scope universe, no device.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct RouteTarget {
    /// Route type.
    pub kind: RouteKind,
    /// Next hop (`via`), `None` for blackholes.
    pub gateway: Option<IpAddr>,
    /// Output device name (`dev`); resolved to an ifindex when the route is written. `None` for
    /// blackholes (IPv6 reports blackholes on `lo`; that is ignored). Shared: every route
    /// through a device holds the same name (a copy of a route copies no string).
    pub device: Option<Arc<str>>,
    /// `RTNH_F_ONLINK`: the gateway is reachable on `device` without a connected route.
    pub onlink: bool,
    /// Route protocol (`proto`): 2 kernel, 3 boot, 4 static, 12 bird, 80 Felix, ...
    pub protocol: u8,
    /// Route scope (`rtm_scope`); 0 universe.
    pub scope: u8,
}

/// One route in the kernel model: its key and target.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct KernelRoute {
    /// The kernel's key for the route.
    pub key: RouteKey,
    /// What the route does.
    pub target: RouteTarget,
}

/// The policy reads a kernel route through this view (monomorphized: no copy, no call).
impl PolicyRoute for KernelRoute {
    fn table(&self) -> u32 {
        self.key.table
    }
    fn dst(&self) -> IpNet {
        self.key.dst
    }
    fn route_type(&self) -> PolicyRouteType {
        match self.target.kind {
            RouteKind::Unicast => PolicyRouteType::Unicast,
            RouteKind::Blackhole => PolicyRouteType::Blackhole,
            RouteKind::Other(_) => PolicyRouteType::Other,
        }
    }
    fn device(&self) -> Option<&str> {
        self.target.device.as_deref()
    }
    fn protocol(&self) -> u8 {
        self.target.protocol
    }
}

impl fmt::Display for KernelRoute {
    /// Renders like `ip route`: `blackhole 10.244.10.0/26 proto 80 metric 1024` or
    /// `10.244.20.0/26 via 10.0.0.12 dev tunl0 proto 80 metric 1024 onlink`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.target;
        match t.kind {
            RouteKind::Unicast => write!(f, "{}", self.key.dst)?,
            RouteKind::Blackhole => write!(f, "blackhole {}", self.key.dst)?,
            RouteKind::Other(n) => write!(f, "type {n} {}", self.key.dst)?,
        }
        if let Some(gw) = t.gateway {
            write!(f, " via {gw}")?;
        }
        if let Some(dev) = &t.device {
            write!(f, " dev {dev}")?;
        }
        write!(f, " proto {} metric {}", t.protocol, self.key.metric)?;
        if self.key.table != RT_TABLE_MAIN {
            write!(f, " table {}", self.key.table)?;
        }
        if t.onlink {
            write!(f, " onlink")?;
        }
        Ok(())
    }
}

/// Why a [`ClusterRoute`] cannot become a kernel route.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConversionError {
    /// A tunnel or host-NIC route without a next hop.
    #[error("cluster route {dst} ({path}) has no gateway")]
    MissingGateway {
        /// Destination of the route.
        dst: IpNet,
        /// Its path label.
        path: &'static str,
    },
    /// Next hop of the other family than the destination (would need `RTA_VIA`).
    #[error("cluster route {dst} has gateway {gateway} of the other address family")]
    FamilyMismatch {
        /// Destination of the route.
        dst: IpNet,
        /// The offending next hop.
        gateway: IpAddr,
    },
}

/// A desired kernel route plus the cluster facts it came from (for per-class reports).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredRoute {
    /// The route to program.
    pub route: KernelRoute,
    /// Pool class of the destination.
    pub class: PoolClass,
    /// Path the route takes.
    pub path: RoutePath,
    /// With `--nexthop-objects`: the nexthop object the route goes through (the remote node
    /// and IP pool); `None` for blackholes, routes to no node, and in classic mode.
    pub nexthop: Option<NexthopKey>,
}

/// Route-writing settings: what protocol, metric and table this agent's routes carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteSettings {
    /// Route protocol written on every route (1..=255; default 80, Felix's, so a handover to or
    /// from Felix is an atomic replace).
    pub protocol: u8,
    /// Metric (priority) of every route; default 1024 (BIRD's `krt_metric`, Calico's normal
    /// priority).
    pub metric: u32,
    /// Table id; default 254 (main).
    pub table: u32,
    /// Device a tunnel route goes through when its [`ClusterRoute`] names none (`tunl0`).
    pub tunnel_device: Arc<str>,
    /// Device a host-NIC route goes through when its [`ClusterRoute`] names none (`eth0`).
    pub host_device: Arc<str>,
}

impl RouteSettings {
    /// Felix's protocol, metric 1024 and the main table, with the default devices of
    /// `devices` (the configured tunnel device and host NIC).
    #[must_use]
    pub fn with_devices(devices: &RouteDevices) -> Self {
        RouteSettings {
            protocol: RTPROT_FELIX,
            metric: 1024,
            table: RT_TABLE_MAIN,
            tunnel_device: devices.tunnel.as_str().into(),
            host_device: devices.host_nic.as_str().into(),
        }
    }
}

impl Default for RouteSettings {
    fn default() -> Self {
        RouteSettings::with_devices(&RouteDevices::default())
    }
}

/// Convert one cluster route to the kernel route this agent writes for it.
///
/// Shapes (Felix `route_mgr.go`, reference §2.4/§2.6): tunnel and host-NIC routes are
/// `dst via gw dev <dev> proto P metric M onlink` (the device is the route's own or, if it has
/// none, the configured tunnel / host NIC); blackholes are `blackhole dst proto P metric M`.
///
/// # Errors
/// [`ConversionError`] for a non-blackhole route without a gateway or with a gateway of the
/// other family.
#[inline]
pub fn to_kernel_route(route: &ClusterRoute, settings: &RouteSettings) -> Result<DesiredRoute, ConversionError> {
    let key = RouteKey::new(settings.table, route.dst, 0, settings.metric);
    let target = match route.path {
        RoutePath::Blackhole => {
            RouteTarget { kind: RouteKind::Blackhole, gateway: None, device: None, onlink: false, protocol: settings.protocol, scope: RT_SCOPE_UNIVERSE }
        }
        RoutePath::Tunnel | RoutePath::HostNic => {
            let gateway = route.gateway.ok_or(ConversionError::MissingGateway { dst: route.dst, path: route.path.label() })?;
            if gateway.is_ipv4() != matches!(route.dst, IpNet::V4(_)) {
                return Err(ConversionError::FamilyMismatch { dst: route.dst, gateway });
            }
            let device = route.device.clone().unwrap_or_else(|| match route.path {
                RoutePath::Tunnel => Arc::clone(&settings.tunnel_device),
                _ => Arc::clone(&settings.host_device),
            });
            RouteTarget {
                kind: RouteKind::Unicast,
                gateway: Some(gateway),
                device: Some(device),
                onlink: true,
                protocol: settings.protocol,
                scope: RT_SCOPE_UNIVERSE,
            }
        }
    };
    Ok(DesiredRoute { route: KernelRoute { key, target }, class: route.class, path: route.path, nexthop: None })
}

/// A route as the kernel reported it: devices as ifindexes, plus whether it carries
/// attributes this agent never writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObservedRoute {
    /// Normalised key.
    pub key: RouteKey,
    /// Route type.
    pub kind: RouteKind,
    /// `RTA_GATEWAY`.
    pub gateway: Option<IpAddr>,
    /// `RTA_OIF`.
    pub oif: Option<u32>,
    /// `RTNH_F_ONLINK` in `rtm_flags`.
    pub onlink: bool,
    /// `RTA_NH_ID`: the nexthop object the route goes through. The kernel still reports the
    /// object's gateway, device and onlink flag in `gateway`, `oif` and `onlink`
    /// (`net.ipv4.nexthop_compat_mode`, on by default).
    pub nexthop: Option<u32>,
    /// `rtm_protocol`.
    pub protocol: u8,
    /// `rtm_scope`.
    pub scope: u8,
    /// The route has attributes this agent never writes (multipath, metrics such as `mtu`,
    /// `src`, encap): a route of ours with them is rewritten.
    pub extra: bool,
    /// `RTM_F_CLONED`: a cache/exception entry, never a FIB route.
    pub cloned: bool,
}

impl ObservedRoute {
    /// The route with the gateway, device and onlink flag of the nexthop object it goes
    /// through, when the kernel left them out (`net.ipv4.nexthop_compat_mode` 0) and the
    /// object is in `nexthops` (id -> object); every other route is borrowed as it is (no
    /// copy: each route notification of ours passes here).
    #[must_use]
    pub fn through<'a>(
        &'a self,
        nexthops: &std::collections::BTreeMap<u32, crate::dataplane::kernel::nexthop::ObservedNexthop>,
    ) -> std::borrow::Cow<'a, ObservedRoute> {
        match self.nexthop.and_then(|id| nexthops.get(&id)) {
            Some(nh) if self.gateway.is_none() && self.oif.is_none() => {
                std::borrow::Cow::Owned(ObservedRoute { gateway: nh.gateway, oif: nh.oif, onlink: nh.onlink, ..self.clone() })
            }
            _ => std::borrow::Cow::Borrowed(self),
        }
    }

    /// Name the output device with `name_of` (ifindex -> name). Blackholes get no device
    /// (IPv6 reports them on `lo`).
    pub fn named(&self, name_of: impl Fn(u32) -> Option<Arc<str>>) -> KernelRoute {
        let device = match self.kind {
            RouteKind::Blackhole => None,
            _ => self.oif.map(|i| name_of(i).unwrap_or_else(|| format!("if{i}").into())),
        };
        KernelRoute {
            key: self.key,
            target: RouteTarget { kind: self.kind, gateway: self.gateway, device, onlink: self.onlink, protocol: self.protocol, scope: self.scope },
        }
    }
}
