//! The batching writer: route and nexthop ops serialized into batches of up to
//! [`DEFAULT_WINDOW`] messages ([`MAX_BATCH_BYTES`]), handed to the [`BatchSender`] thread,
//! and each op's result read back from the batch's answers (only the last message asks for an
//! ack; the kernel answers every failure).

use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::time::Duration;

use nix::sys::socket::{getsockopt, setsockopt, sockopt};
use rtnetlink::packet_core::{NetlinkBuffer, NetlinkMessage, NLM_F_ACK, NLM_F_REQUEST};
use rtnetlink::packet_route::RouteNetlinkMessage;
use rtnetlink::sys::protocols::NETLINK_ROUTE;
use rtnetlink::sys::{Socket, SocketAddr};

use super::batch_sender::{align, landed, Answers, Batch, BatchFailure, BatchSender, Landed};
use super::netlink::{nexthop_target, ChunkPlace, Executed, NetlinkError, NetlinkOp, RouteOp};
use super::nexthop::{nexthop_request, NexthopMessage, NexthopOp};
use super::route::RouteKey;
use super::route_wire::{delete_request, emit_write_request, write_request};

/// Route messages per `sendmsg` (the batch size), at most: fewer when the batch socket's
/// receive buffer could not hold an answer to each of them ([`ANSWER_BYTES`]). Each answer (a
/// failure, or the batch's last message) is queued before the first is read (the kernel
/// handles the whole buffer inside `sendmsg`), so a batch in which every message fails, 1,024
/// answers, needs about 1.5 MiB; the buffer is forced to 4 MiB where the agent may
/// (`CAP_NET_ADMIN`), else raised up to `net.core.rmem_max` (208 KiB by default, doubled: a
/// window of 277). 1,024 rather than 256: a quarter of the sends.
pub const DEFAULT_WINDOW: usize = 1024;
/// Upper bound on the bytes of one batch (`sendmsg` payload); a batch closes at `window`
/// messages or at this size, whichever comes first (1,024 route messages of 72 to 100 bytes
/// fit). One netlink `sendmsg` is bounded by `sk_sndbuf` - 32: the send buffer is raised to
/// fit, and where it cannot be the batches shrink to it.
pub const MAX_BATCH_BYTES: usize = 160 * 1024;
/// Room one answer of the batch socket takes in its receive buffer, bytes (an error answer's
/// skb `truesize`: about 1.25 KiB with the extended-ack message, rounded up).
const ANSWER_BYTES: usize = 1536;
/// Socket receive buffer asked for, bytes (forced on the batch socket where the agent may,
/// else `SO_RCVBUF`, capped by `net.core.rmem_max`).
pub(super) const SOCKET_RCVBUF_BYTES: usize = 4 * 1024 * 1024;
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

/// The batch socket's task side: the next sequence number, the batch being serialized, and
/// the batches handed to the socket's thread ([`BatchSender`], which owns the socket: a plain
/// `NETLINK_ROUTE` socket bound to an automatic port and connected to the kernel) whose
/// answers are not taken yet.
pub(super) struct Batcher {
    /// The thread that sends each batch and reads its answers. It owns the socket: a batch
    /// handed over is sent and answered even if the call that handed it over is dropped
    /// meanwhile (a cancelled apply; its answers are landed by the next call); batches still
    /// queued when the batcher is dropped are not sent.
    sender: BatchSender,
    /// What one batch may hold on this socket.
    limits: BatchLimits,
    /// Next sequence number (wrapping). Answers carrying a number outside the batch being
    /// read (left over from a batch that timed out) are skipped.
    seq: u32,
    /// The next batch, serialized while the kernel handles the ones before.
    next_buf: Vec<u8>,
    /// Buffers back from the thread, for the next batches.
    spare: Vec<Vec<u8>>,
    /// The batches handed to the thread and not landed yet, oldest first: at most one in the
    /// kernel and one queued behind it while a call runs; when a call returned before its
    /// last batch was answered (the last of a pipelined chunk), that batch.
    in_flight: VecDeque<InFlight>,
    /// The chunk the batch left in flight by a call belongs to, with its results so far.
    open: Option<Executed>,
}

/// A batch handed to the [`BatchSender`] thread: its buffer and answers come back through
/// `landed`; `pending` says what each of its ops reports.
struct InFlight {
    landed: std::sync::mpsc::Receiver<Landed>,
    pending: Vec<Pending>,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher").field("sender", &self.sender).field("seq", &self.seq).field("in_flight", &self.in_flight.len()).finish_non_exhaustive()
    }
}

/// One serialized op of a batch: what its error reports (formatted only for an error).
pub(super) struct Pending {
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
pub(super) enum Framed {
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
pub(super) trait BatchOp {
    fn request(&self) -> (Framed, Pending);

