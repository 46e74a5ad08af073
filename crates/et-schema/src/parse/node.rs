//! The per-thread parse state ([`Builder`]) and the fields of the node record being read
//! ([`NodeAcc`]): both readers fill the accumulator, and a finished record becomes a [`Node`]
//! in the builder's arenas, its values typed by the record's type strings.

use crate::intern::{Interner, Sym};
use crate::model::{Arg, ExtraAttr, Layout, Node, NodeFlags, TensorRef, Trace, Value, ARENA_MAX};
use crate::types::ValueType;
use rustc_hash::FxHashMap;
use std::sync::Arc as Rc;

#[derive(Default)]
pub(super) struct Builder {
    pub(super) strings: Interner,
    pub(super) nodes: Vec<Node>,
    pub(super) args: Vec<Arg>,
    pub(super) items: Vec<Value>,
    pub(super) tensors: Vec<TensorRef>,
    pub(super) extra: Vec<ExtraAttr>,
    pub(super) layout: Option<Layout>,
    /// Raw (untyped) values of the node being parsed; converted with the types at node end.
    pub(super) raw: Vec<Value>,
    pub(super) stack: Vec<Value>,
    pub(super) types: FxHashMap<Sym, Option<Rc<ValueType>>>,
}

/// The values, shapes, type strings and strides of a record's `inputs` or `outputs`.
#[derive(Default)]
pub(super) struct IoAcc {
    pub(super) values: Vec<Value>,
    pub(super) shapes: Vec<Value>,
    pub(super) types: Vec<Sym>,
    pub(super) strides: Option<Vec<Value>>,
}

impl IoAcc {
    pub(super) fn clear(&mut self) {
        self.values.clear();
        self.shapes.clear();
        self.types.clear();
        self.strides = None;
    }
}

/// The key of a node record whose value is being read, for errors.
#[derive(Clone, Copy, Default)]
pub(super) enum FieldName {
    #[default]
    None,
    Known(&'static str),
    Other(Sym),
}

/// The fields of the node record being read, filled by either reader and turned into a
/// [`Node`] by [`Builder::finish_node`]; `field` names the key being read, for errors.
#[derive(Default)]
pub(super) struct NodeAcc {
    pub(super) field: FieldName,
    pub(super) id: Option<u64>,
    pub(super) name: Option<Sym>,
    pub(super) parent: Option<u64>,
    pub(super) rf_id: Option<u64>,
    pub(super) fw_parent: Option<u64>,
    pub(super) seq_id: Option<i64>,
    pub(super) scope: Option<u64>,
    pub(super) tid: Option<u64>,
    pub(super) fw_tid: Option<u64>,
    pub(super) op_schema: Option<Sym>,
    pub(super) kernel_backend: Option<Sym>,
    pub(super) kernel_file: Option<Sym>,
    pub(super) inputs: IoAcc,
    pub(super) outputs: IoAcc,
    pub(super) extra: Vec<ExtraAttr>,
    pub(super) has_attrs: bool,
    pub(super) layout: Option<Layout>,
}

impl NodeAcc {
    pub(super) fn clear(&mut self) {
        let (mut i, mut o, mut e) = (
            std::mem::take(&mut self.inputs),
            std::mem::take(&mut self.outputs),
            std::mem::take(&mut self.extra),
        );
        i.clear();
        o.clear();
        e.clear();
        *self = NodeAcc {
            inputs: i,
            outputs: o,
            extra: e,
            ..Default::default()
        };
    }
}

impl Builder {
    fn type_of(&mut self, ty: Sym) -> Option<Rc<ValueType>> {
        if let Some(t) = self.types.get(&ty) {
            return t.clone();
        }
        let s = self.strings.get(ty);
        let parsed = if s.contains("Tensor") {
            ValueType::parse(s).ok().map(Rc::new)
        } else {
            None
        };
        self.types.insert(ty, parsed.clone());
        parsed
    }

    /// Copies a raw value into the arenas, decoding tensor tuples where the type says so.
    fn convert(&mut self, v: Value, ty: Option<&ValueType>) -> Value {
        let Value::List { start, len } = v else {
            return v;
        };
        let items = start as usize..(start + len) as usize;
        if let Some(ValueType::Tensor { .. } | ValueType::UndefinedTensor) = ty {
            if let Some(t) = self.tensor_tuple(&self.raw[items.clone()]) {
                self.tensors.push(t);
                return Value::Tensor(self.tensors.len() as u32 - 1);
            }
        }
        let elems: &[ValueType] = match ty {
            Some(ValueType::List(e) | ValueType::Tuple(e)) => e,
            _ => &[],
        };
        let base = self.stack.len();
        for (k, i) in items.enumerate() {
            let x = self.raw[i];
            let c = self.convert(x, elems.get(k));
            self.stack.push(c);
        }
        let start = self.items.len() as u32;
        self.items.extend(self.stack.drain(base..));
        Value::List { start, len }
    }

