//! Kernel-side logging of rare events through `aya-log-ebpf`: a full map, a full
//! ring buffer, kernel struct offsets that do not match the running kernel, a packet or message
//! that cannot be parsed. Never on the per-packet or per-write hot path: every call site is an
//! error branch, and [`allowed`] lets each kind through at most once per second per CPU, so a
//! storm of the same failure costs one map lookup per event, not a log record.
//!
//! Userspace sets `AYA_LOG_LEVEL` at load (`--bpf-log-level`, default `off` = 0): with it off,
//! [`allowed`] returns after one global read and nothing is written.
use aya_ebpf::{macros::map, maps::PerCpuArray};
use aya_log_ebpf::macro_support::{level_enabled, Level};
use routewarden_common::assert_bpf_name;

use crate::helpers::{now_ns, per_cpu_slot};

/// Kinds of logged events, one rate-limit slot each.
#[derive(Clone, Copy)]
#[repr(u32)]
pub enum LogKind {
    RouteRingFull = 0,
    RouteStateInsert = 1,
    RouteOffsetsUnresolved = 2,
    RouteFibRead = 3,
    RouteNetlinkDecode = 4,
    ForwardRingFull = 5,
    ForwardBlockInsert = 6,
    ForwardUnparsable = 7,
}

const KINDS: u32 = 8;

/// Last time (ns, CLOCK_MONOTONIC) each kind was logged on this CPU.
#[map]
static BPF_LOG_RATE: PerCpuArray<u64> = PerCpuArray::with_max_entries(KINDS, 0);
assert_bpf_name!(BPF_LOG_RATE, routewarden_common::BPF_LOG_RATE_MAP);

/// Whether an event of `kind` at `level` may be logged now: the level is enabled and this CPU
/// did not log the kind within the last second (then the slot is stamped).
#[inline(always)]
pub fn allowed(kind: LogKind, level: Level) -> bool {
    if !level_enabled(level) {
        return false;
    }
    let Some(last) = per_cpu_slot(&BPF_LOG_RATE, kind as u32) else { return false };
    let now = now_ns();
    if *last != 0 && now.wrapping_sub(*last) < 1_000_000_000 {
        return false;
    }
    *last = now;
    true
}