    /// Append the op's message to `buf` with sequence number `seq`, framed for a batch
    /// ([`Framed::frame`]: no `NLM_F_ACK`, port 0); returns its length (unpadded) and what its
    /// result reports.
    fn emit(&self, buf: &mut Vec<u8>, seq: u32) -> (usize, Pending) {
        emit_built(self, buf, seq)
    }
}

/// [`BatchOp::emit`] of the message `op` builds ([`BatchOp::request`]), framed and serialized.
fn emit_built<T: BatchOp + ?Sized>(op: &T, buf: &mut Vec<u8>, seq: u32) -> (usize, Pending) {
    let (mut req, pending) = op.request();
    let len = req.frame(seq);
    let start = buf.len();
    buf.resize(start + len, 0);
    req.serialize(&mut buf[start..]);
    (len, pending)
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

    /// A write's message straight into the batch ([`emit_write_request`]: the same bytes as
    /// its [`request`](BatchOp::request), a fraction of the CPU); a delete's as built.
    fn emit(&self, buf: &mut Vec<u8>, seq: u32) -> (usize, Pending) {
        match self {
            RouteOp::Write { route, oif, nexthop, exclusive } => {
                let len = emit_write_request(buf, route, *oif, *nexthop, *exclusive, seq);
                (len, Pending { op: NetlinkOp::WriteRoute, target: OpTarget::Route(route.key) })
            }
            RouteOp::Delete { .. } => emit_built(self, buf, seq),
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

impl Batcher {
    /// Messages one batch may hold on this socket (from the buffers the kernel granted).
    pub(super) fn batch_messages(&self) -> usize {
        self.limits.messages
    }

    /// Open, bind and connect the socket (strict checking, extended acks, large receive
    /// buffer) in the calling thread's network namespace, and start its thread.
    ///
    /// # Errors
    /// The socket could not be opened or configured, or its thread not started.
    pub(super) fn open() -> std::io::Result<Self> {
        let mut sock = Socket::new(NETLINK_ROUTE)?;
        sock.bind_auto()?;
        sock.connect(&SocketAddr::new(0, 0))?;
        sock.set_netlink_get_strict_chk(true)?;
        sock.set_ext_ack(true)?;
        // Answers carry no copy of the request (the sequence number and errno are all
        // `take_answers` reads): smaller answers, more of them fit the receive buffer.
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
        Ok(Batcher { sender: BatchSender::start(sock)?, limits, seq: 1, next_buf: Vec::new(), spare: Vec::new(), in_flight: VecDeque::new(), open: None })
    }

    /// Run `ops` in order, in batches of at most `window` messages and [`MAX_BATCH_BYTES`]
    /// bytes (fewer where the socket's buffers are smaller: [`BatchLimits`]); `timeout`
    /// applies per batch. Returns one result per op, in order.
    ///
    /// Every batch goes to the [`BatchSender`] thread, which sends it and reads its answers;
    /// while the kernel handles batch n, this task serializes batch n+1 and queues it behind,
    /// so the thread goes on to it as soon as batch n is answered: building a batch and taking
    /// the answers back overlap the kernel's insert instead of following it. Only
    /// one batch is in the kernel at a time, so the ops still run in order.
    pub(super) async fn execute<T: BatchOp>(&mut self, ops: &[T], window: usize, timeout: Duration) -> Vec<Result<(), NetlinkError>> {
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
    pub(super) async fn execute_chunk(&mut self, ops: Vec<RouteOp>, place: ChunkPlace, window: usize, timeout: Duration) -> Vec<Executed> {
        if place.first {
            // Left by a pass that was dropped before its last chunk: its answers are read
            // (none is taken for a later batch's), its results go nowhere (the ops stayed
            // dirty in the reconciler, which was dropped with the pass).
            self.settle(timeout).await;
            self.open = None;
        }
        let mut results = Vec::with_capacity(ops.len());
        // The chunk before, its last batch in flight (if not answered by a plain `execute`
        // meanwhile): that batch is landed once this chunk's first batch is queued behind it,
        // so the serializing overlaps the kernel's insert and the kernel goes on at once.
        let mut open = self.open.take();
        let earlier = if self.in_flight.is_empty() { None } else { open.as_mut().map(|o| &mut o.results) };
        self.run_ops(&ops, window, timeout, !place.last, earlier, &mut results).await;
        let mut done: Vec<Executed> = open.into_iter().collect();
        if ops.is_empty() {
            return done;
        }
        if self.in_flight.is_empty() {
            done.push(Executed { ops, results });
        } else {
            self.open = Some(Executed { ops, results });
        }
        done
    }

    /// Send `ops` in batches, one in the kernel at a time, each serialized while the one
    /// before is in the kernel and queued behind it; results are appended to `results` as
    /// batches are landed. `earlier`: where the results of the batches in flight on entry go
    /// (a chunk before this one; `None`: they belong to `results`). With `leave_last`, this
    /// call's last batch is left in flight ([`InFlight`]); otherwise every result is in on
    /// return. The batches in flight on entry are landed either way.
    async fn run_ops<T: BatchOp>(
        &mut self,
        ops: &[T],
        window: usize,
        timeout: Duration,
        leave_last: bool,
        mut earlier: Option<&mut Vec<Result<(), NetlinkError>>>,
        results: &mut Vec<Result<(), NetlinkError>>,
    ) {
        let mut earlier_left = self.in_flight.len();
        let mut at = 0;
        loop {
            let next = self.queue_next(&ops[at..], window, timeout);
            // One batch in the kernel and the next queued behind it: the oldest lands (its
            // answers are taken) while the thread sends the next. Past the last batch, what is
            // in flight lands, but for this call's own last batch when it is left there.
            let keep = match next {
                Some(n) => {
                    at += n;
                    1
                }
                None => usize::from(leave_last && earlier_left < self.in_flight.len()),
            };
            while self.in_flight.len() > keep {
                let Some(f) = self.in_flight.pop_front() else { break };
                let into = if earlier_left > 0 {
                    earlier_left -= 1;
                    earlier.as_deref_mut().unwrap_or(&mut *results)
                } else {
                    &mut *results
                };
                Self::land(f, timeout, &mut self.spare, into).await;
            }
            if next.is_none() {
                return;
            }
        }
    }

    /// Serialize the first batch of `ops` (taking its sequence numbers) and hand it to the
    /// thread, queued behind the batches in flight; returns how many ops it holds, none when
    /// `ops` is empty.
    fn queue_next<T: BatchOp>(&mut self, ops: &[T], window: usize, timeout: Duration) -> Option<usize> {
        let limits = BatchLimits { messages: window.min(self.limits.messages), bytes: self.limits.bytes };
        let base = self.seq;
        let pending = serialize(&mut self.next_buf, base, ops, limits);
        if pending.is_empty() {
            return None;
        }
        let count = pending.len();
        self.seq = base.wrapping_add(u32::try_from(count).unwrap_or(u32::MAX));
        let buf = std::mem::replace(&mut self.next_buf, self.spare.pop().unwrap_or_default());
        let landed = self.sender.send(Batch { buf, base, count, timeout });
        self.in_flight.push_back(InFlight { landed, pending });
        Some(count)
    }

    /// Wait for batch `f`'s answers and append one result per op to `results`
    /// ([`results_of`]); its buffer goes to `spare`.
    async fn land(f: InFlight, timeout: Duration, spare: &mut Vec<Vec<u8>>, results: &mut Vec<Result<(), NetlinkError>>) {
        let answers = match landed(f.landed).await {
            Some((buf, answers)) => {
                spare.push(buf);
                answers
            }
            // The thread ended: the buffer is lost with it.
            None => Answers::failed(BatchFailure::Io("send batch: the netlink send thread ended".into())),
        };
        results_of(answers, f.pending, timeout, results);
    }

    /// Land the batches in flight, if any, into the chunk they belong to.
    async fn settle(&mut self, timeout: Duration) {
        if self.in_flight.is_empty() {
            return;
        }
        let mut open = self.open.take().unwrap_or(Executed { ops: Vec::new(), results: Vec::new() });
        while let Some(f) = self.in_flight.pop_front() {
            Self::land(f, timeout, &mut self.spare, &mut open.results).await;
        }
        self.open = Some(open);
    }
}

/// One result per op of a batch (`pending`, in order) from its `answers`, appended to
/// `results`. Per op: a failure answered → [`NetlinkError::Kernel`] with its errno; no answer
/// of its own once the last op's answer is read → `Ok` (the kernel answers every failure, in
/// order); no answer of the last op within `timeout` → [`NetlinkError::Timeout`] for every op
/// without an answer; answers dropped because the receive buffer overflowed → `Kernel` with
/// `ENOBUFS` for every op without an answer of its own (a dropped answer may have been a
/// failure); send or receive failure → [`NetlinkError::Connection`] for every op without an
/// answer.
fn results_of(answers: Answers, pending: Vec<Pending>, timeout: Duration, results: &mut Vec<Result<(), NetlinkError>>) {
    let count = pending.len();
    let mut failures = answers.failures.into_iter().peekable();
    results.extend(pending.into_iter().enumerate().map(|(i, p)| {
        if let Some((_, errno)) = failures.next_if(|&(at, _)| at == i) {
            return Err(NetlinkError::Kernel { op: p.op, target: p.target.to_string(), errno });
        }
        match &answers.end {
            Ok(()) => Ok(()),
            Err(_) if answers.last_answered && i + 1 == count => Ok(()),
            Err(BatchFailure::Overrun) => Err(NetlinkError::Kernel { op: p.op, target: p.target.to_string(), errno: nix::errno::Errno::ENOBUFS }),
            Err(BatchFailure::Timeout) => Err(NetlinkError::Timeout { op: p.op, target: p.target.to_string(), timeout }),
            Err(BatchFailure::Io(reason)) => Err(NetlinkError::Connection { op: p.op, reason: reason.clone() }),
        }
    }));
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
        let start = buf.len();
        let (len, p) = op.emit(buf, seq);
        if !pending.is_empty() && start + align(len) > limits.bytes {
            // Not in this batch: the next one starts with it.
            buf.truncate(start);
            break;
        }
        buf.resize(start + align(len), 0);
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

#[cfg(test)]
mod tests;