    fn tensor_tuple(&self, f: &[Value]) -> Option<TensorRef> {
        let int = |v: &Value| match *v {
            Value::Int(i) if i >= 0 => Some(i as u64),
            Value::UInt(u) => Some(u),
            _ => None,
        };
        if f.len() != 5 && f.len() != 6 {
            return None;
        }
        let device = match f.get(5) {
            Some(Value::Str(s)) => Some(*s),
            Some(_) => return None,
            None => None,
        };
        Some(TensorRef {
            id: int(&f[0])?,
            storage: int(&f[1])?,
            offset: int(&f[2])?,
            numel: int(&f[3])?,
            itemsize: int(&f[4])?,
            device,
        })
    }

    fn push_args(&mut self, io: &IoAcc) -> std::ops::Range<u32> {
        let start = self.args.len() as u32;
        for (k, &v) in io.values.iter().enumerate() {
            let ty = io.types.get(k).copied().unwrap_or(Interner::EMPTY);
            let parsed = self.type_of(ty);
            let value = self.convert(v, parsed.as_deref());
            let shape = io
                .shapes
                .get(k)
                .map_or(Value::List { start: 0, len: 0 }, |&s| self.convert(s, None));
            let strides = io
                .strides
                .as_ref()
                .and_then(|s| s.get(k))
                .map(|&s| self.convert(s, None));
            self.args.push(Arg {
                value,
                shape,
                ty,
                strides,
            });
        }
        start..self.args.len() as u32
    }

    pub(super) fn finish_node(&mut self, acc: &mut NodeAcc, offset: u64) -> Result<(), String> {
        let id = acc.id.ok_or("node has no \"id\"")?;
        for (what, io) in [("inputs", &acc.inputs), ("outputs", &acc.outputs)] {
            if io.types.len() != io.values.len() {
                return Err(format!(
                    "{what}: {} values but {} types",
                    io.values.len(),
                    io.types.len()
                ));
            }
            if !io.shapes.is_empty() && io.shapes.len() != io.values.len() {
                return Err(format!(
                    "{what}: {} values but {} shapes",
                    io.values.len(),
                    io.shapes.len()
                ));
            }
        }
        // The arenas are indexed with 32 bits: each node's values must fit in what is left
        // (every raw value lands in at most one of them).
        let fits = |len: usize, add: usize| len.checked_add(add).is_some_and(|n| n <= ARENA_MAX);
        let values = acc.inputs.values.len() + acc.outputs.values.len();
        for (what, len, add) in [
            ("arguments", self.args.len(), values),
            ("list items", self.items.len(), self.raw.len()),
            ("tensors", self.tensors.len(), self.raw.len()),
            ("attributes", self.extra.len(), acc.extra.len()),
        ] {
            if !fits(len, add) {
                return Err(format!(
                    "more than {ARENA_MAX} {what} in one trace: the model indexes its arenas with 32 bits"
                ));
            }
        }
        if let Some(l) = acc.layout {
            self.layout.get_or_insert(l);
        }
        let inputs = self.push_args(&acc.inputs);
        let outputs = self.push_args(&acc.outputs);
        let estart = self.extra.len() as u32;
        for e in acc.extra.drain(..) {
            let value = self.convert(e.value, None);
            self.extra.push(ExtraAttr { value, ..e });
        }
        let mut flags = 0;
        if acc.inputs.strides.is_some() {
            flags |= NodeFlags::INPUT_STRIDES;
        }
        if acc.outputs.strides.is_some() {
            flags |= NodeFlags::OUTPUT_STRIDES;
        }
        if acc.has_attrs {
            flags |= NodeFlags::HAS_ATTRS;
        }
        self.nodes.push(Node {
            id,
            name: acc.name.unwrap_or(Interner::EMPTY),
            parent: acc.parent,
            rf_id: acc.rf_id,
            fw_parent: acc.fw_parent,
            seq_id: acc.seq_id,
            scope: acc.scope,
            tid: acc.tid,
            fw_tid: acc.fw_tid,
            op_schema: acc.op_schema,
            kernel_backend: acc.kernel_backend,
            kernel_file: acc.kernel_file,
            inputs,
            outputs,
            extra: estart..self.extra.len() as u32,
            flags: NodeFlags(flags),
            offset,
        });
        Ok(())
    }

    pub(super) fn into_trace(self) -> Trace {
        Trace {
            strings: self.strings,
            nodes: self.nodes,
            args: self.args,
            items: self.items,
            tensors: self.tensors,
            extra_attrs: self.extra,
            layout: self.layout.unwrap_or_default(),
            ..Trace::default()
        }
    }
}
