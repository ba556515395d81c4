//! Test doubles: a fake kernel FIB behind [`RouteNetlink`] and a manual [`Clock`], so the
//! reconciler and what drives it are tested without root or a network namespace.
//!
//! Built for this crate's unit tests, and for other crates' tests with the agent's
//! `test-support` feature. The fake keeps routes, links and nexthop objects in a
//! [`FakeState`] shared by every clone (a "restarted" reconciler sees the same kernel), logs
//! every change as text, and injects the faults its fields name.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ipnet::IpNet;
use nix::errno::Errno;

use crate::dataplane::kernel::netlink::{nexthop_target, ChunkPlace, Clock, Executed, LinkInfo, NetlinkError, NetlinkOp, RouteNetlink, RouteOp};
use crate::dataplane::kernel::nexthop::{NexthopOp, ObservedNexthop};
use crate::dataplane::kernel::route::{Family, ObservedRoute, RouteKey};

/// A manually advanced clock; clones share the time.
#[derive(Clone, Debug)]
pub struct FakeClock(Arc<Mutex<Instant>>);

impl FakeClock {
    /// A clock at the current instant.
    pub fn new() -> Self {
        FakeClock(Arc::new(Mutex::new(Instant::now())))
    }
    /// Move the clock (and every clone) forward by `d`.
    ///
    /// # Panics
    /// If a test panicked while holding the fake's lock (it is poisoned).
    pub fn advance(&self, d: Duration) {
        *self.0.lock().unwrap() += d;
    }
}

impl Default for FakeClock {
    fn default() -> Self {
        FakeClock::new()
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Instant {
        *self.0.lock().unwrap()
    }
}

/// The fake kernel state; shared between clones so a "restarted" reconciler sees it.
#[derive(Debug, Default)]
pub struct FakeState {
    /// The routes in the fake kernel, by key.
    pub routes: BTreeMap<RouteKey, ObservedRoute>,
    /// Links by ifindex.
    pub links: BTreeMap<u32, LinkInfo>,
    /// Every successful change, in order: `replace <key>`, `create <key>`, `delete <key>`.
    pub log: Vec<String>,
    /// Route dumps answered.
    pub dumps: usize,
    /// Fail the next writes to these destinations with this errno (count down).
    pub fail_writes: HashMap<IpNet, (Errno, usize)>,
    /// Mark the next N route dumps interrupted.
    pub interrupt_dumps: usize,
    /// Fail every route dump with this errno.
    pub dump_errno: Option<Errno>,
    /// Fail the next route dump with this errno (one shot).
    pub dump_errno_once: Option<Errno>,
    /// Fail the next N route writes, whatever their destination, with this errno.
    pub fail_next_writes: Option<(Errno, usize)>,
    /// The connection breaks after this many more route ops: every op after it in the same
    /// call fails with [`NetlinkError::Connection`] (one shot; the next call has a new one).
    pub connection_lost_after: Option<usize>,
    /// The next route write through this ifindex finds the link gone: the link is removed
    /// (the write fails `ENODEV`) and `vanished` keeps it until the test puts it back.
    pub vanish_link_on_write: Option<u32>,
    /// Links removed by `vanish_link_on_write`.
    pub vanished: Vec<LinkInfo>,
    /// Exclusive creates refused with EEXIST (another writer's route holds the key), in order.
    pub refused: Vec<RouteKey>,
    /// Nexthop objects by id.
    pub nexthops: BTreeMap<u32, ObservedNexthop>,
    /// Nexthop changes, in order: `create nhid N`, `replace nhid N`, `delete nhid N`.
    pub nexthop_log: Vec<String>,
    /// Fail every nexthop dump with this errno (a kernel without nexthop objects).
    pub nexthop_dump_errno: Option<Errno>,
    /// Writes per chunk of a write pass; `None`: [`FAKE_WRITE_CHUNK`].
    pub write_chunk: Option<usize>,
    /// The chunk of a write pass handed in last and not returned yet (applied already).
    pub open_chunk: Option<Executed>,
    /// Ops per chunk handed in, in order.
    pub chunk_sizes: Vec<usize>,
}

/// The fake's chunk of a write pass: small, so that every reconciler test runs its passes
/// pipelined over several chunks as [`RtNetlink`](crate::dataplane::kernel::netlink::RtNetlink) does with 10,000
/// routes.
pub const FAKE_WRITE_CHUNK: usize = 2;

/// A route as another writer (or the kernel) would have it in the fake kernel: `gateway`
/// routes are onlink, table main, TOS 0.
///
/// # Panics
/// If `dst` or `gateway` is not a prefix or address.
pub fn observed(
    dst: &str,
    metric: u32,
    protocol: u8,
    gateway: Option<&str>,
    oif: Option<u32>,
    kind: crate::dataplane::kernel::route::RouteKind,
) -> ObservedRoute {
    ObservedRoute {
        key: RouteKey::new(254, dst.parse().unwrap(), 0, metric),
        kind,
        gateway: gateway.map(|g| g.parse().unwrap()),
        oif,
        onlink: gateway.is_some(),
        nexthop: None,
        protocol,
        scope: 0,
        extra: false,
        cloned: false,
    }
}

/// The fake kernel behind [`RouteNetlink`]; clones share one [`FakeState`].
#[derive(Clone, Debug, Default)]
pub struct FakeNetlink(pub Arc<Mutex<FakeState>>);

impl FakeNetlink {
    /// A fake kernel with these links `(ifindex, name)`, all up, and no routes.
    ///
    /// # Panics
    /// If a test panicked while holding the fake's lock (it is poisoned).
    pub fn with_links(links: &[(u32, &str)]) -> Self {
        let f = FakeNetlink::default();
        {
            let mut s = f.0.lock().unwrap();
            for (i, n) in links {
                s.links.insert(*i, LinkInfo { index: *i, name: (*n).to_string(), up: true });
            }
        }
        f
    }
    /// The shared state, locked.
    ///
    /// # Panics
    /// If a test panicked while holding the fake's lock (it is poisoned).
    pub fn state(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.0.lock().unwrap()
    }
    /// Insert a route as another writer would.
    pub fn insert(&self, r: ObservedRoute) {
        self.state().routes.insert(r.key, r);
    }
    /// Every change logged since the last call, in order.
    pub fn take_log(&self) -> Vec<String> {
        std::mem::take(&mut self.state().log)
    }
}

impl RouteNetlink for FakeNetlink {
    fn write_chunk(&self) -> usize {
        self.state().write_chunk.unwrap_or(FAKE_WRITE_CHUNK)
    }

