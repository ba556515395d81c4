//! The reconciler's nexthop objects (`--nexthop-objects`): which object each (remote node, IP
//! pool) goes through, which objects in the kernel are ours, the writes that make them match
//! the desired routes, and which of ours may be deleted.
//!
//! Rules (module docs of [`crate::dataplane::kernel::nexthop`]):
//! - Ids come from [`NEXTHOP_IDS`], never one the last dump showed held, and are written
//!   create-exclusive, so an object of another writer is never overwritten. An object of ours
//!   whose gateway, device or onlink flag differs from its routes' is replaced in place: the
//!   routes through it follow without a route write.
//! - After a restart, a (node, pool) takes back the id its first route already goes through,
//!   so a restart writes nothing.
//! - Nothing is written before a nexthop dump succeeded (ids could collide); a route whose
//!   object is not in the kernel as wanted is written classic (reachability first).
//! - An object of ours is deleted only when no (node, pool) wants it, no route of ours goes
//!   through it, and a dump of every table finds no route through it (the kernel deletes the
//!   routes through an object with it).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Instant;

use nix::errno::Errno;

use super::KernelEntry;
use crate::dataplane::kernel::netlink::NetlinkError;
use crate::dataplane::kernel::nexthop::{NexthopKey, NexthopOp, ObservedNexthop, NEXTHOP_IDS};
use crate::dataplane::kernel::route::{DesiredRoute, ObservedRoute, RouteKey, RouteKind};
use crate::dataplane::reconciler::links::Links;
use crate::dataplane::reconciler::report::{ApplyReport, ErrorKind};
use crate::dataplane::reconciler::retry::backoff;

/// What one (node, pool)'s object should be: its routes' gateway, device and onlink flag, and
/// the first of its routes (whose nexthop id in the kernel is taken back after a restart).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Wanted {
    gateway: IpAddr,
    device: Option<std::sync::Arc<str>>,
    onlink: bool,
    first: RouteKey,
}

/// Nexthop objects: wanted, assigned, ours in the kernel, and ids held by others.
#[derive(Debug)]
pub(super) struct Nexthops {
    enabled: bool,
    protocol: u8,
    wanted: BTreeMap<NexthopKey, Wanted>,
    /// The id each (node, pool) goes through.
    assigned: BTreeMap<NexthopKey, u32>,
    /// Our objects in the kernel, as last dumped or written.
    ours: BTreeMap<u32, ObservedNexthop>,
    /// Ids the last dump showed held by objects that are not ours.
    foreign: BTreeSet<u32>,
    /// A nexthop dump succeeded since the start: the ids in use are known.
    known: bool,
    /// After failed writes: consecutive failures and when to try again.
    failures: u32,
    retry_at: Option<Instant>,
    /// Unused objects of ours a route of another writer goes through: looked at again after
    /// the next resync, not on every apply (each look is a dump of every table).
    used_by_others: BTreeSet<u32>,
    /// Links (ifindexes) without a carrier: the kernel refuses objects on them (`ENETDOWN`,
    /// `rtm_to_nh_config`: "Carrier for nexthop device is down") while classic routes stay.
    /// Learned from a refusal or a carrier event; no object is written on them, and their
    /// nodes' routes stay classic, until the carrier comes back (an event), the link changes,
    /// or the next resync tries once more. Not an error: nothing is wrong with what we write.
    no_carrier: BTreeSet<u32>,
}

impl Nexthops {
    pub(super) fn new(enabled: bool, protocol: u8) -> Nexthops {
        Nexthops {
            enabled,
            protocol,
            wanted: BTreeMap::new(),
            assigned: BTreeMap::new(),
            ours: BTreeMap::new(),
            foreign: BTreeSet::new(),
            known: false,
            failures: 0,
            retry_at: None,
            used_by_others: BTreeSet::new(),
            no_carrier: BTreeSet::new(),
        }
    }

    /// Whether routes go through nexthop objects (`--nexthop-objects`).
    pub(super) fn enabled(&self) -> bool {
        self.enabled
    }

