//! Every real trace in ../shared/traces parses, agrees with an independent DOM count, and
//! survives a write/read round trip unchanged.

mod common;
use common::*;
use et_schema::*;
use std::collections::HashMap;

/// Inputs of a DOM node in either layout: (values, types).
fn dom_inputs(n: &serde_json::Value) -> (Vec<serde_json::Value>, Vec<String>) {
    let (v, t) = match &n["inputs"] {
        serde_json::Value::Array(v) => (
            v.clone(),
            n["input_types"].as_array().cloned().unwrap_or_default(),
        ),
        o => (
            o["values"].as_array().cloned().unwrap_or_default(),
            o["types"].as_array().cloned().unwrap_or_default(),
        ),
    };
    (
        v,
        t.into_iter()
            .map(|x| x.as_str().unwrap().to_string())
            .collect(),
    )
}

#[test]
fn every_shared_trace_parses_and_matches_a_dom_count() {
    for path in all_et_files() {
        let t = read_trace(&path).unwrap_or_else(|e| panic!("{e}"));
        let d = dom(&path);
        let nodes = d["nodes"].as_array().unwrap();
        assert_eq!(t.nodes.len(), nodes.len(), "{}", path.display());
        assert_eq!(t.meta.schema, d["schema"].as_str().unwrap());
        let mut want: HashMap<String, usize> = HashMap::new();
        for n in nodes {
            *want
                .entry(n["name"].as_str().unwrap().to_string())
                .or_default() += 1;
        }
        let mut got: HashMap<String, usize> = HashMap::new();
        for n in &t.nodes {
            *got.entry(t.name(n).to_string()).or_default() += 1;
        }
        assert_eq!(got, want, "{}", path.display());
        // Node by node: ids, parents, input counts and tensor tuples.
        for (n, dn) in t.nodes.iter().zip(nodes) {
            assert_eq!(n.id, dn["id"].as_u64().unwrap());
            let parent = dn
                .get("ctrl_deps")
                .or_else(|| dn.get("parent"))
                .and_then(|p| p.as_u64());
            assert_eq!(n.parent, parent);
            let (vals, types) = dom_inputs(dn);
            let args = t.inputs(n);
            assert_eq!(args.len(), vals.len());
            for ((a, v), ty) in args.iter().zip(&vals).zip(&types) {
                assert_eq!(t.str(a.ty), ty);
                if ty.starts_with("Tensor(") && v.is_array() {
                    let Value::Tensor(i) = a.value else {
                        panic!("{}: node {} tensor not decoded", path.display(), n.id)
                    };
                    let x = t.tensor(i);
                    let arr = v.as_array().unwrap();
                    assert_eq!(x.id, arr[0].as_u64().unwrap());
                    assert_eq!(x.storage, arr[1].as_u64().unwrap());
                    assert_eq!(x.numel, arr[3].as_u64().unwrap());
                }
            }
        }
    }
}

#[test]
fn every_shared_trace_round_trips_losslessly() {
    for path in all_et_files() {
        let t = read_trace(&path).unwrap();
        let text = write_trace_to_vec(&t);
        // The written text is the same JSON document as the source, key order aside.
        let written: serde_json::Value = serde_json::from_slice(&text).unwrap();
        assert_eq!(
            written,
            dom(&path),
            "{} differs after writing",
            path.display()
        );
        let again = parse_trace(&text, "again", &ParseOptions::default()).unwrap();
        assert_eq!(write_trace_to_vec(&again), text, "{}", path.display());
        assert_eq!(again.layout, t.layout);
    }
}

