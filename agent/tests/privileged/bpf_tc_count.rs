//! The BPF chain end to end: the object built from `ebpf/` is embedded, loads, attaches as a TC
//! classifier to a veth inside a private network namespace, and counts exactly the packets we
//! send.

use std::net::UdpSocket;
use std::process::Command;

use routewarden::bpf::tc_count::{Direction, TcCounter};
use routewarden_lab::{skip_unless_root, NetNsGuard};

fn sh(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().expect("spawn");
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn tc_count_counts_every_egress_packet_exactly() {
    if skip_unless_root("tc_count_counts_every_egress_packet_exactly") {
        return;
    }
    let Some(object) = routewarden::bpf::embedded_object() else {
        routewarden_lab::skip(
            "tc_count_counts_every_egress_packet_exactly",
            format_args!("this test binary was built without the BPF object; `cargo xtask test` embeds it"),
        );
        return;
    };
    let ns = NetNsGuard::new().expect("netns");
    // No IPv6 (no ND/MLD chatter) and a permanent neighbour (no ARP): the only egress packets
    // on veth0 are the datagrams this test sends.
    sh(&["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"]);
    ns.ip(&["link", "add", "veth0", "type", "veth", "peer", "name", "veth1"]).unwrap();
    ns.ip(&["addr", "add", "10.99.0.1/24", "dev", "veth0"]).unwrap();
    ns.ip(&["addr", "add", "10.99.0.2/24", "dev", "veth1"]).unwrap();
    ns.ip(&["link", "set", "veth0", "up"]).unwrap();
    ns.ip(&["link", "set", "veth1", "up"]).unwrap();
    ns.ip(&["neigh", "replace", "10.99.0.3", "lladdr", "02:00:00:00:00:03", "dev", "veth0", "nud", "permanent"]).unwrap();

    let counter = TcCounter::attach(object, &["veth0".to_string()], Direction::Egress).expect("attach tc_count");
    assert_eq!(counter.read().unwrap(), routewarden_common::TcCounters { packets: 0, bytes: 0 });

    let sock = UdpSocket::bind("10.99.0.1:0").unwrap();
    let payload = [0u8; 100];
    for _ in 0..25 {
        sock.send_to(&payload, "10.99.0.3:9").unwrap();
    }
    // Ethernet 14 + IPv4 20 + UDP 8 + payload 100 bytes per frame.
    let got = counter.read().unwrap();
    assert_eq!(got, routewarden_common::TcCounters { packets: 25, bytes: 25 * 142 });
    drop(counter);
    drop(ns);
}
