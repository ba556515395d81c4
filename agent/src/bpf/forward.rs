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
//! The app uses [`ForwardHandler`], which wraps the steps below:
//! ```ignore
//! let mut watch = ForwardWatch::start(object, &ForwardConfig::for_devices(&tunnels, &nics))?;
//! let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
//! watch.spawn_reader(tx)?;
//! let mut fm = ForwardMetrics::new(watch.tunnel_watched());
//! // on every plan:          let entries = entries_from_plan(&plan);
//! //                         watch.set_destinations(&entries)?; fm.declare(&metrics, &entries);
//! // every second:           fm.apply(&metrics, &watch.counts()?); watch.attach_missing();
//! // for each event from rx: log_event(&ev);
//! ```

pub mod entries;
pub mod event;
pub mod pools;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use aya::maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::links::LinkOrder;
use aya::programs::tc::{self, NlOptions, TcAttachOptions};
use aya::programs::{SchedClassifier, TcAttachType};
use aya::{Ebpf, EbpfLoader};

use crate::bpf::bpf_log::{BpfLogForwarder, BpfLogLevel};
use ipnet::IpNet;
use routewarden_common::forward::{
    counter_index, ForwardCounters, ForwardPath, ForwardStats, ForwardTarget, Observation, PoolFilter, FORWARD_COUNTERS_MAP,
    FORWARD_EVENTS_MAP, FORWARD_FLAPS_MAP, FORWARD_POOLS_ACTIVE_MAP, FORWARD_POOLS_MAP, FORWARD_STATS_MAP, FORWARD_TARGETS_V4_MAP,
    FORWARD_TARGETS_V6_MAP, GLOBAL_FLAP_THRESHOLD, GLOBAL_SAMPLE_INTERVAL_NS, GLOBAL_WINDOW_NS, LAST_PATH_UNKNOWN, MAX_POOLS,
    PROG_TC_FORWARD_HOST, PROG_TC_FORWARD_TUNNEL,
};
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

use crate::observe::metrics::{ForwardPathLabels, PoolLabels, WrongPathLabels};
use crate::observe::Metrics;
pub use entries::{entries_from_plan, entries_from_routes, ForwardEntry};
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
        let devices = tunnels
            .iter()
            .map(|d| (d.clone(), DeviceRole::Tunnel))
            .chain(nics.iter().map(|d| (d.clone(), DeviceRole::HostNic)))
            .collect();
        ForwardConfig { devices, flap_threshold: 3, window: Duration::from_secs(30), sample_interval: Duration::from_secs(1), log_level: BpfLogLevel::Off }
    }
}

