//! Table tests for the ownership engine. The expectations are written out independently from
//! the reference tables (§1.2–§1.4), not derived from the engine's helpers.

use super::*;

const POOLS: &str = r"
apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: ipip-always}
spec: {cidr: 10.244.0.0/16, ipipMode: Always}
---
apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: ipip-cross}
spec: {cidr: 10.245.0.0/16, ipipMode: CrossSubnet}
---
apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: noencap-v4}
spec: {cidr: 10.246.0.0/16}
---
apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: noencap-v6}
spec: {cidr: 'fd00:10:244::/48', ipipMode: Never, vxlanMode: Never}
---
apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: vxlan}
spec: {cidr: 10.247.0.0/16, vxlanMode: CrossSubnet}
---
apiVersion: projectcalico.org/v3
kind: IPPool
metadata: {name: lb-only}
spec: {cidr: 10.248.0.0/16, allowedUses: [LoadBalancer]}
";

/// Field values under test: absent, the four values, lower case, unknown.
const VALUES: [Option<&str>; 8] = [
    None,
    Some("Disabled"),
    Some("EnabledIPIPOnly"),
    Some("EnabledNoEncapOnly"),
    Some("Enabled"),
    Some("enabled"),
    Some("enabledipiponly"),
    Some("Sometimes"),
];

const VERSIONS: [CalicoVersion; 3] = [CalicoVersion::V3_31, CalicoVersion::V3_32, CalicoVersion::V3_33];

/// (ipip, noencap) Felix programs, and whether the value is version skew. Reference §1.3/§1.4.
fn expected_felix(v: CalicoVersion, raw: Option<&str>) -> ((bool, bool), bool, &'static str) {
    use CalicoVersion::*;
    match (v, raw) {
        (V3_33, None) => ((true, false), false, "default"),
        (V3_33, Some("Disabled")) => ((false, false), false, "field"),
        (V3_33, Some("EnabledIPIPOnly" | "enabledipiponly")) => ((true, false), false, "field"),
        (V3_33, Some("EnabledNoEncapOnly")) => ((false, true), false, "field"),
        (V3_33, Some("Enabled" | "enabled")) => ((true, true), false, "field"),
        (V3_33, Some(_)) => ((true, false), true, "fallback"),
        (_, None) => ((false, false), false, "default"),
        (_, Some("Disabled")) => ((false, false), false, "field"),
        (_, Some("Enabled" | "enabled")) => ((true, true), false, "field"),
        (_, Some(_)) => ((false, false), true, "fallback"),
    }
}

/// (ipip, noencap) BIRD programs, version skew, source kind.
fn expected_bird(v: CalicoVersion, raw: Option<&str>) -> ((bool, bool), bool, &'static str) {
    use CalicoVersion::*;
    match (v, raw) {
        (V3_31, r) => ((true, true), r.is_some(), "fixed"),
        (V3_32, None) => ((true, true), false, "default"),
        (V3_32, Some("Disabled")) => ((false, false), false, "field"),
        (V3_32, Some("Enabled")) => ((true, true), false, "field"),
        (V3_32, Some(_)) => ((true, true), true, "fallback"),
        (V3_33, None) => ((false, true), false, "default"),
        (V3_33, Some("Disabled")) => ((false, false), false, "field"),
        (V3_33, Some("EnabledIPIPOnly")) => ((true, false), false, "field"),
        (V3_33, Some("EnabledNoEncapOnly")) => ((false, true), false, "field"),
        (V3_33, Some("Enabled")) => ((true, true), false, "field"),
        (V3_33, Some(_)) => ((false, true), true, "fallback"),
    }
}

fn cluster(felix: Option<&str>, bgp: Option<&str>) -> Cluster {
    let mut text = POOLS.to_owned();
    if let Some(v) = felix {
        text.push_str(&format!(
            "---\napiVersion: projectcalico.org/v3\nkind: FelixConfiguration\nmetadata: {{name: default}}\nspec: {{programClusterRoutes: {v}}}\n"
        ));
    }
    if let Some(v) = bgp {
        text.push_str(&format!(
            "---\napiVersion: crd.projectcalico.org/v1\nkind: BGPConfiguration\nmetadata: {{name: default}}\nspec: {{programClusterRoutes: {v}}}\n"
        ));
    }
    let (c, errors) = Cluster::from_yaml_str(&text).expect("yaml");
    assert_eq!(errors, vec![]);
    c
}

