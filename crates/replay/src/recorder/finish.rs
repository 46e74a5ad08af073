//! Building the [`Report`] from what a run recorded: per-op and per-collective timings,
//! fallbacks, memory, GPU samples, the instrumentation's costs and the profiled windows.

use super::*;

impl Recorder<'_> {
    /// The report of the run, and the timeline of its last measured iteration (with NVML's
    /// counters where `trace_out` asked for them).
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
        let in_context = self.events_in_context();
        let iters = opts.iters.max(1);
        let ops = self.op_timings(iters);
        let collective_calls = self.collective_calls(rank.map(|r| r.1));
        let collectives =
            self.collective_timings(&collective_calls, iters, rank.map_or(1, |r| r.1));
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
        let fallbacks = self.fallbacks(bound, device);
        let cuda_memory = cuda_memory(device, &gpu);
        let mut timeline = Timeline {
            threads: if self.device_timing {
                vec![(1, "cpu (launch)".into()), (2, "gpu (cuda events)".into())]
            } else {
                vec![(1, "ops".into())]
            },
            slices: std::mem::take(&mut self.slices),
            counters: Vec::new(),
        };
        if (timeline.slices.iter()).any(|s| s.tid == super::IN_FLIGHT_TID) {
            (timeline.threads).push((super::IN_FLIGHT_TID, "collectives in flight".into()));
        }
        // The memory timeline: what the counted iteration held after each step, at that step's
        // end in the iteration the slices show (the same step, the same allocations).
        for &(pos, bytes) in &self.allocated_after {
            if let Some(Some(ts)) = self.step_end_us.get(pos) {
                timeline.counters.push(Counter {
                    track: "allocated (bytes)".into(),
                    ts: *ts,
                    value: bytes as f64,
                });
            }
        }
        let (gpu_report, gpu_unavailable) = self.gpu_report(gpu, &mut timeline);
        let (op, op_in_window) = self.op_costs();
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
            failures: std::mem::take(&mut self.failures)
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
            iteration_memory: None,
            frees_followed: None,
            estimated_peak_bytes: 0,
            graph_released: 0,
            page_faults_per_iter: self.faults.map(|f| f as f64 / iters as f64),
            nonfinite_externals,
            external_bytes: self.external_bytes,
            externals: plan.externals.len(),
            pool: None,
            device_memory: device.memory(),
            cuda_memory,
            gpu: gpu_report,
            gpu_unavailable,
            event_error: self.event_error.take(),
            cpu: Some(self.cpu.report()),
            ops,
            fallbacks,
            restored_scalars: restored_scalars(plan),
            comm: rank.map(|_| self.comm_description()),
            rank: rank.map(|r| r.0),
            world_size: rank.map(|r| r.1),
            collectives,
            collective_calls,
            paced: opts.comm.paced_span_ms.map(|trace_ms| {
                let at: Vec<f64> = opts.comm.paced_us.as_ref().map_or(Vec::new(), |at| {
                    plan.steps
                        .iter()
                        .zip(at)
                        .filter(|(s, _)| match &s.kind {
                            StepKind::Collective(c) => {
                                c.kind() != "wait" && s.kind.included(opts.only)
                            }
                            _ => false,
                        })
                        .filter_map(|(_, t)| *t)
                        .collect()
                });
                crate::report::PacedReport {
                    trace_ms,
                    collectives: at.len(),
                    last_collective_ms: at.iter().copied().fold(0.0, f64::max) / 1000.0,
                }
            }),
            check: self.check.take(),
            timeline_origin_unix_us: 0.0,
            gaps_ms,
            gap_pace,
            steps: self.step_timings(),
            step_leads_us: medians(&self.step_lead_samples),
            steps_alternating_us: self.alternating_medians(),
            profiled: consolidate(&self.profiled),
            instrument_error: self.instrument_error.take(),
            gpu_activity: self.gpu_activity.take(),
            instrumented_event_us: in_context.map(|c| c.0),
            instrumented_backward_event_us: in_context.map(|c| backward_costs(c.1, c.2)),
            events_probed_in_context: in_context.is_some(),
            instrumented_op_us: op,
            instrumented_op_in_window_us: op_in_window,
            instrumented_call_us: self.call_costs(),
            instrumented_boxing_us: self.boxing_cost(op, op_in_window),
            instrumented_node_us: probe_cost(&self.node_probes, crate::ffi::PROBE_NODES + 1),
            instrumented_edges_us: (!self.step_edges_us.is_empty())
                .then(|| Stats::of(&self.step_edges_us).median),
            instrumented_iter_ms: (!self.instrumented_ms.is_empty())
                .then(|| Stats::of(&self.instrumented_ms).median),
            first_nonfinite: self.first_nonfinite.take(),
        };
        (report, timeline)
    }

    /// The events' costs in context (a plain event, backward events with 1 and 4 inputs),
    /// where probed: means (a cost's occasional larger values, the profiler's buffers, are
    /// costs the capture's events paid too), less those a lost time slice lengthened.
    fn events_in_context(&self) -> Option<(f64, f64, f64)> {
        (!self.probed_in_context.is_empty()).then(|| {
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
        })
    }

    /// Per op name, calls and time per measured iteration, the costliest first.
    fn op_timings(&self, iters: usize) -> Vec<OpTiming> {
        let mut per_op: BTreeMap<&str, (usize, f64, f64)> = BTreeMap::new();
        for (pos, step) in self.plan.steps.iter().enumerate() {
            if self.step_calls[pos] > 0 {
                let e = per_op.entry(step.name.as_str()).or_default();
                e.0 += self.step_calls[pos] as usize;
                e.1 += self.step_total_us[pos];
                e.2 += self.step_launch_us[pos];
            }
        }
        let mut ops: Vec<OpTiming> = per_op
            .into_iter()
            .map(|(name, (count, us, launch))| OpTiming {
                op: name.to_string(),
                count: count / iters,
                total_ms: us / 1000.0 / iters as f64,
                mean_us: us / count.max(1) as f64,
                launch_us: launch / count.max(1) as f64,
            })
            .collect();
        ops.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms));
        ops
    }

    /// Every collective step that ran, with each measured call's latency. `world`: the ranks
    /// the job ran on, the size of the default group (the plan's group 0) where the trace
    /// recorded none.
    fn collective_calls(&self, world: Option<usize>) -> Vec<CollectiveCall> {
        let plan = self.plan;
        self.coll_calls
            .iter()
            .filter_map(|(&pos, samples)| {
                let step = &plan.steps[pos];
                let StepKind::Collective(c) = &step.kind else {
                    return None;
                };
                let group = plan.groups.get(c.group as usize);
                let group_size = c
                    .pg_size
                    .filter(|&n| n > 0)
                    .or_else(|| group.map(|g| g.size).filter(|&n| n > 0))
                    .or_else(|| group.map(|g| g.ranks.len() as i64).filter(|&n| n > 0))
                    .map(|n| n as usize)
                    .or(world.filter(|_| c.group == 0))
                    .unwrap_or(0);
                Some(CollectiveCall {
                    id: step.id,
                    op: step.name.clone(),
                    kind: c.kind(),
                    group: c
                        .pg_name
                        .clone()
                        .or_else(|| group.map(|g| g.name.clone()))
                        .unwrap_or_else(|| "0".into()),
                    group_size,
                    size_bytes: self
                        .resized
                        .get(&pos)
                        .copied()
                        .unwrap_or_else(|| c.message_bytes()),
                    bytes: self.resized.get(&pos).copied().unwrap_or(c.bytes),
                    latency_us: samples.latency.clone(),
                    skew_us: samples.skew.clone(),
                    after_us: samples.after.clone(),
                })
            })
            .collect()
    }

    /// Per collective kind: calls, bytes and time per measured iteration, latency statistics
    /// over the calls, and the bandwidth in nccl-tests' convention (`world`: the ranks of a
    /// group whose size is not recorded).
    fn collective_timings(
        &self,
        calls: &[CollectiveCall],
        iters: usize,
        world: usize,
    ) -> BTreeMap<String, CollectiveTiming> {
        CollectiveTiming::by_kind(calls.iter(), iters, world)
    }

    /// Ops that ran otherwise than the trace's: planned fallbacks of the steps `--only` kept,
    /// detours taken at run time (float32, the CPU, a reshape) and ops run without autograd
    /// recording.
    fn fallbacks(&mut self, bound: &Bound, device: &Device) -> Vec<Fallback> {
        let mut planned: BTreeMap<(String, String), usize> = BTreeMap::new();
        for (s, b) in self.plan.steps.iter().zip(&bound.steps) {
            if !s.kind.included(self.opts.only) {
                continue;
            }
            if let Some(f) = &b.fallback {
                *planned.entry((s.name.clone(), f.clone())).or_default() += 1;
            }
        }
        let detours = std::mem::take(&mut self.detours);
        let grad_refused = std::mem::take(&mut self.grad_refused);
        planned
            .into_iter()
            .map(|((op, ran_as), count)| Fallback { op, count, ran_as })
            .chain(detours.into_iter().map(|((op, via), count)| Fallback {
                op,
                count,
                ran_as: detour_text(via, device),
            }))
            .chain(
                grad_refused
                    .into_iter()
                    .map(|(op, (count, reason))| Fallback {
                        op,
                        count,
                        ran_as: format!("without autograd recording: {reason}"),
                    }),
            )
            .collect()
    }

    /// NVML's summary over the measured iterations and per iteration (its counters added to
    /// the timeline where `trace_out` asked for it), or why there is none.
    fn gpu_report(
        &self,
        gpu: GpuSamples,
        timeline: &mut Timeline,
    ) -> (Option<GpuReport>, Option<String>) {
        let (device_name, period_ms, gpm, samples) = match gpu.sampled {
            Ok(s) => s,
            Err(why) => return (None, why),
        };
        if self.opts.trace_out.is_some() {
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
        let report = GpuReport {
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
        };
        (Some(report), None)
    }

    /// How a rank's collectives ran: the backend, the process groups, where CUDA tensors went.
    fn comm_description(&self) -> String {
        let plan = self.plan;
        let cuda = match self.cuda_comm {
            Some(crate::ffi::CudaComm::Nccl) => "; CUDA tensors through NCCL",
            Some(crate::ffi::CudaComm::Gloo) => {
                "; CUDA tensors through Gloo (ranks share a GPU: NCCL needs one per rank)"
            }
            _ if plan.recorded_nccl() => "; the trace's NCCL groups run on Gloo on CPU",
            _ => "",
        };
        format!("gloo, {} process group(s){cuda}", plan.groups.len())
    }

    /// Each step's median time and launch time over the measured iterations.
    fn step_timings(&self) -> Vec<StepTiming> {
        self.plan
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
            .collect()
    }

    /// With alternating runs, each kind's median time per step (NaN where not timed).
    fn alternating_medians(&self) -> Option<[Vec<f64>; 2]> {
        self.alternating
            .as_ref()
            .map(|a| a.each_ref().map(|by_step| medians(by_step)))
    }
}

