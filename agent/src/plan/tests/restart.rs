//! After a restart there is no last good version of a broken object, so what
//! it decides must be frozen by the plan itself. Each test plans the example cluster with one
//! object broken, as a restarted agent's first plan (`previous` empty) and as a running
//! agent's (`previous` the classes it programmed).

use std::collections::BTreeSet;
use std::path::Path;

use crate::datastore::{FileDatastore, LoadError, LoadErrorKind, Snapshot};
use crate::ownership::{OwnershipConfig, Role, VersionChoice};
use crate::plan::{plan, Plan, PlanConfig};
use crate::routes::RouteDevices;
use crate::vocabulary::PoolClass;

/// The example cluster in a temporary directory with `edit(file name, text)` applied, loaded.
fn snapshot(edit: impl Fn(&str, String) -> String) -> Snapshot {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster");
    let dir = tempfile::tempdir().unwrap();
    for f in ["calico.yaml", "ipam.yaml", "nodes.yaml"] {
        let text = std::fs::read_to_string(src.join(f)).unwrap();
        std::fs::write(dir.path().join(f), edit(f, text)).unwrap();
    }
    FileDatastore::load(dir.path()).unwrap()
}

fn plan_of(snapshot: &Snapshot, previous: &[PoolClass]) -> Plan {
    let ownership = OwnershipConfig { role: Role::Felix, version: VersionChoice::Auto, node: Some("node-a".into()) };
    let config = PlanConfig { node: "node-a".into(), ownership, devices: RouteDevices::default(), protocol: 80, table: 254 };
    plan(snapshot, &config, &previous.iter().copied().collect::<BTreeSet<_>>(), &[])
}

fn desired(p: &Plan) -> Vec<String> {
    p.desired.values().map(|r| r.dst.to_string()).collect()
}

fn frozen(p: &Plan) -> Vec<String> {
    p.frozen.iter().map(|f| f.cidr.to_string()).collect()
}

fn classes(p: &Plan) -> Vec<(PoolClass, bool)> {
    p.frozen_classes.iter().map(|f| (f.class, f.reason.contains("nothing new programmed, deleted or claimed"))).collect()
}

const BOTH: [(PoolClass, bool); 2] = [(PoolClass::Ipip, true), (PoolClass::NoEncap, true)];
const POOLS: [&str; 4] = ["10.244.0.0/16", "10.245.0.0/16", "10.246.0.0/16", "fd00:10:244::/48"];

fn felix_value(value: &'static str) -> impl Fn(&str, String) -> String {
    move |f: &str, t: String| {
        if f == "calico.yaml" {
            t.replace("programClusterRoutes: EnabledIPIPOnly", &format!("programClusterRoutes: {value}"))
        } else {
            t
        }
    }
}

/// The healthy cluster freezes nothing: the frozen ground and classes are empty, and node-a
/// programs its seven IPIP routes.
#[test]
fn the_example_freezes_nothing() {
    let p = plan_of(&snapshot(|_, t| t), &[]);
    assert_eq!((classes(&p), frozen(&p), p.desired.len(), p.hold_all.clone()), (vec![], Vec::<String>::new(), 7, None));
    assert_eq!(p.programmed, [PoolClass::Ipip].into_iter().collect());
}

/// A FelixConfiguration whose programClusterRoutes is a list does not parse: the object is
/// rejected, and Felix's default (EnabledIPIPOnly on 3.33) used to decide in its place, so
/// an agent that had programmed no-encap too (`Enabled`) deleted those routes after a
/// restart. Both classes are frozen: nothing programmed, their pools frozen ground, no
/// handover, and a running agent keeps counting what it programmed as its own.
#[test]
fn an_unparsable_felix_configuration_freezes_both_classes() {
    let s = snapshot(felix_value("[Enabled]"));
    assert_eq!(s.object_errors.len(), 1, "{:?}", s.object_errors);
    let restarted = plan_of(&s, &[]);
    assert_eq!(classes(&restarted), BOTH);
    assert!(
        restarted.frozen_classes[0].reason.starts_with("FelixConfiguration \"default\": spec.programClusterRoutes:"),
        "{}",
        restarted.frozen_classes[0].reason
    );
    assert_eq!(desired(&restarted), Vec::<String>::new());
    assert_eq!(frozen(&restarted), POOLS);
    assert!(restarted.programmed.is_empty() && restarted.handovers.is_empty());
    let running = plan_of(&s, &[PoolClass::Ipip, PoolClass::NoEncap]);
    assert_eq!(running.programmed, [PoolClass::Ipip, PoolClass::NoEncap].into_iter().collect());
    assert!(running.handovers.is_empty());
    // Calico's own reading is unchanged: what explain and audit expect Felix to do.
    assert_eq!(running.decision.felix.source.kind(), "default");
}

