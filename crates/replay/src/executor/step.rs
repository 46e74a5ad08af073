//! One step of the plan: its views made, its boxed call (a float32 retry where the device lacks
//! a half kernel, a reshape where a view cannot be made, autograd as the original recorded it),
//! its outputs settled, its slots freed.

use super::materialise::{
    attention_logsumexp, nan_inf, place_for_device, require_grad, small_empties,
};
use super::stack::{push_args, take_outputs};
use super::*;

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
        // A communication-only replay materialises nothing: its collectives' tensors come from
        // the pool as they run.
        let pooled = only == et_graph::Kind::Comm;
        let needed = (only != et_graph::Kind::All).then(|| {
            let mut needed = vec![false; plan.n_slots];
            for (pos, step) in plan.steps.iter().enumerate() {
                if step.kind.included(only) && !pooled {
                    for s in bound.args(plan, pos).iter().flat_map(Arg::slots) {
                        needed[s as usize] = true;
                    }
                }
                // Views are made whatever steps run (one may be placed on a step left out, for
                // a step that runs), and their bases may be external inputs no step reads.
                if !pooled {
                    for s in step.views.iter().flat_map(|v| v.reads()) {
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
        let mut ex = Executor {
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
            pool: pooled.then(|| super::pool::Pool::new(plan)),
            graph_release: {
                let mut at = vec![false; plan.steps.len()];
                for &p in plan.graph_releases.iter().filter(|_| autograd) {
                    if let Some(x) = at.get_mut(p) {
                        *x = true;
                    }
                }
                at
            },
            graph_released: 0,
            complete_each: false,
            barrier_op: None,
            rebalanced: HashMap::new(),
            probed_calls: None,
            guards: crate::guard::of_steps(plan, bound),
            written_in_place: {
                let mut w = vec![false; plan.n_slots];
                for (from, _) in plan.steps.iter().flat_map(|s| &s.passthrough) {
                    if let Some(x) = w.get_mut(*from as usize) {
                        *x = true;
                    }
                }
                w
            },
        };
        ex.prepare_left_out(only);
        Ok(ex)
    }

    /// What leaving steps out needs, made before any iteration (inside the first measured one
    /// it would count in that iteration's CPU time): the pool's buffers, or the stand-ins of the
    /// left-out steps' outputs that no input passes through to.
    fn prepare_left_out(&mut self, only: et_graph::Kind) {
        if only == et_graph::Kind::All {
            return;
        }
        if let Some(pool) = &mut self.pool {
            pool.prewarm(self.plan, &self.bound.device);
            return;
        }
        for step in self.plan.steps.iter().filter(|s| !s.kind.included(only)) {
            for (s, spec) in &step.out_specs {
                let passed = step.passthrough.iter().any(|(_, to)| to == s);
                if !passed && self.stand_ins[*s as usize].is_none() {
                    self.stand_ins[*s as usize] = self.bound.device.synthesise(spec);
                }
            }
        }
    }

    /// After a forward's last recorded step, the graph the forward built holds every tensor
    /// it saved for a backward the replay never runs through autograd (it runs the trace's
    /// backward ops itself): the slots take graph-free aliases of their tensors, so the graph
    /// goes and each saved tensor lives as long as the trace uses it, as the original's engine
    /// let each go once its node ran. Without it a training step held its forward's
    /// activations through the whole backward (a ResNet replay at twice its memory).
    pub(super) fn release_graph(&mut self, pos: usize, slots: &mut [Option<Tensor>]) {
        if !self.graph_release.get(pos).copied().unwrap_or(false) {
            return;
        }
        if pos == self.plan.graph_releases.first().copied().unwrap_or(pos) {
            self.graph_released = 0;
        }
        // The original's engine let its graph go without an op: the detaches are the replay's
        // bookkeeping, out of the profiler's and the observer's sight (under the capture's
        // instrumentation each cost an event, and their events came between the steps' own).
        let _unrecorded = ffi::Unrecorded::new();
        for t in slots.iter_mut().flatten() {
            if ffi::has_grad_fn(t) {
                if let Ok(d) = t.f_detach() {
                    *t = d;
                    self.graph_released += 1;
                }
            }
        }
    }

    /// Tensors that let go of the autograd graph in the last iteration
    /// ([`Executor::release_graph`]).
    pub fn graph_released(&self) -> usize {
        self.graph_released
    }

    /// With `--only comm`, the buffers the pool made and their bytes.
    pub fn pooled(&self) -> Option<(usize, u64)> {
        self.pool.as_ref().map(|p| (p.count, p.bytes))
    }

    /// With `--only comm`, fills step `pos`'s empty input slots with pooled buffers.
    pub(super) fn fill_from_pool(&mut self, pos: usize, slots: &mut [Option<Tensor>]) {
        let Some(pool) = &mut self.pool else { return };
        let step = &self.plan.steps[pos];
        let mut wanted: Vec<crate::plan::Slot> = self
            .bound
            .args(self.plan, pos)
            .iter()
            .flat_map(Arg::slots)
            .collect();
        wanted.extend(step.views.iter().map(|v| v.base));
        pool.fill(&wanted, slots, &self.bound.device);
    }

    /// With `--only comm`, drops the slots no later collective touches after step `pos`.
    pub(super) fn release_to_pool(&self, pos: usize, slots: &mut [Option<Tensor>]) {
        if let Some(pool) = &self.pool {
            pool.release(pos, slots);
        }
    }

    /// Runs collectives through these process groups, each waited for at most `timeout`.
    pub fn with_comm(mut self, comm: Comm, timeout: std::time::Duration) -> Self {
        self.comm = Some(comm);
        self.timeout = timeout;
        self
    }

    /// Every collective completes before the next step runs (blocking and checked replays).
    pub fn completing_each_collective(mut self, on: bool) -> Self {
        self.complete_each = on;
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
    /// Returns the steps whose collectives completed.
    pub fn wait_pending(&mut self, pos: Option<usize>) -> Result<Vec<usize>, CallError> {
        let due: Vec<(usize, ffi::Works)> = match pos {
            Some(p) => self.pending.remove(&p).unwrap_or_default(),
            None => self.pending.drain().flat_map(|(_, w)| w).collect(),
        };
        let mut done = Vec::with_capacity(due.len());
        for (from, w) in due {
            // The error surfaces where the trace waits, but it is the collective's.
            w.wait(self.timeout).map_err(|e| self.issued_by(from, e))?;
            done.push(from);
        }
        Ok(done)
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
        let views = &self.plan.steps[pos].views;
        if views.is_empty() {
            return;
        }
        // Not the original's ops: under the capture's instrumentation they would be events
        // the profile's steps are found among (a step's copies pushed its own event out of
        // reach) and calls the observer charges.
        let _unrecorded = ffi::Unrecorded::new();
        for v in views {
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
                    ViewKind::Copy => {
                        // With the recorded strides where they are dense; a chunk of a wider
                        // storage (a recurrent cell's gate, one of three over its row) is
                        // made dense: with its strides it would take the whole row's bytes,
                        // once per chunk the backward reads.
                        let numel: i64 = v.spec.shape.iter().product();
                        let dense = v.spec.extent() - v.spec.offset == numel;
                        let opts = (base.kind(), base.device());
                        if dense {
                            Tensor::f_empty_strided(&v.spec.shape, &v.spec.strides, opts)
                        } else {
                            Tensor::f_empty(&v.spec.shape, opts)
                        }
                        .and_then(|mut c| c.f_copy_(base).map(|_| c))
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
        if let Some(Err(e)) = self.guards[pos]
            .as_ref()
            .map(|g| g.check(bound.args(self.plan, pos), slots))
        {
            return Outcome::Failed(e);
        }
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
                    Err(e) => Outcome::Failed(self.naming_waited(pos, e)),
                }
            }
            Ok(via) => Outcome::Ran {
                via,
                grad_refused: None,
            },
            Err(e) => Outcome::Failed(self.naming_waited(pos, e)),
        }
    }

    /// `e`, step `pos`'s failure, naming the collective the step waits for where it is a wait
    /// the plan paired with one: a collective fails where the trace waits for it (a peer gone,
    /// or one that issued another collective), and the wait alone does not say which failed.
    fn naming_waited(&self, pos: usize, e: CallError) -> CallError {
        let steps = &self.plan.steps;
        let issued = steps[..pos].iter().rposition(
            |s| matches!(&s.kind, crate::plan::StepKind::Collective(c) if c.waits.contains(&pos)),
        );
        match issued {
            Some(from) => self.issued_by(from, e),
            None => e,
        }
    }

    /// `e` as the failure of the collective step `from` issued: named by its step.
    fn issued_by(&self, from: usize, e: CallError) -> CallError {
        let s = &self.plan.steps[from];
        CallError::new(e.kind, format!("{} (node {}): {}", s.name, s.id, e.message))
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
    /// rest are synthesised from the recorded specs once and kept, as the iteration's inputs
    /// are (a DataLoader batch made at its recorded size is not made anew each iteration),
    /// except those a later step writes in place: kept, those writes would build up from one
    /// iteration to the next (a batch normalised in place would grow without bound).
    pub fn pass_through(&mut self, pos: usize, slots: &mut [Option<Tensor>]) {
        self.pass_inputs(pos, slots);
        self.stand_in_outputs(pos, slots, true);
    }

    /// Step `pos`'s outputs that no input filled: stand-ins made on first use and kept (where
    /// `unless_written`, made anew each time for a slot a step writes in place).
    fn stand_in_outputs(&mut self, pos: usize, slots: &mut [Option<Tensor>], unless_written: bool) {
        let plan = self.plan;
        for (s, spec) in &plan.steps[pos].out_specs {
            let s = *s as usize;
            if slots[s].is_some() {
                continue;
            }
            if unless_written && self.written_in_place[s] {
                slots[s] = self.bound.device.synthesise(spec);
                continue;
            }
            if self.stand_ins[s].is_none() {
                self.stand_ins[s] = self.bound.device.synthesise(spec);
            }
            slots[s] = self.stand_ins[s].as_ref().map(|t| t.shallow_clone());
        }
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
        if self.pool.is_some() {
            // The collectives take their buffers from the pool.
            return;
        }
        self.pass_inputs(pos, slots);
        self.stand_in_outputs(pos, slots, false);
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
        let args = match self.rebalanced.get(&pos) {
            Some(r) => r.args.as_slice(),
            None => self.bound.args(self.plan, pos),
        };
        let comm = self.comm.as_ref();
        let collective = self.plan.steps[pos].kind.is_collective();
        let autocast = self.plan.steps[pos].autocast;
        let device = self.bound.device.tch();
        let first = push_args(&mut self.stack, args, slots, op, &self.bound.device, comm)
            .inspect(|()| {
                if let Some(calls) = self.probed_calls.as_mut() {
                    calls.push((pos, self.stack.probe_call(op, pos)));
                }
            })
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
                        // Blocking and checked replays complete each collective at once.
                        let paired = c.waits.iter().copied().filter(|&w| w > pos).min();
                        paired.filter(|_| !self.complete_each).or_else(|| {
                            // A send or receive completes at the first later step that is not
                            // one (the iteration's end at the latest): its peer may issue the
                            // matching call only after its own next point-to-point call.
                            c.is_point_to_point().then(|| {
                                // A receive's tensors are written when it completes: a later
                                // step that touches them (a send forwarding what came in)
                                // waits for it.
                                let written: Vec<crate::plan::Slot> = if c.kind() == "recv" {
                                    args.iter().flat_map(Arg::slots).collect()
                                } else {
                                    Vec::new()
                                };
                                let steps = &self.plan.steps[pos + 1..];
                                let next = steps.iter().position(|s| {
                                    let p2p = matches!(&s.kind,
                                        crate::plan::StepKind::Collective(n)
                                            if n.is_point_to_point());
                                    !p2p || s
                                        .args
                                        .iter()
                                        .flat_map(Arg::slots)
                                        .any(|x| written.contains(&x))
                                });
                                pos + 1 + next.unwrap_or(steps.len())
                            })
                        })
                    }
                    _ => None,
                };
                match later {
                    Some(w) => {
                        if let Some(works) = self.stack.take_works() {
                            self.pending.entry(w).or_default().push((pos, works));
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
pub(super) fn is_linalg(op: &str) -> bool {
    let base = op.trim_start_matches("aten::").trim_start_matches('_');
    base.starts_with("linalg_")
        || matches!(
            base,
            "inverse" | "det" | "logdet" | "slogdet" | "cholesky" | "cholesky_inverse" | "pinverse"
        )
}

pub(super) fn has_half_input(args: &[Arg], slots: &[Option<Tensor>]) -> bool {
    args.iter()
        .flat_map(Arg::slots)
        .filter_map(|s| slots[s as usize].as_ref())
        .any(|t| matches!(t.kind(), Kind::Half | Kind::BFloat16))
}
