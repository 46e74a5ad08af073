//! Executing a bound plan: materialise the external inputs once, then run one step at a time
//! (a boxed call with its slots, a float32 retry where the device lacks a half kernel, autograd
//! as the original recorded it), and the loop of warm-up, measured and instrumented iterations.
//! What happened is handed to a `Recorder`, which builds the [`Report`].

use crate::bind::{Bound, Exec};
use crate::device::{Device, Timer};
use crate::error::{CallError, ErrorKind, ReplayError};
use crate::ffi::{self, Comm, Stack};
use crate::options::ReplayOptions;
use crate::plan::{Arg, Fill, Out, Plan, TensorSpec, ViewKind};
use crate::recorder::{GpuSamples, Recorder, Timed};
use crate::report::{NonFinite, Report};
use metrics::Timeline;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use tch::{Kind, Tensor};

pub(crate) fn kind_of(d: et_schema::DType) -> Kind {
    use et_schema::DType as D;
    match d {
        D::UInt8 => Kind::Uint8,
        D::Int8 => Kind::Int8,
        D::Int16 => Kind::Int16,
        D::Int32 => Kind::Int,
        D::Int64 => Kind::Int64,
        D::Float16 => Kind::Half,
        D::Float64 => Kind::Double,
        D::Bool => Kind::Bool,
        D::BFloat16 => Kind::BFloat16,
        D::Complex64 => Kind::ComplexFloat,
        D::Complex128 => Kind::ComplexDouble,
        _ => Kind::Float,
    }
}

/// What one iteration is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Runs, not measured (caches, allocator, autograd state warm up).
    WarmUp,
    /// Timed and reported.
    Measured,
    /// Under the capture's instrumentation, in one profiling session, to warm it up (the
    /// profiler's and the observer's first events in a session cost more, as in the
    /// capture's first profiled iteration); not recorded.
    InstrumentedWarmUp,
    /// More iterations under the capture's instrumentation (ET observer + Kineto, or what the
    /// capture had), to read each step's profiled window; not timed.
    Instrumented,
    /// The last one under the instrumentation, not recorded: before each step, one event
    /// without arguments and two such as autograd records for a backward node are timed, each
    /// alone, between the replay's ops (what the capture's events in its gaps cost here). With
    /// `probe_mechanisms`, first an op called as Python calls one, and before some steps
    /// autograd's engine running a few nodes.
    InstrumentedProbe,
    /// With `probe_mechanisms`, a plain iteration just before the instrumented ones, not
    /// recorded: the op and the autograd nodes of the probe iteration timed where they are
    /// timed there, without the instrumentation (the probes' own time, which the difference
    /// takes out).
    PlainProbe,
}

impl Phase {
    /// Under the capture's instrumentation.
    pub fn instrumented(self) -> bool {
        matches!(
            self,
            Phase::InstrumentedWarmUp | Phase::Instrumented | Phase::InstrumentedProbe
        )
    }
}

impl Phase {
    /// The phase of iteration `it` of a run with `opts`.
    pub fn of(it: usize, opts: &ReplayOptions) -> Phase {
        let total = total_iterations(opts);
        let k = instrumented(opts);
        if it + k == total {
            Phase::InstrumentedWarmUp
        } else if k > 0 && opts.probe_mechanisms && it + k + 1 == total {
            Phase::PlainProbe
        } else if k > 0 && it + 1 == total {
            Phase::InstrumentedProbe
        } else if it + k > total {
            Phase::Instrumented
        } else if it >= opts.warmup {
            Phase::Measured
        } else {
            Phase::WarmUp
        }
    }
}

fn total_iterations(opts: &ReplayOptions) -> usize {
    let k = instrumented(opts);
    // The plain probe iteration before the instrumented ones.
    opts.warmup + opts.iters.max(1) + k + usize::from(k > 0 && opts.probe_mechanisms)
}

/// Instrumented iterations at the end of a run: the session's warm-up, the recorded ones and
/// the probe.
fn instrumented(opts: &ReplayOptions) -> usize {
    if opts.instrument {
        opts.instrument_iters.max(1) + 2
    } else {
        0
    }
}

/// How a step's op ran: as recorded, or by a detour the replay device needs (reported per op).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Via {
    /// The op's own kernel on the replay device.
    Kernel,
    /// In float32: the device has no half-precision kernel for it.
    Float32,
    /// On the CPU: the op has no kernel on the replay device at all (a CPU trace's
    /// `_scaled_dot_product_flash_attention_for_cpu_backward`, `mkldnn_rnn_layer_backward` on a
    /// CUDA replay). Its inputs are copied to the CPU, its outputs back, and what it writes in
    /// place is written back.
    Cpu,
    /// As `aten::reshape`: a `view` whose input the replay device's kernels laid out otherwise
    /// than the trace's device (attention outputs), where a view of those strides cannot exist.
    /// The original's `.contiguous()` before it was a no-op there and is not in the trace;
    /// here it copies, as it would have on this device.
    Reshape,
}

/// How one step went.
#[derive(Debug)]
pub enum Outcome {
    /// The op ran (`via`: how); `grad_refused`: plain, autograd having refused to record it
    /// (why).
    Ran {
        via: Via,
        grad_refused: Option<String>,
    },
    /// Passed through without a call (a no-op on this device, or left out by `--only`).
    PassedThrough,
    Failed(CallError),
}

/// Runs a bound plan's steps on slots of tensors. Holds the external inputs (materialised once;
/// they persist across iterations, carrying in-place updates as parameters do).
pub struct Executor<'a> {
    plan: &'a Plan,
    bound: &'a Bound,
    stack: Stack,
    /// Steps whose autograd recording libtorch refused: they run plain from then on.
    no_grad: Vec<bool>,
    /// Per step, the detour ([`Via::Cpu`], [`Via::Reshape`]) its first call needed: later calls
    /// take it at once instead of failing first.
    detour: Vec<Via>,
    /// `aten::reshape`, found on the first [`Via::Reshape`].
    reshape: Option<Arc<ffi::Op>>,
    /// Per step on the [`Via::Cpu`] detour, the argument positions its schema writes.
    cpu_writes: HashMap<usize, Vec<usize>>,
    externals: Vec<Option<Tensor>>,
    /// Outputs of steps left out by `--only`, synthesised once and kept like external inputs,
    /// so that leaving a step out costs its dependants nothing per iteration.
    stand_ins: Vec<Option<Tensor>>,
    /// This rank's process groups, when collectives run for real.
    comm: Option<Comm>,
    /// How long a collective's work may take.
    timeout: std::time::Duration,
    /// Bytes of the CUDA arena the external inputs live in (0: none).
    arena_bytes: u64,
    /// Per step, small outputs of `empty*` ops to fill with ones after the call (see
    /// [`small_empties`]).
    fill_ones: Vec<Vec<crate::plan::Slot>>,
    /// Collectives' outstanding work, by the step that waits for it.
    pending: HashMap<usize, Vec<ffi::Works>>,
    /// Per slot: it holds NaN/Inf by the trace's design (a mask filled with `-inf`), which
    /// `--check-values` does not report ([`Executor::produced_nonfinite`]).
    by_design: Vec<bool>,
}

/// Applies [`Plan::device_placement`] to the materialised external inputs.
fn place_for_device(plan: &Plan, externals: &mut [Option<Tensor>]) {
    let (to_host, to_float) =
        plan.device_placement(&|s| externals.get(s).is_some_and(Option::is_some));
    for s in to_host {
        if let Some(t) = externals[s].as_mut() {
            if let Ok(c) = t.f_to_device(tch::Device::Cpu) {
                *t = c;
            }
        }
    }
    for s in to_float {
        if let Some(t) = externals.get_mut(s).and_then(Option::as_mut) {
            if matches!(t.kind(), Kind::Half | Kind::BFloat16) {
                if let Ok(c) = t.f_to_kind(Kind::Float) {
                    *t = c;
                }
            }
        }
    }
}

/// Outputs of `empty*` ops small enough to be Python scalars made tensors
/// (`torch.tensor(1.0)` records `aten::empty`, then an untraced copy of the value, then
/// `aten::to`): the replay has no value to copy, and the memory's garbage (3.6e17 in a bf16
/// GPT's optimizer step counters) would flow on. They get ones, which no consumer divides by
/// zero or overflows with; large `empty` buffers are written by the ops that follow and are
/// left alone (filling them would cost time the original did not spend).
fn small_empties(plan: &Plan) -> Vec<Vec<crate::plan::Slot>> {
    const EMPTY: &[&str] = &[
        "aten::empty",
        "aten::empty_strided",
        "aten::new_empty",
        "aten::new_empty_strided",
        "aten::empty_like",
    ];
    plan.steps
        .iter()
        .map(|s| {
            if !EMPTY.contains(&s.name.as_str()) {
                return Vec::new();
            }
            s.out_specs
                .iter()
                .filter(|(_, spec)| spec.shape.iter().product::<i64>() <= 64)
                .map(|(slot, _)| *slot)
                .collect()
        })
        .collect()
}

impl<'a> Executor<'a> {
    /// Sets the process up as a warm model's and materialises the external inputs (with
    /// `autograd`, the parameters require grad). Every way of running a plan starts here.
    pub fn new(plan: &'a Plan, bound: &'a Bound, autograd: bool) -> Result<Self, ReplayError> {
        Self::running(plan, bound, autograd, et_graph::Kind::All)
    }

