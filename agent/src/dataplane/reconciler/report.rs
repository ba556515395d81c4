//! [`ApplyReport`]: what one reconciler apply did, as plain data (the app turns it into
//! metrics and logs), with its parts: [`ErrorKind`] (the fixed, label-safe error kinds),
//! [`Conflict`], [`Overwrite`] and the per-class [`ClassCount`].

use std::collections::BTreeMap;
use std::time::Duration;

use nix::errno::Errno;
use serde::Serialize;

use crate::dataplane::kernel::netlink::NetlinkError;
use crate::dataplane::kernel::route::{Family, RouteKey};
use crate::dataplane::reconciler::handover::HandoverOutcome;
use crate::ownership::Verdict;
use crate::vocabulary::{PoolClass, RoutePath};

/// Error kinds counted in [`ApplyReport::errors`]: fixed, label-safe values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorKind {
    /// A dump came back `NLM_F_DUMP_INTR` more than the retry budget allows.
    DumpInterrupted,
    /// `EEXIST` on create: a route we do not own holds the key.
    ForeignRouteAtKey,
    /// The route's device does not exist (by name) or vanished (`ENODEV`).
    NoDevice,
    /// The route's device is down (`ENETDOWN`).
    DeviceDown,
    /// `ENETUNREACH`: the gateway is not reachable (or the device has no carrier).
    NetUnreachable,
    /// No answer within the netlink timeout.
    Timeout,
    /// `EPERM`/`EACCES`.
    Permission,
    /// `EINVAL` and friends: the kernel refused the route.
    Invalid,
    /// A desired cluster route that cannot be converted (no gateway, family mismatch).
    BadDesiredRoute,
    /// Anything else (connection lost, other errno).
    Other,
}

impl ErrorKind {
    /// Every kind, in the enum's order (the `kind` label values of
    /// `routewarden_netlink_errors_total`, declared at 0 from the start).
    pub const ALL: [ErrorKind; 10] = [
        ErrorKind::DumpInterrupted,
        ErrorKind::ForeignRouteAtKey,
        ErrorKind::NoDevice,
        ErrorKind::DeviceDown,
        ErrorKind::NetUnreachable,
        ErrorKind::Timeout,
        ErrorKind::Permission,
        ErrorKind::Invalid,
        ErrorKind::BadDesiredRoute,
        ErrorKind::Other,
    ];

    /// Stable label value.
    pub fn label(self) -> &'static str {
        match self {
            ErrorKind::DumpInterrupted => "dump-interrupted",
            ErrorKind::ForeignRouteAtKey => "foreign-route-at-key",
            ErrorKind::NoDevice => "no-device",
            ErrorKind::DeviceDown => "device-down",
            ErrorKind::NetUnreachable => "net-unreachable",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Permission => "permission",
            ErrorKind::Invalid => "invalid",
            ErrorKind::BadDesiredRoute => "bad-desired-route",
            ErrorKind::Other => "other",
        }
    }

    /// The kind of a netlink failure (the errno decides).
    pub(super) fn of(e: &NetlinkError) -> ErrorKind {
        match e {
            NetlinkError::DumpInterrupted { .. } => ErrorKind::DumpInterrupted,
            NetlinkError::Timeout { .. } => ErrorKind::Timeout,
            NetlinkError::Connection { .. } => ErrorKind::Other,
            NetlinkError::Kernel { errno, .. } => match *errno {
                Errno::EEXIST => ErrorKind::ForeignRouteAtKey,
                Errno::ENODEV => ErrorKind::NoDevice,
                Errno::ENETDOWN => ErrorKind::DeviceDown,
                Errno::ENETUNREACH | Errno::EHOSTUNREACH => ErrorKind::NetUnreachable,
                Errno::EPERM | Errno::EACCES => ErrorKind::Permission,
                Errno::EINVAL | Errno::ERANGE | Errno::EAFNOSUPPORT | Errno::EOPNOTSUPP => ErrorKind::Invalid,
                _ => ErrorKind::Other,
            },
        }
    }
}

/// A key we want but a route we do not own holds (reported, never overwritten).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Conflict {
    /// The contested key.
    pub key: RouteKey,
    /// The route we wanted there.
    pub wanted: String,
}

/// A foreign-protocol route we overwrote because the policy claims it (e.g. a BIRD leftover on
/// the tunnel device inside an IPIP pool we own). Always reported (scenario S12).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Overwrite {
    /// The route that was there (`ip route` form).
    pub previous: String,
    /// Why it was ours to overwrite.
    pub verdict: Verdict,
}

/// Per class and path: how many routes are desired and how many are in the kernel as desired.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ClassCount {
    /// Desired routes.
    pub desired: usize,
    /// Desired routes present in the kernel with the desired attributes.
    pub programmed: usize,
    /// Desired routes whose key holds another writer's route that we may not overwrite
    /// (create-exclusive refused): another component programs what we were told to.
    pub held: usize,
}

