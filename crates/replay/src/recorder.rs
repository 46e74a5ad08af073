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
    CollectiveTiming, CudaMemory, Failure, Fallback, GpuReport, NonFinite, OpTiming, ProfiledStep,
    Report, StepTiming,
};
use metrics::{Counter, Slice, Stats, Timeline};
use std::collections::BTreeMap;

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
    /// The autograd node probes' times (µs): plain, under the instrumentation.
    node_probes: [Vec<f64>; 2],
    /// How collectives on CUDA tensors ran, when collectives ran for real.
    pub(crate) cuda_comm: Option<crate::ffi::CudaComm>,
    /// The replaying thread's run delay, read around each step with
    /// [`ReplayOptions::running_time`].
    run_delay: Option<metrics::cpu::RunDelay>,
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
            step_launch_samples: if opts.per_step {
                vec![Vec::new(); n]
            } else {
                Vec::new()
            },
            step_us: if opts.per_step {
                vec![Vec::new(); n]
            } else {
                Vec::new()
            },
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
            node_probes: [Vec::new(), Vec::new()],
            cuda_comm: None,
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
    fn close_measured(&mut self) {
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

    /// A step left out by `--only`.
    #[inline]
    pub fn skipped(&mut self) {
        self.current.2 += 1;
    }

    pub fn found_nonfinite(&self) -> bool {
        self.first_nonfinite.is_some()
    }

    /// One op probe (µs; negative: failed), in the plain or the instrumented probe iteration.
    pub fn op_probed(&mut self, instrumented: bool, us: f64) {
        self.op_probes[usize::from(instrumented)].push(us);
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
        for &Timed {
            pos,
            start: t0,
            end: t1,
            waited_us,
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
                self.slices.push(Slice {
                    name: step.name.clone(),
                    cat: "op",
                    ts: timer.host_at(t0),
                    dur: launch,
                    tid: 1,
                    args: serde_json::json!({"id": step.id}),
                });
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
        let mut order: Vec<usize> = (0..events.len())
            .filter(|&i| !events[i].name.starts_with(crate::ffi::PROBE_PREFIX))
            .collect();
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

    pub fn finish(
        mut self,
        externals: &[Option<tch::Tensor>],
        device: &Device,
        rank: Option<(usize, usize)>,
        bound: &Bound,
        gpu: GpuSamples,
    ) -> (Report, Timeline) {
        self.close_measured();
        let plan = self.plan;
        let opts = self.opts;
        // Values that diverged (NaN/Inf) send later iterations down kernel paths the original
        // never ran (e.g. max_pool2d 2.5x faster on NaN): count them for the report.
        let nonfinite_externals = externals.iter().flatten().filter(|t| nonfinite(t)).count();
        // The events' costs in context, where probed: means (a cost's occasional larger
        // values, the profiler's buffers, are costs the capture's events paid too), less
        // those a lost time slice lengthened.
        let in_context = (!self.probed_in_context.is_empty()).then(|| {
            let col = |f: fn(&(f64, f64, f64)) -> f64| {
                let v: Vec<f64> = self
                    .probed_in_context
                    .iter()
                    .map(f)
                    .filter(|x| x.is_finite() && *x >= 0.0)
                    .collect();
                mean_without_slices(&v)
            };
            (col(|c| c.0), col(|c| c.1), col(|c| c.2))
        });
        let iters = opts.iters.max(1);
        let n_iters = iters as f64;
        let mut per_op: BTreeMap<&str, (usize, f64, f64)> = BTreeMap::new();
        for (pos, step) in plan.steps.iter().enumerate() {
            if self.step_calls[pos] > 0 {
                let e = per_op.entry(step.name.as_str()).or_default();
                e.0 += self.step_calls[pos] as usize;
                e.1 += self.step_total_us[pos];
                e.2 += self.step_launch_us[pos];
            }
        }
        let mut colls: BTreeMap<&str, CollectiveTiming> = BTreeMap::new();
        for (pos, step) in plan.steps.iter().enumerate() {
            if let (StepKind::Collective(c), true) = (&step.kind, self.step_calls[pos] > 0) {
                let e = colls.entry(step.name.as_str()).or_insert(CollectiveTiming {
                    op: step.name.clone(),
                    count: 0,
                    bytes: 0,
                    total_ms: 0.0,
                });
                e.count += self.step_calls[pos] as usize / iters;
                e.bytes += c.bytes;
                e.total_ms += self.step_total_us[pos] / 1000.0 / n_iters;
            }
        }
        let mut ops: Vec<OpTiming> = per_op
            .into_iter()
            .map(|(name, (count, us, launch))| OpTiming {
                op: name.to_string(),
                count: count / iters,
                total_ms: us / 1000.0 / n_iters,
                mean_us: us / count.max(1) as f64,
                launch_us: launch / count.max(1) as f64,
            })
            .collect();
        ops.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms));
        let iter = Stats::of(&self.iter_ms);
        let opsum = Stats::of(&self.op_ms);
        let (replayed, failed, skipped) = self.counts;
        let steps = (replayed + failed).max(1) as f64;
        // What was spun per measured iteration: the model's gaps at the mean factor they
        // followed the host's speed by.
        let gap_pace = (!self.gap_factors.is_empty())
            .then(|| self.gap_factors.iter().sum::<f64>() / self.gap_factors.len() as f64);
        let gaps_ms = opts
            .gaps_us
            .as_deref()
            .filter(|g| g.len() == plan.steps.len())
            .map_or(0.0, |g| g.iter().sum::<f64>() / 1000.0)
            * gap_pace.unwrap_or(1.0);
        let mut planned: BTreeMap<(String, String), usize> = BTreeMap::new();
        for (s, b) in plan.steps.iter().zip(&bound.steps) {
            if let Some(f) = &b.fallback {
                *planned.entry((s.name.clone(), f.clone())).or_default() += 1;
            }
        }
        let fallbacks = planned
            .into_iter()
            .map(|((op, ran_as), count)| Fallback { op, count, ran_as })
            .chain(self.detours.into_iter().map(|((op, via), count)| Fallback {
                op,
                count,
                ran_as: match via {
                    Via::Float32 => {
                        format!("in float32: no half-precision kernel on {}", device.name())
                    }
                    Via::Cpu => format!(
                        "on the CPU: no {} kernel (inputs copied there, outputs back)",
                        device.name().to_uppercase()
                    ),
                    Via::Reshape => format!(
                        "as aten::reshape: {}'s kernels laid its input out otherwise than \
                                 the trace's device, and no view of it has these sizes",
                        device.name().to_uppercase()
                    ),
                    Via::Kernel => String::new(),
                },
            }))
            .chain(
                self.grad_refused
                    .into_iter()
                    .map(|(op, (count, reason))| Fallback {
                        op,
                        count,
                        ran_as: format!("without autograd recording: {reason}"),
                    }),
            )
            .collect();
        let cuda_memory = match device {
            Device::Cuda(i) => crate::ffi::cuda_memory_stats(*i).ok().map(|m| CudaMemory {
                allocator: m,
                fragmentation: if m.reserved_bytes > 0 {
                    m.inactive_split_bytes as f64 / m.reserved_bytes as f64
                } else {
                    0.0
                },
                arena_bytes: gpu.arena_bytes,
            }),
            Device::Cpu => None,
        };
        let mut timeline = Timeline {
            threads: if self.device_timing {
                vec![(1, "cpu (launch)".into()), (2, "gpu (cuda events)".into())]
            } else {
                vec![(1, "ops".into())]
            },
            slices: self.slices,
            counters: Vec::new(),
        };
        let (gpu_report, gpu_unavailable) = match gpu.sampled {
            Ok((device_name, period_ms, gpm, samples)) => {
                if opts.trace_out.is_some() {
                    for s in &samples {
                        for (i, (name, unit)) in metrics::gpu::METRICS.iter().enumerate() {
                            if let Some(v) = s.values[i] {
                                timeline.counters.push(Counter {
                                    track: format!("{name} ({unit})"),
                                    ts: s.t_us,
                                    value: v,
                                });
                            }
                        }
                    }
                }
                let first = self.windows.first().map_or(0.0, |w| w.0);
                let last = self.windows.last().map_or(0.0, |w| w.1);
                (
                    Some(GpuReport {
                        device: device_name,
                        period_ms,
                        gpm,
                        samples: samples.len(),
                        measured: metrics::gpu::summarise(&samples, first, last),
                        per_iteration: self
                            .windows
                            .iter()
                            .map(|w| metrics::gpu::summarise(&samples, w.0, w.1))
                            .collect(),
                    }),
                    None,
                )
            }
            Err(why) => (None, why),
        };
        let report = Report {
            trace: plan.source.clone(),
            device: device.name(),
            threads: tch::get_num_threads(),
            warmup: opts.warmup,
            iters,
            ops_selected: plan.included(opts.only),
            ops_replayed: replayed,
            ops_failed: failed,
            ops_skipped: skipped,
            failures: self
                .failures
                .into_iter()
                .map(|((op, kind, reason), count)| Failure {
                    op,
                    count,
                    kind,
                    reason,
                })
                .collect(),
            timing: if self.device_timing {
                "cuda events"
            } else {
                "host clock"
            },
            iter_ms: iter,
            iter_samples_ms: self.iter_ms.clone(),
            op_ms: opsum,
            op_samples_ms: self.op_ms.clone(),
            overhead_us_per_op: ((iter.median - opsum.median - gaps_ms) * 1000.0 / steps).max(0.0),
            peak_bytes: self.peak,
            page_faults_per_iter: self.faults.map(|f| f as f64 / n_iters),
            nonfinite_externals,
            external_bytes: self.external_bytes,
            externals: plan.externals.len(),
            device_memory: device.memory(),
            cuda_memory,
            gpu: gpu_report,
            gpu_unavailable,
            event_error: self.event_error,
            cpu: Some(self.cpu.report()),
            ops,
            fallbacks,
            restored_scalars: {
                let mut by: BTreeMap<(String, String), crate::report::RestoredScalar> =
                    BTreeMap::new();
                for r in &plan.restored {
                    let op = plan.steps[r.step].name.clone();
                    by.entry((op.clone(), r.arg.clone()))
                        .or_insert_with(|| crate::report::RestoredScalar {
                            op,
                            arg: r.arg.clone(),
                            value: r.value,
                            count: 0,
                            why: r.why.clone(),
                        })
                        .count += 1;
                }
                by.into_values().collect()
            },
            comm: rank.map(|_| {
                let cuda = match self.cuda_comm {
                    Some(crate::ffi::CudaComm::Nccl) => "; CUDA tensors through NCCL",
                    Some(crate::ffi::CudaComm::Gloo) => {
                        "; CUDA tensors through Gloo (ranks share a GPU: NCCL needs one per rank)"
                    }
                    _ if plan.recorded_nccl() => "; the trace's NCCL groups run on Gloo on CPU",
                    _ => "",
                };
                format!("gloo, {} process group(s){cuda}", plan.groups.len())
            }),
            rank: rank.map(|r| r.0),
            world_size: rank.map(|r| r.1),
            collectives: colls.into_values().collect(),
            gaps_ms,
            gap_pace,
            steps: plan
                .steps
                .iter()
                .zip(&self.step_us)
                .zip(&self.step_launch_samples)
                .map(|((s, v), h)| StepTiming {
                    id: s.id,
                    op: s.name.clone(),
                    us: Stats::of(v).median,
                    launch_us: Stats::of(h).median,
                })
                .collect(),
            steps_alternating_us: self.alternating.as_ref().map(|a| {
                a.each_ref().map(|by_step| {
                    by_step
                        .iter()
                        .map(|v| {
                            if v.is_empty() {
                                f64::NAN
                            } else {
                                Stats::of(v).median
                            }
                        })
                        .collect()
                })
            }),
            profiled: consolidate(&self.profiled),
            instrument_error: self.instrument_error,
            gpu_activity: self.gpu_activity,
            instrumented_event_us: in_context.map(|c| c.0),
            instrumented_backward_event_us: in_context.map(|c| backward_costs(c.1, c.2)),
            events_probed_in_context: in_context.is_some(),
            instrumented_op_us: probe_cost(&self.op_probes, 1),
            instrumented_node_us: probe_cost(&self.node_probes, crate::ffi::PROBE_NODES + 1),
            instrumented_iter_ms: (!self.instrumented_ms.is_empty())
                .then(|| Stats::of(&self.instrumented_ms).median),
            first_nonfinite: self.first_nonfinite,
        };
        (report, timeline)
    }
}

