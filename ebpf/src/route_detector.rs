//! The route-churn detector, run in the kernel by every route-watch hook
//! (`route_watch_netlink`, `route_watch_fentry`, `route_watch_kprobe`).
//!
//! Input: one [`RouteWrite`] per kernel route change. State: one [`PrefixState`] per
//! (family, table, prefix) in the LRU map `ROUTE_WATCH_STATE`. Output: per-CPU
//! [`RouteWatchCounters`] for every write, and a [`RouteWatchRecord`] in the ring buffer
//! `ROUTE_WATCH_EVENTS` only when a prefix crosses into conflict or flap (at most one of each
//! per prefix per window), plus one record per write when `ROUTE_WATCH_STREAM_WRITES` is set.
//!
//! Definitions (window `ROUTE_WATCH_WINDOW_NS`, default 30 s; threshold
//! `ROUTE_WATCH_FLAP_THRESHOLD`, default 3):
//! - conflict: a write by a writer different from the prefix's last writer (different route
//!   protocol, or same protocol from another process / netlink port), within the window of
//!   the last write, that overwrites (replace) or deletes the other's route;
//! - flap: the prefix changes (re-add after a writer's delete, or a replace that changes the
//!   attributes or the writer) at least threshold times within the window;
//! - flush: a route removed by the kernel itself (delete with no sender: IPv6 link down), or a
//!   plain add (no overwrite) of a prefix believed present at the same metric, which proves the
//!   route vanished without a notification (IPv4 flushes a downed link's routes silently).
//!   Flushes are counted apart and are never changes or conflicts.
//!
//! A first write of a prefix (cold start) creates its state and is neither.
use aya_ebpf::{
    helpers::{bpf_get_current_task, bpf_probe_read_kernel},
    macros::map,
    maps::{HashMap, LruHashMap, PerCpuArray, RingBuf},
};
use aya_log_ebpf::{macro_support::Level, warn};
use routewarden_common::assert_bpf_name;
use routewarden_common::route_watch::{
    family_index, FailureState, PrefixKey, PrefixState, RecordKind, RouteWatchCounters, RouteWatchRecord, RouteWrite, TaskOffsets, WriteOp, WriteOrigin,
    WriterClass, WriterIdKind, ORIGIN_CLASS_INFERRED, SELF_PORTS_MAX, STATE_CONFLICT, STATE_FLAP, STATE_FLUSHED, STATE_REMOVED,
};

use crate::bpf_log::{allowed, LogKind};
pub use crate::helpers::now_ns;
use crate::helpers::{copy_words, global_u32, global_u64, opaque_index, per_cpu_slot, zero_words};

/// Detector state per prefix. 32768 entries x ~150 bytes (key, value, LRU overhead) ≈ 5 MB.
#[map]
static ROUTE_WATCH_STATE: LruHashMap<PrefixKey, PrefixState> = LruHashMap::with_max_entries(32768, 0);

/// One [`RouteWatchCounters`] per CPU at index 0.
#[map]
static ROUTE_WATCH_COUNTERS: PerCpuArray<RouteWatchCounters> = PerCpuArray::with_max_entries(1, 0);

/// Failure history per prefix ([`FailureState`], fentry and kprobe backends). 4096 entries x
/// ~120 bytes ≈ 0.5 MB.
#[map]
static ROUTE_WATCH_FAILURES: LruHashMap<PrefixKey, FailureState> = LruHashMap::with_max_entries(4096, 0);

/// Refused writes (same writer, operation, errno) of one prefix within the window that make a
/// failing writer.
#[unsafe(no_mangle)]
static ROUTE_WATCH_FAILING_THRESHOLD: u32 = 3;

/// Records for userspace (256 KiB ≈ 2,300 records of 112 + 8 bytes).
#[map]
static ROUTE_WATCH_EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// Conflict / flap window, nanoseconds.
#[unsafe(no_mangle)]
static ROUTE_WATCH_WINDOW_NS: u64 = 30_000_000_000;
/// Changes within the window that make a flap.
#[unsafe(no_mangle)]
static ROUTE_WATCH_FLAP_THRESHOLD: u32 = 3;
/// The agent's own route protocol, 0 = none. Not part of the class any more (the process
/// decides it); kept so that loaders setting it keep loading.
#[unsafe(no_mangle)]
static ROUTE_WATCH_SELF_PROTOCOL: u32 = 0;
/// The process whose writes (at the self protocol) are `self`; 0 = none.
#[unsafe(no_mangle)]
static ROUTE_WATCH_SELF_TGID: u32 = 0;

