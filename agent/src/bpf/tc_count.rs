//! Loads `tc_count` (see `ebpf/src/tc_count.rs`) onto devices and reads its counters: the
//! smallest program that proves the chain build → embed → load → attach → read
//! (`agent/tests/privileged/bpf_tc_count.rs`). The agent runs it only with `--tc-count` (off by default:
//! every packet on the host NIC and the tunnel would pay a second classifier).
//!
//! Attach: TCX links on kernels >= 6.6 (multi-program, ordered), clsact + netlink filter
//! otherwise. The program returns `TC_ACT_UNSPEC`/`TCX_NEXT`, so other programs on the same
//! hook still run.

use aya::maps::{MapData, PerCpuArray};
use aya::programs::tc::SchedClassifierLink;
use aya::programs::TcAttachType;
use routewarden_common::{TcCounters, TC_COUNTERS_MAP, TC_COUNT_PROGRAM};

use super::loader::{attach_classifier, classifier, BpfObject, LoadConfig, TakenMaps};
use super::BpfError;
use crate::observe::Metrics;

/// Direction of a TC hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Packets leaving the device.
    Egress,
    /// Packets arriving on the device.
    Ingress,
}

impl Direction {
    fn attach_type(self) -> TcAttachType {
        match self {
            Direction::Egress => TcAttachType::Egress,
            Direction::Ingress => TcAttachType::Ingress,
        }
    }

    /// `egress` or `ingress`.
    pub fn label(self) -> &'static str {
        match self {
            Direction::Egress => "egress",
            Direction::Ingress => "ingress",
        }
    }
}

/// The `tc_count` program of the process's [`BpfObject`], attached to each of `devices`.
///
/// Its counter map counts the packets of all the devices it is attached to. Dropping it
/// detaches the program.
pub struct TcCounter {
    object: BpfObject,
    maps: TakenMaps,
    direction: Direction,
    links: Vec<(String, SchedClassifierLink)>,
    /// Counters at the previous [`crate::bpf::watch::Watch::poll`].
    last: TcCounters,
}

impl std::fmt::Debug for TcCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcCounter").field("devices", &self.devices()).finish_non_exhaustive()
    }
}

impl TcCounter {
    /// Load the object on its own and attach `tc_count` to `direction` of every device in
    /// `devices`, in the calling thread's network namespace (tests, the build-chain smoke test).
    ///
    /// # Errors
    /// As [`BpfObject::load`] and [`TcCounter::attach_in`].
    pub fn attach(object: &'static [u8], devices: &[String], direction: Direction) -> Result<Self, BpfError> {
        // tc_count logs nothing; the object's log level is off.
        let object = BpfObject::load(object, LoadConfig::default())?;
        Self::attach_in(&object, devices, direction)
    }

    /// Attach the `tc_count` program of `object` to `direction` of every device in `devices`
    /// and take its counter map.
    ///
    /// # Errors
    /// [`BpfError::Program`] if the program does not load; [`BpfError::Attach`] naming the
    /// device that failed (devices attached before it are detached again);
    /// [`BpfError::Taken`] when another counter holds the map.
    pub fn attach_in(object: &BpfObject, devices: &[String], direction: Direction) -> Result<Self, BpfError> {
        let links = attach_all(object, devices, direction)?;
        let maps = object.take_maps(&[TC_COUNTERS_MAP])?;
        Ok(TcCounter { object: object.clone(), maps, direction, links, last: TcCounters::default() })
    }

    /// Attach to `devices` instead (the host NIC changed). The old links are dropped
    /// (detached) first, so a device in both lists never runs the program twice; on error
    /// nothing is attached until the next call.
    ///
    /// # Errors
    /// As [`TcCounter::attach_in`].
    pub fn set_devices(&mut self, devices: &[String]) -> Result<(), BpfError> {
        if self.devices() == devices {
            return Ok(());
        }
        self.links.clear();
        self.links = attach_all(&self.object, devices, self.direction)?;
        Ok(())
    }

    /// The devices the program is attached to.
    pub fn devices(&self) -> Vec<String> {
        self.links.iter().map(|(d, _)| d.clone()).collect()
    }

    /// Sum of the per-CPU counters: packets and bytes seen since attach.
    ///
    /// # Errors
    /// [`BpfError::Map`] if the counter map cannot be read.
    pub fn read(&self) -> Result<TcCounters, BpfError> {
        let map = self.maps.map(TC_COUNTERS_MAP)?;
        let array: PerCpuArray<&MapData, TcCounters> = PerCpuArray::try_from(map).map_err(BpfError::map(TC_COUNTERS_MAP, "open"))?;
        let values = array.get(&0, 0).map_err(BpfError::map(TC_COUNTERS_MAP, "read"))?;
        Ok(values.iter().fold(TcCounters::default(), |acc, v| TcCounters { packets: acc.packets + v.packets, bytes: acc.bytes + v.bytes }))
    }
}

fn attach_all(object: &BpfObject, devices: &[String], direction: Direction) -> Result<Vec<(String, SchedClassifierLink)>, BpfError> {
    object.with(|ebpf| {
        let prog = classifier(ebpf, TC_COUNT_PROGRAM)?;
        let mut links = Vec::new();
        for dev in devices {
            let (link, _mode) = attach_classifier(prog, TC_COUNT_PROGRAM, dev, direction.attach_type(), false)?;
            links.push((dev.clone(), link));
        }
        Ok(links)
    })
}

impl super::watch::Watch for TcCounter {
    type Event = ();
    const NAME: &'static str = TC_COUNT_PROGRAM;
    const DEGRADED: &'static str = "TC probe not running; routes are still programmed";

    fn spawn_reader(&mut self, _tx: tokio::sync::mpsc::Sender<()>) -> Result<Option<tokio::task::JoinHandle<()>>, BpfError> {
        Ok(None)
    }

    fn on_started(&mut self, _metrics: &Metrics) {
        tracing::info!(program = TC_COUNT_PROGRAM, devices = ?self.devices(), "TC probe attached (egress)");
    }

    fn poll(&mut self, metrics: &Metrics) {
        match self.read() {
            Ok(now) => {
                metrics.record_tc_count(now.packets.saturating_sub(self.last.packets), now.bytes.saturating_sub(self.last.bytes));
                self.last = now;
            }
            Err(e) => tracing::warn!(error = %e, "reading tc_count counters"),
        }
    }
}
