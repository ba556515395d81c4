//! The plan's cluster routes converted to the kernel routes the reconciler programs.

use crate::dataplane::kernel::nexthop::NexthopKey;
use crate::dataplane::kernel::route::{to_kernel_route, ConversionError, DesiredRoute, RouteKind, RouteSettings};
use crate::routes::ClusterRoute;

/// Each of `routes` converted to the route to program, in the order given; with nexthop
/// objects, a unicast route to a node also names its object (node, IP pool). Failures go to
/// `bad`, in the same order. Also returns whether the converted routes' keys are strictly
/// ascending (checked as each is added: a cold start's 10,000 routes are not read again).
pub(super) fn convert_routes<'r>(
    routes: impl ExactSizeIterator<Item = &'r ClusterRoute>,
    settings: &RouteSettings,
    nexthops: bool,
    bad: &mut Vec<ConversionError>,
) -> (Vec<DesiredRoute>, bool) {
    let mut converted: Vec<DesiredRoute> = Vec::with_capacity(routes.len());
    let mut ascending = true;
    for r in routes {
        match convert_route(r, settings, nexthops) {
            Ok(d) => {
                if let Some(last) = converted.last() {
                    ascending &= last.route.key < d.route.key;
                }
                converted.push(d);
            }
            Err(e) => bad.push(e),
        }
    }
    (converted, ascending)
}

/// `route` converted to the route to program; with nexthop objects, a unicast route to a node
/// also names its object (node, IP pool).
pub(super) fn convert_route(route: &ClusterRoute, settings: &RouteSettings, nexthops: bool) -> Result<DesiredRoute, ConversionError> {
    let mut d = to_kernel_route(route, settings)?;
    if nexthops && d.route.target.kind == RouteKind::Unicast {
        d.nexthop = route.origin.node_shared().map(|node| NexthopKey { node: node.clone(), pool: route.pool.clone() });
    }
    Ok(d)
}
