//! `mystique export TRACE --chakra`: a selection of one rank's trace as an MLCommons Chakra
//! protobuf execution trace, the input of simulators such as ASTRA-sim.
//!
//! # File layout
//! As Chakra's own converters write it (`encode_message` in chakra's `third_party/utils/
//! protolib.py`): one `GlobalMetadata` message, then one `Node` message per node, each preceded
//! by its length as a protobuf varint (prost's `encode_length_delimited`, protobuf's
//! `writeDelimitedTo`). Nodes are written in execution order (ascending ids).
//!
//! # What is emitted
//! One Chakra node per op of the selection (et-graph's replay set with the filters applied), with
//! the ET node's id and name:
//! - `COMM_COLL_NODE` for a collective (et-graph's `OpClass::COLLECTIVE`) whose name (et-graph's
//!   `summary::collective_name`) maps to a `CollectiveCommType`; attributes `comm_type`,
//!   `comm_size` (bytes of the tensors it sends: its input tensors, less the arguments its op
//!   schema names `output*`; distinct tensors, numel x itemsize), `pg_name` when the node or the
//!   `record_param_comms` inside it records one;
//! - `COMM_SEND_NODE` / `COMM_RECV_NODE` for point-to-point ops (`send`, `recv`, ...), with
//!   `comm_size`, `pg_name`, and `comm_src` / `comm_dst` / `comm_tag` where the op's arguments
//!   record them (the peer as recorded: a rank of the op's process group), the other end being
//!   the rank the trace recorded (`summary::recorded_rank`);
//! - `COMP_NODE` for every other op, with `tensor_size` (bytes of its distinct input and output
//!   tensors). A collective record with no Chakra type (the `record_param_comms` "wait" of older
//!   traces) is a `COMP_NODE` too.
//!
//! No `METADATA_NODE` or `MEM_LOAD_NODE` / `MEM_STORE_NODE` is emitted: annotations, roots and
//! the nodes ops cover are not ops, and tensor traffic is part of the ops here.
//!
//! Every node also gets the attributes Chakra's PyTorch converter writes: `rf_id`, `fw_parent`,
//! `seq_id`, `scope`, `tid`, `fw_tid` (int64, where recorded), `op_schema` (string, where
//! recorded) and `is_cpu_op` (bool: false for communication nodes, so that ASTRA-sim issues them
//! to the network, and for ops on CUDA tensors; true otherwise), and `inputs` / `outputs` as JSON
//! text of the recorded values, shapes and types.
//!
//! Dependencies:
//! - `data_deps`: the producers of the tensors the op reads (et-graph's data edges over the
//!   selection, one entry per producing node);
//! - `ctrl_deps`: the previous op of the same thread in execution order, and, for a "wait"
//!   record, the collective it waits for (the collective whose `record_param_comms` sequence
//!   number, its first integer argument, is the wait's).
//!
//! Every dependency names an earlier node of the file. Chakra's ET feeder (which ASTRA-sim uses)
//! resolves `data_deps` only.
//!
//! Times: the ET records none, so `start_time_micros` and `duration_micros` are 0 (durations
//! from a linked Kineto trace are not exported).

use anyhow::{Context, Result};
use et_graph::{Graph, OpClass, ReplaySet};
use et_schema::{Node as EtNode, Trace, Value};
use prost::Message;
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::Path;

/// The messages of Chakra's `schema/protobuf/et_def.proto` (package `ChakraProtoMsg`) that this
/// exporter writes, by hand instead of generated from the .proto (no `protoc`, no build script).
///
/// Field numbers and types are those of `et_def.proto` in github.com/mlcommons/chakra
/// (`schema/protobuf/et_def.proto`, read at commit 6dc63e1): every tag below names the field it
/// mirrors. Fields this exporter never sets are left out (prost skips them when decoding):
/// `AttributeProto`'s list values and the other scalar kinds of its `value` oneof, `Node.storage`
/// (11), the `Tensor` and storage messages.
pub mod proto {
    /// `message GlobalMetadata { string version = 1; repeated AttributeProto attr = 2; }`
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct GlobalMetadata {
        #[prost(string, tag = "1")]
        pub version: String,
        #[prost(message, repeated, tag = "2")]
        pub attr: Vec<AttributeProto>,
    }

