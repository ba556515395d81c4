//! The thread that owns the batch socket: it sends each batch, reads the batch's answers and
//! goes straight on to the next batch queued, while the reconciler's task plans, serializes
//! and records batches.
//!
//! The kernel inserts a batch's routes inside `sendmsg`, on the sending thread, and queues
//! every answer (a failure, or the ack of the batch's last message) before `sendmsg` returns,
//! so the thread reads them at once, without waiting, and the next batch can follow with no
//! hand-over between: the kernel never waits for the task to wake, read the answers and pass
//! the next batch on (~60 µs a batch when the task did this, 1.2–1.4 ms of a 10,000-route
//! cold start, and up to 0.8 ms more whenever the task's CPU was busy). The task keeps one
//! batch queued behind the one in the kernel and takes the answers back through a channel.
//!
//! The task waits for those answers on its own thread ([`landed`]), not by yielding to tokio:
//! a yielding task is woken through the runtime, which may hand it to another worker thread,
//! and Linux placed that worker on the CPU where this thread was inside `sendmsg` as often as
//! not (timestamps of 21 cold starts: 2–4 ms stalls in a third of them, the task waiting for
//! the kernel's insert to end before it could queue the next batch, while the other CPU
//! idled). A thread blocked in a receive is woken where it slept. The wait is bounded
//! ([`WAIT_IN_PLACE`]); past it, it goes on in the runtime's blocking pool.
//!
//! Handed each batch through a channel, this thread is woken by the task when the queue was
//! empty, and Linux places a woken thread next to its waker when it can (wake-affine): on a
//! small machine the two then take turns on one CPU while the other idles, and the overlap is
//! lost. Timestamps of 21 cold starts of 10,000 routes on two CPUs (`sched_getcpu` at each
//! step) showed both threads on one CPU for stretches of several batches, the kernel idle
//! 1–4 ms per cold start waiting for this thread to be scheduled. So before each batch the
//! thread's affinity is set to the CPUs it started with, less the one the task is on now
//! (only when that changes: one `sched_setaffinity` per move of the task, not per batch).
//! Where fewer than two CPUs are allowed, or the call is refused (a seccomp profile), the
//! thread is left where the scheduler puts it.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sched::{sched_getaffinity, sched_getcpu, sched_setaffinity, CpuSet};
use nix::unistd::{gettid, Pid};
use rtnetlink::packet_core::{ErrorBuffer, NetlinkBuffer, NLMSG_ERROR};
use rtnetlink::sys::Socket;

/// Receive buffer for one datagram, bytes: an ack is 36 bytes, a failure with its extended-ack
/// attributes well under 1 KiB (the socket has `NETLINK_CAP_ACK`: no copy of the request).
const RECV_BUF_BYTES: usize = 64 * 1024;

/// One batch for the thread.
pub(super) struct Batch {
    /// The serialized messages, sequence numbers `base..base + count`, only the last asking
    /// for an ack.
    pub buf: Vec<u8>,
    /// Sequence number of the first message.
    pub base: u32,
    /// Messages in `buf` (at least 1).
    pub count: usize,
    /// How long to wait for the last message's answer once `sendmsg` returned.
    pub timeout: Duration,
}

/// A batch back from the thread: its buffer (for the next batch) and what the kernel answered.
pub(super) type Landed = (Vec<u8>, Answers);

/// One batch for the thread and where its [`Landed`] goes.
type Job = (Batch, SyncSender<Landed>);

/// How long [`landed`] blocks the calling thread for a batch's answers before the wait moves
/// to the runtime's blocking pool: longer than a batch of 1,024 route writes takes in the
/// kernel (2–6 ms measured on a two-CPU VM), and of the order of the reconciler's own
/// synchronous steps (`set_desired` takes about 1 ms per 10,000 routes), so a task blocked
/// here holds its worker no longer than its own work does.
pub(super) const WAIT_IN_PLACE: Duration = Duration::from_millis(20);

/// What the thread reports once running: its id and the CPUs it may run on.
type Started = (Pid, Option<CpuSet>);

/// What the kernel answered to one batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Answers {
    /// The messages the kernel refused: index in the batch and errno, ascending.
    pub failures: Vec<(usize, Errno)>,
    /// Whether the last message's answer was read (its success, or a failure in `failures`).
    pub last_answered: bool,
    /// `Ok`: every answer was read (the messages without a failure succeeded); else why not
    /// (the messages without an answer of their own may have failed).
    pub end: Result<(), BatchFailure>,
}

impl Answers {
    /// No answer read, for `failure`.
    pub fn failed(failure: BatchFailure) -> Self {
        Answers { failures: Vec::new(), last_answered: false, end: Err(failure) }
    }
}

/// Why a batch ended with messages still unanswered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum BatchFailure {
    /// The receive buffer overflowed: answers were dropped (`recv` failed with `ENOBUFS`).
    Overrun,
    /// No answer of the last message within the batch's timeout.
    Timeout,
    /// Sending or receiving failed (the reason).
    Io(String),
}

