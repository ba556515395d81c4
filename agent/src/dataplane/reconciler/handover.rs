//! Ownership handover: when routewarden stops programming a class, its routes go to the new
//! writer without a gap. [`Handover`] names the new writer (the plan's), `Handovers` is the
//! reconciler's state machine for each prefix being handed over, and [`HandoverOutcome`] says
//! how each ended.
//!
//! One prefix, keyed by the key of our route:
//!
//! - **Begin**: our route leaves the desired set while its class is handed over. If the new
//!   writer uses our protocol and table it adopts the route in place (**Released** at once);
//!   otherwise our route is kept, pending, for at most the grace period.
//! - **Step aside** (a hand-over to BIRD at our key): BIRD adds create-exclusive and fails with
//!   `EEXIST` while our route holds the key, so ours is first copied to metric+1; once the copy
//!   is in, the original is deleted (make before break) and the pending handover moves to the
//!   copy's key. An `EEXIST` at metric+1 gives up stepping aside.
//! - **Seen**: the new writer's route for the prefix appears (a route event, or the one check
//!   dump per table and protocol): ours is deleted. **Grace expired**: ours is deleted anyway,
//!   but only while a plain delete could go (datastore synced, outside frozen ground).
//! - **Resumed**: the prefix is desired again before the end: the handover is dropped without
//!   an outcome, and a pending step-aside copy of it is deleted once the new route is in.
//! - A route of ours at our metric+1 that nothing desires, found by a resync, is a step-aside
//!   copy an earlier run did not finish: it is adopted as a pending handover to BIRD.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use ipnet::IpNet;
use serde::Serialize;

use crate::dataplane::kernel::route::{Family, RouteKey};
use crate::dataplane::reconciler::retry::later;
pub use crate::plan::Handover;
use crate::vocabulary::Writer;
use crate::vocabulary::RTPROT_BIRD;

/// The dataplane's question about a [`Handover`] (the plan's type knows no kernel keys).
trait StepAside {
    /// Whether the new owner needs our route's key free: BIRD adds with
    /// `NLM_F_CREATE|NLM_F_EXCL` and fails with `EEXIST` while our route holds the key
    /// (Felix replaces; a writer at another metric coexists).
    fn needs_step_aside(&self, key: &RouteKey) -> bool;
}

impl StepAside for Handover {
    fn needs_step_aside(&self, key: &RouteKey) -> bool {
        self.to == Writer::Bird && self.table == key.table && self.metric.is_none_or(|m| m == key.metric)
    }
}

/// How a handover of one prefix ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HandoverEnd {
    /// The new owner's route was seen; ours was then deleted.
    Seen,
    /// The grace period ran out first; ours was deleted anyway.
    GraceExpired,
    /// The new owner uses our protocol and table: the route was left in place for it to adopt
    /// (the app must drop the class's pools from
    /// [`OwnershipPolicy::owned`](crate::ownership::OwnershipPolicy::owned)).
    Released,
}

/// One finished handover, for metrics and logs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HandoverOutcome {
    /// The prefix.
    pub dst: IpNet,
    /// The new owner.
    pub to: Writer,
    /// How it ended.
    pub end: HandoverEnd,
    /// From the handover's start until ours was deleted (or released).
    #[serde(with = "secs_f64")]
    pub waited: Duration,
}

#[derive(Clone, Debug)]
struct PendingHandover {
    to: Writer,
    protocol: u8,
    table: u32,
    started: Instant,
    deadline: Instant,
    seen: bool,
    checked: bool,
    /// Our route is still at its original key and must first be copied to metric+1 (then the
    /// pending handover moves to the copy's key).
    step_aside: bool,
}

/// The key one metric below in priority (`metric + 1`) where a route steps aside, if any.
fn step_aside_key(key: &RouteKey) -> Option<RouteKey> {
    key.metric.checked_add(1).map(|metric| RouteKey { metric, ..*key })
}