    /// `message Node`: `uint64 id = 1; string name = 2; NodeType type = 3;
    /// repeated uint64 ctrl_deps = 4; repeated uint64 data_deps = 5;
    /// uint64 start_time_micros = 6; uint64 duration_micros = 7; IOInfo inputs = 8;
    /// IOInfo outputs = 9; repeated AttributeProto attr = 10;` (proto3: the repeated uint64s are
    /// packed, as prost writes them).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Node {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(string, tag = "2")]
        pub name: String,
        #[prost(enumeration = "NodeType", tag = "3")]
        pub r#type: i32,
        #[prost(uint64, repeated, tag = "4")]
        pub ctrl_deps: Vec<u64>,
        #[prost(uint64, repeated, tag = "5")]
        pub data_deps: Vec<u64>,
        #[prost(uint64, tag = "6")]
        pub start_time_micros: u64,
        #[prost(uint64, tag = "7")]
        pub duration_micros: u64,
        #[prost(message, optional, tag = "8")]
        pub inputs: Option<IoInfo>,
        #[prost(message, optional, tag = "9")]
        pub outputs: Option<IoInfo>,
        #[prost(message, repeated, tag = "10")]
        pub attr: Vec<AttributeProto>,
    }

    /// `message IOInfo { string values = 1; string shapes = 2; string types = 3; }`
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct IoInfo {
        #[prost(string, tag = "1")]
        pub values: String,
        #[prost(string, tag = "2")]
        pub shapes: String,
        #[prost(string, tag = "3")]
        pub types: String,
    }

    /// `message AttributeProto { string name = 1; string doc_string = 2; oneof value {...} }`:
    /// of the oneof, the members this exporter writes (numbers as in `et_def.proto`).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AttributeProto {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub doc_string: String,
        #[prost(oneof = "AttrValue", tags = "3, 7, 9, 13, 27, 29")]
        pub value: Option<AttrValue>,
    }

    /// `oneof value` of `AttributeProto` (a subset).
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum AttrValue {
        /// `double double_val = 3;`
        #[prost(double, tag = "3")]
        DoubleVal(f64),
        /// `int32 int32_val = 7;` (ASTRA-sim reads `comm_src`, `comm_dst`, `comm_tag` here)
        #[prost(int32, tag = "7")]
        Int32Val(i32),
        /// `int64 int64_val = 9;` (`comm_type`, `comm_size`, `rf_id`, ...)
        #[prost(int64, tag = "9")]
        Int64Val(i64),
        /// `uint64 uint64_val = 13;` (`tensor_size`, metadata `pid`, `start_ts`, ...)
        #[prost(uint64, tag = "13")]
        Uint64Val(u64),
        /// `bool bool_val = 27;` (`is_cpu_op`)
        #[prost(bool, tag = "27")]
        BoolVal(bool),
        /// `string string_val = 29;` (`pg_name`, `op_schema`, ...)
        #[prost(string, tag = "29")]
        StringVal(String),
    }

    /// `enum NodeType` (values as in `et_def.proto`; the newer storage kinds are not used).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum NodeType {
        InvalidNode = 0,
        MetadataNode = 1,
        MemLoadNode = 2,
        MemStoreNode = 3,
        CompNode = 4,
        CommSendNode = 5,
        CommRecvNode = 6,
        CommCollNode = 7,
    }

    impl NodeType {
        /// The name `et_def.proto` gives the value.
        pub fn proto_name(self) -> &'static str {
            match self {
                NodeType::InvalidNode => "INVALID_NODE",
                NodeType::MetadataNode => "METADATA_NODE",
                NodeType::MemLoadNode => "MEM_LOAD_NODE",
                NodeType::MemStoreNode => "MEM_STORE_NODE",
                NodeType::CompNode => "COMP_NODE",
                NodeType::CommSendNode => "COMM_SEND_NODE",
                NodeType::CommRecvNode => "COMM_RECV_NODE",
                NodeType::CommCollNode => "COMM_COLL_NODE",
            }
        }
    }

    /// `enum CollectiveCommType` (values as in `et_def.proto`); written as the `int64_val` of
    /// the `comm_type` attribute, as Chakra's converter does and ASTRA-sim's feeder reads it.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum CollectiveCommType {
        AllReduce = 0,
        Reduce = 1,
        AllGather = 2,
        Gather = 3,
        Scatter = 4,
        Broadcast = 5,
        AllToAll = 6,
        ReduceScatter = 7,
        ReduceScatterBlock = 8,
        Barrier = 9,
    }

    impl AttributeProto {
        pub fn new(name: &str, value: AttrValue) -> AttributeProto {
            AttributeProto {
                name: name.to_string(),
                doc_string: String::new(),
                value: Some(value),
            }
        }
    }
}

