//! Tests of the Kubernetes datastore: the RBAC table against the manifest, and the datastore
//! against a mocked API server (tower-test) that asserts the exact requests.

use std::collections::BTreeSet;

use super::*;

/// `(apiGroup, resource, verb)` triples of a ClusterRole's rules.
fn triples<'a>(rules: impl IntoIterator<Item = (&'a str, Vec<&'a str>, Vec<&'a str>)>) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for (group, resources, verbs) in rules {
        for r in &resources {
            for v in &verbs {
                out.insert((group.to_owned(), (*r).to_owned(), (*v).to_owned()));
            }
        }
    }
    out
}

#[test]
fn rbac_table_matches_deploy_clusterrole_exactly() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/clusterrole.yaml");
    let text = std::fs::read_to_string(path).expect("deploy/clusterrole.yaml");
    let role: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("YAML");
    assert_eq!(role["kind"].as_str(), Some("ClusterRole"));
    let strs = |v: &serde_yaml_ng::Value| -> Vec<String> {
        v.as_sequence().expect("a list").iter().map(|s| s.as_str().expect("a string").to_owned()).collect()
    };
    let rules: Vec<(Vec<String>, Vec<String>, Vec<String>)> = role["rules"]
        .as_sequence()
        .expect("rules")
        .iter()
        .map(|r| {
            assert!(r.get("nonResourceURLs").is_none() && r.get("resourceNames").is_none(), "unexpected rule shape: {r:?}");
            (strs(&r["apiGroups"]), strs(&r["resources"]), strs(&r["verbs"]))
        })
        .collect();
    let mut manifest = BTreeSet::new();
    for (groups, resources, verbs) in &rules {
        for g in groups {
            manifest.extend(triples([(g.as_str(), resources.iter().map(String::as_str).collect(), verbs.iter().map(String::as_str).collect())]));
        }
    }
    // What the code requests, plus the verbs the manifest grants on purpose without use.
    let granted: Vec<&str> = VERBS.iter().chain(GRANTED_UNUSED_VERBS.iter()).copied().collect();
    let code = triples(RBAC.iter().map(|r| (r.api_group, r.resources.to_vec(), granted.clone())));
    assert_eq!(manifest, code, "deploy/clusterrole.yaml and kubernetes::RBAC differ");

    // The table is the one the watchers use: every watched resource in both groups, and nothing
    // the code does not watch.
    let watched: BTreeSet<(String, String)> = [CalicoGroup::CrdV1, CalicoGroup::V3]
        .into_iter()
        .flat_map(|g| View::new(g).api_resources())
        .map(|ar| (ar.group, ar.plural))
        .collect();
    let table: BTreeSet<(String, String)> =
        RBAC.iter().flat_map(|r| r.resources.iter().map(|res| (r.api_group.to_owned(), (*res).to_owned()))).collect();
    assert_eq!(watched, table);
    // Read-only.
    for v in VERBS.iter().chain(GRANTED_UNUSED_VERBS.iter()) {
        assert!(["get", "list", "watch"].contains(v), "{v} is not a read verb");
    }
}
