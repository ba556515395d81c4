//! `route_watch_netlink`: socket filter on a NETLINK_ROUTE socket joined to
//! `RTMGRP_LINK | RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_ROUTE`, the rule groups
//! (`RTNLGRP_IPV4_RULE`, `RTNLGRP_IPV6_RULE`) and `RTNLGRP_NEXTHOP`. The backend that works on
//! every kernel (this host refuses fentry and has no kprobes), and the only one that sees
//! policy rule writes.
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
//! 16 fib_rule_hdr { u8 family, dst_len, src_len, tos, table, res1, res2, action; u32 flags }
//!    (RTM_NEWRULE/RTM_DELRULE); attributes from 28: FRA_TABLE, FRA_PRIORITY, FRA_PROTOCOL
//! ```
//!
//! Rule changes (`fib_nl_newrule`/`fib_nl_delrule` → `notify_rule_change`, `net/core/
//! fib_rules.c`) are sent the same way as route changes, in the requester's `sendmsg` with
//! its port, so their writer is named the same way ([`rule_message`]).
//!
//! A nexthop replace re-sends every route through the object (compat mode) right after the
//! object's own notification, with the replacing request's port and sequence number: those
//! routes are not written, and the filter drops them ([`NexthopNotice`]).
//!
//! The sender: a route notification caused by a request carries the requesting socket's port
//! (`nlmsg_pid`) and is broadcast in the requester's own `sendmsg`, synchronously
//! (`rtnetlink_rcv_msg` → `inet_rtm_newroute` → `fib_table_insert` → `rtmsg_fib` →
//! `rtnl_notify` → `netlink_broadcast` → `sk_filter`), so the current task *is* the writer.
//! [`route_watch_netlink`] reads its process's tgid and `comm` there
//! ([`crate::route_detector::current_process`]: `bpf_get_current_task`, then
//! `bpf_probe_read_kernel`; both in the base set of every program type for a loader with
//! `CAP_PERFMON`, checked by loading on 6.1 and 6.18, while on 6.1
//! `bpf_get_current_pid_tgid`/`bpf_get_current_comm` are not, hence the task). A
//! notification with port 0 was made by the kernel itself, possibly from a workqueue or softirq
//! (IPv6 address configuration, a link's routes) where the current task is unrelated: never
//! attributed to it. [`route_watch_netlink_port`] is the same filter without the task (port
//! only), for a loader the helpers are refused to.
//!
//! `NLM_F_REPLACE` (0x100) in a RTM_NEWROUTE means the write overwrote an existing route.
//! Returns 0: the copy for this socket is dropped (nothing reads it); map and ring-buffer
//! writes stay.
use aya_ebpf::{
    helpers::bpf_skb_load_bytes,
    macros::{map, socket_filter},
    maps::{Array, PerCpuArray},
    programs::SkBuffContext,
};
use aya_log_ebpf::{macro_support::Level, warn};
use routewarden_common::route_watch::{NexthopNotice, RouteWrite, WriteOp, WriteOrigin, WriterIdKind, AF_INET, AF_INET6};

use crate::bpf_log::{allowed, LogKind};

use crate::helpers::{opaque_index, zero_words};
use crate::route_detector::{count_decode_error, current_process, link_down, now_ns, observe, observe_rule};

const RTM_NEWLINK: u16 = 16;
const RTM_NEWROUTE: u16 = 24;
const RTM_DELROUTE: u16 = 25;
const RTM_NEWNEXTHOP: u16 = 104;
const RTM_NEWRULE: u16 = 32;
const RTM_DELRULE: u16 = 33;
const FRA_PRIORITY: u16 = 6;
const FRA_TABLE: u16 = 15;
const FRA_PROTOCOL: u16 = 21;
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
/// (`fib_dump_info`, `rt6_fill_node`: table, dst, [src, iif], priority, [prefsrc, metrics],
/// then the nexthop id, or gateway and oif; see [`MSG_WORDS`]); 16 leaves room for the
/// optional ones.
const MAX_ATTRS: u32 = 16;