/// What the handover state says about deleting our route at a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum DeleteGate {
    /// No handover of the key: an ordinary delete.
    NotHandedOver,
    /// Delete now, past every hold: the step-aside copy is in, or the new owner's route was
    /// seen (the prefix stays routed whatever the datastore says now).
    Now,
    /// The grace period runs: keep the route.
    Wait,
    /// The grace period ended without the new owner: delete where an ordinary delete could go
    /// (synced, outside frozen ground), but never held by the mass-deletion breaker (it is
    /// deliberate, and was waited for).
    GraceOver,
}

/// The handovers of one reconciler: pending ones keyed by the key of our route, the ones
/// released in place since the last apply, and the original keys whose step-aside copy is in.
#[derive(Debug)]
pub(super) struct Handovers {
    /// Longest wait for the new owner's route (`DataplaneConfig::handover_grace`).
    grace: Duration,
    pending: BTreeMap<RouteKey, PendingHandover>,
    released: Vec<HandoverOutcome>,
    /// Original keys whose step-aside copy is in: their delete completes a make-before-break
    /// and is never held.
    stepped: BTreeSet<RouteKey>,
}

impl Handovers {
    /// No handovers; each one started later waits at most `grace`.
    pub(super) fn new(grace: Duration) -> Self {
        Handovers { grace, pending: BTreeMap::new(), released: Vec::new(), stepped: BTreeSet::new() }
    }

    /// Our route at `key` left the desired set at `now` while its class goes to `h`'s writer in
    /// another protocol or table: keep it until that writer's route for the prefix is seen, at
    /// most the grace period.
    pub(super) fn begin(&mut self, key: RouteKey, h: &Handover, now: Instant) {
        let pending = PendingHandover {
            to: h.to,
            protocol: h.protocol,
            table: h.table,
            started: now,
            deadline: later(now, self.grace),
            seen: false,
            checked: false,
            step_aside: h.needs_step_aside(&key),
        };
        self.pending.insert(key, pending);
    }

    /// Our route at `key` stays in place for `to`, which writes our protocol and table and
    /// adopts it (reported by the next apply).
    pub(super) fn release(&mut self, key: &RouteKey, to: Writer) {
        self.released.push(HandoverOutcome { dst: key.dst, to, end: HandoverEnd::Released, waited: Duration::ZERO });
    }

    /// Whether any handover is pending.
    pub(super) fn any_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// `key` is desired (again) at `now`: a handover pending there ends without an outcome, and
    /// one pending at the prefix's step-aside copy is due now (the copy goes once the new route
    /// is in). Returns the copy's key to look at again, if so.
    pub(super) fn resume(&mut self, key: &RouteKey, now: Instant) -> Option<RouteKey> {
        self.pending.remove(key);
        let copy = step_aside_key(key)?;
        let h = self.pending.get_mut(&copy)?;
        h.deadline = now;
        Some(copy)
    }

    /// Our route at `key` (at our metric+1, not desired) is a step-aside copy left by an
    /// earlier run or apply: keep it as a pending handover to BIRD, deleted once BIRD's route
    /// for the prefix is seen, at most the grace period from `now`, instead of deleting it at
    /// once (the prefix would have no route until BIRD's next scan). A handover already pending
    /// at `key` is left as it is.
    pub(super) fn adopt_step_aside_copy(&mut self, key: RouteKey, now: Instant) {
        let grace = self.grace;
        self.pending.entry(key).or_insert_with(|| PendingHandover {
            to: Writer::Bird,
            protocol: RTPROT_BIRD,
            table: key.table,
            started: now,
            deadline: later(now, grace),
            seen: false,
            checked: false,
            step_aside: false,
        });
    }

    /// A route for `dst` with `protocol` appeared in `table`: every pending handover of that
    /// prefix to that protocol and table has now seen its new owner. Returns the keys newly seen.
    pub(super) fn route_seen(&mut self, dst: &IpNet, protocol: u8, table: u32) -> Vec<RouteKey> {
        let mut seen = Vec::new();
        for (key, h) in &mut self.pending {
            if !h.seen && key.dst == *dst && h.protocol == protocol && h.table == table {
                h.seen = true;
                seen.push(*key);
            }
        }
        seen
    }

    /// The (family, table, protocol) dumps that would tell whether the new owners of pending
    /// handovers not checked yet are already there (they may have been before we started).
    pub(super) fn unchecked(&self) -> BTreeSet<(Family, u32, u8)> {
        self.pending.iter().filter(|(_, h)| !h.checked).map(|(k, h)| (k.family, h.table, h.protocol)).collect()
    }

