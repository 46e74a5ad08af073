//! Hand-written execution traces for tests (cargo feature `testkit`).
//!
//! Tests describe a trace by its nodes instead of writing the observer's JSON by hand:
//!
//! ```
//! use et_schema::testkit::{tensor, TraceBuilder};
//! use serde_json::json;
//!
//! let mut b = TraceBuilder::new();
//! let relu = b
//!     .op("aten::relu", "aten::relu(Tensor self) -> Tensor")
//!     .input(tensor(1, 1, 0, 4, 4, "cpu"), json!([4]), "Tensor(float)")
//!     .output(tensor(2, 2, 0, 4, 4, "cpu"), json!([4]), "Tensor(float)")
//!     .done();
//! assert_eq!(relu, 2); // the process root is node 1
//! let t = b.build();
//! assert_eq!(t.nodes.len(), 2);
//! ```
//!
//! Node ids count up from the process root (id 1) unless set with [`NodeBuilder::id`]; a node's
//! parent is the process root unless set with [`NodeBuilder::parent`]. Nodes are written in the
//! order they were added (execution order), or children first with
//! [`TraceBuilder::children_first`], as the observer writes them.

use crate::{parse_trace, Trace};
use serde_json::{json, Map, Value as J};

/// The name of the process root node of nested (chakra) traces.
pub const PROCESS_ROOT: &str = "[pytorch|profiler|execution_trace|process]";
/// The name of a thread root node of nested (chakra) traces.
pub const THREAD_ROOT: &str = "[pytorch|profiler|execution_trace|thread]";
/// The schema [`TraceBuilder::new`] writes.
pub const DEFAULT_SCHEMA: &str = "1.1.1-chakra.0.0.4";

/// A tensor value as the observer records it: `[id, storage, offset, numel, itemsize, device]`.
pub fn tensor(id: u64, storage: u64, offset: u64, numel: u64, itemsize: u64, device: &str) -> J {
    json!([id, storage, offset, numel, itemsize, device])
}

/// A trace under construction: the process root (id 1, `ctrl_deps` 0) and the nodes added with
/// [`op`](Self::op) and [`node`](Self::node).
#[derive(Debug, Clone)]
pub struct TraceBuilder {
    schema: String,
    meta: Map<String, J>,
    /// Node records in the order they were added, the process root first.
    nodes: Vec<J>,
    next_id: u64,
    ops: u64,
    children_first: bool,
}

impl Default for TraceBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl TraceBuilder {
    /// Schema [`DEFAULT_SCHEMA`], nothing but the process root (id 1).
    pub fn new() -> Self {
        TraceBuilder {
            schema: DEFAULT_SCHEMA.to_string(),
            meta: Map::new(),
            nodes: vec![node_record(1, PROCESS_ROOT, 0, &[], &[], vec![])],
            next_id: 2,
            ops: 0,
            children_first: false,
        }
    }

    /// The document's `schema` string.
    pub fn schema(mut self, schema: &str) -> Self {
        self.schema = schema.to_string();
        self
    }

    /// Another top-level key of the document, such as `pid`.
    pub fn meta(mut self, key: &str, value: impl Into<J>) -> Self {
        self.meta.insert(key.to_string(), value.into());
        self
    }

    /// Write the nodes in reverse order, children before their parents, as the observer does
    /// (execution order stays node id order).
    pub fn children_first(mut self) -> Self {
        self.children_first = true;
        self
    }