/// Netlink port ids of the self process's route sockets (socket-filter backend), kept by
/// userspace.
#[map]
static ROUTE_WATCH_SELF_PORTS: HashMap<u32, u8> = HashMap::with_max_entries(SELF_PORTS_MAX, 0);

/// 1: push one `Write` record per write (used by `routewarden events`).
#[unsafe(no_mangle)]
static ROUTE_WATCH_STREAM_WRITES: u32 = 0;

assert_bpf_name!(ROUTE_WATCH_STATE, routewarden_common::route_watch::ROUTE_WATCH_STATE_MAP);
assert_bpf_name!(ROUTE_WATCH_COUNTERS, routewarden_common::route_watch::ROUTE_WATCH_COUNTERS_MAP);
assert_bpf_name!(ROUTE_WATCH_EVENTS, routewarden_common::route_watch::ROUTE_WATCH_EVENTS_MAP);
assert_bpf_name!(ROUTE_WATCH_SELF_PORTS, routewarden_common::route_watch::ROUTE_WATCH_SELF_PORTS_MAP);
assert_bpf_name!(ROUTE_WATCH_WINDOW_NS, routewarden_common::route_watch::GLOBAL_WINDOW_NS);
assert_bpf_name!(ROUTE_WATCH_FLAP_THRESHOLD, routewarden_common::route_watch::GLOBAL_FLAP_THRESHOLD);
assert_bpf_name!(ROUTE_WATCH_SELF_PROTOCOL, routewarden_common::route_watch::GLOBAL_SELF_PROTOCOL);
assert_bpf_name!(ROUTE_WATCH_SELF_TGID, routewarden_common::route_watch::GLOBAL_SELF_TGID);
assert_bpf_name!(ROUTE_WATCH_FAILURES, routewarden_common::route_watch::ROUTE_WATCH_FAILURES_MAP);
assert_bpf_name!(ROUTE_WATCH_FAILING_THRESHOLD, routewarden_common::route_watch::GLOBAL_FAILING_THRESHOLD);
assert_bpf_name!(ROUTE_WATCH_STREAM_WRITES, routewarden_common::route_watch::GLOBAL_STREAM_WRITES);

/// `task_struct` offsets from BTF ([`TaskOffsets`]); `valid == 0`: [`current_process`] knows
/// none.
#[unsafe(no_mangle)]
static ROUTE_WATCH_TASK_OFFSETS: TaskOffsets = TaskOffsets::UNRESOLVED;
assert_bpf_name!(ROUTE_WATCH_TASK_OFFSETS, routewarden_common::route_watch::GLOBAL_TASK_OFFSETS);

/// The process of the current task: its thread group leader's tgid and `comm` (the process's
/// name, which a thread may have changed for itself), read at the offsets of
/// `ROUTE_WATCH_TASK_OFFSETS`. `None` when they are unresolved or a read fails. Needs
/// `bpf_get_current_task` and `bpf_probe_read_kernel`: tracing programs have them, a socket
/// filter only for a loader with `CAP_PERFMON`.
#[inline(always)]
pub fn current_process() -> Option<(u32, [u8; 16])> {
    if global_u32(&ROUTE_WATCH_TASK_OFFSETS.valid) != 1 {
        return None;
    }
    let off = |v: &'static u32| u64::from(global_u32(v));
    // SAFETY: no arguments; the pointer is only read through bpf_probe_read_kernel.
    let task = unsafe { bpf_get_current_task() };
    if task == 0 {
        return None;
    }
    // SAFETY (the three reads): bpf_probe_read_kernel validates the address and fails instead
    // of faulting.
    let leader: u64 = unsafe { bpf_probe_read_kernel(task.wrapping_add(off(&ROUTE_WATCH_TASK_OFFSETS.group_leader)) as *const u64) }.ok()?;
    if leader == 0 {
        return None;
    }
    let tgid: u32 = unsafe { bpf_probe_read_kernel(leader.wrapping_add(off(&ROUTE_WATCH_TASK_OFFSETS.tgid)) as *const u32) }.ok()?;
    let comm: [u8; 16] = unsafe { bpf_probe_read_kernel(leader.wrapping_add(off(&ROUTE_WATCH_TASK_OFFSETS.comm)) as *const [u8; 16]) }.ok()?;
    Some((tgid, comm))
}

