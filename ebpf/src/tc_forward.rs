//! The TC forwarding watch: which path cluster traffic really takes, and when a
//! destination block's path flips.
//!
//! Two classifiers, attached to egress (TCX where the kernel has it, clsact otherwise):
//! - `tc_forward_tunnel` on tunnel devices (`tunl0`): every packet took the tunnel;
//! - `tc_forward_host` on host NICs (`eth0`): an IPv4 packet with protocol 4 (IPIP) took the
//!   tunnel and is attributed to its inner destination; anything else took the host path.
//!
//! Context: `struct __sk_buff` of a `BPF_PROG_TYPE_SCHED_CLS` program at egress
//! (`sch_handle_egress` / `tcx_run`, net/core/dev.c). An IPv4 header is read by direct packet
//! access when its place is confirmed from the packet ([`direct_ipv4`]); otherwise, and for
//! IPv6, headers are read with
//! `long bpf_skb_load_bytes_relative(const void *skb, u32 offset, void *to, u32 len,
//! u32 start_header)` from `BPF_HDR_START_NET` (include/uapi/linux/bpf.h): the network
//! header is set on egress, so the same code reads a real `tunl0` (no L2 header, ARPHRD_TUNNEL),
//! a veth stand-in and an Ethernet NIC, and after `iptunnel_xmit` on the NIC it points at the
//! outer header.
//!
//! Contract with the rest of the hook: the programs never drop, redirect or modify a packet
//! and always return `TC_ACT_UNSPEC` (-1), which is `TCX_NEXT` for TCX and "continue with the
//! next filter" for clsact, so Calico's and Cilium's programs on the same hook still run.
//!
//! Lookup: the destination is first tested against the pool ranges of the live
//! [`PoolFilter`] (a few disjoint prefixes covering every cluster destination); a
//! non-cluster destination exits there, after one header load and a few compares. Inside a
//! range, one hash lookup per prefix length of the destinations there, longest first (borrowed
//! /32s before the pool's block size): the first hit is the longest match, as an LPM trie would
//! give. Types and the data flow: `routewarden_common::forward`.
use aya_ebpf::{
    bindings::{bpf_hdr_start_off::BPF_HDR_START_NET, TC_ACT_UNSPEC},
    helpers::bpf_skb_load_bytes_relative,
    macros::{classifier, map},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
    programs::TcContext,
};
use aya_log_ebpf::{macro_support::Level, warn};
use routewarden_common::forward::{
    counter_index, BlockKey, BlockState, ForwardCounters, ForwardRecord, ForwardRecordKind, ForwardStats, ForwardTarget, Observation, PoolFilter, TargetKeyV4,
    TargetKeyV6, COUNTER_SLOTS, LAST_PATH_UNKNOWN, MAX_POOLS, POOL_RANGES_V4, POOL_RANGES_V6, RANGE_LENGTHS,
};
use routewarden_common::{assert_bpf_name, forward};

use crate::bpf_log::{allowed, LogKind};
use crate::helpers::{global_u32, global_u64, now_ns, per_cpu_slot};

/// `BPF_F_NO_PREALLOC` (include/uapi/linux/bpf.h): hash map memory is allocated per entry.
const BPF_F_NO_PREALLOC: u32 = 1;

/// The pool filter, two slots: [`FORWARD_POOLS_ACTIVE`] names the live one; userspace writes
/// the other, then flips.
#[map]
static FORWARD_POOLS: Array<PoolFilter> = Array::with_max_entries(2, 0);

/// Index 0: the live slot of [`FORWARD_POOLS`] (0 or 1).
#[map]
static FORWARD_POOLS_ACTIVE: Array<u32> = Array::with_max_entries(1, 0);

