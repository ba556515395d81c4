//! The desired route set as one sorted vector: replaced whole by a whole `set_desired`, brought
//! to the plan's next routes by `patched` (a few changes inserted and removed in place, more in
//! one pass that moves the rest), looked up by key (binary search) and walked in key order; so
//! it needs no tree, and building it from the converted routes (already sorted) costs no
//! allocation per route (a cold start of 10,000 routes). Each route's key is the one in it
//! (`route.key`), not stored again beside it: 112 bytes a route instead of 144.

use crate::dataplane::kernel::route::{DesiredRoute, RouteKey};
use crate::vocabulary::PoolClass;

/// Most changes [`DesiredSet::patched`] makes in place; more rebuild the set in one pass.
const IN_PLACE: usize = 4;

/// Desired routes in ascending key (`route.key`) order, one per key.
#[derive(Debug, Default)]
pub(super) struct DesiredSet {
    routes: Vec<DesiredRoute>,
}

impl DesiredSet {
    /// The set of `routes`, which must be in ascending key order with no key twice (checked
    /// in debug builds).
    pub(super) fn from_sorted(routes: Vec<DesiredRoute>) -> Self {
        debug_assert!(routes.is_sorted_by(|a, b| a.route.key < b.route.key), "desired routes not in strict key order");
        DesiredSet { routes }
    }

    /// This set with `gone` keys taken out and `adds` put in (both ascending, each key once;
    /// an added key that is also gone is replaced): the new set, the keys that left it with
    /// their class, and the keys added or changed (ascending). One pass that moves every route
    /// (none converted or compared but the added ones).
    pub(super) fn patched(mut self, adds: Vec<DesiredRoute>, gone: &[RouteKey]) -> (DesiredSet, Vec<(RouteKey, PoolClass)>, Vec<RouteKey>) {
        if adds.len() + gone.len() <= IN_PLACE {
            let (removed, changed) = self.patch_in_place(adds, gone);
            return (self, removed, changed);
        }
        let mut out = Vec::with_capacity(self.routes.len() + adds.len());
        let (mut removed, mut changed) = (Vec::new(), Vec::new());
        let mut adds = adds.into_iter().peekable();
        let mut gone = gone.iter().peekable();
        for old in self.routes {
            let key = old.route.key;
            while let Some(a) = adds.next_if(|a| a.route.key < key) {
                changed.push(a.route.key);
                out.push(a);
            }
            while gone.next_if(|g| **g < key).is_some() {}
            let was_gone = gone.next_if(|g| **g == key).is_some();
            if let Some(a) = adds.next_if(|a| a.route.key == key) {
                if a != old {
                    changed.push(key);
                }
                out.push(a);
            } else if was_gone {
                removed.push((key, old.class));
            } else {
                out.push(old);
            }
        }
        for a in adds {
            changed.push(a.route.key);
            out.push(a);
        }
        (DesiredSet { routes: out }, removed, changed)
    }

    /// [`DesiredSet::patched`] of a few changes, each found by binary search and inserted or
    /// removed where it lies: a move of the routes after it, in the vector the set has (a new
    /// one of 55,000 routes is 6 MB to allocate and fault in).
    fn patch_in_place(&mut self, adds: Vec<DesiredRoute>, gone: &[RouteKey]) -> (Vec<(RouteKey, PoolClass)>, Vec<RouteKey>) {
        let mut removed = Vec::new();
        for key in gone {
            if adds.binary_search_by(|a| a.route.key.cmp(key)).is_ok() {
                continue;
            }
            if let Ok(i) = self.routes.binary_search_by(|d| d.route.key.cmp(key)) {
                removed.push((*key, self.routes.remove(i).class));
            }
        }
        let mut changed = Vec::with_capacity(adds.len());
        for a in adds {
            let key = a.route.key;
            match self.routes.binary_search_by(|d| d.route.key.cmp(&key)) {
                Ok(i) => {
                    if self.routes[i] != a {
                        self.routes[i] = a;
                        changed.push(key);
                    }
                }
                Err(i) => {
                    self.routes.insert(i, a);
                    changed.push(key);
                }
            }
        }
        (removed, changed)
    }

