//! The run: warm-up, measured and instrumented iterations, and one iteration's loop over the
//! steps.

use super::comms;
use super::pace::{spin_running, Gaps, Owed};
use super::*;

/// Runs a bound plan: materialise, warm-up, measured and (optionally) instrumented iterations;
/// returns the report and (with `trace_out`) the op slices of the last measured iteration.
pub fn run(
    plan: &Plan,
    bound: &Bound,
    opts: &ReplayOptions,
) -> Result<(Report, Timeline), ReplayError> {
    let cpu = metrics::cpu::CpuSampler::new();
    check_memory(plan, bound, opts)?;
    // The CPU allocator counts from here (a process-wide wrapper; tensors made before keep
    // their own deleters): the first measured iteration's memory on the profiler's basis.
    let count_memory = bound.device.cuda().is_none()
        && ffi::alloc_count_install()
            .map_err(|e| log::warn!("not counting the CPU allocator's bytes: {e}"))
            .is_ok();
    // On CUDA the caching allocator's own figures serve: its peak reset at the iteration's
    // start, as `torch.cuda.reset_peak_memory_stats` before `max_memory_allocated`.
    let cuda_index = match &bound.device {
        Device::Cuda(i) => Some(*i),
        Device::Cpu => None,
    };
    let mut first_measured = count_memory || cuda_index.is_some();
    let mut iteration_memory = None;
    let t0 = std::time::Instant::now();
    let mut ex = Executor::running(plan, bound, opts.autograd, opts.only)?;
    log::info!("materialised in {:.3} s", t0.elapsed().as_secs_f64());
    if let Some(d) = &opts.dist {
        ex = join(ex, d, opts)?;
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
            // The measured phase's CPU time and page faults end here: what follows (the heap
            // warmed for the profiler, the profiler started) is not the model's.
            rec.close_measured();
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
                    rec.instrument_error = Some(e.to_string());
                    break;
                }
            }
        }
        let counting = first_measured && phase == Phase::Measured;
        if counting {
            match cuda_index {
                Some(d) => {
                    rec.cuda_memory_base = ffi::cuda_reset_peak(d)
                        .and_then(|()| ffi::cuda_memory_stats(d))
                        .map_err(|e| log::warn!("not counting the CUDA allocator's bytes: {e}"))
                        .ok()
                        .map(|m| (d, m.allocated_bytes));
                }
                None => ffi::alloc_count_reset(),
            }
        }
        rec.keep_allocated = counting && opts.trace_out.is_some();
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
        if counting {
            first_measured = false;
            let base = rec.cuda_memory_base;
            iteration_memory = (cuda_index.is_none() || base.is_some())
                .then(|| allocated_since(base))
                .flatten()
                .map(|(now, peak)| crate::report::IterationMemory {
                    peak_over_start_bytes: peak.max(0) as u64,
                    held_after_bytes: now.max(0) as u64,
                    basis: if base.is_some() {
                        "the first measured iteration's bytes allocated through libtorch's CUDA \
                         caching allocator, at their peak over the iteration's start (as \
                         torch.cuda.max_memory_allocated after reset_peak_memory_stats counts \
                         the original's)"
                    } else {
                        "the first measured iteration's bytes allocated through c10's CPU \
                         allocator and not yet freed, at their peak (as profile_memory's Total \
                         Allocated counts the original's)"
                    },
                });
        }
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
            Ok(profile) => {
                log::debug!(
                    "instrumented iterations profiled: {} CPU events, {} GPU events",
                    profile.cpu.len(),
                    profile.gpu.len()
                );
                rec.profiled(&profile, warm_up.as_deref(), &recorded)
            }
            Err(e) => rec.instrument_error = Some(e.to_string()),
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
    let (mut report, timeline) = rec.finish(ex.externals(), ex.device(), ex.rank(), bound, gpu);
    report.estimated_peak_bytes = plan.peak_bytes_estimate(opts.only);
    report.iteration_memory = iteration_memory;
    report.timeline_origin_unix_us = timer.clock().origin_unix_us();
    report.graph_released = ex.graph_released();
    report.pool = ex
        .pooled()
        .map(|(buffers, bytes)| crate::report::PoolReport {
            buffers,
            bytes,
            estimated_bytes: plan.pooled_peak_bytes(),
        });
    Ok((report, timeline))
}