    /// [`Executor::new`] for the steps `only` runs: external inputs that only left-out steps
    /// read are not materialised (a comm-only replay of a large model holds what its
    /// collectives need, not the model).
    pub fn running(
        plan: &'a Plan,
        bound: &'a Bound,
        autograd: bool,
        only: et_graph::Kind,
    ) -> Result<Self, ReplayError> {
        bound.device.setup_process()?;
        let needed = (only != et_graph::Kind::All).then(|| {
            let mut needed = vec![false; plan.n_slots];
            for (pos, step) in plan.steps.iter().enumerate() {
                if step.kind.included(only) {
                    for s in bound.args(plan, pos).iter().flat_map(Arg::slots) {
                        needed[s as usize] = true;
                    }
                }
            }
            needed
        });
        let (mut externals, arena_bytes) = materialise(plan, &bound.device, needed.as_deref())?;
        if bound.device != Device::Cpu {
            place_for_device(plan, &mut externals);
        }
        if autograd {
            require_grad(plan, &mut externals);
        }
        Ok(Executor {
            plan,
            bound,
            stack: Stack::default(),
            no_grad: vec![false; plan.steps.len()],
            detour: vec![Via::Kernel; plan.steps.len()],
            reshape: None,
            cpu_writes: HashMap::new(),
            stand_ins: (0..plan.n_slots).map(|_| None).collect(),
            comm: None,
            timeout: std::time::Duration::from_secs(60),
            externals,
            arena_bytes,
            fill_ones: small_empties(plan),
            pending: HashMap::new(),
            by_design: vec![false; plan.n_slots],
        })
    }

    /// Runs collectives through these process groups, each waited for at most `timeout`.
    pub fn with_comm(mut self, comm: Comm, timeout: std::time::Duration) -> Self {
        self.comm = Some(comm);
        self.timeout = timeout;
        self
    }

    /// This process's rank and the world size, when collectives run for real.
    pub fn rank(&self) -> Option<(usize, usize)> {
        self.comm.as_ref().map(|c| (c.rank, c.size))
    }

    pub fn device(&self) -> &Device {
        &self.bound.device
    }

