//! The TC forwarding watch (issue 6): loads `tc_forward_tunnel` / `tc_forward_host` (see
//! `ebpf/src/tc_forward.rs`) onto egress of the tunnel devices and host NICs, keeps the
//! destination maps (`FORWARD_TARGETS_V4`/`_V6`, hash maps by prefix length and masked
//! address) and the pool filter in front of them (`FORWARD_POOLS`, [`pools`]) in step with the
//! plan, reads the per-CPU counters and turns ring-buffer records into [`ForwardEvent`]s.
//!
//! Attach: TCX links (kernel >= 6.6) placed first on the hook (`LinkOrder::first()`, falling
//! back to appending when another program holds the first position); clsact + netlink filter
//! otherwise with a kernel-chosen priority (the kernel picks one ahead of existing filters,
//! `tcf_auto_prio`). The programs return `TC_ACT_UNSPEC` (TCX_NEXT / "next filter"), so the
//! rest of the chain (Calico, Cilium) runs unchanged. Running first matters: a program that
//! returns `TC_ACT_OK` ends a TCX chain, and the watch would not see the packet after it.
//!
//! Counting rule (one packet, one count): a packet sent through a real IPIP tunnel is seen
//! twice, on the tunnel device (inner) and on the NIC (outer, attributed to the inner
//! destination). The kernel keeps both observations apart ([`Observation`]); the metrics count
//! the NIC's IPIP observation only when no tunnel device is watched ([`ForwardMetrics`]).
//!
//! The programs and maps come from the process's one load ([`BpfObject`]); the app runs the
//! watch in a [`crate::bpf::watch::WatchHandler`] (it implements [`Watch`]), which wraps the
//! steps below:
//! ```ignore
//! let mut watch = ForwardWatch::start_in(&object, &ForwardConfig::for_devices(&tunnels, &nics))?;
//! let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
//! watch.spawn_reader(tx)?;
//! // on every plan:          watch.update_destinations(&entries, &metrics);
//! //                         (entries: `entries_from_routes` of the plan's routes)
//! // every second:           Watch::poll (attach devices that appeared, counters → metrics)
//! // host NIC changed:       watch.set_devices(&config.devices)?;
//! // for each event from rx: log_event(&ev);
//! ```

pub mod entries;
pub mod event;
pub mod pools;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use aya::maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::tc::SchedClassifierLink;
use aya::programs::TcAttachType;

use crate::bpf::bpf_log::BpfLogLevel;
use crate::bpf::loader::{attach_classifier, classifier, BpfObject, LoadConfig, TakenMaps};
use crate::bpf::watch::Watch;
use crate::bpf::BpfError;
use ipnet::IpNet;
use routewarden_common::forward::{
    counter_index, ForwardCounters, ForwardPath, ForwardStats, ForwardTarget, Observation, PoolFilter, FORWARD_COUNTERS_MAP, FORWARD_EVENTS_MAP,
    FORWARD_FLAPS_MAP, FORWARD_POOLS_ACTIVE_MAP, FORWARD_POOLS_MAP, FORWARD_STATS_MAP, FORWARD_TARGETS_V4_MAP, FORWARD_TARGETS_V6_MAP, LAST_PATH_UNKNOWN,
    MAX_POOLS, PROG_TC_FORWARD_HOST, PROG_TC_FORWARD_TUNNEL,
};
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

use crate::observe::Metrics;
pub use entries::{entries_from_routes, ForwardEntry};
pub use event::{ForwardEvent, ForwardEventKind};

/// What a watched device is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceRole {
    /// An IPIP tunnel device (`tunl0`): `tc_forward_tunnel`.
    Tunnel,
    /// A host NIC (`eth0`): `tc_forward_host`.
    HostNic,
}

impl DeviceRole {
    fn program(self) -> &'static str {
        match self {
            DeviceRole::Tunnel => PROG_TC_FORWARD_TUNNEL,
            DeviceRole::HostNic => PROG_TC_FORWARD_HOST,
        }
    }

    /// `tunnel` or `host-nic`.
    pub fn label(self) -> &'static str {
        match self {
            DeviceRole::Tunnel => "tunnel",
            DeviceRole::HostNic => "host-nic",
        }
    }
}

