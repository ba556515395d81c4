use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnet::IpNet;

use super::*;

/// [`check_blocks`] on a whole cluster's pools and blocks.
fn check(c: &mut Cluster) -> Vec<Rejected> {
    check_blocks(&c.ip_pools, &mut c.ipam_blocks)
}
use crate::model::{Affinity, Cluster, EncapMode};

/// An IPAM block document: name from the CIDR, affine to `node`.
fn block(cidr: &str, node: &str) -> String {
    let name = crate::model::block_name(cidr.parse::<IpNet>().unwrap());
    format!("---\napiVersion: crd.projectcalico.org/v1\nkind: IPAMBlock\nmetadata: {{name: {name}}}\nspec: {{cidr: '{cidr}', affinity: 'host:{node}'}}\n")
}

fn pool(name: &str, cidr: &str, block_size: Option<u8>) -> String {
    let size = block_size.map(|s| format!(", blockSize: {s}")).unwrap_or_default();
    format!("---\napiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {{name: {name}}}\nspec: {{cidr: '{cidr}'{size}}}\n")
}

/// The cluster's block names, and every error as text.
fn load(docs: &[String]) -> (Vec<String>, Vec<String>) {
    let (cluster, errors) = Cluster::from_yaml_str(&docs.concat()).unwrap();
    (cluster.ipam_blocks.keys().map(ToString::to_string).collect(), errors.iter().map(ToString::to_string).collect())
}

/// The rejections of `check_blocks` as (error text, frozen CIDRs).
fn rejections(docs: &[String]) -> Vec<(String, Vec<String>)> {
    let mut b = crate::model::ClusterBuilder::default();
    assert_eq!(b.add_parsed(crate::model::ParsedObjects::from_yaml_str(&docs.concat(), &crate::model::YamlLimits::default()).unwrap().into_items()), vec![]);
    let (_, rejected) = b.finish();
    rejected.into_iter().map(|r| (r.error.to_string(), r.cidrs.iter().map(ToString::to_string).collect())).collect()
}

const OVER_26: &str = "; Calico's IPAM never writes overlapping blocks, so every block of an overlap is invalid";

/// A /27 for node-b inside node-a's /26 (once accepted and routed). Both are
/// invalid, each naming the other; the frozen ground of both is node-a's /26 (it covers the
/// /27); the /27 is also of the wrong size for the pool. The other blocks stay. Whichever
/// is written first, the answer is the same.
#[test]
fn a_block_inside_another_nodes_block_makes_both_invalid_in_either_order() {
    let p = pool("default-ipv4-ippool", "10.244.0.0/16", None);
    let (a, b, c) = (block("10.244.10.0/26", "node-a"), block("10.244.10.32/27", "node-b"), block("10.244.30.0/26", "node-c"));
    let expected = vec![
        (
            format!(
                r#"IPAMBlock "10-244-10-0-26": spec.cidr: 10.244.10.0/26 overlaps IPAM block 10-244-10-32-27 (10.244.10.32/27){OVER_26}; its ground (10.244.10.0/26) is frozen until fixed"#
            ),
            vec!["10.244.10.0/26".to_owned()],
        ),
        (
            format!(
                r#"IPAMBlock "10-244-10-32-27": spec.cidr: 10.244.10.32/27 overlaps IPAM block 10-244-10-0-26 (10.244.10.0/26){OVER_26}; 10.244.10.32/27 is a /27 block in IPPool "default-ipv4-ippool" (10.244.0.0/16) whose blockSize is 26; Calico's IPAM writes only blocks of its pool's blockSize; its ground (10.244.10.0/26) is frozen until fixed"#
            ),
            vec!["10.244.10.0/26".to_owned()],
        ),
    ];
    for docs in [[p.clone(), a.clone(), b.clone(), c.clone()], [b.clone(), c.clone(), p.clone(), a.clone()]] {
        assert_eq!(rejections(&docs), expected);
        assert_eq!(load(&docs).0, ["10-244-30-0-26"]);
    }
}

