//! Dataplane: programs this agent's cluster routes into one kernel routing table over
//! netlink, keeps them there, and never touches routes that are not ours.
//!
//! ```text
//!  ClusterRoute (routes::) ──set_desired──> Reconciler ──apply──> RouteNetlink (rtnetlink)
//!                                              ^   |                 │ replace / create-excl /
//!  watch_netlink (route+link groups) ──events──┘   └─> ApplyReport   │ delete-by-protocol,
//!                                                      (→ metrics)   │ filtered dumps
//! ```
//!
//! - [`kernel_route`]: [`RouteKey`] / [`KernelRoute`] keyed as the kernel keys routes; the
//!   conversion from [`ClusterRoute`](crate::routes::ClusterRoute) and the rtnetlink wire
//!   encoding (dump, write and delete requests; parsing of dump replies and notifications).
//! - [`policy`]: [`OwnershipPolicy`], the one place that decides which kernel routes are ours.
//! - [`reconciler`]: [`Reconciler`], Felix routetable's delta tracker + apply + resync.
//! - [`netlink`]: the [`RouteNetlink`] and [`Clock`] traits and their real implementations.
//! - [`events`]: [`DataplaneEvent`] and the netlink watcher.
//! - [`audit`]: compare the kernel with what each owner should have programmed.
//! - [`run`]: the task that drives a reconciler from commands, events and timers.
//!
//! Invariants: a route is deleted only if the policy calls it ours, it is not desired, the
//! datastore is synced, its prefix is outside frozen ground, the mass-deletion breaker lets it
//! through, and (on handover) the new owner's route was seen or the grace period ended; deletes carry the route's protocol so a route another writer put at the same key
//! meanwhile survives (`ESRCH`). A key not known to hold our route is written create-exclusive,
//! so a foreign route is never overwritten unless the policy claims it.

use std::time::Duration;

use tokio::sync::mpsc;

pub mod audit;
pub mod events;
pub mod host_nic;
pub mod kernel_route;
pub mod netlink;
pub mod policy;
pub mod reconciler;

#[cfg(test)]
pub(crate) mod fake;
#[cfg(test)]
mod reconciler_tests;

pub use audit::{audit, audit_kernel, AuditFinding, AuditReport, AuditScope, ExpectedRoute, FindingCode, WireguardRoute};
pub use events::{spawn_watcher, DataplaneEvent, EventDecoder};
pub use kernel_route::{Family, KernelRoute, RouteKey, RouteKind, RouteSettings, RouteTarget};
pub use netlink::{Clock, LinkInfo, NetlinkError, RouteNetlink, RouteOp, RtNetlink, SystemClock};
pub use policy::{OwnershipPolicy, Verdict};
pub use reconciler::{ApplyReport, ErrorKind, Handover, HandoverEnd, HandoverOutcome, Reconciler};

use crate::routes::{ClusterRoute, RouteDevices};

/// Errors of the dataplane's setup (per-route failures are counted in [`ApplyReport`]).
#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    /// Subscribing to rtnetlink multicast groups failed.
    #[error("subscribe to rtnetlink route and link notifications: {source}")]
    Subscribe {
        /// The socket error.
        source: std::io::Error,
    },
    /// A netlink request failed.
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    /// An invalid setting.
    #[error("invalid dataplane setting {setting}: {reason}")]
    Config {
        /// The setting's name.
        setting: &'static str,
        /// What is wrong.
        reason: String,
    },
}

