//! The side-effect edge of the dataplane: the [`RouteNetlink`] trait (dump routes, dump links,
//! execute a batch of route writes and deletes) and [`Clock`], with their real
//! implementations over rtnetlink ([`RtNetlink`]) and the system clock.
//!
//! Behind traits so the reconciler's logic is tested without root (Felix `routetable` keeps
//! its netlink handle and clock behind interfaces for the same reason).

use std::future::Future;
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};
use rtnetlink::packet_core::{NetlinkMessage, NetlinkPayload, NLM_F_DUMP_INTR};
use rtnetlink::packet_route::link::{LinkAttribute, LinkFlags};
use rtnetlink::packet_route::RouteNetlinkMessage;
use rtnetlink::sys::AsyncSocket;

use super::model::{delete_request, dump_request, parse_route, write_request, Family, KernelRoute, ObservedRoute, RouteKey};

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

/// One route change to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteOp {
    /// Write `route` with its device at ifindex `oif`. `exclusive`: create only
    /// (`NLM_F_EXCL`, fails with `EEXIST` if any route holds the key); otherwise replace.
    Write {
        /// The route to write.
        route: KernelRoute,
        /// Resolved ifindex of `route.target.device`.
        oif: Option<u32>,
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
    /// `RTM_NEWROUTE` (replace or create).
    WriteRoute,
    /// `RTM_DELROUTE`.
    DeleteRoute,
    /// Opening the rtnetlink socket.
    Connect,
}

impl std::fmt::Display for NetlinkOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NetlinkOp::DumpRoutes => "dump routes",
            NetlinkOp::DumpLinks => "dump links",
            NetlinkOp::WriteRoute => "write route",
            NetlinkOp::DeleteRoute => "delete route",
            NetlinkOp::Connect => "connect",
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
    fn dump_routes(
        &mut self,
        family: Family,
        table: u32,
        protocol: u8,
    ) -> impl Future<Output = Result<Vec<ObservedRoute>, NetlinkError>> + Send;

    /// Dump all links.
    fn dump_links(&mut self) -> impl Future<Output = Result<Vec<LinkInfo>, NetlinkError>> + Send;

    /// Execute `ops`, concurrently where possible; one result per op, in order.
    fn execute(&mut self, ops: &[RouteOp]) -> impl Future<Output = Vec<Result<(), NetlinkError>>> + Send;
}

/// [`RouteNetlink`] over one rtnetlink connection with strict checking
/// (`NETLINK_GET_STRICT_CHK`, so dumps are filtered in the kernel).
///
/// Writes are pipelined: up to `window` requests are in flight at once on the one socket,
/// each waiting for its own ack, instead of one round trip per route.
#[derive(Clone, Debug)]
pub struct RtNetlink {
    handle: rtnetlink::Handle,
    window: usize,
    timeout: Duration,
}

/// Requests in flight at once. Each ack costs the socket's receive buffer about one skb;
/// 128 stays far below the default `rmem` (and the buffer is raised to 4 MiB anyway).
pub const DEFAULT_WINDOW: usize = 128;
/// Per-request timeout (Felix `NetlinkTimeoutSecs` default 10 s).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

impl RtNetlink {
    /// Open a strict-checking rtnetlink connection and spawn its driver on the current tokio
    /// runtime. The socket lives in the network namespace of the calling thread.
    ///
    /// # Errors
    /// [`NetlinkError::Connection`] if the socket cannot be opened or configured.
    pub fn connect() -> Result<Self, NetlinkError> {
        let conn_err = |e: std::io::Error| NetlinkError::Connection { op: NetlinkOp::Connect, reason: e.to_string() };
        let (mut conn, handle, _unsolicited) = rtnetlink::new_connection_with_strict_check().map_err(conn_err)?;
        // A larger receive buffer keeps pipelined acks and big dumps from hitting ENOBUFS.
        let _ = conn.socket_mut().socket_mut().set_rx_buf_sz(4 * 1024 * 1024);
        conn.socket_mut().socket_mut().set_ext_ack(true).map_err(conn_err)?;
        tokio::spawn(conn);
        Ok(RtNetlink { handle, window: DEFAULT_WINDOW, timeout: DEFAULT_TIMEOUT })
    }

    /// Set how many requests may be in flight at once (at least 1).
    #[must_use]
    pub fn with_window(mut self, window: usize) -> Self {
        self.window = window.max(1);
        self
    }

    /// The underlying rtnetlink handle (for link queries in tests and the app).
    pub fn handle(&self) -> &rtnetlink::Handle {
        &self.handle
    }
}

fn errno_of(code: i32) -> nix::errno::Errno {
    nix::errno::Errno::from_raw(code.saturating_neg())
}