use proto::{
    AttrValue, AttributeProto, CollectiveCommType, GlobalMetadata, IoInfo, Node, NodeType,
};

/// `GlobalMetadata.version`: the Chakra schema version these messages follow (the one Chakra's
/// own tools write, and the `chakra.0.0.4` of the ET schemas this project reads).
pub const CHAKRA_VERSION: &str = "0.0.4";

/// What an op is for Chakra.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommKind {
    Collective(CollectiveCommType),
    Send,
    Recv,
}

/// The Chakra kind of a collective by its name (`allreduce`, `all_to_allv`, `_allgather_base`,
/// `reduce_scatter_tensor_coalesced`, `send`, ...): compared without `_`/`-` and case, the most
/// specific name first. `None` for records that are not a transfer of their own (`wait`).
pub fn comm_kind(collective: &str) -> Option<CommKind> {
    use CollectiveCommType::*;
    let n: String = collective
        .chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect();
    if n.contains("send") {
        return Some(CommKind::Send);
    }
    if n.contains("recv") {
        return Some(CommKind::Recv);
    }
    let table = [
        ("allreduce", AllReduce),
        ("reducescatter", ReduceScatter),
        ("allgather", AllGather),
        ("alltoall", AllToAll),
        ("broadcast", Broadcast),
        ("barrier", Barrier),
        ("gather", Gather),
        ("scatter", Scatter),
        ("reduce", Reduce),
    ];
    table
        .iter()
        .find(|(k, _)| n.contains(k))
        .map(|&(_, c)| CommKind::Collective(c))
}

/// A converted selection.
pub struct Export {
    pub metadata: GlobalMetadata,
    pub nodes: Vec<Node>,
    /// et-graph's data edges over the selection (before merging edges between the same ops).
    pub tensor_edges: usize,
}

impl Export {
    /// Node counts by type, named as in `et_def.proto`.
    pub fn by_type(&self) -> BTreeMap<&'static str, usize> {
        let mut m = BTreeMap::new();
        for n in &self.nodes {
            let name = NodeType::try_from(n.r#type).map_or("INVALID_NODE", |t| t.proto_name());
            *m.entry(name).or_default() += 1;
        }
        m
    }

    /// Writes the Chakra file: the metadata, then the nodes, each length-delimited.
    pub fn write(&self, w: &mut dyn Write) -> Result<()> {
        let mut buf = Vec::with_capacity(4096);
        self.metadata.encode_length_delimited(&mut buf)?;
        w.write_all(&buf)?;
        for n in &self.nodes {
            buf.clear();
            n.encode_length_delimited(&mut buf)?;
            w.write_all(&buf)?;
        }
        Ok(())
    }
}

/// Reads a Chakra file back: its metadata and nodes.
pub fn decode(mut bytes: &[u8]) -> Result<(GlobalMetadata, Vec<Node>)> {
    let meta = GlobalMetadata::decode_length_delimited(&mut bytes)
        .context("decoding the Chakra GlobalMetadata")?;
    let mut nodes = Vec::new();
    while !bytes.is_empty() {
        let n = Node::decode_length_delimited(&mut bytes)
            .with_context(|| format!("decoding Chakra node {}", nodes.len()))?;
        nodes.push(n);
    }
    Ok((meta, nodes))
}

