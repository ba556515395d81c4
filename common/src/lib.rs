//! Types shared between routewarden's kernel-side eBPF programs (`routewarden-ebpf`) and the
//! agent. Everything here is `#[repr(C)]`, `Copy`, and free of padding surprises, because the
//! kernel writes these bytes and userspace reads them back out of BPF maps.
//!
//! The `user` feature adds `aya::Pod` impls so the agent can read them from maps.
#![no_std]
// Shared with the kernel side, which needs these small helpers inlined (a BPF-to-BPF call costs
// more than the helper and older verifiers refuse some), and whose `#[repr(C)]` structs spell
// out their padding as `_pad` fields so both sides agree on every byte.
#![allow(clippy::inline_always, reason = "BPF programs call these per packet; they must be inlined")]
#![allow(clippy::pub_underscore_fields, reason = "explicit `_pad` fields of #[repr(C)] structs shared with the kernel")]
#![warn(clippy::undocumented_unsafe_blocks, reason = "every unsafe block and impl says why it is sound")]

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

/// Name of the kernel-only per-CPU array of `ebpf/src/bpf_log.rs` (last log time per kind);
/// listed so that [`MAP_NAMES`] names every map of the object.
pub const BPF_LOG_RATE_MAP: &str = "BPF_LOG_RATE";

/// Every map routewarden's object declares, by the constants userspace looks them up with
/// (aya-log's own `AYA_LOGS` and the compiler's `.rodata`/`.data`/`.bss` sections aside).
/// `agent/tests/bpf_names.rs` checks the object against this list, so a map added or renamed
/// on one side only fails a test.
pub const MAP_NAMES: &[&str] = &[
    TC_COUNTERS_MAP,
    BPF_LOG_RATE_MAP,
    forward::FORWARD_POOLS_MAP,
    forward::FORWARD_POOLS_ACTIVE_MAP,
    forward::FORWARD_TARGETS_V4_MAP,
    forward::FORWARD_TARGETS_V6_MAP,
    forward::FORWARD_COUNTERS_MAP,
    forward::FORWARD_FLAPS_MAP,
    forward::FORWARD_STATS_MAP,
    forward::FORWARD_BLOCKS_MAP,
    forward::FORWARD_EVENTS_MAP,
    route_watch::ROUTE_WATCH_STATE_MAP,
    route_watch::ROUTE_WATCH_COUNTERS_MAP,
    route_watch::ROUTE_WATCH_EVENTS_MAP,
    route_watch::ROUTE_WATCH_SELF_PORTS_MAP,
    route_watch::ROUTE_WATCH_NL_SCRATCH_MAP,
    route_watch::ROUTE_WATCH_NL_NEXTHOP_MAP,
    route_watch::ROUTE_WATCH_FAILURES_MAP,
    route_watch::ROUTE_WATCH_PENDING_MAP,
];

/// `a == b` in a constant expression (`str`'s `==` is not `const`); used by
/// [`assert_bpf_name!`].
pub const fn same_name(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Compile-time check, for the kernel-side crate, that a static's identifier is spelled as the
/// shared name constant userspace looks it up by: `assert_bpf_name!(FORWARD_COUNTERS,
/// forward::FORWARD_COUNTERS_MAP)`.
///
/// The identifier is the name in the object: aya-ebpf's `#[map]` without `name = ...` exports
/// a map under its static's identifier, and `#[unsafe(no_mangle)]` does the same for a global.
/// `#[map(name = ...)]` wants a string literal, so it cannot take the constant itself; this
/// assertion is what keeps the two spellings one name (the BPF build fails if they drift).
#[macro_export]
macro_rules! assert_bpf_name {
    ($static:ident, $constant:path) => {
        const _: () = assert!(
            $crate::same_name(stringify!($static), $constant),
            concat!("the kernel-side static `", stringify!($static), "` is not named as `", stringify!($constant), "`")
        );
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_name_compares_whole_strings() {
        assert!(same_name("FORWARD_STATS", "FORWARD_STATS"));
        assert!(!same_name("FORWARD_STATS", "FORWARD_STAT"));
        assert!(!same_name("FORWARD_STATS", "FORWARD_STATs"));
        assert!(same_name("", ""));
    }

    #[test]
    fn map_names_are_unique() {
        let mut names = MAP_NAMES.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), MAP_NAMES.len());
    }
}
