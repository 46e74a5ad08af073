//! The recorder: what a run did, kept apart from how it runs. It owns the failures, per-step
//! timings, fallbacks, page faults, slices, value checks and profiled windows, and builds the
//! [`Report`] at the end.

use crate::bind::Bound;
use crate::device::Device;
use crate::device::{Mark, Timer};
use crate::error::{CallError, ErrorKind};
use crate::executor::{first_line, nonfinite, Phase, Via};
use crate::ffi::Profile;
use crate::options::ReplayOptions;
use crate::plan::{Plan, StepKind};
use crate::report::{
    CollectiveCall, CollectiveTiming, CudaMemory, Failure, Fallback, GpuReport, NonFinite,
    OpTiming, ProfiledStep, Report, StepTiming,
};
use metrics::{Counter, Slice, Stats, Timeline};
use std::collections::BTreeMap;
use std::collections::HashMap;

mod finish;

#[cfg(test)]
use finish::{consolidate, probe_cost};

pub(crate) struct Recorder<'a> {
    plan: &'a Plan,
    opts: &'a ReplayOptions,
    external_bytes: u64,
    /// Per step: total µs and calls over the measured iterations.
    step_total_us: Vec<f64>,
    step_calls: Vec<u32>,
    /// Per step: total host (launch) µs over the measured iterations.
    step_launch_us: Vec<f64>,
    /// Whether op times came from the device (CUDA events), and why they stopped if they did.
    device_timing: bool,
    event_error: Option<String>,
    /// Host-clock window of each measured iteration (for NVML samples).
    windows: Vec<(f64, f64)>,
    cpu: metrics::cpu::CpuSampler,
    /// Per step, every measured host (launch) time (with `per_step`).
    step_launch_samples: Vec<Vec<f64>>,
    /// Per step, every measured time from the previous step's end to its start (with
    /// `per_step`; where the previous step was timed just before it).
    step_lead_samples: Vec<Vec<f64>>,
    /// Per step, every measured time (with `per_step`).
    step_us: Vec<Vec<f64>>,
    /// With `per_step` and `gaps_every_other`: per step, the host times of the iterations that
    /// spun the gaps ([0]) and of those that ran back to back ([1]).
    alternating: Option<[Vec<Vec<f64>>; 2]>,
    iter_ms: Vec<f64>,
    op_ms: Vec<f64>,
    faults: Option<u64>,
    /// The measured phase's CPU and page-fault sampling is open (from its first iteration's
    /// start to its last one's end, [`Recorder::close_measured`]), with the faults at its start.
    measuring: Option<Option<u64>>,
    failures: BTreeMap<(String, ErrorKind, String), usize>,
    /// Ops that ran by a detour (not as recorded on this device), per op and detour.
    detours: BTreeMap<(String, Via), usize>,
    /// Ops autograd refused to record (they ran plain from then on): calls and why.
    grad_refused: BTreeMap<String, (usize, String)>,
    peak: u64,
    slices: Vec<Slice>,
    /// With `trace_out`: the allocator's count after each step of the counted iteration (the
    /// first measured), and each step's end in the last measured one, where the timeline puts
    /// the counts.
    pub(crate) allocated_after: Vec<(usize, i64)>,
    /// Whether the iteration running now keeps its counts in `allocated_after`.
    pub(crate) keep_allocated: bool,
    /// On CUDA: the device and its caching allocator's allocated bytes at the first measured
    /// iteration's start, the base the per-step counts are read over.
    pub(crate) cuda_memory_base: Option<(usize, u64)>,
    step_end_us: Vec<Option<f64>>,
    first_nonfinite: Option<NonFinite>,
    /// Each instrumented iteration's profiled windows, by step.
    profiled: Vec<Vec<Option<ProfiledStep>>>,
    pub(crate) instrument_error: Option<String>,
    /// The GPU's activity in the instrumented iteration (CUDA).
    gpu_activity: Option<et_graph::GpuActivity>,
    /// This iteration's counts, and those of the last iteration that was not instrumented.
    current: (usize, usize, usize),
    counts: (usize, usize, usize),
    last_wall_us: f64,
    /// The instrumented iterations' wall times.
    instrumented_ms: Vec<f64>,
    /// The factor each measured iteration's gaps were spun at (`GapPace`), with emulated gaps.
    pub(crate) gap_factors: Vec<f64>,
    /// The instrumentation's cost of an event without arguments and of one such as autograd
    /// records for a backward node, with 1 and with 4 tensor inputs (µs), timed one event at a
    /// time between the replay's steps (`Phase::InstrumentedProbe`).
    pub(crate) probed_in_context: Vec<(f64, f64, f64)>,
    /// The op probes' times (µs): plain, under the instrumentation.
    op_probes: [Vec<f64>; 2],
    /// The op probes' kernels called without the dispatcher (µs), in both probe iterations.
    op_kernels: Vec<f64>,
    /// The instrumented op probes' intervals (Unix ns), to find their events in the profile.
    op_probe_spans: Vec<(u64, u64)>,
    /// Those events' profiled windows (µs), found in [`Recorder::profiled`].
    op_probe_windows: Vec<f64>,
    /// The autograd node probes' times (µs): plain, under the instrumentation.
    node_probes: [Vec<f64>; 2],
    /// The call probes ([`crate::ffi::Stack::probe_call`]): (step, µs), plain and
    /// under the instrumentation.
    call_probes: [Vec<(usize, f64)>; 2],
    /// The instrumented call probes' events' windows (µs), by step, found in
    /// [`Recorder::profiled`] by their tags.
    call_probe_windows: HashMap<usize, f64>,
    /// The boxed `aten::add` probes' times (µs, [`crate::ffi::probe_boxed_add`]): plain, under
    /// the instrumentation.
    boxed_add_probes: [Vec<f64>; 2],
    /// Their events' windows (µs).
    boxed_add_windows: Vec<f64>,
    /// Each recorded instrumented iteration's edges (µs): from its `ProfilerStep#N` scope's
    /// start to its first step's window, and from its last step's window to the scope's end.
    step_edges_us: Vec<f64>,
    /// How collectives on CUDA tensors ran, when collectives ran for real.
    pub(crate) cuda_comm: Option<crate::ffi::CudaComm>,
    /// The replaying thread's run delay, read around each step with
    /// [`ReplayOptions::running_time`].
    run_delay: Option<metrics::cpu::RunDelay>,
    /// Per collective step: each measured call's latency, and with `--blocking` the barriers
    /// before and after it (µs).
    coll_calls: BTreeMap<usize, CallSamples>,
    /// With `--check-collectives`: what the first iteration verified.
    check: Option<crate::report::CheckReport>,
    /// Collectives whose message the replay resized (`--rebalance equal`): their bytes.
    resized: std::collections::HashMap<usize, u64>,
}

