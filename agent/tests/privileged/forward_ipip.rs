//! The TC forwarding watch against REAL IPIP encapsulation through `tunl0`. Needs the
//! `ipip` module (every new network namespace then has its own fallback `tunl0`): this host's
//! kernel has none, so the test runs in the QEMU lane of `cargo xtask test` and prints
//! `SKIPPED` here. `forward_watch.rs` covers the rest with veth stand-ins.
//!
//! ```text
//!  node netns (NetNsGuard)                         peer netns (rwip<pid>)
//!   tunl0  10.244.0.1/32 (ipip, up)                 tunl0  10.244.1.1/32 (ipip, up)
//!   eth0   192.168.50.1/24  ──────── veth ────────  eth0   192.168.50.2/24
//!   10.244.1.0/26 via 192.168.50.2 dev tunl0 onlink   (pool "ipip-pool", expected tunnel)
//! ```
//!
//! IPv6 is off and the peer has a permanent neighbour entry, so the only IPv4 packets leaving
//! the node are the test's datagrams (inner, on tunl0) and their encapsulations (outer, on
//! eth0): every count is exact.
//!
//! In the guest only (the lane sets `ROUTEWARDEN_QEMU_GUEST=1` and boots with
//! `routewarden.qemu_lane=1` on the kernel command line), the per-packet cost of the
//! classifiers is read from the kernel's BPF run-time statistics, which need the GLOBAL sysctl
//! `kernel.bpf_stats_enabled`: it is never touched anywhere else.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};

use routewarden::bpf::forward::{ForwardConfig, ForwardEntry, ForwardMetrics, ForwardWatch};
use routewarden::observe::metrics::ForwardPathLabels;
use routewarden::observe::Metrics;
use routewarden::vocabulary::PoolClass;
use routewarden_common::forward::{ForwardPath, Observation};
use routewarden_lab::{skip_unless_root, NetNsGuard};

const PAYLOAD: usize = 100;
/// On tunl0 (no link-layer header): inner IPv4 20 + UDP 8 + payload.
const INNER: u64 = 20 + 8 + PAYLOAD as u64;
/// On eth0: Ethernet 14 + outer IPv4 20 + the inner packet.
const OUTER: u64 = 14 + 20 + INNER;
const N: u64 = 25;
/// Datagrams of the steady stream whose cost is measured (guest only).
const STREAM: u64 = 2000;
const PEER: &str = "192.168.50.2";
const PEER_MAC: &str = "02:00:00:00:00:02";

fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0]).args(&args[1..]).output().expect("spawn");
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether the current namespace has a `tunl0` that is a real IPIP device.
fn real_ipip_tunl0() -> bool {
    let Ok(out) = Command::new("ip").args(["-d", "link", "show", "tunl0"]).output() else { return false };
    out.status.success() && String::from_utf8_lossy(&out.stdout).lines().any(|l| l.trim_start().starts_with("ipip "))
}

/// The peer namespace; deleted on drop.
struct PeerNs(String);

impl PeerNs {
    fn ip(&self, args: &str) {
        let mut v = vec!["ip", "-n", &self.0];
        v.extend(args.split_whitespace());
        sh(&v);
    }
}

