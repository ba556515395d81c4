//! `routewarden bird-filter` output against real BIRD 2: render for examples/cluster, include
//! it from a complete minimal bird.conf that uses both kernel filters and the iBGP export
//! function, and require `bird -p` (parse only: no root, no network, no socket) to accept it.
//! Skipped with a message when /usr/sbin/bird (Debian `bird2`) is not installed.

use std::path::Path;
use std::process::Command;

use routewarden::bird_filter::{render, BirdFilterOptions, EXPORT_FUNCTION, KERNEL_FILTER_V4, KERNEL_FILTER_V6};
use routewarden::datastore::FileDatastore;
use routewarden::ownership::{decide, ClusterRoutes, OwnershipConfig, Role};

const BIRD: &str = "/usr/sbin/bird";

fn bird_parses(name: &str, role: Role, route_protocol: u8) {
    if !Path::new(BIRD).exists() {
        routewarden_lab::skip(name, format_args!("bird not installed"));
        return;
    }
    let snap = FileDatastore::load(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/cluster")).expect("example loads");
    let decision = decide(&snap.cluster, &OwnershipConfig { role, node: Some("node-a".into()), ..OwnershipConfig::default() });
    let dir = tempfile::tempdir().expect("tempdir");
    let snippet = dir.path().join("routewarden.conf");
    let opts = BirdFilterOptions {
        route_protocol,
        include_path: snippet.display().to_string(),
        // WireGuard peer rejects in both families, so BIRD parses them too.
        wireguard_peers: vec![("node-b".into(), "10.0.0.12".parse().unwrap()), ("node-b".into(), "fd00::12".parse().unwrap())],
        ..BirdFilterOptions::default()
    };
    let text = render(&decision, &opts);
    for want in [
        "  if (defined(bgp_next_hop) && bgp_next_hop = 10.0.0.12) then { reject; } # WireGuard peer node-b: Felix's WireGuard routing",
        "  if (defined(bgp_next_hop) && bgp_next_hop = fd00::12) then { reject; } # WireGuard peer node-b: Felix's WireGuard routing",
    ] {
        assert_eq!(text.lines().filter(|l| *l == want).count(), 1, "{name}: {want}\n{text}");
    }
    std::fs::write(&snippet, &text).unwrap();
    let conf = format!(
        r#"router id 192.0.2.1;
include "{snippet}";
protocol device {{ }}
protocol kernel k4 {{
  learn; persist; scan time 2; merge paths on;
  ipv4 {{ import all; export filter {KERNEL_FILTER_V4}; }};
}}
protocol kernel k6 {{
  learn; scan time 2;
  ipv6 {{ import all; export filter {KERNEL_FILTER_V6}; }};
}}
protocol static own_blocks {{
  ipv4;
  route 10.244.0.0/26 blackhole;
}}
template bgp mesh {{
  local as 64512;
  ipv4 {{ import all; export filter {{ {EXPORT_FUNCTION}(); if (net ~ 10.244.0.0/16) then accept; reject; }}; }};
  ipv6 {{ import all; export filter {{ {EXPORT_FUNCTION}(); reject; }}; }};
}}
protocol bgp node_b from mesh {{ neighbor 192.0.2.2 as 64512; }}
"#,
        snippet = snippet.display()
    );
    let conf_path = dir.path().join("bird.conf");
    std::fs::write(&conf_path, conf).unwrap();
    let out = Command::new(BIRD).arg("-p").arg("-c").arg(&conf_path).output().expect("run bird -p");
    assert!(
        out.status.success(),
        "{name}: bird -p rejected the config: {}\n{}\n--- snippet ---\n{text}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn bird_accepts_filter_role_felix() {
    bird_parses("bird_accepts_filter_role_felix", Role::Felix, 80);
}

#[test]
fn bird_accepts_filter_role_bird() {
    bird_parses("bird_accepts_filter_role_bird", Role::Bird, 80);
}

#[test]
fn bird_accepts_filter_explicit_with_felix_protocol_too() {
    bird_parses("bird_accepts_filter_explicit_with_felix_protocol_too", Role::Explicit(ClusterRoutes::Disabled), 90);
}

/// End to end: `routewarden bird-filter --node node-a` on the example cluster
/// with WireGuard addresses on node-a (both families) and node-b (IPv4 only, its annotation
/// form) rejects routes via node-b's BGP IPv4 address in the IPv4 filter and nothing in the
/// IPv6 one; node-c and node-d (no WireGuard) get no line.
/// The example cluster in a temporary directory with WireGuard addresses on node-a (both
/// families) and node-b (IPv4 only, its annotation form).
fn wireguard_example() -> tempfile::TempDir {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster");
    let dir = tempfile::tempdir().unwrap();
    for f in ["calico.yaml", "ipam.yaml", "nodes.yaml"] {
        let mut text = std::fs::read_to_string(src.join(f)).unwrap();
        if f == "calico.yaml" {
            text = text.replacen(
                "    ipv4IPIPTunnelAddr: 10.244.10.0\n",
                "    ipv4IPIPTunnelAddr: 10.244.10.0\n  wireguard: {interfaceIPv4Address: 10.244.10.1, interfaceIPv6Address: \"fd00:10:244:10::1\"}\n",
                1,
            );
        } else if f == "nodes.yaml" {
            text = text.replacen(
                "        projectcalico.org/IPv4IPIPTunnelAddr: 10.244.20.0\n",
                "        projectcalico.org/IPv4IPIPTunnelAddr: 10.244.20.0\n        projectcalico.org/IPv4WireguardInterfaceAddr: 10.244.20.1\n",
                1,
            );
        }
        std::fs::write(dir.path().join(f), text).unwrap();
    }
    dir
}

#[test]
fn bird_filter_command_rejects_routes_via_wireguard_peers() {
    let dir = wireguard_example();
    let out = Command::new(env!("CARGO_BIN_EXE_routewarden"))
        .args(["bird-filter", "--node", "node-a", "--datastore"])
        .arg(format!("file:{}", dir.path().display()))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("WireGuard peer")).collect();
    assert_eq!(
        lines,
        [
            "# WireGuard peer node-b (10.0.0.12): routes through it are Felix's WireGuard routing, rejected for BIRD.",
            "  if (defined(bgp_next_hop) && bgp_next_hop = 10.0.0.12) then { reject; } # WireGuard peer node-b: Felix's WireGuard routing",
        ],
        "{text}"
    );
    let v4 = &text[text.find(&format!("filter {KERNEL_FILTER_V4} {{")).unwrap()..text.find(&format!("filter {KERNEL_FILTER_V6} {{")).unwrap()];
    assert!(v4.contains("bgp_next_hop = 10.0.0.12"), "in the IPv4 filter");
}

/// `explain --node node-a` names node-b as a WireGuard peer, with the BGP
/// address whose routes BIRD is told to reject, in the table and in JSON.
#[test]
fn explain_shows_wireguard_peers() {
    let dir = wireguard_example();
    let run = |format: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_routewarden"))
            .args(["explain", "--node", "node-a", "-o", format, "--datastore"])
            .arg(format!("file:{}", dir.path().display()))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let text = run("table");
    let start = text.find("WireGuard peers of node-a").expect("section");
    let section: Vec<&str> = text[start..].lines().take_while(|l| !l.is_empty()).collect();
    assert_eq!(
        section,
        [
            "WireGuard peers of node-a (Felix routes to them over WireGuard in its own table; BIRD's routes via them are rejected)",
            "  NODE    BGP ADDRESS",
            "  node-b  10.0.0.12",
        ],
        "{text}"
    );
    let json: serde_json::Value = serde_json::from_str(&run("json")).unwrap();
    assert_eq!(json["wireguard_peers"], serde_json::json!([{"node": "node-b", "bgp_address": "10.0.0.12"}]));
    // Without WireGuard on this node: no section.
    let plain = Command::new(env!("CARGO_BIN_EXE_routewarden"))
        .args(["explain", "--node", "node-a", "--datastore", concat!("file:", env!("CARGO_MANIFEST_DIR"), "/../examples/cluster")])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&plain.stdout).contains("WireGuard"));
}
