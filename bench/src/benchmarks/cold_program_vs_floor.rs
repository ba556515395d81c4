//! `cold-program-vs-floor`: routewarden's cold programming of 10,000 cluster
//! routes (benchmark 1's routewarden side) against the cheapest writer of the same routes this
//! harness can build, the *floor*. Target: at most 1.15, for the median over [`ROUNDS`]
//! alternating rounds of each round's ratio of medians ([`run`]).
//!
//! The floor writes exactly routewarden's `RTM_NEWROUTE` messages (routewarden's own
//! [`to_kernel_route`] and [`write_request`]: create-exclusive, protocol 80, metric 1024,
//! onlink, ifindexes resolved) with nothing else around them: the messages are built before the
//! clock starts, all of them go to the kernel in as few `sendmsg` calls as the send buffer
//! allows (one, with `SO_SNDBUFFORCE`), and only the last asks for an ack (`NLM_F_ACK`); the
//! kernel still answers every failed message with its errno (`netlink_rcv_skb` acks errors
//! whatever the flags) and handles the whole buffer inside `sendmsg`, so reading up to the last
//! ack sees every error. Timed: opening the socket, the sends, reading the answers. No dump,
//! no link query, no read-back. Both sides are then checked, untimed, to have left exactly the
//! 10,000 routes ([`check_exact_routes`]).
//!
//! Two more writers of the same pre-built messages split the gap: `rw_shape_ms`, routewarden's
//! batch shape (1,024 messages or 160 KiB a send, one ack a send, all from one thread: its use
//! of netlink without its own work), and `every_ack_ms`, every message acked in sends of 256
//! (as routewarden once wrote).

use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use rtnetlink::packet_core::{NetlinkBuffer, NetlinkMessage, NetlinkPayload, NLMSG_ALIGNTO, NLMSG_ERROR, NLM_F_ACK};
use rtnetlink::packet_route::RouteNetlinkMessage;
use rtnetlink::sys::protocols::NETLINK_ROUTE;
use rtnetlink::sys::{Socket, SocketAddr};
use routewarden::dataplane::kernel::route::to_kernel_route;
use routewarden::dataplane::kernel::route_wire::write_request;
use routewarden::dataplane::kernel::{DEFAULT_WINDOW, MAX_BATCH_BYTES};
use routewarden::dataplane::DataplaneConfig;
use routewarden::routes::ClusterRoute;

use crate::fixtures::cluster_routes;
use crate::netns::{check_exact_routes, in_node_netns};
use crate::report::{kv, ms};
use crate::procfs::process_cpu;
use crate::runs::rw_program_once_exact;
use crate::{median, median_f64, Benchmark, Options, Outcome, Shared, Target};

/// This benchmark's registry entry: its name and [`run`].
pub const BENCHMARK: Benchmark = Benchmark { name: "cold-program-vs-floor", run };

/// Which messages ask for an ack (`NLM_F_ACK`); failures are answered whatever the flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acks {
    /// Every message, each send's acks read before the next send (as routewarden once wrote).
    EveryMessage,
    /// The last message of each send, its answers read before the next send (routewarden's
    /// batch socket).
    EverySend,
    /// Only the last message of all, answers read after the last send.
    Last,
}

/// How a writer packs its messages into `sendmsg` calls and which it asks acks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Most messages in one send.
    pub max_messages: usize,
    /// Most bytes in one send (a single larger message still goes alone).
    pub max_bytes: usize,
    /// Which messages ask for an ack.
    pub acks: Acks,
}

/// The floor: one send of every message (the send buffer forced to fit them), one ack.
pub const FLOOR: Shape = Shape { max_messages: usize::MAX, max_bytes: 4 * 1024 * 1024, acks: Acks::Last };

/// routewarden's batch shape ([`DEFAULT_WINDOW`] messages, at most [`MAX_BATCH_BYTES`] a
/// send, one ack a send) with the messages pre-built: what routewarden's use of netlink
/// costs without any of its own work.
pub const RW_SHAPE: Shape = Shape { max_messages: DEFAULT_WINDOW, max_bytes: MAX_BATCH_BYTES, acks: Acks::EverySend };

/// Every message acked, 256 messages or 64 KiB a send: routewarden's writes before batching.
pub const EVERY_ACK: Shape = Shape { max_messages: 256, max_bytes: 64 * 1024, acks: Acks::EveryMessage };

