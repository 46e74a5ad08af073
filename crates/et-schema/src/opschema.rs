//! Parser for TorchScript function schemas, as the observer records them in `op_schema`:
//! `aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor`.
//!
//! The grammar follows `torch/csrc/jit/frontend/function_schema_parser.cpp`: alias annotations
//! (`Tensor(a!)`, `Tensor(a -> *)`), optionals (`?`), lists (`[]`, `int[2]`), tuples, `Dict(k, v)`,
//! `Future(t)`, keyword-only marker `*`, defaults (kept as written) and named returns.

use crate::MAX_NESTING;
use std::fmt;

/// A parsed operator schema.
#[derive(Clone, Debug, PartialEq)]
pub struct OpSchema {
    /// Qualified name without the overload: `aten::add`.
    pub name: String,
    /// The overload name, empty for the default overload: `Tensor`.
    pub overload: String,
    /// The arguments, in order.
    pub args: Vec<SchemaArg>,
    /// The returns, in order.
    pub returns: Vec<SchemaArg>,
    /// `...` in the argument list (varargs).
    pub is_vararg: bool,
    /// `...` in the return list.
    pub is_varret: bool,
}

/// One argument or return of a schema.
#[derive(Clone, Debug, PartialEq)]
pub struct SchemaArg {
    /// The name; `None` for unnamed returns.
    pub name: Option<String>,
    /// The type.
    pub ty: SchemaType,
    /// The default as written in the schema (`1`, `None`, `[0, 0]`, `"mean"`, `contiguous_format`).
    pub default: Option<String>,
    /// After the `*` marker: must be passed by keyword.
    pub kwarg_only: bool,
}

/// An alias annotation: `(a)`, `(a!)`, `(a -> *)`, `(a|b!)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AliasInfo {
    /// The alias sets the value belongs to on entry (`a` in `a -> *`, `a`, `b` in `a|b`).
    pub before: Vec<String>,
    /// The alias sets after the call (`*` in `a -> *`); empty when the annotation has no `->`.
    pub after: Vec<String>,
    /// `!`: the op writes the value.
    pub is_write: bool,
}

/// The type of a schema argument.
#[derive(Clone, Debug, PartialEq)]
pub enum SchemaType {
    /// A named type: `Tensor`, `int`, `SymInt`, `float`, `bool`, `str`, `Scalar`, `ScalarType`,
    /// `Layout`, `Device`, `MemoryFormat`, `Generator`, `Dimname`, `Storage`, `Stream`, `Any`, ...
    /// Alias annotations belong to the type they follow.
    Named {
        /// The type's name.
        name: String,
        /// Its alias annotation.
        alias: Option<AliasInfo>,
    },
    /// `T?`.
    Optional(Box<SchemaType>),
    /// `T[]` or `T[N]`; the alias is that of the list itself (`Tensor(a!)[]` puts it on the element).
    List {
        /// The element type.
        elem: Box<SchemaType>,
        /// `N` in `T[N]`.
        size: Option<usize>,
        /// The list's alias annotation.
        alias: Option<AliasInfo>,
    },
    /// `(T, U)`.
    Tuple(Vec<SchemaType>),
    /// `Dict(K, V)`.
    Dict(Box<SchemaType>, Box<SchemaType>),
    /// `Future(T)`.
    Future(Box<SchemaType>),
}

impl SchemaType {
    /// The alias annotation that applies to values of this argument, looking through optionals
    /// and into list elements.
    pub fn alias(&self) -> Option<&AliasInfo> {
        match self {
            SchemaType::Named { alias, .. } => alias.as_ref(),
            SchemaType::Optional(t) => t.alias(),
            SchemaType::List { elem, alias, .. } => alias.as_ref().or_else(|| elem.alias()),
            _ => None,
        }
    }

    /// Whether the op may write this argument in place (`Tensor(a!)`).
    pub fn is_write(&self) -> bool {
        self.alias().is_some_and(|a| a.is_write)
    }

    /// The innermost named type (through optionals and lists).
    pub fn base_name(&self) -> Option<&str> {
        match self {
            SchemaType::Named { name, .. } => Some(name),
            SchemaType::Optional(t) => t.base_name(),
            SchemaType::List { elem, .. } => elem.base_name(),
            SchemaType::Future(t) => t.base_name(),
            _ => None,
        }
    }

    /// Whether the type is `T?`.
    pub fn is_optional(&self) -> bool {
        matches!(self, SchemaType::Optional(_))
    }
}