fn attr(name: &str, v: AttrValue) -> AttributeProto {
    AttributeProto::new(name, v)
}

/// The metadata Chakra's PyTorch converter writes (`schema`, `pid`, `time`, `start_ts`,
/// `finish_ts`), where the trace records them.
pub fn metadata(t: &Trace) -> GlobalMetadata {
    let m = &t.meta;
    let mut a = vec![attr("schema", AttrValue::StringVal(m.schema.clone()))];
    let u = |x: Option<i64>| x.and_then(|x| u64::try_from(x).ok());
    if let Some(pid) = u(m.pid) {
        a.push(attr("pid", AttrValue::Uint64Val(pid)));
    }
    if let Some(time) = &m.time {
        a.push(attr("time", AttrValue::StringVal(time.clone())));
    }
    if let Some(x) = u(m.start_ts) {
        a.push(attr("start_ts", AttrValue::Uint64Val(x)));
    }
    if let Some(x) = u(m.finish_ts) {
        a.push(attr("finish_ts", AttrValue::Uint64Val(x)));
    }
    GlobalMetadata {
        version: CHAKRA_VERSION.to_string(),
        attr: a,
    }
}

/// Bytes of the distinct tensors (by tensor id and storage; storage 0 means none) in `values`.
fn tensor_bytes<'a>(t: &Trace, values: impl Iterator<Item = &'a Value>) -> u64 {
    let mut seen: std::collections::HashSet<(u64, u64)> = Default::default();
    let mut ids = Vec::new();
    let mut bytes = 0u64;
    for &v in values {
        ids.clear();
        t.tensors_in(v, &mut ids);
        for &i in &ids {
            let x = t.tensor(i);
            if x.storage == 0 || !seen.insert((x.id, x.storage)) {
                continue;
            }
            bytes = bytes.saturating_add(x.numel.saturating_mul(x.itemsize));
        }
    }
    bytes
}

/// `IOInfo` of a node's inputs or outputs: JSON lists of the values, shapes and type strings.
fn io_info(t: &Trace, args: &[et_schema::Arg]) -> IoInfo {
    let list = |f: &dyn Fn(&et_schema::Arg, &mut String)| {
        let mut s = String::from("[");
        for (k, a) in args.iter().enumerate() {
            if k > 0 {
                s.push_str(", ");
            }
            f(a, &mut s);
        }
        s.push(']');
        s
    };
    IoInfo {
        // Whole, as recorded: no length limit.
        values: list(&|a, s| s.push_str(&t.value_text(a.value, usize::MAX))),
        shapes: list(&|a, s| s.push_str(&t.value_text(a.shape, usize::MAX))),
        types: list(&|a, s| s.push_str(&serde_json::to_string(t.str(a.ty)).unwrap_or_default())),
    }
}

/// The process group a collective record names: its `pg_name` attribute, or (schema 1.0.3) the
/// first string of its `Tuple[String,String]` argument (`["0", "default_pg"]`).
fn pg_name_of(t: &Trace, n: &EtNode) -> Option<String> {
    if let Some(s) = t.extra_str(n, "pg_name").filter(|s| !s.is_empty()) {
        return Some(s.to_string());
    }
    t.inputs(n).iter().find_map(|a| {
        if !t.str(a.ty).starts_with("Tuple[String,String]") {
            return None;
        }
        match t.list(a.value).first() {
            Some(Value::Str(s)) if !t.str(*s).is_empty() => Some(t.str(*s).to_string()),
            _ => None,
        }
    })
}

/// The sequence number a `record_param_comms` record carries: its first integer argument.
fn comms_seq(t: &Trace, n: &EtNode) -> Option<i64> {
    t.inputs(n).iter().find_map(|a| match a.value {
        Value::Int(i) => Some(i),
        _ => None,
    })
}