    /// The plan this executor runs.
    pub fn plan(&self) -> &'a Plan {
        self.plan
    }

    /// Waits for the collectives whose work step `pos` waits for (a `wait` record), or with
    /// `pos == None` for every outstanding one (an iteration's end).
    pub fn wait_pending(&mut self, pos: Option<usize>) -> Result<(), CallError> {
        let due: Vec<ffi::Works> = match pos {
            Some(p) => self.pending.remove(&p).unwrap_or_default(),
            None => self.pending.drain().flat_map(|(_, w)| w).collect(),
        };
        for w in due {
            w.wait(self.timeout)?;
        }
        Ok(())
    }

    /// Slots holding step `pos`'s inputs: fresh slots after steps `0..pos` ran once as in an
    /// iteration (each settled, a failed one's outputs synthesised, dead slots freed). What
    /// [`crate::single::SingleStep`] runs one step on. Costs the steps before `pos`.
    pub fn prepare(&mut self, pos: usize, autograd: bool) -> Vec<Option<Tensor>> {
        let mut slots = self.fresh_slots();
        for p in 0..pos.min(self.plan.steps.len()) {
            self.make_views(p, &mut slots);
            let outcome = self.step(p, &mut slots, autograd);
            self.settle(p, &mut slots, &outcome);
            self.free(p, &mut slots);
        }
        slots
    }

    /// The external inputs, by slot (`None` for the other slots).
    pub fn externals(&self) -> &[Option<Tensor>] {
        &self.externals
    }

    /// Slots at the start of an iteration: the external inputs (shared, so in-place updates
    /// carry over), intermediates empty.
    pub fn fresh_slots(&self) -> Vec<Option<Tensor>> {
        self.externals
            .iter()
            .map(|t| t.as_ref().map(|t| t.shallow_clone()))
            .collect()
    }

    /// Makes the views step `pos` reads ([`crate::plan::Step::views`]) of their bases as they are
    /// now: bookkeeping before the step, outside its time, as the original's autograd unpacks
    /// what it saved before the backward op runs. A view that cannot be made leaves its slot
    /// empty (the step then reports the missing input).
    pub fn make_views(&self, pos: usize, slots: &mut [Option<Tensor>]) {
        for v in &self.plan.steps[pos].views {
            let made = slots[v.base as usize].as_ref().and_then(|base| {
                // Not a step of the model's graph: no autograd node for the view itself.
                let _guard = tch::no_grad_guard();
                match v.kind {
                    ViewKind::Strided => {
                        base.f_as_strided(&v.spec.shape, &v.spec.strides, None::<i64>)
                    }
                    ViewKind::LogSoftmax { dim } => base.f_log_softmax(dim, base.kind()),
                    ViewKind::Softmax { dim } => base.f_softmax(dim, base.kind()),
                    ViewKind::AttentionLogsumexp { key, causal, scale } => {
                        let key = slots[key as usize].as_ref()?;
                        attention_logsumexp(base, key, causal, scale)
                            .and_then(|l| l.f_to_kind(kind_of(v.spec.dtype)))
                    }
                    ViewKind::WeightNormNorms { g, dim } => {
                        let g = slots[g as usize].as_ref()?;
                        Tensor::f_internal_weight_norm_interface(base, g, dim)
                            .and_then(|(_, norms)| norms.f_to_kind(kind_of(v.spec.dtype)))
                    }
                }
                .ok()
            });
            slots[v.slot as usize] = made;
        }
    }

    /// Runs step `pos` on `slots`, with autograd when `autograd` and the original recorded it:
    /// the call(s) and their outputs, what a timer brackets. [`Executor::settle`] finishes it.
    pub fn step(&mut self, pos: usize, slots: &mut [Option<Tensor>], autograd: bool) -> Outcome {
        // A reference with the bound plan's lifetime, not a clone: no refcount traffic per op.
        let bound = self.bound;
        let op = match &bound.steps[pos].exec {
            Exec::Call(op) => op,
            Exec::PassThrough => {
                self.pass_through(pos, slots);
                return Outcome::PassedThrough;
            }
            Exec::Fail(e) => return Outcome::Failed(e.clone()),
        };
        let grad = autograd && self.plan.steps[pos].autograd && !self.no_grad[pos];
        match self.call(pos, op, slots, grad) {
            // Autograd refuses some calls the original made without it (an in-place op on an
            // input the replay made a parameter): those run plain from then on, reported.
            Err(e) if grad => {
                self.stack.clear();
                match self.call(pos, op, slots, false) {
                    Ok(via) => {
                        self.no_grad[pos] = true;
                        Outcome::Ran {
                            via,
                            grad_refused: Some(first_line(&e.message)),
                        }
                    }
                    Err(e) => Outcome::Failed(e),
                }
            }
            Ok(via) => Outcome::Ran {
                via,
                grad_refused: None,
            },
            Err(e) => Outcome::Failed(e),
        }
    }

    /// After a step, outside its timing: releases the call's stack and synthesises a failed
    /// op's outputs from the recorded specs, so that dependants still run.
    pub fn settle(&mut self, pos: usize, slots: &mut [Option<Tensor>], outcome: &Outcome) {
        self.stack.clear();
        if matches!(outcome, Outcome::Failed(_)) {
            self.fill_missing_outputs(pos, slots);
        }
        if !self.fill_ones[pos].is_empty() {
            for &s in &self.fill_ones[pos] {
                if let Some(t) = &mut slots[s as usize] {
                    let _ = t.f_fill_(1.0);
                }
            }
        }
    }

    /// A step that is not run: outputs that are inputs of the same tensor pass through, the
    /// rest are synthesised from the recorded specs.
    pub fn pass_through(&self, pos: usize, slots: &mut [Option<Tensor>]) {
        self.pass_inputs(pos, slots);
        self.fill_missing_outputs(pos, slots);
    }

    /// Outputs that are new versions of an input (same tensor) take the input's tensor.
    fn pass_inputs(&self, pos: usize, slots: &mut [Option<Tensor>]) {
        for (from, to) in &self.plan.steps[pos].passthrough {
            slots[*to as usize] = slots[*from as usize].as_ref().map(|t| t.shallow_clone());
        }
    }

    /// A step left out by `--only`: outputs that are inputs pass through, the others get
    /// stand-ins made on first use and kept.
    pub fn leave_out(&mut self, pos: usize, slots: &mut [Option<Tensor>]) {
        self.pass_inputs(pos, slots);
        let plan = self.plan;
        for (s, spec) in &plan.steps[pos].out_specs {
            let s = *s as usize;
            if slots[s].is_none() {
                if self.stand_ins[s].is_none() {
                    self.stand_ins[s] = self.bound.device.synthesise(spec);
                }
                slots[s] = self.stand_ins[s].as_ref().map(|t| t.shallow_clone());
            }
        }
    }

    /// Drops the slots whose last use is step `pos`.
    #[inline]
    pub fn free(&self, pos: usize, slots: &mut [Option<Tensor>]) {
        for s in &self.plan.steps[pos].frees {
            slots[*s as usize] = None;
        }
    }

    fn fill_missing_outputs(&self, pos: usize, slots: &mut [Option<Tensor>]) {
        for (s, spec) in &self.plan.steps[pos].out_specs {
            if slots[*s as usize].is_none() {
                slots[*s as usize] = self.bound.device.synthesise(spec);
            }
        }
    }

    /// One call of step `pos`, by the detour it needs where the device cannot run it as
    /// recorded ([`Via`]): an op with no kernel on the device runs on the CPU; one with no
    /// kernel for its half-precision inputs runs in float32 (those inputs cast up, outputs cast
    /// back to the recorded dtype); a `view` the device's layouts cannot make runs as
    /// `reshape`. Returns how it ran.
    fn call(
        &mut self,
        pos: usize,
        op: &ffi::Op,
        slots: &mut [Option<Tensor>],
        grad: bool,
    ) -> Result<Via, CallError> {
        match self.detour[pos] {
            Via::Cpu => return self.call_on_cpu(pos, op, slots, grad).map(|()| Via::Cpu),
            Via::Reshape => {
                return self
                    .call_as_reshape(pos, slots, grad)
                    .map(|()| Via::Reshape)
            }
            Via::Kernel | Via::Float32 => {}
        }
        let args = self.bound.args(self.plan, pos);
        let comm = self.comm.as_ref();
        let collective = self.plan.steps[pos].kind.is_collective();
        let autocast = self.plan.steps[pos].autocast;
        let device = self.bound.device.tch();
        let first = push_args(&mut self.stack, args, slots, op, &self.bound.device, comm)
            .and_then(|()| match autocast {
                Some(d) => self
                    .stack
                    .call_autocast(op, grad, device, d.scalar_type_code() as i32),
                None => self.stack.call(op, grad),
            })
            // A collective's work completes before anything reads its tensors (the trace's
            // own waits then find it done).
            .and_then(|()| {
                if !collective {
                    return Ok(());
                }
                // Where the trace waits for this collective later (a PARAM `wait` record), its
                // work stays outstanding until then, overlapping what runs in between as in
                // the original; else it completes before anything reads its tensors.
                let later = match &self.plan.steps[pos].kind {
                    crate::plan::StepKind::Collective(c) => {
                        c.waits.iter().copied().filter(|&w| w > pos).min()
                    }
                    _ => None,
                };
                match later {
                    Some(w) => {
                        if let Some(works) = self.stack.take_works() {
                            self.pending.entry(w).or_default().push(works);
                        }
                        Ok(())
                    }
                    None => self.stack.wait_works(self.timeout),
                }
            });
        match first {
            Ok(()) => {
                if !take_outputs(&self.stack, &self.plan.steps[pos].outs, slots) {
                    self.fill_missing_outputs(pos, slots);
                }
                Ok(Via::Kernel)
            }
            // No kernel on this device at all ("Could not run 'aten::X' with arguments from
            // the 'CUDA' backend"): a CPU-only op of a CPU trace. The CPU has one.
            Err(e)
                if matches!(self.bound.device, Device::Cuda(_))
                    && e.kind == ErrorKind::NotImplemented
                    && e.message.contains("'CUDA' backend")
                    && !collective =>
            {
                self.stack.clear();
                self.call_on_cpu(pos, op, slots, grad)
                    .map_err(|e2| CallError::new(e.kind, format!("{e} (and on the CPU: {e2})")))?;
                self.detour[pos] = Via::Cpu;
                Ok(Via::Cpu)
            }
            Err(e)
                if self.plan.steps[pos].name == "aten::view"
                    && e.message.contains("view size is not compatible") =>
            {
                self.stack.clear();
                self.call_as_reshape(pos, slots, grad)
                    .map_err(|e2| CallError::new(e.kind, format!("{e} (and as reshape: {e2})")))?;
                self.detour[pos] = Via::Reshape;
                Ok(Via::Reshape)
            }
            // No kernel for this dtype (NotImplemented), or linear algebra's check that refuses
            // low precision (a plain error): worth a float32 try only when the step has
            // half-precision inputs. Other plain errors (autograd refusing an in-place write,
            // shape errors) are not dtype gaps.
            Err(e)
                if (e.kind == ErrorKind::NotImplemented
                    || (e.kind == ErrorKind::Other && is_linalg(&self.plan.steps[pos].name)))
                    && has_half_input(args, slots) =>
            {
                let up = |t: &Tensor| {
                    if matches!(t.kind(), Kind::Half | Kind::BFloat16) {
                        t.to_kind(Kind::Float)
                    } else {
                        t.shallow_clone()
                    }
                };
                // Only this step's arguments are cast (it reads nothing else), not every slot.
                let mut view: Vec<Option<Tensor>> = (0..slots.len()).map(|_| None).collect();
                for s in args.iter().flat_map(Arg::slots) {
                    view[s as usize] = slots[s as usize].as_ref().map(up);
                }
                self.stack.clear();
                push_args(&mut self.stack, args, &view, op, &self.bound.device, comm)?;
                self.stack
                    .call(op, grad)
                    .map_err(|e2| CallError::new(e.kind, format!("{e} (and in float32: {e2})")))?;
                take_outputs(&self.stack, &self.plan.steps[pos].outs, &mut view);
                for (s, spec) in &self.plan.steps[pos].out_specs {
                    if let Some(t) = view[*s as usize].take() {
                        slots[*s as usize] = Some(t.to_kind(kind_of(spec.dtype)));
                    }
                }
                self.fill_missing_outputs(pos, slots);
                Ok(Via::Float32)
            }
            Err(e) => Err(e),
        }
    }

    /// Step `pos` on the CPU ([`Via::Cpu`]): its tensor arguments copied there, its outputs
    /// copied back to the device, and the arguments its schema writes (`Tensor(a!)`) written
    /// back into the device's tensors.
    fn call_on_cpu(
        &mut self,
        pos: usize,
        op: &ffi::Op,
        slots: &mut [Option<Tensor>],
        grad: bool,
    ) -> Result<(), CallError> {
        let args = self.bound.args(self.plan, pos);
        let fail = |e: tch::TchError| CallError::new(ErrorKind::Other, e.to_string());
        let mut view: Vec<Option<Tensor>> = (0..slots.len()).map(|_| None).collect();
        for s in args.iter().flat_map(Arg::slots) {
            if let Some(t) = &slots[s as usize] {
                view[s as usize] = Some(t.f_to_device(tch::Device::Cpu).map_err(fail)?);
            }
        }
        push_args(&mut self.stack, args, &view, op, &Device::Cpu, None)?;
        self.stack.call(op, grad)?;
        let mut outs: Vec<Option<Tensor>> = (0..slots.len()).map(|_| None).collect();
        take_outputs(&self.stack, &self.plan.steps[pos].outs, &mut outs);
        self.stack.clear();
        // What the op wrote in place goes back where the rest of the replay reads it.
        // The schema's written arguments, read once per step (the detour runs every iteration).
        let writes = self
            .cpu_writes
            .entry(pos)
            .or_insert_with(|| {
                et_schema::OpSchema::parse(&op.schema())
                    .map(|sc| {
                        sc.args
                            .iter()
                            .enumerate()
                            .filter(|(_, a)| a.ty.is_write())
                            .map(|(k, _)| k)
                            .collect()
                    })
                    .unwrap_or_default()
            })
            .clone();
        {
            // A write-back, not a step of the model's graph; the outputs' copies below stay
            // differentiable, as the op's own outputs were.
            let _guard = tch::no_grad_guard();
            for k in writes {
                for s in args.get(k).into_iter().flat_map(Arg::slots) {
                    if let (Some(dst), Some(src)) = (&mut slots[s as usize], &view[s as usize]) {
                        dst.f_copy_(src).map_err(fail)?;
                    }
                }
            }
        }
        let dev = self.bound.device.tch();
        for (s, _) in &self.plan.steps[pos].out_specs {
            if let Some(t) = outs[*s as usize].take() {
                // An output that is an argument written in place is that argument's tensor.
                let same = args.iter().flat_map(Arg::slots).find(|&a| {
                    view[a as usize].as_ref().is_some_and(|v| {
                        t.numel() > 0
                            && v.data_ptr() == t.data_ptr()
                            && v.size() == t.size()
                            && v.stride() == t.stride()
                    })
                });
                slots[*s as usize] = Some(match same.and_then(|a| slots[a as usize].as_ref()) {
                    Some(d) => d.shallow_clone(),
                    None => t.f_to_device(dev).map_err(fail)?,
                });
            }
        }
        self.fill_missing_outputs(pos, slots);
        Ok(())
    }

    /// Step `pos`, an `aten::view`, as `aten::reshape` of the same arguments ([`Via::Reshape`]).
    fn call_as_reshape(
        &mut self,
        pos: usize,
        slots: &mut [Option<Tensor>],
        grad: bool,
    ) -> Result<(), CallError> {
        let op = match &self.reshape {
            Some(op) => op.clone(),
            None => {
                let op = Arc::new(ffi::Op::find("aten::reshape", "")?);
                self.reshape = Some(op.clone());
                op
            }
        };
        let args = self.bound.args(self.plan, pos);
        push_args(&mut self.stack, args, slots, &op, &self.bound.device, None)?;
        self.stack.call(&op, grad)?;
        if !take_outputs(&self.stack, &self.plan.steps[pos].outs, slots) {
            self.fill_missing_outputs(pos, slots);
        }
        Ok(())
    }

    /// Whether a float tensor step `pos` touched holds NaN/Inf after it that the trace did not
    /// ask for: its outputs, and its inputs, which in-place ops write (`_foreach_add_` returns
    /// nothing). Allocating ops (`empty*`) are skipped: their outputs hold whatever the memory
    /// held.
    ///
    /// Infinities a model makes on purpose are not a divergence: a step given an infinite
    /// number (`full(size, -inf)` for a causal mask, `masked_fill(m, -inf)`), or an input that
    /// holds infinities by design, may write infinities; its outputs that hold them are marked
    /// (per slot, kept across iterations), and excused where they are read while they still
    /// hold them (a softmax over masked scores is finite again, and checked again downstream).
    /// A NaN is reported unless the step was given a NaN number: an overflow that meets a mask
    /// (`inf - inf`) is still a divergence. Without it a transformer decoder's mask made every
    /// replay report NaN/Inf at its first op.
    pub fn produced_nonfinite(&mut self, pos: usize, slots: &[Option<Tensor>]) -> bool {
        let step = &self.plan.steps[pos];
        if step.name.contains("empty") {
            return false;
        }
        let args = self.bound.args(self.plan, pos);
        let inputs: Vec<crate::plan::Slot> = args.iter().flat_map(Arg::slots).collect();
        let by_design = &mut self.by_design;
        let nan_asked = args.iter().any(|a| a.passes_number(f64::is_nan));
        let inf_asked = args.iter().any(|a| a.passes_number(f64::is_infinite))
            || inputs.iter().any(|&s| by_design[s as usize]);
        let flags =
            |s: crate::plan::Slot| slots[s as usize].as_ref().map_or((false, false), nan_inf);
        let mut diverged = false;
        for (s, _) in &step.out_specs {
            let (nan, inf) = flags(*s);
            diverged |= nan && !nan_asked;
            if inf && !by_design[*s as usize] {
                if inf_asked {
                    by_design[*s as usize] = true;
                } else {
                    diverged = true;
                }
            }
        }
        for &s in &inputs {
            let (nan, inf) = flags(s);
            diverged |= (nan && !nan_asked) || (inf && !inf_asked && !by_design[s as usize]);
        }
        diverged
    }
}