/// What the instrumentation adds to a probe, per unit of it (`units`: the events or nodes one
/// probe runs): the mean of its times under the instrumentation less the mean without (each
/// the middle 80% of them); `None` where either was not timed.
fn probe_cost(probes: &[Vec<f64>; 2], units: usize) -> Option<f64> {
    // The mean of the middle 80%: a probe of about a microsecond is now and then 5-10 times
    // that (an interrupt, a page fault), and a few such in a short trace's samples moved the
    // difference by more than itself (0-3 us an op over twelve replays of a 45-step trace).
    let mean = |v: &[f64]| {
        let mut v: Vec<f64> = v
            .iter()
            .copied()
            .filter(|x| x.is_finite() && *x >= 0.0)
            .collect();
        v.sort_by(f64::total_cmp);
        let cut = v.len() / 10;
        let mid = &v[cut..v.len() - cut];
        (!mid.is_empty()).then(|| mid.iter().sum::<f64>() / mid.len() as f64)
    };
    let (plain, instrumented) = (mean(&probes[0])?, mean(&probes[1])?);
    Some(((instrumented - plain) / units.max(1) as f64).max(0.0))
}

/// (µs per backward event, µs per tensor input) from the costs of events with 1 and with 4.
fn backward_costs(one: f64, four: f64) -> (f64, f64) {
    let per_tensor = ((four - one) / 3.0).max(0.0);
    ((one - per_tensor).max(0.0), per_tensor)
}

