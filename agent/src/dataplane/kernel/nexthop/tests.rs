//! Unit tests of `nexthop.rs`.

use super::*;

fn roundtrip(req: &NetlinkMessage<NexthopMessage>) -> NexthopMessage {
    let mut req = req.clone();
    req.finalize();
    let mut buf = vec![0; req.buffer_len()];
    req.serialize(&mut buf);
    let back = NetlinkMessage::<NexthopMessage>::deserialize(&buf).unwrap();
    match back.payload {
        rtnetlink::packet_core::NetlinkPayload::InnerMessage(m) => m,
        other => panic!("not an inner message: {other:?}"),
    }
}

#[test]
fn a_written_nexthop_parses_back_to_what_was_written() {
    for (gateway, family) in [("10.0.0.12", AF_INET), ("fd00::12", AF_INET6)] {
        let op = NexthopOp::Write { id: 0x5257_0001, gateway: gateway.parse().unwrap(), oif: 7, onlink: true, protocol: 80, exclusive: true };
        let req = nexthop_request(&op);
        assert_eq!(req.header.flags, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL);
        let msg = roundtrip(&req);
        assert_eq!(msg.family, family);
        let seen = parse_nexthop(&msg).unwrap();
        assert_eq!(seen, ObservedNexthop { id: 0x5257_0001, protocol: 80, gateway: Some(gateway.parse().unwrap()), oif: Some(7), onlink: true, other: false });
        assert!(seen.is_ours(80));
        assert!(!seen.is_ours(12), "another protocol's object is not ours");
    }
    let replace = nexthop_request(&NexthopOp::Write { id: 9, gateway: "10.0.0.1".parse().unwrap(), oif: 1, onlink: false, protocol: 80, exclusive: false });
    assert_eq!(replace.header.flags, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE);
    let seen = parse_nexthop(&roundtrip(&replace)).unwrap();
    assert!(!seen.onlink);
    assert!(!seen.is_ours(80), "an id outside NEXTHOP_IDS is never ours");
}

#[test]
fn delete_and_dump_requests_carry_only_what_the_kernel_accepts() {
    let del = roundtrip(&nexthop_request(&NexthopOp::Delete { id: 0x5257_0002 }));
    assert_eq!((del.message_type, del.family, del.protocol, del.flags), (RTM_DELNEXTHOP, AF_UNSPEC, 0, 0));
    assert_eq!(del.attributes.len(), 1);
    let dump = nexthop_dump_request();
    assert_eq!(dump.header.flags, NLM_F_REQUEST | NLM_F_DUMP);
    let m = roundtrip(&dump);
    assert_eq!((m.family, m.scope, m.protocol, m.flags, m.attributes.len()), (0, 0, 0, 0, 0));
}

#[test]
fn groups_blackholes_and_short_messages_are_never_ours() {
    let group = NexthopMessage {
        message_type: RTM_NEWNEXTHOP,
        protocol: 80,
        attributes: vec![u32_nla(NHA_ID, 0x5257_0003), DefaultNla::new(NHA_GROUP, vec![0; 8])],
        ..NexthopMessage::default()
    };
    assert!(!parse_nexthop(&group).unwrap().is_ours(80));
    let mut entries = Vec::new();
    for (id, weight) in [(0x5257_0001_u32, 0_u8), (7, 3)] {
        entries.extend(id.to_ne_bytes());
        entries.extend([weight, 0, 0, 0]);
    }
    let two = NexthopMessage { attributes: vec![u32_nla(NHA_ID, 100), DefaultNla::new(NHA_GROUP, entries)], ..group.clone() };
    assert_eq!(group_members(&two), [0x5257_0001, 7]);
    assert_eq!(group_members(&group), [0], "one member, id 0");
    let single = NexthopMessage { attributes: vec![u32_nla(NHA_ID, 1), u32_nla(NHA_OIF, 2)], ..group.clone() };
    assert!(group_members(&single).is_empty());
    let header = NetlinkHeader::default();
    assert!(NexthopMessage::deserialize(&header, &[0; 4]).is_err());
    let no_id = NexthopMessage { message_type: RTM_NEWNEXTHOP, ..NexthopMessage::default() };
    assert_eq!(parse_nexthop(&no_id), None);
}
