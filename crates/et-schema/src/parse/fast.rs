//! A node-record parser specialised to the observer's output, tried before the serde_json
//! visitors on every record.
//!
//! Why: serde_json's generic machinery (UTF-8 checks per string, escape handling, visitor dispatch
//! per value) runs at ~250 MB/s per thread on real traces, and would be the parser's whole cost.
//! simd-json per record is no faster (`cargo xtask bench parse` measures both): records are ~1 KB,
//! too small for its tape to pay off, and a whole-file tape costs several times the file in memory.
//! This parser reads the shapes the observer writes, byte by byte, into the same [`Builder`] and
//! [`NodeAcc`] as the visitors.
//!
//! The invariant: whatever this parser accepts, the visitors accept and turn into the same
//! node. Anything it is unsure of (an object where ET has none, an unknown key inside `inputs`
//! or an attribute, a lone surrogate, nesting past [`FAST_DEPTH`], a number out of range, any
//! syntax error) makes it give up with [`Fail`], and the caller parses the record again with
//! the visitors, which also write the precise error. So every error message comes from one
//! place. The fuzz targets `parse_trace` and `parse_node` check the invariant, and a test
//! checks that the reader itself reads every record of every shared trace.

use super::node::{Builder, IoAcc, NodeAcc};
use super::seeds::{field, store_attr, store_scalar, Field, RawAttr, Word};
use crate::intern::{Interner, Sym};
use crate::model::Layout;
use crate::model::{ExtraAttr, Value};

/// This parser could not (or would not) read the record: parse it with the visitors.
#[derive(Debug)]
pub(super) struct Fail;

type R<T> = Result<T, Fail>;

/// Nesting this parser follows before handing over to the visitors: below serde_json's limit
/// ([`crate::MAX_NESTING`]), so that nothing accepted here is refused there. Real records nest
/// 4-6 levels.
const FAST_DEPTH: u32 = 64;

/// Parses the node record that starts at `bytes[i]` (after any whitespace) into `acc` and the
/// builder's string and raw arenas. Returns the index after the record's closing `}`.
pub(super) fn node(
    bytes: &[u8],
    i: usize,
    b: &mut Builder,
    acc: &mut NodeAcc,
    scratch: &mut Vec<u8>,
) -> R<usize> {
    let mut lx = Lex {
        b: bytes,
        i,
        depth: 1,
        scratch,
    };
    lx.ws();
    lx.eat(b'{')?;
    lx.ws();
    if lx.peek() == Some(b'}') {
        return Ok(lx.i + 1);
    }
    loop {
        lx.ws();
        let f = {
            let key = lx.string()?;
            let f = field(key);
            if let Field::Other = f {
                let sym = b.strings.intern(key);
                (f, sym)
            } else {
                (f, Interner::EMPTY)
            }
        };
        lx.ws();
        lx.eat(b':')?;
        lx.ws();
        let Builder {
            strings,
            raw,
            stack,
            ..
        } = &mut *b;
        match f.0 {
            Field::Name => acc.name = Some(lx.sym(strings)?),
            Field::OpSchema => acc.op_schema = Some(lx.sym(strings)?),
            Field::KernelBackend => acc.kernel_backend = Some(lx.sym(strings)?),
            Field::KernelFile => acc.kernel_file = Some(lx.sym(strings)?),
            Field::Inputs | Field::Outputs => {
                let io = if matches!(f.0, Field::Inputs) {
                    &mut acc.inputs
                } else {
                    &mut acc.outputs
                };
                let layout = lx.io(strings, raw, stack, io)?;
                acc.layout.get_or_insert(layout);
            }
            Field::InputShapes => lx.list(strings, raw, stack, &mut acc.inputs.shapes)?,
            Field::OutputShapes => lx.list(strings, raw, stack, &mut acc.outputs.shapes)?,
            Field::InputTypes => lx.syms(strings, &mut acc.inputs.types)?,
            Field::OutputTypes => lx.syms(strings, &mut acc.outputs.types)?,
            Field::InputStrides => lx.list(
                strings,
                raw,
                stack,
                acc.inputs.strides.get_or_insert_with(Vec::new),
            )?,
            Field::OutputStrides => lx.list(
                strings,
                raw,
                stack,
                acc.outputs.strides.get_or_insert_with(Vec::new),
            )?,
            Field::Attrs => {
                acc.has_attrs = true;
                acc.layout.get_or_insert(Layout::Nested);
                lx.attrs(strings, raw, stack, acc)?;
            }
            Field::Other => {
                let value = lx.value(strings, raw, stack)?;
                acc.extra.push(ExtraAttr {
                    name: f.1,
                    ty: None,
                    value,
                });
            }
            // The integer fields (id, parent, rf_id, seq_id...); store_scalar refuses any other.
            f0 => {
                let v = lx.value(strings, raw, stack)?;
                store_scalar(acc, f0, v).map_err(|_| Fail)?;
            }
        }
        lx.ws();
        match lx.next()? {
            b',' => {}
            b'}' => return Ok(lx.i),
            _ => return Err(Fail),
        }
    }
}