/// One collective step's measured calls (µs).
#[derive(Default)]
struct CallSamples {
    latency: Vec<f64>,
    skew: Vec<f64>,
    after: Vec<f64>,
}

impl<'a> Recorder<'a> {
    /// `cpu`: opened before the replay's threads start (perf counters count only threads
    /// created after them).
    pub fn new(
        plan: &'a Plan,
        opts: &'a ReplayOptions,
        external_bytes: u64,
        cpu: metrics::cpu::CpuSampler,
    ) -> Self {
        let n = plan.steps.len();
        // A list of samples per step, with `per_step`.
        let per_step = || {
            if opts.per_step {
                vec![Vec::new(); n]
            } else {
                Vec::new()
            }
        };
        Recorder {
            plan,
            opts,
            external_bytes,
            step_total_us: vec![0.0; n],
            step_calls: vec![0; n],
            step_launch_us: vec![0.0; n],
            device_timing: false,
            event_error: None,
            windows: Vec::new(),
            cpu,
            step_launch_samples: per_step(),
            step_lead_samples: per_step(),
            step_us: per_step(),
            alternating: (opts.per_step && opts.gaps_alternating)
                .then(|| [vec![Vec::new(); n], vec![Vec::new(); n]]),
            iter_ms: Vec::new(),
            op_ms: Vec::new(),
            faults: None,
            measuring: None,
            failures: BTreeMap::new(),
            detours: BTreeMap::new(),
            grad_refused: BTreeMap::new(),
            peak: 0,
            slices: Vec::new(),
            allocated_after: Vec::new(),
            keep_allocated: false,
            cuda_memory_base: None,
            step_end_us: if opts.trace_out.is_some() {
                vec![None; n]
            } else {
                Vec::new()
            },
            first_nonfinite: None,
            profiled: Vec::new(),
            instrument_error: None,
            gpu_activity: None,
            current: (0, 0, 0),
            counts: (0, 0, 0),
            last_wall_us: 0.0,
            instrumented_ms: Vec::new(),
            gap_factors: Vec::new(),
            probed_in_context: Vec::new(),
            op_probes: [Vec::new(), Vec::new()],
            op_kernels: Vec::new(),
            op_probe_spans: Vec::new(),
            op_probe_windows: Vec::new(),
            call_probes: [Vec::new(), Vec::new()],
            call_probe_windows: HashMap::new(),
            boxed_add_probes: [Vec::new(), Vec::new()],
            boxed_add_windows: Vec::new(),
            step_edges_us: Vec::new(),
            node_probes: [Vec::new(), Vec::new()],
            cuda_comm: None,
            coll_calls: BTreeMap::new(),
            check: opts.comm.check.then(Default::default),
            resized: std::collections::HashMap::new(),
            // Opened here, on the thread that replays.
            run_delay: if opts.running_time {
                metrics::cpu::RunDelay::of_this_thread()
            } else {
                None
            },
        }
    }

