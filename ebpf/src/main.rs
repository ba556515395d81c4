//! routewarden's kernel-side programs. One program per concern, each in a file named after
//! what it hooks; maps are declared next to the program that writes them.
#![no_std]
#![no_main]
// Kernel-side habits the workspace's pedantic lints do not know: every helper is inlined (a
// BPF-to-BPF call costs more than most helpers, and older verifiers refuse some calls), and
// aya's program macros hand contexts over by value.
#![allow(clippy::inline_always, reason = "BPF programs: helpers must be inlined into the program")]
#![allow(clippy::needless_pass_by_value, reason = "aya's program macros pass contexts by value")]

mod bpf_log;
mod helpers;
mod route_detector;
mod route_watch_fentry;
mod route_watch_fib;
mod route_watch_kprobe;
mod route_watch_netlink;
mod tc_count;
mod tc_forward;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any program that could reach a real panic; this is never called.
    loop {}
}

/// The licence the kernel sees; GPL-compatible so that GPL-only helpers stay available.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
