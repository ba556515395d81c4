//! The destination maps (`FORWARD_TARGETS_V4`/`_V6`) and the pool filter in front of them
//! (`FORWARD_POOLS`, built by [`super::pools`]), kept in step with the plan's entries by diff:
//! new and changed destinations first, then the new filter in the idle slot made live, then
//! the gone destinations deleted; and the metric series of the pools in the plan.

use std::collections::{BTreeMap, BTreeSet};

use aya::maps::{Array, HashMap as BpfHashMap, MapData};
use ipnet::IpNet;
use routewarden_common::forward::{
    ForwardTarget, PoolFilter, FORWARD_POOLS_ACTIVE_MAP, FORWARD_POOLS_MAP, FORWARD_TARGETS_V4_MAP, FORWARD_TARGETS_V6_MAP, LAST_PATH_UNKNOWN, MAX_POOLS,
};

use super::{entries, map_err, pools, ForwardEntries, ForwardEntry, ForwardMetrics, ForwardWatch};
use crate::bpf::BpfError;
use crate::observe::Metrics;

/// Bring one family's hash map toward `want` at the prefixes in `touched` (`key_of` picks the
/// family's prefixes; `want` holds the wanted ones of `touched`): with `phase`
/// [`SyncPhase::Write`], insert new prefixes and overwrite changed ones in place; with
/// [`SyncPhase::Remove`], delete the prefixes of `touched` `want` does not have. `installed`
/// and `update` follow. Per-entry failures go to `update.failed` (retried next time).
fn sync_targets<K: aya::Pod>(
    map: &mut BpfHashMap<&mut MapData, K, ForwardTarget>,
    key_of: impl Fn(&IpNet) -> Option<K>,
    phase: SyncPhase,
    touched: &[IpNet],
    want: &BTreeMap<IpNet, ForwardTarget>,
    installed: &mut BTreeMap<IpNet, ForwardTarget>,
    update: &mut DestinationsUpdate,
) {
    if phase == SyncPhase::Write {
        for (prefix, target) in want {
            let Some(key) = key_of(prefix) else { continue };
            let old = installed.get(prefix);
            if old == Some(target) {
                continue;
            }
            match map.insert(key, *target, 0) {
                Ok(()) => {
                    if old.is_some() {
                        update.updated += 1;
                    } else {
                        update.inserted += 1;
                    }
                    installed.insert(*prefix, *target);
                }
                Err(e) => update.failed.push((*prefix, e.to_string())),
            }
        }
        return;
    }
    let gone: Vec<IpNet> = touched.iter().filter(|p| installed.contains_key(p) && !want.contains_key(p) && key_of(p).is_some()).copied().collect();
    for prefix in gone {
        let Some(key) = key_of(&prefix) else { continue };
        match map.remove(&key) {
            // Already absent (someone else removed it) is as good as removed.
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {
                update.removed += 1;
                installed.remove(&prefix);
            }
            Err(e) => update.failed.push((prefix, e.to_string())),
        }
    }
}

/// The two halves of [`sync_targets`]: the pool filter is switched between them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SyncPhase {
    Write,
    Remove,
}

fn key_v4(p: &IpNet) -> Option<routewarden_common::forward::TargetKeyV4> {
    match p {
        IpNet::V4(n) => Some(pools::target_key_v4(n)),
        IpNet::V6(_) => None,
    }
}

fn key_v6(p: &IpNet) -> Option<routewarden_common::forward::TargetKeyV6> {
    match p {
        IpNet::V6(n) => Some(pools::target_key_v6(n)),
        IpNet::V4(_) => None,
    }
}

/// Outcome of [`ForwardWatch::set_destinations`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DestinationsUpdate {
    /// Entries inserted.
    pub inserted: usize,
    /// Entries whose pool, class or expected path changed (overwritten in place).
    pub updated: usize,
    /// Entries deleted.
    pub removed: usize,
    /// Entries in the destination maps now.
    pub total: usize,
    /// Entries not written, with why (map full, pool table or pool filter full); retried on the next update.
    pub failed: Vec<(IpNet, String)>,
}