/// The mean of `v` without the values a lost time slice lengthened (at least
/// [`et_graph::SLICE_MIN_US`] above the median): a profiled window or lead is set against the
/// original's single profiled sample of it, whose expectation is a mean. The instrumentation
/// costs some boundaries a few µs more now and then (the observer's and the profiler's buffers):
/// a single capture holds them where they fell, and a median over the replay's instrumented
/// iterations left them out, which read an overhead-bound model's capture as 20% slower than
/// this host (a loop of 200 `torch.add` on 16 floats, captured and replayed on the same host:
/// `speed` 0.80 with medians, 0.91 with means) and its instrumentation as cheaper.
fn mean_without_slices(v: &[f64]) -> f64 {
    let m = Stats::of(v).median;
    let kept: Vec<f64> = v
        .iter()
        .copied()
        .filter(|x| *x - m < et_graph::SLICE_MIN_US)
        .collect();
    if kept.is_empty() {
        m
    } else {
        kept.iter().sum::<f64>() / kept.len() as f64
    }
}

/// One window per step from several instrumented iterations: each step's mean duration and
/// mean time since the previous step's end (where both were found in an iteration), without
/// those a lost slice lengthened ([`mean_without_slices`]), laid end to end; `None` for steps
/// no iteration found.
fn consolidate(runs: &[Vec<Option<ProfiledStep>>]) -> Vec<Option<ProfiledStep>> {
    let n = runs.iter().map(Vec::len).max().unwrap_or(0);
    // Each step's lead times: from the previous step's end where both were found in a run.
    let leads_of = |pos: usize| -> Vec<f64> {
        runs.iter()
            .filter_map(|r| {
                let prev = r.get(pos.checked_sub(1)?)?.as_ref()?;
                Some(r.get(pos)?.as_ref()?.start_us - prev.end_us)
            })
            .collect()
    };
    // A step whose neighbour was found only in other runs gets the typical lead, not 0 (a
    // zero boundary would read as "no time between ops").
    let all: Vec<f64> = (1..n).flat_map(leads_of).collect();
    let typical = mean_without_slices(&all);
    let mut out = Vec::with_capacity(n);
    let mut cursor = 0.0;
    for pos in 0..n {
        let found: Vec<&ProfiledStep> = runs.iter().filter_map(|r| r.get(pos)?.as_ref()).collect();
        if found.is_empty() {
            out.push(None);
            continue;
        }
        // In running time: the time the thread waited for a CPU inside a window is not the op's.
        let durs: Vec<f64> = found
            .iter()
            .map(|p| p.end_us - p.start_us - p.waited_us)
            .collect();
        let leads = leads_of(pos);
        let lead = if !leads.is_empty() {
            mean_without_slices(&leads)
        } else if pos > 0 && out.last().is_some_and(Option::is_some) {
            typical
        } else {
            0.0
        };
        let mut nested: Vec<u32> = found.iter().map(|p| p.nested).collect();
        nested.sort_unstable();
        let start = cursor + lead;
        let end = start + mean_without_slices(&durs);
        out.push(Some(ProfiledStep {
            start_us: start,
            end_us: end,
            nested: nested[nested.len() / 2],
            // Already out of the window.
            waited_us: 0.0,
        }));
        cursor = end;
    }
    out
}

