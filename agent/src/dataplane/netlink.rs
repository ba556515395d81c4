//! The side-effect edge of the dataplane: the [`RouteNetlink`] trait (dump routes, dump links,
//! execute a batch of route writes and deletes) and [`Clock`], with their real
//! implementations over rtnetlink ([`RtNetlink`]) and the system clock.
//!
//! Behind traits so the reconciler's logic is tested without root (Felix `routetable` keeps
//! its netlink handle and clock behind interfaces for the same reason).

use std::future::Future;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::StreamExt;
use nix::sys::socket::{getsockopt, setsockopt, sockopt};
use rtnetlink::packet_core::{NetlinkBuffer, NetlinkMessage, NetlinkPayload, NLMSG_ALIGNTO, NLMSG_ERROR, NLM_F_ACK, NLM_F_DUMP_INTR, NLM_F_REQUEST};
use rtnetlink::packet_route::link::{LinkAttribute, LinkFlags};
use rtnetlink::packet_route::RouteNetlinkMessage;
use rtnetlink::sys::protocols::NETLINK_ROUTE;
use rtnetlink::sys::{AsyncSocket, AsyncSocketExt, SocketAddr, TokioSocket};

use super::batch_sender::{BatchSender, Sent};
use super::kernel_route::{
    all_tables_dump_request, delete_request, dump_request, dump_request_both_families, parse_route, write_request, Family, KernelRoute, ObservedRoute, RouteKey,
};
use super::nexthop::{group_members, nexthop_dump_request, nexthop_request, parse_nexthop, NexthopMessage, NexthopOp, ObservedNexthop};

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
    /// handles this one (issue 18). A chunk still out when a pass was dropped before its last
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

/// [`RouteNetlink`] over rtnetlink with strict checking (`NETLINK_GET_STRICT_CHK`, so dumps
/// are filtered in the kernel).
///
/// Dumps go through an rtnetlink connection. Writes and deletes are batched on a second,
/// plain `NETLINK_ROUTE` socket: up to `window` route messages (and at most
/// [`MAX_BATCH_BYTES`]) are packed into one `sendmsg`, each with its own sequence number, and
/// only the last with `NLM_F_ACK`. The kernel processes the messages of one buffer in order
/// inside `sendmsg`, carrying on after a failed one, and answers every failed message with
/// its errno whatever its flags (`netlink_rcv_skb` acks when `NLM_F_ACK` is set *or* the
/// handler failed), so once the last message's answer is read every failure of the batch has
/// been read before it, and each message without one succeeded: one `sendmsg` and one `recv`
/// per batch (plus one per failure) replace a round trip per route, and the kernel builds no
/// ack for a message that worked.
/// Both sockets live in the network namespace of the thread that called
/// [`RtNetlink::connect`]. Clones share both sockets; batches from clones are serialized.
#[derive(Clone, Debug)]
pub struct RtNetlink {
    handle: rtnetlink::Handle,
    /// A connection typed [`NexthopMessage`] for the nexthop dump (rtnetlink's cannot decode
    /// nexthop messages).
    nexthop_handle: rtnetlink::proto::ConnectionHandle<NexthopMessage>,
    batcher: Arc<tokio::sync::Mutex<Batcher>>,
    window: usize,
    /// Messages one batch may hold on the batch socket ([`BatchLimits`]).
    batch_messages: usize,
    timeout: Duration,
}

/// Route messages per `sendmsg` (the batch size), at most: fewer when the batch socket's
/// receive buffer could not hold an answer to each of them ([`ANSWER_BYTES`]). Each answer (a
/// failure, or the batch's last message) is queued before the first is read (the kernel
/// handles the whole buffer inside `sendmsg`), so a batch in which every message fails, 1,024
/// answers, needs about 1.5 MiB; the buffer is forced to 4 MiB where the agent may
/// (`CAP_NET_ADMIN`), else raised up to `net.core.rmem_max` (208 KiB by default, doubled: a
/// window of 277). 1,024 rather than 256: a quarter of the sends, each a hand-off to the
/// sending thread (issue 18).
pub const DEFAULT_WINDOW: usize = 1024;
/// Upper bound on the bytes of one batch (`sendmsg` payload); a batch closes at `window`
/// messages or at this size, whichever comes first (1,024 route messages of 72 to 100 bytes
/// fit). One netlink `sendmsg` is bounded by `sk_sndbuf` - 32: the send buffer is raised to
/// fit, and where it cannot be the batches shrink to it.
pub const MAX_BATCH_BYTES: usize = 160 * 1024;
/// Room one answer of the batch socket takes in its receive buffer, bytes (an error answer's
/// skb `truesize`: about 1.25 KiB with the extended-ack message, rounded up).
const ANSWER_BYTES: usize = 1536;
/// Per-request (dumps) and per-batch (writes) timeout (Felix `NetlinkTimeoutSecs` default 10 s).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Receive buffer for one datagram on the batch socket, bytes: acks are 36 bytes, error acks
/// echo the request plus extended-ack attributes (well under 1 KiB for a route message).
const RECV_BUF_BYTES: usize = 64 * 1024;
/// Socket receive buffer asked for, bytes (forced on the batch socket where the agent may,
/// else `SO_RCVBUF`, capped by `net.core.rmem_max`).
const SOCKET_RCVBUF_BYTES: usize = 4 * 1024 * 1024;
/// Batch socket send buffer asked for, bytes: one batch of [`MAX_BATCH_BYTES`] and the 32
/// bytes `netlink_sendmsg` keeps back, with room to spare.
const SOCKET_SNDBUF_BYTES: usize = 2 * MAX_BATCH_BYTES;

