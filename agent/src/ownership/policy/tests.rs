//! Table tests of the ownership policy alone: the verdict over hand-made routes, and the
//! policy [`OwnershipPolicy::from_decision`] builds from decisions of a cluster with a pool of
//! every kind.

use std::fmt::Write as _;

use ipnet::IpNet;

use super::*;
use crate::model::Cluster;
use crate::ownership::{decide, CalicoVersion, OwnershipConfig, Role, VersionChoice};

/// A kernel route as the policy reads it.
#[derive(Clone, Debug)]
struct Route {
    table: u32,
    dst: IpNet,
    kind: PolicyRouteType,
    dev: Option<&'static str>,
    proto: u8,
}

impl PolicyRoute for Route {
    fn table(&self) -> u32 {
        self.table
    }
    fn dst(&self) -> IpNet {
        self.dst
    }
    fn route_type(&self) -> PolicyRouteType {
        self.kind
    }
    fn device(&self) -> Option<&str> {
        self.dev
    }
    fn protocol(&self) -> u8 {
        self.proto
    }
}

const U: PolicyRouteType = PolicyRouteType::Unicast;
const B: PolicyRouteType = PolicyRouteType::Blackhole;

fn route(dst: &str, kind: PolicyRouteType, dev: Option<&'static str>, proto: u8, table: u32) -> Route {
    Route { table, dst: dst.parse().unwrap(), kind, dev, proto }
}

fn nets(v: &[&str]) -> Vec<IpNet> {
    v.iter().map(|s| s.parse().unwrap()).collect()
}

fn policy() -> OwnershipPolicy {
    OwnershipPolicy {
        protocol: 80,
        table: 254,
        tunnel_dev: "tunl0".into(),
        host_nic: "eth0".into(),
        claim_bird_on_tunnel: nets(&["10.244.0.0/16"]),
        claim_bird_on_nic: nets(&["10.245.0.0/16"]),
        claim_bird_blackholes: nets(&["10.246.0.0/16"]),
        owned: nets(&["10.244.0.0/16", "10.245.0.0/16", "fd00:10::/48"]),
        frozen: nets(&["10.244.99.0/26", "10.246.99.0/26"]),
        hold_rewrites: false,
    }
}

