//! The forwarding watch's metrics (`bpf::forward`): packets and bytes to cluster
//! destinations by IP pool and path taken, wrong-path packets, forwarding flaps, ring-buffer
//! records lost.
//!
//! The `pool` label is an IP pool name: bounded by the cluster's pools, and a pool's series
//! exist only while it is in the plan (`bpf::forward::ForwardWatch::update_destinations`
//! declares them with [`Metrics::declare_forward_destination`] and removes those of pools
//! that left with [`Metrics::forget_forward_pool`]). The kernel's counters are cumulative;
//! `bpf::forward::ForwardMetrics` hands the differences between two reads to the `record_*`
//! methods here.

use prometheus_client::encoding::EncodeLabelSet;
use routewarden_common::forward::ForwardPath;

use super::Metrics;

/// Labels `{pool, path}` of `routewarden_forwarded_packets_total` / `_bytes_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ForwardPathLabels {
    /// IP pool name: bounded by the cluster's pools (a fixed set from the datastore), never a
    /// prefix.
    pub pool: String,
    /// Path taken: `tunnel`, `host` (`local` never leaves the node).
    pub path: &'static str,
}

/// Labels `{pool, expected, actual}` of `routewarden_wrong_path_packets_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WrongPathLabels {
    /// IP pool name.
    pub pool: String,
    /// Expected path: `tunnel`, `host`, `local`.
    pub expected: &'static str,
    /// Path taken: `tunnel`, `host`.
    pub actual: &'static str,
}

/// Labels `{pool}` of `routewarden_forwarding_flaps_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    /// IP pool name.
    pub pool: String,
}

/// The paths a packet can take when it leaves the node (`local` never does).
const TAKEN: [ForwardPath; 2] = [ForwardPath::Tunnel, ForwardPath::Host];

impl Metrics {
    /// Create at 0 every series a destination of `pool` expected on `expected` can produce
    /// (forwarded packets and bytes by path taken, wrong-path packets for the other paths,
    /// flaps), so an alert's `increase()` sees the first wrong-path packet or flap (a series
    /// born at 1 has no increase in Prometheus).
    pub fn declare_forward_destination(&self, pool: &str, expected: ForwardPath) {
        for path in TAKEN {
            let labels = ForwardPathLabels { pool: pool.to_owned(), path: path.label() };
            let _ = self.forwarded_packets.get_or_create(&labels);
            let _ = self.forwarded_bytes.get_or_create(&labels);
            if path != expected {
                let _ = self.wrong_path_packets.get_or_create(&WrongPathLabels { pool: pool.to_owned(), expected: expected.label(), actual: path.label() });
            }
        }
        let _ = self.forwarding_flaps.get_or_create(&PoolLabels { pool: pool.to_owned() });
    }

    /// Remove every series of `pool` (a pool deleted from the cluster must not leave its
    /// series behind: 300 deleted pools were 1,800 series).
    pub fn forget_forward_pool(&self, pool: &str) {
        for path in TAKEN {
            let labels = ForwardPathLabels { pool: pool.to_owned(), path: path.label() };
            self.forwarded_packets.remove(&labels);
            self.forwarded_bytes.remove(&labels);
            for expected in ForwardPath::ALL {
                self.wrong_path_packets.remove(&WrongPathLabels { pool: pool.to_owned(), expected: expected.label(), actual: path.label() });
            }
        }
        self.forwarding_flaps.remove(&PoolLabels { pool: pool.to_owned() });
    }

    /// `packets` packets of `bytes` bytes to `pool`, expected on `expected`, left on
    /// `actual`: counted by path taken, and as wrong-path packets when the two differ. Both 0:
    /// nothing (no series is created).
    pub fn record_forwarded(&self, pool: &str, expected: ForwardPath, actual: ForwardPath, packets: u64, bytes: u64) {
        if packets == 0 && bytes == 0 {
            return;
        }
        let labels = ForwardPathLabels { pool: pool.to_owned(), path: actual.label() };
        self.forwarded_packets.get_or_create(&labels).inc_by(packets);
        self.forwarded_bytes.get_or_create(&labels).inc_by(bytes);
        if actual != expected {
            self.wrong_path_packets
                .get_or_create(&WrongPathLabels { pool: pool.to_owned(), expected: expected.label(), actual: actual.label() })
                .inc_by(packets);
        }
    }

    /// `flaps` more forwarding flaps of `pool`'s blocks (0: nothing).
    pub fn record_forwarding_flaps(&self, pool: &str, flaps: u64) {
        if flaps > 0 {
            self.forwarding_flaps.get_or_create(&PoolLabels { pool: pool.to_owned() }).inc_by(flaps);
        }
    }

    /// `lost` more forwarding-watch ring-buffer records lost (buffer full).
    pub fn record_forwarding_events_lost(&self, lost: u64) {
        self.forwarding_events_lost.inc_by(lost);
    }
}
