//! `routewarden bird-filter` output against real BIRD 2: render for examples/cluster, include
//! it from a complete minimal bird.conf that uses both kernel filters and the iBGP export
//! function, and require `bird -p` (parse only: no root, no network, no socket) to accept it.
//! Skipped with a message when /usr/sbin/bird (Debian `bird2`) is not installed.

use std::path::Path;
use std::process::Command;

use routewarden::bird_filter::{
    render, BirdFilterOptions, EXPORT_FUNCTION, KERNEL_FILTER_V4, KERNEL_FILTER_V6,
};
use routewarden::datastore::FileDatastore;
use routewarden::ownership::{decide, ClusterRoutes, OwnershipConfig, Role};

const BIRD: &str = "/usr/sbin/bird";

fn bird_parses(name: &str, role: Role, route_protocol: u8) {
    if !Path::new(BIRD).exists() {
        println!("SKIPPED {name}: bird not installed");
        return;
    }
    let snap = FileDatastore::load(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/cluster"))
        .expect("example loads");
    let decision = decide(
        &snap.cluster,
        &OwnershipConfig {
            role,
            node: Some("node-a".into()),
            ..OwnershipConfig::default()
        },
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let snippet = dir.path().join("routewarden.conf");
    let opts = BirdFilterOptions {
        route_protocol,
        include_path: snippet.display().to_string(),
        ..BirdFilterOptions::default()
    };
    let text = render(&decision, &opts);
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
    let out = Command::new(BIRD)
        .arg("-p")
        .arg("-c")
        .arg(&conf_path)
        .output()
        .expect("run bird -p");
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
    bird_parses(
        "bird_accepts_filter_explicit_with_felix_protocol_too",
        Role::Explicit(ClusterRoutes::Disabled),
        90,
    );
}
