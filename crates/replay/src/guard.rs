//! Preconditions of kernels that trust their caller.
//!
//! Some of libtorch's internal operators (the native forms under `batch_norm`, the backward
//! kernels autograd calls) skip the shape checks the public operators make: their callers hand
//! them tensors that agree by construction. A replay hands them what its plan says. A damaged
//! or forged plan, or a trace whose producer of an input failed and left a stand-in of another
//! shape, can make them disagree, and the kernel then reads past the end of a tensor: a crash
//! when the read crosses into an unmapped page, garbage otherwise. The operators here have
//! their inputs checked before each call, and a call that would read out of bounds fails with
//! the reason instead.
//!
//! Rules name arguments as the registered schema does, so the positions follow the libtorch
//! the replay runs on.

use crate::error::{CallError, ErrorKind};
use crate::plan::Arg;
use et_schema::OpSchema;
use tch::Tensor;

/// What one operator's kernel assumes of its arguments, by schema name.
struct Rule {
    /// Qualified name without the overload (every overload shares the rule).
    op: &'static str,
    /// The input whose dimension 1 is the channel count.
    input: &'static str,
    /// Arguments that must have the input's shape.
    same_shape: &'static [&'static str],
    /// Arguments that hold one value per channel where given.
    per_channel: &'static [&'static str],
    /// Per-channel statistics saved by a training forward, and the flag that says the forward
    /// trained: in evaluation the forward saves none (empty tensors) and the kernel reads none.
    saved: Option<(&'static str, &'static [&'static str])>,
}

/// A batch norm's forward: the weight, bias and running statistics one value per channel.
const fn forward(op: &'static str) -> Rule {
    Rule {
        op,
        input: "input",
        same_shape: &[],
        per_channel: &["weight", "bias", "running_mean", "running_var"],
        saved: None,
    }
}

/// A batch norm's backward: the gradient shaped as the input, the weight and running statistics
/// one value per channel, and where the forward trained (`flag`) the statistics it saved.
const fn backward(op: &'static str, flag: &'static str, saved: &'static [&'static str]) -> Rule {
    Rule {
        op,
        input: "input",
        same_shape: &["grad_out"],
        per_channel: &["weight", "running_mean", "running_var"],
        saved: Some((flag, saved)),
    }
}

/// The batch-norm family: the CPU kernels index the per-channel tensors by the input's
/// channel and walk the gradient as the input, unchecked (`native_batch_norm_backward` read
/// past a `save_mean` of fewer values than channels in a mutated plan).
const RULES: &[Rule] = &[
    forward("aten::native_batch_norm"),
    forward("aten::_native_batch_norm_legit"),
    forward("aten::_native_batch_norm_legit_no_training"),
    forward("aten::_batch_norm_with_update"),
    forward("aten::_batch_norm_no_update"),
    backward(
        "aten::native_batch_norm_backward",
        "train",
        &["save_mean", "save_invstd"],
    ),
    backward(
        "aten::batch_norm_backward",
        "update",
        &["save_mean", "save_var"],
    ),
];

/// One operator's rule, resolved to argument positions of its registered schema.
#[derive(Clone, Debug)]
pub struct Guard {
    op: &'static str,
    input: (usize, &'static str),
    same_shape: Vec<(usize, &'static str)>,
    per_channel: Vec<(usize, &'static str)>,
    /// The training flag's position and the saved statistics' ([`Rule::saved`]).
    saved: Option<(usize, Vec<(usize, &'static str)>)>,
}

/// Whether operator `name` (qualified, without overload) has a rule: cheap, for every step.
pub fn applies(name: &str) -> bool {
    RULES.iter().any(|r| r.op == name)
}

/// The guard of the operator whose registered schema is `schema`, where it has a rule. A
/// schema that does not parse, or lacks a named argument, has none (the kernel's own checks
/// stand).
pub fn for_schema(schema: &str) -> Option<Guard> {
    let s = OpSchema::parse(schema).ok()?;
    let rule = RULES.iter().find(|r| r.op == s.name)?;
    let pos = |n: &'static str| {
        s.args
            .iter()
            .position(|a| a.name.as_deref() == Some(n))
            .map(|i| (i, n))
    };
    Some(Guard {
        op: rule.op,
        input: pos(rule.input)?,
        same_shape: rule
            .same_shape
            .iter()
            .map(|n| pos(n))
            .collect::<Option<_>>()?,
        // Optional per-channel arguments a version lacks are not checked.
        per_channel: rule.per_channel.iter().filter_map(|n| pos(n)).collect(),
        saved: rule.saved.and_then(|(flag, saved)| {
            pos(flag).map(|(flag, _)| (flag, saved.iter().filter_map(|n| pos(n)).collect()))
        }),
    })
}

impl Guard {
    /// Checks the call's arguments (`args`, reading tensors from `slots`); the error says which
    /// argument disagrees with the input.
    pub fn check(&self, args: &[Arg], slots: &[Option<Tensor>]) -> Result<(), CallError> {
        let tensor = |i: usize| match args.get(i) {
            Some(Arg::Tensor(s)) => slots.get(*s as usize).and_then(Option::as_ref),
            _ => None,
        };
        // Without an input the kernel refuses the call itself.
        let Some(input) = tensor(self.input.0) else {
            return Ok(());
        };
        let shape = input.size();
        let refuse = |what: String| {
            Err(CallError::new(
                ErrorKind::InvalidArgument,
                format!(
                    "{}: {what}; its kernel does not check this and would read out of bounds",
                    self.op
                ),
            ))
        };
        for &(i, name) in &self.same_shape {
            if let Some(t) = tensor(i) {
                let s = t.size();
                if s != shape {
                    return refuse(format!(
                        "{name} is {s:?} where {} is {shape:?}",
                        self.input.1
                    ));
                }
            }
        }
        let Some(&channels) = shape.get(1) else {
            return Ok(());
        };
        // The saved statistics where the forward trained (the flag true, or not a plain bool).
        let saved = self.saved.iter().flat_map(|(flag, saved)| {
            let trained = !matches!(args.get(*flag), Some(Arg::Bool(false)));
            saved.iter().filter(move |_| trained)
        });
        for &(i, name) in self.per_channel.iter().chain(saved) {
            if let Some(t) = tensor(i) {
                let n = t.numel();
                if n as i64 != channels {
                    return refuse(format!(
                        "{name} holds {n} values where {} {shape:?} has {channels} channels",
                        self.input.1
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The guards of a bound plan's steps, by position.
pub(crate) fn of_steps(plan: &crate::plan::Plan, bound: &crate::Bound) -> Vec<Option<Guard>> {
    let mut by_op: std::collections::HashMap<u32, Option<Guard>> = Default::default();
    plan.steps
        .iter()
        .zip(&bound.steps)
        .map(|(step, b)| {
            // A device rewrite calls another op with its own arguments: not this rule's.
            let crate::bind::Exec::Call(handle) = &b.exec else {
                return None;
            };
            if b.fallback.is_some() {
                return None;
            }
            let idx = step.op?;
            let op = plan.ops.get(idx as usize)?;
            if !applies(&op.name) {
                return None;
            }
            by_op
                .entry(idx)
                .or_insert_with(|| for_schema(&handle.schema()))
                .clone()
        })
        .collect()
}
