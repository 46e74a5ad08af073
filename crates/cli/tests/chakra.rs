//! `mystique export --chakra`: every shared trace with ops is exported by the real binary, and
//! the file is read back twice: with prost into the exporter's own message structs, and by a
//! protobuf wire walker written here against the field numbers of Chakra's `et_def.proto`
//! (mlcommons/chakra, `schema/protobuf/et_def.proto`), so that a wrong field number in the
//! structs cannot round-trip unnoticed. Counts, types and dependencies are checked against
//! et-graph.

mod common;

use common::{bin, json as run_json, shared};
use et_graph::{Graph, OpClass};
use mystique_cli::chakra::proto::{GlobalMetadata, Node, NodeType};
use prost::Message;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

// Field numbers of `et_def.proto`, typed from the .proto, not from the structs under test.
/// `GlobalMetadata.version = 1`, `GlobalMetadata.attr = 2`.
const META_VERSION: u32 = 1;
const META_ATTR: u32 = 2;
/// `Node`: `id = 1; name = 2; type = 3; ctrl_deps = 4; data_deps = 5; start_time_micros = 6;
/// duration_micros = 7; inputs = 8; outputs = 9; attr = 10;`
const NODE_ID: u32 = 1;
const NODE_NAME: u32 = 2;
const NODE_TYPE: u32 = 3;
const NODE_CTRL_DEPS: u32 = 4;
const NODE_DATA_DEPS: u32 = 5;
const NODE_INPUTS: u32 = 8;
const NODE_OUTPUTS: u32 = 9;
const NODE_ATTR: u32 = 10;
/// `AttributeProto`: `name = 1; int32_val = 7; int64_val = 9; uint64_val = 13; bool_val = 27;
/// string_val = 29;`
const ATTR_NAME: u32 = 1;
const INT32_VAL: u32 = 7;
const INT64_VAL: u32 = 9;
const UINT64_VAL: u32 = 13;
const BOOL_VAL: u32 = 27;
const STRING_VAL: u32 = 29;
/// `IOInfo`: `values = 1; shapes = 2; types = 3;`
const IO_VALUES: u32 = 1;
/// `enum NodeType`
const COMP_NODE: u64 = 4;
const COMM_SEND_NODE: u64 = 5;
const COMM_RECV_NODE: u64 = 6;
const COMM_COLL_NODE: u64 = 7;
/// `enum CollectiveCommType`
const ALL_REDUCE: u64 = 0;
const ALL_GATHER: u64 = 2;
const BROADCAST: u64 = 5;
const ALL_TO_ALL: u64 = 6;
const BARRIER: u64 = 9;

fn tmp(name: &str) -> PathBuf {
    let d = common::scratch("chakra");
    d.join(name)
}

// ---- a protobuf wire walker, independent of prost ----

fn varint(b: &mut &[u8]) -> u64 {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&x, rest) = b.split_first().expect("truncated varint");
        *b = rest;
        v |= u64::from(x & 0x7f) << shift;
        if x & 0x80 == 0 {
            return v;
        }
    }
    panic!("varint longer than 10 bytes")
}

#[derive(Debug, Clone, Copy)]
enum Wire<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

/// The fields of one message in wire order: (field number, value). Only the wire types this
/// format uses (varint, length-delimited) are accepted; anything else fails the test.
fn fields(mut b: &[u8]) -> Vec<(u32, Wire<'_>)> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let key = varint(&mut b);
        let (field, wire) = ((key >> 3) as u32, key & 7);
        match wire {
            0 => out.push((field, Wire::Varint(varint(&mut b)))),
            2 => {
                let n = varint(&mut b) as usize;
                out.push((field, Wire::Bytes(&b[..n])));
                b = &b[n..];
            }
            w => panic!("field {field}: unexpected wire type {w}"),
        }
    }
    out
}

/// The length-delimited messages of a file.
fn messages(mut b: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let n = varint(&mut b) as usize;
        out.push(&b[..n]);
        b = &b[n..];
    }
    out
}

fn packed(b: &[u8]) -> Vec<u64> {
    let mut b = b;
    let mut v = Vec::new();
    while !b.is_empty() {
        v.push(varint(&mut b));
    }
    v
}

fn text(b: &[u8]) -> String {
    String::from_utf8(b.to_vec()).expect("UTF-8 string field")
}