/// Each step's median of its samples (NaN where it has none).
fn medians(by_step: &[Vec<f64>]) -> Vec<f64> {
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
}

/// How a detour taken at run time ran its op.
fn detour_text(via: Via, device: &Device) -> String {
    match via {
        Via::Float32 => format!("in float32: no half-precision kernel on {}", device.name()),
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
    }
}

/// The CUDA caching allocator's statistics and the external-input arena, on CUDA.
fn cuda_memory(device: &Device, gpu: &GpuSamples) -> Option<CudaMemory> {
    match device {
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
    }
}

/// Scalars the plan restored, counted per (op, argument).
fn restored_scalars(plan: &Plan) -> Vec<crate::report::RestoredScalar> {
    let mut by: BTreeMap<(String, String), crate::report::RestoredScalar> = BTreeMap::new();
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
}

impl Recorder<'_> {
    /// Per step, what the instrumentation adds to its call outside the call's profiled window
    /// (µs): its call probe's time under the instrumentation less its event's window, less the
    /// probes' plain time (their middle mean); `None` where the step was not probed or its
    /// event not found.
    pub(super) fn call_costs(&self) -> Vec<Option<f64>> {
        let mut out = vec![None; self.plan.steps.len()];
        let Some(plain) = middle_mean(&self.call_probes[0].iter().map(|c| c.1).collect::<Vec<_>>())
        else {
            return Vec::new();
        };
        for &(pos, us) in &self.call_probes[1] {
            if let (Some(w), Some(o)) = (self.call_probe_windows.get(&pos), out.get_mut(pos)) {
                if us >= 0.0 {
                    *o = Some((us - w - plain).max(0.0));
                }
            }
        }
        out
    }

    /// What the instrumentation adds to the op probe's call (µs), and the part of that inside
    /// its profiled window.
    pub(super) fn op_costs(&self) -> (Option<f64>, Option<f64>) {
        (
            probe_cost(&self.op_probes, 1),
            in_window(&self.op_probe_windows, &self.op_kernels),
        )
    }

    /// What boxing an op's inputs for the instrumentation costs a call made as Python makes
    /// one (µs): the op probe's cost outside its window less the boxed add probe's, each
    /// without its plain time.
    /// `op`, `inside`: the op probe's cost and the part of it inside its window
    /// ([`Recorder::op_costs`]).
    pub(super) fn boxing_cost(&self, op: Option<f64>, inside: Option<f64>) -> Option<f64> {
        let (op, inside) = (op?, inside?);
        let boxed = probe_cost(&self.boxed_add_probes, 1)? - middle_mean(&self.boxed_add_windows)?;
        Some((op - inside - boxed).max(0.0))
    }
}

