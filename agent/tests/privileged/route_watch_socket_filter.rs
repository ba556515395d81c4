//! The route watch with the `socket-filter` backend forced: the shared scenarios of
//! `route_watch_common` (conflict between two writers, S01, S11, cold start, ring overflow).
//! Each runs in its own network namespace; a kernel that cannot run this backend skips with
//! the reason (this host: fentry EPERM, no kprobes; the QEMU lane runs them).

mod route_watch_common;

use routewarden::bpf::route_watch::RouteWatchBackend;

const BACKEND: RouteWatchBackend = RouteWatchBackend::SocketFilter;

#[test]
fn socket_filter_two_writers_conflict_and_flap_clears() {
    route_watch_common::fight("socket_filter_two_writers_conflict_and_flap_clears", BACKEND);
}

#[test]
fn socket_filter_a_route_through_a_nexthop_object_fights_like_any_other() {
    route_watch_common::fight_through_nexthop("socket_filter_a_route_through_a_nexthop_object_fights_like_any_other", BACKEND);
}

#[test]
fn socket_filter_s01_same_protocol_two_processes() {
    route_watch_common::s01("socket_filter_s01_same_protocol_two_processes", BACKEND);
}

#[test]
fn socket_filter_s11_link_flush_is_not_a_conflict() {
    route_watch_common::s11("socket_filter_s11_link_flush_is_not_a_conflict", BACKEND);
}

#[test]
fn socket_filter_cold_start_10k_routes_is_quiet() {
    route_watch_common::cold_start("socket_filter_cold_start_10k_routes_is_quiet", BACKEND);
}

#[test]
fn socket_filter_ring_overflow_is_counted() {
    route_watch_common::ring_overflow("socket_filter_ring_overflow_is_counted", BACKEND);
}

#[test]
fn socket_filter_ring_full_is_logged_through_aya_log() {
    route_watch_common::ring_full_is_logged("socket_filter_ring_full_is_logged_through_aya_log", BACKEND);
}

#[test]
fn socket_filter_a_v6_route_through_a_nexthop_object_rewritten_is_no_flap() {
    route_watch_common::v6_through_nexthop_rewritten("socket_filter_a_v6_route_through_a_nexthop_object_rewritten_is_no_flap", BACKEND);
}

#[test]
fn socket_filter_switching_nexthop_objects_with_one_gateway_is_a_flap() {
    route_watch_common::switching_nexthop_objects_is_a_flap("socket_filter_switching_nexthop_objects_with_one_gateway_is_a_flap", BACKEND);
}

#[test]
fn socket_filter_a_nexthop_replace_is_not_a_route_write() {
    route_watch_common::a_nexthop_replace_is_not_a_route_write("socket_filter_a_nexthop_replace_is_not_a_route_write", BACKEND);
}