    /// Take the desired routes' objects: per (node, pool), the first route's gateway, device
    /// and onlink flag. A (node, pool) no longer wanted loses its id (the object goes once no
    /// route uses it).
    pub(super) fn set_wanted<'a>(&mut self, desired: impl Iterator<Item = &'a DesiredRoute>) {
        let mut wanted = BTreeMap::new();
        for d in desired {
            let (Some(key), Some(gateway)) = (&d.nexthop, d.route.target.gateway) else { continue };
            wanted.entry(key.clone()).or_insert_with(|| Wanted {
                gateway,
                device: d.route.target.device.clone(),
                onlink: d.route.target.onlink,
                first: d.route.key,
            });
        }
        self.assigned.retain(|k, _| wanted.contains_key(k));
        self.wanted = wanted;
    }

    /// Fold a nexthop dump in (a full resync): our objects and the ids others hold. A failed
    /// dump (a kernel before 5.3 answers `EOPNOTSUPP`) leaves the kernel's ids unknown, so
    /// nothing is written or deleted until one succeeds.
    pub(super) fn resync(&mut self, dumped: Result<Vec<ObservedNexthop>, NetlinkError>, report: &mut ApplyReport) {
        match dumped {
            Ok(all) => {
                let (ours, foreign): (Vec<_>, Vec<_>) = all.into_iter().partition(|n| n.is_ours(self.protocol));
                self.foreign = foreign.into_iter().map(|n| n.id).collect();
                self.ours = ours.into_iter().map(|n| (n.id, n)).collect();
                // An id another writer took meanwhile is given up (a new one is allocated).
                let foreign = &self.foreign;
                self.assigned.retain(|_, id| !foreign.contains(id));
                self.known = true;
                self.used_by_others.clear();
                // A carrier that came back without an event is found by one more try.
                self.no_carrier.clear();
                self.failures = 0;
                self.retry_at = None;
            }
            Err(e) => {
                self.known = false;
                if self.enabled {
                    report.error(ErrorKind::of(&e), || format!("nexthop objects unavailable, routes stay classic: {e}"));
                }
            }
        }
    }

    /// `route` with the gateway, device and onlink flag of the object of ours it goes through,
    /// when the kernel left them out (`nexthop_compat_mode` 0).
    pub(super) fn resolve<'a>(&self, route: &'a ObservedRoute) -> std::borrow::Cow<'a, ObservedRoute> {
        route.through(&self.ours)
    }

    /// The id a route goes through if its object is in the kernel with the route's gateway,
    /// device (`oif`) and onlink flag; `None` otherwise (the route is written classic).
    pub(super) fn ready(&self, d: &DesiredRoute, oif: Option<u32>) -> Option<u32> {
        if !self.enabled || d.route.target.kind != RouteKind::Unicast {
            return None;
        }
        let id = *self.assigned.get(d.nexthop.as_ref()?)?;
        let nh = self.ours.get(&id)?;
        (nh.gateway == d.route.target.gateway && nh.oif == oif && oif.is_some() && nh.onlink == d.route.target.onlink).then_some(id)
    }

    /// Whether a retry after failed writes is due (or none is waiting).
    pub(super) fn retry_at(&self) -> Option<Instant> {
        self.retry_at
    }

    /// The object writes this apply needs: for each wanted (node, pool) whose device is up
    /// and has a carrier, its id (kept, taken back from its first route after a restart, or a
    /// free one) and a write if the kernel's object differs. Nothing while ids are unknown or
    /// a retry waits. Objects waiting for a carrier are counted per device in `report`.
    pub(super) fn pending_ops(&mut self, links: &Links, kernel: &BTreeMap<RouteKey, KernelEntry>, now: Instant, report: &mut ApplyReport) -> Vec<NexthopOp> {
        if !self.enabled || !self.known || self.retry_at.is_some_and(|at| now < at) {
            return Vec::new();
        }
        let mut taken: BTreeSet<u32> = self.assigned.values().copied().collect();
        let mut next_free = *NEXTHOP_IDS.start();
        let mut ops = Vec::new();
        let mut pending_assign = Vec::new();
        for (key, w) in &self.wanted {
            let Ok(Some(oif)) = links.resolve(w.device.as_deref()) else { continue };
            if self.no_carrier.contains(&oif) {
                waiting_for_carrier(report, links, oif);
                continue;
            }
            let id = if let Some(id) = self.assigned.get(key) {
                *id
            } else {
                // Taken back from the first route after a restart, else the first free id.
                let adopted = kernel.get(&w.first).and_then(|e| e.nexthop).filter(|id| self.ours.contains_key(id) && !taken.contains(id));
                while taken.contains(&next_free) || self.ours.contains_key(&next_free) || self.foreign.contains(&next_free) {
                    next_free += 1;
                }
                let Some(id) = adopted.or_else(|| NEXTHOP_IDS.contains(&next_free).then_some(next_free)) else {
                    continue; // every id is in use: the routes stay classic
                };
                taken.insert(id);
                pending_assign.push((key.clone(), id));
                id
            };
            let current = self.ours.get(&id);
            if current.is_some_and(|n| n.gateway == Some(w.gateway) && n.oif == Some(oif) && n.onlink == w.onlink) {
                continue;
            }
            ops.push(NexthopOp::Write { id, gateway: w.gateway, oif, onlink: w.onlink, protocol: self.protocol, exclusive: current.is_none() });
        }
        self.assigned.extend(pending_assign);
        ops
    }

    /// Fold the results of [`plan`](Self::plan)'s writes in; returns the ids written (the
    /// routes through them are looked at again). A create refused with `EEXIST` marks the id
    /// held by another writer and gives it up; a refusal for lack of a carrier (`ENETDOWN`) marks
    /// the link to wait for it (counted in `report` by device name from `links`, no error); any
    /// other failure waits a backoff before the next writes.
    pub(super) fn record_writes(
        &mut self,
        ops: &[NexthopOp],
        results: Vec<Result<(), NetlinkError>>,
        links: &Links,
        now: Instant,
        report: &mut ApplyReport,
    ) -> BTreeSet<u32> {
        let mut written = BTreeSet::new();
        let mut failed = false;
        for (op, res) in ops.iter().zip(results) {
            let NexthopOp::Write { id, gateway, oif, onlink, protocol, exclusive } = op else { continue };
            match res {
                Ok(()) => {
                    report.nexthop_writes += 1;
                    let nh = ObservedNexthop { id: *id, protocol: *protocol, gateway: Some(*gateway), oif: Some(*oif), onlink: *onlink, other: false };
                    self.ours.insert(*id, nh);
                    written.insert(*id);
                }
                Err(e) if e.errno() == Some(Errno::ENETDOWN) => {
                    // The link is up (plan resolved it) but has no carrier.
                    self.no_carrier.insert(*oif);
                    waiting_for_carrier(report, links, *oif);
                }
                Err(e) => {
                    failed = true;
                    report.nexthop_write_errors += 1;
                    report.error(ErrorKind::of(&e), || e.to_string());
                    if *exclusive && e.errno() == Some(Errno::EEXIST) {
                        self.foreign.insert(*id);
                        self.assigned.retain(|_, a| a != id);
                    }
                }
            }
        }
        if failed {
            self.failures += 1;
            self.retry_at = Some(now + backoff(self.failures));
        } else if !ops.is_empty() {
            self.failures = 0;
            self.retry_at = None;
        }
        written
    }

    /// Our objects no (node, pool) is assigned and no route of ours in `kernel` goes through:
    /// candidates for deletion, still to be checked against every table.
    pub(super) fn unused(&self, kernel: &BTreeMap<RouteKey, KernelEntry>) -> Vec<u32> {
        if !self.known {
            return Vec::new();
        }
        let assigned: BTreeSet<u32> = self.assigned.values().copied().collect();
        let mut unused: BTreeSet<u32> = self.ours.keys().filter(|id| !assigned.contains(id) && !self.used_by_others.contains(id)).copied().collect();
        if unused.is_empty() {
            return Vec::new();
        }
        for e in kernel.values() {
            if let Some(id) = e.nexthop {
                unused.remove(&id);
            }
        }
        unused.into_iter().collect()
    }

    /// Unused objects of ours that a route of another writer goes through: kept, and not
    /// looked at again before the next resync.
    pub(super) fn used_by_others(&mut self, ids: impl IntoIterator<Item = u32>) {
        self.used_by_others.extend(ids);
    }

    /// Fold delete results in: deleted and already gone (`ENOENT`) objects leave the view.
    pub(super) fn record_deletes(&mut self, ids: &[u32], results: Vec<Result<(), NetlinkError>>, report: &mut ApplyReport) {
        for (id, res) in ids.iter().zip(results) {
            match res {
                Ok(()) => report.nexthop_deletes += 1,
                Err(e) if e.errno() == Some(Errno::ENOENT) => {}
                Err(e) => {
                    report.nexthop_delete_errors += 1;
                    report.error(ErrorKind::of(&e), || e.to_string());
                    continue;
                }
            }
            self.ours.remove(id);
        }
    }

    /// Nexthop object `id` was deleted (a notification); returns whether it was ours. A
    /// wanted one is written again, create-exclusive, by the next apply.
    pub(super) fn removed(&mut self, id: u32) -> bool {
        self.used_by_others.remove(&id);
        self.ours.remove(&id).is_some()
    }

    /// Whether `seen` (a notification) is an object of ours that no longer is what we wrote:
    /// another protocol, gateway, device or onlink flag. Our own writes' notifications match
    /// (an old one overtaken by a newer write of ours only costs a resync).
    pub(super) fn changed_by_another(&self, seen: &ObservedNexthop) -> bool {
        self.ours.get(&seen.id).is_some_and(|ours| ours != seen)
    }

    /// Link `index` regained its carrier: objects on it may be written at once (a refusal for
    /// want of one set no backoff).
    pub(super) fn carrier_back(&mut self, index: u32) {
        self.no_carrier.remove(&index);
    }

    /// Link `index` lost its carrier: the kernel flushed the objects on it
    /// ([`link_changed`](Self::link_changed)) and refuses new ones until the carrier is back.
    pub(super) fn carrier_lost(&mut self, index: u32) {
        self.link_changed(index);
        self.no_carrier.insert(index);
    }

    /// A link went away, down or up: the kernel removes the nexthop objects on it
    /// (`nexthop_flush_dev`); ours on it are written again (create-exclusive) when wanted. Its
    /// carrier is not known: the next write finds out.
    pub(super) fn link_changed(&mut self, index: u32) {
        self.ours.retain(|_, n| n.oif != Some(index));
        self.no_carrier.remove(&index);
    }
}

/// Count one object on link `oif` (named from `links`) as waiting for its carrier.
fn waiting_for_carrier(report: &mut ApplyReport, links: &Links, oif: u32) {
    let device = links.name_of(oif).map_or_else(|| oif.to_string(), ToString::to_string);
    *report.nexthops_waiting_for_carrier.entry(device).or_default() += 1;
}
