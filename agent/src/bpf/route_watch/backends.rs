//! The three backends of the route watch, loaded and attached on the process's one load:
//! fexit (the fentry backend) or kprobe and kretprobe programs on the hooked FIB functions, or
//! a socket filter on a `NETLINK_ROUTE` socket of its own. A backend that fails leaves nothing
//! loaded behind it, so the next one can be tried on the same object.
//!
//! Policy rules are written through `fib_nl_newrule`/`fib_nl_delrule`, not the FIB functions:
//! beside fentry and kprobe programs the same socket-filter program runs on a socket joined to
//! the rule groups alone ([`RuleFilter`]), so rule writes are watched, with their writer, on
//! every backend.

use std::os::fd::{AsFd, OwnedFd};

use aya::programs::fexit::FExitLink;
use aya::programs::kprobe::KProbeLink;
use aya::programs::{FExit, KProbe, SocketFilter};
use aya::Ebpf;
use routewarden_common::route_watch::{HOOKED_FUNCTIONS, PROGS_FENTRY, PROGS_KPROBE, PROGS_KRETPROBE, PROG_SOCKET_FILTER, PROG_SOCKET_FILTER_PORT};

use super::btf;
use super::settings::RouteWatchBackend;
use crate::bpf::bpf_log::BpfLogLevel;
use crate::bpf::loader::BpfObject;
use crate::bpf::BpfError;

/// How the running backend names the process behind a route write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Senders {
    /// In the kernel, from the task that made the write (fentry/kprobe: the hooked call's
    /// task; socket filter: the task whose request the notification answers). Every write by
    /// a process is attributed, however short-lived the process.
    Task,
    /// Socket filter by netlink port id, resolved to a process in user space afterwards (best
    /// effort: a writer gone before its round stays unattributed); the string says why the
    /// task is not read.
    Port(String),
}

impl std::fmt::Display for Senders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Senders::Task => f.write_str("writers named by process in the kernel"),
            Senders::Port(why) => {
                write!(f, "writers named by netlink port, resolved through /proc (best effort; short-lived writers stay unattributed): {why}")
            }
        }
    }
}