/// A /16 block in a pool of /26 blocks: it overlaps every block of the pool and is of the
/// wrong size; each /26 names it. The frozen ground is the /16, once for all of them.
#[test]
fn a_pool_wide_block_makes_every_block_it_covers_invalid() {
    let docs = [
        pool("default-ipv4-ippool", "10.244.0.0/16", Some(26)),
        block("10.244.0.0/16", "node-b"),
        block("10.244.10.0/26", "node-a"),
        block("10.244.30.0/26", "node-c"),
        block("10.245.30.0/26", "node-c"),
    ];
    let r = rejections(&docs);
    let frozen: Vec<&[String]> = r.iter().map(|(_, c)| c.as_slice()).collect();
    assert_eq!(frozen, [["10.244.0.0/16"]; 3]);
    assert_eq!(
        r[0].0,
        format!(
            r#"IPAMBlock "10-244-0-0-16": spec.cidr: 10.244.0.0/16 overlaps IPAM block 10-244-10-0-26 (10.244.10.0/26), IPAM block 10-244-30-0-26 (10.244.30.0/26){OVER_26}; 10.244.0.0/16 is a /16 block in IPPool "default-ipv4-ippool" (10.244.0.0/16) whose blockSize is 26; Calico's IPAM writes only blocks of its pool's blockSize; its ground (10.244.0.0/16) is frozen until fixed"#
        )
    );
    assert_eq!(
        r[1].0,
        format!(
            r#"IPAMBlock "10-244-10-0-26": spec.cidr: 10.244.10.0/26 overlaps IPAM block 10-244-0-0-16 (10.244.0.0/16){OVER_26}; its ground (10.244.0.0/16) is frozen until fixed"#
        )
    );
    assert_eq!(load(&docs).0, ["10-245-30-0-26"]);
}

/// Blocks nested three deep, outside every pool (overlap is refused whatever the pools):
/// each names the two others; all freeze the outermost. A block inside no pool and
/// overlapping nothing is kept (a deleted pool's block, normal during a pool migration).
#[test]
fn nested_blocks_name_each_other_and_freeze_the_outermost() {
    let docs = [block("10.99.0.0/24", "node-a"), block("10.99.0.64/26", "node-b"), block("10.99.0.80/28", "node-c"), block("10.99.1.0/26", "node-d")];
    let r = rejections(&docs);
    let names: Vec<(&str, &[String])> = r.iter().map(|(e, c)| (e.split(OVER_26).next().unwrap(), c.as_slice())).collect();
    let frozen = ["10.99.0.0/24".to_owned()];
    assert_eq!(
        names,
        [
            (
                r#"IPAMBlock "10-99-0-0-24": spec.cidr: 10.99.0.0/24 overlaps IPAM block 10-99-0-64-26 (10.99.0.64/26), IPAM block 10-99-0-80-28 (10.99.0.80/28)"#,
                &frozen[..]
            ),
            (
                r#"IPAMBlock "10-99-0-64-26": spec.cidr: 10.99.0.64/26 overlaps IPAM block 10-99-0-0-24 (10.99.0.0/24), IPAM block 10-99-0-80-28 (10.99.0.80/28)"#,
                &frozen[..]
            ),
            (
                r#"IPAMBlock "10-99-0-80-28": spec.cidr: 10.99.0.80/28 overlaps IPAM block 10-99-0-0-24 (10.99.0.0/24), IPAM block 10-99-0-64-26 (10.99.0.64/26)"#,
                &frozen[..]
            ),
        ]
    );
    assert_eq!(load(&docs).0, ["10-99-1-0-26"]);
}