    /// With [`ReplayOptions::running_time`], how long the replaying thread has waited for a CPU
    /// so far (µs); `None` without it, or where the kernel does not say.
    #[inline]
    pub fn waited_us(&self) -> Option<f64> {
        self.run_delay.as_ref().and_then(|d| d.read_us())
    }

    /// How long the replaying thread has waited for a CPU since `since` (a [`Recorder::waited_us`]
    /// reading), in µs; 0 without [`ReplayOptions::running_time`].
    #[inline]
    pub fn waited_since(&self, since: Option<f64>) -> f64 {
        match (since, self.waited_us()) {
            (Some(a), Some(b)) => (b - a).max(0.0),
            _ => 0.0,
        }
    }

    pub fn begin_iteration(&mut self, phase: Phase) {
        self.current = (0, 0, 0);
        // Sampled once over the measured phase, not per iteration: system calls between the
        // iterations would be where the scheduler preempts a replay on a busy host, so its
        // iterations would not be slowed as the original's are (its loop makes none).
        if phase == Phase::Measured {
            if self.measuring.is_none() {
                self.cpu.begin();
                self.measuring = Some(metrics::minor_page_faults());
            }
        } else {
            self.close_measured();
        }
    }

    /// Ends the measured phase's sampling (nothing when it is not open).
    pub fn close_measured(&mut self) {
        if let Some(start) = self.measuring.take() {
            // Every measured iteration pushed its time.
            self.cpu.end_spanning(self.iter_ms.len());
            self.faults = start
                .zip(metrics::minor_page_faults())
                .map(|(a, b)| b.saturating_sub(a));
        }
    }