/// Refuses a replay that would not fit the device's memory (unless `force`), and says what
/// it is about to materialise.
fn check_memory(plan: &Plan, bound: &Bound, opts: &ReplayOptions) -> Result<(), ReplayError> {
    let needed = plan.peak_bytes_estimate(opts.only);
    if let Some(gate) = &opts.memory_gate {
        let comm_only = plan.peak_bytes_estimate(et_graph::Kind::Comm);
        (gate.0)(needed, comm_only).map_err(ReplayError::Stopped)?;
    }
    let available = match (&bound.device, opts.available_memory) {
        (crate::Device::Cpu, Some(bytes)) => Some(bytes),
        _ => bound.device.available_memory(),
    };
    if let Some(available) = available {
        if needed > available && !opts.force {
            return Err(ReplayError::Memory { needed, available });
        }
    }
    let mib = |b: f64| b / (1 << 20) as f64;
    let (external_mib, needed_mib) = (mib(plan.external_bytes() as f64), mib(needed as f64));
    if opts.progress && opts.only == et_graph::Kind::Comm {
        eprintln!(
            "[replay] communication only: the collectives' tensors come from a pool of \
             reused buffers (peak about {needed_mib:.1} MiB), their values are not the model's",
        );
    } else if opts.progress {
        eprintln!(
            "[replay] materialising {} external inputs (about {external_mib:.1} MiB; peak about \
             {needed_mib:.1} MiB) ...",
            plan.externals.len(),
        );
    }
    log::info!(
        "plan: {} steps, {} slots, {} external inputs ({external_mib:.1} MiB), estimated peak \
         {needed_mib:.1} MiB",
        plan.steps.len(),
        plan.n_slots,
        plan.externals.len(),
    );
    Ok(())
}

/// Joins the process groups as rank `d.rank`, where the replay runs a collective at all.
fn join<'a>(
    ex: Executor<'a>,
    d: &crate::DistOptions,
    opts: &ReplayOptions,
) -> Result<Executor<'a>, ReplayError> {
    let plan = ex.plan;
    let collectives = plan
        .steps
        .iter()
        .any(|s| s.kind.is_collective() && s.kind.included(opts.only));
    if !collectives {
        return Ok(ex);
    }
    if opts.progress {
        eprintln!(
            "[replay] rank {} of {}: joining at {}:{} ...",
            d.rank, d.world_size, d.master_addr, d.master_port
        );
    }
    let comm = crate::dist::connect(plan, d, &ex.bound.device)?;
    let mut ex = ex
        .with_comm(comm, d.timeout)
        .completing_each_collective(opts.comm.blocking || opts.comm.check);
    ex.agree_on_collectives(opts.only)?;
    Ok(ex)
}

/// On CUDA, NVML sampling of the replay's GPU on the timer's clock (and its period in ms), or
/// why not; `None` on CPU.
pub(super) fn gpu_sampler(
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
            .map(|s| (s, opts.nvml_period_ms as f64))
            .map_err(|e| e.to_string()),
    )
}

/// One iteration over every step. Returns the steps dispatched, with the time the thread
/// waited for a CPU inside each (for the instrumented iteration's profile).
pub(super) fn iteration(
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
    if phase == Phase::Measured && gaps.as_ref().is_some_and(|g| g.pace.is_some()) {
        rec.gap_factors.push(factor);
    }
    let mut i = Iteration::begin(ex, rec, timer, it, phase, opts);
    // Each step's allocator count: logged at -vvv in every measured iteration, kept for the
    // timeline in the counted one (the first measured: the recorder's `keep_allocated`).
    let trace_memory = log::log_enabled!(log::Level::Trace) && phase == Phase::Measured;
    let keep = i.rec.keep_allocated;
    // The recorded iterations under the instrumentation run in the scope the capture's
    // profiled iterations ran in (`ProfilerStep#N`): its edges are measured from it.
    let scope = matches!(phase, Phase::InstrumentedWarmUp | Phase::Instrumented)
        .then(|| ffi::StepScope::open(it));
    for pos in 0..i.ex.plan.steps.len() {
        i.step(pos, gaps.as_deref(), factor)?;
        if trace_memory || keep {
            let (now, peak) = allocated_since(i.rec.cuda_memory_base).unwrap_or((0, 0));
            log::trace!(
                "iteration {it} step {pos} {} (node {}): {now} bytes allocated, peak {peak}",
                i.ex.plan.steps[pos].name,
                i.ex.plan.steps[pos].id
            );
            if keep {
                i.rec.allocated_after.push((pos, now));
            }
        }
    }
    drop(scope);
    i.finish(gaps.as_mut().and_then(|g| g.pace.as_mut()))
}

