//! `tc_count`: a TC classifier that counts the packets and bytes passing a hook.
//!
//! It proves the BPF chain end to end (build → embed → load → attach → read map) and is the
//! seed of the forwarding watch. It never drops, redirects or modifies a packet: it returns
//! `TC_ACT_UNSPEC` (-1), which for clsact means "continue with the next filter / default
//! action" and for TCX is `TCX_NEXT`, so other programs on the same hook (Calico's, Cilium's)
//! still see every packet.
use aya_ebpf::{
    bindings::TC_ACT_UNSPEC,
    macros::{classifier, map},
    maps::PerCpuArray,
    programs::TcContext,
};
use routewarden_common::{assert_bpf_name, TcCounters};

/// One [`TcCounters`] per CPU at index 0.
#[map]
static TC_COUNTERS: PerCpuArray<TcCounters> = PerCpuArray::with_max_entries(1, 0);
assert_bpf_name!(TC_COUNTERS, routewarden_common::TC_COUNTERS_MAP);
assert_bpf_name!(tc_count, routewarden_common::TC_COUNT_PROGRAM);

#[classifier]
pub fn tc_count(ctx: TcContext) -> i32 {
    if let Some(counters) = TC_COUNTERS.get_ptr_mut(0) {
        // SAFETY: the pointer comes from the map lookup for this CPU's slot and is valid for
        // the duration of the program; per-CPU values are not shared with other CPUs.
        unsafe {
            (*counters).packets += 1;
            (*counters).bytes += u64::from(ctx.len());
        }
    }
    TC_ACT_UNSPEC
}