#[test]
fn verdicts() {
    let p = policy();
    let cases: &[(Route, Verdict)] = &[
        (route("10.244.20.0/26", U, Some("tunl0"), 80, 254), Verdict::OursByProtocol),
        (route("10.245.20.0/26", U, Some("eth0"), 80, 254), Verdict::OursByProtocol),
        (route("10.244.20.0/26", B, None, 80, 254), Verdict::OursByProtocol),
        (route("fd00:10:0:1::/122", U, Some("eth0"), 80, 254), Verdict::OursByProtocol),
        // Our protocol outside every owned pool, or on a workload device (bad input row 7).
        (route("192.168.77.0/24", U, Some("eth0"), 80, 254), Verdict::OutsideOwnedPools),
        (route("10.250.1.0/26", B, None, 80, 254), Verdict::OutsideOwnedPools),
        (route("10.244.10.5/32", U, Some("cali-x"), 80, 254), Verdict::OtherDevice),
        (route("0.0.0.0/0", U, Some("eth0"), 80, 254), Verdict::OutsideOwnedPools),
        (route("10.244.20.0/26", U, Some("tunl0"), 80, 48), Verdict::OtherTable),
        (route("10.244.20.0/26", U, Some("tunl0"), 12, 254), Verdict::ClaimedBirdTunnel),
        (route("10.245.20.0/26", U, Some("eth0"), 12, 254), Verdict::ClaimedBirdNic),
        // BIRD outside the claimed pools, or on the wrong device: never ours (S03).
        (route("192.168.200.10/32", U, Some("cali-x"), 12, 254), Verdict::Foreign),
        (route("10.244.20.0/26", U, Some("eth0"), 12, 254), Verdict::Foreign),
        (route("10.245.20.0/26", U, Some("tunl0"), 12, 254), Verdict::Foreign),
        (route("10.244.20.0/26", B, None, 12, 254), Verdict::Foreign),
        // BIRD's own-block blackholes only inside the pools claimed for them, never in frozen
        // ground, never another protocol's.
        (route("10.246.7.0/26", B, None, 12, 254), Verdict::ClaimedBirdBlackhole),
        (route("10.246.7.0/26", B, None, 17, 254), Verdict::Foreign),
        (route("10.246.7.0/26", U, Some("eth0"), 12, 254), Verdict::Foreign),
        // Other protocols on cluster prefixes (S05) and anywhere (S12).
        (route("10.244.20.0/26", U, Some("tunl0"), 17, 254), Verdict::Foreign),
        (route("10.244.20.0/26", U, Some("tunl0"), 4, 254), Verdict::Foreign),
        (route("0.0.0.0/0", U, Some("eth0"), 4, 254), Verdict::Foreign),
        (route("10.0.0.0/24", U, Some("eth0"), 2, 254), Verdict::Foreign),
        (route("10.0.0.0/24", U, Some("eth0"), 3, 254), Verdict::Foreign),
        (route("10.0.0.11/32", PolicyRouteType::Other, Some("eth0"), 80, 254), Verdict::NotClusterType),
        (route("10.0.0.255/32", PolicyRouteType::Other, Some("eth0"), 80, 254), Verdict::NotClusterType),
        (route("fe80::/64", U, Some("eth0"), 80, 254), Verdict::KernelManaged),
        (route("ff00::/8", U, Some("eth0"), 80, 254), Verdict::KernelManaged),
        // No claim in frozen ground.
        (route("10.244.99.0/26", U, Some("tunl0"), 12, 254), Verdict::Foreign),
        (route("10.246.99.0/26", B, None, 12, 254), Verdict::Foreign),
        (route("10.244.99.0/26", U, Some("tunl0"), 80, 254), Verdict::OursByProtocol),
    ];
    for (r, want) in cases {
        assert_eq!(p.verdict(r), *want, "{r:?}");
    }
}

#[test]
fn no_claims_no_bird() {
    let p = OwnershipPolicy { claim_bird_on_tunnel: vec![], claim_bird_on_nic: vec![], claim_bird_blackholes: vec![], ..policy() };
    assert_eq!(p.verdict(&route("10.244.20.0/26", U, Some("tunl0"), 12, 254)), Verdict::Foreign);
    assert_eq!(p.dump_protocols(), vec![80]);
    assert_eq!(policy().dump_protocols(), vec![80, 12]);
}

/// IPIP Always 10.244/16, IPIP CrossSubnet 10.245/16, no-encap 10.246/16, VXLAN 10.247/16,
/// with Felix's and BIRD's `programClusterRoutes` as given (3.33 values).
fn cluster(felix: &str, bgp: &str) -> Cluster {
    let mut text = String::new();
    for (name, spec) in [
        ("ipip-always", "{cidr: 10.244.0.0/16, ipipMode: Always}"),
        ("ipip-cross", "{cidr: 10.245.0.0/16, ipipMode: CrossSubnet}"),
        ("noencap", "{cidr: 10.246.0.0/16}"),
        ("vxlan", "{cidr: 10.247.0.0/16, vxlanMode: Always}"),
    ] {
        let _ = write!(text, "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {{name: {name}}}\nspec: {spec}\n---\n");
    }
    let _ =
        write!(text, "apiVersion: projectcalico.org/v3\nkind: FelixConfiguration\nmetadata: {{name: default}}\nspec: {{programClusterRoutes: {felix}}}\n---\n");
    let _ = write!(text, "apiVersion: projectcalico.org/v3\nkind: BGPConfiguration\nmetadata: {{name: default}}\nspec: {{programClusterRoutes: {bgp}}}\n");
    let (c, errors) = Cluster::from_yaml_str(&text).expect("yaml");
    assert!(errors.is_empty(), "{errors:?}");
    c
}

