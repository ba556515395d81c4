use proptest::prelude::*;

use super::*;

fn chunks(text: &str, limits: &YamlLimits) -> Result<Vec<Chunk>, YamlError> {
    let mut out = Vec::new();
    for_each_chunk(text, limits, &mut |c| {
        out.push(c);
        true
    })?;
    Ok(out)
}

fn docs(text: &str) -> Vec<Value> {
    chunks(text, &YamlLimits::default())
        .unwrap()
        .into_iter()
        .map(|c| match c {
            Chunk::Document(v) => v,
            other => panic!("not a document: {other:?}"),
        })
        .collect()
}

/// The oracle: serde_yaml_ng's own reading of the same documents.
fn serde_docs(text: &str) -> Vec<Value> {
    crate::model::parse_yaml_documents(text).unwrap()
}

#[test]
fn documents_match_serde_yaml_ng() {
    let text = "\
a: 1
b: [0x1f, 0o17, 0b101, -5, +7, 007, -01, 1.5, -.inf, .nan, 1e3, 1_000]
c: {t: true, f: False, n: ~, e: , s: 'quoted 1', d: \"x\\ty\"}
d: !!str 123
e: !custom {k: v}
f: !!int 42
g: |
  literal
  block
h: >-
  folded
  text
i: 18446744073709551615
j: -9223372036854775808
---
- plain
- &anchor {x: 1}
- *anchor
---
just a string
";
    let ours = docs(text);
    let theirs = serde_docs(text);
    assert_eq!(ours.len(), 3);
    // NaN != NaN: compare the debug text of both.
    assert_eq!(format!("{ours:?}"), format!("{theirs:?}"));
}

#[test]
fn list_items_stream_and_the_header_follows() {
    let text = "apiVersion: v1\nitems:\n- {kind: IPPool, metadata: {name: a}}\n- {kind: IPPool, metadata: {name: b}}\nkind: List\n";
    let got = chunks(text, &YamlLimits::default()).unwrap();
    assert_eq!(got.len(), 4, "{got:?}");
    let Chunk::ListStart(s) = &got[0] else { panic!("{got:?}") };
    assert_eq!(s, &serde_yaml_ng::from_str::<Value>("apiVersion: v1").unwrap());
    let Chunk::ListItem(a) = &got[1] else { panic!("{got:?}") };
    assert_eq!(a["metadata"]["name"], Value::String("a".into()));
    let Chunk::ListHeader(h) = &got[3] else { panic!("{got:?}") };
    assert_eq!(h["kind"], Value::String("List".into()));
    assert!(h.get("items").is_none());
}

#[test]
fn depth_limit_stops_the_file_quickly() {
    let deep = "[".repeat(200_000);
    let started = std::time::Instant::now();
    let err = chunks(&deep, &YamlLimits::default()).unwrap_err();
    assert_eq!(err.message, "nesting deeper than 64 levels");
    assert_eq!(err.line, Some(1));
    assert!(started.elapsed() < std::time::Duration::from_secs(2), "{:?}", started.elapsed());
}

#[test]
fn long_sequences_and_big_objects_become_invalid_objects_with_their_start() {
    let limits = YamlLimits { max_sequence_len: 4, max_object_nodes: 1_000, ..YamlLimits::default() };
    let text = "items:\n- kind: IPAMBlock\n  metadata: {name: x}\n  spec: {cidr: 10.0.0.0/30, allocations: [0, 1, 2, 3, 4, 5]}\n- kind: IPPool\nkind: List\n";
    let got = chunks(text, &limits).unwrap();
    assert!(matches!(&got[0], Chunk::ListStart(_)), "{got:?}");
    let Chunk::Invalid { partial, line, reason, in_list } = &got[1] else { panic!("{got:?}") };
    assert_eq!(reason, "a sequence has more than 4 entries");
    assert_eq!((*line, *in_list), (4, true));
    assert_eq!(partial["metadata"]["name"], Value::String("x".into()));
    assert_eq!(partial["spec"]["cidr"], Value::String("10.0.0.0/30".into()));
    assert!(matches!(&got[2], Chunk::ListItem(_)), "the next item is unaffected: {got:?}");
    // Aliases count with their expansion.
    let bomb = "a: &a [1, 1, 1, 1]\nb: &b [*a, *a, *a, *a]\nc: &c [*b, *b, *b, *b]\nd: [*c, *c, *c, *c]\n";
    let limits = YamlLimits { max_object_nodes: 100, ..YamlLimits::default() };
    let got = chunks(bomb, &limits).unwrap();
    let Chunk::Invalid { reason, .. } = &got[0] else { panic!("{got:?}") };
    assert_eq!(reason, "object has more than 100 YAML nodes");
}

#[test]
fn duplicate_keys_and_huge_integers_make_the_object_invalid() {
    let got = chunks("a: 1\na: 2\n", &YamlLimits::default()).unwrap();
    assert!(matches!(&got[0], Chunk::Invalid { reason, .. } if reason == "duplicate mapping key \"a\""), "{got:?}");
    let got = chunks("a: 99999999999999999999999\n", &YamlLimits::default()).unwrap();
    assert!(matches!(&got[0], Chunk::Invalid { reason, .. } if reason == "integer 99999999999999999999999 is out of range"), "{got:?}");
}

#[test]
fn syntax_errors_carry_the_line() {
    let err = chunks("a: 1\nb: [\n", &YamlLimits::default()).unwrap_err();
    assert_eq!(err.line, Some(3), "{err:?}");
    let err = chunks("a: *nope\n", &YamlLimits::default()).unwrap_err();
    assert_eq!(err.message, "unknown alias *nope");
}

#[test]
fn empty_and_comment_only_inputs_have_no_chunks() {
    for text in ["", "   \n\n", "# only a comment\n", "---\n...\n"] {
        assert_eq!(chunks(text, &YamlLimits::default()).unwrap(), Vec::new(), "{text:?}");
    }
}

/// The merge key as go-yaml reads it (`decode.go` `merge`): explicit keys win wherever they
/// are written, of a sequence the earlier mapping wins, a quoted `"<<"` is a plain key.
#[test]
fn merge_keys_merge_as_go_yaml_does() {
    let text = "\
x: &x {a: 1, b: 2}
y: &y {a: 3, c: 4}
after: {<<: *x, b: 9}
before: {b: 9, <<: *x}
seq: {<<: [*x, *y]}
inline: {<<: {a: 5}, d: 6}
quoted: {'<<': *x}
";
    let doc = &docs(text)[0];
    let map = |k: &str| -> Vec<(String, i64)> {
        doc[k].as_mapping().unwrap().iter().map(|(k, v)| (k.as_str().unwrap().to_owned(), v.as_i64().unwrap_or(-1))).collect()
    };
    let pairs = |p: &[(&str, i64)]| p.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect::<Vec<_>>();
    assert_eq!(map("after"), pairs(&[("b", 9), ("a", 1)]));
    assert_eq!(map("before"), pairs(&[("b", 9), ("a", 1)]));
    assert_eq!(map("seq"), pairs(&[("a", 1), ("b", 2), ("c", 4)]));
    assert_eq!(map("inline"), pairs(&[("d", 6), ("a", 5)]));
    assert_eq!(map("quoted"), pairs(&[("<<", -1)]));
    assert_eq!(doc["quoted"]["<<"]["b"], Value::Number(2.into()));
}

#[test]
fn a_bad_merge_value_or_a_second_merge_key_makes_the_object_invalid_at_its_line() {
    let invalid = |text: &str| match chunks(text, &YamlLimits::default()).unwrap().remove(0) {
        Chunk::Invalid { line, reason, partial, in_list: false } => (line, reason, partial),
        other => panic!("not invalid: {other:?}"),
    };
    let (line, reason, partial) = invalid("kind: IPPool\nmetadata: {name: p}\nspec:\n  <<: 5\n  cidr: 10.0.0.0/24\n");
    assert_eq!((line, reason.as_str()), (4, "the merge key << needs a mapping or a sequence of mappings, found a number"));
    assert_eq!(partial["metadata"]["name"], Value::String("p".into()));
    let (line, reason, _) = invalid("x: &x {a: 1}\nm:\n  <<: [*x,\n    [1]]\n");
    assert_eq!((line, reason.as_str()), (4, "the merge key << needs a mapping or a sequence of mappings, found a sequence"));
    let (line, reason, _) = invalid("x: &x {a: 1}\nm:\n  <<: *x\n  <<: *x\n");
    assert_eq!((line, reason.as_str()), (4, "duplicate mapping key \"<<\""));
    // A key written twice is still a duplicate, merged or not.
    let (line, reason, _) = invalid("x: &x {a: 1}\nm: {<<: *x, b: 1, b: 2}\n");
    assert_eq!((line, reason.as_str()), (2, "duplicate mapping key \"b\""));
}

/// 140 KB of aliases over a 10,000-element anchor: each alias is charged before it is
/// cloned, so the object stops at its budget with the aliases that fit, at once.
#[test]
fn alias_bomb_is_refused_while_expanding() {
    let anchor = vec!["1"; 10_000].join(",");
    let aliases = vec!["*a"; 40_000].join(", ");
    let text = format!("kind: IPPool\nmetadata: {{name: bomb}}\nspec: {{cidr: 10.9.0.0/16}}\na: &a [{anchor}]\nb: [{aliases}]\n");
    assert!(text.len() > 140_000, "{}", text.len());
    let started = std::time::Instant::now();
    let got = chunks(&text, &YamlLimits::default()).unwrap();
    let took = started.elapsed();
    let [Chunk::Invalid { partial, line, reason, in_list: false }] = &got[..] else { panic!("{got:?}") };
    assert_eq!((*line, reason.as_str()), (5, "object has more than 250000 YAML nodes"));
    assert_eq!(partial["metadata"]["name"], Value::String("bomb".into()));
    assert_eq!(partial["spec"]["cidr"], Value::String("10.9.0.0/16".into()));
    // 11 nodes before `a`, a's 10,001, then 23 aliases of 10,001 fit in 250,000.
    assert_eq!(partial["b"].as_sequence().map(Vec::len), Some(23));
    assert!(took < std::time::Duration::from_secs(2), "{took:?}");
}

/// Objects that each stay within their own budget cannot together clone more nodes than
/// the input has bytes.
#[test]
fn aliases_are_bounded_per_input_as_well() {
    let anchor = vec!["1"; 90].join(",");
    let items = "- {k: *b}\n".repeat(20);
    let text = format!("kind: List\nmetadata: {{big: &b [{anchor}]}}\nitems:\n{items}");
    let limits = YamlLimits { max_object_nodes: 100, ..YamlLimits::default() };
    let got = chunks(&text, &limits).unwrap();
    let max = text.len();
    let refused: Vec<_> = got
        .iter()
        .filter_map(|c| match c {
            Chunk::Invalid { reason, .. } => Some(reason.as_str()),
            _ => None,
        })
        .collect();
    let kept = got.iter().filter(|c| matches!(c, Chunk::ListItem(_))).count();
    // Each alias clones 91 nodes: as many items as fit in the input's length are kept.
    assert_eq!(kept, max / 91);
    assert_eq!(refused, vec![format!("aliases expand to more than {max} YAML nodes in this input"); 20 - max / 91]);
}

/// Elements of `items` that are not mappings are counted into one chunk, whatever their
/// number and form; the objects among them are delivered as usual.
#[test]
fn list_items_that_are_not_objects_are_counted_not_kept() {
    let text = "kind: List\nitems:\n- 1\n- {kind: IPPool, metadata: {name: a}}\n- [x]\n- &s str\n- *s\n-\n";
    let got = chunks(text, &YamlLimits::default()).unwrap();
    assert_eq!(got.len(), 4, "{got:?}");
    assert!(matches!(&got[1], Chunk::ListItem(v) if v["metadata"]["name"] == Value::String("a".into())), "{got:?}");
    assert_eq!(got[2], Chunk::NotObjects { count: 5, first: Value::Number(1.into()), line: 3 });
    assert!(matches!(&got[3], Chunk::ListHeader(_)), "{got:?}");
}

/// A flow collection in block context is held whole by the parser before its first event:
/// past the look-ahead bound it stops the input, with its line; a JSON document's elements
/// are held one at a time, so a JSON file of any size within the limits reads.
#[test]
fn the_parsers_look_ahead_is_bounded() {
    let ones = vec!["1"; 200_000].join(",");
    let err = chunks(&format!("kind: List\nitems:\n  [{ones}]\n"), &YamlLimits::default()).unwrap_err();
    assert_eq!(err.line, Some(3));
    assert!(err.message.starts_with("a flow collection too large to parse in bounded memory"), "{err:?}");
    // On the key's line the collection is no simple key: read, the items counted.
    let got = chunks(&format!("kind: List\nitems: [{ones}]\n"), &YamlLimits::default()).unwrap();
    assert_eq!(got[1], Chunk::NotObjects { count: 200_000, first: Value::Number(1.into()), line: 2 });
    // The same as JSON: read, the items counted.
    let got = chunks(&format!("{{\"kind\": \"List\", \"items\": [{ones}]}}"), &YamlLimits::default()).unwrap();
    assert_eq!(got[1], Chunk::NotObjects { count: 200_000, first: Value::Number(1.into()), line: 1 });
    // A JSON object's values are no simple keys either: a long array in one is read (and
    // stops at the sequence limit as in YAML).
    let got = chunks(&format!("{{\"kind\": \"IPAMBlock\", \"spec\": {{\"allocations\": [{ones}]}}}}"), &YamlLimits::default()).unwrap();
    let [Chunk::Invalid { reason, line: 1, .. }] = &got[..] else { panic!("{got:?}") };
    assert_eq!(reason, "a sequence has more than 65536 entries");
    // Comments weigh nothing, however many indicators they hold.
    let text = format!("a: 1\n{}b: 2\n", "# x: [1, 2, 3, 4]\n".repeat(30_000));
    let got = chunks(&text, &YamlLimits::default()).unwrap();
    let [Chunk::Document(d)] = &got[..] else { panic!("{got:?}") };
    assert_eq!((&d["a"], &d["b"]), (&Value::Number(1.into()), &Value::Number(2.into())));
    // A long quoted or block scalar is one token, however many commas it holds.
    let commas = ",".repeat(300_000);
    let got = chunks(&format!("a: '{commas}'\nb: |\n  {commas}\n  {commas}\nc: 1\n"), &YamlLimits::default()).unwrap();
    let [Chunk::Document(d)] = &got[..] else { panic!("{got:?}") };
    assert_eq!(d["a"].as_str().map(str::len), Some(300_000));
    assert_eq!(d["b"].as_str().map(str::len), Some(600_002));
    assert_eq!(d["c"], Value::Number(1.into()));
}

proptest! {
    /// Any plain scalar resolves as serde_yaml_ng resolves it.
    #[test]
    fn plain_scalars_resolve_as_serde_yaml_ng(s in "[-+0-9a-fxobA-FXOB._eEinfatrulsNTRUEFLS~]{1,12}") {
        let text = format!("k: {s}\n");
        let theirs = serde_yaml_ng::from_str::<Value>(&text);
        let ours = chunks(&text, &YamlLimits::default());
        match (theirs, ours) {
            (Ok(t), Ok(o)) => {
                let Some(Chunk::Document(o)) = o.into_iter().next() else { panic!("no document for {s:?}") };
                prop_assert_eq!(format!("{:?}", o), format!("{:?}", t), "{:?}", s);
            }
            (Err(_), Err(_)) => {}
            (Err(_), Ok(o)) => prop_assert!(matches!(o.first(), Some(Chunk::Invalid { .. })), "{:?}: serde_yaml_ng fails, we accept {:?}", s, o),
            (Ok(t), Err(e)) => prop_assert!(false, "{:?}: serde_yaml_ng reads {:?}, we fail: {}", s, t, e),
        }
    }
}