/// The messages for `routes`, in one buffer, sequence numbers 1..=n in order, with `NLM_F_ACK`
/// on every message for [`Acks::EveryMessage`] and on none otherwise ([`write_messages`] sets
/// it on the last of each send or of all); built in the calling thread's namespace (device names resolved to its
/// ifindexes) with the default route settings, exactly as routewarden writes them into an
/// empty table (create-exclusive). Returns the buffer and the offset each message starts at.
///
/// # Errors
/// When a route cannot become a kernel route or its device does not exist.
pub fn build_messages(routes: &[ClusterRoute], shape: Shape) -> Result<(Vec<u8>, Vec<usize>)> {
    let settings = DataplaneConfig::default().route_settings();
    let mut buf = Vec::with_capacity(routes.len() * 72);
    let mut starts = Vec::with_capacity(routes.len());
    for (i, r) in routes.iter().enumerate() {
        let d = to_kernel_route(r, &settings).with_context(|| format!("route {}", r.dst))?;
        let oif = match &d.route.target.device {
            Some(dev) => Some(nix::net::if_::if_nametoindex(&**dev).with_context(|| format!("device {dev}"))?),
            None => None,
        };
        let mut req = write_request(&d.route, oif, None, true);
        if shape.acks != Acks::EveryMessage {
            req.header.flags &= !NLM_F_ACK;
        }
        req.header.sequence_number = u32::try_from(i + 1).context("more than 2^32 routes")?;
        req.header.port_number = 0;
        req.finalize();
        let start = buf.len();
        let len = req.buffer_len();
        buf.resize(start + len.next_multiple_of(usize::from(NLMSG_ALIGNTO)), 0);
        req.serialize(&mut buf[start..start + len]);
        starts.push(start);
    }
    Ok((buf, starts))
}

/// Write the pre-built `buf` (messages starting at `starts`, sequence numbers 1..=n, from
/// [`build_messages`] with the same `shape`) on a new `NETLINK_ROUTE` socket in the calling
/// thread's namespace, in sends of whole messages as `shape` allows, reading answers up to the
/// ack of each send's last message or, for [`Acks::Last`], of message n. Returns the number
/// of sends.
///
/// # Errors
/// When the socket cannot be opened or a send or receive fails, or the kernel refused any
/// message (the first refusal is named by its sequence number and errno).
pub fn write_messages(buf: &mut [u8], starts: &[usize], shape: Shape) -> Result<usize> {
    let mut sock = Socket::new(NETLINK_ROUTE).context("netlink socket")?;
    sock.bind_auto().context("bind")?;
    sock.connect(&SocketAddr::new(0, 0)).context("connect")?;
    sock.set_cap_ack(true).context("NETLINK_CAP_ACK")?;
    // One netlink sendmsg must fit the send buffer less 32 bytes (`netlink_sendmsg`).
    nix::sys::socket::setsockopt(&sock.as_fd(), nix::sys::socket::sockopt::SndBufForce, &(shape.max_bytes + 32)).context("SO_SNDBUFFORCE")?;
    // Room for every answer of a send whose messages all ask for one ([`EVERY_ACK`]).
    nix::sys::socket::setsockopt(&sock.as_fd(), nix::sys::socket::sockopt::RcvBufForce, &(4 * 1024 * 1024)).context("SO_RCVBUFFORCE")?;
    let mut rx: Vec<u8> = Vec::with_capacity(64 * 1024);
    let (mut sends, mut first, mut acked) = (0, 0, 0);
    while first < starts.len() {
        // The longest run of whole messages from `first` that fits one send (at least one).
        let from = starts[first];
        let mut next = first + 1;
        while next < starts.len() && next - first < shape.max_messages && starts.get(next + 1).copied().unwrap_or(buf.len()) - from <= shape.max_bytes {
            next += 1;
        }
        let to = starts.get(next).copied().unwrap_or(buf.len());
        if shape.acks == Acks::EverySend || next == starts.len() {
            let mut last = NetlinkBuffer::new(&mut buf[starts[next - 1]..to]);
            let flags = last.flags();
            last.set_flags(flags | NLM_F_ACK);
        }
        let part = &buf[from..to];
        let sent = sock.send(part, 0).context("send")?;
        ensure!(sent == part.len(), "short send: {sent} of {} bytes", part.len());
        sends += 1;
        first = next;
        if shape.acks != Acks::Last || first == starts.len() {
            acked = read_answers(&sock, &mut rx, u32::try_from(first).context("more than 2^32 routes")?, acked)?;
        }
    }
    Ok(sends)
}

/// Read answers on `sock` until the ack of message `until`; `acked` is the highest sequence
/// number acknowledged so far. Returns `until`.
///
/// # Errors
/// A receive failure, an answer that does not parse, or a refusal (with its sequence number
/// and errno).
fn read_answers(sock: &Socket, rx: &mut Vec<u8>, until: u32, mut acked: u32) -> Result<u32> {
    while acked < until {
        rx.clear();
        sock.recv(rx, 0).context("receive acks")?;
        let mut off = 0;
        while let Some(rest) = rx.get(off..) {
            let Ok(nl) = NetlinkBuffer::new_checked(rest) else { break };
            let len = nl.length() as usize;
            if nl.message_type() == NLMSG_ERROR {
                let seq = nl.sequence_number();
                match NetlinkMessage::<RouteNetlinkMessage>::deserialize(&rest[..len]) {
                    Ok(NetlinkMessage { payload: NetlinkPayload::Error(e), .. }) => {
                        if let Some(code) = e.code {
                            bail!("the kernel refused route message {seq}: {}", nix::errno::Errno::from_raw(-code.get()));
                        }
                        acked = acked.max(seq);
                    }
                    other => return Err(anyhow!("unparsable answer to message {seq}: {other:?}")),
                }
            }
            off += len.next_multiple_of(usize::from(NLMSG_ALIGNTO)).max(1);
        }
    }
    Ok(acked)
}

