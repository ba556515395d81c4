//! The guest's `/init`: mount what the tests need, load the modules, run each test binary with
//! the guest's environment and mark its start and exit on the console for [`super::report`].

use std::fmt::Write as _;
use std::path::PathBuf;

use super::{AGENT_ENV, EXAMPLE_CLUSTER_ENV, GUEST_AGENT, GUEST_ENV, GUEST_EXAMPLE_CLUSTER};

/// For iterating on one test locally: `ROUTEWARDEN_QEMU_ONLY=<binary>[:<filter>],...` boots
/// the guest with only those test binaries, each given its test-name filter
/// (`route_watch_fentry:failing,route_watch_kprobe:failing`). Unset (CI), every binary of
/// [`GUEST_TESTS`] runs whole. A lane run this way says so in its first line.
const ONLY_ENV: &str = "ROUTEWARDEN_QEMU_ONLY";

/// The binaries and filters `ONLY_ENV` names (`None`: unset, run everything).
fn only() -> Option<Vec<(String, String)>> {
    let v = std::env::var(ONLY_ENV).ok().filter(|v| !v.trim().is_empty())?;
    Some(
        v.split(',')
            .map(|item| {
                let (bin, filter) = item.split_once(':').unwrap_or((item, ""));
                (bin.trim().to_owned(), filter.trim().to_owned())
            })
            .collect(),
    )
}

pub(super) fn init_script(tests: &[(String, PathBuf)], modules: &[String]) -> String {
    let only = only();
    if let Some(o) = &only {
        eprintln!("qemu lane: {ONLY_ENV} set: running only {o:?}");
    }
    let mut s = String::from(
        "#!/bin/sh\n\
         export PATH=/bin:/sbin:/usr/bin:/usr/sbin\n\
         mkdir -p /proc /sys /dev /tmp /run\n\
         mount -t proc proc /proc\n\
         mount -t sysfs sys /sys\n\
         mount -t devtmpfs dev /dev\n\
         mount -t tmpfs tmp /tmp\n\
         mount -t tmpfs run /run\n\
         mount -t bpf bpf /sys/fs/bpf\n\
         mount -t debugfs debugfs /sys/kernel/debug\n\
         mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null\n",
    );
    for m in modules {
        let _ = writeln!(s, "insmod /lib/modules/{m}.ko || echo RW-LANE-MODULE-FAILED {m}");
    }
    s.push_str("ip link set lo up\necho RW-LANE-READY $(uname -r)\n");
    for (name, _) in tests {
        let filter = match &only {
            None => String::new(),
            Some(o) => match o.iter().find(|(b, _)| b == name) {
                Some((_, f)) if !f.is_empty() => format!("{f} "),
                Some(_) => String::new(),
                None => continue,
            },
        };
        let _ = write!(
            s,
            "echo RW-LANE-BEGIN {name}\n\
             {GUEST_ENV}=1 {AGENT_ENV}={GUEST_AGENT} {EXAMPLE_CLUSTER_ENV}={GUEST_EXAMPLE_CLUSTER} ROUTEWARDEN_REQUIRE_BACKENDS=fentry,kprobe,socket-filter RUST_BACKTRACE=0 /tests/{name} {filter}--test-threads=1 --nocapture 2>&1\n\
             echo RW-LANE-EXIT {name} $?\n"
        );
    }
    s.push_str("echo RW-LANE-DONE\npoweroff -f\n");
    s
}
