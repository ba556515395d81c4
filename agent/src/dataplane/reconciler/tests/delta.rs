//! `set_desired_routes` (the plan's map, only what changed converted) against
//! `set_desired_with_handover` of the same routes (every route converted) over random
//! sequences of desired sets, broken routes among them (a tunnel route without a next hop, one
//! whose next hop is of the other family: they cannot be converted): after every step's apply,
//! the two fake kernels hold the same routes and the two reports the same writes, deletes and
//! errors.

use std::sync::Arc;

use proptest::prelude::*;

use super::{cr, setup};
use crate::routes::{ClusterRoute, RouteMap};
use crate::vocabulary::RoutePath;

/// The destinations a step may want (IPv4 blocks and /32s, IPv6 blocks).
const DESTINATIONS: &[&str] = &[
    "10.244.0.0/26",
    "10.244.0.64/26",
    "10.244.1.0/26",
    "10.244.1.7/32",
    "10.244.2.0/26",
    "10.244.3.0/26",
    "10.244.3.9/32",
    "10.244.4.0/26",
    "fd00:10:244:1::/122",
    "fd00:10:244:2::/122",
];

/// Variant `v` of a route to `dst`: a blackhole, through the tunnel or the host NIC to one of
/// two next hops, or broken (no next hop; a next hop of the other family).
pub(super) fn variant(dst: &str, v: u8) -> ClusterRoute {
    let v6 = dst.contains(':');
    let gw = |a: &'static str, b: &'static str| Some(if v6 { b } else { a });
    match v % 7 {
        0 => cr(dst, RoutePath::Blackhole, None),
        1 => cr(dst, RoutePath::Tunnel, gw("10.0.1.13", "fd00::13")),
        2 => cr(dst, RoutePath::Tunnel, gw("10.0.1.14", "fd00::14")),
        3 => cr(dst, RoutePath::HostNic, gw("10.0.0.12", "fd00::12")),
        4 => cr(dst, RoutePath::HostNic, gw("10.0.0.15", "fd00::15")),
        5 => cr(dst, RoutePath::Tunnel, None),
        _ => cr(dst, RoutePath::HostNic, gw("fd00::12", "10.0.0.12")),
    }
}

/// A step: per destination, absent or a variant.
fn steps() -> impl Strategy<Value = Vec<Vec<Option<u8>>>> {
    prop::collection::vec(prop::collection::vec(prop::option::of(0u8..7), DESTINATIONS.len()), 1..10)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn patched_desired_sets_program_what_whole_ones_do(steps in steps()) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let (mut fast, fast_nl, _) = setup(None);
        let (mut whole, whole_nl, _) = setup(None);
        for (i, step) in steps.iter().enumerate() {
            let routes: Vec<ClusterRoute> = DESTINATIONS.iter().zip(step).filter_map(|(d, v)| v.map(|v| variant(d, v))).collect();
            let map: RouteMap = routes.iter().map(|r| (r.dst, Arc::new(r.clone()))).collect();
            fast.set_desired_routes(&map, &[]);
            whole.set_desired_with_handover(&routes, &[]);
            let (a, b) = rt.block_on(async { (fast.apply().await, whole.apply().await) });
            prop_assert_eq!((a.writes, a.deletes, a.error_count()), (b.writes, b.deletes, b.error_count()), "step {}", i);
            prop_assert_eq!(&a.error_messages, &b.error_messages, "step {}", i);
            let (k1, k2) = (fast_nl.0.lock().unwrap().routes.clone(), whole_nl.0.lock().unwrap().routes.clone());
            prop_assert_eq!(k1, k2, "step {}", i);
        }
    }
}