/// The most one batch may hold on a batch socket, from the buffers the kernel granted it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BatchLimits {
    /// Messages: every one of them may be answered (a failure) before the first answer is
    /// read.
    messages: usize,
    /// Bytes of one `sendmsg`.
    bytes: usize,
}

impl BatchLimits {
    /// Limits for a socket whose kernel-reported (doubled) receive and send buffers are
    /// `rcvbuf` and `sndbuf` bytes: as many messages as answers fit the receive buffer (at
    /// most [`DEFAULT_WINDOW`], at least 1) and the bytes `netlink_sendmsg` accepts
    /// (`sk_sndbuf` - 32, at most [`MAX_BATCH_BYTES`]; a single larger message still goes
    /// alone and fails on its own).
    fn granted(rcvbuf: usize, sndbuf: usize) -> Self {
        BatchLimits { messages: (rcvbuf / ANSWER_BYTES).clamp(1, DEFAULT_WINDOW), bytes: sndbuf.saturating_sub(32).min(MAX_BATCH_BYTES) }
    }
}

impl RtNetlink {
    /// Open a strict-checking rtnetlink connection (spawning its driver on the current tokio
    /// runtime) and the batch socket. Both sockets live in the network namespace of the
    /// calling thread.
    ///
    /// # Errors
    /// [`NetlinkError::Connection`] if a socket cannot be opened or configured.
    pub fn connect() -> Result<Self, NetlinkError> {
        let conn_err = |e: std::io::Error| NetlinkError::Connection { op: NetlinkOp::Connect, reason: e.to_string() };
        let (mut conn, handle, _unsolicited) = rtnetlink::new_connection_with_strict_check().map_err(conn_err)?;
        // A larger receive buffer keeps big dumps from hitting ENOBUFS.
        let _ = conn.socket_mut().socket_mut().set_rx_buf_sz(SOCKET_RCVBUF_BYTES);
        conn.socket_mut().socket_mut().set_ext_ack(true).map_err(conn_err)?;
        // Bound now (not at the first send), so the route watch, started after this, finds
        // the port among this process's and labels our writes `self` from the first one.
        conn.socket_mut().socket_mut().bind_auto().map_err(conn_err)?;
        let (mut nh_conn, nexthop_handle, _unsolicited) = rtnetlink::proto::new_connection::<NexthopMessage>(NETLINK_ROUTE).map_err(conn_err)?;
        nh_conn.socket_mut().socket_mut().set_netlink_get_strict_chk(true).map_err(conn_err)?;
        nh_conn.socket_mut().socket_mut().set_ext_ack(true).map_err(conn_err)?;
        let batcher = Batcher::open().map_err(conn_err)?;
        let batch_messages = batcher.limits.messages;
        tokio::spawn(conn);
        tokio::spawn(nh_conn);
        Ok(RtNetlink {
            handle,
            nexthop_handle,
            batcher: Arc::new(tokio::sync::Mutex::new(batcher)),
            window: DEFAULT_WINDOW,
            batch_messages,
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// Set how many route messages go into one `sendmsg` (at least 1; 1 = one round trip per
    /// route).
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

/// The batch socket: a plain `NETLINK_ROUTE` socket bound to an automatic port and connected
/// to the kernel, with the next sequence number and reusable send/receive buffers.
struct Batcher {
    socket: TokioSocket,
    /// The thread batches are sent from while this task builds the next, started when the
    /// socket opens, so its start overlaps the caller's work before a cold start's first
    /// batch (issue 18); on sockets that never pipeline (a pass of one batch, the audit's,
    /// the host NIC's) it stays idle in a blocking receive. It holds a duplicate of the
    /// socket's descriptor, so the socket stays open until a send returns even if the batcher
    /// is dropped meanwhile (a cancelled apply). `None`: it could not be started (said
    /// once), and batches go out from this task.
    sender: Option<BatchSender>,
    /// What one batch may hold on this socket.
    limits: BatchLimits,
    /// Next sequence number (wrapping). Acks carrying a number outside the batch in flight
    /// (left over from a batch that timed out or was cancelled) are ignored.
    seq: u32,
    send_buf: Vec<u8>,
    /// The batch after the one in the kernel, serialized while the kernel handles that one.
    next_buf: Vec<u8>,
    recv_buf: Vec<u8>,
    /// The batch in the kernel, when a call returned before it was answered (the last of a
    /// pipelined chunk).
    in_flight: Option<InFlight>,
    /// The chunk [`in_flight`](Self::in_flight) belongs to, with its results so far.
    open: Option<Executed>,
}

/// A batch in the kernel: its `sendmsg` runs on the [`BatchSender`] thread (which gives the
/// buffer back); its answers are not read yet.
struct InFlight {
    send: tokio::sync::oneshot::Receiver<Sent>,
    /// Sequence number of its first op.
    base: u32,
    pending: Vec<Pending>,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher").field("fd", &self.socket.as_raw_fd()).field("seq", &self.seq).finish_non_exhaustive()
    }
}

/// One serialized op of a batch: what its error reports (formatted only for an error).
struct Pending {
    op: NetlinkOp,
    target: OpTarget,
}

/// What an op of a batch acts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpTarget {
    Route(RouteKey),
    Nexthop(u32),
}

impl std::fmt::Display for OpTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpTarget::Route(key) => key.fmt(f),
            OpTarget::Nexthop(id) => f.write_str(&nexthop_target(*id)),
        }
    }
}

