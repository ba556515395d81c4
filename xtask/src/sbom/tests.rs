use std::collections::BTreeSet;
use std::process::Command;

use serde_json::{json, Value};

use super::*;

fn pkg(id: &str, licence: &str, kind: &str) -> Value {
    json!({"id": id, "name": id, "version": "1.0.0", "license": licence, "source": if id == "routewarden" { Value::Null } else { json!("registry+https://github.com/rust-lang/crates.io-index") }, "targets": [{"kind": [kind]}, {"kind": ["test"]}]})
}

fn dep(pkg: &str, kinds: &[Option<&str>]) -> Value {
    json!({"pkg": pkg, "dep_kinds": kinds.iter().map(|k| json!({"kind": k})).collect::<Vec<_>>()})
}

/// The agent links `a` and, through it, `c` (normal there, dev elsewhere); not the build
/// dependency `b`, the dev dependency `t`, the proc macro `pm` (a test target of its own, as
/// cargo auditable miscounts) or `syn`, reached only through `pm`.
fn metadata() -> Value {
    json!({
        "packages": [
            pkg("routewarden", "Apache-2.0", "bin"), pkg("a", "MIT/Apache-2.0", "lib"), pkg("b", "MIT", "lib"), pkg("c", "Unicode-3.0", "lib"),
            pkg("t", "GPL-3.0-only", "lib"), pkg("pm", "MIT", "proc-macro"), pkg("syn", "MIT", "lib"),
        ],
        "resolve": {"nodes": [
            {"id": "routewarden", "deps": [dep("a", &[None]), dep("b", &[Some("build")]), dep("t", &[Some("dev")]), dep("pm", &[None])]},
            {"id": "a", "deps": [dep("c", &[Some("dev"), None]), dep("pm", &[None])]},
            {"id": "b", "deps": []}, {"id": "c", "deps": []}, {"id": "t", "deps": []},
            {"id": "pm", "deps": [dep("syn", &[None])]}, {"id": "syn", "deps": []},
        ]},
    })
}

#[test]
fn the_agent_links_normal_dependencies_but_no_build_dev_or_proc_macro_crate() {
    let linked = linked(&metadata(), "routewarden").unwrap();
    let names: Vec<(&str, Option<&str>)> = linked.iter().map(|l| (l.name.as_str(), l.licence.as_deref())).collect();
    assert_eq!(names, [("routewarden", Some("Apache-2.0")), ("a", Some("MIT/Apache-2.0")), ("c", Some("Unicode-3.0"))]);
    assert_eq!(linked[0].deps, BTreeSet::from(["a".to_owned()]));
    assert_eq!(linked[1].deps, BTreeSet::from(["c".to_owned()]));
    assert!(super::linked(&metadata(), "absent").is_err());
}

#[test]
fn the_document_is_cyclonedx_1_5_with_a_purl_and_a_licence_per_crate() {
    let mut out = Vec::new();
    bom(&linked(&metadata(), "routewarden").unwrap()).unwrap().output_as_json_v1_5(&mut out).unwrap();
    let doc: Value = serde_json::from_slice(&out).unwrap();
    let component = |name: &str, licence: &str, kind: &str| {
        let purl = format!("pkg:cargo/{name}@1.0.0");
        json!({"type": kind, "bom-ref": purl, "name": name, "version": "1.0.0", "licenses": [{"expression": licence}], "purl": purl})
    };
    assert_eq!(
        doc,
        json!({
            "bomFormat": "CycloneDX", "specVersion": "1.5", "version": 1,
            "metadata": {"component": component("routewarden", "Apache-2.0", "application")},
            "components": [component("a", "MIT OR Apache-2.0", "library"), component("c", "Unicode-3.0", "library")],
            "dependencies": [
                {"ref": "pkg:cargo/routewarden@1.0.0", "dependsOn": ["pkg:cargo/a@1.0.0"]},
                {"ref": "pkg:cargo/a@1.0.0", "dependsOn": ["pkg:cargo/c@1.0.0"]},
                {"ref": "pkg:cargo/c@1.0.0"},
            ],
        })
    );
}

#[test]
fn a_crate_without_a_licence_or_with_a_broken_one_fails() {
    let mut m = metadata();
    m["packages"][1]["license"] = Value::Null;
    assert!(bom(&linked(&m, "routewarden").unwrap()).unwrap_err().to_string().contains("pkg:cargo/a@1.0.0 declares no licence"));
    m["packages"][1]["license"] = json!("MIT OR OR");
    assert!(bom(&linked(&m, "routewarden").unwrap()).unwrap_err().to_string().contains("is not an SPDX expression"));
}

/// `(name, version, licence)` of each crate `cargo tree` shows the agent linking for `target`.
fn cargo_tree(target: &str) -> BTreeSet<(String, String, String)> {
    let out = Command::new("cargo")
        .args(["tree", "--locked", "-p", "routewarden", "--target", target, "-e", "normal,no-proc-macro", "--prefix", "none", "-f", "{p}\t{l}"])
        .current_dir(crate::workspace_root())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (p, licence) = l.split_once('\t').unwrap();
            let mut words = p.split_whitespace();
            let (name, version) = (words.next().unwrap(), words.next().unwrap().trim_start_matches('v'));
            (name.to_owned(), version.to_owned(), licence.trim_end_matches(" (*)").trim().to_owned())
        })
        .collect()
}

/// The SBOM `cargo xtask image` writes for this workspace names exactly the crates
/// `cargo tree` shows the agent linking, each with the licence its `Cargo.toml` declares.
#[test]
fn the_workspace_sbom_is_what_cargo_tree_says_the_agent_links() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sbom.json");
    let target = "x86_64-unknown-linux-gnu";
    let (count, digest) = write(&crate::workspace_root(), target, &path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(digest, sha256_hex(&bytes));
    let doc: Value = serde_json::from_slice(&bytes).unwrap();
    let entry = |c: &Value| {
        let licence = c["licenses"][0]["expression"].as_str().unwrap().to_owned();
        (c["name"].as_str().unwrap().to_owned(), c["version"].as_str().unwrap().to_owned(), licence)
    };
    let components: Vec<Value> = doc["components"].as_array().unwrap().clone();
    assert_eq!(components.len(), count);
    let mut listed: BTreeSet<_> = components.iter().map(entry).collect();
    listed.insert(entry(&doc["metadata"]["component"]));
    // cargo tree prints the licence as written; the SBOM reads the legacy `/` as `OR`.
    let want: BTreeSet<_> = cargo_tree(target).into_iter().map(|(n, v, l)| (n, v, l.replace('/', " OR "))).collect();
    assert_eq!(listed, want);
    for c in &components {
        assert_eq!(c["purl"], format!("pkg:cargo/{}@{}", c["name"].as_str().unwrap(), c["version"].as_str().unwrap()));
    }
    eprintln!("sbom: {count} crates besides the agent");
}

#[test]
fn sha256_is_lowercase_hex() {
    assert_eq!(sha256_hex(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}