    /// An operator node: attributes `rf_id` (the op's index among the ops added so far, from 0;
    /// see [`NodeBuilder::rf_id`]) and `op_schema` (written as given, even when empty).
    pub fn op(&mut self, name: &str, schema: &str) -> NodeBuilder<'_> {
        let rf_id = self.ops;
        self.ops += 1;
        let mut n = self.node(name);
        n.rf_id = Some(rf_id);
        n.op_schema = Some(schema.to_string());
        n
    }

    /// A node with no attributes of its own: a scope, `ProfilerStep#N`, a thread root, or an op
    /// recorded without schema.
    pub fn node(&mut self, name: &str) -> NodeBuilder<'_> {
        NodeBuilder {
            id: self.next_id,
            name: name.to_string(),
            parent: 1,
            rf_id: None,
            seq_id: None,
            op_schema: None,
            attrs: vec![],
            inputs: vec![],
            outputs: vec![],
            trace: self,
        }
    }

    /// The id of the node added last (1, the process root, before any).
    pub fn last_id(&self) -> u64 {
        self.nodes
            .last()
            .and_then(|n| n["id"].as_u64())
            .unwrap_or(1)
    }

    /// The trace document.
    pub fn to_json(&self) -> J {
        let mut nodes = self.nodes.clone();
        if self.children_first {
            nodes.reverse();
        }
        let mut doc = self.meta.clone();
        doc.insert("schema".to_string(), J::String(self.schema.clone()));
        doc.insert("nodes".to_string(), J::Array(nodes));
        J::Object(doc)
    }

    /// The trace document as compact JSON bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(&self.to_json()).expect("a JSON value serialises")
    }

    /// The document parsed by [`parse_trace`] (default options, source name `testkit`).
    ///
    /// # Panics
    /// When the document does not parse (say a parent that does not exist), with the error and
    /// the document; use [`to_bytes`](Self::to_bytes) to test errors.
    pub fn build(&self) -> Trace {
        let bytes = self.to_bytes();
        parse_trace(&bytes, "testkit", &Default::default()).unwrap_or_else(|e| {
            panic!(
                "testkit: the built trace does not parse: {e}\n{}",
                serde_json::to_string_pretty(&self.to_json()).unwrap_or_default()
            )
        })
    }
}

/// One recorded argument.
#[derive(Debug, Clone)]
struct ArgSpec {
    value: J,
    shape: J,
    ty: String,
    strides: Option<J>,
}

/// A node being described; [`done`](Self::done) adds it to its [`TraceBuilder`].
#[derive(Debug)]
#[must_use = "call .done() to add the node to the trace"]
pub struct NodeBuilder<'a> {
    trace: &'a mut TraceBuilder,
    id: u64,
    name: String,
    parent: u64,
    rf_id: Option<u64>,
    seq_id: Option<i64>,
    op_schema: Option<String>,
    attrs: Vec<J>,
    inputs: Vec<ArgSpec>,
    outputs: Vec<ArgSpec>,
}

impl NodeBuilder<'_> {
    /// The node's id (default: one more than the largest id so far).
    pub fn id(mut self, id: u64) -> Self {
        self.id = id;
        self
    }

    /// The parent node's id, written as `ctrl_deps` (default: 1, the process root).
    pub fn parent(mut self, id: u64) -> Self {
        self.parent = id;
        self
    }

    /// Sets the `rf_id` attribute (record function id) instead of the default.
    pub fn rf_id(mut self, rf_id: u64) -> Self {
        self.rf_id = Some(rf_id);
        self
    }

    /// The `seq_id` attribute (autograd sequence number), type `int64`.
    pub fn seq_id(mut self, seq_id: i64) -> Self {
        self.seq_id = Some(seq_id);
        self
    }

    /// Another attribute, written after `rf_id`, `seq_id` and `op_schema` in call order.
    pub fn attr(mut self, name: &str, ty: &str, value: impl Into<J>) -> Self {
        self.attrs
            .push(json!({"name": name, "type": ty, "value": value.into()}));
        self
    }

    /// An input: its value (see [`tensor`]), shape (`[]` for scalars, `[[]]` per element of an
    /// int list) and type string such as `Tensor(float)`.
    pub fn input(mut self, value: impl Into<J>, shape: impl Into<J>, ty: &str) -> Self {
        self.inputs.push(arg(value, shape, ty, None));
        self
    }

    /// An input with recorded strides; the node's other inputs get `[]` strides.
    pub fn input_strided(
        mut self,
        value: impl Into<J>,
        shape: impl Into<J>,
        strides: impl Into<J>,
        ty: &str,
    ) -> Self {
        self.inputs
            .push(arg(value, shape, ty, Some(strides.into())));
        self
    }

    /// An output, as [`input`](Self::input).
    pub fn output(mut self, value: impl Into<J>, shape: impl Into<J>, ty: &str) -> Self {
        self.outputs.push(arg(value, shape, ty, None));
        self
    }

    /// An output with recorded strides, as [`input_strided`](Self::input_strided).
    pub fn output_strided(
        mut self,
        value: impl Into<J>,
        shape: impl Into<J>,
        strides: impl Into<J>,
        ty: &str,
    ) -> Self {
        self.outputs
            .push(arg(value, shape, ty, Some(strides.into())));
        self
    }

    /// Adds the node to the trace; returns its id.
    pub fn done(self) -> u64 {
        let mut attrs = vec![];
        if let Some(r) = self.rf_id {
            attrs.push(json!({"name": "rf_id", "type": "uint64", "value": r}));
        }
        if let Some(s) = self.seq_id {
            attrs.push(json!({"name": "seq_id", "type": "int64", "value": s}));
        }
        if let Some(s) = &self.op_schema {
            attrs.push(json!({"name": "op_schema", "type": "string", "value": s}));
        }
        attrs.extend(self.attrs);
        let record = node_record(
            self.id,
            &self.name,
            self.parent,
            &self.inputs,
            &self.outputs,
            attrs,
        );
        self.trace.nodes.push(record);
        self.trace.next_id = self.trace.next_id.max(self.id + 1);
        self.id
    }
}

