//! Frozen ground is bounded per input, not per object.

use std::fmt::Write as _;

use crate::datastore::FileDatastore;
use crate::plan::frozen_ground;

/// 1,000 invalid pools naming 1,000 addresses each froze 1,001,000 prefixes (the cap of
/// 1,024 was per object), which the reconciler compares every route against. One input's
/// invalid objects freeze at most 1,024 prefixes one by one; past that, the whole address
/// space (two prefixes) with one reason naming the input. Another input's stay as they are.
#[test]
fn an_inputs_invalid_objects_freeze_at_most_1024_prefixes_one_by_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut text = String::new();
    for p in 0..1_000u32 {
        let _ = write!(text, "---\napiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {{name: bad-{p}}}\nspec: {{cidr: [");
        for a in 0..1_000u32 {
            let _ = write!(text, "{}10.{}.{}.{}", if a == 0 { "" } else { ", " }, 100 + p / 250, p % 250, a % 250);
        }
        text.push_str("]}\n");
    }
    std::fs::write(dir.path().join("bomb.yaml"), text).unwrap();
    std::fs::write(
        dir.path().join("small.yaml"),
        "apiVersion: projectcalico.org/v3\nkind: IPPool\nmetadata: {name: small}\nspec: {cidr: 10.9.0.0/16, ipipMode: Sometimes}\n",
    )
    .unwrap();
    let snapshot = FileDatastore::load(dir.path()).unwrap();
    assert_eq!(snapshot.object_errors.len(), 1_001);
    let frozen = frozen_ground(&snapshot);
    let got: Vec<String> = frozen.iter().map(|f| f.cidr.to_string()).collect();
    assert_eq!(got, ["0.0.0.0/0", "10.9.0.0/16", "::/0"]);
    assert!(frozen[0].reason.ends_with("bomb.yaml: its invalid objects name more than 1024 prefixes: the whole address space is frozen until they are fixed (routewarden explain lists them)"), "{}", frozen[0].reason);
}