    /// How many routes are desired.
    pub(super) fn len(&self) -> usize {
        self.routes.len()
    }

    /// Whether no route is desired.
    pub(super) fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// The route desired at `key`.
    pub(super) fn get(&self, key: &RouteKey) -> Option<&DesiredRoute> {
        self.get_ascending(key, &mut 0)
    }

    /// The route desired at `key`, for keys looked up in ascending order: `from` is where the
    /// previous lookup ended (0 for the first) and moves past the keys below `key`, so it stays
    /// on a key found. A key that is the found one's successor in the set (every key of a cold
    /// start) costs two comparisons, any other a binary search of what is left.
    pub(super) fn get_ascending(&self, key: &RouteKey, from: &mut usize) -> Option<&DesiredRoute> {
        let rest = self.routes.get(*from..).unwrap_or_default();
        *from += match rest {
            [first, ..] if first.route.key >= *key => 0,
            [_, second, ..] if second.route.key >= *key => 1,
            _ => rest.partition_point(|d| d.route.key < *key),
        };
        self.routes.get(*from).filter(|d| d.route.key == *key)
    }

    /// Whether a route is desired at `key`.
    pub(super) fn contains_key(&self, key: &RouteKey) -> bool {
        self.get(key).is_some()
    }

    /// Every desired route with its key, in key order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&RouteKey, &DesiredRoute)> + '_ {
        self.routes.iter().map(|d| (&d.route.key, d))
    }

    /// Every desired key, in order.
    pub(super) fn keys(&self) -> impl Iterator<Item = &RouteKey> + '_ {
        self.routes.iter().map(|d| &d.route.key)
    }

    /// Every desired route, in key order.
    pub(super) fn values(&self) -> impl Iterator<Item = &DesiredRoute> + '_ {
        self.routes.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::kernel::route::{to_kernel_route, RouteSettings};
    use crate::routes::{ClusterRoute, RouteOrigin};
    use crate::vocabulary::{PoolClass, RoutePath};

    fn desired(dst: &str) -> DesiredRoute {
        let r = ClusterRoute {
            dst: dst.parse().unwrap(),
            path: RoutePath::Blackhole,
            gateway: None,
            device: None,
            class: PoolClass::Ipip,
            pool: "pool".into(),
            origin: RouteOrigin::OwnBlock { block: "b".into() },
        };
        to_kernel_route(&r, &RouteSettings::default()).unwrap()
    }

    #[test]
    fn finds_every_key_and_only_those() {
        let routes: Vec<_> = ["10.0.0.0/26", "10.0.0.64/26", "10.0.1.0/26", "fd00::/122"].into_iter().map(desired).collect();
        let keys: Vec<RouteKey> = routes.iter().map(|d| d.route.key).collect();
        let set = DesiredSet::from_sorted(routes);
        for k in &keys {
            assert_eq!(set.get(k).map(|d| d.route.key), Some(*k));
        }
        assert_eq!(set.keys().copied().collect::<Vec<_>>(), keys);
        assert_eq!((set.values().count(), set.len()), (4, 4));
        for absent in ["10.0.0.0/25", "10.0.0.128/26", "9.0.0.0/26", "fd00::40/122"] {
            assert!(!set.contains_key(&desired(absent).route.key), "{absent}");
        }
        assert!(!DesiredSet::default().contains_key(&keys[0]));
        // Ascending lookups: every key, every other key, absent keys in between, past the end.
        for step in [1, 2] {
            let mut from = 0;
            for k in keys.iter().step_by(step) {
                assert_eq!(set.get_ascending(k, &mut from).map(|d| d.route.key), Some(*k));
            }
        }
        let mut from = 0;
        let probes = ["9.0.0.0/26", "10.0.0.0/26", "10.0.0.0/25", "10.0.0.128/26", "10.0.1.0/26", "fd00::/122", "fd00::40/122"];
        let found: Vec<bool> = probes.iter().map(|p| set.get_ascending(&desired(p).route.key, &mut from).is_some()).collect();
        assert_eq!(found, [false, true, false, false, true, true, false]);
        assert_eq!(from, 4);
        assert!(DesiredSet::default().get_ascending(&keys[0], &mut 0).is_none());
    }
}
