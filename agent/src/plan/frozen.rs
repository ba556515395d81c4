//! Frozen ground: the prefixes in which nothing is deleted or claimed while an object or
//! input that could decide them is broken, and the input errors that hold every deletion.

use ipnet::IpNet;
use serde::Serialize;

use crate::datastore::Snapshot;
use crate::model::{Kind, MAX_FROZEN_PER_INPUT};

/// One prefix of frozen ground.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct FrozenPrefix {
    /// The prefix (an address as a host prefix).
    pub cidr: IpNet,
    /// The object or input that freezes it (its error, naming object and field).
    pub reason: String,
}
/// Frozen ground of `snapshot`: the CIDRs of every rejected object without a last good version
/// (invalid IP pools included) and of every broken input's text, and what a rejected Node
/// routes (below). Sorted, one entry per prefix.
///
/// A Node rejected with no last good version (unparsable, invalid, or defined twice) is
/// absent from the cluster, so its blocks' routes and the routes of the IPs it borrowed are not
/// computed, and without this their routes would be deleted (after a restart, when there is
/// no last good version to stand in) or rewritten through another definition's address. Every
/// IPAM block affine to it and every allocation attributed to it (`secondary.node`, its
/// borrowed IPs and tunnel addresses) is frozen ground until a good version is back.
pub fn frozen_ground(snapshot: &Snapshot) -> Vec<FrozenPrefix> {
    let mut out: Vec<FrozenPrefix> = Vec::new();
    let mut rejected_nodes: std::collections::BTreeMap<&str, String> = std::collections::BTreeMap::new();
    // Per input, at most MAX_FROZEN_PER_INPUT prefixes one by one: 1,000 invalid objects of
    // 1,000 addresses each froze 1,001,000 prefixes (the cap was per object), which the
    // reconciler compares every route against.
    let mut per_input: std::collections::BTreeMap<&std::path::Path, std::collections::BTreeSet<IpNet>> = std::collections::BTreeMap::new();
    let mut whole: std::collections::BTreeSet<&std::path::Path> = std::collections::BTreeSet::new();
    for e in snapshot.object_errors.iter().filter(|e| !e.last_good) {
        if !whole.contains(e.file.as_path()) {
            let seen = per_input.entry(e.file.as_path()).or_default();
            seen.extend(e.cidrs.iter().copied());
            if seen.len() > MAX_FROZEN_PER_INPUT {
                per_input.remove(e.file.as_path());
                whole.insert(e.file.as_path());
            }
        }
        // No good definition stands in for it: a kept one marks the error `last_good`, and
        // one in another input is refused with it (`ClusterBuilder::finish`).
        if let Some((Kind::Node, name)) = e.error.object() {
            rejected_nodes.entry(name).or_insert_with(|| e.to_string());
        }
    }
    for e in snapshot.object_errors.iter().filter(|e| !e.last_good && !whole.contains(e.file.as_path()) && !e.cidrs.is_empty()) {
        let reason = e.to_string();
        out.extend(e.cidrs.iter().map(|c| FrozenPrefix { cidr: *c, reason: reason.clone() }));
    }
    for file in &whole {
        let reason = format!(
            "{}: its invalid objects name more than {MAX_FROZEN_PER_INPUT} prefixes: the whole address space is frozen until they are fixed (routewarden explain lists them)",
            file.display()
        );
        for space in ["0.0.0.0/0", "::/0"] {
            out.push(FrozenPrefix { cidr: space.parse().unwrap_or_default(), reason: reason.clone() });
        }
    }
    for e in &snapshot.load_errors {
        out.extend(e.cidrs.iter().map(|c| FrozenPrefix { cidr: *c, reason: e.to_string() }));
    }
    if !rejected_nodes.is_empty() {
        for block in snapshot.cluster.ipam_blocks.values() {
            if let Some(reason) = block.host().and_then(|h| rejected_nodes.get(h)) {
                out.push(FrozenPrefix { cidr: block.cidr, reason: format!("IPAM block {} of a rejected Node: {reason}", block.cidr) });
            }
            for a in block.allocated() {
                if let Some(reason) = a.attributes.node().and_then(|n| rejected_nodes.get(n)) {
                    out.push(FrozenPrefix { cidr: IpNet::from(a.ip), reason: format!("{} allocated to a rejected Node: {reason}", a.ip) });
                }
            }
        }
    }
    out.sort();
    out.dedup_by(|a, b| a.cidr == b.cidr);
    out
}

/// Why no route may be deleted or rewritten anywhere now, if so: an input that never loaded,
/// or a file that is there but cannot be read (its last good content stands in, but what it
/// says now is unknown). Either could want any route, or define an object again (a second
/// definition is refused with the first, so a route through the one that loaded could be
/// wrong): deletions and rewrites of routes in the kernel wait; missing routes are added.
pub(super) fn hold_all(snapshot: &Snapshot) -> Option<String> {
    snapshot.load_errors.iter().find(|e| e.never_loaded || e.kind == crate::datastore::LoadErrorKind::Io).map(|e| {
        if e.never_loaded {
            format!("input {} never loaded ({}): no deletion or rewrite can be justified while it is broken", e.file.display(), e.message)
        } else {
            format!(
                "input {} cannot be read ({}): its last good content is kept, and no deletion or rewrite can be justified while it is unreadable",
                e.file.display(),
                e.message
            )
        }
    })
}