/// An owned link of one backend's program; dropping it detaches the program.
pub(super) enum BackendLink {
    Fexit(#[expect(dead_code, reason = "held for its Drop (detach)")] FExitLink),
    Kprobe(#[expect(dead_code, reason = "held for its Drop (detach)")] KProbeLink),
}

/// The rule watch beside the fentry and kprobe backends: the socket filter on a socket joined
/// to the rule groups only, or why it could not start (the route watch runs without it).
#[derive(Debug)]
pub(super) enum RuleFilter {
    /// The route backend is the socket filter, which sees rule writes itself.
    Backend,
    /// The filter on its own socket (closing it detaches the filter), and how it names writers.
    Running(#[expect(dead_code, reason = "held: closing it detaches the filter")] OwnedFd, Senders),
    /// It did not start: why.
    Failed(String),
}

/// What a started backend holds: its programs' links, its socket (socket filter), how it
/// names writers, and the rule watch beside it.
pub(super) struct Started {
    pub links: Vec<BackendLink>,
    pub socket: Option<OwnedFd>,
    pub senders: Senders,
    pub rules: RuleFilter,
}

/// Load and attach one backend's programs; on failure the ones it loaded are unloaded.
pub(super) fn start_backend(object: &BpfObject, backend: RouteWatchBackend) -> Result<Started, BpfError> {
    let (links, socket, senders) = match backend {
        RouteWatchBackend::SocketFilter => {
            let (socket, senders) = start_filter(object, ALL_GROUPS)?;
            return Ok(Started { links: Vec::new(), socket: Some(socket), senders, rules: RuleFilter::Backend });
        }
        RouteWatchBackend::Fentry => (start_fentry(object)?, None, Senders::Task),
        RouteWatchBackend::Kprobe => (start_kprobe(object)?, None, Senders::Task),
    };
    let rules = match start_filter(object, RULE_GROUPS) {
        Ok((socket, senders)) => RuleFilter::Running(socket, senders),
        Err(e) => {
            tracing::warn!(backend = backend.label(), error = %e, "route watch: the rule watch beside the backend did not start; policy rule writes are not watched");
            RuleFilter::Failed(e.to_string())
        }
    };
    Ok(Started { links, socket, senders, rules })
}

/// The socket filter on a new route socket bound to `groups`: the one that reads the sending
/// task first (it needs `task_struct` offsets, and its helpers, which lockdown's
/// confidentiality mode withholds), then the one naming senders by port.
fn start_filter(object: &BpfObject, groups: u32) -> Result<(OwnedFd, Senders), BpfError> {
    let task_senders = object.config().route_watch.as_ref().is_none_or(|c| c.task_senders);
    let first = match object.task_offsets() {
        Ok(_) if task_senders => start_socket_filter(object, PROG_SOCKET_FILTER, groups).map(|s| (s, Senders::Task)).map_err(|e| e.to_string()),
        Ok(_) => Err("configured to name writers by netlink port".to_owned()),
        Err(why) => Err(format!("kernel BTF: {why}")),
    };
    match first {
        Ok(found) => Ok(found),
        Err(why) => {
            // The verifier's whole log is for the debug level; `/readyz` gets the error itself.
            tracing::debug!(error = %why, "route watch: the socket filter reading the sending task did not load");
            let why = why.split(". Verifier output").next().unwrap_or_default().to_owned();
            tracing::info!(error = %why, "route watch: the socket filter cannot read the sending task; naming writers by netlink port");
            Ok((start_socket_filter(object, PROG_SOCKET_FILTER_PORT, groups)?, Senders::Port(why)))
        }
    }
}

/// Load the socket filter `program` and attach it to a new route socket bound to `groups`
/// (closing the socket detaches it).
fn start_socket_filter(object: &BpfObject, program: &'static str, groups: u32) -> Result<OwnedFd, BpfError> {
    let prog_err = BpfError::program;
    // A socket filter is charged to the socket's option memory: a program larger
    // than `net.core.optmem_max` (20 KiB before Linux 6.9) fails SO_ATTACH_BPF
    // with ENOMEM (net/core/filter.c, sk_filter_charge). The logging code doubles
    // the program, so a watch asked to log retries without it rather than going
    // without a route watch. The log level is one global of the whole object:
    // the object is loaded again without logs, for every watch of the process.
    let attach = || -> Result<(OwnedFd, Option<u32>), BpfError> {
        let socket = route_socket(groups)?;
        object.with(|ebpf| {
            let prog: &mut SocketFilter = ebpf.program_mut(program).ok_or(BpfError::Missing(program))?.try_into().map_err(prog_err("type", program))?;
            match prog.load() {
                Ok(()) | Err(aya::programs::ProgramError::AlreadyLoaded) => {}
                Err(e) => return Err(prog_err("load", program)(e)),
            }
            let size = prog.info().ok().and_then(|i| i.size_translated());
            match prog.attach(socket.as_fd()) {
                Ok(()) => Ok((socket, size)),
                Err(e) => {
                    let _ = prog.unload();
                    Err(prog_err("attach", program)(e))
                }
            }
        })
    };
    let requested = object.log_level();
    match attach() {
        Ok((socket, _)) => Ok(socket),
        // Beside fentry/kprobe programs already attached the object must not be loaded again
        // (they would write to the first load's maps): the rule watch goes without.
        Err(e) if requested != BpfLogLevel::Off && e.is_out_of_memory() && groups == ALL_GROUPS => {
            object.reload_without_logs()?;
            let (socket, size) = attach()?;
            // Global before 6.9 and then not visible from other namespaces.
            let optmem = std::fs::read_to_string("/proc/sys/net/core/optmem_max").map_or_else(|_| "unknown".to_owned(), |s| s.trim().to_owned());
            tracing::warn!(
                requested = ?requested,
                optmem_max = %optmem,
                bytes_without_logs = size.unwrap_or(0),
                error = %e,
                applies_to = "every BPF program of this process",
                "route watch: the socket-filter program with kernel logs is larger than this kernel lets a socket hold (net.core.optmem_max); running it without kernel logs"
            );
            Ok(socket)
        }
        Err(e) => Err(e),
    }
}

/// Load and attach the fentry backend's programs (fexit: at the functions' return, with
/// their arguments and result); on failure the ones loaded are unloaded.
fn start_fentry(object: &BpfObject) -> Result<Vec<BackendLink>, BpfError> {
    let prog_err = BpfError::program;
    object.kernel_offsets()?;
    tracing_programs_allowed()?;
    let kbtf = aya::Btf::from_sys_fs().map_err(|e| BpfError::Btf(format!("reading {}: {e}", btf::VMLINUX_BTF)))?;
    object.with(|ebpf| {
        let mut links = Vec::new();
        for (name, func) in PROGS_FENTRY.into_iter().zip(HOOKED_FUNCTIONS) {
            let attached = (|| {
                let prog: &mut FExit = ebpf.program_mut(name).ok_or(BpfError::Missing(name))?.try_into().map_err(prog_err("type", name))?;
                match prog.load(func, &kbtf) {
                    Ok(()) | Err(aya::programs::ProgramError::AlreadyLoaded) => {}
                    Err(e) => return Err(prog_err("load", name)(e)),
                }
                let id = prog.attach().map_err(prog_err("attach", name))?;
                prog.take_link(id).map_err(prog_err("attach", name))
            })();
            match attached {
                Ok(link) => links.push(BackendLink::Fexit(link)),
                Err(e) => {
                    drop(links);
                    unload_all(ebpf, &PROGS_FENTRY);
                    return Err(e);
                }
            }
        }
        Ok(links)
    })
}

/// Whether this kernel loads tracing programs at all, asked before the fentry backend reads
/// the kernel's BTF for its real load (aya parses all of it again, ~35 ms and tens of MB on
/// 6.x kernels) only to be refused. The probe is the smallest fexit program (`r0 = 0; exit`)
/// with no target: a kernel that takes tracing programs reaches the verifier and rejects it
/// for the missing target (EINVAL, "Tracing programs must provide btf_id",
/// `bpf_check_attach_target` in `kernel/bpf/verifier.c`), while EPERM or EACCES come before
/// the verifier: a missing `CAP_PERFMON`/`CAP_SYS_ADMIN` (`bpf_prog_load` in
/// `kernel/bpf/syscall.c`) or a security module's `bpf_prog_load` hook, which refuse the real
/// load the same way. Only those two answers stop the backend; any other (an older kernel's
/// different complaint, a load that succeeds) goes on to the real load, so the probe can
/// never keep a working fentry from starting.
///
/// # Errors
/// [`BpfError::Refused`] with the errno.
pub fn tracing_programs_allowed() -> Result<(), BpfError> {
    use aya_obj::generated::{bpf_attach_type, bpf_attr, bpf_cmd, bpf_prog_type};
    use std::os::fd::FromRawFd;
    // `BPF_ALU64 | BPF_MOV | BPF_K` r0 = 0, then `BPF_JMP | BPF_EXIT`: one opcode byte each,
    // registers, offset and immediate zero.
    let insns: [[u8; 8]; 2] = [[0xb7, 0, 0, 0, 0, 0, 0, 0], [0x95, 0, 0, 0, 0, 0, 0, 0]];
    let license = c"GPL";
    // SAFETY: `bpf_attr` is a union of plain integer structs; all zeros is its empty value.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: writing the fields of the `BPF_PROG_LOAD` member of the zeroed union.
    let load = unsafe { &mut attr.__bindgen_anon_3 };
    load.prog_type = bpf_prog_type::BPF_PROG_TYPE_TRACING as u32;
    load.expected_attach_type = bpf_attach_type::BPF_TRACE_FEXIT as u32;
    load.insn_cnt = 2;
    load.insns = insns.as_ptr() as u64;
    load.license = license.as_ptr() as u64;
    let size = u32::try_from(std::mem::size_of::<bpf_attr>()).unwrap_or(u32::MAX);
    // SAFETY: `attr` and the buffers it points at (`insns`, `license`) live across the call;
    // the kernel reads `size` bytes of `attr` (the tail past what it knows is zero) and keeps
    // no pointer into them.
    let rc = unsafe { nix::libc::syscall(nix::libc::SYS_bpf, bpf_cmd::BPF_PROG_LOAD as nix::libc::c_long, &raw const attr, size) };
    if rc >= 0 {
        // Not expected without a target; a program is a program: close it.
        // SAFETY: a new descriptor the kernel just returned, owned by nothing else.
        drop(unsafe { OwnedFd::from_raw_fd(i32::try_from(rc).unwrap_or(-1)) });
        return Ok(());
    }
    let error = std::io::Error::last_os_error();
    match error.raw_os_error() {
        Some(nix::libc::EPERM | nix::libc::EACCES) => Err(BpfError::Refused { what: "tracing programs (fentry/fexit)", source: error }),
        _ => Ok(()),
    }
}

/// Load and attach the kprobe programs (entry: keep the arguments) and the kretprobe ones
/// (return: decode them with the result); on failure the ones loaded are unloaded.
fn start_kprobe(object: &BpfObject) -> Result<Vec<BackendLink>, BpfError> {
    let prog_err = BpfError::program;
    object.kernel_offsets()?;
    object.with(|ebpf| {
        let mut links = Vec::new();
        let programs = PROGS_KPROBE.into_iter().zip(HOOKED_FUNCTIONS).chain(PROGS_KRETPROBE.into_iter().zip(HOOKED_FUNCTIONS));
        for (name, func) in programs {
            let attached = (|| {
                let prog: &mut KProbe = ebpf.program_mut(name).ok_or(BpfError::Missing(name))?.try_into().map_err(prog_err("type", name))?;
                match prog.load() {
                    Ok(()) | Err(aya::programs::ProgramError::AlreadyLoaded) => {}
                    Err(e) => return Err(prog_err("load", name)(e)),
                }
                let id = prog.attach(func, 0).map_err(prog_err("attach", name))?;
                prog.take_link(id).map_err(prog_err("attach", name))
            })();
            match attached {
                Ok(link) => links.push(BackendLink::Kprobe(link)),
                Err(e) => {
                    drop(links);
                    unload_all(ebpf, &PROGS_KPROBE);
                    unload_all(ebpf, &PROGS_KRETPROBE);
                    return Err(e);
                }
            }
        }
        Ok(links)
    })
}

/// Unload the programs `names` (a backend that did not attach; its links are gone already).
fn unload_all(ebpf: &mut Ebpf, names: &[&str]) {
    for name in names {
        if let Some(p) = ebpf.program_mut(name) {
            let _ = match p {
                aya::programs::Program::FExit(p) => p.unload(),
                aya::programs::Program::KProbe(p) => p.unload(),
                _ => Ok(()),
            };
        }
    }
}

const RTMGRP_LINK: u32 = 0x1;
const RTMGRP_IPV4_ROUTE: u32 = 0x40;
const RTMGRP_IPV6_ROUTE: u32 = 0x400;
/// `RTNLGRP_IPV4_RULE` (8) as a bind mask bit.
const RTMGRP_IPV4_RULE: u32 = 1 << (8 - 1);
/// `RTNLGRP_IPV6_RULE` (19) as a bind mask bit.
const RTMGRP_IPV6_RULE: u32 = 1 << (19 - 1);
/// The socket-filter backend's groups: links, routes of both families, rules (and, joined
/// apart, nexthop objects).
const ALL_GROUPS: u32 = RTMGRP_LINK | RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_ROUTE | RTMGRP_IPV4_RULE | RTMGRP_IPV6_RULE;
/// The rule watch beside fentry and kprobe: the rule groups alone (routes come from the hooks).
const RULE_GROUPS: u32 = RTMGRP_IPV4_RULE | RTMGRP_IPV6_RULE;

/// The socket-filter backend's route socket (same groups, nexthop group joined) with a
/// classic filter that drops every message (`ret #0`) instead of the backend's program: the
/// price the kernel charges each route write for one more listener of its notifications,
/// whatever the listener does with them (the notification cloned for it, its filter run, the
/// clone freed). `watch-overhead` measures the backend against it. Held open until dropped.
///
/// # Errors
/// [`BpfError::Socket`] when the socket cannot be made, bound or given the filter.
pub fn listener_floor() -> Result<OwnedFd, BpfError> {
    use std::os::fd::AsRawFd;
    let socket = route_socket(ALL_GROUPS)?;
    // `BPF_RET | BPF_K` with k = 0: keep no byte of any message.
    let mut ret_zero = [nix::libc::sock_filter { code: 0x06, jt: 0, jf: 0, k: 0 }];
    let program = nix::libc::sock_fprog { len: 1, filter: ret_zero.as_mut_ptr() };
    let len = nix::libc::socklen_t::try_from(std::mem::size_of::<nix::libc::sock_fprog>()).unwrap_or(nix::libc::socklen_t::MAX);
    // SAFETY: `program` points at `ret_zero`, both alive for the call; the kernel copies the
    // filter and keeps no pointer into them.
    let rc = unsafe { nix::libc::setsockopt(socket.as_raw_fd(), nix::libc::SOL_SOCKET, nix::libc::SO_ATTACH_FILTER, (&raw const program).cast(), len) };
    if rc != 0 {
        return Err(BpfError::Socket { op: "attach the classic drop-all filter", source: std::io::Error::last_os_error() });
    }
    Ok(socket)
}

/// A NETLINK_ROUTE socket in the calling thread's namespace, bound to `groups`: some of
/// `RTMGRP_LINK | RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_ROUTE` and the rule groups
/// (`RTNLGRP_IPV4_RULE` 8, `RTNLGRP_IPV6_RULE` 19: policy rule writes). With the route groups
/// it also joins `RTNLGRP_NEXTHOP` (so the filter knows which route notifications a nexthop
/// replace re-sent, see `routewarden_common::route_watch::NexthopNotice`). Non-blocking;
/// nothing reads it (the filter returns 0, so no message is ever queued).
fn route_socket(groups: u32) -> Result<OwnedFd, BpfError> {
    use rtnetlink::sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
    use std::os::fd::{FromRawFd, IntoRawFd};
    /// `RTNLGRP_NEXTHOP` (`include/uapi/linux/rtnetlink.h`; above 31, so joined, not bound).
    const RTNLGRP_NEXTHOP: u32 = 32;
    let mut sock = Socket::new(NETLINK_ROUTE).map_err(|e| BpfError::Socket { op: "socket(AF_NETLINK, NETLINK_ROUTE)", source: e })?;
    sock.bind(&SocketAddr::new(0, groups)).map_err(|e| BpfError::Socket { op: "bind to route groups", source: e })?;
    if groups & RTMGRP_IPV4_ROUTE != 0 {
        match sock.add_membership(RTNLGRP_NEXTHOP) {
            // Before 5.3 the group does not exist, and neither do nexthop objects.
            Err(e) if e.raw_os_error() == Some(nix::libc::EINVAL) => {}
            other => other.map_err(|e| BpfError::Socket { op: "join the nexthop group", source: e })?,
        }
    }
    sock.set_non_blocking(true).map_err(|e| BpfError::Socket { op: "set non-blocking", source: e })?;
    // SAFETY: the descriptor comes from `into_raw_fd`, which gives up its ownership.
    Ok(unsafe { OwnedFd::from_raw_fd(sock.into_raw_fd()) })
}
