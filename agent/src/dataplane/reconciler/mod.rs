//! [`Reconciler`]: desired vs kernel route state in the shape of Felix's routetable
//! (`felix/routetable/route_table.go`, reference §3).
//!
//! - State is keyed by [`RouteKey`] (table, family, dst, tos, metric), as the kernel keys it.
//! - [`Reconciler::set_desired`] only records which keys changed (cheap, no I/O).
//! - [`Reconciler::apply`] does the netlink work: a full resync when due (kernel-side filtered
//!   dump of our table and protocols: at start, every `resync_interval`, after errors), then
//!   writes (route replace for keys that hold our route, create-exclusive for keys that do not,
//!   so a foreign route at the same key is never overwritten), then deletes (only routes the
//!   [`OwnershipPolicy`] calls ours, only while the datastore is synced, never inside frozen
//!   ground, never for a prefix whose new route failed to write: the new route goes in before
//!   the old one goes out).
//! - Mass-deletion breaker: when one apply would delete more than a threshold of our routes
//!   (default half), each such delete waits until it has been wanted continuously for the
//!   settle period (default 30 s) — every desired set in between agreeing — so an emptied or
//!   truncated input, or an API server answering a re-list with nothing, costs no route, while
//!   a deliberate large change still converges one settle period later.
//! - [`Reconciler::handle_event`] folds netlink notifications in: a route of ours removed or
//!   flushed by a link going down is re-written on the next apply.
//! - Ownership handover: a route of a class being handed to another writer is kept until that
//!   writer's route for the prefix is seen in the kernel, at most `handover_grace`. A writer
//!   that cannot replace our route at its key (BIRD adds create-exclusive) gets the key freed
//!   make-before-break: ours is copied to metric+1, then the original deleted ("step aside");
//!   the copy is the pending handover.
//!
//! The reconciler owns the change tracking (`desired`, `kernel`, `dirty`) and the keys another
//! writer holds; the rest are parts with their own rules: the handover and step-aside state
//! (`Handovers`, `handover.rs`), the link cache (`Links`, `links.rs`), per-key retries and the
//! resync schedule (`Retries`, `ResyncTimer`, `retry.rs`), the mass-deletion breaker
//! (`MassDeletionBreaker`, `breaker.rs`) and the report's per-class counts kept between
//! applies (`Tally`, `tally.rs`), each a file in this folder. The write and delete
//! passes of one apply are in `apply.rs`; what an apply did is an [`ApplyReport`]
//! (`report.rs`). Its unit tests are in `tests.rs` and `tests/`.
//!
//! Change tracking is not a generic delta tracker like Felix's `felix/deltatracker` (desired
//! and dataplane maps whose pending updates and deletions follow from comparing the two
//! values): whether a desired route is in sync depends on more than the two entries — on the
//! link cache at apply time (the device's ifindex, and whether it is up) and on whether the
//! kernel entry was re-verified since its link went down or up — and a key that must wait
//! (its device is down, or its delete waits for the datastore to sync or for frozen ground to
//! thaw) leaves the `dirty` set on purpose until the event that can change the answer marks
//! it again, so an apply looks only at keys that may have changed. A tracker whose pending
//! sets follow from the two maps alone can express neither, so `dirty` is kept by hand.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use ipnet::IpNet;
use itertools::{EitherOrBoth, Itertools};

use crate::dataplane::kernel::netlink::{Clock, NetlinkError, RouteNetlink};
use crate::dataplane::kernel::route::{ConversionError, KernelRoute, RouteKey, RouteSettings};
use crate::dataplane::kernel::watcher::DataplaneEvent;
use crate::dataplane::reconciler::breaker::MassDeletionBreaker;
use crate::dataplane::reconciler::handover::{Handover, Handovers};
use crate::dataplane::reconciler::links::Links;
use crate::dataplane::reconciler::report::{ApplyReport, ErrorKind};
use crate::dataplane::reconciler::retry::{ResyncTimer, Retries};
use crate::dataplane::settings::DataplaneConfig;
use crate::ownership::{OwnershipPolicy, Verdict};
use crate::routes::{ClusterRoute, RouteMap};
use crate::vocabulary::PoolClass;
use dirty::DirtyKeys;

mod apply;
pub(super) mod breaker;
mod convert;
mod delta;
mod desired;
mod dirty;
pub mod handover;
pub(super) mod links;
mod nexthops;
pub mod report;
pub(super) mod retry;
mod tally;

