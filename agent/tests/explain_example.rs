//! `explain` over the shipped example cluster (examples/cluster/: calicoctl v3 objects, a
//! kubectl core-Node List and a kubectl crd.projectcalico.org/v1 List).

use routewarden::datastore::FileDatastore;
use routewarden::explain::{explain, ip_route_line, ExplainOptions, OutputFormat};
use routewarden::ownership::{OwnershipConfig, Role};
use routewarden::routes::RouteDevices;

fn example() -> routewarden::datastore::Snapshot {
    FileDatastore::load(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/cluster")).expect("example loads")
}

/// The lines of the table-format section titled `title`, up to the blank line that ends it.
fn section<'a>(text: &'a str, title: &str) -> Vec<&'a str> {
    text.lines().skip_while(|l| *l != title).skip(1).take_while(|l| !l.is_empty()).collect()
}

fn opts(node: Option<&str>, format: OutputFormat) -> ExplainOptions {
    ExplainOptions { node: node.map(Into::into), format, route_protocol: 80, metric: None, devices: RouteDevices::default() }
}

#[test]
fn example_loads_cleanly_in_both_forms() {
    let s = example();
    assert_eq!(s.object_errors, vec![]);
    assert_eq!(s.inputs, 3);
    assert_eq!(s.cluster.ip_pools.len(), 6);
    assert_eq!(s.cluster.nodes.keys().collect::<Vec<_>>(), vec!["node-a", "node-b", "node-c", "node-d"]);
    assert_eq!(s.cluster.ipam_blocks.len(), 11);
    assert_eq!(s.cluster.block_affinities.len(), 11);
}

