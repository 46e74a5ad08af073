//! The grammar of ET type strings: `Tensor(float)`, `GenericList[Int,Tensor(long int)]`,
//! `Tuple[String,String]`, `Tensor(nullptr (uninitialized))`, `Int`, `None`, ...

use crate::dtype::DType;
use crate::error::{clip, MSG_MAX};
use crate::MAX_NESTING;
use std::fmt;

/// A parsed ET value type.
#[derive(Clone, Debug, PartialEq)]
pub enum ValueType {
    /// `Tensor(<dtype>)`; `dtype` is `None` when the spelling is unknown (`raw` keeps it).
    Tensor {
        /// The element type, when the spelling is known.
        dtype: Option<DType>,
        /// The spelling inside the parentheses.
        raw: String,
    },
    /// `Tensor(nullptr (uninitialized))`: an undefined tensor.
    UndefinedTensor,
    /// `GenericList[...]` with one type per element (possibly empty).
    List(Vec<ValueType>),
    /// `Tuple[...]`.
    Tuple(Vec<ValueType>),
    /// `Int`: a 64-bit integer.
    Int,
    /// `Double`: a 64-bit float.
    Double,
    /// `Bool`.
    Bool,
    /// `String`.
    String,
    /// `None`: no value.
    None,
    /// `Device`: a device string such as `cuda:0`.
    Device,
    /// Opaque values the observer does not record: `Object`, `Stream`, `Storage`, `Generator`, ...
    Opaque(String),
}

/// A type-string syntax error with the byte position inside the string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeParseError {
    /// Byte position of the error in the type string.
    pub pos: usize,
    /// What is wrong there.
    pub msg: String,
}

impl fmt::Display for TypeParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at byte {}: {}", self.pos, self.msg)
    }
}

impl std::error::Error for TypeParseError {}

impl ValueType {
    /// Parses an ET type string (nesting at most [`crate::MAX_NESTING`] deep).
    pub fn parse(s: &str) -> Result<ValueType, TypeParseError> {
        let mut p = P {
            s: s.as_bytes(),
            i: 0,
            depth: 0,
        };
        let t = p.ty()?;
        if p.i != p.s.len() {
            return Err(p.err("trailing characters"));
        }
        Ok(t)
    }

    /// Whether this type is a tensor (defined or not).
    pub fn is_tensor(&self) -> bool {
        matches!(self, ValueType::Tensor { .. } | ValueType::UndefinedTensor)
    }

    /// Whether this type or any element of it is a tensor.
    pub fn contains_tensor(&self) -> bool {
        match self {
            ValueType::Tensor { .. } | ValueType::UndefinedTensor => true,
            ValueType::List(v) | ValueType::Tuple(v) => v.iter().any(|t| t.contains_tensor()),
            _ => false,
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |f: &mut fmt::Formatter<'_>, name: &str, v: &[ValueType]| {
            write!(f, "{name}[")?;
            for (i, t) in v.iter().enumerate() {
                if i > 0 {
                    f.write_str(",")?;
                }
                write!(f, "{t}")?;
            }
            f.write_str("]")
        };
        match self {
            ValueType::Tensor { raw, .. } => write!(f, "Tensor({raw})"),
            ValueType::UndefinedTensor => f.write_str("Tensor(nullptr (uninitialized))"),
            ValueType::List(v) => list(f, "GenericList", v),
            ValueType::Tuple(v) => list(f, "Tuple", v),
            ValueType::Int => f.write_str("Int"),
            ValueType::Double => f.write_str("Double"),
            ValueType::Bool => f.write_str("Bool"),
            ValueType::String => f.write_str("String"),
            ValueType::None => f.write_str("None"),
            ValueType::Device => f.write_str("Device"),
            ValueType::Opaque(s) => f.write_str(s),
        }
    }
}

struct P<'a> {
    s: &'a [u8],
    i: usize,
    /// Brackets open around the type being parsed; at most [`MAX_NESTING`].
    depth: usize,
}

