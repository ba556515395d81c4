//! One [`Reconciler::apply`]: the resync if due, then the write pass (desired keys not in sync,
//! plus step-aside copies), then the delete pass (past the datastore, frozen-ground, handover
//! and mass-deletion holds, and never for a prefix whose new route failed), then the report.

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use ipnet::IpNet;
use nix::errno::Errno;

use super::{KernelEntry, Reconciler};
use crate::dataplane::kernel::netlink::{ChunkPlace, Clock, NetlinkError, RouteNetlink, RouteOp};
use crate::dataplane::kernel::nexthop::NexthopOp;
use crate::dataplane::kernel::route::{KernelRoute, RouteKey, RouteKind};
use crate::dataplane::reconciler::handover::DeleteGate;
use crate::dataplane::reconciler::report::{ApplyReport, Conflict, ErrorKind, Overwrite};
use crate::dataplane::reconciler::retry::backoff;
use crate::ownership::Verdict;

/// Writes in the first chunk of a write pass ([`Reconciler::write_pass`]); later chunks double
/// up to [`RouteNetlink::write_chunk`], and the last ones halve down to it again.
const FIRST_CHUNK: usize = 128;

impl<N: RouteNetlink, C: Clock> Reconciler<N, C> {
    /// Whether kernel entry `k` is desired route `d` written through `oif`, or through
    /// nexthop object `nexthop`: same type, protocol and scope, the same nexthop object (or
    /// none), and (unless a blackhole or through an object, which carries them) same gateway,
    /// onlink flag and device; re-verified since its link went down or up, and with no
    /// attribute we never write.
    pub(super) fn in_sync(d: &KernelRoute, oif: Option<u32>, nexthop: Option<u32>, k: &KernelEntry) -> bool {
        let (dt, kt) = (&d.target, &k.route.target);
        k.verified
            && !k.extra
            && dt.kind == kt.kind
            && dt.protocol == kt.protocol
            && dt.scope == kt.scope
            && nexthop == k.nexthop
            && match dt.kind {
                RouteKind::Blackhole => true,
                _ => nexthop.is_some() || (dt.gateway == kt.gateway && dt.onlink == kt.onlink && oif == k.oif),
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
        // Nexthop objects first: a route goes through one only once it is in the kernel.
        self.write_nexthops(now, &mut report).await;
        // Deletes the breaker held come back for another look.
        self.dirty.extend(self.breaker.held().copied());
        // Pass 1: writes. Pass 2: deletes, after the new routes are in.
        let (failed_dsts, delete_candidates) = self.write_pass(now, &mut report).await;
        let deletes = self.plan_deletes(delete_candidates, &failed_dsts, now, &mut report);
        let results = if deletes.is_empty() { Vec::new() } else { self.nl.execute(&deletes).await };
        self.record_deletes(&deletes, results, &mut report);
        self.delete_unused_nexthops(&mut report).await;
        let kernel = &self.kernel;
        self.handovers.finish(self.clock.now(), |k| kernel.contains_key(k), &mut report.handovers);
        self.finish_report(&mut report, started);
        report
    }

    /// Write the nexthop objects the desired routes need (create-exclusive, or replace in
    /// place when gateway, device or onlink flag changed); the routes through a written object
    /// are looked at again by this apply's write pass.
    async fn write_nexthops(&mut self, now: Instant, report: &mut ApplyReport) {
        let ops = self.nexthops.pending_ops(&self.links, &self.kernel, now, report);
        if ops.is_empty() {
            return;
        }
        let results = self.nl.execute_nexthops(&ops).await;
        let written = self.nexthops.record_writes(&ops, results, &self.links, now, report);
        if written.is_empty() {
            return;
        }
        let mut links = self.links.memo();
        for (key, d) in self.desired.iter() {
            let oif = links.resolve(d.route.target.device.as_deref()).ok().flatten();
            if self.nexthops.ready(d, oif).is_some_and(|id| written.contains(&id)) {
                self.dirty.insert(*key);
            }
        }
    }

    /// Delete our nexthop objects that nothing uses: no (node, pool) wants them, no route of
    /// ours goes through them, and a dump of every table finds no route through them (one
    /// dump per family for all of them). A failed check keeps them.
    async fn delete_unused_nexthops(&mut self, report: &mut ApplyReport) {
        let unused = self.nexthops.unused(&self.kernel);
        if unused.is_empty() {
            return;
        }
        let gone: Vec<u32> = match self.nl.nexthops_in_use(&unused).await {
            Ok(used) => {
                let gone = unused.into_iter().filter(|id| !used.contains(id)).collect();
                self.nexthops.used_by_others(used);
                gone
            }
            Err(e) => {
                report.error(ErrorKind::of(&e), || format!("unused nexthop objects kept: {e}"));
                return;
            }
        };
        if gone.is_empty() {
            return;
        }
        let ops: Vec<NexthopOp> = gone.iter().map(|id| NexthopOp::Delete { id: *id }).collect();
        let results = self.nl.execute_nexthops(&ops).await;
        self.nexthops.record_deletes(&gone, results, report);
    }

    /// The write pass: the dirty keys planned into writes a chunk at a time (at most
    /// [`RouteNetlink::write_chunk`] writes), in key order, each chunk handed to the kernel
    /// before the next is planned; the step-aside copies for the delete candidates go with the
    /// last chunk. A collaborator that pipelines hands a chunk's results back with the next
    /// call, so recording one chunk and planning the next run while the kernel inserts this
    /// one. No write, no call. Returns the (table, dst) pairs whose write failed and the
    /// delete candidates.
    async fn write_pass(&mut self, now: Instant, report: &mut ApplyReport) -> (BTreeSet<(u32, IpNet)>, Vec<RouteKey>) {
        let dirty = self.dirty.snapshot();
        let full = self.nl.write_chunk().max(1);
        // The first chunks are small and double up to the collaborator's size: the kernel
        // starts on a few routes at once instead of waiting for a whole chunk to be planned
        // and serialized, and each next chunk is built while the kernel inserts the last
        // (building a route costs well under half what the kernel's insert does).
        let mut chunk = full.min(FIRST_CHUNK);
        let mut failed_dsts = BTreeSet::new();
        let mut candidates = Vec::new();
        // Step-aside copy's key → the key it stands in for (planned with the last chunk).
        let mut stepping: HashMap<RouteKey, RouteKey> = HashMap::new();

        // The dirty keys come in ascending order: the desired set is walked along with them.
        let (mut at, mut cursor, mut first) = (0, 0, true);
        loop {
            // ... and the last chunks halve down to the first's size: what is left after the
            // kernel's last insert (recording the last chunk) is small, and each chunk before
            // is recorded while the kernel inserts the next, half its size.
            let tail = (dirty.len() - at).div_ceil(2).max(FIRST_CHUNK);
            let mut writes = self.pending_writes(&dirty, (&mut at, &mut cursor), chunk.min(tail), &mut candidates, now, report);
            chunk = chunk.saturating_mul(2).min(full);
            let last = at == dirty.len();
            if last {
                for (op, original) in self.plan_step_asides(&candidates, now) {
                    stepping.insert(*op.key(), original);
                    writes.push(op);
                }
            }
            // The last call also brings back the chunks still out.
            if !writes.is_empty() || (last && !first) {
                let place = ChunkPlace { first, last };
                first = false;
                for done in self.nl.execute_chunk(writes, place).await {
                    failed_dsts.extend(self.record_writes(done.ops, done.results, &stepping, now, report));
                }
            }
            if last {
                return (failed_dsts, candidates);
            }
        }
    }

    /// Sort the dirty keys of `dirty[*at..]` into writes (desired, not in sync) and delete
    /// candidates (ours, not desired, appended to `candidates`), until `max` writes; drop keys
    /// that need nothing. `at` moves past the keys looked at; `cursor` is where the desired
    /// set was left ([`DesiredSet::get_ascending`](super::desired::DesiredSet::get_ascending)).
    fn pending_writes(
        &mut self,
        dirty: &[RouteKey],
        (at, cursor): (&mut usize, &mut usize),
        max: usize,
        candidates: &mut Vec<RouteKey>,
        now: Instant,
        report: &mut ApplyReport,
    ) -> Vec<RouteOp> {
        // Sized once: grown a doubling at a time, a cold start's 10,000 writes (1 MB) were
        // copied and page-faulted in again at each step.
        let mut writes: Vec<RouteOp> = Vec::with_capacity(max.min(dirty.len() - *at));
        // A key above the kernel view's last is not in it (every key of a cold start's chunks
        // after the first, whose routes were just recorded below them): one comparison
        // instead of a search of the view. Planning does not change the view.
        let last = self.kernel.last_key_value().map(|(k, _)| *k);
        while writes.len() < max {
            let Some(&key) = dirty.get(*at) else { break };
            *at += 1;
            if self.retries.waiting(&key, now) {
                continue;
            }
            let in_kernel = if last.is_some_and(|last| key <= last) { self.kernel.get(&key) } else { None };
            match (self.desired.get_ascending(&key, cursor), in_kernel) {
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
                    let nexthop = self.nexthops.ready(d, oif);
                    if k.is_some_and(|k| Self::in_sync(&d.route, oif, nexthop, k)) {
                        self.dirty.remove(&key);
                        self.retries.clear(&key);
                        continue;
                    }
                    if k.is_some() && self.policy.hold_rewrites {
                        // Marked again by the resync the policy's change requests.
                        report.rewrites_held += 1;
                        self.dirty.remove(&key);
                        continue;
                    }
                    writes.push(RouteOp::Write { route: d.route.clone(), oif, nexthop, exclusive: k.is_none() });
                }
                (None, Some(_)) => candidates.push(key),
                (None, None) => {
                    self.dirty.remove(&key);
                    self.retries.clear(&key);
                }
            }
        }
        writes
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
            ops.push((RouteOp::Write { route, oif: k.oif, nexthop: k.nexthop, exclusive: true }, *key));
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
        (oif, nexthop): (Option<u32>, Option<u32>),
        res: Result<(), NetlinkError>,
        report: &mut ApplyReport,
    ) -> bool {
        match res {
            Ok(()) => {
                report.writes += 1;
                let entry = KernelEntry { route: route.clone(), oif, nexthop, extra: false, verified: true, verdict: Verdict::OursByProtocol };
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

    /// Fold write results into the kernel view, moving each written route into it (no copy);
    /// returns the (table, dst) pairs whose write failed (their old routes must stay).
    fn record_writes(
        &mut self,
        writes: Vec<RouteOp>,
        results: Vec<Result<(), NetlinkError>>,
        stepping: &HashMap<RouteKey, RouteKey>,
        now: Instant,
        report: &mut ApplyReport,
    ) -> BTreeSet<(u32, IpNet)> {
        let mut failed_dsts = BTreeSet::new();
        // As many writes as the view holds routes (a cold start: the view holds the link
        // routes) and no step-aside (which moves entries as it goes): collected in key order
        // and the map built again in one pass, with full nodes, instead of a search and a
        // half-empty node per route.
        let bulk = stepping.is_empty() && writes.len() >= self.kernel.len();
        let mut fresh: Option<Vec<(RouteKey, KernelEntry)>> = bulk.then(|| Vec::with_capacity(writes.len()));
        let mut done: Vec<RouteKey> = Vec::with_capacity(writes.len());
        for (op, res) in writes.into_iter().zip(results) {
            let RouteOp::Write { route, oif, nexthop, exclusive } = op else {
                continue;
            };
            let key = route.key;
            if let Some(original) = stepping.get(&key) {
                if !self.record_step_aside(*original, &route, (oif, nexthop), res, report) {
                    failed_dsts.insert((key.table, key.dst));
                }
                continue;
            }
            match res {
                Ok(()) => {
                    report.writes += 1;
                    let protocol = route.target.protocol;
                    let entry = KernelEntry { route, oif, nexthop, extra: false, verified: true, verdict: Verdict::OursByProtocol };
                    done.push(key);
                    self.retries.clear(&key);
                    self.blocked.remove(&key);
                    if let Some(prev) = self.kernel.get(&key).filter(|p| p.route.target.protocol != protocol) {
                        report.overwrote.push(Overwrite { previous: prev.route.to_string(), verdict: prev.verdict });
                    }
                    match fresh.as_mut() {
                        Some(fresh) => fresh.push((key, entry)),
                        None => drop(self.kernel.insert(key, entry)),
                    }
                }
                Err(e) => {
                    let kind = ErrorKind::of(&e);
                    failed_dsts.insert((key.table, key.dst));
                    let held = exclusive && e.errno() == Some(Errno::EEXIST);
                    // A retry of a key already reported held is not another error: the hold
                    // is one event, counted once (the held gauge says it meanwhile), so a
                    // long hold pages as RoutesHeldByOtherWriter, not also as
                    // RouteProgrammingErrors.
                    let mut counted = true;
                    if held {
                        // Reported once per hold (until the holder's route goes or becomes
                        // ours); the held count says it meanwhile.
                        let reported = self.blocked.get_or_insert(key, false);
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
                        // every backoff step.
                        self.retries.fail_until(key, now + self.config.resync_interval.max(backoff(1)));
                    } else {
                        self.fail(key);
                    }
                }
            }
        }
        if let Some(fresh) = fresh {
            // Keys are unique (one write per dirty key); a written route replaces what the
            // view held at its key.
            let mut kept = self.kernel.take_all();
            for (key, _) in &fresh {
                kept.remove(key);
            }
            self.kernel.replace_all(kept.into_iter().chain(fresh).collect());
        }
        self.dirty.remove_all(done);
        failed_dsts
    }

    /// The deletes that may go out now: datastore synced, outside frozen ground, the prefix's
    /// replacement did not fail, no handover grace pending, and past the mass-deletion
    /// breaker.
    fn plan_deletes(&mut self, candidates: Vec<RouteKey>, failed_dsts: &BTreeSet<(u32, IpNet)>, now: Instant, report: &mut ApplyReport) -> Vec<RouteOp> {
        let mut handed_over = Vec::new();
        let mut plain = Vec::new();
        // Deferred for a reason of their own: a breaker hold on one of them is paused, not lost.
        let mut deferred = Vec::new();
        for key in candidates {
            if failed_dsts.contains(&(key.table, key.dst)) {
                // The replacement for this prefix failed: keep the old route (no hole).
                deferred.push(key);
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
                    deferred.push(key);
                    continue;
                }
                DeleteGate::GraceOver | DeleteGate::NotHandedOver => {}
            }
            if !self.datastore_synced {
                report.deletes_deferred_unsynced += 1;
                self.dirty.remove(&key); // re-marked when the datastore syncs
                deferred.push(key);
                continue;
            }
            if self.is_frozen(&key.dst) {
                report.deletes_deferred_frozen += 1;
                self.dirty.remove(&key); // re-marked when the frozen ground changes
                deferred.push(key);
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
        let plain = self.mass_deletion_breaker(plain, &deferred, now, report);
        handed_over
            .into_iter()
            .chain(plain)
            .filter_map(|key| self.kernel.get(&key).map(|k| RouteOp::Delete { key, protocol: k.route.target.protocol }))
            .collect()
    }

    /// The mass-deletion breaker over the plain deletes of this apply: held deletes are
    /// counted, and looked at again at the earliest release time ([`next_wakeup`](Self::next_wakeup)).
    /// While holds are paused (their deletes deferred for another reason) the breaker still
    /// counts as engaged, so the report says so and no second engagement is logged or counted.
    fn mass_deletion_breaker(&mut self, deletes: Vec<RouteKey>, deferred: &[RouteKey], now: Instant, report: &mut ApplyReport) -> Vec<RouteKey> {
        let ours = self.kernel.len();
        let verdict = self.breaker.check(deletes, deferred, ours, now);
        for key in &verdict.held {
            report.deletes_held_mass += 1;
            self.dirty.remove(key); // back at the release time (next_wakeup)
        }
        if report.deletes_held_mass > 0 || verdict.paused > 0 {
            report.mass_deletion = Some((verdict.wanted + verdict.paused, ours));
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

    /// The per-class counts (kept between applies: `tally.rs`) and totals after this apply,
    /// and its wall time since `started`.
    fn finish_report(&mut self, report: &mut ApplyReport, started: Instant) {
        let counts = self.settle_tally();
        // Debug builds (every test) hold the kept counts to their claim: a walk over every
        // desired route now counts the same.
        debug_assert_eq!(counts, self.count_all(), "the kept per-class counts differ from a count of every desired route");
        report.by_class = counts;
        report.kernel_routes = self.kernel.len();
        report.pending = self.dirty.len();
        report.duration = self.clock.now().saturating_duration_since(started);
    }
}
