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
