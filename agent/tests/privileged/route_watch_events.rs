//! `routewarden events -o json`: the library function streams every write with its writer and
//! verdict, one JSON object per line, in the calling thread's network namespace.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use routewarden::bpf::route_watch::events_stream::{stream_events_with, EventsFormat, EventsOptions};
use routewarden_lab::{skip_unless_root, NetNsGuard};

/// The stream's output, shared with the test while the stream runs.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl Shared {
    /// The complete lines written so far, parsed.
    fn events(&self) -> Vec<serde_json::Value> {
        let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        text.lines().map(|l| serde_json::from_str(l).expect("one JSON object per line")).collect()
    }
}

impl Write for Shared {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Write events of `dst` in `events`.
fn writes_of<'a>(events: &'a [serde_json::Value], dst: &str) -> Vec<&'a serde_json::Value> {
    events.iter().filter(|v| v["event"] == "write" && v["route"]["dst"] == dst).collect()
}

/// `ip route replace` by `ip` run as `program_name` (`calico-node`, `bird`: the class the
/// watch gives its writes).
async fn ip_route_replace(program_name: &str, dst: &str, proto: &str) {
    let st = tokio::process::Command::new(routewarden_lab::program_named("ip", program_name))
        .args(["route", "replace", dst, "via", "10.0.0.12", "dev", "veth0", "proto", proto, "metric", "1024"])
        .status()
        .await
        .unwrap();
    assert!(st.success());
}

#[test]
fn events_json_streams_writes_and_conflicts() {
    if skip_unless_root("events_json_streams_writes_and_conflicts") {
        return;
    }
    let Some(object) = routewarden::bpf::embedded_object() else {
        routewarden_lab::skip("events_json_streams_writes_and_conflicts", format_args!("built without the BPF object; `cargo xtask test` embeds it"));
        return;
    };
    let ns = NetNsGuard::new().unwrap();
    ns.ip(&["link", "add", "veth0", "type", "veth", "peer", "name", "veth1"]).unwrap();
    ns.ip(&["addr", "add", "10.0.0.11/24", "dev", "veth0"]).unwrap();
    ns.ip(&["link", "set", "veth0", "up"]).unwrap();
    ns.ip(&["link", "set", "veth1", "up"]).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let out = Shared::default();
    // Stopped by SIGTERM once everything is seen (below); the duration is only a backstop.
    let opts = EventsOptions {
        format: EventsFormat::Json,
        window: Duration::from_secs(5),
        self_protocol: 80,
        duration: Some(Duration::from_mins(1)),
        ..EventsOptions::default()
    };
    let deadline = Duration::from_secs(20);
    let written = rt.block_on(async {
        let seen = out.clone();
        let writer = tokio::spawn(async move {
            // Until the stream shows a write, the watch may not be attached yet: write a
            // route of another prefix until one is seen.
            let started = Instant::now();
            while writes_of(&seen.events(), "10.244.99.0/26").is_empty() {
                assert!(started.elapsed() < deadline, "the stream showed no write within {deadline:?}");
                ip_route_replace("calico-node", "10.244.99.0/26", "80").await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            eprintln!("route watch streaming {:?} after the start", started.elapsed());
            // Felix's, BIRD's, Felix's, BIRD's: four writes and a conflict for one prefix.
            for (name, proto) in [("calico-node", "80"), ("bird", "12"), ("calico-node", "80"), ("bird", "12")] {
                ip_route_replace(name, "10.244.20.0/26", proto).await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let started = Instant::now();
            loop {
                let events = seen.events();
                let conflict = events.iter().any(|v| v["event"] == "conflict" && v["route"]["dst"] == "10.244.20.0/26");
                if writes_of(&events, "10.244.20.0/26").len() >= 4 && conflict {
                    break;
                }
                assert!(started.elapsed() < deadline, "not every write and the conflict within {deadline:?}: {events:#?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // The stream ends on SIGTERM (as `routewarden events` does under a supervisor).
            nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGTERM).unwrap();
        });
        let n = stream_events_with(object, &opts, out.clone()).await.expect("stream");
        writer.await.unwrap();
        n
    });
    let lines = out.events();
    assert_eq!(lines.len(), written);
    let writes = writes_of(&lines, "10.244.20.0/26");
    assert_eq!(writes.len(), 4, "{lines:#?}");
    // The socket filter reports the outcome (the kernel's notification says the replace
    // created the route); fentry/kprobe see the request, whose flags say replace.
    assert!(writes[0]["route"]["op"] == "add" || writes[0]["route"]["op"] == "replace", "{:?}", writes[0]);
    let later_ops: Vec<&str> = writes[1..].iter().map(|w| w["route"]["op"].as_str().unwrap()).collect();
    assert_eq!(later_ops, ["replace", "replace", "replace"], "{writes:#?}");
    let writer_of: Vec<(&str, u64, &str, bool, bool)> = writes
        .iter()
        .map(|w| {
            let w = &w["route"]["writer"];
            (
                w["class"].as_str().unwrap(),
                w["protocol"].as_u64().unwrap(),
                w["comm"].as_str().unwrap(),
                w["pid"].is_u64(),
                w["class_inferred"].as_bool().unwrap(),
            )
        })
        .collect();
    // Each writer named by its process, with its pid, and classed by it (not this process:
    // never `self`).
    assert_eq!(
        writer_of,
        [
            ("felix", 80, "calico-node", true, false),
            ("bird", 12, "bird", true, false),
            ("felix", 80, "calico-node", true, false),
            ("bird", 12, "bird", true, false)
        ],
        "{writes:#?}"
    );
    assert!(writes.iter().all(|w| w["route"]["gateway"] == "10.0.0.12" && w["route"]["metric"] == 1024 && w["route"]["table"] == 254), "{writes:#?}");
    // The conflict starts at BIRD's first overwrite of the protocol-80 route: two writes in the window.
    let conflicts: Vec<&serde_json::Value> = lines.iter().filter(|v| v["event"] == "conflict" && v["route"]["dst"] == "10.244.20.0/26").collect();
    assert_eq!(conflicts.len(), 1, "{lines:#?}");
    let c = conflicts[0];
    assert_eq!((c["route"]["writer"]["class"].as_str(), c["route"]["writer"]["protocol"].as_u64()), (Some("bird"), Some(12)), "{c:#}");
    assert_eq!((c["previous"]["class"].as_str(), c["previous"]["protocol"].as_u64()), (Some("felix"), Some(80)), "{c:#}");
    assert_eq!(c["writes_in_window"], 2, "{c:#}");
    drop(ns);
}