/// What a run's GPU side hands the recorder: NVML samples (device name, period in ms, GPM read,
/// samples) or why there are none (`None`: not a GPU replay), and the external-input arena.
pub(crate) struct GpuSamples {
    pub sampled: Result<(String, f64, bool, Vec<metrics::gpu::GpuSample>), Option<String>>,
    pub arena_bytes: u64,
}

/// One step's call in a measured iteration: its marks, and the time the thread waited for a
/// CPU between them (with [`ReplayOptions::running_time`]; 0 otherwise).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timed {
    pub pos: usize,
    pub start: Mark,
    pub end: Mark,
    pub waited_us: f64,
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
mod tests {
    use super::*;

    #[test]
    fn a_probes_cost_is_the_difference_of_its_means_per_unit() {
        // Failed probes (negative) are left out, and the extremes of ten or more.
        let plain = [vec![1.0; 8], vec![0.1, 9.0]].concat();
        let instrumented = [vec![2.0; 4], vec![2.2; 4], vec![-1.0, 0.5, 30.0]].concat();
        let cost = probe_cost(&[plain, instrumented], 2).unwrap();
        assert!((cost - (2.1 - 1.0) / 2.0).abs() < 1e-12, "{cost}");
        // Cheaper under the instrumentation than without (noise): no cost, never negative.
        assert_eq!(probe_cost(&[vec![3.0], vec![2.0]], 1), Some(0.0));
        // Not timed on either side: none.
        assert_eq!(probe_cost(&[vec![], vec![2.0]], 1), None);
        assert_eq!(probe_cost(&[vec![1.0], vec![-1.0]], 1), None);
    }

