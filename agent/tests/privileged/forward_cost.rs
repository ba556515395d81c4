//! Per-packet cost of the forwarding-watch classifiers, measured in the kernel with
//! `BPF_PROG_TEST_RUN` (`bpftool prog run ... repeat N`: the kernel runs the program N times
//! on one skb and reports the average run time). This does not need the global
//! `kernel.bpf_stats_enabled` sysctl, which a test must not flip on the host.
//!
//! The trie holds a realistic load: 6,000 IPv4 /26 blocks and 2,000 borrowed /32s. Printed
//! figures are for the note; the assertions only catch gross regressions (> 5 µs a packet).

use std::process::Command;
use std::time::Duration;

use routewarden::bpf::forward::{ForwardConfig, ForwardEntry, ForwardWatch};
use routewarden::vocabulary::PoolClass;
use routewarden_common::forward::ForwardPath;
use routewarden_lab::{skip_unless_root, NetNsGuard};

const REPEAT: &str = "2000000";

fn ipv4(src: [u8; 4], dst: [u8; 4], proto: u8, payload: &[u8]) -> Vec<u8> {
    let total = u16::try_from(20 + payload.len()).unwrap().to_be_bytes();
    let mut h = vec![0x45, 0, total[0], total[1], 0, 0, 0x40, 0, 64, proto, 0, 0];
    h.extend_from_slice(&src);
    h.extend_from_slice(&dst);
    h.extend_from_slice(payload);
    h
}

fn udp(payload: usize) -> Vec<u8> {
    let len = u16::try_from(8 + payload).unwrap().to_be_bytes();
    let mut u = vec![0x30, 0x39, 0, 9, len[0], len[1], 0, 0];
    u.resize(8 + payload, 0);
    u
}

fn ether(l3: &[u8]) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00];
    f.extend_from_slice(l3);
    f
}

/// Average run time in ns of program `id` on `frame`, from `bpftool prog run`. bpftool is
/// installed (the test checks first), so a run that fails or reports no duration is this
/// test's failure, not a reason to skip.
fn run_ns(id: u32, frame: &[u8]) -> f64 {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("frame.bin");
    std::fs::write(&path, frame).expect("write the frame");
    let out = Command::new("bpftool")
        .args(["prog", "run", "id", &id.to_string(), "data_in", path.to_str().expect("utf-8 path"), "repeat", REPEAT])
        .output()
        .expect("run bpftool");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "`bpftool prog run id {id}` failed ({}): {text}", out.status);
    // "Return value: 4294967295, duration (average): 27ns"
    let ret = text.split("Return value:").nth(1).and_then(|r| r.split(',').next()).map(str::trim);
    assert_eq!(ret, Some("4294967295"), "the classifier must return TC_ACT_UNSPEC (-1): {text}");
    let Some(avg) = text.split("duration (average):").nth(1) else {
        panic!("`bpftool prog run id {id}` reported no duration: {text}");
    };
    let avg = avg.trim().trim_end_matches(|c: char| !c.is_ascii_digit());
    avg.parse().unwrap_or_else(|e| panic!("`bpftool prog run id {id}`: duration {avg:?}: {e}: {text}"))
}

#[test]
fn per_packet_cost_with_a_loaded_trie() {
    if skip_unless_root("per_packet_cost_with_a_loaded_trie") {
        return;
    }
    let Some(obj) = routewarden::bpf::embedded_object() else {
        routewarden_lab::skip("per_packet_cost_with_a_loaded_trie", format_args!("built without the BPF object"));
        return;
    };
    if Command::new("bpftool").arg("version").output().is_err() {
        routewarden_lab::skip("per_packet_cost_with_a_loaded_trie", format_args!("bpftool is not installed"));
        return;
    }
    let ns = NetNsGuard::new().expect("netns");
    ns.ip(&["link", "add", "eth0", "type", "veth", "peer", "name", "eth0p"]).unwrap();
    let cfg = ForwardConfig { sample_interval: Duration::from_secs(1), ..ForwardConfig::for_devices(&[], &["eth0".into()]) };
    let mut watch = ForwardWatch::start(obj, &cfg).expect("start");

    let mut entries = Vec::new();
    for (base, pool, class, expected) in [
        (u32::from_be_bytes([10, 0, 0, 0]), "ipip-pool", PoolClass::Ipip, ForwardPath::Tunnel),
        (u32::from_be_bytes([10, 100, 0, 0]), "flat", PoolClass::NoEncap, ForwardPath::Host),
    ] {
        for i in 0..3000u32 {
            let [a, b, c, d] = (base + i * 64).to_be_bytes();
            entries.push(ForwardEntry { prefix: format!("{a}.{b}.{c}.{d}/26").parse().unwrap(), pool: pool.into(), class, expected });
        }
    }
    for i in 0..2000u32 {
        let [_, _, b, c] = i.to_be_bytes();
        entries.push(ForwardEntry {
            prefix: format!("10.200.{b}.{c}/32").parse().unwrap(),
            pool: "flat".into(),
            class: PoolClass::NoEncap,
            expected: ForwardPath::Host,
        });
    }
    let up = watch.set_destinations(&entries).unwrap();
    assert!(up.failed.is_empty(), "{:?}", &up.failed[..up.failed.len().min(3)]);
    let ids = watch.program_ids().unwrap();
    let (tunnel_id, host_id) = (ids[0].1, ids[1].1);

    let payload = udp(100);
    // 10.0.1.5 is in 10.0.1.0/26, ipip-pool; 10.100.0.9 in flat; 10.200.3.7 a borrowed /32.
    let cases: Vec<(&str, u32, Vec<u8>)> = vec![
        ("non-cluster destination (pool filter miss)", host_id, ether(&ipv4([192, 168, 0, 1], [8, 8, 8, 8], 17, &payload))),
        ("host NIC, no-encap block, right path", host_id, ether(&ipv4([192, 168, 0, 1], [10, 100, 0, 9], 17, &payload))),
        ("host NIC, borrowed /32, right path", host_id, ether(&ipv4([192, 168, 0, 1], [10, 200, 3, 7], 17, &payload))),
        ("tunnel device, IPIP block, right path", tunnel_id, ether(&ipv4([10, 0, 0, 1], [10, 0, 1, 5], 17, &payload))),
        (
            "host NIC, IPIP outer, inner IPIP block",
            host_id,
            ether(&ipv4([192, 168, 0, 1], [192, 168, 0, 2], 4, &ipv4([10, 0, 0, 1], [10, 0, 1, 5], 17, &payload))),
        ),
        ("host NIC, IPIP block, WRONG path (sample rate-limited)", host_id, ether(&ipv4([192, 168, 0, 1], [10, 0, 2, 5], 17, &payload))),
        ("ARP / non-IP", host_id, {
            let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x06];
            f.resize(42, 0);
            f
        }),
    ];
    eprintln!("per-packet cost, BPF_PROG_TEST_RUN average of {REPEAT} runs, trie of {} entries:", up.total);
    for (what, id, frame) in &cases {
        let ns_avg = run_ns(*id, frame);
        eprintln!("  {ns_avg:>6.0} ns  {what}");
        assert!(ns_avg < 5000.0, "{what}: {ns_avg} ns a packet");
    }
    // The runs really went through the classifier: the counters moved.
    let c = watch.counts().unwrap();
    assert!(c.stats.samples >= 1);
    drop(watch);
    drop(ns);
}
