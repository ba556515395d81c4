//! [`DataplaneConfig`]: the dataplane's settings (from flags), their check, and the route
//! settings and base ownership policy derived from them.

use std::time::Duration;

use crate::dataplane::error::DataplaneError;
use crate::dataplane::kernel::route::RouteSettings;
use crate::ownership::OwnershipPolicy;
use crate::routes::RouteDevices;
use crate::vocabulary::{RTPROT_FELIX, RT_TABLE_MAIN};

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
    /// Program cluster routes through nexthop objects, one per (remote node, IP pool)
    /// (`--nexthop-objects`, default off: Felix, BIRD and `ip route` users expect classic
    /// routes). Off, routes of ours through a nexthop object are replaced in place by classic
    /// routes and our unused nexthop objects removed.
    pub nexthop_objects: bool,
}

impl Default for DataplaneConfig {
    fn default() -> Self {
        DataplaneConfig {
            protocol: RTPROT_FELIX,
            metric: 1024,
            table: RT_TABLE_MAIN,
            devices: RouteDevices::default(),
            resync_interval: Duration::from_secs(90),
            handover_grace: Duration::from_secs(30),
            mass_deletion_percent: 50,
            settle: Duration::from_secs(30),
            nexthop_objects: false,
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
        RouteSettings { protocol: self.protocol, metric: self.metric, table: self.table, ..RouteSettings::with_devices(&self.devices) }
    }

    /// A policy with our protocol, table and devices, no owned pools and no claims (nothing
    /// is ours until the first plan names the pools).
    pub fn base_policy(&self) -> OwnershipPolicy {
        OwnershipPolicy::base(self.protocol, self.table, &self.devices)
    }

    /// [`base_policy`](Self::base_policy) owning `pools`: routes with our protocol inside them
    /// are ours (what the plan gives the agent for its IP pools; tests and benchmarks name
    /// theirs).
    pub fn policy_owning(&self, pools: &[&str]) -> OwnershipPolicy {
        OwnershipPolicy { owned: pools.iter().filter_map(|p| p.parse().ok()).collect(), ..self.base_policy() }
    }
}
