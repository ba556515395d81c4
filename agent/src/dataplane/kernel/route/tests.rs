//! Unit tests of the kernel route: keys and their order, the conversion from cluster routes,
//! and the wire encoding against the rtnetlink library's own messages.

use proptest::prelude::*;
use rtnetlink::packet_core::{NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST};
use rtnetlink::packet_route::RouteNetlinkMessage;

use super::*;
use crate::dataplane::kernel::route_wire::{emit_write_request, parse_route, write_request};
use crate::routes::RouteOrigin;

fn cr(dst: &str, path: RoutePath, gw: Option<&str>) -> ClusterRoute {
    ClusterRoute {
        dst: dst.parse().unwrap(),
        path,
        gateway: gw.map(|g| g.parse().unwrap()),
        device: None,
        class: PoolClass::Ipip,
        pool: "p".into(),
        origin: RouteOrigin::OwnBlock { block: dst.into() },
    }
}

/// The written-out order is the derived one: every pair of a set of keys that differ in
/// each field (and in both directions), against the fields' tuple with `IpNet`'s own order;
/// equal exactly when `==` says so.
#[test]
fn route_key_order_is_the_fields_order() {
    let dsts = [
        "0.0.0.0/0",
        "10.0.0.0/8",
        "10.0.0.0/26",
        "10.0.0.64/26",
        "10.0.1.0/24",
        "255.255.255.255/32",
        "::/0",
        "fd00::/8",
        "fd00::/122",
        "fd00::40/122",
        "ffff::1/128",
    ];
    let mut keys = Vec::new();
    for table in [48, 254] {
        for dst in dsts {
            let dst: IpNet = dst.parse().unwrap();
            for (tos, metric) in [(0, 0), (0, 1024), (0x10, 0), (0x10, 1024)] {
                keys.push(RouteKey { table, family: Family::of(&dst), dst, tos, metric });
            }
        }
    }
    // A family that disagrees with `dst` (a hand-built key) still orders by the field.
    keys.push(RouteKey { table: 254, family: Family::V6, dst: "10.0.0.0/26".parse().unwrap(), tos: 0, metric: 1024 });
    let fields = |k: &RouteKey| (k.table, k.family, k.dst, k.tos, k.metric);
    for a in &keys {
        for b in &keys {
            assert_eq!(a.cmp(b), fields(a).cmp(&fields(b)), "{a:?} vs {b:?}");
            assert_eq!(a.cmp(b) == std::cmp::Ordering::Equal, a == b);
        }
    }
}

#[test]
fn shapes_match_felix() {
    let s = RouteSettings::default();
    let t = to_kernel_route(&cr("10.244.20.0/26", RoutePath::Tunnel, Some("10.0.0.12")), &s).unwrap();
    assert_eq!(t.route.to_string(), "10.244.20.0/26 via 10.0.0.12 dev tunl0 proto 80 metric 1024 onlink");
    let n = to_kernel_route(&cr("10.244.20.0/26", RoutePath::HostNic, Some("10.0.0.12")), &s).unwrap();
    assert_eq!(n.route.target.device.as_deref(), Some("eth0"));
    let b = to_kernel_route(&cr("10.244.10.0/26", RoutePath::Blackhole, None), &s).unwrap();
    assert_eq!(b.route.to_string(), "blackhole 10.244.10.0/26 proto 80 metric 1024");
    let s48 = RouteSettings { table: 48, metric: 0, protocol: 201, ..RouteSettings::default() };
    let v6 = to_kernel_route(&cr("fd00:10::/122", RoutePath::HostNic, Some("fd00::12")), &s48).unwrap();
    assert_eq!(v6.route.key.metric, 1024, "IPv6 metric 0 is stored as 1024");
    assert_eq!(v6.route.key.table, 48);
}

#[test]
fn conversion_errors() {
    let s = RouteSettings::default();
    assert!(matches!(to_kernel_route(&cr("10.244.20.0/26", RoutePath::Tunnel, None), &s), Err(ConversionError::MissingGateway { .. })));
    assert!(matches!(to_kernel_route(&cr("10.244.20.0/26", RoutePath::Tunnel, Some("fd00::1")), &s), Err(ConversionError::FamilyMismatch { .. })));
}

#[test]
fn key_normalisation() {
    let k = RouteKey::new(254, "10.244.20.7/26".parse().unwrap(), 0, 0);
    assert_eq!(k.dst.to_string(), "10.244.20.0/26");
    assert_eq!(k.metric, 0, "IPv4 metric 0 stays 0");
}

#[test]
fn parse_roundtrip_of_written_route() {
    let s = RouteSettings { table: 300, ..RouteSettings::default() };
    let d = to_kernel_route(&cr("10.244.20.0/26", RoutePath::Tunnel, Some("10.0.0.12")), &s).unwrap();
    let req = write_request(&d.route, Some(7), None, false);
    let RouteNetlinkMessage::NewRoute(msg) = req.payload.clone().into_inner_owned() else { panic!() };
    assert_eq!(msg.header.table, RT_TABLE_COMPAT);
    let o = parse_route(&msg).unwrap();
    assert_eq!(o.key, d.route.key);
    assert!(o.onlink);
    assert_eq!(o.oif, Some(7));
    assert!(!o.extra);
    assert_eq!(o.named(|_| Some("tunl0".into())), d.route);
}

