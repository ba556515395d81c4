//! [`KernelDump`]: a read-only handle on the kernel's routing state. One strict-checking
//! rtnetlink socket for route, link and address dumps; no batch socket and no send thread
//! (what `RtNetlink` adds for writes). The host-NIC lookup and the audit
//! read through it; [`ReadKernel`] lets the audit read through either.
//!
//! The request and answer handling here is also [`RtNetlink`](super::RtNetlink)'s for its
//! dumps.

use std::future::Future;
use std::net::IpAddr;
use std::time::Duration;

use futures::stream::StreamExt;
use rtnetlink::packet_core::{NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST};
use rtnetlink::packet_route::address::{AddressAttribute, AddressMessage};
use rtnetlink::packet_route::link::LinkMessage;
use rtnetlink::packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::sys::protocols::NETLINK_ROUTE;
use rtnetlink::sys::{AsyncSocket, SocketAddr};

use super::batch_sender::errno_of;
use super::netlink::{link_info, LinkInfo, NetlinkError, NetlinkOp};
use super::nexthop::{nexthop_dump_request, parse_nexthop, NexthopMessage, ObservedNexthop};
use super::route::{Family, ObservedRoute};
use super::route_wire::{dump_request, parse_route};
use super::rule::{parse_rule, rule_dump_request, table_rule_request, ObservedRule};

/// What a reader of the kernel asks: links, one table's routes of one family and protocol
/// (0: every protocol), nexthop objects, policy rules. Implemented by [`KernelDump`] and by `RtNetlink`
/// (through its dump socket), so a caller that only reads need not open a writer.
pub trait ReadKernel: Send {
    /// Every link (`RTM_GETLINK` dump).
    fn read_links(&mut self) -> impl Future<Output = Result<Vec<LinkInfo>, NetlinkError>> + Send;
    /// The routes of `table`, `family` and `protocol` (0: any), filtered in the kernel.
    fn read_routes(&mut self, family: Family, table: u32, protocol: u8) -> impl Future<Output = Result<Vec<ObservedRoute>, NetlinkError>> + Send;
    /// Every nexthop object (`EOPNOTSUPP` before Linux 5.3).
    fn read_nexthops(&mut self) -> impl Future<Output = Result<Vec<ObservedNexthop>, NetlinkError>> + Send;
    /// Every policy rule of `family` ([`KernelDump::rules`]).
    fn read_rules(&mut self, family: Family) -> impl Future<Output = Result<Vec<ObservedRule>, NetlinkError>> + Send;
}

/// Per-request (dumps) and per-batch (writes) timeout (Felix `NetlinkTimeoutSecs` default 10 s).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// A read-only rtnetlink handle: one socket in the network namespace of the thread that
/// called [`KernelDump::connect`]; clones share it.
#[derive(Clone, Debug)]
pub struct KernelDump {
    handle: rtnetlink::Handle,
    timeout: Duration,
}

impl KernelDump {
    /// Open a strict-checking rtnetlink connection (its driver spawned on the current tokio
    /// runtime) with a large receive buffer, for dumps only.
    ///
    /// # Errors
    /// [`NetlinkError::Connection`] if the socket cannot be opened or configured.
    pub fn connect() -> Result<Self, NetlinkError> {
        let conn_err = |e: std::io::Error| NetlinkError::Connection { op: NetlinkOp::Connect, reason: e.to_string() };
        let (mut conn, handle, _unsolicited) = rtnetlink::new_connection_with_strict_check().map_err(conn_err)?;
        // A larger receive buffer keeps big dumps from hitting ENOBUFS.
        let _ = conn.socket_mut().socket_mut().set_rx_buf_sz(super::batch_writer::SOCKET_RCVBUF_BYTES);
        conn.socket_mut().socket_mut().set_ext_ack(true).map_err(conn_err)?;
        tokio::spawn(conn);
        Ok(KernelDump { handle, timeout: DEFAULT_TIMEOUT })
    }

    /// A reader over an open rtnetlink connection (the dump socket of an `RtNetlink`).
    pub(super) fn from_handle(handle: rtnetlink::Handle, timeout: Duration) -> Self {
        KernelDump { handle, timeout }
    }