/// A block of another size than its pool's blockSize, overlapping nothing: invalid, its own
/// CIDR frozen. The pool's blockSize is what counts (24 here), not the family's default;
/// a block larger than the pool, around it, is of the wrong size too. A block in no valid
/// pool (none, or an invalid one) is kept, whatever its size.
#[test]
fn a_block_of_another_size_than_its_pools_is_invalid() {
    let docs = [
        pool("p24", "10.244.0.0/16", Some(24)),
        pool("small", "10.250.0.0/24", Some(26)),
        pool("wide", "11.0.0.0/8", None),
        pool("twin", "11.0.0.0/8", None),
        block("10.244.1.0/24", "node-a"),
        block("10.244.2.0/26", "node-b"),
        block("10.250.0.0/23", "node-c"),
        block("11.9.0.0/27", "node-d"),
        block("192.168.0.0/27", "node-e"),
    ];
    let r = rejections(&docs);
    let wrong: Vec<_> = r.iter().filter(|(e, _)| e.starts_with("IPAMBlock")).cloned().collect();
    let tail = "; Calico's IPAM writes only blocks of its pool's blockSize";
    assert_eq!(
        wrong,
        [
            (
                format!(
                    r#"IPAMBlock "10-244-2-0-26": spec.cidr: 10.244.2.0/26 is a /26 block in IPPool "p24" (10.244.0.0/16) whose blockSize is 24{tail}; its ground (10.244.2.0/26) is frozen until fixed"#
                ),
                vec!["10.244.2.0/26".to_owned()]
            ),
            (
                format!(
                    r#"IPAMBlock "10-250-0-0-23": spec.cidr: 10.250.0.0/23 is a /23 block in IPPool "small" (10.250.0.0/24) whose blockSize is 26{tail}; its ground (10.250.0.0/23) is frozen until fixed"#
                ),
                vec!["10.250.0.0/23".to_owned()]
            ),
        ]
    );
    // The two overlapping pools are rejected by check_pools, so 11.9.0.0/27 is in no valid pool.
    assert_eq!(load(&docs).0, ["10-244-1-0-24", "11-9-0-0-27", "192-168-0-0-27"]);
}

/// IPv6: the default blockSize is 122; a /123 inside a /122 is an overlap (and of the wrong
/// size), a /120 alone is of the wrong size. An IPv4 block and an IPv6 block with the same
/// integer addresses (10.0.0.0/26 and ::a00:0/122) do not overlap.
#[test]
fn ipv6_blocks_are_checked_with_the_ipv6_default_and_apart_from_ipv4() {
    let docs = [
        pool("v6", "fd00:10:244::/48", None),
        block("fd00:10:244:0:10::/122", "node-a"),
        block("fd00:10:244:0:10::20/123", "node-b"),
        block("fd00:10:244:0:20::/120", "node-c"),
        block("fd00:10:244:0:30::/122", "node-d"),
    ];
    let r = rejections(&docs);
    let tail = "; Calico's IPAM writes only blocks of its pool's blockSize";
    assert_eq!(
        r,
        [
            (
                format!(
                    r#"IPAMBlock "fd00-10-244-0-10---122": spec.cidr: fd00:10:244:0:10::/122 overlaps IPAM block fd00-10-244-0-10--20-123 (fd00:10:244:0:10::20/123){OVER_26}; its ground (fd00:10:244:0:10::/122) is frozen until fixed"#
                ),
                vec!["fd00:10:244:0:10::/122".to_owned()]
            ),
            (
                format!(
                    r#"IPAMBlock "fd00-10-244-0-10--20-123": spec.cidr: fd00:10:244:0:10::20/123 overlaps IPAM block fd00-10-244-0-10---122 (fd00:10:244:0:10::/122){OVER_26}; fd00:10:244:0:10::20/123 is a /123 block in IPPool "v6" (fd00:10:244::/48) whose blockSize is 122{tail}; its ground (fd00:10:244:0:10::/122) is frozen until fixed"#
                ),
                vec!["fd00:10:244:0:10::/122".to_owned()]
            ),
            (
                format!(
                    r#"IPAMBlock "fd00-10-244-0-20---120": spec.cidr: fd00:10:244:0:20::/120 is a /120 block in IPPool "v6" (fd00:10:244::/48) whose blockSize is 122{tail}; its ground (fd00:10:244:0:20::/120) is frozen until fixed"#
                ),
                vec!["fd00:10:244:0:20::/120".to_owned()]
            ),
        ]
    );
    assert_eq!(load(&docs).0, ["fd00-10-244-0-30---122"]);
    // Built in code: the IPv6 name of ::a00:0/122 is no DNS-1123 name.
    let mut c = Cluster::default();
    add_blocks(&mut c, ["10.0.0.0/26".parse().unwrap(), "::a00:0/122".parse().unwrap(), "::a00:0/120".parse().unwrap()]);
    let r: Vec<(String, Vec<IpNet>)> = check(&mut c).into_iter().map(|r| (r.error.object().unwrap().1.to_owned(), r.cidrs)).collect();
    let root: IpNet = "::a00:0/120".parse().unwrap();
    assert_eq!(r, [("--a00-0-120".to_owned(), vec![root]), ("--a00-0-122".to_owned(), vec![root])]);
    assert_eq!(c.ipam_blocks.keys().map(ToString::to_string).collect::<Vec<_>>(), ["10-0-0-0-26"]);
}

