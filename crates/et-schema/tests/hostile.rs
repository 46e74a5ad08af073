//! Hostile inputs: deep nesting, crafted split points, colliding hash keys, huge strings, gzip
//! bombs and absurd Kineto values give a typed error naming the place (or a counted warning)
//! within bounded time and memory, never an abort or a hang. The inputs are generated here, not
//! stored (except the fuzz seeds, which are small).

use et_schema::kineto::parse_kineto;
use et_schema::*;

const DEEP: usize = 20_000;

fn opts(threads: usize) -> ParseOptions {
    ParseOptions {
        threads,
        validate: true,
        ..Default::default()
    }
}

fn nest(open: &str, inner: &str, close: &str, n: usize) -> String {
    let mut s = String::with_capacity(n * (open.len() + close.len()) + inner.len());
    for _ in 0..n {
        s.push_str(open);
    }
    s.push_str(inner);
    for _ in 0..n {
        s.push_str(close);
    }
    s
}

/// A padding node of the nested layout (about 330 bytes).
fn pad_node(id: u64) -> String {
    format!(
        r#"{{"id": {id}, "name": "aten::relu", "ctrl_deps": 1, "inputs": {{"values": [[3, 4, 0, 6, 4, "cpu"]], "shapes": [[2, 3]], "types": ["Tensor(float)"]}}, "outputs": {{"values": [[5, 6, 0, 6, 4, "cpu"]], "shapes": [[2, 3]], "types": ["Tensor(float)"]}}, "attrs": [{{"name": "rf_id", "type": "uint64", "value": {id}}}]}}"#
    )
}

/// A nested-layout trace: the process root, padding nodes up to `min_bytes`, then `special`
/// (a node record whose id is one more than the last padding node's; `{ID}` is replaced).
fn trace_with(special: &str, min_bytes: usize) -> (Vec<u8>, u64) {
    let mut s = String::from(
        r#"{"schema": "1.1.1-chakra.0.0.4", "pid": 1, "nodes": [{"id": 1, "name": "[pytorch|profiler|execution_trace|process]", "ctrl_deps": 0, "inputs": {"values": [], "shapes": [], "types": []}, "outputs": {"values": [], "shapes": [], "types": []}, "attrs": []}"#,
    );
    let mut id = 2;
    while s.len() < min_bytes {
        s.push_str(",\n");
        s.push_str(&pad_node(id));
        id += 1;
    }
    s.push_str(",\n");
    s.push_str(&special.replace("{ID}", &id.to_string()));
    s.push_str("]}");
    (s.into_bytes(), id)
}

/// A node record with one input of the given value text and type string.
fn node_with_input(value: &str, ty: &str) -> String {
    format!(
        r#"{{"id": {{ID}}, "name": "aten::deep", "ctrl_deps": 1, "inputs": {{"values": [{value}], "shapes": [[]], "types": [{ty}]}}, "outputs": {{"values": [], "shapes": [], "types": []}}, "attrs": []}}"#,
        ty = serde_json::to_string(ty).unwrap()
    )
}

/// Runs `f` on a thread with half the usual 2 MiB stack of a spawned thread, unoptimised: a
/// recursion without a depth limit overflows here, and one with [`MAX_NESTING`] must not.
fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap()
}

// ---- 1. deep nesting ---------------------------------------------------------------------

#[test]
fn op_schemas_nested_20000_deep_are_an_error_not_a_stack_overflow() {
    let cases = [
        format!("aten::x(Tensor a) -> {}", nest("(", "Tensor", ")", DEEP)),
        format!("aten::x({} a) -> Tensor", nest("(", "Tensor", ")", DEEP)),
        format!(
            "aten::x({} a) -> Tensor",
            nest("Dict(str, ", "Tensor", ")", DEEP)
        ),
        format!(
            "aten::x({} a) -> Tensor",
            nest("Future(", "Tensor", ")", DEEP)
        ),
        // Postfix wrappers are parsed in a loop, but the type they build is as deep.
        format!("aten::x(Tensor{} a) -> Tensor", "[]".repeat(DEEP)),
        format!("aten::x(Tensor{} a) -> Tensor", "?".repeat(DEEP)),
        format!("aten::x(Tensor{} a) -> Tensor", "[3]?".repeat(DEEP)),
        format!(
            "aten::x(Tensor a) -> {}",
            nest("(", "Tensor[]", ")[]", DEEP / 2)
        ),
    ];
    for s in cases {
        let e = on_small_stack(move || OpSchema::parse(&s).map(|_| ()).unwrap_err());
        assert!(e.msg.contains("nested deeper than"), "{e}");
        assert!(e.pos > 0, "{e}");
    }
    // Within the limit, both forms parse and print back.
    let ok = format!(
        "aten::x({} a) -> Tensor",
        nest("(", &format!("Tensor{}", "[]?".repeat(20)), ")", 60)
    );
    let s = on_small_stack(move || OpSchema::parse(&ok).unwrap().to_string());
    assert!(OpSchema::parse(&s).is_ok());
}

