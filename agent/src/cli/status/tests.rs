//! The table and the verdict from documents, exactly as printed.

use routewarden::observe::status::{CalicoLine, ClassStatus, Episode, EpisodeWriter, OwnershipFinding, Readiness, StatusDocument, API_VERSION, KIND};

use super::render::{age, verdict, ClusterStatus, Heard, NodeStatus};
use super::table;

const NOW: u64 = 1_800_000_000;

fn doc(node: &str) -> StatusDocument {
    StatusDocument {
        api_version: API_VERSION.into(),
        kind: KIND.into(),
        node: node.into(),
        agent_version: "0.1.0".into(),
        generated_at: NOW,
        mode: "program".into(),
        role: "felix".into(),
        readiness: Readiness { ready: true, reasons: vec![] },
        calico: Some(CalicoLine { line: "3.30".into(), rules: "3.30".into(), source: "cluster-information".into(), detail: String::new() }),
        classes: vec![
            ClassStatus { class: "ipip".into(), writers: vec!["routewarden".into()], programmed_here: true, state: "consistent".into() },
            ClassStatus { class: "vxlan".into(), writers: vec!["felix".into()], programmed_here: false, state: "consistent".into() },
        ],
        ..StatusDocument::default()
    }
}

fn writer(class: &str, protocol: u8, pid: u32, comm: &str) -> EpisodeWriter {
    EpisodeWriter { class: class.into(), protocol, pid: Some(pid), comm: Some(comm.into()) }
}

fn episode(kind: &str, prefix: &str, last_seen: u64, count: u64, writers: Vec<EpisodeWriter>) -> Episode {
    Episode { kind: kind.into(), prefix: prefix.into(), table: 254, writers, first_seen: last_seen - 30, last_seen, count }
}

fn answered(doc: StatusDocument) -> NodeStatus {
    NodeStatus { node: doc.node.clone(), agent: Heard::Answered { pod: format!("routewarden-{}", doc.node), status: Box::new(doc) } }
}

fn fighting() -> StatusDocument {
    let mut d = doc("node-a");
    d.episodes = vec![
        episode("flap", "10.244.9.0/26", NOW - 5, 4, vec![writer("self", 80, 4242, "routewarden")]),
        episode("conflict", "10.244.1.0/26", NOW - 42, 6, vec![writer("bird", 12, 77, "bird"), writer("self", 80, 4242, "routewarden")]),
        episode("conflict", "10.244.2.0/26", NOW - 900, 1, vec![writer("felix", 80, 9, "calico-node"), writer("self", 80, 4242, "routewarden")]),
    ];
    d
}

#[test]
fn a_quiet_cluster_is_one_ok_line_under_its_rows() {
    let s = ClusterStatus::new(vec![answered(doc("node-b")), answered(doc("node-a"))], None);
    assert_eq!(
        table(&s),
        "\
NODE     READY   MODE      ROLE    CALICO   PROGRAMS   FINDINGS   CONFLICTS(1h)   FLAPS(1h)   LAST-FIGHT
node-a   yes     program   felix   3.30     ipip       -          0               0           -
node-b   yes     program   felix   3.30     ipip       -          0               0           -
ok: 2 nodes, no fights
"
    );
    assert!(s.ok);
}

#[test]
fn a_fight_a_silent_agent_and_a_node_without_one_each_say_so() {
    let mut quiet = doc("node-b");
    quiet.mode = "audit".into();
    quiet.role = "audit".into();
    quiet.calico = Some(CalicoLine { line: "3.33".into(), rules: "3.33".into(), source: "assumed".into(), detail: String::new() });
    quiet.classes.clear();
    quiet.findings = vec![OwnershipFinding { code: "version-assumed".into(), severity: "warning".into(), class: None, message: String::new() }];
    let rows = vec![
        NodeStatus { node: "node-d".into(), agent: Heard::NoAgent },
        NodeStatus {
            node: "node-c".into(),
            agent: Heard::NoAnswer {
                pod: "routewarden-c".into(),
                reason: "error trying to reach service: dial tcp 10.0.0.13:9695: connect: connection refused (503 ServiceUnavailable)".into(),
            },
        },
        answered(quiet),
        answered(fighting()),
    ];
    let s = ClusterStatus::new(rows, None);
    assert_eq!(
        table(&s),
        "\
NODE     READY   MODE      ROLE    CALICO           PROGRAMS   FINDINGS          CONFLICTS(1h)   FLAPS(1h)   LAST-FIGHT
node-a   yes     program   felix   3.30             ipip       -                 7               4           bird[77] vs routewarden[4242] 10.244.1.0/26 42s ago
node-b   yes     audit     audit   3.33 (assumed)   -          version-assumed   0               0           -
node-c   ?       no answer: error trying to reach service: dial tcp 10.0.0.13:9695: connect: connection refused (503 ServiceUnavailable)
node-d   -       no agent pod on this node
2 of 4 nodes answer (no answer: node-c; no agent: node-d); node-a: bird[77] vs routewarden[4242] fight over 10.244.1.0/26
"
    );
    assert!(!s.ok);
}

