//! Decoding of the kernel FIB functions' arguments, shared by the fentry and kprobe hooks
//! (`route_watch_fentry.rs`, `route_watch_kprobe.rs`).
//!
//! Struct member offsets are never hard-coded: userspace resolves them from the running
//! kernel's BTF (`/sys/kernel/btf/vmlinux`) and passes them in the global
//! `ROUTE_WATCH_OFFSETS` ([`KernelOffsets`]); memory is read with `bpf_probe_read_kernel`, so
//! the same code serves fentry (typed arguments) and kprobes (registers). Writes outside the
//! network namespace `ROUTE_WATCH_NETNS_INUM` (0 = all) are counted and ignored.
//!
//! The writer is the current task (tgid and `comm`). A change with no netlink sender
//! (`fc_nlinfo.portid == 0` for IPv4, `info->nlh == NULL` for IPv6) is the kernel's own, on
//! every backend (port 0): a delete of that kind is a flush.
use aya_ebpf::helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_probe_read_kernel};
use aya_log_ebpf::{macro_support::Level, warn};
use routewarden_common::route_watch::{KernelOffsets, RouteWrite, WriteOp, WriteOrigin, WriterIdKind, AF_INET, AF_INET6};

use crate::bpf_log::{allowed, LogKind};
use crate::route_detector::{count_decode_error, count_other_netns, current_process, now_ns, observe, observe_failure};

/// Network namespace inode number to watch (`stat -L /proc/<agent>/ns/net`), 0 = all.
#[unsafe(no_mangle)]
static ROUTE_WATCH_NETNS_INUM: u32 = 0;
/// Member offsets from BTF, see [`KernelOffsets`].
#[unsafe(no_mangle)]
static ROUTE_WATCH_OFFSETS: KernelOffsets = KernelOffsets::UNRESOLVED;
routewarden_common::assert_bpf_name!(ROUTE_WATCH_NETNS_INUM, routewarden_common::route_watch::GLOBAL_NETNS_INUM);
routewarden_common::assert_bpf_name!(ROUTE_WATCH_OFFSETS, routewarden_common::route_watch::GLOBAL_OFFSETS);

const NLM_F_REPLACE: u16 = 0x100;

macro_rules! off {
    ($field:ident) => {
        // SAFETY: volatile read of a field of a static, so the loader's value is used.
        u64::from(unsafe { core::ptr::read_volatile(core::ptr::addr_of!(ROUTE_WATCH_OFFSETS.$field)) })
    };
}

/// Read a `T` from kernel memory at `base + off`.
#[inline(always)]
fn rd<T>(base: u64, off: u64) -> Result<T, ()> {
    if base == 0 {
        return Err(());
    }
    // SAFETY: bpf_probe_read_kernel validates the address and fails instead of faulting.
    unsafe { bpf_probe_read_kernel(base.wrapping_add(off) as *const T).map_err(|_| ()) }
}

#[inline(always)]
fn offsets_valid() -> bool {
    off!(valid) == 1
}

/// True when `net` is the watched namespace (or all are watched).
#[inline(always)]
fn in_watched_netns(net: u64) -> Result<bool, ()> {
    // SAFETY: volatile read of a static.
    let want = unsafe { core::ptr::read_volatile(&raw const ROUTE_WATCH_NETNS_INUM) };
    if want == 0 {
        return Ok(true);
    }
    let inum: u32 = rd(net, off!(net_ns_inum))?;
    Ok(inum == want)
}

/// The current task's process: its leader's tgid and `comm` ([`current_process`]), or, without
/// the task offsets, its tgid and the thread's own `comm`.
#[inline(always)]
fn current_writer(protocol: u8) -> WriteOrigin {
    let (tgid, comm) = current_process().unwrap_or_else(|| ((bpf_get_current_pid_tgid() >> 32) as u32, bpf_get_current_comm().unwrap_or([0; 16])));
    WriteOrigin { id: tgid, id_kind: WriterIdKind::Process as u8, protocol, class: 0, flags: 0, comm }
}

/// Hand a decoded write to the detector when the kernel made it (`ret == 0`), to the failure
/// runs when it refused it (`ret == -errno`).
#[inline(always)]
fn outcome(w: &mut RouteWrite, ret: i32) {
    if ret == 0 {
        observe(w);
    } else {
        #[expect(clippy::cast_sign_loss, reason = "errno values are 1..=4095 (MAX_ERRNO)")]
        let errno = (ret.wrapping_neg() & 0xfff) as u16;
        observe_failure(w, errno);
    }
}

/// `fib_table_insert(net, tb, cfg, extack)` / `fib_table_delete(net, tb, cfg, extack)`,
/// which returned `ret` (0, or `-errno` for a write the kernel refused).
#[inline(always)]
pub fn fib4(net: u64, cfg: u64, delete: bool, ret: i32) {
    if !offsets_valid() {
        unresolved();
    } else if fib4_inner(net, cfg, delete, ret).is_err() {
        unreadable("fib_config");
    }
}

/// The offsets were not resolved from the running kernel's BTF (they do not match the struct
/// layout the hook was written against): nothing can be read.
#[inline(always)]
fn unresolved() {
    count_decode_error();
    if allowed(LogKind::RouteOffsetsUnresolved, Level::Warn) {
        warn!(&(), "route watch: kernel struct offsets unresolved (BTF does not match the hook); write not recorded");
    }
}

