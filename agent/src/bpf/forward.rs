//! The TC forwarding watch: loads `tc_forward_tunnel` / `tc_forward_host` (see
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
//! destination). The kernel keeps both observations apart
//! ([`Observation`](routewarden_common::forward::Observation)); the metrics count the NIC's
//! IPIP observation only when no tunnel device is watched ([`ForwardMetrics`]).
//!
//! The programs and maps come from the process's one load ([`BpfObject`]); the app runs the
//! watch in a [`crate::bpf::watch::WatchHandler`] (it implements [`Watch`]): on every plan
//! [`ForwardWatch::update_destinations`], every second [`Watch::poll`] (attach devices that
//! appeared, counters into metrics), on a host NIC change [`ForwardWatch::set_devices`].
//!
//! Files: this one has the watch, its devices and its [`Watch`] shape; `attach` the attach
//! and detach of devices; `destinations` the destination maps and pool filter in step with
//! the plan; `counts` the counters and their metrics; `reader` the ring-buffer reader;
//! [`entries`] the plan's destinations; [`event`] the records' decoding; [`pools`] the pool
//! filter's ranges.

mod attach;
mod counts;
mod destinations;
pub mod entries;
pub mod event;
pub mod pools;
mod reader;
pub(crate) mod settings;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use aya::programs::tc::SchedClassifierLink;

use crate::bpf::loader::{classifier, BpfObject, LoadConfig, TakenMaps};
use crate::bpf::watch::Watch;
use crate::bpf::BpfError;
use ipnet::IpNet;
use routewarden_common::forward::{
    ForwardTarget, PoolFilter, FORWARD_COUNTERS_MAP, FORWARD_EVENTS_MAP, FORWARD_FLAPS_MAP, FORWARD_POOLS_ACTIVE_MAP, FORWARD_POOLS_MAP, FORWARD_STATS_MAP,
    FORWARD_TARGETS_V4_MAP, FORWARD_TARGETS_V6_MAP, MAX_POOLS, PROG_TC_FORWARD_HOST, PROG_TC_FORWARD_TUNNEL,
};
use tokio::sync::mpsc;

use crate::observe::Metrics;
use attach::Attachments;
pub use counts::{ForwardCounts, ForwardMetrics};
pub use destinations::DestinationsUpdate;
pub use entries::{entries_from_routes, EntriesMemo, ForwardEntries, ForwardEntry};
pub use event::{ForwardEvent, ForwardEventKind};
pub use reader::log_event;
pub use settings::{DeviceRole, ForwardConfig};

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
    /// The device's ifindex when the classifier was attached: a device deleted and created
    /// again under the same name (a `tunl0` recreated) has a new one, and the classifier went
    /// with the old device ([`ForwardWatch::reattach_recreated`]).
    pub ifindex: u32,
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
    last_entries: Option<ForwardEntries>,
    /// The last update failed in part or whole: retried on the app's counter tick, since a
    /// snapshot that makes no new plan brings no update.
    destinations_failed: bool,
    /// Pools whose series are declared, with how many entries each has: a pool that leaves
    /// the plan has its series removed.
    declared: BTreeMap<String, usize>,
    /// The entries the series were last declared for.
    declared_from: ForwardEntries,
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
            last_entries: None,
            destinations_failed: false,
            declared: BTreeMap::new(),
            declared_from: ForwardEntries::new(),
        })
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

    /// Follow devices deleted or recreated since, attach devices that appeared, read the
    /// counters into the metrics.
    fn poll(&mut self, metrics: &Metrics) {
        let gone = self.reattach_recreated();
        if !gone.is_empty() {
            tracing::warn!(devices = ?gone, "forwarding watch: watched devices were deleted or created again; attaching to them again");
        }
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

/// Name of the watch in `/readyz` and the `program` label of `routewarden_bpf_program_attached`.
pub const WATCHER_NAME: &str = "tc_forward";

#[cfg(test)]
mod tests {
    use super::*;

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
