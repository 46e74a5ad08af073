//! The in-memory trace model: flat arenas, interned strings, no tree of small heap objects.

use crate::dtype::DType;
use crate::intern::{Interner, Sym};
use crate::opschema::{OpSchema, SchemaParseError};
use crate::types::ValueType;
use std::ops::Range;

/// A JSON-shaped value as ET records it. Lists live in [`Trace::items`]; tensor tuples are
/// decoded into [`Trace::tensors`] when the argument's type string says they are tensors.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    /// JSON `null`.
    Null,
    /// A boolean.
    Bool(bool),
    /// An integer that fits `i64`.
    Int(i64),
    /// Integers above `i64::MAX`.
    UInt(u64),
    /// A number with a fraction or exponent.
    Float(f64),
    /// Strings, including the observer's markers `<None>`, `<Object>`, `<Stream>`, `"inf"`.
    Str(Sym),
    /// A list: `items[start..start+len]`.
    List {
        /// Index of the first element in [`Trace::items`].
        start: u32,
        /// Number of elements.
        len: u32,
    },
    /// A tensor tuple: `tensors[i]`.
    Tensor(u32),
    /// A JSON object found where ET has none: kept verbatim as JSON text.
    Raw(Sym),
}

/// `[tensor_id, storage_id, offset, numel, itemsize, device]` (no device before schema 1.0.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TensorRef {
    /// The tensor's id (the observer's, unique while the tensor lives).
    pub id: u64,
    /// 0 means no storage (undefined tensor).
    pub storage: u64,
    /// Storage offset in elements.
    pub offset: u64,
    /// Number of elements.
    pub numel: u64,
    /// Bytes per element.
    pub itemsize: u64,
    /// Device string (`cpu`, `cuda:0`, or empty for undefined tensors); `None` in 5-field tuples.
    pub device: Option<Sym>,
}

/// One input or output of a node.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Arg {
    /// The value as recorded (a tensor tuple decoded into [`Value::Tensor`]).
    pub value: Value,
    /// Shape as recorded (nested lists mirror nested values).
    pub shape: Value,
    /// The type string, e.g. `Tensor(float)`; parse it with [`Trace::arg_type`].
    pub ty: Sym,
    /// Strides as recorded (schema >= 1.1.0), `None` when absent for this argument.
    pub strides: Option<Value>,
}

/// Which file layout the trace uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Layout {
    /// Schema 1.0.0/1.0.1: attributes are top-level node keys, `parent`, `inputs` is a list with
    /// `input_shapes`/`input_types` beside it.
    Flat,
    /// Schema 1.0.2-chakra.0.0.4 and later: `ctrl_deps`, `inputs{values,shapes,types,strides}`,
    /// `attrs: [{name,type,value}]`.
    #[default]
    Nested,
}

/// Flags of what a node's record contained, so that writing it back is lossless.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct NodeFlags(pub u8);

impl NodeFlags {
    /// The record had input strides.
    pub const INPUT_STRIDES: u8 = 1;
    /// The record had output strides.
    pub const OUTPUT_STRIDES: u8 = 2;
    /// The record had an `attrs` list.
    pub const HAS_ATTRS: u8 = 4;
    /// Whether flag `f` is set.
    pub fn has(self, f: u8) -> bool {
        self.0 & f != 0
    }
}

/// An attribute this model has no field for, kept as recorded.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ExtraAttr {
    /// The attribute's name (or the flat layout's key).
    pub name: Sym,
    /// The nested layout's attribute type (`uint64`, `string`, ...); `None` for flat-layout keys.
    pub ty: Option<Sym>,
    /// The value as recorded.
    pub value: Value,
}