/// IPv4 cluster destinations (IPAM blocks and borrowed IPs) by (prefix length, masked
/// address). Filled and diffed by the agent. 65536 entries is a 5,000-node cluster with ten
/// blocks per node and 15,000 borrowed IPs; memory is allocated per entry.
#[map]
static FORWARD_TARGETS_V4: HashMap<TargetKeyV4, ForwardTarget> = HashMap::with_max_entries(65536, BPF_F_NO_PREALLOC);

/// IPv6 cluster destinations, as [`FORWARD_TARGETS_V4`].
#[map]
static FORWARD_TARGETS_V6: HashMap<TargetKeyV6, ForwardTarget> = HashMap::with_max_entries(65536, BPF_F_NO_PREALLOC);

/// Packets and bytes per (pool, expected path, observation); see `counter_index`.
#[map]
#[expect(clippy::cast_possible_truncation, reason = "COUNTER_SLOTS is 2304")]
static FORWARD_COUNTERS: PerCpuArray<ForwardCounters> = PerCpuArray::with_max_entries(COUNTER_SLOTS as u32, 0);

/// Forwarding flaps per pool id.
#[map]
#[expect(clippy::cast_possible_truncation, reason = "MAX_POOLS is 256")]
static FORWARD_FLAPS: PerCpuArray<u64> = PerCpuArray::with_max_entries(MAX_POOLS as u32, 0);

/// Global statistics at index 0.
#[map]
static FORWARD_STATS: PerCpuArray<ForwardStats> = PerCpuArray::with_max_entries(1, 0);

/// Last egress path per destination block (16384 blocks with traffic x ~100 bytes ≈ 1.6 MB).
#[map]
static FORWARD_BLOCKS: LruHashMap<BlockKey, BlockState> = LruHashMap::with_max_entries(16384, 0);

/// Wrong-path samples and flaps (64 KiB = 910 records of 64 + 8 bytes).
#[map]
static FORWARD_EVENTS: RingBuf = RingBuf::with_byte_size(64 * 1024, 0);

/// Path changes of one block within the window that make a forwarding flap.
#[unsafe(no_mangle)]
static FORWARD_FLAP_THRESHOLD: u32 = 3;
/// Flap window, nanoseconds.
#[unsafe(no_mangle)]
static FORWARD_WINDOW_NS: u64 = 30_000_000_000;
/// Minimum interval between two wrong-path samples of one block, nanoseconds.
#[unsafe(no_mangle)]
static FORWARD_SAMPLE_INTERVAL_NS: u64 = 1_000_000_000;

assert_bpf_name!(FORWARD_POOLS, forward::FORWARD_POOLS_MAP);
assert_bpf_name!(FORWARD_POOLS_ACTIVE, forward::FORWARD_POOLS_ACTIVE_MAP);
assert_bpf_name!(FORWARD_TARGETS_V4, forward::FORWARD_TARGETS_V4_MAP);
assert_bpf_name!(FORWARD_TARGETS_V6, forward::FORWARD_TARGETS_V6_MAP);
assert_bpf_name!(FORWARD_COUNTERS, forward::FORWARD_COUNTERS_MAP);
assert_bpf_name!(FORWARD_FLAPS, forward::FORWARD_FLAPS_MAP);
assert_bpf_name!(FORWARD_STATS, forward::FORWARD_STATS_MAP);
assert_bpf_name!(FORWARD_BLOCKS, forward::FORWARD_BLOCKS_MAP);
assert_bpf_name!(FORWARD_EVENTS, forward::FORWARD_EVENTS_MAP);
assert_bpf_name!(FORWARD_FLAP_THRESHOLD, forward::GLOBAL_FLAP_THRESHOLD);
assert_bpf_name!(FORWARD_WINDOW_NS, forward::GLOBAL_WINDOW_NS);
assert_bpf_name!(FORWARD_SAMPLE_INTERVAL_NS, forward::GLOBAL_SAMPLE_INTERVAL_NS);
assert_bpf_name!(tc_forward_tunnel, forward::PROG_TC_FORWARD_TUNNEL);
assert_bpf_name!(tc_forward_host, forward::PROG_TC_FORWARD_HOST);

