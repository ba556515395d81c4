//! `explain` over the shipped example cluster (examples/cluster/: calicoctl v3 objects, a
//! kubectl core-Node List and a kubectl crd.projectcalico.org/v1 List).

use routewarden::datastore::FileDatastore;
use routewarden::explain::{explain, explain_all_nodes, ip_route_line, ExplainOptions, OutputFormat};
use routewarden::ownership::{OwnershipConfig, Role, VersionChoice};
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
    assert_eq!(s.cluster.nodes.keys().map(|k| &**k).collect::<Vec<_>>(), vec!["node-a", "node-b", "node-c", "node-d"]);
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
    let codes: Vec<(String, String)> =
        v["findings"].as_array().unwrap().iter().map(|f| (f["code"].as_str().unwrap().to_owned(), f["class"].as_str().unwrap_or("none").to_owned())).collect();
    assert_eq!(
        codes,
        vec![("double-programmed".into(), "ipip".into()), ("double-programmed".into(), "no-encap".into()), ("consistent".into(), "vxlan".into()),]
    );
    assert_eq!(v["programmed_classes"], serde_json::json!(["ipip", "no-encap"]));
    // node-b, both classes: its own blocks are blackholes; node-c's borrowed 10.244.20.5 of
    // node-b's block gets a /32; CrossSubnet natively to node-a/node-c (10.0.0.0/24), through
    // the tunnel to node-d (10.0.1.0/24); no-encap (v4 and v6) always on eth0; no VXLAN.
    let routes: Vec<(&str, &str)> = v["routes"].as_array().unwrap().iter().map(|r| (r["ip_route"].as_str().unwrap(), r["class"].as_str().unwrap())).collect();
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
    let routes: Vec<(&str, &str)> =
        v["routes"].as_sequence().unwrap().iter().map(|r| (r["ip_route"].as_str().unwrap(), r["class"].as_str().unwrap())).collect();
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
    let problems: Vec<(&str, &str)> =
        v["route_problems"].as_sequence().unwrap().iter().map(|p| (p["code"].as_str().unwrap(), p["message"].as_str().unwrap())).collect();
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

/// A copy of `examples/cluster` with `extra` YAML documents appended to calico.yaml.
fn example_dir_with(extra: &str) -> tempfile::TempDir {
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/cluster");
    let dir = tempfile::tempdir().unwrap();
    for f in ["calico.yaml", "ipam.yaml", "nodes.yaml"] {
        let mut text = std::fs::read_to_string(format!("{src}/{f}")).unwrap();
        if f == "calico.yaml" {
            text.push_str(extra);
        }
        std::fs::write(dir.path().join(f), text).unwrap();
    }
    dir
}

/// [`example_dir_with`], loaded.
fn example_with(extra: &str) -> routewarden::datastore::Snapshot {
    FileDatastore::load(example_dir_with(extra).path()).unwrap()
}

const NODE_C_ENABLED: &str =
    "---\napiVersion: projectcalico.org/v3\nkind: FelixConfiguration\nmetadata: {name: node.node-c}\nspec: {programClusterRoutes: Enabled}\n";

/// The example as shipped: every node takes FelixConfiguration default, the pair is
/// complementary everywhere, exit 0.
#[test]
fn all_nodes_consistent_on_the_example() {
    let s = example();
    let e = explain_all_nodes(&s.cluster, &s.object_errors, &OwnershipConfig::default(), OutputFormat::Table).unwrap();
    print!("{}", e.text);
    assert!(!e.has_errors);
    let lines: Vec<&str> = e.text.lines().collect();
    assert_eq!(lines[0], "role felix, Calico 3.33 (ClusterInformation default: v3.33.0), all nodes (4)");
    assert_eq!(lines[1], "bird: EnabledNoEncapOnly (BGPConfiguration default: programClusterRoutes: EnabledNoEncapOnly), the same on every node");
    assert_eq!(
        section(&e.text, "Nodes"),
        [
            "  NODE    FELIX            FELIX SOURCE                                                       BIRD                DOUBLE-PROGRAMMED  UNOWNED",
            "  node-a  EnabledIPIPOnly  FelixConfiguration default: programClusterRoutes: EnabledIPIPOnly  EnabledNoEncapOnly  -                  -",
            "  node-b  EnabledIPIPOnly  FelixConfiguration default: programClusterRoutes: EnabledIPIPOnly  EnabledNoEncapOnly  -                  -",
            "  node-c  EnabledIPIPOnly  FelixConfiguration default: programClusterRoutes: EnabledIPIPOnly  EnabledNoEncapOnly  -                  -",
            "  node-d  EnabledIPIPOnly  FelixConfiguration default: programClusterRoutes: EnabledIPIPOnly  EnabledNoEncapOnly  -                  -",
        ]
    );
    assert_eq!(section(&e.text, "Findings on every node"), ["  (none)"]);
    assert_eq!(lines.last(), Some(&"every node consistent (4 nodes)"));
}

