use rtnetlink::packet_core::{Emitable, NetlinkDeserializable, NetlinkHeader, NetlinkPayload};
use rtnetlink::packet_route::rule::RuleUidRange;
use rtnetlink::packet_route::AddressFamily;

use super::*;

fn message(family: AddressFamily, table: u8, attributes: Vec<RuleAttribute>) -> RuleMessage {
    let mut m = RuleMessage::default();
    m.header.family = family;
    m.header.action = RuleAction::ToTable;
    m.header.table = table;
    m.attributes = attributes;
    m
}

#[test]
fn parses_table_priority_protocol_and_selectors() {
    let mut m = message(AddressFamily::Inet, 252, vec![RuleAttribute::Table(1048), RuleAttribute::Priority(100), RuleAttribute::Protocol(200.into())]);
    m.header.src_len = 8;
    m.attributes.push(RuleAttribute::Source("10.0.0.0".parse().unwrap()));
    m.attributes.push(RuleAttribute::FwMark(0x10));
    m.attributes.push(RuleAttribute::FwMask(0xff));
    m.attributes.push(RuleAttribute::UidRange(RuleUidRange { start: 1, end: 2 }));
    let r = parse_rule(&m).unwrap();
    assert_eq!(
        r,
        ObservedRule {
            family: Family::V4,
            priority: 100,
            verb: RuleVerb::Lookup,
            table: 1048,
            protocol: 200,
            invert: false,
            selectors: vec![
                RuleSelector::From("10.0.0.0/8".parse().unwrap()),
                RuleSelector::Other("uidrange 1-2".into()),
                RuleSelector::Other("fwmark 0x10/0xff".into())
            ],
        }
    );
    assert_eq!(r.to_string(), "priority 100 from 10.0.0.0/8 uidrange 1-2 fwmark 0x10/0xff lookup 1048 proto 200");
}

#[test]
fn a_rule_without_attributes_is_from_all_at_priority_zero() {
    let mut m = message(AddressFamily::Inet6, 255, vec![]);
    m.header.flags = RuleFlags::Invert;
    let r = parse_rule(&m).unwrap();
    assert_eq!((r.family, r.priority, r.table, r.protocol, r.invert, r.selectors.len()), (Family::V6, 0, 255, 0, true, 0));
    m.header.action = RuleAction::Blackhole;
    assert_eq!(parse_rule(&m).unwrap().verb, RuleVerb::Other);
    m.header.family = AddressFamily::Unspec;
    assert_eq!(parse_rule(&m), None);
}

#[test]
fn the_table_rule_request_is_an_exclusive_create_with_the_full_table_id() {
    let req = table_rule_request(Family::V4, 1048, 100, 200);
    assert_eq!(req.header.flags, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL);
    let NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewRule(m)) = &req.payload else { panic!("not a new rule") };
    assert_eq!(m.header.table, 252, "RT_TABLE_COMPAT in the header above 255");
    assert_eq!(m.header.action, RuleAction::ToTable);
    let parsed = parse_rule(m).unwrap();
    assert_eq!(parsed.to_string(), "priority 100 from all lookup 1048 proto 200");
    // Round trip through the wire bytes, as the kernel would read them.
    let mut buf = vec![0; m.buffer_len()];
    m.emit(&mut buf);
    let mut header = NetlinkHeader::default();
    header.message_type = 32; // RTM_NEWRULE
    let back = RouteNetlinkMessage::deserialize(&header, &buf).unwrap();
    let RouteNetlinkMessage::NewRule(back) = back else { panic!("not a rule") };
    assert_eq!(parse_rule(&back), Some(parsed));
    let NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewRule(small)) = table_rule_request(Family::V6, 48, 7, 200).payload else { panic!() };
    assert_eq!(small.header.table, 48);
}
