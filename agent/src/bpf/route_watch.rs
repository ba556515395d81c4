//! The in-kernel route-churn watch: loads one of three backends feeding the same in-kernel
//! detector (`ebpf/src/route_detector.rs`), reads its per-CPU counters and turns its
//! ring-buffer records into [`RouteWatchEvent`]s.
//!
//! Backends, best first ([`RouteWatchBackend`], loaded in [`backends`]):
//! 1. `fentry` on `fib_table_insert`/`fib_table_delete`/`fib6_add`/`fib6_del` (BPF
//!    trampolines; writer = current task, pid and comm);
//! 2. `kprobe` on the same functions (kernels without trampolines);
//! 3. `socket-filter` on a NETLINK_ROUTE socket joined to the link, route and nexthop groups
//!    (every kernel; the nexthop group only to know which route notifications a nexthop
//!    replace re-sent, which are not writes). Writer = the task that sent the request
//!    ([`Senders::Task`]); where the kernel refuses that (lockdown withholding
//!    `bpf_probe_read_kernel`, no BTF), the netlink port id, resolved to a process through
//!    `/proc` on a thread of its own ([`attribution`], [`Senders::Port`]). Joined to the rule
//!    groups too, it sees policy rule writes (`RuleChange` events,
//!    `routewarden_rule_writes_total`); beside fentry and kprobe the same filter runs on a
//!    socket joined to the rule groups alone, so rule writes are watched on every backend.
//!
//! fentry attaches at the functions' return (fexit) and kprobe pairs each kprobe with a
//! kretprobe, so both know whether the kernel made the write: a refused write goes to the
//! failure runs (`FailingWriter` events, `routewarden_route_write_failures_total`), not to
//! the conflict and flap detector. A socket filter sees only writes that succeeded; its
//! `/readyz` note says so.
//!
//! fentry/kprobe need struct offsets: resolved from `/sys/kernel/btf/vmlinux` after checking
//! the hooked prototypes ([`btf`]), passed as the global `ROUTE_WATCH_OFFSETS`, with the
//! watched network namespace's inode in `ROUTE_WATCH_NETNS_INUM`.
//!
//! The watch covers the network namespace of the thread that loaded the object
//! ([`BpfObject::load`]). Nothing here panics on kernel data; when no backend loads the caller
//! gets [`BpfError::NoBackend`] with every attempt's reason and keeps programming routes. The
//! backends are tried in turn on the process's one load, and the maps are taken only by the
//! backend that runs, so they exist once whatever was tried. The app runs the watch in a
//! [`crate::bpf::watch::WatchHandler`] ([`Watch`]): [`RouteWatch::start_in`], then
//! [`RouteWatch::spawn_reader`], with [`RouteWatchMetrics`] folding counters and events into
//! the metrics.

pub mod attribution;
mod backends;
pub mod btf;
pub mod event;
pub mod events_stream;
pub mod metrics_apply;
pub(crate) mod settings;

use std::collections::HashSet;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use aya::maps::{MapData, PerCpuArray, RingBuf};

use crate::bpf::bpf_log::BpfLogLevel;
use crate::bpf::loader::{BpfObject, LoadConfig, TakenMaps};
use crate::bpf::watch::Watch;
use crate::bpf::BpfError;
use crate::observe::Metrics;
use routewarden_common::route_watch::{RouteWatchCounters, ROUTE_WATCH_COUNTERS_MAP, ROUTE_WATCH_EVENTS_MAP, ROUTE_WATCH_SELF_PORTS_MAP, SELF_PORTS_MAX};
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

use backends::BackendLink;
pub use backends::{listener_floor, tracing_programs_allowed, Senders};
pub use event::{RouteChange, RouteWatchEvent, RuleChange, WriteError, WriterInfo};
pub use metrics_apply::{EpisodeScope, RouteWatchMetrics};
pub use settings::{current_netns_inode, RouteWatchBackend, RouteWatchConfig, UnknownBackend};

/// The maps the watch reads and writes (the detector's state map stays kernel-only).
const MAPS: [&str; 3] = [ROUTE_WATCH_EVENTS_MAP, ROUTE_WATCH_COUNTERS_MAP, ROUTE_WATCH_SELF_PORTS_MAP];

