//! The agent's files import in one direction: no file-level import cycle in `agent/src` (a
//! file and its own submodules aside).
//!
//! A file's imports are the `crate::…` and `super::…` paths in its code outside its test
//! module, each resolved to the longest module path that is a file of the tree.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Cycles that may remain, each as its sorted modules, with why it is still there. None: a
/// new cycle is fixed by moving the shared item to the lower file, not by listing it here.
const KNOWN: &[(&[&str], &str)] = &[];

fn files(dir: &Path, root: &Path, out: &mut BTreeMap<String, PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            files(&path, root, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path.strip_prefix(root).expect("under root").with_extension("");
            let mut parts: Vec<String> = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
            if parts.last().is_some_and(|l| l == "mod") {
                parts.pop();
            }
            let module = if parts == ["lib"] || parts == ["main"] { String::new() } else { parts.join("::") };
            out.insert(module, path);
        }
    }
}

fn is_test(module: &str) -> bool {
    module.rsplit("::").next().is_some_and(|last| last == "tests" || last.ends_with("_tests") || last == "fake") || module.contains("::tests::")
}

/// The code of a file without its comments and its `#[cfg(test)] mod tests` block.
fn code(text: &str) -> String {
    let text = text.find("#[cfg(test)]\nmod tests").map_or(text, |i| &text[..i]);
    text.lines().map(|l| l.find("//").map_or(l, |i| &l[..i])).collect::<Vec<_>>().join("\n")
}

/// Every `crate::a::b` / `super::a` path in `code`, braces of a `use` expanded one level.
fn paths(code: &str, module: &str) -> Vec<Vec<String>> {
    let parent: Vec<String> = module.split("::").filter(|p| !p.is_empty()).map(str::to_owned).collect();
    let parent = parent[..parent.len().saturating_sub(1)].to_vec();
    let mut out = Vec::new();
    for (start, _) in code.match_indices("crate::").chain(code.match_indices("super::")) {
        if code[..start].chars().last().is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let is_crate = code[start..].starts_with("crate::");
        let rest = &code[start + "crate::".len()..];
        let base = if is_crate { Vec::new() } else { parent.clone() };
        let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).unwrap_or(rest.len());
        let head: Vec<String> = rest[..end].split("::").filter(|p| !p.is_empty()).map(str::to_owned).collect();
        if rest[end..].starts_with('{') && rest[..end].ends_with("::") {
            let group = &rest[end + 1..rest[end..].find('}').map_or(rest.len(), |i| end + i)];
            for item in group.split(',') {
                let item = item.split_whitespace().next().unwrap_or("");
                if !item.is_empty() {
                    let mut p = base.clone();
                    p.extend(head.iter().cloned());
                    p.extend(item.split("::").map(str::to_owned));
                    out.push(p);
                }
            }
        }
        let mut p = base;
        p.extend(head);
        out.push(p);
    }
    out
}

/// The strongly connected components of more than one module (Tarjan), each sorted.
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> BTreeSet<Vec<String>> {
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: BTreeSet<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on.insert(v);
        for w in s.edges.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                component.push(w.to_owned());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.out.insert(component);
            }
        }
    }
    let mut s = State { edges, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), on: BTreeSet::new(), out: BTreeSet::new() };
    for v in edges.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

/// Import edges between the files of `agent/src` (tests and parent/child pairs left out).
fn edges() -> BTreeMap<String, BTreeSet<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../agent/src");
    let mut tree = BTreeMap::new();
    files(&root, &root, &mut tree);
    assert!(tree.len() > 50, "found only {} files under {}", tree.len(), root.display());
    let related = |a: &str, b: &str| a.is_empty() || b.is_empty() || a.starts_with(&format!("{b}::")) || b.starts_with(&format!("{a}::"));
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, path) in &tree {
        if is_test(module) {
            continue;
        }
        let text = std::fs::read_to_string(path).expect("read source");
        let targets = edges.entry(module.clone()).or_default();
        for p in paths(&code(&text), module) {
            let target = (1..=p.len()).rev().map(|k| p[..k].join("::")).find(|c| tree.contains_key(c));
            if let Some(t) = target.filter(|t| t != module && !is_test(t) && !related(module, t)) {
                targets.insert(t);
            }
        }
    }
    edges
}

#[test]
fn no_file_level_import_cycle_but_the_known_ones() {
    let found = cycles(&edges());
    let known: BTreeSet<Vec<String>> = KNOWN.iter().map(|(c, _)| c.iter().map(|m| (*m).to_owned()).collect()).collect();
    let new: Vec<_> = found.difference(&known).collect();
    assert!(new.is_empty(), "file-level import cycles in agent/src: {new:?}; move the shared item to the lower file");
    let gone: Vec<_> = known.difference(&found).collect();
    assert!(gone.is_empty(), "cycles in KNOWN are gone, take them out: {gone:?}");
}

#[test]
fn a_cycle_through_a_use_group_is_found() {
    let a = "use crate::x::{y, z::W};\nfn f() { super::q::r(); }\n";
    assert_eq!(
        paths(&code(a), "m::n"),
        vec![vec!["x", "y"], vec!["x", "z", "W"], vec!["x"], vec!["m", "q", "r"]]
            .into_iter()
            .map(|v| v.into_iter().map(str::to_owned).collect::<Vec<_>>())
            .collect::<Vec<_>>()
    );
    let mut e: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    e.entry("a".into()).or_default().insert("b".into());
    e.entry("b".into()).or_default().insert("c".into());
    e.entry("c".into()).or_default().insert("a".into());
    e.entry("d".into()).or_default().insert("a".into());
    assert_eq!(cycles(&e), BTreeSet::from([vec!["a".to_owned(), "b".into(), "c".into()]]));
}