#[cfg(test)]
mod tests;

use convert::{convert_route, convert_routes};
use desired::DesiredSet;
use nexthops::Nexthops;
use tally::{Recorded, Tally};

/// Attempts of a dump that the kernel marked interrupted (Felix `routeListFilterAttempts`).
const DUMP_ATTEMPTS: u32 = 5;

/// A route of ours in the kernel, as the reconciler last saw or wrote it.
#[derive(Clone, Debug)]
struct KernelEntry {
    /// The route with its device named at observation time (renames update it).
    route: KernelRoute,
    /// Its output device's ifindex.
    oif: Option<u32>,
    /// The nexthop object it goes through (`RTA_NH_ID`).
    nexthop: Option<u32>,
    /// Attributes we never write are present.
    extra: bool,
    /// False after the route's link went down/up: the kernel may have flushed it silently
    /// (IPv4), so it is re-written with a replace even if it looks equal.
    verified: bool,
    /// Why the policy calls it ours (reported when a write overwrites a foreign protocol).
    verdict: Verdict,
}

/// The route reconciler. `N` talks to the kernel, `C` tells the time.
pub struct Reconciler<N, C> {
    config: DataplaneConfig,
    /// Protocol, metric, table and devices of the routes we write.
    settings: RouteSettings,
    policy: OwnershipPolicy,
    nl: N,
    clock: C,
    /// What we want in the kernel (the last desired set).
    desired: DesiredSet,
    /// What we believe is in the kernel: routes the policy calls ours only.
    kernel: Recorded<KernelEntry>,
    /// Keys the next apply looks at (desired and kernel state may differ there).
    dirty: DirtyKeys,
    /// [`DirtyKeys::removals`] when `set_desired` had just marked every desired key (nothing
    /// desired before): while the reading is the same, every desired key is still dirty.
    every_desired_dirty: Option<u64>,
    retries: Retries,
    /// Keys a route we may not overwrite holds, each with whether the hold was reported.
    blocked: Recorded<bool>,
    /// The report's per-class counts, kept between applies (`tally.rs`).
    tally: Tally,
    handovers: Handovers,
    /// Desired routes that could not be converted (reported by every apply).
    bad_desired: Vec<ConversionError>,
    links: Links,
    resync: ResyncTimer,
    /// Whether the datastore view is complete (no deletes while false).
    datastore_synced: bool,
    breaker: MassDeletionBreaker,
    /// Nexthop objects (`--nexthop-objects`; without it, only ours left over are removed).
    nexthops: Nexthops,
    /// The plan's routes the desired set was last made from by
    /// [`set_desired_routes`](Self::set_desired_routes), with whether nexthop objects were on:
    /// the next map is compared with it chunk by chunk (`delta.rs`).
    last_routes: Option<(RouteMap, bool)>,
}

impl<N: RouteNetlink, C: Clock> Reconciler<N, C> {
    /// A reconciler with nothing desired; the first [`apply`](Self::apply) resyncs.
    /// The datastore counts as not synced until [`set_datastore_synced`](Self::set_datastore_synced).
    pub fn new(config: DataplaneConfig, policy: OwnershipPolicy, nl: N, clock: C) -> Self {
        let now = clock.now();
        Reconciler {
            settings: config.route_settings(),
            resync: ResyncTimer::new(now),
            breaker: MassDeletionBreaker::new(config.mass_deletion_percent, config.settle),
            handovers: Handovers::new(config.handover_grace),
            nexthops: Nexthops::new(config.nexthop_objects, config.protocol),
            last_routes: None,
            config,
            policy,
            nl,
            clock,
            desired: DesiredSet::default(),
            kernel: Recorded::default(),
            dirty: DirtyKeys::default(),
            retries: Retries::default(),
            blocked: Recorded::default(),
            tally: Tally::default(),
            every_desired_dirty: None,
            bad_desired: Vec::new(),
            links: Links::default(),
            datastore_synced: false,
        }
    }

    /// Whether `dst` overlaps the policy's frozen ground (no route there is deleted).
    fn is_frozen(&self, dst: &IpNet) -> bool {
        self.policy.frozen.iter().any(|f| f.contains(dst) || dst.contains(f))
    }

    /// The netlink collaborator (tests inspect the fake kernel through it).
    pub fn netlink(&self) -> &N {
        &self.nl
    }

