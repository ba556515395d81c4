//! The report's counts of the desired routes per (family, pool class, path): desired,
//! programmed (in the kernel as desired), held (another writer's route refused our
//! create-exclusive write) — `ApplyReport::by_class`, the `routewarden_routes` gauges.
//!
//! Kept between applies ([`Tally`]): each desired key's last counted state is remembered, and
//! an apply counts again only the keys whose desired route, kernel entry or hold changed since
//! the last (recorded by [`Recorded`], the kernel view's and the holds' map type, and by
//! `take_desired`), so a plan that moved one route of 55,000 costs that route, not a walk over
//! all of them. Everything is counted again when the answer for every route may have changed:
//! the first apply, a kernel view replaced whole (a resync, the bulk build of a cold start), a
//! device a desired route names resolving to another ifindex (or none: renamed, gone, down),
//! more keys touched than the view holds, and in nexthop-object mode (whether a route goes
//! through its object depends on the objects' state, not recorded here). Debug builds (every
//! test) check each apply's counts against the walk over every route ([`Reconciler::count_all`]).

use std::collections::BTreeMap;
use std::ops::Deref;

use itertools::{EitherOrBoth, Itertools};

use super::links::{Links, ResolveMemo};
use super::{KernelEntry, Reconciler};
use crate::dataplane::kernel::netlink::{Clock, RouteNetlink};
use crate::dataplane::kernel::route::{DesiredRoute, Family, RouteKey};
use crate::dataplane::reconciler::report::ClassCount;
use crate::vocabulary::{PoolClass, RoutePath};

/// What the counts are kept per: the route's family, its pool's class, its path.
pub(super) type ClassKey = (Family, PoolClass, RoutePath);

/// A map keyed by route key that is read as a `BTreeMap` (`Deref`) and changed only through
/// methods that record which keys changed, for the [`Tally`]: the reconciler's kernel view
/// and its held keys.
#[derive(Debug)]
pub(super) struct Recorded<V> {
    map: BTreeMap<RouteKey, V>,
    /// Keys changed since [`Recorded::take_touched`] (may repeat).
    touched: Vec<RouteKey>,
    /// Every key may have changed (the map replaced whole, or more keys touched than held).
    all: bool,
}

impl<V> Default for Recorded<V> {
    fn default() -> Self {
        Recorded { map: BTreeMap::new(), touched: Vec::new(), all: false }
    }
}

impl<V> Deref for Recorded<V> {
    type Target = BTreeMap<RouteKey, V>;

    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl<V> Recorded<V> {
    fn note(&mut self, key: RouteKey) {
        if self.all {
            return;
        }
        // Bounded: past the map's size (at least 1,024) a count of everything is cheaper.
        if self.touched.len() >= self.map.len().max(1024) {
            self.all = true;
            self.touched = Vec::new();
            return;
        }
        self.touched.push(key);
    }

    fn note_all(&mut self) {
        self.all = true;
        self.touched = Vec::new();
    }

    /// `BTreeMap::insert`, recorded.
    pub(super) fn insert(&mut self, key: RouteKey, value: V) -> Option<V> {
        self.note(key);
        self.map.insert(key, value)
    }

    /// `BTreeMap::remove`, recorded when the key was there.
    pub(super) fn remove(&mut self, key: &RouteKey) -> Option<V> {
        let removed = self.map.remove(key);
        if removed.is_some() {
            self.note(*key);
        }
        removed
    }

    /// The value at `key`, `value` inserted (and recorded) when there is none. Changes made
    /// through the reference are not recorded: only for values the tally does not read (a
    /// hold's "reported" flag).
    pub(super) fn get_or_insert(&mut self, key: RouteKey, value: V) -> &mut V {
        if !self.map.contains_key(&key) {
            self.note(key);
        }
        self.map.entry(key).or_insert(value)
    }

    /// Replace the whole map (every key recorded).
    pub(super) fn replace_all(&mut self, map: BTreeMap<RouteKey, V>) {
        self.note_all();
        self.map = map;
    }

    /// Take the whole map out, leaving it empty (every key recorded).
    pub(super) fn take_all(&mut self) -> BTreeMap<RouteKey, V> {
        self.note_all();
        std::mem::take(&mut self.map)
    }

    /// Let `change` look at every entry; the keys for which it returns true (it changed the
    /// value) are recorded.
    pub(super) fn change_each(&mut self, mut change: impl FnMut(&RouteKey, &mut V) -> bool) {
        let mut changed = Vec::new();
        for (k, v) in &mut self.map {
            if change(k, v) {
                changed.push(*k);
            }
        }
        for k in changed {
            self.note(k);
        }
    }

    /// Move the recorded keys into `into`; whether every key may have changed instead. Clears
    /// the record.
    fn take_touched(&mut self, into: &mut Vec<RouteKey>) -> bool {
        into.append(&mut self.touched);
        std::mem::take(&mut self.all)
    }
}

/// How a desired route was counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Counted {
    /// Desired only.
    Desired,
    /// In the kernel as desired.
    Programmed,
    /// Held by another writer's route.
    Held,
}

/// The counts kept between applies (see the module docs).
#[derive(Debug)]
pub(super) struct Tally {
    counts: BTreeMap<ClassKey, ClassCount>,
    /// Each desired key's class and state as counted.
    counted: BTreeMap<RouteKey, (ClassKey, Counted)>,
    /// Each device a counted route names, with the ifindex it resolved to (`None`: unknown or
    /// down).
    devices: Vec<(Box<str>, Option<u32>)>,
    /// Desired keys added, changed or removed since the last count.
    touched: Vec<RouteKey>,
    /// Count every desired route at the next count.
    all: bool,
}

