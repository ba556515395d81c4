//! The ownership policy a plan builds from the example cluster: which BIRD leftovers it claims.

use std::collections::BTreeSet;
use std::path::Path;

use crate::datastore::FileDatastore;
use crate::ownership::{CalicoVersion, OwnershipConfig, Role};
use crate::plan::{plan, PlanConfig};
use crate::routes::RouteDevices;

/// The example cluster in a temporary directory, with `edit` applied to calico.yaml.
fn claims(role: Role, edit: impl Fn(String) -> String) -> (Vec<String>, Vec<String>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster");
    let dir = tempfile::tempdir().unwrap();
    for f in ["calico.yaml", "ipam.yaml", "nodes.yaml"] {
        let text = std::fs::read_to_string(src.join(f)).unwrap();
        std::fs::write(dir.path().join(f), if f == "calico.yaml" { edit(text) } else { text }).unwrap();
    }
    let snapshot = FileDatastore::load(dir.path()).unwrap();
    let ownership = OwnershipConfig { role, version: CalicoVersion::V3_33.into(), node: Some("node-a".into()) };
    let config = PlanConfig { node: "node-a".into(), ownership, devices: RouteDevices::default(), protocol: 80, table: 254 };
    let p = plan(&snapshot, &config, &BTreeSet::new(), &[]);
    let show = |v: &[ipnet::IpNet]| v.iter().map(ToString::to_string).collect::<Vec<_>>();
    (show(&p.policy.claim_bird_blackholes), show(&p.policy.claim_bird_on_tunnel))
}

/// BIRD's own-block blackholes are claimed exactly in the pools of the
/// classes routewarden programs and BIRD does not, the guard of the tunnel claim.
#[test]
fn bird_blackholes_are_claimed_only_where_bird_does_not_program_the_class() {
    // Felix role, the complementary pair: IPIP is ours, no-encap BIRD's.
    let (blackholes, tunnel) = claims(Role::Felix, |t| t);
    assert_eq!(blackholes, ["10.244.0.0/16", "10.245.0.0/16"]);
    assert_eq!(tunnel, ["10.244.0.0/16", "10.245.0.0/16"]);
    // BIRD also programs IPIP (a wrong pair): nothing of BIRD's is claimed.
    let (blackholes, tunnel) = claims(Role::Felix, |t| t.replace("programClusterRoutes: EnabledNoEncapOnly", "programClusterRoutes: Enabled"));
    assert_eq!((blackholes, tunnel), (Vec::<String>::new(), Vec::<String>::new()));
}