fn roles() -> Vec<Role> {
    let mut r = vec![Role::Felix, Role::Bird, Role::Audit];
    r.extend(ClusterRoutes::ALL.map(Role::Explicit));
    r
}

/// Every release line x every Felix value x every BGP value x every role, over a cluster with a
/// pool of every kind.
#[test]
fn full_matrix() {
    let mut cases = 0;
    for version in VERSIONS {
        for fv in VALUES {
            for bv in VALUES {
                let c = cluster(fv, bv);
                let ((f_ipip, f_ne), f_skew, f_src) = expected_felix(version, fv);
                let ((b_ipip, b_ne), b_skew, b_src) = expected_bird(version, bv);
                for role in roles() {
                    cases += 1;
                    let ctx = format!("{version} felix={fv:?} bgp={bv:?} role={role}");
                    let d = decide(&c, &OwnershipConfig { role, version, node: None });
                    assert_eq!(d.felix.source.kind(), f_src, "{ctx}");
                    assert_eq!(d.bird.source.kind(), b_src, "{ctx}");

                    let (felix_w, bird_w) = match role {
                        Role::Felix => (Writer::Routewarden, Writer::Bird),
                        Role::Bird => (Writer::Felix, Writer::Routewarden),
                        _ => (Writer::Felix, Writer::Bird),
                    };
                    let (rw_ipip, rw_ne) = match role {
                        Role::Explicit(ClusterRoutes::Disabled) => (false, false),
                        Role::Explicit(ClusterRoutes::EnabledIpipOnly) => (true, false),
                        Role::Explicit(ClusterRoutes::EnabledNoEncapOnly) => (false, true),
                        Role::Explicit(ClusterRoutes::Enabled) => (true, true),
                        _ => (false, false),
                    };
                    let expect = |f: bool, b: bool, rw: bool| {
                        let mut w = BTreeSet::new();
                        if f {
                            w.insert(felix_w);
                        }
                        if b {
                            w.insert(bird_w);
                        }
                        if rw {
                            w.insert(Writer::Routewarden);
                        }
                        w
                    };
                    let ipip = expect(f_ipip, b_ipip, rw_ipip);
                    let ne = expect(f_ne, b_ne, rw_ne);
                    assert_eq!(d.writers[&PoolClass::Ipip], ipip, "{ctx} ipip");
                    assert_eq!(d.writers[&PoolClass::NoEncap], ne, "{ctx} noencap");
                    assert_eq!(d.writers[&PoolClass::Vxlan], BTreeSet::from([Writer::Felix]), "{ctx} vxlan");
                    assert_eq!(d.programs(PoolClass::Ipip), ipip.contains(&Writer::Routewarden), "{ctx}");
                    assert_eq!(d.programs(PoolClass::NoEncap), ne.contains(&Writer::Routewarden), "{ctx}");
                    assert!(!d.programs(PoolClass::Vxlan), "{ctx}");

                    // Per pool: writers of its class; LB-only has none; BIRD's kernel filter
                    // follows BIRD's field whatever the role.
                    for p in &d.pools {
                        let (want_kind, want_writers, want_accept) = match p.pool.as_str() {
                            "ipip-always" => (PoolKind::IpipAlways, ipip.clone(), b_ipip),
                            "ipip-cross" => (PoolKind::IpipCrossSubnet, ipip.clone(), b_ipip),
                            "noencap-v4" => (PoolKind::NoEncap, ne.clone(), b_ne),
                            "noencap-v6" => (PoolKind::NoEncapV6, ne.clone(), b_ne),
                            "vxlan" => (PoolKind::Vxlan, BTreeSet::from([Writer::Felix]), false),
                            "lb-only" => (PoolKind::LoadBalancerOnly, BTreeSet::new(), b_ne),
                            other => panic!("unexpected pool {other}"),
                        };
                        assert_eq!(p.kind, want_kind, "{ctx} {}", p.pool);
                        assert_eq!(p.writers, want_writers.into_iter().collect::<Vec<_>>(), "{ctx} {}", p.pool);
                        let accept = if want_accept { KernelFilter::Accept } else { KernelFilter::Reject };
                        assert_eq!(p.bird_kernel_filter, accept, "{ctx} {}", p.pool);
                    }

                    // Findings: one per class with pools, then deprecation, then skew.
                    let code = |w: &BTreeSet<Writer>| match w.len() {
                        0 => "unowned",
                        1 => "consistent",
                        _ => "double-programmed",
                    };
                    let mut want = vec![
                        (code(&ipip), "ipip"),
                        (code(&ne), "noencap"),
                        ("consistent", "vxlan"),
                    ];
                    if version == CalicoVersion::V3_33 && b_ipip {
                        want.push(("deprecated", "ipip"));
                    }
                    if f_skew {
                        want.push(("version-skew", "none"));
                    }
                    if b_skew {
                        want.push(("version-skew", "none"));
                    }
                    let got: Vec<(&str, &str)> = d.findings.iter().map(|f| (f.code(), f.class_label())).collect();
                    assert_eq!(got, want, "{ctx}");
                    assert_eq!(d.has_errors(), ipip.len() != 1 || ne.len() != 1, "{ctx}");
                }
            }
        }
    }
    assert_eq!(cases, 3 * 8 * 8 * 7);
}