/// 4-byte words of a notification read, with one `bpf_skb_load_bytes`, before decoding it:
/// 1 KiB. The attributes read here come first in both families (`fib_dump_info`,
/// `rt6_fill_node`: table, dst, priority at offsets 28–63, then the next hop: its id, or its
/// gateway and oif; checked with a route dump), so only a multipath route's next hops and
/// what follows them can lie past it, and none of those is read. Netlink attributes are
/// 4-byte aligned (`NLA_ALIGNTO`), so every field is whole words. A power of two (the mask).
const MSG_WORDS: usize = 256;
/// [`MSG_WORDS`] in bytes.
const MSG_BYTES: usize = MSG_WORDS * 4;
/// Words past the last index a read starts at: an attribute header and a 16-byte address.
const MSG_SLACK_WORDS: usize = 5;

/// Per-CPU scratch of the socket filter: the [`RouteWrite`] being decoded, and the
/// notification's first [`MSG_WORDS`] words. Both in map memory: the attribute walk's writes
/// do not multiply the verifier's states at the loop head (Linux 6.1 hit the 1M-instruction
/// limit with a stack-allocated write), and one copy of the message replaces a helper call per
/// field (two per attribute), which was most of the filter's cost per notification.
#[repr(C)]
struct NlScratch {
    write: RouteWrite,
    msg: [u32; MSG_WORDS + MSG_SLACK_WORDS],
}

#[map]
static ROUTE_WATCH_NL_SCRATCH: PerCpuArray<NlScratch> = PerCpuArray::with_max_entries(1, 0);
routewarden_common::assert_bpf_name!(ROUTE_WATCH_NL_SCRATCH, routewarden_common::route_watch::ROUTE_WATCH_NL_SCRATCH_MAP);
routewarden_common::assert_bpf_name!(route_watch_netlink, routewarden_common::route_watch::PROG_SOCKET_FILTER);
routewarden_common::assert_bpf_name!(route_watch_netlink_port, routewarden_common::route_watch::PROG_SOCKET_FILTER_PORT);

/// The last nexthop object change seen. One entry for all CPUs: object changes are made under
/// the RTNL lock and the routes they re-send follow in the same call, which may move between
/// CPUs.
#[map]
static ROUTE_WATCH_NL_NEXTHOP: Array<NexthopNotice> = Array::with_max_entries(1, 0);
routewarden_common::assert_bpf_name!(ROUTE_WATCH_NL_NEXTHOP, routewarden_common::route_watch::ROUTE_WATCH_NL_NEXTHOP_MAP);

/// The filter naming a route request's sender by its process (tgid and `comm`).
#[socket_filter]
pub fn route_watch_netlink(ctx: SkBuffContext) -> i64 {
    let _ = try_route_watch_netlink::<true>(&ctx);
    0
}

/// The filter naming a route request's sender by its netlink port only.
#[socket_filter]
pub fn route_watch_netlink_port(ctx: SkBuffContext) -> i64 {
    let _ = try_route_watch_netlink::<false>(&ctx);
    0
}

/// `TASK`: read the current task for a notification with a sender (the helpers are not in
/// the other program at all, so a kernel that withholds them still verifies it).
#[inline(always)]
fn try_route_watch_netlink<const TASK: bool>(ctx: &SkBuffContext) -> Result<(), i64> {
    let Some(scratch) = ROUTE_WATCH_NL_SCRATCH.get_ptr_mut(0) else { return Err(decode_error()) };
    // SAFETY: this CPU's slot, valid for the program's run and not shared with other CPUs
    // (socket filters run with migration off).
    let scratch = unsafe { &mut *scratch };
    // The bytes to read: the whole message up to the buffer's size. The verifier must see the
    // length in 1..=MSG_BYTES: the value is hidden from the compiler (`opaque_index`), which
    // would otherwise fold the masking below away, and masked.
    let len = ctx.len() as usize;
    let read = opaque_index(if len > MSG_BYTES { MSG_BYTES } else { len });
    let read = (read.wrapping_sub(1) & (MSG_BYTES - 1)) + 1;
    // SAFETY: `read` bytes fit the buffer (MSG_BYTES); the helper writes at most that many.
    let copied = unsafe { bpf_skb_load_bytes(ctx.skb.skb.cast(), 0, scratch.msg.as_mut_ptr().cast(), u32::try_from(read).unwrap_or(1)) };
    // The words read whole: a nlmsghdr and a rtmsg at least (ifinfomsg and nhmsg are shorter
    // but every message read here has attributes past them). A message shorter than one byte
    // (`read` then 1024, past its end) fails the copy.
    let words = read / 4;
    if copied != 0 || len < 28 {
        return Err(decode_error());
    }
    let msg = &scratch.msg;
    let msg_type = (msg[1] & 0xffff) as u16;
    match msg_type {
        RTM_NEWROUTE | RTM_DELROUTE => {
            route_message::<TASK>(msg, words, msg_type, &mut scratch.write);
            Ok(())
        }
        RTM_NEWRULE | RTM_DELRULE => {
            rule_message::<TASK>(msg, words, msg_type, &mut scratch.write);
            Ok(())
        }
        RTM_NEWLINK => link_message(msg, words),
        RTM_NEWNEXTHOP => nexthop_message(msg, words),
        _ => Ok(()),
    }
}

