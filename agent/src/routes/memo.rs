//! The route pass kept between snapshots: [`RouteMemo`] answers what
//! [`classed_routes`](super::classed_routes) answers, from the previous answer and the IPAM
//! blocks and BlockAffinities that changed since, so that a snapshot in which one block of
//! 100,000 changed costs a walk over the block map (pointer comparisons), the work of that
//! block and a copy of the routes, not a pass that computes every route again (issue 23: the
//! full pass was 60 % of the agent's CPU at 1,000 block changes a second, and the event →
//! plan latency twice its length).
//!
//! What is kept, all derived from the cluster of the previous call:
//! - every block by (CIDR, name), the order in which the full pass visits them, with the
//!   routes and problems it contributes (`compute::block_routes`);
//! - the blocks' problems, counted (several blocks report the same one);
//! - the active BlockAffinities by CIDR and the affinity conflicts of each CIDR.
//!
//! The answer walks the blocks in that order: their routes come out sorted by destination
//! (blocks do not overlap, and a block's borrowed /32s lie inside it and follow its own
//! route), two routes to one destination keep the first as the full pass does (a
//! [`RouteProblem::DuplicateDestination`] for each later one), and when blocks overlap the
//! routes are sorted (stably, so "first" is still the block order). The tunnel-address rule
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

use super::compute::{affinity_conflict, block_routes, tunnel_address_routes, BlocksByCidr, Ctx, Problems};
use super::{ClassedRoutes, ClusterRoute, RouteDevices, RouteProblem};
use crate::model::{BlockAffinity, Cluster, IpamBlock};
use crate::vocabulary::PoolClass;

/// A block's (or an affinity's) place in the pass: its CIDR, then its name.
type BlockKey = (IpNet, Arc<str>);

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
        let reusable = self.state.as_ref().is_some_and(|s| s.node == node && s.classes == *classes && s.devices == *devices && s.context_equals(cluster));
        if !reusable {
            self.state = None;
        }
        let state = self.state.get_or_insert_with(|| State::new(node, classes, devices));
        state.update(cluster);
        state.output()
    }
}

/// What one IPAM block contributes.
#[derive(Debug)]
struct Contribution {
    block: Arc<IpamBlock>,
    /// In the order the full pass adds them.
    routes: Box<[ClusterRoute]>,
    problems: Box<[(RouteProblem, Option<PoolClass>)]>,
}

#[derive(Debug)]
struct State {
    node: String,
    classes: BTreeSet<PoolClass>,
    devices: RouteDevices,
    /// The cluster everything here describes.
    cluster: Arc<Cluster>,
    /// Every IPAM block, deleted ones included.
    blocks: BTreeMap<BlockKey, Contribution>,
    /// (IPv6, prefix length) of blocks not deleted, with how many.
    lengths: BTreeMap<(bool, u8), usize>,
    /// The blocks' problems, each with how many blocks report it.
    problems: BTreeMap<(RouteProblem, Option<PoolClass>), usize>,
    /// Active BlockAffinities by (CIDR, name).
    affinities: BTreeMap<BlockKey, Arc<BlockAffinity>>,
    /// Affinity conflicts per CIDR; never an empty list.
    conflicts: BTreeMap<IpNet, Vec<RouteProblem>>,
    /// The least name, to start a range at a CIDR.
    least: Arc<str>,
}

impl State {
    fn new(node: &str, classes: &BTreeSet<PoolClass>, devices: &RouteDevices) -> State {
        State {
            node: node.to_owned(),
            classes: classes.clone(),
            devices: devices.clone(),
            cluster: Arc::new(Cluster::default()),
            blocks: BTreeMap::new(),
            lengths: BTreeMap::new(),
            problems: BTreeMap::new(),
            affinities: BTreeMap::new(),
            conflicts: BTreeMap::new(),
            least: Arc::from(""),
        }
    }

    /// Whether what a block's contribution depends on besides the block is `cluster`'s too:
    /// the IP pools and the Nodes (compared by pointer first). A state without blocks has
    /// nothing that depends on them.
    fn context_equals(&self, cluster: &Cluster) -> bool {
        self.blocks.is_empty() || (self.cluster.ip_pools == cluster.ip_pools && self.cluster.nodes == cluster.nodes)
    }