/// Linear algebra ops, whose CPU kernels refuse half precision with a plain error.
fn is_linalg(op: &str) -> bool {
    let base = op.trim_start_matches("aten::").trim_start_matches('_');
    base.starts_with("linalg_")
        || matches!(
            base,
            "inverse" | "det" | "logdet" | "slogdet" | "cholesky" | "cholesky_inverse" | "pinverse"
        )
}

fn has_half_input(args: &[Arg], slots: &[Option<Tensor>]) -> bool {
    args.iter()
        .flat_map(Arg::slots)
        .filter_map(|s| slots[s as usize].as_ref())
        .any(|t| matches!(t.kind(), Kind::Half | Kind::BFloat16))
}

/// Allocates the external inputs (those `needed`, by slot; all when `None`): one allocation per
/// trace storage (on CUDA carved from one arena), views into it, values that suit their
/// consumers (random floats; valid indices; sorted offsets). Returns them by slot, and the
/// arena's size (0 without one).
pub fn materialise(
    plan: &Plan,
    device: &Device,
    needed: Option<&[bool]>,
) -> Result<(Vec<Option<Tensor>>, u64), ReplayError> {
    let mut slots: Vec<Option<Tensor>> = (0..plan.n_slots).map(|_| None).collect();
    // Group by (storage, dtype): views of one storage share one allocation.
    let mut groups: BTreeMap<(u64, et_schema::DType), Vec<usize>> = BTreeMap::new();
    for (k, (slot, spec, _)) in plan.externals.iter().enumerate() {
        if needed.is_some_and(|n| !n[*slot as usize]) {
            continue;
        }
        groups
            .entry((spec.storage, spec.dtype))
            .or_default()
            .push(k);
    }
    let flats: Vec<(TensorSpec, Vec<usize>)> = groups
        .into_iter()
        .map(|((_, dtype), members)| {
            let extent = members
                .iter()
                .map(|&k| plan.externals[k].1.extent())
                .max()
                .unwrap_or(0)
                .max(1);
            let flat = TensorSpec {
                shape: vec![extent],
                strides: vec![1],
                dtype,
                storage: 0,
                offset: 0,
            };
            (flat, members)
        })
        .collect();
    // On CUDA, one arena for them all, each storage at a 256-byte boundary (what cudaMalloc
    // guarantees, and more than any kernel's vector loads need).
    let align = |b: u64| b.div_ceil(256).saturating_mul(256);
    let total = flats
        .iter()
        .map(|(f, _)| align(f.bytes()))
        .fold(0u64, u64::saturating_add);
    let arena = usize::try_from(total).ok().and_then(|t| device.arena(t));
    let mut offset = 0u64;
    for (flat, members) in flats {
        let dtype = flat.dtype;
        let mut base = match &arena {
            Some(a) => a.tensor(offset as usize, &flat),
            None => device.empty_strided(&flat),
        }
        .map_err(ReplayError::Materialise)?;
        offset += align(flat.bytes());
        // Floats get standard normal values, scaled per view below; integers and bools start
        // at zero and index inputs are filled per view below.
        if matches!(
            dtype,
            et_schema::DType::BFloat16 | et_schema::DType::Float16
        ) {
            // Drawn in float32 and rounded: libtorch's half-precision normal_ draws its uniforms
            // in half precision too, and about one value in 150 comes out exactly 0 (bf16). An
            // optimizer's second moment of 0 beside a non-zero first moment then divides by its
            // eps alone: a bf16 GPT's AdamW step blew its weights to 2e4 and its next backward
            // to NaN.
            // In chunks: a float32 copy of a whole large buffer would need twice its memory.
            const CHUNK: i64 = 1 << 24;
            let n = flat.shape[0];
            let mut at = 0;
            while at < n {
                let len = CHUNK.min(n - at);
                // At least 1e-3 away from 0: a float32 draw closer than 2^-25 rounds to an
                // exact half-precision 0, and scaling per view (1/sqrt(fan-in)) by more again.
                let drawn = Tensor::f_randn([len], (Kind::Float, base.device())).and_then(|r| {
                    let mag = r.f_abs()?.f_clamp_min(1e-3)?;
                    let r = mag.f_where_self(&r.f_ge(0.0)?, &mag.f_neg()?)?;
                    base.f_narrow(0, at, len)?.f_copy_(&r)
                });
                if let Err(e) = drawn {
                    log::warn!("random half-precision input: {e}; zeros instead");
                    let _ = base.f_narrow(0, at, n - at).and_then(|mut t| t.f_zero_());
                    break;
                }
                at += len;
            }
        } else if dtype.is_floating_point() {
            if base.f_normal_(0.0, 1.0).is_err() {
                let _ = base.f_zero_();
            }
        } else {
            let _ = base.zero_();
        }
        for k in members {
            let (slot, spec, fill) = &plan.externals[k];
            let mut view = base
                .f_as_strided(spec.shape.as_slice(), spec.strides.as_slice(), spec.offset)
                .map_err(|e| {
                    ReplayError::Materialise(CallError::new(ErrorKind::Other, e.to_string()))
                })?;
            fill_view(&mut view, spec, fill, device);
            // The trace records a Python number passed to a Tensor overload (`-0.5 * kl` is
            // `mul.Tensor(kl, <0-dim double>)`) as a plain tensor, but PyTorch wrapped it, and
            // type promotion ignores a wrapped number's dtype. Left plain, the 0-dim double made
            // the product of a 0-dim float double, and every op downstream failed on it
            // (a VAE's KL term: its backward's `mm`, `mse_loss_backward`, Adam's `lerp_`).
            if spec.is_wrapped_number() {
                if let Err(e) = ffi::set_wrapped_number(&mut view) {
                    log::warn!("a 0-dim input could not be marked a wrapped number: {e}");
                }
            }
            slots[*slot as usize] = Some(view);
        }
    }
    Ok((slots, arena.map_or(0, |a| a.bytes as u64)))
}

/// A fused attention's log-sum-exp ([`ViewKind::AttentionLogsumexp`]) over query `q` and key
/// `k` (`[B, H, L, E]`, `[B, H, S, E]`): on CPU the flash kernel's own, run with the key as the
/// values too (the log-sum-exp does not read them), in O(L) memory; elsewhere
/// `logsumexp((q @ k^T) * scale, -1)` in float, the upper triangle (key after query) masked
/// out when `causal`, as the CPU kernel masks it. An error (never a panic) for other shapes: a
/// stored plan may hold anything.
fn attention_logsumexp(
    q: &Tensor,
    k: &Tensor,
    causal: bool,
    scale: Option<f64>,
) -> Result<Tensor, tch::TchError> {
    let (qs, ks) = (q.size(), k.size());
    if qs.len() != 4 || ks.len() != 4 || qs[0] != ks[0] || qs[1] != ks[1] || qs[3] != ks[3] {
        return Err(tch::TchError::Shape(format!(
            "attention log-sum-exp of query {qs:?} and key {ks:?}"
        )));
    }
    if q.device() == tch::Device::Cpu {
        let (_, lse) = Tensor::f_internal_scaled_dot_product_flash_attention_for_cpu(
            q,
            k,
            k,
            0.0,
            causal,
            None::<Tensor>,
            scale,
        )?;
        return Ok(lse);
    }
    let q = q.f_to_kind(tch::Kind::Float)?;
    let k = k.f_to_kind(tch::Kind::Float)?;
    let scores = q
        .f_matmul(&k.f_transpose(-2, -1)?)?
        .f_mul_scalar(scale.unwrap_or(1.0 / (qs[3].max(1) as f64).sqrt()))?;
    let scores = if causal {
        let above =
            Tensor::f_ones([qs[2], ks[2]], (tch::Kind::Bool, scores.device()))?.f_triu(1)?;
        scores.f_masked_fill(&above, f64::NEG_INFINITY)?
    } else {
        scores
    };
    scores.f_logsumexp([-1i64].as_slice(), false)
}