/// The packed IPv4 sort orders exactly as the sort of spans does (ties by name order).
#[test]
fn the_packed_sort_is_the_span_sort() {
    let cidrs = ["10.0.0.64/26", "10.0.0.0/24", "fd00::/122", "10.0.0.0/26", "0.0.0.0/0", "255.255.255.255/32", "10.0.0.0/24", "::/0", "10.0.0.64/27"];
    let names: Vec<Arc<str>> = (0..cidrs.len()).map(|i| Arc::from(format!("b{i}"))).collect();
    let blocks: Vec<(&Arc<str>, IpNet)> = names.iter().zip(cidrs).map(|(n, c)| (n, c.parse().unwrap())).collect();
    let packed = sorted_spans_packed(&blocks, true);
    assert_eq!(packed, sorted_spans_packed(&blocks, false));
    let order: Vec<String> = packed.iter().map(|(_, i)| blocks[*i].1.to_string()).collect();
    assert_eq!(order, ["0.0.0.0/0", "10.0.0.0/24", "10.0.0.0/24", "10.0.0.0/26", "10.0.0.64/26", "10.0.0.64/27", "255.255.255.255/32", "::/0", "fd00::/122"]);
    assert_eq!(packed[1].1, 1);
    assert_eq!(packed[2].1, 6);
}

fn v4_pool(name: &str, cidr: &str, block_size: u8) -> IpPool {
    IpPool {
        name: name.into(),
        cidr: cidr.parse().unwrap(),
        ipip_mode: EncapMode::Always,
        vxlan_mode: EncapMode::Never,
        nat_outgoing: false,
        disabled: false,
        disable_bgp_export: false,
        block_size,
        allowed_uses: Vec::new(),
        node_selector: "all()".into(),
    }
}

/// Add blocks of `cidrs` to `cluster`, affine to node-x.
fn add_blocks(cluster: &mut Cluster, cidrs: impl IntoIterator<Item = IpNet>) {
    for cidr in cidrs {
        let name: Arc<str> = crate::model::block_name(cidr).into();
        let b = IpamBlock {
            name: name.clone(),
            cidr,
            affinity: Some(Affinity::Host("node-x".into())),
            allocations: Vec::new(),
            attributes: Vec::new(),
            deleted: false,
        };
        cluster.ipam_blocks.insert(name, Arc::new(b));
    }
}

/// `n` consecutive blocks of prefix length `len` from `base`.
fn consecutive(base: &str, len: u8, n: u32) -> impl Iterator<Item = IpNet> {
    let base = u32::from(base.parse::<std::net::Ipv4Addr>().unwrap());
    (0..n).map(move |i| IpNet::new(std::net::Ipv4Addr::from(base + (i << (32 - len))).into(), len).unwrap())
}