/// A request of a batch, framed with the message type it carries.
enum Framed {
    Route(NetlinkMessage<RouteNetlinkMessage>),
    Nexthop(NetlinkMessage<NexthopMessage>),
}

impl Framed {
    /// Clear `NLM_F_ACK`, set the sequence number and port, fix the length; returns the
    /// message length in bytes.
    fn frame(&mut self, seq: u32) -> usize {
        fn frame<I: rtnetlink::packet_core::NetlinkSerializable>(m: &mut NetlinkMessage<I>, seq: u32) -> usize {
            m.header.flags = (m.header.flags | NLM_F_REQUEST) & !NLM_F_ACK;
            m.header.sequence_number = seq;
            m.header.port_number = 0;
            m.finalize();
            // `finalize` stored the length it computed (a walk of every attribute).
            m.header.length as usize
        }
        match self {
            Framed::Route(m) => frame(m, seq),
            Framed::Nexthop(m) => frame(m, seq),
        }
    }

    fn serialize(&self, buf: &mut [u8]) {
        match self {
            Framed::Route(m) => m.serialize(buf),
            Framed::Nexthop(m) => m.serialize(buf),
        }
    }
}

/// An op the batch socket sends: its request and what its result reports.
trait BatchOp {
    fn request(&self) -> (Framed, Pending);
}

impl BatchOp for RouteOp {
    fn request(&self) -> (Framed, Pending) {
        match self {
            RouteOp::Write { route, oif, nexthop, exclusive } => {
                (Framed::Route(write_request(route, *oif, *nexthop, *exclusive)), Pending { op: NetlinkOp::WriteRoute, target: OpTarget::Route(route.key) })
            }
            RouteOp::Delete { key, protocol } => {
                (Framed::Route(delete_request(key, *protocol)), Pending { op: NetlinkOp::DeleteRoute, target: OpTarget::Route(*key) })
            }
        }
    }
}

impl BatchOp for NexthopOp {
    fn request(&self) -> (Framed, Pending) {
        let op = match self {
            NexthopOp::Write { .. } => NetlinkOp::WriteNexthop,
            NexthopOp::Delete { .. } => NetlinkOp::DeleteNexthop,
        };
        (Framed::Nexthop(nexthop_request(self)), Pending { op, target: OpTarget::Nexthop(self.id()) })
    }
}

/// Result slot per op of a batch, index = sequence number - the batch's first.
type Slots = [Option<Result<(), NetlinkError>>];

impl Batcher {
    /// Open, bind and connect the socket (strict checking, extended acks, large receive
    /// buffer) in the calling thread's network namespace.
    fn open() -> std::io::Result<Self> {
        let mut socket = TokioSocket::new(NETLINK_ROUTE)?;
        let sock = socket.socket_mut();
        sock.bind_auto()?;
        sock.connect(&SocketAddr::new(0, 0))?;
        sock.set_netlink_get_strict_chk(true)?;
        sock.set_ext_ack(true)?;
        // Answers carry no copy of the request (the sequence number and errno are all
        // `fill_slots` reads): smaller answers, more of them fit the receive buffer.
        sock.set_cap_ack(true)?;
        let fd = sock.as_fd();
        // Forced where the agent may (CAP_NET_ADMIN), else capped by rmem_max / wmem_max. The
        // kernel reports the doubled sizes it uses; the batches are sized to what it granted.
        if setsockopt(&fd, sockopt::RcvBufForce, &SOCKET_RCVBUF_BYTES).is_err() {
            let _ = setsockopt(&fd, sockopt::RcvBuf, &SOCKET_RCVBUF_BYTES);
        }
        if setsockopt(&fd, sockopt::SndBufForce, &SOCKET_SNDBUF_BYTES).is_err() {
            let _ = setsockopt(&fd, sockopt::SndBuf, &SOCKET_SNDBUF_BYTES);
        }
        let rcvbuf = getsockopt(&fd, sockopt::RcvBuf).map_err(std::io::Error::from)?;
        let sndbuf = getsockopt(&fd, sockopt::SndBuf).map_err(std::io::Error::from)?;
        let limits = BatchLimits::granted(rcvbuf, sndbuf);
        let sender = match fd.try_clone_to_owned().and_then(BatchSender::start) {
            Ok(sender) => Some(sender),
            Err(e) => {
                tracing::warn!(error = %e, "netlink send thread not started: batches are sent one after another");
                None
            }
        };
        Ok(Batcher {
            socket,
            sender,
            limits,
            seq: 1,
            send_buf: Vec::new(),
            next_buf: Vec::new(),
            recv_buf: Vec::with_capacity(RECV_BUF_BYTES),
            in_flight: None,
            open: None,
        })
    }

