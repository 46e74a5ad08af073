//! Binding a [`Plan`] to a device in a libtorch process: each step's operator is resolved in the
//! dispatcher (once per distinct operator), the device's rewrites ([`RewriteTo`]) are applied
//! (an op without a kernel there runs as another or as nothing), and a trace recorded with
//! another version of an operator's schema has its arguments rebuilt against the registered
//! one, by name.

use crate::device::{ArgFrom, Device, RewriteTo};
use crate::error::CallError;
use crate::ffi::Op;
use crate::plan::{Arg, Plan, Step};
use et_schema::{OpSchema, SchemaType};
use std::collections::HashMap;
use std::sync::Arc;

/// How a bound step executes.
#[derive(Clone)]
pub enum Exec {
    /// A boxed call of this operator.
    Call(Arc<Op>),
    /// Nothing runs: outputs that are inputs pass through, the rest are synthesised.
    PassThrough,
    /// The step cannot run here; it fails every time with this error.
    Fail(CallError),
}

/// A step ready to run on one device.
#[derive(Clone)]
pub struct BoundStep {
    pub exec: Exec,
    /// Arguments that replace the plan's (a rewrite's or a reconciled schema's); `None`: the
    /// plan's own.
    pub args: Option<Vec<Arg>>,
    /// The op runs as something else on this device (reported per op).
    pub fallback: Option<String>,
}

/// A plan bound to a device: one [`BoundStep`] per plan step.
pub struct Bound {
    pub device: Device,
    pub steps: Vec<BoundStep>,
}

impl Bound {
    /// The arguments step `pos` is called with.
    pub fn args<'a>(&'a self, plan: &'a Plan, pos: usize) -> &'a [Arg] {
        self.steps[pos]
            .args
            .as_deref()
            .unwrap_or(&plan.steps[pos].args)
    }
}

