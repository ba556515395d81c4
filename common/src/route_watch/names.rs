//! Names the loader and the kernel side share (maps, globals, programs, hooked functions),
//! and the kprobe backend's [`PendingCall`].

/// Ring buffer of [`RouteWatchRecord`](super::RouteWatchRecord)s.
pub const ROUTE_WATCH_EVENTS_MAP: &str = "ROUTE_WATCH_EVENTS";
/// Per-CPU array holding one [`RouteWatchCounters`](super::RouteWatchCounters) at index 0.
pub const ROUTE_WATCH_COUNTERS_MAP: &str = "ROUTE_WATCH_COUNTERS";
/// LRU hash map [`PrefixKey`](super::PrefixKey) -> [`PrefixState`](super::PrefixState).
pub const ROUTE_WATCH_STATE_MAP: &str = "ROUTE_WATCH_STATE";

/// LRU hash map [`PrefixKey`](super::PrefixKey) -> [`FailureState`](super::FailureState) (fentry and kprobe backends).
pub const ROUTE_WATCH_FAILURES_MAP: &str = "ROUTE_WATCH_FAILURES";
/// kprobe backend: hash map of the thread (`bpf_get_current_pid_tgid`) -> the hooked call's
/// pointer arguments [`PendingCall`], from the kprobe to its kretprobe.
pub const ROUTE_WATCH_PENDING_MAP: &str = "ROUTE_WATCH_PENDING";
/// Global: refused writes of one prefix by one writer, same operation and errno, within the
/// window that make a failing writer (u32, default 3).
pub const GLOBAL_FAILING_THRESHOLD: &str = "ROUTE_WATCH_FAILING_THRESHOLD";

/// A hooked call's pointer arguments, kept by the kprobe for its kretprobe (which sees only
/// the return value): `a` and `b` are the arguments [`RouteWrite`](super::RouteWrite) is decoded from
/// (`net`/`cfg` for IPv4, `rt`/`info` for IPv6). 16 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PendingCall {
    /// First decoded argument.
    pub a: u64,
    /// Second decoded argument.
    pub b: u64,
}

/// Global: conflict/flap window in nanoseconds (u64, default 30 s).
pub const GLOBAL_WINDOW_NS: &str = "ROUTE_WATCH_WINDOW_NS";
/// Global: changes within the window that make a flap (u32, default 3).
pub const GLOBAL_FLAP_THRESHOLD: &str = "ROUTE_WATCH_FLAP_THRESHOLD";
/// Global: the agent's own route protocol (u8 in a u32, 0 = none). Not part of the class (the
/// process decides `self`, [`GLOBAL_SELF_TGID`]); set so that the object keeps one shape.
pub const GLOBAL_SELF_PROTOCOL: &str = "ROUTE_WATCH_SELF_PROTOCOL";
/// Global: the process whose writes are `self` (its tgid, u32; 0 = none), whatever their
/// protocol: its tgid (fentry, kprobe, socket filter reading the task) or one of its netlink
/// ports ([`ROUTE_WATCH_SELF_PORTS_MAP`], socket filter naming writers by port).
pub const GLOBAL_SELF_TGID: &str = "ROUTE_WATCH_SELF_TGID";
/// Map: netlink port ids of the self process's `NETLINK_ROUTE` sockets (key port, value 1),
/// kept by userspace from `/proc/<pid>/fd` and `/proc/<pid>/net/netlink`.
pub const ROUTE_WATCH_SELF_PORTS_MAP: &str = "ROUTE_WATCH_SELF_PORTS";
/// Name of the socket filter's per-CPU scratch [`RouteWrite`](super::RouteWrite) (kernel-only; listed in
/// [`crate::MAP_NAMES`]).
pub const ROUTE_WATCH_NL_SCRATCH_MAP: &str = "ROUTE_WATCH_NL_SCRATCH";
/// Name of the socket filter's one-entry array holding the last [`NexthopNotice`](super::NexthopNotice)
/// (kernel-only; listed in [`crate::MAP_NAMES`]).
pub const ROUTE_WATCH_NL_NEXTHOP_MAP: &str = "ROUTE_WATCH_NL_NEXTHOP";
/// Most self netlink ports tracked.
pub const SELF_PORTS_MAX: u32 = 64;
/// Global: 1 to push a [`RecordKind::Write`](super::RecordKind::Write) record for every write (u32, default 0).
pub const GLOBAL_STREAM_WRITES: &str = "ROUTE_WATCH_STREAM_WRITES";
/// Global: network namespace inode the fentry/kprobe hooks watch (u32, 0 = all).
pub const GLOBAL_NETNS_INUM: &str = "ROUTE_WATCH_NETNS_INUM";
/// Global: [`KernelOffsets`](super::KernelOffsets).
pub const GLOBAL_OFFSETS: &str = "ROUTE_WATCH_OFFSETS";
/// Global: [`TaskOffsets`](super::TaskOffsets).
pub const GLOBAL_TASK_OFFSETS: &str = "ROUTE_WATCH_TASK_OFFSETS";

/// Socket-filter program on a NETLINK_ROUTE socket that names each sender by the task that
/// sent the request (needs `bpf_get_current_task` and `bpf_probe_read_kernel` in a socket
/// filter: a loader with `CAP_PERFMON`, and a kernel not in lockdown's confidentiality mode,
/// which withholds `bpf_probe_read_kernel`).
pub const PROG_SOCKET_FILTER: &str = "route_watch_netlink";
/// The same socket filter naming senders by netlink port only (no helper beyond the base
/// set): the fallback when [`PROG_SOCKET_FILTER`] does not load.
pub const PROG_SOCKET_FILTER_PORT: &str = "route_watch_netlink_port";
/// The fentry backend's programs: fexit (BPF trampoline at the function's return, with its
/// arguments and return value) on `fib_table_insert`, `fib_table_delete`, `fib6_add`,
/// `fib6_del`.
pub const PROGS_FENTRY: [&str; 4] =
    ["route_watch_fexit_fib_table_insert", "route_watch_fexit_fib_table_delete", "route_watch_fexit_fib6_add", "route_watch_fexit_fib6_del"];
/// kprobe programs (they keep the arguments), same functions and order as [`PROGS_FENTRY`].
pub const PROGS_KPROBE: [&str; 4] =
    ["route_watch_kprobe_fib_table_insert", "route_watch_kprobe_fib_table_delete", "route_watch_kprobe_fib6_add", "route_watch_kprobe_fib6_del"];
/// kretprobe programs (they decode the kept arguments with the return value), same order.
pub const PROGS_KRETPROBE: [&str; 4] =
    ["route_watch_kretprobe_fib_table_insert", "route_watch_kretprobe_fib_table_delete", "route_watch_kretprobe_fib6_add", "route_watch_kretprobe_fib6_del"];
/// Kernel functions hooked by fentry/kprobe, same order as [`PROGS_FENTRY`].
pub const HOOKED_FUNCTIONS: [&str; 4] = ["fib_table_insert", "fib_table_delete", "fib6_add", "fib6_del"];
