//! The desired set brought from the plan's last route map to its next one
//! ([`Reconciler::set_desired_routes`]): the two maps are compared chunk by chunk
//! ([`crate::model::SharedMap::diff`]), only the routes that changed are converted, and the set
//! is rebuilt in one pass that moves the others ([`DesiredSet::patched`]), so a plan that moved
//! one route of 55,000 costs that route and a move of the set, not converting and comparing
//! every route.

use super::{convert_route, Handover, Reconciler};
use crate::dataplane::kernel::netlink::{Clock, RouteNetlink};
use crate::dataplane::kernel::route::{DesiredRoute, RouteKey};
use crate::routes::{ClusterRoute, RouteMap};

impl<N: RouteNetlink, C: Clock> Reconciler<N, C> {
    /// Set the complete desired route set from the plan's routes (one per destination, the
    /// `SetDesired` the app sends), as [`set_desired_with_handover`](Self::set_desired_with_handover)
    /// of the same routes does. From the second call on, when the last call's routes were all
    /// converted and nexthop objects are as they were, only the destinations whose route
    /// differs from the last map's are converted; otherwise (a cold start, a route that could
    /// not be converted, two destinations with one key) every route is, as there.
    pub fn set_desired_routes(&mut self, routes: &RouteMap, handovers: &[Handover]) {
        let nexthops = self.nexthops.enabled();
        let step = match &self.last_routes {
            Some((last, was)) if *was == nexthops && !self.desired.is_empty() && self.bad_desired.is_empty() => self.delta(last, routes, nexthops),
            _ => None,
        };
        if let Some((adds, gone)) = step {
            let (next, removed, changed) = std::mem::take(&mut self.desired).patched(adds, &gone);
            self.take_desired(next, removed, changed, handovers, false);
        } else {
            let all: Vec<ClusterRoute> = routes.values().map(|r| (**r).clone()).collect();
            self.set_desired_with_handover(&all, handovers);
        }
        self.last_routes = self.bad_desired.is_empty().then(|| (routes.clone(), nexthops));
    }

    /// The routes to add (converted, ascending, one per key) and the keys that go, from `last`
    /// to `routes`; `None` when a route cannot be converted or two land on one key.
    fn delta(&self, last: &RouteMap, routes: &RouteMap, nexthops: bool) -> Option<(Vec<DesiredRoute>, Vec<RouteKey>)> {
        let (mut adds, mut gone, mut failed) = (Vec::new(), Vec::new(), false);
        last.diff(routes, |_, before, after| {
            if let Some(b) = before {
                match convert_route(b, &self.settings, nexthops) {
                    Ok(d) => gone.push(d.route.key),
                    Err(_) => failed = true,
                }
            }
            if let Some(a) = after {
                match convert_route(a, &self.settings, nexthops) {
                    Ok(d) => adds.push(d),
                    Err(_) => failed = true,
                }
            }
        });
        if failed {
            return None;
        }
        adds.sort_by_key(|d| d.route.key);
        gone.sort_unstable();
        gone.dedup();
        adds.windows(2).all(|w| w[0].route.key < w[1].route.key).then_some((adds, gone))
    }
}
