//! The fentry backend: BPF trampolines on the kernel's FIB insert/delete functions (the
//! cheapest backend: typed arguments; the writer is the current task). Attached at the
//! functions' exit (fexit), which has their arguments and their return value: a write the
//! kernel refused (`-EEXIST` for a create-exclusive of a present route, `-ESRCH` for a delete
//! of an absent one) changed nothing and goes to the failure runs, not to the detector
//! (`route_detector::observe_failure`). Refused with EPERM on this host's kernel; exercised
//! in the QEMU lane (Debian 6.1).
//!
//! Prototypes written against (Linux 6.1 .. 6.18; checked against BTF at load by
//! `agent/src/bpf/route_watch/btf.rs`):
//! ```c
//! int fib_table_insert(struct net *net, struct fib_table *tb, struct fib_config *cfg, struct netlink_ext_ack *extack);
//! int fib_table_delete(struct net *net, struct fib_table *tb, struct fib_config *cfg, struct netlink_ext_ack *extack);
//! int fib6_add(struct fib6_node *root, struct fib6_info *rt, struct nl_info *info, struct netlink_ext_ack *extack);
//! int fib6_del(struct fib6_info *rt, struct nl_info *info);
//! ```
//! An fexit program's context is the arguments followed by the return value (`ctx[nargs]`),
//! which reads on every kernel with trampolines (`bpf_get_func_ret` needs 5.17). The
//! arguments are still live at exit: `cfg` is the caller's, and `rt` is held by the caller
//! across `fib6_add`/`fib6_del` (`ip6_route_add`, `__ip6_del_rt`).
use aya_ebpf::{macros::fexit, programs::FExitContext};

use crate::route_watch_fib::{fib4, fib6};

/// The hooked function's `int` return value, the slot after its `nargs` arguments.
#[inline(always)]
fn ret(ctx: &FExitContext, nargs: usize) -> i32 {
    let raw: u64 = ctx.arg(nargs);
    #[expect(clippy::cast_possible_truncation, clippy::cast_possible_wrap, reason = "the function returns a C int in the slot's low 32 bits")]
    let v = raw as u32 as i32;
    v
}

#[fexit(function = "fib_table_insert")]
pub fn route_watch_fexit_fib_table_insert(ctx: FExitContext) -> i32 {
    fib4(ctx.arg(0), ctx.arg(2), false, ret(&ctx, 4));
    0
}

#[fexit(function = "fib_table_delete")]
pub fn route_watch_fexit_fib_table_delete(ctx: FExitContext) -> i32 {
    fib4(ctx.arg(0), ctx.arg(2), true, ret(&ctx, 4));
    0
}

#[fexit(function = "fib6_add")]
pub fn route_watch_fexit_fib6_add(ctx: FExitContext) -> i32 {
    fib6(ctx.arg(1), ctx.arg(2), false, ret(&ctx, 4));
    0
}

#[fexit(function = "fib6_del")]
pub fn route_watch_fexit_fib6_del(ctx: FExitContext) -> i32 {
    fib6(ctx.arg(0), ctx.arg(1), true, ret(&ctx, 2));
    0
}