/// A schema syntax error with the byte position inside the schema.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchemaParseError {
    /// Byte position of the error in the schema.
    pub pos: usize,
    /// What is wrong there.
    pub msg: String,
}

impl fmt::Display for SchemaParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at byte {}: {}", self.pos, self.msg)
    }
}

impl std::error::Error for SchemaParseError {}

impl OpSchema {
    /// Parses a schema (nesting at most [`crate::MAX_NESTING`] deep).
    pub fn parse(s: &str) -> Result<OpSchema, SchemaParseError> {
        let mut p = Lexer {
            s: s.as_bytes(),
            i: 0,
            depth: 0,
        };
        p.ws();
        let full = p.qualified_name()?;
        let (name, overload) = match full.split_once('.') {
            Some((n, o)) => (n.to_string(), o.to_string()),
            None => (full, String::new()),
        };
        if name.is_empty() {
            // `.x()`: an overload of nothing, which would print as `x()`.
            return Err(SchemaParseError {
                pos: 0,
                msg: "expected an operator name before the overload".into(),
            });
        }
        p.ws();
        p.expect(b'(')?;
        let (args, is_vararg) = p.arg_list(b')', true)?;
        p.ws();
        let mut returns = Vec::new();
        let mut is_varret = false;
        if p.eat_str("->") {
            p.ws();
            if p.peek() == Some(b'(') {
                p.i += 1;
                (returns, is_varret) = p.arg_list(b')', false)?;
            } else if p.eat_str("...") {
                is_varret = true;
            } else {
                let ty = p.ty()?;
                p.ws();
                let name = p.opt_ident();
                returns.push(SchemaArg {
                    name,
                    ty,
                    default: None,
                    kwarg_only: false,
                });
            }
        }
        p.ws();
        if p.i != p.s.len() {
            return Err(p.err("trailing characters after the schema"));
        }
        Ok(OpSchema {
            name,
            overload,
            args,
            returns,
            is_vararg,
            is_varret,
        })
    }

    /// `aten::add.Tensor`, or `aten::relu` for the default overload.
    pub fn full_name(&self) -> String {
        if self.overload.is_empty() {
            self.name.clone()
        } else {
            format!("{}.{}", self.name, self.overload)
        }
    }

    /// The namespace before `::` (`aten`, `c10d`, `fbgemm`).
    pub fn namespace(&self) -> &str {
        self.name.split_once("::").map_or("", |(ns, _)| ns)
    }

    /// Positional (non kwarg-only) arguments.
    pub fn positional(&self) -> impl Iterator<Item = &SchemaArg> {
        self.args.iter().filter(|a| !a.kwarg_only)
    }

    /// Whether any argument is written in place.
    pub fn mutates(&self) -> bool {
        self.args.iter().any(|a| a.ty.is_write())
    }
}

struct Lexer<'a> {
    s: &'a [u8],
    i: usize,
    /// Types (tuple, `Dict(`, `Future(`) open around the one being parsed.
    depth: usize,
}