/// Whether a float tensor holds NaN, and whether it holds an infinity.
fn nan_inf(t: &Tensor) -> (bool, bool) {
    if !t.is_floating_point() {
        return (false, false);
    }
    let any = |m: Result<Tensor, tch::TchError>| {
        m.and_then(|m| m.f_any())
            .is_ok_and(|a| a.int64_value(&[]) != 0)
    };
    (any(t.f_isnan()), any(t.f_isinf()))
}

/// Whether a float tensor holds NaN or Inf.
pub(crate) fn nonfinite(t: &Tensor) -> bool {
    let (nan, inf) = nan_inf(t);
    nan || inf
}

/// Marks the plan's grad inputs (the parameters) as requiring grad, as the model's were, each
/// its own autograd base as an `nn.Parameter` is: a leaf detached from the storage's arena
/// tensor it was made a view of (it shares the storage). A view of the arena passes the arena's
/// flag (no grad) to the views ops take of it under no-grad mode, where a parameter's views
/// require grad, and kernels read the flag: `matmul` folds a batched input into one `mm` when
/// an operand requires grad, and runs a `bmm` otherwise (attention pooling's key projection
/// with a split of `in_proj_weight`: 19-20 us folded, 41-54 us as a bmm).
fn require_grad(plan: &Plan, externals: &mut [Option<Tensor>]) {
    for &s in &plan.grad_inputs {
        if let Some(t) = &mut externals[s as usize] {
            let Ok(mut own) = t.f_detach() else { continue };
            if ffi::set_requires_grad(&mut own).is_ok() {
                *t = own;
            }
        }
    }
}

/// Shapes a view's values for its consumer. Best effort: libtorch refuses in-place writes to a
/// view whose elements overlap (an expanded input, stride 0), and such a view keeps the values
/// of its storage (standard normal floats, zero integers: valid indices). Only Tensor-argument
/// calls here: tch's Scalar-taking ones panic when libtorch reports an error.
fn fill_view(view: &mut Tensor, spec: &TensorSpec, fill: &Fill, device: &Device) {
    let kind = kind_of(spec.dtype);
    let dev = device.tch();
    // Random values at the scale of an initialised model (std 1/sqrt(fan-in), like PyTorch's
    // default inits): activations keep their magnitude through a deep stack of layers instead
    // of growing by sqrt(fan-in) x std per layer to Inf (a 30-layer 1024-wide MLP did at 0.1),
    // and no value is denormal.
    if matches!(fill, Fill::Random | Fill::NonNegative) && spec.dtype.is_floating_point() {
        let fan_in = match spec.shape.as_slice() {
            [] | [_] => 100,
            [rows, ..] => (spec.shape.iter().product::<i64>() / (*rows).max(1)).max(1),
        };
        let _ = view.f_mul_(&device.scalar(1.0 / (fan_in as f64).sqrt()));
    }
    let src = match fill {
        Fill::Random => return,
        // Integer storages start at zero; float ones are random.
        Fill::Zeros => {
            if spec.dtype.is_floating_point() {
                let _ = view.f_zero_();
            }
            return;
        }
        Fill::Value(v) => {
            let _ = view.f_fill_tensor_(&device.scalar(*v));
            return;
        }
        Fill::NonNegative => {
            let _ = view.f_abs_();
            return;
        }
        Fill::Indices(bound) => {
            Tensor::f_randint_low(0, (*bound).max(1), spec.shape.as_slice(), (kind, dev))
        }
        Fill::Probability => {
            let _ = view.f_uniform_(0.0, 1.0);
            return;
        }
        Fill::Ints(values) => Tensor::f_from_slice(values)
            .and_then(|t| t.f_reshape(spec.shape.as_slice()))
            .and_then(|t| t.f_to_device(dev))
            .and_then(|t| t.f_to_kind(kind)),
        Fill::Sorted(x) => {
            // Each row (along the last dimension) from -x to x.
            let n = spec.shape.last().copied().unwrap_or(1).max(1);
            Tensor::f_linspace(-*x, *x, n, (kind, dev))
                .and_then(|t| t.f_expand(spec.shape.as_slice(), false))
                .and_then(|t| t.f_contiguous())
        }
        Fill::Offsets(total) => {
            let n = spec.shape.iter().product::<i64>().max(1);
            let step = (*total / n).max(0);
            Tensor::f_arange(n, (kind, dev))
                .and_then(|t| t.f_mul(&Tensor::from(step).to_device(dev)))
                .and_then(|t| t.f_reshape(spec.shape.as_slice()))
        }
    };
    if let Ok(src) = src {
        let _ = view.f_copy_(&src);
    }
}

fn push_args(
    stack: &mut Stack,
    args: &[Arg],
    slots: &[Option<Tensor>],
    op: &ffi::Op,
    device: &Device,
    comm: Option<&Comm>,
) -> Result<(), CallError> {
    // The stack is empty here: every call path clears it after use (`settle`) or before a
    // retry, so no FFI call is spent clearing it again.
    debug_assert!(stack.is_empty());
    for a in args {
        match a {
            Arg::Tensor(s) => match &slots[*s as usize] {
                Some(t) => stack.tensor(t),
                None => stack.undefined_tensor(),
            },
            Arg::UndefinedTensor => stack.undefined_tensor(),
            Arg::None => stack.none(),
            Arg::TensorList { slots: l, optional } => {
                let v: Vec<Option<&Tensor>> = l
                    .iter()
                    .map(|s| s.and_then(|s| slots[s as usize].as_ref()))
                    .collect();
                if *optional {
                    stack.opt_tensor_list(&v)
                } else {
                    stack.tensor_list(&v)
                }
            }
            Arg::TensorLists(lists) => {
                let v: Vec<Vec<Option<&Tensor>>> = lists
                    .iter()
                    .map(|l| {
                        l.iter()
                            .map(|s| s.and_then(|s| slots[s as usize].as_ref()))
                            .collect()
                    })
                    .collect();
                stack.tensor_lists(&v)
            }
            Arg::Int(i) => stack.int(*i),
            Arg::Double(f) => stack.double(*f),
            Arg::Bool(b) => stack.bool(*b),
            Arg::Str(s) => stack.string(s),
            Arg::IntList(v) => stack.int_list(v),
            Arg::DoubleList(v) => stack.double_list(v),
            Arg::BoolList(v) => stack.bool_list(v),
            Arg::ScalarInt(i) => stack.scalar_int(*i),
            Arg::ScalarDouble(f) => stack.scalar_double(*f),
            Arg::ScalarBool(b) => stack.scalar_bool(*b),
            Arg::ScalarList(v) => stack.scalar_list(v),
            Arg::Device => device.push_arg(stack),
            Arg::ProcessGroup(g) => match comm {
                Some(c) => stack.group(c, *g as i64)?,
                None => {
                    return Err(CallError::unsupported(
                        "a collective needs its peers: replay every rank together \
                         (mystique replay --ranks DIR) or this one under torchrun (RANK, WORLD_SIZE)",
                    ))
                }
            },
            Arg::ReduceOp(op) => stack.reduce_op(*op),
            Arg::Default(k) => stack.default_of(op, *k)?,
        }
    }
    Ok(())
}

/// Puts the results of a call into their slots; returns false if they do not match the trace.
fn take_outputs(stack: &Stack, outs: &[Out], slots: &mut [Option<Tensor>]) -> bool {
    let mut ok = true;
    for (k, out) in outs.iter().enumerate() {
        if k >= stack.len() {
            ok &= matches!(out, Out::Ignore);
            continue;
        }
        match (out, stack.kind(k)) {
            (Out::Tensor(s), ffi::Kind::Tensor) => slots[*s as usize] = Some(stack.take_tensor(k)),
            (Out::List(ss), ffi::Kind::TensorList) => {
                for (s, t) in ss.iter().zip(stack.take_list(k)) {
                    if let Some(s) = s {
                        slots[*s as usize] = Some(t);
                    }
                }
            }
            (Out::List(ss), ffi::Kind::TensorLists) => {
                for (s, t) in ss.iter().zip(stack.take_flat(k)) {
                    if let Some(s) = s {
                        slots[*s as usize] = Some(t);
                    }
                }
            }
            (Out::Ignore, _) => {}
            _ => ok = false,
        }
    }
    ok
}