/// This CPU's counters, or `None` if the lookup fails (never for index 0 of an array).
#[inline(always)]
pub fn counters() -> Option<&'static mut RouteWatchCounters> {
    per_cpu_slot(&ROUTE_WATCH_COUNTERS, 0)
}

/// Count an undecodable notification or argument.
#[inline(always)]
pub fn count_decode_error() {
    if let Some(c) = counters() {
        c.decode_errors += 1;
    }
}

/// Count a write outside the watched network namespace.
#[inline(always)]
pub fn count_other_netns() {
    if let Some(c) = counters() {
        c.other_netns += 1;
    }
}

/// Push a record; count it as lost when the ring buffer is full.
#[inline(always)]
fn emit(kind: RecordKind, changes: u32, write: &RouteWrite, previous: &WriteOrigin) {
    if let Some(mut entry) = ROUTE_WATCH_EVENTS.reserve::<RouteWatchRecord>(0) {
        entry.write(RouteWatchRecord { kind: kind as u8, _pad: 0, errno: 0, changes, write: *write, previous: *previous });
        entry.submit(0);
    } else {
        if let Some(c) = counters() {
            c.records_lost += 1;
        }
        if allowed(LogKind::RouteRingFull, Level::Warn) {
            warn!(&(), "route watch: ring buffer full, record lost (kind {}); userspace is not keeping up", kind as u8);
        }
    }
}

/// Push a record of a refused write carrying `errno` ([`RecordKind::WriteFailed`],
/// [`RecordKind::Failing`]); count it as lost when the ring buffer is full. It logs nothing:
/// the refused-write path sits beside the detector's in every FIB program, and a second copy
/// of the log code took the IPv6 programs with logs past the verifier's 1M-instruction limit
/// on 6.1. A full ring is still logged by the next detector record, and counted either way.
#[inline(always)]
fn emit_failure(kind: RecordKind, changes: u32, errno: u16, write: &RouteWrite) {
    if let Some(mut entry) = ROUTE_WATCH_EVENTS.reserve::<RouteWatchRecord>(0) {
        entry.write(RouteWatchRecord { kind: kind as u8, _pad: 0, errno, changes, write: *write, previous: WriteOrigin::default() });
        entry.submit(0);
    } else if let Some(c) = counters() {
        c.records_lost += 1;
    }
}

/// Report a link that went administratively down (socket-filter backend).
#[inline(always)]
pub fn link_down(write: &RouteWrite) {
    emit(RecordKind::LinkDown, 0, write, &WriteOrigin::default());
}

/// Count one policy rule write (`w.op` add or delete, `w.metric` its priority) by family,
/// operation and writer class, and report it ([`RecordKind::Rule`]: every rule write, as
/// rules change rarely). The writer's class is decided as for routes.
#[inline(always)]
pub fn observe_rule(w: &mut RouteWrite) {
    let oi: usize = match WriteOp::from_u8(w.op) {
        Some(WriteOp::Add) => 0,
        Some(WriteOp::Delete) => 1,
        _ => {
            count_decode_error();
            return;
        }
    };
    let (class, inferred) = WriterClass::of_writer(&w.writer, is_self(&w.writer));
    w.writer.class = class as u8;
    w.writer.flags = if inferred { ORIGIN_CLASS_INFERRED } else { 0 };
    let fi = family_index(w.family);
    if let Some(c) = counters() {
        if let Some(slot) = c.rule_writes.get_mut(fi).and_then(|f| f.get_mut(opaque_index(oi))).and_then(|o| o.get_mut(class as usize)) {
            *slot += 1;
        }
    }
    emit(RecordKind::Rule, 0, w, &WriteOrigin::default());
}

