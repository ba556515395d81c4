//! The route pass kept between snapshots: [`RouteMemo`] answers what
//! [`classed_routes`](super::classed_routes) answers, from the previous answer and the IPAM
//! blocks and BlockAffinities that changed since, so that a snapshot in which one block of
//! many changed costs a walk over the block map (chunk pointers), the work of that block and
//! of the destinations its routes had and have, not a pass that computes every route again
//! (at a high rate of block changes the full pass would dominate the agent's CPU and the
//! event → plan latency). The answer's routes are a [`RouteMap`] kept from call to call: a
//! copy of it is a copy of chunk pointers, and the plan compares two answers chunk by chunk.
//!
//! What is kept, all derived from the cluster of the previous call:
//! - every block by (CIDR, name), the order in which the full pass visits them, with the
//!   routes and problems it contributes (`compute::block_routes`);
//! - the blocks' problems, counted (several blocks report the same one);
//! - the active BlockAffinities by CIDR and the affinity conflicts of each CIDR.
//!
//! The answer at a destination is what a walk of the blocks in that order finds (the first
//! fill is that walk; afterwards each destination a changed block had or has is computed
//! again from the blocks that contain it, `State::settle`): their routes come out sorted by
//! destination
//! (blocks do not overlap, and a block's borrowed /32s lie inside it and follow its own
//! route), two routes to one destination keep the first as the full pass does (a
//! [`RouteProblem::DuplicateDestination`] for each later one), and when blocks overlap the
//! routes are sorted (stably, so "first" is still the block order); the model refuses
//! overlapping blocks (`model::check_blocks`), so only a cluster built otherwise has them. The tunnel-address rule
//! reads the Nodes and a few blocks per address and runs on every call over the kept index.
//!
//! A block's contribution is a function of the block, the IP pools and the Nodes: the pools,
//! the Nodes, this node's name, the classes and the devices must be those of the previous
//! call, and when any differs everything is computed again (a Node's address moves every
//! route to it). The agent's tests compare every answer with the full pass over random
//! sequences of changes (`agent/tests/routes_compute.rs`).

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ipnet::IpNet;

use super::block_index::{affinity_conflict, BlocksByCidr};
use super::compute::block_routes;
use super::pass_context::Ctx;
use super::problem::Problems;
use super::tunnel_address::{tunnel_address_routes, TunnelOverlay};
use super::{ClassedRoutes, ClusterRoute, RouteDevices, RouteMap, RouteProblem};
use crate::model::{Cluster, IpamBlock};
use crate::vocabulary::PoolClass;

mod pass_order;

use self::pass_order::{at_cidr, ordered_by_pass, At, ByCidr, PassOrder};

/// The route pass kept between snapshots (see the module documentation). Starts empty; the
/// first call is a full pass.
#[derive(Debug, Default)]
pub struct RouteMemo {
    state: Option<State>,
}

impl RouteMemo {
    /// The routes and problems of `classes` for node `node` with `devices`, equal to
    /// [`classed_routes`](super::classed_routes)`(cluster, node, classes, devices)`. Keeps
    /// `cluster` (shared) to compare the next call's with.
    pub fn classed_routes(&mut self, cluster: &Arc<Cluster>, node: &str, classes: &BTreeSet<PoolClass>, devices: &RouteDevices) -> ClassedRoutes {
        self.update(cluster, node, classes, devices);
        self.answer()
    }

    /// Bring the memo to `cluster` (as [`RouteMemo::classed_routes`] does) without building
    /// the answer. Returns `false` when the answer is certainly the one of the previous
    /// update: no block's routes or problems, no affinity conflict, no tunnel-address route or
    /// problem and none of the context differ (an IP allocated to a pod of the block's own
    /// node changes no cluster route, and the plan need not run for it). `true` when it may differ (always after the memo started over).
    pub fn update(&mut self, cluster: &Arc<Cluster>, node: &str, classes: &BTreeSet<PoolClass>, devices: &RouteDevices) -> bool {
        let reusable = self.state.as_ref().is_some_and(|s| s.node == node && s.classes == *classes && s.devices == *devices && s.context_equals(cluster));
        if !reusable {
            self.state = None;
        }
        let fresh = self.state.is_none();
        let state = self.state.get_or_insert_with(|| State::new(node, classes, devices));
        state.update(cluster) || fresh
    }

    /// The answer for the cluster of the last update (empty before the first).
    pub fn answer(&self) -> ClassedRoutes {
        self.state.as_ref().map(State::output).unwrap_or_default()
    }
}

/// What one IPAM block contributes; in the pass's order by the block's CIDR and name.
#[derive(Debug)]
struct Contribution {
    block: Arc<IpamBlock>,
    /// In the order the full pass adds them (each shared with the answer where it is kept).
    routes: Box<[Arc<ClusterRoute>]>,
    problems: Box<[(RouteProblem, Option<PoolClass>)]>,
}