/// Bytes of the distinct storages the slots hold.
pub(crate) fn live_bytes(slots: &[Option<Tensor>]) -> u64 {
    let mut seen: HashMap<usize, usize> = HashMap::new();
    for t in slots.iter().flatten() {
        let (p, n) = ffi::storage_info(t);
        if p != 0 {
            seen.insert(p, n);
        }
    }
    seen.values().map(|&n| n as u64).sum()
}

pub(crate) fn first_line(s: &str) -> String {
    let l = s.lines().next().unwrap_or("").trim();
    if l.len() > 300 {
        format!(
            "{}...",
            &l[..l.char_indices().nth(300).map_or(l.len(), |c| c.0)]
        )
    } else {
        l.to_string()
    }
}

/// Runs a bound plan: materialise, warm-up, measured and (optionally) instrumented iterations;
/// returns the report and (with `trace_out`) the op slices of the last measured iteration.
pub fn run(
    plan: &Plan,
    bound: &Bound,
    opts: &ReplayOptions,
) -> Result<(Report, Timeline), ReplayError> {
    let cpu = metrics::cpu::CpuSampler::new();
    let needed = plan.peak_bytes_estimate(opts.only);
    if let Some(available) = bound.device.available_memory() {
        if needed > available && !opts.force {
            return Err(ReplayError::Memory { needed, available });
        }
    }
    if opts.progress {
        eprintln!(
            "[replay] materialising {} external inputs (about {:.1} MiB; peak about {:.1} MiB) ...",
            plan.externals.len(),
            plan.external_bytes() as f64 / (1 << 20) as f64,
            needed as f64 / (1 << 20) as f64
        );
    }
    log::info!(
        "plan: {} steps, {} slots, {} external inputs ({:.1} MiB), estimated peak {:.1} MiB",
        plan.steps.len(),
        plan.n_slots,
        plan.externals.len(),
        plan.external_bytes() as f64 / (1 << 20) as f64,
        needed as f64 / (1 << 20) as f64
    );
    let t0 = std::time::Instant::now();
    let mut ex = Executor::running(plan, bound, opts.autograd, opts.only)?;
    log::info!("materialised in {:.3} s", t0.elapsed().as_secs_f64());
    if let Some(d) = &opts.dist {
        if plan
            .steps
            .iter()
            .any(|s| s.kind.is_collective() && s.kind.included(opts.only))
        {
            if opts.progress {
                eprintln!(
                    "[replay] rank {} of {}: joining at {}:{} ...",
                    d.rank, d.world_size, d.master_addr, d.master_port
                );
            }
            ex = ex.with_comm(crate::dist::connect(plan, d, &bound.device)?, d.timeout);
        }
    }
    let mut rec = Recorder::new(plan, opts, live_bytes(ex.externals()), cpu);
    rec.cuda_comm = ex.comm.as_ref().map(|c| c.cuda);
    let mut gaps = opts
        .gaps_us
        .as_deref()
        .filter(|g| g.len() == plan.steps.len())
        .map(|us| Gaps {
            us,
            pace: opts
                .gaps_base_us
                .as_deref()
                .filter(|b| b.len() == plan.steps.len())
                .map(GapPace::new),
        });
    let mut timer = bound.device.timer();
    let sampler = gpu_sampler(&bound.device, opts, &timer);
    let total = total_iterations(opts);
    // Pacing: the pace and the measured iterations of the running block (`None` between
    // blocks), while the pacer lets it go on.
    let mut pacing = opts
        .pace
        .as_ref()
        .filter(|p| p.every > 0)
        .map(|p| (p, None::<usize>));
    // The instrumented iterations run in one profiling session, as the capture's profiled
    // iterations did: a session's first events cost more (the first embedding_bag of a fresh
    // session took 2 ms under the profiler alone, 30 µs warm), and a session per iteration
    // had every instrumented iteration pay that where the capture paid it once.
    let mut instr: Option<ffi::Instrumentation> = None;
    let mut recorded: Vec<Vec<(usize, f64)>> = Vec::new();
    // What the session's warm-up iteration dispatched: its events open the profile, and are
    // matched (to be passed over) before the recorded iterations'.
    let mut warm_up: Option<Vec<(usize, f64)>> = None;
    for it in 0..total {
        let phase = Phase::of(it, opts);
        if let (Some((pace, None)), Phase::Measured) = (pacing, phase) {
            pacing = pace.pacer.start().then_some((pace, Some(0)));
        }
        if phase.instrumented() && instr.is_none() {
            // Room for the session's records on pages already faulted in: 64 KiB per step and
            // instrumented iteration (the profiler's records of an op and its nested events
            // take a few KiB), at least 64 MiB.
            crate::device::warm_heap(
                (plan.steps.len() * (opts.instrument_iters + 1) * (64 << 10))
                    .clamp(64 << 20, 1 << 30),
            );
            match ffi::Instrumentation::start(bound.device.cuda().is_some(), opts.instrumentation) {
                Ok(i) => instr = Some(i),
                // The measured iterations stand; only the profiled windows are missing.
                Err(e) => {
                    rec.instrument_error = Some(e);
                    break;
                }
            }
        }
        let dispatched = iteration(
            &mut ex,
            &mut rec,
            &mut timer,
            it,
            phase,
            gaps.as_mut()
                .filter(|_| opts.alternation(it).is_none_or(|(spun, _)| spun)),
            opts,
        )?;
        if let Some((pace, Some(n))) = pacing {
            // A block ends at its size or with the measured phase.
            let n = n + 1;
            let ends = n == pace.every || Phase::of(it + 1, opts) != Phase::Measured;
            if ends {
                pace.pacer.end(n);
            }
            pacing = Some((pace, (!ends).then_some(n)));
        }
        if let (Some(_), Phase::InstrumentedWarmUp) = (&instr, phase) {
            warm_up = Some(dispatched);
        } else if let (Some(_), Phase::Instrumented) = (&instr, phase) {
            recorded.push(dispatched);
        }
        if opts.progress {
            rec.progress(it, total, phase);
        }
        log::debug!("iteration {}/{total} ({phase:?}) done", it + 1);
    }
    if let Some(i) = instr {
        match i.finish() {
            Ok(profile) => rec.profiled(&profile, warm_up.as_deref(), &recorded),
            Err(e) => rec.instrument_error = Some(e),
        }
    }
    let gpu = GpuSamples {
        sampled: match sampler {
            Some(Ok((s, period_ms))) => {
                let (name, gpm) = (s.device_name.clone(), s.gpm);
                Ok((name, period_ms, gpm, s.stop()))
            }
            Some(Err(why)) => Err(Some(why)),
            None => Err(None),
        },
        arena_bytes: ex.arena_bytes,
    };
    Ok(rec.finish(ex.externals(), ex.device(), ex.rank(), bound, gpu))
}

/// On CUDA, NVML sampling of the replay's GPU on the timer's clock (and its period in ms), or
/// why not; `None` on CPU.
fn gpu_sampler(
    device: &Device,
    opts: &ReplayOptions,
    timer: &Timer,
) -> Option<Result<(metrics::gpu::NvmlSampler, f64), String>> {
    let rt = device.cuda()?;
    if opts.nvml_period_ms == 0 {
        return Some(Err("NVML sampling is off (--nvml-period 0)".into()));
    }
    let period = std::time::Duration::from_millis(opts.nvml_period_ms);
    let gpu = if rt.uuid.is_empty() {
        metrics::gpu::GpuSelect::Index(rt.ordinal as u32)
    } else {
        metrics::gpu::GpuSelect::Uuid(rt.uuid.clone())
    };
    Some(
        metrics::gpu::NvmlSampler::start(gpu, period, timer.clock())
            .map(|s| (s, opts.nvml_period_ms as f64)),
    )
}

/// The gaps to emulate before each step, and how they follow the host's speed.
struct Gaps<'a> {
    us: &'a [f64],
    pace: Option<GapPace>,
}

/// The host's speed now against when the gaps were calibrated, as the replay's own ops show
/// it: each iteration's weighted median (by the calibrated time) of its ops' time over their
/// calibrated time, and the median of those over the last iterations that hold at least
/// [`GapPace::WINDOW_US`] of calibrated op time. Medians, so that an op that lost a time slice
/// (a busy host) or a cold one does not move it; no system call (a read of the run delay
/// between iterations would be a point where a busy host's scheduler preempts the replay).
pub(crate) struct GapPace {
    base: Vec<f64>,
    /// (the iteration's ratio, its calibrated op time), oldest first.
    recent: std::collections::VecDeque<(f64, f64)>,
    /// What the gaps are multiplied by.
    pub factor: f64,
    scratch: Vec<(f64, f64)>,
}

impl GapPace {
    /// Calibrated op time the factor is taken over (µs): several of a VM's speed spells'
    /// worth of ops would lag them, a few ops are noise.
    const WINDOW_US: f64 = 20_000.0;
    const MAX_ITERATIONS: usize = 64;
    /// A factor outside this is not a host's speed but a broken calibration.
    const BOUNDS: (f64, f64) = (0.5, 2.0);

    fn new(base: &[f64]) -> GapPace {
        GapPace {
            base: base.to_vec(),
            recent: std::collections::VecDeque::new(),
            factor: 1.0,
            scratch: Vec::new(),
        }
    }