    /// The current ownership policy.
    pub fn policy(&self) -> &OwnershipPolicy {
        &self.policy
    }

    /// Replace the ownership policy; a full resync follows on the next apply (routes may have
    /// become ours or stopped being ours, and deletes held in frozen ground are looked at
    /// again).
    pub fn set_policy(&mut self, policy: OwnershipPolicy) {
        if policy != self.policy {
            self.policy = policy;
            self.request_resync();
        }
    }

    /// Whether the datastore view is complete (the last [`set_datastore_synced`](Self::set_datastore_synced)).
    pub fn datastore_synced(&self) -> bool {
        self.datastore_synced
    }

    /// Whether the datastore view is complete. While false, nothing is deleted.
    pub fn set_datastore_synced(&mut self, synced: bool) {
        if synced && !self.datastore_synced {
            // Deletes held back meanwhile become due.
            self.dirty.extend(self.kernel.keys().filter(|k| !self.desired.contains_key(k)).copied());
        }
        self.datastore_synced = synced;
    }

    /// Ask for a full resync on the next apply.
    pub fn request_resync(&mut self) {
        self.resync.request(self.clock.now());
    }

    /// Set the complete desired route set. Records deltas only; no I/O.
    pub fn set_desired(&mut self, routes: &[ClusterRoute]) {
        self.set_desired_with_handover(routes, &[]);
    }

    /// Set the complete desired route set; routes of a class listed in `handovers` that leave
    /// the set are kept until the new owner's route is seen (or the grace period ends).
    ///
    /// Duplicate destinations: the first route in [`ClusterRoute`] order wins (Felix resolves a
    /// key to one target too); conversion failures are reported by the next apply.
    pub fn set_desired_with_handover(&mut self, routes: &[ClusterRoute], handovers: &[Handover]) {
        let nexthops = self.nexthops.enabled();
        self.last_routes = None;
        self.bad_desired.clear();
        // Converted in the order given. Keys strictly ascending and no failure (the plan's
        // routes: sorted, one per destination) is the set as it is; otherwise the order
        // given must be ClusterRoute order, which decides the winner of a duplicate key and
        // the order failures are reported in (checked only then; sorted and converted again
        // if not).
        let (mut converted, mut distinct) = convert_routes(routes.iter(), &self.settings, nexthops, &mut self.bad_desired);
        if !(distinct && self.bad_desired.is_empty() || routes.is_sorted()) {
            let mut copy: Vec<&ClusterRoute> = routes.iter().collect();
            copy.sort();
            self.bad_desired.clear();
            converted = convert_routes(copy.into_iter(), &self.settings, nexthops, &mut self.bad_desired).0;
            distinct = false;
        }
        if !distinct {
            // The first route of a key in ClusterRoute order wins: the sort is stable and
            // `dedup_by` keeps the first of each run.
            if !converted.is_sorted_by(|a, b| a.route.key <= b.route.key) {
                converted.sort_by_key(|d| d.route.key);
            }
            converted.dedup_by(|later, first| later.route.key == first.route.key);
        }
        let next = DesiredSet::from_sorted(converted);
        // The old and the new set walked together in key order (no search per key): removed
        // keys with their class, and added or changed keys (sorted; all of them on a cold
        // start).
        let mut removed: Vec<(RouteKey, PoolClass)> = Vec::new();
        let cold = self.desired.is_empty();
        let changed: Vec<RouteKey> = if cold {
            // Nothing desired before (a cold start): every key is added, copied in one pass.
            next.keys().copied().collect()
        } else {
            let mut changed = Vec::with_capacity(next.len().saturating_sub(self.desired.len()).max(16));
            for pair in self.desired.iter().merge_join_by(next.iter(), |(a, _), (b, _)| a.cmp(b)) {
                match pair {
                    EitherOrBoth::Left((key, old)) => removed.push((*key, old.class)),
                    EitherOrBoth::Right((key, _)) => changed.push(*key),
                    EitherOrBoth::Both((key, old), (_, new)) if old != new => changed.push(*key),
                    EitherOrBoth::Both(..) => {}
                }
            }
            changed
        };
        self.take_desired(next, removed, changed, handovers, cold);
    }