/// Settings of the watch.
#[derive(Clone, Debug)]
pub struct ForwardConfig {
    /// Devices to watch and their role (egress).
    pub devices: Vec<(String, DeviceRole)>,
    /// Path changes of one block within `window` that make a forwarding flap (default 3).
    pub flap_threshold: u32,
    /// Flap window (default 30 s).
    pub window: Duration,
    /// Minimum interval between two wrong-path samples of one block (default 1 s).
    pub sample_interval: Duration,
    /// Kernel-side log level (`--bpf-log-level`, default off; [`crate::bpf::bpf_log`]).
    pub log_level: BpfLogLevel,
}

impl ForwardConfig {
    /// Watch `tunnels` as tunnel devices and `nics` as host NICs, with the default thresholds.
    pub fn for_devices(tunnels: &[String], nics: &[String]) -> ForwardConfig {
        let devices = tunnels.iter().map(|d| (d.clone(), DeviceRole::Tunnel)).chain(nics.iter().map(|d| (d.clone(), DeviceRole::HostNic))).collect();
        ForwardConfig { devices, flap_threshold: 3, window: Duration::from_secs(30), sample_interval: Duration::from_secs(1), log_level: BpfLogLevel::Off }
    }
}

/// Bring one family's hash map toward `want` (`key_of` picks the family's prefixes): with
/// `phase` [`SyncPhase::Write`], insert new prefixes and overwrite changed ones in place; with
/// [`SyncPhase::Remove`], delete the prefixes `want` no longer has. `installed` and `update`
/// follow. Per-entry failures go to `update.failed` (retried next time).
fn sync_targets<K: aya::Pod>(
    map: &mut BpfHashMap<&mut MapData, K, ForwardTarget>,
    key_of: impl Fn(&IpNet) -> Option<K>,
    phase: SyncPhase,
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
    let gone: Vec<IpNet> = installed.keys().filter(|p| !want.contains_key(p) && key_of(p).is_some()).copied().collect();
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

fn map_err(map: &'static str, op: &'static str) -> impl Fn(aya::maps::MapError) -> BpfError {
    BpfError::map(map, op)
}

/// The maps the watch reads and writes (the per-block state map stays kernel-only).
const MAPS: [&str; 8] = [
    FORWARD_TARGETS_V4_MAP,
    FORWARD_TARGETS_V6_MAP,
    FORWARD_POOLS_MAP,
    FORWARD_POOLS_ACTIVE_MAP,
    FORWARD_COUNTERS_MAP,
    FORWARD_FLAPS_MAP,
    FORWARD_STATS_MAP,
    FORWARD_EVENTS_MAP,
];

/// A watched device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttachedDevice {
    /// Device name.
    pub name: String,
    /// Role.
    pub role: DeviceRole,
    /// `tcx` or `clsact`.
    pub mode: &'static str,
}

/// Pool ids: stable for the life of the watch (ids are never reused, so counters never
/// change pools). At most [`MAX_POOLS`] distinct pool names.
#[derive(Debug, Default)]
struct PoolTable {
    names: Vec<String>,
    ids: HashMap<String, u16>,
}

impl PoolTable {
    fn id(&mut self, name: &str) -> Option<u16> {
        if let Some(id) = self.ids.get(name) {
            return Some(*id);
        }
        if self.names.len() >= MAX_POOLS {
            return None;
        }
        let id = u16::try_from(self.names.len()).ok()?;
        self.names.push(name.to_string());
        self.ids.insert(name.to_string(), id);
        Some(id)
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

/// A running forwarding watch. Dropping it detaches the programs.
pub struct ForwardWatch {
    object: BpfObject,
    maps: TakenMaps,
    pools: Arc<RwLock<PoolTable>>,
    installed: BTreeMap<IpNet, ForwardTarget>,
    /// The live pool filter and its slot in `FORWARD_POOLS` (0 or 1).
    filter: PoolFilter,
    filter_slot: u32,
    attached: Vec<AttachedDevice>,
    /// One owned link per attached device (same order as `attached`); dropping one detaches.
    links: Vec<SchedClassifierLink>,
    missing: Vec<(String, DeviceRole)>,
    /// The metrics' view of the counters (deltas since the previous poll).
    metrics_state: ForwardMetrics,
    /// The entries of the last update that was written whole.
    last_entries: Vec<ForwardEntry>,
    /// Pools whose series are declared: a pool that leaves the plan has its series removed.
    declared: BTreeSet<String>,
}

impl std::fmt::Debug for ForwardWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForwardWatch")
            .field("attached", &self.attached)
            .field("missing", &self.missing)
            .field("destinations", &self.installed.len())
            .finish_non_exhaustive()
    }
}