    /// Every address of every link in this network namespace, as `(ifindex, address)`, both
    /// families (`RTM_GETADDR` dump; the local address, `IFA_LOCAL`, where the kernel gives
    /// one, else `IFA_ADDRESS`).
    ///
    /// # Errors
    /// [`NetlinkError`] when the dump fails or times out.
    pub async fn addresses(&self) -> Result<Vec<(u32, IpAddr)>, NetlinkError> {
        dump_addresses_with(&self.handle, self.timeout).await
    }

    /// The connection's handle (the rule dump and write, `kernel/rule.rs`).
    pub(super) fn handle(&self) -> &rtnetlink::Handle {
        &self.handle
    }

    /// The per-request timeout.
    pub(super) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Every link.
    ///
    /// # Errors
    /// [`NetlinkError`] when the dump fails or times out.
    pub async fn links(&self) -> Result<Vec<LinkInfo>, NetlinkError> {
        dump_links_with(self.handle.clone(), self.timeout).await
    }
}

impl ReadKernel for KernelDump {
    fn read_links(&mut self) -> impl Future<Output = Result<Vec<LinkInfo>, NetlinkError>> + Send {
        dump_links_with(self.handle.clone(), self.timeout)
    }

    fn read_routes(&mut self, family: Family, table: u32, protocol: u8) -> impl Future<Output = Result<Vec<ObservedRoute>, NetlinkError>> + Send {
        let target = format!("{} table {table} proto {protocol}", family.label());
        dump_routes_with(self.handle.clone(), dump_request(family, table, protocol), target, self.timeout)
    }

    /// On a connection of its own for this dump (rtnetlink's cannot decode nexthop messages),
    /// closed when it is answered: a reader keeps one socket open.
    fn read_nexthops(&mut self) -> impl Future<Output = Result<Vec<ObservedNexthop>, NetlinkError>> + Send {
        let timeout = self.timeout;
        async move {
            let conn_err = |e: std::io::Error| NetlinkError::Connection { op: NetlinkOp::DumpNexthops, reason: e.to_string() };
            let (mut conn, handle, _unsolicited) = rtnetlink::proto::new_connection::<NexthopMessage>(NETLINK_ROUTE).map_err(conn_err)?;
            conn.socket_mut().socket_mut().set_netlink_get_strict_chk(true).map_err(conn_err)?;
            let task = tokio::spawn(conn);
            let out = nexthop_messages(&handle, timeout).await.map(|m| m.iter().filter_map(parse_nexthop).collect());
            task.abort();
            out
        }
    }

    fn read_rules(&mut self, family: Family) -> impl Future<Output = Result<Vec<ObservedRule>, NetlinkError>> + Send {
        let reader = self.clone();
        async move { reader.rules(family).await }
    }
}

/// Every link, on `handle`.
pub(super) async fn dump_links_with(handle: rtnetlink::Handle, timeout: Duration) -> Result<Vec<LinkInfo>, NetlinkError> {
    let mut msg = LinkMessage::default();
    msg.header.interface_family = AddressFamily::Unspec;
    let mut req = NetlinkMessage::from(RouteNetlinkMessage::GetLink(msg));
    req.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    let msgs = request(&handle, req, NetlinkOp::DumpLinks, "all".to_string(), timeout).await?;
    Ok(msgs
        .iter()
        .filter_map(|m| match m {
            RouteNetlinkMessage::NewLink(l) => link_info(l),
            _ => None,
        })
        .collect())
}

/// Every address of every link, on `handle` ([`KernelDump::addresses`]).
pub(super) async fn dump_addresses_with(handle: &rtnetlink::Handle, timeout: Duration) -> Result<Vec<(u32, IpAddr)>, NetlinkError> {
    let mut msg = AddressMessage::default();
    msg.header.family = AddressFamily::Unspec;
    let mut req = NetlinkMessage::from(RouteNetlinkMessage::GetAddress(msg));
    req.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    let msgs = request(handle, req, NetlinkOp::DumpAddresses, "all".to_string(), timeout).await?;
    Ok(msgs
        .iter()
        .filter_map(|m| match m {
            RouteNetlinkMessage::NewAddress(a) => {
                let local = a.attributes.iter().find_map(|x| if let AddressAttribute::Local(ip) = x { Some(*ip) } else { None });
                let addr = a.attributes.iter().find_map(|x| if let AddressAttribute::Address(ip) = x { Some(*ip) } else { None });
                local.or(addr).map(|ip| (a.header.index, ip))
            }
            _ => None,
        })
        .collect())
}

