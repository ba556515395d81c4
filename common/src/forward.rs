//! Types of the TC forwarding watch, shared by the kernel-side classifiers
//! (`ebpf/src/tc_forward.rs`) and the agent (`agent/src/bpf/forward.rs`).
//!
//! Data flow:
//!
//! ```text
//! Plan (desired routes / ownership expectation)
//!   └─> userspace: FORWARD_POOLS[FORWARD_POOLS_ACTIVE[0]]  PoolFilter: the pool ranges
//!                  (disjoint prefixes covering every destination) and, per range, the prefix
//!                  lengths of the destinations inside it, longest first
//!                  FORWARD_TARGETS_V4  hash  TargetKeyV4 (length, masked address) -> ForwardTarget
//!                  FORWARD_TARGETS_V6  hash  TargetKeyV6                          -> ForwardTarget
//!       (a ForwardTarget names its block in mapped form: IPv4 as ::ffff:a.b.c.d, length + 96)
//! egress skb on the tunnel device / host NIC
//!   └─> tc_forward_tunnel / tc_forward_host: dst (or inner dst of IPIP on the NIC)
//!         ├─ in no pool range: return TC_ACT_UNSPEC, nothing else touched
//!         ├─ its range's lengths, longest first (/32 borrowed IPs before blocks): one hash
//!         │  lookup of (length, dst & mask) each; the first hit is the longest match, none:
//!         │  return as above
//!         ├─ FORWARD_COUNTERS[counter_index(pool, expected, observation)] += (1, skb->len)
//!         ├─ expected != actual: FORWARD_COUNTERS already says so; sample -> FORWARD_EVENTS
//!         │                      (at most one per block per FORWARD_SAMPLE_INTERVAL_NS)
//!         └─ FORWARD_BLOCKS[block] last path; FORWARD_FLAP_THRESHOLD changes within
//!            FORWARD_WINDOW_NS -> FORWARD_FLAPS[pool] += 1 and a Flap record
//! ```
//!
//! All structs are `#[repr(C)]`, padding-free and `Copy`: the kernel writes these bytes and
//! userspace reads them back.

/// Number of pool ids the counters have room for (`pool` in [`ForwardTarget`] is `0..MAX_POOLS`).
pub const MAX_POOLS: usize = 256;

/// Number of [`ForwardPath`] values (indices `0..PATHS`).
pub const PATHS: usize = 3;

/// Number of [`Observation`] values (indices `0..OBSERVATIONS`).
pub const OBSERVATIONS: usize = 3;

/// Entries of the `FORWARD_COUNTERS` per-CPU array.
pub const COUNTER_SLOTS: usize = MAX_POOLS * PATHS * OBSERVATIONS;

/// Offset added to an IPv4 prefix length in the mapped form of [`ForwardTarget`], whose
/// addresses are IPv4-mapped IPv6 addresses (`::ffff:0:0/96`, RFC 4291 §2.5.5.2).
pub const V4_MAPPED_PREFIX_LEN: u32 = 96;

/// Egress path of a packet, or the path it should take.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ForwardPath {
    /// Through the IPIP tunnel device (on the host NIC: IP protocol 4 around the packet).
    Tunnel = 0,
    /// Natively through the host NIC.
    Host = 1,
    /// Not leaving the node: this node's own block (Felix's blackhole route); any egress on a
    /// watched device is then wrong.
    Local = 2,
}

impl ForwardPath {
    /// All paths, in index order.
    pub const ALL: [ForwardPath; PATHS] = [ForwardPath::Tunnel, ForwardPath::Host, ForwardPath::Local];

    /// Decode a path byte; out-of-range values are `None`.
    pub const fn from_u8(v: u8) -> Option<ForwardPath> {
        match v {
            0 => Some(ForwardPath::Tunnel),
            1 => Some(ForwardPath::Host),
            2 => Some(ForwardPath::Local),
            _ => None,
        }
    }

    /// `tunnel`, `host`, `local`: the `path`, `expected` and `actual` metric label values
    /// (deploy/README.md "Metrics").
    pub const fn label(self) -> &'static str {
        match self {
            ForwardPath::Tunnel => "tunnel",
            ForwardPath::Host => "host",
            ForwardPath::Local => "local",
        }
    }
}

