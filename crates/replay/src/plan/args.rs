//! Argument templates: how each recorded input becomes an [`Arg`] (a slot, a constant, a
//! list of them, the schema's default).

use super::slots::{arg_tensors, nested_tensors, Builder};
use super::*;

/// A fused attention kernel that returns its log-sum-exp second, `[B, H, L]` (the memory-
/// efficient kernel pads it, and is not one).
pub(super) fn is_fused_attention(name: &str) -> bool {
    matches!(
        name,
        "aten::_scaled_dot_product_flash_attention_for_cpu"
            | "aten::_scaled_dot_product_flash_attention"
    )
}

pub(super) fn scalar_of(t: &Trace, v: Value) -> Option<Arg> {
    Some(match v {
        Value::Int(i) => Arg::ScalarInt(i),
        Value::Bool(b) => Arg::ScalarBool(b),
        Value::Float(f) => Arg::ScalarDouble(f),
        Value::Str(_) => Arg::ScalarDouble(t.as_f64(v)?),
        _ => return None,
    })
}

pub(super) fn is_none(t: &Trace, v: Value) -> bool {
    match v {
        Value::Null => true,
        Value::Str(s) => t.str(s) == "<None>",
        _ => false,
    }
}

/// Builds one argument from its trace value as the schema types it.
pub(super) fn build_arg(
    b: &mut Builder,
    step: usize,
    ty: &SchemaType,
    a: &et_schema::Arg,
) -> Result<Arg, String> {
    let t = b.g.trace;
    let v = a.value;
    if let SchemaType::Optional(inner) = ty {
        if is_none(t, v) {
            return Ok(Arg::None);
        }
        return build_arg(b, step, inner, a);
    }
    let unsupported = || {
        format!(
            "argument type {ty} (recorded as {:?}) with value {} is not supported",
            t.str(a.ty),
            t.value_text(a.value, 200)
        )
    };
    match ty {
        SchemaType::Named { name, .. } => match name.as_str() {
            "Tensor" => {
                if is_none(t, v) {
                    return Ok(Arg::UndefinedTensor);
                }
                let ts = arg_tensors(t, a);
                if let Some((_, Some(sp))) = ts.first() {
                    if sp.shape.iter().chain(&sp.strides).any(|&d| d < 0) {
                        return Err(format!(
                            "tensor with a negative size or stride (shape {:?}, strides {:?})",
                            sp.shape, sp.strides
                        ));
                    }
                }
                match ts.first() {
                    Some((tv, spec)) => match b.input_slot(step, *tv, spec) {
                        Some(s) => Ok(Arg::Tensor(s)),
                        None => Ok(Arg::UndefinedTensor),
                    },
                    None => Err(unsupported()),
                }
            }
            "int" | "SymInt" | "ScalarType" | "Layout" | "MemoryFormat" => match v {
                Value::Int(i) => Ok(Arg::Int(i)),
                Value::Bool(x) => Ok(Arg::Int(x as i64)),
                _ => Err(unsupported()),
            },
            "float" => t.as_f64(v).map(Arg::Double).ok_or_else(unsupported),
            "bool" => match v {
                Value::Bool(x) => Ok(Arg::Bool(x)),
                Value::Int(i) => Ok(Arg::Bool(i != 0)),
                _ => Err(unsupported()),
            },
            "str" => match v {
                Value::Str(s) => Ok(Arg::Str(CString::new(t.str(s)).map_err(|e| e.to_string())?)),
                _ => Err(unsupported()),
            },
            "Scalar" => scalar_of(t, v).ok_or_else(unsupported),
            "Device" => Ok(Arg::Device),
            "__torch__.torch.classes.c10d.ProcessGroup" => Ok(Arg::ProcessGroup(b.group)),
            "__torch__.torch.classes.c10d.ReduceOp" => Ok(Arg::ReduceOp(0)),
            "Generator" => Ok(Arg::None),
            _ => Err(unsupported()),
        },
        SchemaType::List { elem, size, .. } => list_arg(b, step, elem, *size, a, unsupported),
        _ => Err(unsupported()),
    }
}

/// A list argument (`Tensor[]`, `Tensor[][]`, `int[N]`, `float[]`, `Scalar[]`, `bool[]`) from
/// the recorded value; `unsupported` says why one cannot be built.
fn list_arg(
    b: &mut Builder,
    step: usize,
    elem: &SchemaType,
    size: Option<usize>,
    a: &et_schema::Arg,
    unsupported: impl Fn() -> String,
) -> Result<Arg, String> {
    let t = b.g.trace;
    let v = a.value;
    let base = elem.base_name().unwrap_or("");
    let items = t.list(v);
    if matches!(elem, SchemaType::List { .. }) && base == "Tensor" {
        let lists = nested_tensors(t, a)
            .into_iter()
            .map(|inner| {
                inner
                    .iter()
                    .map(|(tv, spec)| {
                        if is_none(t, *tv) {
                            None
                        } else {
                            b.input_slot(step, *tv, spec)
                        }
                    })
                    .collect()
            })
            .collect();
        return Ok(Arg::TensorLists(lists));
    }
    match (base, elem.is_optional()) {
        ("Tensor", optional) => {
            let ts = arg_tensors(t, a);
            let slots = ts
                .iter()
                .map(|(tv, spec)| {
                    if is_none(t, *tv) {
                        None
                    } else {
                        b.input_slot(step, *tv, spec)
                    }
                })
                .collect();
            Ok(Arg::TensorList { slots, optional })
        }
        ("int" | "SymInt", _) => {
            if let Value::Int(i) = v {
                return Ok(Arg::IntList(vec![i; size.unwrap_or(1)]));
            }
            items
                .iter()
                .map(|x| {
                    if let Value::Int(i) = x {
                        Some(*i)
                    } else {
                        None
                    }
                })
                .collect::<Option<Vec<_>>>()
                .map(Arg::IntList)
                .ok_or_else(unsupported)
        }
        ("float", _) => items
            .iter()
            .map(|x| t.as_f64(*x))
            .collect::<Option<Vec<_>>>()
            .map(Arg::DoubleList)
            .ok_or_else(unsupported),
        ("Scalar", _) => items
            .iter()
            .map(|x| t.as_f64(*x))
            .collect::<Option<Vec<_>>>()
            .map(Arg::ScalarList)
            .ok_or_else(unsupported),
        ("bool", _) => items
            .iter()
            .map(|x| {
                if let Value::Bool(b) = x {
                    Some(*b as u8)
                } else {
                    None
                }
            })
            .collect::<Option<Vec<_>>>()
            .map(Arg::BoolList)
            .ok_or_else(unsupported),
        _ => Err(unsupported()),
    }
}

/// The alias set a schema argument or return reads (`Tensor(a)`), `None` where it has none or
/// is written (`Tensor(a!)`).
pub(super) fn read_alias(ty: Option<&et_schema::SchemaType>) -> Option<&[String]> {
    ty?.alias()
        .filter(|a| !a.is_write)
        .map(|a| a.before.as_slice())
}

/// The op's first return is a view of its first argument: it reads the same alias set, and
/// neither is written (`t`, `view`, `split`, `expand`).
pub(super) fn returns_view_of_first(s: &OpSchema) -> bool {
    let first = read_alias(s.args.first().map(|a| &a.ty));
    first.is_some() && first == read_alias(s.returns.first().map(|r| &r.ty))
}