impl Lexer<'_> {
    fn err(&self, msg: &str) -> SchemaParseError {
        SchemaParseError {
            pos: self.i,
            msg: msg.to_string(),
        }
    }
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }
    fn ws(&mut self) {
        while self.peek().is_some_and(|c| c.is_ascii_whitespace()) {
            self.i += 1;
        }
    }
    fn expect(&mut self, c: u8) -> Result<(), SchemaParseError> {
        self.ws();
        if self.peek() == Some(c) {
            self.i += 1;
            Ok(())
        } else {
            Err(self.err(&format!("expected '{}'", c as char)))
        }
    }
    fn eat_str(&mut self, t: &str) -> bool {
        if self.s[self.i..].starts_with(t.as_bytes()) {
            self.i += t.len();
            true
        } else {
            false
        }
    }
    fn ident_raw(&mut self) -> &str {
        let start = self.i;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_')
        {
            self.i += 1;
        }
        std::str::from_utf8(&self.s[start..self.i]).unwrap_or("")
    }
    fn skip_ident(&mut self) {
        self.ident_raw();
    }
    fn opt_ident(&mut self) -> Option<String> {
        let id = self.ident_raw();
        (!id.is_empty()).then(|| id.to_string())
    }
    fn qualified_name(&mut self) -> Result<String, SchemaParseError> {
        let start = self.i;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b':' || c == b'.')
        {
            self.i += 1;
        }
        if start == self.i {
            return Err(self.err("expected an operator name"));
        }
        Ok(String::from_utf8_lossy(&self.s[start..self.i]).into_owned())
    }

    fn arg_list(
        &mut self,
        close: u8,
        allow_default: bool,
    ) -> Result<(Vec<SchemaArg>, bool), SchemaParseError> {
        let mut args = Vec::new();
        let mut kwarg_only = false;
        let mut vararg = false;
        self.ws();
        if self.peek() == Some(close) {
            self.i += 1;
            return Ok((args, vararg));
        }
        loop {
            self.ws();
            if self.peek() == Some(b'*') {
                if !allow_default {
                    // Returns are not passed by keyword (and would print without the marker).
                    return Err(self.err("'*' among the returns"));
                }
                self.i += 1;
                kwarg_only = true;
            } else if self.eat_str("...") {
                vararg = true;
            } else {
                let ty = self.ty()?;
                self.ws();
                let name = self.opt_ident();
                self.ws();
                let mut default = None;
                if allow_default && self.peek() == Some(b'=') {
                    self.i += 1;
                    self.ws();
                    default = Some(self.default_value(close)?);
                }
                args.push(SchemaArg {
                    name,
                    ty,
                    default,
                    kwarg_only,
                });
            }
            self.ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(c) if c == close => {
                    self.i += 1;
                    return Ok((args, vararg));
                }
                _ => return Err(self.err("expected ',' or the end of the argument list")),
            }
        }
    }

    /// A default value, kept verbatim: up to the next ',' or closer at bracket depth 0.
    fn default_value(&mut self, close: u8) -> Result<String, SchemaParseError> {
        let start = self.i;
        let mut depth = 0usize;
        let mut quote: Option<u8> = None;
        while let Some(c) = self.peek() {
            if let Some(q) = quote {
                if c == b'\\' {
                    // The escaped character, if the text has one: an error's position stays
                    // inside the text.
                    self.i = (self.i + 2).min(self.s.len());
                    continue;
                } else if c == q {
                    quote = None;
                }
            } else {
                match c {
                    b'"' | b'\'' => quote = Some(c),
                    b'[' | b'(' => depth += 1,
                    b']' | b')' if depth > 0 => depth -= 1,
                    b',' if depth == 0 => break,
                    c2 if c2 == close && depth == 0 => break,
                    _ => {}
                }
            }
            self.i += 1;
        }
        if quote.is_some() || self.peek().is_none() {
            return Err(self.err("unterminated default value"));
        }
        let v = String::from_utf8_lossy(&self.s[start..self.i])
            .trim()
            .to_string();
        if v.is_empty() {
            return Err(self.err("empty default value"));
        }
        Ok(v)
    }

    fn alias(&mut self) -> Result<Option<AliasInfo>, SchemaParseError> {
        if self.peek() != Some(b'(') {
            return Ok(None);
        }
        self.i += 1;
        let set = |l: &mut Self| -> Vec<String> {
            let mut v = Vec::new();
            loop {
                l.ws();
                if l.peek() == Some(b'*') {
                    l.i += 1;
                    v.push("*".to_string());
                } else {
                    let id = l.ident_raw().to_string();
                    if id.is_empty() {
                        break;
                    }
                    v.push(id);
                }
                l.ws();
                if l.peek() == Some(b'|') {
                    l.i += 1;
                } else {
                    break;
                }
            }
            v
        };
        let before = set(self);
        if before.is_empty() {
            return Err(self.err("empty alias annotation"));
        }
        let mut is_write = false;
        self.ws();
        if self.peek() == Some(b'!') {
            self.i += 1;
            is_write = true;
        }
        self.ws();
        let mut after = Vec::new();
        if self.eat_str("->") {
            after = set(self);
            self.ws();
            if self.peek() == Some(b'!') {
                self.i += 1;
                is_write = true;
            }
        }
        self.expect(b')')?;
        Ok(Some(AliasInfo {
            before,
            after,
            is_write,
        }))
    }

    fn ty(&mut self) -> Result<SchemaType, SchemaParseError> {
        self.ty_h().map(|(t, _)| t)
    }

    /// A type inside another (a tuple element, `Dict`'s or `Future`'s argument).
    fn inner_ty(&mut self) -> Result<(SchemaType, usize), SchemaParseError> {
        self.depth += 1;
        let r = self.ty_h();
        self.depth -= 1;
        r
    }

    /// One more level of nesting around a type of height `h`: an error past [`MAX_NESTING`]
    /// levels in all (counting the types this one is inside), so that neither the parse nor the
    /// recursive drop, print or compare of the result can overflow the stack.
    fn wrap(&self, h: usize) -> Result<usize, SchemaParseError> {
        if self.depth + h >= MAX_NESTING {
            return Err(self.err(&format!("types nested deeper than {MAX_NESTING} levels")));
        }
        Ok(h + 1)
    }

    /// A type and its height (wrappers around its innermost named type). The recursion goes
    /// through small functions, each with only its own locals: a frame per nesting level
    /// stays small even without optimisation.
    fn ty_h(&mut self) -> Result<(SchemaType, usize), SchemaParseError> {
        self.ws();
        let (t, h) = if self.peek() == Some(b'(') {
            self.tuple_ty()?
        } else {
            self.named_ty()?
        };
        self.postfix(t, h)
    }

    #[inline(never)]
    fn tuple_ty(&mut self) -> Result<(SchemaType, usize), SchemaParseError> {
        self.wrap(0)?;
        self.i += 1;
        let mut items = Vec::new();
        let mut inner = 0;
        self.ws();
        if self.peek() == Some(b')') {
            self.i += 1;
        } else {
            loop {
                let (item, ih) = self.inner_ty()?;
                inner = inner.max(ih);
                items.push(item);
                self.ws();
                // Named tuple fields: `(Tensor a, Tensor b)` inside a type.
                self.skip_ident();
                self.ws();
                match self.peek() {
                    Some(b',') => self.i += 1,
                    Some(b')') => {
                        self.i += 1;
                        break;
                    }
                    _ => return Err(self.err("expected ',' or ')' in a tuple type")),
                }
            }
        }
        Ok((SchemaType::Tuple(items), self.wrap(inner)?))
    }

    #[inline(never)]
    fn named_ty(&mut self) -> Result<(SchemaType, usize), SchemaParseError> {
        // Class types are dotted: `__torch__.torch.classes.c10d.ProcessGroup`.
        let start = self.i;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'.')
        {
            self.i += 1;
        }
        let name = &self.s[start..self.i];
        if name.is_empty() {
            return Err(self.err("expected a type"));
        }
        match name {
            b"Dict" | b"Future" | b"Await" | b"RRef" => self.container_ty(name == b"Dict"),
            _ => {
                let name = String::from_utf8_lossy(name).into_owned();
                let alias = self.alias()?;
                Ok((SchemaType::Named { name, alias }, 0))
            }
        }
    }

    /// `Dict(K, V)`, or `Future(T)` (also `Await`, `RRef`), after the name.
    #[inline(never)]
    fn container_ty(&mut self, dict: bool) -> Result<(SchemaType, usize), SchemaParseError> {
        self.wrap(0)?;
        self.expect(b'(')?;
        let (a, ah) = self.inner_ty()?;
        if dict {
            self.expect(b',')?;
            let (b, bh) = self.inner_ty()?;
            self.expect(b')')?;
            Ok((
                SchemaType::Dict(Box::new(a), Box::new(b)),
                self.wrap(ah.max(bh))?,
            ))
        } else {
            self.expect(b')')?;
            Ok((SchemaType::Future(Box::new(a)), self.wrap(ah)?))
        }
    }

    /// Postfix: `[]`, `[N]`, `?`, and a list alias `Tensor[](a)`.
    #[inline(never)]
    fn postfix(
        &mut self,
        mut t: SchemaType,
        mut h: usize,
    ) -> Result<(SchemaType, usize), SchemaParseError> {
        loop {
            match self.peek() {
                Some(b'[') => {
                    self.i += 1;
                    self.ws();
                    let start = self.i;
                    while self.peek().is_some_and(|c| c.is_ascii_digit()) {
                        self.i += 1;
                    }
                    let size = if self.i > start {
                        std::str::from_utf8(&self.s[start..self.i])
                            .ok()
                            .and_then(|d| d.parse().ok())
                    } else {
                        None
                    };
                    self.expect(b']')?;
                    let alias = self.alias()?;
                    h = self.wrap(h)?;
                    t = SchemaType::List {
                        elem: Box::new(t),
                        size,
                        alias,
                    };
                }
                Some(b'?') => {
                    h = self.wrap(h)?;
                    self.i += 1;
                    t = SchemaType::Optional(Box::new(t));
                }
                _ => return Ok((t, h)),
            }
        }
    }
}

