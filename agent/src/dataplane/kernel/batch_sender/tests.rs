//! Unit tests of `batch_sender.rs`.

use std::os::fd::{FromRawFd, IntoRawFd};
use std::os::unix::net::UnixDatagram;

use rtnetlink::packet_core::{ErrorMessage, NetlinkHeader, NetlinkMessage, NetlinkPayload};
use rtnetlink::packet_route::RouteNetlinkMessage;

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

/// A socket for the thread whose other end plays the kernel (a Unix datagram pair: one
/// `send`/`recv` is one datagram, as on netlink).
fn fake_kernel() -> (Socket, UnixDatagram) {
    let (ours, kernel) = UnixDatagram::pair().unwrap();
    // SAFETY: `into_raw_fd` gives up ownership of an open descriptor; `Socket` takes it
    // over and closes it on drop.
    (unsafe { Socket::from_raw_fd(ours.into_raw_fd()) }, kernel)
}

/// An `NLMSG_ERROR` answer to sequence number `seq`: an ack (`code` 0) or a failure
/// (a negative errno).
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

fn batch(buf: Vec<u8>, base: u32, count: usize) -> Batch {
    Batch { buf, base, count, timeout: Duration::from_secs(5) }
}

fn taken(datagrams: &[Vec<u8>], base: u32, count: usize) -> (Answers, Vec<bool>) {
    let mut answers = Answers { failures: Vec::new(), last_answered: false, end: Ok(()) };
    let closed = datagrams.iter().map(|d| take_answers(d, base, count, &mut answers)).collect();
    (answers, closed)
}

#[test]
fn failures_are_taken_in_order_and_the_last_answer_closes_the_batch() {
    let eexist = Errno::EEXIST as i32;
    // Another batch's answer (99), a failure of op 1, then the ack of the last op (2).
    let (answers, closed) = taken(&[[answer(99, -1), answer(101, -eexist)].concat(), answer(102, 0)], 100, 3);
    assert_eq!(closed, [false, true]);
    assert_eq!(answers, Answers { failures: vec![(1, Errno::EEXIST)], last_answered: true, end: Ok(()) });
    // A failure of the last op closes the batch too, across the wrap of sequence numbers.
    let (answers, closed) = taken(&[answer(u32::MAX, -(Errno::ENODEV as i32))], u32::MAX - 1, 2);
    assert_eq!(closed, [true]);
    assert_eq!(answers.failures, [(1, Errno::ENODEV)]);
    // An answer again for an op already answered, or one before it, is not taken twice;
    // an answer past the batch is not taken; a malformed tail ends the walk.
    let again = [answer(101, -eexist), answer(101, -(Errno::ENOENT as i32)), answer(100, -1), answer(103, -1), vec![0xff; 7]].concat();
    let (answers, closed) = taken(&[again], 100, 3);
    assert_eq!(closed, [false]);
    assert_eq!(answers.failures, [(1, Errno::EEXIST)]);
    // After the last op's ack nothing more is taken.
    let (answers, _) = taken(&[answer(102, 0), answer(102, -1)], 100, 3);
    assert_eq!((answers.failures, answers.last_answered), (vec![], true));
}

