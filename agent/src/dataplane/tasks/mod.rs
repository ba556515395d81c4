//! The dataplane's tasks: they run the layers below and own no route logic.
//!
//! - [`driver`]: [`run`](driver::run), the task that drives a reconciler from
//!   [`DataplaneCommand`](driver::DataplaneCommand)s, netlink events and timers.
//! - [`host_nic`]: finding the host NIC for `--host-device auto`.

pub mod driver;
pub mod host_nic;
