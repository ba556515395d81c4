//! The TC forwarding watch against real packets, each test in its own network
//! namespaces (never the machine's own):
//!
//! ```text
//!  node netns (NetNsGuard)                               peer netns (rwfw<pid>-<test>)
//!   tunl0  192.168.50.1/24 (veth stand-in: no ipip here) ── tunl0p
//!   eth0   192.168.50.1/24                               ── eth0p
//!   10.244.0.0/16  pool "ipip-pool"  expected tunnel
//!   10.250.0.0/16  pool "flat"       expected host
//!   192.168.60.0/24                  not a cluster destination
//! ```
//!
//! IPv6 is off and next hops have permanent neighbour entries, so the only egress packets are
//! the ones the test sends: every count is exact.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::process::Command;
use std::time::Duration;

use aya::programs::{SchedClassifier, TcAttachType};
use nix::sys::socket::{sendto, socket, AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType, SockaddrIn};
use routewarden::bpf::forward::{DeviceRole, ForwardConfig, ForwardEntry, ForwardEvent, ForwardEventKind, ForwardMetrics, ForwardWatch};
use routewarden::bpf::tc_count::{Direction, TcCounter};
use routewarden::observe::metrics::{ForwardPathLabels, PoolLabels, WrongPathLabels};
use routewarden::observe::Metrics;
use routewarden::vocabulary::PoolClass;
use routewarden_common::forward::{ForwardPath, Observation};
use routewarden_lab::{skip_unless_root, NetNsGuard};

const PAYLOAD: usize = 100;
/// Ethernet 14 + IPv4 20 + UDP 8 + payload.
const FRAME: u64 = 14 + 20 + 8 + PAYLOAD as u64;
const GW: &str = "192.168.50.2";

