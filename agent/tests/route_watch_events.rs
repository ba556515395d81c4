//! `routewarden events -o json`: the library function streams every write with its writer and
//! verdict, one JSON object per line, in the calling thread's network namespace.

use std::time::Duration;

use routewarden::bpf::route_watch::events_cmd::{stream_events_with, EventsFormat, EventsOptions};
use routewarden_lab::{skip_unless_root, NetNsGuard};

#[test]
fn events_json_streams_writes_and_conflicts() {
    if skip_unless_root("events_json_streams_writes_and_conflicts") {
        return;
    }
    let Some(object) = routewarden::bpf::embedded_object() else {
        eprintln!("SKIPPED events_json_streams_writes_and_conflicts: built without the BPF object; `cargo xtask test` embeds it");
        return;
    };
    let ns = NetNsGuard::new().unwrap();
    ns.ip(&["link", "add", "veth0", "type", "veth", "peer", "name", "veth1"]).unwrap();
    ns.ip(&["addr", "add", "10.0.0.11/24", "dev", "veth0"]).unwrap();
    ns.ip(&["link", "set", "veth0", "up"]).unwrap();
    ns.ip(&["link", "set", "veth1", "up"]).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut out = Vec::new();
    let opts = EventsOptions {
        format: EventsFormat::Json,
        window: Duration::from_secs(5),
        self_protocol: 80,
        duration: Some(Duration::from_secs(3)),
        ..EventsOptions::default()
    };
    let written = rt.block_on(async {
        let writer = tokio::spawn(async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            for proto in ["80", "12", "80", "12"] {
                let st = tokio::process::Command::new("ip")
                    .args(["route", "replace", "10.244.20.0/26", "via", "10.0.0.12", "dev", "veth0", "proto", proto, "metric", "1024"])
                    .status()
                    .await
                    .unwrap();
                assert!(st.success());
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        let n = stream_events_with(object, &opts, &mut out).await.expect("stream");
        writer.await.unwrap();
        n
    });
    let lines: Vec<serde_json::Value> = String::from_utf8(out).unwrap().lines().map(|l| serde_json::from_str(l).expect("one JSON object per line")).collect();
    assert_eq!(lines.len(), written);
    let writes: Vec<_> = lines.iter().filter(|v| v["event"] == "write" && v["route"]["dst"] == "10.244.20.0/26").collect();
    assert_eq!(writes.len(), 4, "{lines:#?}");
    // The socket filter reports the outcome (the kernel's notification says the replace
    // created the route); fentry/kprobe see the request, whose flags say replace.
    assert!(writes[0]["route"]["op"] == "add" || writes[0]["route"]["op"] == "replace", "{:?}", writes[0]);
    assert_eq!(writes[1]["route"]["op"], "replace");
    assert_eq!(writes[1]["route"]["writer"]["class"], "bird");
    assert_eq!(writes[0]["route"]["writer"]["class"], "self");
    assert_eq!(writes[0]["route"]["gateway"], "10.0.0.12");
    let conflict = lines.iter().find(|v| v["event"] == "conflict").expect("a conflict event");
    assert_eq!(conflict["route"]["dst"], "10.244.20.0/26");
    assert!(conflict["previous"]["protocol"].is_u64());
    drop(ns);
}