/// The bytes allocated since the counted iteration's start, now and at their peak: on CUDA the
/// caching allocator's over `base` (device, allocated bytes at the start; `None` where its
/// figures cannot be read), else the CPU allocator's count.
fn allocated_since(base: Option<(usize, u64)>) -> Option<(i64, i64)> {
    match base {
        Some((d, start)) => ffi::cuda_memory_stats(d).ok().map(|m| {
            (
                m.allocated_bytes as i64 - start as i64,
                m.peak_allocated_bytes as i64 - start as i64,
            )
        }),
        None => Some(ffi::alloc_count_read()),
    }
}

/// One iteration's loop state. Time the replay spends on work the original did not do here
/// (views computed again, value checks, progress lines, steps left out) is excluded from the
/// iteration's time and moves the previous op's end along, so that it counts toward no gap.
struct Iteration<'e, 'p, 'q, 'r> {
    ex: &'e mut Executor<'p>,
    rec: &'r mut Recorder<'q>,
    timer: &'r mut Timer,
    opts: &'r ReplayOptions,
    it: usize,
    phase: Phase,
    slots: Vec<Option<Tensor>>,
    dispatched: Vec<(usize, f64)>,
    /// Every call's marks, resolved after the iteration.
    timed: Vec<Timed>,
    excluded_us: f64,
    waited_at_start: Option<f64>,
    start: crate::device::Mark,
    /// A gap is the time from the previous op's end to this op's start: the replay's own
    /// bookkeeping in between (frees, stack handling) counts toward it, as the original's
    /// tensor frees count toward its gaps.
    last_op_end: f64,
    last_progress: f64,
    owed: Owed,
    /// In the first iteration: the live storages, counted step by step for its peak.
    live: Option<super::LiveCounter>,
    /// The last `--blocking` barrier before a collective: how long this rank waited there
    /// for the others (µs).
    skew_us: f64,
    /// Checked collectives whose outputs are verified once they completed.
    unchecked: Vec<(usize, comms::Expected)>,
}

/// How one collective step runs (see [`Iteration::collective_mode`]).
#[derive(Clone, Copy)]
struct CollectiveMode {
    barriers: bool,
    check: bool,
}

/// Waits until `left` (µs still to wait, read afresh each time) is no longer positive: sleeping
/// while more than 2 ms remain, spinning the rest (a sleep overshoots by up to a time slice).
fn wait_until(mut left: impl FnMut() -> f64) {
    loop {
        let l = left();
        if l <= 0.0 {
            return;
        }
        if l > 2000.0 {
            std::thread::sleep(std::time::Duration::from_micros((l - 1000.0) as u64));
        } else {
            std::hint::spin_loop();
        }
    }
}

impl<'e, 'p, 'q, 'r> Iteration<'e, 'p, 'q, 'r> {
    fn begin(
        ex: &'e mut Executor<'p>,
        rec: &'r mut Recorder<'q>,
        timer: &'r mut Timer,
        it: usize,
        phase: Phase,
        opts: &'r ReplayOptions,
    ) -> Self {
        let slots = ex.fresh_slots();
        let live = (it == 0).then(|| super::LiveCounter::of(&slots));
        let timed = Vec::with_capacity(ex.plan.steps.len());
        timer.clear();
        // Under the observer, the probe iterations probe each op's record-function scope
        // before its call: what the observer's entry callback costs depends on the op's inputs.
        ex.probed_calls = (opts.probes_calls()
            && matches!(phase, Phase::InstrumentedProbe | Phase::PlainProbe))
        .then(Vec::new);
        let waited_at_start = rec.waited_us();
        let start = timer.mark();
        let last_op_end = timer.host_at(start);
        rec.begin_iteration(phase);
        Iteration {
            ex,
            rec,
            timer,
            opts,
            it,
            phase,
            slots,
            dispatched: Vec::new(),
            timed,
            excluded_us: 0.0,
            waited_at_start,
            start,
            last_op_end,
            last_progress: last_op_end,
            owed: Owed::default(),
            live,
            skew_us: 0.0,
            unchecked: Vec::new(),
        }
    }