/// A route write the kernel refused (fentry/kprobe: the hooked function returned `-errno`).
/// It changed no route, so the detector's state is left alone: counted by family, operation
/// and writer class, streamed when write streaming is on, and folded into the prefix's
/// failure run ([`FailureState`]). A run is one writer's writes of one operation failing with
/// one errno, each within the window of the run's start; the write that brings it to the
/// threshold sends a [`RecordKind::Failing`] record (at most one per prefix per window).
#[inline(always)]
pub fn observe_failure(w: &mut RouteWrite, errno: u16) {
    let Some(op) = WriteOp::from_u8(w.op) else {
        count_decode_error();
        return;
    };
    let (class, inferred) = WriterClass::of_writer(&w.writer, is_self(&w.writer));
    w.writer.class = class as u8;
    w.writer.flags = if inferred { ORIGIN_CLASS_INFERRED } else { 0 };
    let fi = family_index(w.family);
    let Some(c) = counters() else { return };
    if let Some(slot) = c.write_failures.get_mut(fi).and_then(|f| f.get_mut(opaque_index(op as usize))).and_then(|o| o.get_mut(class as usize)) {
        *slot += 1;
    }
    if global_u32(&ROUTE_WATCH_STREAM_WRITES) != 0 {
        emit_failure(RecordKind::WriteFailed, 0, errno, w);
    }
    let key = PrefixKey { table: w.table, family: w.family, dst_len: w.dst_len, _pad: [0; 2], dst: w.dst };
    let now = w.ts_ns;
    let window = global_u64(&ROUTE_WATCH_WINDOW_NS);
    let threshold = global_u32(&ROUTE_WATCH_FAILING_THRESHOLD);
    let Some(st) = ROUTE_WATCH_FAILURES.get_ptr_mut(key) else {
        let st = FailureState {
            window_start_ns: now,
            last_event_ns: 0,
            failures: 1,
            writer_id: w.writer.id,
            errno,
            op: op as u8,
            id_kind: w.writer.id_kind,
            _pad: 0,
        };
        // A failed insert (the LRU map cannot fail for want of room) starts no run; not logged,
        // as `emit_failure`.
        let _ = ROUTE_WATCH_FAILURES.insert(key, st, 0);
        // The loader keeps the threshold at 2 or more: one refusal is never an episode.
        return;
    };
    // SAFETY: pointer from the map lookup, valid for this run; a lost increment under a race
    // of two CPUs on one prefix only delays the episode by one write.
    let st = unsafe { &mut *st };
    let same_run = st.writer_id == w.writer.id && st.id_kind == w.writer.id_kind && st.errno == errno && st.op == op as u8;
    if !same_run || now.wrapping_sub(st.window_start_ns) > window {
        st.window_start_ns = now;
        st.failures = 0;
        st.writer_id = w.writer.id;
        st.id_kind = w.writer.id_kind;
        st.errno = errno;
        st.op = op as u8;
    }
    st.failures += 1;
    if st.failures >= threshold && (st.last_event_ns == 0 || now.wrapping_sub(st.last_event_ns) >= window) {
        st.last_event_ns = now;
        if let Some(slot) = c.failing.get_mut(fi).and_then(|f| f.get_mut(class as usize)) {
            *slot += 1;
        }
        emit_failure(RecordKind::Failing, st.failures, errno, w);
    }
}

/// FNV-1a over 32-bit words of the attributes that make a route different: protocol,
/// metric, and where it goes: the nexthop object's id for a route through one, its own oif
/// and gateway otherwise. A route through an object is the object's whatever its gateway and
/// device are (the socket filter sees them in compat mode, fentry/kprobe do not), so every
/// backend hashes the same attributes. Each step (xor a word, multiply by an odd number) is a
/// bijection of the state, so two routes of one shape (through an object, or not) that differ
/// in one attribute never hash alike.
#[inline(always)]
fn attrs_hash(w: &RouteWrite) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    let mut mix = |x: u32| {
        h ^= x;
        h = h.wrapping_mul(0x0100_0193);
    };
    mix(u32::from(w.writer.protocol));
    mix(w.metric);
    if w.nh_id != 0 {
        mix(w.nh_id);
        return h;
    }
    mix(w.oif);
    for c in w.gateway.chunks_exact(4) {
        mix(u32::from_ne_bytes([c[0], c[1], c[2], c[3]]));
    }
    h
}

