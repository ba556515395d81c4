//! An IPAM block overlapping another node's block was accepted and routed.
//! Planned from the example cluster through the file datastore, and applied by the
//! reconciler on a fake kernel.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use crate::dataplane::fake::{FakeClock, FakeNetlink};
use crate::dataplane::{DataplaneConfig, Reconciler};
use crate::datastore::{FileDatastore, Snapshot};
use crate::ownership::{OwnershipConfig, Role, VersionChoice};
use crate::plan::{plan, Plan, PlanConfig};
use crate::routes::RouteDevices;

/// The example cluster, plus `extra` as `extra.yaml` when given, loaded.
fn load(dir: &Path, extra: Option<&str>) -> Snapshot {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster");
    for f in ["calico.yaml", "ipam.yaml", "nodes.yaml"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    match extra {
        Some(text) => std::fs::write(dir.join("extra.yaml"), text).unwrap(),
        None => drop(std::fs::remove_file(dir.join("extra.yaml"))),
    }
    FileDatastore::load(dir).unwrap()
}

fn plan_of(s: &Snapshot, previous: &Plan) -> Plan {
    let ownership = OwnershipConfig { role: Role::Felix, version: VersionChoice::Auto, node: Some("node-a".into()) };
    let config = PlanConfig { node: "node-a".into(), ownership, devices: RouteDevices::default(), protocol: 80, table: 254 };
    plan(s, &config, &previous.programmed, &previous.policy.owned)
}

fn first_plan(s: &Snapshot) -> Plan {
    let ownership = OwnershipConfig { role: Role::Felix, version: VersionChoice::Auto, node: Some("node-a".into()) };
    let config = PlanConfig { node: "node-a".into(), ownership, devices: RouteDevices::default(), protocol: 80, table: 254 };
    plan(s, &config, &BTreeSet::new(), &[])
}

/// node-c's /27 written inside node-b's 10.244.20.0/26 (an IPIP block node-a routes via
/// node-b): before, the /27 was routed to node-c beside the /26. Now both are refused and
/// neither is desired (nor the /32 of 10.244.20.5, which node-c borrowed in the /26), the
/// /26 is frozen ground, and node-a's routes there — in the kernel from the valid cluster —
/// are neither deleted nor rewritten, however long the settle period and the breaker wait;
/// the other five routes stay and nothing is written. Removed, the /26 is desired again and
/// nothing is written either.
#[tokio::test]
async fn the_existing_route_of_an_overlapped_block_is_frozen_not_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let valid = load(dir.path(), None);
    let p0 = first_plan(&valid);
    let desired = |p: &Plan| p.desired.values().map(|r| r.dst.to_string()).collect::<Vec<_>>();
    assert!(desired(&p0).contains(&"10.244.20.0/26".to_owned()));

    let nl = FakeNetlink::with_links(&[(1, "lo"), (2, "eth0"), (3, "tunl0")]);
    let clock = FakeClock::new();
    let cfg = DataplaneConfig::default();
    let mut r = Reconciler::new(cfg.clone(), cfg.base_policy(), nl.clone(), clock.clone());
    r.set_datastore_synced(true);
    r.set_policy(p0.policy.clone());
    r.set_desired(&p0.desired.values().map(|r| (**r).clone()).collect::<Vec<_>>());
    r.apply().await;
    let kernel = nl.state().routes.clone();
    assert_eq!(kernel.len(), 7);
    nl.take_log();

    let overlap =
        "apiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {name: 10-244-20-32-27}\nspec: {cidr: 10.244.20.32/27, affinity: 'host:node-c'}\n";
    let s = load(dir.path(), Some(overlap));
    let errors: Vec<(String, Vec<String>)> = s
        .object_errors
        .iter()
        .map(|e| (e.file.file_name().unwrap().to_string_lossy().into_owned(), e.cidrs.iter().map(ToString::to_string).collect()))
        .collect();
    let frozen_26 = vec!["10.244.20.0/26".to_owned()];
    assert_eq!(errors, [("ipam.yaml".to_owned(), frozen_26.clone()), ("extra.yaml".to_owned(), frozen_26.clone())]);
    let p1 = plan_of(&s, &p0);
    let mut expected = desired(&p0);
    expected.retain(|d| d != "10.244.20.0/26" && d != "10.244.20.5/32");
    assert_eq!(desired(&p1), expected);
    assert_eq!(p1.frozen.iter().map(|f| f.cidr.to_string()).collect::<Vec<_>>(), frozen_26);
    assert_eq!(p1.policy.frozen, ["10.244.20.0/26".parse::<ipnet::IpNet>().unwrap()]);
    assert!(
        p1.frozen[0].reason.ends_with("extra.yaml: IPAMBlock \"10-244-20-32-27\": spec.cidr: 10.244.20.32/27 overlaps IPAM block 10-244-20-0-26 (10.244.20.0/26); Calico's IPAM never writes overlapping blocks, so every block of an overlap is invalid; 10.244.20.32/27 is a /27 block in IPPool \"default-ipv4-ippool\" (10.244.0.0/16) whose blockSize is 26; Calico's IPAM writes only blocks of its pool's blockSize; its ground (10.244.20.0/26) is frozen until fixed"),
        "{}",
        p1.frozen[0].reason
    );
    r.set_policy(p1.policy.clone());
    r.set_desired(&p1.desired.values().map(|r| (**r).clone()).collect::<Vec<_>>());
    for _ in 0..4 {
        let rep = r.apply().await;
        assert_eq!(rep.deletes, 0, "{rep:?}");
        clock.advance(Duration::from_mins(1));
    }
    assert!(nl.state().routes == kernel, "the kernel changed");
    assert_eq!(nl.take_log().into_iter().filter(|l| !l.starts_with("dump")).collect::<Vec<_>>(), Vec::<String>::new());

    let fixed = load(dir.path(), None);
    let p2 = plan_of(&fixed, &p1);
    assert_eq!((desired(&p2), p2.frozen.len()), (desired(&p0), 0));
    r.set_policy(p2.policy.clone());
    r.set_desired(&p2.desired.values().map(|r| (**r).clone()).collect::<Vec<_>>());
    r.apply().await;
    assert!(nl.state().routes == kernel, "the kernel changed");
    assert_eq!(nl.take_log().into_iter().filter(|l| !l.starts_with("dump")).collect::<Vec<_>>(), Vec::<String>::new());
}