    /// Run `ops` in order, in batches of at most `window` messages and [`MAX_BATCH_BYTES`]
    /// bytes (fewer where the socket's buffers are smaller: [`BatchLimits`]); `timeout`
    /// applies per batch. Returns one result per op, in order.
    ///
    /// When there is more than one batch, each batch but the last is sent from the
    /// [`BatchSender`] thread while this task serializes the next: the kernel handles a
    /// batch inside `sendmsg`, on the sending thread, so building batch n+1 overlaps the
    /// kernel's insert of batch n instead of following it (issue 18). Only one batch is in the
    /// kernel at a time, so the ops still run in order; the answers are read here, batch by
    /// batch. A single batch (the steady state: a few ops) is sent from this task.
    async fn execute<T: BatchOp>(&mut self, ops: &[T], window: usize, timeout: Duration) -> Vec<Result<(), NetlinkError>> {
        // A pipelined chunk's batch still in the kernel is answered first; the chunk stays
        // for its pass's next call.
        self.settle(timeout).await;
        let mut results = Vec::with_capacity(ops.len());
        self.run_ops(ops, window, timeout, false, None, &mut results).await;
        results
    }

    /// One chunk of a write pass ([`RouteNetlink::execute_chunk`]), pipelined: its batches
    /// go out as in [`execute`](Self::execute), but the last stays in the kernel when the call
    /// returns (unless `place.last`), and the chunk comes back from the next call, whose
    /// caller has meanwhile recorded the chunk before and planned this one.
    async fn execute_chunk(&mut self, ops: Vec<RouteOp>, place: ChunkPlace, window: usize, timeout: Duration) -> Vec<Executed> {
        if place.first {
            // Left by a pass that was dropped before its last chunk: its answers are read
            // (none is taken for a later batch's), its results go nowhere (the ops stayed
            // dirty in the reconciler, which was dropped with the pass).
            self.settle(timeout).await;
            self.open = None;
        }
        let mut results = Vec::with_capacity(ops.len());
        // The chunk before, its last batch in flight (if not answered by a plain `execute`
        // meanwhile): that batch is landed after this chunk's first batch is serialized, so
        // the serializing overlaps the kernel's insert.
        let mut open = self.open.take();
        let earlier = if self.in_flight.is_some() { open.as_mut().map(|o| &mut o.results) } else { None };
        self.run_ops(&ops, window, timeout, !place.last, earlier, &mut results).await;
        let mut done: Vec<Executed> = open.into_iter().collect();
        if ops.is_empty() {
            return done;
        }
        if self.in_flight.is_some() {
            self.open = Some(Executed { ops, results });
        } else {
            done.push(Executed { ops, results });
        }
        done
    }

    /// Send `ops` in batches, one in the kernel at a time, each serialized while the one
    /// before is in the kernel; results are appended to `results` as batches are landed.
    /// `earlier`: where the results of the batch in flight on entry go (a chunk before this
    /// one; `None`: no batch is in flight, or it belongs to `results`). With `leave_last`, the
    /// last batch is left in flight ([`InFlight`]); otherwise it is sent from this task and
    /// every result is in on return. The batch in flight on entry is landed either way.
    async fn run_ops<T: BatchOp>(
        &mut self,
        ops: &[T],
        window: usize,
        timeout: Duration,
        leave_last: bool,
        mut earlier: Option<&mut Vec<Result<(), NetlinkError>>>,
        results: &mut Vec<Result<(), NetlinkError>>,
    ) {
        let mut at = 0;
        loop {
            let next = self.serialize_next(&ops[at..], window);
            // Past the last batch, one left in flight stays there unless it came from before.
            if next.is_some() || earlier.is_some() || !leave_last {
                if let Some(f) = self.in_flight.take() {
                    self.land(f, timeout, earlier.take().unwrap_or(&mut *results)).await;
                }
            }
            let Some((base, pending)) = next else { return };
            at += pending.len();
            self.dispatch(base, pending, leave_last || at < ops.len(), timeout, results).await;
        }
    }

    /// Serialize the first batch of `ops` into `next_buf`, taking its sequence numbers; none
    /// when `ops` is empty.
    fn serialize_next<T: BatchOp>(&mut self, ops: &[T], window: usize) -> Option<(u32, Vec<Pending>)> {
        let limits = BatchLimits { messages: window.min(self.limits.messages), bytes: self.limits.bytes };
        let base = self.seq;
        let pending = serialize(&mut self.next_buf, base, ops, limits);
        if pending.is_empty() {
            return None;
        }
        self.seq = base.wrapping_add(u32::try_from(pending.len()).unwrap_or(u32::MAX));
        Some((base, pending))
    }

