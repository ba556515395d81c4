//! Types shared between routewarden's kernel-side eBPF programs (`routewarden-ebpf`) and the
//! agent. Everything here is `#[repr(C)]`, `Copy`, and free of padding surprises, because the
//! kernel writes these bytes and userspace reads them back out of BPF maps.
//!
//! The `user` feature adds `aya::Pod` impls so the agent can read them from maps.
#![no_std]

/// Per-CPU packet and byte counters kept by the `tc_count` TC classifier.
///
/// Stored at index 0 of the `TC_COUNTERS` per-CPU array map; userspace sums the per-CPU
/// values. Units: `packets` in packets, `bytes` in bytes of the L2 frame (`skb->len`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcCounters {
    /// Packets seen by the classifier.
    pub packets: u64,
    /// Bytes seen by the classifier (`skb->len`, including the Ethernet header).
    pub bytes: u64,
}

#[cfg(feature = "user")]
// SAFETY: `TcCounters` is `#[repr(C)]`, `Copy`, made only of `u64`s and has no padding, so
// any bit pattern of its size is a valid value.
unsafe impl aya::Pod for TcCounters {}

/// Name of the per-CPU array map that holds one [`TcCounters`] at index 0.
pub const TC_COUNTERS_MAP: &str = "TC_COUNTERS";

/// Name of the TC classifier program that counts packets (see `ebpf/src/tc_count.rs`).
pub const TC_COUNT_PROGRAM: &str = "tc_count";

pub mod forward;
pub mod route_watch;