/// Dataplane settings (from flags).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataplaneConfig {
    /// Route protocol of our routes, 1..=255 (default 80, Felix's: a handover to or from Felix
    /// is then an atomic replace).
    pub protocol: u8,
    /// Metric of our routes (default 1024: BIRD's and Calico's normal priority).
    pub metric: u32,
    /// Routing table id (default 254, main; e.g. 48 for a dedicated table).
    pub table: u32,
    /// Tunnel device and host NIC names.
    pub devices: RouteDevices,
    /// Full resync period (default 90 s, Felix `RouteRefreshInterval`).
    pub resync_interval: Duration,
    /// Longest time a route of a class being handed over is kept waiting for the new owner's
    /// route (default 30 s).
    pub handover_grace: Duration,
    /// Mass-deletion breaker: an apply that would delete more than this percentage of our
    /// routes holds each delete until it has been wanted for `settle` (default 50; 100 turns
    /// the breaker off).
    pub mass_deletion_percent: u8,
    /// How long a held mass deletion must stay wanted (default 30 s, `--settle-period`).
    pub settle: Duration,
}

impl Default for DataplaneConfig {
    fn default() -> Self {
        DataplaneConfig {
            protocol: kernel_route::RTPROT_FELIX,
            metric: 1024,
            table: kernel_route::RT_TABLE_MAIN,
            devices: RouteDevices::default(),
            resync_interval: Duration::from_secs(90),
            handover_grace: Duration::from_secs(30),
            mass_deletion_percent: 50,
            settle: Duration::from_secs(30),
        }
    }
}

impl DataplaneConfig {
    /// Check the settings.
    ///
    /// # Errors
    /// [`DataplaneError::Config`] for protocol 0, table 0 (`RT_TABLE_UNSPEC`) or a zero resync
    /// interval.
    pub fn validate(&self) -> Result<(), DataplaneError> {
        if self.protocol == 0 {
            return Err(DataplaneError::Config { setting: "protocol", reason: "must be 1..=255".into() });
        }
        if self.table == 0 {
            return Err(DataplaneError::Config { setting: "table", reason: "0 is RT_TABLE_UNSPEC".into() });
        }
        if self.resync_interval.is_zero() {
            return Err(DataplaneError::Config { setting: "resync_interval", reason: "must be > 0".into() });
        }
        if self.mass_deletion_percent > 100 {
            return Err(DataplaneError::Config { setting: "mass_deletion_percent", reason: "must be 0..=100".into() });
        }
        Ok(())
    }

    /// The route-writing part of the settings.
    pub fn route_settings(&self) -> RouteSettings {
        RouteSettings { protocol: self.protocol, metric: self.metric, table: self.table, devices: self.devices.clone() }
    }

    /// A policy with our protocol, table and devices, no owned pools and no claims (nothing
    /// is ours until the first plan names the pools).
    pub fn base_policy(&self) -> OwnershipPolicy {
        OwnershipPolicy {
            protocol: self.protocol,
            table: self.table,
            tunnel_dev: self.devices.tunnel.clone(),
            host_nic: self.devices.host_nic.clone(),
            ..OwnershipPolicy::default()
        }
    }

    /// [`base_policy`](Self::base_policy) owning `pools`: routes with our protocol inside them
    /// are ours (what the plan gives the agent for its IP pools; tests and benchmarks name
    /// theirs).
    pub fn policy_owning(&self, pools: &[&str]) -> OwnershipPolicy {
        OwnershipPolicy { owned: pools.iter().filter_map(|p| p.parse().ok()).collect(), ..self.base_policy() }
    }
}

/// Instructions for [`run`].
#[derive(Clone, Debug)]
pub enum DataplaneCommand {
    /// The complete desired route set, and the classes being handed to another writer.
    SetDesired {
        /// Every cluster route routewarden should program.
        routes: Vec<ClusterRoute>,
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
/// `debounce`, measured from the burst's first message so latency stays bounded), on the
/// resync timer, on retry and handover deadlines. Every apply's report goes to `reports`
/// (dropped if the channel is full). Returns when `commands` closes.
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
                        reconciler.set_desired_with_handover(&routes, &handovers);
                    }
                    DataplaneCommand::SetPolicy(p) => reconciler.set_policy(p),
                    DataplaneCommand::SetDatastoreSynced(s) => reconciler.set_datastore_synced(s),
                    DataplaneCommand::Resync => reconciler.request_resync(),
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
