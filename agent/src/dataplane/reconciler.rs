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
//! ([`Handovers`], `handover.rs`), the link cache ([`Links`], `links.rs`), per-key retries and
//! the resync schedule ([`Retries`], [`ResyncTimer`], `retry.rs`) and the mass-deletion breaker
//! ([`MassDeletionBreaker`], `breaker.rs`); what an apply did is an [`ApplyReport`]
//! (`report.rs`).
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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Instant;

use ipnet::IpNet;
use nix::errno::Errno;

use super::breaker::MassDeletionBreaker;
use super::config::DataplaneConfig;
use super::events::DataplaneEvent;
use super::handover::{DeleteGate, Handover, Handovers};
use super::kernel_route::{to_kernel_route, ConversionError, DesiredRoute, Family, KernelRoute, RouteKey, RouteKind, RouteSettings};
use super::links::Links;
use super::netlink::{Clock, NetlinkError, RouteNetlink, RouteOp};
use super::policy::{OwnershipPolicy, Verdict};
use super::report::{ApplyReport, Conflict, ErrorKind, Overwrite};
use super::retry::{backoff, ResyncTimer, Retries};
use crate::routes::ClusterRoute;

/// Attempts of a dump that the kernel marked interrupted (Felix `routeListFilterAttempts`).
const DUMP_ATTEMPTS: u32 = 5;

/// A route of ours in the kernel, as the reconciler last saw or wrote it.
#[derive(Clone, Debug)]
struct KernelEntry {
    /// The route with its device named at observation time (renames update it).
    route: KernelRoute,
    /// Its output device's ifindex.
    oif: Option<u32>,
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
    desired: BTreeMap<RouteKey, DesiredRoute>,
    /// What we believe is in the kernel: routes the policy calls ours only.
    kernel: BTreeMap<RouteKey, KernelEntry>,
    /// Keys the next apply looks at (desired and kernel state may differ there).
    dirty: BTreeSet<RouteKey>,
    retries: Retries,
    /// Keys a route we may not overwrite holds, each with whether the hold was reported.
    blocked: BTreeMap<RouteKey, bool>,
    handovers: Handovers,
    /// Desired routes that could not be converted (reported by every apply).
    bad_desired: Vec<ConversionError>,
    links: Links,
    resync: ResyncTimer,
    /// Whether the datastore view is complete (no deletes while false).
    datastore_synced: bool,
    breaker: MassDeletionBreaker,
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
            config,
            policy,
            nl,
            clock,
            desired: BTreeMap::new(),
            kernel: BTreeMap::new(),
            dirty: BTreeSet::new(),
            retries: Retries::default(),
            blocked: BTreeMap::new(),
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