fn device_exists(name: &str) -> bool {
    nix::net::if_::if_nametoindex(name).is_ok()
}

impl ForwardWatch {
    /// Load the object on its own ([`BpfObject::load`] with `config`'s thresholds) and start
    /// the watch from it ([`ForwardWatch::start_in`]): for tests and benchmarks that run the
    /// forwarding watch alone.
    ///
    /// # Errors
    /// As [`BpfObject::load`] and [`ForwardWatch::start_in`].
    pub fn start(object: &'static [u8], config: &ForwardConfig) -> Result<ForwardWatch, BpfError> {
        let object = BpfObject::load(object, LoadConfig::for_forward(config))?;
        Self::start_in(&object, config)
    }

    /// Attach the classifiers of `object` to egress of every device of `config` that exists,
    /// in the calling thread's network namespace, and take the watch's maps. Devices that do
    /// not exist yet are kept in [`ForwardWatch::missing`] and tried again by
    /// [`ForwardWatch::attach_missing`]. The thresholds are those `object` was loaded with
    /// ([`LoadConfig::forward`]). The maps are taken last, so a start that fails can be tried
    /// again on the same object.
    ///
    /// # Errors
    /// [`BpfError::Program`] when a program does not load; [`BpfError::Attach`] naming the
    /// device when an existing device refuses the attach; [`BpfError::NoDevice`] when no
    /// configured device exists; [`BpfError::Taken`] when another forwarding watch of this
    /// process holds the maps. The caller reports the watch as degraded and carries on.
    pub fn start_in(object: &BpfObject, config: &ForwardConfig) -> Result<ForwardWatch, BpfError> {
        object.with(|ebpf| {
            for program in [PROG_TC_FORWARD_TUNNEL, PROG_TC_FORWARD_HOST] {
                classifier(ebpf, program)?;
            }
            Ok::<(), BpfError>(())
        })?;
        let mut attached = Attachments { attached: Vec::new(), links: Vec::new(), missing: config.devices.clone() };
        attached.attach_missing(object)?;
        if attached.attached.is_empty() {
            return Err(BpfError::NoDevice(config.devices.iter().map(|(d, _)| d.clone()).collect()));
        }
        let maps = object.take_maps(&MAPS)?;
        let tunnel_watched = attached.attached.iter().any(|a| a.role == DeviceRole::Tunnel);
        Ok(ForwardWatch {
            object: object.clone(),
            maps,
            pools: Arc::default(),
            installed: BTreeMap::new(),
            filter: PoolFilter::default(),
            filter_slot: 0,
            attached: attached.attached,
            links: attached.links,
            missing: attached.missing,
            metrics_state: ForwardMetrics::new(tunnel_watched),
            last_entries: Vec::new(),
            declared: BTreeSet::new(),
        })
    }

    /// Attach to the configured devices that were missing and exist now (a `tunl0` created by
    /// Felix after the agent started). Returns the devices attached by this call.
    ///
    /// # Errors
    /// [`BpfError::Attach`] for the first existing device that refuses the attach (it
    /// stays in the missing list and is tried again next time).
    pub fn attach_missing(&mut self) -> Result<Vec<AttachedDevice>, BpfError> {
        let mut a =
            Attachments { attached: std::mem::take(&mut self.attached), links: std::mem::take(&mut self.links), missing: std::mem::take(&mut self.missing) };
        let result = a.attach_missing(&self.object);
        (self.attached, self.links, self.missing) = (a.attached, a.links, a.missing);
        self.metrics_state.set_tunnel_watched(self.tunnel_watched());
        result
    }