/// Resolves a plan's operators for a device. Never fails as a whole: a step that cannot run
/// is bound to [`Exec::Fail`] with the reason, and the run goes on around it.
pub fn bind(plan: &Plan, device: &Device) -> Bound {
    let mut resolved: HashMap<(String, String), Result<Arc<Op>, CallError>> = HashMap::new();
    let mut resolve = |name: &str, overload: &str| {
        resolved
            .entry((name.to_string(), overload.to_string()))
            .or_insert_with(|| Op::find(name, overload).map(Arc::new))
            .clone()
    };
    // Per distinct operator: the registered schema when it differs from the recorded one.
    let mut differs: HashMap<u32, Option<(OpSchema, OpSchema, String)>> = HashMap::new();
    let steps = plan
        .steps
        .iter()
        .map(|step| {
            let op = plan.op_of(step);
            let full = op.map(|o| full_name(&o.name, &o.overload));
            let names = [Some(step.name.as_str()), full.as_deref()];
            let names: Vec<&str> = names.into_iter().flatten().collect();
            if let Some(rw) = device.rewrite_for(&names) {
                match rw.to {
                    RewriteTo::Elide => {
                        return BoundStep {
                            exec: Exec::PassThrough,
                            args: None,
                            fallback: Some(format!(
                                "no-op on {} ({})",
                                device.name().to_uppercase(),
                                step.name
                            )),
                        }
                    }
                    RewriteTo::MadeAsRecorded { why } => {
                        return BoundStep {
                            exec: Exec::PassThrough,
                            args: None,
                            fallback: Some(format!(
                                "not run, its outputs made at their recorded sizes: {why}"
                            )),
                        }
                    }
                    RewriteTo::Call {
                        name,
                        overload,
                        args,
                    } if step.problem.is_none() && rw.arity.accepts(step.args.len()) => {
                        let args = args
                            .iter()
                            .map(|a| match a {
                                ArgFrom::Recorded(k) => step.args[*k].clone(),
                                ArgFrom::Bool(b) => Arg::Bool(*b),
                                ArgFrom::BoolList(v) => Arg::BoolList(v.to_vec()),
                            })
                            .collect();
                        return BoundStep {
                            exec: exec_of(resolve(name, overload)),
                            args: Some(args),
                            fallback: Some(format!(
                                "ran as {name} (no {} kernel for {})",
                                device.name().to_uppercase(),
                                full.as_deref().unwrap_or(&step.name)
                            )),
                        };
                    }
                    RewriteTo::Call { .. } => {}
                }
            }
            // `record_param_comms` "wait" records: the replay waits for each collective's
            // work when it is issued, so these have nothing left to do.
            if let crate::plan::StepKind::Collective(c) = &step.kind {
                if c.name == "wait" && step.op.is_none() {
                    return BoundStep {
                        exec: Exec::PassThrough,
                        args: None,
                        fallback: None,
                    };
                }
                // A group of one rank has no peers: its collective is the identity (a
                // single-GPU DDP job's allreduces), with no launcher or rendezvous needed.
                if plan
                    .groups
                    .get(c.group as usize)
                    .is_some_and(|g| g.size == 1)
                {
                    return BoundStep {
                        exec: Exec::PassThrough,
                        args: None,
                        fallback: Some(
                            "ran as the identity: its process group has one rank (no peers)".into(),
                        ),
                    };
                }
            }
            if let Some(p) = &step.problem {
                return failing(CallError::unsupported(p.clone()));
            }
            let (Some(op), Some(idx)) = (op, step.op) else {
                return failing(CallError::unsupported("no op schema"));
            };
            let handle = match resolve(&op.name, &op.overload) {
                Ok(h) => h,
                Err(e) => return failing(e),
            };
            // A trace from another PyTorch version may record an older schema of the
            // operator: rebuild the arguments against the registered schema, by name.
            let diff = differs
                .entry(idx)
                .or_insert_with(|| schema_difference(&op.schema, &handle.schema()));
            match diff {
                None => BoundStep {
                    exec: Exec::Call(handle),
                    args: None,
                    fallback: None,
                },
                Some((reg, recorded, text)) => match reconcile(step, reg, recorded) {
                    Ok(args) => BoundStep {
                        exec: Exec::Call(handle),
                        args: Some(args),
                        fallback: None,
                    },
                    Err(e) => failing(CallError::unsupported(format!(
                        "recorded schema differs from this libtorch's ({text}): {e}"
                    ))),
                },
            }
        })
        .collect();
    let b = Bound {
        device: *device,
        steps,
    };
    let count = |f: &dyn Fn(&BoundStep) -> bool| b.steps.iter().filter(|s| f(s)).count();
    log::info!(
        "bound {} steps to {}: {} calls ({} distinct operators), {} pass through, {} cannot run, {} through a device fallback",
        b.steps.len(),
        device.name(),
        count(&|s| matches!(s.exec, Exec::Call(_))),
        resolved.len(),
        count(&|s| matches!(s.exec, Exec::PassThrough)),
        count(&|s| matches!(s.exec, Exec::Fail(_))),
        count(&|s| s.fallback.is_some()),
    );
    b
}

fn full_name(name: &str, overload: &str) -> String {
    if overload.is_empty() {
        name.to_string()
    } else {
        format!("{name}.{overload}")
    }
}

fn exec_of(r: Result<Arc<Op>, CallError>) -> Exec {
    match r {
        Ok(op) => Exec::Call(op),
        Err(e) => Exec::Fail(e),
    }
}

fn failing(e: CallError) -> BoundStep {
    BoundStep {
        exec: Exec::Fail(e),
        args: None,
        fallback: None,
    }
}

/// (registered, recorded, registered text) when the two schemas' arguments differ in name or
/// type; `None` when they agree or either does not parse.
fn schema_difference(recorded: &str, registered: &str) -> Option<(OpSchema, OpSchema, String)> {
    let rec = OpSchema::parse(recorded).ok()?;
    let reg = OpSchema::parse(registered).ok()?;
    let same = reg
        .args
        .iter()
        .map(|a| (&a.name, a.ty.to_string()))
        .eq(rec.args.iter().map(|a| (&a.name, a.ty.to_string())));
    (!same).then(|| (reg, rec, registered.to_string()))
}