    /// A step ran (or passed through as a no-op on this device).
    #[inline]
    pub fn ran(&mut self, it: usize, pos: usize, via: Via, grad_refused: Option<String>) {
        self.current.0 += 1;
        if let Some(why) = grad_refused {
            self.grad_refused
                .entry(self.plan.steps[pos].name.clone())
                .or_insert_with(|| (0, why))
                .0 += 1;
        }
        if via != Via::Kernel && it == 0 {
            *self
                .detours
                .entry((self.plan.steps[pos].name.clone(), via))
                .or_default() += 1;
        }
    }

    pub fn failed(&mut self, it: usize, pos: usize, e: &CallError) {
        self.current.1 += 1;
        if it == 0 {
            *self
                .failures
                .entry((
                    self.plan.steps[pos].name.clone(),
                    e.kind,
                    first_line(&e.message),
                ))
                .or_default() += 1;
        }
    }

    /// With `--blocking`, in a measured iteration: collective step `pos` waited `skew` µs at
    /// the barrier before it and `after` µs at the one after it.
    pub fn barriers(&mut self, pos: usize, skew: f64, after: f64) {
        let c = self.coll_calls.entry(pos).or_default();
        c.skew.push(skew);
        c.after.push(after);
    }

    /// Collective step `pos` now moves `bytes` (its input and output each), not its recorded
    /// message (`--rebalance equal`).
    pub fn resized(&mut self, pos: usize, bytes: u64) {
        self.resized.insert(pos, bytes);
    }

    /// With `--check-collectives`, in the first iteration: a collective op checked, or one
    /// the check has no model of.
    pub fn checked(&mut self, verified: bool, op: &str) {
        if let Some(c) = &mut self.check {
            if verified {
                c.checked += 1;
            } else {
                *c.unchecked.entry(op.to_string()).or_default() += 1;
            }
        }
    }

    /// A step left out by `--only`.
    #[inline]
    pub fn skipped(&mut self) {
        self.current.2 += 1;
    }

    pub fn found_nonfinite(&self) -> bool {
        self.first_nonfinite.is_some()
    }

    /// One op probe, in the plain or the instrumented probe iteration.
    pub fn op_probed(&mut self, instrumented: bool, probe: crate::ffi::ProbedOp) {
        self.op_probes[usize::from(instrumented)].push(probe.us);
        // A failed probe timed no kernel either (the shim leaves it at 0).
        if probe.us >= 0.0 {
            self.op_kernels.push(probe.kernel_us);
            if instrumented {
                self.op_probe_spans.push(probe.unix_ns);
            }
        }
    }

    /// A probe iteration's call probes, plain or under the instrumentation.
    pub fn calls_probed(&mut self, instrumented: bool, calls: Vec<(usize, f64)>) {
        self.call_probes[usize::from(instrumented)].extend(calls);
    }

    /// One probe of the op probe's add with its inputs boxed, plain or instrumented.
    pub fn boxed_add_probed(&mut self, instrumented: bool, us: f64) {
        self.boxed_add_probes[usize::from(instrumented)].push(us);
    }

    /// One probe of autograd's engine running [`crate::ffi::PROBE_NODES`] nodes (µs; negative:
    /// failed), in the plain or the instrumented probe iteration.
    pub fn nodes_probed(&mut self, instrumented: bool, us: f64) {
        self.node_probes[usize::from(instrumented)].push(us);
    }

    /// One in-context probe of the instrumentation's event costs (µs; negative: failed).
    pub fn probed_in_context(&mut self, plain: f64, backward_1: f64, backward_4: f64) {
        self.probed_in_context.push((plain, backward_1, backward_4));
    }

    pub fn nonfinite(&mut self, n: NonFinite) {
        self.first_nonfinite = Some(n);
    }

    /// Live bytes after a step of the first iteration.
    pub fn live(&mut self, bytes: u64) {
        self.peak = self.peak.max(bytes);
    }

