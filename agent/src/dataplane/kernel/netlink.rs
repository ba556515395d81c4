//! The port between the reconciler and the kernel: the [`RouteNetlink`] trait (dump routes,
//! dump links, execute a batch of route writes and deletes), [`Clock`], and the ops and errors
//! that cross it. The real implementation is [`RtNetlink`](super::RtNetlink); the reconciler's
//! tests use the fake.
//!
//! Behind traits so the reconciler's logic is tested without root (Felix `routetable` keeps
//! its netlink handle and clock behind interfaces for the same reason).

use std::future::Future;
use std::time::{Duration, Instant};

use rtnetlink::packet_route::link::{LinkAttribute, LinkFlags};

use crate::dataplane::kernel::nexthop::{NexthopOp, ObservedNexthop};
use crate::dataplane::kernel::route::{Family, KernelRoute, ObservedRoute, RouteKey};

/// Wall-clock source for timers (resync interval, retry backoff, handover grace).
pub trait Clock: Send {
    /// The current instant.
    fn now(&self) -> Instant;
}

/// [`Clock`] backed by [`Instant::now`].
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A network interface as the reconciler needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkInfo {
    /// ifindex.
    pub index: u32,
    /// Name (`IFLA_IFNAME`).
    pub name: String,
    /// Administratively up (`IFF_UP`). IPv4 flushes routes of a device that goes down
    /// (`fib_sync_down_dev`) without sending `RTM_DELROUTE`.
    pub up: bool,
}

/// Where a chunk of a write pass stands in it ([`RouteNetlink::execute_chunk`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkPlace {
    /// The pass's first chunk: nothing handed in before belongs to the pass.
    pub first: bool,
    /// The pass's last chunk: every chunk still out comes back with it.
    pub last: bool,
}

/// A chunk of ops that ran: the ops and one result per op, in order.
#[derive(Debug)]
pub struct Executed {
    /// The ops, as handed in.
    pub ops: Vec<RouteOp>,
    /// One result per op.
    pub results: Vec<Result<(), NetlinkError>>,
}

/// One route change to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteOp {
    /// Write `route` with its device at ifindex `oif`, or through nexthop object `nexthop`.
    /// `exclusive`: create only (`NLM_F_EXCL`, fails with `EEXIST` if any route holds the
    /// key); otherwise replace.
    Write {
        /// The route to write.
        route: KernelRoute,
        /// Resolved ifindex of `route.target.device`.
        oif: Option<u32>,
        /// The nexthop object the route goes through (`RTA_NH_ID`, instead of gateway, device
        /// and onlink flag).
        nexthop: Option<u32>,
        /// Create-only instead of replace.
        exclusive: bool,
    },
    /// Delete the route at `key` if it still carries `protocol`.
    Delete {
        /// Key of the route.
        key: RouteKey,
        /// Protocol the route must carry to be deleted.
        protocol: u8,
    },
}

impl RouteOp {
    /// The key the op acts on.
    pub fn key(&self) -> &RouteKey {
        match self {
            RouteOp::Write { route, .. } => &route.key,
            RouteOp::Delete { key, .. } => key,
        }
    }
}

/// Which netlink operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetlinkOp {
    /// Route dump.
    DumpRoutes,
    /// Link dump.
    DumpLinks,
    /// Address dump.
    DumpAddresses,
    /// `RTM_NEWROUTE` (replace or create).
    WriteRoute,
    /// `RTM_DELROUTE`.
    DeleteRoute,
    /// Nexthop object dump.
    DumpNexthops,
    /// `RTM_NEWNEXTHOP` (replace or create).
    WriteNexthop,
    /// `RTM_DELNEXTHOP`.
    DeleteNexthop,
    /// Opening the rtnetlink socket.
    Connect,
    /// Policy rule dump.
    DumpRules,
    /// `RTM_NEWRULE` (create-exclusive).
    WriteRule,
}

impl std::fmt::Display for NetlinkOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NetlinkOp::DumpRoutes => "dump routes",
            NetlinkOp::DumpLinks => "dump links",
            NetlinkOp::DumpAddresses => "dump addresses",
            NetlinkOp::WriteRoute => "write route",
            NetlinkOp::DeleteRoute => "delete route",
            NetlinkOp::DumpNexthops => "dump nexthops",
            NetlinkOp::WriteNexthop => "write nexthop",
            NetlinkOp::DeleteNexthop => "delete nexthop",
            NetlinkOp::Connect => "connect",
            NetlinkOp::DumpRules => "dump rules",
            NetlinkOp::WriteRule => "write rule",
        })
    }
}

