//! The watch's per-CPU counters summed over CPUs ([`ForwardCounts`]) and turned into the
//! forwarding metrics as deltas between reads ([`ForwardMetrics`], written through
//! [`crate::observe::metrics::forward`]).

use std::collections::BTreeMap;

use aya::maps::{MapData, PerCpuArray};
use routewarden_common::forward::{
    counter_index, ForwardCounters, ForwardPath, ForwardStats, Observation, FORWARD_COUNTERS_MAP, FORWARD_FLAPS_MAP, FORWARD_STATS_MAP,
};

use super::{map_err, ForwardEntry, ForwardWatch};
use crate::bpf::BpfError;
use crate::observe::Metrics;

impl ForwardWatch {
    /// Sum over CPUs of every counter of the pools known so far.
    ///
    /// # Errors
    /// [`BpfError::Map`] if a counter map cannot be read.
    pub fn counts(&self) -> Result<ForwardCounts, BpfError> {
        let pools = self.pools.read().unwrap_or_else(std::sync::PoisonError::into_inner).names.clone();
        let counters_map = self.maps.map(FORWARD_COUNTERS_MAP)?;
        let counters: PerCpuArray<&MapData, ForwardCounters> = PerCpuArray::try_from(counters_map).map_err(map_err(FORWARD_COUNTERS_MAP, "open"))?;
        let flaps_map = self.maps.map(FORWARD_FLAPS_MAP)?;
        let flaps: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(flaps_map).map_err(map_err(FORWARD_FLAPS_MAP, "open"))?;
        let stats_map = self.maps.map(FORWARD_STATS_MAP)?;
        let stats: PerCpuArray<&MapData, ForwardStats> = PerCpuArray::try_from(stats_map).map_err(map_err(FORWARD_STATS_MAP, "open"))?;

        let mut out = ForwardCounts { pools: pools.clone(), ..ForwardCounts::default() };
        for (id, _) in (0u16..).zip(&pools) {
            for expected in ForwardPath::ALL {
                for obs in Observation::ALL {
                    let Some(i) = counter_index(id, expected as u8, obs as u8) else { continue };
                    let per_cpu = counters.get(&i, 0).map_err(map_err(FORWARD_COUNTERS_MAP, "read"))?;
                    let sum =
                        per_cpu.iter().fold(ForwardCounters::default(), |a, v| ForwardCounters { packets: a.packets + v.packets, bytes: a.bytes + v.bytes });
                    if sum != ForwardCounters::default() {
                        out.slots.insert((id, expected, obs), sum);
                    }
                }
            }
            let f: u64 = flaps.get(&u32::from(id), 0).map_err(map_err(FORWARD_FLAPS_MAP, "read"))?.iter().sum();
            if f > 0 {
                out.flaps.insert(id, f);
            }
        }
        let s = stats.get(&0, 0).map_err(map_err(FORWARD_STATS_MAP, "read"))?;
        out.stats = s.iter().fold(ForwardStats::default(), |a, v| ForwardStats {
            events_lost: a.events_lost + v.events_lost,
            samples: a.samples + v.samples,
            samples_suppressed: a.samples_suppressed + v.samples_suppressed,
            pool_out_of_range: a.pool_out_of_range + v.pool_out_of_range,
        });
        Ok(out)
    }
}

/// Counters read from the kernel: sums over CPUs since the watch started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ForwardCounts {
    /// Pool names by id.
    pub pools: Vec<String>,
    /// Non-zero (pool id, expected path, observation) slots.
    pub slots: BTreeMap<(u16, ForwardPath, Observation), ForwardCounters>,
    /// Forwarding flaps per pool id (non-zero only).
    pub flaps: BTreeMap<u16, u64>,
    /// Global statistics.
    pub stats: ForwardStats,
}

impl ForwardCounts {
    fn pool_id(&self, pool: &str) -> Option<u16> {
        self.pools.iter().position(|p| p == pool).and_then(|i| u16::try_from(i).ok())
    }

    /// Packets and bytes to `pool` seen as `obs`, over every expected path.
    pub fn observed(&self, pool: &str, obs: Observation) -> ForwardCounters {
        let Some(id) = self.pool_id(pool) else { return ForwardCounters::default() };
        self.slots
            .iter()
            .filter(|((p, _, o), _)| *p == id && *o == obs)
            .fold(ForwardCounters::default(), |a, (_, v)| ForwardCounters { packets: a.packets + v.packets, bytes: a.bytes + v.bytes })
    }

    /// Packets to `pool` expected on `expected` that were seen as `obs`.
    pub fn slot(&self, pool: &str, expected: ForwardPath, obs: Observation) -> ForwardCounters {
        self.pool_id(pool).and_then(|id| self.slots.get(&(id, expected, obs))).copied().unwrap_or_default()
    }

    /// Forwarding flaps of `pool`.
    pub fn flaps_of(&self, pool: &str) -> u64 {
        self.pool_id(pool).and_then(|id| self.flaps.get(&id)).copied().unwrap_or(0)
    }
}

/// Turns [`ForwardCounts`] into the `routewarden_forwarded_*`, `routewarden_wrong_path_*` and
/// `routewarden_forwarding_*` metrics (deltas since the previous read).
#[derive(Debug)]
pub struct ForwardMetrics {
    tunnel_watched: bool,
    last: ForwardCounts,
}