/// With two CPUs or more, the thread's affinity after a send is what it started with less
/// the CPU the caller ran on.
#[test]
fn the_thread_is_kept_off_the_callers_cpu() {
    let (ours, kernel) = fake_kernel();
    let mut sender = BatchSender::start(ours).unwrap();
    // The first batch is answered after the thread reported its start; the second is
    // steered.
    for seq in [1, 2] {
        kernel.send(&answer(seq, 0)).unwrap();
        let (_, answers) = sender.send(batch(vec![1], seq, 1)).recv().unwrap();
        assert_eq!(answers, Answers { failures: vec![], last_answered: true, end: Ok(()) });
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

/// Batches queued together go out in order, each read up to its own last answer before
/// the next is sent, and come back with their buffers and their own answers; an answer
/// that is not there is waited for up to the batch's timeout; a socket that refuses the
/// batch answers with the error; dropping the sender ends the thread and closes its socket.
#[test]
fn batches_go_out_in_order_each_with_its_own_answers() {
    let (ours, kernel) = fake_kernel();
    let mut sender = BatchSender::start(ours).unwrap();
    // Queued before any batch is sent: a stale answer, then batch 1 (seq 10–12: op 0
    // fails, then the ack of op 2) and batch 2 (seq 13: its only op fails).
    let eexist = -(Errno::EEXIST as i32);
    for a in [answer(7, 0), answer(10, eexist), answer(12, 0), answer(13, -(Errno::ENODEV as i32))] {
        kernel.send(&a).unwrap();
    }
    let first = sender.send(batch(vec![1; 3], 10, 3));
    let second = sender.send(batch(vec![2; 5], 13, 1));
    // Batch 3 (seq 14–15) is answered only after a while.
    let late = sender.send(batch(vec![3; 2], 14, 2));
    let (buf, answers) = first.recv().unwrap();
    assert_eq!((buf, answers), (vec![1; 3], Answers { failures: vec![(0, Errno::EEXIST)], last_answered: true, end: Ok(()) }));
    let (buf, answers) = second.recv().unwrap();
    assert_eq!((buf, answers), (vec![2; 5], Answers { failures: vec![(0, Errno::ENODEV)], last_answered: true, end: Ok(()) }));
    std::thread::sleep(Duration::from_millis(50));
    kernel.send(&answer(15, 0)).unwrap();
    let (_, answers) = late.recv().unwrap();
    assert_eq!(answers, Answers { failures: vec![], last_answered: true, end: Ok(()) });
    // Each batch reached the kernel once, in order.
    let mut got = [0u8; 16];
    let sent: Vec<Vec<u8>> = (0..3)
        .map(|_| {
            let n = kernel.recv(&mut got).unwrap();
            got[..n].to_vec()
        })
        .collect();
    assert_eq!(sent, [vec![1; 3], vec![2; 5], vec![3; 2]]);
    // No answer of the last op: the batch times out, with the failure it did get.
    kernel.send(&answer(16, eexist)).unwrap();
    let started = Instant::now();
    let (_, answers) = sender.send(Batch { buf: vec![4], base: 16, count: 2, timeout: Duration::from_millis(100) }).recv().unwrap();
    assert_eq!(answers, Answers { failures: vec![(0, Errno::EEXIST)], last_answered: false, end: Err(BatchFailure::Timeout) });
    assert!(started.elapsed() >= Duration::from_millis(100), "waited the timeout: {:?}", started.elapsed());
    // The kernel's end closed: the send fails.
    kernel.shutdown(std::net::Shutdown::Both).unwrap();
    drop(kernel);
    let (_, answers) = sender.send(batch(vec![9], 18, 1)).recv().unwrap();
    assert!(matches!(&answers.end, Err(BatchFailure::Io(e)) if e.starts_with("send batch: ")), "{answers:?}");
    let thread = sender.thread.expect("the thread reported its start before its first answer");
    drop(sender);
    // The thread is gone once its socket is: poll /proc for its task entry.
    let task = format!("/proc/self/task/{thread}");
    let gone = (0..200).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(5));
        !std::path::Path::new(&task).exists()
    });
    assert!(gone, "the send thread ended when its sender was dropped");
}

/// An answered batch with no failure.
fn all_done() -> Answers {
    Answers { failures: vec![], last_answered: true, end: Ok(()) }
}

/// A batch answered at once lands on the waiting thread; one answered only after
/// [`WAIT_IN_PLACE`] still lands (the wait goes on in the runtime's blocking pool); a
/// batch whose thread ended lands as `None`.
#[test]
fn a_batch_answered_late_still_lands() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (ours, kernel) = fake_kernel();
    let mut sender = BatchSender::start(ours).unwrap();
    kernel.send(&answer(1, 0)).unwrap();
    let quick = sender.send(batch(vec![1], 1, 1));
    assert_eq!(rt.block_on(landed(quick)), Some((vec![1], all_done())));
    let late = sender.send(batch(vec![2], 2, 1));
    let answering = std::thread::spawn(move || {
        std::thread::sleep(WAIT_IN_PLACE * 3);
        kernel.send(&answer(2, 0)).unwrap();
        kernel
    });
    let started = Instant::now();
    assert_eq!(rt.block_on(landed(late)), Some((vec![2], all_done())));
    assert!(started.elapsed() >= WAIT_IN_PLACE * 3, "landed after its answer: {:?}", started.elapsed());
    drop(answering.join().unwrap());
    // The kernel's end is gone: the send fails, and the batch still lands with that.
    let (_, answers) = rt.block_on(landed(sender.send(batch(vec![3], 3, 1)))).unwrap();
    assert!(matches!(answers.end, Err(BatchFailure::Io(_))), "{answers:?}");
    let (done, never) = std::sync::mpsc::sync_channel::<Landed>(1);
    drop(done);
    assert_eq!(rt.block_on(landed(never)), None);
}

/// Batches still queued when the sender is dropped are not sent: the one in the kernel
/// ends as it would, the next never reaches the kernel.
#[test]
fn batches_queued_when_the_sender_is_dropped_are_not_sent() {
    let (ours, kernel) = fake_kernel();
    let mut sender = BatchSender::start(ours).unwrap();
    // Batch 1 gets no answer (it times out); batch 2 is queued behind it.
    let first = sender.send(Batch { buf: vec![1], base: 1, count: 1, timeout: Duration::from_millis(200) });
    let second = sender.send(batch(vec![2], 2, 1));
    let mut got = [0u8; 16];
    let n = kernel.recv(&mut got).unwrap();
    assert_eq!(&got[..n], [1], "batch 1 is in the kernel");
    drop(sender);
    assert_eq!(first.recv().unwrap().1.end, Err(BatchFailure::Timeout));
    assert!(second.recv().is_err(), "batch 2 was dropped unsent");
    kernel.set_nonblocking(true).unwrap();
    assert!(!matches!(kernel.recv(&mut got), Ok(n) if n > 0), "nothing more reached the kernel");
}
