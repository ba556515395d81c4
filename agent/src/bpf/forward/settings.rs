//! The forwarding watch's settings ([`ForwardConfig`]) and device roles ([`DeviceRole`]): what
//! the one BPF load ([`crate::bpf::loader`]) takes its globals from, apart from the watch
//! that runs on them.

use std::time::Duration;

use routewarden_common::forward::{PROG_TC_FORWARD_HOST, PROG_TC_FORWARD_TUNNEL};

use crate::bpf::bpf_log::BpfLogLevel;

/// What a watched device is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceRole {
    /// An IPIP tunnel device (`tunl0`): `tc_forward_tunnel`.
    Tunnel,
    /// A host NIC (`eth0`): `tc_forward_host`.
    HostNic,
}

impl DeviceRole {
    pub(super) fn program(self) -> &'static str {
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