struct Lex<'a, 's> {
    b: &'a [u8],
    i: usize,
    depth: u32,
    /// Unescaped strings.
    scratch: &'s mut Vec<u8>,
}

impl<'a> Lex<'a, '_> {
    #[inline]
    fn ws(&mut self) {
        while let Some(&c) = self.b.get(self.i) {
            if !matches!(c, b' ' | b'\n' | b'\r' | b'\t') {
                break;
            }
            self.i += 1;
        }
    }

    #[inline]
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    #[inline]
    fn next(&mut self) -> R<u8> {
        let c = *self.b.get(self.i).ok_or(Fail)?;
        self.i += 1;
        Ok(c)
    }

    #[inline]
    fn eat(&mut self, c: u8) -> R<()> {
        if self.peek() == Some(c) {
            self.i += 1;
            Ok(())
        } else {
            Err(Fail)
        }
    }

    fn enter(&mut self) -> R<()> {
        self.depth += 1;
        if self.depth > FAST_DEPTH {
            return Err(Fail);
        }
        Ok(())
    }

    /// A JSON string at `self.i`, unescaped: borrowed from the input unless it has escapes.
    #[inline]
    fn string(&mut self) -> R<&str> {
        self.eat(b'"')?;
        let b = self.b;
        let start = self.i;
        let mut j = start;
        let mut high = 0u8;
        // Eight bytes at a time while none is a quote, a backslash, a control character or
        // non-ASCII (SWAR: each test sets a byte's top bit where it matches).
        const ONES: u64 = 0x0101_0101_0101_0101;
        const TOPS: u64 = 0x8080_8080_8080_8080;
        while let Some(w) = b.get(j..j + 8) {
            let w = u64::from_le_bytes(w.try_into().unwrap_or([0; 8]));
            let zero = |x: u64| x.wrapping_sub(ONES) & !x & TOPS;
            let special = zero(w ^ (ONES * b'"' as u64))
                | zero(w ^ (ONES * b'\\' as u64))
                | (w.wrapping_sub(ONES * 0x20) & !w & TOPS)
                | (w & TOPS);
            if special != 0 {
                break;
            }
            j += 8;
        }
        loop {
            let c = *b.get(j).ok_or(Fail)?;
            match c {
                b'"' => {
                    self.i = j + 1;
                    let s = &b[start..j];
                    if high < 0x80 {
                        // SAFETY: every byte is below 0x80, so the slice is ASCII, which is
                        // valid UTF-8. (Names and type strings are; this skips a second pass.)
                        return Ok(unsafe { std::str::from_utf8_unchecked(s) });
                    }
                    return std::str::from_utf8(s).map_err(|_| Fail);
                }
                b'\\' => return self.escaped(start, j),
                0..=0x1f => return Err(Fail),
                _ => high |= c,
            }
            j += 1;
        }
    }

    /// The rest of a string from `j`, the first backslash, into `scratch`.
    #[cold]
    fn escaped(&mut self, start: usize, mut j: usize) -> R<&str> {
        let b = self.b;
        self.scratch.clear();
        self.scratch.extend_from_slice(&b[start..j]);
        loop {
            let c = *b.get(j).ok_or(Fail)?;
            j += 1;
            match c {
                b'"' => break,
                b'\\' => {
                    let e = *b.get(j).ok_or(Fail)?;
                    j += 1;
                    let ch = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let hi = hex4(b, j)?;
                            j += 4;
                            let code = if (0xD800..0xDC00).contains(&hi) {
                                if b.get(j..j + 2) != Some(b"\\u") {
                                    return Err(Fail);
                                }
                                let lo = hex4(b, j + 2)?;
                                j += 6;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return Err(Fail);
                                }
                                0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                            } else {
                                hi
                            };
                            char::from_u32(code).ok_or(Fail)?
                        }
                        _ => return Err(Fail),
                    };
                    let mut buf = [0u8; 4];
                    self.scratch
                        .extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                }
                0..=0x1f => return Err(Fail),
                _ => self.scratch.push(c),
            }
        }
        self.i = j;
        std::str::from_utf8(self.scratch).map_err(|_| Fail)
    }

    fn sym(&mut self, strings: &mut Interner) -> R<Sym> {
        let s = self.string()?;
        Ok(strings.intern(s))
    }

    fn literal(&mut self, word: &[u8]) -> R<()> {
        if self.b.get(self.i..self.i + word.len()) == Some(word) {
            self.i += word.len();
            Ok(())
        } else {
            Err(Fail)
        }
    }

    /// A number as serde_json's `deserialize_any` gives it: integers that fit as `Int`
    /// (`UInt` above `i64::MAX`), anything with a fraction or exponent as `Float`.
    fn number(&mut self) -> R<Value> {
        let b = self.b;
        let start = self.i;
        let mut j = start;
        let neg = b.get(j) == Some(&b'-');
        if neg {
            j += 1;
        }
        // An integer beyond 64 bits is a float to serde_json, as if it had a fraction.
        let mut n: Option<u64> = Some(0);
        match b.get(j) {
            Some(b'0') => j += 1,
            Some(b'1'..=b'9') => {
                while let Some(&c @ b'0'..=b'9') = b.get(j) {
                    n = n
                        .and_then(|n| n.checked_mul(10))
                        .and_then(|n| n.checked_add((c - b'0') as u64));
                    j += 1;
                }
            }
            _ => return Err(Fail),
        }
        // One or more digits from `j`, as JSON wants after `.` and in an exponent.
        let digits = |j: &mut usize| {
            let from = *j;
            while let Some(b'0'..=b'9') = b.get(*j) {
                *j += 1;
            }
            if *j > from {
                Ok(())
            } else {
                Err(Fail)
            }
        };
        let mut float = n.is_none();
        if b.get(j) == Some(&b'.') {
            float = true;
            j += 1;
            digits(&mut j)?;
        }
        if let Some(b'e' | b'E') = b.get(j) {
            float = true;
            j += 1;
            if let Some(b'+' | b'-') = b.get(j) {
                j += 1;
            }
            digits(&mut j)?;
        }
        self.i = j;
        match (n, float) {
            (Some(n), false) if !neg => Ok(i64::try_from(n).map_or(Value::UInt(n), Value::Int)),
            // serde_json negates in i64 and takes what does not fit (`-0` too) as a float.
            (Some(n), false) => match (n as i64).wrapping_neg() {
                v if v < 0 => Ok(Value::Int(v)),
                _ => Ok(Value::Float(-(n as f64))),
            },
            _ => {
                // Rust's parse and serde_json's float_roundtrip both round correctly; out of
                // range is an error there.
                let text = std::str::from_utf8(&b[start..j]).map_err(|_| Fail)?;
                let f: f64 = text.parse().map_err(|_| Fail)?;
                if f.is_finite() {
                    Ok(Value::Float(f))
                } else {
                    Err(Fail)
                }
            }
        }
    }

    /// Any value into the node-local arena, as the visitors' `RawSeed`.
    fn value(
        &mut self,
        strings: &mut Interner,
        raw: &mut Vec<Value>,
        stack: &mut Vec<Value>,
    ) -> R<Value> {
        match self.peek().ok_or(Fail)? {
            b'"' => Ok(Value::Str(self.sym(strings)?)),
            b'[' => {
                let base = stack.len();
                self.seq(|lx| {
                    let v = lx.value(strings, raw, stack)?;
                    stack.push(v);
                    Ok(())
                })?;
                if raw.len() + (stack.len() - base) > crate::model::ARENA_MAX {
                    return Err(Fail);
                }
                let start = raw.len() as u32;
                let len = (stack.len() - base) as u32;
                raw.extend(stack.drain(base..));
                Ok(Value::List { start, len })
            }
            b't' => self.literal(b"true").map(|()| Value::Bool(true)),
            b'f' => self.literal(b"false").map(|()| Value::Bool(false)),
            b'n' => self.literal(b"null").map(|()| Value::Null),
            b'-' | b'0'..=b'9' => self.number(),
            _ => Err(Fail),
        }
    }

    /// `open` elements separated by commas `close`, each element read by `each`; nesting
    /// counted. Lists and objects alike.
    #[inline]
    fn delimited(
        &mut self,
        open: u8,
        close: u8,
        mut each: impl FnMut(&mut Self) -> R<()>,
    ) -> R<()> {
        self.eat(open)?;
        self.enter()?;
        self.ws();
        if self.peek() == Some(close) {
            self.i += 1;
        } else {
            loop {
                self.ws();
                each(self)?;
                self.ws();
                match self.next()? {
                    b',' => {}
                    c if c == close => break,
                    _ => return Err(Fail),
                }
            }
        }
        self.depth -= 1;
        Ok(())
    }

    /// `[` elements `]`, each element parsed by `each`.
    fn seq(&mut self, each: impl FnMut(&mut Self) -> R<()>) -> R<()> {
        self.delimited(b'[', b']', each)
    }

    /// A list of raw values appended to `out` (`RawListSeed`).
    fn list(
        &mut self,
        strings: &mut Interner,
        raw: &mut Vec<Value>,
        stack: &mut Vec<Value>,
        out: &mut Vec<Value>,
    ) -> R<()> {
        self.seq(|lx| {
            let v = lx.value(strings, raw, stack)?;
            out.push(v);
            Ok(())
        })
    }

    /// A list of interned strings (`SymListSeed`).
    fn syms(&mut self, strings: &mut Interner, out: &mut Vec<Sym>) -> R<()> {
        self.seq(|lx| {
            let s = lx.sym(strings)?;
            out.push(s);
            Ok(())
        })
    }

    /// `{` key `:` value, ... `}`, each member parsed by `member(lexer, key index)`, keys
    /// matched against `keys`; an unknown key fails.
    fn object(
        &mut self,
        keys: &[&str],
        mut member: impl FnMut(&mut Self, usize) -> R<()>,
    ) -> R<()> {
        self.delimited(b'{', b'}', |lx| {
            let k = lx.key(keys)?;
            lx.ws();
            lx.eat(b':')?;
            lx.ws();
            member(lx, k)
        })
    }

    /// A key that is one of `keys`: compared in place when written plainly (the observer's
    /// way), else read as a string (escapes).
    #[inline]
    fn key(&mut self, keys: &[&str]) -> R<usize> {
        if self.peek() != Some(b'"') {
            return Err(Fail);
        }
        let rest = &self.b[self.i + 1..];
        for (n, k) in keys.iter().enumerate() {
            let k = k.as_bytes();
            if rest.len() > k.len() && rest[k.len()] == b'"' && &rest[..k.len()] == k {
                self.i += k.len() + 2;
                return Ok(n);
            }
        }
        let key = self.string()?;
        keys.iter().position(|k| *k == key).ok_or(Fail)
    }

    /// `inputs`/`outputs` (`IoSeed`).
    fn io(
        &mut self,
        strings: &mut Interner,
        raw: &mut Vec<Value>,
        stack: &mut Vec<Value>,
        io: &mut IoAcc,
    ) -> R<Layout> {
        match self.peek() {
            Some(b'[') => {
                self.list(strings, raw, stack, &mut io.values)?;
                Ok(Layout::Flat)
            }
            Some(b'{') => {
                self.object(&["values", "shapes", "types", "strides"], |lx, k| match k {
                    0 => lx.list(strings, raw, stack, &mut io.values),
                    1 => lx.list(strings, raw, stack, &mut io.shapes),
                    2 => lx.syms(strings, &mut io.types),
                    _ => lx.list(strings, raw, stack, io.strides.get_or_insert_with(Vec::new)),
                })?;
                Ok(Layout::Nested)
            }
            _ => Err(Fail),
        }
    }

    /// An attribute name or type (`WordSeed`).
    fn word(&mut self, strings: &mut Interner) -> R<Word> {
        let s = self.string()?;
        Ok(Word::of(s, strings))
    }

    /// The nested layout's `attrs` (`AttrsSeed`).
    fn attrs(
        &mut self,
        strings: &mut Interner,
        raw: &mut Vec<Value>,
        stack: &mut Vec<Value>,
        acc: &mut NodeAcc,
    ) -> R<()> {
        self.seq(|lx| {
            let (mut name, mut ty, mut value) = (None, None, None);
            lx.object(&["name", "type", "value"], |lx, k| {
                match k {
                    0 => name = Some(lx.word(strings)?),
                    1 => ty = Some(lx.word(strings)?),
                    _ => value = Some(lx.value(strings, raw, stack)?),
                }
                Ok(())
            })?;
            let a = RawAttr {
                name: name.ok_or(Fail)?,
                ty: ty.unwrap_or(Word::Other(Interner::EMPTY)),
                value: value.unwrap_or(Value::Null),
            };
            store_attr(acc, strings, a);
            Ok(())
        })
    }
}

fn hex4(b: &[u8], j: usize) -> R<u32> {
    let h = b.get(j..j + 4).ok_or(Fail)?;
    let mut v = 0u32;
    for &c in h {
        let d = (c as char).to_digit(16).ok_or(Fail)?;
        v = v * 16 + d;
    }
    Ok(v)
}
