//! Property: for generated traces in both layouts, parse -> write gives back the same JSON
//! document (lossless), and parse -> write -> parse -> write is a fixed point.

use et_schema::*;
use proptest::prelude::*;
use serde_json::{json, Value as J};

/// A generated argument: (value, shape, type string).
fn arg() -> impl Strategy<Value = (J, J, String)> {
    let tensor = (
        1u64..1000,
        0u64..50,
        0u64..10,
        0u64..100,
        prop::sample::select(vec![1u64, 2, 4, 8]),
        prop::sample::select(vec!["cpu", "cuda:0"]),
    )
        .prop_map(|(id, st, off, numel, item, dev)| json!([id, st, off, numel, item, dev]));
    let dtype = prop::sample::select(vec![
        "float",
        "long int",
        "c10::Half",
        "bool",
        "unsigned char",
    ]);
    prop_oneof![
        (
            tensor.clone(),
            dtype.clone(),
            prop::collection::vec(1i64..64, 0..4)
        )
            .prop_map(|(t, d, s)| (t, json!(s), format!("Tensor({d})"))),
        any::<i64>().prop_map(|i| (json!(i), json!([]), "Int".to_string())),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| (json!(f), json!([]), "Double".to_string())),
        any::<bool>().prop_map(|b| (json!(b), json!([]), "Bool".to_string())),
        Just((json!("<None>"), json!([]), "None".to_string())),
        "[a-z\\\\\"é ]{0,8}".prop_map(|s| (json!(s), json!([]), "String".to_string())),
        prop::collection::vec(-5i64..5000, 0..5).prop_map(|v| {
            let types = vec!["Int"; v.len()].join(",");
            let shapes: Vec<J> = v.iter().map(|_| json!([])).collect();
            (json!(v), json!(shapes), format!("GenericList[{types}]"))
        }),
        prop::collection::vec(tensor, 1..3).prop_map(|v| {
            let types = vec!["Tensor(float)"; v.len()].join(",");
            let shapes: Vec<J> = v.iter().map(|_| json!([2, 2])).collect();
            (json!(v), json!(shapes), format!("GenericList[{types}]"))
        }),
    ]
}

#[derive(Debug, Clone)]
struct GenNode {
    name: String,
    inputs: Vec<(J, J, String)>,
    outputs: Vec<(J, J, String)>,
    rf_id: Option<u64>,
    seq_id: Option<i64>,
    op_schema: Option<String>,
    extra: Option<(String, J)>,
    strides: bool,
}

fn node() -> impl Strategy<Value = GenNode> {
    (
        "[a-z:_#]{1,12}",
        prop::collection::vec(arg(), 0..5),
        prop::collection::vec(arg(), 0..3),
        prop::option::of(0u64..1 << 40),
        prop::option::of(-1i64..1000),
        prop::option::of(Just("aten::x(Tensor self) -> Tensor".to_string())),
        prop::option::of(("[a-z_]{3,8}", any::<u32>().prop_map(|x| json!(x)))),
        any::<bool>(),
    )
        .prop_map(
            |(name, inputs, outputs, rf_id, seq_id, op_schema, extra, strides)| GenNode {
                name,
                inputs,
                outputs,
                rf_id,
                seq_id,
                op_schema,
                extra: extra.filter(|(k, _)| !KNOWN_KEYS.contains(&k.as_str())),
                strides,
            },
        )
}

const KNOWN_KEYS: &[&str] = &[
    "rf_id",
    "fw_parent",
    "seq_id",
    "scope",
    "tid",
    "fw_tid",
    "op_schema",
    "kernel_backend",
    "kernel_file",
    "parent",
    "name",
    "id",
    "inputs",
    "outputs",
    "attrs",
];

fn io_nested(args: &[(J, J, String)], strides: bool) -> J {
    let mut o = json!({
        "values": args.iter().map(|a| a.0.clone()).collect::<Vec<_>>(),
        "shapes": args.iter().map(|a| a.1.clone()).collect::<Vec<_>>(),
        "types": args.iter().map(|a| a.2.clone()).collect::<Vec<_>>(),
    });
    if strides {
        o["strides"] = J::Array(args.iter().map(|a| a.1.clone()).collect());
    }
    o
}