    /// Send the batch in `next_buf` (no batch in flight): from the [`BatchSender`] thread,
    /// left in flight, when `in_background` (and the thread runs); else from this task, its
    /// answers read into `results`.
    async fn dispatch(&mut self, base: u32, pending: Vec<Pending>, in_background: bool, timeout: Duration, results: &mut Vec<Result<(), NetlinkError>>) {
        std::mem::swap(&mut self.send_buf, &mut self.next_buf);
        let buf = std::mem::take(&mut self.send_buf);
        if let Some(sender) = self.sender.as_mut().filter(|_| in_background) {
            let send = sender.send(buf);
            self.in_flight = Some(InFlight { send, base, pending });
        } else {
            let sent = self.send(&buf).await;
            self.send_buf = buf;
            self.run_batch(base, pending, sent, timeout, results).await;
        }
    }

    /// Wait for batch `f` to leave `sendmsg` and read its answers into `results`.
    async fn land(&mut self, f: InFlight, timeout: Duration, results: &mut Vec<Result<(), NetlinkError>>) {
        let sent = match f.send.await {
            Ok((buf, bytes)) => {
                let sent = bytes.and_then(|n| check_sent(n, buf.len()));
                self.send_buf = buf;
                sent
            }
            // The send thread ended: the buffer is lost with it.
            Err(_) => Err(std::io::Error::other("the netlink send thread ended")),
        };
        self.run_batch(f.base, f.pending, sent, timeout, results).await;
    }

    /// Read the answers of the batch in flight, if any, into the chunk it belongs to.
    async fn settle(&mut self, timeout: Duration) {
        if let Some(f) = self.in_flight.take() {
            let mut open = self.open.take().unwrap_or(Executed { ops: Vec::new(), results: Vec::new() });
            self.land(f, timeout, &mut open.results).await;
            self.open = Some(open);
        }
    }

    /// Send `buf` in one `sendmsg` from this task.
    async fn send(&mut self, buf: &[u8]) -> std::io::Result<()> {
        let sent = self.socket.send(buf).await?;
        check_sent(sent, buf.len())
    }

    /// Collect the answers of a sent batch (the ops of `pending`, sequence numbers from
    /// `base`; `sent` is how its `sendmsg` went) up to the last op's, appending one result
    /// per op to `results`.
    ///
    /// Per op: an answer with a negative errno → [`NetlinkError::Kernel`] with it; no answer
    /// of its own once the last op's answer is read → `Ok` (the kernel answers every failure,
    /// in order); no answer of the last op within `timeout` → [`NetlinkError::Timeout`] for
    /// every op without an error; answers dropped because the receive buffer overflowed →
    /// `Kernel` with `ENOBUFS` for every op without an answer of its own (a dropped answer may
    /// have been a failure); send or receive failure → [`NetlinkError::Connection`].
    async fn run_batch(&mut self, base: u32, pending: Vec<Pending>, sent: std::io::Result<()>, timeout: Duration, results: &mut Vec<Result<(), NetlinkError>>) {
        let mut slots: Vec<Option<Result<(), NetlinkError>>> = vec![None; pending.len()];
        let outcome = match sent {
            Ok(()) => match tokio::time::timeout(timeout, self.collect(base, &pending, &mut slots)).await {
                Ok(outcome) => outcome,
                Err(_) => Err(BatchFailure::Timeout),
            },
            Err(e) => Err(BatchFailure::Io(format!("send batch: {e}"))),
        };
        // Every slot is filled when the batch was answered in full: the failure is never used.
        let failure = outcome.err().unwrap_or(BatchFailure::Overrun);
        for (slot, p) in slots.into_iter().zip(pending) {
            results.push(slot.unwrap_or_else(|| {
                Err(match &failure {
                    BatchFailure::Overrun => NetlinkError::Kernel { op: p.op, target: p.target.to_string(), errno: nix::errno::Errno::ENOBUFS },
                    BatchFailure::Timeout => NetlinkError::Timeout { op: p.op, target: p.target.to_string(), timeout },
                    BatchFailure::Io(reason) => NetlinkError::Connection { op: p.op, reason: reason.clone() },
                })
            }));
        }
    }

    /// Fill `slots` from the answers of a sent batch until the last op's is read, then the
    /// slots still empty with `Ok`.
    ///
    /// # Errors
    /// [`BatchFailure::Io`] if receiving fails; [`BatchFailure::Overrun`] if the kernel
    /// reported dropped messages (`recv` fails with `ENOBUFS`): the queue is drained (the
    /// kernel handles the whole batch inside `sendmsg`, so every answer it did not drop is
    /// queued by then) and the slots still empty stay empty, since a dropped answer may have
    /// been any of them failing.
    async fn collect(&mut self, base: u32, pending: &[Pending], slots: &mut Slots) -> Result<(), BatchFailure> {
        let mut last_answered = false;
        let mut overrun = false;
        while !last_answered {
            self.recv_buf.clear();
            let received = if overrun {
                match self.socket.socket_ref().recv(&mut self.recv_buf, nix::libc::MSG_DONTWAIT) {
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Err(BatchFailure::Overrun),
                    other => other.map(drop),
                }
            } else {
                self.socket.recv(&mut self.recv_buf).await.map(drop)
            };
            match received {
                Ok(()) => last_answered = fill_slots(&self.recv_buf, base, pending, slots),
                Err(e) if e.raw_os_error() == Some(nix::libc::ENOBUFS) => overrun = true,
                Err(e) => return Err(BatchFailure::Io(format!("receive acks: {e}"))),
            }
        }
        if overrun {
            return Err(BatchFailure::Overrun);
        }
        for slot in slots.iter_mut().filter(|s| s.is_none()) {
            *slot = Some(Ok(()));
        }
        Ok(())
    }
}