/// Why the watch (or one operation of it) failed.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// The binary was built without the kernel-side object.
    #[error("no BPF object is embedded in this build (build with `cargo xtask build`)")]
    NoObject,
    /// The object failed to load (maps, globals).
    #[error("loading BPF object: {source}")]
    Load {
        #[source]
        source: Box<aya::EbpfError>,
    },
    /// Loading a program failed (verifier).
    #[error("load {program}: {source}")]
    Program {
        program: &'static str,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    /// Attaching a program to a device failed.
    #[error("attach {program} to {iface} egress ({mode}): {source}")]
    Attach {
        program: &'static str,
        iface: String,
        mode: &'static str,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    /// None of the configured devices exists.
    #[error("none of the watched devices exists: {0:?}")]
    NoDevice(Vec<String>),
    /// A program or map is missing from the object.
    #[error("{0} not found in the BPF object")]
    Missing(&'static str),
    /// A map has the wrong type or an operation on it failed.
    #[error("map {map}: {op}: {source}")]
    Map {
        map: &'static str,
        op: &'static str,
        #[source]
        source: Box<aya::maps::MapError>,
    },
    /// Registering the ring buffer with the runtime failed.
    #[error("poll ring buffer: {0}")]
    Poll(#[source] std::io::Error),
    /// The ring-buffer reader was already started.
    #[error("the ring-buffer reader is already running")]
    ReaderTaken,
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

fn map_err(map: &'static str, op: &'static str) -> impl Fn(aya::maps::MapError) -> ForwardError {
    move |e| ForwardError::Map { map, op, source: Box::new(e) }
}

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
    /// Entries in the trie now.
    pub total: usize,
    /// Entries not written, with why (trie full, pool table full); retried on the next update.
    pub failed: Vec<(IpNet, String)>,
}

/// A running forwarding watch. Dropping it detaches the programs.
pub struct ForwardWatch {
    bpf: Ebpf,
    pools: Arc<RwLock<PoolTable>>,
    installed: BTreeMap<IpNet, ForwardTarget>,
    /// The live pool filter and its slot in `FORWARD_POOLS` (0 or 1).
    filter: PoolFilter,
    filter_slot: u32,
    attached: Vec<AttachedDevice>,
    missing: Vec<(String, DeviceRole)>,
    /// Forwards the programs' log lines (`None` with `--bpf-log-level off`).
    _log: Option<BpfLogForwarder>,
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

fn has_tcx() -> bool {
    aya::util::KernelVersion::current().is_ok_and(|v| v >= aya::util::KernelVersion::new(6, 6, 0))
}

fn device_exists(name: &str) -> bool {
    nix::net::if_::if_nametoindex(name).is_ok()
}

impl ForwardWatch {
    /// Load the object and attach the classifiers to egress of every configured device that
    /// exists, in the calling thread's network namespace. Devices that do not exist yet are
    /// kept in [`ForwardWatch::missing`] and tried again by [`ForwardWatch::attach_missing`].
    ///
    /// # Errors
    /// [`ForwardError::Load`]/[`ForwardError::Program`] when the object or a program does not
    /// load; [`ForwardError::Attach`] naming the device when an existing device refuses the
    /// attach; [`ForwardError::NoDevice`] when no configured device exists. The caller reports
    /// the watch as degraded and carries on.
    pub fn start(object: &[u8], config: &ForwardConfig) -> Result<ForwardWatch, ForwardError> {
        if object.is_empty() {
            return Err(ForwardError::NoObject);
        }
        let window_ns = u64::try_from(config.window.as_nanos()).unwrap_or(u64::MAX);
        let sample_ns = u64::try_from(config.sample_interval.as_nanos()).unwrap_or(u64::MAX);
        let threshold = config.flap_threshold.max(1);
        let mut loader = EbpfLoader::new();
        loader
            .override_global(GLOBAL_FLAP_THRESHOLD, &threshold, true)
            .override_global(GLOBAL_WINDOW_NS, &window_ns, true)
            .override_global(GLOBAL_SAMPLE_INTERVAL_NS, &sample_ns, true);
        config.log_level.apply(&mut loader);
        let mut bpf = loader.load(object).map_err(|e| ForwardError::Load { source: Box::new(e) })?;
        let log = BpfLogForwarder::start(&mut bpf, "forwarding-watch", config.log_level);
        let mut watch = ForwardWatch {
            _log: log,
            bpf,
            pools: Arc::default(),
            installed: BTreeMap::new(),
            filter: PoolFilter::default(),
            filter_slot: 0,
            attached: Vec::new(),
            missing: config.devices.clone(),
        };
        for program in [PROG_TC_FORWARD_TUNNEL, PROG_TC_FORWARD_HOST] {
            watch.classifier(program)?.load().map_err(|e| ForwardError::Program { program, source: Box::new(e) })?;
        }
        watch.attach_missing()?;
        if watch.attached.is_empty() {
            return Err(ForwardError::NoDevice(config.devices.iter().map(|(d, _)| d.clone()).collect()));
        }
        Ok(watch)
    }

    fn classifier(&mut self, program: &'static str) -> Result<&mut SchedClassifier, ForwardError> {
        self.bpf
            .program_mut(program)
            .ok_or(ForwardError::Missing(program))?
            .try_into()
            .map_err(|e| ForwardError::Program { program, source: Box::new(e) })
    }

    /// Attach to the configured devices that were missing and exist now (a `tunl0` created by
    /// Felix after the agent started). Returns the devices attached by this call.
    ///
    /// # Errors
    /// [`ForwardError::Attach`] for the first existing device that refuses the attach (it
    /// stays in the missing list and is tried again next time).
    pub fn attach_missing(&mut self) -> Result<Vec<AttachedDevice>, ForwardError> {
        let tcx = has_tcx();
        let mut newly = Vec::new();
        let pending = std::mem::take(&mut self.missing);
        let mut result = Ok(());
        for (dev, role) in pending {
            if result.is_err() || !device_exists(&dev) {
                self.missing.push((dev, role));
                continue;
            }
            match self.attach_one(&dev, role, tcx) {
                Ok(mode) => {
                    let a = AttachedDevice { name: dev, role, mode };
                    self.attached.push(a.clone());
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

    fn attach_one(&mut self, dev: &str, role: DeviceRole, tcx: bool) -> Result<&'static str, ForwardError> {
        let program = role.program();
        let prog = self.classifier(program)?;
        let attach_err = |mode, e| ForwardError::Attach { program, iface: dev.to_string(), mode, source: Box::new(e) };
        if tcx {
            // First on the hook, so a program returning TC_ACT_OK after us cannot hide packets.
            match prog.attach_with_options(dev, TcAttachType::Egress, TcAttachOptions::TcxOrder(LinkOrder::first())) {
                Ok(_) => Ok("tcx"),
                Err(first_err) => {
                    tracing::info!(device = dev, error = %first_err, "forwarding watch: cannot attach first on the TCX hook; appending");
                    prog.attach_with_options(dev, TcAttachType::Egress, TcAttachOptions::TcxOrder(LinkOrder::default()))
                        .map(|_| "tcx")
                        .map_err(|e| attach_err("tcx", e))
                }
            }
        } else {
            // EEXIST when Calico/Cilium (or we) already added it.
            let _ = tc::qdisc_add_clsact(dev);
            prog.attach_with_options(dev, TcAttachType::Egress, TcAttachOptions::Netlink(NlOptions::default()))
                .map(|_| "clsact")
                .map_err(|e| attach_err("clsact", e))
        }
    }

    /// Kernel program ids of the two classifiers (`tc_forward_tunnel`, `tc_forward_host`), for
    /// `bpftool prog show id N` / `bpftool prog run id N` (per-packet cost measurements).
    ///
    /// # Errors
    /// [`ForwardError::Program`] if the kernel cannot describe a program.
    pub fn program_ids(&self) -> Result<Vec<(&'static str, u32)>, ForwardError> {
        [PROG_TC_FORWARD_TUNNEL, PROG_TC_FORWARD_HOST]
            .into_iter()
            .map(|name| {
                let prog: &SchedClassifier =
                    self.bpf.program(name).ok_or(ForwardError::Missing(name))?.try_into().map_err(|e| ForwardError::Program { program: name, source: Box::new(e) })?;
                let info = prog.info().map_err(|e| ForwardError::Program { program: name, source: Box::new(e) })?;
                Ok((name, info.id()))
            })
            .collect()
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
    /// [`ForwardError::Map`] if a map cannot be opened or the filter cannot be written;
    /// destination write failures are per entry.
    pub fn set_destinations(&mut self, entries: &[ForwardEntry]) -> Result<DestinationsUpdate, ForwardError> {
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
            let map = self.bpf.map_mut(FORWARD_TARGETS_V4_MAP).ok_or(ForwardError::Missing(FORWARD_TARGETS_V4_MAP))?;
            let mut v4 = BpfHashMap::try_from(map).map_err(map_err(FORWARD_TARGETS_V4_MAP, "open"))?;
            sync_targets(&mut v4, key_v4, phase, &want, &mut self.installed, &mut update);
            let map = self.bpf.map_mut(FORWARD_TARGETS_V6_MAP).ok_or(ForwardError::Missing(FORWARD_TARGETS_V6_MAP))?;
            let mut v6 = BpfHashMap::try_from(map).map_err(map_err(FORWARD_TARGETS_V6_MAP, "open"))?;
            sync_targets(&mut v6, key_v6, phase, &want, &mut self.installed, &mut update);
        }
        update.total = self.installed.len();
        Ok(update)
    }

    /// Write `filter` into the idle slot of `FORWARD_POOLS`, then make that slot live.
    fn switch_filter(&mut self, filter: &PoolFilter) -> Result<(), ForwardError> {
        let idle = self.filter_slot ^ 1;
        let map = self.bpf.map_mut(FORWARD_POOLS_MAP).ok_or(ForwardError::Missing(FORWARD_POOLS_MAP))?;
        let mut slots: Array<&mut MapData, PoolFilter> = Array::try_from(map).map_err(map_err(FORWARD_POOLS_MAP, "open"))?;
        slots.set(idle, filter, 0).map_err(map_err(FORWARD_POOLS_MAP, "write"))?;
        let map = self.bpf.map_mut(FORWARD_POOLS_ACTIVE_MAP).ok_or(ForwardError::Missing(FORWARD_POOLS_ACTIVE_MAP))?;
        let mut active: Array<&mut MapData, u32> = Array::try_from(map).map_err(map_err(FORWARD_POOLS_ACTIVE_MAP, "open"))?;
        active.set(0, idle, 0).map_err(map_err(FORWARD_POOLS_ACTIVE_MAP, "write"))?;
        self.filter = *filter;
        self.filter_slot = idle;
        Ok(())
    }

    /// Sum over CPUs of every counter of the pools known so far.
    ///
    /// # Errors
    /// [`ForwardError::Map`] if a counter map cannot be read.
    pub fn counts(&self) -> Result<ForwardCounts, ForwardError> {
        let pools = self.pools.read().unwrap_or_else(std::sync::PoisonError::into_inner).names.clone();
        let counters_map = self.bpf.map(FORWARD_COUNTERS_MAP).ok_or(ForwardError::Missing(FORWARD_COUNTERS_MAP))?;
        let counters: PerCpuArray<&MapData, ForwardCounters> =
            PerCpuArray::try_from(counters_map).map_err(map_err(FORWARD_COUNTERS_MAP, "open"))?;
        let flaps_map = self.bpf.map(FORWARD_FLAPS_MAP).ok_or(ForwardError::Missing(FORWARD_FLAPS_MAP))?;
        let flaps: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(flaps_map).map_err(map_err(FORWARD_FLAPS_MAP, "open"))?;
        let stats_map = self.bpf.map(FORWARD_STATS_MAP).ok_or(ForwardError::Missing(FORWARD_STATS_MAP))?;
        let stats: PerCpuArray<&MapData, ForwardStats> = PerCpuArray::try_from(stats_map).map_err(map_err(FORWARD_STATS_MAP, "open"))?;

        let mut out = ForwardCounts { pools: pools.clone(), ..ForwardCounts::default() };
        for (id, _) in (0u16..).zip(&pools) {
            for expected in ForwardPath::ALL {
                for obs in Observation::ALL {
                    let Some(i) = counter_index(id, expected as u8, obs as u8) else { continue };
                    let per_cpu = counters.get(&i, 0).map_err(map_err(FORWARD_COUNTERS_MAP, "read"))?;
                    let sum = per_cpu.iter().fold(ForwardCounters::default(), |a, v| ForwardCounters {
                        packets: a.packets + v.packets,
                        bytes: a.bytes + v.bytes,
                    });
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
    /// [`ForwardError::ReaderTaken`] on a second call; [`ForwardError::Poll`] if the ring
    /// buffer cannot be registered with the runtime.
    pub fn spawn_reader(&mut self, tx: mpsc::Sender<ForwardEvent>) -> Result<tokio::task::JoinHandle<()>, ForwardError> {
        let map = self.bpf.take_map(FORWARD_EVENTS_MAP).ok_or(ForwardError::ReaderTaken)?;
        let ring = RingBuf::try_from(map).map_err(map_err(FORWARD_EVENTS_MAP, "open"))?;
        // SAFETY: the RingBuf owns its map fd for its whole life and always returns that fd;
        // the AsyncFd owns the RingBuf, so the fd outlives the registration.
        let fd = unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }.map_err(|e| ForwardError::Poll(e.into()))?;
        let pools = self.pools.clone();
        Ok(tokio::spawn(read_ring(fd, pools, tx)))
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

/// The app's handler for the watch: owns the [`ForwardWatch`] (if it started), its metric
/// state and the event receiver. Never fails: a watch that cannot start is reported degraded
/// in `/readyz` and the handler does nothing.
pub struct ForwardHandler {
    watch: Option<ForwardWatch>,
    metrics_state: ForwardMetrics,
    events: Option<mpsc::Receiver<ForwardEvent>>,
    reader: Option<tokio::task::JoinHandle<()>>,
    last_entries: Vec<ForwardEntry>,
    /// Pools whose series are declared: a pool that leaves the plan has its series removed.
    declared: BTreeSet<String>,
}

impl std::fmt::Debug for ForwardHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForwardHandler").field("watch", &self.watch).finish_non_exhaustive()
    }
}

impl ForwardHandler {
    /// Start the watch with the embedded object in the calling thread's namespace (must run
    /// inside a tokio runtime: the ring-buffer reader is a task).
    pub fn start(config: &ForwardConfig, metrics: &Metrics, health: &crate::observe::Health) -> ForwardHandler {
        let labels = crate::observe::metrics::ProgramLabels { program: WATCHER_NAME };
        let started = crate::bpf::embedded_object()
            .ok_or(ForwardError::NoObject)
            .and_then(|obj| ForwardWatch::start(obj, config))
            .and_then(|mut w| {
                let (tx, rx) = mpsc::channel(1024);
                let reader = w.spawn_reader(tx)?;
                Ok((w, rx, reader))
            });
        match started {
            Ok((watch, rx, reader)) => {
                tracing::info!(attached = ?watch.attached(), missing = ?watch.missing(), "forwarding watch running (TC egress)");
                metrics.bpf_program_attached.get_or_create(&labels).set(1);
                health.set_watcher(WATCHER_NAME, crate::observe::WatcherState::Ready);
                ForwardHandler {
                    metrics_state: ForwardMetrics::new(watch.tunnel_watched()),
                    watch: Some(watch),
                    events: Some(rx),
                    reader: Some(reader),
                    last_entries: Vec::new(),
                    declared: BTreeSet::new(),
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "forwarding watch not running; routes are still programmed");
                metrics.bpf_program_attached.get_or_create(&labels).set(0);
                health.set_watcher(WATCHER_NAME, crate::observe::WatcherState::Degraded(e.to_string()));
                ForwardHandler {
                    watch: None,
                    metrics_state: ForwardMetrics::new(false),
                    events: None,
                    reader: None,
                    last_entries: Vec::new(),
                    declared: BTreeSet::new(),
                }
            }
        }
    }

    /// A new plan: bring the trie in step (diffed; nothing written when the entries did not
    /// change) and declare the new series at 0.
    pub fn on_plan(&mut self, plan: &crate::app::plan::Plan, metrics: &Metrics) {
        let Some(watch) = self.watch.as_mut() else { return };
        let entries = entries_from_plan(plan);
        if entries == self.last_entries {
            return;
        }
        match watch.set_destinations(&entries) {
            Ok(up) => {
                if up.inserted + up.updated + up.removed > 0 {
                    tracing::info!(inserted = up.inserted, updated = up.updated, removed = up.removed, total = up.total, "forwarding watch destinations updated");
                }
                for (prefix, why) in up.failed.iter().take(10) {
                    tracing::warn!(%prefix, error = %why, "forwarding watch: destination not written; retried on the next plan");
                }
                if up.failed.is_empty() {
                    self.last_entries.clone_from(&entries);
                } else {
                    self.last_entries.clear();
                }
            }
            Err(e) => tracing::warn!(error = %e, "forwarding watch: updating destinations failed"),
        }
        ForwardMetrics::declare(metrics, &entries);
        let pools: BTreeSet<String> = entries.iter().map(|e| e.pool.clone()).collect();
        for gone in self.declared.difference(&pools) {
            ForwardMetrics::forget(metrics, gone);
        }
        self.declared = pools;
    }

    /// Timer: attach devices that appeared, read the counters into the metrics.
    pub fn poll(&mut self, metrics: &Metrics) {
        let Some(watch) = self.watch.as_mut() else { return };
        if !watch.missing().is_empty() {
            match watch.attach_missing() {
                Ok(newly) if !newly.is_empty() => {
                    tracing::info!(attached = ?newly, "forwarding watch attached to devices that appeared");
                    self.metrics_state.set_tunnel_watched(watch.tunnel_watched());
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "forwarding watch: attaching a device failed"),
            }
        }
        match watch.counts() {
            Ok(c) => self.metrics_state.apply(metrics, &c),
            Err(e) => tracing::warn!(error = %e, "forwarding watch: reading counters failed"),
        }
    }

    /// The next wrong-path sample or flap; pending forever when the watch is not running (for
    /// `tokio::select!`).
    pub async fn next_event(&mut self) -> Option<ForwardEvent> {
        if let Some(rx) = self.events.as_mut() {
            if let Some(ev) = rx.recv().await {
                return Some(ev);
            }
            tracing::warn!("forwarding watch: the ring-buffer reader stopped; counters still work, samples and flap events do not");
            self.events = None;
        }
        std::future::pending().await
    }
}

impl Drop for ForwardHandler {
    fn drop(&mut self) {
        if let Some(r) = self.reader.take() {
            r.abort();
        }
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
        self.slots.iter().filter(|((p, _, o), _)| *p == id && *o == obs).fold(ForwardCounters::default(), |a, (_, v)| {
            ForwardCounters { packets: a.packets + v.packets, bytes: a.bytes + v.bytes }
        })
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

    /// Create every series the entries can produce at 0, so an alert's `increase()` sees the
    /// first wrong-path packet or flap (a series born at 1 has no increase in Prometheus).
    pub fn declare(metrics: &Metrics, entries: &[ForwardEntry]) {
        for e in entries {
            for path in [ForwardPath::Tunnel, ForwardPath::Host] {
                let labels = ForwardPathLabels { pool: e.pool.clone(), path: path.label() };
                let _ = metrics.forwarded_packets.get_or_create(&labels);
                let _ = metrics.forwarded_bytes.get_or_create(&labels);
                if path != e.expected {
                    let _ = metrics.wrong_path_packets.get_or_create(&WrongPathLabels {
                        pool: e.pool.clone(),
                        expected: e.expected.label(),
                        actual: path.label(),
                    });
                }
            }
            let _ = metrics.forwarding_flaps.get_or_create(&PoolLabels { pool: e.pool.clone() });
        }
    }

    /// Remove every series of `pool` (a pool deleted from the cluster must not leave its
    /// series behind: 300 deleted pools were 1,800 series).
    pub fn forget(metrics: &Metrics, pool: &str) {
        for path in [ForwardPath::Tunnel, ForwardPath::Host] {
            let labels = ForwardPathLabels { pool: pool.to_owned(), path: path.label() };
            metrics.forwarded_packets.remove(&labels);
            metrics.forwarded_bytes.remove(&labels);
            for expected in [ForwardPath::Tunnel, ForwardPath::Host, ForwardPath::Local] {
                metrics.wrong_path_packets.remove(&WrongPathLabels { pool: pool.to_owned(), expected: expected.label(), actual: path.label() });
            }
        }
        metrics.forwarding_flaps.remove(&PoolLabels { pool: pool.to_owned() });
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
            let (dp, db) = (v.packets.saturating_sub(before.packets), v.bytes.saturating_sub(before.bytes));
            if dp == 0 && db == 0 {
                continue;
            }
            let actual = obs.path();
            let labels = ForwardPathLabels { pool: pool.clone(), path: actual.label() };
            metrics.forwarded_packets.get_or_create(&labels).inc_by(dp);
            metrics.forwarded_bytes.get_or_create(&labels).inc_by(db);
            if actual != expected {
                metrics
                    .wrong_path_packets
                    .get_or_create(&WrongPathLabels { pool: pool.clone(), expected: expected.label(), actual: actual.label() })
                    .inc_by(dp);
            }
        }
        for (&id, &n) in &now.flaps {
            let Some(pool) = now.pools.get(usize::from(id)) else { continue };
            let d = n.saturating_sub(self.last.flaps.get(&id).copied().unwrap_or(0));
            if d > 0 {
                metrics.forwarding_flaps.get_or_create(&PoolLabels { pool: pool.clone() }).inc_by(d);
            }
        }
        metrics.forwarding_events_lost.inc_by(now.stats.events_lost.saturating_sub(self.last.stats.events_lost));
        self.last = now.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let wrong = |pool: &str, e, a| {
            metrics.wrong_path_packets.get_or_create(&WrongPathLabels { pool: pool.into(), expected: e, actual: a }).get()
        };
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
        assert_eq!(
            metrics.wrong_path_packets.get_or_create(&WrongPathLabels { pool: "ipip".into(), expected: "host", actual: "tunnel" }).get(),
            5
        );
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
        assert!(matches!(ForwardWatch::start(&[], &ForwardConfig::for_devices(&[], &["eth0".into()])), Err(ForwardError::NoObject)));
    }
}
