//! The datastore's metrics (`routewarden_datastore_*`): whether the view is current, the
//! inputs and objects that failed to load. Written by the app's cluster handler on every
//! datastore event.

use prometheus_client::encoding::EncodeLabelSet;

use super::{gauge_value, Metrics};
use crate::datastore::{LoadError, Snapshot};

/// Labels `{reason}` of `routewarden_datastore_load_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LoadErrorLabels {
    /// An input failure's code (`datastore::LoadErrorKind::code`: `io`, `syntax`, `empty`,
    /// `too-large`, `not-regular-file`, `vanished`, `watch`, `stale`), or `object` (an object failed
    /// validation).
    pub reason: &'static str,
}

impl Metrics {
    /// `routewarden_datastore_synced`: 1 when the datastore view is complete and current (the
    /// app's view state, which also needs this node's Node and a host NIC), else 0.
    pub fn set_synced(&self, current: bool) {
        self.datastore_synced.set(i64::from(current));
    }

    /// One input failed to load (`DatastoreEvent::LoadFailed`):
    /// `routewarden_datastore_load_errors_total{reason=<its code>}` + 1.
    pub fn record_load_failed(&self, error: &LoadError) {
        self.count_load_errors(error.code(), 1);
    }

    /// A snapshot: `routewarden_datastore_invalid_objects` and `_invalid_inputs` are set to its
    /// object and input errors, and every object error counts once more in
    /// `routewarden_datastore_load_errors_total{reason="object"}` (once per snapshot it is in).
    pub fn record_snapshot(&self, snap: &Snapshot) {
        self.datastore_invalid_objects.set(gauge_value(snap.object_errors.len()));
        self.datastore_invalid_inputs.set(gauge_value(snap.load_errors.len()));
        if !snap.object_errors.is_empty() {
            self.count_load_errors("object", snap.object_errors.len() as u64);
        }
    }

    fn count_load_errors(&self, reason: &'static str, n: u64) {
        self.datastore_load_errors.get_or_create(&LoadErrorLabels { reason }).inc_by(n);
    }
}