/// A failed netlink operation, with what it was about.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetlinkError {
    /// The kernel answered with an errno.
    #[error("netlink {op} {target}: {errno}")]
    Kernel {
        /// The operation.
        op: NetlinkOp,
        /// What it was about (route key, table, ...).
        target: String,
        /// The kernel's error.
        errno: nix::errno::Errno,
    },
    /// The kernel marked a dump `NLM_F_DUMP_INTR`: the table changed during the dump (the
    /// condition Felix and vishvananda/netlink report as `EINTR`).
    #[error("netlink {op} {target}: dump interrupted by a concurrent change")]
    DumpInterrupted {
        /// The operation.
        op: NetlinkOp,
        /// What it was about.
        target: String,
    },
    /// No answer within the timeout (a lost ack, e.g. after `ENOBUFS`).
    #[error("netlink {op} {target}: no answer within {timeout:?}")]
    Timeout {
        /// The operation.
        op: NetlinkOp,
        /// What it was about.
        target: String,
        /// The timeout.
        timeout: Duration,
    },
    /// The connection is gone or a request could not be queued.
    #[error("netlink {op}: connection failed: {reason}")]
    Connection {
        /// The operation.
        op: NetlinkOp,
        /// What went wrong.
        reason: String,
    },
}

impl NetlinkError {
    /// The errno, if the kernel sent one.
    pub fn errno(&self) -> Option<nix::errno::Errno> {
        match self {
            NetlinkError::Kernel { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

/// Route and link access over netlink. Implemented by [`RtNetlink`] and by the unit tests'
/// fake kernel.
pub trait RouteNetlink: Send {
    /// Dump the routes of `family` in `table` with `protocol` (0 = any). A table that does not
    /// exist is empty.
    fn dump_routes(&mut self, family: Family, table: u32, protocol: u8) -> impl Future<Output = Result<Vec<ObservedRoute>, NetlinkError>> + Send;

    /// Dump the routes of both families in `table` with `protocol` (0 = any): IPv4 then IPv6
    /// by default; one request for both where the collaborator can (a full resync is then one
    /// dump per protocol).
    fn dump_routes_both_families(&mut self, table: u32, protocol: u8) -> impl Future<Output = Result<Vec<ObservedRoute>, NetlinkError>> + Send {
        async move {
            let mut routes = self.dump_routes(Family::V4, table, protocol).await?;
            routes.extend(self.dump_routes(Family::V6, table, protocol).await?);
            Ok(routes)
        }
    }

    /// Dump all links.
    fn dump_links(&mut self) -> impl Future<Output = Result<Vec<LinkInfo>, NetlinkError>> + Send;

    /// Execute `ops`, concurrently where possible; one result per op, in order.
    fn execute(&mut self, ops: &[RouteOp]) -> impl Future<Output = Vec<Result<(), NetlinkError>>> + Send;

    /// Ops per chunk of a write pass ([`execute_chunk`](Self::execute_chunk)): the
    /// collaborator's batch size. The default, `usize::MAX`, makes every pass one chunk.
    fn write_chunk(&self) -> usize {
        usize::MAX
    }

    /// Execute one chunk of a write pass, in order after the chunks of the pass before it.
    /// Returns the chunks whose results are in, each with its ops and one result per op, in
    /// the order they were handed in; each chunk is returned exactly once, and the call for
    /// the pass's last chunk (`place.last`) returns every chunk still out.
    ///
    /// A collaborator may pipeline: return a chunk only from the call after the one that
    /// handed it in, so that its caller records one chunk and plans the next while the kernel
    /// handles this one. A chunk still out when a pass was dropped before its last
    /// chunk is not returned to the next pass (`place.first`). The default executes the chunk
    /// at once and returns it.
    fn execute_chunk(&mut self, ops: Vec<RouteOp>, place: ChunkPlace) -> impl Future<Output = Vec<Executed>> + Send {
        let _ = place;
        async move {
            if ops.is_empty() {
                return Vec::new();
            }
            let results = self.execute(&ops).await;
            vec![Executed { ops, results }]
        }
    }

    /// Dump every nexthop object (all families). The default knows none (a collaborator
    /// without nexthop objects).
    fn dump_nexthops(&mut self) -> impl Future<Output = Result<Vec<ObservedNexthop>, NetlinkError>> + Send {
        async { Ok(Vec::new()) }
    }

    /// Execute nexthop object writes and deletes in order; one result per op. The default
    /// refuses each with `EOPNOTSUPP` (routes then stay classic).
    fn execute_nexthops(&mut self, ops: &[NexthopOp]) -> impl Future<Output = Vec<Result<(), NetlinkError>>> + Send {
        let refused = ops
            .iter()
            .map(|op| Err(NetlinkError::Kernel { op: NetlinkOp::WriteNexthop, target: nexthop_target(op.id()), errno: nix::errno::Errno::EOPNOTSUPP }))
            .collect();
        async { refused }
    }

    /// Which of nexthop objects `ids` any route, of any table, writer and family, goes
    /// through. The default says all of them (so nothing is deleted on its word).
    fn nexthops_in_use(&mut self, ids: &[u32]) -> impl Future<Output = Result<std::collections::BTreeSet<u32>, NetlinkError>> + Send {
        let all = ids.iter().copied().collect();
        async { Ok(all) }
    }
}

/// How an error names nexthop object `id`.
pub fn nexthop_target(id: u32) -> String {
    format!("nexthop id {id}")
}

/// Extract [`LinkInfo`] from a link message; `None` without a name.
pub fn link_info(l: &rtnetlink::packet_route::link::LinkMessage) -> Option<LinkInfo> {
    let name = l.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(n) => Some(n.clone()),
        _ => None,
    })?;
    Some(LinkInfo { index: l.header.index, name, up: l.header.flags.contains(LinkFlags::Up) })
}
