//! The route watch's settings ([`RouteWatchConfig`], [`RouteWatchBackend`]) and the network
//! namespace it watches: what the one BPF load ([`crate::bpf::loader`]) takes its globals from,
//! apart from the watch that runs on them.

use std::str::FromStr;
use std::time::Duration;

use crate::bpf::bpf_log::BpfLogLevel;

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
    pub const PREFERENCE: [RouteWatchBackend; 3] = [RouteWatchBackend::Fentry, RouteWatchBackend::Kprobe, RouteWatchBackend::SocketFilter];

    /// `fentry`, `kprobe`, `socket-filter` (flag value and metric label).
    pub fn label(self) -> &'static str {
        match self {
            RouteWatchBackend::Fentry => "fentry",
            RouteWatchBackend::Kprobe => "kprobe",
            RouteWatchBackend::SocketFilter => "socket-filter",
        }
    }
}

impl RouteWatchBackend {
    /// Whether the backend sees the outcome of a route write, so refused writes (failing
    /// writers) are seen: fentry (fexit) and kprobe (kretprobe) read the hooked function's
    /// return value; a socket filter sees the kernel's notifications, which exist only for
    /// writes that succeeded.
    pub fn sees_outcomes(self) -> bool {
        self != RouteWatchBackend::SocketFilter
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

/// Settings of the watch.
#[derive(Clone, Debug)]
pub struct RouteWatchConfig {
    /// Force one backend (no fallback); `None`: the best that loads.
    pub backend: Option<RouteWatchBackend>,
    /// Conflict / flap window (default 30 s).
    pub window: Duration,
    /// Changes within the window that make a flap (default 3).
    pub flap_threshold: u32,
    /// Refused writes of one prefix by one writer (same operation and errno) within the
    /// window that make a failing writer (default 3; at least 2).
    pub failing_threshold: u32,
    /// The agent's own route protocol (0: none). The class `self` is the process's
    /// ([`RouteWatchConfig::self_pid`]), not the protocol's.
    pub self_protocol: u8,
    /// Emit a record per write (for `routewarden events`; default off).
    pub stream_writes: bool,
    /// Ring-buffer size in bytes (power of two, multiple of the page size); `None`: 256 KiB.
    pub ring_buffer_bytes: Option<u32>,
    /// Kernel-side log level (`--bpf-log-level`, default off; [`crate::bpf::bpf_log`]).
    pub log_level: BpfLogLevel,
    /// The process whose writes are `self` (`None`: this process), whatever their protocol.
    pub self_pid: Option<u32>,
    /// Socket filter: name senders by the task that sent the request (`Senders::Task`,
    /// default `true`); `false` names them by netlink port only (`Senders::Port`).
    pub task_senders: bool,
}

impl Default for RouteWatchConfig {
    fn default() -> Self {
        RouteWatchConfig {
            backend: None,
            window: Duration::from_secs(30),
            flap_threshold: 3,
            failing_threshold: 3,
            self_protocol: 0,
            stream_writes: false,
            ring_buffer_bytes: None,
            log_level: BpfLogLevel::Off,
            self_pid: None,
            task_senders: true,
        }
    }
}

/// Inode of the calling thread's network namespace (what `ns.inum` holds in the kernel).
pub fn current_netns_inode() -> Result<u32, std::io::Error> {
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata("/proc/thread-self/ns/net")?.ino();
    u32::try_from(ino).map_err(|_| std::io::Error::other("netns inode does not fit 32 bits"))
}