    /// A measured iteration's resolved step times and wall time.
    pub fn measured(
        &mut self,
        timer: &Timer,
        timed: &[Timed],
        wall_us: f64,
        window: (f64, f64),
        last: bool,
    ) {
        let mut sum = 0.0;
        self.device_timing = timer.on_device();
        if let Some(e) = &timer.event_error {
            self.event_error.get_or_insert_with(|| e.clone());
        }
        self.windows.push(window);
        if self.opts.per_step {
            for w in timed.windows(2) {
                if w[1].pos == w[0].pos + 1 {
                    let lead = timer.host_at(w[1].start) - timer.host_at(w[0].end);
                    self.step_lead_samples[w[1].pos].push(lead);
                }
            }
        }
        for &Timed {
            pos,
            start: t0,
            end: t1,
            waited_us,
            done,
        } in timed
        {
            // The time the thread waited for a CPU is the host's, not the op's (with
            // `running_time`; 0 otherwise). A device's time is the device's.
            let launch = timer.host_at(t1) - timer.host_at(t0) - waited_us;
            let d = if timer.on_device() {
                timer.us(t1) - timer.us(t0)
            } else {
                launch
            };
            sum += d;
            if self.plan.steps[pos].kind.is_collective() {
                let latency = match done {
                    Some(t2) if timer.on_device() => timer.us(t2) - timer.us(t0),
                    Some(t2) => timer.host_at(t2) - timer.host_at(t0) - waited_us,
                    None => d,
                };
                self.coll_calls
                    .entry(pos)
                    .or_default()
                    .latency
                    .push(latency);
            }
            self.step_total_us[pos] += d;
            self.step_launch_us[pos] += launch;
            self.step_calls[pos] += 1;
            if self.opts.per_step {
                self.step_us[pos].push(d);
                self.step_launch_samples[pos].push(launch);
            }
            if let Some(a) = &mut self.alternating {
                // This is measured iteration `iter_ms.len()`; the executor counts from the
                // first warm-up one.
                if let Some((spun, true)) =
                    self.opts.alternation(self.opts.warmup + self.iter_ms.len())
                {
                    a[usize::from(!spun)][pos].push(launch);
                }
            }
            if last && self.opts.trace_out.is_some() {
                let step = &self.plan.steps[pos];
                // On CUDA, the launch on the host (tid 1) and the work on the device (tid 2).
                let (cat, args) = match &step.kind {
                    StepKind::Collective(c) => (
                        "collective",
                        serde_json::json!({"id": step.id, "kind": c.kind(),
                        "size_bytes": c.message_bytes(),
                        // The group it ran in: its recorded name, else the plan's group
                        // (the world's, "0", where the trace records none).
                        "group": c.pg_name.clone().or_else(|| {
                            self.plan.groups.get(c.group as usize).map(|g| g.name.clone())
                        })}),
                    ),
                    StepKind::Compute => ("op", serde_json::json!({"id": step.id})),
                };
                self.slices.push(Slice {
                    name: step.name.clone(),
                    cat,
                    ts: timer.host_at(t0),
                    dur: launch,
                    tid: 1,
                    args,
                });
                self.step_end_us[pos] = Some(timer.host_at(t0) + launch);
                // A collective left outstanding past its call: from the call's end to the
                // wait that completed it, on a row of its own, where it overlaps what ran
                // in between (the time a trace's wait blocked is the part past the wait's
                // start).
                if let (StepKind::Collective(c), Some(t2)) = (&step.kind, done) {
                    let (from, to) = (timer.host_at(t1), timer.host_at(t2));
                    self.slices.push(Slice {
                        name: step.name.clone(),
                        cat: "in flight",
                        ts: from,
                        dur: (to - from).max(0.0),
                        tid: IN_FLIGHT_TID,
                        args: serde_json::json!({"id": step.id, "kind": c.kind()}),
                    });
                }
                if self.device_timing {
                    self.slices.push(Slice {
                        name: step.name.clone(),
                        cat: "gpu",
                        ts: timer.us(t0),
                        dur: d,
                        tid: 2,
                        args: serde_json::json!({"id": step.id}),
                    });
                }
            }
        }
        self.iter_ms.push(wall_us / 1000.0);
        self.op_ms.push(sum / 1000.0);
    }

