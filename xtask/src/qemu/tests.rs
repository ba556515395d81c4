//! The QEMU lane's plumbing without a guest: console parsing, verdicts, skips.

use super::*;

fn lines(s: &str) -> Vec<String> {
    s.lines().map(str::to_string).collect()
}

#[test]
fn parses_results_skips_and_crashes() {
    let ok = lines(
        "RW-LANE-READY 6.1.0\nRW-LANE-BEGIN a\nSKIPPED x: why\ntest result: ok. 4 passed; 0 failed; 0 ignored\nRW-LANE-EXIT a 0\n\
         RW-LANE-BEGIN b\ntest result: FAILED. 2 passed; 1 failed; 0 ignored\nRW-LANE-EXIT b 101\n\
         RW-LANE-BEGIN c\nSegmentation fault\nRW-LANE-EXIT c 139\nRW-LANE-DONE\n",
    );
    let s = parse_console(&ok);
    assert_eq!((s.passed, s.failed, s.skipped), (6, 2, 1));
    assert_eq!(s.failed_binaries, vec!["b", "c"]);
    assert_eq!(s.skips, vec![Skip { binary: "a".into(), test: "x".into(), reason: "why".into() }]);
}

/// A guest where everything passed but one test printed `SKIPPED` (after libtest's
/// `test <name> ... `, as with --nocapture).
fn passing_but_one_skip(reason: &str) -> Vec<String> {
    lines(&format!(
        "RW-LANE-READY 6.1.0\nRW-LANE-BEGIN route_detector\nrunning 2 tests\n\
         test fentry::lru_pressure ... SKIPPED fentry::lru_pressure: {reason}\nok\ntest fentry::same_writer ... ok\n\
         test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.00s\n\
         RW-LANE-EXIT route_detector 0\nRW-LANE-DONE\n"
    ))
}

#[test]
fn a_skip_fails_the_lane_unless_allowed_with_its_reason() {
    let s = parse_console(&passing_but_one_skip("the fentry backend cannot run on this kernel: EPERM"));
    assert_eq!((s.passed, s.failed, s.skipped), (2, 0, 1));
    assert_eq!(
        s.skips,
        vec![Skip {
            binary: "route_detector".into(),
            test: "fentry::lru_pressure".into(),
            reason: "the fentry backend cannot run on this kernel: EPERM".into()
        }]
    );
    let problems = s.problems(&[]);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("fentry::lru_pressure skipped in route_detector"), "{problems:?}");
    let allowed = [AllowedSkip { test: "fentry::lru_pressure", reason: "cannot run on this kernel", why: "test" }];
    assert!(s.problems(&allowed).is_empty(), "{:?}", s.problems(&allowed));
    // The same test skipping for another reason is not covered.
    let other = parse_console(&passing_but_one_skip("built without the BPF object"));
    assert_eq!(other.problems(&allowed).len(), 1);
    // Nor is another test skipping for the allowed reason.
    let elsewhere = [AllowedSkip { test: "kprobe::lru_pressure", reason: "cannot run on this kernel", why: "test" }];
    assert_eq!(s.problems(&elsewhere).len(), 1);
}

#[test]
fn a_failed_module_load_fails_the_lane() {
    let mut l = lines("insmod: can't insert '/lib/modules/ipip.ko': unknown symbol in module\nRW-LANE-MODULE-FAILED ipip\n");
    l.extend(passing_but_one_skip("x").into_iter().filter(|l| !l.contains("SKIPPED")));
    let s = parse_console(&l);
    assert_eq!((s.passed, s.failed, s.skipped), (2, 0, 0));
    assert_eq!(s.module_failures, vec!["ipip"]);
    assert_eq!(s.problems(ALLOWED_SKIPS), vec!["module ipip failed to load".to_string()]);
}

#[test]
fn a_clean_run_has_no_problems_and_an_empty_one_has() {
    let mut l = passing_but_one_skip("x");
    l.retain(|l| !l.contains("SKIPPED"));
    assert!(parse_console(&l).problems(ALLOWED_SKIPS).is_empty());
    let none = parse_console(&lines("RW-LANE-BEGIN a\ntest result: ok. 0 passed; 0 failed;\nRW-LANE-EXIT a 0\nRW-LANE-DONE\n"));
    assert_eq!(none.problems(ALLOWED_SKIPS), vec!["no test passed".to_string()]);
}

#[test]
fn builtin_modules_are_found_in_modules_builtin() {
    let list = "kernel/net/ipv4/tcp_cubic.ko\nkernel/drivers/net/veth.ko\n";
    assert!(is_builtin(list, "drivers/net/veth"));
    assert!(!is_builtin(list, "net/ipv4/ipip"));
    assert!(!is_builtin(list, "net/veth"));
}

#[test]
fn unfinished_guest_fails() {
    let s = parse_console(&lines("RW-LANE-BEGIN a\ntest result: ok. 1 passed; 0 failed;\n"));
    assert_eq!(s.failed, 1);
}

/// Every test binary gets the guest marker, the release agent's and the example cluster's
/// paths in the initramfs, and the backends it must be able to start.
#[test]
fn every_test_binary_runs_with_the_guest_environment() {
    let tests = [("route_detector".to_string(), PathBuf::from("/t/a")), ("agent_guest".to_string(), PathBuf::from("/t/b"))];
    let script = init_script(&tests, &["ipip".to_string()]);
    assert!(script.contains("insmod /lib/modules/ipip.ko || echo RW-LANE-MODULE-FAILED ipip\n"), "{script}");
    for (name, _) in &tests {
        let run: Vec<&str> = script.lines().filter(|l| l.contains(&format!("/tests/{name} "))).collect();
        assert_eq!(
            run,
            [format!(
                "ROUTEWARDEN_QEMU_GUEST=1 ROUTEWARDEN_AGENT_BINARY=/usr/bin/routewarden \
                 ROUTEWARDEN_EXAMPLE_CLUSTER=/usr/share/routewarden/examples/cluster \
                 ROUTEWARDEN_REQUIRE_BACKENDS=fentry,kprobe,socket-filter RUST_BACKTRACE=0 /tests/{name} --test-threads=1 --nocapture 2>&1"
            )]
        );
    }
    assert!(script.ends_with("echo RW-LANE-EXIT agent_guest $?\necho RW-LANE-DONE\npoweroff -f\n"), "{script}");
}

#[test]
fn finds_executable_in_cargo_json() {
    let l = r#"{"reason":"compiler-artifact","target":{"name":"bpf_tc_count"},"executable":"/x/target/debug/deps/bpf_tc_count-1"}"#;
    assert_eq!(json_str(l, "executable"), Some("/x/target/debug/deps/bpf_tc_count-1"));
}
