//! The in-kernel route-churn watch (issue 5): loads one of three backends feeding the same
//! in-kernel detector (`ebpf/src/route_detector.rs`), reads its per-CPU counters and turns its
//! ring-buffer records into [`RouteWatchEvent`]s.
//!
//! Backends, best first ([`RouteWatchBackend`]):
//! 1. `fentry` on `fib_table_insert`/`fib_table_delete`/`fib6_add`/`fib6_del` (BPF
//!    trampolines; writer = current task, pid and comm);
//! 2. `kprobe` on the same functions (kernels without trampolines);
//! 3. `socket-filter` on a NETLINK_ROUTE socket joined to the link and route groups (every
//!    kernel; writer = netlink port id, resolved to a process through `/proc` on a thread of
//!    its own, in rate-limited rounds: [`writer`]).
//!
//! fentry/kprobe need struct offsets: resolved from `/sys/kernel/btf/vmlinux` after checking
//! the hooked prototypes ([`btf`]), passed as the global `ROUTE_WATCH_OFFSETS`, with the
//! watched network namespace's inode in `ROUTE_WATCH_NETNS_INUM`.
//!
//! Namespace: [`RouteWatch::start`] watches the network namespace of the calling thread.
//! Nothing here panics on kernel data; when no backend loads the caller gets
//! [`RouteWatchError::NoBackend`] with every attempt's reason and keeps programming routes.
//!
//! Use (the app):
//! ```ignore
//! let mut watch = RouteWatch::start(object, &RouteWatchConfig::default())?;
//! let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
//! watch.spawn_reader(tx)?;
//! let mut state = RouteWatchMetrics::new(watch.window());
//! state.set_backend(&metrics, Some(watch.backend()));
//! // every few seconds:       state.apply_counters(&metrics, &watch.counters()?);
//! // for each event from rx:  state.apply_event(&metrics, &event, Instant::now());
//! // every few seconds:       state.tick(&metrics, Instant::now());
//! ```

pub mod btf;
pub mod event;
pub mod events_cmd;
pub mod metrics_apply;
pub mod writer;

use std::os::fd::{AsFd, OwnedFd};
use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use std::collections::HashSet;

use aya::maps::{MapData, PerCpuArray, RingBuf};
use aya::programs::{FEntry, KProbe, SocketFilter};
use aya::{Ebpf, EbpfLoader};

use crate::bpf::bpf_log::{BpfLogForwarder, BpfLogLevel};
use routewarden_common::route_watch::{
    KernelOffsets, RouteWatchCounters, GLOBAL_FLAP_THRESHOLD, GLOBAL_NETNS_INUM, GLOBAL_OFFSETS, GLOBAL_SELF_PROTOCOL, GLOBAL_SELF_TGID, ROUTE_WATCH_SELF_PORTS_MAP, SELF_PORTS_MAX,
    GLOBAL_STREAM_WRITES, GLOBAL_WINDOW_NS, HOOKED_FUNCTIONS, PROGS_FENTRY, PROGS_KPROBE, PROG_SOCKET_FILTER,
    ROUTE_WATCH_COUNTERS_MAP, ROUTE_WATCH_EVENTS_MAP,
};
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

pub use event::{RouteChange, RouteWatchEvent, WriterInfo};
pub use metrics_apply::RouteWatchMetrics;

/// Which in-kernel hook feeds the detector.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RouteWatchBackend {
    /// fentry on the FIB functions.
    Fentry,
    /// kprobes on the FIB functions.
    Kprobe,
    /// Socket filter on a NETLINK_ROUTE socket.
    SocketFilter,
}

impl RouteWatchBackend {
    /// Preference order used when none is forced.
    pub const PREFERENCE: [RouteWatchBackend; 3] =
        [RouteWatchBackend::Fentry, RouteWatchBackend::Kprobe, RouteWatchBackend::SocketFilter];

    /// `fentry`, `kprobe`, `socket-filter` (flag value and metric label).
    pub fn label(self) -> &'static str {
        match self {
            RouteWatchBackend::Fentry => "fentry",
            RouteWatchBackend::Kprobe => "kprobe",
            RouteWatchBackend::SocketFilter => "socket-filter",
        }
    }
}

impl std::fmt::Display for RouteWatchBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// A `--route-watch-backend` value that is not `fentry`, `kprobe` or `socket-filter`.
#[derive(Debug, thiserror::Error)]
#[error("unknown route-watch backend {0:?} (expected fentry, kprobe or socket-filter)")]
pub struct UnknownBackend(pub String);

