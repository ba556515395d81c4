//! `route_watch_netlink`: socket filter on a NETLINK_ROUTE socket joined to
//! `RTMGRP_LINK | RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_ROUTE` and `RTNLGRP_NEXTHOP`. The backend
//! that works on every kernel (this host refuses fentry and has no kprobes).
//!
//! The kernel runs it once per notification of the socket's network namespace; the skb starts
//! at the `nlmsghdr` (facts measured in `../shared/reference/toolchain.md`):
//!
//! ```text
//! 0  nlmsghdr { u32 len; u16 type; u16 flags; u32 seq; u32 pid }   pid = writer's port id
//! 16 rtmsg { u8 family, dst_len, src_len, tos, table, protocol, scope, type; u32 flags }
//! 28 rtattr { u16 len; u16 type } + payload, each 4-byte aligned
//! 16 ifinfomsg { u8 family, pad; u16 type; i32 index; u32 flags; u32 change }  (RTM_NEWLINK)
//! 16 nhmsg { u8 family, scope, protocol, resvd; u32 flags }  (RTM_NEWNEXTHOP)
//! 24 rtattr NHA_ID (first, `nh_fill_node`) + u32 id
//! ```
//!
//! A nexthop replace re-sends every route through the object (compat mode) right after the
//! object's own notification, with the replacing request's port and sequence number: those
//! routes are not written, and the filter drops them ([`NexthopNotice`]).
//!
//! `NLM_F_REPLACE` (0x100) in a RTM_NEWROUTE means the write overwrote an existing route.
//! Returns 0: the copy for this socket is dropped (nothing reads it); map and ring-buffer
//! writes stay.
use aya_ebpf::{
    macros::{map, socket_filter},
    maps::{Array, PerCpuArray},
    programs::SkBuffContext,
};
use aya_log_ebpf::{macro_support::Level, warn};
use routewarden_common::route_watch::{NexthopNotice, RouteWrite, WriteOp, WriteOrigin, WriterIdKind, AF_INET, AF_INET6};

use crate::bpf_log::{allowed, LogKind};

use crate::route_detector::{count_decode_error, link_down, now_ns, observe};

const RTM_NEWLINK: u16 = 16;
const RTM_NEWROUTE: u16 = 24;
const RTM_DELROUTE: u16 = 25;
const RTM_NEWNEXTHOP: u16 = 104;
const NHA_ID: u16 = 1;
const NLM_F_REPLACE: u16 = 0x100;
const IFF_UP: u32 = 1;
const RTM_F_CLONED: u32 = 0x200;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_PRIORITY: u16 = 6;
const RTA_TABLE: u16 = 15;
const RTA_NH_ID: u16 = 30;
/// Upper bound on attributes walked per message. The kernel puts the ones read here first
/// (`fib_dump_info`, `rt6_fill_node`: table, dst, [src, iif, prefsrc, metrics], nexthop id,
/// gateway, oif, priority); 16 leaves room for the optional ones.
const MAX_ATTRS: u32 = 16;

/// Scratch [`RouteWrite`] per CPU. The attribute walk writes into map memory rather than the
/// stack so that the verifier's states at the loop head do not multiply with which fields were
/// written (Linux 6.1 hit the 1M-instruction limit with a stack-allocated write).
#[map]
static ROUTE_WATCH_NL_SCRATCH: PerCpuArray<RouteWrite> = PerCpuArray::with_max_entries(1, 0);
routewarden_common::assert_bpf_name!(ROUTE_WATCH_NL_SCRATCH, routewarden_common::route_watch::ROUTE_WATCH_NL_SCRATCH_MAP);
routewarden_common::assert_bpf_name!(route_watch_netlink, routewarden_common::route_watch::PROG_SOCKET_FILTER);

/// The last nexthop object change seen. One entry for all CPUs: object changes are made under
/// the RTNL lock and the routes they re-send follow in the same call, which may move between
/// CPUs.
#[map]
static ROUTE_WATCH_NL_NEXTHOP: Array<NexthopNotice> = Array::with_max_entries(1, 0);
routewarden_common::assert_bpf_name!(ROUTE_WATCH_NL_NEXTHOP, routewarden_common::route_watch::ROUTE_WATCH_NL_NEXTHOP_MAP);

#[socket_filter]
pub fn route_watch_netlink(ctx: SkBuffContext) -> i64 {
    let _ = try_route_watch_netlink(&ctx);
    0
}

#[inline(always)]
fn try_route_watch_netlink(ctx: &SkBuffContext) -> Result<(), i64> {
    let msg_type: u16 = ctx.load(4).map_err(|_| decode_error())?;
    match msg_type {
        RTM_NEWROUTE | RTM_DELROUTE => route_message(ctx, msg_type),
        RTM_NEWLINK => link_message(ctx),
        RTM_NEWNEXTHOP => nexthop_message(ctx),
        _ => Ok(()),
    }
}

#[inline(always)]
fn decode_error() -> i64 {
    count_decode_error();
    if allowed(LogKind::RouteNetlinkDecode, Level::Warn) {
        warn!(&(), "route watch: netlink route message not decoded");
    }
    -1
}

