//! Loads `tc_count` (see `ebpf/src/tc_count.rs`) onto devices and reads its counters.
//!
//! Attach: TCX links on kernels >= 6.6 (multi-program, ordered), clsact + netlink filter
//! otherwise (aya picks). The program returns `TC_ACT_UNSPEC`/`TCX_NEXT`, so other programs
//! on the same hook still run.

use aya::maps::PerCpuArray;
use aya::programs::{tc, SchedClassifier, TcAttachType};
use aya::Ebpf;
use routewarden_common::{TcCounters, TC_COUNTERS_MAP, TC_COUNT_PROGRAM};

use super::BpfError;

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

/// The `tc_count` program loaded from `object` and attached to each of `devices`.
///
/// One instance holds one loaded copy of the object, so its counter map counts the packets of
/// all the devices it is attached to. Dropping it detaches the program.
pub struct TcCounter {
    bpf: Ebpf,
    devices: Vec<String>,
}

impl std::fmt::Debug for TcCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcCounter").field("devices", &self.devices).finish_non_exhaustive()
    }
}

impl TcCounter {
    /// Load the object and attach `tc_count` to `direction` of every device in `devices`, in
    /// the calling thread's network namespace.
    ///
    /// # Errors
    /// [`BpfError::Load`] if the object does not load; [`BpfError::Attach`] naming the device
    /// that failed (devices attached before it are detached again on drop).
    pub fn attach(object: &[u8], devices: &[String], direction: Direction) -> Result<Self, BpfError> {
        // tc_count logs nothing; its copy of the object's log level is off all the same.
        let mut loader = aya::EbpfLoader::new();
        crate::bpf::bpf_log::BpfLogLevel::Off.apply(&mut loader);
        let mut bpf = loader.load(object).map_err(|e| BpfError::Load { source: Box::new(e) })?;
        let program: &mut SchedClassifier = bpf
            .program_mut(TC_COUNT_PROGRAM)
            .ok_or(BpfError::MissingProgram(TC_COUNT_PROGRAM))?
            .try_into()
            .map_err(|e| BpfError::Program { program: TC_COUNT_PROGRAM, source: Box::new(e) })?;
        program.load().map_err(|e| BpfError::Program { program: TC_COUNT_PROGRAM, source: Box::new(e) })?;
        for dev in devices {
            // Needed only on the netlink (pre-6.6) path; EEXIST when it is already there.
            let has_tcx = aya::util::KernelVersion::current().is_ok_and(|v| v >= aya::util::KernelVersion::new(6, 6, 0));
            if !has_tcx {
                let _ = tc::qdisc_add_clsact(dev);
            }
            program.attach(dev, direction.attach_type()).map_err(|e| BpfError::Attach {
                program: TC_COUNT_PROGRAM,
                iface: dev.clone(),
                direction: direction.label(),
                source: Box::new(e),
            })?;
        }
        Ok(TcCounter { bpf, devices: devices.to_vec() })
    }

    /// The devices the program is attached to.
    pub fn devices(&self) -> &[String] {
        &self.devices
    }

    /// Sum of the per-CPU counters: packets and bytes seen since attach.
    ///
    /// # Errors
    /// [`BpfError::Map`] if the counter map cannot be read.
    pub fn read(&self) -> Result<TcCounters, BpfError> {
        let map = self.bpf.map(TC_COUNTERS_MAP).ok_or(BpfError::MissingMap(TC_COUNTERS_MAP))?;
        let array: PerCpuArray<_, TcCounters> =
            PerCpuArray::try_from(map).map_err(|e| BpfError::Map { map: TC_COUNTERS_MAP, source: Box::new(e) })?;
        let values = array.get(&0, 0).map_err(|e| BpfError::Map { map: TC_COUNTERS_MAP, source: Box::new(e) })?;
        Ok(values.iter().fold(TcCounters::default(), |acc, v| TcCounters {
            packets: acc.packets + v.packets,
            bytes: acc.bytes + v.bytes,
        }))
    }
}