/// `ETH_P_IP` / `ETH_P_IPV6` (include/uapi/linux/if_ether.h), host order.
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86DD;
/// `IPPROTO_IPIP` (include/uapi/linux/in.h).
const IPPROTO_IPIP: u8 = 4;

#[classifier]
// Inlined into the entry point the macro generates: otherwise each packet pays a BPF-to-BPF
// call once the body grows past LLVM's inlining threshold.
#[inline(always)]
pub fn tc_forward_tunnel(ctx: TcContext) -> i32 {
    watch(&ctx, false);
    TC_ACT_UNSPEC
}

#[classifier]
#[inline(always)]
pub fn tc_forward_host(ctx: TcContext) -> i32 {
    watch(&ctx, true);
    TC_ACT_UNSPEC
}

#[inline(always)]
fn stats() -> Option<&'static mut ForwardStats> {
    per_cpu_slot(&FORWARD_STATS, 0)
}

/// Copy `N` bytes from `offset` past the network header; `None` if the packet is shorter.
#[inline(always)]
fn load_net<const N: usize>(ctx: &TcContext, offset: u32) -> Option<[u8; N]> {
    let mut buf = [0u8; N];
    #[expect(clippy::cast_possible_truncation, reason = "N is 20 or 40")]
    // SAFETY: `buf` is N writable bytes on the stack; the helper checks `offset + N` against
    // the packet and fails without writing past `buf`.
    let rc = unsafe { bpf_skb_load_bytes_relative(ctx.skb.skb.cast(), offset, buf.as_mut_ptr().cast(), N as u32, BPF_HDR_START_NET) };
    if rc == 0 {
        Some(buf)
    } else {
        None
    }
}

/// IPv4 address bytes in the IPv4-mapped IPv6 form of [`ForwardTarget`] and the records.
#[inline(always)]
fn mapped(a: u8, b: u8, c: u8, d: u8) -> [u8; 16] {
    [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a, b, c, d]
}

#[inline(always)]
fn watch(ctx: &TcContext, host_nic: bool) {
    // `skb->protocol` is a __be16 held in a u32.
    #[expect(clippy::cast_possible_truncation, reason = "the field holds a 16-bit value")]
    let proto = u16::from_be(ctx.skb.protocol() as u16);
    if proto == ETH_P_IP {
        if let Some(ip) = direct_ipv4(ctx) {
            watch_v4_direct(ctx, ip, host_nic);
            return;
        }
        let Some(h) = load_net::<20>(ctx, 0) else {
            unparsable(ctx, 4);
            return;
        };
        if h[0] >> 4 != 4 {
            return;
        }
        if host_nic && h[9] == IPPROTO_IPIP {
            // Outer header of IPIP: only a first fragment carries the inner header.
            if (u16::from(h[6] & 0x1f) << 8 | u16::from(h[7])) != 0 {
                return;
            }
            let ihl = u32::from(h[0] & 0x0f) * 4;
            if ihl < 20 {
                return;
            }
            let Some(inner) = load_net::<20>(ctx, ihl) else {
                unparsable(ctx, 44);
                return;
            };
            if inner[0] >> 4 != 4 {
                return;
            }
            lookup_and_account_v4(ctx, [inner[16], inner[17], inner[18], inner[19]], Observation::HostIpip);
        } else {
            let obs = if host_nic { Observation::HostNative } else { Observation::TunnelDevice };
            lookup_and_account_v4(ctx, [h[16], h[17], h[18], h[19]], obs);
        }
    } else if proto == ETH_P_IPV6 {
        if let Some(ip) = direct_ipv6(ctx) {
            let mut dst = [0u8; 16];
            for (i, b) in dst.iter_mut().enumerate() {
                *b = byte(ip, 24 + i);
            }
            let obs = if host_nic { Observation::HostNative } else { Observation::TunnelDevice };
            lookup_and_account(ctx, dst, obs);
            return;
        }
        let Some(h) = load_net::<40>(ctx, 0) else {
            unparsable(ctx, 6);
            return;
        };
        let mut dst = [0u8; 16];
        dst.copy_from_slice(&h[24..40]);
        let obs = if host_nic { Observation::HostNative } else { Observation::TunnelDevice };
        lookup_and_account(ctx, dst, obs);
    }
}