/// The node itself if it is a `record_param_comms` record, else the first one in its subtree
/// that is not a wait: where the collective's group and sequence number are recorded.
fn comms_record(g: &Graph, i: u32) -> Option<u32> {
    let t = g.trace;
    let mut stack = vec![i];
    while let Some(k) = stack.pop() {
        let n = &t.nodes[k as usize];
        if t.name(n) == "record_param_comms"
            && (k == i || et_graph::summary::collective_name(t, n).as_deref() != Some("wait"))
        {
            return Some(k);
        }
        stack.extend(g.children(k).iter().rev());
    }
    None
}

/// Bytes a communication op sends: its input tensors, less the arguments its schema names
/// `output*` (`c10d::allgather_`'s `output_tensors`, `alltoall_base_`'s `output`).
fn comm_bytes(g: &Graph, i: u32) -> u64 {
    let t = g.trace;
    let n = &t.nodes[i as usize];
    let ins = t.inputs(n);
    match &g.schema[i as usize] {
        Some(s) => tensor_bytes(
            t,
            ins.iter()
                .enumerate()
                .filter(|(k, _)| {
                    !s.args
                        .get(*k)
                        .and_then(|a| a.name.as_deref())
                        .is_some_and(|name| name.starts_with("output"))
                })
                .map(|(_, a)| &a.value),
        ),
        None => tensor_bytes(t, ins.iter().map(|a| &a.value)),
    }
}

/// An integer argument of a node by its schema name (one of `names`).
fn int_arg(g: &Graph, i: u32, names: &[&str]) -> Option<i64> {
    let s = g.schema[i as usize].as_ref()?;
    let k = s
        .args
        .iter()
        .position(|a| a.name.as_deref().is_some_and(|n| names.contains(&n)))?;
    match g.trace.inputs(&g.trace.nodes[i as usize]).get(k)?.value {
        Value::Int(v) => Some(v),
        _ => None,
    }
}

fn push_i64(attrs: &mut Vec<AttributeProto>, name: &str, v: Option<u64>) {
    if let Some(v) = v.and_then(|v| i64::try_from(v).ok()) {
        attrs.push(attr(name, AttrValue::Int64Val(v)));
    }
}

fn push_i32(attrs: &mut Vec<AttributeProto>, name: &str, v: Option<i64>) {
    if let Some(v) = v.and_then(|v| i32::try_from(v).ok()) {
        attrs.push(attr(name, AttrValue::Int32Val(v)));
    }
}