/// What one [`Reconciler::apply`](crate::dataplane::reconciler::Reconciler::apply) did. Plain data: the app
/// turns it into metrics and logs.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ApplyReport {
    /// A full resync (dump) ran.
    pub resynced: bool,
    /// The resync failed (apply stopped there).
    pub resync_failed: bool,
    /// Routes written (replace or create) successfully.
    pub writes: u64,
    /// Nexthop objects written (created or replaced in place).
    pub nexthop_writes: u64,
    /// Nexthop objects of ours deleted (no route used them).
    pub nexthop_deletes: u64,
    /// Nexthop object writes that failed (their routes go in classic meanwhile).
    pub nexthop_write_errors: u64,
    /// Nexthop object deletes that failed.
    pub nexthop_delete_errors: u64,
    /// Routes deleted successfully.
    pub deletes: u64,
    /// Deletes answered `ESRCH` (already gone, or replaced by another writer meanwhile).
    pub deletes_already_gone: u64,
    /// Failed writes, deletes and dumps by kind.
    pub errors: BTreeMap<ErrorKind, u64>,
    /// How many `SetDesired` commands the driver ([`run`](crate::dataplane::tasks::driver::run)) had folded in
    /// before this apply (0: the apply ran on the kernel view alone, before any desired set
    /// arrived).
    pub desired_sets: u64,
    /// Route writes (replace or create) the kernel refused in this apply.
    pub write_errors: u64,
    /// Route deletes the kernel refused in this apply (`ESRCH` is not an error).
    pub delete_errors: u64,
    /// Deletes held back because the datastore view is not synced (scenario S10), an input
    /// never loaded, or this node's Node is missing.
    pub deletes_deferred_unsynced: usize,
    /// Deletes held back because their prefix is in frozen ground (a broken object or input
    /// mentions it, or an invalid IP pool covers it).
    pub deletes_deferred_frozen: usize,
    /// Routes in the kernel at a desired key, not as desired, left as they are because an
    /// input never loaded or cannot be read ([`OwnershipPolicy::hold_rewrites`](crate::dataplane::OwnershipPolicy::hold_rewrites)).
    pub rewrites_held: usize,
    /// Deletes held back by the mass-deletion breaker in this apply.
    pub deletes_held_mass: usize,
    /// The breaker is holding deletes: (deletes wanted, routes of ours) when it engaged.
    pub mass_deletion: Option<(usize, usize)>,
    /// Deletes held back during a handover grace period.
    pub deletes_deferred_handover: usize,
    /// Desired routes waiting for their device (missing or down).
    pub waiting_for_device: BTreeMap<String, usize>,
    /// Nexthop objects not written because their device, up, has no carrier (device name →
    /// objects): the kernel refuses them (`ENETDOWN`) while classic routes stay, so their
    /// routes are classic until the carrier comes. Not an error.
    pub nexthops_waiting_for_carrier: BTreeMap<String, usize>,
    /// Keys found held by a route we do not own in this apply (each reported once per hold;
    /// `ClassCount::held` counts them every apply).
    pub conflicts: Vec<Conflict>,
    /// Foreign routes overwritten by claim.
    pub overwrote: Vec<Overwrite>,
    /// Handovers that finished.
    pub handovers: Vec<HandoverOutcome>,
    /// Per class, per path counts (after this apply).
    pub by_class: BTreeMap<(Family, PoolClass, RoutePath), ClassCount>,
    /// Routes of ours in the kernel (after this apply).
    pub kernel_routes: usize,
    /// Keys still not converged (will be retried).
    pub pending: usize,
    /// Duration of the resync dump, if one ran.
    #[serde(with = "opt_secs")]
    pub resync_duration: Option<Duration>,
    /// Wall time of the whole apply.
    #[serde(with = "crate::dataplane::reconciler::handover::secs_f64")]
    pub duration: Duration,
    /// Human-readable error messages of this apply (at most 20; counts are in `errors`).
    pub error_messages: Vec<String>,
}

mod opt_secs {
    use std::time::Duration;
    #[expect(clippy::ref_option, reason = "serde's `with` passes a reference to the field")]
    pub fn serialize<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&d.as_secs_f64()),
            None => s.serialize_none(),
        }
    }
}

impl ApplyReport {
    /// Count one error of `kind`, keeping its message while fewer than 20 are kept.
    pub(super) fn error(&mut self, kind: ErrorKind, msg: impl FnOnce() -> String) {
        *self.errors.entry(kind).or_default() += 1;
        if self.error_messages.len() < 20 {
            self.error_messages.push(msg());
        }
    }

    /// Total errors of any kind.
    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }
}
