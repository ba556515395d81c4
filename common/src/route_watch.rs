//! Types of the route-churn watch, shared by the kernel-side hooks
//! (`ebpf/src/route_watch_*.rs`), the in-kernel detector (`ebpf/src/route_detector.rs`) and the
//! agent (`agent/src/bpf/route_watch.rs`).
//!
//! Data flow: a hook (socket filter on a NETLINK_ROUTE socket, fentry or kprobe on
//! `fib_table_insert`/`fib_table_delete`/`fib6_add`/`fib6_del`) turns one kernel route change
//! into a [`RouteWrite`]; the detector keeps one [`PrefixState`] per [`PrefixKey`] in an LRU map,
//! counts every write in [`RouteWatchCounters`] (per CPU) and pushes a [`RouteWatchRecord`] to a
//! ring buffer only when a prefix crosses into conflict or flap (at most once per prefix per
//! window), on a link going down, and for every write when write streaming is on.

mod names;
mod offsets;

pub use names::*;
pub use offsets::{KernelOffsets, TaskOffsets};

/// `AF_INET`.
pub const AF_INET: u8 = 2;
/// `AF_INET6`.
pub const AF_INET6: u8 = 10;

/// Number of address families counted (index 0 IPv4, 1 IPv6).
pub const FAMILIES: usize = 2;
/// Number of write operations counted (see [`WriteOp`]).
pub const OPS: usize = 3;
/// Number of policy rule operations counted: add (index 0) and delete (1); rules have no
/// replace (`fib_nl_newrule` ignores `NLM_F_REPLACE`).
pub const RULE_OPS: usize = 2;
/// Number of writer classes counted (see [`WriterClass`]).
pub const WRITER_CLASSES: usize = 7;

/// Index of a family in the counter arrays: 0 for IPv4, 1 for IPv6.
#[inline(always)]
pub const fn family_index(family: u8) -> usize {
    if family == AF_INET6 {
        1
    } else {
        0
    }
}

/// What a write did to the route table.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteOp {
    /// A route was created (`NLM_F_CREATE` without an existing route).
    Add = 0,
    /// An existing route was overwritten (`NLM_F_REPLACE` set in the notification / request).
    Replace = 1,
    /// A route was deleted.
    Delete = 2,
}

impl WriteOp {
    /// Decode the `op` byte of a [`RouteWrite`]; unknown values are `None`.
    pub const fn from_u8(v: u8) -> Option<WriteOp> {
        match v {
            0 => Some(WriteOp::Add),
            1 => Some(WriteOp::Replace),
            2 => Some(WriteOp::Delete),
            _ => None,
        }
    }

    /// `add`, `replace`, `delete` (metric label value).
    pub const fn label(self) -> &'static str {
        match self {
            WriteOp::Add => "add",
            WriteOp::Replace => "replace",
            WriteOp::Delete => "delete",
        }
    }
}

/// Who wrote a route, as a class from a fixed set (usable as a metric label). Decided from the
/// *process* that wrote ([`WriterClass::of_writer`]): the agent's own process is `self`,
/// Felix's `felix`, BIRD's `bird`, any other process `other`. Only when the process is not
/// known (a netlink port the kernel side could not name) is it inferred from the route
/// protocol ([`WriterClass::classify`]), and the write says so ([`ORIGIN_CLASS_INFERRED`]);
/// a change the kernel made on its own (no sending socket) is `kernel`.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WriterClass {
    /// routewarden itself: a write by the agent's process (global `SELF_TGID`, or one of its
    /// netlink ports), whatever the route's protocol.
    SelfAgent = 0,
    /// Calico Felix: a process named `calico-node` (Felix runs inside it); inferred: protocol 80.
    Felix = 1,
    /// BIRD: a process named `bird` or `bird6`; inferred: protocol 12 (`RTPROT_BIRD`).
    Bird = 2,
    /// A change the kernel made on its own (no sending socket: a flush, a link's connected
    /// route); inferred: protocol 2 (`RTPROT_KERNEL`).
    Kernel = 3,
    /// Inferred only: `RTPROT_BOOT` (3), `ip route` without `proto`.
    Boot = 4,
    /// Inferred only: `RTPROT_STATIC` (4).
    Static = 5,
    /// Any other known process (an operator's `ip`, a script); inferred: any other protocol.
    Other = 6,
}

