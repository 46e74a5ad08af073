//! Bad input gives a typed error naming the source and the place, never a panic.

mod common;
use common::*;
use et_schema::testkit::{tensor, NodeBuilder, TraceBuilder};
use et_schema::*;
use serde_json::json;
use std::io::Write;

fn parse(s: &[u8]) -> Result<Trace> {
    parse_trace(s, "t.json", &ParseOptions::default())
}

/// The good fixture built by the test kit: the process root and one relu (rf_id 1, no schema),
/// the relu adjusted by `edit`. [`GOOD`] is the same document as text, which the tests below
/// break byte by byte.
fn good_with(edit: impl FnOnce(NodeBuilder<'_>) -> NodeBuilder<'_>) -> Vec<u8> {
    let mut b = TraceBuilder::new().meta("pid", 1);
    edit(
        b.node("aten::relu")
            .rf_id(1)
            .input(tensor(3, 4, 0, 6, 4, "cpu"), json!([2, 3]), "Tensor(float)")
            .output(tensor(5, 6, 0, 6, 4, "cpu"), json!([2, 3]), "Tensor(float)"),
    )
    .done();
    b.to_bytes()
}

/// The good fixture as text, kept verbatim: the tests break it byte by byte.
const GOOD: &str = r#"{"schema": "1.1.1-chakra.0.0.4", "pid": 1, "nodes": [
 {"id": 1, "name": "[pytorch|profiler|execution_trace|process]", "ctrl_deps": 0, "inputs": {"values": [], "shapes": [], "types": []}, "outputs": {"values": [], "shapes": [], "types": []}, "attrs": []},
 {"id": 2, "name": "aten::relu", "ctrl_deps": 1, "inputs": {"values": [[3, 4, 0, 6, 4, "cpu"]], "shapes": [[2, 3]], "types": ["Tensor(float)"]}, "outputs": {"values": [[5, 6, 0, 6, 4, "cpu"]], "shapes": [[2, 3]], "types": ["Tensor(float)"]}, "attrs": [{"name": "rf_id", "type": "uint64", "value": 1}]}
]}"#;

#[test]
fn the_good_fixture_parses() {
    let t = parse(GOOD.as_bytes()).unwrap();
    assert_eq!(t.nodes.len(), 2);
    assert_eq!(t.nodes[1].rf_id, Some(1));
    // The text and the builder describe the same document.
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(GOOD).unwrap(),
        serde_json::from_slice::<serde_json::Value>(&good_with(|n| n)).unwrap()
    );
}

#[test]
fn truncated_file_reports_offset_and_complete_nodes() {
    let real = read_input(&shared_traces().join("cpu/mlp.et.json")).unwrap();
    let cut = &real[..real.len() * 2 / 3];
    match parse(cut) {
        Err(Error::Truncated {
            offset,
            complete,
            last,
            context,
            ..
        }) => {
            assert_eq!(offset as usize, cut.len());
            assert_eq!(context, "the nodes array");
            assert!(complete > 50, "{complete}");
            assert!(last.contains("id"), "{last}");
        }
        other => panic!("{other:?}"),
    }
    let e = parse(cut).unwrap_err().to_string();
    assert!(e.starts_with("t.json: file ends at byte"), "{e}");
}

#[test]
fn truncated_gzip_is_a_gzip_error() {
    let raw = std::fs::read(shared_traces().join("cpu/cnn.et.json.gz")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("cut.json.gz");
    std::fs::write(&p, &raw[..raw.len() / 2]).unwrap();
    match read_trace(&p) {
        Err(Error::Gzip { path, .. }) => assert!(path.ends_with("cut.json.gz")),
        other => panic!("{other:?}"),
    }
}

#[test]
fn gzip_is_recognised_by_magic_bytes_not_name() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("trace.json");
    let mut gz = flate2::write::GzEncoder::new(
        std::fs::File::create(&p).unwrap(),
        flate2::Compression::fast(),
    );
    gz.write_all(&good_with(|n| n)).unwrap();
    gz.finish().unwrap();
    assert_eq!(read_trace(&p).unwrap().nodes.len(), 2);
}