/// Why a step's recorded arguments cannot be given to the schema this libtorch registers.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ArgMismatch {
    /// The recorded call left it to a default the registered schema does not have.
    #[error("argument {0} was left to a default the registered schema does not have")]
    NoDefault(String),
    /// The registered schema has it, and neither the trace nor the schema gives a value.
    #[error("argument {0} has no recorded value and no default")]
    Missing(String),
    /// Its recorded value does not convert to the registered type.
    #[error("argument {arg}: {why}")]
    Convert {
        /// The argument's name.
        arg: String,
        /// Why not.
        why: Unconvertible,
    },
}

/// Why a value built for one schema type does not convert to another.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Unconvertible {
    /// An integer type would lose the fraction.
    #[error("a floating-point value where the schema needs {0}")]
    Float(String),
    /// A type that has no None.
    #[error("None where the schema needs {0}")]
    NoneValue(String),
}

/// Arguments for the registered schema from those built against the recorded one, matched by
/// name, with the registered defaults for arguments the trace does not have.
pub fn reconcile(
    step: &Step,
    reg: &OpSchema,
    recorded: &OpSchema,
) -> Result<Vec<Arg>, ArgMismatch> {
    let mut out = Vec::with_capacity(reg.args.len());
    for (k, ra) in reg.args.iter().enumerate() {
        let pos = recorded
            .args
            .iter()
            .position(|a| a.name.is_some() && a.name == ra.name);
        match pos.and_then(|p| step.args.get(p)) {
            // The recorded call left it to its default: the registered default, at its position.
            Some(Arg::Default(_)) if ra.default.is_some() => out.push(Arg::Default(k)),
            Some(Arg::Default(_)) if ra.ty.is_optional() => out.push(Arg::None),
            Some(Arg::Default(_)) => return Err(ArgMismatch::NoDefault(name(ra))),
            Some(a) => out.push(
                coerce(a.clone(), &ra.ty)
                    .map_err(|why| ArgMismatch::Convert { arg: name(ra), why })?,
            ),
            None if ra.default.is_some() => out.push(Arg::Default(k)),
            None if ra.ty.is_optional() => out.push(Arg::None),
            None => return Err(ArgMismatch::Missing(name(ra))),
        }
    }
    Ok(out)
}

/// A schema argument's name for a message (`?` where the schema has none).
fn name(a: &et_schema::SchemaArg) -> String {
    a.name.as_deref().unwrap_or("?").to_string()
}