impl P<'_> {
    fn err(&self, msg: &str) -> TypeParseError {
        TypeParseError {
            pos: self.i,
            msg: msg.to_string(),
        }
    }

    fn ident(&mut self) -> &str {
        let start = self.i;
        while self.i < self.s.len()
            && (self.s[self.i].is_ascii_alphanumeric() || self.s[self.i] == b'_')
        {
            self.i += 1;
        }
        // The input is a &str and identifiers are ASCII, so this slice is valid UTF-8.
        std::str::from_utf8(&self.s[start..self.i]).unwrap_or("")
    }

    fn ty(&mut self) -> Result<ValueType, TypeParseError> {
        let start = self.i;
        let name = self.ident().to_string();
        if name.is_empty() {
            return Err(self.err("expected a type name"));
        }
        match self.s.get(self.i) {
            Some(b'(') => {
                // Parenthesised payload, balanced: `Tensor(nullptr (uninitialized))`.
                let open = self.i + 1;
                let mut depth = 0usize;
                while self.i < self.s.len() {
                    match self.s[self.i] {
                        b'(' => depth += 1,
                        b')' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    self.i += 1;
                }
                if self.i >= self.s.len() {
                    return Err(self.err("unclosed '('"));
                }
                let inner = std::str::from_utf8(&self.s[open..self.i])
                    .unwrap_or("")
                    .to_string();
                self.i += 1;
                if name == "Tensor" {
                    if inner.starts_with("nullptr") {
                        Ok(ValueType::UndefinedTensor)
                    } else {
                        Ok(ValueType::Tensor {
                            dtype: DType::from_et_name(&inner),
                            raw: inner,
                        })
                    }
                } else {
                    let full = std::str::from_utf8(&self.s[start..self.i]).unwrap_or("");
                    Ok(ValueType::Opaque(full.to_string()))
                }
            }
            Some(b'[') => {
                if self.depth == MAX_NESTING {
                    return Err(self.err(&format!("types nested deeper than {MAX_NESTING} levels")));
                }
                self.depth += 1;
                self.i += 1;
                let mut items = Vec::new();
                if self.s.get(self.i) == Some(&b']') {
                    self.i += 1;
                } else {
                    loop {
                        items.push(self.ty()?);
                        match self.s.get(self.i) {
                            Some(b',') => self.i += 1,
                            Some(b']') => {
                                self.i += 1;
                                break;
                            }
                            _ => return Err(self.err("expected ',' or ']'")),
                        }
                    }
                }
                self.depth -= 1;
                match name.as_str() {
                    "GenericList" | "List" => Ok(ValueType::List(items)),
                    "Tuple" => Ok(ValueType::Tuple(items)),
                    _ => Err(TypeParseError {
                        pos: start,
                        msg: format!("unknown container '{}'", clip(&name, MSG_MAX)),
                    }),
                }
            }
            _ => Ok(match name.as_str() {
                "Int" => ValueType::Int,
                "Double" => ValueType::Double,
                "Bool" => ValueType::Bool,
                "String" => ValueType::String,
                "None" => ValueType::None,
                "Device" => ValueType::Device,
                "Tensor" => ValueType::Tensor {
                    dtype: None,
                    raw: String::new(),
                },
                _ => ValueType::Opaque(name),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_type_string_seen_in_real_traces() {
        let t = ValueType::parse("GenericList[Tensor(long int),Tensor(int)]").unwrap();
        assert_eq!(
            t,
            ValueType::List(vec![
                ValueType::Tensor {
                    dtype: Some(DType::Int64),
                    raw: "long int".into()
                },
                ValueType::Tensor {
                    dtype: Some(DType::Int32),
                    raw: "int".into()
                },
            ])
        );
        assert_eq!(
            ValueType::parse("Tensor(nullptr (uninitialized))").unwrap(),
            ValueType::UndefinedTensor
        );
        assert_eq!(
            ValueType::parse("GenericList[]").unwrap(),
            ValueType::List(vec![])
        );
        assert_eq!(
            ValueType::parse("Tuple[String,String]").unwrap(),
            ValueType::Tuple(vec![ValueType::String, ValueType::String])
        );
        assert_eq!(
            ValueType::parse("Stream").unwrap(),
            ValueType::Opaque("Stream".into())
        );
        let nested =
            ValueType::parse("GenericList[GenericList[Tensor(float),Tensor(float)]]").unwrap();
        assert!(nested.contains_tensor());
        assert!(!nested.is_tensor());
        let half = ValueType::parse("Tensor(c10::Half)").unwrap();
        assert_eq!(
            half,
            ValueType::Tensor {
                dtype: Some(DType::Float16),
                raw: "c10::Half".into()
            }
        );
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "GenericList[Tensor(long int),None,Int]",
            "Tuple[String,String]",
            "Tensor(nullptr (uninitialized))",
            "GenericList[]",
            "Double",
        ] {
            assert_eq!(ValueType::parse(s).unwrap().to_string(), s);
        }
    }

    #[test]
    fn rejects_garbage_with_position() {
        let e = ValueType::parse("GenericList[Int,").unwrap_err();
        assert_eq!(e.pos, 16);
        assert!(ValueType::parse("Tensor(float").is_err());
        assert!(ValueType::parse("").is_err());
        assert!(ValueType::parse("Foo[Int]").is_err());
    }
}
