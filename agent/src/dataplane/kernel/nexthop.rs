//! Nexthop objects (`ip nexthop`, Linux 5.3+, `net/ipv4/nexthop.c`): what `--nexthop-objects`
//! writes, and the `RTM_*NEXTHOP` wire encoding, which `netlink-packet-route` does not have.
//!
//! In nexthop mode every cluster route to a remote node goes through one nexthop object per
//! (remote node, IP pool) ([`NexthopKey`]): all routes to one node in one pool share their
//! gateway, device and onlink flag (`routes::compute`, `Ctx::route`: both follow from the
//! node's address, the pool's encapsulation and CrossSubnet), so a node's address change or a
//! CrossSubnet path switch is one nexthop replace that re-points every block and borrowed /32
//! of that node at once (`replace_nexthop_single` keeps the routes and swaps what they point
//! at). Blackholes stay classic routes.
//!
//! A nexthop object is ours when it carries our route protocol and its id is in
//! [`NEXTHOP_IDS`]; any other is never replaced, reused or deleted. The kernel deletes every
//! route through a nexthop object it deletes, so one of ours is deleted only when no desired
//! route wants it, no route of ours refers to it, and a dump of every table finds no route
//! through it.

use std::fmt;
use std::net::IpAddr;
use std::ops::RangeInclusive;
use std::sync::Arc;

use rtnetlink::packet_core::{
    DecodeError, DefaultNla, Emitable, NetlinkDeserializable, NetlinkHeader, NetlinkMessage, NetlinkPayload, NetlinkSerializable, Nla, NlaBuffer, NlasIterator,
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST,
};
use serde::Serialize;

/// `RTM_NEWNEXTHOP` (`include/uapi/linux/rtnetlink.h`).
pub const RTM_NEWNEXTHOP: u16 = 104;
/// `RTM_DELNEXTHOP`.
pub const RTM_DELNEXTHOP: u16 = 105;
/// `RTM_GETNEXTHOP`.
pub const RTM_GETNEXTHOP: u16 = 106;

/// `NHA_*` attributes (`include/uapi/linux/nexthop.h`).
const NHA_ID: u16 = 1;
const NHA_GROUP: u16 = 2;
const NHA_BLACKHOLE: u16 = 4;
const NHA_OIF: u16 = 5;
const NHA_GATEWAY: u16 = 6;
const NHA_ENCAP_TYPE: u16 = 7;
const NHA_FDB: u16 = 11;
/// `RTNH_F_ONLINK` in `nh_flags`.
const RTNH_F_ONLINK: u32 = 4;
/// `sizeof(struct nhmsg)`: family, scope, protocol, reserved (one byte each), flags (u32).
const NHMSG_LEN: usize = 8;
const AF_UNSPEC: u8 = 0;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

/// The nexthop ids this agent allocates from ("RW" in the upper half). Ids outside it are
/// never ours, whatever their protocol.
pub const NEXTHOP_IDS: RangeInclusive<u32> = 0x5257_0001..=0x5257_ffff;

/// Which nexthop object a route goes through: the remote node and the IP pool. The family is
/// the pool's.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct NexthopKey {
    /// Name of the remote node.
    pub node: Arc<str>,
    /// Name of the IP pool.
    pub pool: Arc<str>,
}

impl fmt::Display for NexthopKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node {} pool {}", self.node, self.pool)
    }
}

/// A nexthop object as the kernel reported it (dump reply or notification).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObservedNexthop {
    /// `NHA_ID`.
    pub id: u32,
    /// `nh_protocol`.
    pub protocol: u8,
    /// `NHA_GATEWAY` (`None` for a device-only nexthop).
    pub gateway: Option<IpAddr>,
    /// `NHA_OIF`.
    pub oif: Option<u32>,
    /// `RTNH_F_ONLINK` in `nh_flags`.
    pub onlink: bool,
    /// A group, a blackhole, an FDB nexthop or one with an encapsulation: never one this
    /// agent writes.
    pub other: bool,
}