    /// Time spent since `t` (host µs) on work that is neither an op nor its gap.
    fn exclude_since(&mut self, t: f64) {
        let spent = self.timer.host_us() - t;
        self.excluded_us += spent;
        self.last_op_end += spent;
    }

    /// Step `pos`: its gap emulated, then its op run, timed and checked.
    fn step(&mut self, pos: usize, gaps: Option<&Gaps>, factor: f64) -> Result<(), ReplayError> {
        let plan = self.ex.plan;
        let step = &plan.steps[pos];
        if !step.kind.included(self.opts.only) {
            // Not part of what is measured: neither its gap nor its bookkeeping. Sends and
            // receives outstanding until here complete first.
            self.wait_pending(pos)?;
            let t = self.timer.host_us();
            // Its views are still made: a copy placed here may be for a step that runs.
            self.ex.make_views(pos, &mut self.slots);
            self.ex.leave_out(pos, &mut self.slots);
            self.rec.skipped();
            self.ex.free(pos, &mut self.slots);
            self.count_live(pos, true);
            self.exclude_since(t);
            return Ok(());
        }
        self.wait_pending(pos)?;
        if self.ex.pool.is_some() {
            // Taking buffers is the replay's bookkeeping, not the original's.
            let t = self.timer.host_us();
            self.ex.fill_from_pool(pos, &mut self.slots);
            self.exclude_since(t);
        }
        // Views computed again (a softmax, an attention's log-sum-exp) are work the original's
        // autograd did not do here (it saved them): out of the timings.
        let computed = step.views.iter().any(|v| !v.kind.is_strided());
        let t_views = computed.then(|| self.timer.host_us());
        self.ex.make_views(pos, &mut self.slots);
        if let Some(t) = t_views {
            self.exclude_since(t);
        }
        if let Some(g) = gaps {
            // Counted from the previous op's end: the bookkeeping since is part of the gap.
            let want = g.us[pos] * factor;
            let s = spin_running(self.timer, self.owed.deadline(self.last_op_end, want));
            self.owed.settle(
                want,
                s.ended - self.last_op_end - s.moved,
                s.began - self.last_op_end,
            );
        }
        self.probe(pos);
        let coll = self.collective_mode(pos);
        let expected = self.before_collective(pos, coll)?;
        if matches!(self.ex.bound.steps[pos].exec, Exec::PassThrough) {
            self.ex.pass_through(pos, &mut self.slots);
            self.rec.ran(self.it, pos, Via::Kernel, None);
            self.ex.free(pos, &mut self.slots);
            self.ex.release_to_pool(pos, &mut self.slots);
            self.count_live(pos, true);
            // The original ran this op between its two gaps: the next gap counts from here, or
            // the time spun for this one would count toward it too.
            self.last_op_end = self.timer.host_us();
            return Ok(());
        }
        let outcome = self.call(pos);
        self.ex.settle(pos, &mut self.slots, &outcome);
        self.record(pos, outcome)?;
        self.after_collective(pos, coll, expected)?;
        self.check_values(pos);
        self.ex.free(pos, &mut self.slots);
        self.ex.release_to_pool(pos, &mut self.slots);
        self.count_live(pos, true);
        if self.ex.graph_release.get(pos).copied().unwrap_or(false) {
            let t = self.timer.host_us();
            self.ex.release_graph(pos, &mut self.slots);
            self.exclude_since(t);
        }
        self.progress(pos);
        Ok(())
    }

    /// How step `pos` runs as a collective under [`crate::CommOptions`]: `None` for a step
    /// that is not one (or a wait, which moves no data).
    fn collective_mode(&self, pos: usize) -> Option<CollectiveMode> {
        let crate::plan::StepKind::Collective(c) = &self.ex.plan.steps[pos].kind else {
            return None;
        };
        // A collective of a one-rank group runs as the identity (bound as a pass-through).
        let identity = matches!(self.ex.bound.steps[pos].exec, Exec::PassThrough);
        if c.kind() == "wait" || self.ex.comm.is_none() || identity {
            return None;
        }
        Some(CollectiveMode {
            // A barrier between a send and its peer's matching receive would wait for ever.
            barriers: self.opts.comm.blocking && !c.is_point_to_point(),
            check: self.opts.comm.check,
        })
    }

