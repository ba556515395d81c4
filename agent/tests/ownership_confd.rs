//! Oracle test: the engine's BIRD side against confd's own golden output.
//!
//! For each of the five real confd scenarios in `../shared/calico-testdata/confd/` (Calico
//! master, i.e. the 3.33 release line), the test loads `input.yaml` with the model, runs the
//! engine, then *evaluates* the `calico_kernel_programming` filter of the golden
//! `bird_ipam.cfg` / `bird6_ipam.cfg` for every pool CIDR: the first `if (net ~ X)` line
//! matching the pool decides, else the filter's final statement. `accept` means BIRD programs
//! the pool's cluster routes; `reject` ("... handled by Felix.") means it does not.

use std::path::PathBuf;

use ipnet::IpNet;
use routewarden::model::Cluster;
use routewarden::ownership::{decide, CalicoVersion, KernelFilter, OwnershipConfig, Role};
use routewarden::vocabulary::PoolKind;
use routewarden::vocabulary::{PoolClass, Writer};

fn testdata() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/calico-testdata/confd"))
}

/// One `if (net ~ CIDR) then { ... }` line of the kernel filter.
#[derive(Debug)]
struct Rule {
    cidr: IpNet,
    verdict: KernelFilter,
    body: String,
}

/// The kernel filter: its per-CIDR rules in order and the final default verdict.
#[derive(Debug)]
struct KernelProgrammingFilter {
    rules: Vec<Rule>,
    default: KernelFilter,
}

impl KernelProgrammingFilter {
    fn parse(text: &str) -> KernelProgrammingFilter {
        let start = text.find("filter calico_kernel_programming {").expect("kernel filter present");
        let body = &text[start..];
        let mut rules = Vec::new();
        let mut default = None;
        let mut depth = 0i32;
        for line in body.lines() {
            let trimmed = line.trim();
            if depth == 1 {
                if let Some(rest) = trimmed.strip_prefix("if (net ~ ") {
                    let (cidr, tail) = rest.split_once(')').expect("closing paren");
                    let verdict = verdict_of(tail);
                    rules.push(Rule { cidr: cidr.parse().expect("CIDR in filter"), verdict, body: tail.to_owned() });
                } else if trimmed == "accept;" {
                    default = Some(KernelFilter::Accept);
                } else if trimmed == "reject;" {
                    default = Some(KernelFilter::Reject);
                }
            }
            depth += i32::try_from(line.matches('{').count()).unwrap();
            depth -= i32::try_from(line.matches('}').count()).unwrap();
            if depth == 0 && line.contains('}') {
                break;
            }
        }
        KernelProgrammingFilter { rules, default: default.expect("final verdict in kernel filter") }
    }

    /// What the filter does with a route inside `cidr`.
    fn verdict(&self, cidr: IpNet) -> KernelFilter {
        self.rules.iter().find(|r| r.cidr.contains(&cidr)).map_or(self.default, |r| r.verdict)
    }

    fn rule(&self, cidr: IpNet) -> Option<&Rule> {
        self.rules.iter().find(|r| r.cidr == cidr)
    }
}

fn verdict_of(tail: &str) -> KernelFilter {
    match (tail.contains("accept;"), tail.contains("reject;")) {
        (true, false) => KernelFilter::Accept,
        (false, true) => {
            assert!(tail.contains("handled by Felix"), "reject without Felix comment: {tail}");
            KernelFilter::Reject
        }
        _ => panic!("ambiguous filter line: {tail}"),
    }
}