/// The supported pairs of §1.8 are consistent in audit mode on 3.33.
#[test]
fn supported_pairs_are_consistent() {
    for (f, b) in [
        ("EnabledIPIPOnly", "EnabledNoEncapOnly"),
        ("Enabled", "Disabled"),
        ("Disabled", "Enabled"),
        ("EnabledNoEncapOnly", "EnabledIPIPOnly"),
    ] {
        let d = decide(&cluster(Some(f), Some(b)), &OwnershipConfig { role: Role::Audit, ..Default::default() });
        assert!(!d.has_errors(), "{f}/{b}: {:#?}", d.findings);
    }
    // And absent fields on 3.33 default to the first pair.
    let d = decide(&cluster(None, None), &OwnershipConfig { role: Role::Audit, ..Default::default() });
    assert_eq!(d.writers_of(PoolClass::Ipip), vec![Writer::Felix]);
    assert_eq!(d.writers_of(PoolClass::NoEncap), vec![Writer::Bird]);
}

/// `explicit:Enabled` while Felix keeps its default EnabledIPIPOnly is a double on IPIP; BIRD's
/// default EnabledNoEncapOnly makes no-encap a double too.
#[test]
fn explicit_role_counts_three_writers() {
    let role: Role = "explicit:Enabled".parse().unwrap();
    let d = decide(&cluster(None, Some("Enabled")), &OwnershipConfig { role, ..Default::default() });
    let ipip = d.findings.iter().find(|f| f.class == Some(PoolClass::Ipip) && f.code() == "double-programmed").unwrap();
    assert_eq!(
        ipip.kind,
        FindingKind::DoubleProgrammed { writers: vec![Writer::Felix, Writer::Bird, Writer::Routewarden] }
    );
    assert!(ipip.message.starts_with("felix and bird and routewarden all program the IPIP cluster routes of pools ipip-always, ipip-cross"), "{}", ipip.message);
    assert_eq!(d.explicit.as_ref().map(|e| e.value), Some(ClusterRoutes::Enabled));
}

/// FelixConfiguration `node.<name>` overrides `default` for that node only, field by field.
#[test]
fn per_node_felix_override() {
    let mut text = POOLS.to_owned();
    text.push_str(
        "---\napiVersion: projectcalico.org/v3\nkind: FelixConfiguration\nmetadata: {name: default}\nspec: {programClusterRoutes: EnabledIPIPOnly}\n\
         ---\napiVersion: projectcalico.org/v3\nkind: FelixConfiguration\nmetadata: {name: node.node-a}\nspec: {programClusterRoutes: enabled}\n\
         ---\napiVersion: projectcalico.org/v3\nkind: FelixConfiguration\nmetadata: {name: node.node-b}\nspec: {logSeverityScreen: Debug}\n",
    );
    let (c, _) = Cluster::from_yaml_str(&text).unwrap();
    let for_node = |n: Option<&str>| decide(&c, &OwnershipConfig { role: Role::Felix, version: CalicoVersion::V3_33, node: n.map(Into::into) });
    let a = for_node(Some("node-a"));
    assert_eq!(a.felix.value, ClusterRoutes::Enabled);
    assert_eq!(
        a.felix.source,
        DecisionSource::FieldIgnoringCase { object: "FelixConfiguration node.node-a".into(), value: "enabled".into() }
    );
    assert_eq!(a.programmed, BTreeSet::from([PoolClass::Ipip, PoolClass::NoEncap]));
    let b = for_node(Some("node-b"));
    assert_eq!(b.felix.source, DecisionSource::Field { object: "FelixConfiguration default".into(), value: "EnabledIPIPOnly".into() });
    assert_eq!(b.programmed, BTreeSet::from([PoolClass::Ipip]));
    assert_eq!(for_node(None).felix.value, ClusterRoutes::EnabledIpipOnly);
}