impl WriterClass {
    /// All classes, in index order.
    pub const ALL: [WriterClass; WRITER_CLASSES] =
        [WriterClass::SelfAgent, WriterClass::Felix, WriterClass::Bird, WriterClass::Kernel, WriterClass::Boot, WriterClass::Static, WriterClass::Other];

    /// Class *inferred* from a route `protocol`, for a writer whose process is not known,
    /// given the agent's own protocol (0: none configured, or not to be inferred as `self`).
    #[inline(always)]
    pub const fn classify(protocol: u8, self_protocol: u8) -> WriterClass {
        if self_protocol != 0 && protocol == self_protocol {
            return WriterClass::SelfAgent;
        }
        match protocol {
            80 => WriterClass::Felix,
            12 => WriterClass::Bird,
            2 => WriterClass::Kernel,
            3 => WriterClass::Boot,
            4 => WriterClass::Static,
            _ => WriterClass::Other,
        }
    }

    /// Class of a known process by its command name (`task->comm`, NUL padded, at most 15
    /// bytes and a NUL): `calico-node` is Felix (calico/node's image runs Felix, confd and
    /// BIRD's supervisor under that name), `bird` and `bird6` are BIRD (BIRD 1.x runs one
    /// daemon per family, `bird6` for IPv6; BIRD 2 is `bird`), anything else `other`. The
    /// agent's own process is decided before this, by its tgid ([`WriterClass::of_writer`]).
    #[inline(always)]
    pub const fn of_comm(comm: &[u8; 16]) -> WriterClass {
        if comm_is(comm, b"calico-node") {
            WriterClass::Felix
        } else if comm_is(comm, b"bird") || comm_is(comm, b"bird6") {
            WriterClass::Bird
        } else {
            WriterClass::Other
        }
    }

    /// The class of the writer `w` and whether it was inferred from the route protocol (the
    /// rule every backend applies, in the kernel, before counting):
    /// 1. `is_self` (the writer is the agent's process: its tgid, or one of its netlink ports)
    ///    → `self`;
    /// 2. a known process (`id_kind` [`WriterIdKind::Process`]) → [`WriterClass::of_comm`];
    /// 3. no sender (port 0: the kernel made the change) → `kernel`;
    /// 4. a sender known by its netlink port only → [`WriterClass::classify`] of the protocol,
    ///    inferred (`true`).
    #[inline(always)]
    pub const fn of_writer(w: &WriteOrigin, is_self: bool) -> (WriterClass, bool) {
        if is_self {
            (WriterClass::SelfAgent, false)
        } else if w.id_kind == WriterIdKind::Process as u8 {
            (WriterClass::of_comm(&w.comm), false)
        } else if w.id == 0 {
            (WriterClass::Kernel, false)
        } else {
            (WriterClass::classify(w.protocol, 0), true)
        }
    }

    /// Decode a class byte; out-of-range values are [`WriterClass::Other`].
    pub const fn from_u8(v: u8) -> WriterClass {
        match v {
            0 => WriterClass::SelfAgent,
            1 => WriterClass::Felix,
            2 => WriterClass::Bird,
            3 => WriterClass::Kernel,
            4 => WriterClass::Boot,
            5 => WriterClass::Static,
            _ => WriterClass::Other,
        }
    }

    /// `self`, `felix`, `bird`, `kernel`, `boot`, `static`, `other` (metric label value).
    pub const fn label(self) -> &'static str {
        match self {
            WriterClass::SelfAgent => "self",
            WriterClass::Felix => "felix",
            WriterClass::Bird => "bird",
            WriterClass::Kernel => "kernel",
            WriterClass::Boot => "boot",
            WriterClass::Static => "static",
            WriterClass::Other => "other",
        }
    }
}

