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
}

impl RouteWatchEvent {
    /// The route change, if the event has one.
    pub fn route(&self) -> Option<&RouteChange> {
        match self {
            RouteWatchEvent::Write { route }
            | RouteWatchEvent::Conflict { route, .. }
            | RouteWatchEvent::Flap { route, .. }
            | RouteWatchEvent::Flush { route } => Some(route),
            RouteWatchEvent::LinkDown { .. } => None,
        }
    }

    /// Mutable access to every writer in the event (for `/proc` resolution).
    pub fn writers_mut(&mut self) -> Vec<&mut WriterInfo> {
        match self {
            RouteWatchEvent::Write { route } | RouteWatchEvent::Flush { route } => vec![&mut route.writer],
            RouteWatchEvent::Conflict { route, previous, .. } | RouteWatchEvent::Flap { route, previous, .. } => {
                vec![&mut route.writer, previous]
            }
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
        RecordKind::Write => RouteWatchEvent::Write { route: decode_write(&rec.write)? },
        RecordKind::Flush => RouteWatchEvent::Flush { route: decode_write(&rec.write)? },
        RecordKind::Conflict => {
            RouteWatchEvent::Conflict { route: decode_write(&rec.write)?, previous: WriterInfo::from_raw(&rec.previous), writes_in_window: rec.changes }
        }
        RecordKind::Flap => {
            RouteWatchEvent::Flap { route: decode_write(&rec.write)?, previous: WriterInfo::from_raw(&rec.previous), changes_in_window: rec.changes }
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
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use routewarden_common::route_watch::{RecordKind, RouteWatchRecord, RouteWrite};

    fn writer(id: u32, kind: WriterIdKind, protocol: u8, class: WriterClass, comm: &[u8]) -> WriteOrigin {
        let mut c = [0u8; 16];
        c[..comm.len()].copy_from_slice(comm);
        WriteOrigin { id, id_kind: kind as u8, protocol, class: class as u8, flags: 0, comm: c }
    }

    fn record(kind: RecordKind, family: u8, dst: &[u8], dst_len: u8) -> RouteWatchRecord {
        let mut d = [0u8; 16];
        d[..dst.len()].copy_from_slice(dst);
        let mut gw = [0u8; 16];
        gw[..4].copy_from_slice(&[10, 0, 0, 12]);
        RouteWatchRecord {
            kind: kind as u8,
            _pad: [0; 3],
            changes: 4,
            write: RouteWrite {
                ts_ns: 42,
                table: 254,
                metric: 1024,
                oif: 3,
                family,
                op: WriteOp::Replace as u8,
                dst_len,
                _pad: 0,
                dst: d,
                gateway: if family == AF_INET { gw } else { [0; 16] },
                nh_id: 0,
                _pad2: 0,
                writer: writer(1234, WriterIdKind::NetlinkPort, 12, WriterClass::Bird, b""),
            },
            previous: writer(77, WriterIdKind::Process, 80, WriterClass::SelfAgent, b"routewarden"),
        }
    }

    fn bytes(r: &RouteWatchRecord) -> Vec<u8> {
        // SAFETY: plain repr(C) data without padding holes that matter for the test.
        unsafe { std::slice::from_raw_parts(std::ptr::from_ref(r).cast::<u8>(), std::mem::size_of_val(r)) }.to_vec()
    }

    #[test]
    fn decodes_ipv4_conflict_with_both_writers() {
        let ev = decode_record(&bytes(&record(RecordKind::Conflict, AF_INET, &[10, 244, 20, 0], 26))).unwrap();
        let RouteWatchEvent::Conflict { route, previous, writes_in_window } = ev else { panic!("{ev:?}") };
        assert_eq!(route.dst, "10.244.20.0/26".parse::<IpNet>().unwrap());
        assert_eq!(route.gateway, Some("10.0.0.12".parse().unwrap()));
        assert_eq!((route.op, route.table, route.metric, route.family), ("replace", 254, 1024, "ipv4"));
        assert_eq!(route.writer.netlink_port, Some(1234));
        assert_eq!(route.writer.class, "bird");
        assert_eq!(previous.pid, Some(77));
        assert_eq!(previous.comm.as_deref(), Some("routewarden"));
        assert_eq!(previous.class, "self");
        assert_eq!(writes_in_window, 4);
    }

    #[test]
    fn decodes_ipv6_flap_and_link_down() {
        let dst = "fd00:10:244::".parse::<Ipv6Addr>().unwrap().octets();
        let ev = decode_record(&bytes(&record(RecordKind::Flap, AF_INET6, &dst, 122))).unwrap();
        let RouteWatchEvent::Flap { route, changes_in_window, .. } = &ev else { panic!("{ev:?}") };
        assert_eq!(route.dst.to_string(), "fd00:10:244::/122");
        assert_eq!(route.gateway, None);
        assert_eq!(*changes_in_window, 4);
        let ev = decode_record(&bytes(&record(RecordKind::LinkDown, 0, &[], 0))).unwrap();
        assert_eq!(ev, RouteWatchEvent::LinkDown { at_ns: 42, ifindex: 3 });
    }

    #[test]
    fn rejects_bad_records() {
        let good = record(RecordKind::Conflict, AF_INET, &[10, 0, 0, 0], 8);
        assert!(matches!(decode_record(&bytes(&good)[..50]), Err(DecodeError::Size { got: 50, .. })));
        let mut r = good;
        r.kind = 99;
        assert_eq!(decode_record(&bytes(&r)), Err(DecodeError::Kind(99)));
        let mut r = good;
        r.write.dst_len = 33;
        assert_eq!(decode_record(&bytes(&r)), Err(DecodeError::PrefixLen { family: AF_INET, len: 33 }));
        let mut r = good;
        r.write.family = 7;
        assert_eq!(decode_record(&bytes(&r)), Err(DecodeError::Family(7)));
        let mut r = good;
        r.write.op = 9;
        assert_eq!(decode_record(&bytes(&r)), Err(DecodeError::Op(9)));
    }

    #[test]
    fn kernel_removal_and_json_shape() {
        let mut r = record(RecordKind::Flush, AF_INET, &[10, 0, 0, 0], 8);
        r.write.writer.id = 0;
        let ev = decode_record(&bytes(&r)).unwrap();
        assert!(ev.route().unwrap().writer.kernel);
        let json = serde_json::to_value(&ev).unwrap();
        assert_eq!(json["event"], "flush");
        assert_eq!(json["route"]["dst"], "10.0.0.0/8");
        assert!(json["route"]["writer"].get("netlink_port").is_none());
        assert!(ev.to_string().starts_with("flush    replace 10.0.0.0/8 table 254 metric 1024 via 10.0.0.12"));
        assert!(json["route"].get("nexthop_id").is_none(), "{json}");
    }

    /// A writer known by its port only: class inferred from the protocol, said so in the text
    /// and the JSON; once user space names the process, the class is the process's.
    #[test]
    fn an_unattributed_writer_says_its_class_was_inferred_until_named() {
        let mut r = record(RecordKind::Write, AF_INET, &[10, 244, 20, 0], 26);
        r.write.writer = writer(30625, WriterIdKind::NetlinkPort, 80, WriterClass::Felix, b"");
        r.write.writer.flags = ORIGIN_CLASS_INFERRED;
        let ev = decode_record(&bytes(&r)).unwrap();
        let w = &ev.route().unwrap().writer;
        assert_eq!((w.class, w.class_inferred, w.netlink_port, w.pid), ("felix", true, Some(30625), None));
        assert!(ev.to_string().ends_with("by felix(proto 80, port 30625, unattributed: class inferred from protocol 80)"), "{ev}");
        let json = serde_json::to_value(&ev).unwrap();
        assert_eq!((json["route"]["writer"]["class"].as_str(), json["route"]["writer"]["class_inferred"].as_bool()), (Some("felix"), Some(true)), "{json}");
        let mut named = w.clone();
        named.attribute(4711, "ip".to_owned());
        assert_eq!((named.class, named.class_inferred, named.pid, named.comm.as_deref()), ("other", false, Some(4711), Some("ip")));
        assert_eq!(named.to_string(), "other(proto 80, ip[4711], port 30625)");
        let mut bird = w.clone();
        bird.attribute(4712, "bird".to_owned());
        assert_eq!(bird.class, "bird");
        // A class the kernel decided from the process stays.
        let mut known = WriterInfo::from_raw(&writer(77, WriterIdKind::Process, 80, WriterClass::Other, b"ip"));
        known.attribute(77, "calico-node".to_owned());
        assert_eq!((known.class, known.class_inferred), ("other", false));
        assert_eq!(serde_json::to_value(&known).unwrap()["class_inferred"], false);
    }

    /// A route through a nexthop object: its id in the event, the text and the JSON; the
    /// object's gateway when the backend saw it (socket filter), none when it did not.
    #[test]
    fn decodes_the_nexthop_object_id() {
        let mut r = record(RecordKind::Write, AF_INET, &[10, 244, 20, 0], 26);
        r.write.nh_id = 7001;
        let ev = decode_record(&bytes(&r)).unwrap();
        let route = ev.route().unwrap();
        assert_eq!((route.nexthop_id, route.gateway), (Some(7001), Some("10.0.0.12".parse().unwrap())));
        assert!(ev.to_string().starts_with("write    replace 10.244.20.0/26 table 254 metric 1024 nhid 7001 via 10.0.0.12 oif 3 by"), "{ev}");
        assert_eq!(serde_json::to_value(&ev).unwrap()["route"]["nexthop_id"], 7001);
        let dst = "fd00:10:244:20::".parse::<Ipv6Addr>().unwrap().octets();
        let mut r = record(RecordKind::Write, AF_INET6, &dst, 122);
        (r.write.nh_id, r.write.oif) = (u32::MAX, 0);
        let ev = decode_record(&bytes(&r)).unwrap();
        let route = ev.route().unwrap();
        assert_eq!((route.nexthop_id, route.gateway, route.oif), (Some(u32::MAX), None, 0));
        assert!(ev.to_string().starts_with("write    replace fd00:10:244:20::/122 table 254 metric 1024 nhid 4294967295 by"), "{ev}");
    }
}
