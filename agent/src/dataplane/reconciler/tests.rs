//! Reconciler logic against the fake kernel (no root needed): the shared fixtures here, the
//! tests by topic in `tests/`.

mod chunks;
mod deletions;
mod delta;
mod driver;
mod fault_matrix;
mod faults;
mod handover;
mod nexthops;
mod tally;
mod writes;

use std::collections::BTreeMap;
use std::time::Duration;

use nix::errno::Errno;

use crate::dataplane::fake::{FakeClock, FakeNetlink};
use crate::dataplane::kernel::route::{Family, ObservedRoute, RouteKey, RouteKind};
use crate::dataplane::kernel::watcher::DataplaneEvent;
use crate::dataplane::reconciler::handover::{Handover, HandoverEnd};
use crate::dataplane::reconciler::report::ErrorKind;
use crate::dataplane::reconciler::Reconciler;
use crate::dataplane::settings::DataplaneConfig;
use crate::ownership::OwnershipPolicy;
use crate::routes::{ClusterRoute, RouteOrigin};
use crate::vocabulary::{PoolClass, RoutePath, Writer};

const ETH0: u32 = 2;
/// The IP pools of the test cluster: our routes inside them are ours.
const POOLS: &[&str] = &["10.244.0.0/16", "fd00:10:244::/48"];
const TUNL0: u32 = 3;

/// A remote block's route of pool `default` (also the fault matrix's).
pub(super) fn cr(dst: &str, path: RoutePath, gw: Option<&str>) -> ClusterRoute {
    ClusterRoute {
        dst: dst.parse().unwrap(),
        path,
        gateway: gw.map(|g| g.parse().unwrap()),
        device: None,
        class: if path == RoutePath::HostNic { PoolClass::NoEncap } else { PoolClass::Ipip },
        pool: "default".into(),
        origin: RouteOrigin::RemoteBlock { block: dst.into(), node: "n".into() },
    }
}

fn cluster() -> Vec<ClusterRoute> {
    vec![
        cr("10.244.10.0/26", RoutePath::Blackhole, None),
        cr("10.244.20.0/26", RoutePath::HostNic, Some("10.0.0.12")),
        cr("10.244.30.0/26", RoutePath::Tunnel, Some("10.0.1.13")),
        cr("10.244.10.7/32", RoutePath::Tunnel, Some("10.0.1.13")),
        cr("fd00:10:244:20::/122", RoutePath::HostNic, Some("fd00::12")),
        cr("fd00:10:244:10::/122", RoutePath::Blackhole, None),
    ]
}

fn foreign(dst: &str, proto: u8, oif: Option<u32>, kind: RouteKind) -> ObservedRoute {
    ObservedRoute {
        key: RouteKey::new(254, dst.parse().unwrap(), 0, 1024),
        kind,
        gateway: None,
        oif,
        onlink: false,
        nexthop: None,
        protocol: proto,
        scope: 0,
        extra: false,
        cloned: false,
    }
}

fn setup(policy: Option<OwnershipPolicy>) -> (Reconciler<FakeNetlink, FakeClock>, FakeNetlink, FakeClock) {
    let nl = FakeNetlink::with_links(&[(1, "lo"), (ETH0, "eth0"), (TUNL0, "tunl0")]);
    let clock = FakeClock::new();
    let cfg = DataplaneConfig::default();
    let policy = policy.unwrap_or_else(|| cfg.policy_owning(POOLS));
    let mut r = Reconciler::new(cfg, policy, nl.clone(), clock.clone());
    r.set_datastore_synced(true);
    (r, nl, clock)
}

fn block(d: &str) -> ipnet::IpNet {
    d.parse().unwrap()
}
