//! Table tests for the ownership engine. The expectations are written out independently from
//! the reference tables (§1.2–§1.4), not derived from the engine's helpers.

use std::fmt::Write as _;

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
const VALUES: [Option<&str>; 8] =
    [None, Some("Disabled"), Some("EnabledIPIPOnly"), Some("EnabledNoEncapOnly"), Some("Enabled"), Some("enabled"), Some("enabledipiponly"), Some("Sometimes")];

/// Release lines under test, by minor number: three of the legacy lines (3.26 to 3.30), 3.31,
/// 3.32, 3.33 and 3.34 (newer than the newest known line, decided as 3.33).
const MINORS: [u16; 7] = [26, 28, 30, 31, 32, 33, 34];

/// (ipip, noencap) Felix programs, the code of the finding the value gives (if any), and the
/// source kind. Reference §1.3 (table, one row per line) and §1.4.
fn expected_felix(minor: u16, raw: Option<&str>) -> ((bool, bool), Option<&'static str>, &'static str) {
    match (minor, raw) {
        // No field before 3.31: Felix programs only VXLAN; a value is reported, not applied.
        (26..=30, None) => ((false, false), None, "fixed"),
        (26..=30, Some(_)) => ((false, false), Some("ignored-by-release"), "fixed"),
        // Two values, default Disabled.
        (31 | 32, None) => ((false, false), None, "default"),
        (31 | 32, Some("Disabled")) => ((false, false), None, "field"),
        (31 | 32, Some("Enabled" | "enabled")) => ((true, true), None, "field"),
        (31 | 32, Some(_)) => ((false, false), Some("version-skew"), "fallback"),
        // Four values, default EnabledIPIPOnly (3.34 behaves as 3.33).
        (_, None) => ((true, false), None, "default"),
        (_, Some("Disabled")) => ((false, false), None, "field"),
        (_, Some("EnabledIPIPOnly" | "enabledipiponly")) => ((true, false), None, "field"),
        (_, Some("EnabledNoEncapOnly")) => ((false, true), None, "field"),
        (_, Some("Enabled" | "enabled")) => ((true, true), None, "field"),
        (_, Some(_)) => ((true, false), Some("version-skew"), "fallback"),
    }
}

/// (ipip, noencap) BIRD programs, the code of the finding the value gives, source kind.
fn expected_bird(minor: u16, raw: Option<&str>) -> ((bool, bool), Option<&'static str>, &'static str) {
    match (minor, raw) {
        // No BGPConfiguration field before 3.32: BIRD programs IPIP and no-encap.
        (26..=31, None) => ((true, true), None, "fixed"),
        (26..=31, Some(_)) => ((true, true), Some("ignored-by-release"), "fixed"),
        (32, None) => ((true, true), None, "default"),
        (32, Some("Disabled")) => ((false, false), None, "field"),
        (32, Some("Enabled")) => ((true, true), None, "field"),
        (32, Some(_)) => ((true, true), Some("version-skew"), "fallback"),
        (_, None) => ((false, true), None, "default"),
        (_, Some("Disabled")) => ((false, false), None, "field"),
        (_, Some("EnabledIPIPOnly")) => ((true, false), None, "field"),
        (_, Some("EnabledNoEncapOnly")) => ((false, true), None, "field"),
        (_, Some("Enabled")) => ((true, true), None, "field"),
        (_, Some(_)) => ((false, true), Some("version-skew"), "fallback"),
    }
}