/// True when the NUL-padded `comm` is exactly `name` (a name of at most 15 bytes).
#[inline(always)]
const fn comm_is(comm: &[u8; 16], name: &[u8]) -> bool {
    if name.len() >= comm.len() || comm[name.len()] != 0 {
        return false;
    }
    let mut i = 0;
    while i < name.len() {
        if comm[i] != name[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// [`WriteOrigin::flags`]: the class was inferred from the route protocol, because the
/// writing process was not known (a netlink port the socket filter could not name).
pub const ORIGIN_CLASS_INFERRED: u8 = 1;

/// How [`WriteOrigin::id`] identifies the writer.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriterIdKind {
    /// `id` is the netlink port id of the sending socket (socket filter that cannot read the
    /// current task: helpers refused, no task offsets); 0 means the kernel made the change
    /// itself (every backend).
    NetlinkPort = 0,
    /// `id` is the thread-group id (PID) of the task that sent the request and `comm` its
    /// command name (fentry/kprobe; socket filter when it reads the current task).
    Process = 1,
}

/// Who made a write. 24 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteOrigin {
    /// Netlink port id or PID, see `id_kind`.
    pub id: u32,
    /// [`WriterIdKind`] as a byte.
    pub id_kind: u8,
    /// Route protocol (`rtm_protocol`): of the written route for add/replace, of the deleted
    /// route for a delete (netlink notifications carry the deleted route's attributes).
    pub protocol: u8,
    /// [`WriterClass`] as a byte.
    pub class: u8,
    /// `ORIGIN_*` bits ([`ORIGIN_CLASS_INFERRED`]).
    pub flags: u8,
    /// Command name (`task->comm`, NUL padded) when the backend knows it, else zeros.
    pub comm: [u8; 16],
}

/// One route change as seen by a hook, the detector's input. 88 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteWrite {
    /// Kernel time of the write (`bpf_ktime_get_ns`, CLOCK_MONOTONIC, nanoseconds).
    pub ts_ns: u64,
    /// Full routing table id (RTA_TABLE, or `rtm_table` when absent).
    pub table: u32,
    /// Route metric (RTA_PRIORITY, 0 when absent).
    pub metric: u32,
    /// Output interface index (RTA_OIF, 0 when absent or multipath).
    pub oif: u32,
    /// [`AF_INET`] or [`AF_INET6`].
    pub family: u8,
    /// [`WriteOp`] as a byte.
    pub op: u8,
    /// Destination prefix length.
    pub dst_len: u8,
    /// Padding, zero.
    pub _pad: u8,
    /// Destination address, network order; IPv4 in the first 4 bytes, rest zero.
    pub dst: [u8; 16],
    /// Gateway address (RTA_GATEWAY), network order; zeros when absent.
    pub gateway: [u8; 16],
    /// Id of the nexthop object the route goes through (RTA_NH_ID; `fib_config.fc_nh_id`,
    /// `fib6_info.nh->id`), 0 for a route with a next hop of its own. Two writes of a route
    /// through different objects differ in this alone on the fentry/kprobe backends, which do
    /// not follow the object to its gateway and device.
    pub nh_id: u32,
    /// Padding, zero.
    pub _pad2: u32,
    /// Who wrote.
    pub writer: WriteOrigin,
}