#[inline(always)]
fn same_writer(a: &WriteOrigin, b: &WriteOrigin, op: WriteOp) -> bool {
    // A delete carries the deleted route's protocol, not the deleter's: compare the process.
    a.id == b.id && a.id_kind == b.id_kind && (matches!(op, WriteOp::Delete) || a.protocol == b.protocol)
}

/// True for a removal the kernel made on its own (no sending socket).
#[inline(always)]
fn is_kernel_removal(w: &RouteWrite) -> bool {
    w.writer.id == 0 && w.writer.id_kind == WriterIdKind::NetlinkPort as u8
}

/// Whether `writer` is the self process: its tgid (fentry, kprobe, socket filter reading the
/// current task), or one of its netlink ports (socket filter by port; the first socket a
/// process binds gets its tgid as port).
#[inline(always)]
fn is_self(writer: &WriteOrigin) -> bool {
    let tgid = global_u32(&ROUTE_WATCH_SELF_TGID);
    if tgid == 0 {
        return false;
    }
    if writer.id == tgid {
        return true;
    }
    // SAFETY: a lookup in this program's own map; the value is not kept.
    writer.id_kind == WriterIdKind::NetlinkPort as u8 && unsafe { ROUTE_WATCH_SELF_PORTS.get(writer.id) }.is_some()
}