/// Where a packet was seen, which decides the path it took.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Observation {
    /// On egress of a tunnel device (the inner packet, before encapsulation): path tunnel.
    TunnelDevice = 0,
    /// On egress of a host NIC, IP protocol 4 (IPIP), attributed to the inner destination:
    /// path tunnel. The same packet was usually seen as [`Observation::TunnelDevice`] first.
    HostIpip = 1,
    /// On egress of a host NIC, not encapsulated: path host.
    HostNative = 2,
}

impl Observation {
    /// All observations, in index order.
    pub const ALL: [Observation; OBSERVATIONS] = [Observation::TunnelDevice, Observation::HostIpip, Observation::HostNative];

    /// Decode an observation byte; out-of-range values are `None`.
    pub const fn from_u8(v: u8) -> Option<Observation> {
        match v {
            0 => Some(Observation::TunnelDevice),
            1 => Some(Observation::HostIpip),
            2 => Some(Observation::HostNative),
            _ => None,
        }
    }

    /// The path a packet seen this way took.
    pub const fn path(self) -> ForwardPath {
        match self {
            Observation::TunnelDevice | Observation::HostIpip => ForwardPath::Tunnel,
            Observation::HostNative => ForwardPath::Host,
        }
    }

    /// `tunnel-device`, `host-ipip`, `host-native` (logs and events only).
    pub const fn label(self) -> &'static str {
        match self {
            Observation::TunnelDevice => "tunnel-device",
            Observation::HostIpip => "host-ipip",
            Observation::HostNative => "host-native",
        }
    }
}

/// Index into `FORWARD_COUNTERS` of `(pool, expected path, observation)`; `None` when `pool`
/// is out of range. Layout: `(pool * PATHS + expected) * OBSERVATIONS + observation`.
#[inline(always)]
pub const fn counter_index(pool: u16, expected: u8, observation: u8) -> Option<u32> {
    // The table's dimensions, small constants (256, 3, 3): `as` cannot truncate them, and
    // `TryFrom` is not const.
    #[expect(clippy::cast_possible_truncation, reason = "MAX_POOLS, PATHS and OBSERVATIONS are 256, 3 and 3")]
    const DIMS: (u32, u32, u32) = (MAX_POOLS as u32, PATHS as u32, OBSERVATIONS as u32);
    // `as` widening: `From` is not const.
    let (pool, expected, observation) = (pool as u32, expected as u32, observation as u32);
    if pool >= DIMS.0 || expected >= DIMS.1 || observation >= DIMS.2 {
        return None;
    }
    Some((pool * DIMS.1 + expected) * DIMS.2 + observation)
}

/// Value of `FORWARD_TARGETS_V4`/`_V6`: one IPAM block or borrowed IP.
///
/// `block`/`prefix_len` repeat the destination in one form for both families, so the kernel
/// can key per-block state and name the block in records.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ForwardTarget {
    /// The block in mapped form: IPv6, or IPv4-mapped IPv6 (`::ffff:a.b.c.d`).
    pub block: [u8; 16],
    /// Prefix length in mapped form (IPv4: length + [`V4_MAPPED_PREFIX_LEN`]).
    pub prefix_len: u32,
    /// Pool id (`0..MAX_POOLS`), assigned by the agent; names live in userspace.
    pub pool: u16,
    /// Pool class: 0 IPIP, 1 no-encap, 2 VXLAN (information only).
    pub class: u8,
    /// Expected [`ForwardPath`] as a byte.
    pub expected: u8,
    /// The path the last packet to this destination took, written by the TC program (the
    /// fast path: a packet on the expected path that took the same path as the last one
    /// needs no per-block state); [`LAST_PATH_UNKNOWN`] when userspace (re)writes the entry.
    pub last_path: u8,
    /// Padding, zero.
    pub _pad: [u8; 3],
}

/// [`ForwardTarget::last_path`] before the TC program has seen a packet to the entry.
pub const LAST_PATH_UNKNOWN: u8 = 0xff;

