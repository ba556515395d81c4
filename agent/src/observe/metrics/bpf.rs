//! The BPF watches' shared metrics: whether each watch's program is attached
//! (`routewarden_bpf_program_attached`, written by `bpf::watch::WatchHandler`) and the
//! `tc_count` demo probe's counters. The route watch and the forwarding watch have files of
//! their own ([`super::route_watch`], [`super::forward`]).

use prometheus_client::encoding::EncodeLabelSet;

use super::Metrics;

/// Labels `{program}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProgramLabels {
    /// BPF program name (`tc_count`, ...).
    pub program: &'static str,
}

impl Metrics {
    /// `routewarden_bpf_program_attached{program}`: 1 when the watch named `program` (its
    /// `Watch::NAME`: `route_watch`, `tc_forward`, `tc_count`) is loaded and attached, 0 when
    /// degraded or detached.
    pub fn set_program_attached(&self, program: &'static str, attached: bool) {
        self.bpf_program_attached.get_or_create(&ProgramLabels { program }).set(i64::from(attached));
    }

    /// Packets and bytes the `tc_count` probe saw since the previous read (deltas of the
    /// kernel's cumulative counters).
    pub fn record_tc_count(&self, packets: u64, bytes: u64) {
        self.tc_count_packets.inc_by(packets);
        self.tc_count_bytes.inc_by(bytes);
    }
}
