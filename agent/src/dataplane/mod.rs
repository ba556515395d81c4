//! Dataplane: programs this agent's cluster routes into one kernel routing table over
//! netlink, keeps them there, and never touches routes that are not ours.
//!
//! Three layers; each imports only the ones below it, and one route write passes down them
//! once (driver → `Reconciler::apply` → `RouteNetlink::execute_chunk` → batching writer →
//! kernel):
//!
//! ```text
//!  tasks/       driver (commands, events, timers → apply → ApplyReport), host-NIC lookup
//!    │
//!  reconciler/  desired vs kernel state, handover, breaker, retry, link cache, report:
//!    │          pure logic behind the RouteNetlink and Clock traits (tested with `fake`)
//!    │
//!  kernel/      route and nexthop messages (types, wire encoding), RouteNetlink/Clock and
//!               RtNetlink, the batching writer and its thread, the read-only dump handle,
//!               the route watcher (route, link, address and nexthop groups → DataplaneEvent)
//! ```
//!
//! - `tasks/`: run things; own no route logic.
//! - `reconciler/`: decides every write and delete; does no I/O but through the traits. Which
//!   kernel routes are ours is the [`OwnershipPolicy`] (`ownership/policy.rs`), built by the
//!   plan; what it hands over is the plan's [`Handover`].
//! - `kernel/`: speaks netlink; decides nothing about ownership.
//! - Beside them: [`audit`](mod@audit) (a dump compared with the plan's expectations),
//!   [`table_rule`] (whether a policy rule sends traffic to a table other than main),
//!   [`settings`] ([`DataplaneConfig`], from flags), [`error`] ([`DataplaneError`]).
//!
//! Invariants: a route is deleted only if the policy calls it ours, it is not desired, the
//! datastore is synced, its prefix is outside frozen ground, the mass-deletion breaker lets it
//! through, and (on handover) the new owner's route was seen or the grace period ended;
//! deletes carry the route's protocol so a route another writer put at the same key
//! meanwhile survives (`ESRCH`). A key not known to hold our route is written create-exclusive,
//! so a foreign route is never overwritten unless the policy claims it.

pub mod audit;
pub mod error;
pub mod kernel;
pub mod reconciler;
pub mod settings;
pub mod table_rule;
pub mod tasks;

/// Test doubles (a fake kernel behind [`RouteNetlink`], a manual [`Clock`]): this crate's unit
/// tests, and other crates' tests with the `test-support` feature.
#[cfg(any(test, feature = "test-support"))]
pub mod fake;

pub use crate::ownership::{OwnershipPolicy, Verdict};
pub use crate::plan::{AuditScope, ExpectedRoute, Handover, WireguardRoute};
pub use audit::{audit, audit_kernel, AuditFinding, AuditReport, FindingCode};
pub use error::DataplaneError;
pub use kernel::nexthop::{NexthopKey, NexthopOp, ObservedNexthop, NEXTHOP_IDS};
pub use kernel::route::{Family, KernelRoute, RouteKey, RouteKind, RouteSettings, RouteTarget};
pub use kernel::watcher::{spawn_watcher, DataplaneEvent, EventDecoder};
pub use kernel::{ChunkPlace, Clock, Executed, KernelDump, LinkInfo, NetlinkError, ReadKernel, RouteNetlink, RouteOp, RtNetlink, SystemClock};
pub use reconciler::handover::{HandoverEnd, HandoverOutcome};
pub use reconciler::report::{ApplyReport, ErrorKind};
pub use reconciler::Reconciler;
pub use settings::DataplaneConfig;
pub use tasks::driver::{run, DataplaneCommand, DEFAULT_DEBOUNCE};
