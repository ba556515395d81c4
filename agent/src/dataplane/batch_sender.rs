//! The thread that hands a write pass's batches to the kernel while the reconciler's task
//! builds the next one (issue 18 part 1).
//!
//! The kernel inserts a batch's routes inside `sendmsg`, on the sending thread, so the
//! pipeline needs two threads: the reconciler's task planning, serializing and recording, and
//! this thread in `sendmsg`. Handed each batch through a channel, this thread is woken by the
//! task, and Linux places a woken thread next to its waker when it can (wake-affine): on a
//! small machine the two then take turns on one CPU while the other idles, and the overlap is
//! lost. Timestamps of 21 cold starts of 10,000 routes on two CPUs (`sched_getcpu` at each
//! step) showed both threads on one CPU for stretches of several batches, the kernel idle
//! 1–4 ms per cold start waiting for this thread to be scheduled. So before each batch the
//! thread's affinity is set to the CPUs it started with, less the one the task is on now
//! (only when that changes: one `sched_setaffinity` per move of the task, not per batch).
//! Where fewer than two CPUs are allowed, or the call is refused (a seccomp profile), the
//! thread is left where the scheduler puts it.

use std::os::fd::{AsRawFd, OwnedFd};

use nix::sched::{sched_getaffinity, sched_getcpu, sched_setaffinity, CpuSet};
use nix::unistd::{gettid, Pid};
use tokio::sync::oneshot;

/// A batch's buffer back from the thread with what `sendmsg` returned (bytes sent).
pub(super) type Sent = (Vec<u8>, std::io::Result<usize>);

/// One batch for the thread: the serialized messages, and where its [`Sent`] goes.
type Job = (Vec<u8>, oneshot::Sender<Sent>);

/// What the thread reports once running: its id and the CPUs it may run on.
type Started = (Pid, Option<CpuSet>);

/// The sending thread of one netlink socket: batches go out one at a time, in the order
/// given; the thread ends when this is dropped (after the batch it is in, if any).
pub(super) struct BatchSender {
    jobs: std::sync::mpsc::Sender<Job>,
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
    /// Start the thread (`routewarden-nl-send`), sending on `fd` (a duplicate of the socket's
    /// descriptor, closed when the thread ends). Returns at once: the thread's start is not
    /// waited for.
    ///
    /// # Errors
    /// The thread could not be created.
    pub(super) fn start(fd: OwnedFd) -> std::io::Result<Self> {
        let (jobs, queue) = std::sync::mpsc::channel::<Job>();
        let (started_tx, starting) = std::sync::mpsc::sync_channel(1);
        std::thread::Builder::new().name("routewarden-nl-send".into()).stack_size(64 * 1024).spawn(move || {
            let allowed = sched_getaffinity(Pid::from_raw(0)).ok();
            let _ = started_tx.send((gettid(), allowed));
            while let Ok((buf, done)) = queue.recv() {
                let sent = nix::sys::socket::send(fd.as_raw_fd(), &buf, nix::sys::socket::MsgFlags::empty()).map_err(std::io::Error::from);
                // The batcher may have given up waiting (a cancelled apply): nothing to tell.
                let _ = done.send((buf, sent));
            }
        })?;
        Ok(BatchSender { jobs, starting: Some(starting), thread: None, allowed: None, kept_off: None })
    }

    /// Queue `buf` for `sendmsg`, first moving the thread off the calling thread's CPU if
    /// that changed. The receiver gets the buffer back with the result; it fails if the
    /// thread is gone.
    pub(super) fn send(&mut self, buf: Vec<u8>) -> oneshot::Receiver<Sent> {
        self.steer();
        let (done, answer) = oneshot::channel();
        // A send to a thread that ended drops `done`: the receiver reports it.
        let _ = self.jobs.send((buf, done));
        answer
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

#[cfg(test)]
mod tests {
    use super::*;

    fn set(list: &[usize]) -> CpuSet {
        let mut s = CpuSet::new();
        for &c in list {
            s.set(c).unwrap();
        }
        s
    }

    #[test]
    fn the_thread_may_run_anywhere_it_could_but_the_callers_cpu() {
        let others = |allowed: &[usize], cpu| others_than(&set(allowed), cpu).map(|s| cpus(&s).collect::<Vec<_>>());
        assert_eq!(others(&[0, 1], 0), Some(vec![1]));
        assert_eq!(others(&[0, 1], 1), Some(vec![0]));
        assert_eq!(others(&[2, 5, 7], 5), Some(vec![2, 7]));
        assert_eq!(others(&[3], 3), None, "one CPU: nowhere else to go");
        assert_eq!(others(&[2, 5], 4), None, "the caller runs outside the thread's CPUs");
        assert_eq!(others(&[0, CpuSet::count() - 1], CpuSet::count() - 1), Some(vec![0]));
    }

    /// With two CPUs or more, the thread's affinity after a send is what it started with less
    /// the CPU the caller ran on.
    #[test]
    fn the_thread_is_kept_off_the_callers_cpu() {
        let (ours, _theirs) = std::os::unix::net::UnixDatagram::pair().unwrap();
        let mut sender = BatchSender::start(OwnedFd::from(ours)).unwrap();
        // The first batch is answered after the thread reported its start; the second is
        // steered.
        for _ in 0..2 {
            let (_, sent) = sender.send(vec![1]).blocking_recv().unwrap();
            assert_eq!(sent.unwrap(), 1);
        }
        assert!(sender.starting.is_none(), "the start was read");
        let Some(allowed) = sender.allowed else {
            eprintln!("SKIP: fewer than two CPUs allowed here; nothing to steer");
            return;
        };
        let off = sender.kept_off.expect("the caller's CPU is one the thread may run on");
        let now = sched_getaffinity(sender.thread.unwrap()).unwrap();
        assert_eq!(cpus(&now).collect::<Vec<_>>(), cpus(&allowed).filter(|&c| c != off).collect::<Vec<_>>());
    }

    /// Batches go out in order and come back with their buffers; a socket that refuses them
    /// answers with the error; dropping the sender ends the thread and closes its descriptor.
    #[test]
    fn batches_go_out_in_order_with_their_own_results() {
        let (ours, theirs) = std::os::unix::net::UnixDatagram::pair().unwrap();
        let mut sender = BatchSender::start(OwnedFd::from(ours)).unwrap();
        let batches: Vec<Vec<u8>> = (1..=5u8).map(|i| vec![i; usize::from(i)]).collect();
        let answers: Vec<_> = batches.iter().map(|b| sender.send(b.clone())).collect();
        for (batch, answer) in batches.iter().zip(answers) {
            let (buf, sent) = answer.blocking_recv().unwrap();
            assert_eq!((&buf, sent.unwrap()), (batch, batch.len()), "the buffer comes back");
            let mut got = [0u8; 16];
            let n = theirs.recv(&mut got).unwrap();
            assert_eq!(&got[..n], batch.as_slice(), "in order");
        }
        theirs.shutdown(std::net::Shutdown::Both).unwrap();
        drop(theirs);
        let (_, sent) = sender.send(vec![9]).blocking_recv().unwrap();
        assert!(sent.is_err(), "a send on a closed pair fails: {sent:?}");
        let thread = sender.thread.expect("the thread reported its start before its first answer");
        drop(sender);
        // The thread is gone once its descriptor is: poll /proc for its task entry.
        let task = format!("/proc/self/task/{thread}");
        let gone = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(5));
            !std::path::Path::new(&task).exists()
        });
        assert!(gone, "the send thread ended when its sender was dropped");
    }
}