    /// Fold in one such dump: `dsts` are the prefixes with a route of `protocol` in `table`.
    /// Every pending handover of that family, table and protocol is checked; returns the keys
    /// whose new owner's route is there.
    pub(super) fn checked(&mut self, family: Family, table: u32, protocol: u8, dsts: &BTreeSet<IpNet>) -> Vec<RouteKey> {
        let mut seen = Vec::new();
        for (k, h) in &mut self.pending {
            if k.family == family && h.table == table && h.protocol == protocol {
                h.checked = true;
                if dsts.contains(&k.dst) {
                    h.seen = true;
                    seen.push(*k);
                }
            }
        }
        seen
    }

    /// For our route at `key`, a delete candidate: the key of its step-aside copy when its
    /// pending handover needs the key free now (stepping aside, new owner not seen, grace not
    /// over) and no handover is pending at the copy's key. Not held while deletions are (an
    /// unsettled or unsynced view): the prefix keeps our route at metric+1, so stepping aside
    /// loses nothing.
    pub(super) fn step_aside_copy(&self, key: &RouteKey, now: Instant) -> Option<RouteKey> {
        let h = self.pending.get(key)?;
        if !h.step_aside || h.seen || now >= h.deadline {
            return None;
        }
        let copy = step_aside_key(key)?;
        (!self.pending.contains_key(&copy)).then_some(copy)
    }

    /// The step-aside copy of our route at `original` is in at `copy`: the pending handover
    /// moves to the copy, and the original's delete completes the make-before-break.
    pub(super) fn stepped_aside(&mut self, original: RouteKey, copy: RouteKey) {
        if let Some(mut h) = self.pending.remove(&original) {
            h.step_aside = false;
            self.pending.insert(copy, h);
        }
        self.stepped.insert(original);
    }

    /// Something already holds metric+1 (`EEXIST`): stop trying to step aside for `original`
    /// (the handover goes on at the original key).
    pub(super) fn give_up_step_aside(&mut self, original: &RouteKey) {
        if let Some(h) = self.pending.get_mut(original) {
            h.step_aside = false;
        }
    }

    /// What the handover state says about deleting our route at `key`, a delete candidate
    /// (never desired), at `now`.
    pub(super) fn delete_gate(&self, key: &RouteKey, now: Instant) -> DeleteGate {
        if self.stepped.contains(key) {
            return DeleteGate::Now;
        }
        match self.pending.get(key) {
            None => DeleteGate::NotHandedOver,
            Some(h) if h.seen => DeleteGate::Now,
            Some(h) if now < h.deadline => DeleteGate::Wait,
            Some(_) => DeleteGate::GraceOver,
        }
    }

    /// Our route at `key` is gone from the kernel (deleted, or already gone).
    pub(super) fn deleted(&mut self, key: &RouteKey) {
        self.stepped.remove(key);
    }

    /// Move the outcomes of finished handovers into `out`: first those whose route is no longer
    /// `in_kernel` at `now` (deleted by us after the new owner's route was seen or the grace
    /// ended, or removed by someone else), then those released in place since the last call.
    pub(super) fn finish(&mut self, now: Instant, in_kernel: impl Fn(&RouteKey) -> bool, out: &mut Vec<HandoverOutcome>) {
        let done: Vec<RouteKey> = self.pending.keys().filter(|k| !in_kernel(k)).copied().collect();
        for k in done {
            if let Some(h) = self.pending.remove(&k) {
                out.push(HandoverOutcome {
                    dst: k.dst,
                    to: h.to,
                    end: if h.seen { HandoverEnd::Seen } else { HandoverEnd::GraceExpired },
                    waited: now.saturating_duration_since(h.started),
                });
            }
        }
        out.append(&mut self.released);
    }

    /// The earliest grace deadline of a pending handover whose new owner is not seen yet.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.pending.values().filter(|h| !h.seen).map(|h| h.deadline).min()
    }
}

/// Serialize a [`Duration`] as seconds (`f64`).
pub(super) mod secs_f64 {
    use std::time::Duration;
    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests;
