//! Oracle: for the five confd scenarios in `../shared/calico-testdata/confd/` (Calico
//! master = the 3.33 line), *evaluate* both the golden `calico_kernel_programming` filter
//! and our rendered filter for every pool CIDR (first matching `if (net ~ X)` line, else
//! the final statement) and require the same verdict. Role `felix`: routewarden stands in
//! for Felix, so BIRD's classes are exactly what BGPConfiguration gives BIRD, as for
//! confd. (With role `bird`, BIRD exports no pool at all, tested separately.)

use std::path::PathBuf;

use super::*;
use crate::datastore::FileDatastore;
use crate::model::Cluster;
use crate::ownership::{decide, wireguard_peers, CalicoVersion, ClusterRoutes, OwnershipConfig};

const SCENARIOS: [&str; 5] =
    ["cluster_routes/default", "cluster_routes/enabled", "cluster_routes/ipip-only", "cluster_routes/noencap-only", "felix_cluster_routing"];

fn testdata() -> PathBuf {
    let p = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/calico-testdata/confd"));
    assert!(p.is_dir(), "confd golden data missing at {}", p.display());
    p
}

/// A kernel filter as evaluated by BIRD for pool routes: per-CIDR rules, then the default.
struct Evaluated {
    rules: Vec<(IpNet, KernelFilter)>,
    default: Option<KernelFilter>,
}

fn verdict_of(stmt: &str) -> Option<KernelFilter> {
    if stmt.contains("reject;") {
        Some(KernelFilter::Reject)
    } else if stmt.contains("accept;") {
        Some(KernelFilter::Accept)
    } else {
        None
    }
}

/// Parse `filter <name> { ... }` out of BIRD config text (comments stripped).
fn parse_filter(text: &str, name: &str) -> Evaluated {
    let start = text.find(&format!("filter {name} {{")).unwrap_or_else(|| panic!("filter {name} present"));
    let mut out = Evaluated { rules: Vec::new(), default: None };
    let mut depth = 0i32;
    for raw in text[start..].lines() {
        let line = raw.split('#').next().unwrap_or("");
        let t = line.trim();
        if depth == 1 {
            if let Some(rest) = t.strip_prefix("if (net ~ ") {
                let (cidr, tail) = rest.split_once(')').expect("closing paren");
                let v = verdict_of(tail).unwrap_or_else(|| panic!("no verdict in {raw:?}"));
                out.rules.push((cidr.trim().parse().expect("CIDR"), v));
            } else if let Some(v) = verdict_of(t).filter(|_| !t.starts_with("if")) {
                out.default = Some(v);
            }
        }
        depth += i32::try_from(line.matches('{').count()).unwrap();
        depth -= i32::try_from(line.matches('}').count()).unwrap();
        if depth == 0 && line.contains('}') {
            break;
        }
    }
    out
}

impl Evaluated {
    fn eval(&self, net: IpNet) -> KernelFilter {
        self.rules.iter().find(|(c, _)| c.contains(&net)).map(|(_, v)| *v).or(self.default).expect("filter ends with a default statement")
    }
}

fn decision_for(dir: &std::path::Path, role: Role) -> OwnershipDecision {
    let snap = FileDatastore::load(dir.join("input.yaml")).expect("input.yaml loads");
    let config = OwnershipConfig { role, version: CalicoVersion::V3_33.into(), node: None };
    decide(&snap.cluster, &config)
}

#[test]
fn kernel_filter_matches_confd_golden_with_role_felix() {
    let base = testdata();
    for sc in SCENARIOS {
        let dir = base.join(sc);
        let d = decision_for(&dir, Role::Felix);
        assert!(!d.pools.is_empty(), "{sc}: pools loaded");
        let ours = render(&d, &BirdFilterOptions::default());
        for (golden_file, ours_name, v6) in [("bird_ipam.cfg", KERNEL_FILTER_V4, false), ("bird6_ipam.cfg", KERNEL_FILTER_V6, true)] {
            let golden_text = std::fs::read_to_string(dir.join(golden_file)).expect("golden file");
            let golden = parse_filter(&golden_text, "calico_kernel_programming");
            let mine = parse_filter(&ours, ours_name);
            assert_eq!(mine.default, Some(KernelFilter::Accept), "{sc}: final accept for non-pool routes");
            let pools: Vec<_> = d.pools.iter().filter(|p| matches!(p.cidr, IpNet::V6(_)) == v6).collect();
            assert!(!pools.is_empty(), "{sc} {golden_file}: has pools");
            for p in pools {
                assert_eq!(mine.eval(p.cidr), golden.eval(p.cidr), "{sc} {golden_file}: pool {} {}", p.pool, p.cidr);
                // Every pool gets an explicit line in ours (confd's v6 template omits accepts).
                assert!(mine.rules.iter().any(|(c, _)| *c == p.cidr), "{sc}: explicit line for {}", p.cidr);
            }
            // Every CIDR confd names is a pool we know.
            for (c, _) in &golden.rules {
                assert!(d.pools.iter().any(|p| p.cidr == *c), "{sc} {golden_file}: golden CIDR {c} is a pool");
            }
            // iBGP tunnel-device reject: confd adds tunl0 exactly when BIRD does not own IPIP.
            let golden_tunl0 = golden_text.contains("(ifname ~ \"tunl0\")");
            let export = &ours[ours.find(&format!("function {EXPORT_FUNCTION}()")).expect("function")..];
            assert_eq!(export.contains("(ifname ~ \"tunl0\")"), golden_tunl0, "{sc} {golden_file}: tunl0 reject");
            assert_eq!(rejects_tunnel_device(&d), golden_tunl0, "{sc}: rejects_tunnel_device");
        }
    }
}