/// The last nexthop object change the socket filter saw (`RTM_NEWNEXTHOP`), kept in
/// [`ROUTE_WATCH_NL_NEXTHOP_MAP`]. When a nexthop replace re-points routes, the kernel sends
/// every route through the object again (`nexthop_replace_notify` in `net/ipv4/nexthop.c`,
/// while `net.ipv4.nexthop_compat_mode` is 1, its default), after the object's own
/// notification and with the same port and sequence number. Those are not route writes (the
/// fentry/kprobe hooks see none): the socket filter drops an `RTM_NEWROUTE` with
/// `NLM_F_REPLACE` whose port, sequence number and `RTA_NH_ID` equal the last change's. 16 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NexthopNotice {
    /// Netlink port id of the request that changed the object (0: the kernel).
    pub port: u32,
    /// Its sequence number.
    pub seq: u32,
    /// The object's id (`NHA_ID`).
    pub id: u32,
    /// 1 once a notification was seen.
    pub valid: u32,
}

/// Failure history of one prefix (LRU map [`ROUTE_WATCH_FAILURES_MAP`], apart from the
/// detector's [`PrefixState`]: a refused write changes no route, so it must not touch the
/// detector's idea of the route). 32 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FailureState {
    /// Start of the current run of failures (ns, CLOCK_MONOTONIC).
    pub window_start_ns: u64,
    /// Time of the last [`RecordKind::Failing`] record sent for this prefix (ns, 0 never).
    pub last_event_ns: u64,
    /// Failures in the current run: same writer, operation and errno, within the window.
    pub failures: u32,
    /// The run's writer ([`WriteOrigin::id`]).
    pub writer_id: u32,
    /// The run's positive errno.
    pub errno: u16,
    /// The run's [`WriteOp`].
    pub op: u8,
    /// The run's [`WriteOrigin::id_kind`].
    pub id_kind: u8,
    /// Padding, zero.
    pub _pad: u32,
}

/// Detector map key: one per (family, table, destination prefix). 24 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PrefixKey {
    /// Full table id.
    pub table: u32,
    /// Address family.
    pub family: u8,
    /// Prefix length.
    pub dst_len: u8,
    /// Padding, zero.
    pub _pad: [u8; 2],
    /// Destination, network order, host bits as written.
    pub dst: [u8; 16],
}

/// [`PrefixState::flags`]: the prefix is in conflict in the current window.
pub const STATE_CONFLICT: u8 = 1;
/// [`PrefixState::flags`]: the prefix is flapping in the current window.
pub const STATE_FLAP: u8 = 2;
/// [`PrefixState::flags`]: the last change removed the route.
pub const STATE_REMOVED: u8 = 4;
/// [`PrefixState::flags`]: the last removal was a flush (kernel-made), not a writer's delete.
pub const STATE_FLUSHED: u8 = 8;

/// Detector state for one prefix (LRU map value). 80 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixState {
    /// Time of the last write (ns, CLOCK_MONOTONIC).
    pub last_ts_ns: u64,
    /// Start of the current counting window (ns).
    pub window_start_ns: u64,
    /// Time of the last conflict event sent for this prefix (ns, 0 never).
    pub last_conflict_event_ns: u64,
    /// Time of the last flap event sent for this prefix (ns, 0 never).
    pub last_flap_event_ns: u64,
    /// Changes in the current window (delete-then-add, replace changing attributes or writer).
    pub changes: u32,
    /// Writes in the current window.
    pub writes: u32,
    /// Hash of the route attributes of the last add/replace: protocol, metric, and the
    /// nexthop object's id for a route through one, its own oif and gateway otherwise.
    pub attrs: u32,
    /// Metric of the last add/replace.
    pub metric: u32,
    /// Output interface of the last add/replace.
    pub oif: u32,
    /// Last [`WriteOp`].
    pub last_op: u8,
    /// `STATE_*` bits.
    pub flags: u8,
    /// Padding, zero.
    pub _pad: [u8; 2],
    /// The last writer.
    pub last_writer: WriteOrigin,
}

