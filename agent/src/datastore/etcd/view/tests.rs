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

/// The oracle: the snapshot rebuilt from every key's last good object through
/// `ClusterBuilder`, as the view built every snapshot before it kept its cluster as keys
/// change (the file datastore's construction: duplicates, then pools, then blocks).
fn rebuilt(view: &View) -> Snapshot {
    let mut builder = crate::model::ClusterBuilder::default();
    let mut object_errors = Vec::new();
    let mut load_errors = Vec::new();
    for (key, e) in &view.entries {
        let file = PathBuf::from(&**key);
        if let Some(good) = &e.good {
            for r in builder.add_parsed([good.to_parsed()]) {
                object_errors.push(ObjectError::from_rejected(file.clone(), r));
            }
        }
        e.errors(key, &mut object_errors, &mut load_errors);
    }
    let (cluster, taken_out) = builder.finish();
    for r in taken_out {
        let key = r
            .error
            .object()
            .and_then(|(k, n)| view.entries.iter().find(|(_, e)| e.good.as_ref().and_then(Good::identity) == Some((k, Arc::from(n)))).map(|(key, _)| key));
        object_errors.push(ObjectError::from_rejected(key.map(|k| PathBuf::from(&**k)).unwrap_or_default(), r));
    }
    Snapshot { cluster: Arc::new(cluster), object_errors, load_errors, inputs: view.entries.len(), settled: true }
}

/// Object errors in a fixed order (the two constructions list the same errors in different
/// orders: the view lists broken keys first, the rebuild goes key by key).
fn sorted(mut errors: Vec<ObjectError>) -> Vec<ObjectError> {
    errors.sort_by_key(|e| (e.file.clone(), e.to_string(), e.cidrs.clone()));
    errors
}

mod kept_as_keys_change {
    use proptest::prelude::*;

    use super::*;

    /// Few keys and few names, so that sequences define one object at two keys, overlap
    /// pools and blocks, break and mend values, delete and re-list.
    const POOL_KEYS: [&str; 3] = [
        "/calico/resources/v3/projectcalico.org/ippools/p0",
        "/calico/resources/v3/projectcalico.org/ippools/p1",
        "/calico/resources/v3/projectcalico.org/ippools/p2",
    ];
    const NODE_KEYS: [&str; 2] = ["/calico/resources/v3/projectcalico.org/nodes/n0", "/calico/resources/v3/projectcalico.org/nodes/n1"];
    const BLOCKS: [&str; 4] = ["10.244.0.0/26", "10.244.0.64/26", "10.244.0.32/27", "10.244.1.0/24"];

    fn block_key(cidr: &str) -> String {
        format!("/calico/ipam/v2/assignment/ipv4/block/{}", cidr.replace('/', "-"))
    }

    fn affinity_key(node: &str, cidr: &str) -> String {
        format!("/calico/ipam/v2/host/{node}/ipv4/block/{}", cidr.replace('/', "-"))
    }

    /// One key and a value for it: good, not JSON, or a bad field.
    fn put() -> impl Strategy<Value = (String, Vec<u8>)> {
        let pool = (0..POOL_KEYS.len(), 0..2usize, prop::sample::select(vec!["10.244.0.0/16", "10.0.0.0/8", "10.245.0.0/16", "10.244.0/16"])).prop_map(
            |(k, n, cidr)| {
                let v = format!(
                    r#"{{"apiVersion":"projectcalico.org/v3","kind":"IPPool","metadata":{{"name":"pool-{n}"}},"spec":{{"cidr":"{cidr}","blockSize":26}}}}"#
                );
                (POOL_KEYS[k].to_owned(), v.into_bytes())
            },
        );
        let node = (0..NODE_KEYS.len(), 0..2usize, 0..3u8).prop_map(|(k, n, a)| {
            let v = format!(
                r#"{{"apiVersion":"projectcalico.org/v3","kind":"Node","metadata":{{"name":"node-{n}"}},"spec":{{"bgp":{{"ipv4Address":"192.168.0.{a}/24"}}}}}}"#
            );
            (NODE_KEYS[k].to_owned(), v.into_bytes())
        });
        let block = (prop::sample::select(BLOCKS.to_vec()), 0..2usize).prop_map(|(cidr, n)| {
            let v = format!(r#"{{"cidr":"{cidr}","affinity":"host:node-{n}","allocations":[],"attributes":[],"deleted":false}}"#);
            (block_key(cidr), v.into_bytes())
        });
        let affinity = (0..2usize, prop::sample::select(BLOCKS.to_vec()), prop::sample::select(vec!["", r#"{"state":"confirmed"}"#, r#"{"state":"pending"}"#]))
            .prop_map(|(n, cidr, v)| (affinity_key(&format!("node-{n}"), cidr), v.as_bytes().to_vec()));
        let broken = (prop::sample::select(vec![POOL_KEYS[0], NODE_KEYS[0]]), prop::sample::select(vec!["nope", "{\"apiVersion\": "]))
            .prop_map(|(k, v)| (k.to_owned(), v.as_bytes().to_vec()));
        let broken_block = prop::sample::select(BLOCKS.to_vec()).prop_map(|cidr| (block_key(cidr), b"[1]".to_vec()));
        prop_oneof![3 => pool, 2 => node, 3 => block, 2 => affinity, 1 => broken, 1 => broken_block]
    }

    #[derive(Clone, Debug)]
    enum Op {
        Put(String, Vec<u8>),
        Delete(String),
        /// A re-list: these puts, every other key gone.
        Reset(Vec<(String, Vec<u8>)>),
    }

    fn op() -> impl Strategy<Value = Op> {
        let delete = prop_oneof![
            prop::sample::select(POOL_KEYS.to_vec()).prop_map(str::to_owned),
            prop::sample::select(NODE_KEYS.to_vec()).prop_map(str::to_owned),
            prop::sample::select(BLOCKS.to_vec()).prop_map(block_key),
        ];
        prop_oneof![
            8 => put().prop_map(|(k, v)| Op::Put(k, v)),
            3 => delete.prop_map(Op::Delete),
            1 => prop::collection::vec(put(), 0..6).prop_map(Op::Reset),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// After every step of a random sequence of puts, deletions and re-lists, the
        /// snapshot of the kept cluster is the one rebuilt from every key: the same cluster,
        /// the same errors (each named by the same key), the same inputs.
        #[test]
        fn the_kept_cluster_is_the_rebuilt_one(ops in prop::collection::vec(op(), 1..40)) {
            let mut view = View::default();
            for op in ops {
                match op {
                    Op::Put(k, v) => { view.put(&k, &v); }
                    Op::Delete(k) => { view.delete(&k); }
                    Op::Reset(kvs) => {
                        // In two pages, as the runner reads.
                        let mut seen = BTreeSet::new();
                        let (a, b) = kvs.split_at(kvs.len() / 2);
                        view.relist_page(a.to_vec(), &mut seen);
                        view.relist_page(b.to_vec(), &mut seen);
                        view.end_relist(&seen);
                    }
                }
                let (kept, oracle) = (view.snapshot(), rebuilt(&view));
                prop_assert_eq!(&kept.cluster, &oracle.cluster);
                prop_assert_eq!(sorted(kept.object_errors), sorted(oracle.object_errors));
                prop_assert_eq!(kept.load_errors, oracle.load_errors);
                prop_assert_eq!(kept.inputs, oracle.inputs);
            }
        }
    }
}