    /// Before collective step `pos`: its recorded time waited for (`paced_us`), its inputs
    /// filled with known values (`check`, outside the timings), the barrier before it
    /// (`blocking`). Returns what its outputs must hold when checked.
    fn before_collective(
        &mut self,
        pos: usize,
        mode: Option<CollectiveMode>,
    ) -> Result<Option<comms::Expected>, ReplayError> {
        let Some(mode) = mode else { return Ok(None) };
        let plan = self.ex.plan;
        if let Some(&Some(at)) = self.opts.comm.paced_us.as_ref().and_then(|p| p.get(pos)) {
            // At `at` in the iteration's own time, as `finish` counts it: work the original did
            // not do and waits for a CPU do not bring the collective forward.
            let start = self.timer.host_at(self.start);
            wait_until(|| {
                let own = self.timer.host_us()
                    - start
                    - self.excluded_us
                    - self.rec.waited_since(self.waited_at_start);
                at - own
            });
        }
        if self.opts.comm.rebalance_equal {
            let t = self.timer.host_us();
            let resized = self.ex.rebalance(pos, &mut self.slots).map_err(|e| {
                let step = &plan.steps[pos];
                ReplayError::Dist {
                    rank: self.ex.rank().map_or(0, |r| r.0),
                    what: format!(
                        "agreeing on equal splits for {} (node {})",
                        step.name, step.id
                    ),
                    source: e,
                }
            })?;
            if let Some(bytes) = resized {
                self.rec.resized(pos, bytes);
            }
            self.exclude_since(t);
        }
        let mut expected = None;
        if mode.check {
            let t = self.timer.host_us();
            let corrupt = self.opts.comm.corrupt_node == Some(plan.steps[pos].id);
            expected = self.ex.check_inputs(pos, &mut self.slots, corrupt);
            if self.it == 0 {
                self.rec.checked(expected.is_some(), &plan.steps[pos].name);
            }
            self.exclude_since(t);
        }
        if mode.barriers {
            let t = self.timer.host_us();
            self.barrier(pos, "the barrier before")?;
            self.skew_us = self.timer.host_us() - t;
        }
        Ok(expected)
    }

    /// After collective step `pos`: the barrier after it (`blocking`), its outputs verified
    /// (`check`; a receive's once it completed).
    fn after_collective(
        &mut self,
        pos: usize,
        mode: Option<CollectiveMode>,
        expected: Option<comms::Expected>,
    ) -> Result<(), ReplayError> {
        let Some(mode) = mode else { return Ok(()) };
        if mode.barriers {
            let t = self.timer.host_us();
            self.barrier(pos, "the barrier after")?;
            if self.phase == Phase::Measured {
                let post = self.timer.host_us() - t;
                self.rec.barriers(pos, self.skew_us, post);
            }
        }
        if let Some(e) = expected {
            self.unchecked.push((pos, e));
        }
        if self.ex.pending.is_empty() {
            self.verify_checked()?;
        }
        Ok(())
    }

    /// Verifies the checked collectives that completed (all of them: none is outstanding).
    fn verify_checked(&mut self) -> Result<(), ReplayError> {
        if self.unchecked.is_empty() {
            return Ok(());
        }
        let t = self.timer.host_us();
        for (pos, e) in std::mem::take(&mut self.unchecked) {
            if let Err(what) = self.ex.check_outputs(&e) {
                let step = &self.ex.plan.steps[pos];
                return Err(ReplayError::CollectiveMismatch {
                    rank: self.ex.rank().map_or(0, |r| r.0),
                    op: step.name.clone(),
                    id: step.id,
                    what,
                });
            }
        }
        self.exclude_since(t);
        Ok(())
    }

    /// A `--blocking` barrier on step `pos`'s group.
    fn barrier(&mut self, pos: usize, which: &str) -> Result<(), ReplayError> {
        self.ex.barrier(pos).map_err(|e| {
            let step = &self.ex.plan.steps[pos];
            ReplayError::Dist {
                rank: self.ex.rank().map_or(0, |r| r.0),
                what: format!("{which} collective {} (node {})", step.name, step.id),
                source: e,
            }
        })
    }