/// A running route watch. Dropping it detaches every program.
pub struct RouteWatch {
    object: BpfObject,
    maps: TakenMaps,
    backend: RouteWatchBackend,
    window: Duration,
    /// The fentry/kprobe backend's links (dropping them detaches the programs).
    _links: Vec<BackendLink>,
    /// The NETLINK_ROUTE socket the filter is attached to (socket-filter backend; closing it
    /// detaches the filter).
    _socket: Option<OwnedFd>,
    /// The rule watch (the backend itself, or a socket filter beside fentry/kprobe).
    rules: backends::RuleFilter,
    /// Backends that were tried before this one, with why they failed.
    fallbacks: Vec<(RouteWatchBackend, String)>,
    /// How writers are named.
    senders: Senders,
    /// What the attribution thread did (zero until the reader starts).
    attribution: Arc<Mutex<attribution::AttributionStats>>,
    /// The process whose writes are `self`.
    self_pid: u32,
    /// The metrics' view of the counters and events.
    metrics_state: RouteWatchMetrics,
}

impl std::fmt::Debug for RouteWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteWatch").field("backend", &self.backend).field("fallbacks", &self.fallbacks).finish_non_exhaustive()
    }
}

impl RouteWatch {
    /// Load the object on its own ([`BpfObject::load`] with `config`) and start the watch from
    /// it ([`RouteWatch::start_in`]): for tests, benchmarks and `routewarden events`.
    ///
    /// # Errors
    /// As [`BpfObject::load`] and [`RouteWatch::start_in`].
    pub fn start(object: &'static [u8], config: &RouteWatchConfig) -> Result<RouteWatch, BpfError> {
        let object = BpfObject::load(object, LoadConfig::for_route_watch(config))?;
        Self::start_in(&object)
    }

    /// Start the watch on `object`, with the settings it was loaded with
    /// ([`LoadConfig::route_watch`]): the forced backend, or the best of fentry > kprobe >
    /// socket filter that loads and attaches. Start it before any other watch of `object`:
    /// the socket-filter fallback without kernel logs loads the object again.
    ///
    /// # Errors
    /// [`BpfError::NoBackend`] with each attempt's reason (the forced one alone when a backend
    /// is forced). The caller reports the watch as degraded and carries on.
    pub fn start_in(object: &BpfObject) -> Result<RouteWatch, BpfError> {
        let config = object.config().route_watch.clone().unwrap_or_default();
        let order: Vec<RouteWatchBackend> = match config.backend {
            Some(b) => vec![b],
            None => RouteWatchBackend::PREFERENCE.to_vec(),
        };
        let mut attempts = Vec::new();
        for backend in order {
            match backends::start_backend(object, backend).and_then(|started| Ok((started, object.take_maps(&MAPS)?))) {
                Ok((backends::Started { links, socket, senders, rules }, maps)) => {
                    tracing::info!(backend = backend.label(), fallbacks = ?attempts, senders = %senders, "route watch running");
                    let mut watch = RouteWatch {
                        object: object.clone(),
                        maps,
                        self_pid: config.self_pid.unwrap_or_else(std::process::id),
                        backend,
                        window: config.window,
                        _links: links,
                        _socket: socket,
                        rules,
                        fallbacks: attempts,
                        senders,
                        attribution: Arc::default(),
                        metrics_state: RouteWatchMetrics::new(config.window),
                    };
                    if let Err(e) = watch.refresh_self_ports() {
                        tracing::warn!(error = %e, "route watch: cannot list this process's netlink ports; its writes may show as protocol writers");
                    }
                    return Ok(watch);
                }
                Err(e) => {
                    let e = BpfError::Backend { backend, source: Box::new(e) };
                    tracing::info!(backend = backend.label(), error = %e, "route-watch backend unavailable");
                    attempts.push((backend, e.to_string()));
                }
            }
        }
        Err(BpfError::NoBackend { attempts })
    }

    /// The kernel-side log level in effect: the configured one, or [`BpfLogLevel::Off`] when
    /// the socket-filter program with logging was too large for this kernel's
    /// `net.core.optmem_max` and the object was loaded again without it (a warning says so at
    /// start).
    #[must_use]
    pub fn log_level(&self) -> BpfLogLevel {
        self.object.log_level()
    }