fn cluster(felix: Option<&str>, bgp: Option<&str>) -> Cluster {
    let mut text = POOLS.to_owned();
    if let Some(v) = felix {
        let _ =
            write!(text, "---\napiVersion: projectcalico.org/v3\nkind: FelixConfiguration\nmetadata: {{name: default}}\nspec: {{programClusterRoutes: {v}}}\n");
    }
    if let Some(v) = bgp {
        let _ = write!(
            text,
            "---\napiVersion: crd.projectcalico.org/v1\nkind: BGPConfiguration\nmetadata: {{name: default}}\nspec: {{programClusterRoutes: {v}}}\n"
        );
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
    for minor in MINORS {
        let version = CalicoVersion::new(minor);
        for fv in VALUES {
            for bv in VALUES {
                let c = cluster(fv, bv);
                let ((f_ipip, f_ne), f_finding, f_src) = expected_felix(minor, fv);
                let ((b_ipip, b_ne), b_finding, b_src) = expected_bird(minor, bv);
                for role in roles() {
                    cases += 1;
                    let ctx = format!("{version} felix={fv:?} bgp={bv:?} role={role}");
                    let d = decide(&c, &OwnershipConfig { role, version: VersionChoice::Fixed(version), node: None });
                    assert_eq!(d.version.source, VersionSource::Flag, "{ctx}");
                    assert_eq!(d.felix.source.kind(), f_src, "{ctx}");
                    assert_eq!(d.bird.source.kind(), b_src, "{ctx}");

                    let (felix_w, bird_w) = match role {
                        Role::Felix => (Writer::Routewarden, Writer::Bird),
                        Role::Bird => (Writer::Felix, Writer::Routewarden),
                        Role::Audit | Role::Explicit(_) => (Writer::Felix, Writer::Bird),
                    };
                    let (rw_ipip, rw_ne) = match role {
                        Role::Explicit(ClusterRoutes::EnabledIpipOnly) => (true, false),
                        Role::Explicit(ClusterRoutes::EnabledNoEncapOnly) => (false, true),
                        Role::Explicit(ClusterRoutes::Enabled) => (true, true),
                        Role::Explicit(ClusterRoutes::Disabled) | Role::Felix | Role::Bird | Role::Audit => (false, false),
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
                    let mut want = vec![(code(&ipip), "ipip"), (code(&ne), "noencap"), ("consistent", "vxlan")];
                    // BIRD's IPIP is deprecated from 3.33 on.
                    if minor >= 33 && b_ipip {
                        want.push(("deprecated", "ipip"));
                    }
                    if minor == 34 {
                        want.push(("version-newer", "none"));
                    }
                    want.extend(f_finding.map(|c| (c, "none")));
                    want.extend(b_finding.map(|c| (c, "none")));
                    let got: Vec<(&str, &str)> = d.findings.iter().map(|f| (f.code(), f.class_label())).collect();
                    assert_eq!(got, want, "{ctx}");
                    assert_eq!(d.has_errors(), ipip.len() != 1 || ne.len() != 1, "{ctx}");
                }
            }
        }
    }
    assert_eq!(cases, 7 * 8 * 8 * 7);
}

/// The supported pairs of §1.8 are consistent in audit mode on 3.33.
#[test]
fn supported_pairs_are_consistent() {
    for (f, b) in [("EnabledIPIPOnly", "EnabledNoEncapOnly"), ("Enabled", "Disabled"), ("Disabled", "Enabled"), ("EnabledNoEncapOnly", "EnabledIPIPOnly")] {
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
    assert_eq!(ipip.kind, FindingKind::DoubleProgrammed { writers: vec![Writer::Felix, Writer::Bird, Writer::Routewarden] });
    assert!(
        ipip.message.starts_with("felix and bird and routewarden all program the IPIP cluster routes of pools ipip-always, ipip-cross"),
        "{}",
        ipip.message
    );
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
    let for_node = |n: Option<&str>| decide(&c, &OwnershipConfig { role: Role::Felix, version: CalicoVersion::V3_33.into(), node: n.map(Into::into) });
    let a = for_node(Some("node-a"));
    assert_eq!(a.felix.value, ClusterRoutes::Enabled);
    assert_eq!(a.felix.source, DecisionSource::FieldIgnoringCase { object: "FelixConfiguration node.node-a".into(), value: "enabled".into() });
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
    let cfg = |version: CalicoVersion| OwnershipConfig { role: Role::Audit, version: version.into(), node: None };
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
    assert_eq!("3.30".parse::<CalicoVersion>(), Ok(CalicoVersion::V3_30));
    assert_eq!("3.26".parse::<CalicoVersion>(), Ok(CalicoVersion::new(26)));
    assert_eq!("3.34.0-0.dev".parse::<CalicoVersion>(), Ok(CalicoVersion::new(34)));
    assert_eq!("v3.31.0-0.dev-123-gabcdef0".parse::<CalicoVersion>(), Ok(CalicoVersion::V3_31));
    for bad in ["3.25", "v3.20.1", "latest", "master", "4.0", "v4.0.0", "3", "3.", "3.x", "3.30.", "3.30abc", " 3.30", "v3.30.2-\nx", "v3.30.2 (dev)"] {
        assert_eq!(bad.parse::<CalicoVersion>(), Err(OwnershipError::InvalidVersion { value: bad.to_owned() }), "{bad}");
    }
    // A detected release may be older than the command line accepts.
    assert_eq!(CalicoVersion::parse_release("v3.25.1"), Ok(CalicoVersion::new(25)));
    assert_eq!("auto".parse::<VersionChoice>(), Ok(VersionChoice::Auto));
    assert_eq!("3.30".parse::<VersionChoice>(), Ok(VersionChoice::Fixed(CalicoVersion::V3_30)));
    assert_eq!(VersionChoice::default(), VersionChoice::Auto);
    assert_eq!("3.29".parse::<VersionChoice>().map(|v| v.to_string()), Ok("3.29".to_owned()));
    assert_eq!(
        OwnershipError::InvalidVersion { value: "3.2".into() }.to_string(),
        "invalid --calico-version \"3.2\": expected auto or a release line 3.26 or later (3.26 to 3.30 have no programClusterRoutes fields; 3.34 and later behave as 3.33)"
    );
    assert_eq!(CalicoVersion::default(), CalicoVersion::V3_33);
}

/// `POOLS` plus `extra` YAML documents.
fn with(extra: &str) -> Cluster {
    let (c, errors) = Cluster::from_yaml_str(&format!("{POOLS}---\n{extra}")).expect("yaml");
    assert_eq!(errors, vec![]);
    c
}

fn cluster_info(group: &str, version: &str) -> String {
    format!("apiVersion: {group}\nkind: ClusterInformation\nmetadata: {{name: default}}\nspec: {{calicoVersion: {version:?}, clusterType: 'k8s,bgp,kdd'}}\n")
}

fn audit_auto() -> OwnershipConfig {
    OwnershipConfig { role: Role::Audit, version: VersionChoice::Auto, node: None }
}

/// `auto` reads `ClusterInformation default` (both API groups); without a usable one it assumes
/// 3.33 and names what was missing. Each expected value is written out from the reference.
#[test]
fn auto_version_from_cluster_information() {
    let assumed =
        |reason: &str| ResolvedVersion { version: CalicoVersion::V3_33, rules: Rules::V3_33, source: VersionSource::Assumed { reason: reason.to_owned() } };
    let detected = |minor: u16, rules: Rules, value: &str| ResolvedVersion {
        version: CalicoVersion::new(minor),
        rules,
        source: VersionSource::ClusterInformation { value: value.to_owned() },
    };
    let cases: Vec<(String, ResolvedVersion)> = vec![
        (String::new(), assumed("no ClusterInformation default")),
        (cluster_info("crd.projectcalico.org/v1", "v3.30.2"), detected(30, Rules::Legacy, "v3.30.2")),
        (cluster_info("projectcalico.org/v3", "v3.28.0"), detected(28, Rules::Legacy, "v3.28.0")),
        (cluster_info("crd.projectcalico.org/v1", "v3.31.7"), detected(31, Rules::V3_31, "v3.31.7")),
        (cluster_info("crd.projectcalico.org/v1", "v3.32.1"), detected(32, Rules::V3_32, "v3.32.1")),
        (cluster_info("projectcalico.org/v3", "v3.33.0-0.dev-45-gdc610b8"), detected(33, Rules::V3_33, "v3.33.0-0.dev-45-gdc610b8")),
        (cluster_info("crd.projectcalico.org/v1", "v3.34.1"), detected(34, Rules::V3_33, "v3.34.1")),
        (cluster_info("crd.projectcalico.org/v1", "v3.25.1"), detected(25, Rules::Legacy, "v3.25.1")),
        (cluster_info("crd.projectcalico.org/v1", "master"), assumed("ClusterInformation default: spec.calicoVersion \"master\" is not a Calico 3 release")),
        (cluster_info("crd.projectcalico.org/v1", ""), assumed("ClusterInformation default has no spec.calicoVersion (no calico-node has started yet)")),
        (
            "apiVersion: crd.projectcalico.org/v1\nkind: ClusterInformation\nmetadata: {name: default}\nspec: {calicoVersion: v3.21.2, variant: TigeraSecureEnterprise}\n".to_owned(),
            assumed("ClusterInformation default: spec.variant \"TigeraSecureEnterprise\" is not Calico open source, whose release lines routewarden knows"),
        ),
        // Only `default` counts.
        ("apiVersion: crd.projectcalico.org/v1\nkind: ClusterInformation\nmetadata: {name: other}\nspec: {calicoVersion: v3.30.2}\n".to_owned(), assumed("no ClusterInformation default")),
    ];
    for (yaml, want) in cases {
        let c = if yaml.is_empty() { cluster(None, None) } else { with(&yaml) };
        let d = decide(&c, &audit_auto());
        assert_eq!(d.version, want, "{yaml}");
    }
    // An explicit line wins over the cluster's.
    let c = with(&cluster_info("crd.projectcalico.org/v1", "v3.30.2"));
    let d = decide(&c, &OwnershipConfig { version: CalicoVersion::V3_31.into(), ..audit_auto() });
    assert_eq!(d.version, ResolvedVersion { version: CalicoVersion::V3_31, rules: Rules::V3_31, source: VersionSource::Flag });
}

/// The version's findings and how it reads in `explain`.
#[test]
fn version_findings_and_display() {
    let findings = |yaml: &str| -> Vec<(String, Severity, String)> {
        let c = if yaml.is_empty() { cluster(None, None) } else { with(yaml) };
        decide(&c, &audit_auto()).findings.into_iter().filter(|f| f.class.is_none()).map(|f| (f.code().to_owned(), f.severity, f.message)).collect()
    };
    assert_eq!(
        findings(""),
        vec![(
            "version-assumed".to_owned(),
            Severity::Warning,
            "Calico release not detected (no ClusterInformation default): assuming 3.33; set --calico-version if the cluster runs another line".to_owned()
        )]
    );
    assert_eq!(
        findings(&cluster_info("crd.projectcalico.org/v1", "v3.34.1")),
        vec![(
            "version-newer".to_owned(),
            Severity::Info,
            "Calico 3.34 is newer than the newest line routewarden knows (3.33); deciding by its rules".to_owned()
        )]
    );
    assert_eq!(
        findings(&cluster_info("crd.projectcalico.org/v1", "v3.25.1")),
        vec![(
            "version-older".to_owned(),
            Severity::Warning,
            "Calico 3.25 is older than the oldest line routewarden supports (3.26); deciding by the 3.26-3.30 rules (no programClusterRoutes fields)"
                .to_owned()
        )]
    );
    assert_eq!(findings(&cluster_info("crd.projectcalico.org/v1", "v3.30.2")), vec![]);
    let show = |yaml: &str, choice: VersionChoice| {
        let c = if yaml.is_empty() { cluster(None, None) } else { with(yaml) };
        decide(&c, &OwnershipConfig { version: choice, ..audit_auto() }).version.to_string()
    };
    assert_eq!(show(&cluster_info("crd.projectcalico.org/v1", "v3.30.2"), VersionChoice::Auto), "3.30 (ClusterInformation default: v3.30.2)");
    assert_eq!(show(&cluster_info("crd.projectcalico.org/v1", "v3.34.1"), VersionChoice::Auto), "3.34, decided as 3.33 (ClusterInformation default: v3.34.1)");
    assert_eq!(show("", VersionChoice::Auto), "3.33 (assumed: no ClusterInformation default)");
    assert_eq!(show("", CalicoVersion::V3_31.into()), "3.31 (--calico-version)");
    assert_eq!(show("", CalicoVersion::new(36).into()), "3.36, decided as 3.33 (--calico-version)");
}

/// On 3.30 and earlier neither field exists: a value set anywhere (FelixConfiguration,
/// BGPConfiguration, the calico-node env) is reported as set but ignored, and BIRD programs
/// IPIP and no-encap, Felix only VXLAN.
#[test]
fn legacy_lines_ignore_every_value_and_say_so() {
    let c = with(&format!(
        "{}---\n{}---\n{}---\n{}",
        cluster_info("crd.projectcalico.org/v1", "v3.30.2"),
        "apiVersion: projectcalico.org/v3\nkind: FelixConfiguration\nmetadata: {name: default}\nspec: {programClusterRoutes: EnabledIPIPOnly}\n",
        "apiVersion: projectcalico.org/v3\nkind: BGPConfiguration\nmetadata: {name: default}\nspec: {programClusterRoutes: EnabledNoEncapOnly}\n",
        calico_node_ds("kube-system", "- {name: FELIX_PROGRAMCLUSTERROUTES, value: Enabled}"),
    ));
    let d = decide(&c, &OwnershipConfig { role: Role::Bird, ..audit_auto() });
    assert_eq!(d.felix.source, DecisionSource::Fixed { reason: "Calico 3.30 has no programClusterRoutes: Felix programs only VXLAN cluster routes".into() });
    assert_eq!(d.bird.source, DecisionSource::Fixed { reason: "Calico 3.30 BIRD templates program every IPIP and no-encap pool".into() });
    assert_eq!(d.programmed, BTreeSet::from([PoolClass::Ipip, PoolClass::NoEncap]));
    assert_eq!(d.writers[&PoolClass::Vxlan], BTreeSet::from([Writer::Felix]));
    let ignored: Vec<&str> = d.findings.iter().filter(|f| f.code() == "ignored-by-release").map(|f| f.message.as_str()).collect();
    assert_eq!(
        ignored,
        vec![
            "calico-node env (kube-system/calico-node) FELIX_PROGRAMCLUSTERROUTES: \"Enabled\" is set but ignored by this release: Felix 3.30 does not read it, and Felix programs only VXLAN cluster routes",
            "FelixConfiguration default: \"EnabledIPIPOnly\" is set but ignored by this release: Felix 3.30 does not read it, and Felix programs only VXLAN cluster routes",
            "BGPConfiguration default: \"EnabledNoEncapOnly\" is set but ignored by this release: confd 3.30 does not read it, and BIRD programs IPIP and no-encap routes regardless",
        ]
    );
    // No deprecation before 3.33, and the pair is consistent (BIRD alone, VXLAN Felix).
    assert!(d.findings.iter().all(|f| f.code() != "deprecated"));
    assert!(!d.has_errors());
}

/// A calico-node DaemonSet in `namespace` whose container has `env` (YAML list lines).
fn calico_node_ds(namespace: &str, env: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {{name: calico-node, namespace: {namespace}}}\nspec:\n  template:\n    spec:\n      containers:\n      - name: calico-node\n        env:\n        - {{name: DATASTORE_TYPE, value: kubernetes}}\n        {env}\n"
    )
}

const FELIX_DEFAULT_IPIP: &str =
    "apiVersion: projectcalico.org/v3\nkind: FelixConfiguration\nmetadata: {name: default}\nspec: {programClusterRoutes: EnabledIPIPOnly}\n";

/// `FELIX_PROGRAMCLUSTERROUTES` in the calico-node container outranks every FelixConfiguration
/// (`felix/config/config_params.go` `SourcesInDescendingOrder`), in any case of its name; an
/// unknown value is replaced by the default, not by the datastore's.
#[test]
fn calico_node_env_outranks_the_datastore() {
    let on = |extra: &str, node: Option<&str>| {
        let node_fc = "apiVersion: projectcalico.org/v3\nkind: FelixConfiguration\nmetadata: {name: node.node-a}\nspec: {programClusterRoutes: Disabled}\n";
        let c = with(&format!("{}---\n{FELIX_DEFAULT_IPIP}---\n{node_fc}---\n{extra}", cluster_info("crd.projectcalico.org/v1", "v3.33.0")));
        decide(&c, &OwnershipConfig { role: Role::Audit, version: VersionChoice::Auto, node: node.map(Into::into) })
    };
    let d = on(&calico_node_ds("calico-system", "- {name: FELIX_PROGRAMCLUSTERROUTES, value: Enabled}"), Some("node-a"));
    assert_eq!(d.felix.value, ClusterRoutes::Enabled);
    assert_eq!(
        d.felix.source,
        DecisionSource::Env {
            daemonset: "calico-system/calico-node".into(),
            name: "FELIX_PROGRAMCLUSTERROUTES".into(),
            value: "Enabled".into(),
            overrides: Some("FelixConfiguration node.node-a: Disabled".into()),
        }
    );
    assert_eq!(
        d.felix.source.to_string(),
        "calico-node env (calico-system/calico-node): FELIX_PROGRAMCLUSTERROUTES=Enabled, over FelixConfiguration node.node-a: Disabled"
    );
    assert_eq!(d.felix.source.kind(), "env");
    // Felix with Enabled and BIRD's default EnabledNoEncapOnly: no-encap twice.
    assert_eq!(d.writers[&PoolClass::NoEncap], BTreeSet::from([Writer::Felix, Writer::Bird]));
    // Any case of the name, any case of the value.
    let d = on(&calico_node_ds("kube-system", "- {name: felix_programClusterRoutes, value: enablednoencaponly}"), None);
    assert_eq!(d.felix.value, ClusterRoutes::EnabledNoEncapOnly);
    assert_eq!(
        d.felix.source.to_string(),
        "calico-node env (kube-system/calico-node): felix_programClusterRoutes=enablednoencaponly, over FelixConfiguration default: EnabledIPIPOnly"
    );
    // An unknown value: Felix's default, not the datastore's Disabled.
    let d = on(&calico_node_ds("calico-system", "- {name: FELIX_PROGRAMCLUSTERROUTES, value: Sometimes}"), Some("node-a"));
    assert_eq!(d.felix.value, ClusterRoutes::EnabledIpipOnly);
    assert_eq!(d.felix.source.kind(), "fallback");
    assert!(d.findings.iter().any(|f| f.message
        == "calico-node env (calico-system/calico-node) FELIX_PROGRAMCLUSTERROUTES: programClusterRoutes \"Sometimes\" is not a programClusterRoutes value of any Calico release (Felix 3.33); Felix uses its default EnabledIPIPOnly"));
    // An empty value is unset: the datastore decides.
    let d = on(&calico_node_ds("calico-system", "- {name: FELIX_PROGRAMCLUSTERROUTES, value: ''}"), Some("node-a"));
    assert_eq!(d.felix.source, DecisionSource::Field { object: "FelixConfiguration node.node-a".into(), value: "Disabled".into() });
}

/// A value routewarden cannot know (valueFrom, envFrom) and two DaemonSets that disagree: the
/// datastore decides, and a finding says why.
#[test]
fn calico_node_env_that_cannot_be_known_is_a_finding() {
    let codes = |c: &Cluster| -> Vec<(String, Severity, String)> {
        decide(c, &audit_auto()).findings.into_iter().filter(|f| f.class.is_none()).map(|f| (f.code().to_owned(), f.severity, f.message)).collect()
    };
    let base = format!("{}---\n{FELIX_DEFAULT_IPIP}", cluster_info("crd.projectcalico.org/v1", "v3.33.0"));
    let c = with(&format!(
        "{base}---\n{}",
        calico_node_ds("calico-system", "- {name: FELIX_PROGRAMCLUSTERROUTES, valueFrom: {configMapKeyRef: {name: calico-config, key: routes}}}")
    ));
    assert_eq!(decide(&c, &audit_auto()).felix.source, DecisionSource::Field { object: "FelixConfiguration default".into(), value: "EnabledIPIPOnly".into() });
    assert_eq!(
        codes(&c),
        vec![(
            "env-unresolved".to_owned(),
            Severity::Warning,
            "calico-node env (calico-system/calico-node): FELIX_PROGRAMCLUSTERROUTES comes from configMapKeyRef calico-config/routes, which routewarden does not read; Felix's value there outranks every FelixConfiguration and is unknown, so the decision shown follows the datastore".to_owned()
        )]
    );
    let env_from = "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: calico-node, namespace: kube-system}\nspec:\n  template:\n    spec:\n      containers:\n      - name: calico-node\n        envFrom: [{configMapRef: {name: kubernetes-services-endpoint, optional: true}}]\n";
    assert_eq!(
        codes(&with(&format!("{base}---\n{env_from}"))),
        vec![(
            "env-unresolved".to_owned(),
            Severity::Info,
            "calico-node env (kube-system/calico-node): envFrom configMapRef kubernetes-services-endpoint is not read; a FELIX_PROGRAMCLUSTERROUTES from there would outrank every FelixConfiguration".to_owned()
        )]
    );
    // Two DaemonSets (an operator migration half done): calico-system's is used.
    let c = with(&format!(
        "{base}---\n{}---\n{}",
        calico_node_ds("calico-system", "- {name: FELIX_PROGRAMCLUSTERROUTES, value: Enabled}"),
        calico_node_ds("kube-system", "- {name: DATASTORE_TYPE, value: kubernetes}")
    ));
    assert_eq!(decide(&c, &audit_auto()).felix.value, ClusterRoutes::Enabled);
    assert_eq!(
        codes(&c),
        vec![(
            "env-differs".to_owned(),
            Severity::Warning,
            "the calico-node DaemonSets set FELIX_PROGRAMCLUSTERROUTES differently (calico-system/calico-node \"Enabled\", kube-system/calico-node unset); each node runs one of them, so Felix's value differs between nodes; deciding with calico-system/calico-node's".to_owned()
        )]
    );
}

/// tigera/operator writes both fields from `clusterRoutingMode` (reference §1.9): fields that
/// say otherwise are a finding; an unset mode writes nothing and is not checked.
#[test]
fn operator_cluster_routing_mode_is_checked_against_the_fields() {
    let inst = |mode: Option<&str>| {
        let net = mode.map_or_else(String::new, |m| format!("calicoNetwork: {{clusterRoutingMode: {m}}}"));
        format!("apiVersion: operator.tigera.io/v1\nkind: Installation\nmetadata: {{name: default}}\nspec: {{variant: Calico, {net}}}\n")
    };
    let fields = |f: &str, b: &str| {
        format!(
            "apiVersion: projectcalico.org/v3\nkind: FelixConfiguration\nmetadata: {{name: default}}\nspec: {{programClusterRoutes: {f}}}\n---\napiVersion: projectcalico.org/v3\nkind: BGPConfiguration\nmetadata: {{name: default}}\nspec: {{programClusterRoutes: {b}}}\n"
        )
    };
    let mismatch = |version: &str, mode: Option<&str>, f: &str, b: &str| -> Vec<String> {
        let c = with(&format!("{}---\n{}---\n{}", cluster_info("crd.projectcalico.org/v1", version), inst(mode), fields(f, b)));
        decide(&c, &audit_auto()).findings.into_iter().filter(|f| matches!(f.code(), "operator-mismatch" | "ignored-by-release")).map(|f| f.message).collect()
    };
    // What the operator writes: no finding.
    assert_eq!(mismatch("v3.33.0", Some("Felix"), "Enabled", "Disabled"), Vec::<String>::new());
    assert_eq!(mismatch("v3.33.0", Some("FelixIPIPOnly"), "EnabledIPIPOnly", "EnabledNoEncapOnly"), Vec::<String>::new());
    assert_eq!(mismatch("v3.33.0", Some("BIRD"), "Disabled", "Enabled"), Vec::<String>::new());
    assert_eq!(mismatch("v3.33.0", None, "Enabled", "Enabled"), Vec::<String>::new());
    assert_eq!(
        mismatch("v3.33.0", Some("FelixIPIPOnly"), "Enabled", "EnabledNoEncapOnly"),
        vec!["Installation default: clusterRoutingMode FelixIPIPOnly means programClusterRoutes FelixConfiguration default EnabledIPIPOnly and BGPConfiguration default EnabledNoEncapOnly, but FelixConfiguration default has \"Enabled\"; the operator rewrites them on its next reconcile, or they were changed by hand"]
    );
    assert_eq!(
        mismatch("v3.33.0", Some("Felix"), "Disabled", "Enabled"),
        vec!["Installation default: clusterRoutingMode Felix means programClusterRoutes FelixConfiguration default Enabled and BGPConfiguration default Disabled, but FelixConfiguration default has \"Disabled\" and BGPConfiguration default has \"Enabled\"; the operator rewrites them on its next reconcile, or they were changed by hand"]
    );
    // 3.31 has no BGPConfiguration field: only Felix's is compared.
    assert_eq!(mismatch("v3.31.7", Some("Felix"), "Enabled", "EnabledNoEncapOnly").iter().filter(|m| m.starts_with("Installation")).count(), 0);
    // 3.30: nothing for the operator to write.
    assert_eq!(
        mismatch("v3.30.2", Some("Felix"), "Enabled", "Disabled").into_iter().filter(|m| m.starts_with("Installation")).collect::<Vec<_>>(),
        vec!["Installation default: clusterRoutingMode \"Felix\" is set but ignored by this release: Calico 3.30 has no programClusterRoutes fields for the operator to write"]
    );
}