/// Ethernet header length (include/uapi/linux/if_ether.h `ETH_HLEN`).
const ETH_HLEN: usize = 14;
/// [`ETH_HLEN`] in `skb->len`'s type.
#[expect(clippy::cast_possible_truncation, reason = "14")]
const ETH_HLEN_U32: u32 = ETH_HLEN as u32;
/// An IPv4 header without options, version 4 and IHL 5.
const IPV4_VIHL: u8 = 0x45;

/// Byte `i` of the packet at address `p` (a packet pointer the caller bounds-checked).
#[inline(always)]
fn byte(p: usize, i: usize) -> u8 {
    // SAFETY: the caller checked `p + i < data_end`; the verifier checks it again.
    unsafe { *((p + i) as *const u8) }
}

/// Direct packet access (no helper call): the address of an IPv4 header of 20 bytes, no
/// options, that lies in the linear data with its 20 bytes checked against `data_end`, or
/// `None` when the layout cannot be confirmed (the caller then reads the header through
/// `bpf_skb_load_bytes_relative` from the network header, as before).
///
/// At TC egress `skb->data` is the start of the device's link-layer header, whose length
/// `__sk_buff` does not give: 14 on an Ethernet NIC or a veth stand-in, 0 on a real `tunl0`.
/// Both are confirmed from the packet rather than assumed per program:
/// - Ethernet: the EtherType at 12 is `ETH_P_IP`, the byte at 14 is 0x45 and the IPv4 total
///   length equals `skb->len - 14` (nothing pads an egress frame before the driver);
/// - no link-layer header: the byte at 0 is 0x45 and the total length equals `skb->len`. An
///   Ethernet frame cannot pass this: 0x45 as the first destination MAC byte is a group
///   address, never an IPv4 unicast frame's.
///
/// A GSO packet above 64 KiB (total length 0), IP options or headers outside the linear data
/// take the helper path.
#[inline(always)]
fn direct_ipv4(ctx: &TcContext) -> Option<usize> {
    let data = ctx.data();
    if data + ETH_HLEN + 20 > ctx.data_end() {
        return None;
    }
    let len = ctx.len();
    if byte(data, 12) == 0x08 && byte(data, 13) == 0x00 && byte(data, ETH_HLEN) == IPV4_VIHL {
        let total = u32::from(byte(data, ETH_HLEN + 2)) << 8 | u32::from(byte(data, ETH_HLEN + 3));
        if total + ETH_HLEN_U32 == len {
            return Some(data + ETH_HLEN);
        }
    } else if byte(data, 0) == IPV4_VIHL {
        let total = u32::from(byte(data, 2)) << 8 | u32::from(byte(data, 3));
        if total == len {
            return Some(data);
        }
    }
    None
}

