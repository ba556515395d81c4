//! The audit's expectation of *Felix's* routes is Felix's, also where routewarden routes on
//! purpose where Felix does not (DESIGN.md "Where routewarden differs from Felix").

use std::collections::BTreeSet;
use std::path::Path;

use crate::datastore::FileDatastore;
use crate::ownership::{CalicoVersion, OwnershipConfig, Role};
use crate::plan::{plan, Plan, PlanConfig};
use crate::routes::RouteDevices;
use crate::vocabulary::Writer;

/// The example cluster with node-d's BGP address written without its prefix length and its
/// addresses removed (no InternalIP, no ExternalIP), planned for node-a in `role`.
fn plan_with_bare_node_d(role: Role, bare: bool) -> Plan {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster");
    let dir = tempfile::tempdir().unwrap();
    for f in ["calico.yaml", "ipam.yaml", "nodes.yaml"] {
        let mut text = std::fs::read_to_string(src.join(f)).unwrap();
        if f == "calico.yaml" && bare {
            let from = "    ipv4Address: 10.0.1.14/24\n    ipv4IPIPTunnelAddr: 10.244.40.0\n  addresses:\n    - {address: 10.0.1.14/24, type: CalicoNodeIP}\n    - {address: 10.0.1.14, type: InternalIP}\n";
            assert!(text.contains(from), "the example's node-d changed");
            text = text.replace(from, "    ipv4Address: 10.0.1.14\n    ipv4IPIPTunnelAddr: 10.244.40.0\n");
        }
        std::fs::write(dir.path().join(f), text).unwrap();
    }
    let snapshot = FileDatastore::load(dir.path()).unwrap();
    let ownership = OwnershipConfig { role, version: CalicoVersion::V3_33.into(), node: Some("node-a".into()) };
    let config = PlanConfig { node: "node-a".into(), ownership, devices: RouteDevices::default(), protocol: 80, table: 254 };
    plan(&snapshot, &config, &BTreeSet::new(), &[])
}

/// `owner`'s expected routes, `<dst> via <gateway> dev <device>`, sorted.
fn expected_of(p: &Plan, owner: Writer) -> Vec<String> {
    let mut v: Vec<String> = p
        .expected
        .values()
        .filter(|e| e.owner == owner && e.route.path != crate::vocabulary::RoutePath::Blackhole)
        .map(|e| format!("{} via {} dev {}", e.route.dst, e.route.gateway.map_or("-".into(), |g| g.to_string()), e.route.device.as_deref().unwrap_or("-")))
        .collect();
    v.sort();
    v
}

/// Node-d (another subnet: IPIP goes through the tunnel) with a bare BGP address and no
/// InternalIP: Felix has no tunnel gateway for it and programs no route to its blocks, so the
/// audit (role audit: Felix owns IPIP) expects none of Felix; with the prefix length, Felix's
/// routes to node-d are expected as usual. The native and no-encap routes are unchanged.
#[test]
fn felix_is_expected_to_program_no_tunnel_route_without_a_tunnel_gateway() {
    let normal = expected_of(&plan_with_bare_node_d(Role::Audit, false), Writer::Felix);
    let bare = expected_of(&plan_with_bare_node_d(Role::Audit, true), Writer::Felix);
    let to_d: Vec<&String> = normal.iter().filter(|r| r.contains("via 10.0.1.14 ")).collect();
    assert_eq!(to_d, ["10.244.40.0/26 via 10.0.1.14 dev tunl0", "10.245.40.0/26 via 10.0.1.14 dev tunl0"]);
    let without: Vec<&String> = normal.iter().filter(|r| !r.contains("via 10.0.1.14 ")).collect();
    assert_eq!(bare.iter().collect::<Vec<_>>(), without, "Felix's expectation loses exactly the tunnel routes to node-d");
    // The audit of a kernel without any route: every expected route is `missing`, but not
    // Felix's absent routes to node-d.
    let missing = |p: &Plan| -> Vec<String> {
        let report = crate::dataplane::audit(&[], p.expected.values(), &p.audit_scope);
        report.findings.iter().filter(|f| f.code == crate::dataplane::FindingCode::Missing).map(|f| f.prefix.to_string()).collect()
    };
    let (m_normal, m_bare) = (missing(&plan_with_bare_node_d(Role::Audit, false)), missing(&plan_with_bare_node_d(Role::Audit, true)));
    assert!(m_normal.contains(&"10.244.40.0/26".to_owned()) && m_normal.contains(&"10.245.40.0/26".to_owned()), "{m_normal:?}");
    let m_normal_without: Vec<&String> = m_normal.iter().filter(|p| !p.starts_with("10.244.40.") && !p.starts_with("10.245.40.")).collect();
    assert_eq!(m_bare.iter().collect::<Vec<_>>(), m_normal_without);
}

/// In the felix role routewarden itself programs those routes, via the bare address, and
/// reports why: its own expectation keeps them, and the plan names the disagreement.
#[test]
fn routewarden_routes_via_the_bare_address_and_says_so() {
    let p = plan_with_bare_node_d(Role::Felix, true);
    let ours = expected_of(&p, Writer::Routewarden);
    let to_d: Vec<&String> = ours.iter().filter(|r| r.contains("via 10.0.1.14 ")).collect();
    assert_eq!(to_d, ["10.244.40.0/26 via 10.0.1.14 dev tunl0", "10.245.40.0/26 via 10.0.1.14 dev tunl0"]);
    let desired: Vec<String> = p.desired.values().filter(|r| r.gateway == Some("10.0.1.14".parse().unwrap())).map(|r| r.dst.to_string()).collect();
    assert_eq!(desired, ["10.244.40.0/26", "10.245.40.0/26"]);
    let codes: Vec<&str> = p.problems.iter().map(crate::routes::RouteProblem::code).collect();
    assert!(codes.contains(&"next-hop-sources-disagree"), "{codes:?}");
}
