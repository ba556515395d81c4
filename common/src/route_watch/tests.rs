use super::*;

fn comm(name: &[u8]) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[..name.len()].copy_from_slice(name);
    c
}

fn process(protocol: u8, name: &[u8]) -> WriteOrigin {
    WriteOrigin { id: 4242, id_kind: WriterIdKind::Process as u8, protocol, class: 0, flags: 0, comm: comm(name) }
}

fn port(id: u32, protocol: u8) -> WriteOrigin {
    WriteOrigin { id, id_kind: WriterIdKind::NetlinkPort as u8, protocol, class: 0, flags: 0, comm: [0; 16] }
}

#[test]
fn a_known_process_is_classed_by_its_name_not_the_route() {
    let cases: [(&[u8], u8, WriterClass); 10] = [
        (b"calico-node", 80, WriterClass::Felix),
        (b"calico-node", 12, WriterClass::Felix),
        (b"bird", 12, WriterClass::Bird),
        (b"bird6", 12, WriterClass::Bird),
        (b"bird", 80, WriterClass::Bird),
        // A program deleting Felix's route is not Felix.
        (b"ip", 80, WriterClass::Other),
        (b"ip", 12, WriterClass::Other),
        (b"birdc", 12, WriterClass::Other),
        (b"calico-node-x", 80, WriterClass::Other),
        (b"", 80, WriterClass::Other),
    ];
    for (name, protocol, want) in cases {
        assert_eq!(WriterClass::of_writer(&process(protocol, name), false), (want, false), "{:?} proto {protocol}", core::str::from_utf8(name));
    }
    // The name ends at the first NUL; a longer name (16 bytes, no NUL) is none of them.
    assert_eq!(WriterClass::of_comm(b"bird\0\0\0\0\0\0\0\0\0\0\0x"), WriterClass::Bird);
    assert_eq!(WriterClass::of_comm(b"calico-node-abcd"), WriterClass::Other);
}

#[test]
fn the_agent_is_self_whatever_it_writes() {
    assert_eq!(WriterClass::of_writer(&process(12, b"routewarden"), true), (WriterClass::SelfAgent, false));
    assert_eq!(WriterClass::of_writer(&process(80, b"calico-node"), true), (WriterClass::SelfAgent, false));
    assert_eq!(WriterClass::of_writer(&port(977, 80), true), (WriterClass::SelfAgent, false));
    assert_eq!(WriterClass::of_writer(&process(80, b"routewarden"), false), (WriterClass::Other, false));
}

#[test]
fn an_unknown_process_is_inferred_from_the_protocol_and_the_kernel_is_kernel() {
    let inferred = [
        (80, WriterClass::Felix),
        (12, WriterClass::Bird),
        (2, WriterClass::Kernel),
        (3, WriterClass::Boot),
        (4, WriterClass::Static),
        (9, WriterClass::Other),
    ];
    for (protocol, want) in inferred {
        assert_eq!(WriterClass::of_writer(&port(30625, protocol), false), (want, true), "proto {protocol}");
    }
    for protocol in [2, 80, 12] {
        assert_eq!(WriterClass::of_writer(&port(0, protocol), false), (WriterClass::Kernel, false), "kernel-made, proto {protocol}");
    }
}

#[test]
fn protocol_inference_keeps_the_self_protocol() {
    assert_eq!(WriterClass::classify(80, 80), WriterClass::SelfAgent);
    assert_eq!(WriterClass::classify(80, 0), WriterClass::Felix);
}
