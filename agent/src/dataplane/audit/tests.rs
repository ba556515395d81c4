//! Unit tests of `audit.rs`.

use super::*;
use crate::dataplane::kernel::route::{RouteKey, RouteTarget};
use crate::routes::RouteOrigin;
use crate::vocabulary::PoolClass;

fn k(dst: &str, gw: Option<&str>, dev: Option<&str>, proto: u8, metric: u32) -> KernelRoute {
    KernelRoute {
        key: RouteKey::new(254, dst.parse().unwrap(), 0, metric),
        target: RouteTarget {
            kind: if dev.is_none() { RouteKind::Blackhole } else { RouteKind::Unicast },
            gateway: gw.map(|g| g.parse().unwrap()),
            device: dev.map(Into::into),
            onlink: dev.is_some(),
            protocol: proto,
            scope: 0,
        },
    }
}

fn e(dst: &str, path: RoutePath, gw: Option<&str>, owner: Writer, protocol: u8) -> ExpectedRoute {
    ExpectedRoute {
        route: ClusterRoute {
            dst: dst.parse().unwrap(),
            path,
            gateway: gw.map(|g| g.parse().unwrap()),
            device: None,
            class: PoolClass::Ipip,
            pool: "default".into(),
            origin: RouteOrigin::RemoteBlock { block: dst.into(), node: "node-b".into() },
        }
        .into(),
        owner,
        protocol,
    }
}

fn scope() -> AuditScope {
    AuditScope {
        table: 254,
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        devices: RouteDevices::default(),
        our_protocol: 201,
        unowned: Vec::new(),
        wireguard: Vec::new(),
    }
}

fn codes(r: &AuditReport) -> Vec<(String, &'static str)> {
    r.findings.iter().map(|f| (f.prefix.to_string(), f.code.as_str())).collect()
}

#[test]
fn wireguard_prefixes_are_listed_not_missing_in_either_table_layout() {
    // BIRD would own 10.244.30.0/26 but it leads to a WireGuard peer: no expectation, no
    // kernel route, so no finding; the report lists it. With routewarden in its own table
    // it is listed once (from main, where BIRD would have programmed it).
    let wg = WireguardRoute { prefix: "10.244.30.0/26".parse().unwrap(), peer: "node-c".into(), bgp_address: "10.0.1.13".parse().unwrap() };
    let s = AuditScope { wireguard: vec![wg.clone()], ..scope() };
    let kernel = vec![k("10.244.20.0/26", Some("10.0.0.12"), Some("tunl0"), 201, 1024)];
    let exp = [e("10.244.20.0/26", RoutePath::Tunnel, Some("10.0.0.12"), Writer::Routewarden, 201)];
    let r = audit(&kernel, &exp, &s);
    assert!(r.is_clean(), "{:?}", r.findings);
    assert_eq!(r.wireguard, std::slice::from_ref(&wg));
    let r = audit_tables(&kernel, &exp, &AuditScope { table: 48, ..s });
    assert_eq!(r.wireguard, [wg]);
}

#[test]
fn clean_when_everything_matches() {
    let kernel = vec![
        k("10.244.20.0/26", Some("10.0.0.12"), Some("tunl0"), 201, 1024),
        k("10.244.10.0/26", None, None, 201, 1024),
        k("0.0.0.0/0", Some("10.0.0.1"), Some("eth0"), 4, 0),
        k("10.0.0.0/24", None, Some("eth0"), 2, 0),
    ];
    let exp = vec![
        e("10.244.20.0/26", RoutePath::Tunnel, Some("10.0.0.12"), Writer::Routewarden, 201),
        e("10.244.10.0/26", RoutePath::Blackhole, None, Writer::Routewarden, 201),
    ];
    let r = audit(&kernel, &exp, &scope());
    assert!(r.is_clean(), "{:?}", r.findings);
    assert_eq!(r.kernel_routes, 2);
}

#[test]
fn every_finding_kind() {
    let kernel = vec![
        // wrong path: expected tunnel, is on eth0
        k("10.244.20.0/26", Some("10.0.0.12"), Some("eth0"), 80, 0),
        // duplicate + stale: BIRD also has it
        k("10.244.20.0/26", Some("10.0.0.12"), Some("tunl0"), 12, 1024),
        // wrong next hop
        k("10.244.30.0/26", Some("10.0.0.99"), Some("tunl0"), 80, 0),
        // stale: nobody expects this block any more
        k("10.244.40.0/26", Some("10.0.0.14"), Some("tunl0"), 12, 1024),
        // foreign writer on a cluster prefix (S05)
        k("10.244.2.0/24", Some("10.0.0.12"), Some("eth0"), 17, 0),
        // not a cluster prefix: ignored
        k("192.168.200.10/32", Some("10.244.10.5"), Some("cali-x"), 12, 0),
    ];
    let exp = vec![
        e("10.244.20.0/26", RoutePath::Tunnel, Some("10.0.0.12"), Writer::Felix, 80),
        e("10.244.30.0/26", RoutePath::Tunnel, Some("10.0.0.13"), Writer::Felix, 80),
        e("10.244.50.0/26", RoutePath::HostNic, Some("10.0.0.15"), Writer::Bird, 12),
    ];
    let r = audit(&kernel, &exp, &scope());
    assert_eq!(
        codes(&r),
        vec![
            ("10.244.2.0/24".into(), "foreign-writer"),
            ("10.244.20.0/26".into(), "stale"),
            ("10.244.20.0/26".into(), "duplicate"),
            ("10.244.20.0/26".into(), "wrong-path"),
            ("10.244.30.0/26".into(), "wrong-next-hop"),
            ("10.244.40.0/26".into(), "stale"),
            ("10.244.50.0/26".into(), "missing"),
        ]
    );
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["findings"][0]["code"], "foreign-writer");
    assert_eq!(r.counts()[&FindingCode::Stale], 2);
}

