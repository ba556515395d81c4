//! The route watch with the `kprobe` backend forced: the shared scenarios of
//! `route_watch_common` (conflict between two writers, S01, S11, cold start, ring overflow).
//! Each runs in its own network namespace; a kernel that cannot run this backend skips with
//! the reason (this host: fentry EPERM, no kprobes; the QEMU lane runs them).

mod route_watch_common;

use routewarden::bpf::route_watch::RouteWatchBackend;

const BACKEND: RouteWatchBackend = RouteWatchBackend::Kprobe;

#[test]
fn kprobe_two_writers_conflict_and_flap_clears() {
    route_watch_common::fight("kprobe_two_writers_conflict_and_flap_clears", BACKEND);
}

#[test]
fn kprobe_a_route_through_a_nexthop_object_fights_like_any_other() {
    route_watch_common::fight_through_nexthop("kprobe_a_route_through_a_nexthop_object_fights_like_any_other", BACKEND);
}

#[test]
fn kprobe_s01_same_protocol_two_processes() {
    route_watch_common::s01("kprobe_s01_same_protocol_two_processes", BACKEND);
}

#[test]
fn kprobe_s11_link_flush_is_not_a_conflict() {
    route_watch_common::s11("kprobe_s11_link_flush_is_not_a_conflict", BACKEND);
}

#[test]
fn kprobe_cold_start_10k_routes_is_quiet() {
    route_watch_common::cold_start("kprobe_cold_start_10k_routes_is_quiet", BACKEND);
}

#[test]
fn kprobe_ring_overflow_is_counted() {
    route_watch_common::ring_overflow("kprobe_ring_overflow_is_counted", BACKEND);
}

#[test]
fn kprobe_ring_full_is_logged_through_aya_log() {
    route_watch_common::ring_full_is_logged("kprobe_ring_full_is_logged_through_aya_log", BACKEND);
}

#[test]
fn kprobe_a_v6_route_through_a_nexthop_object_rewritten_is_no_flap() {
    route_watch_common::v6_through_nexthop_rewritten("kprobe_a_v6_route_through_a_nexthop_object_rewritten_is_no_flap", BACKEND);
}

#[test]
fn kprobe_switching_nexthop_objects_with_one_gateway_is_a_flap() {
    route_watch_common::switching_nexthop_objects_is_a_flap("kprobe_switching_nexthop_objects_with_one_gateway_is_a_flap", BACKEND);
}

#[test]
fn kprobe_a_nexthop_replace_is_not_a_route_write() {
    route_watch_common::a_nexthop_replace_is_not_a_route_write("kprobe_a_nexthop_replace_is_not_a_route_write", BACKEND);
}

/// Every writer named and classed by its process (`route_watch_common::writers_named_by_process`).
#[test]
fn kprobe_writers_are_named_and_classed_by_process() {
    route_watch_common::writers_named_by_process("kprobe_writers_are_named_and_classed_by_process", BACKEND, true);
}

/// A writer whose writes keep being refused (`route_watch_common::failing_writer`).
#[test]
fn kprobe_a_writer_that_keeps_failing_is_one_episode_per_prefix() {
    route_watch_common::failing_writer("kprobe_a_writer_that_keeps_failing_is_one_episode_per_prefix", BACKEND);
}

/// Rule writes watched and named on this backend (`route_watch_common::rule_writes_named`).
#[test]
fn kprobe_rule_writes_are_named_by_process() {
    route_watch_common::rule_writes_named("kprobe_rule_writes_are_named_by_process", BACKEND);
}
