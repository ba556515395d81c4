//! Writer attribution: netlink port id -> process (pid, command name), best effort, cached,
//! batched and rate-limited, off the async workers (a `/proc` walk blocks, and a storm of
//! writers must not stall the runtime).
//!
//! The socket-filter backend only knows the sending socket's netlink port id
//! (`nlmsg_pid`). `/proc/<tid>/net/netlink` maps port ids of the watched namespace to socket
//! inodes (`NETLINK_ROUTE` is protocol 0); `/proc/*/fd/*` links `socket:[inode]` to a
//! process. A writer that already exited (one `ip route replace`) cannot be resolved: the
//! event then carries the port id only (for `ip` and most tools it equals the writer's PID).
//!
//! Cost: resolution happens in *rounds* ([`PortResolver::try_round`]). A round reads the
//! netlink table once and, if some of the ports it was given are still open, walks
//! `/proc/*/fd` once for all of them together (stopping as soon as every one is found). At
//! most one round starts per [`ROUND_INTERVAL`] (200 ms), so a storm of short-lived writers
//! costs at most five table reads and five walks a second, whatever its rate. Answers are
//! cached: a process found for [`HIT_TTL`] (60 s), none found for [`MISS_TTL`] (5 s), at most
//! [`CACHE_CAPACITY`] ports.
//!
//! Delay: [`Attribution`] holds events, in arrival order, until every writer in them is
//! answered; an event behind one that waits, waits too. A port the cache does not answer is
//! answered by the next round, so an event is held at most [`ROUND_INTERVAL`] plus the
//! duration of one round (one table read and one `/proc` walk).
//!
//! Where: [`spawn_attribution`] runs all of it on a thread of its own
//! ([`ATTRIBUTION_THREAD`]), never on a tokio worker; the ring-buffer reader hands it the
//! decoded events in batches.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::OsStr;
use std::hash::BuildHasher;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::event::{RouteWatchEvent, WriterInfo};

/// At most one resolution round (a netlink-table read, and a `/proc` walk if needed) starts
/// per this interval; it is also the longest an event waits for its writer's round.
pub const ROUND_INTERVAL: Duration = Duration::from_millis(200);
/// How long a resolved port stays cached.
pub const HIT_TTL: Duration = Duration::from_mins(1);
/// How long a port nobody was found for stays cached (a new process reusing the port id is
/// found after this).
pub const MISS_TTL: Duration = Duration::from_secs(5);
/// Most ports cached at once: past it, expired entries are dropped, and the whole cache if
/// that frees less than a quarter of it.
pub const CACHE_CAPACITY: usize = 4096;
/// Name of the thread [`spawn_attribution`] starts (its `comm`, under 16 bytes).
pub const ATTRIBUTION_THREAD: &str = "rw-writers";

/// A resolved writer process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessInfo {
    /// Process id.
    pub pid: u32,
    /// Command name (`/proc/<pid>/comm`).
    pub comm: String,
}

/// Parse `/proc/net/netlink`: NETLINK_ROUTE (protocol 0) port id -> socket inode.
///
/// Shape: a header line, then `sk Eth Pid Groups Rmem Wmem Dump Locks Drops Inode`, with
/// `Pid` the port id printed unsigned.
pub fn parse_proc_net_netlink(text: &str) -> HashMap<u32, u64> {
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (eth, port, inode) = (f.get(1)?, f.get(2)?, f.get(9)?);
            (*eth == "0").then_some(())?;
            Some((port.parse().ok()?, inode.parse().ok()?))
        })
        .filter(|&(port, _)| port != 0)
        .collect()
}