/// A writer of `shape` writes `routes` into the empty main table of a fresh namespace, the
/// messages built first. Returns the time of [`write_messages`] (socket to last ack), the
/// process CPU time it took, and its number of sends.
pub(crate) fn floor_once(routes: Arc<Vec<ClusterRoute>>, shape: Shape) -> Result<(Duration, Duration, usize)> {
    in_node_netns(move |_| {
        let (mut buf, starts) = build_messages(&routes, shape)?;
        let (t, cpu) = (Instant::now(), process_cpu()?);
        let sends = write_messages(&mut buf, &starts, shape)?;
        let took = (t.elapsed(), process_cpu()?.saturating_sub(cpu));
        check_exact_routes(&routes)?;
        Ok((took.0, took.1, sends))
    })
}

/// Rounds of the statistic: the ratio is the median of this many rounds' ratios.
pub const ROUNDS: usize = 7;

/// routewarden's cold programming of the routes / the floor's: [`ROUNDS`] rounds of
/// `opts.runs` alternating runs of each side; each round's ratio is the ratio of its two
/// medians, and the benchmark's ratio is the median of the rounds' ratios (robust to a slow
/// phase of a noisy machine hitting one round, where a single ratio of medians is not). The
/// floor's messages in routewarden's batch shape ([`RW_SHAPE`], and [`EVERY_ACK`]) as well,
/// which splits the gap into what routewarden's use of netlink costs and what its own work
/// costs. The ratio is of wall times (the target); the process CPU time of both (medians) is
/// reported next to it, since routewarden builds the next batch on one core while the kernel
/// inserts the last on another (`rw_cpu_ms` against `floor_cpu_ms`: what it costs in all).
pub fn run(opts: &Options, _shared: &mut Shared) -> Result<Outcome> {
    let routes = Arc::new(cluster_routes(opts.routes));
    let shapes = [FLOOR, RW_SHAPE, EVERY_ACK];
    let (mut rw, mut rw_cpu) = (Vec::new(), Vec::new());
    let mut times: [Vec<Duration>; 3] = Default::default();
    let mut floor_cpu = Vec::new();
    let mut sends = [0; 3];
    let mut round_ratios = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let (mut rw_round, mut floor_round) = (Vec::new(), Vec::new());
        // Alternate, so slow phases of a noisy machine hit every side.
        for _ in 0..opts.runs {
            let (wall, cpu) = rw_program_once_exact(Arc::clone(&routes))?;
            rw.push(wall);
            rw_round.push(wall);
            rw_cpu.push(cpu);
            for (i, shape) in shapes.into_iter().enumerate() {
                let (d, cpu, s) = floor_once(Arc::clone(&routes), shape)?;
                times[i].push(d);
                if i == 0 {
                    floor_cpu.push(cpu);
                    floor_round.push(d);
                }
                sends[i] = s;
            }
        }
        round_ratios.push(median(rw_round).as_secs_f64() / median(floor_round).as_secs_f64());
    }
    let ratio = median_f64(&round_ratios);
    let rw_min = rw.iter().min().copied().unwrap_or_default();
    let floor_min = times[0].iter().min().copied().unwrap_or_default();
    let rw = median(rw);
    let [floor, rw_shape, every_ack] = times.map(median);
    let rounds: Vec<String> = round_ratios.iter().map(|r| format!("{r:.2}")).collect();
    Ok(Outcome::Measured {
        name: BENCHMARK.name.into(),
        ratio,
        target: Target::AtMost(1.15),
        ok: true,
        details: vec![
            kv("routes", routes.len()),
            kv("round_ratios", rounds.join("/")),
            kv("rw_ms", ms(rw)),
            kv("floor_ms", ms(floor)),
            kv("rw_cpu_ms", ms(median(rw_cpu))),
            kv("floor_cpu_ms", ms(median(floor_cpu))),
            kv("rw_shape_ms", ms(rw_shape)),
            kv("every_ack_ms", ms(every_ack)),
            kv("rw_min_ms", ms(rw_min)),
            kv("floor_min_ms", ms(floor_min)),
            kv("floor_sends", sends[0]),
            kv("rw_shape_sends", sends[1]),
            kv("rounds", ROUNDS),
            kv("runs_per_round", opts.runs),
        ],
    })
}