impl ObservedNexthop {
    /// Whether the object is ours: our `protocol` and an id in [`NEXTHOP_IDS`].
    pub fn is_ours(&self, protocol: u8) -> bool {
        self.protocol == protocol && NEXTHOP_IDS.contains(&self.id) && !self.other
    }
}

/// One nexthop object change to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NexthopOp {
    /// Write nexthop object `id`: `via gateway dev <oif> [onlink] proto protocol`.
    Write {
        /// The object's id.
        id: u32,
        /// Next hop address.
        gateway: IpAddr,
        /// Output device ifindex.
        oif: u32,
        /// `RTNH_F_ONLINK`.
        onlink: bool,
        /// `nh_protocol`.
        protocol: u8,
        /// Create only (`NLM_F_EXCL`: `EEXIST` if any object has the id); otherwise replace
        /// the object in place (the routes through it follow at once).
        exclusive: bool,
    },
    /// Delete nexthop object `id` (and, in the kernel, every route through it).
    Delete {
        /// The object's id.
        id: u32,
    },
}

impl NexthopOp {
    /// The id the op acts on.
    pub fn id(&self) -> u32 {
        match self {
            NexthopOp::Write { id, .. } | NexthopOp::Delete { id } => *id,
        }
    }
}

/// An `RTM_*NEXTHOP` message: `struct nhmsg` and its attributes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NexthopMessage {
    /// `RTM_NEWNEXTHOP`, `RTM_DELNEXTHOP` or `RTM_GETNEXTHOP`.
    pub message_type: u16,
    /// `nh_family` (`AF_INET`, `AF_INET6`, `AF_UNSPEC`).
    pub family: u8,
    /// `nh_scope` (reported by the kernel; 0 in requests).
    pub scope: u8,
    /// `nh_protocol`.
    pub protocol: u8,
    /// `nh_flags` (`RTNH_F_*`).
    pub flags: u32,
    /// `NHA_*` attributes, in order.
    pub attributes: Vec<DefaultNla>,
}

impl NetlinkSerializable for NexthopMessage {
    fn message_type(&self) -> u16 {
        self.message_type
    }

    fn buffer_len(&self) -> usize {
        NHMSG_LEN + self.attributes.as_slice().buffer_len()
    }

    fn serialize(&self, buffer: &mut [u8]) {
        buffer[0] = self.family;
        buffer[1] = self.scope;
        buffer[2] = self.protocol;
        buffer[3] = 0;
        buffer[4..8].copy_from_slice(&self.flags.to_ne_bytes());
        self.attributes.as_slice().emit(&mut buffer[NHMSG_LEN..]);
    }
}

impl NetlinkDeserializable for NexthopMessage {
    type Error = DecodeError;

    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<Self, Self::Error> {
        let Some(head) = payload.get(..NHMSG_LEN) else {
            return Err(DecodeError::from(format!("nhmsg of {} bytes, want {NHMSG_LEN}", payload.len())));
        };
        let mut attributes = Vec::new();
        for nla in NlasIterator::new(&payload[NHMSG_LEN..]) {
            let nla: NlaBuffer<&[u8]> = nla?;
            attributes.push(DefaultNla::new(nla.kind(), nla.value().to_vec()));
        }
        Ok(NexthopMessage {
            message_type: header.message_type,
            family: head[0],
            scope: head[1],
            protocol: head[2],
            flags: u32::from_ne_bytes([head[4], head[5], head[6], head[7]]),
            attributes,
        })
    }
}

fn u32_nla(kind: u16, v: u32) -> DefaultNla {
    DefaultNla::new(kind, v.to_ne_bytes().to_vec())
}