/// An argument built for one schema type, as another type expects it: what building it from
/// the trace value with the registered type would have given (a number recorded as `int` where
/// the registered schema says `Scalar`, a list whose elements became optional, one int for an
/// `int[N]`).
fn coerce(a: Arg, ty: &SchemaType) -> Result<Arg, Unconvertible> {
    let base = match ty {
        SchemaType::Optional(inner) => {
            return match a {
                Arg::None | Arg::UndefinedTensor => Ok(Arg::None),
                a => coerce(a, inner),
            }
        }
        SchemaType::List { elem, size, .. } => {
            return Ok(match (elem.base_name().unwrap_or(""), a) {
                ("Tensor", Arg::TensorList { slots, .. }) => Arg::TensorList {
                    slots,
                    optional: elem.is_optional(),
                },
                ("int" | "SymInt", Arg::Int(i)) => Arg::IntList(vec![i; size.unwrap_or(1)]),
                ("float", Arg::ScalarList(v)) => Arg::DoubleList(v),
                ("Scalar", Arg::DoubleList(v)) => Arg::ScalarList(v),
                (_, a) => a,
            })
        }
        SchemaType::Named { name, .. } => name.as_str(),
        _ => return Ok(a),
    };
    Ok(match (base, a) {
        ("Device", _) => Arg::Device,
        ("Generator", _) => Arg::None,
        ("Tensor", Arg::None) => Arg::UndefinedTensor,
        ("Scalar", Arg::Int(i)) => Arg::ScalarInt(i),
        ("Scalar", Arg::Double(f)) => Arg::ScalarDouble(f),
        ("Scalar", Arg::Bool(b)) => Arg::ScalarBool(b),
        ("float", Arg::Int(i) | Arg::ScalarInt(i)) => Arg::Double(i as f64),
        ("float", Arg::ScalarDouble(f)) => Arg::Double(f),
        ("int" | "SymInt", Arg::ScalarInt(i)) => Arg::Int(i),
        ("int" | "SymInt", Arg::Bool(b) | Arg::ScalarBool(b)) => Arg::Int(b as i64),
        ("int" | "SymInt", Arg::Double(_) | Arg::ScalarDouble(_)) => {
            return Err(Unconvertible::Float(ty.to_string()));
        }
        ("bool", Arg::Int(i) | Arg::ScalarInt(i)) => Arg::Bool(i != 0),
        ("bool", Arg::ScalarBool(b)) => Arg::Bool(b),
        ("int" | "SymInt" | "float" | "bool" | "Scalar" | "str", Arg::None) => {
            return Err(Unconvertible::NoneValue(ty.to_string()));
        }
        (_, a) => a,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Arg, Step, StepKind};

    fn step(args: Vec<Arg>) -> Step {
        Step {
            node: 0,
            id: 2,
            name: "aten::x".into(),
            kind: StepKind::Compute,
            op: Some(0),
            problem: None,
            args,
            outs: vec![],
            out_specs: vec![],
            frees: vec![],
            passthrough: vec![],
            autograd: false,
            autocast: None,
            views: Vec::new(),
        }
    }

    fn schema(s: &str) -> OpSchema {
        OpSchema::parse(s).unwrap()
    }

    /// Arguments are matched by name, converted to the registered types, and the registered
    /// defaults fill what the recorded schema did not have.
    #[test]
    fn reconcile_matches_by_name_and_converts_types() {
        let recorded =
            schema("aten::x(Tensor[] a, int n, Scalar[] s, Tensor b, float f) -> Tensor");
        let reg = schema(
            "aten::x(float f, Tensor?[] a, int[2] n, float[] s, Tensor? b, Scalar alpha=1, int? extra=None) -> Tensor",
        );
        let st = step(vec![
            Arg::TensorList {
                slots: vec![Some(1)],
                optional: false,
            },
            Arg::Int(3),
            Arg::ScalarList(vec![0.5]),
            Arg::UndefinedTensor,
            Arg::Double(2.0),
        ]);
        let args = reconcile(&st, &reg, &recorded).unwrap();
        assert_eq!(
            args,
            vec![
                Arg::Double(2.0),
                Arg::TensorList {
                    slots: vec![Some(1)],
                    optional: true
                },
                Arg::IntList(vec![3, 3]),
                Arg::DoubleList(vec![0.5]),
                Arg::None,
                Arg::Default(5),
                Arg::Default(6),
            ]
        );
    }

    /// What cannot be reconciled is an error, not a wrong call.
    #[test]
    fn reconcile_refuses_what_it_cannot_convert() {
        let recorded = schema("aten::x(Tensor a, float f) -> Tensor");
        let reg = schema("aten::x(Tensor a, int f, int g) -> Tensor");
        let st = step(vec![Arg::Tensor(0), Arg::Double(0.5)]);
        assert!(reconcile(&st, &reg, &recorded)
            .unwrap_err()
            .to_string()
            .contains("floating-point"));
        let recorded = schema("aten::x(Tensor a, int k=1) -> Tensor");
        let reg = schema("aten::x(Tensor a, int k) -> Tensor");
        let st = step(vec![Arg::Tensor(0), Arg::Default(1)]);
        assert!(reconcile(&st, &reg, &recorded)
            .unwrap_err()
            .to_string()
            .contains("default"));
    }
}