    /// Pipelined as [`RtNetlink`](crate::dataplane::kernel::netlink::RtNetlink) is: the chunk's ops are applied
    /// at once (the kernel has them) and the chunk comes back from the next call, or from this
    /// one if it is the pass's last.
    async fn execute_chunk(&mut self, ops: Vec<RouteOp>, place: ChunkPlace) -> Vec<Executed> {
        let mut done = Vec::new();
        let before = {
            let mut s = self.state();
            s.chunk_sizes.push(ops.len());
            s.open_chunk.take()
        };
        // One left by a dropped pass is not this pass's.
        done.extend(before.filter(|_| !place.first));
        if !ops.is_empty() {
            let results = self.execute(&ops).await;
            let chunk = Executed { ops, results };
            if place.last {
                done.push(chunk);
            } else {
                self.state().open_chunk = Some(chunk);
            }
        }
        done
    }

    fn dump_routes(&mut self, family: Family, table: u32, protocol: u8) -> impl std::future::Future<Output = Result<Vec<ObservedRoute>, NetlinkError>> + Send {
        let mut s = self.0.lock().unwrap();
        s.dumps += 1;
        let res = if let Some(errno) = s.dump_errno.or_else(|| s.dump_errno_once.take()) {
            Err(NetlinkError::Kernel { op: NetlinkOp::DumpRoutes, target: "fake".into(), errno })
        } else if s.interrupt_dumps > 0 {
            s.interrupt_dumps -= 1;
            Err(NetlinkError::DumpInterrupted { op: NetlinkOp::DumpRoutes, target: "fake".into() })
        } else {
            Ok(s.routes.values().filter(|r| r.key.family == family && r.key.table == table && (protocol == 0 || r.protocol == protocol)).cloned().collect())
        };
        std::future::ready(res)
    }

    fn dump_links(&mut self) -> impl std::future::Future<Output = Result<Vec<LinkInfo>, NetlinkError>> + Send {
        std::future::ready(Ok(self.0.lock().unwrap().links.values().cloned().collect()))
    }