fn check_scenario(dir: &str, expect_bgp_field: Option<&str>) {
    let base = testdata().join(dir);
    let input = std::fs::read_to_string(base.join("input.yaml")).expect("input.yaml");
    let v4 = KernelProgrammingFilter::parse(&std::fs::read_to_string(base.join("bird_ipam.cfg")).expect("bird_ipam.cfg"));
    let v6 = KernelProgrammingFilter::parse(&std::fs::read_to_string(base.join("bird6_ipam.cfg")).expect("bird6_ipam.cfg"));
    let (cluster, errors) = Cluster::from_yaml_str(&input).expect("input parses");
    assert_eq!(errors, vec![], "{dir}");
    assert_eq!(cluster.bgp_default().and_then(|b| b.program_cluster_routes.as_deref()), expect_bgp_field, "{dir}: scenario input");
    assert_eq!(cluster.ip_pools.len(), 5, "{dir}");

    let audit = decide(&cluster, &OwnershipConfig { role: Role::Audit, version: CalicoVersion::V3_33.into(), node: None });
    let bird_role = decide(&cluster, &OwnershipConfig { role: Role::Bird, version: CalicoVersion::V3_33.into(), node: None });
    let mut checked = (0, 0);
    for row in &audit.pools {
        let filter = if row.cidr.addr().is_ipv4() { &v4 } else { &v6 };
        let golden = filter.verdict(row.cidr);
        let ctx = format!("{dir}: pool {} {}", row.pool, row.cidr);
        assert_eq!(row.bird_kernel_filter, golden, "{ctx}: kernel filter verdict");
        // Audit: BIRD is a writer of the pool exactly when confd accepts it.
        assert_eq!(row.writers.contains(&Writer::Bird), golden == KernelFilter::Accept, "{ctx}: audit writers");
        // BIRD role: routewarden programs the pool's class exactly when confd accepts it.
        let class = row.class.expect("no LB-only pools in confd input");
        assert_eq!(bird_role.programs(class), golden == KernelFilter::Accept, "{ctx}: bird role");
        // IPIP accepts carry the tunnel; CrossSubnet carries the local-subnet condition.
        if let (Some(rule), KernelFilter::Accept) = (filter.rule(row.cidr), golden) {
            match row.kind {
                PoolKind::IpipAlways => assert!(rule.body.contains("krt_tunnel=\"tunl0\"") && !rule.body.contains("bgp_next_hop"), "{ctx}"),
                PoolKind::IpipCrossSubnet => {
                    let subnet: IpNet = rule
                        .body
                        .split("bgp_next_hop ~ ")
                        .nth(1)
                        .and_then(|s| s.split(')').next())
                        .and_then(|s| s.parse().ok())
                        .expect("CrossSubnet condition");
                    assert!(cluster.nodes.values().any(|n| n.subnet(false) == Some(subnet)), "{ctx}: subnet {subnet}");
                }
                _ => assert!(!rule.body.contains("krt_tunnel"), "{ctx}"),
            }
        }
        if row.cidr.addr().is_ipv4() {
            checked.0 += 1;
        } else {
            checked.1 += 1;
        }
    }
    assert_eq!(checked, (3, 2), "{dir}: every v4 and v6 pool checked");
}

#[test]
fn confd_default_bgp_field_unset() {
    check_scenario("cluster_routes/default", None);
}

#[test]
fn confd_enabled() {
    check_scenario("cluster_routes/enabled", Some("Enabled"));
}

#[test]
fn confd_ipip_only() {
    check_scenario("cluster_routes/ipip-only", Some("EnabledIPIPOnly"));
}

#[test]
fn confd_noencap_only() {
    check_scenario("cluster_routes/noencap-only", Some("EnabledNoEncapOnly"));
}

#[test]
fn confd_felix_cluster_routing_disabled() {
    check_scenario("felix_cluster_routing", Some("Disabled"));
}

/// The README's reading of the Felix side: the complement under the default
/// FelixConfiguration (EnabledIPIPOnly). In the default scenario that is consistent; in
/// `enabled` IPIP is double-programmed; in `felix_cluster_routing` no-encap is unowned.
#[test]
fn confd_scenarios_felix_side_findings() {
    let cases = [
        ("cluster_routes/default", "consistent", "consistent"),
        ("cluster_routes/enabled", "double-programmed", "consistent"),
        ("cluster_routes/ipip-only", "double-programmed", "unowned"),
        ("cluster_routes/noencap-only", "consistent", "consistent"),
        ("felix_cluster_routing", "consistent", "unowned"),
    ];
    for (dir, ipip, noencap) in cases {
        let input = std::fs::read_to_string(testdata().join(dir).join("input.yaml")).unwrap();
        let (cluster, _) = Cluster::from_yaml_str(&input).unwrap();
        let d = decide(&cluster, &OwnershipConfig { role: Role::Audit, ..Default::default() });
        let code = |c: PoolClass| d.findings.iter().find(|f| f.class == Some(c) && f.code() != "deprecated").map(routewarden::ownership::Finding::code);
        assert_eq!((code(PoolClass::Ipip), code(PoolClass::NoEncap)), (Some(ipip), Some(noencap)), "{dir}");
    }
}
