//! The desired route set as one sorted vector: replaced whole by every `set_desired`, looked
//! up by key (binary search) and walked in key order, never edited in place; so it needs no
//! tree, and building it from the converted routes (already sorted) costs no allocation per
//! route (a cold start of 10,000 routes: issue 18 part 1).

use crate::dataplane::kernel_route::{DesiredRoute, RouteKey};

/// Desired routes in ascending key order, one per key.
#[derive(Debug, Default)]
pub(super) struct DesiredRoutes {
    routes: Vec<(RouteKey, DesiredRoute)>,
}

impl DesiredRoutes {
    /// The set of `routes`, which must be in ascending key order with no key twice (checked
    /// in debug builds).
    pub(super) fn from_sorted(routes: Vec<(RouteKey, DesiredRoute)>) -> Self {
        debug_assert!(routes.is_sorted_by(|a, b| a.0 < b.0), "desired routes not in strict key order");
        DesiredRoutes { routes }
    }

    /// How many routes are desired.
    pub(super) fn len(&self) -> usize {
        self.routes.len()
    }

    /// The route desired at `key`.
    pub(super) fn get(&self, key: &RouteKey) -> Option<&DesiredRoute> {
        self.routes.binary_search_by(|(k, _)| k.cmp(key)).ok().map(|i| &self.routes[i].1)
    }

    /// Whether a route is desired at `key`.
    pub(super) fn contains_key(&self, key: &RouteKey) -> bool {
        self.get(key).is_some()
    }

    /// Every desired route with its key, in key order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&RouteKey, &DesiredRoute)> + '_ {
        self.routes.iter().map(|(k, d)| (k, d))
    }

    /// Every desired key, in order.
    pub(super) fn keys(&self) -> impl Iterator<Item = &RouteKey> + '_ {
        self.routes.iter().map(|(k, _)| k)
    }

    /// Every desired route, in key order.
    pub(super) fn values(&self) -> impl Iterator<Item = &DesiredRoute> + '_ {
        self.routes.iter().map(|(_, d)| d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::kernel_route::{to_kernel_route, RouteSettings};
    use crate::routes::{ClusterRoute, RouteOrigin};
    use crate::vocabulary::{PoolClass, RoutePath};

    fn desired(dst: &str) -> (RouteKey, DesiredRoute) {
        let r = ClusterRoute {
            dst: dst.parse().unwrap(),
            path: RoutePath::Blackhole,
            gateway: None,
            device: None,
            class: PoolClass::Ipip,
            pool: "pool".into(),
            origin: RouteOrigin::OwnBlock { block: "b".into() },
        };
        let d = to_kernel_route(&r, &RouteSettings::default()).unwrap();
        (d.route.key, d)
    }

    #[test]
    fn finds_every_key_and_only_those() {
        let routes: Vec<_> = ["10.0.0.0/26", "10.0.0.64/26", "10.0.1.0/26", "fd00::/122"].into_iter().map(desired).collect();
        let keys: Vec<RouteKey> = routes.iter().map(|(k, _)| *k).collect();
        let set = DesiredRoutes::from_sorted(routes);
        for k in &keys {
            assert_eq!(set.get(k).map(|d| d.route.key), Some(*k));
        }
        assert_eq!(set.keys().copied().collect::<Vec<_>>(), keys);
        assert_eq!((set.values().count(), set.len()), (4, 4));
        for absent in ["10.0.0.0/25", "10.0.0.128/26", "9.0.0.0/26", "fd00::40/122"] {
            assert!(!set.contains_key(&desired(absent).0), "{absent}");
        }
        assert!(!DesiredRoutes::default().contains_key(&keys[0]));
    }
}