/// Send one request and collect the inner messages of its answer.
pub(super) async fn request(
    handle: &rtnetlink::Handle,
    req: NetlinkMessage<RouteNetlinkMessage>,
    op: NetlinkOp,
    target: String,
    timeout: Duration,
) -> Result<Vec<RouteNetlinkMessage>, NetlinkError> {
    let mut handle = handle.clone();
    let responses = handle.request(req).map_err(|e| NetlinkError::Connection { op, reason: e.to_string() })?;
    collect_answer(responses, op, target, timeout).await
}

/// The inner messages of one request's answer (`responses`), up to its end: the kernel's
/// errno, an overrun, a dump marked interrupted (`NLM_F_DUMP_INTR`) or no end within
/// `timeout` is an error about `op` on `target`.
async fn collect_answer<I>(
    responses: impl futures::Stream<Item = NetlinkMessage<I>>,
    op: NetlinkOp,
    target: String,
    timeout: Duration,
) -> Result<Vec<I>, NetlinkError> {
    let collect = async {
        let mut responses = std::pin::pin!(responses);
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

/// Every nexthop object of every family as the kernel reports it (groups with their members):
/// one `RTM_GETNEXTHOP` dump on `handle`.
///
/// # Errors
/// [`NetlinkError`] as [`collect_answer`] gives it (`EOPNOTSUPP` before Linux 5.3).
pub(super) async fn nexthop_messages(
    handle: &rtnetlink::proto::ConnectionHandle<NexthopMessage>,
    timeout: Duration,
) -> Result<Vec<NexthopMessage>, NetlinkError> {
    let op = NetlinkOp::DumpNexthops;
    let responses = handle.request(nexthop_dump_request(), SocketAddr::new(0, 0)).map_err(|e| NetlinkError::Connection { op, reason: e.to_string() })?;
    collect_answer(responses, op, "all".into(), timeout).await
}

/// Run route dump `req` (about `target`) and parse the routes in its answer. A table that does
/// not exist yet answers `ENOENT`: it is empty (Felix does the same).
pub(super) async fn dump_routes_with(
    handle: rtnetlink::Handle,
    req: NetlinkMessage<RouteNetlinkMessage>,
    target: String,
    timeout: Duration,
) -> Result<Vec<ObservedRoute>, NetlinkError> {
    match request(&handle, req, NetlinkOp::DumpRoutes, target, timeout).await {
        Ok(msgs) => Ok(msgs
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewRoute(r) => parse_route(r),
                _ => None,
            })
            .collect()),
        Err(NetlinkError::Kernel { errno: nix::errno::Errno::ENOENT, .. }) => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

impl KernelDump {
    /// Every policy rule of `family` (`RTM_GETRULE` dump), in the kernel's order (ascending
    /// priority).
    ///
    /// # Errors
    /// [`NetlinkError`] when the dump fails or times out.
    pub async fn rules(&self, family: Family) -> Result<Vec<ObservedRule>, NetlinkError> {
        let msgs = request(self.handle(), rule_dump_request(family), NetlinkOp::DumpRules, family.label().into(), self.timeout()).await?;
        Ok(msgs
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewRule(r) => parse_rule(r),
                _ => None,
            })
            .collect())
    }

    /// Create `from all lookup <table> priority <priority> proto <protocol>` in `family`
    /// ([`table_rule_request`]). The one write this read-mostly handle makes; the caller
    /// checks a dump first, so an existing identical rule is never written again.
    ///
    /// # Errors
    /// [`NetlinkError::Kernel`] with `EEXIST` when an identical rule is there already, or
    /// another errno; a timeout.
    pub async fn add_table_rule(&self, family: Family, table: u32, priority: u32, protocol: u8) -> Result<(), NetlinkError> {
        let target = format!("{} lookup {table} priority {priority} proto {protocol}", family.label());
        request(self.handle(), table_rule_request(family, table, priority, protocol), NetlinkOp::WriteRule, target, self.timeout()).await.map(|_| ())
    }
}