    /// Bring the state from its cluster to `cluster`, whose pools and Nodes are the same
    /// ([`State::context_equals`]) unless the state holds no block.
    fn update(&mut self, cluster: &Arc<Cluster>) {
        if Arc::ptr_eq(&self.cluster, cluster) {
            return;
        }
        let old = std::mem::replace(&mut self.cluster, cluster.clone());
        let (node, devices) = (self.node.clone(), self.devices.clone());
        let ctx = Ctx::new(cluster, &node, &devices);
        let mut touched: BTreeSet<IpNet> = BTreeSet::new();
        let (mut routes, mut problems) = (Vec::new(), Vec::new());
        // A first fill is built in one piece from sorted entries (full tree nodes: at 100,000
        // blocks a third less memory than inserting one by one in name order).
        let (mut new_blocks, mut new_affinities) = (Vec::new(), Vec::new());
        let (fresh_blocks, fresh_affinities) = (self.blocks.is_empty(), self.affinities.is_empty());
        old.ipam_blocks.diff(&cluster.ipam_blocks, |_, before, after| {
            if let Some(b) = before {
                touched.insert(self.remove_block(b));
            }
            if let Some(b) = after {
                block_routes(&ctx, b, &self.classes, &mut routes, &mut problems);
                let (key, contribution) = self.contribution(b, std::mem::take(&mut routes), std::mem::take(&mut problems));
                touched.insert(key.0);
                if fresh_blocks {
                    new_blocks.push((key, contribution));
                } else {
                    self.blocks.insert(key, contribution);
                }
            }
        });
        old.block_affinities.diff(&cluster.block_affinities, |name, before, after| {
            for (a, add) in [(before, false), (after, true)] {
                let Some(a) = a.filter(|a| a.is_active()) else { continue };
                let key = (a.cidr, name.clone());
                touched.insert(a.cidr);
                if !add {
                    self.affinities.remove(&key);
                } else if fresh_affinities {
                    new_affinities.push((key, a.clone()));
                } else {
                    self.affinities.insert(key, a.clone());
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
            self.recheck_affinities(cidr);
        }
    }

    /// Take out what block `b` contributed; its CIDR.
    fn remove_block(&mut self, b: &IpamBlock) -> IpNet {
        let Some(gone) = self.blocks.remove(&(b.cidr, b.name.clone())) else { return b.cidr };
        if !gone.block.deleted {
            if let Entry::Occupied(mut e) = self.lengths.entry((b.cidr.addr().is_ipv6(), b.cidr.prefix_len())) {
                *e.get_mut() -= 1;
                if *e.get() == 0 {
                    e.remove();
                }
            }
        }
        for p in gone.problems.into_vec() {
            if let Entry::Occupied(mut e) = self.problems.entry(p) {
                *e.get_mut() -= 1;
                if *e.get() == 0 {
                    e.remove();
                }
            }
        }
        b.cidr
    }

    /// Count in what block `b` contributes (`routes`, `problems`); its entry, to insert.
    fn contribution(&mut self, b: &Arc<IpamBlock>, routes: Vec<ClusterRoute>, problems: Vec<(RouteProblem, Option<PoolClass>)>) -> (BlockKey, Contribution) {
        if !b.deleted {
            *self.lengths.entry((b.cidr.addr().is_ipv6(), b.cidr.prefix_len())).or_default() += 1;
        }
        for p in &problems {
            *self.problems.entry(p.clone()).or_default() += 1;
        }
        ((b.cidr, b.name.clone()), Contribution { block: b.clone(), routes: routes.into_boxed_slice(), problems: problems.into_boxed_slice() })
    }

    /// The entries of `map` at `cidr`, by name.
    fn at_cidr<'m, V>(&self, map: &'m BTreeMap<BlockKey, V>, cidr: IpNet) -> impl Iterator<Item = &'m V> {
        map.range((cidr, self.least.clone())..).take_while(move |(k, _)| k.0 == cidr).map(|(_, v)| v)
    }

    /// Compute the affinity conflicts of `cidr` again.
    fn recheck_affinities(&mut self, cidr: IpNet) {
        let found: Vec<RouteProblem> = match self.at_cidr(&self.blocks, cidr).last() {
            Some(c) => self.at_cidr(&self.affinities, cidr).filter_map(|a| affinity_conflict(&c.block, a)).collect(),
            None => Vec::new(),
        };
        if found.is_empty() {
            self.conflicts.remove(&cidr);
        } else {
            self.conflicts.insert(cidr, found);
        }
    }

    /// The answer for the current cluster.
    fn output(&self) -> ClassedRoutes {
        let ctx = Ctx::new(&self.cluster, &self.node, &self.devices);
        let mut problems: Problems = self.problems.keys().cloned().collect();
        problems.extend(ctx.local_problem());

        // Every block's routes in block order; sorted by destination unless blocks overlap.
        let mut all: Vec<&ClusterRoute> = Vec::with_capacity(self.blocks.len());
        let mut sorted = true;
        for c in self.blocks.values() {
            for r in &*c.routes {
                sorted &= all.last().is_none_or(|l| l.dst < r.dst);
                all.push(r);
            }
        }
        if !sorted {
            all.sort_by_key(|r| r.dst); // stable: the first in block order stays first
        }
        let overlay = tunnel_address_routes(&ctx, &self, &self.classes, &mut problems);
        overlay.clear_held(&mut problems);
        problems.extend(self.conflicts.values().flatten().cloned().map(|p| (p, None)));

        let mut routes: Vec<ClusterRoute> = Vec::with_capacity(all.len() + overlay.routes.len());
        let mut tunnel = overlay.routes.into_iter().peekable();
        let mut kept: Option<&ClusterRoute> = None;
        for r in all {
            if let Some(k) = kept.filter(|k| k.dst == r.dst) {
                problems.insert((
                    RouteProblem::DuplicateDestination { dst: r.dst, kept: k.origin.block().to_string(), dropped: r.origin.block().to_string() },
                    Some(r.class),
                ));
                continue;
            }
            kept = Some(r);
            while let Some((_, t)) = tunnel.next_if(|(t, _)| *t < r.dst) {
                routes.extend(t);
            }
            match tunnel.next_if(|(t, _)| *t == r.dst) {
                Some((_, t)) => routes.extend(t),
                None => routes.push(r.clone()),
            }
        }
        routes.extend(tunnel.filter_map(|(_, t)| t));
        ClassedRoutes { routes, problems }
    }
}

impl<'a> BlocksByCidr<'a> for &'a State {
    fn lengths(&self) -> Vec<(bool, u8)> {
        self.lengths.keys().copied().collect()
    }

    fn first_live(&self, cidr: IpNet) -> Option<&'a IpamBlock> {
        self.at_cidr(&self.blocks, cidr).map(|c| &*c.block).find(|b| !b.deleted)
    }
}