impl Default for Tally {
    fn default() -> Self {
        Tally { counts: BTreeMap::new(), counted: BTreeMap::new(), devices: Vec::new(), touched: Vec::new(), all: true }
    }
}

impl Tally {
    /// The desired set changed at `keys` (added, changed or removed).
    pub(super) fn desired_changed(&mut self, keys: impl IntoIterator<Item = RouteKey>) {
        if !self.all {
            self.touched.extend(keys);
        }
    }

    /// The desired set was replaced whole.
    pub(super) fn desired_replaced(&mut self) {
        self.all = true;
        self.touched = Vec::new();
    }

    /// Remember the device `d` names, with what it resolves to now, if it is not yet known.
    fn note_device(&mut self, d: &DesiredRoute, links: &Links) {
        if let Some(name) = d.route.target.device.as_deref() {
            if !self.devices.iter().any(|(n, _)| &**n == name) {
                self.devices.push((name.into(), links.resolve(Some(name)).ok().flatten()));
            }
        }
    }

    fn add(&mut self, (class, state): (ClassKey, Counted)) {
        let c = self.counts.entry(class).or_default();
        c.desired += 1;
        match state {
            Counted::Programmed => c.programmed += 1,
            Counted::Held => c.held += 1,
            Counted::Desired => {}
        }
    }

    fn sub(&mut self, (class, state): (ClassKey, Counted)) {
        let Some(c) = self.counts.get_mut(&class) else { return };
        c.desired = c.desired.saturating_sub(1);
        match state {
            Counted::Programmed => c.programmed = c.programmed.saturating_sub(1),
            Counted::Held => c.held = c.held.saturating_sub(1),
            Counted::Desired => {}
        }
    }
}

impl<N: RouteNetlink, C: Clock> Reconciler<N, C> {
    /// How desired route `d` counts now, with `k` its kernel entry.
    fn count_one<'d>(&self, d: &'d DesiredRoute, k: Option<&KernelEntry>, links: &mut ResolveMemo<'_, 'd>) -> (ClassKey, Counted) {
        let class = (Family::of(&d.route.key.dst), d.class, d.path);
        let oif = links.resolve(d.route.target.device.as_deref()).ok().flatten();
        let nexthop = self.nexthops.ready(d, oif);
        let state = if k.is_some_and(|k| Self::in_sync(&d.route, oif, nexthop, k)) {
            Counted::Programmed
        } else if self.blocked.contains_key(&d.route.key) {
            Counted::Held
        } else {
            Counted::Desired
        };
        (class, state)
    }

    /// Every desired route counted, with its key: the desired set and the kernel view walked
    /// together in key order (no search per route).
    fn count_every<'s>(&'s self, mut each: impl FnMut(&'s DesiredRoute, (ClassKey, Counted))) {
        let mut links = self.links.memo();
        for pair in self.desired.values().merge_join_by(self.kernel.iter(), |d, (k, _)| d.route.key.cmp(k)) {
            let (d, k) = match pair {
                EitherOrBoth::Left(d) => (d, None),
                EitherOrBoth::Both(d, (_, k)) => (d, Some(k)),
                EitherOrBoth::Right(_) => continue,
            };
            each(d, self.count_one(d, k, &mut links));
        }
    }

    /// The counts of every desired route, walked now: what [`Reconciler::settle_tally`] keeps
    /// up to date, and its oracle in debug builds.
    pub(super) fn count_all(&self) -> BTreeMap<ClassKey, ClassCount> {
        let mut t = Tally { all: false, ..Tally::default() };
        self.count_every(|_, s| t.add(s));
        t.counts
    }

    /// Bring the kept counts up to date (see the module docs) and return them: the classes
    /// with at least one desired route.
    pub(super) fn settle_tally(&mut self) -> BTreeMap<ClassKey, ClassCount> {
        let mut t = std::mem::take(&mut self.tally);
        let mut touched = std::mem::take(&mut t.touched);
        let mut all = std::mem::take(&mut t.all);
        all |= self.kernel.take_touched(&mut touched);
        all |= self.blocked.take_touched(&mut touched);
        all |= self.nexthops.enabled();
        all |= t.devices.iter().any(|(name, oif)| self.links.resolve(Some(name)).ok().flatten() != *oif);
        if all {
            let mut fresh = Tally { all: false, ..Tally::default() };
            let mut counted = Vec::with_capacity(self.desired.len());
            self.count_every(|d, s| {
                fresh.add(s);
                fresh.note_device(d, &self.links);
                counted.push((d.route.key, s));
            });
            // Ascending keys: built in one pass.
            fresh.counted = counted.into_iter().collect();
            t = fresh;
        } else if !touched.is_empty() {
            touched.sort_unstable();
            touched.dedup();
            let mut links = self.links.memo();
            for key in touched {
                if let Some(was) = t.counted.remove(&key) {
                    t.sub(was);
                }
                let Some(d) = self.desired.get(&key) else { continue };
                let now = self.count_one(d, self.kernel.get(&key), &mut links);
                t.add(now);
                t.note_device(d, &self.links);
                t.counted.insert(key, now);
            }
            t.counts.retain(|_, c| c.desired > 0);
        }
        let counts = t.counts.clone();
        self.tally = t;
        counts
    }
}