/// Direct packet access for IPv6, as [`direct_ipv4`] for IPv4: the address of an IPv6 header
/// (40 bytes) behind an Ethernet header, in the linear data and checked against `data_end`,
/// or `None` (the caller then reads it through `bpf_skb_load_bytes_relative`). Confirmed from
/// the packet: the EtherType at 12 is `ETH_P_IPV6`, the version at 14 is 6 and the payload
/// length plus the two headers equals `skb->len`. Only the Ethernet layout: a packet without
/// a link-layer header cannot be told from an Ethernet frame by its first byte here (`0x6_`
/// is a unicast MAC's first byte when even), and no device routewarden watches carries IPv6
/// without one (`tunl0` is IPv4 in IPv4); those take the helper path. A jumbogram (payload
/// length 0) takes it too.
#[inline(always)]
fn direct_ipv6(ctx: &TcContext) -> Option<usize> {
    let data = ctx.data();
    if data + ETH_HLEN + 40 > ctx.data_end() {
        return None;
    }
    if byte(data, 12) == 0x86 && byte(data, 13) == 0xdd && byte(data, ETH_HLEN) >> 4 == 6 {
        let payload = u32::from(byte(data, ETH_HLEN + 4)) << 8 | u32::from(byte(data, ETH_HLEN + 5));
        if payload + 40 + ETH_HLEN_U32 == ctx.len() {
            return Some(data + ETH_HLEN);
        }
    }
    None
}

/// [`watch`] for an IPv4 header at `ip` (20 bytes, bounds-checked, IHL 5) from
/// [`direct_ipv4`]: the same decisions as the helper path.
#[inline(always)]
fn watch_v4_direct(ctx: &TcContext, ip: usize, host_nic: bool) {
    if host_nic && byte(ip, 9) == IPPROTO_IPIP {
        // Outer header of IPIP: only a first fragment carries the inner header.
        if byte(ip, 6) & 0x1f != 0 || byte(ip, 7) != 0 {
            return;
        }
        let inner = if ip + 40 <= ctx.data_end() {
            if byte(ip, 20) >> 4 != 4 {
                return;
            }
            [byte(ip, 36), byte(ip, 37), byte(ip, 38), byte(ip, 39)]
        } else {
            let Some(inner) = load_net::<20>(ctx, 20) else {
                unparsable(ctx, 44);
                return;
            };
            if inner[0] >> 4 != 4 {
                return;
            }
            [inner[16], inner[17], inner[18], inner[19]]
        };
        lookup_and_account_v4(ctx, inner, Observation::HostIpip);
    } else {
        let obs = if host_nic { Observation::HostNative } else { Observation::TunnelDevice };
        lookup_and_account_v4(ctx, [byte(ip, 16), byte(ip, 17), byte(ip, 18), byte(ip, 19)], obs);
    }
}

/// A packet whose headers cannot be read (IPv4 `4`, IPv6 `6`, IPIP's inner header `44`).
#[inline(always)]
fn unparsable(ctx: &TcContext, what: u32) {
    if allowed(LogKind::ForwardUnparsable, Level::Warn) {
        warn!(ctx, "forwarding watch: packet not parsed (header {}, {} bytes)", what, ctx.len());
    }
}

/// The live pool filter.
#[inline(always)]
fn pool_filter() -> Option<&'static PoolFilter> {
    let active = FORWARD_POOLS_ACTIVE.get(0).copied().unwrap_or(0);
    FORWARD_POOLS.get(active & 1)
}

/// The destination `dst` (bytes in packet order) matches, writable (the program keeps
/// `last_path` in it; racy one-byte writes from several CPUs are benign, the slow path
/// reconciles). `None` for a non-cluster destination.
#[inline(always)]
fn target_v4(dst: [u8; 4]) -> Option<&'static mut ForwardTarget> {
    let filter = pool_filter()?;
    let addr = u32::from_ne_bytes(dst);
    for i in 0..POOL_RANGES_V4 {
        #[expect(clippy::cast_possible_truncation, reason = "i < POOL_RANGES_V4 = 8")]
        if i as u32 >= filter.v4_ranges {
            return None;
        }
        let range = &filter.v4[i];
        if addr & range.mask != range.net {
            continue;
        }
        // The ranges are disjoint: this one decides.
        for j in 0..RANGE_LENGTHS {
            #[expect(clippy::cast_possible_truncation, reason = "j < RANGE_LENGTHS = 4")]
            if j as u32 >= range.lengths {
                return None;
            }
            let key = TargetKeyV4 { prefix_len: range.prefix_lens[j], addr: addr & range.masks[j] };
            if let Some(t) = FORWARD_TARGETS_V4.get_ptr_mut(key) {
                // SAFETY: a value of the map, a `ForwardTarget`, valid for this run (RCU).
                return Some(unsafe { &mut *t });
            }
        }
        return None;
    }
    None
}