    fn w(start_us: f64, end_us: f64, nested: u32) -> Option<ProfiledStep> {
        Some(ProfiledStep {
            start_us,
            end_us,
            nested,
            waited_us: 0.0,
        })
    }

    /// The session's warm-up iteration opens the profile: its events are passed over, so the
    /// recorded iteration's windows are its own (here 50 and 8 µs, not the warm-up's 10 and 8).
    #[test]
    fn the_warm_up_iterations_events_are_not_a_recorded_iterations() {
        use et_schema::testkit::{tensor, TraceBuilder};
        let add = "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor";
        let f32 = |id| tensor(id, id, 0, 4, 4, "cpu");
        let mut b = TraceBuilder::new();
        for (x, out) in [(1, 3), (3, 4)] {
            b.op("aten::add", add)
                .input(f32(x), serde_json::json!([4]), "Tensor(float)")
                .input(f32(2), serde_json::json!([4]), "Tensor(float)")
                .input(serde_json::json!(1), serde_json::json!([]), "Int")
                .output(f32(out), serde_json::json!([4]), "Tensor(float)")
                .done();
        }
        let t = b.build();
        let g = et_graph::Graph::new(&t);
        let plan = crate::plan::compile(&g, &g.replay_set(None));
        let opts = ReplayOptions::default();
        let ev = |start_us: u64, end_us: u64| crate::ffi::ProfiledEvent {
            name: "aten::add".into(),
            start_ns: start_us * 1000,
            end_ns: end_us * 1000,
        };
        let profile = Profile {
            cpu: vec![ev(0, 10), ev(12, 20), ev(100, 150), ev(152, 160)],
            gpu: Vec::new(),
        };
        let both = vec![(0usize, 0.0), (1, 0.0)];
        let windows = |warm_up: Option<&[(usize, f64)]>| {
            let mut rec = Recorder::new(&plan, &opts, 0, metrics::cpu::CpuSampler::new());
            rec.profiled(&profile, warm_up, std::slice::from_ref(&both));
            rec.profiled[0]
                .iter()
                .map(|p| p.map(|p| p.end_us - p.start_us))
                .collect::<Vec<_>>()
        };
        assert_eq!(windows(Some(&both)), vec![Some(50.0), Some(8.0)]);
        // Without it, the warm-up's windows stood for the recorded iteration's.
        assert_eq!(windows(None), vec![Some(10.0), Some(8.0)]);
    }

