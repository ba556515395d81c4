//! kprobe hooks on the kernel's FIB insert/delete functions, for kernels without BPF
//! trampolines (fentry). Same functions, prototypes and decoding as `route_watch_fentry.rs`;
//! arguments come from registers (x86-64 SysV: rdi, rsi, rdx, rcx; arm64: x0-x3), the layout
//! aya-ebpf picks by `bpf_target_arch`, which `cargo xtask` sets per agent architecture
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
use aya_ebpf::{macros::kprobe, programs::ProbeContext};

use crate::route_watch_fib::{fib4, fib6};

#[inline(always)]
fn arg(ctx: &ProbeContext, n: usize) -> u64 {
    ctx.arg::<u64>(n).unwrap_or(0)
}

#[kprobe]
pub fn route_watch_kprobe_fib_table_insert(ctx: ProbeContext) -> u32 {
    fib4(arg(&ctx, 0), arg(&ctx, 2), false);
    0
}

#[kprobe]
pub fn route_watch_kprobe_fib_table_delete(ctx: ProbeContext) -> u32 {
    fib4(arg(&ctx, 0), arg(&ctx, 2), true);
    0
}

#[kprobe]
pub fn route_watch_kprobe_fib6_add(ctx: ProbeContext) -> u32 {
    fib6(arg(&ctx, 1), arg(&ctx, 2), false);
    0
}

#[kprobe]
pub fn route_watch_kprobe_fib6_del(ctx: ProbeContext) -> u32 {
    fib6(arg(&ctx, 0), arg(&ctx, 1), true);
    0
}