/// The inode of a `socket:[inode]` link target.
pub(crate) fn socket_inode(link: &OsStr) -> Option<u64> {
    link.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// The processes holding the sockets `inodes`, found in one pass over `proc_root/*/fd`
/// (normally `/proc`) that stops once every inode is found. A socket held by several
/// processes is given to the first one listed; a process that exits before its `comm` is
/// read is left out (its writes stay unresolved rather than nameless).
pub fn find_socket_owners<S: BuildHasher>(proc_root: &Path, inodes: &HashSet<u64, S>) -> HashMap<u64, ProcessInfo> {
    let mut found = HashMap::new();
    if inodes.is_empty() {
        return found;
    }
    let Ok(procs) = std::fs::read_dir(proc_root) else { return found };
    for entry in procs.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else { continue };
        let mut held = Vec::new();
        for fd in fds.flatten() {
            let Ok(link) = std::fs::read_link(fd.path()) else { continue };
            if let Some(inode) = socket_inode(link.as_os_str()).filter(|i| inodes.contains(i) && !found.contains_key(i)) {
                held.push(inode);
            }
        }
        if held.is_empty() {
            continue;
        }
        let Ok(comm) = std::fs::read_to_string(entry.path().join("comm")) else { continue };
        let comm = comm.trim().to_string();
        for inode in held {
            found.insert(inode, ProcessInfo { pid, comm: comm.clone() });
        }
        if found.len() == inodes.len() {
            break;
        }
    }
    found
}

/// What the resolver did since it was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttributionStats {
    /// Rounds run: each read the netlink table once.
    pub rounds: u64,
    /// Rounds that also walked `/proc/*/fd` (some of their ports were still open).
    pub walks: u64,
    /// Ports a round found a process for.
    pub resolved: u64,
    /// Ports a round found no process for (the writer had exited).
    pub unresolved: u64,
}

/// Cached, rate-limited port-id resolver (see the module doc for the rounds and the caches).
#[derive(Debug)]
pub struct PortResolver {
    netlink_table: PathBuf,
    proc_root: PathBuf,
    round_interval: Duration,
    cache: HashMap<u32, (Instant, Option<ProcessInfo>)>,
    last_round: Option<Instant>,
    stats: AttributionStats,
}

fn ttl(hit: Option<&ProcessInfo>) -> Duration {
    if hit.is_some() {
        HIT_TTL
    } else {
        MISS_TTL
    }
}

impl PortResolver {
    /// Resolve port ids of the network namespace of the calling thread (the table is read
    /// through that thread's `/proc/<pid>/task/<tid>/net/netlink`, which stays valid while the
    /// thread lives; the process-wide `/proc/net/netlink` is used if that path is gone).
    pub fn for_current_thread() -> PortResolver {
        let tid = nix::unistd::gettid();
        let path = PathBuf::from(format!("/proc/{}/task/{tid}/net/netlink", std::process::id()));
        PortResolver::new(path, PathBuf::from("/proc"))
    }

    /// A resolver reading `netlink_table` and scanning `proc_root` (tests use fixtures), with
    /// rounds at most every [`ROUND_INTERVAL`].
    pub fn new(netlink_table: PathBuf, proc_root: PathBuf) -> PortResolver {
        PortResolver { netlink_table, proc_root, round_interval: ROUND_INTERVAL, cache: HashMap::new(), last_round: None, stats: AttributionStats::default() }
    }

    /// The cached answer for `port` at `now`: `Some(None)` is a cached miss, `None` means a
    /// round must ask.
    pub fn cached(&self, port: u32, now: Instant) -> Option<Option<ProcessInfo>> {
        let (at, hit) = self.cache.get(&port)?;
        (now.saturating_duration_since(*at) < ttl(hit.as_ref())).then(|| hit.clone())
    }

    /// When the next round may start (`now` or later).
    pub fn next_round_at(&self, now: Instant) -> Instant {
        self.last_round.map_or(now, |t| (t + self.round_interval).max(now))
    }