    /// Make `next` the desired set: `removed` (keys that left it, with their class) are
    /// marked, or handed over when their class is in `handovers`; `changed` (keys added or
    /// changed, ascending) are marked for the next apply. Nothing desired before (a cold start)
    /// marks every key (`cold`).
    fn take_desired(&mut self, next: DesiredSet, removed: Vec<(RouteKey, PoolClass)>, changed: Vec<RouteKey>, handovers: &[Handover], cold: bool) {
        let now = self.clock.now();
        if self.nexthops.enabled() {
            self.nexthops.set_wanted(next.values());
        }
        self.tally.desired_changed(removed.iter().map(|(key, _)| *key));
        for (key, class) in removed {
            self.dirty.insert(key);
            let Some(h) = handovers.iter().find(|h| h.class == class) else {
                continue;
            };
            if !self.kernel.contains_key(&key) {
                continue;
            }
            if h.protocol == self.policy.protocol && h.table == self.policy.table {
                // Same protocol and table: the new owner adopts our route in place.
                self.kernel.remove(&key);
                self.dirty.remove(&key);
                self.handovers.release(&key, h.to);
            } else {
                self.handovers.begin(key, h, now);
            }
        }
        // Each walk only when there is something to find (a cold start has neither): with no
        // handover pending no key resumes one, with no retry waiting none is cleared.
        if self.handovers.any_pending() {
            for key in next.keys() {
                // A prefix we program again: a stepped-aside copy of it goes once the new route
                // is in (plan_deletes holds it if that write fails).
                if let Some(copy) = self.handovers.resume(key, now) {
                    self.dirty.insert(copy);
                }
            }
        }
        // Added or changed keys (ascending, each once) marked in one pass; `desired` becomes
        // `next`.
        if !self.retries.is_empty() {
            for key in &changed {
                self.retries.clear(key);
            }
        }
        if cold {
            self.tally.desired_replaced();
        } else {
            self.tally.desired_changed(changed.iter().copied());
        }
        self.dirty.add_sorted(changed);
        self.every_desired_dirty = cold.then(|| self.dirty.removals());
        self.desired = next;
    }

    /// Fold one netlink notification into the kernel view; marks keys for the next apply.
    pub fn handle_event(&mut self, event: &DataplaneEvent) {
        match event {
            DataplaneEvent::RouteAdded { route, .. } => {
                if route.cloned {
                    return;
                }
                let route = self.nexthops.resolve(route);
                let route = route.as_ref();
                let named = self.links.name(route);
                self.dirty.extend(self.handovers.route_seen(&named.key.dst, named.target.protocol, named.key.table));
                let verdict = self.policy.verdict(&named);
                let key = named.key;
                if verdict.is_ours() {
                    self.kernel.insert(key, KernelEntry { route: named, oif: route.oif, nexthop: route.nexthop, extra: route.extra, verified: true, verdict });
                    self.blocked.remove(&key);
                    self.dirty.insert(key);
                } else if key.table == self.policy.table && (self.kernel.contains_key(&key) || self.desired.contains_key(&key)) {
                    // Another writer took the key: never fight it, report it.
                    self.kernel.remove(&key);
                    self.blocked.get_or_insert(key, false);
                    self.dirty.insert(key);
                }
            }
            DataplaneEvent::RouteRemoved { route, .. } => {
                let key = route.key;
                if self.kernel.get(&key).is_some_and(|e| e.route.target.protocol == route.protocol) {
                    self.kernel.remove(&key);
                    self.dirty.insert(key);
                }
                if self.blocked.remove(&key).is_some() {
                    self.retries.clear(&key);
                    self.dirty.insert(key);
                }
            }
            DataplaneEvent::LinkUp { index, name } => self.link_changed(*index, name, true),
            DataplaneEvent::LinkDown { index, name } => self.link_changed(*index, name, false),
            DataplaneEvent::LinkRenamed { index, old, new } => {
                self.links.forget_name(old);
                let up = self.links.is_up(*index);
                self.link_changed(*index, new, up);
                self.mark_device_dirty(old);
            }
            DataplaneEvent::LinkRemoved { index, name } => {
                self.links.remove(*index, name);
                self.nexthops.link_changed(*index);
                // The kernel removes every route through a device that goes away.
                self.forget_kernel_routes(|e| e.oif == Some(*index));
                self.mark_device_dirty(name);
            }
            DataplaneEvent::LinkCarrier { index, name, carrier } => {
                if *carrier {
                    // Nexthop objects can be written on the link again: no backoff from the
                    // writes refused meanwhile.
                    self.nexthops.carrier_back(*index);
                } else {
                    // The kernel flushed the nexthop objects on the link and the routes
                    // through them (IPv4 ones silently); classic routes stay.
                    self.nexthops.carrier_lost(*index);
                    self.forget_kernel_routes(|e| e.oif == Some(*index) && e.nexthop.is_some());
                }
                self.mark_device_dirty(name);
            }
            DataplaneEvent::NexthopChanged { nexthop } => {
                if self.nexthops.changed_by_another(nexthop) {
                    // Another writer replaced an object of ours: our routes through it go
                    // elsewhere now. A resync finds out whose it is (ours again in place, or
                    // left to them and ours moved to a new id).
                    self.request_resync();
                }
            }
            DataplaneEvent::NexthopRemoved { id } => {
                if self.nexthops.removed(*id) {
                    // The kernel took the routes through it, IPv4 ones without a word.
                    self.forget_kernel_routes(|e| e.nexthop == Some(*id));
                }
            }
            // The kernel flushes routes that depended on a removed IPv4 address without a word,
            // and they can be written again once an address is back: a resync finds out which
            // (within the driver's debounce, not at the next periodic resync).
            DataplaneEvent::AddressChanged { .. } | DataplaneEvent::Overrun => self.request_resync(),
        }
    }

