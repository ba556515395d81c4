//! The apply-report handler: each [`ApplyReport`] from the dataplane task becomes metrics
//! ([`Metrics::record_apply`]), log lines (transitions of the mass-deletion breaker, writes,
//! errors, routes held by another writer, devices waited for) and readiness.

use std::time::Duration;

use tracing::{info, warn};

use crate::dataplane::ApplyReport;
use crate::observe::{Health, Metrics, StatusBoard};

/// What the report handler remembers between applies (to log transitions, not every apply).
#[derive(Default)]
pub(super) struct ReportLog {
    /// The breaker held deletes in the previous apply.
    mass_held: bool,
}

pub(super) fn record_report(
    metrics: &Metrics,
    health: &Health,
    status: &StatusBoard,
    report: &ApplyReport,
    log: &mut ReportLog,
    percent: u8,
    settle: Duration,
) {
    metrics.record_apply(report);
    status.set_routes(report);
    match report.mass_deletion {
        Some((wanted, ours)) if !log.mass_held => {
            warn!(
                wanted,
                ours,
                held = report.deletes_held_mass,
                threshold_percent = percent,
                settle_s = settle.as_secs(),
                "mass deletion held: this change would delete more than the threshold of our routes at once; each delete goes out once it has stayed wanted for the settle period"
            );
            metrics.record_mass_deletion_hold();
            log.mass_held = true;
        }
        None if log.mass_held => {
            info!("mass deletion released: no route deletion is held by the breaker any more");
            log.mass_held = false;
        }
        _ => {}
    }
    if report.writes + report.deletes + report.nexthop_writes + report.nexthop_deletes > 0 || !report.errors.is_empty() {
        info!(
            writes = report.writes,
            deletes = report.deletes,
            nexthop_writes = report.nexthop_writes,
            nexthop_deletes = report.nexthop_deletes,
            errors = report.errors.values().sum::<u64>(),
            pending = report.pending,
            kernel_routes = report.kernel_routes,
            duration_ms = u64::try_from(report.duration.as_millis()).unwrap_or(u64::MAX),
            "routes applied"
        );
    }
    for m in &report.error_messages {
        warn!("{m}");
    }
    for c in &report.conflicts {
        warn!(key = ?c.key, wanted = %c.wanted, "a route we do not own holds this key; not overwriting it");
    }
    for o in &report.overwrote {
        warn!(previous = %o.previous, verdict = ?o.verdict, "overwrote a route the ownership policy claims");
    }
    for (dev, n) in &report.waiting_for_device {
        warn!(device = %dev, routes = n, "device missing or down; routes wait for it");
    }
    for (dev, n) in &report.nexthops_waiting_for_carrier {
        info!(device = %dev, nexthop_objects = n, "device has no carrier; its nexthop objects wait for it and their routes stay classic");
    }
    health.set_waiting_devices(&report.waiting_for_device);
    // Ready only once an apply has run with the datastore's routes in it: the driver's first
    // apply (kernel view only) may come before the first desired set.
    if !report.resync_failed && report.desired_sets > 0 {
        health.set_first_apply_done();
    }
}