/// One per-node override (`FelixConfiguration node.node-c` Enabled) makes the pair
/// inconsistent on node-c alone: no-encap programmed by BIRD and by Felix's side there, and
/// the exit status is 1. An override with a value Felix does not accept is a note on its
/// node; one naming no Node is reported.
#[test]
fn all_nodes_names_the_one_overridden_node() {
    let s = example_with(&format!(
        "{NODE_C_ENABLED}---\napiVersion: projectcalico.org/v3\nkind: FelixConfiguration\nmetadata: {{name: node.node-d}}\nspec: {{programClusterRoutes: Sometimes}}\n---\napiVersion: projectcalico.org/v3\nkind: FelixConfiguration\nmetadata: {{name: node.node-z}}\nspec: {{programClusterRoutes: Disabled}}\n"
    ));
    assert_eq!(s.object_errors, vec![]);
    let e = explain_all_nodes(&s.cluster, &s.object_errors, &OwnershipConfig::default(), OutputFormat::Table).unwrap();
    print!("{}", e.text);
    assert!(e.has_errors);
    let rows: Vec<Vec<&str>> = section(&e.text, "Nodes").iter().skip(1).map(|l| l.split("  ").map(str::trim).filter(|c| !c.is_empty()).collect()).collect();
    assert_eq!(
        rows,
        [
            vec!["node-a", "EnabledIPIPOnly", "FelixConfiguration default: programClusterRoutes: EnabledIPIPOnly", "EnabledNoEncapOnly", "-", "-"],
            vec!["node-b", "EnabledIPIPOnly", "FelixConfiguration default: programClusterRoutes: EnabledIPIPOnly", "EnabledNoEncapOnly", "-", "-"],
            vec!["node-c", "Enabled", "FelixConfiguration node.node-c: programClusterRoutes: Enabled", "EnabledNoEncapOnly", "noencap (bird+routewarden)", "-"],
            vec![
                "node-d",
                "EnabledIPIPOnly",
                "fallback: FelixConfiguration node.node-d: programClusterRoutes: \"Sometimes\" is not a value Felix 3.33 accepts; Felix uses its default EnabledIPIPOnly",
                "EnabledNoEncapOnly",
                "-",
                "-",
            ],
        ]
    );
    assert_eq!(
        section(&e.text, "Node notes"),
        ["  node-d: FelixConfiguration node.node-d: programClusterRoutes \"Sometimes\" is not a programClusterRoutes value of any Calico release (Felix 3.33); Felix uses its default EnabledIPIPOnly"]
    );
    assert_eq!(
        section(&e.text, "Findings on every node"),
        ["  warning  no-such-node  FelixConfiguration node.node-z names no Node in the cluster; it applies nowhere"]
    );
    assert_eq!(e.text.lines().last(), Some("1 of 4 nodes inconsistent: node-c"));
}