/// One trace node: an operator, a record_function annotation or a thread/process root.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// The node's id, unique in the trace (the observer numbers nodes as they start).
    pub id: u64,
    /// The operator or annotation name (`aten::mm`, `## forward ##`, `[pytorch|profiler...]`).
    pub name: Sym,
    /// `ctrl_deps` (nested) or `parent` (flat). The process root points to itself or to 0.
    pub parent: Option<u64>,
    /// Record function id: the key that links the node to its Kineto event.
    pub rf_id: Option<u64>,
    /// For a backward op, the forward node it differentiates.
    pub fw_parent: Option<u64>,
    /// Autograd sequence number (-1 or absent outside autograd).
    pub seq_id: Option<i64>,
    /// The `RecordScope` the op ran under (function, backward function, user scope...).
    pub scope: Option<u64>,
    /// The thread the node ran on.
    pub tid: Option<u64>,
    /// For a backward op, the thread of its forward op.
    pub fw_tid: Option<u64>,
    /// The TorchScript schema of the operator, when recorded.
    pub op_schema: Option<Sym>,
    /// The kernel backend (`triton`, ...) of a compiled kernel, when recorded.
    pub kernel_backend: Option<Sym>,
    /// The file of a compiled kernel, when recorded.
    pub kernel_file: Option<Sym>,
    /// The node's inputs in [`Trace::args`].
    pub inputs: Range<u32>,
    /// The node's outputs in [`Trace::args`].
    pub outputs: Range<u32>,
    /// Its other attributes in [`Trace::extra_attrs`].
    pub extra: Range<u32>,
    /// What the record contained, for writing it back.
    pub flags: NodeFlags,
    /// Byte offset of the node's record in the (decompressed) input, for error messages.
    pub offset: u64,
}

/// Top-level fields other than the nodes.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct TraceMeta {
    /// The schema version (`1.1.1-chakra.0.0.4`); empty when the trace names none.
    pub schema: String,
    /// The traced process's id.
    pub pid: Option<i64>,
    /// When the trace was taken, as the observer wrote it.
    pub time: Option<String>,
    /// The observer's start timestamp.
    pub start_ts: Option<i64>,
    /// The observer's finish timestamp.
    pub finish_ts: Option<i64>,
    /// Unknown top-level keys, as JSON text, in file order.
    pub extra: Vec<(String, String)>,
}

/// A parsed execution trace.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    /// The top-level fields other than the nodes.
    pub meta: TraceMeta,
    /// The file layout the trace was read in (and is written back in).
    pub layout: Layout,
    /// Every string of the trace.
    pub strings: Interner,
    /// Nodes in file order (the observer writes children before their parents).
    pub nodes: Vec<Node>,
    /// Every node's inputs and outputs ([`Node::inputs`], [`Node::outputs`]).
    pub args: Vec<Arg>,
    /// Every list's elements ([`Value::List`]).
    pub items: Vec<Value>,
    /// Every tensor tuple ([`Value::Tensor`]).
    pub tensors: Vec<TensorRef>,
    /// Every node's other attributes ([`Node::extra`]).
    pub extra_attrs: Vec<ExtraAttr>,
    /// Where the trace came from, for messages.
    pub source: String,
    /// Non-fatal findings (unknown schema version, ...).
    pub warnings: Vec<String>,
}

/// Versions whose layout this crate knows; others parse with a warning.
pub const KNOWN_SCHEMAS: &[&str] = &[
    "1.0.0",
    "1.0.1",
    "1.0.2-chakra.0.0.4",
    "1.0.3-chakra.0.0.4",
    "1.0.4-chakra.0.0.4",
    "1.1.0-chakra.0.0.4",
    "1.1.1-chakra.0.0.4",
];

impl Trace {
    /// The string of `s`.
    pub fn str(&self, s: Sym) -> &str {
        self.strings.get(s)
    }

    /// The node's name.
    pub fn name(&self, n: &Node) -> &str {
        self.strings.get(n.name)
    }

    /// The node's inputs.
    pub fn inputs(&self, n: &Node) -> &[Arg] {
        &self.args[n.inputs.start as usize..n.inputs.end as usize]
    }

