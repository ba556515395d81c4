//! Typed forwarding-watch events decoded from the ring buffer's [`ForwardRecord`]s.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use routewarden_common::forward::{ForwardPath, ForwardRecord, ForwardRecordKind, Observation};
use serde::Serialize;

use super::entries::{addr_from_trie, prefix_from_trie};

/// A record that cannot be decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    /// The record is not `size_of::<ForwardRecord>()` bytes.
    #[error("record of {got} bytes, expected {expected}")]
    Size { got: usize, expected: usize },
    /// Unknown kind byte.
    #[error("unknown record kind {0}")]
    Kind(u8),
    /// A path or observation byte out of range.
    #[error("unknown {field} byte {value}")]
    Enum { field: &'static str, value: u8 },
    /// Prefix length over 128 in trie form.
    #[error("prefix length {0} out of range")]
    PrefixLen(u32),
}

/// What happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ForwardEventKind {
    /// A packet to `block` left on `actual` instead of `expected` (a rate-limited sample:
    /// at most one per block per sample interval; the counters have every packet).
    WrongPath,
    /// `block`'s egress path changed `changes` times within the window: a forwarding flap.
    Flap,
}

/// One wrong-path sample or forwarding flap.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ForwardEvent {
    /// `wrong-path` or `flap`.
    pub event: ForwardEventKind,
    /// The destination block (IPAM block or borrowed IP) the packet matched.
    pub block: IpNet,
    /// The packet's destination (inner destination of an IPIP packet on the NIC).
    pub dst: IpAddr,
    /// IP pool name; `None` if the pool id is unknown to this agent (never expected).
    pub pool: Option<String>,
    /// Expected path (`tunnel`, `host`, `local`).
    pub expected: &'static str,
    /// Path the packet took.
    pub actual: &'static str,
    /// Path before this change (flaps).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous: Option<&'static str>,
    /// Path changes within the window (flaps).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changes: Option<u32>,
    /// Where the packet was seen: `tunnel-device`, `host-ipip`, `host-native`.
    pub seen_as: &'static str,
    /// Output device index, and its name if it still exists.
    pub ifindex: u32,
    /// Output device name, if resolvable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Kernel time of the packet, ns since boot (CLOCK_MONOTONIC).
    pub kernel_time_ns: u64,
    /// Pool id in the kernel maps (for debugging with bpftool).
    pub pool_id: u16,
}

impl fmt::Display for ForwardEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pool = self.pool.as_deref().unwrap_or("?");
        let dev = self.device.as_deref().map_or_else(|| format!("ifindex {}", self.ifindex), str::to_string);
        match self.event {
            ForwardEventKind::WrongPath => {
                write!(f, "wrong-path {} (pool {pool}) dst {} left via {} on {dev}, expected {}", self.block, self.dst, self.actual, self.expected)
            }
            ForwardEventKind::Flap => write!(
                f,
                "forwarding-flap {} (pool {pool}) {} -> {} on {dev}, {} path changes in the window (expected {})",
                self.block,
                self.previous.unwrap_or("?"),
                self.actual,
                self.changes.unwrap_or(0),
                self.expected
            ),
        }
    }
}