    /// One round for `ports`, unless a round started less than the round interval before
    /// `now` (then `None`, and nothing is read). Otherwise every port gets an answer, cached:
    /// one read of the netlink table, and one `/proc` walk for those ports still in it.
    pub fn try_round(&mut self, ports: &HashSet<u32>, now: Instant) -> Option<HashMap<u32, Option<ProcessInfo>>> {
        if self.next_round_at(now) > now {
            return None;
        }
        self.last_round = Some(now);
        self.stats.rounds += 1;
        let table = std::fs::read_to_string(&self.netlink_table).or_else(|_| std::fs::read_to_string("/proc/net/netlink")).unwrap_or_default();
        let inodes = parse_proc_net_netlink(&table);
        let wanted: HashSet<u64> = ports.iter().filter_map(|p| inodes.get(p)).copied().collect();
        let owners = if wanted.is_empty() {
            HashMap::new()
        } else {
            self.stats.walks += 1;
            find_socket_owners(&self.proc_root, &wanted)
        };
        let answers: HashMap<u32, Option<ProcessInfo>> = ports.iter().map(|&p| (p, inodes.get(&p).and_then(|i| owners.get(i)).cloned())).collect();
        for (&port, answer) in &answers {
            if answer.is_some() {
                self.stats.resolved += 1;
            } else {
                self.stats.unresolved += 1;
            }
            self.remember(port, answer.clone(), now);
        }
        Some(answers)
    }

    fn remember(&mut self, port: u32, answer: Option<ProcessInfo>, now: Instant) {
        if self.cache.len() >= CACHE_CAPACITY && !self.cache.contains_key(&port) {
            self.cache.retain(|_, (at, hit)| now.saturating_duration_since(*at) < ttl(hit.as_ref()));
            if self.cache.len() > CACHE_CAPACITY / 4 * 3 {
                self.cache.clear();
            }
        }
        self.cache.insert(port, (now, answer));
    }

    /// Number of cached ports (at most [`CACHE_CAPACITY`]).
    pub fn cache_len(&self) -> usize {
        self.cache.len()
    }

    /// What the resolver did so far.
    pub fn stats(&self) -> AttributionStats {
        self.stats
    }
}

/// The port of a writer known only by its port id (the ones a round resolves).
fn unresolved_port(w: &WriterInfo) -> Option<u32> {
    match (w.netlink_port, w.pid) {
        (Some(port), None) => Some(port),
        _ => None,
    }
}

/// Events waiting for their writers, released in arrival order with `pid`/`comm` filled in
/// where a process was found, and a class the kernel inferred from the protocol decided again
/// from that process ([`WriterInfo::attribute`]); nothing else about an event changes.
#[derive(Debug)]
pub struct Attribution {
    resolver: PortResolver,
    held: VecDeque<RouteWatchEvent>,
}

impl Attribution {
    /// An empty queue resolving through `resolver`.
    pub fn new(resolver: PortResolver) -> Attribution {
        Attribution { resolver, held: VecDeque::new() }
    }

    /// Queue `events` behind those already held.
    pub fn extend(&mut self, events: impl IntoIterator<Item = RouteWatchEvent>) {
        self.held.extend(events);
    }

    /// Events held.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// The resolver (its cache and stats).
    pub fn resolver(&self) -> &PortResolver {
        &self.resolver
    }

    /// Release, in order, the held events whose writers are all answered at `now`, running a
    /// round for the unanswered ports of every held event if the rate limit allows one. Also
    /// returns, while events are still held, when to call again: the next round, by which
    /// every event held now is answered.
    pub fn release(&mut self, now: Instant) -> (Vec<RouteWatchEvent>, Option<Instant>) {
        let mut pending = HashSet::new();
        for ev in &mut self.held {
            for w in ev.writers_mut() {
                pending.extend(unresolved_port(w).filter(|&p| self.resolver.cached(p, now).is_none()));
            }
        }
        let answers = if pending.is_empty() { None } else { self.resolver.try_round(&pending, now) }.unwrap_or_default();
        let answer = |port: u32| answers.get(&port).cloned().or_else(|| self.resolver.cached(port, now));
        let mut out = Vec::new();
        while let Some(ev) = self.held.front_mut() {
            let mut writers = ev.writers_mut();
            let found: Option<Vec<Option<ProcessInfo>>> = writers.iter().map(|w| unresolved_port(w).map_or(Some(None), answer)).collect();
            let Some(found) = found else { break };
            for (w, p) in writers.iter_mut().zip(found) {
                if let Some(p) = p {
                    w.attribute(p.pid, p.comm);
                }
            }
            out.extend(self.held.pop_front());
        }
        let next = (!self.held.is_empty()).then(|| self.resolver.next_round_at(now));
        (out, next)
    }
}