    /// The node's outputs.
    pub fn outputs(&self, n: &Node) -> &[Arg] {
        &self.args[n.outputs.start as usize..n.outputs.end as usize]
    }

    /// The node's other attributes.
    pub fn extras(&self, n: &Node) -> &[ExtraAttr] {
        &self.extra_attrs[n.extra.start as usize..n.extra.end as usize]
    }

    /// The node's string attribute `name` (`pg_name`, `pg_desc`), where it has one.
    pub fn extra_str(&self, n: &Node, name: &str) -> Option<&str> {
        self.extras(n).iter().find_map(|e| match e.value {
            Value::Str(s) if self.str(e.name) == name => Some(self.str(s)),
            _ => None,
        })
    }

    /// The elements of a list value; empty for anything else.
    pub fn list(&self, v: Value) -> &[Value] {
        match v {
            Value::List { start, len } => &self.items[start as usize..(start + len) as usize],
            _ => &[],
        }
    }

    /// The tensor tuple `i` ([`Value::Tensor`]).
    pub fn tensor(&self, i: u32) -> &TensorRef {
        &self.tensors[i as usize]
    }

    /// The node's op schema as text; `None` when absent or empty.
    pub fn op_schema_str(&self, n: &Node) -> Option<&str> {
        n.op_schema.map(|s| self.str(s)).filter(|s| !s.is_empty())
    }

    /// The node's op schema parsed: `None` when the trace records none (or an empty one),
    /// `Some(Err)` when it records one that does not parse (too deep, say), so that "no op
    /// schema" and "an op schema that does not parse" can be told apart. Parses on every call:
    /// cache per distinct `n.op_schema` symbol.
    pub fn op_schema(&self, n: &Node) -> Option<Result<OpSchema, SchemaParseError>> {
        self.op_schema_str(n).map(OpSchema::parse)
    }

    /// A value as JSON text, as the trace records it (a tensor as its tuple), cut to about
    /// `max` bytes: for messages that must show a value, such as one that is not the tensor
    /// its type string says.
    pub fn value_text(&self, v: Value, max: usize) -> String {
        let mut out = String::new();
        self.value_text_into(v, max, &mut out);
        if out.len() > max {
            let mut end = max;
            while !out.is_char_boundary(end) {
                end -= 1;
            }
            out.truncate(end);
            out.push_str("...");
        }
        out
    }