    /// Routes of ours the kernel removed without telling (`gone` says which): out of the
    /// kernel view, and looked at by the next apply (which writes them again if desired).
    fn forget_kernel_routes(&mut self, gone: impl Fn(&KernelEntry) -> bool) {
        let keys: Vec<RouteKey> = self.kernel.iter().filter(|(_, e)| gone(e)).map(|(k, _)| *k).collect();
        for k in keys {
            self.kernel.remove(&k);
            self.dirty.insert(k);
        }
    }

    fn link_changed(&mut self, index: u32, name: &str, up: bool) {
        let Some(change) = self.links.update(index, name, up) else {
            return;
        };
        if change.maybe_flushed {
            // The kernel removes nexthop objects on a link that goes down.
            self.nexthops.link_changed(index);
        }
        if let Some(old) = &change.old_name {
            self.mark_device_dirty(old);
        }
        // Routes through this link: renamed device, or possibly flushed without notification
        // (IPv4 on down); re-verify them with a replace.
        let dirty = &mut self.dirty;
        self.kernel.change_each(|k, e| {
            if e.oif != Some(index) {
                return false;
            }
            e.route.target.device = Some(name.into());
            e.verified &= !change.maybe_flushed;
            dirty.insert(*k);
            true
        });
        self.mark_device_dirty(name);
    }

    fn mark_device_dirty(&mut self, name: &str) {
        for (k, d) in self.desired.iter() {
            if d.route.target.device.as_deref() == Some(name) {
                self.retries.clear(k);
                self.dirty.insert(*k);
            }
        }
    }

    /// Whether an apply has work: dirty keys whose retry time has come, or a due resync.
    pub fn needs_apply(&self) -> bool {
        let now = self.clock.now();
        self.resync.is_due(now) || self.dirty.iter().any(|k| !self.retries.waiting(k, now)) || self.nexthops.retry_at().is_some_and(|at| at <= now)
    }

    /// When [`apply`](Self::apply) should run next if nothing else happens: the resync timer,
    /// the earliest retry, or the earliest handover deadline.
    pub fn next_wakeup(&self) -> Instant {
        let mut t = self.resync.due();
        // The earliest retry of a dirty key, walking the smaller of the two sets: the driver
        // asks after every event, and a cold start's own route notifications make each of its
        // routes dirty in turn (a walk of the dirty keys per event was O(routes²) there).
        let retry = if self.retries.len() <= self.dirty.len() {
            self.retries.earliest_where(|k| self.dirty.contains(k))
        } else {
            self.retries.earliest_of(self.dirty.iter())
        };
        if let Some(at) = retry {
            t = t.min(at);
        }
        if let Some(deadline) = self.handovers.next_deadline() {
            t = t.min(deadline);
        }
        if let Some(release) = self.breaker.next_release() {
            t = t.min(release);
        }
        if let Some(retry) = self.nexthops.retry_at() {
            t = t.min(retry);
        }
        t
    }

