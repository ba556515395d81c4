//! [`NetNsGuard`]: a fresh network namespace for the current thread.

use std::fs::File;
use std::marker::PhantomData;
use std::os::fd::AsFd;
use std::process::Command;

use anyhow::{bail, Context, Result};
use nix::sched::{setns, unshare, CloneFlags};

/// Moves the calling thread into a new, empty network namespace with `lo` up, and moves it
/// back into the namespace it came from when dropped.
///
/// Network namespaces are per thread, so the guard is `!Send`: it must be dropped on the
/// thread that created it. Anything the thread creates meanwhile (netlink sockets, child
/// processes such as `ip`, threads of a tokio runtime built after the guard) lives in the new
/// namespace; sockets keep their namespace after the guard is dropped.
pub struct NetNsGuard {
    previous: File,
    // Not Send, not Sync: a namespace switch applies to the creating thread only.
    _not_send: PhantomData<*const ()>,
}

impl NetNsGuard {
    /// Unshare the network namespace of the current thread and bring `lo` up.
    ///
    /// # Errors
    /// Fails without root (`EPERM` from `unshare(CLONE_NEWNET)`), or if `ip link set lo up`
    /// fails in the new namespace (in which case the thread is moved back first).
    pub fn new() -> Result<Self> {
        let previous = File::open("/proc/thread-self/ns/net").context("open /proc/thread-self/ns/net")?;
        unshare(CloneFlags::CLONE_NEWNET).context("unshare(CLONE_NEWNET) (needs root)")?;
        let guard = NetNsGuard { previous, _not_send: PhantomData };
        let status = Command::new("ip").args(["link", "set", "lo", "up"]).status().context("run `ip link set lo up`")?;
        if !status.success() {
            bail!("`ip link set lo up` in the new namespace exited with {status}");
        }
        Ok(guard)
    }

    /// Run `ip <args>` inside this namespace and return its stdout.
    ///
    /// # Errors
    /// Fails if `ip` cannot be started or exits non-zero (stderr is in the error).
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        crate::lab::run_ip(None, args)
    }
}

impl Drop for NetNsGuard {
    fn drop(&mut self) {
        if let Err(e) = setns(self.previous.as_fd(), CloneFlags::CLONE_NEWNET) {
            // Staying in the test namespace is harmless for the host but would confuse later
            // tests on this thread; make it loud.
            eprintln!("NetNsGuard: failed to restore the previous network namespace: {e}");
        }
    }
}
