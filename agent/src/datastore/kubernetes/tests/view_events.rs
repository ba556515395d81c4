//! The view fed watcher events directly (no API server): what is parsed ([`View::parses`]),
//! what makes a snapshot, and when a list replaces the last one.

use kube::runtime::watcher::{self, Event};
use serde_json::{json, Value as Json};

use super::super::resources::CalicoGroup;
use super::super::view::View;
use super::trimmed_decode::decode;
use super::{block, node, pool};
use crate::datastore::{DatastoreEvent, Snapshot};
use crate::model::Kind;

/// A view of the CRD v1 resources (no optional source) and the index of each kind's watcher.
struct Fed {
    view: View,
}

impl Fed {
    /// Every resource listed with `objects` (kind, object JSON), then one flush: the first
    /// snapshot and `Synced`.
    fn listed(objects: &[(Kind, Json)]) -> (Fed, Snapshot) {
        let mut fed = Fed { view: View::new(CalicoGroup::CrdV1, &[]) };
        let kinds: Vec<Kind> = fed.view.targets().iter().map(|t| t.kind).collect();
        for kind in kinds {
            fed.send(kind, Event::Init);
            for (_, o) in objects.iter().filter(|(k, _)| *k == kind) {
                fed.send(kind, Event::InitApply(decode(kind, o)));
            }
            fed.send(kind, Event::InitDone);
        }
        let out = fed.view.flush();
        let [DatastoreEvent::Snapshot(s), DatastoreEvent::Synced] = &out[..] else { panic!("expected a snapshot and Synced: {out:?}") };
        let s = s.clone();
        (fed, s)
    }

    fn index(&self, kind: Kind) -> usize {
        self.view.targets().iter().position(|t| t.kind == kind).unwrap()
    }

    fn send(&mut self, kind: Kind, event: Event<super::super::trimmed::TrimmedObject>) -> Vec<DatastoreEvent> {
        let index = self.index(kind);
        self.view.apply(index, Ok(event))
    }

    fn apply(&mut self, kind: Kind, obj: &Json) -> Vec<DatastoreEvent> {
        self.send(kind, Event::Apply(decode(kind, obj)))
    }

    /// The flush's one snapshot (panics on anything else).
    fn snapshot(&mut self) -> Snapshot {
        let out = self.view.flush();
        let [DatastoreEvent::Snapshot(s)] = &out[..] else { panic!("expected one snapshot: {out:?}") };
        s.clone()
    }
}

