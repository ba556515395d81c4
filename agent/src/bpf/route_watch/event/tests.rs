use super::*;
use routewarden_common::route_watch::{RecordKind, RouteWatchRecord, RouteWrite};

fn writer(id: u32, kind: WriterIdKind, protocol: u8, class: WriterClass, comm: &[u8]) -> WriteOrigin {
    let mut c = [0u8; 16];
    c[..comm.len()].copy_from_slice(comm);
    WriteOrigin { id, id_kind: kind as u8, protocol, class: class as u8, flags: 0, comm: c }
}

fn record(kind: RecordKind, family: u8, dst: &[u8], dst_len: u8) -> RouteWatchRecord {
    let mut d = [0u8; 16];
    d[..dst.len()].copy_from_slice(dst);
    let mut gw = [0u8; 16];
    gw[..4].copy_from_slice(&[10, 0, 0, 12]);
    RouteWatchRecord {
        kind: kind as u8,
        _pad: 0,
        errno: 0,
        changes: 4,
        write: RouteWrite {
            ts_ns: 42,
            table: 254,
            metric: 1024,
            oif: 3,
            family,
            op: WriteOp::Replace as u8,
            dst_len,
            _pad: 0,
            dst: d,
            gateway: if family == AF_INET { gw } else { [0; 16] },
            nh_id: 0,
            _pad2: 0,
            writer: writer(1234, WriterIdKind::NetlinkPort, 12, WriterClass::Bird, b""),
        },
        previous: writer(77, WriterIdKind::Process, 80, WriterClass::SelfAgent, b"routewarden"),
    }
}

fn bytes(r: &RouteWatchRecord) -> Vec<u8> {
    // SAFETY: `r` is a live reference, so its `size_of_val` bytes are readable for the
    // borrow; `RouteWatchRecord` is `#[repr(C)]` with every padding byte an explicit field
    // (its size is the sum of its fields', asserted in `routewarden_common`), so all of
    // them are initialized `u8`s.
    unsafe { std::slice::from_raw_parts(std::ptr::from_ref(r).cast::<u8>(), std::mem::size_of_val(r)) }.to_vec()
}

#[test]
fn decodes_ipv4_conflict_with_both_writers() {
    let ev = decode_record(&bytes(&record(RecordKind::Conflict, AF_INET, &[10, 244, 20, 0], 26))).unwrap();
    let RouteWatchEvent::Conflict { route, previous, writes_in_window } = ev else { panic!("{ev:?}") };
    assert_eq!(route.dst, "10.244.20.0/26".parse::<IpNet>().unwrap());
    assert_eq!(route.gateway, Some("10.0.0.12".parse().unwrap()));
    assert_eq!((route.op, route.table, route.metric, route.family), ("replace", 254, 1024, "ipv4"));
    assert_eq!(route.writer.netlink_port, Some(1234));
    assert_eq!(route.writer.class, "bird");
    assert_eq!(previous.pid, Some(77));
    assert_eq!(previous.comm.as_deref(), Some("routewarden"));
    assert_eq!(previous.class, "self");
    assert_eq!(writes_in_window, 4);
}

#[test]
fn decodes_ipv6_flap_and_link_down() {
    let dst = "fd00:10:244::".parse::<Ipv6Addr>().unwrap().octets();
    let ev = decode_record(&bytes(&record(RecordKind::Flap, AF_INET6, &dst, 122))).unwrap();
    let RouteWatchEvent::Flap { route, changes_in_window, .. } = &ev else { panic!("{ev:?}") };
    assert_eq!(route.dst.to_string(), "fd00:10:244::/122");
    assert_eq!(route.gateway, None);
    assert_eq!(*changes_in_window, 4);
    let ev = decode_record(&bytes(&record(RecordKind::LinkDown, 0, &[], 0))).unwrap();
    assert_eq!(ev, RouteWatchEvent::LinkDown { at_ns: 42, ifindex: 3 });
}