fn path(field: &'static str, v: u8) -> Result<&'static str, DecodeError> {
    ForwardPath::from_u8(v).map(ForwardPath::label).ok_or(DecodeError::Enum { field, value: v })
}

/// Name of the device with index `ifindex` in the calling thread's namespace, if it exists.
fn device_name(ifindex: u32) -> Option<String> {
    if ifindex == 0 {
        return None;
    }
    nix::net::if_::if_indextoname(ifindex).ok().and_then(|c| c.into_string().ok()).filter(|n| !n.is_empty())
}

/// Decode one ring-buffer record. `pool_name` maps a pool id to its name.
pub fn decode_record(bytes: &[u8], pool_name: impl Fn(u16) -> Option<String>) -> Result<ForwardEvent, DecodeError> {
    let expected_len = std::mem::size_of::<ForwardRecord>();
    if bytes.len() != expected_len {
        return Err(DecodeError::Size { got: bytes.len(), expected: expected_len });
    }
    // SAFETY: length checked; `ForwardRecord` is plain integers and byte arrays (any bit pattern
    // valid); `read_unaligned` because the ring buffer only guarantees 8-byte alignment.
    let r: ForwardRecord = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
    let kind = ForwardRecordKind::from_u8(r.kind).ok_or(DecodeError::Kind(r.kind))?;
    let seen = Observation::from_u8(r.observation).ok_or(DecodeError::Enum { field: "observation", value: r.observation })?;
    let block = prefix_from_trie(r.prefix_len, r.block).ok_or(DecodeError::PrefixLen(r.prefix_len))?;
    let flap = kind == ForwardRecordKind::Flap;
    Ok(ForwardEvent {
        event: if flap { ForwardEventKind::Flap } else { ForwardEventKind::WrongPath },
        block,
        dst: addr_from_trie(r.dst),
        pool: pool_name(r.pool),
        expected: path("expected", r.expected)?,
        actual: path("actual", r.actual)?,
        previous: if flap { Some(path("previous", r.previous)?) } else { None },
        changes: flap.then_some(r.changes),
        seen_as: seen.label(),
        ifindex: r.ifindex,
        device: device_name(r.ifindex),
        kernel_time_ns: r.ts_ns,
        pool_id: r.pool,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf::forward::entries::trie_key;

    fn bytes(r: &ForwardRecord) -> Vec<u8> {
        // SAFETY: `r` is a live reference, so its `size_of::<ForwardRecord>()` bytes are
        // readable for the borrow; the record is `#[repr(C)]` without implicit padding (its
        // size is asserted in `routewarden_common`), so all of them are initialized `u8`s.
        unsafe { std::slice::from_raw_parts(std::ptr::from_ref(r).cast::<u8>(), std::mem::size_of::<ForwardRecord>()) }.to_vec()
    }

    #[test]
    fn decodes_wrong_path_and_flap_records() {
        let (len, block) = trie_key(&"10.244.1.0/26".parse().unwrap());
        let (_, dst) = trie_key(&"10.244.1.5/32".parse().unwrap());
        let mut r = ForwardRecord {
            kind: ForwardRecordKind::WrongPath as u8,
            expected: ForwardPath::Tunnel as u8,
            actual: ForwardPath::Host as u8,
            observation: Observation::HostNative as u8,
            pool: 3,
            prefix_len: len,
            block,
            dst,
            ifindex: 0,
            ..ForwardRecord::default()
        };
        let names = |id: u16| (id == 3).then(|| "ipip-pool".to_string());
        let ev = decode_record(&bytes(&r), names).unwrap();
        assert_eq!(ev.event, ForwardEventKind::WrongPath);
        assert_eq!(ev.block.to_string(), "10.244.1.0/26");
        assert_eq!(ev.dst.to_string(), "10.244.1.5");
        assert_eq!((ev.expected, ev.actual, ev.seen_as), ("tunnel", "host", "host-native"));
        assert_eq!(ev.to_string(), "wrong-path 10.244.1.0/26 (pool ipip-pool) dst 10.244.1.5 left via host on ifindex 0, expected tunnel");
        r.kind = ForwardRecordKind::Flap as u8;
        r.previous = ForwardPath::Tunnel as u8;
        r.changes = 3;
        let ev = decode_record(&bytes(&r), names).unwrap();
        assert_eq!((ev.previous, ev.changes), (Some("tunnel"), Some(3)));
        let json = serde_json::to_value(&ev).unwrap();
        assert_eq!(json["event"], "flap");
        assert_eq!(json["block"], "10.244.1.0/26");
        assert!(decode_record(&bytes(&r)[1..], names).is_err());
        r.kind = 9;
        assert_eq!(decode_record(&bytes(&r), names), Err(DecodeError::Kind(9)));
    }
}
