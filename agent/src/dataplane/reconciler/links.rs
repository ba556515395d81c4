//! [`Links`]: the reconciler's cache of the host's links (ifindex, name, up or down). Every full
//! resync refills it from a link dump, link events keep it current in between; it names the
//! device of a route the kernel reports (the kernel gives an ifindex) and resolves the device
//! of a route we write (we name it).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::dataplane::kernel::netlink::LinkInfo;
use crate::dataplane::kernel::route::{KernelRoute, ObservedRoute};
use crate::dataplane::reconciler::report::ErrorKind;

/// The link cache, indexed both ways. Ordered maps: a host has a handful of links, and every
/// route of an apply resolves its device here (twice on a cold start), where a few string
/// compares cost less than hashing the name.
#[derive(Debug, Default)]
pub(super) struct Links {
    by_index: BTreeMap<u32, Link>,
    by_name: BTreeMap<String, u32>,
    /// A desired route named a device we do not know: dump the links again on the next apply.
    refresh: bool,
}

/// One cached link: its name, shared with every route named through it (naming a dumped route
/// copies no string), and whether it is up.
#[derive(Debug)]
struct Link {
    name: Arc<str>,
    up: bool,
}

/// What a link event changed, for the routes through the link.
#[derive(Debug)]
pub(super) struct LinkChange {
    /// The link is new, went down or came up: its IPv4 routes may have been flushed without a
    /// notification, so they are re-verified with a replace. A rename alone loses nothing.
    pub(super) maybe_flushed: bool,
    /// The name the link had before a rename, if that name still pointed at it.
    pub(super) old_name: Option<String>,
}

impl Links {
    /// Replace the cache with a fresh link dump.
    pub(super) fn replace(&mut self, links: &[LinkInfo]) {
        self.by_index = links.iter().map(|l| (l.index, Link { name: l.name.as_str().into(), up: l.up })).collect();
        self.by_name = links.iter().map(|l| (l.name.clone(), l.index)).collect();
    }

    /// `route` with its output device named (`if<N>` for an ifindex the cache does not know).
    pub(super) fn name(&self, route: &ObservedRoute) -> KernelRoute {
        route.named(|i| self.name_of(i).cloned())
    }

    /// The name of link `index`, if known.
    pub(super) fn name_of(&self, index: u32) -> Option<&Arc<str>> {
        self.by_index.get(&index).map(|l| &l.name)
    }

    /// Whether the link at `index` is known and up.
    pub(super) fn is_up(&self, index: u32) -> bool {
        self.by_index.get(&index).is_some_and(|l| l.up)
    }

    /// The ifindex to write a route through `device` with (`None` for no device).
    ///
    /// # Errors
    /// ([`ErrorKind::NoDevice`], name) for a device the cache does not know,
    /// ([`ErrorKind::DeviceDown`], name) for one that is down.
    pub(super) fn resolve(&self, device: Option<&str>) -> Result<Option<u32>, (ErrorKind, String)> {
        let Some(name) = device else { return Ok(None) };
        let Some(index) = self.by_name.get(name) else {
            return Err((ErrorKind::NoDevice, name.to_string()));
        };
        match self.by_index.get(index) {
            Some(l) if l.up => Ok(Some(*index)),
            _ => Err((ErrorKind::DeviceDown, name.to_string())),
        }
    }

    /// [`resolve`](Self::resolve) for a walk over many routes: see [`ResolveMemo`].
    pub(super) fn memo<'d>(&self) -> ResolveMemo<'_, 'd> {
        ResolveMemo { links: self, known: Vec::new() }
    }

    /// Record that link `index` is called `name` and is up or down. `None` when nothing the
    /// reconciler cares about changed (the watcher reports a link it had not seen yet).
    pub(super) fn update(&mut self, index: u32, name: &str, up: bool) -> Option<LinkChange> {
        let prev = self.by_index.get(&index);
        if prev.is_some_and(|p| &*p.name == name && p.up == up) {
            return None;
        }
        let maybe_flushed = prev.is_none_or(|p| p.up != up);
        let old_name = prev.filter(|p| &*p.name != name && self.by_name.get(&*p.name) == Some(&index)).map(|p| p.name.to_string());
        if let Some(old) = &old_name {
            self.by_name.remove(old);
        }
        self.by_index.insert(index, Link { name: name.into(), up });
        self.by_name.insert(name.to_string(), index);
        Some(LinkChange { maybe_flushed, old_name })
    }

    /// Drop the name `name` (a link was renamed away from it).
    pub(super) fn forget_name(&mut self, name: &str) {
        self.by_name.remove(name);
    }

    /// Link `index`, called `name`, is gone.
    pub(super) fn remove(&mut self, index: u32, name: &str) {
        self.by_index.remove(&index);
        if self.by_name.get(name) == Some(&index) {
            self.by_name.remove(name);
        }
    }

    /// Dump the links again on the next apply (a desired route names a device we do not know).
    pub(super) fn request_refresh(&mut self) {
        self.refresh = true;
    }

    /// Whether a refresh was requested since the last call.
    pub(super) fn take_refresh(&mut self) -> bool {
        std::mem::take(&mut self.refresh)
    }
}

/// [`Links::resolve`] for a walk over many routes (`'d`: the routes the device names are
/// borrowed from), with the answers for the first [`MEMO_DEVICES`] devices that resolved
/// kept: the routes of a walk name two or three devices between them (in any order: with
/// CrossSubnet, tunnel and host NIC alternate from one block to the next), so each costs a
/// few string compares instead of two map lookups (a cold start of 10,000 routes resolves
/// every device once more for its report, after the kernel's last answer). Errors
/// are not kept: each is answered by [`Links::resolve`] again, as without the memo.
pub(super) struct ResolveMemo<'l, 'd> {
    links: &'l Links,
    known: Vec<(&'d str, Option<u32>)>,
}

/// How many devices a [`ResolveMemo`] keeps answers for (more are resolved each time).
const MEMO_DEVICES: usize = 8;

impl<'d> ResolveMemo<'_, 'd> {
    /// What [`Links::resolve`] answers for `device`.
    ///
    /// # Errors
    /// As [`Links::resolve`]: an unknown device, or one that is down.
    pub(super) fn resolve(&mut self, device: Option<&'d str>) -> Result<Option<u32>, (ErrorKind, String)> {
        let Some(name) = device else { return Ok(None) };
        // The routes of a walk share their device names (one `Arc<str>` per device): the same
        // address and length answer before the bytes are compared.
        if let Some((_, oif)) = self.known.iter().find(|(known, _)| std::ptr::eq(*known, name) || *known == name) {
            return Ok(*oif);
        }
        let answer = self.links.resolve(Some(name));
        if let Ok(oif) = answer {
            if self.known.len() < MEMO_DEVICES {
                self.known.push((name, oif));
            }
        }
        answer
    }
}

#[cfg(test)]
mod tests;