/// A read at a BTF offset failed.
#[inline(always)]
fn unreadable(what: &'static str) {
    count_decode_error();
    if allowed(LogKind::RouteFibRead, Level::Warn) {
        warn!(&(), "route watch: reading {} at its BTF offsets failed; write not recorded", what);
    }
}

#[inline(always)]
fn fib4_inner(net: u64, cfg: u64, delete: bool, ret: i32) -> Result<(), ()> {
    if !offsets_valid() {
        return Err(());
    }
    if !in_watched_netns(net)? {
        count_other_netns();
        return Ok(());
    }
    let protocol: u8 = rd(cfg, off!(fc_protocol))?;
    let nlflags: u16 = rd(cfg, off!(fc_nlflags))?;
    let portid: u32 = rd(cfg, off!(fc_portid))?;
    let dst: [u8; 4] = rd(cfg, off!(fc_dst))?;
    let gw: [u8; 4] = rd(cfg, off!(fc_gw4))?;
    let nh_id_off = off!(fc_nh_id);
    let nh_id: u32 = if nh_id_off == u64::from(KernelOffsets::ABSENT) { 0 } else { rd(cfg, nh_id_off)? };
    let mut w = RouteWrite {
        ts_ns: now_ns(),
        table: rd(cfg, off!(fc_table))?,
        metric: rd(cfg, off!(fc_priority))?,
        oif: rd(cfg, off!(fc_oif))?,
        family: AF_INET,
        op: if delete {
            WriteOp::Delete as u8
        } else if nlflags & NLM_F_REPLACE != 0 {
            WriteOp::Replace as u8
        } else {
            WriteOp::Add as u8
        },
        dst_len: rd(cfg, off!(fc_dst_len))?,
        _pad: 0,
        dst: [dst[0], dst[1], dst[2], dst[3], 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        gateway: [gw[0], gw[1], gw[2], gw[3], 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        nh_id,
        _pad2: 0,
        writer: current_writer(protocol),
    };
    // No sender (`fib_magic`, a link's routes): the kernel's own change, whoever is current.
    if portid == 0 {
        w.writer.id = 0;
        w.writer.id_kind = WriterIdKind::NetlinkPort as u8;
    }
    outcome(&mut w, ret);
    Ok(())
}

/// `fib6_add(root, rt, info, extack)` / `fib6_del(rt, info)`, which returned `ret`.
#[inline(always)]
pub fn fib6(rt: u64, info: u64, delete: bool, ret: i32) {
    if !offsets_valid() {
        unresolved();
    } else if fib6_inner(rt, info, delete, ret).is_err() {
        unreadable("fib6_info");
    }
}

#[inline(always)]
fn fib6_inner(rt: u64, info: u64, delete: bool, ret: i32) -> Result<(), ()> {
    if !offsets_valid() {
        return Err(());
    }
    let net: u64 = rd(info, off!(nli_net))?;
    if !in_watched_netns(net)? {
        count_other_netns();
        return Ok(());
    }
    let nlh: u64 = rd(info, off!(nli_nlh))?;
    // nlmsghdr.nlmsg_flags is at byte 6 (uapi, stable).
    let nlflags: u16 = if nlh == 0 { 0 } else { rd(nlh, 6)? };
    let table_ptr: u64 = rd(rt, off!(f6i_table))?;
    let table: u32 = rd(table_ptr, off!(tb6_id))?;
    let plen: i32 = rd(rt, off!(f6i_dst_plen))?;
    let protocol: u8 = rd(rt, off!(f6i_protocol))?;
    // A route through a nexthop object has no `fib6_nh` of its own (`ip6_route_info_create`
    // allocates one only without an object): reading one would read past the route's
    // allocation. Its device and gateway are the object's, which the hook does not follow (as
    // IPv4's `fib_config` carries only the object's id): none, and the object's id instead.
    let nh_off = off!(f6i_nh);
    let nh: u64 = if nh_off == u64::from(KernelOffsets::ABSENT) { 0 } else { rd(rt, nh_off)? };
    let through_object = nh != 0;
    let nh_id: u32 = if through_object { rd(nh, off!(nh_id))? } else { 0 };
    let dev: u64 = if through_object { 0 } else { rd(rt, off!(f6i_nh_dev)).unwrap_or(0) };
    let oif: u32 = if dev == 0 { 0 } else { rd(dev, off!(dev_ifindex)).unwrap_or(0) };
    #[expect(clippy::cast_sign_loss, reason = "an IPv6 prefix length is 0..=128")]
    let dst_len = (plen & 0xff) as u8;
    let mut w = RouteWrite {
        ts_ns: now_ns(),
        table,
        metric: rd(rt, off!(f6i_metric))?,
        oif,
        family: AF_INET6,
        op: if delete {
            WriteOp::Delete as u8
        } else if nlflags & NLM_F_REPLACE != 0 {
            WriteOp::Replace as u8
        } else {
            WriteOp::Add as u8
        },
        dst_len,
        _pad: 0,
        dst: rd(rt, off!(f6i_dst_addr))?,
        gateway: if through_object { [0; 16] } else { rd(rt, off!(f6i_nh_gw)).unwrap_or([0; 16]) },
        nh_id,
        _pad2: 0,
        writer: current_writer(protocol),
    };
    // No request (address configuration, router advertisements): the kernel's own change.
    if nlh == 0 {
        w.writer.id = 0;
        w.writer.id_kind = WriterIdKind::NetlinkPort as u8;
    }
    outcome(&mut w, ret);
    Ok(())
}