/// The same as JSON and YAML, and judged as audit (Felix against BIRD): the writers are the
/// components themselves. An unowned class shows on its node too.
#[test]
fn all_nodes_json_yaml_and_audit_role() {
    let s = example_with(&format!(
        "{NODE_C_ENABLED}---\napiVersion: projectcalico.org/v3\nkind: FelixConfiguration\nmetadata: {{name: node.node-b}}\nspec: {{programClusterRoutes: Disabled}}\n"
    ));
    let audit = OwnershipConfig { role: Role::Audit, version: VersionChoice::Auto, node: None };
    let e = explain_all_nodes(&s.cluster, &s.object_errors, &audit, OutputFormat::Json).unwrap();
    assert!(e.has_errors);
    let v: serde_json::Value = serde_json::from_str(&e.text).unwrap();
    assert_eq!(v["role"], "audit");
    assert_eq!(v["calico_version_source"], serde_json::json!({"source": "cluster-information", "value": "v3.33.0"}));
    assert_eq!(v["inconsistent_nodes"], serde_json::json!(["node-b", "node-c"]));
    let row = |n: usize| {
        (v["nodes"][n]["node"].clone(), v["nodes"][n]["double_programmed"].clone(), v["nodes"][n]["unowned"].clone(), v["nodes"][n]["consistent"].clone())
    };
    assert_eq!(row(0), (serde_json::json!("node-a"), serde_json::json!([]), serde_json::json!([]), serde_json::json!(true)));
    assert_eq!(row(1), (serde_json::json!("node-b"), serde_json::json!([]), serde_json::json!(["ipip"]), serde_json::json!(false)));
    assert_eq!(
        row(2),
        (
            serde_json::json!("node-c"),
            serde_json::json!([{"class": "no-encap", "writers": ["felix", "bird"]}]),
            serde_json::json!([]),
            serde_json::json!(false)
        )
    );
    assert_eq!(v["nodes"][2]["felix"]["source"], serde_json::json!({"source": "field", "object": "FelixConfiguration node.node-c", "value": "Enabled"}));
    assert_eq!(v["has_errors"], true);
    let y = explain_all_nodes(&s.cluster, &s.object_errors, &audit, OutputFormat::Yaml).unwrap();
    let yv: serde_json::Value = serde_yaml_ng::from_str(&y.text).unwrap();
    assert_eq!(yv, v);
}

/// The command: exit 1 with the override, 0 without; `--node` (here from its environment
/// variable, as in the DaemonSet's pod) is not in the way.
#[test]
fn all_nodes_command_exit_status() {
    let run = |dir: &std::path::Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_routewarden"))
            .args(["explain", "--all-nodes", "--datastore", &format!("file:{}", dir.display())])
            .env("ROUTEWARDEN_NODE", "node-a")
            .output()
            .unwrap()
    };
    let with_override = example_dir_with(NODE_C_ENABLED);
    let out = run(with_override.path());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout.lines().last(), Some("1 of 4 nodes inconsistent: node-c"), "{stdout}");
    let out = run(std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/cluster")));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout.lines().last(), Some("every node consistent (4 nodes)"), "{stdout}");
}

/// What `kubectl get daemonset -n calico-system calico-node -o yaml` and `kubectl get
/// installation default -o yaml` add to a dump: Felix's env outranks FelixConfiguration (as in
/// Felix's config loader) and `explain` says so; an operator's clusterRoutingMode that the
/// fields do not match is a finding.
const CALICO_NODE_AND_OPERATOR: &str = "---\napiVersion: v1\nkind: List\nitems:\n\
- apiVersion: apps/v1\n  kind: DaemonSet\n  metadata: {name: calico-node, namespace: calico-system}\n  spec:\n    template:\n      spec:\n        containers:\n        - name: calico-node\n          env:\n          - {name: DATASTORE_TYPE, value: kubernetes}\n          - {name: FELIX_PROGRAMCLUSTERROUTES, value: Enabled}\n\
- apiVersion: apps/v1\n  kind: DaemonSet\n  metadata: {name: kube-proxy, namespace: kube-system}\n  spec: {template: {spec: {containers: [{name: kube-proxy}]}}}\n\
- apiVersion: operator.tigera.io/v1\n  kind: Installation\n  metadata: {name: default}\n  spec: {variant: Calico, calicoNetwork: {clusterRoutingMode: Felix}}\n";