impl PassOrder for Contribution {
    fn pass_key(&self) -> (IpNet, &str) {
        (self.block.cidr, &self.block.name)
    }
}

ordered_by_pass!(Contribution);

#[derive(Debug)]
struct State {
    node: String,
    classes: BTreeSet<PoolClass>,
    devices: RouteDevices,
    /// The cluster everything here describes.
    cluster: Arc<Cluster>,
    /// Every IPAM block, deleted ones included.
    blocks: BTreeSet<Contribution>,
    /// (IPv6, prefix length) of blocks not deleted, with how many.
    lengths: BTreeMap<(bool, u8), usize>,
    /// The blocks' problems, each with how many blocks report it.
    problems: BTreeMap<(RouteProblem, Option<PoolClass>), usize>,
    /// Active BlockAffinities by their (CIDR, name). An affinity is found by its own name:
    /// that of its map entry for every affinity a datastore parses.
    affinities: BTreeSet<ByCidr>,
    /// Affinity conflicts per CIDR; never an empty list.
    conflicts: BTreeMap<IpNet, Vec<RouteProblem>>,
    /// The tunnel-address rule's answer for `cluster` and the problems it found; `None` until
    /// the first update computes it.
    overlay: Option<(TunnelOverlay, Problems)>,
    /// The answer's routes, kept as blocks change ([`State::settle`]): per destination, the
    /// first route in block order, or what the tunnel-address rule puts there. Copies share
    /// its chunks, so the plan made from it and the next answer differ only where routes did.
    answer: RouteMap,
    /// The [`RouteProblem::DuplicateDestination`]s per destination; never an empty list.
    duplicates: BTreeMap<IpNet, Vec<(RouteProblem, Option<PoolClass>)>>,
}

impl State {
    fn new(node: &str, classes: &BTreeSet<PoolClass>, devices: &RouteDevices) -> State {
        State {
            node: node.to_owned(),
            classes: classes.clone(),
            devices: devices.clone(),
            cluster: Arc::new(Cluster::default()),
            blocks: BTreeSet::new(),
            lengths: BTreeMap::new(),
            problems: BTreeMap::new(),
            affinities: BTreeSet::new(),
            conflicts: BTreeMap::new(),
            overlay: None,
            answer: RouteMap::new(),
            duplicates: BTreeMap::new(),
        }
    }

    /// Whether what a block's contribution depends on besides the block is `cluster`'s too:
    /// the IP pools and the Nodes (compared by pointer first). A state without blocks has
    /// nothing that depends on them.
    fn context_equals(&self, cluster: &Cluster) -> bool {
        self.blocks.is_empty() || (self.cluster.ip_pools == cluster.ip_pools && self.cluster.nodes == cluster.nodes)
    }