/// Pool ranges per family in a [`PoolFilter`]: IPv4.
pub const POOL_RANGES_V4: usize = 8;
/// Pool ranges per family in a [`PoolFilter`]: IPv6.
pub const POOL_RANGES_V6: usize = 4;
/// Distinct destination prefix lengths one pool range can hold (a pool's block size and /32
/// or /128 borrowed IPs are two).
pub const RANGE_LENGTHS: usize = 4;

/// One IPv4 pool range of a [`PoolFilter`]. Addresses and masks are the address bytes in
/// packet (network) order read as a native `u32` (`u32::from_ne_bytes(octets)`), so the
/// kernel masks the bytes it loaded from the header without a byte swap.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolRangeV4 {
    /// Network address of the range (masked).
    pub net: u32,
    /// Netmask of the range.
    pub mask: u32,
    /// Valid entries of `prefix_lens` / `masks` (`0..=RANGE_LENGTHS`).
    pub lengths: u32,
    /// Prefix lengths (0..=32) of the destinations in the range, longest first.
    pub prefix_lens: [u32; RANGE_LENGTHS],
    /// Netmask of each of `prefix_lens`.
    pub masks: [u32; RANGE_LENGTHS],
}

/// One IPv6 pool range of a [`PoolFilter`]; addresses and masks as two native `u64`s of the
/// address bytes in packet order (`u64::from_ne_bytes` of bytes 0..8 and 8..16).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolRangeV6 {
    /// Network address of the range (masked).
    pub net: [u64; 2],
    /// Netmask of the range.
    pub mask: [u64; 2],
    /// Valid entries of `prefix_lens` / `masks`.
    pub lengths: u32,
    /// Prefix lengths (0..=128) of the destinations in the range, longest first.
    pub prefix_lens: [u32; RANGE_LENGTHS],
    /// Padding, zero.
    pub _pad: u32,
    /// Netmask of each of `prefix_lens`.
    pub masks: [[u64; 2]; RANGE_LENGTHS],
}

/// Value of the `FORWARD_POOLS` array (two slots; `FORWARD_POOLS_ACTIVE[0]` names the live
/// one, userspace writes the other and then flips it, so a packet never reads a half-written
/// filter). The ranges are disjoint and together cover every destination of
/// `FORWARD_TARGETS_V4`/`_V6`: an address in no range is not a cluster destination, and an
/// address in a range can only match destinations of that range.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolFilter {
    /// Valid entries of `v4` (`0..=POOL_RANGES_V4`).
    pub v4_ranges: u32,
    /// Valid entries of `v6` (`0..=POOL_RANGES_V6`).
    pub v6_ranges: u32,
    /// IPv4 ranges, sorted by address.
    pub v4: [PoolRangeV4; POOL_RANGES_V4],
    /// IPv6 ranges, sorted by address.
    pub v6: [PoolRangeV6; POOL_RANGES_V6],
}

/// Key of `FORWARD_TARGETS_V4`: a destination's prefix length and its masked address
/// (native `u32` of the bytes in packet order, as in [`PoolRangeV4`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TargetKeyV4 {
    /// Prefix length, 0..=32.
    pub prefix_len: u32,
    /// Network address.
    pub addr: u32,
}

/// Key of `FORWARD_TARGETS_V6`, as [`TargetKeyV4`] (address as in [`PoolRangeV6`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TargetKeyV6 {
    /// Prefix length, 0..=128.
    pub prefix_len: u32,
    /// Padding, zero.
    pub _pad: u32,
    /// Network address.
    pub addr: [u64; 2],
}

/// Key of the `FORWARD_BLOCKS` LRU map: a destination block in mapped form.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BlockKey {
    /// Prefix length in mapped form.
    pub prefix_len: u32,
    /// The block address in mapped form.
    pub block: [u8; 16],
}