impl ForwardWatch {
    /// The destinations in the kernel now, by prefix.
    pub fn destinations(&self) -> &BTreeMap<IpNet, ForwardTarget> {
        &self.installed
    }

    /// Make the destination maps hold exactly `entries` and the pool filter cover them:
    /// insert new prefixes and overwrite changed ones in place, then switch to the new filter
    /// (written to the idle slot of `FORWARD_POOLS`, then made live), then delete gone
    /// prefixes. Never cleared and refilled, so a packet never misses an entry that stays.
    /// Per-entry failures are reported in the result and retried next time; a destination the
    /// filter cannot hold ([`pools::pool_filter`]) is one of them and is not written.
    ///
    /// # Errors
    /// [`BpfError::Map`] if a map cannot be opened or the filter cannot be written;
    /// destination write failures are per entry.
    pub fn set_destinations(&mut self, entries: &[ForwardEntry]) -> Result<DestinationsUpdate, BpfError> {
        let entries: ForwardEntries = entries.iter().map(|e| (e.prefix.trunc(), e.clone())).collect();
        self.sync_destinations(&entries, None)
    }

    /// [`ForwardWatch::set_destinations`] of `entries`, looking only at the prefixes whose
    /// entry differs from `last`'s when `last` is what the maps hold (the last update written
    /// whole), else at every prefix wanted or installed. The pool filter is computed again
    /// when the set of prefixes may have changed; a prefix it cannot hold sends the update
    /// back over every prefix.
    fn sync_destinations(&mut self, entries: &ForwardEntries, last: Option<&ForwardEntries>) -> Result<DestinationsUpdate, BpfError> {
        let mut update = DestinationsUpdate::default();
        let (touched, keys_changed): (Vec<IpNet>, bool) = match last {
            Some(last) => {
                let (mut touched, mut keys_changed) = (Vec::new(), false);
                last.diff(entries, |prefix, before, after| {
                    keys_changed |= before.is_some() != after.is_some();
                    touched.push(*prefix);
                });
                (touched, keys_changed)
            }
            None => (entries.keys().chain(self.installed.keys()).copied().collect::<BTreeSet<IpNet>>().into_iter().collect(), true),
        };
        let mut want: BTreeMap<IpNet, ForwardTarget> = BTreeMap::new();
        let mut no_pool: BTreeSet<IpNet> = BTreeSet::new();
        {
            let mut pools = self.pools.write().unwrap_or_else(std::sync::PoisonError::into_inner);
            for prefix in &touched {
                let Some(e) = entries.get(prefix) else { continue };
                let Some(pool) = pools.id(&e.pool) else {
                    update.failed.push((*prefix, format!("more than {MAX_POOLS} pools; pool {} is not watched", e.pool)));
                    no_pool.insert(*prefix);
                    continue;
                };
                let (prefix_len, block) = entries::trie_key(prefix);
                let target = ForwardTarget {
                    block,
                    prefix_len,
                    pool,
                    class: entries::class_byte(e.class),
                    expected: e.expected as u8,
                    last_path: LAST_PATH_UNKNOWN,
                    _pad: [0; 3],
                };
                want.insert(*prefix, target);
            }
        }
        let filter = if keys_changed {
            let (filter, left_out) = pools::pool_filter(entries.keys().filter(|p| !no_pool.contains(p)).copied());
            if !left_out.is_empty() && last.is_some() {
                return self.sync_destinations(entries, None);
            }
            for prefix in left_out {
                want.remove(&prefix);
                update
                    .failed
                    .push((prefix, format!("the pool filter holds at most {} prefix lengths in one place", routewarden_common::forward::RANGE_LENGTHS)));
            }
            filter
        } else {
            self.filter
        };
        for phase in [SyncPhase::Write, SyncPhase::Remove] {
            if phase == SyncPhase::Remove && filter != self.filter {
                self.switch_filter(&filter)?;
            }
            let map = self.maps.map_mut(FORWARD_TARGETS_V4_MAP)?;
            let mut v4 = BpfHashMap::try_from(map).map_err(map_err(FORWARD_TARGETS_V4_MAP, "open"))?;
            sync_targets(&mut v4, key_v4, phase, &touched, &want, &mut self.installed, &mut update);
            let map = self.maps.map_mut(FORWARD_TARGETS_V6_MAP)?;
            let mut v6 = BpfHashMap::try_from(map).map_err(map_err(FORWARD_TARGETS_V6_MAP, "open"))?;
            sync_targets(&mut v6, key_v6, phase, &touched, &want, &mut self.installed, &mut update);
        }
        update.total = self.installed.len();
        Ok(update)
    }