/// What a [`RouteWatchRecord`] reports.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    /// One route write (only when the `STREAM_WRITES` global is set: `routewarden events`).
    Write = 0,
    /// The prefix crossed into conflict: `write.writer` overwrote or deleted `previous`'s route.
    Conflict = 1,
    /// The prefix crossed into flap: `changes` reached the threshold within the window.
    Flap = 2,
    /// A route disappeared without a writer (kernel flush, e.g. its link went down); `write`
    /// describes the route that was removed or the re-add that revealed the removal.
    Flush = 3,
    /// A link went administratively down (`write.oif` is its ifindex); IPv4 flushes the
    /// link's routes without any route notification.
    LinkDown = 4,
    /// A policy rule was added or deleted (`RTM_NEWRULE`/`RTM_DELRULE`): `write.family`,
    /// `write.op` ([`WriteOp::Add`] or [`WriteOp::Delete`]), `write.table` (the rule's full
    /// table id, `FRA_TABLE`), `write.metric` (its priority, `FRA_PRIORITY`), `write.writer`
    /// (its protocol is the rule's `FRA_PROTOCOL`); `dst` and `gateway` zeros. Every rule
    /// write is reported (rules change rarely).
    Rule = 5,
    /// One route write the kernel refused (only when the `STREAM_WRITES` global is set):
    /// `write` as requested, `errno` the positive error the hooked function returned. fentry
    /// and kprobe backends only: a socket filter sees the kernel's notifications, which exist
    /// only for writes that succeeded.
    WriteFailed = 6,
    /// A writer's writes to one prefix keep failing: the same process (or netlink port), the
    /// same operation and the same `errno` at least `ROUTE_WATCH_FAILING_THRESHOLD` times
    /// within the window (`changes` holds the count). At most one per prefix per window.
    /// fentry and kprobe backends only.
    Failing = 7,
}

impl RecordKind {
    /// Decode the kind byte; unknown values are `None`.
    pub const fn from_u8(v: u8) -> Option<RecordKind> {
        match v {
            0 => Some(RecordKind::Write),
            1 => Some(RecordKind::Conflict),
            2 => Some(RecordKind::Flap),
            3 => Some(RecordKind::Flush),
            4 => Some(RecordKind::LinkDown),
            5 => Some(RecordKind::Rule),
            6 => Some(RecordKind::WriteFailed),
            7 => Some(RecordKind::Failing),
            _ => None,
        }
    }
}

/// One ring-buffer record. 120 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteWatchRecord {
    /// [`RecordKind`] as a byte.
    pub kind: u8,
    /// Padding, zero.
    pub _pad: u8,
    /// [`RecordKind::WriteFailed`], [`RecordKind::Failing`]: the positive `errno` the kernel
    /// returned to the writer (`EEXIST` 17, `ESRCH` 3, ...); else 0.
    pub errno: u16,
    /// Changes of the prefix in the current window (flap) / writes in it (conflict).
    pub changes: u32,
    /// The write that triggered the record.
    pub write: RouteWrite,
    /// The previous writer of the prefix (conflict), else zeros.
    pub previous: WriteOrigin,
}

/// Per-CPU counters (index 0 of `ROUTE_WATCH_COUNTERS`); userspace sums over CPUs.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteWatchCounters {
    /// Writes by `[family_index][WriteOp][WriterClass]`.
    pub writes: [[[u64; WRITER_CLASSES]; OPS]; FAMILIES],
    /// Conflict episodes by `[family_index][class of the writer][class of the previous writer]`.
    pub conflicts: [[[u64; WRITER_CLASSES]; WRITER_CLASSES]; FAMILIES],
    /// Flap episodes by family.
    pub flaps: [u64; FAMILIES],
    /// Routes removed by the kernel without a writer (flushes), by family.
    pub flushes: [u64; FAMILIES],
    /// Records that did not fit in the ring buffer (`bpf_ringbuf_output` failed).
    pub records_lost: u64,
    /// Notifications / arguments that could not be decoded.
    pub decode_errors: u64,
    /// Writes outside the watched network namespace (fentry/kprobe), ignored.
    pub other_netns: u64,
    /// Writes by a sender whose process the kernel side did not know (socket filter without
    /// the current task), by family: their class was inferred from the protocol
    /// ([`ORIGIN_CLASS_INFERRED`]). Kernel-made changes are not counted here.
    pub unattributed: [u64; FAMILIES],
    /// Policy rule writes by `[family_index][add 0, delete 1][WriterClass]` (socket filter).
    pub rule_writes: [[[u64; WRITER_CLASSES]; RULE_OPS]; FAMILIES],
    /// Route writes the kernel refused, by `[family_index][WriteOp][WriterClass]` (fentry and
    /// kprobe: the hooked function's return value; never counted in `writes`).
    pub write_failures: [[[u64; WRITER_CLASSES]; OPS]; FAMILIES],
    /// Failing-writer episodes ([`RecordKind::Failing`]) by `[family_index][WriterClass]`.
    pub failing: [[u64; WRITER_CLASSES]; FAMILIES],
}

