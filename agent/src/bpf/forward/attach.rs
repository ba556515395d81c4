//! Attaching the classifiers to egress of the watched devices: TCX first on the hook
//! (clsact otherwise, [`crate::bpf::loader::attach_classifier`]), devices that do not exist yet
//! kept and tried again, devices no longer watched detached.

use aya::programs::tc::SchedClassifierLink;
use aya::programs::TcAttachType;

use super::{AttachedDevice, DeviceRole, ForwardWatch};
use crate::bpf::loader::{attach_classifier, classifier, BpfObject};
use crate::bpf::BpfError;

impl ForwardWatch {
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

    /// Move every attached device whose live ifindex is not the one its classifier was
    /// attached to (deleted, or deleted and created again under its name: its classifier went
    /// with the old device) back to the missing list, dropping the dead link,
    /// so that [`ForwardWatch::attach_missing`] attaches to the device now under the name.
    /// Returns the names moved. One `if_nametoindex` per attached device.
    pub fn reattach_recreated(&mut self) -> Vec<String> {
        let mut moved = Vec::new();
        let mut attached = Vec::new();
        let mut links = Vec::new();
        for (a, link) in std::mem::take(&mut self.attached).into_iter().zip(std::mem::take(&mut self.links)) {
            if nix::net::if_::if_nametoindex(a.name.as_str()).ok() == Some(a.ifindex) {
                attached.push(a);
                links.push(link);
            } else {
                drop(link);
                moved.push(a.name.clone());
                self.missing.push((a.name, a.role));
            }
        }
        (self.attached, self.links) = (attached, links);
        if !moved.is_empty() {
            self.metrics_state.set_tunnel_watched(self.tunnel_watched());
        }
        moved
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
}

/// The attach state of a watch being started or moved: attached devices with their links, and
/// the configured devices not attached yet.
pub(super) struct Attachments {
    pub(super) attached: Vec<AttachedDevice>,
    pub(super) links: Vec<SchedClassifierLink>,
    pub(super) missing: Vec<(String, DeviceRole)>,
}

impl Attachments {
    /// Attach every missing device that exists; the first refusal stops the round (that
    /// device and the rest stay missing) and is returned.
    pub(super) fn attach_missing(&mut self, object: &BpfObject) -> Result<Vec<AttachedDevice>, BpfError> {
        let mut newly = Vec::new();
        let pending = std::mem::take(&mut self.missing);
        let mut result = Ok(());
        for (dev, role) in pending {
            // After a refusal the rest wait for the next round; a device that does not exist
            // (no ifindex) waits until it does.
            let Some(ifindex) = result.is_ok().then(|| nix::net::if_::if_nametoindex(dev.as_str()).ok()).flatten() else {
                self.missing.push((dev, role));
                continue;
            };
            let program = role.program();
            // First on the hook, so a program returning TC_ACT_OK after us cannot hide packets.
            match object.with(|ebpf| attach_classifier(classifier(ebpf, program)?, program, &dev, TcAttachType::Egress, true)) {
                Ok((link, mode)) => {
                    let a = AttachedDevice { name: dev, role, mode, ifindex };
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
