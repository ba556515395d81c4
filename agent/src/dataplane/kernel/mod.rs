//! The kernel layer: everything that speaks netlink, and nothing that decides ownership.
//!
//! - [`route`]: [`RouteKey`](route::RouteKey) / [`KernelRoute`](route::KernelRoute) keyed as
//!   the kernel keys routes, and the conversion from cluster routes; [`route_wire`]: their
//!   rtnetlink messages and the parse of the kernel's.
//! - [`nexthop`]: nexthop objects (`--nexthop-objects`): keys, ownership ids, wire encoding.
//! - [`netlink`]: the [`RouteNetlink`] and [`Clock`] traits the reconciler is written against,
//!   the ops and errors that cross them; [`rt_netlink`]: [`RtNetlink`], the real one;
//!   [`dump`]: [`KernelDump`], a read-only handle (one socket, no send thread) for readers.
//! - `batch_writer`, `batch_sender`: the batching writer (ops → batches → per-op results) and
//!   the thread that sends each batch and reads its answers, off the reconciler task's CPU.
//! - [`rule`]: policy rules (`ip rule`): their parse, dump and the one rule write
//!   (`--route-table-rule-priority`, create-exclusive).
//! - [`watcher`]: the route watcher (route, link, address and nexthop groups →
//!   [`DataplaneEvent`](watcher::DataplaneEvent)).

mod batch_sender;
mod batch_writer;
pub mod dump;
pub mod netlink;
pub mod nexthop;
pub mod route;
pub mod route_wire;
pub mod rt_netlink;
pub mod rule;
pub mod watcher;

pub use batch_writer::{DEFAULT_WINDOW, MAX_BATCH_BYTES};
pub use dump::{KernelDump, ReadKernel, DEFAULT_TIMEOUT};
pub use netlink::{link_info, nexthop_target, ChunkPlace, Clock, Executed, LinkInfo, NetlinkError, NetlinkOp, RouteNetlink, RouteOp, SystemClock};
pub use rt_netlink::RtNetlink;