impl FromStr for RouteWatchBackend {
    type Err = UnknownBackend;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fentry" => Ok(RouteWatchBackend::Fentry),
            "kprobe" => Ok(RouteWatchBackend::Kprobe),
            "socket-filter" | "netlink" => Ok(RouteWatchBackend::SocketFilter),
            other => Err(UnknownBackend(other.to_string())),
        }
    }
}

/// `error: cause: cause …`, down to the OS error, for messages operators read.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        next = cause.source();
    }
    out
}

/// Whether the error's cause chain ends in ENOMEM (a socket filter over the socket's option
/// memory).
fn is_out_of_memory(e: &RouteWatchError) -> bool {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(cause) = next {
        if cause.downcast_ref::<std::io::Error>().and_then(std::io::Error::raw_os_error) == Some(nix::errno::Errno::ENOMEM as i32) {
            return true;
        }
        next = cause.source();
    }
    false
}

/// Settings of the watch.
#[derive(Clone, Debug)]
pub struct RouteWatchConfig {
    /// Force one backend (no fallback); `None`: the best that loads.
    pub backend: Option<RouteWatchBackend>,
    /// Conflict / flap window (default 30 s).
    pub window: Duration,
    /// Changes within the window that make a flap (default 3).
    pub flap_threshold: u32,
    /// The agent's own route protocol, classified `self` (0: none).
    pub self_protocol: u8,
    /// Emit a record per write (for `routewarden events`; default off).
    pub stream_writes: bool,
    /// Ring-buffer size in bytes (power of two, multiple of the page size); `None`: 256 KiB.
    pub ring_buffer_bytes: Option<u32>,
    /// Kernel-side log level (`--bpf-log-level`, default off; [`crate::bpf::bpf_log`]).
    pub log_level: BpfLogLevel,
    /// The process whose writes at `self_protocol` are `self` (`None`: this process). Another
    /// process writing the same protocol is classified by the protocol alone (80: `felix`).
    pub self_pid: Option<u32>,
}

impl Default for RouteWatchConfig {
    fn default() -> Self {
        RouteWatchConfig {
            backend: None,
            window: Duration::from_secs(30),
            flap_threshold: 3,
            self_protocol: 0,
            stream_writes: false,
            ring_buffer_bytes: None,
            log_level: BpfLogLevel::Off,
            self_pid: None,
        }
    }
}