/// 100,000 /26 blocks of a /8 pool: none refused. One /27 among them (inside one) makes
/// exactly two rejections; a /16 block over 1,024 of them names the first four and counts
/// the rest, and all 1,025 freeze one prefix.
#[test]
fn many_blocks_are_checked_and_one_overlap_is_two_rejections() {
    let mut c = Cluster::default();
    c.ip_pools.insert("p".into(), v4_pool("p", "10.0.0.0/8", 26));
    add_blocks(&mut c, consecutive("10.0.0.0", 26, 100_000));
    assert_eq!(check(&mut c.clone()), vec![]);

    let mut one = c.clone();
    add_blocks(&mut one, ["10.1.2.32/27".parse().unwrap()]);
    let r = check(&mut one);
    let got: Vec<(String, Vec<IpNet>)> = r.iter().map(|r| (r.error.object().unwrap().1.to_owned(), r.cidrs.clone())).collect();
    let root: IpNet = "10.1.2.0/26".parse().unwrap();
    assert_eq!(got, [("10-1-2-0-26".to_owned(), vec![root]), ("10-1-2-32-27".to_owned(), vec![root])]);
    assert_eq!(one.ipam_blocks.len(), 99_999);

    let mut wide = c.clone();
    add_blocks(&mut wide, ["10.0.0.0/16".parse().unwrap()]);
    let r = check(&mut wide);
    assert_eq!(r.len(), 1_025);
    assert!(r.iter().all(|r| r.cidrs == ["10.0.0.0/16".parse::<IpNet>().unwrap()]));
    let first = r[0].error.to_string();
    assert!(
            first.starts_with(r#"IPAMBlock "10-0-0-0-16": spec.cidr: 10.0.0.0/16 overlaps IPAM block 10-0-0-0-26 (10.0.0.0/26), IPAM block 10-0-0-64-26 (10.0.0.64/26), IPAM block 10-0-0-128-26 (10.0.0.128/26), IPAM block 10-0-0-192-26 (10.0.0.192/26) and 1020 more; "#),
            "{first}"
        );
    assert_eq!(wide.ipam_blocks.len(), 100_000 - 1_024);
}

/// More than 1,024 blocks of the wrong size (a pool's blockSize edited past Calico's
/// client) freeze their pool's CIDR, one prefix, not one per block; up to 1,024 freeze
/// their own.
#[test]
fn past_1024_wrong_sized_blocks_freeze_their_pool() {
    for (n, frozen) in [(1_024_u32, None), (1_025, Some("10.244.0.0/16"))] {
        let mut c = Cluster::default();
        c.ip_pools.insert("p".into(), v4_pool("p", "10.244.0.0/16", 26));
        add_blocks(&mut c, consecutive("10.244.0.0", 27, n));
        let r = check(&mut c);
        assert_eq!(r.len(), n as usize);
        let own: Vec<IpNet> = consecutive("10.244.0.0", 27, n).collect();
        let mut got: Vec<IpNet> = r.iter().flat_map(|r| r.cidrs.iter().copied()).collect();
        got.sort();
        got.dedup();
        match frozen {
            None => assert_eq!(got, {
                let mut o = own;
                o.sort();
                o
            }),
            Some(p) => assert_eq!(got, [p.parse::<IpNet>().unwrap()]),
        }
    }
}

/// The check at 100,000 /26 blocks in two /9 pools (compute-100k's shape) with nothing to
/// refuse: the median of 11 runs. Run in release for the figure
/// (`cargo test --release -p routewarden --lib block_check -- --ignored --nocapture`);
/// bounded at 25 ms there.
#[test]
#[ignore = "a timing: run in release"]
fn blocks_100k_are_checked_in_n_log_n() {
    let mut c = Cluster::default();
    c.ip_pools.insert("ipip".into(), v4_pool("ipip", "10.0.0.0/9", 26));
    c.ip_pools.insert("flat".into(), v4_pool("flat", "10.128.0.0/9", 26));
    add_blocks(&mut c, consecutive("10.0.0.0", 26, 50_000).chain(consecutive("10.128.0.0", 26, 50_000)));
    let mut times: Vec<Duration> = (0..11)
        .map(|_| {
            let mut copy = c.clone();
            let t = Instant::now();
            let r = check(&mut copy);
            let e = t.elapsed();
            assert!(r.is_empty());
            e
        })
        .collect();
    times.sort();
    println!("check_blocks at 100,000 /26 blocks: median {:?} (min {:?}, max {:?})", times[5], times[0], times[10]);
    assert!(times[5] < Duration::from_millis(25), "{:?}", times[5]);
}
