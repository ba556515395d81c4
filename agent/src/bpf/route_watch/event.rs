//! Typed route-watch events decoded from the ring buffer's [`RouteWatchRecord`]s.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use routewarden_common::route_watch::{
    RecordKind, RouteWatchRecord, RouteWrite, WriteOp, WriteOrigin, WriterClass, WriterIdKind, AF_INET, AF_INET6, ORIGIN_CLASS_INFERRED,
};
use serde::Serialize;

/// A record that cannot be decoded (wrong size, unknown kind, impossible prefix).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    /// The record is not `size_of::<RouteWatchRecord>()` bytes.
    #[error("record of {got} bytes, expected {expected}")]
    Size { got: usize, expected: usize },
    /// Unknown record kind byte.
    #[error("unknown record kind {0}")]
    Kind(u8),
    /// Unknown operation byte.
    #[error("unknown write operation {0}")]
    Op(u8),
    /// Unknown address family.
    #[error("unknown address family {0}")]
    Family(u8),
    /// Prefix length larger than the family allows.
    #[error("prefix length {len} too long for family {family}")]
    PrefixLen { family: u8, len: u8 },
}

/// Who wrote a route, as far as the backend and `/proc` tell.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WriterInfo {
    /// Route protocol (of the written route; of the deleted route for a delete).
    pub protocol: u8,
    /// Writer class from the fixed set (`self`, `felix`, `bird`, `kernel`, `boot`, `static`,
    /// `other`), decided from the process (`WriterClass::of_writer`).
    pub class: &'static str,
    /// True when the process was not known and `class` was inferred from `protocol` (the
    /// writer is unattributed: a netlink port whose process was gone before it was resolved,
    /// on the socket filter naming senders by port).
    pub class_inferred: bool,
    /// True when the kernel made the change itself (no sending socket): a flush.
    pub kernel: bool,
    /// Netlink port id of the sending socket (socket-filter backend).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub netlink_port: Option<u32>,
    /// Process id: from the hook (fentry/kprobe) or resolved from the port id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Command name: from the hook or resolved through `/proc`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comm: Option<String>,
}

impl WriterInfo {
    fn from_raw(w: &WriteOrigin) -> WriterInfo {
        let class = WriterClass::from_u8(w.class);
        let process = w.id_kind == WriterIdKind::Process as u8;
        let comm_len = w.comm.iter().position(|&c| c == 0).unwrap_or(w.comm.len());
        let comm = String::from_utf8_lossy(&w.comm[..comm_len]).into_owned();
        WriterInfo {
            protocol: w.protocol,
            class: class.label(),
            class_inferred: w.flags & ORIGIN_CLASS_INFERRED != 0,
            kernel: !process && w.id == 0,
            netlink_port: (!process && w.id != 0).then_some(w.id),
            pid: process.then_some(w.id),
            comm: (process && !comm.is_empty()).then_some(comm),
        }
    }

    /// The writer class.
    pub fn writer_class(&self) -> WriterClass {
        WriterClass::ALL.into_iter().find(|c| c.label() == self.class).unwrap_or(WriterClass::Other)
    }

    /// Name the process behind this writer's netlink port (user-space resolution, socket
    /// filter naming senders by port). A class that was inferred from the protocol is decided
    /// again from the process, by the kernel's rule (`WriterClass::of_comm`; the agent's own
    /// ports are known to the kernel, so an inferred class is never the agent's).
    pub fn attribute(&mut self, pid: u32, comm: String) {
        if self.class_inferred {
            let mut name = [0u8; 16];
            let len = comm.len().min(15);
            name[..len].copy_from_slice(&comm.as_bytes()[..len]);
            self.class = WriterClass::of_comm(&name).label();
            self.class_inferred = false;
        }
        self.pid = Some(pid);
        self.comm = Some(comm);
    }

    /// Same writer identity (process or port, and protocol)?
    pub fn same_identity(&self, other: &WriterInfo) -> bool {
        self.protocol == other.protocol && self.netlink_port == other.netlink_port && self.pid == other.pid
    }
}

