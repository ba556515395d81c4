//! House rules a reviewer should not have to check by hand.
//!
//! DESIGN.md's behaviour → test index names tests that exist: every invariant has a row, and
//! every test a row names is `<file>::<fn>` with that function in that file (or a file that
//! exists), the way `docs/bad-input.md` is kept true by `agent/tests/bad_input.rs`.
//!
//! Also: no comment or doc in the Rust code refers to a tracker issue by number ("issue 18"):
//! a reader outside this tracker cannot follow it; a comment says why instead. And no source
//! file outside tests is longer than [`MAX_LINES`]: past that a file holds more than one
//! concern (split it by concern; tests go to `foo/tests.rs`).

use std::path::{Path, PathBuf};

/// The longest a source file outside tests may be.
const MAX_LINES: usize = 600;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("crate has a parent").to_path_buf()
}

/// The rows of the table under `## Invariants` whose header starts `| invariant`.
fn index_rows(design: &str) -> Vec<(String, String)> {
    let section = design.split("\n## Invariants").nth(1).expect("DESIGN.md has an Invariants section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let mut lines = section.lines().skip_while(|l| !l.starts_with("| invariant"));
    assert!(lines.next().is_some(), "DESIGN.md's Invariants section has a `| invariant | tests |` table");
    lines
        .take_while(|l| l.starts_with('|'))
        .filter(|l| !l.starts_with("|---"))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split(" | ").map(str::trim).collect();
            assert_eq!(cells.len(), 2, "an index row has 2 columns (invariant, tests): {l}");
            (cells[0].to_owned(), cells[1].to_owned())
        })
        .collect()
}

/// The backticked items of a cell.
fn items(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

#[test]
fn design_index_names_tests_that_exist() {
    let root = root();
    let design = std::fs::read_to_string(root.join("DESIGN.md")).expect("read DESIGN.md");
    let rows = index_rows(&design);
    let invariants =
        design.split("\n## Invariants").nth(1).unwrap().lines().filter(|l| l.split_once(". **").is_some_and(|(n, _)| n.parse::<u32>().is_ok())).count();
    assert!(invariants >= 7, "DESIGN.md numbers its invariants ({invariants} found)");
    for n in 1..=invariants {
        assert!(rows.iter().any(|(inv, _)| inv.split_whitespace().next() == Some(&n.to_string())), "invariant {n} has no row in DESIGN.md's test index");
    }
    let mut named = 0;
    for (inv, cell) in &rows {
        let tests = items(cell);
        assert!(!tests.is_empty(), "row {inv:?} names no test");
        for test in tests {
            named += 1;
            let (file, func) = test.rsplit_once("::").map_or((test, None), |(f, func)| (f, Some(func)));
            let path = root.join(file);
            assert!(path.exists(), "row {inv:?}: {file} does not exist (write tests as `<path from the repository root>::<fn>`)");
            if let Some(func) = func {
                let src = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
                assert!(src.contains(&format!("fn {func}(")), "row {inv:?}: {file} has no fn {func}");
            }
        }
    }
    assert!(named >= 30, "the index names {named} tests");
}

/// Every file or folder DESIGN.md names in backticks (`datastore/file.rs`, `plan/`) is in the
/// tree: a path may be written from the repository root or from any folder above it.
#[test]
fn every_path_design_md_names_exists() {
    let root = root();
    let design = std::fs::read_to_string(root.join("DESIGN.md")).expect("read DESIGN.md");
    let mut all = Vec::new();
    tree(&root, &root, &mut all);
    let mut missing = Vec::new();
    for item in items(&design) {
        let path = item.split("::").next().unwrap_or(item);
        let extension = Path::new(path).extension().and_then(|e| e.to_str());
        let looks_like_path = matches!(extension, Some("rs" | "md")) || (path.ends_with('/') && !path.contains(' '));
        // Globs, placeholders (`foo/tests.rs`, `<topic>`), etcd keys and the shared references
        // outside the repository are not paths of the tree.
        let placeholder = path.contains('*') || path.contains('<') || path.starts_with("foo/") || path.starts_with('/') || path.starts_with("../");
        if !looks_like_path || placeholder {
            continue;
        }
        let want = path.trim_end_matches('/');
        if !all.iter().any(|p| p == want || p.ends_with(&format!("/{want}"))) {
            missing.push(path.to_owned());
        }
    }
    assert!(missing.is_empty(), "DESIGN.md names paths that are not in the tree: {missing:?}");
}

/// Every file and folder under `dir`, relative to `root`, `/`-separated.
fn tree(dir: &Path, root: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
        let path = entry.expect("dir entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name == "target" || name.starts_with('.') {
            continue;
        }
        out.push(path.strip_prefix(root).expect("under root").to_string_lossy().replace('\\', "/"));
        if path.is_dir() {
            tree(&path, root, out);
        }
    }
}

