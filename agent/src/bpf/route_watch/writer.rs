//! Writer resolution: netlink port id -> process (pid, command name), best effort, cached.
//!
//! The socket-filter backend only knows the sending socket's netlink port id
//! (`nlmsg_pid`). `/proc/<tid>/net/netlink` maps port ids of the watched namespace to socket
//! inodes (`NETLINK_ROUTE` is protocol 0); `/proc/*/fd/*` links `socket:[inode]` to a
//! process. A writer that already exited (one `ip route replace`) cannot be resolved: the
//! event then carries the port id only (for `ip` and most tools it equals the writer's PID).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A resolved writer process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessInfo {
    /// Process id.
    pub pid: u32,
    /// Command name (`/proc/<pid>/comm`).
    pub comm: String,
}

/// Parse `/proc/net/netlink`: NETLINK_ROUTE (protocol 0) port id -> socket inode.
///
/// Shape: a header line, then `sk Eth Pid Groups Rmem Wmem Dump Locks Drops Inode`, with
/// `Pid` the port id printed unsigned.
pub fn parse_proc_net_netlink(text: &str) -> HashMap<u32, u64> {
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (eth, port, inode) = (f.get(1)?, f.get(2)?, f.get(9)?);
            (*eth == "0").then_some(())?;
            Some((port.parse().ok()?, inode.parse().ok()?))
        })
        .filter(|&(port, _)| port != 0)
        .collect()
}

/// Find the process holding `socket:[inode]` under `proc_root` (normally `/proc`).
pub fn find_socket_owner(proc_root: &Path, inode: u64) -> Option<ProcessInfo> {
    let want = format!("socket:[{inode}]");
    for entry in std::fs::read_dir(proc_root).ok()?.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else { continue };
        for fd in fds.flatten() {
            if std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == want.as_str()) {
                let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default().trim().to_string();
                return Some(ProcessInfo { pid, comm });
            }
        }
    }
    None
}

/// Cached port-id resolver. Hits are kept 60 s, misses 5 s (a process that exited stays
/// unresolved; a new one with a reused port id is found after the miss expires).
#[derive(Debug)]
pub struct PortResolver {
    netlink_table: PathBuf,
    proc_root: PathBuf,
    cache: HashMap<u32, (Instant, Option<ProcessInfo>)>,
}

const HIT_TTL: Duration = Duration::from_mins(1);
const MISS_TTL: Duration = Duration::from_secs(5);

impl PortResolver {
    /// Resolve port ids of the network namespace of the calling thread (the table is read
    /// through that thread's `/proc/<pid>/task/<tid>/net/netlink`, which stays valid while the
    /// thread lives; the process-wide `/proc/net/netlink` is used if that path is gone).
    pub fn for_current_thread() -> PortResolver {
        let tid = nix::unistd::gettid();
        let path = PathBuf::from(format!("/proc/{}/task/{tid}/net/netlink", std::process::id()));
        PortResolver::new(path, PathBuf::from("/proc"))
    }

    /// A resolver reading `netlink_table` and scanning `proc_root` (tests use fixtures).
    pub fn new(netlink_table: PathBuf, proc_root: PathBuf) -> PortResolver {
        PortResolver { netlink_table, proc_root, cache: HashMap::new() }
    }

    /// The process behind netlink port `port`, if it can be found.
    pub fn resolve(&mut self, port: u32) -> Option<ProcessInfo> {
        let now = Instant::now();
        if let Some((at, hit)) = self.cache.get(&port) {
            let ttl = if hit.is_some() { HIT_TTL } else { MISS_TTL };
            if now.duration_since(*at) < ttl {
                return hit.clone();
            }
        }
        let table = std::fs::read_to_string(&self.netlink_table)
            .or_else(|_| std::fs::read_to_string("/proc/net/netlink"))
            .unwrap_or_default();
        let found = parse_proc_net_netlink(&table).get(&port).and_then(|&inode| find_socket_owner(&self.proc_root, inode));
        if self.cache.len() > 4096 {
            self.cache.clear();
        }
        self.cache.insert(port, (now, found.clone()));
        found
    }

    /// Fill `pid`/`comm` of a writer known only by its port id.
    pub fn enrich(&mut self, w: &mut super::event::WriterInfo) {
        if let (Some(port), None) = (w.netlink_port, w.pid) {
            if let Some(p) = self.resolve(port) {
                w.pid = Some(p.pid);
                w.comm = Some(p.comm);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
sk               Eth Pid        Groups   Rmem     Wmem     Dump  Locks    Drops    Inode
0000000000000000 0   4242       00000441 0        0        0     2        0        777001
0000000000000000 0   4294963200 00000000 0        0        0     2        0        777002
0000000000000000 9   4242       00000000 0        0        0     2        0        777003
0000000000000000 0   0          00000000 0        0        0     2        0        777004
garbage line
";

    #[test]
    fn parses_route_sockets_only() {
        let m = parse_proc_net_netlink(TABLE);
        assert_eq!(m.get(&4242), Some(&777_001));
        assert_eq!(m.get(&4_294_963_200), Some(&777_002), "negative port ids print unsigned");
        assert_eq!(m.len(), 2, "audit (9) and kernel (port 0) sockets are skipped: {m:?}");
    }

    /// A fake /proc: pid 31 holds socket 777001 as fd 5; resolution finds it, caches it, and
    /// reports an unknown port as None.
    #[test]
    fn resolves_through_fake_proc_and_caches() {
        let dir = std::env::temp_dir().join(format!("rw-resolver-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("proc/31/fd")).unwrap();
        std::fs::create_dir_all(dir.join("proc/self/fd")).unwrap();
        std::fs::write(dir.join("proc/31/comm"), "bird\n").unwrap();
        std::os::unix::fs::symlink("socket:[777001]", dir.join("proc/31/fd/5")).unwrap();
        std::os::unix::fs::symlink("/dev/null", dir.join("proc/31/fd/0")).unwrap();
        std::fs::write(dir.join("netlink"), TABLE).unwrap();
        let mut r = PortResolver::new(dir.join("netlink"), dir.join("proc"));
        assert_eq!(r.resolve(4242), Some(ProcessInfo { pid: 31, comm: "bird".into() }));
        assert_eq!(r.resolve(4_294_963_200), None);
        assert_eq!(r.resolve(5), None);
        // Cached: removing the fixture does not change the answer within the TTL.
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(r.resolve(4242).map(|p| p.pid), Some(31));
    }
}