#[test]
fn type_strings_nested_20000_deep_are_an_error_not_a_stack_overflow() {
    for (open, close) in [("Tuple[", "]"), ("GenericList[", "]"), ("List[", "]")] {
        let s = nest(open, "Tensor(float)", close, DEEP);
        let e = on_small_stack(move || ValueType::parse(&s).unwrap_err());
        assert!(e.msg.contains("nested deeper than"), "{e}");
    }
    let s = nest("Tuple[Int,", "Int", "]", MAX_NESTING);
    assert!(ValueType::parse(&s).is_ok());
    let s = nest("Tuple[Int,", "Int", "]", MAX_NESTING + 1);
    assert!(ValueType::parse(&s).is_err());
}

/// Deep type strings and deep values inside a trace over 4 MiB, which the default options
/// parse on worker threads: the same result on one thread, two, and the default.
#[test]
fn deep_nesting_in_node_inputs_is_refused_alike_on_every_thread() {
    // A type string 20,000 levels deep: not a type this crate can use, kept as written.
    let deep_ty = nest("Tuple[", "Int", "]", DEEP);
    let (doc, id) = trace_with(&node_with_input("1", &deep_ty), 4 << 20 | 4096);
    assert!(doc.len() > 4 << 20);
    let mut models = Vec::new();
    for threads in [1, 2, 0] {
        let t = parse_trace(&doc, "deep.json", &opts(threads)).unwrap();
        let n = t.nodes.iter().find(|n| n.id == id).unwrap();
        let a = t.inputs(n)[0];
        assert_eq!(t.str(a.ty), deep_ty);
        assert!(matches!(t.arg_type(&a), ValueType::Opaque(_)));
        models.push(write_trace_to_vec(&t));
    }
    assert!(models.windows(2).all(|w| w[0] == w[1]));

    // A value 20,000 levels deep: an error naming the node and the field, on every thread.
    let deep_value = nest("[", "1", "]", DEEP);
    let (doc, id) = trace_with(&node_with_input(&deep_value, "Int"), 4 << 20 | 4096);
    for threads in [1, 2, 0] {
        let e = parse_trace(&doc, "deep.json", &opts(threads)).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains(&format!("node {id}")), "{msg}");
        assert!(msg.contains("\"inputs\""), "{msg}");
        assert!(msg.contains("nested deeper than"), "{msg}");
    }

    // Just inside the limits: typed values nested as deep as allowed parse the same way on
    // every thread, also on a small stack. The record, `inputs` and `values` take 3 of the 127
    // levels serde_json allows (its limit of 128 counts the one that fails).
    let too_deep = nest("[", "1", "]", MAX_NESTING - 3);
    let (doc, _) = trace_with(&node_with_input(&too_deep, "Int"), 0);
    assert!(parse_trace(&doc, "deep.json", &opts(1)).is_err());
    let depth = MAX_NESTING - 5;
    let ty = nest("Tuple[", "Tensor(float)", "]", depth);
    let value = nest("[", "[7, 8, 0, 4, 4, \"cpu\"]", "]", depth);
    let (doc, id) = trace_with(&node_with_input(&value, &ty), 4 << 20 | 4096);
    let mut models = Vec::new();
    for threads in [1, 2, 0] {
        let t = parse_trace(&doc, "deep.json", &opts(threads)).unwrap();
        let n = t.nodes.iter().find(|n| n.id == id).unwrap();
        let a = t.inputs(n)[0];
        let mut ts = Vec::new();
        t.tensors_typed(a.value, &t.arg_type(&a), &mut ts);
        assert_eq!(ts.len(), 1);
        models.push(write_trace_to_vec(&t));
    }
    assert!(models.windows(2).all(|w| w[0] == w[1]));
    let small = on_small_stack(move || {
        write_trace_to_vec(&parse_trace(&doc, "deep.json", &opts(1)).unwrap())
    });
    assert_eq!(small, models[0]);
}

