//! The serde visitors that read a node record into a [`NodeAcc`]: the general reader, run when
//! the specialised one ([`super::fast`]) gives up, and so the one whose errors users see.

use super::node::{Builder, FieldName, IoAcc, NodeAcc};
use crate::intern::{Interner, Sym};
use crate::model::{ExtraAttr, Layout, Value, ARENA_MAX};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// A raw JSON value into the node-local arena.
struct RawSeed<'a> {
    strings: &'a mut Interner,
    raw: &'a mut Vec<Value>,
    stack: &'a mut Vec<Value>,
}

impl<'de> DeserializeSeed<'de> for RawSeed<'_> {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for RawSeed<'_> {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> std::result::Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> std::result::Result<Value, E> {
        Ok(Value::Int(v))
    }
    fn visit_u64<E>(self, v: u64) -> std::result::Result<Value, E> {
        Ok(i64::try_from(v).map_or(Value::UInt(v), Value::Int))
    }
    fn visit_f64<E>(self, v: f64) -> std::result::Result<Value, E> {
        Ok(Value::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> std::result::Result<Value, E> {
        Ok(Value::Str(self.strings.intern(v)))
    }
    fn visit_unit<E>(self) -> std::result::Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> std::result::Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Value, A::Error> {
        let base = self.stack.len();
        while let Some(v) = seq.next_element_seed(RawSeed {
            strings: self.strings,
            raw: self.raw,
            stack: self.stack,
        })? {
            self.stack.push(v);
        }
        if self.raw.len() + (self.stack.len() - base) > ARENA_MAX {
            return Err(de::Error::custom(format!(
                "more than {ARENA_MAX} values in one node record"
            )));
        }
        let start = self.raw.len() as u32;
        let len = (self.stack.len() - base) as u32;
        self.raw.extend(self.stack.drain(base..));
        Ok(Value::List { start, len })
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> std::result::Result<Value, A::Error> {
        let v: serde_json::Value =
            serde::Deserialize::deserialize(de::value::MapAccessDeserializer::new(map))?;
        Ok(Value::Raw(self.strings.intern(&v.to_string())))
    }
}

/// A sequence of raw values appended to `out`.
struct RawListSeed<'a> {
    strings: &'a mut Interner,
    raw: &'a mut Vec<Value>,
    stack: &'a mut Vec<Value>,
    out: &'a mut Vec<Value>,
}

impl<'de> DeserializeSeed<'de> for RawListSeed<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for RawListSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<(), A::Error> {
        while let Some(v) = seq.next_element_seed(RawSeed {
            strings: self.strings,
            raw: self.raw,
            stack: self.stack,
        })? {
            self.out.push(v);
        }
        Ok(())
    }
}

/// A list of strings (type strings) interned into `out`.
struct SymListSeed<'a> {
    strings: &'a mut Interner,
    out: &'a mut Vec<Sym>,
}

impl<'de> DeserializeSeed<'de> for SymListSeed<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for SymListSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of type strings")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<(), A::Error> {
        while let Some(s) = seq.next_element_seed(SymSeed {
            strings: self.strings,
        })? {
            self.out.push(s);
        }
        Ok(())
    }
}

/// A map key matched against a fixed list without interning; unknown keys give `None`.
struct NameSeed(&'static [&'static str]);

impl<'de> DeserializeSeed<'de> for NameSeed {
    type Value = Option<usize>;
    fn deserialize<D: Deserializer<'de>>(
        self,
        d: D,
    ) -> std::result::Result<Option<usize>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for NameSeed {
    type Value = Option<usize>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E>(self, v: &str) -> std::result::Result<Option<usize>, E> {
        Ok(self.0.iter().position(|k| *k == v))
    }
}

struct SymSeed<'a> {
    strings: &'a mut Interner,
}

impl<'de> DeserializeSeed<'de> for SymSeed<'_> {
    type Value = Sym;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Sym, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for SymSeed<'_> {
    type Value = Sym;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_str<E>(self, v: &str) -> std::result::Result<Sym, E> {
        Ok(self.strings.intern(v))
    }
}