/// Any route key and target the encoder may be handed (of either family, any prefix
/// length, table, metric, type, protocol and scope, a gateway of either family or none),
/// with any device index, nexthop object, create mode and sequence number.
fn any_write() -> impl Strategy<Value = (KernelRoute, Option<u32>, Option<u32>, bool, u32)> {
    let dst = prop_oneof![
        (any::<[u8; 4]>(), 0u8..=32).prop_map(|(a, l)| IpNet::V4(ipnet::Ipv4Net::new(a.into(), l).unwrap())),
        (any::<[u8; 16]>(), 0u8..=128).prop_map(|(a, l)| IpNet::V6(ipnet::Ipv6Net::new(a.into(), l).unwrap())),
    ];
    let gateway = prop_oneof![Just(None), any::<[u8; 4]>().prop_map(|a| Some(IpAddr::from(a))), any::<[u8; 16]>().prop_map(|a| Some(IpAddr::from(a))),];
    let kind = prop_oneof![Just(RouteKind::Unicast), Just(RouteKind::Blackhole), any::<u8>().prop_map(RouteKind::Other)];
    let key = (any::<u32>(), dst, any::<u8>(), any::<u32>()).prop_map(|(table, dst, tos, metric)| RouteKey::new(table, dst, tos, metric));
    let target = (kind, gateway, any::<bool>(), any::<u8>(), any::<u8>()).prop_map(|(kind, gateway, onlink, protocol, scope)| RouteTarget {
        kind,
        gateway,
        device: Some("tunl0".into()),
        onlink,
        protocol,
        scope,
    });
    (key, target, any::<Option<u32>>(), any::<Option<u32>>(), any::<bool>(), any::<u32>())
        .prop_map(|(key, target, oif, nexthop, exclusive, seq)| (KernelRoute { key, target }, oif, nexthop, exclusive, seq))
}

proptest! {
    /// The batch encoder writes exactly the bytes of the library's message for the same
    /// route, framed as a batch frames it (NLM_F_ACK cleared, sequence number, port 0),
    /// appended after what the buffer already holds.
    #[test]
    fn emit_write_request_is_the_library_message((route, oif, nexthop, exclusive, seq) in any_write(), before in 0usize..9) {
        let mut req = write_request(&route, oif, nexthop, exclusive);
        req.header.flags &= !NLM_F_ACK;
        req.header.sequence_number = seq;
        req.header.port_number = 0;
        req.finalize();
        let mut want = vec![0u8; req.buffer_len()];
        req.serialize(&mut want);
        let mut buf = vec![0xa5; before * 4];
        let len = emit_write_request(&mut buf, &route, oif, nexthop, exclusive, seq);
        prop_assert_eq!(len, want.len());
        prop_assert_eq!(buf.len(), before * 4 + len);
        prop_assert!(buf[..before * 4].iter().all(|&b| b == 0xa5), "what was there is kept");
        prop_assert_eq!(&buf[before * 4..], &want[..]);
        // And the bytes say what the route is (the library's parser, then ours), where the
        // gateway is of the route's family (the only routes the agent builds).
        if route.target.gateway.is_some_and(|gw| gw.is_ipv4() != matches!(route.key.dst, IpNet::V4(_))) {
            return Ok(());
        }
        let parsed = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buf[before * 4..]).expect("the library parses it");
        let NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewRoute(msg)) = parsed.payload else { panic!("not a new route: {parsed:?}") };
        let o = parse_route(&msg).expect("a route");
        let classic = nexthop.is_none();
        prop_assert_eq!(o.key, route.key);
        prop_assert_eq!(o.kind.to_kernel(), route.target.kind.to_kernel());
        prop_assert_eq!(o.gateway, route.target.gateway.filter(|_| classic));
        prop_assert_eq!(o.oif, oif.filter(|_| classic));
        prop_assert_eq!(o.onlink, classic && route.target.onlink);
        prop_assert_eq!(o.nexthop, nexthop);
        prop_assert_eq!((o.protocol, o.scope), (route.target.protocol, route.target.scope));
        prop_assert_eq!(parsed.header.sequence_number, seq);
        prop_assert_eq!(parsed.header.flags, NLM_F_REQUEST | NLM_F_CREATE | if exclusive { NLM_F_EXCL } else { NLM_F_REPLACE });
    }
}

trait IntoInner {
    fn into_inner_owned(self) -> RouteNetlinkMessage;
}
impl IntoInner for rtnetlink::packet_core::NetlinkPayload<RouteNetlinkMessage> {
    fn into_inner_owned(self) -> RouteNetlinkMessage {
        match self {
            rtnetlink::packet_core::NetlinkPayload::InnerMessage(m) => m,
            _ => panic!("not an inner message"),
        }
    }
}