    fn value_text_into(&self, v: Value, max: usize, out: &mut String) {
        use std::fmt::Write;
        if out.len() > max {
            return;
        }
        let quoted = |s: &str, out: &mut String| {
            let s = crate::error::clip(s, max);
            out.push_str(&serde_json::to_string(s.as_ref()).unwrap_or_default());
        };
        match v {
            Value::Null => out.push_str("null"),
            Value::Bool(b) => out.push_str(if b { "true" } else { "false" }),
            Value::Int(i) => {
                let _ = write!(out, "{i}");
            }
            Value::UInt(u) => {
                let _ = write!(out, "{u}");
            }
            Value::Float(f) => out.push_str(&serde_json::to_string(&f).unwrap_or_default()),
            Value::Str(s) => quoted(self.str(s), out),
            Value::Raw(s) => out.push_str(&crate::error::clip(self.str(s), max)),
            Value::List { .. } => {
                out.push('[');
                for (i, &x) in self.list(v).iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    if out.len() > max {
                        break;
                    }
                    self.value_text_into(x, max, out);
                }
                out.push(']');
            }
            Value::Tensor(i) => {
                let x = *self.tensor(i);
                let _ = write!(
                    out,
                    "[{}, {}, {}, {}, {}",
                    x.id, x.storage, x.offset, x.numel, x.itemsize
                );
                if let Some(d) = x.device {
                    out.push_str(", ");
                    quoted(self.str(d), out);
                }
                out.push(']');
            }
        }
    }

    /// Parses an argument's type string. Unparsable strings become `Opaque`.
    pub fn arg_type(&self, a: &Arg) -> ValueType {
        let s = self.str(a.ty);
        ValueType::parse(s).unwrap_or_else(|_| ValueType::Opaque(s.to_string()))
    }

    /// Interprets a value as an integer list (shapes, `int[]` arguments).
    pub fn int_list(&self, v: Value) -> Option<Vec<i64>> {
        self.list(v)
            .iter()
            .map(|x| match *x {
                Value::Int(i) => Some(i),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .filter(|_| matches!(v, Value::List { .. }))
    }

    /// Interprets a value as a float: numbers and the strings `inf`, `-inf`, `nan`.
    pub fn as_f64(&self, v: Value) -> Option<f64> {
        match v {
            Value::Int(i) => Some(i as f64),
            Value::UInt(u) => Some(u as f64),
            Value::Float(f) => Some(f),
            Value::Str(s) => match self.str(s) {
                "inf" | "Infinity" => Some(f64::INFINITY),
                "-inf" | "-Infinity" => Some(f64::NEG_INFINITY),
                "nan" | "NaN" | "-nan" => Some(f64::NAN),
                _ => None,
            },
            _ => None,
        }
    }

    /// All tensors of a value, depth-first (a value may be a list of tensors).
    pub fn tensors_in(&self, v: Value, out: &mut Vec<u32>) {
        match v {
            Value::Tensor(i) => out.push(i),
            Value::List { .. } => {
                for &x in self.list(v) {
                    self.tensors_in(x, out);
                }
            }
            _ => {}
        }
    }

    /// All tensors of a value with their element types from the matching type string.
    pub fn tensors_typed(&self, v: Value, ty: &ValueType, out: &mut Vec<(u32, Option<DType>)>) {
        match (v, ty) {
            (Value::Tensor(i), ValueType::Tensor { dtype, .. }) => out.push((i, *dtype)),
            (Value::Tensor(i), _) => out.push((i, None)),
            (Value::List { .. }, ValueType::List(e) | ValueType::Tuple(e)) => {
                for (k, &x) in self.list(v).iter().enumerate() {
                    self.tensors_typed(x, e.get(k).unwrap_or(&ValueType::None), out);
                }
            }
            (Value::List { .. }, _) => {
                for &x in self.list(v) {
                    self.tensors_typed(x, &ValueType::None, out);
                }
            }
            _ => {}
        }
    }

    /// The dtype of a tensor argument, from its type string.
    pub fn dtype_of(&self, a: &Arg) -> Option<DType> {
        match self.arg_type(a) {
            ValueType::Tensor { dtype, .. } => dtype,
            _ => None,
        }
    }

    /// Node id -> position in `nodes`. Last one wins for duplicate ids (validation rejects
    /// those unless it was turned off).
    pub fn node_by_id(&self) -> IdIndex {
        IdIndex::new(self.nodes.iter().map(|n| n.id))
    }

    /// Whether the schema string is one whose layout this crate was written against.
    pub fn schema_is_known(&self) -> bool {
        KNOWN_SCHEMAS.contains(&self.meta.schema.as_str())
    }

    /// Approximate heap bytes of the model.
    pub fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        self.nodes.capacity() * size_of::<Node>()
            + self.args.capacity() * size_of::<Arg>()
            + self.items.capacity() * size_of::<Value>()
            + self.tensors.capacity() * size_of::<TensorRef>()
            + self.extra_attrs.capacity() * size_of::<ExtraAttr>()
            + self.strings.heap_bytes()
    }
}

impl Trace {
    /// Appends another trace's nodes and arenas to this one, re-interning its strings. Node ids,
    /// parents and tensor ids are copied as they are: callers shift them to avoid collisions.
    /// Returns the index range of the appended nodes.
    ///
    /// Fails, changing nothing, when an arena would pass [`ARENA_MAX`] entries.
    pub fn absorb(&mut self, o: Trace) -> Result<Range<usize>, ArenaFull> {
        self.absorb_within(o, ARENA_MAX)
    }

