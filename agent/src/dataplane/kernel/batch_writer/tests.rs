//! Unit tests of `batch_writer.rs`.

use super::*;
use crate::dataplane::kernel::route::{KernelRoute, RouteKind, RouteTarget};

fn key(dst: &str) -> RouteKey {
    RouteKey::new(254, dst.parse().unwrap(), 0, 1024)
}

fn pending(dsts: &[&str]) -> Vec<Pending> {
    dsts.iter().map(|d| Pending { op: NetlinkOp::WriteRoute, target: OpTarget::Route(key(d)) }).collect()
}

/// Each op's result from its batch's answers: its own failure wherever the batch ended;
/// without one, done when the batch was answered in full (or it is the last op and its
/// ack was read), else the batch's failure.
#[test]
fn each_op_gets_its_own_answer_or_the_batchs_failure() {
    use nix::errno::Errno;
    let dsts = ["10.244.1.0/26", "10.244.2.0/26", "10.244.3.0/26"];
    let timeout = Duration::from_secs(3);
    let kernel = |i: usize, errno| Err(NetlinkError::Kernel { op: NetlinkOp::WriteRoute, target: key(dsts[i]).to_string(), errno });
    let run = |failures: Vec<(usize, Errno)>, last_answered, end| {
        let mut results = vec![Ok(())];
        results_of(Answers { failures, last_answered, end }, pending(&dsts), timeout, &mut results);
        assert_eq!(results.remove(0), Ok(()), "appended after what was there");
        results
    };
    assert_eq!(run(vec![(1, Errno::EEXIST)], true, Ok(())), [Ok(()), kernel(1, Errno::EEXIST), Ok(())]);
    assert_eq!(run(vec![(0, Errno::ENODEV)], true, Err(BatchFailure::Overrun)), [kernel(0, Errno::ENODEV), kernel(1, Errno::ENOBUFS), Ok(())]);
    assert_eq!(run(vec![(2, Errno::ESRCH)], true, Err(BatchFailure::Overrun)), [kernel(0, Errno::ENOBUFS), kernel(1, Errno::ENOBUFS), kernel(2, Errno::ESRCH)]);
    let timed_out = |i: usize| Err(NetlinkError::Timeout { op: NetlinkOp::WriteRoute, target: key(dsts[i]).to_string(), timeout });
    assert_eq!(run(vec![(1, Errno::EEXIST)], false, Err(BatchFailure::Timeout)), [timed_out(0), kernel(1, Errno::EEXIST), timed_out(2)]);
    let gone = Err(NetlinkError::Connection { op: NetlinkOp::WriteRoute, reason: "send batch: gone".into() });
    assert_eq!(run(vec![], false, Err(BatchFailure::Io("send batch: gone".into()))), [gone.clone(), gone.clone(), gone]);
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
    let write =
        |dst: &str, exclusive: bool| RouteOp::Write { route: KernelRoute { key: key(dst), target: target.clone() }, oif: Some(2), nexthop: None, exclusive };
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
    // Bytes for two and a half messages: the third is not left half in the buffer.
    let two = buf.len();
    let p = serialize(&mut buf, 7, &ops, BatchLimits { messages: 256, bytes: two + 8 });
    assert_eq!(p.len(), 2);
    assert_eq!(buf.len(), two);
    assert_eq!(headers(&buf), [(NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL, 7), (NLM_F_REQUEST | NLM_F_ACK, 8)]);
}