#[test]
fn duplicate_same_protocol_two_metrics() {
    let kernel = vec![k("10.244.20.0/26", Some("10.0.0.12"), Some("tunl0"), 80, 0), k("10.244.20.0/26", Some("10.0.0.12"), Some("tunl0"), 80, 1024)];
    let exp = vec![e("10.244.20.0/26", RoutePath::Tunnel, Some("10.0.0.12"), Writer::Felix, 80)];
    assert_eq!(codes(&audit(&kernel, &exp, &scope())), vec![("10.244.20.0/26".into(), "duplicate")]);
}

#[test]
fn local_workload_routes_are_not_findings_in_either_family() {
    let mut wl6 = k("10.244.10.5/32", None, Some("cali0"), 4, 1024);
    wl6.key = RouteKey::new(254, "fd00:10:244:0:10::5/128".parse().unwrap(), 0, 1024);
    let kernel = vec![k("10.244.10.5/32", None, Some("cali0"), 4, 0), wl6, k("10.244.10.6/32", None, Some("eth0"), 4, 0)];
    let mut sc = scope();
    sc.cluster_cidrs.push("fd00:10:244::/48".parse().unwrap());
    // The /32 without a gateway on the host NIC is not a workload route: still foreign.
    assert_eq!(codes(&audit(&kernel, &[], &sc)), vec![("10.244.10.6/32".into(), "foreign-writer")]);
}

#[test]
fn bird_may_resolve_an_off_subnet_next_hop_through_the_underlay() {
    // node-d (10.0.1.14/24) reaches node-a (10.0.0.11) through the router 10.0.1.1.
    let underlay = k("10.0.0.0/24", Some("10.0.1.1"), Some("eth0"), 3, 0);
    let exp = vec![e("10.244.20.0/26", RoutePath::HostNic, Some("10.0.0.11"), Writer::Bird, 12)];
    let kernel = vec![underlay.clone(), k("10.244.20.0/26", Some("10.0.1.1"), Some("eth0"), 12, 1024)];
    assert!(audit(&kernel, &exp, &scope()).is_clean());
    // Any other gateway is still wrong, and Felix (onlink, no recursion) gets no such leeway.
    let kernel = vec![underlay.clone(), k("10.244.20.0/26", Some("10.0.1.99"), Some("eth0"), 12, 1024)];
    assert_eq!(codes(&audit(&kernel, &exp, &scope())), vec![("10.244.20.0/26".into(), "wrong-next-hop")]);
    let exp = vec![e("10.244.20.0/26", RoutePath::HostNic, Some("10.0.0.11"), Writer::Felix, 80)];
    let kernel = vec![underlay, k("10.244.20.0/26", Some("10.0.1.1"), Some("eth0"), 80, 1024)];
    assert_eq!(codes(&audit(&kernel, &exp, &scope())), vec![("10.244.20.0/26".into(), "wrong-next-hop")]);
}

#[test]
fn own_table_audits_routewarden_there_and_felix_bird_in_main() {
    let mut ours = k("10.244.20.0/26", Some("10.0.0.12"), Some("tunl0"), 201, 1024);
    ours.key = RouteKey::new(48, ours.key.dst, 0, 1024);
    let bird = k("10.246.30.0/26", Some("10.0.0.13"), Some("eth0"), 12, 1024);
    let exp = vec![
        e("10.244.20.0/26", RoutePath::Tunnel, Some("10.0.0.12"), Writer::Routewarden, 201),
        e("10.246.30.0/26", RoutePath::HostNic, Some("10.0.0.13"), Writer::Bird, 12),
    ];
    let mut sc = scope();
    sc.table = 48;
    sc.cluster_cidrs.push("10.246.0.0/16".parse().unwrap());
    let r = audit_tables(&[ours.clone(), bird.clone()], &exp, &sc);
    assert!(r.is_clean(), "{:?}", r.findings);
    assert_eq!((r.expected, r.kernel_routes), (2, 2));
    // One table alone would call BIRD's route missing (old behaviour of the single-table audit).
    assert_eq!(codes(&audit(&[ours.clone(), bird], &exp, &sc)), vec![("10.246.30.0/26".into(), "missing")]);
    // routewarden's route in main instead of 48 is missing from 48 and stale in main.
    let mut misplaced = ours;
    misplaced.key = RouteKey::new(254, misplaced.key.dst, 0, 1024);
    let r = audit_tables(&[misplaced], &exp[..1], &sc);
    assert_eq!(codes(&r), vec![("10.244.20.0/26".into(), "missing"), ("10.244.20.0/26".into(), "stale")]);
}