    /// Whether [`Trace::absorb`] would take `o`: every arena of the two together within
    /// [`ARENA_MAX`] entries (strings counted as if none were shared). Callers that would copy
    /// before absorbing check first.
    pub fn fits_with(&self, o: &Trace) -> Result<(), ArenaFull> {
        self.fits_with_within(o, ARENA_MAX)
    }

    fn fits_with_within(&self, o: &Trace, max: usize) -> Result<(), ArenaFull> {
        for (what, a, b) in [
            ("arguments", self.args.len(), o.args.len()),
            ("list items", self.items.len(), o.items.len()),
            ("tensors", self.tensors.len(), o.tensors.len()),
            ("attributes", self.extra_attrs.len(), o.extra_attrs.len()),
            ("strings", self.strings.len(), o.strings.len()),
        ] {
            if a.checked_add(b).is_none_or(|n| n > max) {
                return Err(ArenaFull { what, max });
            }
        }
        Ok(())
    }

    /// [`Trace::absorb`] with arenas of at most `max` entries (tests use small ones).
    fn absorb_within(&mut self, o: Trace, max: usize) -> Result<Range<usize>, ArenaFull> {
        self.fits_with_within(&o, max)?;
        let o_nodes = o.nodes.len();
        let map: Vec<Sym> = o
            .strings
            .iter()
            .map(|(_, s)| self.strings.intern(s))
            .collect();
        let m = |s: Sym| map[s.0 as usize];
        let (items0, tensors0, args0, extra0) = (
            self.items.len() as u32,
            self.tensors.len() as u32,
            self.args.len() as u32,
            self.extra_attrs.len() as u32,
        );
        let mv = |v: Value| match v {
            Value::Str(s) => Value::Str(m(s)),
            Value::Raw(s) => Value::Raw(m(s)),
            Value::List { start, len } => Value::List {
                start: start + items0,
                len,
            },
            Value::Tensor(i) => Value::Tensor(i + tensors0),
            other => other,
        };
        let Trace {
            items,
            tensors,
            args,
            extra_attrs,
            nodes,
            ..
        } = self;
        let start = nodes.len();
        let shift = |r: &Range<u32>, by: u32| r.start + by..r.end + by;
        // On a big trace (the parser's merge of its threads' parts) the arenas are moved in two
        // halves of about equal bytes, the second on a thread of its own: the copy and the page
        // faults of the grown arenas cost ~15% of parsing a 200 MB trace on one thread.
        let half_a = move || {
            items.extend(o.items.into_iter().map(mv));
            nodes.extend(o.nodes.into_iter().map(|n| Node {
                name: m(n.name),
                op_schema: n.op_schema.map(m),
                kernel_backend: n.kernel_backend.map(m),
                kernel_file: n.kernel_file.map(m),
                inputs: shift(&n.inputs, args0),
                outputs: shift(&n.outputs, args0),
                extra: shift(&n.extra, extra0),
                ..n
            }));
        };
        let half_b = move || {
            tensors.extend(o.tensors.into_iter().map(|t| TensorRef {
                device: t.device.map(m),
                ..t
            }));
            args.extend(o.args.into_iter().map(|a| Arg {
                value: mv(a.value),
                shape: mv(a.shape),
                ty: m(a.ty),
                strides: a.strides.map(mv),
            }));
            extra_attrs.extend(o.extra_attrs.into_iter().map(|e| ExtraAttr {
                name: m(e.name),
                ty: e.ty.map(m),
                value: mv(e.value),
            }));
        };
        if o_nodes < 1 << 14 {
            half_a();
            half_b();
        } else {
            // Where no thread can be made, the job is still here to run on this one.
            let job = std::sync::Mutex::new(Some(half_b));
            let run = || {
                if let Some(f) = job.lock().ok().and_then(|mut j| j.take()) {
                    f();
                }
            };
            std::thread::scope(|s| {
                let _ = std::thread::Builder::new().spawn_scoped(s, run);
                half_a();
            });
            run();
        }
        let nodes = &self.nodes;
        Ok(start..nodes.len())
    }
}