    /// Tell the kernel which netlink ports are the self process's (socket-filter backend:
    /// writes are identified by the sender's port): its `NETLINK_ROUTE` sockets in the calling
    /// thread's network namespace, from `/proc/thread-self/net/netlink` and
    /// `/proc/<pid>/fd`. Ports no longer open are removed. Call it after the process opened a
    /// socket it writes routes with (the agent does every second); returns how many ports are
    /// registered. The fentry and kprobe backends identify the process by tgid and need none.
    ///
    /// # Errors
    /// [`BpfError::Map`] when the map cannot be updated; unreadable `/proc` entries
    /// count as no ports.
    pub fn refresh_self_ports(&mut self) -> Result<usize, BpfError> {
        let table = std::fs::read_to_string("/proc/thread-self/net/netlink").unwrap_or_default();
        let inodes: HashSet<u64> = std::fs::read_dir(format!("/proc/{}/fd", self.self_pid))
            .into_iter()
            .flatten()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter_map(|l| attribution::socket_inode(l.as_os_str()))
            .collect();
        let mut want: Vec<u32> = attribution::parse_proc_net_netlink(&table).into_iter().filter(|(_, i)| inodes.contains(i)).map(|(p, _)| p).collect();
        want.sort_unstable();
        want.truncate(SELF_PORTS_MAX as usize);
        let map_err = BpfError::map(ROUTE_WATCH_SELF_PORTS_MAP, "update");
        let map = self.maps.map_mut(ROUTE_WATCH_SELF_PORTS_MAP)?;
        let mut ports: aya::maps::HashMap<&mut MapData, u32, u8> = aya::maps::HashMap::try_from(map).map_err(&map_err)?;
        let stale: Vec<u32> = ports.keys().filter_map(Result::ok).filter(|p| want.binary_search(p).is_err()).collect();
        for p in stale {
            let _ = ports.remove(&p);
        }
        for p in &want {
            ports.insert(p, 1, 0).map_err(&map_err)?;
        }
        Ok(want.len())
    }

    /// Judge conflicts and flaps only inside `scope` from now on
    /// ([`metrics_apply::EpisodeScope`]): the cluster's IP pools and routewarden's own keys.
    pub fn set_episode_scope(&mut self, scope: metrics_apply::EpisodeScope) {
        self.metrics_state.set_scope(scope);
    }

    /// The backend that is running.
    pub fn backend(&self) -> RouteWatchBackend {
        self.backend
    }

    /// How the running backend names writers (in `/readyz` and the start log).
    pub fn senders(&self) -> &Senders {
        &self.senders
    }

    /// The conflict / flap window the detector uses.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Better backends that were tried first, with why they failed (for the startup log).
    pub fn fallbacks(&self) -> &[(RouteWatchBackend, String)] {
        &self.fallbacks
    }

    /// Sum of the per-CPU counters since the watch started.
    ///
    /// # Errors
    /// [`BpfError::Map`] when the counter map cannot be read.
    pub fn counters(&self) -> Result<RouteWatchCounters, BpfError> {
        let map_err = BpfError::map(ROUTE_WATCH_COUNTERS_MAP, "read");
        let map = self.maps.map(ROUTE_WATCH_COUNTERS_MAP)?;
        let array: PerCpuArray<&MapData, RouteWatchCounters> = PerCpuArray::try_from(map).map_err(&map_err)?;
        let values = array.get(&0, 0).map_err(&map_err)?;
        Ok(values.iter().fold(RouteWatchCounters::default(), |acc, v| sum_counters(&acc, v)))
    }