/// Converts a selection (a replay set, filters applied) to Chakra nodes.
/// With `order_in_data`, each op's predecessor on its thread is also a data dependency (for
/// consumers that follow `data_deps` only, such as ASTRA-sim's feeder).
pub fn convert(g: &Graph, set: &ReplaySet, order_in_data: bool) -> Export {
    let t = g.trace;
    let threads = g.threads();
    let tensors = g.tensors(set);
    let rank = et_graph::summary::recorded_rank(t).and_then(|r| i64::try_from(r).ok());
    // Data dependencies: producers of what each op reads, one entry per producing op.
    let mut data: Vec<Vec<u64>> = vec![Vec::new(); set.ops.len()];
    for e in &tensors.edges {
        data[e.to as usize].push(g.id(set.ops[e.from as usize]));
    }
    let mut last_on_thread: HashMap<u32, u64> = HashMap::new();
    // Collectives by the sequence number of their record, for the waits that follow them.
    let mut by_seq = et_graph::summary::CollectivesBySeq::default();
    let mut nodes = Vec::with_capacity(set.ops.len());
    for (pos, &i) in set.ops.iter().enumerate() {
        let n = &t.nodes[i as usize];
        let id = n.id;
        let class = g.class[i as usize];
        let mut ctrl_deps = Vec::new();
        let mut data_deps = std::mem::take(&mut data[pos]);
        if let Some(prev) = last_on_thread.insert(threads.thread(i), id) {
            ctrl_deps.push(prev);
            if order_in_data {
                data_deps.push(prev);
            }
        }
        data_deps.sort_unstable();
        data_deps.dedup();

        let mut attrs = Vec::new();
        push_i64(&mut attrs, "rf_id", n.rf_id);
        push_i64(&mut attrs, "fw_parent", n.fw_parent);
        if let Some(s) = n.seq_id {
            attrs.push(attr("seq_id", AttrValue::Int64Val(s)));
        }
        push_i64(&mut attrs, "scope", n.scope);
        push_i64(&mut attrs, "tid", n.tid);
        push_i64(&mut attrs, "fw_tid", n.fw_tid);
        if let Some(s) = t.op_schema_str(n) {
            attrs.push(attr("op_schema", AttrValue::StringVal(s.to_string())));
        }

        let collective = class
            .contains(OpClass::COLLECTIVE)
            .then(|| et_graph::summary::collective_name(t, n))
            .flatten();
        let kind = collective.as_deref().and_then(comm_kind);
        let ty = match kind {
            None => {
                attrs.push(attr(
                    "is_cpu_op",
                    AttrValue::BoolVal(!class.contains(OpClass::CUDA)),
                ));
                let bytes =
                    tensor_bytes(t, t.inputs(n).iter().chain(t.outputs(n)).map(|a| &a.value));
                attrs.push(attr("tensor_size", AttrValue::Uint64Val(bytes)));
                if collective.as_deref() == Some("wait") {
                    let pg = pg_name_of(t, n);
                    let c = comms_seq(t, n).and_then(|s| by_seq.waited(s, pg.as_deref()));
                    if let Some(&c) = c {
                        if !ctrl_deps.contains(&c) {
                            ctrl_deps.push(c);
                        }
                    }
                }
                NodeType::CompNode
            }
            Some(kind) => {
                attrs.push(attr("is_cpu_op", AttrValue::BoolVal(false)));
                let record = comms_record(g, i).map(|r| &t.nodes[r as usize]);
                let pg = pg_name_of(t, n).or_else(|| record.and_then(|r| pg_name_of(t, r)));
                if let Some(seq) = record.and_then(|r| comms_seq(t, r)) {
                    by_seq.issued(seq, pg.clone(), id);
                }
                if let CommKind::Collective(c) = kind {
                    attrs.push(attr("comm_type", AttrValue::Int64Val(c as i64)));
                }
                let bytes = i64::try_from(comm_bytes(g, i)).unwrap_or(i64::MAX);
                attrs.push(attr("comm_size", AttrValue::Int64Val(bytes)));
                if let Some(pg) = pg {
                    attrs.push(attr("pg_name", AttrValue::StringVal(pg)));
                }
                let tag = int_arg(g, i, &["tag"]);
                match kind {
                    CommKind::Send => {
                        push_i32(&mut attrs, "comm_src", rank);
                        push_i32(&mut attrs, "comm_dst", int_arg(g, i, &["dstRank", "dst"]));
                        push_i32(&mut attrs, "comm_tag", tag);
                        NodeType::CommSendNode
                    }
                    CommKind::Recv => {
                        push_i32(&mut attrs, "comm_src", int_arg(g, i, &["srcRank", "src"]));
                        push_i32(&mut attrs, "comm_dst", rank);
                        push_i32(&mut attrs, "comm_tag", tag);
                        NodeType::CommRecvNode
                    }
                    CommKind::Collective(_) => NodeType::CommCollNode,
                }
            }
        };
        nodes.push(Node {
            id,
            name: t.name(n).to_string(),
            r#type: ty as i32,
            ctrl_deps,
            data_deps,
            start_time_micros: 0,
            duration_micros: 0,
            inputs: Some(io_info(t, t.inputs(n))),
            outputs: Some(io_info(t, t.outputs(n))),
            attr: attrs,
        });
    }
    Export {
        metadata: metadata(t),
        nodes,
        tensor_edges: tensors.edges.len(),
    }
}