/// Why the watch (or one backend of it) is not running.
#[derive(Debug, thiserror::Error)]
pub enum RouteWatchError {
    /// The binary was built without the kernel-side object.
    #[error("no BPF object is embedded in this build (build with `cargo xtask build`)")]
    NoObject,
    /// Every backend tried failed; each attempt's reason, best backend first.
    #[error("route watch degraded, no backend works: {}", attempts.iter().map(|(_, e)| e.as_str()).collect::<Vec<_>>().join("; "))]
    NoBackend { attempts: Vec<(RouteWatchBackend, String)> },
    /// BTF is missing or does not match the hooks (fentry/kprobe only).
    #[error("{backend}: kernel BTF: {source}")]
    Btf {
        backend: RouteWatchBackend,
        #[source]
        source: btf::BtfError,
    },
    /// Loading the object (maps, globals) failed.
    #[error("{backend}: loading BPF object: {source}")]
    Load {
        backend: RouteWatchBackend,
        #[source]
        source: Box<aya::EbpfError>,
    },
    /// Loading or attaching one program failed (EPERM for fentry on this host's kernel,
    /// missing kprobe support, verifier rejection). The message carries the whole cause
    /// chain, down to the kernel's errno.
    #[error("{backend}: {op} {program}: {}", error_chain(source.as_ref()))]
    Program {
        backend: RouteWatchBackend,
        op: &'static str,
        program: &'static str,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    /// A program or map is missing from the object.
    #[error("{0} not found in the BPF object")]
    Missing(&'static str),
    /// A map has the wrong type or cannot be read.
    #[error("map {map}: {source}")]
    Map {
        map: &'static str,
        #[source]
        source: Box<aya::maps::MapError>,
    },
    /// Creating, binding or watching the NETLINK_ROUTE socket failed.
    #[error("netlink socket: {op}: {source}")]
    Socket {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The ring-buffer reader was already started.
    #[error("the ring-buffer reader is already running")]
    ReaderTaken,
    /// The writer-attribution thread could not be started.
    #[error("starting the writer-attribution thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// A running route watch. Dropping it detaches every program.
pub struct RouteWatch {
    bpf: Ebpf,
    backend: RouteWatchBackend,
    window: Duration,
    /// The NETLINK_ROUTE socket the filter is attached to (socket-filter backend).
    _socket: Option<OwnedFd>,
    /// Backends that were tried before this one, with why they failed.
    fallbacks: Vec<(RouteWatchBackend, String)>,
    /// What the attribution thread did (zero until the reader starts).
    attribution: Arc<Mutex<writer::AttributionStats>>,
    /// Forwards the programs' log lines (`None` with `--bpf-log-level off`).
    _log: Option<BpfLogForwarder>,
    /// The kernel-side log level in effect: the configured one, or `Off` when the
    /// socket-filter program with logging did not fit the socket ([`RouteWatch::log_level`]).
    log_level: BpfLogLevel,
    /// The process whose writes are `self`.
    self_pid: u32,
}

impl std::fmt::Debug for RouteWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteWatch").field("backend", &self.backend).field("fallbacks", &self.fallbacks).finish_non_exhaustive()
    }
}

/// Inode of the calling thread's network namespace (what `ns.inum` holds in the kernel).
pub fn current_netns_inode() -> Result<u32, std::io::Error> {
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata("/proc/thread-self/ns/net")?.ino();
    u32::try_from(ino).map_err(|_| std::io::Error::other("netns inode does not fit 32 bits"))
}

impl RouteWatch {
    /// Start the watch in the calling thread's network namespace: the forced backend, or the
    /// best of fentry > kprobe > socket filter that loads and attaches.
    ///
    /// # Errors
    /// [`RouteWatchError::NoBackend`] with each attempt's reason (the forced one alone when a
    /// backend is forced). The caller reports the watch as degraded and carries on.
    pub fn start(object: &[u8], config: &RouteWatchConfig) -> Result<RouteWatch, RouteWatchError> {
        if object.is_empty() {
            return Err(RouteWatchError::NoObject);
        }
        // RLIMIT_MEMLOCK is left alone: kernels >= 5.11 account BPF memory to the memcg, and
        // raising it fails without CAP_SYS_RESOURCE (toolchain.md).
        let order: Vec<RouteWatchBackend> = match config.backend {
            Some(b) => vec![b],
            None => RouteWatchBackend::PREFERENCE.to_vec(),
        };
        let mut attempts = Vec::new();
        for backend in order {
            match Self::start_backend(object, config, backend) {
                Ok((mut bpf, socket, log_level)) => {
                    tracing::info!(backend = backend.label(), fallbacks = ?attempts, "route watch running");
                    let log = BpfLogForwarder::start(&mut bpf, "route-watch", log_level);
                    let mut watch = RouteWatch {
                        _log: log,
                        log_level,
                        self_pid: config.self_pid.unwrap_or_else(std::process::id),
                        bpf,
                        backend,
                        window: config.window,
                        _socket: socket,
                        fallbacks: attempts,
                        attribution: Arc::default(),
                    };
                    if let Err(e) = watch.refresh_self_ports() {
                        tracing::warn!(error = %e, "route watch: cannot list this process's netlink ports; its writes may show as protocol writers");
                    }
                    return Ok(watch);
                }
                Err(e) => {
                    tracing::info!(backend = backend.label(), error = %e, "route-watch backend unavailable");
                    attempts.push((backend, e.to_string()));
                }
            }
        }
        Err(RouteWatchError::NoBackend { attempts })
    }

    fn load(
        object: &[u8],
        config: &RouteWatchConfig,
        backend: RouteWatchBackend,
        offsets: &KernelOffsets,
        log_level: BpfLogLevel,
    ) -> Result<Ebpf, RouteWatchError> {
        let window_ns = u64::try_from(config.window.as_nanos()).unwrap_or(u64::MAX);
        let threshold = config.flap_threshold.max(1);
        let self_protocol = u32::from(config.self_protocol);
        let stream = u32::from(config.stream_writes);
        let self_tgid = config.self_pid.unwrap_or_else(std::process::id);
        let netns = if backend == RouteWatchBackend::SocketFilter { 0 } else { current_netns_inode().unwrap_or(0) };
        let mut loader = EbpfLoader::new();
        loader
            .override_global(GLOBAL_WINDOW_NS, &window_ns, true)
            .override_global(GLOBAL_FLAP_THRESHOLD, &threshold, true)
            .override_global(GLOBAL_SELF_PROTOCOL, &self_protocol, true)
            .override_global(GLOBAL_SELF_TGID, &self_tgid, true)
            .override_global(GLOBAL_STREAM_WRITES, &stream, true)
            .override_global(GLOBAL_NETNS_INUM, &netns, true)
            .override_global(GLOBAL_OFFSETS, offsets, true);
        if let Some(bytes) = config.ring_buffer_bytes {
            loader.map_max_entries(ROUTE_WATCH_EVENTS_MAP, bytes);
        }
        log_level.apply(&mut loader);
        loader.load(object).map_err(|e| RouteWatchError::Load { backend, source: Box::new(e) })
    }

    fn start_backend(
        object: &[u8],
        config: &RouteWatchConfig,
        backend: RouteWatchBackend,
    ) -> Result<(Ebpf, Option<OwnedFd>, BpfLogLevel), RouteWatchError> {
        let prog_err = |op, program, e| RouteWatchError::Program { backend, op, program, source: Box::new(e) };
        match backend {
            RouteWatchBackend::SocketFilter => {
                // A socket filter is charged to the socket's option memory: a program larger
                // than `net.core.optmem_max` (20 KiB before Linux 6.9) fails SO_ATTACH_BPF
                // with ENOMEM (net/core/filter.c, sk_filter_charge). The logging code doubles
                // the program, so a watch asked to log retries without it rather than going
                // without a route watch.
                let attach = |level: BpfLogLevel| -> Result<(Ebpf, OwnedFd, Option<u32>), RouteWatchError> {
                    let mut bpf = Self::load(object, config, backend, &KernelOffsets::UNRESOLVED, level)?;
                    let socket = route_socket()?;
                    let prog: &mut SocketFilter = bpf
                        .program_mut(PROG_SOCKET_FILTER)
                        .ok_or(RouteWatchError::Missing(PROG_SOCKET_FILTER))?
                        .try_into()
                        .map_err(|e| prog_err("type", PROG_SOCKET_FILTER, e))?;
                    prog.load().map_err(|e| prog_err("load", PROG_SOCKET_FILTER, e))?;
                    let size = prog.info().ok().and_then(|i| i.size_translated());
                    prog.attach(socket.as_fd()).map_err(|e| prog_err("attach", PROG_SOCKET_FILTER, e))?;
                    Ok((bpf, socket, size))
                };
                match attach(config.log_level) {
                    Ok((bpf, socket, _)) => Ok((bpf, Some(socket), config.log_level)),
                    Err(e) if config.log_level != BpfLogLevel::Off && is_out_of_memory(&e) => {
                        let (bpf, socket, size) = attach(BpfLogLevel::Off)?;
                        // Global before 6.9 and then not visible from other namespaces.
                        let optmem = std::fs::read_to_string("/proc/sys/net/core/optmem_max")
                            .map_or_else(|_| "unknown".to_owned(), |s| s.trim().to_owned());
                        tracing::warn!(
                            requested = ?config.log_level,
                            optmem_max = %optmem,
                            bytes_without_logs = size.unwrap_or(0),
                            error = %e,
                            "route watch: the socket-filter program with kernel logs is larger than this kernel lets a socket hold (net.core.optmem_max); running it without kernel logs"
                        );
                        Ok((bpf, Some(socket), BpfLogLevel::Off))
                    }
                    Err(e) => Err(e),
                }
            }
            RouteWatchBackend::Fentry | RouteWatchBackend::Kprobe => {
                let parsed = btf::Btf::from_sys().map_err(|source| RouteWatchError::Btf { backend, source })?;
                let offsets = btf::resolve_offsets(&parsed).map_err(|source| RouteWatchError::Btf { backend, source })?;
                let mut bpf = Self::load(object, config, backend, &offsets, config.log_level)?;
                if backend == RouteWatchBackend::Fentry {
                    let kbtf = aya::Btf::from_sys_fs().map_err(|e| RouteWatchError::Btf {
                        backend,
                        source: btf::BtfError::Read { path: btf::VMLINUX_BTF.into(), source: std::io::Error::other(e.to_string()) },
                    })?;
                    for (name, func) in PROGS_FENTRY.into_iter().zip(HOOKED_FUNCTIONS) {
                        let prog: &mut FEntry = bpf
                            .program_mut(name)
                            .ok_or(RouteWatchError::Missing(name))?
                            .try_into()
                            .map_err(|e| prog_err("type", name, e))?;
                        prog.load(func, &kbtf).map_err(|e| prog_err("load", name, e))?;
                        prog.attach().map_err(|e| prog_err("attach", name, e))?;
                    }
                } else {
                    for (name, func) in PROGS_KPROBE.into_iter().zip(HOOKED_FUNCTIONS) {
                        let prog: &mut KProbe = bpf
                            .program_mut(name)
                            .ok_or(RouteWatchError::Missing(name))?
                            .try_into()
                            .map_err(|e| prog_err("type", name, e))?;
                        prog.load().map_err(|e| prog_err("load", name, e))?;
                        prog.attach(func, 0).map_err(|e| prog_err("attach", name, e))?;
                    }
                }
                Ok((bpf, None, config.log_level))
            }
        }
    }

    /// The kernel-side log level in effect: the configured one, or [`BpfLogLevel::Off`] when
    /// the socket-filter program with logging was too large for this kernel's
    /// `net.core.optmem_max` and was attached without it (a warning says so at start).
    #[must_use]
    pub fn log_level(&self) -> BpfLogLevel {
        self.log_level
    }

    /// Tell the kernel which netlink ports are the self process's (socket-filter backend:
    /// writes are identified by the sender's port): its `NETLINK_ROUTE` sockets in the calling
    /// thread's network namespace, from `/proc/thread-self/net/netlink` and
    /// `/proc/<pid>/fd`. Ports no longer open are removed. Call it after the process opened a
    /// socket it writes routes with (the agent does every second); returns how many ports are
    /// registered. The fentry and kprobe backends identify the process by tgid and need none.
    ///
    /// # Errors
    /// [`RouteWatchError::Map`] when the map cannot be updated; unreadable `/proc` entries
    /// count as no ports.
    pub fn refresh_self_ports(&mut self) -> Result<usize, RouteWatchError> {
        let table = std::fs::read_to_string("/proc/thread-self/net/netlink").unwrap_or_default();
        let inodes: HashSet<u64> = std::fs::read_dir(format!("/proc/{}/fd", self.self_pid))
            .into_iter()
            .flatten()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter_map(|l| writer::socket_inode(l.as_os_str()))
            .collect();
        let mut want: Vec<u32> = writer::parse_proc_net_netlink(&table).into_iter().filter(|(_, i)| inodes.contains(i)).map(|(p, _)| p).collect();
        want.sort_unstable();
        want.truncate(SELF_PORTS_MAX as usize);
        let map_err = |e| RouteWatchError::Map { map: ROUTE_WATCH_SELF_PORTS_MAP, source: Box::new(e) };
        let map = self.bpf.map_mut(ROUTE_WATCH_SELF_PORTS_MAP).ok_or(RouteWatchError::Missing(ROUTE_WATCH_SELF_PORTS_MAP))?;
        let mut ports: aya::maps::HashMap<&mut MapData, u32, u8> = aya::maps::HashMap::try_from(map).map_err(map_err)?;
        let stale: Vec<u32> = ports.keys().filter_map(Result::ok).filter(|p| want.binary_search(p).is_err()).collect();
        for p in stale {
            let _ = ports.remove(&p);
        }
        for p in &want {
            ports.insert(p, 1, 0).map_err(map_err)?;
        }
        Ok(want.len())
    }

    /// The backend that is running.
    pub fn backend(&self) -> RouteWatchBackend {
        self.backend
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
    pub fn counters(&self) -> Result<RouteWatchCounters, RouteWatchError> {
        let map_err = |e| RouteWatchError::Map { map: ROUTE_WATCH_COUNTERS_MAP, source: Box::new(e) };
        let map = self.bpf.map(ROUTE_WATCH_COUNTERS_MAP).ok_or(RouteWatchError::Missing(ROUTE_WATCH_COUNTERS_MAP))?;
        let array: PerCpuArray<&MapData, RouteWatchCounters> = PerCpuArray::try_from(map).map_err(map_err)?;
        let values = array.get(&0, 0).map_err(map_err)?;
        Ok(values.iter().fold(RouteWatchCounters::default(), |acc, v| sum_counters(&acc, v)))
    }

    /// Start the ring-buffer reader on the current tokio runtime: decodes each record and
    /// hands the events to the writer-attribution thread ([`writer::spawn_attribution`]),
    /// which resolves netlink port ids to processes (best effort, in the network namespace of
    /// the calling thread) and sends the events, in order, to `tx`. An event whose writer is
    /// not cached waits at most [`writer::ROUND_INTERVAL`] (200 ms) plus one `/proc` round.
    /// Undecodable records are logged and skipped. Once `tx` is closed, the thread ends at its
    /// next event and the task after it; aborting the task ends the thread once it has sent
    /// what it held.
    ///
    /// # Errors
    /// [`RouteWatchError::ReaderTaken`] on a second call; map/socket/thread errors otherwise.
    pub fn spawn_reader(&mut self, tx: mpsc::Sender<RouteWatchEvent>) -> Result<tokio::task::JoinHandle<()>, RouteWatchError> {
        let map = self.bpf.take_map(ROUTE_WATCH_EVENTS_MAP).ok_or(RouteWatchError::ReaderTaken)?;
        let ring = RingBuf::try_from(map).map_err(|e| RouteWatchError::Map { map: ROUTE_WATCH_EVENTS_MAP, source: Box::new(e) })?;
        // SAFETY: the RingBuf owns its map fd for its whole life and always returns that fd;
        // the AsyncFd owns the RingBuf.
        let fd = unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
            .map_err(|e| RouteWatchError::Socket { op: "poll ring buffer", source: e.into() })?;
        let (batch_tx, batch_rx) = mpsc::channel(ATTRIBUTION_BATCHES);
        writer::spawn_attribution(batch_rx, tx, Arc::clone(&self.attribution)).map_err(RouteWatchError::Thread)?;
        Ok(tokio::spawn(read_ring(fd, batch_tx)))
    }

    /// What the writer-attribution thread did so far: rounds, `/proc` walks, ports resolved
    /// and not (all zero before [`RouteWatch::spawn_reader`]).
    pub fn attribution_stats(&self) -> writer::AttributionStats {
        *self.attribution.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

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
    let mut out = *a;
    for (f, fb) in out.writes.iter_mut().zip(b.writes.iter()) {
        for (o, ob) in f.iter_mut().zip(fb.iter()) {
            for (c, cb) in o.iter_mut().zip(ob.iter()) {
                *c += cb;
            }
        }
    }
    for (f, fb) in out.conflicts.iter_mut().zip(b.conflicts.iter()) {
        for (o, ob) in f.iter_mut().zip(fb.iter()) {
            for (c, cb) in o.iter_mut().zip(ob.iter()) {
                *c += cb;
            }
        }
    }
    for i in 0..out.flaps.len() {
        out.flaps[i] += b.flaps[i];
        out.flushes[i] += b.flushes[i];
    }
    out.records_lost += b.records_lost;
    out.decode_errors += b.decode_errors;
    out.other_netns += b.other_netns;
    out
}

/// A NETLINK_ROUTE socket in the calling thread's namespace, joined to
/// `RTMGRP_LINK | RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_ROUTE`. Non-blocking; nothing reads it (the
/// filter returns 0, so no message is ever queued).
fn route_socket() -> Result<OwnedFd, RouteWatchError> {
    use nix::sys::socket::{bind, socket, AddressFamily, NetlinkAddr, SockFlag, SockProtocol, SockType};
    const RTMGRP_LINK: u32 = 0x1;
    const RTMGRP_IPV4_ROUTE: u32 = 0x40;
    const RTMGRP_IPV6_ROUTE: u32 = 0x400;
    let sock = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        SockProtocol::NetlinkRoute,
    )
    .map_err(|e| RouteWatchError::Socket { op: "socket(AF_NETLINK, NETLINK_ROUTE)", source: e.into() })?;
    bind(std::os::fd::AsRawFd::as_raw_fd(&sock), &NetlinkAddr::new(0, RTMGRP_LINK | RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_ROUTE))
        .map_err(|e| RouteWatchError::Socket { op: "bind to route groups", source: e.into() })?;
    Ok(sock)
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
    fn empty_object_is_a_clear_error() {
        assert!(matches!(RouteWatch::start(&[], &RouteWatchConfig::default()), Err(RouteWatchError::NoObject)));
    }
}
