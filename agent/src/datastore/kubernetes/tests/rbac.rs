//! The RBAC tables ([`RBAC`], [`NAMESPACED_RBAC`]) against the ClusterRole and Roles in `deploy/`,
//! and against the watches the code starts.

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
    let strs =
        |v: &serde_yaml_ng::Value| -> Vec<String> { v.as_sequence().expect("a list").iter().map(|s| s.as_str().expect("a string").to_owned()).collect() };
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
    // Exactly what the code requests: no verb granted without use.
    let code = triples(RBAC.iter().map(|r| (r.api_group, r.resources.to_vec(), r.verbs.to_vec())));
    assert_eq!(manifest, code, "deploy/clusterrole.yaml and kubernetes::RBAC differ");

    // The table is the one the watchers use: every watched resource in both groups, and nothing
    // the code does not watch.
    let watched: BTreeSet<(String, String)> = [CalicoGroup::CrdV1, CalicoGroup::V3]
        .into_iter()
        .flat_map(|g| View::new(g, &optional_sources(true)).targets())
        .filter(|t| t.namespace.is_none())
        .map(|t| (t.api.group, t.api.plural))
        .collect();
    let table: BTreeSet<(String, String)> = RBAC.iter().flat_map(|r| r.resources.iter().map(|res| (r.api_group.to_owned(), (*res).to_owned()))).collect();
    assert_eq!(watched, table);
    // Read-only.
    for v in VERBS.iter().chain(RBAC.iter().flat_map(|r| r.verbs)) {
        assert!(["get", "list", "watch"].contains(v), "{v} is not a read verb");
    }
}

/// The namespaced reads both ways: the `Role` (and its `RoleBinding`, the file next to it) in
/// `deploy/` (base) and `deploy/operator/` (the operator component)
/// grants exactly a rule of [`NAMESPACED_RBAC`] in its namespace, bound to the agent's
/// ServiceAccount; and every namespaced watch the code starts (with or without the operator)
/// is covered by one of them, with the field selector that `resourceNames` needs.
#[test]
fn namespaced_rbac_matches_the_roles_in_deploy_exactly() {
    let deploy = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy"));
    let strs =
        |v: &serde_yaml_ng::Value| -> Vec<String> { v.as_sequence().expect("a list").iter().map(|s| s.as_str().expect("a string").to_owned()).collect() };
    for want in &NAMESPACED_RBAC {
        let one = |file: &str, kind: &str| {
            let path = deploy.join(want.manifest).with_file_name(file);
            let docs = parse_yaml_documents(&std::fs::read_to_string(&path).expect("manifest")).expect("YAML");
            assert_eq!(docs.len(), 1, "{}: one object", path.display());
            assert_eq!(docs[0]["kind"].as_str(), Some(kind), "{}", path.display());
            docs.into_iter().next().unwrap()
        };
        let role = one("role-calico-node-env.yaml", "Role");
        let binding = one("rolebinding-calico-node-env.yaml", "RoleBinding");
        assert_eq!(role["metadata"]["namespace"].as_str(), Some(want.namespace), "{}", want.manifest);
        assert_eq!(binding["metadata"]["namespace"].as_str(), Some(want.namespace), "{}", want.manifest);
        assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"], "{}", want.manifest);
        assert_eq!(binding["roleRef"]["kind"].as_str(), Some("Role"));
        let subjects = binding["subjects"].as_sequence().expect("subjects");
        assert_eq!(subjects.len(), 1);
        assert_eq!(
            (subjects[0]["kind"].as_str(), subjects[0]["name"].as_str(), subjects[0]["namespace"].as_str()),
            (Some("ServiceAccount"), Some("routewarden"), Some("routewarden"))
        );
        let rules = role["rules"].as_sequence().expect("rules");
        assert_eq!(rules.len(), 1, "{}: one rule", want.manifest);
        let r = &rules[0];
        assert_eq!(strs(&r["apiGroups"]), [want.rule.api_group]);
        assert_eq!(strs(&r["resources"]), want.rule.resources);
        assert_eq!(strs(&r["verbs"]), want.rule.verbs);
        assert_eq!(strs(&r["resourceNames"]), want.resource_names);
    }
    // The code's namespaced watches, with and without the operator: each is granted.
    let mut seen = BTreeSet::new();
    for operator in [false, true] {
        for t in View::new(CalicoGroup::CrdV1, &optional_sources(operator)).targets() {
            let Some(ns) = t.namespace else { continue };
            let grant = NAMESPACED_RBAC.iter().find(|g| g.namespace == ns).unwrap_or_else(|| panic!("no Role for the watch in {ns}"));
            assert_eq!((grant.rule.api_group, grant.rule.resources), (t.api.group.as_str(), &[t.api.plural.as_str()][..]));
            assert_eq!(t.field_selector, Some("metadata.name=calico-node"), "resourceNames needs the field selector");
            seen.insert(ns);
        }
    }
    // And no Role grants what no watch uses.
    assert_eq!(seen, NAMESPACED_RBAC.iter().map(|g| g.namespace).collect::<BTreeSet<_>>());
}