impl fmt::Display for WriterInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}(proto {}", self.class, self.protocol)?;
        if self.kernel {
            write!(f, ", kernel")?;
        }
        match (&self.comm, self.pid) {
            (Some(c), Some(p)) => write!(f, ", {c}[{p}]")?,
            (None, Some(p)) => write!(f, ", pid {p}")?,
            _ => {}
        }
        if let Some(port) = self.netlink_port {
            write!(f, ", port {port}")?;
        }
        if self.class_inferred {
            write!(f, ", unattributed: class inferred from protocol {}", self.protocol)?;
        }
        write!(f, ")")
    }
}

/// One route change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RouteChange {
    /// Kernel time of the write, ns since boot (CLOCK_MONOTONIC).
    pub at_ns: u64,
    /// `ipv4` or `ipv6`.
    pub family: &'static str,
    /// `add`, `replace` (overwrote a route) or `delete`.
    pub op: &'static str,
    /// Full routing table id.
    pub table: u32,
    /// Destination prefix.
    pub dst: IpNet,
    /// Route metric.
    pub metric: u32,
    /// Output interface index (0 unknown).
    pub oif: u32,
    /// Gateway, when the route has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    /// Id of the nexthop object the route goes through (`nhid` in `ip route`), when it goes
    /// through one. The fentry/kprobe backends report it without the object's gateway and
    /// device; the socket filter reports both (the kernel's notification carries them while
    /// `net.ipv4.nexthop_compat_mode` is 1, its default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nexthop_id: Option<u32>,
    /// Who wrote.
    pub writer: WriterInfo,
}

/// One policy rule change (`ip rule add`/`del`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RuleChange {
    /// Kernel time of the write, ns since boot (CLOCK_MONOTONIC).
    pub at_ns: u64,
    /// `ipv4` or `ipv6`.
    pub family: &'static str,
    /// `add` or `delete` (rules have no replace).
    pub op: &'static str,
    /// The table the rule looks up (full id, `FRA_TABLE`; 0 for a rule without a lookup).
    pub table: u32,
    /// The rule's priority (`FRA_PRIORITY`).
    pub priority: u32,
    /// Who wrote; `protocol` is the rule's (`FRA_PROTOCOL`).
    pub writer: WriterInfo,
}

impl fmt::Display for RuleChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} rule priority {} lookup {} by {}", self.op, self.family, self.priority, self.table, self.writer)
    }
}

/// An event of the route watch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub enum RouteWatchEvent {
    /// One write (only when write streaming is on: `routewarden events`).
    Write {
        /// The write.
        route: RouteChange,
    },
    /// Two writers overwrote or deleted each other's route for this prefix within the window.
    Conflict {
        /// The write that overwrote/deleted.
        route: RouteChange,
        /// The writer whose route was overwritten/deleted.
        previous: WriterInfo,
        /// Writes of the prefix in the current window.
        writes_in_window: u32,
    },
    /// The prefix changed `changes_in_window` >= threshold times within the window.
    Flap {
        /// The write that crossed the threshold.
        route: RouteChange,
        /// The writer before it.
        previous: WriterInfo,
        /// Changes in the current window.
        changes_in_window: u32,
    },
    /// A route vanished without a writer (kernel flush); only when write streaming is on.
    Flush {
        /// The removed route, or the re-add that revealed an unseen removal.
        route: RouteChange,
    },
    /// A link went administratively down; IPv4 flushes its routes without notifications.
    LinkDown {
        /// Kernel time, ns since boot.
        at_ns: u64,
        /// Interface index.
        ifindex: u32,
    },
    /// A policy rule was added or deleted (every one, on every backend).
    RuleChange {
        /// The change.
        rule: RuleChange,
    },
    /// A route write the kernel refused; only when write streaming is on, and only on the
    /// fentry and kprobe backends (a socket filter sees notifications, which exist only for
    /// writes that succeeded).
    WriteFailed {
        /// The write as requested.
        route: RouteChange,
        /// The error the kernel returned.
        #[serde(flatten)]
        error: WriteError,
    },
    /// A writer keeps failing: its writes of one operation to this prefix were refused with
    /// the same error `failures_in_window` (>= threshold) times within the window (Calico#10585:
    /// BIRD looping on "File exists"). fentry and kprobe backends only.
    FailingWriter {
        /// The refused write that reached the threshold.
        route: RouteChange,
        /// The error each of them got.
        #[serde(flatten)]
        error: WriteError,
        /// Refused writes in the current run.
        failures_in_window: u32,
    },
}

