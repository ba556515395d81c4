//! The current-results table at the top of BENCHMARKS.md is what `cargo xtask bench` recorded:
//! it equals the table `bench/current-results.txt` renders, and every benchmark of the
//! registry has a row. A pasted or hand-edited figure fails here.

use std::path::PathBuf;

use routewarden_bench::results::{current_table, parse_records, render_table, RECORDS_FILE};
use routewarden_bench::ALL;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("bench/ has a parent").to_path_buf()
}

#[test]
fn benchmarks_md_opens_with_the_table_the_records_render() {
    let records = std::fs::read_to_string(root().join(RECORDS_FILE)).expect("read bench/current-results.txt");
    let records = parse_records(&records).expect("parse bench/current-results.txt");
    let doc = std::fs::read_to_string(root().join("BENCHMARKS.md")).expect("read BENCHMARKS.md");
    let table = current_table(&doc).expect("BENCHMARKS.md has the generated table");
    assert_eq!(
        table,
        render_table(&records, &ALL),
        "BENCHMARKS.md's table differs from bench/current-results.txt: run `cargo xtask bench`, never edit the table"
    );
    let first_section = doc.lines().find(|l| l.starts_with("## ")).expect("BENCHMARKS.md has sections");
    assert_eq!(first_section, "## Current results", "BENCHMARKS.md opens with the current results");
    for name in ALL {
        assert_eq!(records.iter().filter(|r| r.name() == name).count(), 1, "bench/current-results.txt has exactly one record of {name}");
    }
}