fn addrs() -> Json {
    json!([{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": "a"}])
}

#[test]
fn a_node_heartbeat_is_never_parsed_and_makes_no_snapshot_while_an_annotation_change_does() {
    let ann = json!({"projectcalico.org/IPv4Address": "10.0.0.1/24"});
    let (mut fed, s) = Fed::listed(&[(Kind::Node, node("a", "5", &ann, &addrs())), (Kind::IpPool, pool("p", "1", "10.244.0.0/16"))]);
    assert_eq!(s.cluster.nodes["a"].bgp_ipv4.unwrap().to_string(), "10.0.0.1/24");
    assert_eq!((fed.view.parses, fed.view.parse_failures), (2, 0));

    // Heartbeats: new resourceVersion, conditions, a foreign annotation; nothing the model reads.
    for rv in 6..106 {
        let mut beat = node("a", &rv.to_string(), &json!({"projectcalico.org/IPv4Address": "10.0.0.1/24", "other/annotation": rv.to_string()}), &addrs());
        beat["status"]["conditions"][0]["lastHeartbeatTime"] = json!(format!("2026-01-01T00:{:02}:00Z", rv % 60));
        assert_eq!(fed.apply(Kind::Node, &beat), vec![]);
        assert!(!fed.view.is_dirty(), "a heartbeat leaves the view clean (no flush is scheduled)");
    }
    assert_eq!(fed.view.parses, 2, "no heartbeat was parsed");
    assert_eq!(fed.view.flush(), vec![], "no snapshot");

    // An annotation the model reads: parsed once, one snapshot.
    let moved = node("a", "200", &json!({"projectcalico.org/IPv4Address": "10.0.1.1/24"}), &addrs());
    assert_eq!(fed.apply(Kind::Node, &moved), vec![]);
    assert!(fed.view.is_dirty());
    assert_eq!(fed.view.parses, 3);
    let s = fed.snapshot();
    assert_eq!(s.cluster.nodes["a"].bgp_ipv4.unwrap().to_string(), "10.0.1.1/24");
    // The same version delivered again (a resumed watch): not parsed, nothing sent.
    fed.apply(Kind::Node, &moved);
    assert_eq!((fed.view.parses, fed.view.flush()), (3, vec![]));
    // An address change is a change too.
    let readdressed = node("a", "201", &json!({"projectcalico.org/IPv4Address": "10.0.1.1/24"}), &json!([{"type": "InternalIP", "address": "10.0.0.9"}]));
    fed.apply(Kind::Node, &readdressed);
    assert_eq!(fed.view.parses, 4);
    assert_eq!(fed.snapshot().cluster.nodes["a"].addresses.iter().map(|a| a.address.to_string()).collect::<Vec<_>>(), vec!["10.0.0.9"]);
}

#[test]
fn a_malformed_object_keeps_its_last_good_version_and_names_kind_name_and_field() {
    let ann = json!({"projectcalico.org/IPv4Address": "10.0.0.1/24"});
    let (mut fed, _) = Fed::listed(&[(Kind::Node, node("a", "5", &ann, &addrs())), (Kind::IpPool, pool("pool-a", "1", "10.244.0.0/16"))]);
    fed.apply(Kind::IpPool, &pool("pool-a", "2", "10.0.0/8"));
    fed.apply(Kind::Node, &node("a", "6", &json!({"projectcalico.org/IPv4Address": "banana"}), &addrs()));
    assert_eq!((fed.view.parses, fed.view.parse_failures), (4, 2));
    let s = fed.snapshot();
    assert_eq!(s.cluster.ip_pools["pool-a"].cidr.to_string(), "10.244.0.0/16");
    assert_eq!(s.cluster.nodes["a"].bgp_ipv4.unwrap().to_string(), "10.0.0.1/24");
    assert_eq!(
        s.object_errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
        vec![
            "ippools.crd.projectcalico.org/pool-a: IPPool \"pool-a\": spec.cidr: invalid CIDR \"10.0.0/8\" (its last good version is kept)",
            "nodes/a: Node \"a\": metadata.annotations[projectcalico.org/IPv4Address]: invalid CIDR \"banana\" (its last good version is kept)",
        ]
    );
    // The same bad content again (a heartbeat of the broken node): not parsed again, still listed.
    let mut beat = node("a", "7", &json!({"projectcalico.org/IPv4Address": "banana"}), &addrs());
    beat["status"]["conditions"][0]["lastHeartbeatTime"] = json!("2026-01-01T00:09:00Z");
    fed.apply(Kind::Node, &beat);
    assert_eq!((fed.view.parses, fed.view.parse_failures, fed.view.flush()), (4, 2, vec![]));
    // Fixed: the new version replaces the last good one and the errors go.
    fed.apply(Kind::IpPool, &pool("pool-a", "3", "10.250.0.0/16"));
    fed.apply(Kind::Node, &node("a", "8", &json!({"projectcalico.org/IPv4Address": "10.0.0.2/24"}), &addrs()));
    let s = fed.snapshot();
    assert_eq!(
        (s.cluster.ip_pools["pool-a"].cidr.to_string(), s.cluster.nodes["a"].bgp_ipv4.unwrap().to_string(), s.object_errors.len()),
        ("10.250.0.0/16".to_owned(), "10.0.0.2/24".to_owned(), 0)
    );
}

#[test]
fn a_relist_replaces_the_last_list_only_at_init_done() {
    let b = |name: &str, rv: &str, cidr: &str| block(name, rv, cidr, "node-a");
    let (mut fed, s) = Fed::listed(&[
        (Kind::IpPool, pool("p", "1", "10.244.0.0/16")),
        (Kind::IpamBlock, b("10-244-1-0-26", "10", "10.244.1.0/26")),
        (Kind::IpamBlock, b("10-244-2-0-26", "11", "10.244.2.0/26")),
    ]);
    assert_eq!(s.cluster.ipam_blocks.keys().map(|k| &**k).collect::<Vec<_>>(), vec!["10-244-1-0-26", "10-244-2-0-26"]);
    assert_eq!(fed.view.parses, 3);

    // A re-list (after a 410): block 1 unchanged, block 2 gone, block 3 new. Nothing changes
    // before InitDone: no snapshot, the old blocks stay.
    fed.send(Kind::IpamBlock, Event::Init);
    fed.send(Kind::IpamBlock, Event::InitApply(decode(Kind::IpamBlock, &b("10-244-1-0-26", "10", "10.244.1.0/26"))));
    fed.send(Kind::IpamBlock, Event::InitApply(decode(Kind::IpamBlock, &b("10-244-3-0-26", "20", "10.244.3.0/26"))));
    assert_eq!(fed.view.flush(), vec![]);
    assert_eq!(fed.view.snapshot().cluster.ipam_blocks.keys().map(|k| &**k).collect::<Vec<_>>(), vec!["10-244-1-0-26", "10-244-2-0-26"]);
    assert_eq!(fed.view.parses, 4, "only the new block is parsed");
    fed.send(Kind::IpamBlock, Event::InitDone);
    let s = fed.snapshot();
    assert_eq!(s.cluster.ipam_blocks.keys().map(|k| &**k).collect::<Vec<_>>(), vec!["10-244-1-0-26", "10-244-3-0-26"]);
    assert_eq!(s.cluster.ipam_blocks["10-244-3-0-26"].cidr.to_string(), "10.244.3.0/26");

    // A list that fails half-way changes nothing; the next complete one is what counts.
    fed.send(Kind::IpamBlock, Event::Init);
    fed.send(Kind::IpamBlock, Event::InitApply(decode(Kind::IpamBlock, &b("10-244-4-0-26", "30", "10.244.4.0/26"))));
    let out = fed.view.apply(fed.index(Kind::IpamBlock), Err(watcher::Error::NoResourceVersion.into()));
    assert!(matches!(&out[..], [DatastoreEvent::Unsynced { .. }]), "{out:?}");
    let s = fed.snapshot();
    assert_eq!(s.cluster.ipam_blocks.keys().map(|k| &**k).collect::<Vec<_>>(), vec!["10-244-1-0-26", "10-244-3-0-26"]);
    assert_eq!(s.load_errors.len(), 1);
    fed.send(Kind::IpamBlock, Event::Init);
    fed.send(Kind::IpamBlock, Event::InitApply(decode(Kind::IpamBlock, &b("10-244-1-0-26", "10", "10.244.1.0/26"))));
    fed.send(Kind::IpamBlock, Event::InitApply(decode(Kind::IpamBlock, &b("10-244-3-0-26", "21", "10.244.3.0/26"))));
    fed.send(Kind::IpamBlock, Event::InitDone);
    let out = fed.view.flush();
    let [DatastoreEvent::Snapshot(s), DatastoreEvent::Synced] = &out[..] else { panic!("{out:?}") };
    assert_eq!(s.cluster.ipam_blocks.keys().map(|k| &**k).collect::<Vec<_>>(), vec!["10-244-1-0-26", "10-244-3-0-26"]);
    assert!(s.load_errors.is_empty());
    // Block 4 was parsed once (in the failed list), block 3's new resourceVersion with the
    // same content was hashed, not parsed.
    assert_eq!(fed.view.parses, 5);

    // An empty re-list removes every block, at InitDone.
    fed.send(Kind::IpamBlock, Event::Init);
    assert_eq!(fed.view.flush(), vec![]);
    fed.send(Kind::IpamBlock, Event::InitDone);
    assert!(fed.snapshot().cluster.ipam_blocks.is_empty());
    // A deletion removes one object at once.
    fed.apply(Kind::IpamBlock, &b("10-244-5-0-26", "40", "10.244.5.0/26"));
    assert_eq!(fed.snapshot().cluster.ipam_blocks.len(), 1);
    fed.send(Kind::IpamBlock, Event::Delete(decode(Kind::IpamBlock, &b("10-244-5-0-26", "41", "10.244.5.0/26"))));
    assert!(fed.snapshot().cluster.ipam_blocks.is_empty());
    assert_eq!((fed.view.parses, fed.view.parse_failures), (6, 0));
}

/// In the Kubernetes view: a /27 IPAM block of node b inside node a's /26
/// arrives by watch. Both leave the snapshot's cluster (the view keeps them: the next change
/// can fix it), each an object error named `<resource>/<name>` naming the other and freezing
/// the /26; node c's block stays. Deleting the /27 brings node a's block back.
#[test]
fn an_overlapping_block_is_refused_with_the_block_it_overlaps_and_named_by_its_resource() {
    let (mut fed, s) = Fed::listed(&[
        (Kind::IpPool, pool("p", "1", "10.244.0.0/16")),
        (Kind::IpamBlock, block("10-244-1-0-26", "2", "10.244.1.0/26", "a")),
        (Kind::IpamBlock, block("10-244-3-0-26", "3", "10.244.3.0/26", "c")),
    ]);
    assert_eq!(s.object_errors, vec![]);
    fed.apply(Kind::IpamBlock, &block("10-244-1-32-27", "4", "10.244.1.32/27", "b"));
    let s = fed.snapshot();
    assert_eq!(s.cluster.ipam_blocks.keys().map(|k| &**k).collect::<Vec<_>>(), vec!["10-244-3-0-26"]);
    let got: Vec<(String, Vec<String>, bool)> =
        s.object_errors.iter().map(|e| (e.file.display().to_string(), e.cidrs.iter().map(ToString::to_string).collect(), e.last_good)).collect();
    let frozen = vec!["10.244.1.0/26".to_owned()];
    assert_eq!(
        got,
        vec![
            ("ipamblocks.crd.projectcalico.org/10-244-1-0-26".to_owned(), frozen.clone(), false),
            ("ipamblocks.crd.projectcalico.org/10-244-1-32-27".to_owned(), frozen, false),
        ]
    );
    assert!(s.object_errors[0]
        .error
        .to_string()
        .starts_with(r#"IPAMBlock "10-244-1-0-26": spec.cidr: 10.244.1.0/26 overlaps IPAM block 10-244-1-32-27 (10.244.1.32/27); "#));
    assert!(s.object_errors[1]
        .error
        .to_string()
        .starts_with(r#"IPAMBlock "10-244-1-32-27": spec.cidr: 10.244.1.32/27 overlaps IPAM block 10-244-1-0-26 (10.244.1.0/26); "#));
    fed.send(Kind::IpamBlock, Event::Delete(decode(Kind::IpamBlock, &block("10-244-1-32-27", "5", "10.244.1.32/27", "b"))));
    let s = fed.snapshot();
    assert_eq!((s.cluster.ipam_blocks.keys().map(|k| &**k).collect::<Vec<_>>(), s.object_errors.len()), (vec!["10-244-1-0-26", "10-244-3-0-26"], 0));
}