/// A value routewarden cannot interpret (`Bogus`) falls back to Felix's default in Calico's
/// decision (explain, audit), but moves no class for routewarden.
#[test]
fn an_unknown_value_freezes_both_classes_and_keeps_calicos_fallback() {
    let p = plan_of(&snapshot(felix_value("Bogus")), &[]);
    assert_eq!(classes(&p), BOTH);
    assert_eq!((p.decision.felix.source.kind(), p.decision.programmed.len()), ("fallback", 1));
    assert_eq!(desired(&p), Vec::<String>::new());
    // BIRD's unknown value the same.
    let bird = |f: &str, t: String| {
        if f == "calico.yaml" {
            t.replace("programClusterRoutes: EnabledNoEncapOnly", "programClusterRoutes: enablednoencaponly")
        } else {
            t
        }
    };
    let p = plan_of(&snapshot(bird), &[]);
    assert_eq!((classes(&p), p.decision.bird.source.kind()), (BOTH.to_vec(), "fallback"));
}

/// A ClusterInformation that does not parse (calicoVersion a list) or names no Calico 3
/// release: 3.33 was assumed, so on a 3.30 cluster BIRD's routes were claimed and
/// replaced. Both classes are frozen (and no BIRD route is claimed there).
#[test]
fn an_unreadable_release_line_freezes_both_classes() {
    for version in ["[v3.30.2]", "banana"] {
        let edit = move |f: &str, t: String| if f == "calico.yaml" { t.replace("calicoVersion: v3.33.0", &format!("calicoVersion: {version}")) } else { t };
        let p = plan_of(&snapshot(edit), &[]);
        assert_eq!(classes(&p), BOTH, "{version}");
        assert_eq!(desired(&p), Vec::<String>::new(), "{version}");
        assert_eq!(frozen(&p), POOLS, "{version}");
    }
    // An absent one is not a broken one: Calico's default (3.33 assumed) decides.
    let absent = |f: &str, t: String| if f == "calico.yaml" { t.replace("  calicoVersion: v3.33.0\n", "") } else { t };
    assert_eq!(classes(&plan_of(&snapshot(absent), &[])), vec![]);
}

/// A Node whose address does not parse is rejected; only its addresses were frozen, so its
/// blocks' routes were deleted. Its blocks (node-b: 10.244.20.0/26, 10.245.20.0/26, the
/// VXLAN 10.247.20.0/26 and fd00:10:244:0:20::/122) and its tunnel address are frozen ground; node-c's borrowed IP in
/// node-b's block is node-c's and is still programmed.
#[test]
fn a_rejected_node_freezes_its_blocks_and_its_ips() {
    let edit = |f: &str, t: String| {
        if f == "nodes.yaml" {
            t.replace("projectcalico.org/IPv4Address: 10.0.0.12/24", "projectcalico.org/IPv4Address: not-an-ip/99")
        } else {
            t
        }
    };
    let p = plan_of(&snapshot(edit), &[]);
    // Its own addresses (as before), then its IPv4 and IPv6 blocks and its tunnel address.
    assert_eq!(frozen(&p), ["10.0.0.12/32", "10.244.20.0/26", "10.244.20.0/32", "10.245.20.0/26", "10.247.20.0/26", "fd00:10::/64", "fd00:10:244:0:20::/122"]);
    assert_eq!(desired(&p), ["10.244.10.0/26", "10.244.20.5/32", "10.244.30.0/26", "10.244.40.0/26", "10.245.40.0/26"]);
    assert!(p.frozen[1].reason.starts_with("IPAM block 10.244.20.0/26 of a rejected Node: "), "{}", p.frozen[1].reason);
}

/// The same Node in a second file (a new one that sorts first, with a bogus address): the
/// first definition won and node-a's routes to node-b were rewritten through it. Both are
/// refused; node-b's blocks are frozen as for a rejected Node.
#[test]
fn a_node_defined_twice_freezes_its_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster");
    for f in ["calico.yaml", "ipam.yaml", "nodes.yaml"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    std::fs::write(
        dir.path().join("00-extra.yaml"),
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: node-b\n  annotations: {projectcalico.org/IPv4Address: 10.0.0.99/24}\n",
    )
    .unwrap();
    let s = FileDatastore::load(dir.path()).unwrap();
    let files: Vec<String> = s.object_errors.iter().map(|e| e.file.file_name().unwrap().to_string_lossy().into_owned()).collect();
    // The later definition's error, then the first's (taken out when the cluster is built).
    assert_eq!(files, ["nodes.yaml", "00-extra.yaml"]);
    let p = plan_of(&s, &[]);
    assert_eq!(frozen(&p), ["10.244.20.0/26", "10.244.20.0/32", "10.245.20.0/26", "10.247.20.0/26", "fd00:10:244:0:20::/122"]);
    assert!(p.desired.values().all(|r| r.gateway != Some("10.0.0.99".parse().unwrap())));
}

/// A file that is there but cannot be read keeps its last good content (the datastore) and
/// holds every deletion (the plan): what it says now is unknown.
#[test]
fn an_unreadable_input_holds_every_deletion() {
    let mut s = snapshot(|_, t| t);
    s.load_errors.push(LoadError::new("/cluster/ipam.yaml", LoadErrorKind::Io, "Permission denied (os error 13)"));
    let p = plan_of(&s, &[]);
    assert_eq!(
        p.hold_all.as_deref(),
        Some("input /cluster/ipam.yaml cannot be read (Permission denied (os error 13)): its last good content is kept, and no deletion or rewrite can be justified while it is unreadable")
    );
    assert_eq!(p.desired.len(), 7);
}
