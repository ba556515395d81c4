use std::path::Path;

use super::*;

const POOL: &str = "/calico/resources/v3/projectcalico.org/ippools/pool-a";

fn pool(cidr: &str) -> Vec<u8> {
    format!(r#"{{"apiVersion":"projectcalico.org/v3","kind":"IPPool","metadata":{{"name":"pool-a"}},"spec":{{"cidr":"{cidr}"}}}}"#).into_bytes()
}

fn pool_cidr(view: &View) -> Option<String> {
    view.snapshot().cluster.ip_pools.get("pool-a").map(|p| p.cidr.to_string())
}

/// Old Calico wrote affinities with no value; `block_affinity.go` reads one as `{}`. So does
/// the view: a confirmed host affinity, no load error (a never-loaded error would hold
/// every deletion). An empty value anywhere else is still not JSON.
#[test]
fn an_affinity_with_no_value_is_a_confirmed_affinity() {
    let mut view = View::default();
    let key = "/calico/ipam/v2/host/node-a/ipv4/block/10.0.0.0-26";
    assert!(view.put(key, b""));
    let s = view.snapshot();
    assert_eq!((s.load_errors.len(), s.object_errors.len()), (0, 0));
    let affinities: Vec<_> =
        s.cluster.block_affinities.values().map(|a| (a.node.as_str(), a.cidr.to_string(), a.state, a.affinity_type.as_str(), a.is_active())).collect();
    assert_eq!(affinities, vec![("node-a", "10.0.0.0/26".to_owned(), crate::model::AffinityState::Confirmed, "host", true)]);
    view.put(POOL, b"");
    let s = view.snapshot();
    assert_eq!(s.load_errors.len(), 1);
    assert!(s.load_errors[0].message.starts_with("value is not JSON: "), "{}", s.load_errors[0].message);
}

#[test]
fn a_broken_value_keeps_the_last_good_object_and_names_the_key() {
    let mut view = View::default();
    assert!(view.put(POOL, &pool("10.0.0.0/16")));
    assert_eq!(pool_cidr(&view), Some("10.0.0.0/16".into()));
    // Not JSON: a load error named by the key; the last good pool stays.
    view.put(POOL, b"{\"apiVersion\": ");
    let s = view.snapshot();
    assert_eq!(pool_cidr(&view), Some("10.0.0.0/16".into()));
    assert_eq!(s.load_errors.len(), 1);
    assert_eq!((s.load_errors[0].file.as_path(), s.load_errors[0].never_loaded), (Path::new(POOL), false));
    assert!(s.load_errors[0].message.starts_with("value is not JSON: "), "{}", s.load_errors[0].message);
    // A bad field: an object error named by the key, marked last-good.
    view.put(POOL, &pool("10.0.0/16"));
    let s = view.snapshot();
    assert_eq!(pool_cidr(&view), Some("10.0.0.0/16".into()));
    assert_eq!(s.load_errors, vec![]);
    assert_eq!(s.object_errors.len(), 1);
    assert_eq!(s.object_errors[0].to_string(), format!("{POOL}: IPPool \"pool-a\": spec.cidr: invalid CIDR \"10.0.0/16\" (its last good version is kept)"));
    // A good value clears the error.
    view.put(POOL, &pool("10.1.0.0/16"));
    let s = view.snapshot();
    assert_eq!((pool_cidr(&view), s.object_errors.len()), (Some("10.1.0.0/16".into()), 0));
}

#[test]
fn a_deletion_removes_the_object_and_a_relist_drops_absent_keys() {
    let mut view = View::default();
    view.put(POOL, &pool("10.0.0.0/16"));
    assert!(!view.put("/calico/felix/v2/ignored", b"x"));
    assert!(view.delete(POOL));
    assert_eq!((pool_cidr(&view), view.len()), (None, 0));
    view.put(POOL, &pool("10.0.0.0/16"));
    view.reset(Vec::new());
    assert_eq!((pool_cidr(&view), view.len()), (None, 0));
    // A re-list whose value is broken keeps the last good object.
    view.put(POOL, &pool("10.0.0.0/16"));
    view.reset(vec![(POOL.to_owned(), b"nope".to_vec())]);
    assert_eq!(pool_cidr(&view), Some("10.0.0.0/16".into()));
    assert_eq!(view.snapshot().load_errors.len(), 1);
}

/// What `finish` takes out is named by its object's key, also for IPAM
/// blocks (the key lookup used to know only pools: a block's error had no key). A /27
/// inside a /26 of another node: both refused, each error at its own key, both freezing the
/// /26; a wrong-sized block alone at its key; an overlapping pool at its key still.
#[test]
fn rejections_of_the_whole_cluster_name_each_objects_key() {
    let block =
        |cidr: &str, node: &str| format!(r#"{{"cidr":"{cidr}","affinity":"host:{node}","allocations":[],"attributes":[],"deleted":false}}"#).into_bytes();
    let key = |cidr: &str| format!("/calico/ipam/v2/assignment/ipv4/block/{}", cidr.replace('/', "-"));
    let mut view = View::default();
    view.put(POOL, &pool("10.244.0.0/16"));
    view.put(&key("10.244.10.0/26"), &block("10.244.10.0/26", "node-a"));
    view.put(&key("10.244.10.32/27"), &block("10.244.10.32/27", "node-b"));
    view.put(&key("10.244.30.0/26"), &block("10.244.30.0/26", "node-c"));
    view.put(&key("10.244.64.0/24"), &block("10.244.64.0/24", "node-d"));
    let s = view.snapshot();
    let got: Vec<(String, String, Vec<String>)> = s
        .object_errors
        .iter()
        .map(|e| (e.file.display().to_string(), e.error.object().unwrap().1.to_owned(), e.cidrs.iter().map(ToString::to_string).collect()))
        .collect();
    let at = |cidr: &str, name: &str, frozen: &str| (key(cidr), name.to_owned(), vec![frozen.to_owned()]);
    assert_eq!(
        got,
        [
            at("10.244.10.0/26", "10-244-10-0-26", "10.244.10.0/26"),
            at("10.244.10.32/27", "10-244-10-32-27", "10.244.10.0/26"),
            at("10.244.64.0/24", "10-244-64-0-24", "10.244.64.0/24"),
        ]
    );
    assert!(s.object_errors.iter().all(|e| !e.last_good));
    assert_eq!(s.cluster.ipam_blocks.keys().map(ToString::to_string).collect::<Vec<_>>(), ["10-244-30-0-26"]);
    // An overlapping pool is still named by its key.
    view.put(
        "/calico/resources/v3/projectcalico.org/ippools/pool-b",
        br#"{"apiVersion":"projectcalico.org/v3","kind":"IPPool","metadata":{"name":"pool-b"},"spec":{"cidr":"10.0.0.0/8"}}"#,
    );
    let files: Vec<String> =
        view.snapshot().object_errors.iter().filter(|e| e.error.object().unwrap().0 == Kind::IpPool).map(|e| e.file.display().to_string()).collect();
    assert_eq!(files, [POOL, "/calico/resources/v3/projectcalico.org/ippools/pool-b"]);
}

#[test]
fn a_never_good_broken_value_is_never_loaded() {
    let mut view = View::default();
    view.put(POOL, b"nope");
    let s = view.snapshot();
    assert_eq!((s.load_errors.len(), s.load_errors[0].never_loaded, s.cluster.ip_pools.len()), (1, true, 0));
}
