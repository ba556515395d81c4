//! The kernel struct offsets the route-watch programs read at, resolved in userspace from
//! the running kernel's BTF and handed to the programs as load-time globals: a `no_std`
//! program cannot read BTF itself, and a kernel's layout is known only when it runs.

/// Kernel struct member offsets (bytes) the fentry/kprobe hooks read, resolved from the
/// running kernel's BTF at load time and passed in as the global `ROUTE_WATCH_OFFSETS`.
/// Names are `<struct>_<member>`; nested members are summed (e.g. `net_ns_inum` is
/// `offsetof(struct net, ns) + offsetof(struct ns_common, inum)`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    /// `struct net`: `ns.inum` (u32).
    pub net_ns_inum: u32,
    /// `struct fib_config`: `fc_dst_len` (u8).
    pub fc_dst_len: u32,
    /// `struct fib_config`: `fc_protocol` (u8).
    pub fc_protocol: u32,
    /// `struct fib_config`: `fc_table` (u32).
    pub fc_table: u32,
    /// `struct fib_config`: `fc_dst` (__be32).
    pub fc_dst: u32,
    /// `struct fib_config`: `fc_priority` (u32).
    pub fc_priority: u32,
    /// `struct fib_config`: `fc_oif` (int).
    pub fc_oif: u32,
    /// `struct fib_config`: `fc_gw4` (__be32, in the gateway union).
    pub fc_gw4: u32,
    /// `struct fib_config`: `fc_nlflags` (u16).
    pub fc_nlflags: u32,
    /// `struct fib_config`: `fc_nlinfo.portid` (u32).
    pub fc_portid: u32,
    /// `struct fib6_info`: `fib6_table` (pointer).
    pub f6i_table: u32,
    /// `struct fib6_table`: `tb6_id` (u32).
    pub tb6_id: u32,
    /// `struct fib6_info`: `fib6_dst.addr` (in6_addr).
    pub f6i_dst_addr: u32,
    /// `struct fib6_info`: `fib6_dst.plen` (int).
    pub f6i_dst_plen: u32,
    /// `struct fib6_info`: `fib6_metric` (u32).
    pub f6i_metric: u32,
    /// `struct fib6_info`: `fib6_protocol` (u8).
    pub f6i_protocol: u32,
    /// `struct fib6_info`: `fib6_nh[0].nh_common.nhc_gw.ipv6` (in6_addr).
    pub f6i_nh_gw: u32,
    /// `struct fib6_info`: `fib6_nh[0].nh_common.nhc_dev` (pointer to net_device).
    pub f6i_nh_dev: u32,
    /// `struct net_device`: `ifindex` (int).
    pub dev_ifindex: u32,
    /// `struct nl_info`: `nlh` (pointer to nlmsghdr, NULL for kernel-made changes).
    pub nli_nlh: u32,
    /// `struct nl_info`: `portid` (u32).
    pub nli_portid: u32,
    /// `struct nl_info`: `nl_net` (pointer to net).
    pub nli_net: u32,
    /// `struct fib6_info`: `nh` (pointer to the nexthop object the route goes through, NULL
    /// for a route with a next hop of its own); [`KernelOffsets::ABSENT`] on a kernel without
    /// nexthop objects (before 5.3).
    pub f6i_nh: u32,
    /// `struct fib_config`: `fc_nh_id` (u32, 0 without an object); [`KernelOffsets::ABSENT`]
    /// before 5.3.
    pub fc_nh_id: u32,
    /// `struct nexthop`: `id` (u32); [`KernelOffsets::ABSENT`] before 5.3.
    pub nh_id: u32,
    /// Set to 1 by userspace once every offset above is resolved.
    pub valid: u32,
}

impl KernelOffsets {
    /// An offset of a member this kernel does not have (only where the hooks can do without).
    pub const ABSENT: u32 = u32::MAX;

    /// All zero, `valid == 0`: the hooks count a decode error and ignore the write.
    pub const UNRESOLVED: KernelOffsets = KernelOffsets {
        net_ns_inum: 0,
        fc_dst_len: 0,
        fc_protocol: 0,
        fc_table: 0,
        fc_dst: 0,
        fc_priority: 0,
        fc_oif: 0,
        fc_gw4: 0,
        fc_nlflags: 0,
        fc_portid: 0,
        f6i_table: 0,
        tb6_id: 0,
        f6i_dst_addr: 0,
        f6i_dst_plen: 0,
        f6i_metric: 0,
        f6i_protocol: 0,
        f6i_nh_gw: 0,
        f6i_nh_dev: 0,
        dev_ifindex: 0,
        nli_nlh: 0,
        nli_portid: 0,
        nli_net: 0,
        f6i_nh: 0,
        fc_nh_id: 0,
        nh_id: 0,
        valid: 0,
    };
}

/// Offsets in `struct task_struct` (bytes) at which the route-watch programs read the process
/// that wrote (`bpf_get_current_task` + `bpf_probe_read_kernel`): the current task's thread
/// group leader, its tgid and its `comm` (the process's name, as `/proc/<pid>/comm` shows it;
/// a thread's own `comm` may differ: a tokio worker is `tokio-runtime-w`). Resolved from the
/// running kernel's BTF and passed in as the global `ROUTE_WATCH_TASK_OFFSETS`. 16 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskOffsets {
    /// `struct task_struct`: `tgid` (`pid_t`).
    pub tgid: u32,
    /// `struct task_struct`: `comm` (`char[16]`).
    pub comm: u32,
    /// `struct task_struct`: `group_leader` (pointer to `task_struct`).
    pub group_leader: u32,
    /// 1 once all three are resolved; 0: the socket filter names senders by netlink port only
    /// and fentry/kprobe take the current thread's `comm`.
    pub valid: u32,
}

impl TaskOffsets {
    /// All zero, `valid == 0`: senders stay netlink ports.
    pub const UNRESOLVED: TaskOffsets = TaskOffsets { tgid: 0, comm: 0, group_leader: 0, valid: 0 };
}
