//! One step of a plan on its own, run again and again: per-op regression benchmarks.
//!
//! [`signatures`] groups a plan's steps by [`Plan::signature`] (operator, overload, tensor
//! dtypes, shapes and strides, scalar arguments) with their counts and share of a time per step
//! (the original's from a linked Kineto trace, or a replay's own). [`SingleStep`] runs the steps
//! before one of them once (its producers: its inputs are then real tensors of the recorded
//! shapes and values of the kind a replay gives them) and then that step alone, as often as a
//! benchmark asks.
//!
//! ```no_run
//! # fn main() -> Result<(), replay::ReplayError> {
//! # let t = et_schema::read_trace(std::path::Path::new("mlp.et.json")).unwrap();
//! # let g = et_graph::Graph::new(&t);
//! let plan = replay::plan::compile(&g, &g.replay_set(None));
//! let bound = replay::bind(&plan, &replay::Device::Cpu);
//! let mut ex = replay::executor::Executor::new(&plan, &bound, true)?;
//! let mut one = replay::single::SingleStep::new(&mut ex, 3, true);
//! for _ in 0..100 {
//!     one.run(); // time this
//! }
//! # Ok(()) }
//! ```

use crate::executor::{Executor, Outcome};
use crate::plan::{Plan, TensorSpec};
use serde::Serialize;
use std::collections::HashMap;
use tch::Tensor;

/// Step `pos` of a plan with its inputs in place, ready to run any number of times.
///
/// Each [`SingleStep::run`] is the step's call(s) and its outputs stored in their slots, as
/// timed within a replayed iteration, then settled (the call's stack released). Nothing is
/// freed in between, so the inputs stay: an in-place op writes into the same tensors again,
/// which times the same kernel (its values drift, as a training step's do).
pub struct SingleStep<'e, 'a> {
    ex: &'e mut Executor<'a>,
    pos: usize,
    autograd: bool,
    slots: Vec<Option<Tensor>>,
}

impl<'e, 'a> SingleStep<'e, 'a> {
    /// Runs steps `0..pos` once ([`Executor::prepare`]), so that step `pos` finds its inputs.
    /// `autograd` as in [`crate::ReplayOptions::autograd`]. Panics if the plan has no step `pos`.
    pub fn new(ex: &'e mut Executor<'a>, pos: usize, autograd: bool) -> Self {
        assert!(
            pos < ex.plan().steps.len(),
            "step {pos} of a plan of {}",
            ex.plan().steps.len()
        );
        let slots = ex.prepare(pos, autograd);
        SingleStep {
            ex,
            pos,
            autograd,
            slots,
        }
    }

    /// The step's position in the plan.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Runs the step once: what a benchmark times.
    pub fn run(&mut self) -> Outcome {
        self.ex.make_views(self.pos, &mut self.slots);
        let outcome = self.ex.step(self.pos, &mut self.slots, self.autograd);
        self.ex.settle(self.pos, &mut self.slots, &outcome);
        outcome
    }

    /// The step's output tensors as the last run left them, each with its recorded spec
    /// (`None` before the first run, or where the op returned nothing for it).
    pub fn outputs(&self) -> Vec<(&'a TensorSpec, Option<&Tensor>)> {
        let plan: &'a Plan = self.ex.plan();
        plan.steps[self.pos]
            .out_specs
            .iter()
            .map(|(s, spec)| (spec, self.slots[*s as usize].as_ref()))
            .collect()
    }

    /// Every slot (the step's inputs among them).
    pub fn slots(&self) -> &[Option<Tensor>] {
        &self.slots
    }
}

/// The steps of a plan that share one [`Plan::signature`], and their time.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OpSignature {
    pub signature: String,
    /// The op's name as the trace records it.
    pub op: String,
    /// Its steps (positions in the plan), in order: the count is their number.
    pub steps: Vec<usize>,
    /// Time of all its steps (µs), from the times given to [`signatures`].
    pub us: f64,
    /// Its part of the time of every step, in `[0, 1]`.
    pub share: f64,
}

/// A plan's distinct op signatures with their steps and time, most time first (then most
/// steps, then by signature). `step_us[pos]`: the time of step `pos` (µs), such as the original
/// run's Kineto duration ([`et_graph::OriginalTiming::op_us`]) or a replay's
/// ([`crate::Report::steps`]); a missing or non-finite time counts as 0.
pub fn signatures(plan: &Plan, step_us: &[f64]) -> Vec<OpSignature> {
    let us = |pos: usize| {
        step_us
            .get(pos)
            .copied()
            .filter(|t| t.is_finite())
            .unwrap_or(0.0)
    };
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut out: Vec<OpSignature> = Vec::new();
    for (pos, signature) in plan.signatures().into_iter().enumerate() {
        let k = *index.entry(signature).or_insert_with_key(|signature| {
            out.push(OpSignature {
                signature: signature.clone(),
                op: plan.steps[pos].name.clone(),
                steps: Vec::new(),
                us: 0.0,
                share: 0.0,
            });
            out.len() - 1
        });
        out[k].steps.push(pos);
        out[k].us += us(pos);
    }
    let total: f64 = out.iter().map(|s| s.us).sum();
    for s in &mut out {
        s.share = if total > 0.0 { s.us / total } else { 0.0 };
    }
    out.sort_by(|a, b| {
        b.us.total_cmp(&a.us)
            .then(b.steps.len().cmp(&a.steps.len()))
            .then_with(|| a.signature.cmp(&b.signature))
    });
    out
}
