//! Writing a [`Trace`] back as ET JSON, in the layout it was read from. Reading the output
//! gives back an equal model (tested by property tests).

use crate::model::*;
use std::io::{self, Write};

/// [`write_trace`] into a new buffer.
pub fn write_trace_to_vec(t: &Trace) -> Vec<u8> {
    let mut v = Vec::with_capacity(t.nodes.len() * 512);
    write_trace(t, &mut v).expect("writing to a Vec cannot fail");
    v
}

/// Writes `t` as ET JSON to `w`, in the layout it was read from.
pub fn write_trace<W: Write>(t: &Trace, w: W) -> io::Result<()> {
    let mut w = io::BufWriter::with_capacity(1 << 16, w);
    Writer { t, w: &mut w }.trace()?;
    w.flush()
}

struct Writer<'a, W: Write> {
    t: &'a Trace,
    w: &'a mut W,
}

impl<W: Write> Writer<'_, W> {
    fn s(&mut self, s: &str) -> io::Result<()> {
        serde_json::to_writer(&mut *self.w, s).map_err(io::Error::other)
    }

    fn key(&mut self, k: &str) -> io::Result<()> {
        self.s(k)?;
        self.w.write_all(b": ")
    }

    fn value(&mut self, v: Value) -> io::Result<()> {
        match v {
            Value::Null => self.w.write_all(b"null"),
            Value::Bool(b) => self.w.write_all(if b { b"true" } else { b"false" }),
            Value::Int(i) => write!(self.w, "{i}"),
            Value::UInt(u) => write!(self.w, "{u}"),
            Value::Float(f) => serde_json::to_writer(&mut *self.w, &f).map_err(io::Error::other),
            Value::Str(s) => self.s(self.t.str(s)),
            Value::Raw(s) => self.w.write_all(self.t.str(s).as_bytes()),
            Value::List { .. } => {
                self.w.write_all(b"[")?;
                for (i, &x) in self.t.list(v).iter().enumerate() {
                    if i > 0 {
                        self.w.write_all(b", ")?;
                    }
                    self.value(x)?;
                }
                self.w.write_all(b"]")
            }
            Value::Tensor(i) => {
                let x = *self.t.tensor(i);
                write!(
                    self.w,
                    "[{}, {}, {}, {}, {}",
                    x.id, x.storage, x.offset, x.numel, x.itemsize
                )?;
                if let Some(d) = x.device {
                    self.w.write_all(b", ")?;
                    self.s(self.t.str(d))?;
                }
                self.w.write_all(b"]")
            }
        }
    }

    fn list<I: IntoIterator<Item = Value>>(&mut self, it: I) -> io::Result<()> {
        self.w.write_all(b"[")?;
        for (i, v) in it.into_iter().enumerate() {
            if i > 0 {
                self.w.write_all(b", ")?;
            }
            self.value(v)?;
        }
        self.w.write_all(b"]")
    }

    fn trace(&mut self) -> io::Result<()> {
        let m = &self.t.meta;
        self.w.write_all(b"{\n  ")?;
        self.key("schema")?;
        self.s(&m.schema)?;
        if let Some(p) = m.pid {
            write!(self.w, ", \"pid\": {p}")?;
        }
        if let Some(tm) = &m.time {
            self.w.write_all(b", ")?;
            self.key("time")?;
            self.s(tm)?;
        }
        if let Some(x) = m.start_ts {
            write!(self.w, ", \"start_ts\": {x}")?;
        }
        if let Some(x) = m.finish_ts {
            write!(self.w, ", \"finish_ts\": {x}")?;
        }
        for (k, v) in &m.extra {
            self.w.write_all(b", ")?;
            self.key(k)?;
            self.w.write_all(v.as_bytes())?;
        }
        self.w.write_all(b",\n  \"nodes\": [")?;
        for (i, n) in self.t.nodes.iter().enumerate() {
            self.w
                .write_all(if i == 0 { b"\n    " } else { b",\n    " })?;
            match self.t.layout {
                Layout::Flat => self.flat_node(n)?,
                Layout::Nested => self.nested_node(n)?,
            }
        }
        self.w.write_all(b"\n  ]\n}\n")
    }

    /// Attributes without a type (flat-layout keys) as top-level keys.
    fn untyped_extras(&mut self, n: &Node) -> io::Result<()> {
        let t = self.t;
        for e in t.extras(n).iter().filter(|e| e.ty.is_none()) {
            self.w.write_all(b", ")?;
            self.key(t.str(e.name))?;
            self.value(e.value)?;
        }
        Ok(())
    }

    /// One `{"name", "type", "value"}` entry of an `attrs` list.
    fn attr(&mut self, first: &mut bool, name: &str, ty: &str, v: Value) -> io::Result<()> {
        if !*first {
            self.w.write_all(b", ")?;
        }
        *first = false;
        self.w.write_all(b"{\"name\": ")?;
        self.s(name)?;
        self.w.write_all(b", \"type\": ")?;
        self.s(ty)?;
        self.w.write_all(b", \"value\": ")?;
        self.value(v)?;
        self.w.write_all(b"}")
    }

    fn flat_node(&mut self, n: &Node) -> io::Result<()> {
        let t = self.t;
        self.w.write_all(b"{")?;
        self.key("name")?;
        self.s(t.str(n.name))?;
        write!(self.w, ", \"id\": {}", n.id)?;
        let nums: [(&str, Option<i128>); 7] = [
            ("rf_id", n.rf_id.map(i128::from)),
            ("parent", n.parent.map(i128::from)),
            ("fw_parent", n.fw_parent.map(i128::from)),
            ("seq_id", n.seq_id.map(i128::from)),
            ("scope", n.scope.map(i128::from)),
            ("tid", n.tid.map(i128::from)),
            ("fw_tid", n.fw_tid.map(i128::from)),
        ];
        for (k, v) in nums {
            if let Some(v) = v {
                write!(self.w, ", \"{k}\": {v}")?;
            }
        }
        for (k, v) in [
            ("op_schema", n.op_schema),
            ("kernel_backend", n.kernel_backend),
            ("kernel_file", n.kernel_file),
        ] {
            if let Some(v) = v {
                self.w.write_all(b", ")?;
                self.key(k)?;
                self.s(t.str(v))?;
            }
        }
        for (prefix, args, sflag) in [
            ("input", t.inputs(n), NodeFlags::INPUT_STRIDES),
            ("output", t.outputs(n), NodeFlags::OUTPUT_STRIDES),
        ] {
            write!(self.w, ", \"{prefix}s\": ")?;
            self.list(args.iter().map(|a| a.value))?;
            write!(self.w, ", \"{prefix}_shapes\": ")?;
            self.list(args.iter().map(|a| a.shape))?;
            write!(self.w, ", \"{prefix}_types\": ")?;
            self.list(args.iter().map(|a| Value::Str(a.ty)))?;
            if n.flags.has(sflag) {
                write!(self.w, ", \"{prefix}_strides\": ")?;
                self.list(args.iter().filter_map(|a| a.strides))?;
            }
        }
        self.untyped_extras(n)?;
        // A flat-layout node that also had an `attrs` list keeps its typed attributes there.
        if n.flags.has(NodeFlags::HAS_ATTRS) {
            self.w.write_all(b", \"attrs\": [")?;
            let mut first = true;
            for e in t.extras(n).iter().filter(|e| e.ty.is_some()) {
                self.attr(
                    &mut first,
                    t.str(e.name),
                    t.str(e.ty.unwrap_or(crate::Interner::EMPTY)),
                    e.value,
                )?;
            }
            self.w.write_all(b"]")?;
        }
        self.w.write_all(b"}")
    }

    fn nested_node(&mut self, n: &Node) -> io::Result<()> {
        let t = self.t;
        write!(self.w, "{{\"id\": {}, ", n.id)?;
        self.key("name")?;
        self.s(t.str(n.name))?;
        if let Some(p) = n.parent {
            write!(self.w, ", \"ctrl_deps\": {p}")?;
        }
        for (k, args, sflag) in [
            ("inputs", t.inputs(n), NodeFlags::INPUT_STRIDES),
            ("outputs", t.outputs(n), NodeFlags::OUTPUT_STRIDES),
        ] {
            write!(self.w, ", \"{k}\": {{\"values\": ")?;
            self.list(args.iter().map(|a| a.value))?;
            self.w.write_all(b", \"shapes\": ")?;
            self.list(args.iter().map(|a| a.shape))?;
            self.w.write_all(b", \"types\": ")?;
            self.list(args.iter().map(|a| Value::Str(a.ty)))?;
            if n.flags.has(sflag) {
                self.w.write_all(b", \"strides\": ")?;
                self.list(args.iter().filter_map(|a| a.strides))?;
            }
            self.w.write_all(b"}")?;
        }
        // Flat-layout extras (no type) stay top-level keys.
        self.untyped_extras(n)?;
        if n.flags.has(NodeFlags::HAS_ATTRS) {
            self.w.write_all(b", \"attrs\": [")?;
            let mut first = true;
            let u = |x: u64| i64::try_from(x).map_or(Value::UInt(x), Value::Int);
            for (k, v) in [("rf_id", n.rf_id), ("fw_parent", n.fw_parent)] {
                if let Some(v) = v {
                    self.attr(&mut first, k, "uint64", u(v))?;
                }
            }
            if let Some(v) = n.seq_id {
                self.attr(&mut first, "seq_id", "int64", Value::Int(v))?;
            }
            for (k, v) in [("scope", n.scope), ("tid", n.tid), ("fw_tid", n.fw_tid)] {
                if let Some(v) = v {
                    self.attr(&mut first, k, "uint64", u(v))?;
                }
            }
            for (k, v) in [
                ("op_schema", n.op_schema),
                ("kernel_backend", n.kernel_backend),
                ("kernel_file", n.kernel_file),
            ] {
                if let Some(v) = v {
                    self.attr(&mut first, k, "string", Value::Str(v))?;
                }
            }
            for e in t.extras(n) {
                if let Some(ty) = e.ty {
                    self.attr(&mut first, t.str(e.name), t.str(ty), e.value)?;
                }
            }
            self.w.write_all(b"]")?;
        }
        self.w.write_all(b"}")
    }
}