impl fmt::Display for AliasInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({}", self.before.join("|"))?;
        if self.is_write && self.after.is_empty() {
            f.write_str("!")?;
        }
        if !self.after.is_empty() {
            if self.is_write {
                f.write_str("!")?;
            }
            write!(f, " -> {}", self.after.join("|"))?;
        }
        f.write_str(")")
    }
}

impl fmt::Display for SchemaType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SchemaType::Named { name, alias } => {
                f.write_str(name)?;
                if let Some(a) = alias {
                    write!(f, "{a}")?;
                }
                Ok(())
            }
            SchemaType::Optional(t) => write!(f, "{t}?"),
            SchemaType::List { elem, size, alias } => {
                write!(f, "{elem}[")?;
                if let Some(n) = size {
                    write!(f, "{n}")?;
                }
                f.write_str("]")?;
                if let Some(a) = alias {
                    write!(f, "{a}")?;
                }
                Ok(())
            }
            SchemaType::Tuple(v) => {
                f.write_str("(")?;
                for (i, t) in v.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{t}")?;
                }
                f.write_str(")")
            }
            SchemaType::Dict(k, v) => write!(f, "Dict({k}, {v})"),
            SchemaType::Future(t) => write!(f, "Future({t})"),
        }
    }
}

impl fmt::Display for SchemaArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.ty)?;
        if let Some(n) = &self.name {
            write!(f, " {n}")?;
        }
        if let Some(d) = &self.default {
            write!(f, "={d}")?;
        }
        Ok(())
    }
}