/// A node as the wire says it: id, name, type, deps, attributes by name as (value field, raw).
#[derive(Debug, Default)]
struct RawNode {
    id: u64,
    name: String,
    ty: u64,
    ctrl: Vec<u64>,
    data: Vec<u64>,
    attrs: BTreeMap<String, (u32, Wire<'static>)>,
    inputs: Option<String>,
}

fn raw_node(m: &'static [u8]) -> RawNode {
    let mut n = RawNode::default();
    for (f, w) in fields(m) {
        match (f, w) {
            (NODE_ID, Wire::Varint(v)) => n.id = v,
            (NODE_NAME, Wire::Bytes(b)) => n.name = text(b),
            (NODE_TYPE, Wire::Varint(v)) => n.ty = v,
            (NODE_CTRL_DEPS, Wire::Bytes(b)) => n.ctrl = packed(b),
            (NODE_DATA_DEPS, Wire::Bytes(b)) => n.data = packed(b),
            (NODE_INPUTS, Wire::Bytes(b)) => {
                for (g, x) in fields(b) {
                    if let (IO_VALUES, Wire::Bytes(s)) = (g, x) {
                        n.inputs = Some(text(s));
                    }
                }
            }
            (NODE_OUTPUTS, Wire::Bytes(_)) => {}
            (NODE_ATTR, Wire::Bytes(b)) => {
                let af = fields(b);
                let name = af
                    .iter()
                    .find_map(|(g, x)| match (g, x) {
                        (&ATTR_NAME, Wire::Bytes(s)) => Some(text(s)),
                        _ => None,
                    })
                    .expect("an attribute has a name (field 1)");
                let value = af
                    .into_iter()
                    .find(|(g, _)| *g != ATTR_NAME && *g != 2)
                    .expect("an attribute has a value");
                n.attrs.insert(name, value);
            }
            (f, w) => panic!("node field {f} ({w:?}) is not one the exporter writes"),
        }
    }
    n
}

impl RawNode {
    fn int64(&self, name: &str) -> Option<i64> {
        match self.attrs.get(name)? {
            (INT64_VAL, Wire::Varint(v)) => Some(*v as i64),
            other => panic!("{name}: not an int64_val (field 9): {other:?}"),
        }
    }
    fn int32(&self, name: &str) -> Option<i32> {
        match self.attrs.get(name)? {
            (INT32_VAL, Wire::Varint(v)) => Some(*v as i32),
            other => panic!("{name}: not an int32_val (field 7): {other:?}"),
        }
    }
    fn uint64(&self, name: &str) -> Option<u64> {
        match self.attrs.get(name)? {
            (UINT64_VAL, Wire::Varint(v)) => Some(*v),
            other => panic!("{name}: not a uint64_val (field 13): {other:?}"),
        }
    }
    fn boolean(&self, name: &str) -> Option<bool> {
        match self.attrs.get(name)? {
            (BOOL_VAL, Wire::Varint(v)) => Some(*v != 0),
            other => panic!("{name}: not a bool_val (field 27): {other:?}"),
        }
    }
    fn string(&self, name: &str) -> Option<String> {
        match self.attrs.get(name)? {
            (STRING_VAL, Wire::Bytes(b)) => Some(text(b)),
            other => panic!("{name}: not a string_val (field 29): {other:?}"),
        }
    }
}

/// What one export produced, read back both ways.
struct Decoded {
    meta: GlobalMetadata,
    nodes: Vec<Node>,
    raw: Vec<RawNode>,
    summary: serde_json::Value,
}

fn export(trace: &Path, extra: &[&str], out: &Path) -> Decoded {
    let o = bin()
        .arg("export")
        .arg(trace)
        .arg("--chakra")
        .args(extra)
        .args(["--json", "-o"])
        .arg(out)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{}: {}",
        trace.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let bytes: &'static [u8] = Box::leak(std::fs::read(out).unwrap().into_boxed_slice());

    // 1. prost, into the exporter's structs.
    let mut b = bytes;
    let meta = GlobalMetadata::decode_length_delimited(&mut b).unwrap();
    let mut nodes = Vec::new();
    while !b.is_empty() {
        nodes.push(Node::decode_length_delimited(&mut b).unwrap());
    }
    // 2. the wire, against et_def.proto's numbers.
    let msgs = messages(bytes);
    let (first, rest) = msgs.split_first().unwrap();
    let mf = fields(first);
    assert!(
        matches!(mf[0], (META_VERSION, Wire::Bytes(v)) if v == b"0.0.4"),
        "GlobalMetadata starts with version (field 1): {mf:?}"
    );
    assert!(mf[1..].iter().all(|(f, _)| *f == META_ATTR));
    let raw: Vec<RawNode> = rest.iter().map(|m| raw_node(m)).collect();
    assert_eq!(raw.len(), nodes.len());
    for (r, n) in raw.iter().zip(&nodes) {
        assert_eq!((r.id, &r.name, r.ty as i32), (n.id, &n.name, n.r#type));
        assert_eq!((&r.ctrl, &r.data), (&n.ctrl_deps, &n.data_deps));
        assert_eq!(r.attrs.len(), n.attr.len(), "node {}", n.id);
    }
    Decoded {
        meta,
        nodes,
        raw,
        summary,
    }
}

/// Checks an export of the whole trace against et-graph: one node per replay-set op in
/// execution order, data deps = et-graph's data edges (merged per producer), every dependency
/// on an earlier node of the file, collectives as communication nodes.
fn check_against_graph(trace: &Path, d: &Decoded) {
    let name = trace.display();
    let t = et_schema::read_trace(trace).unwrap();
    let g = Graph::new(&t);
    let set = g.replay_set(None);
    let tensors = g.tensors(&set);
    let ids: Vec<u64> = set.ops.iter().map(|&i| g.id(i)).collect();
    assert_eq!(d.raw.len(), set.ops.len(), "{name}: node count");
    assert_eq!(
        d.raw.iter().map(|n| n.id).collect::<Vec<_>>(),
        ids,
        "{name}: ids in order"
    );
    let mut want: HashMap<u64, BTreeSet<u64>> = HashMap::new();
    for e in &tensors.edges {
        want.entry(ids[e.to as usize])
            .or_default()
            .insert(ids[e.from as usize]);
    }
    let pairs: usize = want.values().map(BTreeSet::len).sum();
    let data: usize = d.raw.iter().map(|n| n.data.len()).sum();
    assert_eq!(data, pairs, "{name}: data deps = et-graph's data edges");
    assert_eq!(d.summary["data_deps"], data);
    assert_eq!(d.summary["tensor_edges"], tensors.edges.len());
    assert_eq!(d.summary["nodes"], d.raw.len());
    let pos: HashMap<u64, usize> = ids.iter().enumerate().map(|(k, &id)| (id, k)).collect();
    let threads = g.threads();
    for (k, n) in d.raw.iter().enumerate() {
        let got: BTreeSet<u64> = n.data.iter().copied().collect();
        assert_eq!(
            got.len(),
            n.data.len(),
            "{name}: node {} repeats a dep",
            n.id
        );
        assert_eq!(
            got,
            want.remove(&n.id).unwrap_or_default(),
            "{name}: node {}",
            n.id
        );
        for &dep in n.data.iter().chain(&n.ctrl) {
            assert!(
                dep < n.id && pos.contains_key(&dep),
                "{name}: node {} depends on {dep}, not an earlier node of the file",
                n.id
            );
        }
        // The first ctrl dep is the previous op of the same thread.
        let i = set.ops[k];
        let prev = set.ops[..k]
            .iter()
            .rev()
            .find(|&&j| threads.thread(j) == threads.thread(i))
            .map(|&j| g.id(j));
        assert_eq!(n.ctrl.first().copied(), prev, "{name}: node {}", n.id);
        // Types: collectives are communication nodes, but for waits.
        let coll = g.class[i as usize].contains(OpClass::COLLECTIVE);
        let cname = et_graph::summary::collective_name(&t, &t.nodes[i as usize]);
        let comm = [COMM_COLL_NODE, COMM_SEND_NODE, COMM_RECV_NODE].contains(&n.ty);
        assert_eq!(
            comm,
            coll && cname.as_deref() != Some("wait"),
            "{name}: node {} {} is type {}",
            n.id,
            n.name,
            n.ty
        );
        assert!(comm || n.ty == COMP_NODE);
        assert_eq!(
            n.boolean("is_cpu_op").unwrap(),
            !comm && !g.class[i as usize].contains(OpClass::CUDA)
        );
        if n.ty == COMM_COLL_NODE {
            assert!(n.int64("comm_type").unwrap() <= 9);
            assert!(n.int64("comm_size").unwrap() > 0, "{name}: node {}", n.id);
        } else if !comm {
            assert!(n.uint64("tensor_size").is_some());
        }
        assert_eq!(
            n.int64("rf_id"),
            t.nodes[i as usize].rf_id.map(|x| x as i64)
        );
        assert!(n.inputs.as_deref().unwrap().starts_with('['));
    }
    // Communication nodes are the trace's outermost collectives as `inspect` counts them (waits
    // aside).
    let summary = et_graph::Summary::of(&t);
    let outermost: usize = summary
        .collectives
        .iter()
        .filter(|(k, _)| k.as_str() != "wait")
        .map(|(_, v)| v)
        .sum();
    let comms = d
        .raw
        .iter()
        .filter(|n| [COMM_COLL_NODE, COMM_SEND_NODE, COMM_RECV_NODE].contains(&n.ty))
        .count();
    assert_eq!(
        comms, outermost,
        "{name}: collectives {:?}",
        summary.collectives
    );
    // The summary's counts by type are the file's.
    let mut by_type: BTreeMap<String, usize> = BTreeMap::new();
    for n in &d.nodes {
        let ty = NodeType::try_from(n.r#type).unwrap();
        *by_type.entry(ty.proto_name().to_string()).or_default() += 1;
    }
    assert_eq!(d.summary["types"], json!(by_type), "{name}");
    // Metadata: Chakra's converter's attributes.
    assert_eq!(d.meta.version, "0.0.4");
    assert_eq!(d.meta.attr[0].name, "schema");
}

/// Every shared ET (Kineto files aside) and every rank of the public 8-rank DLRM.
fn shared_traces() -> Vec<PathBuf> {
    let mut v = Vec::new();
    for dir in ["cpu", "public", "public/param_dlrm_8rank_1.0.1"] {
        for e in std::fs::read_dir(shared(dir)).unwrap() {
            let p = e.unwrap().path();
            let f = p.file_name().unwrap().to_string_lossy().to_string();
            if f.contains(".et.json") {
                v.push(p);
            }
        }
    }
    v.sort();
    v
}

#[test]
fn every_shared_trace_exports_and_decodes_with_the_protos_layout() {
    let traces = shared_traces();
    assert!(traces.len() >= 20, "{traces:?}");
    let mut counts = Vec::new();
    for (k, p) in traces.iter().enumerate() {
        let out = tmp(&format!("t{k}.et"));
        let d = export(p, &[], &out);
        check_against_graph(p, &d);
        counts.push(format!(
            "{}: {} nodes {} data deps {}",
            p.file_name().unwrap().to_string_lossy(),
            d.raw.len(),
            d.raw.iter().map(|n| n.data.len()).sum::<usize>(),
            d.summary["types"]
        ));
        std::fs::remove_file(&out).unwrap();
    }
    eprintln!("{}", counts.join("\n"));
}

#[test]
fn collectives_carry_type_size_and_group() {
    let p = shared("cpu/dist_mlp_w2.rank0.et.json");
    let d = export(&p, &[], &tmp("dist.et"));
    let colls: Vec<&RawNode> = d.raw.iter().filter(|n| n.ty == COMM_COLL_NODE).collect();
    assert_eq!(colls.len(), 6);
    let kinds: Vec<(String, u64, i64)> = colls
        .iter()
        .map(|n| {
            (
                n.name.clone(),
                n.int64("comm_type").unwrap() as u64,
                n.int64("comm_size").unwrap(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("c10d::allreduce_".into(), ALL_REDUCE, 68362 * 4),
            ("c10d::allreduce_".into(), ALL_REDUCE, 33024 * 4),
            ("c10d::allreduce_".into(), ALL_REDUCE, 1000 * 4),
            ("c10d::broadcast_".into(), BROADCAST, 1000 * 4),
            // The input tensor each rank contributes, not the gathered outputs.
            ("c10d::allgather_".into(), ALL_GATHER, 64 * 4),
            ("c10d::barrier".into(), BARRIER, 1),
        ]
    );
    for n in &colls {
        assert_eq!(
            n.boolean("is_cpu_op"),
            Some(false),
            "ASTRA-sim issues it to the network"
        );
    }

    // Groups: resnet records pg_name on the record_param_comms inside each c10d op.
    let d = export(
        &shared("public/param_resnet_1.1.0.et.json.gz"),
        &[],
        &tmp("r.et"),
    );
    let colls: Vec<&RawNode> = d.raw.iter().filter(|n| n.ty == COMM_COLL_NODE).collect();
    assert_eq!(colls.len(), 21);
    assert!(colls
        .iter()
        .all(|n| n.string("pg_name").as_deref() == Some("0")));
    // Schema 1.0.3 names the group in a Tuple[String,String] argument instead.
    let d = export(
        &shared("public/param_resnet_1gpu_1.0.3.et.json.gz"),
        &[],
        &tmp("r3.et"),
    );
    assert!(d
        .raw
        .iter()
        .filter(|n| n.ty == COMM_COLL_NODE)
        .all(|n| n.string("pg_name").as_deref() == Some("0")));

    // DLRM: all-to-alls and all-reduces; a wait is a compute node ordered after its collective.
    let d = export(
        &shared("public/param_dlrm_8rank_1.0.1/rank0.et.json.gz"),
        &[],
        &tmp("dlrm.et"),
    );
    let types: Vec<u64> = d
        .raw
        .iter()
        .filter(|n| n.ty == COMM_COLL_NODE)
        .map(|n| n.int64("comm_type").unwrap() as u64)
        .collect();
    assert_eq!(types.iter().filter(|&&x| x == ALL_TO_ALL).count(), 5);
    assert_eq!(types.iter().filter(|&&x| x == ALL_REDUCE).count(), 3);
    let by_id: HashMap<u64, &RawNode> = d.raw.iter().map(|n| (n.id, n)).collect();
    let waits: Vec<&RawNode> = d
        .raw
        .iter()
        .filter(|n| n.name == "record_param_comms" && n.ty == COMP_NODE)
        .collect();
    assert_eq!(waits.len(), 5);
    let linked = waits
        .iter()
        .filter(|w| {
            w.ctrl.iter().any(|c| {
                by_id[c].ty == COMM_COLL_NODE
                    && by_id[c].int64("comm_type") == Some(ALL_TO_ALL as i64)
            })
        })
        .count();
    // Two waits are for all-to-alls of the previous iteration, which the trace does not hold.
    assert_eq!(linked, 3);
}

#[test]
fn filters_select_what_is_exported() {
    let p = shared("cpu/dist_mlp_w2.rank0.et.json");
    let d = export(&p, &["--only", "comm"], &tmp("comm.et"));
    assert_eq!(d.raw.len(), 6);
    assert!(d.raw.iter().all(|n| n.ty == COMM_COLL_NODE));
    // Between collectives only, no tensor flows here; each follows the previous one.
    assert!(d.raw.iter().skip(1).all(|n| n.ctrl.len() == 1));
    let d = export(&p, &["--name", "^aten::"], &tmp("aten.et"));
    assert!(d
        .raw
        .iter()
        .all(|n| n.ty == COMP_NODE && n.name.starts_with("aten::")));
    let ids: BTreeSet<u64> = d.raw.iter().map(|n| n.id).collect();
    assert!(d
        .raw
        .iter()
        .all(|n| n.data.iter().chain(&n.ctrl).all(|x| ids.contains(x))));

    // The summary names the format and counts by type.
    let out = tmp("summary.et");
    let j = run_json(
        bin()
            .arg("export")
            .arg(&p)
            .args(["--chakra", "--json", "-o"])
            .arg(&out),
    );
    assert_eq!(j["what"], "chakra");
    assert_eq!(j["types"]["COMM_COLL_NODE"], 6);

    // Exactly one format; never over the input.
    let o = bin()
        .arg("export")
        .arg(&p)
        .args(["-o", "/dev/null"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let o = bin()
        .arg("export")
        .arg(&p)
        .args(["--dot", "--chakra", "-o", "/dev/null"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let copy = tmp("in.et.json");
    std::fs::copy(&p, &copy).unwrap();
    let o = bin()
        .arg("export")
        .arg(&copy)
        .args(["--chakra", "-o"])
        .arg(&copy)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("input"));
}

/// A nested-layout node record.
fn rec(
    id: u64,
    name: &str,
    parent: u64,
    schema: &str,
    ins: serde_json::Value,
    attrs: serde_json::Value,
) -> serde_json::Value {
    let mut a = vec![json!({"name": "rf_id", "type": "uint64", "value": id})];
    if !schema.is_empty() {
        a.push(json!({"name": "op_schema", "type": "string", "value": schema}));
    }
    a.extend(attrs.as_array().unwrap().iter().cloned());
    json!({"id": id, "name": name, "ctrl_deps": parent, "inputs": ins,
           "outputs": {"values": [], "shapes": [], "types": []}, "attrs": a})
}

#[test]
fn send_and_recv_become_point_to_point_nodes() {
    const SEND: &str = "c10d::send(Tensor[] tensors, __torch__.torch.classes.c10d.ProcessGroup process_group, int dstRank, int tag, int timeout) -> __torch__.torch.classes.c10d.Work";
    const RECV: &str = "c10d::recv_(Tensor[] tensors, __torch__.torch.classes.c10d.ProcessGroup process_group, int srcRank, int tag, int timeout) -> __torch__.torch.classes.c10d.Work";
    const RELU: &str = "aten::relu_(Tensor(a!) self) -> Tensor(a!)";
    let list = |id: u64, peer: i64| {
        json!({"values": [[[id, id, 0, 4, 4, "cpu"]], "<Object>", peer, 7, -1],
               "shapes": [[[4]], [], [], [], []],
               "types": ["GenericList[Tensor(float)]", "Object", "Int", "Int", "Int"]})
    };
    let comms = json!([{"name": "rank", "type": "int64", "value": 0},
                       {"name": "pg_name", "type": "string", "value": "0"}]);
    let trace = json!({
        "schema": "1.1.1-chakra.0.0.4", "pid": 1, "time": "now", "start_ts": 1, "finish_ts": 2,
        "nodes": [
            rec(1, "[pytorch|profiler|execution_trace|process]", 0, "", json!({"values": [], "shapes": [], "types": []}), json!([])),
            rec(2, "c10d::send", 1, SEND, list(10, 1), json!([])),
            rec(3, "record_param_comms", 2, "", json!({"values": [], "shapes": [], "types": []}), comms),
            rec(4, "c10d::recv_", 1, RECV, list(11, 1), json!([])),
            rec(5, "aten::relu_", 1, RELU,
                json!({"values": [[11, 11, 0, 4, 4, "cpu"]], "shapes": [[4]], "types": ["Tensor(float)"]}),
                json!([])),
        ]
    });
    let p = tmp("p2p.et.json");
    std::fs::write(&p, serde_json::to_vec(&trace).unwrap()).unwrap();
    let d = export(&p, &[], &tmp("p2p.et"));
    let ty: Vec<u64> = d.raw.iter().map(|n| n.ty).collect();
    assert_eq!(ty, vec![COMM_SEND_NODE, COMM_RECV_NODE, COMP_NODE]);
    let (send, recv, relu) = (&d.raw[0], &d.raw[1], &d.raw[2]);
    assert_eq!(
        (
            send.int32("comm_src"),
            send.int32("comm_dst"),
            send.int32("comm_tag")
        ),
        (Some(0), Some(1), Some(7))
    );
    assert_eq!(
        (
            recv.int32("comm_src"),
            recv.int32("comm_dst"),
            recv.int32("comm_tag")
        ),
        (Some(1), Some(0), Some(7))
    );
    assert_eq!(send.int64("comm_size"), Some(16));
    assert_eq!(send.string("pg_name").as_deref(), Some("0"));
    assert!(!send.attrs.contains_key("comm_type"));
    // recv_ records no outputs (it returns a Work), so et-graph sees no data edge to relu_;
    // the thread's order still puts relu_ after it.
    assert_eq!(relu.ctrl, vec![4]);
    assert_eq!(
        d.meta.attr.len(),
        5,
        "schema, pid, time, start_ts, finish_ts"
    );
    check_against_graph(&p, &d);
}

/// A PARAM wait record depends on the collective of its sequence number on its own group:
/// each group counts its collectives, so the number recurs on another group's collective,
/// issued after the one the wait is for.
#[test]
fn a_wait_depends_on_its_own_groups_collective() {
    const ALLREDUCE: &str = "c10d::allreduce_(Tensor[] tensors, __torch__.torch.classes.c10d.ProcessGroup process_group, __torch__.torch.classes.c10d.ReduceOp reduce_op, Tensor? sparse_indices, bool async_op=True, int timeout=-1) -> (Tensor[], __torch__.torch.classes.c10d.Work)";
    let none = || json!({"values": [], "shapes": [], "types": []});
    let tensors = json!({"values": [[[10, 10, 0, 4, 4, "cpu"]], "<Object>", "<Object>", "<None>", true, -1],
                         "shapes": [[[4]], [], [], [], [], []],
                         "types": ["GenericList[Tensor(float)]", "Object", "Object", "None", "Bool", "Int"]});
    let record = |seq: i64| {
        json!({"values": [[[10, 10, 0, 4, 4, "cpu"]], seq, "allreduce"], "shapes": [[[4]], [], []],
               "types": ["GenericList[Tensor(float)]", "Int", "String"]})
    };
    let pg = |name: &str| json!([{"name": "pg_name", "type": "string", "value": name}]);
    let trace = json!({
        "schema": "1.1.1-chakra.0.0.4", "pid": 1, "time": "now", "start_ts": 1, "finish_ts": 2,
        "nodes": [
            rec(1, "[pytorch|profiler|execution_trace|process]", 0, "", none(), json!([])),
            rec(2, "c10d::allreduce_", 1, ALLREDUCE, tensors.clone(), pg("0")),
            rec(3, "record_param_comms", 2, "", record(7), pg("0")),
            rec(4, "c10d::allreduce_", 1, ALLREDUCE, tensors, pg("1")),
            rec(5, "record_param_comms", 4, "", record(7), pg("1")),
            rec(6, "record_param_comms", 1, "",
                json!({"values": [7, 0, 0, "wait"], "shapes": [[], [], [], []],
                       "types": ["Int", "Int", "Int", "String"]}),
                pg("0")),
        ]
    });
    let p = tmp("waits-by-group.et.json");
    std::fs::write(&p, serde_json::to_vec(&trace).unwrap()).unwrap();
    let d = export(&p, &[], &tmp("waits-by-group.et"));
    let wait = d.raw.last().unwrap();
    // After group 1's allreduce on the thread, and on group 0's, which it waits for.
    assert!(wait.ctrl.contains(&2), "{:?}", wait.ctrl);
    assert!(wait.ctrl.contains(&4), "{:?}", wait.ctrl);
}

/// `--astra-sim` also orders each op after its thread predecessor through `data_deps`, which is
/// all ASTRA-sim's feeder follows; without it `data_deps` are the tensor edges alone.
#[test]
fn astra_sim_order_goes_into_data_deps() {
    let trace = shared("cpu/dist_mlp_w2.rank0.et.json");
    let plain = export(&trace, &[], &tmp("order-plain.et"));
    let astra = export(&trace, &["--astra-sim"], &tmp("order-astra.et"));
    assert_eq!(plain.nodes.len(), astra.nodes.len());
    let mut added = 0;
    for (p, a) in plain.nodes.iter().zip(&astra.nodes) {
        assert_eq!(p.ctrl_deps, a.ctrl_deps);
        if let Some(prev) = a.ctrl_deps.first() {
            assert!(
                a.data_deps.contains(prev),
                "node {}: {:?}",
                a.id,
                a.data_deps
            );
            added += !p.data_deps.contains(prev) as usize;
        }
        assert!(p.data_deps.iter().all(|d| a.data_deps.contains(d)));
    }
    assert!(
        added > 0,
        "order was not already implied by the tensor edges"
    );
}

/// A Chakra trace given where an execution trace is wanted is named for what it is, not
/// reported as JSON that fails at byte 0.
#[test]
fn a_chakra_trace_given_as_an_et_is_named() {
    let out = common::scratch("files").join("mlp.chakra.et");
    let o = bin()
        .args(["export", "--chakra"])
        .arg(shared("cpu/mlp.et.json"))
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    for cmd in ["inspect", "graph"] {
        let o = bin().arg(cmd).arg(&out).output().unwrap();
        assert_eq!(o.status.code(), Some(2));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("a Chakra protobuf trace"), "{cmd}: {err}");
    }
}