fn sh(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().expect("spawn");
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// The peer namespace; deleted on drop.
struct PeerNs(String);

impl Drop for PeerNs {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// Build the node namespace's devices and routes (see the module doc). Returns the peer.
fn build(ns: &NetNsGuard, test: &str) -> PeerNs {
    sh(&["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"]);
    let peer = PeerNs(format!("rwfw{}-{test}", std::process::id()));
    sh(&["ip", "netns", "add", &peer.0]);
    for dev in ["tunl0", "eth0"] {
        let p = format!("{dev}p");
        ns.ip(&["link", "add", dev, "type", "veth", "peer", "name", &p]).unwrap();
        ns.ip(&["link", "set", &p, "netns", &peer.0]).unwrap();
        ns.ip(&["link", "set", dev, "up"]).unwrap();
        ns.ip(&["neigh", "replace", GW, "lladdr", "02:00:00:00:00:02", "dev", dev, "nud", "permanent"]).unwrap();
    }
    ns.ip(&["addr", "add", "192.168.50.1/24", "dev", "eth0"]).unwrap();
    ns.ip(&["route", "add", "192.168.60.0/24", "via", GW, "dev", "eth0"]).unwrap();
    peer
}

fn route(ns: &NetNsGuard, dst: &str, dev: &str) {
    ns.ip(&["route", "replace", dst, "via", GW, "dev", dev, "onlink"]).unwrap();
}

fn entry(prefix: &str, pool: &str, class: PoolClass, expected: ForwardPath) -> ForwardEntry {
    ForwardEntry { prefix: prefix.parse().unwrap(), pool: pool.into(), class, expected }
}

fn send(to: &str, n: usize) {
    let sock = UdpSocket::bind("192.168.50.1:0").unwrap();
    let dst: Ipv4Addr = to.parse().unwrap();
    for _ in 0..n {
        sock.send_to(&[0u8; PAYLOAD], SocketAddrV4::new(dst, 9)).unwrap();
    }
}

fn config(sample_interval: Duration) -> ForwardConfig {
    ForwardConfig { sample_interval, ..ForwardConfig::for_devices(&["tunl0".into()], &["eth0".into()]) }
}

fn object(test: &str) -> Option<&'static [u8]> {
    if skip_unless_root(test) {
        return None;
    }
    let obj = routewarden::bpf::embedded_object();
    if obj.is_none() {
        routewarden_lab::skip(test, format_args!("this test binary was built without the BPF object; `cargo xtask test` embeds it"));
    }
    obj
}

/// Drain the events the reader has delivered within `wait`.
fn drain(rt: &tokio::runtime::Runtime, rx: &mut tokio::sync::mpsc::Receiver<ForwardEvent>, wait: Duration) -> Vec<ForwardEvent> {
    rt.block_on(async {
        let mut out = Vec::new();
        while let Ok(Some(ev)) = tokio::time::timeout(wait, rx.recv()).await {
            out.push(ev);
        }
        out
    })
}

fn forwarded(m: &Metrics, pool: &str, path: &'static str) -> u64 {
    m.forwarded_packets.get_or_create(&ForwardPathLabels { pool: pool.into(), path }).get()
}

fn forwarded_bytes(m: &Metrics, pool: &str, path: &'static str) -> u64 {
    m.forwarded_bytes.get_or_create(&ForwardPathLabels { pool: pool.into(), path }).get()
}

fn wrong(m: &Metrics, pool: &str, expected: &'static str, actual: &'static str) -> u64 {
    m.wrong_path_packets.get_or_create(&WrongPathLabels { pool: pool.into(), expected, actual }).get()
}

/// Exact counts per (pool, path); non-cluster traffic ignored; another TC program attached to
/// the same hooks (tc_count, after ours) still sees every packet.
#[test]
fn counts_per_pool_and_path_and_coexists_with_another_program() {
    let Some(obj) = object("counts_per_pool_and_path_and_coexists_with_another_program") else { return };
    let ns = NetNsGuard::new().expect("netns");
    let _peer = build(&ns, "counts");
    route(&ns, "10.244.1.0/26", "tunl0");
    route(&ns, "10.250.1.0/26", "eth0");

    // tc_count first, then the watch, which asks for the front of the hook (TCX: first link;
    // clsact: the kernel's automatic priority ranks a new filter ahead of existing ones). So
    // tc_count runs after the watch and sees the packets only if the watch lets the chain go on.
    let other = TcCounter::attach(obj, &["tunl0".into(), "eth0".into()], Direction::Egress).expect("attach tc_count");
    let mut watch = ForwardWatch::start(obj, &config(Duration::from_secs(1))).expect("start the forwarding watch");
    if watch.attached()[0].mode == "tcx" {
        for dev in ["tunl0", "eth0"] {
            let (_, progs) = SchedClassifier::query_tcx(dev, TcAttachType::Egress).expect("query tcx");
            let names: Vec<String> = progs.iter().map(|p| p.name_as_str().unwrap_or("?").to_string()).collect();
            assert_eq!(names.len(), 2, "{dev}: {names:?}");
            assert!(names[0].starts_with("tc_forward_"), "{dev}: the watch runs first: {names:?}");
            assert_eq!(names[1], "tc_count", "{dev}: {names:?}");
        }
    }
    assert_eq!(watch.attached().len(), 2, "{:?}", watch.attached());
    assert!(watch.missing().is_empty());
    let entries = vec![
        entry("10.244.1.0/26", "ipip-pool", PoolClass::Ipip, ForwardPath::Tunnel),
        entry("10.250.1.0/26", "flat", PoolClass::NoEncap, ForwardPath::Host),
        entry("10.250.1.9/32", "flat", PoolClass::NoEncap, ForwardPath::Host),
    ];
    let up = watch.set_destinations(&entries).unwrap();
    assert_eq!((up.inserted, up.updated, up.removed, up.total), (3, 0, 0, 3), "{up:?}");
    assert!(up.failed.is_empty());
    // Same entries again: nothing written.
    assert_eq!(watch.set_destinations(&entries).unwrap().inserted, 0);

    send("10.244.1.5", 20); // tunnel, as expected
    send("10.250.1.7", 15); // host, as expected (the /26)
    send("10.250.1.9", 4); // host, borrowed-IP /32 (longest match, same pool)
    send("192.168.60.1", 7); // not a cluster destination

    let c = watch.counts().unwrap();
    assert_eq!(c.slot("ipip-pool", ForwardPath::Tunnel, Observation::TunnelDevice).packets, 20);
    assert_eq!(c.slot("ipip-pool", ForwardPath::Tunnel, Observation::TunnelDevice).bytes, 20 * FRAME);
    assert_eq!(c.slot("flat", ForwardPath::Host, Observation::HostNative).packets, 19);
    assert_eq!(c.slots.len(), 2, "nothing else counted: {:?}", c.slots);
    assert_eq!(c.stats.samples, 0);

    let (_, metrics) = Metrics::new_registry();
    let mut fm = ForwardMetrics::new(watch.tunnel_watched());
    ForwardMetrics::declare(&metrics, &entries);
    fm.apply(&metrics, &c);
    assert_eq!(forwarded(&metrics, "ipip-pool", "tunnel"), 20);
    assert_eq!(forwarded_bytes(&metrics, "ipip-pool", "tunnel"), 20 * FRAME);
    assert_eq!(forwarded(&metrics, "ipip-pool", "host"), 0);
    assert_eq!(forwarded(&metrics, "flat", "host"), 19);
    assert_eq!(wrong(&metrics, "ipip-pool", "tunnel", "host"), 0);

    // The other program saw every packet, cluster or not.
    assert_eq!(other.read().unwrap().packets, 20 + 15 + 4 + 7);

    // Diff: drop the /32, move the /26 to another pool, add a block; never cleared.
    let entries2 = vec![
        entry("10.244.1.0/26", "ipip-pool", PoolClass::Ipip, ForwardPath::Tunnel),
        entry("10.250.1.0/26", "flat-2", PoolClass::NoEncap, ForwardPath::Host),
        entry("10.250.2.0/26", "flat", PoolClass::NoEncap, ForwardPath::Host),
    ];
    let up = watch.set_destinations(&entries2).unwrap();
    assert_eq!((up.inserted, up.updated, up.removed, up.total), (1, 1, 1, 3), "{up:?}");
    send("10.250.1.9", 3); // now the /26 of flat-2
    let c = watch.counts().unwrap();
    assert_eq!(c.slot("flat-2", ForwardPath::Host, Observation::HostNative).packets, 3);
    assert_eq!(c.slot("flat", ForwardPath::Host, Observation::HostNative).packets, 19);
    drop(watch);
    drop(other);
    drop(ns);
}

/// A tunnel-class block routed out the host NIC: every packet counted as wrong, one sample in
/// the ring buffer naming the block, expected tunnel, actual host.
#[test]
fn wrong_path_is_counted_and_sampled() {
    let Some(obj) = object("wrong_path_is_counted_and_sampled") else { return };
    let ns = NetNsGuard::new().expect("netns");
    let _peer = build(&ns, "wrong");
    route(&ns, "10.244.2.0/26", "eth0");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut watch = ForwardWatch::start(obj, &config(Duration::from_mins(1))).expect("start");
    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    let _reader = rt.block_on(async { watch.spawn_reader(tx) }).unwrap();
    let entries = vec![entry("10.244.2.0/26", "ipip-pool", PoolClass::Ipip, ForwardPath::Tunnel)];
    watch.set_destinations(&entries).unwrap();

    send("10.244.2.33", 12);
    let c = watch.counts().unwrap();
    assert_eq!(c.slot("ipip-pool", ForwardPath::Tunnel, Observation::HostNative).packets, 12);
    assert_eq!((c.stats.samples, c.stats.samples_suppressed), (1, 11));
    let (_, metrics) = Metrics::new_registry();
    ForwardMetrics::declare(&metrics, &entries);
    ForwardMetrics::new(true).apply(&metrics, &c);
    assert_eq!(wrong(&metrics, "ipip-pool", "tunnel", "host"), 12);
    assert_eq!(forwarded(&metrics, "ipip-pool", "host"), 12);

    let events = drain(&rt, &mut rx, Duration::from_millis(300));
    assert_eq!(events.len(), 1, "{events:?}");
    let ev = &events[0];
    assert_eq!(ev.event, ForwardEventKind::WrongPath);
    assert_eq!(ev.block.to_string(), "10.244.2.0/26");
    assert_eq!(ev.dst.to_string(), "10.244.2.33");
    assert_eq!((ev.expected, ev.actual), ("tunnel", "host"));
    assert_eq!(ev.pool.as_deref(), Some("ipip-pool"));
    assert_eq!(ev.device.as_deref(), Some("eth0"));
    eprintln!("event: {ev}");
    drop(watch);
    drop(rt);
    drop(ns);
}

/// Alternating a block's route between tunl0 and eth0, with traffic each time: the third path
/// change within the window is one forwarding flap, and a fourth change does not add another.
#[test]
fn alternating_path_is_one_forwarding_flap() {
    let Some(obj) = object("alternating_path_is_one_forwarding_flap") else { return };
    let ns = NetNsGuard::new().expect("netns");
    let _peer = build(&ns, "flap");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut watch = ForwardWatch::start(obj, &config(Duration::from_mins(1))).expect("start");
    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    let _reader = rt.block_on(async { watch.spawn_reader(tx) }).unwrap();
    watch.set_destinations(&[entry("10.244.3.0/26", "ipip-pool", PoolClass::Ipip, ForwardPath::Tunnel)]).unwrap();

    for (i, dev) in ["tunl0", "eth0", "tunl0", "eth0", "tunl0"].into_iter().enumerate() {
        route(&ns, "10.244.3.0/26", dev);
        send("10.244.3.1", 2);
        let flaps = watch.counts().unwrap().flaps_of("ipip-pool");
        assert_eq!(flaps, u64::from(i >= 3), "after {i} changes");
    }
    let events = drain(&rt, &mut rx, Duration::from_millis(300));
    let flaps: Vec<_> = events.iter().filter(|e| e.event == ForwardEventKind::Flap).collect();
    assert_eq!(flaps.len(), 1, "{events:?}");
    assert_eq!(flaps[0].block.to_string(), "10.244.3.0/26");
    assert_eq!((flaps[0].previous, flaps[0].actual, flaps[0].changes), (Some("tunnel"), "host", Some(3)));
    // The eth0 phases were also wrong-path: 2 + 2 packets, one sample (60 s interval).
    let c = watch.counts().unwrap();
    assert_eq!(c.slot("ipip-pool", ForwardPath::Tunnel, Observation::HostNative).packets, 4);
    assert_eq!(c.slot("ipip-pool", ForwardPath::Tunnel, Observation::TunnelDevice).packets, 6);
    assert_eq!(events.iter().filter(|e| e.event == ForwardEventKind::WrongPath).count(), 1);
    let (_, metrics) = Metrics::new_registry();
    ForwardMetrics::new(true).apply(&metrics, &c);
    assert_eq!(metrics.forwarding_flaps.get_or_create(&PoolLabels { pool: "ipip-pool".into() }).get(), 1);
    eprintln!("event: {}", flaps[0]);
    drop(watch);
    drop(rt);
    drop(ns);
}

/// An IPv4 header for `proto`, checksum left to the kernel (IP_HDRINCL fills it).
fn ipv4_header(src: [u8; 4], dst: [u8; 4], proto: u8, payload_len: usize) -> [u8; 20] {
    let total = u16::try_from(20 + payload_len).unwrap().to_be_bytes();
    let mut h = [0x45, 0, total[0], total[1], 0, 0, 0, 0, 64, proto, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    h[12..16].copy_from_slice(&src);
    h[16..20].copy_from_slice(&dst);
    h
}

/// IPIP packets leaving the host NIC (crafted with a raw socket: this kernel has no ipip
/// module) are attributed to their inner destination and counted as tunnel traffic; an inner
/// destination outside the cluster is ignored.
#[test]
fn ipip_on_the_host_nic_is_tunnel_traffic_of_the_inner_destination() {
    let Some(obj) = object("ipip_on_the_host_nic_is_tunnel_traffic_of_the_inner_destination") else { return };
    let ns = NetNsGuard::new().expect("netns");
    let _peer = build(&ns, "ipip");
    let mut watch = ForwardWatch::start(obj, &config(Duration::from_secs(1))).expect("start");
    watch.set_destinations(&[entry("10.244.4.0/26", "ipip-pool", PoolClass::Ipip, ForwardPath::Tunnel)]).unwrap();

    let raw = socket(AddressFamily::Inet, SockType::Raw, SockFlag::SOCK_CLOEXEC, SockProtocol::Raw).expect("raw socket");
    let outer_dst = [192, 168, 50, 2];
    let send_ipip = |inner_dst: [u8; 4], n: usize| {
        let udp_len = 8 + PAYLOAD;
        let mut inner = ipv4_header([10, 244, 0, 1], inner_dst, 17, udp_len).to_vec();
        inner.extend_from_slice(&[0x30, 0x39, 0, 9, 0, u8::try_from(udp_len).unwrap(), 0, 0]);
        inner.extend_from_slice(&[0u8; PAYLOAD]);
        let mut pkt = ipv4_header([192, 168, 50, 1], outer_dst, 4, inner.len()).to_vec();
        pkt.extend_from_slice(&inner);
        let to = SockaddrIn::from(SocketAddrV4::new(Ipv4Addr::from(outer_dst), 0));
        for _ in 0..n {
            sendto(std::os::fd::AsRawFd::as_raw_fd(&raw), &pkt, &to, MsgFlags::empty()).expect("sendto");
        }
    };
    send_ipip([10, 244, 4, 9], 9);
    send_ipip([172, 16, 0, 1], 5);

    let c = watch.counts().unwrap();
    let got = c.slot("ipip-pool", ForwardPath::Tunnel, Observation::HostIpip);
    // Ethernet 14 + outer IPv4 20 + inner IPv4 20 + UDP 8 + payload.
    assert_eq!((got.packets, got.bytes), (9, 9 * (14 + 20 + 20 + 8 + PAYLOAD as u64)));
    assert_eq!(c.slots.len(), 1, "{:?}", c.slots);
    assert_eq!(c.stats.samples, 0, "IPIP is the expected path: not wrong");
    // With no tunnel device watched, the NIC's view is the count.
    let (_, metrics) = Metrics::new_registry();
    ForwardMetrics::new(false).apply(&metrics, &c);
    assert_eq!(forwarded(&metrics, "ipip-pool", "tunnel"), 9);
    // With tunl0 watched, the same packets were already counted there: not twice.
    let (_, metrics) = Metrics::new_registry();
    ForwardMetrics::new(true).apply(&metrics, &c);
    assert_eq!(forwarded(&metrics, "ipip-pool", "tunnel"), 0);
    drop(watch);
    drop(ns);
}

/// IPv6 cluster destinations leaving the host NIC are counted per pool, exactly, as IPv4 ones
/// are (the Ethernet frame's IPv6 header read in place, the direct path of the program); an
/// IPv6 destination outside the cluster is not counted. IPv6 is on in this namespace only,
/// the address without duplicate detection and the next hop a permanent neighbour, so the
/// kernel's own IPv6 packets (router and neighbour solicitations, MLD) go to link-local and
/// multicast destinations, none of them a cluster destination.
#[test]
fn ipv6_destinations_are_counted_per_pool() {
    let Some(obj) = object("ipv6_destinations_are_counted_per_pool") else { return };
    let ns = NetNsGuard::new().expect("netns");
    let peer = PeerNs(format!("rwfw{}-v6", std::process::id()));
    sh(&["ip", "netns", "add", &peer.0]);
    ns.ip(&["link", "add", "eth0", "type", "veth", "peer", "name", "eth0p"]).unwrap();
    ns.ip(&["link", "set", "eth0p", "netns", &peer.0]).unwrap();
    ns.ip(&["link", "set", "eth0", "up"]).unwrap();
    ns.ip(&["-6", "addr", "add", "fd00:50::1/64", "dev", "eth0", "nodad"]).unwrap();
    ns.ip(&["-6", "neigh", "replace", "fd00:50::2", "lladdr", "02:00:00:00:00:02", "dev", "eth0", "nud", "permanent"]).unwrap();
    for dst in ["fd00:10:250::/64", "fd00:60::/64"] {
        ns.ip(&["-6", "route", "add", dst, "via", "fd00:50::2", "dev", "eth0"]).unwrap();
    }
    let cfg = ForwardConfig { sample_interval: Duration::from_secs(1), ..ForwardConfig::for_devices(&[], &["eth0".into()]) };
    let mut watch = ForwardWatch::start(obj, &cfg).expect("start");
    let entries = [
        entry("fd00:10:250::/122", "flat-v6", PoolClass::NoEncap, ForwardPath::Host),
        entry("fd00:10:250::40/122", "flat-v6", PoolClass::NoEncap, ForwardPath::Host),
        entry("fd00:10:250::80/122", "other-v6", PoolClass::NoEncap, ForwardPath::Host),
    ];
    watch.set_destinations(&entries).unwrap();

    let sock = UdpSocket::bind("[fd00:50::1]:0").unwrap();
    let send6 = |to: &str, n: usize| {
        let dst: std::net::Ipv6Addr = to.parse().unwrap();
        for _ in 0..n {
            sock.send_to(&[0u8; PAYLOAD], std::net::SocketAddrV6::new(dst, 9, 0, 0)).unwrap();
        }
    };
    send6("fd00:10:250::5", 10);
    send6("fd00:10:250::45", 5);
    send6("fd00:10:250::99", 3);
    send6("fd00:60::1", 7);

    let c = watch.counts().unwrap();
    // Ethernet 14 + IPv6 40 + UDP 8 + payload.
    let frame = 14 + 40 + 8 + PAYLOAD as u64;
    let got = |pool: &str| {
        let s = c.slot(pool, ForwardPath::Host, Observation::HostNative);
        (s.packets, s.bytes)
    };
    assert_eq!(got("flat-v6"), (15, 15 * frame));
    assert_eq!(got("other-v6"), (3, 3 * frame));
    assert_eq!(c.slots.len(), 2, "nothing else counted: {:?}", c.slots);
    assert_eq!(c.stats.samples, 0, "the expected path: not wrong");
    drop(watch);
    drop(ns);
    drop(peer);
}

/// A configured device that does not exist yet is attached once it appears.
#[test]
fn missing_device_is_attached_when_it_appears() {
    let Some(obj) = object("missing_device_is_attached_when_it_appears") else { return };
    let ns = NetNsGuard::new().expect("netns");
    let _peer = build(&ns, "late");
    let cfg = ForwardConfig::for_devices(&["tunl1".into()], &["eth0".into()]);
    let mut watch = ForwardWatch::start(obj, &cfg).expect("start");
    assert_eq!(watch.missing(), &[("tunl1".to_string(), DeviceRole::Tunnel)]);
    assert!(!watch.tunnel_watched());
    assert!(watch.attach_missing().unwrap().is_empty());
    ns.ip(&["link", "add", "tunl1", "type", "veth", "peer", "name", "tunl1p"]).unwrap();
    let newly = watch.attach_missing().unwrap();
    assert_eq!(newly.len(), 1);
    assert!(watch.tunnel_watched());
    assert!(watch.missing().is_empty());
    let none = ForwardWatch::start(obj, &ForwardConfig::for_devices(&["nope0".into()], &[])).unwrap_err();
    assert!(none.to_string().contains("nope0"), "{none}");
    drop(watch);
    drop(ns);
}

/// Send one IPv4 frame of 8 bytes (shorter than an IPv4 header) out of `dev` through a packet
/// socket, which does not check what it sends.
fn send_short_ipv4_frame(dev: &str) {
    use nix::libc;
    let ifindex = nix::net::if_::if_nametoindex(dev).expect("ifindex");
    let proto = u16::try_from(libc::ETH_P_IP).unwrap().to_be();
    // SAFETY: plain socket calls with a zeroed, filled-in sockaddr_ll and a stack buffer.
    unsafe {
        let fd = libc::socket(libc::AF_PACKET, libc::SOCK_DGRAM, i32::from(proto));
        assert!(fd >= 0, "packet socket: {}", std::io::Error::last_os_error());
        let mut addr: libc::sockaddr_ll = std::mem::zeroed();
        addr.sll_family = u16::try_from(libc::AF_PACKET).unwrap();
        addr.sll_protocol = proto;
        addr.sll_ifindex = i32::try_from(ifindex).unwrap();
        addr.sll_halen = 6;
        addr.sll_addr[..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
        let payload = [0x45u8, 0, 0, 8, 0, 0, 0, 0];
        let rc = libc::sendto(fd, payload.as_ptr().cast(), payload.len(), 0, (&raw const addr).cast(), u32::try_from(size_of::<libc::sockaddr_ll>()).unwrap());
        let err = std::io::Error::last_os_error();
        libc::close(fd);
        assert_eq!(rc, 8, "sendto: {err}");
    }
}

/// aya-log: a packet the watch cannot parse is logged with `--bpf-log-level warn`,
/// as the kernel's exact line, once per second per CPU at most (three frames, one line), and
/// not at all with the level off; the watch still counts the well-formed packets after it.
#[test]
fn an_unparsable_packet_is_logged_through_aya_log() {
    use routewarden::bpf::bpf_log::BpfLogLevel;
    #[derive(Clone, Default)]
    struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let Some(obj) = object("an_unparsable_packet_is_logged_through_aya_log") else { return };
    for level in [BpfLogLevel::Warn, BpfLogLevel::Off] {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt().with_writer(move || writer.clone()).with_ansi(false).without_time().finish();
        tracing::subscriber::with_default(subscriber, || {
            let ns = NetNsGuard::new().expect("netns");
            let _peer = build(&ns, if level == BpfLogLevel::Off { "logoff" } else { "logwarn" });
            route(&ns, "10.250.1.0/26", "eth0");
            let mut watch =
                ForwardWatch::start(obj, &ForwardConfig { log_level: level, ..config(Duration::from_secs(1)) }).expect("start the forwarding watch");
            watch.set_destinations(&[entry("10.250.1.0/26", "flat", PoolClass::NoEncap, ForwardPath::Host)]).expect("destinations");
            // On one CPU, so the per-CPU rate limit allows exactly one line for the three.
            let all = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).expect("affinity");
            let mut one = nix::sched::CpuSet::new();
            one.set(0).unwrap();
            nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &one).expect("pin to CPU 0");
            for _ in 0..3 {
                send_short_ipv4_frame("eth0");
            }
            nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &all).expect("unpin");
            send("10.250.1.9", 5);
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            let bpf_lines = || -> Vec<String> {
                String::from_utf8_lossy(&captured.0.lock().unwrap()).lines().filter(|l| l.contains(" bpf: ")).map(|l| l.trim_start().to_owned()).collect()
            };
            while level != BpfLogLevel::Off && bpf_lines().is_empty() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            std::thread::sleep(Duration::from_millis(600));
            let c = watch.counts().expect("counters");
            assert_eq!(c.slot("flat", ForwardPath::Host, Observation::HostNative).packets, 5, "the well-formed packets are still counted");
            drop(watch);
            let lines = bpf_lines();
            eprintln!("level {level:?}: {lines:?}");
            if level == BpfLogLevel::Off {
                assert_eq!(lines, Vec::<String>::new());
            } else {
                assert_eq!(
                    lines,
                    [r#"WARN bpf: forwarding watch: packet not parsed (header 4, 22 bytes) watch="forwarding-watch" module="routewarden_ebpf::tc_forward""#]
                );
            }
        });
    }
}

/// A destination that cannot be written (a pool past the 256 the counters have room for)
/// leaves the update pending: the app retries it on its counter poll, since a snapshot that
/// makes no new plan (most churn) brings no entries. The same entries again are retried, not
/// skipped as unchanged; an update that writes every entry clears it.
#[test]
fn a_destination_not_written_is_pending_until_an_update_writes_every_entry() {
    let Some(obj) = object("a_destination_not_written_is_pending_until_an_update_writes_every_entry") else { return };
    let ns = NetNsGuard::new().expect("netns");
    let _peer = build(&ns, "pending");
    let mut watch = ForwardWatch::start(obj, &config(Duration::from_secs(1))).expect("start the forwarding watch");
    let (_, metrics) = Metrics::new_registry();
    let entries: Vec<ForwardEntry> = (0..=routewarden_common::forward::MAX_POOLS)
        .map(|i| entry(&format!("10.{}.{}.0/26", 100 + i / 256, i % 256), &format!("pool-{i}"), PoolClass::NoEncap, ForwardPath::Host))
        .collect();
    assert!(!watch.destinations_pending());
    watch.update_destinations(&by_prefix(&entries), &metrics);
    assert!(watch.destinations_pending(), "the 257th pool's destination was not written");
    watch.update_destinations(&by_prefix(&entries), &metrics);
    assert!(watch.destinations_pending(), "still not written");
    let fit = &entries[..routewarden_common::forward::MAX_POOLS];
    watch.update_destinations(&by_prefix(fit), &metrics);
    assert!(!watch.destinations_pending(), "every entry written");
    assert_eq!(watch.set_destinations(fit).unwrap().total, fit.len());
}

/// `entries` as the app hands them to the watch: by prefix.
fn by_prefix(entries: &[ForwardEntry]) -> routewarden::bpf::forward::ForwardEntries {
    entries.iter().map(|e| (e.prefix, e.clone())).collect()
}

/// The app's updates are diffs against the last map written whole: after a change of one
/// entry's path, one removal and one addition among 1,000, the kernel's destinations are
/// exactly the new entries (every prefix, its pool and path), and the series of a pool whose
/// last entry left are removed while the others stay.
#[test]
fn an_update_writes_what_changed_and_leaves_the_kernel_holding_exactly_the_new_entries() {
    let Some(obj) = object("an_update_writes_what_changed_and_leaves_the_kernel_holding_exactly_the_new_entries") else { return };
    let ns = NetNsGuard::new().expect("netns");
    let _peer = build(&ns, "diffs");
    let mut watch = ForwardWatch::start(obj, &config(Duration::from_secs(1))).expect("start the forwarding watch");
    let (registry, metrics) = Metrics::new_registry();
    let mut entries: Vec<ForwardEntry> =
        (0..1000u32).map(|i| entry(&format!("10.244.{}.{}/26", i / 4, (i % 4) * 64), "ipip-pool", PoolClass::Ipip, ForwardPath::Tunnel)).collect();
    entries.push(entry("10.250.0.0/26", "flat", PoolClass::NoEncap, ForwardPath::Host));
    watch.update_destinations(&by_prefix(&entries), &metrics);
    assert!(!watch.destinations_pending());
    assert_eq!(watch.destinations().len(), 1001);
    let series = |pool: &str| {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode the metrics");
        text.lines().filter(|l| !l.starts_with('#') && l.contains(&format!("pool=\"{pool}\""))).count()
    };
    assert!(series("flat") > 0, "the flat pool's series are declared");

    entries[7].expected = ForwardPath::Host;
    entries.remove(500);
    entries.pop();
    entries.push(entry("10.244.250.5/32", "ipip-pool", PoolClass::Ipip, ForwardPath::Tunnel));
    watch.update_destinations(&by_prefix(&entries), &metrics);
    assert!(!watch.destinations_pending());
    let got: Vec<(String, u8)> = watch.destinations().iter().map(|(p, t)| (p.to_string(), t.expected)).collect();
    let mut want: Vec<(String, u8)> = entries.iter().map(|e| (e.prefix.to_string(), e.expected as u8)).collect();
    want.sort_by_key(|(p, _)| p.parse::<ipnet::IpNet>().unwrap());
    assert_eq!(got, want);
    assert_eq!(series("flat"), 0, "the flat pool left with its last entry");
    assert!(series("ipip-pool") > 0);
}