    /// Bring the state from its cluster to `cluster`, whose pools and Nodes are the same
    /// ([`State::context_equals`]) unless the state holds no block. Returns whether the
    /// answer may have changed ([`RouteMemo::update`]).
    fn update(&mut self, cluster: &Arc<Cluster>) -> bool {
        if Arc::ptr_eq(&self.cluster, cluster) {
            return false;
        }
        let old = std::mem::replace(&mut self.cluster, cluster.clone());
        // Pools and Nodes differ only when the state holds no block; the local node's problem
        // and the tunnel-address rule read them.
        let context_changed = !(old.ip_pools == cluster.ip_pools && old.nodes == cluster.nodes);
        let mut changed = context_changed;
        let mut blocks_changed = false;
        let (node, devices) = (self.node.clone(), self.devices.clone());
        let ctx = Ctx::new(cluster, &node, &devices);
        let mut touched: BTreeSet<IpNet> = BTreeSet::new();
        // Destinations whose answer may differ: every route a changed block had or has.
        let mut dirty: BTreeSet<IpNet> = BTreeSet::new();
        let (mut routes, mut problems) = (Vec::new(), Vec::new());
        // A first fill is built in one piece from sorted entries (full tree nodes: less memory
        // than inserting one by one in name order).
        let (mut new_blocks, mut new_affinities) = (Vec::new(), Vec::new());
        let (fresh_blocks, fresh_affinities) = (self.blocks.is_empty(), self.affinities.is_empty());
        old.ipam_blocks.diff(&cluster.ipam_blocks, |_, before, after| {
            blocks_changed = true;
            let gone = before.and_then(|b| {
                touched.insert(b.cidr);
                self.remove_block(b)
            });
            if let Some(g) = gone.as_ref().filter(|_| !fresh_blocks) {
                dirty.extend(g.routes.iter().map(|r| r.dst));
            }
            if let Some(b) = after {
                block_routes(&ctx, b, &self.classes, &mut routes, &mut problems);
                let contribution = self.contribution(b, std::mem::take(&mut routes), std::mem::take(&mut problems));
                // The same routes and problems at the same place in the pass: the answer's
                // part from this block is as it was (the block's other fields reach the answer
                // only through the tunnel-address rule and the affinity conflicts, compared
                // below).
                changed |= gone.is_none_or(|g| g != contribution || g.routes != contribution.routes || g.problems != contribution.problems);
                touched.insert(b.cidr);
                if fresh_blocks {
                    new_blocks.push(contribution);
                } else {
                    dirty.extend(contribution.routes.iter().map(|r| r.dst));
                    self.blocks.replace(contribution);
                }
            } else {
                changed |= gone.is_some_and(|g| !g.routes.is_empty() || !g.problems.is_empty());
            }
        });
        old.block_affinities.diff(&cluster.block_affinities, |_, before, after| {
            for (a, add) in [(before, false), (after, true)] {
                let Some(a) = a.filter(|a| a.is_active()) else { continue };
                touched.insert(a.cidr);
                if !add {
                    self.affinities.remove(&At(a.cidr, &a.name) as &dyn PassOrder);
                } else if fresh_affinities {
                    new_affinities.push(ByCidr(a.clone()));
                } else {
                    self.affinities.replace(ByCidr(a.clone()));
                }
            }
        });
        if fresh_blocks {
            self.blocks = new_blocks.into_iter().collect();
        }
        if fresh_affinities {
            self.affinities = new_affinities.into_iter().collect();
        }
        for cidr in touched {
            changed |= self.recheck_affinities(cidr);
        }
        // The tunnel-address rule reads the Nodes, the pools and the blocks holding each
        // address (their allocations too), so it runs again when any of them changed, and its
        // answer is compared with the last.
        let first = self.overlay.is_none();
        if blocks_changed || context_changed || first {
            let mut found = Problems::new();
            let overlay = tunnel_address_routes(&ctx, &&*self, &self.classes, &mut found);
            if let Some((was, _)) = &self.overlay {
                let differs =
                    |a: &TunnelOverlay, b: &TunnelOverlay| a.routes.iter().filter(|(d, r)| b.routes.get(d) != Some(r)).map(|(d, _)| *d).collect::<Vec<_>>();
                dirty.extend(differs(was, &overlay));
                dirty.extend(differs(&overlay, was));
            }
            changed |= self.overlay.as_ref().is_none_or(|(o, p)| *o != overlay || *p != found);
            self.overlay = Some((overlay, found));
        }
        if fresh_blocks || first {
            self.rebuild_answer();
        } else {
            for dst in dirty {
                self.settle(dst);
            }
        }
        changed
    }

    /// The answer's routes and duplicates computed from every block (the first fill): every
    /// block's routes in block order, sorted by destination (stably: "first" is block order;
    /// blocks do not overlap, so they come sorted unless a cluster built otherwise has), the
    /// first of each destination kept, then the tunnel-address rule's replacements merged in.
    fn rebuild_answer(&mut self) {
        let mut all: Vec<&Arc<ClusterRoute>> = self.blocks.iter().flat_map(|c| c.routes.iter()).collect();
        if !all.is_sorted_by(|a, b| a.dst < b.dst) {
            all.sort_by_key(|r| r.dst);
        }
        let mut duplicates: BTreeMap<IpNet, Vec<(RouteProblem, Option<PoolClass>)>> = BTreeMap::new();
        let mut kept: Vec<&Arc<ClusterRoute>> = Vec::with_capacity(all.len());
        for r in all {
            match kept.last() {
                Some(k) if k.dst == r.dst => duplicates.entry(r.dst).or_default().push(duplicate(k, r)),
                _ => kept.push(r),
            }
        }
        // Merged with the overlay's destinations in order, each route straight into the map's
        // chunks (no list of them all beside it).
        let mut answer = RouteMap::new();
        let kept = kept.into_iter().cloned();
        match &self.overlay {
            Some((overlay, _)) => overlay.apply(kept, |r| r.dst, |t| Arc::new(t.clone()), |r| answer.push_last(r.dst, r)),
            None => kept.for_each(|r| answer.push_last(r.dst, r)),
        }
        self.answer = answer;
        self.duplicates = duplicates;
    }