    fn update(&mut self, timer: &Timer, timed: &[Timed]) {
        self.scratch.clear();
        for t in timed {
            let base = self.base[t.pos];
            let live = timer.host_at(t.end) - timer.host_at(t.start) - t.waited_us;
            if base > 0.0 && live > 0.0 && live.is_finite() {
                self.scratch.push((live / base, base));
            }
        }
        let Some(ratio) = et_graph::weighted_median(&mut self.scratch) else {
            return;
        };
        let weight: f64 = self.scratch.iter().map(|&(_, w)| w).sum();
        self.push(ratio, weight);
    }

    fn push(&mut self, ratio: f64, weight: f64) {
        self.recent.push_back((ratio, weight));
        // Drop the oldest while the rest still hold the window.
        let mut total: f64 = self.recent.iter().map(|&(_, w)| w).sum();
        while let Some(&(_, w)) = self.recent.front() {
            if self.recent.len() > Self::MAX_ITERATIONS || total - w >= Self::WINDOW_US {
                total -= w;
                self.recent.pop_front();
            } else {
                break;
            }
        }
        let ratios: Vec<f64> = self.recent.iter().map(|&(r, _)| r).collect();
        self.factor = metrics::Stats::of(&ratios)
            .median
            .clamp(Self::BOUNDS.0, Self::BOUNDS.1);
    }
}

/// Spins until `until` (µs on the timer's host clock) in running time: busy, like the Python and
/// autograd work an emulated gap stands for, and, like that work, not done while the thread is
/// descheduled. A poll that took a time slice or more ([`et_graph::SLICE_MIN_US`]: far longer
/// than an interrupt) means another process had the core, and the deadline moves by that
/// long; the original's Python, descheduled, would still have had its work to do after. So a
/// busy host slows the emulated gaps as it slows the ops, and the gaps are given in running
/// time (the gap model measures the host's speed without the time it waited for a CPU).
fn spin_running(timer: &Timer, mut until: f64) -> Spin {
    let began = timer.host_us();
    let (mut prev, mut moved) = (began, 0.0);
    while prev < until {
        std::hint::spin_loop();
        let now = timer.host_us();
        if now - prev >= et_graph::SLICE_MIN_US {
            until += now - prev;
            moved += now - prev;
        }
        prev = now;
    }
    Spin {
        began,
        ended: prev,
        moved,
    }
}

/// What [`spin_running`] did, on the timer's host clock (µs): when it began and ended (its own
/// first and last reads, so that no reads of the clock are added around it), and how far the
/// deadline moved for the time the thread was descheduled.
#[derive(Clone, Copy, Debug)]
struct Spin {
    began: f64,
    ended: f64,
    moved: f64,
}

/// The time outside the ops an iteration has spent beyond its emulated gaps so far (µs), owed
/// back by the gaps after. A gap is spun from the end of the op before, the replay's
/// bookkeeping in between (frees, its stacks) counting toward it; where the bookkeeping alone
/// takes longer than the gap (a large free before a short gap), the gap is over before the
/// spin starts, and each such step added its excess to the iteration: the outside time came
/// out as the sum over the steps of the larger of the two, where the model (the anchor's
/// total) is the larger of the two sums. Over the zoo's anchored replays the time outside
/// the ops ran a median 2.8% over what was meant (up to 14-18% for the recurrent models,
/// whose backward frees many tensors at a few steps; twenty-second session). Owed back, the
/// iteration's total is the model's where a later gap has room for it.
#[derive(Debug, Default)]
struct Owed(f64);

impl Owed {
    /// When the gap of `want` µs before an op, counted from `from` (the op before's end), ends.
    fn deadline(&self, from: f64, want: f64) -> f64 {
        from + (want - self.0).max(0.0)
    }

    /// After a gap of `want`: `spent`, the running time from the op before's end to now, of
    /// which `before_spin` passed before the spin began. A stretch before the spin of a time
    /// slice or more was the thread waiting for a CPU (as the spin itself leaves out), not the
    /// replay's work: it owes nothing.
    fn settle(&mut self, want: f64, spent: f64, before_spin: f64) {
        if before_spin < et_graph::SLICE_MIN_US {
            self.0 = (self.0 + spent - want).max(0.0);
        }
    }
}

/// One iteration over every step. Returns the steps dispatched, with the time the thread
/// waited for a CPU inside each (for the instrumented iteration's profile).
fn iteration(
    ex: &mut Executor,
    rec: &mut Recorder,
    timer: &mut Timer,
    it: usize,
    phase: Phase,
    mut gaps: Option<&mut Gaps>,
    opts: &ReplayOptions,
) -> Result<Vec<(usize, f64)>, ReplayError> {
    let factor = gaps
        .as_ref()
        .and_then(|g| g.pace.as_ref())
        .map_or(1.0, |p| p.factor);
    let plan = ex.plan;
    let measured = phase == Phase::Measured;
    if measured && gaps.as_ref().is_some_and(|g| g.pace.is_some()) {
        rec.gap_factors.push(factor);
    }
    let mut slots = ex.fresh_slots();
    let mut dispatched = Vec::new();
    // Every call's marks, resolved after the iteration.
    let mut timed: Vec<Timed> = Vec::with_capacity(plan.steps.len());
    let mut excluded_us = 0.0;
    timer.clear();
    let waited_at_start = rec.waited_us();
    let start = timer.mark();
    // A gap is the time from the previous op's end to this op's start: the replay's own
    // bookkeeping in between (frees, stack handling) counts toward it, as the original's
    // tensor frees count toward its gaps.
    let mut last_op_end = timer.host_at(start);
    let mut last_progress = last_op_end;
    let mut owed = Owed::default();
    rec.begin_iteration(phase);
    for (pos, step) in plan.steps.iter().enumerate() {
        if !step.kind.included(opts.only) {
            // Not part of what is measured: neither its gap nor its bookkeeping.
            let t = timer.host_us();
            ex.leave_out(pos, &mut slots);
            rec.skipped();
            ex.free(pos, &mut slots);
            let spent = timer.host_us() - t;
            excluded_us += spent;
            last_op_end += spent;
            continue;
        }
        if !ex.pending.is_empty() {
            if let Err(e) = ex.wait_pending(Some(pos)) {
                let rank = ex.rank().map_or(0, |r| r.0);
                return Err(ReplayError::Dist {
                    rank,
                    what: format!(
                        "waiting for a collective at {} (node {})",
                        step.name, step.id
                    ),
                    source: e,
                });
            }
        }
        // Views computed again (a softmax, an attention's log-sum-exp) are work the original's
        // autograd did not do here (it saved them): out of the timings.
        let computed = plan.steps[pos].views.iter().any(|v| !v.kind.is_strided());
        let t_views = computed.then(|| timer.host_us());
        ex.make_views(pos, &mut slots);
        if let Some(t) = t_views {
            let spent = timer.host_us() - t;
            excluded_us += spent;
            last_op_end += spent;
        }
        if let Some(g) = &gaps {
            // Counted from the previous op's end: the bookkeeping since is part of the gap.
            let want = g.us[pos] * factor;
            let s = spin_running(timer, owed.deadline(last_op_end, want));
            owed.settle(want, s.ended - last_op_end - s.moved, s.began - last_op_end);
        }
        let probing =
            opts.probe_mechanisms && matches!(phase, Phase::InstrumentedProbe | Phase::PlainProbe);
        if probing && opts.probe_op {
            // First, where the original's next op call started (right after the previous op);
            // on a short trace, again, for some 256 samples in all.
            for _ in 0..256usize.div_ceil(plan.steps.len().max(1)).min(32) {
                rec.op_probed(phase.instrumented(), ffi::probe_op_us());
            }
        }
        if phase == Phase::InstrumentedProbe {
            // One event at a time, where the capture's fell (between ops, the replay's data
            // in the caches), not a loop of them: back to back the profiler's records stay hot.
            rec.probed_in_context(
                ffi::probe_scope_us(0),
                ffi::probe_scope_us(1),
                ffi::probe_scope_us(4),
            );
        }
        // The engine's nodes before about 32 steps spread over the iteration (each probe runs
        // 17 nodes).
        if probing && pos % plan.steps.len().div_ceil(32).max(1) == 0 {
            rec.nodes_probed(phase.instrumented(), ffi::probe_nodes_us());
        }
        if matches!(ex.bound.steps[pos].exec, Exec::PassThrough) {
            ex.pass_through(pos, &mut slots);
            rec.ran(it, pos, Via::Kernel, None);
            ex.free(pos, &mut slots);
            // The original ran this op between its two gaps: the next gap counts from here, or
            // the time spun for this one would count toward it too.
            last_op_end = timer.host_us();
            continue;
        }
        // Read outside the marks: the reads' own cost is the replay's, between steps.
        let read_waits = opts
            .running_time_steps
            .as_ref()
            .is_none_or(|m| m.get(pos).copied().unwrap_or(true));
        let waited0 = if read_waits { rec.waited_us() } else { None };
        let t0 = timer.mark();
        let outcome = ex.step(pos, &mut slots, opts.autograd);
        let t1 = timer.mark();
        let waited_us = rec.waited_since(waited0);
        last_op_end = timer.host_at(t1);
        if phase.instrumented() {
            dispatched.push((pos, waited_us));
        }
        // A failed op's time is not an op's time: it stays out of the per-op figures and the
        // iteration's.
        if matches!(outcome, Outcome::Failed(_)) {
            excluded_us += timer.host_at(t1) - timer.host_at(t0);
        } else {
            timed.push(Timed {
                pos,
                start: t0,
                end: t1,
                waited_us,
            });
        }
        ex.settle(pos, &mut slots, &outcome);
        match outcome {
            Outcome::Ran { via, grad_refused } => rec.ran(it, pos, via, grad_refused),
            Outcome::PassedThrough => rec.ran(it, pos, Via::Kernel, None),
            Outcome::Failed(e) => {
                // A failed collective leaves the ranks out of step: every later one would hang.
                if let (Some((rank, _)), true) = (ex.rank(), step.kind.is_collective()) {
                    return Err(ReplayError::Dist {
                        rank,
                        what: format!("collective {} (node {}) failed", step.name, step.id),
                        source: e,
                    });
                }
                if e.kind == ErrorKind::DeviceFault {
                    return Err(ReplayError::DeviceFault {
                        op: step.name.clone(),
                        id: step.id,
                        source: e,
                    });
                }
                if opts.strict {
                    return Err(ReplayError::Strict {
                        op: step.name.clone(),
                        id: step.id,
                        source: e,
                    });
                }
                rec.failed(it, pos, &e);
            }
        }
        // Kept out of the timings: value checks read every output, and counting live
        // storages (first iteration) walks every slot. Not in the instrumented iteration:
        // the checks' own ops would be among the profiler's events.
        let check = opts.check_values && !phase.instrumented() && !rec.found_nonfinite();
        if check || it == 0 {
            let t_untimed = timer.host_us();
            if check && ex.produced_nonfinite(pos, &slots) {
                rec.nonfinite(NonFinite {
                    op: step.name.clone(),
                    id: step.id,
                    iteration: it,
                });
            }
            if it == 0 {
                rec.live(live_bytes(&slots));
            }
            let spent = timer.host_us() - t_untimed;
            excluded_us += spent;
            last_op_end += spent;
        }
        ex.free(pos, &mut slots);
        // Long iterations say where they are (every 5 s, checked every 1024 steps).
        if opts.progress && pos % 1024 == 1023 {
            let now = timer.host_us();
            if now - last_progress >= 5e6 {
                rec.progress_within(it, pos + 1, plan.steps.len(), now - timer.host_at(start));
                last_progress = timer.host_us();
                excluded_us += last_progress - now;
                last_op_end += last_progress - now;
            }
        }
    }
    if let Err(e) = ex.wait_pending(None) {
        return Err(ReplayError::Dist {
            rank: ex.rank().map_or(0, |r| r.0),
            what: "waiting for the iteration's outstanding collectives".into(),
            source: e,
        });
    }
    let end = timer.mark();
    timer.resolve();
    if let Some(p) = gaps.as_mut().and_then(|g| g.pace.as_mut()) {
        p.update(timer, &timed);
    }
    // The host's view of the iteration, up to the device finishing it (for NVML's samples).
    let window = (timer.host_at(start), timer.host_us());
    // In running time (`running_time`), without the time the thread waited for a CPU.
    let waited_us = rec.waited_since(waited_at_start);
    let wall_us = timer.us(end) - timer.us(start) - excluded_us - waited_us;
    if measured {
        rec.measured(
            timer,
            &timed,
            wall_us,
            window,
            it + 1 == total_iterations(opts) - instrumented(opts),
        );
    }
    rec.end_iteration(phase, wall_us);
    Ok(dispatched)
}