    pub fn end_iteration(&mut self, phase: Phase, wall_us: f64) {
        if phase == Phase::Instrumented {
            self.instrumented_ms.push(wall_us / 1000.0);
        }
        if !phase.instrumented() {
            self.counts = self.current;
        }
        self.last_wall_us = wall_us;
    }

    /// Long iterations (big traces, slow devices) report as they finish, with the time the
    /// rest will take; short ones stay quiet.
    pub fn progress(&self, it: usize, total: usize, phase: Phase) {
        if self.last_wall_us >= 500_000.0 {
            let kind = match phase {
                Phase::WarmUp | Phase::PlainProbe => "warm-up",
                Phase::Measured => "measured",
                Phase::InstrumentedWarmUp | Phase::Instrumented | Phase::InstrumentedProbe => {
                    "instrumented"
                }
            };
            let left = (total - it - 1) as f64 * self.last_wall_us / 1e6;
            eprintln!(
                "[replay] iteration {}/{total} ({kind}): {:.3} ms, {} failed{}",
                it + 1,
                self.last_wall_us / 1000.0,
                self.current.1,
                if it + 1 < total {
                    format!("; about {} left", eta(left))
                } else {
                    String::new()
                }
            );
        }
    }

    /// Where a long iteration is: steps done, and the time left in it (and in the run, once an
    /// iteration has been timed).
    pub fn progress_within(&self, it: usize, done: usize, steps: usize, elapsed_us: f64) {
        let left_here = elapsed_us / done as f64 * (steps - done) as f64 / 1e6;
        eprintln!(
            "[replay] iteration {}: step {done}/{steps} ({:.0}%), about {} left in it",
            it + 1,
            100.0 * done as f64 / steps as f64,
            eta(left_here)
        );
    }