impl fmt::Display for OpSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}(", self.full_name())?;
        let mut first = true;
        let mut star = false;
        for a in &self.args {
            if !first {
                f.write_str(", ")?;
            }
            if a.kwarg_only && !star {
                f.write_str("*, ")?;
                star = true;
            }
            first = false;
            write!(f, "{a}")?;
        }
        if self.is_vararg {
            f.write_str(if first { "..." } else { ", ..." })?;
        }
        f.write_str(") -> ")?;
        if self.returns.len() == 1 && self.returns[0].name.is_none() && !self.is_varret {
            // A lone tuple-typed return (`-> ((Tensor, Tensor))`, `-> ((int, int)[])`) keeps
            // its list's parentheses: without them it would read back as a list of returns.
            let ty = self.returns[0].to_string();
            if !ty.starts_with('(') {
                return f.write_str(&ty);
            }
        }
        f.write_str("(")?;
        for (i, r) in self.returns.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{r}")?;
        }
        if self.is_varret {
            f.write_str(if self.returns.is_empty() {
                "..."
            } else {
                ", ..."
            })?;
        }
        f.write_str(")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_tensor_with_kwarg_default() {
        let s = OpSchema::parse(
            "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
        )
        .unwrap();
        assert_eq!(s.name, "aten::add");
        assert_eq!(s.overload, "Tensor");
        assert_eq!(s.namespace(), "aten");
        assert_eq!(s.args.len(), 3);
        assert!(s.args[2].kwarg_only);
        assert_eq!(s.args[2].default.as_deref(), Some("1"));
        assert_eq!(s.returns.len(), 1);
        assert!(!s.mutates());
    }

    #[test]
    fn alias_annotations_optionals_lists_and_named_returns() {
        let s =
            OpSchema::parse("aten::_foreach_add_.Scalar(Tensor(a!)[] self, Scalar scalar) -> ()")
                .unwrap();
        assert!(s.args[0].ty.is_write());
        assert!(s.returns.is_empty());
        let s = OpSchema::parse("aten::max.dim_max(Tensor self, int dim, bool keepdim=False, *, Tensor(a!) max, Tensor(b!) max_values) -> (Tensor(a!) values, Tensor(b!) indices)").unwrap();
        assert_eq!(s.returns[0].name.as_deref(), Some("values"));
        assert!(s.returns[1].ty.is_write());
        let s = OpSchema::parse("aten::as_strided(Tensor(a) self, SymInt[] size, SymInt[] stride, SymInt? storage_offset=None) -> Tensor(a)").unwrap();
        assert!(!s.args[0].ty.is_write());
        assert_eq!(s.args[0].ty.alias().unwrap().before, vec!["a"]);
        assert!(matches!(s.args[3].ty, SchemaType::Optional(_)));
        let s = OpSchema::parse("aten::max_pool2d(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, int[2] dilation=1, bool ceil_mode=False) -> Tensor").unwrap();
        assert!(matches!(
            s.args[1].ty,
            SchemaType::List { size: Some(2), .. }
        ));
        assert_eq!(s.args[2].default.as_deref(), Some("[]"));
        let s = OpSchema::parse(
            "aten::split.Tensor(Tensor(a -> *) self, SymInt split_size, int dim=0) -> Tensor(a)[]",
        )
        .unwrap();
        assert_eq!(s.args[0].ty.alias().unwrap().after, vec!["*"]);
        assert!(matches!(s.returns[0].ty, SchemaType::List { .. }));
    }

    #[test]
    fn defaults_with_strings_and_enums() {
        let s = OpSchema::parse(
            "aten::div.Tensor_mode(Tensor self, Tensor other, *, str? rounding_mode) -> Tensor",
        )
        .unwrap();
        assert!(s.args[2].ty.is_optional());
        let s = OpSchema::parse("aten::gelu(Tensor self, *, str approximate=\"none\") -> Tensor")
            .unwrap();
        assert_eq!(s.args[1].default.as_deref(), Some("\"none\""));
        let s = OpSchema::parse("aten::empty.memory_format(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor").unwrap();
        assert_eq!(s.args.len(), 6);
        assert!(s.args[1..].iter().all(|a| a.kwarg_only));
        let s = OpSchema::parse("c10d::allreduce_(Tensor[] tensors, __torch__.torch.classes.c10d.ProcessGroup process_group, __torch__.torch.classes.c10d.ReduceOp reduce_op, Tensor? sparse_indices, int timeout) -> (Tensor[], __torch__.torch.classes.c10d.Work)").unwrap();
        assert_eq!(
            s.args[1].ty.base_name(),
            Some("__torch__.torch.classes.c10d.ProcessGroup")
        );
        assert_eq!(s.returns.len(), 2);
    }

    #[test]
    fn display_round_trips_through_parse() {
        for src in [
            "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
            "aten::_foreach_add_.Scalar(Tensor(a!)[] self, Scalar scalar) -> ()",
            "aten::split.Tensor(Tensor(a -> *) self, SymInt split_size, int dim=0) -> Tensor(a)[]",
            "aten::native_layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight, Tensor? bias, float eps) -> (Tensor, Tensor, Tensor)",
            // Found by the parse_schema fuzz target: varargs after named returns printed
            // without their comma (`(Tensor a...)`).
            "prim::x(Dict(str, Tensor[])? d, Future(int) f, int[2] k=[1, 1], ...) -> (Tensor a, ...)",
            "prim::y(...) -> ...",
        ] {
            let s = OpSchema::parse(src).unwrap();
            let again = OpSchema::parse(&s.to_string()).unwrap();
            assert_eq!(s, again, "{src}");
        }
    }

    #[test]
    fn errors_carry_positions() {
        let e = OpSchema::parse("aten::add(Tensor self").unwrap_err();
        assert!(e.pos >= 20, "{e}");
        assert!(OpSchema::parse("").is_err());
        assert!(OpSchema::parse("aten::x(Tensor(a self) -> Tensor").is_err());
        assert!(OpSchema::parse("aten::x(int a=) -> Tensor").is_err());
        // Found by the parse_schema fuzz target: an overload without a name parsed, and
        // printed as a schema that does not parse.
        assert!(OpSchema::parse(".()").is_err());
        assert!(OpSchema::parse(".x(int a) -> ()").is_err());
        // And a lone return of a tuple type, printed as a list of returns.
        for src in [
            "aten::x(Tensor a) -> ((((Tensor, int))))",
            "aten::x(Tensor a) -> (((Tensor, int)[]))",
            "aten::x(Tensor a) -> ((()))",
        ] {
            let s = OpSchema::parse(src).unwrap();
            assert_eq!(OpSchema::parse(&s.to_string()).unwrap(), s, "{src}");
        }
        // Also found by it: a keyword-only marker among the returns, which printed without it.
        assert!(OpSchema::parse("a(Tensor x) -> (Tensor a, *, Tensor b)").is_err());
        // An escape at the very end: the position is the end, not past it.
        for s in ["a(int x=\"\\", "a(int x='\\"] {
            assert_eq!(OpSchema::parse(s).unwrap_err().pos, s.len(), "{s}");
        }
        assert_eq!(
            OpSchema::parse("a(str x=\"\\\"\") -> ()").unwrap().args[0]
                .default
                .as_deref(),
            Some("\"\\\"\"")
        );
    }
}