    /// Waits for the asynchronous collectives step `pos` needs finished.
    fn wait_pending(&mut self, pos: usize) -> Result<(), ReplayError> {
        if self.ex.pending.is_empty() {
            return Ok(());
        }
        let plan = self.ex.plan;
        let step = &plan.steps[pos];
        let completed = self
            .ex
            .wait_pending(Some(pos))
            .map_err(|e| ReplayError::Dist {
                rank: self.ex.rank().map_or(0, |r| r.0),
                what: format!(
                    "waiting for a collective at {} (node {})",
                    step.name, step.id
                ),
                source: e,
            })?;
        self.completed(&completed);
        if self.ex.pending.is_empty() {
            self.verify_checked()?;
        }
        Ok(())
    }

    /// The collectives of steps `steps`, left outstanding past their calls, completed now.
    fn completed(&mut self, steps: &[usize]) {
        if steps.is_empty() {
            return;
        }
        let now = self.timer.mark();
        for &from in steps {
            if let Some(t) = self.timed.iter_mut().rev().find(|t| t.pos == from) {
                t.done = Some(now);
            }
        }
    }

    /// With `probe_mechanisms`, the probes of the probe iterations before step `pos`.
    fn probe(&mut self, pos: usize) {
        let (opts, phase) = (self.opts, self.phase);
        let n_steps = self.ex.plan.steps.len();
        let probing =
            opts.probe_mechanisms && matches!(phase, Phase::InstrumentedProbe | Phase::PlainProbe);
        if probing && opts.probe_op {
            // First, where the original's next op call started (right after the previous op);
            // on a short trace, again, for some 256 samples in all.
            for _ in 0..256usize.div_ceil(n_steps.max(1)).min(32) {
                self.rec.op_probed(phase.instrumented(), ffi::probe_op());
                if opts.probes_calls() {
                    self.rec
                        .boxed_add_probed(phase.instrumented(), ffi::probe_boxed_add());
                }
            }
        }
        if phase == Phase::InstrumentedProbe {
            // One event at a time, where the capture's fell (between ops, the replay's data
            // in the caches), not a loop of them: back to back the profiler's records stay hot.
            self.rec.probed_in_context(
                ffi::probe_scope_us(0),
                ffi::probe_scope_us(1),
                ffi::probe_scope_us(4),
            );
        }
        // The engine's nodes before about 32 steps spread over the iteration (each probe runs
        // 17 nodes).
        if probing && pos.is_multiple_of(n_steps.div_ceil(32).max(1)) {
            self.rec
                .nodes_probed(phase.instrumented(), ffi::probe_nodes_us());
        }
    }

    /// Runs step `pos`'s op between two marks.
    fn call(&mut self, pos: usize) -> Outcome {
        // Read outside the marks: the reads' own cost is the replay's, between steps.
        let read_waits = self
            .opts
            .running_time_steps
            .as_ref()
            .is_none_or(|m| m.get(pos).copied().unwrap_or(true));
        let waited0 = if read_waits {
            self.rec.waited_us()
        } else {
            None
        };
        let t0 = self.timer.mark();
        let outcome = self.ex.step(pos, &mut self.slots, self.opts.autograd);
        let t1 = self.timer.mark();
        let waited_us = self.rec.waited_since(waited0);
        self.last_op_end = self.timer.host_at(t1);
        if self.phase.instrumented() {
            self.dispatched.push((pos, waited_us));
        }
        // A failed op's time is not an op's time: it stays out of the per-op figures and the
        // iteration's.
        if matches!(outcome, Outcome::Failed(_)) {
            self.excluded_us += self.timer.host_at(t1) - self.timer.host_at(t0);
        } else {
            self.timed.push(Timed {
                pos,
                start: t0,
                end: t1,
                waited_us,
                done: None,
            });
        }
        outcome
    }