/// Builds a trace document: node 1 is the process root, the rest hang off earlier nodes.
fn document(nodes: &[GenNode], parents: &[usize], flat: bool) -> J {
    let mut out = vec![];
    let root_name = if flat {
        "[pytorch|profiler|execution_graph|process]"
    } else {
        "[pytorch|profiler|execution_trace|process]"
    };
    for (i, n) in std::iter::once(None)
        .chain(nodes.iter().map(Some))
        .enumerate()
    {
        let id = i as u64 + 1;
        let parent = if i == 0 { 0 } else { parents[i - 1] % i + 1 } as u64;
        let name = n.map_or(root_name.to_string(), |n| n.name.clone());
        let empty = GenNode {
            name: String::new(),
            inputs: vec![],
            outputs: vec![],
            rf_id: None,
            seq_id: None,
            op_schema: None,
            extra: None,
            strides: false,
        };
        let n = n.unwrap_or(&empty);
        if flat {
            let mut o = json!({"name": name, "id": id, "parent": parent});
            if let Some(r) = n.rf_id {
                o["rf_id"] = json!(r);
            }
            if let Some(s) = n.seq_id {
                o["seq_id"] = json!(s);
            }
            if let Some(s) = &n.op_schema {
                o["op_schema"] = json!(s);
            }
            for (p, args) in [("input", &n.inputs), ("output", &n.outputs)] {
                o[format!("{p}s")] = J::Array(args.iter().map(|a| a.0.clone()).collect());
                o[format!("{p}_shapes")] = J::Array(args.iter().map(|a| a.1.clone()).collect());
                o[format!("{p}_types")] = J::Array(args.iter().map(|a| json!(a.2)).collect());
            }
            if let Some((k, v)) = &n.extra {
                o[k] = v.clone();
            }
            out.push(o);
        } else {
            let mut attrs = vec![];
            if let Some(r) = n.rf_id {
                attrs.push(json!({"name": "rf_id", "type": "uint64", "value": r}));
            }
            if let Some(s) = n.seq_id {
                attrs.push(json!({"name": "seq_id", "type": "int64", "value": s}));
            }
            if let Some(s) = &n.op_schema {
                attrs.push(json!({"name": "op_schema", "type": "string", "value": s}));
            }
            if let Some((k, v)) = &n.extra {
                attrs.push(json!({"name": k, "type": "uint64", "value": v}));
            }
            out.push(json!({
                "id": id, "name": name, "ctrl_deps": parent,
                "inputs": io_nested(&n.inputs, n.strides), "outputs": io_nested(&n.outputs, n.strides),
                "attrs": attrs,
            }));
        }
    }
    json!({
        "schema": if flat { "1.0.1" } else { "1.1.1-chakra.0.0.4" },
        "pid": 42, "time": "2026-01-01 00:00:00", "start_ts": 1, "finish_ts": 2,
        "nodes": out,
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn generated_traces_round_trip(nodes in prop::collection::vec(node(), 0..12), parents in prop::collection::vec(any::<usize>(), 12), flat in any::<bool>(), threads in 1usize..4) {
        let doc = document(&nodes, &parents, flat);
        let text = serde_json::to_vec_pretty(&doc).unwrap();
        let t = parse_trace(&text, "gen", &ParseOptions { threads, ..Default::default() }).unwrap();
        prop_assert_eq!(t.nodes.len(), nodes.len() + 1);
        prop_assert_eq!(t.layout, if flat { Layout::Flat } else { Layout::Nested });
        let written = write_trace_to_vec(&t);
        let back: J = serde_json::from_slice(&written).unwrap();
        prop_assert_eq!(&back, &doc);
        let again = parse_trace(&written, "again", &ParseOptions::default()).unwrap();
        prop_assert_eq!(write_trace_to_vec(&again), written);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = parse_trace(&bytes, "fuzz", &ParseOptions::default());
        let _ = et_schema::kineto::parse_kineto(&bytes, "fuzz");
    }

    #[test]
    fn type_and_schema_parsers_never_panic(s in "[A-Za-z:()\\[\\]!?,.*>= -]{0,40}") {
        let _ = ValueType::parse(&s);
        let _ = OpSchema::parse(&s);
    }
}