#[test]
fn felix_role_on_node_a() {
    let s = example();
    let e = explain(&s.cluster, &s.object_errors, &OwnershipConfig::default(), &opts(Some("node-a"), OutputFormat::Table)).unwrap();
    print!("{}", e.text);
    assert!(!e.has_errors);
    let routes: Vec<&str> = e
        .text
        .lines()
        .skip_while(|l| !l.starts_with("Routes routewarden programs on node-a (classes: ipip)"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .collect();
    assert_eq!(
        routes,
        vec![
            "blackhole 10.244.10.0/26 proto 80",
            "10.244.20.0/26 via 10.0.0.12 dev eth0 proto 80 onlink",
            "10.244.20.5 via 10.0.0.13 dev eth0 proto 80 onlink",
            "10.244.30.0/26 via 10.0.0.13 dev eth0 proto 80 onlink",
            "10.244.40.0/26 via 10.0.1.14 dev tunl0 proto 80 onlink",
            "10.245.20.0/26 via 10.0.0.12 dev tunl0 proto 80 onlink",
            "10.245.40.0/26 via 10.0.1.14 dev tunl0 proto 80 onlink",
        ]
    );
    // `--calico-version auto` (the default) reads the release from ClusterInformation default.
    assert_eq!(e.text.lines().next(), Some("role felix, Calico 3.33 (ClusterInformation default: v3.33.0), node node-a"), "{}", e.text);
    assert_eq!(
        section(&e.text, "Decisions"),
        [
            "  COMPONENT  VALUE               SOURCE",
            "  felix      EnabledIPIPOnly     FelixConfiguration default: programClusterRoutes: EnabledIPIPOnly",
            "  bird       EnabledNoEncapOnly  BGPConfiguration default: programClusterRoutes: EnabledNoEncapOnly",
        ]
    );
    // Role felix: routewarden takes Felix's IPIP share; no-encap stays BIRD's, VXLAN Felix's.
    assert_eq!(
        section(&e.text, "IP pools"),
        [
            "  POOL                 CIDR              KIND                CLASS    PROGRAMMED BY  BIRD KERNEL FILTER",
            "  default-ipv4-ippool  10.244.0.0/16     ipip-cross-subnet   ipip     routewarden    reject",
            "  flat                 10.246.0.0/16     no-encap            noencap  bird           accept",
            "  flat-ipv6            fd00:10:244::/48  no-encap-v6         noencap  bird           accept",
            "  ipip-always          10.245.0.0/16     ipip-always         ipip     routewarden    reject",
            "  loadbalancers        10.96.100.0/24    load-balancer-only  -        nobody         accept",
            "  vxlan                10.247.0.0/16     vxlan               vxlan    felix          reject",
        ]
    );
    assert_eq!(
        section(&e.text, "Findings"),
        [
            "  ok  consistent  ipip     routewarden alone programs the IPIP cluster routes of pools default-ipv4-ippool, ipip-always",
            "  ok  consistent  noencap  bird alone programs the no-encap cluster routes of pools flat, flat-ipv6",
            "  ok  consistent  vxlan    felix alone programs the VXLAN cluster routes of pools vxlan",
        ]
    );
}

#[test]
fn explicit_enabled_is_an_error_and_json_is_structured() {
    let s = example();
    let cfg = OwnershipConfig { role: "explicit:Enabled".parse::<Role>().unwrap(), ..Default::default() };
    let e = explain(&s.cluster, &s.object_errors, &cfg, &opts(Some("node-b"), OutputFormat::Json)).unwrap();
    assert!(e.has_errors);
    let v: serde_json::Value = serde_json::from_str(&e.text).unwrap();
    assert_eq!(v["role"], "explicit:Enabled");
    assert_eq!(v["calico_version"], "3.33");
    assert_eq!(v["calico_rules"], "3.33");
    assert_eq!(v["calico_version_source"], serde_json::json!({"source": "cluster-information", "value": "v3.33.0"}));
    assert_eq!(v["has_errors"], true);
    let codes: Vec<(String, String)> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["code"].as_str().unwrap().to_owned(), f["class"].as_str().unwrap_or("none").to_owned()))
        .collect();
    assert_eq!(
        codes,
        vec![
            ("double-programmed".into(), "ipip".into()),
            ("double-programmed".into(), "no-encap".into()),
            ("consistent".into(), "vxlan".into()),
        ]
    );
    assert_eq!(v["programmed_classes"], serde_json::json!(["ipip", "no-encap"]));
    // node-b, both classes: its own blocks are blackholes; node-c's borrowed 10.244.20.5 of
    // node-b's block gets a /32; CrossSubnet natively to node-a/node-c (10.0.0.0/24), through
    // the tunnel to node-d (10.0.1.0/24); no-encap (v4 and v6) always on eth0; no VXLAN.
    let routes: Vec<(&str, &str)> =
        v["routes"].as_array().unwrap().iter().map(|r| (r["ip_route"].as_str().unwrap(), r["class"].as_str().unwrap())).collect();
    assert_eq!(
        routes,
        [
            ("10.244.10.0/26 via 10.0.0.11 dev eth0 proto 80 onlink", "ipip"),
            ("blackhole 10.244.20.0/26 proto 80", "ipip"),
            ("10.244.20.5 via 10.0.0.13 dev eth0 proto 80 onlink", "ipip"),
            ("10.244.30.0/26 via 10.0.0.13 dev eth0 proto 80 onlink", "ipip"),
            ("10.244.40.0/26 via 10.0.1.14 dev tunl0 proto 80 onlink", "ipip"),
            ("blackhole 10.245.20.0/26 proto 80", "ipip"),
            ("10.245.40.0/26 via 10.0.1.14 dev tunl0 proto 80 onlink", "ipip"),
            ("10.246.10.0/26 via 10.0.0.11 dev eth0 proto 80 onlink", "no-encap"),
            ("10.246.30.0/26 via 10.0.0.13 dev eth0 proto 80 onlink", "no-encap"),
            ("fd00:10:244:0:10::/122 via fd00:10::11 dev eth0 proto 80 onlink", "no-encap"),
            ("blackhole fd00:10:244:0:20::/122 proto 80", "no-encap"),
        ]
    );
}