    /// Full resync: refresh links, dump the nexthop objects, dump our table (both families in
    /// one request) for each protocol the policy may own, keep the routes the policy calls
    /// ours, and mark every key whose kernel state may differ from the desired state.
    async fn full_resync(&mut self, report: &mut ApplyReport) -> Result<(), NetlinkError> {
        let started = self.clock.now();
        let links = self.nl.dump_links().await?;
        self.links.replace(&links);
        // Nexthop objects first (in classic mode too, so ours left over from nexthop mode are
        // removed once no route goes through them): routes through ours are named with the
        // object's gateway and device.
        let dumped = self.nl.dump_nexthops().await;
        self.nexthops.resync(dumped, report);
        let mut fresh: BTreeMap<RouteKey, KernelEntry> = BTreeMap::new();
        // One dump per protocol, both families in it.
        for protocol in self.policy.dump_protocols() {
            let mut attempt = 0;
            let routes = loop {
                attempt += 1;
                match self.nl.dump_routes_both_families(self.policy.table, protocol).await {
                    Ok(r) => break r,
                    Err(NetlinkError::DumpInterrupted { .. }) if attempt < DUMP_ATTEMPTS => {
                        *report.errors.entry(ErrorKind::DumpInterrupted).or_default() += 1;
                    }
                    Err(e) => return Err(e),
                }
            };
            for r in routes.iter().filter(|r| !r.cloned) {
                let r = self.nexthops.resolve(r);
                let named = self.links.name(&r);
                let verdict = self.policy.verdict(&named);
                if verdict.is_ours() {
                    fresh.insert(named.key, KernelEntry { route: named, oif: r.oif, nexthop: r.nexthop, extra: r.extra, verified: true, verdict });
                }
            }
        }
        // A key we thought foreign-held that is ours after all (written meanwhile, or claimed
        // by a new policy): retry it at once.
        for k in fresh.keys() {
            if self.blocked.remove(k).is_some() {
                self.retries.clear(k);
            }
        }
        // Mark and sweep: everything desired or found is re-examined by the apply. The three
        // key sets and the dirty set are each in order: one merged walk finds the keys not yet
        // dirty, added in one pass. Two-way merges, not a k-way merge of boxed iterators: this
        // walk runs before a cold start's first write. Both kernel sets empty: the
        // desired keys alone (already unique), and no walk at all while every one of them is
        // known to be dirty (a cold start: set_desired marked them and none has left since).
        let marked = if !(fresh.is_empty() && self.kernel.is_empty()) {
            Some(itertools::Either::Right(self.desired.keys().merge(fresh.keys()).merge(self.kernel.keys()).dedup()))
        } else if self.every_desired_dirty == Some(self.dirty.removals()) {
            None
        } else {
            Some(itertools::Either::Left(self.desired.keys()))
        };
        let missing: Vec<RouteKey> =
            marked.map(|keys| keys.merge_join_by(self.dirty.iter(), Ord::cmp).filter_map(|pair| pair.just_left().copied()).collect()).unwrap_or_default();
        self.dirty.add_sorted(missing);
        self.kernel.replace_all(fresh);
        self.adopt_stepped_aside();
        report.resynced = true;
        report.resync_duration = Some(self.clock.now().saturating_duration_since(started));
        Ok(())
    }

    /// Routes of ours at our metric+1 that nothing desires are step-aside copies left by a
    /// hand-over to BIRD that an earlier run (or an earlier apply) did not finish: each becomes
    /// a pending handover to BIRD ([`Handovers::adopt_step_aside_copy`]).
    fn adopt_stepped_aside(&mut self) {
        let Some(metric) = self.settings.metric.checked_add(1) else {
            return;
        };
        let now = self.clock.now();
        for (key, e) in self.kernel.iter() {
            if key.metric == metric && e.route.target.protocol == self.policy.protocol && !self.desired.contains_key(key) {
                self.handovers.adopt_step_aside_copy(*key, now);
            }
        }
    }

    /// Check pending handovers against the kernel once (the new owner may have been there
    /// before we started to hand over). A failed dump is checked again on the next apply.
    async fn check_handovers(&mut self) {
        for (family, table, protocol) in self.handovers.unchecked() {
            let Ok(routes) = self.nl.dump_routes(family, table, protocol).await else {
                continue;
            };
            let dsts: BTreeSet<IpNet> = routes.iter().filter(|r| !r.cloned).map(|r| r.key.dst).collect();
            self.dirty.extend(self.handovers.checked(family, table, protocol, &dsts));
        }
    }
}