    /// Finds each dispatched step's event among the profiler's: the outermost events of this
    /// thread, in order, matched by name. Extra outermost events (the casts of a float32
    /// fallback, tensors made for a failed op) are skipped; a step whose name does not come up
    /// within a few events is left unmatched rather than shifting every later match.
    /// The profiled windows of the recorded instrumented iterations, all in one `profile`:
    /// each iteration's dispatched steps (with the time each waited for a CPU) are found in
    /// turn among its outermost events by order and name; the probes' events are skipped.
    /// `warm_up`: what the session's unrecorded first iteration dispatched. Its events are the
    /// profile's first: matched and passed over, or the first recorded iteration would take
    /// the warm-up's windows (the session's first events cost more), each later one its
    /// predecessor's, and the last one's go unread.
    pub fn profiled(
        &mut self,
        profile: &Profile,
        warm_up: Option<&[(usize, f64)]>,
        iterations: &[Vec<(usize, f64)>],
    ) {
        let events = &profile.cpu;
        const LOOKAHEAD: usize = 8;
        let is_scope = |e: &crate::ffi::ProfiledEvent| {
            e.name.starts_with(crate::ffi::STEP_SCOPE_PREFIX) && e.seq < 0
        };
        let mut order: Vec<usize> = (0..events.len())
            .filter(|&i| {
                !events[i].name.starts_with(crate::ffi::PROBE_PREFIX)
                    && !is_call_probe(&events[i])
                    && !is_scope(&events[i])
            })
            .collect();
        // The iterations' own scopes, by start.
        let mut scopes: Vec<(u64, u64)> = events
            .iter()
            .filter(|e| is_scope(e) && e.end_ns >= e.start_ns)
            .map(|e| (e.start_ns, e.end_ns))
            .collect();
        scopes.sort_unstable();
        order.sort_by_key(|&i| (events[i].start_ns, std::cmp::Reverse(events[i].end_ns)));
        // Outermost events with the number of events that start inside each.
        let mut top: Vec<(usize, u32)> = Vec::new();
        let mut open_end = 0u64;
        for &i in &order {
            let e = &events[i];
            if top.is_empty() || e.start_ns >= open_end {
                top.push((i, 0));
                open_end = e.end_ns;
            } else if let Some(t) = top.last_mut() {
                t.1 += 1;
            }
        }
        // Each recorded iteration's edges: from its scope's start to the first outermost event
        // in it, and from the last one's end to the scope's end (the warm-up's scope, the
        // first, is passed over as its events are).
        let recorded_scopes = scopes.iter().skip(usize::from(warm_up.is_some()));
        for &(a, b) in recorded_scopes {
            let from = top.partition_point(|&(i, _)| events[i].start_ns < a);
            let inside: Vec<&crate::ffi::ProfiledEvent> = top[from..]
                .iter()
                .map(|&(i, _)| &events[i])
                .take_while(|e| e.end_ns <= b)
                .collect();
            if let (Some(first), Some(last)) = (inside.first(), inside.last()) {
                self.step_edges_us
                    .push(((first.start_ns - a) + (b - last.end_ns)) as f64 / 1e3);
            }
        }
        self.op_probe_windows = probe_windows(events, &self.op_probe_spans);
        // The call probes' events, by their tags.
        let window =
            |e: &crate::ffi::ProfiledEvent| e.end_ns.saturating_sub(e.start_ns) as f64 / 1e3;
        for e in events.iter().filter(|e| is_call_probe(e)) {
            match e.seq - crate::ffi::PROBE_SEQ {
                -1 => self.boxed_add_windows.push(window(e)),
                pos if pos >= 0 => {
                    self.call_probe_windows.insert(pos as usize, window(e));
                }
                _ => {}
            }
        }
        let t0 = top.first().map_or(0, |&(i, _)| events[i].start_ns);
        let us = |ns: u64| (ns.saturating_sub(t0)) as f64 / 1000.0;
        let mut j = 0;
        let mut last_start_ns = None;
        let warm_up = warm_up.map(|w| (w, true));
        for (dispatched, passed_over) in warm_up
            .into_iter()
            .chain(iterations.iter().map(|d| (d.as_slice(), false)))
        {
            let mut out = vec![None; self.plan.steps.len()];
            let mut first_ns = None;
            for &(pos, waited_us) in dispatched {
                let name = self.plan.steps[pos].name.as_str();
                let found = top[j.min(top.len())..]
                    .iter()
                    .take(LOOKAHEAD)
                    .position(|&(i, _)| events[i].name == name);
                if let Some(k) = found {
                    let (i, nested) = top[j + k];
                    first_ns.get_or_insert(events[i].start_ns);
                    out[pos] = Some(ProfiledStep {
                        start_us: us(events[i].start_ns),
                        end_us: us(events[i].end_ns),
                        nested,
                        waited_us,
                    });
                    j += k + 1;
                }
            }
            if passed_over {
                continue;
            }
            self.profiled.push(out);
            last_start_ns = first_ns.or(last_start_ns);
        }
        // The GPU's activity in the last recorded iteration: from its first op's start (every
        // iteration ends synchronised, so earlier iterations' work is done by then).
        let from_ns = last_start_ns.unwrap_or(0);
        let gpu: Vec<&crate::ffi::ProfiledEvent> = profile
            .gpu
            .iter()
            .filter(|e| e.start_ns >= from_ns)
            .collect();
        if !gpu.is_empty() {
            // Relative to the first event: epoch nanoseconds in an f64 lose sub-µs precision.
            let t0 = gpu.iter().map(|e| e.start_ns).min().unwrap_or(0);
            let intervals: Vec<et_graph::GpuInterval> = gpu
                .iter()
                .map(|e| et_graph::GpuInterval {
                    name: &e.name,
                    work: et_graph::GpuWork::of_name(&e.name),
                    start_us: e.start_ns.saturating_sub(t0) as f64 / 1e3,
                    dur_us: e.end_ns.saturating_sub(e.start_ns) as f64 / 1e3,
                })
                .collect();
            self.gpu_activity = Some(et_graph::gpu_activity(&intervals));
        }
    }
}