impl Drop for PeerNs {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// Build both namespaces (see the module doc); the caller's thread is in the node namespace.
fn build(ns: &NetNsGuard) -> PeerNs {
    // Per-namespace sysctls of the node namespace (the thread's current one).
    for k in ["all", "default"] {
        std::fs::write(format!("/proc/sys/net/ipv6/conf/{k}/disable_ipv6"), "1").expect("disable IPv6 in the node netns");
    }
    let peer = PeerNs(format!("rwip{}", std::process::id()));
    sh(&["ip", "netns", "add", &peer.0]);
    let node = |args: &str| ns.ip(&args.split_whitespace().collect::<Vec<_>>()).unwrap_or_else(|e| panic!("ip {args}: {e:#}"));
    node("link add eth0 type veth peer name eth0p");
    node(&format!("link set eth0p netns {}", peer.0));
    node("addr add 192.168.50.1/24 dev eth0");
    node("link set eth0 up");
    node("addr add 10.244.0.1/32 dev tunl0");
    node("link set tunl0 up");
    node(&format!("neigh replace {PEER} lladdr {PEER_MAC} dev eth0 nud permanent"));
    node(&format!("route add 10.244.1.0/26 via {PEER} dev tunl0 onlink"));
    peer.ip("link set eth0p name eth0");
    peer.ip(&format!("link set eth0 address {PEER_MAC}"));
    peer.ip(&format!("addr add {PEER}/24 dev eth0"));
    peer.ip("link set eth0 up");
    peer.ip("link set lo up");
    peer.ip("addr add 10.244.1.1/32 dev tunl0");
    peer.ip("link set tunl0 up");
    let get = node("route get 10.244.1.5");
    assert!(get.contains(&format!("via {PEER} dev tunl0")), "{get}");
    peer
}

fn send(sock: &UdpSocket, to: &str, n: u64) {
    let dst: Ipv4Addr = to.parse().unwrap();
    for _ in 0..n {
        sock.send_to(&[0u8; PAYLOAD], SocketAddrV4::new(dst, 9)).unwrap();
    }
}

fn entries() -> Vec<ForwardEntry> {
    vec![ForwardEntry { prefix: "10.244.1.0/26".parse().unwrap(), pool: "ipip-pool".into(), class: PoolClass::Ipip, expected: ForwardPath::Tunnel }]
}

fn forwarded(m: &Metrics, path: &'static str) -> (u64, u64) {
    let l = ForwardPathLabels { pool: "ipip-pool".into(), path };
    (m.forwarded_packets.get_or_create(&l).get(), m.forwarded_bytes.get_or_create(&l).get())
}

/// In the QEMU guest of the lane: the lane's environment variable AND its kernel command-line
/// marker (a host boots with neither).
fn in_qemu_guest() -> bool {
    std::env::var("ROUTEWARDEN_QEMU_GUEST").is_ok_and(|v| v == "1")
        && std::fs::read_to_string("/proc/cmdline").is_ok_and(|c| c.split_whitespace().any(|w| w == "routewarden.qemu_lane=1"))
}

/// `(run_time_ns, run_cnt)` of the programs with these ids.
fn run_stats(ids: &[u32]) -> (u64, u64) {
    let mut total = (0, 0);
    for info in aya::programs::loaded_programs().flatten() {
        if ids.contains(&info.id()) {
            total.0 += u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX);
            total.1 += info.run_count();
        }
    }
    total
}

/// Restores `kernel.bpf_stats_enabled` on drop (guest only).
struct BpfStats(String);

impl BpfStats {
    const PATH: &'static str = "/proc/sys/kernel/bpf_stats_enabled";

    fn enable() -> BpfStats {
        assert!(in_qemu_guest(), "kernel.bpf_stats_enabled is global: only flipped in the QEMU guest");
        let before = std::fs::read_to_string(Self::PATH).expect("read bpf_stats_enabled").trim().to_string();
        std::fs::write(Self::PATH, "1").expect("enable bpf_stats");
        BpfStats(before)
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = std::fs::write(Self::PATH, &self.0);
    }
}

