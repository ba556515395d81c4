//! The kernel route's wire encoding: the rtnetlink messages that dump, write and delete
//! routes ([`write_request`], [`emit_write_request`]: the same bytes without building the
//! message), and the parse of what the kernel sends back ([`parse_route`]).

use std::net::IpAddr;

use ipnet::IpNet;
use rtnetlink::packet_core::{
    Emitable, NetlinkHeader, NetlinkMessage, NetlinkPayload, Nla, NlaBuffer, NLA_ALIGNTO, NLA_HEADER_SIZE, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL,
    NLM_F_REPLACE, NLM_F_REQUEST,
};
use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType};
use rtnetlink::packet_route::{AddressFamily, RouteNetlinkMessage};

use super::route::{Family, KernelRoute, ObservedRoute, RouteKey, RouteKind, RT_TABLE_COMPAT};

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
/// 0.5–1 µs). The bytes equal the library's serialization of `write_request`'s
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