    /// Write `filter` into the idle slot of `FORWARD_POOLS`, then make that slot live.
    fn switch_filter(&mut self, filter: &PoolFilter) -> Result<(), BpfError> {
        let idle = self.filter_slot ^ 1;
        let map = self.maps.map_mut(FORWARD_POOLS_MAP)?;
        let mut slots: Array<&mut MapData, PoolFilter> = Array::try_from(map).map_err(map_err(FORWARD_POOLS_MAP, "open"))?;
        slots.set(idle, filter, 0).map_err(map_err(FORWARD_POOLS_MAP, "write"))?;
        let map = self.maps.map_mut(FORWARD_POOLS_ACTIVE_MAP)?;
        let mut active: Array<&mut MapData, u32> = Array::try_from(map).map_err(map_err(FORWARD_POOLS_ACTIVE_MAP, "open"))?;
        active.set(0, idle, 0).map_err(map_err(FORWARD_POOLS_ACTIVE_MAP, "write"))?;
        self.filter = *filter;
        self.filter_slot = idle;
        Ok(())
    }
}

impl ForwardWatch {
    /// Whether the last [`ForwardWatch::update_destinations`] did not write every entry: the
    /// app calls it again with the current plan's entries on its counter poll.
    pub fn destinations_pending(&self) -> bool {
        self.destinations_failed
    }

    /// A new set of destinations (the plan's, [`super::entries_from_routes`]): bring the maps
    /// in step (diffed; nothing written when the entries did not change), declare the new
    /// series at 0 and remove those of pools that left.
    pub fn update_destinations(&mut self, entries: &ForwardEntries, metrics: &Metrics) {
        // What the maps hold, when the last update was written whole: only what differs from
        // it is looked at (chunk by chunk), so a plan that moved one route writes one entry.
        let last = if self.destinations_failed { None } else { self.last_entries.clone() };
        if last.as_ref() == Some(entries) {
            return;
        }
        self.destinations_failed = true;
        match self.sync_destinations(entries, last.as_ref()) {
            Ok(up) => {
                if up.inserted + up.updated + up.removed > 0 {
                    tracing::info!(
                        inserted = up.inserted,
                        updated = up.updated,
                        removed = up.removed,
                        total = up.total,
                        "forwarding watch destinations updated"
                    );
                }
                for (prefix, why) in up.failed.iter().take(10) {
                    tracing::warn!(%prefix, error = %why, "forwarding watch: destination not written; retried on the next counter poll");
                }
                if up.failed.is_empty() {
                    self.last_entries = Some(entries.clone());
                    self.destinations_failed = false;
                }
            }
            Err(e) => tracing::warn!(error = %e, "forwarding watch: updating destinations failed; retried on the next counter poll"),
        }
        // The series: declared for each entry new or changed since the last update, and a
        // pool's removed when its last entry goes.
        let (from, counts) = (&self.declared_from, &mut self.declared);
        let mut gone: Vec<String> = Vec::new();
        from.diff(entries, |_, before, after| {
            if let Some(b) = before {
                if let Some(n) = counts.get_mut(&b.pool) {
                    *n -= 1;
                }
            }
            if let Some(a) = after {
                ForwardMetrics::declare(metrics, std::slice::from_ref(a));
                *counts.entry(a.pool.clone()).or_default() += 1;
            }
        });
        counts.retain(|pool, n| {
            if *n == 0 {
                gone.push(pool.clone());
            }
            *n > 0
        });
        for pool in gone {
            ForwardMetrics::forget(metrics, &pool);
        }
        self.declared_from = entries.clone();
    }
}