/// The thread of one batch socket: batches are sent one at a time, in the order given, each
/// answered in full before the next is sent; the thread ends (closing the socket) when this
/// is dropped, after the batch it is in, if any (the batches still queued are not sent).
pub(super) struct BatchSender {
    jobs: std::sync::mpsc::Sender<Job>,
    /// Cleared when this is dropped: the batches still queued are not sent.
    alive: Arc<AtomicBool>,
    /// Where the thread reports [`Started`], until it has (read without waiting: a batch
    /// sent before then goes unsteered).
    starting: Option<std::sync::mpsc::Receiver<Started>>,
    /// The thread's id, for `sched_setaffinity`.
    thread: Option<Pid>,
    /// The CPUs the thread may run on (its affinity when it started); `None`: not steered
    /// (not reported yet, fewer than two, or a refused call).
    allowed: Option<CpuSet>,
    /// The CPU the thread is kept off now (the task's when it last moved).
    kept_off: Option<usize>,
}

impl std::fmt::Debug for BatchSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchSender")
            .field("thread", &self.thread)
            .field("steered", &self.allowed.is_some())
            .field("kept_off", &self.kept_off)
            .finish_non_exhaustive()
    }
}

impl BatchSender {
    /// Start the thread (`routewarden-nl-send`) with `socket` (a netlink socket connected to
    /// the kernel, in blocking mode; closed when the thread ends). Returns at once: the
    /// thread's start is not waited for.
    ///
    /// # Errors
    /// The thread could not be created.
    pub(super) fn start(socket: Socket) -> std::io::Result<Self> {
        let (jobs, queue) = std::sync::mpsc::channel::<Job>();
        let (started_tx, starting) = std::sync::mpsc::sync_channel(1);
        let alive = Arc::new(AtomicBool::new(true));
        let running = Arc::clone(&alive);
        std::thread::Builder::new().name("routewarden-nl-send".into()).stack_size(64 * 1024).spawn(move || {
            let allowed = sched_getaffinity(Pid::from_raw(0)).ok();
            let _ = started_tx.send((gettid(), allowed));
            let mut recv_buf = Vec::with_capacity(RECV_BUF_BYTES);
            while let Ok((batch, done)) = queue.recv() {
                // The batcher was dropped: nobody takes the answers.
                if !running.load(Ordering::Acquire) {
                    continue;
                }
                let answers = send_and_read(&socket, &batch, &mut recv_buf);
                let _ = done.send((batch.buf, answers));
            }
        })?;
        Ok(BatchSender { jobs, alive, starting: Some(starting), thread: None, allowed: None, kept_off: None })
    }

    /// Queue `batch`, first moving the thread off the calling thread's CPU if that changed.
    /// The receiver gets the buffer back with the answers ([`landed`]); it fails if the
    /// thread is gone.
    pub(super) fn send(&mut self, batch: Batch) -> Receiver<Landed> {
        self.steer();
        let (done, landed) = std::sync::mpsc::sync_channel(1);
        // A send to a thread that ended drops `done`: the receiver reports it.
        let _ = self.jobs.send((batch, done));
        landed
    }

    /// Keep the thread off the CPU the caller runs on.
    fn steer(&mut self) {
        if let Some(starting) = &self.starting {
            match starting.try_recv() {
                Ok((thread, allowed)) => {
                    self.thread = Some(thread);
                    self.allowed = allowed.filter(|set| cpus(set).nth(1).is_some());
                }
                Err(std::sync::mpsc::TryRecvError::Empty) => return,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {}
            }
            self.starting = None;
        }
        let (Some(thread), Some(allowed)) = (self.thread, &self.allowed) else { return };
        let Ok(cpu) = sched_getcpu() else { return };
        if self.kept_off == Some(cpu) {
            return;
        }
        let Some(others) = others_than(allowed, cpu) else { return };
        if sched_setaffinity(thread, &others).is_ok() {
            self.kept_off = Some(cpu);
        } else {
            tracing::debug!(cpu, "netlink send thread: affinity refused, left to the scheduler");
            self.allowed = None;
        }
    }
}

impl Drop for BatchSender {
    fn drop(&mut self) {
        self.alive.store(false, Ordering::Release);
    }
}

/// Wait for a batch handed to the thread ([`BatchSender::send`]) to come back: blocking the
/// calling thread for up to [`WAIT_IN_PLACE`], then in the runtime's blocking pool (so it
/// must run inside a tokio runtime). `None`: the thread ended without answering it.
pub(super) async fn landed(batch: Receiver<Landed>) -> Option<Landed> {
    match batch.recv_timeout(WAIT_IN_PLACE) {
        Ok(landed) => Some(landed),
        Err(RecvTimeoutError::Disconnected) => None,
        Err(RecvTimeoutError::Timeout) => tokio::task::spawn_blocking(move || batch.recv().ok()).await.ok().flatten(),
    }
}

/// Send `batch` in one `sendmsg` and read its answers ([`read_answers`]).
fn send_and_read(socket: &Socket, batch: &Batch, recv_buf: &mut Vec<u8>) -> Answers {
    match socket.send(&batch.buf, 0) {
        Ok(sent) if sent == batch.buf.len() => read_answers(socket, batch.base, batch.count, batch.timeout, recv_buf),
        Ok(sent) => Answers::failed(BatchFailure::Io(format!("send batch: short send: {sent} of {} bytes", batch.buf.len()))),
        Err(e) => Answers::failed(BatchFailure::Io(format!("send batch: {e}"))),
    }
}

