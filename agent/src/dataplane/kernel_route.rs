//! The kernel route and its wire encoding: routes keyed exactly as the kernel FIB keys them,
//! their target attributes, the conversion from [`ClusterRoute`]s, and the rtnetlink messages
//! that dump, write and delete them (and the parse of what the kernel sends back).
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
use rtnetlink::packet_core::{
    Emitable, NetlinkHeader, NetlinkMessage, NetlinkPayload, Nla, NlaBuffer, NLA_ALIGNTO, NLA_HEADER_SIZE, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL,
    NLM_F_REPLACE, NLM_F_REQUEST,
};
use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType};
use rtnetlink::packet_route::{AddressFamily, RouteNetlinkMessage};
use serde::Serialize;

use super::nexthop::NexthopKey;
use crate::ownership::{PolicyRoute, PolicyRouteType};
use crate::routes::{ClusterRoute, RouteDevices};
use crate::vocabulary::{PoolClass, RoutePath, RTPROT_FELIX, RT_TABLE_MAIN};

/// `RT_TABLE_COMPAT`: what `rtm_table` holds for tables above 255 (the real id is in `RTA_TABLE`).
const RT_TABLE_COMPAT: u8 = 252;
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

    fn address_family(self) -> AddressFamily {
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
    /// per binary search and once per step of every merged walk (issue 18).
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
    fn from_kernel(kind: RouteType) -> RouteKind {
        match kind {
            RouteType::Unicast => RouteKind::Unicast,
            RouteType::BlackHole => RouteKind::Blackhole,
            other => RouteKind::Other(u8::from(other)),
        }
    }

    fn to_kernel(self) -> RouteType {
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
    pub fn through<'a>(&'a self, nexthops: &std::collections::BTreeMap<u32, super::nexthop::ObservedNexthop>) -> std::borrow::Cow<'a, ObservedRoute> {
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

fn addr_of(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

/// Parse a kernel route message (dump reply or notification). Returns `None` for messages
/// that are not IPv4/IPv6 routes or carry a malformed destination; never panics on kernel
/// data.
///
/// Kernel habits handled here: the real table id is in `RTA_TABLE` (`rtm_table` is 252 for
/// ids above 255); IPv4 omits `RTA_PRIORITY` for metric 0; IPv6 reports metric 1024 for 0;
/// a default route has no `RTA_DST`; onlink is `RTNH_F_ONLINK` in `rtm_flags`.
pub fn parse_route(msg: &RouteMessage) -> Option<ObservedRoute> {
    let h = &msg.header;
    let family = match h.address_family {
        AddressFamily::Inet => Family::V4,
        AddressFamily::Inet6 => Family::V6,
        _ => return None,
    };
    let mut table = u32::from(h.table);
    let mut dst_addr: Option<IpAddr> = None;
    let mut gateway = None;
    let mut oif = None;
    let mut metric = 0;
    let mut nexthop = None;
    let mut extra = false;
    for attr in &msg.attributes {
        match attr {
            RouteAttribute::Table(t) => table = *t,
            RouteAttribute::Destination(a) => dst_addr = addr_of(a),
            RouteAttribute::Gateway(a) => gateway = addr_of(a),
            RouteAttribute::Oif(i) => oif = Some(*i),
            RouteAttribute::Priority(p) => metric = *p,
            RouteAttribute::Metrics(m) => extra |= !m.is_empty(),
            RouteAttribute::MultiPath(_)
            | RouteAttribute::PrefSource(_)
            | RouteAttribute::Via(_)
            | RouteAttribute::Encap(_)
            | RouteAttribute::EncapType(_)
            | RouteAttribute::Source(_) => extra = true,
            RouteAttribute::NhId(id) => nexthop = Some(*id),
            _ => {}
        }
    }
    let dst_addr = dst_addr.unwrap_or(match family {
        Family::V4 => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        Family::V6 => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
    });
    if dst_addr.is_ipv4() != (family == Family::V4) {
        return None;
    }
    let dst = IpNet::new(dst_addr, h.destination_prefix_length).ok()?;
    Some(ObservedRoute {
        key: RouteKey::new(table, dst, h.tos, metric),
        kind: RouteKind::from_kernel(h.kind),
        gateway,
        oif,
        onlink: h.flags.contains(RouteFlags::Onlink),
        nexthop,
        protocol: u8::from(h.protocol),
        scope: u8::from(h.scope),
        extra,
        cloned: h.flags.contains(RouteFlags::Cloned),
    })
}

fn header_for(key: &RouteKey) -> RouteHeader {
    RouteHeader {
        address_family: key.family.address_family(),
        destination_prefix_length: key.dst.prefix_len(),
        tos: key.tos,
        table: u8::try_from(key.table).unwrap_or(RT_TABLE_COMPAT),
        ..RouteHeader::default()
    }
}

/// The attributes every route message of ours starts with: destination (none for a
/// default route), table, priority (metric).
fn base_attributes(key: &RouteKey) -> impl Iterator<Item = RouteAttribute> {
    let dst = (key.dst.prefix_len() > 0).then(|| RouteAttribute::Destination(RouteAddress::from(key.dst.addr())));
    dst.into_iter().chain([RouteAttribute::Table(key.table), RouteAttribute::Priority(key.metric)])
}

/// The header and attributes of the `RTM_NEWROUTE` that writes `route` with its device at
/// `oif`, or, with `nexthop`, through that nexthop object (`RTA_NH_ID`; the kernel takes
/// gateway, device and onlink from the object and refuses them next to it,
/// `fib_create_info`): [`write_request`]'s message and [`emit_write_request`]'s bytes.
fn write_parts(route: &KernelRoute, oif: Option<u32>, nexthop: Option<u32>) -> (RouteHeader, impl Iterator<Item = RouteAttribute>) {
    let key = &route.key;
    let t = &route.target;
    let mut header = header_for(key);
    header.protocol = RouteProtocol::from(t.protocol);
    header.scope = RouteScope::from(t.scope);
    header.kind = t.kind.to_kernel();
    if nexthop.is_none() && t.onlink {
        header.flags = RouteFlags::Onlink;
    }
    let via = match nexthop {
        Some(id) => [Some(RouteAttribute::NhId(id)), None],
        None => [t.gateway.map(|gw| RouteAttribute::Gateway(RouteAddress::from(gw))), oif.map(RouteAttribute::Oif)],
    };
    (header, base_attributes(key).chain(via.into_iter().flatten()))
}

/// `nlmsg_flags` of a route write: `NLM_F_CREATE|NLM_F_EXCL` when `exclusive`, else
/// `NLM_F_CREATE|NLM_F_REPLACE` ([`write_request`]); no `NLM_F_ACK`.
fn write_flags(exclusive: bool) -> u16 {
    NLM_F_REQUEST | NLM_F_CREATE | if exclusive { NLM_F_EXCL } else { NLM_F_REPLACE }
}

/// Build the `RTM_NEWROUTE` request that writes `route` with its device at `oif`, or, with
/// `nexthop`, through that nexthop object (`RTA_NH_ID`; the kernel takes gateway, device and
/// onlink from the object and refuses them next to it, `fib_create_info`).
///
/// `exclusive`: `NLM_F_CREATE|NLM_F_EXCL` (fails with `EEXIST` if any route holds the key:
/// used for keys not known to be ours, so a foreign route is never overwritten); otherwise
/// `NLM_F_CREATE|NLM_F_REPLACE` (atomic replace of our own route, `ip route replace`).
pub fn write_request(route: &KernelRoute, oif: Option<u32>, nexthop: Option<u32>, exclusive: bool) -> NetlinkMessage<RouteNetlinkMessage> {
    let (header, attributes) = write_parts(route, oif, nexthop);
    let mut msg = RouteMessage::default();
    msg.header = header;
    msg.attributes = attributes.collect();
    let mut req = NetlinkMessage::from(RouteNetlinkMessage::NewRoute(msg));
    req.header.flags = write_flags(exclusive) | NLM_F_ACK;
    req
}

/// Append to `buf` the `RTM_NEWROUTE` message [`write_request`] builds for the same arguments,
/// as a batch sends it: sequence number `seq`, port 0, without `NLM_F_ACK`, padded to the
/// netlink alignment (4 bytes). Returns the message's length before the padding.
///
/// The same header and attributes ([`write_parts`]), emitted by the library's `Emitable` of
/// the two headers and each attribute's kind and value in the library's `NlaBuffer`, but with
/// no `Vec` of attributes to allocate and drop and each attribute's length computed once: a
/// framed `NetlinkMessage` computes every attribute's length about ten times between
/// `finalize` and `serialize` (250 ns of a cold start's route, where the kernel's insert takes
/// 0.5–1 µs; issue 18). The bytes equal the library's serialization of `write_request`'s
/// framed message (a property test over every route shape).
pub fn emit_write_request(buf: &mut Vec<u8>, route: &KernelRoute, oif: Option<u32>, nexthop: Option<u32>, exclusive: bool, seq: u32) -> usize {
    let (header, attributes) = write_parts(route, oif, nexthop);
    let start = buf.len();
    let mut frame = NetlinkHeader::default();
    let payload = start + frame.buffer_len();
    buf.resize(payload + header.buffer_len(), 0);
    header.emit(&mut buf[payload..]);
    for attr in attributes {
        let at = buf.len();
        let len = NLA_HEADER_SIZE + attr.value_len();
        buf.resize(at + len.next_multiple_of(NLA_ALIGNTO), 0);
        let mut nla = NlaBuffer::new(&mut buf[at..at + len]);
        nla.set_kind(attr.kind());
        nla.set_length(u16::try_from(len).unwrap_or(u16::MAX));
        attr.emit_value(nla.value_mut());
    }
    let len = buf.len() - start;
    frame.length = u32::try_from(len).unwrap_or(u32::MAX);
    frame.message_type = RouteNetlinkMessage::NewRoute(RouteMessage::default()).message_type();
    frame.flags = write_flags(exclusive);
    frame.sequence_number = seq;
    frame.emit(&mut buf[start..payload]);
    // Attributes are 4-byte multiples (`nla_align`), and so the message: no padding to add.
    debug_assert_eq!(len % 4, 0);
    len
}

/// Build the `RTM_DELROUTE` request that deletes the route at `key` only if it still carries
/// `protocol`: a route another writer put at the same key meanwhile is left alone (the kernel
/// answers `ESRCH`). Type, scope, gateway and device are wildcards (Felix `deleteRoute`;
/// `RT_SCOPE_NOWHERE` is the IPv4 scope wildcard in `fib_table_delete`).
pub fn delete_request(key: &RouteKey, protocol: u8) -> NetlinkMessage<RouteNetlinkMessage> {
    let mut msg = RouteMessage::default();
    msg.header = header_for(key);
    msg.header.protocol = RouteProtocol::from(protocol);
    msg.header.scope = RouteScope::NoWhere;
    msg.header.kind = RouteType::Unspec;
    msg.attributes = base_attributes(key).collect();
    let mut req = NetlinkMessage::from(RouteNetlinkMessage::DelRoute(msg));
    req.header.flags = NLM_F_REQUEST | NLM_F_ACK;
    req
}

/// Build a strict, kernel-side filtered dump request: routes of `family` in `table`, of
/// `protocol` (0 = any). With `NETLINK_GET_STRICT_CHK` the kernel filters by `rtm_protocol`
/// and `RTA_TABLE` (`ip_valid_fib_dump_req`) and answers `ENOENT` for a table that does not
/// exist.
pub fn dump_request(family: Family, table: u32, protocol: u8) -> NetlinkMessage<RouteNetlinkMessage> {
    let mut msg = RouteMessage::default();
    msg.header.address_family = family.address_family();
    msg.header.table = u8::try_from(table).unwrap_or(RT_TABLE_COMPAT);
    msg.header.protocol = RouteProtocol::from(protocol);
    msg.header.scope = RouteScope::Universe;
    msg.header.kind = RouteType::Unspec;
    msg.attributes.push(RouteAttribute::Table(table));
    let mut req = NetlinkMessage::from(RouteNetlinkMessage::GetRoute(msg));
    req.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    req
}

/// [`dump_request`] for both families at once (`AF_UNSPEC`: `rtnl_dump_all` runs every
/// family's route dump with the same filter; a table that does not exist is empty there, not
/// `ENOENT`). Replies of other families (`RTNL_FAMILY_IPMR`) are dropped by [`parse_route`].
pub fn dump_request_both_families(table: u32, protocol: u8) -> NetlinkMessage<RouteNetlinkMessage> {
    let mut req = dump_request(Family::V4, table, protocol);
    if let NetlinkPayload::InnerMessage(RouteNetlinkMessage::GetRoute(msg)) = &mut req.payload {
        msg.header.address_family = AddressFamily::Unspec;
    }
    req
}

/// Build a strict dump request for every route of both families in every table (`AF_UNSPEC`,
/// `rtm_table` 0 and no `RTA_TABLE`), any protocol: which nexthop objects any route goes
/// through. (The kernel takes no `RTA_NH_ID` filter in a route dump, `ip_valid_fib_dump_req`;
/// `ip route show nhid` filters in user space too.)
pub fn all_tables_dump_request() -> NetlinkMessage<RouteNetlinkMessage> {
    let mut msg = RouteMessage::default();
    msg.header.address_family = AddressFamily::Unspec;
    msg.header.scope = RouteScope::Universe;
    msg.header.kind = RouteType::Unspec;
    let mut req = NetlinkMessage::from(RouteNetlinkMessage::GetRoute(msg));
    req.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    req
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routes::RouteOrigin;
    use proptest::prelude::*;

    fn cr(dst: &str, path: RoutePath, gw: Option<&str>) -> ClusterRoute {
        ClusterRoute {
            dst: dst.parse().unwrap(),
            path,
            gateway: gw.map(|g| g.parse().unwrap()),
            device: None,
            class: PoolClass::Ipip,
            pool: "p".into(),
            origin: RouteOrigin::OwnBlock { block: dst.into() },
        }
    }

    /// The written-out order is the derived one: every pair of a set of keys that differ in
    /// each field (and in both directions), against the fields' tuple with `IpNet`'s own order;
    /// equal exactly when `==` says so.
    #[test]
    fn route_key_order_is_the_fields_order() {
        let dsts = [
            "0.0.0.0/0",
            "10.0.0.0/8",
            "10.0.0.0/26",
            "10.0.0.64/26",
            "10.0.1.0/24",
            "255.255.255.255/32",
            "::/0",
            "fd00::/8",
            "fd00::/122",
            "fd00::40/122",
            "ffff::1/128",
        ];
        let mut keys = Vec::new();
        for table in [48, 254] {
            for dst in dsts {
                let dst: IpNet = dst.parse().unwrap();
                for (tos, metric) in [(0, 0), (0, 1024), (0x10, 0), (0x10, 1024)] {
                    keys.push(RouteKey { table, family: Family::of(&dst), dst, tos, metric });
                }
            }
        }
        // A family that disagrees with `dst` (a hand-built key) still orders by the field.
        keys.push(RouteKey { table: 254, family: Family::V6, dst: "10.0.0.0/26".parse().unwrap(), tos: 0, metric: 1024 });
        let fields = |k: &RouteKey| (k.table, k.family, k.dst, k.tos, k.metric);
        for a in &keys {
            for b in &keys {
                assert_eq!(a.cmp(b), fields(a).cmp(&fields(b)), "{a:?} vs {b:?}");
                assert_eq!(a.cmp(b) == std::cmp::Ordering::Equal, a == b);
            }
        }
    }

    #[test]
    fn shapes_match_felix() {
        let s = RouteSettings::default();
        let t = to_kernel_route(&cr("10.244.20.0/26", RoutePath::Tunnel, Some("10.0.0.12")), &s).unwrap();
        assert_eq!(t.route.to_string(), "10.244.20.0/26 via 10.0.0.12 dev tunl0 proto 80 metric 1024 onlink");
        let n = to_kernel_route(&cr("10.244.20.0/26", RoutePath::HostNic, Some("10.0.0.12")), &s).unwrap();
        assert_eq!(n.route.target.device.as_deref(), Some("eth0"));
        let b = to_kernel_route(&cr("10.244.10.0/26", RoutePath::Blackhole, None), &s).unwrap();
        assert_eq!(b.route.to_string(), "blackhole 10.244.10.0/26 proto 80 metric 1024");
        let s48 = RouteSettings { table: 48, metric: 0, protocol: 201, ..RouteSettings::default() };
        let v6 = to_kernel_route(&cr("fd00:10::/122", RoutePath::HostNic, Some("fd00::12")), &s48).unwrap();
        assert_eq!(v6.route.key.metric, 1024, "IPv6 metric 0 is stored as 1024");
        assert_eq!(v6.route.key.table, 48);
    }

    #[test]
    fn conversion_errors() {
        let s = RouteSettings::default();
        assert!(matches!(to_kernel_route(&cr("10.244.20.0/26", RoutePath::Tunnel, None), &s), Err(ConversionError::MissingGateway { .. })));
        assert!(matches!(to_kernel_route(&cr("10.244.20.0/26", RoutePath::Tunnel, Some("fd00::1")), &s), Err(ConversionError::FamilyMismatch { .. })));
    }

    #[test]
    fn key_normalisation() {
        let k = RouteKey::new(254, "10.244.20.7/26".parse().unwrap(), 0, 0);
        assert_eq!(k.dst.to_string(), "10.244.20.0/26");
        assert_eq!(k.metric, 0, "IPv4 metric 0 stays 0");
    }

    #[test]
    fn parse_roundtrip_of_written_route() {
        let s = RouteSettings { table: 300, ..RouteSettings::default() };
        let d = to_kernel_route(&cr("10.244.20.0/26", RoutePath::Tunnel, Some("10.0.0.12")), &s).unwrap();
        let req = write_request(&d.route, Some(7), None, false);
        let RouteNetlinkMessage::NewRoute(msg) = req.payload.clone().into_inner_owned() else { panic!() };
        assert_eq!(msg.header.table, RT_TABLE_COMPAT);
        let o = parse_route(&msg).unwrap();
        assert_eq!(o.key, d.route.key);
        assert!(o.onlink);
        assert_eq!(o.oif, Some(7));
        assert!(!o.extra);
        assert_eq!(o.named(|_| Some("tunl0".into())), d.route);
    }

    /// Any route key and target the encoder may be handed (of either family, any prefix
    /// length, table, metric, type, protocol and scope, a gateway of either family or none),
    /// with any device index, nexthop object, create mode and sequence number.
    fn any_write() -> impl Strategy<Value = (KernelRoute, Option<u32>, Option<u32>, bool, u32)> {
        let dst = prop_oneof![
            (any::<[u8; 4]>(), 0u8..=32).prop_map(|(a, l)| IpNet::V4(ipnet::Ipv4Net::new(a.into(), l).unwrap())),
            (any::<[u8; 16]>(), 0u8..=128).prop_map(|(a, l)| IpNet::V6(ipnet::Ipv6Net::new(a.into(), l).unwrap())),
        ];
        let gateway = prop_oneof![Just(None), any::<[u8; 4]>().prop_map(|a| Some(IpAddr::from(a))), any::<[u8; 16]>().prop_map(|a| Some(IpAddr::from(a))),];
        let kind = prop_oneof![Just(RouteKind::Unicast), Just(RouteKind::Blackhole), any::<u8>().prop_map(RouteKind::Other)];
        let key = (any::<u32>(), dst, any::<u8>(), any::<u32>()).prop_map(|(table, dst, tos, metric)| RouteKey::new(table, dst, tos, metric));
        let target = (kind, gateway, any::<bool>(), any::<u8>(), any::<u8>()).prop_map(|(kind, gateway, onlink, protocol, scope)| RouteTarget {
            kind,
            gateway,
            device: Some("tunl0".into()),
            onlink,
            protocol,
            scope,
        });
        (key, target, any::<Option<u32>>(), any::<Option<u32>>(), any::<bool>(), any::<u32>())
            .prop_map(|(key, target, oif, nexthop, exclusive, seq)| (KernelRoute { key, target }, oif, nexthop, exclusive, seq))
    }

    proptest! {
        /// The batch encoder writes exactly the bytes of the library's message for the same
        /// route, framed as a batch frames it (NLM_F_ACK cleared, sequence number, port 0),
        /// appended after what the buffer already holds.
        #[test]
        fn emit_write_request_is_the_library_message((route, oif, nexthop, exclusive, seq) in any_write(), before in 0usize..9) {
            let mut req = write_request(&route, oif, nexthop, exclusive);
            req.header.flags &= !NLM_F_ACK;
            req.header.sequence_number = seq;
            req.header.port_number = 0;
            req.finalize();
            let mut want = vec![0u8; req.buffer_len()];
            req.serialize(&mut want);
            let mut buf = vec![0xa5; before * 4];
            let len = emit_write_request(&mut buf, &route, oif, nexthop, exclusive, seq);
            prop_assert_eq!(len, want.len());
            prop_assert_eq!(buf.len(), before * 4 + len);
            prop_assert!(buf[..before * 4].iter().all(|&b| b == 0xa5), "what was there is kept");
            prop_assert_eq!(&buf[before * 4..], &want[..]);
            // And the bytes say what the route is (the library's parser, then ours), where the
            // gateway is of the route's family (the only routes the agent builds).
            if route.target.gateway.is_some_and(|gw| gw.is_ipv4() != matches!(route.key.dst, IpNet::V4(_))) {
                return Ok(());
            }
            let parsed = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buf[before * 4..]).expect("the library parses it");
            let NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewRoute(msg)) = parsed.payload else { panic!("not a new route: {parsed:?}") };
            let o = parse_route(&msg).expect("a route");
            let classic = nexthop.is_none();
            prop_assert_eq!(o.key, route.key);
            prop_assert_eq!(o.kind.to_kernel(), route.target.kind.to_kernel());
            prop_assert_eq!(o.gateway, route.target.gateway.filter(|_| classic));
            prop_assert_eq!(o.oif, oif.filter(|_| classic));
            prop_assert_eq!(o.onlink, classic && route.target.onlink);
            prop_assert_eq!(o.nexthop, nexthop);
            prop_assert_eq!((o.protocol, o.scope), (route.target.protocol, route.target.scope));
            prop_assert_eq!(parsed.header.sequence_number, seq);
            prop_assert_eq!(parsed.header.flags, NLM_F_REQUEST | NLM_F_CREATE | if exclusive { NLM_F_EXCL } else { NLM_F_REPLACE });
        }
    }

    trait IntoInner {
        fn into_inner_owned(self) -> RouteNetlinkMessage;
    }
    impl IntoInner for rtnetlink::packet_core::NetlinkPayload<RouteNetlinkMessage> {
        fn into_inner_owned(self) -> RouteNetlinkMessage {
            match self {
                rtnetlink::packet_core::NetlinkPayload::InnerMessage(m) => m,
                _ => panic!("not an inner message"),
            }
        }
    }
}