/// Word `i` of the message buffer. The index is masked, and hidden from the compiler first
/// (`opaque_index`): knowing `i` below the words read, it drops the mask as a no-op, and Linux
/// 6.1's verifier does not carry that comparison (of two registers) over to `i`. Callers check
/// `i` against the words read.
#[inline(always)]
fn word(msg: &[u32; MSG_WORDS + MSG_SLACK_WORDS], i: usize) -> u32 {
    // SAFETY: `.. & (MSG_WORDS - 1)` < MSG_WORDS, inside the array.
    unsafe { *msg.get_unchecked(opaque_index(i) & (MSG_WORDS - 1)) }
}

/// The 4 words from word `i` (an IPv6 address), as bytes in message order.
#[inline(always)]
fn words4(msg: &[u32; MSG_WORDS + MSG_SLACK_WORDS], i: usize) -> [u8; 16] {
    let i = opaque_index(i) & (MSG_WORDS - 1);
    // SAFETY: i + 3 < MSG_WORDS + MSG_SLACK_WORDS.
    let w = unsafe { [*msg.get_unchecked(i), *msg.get_unchecked(i + 1), *msg.get_unchecked(i + 2), *msg.get_unchecked(i + 3)] };
    // SAFETY: four u32s are sixteen bytes, in memory order.
    unsafe { core::mem::transmute::<[u32; 4], [u8; 16]>(w) }
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
fn link_message(msg: &[u32; MSG_WORDS + MSG_SLACK_WORDS], words: usize) -> Result<(), i64> {
    if words < 8 {
        return Err(decode_error());
    }
    // ifinfomsg: family, pad, type (word 4), index (5), flags (6), change (7).
    let index = msg[5];
    let flags = msg[6];
    let change = msg[7];
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
fn nexthop_message(msg: &[u32; MSG_WORDS + MSG_SLACK_WORDS], words: usize) -> Result<(), i64> {
    if words < 8 {
        return Err(decode_error());
    }
    let (seq, port) = (msg[2], msg[3]);
    // nhmsg is words 4 and 5; the first attribute, NHA_ID, is word 6 (header) and 7 (id).
    let hdr = msg[6];
    if (hdr >> 16) as u16 != NHA_ID || hdr & 0xffff < 8 {
        return Err(decode_error());
    }
    let id = msg[7];
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
fn route_message<const TASK: bool>(msg: &[u32; MSG_WORDS + MSG_SLACK_WORDS], words: usize, msg_type: u16, w: &mut RouteWrite) {
    let nl_flags = (msg[1] >> 16) as u16;
    let (seq, port) = (msg[2], msg[3]);
    // rtmsg: family, dst_len, src_len, tos (word 4); table, protocol, scope, type (5); flags (6).
    let [family, dst_len, _, _] = msg[4].to_ne_bytes();
    let [table, protocol, _, _] = msg[5].to_ne_bytes();
    if msg[6] & RTM_F_CLONED != 0 {
        return; // IPv6 cache / exception entries, not FIB routes.
    }
    if family != AF_INET && family != AF_INET6 {
        return;
    }
    let op = if msg_type == RTM_DELROUTE {
        WriteOp::Delete
    } else if nl_flags & NLM_F_REPLACE != 0 {
        WriteOp::Replace
    } else {
        WriteOp::Add
    };
    // SAFETY: a RouteWrite is integers and byte arrays.
    unsafe { zero_words(w) };
    w.ts_ns = now_ns();
    w.table = u32::from(table);
    w.family = family;
    w.op = op as u8;
    w.dst_len = dst_len;
    w.writer.protocol = protocol;
    name_writer::<TASK>(w, port);
    let mut i: usize = 7;
    for _ in 0..MAX_ATTRS {
        if i >= words {
            break;
        }
        let hdr = word(msg, i);
        let len = (hdr & 0xffff) as usize;
        // The whole attribute must have been read (its length rounded up to words).
        let next = i + len.div_ceil(4);
        if len < 4 || next > words {
            break;
        }
        let p = i + 1;
        match (hdr >> 16) as u16 {
            RTA_DST => w.dst = address(msg, p, family),
            RTA_GATEWAY => w.gateway = address(msg, p, family),
            RTA_OIF => w.oif = word(msg, p),
            RTA_PRIORITY => w.metric = word(msg, p),
            RTA_TABLE => w.table = word(msg, p),
            RTA_NH_ID => w.nh_id = word(msg, p),
            _ => {}
        }
        i = next;
    }
    if resent_for_nexthop_change(op, port, seq, w.nh_id) {
        return;
    }
    observe(w);
}

/// Name the writer of a message from netlink port `port`: the port, or with `TASK` the process
/// whose request the message answers. Port 0 is the kernel's own change, maybe from a worker
/// where `current` is unrelated; left as the port when the task cannot be read (the detector
/// then infers the class and counts the write unattributed).
#[inline(always)]
fn name_writer<const TASK: bool>(w: &mut RouteWrite, port: u32) {
    w.writer.id = port;
    w.writer.id_kind = WriterIdKind::NetlinkPort as u8;
    if TASK && port != 0 {
        if let Some((tgid, comm)) = current_process() {
            w.writer.id = tgid;
            w.writer.id_kind = WriterIdKind::Process as u8;
            w.writer.comm = comm;
        }
    }
}

/// A rule change: family, op, table (`FRA_TABLE` over the header's byte), priority (into
/// `metric`), the rule's protocol and the writer, named as for routes.
#[inline(always)]
fn rule_message<const TASK: bool>(msg: &[u32; MSG_WORDS + MSG_SLACK_WORDS], words: usize, msg_type: u16, w: &mut RouteWrite) {
    let port = msg[3];
    // fib_rule_hdr: family, dst_len, src_len, tos (word 4); table, res1, res2, action (5).
    let [family, _, _, _] = msg[4].to_ne_bytes();
    let [table, _, _, _] = msg[5].to_ne_bytes();
    if family != AF_INET && family != AF_INET6 {
        return;
    }
    // SAFETY: a RouteWrite is integers and byte arrays.
    unsafe { zero_words(w) };
    w.ts_ns = now_ns();
    w.table = u32::from(table);
    w.family = family;
    w.op = if msg_type == RTM_DELRULE { WriteOp::Delete as u8 } else { WriteOp::Add as u8 };
    name_writer::<TASK>(w, port);
    let mut i: usize = 7;
    for _ in 0..MAX_ATTRS {
        if i >= words {
            break;
        }
        let hdr = word(msg, i);
        let len = (hdr & 0xffff) as usize;
        let next = i + len.div_ceil(4);
        if len < 4 || next > words {
            break;
        }
        let p = i + 1;
        match (hdr >> 16) as u16 {
            FRA_PRIORITY => w.metric = word(msg, p),
            FRA_TABLE => w.table = word(msg, p),
            FRA_PROTOCOL => w.writer.protocol = (word(msg, p) & 0xff) as u8,
            _ => {}
        }
        i = next;
    }
    observe_rule(w);
}

/// The address at word `i`: 16 bytes for IPv6, 4 then zeros for IPv4.
#[inline(always)]
fn address(msg: &[u32; MSG_WORDS + MSG_SLACK_WORDS], i: usize, family: u8) -> [u8; 16] {
    if family == AF_INET6 {
        words4(msg, i)
    } else {
        // SAFETY: four u32s are sixteen bytes, in memory order.
        unsafe { core::mem::transmute::<[u32; 4], [u8; 16]>([word(msg, i), 0, 0, 0]) }
    }
}