/// The `.rs` and `.toml` files under `dir` (no `target/`, no hidden folders).
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut all = Vec::new();
    tree(dir, dir, &mut all);
    all.into_iter().map(|rel| dir.join(rel)).filter(|p| p.extension().is_some_and(|e| e == "rs" || e == "toml")).collect()
}

/// `issue 18`, `Issue 23's`, `issues 5 and 6`: a word "issue(s)" followed by a number.
fn issue_reference(line: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    lower.match_indices("issue").any(|(i, _)| {
        let before_ok = i == 0 || !lower.as_bytes()[i - 1].is_ascii_alphanumeric();
        let rest = lower[i + "issue".len()..].trim_start_matches('s');
        let rest = rest.strip_prefix(' ').unwrap_or("").trim_start_matches('#');
        before_ok && rest.starts_with(|c: char| c.is_ascii_digit())
    })
}

#[test]
fn code_refers_to_no_tracker_issue_by_number() {
    let root = root();
    let files = rust_files(&root);
    let this = file!().rsplit('/').next().unwrap_or_default().to_owned();
    let mut found = Vec::new();
    for path in &files {
        if path.ends_with(&this) {
            continue;
        }
        let text = std::fs::read_to_string(path).unwrap_or_default();
        for (n, line) in text.lines().enumerate() {
            if issue_reference(line) {
                found.push(format!("{}:{}: {}", path.strip_prefix(&root).unwrap_or(path).display(), n + 1, line.trim()));
            }
        }
    }
    assert!(found.is_empty(), "comments name tracker issues (say why instead):\n{}", found.join("\n"));
}

#[test]
fn an_issue_reference_is_a_word_and_a_number() {
    assert!(issue_reference("// (issue 18 part 1)"));
    assert!(issue_reference("//! Issue 23's targets"));
    assert!(issue_reference("issues 5 and 6"));
    assert!(issue_reference("see issue #7"));
    assert!(!issue_reference("// an issue with 3 pools"));
    assert!(!issue_reference("fn tissue1()"));
    assert!(!issue_reference("// issues"));
}

/// A test file: under a `tests/` folder, or a `tests.rs`.
fn is_test_file(rel: &Path) -> bool {
    rel.components().any(|c| c.as_os_str() == "tests") || rel.file_name().is_some_and(|n| n == "tests.rs")
}

#[test]
fn no_source_file_outside_tests_is_over_600_lines() {
    let root = root();
    let mut long = Vec::new();
    for dir in ["agent/src", "common/src", "ebpf/src", "test-support/src", "bench/src", "xtask/src"] {
        for path in rust_files(&root.join(dir)).iter().filter(|p| p.extension().is_some_and(|e| e == "rs")) {
            let rel = path.strip_prefix(&root).unwrap_or(path);
            let lines = std::fs::read_to_string(path).unwrap_or_default().lines().count();
            if lines > MAX_LINES && !is_test_file(rel) {
                long.push(format!("{} ({lines} lines)", rel.display()));
            }
        }
    }
    assert!(long.is_empty(), "source files over {MAX_LINES} lines (split them by concern): {long:?}");
}
