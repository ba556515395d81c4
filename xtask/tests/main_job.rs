//! The main job (`cargo xtask run`) tells its story: the second writer's fight is caught by the
//! in-kernel watch (exact events and counters, from the job's `--summary`), the agent puts its
//! route back, the watch goes quiet, the forwarding watch counts the probes per pool and path,
//! and Ctrl-C removes the lab.
//!
//! Runs the xtask binary with the agent binary the workspace's test build made
//! (`target/debug/routewarden`, with the BPF object embedded under `cargo xtask test`), so no
//! release build happens here.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn agent_bin() -> PathBuf {
    let xtask = PathBuf::from(env!("CARGO_BIN_EXE_xtask"));
    let bin = xtask.with_file_name("routewarden");
    assert!(bin.exists(), "{} is missing: run this under `cargo xtask test` (cargo test --workspace builds it)", bin.display());
    bin
}

fn netns_list() -> String {
    String::from_utf8(Command::new("ip").args(["netns", "list"]).output().unwrap().stdout).unwrap()
}

#[test]
fn the_main_job_shows_a_fight_caught_and_ctrl_c_removes_the_lab() {
    if routewarden_lab::skip_unless_root("the_main_job_shows_a_fight_caught_and_ctrl_c_removes_the_lab") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let summary = dir.path().join("summary.json");
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["run", "--fight-seconds", "3", "--agent-bin"])
        .arg(agent_bin())
        .arg("--summary")
        .arg(&summary)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    // The lab's tag, from stderr ("lab: namespaces <tag>-*, agent runs in ...").
    let stderr = child.stderr.take().unwrap();
    let (tag_tx, tag_rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("xtask: {line}");
            if let Some(rest) = line.strip_prefix("lab: namespaces ") {
                let _ = tag_tx.send(rest.split("-*").next().unwrap_or_default().to_owned());
            }
        }
    });
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // Wait for the end of the story (the job then idles until Ctrl-C).
    let mut out = Vec::new();
    loop {
        assert!(started.elapsed() < Duration::from_mins(2), "the story did not end within 120 s:\n{}", out.join("\n"));
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(line) => {
                let done = line.contains("Ctrl-C stops it and removes the lab.");
                out.push(line);
                if done {
                    break;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => panic!("xtask run ended early:\n{}", out.join("\n")),
        }
    }
    let story = started.elapsed();
    let tag = tag_rx.recv_timeout(Duration::from_secs(1)).expect("the lab's tag on stderr");
    assert!(netns_list().contains(&format!("{tag}-node-a")), "the lab exists while the job runs");
    // Ctrl-C: the job stops the agent and removes the lab.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()), nix::sys::signal::Signal::SIGINT).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(!netns_list().contains(&tag), "the lab is gone after Ctrl-C:\n{}", netns_list());
    eprintln!("the story took {story:?}");

    let text = out.join("\n");
    for section in [
        "=== 1. Who programs what on node-a",
        "=== 2. A second writer fights routewarden over",
        "=== 3. Traffic to every remote block",
        "=== 4. Where to look next ===",
    ] {
        assert!(text.contains(section), "missing {section:?}:\n{text}");
    }
    let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    // The first tunnel /26 of routewarden's on node-a: node-d's block of the CrossSubnet pool,
    // fought over via node-b's address.
    assert_eq!((s["target"].as_str(), s["second_writer_gateway"].as_str()), (Some("10.244.40.0/26"), Some("10.0.0.12")), "{s}");
    // A 3 s fight inside one 5 s window: one conflict episode and one flap (the detector
    // reports one of each per prefix and window), both naming the two writers.
    let events: Vec<&str> = s["events"].as_array().unwrap().iter().map(|e| e.as_str().unwrap()).collect();
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(events[0].starts_with("CONFLICT replace 10.244.40.0/26 table 254 metric 1024 via 10.0.1.14 oif "), "{events:?}");
    // The second writer, short-lived, is named by its process in the kernel: `ip` run as
    // `bird`, classed `bird` by that name.
    let over = events[0].split(") over bird(proto 12, ").nth(1).unwrap_or_default();
    assert!(events[0].contains(" by self(proto 80, routewarden[") && over.starts_with("bird["), "{events:?}");
    assert!(events[0].ends_with("(2 writes in window)"), "{events:?}");
    assert!(events[1].starts_with("FLAP     replace 10.244.40.0/26 table 254 metric 1024 via 10.0.1.14 oif "), "{events:?}");
    assert!(events[1].contains(" by self(proto 80, routewarden[") && events[1].ends_with("(3 changes in window)"), "{events:?}");
    // The agent's own counters agree with the events; every foreign write (one each 500 ms for
    // 3 s) was seen by the watch and counted.
    assert_eq!((s["conflicts_total"].as_f64(), s["flaps_total"].as_f64(), s["flapping_peak"].as_f64()), (Some(1.0), Some(1.0), Some(1.0)), "{s}");
    let foreign = s["foreign_writes"].as_u64().unwrap();
    assert!((6..=7).contains(&foreign), "{s}");
    assert_eq!(s["bird_writes"].as_f64(), Some(f64::from(u32::try_from(foreign).unwrap())), "{s}");
    // Put back, and quiet again within the window.
    assert!(s["put_back_after_ms"].as_u64().is_some_and(|ms| ms < 15_000), "{s}");
    assert!(s["quiet_after_ms"].as_u64().is_some_and(|ms| ms <= 20_000), "{s}");
    // 10 datagrams to each remote destination of routewarden's: three native (node-b's and
    // node-c's blocks and node-c's borrowed IP in the CrossSubnet pool), one CrossSubnet
    // tunnel (node-d), two IPIP Always tunnels.
    let fwd = &s["forwarded_packets"];
    let count = |pool: &str, path: &str| fwd[format!("routewarden_forwarded_packets_total{{pool=\"{pool}\",path=\"{path}\"}}")].as_f64();
    assert_eq!(
        [count("default-ipv4-ippool", "host"), count("default-ipv4-ippool", "tunnel"), count("ipip-always", "tunnel"), count("ipip-always", "host")],
        [Some(30.0), Some(10.0), Some(20.0), Some(0.0)],
        "{fwd}"
    );
}