#[test]
fn audit_yaml_shows_every_class_and_no_errors() {
    let s = example();
    let cfg = OwnershipConfig { role: Role::Audit, ..Default::default() };
    let e = explain(&s.cluster, &s.object_errors, &cfg, &opts(Some("node-d"), OutputFormat::Yaml)).unwrap();
    assert!(!e.has_errors);
    let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&e.text).unwrap();
    assert_eq!(v["felix"]["value"].as_str(), Some("EnabledIPIPOnly"));
    assert_eq!(v["bird"]["source"]["source"].as_str(), Some("field"));
    // Audit mode expects every routable class (IPIP and no-encap), whoever programs it; node-d
    // is in the other subnet, so CrossSubnet goes through the tunnel to every node; it has no
    // IPv6 address, so no IPv6 route.
    let routes: Vec<(&str, &str)> = v["routes"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|r| (r["ip_route"].as_str().unwrap(), r["class"].as_str().unwrap()))
        .collect();
    assert_eq!(
        routes,
        [
            ("10.244.10.0/26 via 10.0.0.11 dev tunl0 proto 80 onlink", "ipip"),
            ("10.244.20.0/26 via 10.0.0.12 dev tunl0 proto 80 onlink", "ipip"),
            ("10.244.20.5 via 10.0.0.13 dev tunl0 proto 80 onlink", "ipip"),
            ("10.244.30.0/26 via 10.0.0.13 dev tunl0 proto 80 onlink", "ipip"),
            ("blackhole 10.244.40.0/26 proto 80", "ipip"),
            ("10.245.20.0/26 via 10.0.0.12 dev tunl0 proto 80 onlink", "ipip"),
            ("blackhole 10.245.40.0/26 proto 80", "ipip"),
            ("10.246.10.0/26 via 10.0.0.11 dev eth0 proto 80 onlink", "no-encap"),
            ("10.246.30.0/26 via 10.0.0.13 dev eth0 proto 80 onlink", "no-encap"),
        ]
    );
    // node-d has no IPv6 address: Felix's IPv6 manager has no parent device there, so no
    // native IPv6 route (only blackholes, and node-d has no IPv6 block).
    let problems: Vec<(&str, &str)> = v["route_problems"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|p| (p["code"].as_str().unwrap(), p["message"].as_str().unwrap()))
        .collect();
    assert_eq!(
        problems,
        [(
            "local-node-without-address",
            "this node \"node-d\" has no IPv6 address with a prefix length, InternalIP or ExternalIP, so (as in Felix) no native IPv6 route is computed"
        )]
    );
}

#[test]
fn ip_route_metric_and_protocol_names() {
    let s = example();
    let d = routewarden::routes::desired_routes(&s.cluster, "node-c", &routewarden::routes::routable_classes(), &RouteDevices::default());
    let lines: Vec<String> = d.routes.iter().map(|r| ip_route_line(r, 12, Some(1024))).collect();
    // node-c: its own blocks blackholed, the IP it borrowed from node-b's block (10.244.20.5)
    // not routed (its workload route is the CNI's), protocol 12 by its name.
    assert_eq!(
        lines,
        [
            "10.244.10.0/26 via 10.0.0.11 dev eth0 proto bird metric 1024 onlink",
            "10.244.20.0/26 via 10.0.0.12 dev eth0 proto bird metric 1024 onlink",
            "blackhole 10.244.30.0/26 proto bird metric 1024",
            "10.244.40.0/26 via 10.0.1.14 dev tunl0 proto bird metric 1024 onlink",
            "10.245.20.0/26 via 10.0.0.12 dev tunl0 proto bird metric 1024 onlink",
            "10.245.40.0/26 via 10.0.1.14 dev tunl0 proto bird metric 1024 onlink",
            "10.246.10.0/26 via 10.0.0.11 dev eth0 proto bird metric 1024 onlink",
            "blackhole 10.246.30.0/26 proto bird metric 1024",
            "fd00:10:244:0:10::/122 via fd00:10::11 dev eth0 proto bird metric 1024 onlink",
            "fd00:10:244:0:20::/122 via fd00:10::12 dev eth0 proto bird metric 1024 onlink",
        ]
    );
}