    /// Compute the answer at `dst` again: the routes to `dst` of the blocks that contain it
    /// (found through the prefix lengths blocks have), in block order; the first is kept and
    /// each later one is a duplicate; the tunnel-address rule's entry for `dst` replaces them.
    fn settle(&mut self, dst: IpNet) {
        let mut candidates: Vec<&Contribution> = Vec::new();
        for &(v6, len) in self.lengths.keys() {
            if v6 != dst.addr().is_ipv6() || len > dst.prefix_len() {
                continue;
            }
            let Ok(cidr) = IpNet::new(dst.addr(), len) else { continue };
            let cidr = cidr.trunc();
            candidates.extend(at_cidr(&self.blocks, cidr));
        }
        candidates.sort();
        let mut first: Option<&Arc<ClusterRoute>> = None;
        let mut found = Vec::new();
        for r in candidates.iter().flat_map(|c| c.routes.iter()).filter(|r| r.dst == dst) {
            match first {
                Some(k) => found.push(duplicate(k, r)),
                None => first = Some(r),
            }
        }
        let route = match self.overlay.as_ref().and_then(|(o, _)| o.routes.get(&dst)) {
            Some(replacement) => replacement.as_ref().map(|t| match self.answer.get(&dst) {
                Some(now) if **now == *t => now.clone(),
                _ => Arc::new(t.clone()),
            }),
            None => first.cloned(),
        };
        match route {
            Some(r) => {
                if self.answer.get(&dst).is_none_or(|now| !Arc::ptr_eq(now, &r)) {
                    self.answer.insert(dst, r);
                }
            }
            None => {
                self.answer.remove(&dst);
            }
        }
        if found.is_empty() {
            self.duplicates.remove(&dst);
        } else {
            self.duplicates.insert(dst, found);
        }
    }

    /// Take out what block `b` contributed, when it had a contribution.
    fn remove_block(&mut self, b: &IpamBlock) -> Option<Contribution> {
        let gone = self.blocks.take(&At(b.cidr, &b.name) as &dyn PassOrder)?;
        if !gone.block.deleted {
            if let Entry::Occupied(mut e) = self.lengths.entry((b.cidr.addr().is_ipv6(), b.cidr.prefix_len())) {
                *e.get_mut() -= 1;
                if *e.get() == 0 {
                    e.remove();
                }
            }
        }
        for p in &gone.problems {
            if let Entry::Occupied(mut e) = self.problems.entry(p.clone()) {
                *e.get_mut() -= 1;
                if *e.get() == 0 {
                    e.remove();
                }
            }
        }
        Some(gone)
    }

    /// Count in what block `b` contributes (`routes`, `problems`); its entry, to insert.
    fn contribution(&mut self, b: &Arc<IpamBlock>, routes: Vec<ClusterRoute>, problems: Vec<(RouteProblem, Option<PoolClass>)>) -> Contribution {
        if !b.deleted {
            *self.lengths.entry((b.cidr.addr().is_ipv6(), b.cidr.prefix_len())).or_default() += 1;
        }
        for p in &problems {
            *self.problems.entry(p.clone()).or_default() += 1;
        }
        Contribution { block: b.clone(), routes: routes.into_iter().map(Arc::new).collect(), problems: problems.into_boxed_slice() }
    }

    /// Compute the affinity conflicts of `cidr` again; whether they changed.
    fn recheck_affinities(&mut self, cidr: IpNet) -> bool {
        let found: Vec<RouteProblem> = match at_cidr(&self.blocks, cidr).last() {
            Some(c) => at_cidr(&self.affinities, cidr).filter_map(|a| affinity_conflict(&c.block, &a.0)).collect(),
            None => Vec::new(),
        };
        let before = if found.is_empty() { self.conflicts.remove(&cidr) } else { self.conflicts.insert(cidr, found.clone()) };
        before.unwrap_or_default() != found
    }

    /// The answer for the current cluster.
    fn output(&self) -> ClassedRoutes {
        let ctx = Ctx::new(&self.cluster, &self.node, &self.devices);
        let mut problems: Problems = self.problems.keys().cloned().collect();
        problems.extend(ctx.local_problem());
        let Some((overlay, found)) = &self.overlay else { return ClassedRoutes::default() };
        problems.extend(self.duplicates.values().flatten().cloned());
        problems.extend(found.iter().cloned());
        overlay.clear_held(&mut problems);
        problems.extend(self.conflicts.values().flatten().cloned().map(|p| (p, None)));
        ClassedRoutes { routes: self.answer.clone(), problems }
    }
}

/// The problem of `dropped`, a later route to the destination of `kept`.
fn duplicate(kept: &ClusterRoute, dropped: &ClusterRoute) -> (RouteProblem, Option<PoolClass>) {
    (
        RouteProblem::DuplicateDestination { dst: dropped.dst, kept: kept.origin.block().to_string(), dropped: dropped.origin.block().to_string() },
        Some(dropped.class),
    )
}

impl<'a> BlocksByCidr<'a> for &'a State {
    fn lengths(&self) -> Vec<(bool, u8)> {
        self.lengths.keys().copied().collect()
    }

    fn first_live(&self, cidr: IpNet) -> Option<&'a IpamBlock> {
        at_cidr(&self.blocks, cidr).map(|c| &*c.block).find(|b| !b.deleted)
    }
}
