//! The agent binary's forwarding watch end to end in the lab: `routewarden run` on node-a of
//! the example cluster fills the trie from its plan, and its `/metrics` count the datagrams
//! the test sends through the programmed routes, per pool and path.

mod lab_support;

use std::time::Duration;

use lab_support::{example_dir, lab, metrics, wait_for, wait_ready, Agent};
use routewarden_lab::skip_unless_root;

#[test]
fn the_agent_counts_cluster_traffic_per_pool_and_path() {
    if skip_unless_root("the_agent_counts_cluster_traffic_per_pool_and_path") {
        return;
    }
    if routewarden::bpf::embedded_object().is_none() {
        routewarden_lab::skip("the_agent_counts_cluster_traffic_per_pool_and_path", format_args!("built without the BPF object; `cargo xtask test` embeds it"));
        return;
    }
    let lab = lab();
    // Permanent neighbours: no ARP queueing, every datagram leaves at once.
    lab.ip("node-a", &["neigh", "replace", "10.0.1.14", "lladdr", "02:00:00:00:00:14", "dev", "tunl0", "nud", "permanent"]).unwrap();
    lab.ip("node-a", &["neigh", "replace", "10.0.0.12", "lladdr", "02:00:00:00:00:12", "dev", "eth0", "nud", "permanent"]).unwrap();
    let _agent = Agent::start(&lab, "node-a", &example_dir(), &[]);
    let metrics = || metrics(&lab, "node-a");
    let ready = wait_ready(&lab, "node-a");
    assert!(ready.contains("tc_forward: ready"), "{ready}");
    // The plan reached the trie: its series are declared at 0, wrong-path ones included.
    let m = wait_for("forwarding series declared", Duration::from_secs(10), || {
        let m = metrics();
        m.has(r#"routewarden_wrong_path_packets_total{pool="ipip-always",expected="tunnel",actual="host"}"#).then_some(m)
    });
    assert_eq!(m.value(r#"routewarden_bpf_program_attached{program="tc_forward"}"#), 1, "{m}");

    lab.in_netns("node-a", || {
        let s = std::net::UdpSocket::bind("10.0.0.11:0").unwrap();
        for _ in 0..20 {
            s.send_to(&[0u8; 64], "10.245.40.9:9").unwrap(); // ipip-always: tunl0 to node-d
        }
        for _ in 0..15 {
            s.send_to(&[0u8; 64], "10.244.20.9:9").unwrap(); // CrossSubnet, same subnet: eth0
        }
        for _ in 0..5 {
            s.send_to(&[0u8; 64], "10.0.0.12:9").unwrap(); // a node address: not cluster
        }
    })
    .unwrap();
    let m = wait_for("the datagrams in /metrics", Duration::from_secs(5), || {
        let m = metrics();
        (m.value(r#"routewarden_forwarded_packets_total{pool="default-ipv4-ippool",path="host"}"#) == 15).then_some(m)
    });
    assert_eq!(m.value(r#"routewarden_forwarded_packets_total{pool="ipip-always",path="tunnel"}"#), 20, "{m}");
    assert_eq!(m.value(r#"routewarden_forwarded_packets_total{pool="ipip-always",path="host"}"#), 0, "{m}");
    // Ethernet 14 + IPv4 20 + UDP 8 + 64 on the veth stand-in.
    assert_eq!(m.value(r#"routewarden_forwarded_bytes_total{pool="ipip-always",path="tunnel"}"#), 20 * 106, "{m}");
    assert_eq!(m.value(r#"routewarden_wrong_path_packets_total{pool="ipip-always",expected="tunnel",actual="host"}"#), 0, "{m}");
    assert_eq!(m.value(r#"routewarden_forwarding_flaps_total{pool="ipip-always"}"#), 0, "{m}");
}

/// `tunl0` deleted and created again. The routes came back in 0.26 s, but the
/// classifier stayed on the dead ifindex while `/readyz` and the attached gauge said attached,
/// so nothing through the new `tunl0` was counted. The watch follows the live ifindex (checked
/// every second) and attaches to the new device: its datagrams are counted.
#[test]
fn a_recreated_tunnel_device_is_watched_again() {
    if skip_unless_root("a_recreated_tunnel_device_is_watched_again") {
        return;
    }
    if routewarden::bpf::embedded_object().is_none() {
        routewarden_lab::skip("a_recreated_tunnel_device_is_watched_again", format_args!("built without the BPF object; `cargo xtask test` embeds it"));
        return;
    }
    let lab = lab();
    let _agent = Agent::start(&lab, "node-a", &example_dir(), &[]);
    let metrics = || metrics(&lab, "node-a");
    wait_ready(&lab, "node-a");
    wait_for("forwarding series declared", Duration::from_secs(10), || {
        metrics().has(r#"routewarden_forwarded_packets_total{pool="ipip-always",path="tunnel"}"#).then_some(())
    });
    let route = || lab.ip("node-a", &["route", "show", "10.245.40.0/26", "proto", "80"]).unwrap();
    assert!(route().contains("dev tunl0"), "{}", route());
    // The stand-in goes, and a new one comes (a veth, as the lab's: this kernel has neither
    // ipip nor dummy), with a permanent neighbour so that every datagram leaves at once.
    lab.ip("node-a", &["link", "del", "tunl0"]).unwrap();
    lab.ip("node-a", &["link", "add", "tunl0", "type", "veth", "peer", "name", "tunl0-peer"]).unwrap();
    for dev in ["tunl0-peer", "tunl0"] {
        lab.ip("node-a", &["link", "set", dev, "up"]).unwrap();
    }
    lab.ip("node-a", &["neigh", "replace", "10.0.1.14", "lladdr", "02:00:00:00:00:14", "dev", "tunl0", "nud", "permanent"]).unwrap();
    wait_for("the route through the new tunl0", Duration::from_secs(10), || route().contains("dev tunl0").then_some(()));
    // Within the watch's one-second check, the classifier is on the new device.
    let send = || {
        lab.in_netns("node-a", || {
            let s = std::net::UdpSocket::bind("10.0.0.11:0").unwrap();
            for _ in 0..20 {
                s.send_to(&[0u8; 64], "10.245.40.9:9").unwrap();
            }
        })
        .unwrap();
    };
    let counted = wait_for("datagrams through the new tunl0 counted", Duration::from_secs(10), || {
        send();
        std::thread::sleep(Duration::from_millis(1200));
        let n = metrics().value(r#"routewarden_forwarded_packets_total{pool="ipip-always",path="tunnel"}"#);
        (n > 0).then_some(n)
    });
    assert_eq!(counted % 20, 0, "whole batches of 20: {counted}");
    assert_eq!(metrics().value(r#"routewarden_bpf_program_attached{program="tc_forward"}"#), 1);
}

/// The forwarding watch starts with the first apply; with none (here: a node name the
/// datastore does not have, so `--host-device auto` finds no NIC and nothing is planned) it
/// still starts, at the latest 5 s after the agent's loop started, on the tunnel device alone.
#[test]
fn the_forwarding_watch_starts_without_an_apply() {
    if skip_unless_root("the_forwarding_watch_starts_without_an_apply") {
        return;
    }
    if routewarden::bpf::embedded_object().is_none() {
        routewarden_lab::skip("the_forwarding_watch_starts_without_an_apply", format_args!("built without the BPF object; `cargo xtask test` embeds it"));
        return;
    }
    let lab = lab();
    let addr = format!("127.0.0.1:{}", lab_support::PORT);
    let mut cmd = lab.command("node-a", env!("CARGO_BIN_EXE_routewarden"));
    cmd.args(["run", "--node", "node-unknown", "--metrics-addr", &addr, "--log-format", "text", "--datastore"])
        .arg(format!("file:{}", example_dir().display()))
        .env("RUST_LOG", "info")
        .stdin(std::process::Stdio::null());
    let _agent = Agent::from_child(cmd.spawn().unwrap());
    let attached = r#"routewarden_bpf_program_attached{program="tc_forward"} 1"#;
    // Polled raw: the agent may not be listening yet.
    let body =
        wait_for("the forwarding watch attached without an apply", Duration::from_secs(20), || match lab.http_get("node-a", lab_support::PORT, "/metrics") {
            Ok((200, body)) if body.lines().any(|l| l == attached) => Some(body),
            _ => None,
        });
    // Nothing was planned: no route written, no apply made.
    assert_eq!(lab_support::routes(&lab, "node-a", "80"), Vec::<String>::new(), "{body}");
    let (status, ready) = lab.http_get("node-a", lab_support::PORT, "/readyz").unwrap();
    assert_eq!(status, 503, "{ready}");
    assert!(ready.lines().any(|l| l == "bpf tc_forward: ready"), "{ready}");
}
