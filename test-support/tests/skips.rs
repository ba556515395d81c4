//! Every skip goes through [`routewarden_lab::skip`], so that `cargo xtask test` counts it
//! (`xtask/src/test.rs`, `HOST_ALLOWED_SKIPS`) and no test passes silently with nothing
//! checked. This scan fails on any other code that prints a `SKIPPED` line.

use std::path::{Path, PathBuf};

/// Files allowed to hold a `"SKIPPED ` string literal: the one function that prints it, and
/// the QEMU lane, which parses those lines, and this scan (both test themselves with samples).
const ALLOWED: &[&str] = &["test-support/src/lib.rs", "test-support/tests/skips.rs", "xtask/src/qemu/mod.rs", "xtask/src/qemu/tests.rs"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
        let path = entry.expect("dir entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Lines of `text` holding a string literal that starts with `SKIPPED ` outside a comment.
fn skip_literals(text: &str) -> Vec<(usize, String)> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| {
            let code = l.trim_start();
            !code.starts_with("//") && code.contains("\"SKIPPED ")
        })
        .map(|(i, l)| (i + 1, l.trim().to_string()))
        .collect()
}

#[test]
fn every_skip_goes_through_the_counted_function() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf();
    let mut files = Vec::new();
    for crate_dir in ["agent", "test-support", "bench", "common", "xtask", "ebpf"] {
        rust_files(&root.join(crate_dir), &mut files);
    }
    assert!(files.len() > 50, "the scan found only {} Rust files under {}", files.len(), root.display());
    let mut offenders = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&root).expect("under root").to_string_lossy().into_owned();
        if ALLOWED.contains(&rel.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(f).expect("read source");
        offenders.extend(skip_literals(&text).into_iter().map(|(n, l)| format!("{rel}:{n}: {l}")));
    }
    assert!(offenders.is_empty(), "print skips with routewarden_lab::skip(test, reason), which the run counts:\n{}", offenders.join("\n"));
}

#[test]
fn the_scan_sees_a_direct_print_and_not_a_comment() {
    let sample = "fn t() {\n    // eprintln!(\"SKIPPED x: y\");\n    eprintln!(\"SKIPPED {test}: no tool\");\n}\n";
    assert_eq!(skip_literals(sample), vec![(3, "eprintln!(\"SKIPPED {test}: no tool\");".to_string())]);
}