/// Read the answers of a sent batch (`count` messages, sequence numbers from `base`) up to
/// the last message's. The kernel has queued them all by the time `sendmsg` returns, so they
/// are read without waiting; only an answer that is not there yet is waited for, up to
/// `timeout` ([`BatchFailure::Timeout`]). When the kernel dropped answers (`recv` fails with
/// `ENOBUFS`), the queue is read on up to the last answer or until it is empty, and the
/// batch ends in [`BatchFailure::Overrun`]: a dropped answer may have been any message's
/// failure. Answers of other sequence numbers (a batch given up on before) are skipped.
fn read_answers(socket: &Socket, base: u32, count: usize, timeout: Duration, recv_buf: &mut Vec<u8>) -> Answers {
    let deadline = Instant::now().checked_add(timeout);
    let mut answers = Answers { failures: Vec::new(), last_answered: false, end: Ok(()) };
    let mut overrun = false;
    let end = loop {
        recv_buf.clear();
        match socket.recv(recv_buf, nix::libc::MSG_DONTWAIT) {
            Ok(_) => {
                if take_answers(recv_buf, base, count, &mut answers) {
                    break if overrun { Err(BatchFailure::Overrun) } else { Ok(()) };
                }
            }
            Err(e) => match Errno::from_raw(e.raw_os_error().unwrap_or(0)) {
                Errno::ENOBUFS => overrun = true,
                Errno::EINTR => {}
                Errno::EAGAIN if overrun => break Err(BatchFailure::Overrun),
                Errno::EAGAIN => {
                    let left = deadline.map_or(Duration::MAX, |d| d.saturating_duration_since(Instant::now()));
                    // Rounded up: a wait of under a millisecond is not a busy loop.
                    let wait = PollTimeout::try_from(left.as_millis().saturating_add(1)).unwrap_or(PollTimeout::MAX);
                    match nix::poll::poll(&mut [PollFd::new(socket.as_fd(), PollFlags::POLLIN)], wait) {
                        Ok(0) => break Err(BatchFailure::Timeout),
                        Ok(_) | Err(Errno::EINTR) => {}
                        Err(e) => break Err(BatchFailure::Io(format!("receive acks: {e}"))),
                    }
                }
                _ => break Err(BatchFailure::Io(format!("receive acks: {e}"))),
            },
        }
    };
    answers.end = end;
    answers
}

/// Take the answers in one received datagram `buf` to a batch of `count` messages, sequence
/// numbers from `base`: every `NLMSG_ERROR` of a sequence number in the batch, past the last
/// one taken (the kernel answers in order; anything else is skipped), adds a failure (a
/// negative errno) to `answers`; a malformed message ends the walk (nothing after it can be
/// framed). Returns whether the last message's answer was taken (the answer that closes the
/// batch).
fn take_answers(buf: &[u8], base: u32, count: usize, answers: &mut Answers) -> bool {
    let mut off = 0;
    while let Some(rest) = buf.get(off..) {
        let Ok(nl) = NetlinkBuffer::new_checked(rest) else { break };
        let idx = nl.sequence_number().wrapping_sub(base) as usize;
        let past_taken = answers.failures.last().is_none_or(|&(at, _)| idx > at) && !answers.last_answered;
        if nl.message_type() == NLMSG_ERROR && idx < count && past_taken {
            if let Ok(e) = ErrorBuffer::new_checked(nl.payload()) {
                if let Some(code) = e.code() {
                    answers.failures.push((idx, errno_of(code.get())));
                }
                answers.last_answered |= idx + 1 == count;
            }
        }
        off += align(nl.length() as usize);
    }
    answers.last_answered
}

/// The CPUs in `set`, ascending.
fn cpus(set: &CpuSet) -> impl Iterator<Item = usize> + '_ {
    (0..CpuSet::count()).filter(|&c| set.is_set(c).unwrap_or(false))
}

/// `allowed` without `cpu`: `None` when `cpu` is not in it (the caller runs elsewhere than
/// the thread may: nothing to keep apart) or nothing would be left.
fn others_than(allowed: &CpuSet, cpu: usize) -> Option<CpuSet> {
    if !allowed.is_set(cpu).ok()? {
        return None;
    }
    let mut others = *allowed;
    others.unset(cpu).ok()?;
    let any = cpus(&others).next().is_some();
    any.then_some(others)
}

/// `len` bytes rounded up to the netlink message alignment (`NLMSG_ALIGN`, 4 bytes).
pub(super) fn align(len: usize) -> usize {
    len.next_multiple_of(usize::from(rtnetlink::packet_core::NLMSG_ALIGNTO))
}

/// The errno of a netlink error answer's `code` (a negative errno).
pub(super) fn errno_of(code: i32) -> nix::errno::Errno {
    nix::errno::Errno::from_raw(code.saturating_neg())
}

#[cfg(test)]
mod tests;