/// As [`target_v4`] for IPv6.
#[inline(always)]
fn target_v6(dst: &[u8; 16]) -> Option<&'static mut ForwardTarget> {
    let filter = pool_filter()?;
    let mut hi = [0u8; 8];
    let mut lo = [0u8; 8];
    hi.copy_from_slice(&dst[..8]);
    lo.copy_from_slice(&dst[8..]);
    let addr = [u64::from_ne_bytes(hi), u64::from_ne_bytes(lo)];
    for i in 0..POOL_RANGES_V6 {
        #[expect(clippy::cast_possible_truncation, reason = "i < POOL_RANGES_V6 = 4")]
        if i as u32 >= filter.v6_ranges {
            return None;
        }
        let range = &filter.v6[i];
        if addr[0] & range.mask[0] != range.net[0] || addr[1] & range.mask[1] != range.net[1] {
            continue;
        }
        for j in 0..RANGE_LENGTHS {
            #[expect(clippy::cast_possible_truncation, reason = "j < RANGE_LENGTHS = 4")]
            if j as u32 >= range.lengths {
                return None;
            }
            let m = range.masks[j];
            let key = TargetKeyV6 { prefix_len: range.prefix_lens[j], _pad: 0, addr: [addr[0] & m[0], addr[1] & m[1]] };
            if let Some(t) = FORWARD_TARGETS_V6.get_ptr_mut(key) {
                // SAFETY: as in `target_v4`.
                return Some(unsafe { &mut *t });
            }
        }
        return None;
    }
    None
}

#[inline(always)]
fn lookup_and_account(ctx: &TcContext, dst: [u8; 16], obs: Observation) {
    if let Some(target) = target_v6(&dst) {
        account(ctx, target, &dst, obs);
    }
}

#[inline(always)]
fn lookup_and_account_v4(ctx: &TcContext, dst: [u8; 4], obs: Observation) {
    if let Some(target) = target_v4(dst) {
        account(ctx, target, &mapped(dst[0], dst[1], dst[2], dst[3]), obs);
    }
}

