//! The dataplane's driver, [`run`]: the task that drives a [`Reconciler`] from [`DataplaneCommand`]s, netlink
//! [`DataplaneEvent`]s and its own timers, and hands every apply's [`ApplyReport`] on.

use std::time::Duration;

use tokio::sync::mpsc;

use crate::dataplane::kernel::netlink::{Clock, RouteNetlink};
use crate::dataplane::kernel::watcher::DataplaneEvent;
use crate::dataplane::reconciler::handover::Handover;
use crate::dataplane::reconciler::report::ApplyReport;
use crate::dataplane::reconciler::Reconciler;
use crate::ownership::OwnershipPolicy;
use crate::routes::RouteMap;

/// Instructions for [`run`].
#[derive(Clone, Debug)]
pub enum DataplaneCommand {
    /// The complete desired route set, and the classes being handed to another writer.
    SetDesired {
        /// Every cluster route routewarden should program, by destination (the plan's map:
        /// a copy shares its chunks, and the reconciler converts only what changed since the
        /// last one, [`Reconciler::set_desired_routes`]).
        routes: RouteMap,
        /// Classes routewarden just stopped programming.
        handovers: Vec<Handover>,
    },
    /// A new ownership policy (after an ownership change).
    SetPolicy(OwnershipPolicy),
    /// Whether the datastore view is complete (no deletes while false).
    SetDatastoreSynced(bool),

    /// Resync with the kernel now.
    Resync,
}

/// Coalescing delay between the first event or command of a burst and the apply.
pub const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(50);

/// Drive `reconciler`: apply after each burst of commands or events (coalesced for
/// `debounce`, measured from the burst's first message so latency stays bounded; the first
/// desired set with the datastore synced at once), on the resync timer, on retry and
/// handover deadlines. Every apply's report goes to `reports` (dropped if the channel is
/// full). Returns when `commands` closes.
pub async fn run<N: RouteNetlink, C: Clock>(
    mut reconciler: Reconciler<N, C>,
    mut commands: mpsc::Receiver<DataplaneCommand>,
    mut events: mpsc::Receiver<DataplaneEvent>,
    reports: mpsc::Sender<ApplyReport>,
    debounce: Duration,
) -> Reconciler<N, C> {
    let mut burst_deadline: Option<tokio::time::Instant> = None;
    let mut events_open = true;
    let mut desired_sets = 0u64;
    // Until the first apply with a desired set and the datastore synced: that apply goes at
    // once (nothing came before it to coalesce, and a node that just started waits for its
    // routes); every later burst is debounced.
    let mut first_pending = true;
    loop {
        let timer_at = {
            let wake = reconciler.next_wakeup();
            let now_std = std::time::Instant::now();
            let now = tokio::time::Instant::now();
            let wake = now + wake.saturating_duration_since(now_std);
            burst_deadline.map_or(wake, |b| b.min(wake))
        };
        tokio::select! {
            cmd = commands.recv() => {
                let Some(cmd) = cmd else { return reconciler };
                match cmd {
                    DataplaneCommand::SetDesired { routes, handovers } => {
                        desired_sets += 1;
                        reconciler.set_desired_routes(&routes, &handovers);
                    }
                    DataplaneCommand::SetPolicy(p) => reconciler.set_policy(p),
                    DataplaneCommand::SetDatastoreSynced(s) => reconciler.set_datastore_synced(s),
                    DataplaneCommand::Resync => reconciler.request_resync(),
                }
                if first_pending && desired_sets > 0 && reconciler.datastore_synced() {
                    first_pending = false;
                    burst_deadline = Some(tokio::time::Instant::now());
                }
                burst_deadline.get_or_insert_with(|| tokio::time::Instant::now() + debounce);
            }
            ev = events.recv(), if events_open => {
                match ev {
                    Some(ev) => {
                        reconciler.handle_event(&ev);
                        if reconciler.needs_apply() {
                            burst_deadline.get_or_insert_with(|| tokio::time::Instant::now() + debounce);
                        }
                    }
                    None => events_open = false,
                }
            }
            () = tokio::time::sleep_until(timer_at) => {
                burst_deadline = None;
                let mut report = reconciler.apply().await;
                report.desired_sets = desired_sets;
                let _ = reports.try_send(report);
            }
        }
    }
}