/// The `RTM_NEWNEXTHOP` request for `op` (a [`NexthopOp::Write`]) or the `RTM_DELNEXTHOP`
/// request (a [`NexthopOp::Delete`]), with `NLM_F_ACK`.
pub fn nexthop_request(op: &NexthopOp) -> NetlinkMessage<NexthopMessage> {
    let (msg, flags) = match op {
        NexthopOp::Write { id, gateway, oif, onlink, protocol, exclusive } => {
            let (family, addr) = match gateway {
                IpAddr::V4(a) => (AF_INET, a.octets().to_vec()),
                IpAddr::V6(a) => (AF_INET6, a.octets().to_vec()),
            };
            let msg = NexthopMessage {
                message_type: RTM_NEWNEXTHOP,
                family,
                protocol: *protocol,
                flags: if *onlink { RTNH_F_ONLINK } else { 0 },
                attributes: vec![u32_nla(NHA_ID, *id), u32_nla(NHA_OIF, *oif), DefaultNla::new(NHA_GATEWAY, addr)],
                ..NexthopMessage::default()
            };
            (msg, NLM_F_CREATE | if *exclusive { NLM_F_EXCL } else { NLM_F_REPLACE })
        }
        NexthopOp::Delete { id } => {
            (NexthopMessage { message_type: RTM_DELNEXTHOP, family: AF_UNSPEC, attributes: vec![u32_nla(NHA_ID, *id)], ..NexthopMessage::default() }, 0)
        }
    };
    let mut req = NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::InnerMessage(msg));
    req.header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
    req
}

/// The `RTM_GETNEXTHOP` dump request for every nexthop object of every family (strict
/// checking: an all-zero `nhmsg`, `nh_valid_dump_req`).
pub fn nexthop_dump_request() -> NetlinkMessage<NexthopMessage> {
    let msg = NexthopMessage { message_type: RTM_GETNEXTHOP, ..NexthopMessage::default() };
    let mut req = NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::InnerMessage(msg));
    req.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    req
}

fn read_u32(v: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(v.try_into().ok()?))
}

/// Parse a nexthop message; `None` for anything but `RTM_NEWNEXTHOP` with an id. Never panics
/// on kernel data.
pub fn parse_nexthop(msg: &NexthopMessage) -> Option<ObservedNexthop> {
    if msg.message_type != RTM_NEWNEXTHOP {
        return None;
    }
    let mut id = None;
    let mut gateway = None;
    let mut oif = None;
    let mut other = false;
    for nla in &msg.attributes {
        let mut value = vec![0; nla.value_len()];
        nla.emit_value(&mut value);
        match nla.kind() {
            NHA_ID => id = read_u32(&value),
            NHA_OIF => oif = read_u32(&value),
            NHA_GATEWAY => {
                gateway = match value.len() {
                    4 => <[u8; 4]>::try_from(value.as_slice()).ok().map(IpAddr::from),
                    16 => <[u8; 16]>::try_from(value.as_slice()).ok().map(IpAddr::from),
                    _ => None,
                }
            }
            NHA_GROUP | NHA_BLACKHOLE | NHA_ENCAP_TYPE | NHA_FDB => other = true,
            _ => {}
        }
    }
    Some(ObservedNexthop { id: id?, protocol: msg.protocol, gateway, oif, onlink: msg.flags & RTNH_F_ONLINK != 0, other })
}

/// The member ids of a nexthop group (`NHA_GROUP`: an array of `struct nexthop_grp`, 8
/// bytes each, the id first); empty for anything else. Never panics on kernel data.
pub fn group_members(msg: &NexthopMessage) -> Vec<u32> {
    let mut members = Vec::new();
    for nla in msg.attributes.iter().filter(|nla| nla.kind() == NHA_GROUP) {
        let mut value = vec![0; nla.value_len()];
        nla.emit_value(&mut value);
        members.extend(value.chunks_exact(8).filter_map(|entry| read_u32(&entry[..4])));
    }
    members
}

#[cfg(test)]
mod tests;