#[test]
fn thread_count_does_not_change_the_model() {
    let path = shared_traces().join("public/param_hf_gpt2_1.1.0.et.json.gz");
    let bytes = read_input(&path).unwrap();
    let one = parse_trace(
        &bytes,
        "x",
        &ParseOptions {
            threads: 1,
            validate: true,
            ..Default::default()
        },
    )
    .unwrap();
    // Force several chunks even on a small file by parsing the nodes in 7 threads.
    let many = parse_trace(
        &bytes,
        "x",
        &ParseOptions {
            threads: 7,
            validate: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(write_trace_to_vec(&one), write_trace_to_vec(&many));
    assert_eq!(one.nodes.len(), many.nodes.len());
}

#[test]
fn every_layout_and_version_is_recognised() {
    let layouts: Vec<(String, Layout)> = all_et_files()
        .iter()
        .map(|p| {
            let t = read_trace(p).unwrap();
            (t.meta.schema.clone(), t.layout)
        })
        .collect();
    for (schema, layout) in &layouts {
        let flat = schema == "1.0.1" || schema == "1.0.0";
        assert_eq!(*layout == Layout::Flat, flat, "{schema}");
    }
    for v in [
        "1.0.1",
        "1.0.2-chakra.0.0.4",
        "1.0.3-chakra.0.0.4",
        "1.1.0-chakra.0.0.4",
        "1.1.1-chakra.0.0.4",
    ] {
        assert!(
            layouts.iter().any(|(s, _)| s == v),
            "no shared trace of schema {v}"
        );
    }
}

#[test]
fn every_op_schema_in_the_shared_traces_parses() {
    let mut n = 0;
    for path in all_et_files() {
        let t = read_trace(&path).unwrap();
        for node in &t.nodes {
            if let Some(s) = t.op_schema_str(node) {
                let parsed = OpSchema::parse(s)
                    .unwrap_or_else(|e| panic!("{}: node {}: {s}: {e}", path.display(), node.id));
                assert!(
                    t.name(node).starts_with(&parsed.name) || !t.name(node).contains("::"),
                    "{s}"
                );
                n += 1;
            }
            for a in t.inputs(node).iter().chain(t.outputs(node)) {
                ValueType::parse(t.str(a.ty))
                    .unwrap_or_else(|e| panic!("type {:?}: {e}", t.str(a.ty)));
            }
        }
    }
    assert!(n > 10_000, "only {n} schemas");
}

#[test]
fn every_kineto_trace_parses() {
    let files = all_kineto_files();
    assert!(files.len() >= 10);
    for p in files {
        let k = kineto::read_kineto(&p).unwrap_or_else(|e| panic!("{e}"));
        let d = dom(&p);
        assert_eq!(k.events.len(), d["traceEvents"].as_array().unwrap().len());
        let cpu_ops = d["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["cat"] == "cpu_op")
            .count();
        assert_eq!(
            k.events
                .iter()
                .filter(|e| e.cat == kineto::Category::CpuOp)
                .count(),
            cpu_ops
        );
        assert!(k.main_pid().is_some(), "{}", p.display());
    }
}

/// The specialised record reader and the serde_json visitors build the same model from every
/// shared trace (both layouts, every schema version), on one thread and on several; and the
/// reader reads every record itself (a reader that always gave up would pass the rest).
#[test]
fn the_record_reader_and_the_visitors_agree_on_every_shared_trace() {
    for path in all_et_files() {
        let bytes = read_input(&path).unwrap();
        let name = path.display().to_string();
        let mut written = Vec::new();
        for (threads, visitors_only) in [(1, true), (1, false), (3, true), (3, false)] {
            let opts = ParseOptions {
                threads,
                visitors_only,
                ..Default::default()
            };
            let t = parse_trace(&bytes, &name, &opts).unwrap_or_else(|e| panic!("{e}"));
            written.push((
                threads,
                visitors_only,
                t.nodes.clone(),
                write_trace_to_vec(&t),
            ));
        }
        assert_eq!(
            et_schema::records_read_by_visitors(&bytes).unwrap(),
            0,
            "{name}: records the reader gave up on"
        );
        for w in &written[1..] {
            assert_eq!(
                w.2, written[0].2,
                "{name}: nodes differ ({} threads, visitors only {})",
                w.0, w.1
            );
            assert_eq!(
                w.3, written[0].3,
                "{name}: written text differs ({} threads, visitors only {})",
                w.0, w.1
            );
        }
    }
}