#[derive(Clone, Copy)]
pub(super) enum Field {
    Id,
    Name,
    CtrlDeps,
    Parent,
    RfId,
    FwParent,
    SeqId,
    Scope,
    Tid,
    FwTid,
    OpSchema,
    KernelBackend,
    KernelFile,
    Inputs,
    Outputs,
    InputShapes,
    InputTypes,
    InputStrides,
    OutputShapes,
    OutputTypes,
    OutputStrides,
    Attrs,
    Other,
}

/// The key of a known field (the inverse of [`field`]).
pub(super) fn field_name(f: Field) -> &'static str {
    match f {
        Field::Id => "id",
        Field::Name => "name",
        Field::CtrlDeps => "ctrl_deps",
        Field::Parent => "parent",
        Field::RfId => "rf_id",
        Field::FwParent => "fw_parent",
        Field::SeqId => "seq_id",
        Field::Scope => "scope",
        Field::Tid => "tid",
        Field::FwTid => "fw_tid",
        Field::OpSchema => "op_schema",
        Field::KernelBackend => "kernel_backend",
        Field::KernelFile => "kernel_file",
        Field::Inputs => "inputs",
        Field::Outputs => "outputs",
        Field::InputShapes => "input_shapes",
        Field::InputTypes => "input_types",
        Field::InputStrides => "input_strides",
        Field::OutputShapes => "output_shapes",
        Field::OutputTypes => "output_types",
        Field::OutputStrides => "output_strides",
        Field::Attrs => "attrs",
        Field::Other => "",
    }
}

pub(super) fn field(s: &str) -> Field {
    match s {
        "id" => Field::Id,
        "name" => Field::Name,
        "ctrl_deps" => Field::CtrlDeps,
        "parent" => Field::Parent,
        "rf_id" => Field::RfId,
        "fw_parent" => Field::FwParent,
        "seq_id" => Field::SeqId,
        "scope" => Field::Scope,
        "tid" => Field::Tid,
        "fw_tid" => Field::FwTid,
        "op_schema" => Field::OpSchema,
        "kernel_backend" => Field::KernelBackend,
        "kernel_file" => Field::KernelFile,
        "inputs" => Field::Inputs,
        "outputs" => Field::Outputs,
        "input_shapes" => Field::InputShapes,
        "input_types" => Field::InputTypes,
        "input_strides" => Field::InputStrides,
        "output_shapes" => Field::OutputShapes,
        "output_types" => Field::OutputTypes,
        "output_strides" => Field::OutputStrides,
        "attrs" => Field::Attrs,
        _ => Field::Other,
    }
}

/// A map key: borrowed when the input allows, and its field.
struct KeySeed<'a> {
    strings: &'a mut Interner,
}

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = (Field, Sym);
    fn deserialize<D: Deserializer<'de>>(
        self,
        d: D,
    ) -> std::result::Result<(Field, Sym), D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_> {
    type Value = (Field, Sym);
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E>(self, v: &str) -> std::result::Result<(Field, Sym), E> {
        let f = field(v);
        // Only unknown keys need their name kept.
        let sym = if matches!(f, Field::Other) {
            self.strings.intern(v)
        } else {
            Interner::EMPTY
        };
        Ok((f, sym))
    }
}

pub(super) struct NodeSeed<'a> {
    pub(super) b: &'a mut Builder,
    pub(super) acc: &'a mut NodeAcc,
}

impl<'de> DeserializeSeed<'de> for NodeSeed<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