/// Value of `FORWARD_BLOCKS`: the kernel's memory of a block's egress path.
///
/// Updated racily from several CPUs (no lock on the fast path): two CPUs sending the same
/// block on two paths at the same instant is itself a path change, so the race only shifts
/// which packet counts it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockState {
    /// Last egress [`ForwardPath`] byte.
    pub last_path: u8,
    /// Padding, zero.
    pub _pad: [u8; 3],
    /// Path changes since `window_start_ns`.
    pub changes: u32,
    /// Start of the current change window, `bpf_ktime_get_ns` (CLOCK_MONOTONIC, ns).
    pub window_start_ns: u64,
    /// Last wrong-path sample pushed for this block (ns; 0: never).
    pub last_sample_ns: u64,
}

/// Packets and bytes of one `FORWARD_COUNTERS` slot on one CPU.
///
/// `bytes` is `skb->len` at the hook: the L3 packet on a real tunnel device, the L2 frame on
/// an Ethernet device, the outer packet for [`Observation::HostIpip`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ForwardCounters {
    /// Packets.
    pub packets: u64,
    /// Bytes (`skb->len`).
    pub bytes: u64,
}

/// Global per-CPU statistics at index 0 of `FORWARD_STATS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ForwardStats {
    /// Records not pushed because the ring buffer was full.
    pub events_lost: u64,
    /// Wrong-path samples pushed.
    pub samples: u64,
    /// Wrong-path samples suppressed by the per-block rate limit.
    pub samples_suppressed: u64,
    /// Packets to a cluster destination whose pool id has no counter slot (>= MAX_POOLS).
    pub pool_out_of_range: u64,
}

/// Kind of a [`ForwardRecord`].
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForwardRecordKind {
    /// A packet left on a path other than the expected one (rate-limited sample).
    WrongPath = 1,
    /// A block's path changed `changes` (= threshold) times within the window.
    Flap = 2,
}

impl ForwardRecordKind {
    /// Decode a kind byte.
    pub const fn from_u8(v: u8) -> Option<ForwardRecordKind> {
        match v {
            1 => Some(ForwardRecordKind::WrongPath),
            2 => Some(ForwardRecordKind::Flap),
            _ => None,
        }
    }
}

/// One ring-buffer record of `FORWARD_EVENTS` (64 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ForwardRecord {
    /// [`ForwardRecordKind`] byte.
    pub kind: u8,
    /// Expected [`ForwardPath`] byte.
    pub expected: u8,
    /// Path this packet took ([`ForwardPath`] byte).
    pub actual: u8,
    /// [`Observation`] byte.
    pub observation: u8,
    /// Pool id.
    pub pool: u16,
    /// Pool class byte (0 IPIP, 1 no-encap, 2 VXLAN).
    pub class: u8,
    /// Previous path of the block ([`ForwardPath`] byte; flap records), else = `actual`.
    pub previous: u8,
    /// Path changes within the window (flap records), 0 otherwise.
    pub changes: u32,
    /// `skb->ifindex` of the device the packet left on.
    pub ifindex: u32,
    /// `bpf_ktime_get_ns` at the packet (ns, CLOCK_MONOTONIC).
    pub ts_ns: u64,
    /// The matched block (mapped form).
    pub block: [u8; 16],
    /// The packet's destination (inner destination for IPIP on the NIC), mapped form.
    pub dst: [u8; 16],
    /// Prefix length of `block` (mapped form).
    pub prefix_len: u32,
    /// Padding, zero.
    pub _pad: u32,
}

#[cfg(feature = "user")]
mod pod {
    // `aya::Pod` asks that every bit pattern of the type's size be a valid value, since a map
    // read fills it from kernel bytes. Each type here is `#[repr(C)]` and `Copy`, made only of
    // integers and byte arrays, with its padding spelled out as fields.
    // SAFETY: `ForwardTarget` is `#[repr(C)]` integers and byte arrays with explicit padding.
    unsafe impl aya::Pod for super::ForwardTarget {}
    // SAFETY: `BlockKey` is `#[repr(C)]` integers and byte arrays with explicit padding.
    unsafe impl aya::Pod for super::BlockKey {}
    // SAFETY: `BlockState` is `#[repr(C)]` integers and byte arrays with explicit padding.
    unsafe impl aya::Pod for super::BlockState {}
    // SAFETY: `ForwardCounters` is `#[repr(C)]` integers and byte arrays with explicit padding.
    unsafe impl aya::Pod for super::ForwardCounters {}
    // SAFETY: `ForwardStats` is `#[repr(C)]` integers and byte arrays with explicit padding.
    unsafe impl aya::Pod for super::ForwardStats {}
    // SAFETY: `PoolFilter` is `#[repr(C)]` integers and byte arrays with explicit padding.
    unsafe impl aya::Pod for super::PoolFilter {}
    // SAFETY: `TargetKeyV4` is `#[repr(C)]` integers and byte arrays with explicit padding.
    unsafe impl aya::Pod for super::TargetKeyV4 {}
    // SAFETY: `TargetKeyV6` is `#[repr(C)]` integers and byte arrays with explicit padding.
    unsafe impl aya::Pod for super::TargetKeyV6 {}
}