/// The error the kernel returned for a refused route write.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WriteError {
    /// The positive errno (`17`).
    pub errno: u16,
    /// Its symbolic name and message (`EEXIST (File exists)`), `errno <n>` when unknown.
    pub error: String,
}

impl WriteError {
    /// The error for the positive `errno`.
    pub fn new(errno: u16) -> WriteError {
        let e = nix::errno::Errno::from_raw(i32::from(errno));
        let error = if e == nix::errno::Errno::UnknownErrno { format!("errno {errno}") } else { format!("{e:?} ({})", e.desc()) };
        WriteError { errno, error }
    }
}

impl fmt::Display for WriteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.error)
    }
}

impl RouteWatchEvent {
    /// The route change, if the event has one.
    pub fn route(&self) -> Option<&RouteChange> {
        match self {
            RouteWatchEvent::Write { route }
            | RouteWatchEvent::Conflict { route, .. }
            | RouteWatchEvent::Flap { route, .. }
            | RouteWatchEvent::Flush { route }
            | RouteWatchEvent::WriteFailed { route, .. }
            | RouteWatchEvent::FailingWriter { route, .. } => Some(route),
            RouteWatchEvent::LinkDown { .. } | RouteWatchEvent::RuleChange { .. } => None,
        }
    }

    /// The route and the writer before it of an episode (conflict, flap, failing writer: its
    /// own writer stands as the one before it), which [`super::EpisodeScope::judges`] decides
    /// on; `None` for any other event.
    pub fn episode(&self) -> Option<(&RouteChange, &WriterInfo)> {
        match self {
            RouteWatchEvent::Conflict { route, previous, .. } | RouteWatchEvent::Flap { route, previous, .. } => Some((route, previous)),
            RouteWatchEvent::FailingWriter { route, .. } => Some((route, &route.writer)),
            _ => None,
        }
    }

    /// Mutable access to every writer in the event (for `/proc` resolution).
    pub fn writers_mut(&mut self) -> Vec<&mut WriterInfo> {
        match self {
            RouteWatchEvent::Write { route }
            | RouteWatchEvent::Flush { route }
            | RouteWatchEvent::WriteFailed { route, .. }
            | RouteWatchEvent::FailingWriter { route, .. } => vec![&mut route.writer],
            RouteWatchEvent::Conflict { route, previous, .. } | RouteWatchEvent::Flap { route, previous, .. } => {
                vec![&mut route.writer, previous]
            }
            RouteWatchEvent::RuleChange { rule } => vec![&mut rule.writer],
            RouteWatchEvent::LinkDown { .. } => Vec::new(),
        }
    }
}

fn decode_write(w: &RouteWrite) -> Result<RouteChange, DecodeError> {
    let op = WriteOp::from_u8(w.op).ok_or(DecodeError::Op(w.op))?;
    let (family, addr, gw): (&'static str, IpAddr, IpAddr) = match w.family {
        AF_INET => {
            let a = Ipv4Addr::new(w.dst[0], w.dst[1], w.dst[2], w.dst[3]);
            let g = Ipv4Addr::new(w.gateway[0], w.gateway[1], w.gateway[2], w.gateway[3]);
            ("ipv4", a.into(), g.into())
        }
        AF_INET6 => ("ipv6", Ipv6Addr::from(w.dst).into(), Ipv6Addr::from(w.gateway).into()),
        other => return Err(DecodeError::Family(other)),
    };
    let dst = IpNet::new(addr, w.dst_len).map_err(|_| DecodeError::PrefixLen { family: w.family, len: w.dst_len })?;
    Ok(RouteChange {
        at_ns: w.ts_ns,
        family,
        op: op.label(),
        table: w.table,
        dst,
        metric: w.metric,
        oif: w.oif,
        gateway: (!gw.is_unspecified()).then_some(gw),
        nexthop_id: (w.nh_id != 0).then_some(w.nh_id),
        writer: WriterInfo::from_raw(&w.writer),
    })
}