/// Stores a node record's integer field `f` (one of the ids, `seq_id`, `scope`, `tid`...);
/// the error says what the value must be.
pub(super) fn store_scalar(
    acc: &mut NodeAcc,
    f: Field,
    v: Value,
) -> std::result::Result<(), String> {
    if let Field::SeqId = f {
        return match v {
            Value::Int(i) => {
                acc.seq_id = Some(i);
                Ok(())
            }
            _ => Err("\"seq_id\" must be an integer".into()),
        };
    }
    let slot = match f {
        Field::Id => &mut acc.id,
        Field::Parent => {
            acc.layout.get_or_insert(Layout::Flat);
            &mut acc.parent
        }
        Field::CtrlDeps => {
            acc.layout.get_or_insert(Layout::Nested);
            &mut acc.parent
        }
        Field::RfId => &mut acc.rf_id,
        Field::FwParent => &mut acc.fw_parent,
        Field::Scope => &mut acc.scope,
        Field::Tid => &mut acc.tid,
        Field::FwTid => &mut acc.fw_tid,
        _ => return Err(format!("\"{}\" is not an integer field", field_name(f))),
    };
    *slot = Some(match v {
        Value::Int(i) if i >= 0 => i as u64,
        Value::UInt(u) => u,
        _ => {
            return Err(format!(
                "\"{}\" must be a non-negative integer",
                field_name(f)
            ))
        }
    });
    Ok(())
}

impl<'de> Visitor<'de> for NodeSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a node object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<(), A::Error> {
        let NodeSeed { b, acc } = self;
        while let Some((f, key)) = map.next_key_seed(KeySeed {
            strings: &mut b.strings,
        })? {
            acc.field = match f {
                Field::Other => FieldName::Other(key),
                known => FieldName::Known(field_name(known)),
            };
            let Builder {
                strings,
                raw,
                stack,
                ..
            } = &mut *b;
            macro_rules! raw_value {
                () => {
                    map.next_value_seed(RawSeed {
                        strings,
                        raw,
                        stack,
                    })?
                };
            }
            match f {
                Field::Name => acc.name = Some(map.next_value_seed(SymSeed { strings })?),
                Field::OpSchema => acc.op_schema = Some(map.next_value_seed(SymSeed { strings })?),
                Field::KernelBackend => {
                    acc.kernel_backend = Some(map.next_value_seed(SymSeed { strings })?)
                }
                Field::KernelFile => {
                    acc.kernel_file = Some(map.next_value_seed(SymSeed { strings })?)
                }
                Field::Inputs | Field::Outputs => {
                    let io = if matches!(f, Field::Inputs) {
                        &mut acc.inputs
                    } else {
                        &mut acc.outputs
                    };
                    let layout = map.next_value_seed(IoSeed {
                        strings,
                        raw,
                        stack,
                        io,
                    })?;
                    acc.layout.get_or_insert(layout);
                }
                Field::InputShapes => map.next_value_seed(RawListSeed {
                    strings,
                    raw,
                    stack,
                    out: &mut acc.inputs.shapes,
                })?,
                Field::OutputShapes => map.next_value_seed(RawListSeed {
                    strings,
                    raw,
                    stack,
                    out: &mut acc.outputs.shapes,
                })?,
                Field::InputTypes => map.next_value_seed(SymListSeed {
                    strings,
                    out: &mut acc.inputs.types,
                })?,
                Field::OutputTypes => map.next_value_seed(SymListSeed {
                    strings,
                    out: &mut acc.outputs.types,
                })?,
                Field::InputStrides => map.next_value_seed(RawListSeed {
                    strings,
                    raw,
                    stack,
                    out: acc.inputs.strides.get_or_insert_with(Vec::new),
                })?,
                Field::OutputStrides => map.next_value_seed(RawListSeed {
                    strings,
                    raw,
                    stack,
                    out: acc.outputs.strides.get_or_insert_with(Vec::new),
                })?,
                Field::Attrs => {
                    acc.has_attrs = true;
                    acc.layout.get_or_insert(Layout::Nested);
                    map.next_value_seed(AttrsSeed {
                        strings,
                        raw,
                        stack,
                        acc,
                    })?
                }
                Field::Other => {
                    let value = raw_value!();
                    acc.extra.push(ExtraAttr {
                        name: key,
                        ty: None,
                        value,
                    });
                }
                // The integer fields (id, parent, rf_id, seq_id...); store_scalar refuses any other.
                f => store_scalar(acc, f, raw_value!()).map_err(de::Error::custom)?,
            }
            acc.field = FieldName::None;
        }
        Ok(())
    }
}