/// Send one request and collect the inner messages of its answer.
async fn request(
    handle: &rtnetlink::Handle,
    req: NetlinkMessage<RouteNetlinkMessage>,
    op: NetlinkOp,
    target: String,
    timeout: Duration,
) -> Result<Vec<RouteNetlinkMessage>, NetlinkError> {
    let mut handle = handle.clone();
    let mut responses = handle
        .request(req)
        .map_err(|e| NetlinkError::Connection { op, reason: e.to_string() })?;
    let collect = async {
        let mut out = Vec::new();
        let mut interrupted = false;
        while let Some(msg) = responses.next().await {
            if msg.header.flags & NLM_F_DUMP_INTR != 0 {
                interrupted = true;
            }
            match msg.payload {
                NetlinkPayload::Error(e) => {
                    if let Some(code) = e.code {
                        return Err(NetlinkError::Kernel { op, target: target.clone(), errno: errno_of(code.get()) });
                    }
                }
                NetlinkPayload::Done(d) if d.code < 0 => {
                    return Err(NetlinkError::Kernel { op, target: target.clone(), errno: errno_of(d.code) });
                }
                NetlinkPayload::InnerMessage(m) => out.push(m),
                NetlinkPayload::Overrun(_) => {
                    return Err(NetlinkError::Kernel { op, target: target.clone(), errno: nix::errno::Errno::ENOBUFS });
                }
                _ => {}
            }
        }
        if interrupted {
            return Err(NetlinkError::DumpInterrupted { op, target: target.clone() });
        }
        Ok(out)
    };
    tokio::time::timeout(timeout, collect).await.map_err(|_| NetlinkError::Timeout { op, target, timeout })?
}

impl RouteNetlink for RtNetlink {
    fn dump_routes(
        &mut self,
        family: Family,
        table: u32,
        protocol: u8,
    ) -> impl Future<Output = Result<Vec<ObservedRoute>, NetlinkError>> + Send {
        let handle = self.handle.clone();
        let timeout = self.timeout;
        async move {
            let target = format!("{} table {table} proto {protocol}", family.label());
            match request(&handle, dump_request(family, table, protocol), NetlinkOp::DumpRoutes, target, timeout).await {
                Ok(msgs) => Ok(msgs
                    .iter()
                    .filter_map(|m| match m {
                        RouteNetlinkMessage::NewRoute(r) => parse_route(r),
                        _ => None,
                    })
                    .collect()),
                // ENOENT: the table does not exist yet, i.e. it is empty (Felix does the same).
                Err(NetlinkError::Kernel { errno: nix::errno::Errno::ENOENT, .. }) => Ok(Vec::new()),
                Err(e) => Err(e),
            }
        }
    }

    fn dump_links(&mut self) -> impl Future<Output = Result<Vec<LinkInfo>, NetlinkError>> + Send {
        let handle = self.handle.clone();
        let timeout = self.timeout;
        async move {
            let mut msg = rtnetlink::packet_route::link::LinkMessage::default();
            msg.header.interface_family = rtnetlink::packet_route::AddressFamily::Unspec;
            let mut req = NetlinkMessage::from(RouteNetlinkMessage::GetLink(msg));
            req.header.flags = rtnetlink::packet_core::NLM_F_REQUEST | rtnetlink::packet_core::NLM_F_DUMP;
            let msgs = request(&handle, req, NetlinkOp::DumpLinks, "all".to_string(), timeout).await?;
            Ok(msgs
                .iter()
                .filter_map(|m| match m {
                    RouteNetlinkMessage::NewLink(l) => link_info(l),
                    _ => None,
                })
                .collect())
        }
    }

    fn execute(&mut self, ops: &[RouteOp]) -> impl Future<Output = Vec<Result<(), NetlinkError>>> + Send {
        let handle = self.handle.clone();
        let timeout = self.timeout;
        let window = self.window;
        let ops = ops.to_vec();
        async move {
            stream::iter(ops.into_iter().map(|op| {
                let handle = handle.clone();
                async move {
                    let (req, nlop) = match &op {
                        RouteOp::Write { route, oif, exclusive } => {
                            (write_request(route, *oif, *exclusive), NetlinkOp::WriteRoute)
                        }
                        RouteOp::Delete { key, protocol } => (delete_request(key, *protocol), NetlinkOp::DeleteRoute),
                    };
                    request(&handle, req, nlop, op.key().to_string(), timeout).await.map(|_| ())
                }
            }))
            .buffered(window)
            .collect()
            .await
        }
    }
}

/// Extract [`LinkInfo`] from a link message; `None` without a name.
pub fn link_info(l: &rtnetlink::packet_route::link::LinkMessage) -> Option<LinkInfo> {
    let name = l.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(n) => Some(n.clone()),
        _ => None,
    })?;
    Some(LinkInfo { index: l.header.index, name, up: l.header.flags.contains(LinkFlags::Up) })
}