#[inline(always)]
fn account(ctx: &TcContext, target: &mut ForwardTarget, dst: &[u8; 16], obs: Observation) {
    let actual = obs.path() as u8;
    match counter_index(target.pool, target.expected, obs as u8) {
        Some(i) => {
            if let Some(c) = FORWARD_COUNTERS.get_ptr_mut(i) {
                // SAFETY: this CPU's slot of an array element that exists (i < COUNTER_SLOTS).
                unsafe {
                    (*c).packets += 1;
                    (*c).bytes += u64::from(ctx.len());
                }
            }
        }
        None => {
            if let Some(s) = stats() {
                s.pool_out_of_range += 1;
            }
        }
    }
    let wrong = target.expected != actual;
    // Fast path: the expected path again, as the last packet to this destination took it. The
    // block's state would not change, so it is not looked up (about a quarter of the
    // program's cost, `cargo xtask bench tc-overhead`).
    if !wrong && target.last_path == actual {
        return;
    }
    let seen = target.last_path;
    target.last_path = actual;
    let key = BlockKey { prefix_len: target.prefix_len, block: target.block };
    let state = match FORWARD_BLOCKS.get_ptr_mut(key) {
        Some(state) => state,
        // The block's state is gone (LRU: the fast path does not refresh it) but the entry
        // remembers another path: start from that one, so this change counts.
        None if seen != LAST_PATH_UNKNOWN && seen != actual => {
            let known = BlockState { last_path: seen, _pad: [0; 3], changes: 0, window_start_ns: 0, last_sample_ns: 0 };
            block_insert(&key, &known);
            let Some(state) = FORWARD_BLOCKS.get_ptr_mut(key) else { return };
            state
        }
        None => {
            // First packet of this block: remember its path; a first packet is never a change.
            let now = if wrong { now_ns() } else { 0 };
            let fresh = BlockState { last_path: actual, _pad: [0; 3], changes: 0, window_start_ns: 0, last_sample_ns: now };
            block_insert(&key, &fresh);
            if wrong {
                emit(ctx, ForwardRecordKind::WrongPath, target, dst, obs, actual, 0, now);
            }
            return;
        }
    };
    // SAFETY: value pointer from the lookup, valid for this run (RCU); racy by design (see
    // `BlockState`).
    let state = unsafe { &mut *state };
    let mut now = 0;
    if wrong {
        now = now_ns();
        if state.last_sample_ns == 0 || now.wrapping_sub(state.last_sample_ns) >= global_u64(&FORWARD_SAMPLE_INTERVAL_NS) {
            state.last_sample_ns = now;
            emit(ctx, ForwardRecordKind::WrongPath, target, dst, obs, actual, 0, now);
        } else if let Some(s) = stats() {
            s.samples_suppressed += 1;
        }
    }
    if state.last_path != actual {
        if now == 0 {
            now = now_ns();
        }
        let previous = state.last_path;
        state.last_path = actual;
        if state.changes == 0 || now.wrapping_sub(state.window_start_ns) > global_u64(&FORWARD_WINDOW_NS) {
            state.window_start_ns = now;
            state.changes = 1;
        } else {
            state.changes = state.changes.saturating_add(1);
        }
        // Equality: one flap per block per window however long the flipping goes on.
        if state.changes == global_u32(&FORWARD_FLAP_THRESHOLD) {
            if let Some(f) = FORWARD_FLAPS.get_ptr_mut(u32::from(target.pool)) {
                // SAFETY: this CPU's slot.
                unsafe { *f += 1 };
            }
            emit(ctx, ForwardRecordKind::Flap, target, dst, obs, previous, state.changes, now);
        }
    }
}

/// Insert a block's state; a failure is logged (the LRU map evicts rather than fills, so this
/// is an allocation failure).
#[inline(always)]
fn block_insert(key: &BlockKey, state: &BlockState) {
    if let Err(e) = FORWARD_BLOCKS.insert(key, state, 0) {
        if allowed(LogKind::ForwardBlockInsert, Level::Warn) {
            warn!(&(), "forwarding watch: block state insert failed (error {})", e);
        }
    }
}

#[inline(always)]
#[expect(clippy::too_many_arguments, reason = "one record's fields; inlined")]
fn emit(ctx: &TcContext, kind: ForwardRecordKind, target: &ForwardTarget, dst: &[u8; 16], obs: Observation, previous: u8, changes: u32, now: u64) {
    let Some(mut entry) = FORWARD_EVENTS.reserve::<ForwardRecord>(0) else {
        if let Some(s) = stats() {
            s.events_lost += 1;
        }
        if allowed(LogKind::ForwardRingFull, Level::Warn) {
            warn!(ctx, "forwarding watch: ring buffer full, record lost; userspace is not keeping up");
        }
        return;
    };
    // SAFETY: reading `ifindex` of the context struct (always readable for TC programs).
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    entry.write(ForwardRecord {
        kind: kind as u8,
        expected: target.expected,
        actual: obs.path() as u8,
        observation: obs as u8,
        pool: target.pool,
        class: target.class,
        previous,
        changes,
        ifindex,
        ts_ns: now,
        block: target.block,
        dst: *dst,
        prefix_len: target.prefix_len,
        _pad: 0,
    });
    entry.submit(0);
    if kind == ForwardRecordKind::WrongPath {
        if let Some(s) = stats() {
            s.samples += 1;
        }
    }
}