#[test]
fn not_json_and_not_a_trace() {
    assert!(matches!(
        parse(b"hello"),
        Err(Error::Syntax { offset: 0, .. })
    ));
    assert!(matches!(parse(b""), Err(Error::NotATrace { .. })));
    assert!(matches!(
        parse(br#"{"schema": "1.0.1"}"#),
        Err(Error::NotATrace { .. })
    ));
    assert!(matches!(
        parse(br#"{"traceEvents": []}"#),
        Err(Error::NotATrace { .. })
    ));
    // Garbage inside a node: the offset points into that node.
    let bad = GOOD.replace(r#""name": "aten::relu""#, r#""name": aten::relu"#);
    match parse(bad.as_bytes()) {
        Err(Error::Syntax { offset, msg, .. }) => {
            assert_eq!(
                &bad.as_bytes()[offset as usize..offset as usize + 4],
                b"aten",
                "{msg}"
            );
            assert!(msg.contains("node 2"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn wrong_field_types_name_the_node() {
    let bad = GOOD.replace(r#""ctrl_deps": 1"#, r#""ctrl_deps": "one""#);
    match parse(bad.as_bytes()) {
        Err(Error::Node {
            node_id: Some(2),
            msg,
            ..
        }) => assert!(msg.contains("ctrl_deps"), "{msg}"),
        other => panic!("{other:?}"),
    }
    let bad = GOOD.replace(
        r#""types": ["Tensor(float)"]}, "outputs""#,
        r#""types": ["Tensor(float)", "Int"]}, "outputs""#,
    );
    match parse(bad.as_bytes()) {
        Err(Error::Node {
            node_id: Some(2),
            msg,
            ..
        }) => assert!(msg.contains("1 values but 2 types"), "{msg}"),
        other => panic!("{other:?}"),
    }
    let bad = GOOD.replace(r#""id": 2,"#, r#""id": -2,"#);
    assert!(matches!(parse(bad.as_bytes()), Err(Error::Node { .. })));
    let bad = GOOD.replace(
        r#""id": 2, "name": "aten::relu","#,
        r#""name": "aten::relu","#,
    );
    match parse(bad.as_bytes()) {
        Err(Error::Node { msg, .. }) => assert!(msg.contains("no \"id\""), "{msg}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn duplicate_ids_cycles_and_missing_parents() {
    match parse(&good_with(|n| n.id(1))) {
        Err(Error::DuplicateId {
            id: 1,
            first_offset,
            second_offset,
            ..
        }) => assert!(second_offset > first_offset),
        other => panic!("{other:?}"),
    }
    // A parent the file does not hold (the observer leaves some out): the node is read under
    // the root, and the trace says so.
    let t = parse(&good_with(|n| n.parent(77))).unwrap();
    let orphan = t.nodes.iter().find(|n| n.id == 2).unwrap();
    assert_eq!(orphan.parent, Some(1));
    assert!(
        t.warnings
            .iter()
            .any(|w| w.contains("77") && w.contains("top-level")),
        "{:?}",
        t.warnings
    );
    let cycle = GOOD.replace(r#""ctrl_deps": 0"#, r#""ctrl_deps": 2"#);
    assert!(matches!(parse(cycle.as_bytes()), Err(Error::Cycle { .. })));
    // A root pointing to itself is how 1.1.0 writes the process node: not a cycle.
    let self_root = GOOD.replace(r#""ctrl_deps": 0"#, r#""ctrl_deps": 1"#);
    assert!(parse(self_root.as_bytes()).is_ok());
}

#[test]
fn non_utf8_names_are_a_syntax_error_with_offset() {
    let mut bad = GOOD.as_bytes().to_vec();
    let at = GOOD.find("relu").unwrap();
    bad[at] = 0xff;
    match parse(&bad) {
        Err(Error::Syntax { offset, .. }) => {
            assert!((offset as usize).abs_diff(at) < 8, "{offset} vs {at}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn unknown_versions_parse_with_a_warning_and_missing_attrs_are_fine() {
    let future = GOOD.replace("1.1.1-chakra.0.0.4", "9.9.9-chakra.9");
    let t = parse(future.as_bytes()).unwrap();
    assert_eq!(t.warnings.len(), 1, "{:?}", t.warnings);
    // No attrs, no shapes, no schema at all.
    let bare = r#"{"nodes": [{"id": 5, "name": "x", "inputs": {"values": [1], "types": ["Int"]}, "outputs": {"values": [], "types": []}}]}"#;
    let t = parse(bare.as_bytes()).unwrap();
    assert_eq!(t.nodes[0].rf_id, None);
    assert_eq!(t.inputs(&t.nodes[0])[0].value, Value::Int(1));
}

#[test]
fn odd_values_are_kept() {
    let src = r#"{"schema": "1.0.1", "nodes": [{"id": 1, "name": "n", "parent": 0,
      "inputs": ["inf", "<None>", [[1, 2, 0, 4, 4, "cpu"], "<None>"], [7, 0, 0, 0, 0, ""], 1.5, true, 18446744073709551615, {"k": [1]}],
      "input_shapes": [[], [], [[2, 2], []], [], [], [], [], []],
      "input_types": ["Double", "None", "GenericList[Tensor(c10::Half),None]", "Tensor(nullptr (uninitialized))", "Double", "Bool", "Int", "Object"],
      "outputs": [], "output_shapes": [], "output_types": []}]}"#;
    let t = parse(src.as_bytes()).unwrap();
    let a = t.inputs(&t.nodes[0]);
    assert_eq!(t.as_f64(a[0].value), Some(f64::INFINITY));
    let l = t.list(a[2].value);
    assert!(matches!(l[0], Value::Tensor(_)));
    let Value::Tensor(u) = a[3].value else {
        panic!()
    };
    assert_eq!(t.tensor(u).storage, 0);
    assert_eq!(a[6].value, Value::UInt(u64::MAX));
    assert!(matches!(a[7].value, Value::Raw(_)));
    let mut ts = Vec::new();
    t.tensors_typed(a[2].value, &t.arg_type(&a[2]), &mut ts);
    assert_eq!(ts[0].1, Some(DType::Float16));
    let again = parse(&write_trace_to_vec(&t)).unwrap();
    assert_eq!(write_trace_to_vec(&again), write_trace_to_vec(&t));
}

#[test]
fn fuzz_regressions_round_trip() {
    // Found by `cargo fuzz run parse_trace`: attrs on a trace whose schema says flat layout,
    // attributes without values, unknown keys. Whatever parses must write back and re-parse.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_regressions");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let p = entry.unwrap().path();
        let name = p.display();
        let t = read_trace(&p).unwrap();
        let text = write_trace_to_vec(&t);
        let again = parse(&text)
            .unwrap_or_else(|e| panic!("{name}: {e}\n{}", String::from_utf8_lossy(&text)));
        assert_eq!(write_trace_to_vec(&again), text, "{name}");
        n += 1;
    }
    assert!(n >= 1);
}