#[test]
fn calico_node_env_and_operator_from_a_dump() {
    let s = example_with(CALICO_NODE_AND_OPERATOR);
    assert_eq!(s.object_errors, vec![]);
    let e = explain(&s.cluster, &s.object_errors, &OwnershipConfig::default(), &opts(Some("node-a"), OutputFormat::Table)).unwrap();
    print!("{}", e.text);
    assert!(e.has_errors);
    assert_eq!(
        section(&e.text, "Decisions"),
        [
            "  COMPONENT  VALUE               SOURCE",
            "  felix      Enabled             calico-node env (calico-system/calico-node): FELIX_PROGRAMCLUSTERROUTES=Enabled, over FelixConfiguration default: EnabledIPIPOnly",
            "  bird       EnabledNoEncapOnly  BGPConfiguration default: programClusterRoutes: EnabledNoEncapOnly",
        ]
    );
    assert_eq!(
        section(&e.text, "Findings"),
        [
            "  ok       consistent         ipip     routewarden alone programs the IPIP cluster routes of pools default-ipv4-ippool, ipip-always",
            "  ERROR    double-programmed  noencap  bird and routewarden all program the no-encap cluster routes of pools flat, flat-ipv6 and fight over them: Felix field Enabled (env), BIRD field EnabledNoEncapOnly (field) (routewarden in Felix's place)",
            "  ok       consistent         vxlan    felix alone programs the VXLAN cluster routes of pools vxlan",
            "  warning  operator-mismatch  none     Installation default: clusterRoutingMode Felix means programClusterRoutes FelixConfiguration default Enabled and BGPConfiguration default Disabled, but FelixConfiguration default has \"EnabledIPIPOnly\" and BGPConfiguration default has \"EnabledNoEncapOnly\"; the operator rewrites them on its next reconcile, or they were changed by hand",
        ]
    );
    let json = explain(&s.cluster, &s.object_errors, &OwnershipConfig::default(), &opts(Some("node-a"), OutputFormat::Json)).unwrap();
    let v: serde_json::Value = serde_json::from_str(&json.text).unwrap();
    assert_eq!(
        v["felix"]["source"],
        serde_json::json!({"source": "env", "daemonset": "calico-system/calico-node", "name": "FELIX_PROGRAMCLUSTERROUTES", "value": "Enabled", "overrides": "FelixConfiguration default: EnabledIPIPOnly"})
    );
}

/// node-c's /27 written inside node-b's 10.244.20.0/26. `explain --node
/// node-a` and `explain --all-nodes` exit 1 with one `invalid-block` finding per block, each
/// naming the other; node-a's routes leave out the /26 (and node-c's borrowed IP in it).
#[test]
fn an_overlapping_block_is_an_invalid_block_finding_naming_both() {
    let s = example_with("---\napiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {name: 10-244-20-32-27}\nspec: {cidr: 10.244.20.32/27, affinity: 'host:node-c'}\n");
    let e = explain(&s.cluster, &s.object_errors, &OwnershipConfig::default(), &opts(Some("node-a"), OutputFormat::Table)).unwrap();
    print!("{}", e.text);
    assert!(e.has_errors);
    let findings: Vec<&str> = section(&e.text, "Findings").into_iter().filter(|l| l.contains("invalid-block")).collect();
    assert_eq!(findings.len(), 2, "{findings:?}");
    assert!(
        findings[0].contains(r#"IPAMBlock "10-244-20-0-26": spec.cidr: 10.244.20.0/26 overlaps IPAM block 10-244-20-32-27 (10.244.20.32/27)"#),
        "{}",
        findings[0]
    );
    assert!(
        findings[1].contains(r#"IPAMBlock "10-244-20-32-27": spec.cidr: 10.244.20.32/27 overlaps IPAM block 10-244-20-0-26 (10.244.20.0/26)"#),
        "{}",
        findings[1]
    );
    assert!(findings.iter().all(|f| f.trim_start().starts_with("ERROR  invalid-block") && f.ends_with("nothing there is routed, deleted or claimed")));
    assert!(!e.text.contains("10.244.20.0/26 via") && !e.text.contains("10.244.20.5/32 via"));
    let all = explain_all_nodes(&s.cluster, &s.object_errors, &OwnershipConfig::default(), OutputFormat::Json).unwrap();
    assert!(all.has_errors);
    let json: serde_json::Value = serde_json::from_str(&all.text).unwrap();
    assert_eq!(json["invalid_blocks"].as_array().map(Vec::len), Some(2));
}