const _: () = assert!(core::mem::size_of::<ForwardTarget>() == 28);
const _: () = assert!(core::mem::size_of::<BlockKey>() == 20);
const _: () = assert!(core::mem::size_of::<BlockState>() == 24);
const _: () = assert!(core::mem::size_of::<ForwardRecord>() == 64);
const _: () = assert!(core::mem::size_of::<PoolRangeV4>() == 44);
const _: () = assert!(core::mem::size_of::<PoolRangeV6>() == 120);
const _: () = assert!(core::mem::size_of::<PoolFilter>() == 8 + 44 * POOL_RANGES_V4 + 120 * POOL_RANGES_V6);
const _: () = assert!(core::mem::size_of::<TargetKeyV4>() == 8);
const _: () = assert!(core::mem::size_of::<TargetKeyV6>() == 24);

/// Name of the array of two [`PoolFilter`]s (the live one and the one being written).
pub const FORWARD_POOLS_MAP: &str = "FORWARD_POOLS";
/// Name of the one-`u32` array naming the live slot (0 or 1) of `FORWARD_POOLS`.
pub const FORWARD_POOLS_ACTIVE_MAP: &str = "FORWARD_POOLS_ACTIVE";
/// Name of the hash map [`TargetKeyV4`] -> [`ForwardTarget`] of IPv4 cluster destinations.
pub const FORWARD_TARGETS_V4_MAP: &str = "FORWARD_TARGETS_V4";
/// Name of the hash map [`TargetKeyV6`] -> [`ForwardTarget`] of IPv6 cluster destinations.
pub const FORWARD_TARGETS_V6_MAP: &str = "FORWARD_TARGETS_V6";
/// Name of the per-CPU counter array ([`COUNTER_SLOTS`] x [`ForwardCounters`]).
pub const FORWARD_COUNTERS_MAP: &str = "FORWARD_COUNTERS";
/// Name of the per-CPU flap counters (`MAX_POOLS` x `u64`).
pub const FORWARD_FLAPS_MAP: &str = "FORWARD_FLAPS";
/// Name of the per-CPU [`ForwardStats`] array (index 0).
pub const FORWARD_STATS_MAP: &str = "FORWARD_STATS";
/// Name of the LRU map of per-block state.
pub const FORWARD_BLOCKS_MAP: &str = "FORWARD_BLOCKS";
/// Name of the ring buffer of [`ForwardRecord`]s.
pub const FORWARD_EVENTS_MAP: &str = "FORWARD_EVENTS";

/// Classifier for tunnel devices (every packet's path is tunnel).
pub const PROG_TC_FORWARD_TUNNEL: &str = "tc_forward_tunnel";
/// Classifier for host NICs (IPIP: tunnel, attributed to the inner destination; else host).
pub const PROG_TC_FORWARD_HOST: &str = "tc_forward_host";

/// Global: path changes within the window that make a flap (u32, default 3).
pub const GLOBAL_FLAP_THRESHOLD: &str = "FORWARD_FLAP_THRESHOLD";
/// Global: flap window (u64 ns, default 30 s).
pub const GLOBAL_WINDOW_NS: &str = "FORWARD_WINDOW_NS";
/// Global: minimum interval between two wrong-path samples of one block (u64 ns, default 1 s).
pub const GLOBAL_SAMPLE_INTERVAL_NS: &str = "FORWARD_SAMPLE_INTERVAL_NS";