/// A [`RecordKind::Rule`] record's write: family, op, table, priority (in `metric`), writer.
fn decode_rule(w: &RouteWrite) -> Result<RuleChange, DecodeError> {
    let Some(op @ (WriteOp::Add | WriteOp::Delete)) = WriteOp::from_u8(w.op) else {
        return Err(DecodeError::Op(w.op));
    };
    let family = match w.family {
        AF_INET => "ipv4",
        AF_INET6 => "ipv6",
        other => return Err(DecodeError::Family(other)),
    };
    Ok(RuleChange { at_ns: w.ts_ns, family, op: op.label(), table: w.table, priority: w.metric, writer: WriterInfo::from_raw(&w.writer) })
}

/// Decode one ring-buffer record.
pub fn decode_record(bytes: &[u8]) -> Result<RouteWatchEvent, DecodeError> {
    let expected = std::mem::size_of::<RouteWatchRecord>();
    if bytes.len() != expected {
        return Err(DecodeError::Size { got: bytes.len(), expected });
    }
    // SAFETY: the length is checked; RouteWatchRecord is repr(C) plain data (every bit pattern
    // valid) and read_unaligned tolerates any alignment of the ring-buffer slice.
    let rec: RouteWatchRecord = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
    let kind = RecordKind::from_u8(rec.kind).ok_or(DecodeError::Kind(rec.kind))?;
    Ok(match kind {
        RecordKind::LinkDown => RouteWatchEvent::LinkDown { at_ns: rec.write.ts_ns, ifindex: rec.write.oif },
        RecordKind::Rule => RouteWatchEvent::RuleChange { rule: decode_rule(&rec.write)? },
        RecordKind::Write => RouteWatchEvent::Write { route: decode_write(&rec.write)? },
        RecordKind::Flush => RouteWatchEvent::Flush { route: decode_write(&rec.write)? },
        RecordKind::Conflict => {
            RouteWatchEvent::Conflict { route: decode_write(&rec.write)?, previous: WriterInfo::from_raw(&rec.previous), writes_in_window: rec.changes }
        }
        RecordKind::Flap => {
            RouteWatchEvent::Flap { route: decode_write(&rec.write)?, previous: WriterInfo::from_raw(&rec.previous), changes_in_window: rec.changes }
        }
        RecordKind::WriteFailed => RouteWatchEvent::WriteFailed { route: decode_write(&rec.write)?, error: WriteError::new(rec.errno) },
        RecordKind::Failing => {
            RouteWatchEvent::FailingWriter { route: decode_write(&rec.write)?, error: WriteError::new(rec.errno), failures_in_window: rec.changes }
        }
    })
}

impl fmt::Display for RouteChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} table {} metric {}", self.op, self.dst, self.table, self.metric)?;
        if let Some(id) = self.nexthop_id {
            write!(f, " nhid {id}")?;
        }
        if let Some(gw) = self.gateway {
            write!(f, " via {gw}")?;
        }
        if self.oif != 0 {
            write!(f, " oif {}", self.oif)?;
        }
        write!(f, " by {}", self.writer)
    }
}

impl fmt::Display for RouteWatchEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RouteWatchEvent::Write { route } => write!(f, "write    {route}"),
            RouteWatchEvent::Flush { route } => write!(f, "flush    {route}"),
            RouteWatchEvent::Conflict { route, previous, writes_in_window } => {
                write!(f, "CONFLICT {route} over {previous} ({writes_in_window} writes in window)")
            }
            RouteWatchEvent::Flap { route, previous, changes_in_window } => {
                write!(f, "FLAP     {route} after {previous} ({changes_in_window} changes in window)")
            }
            RouteWatchEvent::LinkDown { ifindex, .. } => write!(f, "linkdown ifindex {ifindex} (IPv4 routes via it flushed)"),
            RouteWatchEvent::RuleChange { rule } => write!(f, "rule     {rule}"),
            RouteWatchEvent::WriteFailed { route, error } => write!(f, "refused  {route}: {error}"),
            RouteWatchEvent::FailingWriter { route, error, failures_in_window } => {
                write!(f, "FAILING  {route}: {error} ({failures_in_window} refused in window)")
            }
        }
    }
}

#[cfg(test)]
mod tests;