/// A `sendmsg` of `len` bytes that sent `sent`: a short send is an error.
fn check_sent(sent: usize, len: usize) -> std::io::Result<()> {
    if sent == len {
        Ok(())
    } else {
        Err(std::io::Error::other(format!("short send: {sent} of {len} bytes")))
    }
}

/// Serialize the longest prefix of `ops` that fits one batch of `limits` into `buf` (cleared
/// first; at least one op, even if it alone exceeds `limits.bytes`), sequence numbers
/// consecutive from `seq`, `NLM_F_ACK` on the last message only. Returns the serialized ops,
/// in order (the prefix length is its length); none when `ops` is empty.
fn serialize<T: BatchOp>(buf: &mut Vec<u8>, mut seq: u32, ops: &[T], limits: BatchLimits) -> Vec<Pending> {
    buf.clear();
    let mut pending = Vec::with_capacity(limits.messages.min(ops.len()));
    let mut last_start = 0;
    for op in ops.iter().take(limits.messages) {
        let (mut req, p) = op.request();
        let len = req.frame(seq);
        let start = buf.len();
        if !pending.is_empty() && start + align(len) > limits.bytes {
            break;
        }
        buf.resize(start + align(len), 0);
        req.serialize(&mut buf[start..start + len]);
        pending.push(p);
        last_start = start;
        seq = seq.wrapping_add(1);
    }
    if !pending.is_empty() {
        // The batch's last message asks for the ack that closes the batch.
        let mut last = NetlinkBuffer::new(&mut buf[last_start..]);
        let flags = last.flags();
        last.set_flags(flags | NLM_F_ACK);
    }
    pending
}

/// Why a batch ended with ops still unanswered.
enum BatchFailure {
    /// The receive buffer overflowed: answers were dropped.
    Overrun,
    /// No ack within the timeout.
    Timeout,
    /// Sending or receiving failed (the reason).
    Io(String),
}

/// `len` bytes rounded up to the netlink message alignment (`NLMSG_ALIGN`, 4 bytes).
fn align(len: usize) -> usize {
    len.next_multiple_of(usize::from(NLMSG_ALIGNTO))
}

/// Walk the netlink messages in one received datagram `buf` and fill the slot of every
/// `NLMSG_ERROR` whose sequence number is in `base..base + slots.len()` and whose slot is
/// still empty (code 0 → `Ok`, negative errno → [`NetlinkError::Kernel`] for that op). Other
/// messages and answers of other sequence numbers are ignored; a malformed message ends the
/// walk (nothing after it can be framed). Returns whether the last slot was filled (the answer
/// that closes the batch).
fn fill_slots(buf: &[u8], base: u32, pending: &[Pending], slots: &mut Slots) -> bool {
    let mut last_answered = false;
    let mut off = 0;
    while let Some(rest) = buf.get(off..) {
        let Ok(nl) = NetlinkBuffer::new_checked(rest) else { break };
        let len = nl.length() as usize;
        let idx = nl.sequence_number().wrapping_sub(base) as usize;
        if nl.message_type() == NLMSG_ERROR {
            if let (Some(slot @ None), Some(p)) = (slots.get_mut(idx), pending.get(idx)) {
                if let Ok(NetlinkMessage { payload: NetlinkPayload::Error(e), .. }) = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&rest[..len]) {
                    *slot = Some(match e.code {
                        None => Ok(()),
                        Some(code) => Err(NetlinkError::Kernel { op: p.op, target: p.target.to_string(), errno: errno_of(code.get()) }),
                    });
                    last_answered |= idx + 1 == slots.len();
                }
            }
        }
        off += align(len);
    }
    last_answered
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
async fn nexthop_messages(handle: &rtnetlink::proto::ConnectionHandle<NexthopMessage>, timeout: Duration) -> Result<Vec<NexthopMessage>, NetlinkError> {
    let op = NetlinkOp::DumpNexthops;
    let responses = handle.request(nexthop_dump_request(), SocketAddr::new(0, 0)).map_err(|e| NetlinkError::Connection { op, reason: e.to_string() })?;
    collect_answer(responses, op, "all".into(), timeout).await
}