    /// Start the ring-buffer reader on the current tokio runtime: decodes each record and
    /// hands the events to the writer-attribution thread ([`attribution::spawn_attribution`]),
    /// which resolves netlink port ids to processes (best effort, in the network namespace of
    /// the calling thread) and sends the events, in order, to `tx`. An event whose writer is
    /// not cached waits at most [`attribution::ROUND_INTERVAL`] (200 ms) plus one `/proc` round.
    /// Undecodable records are logged and skipped. Once `tx` is closed, the thread ends at its
    /// next event and the task after it; aborting the task ends the thread once it has sent
    /// what it held.
    ///
    /// # Errors
    /// [`BpfError::ReaderTaken`] on a second call; map/socket/thread errors otherwise.
    pub fn spawn_reader(&mut self, tx: mpsc::Sender<RouteWatchEvent>) -> Result<tokio::task::JoinHandle<()>, BpfError> {
        let map = self.maps.take(ROUTE_WATCH_EVENTS_MAP).ok_or(BpfError::ReaderTaken)?;
        let ring = RingBuf::try_from(map).map_err(BpfError::map(ROUTE_WATCH_EVENTS_MAP, "open"))?;
        // SAFETY: the RingBuf owns its map fd for its whole life and always returns that fd;
        // the AsyncFd owns the RingBuf.
        let fd = unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }.map_err(|e| BpfError::Poll(e.into()))?;
        let (batch_tx, batch_rx) = mpsc::channel(ATTRIBUTION_BATCHES);
        attribution::spawn_attribution(batch_rx, tx, Arc::clone(&self.attribution)).map_err(BpfError::Thread)?;
        Ok(tokio::spawn(read_ring(fd, batch_tx)))
    }

    /// What the writer-attribution thread did so far: rounds, `/proc` walks, ports resolved
    /// and not (all zero before [`RouteWatch::spawn_reader`]).
    pub fn attribution_stats(&self) -> attribution::AttributionStats {
        *self.attribution.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Watch for RouteWatch {
    type Event = RouteWatchEvent;
    const NAME: &'static str = WATCHER_NAME;
    const DEGRADED: &'static str = "route watch degraded: no backend runs; routes are still programmed";

    fn spawn_reader(&mut self, tx: mpsc::Sender<RouteWatchEvent>) -> Result<Option<tokio::task::JoinHandle<()>>, BpfError> {
        RouteWatch::spawn_reader(self, tx).map(Some)
    }

    /// `<backend>: <how writers are named>; <what it cannot see>`, e.g. `socket-filter:
    /// writers named by process in the kernel; route write outcomes not visible: ...`. A rule
    /// watch that did not start beside fentry/kprobe says so with its reason.
    fn note(&self) -> Option<String> {
        use std::fmt::Write as _;
        let mut note = format!("{}: {}", self.backend, self.senders);
        if !self.backend.sees_outcomes() {
            note.push_str("; route write outcomes not visible: a socket filter sees the kernel's notifications, sent only for writes that succeeded, so refused writes (a failing writer) are not seen (fentry and kprobe see them)");
        }
        match &self.rules {
            backends::RuleFilter::Backend => {}
            backends::RuleFilter::Running(_, senders) if *senders == self.senders => {}
            backends::RuleFilter::Running(_, senders) => {
                let _ = write!(note, "; policy rule writes watched by a socket filter, {senders}");
            }
            backends::RuleFilter::Failed(why) => {
                let _ = write!(note, "; policy rule writes not watched: the socket filter for them did not start: {why}");
            }
        }
        Some(note)
    }

    fn on_started(&mut self, metrics: &Metrics) {
        // `start_in` already logged each backend it could not use and why.
        tracing::info!(backend = self.backend.label(), window_s = self.window.as_secs(), senders = %self.senders, "route watch running");
        self.metrics_state.set_backend(metrics, Some(self.backend));
    }

    fn on_degraded(metrics: &Metrics) {
        RouteWatchMetrics::new(Duration::ZERO).set_backend(metrics, None);
    }

    /// Refresh this process's netlink ports, read the kernel counters and expire the
    /// flapping-prefixes gauge.
    fn poll(&mut self, metrics: &Metrics) {
        // Sockets the agent opened since: its writes must stay `self`.
        if let Err(e) = self.refresh_self_ports() {
            tracing::warn!(error = %e, "route watch: refreshing this process's netlink ports");
        }
        match self.counters() {
            Ok(c) => self.metrics_state.apply_counters(metrics, &c),
            Err(e) => tracing::warn!(error = %e, "route watch: reading counters"),
        }
        self.metrics_state.tick(metrics, std::time::Instant::now());
    }

    /// Fold one event into the metrics (and the conflict/flap warn logs).
    fn on_event(&mut self, metrics: &Metrics, event: &RouteWatchEvent) {
        self.metrics_state.apply_event(metrics, event, std::time::Instant::now());
    }
}

/// Name of the watch in `/readyz` and of the program label in
/// `routewarden_bpf_program_attached`.
pub const WATCHER_NAME: &str = "route_watch";

/// Batches (one per ring-buffer wake-up) queued for the attribution thread; when they are
/// all taken, the reader waits and the kernel's ring buffer absorbs (and counts as lost)
/// what does not fit, as when the events' consumer is slow.
const ATTRIBUTION_BATCHES: usize = 64;

async fn read_ring(mut fd: AsyncFd<RingBuf<aya::maps::MapData>>, tx: mpsc::Sender<Vec<RouteWatchEvent>>) {
    loop {
        let mut guard = match fd.readable_mut().await {
            Ok(g) => g,
            Err(e) => {
                tracing::warn!(error = %e, "route watch: ring buffer poll failed; reader stops");
                return;
            }
        };
        let mut batch = Vec::new();
        {
            let ring = guard.get_inner_mut();
            while let Some(item) = ring.next() {
                match event::decode_record(&item) {
                    Ok(ev) => batch.push(ev),
                    Err(e) => tracing::warn!(error = %e, "route watch: undecodable ring-buffer record skipped"),
                }
            }
        }
        guard.clear_ready();
        if !batch.is_empty() && tx.send(batch).await.is_err() {
            return;
        }
    }
}

/// `a + b`, field by field.
pub fn sum_counters(a: &RouteWatchCounters, b: &RouteWatchCounters) -> RouteWatchCounters {
    fn add(into: &mut [u64], from: &[u64]) {
        for (x, y) in into.iter_mut().zip(from) {
            *x += y;
        }
    }
    let mut out = *a;
    add(out.writes.as_flattened_mut().as_flattened_mut(), b.writes.as_flattened().as_flattened());
    add(out.conflicts.as_flattened_mut().as_flattened_mut(), b.conflicts.as_flattened().as_flattened());
    add(out.rule_writes.as_flattened_mut().as_flattened_mut(), b.rule_writes.as_flattened().as_flattened());
    add(out.write_failures.as_flattened_mut().as_flattened_mut(), b.write_failures.as_flattened().as_flattened());
    add(out.failing.as_flattened_mut(), b.failing.as_flattened());
    for i in 0..out.flaps.len() {
        out.flaps[i] += b.flaps[i];
        out.flushes[i] += b.flushes[i];
        out.unattributed[i] += b.unattributed[i];
    }
    out.records_lost += b.records_lost;
    out.decode_errors += b.decode_errors;
    out.other_netns += b.other_netns;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_flag_values_round_trip() {
        for b in RouteWatchBackend::PREFERENCE {
            assert_eq!(b.label().parse::<RouteWatchBackend>().unwrap(), b);
        }
        assert_eq!("netlink".parse::<RouteWatchBackend>().unwrap(), RouteWatchBackend::SocketFilter);
        assert!("ebpf".parse::<RouteWatchBackend>().unwrap_err().to_string().contains("fentry, kprobe or socket-filter"));
    }

    #[test]
    fn per_cpu_counters_sum_every_field() {
        let mut a = RouteWatchCounters::default();
        a.writes[0][1][2] = 1;
        a.rule_writes[1][1][6] = 2;
        a.flaps[1] = 3;
        let mut b = a;
        b.conflicts[0][3][4] = 5;
        b.rule_writes[1][1][6] = 7;
        b.records_lost = 8;
        a.write_failures[1][0][2] = 10;
        b.write_failures[1][0][2] = 11;
        b.failing[1][2] = 12;
        let sum = sum_counters(&a, &b);
        assert_eq!((sum.writes[0][1][2], sum.rule_writes[1][1][6], sum.flaps[1], sum.conflicts[0][3][4], sum.records_lost), (2, 9, 6, 5, 8));
        assert_eq!((sum.write_failures[1][0][2], sum.failing[1][2], sum.failing[0][2]), (21, 12, 0));
    }

    #[test]
    fn empty_object_is_a_clear_error() {
        assert!(matches!(RouteWatch::start(&[], &RouteWatchConfig::default()), Err(BpfError::NoObject)));
    }
}