#[test]
fn decodes_a_rule_deletion_with_its_writer() {
    let mut r = record(RecordKind::Rule, AF_INET, &[], 0);
    r.write.op = WriteOp::Delete as u8;
    r.write.table = 48;
    r.write.metric = 100;
    r.write.gateway = [0; 16];
    r.write.writer = writer(4321, WriterIdKind::Process, 3, WriterClass::Other, b"ip");
    let ev = decode_record(&bytes(&r)).unwrap();
    let RouteWatchEvent::RuleChange { rule } = &ev else { panic!("{ev:?}") };
    assert_eq!((rule.at_ns, rule.family, rule.op, rule.table, rule.priority), (42, "ipv4", "delete", 48, 100));
    assert_eq!((rule.writer.pid, rule.writer.comm.as_deref(), rule.writer.class), (Some(4321), Some("ip"), "other"));
    assert_eq!(ev.to_string(), "rule     delete ipv4 rule priority 100 lookup 48 by other(proto 3, ip[4321])");
    r.write.op = WriteOp::Replace as u8;
    assert_eq!(decode_record(&bytes(&r)), Err(DecodeError::Op(1)), "rules have no replace");
}

#[test]
fn rejects_bad_records() {
    let good = record(RecordKind::Conflict, AF_INET, &[10, 0, 0, 0], 8);
    assert!(matches!(decode_record(&bytes(&good)[..50]), Err(DecodeError::Size { got: 50, .. })));
    let mut r = good;
    r.kind = 99;
    assert_eq!(decode_record(&bytes(&r)), Err(DecodeError::Kind(99)));
    let mut r = good;
    r.write.dst_len = 33;
    assert_eq!(decode_record(&bytes(&r)), Err(DecodeError::PrefixLen { family: AF_INET, len: 33 }));
    let mut r = good;
    r.write.family = 7;
    assert_eq!(decode_record(&bytes(&r)), Err(DecodeError::Family(7)));
    let mut r = good;
    r.write.op = 9;
    assert_eq!(decode_record(&bytes(&r)), Err(DecodeError::Op(9)));
}

#[test]
fn kernel_removal_and_json_shape() {
    let mut r = record(RecordKind::Flush, AF_INET, &[10, 0, 0, 0], 8);
    r.write.writer.id = 0;
    let ev = decode_record(&bytes(&r)).unwrap();
    assert!(ev.route().unwrap().writer.kernel);
    let json = serde_json::to_value(&ev).unwrap();
    assert_eq!(json["event"], "flush");
    assert_eq!(json["route"]["dst"], "10.0.0.0/8");
    assert!(json["route"]["writer"].get("netlink_port").is_none());
    assert!(ev.to_string().starts_with("flush    replace 10.0.0.0/8 table 254 metric 1024 via 10.0.0.12"));
    assert!(json["route"].get("nexthop_id").is_none(), "{json}");
}

/// A writer known by its port only: class inferred from the protocol, said so in the text
/// and the JSON; once user space names the process, the class is the process's.
#[test]
fn an_unattributed_writer_says_its_class_was_inferred_until_named() {
    let mut r = record(RecordKind::Write, AF_INET, &[10, 244, 20, 0], 26);
    r.write.writer = writer(30625, WriterIdKind::NetlinkPort, 80, WriterClass::Felix, b"");
    r.write.writer.flags = ORIGIN_CLASS_INFERRED;
    let ev = decode_record(&bytes(&r)).unwrap();
    let w = &ev.route().unwrap().writer;
    assert_eq!((w.class, w.class_inferred, w.netlink_port, w.pid), ("felix", true, Some(30625), None));
    assert!(ev.to_string().ends_with("by felix(proto 80, port 30625, unattributed: class inferred from protocol 80)"), "{ev}");
    let json = serde_json::to_value(&ev).unwrap();
    assert_eq!((json["route"]["writer"]["class"].as_str(), json["route"]["writer"]["class_inferred"].as_bool()), (Some("felix"), Some(true)), "{json}");
    let mut named = w.clone();
    named.attribute(4711, "ip".to_owned());
    assert_eq!((named.class, named.class_inferred, named.pid, named.comm.as_deref()), ("other", false, Some(4711), Some("ip")));
    assert_eq!(named.to_string(), "other(proto 80, ip[4711], port 30625)");
    let mut bird = w.clone();
    bird.attribute(4712, "bird".to_owned());
    assert_eq!(bird.class, "bird");
    // A class the kernel decided from the process stays.
    let mut known = WriterInfo::from_raw(&writer(77, WriterIdKind::Process, 80, WriterClass::Other, b"ip"));
    known.attribute(77, "calico-node".to_owned());
    assert_eq!((known.class, known.class_inferred), ("other", false));
    assert_eq!(serde_json::to_value(&known).unwrap()["class_inferred"], false);
}