    /// Mutable access to the netlink collaborator.
    pub fn netlink_mut(&mut self) -> &mut N {
        &mut self.nl
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

    /// Whether the datastore view is complete. While false, nothing is deleted.
    pub fn set_datastore_synced(&mut self, synced: bool) {
        if synced && !self.datastore_synced {
            // Deletes held back meanwhile become due.
            self.dirty.extend(self.kernel.keys().filter(|k| !self.desired.contains_key(k)));
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
        let now = self.clock.now();
        let mut sorted: Vec<&ClusterRoute> = routes.iter().collect();
        sorted.sort();
        let mut next: BTreeMap<RouteKey, DesiredRoute> = BTreeMap::new();
        self.bad_desired.clear();
        for r in sorted {
            match to_kernel_route(r, &self.settings) {
                Ok(d) => {
                    next.entry(d.route.key).or_insert(d);
                }
                Err(e) => self.bad_desired.push(e),
            }
        }
        // Removed keys.
        let removed: Vec<RouteKey> = self.desired.keys().filter(|k| !next.contains_key(k)).copied().collect();
        for key in removed {
            let old = self.desired.remove(&key);
            self.dirty.insert(key);
            let Some(old) = old else { continue };
            let Some(h) = handovers.iter().find(|h| h.class == old.class) else {
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
        // Added or changed keys.
        for (key, d) in next {
            // A prefix we program again: a stepped-aside copy of it goes once the new route is
            // in (plan_deletes holds it if that write fails).
            if let Some(copy) = self.handovers.resume(&key, now) {
                self.dirty.insert(copy);
            }
            if self.desired.get(&key) != Some(&d) {
                self.retries.clear(&key);
                self.dirty.insert(key);
                self.desired.insert(key, d);
            }
        }
    }

    /// Fold one netlink notification into the kernel view; marks keys for the next apply.
    pub fn handle_event(&mut self, event: &DataplaneEvent) {
        match event {
            DataplaneEvent::RouteAdded { route, .. } => {
                if route.cloned {
                    return;
                }
                let named = self.links.name(route);
                self.dirty.extend(self.handovers.route_seen(&named.key.dst, named.target.protocol, named.key.table));
                let verdict = self.policy.verdict(&named);
                let key = named.key;
                if verdict.is_ours() {
                    self.kernel.insert(key, KernelEntry { route: named, oif: route.oif, extra: route.extra, verified: true, verdict });
                    self.blocked.remove(&key);
                    self.dirty.insert(key);
                } else if key.table == self.policy.table && (self.kernel.contains_key(&key) || self.desired.contains_key(&key)) {
                    // Another writer took the key: never fight it, report it.
                    self.kernel.remove(&key);
                    self.blocked.entry(key).or_insert(false);
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
                // The kernel removes every route through a device that goes away.
                let gone: Vec<RouteKey> = self.kernel.iter().filter(|(_, e)| e.oif == Some(*index)).map(|(k, _)| *k).collect();
                for k in gone {
                    self.kernel.remove(&k);
                    self.dirty.insert(k);
                }
                self.mark_device_dirty(name);
            }
            DataplaneEvent::Overrun => self.request_resync(),
        }
    }

    fn link_changed(&mut self, index: u32, name: &str, up: bool) {
        let Some(change) = self.links.update(index, name, up) else {
            return;
        };
        if let Some(old) = &change.old_name {
            self.mark_device_dirty(old);
        }
        // Routes through this link: renamed device, or possibly flushed without notification
        // (IPv4 on down); re-verify them with a replace.
        for (k, e) in &mut self.kernel {
            if e.oif == Some(index) {
                e.route.target.device = Some(name.to_string());
                e.verified &= !change.maybe_flushed;
                self.dirty.insert(*k);
            }
        }
        self.mark_device_dirty(name);
    }

    fn mark_device_dirty(&mut self, name: &str) {
        for (k, d) in &self.desired {
            if d.route.target.device.as_deref() == Some(name) {
                self.retries.clear(k);
                self.dirty.insert(*k);
            }
        }
    }

    /// Whether an apply has work: dirty keys whose retry time has come, or a due resync.
    pub fn needs_apply(&self) -> bool {
        let now = self.clock.now();
        self.resync.is_due(now) || self.dirty.iter().any(|k| !self.retries.waiting(k, now))
    }

    /// When [`apply`](Self::apply) should run next if nothing else happens: the resync timer,
    /// the earliest retry, or the earliest handover deadline.
    pub fn next_wakeup(&self) -> Instant {
        let mut t = self.resync.due();
        for k in &self.dirty {
            if let Some(at) = self.retries.not_before(k) {
                t = t.min(at);
            }
        }
        if let Some(deadline) = self.handovers.next_deadline() {
            t = t.min(deadline);
        }
        if let Some(release) = self.breaker.next_release() {
            t = t.min(release);
        }
        t
    }

    /// Routes of ours the reconciler believes are in the kernel, `ip route` form, sorted.
    pub fn kernel_view(&self) -> Vec<String> {
        self.kernel.values().map(|e| e.route.to_string()).collect()
    }

    /// Full resync: refresh links, dump our table for each family and each protocol the
    /// policy may own, keep the routes the policy calls ours, and mark every key whose kernel
    /// state may differ from the desired state.
    async fn full_resync(&mut self, report: &mut ApplyReport) -> Result<(), NetlinkError> {
        let started = self.clock.now();
        let links = self.nl.dump_links().await?;
        self.links.replace(&links);
        let mut fresh: BTreeMap<RouteKey, KernelEntry> = BTreeMap::new();
        for family in [Family::V4, Family::V6] {
            for protocol in self.policy.dump_protocols() {
                let mut attempt = 0;
                let routes = loop {
                    attempt += 1;
                    match self.nl.dump_routes(family, self.policy.table, protocol).await {
                        Ok(r) => break r,
                        Err(NetlinkError::DumpInterrupted { .. }) if attempt < DUMP_ATTEMPTS => {
                            *report.errors.entry(ErrorKind::DumpInterrupted).or_default() += 1;
                        }
                        Err(e) => return Err(e),
                    }
                };
                for r in routes.iter().filter(|r| !r.cloned) {
                    let named = self.links.name(r);
                    let verdict = self.policy.verdict(&named);
                    if verdict.is_ours() {
                        fresh.insert(named.key, KernelEntry { route: named, oif: r.oif, extra: r.extra, verified: true, verdict });
                    }
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
        // Mark and sweep: everything desired or found is re-examined by the apply.
        self.dirty.extend(self.desired.keys().copied());
        self.dirty.extend(fresh.keys().copied());
        self.dirty.extend(self.kernel.keys().copied());
        self.kernel = fresh;
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
        for (key, e) in &self.kernel {
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

    /// Whether kernel entry `k` is desired route `d` written through `oif`: same type,
    /// protocol and scope, and (unless a blackhole) same gateway, onlink flag and device;
    /// re-verified since its link went down or up, and with no attribute we never write.
    fn in_sync(d: &KernelRoute, oif: Option<u32>, k: &KernelEntry) -> bool {
        let (dt, kt) = (&d.target, &k.route.target);
        k.verified
            && !k.extra
            && dt.kind == kt.kind
            && dt.protocol == kt.protocol
            && dt.scope == kt.scope
            && match dt.kind {
                RouteKind::Blackhole => true,
                _ => dt.gateway == kt.gateway && dt.onlink == kt.onlink && oif == k.oif,
            }
    }

    /// A write or delete at `key` failed: retry it after the backoff.
    fn fail(&mut self, key: RouteKey) {
        self.retries.fail(key, self.clock.now());
    }

    /// Do the netlink work: resync if due, then writes, then deletes. Never fails as a whole;
    /// everything that went wrong is in the report and is retried later.
    pub async fn apply(&mut self) -> ApplyReport {
        let started = self.clock.now();
        let mut report = ApplyReport::default();
        for e in &self.bad_desired {
            report.error(ErrorKind::BadDesiredRoute, || e.to_string());
        }
        if self.resync.is_due(started) {
            match self.full_resync(&mut report).await {
                Ok(()) => self.resync.succeeded(self.clock.now(), self.config.resync_interval),
                Err(e) => {
                    self.resync.failed(self.clock.now());
                    report.resync_failed = true;
                    report.error(ErrorKind::of(&e), || e.to_string());
                    self.finish_report(&mut report, started);
                    return report;
                }
            }
        }
        if self.links.take_refresh() && !report.resynced {
            match self.nl.dump_links().await {
                Ok(links) => self.links.replace(&links),
                Err(e) => report.error(ErrorKind::of(&e), || e.to_string()),
            }
        }
        self.check_handovers().await;
        let now = self.clock.now();
        // Deletes the breaker held come back for another look.
        self.dirty.extend(self.breaker.held().copied());
        // Pass 1: writes. Pass 2: deletes, after the new routes are in.
        let (mut writes, delete_candidates) = self.plan(now, &mut report);
        let step_asides = self.plan_step_asides(&delete_candidates, now);
        writes.extend(step_asides.iter().map(|(op, _)| op.clone()));
        let results = if writes.is_empty() { Vec::new() } else { self.nl.execute(&writes).await };
        let failed_dsts = self.record_writes(&writes, results, &step_asides, now, &mut report);
        let deletes = self.plan_deletes(delete_candidates, &failed_dsts, now, &mut report);
        let results = if deletes.is_empty() { Vec::new() } else { self.nl.execute(&deletes).await };
        self.record_deletes(&deletes, results, &mut report);
        let kernel = &self.kernel;
        self.handovers.finish(self.clock.now(), |k| kernel.contains_key(k), &mut report.handovers);
        self.finish_report(&mut report, started);
        report
    }

    /// Sort the dirty keys into writes (desired, not in sync) and delete candidates (ours,
    /// not desired); drop keys that need nothing.
    fn plan(&mut self, now: Instant, report: &mut ApplyReport) -> (Vec<RouteOp>, Vec<RouteKey>) {
        let mut writes: Vec<RouteOp> = Vec::new();
        let mut delete_candidates: Vec<RouteKey> = Vec::new();
        let dirty: Vec<RouteKey> = self.dirty.iter().copied().collect();
        for key in dirty {
            if self.retries.waiting(&key, now) {
                continue;
            }
            match (self.desired.get(&key), self.kernel.get(&key)) {
                (Some(d), k) => {
                    let oif = match self.links.resolve(d.route.target.device.as_deref()) {
                        Ok(oif) => oif,
                        Err((kind, name)) => {
                            *report.waiting_for_device.entry(name.clone()).or_default() += 1;
                            if kind == ErrorKind::NoDevice {
                                // Missing device (e.g. no tunl0 yet): reported, retried with
                                // backoff; the retry refreshes the link list.
                                report.error(kind, || format!("route {key}: device {name} does not exist"));
                                self.links.request_refresh();
                                self.fail(key);
                            } else {
                                // Down: the link-up event (or the next resync) marks it again.
                                self.dirty.remove(&key);
                            }
                            continue;
                        }
                    };
                    if k.is_some_and(|k| Self::in_sync(&d.route, oif, k)) {
                        self.dirty.remove(&key);
                        self.retries.clear(&key);
                        continue;
                    }
                    writes.push(RouteOp::Write { route: d.route.clone(), oif, exclusive: k.is_none() });
                }
                (None, Some(_)) => delete_candidates.push(key),
                (None, None) => {
                    self.dirty.remove(&key);
                    self.retries.clear(&key);
                }
            }
        }
        (writes, delete_candidates)
    }

    /// Step-aside writes for delete candidates whose pending handover needs our route's key
    /// free: a create-exclusive copy at metric+1 (same table, dst, tos and target), each with
    /// the original key it stands in for. The original is deleted only after its copy is in,
    /// also while other deletes are held (the prefix stays routed by the copy).
    fn plan_step_asides(&self, candidates: &[RouteKey], now: Instant) -> Vec<(RouteOp, RouteKey)> {
        let mut ops = Vec::new();
        for key in candidates {
            let (Some(copy), Some(k)) = (self.handovers.step_aside_copy(key, now), self.kernel.get(key)) else {
                continue;
            };
            if self.kernel.contains_key(&copy) || self.desired.contains_key(&copy) {
                continue;
            }
            let route = KernelRoute { key: copy, target: k.route.target.clone() };
            ops.push((RouteOp::Write { route, oif: k.oif, exclusive: true }, *key));
        }
        ops
    }

    /// Fold a step-aside write's result in. Written: the copy is ours in the kernel and the
    /// pending handover moves to its key (the original becomes an ordinary delete). Failed:
    /// the original stays (its prefix is in the returned failures); an `EEXIST` (something
    /// holds metric+1) gives up stepping aside, other errors retry with backoff.
    fn record_step_aside(
        &mut self,
        original: RouteKey,
        route: &KernelRoute,
        oif: Option<u32>,
        res: Result<(), NetlinkError>,
        report: &mut ApplyReport,
    ) -> bool {
        match res {
            Ok(()) => {
                report.writes += 1;
                let entry = KernelEntry { route: route.clone(), oif, extra: false, verified: true, verdict: Verdict::OursByProtocol };
                self.kernel.insert(route.key, entry);
                self.handovers.stepped_aside(original, route.key);
                self.dirty.insert(route.key);
                self.retries.clear(&original);
                true
            }
            Err(e) => {
                if e.errno() == Some(Errno::EEXIST) {
                    self.handovers.give_up_step_aside(&original);
                } else {
                    self.fail(original);
                }
                report.error(ErrorKind::of(&e), || format!("step aside of {original}: {e}"));
                report.write_errors += 1;
                false
            }
        }
    }

    /// Fold write results into the kernel view; returns the (table, dst) pairs whose write
    /// failed (their old routes must stay).
    fn record_writes(
        &mut self,
        writes: &[RouteOp],
        results: Vec<Result<(), NetlinkError>>,
        step_asides: &[(RouteOp, RouteKey)],
        now: Instant,
        report: &mut ApplyReport,
    ) -> BTreeSet<(u32, IpNet)> {
        let mut failed_dsts = BTreeSet::new();
        let stepping: HashMap<RouteKey, RouteKey> = step_asides.iter().map(|(op, original)| (*op.key(), *original)).collect();
        for (op, res) in writes.iter().zip(results) {
            let RouteOp::Write { route, oif, exclusive } = op else {
                continue;
            };
            let key = route.key;
            if let Some(original) = stepping.get(&key) {
                if !self.record_step_aside(*original, route, *oif, res, report) {
                    failed_dsts.insert((key.table, key.dst));
                }
                continue;
            }
            match res {
                Ok(()) => {
                    report.writes += 1;
                    if let Some(prev) = self.kernel.get(&key) {
                        if prev.route.target.protocol != route.target.protocol {
                            report.overwrote.push(Overwrite { previous: prev.route.to_string(), verdict: prev.verdict });
                        }
                    }
                    let entry = KernelEntry { route: route.clone(), oif: *oif, extra: false, verified: true, verdict: Verdict::OursByProtocol };
                    self.kernel.insert(key, entry);
                    self.dirty.remove(&key);
                    self.retries.clear(&key);
                    self.blocked.remove(&key);
                }
                Err(e) => {
                    let kind = ErrorKind::of(&e);
                    failed_dsts.insert((key.table, key.dst));
                    let held = *exclusive && e.errno() == Some(Errno::EEXIST);
                    // A retry of a key already reported held is not another error: the hold
                    // is one event, counted once (the held gauge says it meanwhile), so a
                    // long hold pages as RoutesHeldByOtherWriter, not also as
                    // RouteProgrammingErrors.
                    let mut counted = true;
                    if held {
                        // Reported once per hold (until the holder's route goes or becomes
                        // ours); the held count says it meanwhile.
                        let reported = self.blocked.entry(key).or_insert(false);
                        counted = !*reported;
                        if !*reported {
                            *reported = true;
                            report.conflicts.push(Conflict { key, wanted: route.to_string() });
                            // First time: maybe the route is ours after all (written
                            // meanwhile); a resync tells.
                            self.resync.no_later_than(now);
                        }
                    } else if matches!(kind, ErrorKind::NoDevice | ErrorKind::DeviceDown | ErrorKind::Other | ErrorKind::Timeout) {
                        // Our view of links or of the socket is stale: resync soon.
                        self.resync.no_later_than(now + backoff(1));
                    }
                    if counted {
                        report.error(kind, || e.to_string());
                        report.write_errors += 1;
                    }
                    if held {
                        // Another writer's route holds the key: its removal (an event) frees
                        // it at once; otherwise look again at the resync interval, not
                        // every backoff step (issue 19).
                        self.retries.fail_until(key, now + self.config.resync_interval.max(backoff(1)));
                    } else {
                        self.fail(key);
                    }
                }
            }
        }
        failed_dsts
    }

    /// The deletes that may go out now: datastore synced, outside frozen ground, the prefix's
    /// replacement did not fail, no handover grace pending, and past the mass-deletion
    /// breaker.
    fn plan_deletes(&mut self, candidates: Vec<RouteKey>, failed_dsts: &BTreeSet<(u32, IpNet)>, now: Instant, report: &mut ApplyReport) -> Vec<RouteOp> {
        let mut handed_over = Vec::new();
        let mut plain = Vec::new();
        for key in candidates {
            if failed_dsts.contains(&(key.table, key.dst)) {
                // The replacement for this prefix failed: keep the old route (no hole).
                continue;
            }
            let gate = self.handovers.delete_gate(&key, now);
            match gate {
                // Our copy at metric+1 is in (the original goes: make before break), or the new
                // owner's route for the prefix is in the kernel (deleting ours leaves the prefix
                // routed whatever the datastore says now).
                DeleteGate::Now => {
                    handed_over.push(key);
                    continue;
                }
                DeleteGate::Wait => {
                    report.deletes_deferred_handover += 1;
                    continue;
                }
                DeleteGate::GraceOver | DeleteGate::NotHandedOver => {}
            }
            if !self.datastore_synced {
                report.deletes_deferred_unsynced += 1;
                self.dirty.remove(&key); // re-marked when the datastore syncs
                continue;
            }
            if self.is_frozen(&key.dst) {
                report.deletes_deferred_frozen += 1;
                self.dirty.remove(&key); // re-marked when the frozen ground changes
                continue;
            }
            if gate == DeleteGate::GraceOver {
                // The grace period ended without the new owner: deliberate, waited for.
                handed_over.push(key);
                continue;
            }
            if self.kernel.contains_key(&key) {
                plain.push(key);
            }
        }
        let plain = self.mass_deletion_breaker(plain, now, report);
        handed_over
            .into_iter()
            .chain(plain)
            .filter_map(|key| self.kernel.get(&key).map(|k| RouteOp::Delete { key, protocol: k.route.target.protocol }))
            .collect()
    }

    /// The mass-deletion breaker over the plain deletes of this apply: held deletes are
    /// counted, and looked at again at the earliest release time ([`next_wakeup`](Self::next_wakeup)).
    fn mass_deletion_breaker(&mut self, deletes: Vec<RouteKey>, now: Instant, report: &mut ApplyReport) -> Vec<RouteKey> {
        let ours = self.kernel.len();
        let verdict = self.breaker.check(deletes, ours, now);
        for key in &verdict.held {
            report.deletes_held_mass += 1;
            self.dirty.remove(key); // back at the release time (next_wakeup)
        }
        if report.deletes_held_mass > 0 {
            report.mass_deletion = Some((verdict.wanted, ours));
        }
        verdict.pass
    }

    /// Fold delete results into the kernel view: deleted and already gone (`ESRCH`) routes
    /// leave it; other failures retry with backoff.
    fn record_deletes(&mut self, deletes: &[RouteOp], results: Vec<Result<(), NetlinkError>>, report: &mut ApplyReport) {
        for (op, res) in deletes.iter().zip(results) {
            let key = *op.key();
            match res {
                Ok(()) => report.deletes += 1,
                // ESRCH: already gone, or another writer's route holds the key now.
                Err(e) if e.errno() == Some(Errno::ESRCH) => report.deletes_already_gone += 1,
                Err(e) => {
                    report.error(ErrorKind::of(&e), || e.to_string());
                    report.delete_errors += 1;
                    self.fail(key);
                    continue;
                }
            }
            self.kernel.remove(&key);
            self.dirty.remove(&key);
            self.retries.clear(&key);
            self.breaker.forget(&key);
            self.handovers.deleted(&key);
        }
    }

    /// The per-class counts and totals after this apply, and its wall time since `started`.
    fn finish_report(&self, report: &mut ApplyReport, started: Instant) {
        for d in self.desired.values() {
            let c = report.by_class.entry((Family::of(&d.route.key.dst), d.class, d.path)).or_default();
            c.desired += 1;
            let oif = self.links.resolve(d.route.target.device.as_deref()).ok().flatten();
            if self.kernel.get(&d.route.key).is_some_and(|k| Self::in_sync(&d.route, oif, k)) {
                c.programmed += 1;
            } else if self.blocked.contains_key(&d.route.key) {
                c.held += 1;
            }
        }
        report.kernel_routes = self.kernel.len();
        report.pending = self.dirty.len();
        report.duration = self.clock.now().saturating_duration_since(started);
    }
}