/// The most entries an arena of the model (arguments, list items, tensors, attributes,
/// strings) holds: they are indexed with 32 bits.
pub const ARENA_MAX: usize = u32::MAX as usize;

/// An arena of the model would pass [`ARENA_MAX`] entries.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("more than {max} {what} in one trace: the model indexes its arenas with 32 bits")]
pub struct ArenaFull {
    /// What the arena holds (`arguments`, `list items`...).
    pub what: &'static str,
    /// Its limit ([`ARENA_MAX`]).
    pub max: usize,
}

/// A map from node id to node position. Observer ids are dense, so a vector indexed by
/// `id - min` serves most traces; sparse ids fall back to a hash map.
#[derive(Clone, Debug)]
pub enum IdIndex {
    /// Ids within a few times the node count of each other: positions by `id - min`.
    Dense {
        /// The least id.
        min: u64,
        /// The position of id `min + k` at `k`; `u32::MAX` where no node has it.
        pos: Vec<u32>,
    },
    /// Keyed by std's random SipHash, not FxHash: ids are the file's to choose, and ids made
    /// to collide under FxHash (`K^-1 * (j << 6)`) would make building this quadratic (20,000
    /// nodes: 3 s, a million: hours).
    Sparse(std::collections::HashMap<u64, usize>),
}

impl IdIndex {
    const NONE: u32 = u32::MAX;

    /// Indexes `ids` by position (the last position of an id that repeats).
    pub fn new(ids: impl Iterator<Item = u64> + Clone) -> IdIndex {
        let n = ids.clone().count();
        let (min, max) = ids
            .clone()
            .fold((u64::MAX, 0), |(a, b), x| (a.min(x), b.max(x)));
        if n > 0 && max - min < (4 * n as u64).max(1024) && n < u32::MAX as usize {
            let mut pos = vec![Self::NONE; (max - min + 1) as usize];
            for (i, id) in ids.enumerate() {
                pos[(id - min) as usize] = i as u32;
            }
            IdIndex::Dense { min, pos }
        } else {
            IdIndex::Sparse(ids.enumerate().map(|(i, id)| (id, i)).collect())
        }
    }

    /// The position of `id`, if any node has it.
    pub fn position(&self, id: u64) -> Option<usize> {
        match self {
            IdIndex::Dense { min, pos } => id
                .checked_sub(*min)
                .and_then(|k| pos.get(k as usize))
                .filter(|&&p| p != Self::NONE)
                .map(|&p| p as usize),
            IdIndex::Sparse(m) => m.get(&id).copied(),
        }
    }

    /// Whether some node has `id`.
    pub fn contains(&self, id: u64) -> bool {
        self.position(id).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Trace {
        let text = br#"{"schema": "1.1.1-chakra.0.0.4", "nodes": [
            {"id": 1, "name": "root", "ctrl_deps": 1, "inputs": {"values": [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]], "shapes": [[]], "types": ["GenericList[Int]"]}, "outputs": {"values": [], "shapes": [], "types": []}}]}"#;
        crate::parse_trace(text, "small", &crate::ParseOptions::default()).unwrap()
    }

    #[test]
    fn absorbing_refuses_arenas_past_their_limit_and_changes_nothing() {
        let mut a = small();
        let before = (a.nodes.len(), a.args.len(), a.items.len(), a.strings.len());
        // Ten list items each (and fewer strings): 15 do not hold both, 20 do.
        let e = a.absorb_within(small(), 15).unwrap_err();
        assert_eq!(e.what, "list items");
        assert!(e.to_string().contains("32 bits"), "{e}");
        assert_eq!(
            (a.nodes.len(), a.args.len(), a.items.len(), a.strings.len()),
            before
        );
        let r = a.absorb_within(small(), 20).unwrap();
        assert_eq!(r, 1..2);
        assert_eq!(a.items.len(), 20);
    }
}
