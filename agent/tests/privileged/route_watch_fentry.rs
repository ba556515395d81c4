//! The route watch with the `fentry` backend forced: the shared scenarios of
//! `route_watch_common` (conflict between two writers, S01, S11, cold start, ring overflow).
//! Each runs in its own network namespace; a kernel that cannot run this backend skips with
//! the reason (this host: fentry EPERM, no kprobes; the QEMU lane runs them).

mod route_watch_common;

use routewarden::bpf::route_watch::RouteWatchBackend;

const BACKEND: RouteWatchBackend = RouteWatchBackend::Fentry;

#[test]
fn fentry_two_writers_conflict_and_flap_clears() {
    route_watch_common::fight("fentry_two_writers_conflict_and_flap_clears", BACKEND);
}

#[test]
fn fentry_a_route_through_a_nexthop_object_fights_like_any_other() {
    route_watch_common::fight_through_nexthop("fentry_a_route_through_a_nexthop_object_fights_like_any_other", BACKEND);
}

#[test]
fn fentry_s01_same_protocol_two_processes() {
    route_watch_common::s01("fentry_s01_same_protocol_two_processes", BACKEND);
}

#[test]
fn fentry_s11_link_flush_is_not_a_conflict() {
    route_watch_common::s11("fentry_s11_link_flush_is_not_a_conflict", BACKEND);
}

#[test]
fn fentry_cold_start_10k_routes_is_quiet() {
    route_watch_common::cold_start("fentry_cold_start_10k_routes_is_quiet", BACKEND);
}

#[test]
fn fentry_ring_overflow_is_counted() {
    route_watch_common::ring_overflow("fentry_ring_overflow_is_counted", BACKEND);
}

#[test]
fn fentry_ring_full_is_logged_through_aya_log() {
    route_watch_common::ring_full_is_logged("fentry_ring_full_is_logged_through_aya_log", BACKEND);
}

#[test]
fn fentry_a_v6_route_through_a_nexthop_object_rewritten_is_no_flap() {
    route_watch_common::v6_through_nexthop_rewritten("fentry_a_v6_route_through_a_nexthop_object_rewritten_is_no_flap", BACKEND);
}

#[test]
fn fentry_switching_nexthop_objects_with_one_gateway_is_a_flap() {
    route_watch_common::switching_nexthop_objects_is_a_flap("fentry_switching_nexthop_objects_with_one_gateway_is_a_flap", BACKEND);
}

#[test]
fn fentry_a_nexthop_replace_is_not_a_route_write() {
    route_watch_common::a_nexthop_replace_is_not_a_route_write("fentry_a_nexthop_replace_is_not_a_route_write", BACKEND);
}

/// Every writer named and classed by its process (`route_watch_common::writers_named_by_process`).
#[test]
fn fentry_writers_are_named_and_classed_by_process() {
    route_watch_common::writers_named_by_process("fentry_writers_are_named_and_classed_by_process", BACKEND, true);
}

/// A writer whose writes keep being refused (`route_watch_common::failing_writer`).
#[test]
fn fentry_a_writer_that_keeps_failing_is_one_episode_per_prefix() {
    route_watch_common::failing_writer("fentry_a_writer_that_keeps_failing_is_one_episode_per_prefix", BACKEND);
}

/// Rule writes watched and named on this backend (`route_watch_common::rule_writes_named`).
#[test]
fn fentry_rule_writes_are_named_by_process() {
    route_watch_common::rule_writes_named("fentry_rule_writes_are_named_by_process", BACKEND);
}