impl ForwardMetrics {
    /// `tunnel_watched`: [`ForwardWatch::tunnel_watched`] (decides whether the NIC's IPIP
    /// observations are counted).
    pub fn new(tunnel_watched: bool) -> ForwardMetrics {
        ForwardMetrics { tunnel_watched, last: ForwardCounts::default() }
    }

    /// Update when a tunnel device gets attached later.
    pub fn set_tunnel_watched(&mut self, watched: bool) {
        self.tunnel_watched = watched;
    }

    /// Create every series the entries can produce at 0
    /// ([`Metrics::declare_forward_destination`]), so an alert's `increase()` sees the first
    /// wrong-path packet or flap.
    pub fn declare(metrics: &Metrics, entries: &[ForwardEntry]) {
        for e in entries {
            metrics.declare_forward_destination(&e.pool, e.expected);
        }
    }

    /// Remove every series of `pool` ([`Metrics::forget_forward_pool`]).
    pub fn forget(metrics: &Metrics, pool: &str) {
        metrics.forget_forward_pool(pool);
    }

    fn counted(&self, obs: Observation) -> bool {
        obs != Observation::HostIpip || !self.tunnel_watched
    }

    /// Add what changed since the previous call.
    pub fn apply(&mut self, metrics: &Metrics, now: &ForwardCounts) {
        for (&(id, expected, obs), v) in &now.slots {
            if !self.counted(obs) {
                continue;
            }
            let Some(pool) = now.pools.get(usize::from(id)) else { continue };
            let before = self.last.slots.get(&(id, expected, obs)).copied().unwrap_or_default();
            metrics.record_forwarded(pool, expected, obs.path(), v.packets.saturating_sub(before.packets), v.bytes.saturating_sub(before.bytes));
        }
        for (&id, &n) in &now.flaps {
            let Some(pool) = now.pools.get(usize::from(id)) else { continue };
            metrics.record_forwarding_flaps(pool, n.saturating_sub(self.last.flaps.get(&id).copied().unwrap_or(0)));
        }
        metrics.record_forwarding_events_lost(now.stats.events_lost.saturating_sub(self.last.stats.events_lost));
        self.last = now.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::metrics::{ForwardPathLabels, PoolLabels, WrongPathLabels};

    fn counts(slots: &[((u16, ForwardPath, Observation), u64)]) -> ForwardCounts {
        ForwardCounts {
            pools: vec!["ipip".into(), "flat".into()],
            slots: slots.iter().map(|(k, p)| (*k, ForwardCounters { packets: *p, bytes: p * 100 })).collect(),
            flaps: BTreeMap::from([(0, 1)]),
            stats: ForwardStats::default(),
        }
    }

    fn get(metrics: &Metrics, pool: &str, path: &'static str) -> u64 {
        metrics.forwarded_packets.get_or_create(&ForwardPathLabels { pool: pool.into(), path }).get()
    }

    #[test]
    fn metrics_count_each_packet_once_and_wrong_paths_by_expectation() {
        let (_, metrics) = Metrics::new_registry();
        let mut fm = ForwardMetrics::new(true);
        let c = counts(&[
            ((0, ForwardPath::Tunnel, Observation::TunnelDevice), 10),
            // The same 10 packets again on the NIC, encapsulated: not counted twice.
            ((0, ForwardPath::Tunnel, Observation::HostIpip), 10),
            ((0, ForwardPath::Tunnel, Observation::HostNative), 4),
            ((1, ForwardPath::Host, Observation::HostNative), 7),
        ]);
        fm.apply(&metrics, &c);
        assert_eq!(get(&metrics, "ipip", "tunnel"), 10);
        assert_eq!(get(&metrics, "ipip", "host"), 4);
        assert_eq!(get(&metrics, "flat", "host"), 7);
        let wrong = |pool: &str, e, a| metrics.wrong_path_packets.get_or_create(&WrongPathLabels { pool: pool.into(), expected: e, actual: a }).get();
        assert_eq!(wrong("ipip", "tunnel", "host"), 4);
        assert_eq!(wrong("flat", "host", "tunnel"), 0);
        assert_eq!(metrics.forwarding_flaps.get_or_create(&PoolLabels { pool: "ipip".into() }).get(), 1);
        // Deltas: a second read with 2 more packets adds 2.
        let c2 = counts(&[((0, ForwardPath::Tunnel, Observation::TunnelDevice), 12)]);
        fm.apply(&metrics, &c2);
        assert_eq!(get(&metrics, "ipip", "tunnel"), 12);
        assert_eq!(metrics.forwarding_flaps.get_or_create(&PoolLabels { pool: "ipip".into() }).get(), 1);

        // No tunnel device watched: the NIC's IPIP view is the only one and counts.
        let (_, metrics) = Metrics::new_registry();
        let mut fm = ForwardMetrics::new(false);
        fm.apply(&metrics, &counts(&[((0, ForwardPath::Host, Observation::HostIpip), 5)]));
        assert_eq!(get(&metrics, "ipip", "tunnel"), 5);
        assert_eq!(metrics.wrong_path_packets.get_or_create(&WrongPathLabels { pool: "ipip".into(), expected: "host", actual: "tunnel" }).get(), 5);
    }
}