/// A route through a nexthop object: its id in the event, the text and the JSON; the
/// object's gateway when the backend saw it (socket filter), none when it did not.
#[test]
fn decodes_the_nexthop_object_id() {
    let mut r = record(RecordKind::Write, AF_INET, &[10, 244, 20, 0], 26);
    r.write.nh_id = 7001;
    let ev = decode_record(&bytes(&r)).unwrap();
    let route = ev.route().unwrap();
    assert_eq!((route.nexthop_id, route.gateway), (Some(7001), Some("10.0.0.12".parse().unwrap())));
    assert!(ev.to_string().starts_with("write    replace 10.244.20.0/26 table 254 metric 1024 nhid 7001 via 10.0.0.12 oif 3 by"), "{ev}");
    assert_eq!(serde_json::to_value(&ev).unwrap()["route"]["nexthop_id"], 7001);
    let dst = "fd00:10:244:20::".parse::<Ipv6Addr>().unwrap().octets();
    let mut r = record(RecordKind::Write, AF_INET6, &dst, 122);
    (r.write.nh_id, r.write.oif) = (u32::MAX, 0);
    let ev = decode_record(&bytes(&r)).unwrap();
    let route = ev.route().unwrap();
    assert_eq!((route.nexthop_id, route.gateway, route.oif), (Some(u32::MAX), None, 0));
    assert!(ev.to_string().starts_with("write    replace fd00:10:244:20::/122 table 254 metric 1024 nhid 4294967295 by"), "{ev}");
}

/// A failing writer: BIRD's create-exclusive refused with EEXIST, as Calico#10585's loop;
/// the JSON carries the errno and its name beside the route, the text says both.
#[test]
fn decodes_a_failing_writer_and_a_refused_write() {
    let mut r = record(RecordKind::Failing, AF_INET, &[10, 244, 20, 0], 26);
    r.errno = 17;
    r.changes = 3;
    r.write.op = WriteOp::Add as u8;
    r.write.writer = writer(812, WriterIdKind::Process, 12, WriterClass::Bird, b"bird");
    let ev = decode_record(&bytes(&r)).unwrap();
    let RouteWatchEvent::FailingWriter { route, error, failures_in_window } = &ev else { panic!("{ev:?}") };
    assert_eq!((route.op, route.dst.to_string().as_str(), route.writer.pid, route.writer.comm.as_deref()), ("add", "10.244.20.0/26", Some(812), Some("bird")));
    assert_eq!((error.errno, error.error.as_str(), *failures_in_window), (17, "EEXIST (File exists)", 3));
    assert_eq!(
        ev.to_string(),
        "FAILING  add 10.244.20.0/26 table 254 metric 1024 via 10.0.0.12 oif 3 by bird(proto 12, bird[812]): EEXIST (File exists) (3 refused in window)"
    );
    let json = serde_json::to_value(&ev).unwrap();
    assert_eq!(
        (json["event"].as_str(), json["errno"].as_u64(), json["error"].as_str(), json["failures_in_window"].as_u64()),
        (Some("failing-writer"), Some(17), Some("EEXIST (File exists)"), Some(3)),
        "{json}"
    );
    assert_eq!(json["route"]["writer"]["comm"], "bird");

    let mut r = record(RecordKind::WriteFailed, AF_INET, &[10, 244, 20, 0], 26);
    r.errno = 3;
    r.write.op = WriteOp::Delete as u8;
    let ev = decode_record(&bytes(&r)).unwrap();
    assert_eq!(serde_json::to_value(&ev).unwrap()["event"], "write-failed");
    assert!(ev.to_string().starts_with("refused  delete 10.244.20.0/26"), "{ev}");
    assert!(ev.to_string().ends_with(": ESRCH (No such process)"), "{ev}");
    assert_eq!(WriteError::new(4095).error, "errno 4095");
}