fn arg(value: impl Into<J>, shape: impl Into<J>, ty: &str, strides: Option<J>) -> ArgSpec {
    ArgSpec {
        value: value.into(),
        shape: shape.into(),
        ty: ty.to_string(),
        strides,
    }
}

/// `{"values": [..], "shapes": [..], "types": [..]}`, with `"strides"` when any argument has them.
fn io(args: &[ArgSpec]) -> J {
    let mut o = json!({
        "values": args.iter().map(|a| a.value.clone()).collect::<Vec<_>>(),
        "shapes": args.iter().map(|a| a.shape.clone()).collect::<Vec<_>>(),
        "types": args.iter().map(|a| a.ty.as_str()).collect::<Vec<_>>(),
    });
    if args.iter().any(|a| a.strides.is_some()) {
        o["strides"] = args
            .iter()
            .map(|a| a.strides.clone().unwrap_or_else(|| json!([])))
            .collect();
    }
    o
}

fn node_record(
    id: u64,
    name: &str,
    parent: u64,
    inputs: &[ArgSpec],
    outputs: &[ArgSpec],
    attrs: Vec<J>,
) -> J {
    json!({
        "id": id,
        "name": name,
        "ctrl_deps": parent,
        "inputs": io(inputs),
        "outputs": io(outputs),
        "attrs": attrs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Layout, Value};

    const RELU: &str = "aten::relu(Tensor self) -> Tensor";
    const ADD: &str = "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor";

    #[test]
    fn the_root_alone_parses() {
        let b = TraceBuilder::new();
        assert_eq!(b.last_id(), 1);
        let t = b.build();
        assert_eq!(t.meta.schema, DEFAULT_SCHEMA);
        assert_eq!(t.layout, Layout::Nested);
        assert_eq!(t.nodes.len(), 1);
        assert_eq!(t.nodes[0].id, 1);
        assert_eq!(t.name(&t.nodes[0]), PROCESS_ROOT);
        assert!(t.inputs(&t.nodes[0]).is_empty());
        assert_eq!(
            b.to_json()["nodes"][0],
            json!({"id": 1, "name": PROCESS_ROOT, "ctrl_deps": 0,
                "inputs": {"values": [], "shapes": [], "types": []},
                "outputs": {"values": [], "shapes": [], "types": []}, "attrs": []})
        );
    }

    #[test]
    fn ops_get_ids_parents_attrs_and_arguments() {
        let mut b = TraceBuilder::new().meta("pid", 7);
        let step = b.node("ProfilerStep#3").done();
        let relu = b
            .op("aten::relu", RELU)
            .parent(step)
            .seq_id(12)
            .input(tensor(3, 4, 0, 6, 4, "cpu"), json!([2, 3]), "Tensor(float)")
            .output(tensor(5, 6, 0, 6, 4, "cpu"), json!([2, 3]), "Tensor(float)")
            .done();
        let add = b
            .op("aten::add", ADD)
            .id(10)
            .attr("tid", "uint64", 2)
            .attr("my_note", "string", "x")
            .input(tensor(5, 6, 0, 6, 4, "cpu"), json!([2, 3]), "Tensor(float)")
            .input(tensor(5, 6, 0, 6, 4, "cpu"), json!([2, 3]), "Tensor(float)")
            .input(2, json!([]), "Int")
            .output(tensor(7, 8, 0, 6, 4, "cpu"), json!([2, 3]), "Tensor(float)")
            .done();
        let after = b.node("aten::relu").rf_id(99).done();
        assert_eq!((step, relu, add, after), (2, 3, 10, 11));
        assert_eq!(b.last_id(), 11);

        let t = b.build();
        assert_eq!(t.meta.pid, Some(7));
        let ids: Vec<u64> = t.nodes.iter().map(|n| n.id).collect();
        assert_eq!(ids, [1, 2, 3, 10, 11]);
        let parents: Vec<Option<u64>> = t.nodes[1..].iter().map(|n| n.parent).collect();
        assert_eq!(parents, [Some(1), Some(2), Some(1), Some(1)]);
        let names: Vec<&str> = t.nodes.iter().map(|n| t.name(n)).collect();
        assert_eq!(
            names,
            [
                PROCESS_ROOT,
                "ProfilerStep#3",
                "aten::relu",
                "aten::add",
                "aten::relu"
            ]
        );

        // A plain node has no attributes; ops count rf_id from 0 and carry their schema.
        let (s, r, a, x) = (&t.nodes[1], &t.nodes[2], &t.nodes[3], &t.nodes[4]);
        assert_eq!((s.rf_id, s.op_schema), (None, None));
        assert_eq!(r.rf_id, Some(0));
        assert_eq!(r.seq_id, Some(12));
        assert_eq!(t.op_schema_str(r), Some(RELU));
        assert_eq!((a.rf_id, a.seq_id, a.tid), (Some(1), None, Some(2)));
        assert_eq!(t.op_schema_str(a), Some(ADD));
        assert_eq!(t.extras(a).len(), 1);
        assert_eq!(t.str(t.extras(a)[0].name), "my_note");
        assert_eq!((x.rf_id, x.op_schema), (Some(99), None));

        let ins = t.inputs(r);
        assert_eq!(ins.len(), 1);
        assert_eq!(t.str(ins[0].ty), "Tensor(float)");
        assert_eq!(t.int_list(ins[0].shape), Some(vec![2, 3]));
        let Value::Tensor(k) = ins[0].value else {
            panic!("{:?}", ins[0].value)
        };
        let tr = t.tensor(k);
        assert_eq!(
            (tr.id, tr.storage, tr.offset, tr.numel, tr.itemsize),
            (3, 4, 0, 6, 4)
        );
        assert_eq!(tr.device.map(|d| t.str(d)), Some("cpu"));
        let ins = t.inputs(a);
        assert_eq!(ins.len(), 3);
        assert_eq!(t.as_f64(ins[2].value), Some(2.0));
        assert_eq!(t.outputs(a).len(), 1);
    }

    #[test]
    fn children_first_reverses_the_file_not_the_ids() {
        let mut b = TraceBuilder::new().children_first();
        let th = b.node(THREAD_ROOT).done();
        b.op("aten::relu", RELU).parent(th).done();
        let doc = b.to_json();
        let file_ids: Vec<u64> = doc["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["id"].as_u64().unwrap())
            .collect();
        assert_eq!(file_ids, [3, 2, 1]);
        let t = b.build();
        assert_eq!(t.nodes.iter().map(|n| n.id).collect::<Vec<_>>(), [3, 2, 1]);
        assert_eq!(t.nodes[0].parent, Some(2));
    }

    #[test]
    fn strides_schema_and_bytes() {
        let mut b = TraceBuilder::new().schema("1.0.2-chakra.0.0.4");
        b.op("aten::neg", "aten::neg(Tensor self) -> Tensor")
            .input_strided(
                tensor(1, 1, 0, 1, 4, "cpu"),
                json!([4]),
                json!([0]),
                "Tensor(float)",
            )
            .input(1, json!([]), "Int")
            .output(tensor(2, 2, 0, 4, 4, "cpu"), json!([4]), "Tensor(float)")
            .done();
        let doc = b.to_json();
        assert_eq!(doc["nodes"][1]["inputs"]["strides"], json!([[0], []]));
        assert!(doc["nodes"][1]["outputs"].get("strides").is_none());
        assert_eq!(serde_json::from_slice::<J>(&b.to_bytes()).unwrap(), doc);
        let t = b.build();
        assert_eq!(t.meta.schema, "1.0.2-chakra.0.0.4");
        assert!(t.inputs(&t.nodes[1])[0].strides.is_some());
    }

    #[test]
    #[should_panic(expected = "testkit: the built trace does not parse")]
    fn a_duplicate_id_panics_with_the_parse_error() {
        let mut b = TraceBuilder::new();
        b.op("aten::relu", RELU).id(1).done();
        b.build();
    }
}