/// `mystique export TRACE --chakra [filters] -o OUT`.
pub fn export(
    trace: &Path,
    f: &crate::compose_cmd::Filters,
    out: &Path,
    json: bool,
    order_in_data: bool,
) -> Result<()> {
    use std::io::IsTerminal;
    if out.as_os_str() == "-" && std::io::stdout().is_terminal() {
        anyhow::bail!("a Chakra trace is binary: write it to a file with -o OUT, or pipe stdout");
    }
    crate::output::check(out, &[trace])?;
    let t = crate::read_trace(trace)?;
    let g = Graph::new(&t);
    let set = g.select(&f.selection()?)?;
    let x = convert(&g, &set, order_in_data);
    crate::output::write_atomic_gz(out, |w| x.write(w))?;
    let data: usize = x.nodes.iter().map(|n| n.data_deps.len()).sum();
    let ctrl: usize = x.nodes.iter().map(|n| n.ctrl_deps.len()).sum();
    if json {
        let j = serde_json::json!({
            "output": out.display().to_string(),
            "what": "chakra",
            "version": CHAKRA_VERSION,
            "nodes": x.nodes.len(),
            "types": x.by_type(),
            "data_deps": data,
            "ctrl_deps": ctrl,
            "tensor_edges": x.tensor_edges,
        });
        crate::compose_cmd::json_summary(out, &j)?;
    } else if out.as_os_str() != "-" {
        let types: Vec<String> = x
            .by_type()
            .iter()
            .map(|(k, v)| format!("{v} {k}"))
            .collect();
        eprintln!(
            "exported {} Chakra nodes ({}), {} data and {} control dependencies to {}",
            x.nodes.len(),
            types.join(", "),
            data,
            ctrl,
            out.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collective_names_map_to_chakra_types() {
        use CollectiveCommType::*;
        let c = |s| comm_kind(s);
        assert_eq!(c("allreduce"), Some(CommKind::Collective(AllReduce)));
        assert_eq!(c("all_reduce"), Some(CommKind::Collective(AllReduce)));
        assert_eq!(
            c("reduce_scatter_tensor_coalesced"),
            Some(CommKind::Collective(ReduceScatter))
        );
        assert_eq!(c("_allgather_base"), Some(CommKind::Collective(AllGather)));
        assert_eq!(c("all_to_allv"), Some(CommKind::Collective(AllToAll)));
        assert_eq!(c("alltoall_base"), Some(CommKind::Collective(AllToAll)));
        assert_eq!(c("broadcast"), Some(CommKind::Collective(Broadcast)));
        assert_eq!(c("barrier"), Some(CommKind::Collective(Barrier)));
        assert_eq!(c("gather"), Some(CommKind::Collective(Gather)));
        assert_eq!(c("scatter"), Some(CommKind::Collective(Scatter)));
        assert_eq!(c("reduce"), Some(CommKind::Collective(Reduce)));
        assert_eq!(c("send"), Some(CommKind::Send));
        assert_eq!(c("recv_any_source"), Some(CommKind::Recv));
        assert_eq!(c("wait"), None);
        assert_eq!(c("unknown"), None);
    }

    #[test]
    fn messages_round_trip_length_delimited() {
        let x = Export {
            metadata: GlobalMetadata {
                version: CHAKRA_VERSION.into(),
                attr: vec![attr("schema", AttrValue::StringVal("1.1.1".into()))],
            },
            nodes: vec![Node {
                id: 7,
                name: "aten::mm".into(),
                r#type: NodeType::CompNode as i32,
                ctrl_deps: vec![3],
                data_deps: vec![1, 5],
                attr: vec![attr("tensor_size", AttrValue::Uint64Val(64))],
                ..Default::default()
            }],
            tensor_edges: 2,
        };
        let mut bytes = Vec::new();
        x.write(&mut bytes).unwrap();
        let (meta, nodes) = decode(&bytes).unwrap();
        assert_eq!(meta, x.metadata);
        assert_eq!(nodes, x.nodes);
        // A length prefix, then `version` (field 1, length-delimited: tag 0x0a).
        assert_eq!(bytes[1], 0x0a);
    }
}
