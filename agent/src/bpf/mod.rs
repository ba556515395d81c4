//! The kernel side of the agent: the embedded BPF object and the programs loaded from it.
//!
//! The object is built from `ebpf/` by `cargo xtask build` and embedded at compile time (see
//! `agent/build.rs`). A plain `cargo build` embeds nothing; the agent then runs without its
//! BPF watchers and says so ([`embedded_object`] returns `None`).
//!
//! One load per process ([`loader::BpfObject`]): every watch takes its programs and maps from
//! it, so each map exists once. Every watch has one shape ([`watch::Watch`], run by
//! [`watch::WatchHandler`]) and one error type ([`BpfError`]).

pub mod bpf_log;
pub mod forward;
pub mod loader;
pub mod route_watch;
pub mod tc_count;
pub mod watch;

/// The BPF object embedded at build time (ELF, `bpfel`, with BTF).
static OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/routewarden-ebpf.o"));

/// The embedded BPF object, or `None` when the agent was built without one (plain
/// `cargo build` instead of `cargo xtask build`).
pub fn embedded_object() -> Option<&'static [u8]> {
    if OBJECT.is_empty() {
        None
    } else {
        Some(OBJECT)
    }
}

/// Why a BPF watch (or one operation of it) failed: the one error type of `bpf/`, for the
/// load, the route watch, the forwarding watch and `tc_count`. Each variant carries the
/// context a reader needs (`program`, `iface`, `mode`, `map`, `op`, `source`). Shown in
/// `/readyz` (`bpf <watch>: degraded: <message>`) and logs; the agent keeps programming routes
/// either way.
#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    /// The binary was built without the kernel-side object.
    #[error("no BPF object is embedded in this build (build with `cargo xtask build`)")]
    NoObject,
    /// The object failed to load: creating its maps (`failed to create map` when `bpf()` is
    /// refused), parsing, BTF relocation.
    #[error("loading BPF object: {source}")]
    Load {
        /// What aya reported.
        #[source]
        source: Box<aya::EbpfError>,
    },
    /// A program has the wrong type (`op` `type`), or loading it (`load`: the verifier, EPERM
    /// for fentry on kernels that refuse it) or attaching it (`attach`) failed. The message
    /// carries the whole cause chain, down to the kernel's errno.
    #[error("{op} {program}: {}", crate::text::causes_once(source.as_ref()))]
    Program {
        /// The program's name in the object.
        program: &'static str,
        /// `type`, `load`, `attach` or `info`.
        op: &'static str,
        /// What aya reported.
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    /// Attaching a TC classifier to a device failed.
    #[error("attach {program} to {iface} {hook} ({mode}): {source}")]
    Attach {
        /// The program's name in the object.
        program: &'static str,
        /// The device.
        iface: String,
        /// `egress` or `ingress`.
        hook: &'static str,
        /// `tcx` (kernel >= 6.6) or `clsact` (netlink filter).
        mode: &'static str,
        /// What aya reported.
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    /// A map has the wrong type or an operation on it failed.
    #[error("map {map}: {op}: {source}")]
    Map {
        /// The map's name in the object.
        map: &'static str,
        /// `open`, `read`, `update`.
        op: &'static str,
        /// What aya reported.
        #[source]
        source: Box<aya::maps::MapError>,
    },
    /// A program or map is missing from the object.
    #[error("{0} not found in the BPF object")]
    Missing(&'static str),
    /// A map was already handed to another watch of this process (each map exists once).
    #[error("map {0} is already held by another watch of this process")]
    Taken(&'static str),
    /// None of the configured devices exists.
    #[error("none of the watched devices exists: {0:?}")]
    NoDevice(Vec<String>),
    /// The kernel refuses a kind of program outright, found by a probe load before the real
    /// one: `what` names the kind, `source` is the errno (EPERM/EACCES). The fentry backend on
    /// kernels that withhold tracing programs.
    #[error("{what}: this kernel refuses them (a probe load returned {source})")]
    Refused {
        /// The kind of program.
        what: &'static str,
        /// The probe's errno.
        #[source]
        source: std::io::Error,
    },
    /// Kernel BTF is missing or does not match the hooks (route watch, fentry/kprobe only).
    #[error("kernel BTF: {0}")]
    Btf(String),
    /// Creating, binding or watching a socket failed (the route watch's NETLINK_ROUTE socket).
    #[error("netlink socket: {op}: {source}")]
    Socket {
        /// What was being done.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Registering a ring buffer with the runtime failed.
    #[error("poll ring buffer: {0}")]
    Poll(#[source] std::io::Error),
    /// The ring-buffer reader was already started.
    #[error("the ring-buffer reader is already running")]
    ReaderTaken,
    /// A thread could not be started (the route watch's writer attribution).
    #[error("starting the writer-attribution thread: {0}")]
    Thread(#[source] std::io::Error),
    /// One route-watch backend failed: `<backend>: <why>`.
    #[error("{backend}: {source}")]
    Backend {
        /// The backend that was tried.
        backend: route_watch::RouteWatchBackend,
        /// Why it failed.
        #[source]
        source: Box<BpfError>,
    },
    /// The process's one load failed: every watch reports that error as its own.
    #[error(transparent)]
    Object(std::sync::Arc<BpfError>),
    /// Every route-watch backend tried failed; each attempt's reason, best backend first.
    #[error("route watch degraded, no backend works: {}", attempts.iter().map(|(_, e)| e.as_str()).collect::<Vec<_>>().join("; "))]
    NoBackend {
        /// Each backend tried and why it failed.
        attempts: Vec<(route_watch::RouteWatchBackend, String)>,
    },
}

impl BpfError {
    /// A [`BpfError::Program`] builder: `program_err("load", name)(e)`.
    pub(crate) fn program(op: &'static str, program: &'static str) -> impl Fn(aya::programs::ProgramError) -> BpfError {
        move |e| BpfError::Program { program, op, source: Box::new(e) }
    }

    /// A [`BpfError::Map`] builder: `map_err(name, "read")(e)`.
    pub(crate) fn map(map: &'static str, op: &'static str) -> impl Fn(aya::maps::MapError) -> BpfError {
        move |e| BpfError::Map { map, op, source: Box::new(e) }
    }

    /// Whether the cause chain ends in ENOMEM (a socket filter over the socket's option
    /// memory).
    pub(crate) fn is_out_of_memory(&self) -> bool {
        let mut next: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(cause) = next {
            if cause.downcast_ref::<std::io::Error>().and_then(std::io::Error::raw_os_error) == Some(nix::errno::Errno::ENOMEM as i32) {
                return true;
            }
            next = cause.source();
        }
        false
    }
}