#[test]
fn the_json_keeps_every_document_and_says_which_did_not_answer() {
    let rows = vec![answered(doc("node-a")), NodeStatus { node: "node-d".into(), agent: Heard::NoAgent }];
    let s = ClusterStatus::new(rows, Some("list nodes: forbidden (403 Forbidden)".into()));
    let v = serde_json::to_value(&s).unwrap();
    assert_eq!(v["apiVersion"], "routewarden.io/v1");
    assert_eq!(v["kind"], "ClusterStatus");
    assert_eq!(v["ok"], false);
    assert_eq!(v["verdict"], "1 of 2 nodes answer (no agent: node-d)");
    assert_eq!(v["nodesUnlisted"], "list nodes: forbidden (403 Forbidden)");
    assert_eq!(v["nodes"][0]["node"], "node-a");
    assert_eq!(v["nodes"][0]["state"], "answered");
    assert_eq!(v["nodes"][0]["pod"], "routewarden-node-a");
    assert_eq!(v["nodes"][0]["status"], serde_json::to_value(doc("node-a")).unwrap());
    assert_eq!(v["nodes"][1], serde_json::json!({"node": "node-d", "state": "noAgent"}));
}

#[test]
fn verdict_names_unready_agents_error_findings_and_flaps_and_bounds_its_length() {
    let mut unready = doc("node-a");
    unready.readiness = Readiness { ready: false, reasons: vec!["datastore: not synced".into()] };
    unready.findings =
        vec![OwnershipFinding { code: "double-programmed".into(), severity: "error".into(), class: Some("ipip".into()), message: String::new() }];
    let mut flapping = doc("node-b");
    flapping.episodes = vec![episode("flap", "10.244.9.0/26", NOW - 5, 4, vec![writer("other", 4, 5, "vpnd")])];
    assert_eq!(
        verdict(&ClusterStatus::new(vec![answered(unready), answered(flapping)], None).nodes),
        (false, "node-a: not ready; node-a: double-programmed ipip; node-b: vpnd[5] flap on 10.244.9.0/26".to_owned())
    );
    let silent: Vec<NodeStatus> =
        (0..6).map(|i| NodeStatus { node: format!("node-{i}"), agent: Heard::NoAnswer { pod: format!("p{i}"), reason: "x".into() } }).collect();
    assert_eq!(verdict(&silent), (false, "0 of 6 nodes answer (no answer: node-0, node-1, node-2 +3 more)".to_owned()));
    assert_eq!(verdict(&[]), (false, "no agent pods and no nodes found".to_owned()));
    assert_eq!(verdict(&[answered(doc("node-a"))]), (true, "ok: 1 node, no fights".to_owned()));
}

#[test]
fn text_from_agents_cannot_repaint_the_terminal() {
    let mut d = fighting();
    d.node = "node-a".into();
    d.episodes[1].writers[0].comm = Some("bi\u{1b}[2Jrd".into());
    let s = ClusterStatus::new(vec![answered(d)], None);
    let t = table(&s);
    assert!(!t.contains('\u{1b}'), "{t}");
    assert!(t.contains("bi\\u{1b}[2Jrd[77] vs routewarden[4242]"), "{t}");
}

#[test]
fn ages_are_whole_units() {
    assert_eq!([age(0), age(119), age(120), age(7199), age(7200)], ["0s", "119s", "2m", "119m", "2h"]);
}
