//! Dataplane: programs this agent's cluster routes into one kernel routing table over
//! netlink, keeps them there, and never touches routes that are not ours.
//!
//! ```text
//!  ClusterRoute (routes::) ──set_desired──> Reconciler ──apply──> RouteNetlink (rtnetlink)
//!                                              ^   |                 │ replace / create-excl /
//!  spawn_watcher (route+link groups) ──events──┘   └─> ApplyReport   │ delete-by-protocol,
//!                                                      (→ metrics)   │ filtered dumps
//! ```
//!
//! - [`kernel_route`]: [`RouteKey`] / [`KernelRoute`] keyed as the kernel keys routes; the
//!   conversion from [`ClusterRoute`](crate::routes::ClusterRoute) and the rtnetlink wire
//!   encoding (dump, write and delete requests; parsing of dump replies and notifications).
//! - [`policy`]: [`OwnershipPolicy`], the one place that decides which kernel routes are ours.
//! - [`reconciler`]: [`Reconciler`], Felix routetable's change tracking + apply + resync
//!   (`reconciler/apply.rs`: the write and delete passes of one apply). Its parts, each a type
//!   with its own rules:
//!   - [`handover`]: [`Handover`] in, [`HandoverOutcome`] out, and the handover and step-aside
//!     state machine between them;
//!   - `links`: the link cache (ifindex, name, up) that names and resolves route devices;
//!   - `retry`: per-key backoff after failures and the full-resync schedule;
//!   - `breaker`: the mass-deletion breaker.
//! - [`report`]: [`ApplyReport`], what one apply did ([`ErrorKind`]: fixed error kinds).
//! - [`netlink`]: the [`RouteNetlink`] and [`Clock`] traits and their real implementations
//!   (`batch_sender`: the thread a write pass's batches go to the kernel from, kept off the
//!   reconciler task's CPU).
//! - [`nexthop`]: nexthop objects (`--nexthop-objects`): one per remote node and IP pool, their
//!   ownership and their wire encoding; the reconciler's `nexthops` part keeps them.
//! - [`events`]: [`DataplaneEvent`] and the netlink watcher.
//! - [`audit`](mod@audit): compare the kernel with what each owner should have programmed.
//! - [`driver`]: [`run`], the task that drives a reconciler from [`DataplaneCommand`]s, events
//!   and timers.
//! - [`config`]: [`DataplaneConfig`], the settings from flags; [`error`]: [`DataplaneError`].
//! - [`host_nic`]: finding the host NIC for `--host-device auto`.
//!
//! Invariants: a route is deleted only if the policy calls it ours, it is not desired, the
//! datastore is synced, its prefix is outside frozen ground, the mass-deletion breaker lets it
//! through, and (on handover) the new owner's route was seen or the grace period ended;
//! deletes carry the route's protocol so a route another writer put at the same key
//! meanwhile survives (`ESRCH`). A key not known to hold our route is written create-exclusive,
//! so a foreign route is never overwritten unless the policy claims it.

pub mod audit;
mod batch_sender;
mod breaker;
pub mod config;
pub mod driver;
pub mod error;
pub mod events;
pub mod handover;
pub mod host_nic;
pub mod kernel_route;
mod links;
pub mod netlink;
pub mod nexthop;
pub mod reconciler;
pub mod report;
mod retry;

#[cfg(test)]
pub(crate) mod fake;
#[cfg(test)]
mod fault_matrix_tests;
#[cfg(test)]
mod reconciler_tests;

pub use crate::ownership::{OwnershipPolicy, Verdict};
pub use audit::{audit, audit_kernel, AuditFinding, AuditReport, AuditScope, ExpectedRoute, FindingCode, WireguardRoute};
pub use config::DataplaneConfig;
pub use driver::{run, DataplaneCommand, DEFAULT_DEBOUNCE};
pub use error::DataplaneError;
pub use events::{spawn_watcher, DataplaneEvent, EventDecoder};
pub use handover::{Handover, HandoverEnd, HandoverOutcome};
pub use kernel_route::{Family, KernelRoute, RouteKey, RouteKind, RouteSettings, RouteTarget};
pub use netlink::{ChunkPlace, Clock, Executed, LinkInfo, NetlinkError, RouteNetlink, RouteOp, RtNetlink, SystemClock};
pub use nexthop::{NexthopKey, NexthopOp, ObservedNexthop, NEXTHOP_IDS};
pub use reconciler::Reconciler;
pub use report::{ApplyReport, ErrorKind};