    fn execute(&mut self, ops: &[RouteOp]) -> impl std::future::Future<Output = Vec<Result<(), NetlinkError>>> + Send {
        let mut s = self.0.lock().unwrap();
        let mut out = Vec::new();
        for op in ops {
            let err = |op: NetlinkOp, key: &RouteKey, errno| Err(NetlinkError::Kernel { op, target: key.to_string(), errno });
            match s.connection_lost_after {
                Some(0) => {
                    out.push(Err(NetlinkError::Connection { op: NetlinkOp::WriteRoute, reason: "fake: the socket closed mid-batch".into() }));
                    continue;
                }
                Some(n) => s.connection_lost_after = Some(n - 1),
                None => {}
            }
            match op {
                RouteOp::Write { route, oif, nexthop, exclusive } => {
                    let key = route.key;
                    if let Some((errno, n)) = s.fail_next_writes.as_mut() {
                        if *n > 0 {
                            *n -= 1;
                            let errno = *errno;
                            out.push(err(NetlinkOp::WriteRoute, &key, errno));
                            continue;
                        }
                    }
                    if oif.is_some() && *oif == s.vanish_link_on_write {
                        s.vanish_link_on_write = None;
                        if let Some(l) = oif.and_then(|i| s.links.remove(&i)) {
                            s.routes.retain(|_, r| r.oif != Some(l.index));
                            s.vanished.push(l);
                        }
                    }
                    if let Some((errno, n)) = s.fail_writes.get_mut(&key.dst) {
                        if *n > 0 {
                            *n -= 1;
                            out.push(err(NetlinkOp::WriteRoute, &key, *errno));
                            continue;
                        }
                    }
                    if let Some(i) = oif {
                        match s.links.get(i) {
                            None => {
                                out.push(err(NetlinkOp::WriteRoute, &key, Errno::ENODEV));
                                continue;
                            }
                            Some(l) if !l.up => {
                                out.push(err(NetlinkOp::WriteRoute, &key, Errno::ENETDOWN));
                                continue;
                            }
                            _ => {}
                        }
                    }
                    if *exclusive && s.routes.contains_key(&key) {
                        s.refused.push(key);
                        out.push(err(NetlinkOp::WriteRoute, &key, Errno::EEXIST));
                        continue;
                    }
                    let t = &route.target;
                    let mut observed = ObservedRoute {
                        key,
                        kind: t.kind,
                        gateway: t.gateway,
                        oif: *oif,
                        onlink: t.onlink,
                        nexthop: *nexthop,
                        protocol: t.protocol,
                        scope: t.scope,
                        extra: false,
                        cloned: false,
                    };
                    if let Some(id) = nexthop {
                        // The kernel takes gateway, device and onlink from the object and
                        // reports them (nexthop_compat_mode).
                        let Some(nh) = s.nexthops.get(id) else {
                            out.push(err(NetlinkOp::WriteRoute, &key, Errno::EINVAL));
                            continue;
                        };
                        (observed.gateway, observed.oif, observed.onlink) = (nh.gateway, nh.oif, nh.onlink);
                    }
                    let verb = if s.routes.contains_key(&key) { "replace" } else { "create" };
                    s.log.push(format!("{verb} {key}"));
                    s.routes.insert(key, observed);
                    out.push(Ok(()));
                }
                RouteOp::Delete { key, protocol } => match s.routes.get(key) {
                    Some(r) if r.protocol == *protocol => {
                        s.routes.remove(key);
                        s.log.push(format!("delete {key}"));
                        out.push(Ok(()));
                    }
                    _ => out.push(err(NetlinkOp::DeleteRoute, key, Errno::ESRCH)),
                },
            }
        }
        if s.connection_lost_after == Some(0) {
            s.connection_lost_after = None;
        }
        std::future::ready(out)
    }

    fn dump_nexthops(&mut self) -> impl std::future::Future<Output = Result<Vec<ObservedNexthop>, NetlinkError>> + Send {
        let s = self.state();
        std::future::ready(match s.nexthop_dump_errno {
            Some(errno) => Err(NetlinkError::Kernel { op: NetlinkOp::DumpNexthops, target: "all".into(), errno }),
            None => Ok(s.nexthops.values().cloned().collect()),
        })
    }

    /// Kernel semantics: a replace re-points every route through the object; a delete removes
    /// them with it.
    fn execute_nexthops(&mut self, ops: &[NexthopOp]) -> impl std::future::Future<Output = Vec<Result<(), NetlinkError>>> + Send {
        let mut s = self.0.lock().unwrap();
        let mut out = Vec::new();
        for op in ops {
            let err = |op: NetlinkOp, id: u32, errno| Err(NetlinkError::Kernel { op, target: nexthop_target(id), errno });
            match op {
                NexthopOp::Write { id, gateway, oif, onlink, protocol, exclusive } => {
                    if !s.links.get(oif).is_some_and(|l| l.up) {
                        out.push(err(NetlinkOp::WriteNexthop, *id, Errno::ENODEV));
                        continue;
                    }
                    let exists = s.nexthops.contains_key(id);
                    if *exclusive && exists {
                        out.push(err(NetlinkOp::WriteNexthop, *id, Errno::EEXIST));
                        continue;
                    }
                    let nh = ObservedNexthop { id: *id, protocol: *protocol, gateway: Some(*gateway), oif: Some(*oif), onlink: *onlink, other: false };
                    for r in s.routes.values_mut().filter(|r| r.nexthop == Some(*id)) {
                        (r.gateway, r.oif, r.onlink) = (nh.gateway, nh.oif, nh.onlink);
                    }
                    s.nexthops.insert(*id, nh);
                    s.nexthop_log.push(format!("{} nhid {id}", if exists { "replace" } else { "create" }));
                    out.push(Ok(()));
                }
                NexthopOp::Delete { id } => {
                    if s.nexthops.remove(id).is_none() {
                        out.push(err(NetlinkOp::DeleteNexthop, *id, Errno::ENOENT));
                        continue;
                    }
                    s.routes.retain(|_, r| r.nexthop != Some(*id));
                    s.nexthop_log.push(format!("delete nhid {id}"));
                    out.push(Ok(()));
                }
            }
        }
        std::future::ready(out)
    }

    fn nexthops_in_use(&mut self, ids: &[u32]) -> impl std::future::Future<Output = Result<std::collections::BTreeSet<u32>, NetlinkError>> + Send {
        std::future::ready(Ok(self.state().routes.values().filter_map(|r| r.nexthop).filter(|id| ids.contains(id)).collect()))
    }
}