/// Real IPIP through tunl0: watching tunl0 and eth0, the inner packets are counted on tunl0
/// and their encapsulations on eth0 (attributed to the inner destination), and the metrics
/// count the tunnel traffic once; watching eth0 only, the outer view is the count. In the
/// guest, the per-packet cost from the kernel's BPF run-time statistics.
#[test]
fn real_ipip_counted_on_tunl0_and_on_the_nic() {
    const TEST: &str = "real_ipip_counted_on_tunl0_and_on_the_nic";
    if skip_unless_root(TEST) {
        return;
    }
    let ns = NetNsGuard::new().expect("netns");
    if !real_ipip_tunl0() {
        routewarden_lab::skip(TEST, format_args!("no ipip tunl0 on this kernel (covered by the QEMU lane)"));
        return;
    }
    let Some(obj) = routewarden::bpf::embedded_object() else {
        routewarden_lab::skip(TEST, format_args!("this test binary was built without the BPF object; `cargo xtask test` embeds it"));
        return;
    };
    let _peer = build(&ns);
    let sock = UdpSocket::bind("0.0.0.0:0").unwrap();

    // 1. tunl0 + eth0 watched.
    let cfg = ForwardConfig::for_devices(&["tunl0".into()], &["eth0".into()]);
    let mut watch = ForwardWatch::start(obj, &cfg).expect("start the forwarding watch on tunl0 + eth0");
    assert_eq!(watch.attached().len(), 2, "{:?}", watch.attached());
    assert!(watch.tunnel_watched());
    eprintln!("attached: {:?}", watch.attached());
    watch.set_destinations(&entries()).unwrap();
    send(&sock, "10.244.1.5", N);
    let c = watch.counts().unwrap();
    let inner = c.slot("ipip-pool", ForwardPath::Tunnel, Observation::TunnelDevice);
    let outer = c.slot("ipip-pool", ForwardPath::Tunnel, Observation::HostIpip);
    assert_eq!((inner.packets, inner.bytes), (N, N * INNER), "inner view on tunl0: {:?}", c.slots);
    assert_eq!((outer.packets, outer.bytes), (N, N * OUTER), "outer view on eth0: {:?}", c.slots);
    assert_eq!(c.slots.len(), 2, "nothing else counted: {:?}", c.slots);
    assert_eq!(c.stats.samples, 0, "IPIP is the expected path: nothing wrong");
    let (_, metrics) = Metrics::new_registry();
    ForwardMetrics::declare(&metrics, &entries());
    ForwardMetrics::new(watch.tunnel_watched()).apply(&metrics, &c);
    assert_eq!(forwarded(&metrics, "tunnel"), (N, N * INNER), "each packet counted once, from tunl0");
    assert_eq!(forwarded(&metrics, "host"), (0, 0));
    eprintln!("tunl0+eth0 watched: {N} packets -> tunl0 {inner:?}, eth0 IPIP {outer:?}, metric tunnel {:?}", forwarded(&metrics, "tunnel"));

    // Per-packet cost, from the kernel's run-time statistics (guest only).
    if in_qemu_guest() {
        let ids: Vec<u32> = watch.program_ids().unwrap().into_iter().map(|(_, id)| id).collect();
        let stats = BpfStats::enable();
        let (t0, n0) = run_stats(&ids);
        let started = Instant::now();
        for _ in 0..STREAM / 100 {
            send(&sock, "10.244.1.5", 100);
            std::thread::sleep(Duration::from_millis(2));
        }
        let (t1, n1) = run_stats(&ids);
        drop(stats);
        let (dt, dn) = (t1 - t0, n1 - n0);
        assert_eq!(dn, 2 * STREAM, "each packet runs tc_forward_tunnel on tunl0 and tc_forward_host on eth0");
        assert!(dt > 0, "run_time_ns did not move");
        #[allow(clippy::cast_precision_loss, reason = "a printed figure")]
        let per = dt as f64 / dn as f64;
        eprintln!("forward per-packet cost: {per:.0} ns (run_time_ns/run_cnt over {dn} packets)");
        eprintln!("  ({STREAM} datagrams through tunl0 + eth0 in {:?}, QEMU TCG emulation)", started.elapsed());
    } else {
        eprintln!("not in the QEMU guest: per-packet cost not measured (kernel.bpf_stats_enabled is global)");
    }
    drop(watch);

    // 2. eth0 only: the NIC's IPIP view is the count.
    let cfg = ForwardConfig::for_devices(&[], &["eth0".into()]);
    let mut watch = ForwardWatch::start(obj, &cfg).expect("start the forwarding watch on eth0");
    assert!(!watch.tunnel_watched());
    watch.set_destinations(&entries()).unwrap();
    send(&sock, "10.244.1.5", N);
    let c = watch.counts().unwrap();
    let outer = c.slot("ipip-pool", ForwardPath::Tunnel, Observation::HostIpip);
    assert_eq!((outer.packets, outer.bytes), (N, N * OUTER), "{:?}", c.slots);
    assert_eq!(c.slots.len(), 1, "{:?}", c.slots);
    let (_, metrics) = Metrics::new_registry();
    ForwardMetrics::declare(&metrics, &entries());
    ForwardMetrics::new(watch.tunnel_watched()).apply(&metrics, &c);
    assert_eq!(forwarded(&metrics, "tunnel"), (N, N * OUTER), "counted from the outer view");
    assert_eq!(forwarded(&metrics, "host"), (0, 0));
    eprintln!("eth0 only watched: {N} packets -> metric tunnel {:?}", forwarded(&metrics, "tunnel"));
    drop(watch);
    drop(sock);
    drop(ns);
}