#[test]
fn role_bird_rejects_every_pool_and_tunnel_routes() {
    let dir = testdata().join("cluster_routes/enabled");
    let d = decision_for(&dir, Role::Bird);
    let ours = render(&d, &BirdFilterOptions::default());
    for (name, v6) in [(KERNEL_FILTER_V4, false), (KERNEL_FILTER_V6, true)] {
        let f = parse_filter(&ours, name);
        for p in d.pools.iter().filter(|p| matches!(p.cidr, IpNet::V6(_)) == v6) {
            assert_eq!(f.eval(p.cidr), KernelFilter::Reject, "{} under role bird", p.cidr);
        }
        assert_eq!(f.default, Some(KernelFilter::Accept));
    }
    assert!(rejects_tunnel_device(&d));
    assert!(ours.contains("Role bird"));
}

#[test]
fn export_rejects_routewarden_protocol_and_felix_protocol_when_felix_programs() {
    let dir = testdata().join("cluster_routes/default");
    // Role felix: Felix programs nothing but VXLAN, so only routewarden's protocol.
    let d = decision_for(&dir, Role::Felix);
    let opts = BirdFilterOptions { route_protocol: 90, ..BirdFilterOptions::default() };
    assert_eq!(rejected_protocols(&d, &opts), BTreeSet::from([90]));
    let ours = render(&d, &opts);
    assert!(ours.contains("if (krt_source = 90) then { reject; }"), "{ours}");
    assert!(!ours.contains("krt_source = 80"));
    // routewarden as a third writer: Felix keeps its classes (default EnabledIPIPOnly),
    // so Felix's protocol 80 is rejected too.
    let third = decision_for(&dir, Role::Explicit(ClusterRoutes::Disabled));
    assert!(third.writers_of(PoolClass::Ipip).contains(&Writer::Felix));
    assert_eq!(rejected_protocols(&third, &opts), BTreeSet::from([80, 90]));
    let ours = render(&third, &opts);
    assert!(ours.contains("if (krt_source = 80) then { reject; } # programmed by Felix"), "{ours}");
    // The guard: krt_source is read only for kernel-learned routes.
    let func = &ours[ours.find("function ").unwrap()..];
    let pos = |needle: &str| func.find(needle).unwrap_or_else(|| panic!("{needle} in function"));
    assert!(pos("source = RTS_INHERIT") < pos("defined(krt_source)"));
    assert!(pos("defined(krt_source)") < pos("krt_source = 80"));
}

#[test]
fn header_names_the_decision_and_include() {
    let d = decision_for(&testdata().join("cluster_routes/noencap-only"), Role::Felix);
    let ours = render(&d, &BirdFilterOptions::default());
    assert!(ours.contains("routewarden role felix"));
    assert!(ours.contains(&format!("BIRD field:  {}", d.bird.value)));
    assert!(ours.contains(&format!("Felix field: {}", d.felix.value)));
    assert!(ours.contains("route protocol: 80"));
    assert!(ours.contains("include \"/etc/bird/routewarden.conf\";"));
    assert!(ours.contains("krt_metric = 1024;"));
}

/// One node of confd's `processWireguardPeerFilter` tests: `(name, BGP v4, BGP v6, WG v4,
/// WG v6)`.
type WgNode<'a> = (&'a str, Option<&'a str>, Option<&'a str>, Option<&'a str>, Option<&'a str>);