/// The socket filter reads the first KiB of a notification (one copy; `MSG_WORDS` in
/// `ebpf/src/route_watch_netlink.rs`): a notification longer than that is still decoded from
/// what the kernel puts first (table, prefix, metric), and its end is no decode error.
/// One `ip -batch` process writes an IPv4 route through 80 next hops (~1.3 KiB notification: 80 x 16 bytes of
/// `RTA_MULTIPATH`) and an IPv6 route through 40 (~1.2 KiB: 40 x 28), both at metric 300 and
/// protocol 12, then replaces each with a route through one gateway. Each prefix is written
/// twice: an add with no gateway and no device (a multipath route has neither), then a
/// replace with the gateway and `veth0`; one writer, two writes: no episode.
#[test]
fn socket_filter_a_notification_longer_than_a_kib_is_decoded() {
    use std::fmt::Write as _;
    use std::net::IpAddr;
    use std::time::Duration;

    use route_watch_common::{config, ifindex, ip_batch, lab, runtime, start_or_skip, Harness, EVENT_DEADLINE};
    use routewarden::bpf::route_watch::RouteWatchConfig;

    let test = "socket_filter_a_notification_longer_than_a_kib_is_decoded";
    if routewarden_lab::skip_unless_root(test) {
        return;
    }
    let ns = lab();
    let Some(watch) = start_or_skip(test, BACKEND, &RouteWatchConfig { stream_writes: true, ..config() }) else { return };
    let (v4, v6) = ("10.250.0.0/16", "fd00:250::/64");
    runtime().block_on(async {
        let mut h = Harness::new(watch);
        // One `ip -batch` process: one writer.
        let (mut hops4, mut hops6) = (String::new(), String::new());
        for i in 20..100 {
            write!(hops4, " nexthop via 10.0.0.{i} dev veth0").unwrap();
        }
        for i in 0x20..0x48 {
            write!(hops6, " nexthop via fd00::{i:x} dev veth0").unwrap();
        }
        ip_batch(&format!(
            "route add {v4} proto 12 metric 300{hops4}\nroute add {v6} proto 12 metric 300{hops6}\n\
             route replace {v4} via 10.0.0.12 dev veth0 proto 12 metric 300\nroute replace {v6} via fd00::12 dev veth0 proto 12 metric 300\n"
        ));
        let waited = h.pump_until(EVENT_DEADLINE, |h| h.writes_of(v4).len() >= 2 && h.writes_of(v6).len() >= 2).await;
        assert!(waited.is_some(), "{test}: 2 writes of each prefix expected: {:?}", h.events);
        h.pump(Duration::from_millis(200)).await;
        let oif = ifindex("veth0");
        for (dst, gateway) in [(v4, "10.0.0.12"), (v6, "fd00::12")] {
            let seen: Vec<_> = h.writes_of(dst).iter().map(|w| (w.op, w.table, w.metric, w.gateway, w.oif, w.nexthop_id, w.writer.protocol)).collect();
            let gateway: IpAddr = gateway.parse().unwrap();
            assert_eq!(seen, [("add", 254, 300, None, 0, None, 12), ("replace", 254, 300, Some(gateway), oif, None, 12)], "{test}: {dst}");
        }
        assert!(h.flaps().is_empty() && h.conflicts().is_empty(), "{test}: {:?}", h.episodes());
        let c = h.watch.counters().unwrap();
        assert_eq!((c.decode_errors, c.records_lost), (0, 0), "{test}: {c:?}");
    });
    drop(ns);
}

/// Every writer is named by its process in the kernel and classed by it: a program deleting a
/// protocol-80 route is `other`, `bird` writing protocol 12 is `bird` (pids, comms and
/// `routewarden_route_writes_total` exact; nothing unattributed).
#[test]
fn socket_filter_writers_are_named_and_classed_by_process() {
    route_watch_common::writers_named_by_process("socket_filter_writers_are_named_and_classed_by_process", BACKEND, true);
}

/// The socket filter naming senders by port (what runs without `CAP_PERFMON`): the kernel
/// counts the three `ip` writes as unattributed, under the protocol's class; user space names
/// the long-lived processes and decides their events' class from them.
#[test]
fn socket_filter_by_port_counts_unknown_senders_as_unattributed() {
    route_watch_common::writers_named_by_process("socket_filter_by_port_counts_unknown_senders_as_unattributed", BACKEND, false);
}

/// A writer whose writes keep being refused (`route_watch_common::failing_writer`).
#[test]
fn socket_filter_a_writer_that_keeps_failing_is_one_episode_per_prefix() {
    route_watch_common::failing_writer("socket_filter_a_writer_that_keeps_failing_is_one_episode_per_prefix", BACKEND);
}

/// Rule writes watched and named on this backend (`route_watch_common::rule_writes_named`).
#[test]
fn socket_filter_rule_writes_are_named_by_process() {
    route_watch_common::rule_writes_named("socket_filter_rule_writes_are_named_by_process", BACKEND);
}