/// One plan's policy: `role` over `cluster(felix, bgp)`, our protocol 80 in table 254,
/// Felix writing `felix_protocol`, with `frozen` ground and `retired` pools.
fn built(role: Role, felix: &str, bgp: &str, felix_protocol: u8, frozen: &[&str], retired: &[&str]) -> OwnershipPolicy {
    let decision = decide(&cluster(felix, bgp), &OwnershipConfig { role, version: VersionChoice::Fixed(CalicoVersion::V3_33), node: None });
    let (frozen, retired) = (nets(frozen), nets(retired));
    let devices = RouteDevices::default();
    let inputs = PolicyInputs { protocol: 80, table: 254, devices: &devices, felix_protocol, retired: &retired, frozen: &frozen, hold_rewrites: false };
    OwnershipPolicy::from_decision(&decision, &inputs)
}

/// One row of [`built_policy_claims_by_protocol_table_and_pool`].
type Row = (Role, &'static str, &'static str, u8, &'static [&'static str], Route, Verdict);

/// Who claims what, by protocol, table, pool and device, under the decisions a plan meets.
/// Each row: (role, Felix's value, BIRD's value, Felix's protocol, frozen ground, the route,
/// the verdict).
#[test]
fn built_policy_claims_by_protocol_table_and_pool() {
    let tunl = Some("tunl0");
    let nic = Some("eth0");
    #[rustfmt::skip]
    let rows: &[Row] = &[
        // Claim by protocol + table + pool: ours in the IPIP and no-encap pools we program.
        (Role::Felix, "Enabled", "Disabled", 80, &[], route("10.244.1.0/26", U, tunl, 80, 254), Verdict::OursByProtocol),
        (Role::Felix, "Enabled", "Disabled", 80, &[], route("10.245.1.0/26", U, nic, 80, 254), Verdict::OursByProtocol),
        (Role::Felix, "Enabled", "Disabled", 80, &[], route("10.246.1.0/26", B, None, 80, 254), Verdict::OursByProtocol),
        (Role::Felix, "Enabled", "Disabled", 80, &[], route("10.244.1.0/26", U, tunl, 80, 48), Verdict::OtherTable),
        // A VXLAN pool is never ours, nor a pool outside every pool.
        (Role::Felix, "Enabled", "Disabled", 80, &[], route("10.247.1.0/26", U, tunl, 80, 254), Verdict::OutsideOwnedPools),
        (Role::Felix, "Enabled", "Disabled", 80, &[], route("192.168.1.0/24", U, nic, 80, 254), Verdict::OutsideOwnedPools),
        (Role::Bird, "Disabled", "Enabled", 80, &[], route("10.0.0.0/8", B, None, 80, 254), Verdict::OutsideOwnedPools),
        // A class Felix programs with our protocol is Felix's, not ours; with another
        // protocol, ours to clean up.
        (Role::Bird, "EnabledIPIPOnly", "EnabledNoEncapOnly", 80, &[], route("10.244.1.0/26", U, tunl, 80, 254), Verdict::OutsideOwnedPools),
        (Role::Bird, "EnabledIPIPOnly", "EnabledNoEncapOnly", 80, &[], route("10.246.1.0/26", U, nic, 80, 254), Verdict::OursByProtocol),
        (Role::Bird, "EnabledIPIPOnly", "EnabledNoEncapOnly", 81, &[], route("10.244.1.0/26", U, tunl, 80, 254), Verdict::OursByProtocol),
        // BIRD leftovers after a handover from BIRD: claimed while we program the class and
        // BIRD does not (tunnel in IPIP, host NIC in CrossSubnet and no-encap, blackholes).
        (Role::Felix, "Enabled", "Disabled", 80, &[], route("10.244.1.0/26", U, tunl, 12, 254), Verdict::ClaimedBirdTunnel),
        (Role::Felix, "Enabled", "Disabled", 80, &[], route("10.245.1.0/26", U, nic, 12, 254), Verdict::ClaimedBirdNic),
        (Role::Felix, "Enabled", "Disabled", 80, &[], route("10.246.1.0/26", U, nic, 12, 254), Verdict::ClaimedBirdNic),
        (Role::Felix, "Enabled", "Disabled", 80, &[], route("10.244.0.0/26", B, None, 12, 254), Verdict::ClaimedBirdBlackhole),
        (Role::Felix, "Enabled", "Disabled", 80, &[], route("10.244.1.0/26", U, nic, 12, 254), Verdict::Foreign),
        // ... never while BIRD still programs the class.
        (Role::Felix, "Enabled", "Enabled", 80, &[], route("10.244.1.0/26", U, tunl, 12, 254), Verdict::Foreign),
        (Role::Felix, "Enabled", "Enabled", 80, &[], route("10.246.1.0/26", U, nic, 12, 254), Verdict::Foreign),
        (Role::Felix, "EnabledIPIPOnly", "EnabledNoEncapOnly", 80, &[], route("10.246.1.0/26", B, None, 12, 254), Verdict::Foreign),
        (Role::Felix, "EnabledIPIPOnly", "EnabledNoEncapOnly", 80, &[], route("10.244.1.0/26", U, tunl, 12, 254), Verdict::ClaimedBirdTunnel),
        // A foreign protocol is never ours, whatever the role.
        (Role::Felix, "Enabled", "Disabled", 80, &[], route("10.244.1.0/26", U, tunl, 17, 254), Verdict::Foreign),
        (Role::Felix, "Enabled", "Disabled", 80, &[], route("10.246.1.0/26", B, None, 4, 254), Verdict::Foreign),
        (Role::Bird, "Disabled", "Enabled", 80, &[], route("10.245.1.0/26", U, nic, 2, 254), Verdict::Foreign),
        (Role::Audit, "Enabled", "Enabled", 80, &[], route("10.244.1.0/26", U, tunl, 3, 254), Verdict::Foreign),
        // Frozen ground: no claim there; our own protocol stays ours (writes still go there).
        (Role::Felix, "Enabled", "Disabled", 80, &["10.244.1.0/24"], route("10.244.1.0/26", U, tunl, 12, 254), Verdict::Foreign),
        (Role::Felix, "Enabled", "Disabled", 80, &["10.244.0.0/16"], route("10.244.0.0/26", B, None, 12, 254), Verdict::Foreign),
        (Role::Felix, "Enabled", "Disabled", 80, &["10.244.1.0/26"], route("10.244.1.0/26", U, tunl, 80, 254), Verdict::OursByProtocol),
        (Role::Felix, "Enabled", "Disabled", 80, &["10.244.1.0/26"], route("10.244.2.0/26", U, tunl, 12, 254), Verdict::ClaimedBirdTunnel),
    ];
    for (role, felix, bgp, felix_protocol, frozen, r, want) in rows {
        let p = built(*role, felix, bgp, *felix_protocol, frozen, &[]);
        assert_eq!(p.verdict(r), *want, "role={role} felix={felix} bgp={bgp} felix_protocol={felix_protocol} frozen={frozen:?} {r:?}");
    }
}

/// A retired pool (gone from the datastore, once ours) stays owned; the built policy carries
/// the flags' protocol, table, devices and held rewrites.
#[test]
fn built_policy_keeps_retired_pools_and_the_flags() {
    let p = built(Role::Felix, "Enabled", "Disabled", 80, &[], &["10.99.0.0/16"]);
    assert_eq!(p.verdict(&route("10.99.1.0/26", U, Some("tunl0"), 80, 254)), Verdict::OursByProtocol);
    assert_eq!(p.owned, nets(&["10.99.0.0/16", "10.244.0.0/16", "10.245.0.0/16", "10.246.0.0/16"]));
    assert_eq!((p.protocol, p.table, p.tunnel_dev.as_str(), p.host_nic.as_str(), p.hold_rewrites), (80, 254, "tunl0", "eth0", false));
    assert_eq!(p.dump_protocols(), vec![80, 12]);
    let base = OwnershipPolicy::base(80, 254, &RouteDevices::default());
    assert_eq!((base.owned.len(), base.dump_protocols()), (0, vec![80]));
}