/// Run route dump `req` (about `target`) and parse the routes in its answer. A table that does
/// not exist yet answers `ENOENT`: it is empty (Felix does the same).
async fn dump_routes_with(
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

impl RouteNetlink for RtNetlink {
    fn dump_routes(&mut self, family: Family, table: u32, protocol: u8) -> impl Future<Output = Result<Vec<ObservedRoute>, NetlinkError>> + Send {
        let target = format!("{} table {table} proto {protocol}", family.label());
        dump_routes_with(self.handle.clone(), dump_request(family, table, protocol), target, self.timeout)
    }

    fn dump_routes_both_families(&mut self, table: u32, protocol: u8) -> impl Future<Output = Result<Vec<ObservedRoute>, NetlinkError>> + Send {
        let target = format!("table {table} proto {protocol}");
        dump_routes_with(self.handle.clone(), dump_request_both_families(table, protocol), target, self.timeout)
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
        let batcher = Arc::clone(&self.batcher);
        let timeout = self.timeout;
        let window = self.window;
        // Borrowed, not copied: the future lives no longer than `ops` (a trait method's
        // `impl Future` captures the argument's lifetime).
        async move { batcher.lock().await.execute(ops, window, timeout).await }
    }

    fn write_chunk(&self) -> usize {
        self.window.min(self.batch_messages)
    }

    fn execute_chunk(&mut self, ops: Vec<RouteOp>, place: ChunkPlace) -> impl Future<Output = Vec<Executed>> + Send {
        let batcher = Arc::clone(&self.batcher);
        let timeout = self.timeout;
        let window = self.window;
        async move { batcher.lock().await.execute_chunk(ops, place, window, timeout).await }
    }

    fn dump_nexthops(&mut self) -> impl Future<Output = Result<Vec<ObservedNexthop>, NetlinkError>> + Send {
        let handle = self.nexthop_handle.clone();
        let timeout = self.timeout;
        async move { Ok(nexthop_messages(&handle, timeout).await?.iter().filter_map(parse_nexthop).collect()) }
    }

    fn execute_nexthops(&mut self, ops: &[NexthopOp]) -> impl Future<Output = Vec<Result<(), NetlinkError>>> + Send {
        let batcher = Arc::clone(&self.batcher);
        let timeout = self.timeout;
        let window = self.window;
        async move { batcher.lock().await.execute(ops, window, timeout).await }
    }

    fn nexthops_in_use(&mut self, ids: &[u32]) -> impl Future<Output = Result<std::collections::BTreeSet<u32>, NetlinkError>> + Send {
        let (handle, nexthop_handle) = (self.handle.clone(), self.nexthop_handle.clone());
        let timeout = self.timeout;
        let wanted: std::collections::BTreeSet<u32> = ids.iter().copied().collect();
        async move {
            // A group of another writer that holds one of them uses it too: the kernel
            // deletes a group whose last member goes, and the routes through the group.
            let groups = nexthop_messages(&nexthop_handle, timeout).await?;
            let mut used: std::collections::BTreeSet<u32> = groups.iter().flat_map(group_members).filter(|id| wanted.contains(id)).collect();
            let routes = dump_routes_with(handle, all_tables_dump_request(), "all tables".into(), timeout).await?;
            used.extend(routes.iter().filter_map(|r| r.nexthop).filter(|id| wanted.contains(id)));
            Ok(used)
        }
    }
}

impl RtNetlink {
    /// Every address of every link in this network namespace, as `(ifindex, address)`, both
    /// families (`RTM_GETADDR` dump; the local address, `IFA_LOCAL`, where the kernel gives
    /// one, else `IFA_ADDRESS`).
    ///
    /// # Errors
    /// [`NetlinkError`] when the dump fails or times out.
    pub async fn dump_addresses(&self) -> Result<Vec<(u32, std::net::IpAddr)>, NetlinkError> {
        use rtnetlink::packet_route::address::{AddressAttribute, AddressMessage};
        let mut msg = AddressMessage::default();
        msg.header.family = rtnetlink::packet_route::AddressFamily::Unspec;
        let mut req = NetlinkMessage::from(RouteNetlinkMessage::GetAddress(msg));
        req.header.flags = rtnetlink::packet_core::NLM_F_REQUEST | rtnetlink::packet_core::NLM_F_DUMP;
        let msgs = request(&self.handle, req, NetlinkOp::DumpAddresses, "all".to_string(), self.timeout).await?;
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
}

/// Extract [`LinkInfo`] from a link message; `None` without a name.
pub fn link_info(l: &rtnetlink::packet_route::link::LinkMessage) -> Option<LinkInfo> {
    let name = l.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(n) => Some(n.clone()),
        _ => None,
    })?;
    Some(LinkInfo { index: l.header.index, name, up: l.header.flags.contains(LinkFlags::Up) })
}

#[cfg(test)]
mod tests {
    use rtnetlink::packet_core::{ErrorMessage, NetlinkHeader};

    use super::*;
    use crate::dataplane::kernel_route::{RouteKind, RouteTarget};

    fn key(dst: &str) -> RouteKey {
        RouteKey::new(254, dst.parse().unwrap(), 0, 1024)
    }

    fn pending(dsts: &[&str]) -> Vec<Pending> {
        dsts.iter().map(|d| Pending { op: NetlinkOp::WriteRoute, target: OpTarget::Route(key(d)) }).collect()
    }

    /// An `NLMSG_ERROR` answer to sequence number `seq` with `code` (0: an ack).
    fn answer(seq: u32, code: i32) -> Vec<u8> {
        let mut e = ErrorMessage::default();
        e.code = std::num::NonZeroI32::new(code);
        e.header = vec![0; 16];
        let mut header = NetlinkHeader::default();
        header.sequence_number = seq;
        let mut msg = NetlinkMessage::<RouteNetlinkMessage>::new(header, NetlinkPayload::Error(e));
        msg.finalize();
        let mut buf = vec![0; msg.buffer_len()];
        msg.serialize(&mut buf);
        buf
    }