    /// Watch `devices` instead (the host NIC changed): devices no longer listed are detached,
    /// new ones attached (or kept missing until they exist). Counters, destinations and the
    /// reader carry on.
    ///
    /// # Errors
    /// As [`ForwardWatch::attach_missing`].
    pub fn set_devices(&mut self, devices: &[(String, DeviceRole)]) -> Result<Vec<AttachedDevice>, BpfError> {
        let keep = |name: &str, role: DeviceRole| devices.iter().any(|(d, r)| d == name && *r == role);
        let mut attached = Vec::new();
        let mut links = Vec::new();
        for (a, link) in std::mem::take(&mut self.attached).into_iter().zip(std::mem::take(&mut self.links)) {
            if keep(&a.name, a.role) {
                attached.push(a);
                links.push(link);
            } else {
                tracing::info!(device = %a.name, role = a.role.label(), "forwarding watch: detached from a device no longer watched");
            }
        }
        (self.attached, self.links) = (attached, links);
        self.missing = devices.iter().filter(|(d, r)| !self.attached.iter().any(|a| &a.name == d && a.role == *r)).cloned().collect();
        self.attach_missing()
    }

    /// Kernel program ids of the two classifiers (`tc_forward_tunnel`, `tc_forward_host`), for
    /// `bpftool prog show id N` / `bpftool prog run id N` (per-packet cost measurements).
    ///
    /// # Errors
    /// [`BpfError::Program`] if the kernel cannot describe a program.
    pub fn program_ids(&self) -> Result<Vec<(&'static str, u32)>, BpfError> {
        self.object.with(|ebpf| {
            [PROG_TC_FORWARD_TUNNEL, PROG_TC_FORWARD_HOST]
                .into_iter()
                .map(|name| {
                    let prog = classifier(ebpf, name)?;
                    let info = prog.info().map_err(BpfError::program("info", name))?;
                    Ok((name, info.id()))
                })
                .collect()
        })
    }

    /// Devices the programs are attached to.
    pub fn attached(&self) -> &[AttachedDevice] {
        &self.attached
    }

    /// Configured devices that do not exist (yet) or refused the attach.
    pub fn missing(&self) -> &[(String, DeviceRole)] {
        &self.missing
    }

    /// True when a tunnel device is watched (the NIC's IPIP observations are then the same
    /// packets again and are left out of the metrics).
    pub fn tunnel_watched(&self) -> bool {
        self.attached.iter().any(|a| a.role == DeviceRole::Tunnel)
    }

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
        let mut update = DestinationsUpdate::default();
        let mut want: BTreeMap<IpNet, ForwardTarget> = BTreeMap::new();
        {
            let mut pools = self.pools.write().unwrap_or_else(std::sync::PoisonError::into_inner);
            for e in entries {
                let Some(pool) = pools.id(&e.pool) else {
                    update.failed.push((e.prefix, format!("more than {MAX_POOLS} pools; pool {} is not watched", e.pool)));
                    continue;
                };
                let (prefix_len, block) = entries::trie_key(&e.prefix);
                want.insert(
                    e.prefix.trunc(),
                    ForwardTarget {
                        block,
                        prefix_len,
                        pool,
                        class: entries::class_byte(e.class),
                        expected: e.expected as u8,
                        last_path: LAST_PATH_UNKNOWN,
                        _pad: [0; 3],
                    },
                );
            }
        }
        let (filter, left_out) = pools::pool_filter(want.keys().copied());
        for prefix in left_out {
            want.remove(&prefix);
            update.failed.push((prefix, format!("the pool filter holds at most {} prefix lengths in one place", routewarden_common::forward::RANGE_LENGTHS)));
        }
        for phase in [SyncPhase::Write, SyncPhase::Remove] {
            if phase == SyncPhase::Remove && filter != self.filter {
                self.switch_filter(&filter)?;
            }
            let map = self.maps.map_mut(FORWARD_TARGETS_V4_MAP)?;
            let mut v4 = BpfHashMap::try_from(map).map_err(map_err(FORWARD_TARGETS_V4_MAP, "open"))?;
            sync_targets(&mut v4, key_v4, phase, &want, &mut self.installed, &mut update);
            let map = self.maps.map_mut(FORWARD_TARGETS_V6_MAP)?;
            let mut v6 = BpfHashMap::try_from(map).map_err(map_err(FORWARD_TARGETS_V6_MAP, "open"))?;
            sync_targets(&mut v6, key_v6, phase, &want, &mut self.installed, &mut update);
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

    /// Start the ring-buffer reader on the current tokio runtime: decodes each record into a
    /// [`ForwardEvent`] (pool names resolved) and sends it to `tx`. Undecodable records are
    /// logged and skipped. The task ends when `tx` is closed.
    ///
    /// # Errors
    /// [`BpfError::ReaderTaken`] on a second call; [`BpfError::Poll`] if the ring
    /// buffer cannot be registered with the runtime.
    pub fn spawn_reader(&mut self, tx: mpsc::Sender<ForwardEvent>) -> Result<tokio::task::JoinHandle<()>, BpfError> {
        let map = self.maps.take(FORWARD_EVENTS_MAP).ok_or(BpfError::ReaderTaken)?;
        let ring = RingBuf::try_from(map).map_err(map_err(FORWARD_EVENTS_MAP, "open"))?;
        // SAFETY: the RingBuf owns its map fd for its whole life and always returns that fd;
        // the AsyncFd owns the RingBuf, so the fd outlives the registration.
        let fd = unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }.map_err(|e| BpfError::Poll(e.into()))?;
        let pools = self.pools.clone();
        Ok(tokio::spawn(read_ring(fd, pools, tx)))
    }
}