/// `inputs`/`outputs`: a list (flat layout) or `{values, shapes, types, strides}` (nested).
struct IoSeed<'a> {
    strings: &'a mut Interner,
    raw: &'a mut Vec<Value>,
    stack: &'a mut Vec<Value>,
    io: &'a mut IoAcc,
}

impl<'de> DeserializeSeed<'de> for IoSeed<'_> {
    type Value = Layout;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Layout, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for IoSeed<'_> {
    type Value = Layout;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of values or an object {values, shapes, types}")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> std::result::Result<Layout, A::Error> {
        RawListSeed {
            strings: self.strings,
            raw: self.raw,
            stack: self.stack,
            out: &mut self.io.values,
        }
        .visit_seq(seq)?;
        Ok(Layout::Flat)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Layout, A::Error> {
        let IoSeed {
            strings,
            raw,
            stack,
            io,
        } = self;
        while let Some(key) =
            map.next_key_seed(NameSeed(&["values", "shapes", "types", "strides"]))?
        {
            match key {
                Some(0) => map.next_value_seed(RawListSeed {
                    strings,
                    raw,
                    stack,
                    out: &mut io.values,
                })?,
                Some(1) => map.next_value_seed(RawListSeed {
                    strings,
                    raw,
                    stack,
                    out: &mut io.shapes,
                })?,
                Some(2) => map.next_value_seed(SymListSeed {
                    strings,
                    out: &mut io.types,
                })?,
                Some(3) => map.next_value_seed(RawListSeed {
                    strings,
                    raw,
                    stack,
                    out: io.strides.get_or_insert_with(Vec::new),
                })?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Layout::Nested)
    }
}

/// The nested layout's `attrs: [{name, type, value}]`.
struct AttrsSeed<'a> {
    strings: &'a mut Interner,
    raw: &'a mut Vec<Value>,
    stack: &'a mut Vec<Value>,
    acc: &'a mut NodeAcc,
}

impl<'de> DeserializeSeed<'de> for AttrsSeed<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for AttrsSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of {name, type, value} attributes")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<(), A::Error> {
        let AttrsSeed {
            strings,
            raw,
            stack,
            acc,
        } = self;
        while let Some(a) = seq.next_element_seed(AttrSeed {
            strings,
            raw,
            stack,
        })? {
            store_attr(acc, strings, a);
        }
        Ok(())
    }
}

/// Puts one `{name, type, value}` attribute where it belongs: known attributes go to fields
/// when their value has the expected kind; anything else is kept verbatim so that nothing is
/// lost.
pub(super) fn store_attr(acc: &mut NodeAcc, strings: &mut Interner, a: RawAttr) {
    // Indices into ATTR_WORDS: the names and types the observer writes on every node.
    const UINT64: u8 = 9;
    const INT64: u8 = 10;
    const STRING: u8 = 11;
    let stored = match (a.name, a.ty, a.value) {
        (Word::Known(n @ (0 | 1 | 3 | 4 | 5)), Word::Known(UINT64), v) => {
            let slot = match n {
                0 => &mut acc.rf_id,
                1 => &mut acc.fw_parent,
                3 => &mut acc.scope,
                4 => &mut acc.tid,
                _ => &mut acc.fw_tid,
            };
            let v = match v {
                Value::Int(i) if i >= 0 => Some(i as u64),
                Value::UInt(u) => Some(u),
                _ => None,
            };
            v.is_some() && slot.is_none() && {
                *slot = v;
                true
            }
        }
        (Word::Known(n @ 6..=8), Word::Known(STRING), Value::Str(v)) => {
            let slot = match n {
                6 => &mut acc.op_schema,
                7 => &mut acc.kernel_backend,
                _ => &mut acc.kernel_file,
            };
            slot.is_none() && {
                *slot = Some(v);
                true
            }
        }
        (Word::Known(2), Word::Known(INT64), Value::Int(i)) if acc.seq_id.is_none() => {
            acc.seq_id = Some(i);
            true
        }
        _ => false,
    };
    if !stored {
        let (name, ty) = (a.name.sym(strings), a.ty.sym(strings));
        acc.extra.push(ExtraAttr {
            name,
            ty: Some(ty),
            value: a.value,
        });
    }
}

