//! The per-class counts kept between applies (`tally.rs`) against a count of every desired
//! route, over random sequences of what changes them: new desired sets, another writer's route
//! written at or removed from a desired key, our route deleted behind our back, the host NIC
//! going down (IPv4 routes through it flushed without a notification) and up, a write refused
//! with `EEXIST` (a held key) or `ENOBUFS` (a retry), a resync, time passing (retries due). After every apply the
//! report's counts are the whole count's, exactly.

use std::sync::Arc;
use std::time::Duration;

use nix::errno::Errno;
use proptest::prelude::*;

use super::delta::variant;
use super::{block, setup, ETH0};
use crate::dataplane::fake::observed;
use crate::dataplane::kernel::route::{Family, RouteKey, RouteKind};
use crate::dataplane::kernel::watcher::DataplaneEvent;
use crate::routes::RouteMap;

/// The destinations a step may touch (IPv4 blocks and a /32, an IPv6 block).
const DESTINATIONS: &[&str] = &["10.244.0.0/26", "10.244.0.64/26", "10.244.1.0/26", "10.244.1.7/32", "10.244.2.0/26", "fd00:10:244:1::/122"];

#[derive(Clone, Debug)]
enum Step {
    /// A new desired set: per destination, absent or a variant (`delta::variant`: broken
    /// ones among them, which are not desired).
    Desired(Vec<Option<u8>>),
    /// BIRD (protocol 12) writes its own route at a destination.
    Foreign(usize),
    /// The route at a destination is deleted by someone else.
    Removed(usize),
    /// The host NIC goes down (IPv4 routes through it flushed silently) or up.
    HostNic(bool),
    /// The next write of a destination is refused: with `EEXIST` (another writer's route is
    /// there: held), or `ENOBUFS` (retried after a backoff).
    Refused(usize, bool),
    /// A resync is asked for.
    Resync,
    /// Time passes (retries and the resync come due).
    Wait(u64),
}

fn step() -> impl Strategy<Value = Step> {
    let dst = 0..DESTINATIONS.len();
    prop_oneof![
        3 => prop::collection::vec(prop::option::of(0u8..7), DESTINATIONS.len()).prop_map(Step::Desired),
        1 => dst.clone().prop_map(Step::Foreign),
        1 => dst.clone().prop_map(Step::Removed),
        1 => any::<bool>().prop_map(Step::HostNic),
        2 => (dst, any::<bool>()).prop_map(|(d, exists)| Step::Refused(d, exists)),
        1 => Just(Step::Resync),
        1 => (1u64..120).prop_map(Step::Wait),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn kept_counts_are_a_whole_count(steps in prop::collection::vec((step(), any::<bool>()), 1..24)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let (mut r, nl, clock) = setup(None);
        let key = |i: usize| RouteKey::new(254, block(DESTINATIONS[i]), 0, 1024);
        for (i, (step, apply)) in steps.iter().enumerate() {
            match step {
                Step::Desired(pick) => {
                    let routes: RouteMap = DESTINATIONS
                        .iter()
                        .zip(pick)
                        .filter_map(|(d, v)| v.map(|v| variant(d, v)))
                        .map(|c| (c.dst, Arc::new(c)))
                        .collect();
                    r.set_desired_routes(&routes, &[]);
                }
                Step::Foreign(d) => {
                    let v6 = DESTINATIONS[*d].contains(':');
                    let route = observed(DESTINATIONS[*d], 1024, 12, Some(if v6 { "fd00::99" } else { "10.0.0.99" }), Some(ETH0), RouteKind::Unicast);
                    nl.insert(route.clone());
                    r.handle_event(&DataplaneEvent::RouteAdded { route, writer_port: 999 });
                }
                Step::Removed(d) => {
                    let gone = nl.state().routes.remove(&key(*d));
                    if let Some(route) = gone {
                        r.handle_event(&DataplaneEvent::RouteRemoved { route, writer_port: 999 });
                    }
                }
                Step::HostNic(up) => {
                    nl.state().links.get_mut(&ETH0).unwrap().up = *up;
                    if *up {
                        r.handle_event(&DataplaneEvent::LinkUp { index: ETH0, name: "eth0".into() });
                    } else {
                        nl.state().routes.retain(|_, o| o.oif != Some(ETH0) || o.key.family == Family::V6);
                        r.handle_event(&DataplaneEvent::LinkDown { index: ETH0, name: "eth0".into() });
                    }
                }
                Step::Refused(d, exists) => {
                    let errno = if *exists { Errno::EEXIST } else { Errno::ENOBUFS };
                    nl.state().fail_writes.insert(block(DESTINATIONS[*d]), (errno, 1));
                }
                Step::Resync => r.request_resync(),
                Step::Wait(s) => clock.advance(Duration::from_secs(*s)),
            }
            if *apply || i + 1 == steps.len() {
                let rep = rt.block_on(r.apply());
                prop_assert_eq!(&rep.by_class, &r.count_all(), "step {}: {:?}", i, step);
            }
        }
    }
}