#[inline(always)]
fn link_message(ctx: &SkBuffContext) -> Result<(), i64> {
    let index: u32 = ctx.load(20).map_err(|_| decode_error())?;
    let flags: u32 = ctx.load(24).map_err(|_| decode_error())?;
    let change: u32 = ctx.load(28).map_err(|_| decode_error())?;
    // Only an up -> down transition of an existing link (a new link reports change = ~0).
    if change & IFF_UP != 0 && change != u32::MAX && flags & IFF_UP == 0 {
        let write = RouteWrite {
            ts_ns: now_ns(),
            table: 0,
            metric: 0,
            oif: index,
            family: 0,
            op: WriteOp::Delete as u8,
            dst_len: 0,
            _pad: 0,
            dst: [0; 16],
            gateway: [0; 16],
            nh_id: 0,
            _pad2: 0,
            writer: WriteOrigin::default(),
        };
        link_down(&write);
    }
    Ok(())
}

/// Remember who changed which nexthop object in which request.
#[inline(always)]
fn nexthop_message(ctx: &SkBuffContext) -> Result<(), i64> {
    let seq: u32 = ctx.load(8).map_err(|_| decode_error())?;
    let port: u32 = ctx.load(12).map_err(|_| decode_error())?;
    let hdr: [u16; 2] = ctx.load(24).map_err(|_| decode_error())?;
    if hdr[1] != NHA_ID || hdr[0] < 8 {
        return Err(decode_error());
    }
    let id: u32 = ctx.load(28).map_err(|_| decode_error())?;
    let Some(slot) = ROUTE_WATCH_NL_NEXTHOP.get_ptr_mut(0) else { return Err(decode_error()) };
    // SAFETY: the map's only entry; a concurrent reader sees an older or a newer notice, never
    // one this filter relies on alone (a route is dropped only on an exact match).
    unsafe { *slot = NexthopNotice { port, seq, id, valid: 1 } };
    Ok(())
}

/// True when a route notification is one the kernel re-sent for the last nexthop object
/// change: `NLM_F_REPLACE`, through that object, with that request's port and sequence number.
#[inline(always)]
fn resent_for_nexthop_change(op: WriteOp, port: u32, seq: u32, nh_id: u32) -> bool {
    if nh_id == 0 || !matches!(op, WriteOp::Replace) {
        return false;
    }
    ROUTE_WATCH_NL_NEXTHOP.get(0).is_some_and(|n| n.valid == 1 && n.id == nh_id && n.port == port && n.seq == seq)
}

#[inline(always)]
fn route_message(ctx: &SkBuffContext, msg_type: u16) -> Result<(), i64> {
    let nl_flags: u16 = ctx.load(6).map_err(|_| decode_error())?;
    let seq: u32 = ctx.load(8).map_err(|_| decode_error())?;
    let port: u32 = ctx.load(12).map_err(|_| decode_error())?;
    let rtm: [u8; 8] = ctx.load(16).map_err(|_| decode_error())?;
    let rtm_flags: u32 = ctx.load(24).map_err(|_| decode_error())?;
    if rtm_flags & RTM_F_CLONED != 0 {
        return Ok(()); // IPv6 cache / exception entries, not FIB routes.
    }
    let family = rtm[0];
    if family != AF_INET && family != AF_INET6 {
        return Ok(());
    }
    let op = if msg_type == RTM_DELROUTE {
        WriteOp::Delete
    } else if nl_flags & NLM_F_REPLACE != 0 {
        WriteOp::Replace
    } else {
        WriteOp::Add
    };
    let Some(w) = ROUTE_WATCH_NL_SCRATCH.get_ptr_mut(0) else { return Err(decode_error()) };
    // SAFETY: this CPU's slot, valid for the program's run and not shared with other CPUs.
    let w = unsafe { &mut *w };
    *w = RouteWrite {
        ts_ns: now_ns(),
        table: u32::from(rtm[4]),
        metric: 0,
        oif: 0,
        family,
        op: op as u8,
        dst_len: rtm[1],
        _pad: 0,
        dst: [0; 16],
        gateway: [0; 16],
        nh_id: 0,
        _pad2: 0,
        writer: WriteOrigin { id: port, id_kind: WriterIdKind::NetlinkPort as u8, protocol: rtm[5], class: 0, _pad: 0, comm: [0; 16] },
    };
    let len = ctx.len() as usize;
    let mut off: usize = 28;
    for _ in 0..MAX_ATTRS {
        if off + 4 > len || off > 4096 {
            break;
        }
        let Ok(hdr) = ctx.load::<[u16; 2]>(off) else { break };
        let alen = usize::from(hdr[0]);
        if alen < 4 {
            break;
        }
        let payload = off + 4;
        match hdr[1] {
            RTA_DST => load_addr(ctx, payload, family, &mut w.dst),
            RTA_GATEWAY => load_addr(ctx, payload, family, &mut w.gateway),
            RTA_OIF => w.oif = ctx.load(payload).unwrap_or(0),
            RTA_PRIORITY => w.metric = ctx.load(payload).unwrap_or(0),
            RTA_TABLE => w.table = ctx.load(payload).unwrap_or(w.table),
            RTA_NH_ID => w.nh_id = ctx.load(payload).unwrap_or(0),
            _ => {}
        }
        off += (alen + 3) & !3;
    }
    if resent_for_nexthop_change(op, port, seq, w.nh_id) {
        return Ok(());
    }
    observe(w);
    Ok(())
}

#[inline(always)]
fn load_addr(ctx: &SkBuffContext, off: usize, family: u8, out: &mut [u8; 16]) {
    if family == AF_INET6 {
        if let Ok(a) = ctx.load::<[u8; 16]>(off) {
            *out = a;
        }
    } else if let Ok(a) = ctx.load::<[u8; 4]>(off) {
        out[..4].copy_from_slice(&a);
    }
}
