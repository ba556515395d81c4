//! The route watch with the `fentry` backend forced: the shared scenarios of
//! `route_watch_common` (conflict between two writers, S01, S11, cold start, ring overflow).
//! Each runs in its own network namespace; a kernel that cannot run this backend skips with
//! the reason (this host: fentry EPERM, no kprobes; the QEMU lane runs them).

mod route_watch_common;

use routewarden::bpf::route_watch::{RouteWatchBackend, RouteWatchConfig};

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

/// The probe that passes the fentry backend over before aya reads the kernel's BTF must
/// refuse only what the real load refuses. Where it refuses (this host: EPERM), aya's load of
/// the backend's first fexit program on its hooked function, with the kernel's BTF, must fail
/// with the same errno. Where it allows (the QEMU lane's stock kernel), the forced backend
/// must start, which `ROUTEWARDEN_REQUIRE_BACKENDS` makes every test of this binary demand.
#[test]
fn the_tracing_probe_refuses_only_what_the_real_load_refuses() {
    use routewarden::bpf::BpfError;
    use routewarden_common::route_watch::{HOOKED_FUNCTIONS, PROGS_FENTRY};
    let test = "the_tracing_probe_refuses_only_what_the_real_load_refuses";
    if routewarden_lab::skip_unless_root(test) {
        return;
    }
    let Some(object) = routewarden::bpf::embedded_object() else {
        routewarden_lab::skip(test, format_args!("this test binary was built without the BPF object; `cargo xtask test` embeds it"));
        return;
    };
    // Both branches load BPF objects: inside a namespace of the test's own.
    let _ns = routewarden_lab::NetNsGuard::new().expect("netns (root needed)");
    match routewarden::bpf::route_watch::tracing_programs_allowed() {
        Ok(()) => {
            let started =
                routewarden::bpf::route_watch::RouteWatch::start(object, &RouteWatchConfig { backend: Some(BACKEND), ..route_watch_common::config() });
            assert!(started.is_ok(), "the probe allowed tracing programs, but the fentry backend failed: {:?}", started.err());
        }
        Err(BpfError::Refused { source, .. }) => {
            let probe_errno = source.raw_os_error();
            let btf = aya::Btf::from_sys_fs().expect("kernel BTF (the route watch needs it on every backend but the port-naming filter)");
            let mut ebpf = aya::EbpfLoader::new().load(object).expect("the object loads (maps and BTF)");
            let prog: &mut aya::programs::FExit = ebpf.program_mut(PROGS_FENTRY[0]).expect("fexit program").try_into().expect("fexit type");
            let err = prog.load(HOOKED_FUNCTIONS[0], &btf).expect_err("the probe refused tracing programs, but the real fexit load succeeded");
            let errno = match &err {
                aya::programs::ProgramError::LoadError { io_error, .. } => io_error.raw_os_error(),
                other => panic!("the real load failed otherwise than the probe ({probe_errno:?}): {other}"),
            };
            assert_eq!(errno, probe_errno, "the probe and the real load disagree: {err}");
        }
        Err(other) => panic!("the probe can only refuse: {other}"),
    }
}
