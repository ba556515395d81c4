//! The kprobe backend, for kernels without BPF trampolines (fentry): the same functions,
//! prototypes and decoding as `route_watch_fentry.rs`. A kprobe at the function's entry keeps
//! the two pointer arguments the write is decoded from, per thread, in `ROUTE_WATCH_PENDING`;
//! the kretprobe at its return takes them back and decodes the write with the return value
//! (a kretprobe sees only the return value; the pointed-to structures are still live, as for
//! fexit). Arguments come from registers (x86-64 SysV: rdi, rsi, rdx, rcx; arm64: x0-x3), the
//! layout aya-ebpf picks by `bpf_target_arch`, which `cargo xtask` sets per agent architecture
//! (`AYA_BPF_TARGET_ARCH`: one object per architecture). This host has no kprobes
//! (`CONFIG_KPROBES` unset); exercised in the QEMU lane.
//!
//! Prototypes written against (checked against BTF at load):
//! ```c
//! int fib_table_insert(struct net *net, struct fib_table *tb, struct fib_config *cfg, struct netlink_ext_ack *extack);
//! int fib_table_delete(struct net *net, struct fib_table *tb, struct fib_config *cfg, struct netlink_ext_ack *extack);
//! int fib6_add(struct fib6_node *root, struct fib6_info *rt, struct nl_info *info, struct netlink_ext_ack *extack);
//! int fib6_del(struct fib6_info *rt, struct nl_info *info);
//! ```
use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{kprobe, kretprobe, map},
    maps::LruHashMap,
    programs::{ProbeContext, RetProbeContext},
};
use routewarden_common::route_watch::PendingCall;

use crate::route_detector::count_decode_error;
use crate::route_watch_fib::{fib4, fib6};

/// The thread's call in flight: the route functions run under RTNL, one per thread at a time;
/// LRU so that a kretprobe the kernel missed (`maxactive` exhausted) leaves nothing behind.
#[map]
static ROUTE_WATCH_PENDING: LruHashMap<u64, PendingCall> = LruHashMap::with_max_entries(1024, 0);
routewarden_common::assert_bpf_name!(ROUTE_WATCH_PENDING, routewarden_common::route_watch::ROUTE_WATCH_PENDING_MAP);

#[inline(always)]
fn arg(ctx: &ProbeContext, n: usize) -> u64 {
    ctx.arg::<u64>(n).unwrap_or(0)
}

/// Keep arguments `a` and `b` of this thread's call for its kretprobe.
#[inline(always)]
fn keep(ctx: &ProbeContext, a: usize, b: usize) -> u32 {
    let call = PendingCall { a: arg(ctx, a), b: arg(ctx, b) };
    if ROUTE_WATCH_PENDING.insert(bpf_get_current_pid_tgid(), call, 0).is_err() {
        count_decode_error();
    }
    0
}

/// This thread's kept arguments and the function's `int` return value.
#[inline(always)]
fn take(ctx: &RetProbeContext) -> Option<(PendingCall, i32)> {
    let tid = bpf_get_current_pid_tgid();
    // SAFETY: a lookup in this program's own map; the value is copied out before the delete.
    let call = unsafe { ROUTE_WATCH_PENDING.get(tid) }.copied();
    let _ = ROUTE_WATCH_PENDING.remove(tid);
    let raw: u64 = ctx.ret();
    #[expect(clippy::cast_possible_truncation, clippy::cast_possible_wrap, reason = "the function returns a C int in the register's low 32 bits")]
    let ret = raw as u32 as i32;
    call.map(|c| (c, ret))
}

#[kprobe]
pub fn route_watch_kprobe_fib_table_insert(ctx: ProbeContext) -> u32 {
    keep(&ctx, 0, 2)
}

#[kprobe]
pub fn route_watch_kprobe_fib_table_delete(ctx: ProbeContext) -> u32 {
    keep(&ctx, 0, 2)
}

#[kprobe]
pub fn route_watch_kprobe_fib6_add(ctx: ProbeContext) -> u32 {
    keep(&ctx, 1, 2)
}

#[kprobe]
pub fn route_watch_kprobe_fib6_del(ctx: ProbeContext) -> u32 {
    keep(&ctx, 0, 1)
}

#[kretprobe]
pub fn route_watch_kretprobe_fib_table_insert(ctx: RetProbeContext) -> u32 {
    if let Some((c, ret)) = take(&ctx) {
        fib4(c.a, c.b, false, ret);
    }
    0
}

#[kretprobe]
pub fn route_watch_kretprobe_fib_table_delete(ctx: RetProbeContext) -> u32 {
    if let Some((c, ret)) = take(&ctx) {
        fib4(c.a, c.b, true, ret);
    }
    0
}

#[kretprobe]
pub fn route_watch_kretprobe_fib6_add(ctx: RetProbeContext) -> u32 {
    if let Some((c, ret)) = take(&ctx) {
        fib6(c.a, c.b, false, ret);
    }
    0
}

#[kretprobe]
pub fn route_watch_kretprobe_fib6_del(ctx: RetProbeContext) -> u32 {
    if let Some((c, ret)) = take(&ctx) {
        fib6(c.a, c.b, true, ret);
    }
    0
}