    #[test]
    fn time_waited_for_a_cpu_leaves_the_windows_but_not_the_leads() {
        // The first step lost a 1500 µs slice in two runs of three: its running time is 10 µs
        // in each, and the next step's lead is still 2.
        let lost = |mut p: Option<ProfiledStep>, waited_us: f64| {
            if let Some(p) = &mut p {
                p.end_us += waited_us;
                p.waited_us = waited_us;
            }
            p
        };
        let runs = vec![
            vec![lost(w(0.0, 10.0, 0), 1500.0), w(1512.0, 1517.0, 0)],
            vec![lost(w(0.0, 10.0, 0), 1500.0), w(1512.0, 1517.0, 0)],
            vec![w(0.0, 10.0, 0), w(12.0, 17.0, 0)],
        ];
        let c = consolidate(&runs);
        let (a, b) = (c[0].unwrap(), c[1].unwrap());
        assert_eq!((a.start_us, a.end_us, a.waited_us), (0.0, 10.0, 0.0));
        assert_eq!((b.start_us, b.end_us), (12.0, 17.0));
    }

    #[test]
    fn instrumented_windows_consolidate_to_means_of_durations_and_lead_times() {
        // Four runs of two steps: step 0 lasts 10 and 12 (the third run misses it), step 1
        // lasts 5, 5, 6 and, in the fourth run, 2005 (a lost time slice: left out); step 1
        // starts 2, 3 and 2 after step 0 ends.
        let runs = vec![
            vec![w(100.0, 110.0, 1), w(112.0, 117.0, 0)],
            vec![w(0.0, 12.0, 1), w(15.0, 20.0, 0)],
            vec![None, w(7.0, 13.0, 2)],
            vec![w(0.0, 11.0, 1), w(13.0, 2018.0, 0)],
        ];
        let c = consolidate(&runs);
        let (a, b) = (c[0].unwrap(), c[1].unwrap());
        assert_eq!((a.start_us, a.end_us, a.nested), (0.0, 11.0, 1));
        // lead: the mean of 2, 3 and 2; duration: the mean of 5, 5 and 6, without 2005.
        let lead = 7.0 / 3.0;
        assert!((b.start_us - (11.0 + lead)).abs() < 1e-9, "{b:?}");
        assert!((b.end_us - b.start_us - 16.0 / 3.0).abs() < 1e-9, "{b:?}");
        assert_eq!(consolidate(&[vec![None, None]]), vec![None, None]);
        // Neighbours found only in different runs: the typical lead (here 2), not 0.
        let runs = vec![
            vec![w(0.0, 10.0, 0), w(12.0, 14.0, 0), None],
            vec![None, None, w(50.0, 51.0, 0)],
        ];
        let c = consolidate(&runs);
        assert_eq!(c[2].unwrap().start_us, c[1].unwrap().end_us + 2.0);
    }
}
