//! fentry hooks on the kernel's FIB insert/delete functions (the cheapest backend: BPF
//! trampolines, typed arguments; the writer is the current task). Refused with EPERM on this
//! host's kernel; exercised in the QEMU lane (Debian 6.1).
//!
//! Prototypes written against (Linux 6.1 .. 6.18; checked against BTF at load by
//! `agent/src/bpf/route_watch/btf.rs`):
//! ```c
//! int fib_table_insert(struct net *net, struct fib_table *tb, struct fib_config *cfg, struct netlink_ext_ack *extack);
//! int fib_table_delete(struct net *net, struct fib_table *tb, struct fib_config *cfg, struct netlink_ext_ack *extack);
//! int fib6_add(struct fib6_node *root, struct fib6_info *rt, struct nl_info *info, struct netlink_ext_ack *extack);
//! int fib6_del(struct fib6_info *rt, struct nl_info *info);
//! ```
use aya_ebpf::{macros::fentry, programs::FEntryContext};

use crate::route_watch_fib::{fib4, fib6};

#[fentry(function = "fib_table_insert")]
pub fn route_watch_fentry_fib_table_insert(ctx: FEntryContext) -> i32 {
    fib4(ctx.arg(0), ctx.arg(2), false);
    0
}

#[fentry(function = "fib_table_delete")]
pub fn route_watch_fentry_fib_table_delete(ctx: FEntryContext) -> i32 {
    fib4(ctx.arg(0), ctx.arg(2), true);
    0
}

#[fentry(function = "fib6_add")]
pub fn route_watch_fentry_fib6_add(ctx: FEntryContext) -> i32 {
    fib6(ctx.arg(1), ctx.arg(2), false);
    0
}

#[fentry(function = "fib6_del")]
pub fn route_watch_fentry_fib6_del(ctx: FEntryContext) -> i32 {
    fib6(ctx.arg(0), ctx.arg(1), true);
    0
}