#[test]
fn deeply_nested_top_level_keys_and_kineto_args_are_errors() {
    let doc = format!(
        r#"{{"schema": "1.1.1-chakra.0.0.4", "x": {}, "nodes": []}}"#,
        nest("[", "1", "]", DEEP)
    );
    let e = parse_trace(doc.as_bytes(), "t.json", &opts(1)).unwrap_err();
    assert!(e.to_string().contains("\"x\""), "{e}");
    // Kineto: unknown keys are skipped without recursion (and kept nowhere); known ones that
    // hold JSON are limited.
    let k = format!(
        r#"{{"traceEvents": [{{"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": {{"x": {}}}}}]}}"#,
        nest("{\"a\": ", "1", "}", DEEP)
    );
    assert_eq!(
        parse_kineto(k.as_bytes(), "k.json").unwrap().events.len(),
        1
    );
    let k = format!(
        r#"{{"distributedInfo": {}, "traceEvents": []}}"#,
        nest("{\"a\": ", "1", "}", DEEP)
    );
    let e = parse_kineto(k.as_bytes(), "k.json").unwrap_err();
    assert!(e.to_string().contains("nested deeper than"), "{e}");
}

// ---- 2. the parallel split ---------------------------------------------------------------

/// Every `},{` inside this node looks like a split point whose object closes only at the end
/// of the file: probing each candidate to its end would be quadratic (over 400 s for a 4.3 MB
/// file). The probing is budgeted, and the serial path refuses the node.
#[test]
fn crafted_nesting_does_not_make_the_split_probing_quadratic() {
    let levels = 250_000; // about 3 MB
    let node = format!(
        r#"{{"id": {{ID}}, "name": "n", "ctrl_deps": 1, "inputs": [], "x": {}}}"#,
        nest(r#"[{}, {"a": "#, "1", "}]", levels)
    );
    let (doc, id) = trace_with(&node, 64 << 10);
    assert!(doc.len() > 3_000_000);
    for threads in [2, 3, 0] {
        let e = parse_trace(&doc, "split.json", &opts(threads)).unwrap_err();
        assert!(e.to_string().contains(&format!("node {id}")), "{e}");
    }
    // The same shape at the top level of the document, outside any node.
    let mut top = String::from(r#"{"schema": "1.1.1-chakra.0.0.4", "nodes": ["#);
    top.push_str(&pad_node(1).replace("\"ctrl_deps\": 1", "\"ctrl_deps\": 0"));
    top.push_str(", ");
    top.push_str(&nest(r#"{"id": 2, "inputs": [{}, "#, "1", "]}", levels));
    top.push_str("]}");
    assert!(parse_trace(top.as_bytes(), "split.json", &opts(2)).is_err());
}

// ---- 2. hash flooding ---------------------------------------------------------------------

/// Ids the file chooses to collide under FxHash (`K^-1 * (j << 6)`: every hash has the same
/// low and top bits) would make an FxHash id index quadratic: 3 s for 20,000 nodes, hours for
/// a million (these 400,000: about 20 minutes). Validation builds that index on every parse.
#[test]
fn node_ids_made_to_collide_under_fxhash_do_not_make_parsing_quadratic() {
    const K: u64 = 0xf135_7aea_2e62_a9c5;
    let mut kinv: u64 = 1;
    for _ in 0..7 {
        kinv = kinv.wrapping_mul(2u64.wrapping_sub(K.wrapping_mul(kinv)));
    }
    assert_eq!(kinv.wrapping_mul(K), 1);
    let ids: Vec<u64> = (1..=400_000u64)
        .map(|j| kinv.wrapping_mul(j << 6))
        .collect();
    let index = IdIndex::new(ids.iter().copied());
    assert!(matches!(index, IdIndex::Sparse(_)));
    assert_eq!(index.position(ids[777]), Some(777));
    // The same through the parser: flat-layout nodes with those ids, all roots.
    let mut doc = String::from(r#"{"schema": "1.0.1", "nodes": ["#);
    for (k, id) in ids.iter().take(30_000).enumerate() {
        if k > 0 {
            doc.push(',');
        }
        doc.push_str(&format!(r#"{{"id": {id}, "name": "n", "parent": 0, "inputs": [], "input_types": [], "outputs": [], "output_types": []}}"#));
    }
    doc.push_str("]}");
    assert_eq!(
        parse_trace(doc.as_bytes(), "ids.json", &opts(1))
            .unwrap()
            .nodes
            .len(),
        30_000
    );
    // Kineto pids are the file's to choose too.
    let mut k = String::from(r#"{"traceEvents": ["#);
    for (n, id) in ids.iter().take(30_000).enumerate() {
        if n > 0 {
            k.push(',');
        }
        k.push_str(&format!(r#"{{"ph": "X", "cat": "cpu_op", "name": "a", "pid": {}, "tid": 1, "ts": 1, "dur": 1}}"#, *id as i64));
    }
    k.push_str("]}");
    assert!(parse_kineto(k.as_bytes(), "k.json")
        .unwrap()
        .main_pid()
        .is_some());
}

// ---- 3. huge strings in messages ---------------------------------------------------------

#[test]
fn huge_strings_are_not_copied_whole_into_messages() {
    let huge = "9".repeat(8 << 20);
    let doc = format!(r#"{{"schema": "{huge}", "nodes": []}}"#);
    let t = parse_trace(doc.as_bytes(), "t.json", &opts(1)).unwrap();
    assert_eq!(t.meta.schema.len(), huge.len());
    assert_eq!(t.warnings.len(), 1);
    assert!(t.warnings[0].len() < 1000, "{}", t.warnings[0].len());
    assert!(
        t.warnings[0].contains("8388608 bytes"),
        "{}",
        &t.warnings[0][..200]
    );

    let doc = format!(r#"{{"schema": "1.0.1", "pid": "{huge}", "nodes": []}}"#);
    let e = parse_trace(doc.as_bytes(), "t.json", &opts(1))
        .unwrap_err()
        .to_string();
    assert!(
        e.len() < 1000 && e.contains("\"pid\""),
        "{}",
        &e[..e.len().min(300)]
    );

    let (doc, id) = trace_with(
        &format!(r#"{{"id": {{ID}}, "name": "n", "ctrl_deps": 1, "inputs": "{huge}"}}"#),
        0,
    );
    let e = parse_trace(&doc, "t.json", &opts(1))
        .unwrap_err()
        .to_string();
    assert!(
        e.len() < 1000 && e.contains(&format!("node {id}")),
        "{}",
        &e[..e.len().min(300)]
    );

    let k = format!(r#"{{"traceEvents": [{{"ph": "X", "ts": "{huge}"}}]}}"#);
    let e = parse_kineto(k.as_bytes(), "k.json")
        .unwrap_err()
        .to_string();
    assert!(e.len() < 1000, "{}", &e[..300]);
    assert!(e.contains("expected f64 at byte "), "{}", &e[..300]);

    let ty = format!("{}[Int]", "X".repeat(8 << 20));
    let e = ValueType::parse(&ty).unwrap_err().to_string();
    assert!(e.len() < 1000, "{}", &e[..300]);
}

// ---- 3. gzip bombs ------------------------------------------------------------------------

fn gz(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

#[test]
fn gzip_bombs_stop_at_the_limit_with_a_message_naming_it() {
    // 16 MiB of zeros in about 16 KiB, as four members (a multi-member bomb).
    let member = gz(&vec![0u8; 4 << 20]);
    let bomb: Vec<u8> = member
        .iter()
        .copied()
        .cycle()
        .take(member.len() * 4)
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bomb.json.gz");
    std::fs::write(&p, &bomb).unwrap();
    let ro = ReadOptions {
        max_decompressed: Some(1 << 20),
    };
    let e = read_input_with(&p, &ro).unwrap_err();
    assert!(
        matches!(&e, Error::DecompressedTooLarge { limit, path, .. } if *limit == 1 << 20 && path.ends_with("bomb.json.gz")),
        "{e}"
    );
    let msg = e.to_string();
    assert!(msg.contains("1048576 bytes (1.0 MiB)"), "{msg}");
    assert!(msg.contains(MAX_DECOMPRESSED_ENV), "{msg}");
    // The same through the Kineto reader; and a limit that fits lets it through.
    assert!(matches!(
        kineto::read_kineto_with(&p, &ro),
        Err(Error::DecompressedTooLarge { .. })
    ));
    let ro = ReadOptions {
        max_decompressed: Some(16 << 20),
    };
    assert_eq!(read_input_with(&p, &ro).unwrap().len(), 16 << 20);
}

// ---- 4. Kineto times ---------------------------------------------------------------------

#[test]
fn negative_or_absurd_kineto_times_are_dropped_with_a_counted_warning() {
    let k = br#"{"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "good", "pid": 1, "tid": 1, "ts": 10, "dur": 5},
        {"ph": "X", "cat": "cpu_op", "name": "neg_dur", "pid": 1, "tid": 1, "ts": 20, "dur": -5},
        {"ph": "X", "cat": "cpu_op", "name": "neg_ts", "pid": 1, "tid": 1, "ts": -20, "dur": 5},
        {"ph": "X", "cat": "cpu_op", "name": "huge_dur", "pid": 1, "tid": 1, "ts": 30, "dur": 1e300},
        {"ph": "X", "cat": "cpu_op", "name": "huge_ts", "pid": 1, "tid": 1, "ts": 1e300, "dur": 1},
        {"ph": "i", "cat": "cpu_op", "name": "instant", "pid": 1, "tid": 1, "ts": 40}
    ]}"#;
    let t = parse_kineto(k, "k.json").unwrap();
    let names: Vec<&str> = t.events.iter().map(|e| t.str(e.name)).collect();
    assert_eq!(names, ["good", "instant"]);
    assert!(t
        .events
        .iter()
        .all(|e| e.ts.is_finite() && e.ts >= 0.0 && e.dur.is_finite() && e.dur >= 0.0));
    assert_eq!(t.warnings.len(), 1, "{:?}", t.warnings);
    let w = &t.warnings[0];
    assert!(w.contains("4 events") && w.contains("neg_dur"), "{w}");
}

#[test]
fn a_truncated_kineto_trace_is_not_blamed_on_the_et_observer() {
    let k = br#"{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1}, {"ph": "X", "na"#;
    let e = parse_kineto(k, "k.json").unwrap_err().to_string();
    assert!(e.contains("truncated"), "{e}");
    assert!(
        !e.contains("ExecutionTraceObserver") && !e.contains("nodes"),
        "{e}"
    );
}

// ---- 5. messages -------------------------------------------------------------------------

#[test]
fn an_unparsable_op_schema_is_told_apart_from_a_missing_one() {
    let mut b = testkit::TraceBuilder::new();
    b.op("aten::relu", "aten::relu(Tensor self) -> Tensor")
        .done();
    b.op("aten::bad", "aten::bad(Tensor self -> Tensor").done();
    b.node("aten::none").done();
    let t = b.build();
    let s: Vec<_> = t.nodes.iter().map(|n| t.op_schema(n)).collect();
    assert!(s[0].is_none());
    assert_eq!(s[1].as_ref().unwrap().as_ref().unwrap().name, "aten::relu");
    let e = s[2].as_ref().unwrap().as_ref().unwrap_err();
    assert!(e.pos > 0, "{e}");
    assert!(s[3].is_none());
}

#[test]
fn values_print_as_recorded() {
    let mut b = testkit::TraceBuilder::new();
    b.node("n")
        .input(
            serde_json::json!([1, 2, -3, 4, 4, "cpu"]),
            serde_json::json!([2]),
            "Tensor(float)",
        )
        .input(
            serde_json::json!("x".repeat(1000)),
            serde_json::json!([]),
            "String",
        )
        .done();
    let t = b.build();
    let a = t.inputs(&t.nodes[1]);
    // Not a tensor tuple (negative offset): kept as a list, and printed as one.
    assert_eq!(t.value_text(a[0].value, 200), r#"[1, 2, -3, 4, 4, "cpu"]"#);
    let long = t.value_text(a[1].value, 100);
    assert!(long.len() < 150 && long.starts_with("\"xxx"), "{long}");
}

// ---- 6. the fuzz seeds -------------------------------------------------------------------

/// The files under `fuzz/seeds/<dir>` (and, for `trace`, the two layouts at the top).
fn seeds(dir: &str) -> Vec<(String, Vec<u8>)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds");
    let mut paths: Vec<_> = std::fs::read_dir(root.join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    if dir == "trace" {
        paths.extend(["nested.json", "flat.json"].map(|f| root.join(f)));
    }
    paths.sort();
    assert!(paths.len() >= 4, "{dir}: {paths:?}");
    paths
        .into_iter()
        .map(|p| (p.display().to_string(), std::fs::read(&p).unwrap()))
        .collect()
}

/// What the fuzz targets check, on the committed seeds: the hostile classes stay covered by
/// `cargo test` without cargo-fuzz.
#[test]
fn committed_fuzz_seeds_hold_the_fuzz_properties() {
    for (name, data) in seeds("trace") {
        let a = parse_trace(&data, "seed", &opts(1));
        let visitors = ParseOptions {
            visitors_only: true,
            ..opts(1)
        };
        for (b, what) in [
            (parse_trace(&data, "seed", &opts(2)), "one thread and two"),
            (
                parse_trace(&data, "seed", &visitors),
                "the reader and the visitors",
            ),
        ] {
            match (&a, &b) {
                (Ok(x), Ok(y)) => {
                    assert_eq!(
                        write_trace_to_vec(x),
                        write_trace_to_vec(y),
                        "{name}: {what}"
                    )
                }
                (Err(x), Err(y)) => assert_eq!(x.to_string(), y.to_string(), "{name}: {what}"),
                _ => panic!("{name}: {what} disagree"),
            }
        }
        if let Ok(t) = a {
            let text = write_trace_to_vec(&t);
            let again = parse_trace(&text, "again", &opts(1)).unwrap();
            assert_eq!(write_trace_to_vec(&again), text, "{name}");
            for n in &t.nodes {
                let _ = t.op_schema(n);
                for arg in t.inputs(n).iter().chain(t.outputs(n)) {
                    let mut ts = Vec::new();
                    t.tensors_typed(arg.value, &t.arg_type(arg), &mut ts);
                    assert!(t.value_text(arg.value, 64).len() <= 67, "{name}");
                }
            }
            assert!(t.warnings.iter().all(|w| w.len() < 2048), "{name}");
        } else if let Err(e) = a {
            assert!(e.to_string().len() < 2048, "{name}");
        }
    }
    // As the fuzz target `parse_node`: one record inside a well-formed trace.
    for (name, data) in seeds("node") {
        let mut text =
            br#"{"schema": "1.1.1-chakra.0.0.4", "nodes": [{"id": 1, "name": "root", "ctrl_deps": 1}, "#
                .to_vec();
        text.extend_from_slice(&data);
        text.extend_from_slice(b"]}");
        let visitors = ParseOptions {
            visitors_only: true,
            ..opts(1)
        };
        let (a, b) = (
            parse_trace(&text, "seed", &opts(1)),
            parse_trace(&text, "seed", &visitors),
        );
        match (&a, &b) {
            (Ok(x), Ok(y)) => {
                assert_eq!(x.nodes, y.nodes, "{name}");
                assert_eq!(write_trace_to_vec(x), write_trace_to_vec(y), "{name}");
            }
            (Err(x), Err(y)) => assert_eq!(x.to_string(), y.to_string(), "{name}"),
            _ => panic!("{name}: the reader and the visitors disagree: {a:?} / {b:?}"),
        }
        // The valid records the observer could write are the reader's own, not handed over.
        let own = [
            "nested", "flat", "escapes", "numbers", "dup_keys", "literals",
        ];
        if own.iter().any(|o| name.ends_with(&format!("/{o}.json"))) {
            assert!(a.is_ok(), "{name}: {a:?}");
            assert_eq!(records_read_by_visitors(&text).unwrap(), 0, "{name}");
        }
    }
    for (name, data) in seeds("kineto") {
        match parse_kineto(&data, "seed") {
            Ok(k) => assert!(
                k.events.iter().all(|e| [e.ts, e.dur, e.ts + e.dur]
                    .iter()
                    .all(|t| t.is_finite() && *t >= 0.0 && *t <= kineto::MAX_TIME_US)),
                "{name}"
            ),
            Err(e) => assert!(e.to_string().len() < 2048, "{name}"),
        }
    }
    for (name, data) in seeds("schema") {
        let s = String::from_utf8(data).unwrap();
        if let Ok(schema) = OpSchema::parse(&s) {
            let printed = schema.to_string();
            assert_eq!(OpSchema::parse(&printed).as_ref(), Ok(&schema), "{name}");
        }
    }
    for (name, data) in seeds("type") {
        let s = String::from_utf8(data).unwrap();
        if let Ok(t) = ValueType::parse(&s) {
            assert_eq!(ValueType::parse(&t.to_string()).as_ref(), Ok(&t), "{name}");
        }
    }
    let ro = ReadOptions {
        max_decompressed: Some(256 << 10),
    };
    for (name, data) in seeds("gzip") {
        match decompress_with(data, "seed", &ro) {
            Ok(out) => assert!(out.len() <= 256 << 10, "{name}"),
            Err(e) => assert!(
                matches!(e, Error::DecompressedTooLarge { .. } | Error::Gzip { .. }),
                "{name}: {e}"
            ),
        }
    }
}