/// The attach state of a watch being started or moved: attached devices with their links, and
/// the configured devices not attached yet.
struct Attachments {
    attached: Vec<AttachedDevice>,
    links: Vec<SchedClassifierLink>,
    missing: Vec<(String, DeviceRole)>,
}

impl Attachments {
    /// Attach every missing device that exists; the first refusal stops the round (that
    /// device and the rest stay missing) and is returned.
    fn attach_missing(&mut self, object: &BpfObject) -> Result<Vec<AttachedDevice>, BpfError> {
        let mut newly = Vec::new();
        let pending = std::mem::take(&mut self.missing);
        let mut result = Ok(());
        for (dev, role) in pending {
            if result.is_err() || !device_exists(&dev) {
                self.missing.push((dev, role));
                continue;
            }
            let program = role.program();
            // First on the hook, so a program returning TC_ACT_OK after us cannot hide packets.
            match object.with(|ebpf| attach_classifier(classifier(ebpf, program)?, program, &dev, TcAttachType::Egress, true)) {
                Ok((link, mode)) => {
                    let a = AttachedDevice { name: dev, role, mode };
                    self.attached.push(a.clone());
                    self.links.push(link);
                    newly.push(a);
                }
                Err(e) => {
                    self.missing.push((dev, role));
                    result = Err(e);
                }
            }
        }
        result.map(|()| newly)
    }
}

impl ForwardWatch {
    /// A new set of destinations (the plan's, [`entries_from_routes`]): bring the trie in step
    /// (diffed; nothing written when the entries did not change), declare the new series at 0
    /// and remove those of pools that left.
    pub fn update_destinations(&mut self, entries: &[ForwardEntry], metrics: &Metrics) {
        if entries == self.last_entries.as_slice() {
            return;
        }
        match self.set_destinations(entries) {
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
                    tracing::warn!(%prefix, error = %why, "forwarding watch: destination not written; retried on the next plan");
                }
                if up.failed.is_empty() {
                    self.last_entries = entries.to_vec();
                } else {
                    self.last_entries.clear();
                }
            }
            Err(e) => tracing::warn!(error = %e, "forwarding watch: updating destinations failed"),
        }
        ForwardMetrics::declare(metrics, entries);
        let pools: BTreeSet<String> = entries.iter().map(|e| e.pool.clone()).collect();
        for gone in self.declared.difference(&pools) {
            ForwardMetrics::forget(metrics, gone);
        }
        self.declared = pools;
    }
}

impl Watch for ForwardWatch {
    type Event = ForwardEvent;
    const NAME: &'static str = WATCHER_NAME;
    const DEGRADED: &'static str = "forwarding watch not running; routes are still programmed";