impl Default for RouteWatchCounters {
    fn default() -> Self {
        RouteWatchCounters {
            writes: [[[0; WRITER_CLASSES]; OPS]; FAMILIES],
            conflicts: [[[0; WRITER_CLASSES]; WRITER_CLASSES]; FAMILIES],
            flaps: [0; FAMILIES],
            flushes: [0; FAMILIES],
            records_lost: 0,
            decode_errors: 0,
            other_netns: 0,
            unattributed: [0; FAMILIES],
            rule_writes: [[[0; WRITER_CLASSES]; RULE_OPS]; FAMILIES],
            write_failures: [[[0; WRITER_CLASSES]; OPS]; FAMILIES],
            failing: [[0; WRITER_CLASSES]; FAMILIES],
        }
    }
}

#[cfg(feature = "user")]
mod pod {
    // `aya::Pod` asks that every bit pattern of the type's size be a valid value, since a map
    // read fills it from kernel bytes. Each type here is `#[repr(C)]` and `Copy`, made only of
    // integers and byte arrays, with its padding spelled out as fields.
    // SAFETY: `RouteWatchCounters` is `#[repr(C)]` integers and byte arrays with explicit padding.
    unsafe impl aya::Pod for super::RouteWatchCounters {}
    // SAFETY: `PrefixKey` is `#[repr(C)]` integers and byte arrays with explicit padding.
    unsafe impl aya::Pod for super::PrefixKey {}
    // SAFETY: `PrefixState` is `#[repr(C)]` integers and byte arrays with explicit padding.
    unsafe impl aya::Pod for super::PrefixState {}
    // SAFETY: `FailureState` is `#[repr(C)]` integers with explicit padding.
    unsafe impl aya::Pod for super::FailureState {}
    // SAFETY: `PendingCall` is `#[repr(C)]` integers.
    unsafe impl aya::Pod for super::PendingCall {}
    // SAFETY: `KernelOffsets` is `#[repr(C)]` integers and byte arrays with explicit padding.
    unsafe impl aya::Pod for super::KernelOffsets {}
    // SAFETY: `TaskOffsets` is `#[repr(C)]` integers and byte arrays with explicit padding.
    unsafe impl aya::Pod for super::TaskOffsets {}
}

// The kernel writes these bytes and userspace reads them: pin the layouts.
const _: () = assert!(core::mem::size_of::<WriteOrigin>() == 24);
const _: () = assert!(core::mem::size_of::<RouteWrite>() == 88);
const _: () = assert!(core::mem::size_of::<PrefixKey>() == 24);
const _: () = assert!(core::mem::size_of::<NexthopNotice>() == 16);
const _: () = assert!(core::mem::size_of::<PrefixState>() == 80);
const _: () = assert!(core::mem::size_of::<FailureState>() == 32);
const _: () = assert!(core::mem::size_of::<PendingCall>() == 16);
const _: () = assert!(core::mem::size_of::<RouteWatchRecord>() == 120);
const _: () = assert!(core::mem::size_of::<TaskOffsets>() == 16);

#[cfg(test)]
mod tests;