/// Start the attribution thread ([`ATTRIBUTION_THREAD`]): it takes batches of decoded events
/// from `rx`, attributes their writers ([`Attribution`], with a [`PortResolver`] for the
/// network namespace of the calling thread, which the new thread inherits) and sends them, in
/// order, to `tx`; `stats` is kept up to date. It ends when `rx` is closed and nothing is
/// held, or when `tx` is closed.
pub fn spawn_attribution(
    rx: mpsc::Receiver<Vec<RouteWatchEvent>>,
    tx: mpsc::Sender<RouteWatchEvent>,
    stats: Arc<Mutex<AttributionStats>>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name(ATTRIBUTION_THREAD.into()).spawn(move || {
        let queue = Attribution::new(PortResolver::for_current_thread());
        run_attribution(queue, rx, &tx, &stats);
    })
}

/// Wakes a thread parked in [`recv_until`].
struct Unpark(std::thread::Thread);

impl std::task::Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// What [`recv_until`] got.
enum Received<T> {
    Batch(T),
    Closed,
    /// The deadline passed.
    Due,
}

/// The next batch from `rx`, waiting (parked; `waker` unparks this thread) until `deadline`
/// at most, forever without one.
fn recv_until<T>(rx: &mut mpsc::Receiver<T>, waker: &std::task::Waker, deadline: Option<Instant>) -> Received<T> {
    let mut cx = std::task::Context::from_waker(waker);
    loop {
        match rx.poll_recv(&mut cx) {
            std::task::Poll::Ready(Some(batch)) => return Received::Batch(batch),
            std::task::Poll::Ready(None) => return Received::Closed,
            std::task::Poll::Pending => {}
        }
        match deadline {
            None => std::thread::park(),
            Some(at) => {
                let left = at.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Received::Due;
                }
                std::thread::park_timeout(left);
            }
        }
    }
}

/// The attribution thread's loop. With nothing held, each batch is released as it comes
/// (a round runs if the rate limit allows). While events are held, batches keep being taken
/// (so the reader never waits on a full queue) and the release waits for the next round:
/// nothing can leave before it, since the first held event waits for that round.
fn run_attribution(mut queue: Attribution, mut rx: mpsc::Receiver<Vec<RouteWatchEvent>>, tx: &mpsc::Sender<RouteWatchEvent>, stats: &Mutex<AttributionStats>) {
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut wake: Option<Instant> = None;
    let mut open = true;
    loop {
        let received = match (wake, open) {
            (None, false) => return,
            (deadline, true) => recv_until(&mut rx, &waker, deadline),
            (Some(at), false) => {
                std::thread::sleep(at.saturating_duration_since(Instant::now()));
                Received::Due
            }
        };
        match received {
            Received::Batch(batch) => queue.extend(batch),
            Received::Closed => open = false,
            Received::Due => {}
        }
        if wake.is_some_and(|at| Instant::now() < at) {
            continue;
        }
        let (ready, next) = queue.release(Instant::now());
        *stats.lock().unwrap_or_else(PoisonError::into_inner) = queue.resolver().stats();
        for ev in ready {
            if tx.blocking_send(ev).is_err() {
                return;
            }
        }
        wake = next;
    }
}

#[cfg(test)]
mod tests;