/// Run the detector on one write. `w.ts_ns` must be set; `w.writer.class` is filled in here.
#[inline(always)]
#[expect(clippy::too_many_lines, reason = "one pass the verifier follows top to bottom: classify, compare with the last write, count, emit")]
pub fn observe(w: &mut RouteWrite) {
    let Some(op) = WriteOp::from_u8(w.op) else {
        count_decode_error();
        return;
    };
    // Who wrote decides the class; the protocol only for a sender not known as a process.
    let (class, inferred) = WriterClass::of_writer(&w.writer, is_self(&w.writer));
    w.writer.class = class as u8;
    w.writer.flags = if inferred { ORIGIN_CLASS_INFERRED } else { 0 };
    let fi = family_index(w.family);
    let Some(c) = counters() else { return };
    if inferred {
        c.unattributed[fi & 1] += 1;
    }
    // The operation's index is checked (`opaque_index`): the socket filter's decoding left 6.1's
    // verifier with the raw `op` byte (0..=255) here.
    if let Some(slot) = c.writes.get_mut(fi).and_then(|f| f.get_mut(opaque_index(op as usize))).and_then(|o| o.get_mut(class as usize)) {
        *slot += 1;
    }
    let stream = global_u32(&ROUTE_WATCH_STREAM_WRITES) != 0;
    if stream {
        emit(RecordKind::Write, 0, w, &WriteOrigin::default());
    }

    let key = PrefixKey { table: w.table, family: w.family, dst_len: w.dst_len, _pad: [0; 2], dst: w.dst };
    let now = w.ts_ns;
    let window = global_u64(&ROUTE_WATCH_WINDOW_NS);
    let threshold = global_u32(&ROUTE_WATCH_FLAP_THRESHOLD);
    let attrs = attrs_hash(w);

    let Some(st) = ROUTE_WATCH_STATE.get_ptr_mut(key) else {
        // First write of this prefix since the watch started (or since LRU eviction).
        if matches!(op, WriteOp::Delete) {
            if is_kernel_removal(w) {
                c.flushes[fi & 1] += 1;
            }
            return;
        }
        // Built field by field on zeros (`zero_words`): a struct literal's zero fields became a
        // byte-at-a-time `memset`.
        let mut st = core::mem::MaybeUninit::<PrefixState>::uninit();
        // SAFETY: zeros are a valid MaybeUninit; then every field of a zeroed PrefixState
        // (integers and byte arrays) is initialised.
        let st = unsafe {
            zero_words(&mut st);
            let p = st.as_mut_ptr();
            (*p).last_ts_ns = now;
            (*p).window_start_ns = now;
            (*p).writes = 1;
            (*p).attrs = attrs;
            (*p).metric = w.metric;
            (*p).oif = w.oif;
            (*p).last_op = op as u8;
            (*p).last_writer = w.writer;
            st.assume_init_ref()
        };
        if let Err(e) = ROUTE_WATCH_STATE.insert(key, st, 0) {
            if allowed(LogKind::RouteStateInsert, Level::Warn) {
                warn!(&(), "route watch: state map insert failed (error {}); this write starts no history", e);
            }
        }
        return;
    };
    // SAFETY: pointer from the map lookup, valid for this run. Two CPUs may update the same
    // prefix concurrently; the worst case is a lost increment of `changes`, acceptable for a
    // heuristic that needs `threshold` changes.
    let st = unsafe { &mut *st };

    if now.wrapping_sub(st.window_start_ns) > window {
        st.window_start_ns = now;
        st.changes = 0;
        st.writes = 0;
        st.flags &= !(STATE_CONFLICT | STATE_FLAP);
    }
    st.writes += 1;
    let recent = now.wrapping_sub(st.last_ts_ns) <= window;
    let same = same_writer(&st.last_writer, &w.writer, op);
    let removed = st.flags & STATE_REMOVED != 0;
    let flushed = st.flags & STATE_FLUSHED != 0;
    let mut change = false;
    let mut conflict = false;
    let mut flush = false;
    match op {
        WriteOp::Delete => {
            if is_kernel_removal(w) {
                flush = !removed;
                st.flags |= STATE_REMOVED | STATE_FLUSHED;
            } else {
                conflict = !same && !removed && recent;
                st.flags = (st.flags | STATE_REMOVED) & !STATE_FLUSHED;
            }
        }
        WriteOp::Add => {
            if removed {
                // Re-add after a writer's delete is a change; after a flush it is recovery.
                change = !flushed;
            } else if st.metric == w.metric {
                // Created while we believed it present: it vanished without a notification.
                flush = true;
            }
            st.flags &= !(STATE_REMOVED | STATE_FLUSHED);
        }
        WriteOp::Replace => {
            if removed {
                change = !flushed;
            } else {
                change = attrs != st.attrs || !same;
                conflict = !same && recent;
            }
            st.flags &= !(STATE_REMOVED | STATE_FLUSHED);
        }
    }

    let previous = st.last_writer;
    if flush {
        c.flushes[fi & 1] += 1;
        if stream {
            emit(RecordKind::Flush, st.changes, w, &previous);
        }
    }
    if change {
        st.changes += 1;
    }
    if conflict {
        st.flags |= STATE_CONFLICT;
        if st.last_conflict_event_ns == 0 || now.wrapping_sub(st.last_conflict_event_ns) >= window {
            st.last_conflict_event_ns = now;
            let pc = WriterClass::from_u8(previous.class) as usize;
            if let Some(slot) = c.conflicts.get_mut(fi).and_then(|f| f.get_mut(class as usize)).and_then(|x| x.get_mut(pc)) {
                *slot += 1;
            }
            emit(RecordKind::Conflict, st.writes, w, &previous);
        }
    }
    if change && st.changes >= threshold {
        st.flags |= STATE_FLAP;
        if st.last_flap_event_ns == 0 || now.wrapping_sub(st.last_flap_event_ns) >= window {
            st.last_flap_event_ns = now;
            c.flaps[fi & 1] += 1;
            emit(RecordKind::Flap, st.changes, w, &previous);
        }
    }

    st.last_ts_ns = now;
    st.last_op = op as u8;
    if !(matches!(op, WriteOp::Delete) && is_kernel_removal(w)) {
        // SAFETY: WriteOrigin is integers and a byte array.
        unsafe { copy_words(&mut st.last_writer, &w.writer) };
    }
    if !matches!(op, WriteOp::Delete) {
        st.attrs = attrs;
        st.metric = w.metric;
        st.oif = w.oif;
    }
}