    #[test]
    fn fill_slots_takes_failures_and_closes_the_batch_at_the_last_answer() {
        let p = pending(&["10.244.1.0/26", "10.244.2.0/26", "10.244.3.0/26"]);
        let mut slots: Vec<Option<Result<(), NetlinkError>>> = vec![None; 3];
        // A failure of the second op, next to a stale answer from an earlier batch.
        let first = [answer(99, -1), answer(101, -nix::libc::EEXIST)].concat();
        assert!(!fill_slots(&first, 100, &p, &mut slots));
        assert_eq!(
            slots,
            [
                None,
                Some(Err(NetlinkError::Kernel { op: NetlinkOp::WriteRoute, target: key("10.244.2.0/26").to_string(), errno: nix::errno::Errno::EEXIST })),
                None
            ]
        );
        // The last op's ack closes the batch; the first op had no answer of its own.
        assert!(fill_slots(&answer(102, 0), 100, &p, &mut slots));
        assert_eq!(slots[0], None);
        assert_eq!(slots[2], Some(Ok(())));
    }

    #[test]
    fn fill_slots_closes_the_batch_on_a_failure_of_the_last_op() {
        let p = pending(&["10.244.1.0/26", "10.244.2.0/26"]);
        let mut slots: Vec<Option<Result<(), NetlinkError>>> = vec![None; 2];
        assert!(fill_slots(&answer(u32::MAX, -nix::libc::ENODEV), u32::MAX - 1, &p, &mut slots));
        assert_eq!(
            slots,
            [None, Some(Err(NetlinkError::Kernel { op: NetlinkOp::WriteRoute, target: key("10.244.2.0/26").to_string(), errno: nix::errno::Errno::ENODEV }))]
        );
    }

    #[test]
    fn batches_are_sized_to_the_buffers_the_kernel_granted() {
        // Forced 4 MiB (reported doubled): the full window and the full batch size.
        assert_eq!(BatchLimits::granted(8 << 20, 2 * SOCKET_SNDBUF_BYTES), BatchLimits { messages: DEFAULT_WINDOW, bytes: MAX_BATCH_BYTES });
        // Debian's rmem_max / wmem_default (212,992; the receive buffer doubled): an answer for
        // each of 277 messages, and sends up to the send buffer.
        assert_eq!(BatchLimits::granted(425_984, 212_992), BatchLimits { messages: 277, bytes: MAX_BATCH_BYTES });
        // Tiny buffers: one message a batch, sends that fit `sk_sndbuf` - 32.
        assert_eq!(BatchLimits::granted(256, 4608), BatchLimits { messages: 1, bytes: 4576 });
    }

    /// Flags and sequence numbers of the messages in `buf`.
    fn headers(buf: &[u8]) -> Vec<(u16, u32)> {
        let mut out = Vec::new();
        let mut off = 0;
        while off < buf.len() {
            let nl = NetlinkBuffer::new_checked(&buf[off..]).unwrap();
            out.push((nl.flags(), nl.sequence_number()));
            off += align(nl.length() as usize);
        }
        out
    }

    #[tokio::test]
    async fn only_the_last_message_of_a_batch_asks_for_an_ack() {
        use rtnetlink::packet_core::{NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};
        let target = RouteTarget {
            kind: RouteKind::Unicast,
            gateway: Some("10.0.0.12".parse().unwrap()),
            device: Some("eth0".into()),
            onlink: true,
            protocol: 80,
            scope: 0,
        };
        let write = |dst: &str, exclusive: bool| RouteOp::Write {
            route: KernelRoute { key: key(dst), target: target.clone() },
            oif: Some(2),
            nexthop: None,
            exclusive,
        };
        let ops = [write("10.244.1.0/26", true), RouteOp::Delete { key: key("10.244.2.0/26"), protocol: 80 }, write("10.244.3.0/26", false)];
        let mut buf = Vec::new();
        let p = serialize(&mut buf, 7, &ops, BatchLimits { messages: 256, bytes: MAX_BATCH_BYTES });
        assert_eq!(
            p.iter().map(|p| (p.op, p.target)).collect::<Vec<_>>(),
            [
                (NetlinkOp::WriteRoute, OpTarget::Route(key("10.244.1.0/26"))),
                (NetlinkOp::DeleteRoute, OpTarget::Route(key("10.244.2.0/26"))),
                (NetlinkOp::WriteRoute, OpTarget::Route(key("10.244.3.0/26")))
            ]
        );
        assert_eq!(
            headers(&buf),
            [(NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL, 7), (NLM_F_REQUEST, 8), (NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE, 9)]
        );
        // A window of 2: the batch ends at the second op, which asks for the ack.
        let p = serialize(&mut buf, 7, &ops, BatchLimits { messages: 2, bytes: MAX_BATCH_BYTES });
        assert_eq!(p.len(), 2);
        assert_eq!(headers(&buf), [(NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL, 7), (NLM_F_REQUEST | NLM_F_ACK, 8)]);
    }
}