    /// Records the outcome of step `pos`; a failure that leaves the run unable to go on (a
    /// collective, a device fault, any failure with `strict`) ends it.
    fn record(&mut self, pos: usize, outcome: Outcome) -> Result<(), ReplayError> {
        let plan = self.ex.plan;
        let step = &plan.steps[pos];
        match outcome {
            Outcome::Ran { via, grad_refused } => self.rec.ran(self.it, pos, via, grad_refused),
            Outcome::PassedThrough => self.rec.ran(self.it, pos, Via::Kernel, None),
            Outcome::Failed(e) => {
                // A failed collective leaves the ranks out of step: every later one would hang.
                if let (Some((rank, _)), true) = (self.ex.rank(), step.kind.is_collective()) {
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
                if self.opts.strict {
                    return Err(ReplayError::Strict {
                        op: step.name.clone(),
                        id: step.id,
                        source: e,
                    });
                }
                self.rec.failed(self.it, pos, &e);
            }
        }
        Ok(())
    }

    /// Kept out of the timings: value checks read every output, and counting live storages
    /// (first iteration) walks every slot. Not in the instrumented iteration: the checks' own
    /// ops would be among the profiler's events.
    fn check_values(&mut self, pos: usize) {
        let check =
            self.opts.check_values && !self.phase.instrumented() && !self.rec.found_nonfinite();
        if !check && self.it != 0 {
            return;
        }
        let t_untimed = self.timer.host_us();
        if check && self.ex.produced_nonfinite(pos, &self.slots) {
            let plan = self.ex.plan;
            let step = &plan.steps[pos];
            self.rec.nonfinite(NonFinite {
                op: step.name.clone(),
                id: step.id,
                iteration: self.it,
            });
        }
        if self.it == 0 {
            self.count_live(pos, false);
            if let Some(l) = &self.live {
                self.rec.live(l.now);
            }
        }
        self.exclude_since(t_untimed);
    }

    /// In the first iteration, the live storages after step `pos` touched its slots (with
    /// `freed`, after it freed and released its slots too).
    fn count_live(&mut self, pos: usize, freed: bool) {
        let Some(live) = &mut self.live else { return };
        let st = &self.ex.plan.steps[pos];
        let mut touched: Vec<crate::plan::Slot> = st.args.iter().flat_map(Arg::slots).collect();
        touched.extend(st.out_specs.iter().map(|(s, _)| *s));
        touched.extend(st.views.iter().flat_map(|v| [v.slot, v.base]));
        touched.extend(st.passthrough.iter().flat_map(|(a, b)| [*a, *b]));
        touched.extend(st.outs.iter().flat_map(Out::slots));
        if freed {
            touched.extend(&st.frees);
            if let Some(p) = &self.ex.pool {
                touched.extend(p.released(pos));
            }
        }
        for s in touched {
            let s = s as usize;
            live.update(s, self.slots.get(s).and_then(Option::as_ref));
        }
    }

    /// Long iterations say where they are (every 5 s, checked every 1024 steps).
    fn progress(&mut self, pos: usize) {
        if !self.opts.progress || pos % 1024 != 1023 {
            return;
        }
        let now = self.timer.host_us();
        if now - self.last_progress >= 5e6 {
            let n_steps = self.ex.plan.steps.len();
            let elapsed = now - self.timer.host_at(self.start);
            self.rec.progress_within(self.it, pos + 1, n_steps, elapsed);
            self.last_progress = self.timer.host_us();
            self.excluded_us += self.last_progress - now;
            self.last_op_end += self.last_progress - now;
        }
    }

    /// Waits for the iteration's outstanding collectives, then records its time.
    fn finish(mut self, pace: Option<&mut GapPace>) -> Result<Vec<(usize, f64)>, ReplayError> {
        match self.ex.wait_pending(None) {
            Ok(done) => self.completed(&done),
            Err(e) => {
                return Err(ReplayError::Dist {
                    rank: self.ex.rank().map_or(0, |r| r.0),
                    what: "waiting for the iteration's outstanding collectives".into(),
                    source: e,
                })
            }
        }
        self.verify_checked()?;
        let end = self.timer.mark();
        self.timer.resolve();
        if let Some(p) = pace {
            p.update(self.timer, &self.timed);
        }
        // The host's view of the iteration, up to the device finishing it (for NVML's samples).
        let window = (self.timer.host_at(self.start), self.timer.host_us());
        // In running time (`running_time`), without the time the thread waited for a CPU.
        let waited_us = self.rec.waited_since(self.waited_at_start);
        let wall_us = self.timer.us(end) - self.timer.us(self.start) - self.excluded_us - waited_us;
        if self.phase == Phase::Measured {
            let last = self.it + 1 == total_iterations(self.opts) - instrumented(self.opts);
            self.rec
                .measured(self.timer, &self.timed, wall_us, window, last);
        }
        if let Some(calls) = self.ex.probed_calls.take() {
            self.rec.calls_probed(self.phase.instrumented(), calls);
        }
        self.rec.end_iteration(self.phase, wall_us);
        Ok(self.dispatched)
    }
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