fn wg_cluster(nodes: &[WgNode<'_>]) -> Cluster {
    let docs: Vec<serde_yaml_ng::Value> = nodes
        .iter()
        .map(|(name, b4, b6, w4, w6)| {
            let mut bgp = serde_yaml_ng::Mapping::new();
            if let Some(a) = b4 {
                bgp.insert("ipv4Address".into(), format!("{a}/24").into());
            }
            if let Some(a) = b6 {
                bgp.insert("ipv6Address".into(), format!("{a}/64").into());
            }
            let mut wg = serde_yaml_ng::Mapping::new();
            if let Some(a) = w4 {
                wg.insert("interfaceIPv4Address".into(), (*a).into());
            }
            if let Some(a) = w6 {
                wg.insert("interfaceIPv6Address".into(), (*a).into());
            }
            serde_yaml_ng::from_str(&format!(
                "{{apiVersion: projectcalico.org/v3, kind: Node, metadata: {{name: {name}}}, spec: {{bgp: {}, wireguard: {}}}}}",
                serde_json::to_string(&bgp).unwrap(),
                serde_json::to_string(&wg).unwrap()
            ))
            .unwrap()
        })
        .collect();
    let (cluster, errors) = Cluster::from_values(&docs);
    assert!(errors.is_empty(), "{errors:?}");
    cluster
}

/// The statements of one family's kernel filter that test `bgp_next_hop`, without our
/// trailing comment (confd's comment differs; the statement is what BIRD runs).
fn wg_rejects(cluster: &Cluster, v6: bool) -> Vec<String> {
    let opts = BirdFilterOptions { wireguard_peers: wireguard_peers(cluster, "local-node"), ..BirdFilterOptions::default() };
    let d = crate::ownership::decide(cluster, &OwnershipConfig::default());
    let text = render(&d, &opts);
    let name = if v6 { KERNEL_FILTER_V6 } else { KERNEL_FILTER_V4 };
    let body = &text[text.find(&format!("filter {name} {{")).unwrap()..];
    let body = &body[..body.find("\n}").unwrap()];
    body.lines().filter(|l| l.contains("bgp_next_hop")).map(|l| l[..=l.find("} #").unwrap()].to_owned()).collect()
}

/// Golden: confd's own tests of `processWireguardPeerFilter`
/// (`confd/pkg/backends/calico/bgp_processor_test.go`, `Test_processWireguardPeerFilterV4`,
/// `..V6`, `.._NoWireguard`, `.._AllWireguard`, `.._LocalNoWireguard`): the same nodes give
/// the same reject statements, in confd's (sorted) order, each in its own family's filter.
#[test]
fn wireguard_peer_rejects_match_confd() {
    let reject = |a: &str| format!("  if (defined(bgp_next_hop) && bgp_next_hop = {a}) then {{ reject; }}");
    // V4: one remote with WireGuard, one without.
    let c = wg_cluster(&[
        ("local-node", Some("10.0.0.1"), None, Some("192.168.1.1"), None),
        ("remote-wg", Some("10.0.0.2"), None, Some("192.168.1.2"), None),
        ("remote-nowg", Some("10.0.0.3"), None, None, None),
    ]);
    assert_eq!(wg_rejects(&c, false), [reject("10.0.0.2")]);
    assert_eq!(wg_rejects(&c, true), Vec::<String>::new());
    assert_eq!(wireguard_peers(&c, "local-node"), [("remote-wg".to_owned(), "10.0.0.2".parse().unwrap())]);
    // V6.
    let c = wg_cluster(&[
        ("local-node", None, Some("fd00::1"), None, Some("fd00:1::1")),
        ("remote-wg", None, Some("fd00::2"), None, Some("fd00:1::2")),
        ("remote-nowg", None, Some("fd00::3"), None, None),
    ]);
    assert_eq!(wg_rejects(&c, true), [reject("fd00::2")]);
    assert_eq!(wg_rejects(&c, false), Vec::<String>::new());
    // No WireGuard anywhere.
    let c = wg_cluster(&[
        ("local-node", Some("10.0.0.1"), None, None, None),
        ("remote-a", Some("10.0.0.2"), None, None, None),
        ("remote-b", Some("10.0.0.3"), None, None, None),
    ]);
    assert_eq!(wg_rejects(&c, false), Vec::<String>::new());
    // Everyone: one line per remote, sorted (as text: 10.0.0.10 before 10.0.0.2).
    let c = wg_cluster(&[
        ("local-node", Some("10.0.0.1"), None, Some("192.168.1.1"), None),
        ("remote-a", Some("10.0.0.2"), None, Some("192.168.1.2"), None),
        ("remote-b", Some("10.0.0.3"), None, Some("192.168.1.3"), None),
        ("remote-c", Some("10.0.0.10"), None, Some("192.168.1.10"), None),
    ]);
    assert_eq!(wg_rejects(&c, false), [reject("10.0.0.10"), reject("10.0.0.2"), reject("10.0.0.3")]);
    // The local node without WireGuard routes to WireGuard peers over BGP: nothing rejected.
    let c = wg_cluster(&[("local-node", Some("10.0.0.1"), None, None, None), ("remote-wg", Some("10.0.0.2"), None, Some("192.168.1.2"), None)]);
    assert_eq!(wg_rejects(&c, false), Vec::<String>::new());
    // A WireGuard peer without a BGP address has nothing to reject.
    let c = wg_cluster(&[("local-node", Some("10.0.0.1"), None, Some("192.168.1.1"), None), ("remote-wg", None, None, Some("192.168.1.2"), None)]);
    assert_eq!(wg_rejects(&c, false), Vec::<String>::new());
}