/// Only the BGPConfiguration named `default` counts.
#[test]
fn only_default_bgp_configuration_counts() {
    let mut text = POOLS.to_owned();
    text.push_str("---\napiVersion: projectcalico.org/v3\nkind: BGPConfiguration\nmetadata: {name: node.node-a}\nspec: {programClusterRoutes: Enabled}\n");
    let (c, _) = Cluster::from_yaml_str(&text).unwrap();
    let d = decide(&c, &OwnershipConfig { role: Role::Audit, ..Default::default() });
    assert_eq!(d.bird.value, ClusterRoutes::EnabledNoEncapOnly);
    assert_eq!(d.bird.source, DecisionSource::Default { reason: "no BGPConfiguration default".into() });
}

#[test]
fn deprecated_message_names_both_fields() {
    let d = decide(&cluster(Some("Disabled"), Some("Enabled")), &OwnershipConfig { role: Role::Audit, ..Default::default() });
    let f = d.findings.iter().find(|f| f.code() == "deprecated").unwrap();
    assert!(f.message.contains("FelixConfiguration programClusterRoutes to EnabledIPIPOnly"), "{}", f.message);
    assert!(f.message.contains("BGPConfiguration programClusterRoutes to EnabledNoEncapOnly"), "{}", f.message);
    assert_eq!(f.severity, Severity::Warning);
}

#[test]
fn version_skew_messages() {
    let cfg = |version| OwnershipConfig { role: Role::Audit, version, node: None };
    let d = decide(&cluster(Some("EnabledIPIPOnly"), Some("enabled")), &cfg(CalicoVersion::V3_32));
    let msgs: Vec<&str> = d.findings.iter().filter(|f| f.code() == "version-skew").map(|f| f.message.as_str()).collect();
    assert_eq!(
        msgs,
        vec![
            "FelixConfiguration default: programClusterRoutes \"EnabledIPIPOnly\" is a Calico 3.33+ value that Felix 3.32 does not know; Felix uses its default Disabled",
            "BGPConfiguration default: programClusterRoutes \"enabled\" is Enabled in the wrong case, which confd 3.32 does not accept; confd 3.32 turns BIRD's kernel programming off only for the exact value Disabled, so BIRD programs everything",
        ]
    );
}

#[test]
fn cli_parsing() {
    assert_eq!("felix".parse::<Role>(), Ok(Role::Felix));
    assert_eq!("bird".parse::<Role>(), Ok(Role::Bird));
    assert_eq!("audit".parse::<Role>(), Ok(Role::Audit));
    assert_eq!("explicit:Enabled".parse::<Role>(), Ok(Role::Explicit(ClusterRoutes::Enabled)));
    assert_eq!("explicit:EnabledIPIPOnly".parse::<Role>(), Ok(Role::Explicit(ClusterRoutes::EnabledIpipOnly)));
    assert!("explicit:Sometimes".parse::<Role>().is_err());
    assert!("Felix".parse::<Role>().is_err());
    assert_eq!(Role::Explicit(ClusterRoutes::EnabledNoEncapOnly).to_string(), "explicit:EnabledNoEncapOnly");
    assert_eq!("3.31".parse::<CalicoVersion>(), Ok(CalicoVersion::V3_31));
    assert_eq!("v3.32.1".parse::<CalicoVersion>(), Ok(CalicoVersion::V3_32));
    assert_eq!("3.33".parse::<CalicoVersion>(), Ok(CalicoVersion::V3_33));
    assert_eq!("3.34.0-0.dev".parse::<CalicoVersion>(), Ok(CalicoVersion::V3_33));
    assert!("3.30".parse::<CalicoVersion>().is_err());
    assert!("latest".parse::<CalicoVersion>().is_err());
    assert_eq!(CalicoVersion::default(), CalicoVersion::V3_33);
}