/// The profiled windows (µs) of the op probes that ran in `spans` (their calls' intervals on the
/// events' clock): for each, the probe's op event (`aten::add`, nesting none) inside the
/// interval, give or take [`PROBE_CLOCK_SLACK_NS`], nearest its middle. The events' times are
/// the profiler's cycle counter put on the Unix clock by a fit, a little off the call's own
/// reading of that clock; a probe whose event is not found is left out.
fn probe_windows(events: &[crate::ffi::ProfiledEvent], spans: &[(u64, u64)]) -> Vec<f64> {
    let mut adds: Vec<(u64, u64)> = events
        .iter()
        .filter(|e| e.name == "aten::add" && e.end_ns >= e.start_ns && !is_call_probe(e))
        .map(|e| (e.start_ns, e.end_ns))
        .collect();
    adds.sort_unstable();
    let mid = |(a, b): (u64, u64)| (a as f64 + b as f64) / 2.0;
    spans
        .iter()
        .filter_map(|&(t0, t1)| {
            let (lo, hi) = (
                t0.saturating_sub(PROBE_CLOCK_SLACK_NS),
                t1.saturating_add(PROBE_CLOCK_SLACK_NS),
            );
            let from = adds.partition_point(|&(s, _)| s < lo);
            adds[from..]
                .iter()
                .take_while(|&&(s, _)| s <= hi)
                .filter(|&&(_, e)| e <= hi)
                .min_by(|&&x, &&y| {
                    let m = mid((t0, t1));
                    (mid(x) - m).abs().total_cmp(&(mid(y) - m).abs())
                })
                .map(|&(s, e)| (e - s) as f64 / 1e3)
        })
        .collect()
}

/// A call probe's event ([`crate::ffi::PROBE_SEQ`]'s tags), not a step's.
fn is_call_probe(e: &crate::ffi::ProfiledEvent) -> bool {
    e.seq >= crate::ffi::PROBE_SEQ - 1
}

/// How far a probe's event may lie outside its call's interval (ns): the error of the fit that
/// puts the profiler's cycle counter on the Unix clock.
const PROBE_CLOCK_SLACK_NS: u64 = 5_000;

/// What a run's GPU side hands the recorder: NVML samples (device name, period in ms, GPM read,
/// samples) or why there are none (`None`: not a GPU replay), and the external-input arena.
pub(crate) struct GpuSamples {
    pub sampled: Result<(String, f64, bool, Vec<metrics::gpu::GpuSample>), Option<String>>,
    pub arena_bytes: u64,
}

/// The `--trace-out` row of collectives in flight: issued, not yet waited for.
pub(crate) const IN_FLIGHT_TID: u64 = 3;

/// One step's call in a measured iteration: its marks, and the time the thread waited for a
/// CPU between them (with [`ReplayOptions::running_time`]; 0 otherwise).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timed {
    pub pos: usize,
    pub start: Mark,
    pub end: Mark,
    pub waited_us: f64,
    /// A collective left outstanding past its call (a send or receive, one the trace waits
    /// for later): when the wait for it returned. Its latency runs to there.
    pub done: Option<Mark>,
}

/// Seconds as `42 s`, `3 min 20 s`, `1 h 05 min`.
fn eta(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match s {
        0..=99 => format!("{s} s"),
        100..=5999 => format!("{} min {:02} s", s / 60, s % 60),
        _ => format!("{} h {:02} min", s / 3600, s / 60 % 60),
    }
}

#[cfg(test)]
mod tests;