/// Every slot after a run, and the (op, reason) of each failure.
pub type Kept = (Vec<Option<Tensor>>, Vec<(String, String)>);

/// Runs a bound plan once without freeing anything and returns every slot and the failures:
/// for tests and tools that inspect the values a replay produced.
pub fn run_once_keep(plan: &Plan, bound: &Bound) -> Result<Kept, ReplayError> {
    run_once_keep_as(plan, bound, None)
}

/// [`run_once_keep`] as one rank of several (collectives run for real).
pub fn run_once_keep_as(
    plan: &Plan,
    bound: &Bound,
    dist: Option<&crate::DistOptions>,
) -> Result<Kept, ReplayError> {
    let mut ex = Executor::new(plan, bound, true)?;
    if let Some(d) = dist {
        ex = ex.with_comm(crate::dist::connect(plan, d, &bound.device)?, d.timeout);
    }
    let mut slots = std::mem::take(&mut ex.externals);
    let mut failures = Vec::new();
    for (pos, step) in plan.steps.iter().enumerate() {
        if let Err(e) = ex.wait_pending(Some(pos)) {
            failures.push((step.name.clone(), e.message));
        }
        ex.make_views(pos, &mut slots);
        let outcome = ex.step(pos, &mut slots, true);
        ex.settle(pos, &mut slots, &outcome);
        if let Outcome::Failed(e) = outcome {
            failures.push((step.name.clone(), e.message));
        }
    }
    if let Err(e) = ex.wait_pending(None) {
        failures.push(("(outstanding collectives)".into(), e.message));
    }
    Ok((slots, failures))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[test]
    fn an_emulated_gap_is_spun_in_running_time() {
        let Some(delay) = metrics::cpu::RunDelay::of_this_thread() else {
            return;
        };
        // More spinning threads than cores: this one waits for a CPU now and then.
        let stop = Arc::new(AtomicBool::new(false));
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let rivals: Vec<_> = (0..cores + 1)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        let timer = Device::Cpu.timer();
        let target_us = 100_000.0;
        let (w0, t0) = (delay.read_us().unwrap(), timer.host_us());
        let moved = spin_running(&timer, t0 + target_us).moved;
        let (w1, t1) = (delay.read_us().unwrap(), timer.host_us());
        stop.store(true, Ordering::Relaxed);
        for r in rivals {
            r.join().unwrap();
        }
        let (wall, waited) = (t1 - t0, w1 - w0);
        assert!(
            moved <= wall - target_us + 1.0,
            "moved {moved} us in {wall} us"
        );
        // The time it waited in slices came on top of the gap, not out of it (the short waits
        // of a wake-up preemption, under a slice, are not seen: half of it at least).
        assert!(
            wall >= target_us + waited / 2.0,
            "spun {wall} us for a {target_us} us gap, waiting {waited} us"
        );
    }

    #[test]
    fn bookkeeping_longer_than_a_gap_is_owed_back_by_the_gaps_after() {
        let mut o = Owed::default();
        // A 10 µs gap after a free that took 30: the gap was over before the spin began.
        assert_eq!(o.deadline(100.0, 10.0), 110.0);
        o.settle(10.0, 30.0, 30.0);
        assert_eq!(o.0, 20.0);
        // The next 50 µs gap ends 20 µs early, and it spends 30 of running time.
        assert_eq!(o.deadline(200.0, 50.0), 230.0);
        o.settle(50.0, 30.0, 1.0);
        assert_eq!(o.0, 0.0);
        // Owed more than a gap: that gap is not spun at all, the rest stays owed.
        o.settle(5.0, 45.0, 45.0);
        assert_eq!(o.deadline(300.0, 15.0), 300.0);
        o.settle(15.0, 2.0, 2.0);
        assert_eq!(o.0, 27.0);
        // A slice's wait before the spin is not the replay's work: nothing more is owed.
        o.settle(15.0, 2_000.0, et_graph::SLICE_MIN_US);
        assert_eq!(o.0, 27.0);
        // A gap with room for it pays back all that is owed, and nothing goes below zero.
        o.settle(100.0, 10.0, 1.0);
        assert_eq!(o.0, 0.0);
    }

    #[test]
    fn gap_pace_follows_the_ops_by_medians_over_a_window() {
        let mut p = GapPace::new(&[100.0, 10.0]);
        assert_eq!(p.factor, 1.0);
        // An iteration's ratio is its ops' weighted median: the 100 µs op's, not the other's.
        let mut v = vec![(1.5, 100.0), (9.0, 10.0)];
        assert_eq!(et_graph::weighted_median(&mut v), Some(1.5));
        assert_eq!(et_graph::weighted_median(&mut []), None);
        // Iterations slower by 1.5: the gaps stretch as much.
        for _ in 0..10 {
            p.push(1.5, 110.0);
        }
        assert_eq!(p.factor, 1.5);
        // One iteration that lost a time slice does not move the median.
        p.push(8.0, 110.0);
        assert_eq!(p.factor, 1.5);
        // At most MAX_ITERATIONS are kept: a faster host takes over once they are.
        for _ in 0..GapPace::MAX_ITERATIONS {
            p.push(0.8, 110.0);
        }
        assert_eq!(p.factor, 0.8);
        assert_eq!(p.recent.len(), GapPace::MAX_ITERATIONS);
        // Long iterations: the window holds as few as cover WINDOW_US of calibrated time.
        let mut q = GapPace::new(&[]);
        for _ in 0..5 {
            q.push(1.2, GapPace::WINDOW_US);
        }
        assert_eq!(q.recent.len(), 1);
        // A ratio no host's speed explains is bounded.
        q.push(50.0, GapPace::WINDOW_US);
        assert_eq!(q.factor, GapPace::BOUNDS.1);
    }
}