    fn spawn_reader(&mut self, tx: mpsc::Sender<ForwardEvent>) -> Result<Option<tokio::task::JoinHandle<()>>, BpfError> {
        ForwardWatch::spawn_reader(self, tx).map(Some)
    }

    fn on_started(&mut self, _metrics: &Metrics) {
        tracing::info!(attached = ?self.attached(), missing = ?self.missing(), "forwarding watch running (TC egress)");
    }

    /// Attach devices that appeared, read the counters into the metrics.
    fn poll(&mut self, metrics: &Metrics) {
        if !self.missing.is_empty() {
            match self.attach_missing() {
                Ok(newly) if !newly.is_empty() => tracing::info!(attached = ?newly, "forwarding watch attached to devices that appeared"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "forwarding watch: attaching a device failed"),
            }
        }
        match self.counts() {
            Ok(c) => self.metrics_state.apply(metrics, &c),
            Err(e) => tracing::warn!(error = %e, "forwarding watch: reading counters failed"),
        }
    }

    fn on_event(&mut self, _metrics: &Metrics, event: &ForwardEvent) {
        log_event(event);
    }

    fn detached_reason(&self) -> Option<String> {
        self.attached.is_empty().then(|| BpfError::NoDevice(self.missing.iter().map(|(d, _)| d.clone()).collect()).to_string())
    }
}

async fn read_ring(mut fd: AsyncFd<RingBuf<MapData>>, pools: Arc<RwLock<PoolTable>>, tx: mpsc::Sender<ForwardEvent>) {
    loop {
        let mut guard = match fd.readable_mut().await {
            Ok(g) => g,
            Err(e) => {
                tracing::warn!(error = %e, "forwarding watch: ring buffer poll failed; reader stops");
                return;
            }
        };
        let mut batch = Vec::new();
        {
            let names = pools.read().unwrap_or_else(std::sync::PoisonError::into_inner);
            let name = |id: u16| names.names.get(usize::from(id)).cloned();
            let ring = guard.get_inner_mut();
            while let Some(item) = ring.next() {
                match event::decode_record(&item, name) {
                    Ok(ev) => batch.push(ev),
                    Err(e) => tracing::warn!(error = %e, "forwarding watch: undecodable ring-buffer record skipped"),
                }
            }
        }
        guard.clear_ready();
        for ev in batch {
            if tx.send(ev).await.is_err() {
                return;
            }
        }
    }
}

/// Log one event: wrong-path samples and flaps at `warn`, with the block and the paths as
/// fields.
pub fn log_event(ev: &ForwardEvent) {
    let pool = ev.pool.as_deref().unwrap_or("?");
    let device = ev.device.as_deref().unwrap_or("?");
    match ev.event {
        ForwardEventKind::WrongPath => tracing::warn!(
            block = %ev.block, dst = %ev.dst, pool, expected = ev.expected, actual = ev.actual, device, seen_as = ev.seen_as,
            "cluster traffic leaving on the wrong path (sample; the counter has every packet)"
        ),
        ForwardEventKind::Flap => tracing::warn!(
            block = %ev.block, dst = %ev.dst, pool, previous = ev.previous.unwrap_or("?"), actual = ev.actual,
            changes = ev.changes.unwrap_or(0), expected = ev.expected, device,
            "forwarding flap: this block's egress path keeps changing"
        ),
    }
}

/// Name of the watch in `/readyz` and the `program` label of `routewarden_bpf_program_attached`.
pub const WATCHER_NAME: &str = "tc_forward";

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

    #[test]
    fn pool_ids_are_stable_and_bounded() {
        let mut t = PoolTable::default();
        assert_eq!(t.id("a"), Some(0));
        assert_eq!(t.id("b"), Some(1));
        assert_eq!(t.id("a"), Some(0));
        for i in 2..MAX_POOLS {
            assert!(t.id(&format!("p{i}")).is_some());
        }
        assert_eq!(t.id("one-too-many"), None);
    }

    #[test]
    fn empty_object_is_a_clear_error() {
        assert!(matches!(ForwardWatch::start(&[], &ForwardConfig::for_devices(&[], &["eth0".into()])), Err(BpfError::NoObject)));
    }
}