struct AttrSeed<'a> {
    strings: &'a mut Interner,
    raw: &'a mut Vec<Value>,
    stack: &'a mut Vec<Value>,
}

pub(super) struct RawAttr {
    pub(super) name: Word,
    pub(super) ty: Word,
    pub(super) value: Value,
}

/// Attribute names and types the observer writes on every node: matched without interning.
pub(super) const ATTR_WORDS: &[&str] = &[
    "rf_id",
    "fw_parent",
    "seq_id",
    "scope",
    "tid",
    "fw_tid",
    "op_schema",
    "kernel_backend",
    "kernel_file",
    "uint64",
    "int64",
    "string",
    "tensor_range",
];

/// A string that is one of [`ATTR_WORDS`] or else interned.
#[derive(Clone, Copy)]
pub(super) enum Word {
    Known(u8),
    Other(Sym),
}

impl Word {
    /// `s` as one of [`ATTR_WORDS`], or interned.
    #[inline]
    pub(super) fn of(s: &str, strings: &mut Interner) -> Word {
        let known = match s {
            "rf_id" => 0,
            "fw_parent" => 1,
            "seq_id" => 2,
            "scope" => 3,
            "tid" => 4,
            "fw_tid" => 5,
            "op_schema" => 6,
            "kernel_backend" => 7,
            "kernel_file" => 8,
            "uint64" => 9,
            "int64" => 10,
            "string" => 11,
            "tensor_range" => 12,
            _ => return Word::Other(strings.intern(s)),
        };
        debug_assert_eq!(ATTR_WORDS[known as usize], s);
        Word::Known(known)
    }
    pub(super) fn sym(&self, strings: &mut Interner) -> Sym {
        match *self {
            Word::Known(i) => strings.intern(ATTR_WORDS[i as usize]),
            Word::Other(s) => s,
        }
    }
}

struct WordSeed<'a> {
    strings: &'a mut Interner,
}

impl<'de> DeserializeSeed<'de> for WordSeed<'_> {
    type Value = Word;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Word, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for WordSeed<'_> {
    type Value = Word;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_str<E>(self, v: &str) -> std::result::Result<Word, E> {
        Ok(Word::of(v, self.strings))
    }
}

impl<'de> DeserializeSeed<'de> for AttrSeed<'_> {
    type Value = RawAttr;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<RawAttr, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for AttrSeed<'_> {
    type Value = RawAttr;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an attribute {name, type, value}")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<RawAttr, A::Error> {
        let AttrSeed {
            strings,
            raw,
            stack,
        } = self;
        let (mut name, mut ty, mut value) = (None, None, None);
        while let Some(key) = map.next_key_seed(NameSeed(&["name", "type", "value"]))? {
            match key {
                Some(0) => name = Some(map.next_value_seed(WordSeed { strings })?),
                Some(1) => ty = Some(map.next_value_seed(WordSeed { strings })?),
                Some(2) => {
                    value = Some(map.next_value_seed(RawSeed {
                        strings,
                        raw,
                        stack,
                    })?)
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(RawAttr {
            name: name.ok_or_else(|| de::Error::custom("attribute without \"name\""))?,
            ty: ty.unwrap_or(Word::Other(Interner::EMPTY)),
            value: value.unwrap_or(Value::Null),
        })
    }
}