/// What the instrumentation adds to a probe, per unit of it (`units`: the events or nodes one
/// probe runs): the mean of its times under the instrumentation less the mean without (each
/// the middle 80% of them); `None` where either was not timed.
pub(super) fn probe_cost(probes: &[Vec<f64>; 2], units: usize) -> Option<f64> {
    let (plain, instrumented) = (middle_mean(&probes[0])?, middle_mean(&probes[1])?);
    Some(((instrumented - plain) / units.max(1) as f64).max(0.0))
}

/// The mean of the middle 80% of the finite, non-negative values: a probe of about a
/// microsecond is now and then 5-10 times that (an interrupt, a page fault), and a few such in
/// a short trace's samples moved a difference of two means by more than itself (0-3 us an op
/// over twelve replays of a 45-step trace).
fn middle_mean(v: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = v
        .iter()
        .copied()
        .filter(|x| x.is_finite() && *x >= 0.0)
        .collect();
    v.sort_by(f64::total_cmp);
    let cut = v.len() / 10;
    let mid = &v[cut..v.len() - cut];
    (!mid.is_empty()).then(|| mid.iter().sum::<f64>() / mid.len() as f64)
}

/// Of the op probe's instrumented cost, the part inside its profiled window (µs): the windows'
/// mean less that of its kernel called without the dispatcher; `None` where no window was
/// found.
pub(super) fn in_window(windows: &[f64], kernels: &[f64]) -> Option<f64> {
    Some((middle_mean(windows)? - middle_mean(kernels)?).max(0.0))
}

/// (µs per backward event, µs per tensor input) from the costs of events with 1 and with 4.
pub(super) fn backward_costs(one: f64, four: f64) -> (f64, f64) {
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
pub(super) fn mean_without_slices(v: &[f64]) -> f64 {
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
pub(super) fn consolidate(runs: &[Vec<Option<ProfiledStep>>]) -> Vec<Option<ProfiledStep>> {
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
