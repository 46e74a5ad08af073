//! `compare`: replays a linked ET and compares it with its Kineto trace, per iteration and per
//! op, like for like (the replay's ops also timed under the capture's instrumentation).

use crate::card::{Card, Figure, Unit};
use crate::replay_cmd::{completed, linked, meta_of, original_ms_in, RunOptions};
use anyhow::Result;
use et_graph::{Graph, Selection};
use mystique_cli::args::CompareArgs;
use replay::calibrate;
use std::io::Write;
use std::path::Path;

/// Replays a linked ET and compares it op by op with its Kineto trace.
pub fn compare(a: &CompareArgs, json: bool) -> Result<()> {
    for p in [&a.svg, &a.card_plot].into_iter().flatten() {
        mystique_cli::output::check_plot(p, &[a.trace.as_path(), a.kineto.as_path()])?;
    }
    if let (Some(x), Some(y)) = (&a.svg, &a.card_plot) {
        anyhow::ensure!(
            !mystique_cli::output::same_path(x, y),
            "{} is given for two outputs",
            x.display()
        );
    }
    a.run.apply()?;
    // The capture's meta file: the original's time, threads, CPU time and memory.
    let meta = meta_of(&a.trace);
    // The original's thread count, where its meta file recorded it and --threads says none.
    crate::replay_cmd::original_threads(a.run.threads, || meta.as_ref()?.0["threads"].as_i64());
    let device = replay::Device::parse(&a.device)?;
    let trace = mystique_cli::read_trace(&a.trace)?;
    let g = Graph::new(&trace);
    if let Some(n) = crate::replay_cmd::compiled_regions(&g) {
        eprintln!("note: {n}");
    }
    // One iteration: the original's times are per iteration, and so is its meta's.
    let iterations = match a.iteration {
        Some(n) => Some(vec![n]),
        None => {
            let holding: Vec<u64> = g
                .iterations()
                .iter()
                .map(|&(_, n)| n)
                .filter(|&n| !g.replay_set(Some(&[n])).ops.is_empty())
                .collect();
            anyhow::ensure!(
                holding.len() <= 1,
                "{} holds {} iterations ({}): compare one of them, --iteration N",
                a.trace.display(),
                holding.len(),
                holding
                    .iter()
                    .map(|n| format!("ProfilerStep#{n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            None
        }
    };
    // Every op of it; `--only` is the replay's to apply, as for `replay`.
    let set = g.select(&Selection {
        iterations,
        ..Default::default()
    })?;
    crate::replay_cmd::only_keeps_some(&g, &set, a.run.only, &a.trace)?;
    let linked = linked(&g, &set, &a.kineto, true)?;
    let original = Original::of(&linked, device);
    if let (Some(m), false) = (original.mismatch, json) {
        eprintln!("warning: {m}");
    }
    let reference = a
        .reference
        .as_deref()
        .map(calibrate::read_reference_and_trace)
        .transpose()?;
    if let (Some(r), Some((_, Some(recorded)))) = (&a.reference, &reference) {
        crate::replay_cmd::warn_other_traces_reference(r, recorded, &a.trace);
    }
    let gap_model = if a.emulate_gaps {
        Some(calibrate::calibrated_gaps(
            &g,
            &set,
            &linked,
            device,
            !a.run.no_autograd,
            calibrate::GapChoices {
                boundary_costs: calibrate::BoundaryCosts::Replay,
                reference: reference.clone().map(|(r, _)| et_graph::Reference::from(r)),
                time_base_with_gaps: false,
            },
        )?)
    } else {
        None
    };
    // Iterations under the capture's instrumentation follow: their op windows compare with
    // the original's Kineto durations like for like (both carry the profiler's cost). As
    // many as --iters, at most the default's 3: a GPU trace replayed on the CPU takes seconds
    // an iteration.
    let defaults = replay::ReplayOptions::default();
    let opts = replay::ReplayOptions {
        device,
        gaps_us: gap_model.as_ref().map(|m| m.gaps_us.clone()),
        gaps_base_us: gap_model.as_ref().map(|m| m.base_step_us.clone()),
        per_step: true,
        instrument: true,
        instrument_iters: a.run.iters.clamp(1, defaults.instrument_iters),
        instrumentation: et_graph::Instrumentation::of(&linked.kineto),
        // A profile taken with profile_memory says where the original freed each tensor.
        original_allocs: crate::replay_cmd::original_allocs(&linked),
        ..a.run.options()
    };
    let r = replay::replay(&g, &set, &opts)?.0;
    a.run.warn_values(&r);
    if let Some(e) = &r.instrument_error {
        eprintln!(
            "warning: instrumenting the replay ({}): {e}; ops are compared with their plain \
             replay times only",
            opts.instrumentation
        );
    }
    // Ops --only left out ran as pass-throughs: they are not compared.
    let by_id = trace.node_by_id();
    let included: Vec<bool> = r
        .steps
        .iter()
        .map(|s| {
            let coll = by_id
                .position(s.id)
                .is_some_and(|i| g.class[i].contains(et_graph::OpClass::COLLECTIVE));
            match a.run.only {
                et_graph::Kind::All => true,
                et_graph::Kind::Compute => !coll,
                et_graph::Kind::Comm => coll,
            }
        })
        .collect();
    // The reference's original is uninstrumented too: the iteration's basis where the capture
    // has no meta file.
    let referenced = reference.as_ref().map(|(r, _)| r.original_ms);
    let c = Compared::of(a, &original, &r, &included, meta.as_ref(), referenced)?;
    let card = c.card(&linked);
    // Plots are titled by the trace's file name, not the path it has on this machine.
    let name = Path::new(&trace.source)
        .file_name()
        .map_or(trace.source.clone(), |n| n.to_string_lossy().into_owned());
    if let Some(p) = &a.svg {
        c.plot(p, &name, &card)?;
    }
    if let Some(p) = &a.card_plot {
        card.plot(p, &name)?;
    }
    let printed = (|| -> Result<()> {
        let mut out = std::io::stdout().lock();
        if json {
            let mut j = c.json(&trace.source, &linked, set.ops.len(), gap_model.as_ref());
            j["card"] = card.json();
            serde_json::to_writer(&mut out, &j)?;
            writeln!(out)?;
        } else {
            c.print(&mut out, &linked, set.ops.len())?;
            if let Some(an) = gap_model.as_ref().and_then(|m| m.anchored.as_ref()) {
                writeln!(
                    out,
                    "anchored   on the reference: the gaps make the iteration {:.3} ms here, the \
                     original's {:.3} ms there x{:.3} (this host's plain op time over the \
                     reference's)",
                    an.target_ms, an.reference.original_ms, an.host_ratio
                )?;
            }
            card.print(&mut out)?;
            c.print_differences(&mut out)?;
            crate::print::print_failures(
                &mut out,
                "failures (their time is in none of the replay's figures)",
                &r,
            )?;
        }
        Ok(())
    })();
    mystique_cli::printed_then(printed, completed(&r))
}

/// The original's side of a comparison.
struct Original {
    /// Its timing per op: on CUDA for a GPU original, each op's GPU kernel time.
    timing: et_graph::OriginalTiming,
    /// Its GPU activity (no events: a CPU original).
    gpu: et_graph::GpuActivity,
    /// Its GPU work that no linked op launched: attributed, or named as not.
    off_op: et_graph::OffOpSummary,
    /// Whether ops are compared by GPU time (a GPU original replayed on CUDA).
    by_gpu: bool,
    /// Why per-op ratios set unlike times against each other, if they do.
    mismatch: Option<&'static str>,
}

impl Original {
    /// Like for like: a GPU original on CUDA compares GPU time per op; on CPU it is compared
    /// with CPU op times that include the work its GPU did asynchronously, which says so.
    fn of(linked: &calibrate::Linked, device: replay::Device) -> Original {
        let (gpu, gpu_per_op) = et_graph::original_gpu(&linked.link, &linked.kineto);
        let by_gpu = matches!(device, replay::Device::Cuda(_)) && gpu.events > 0;
        let mismatch = match (device, gpu.events > 0) {
            (replay::Device::Cpu, true) => Some(
                "the original ran on a GPU (its Kineto trace has GPU kernels) and this replay on \
                 the CPU: per-op ratios set the original's CPU launch times against the replay's \
                 full CPU execution (replay with --device cuda to compare GPU times)",
            ),
            (replay::Device::Cuda(_), false) => Some(
                "the original's Kineto trace has no GPU work and this replay runs on CUDA: per-op \
                 ratios set CPU times against CUDA event times",
            ),
            _ => None,
        };
        let timing = if by_gpu {
            et_graph::OriginalTiming {
                op_us: gpu_per_op,
                ..linked.original.clone()
            }
        } else {
            linked.original.clone()
        };
        Original {
            timing,
            gpu,
            off_op: et_graph::off_op_summary(&linked.link, &linked.kineto),
            by_gpu,
            mismatch,
        }
    }
}

/// The comparison's figures.
struct Compared<'a> {
    a: &'a CompareArgs,
    original: &'a Original,
    r: &'a replay::Report,
    /// The capture's meta file, read, and its path.
    meta: Option<&'a (serde_json::Value, std::path::PathBuf)>,
    /// Per op name, linked ops only: the original (Kineto), the plain replay, and the replay
    /// under the capture's instrumentation (like for like).
    cmp: et_graph::Comparison,
    orig_ops_ms: f64,
    gaps_ms: f64,
    orig_iter_ms: f64,
    /// The original's uninstrumented iteration (ms) and where it came from.
    uninstrumented: Option<(f64, String)>,
    ratio_iter: f64,
    basis_iter: String,
    ratio_ops: f64,
}

impl<'a> Compared<'a> {
    fn of(
        a: &'a CompareArgs,
        original: &'a Original,
        r: &'a replay::Report,
        included: &[bool],
        meta: Option<&'a (serde_json::Value, std::path::PathBuf)>,
        referenced: Option<f64>,
    ) -> Result<Compared<'a>> {
        // Left-out steps count as unlinked: in neither side's figures.
        let mut kept = original.timing.clone();
        for (k, op) in kept.op_us.iter_mut().enumerate() {
            if !included.get(k).copied().unwrap_or(true) {
                *op = None;
            }
        }
        let orig = &kept;
        let names: Vec<&str> = r.steps.iter().map(|s| s.op.as_str()).collect();
        let plain: Vec<f64> = r.steps.iter().map(|s| s.us).collect();
        // Profiled windows are host time: not comparable with GPU kernel time per op.
        let profiled: Vec<Option<f64>> = (0..r.steps.len())
            .map(|k| {
                r.profiled
                    .get(k)
                    .copied()
                    .flatten()
                    .filter(|_| !original.by_gpu)
                    .map(|p| p.end_us - p.start_us)
            })
            .collect();
        let mut cmp = et_graph::compare_ops(orig, &names, &plain, &profiled);
        // Ops whose calls failed first (the replay lacks their time, whatever the others'
        // differences), then the largest differences: the table's 15 rows always show them.
        cmp.ops.sort_by_key(|row| failed_calls(r, &row.op) == 0);
        let orig_ops_ms: f64 = orig.op_us.iter().flatten().sum::<f64>() / 1000.0;
        let gaps_ms: f64 = orig.gap_us.iter().sum::<f64>() / 1000.0;
        let orig_iter_ms = orig.span_us / 1000.0;
        // Like for like: uninstrumented with uninstrumented where the original's own time is
        // known, else profiled with profiled.
        let uninstrumented = match a.original_ms {
            Some(ms) if !(ms.is_finite() && ms > 0.0) => {
                anyhow::bail!("--original-ms must be a positive number of milliseconds, not {ms}")
            }
            Some(ms) => Some((ms, "--original-ms".to_string())),
            None => meta.and_then(original_ms_in).or_else(|| {
                let path = a.reference.as_deref()?.display();
                referenced.map(|ms| (ms, format!("the reference {path}")))
            }),
        };
        let (ratio_iter, basis_iter) = match (&uninstrumented, r.instrumented_iter_ms) {
            (Some((ms, from)), _) => (
                r.iter_ms.median / ms.max(1e-9),
                format!("uninstrumented: the replay's measured iterations vs the original's {ms:.3} ms ({from})"),
            ),
            (None, Some(p)) => (
                p / orig_iter_ms.max(1e-9),
                format!(
                    "profiled: the replay's iteration under the capture's instrumentation ({p:.3} ms) vs the profiled original{}",
                    if a.emulate_gaps { "" } else { " (without --emulate-gaps the replay has none of the original's time between ops)" }
                ),
            ),
            (None, None) => (
                r.iter_ms.median / orig_iter_ms.max(1e-9),
                "mixed: the plain replay vs the profiled original (the instrumented iteration could not run; pass --original-ms)".to_string(),
            ),
        };
        let ratio_ops = if cmp.profiled_ops > 0 {
            cmp.profiled_ms / cmp.profiled_original_ms.max(1e-9)
        } else {
            r.op_ms.median / orig_ops_ms.max(1e-9)
        };
        Ok(Compared {
            a,
            original,
            r,
            meta,
            cmp,
            orig_ops_ms,
            gaps_ms,
            orig_iter_ms,
            uninstrumented,
            ratio_iter,
            basis_iter,
            ratio_ops,
        })
    }

    /// The ops replayed under the capture's instrumentation against the original's.
    fn instrumented(&self) -> Option<serde_json::Value> {
        let c = &self.cmp;
        (c.profiled_ops > 0).then(|| {
            serde_json::json!({
                "ops": c.profiled_ops,
                "ops_ms": c.profiled_ms,
                "original_ops_ms": c.profiled_original_ms,
                "ratio_ops": c.profiled_ms / c.profiled_original_ms.max(1e-9),
            })
        })
    }

    /// `compare --json`.
    fn json(
        &self,
        trace: &str,
        linked: &calibrate::Linked,
        n_ops: usize,
        gap_model: Option<&et_graph::GapModel>,
    ) -> serde_json::Value {
        let (a, r, o) = (self.a, self.r, self.original);
        let basis_ops = if o.by_gpu {
            "gpu: the replay's CUDA-event time per op vs the original's kernel time under each op"
        } else if self.cmp.profiled_ops > 0 {
            "profiled: linked ops under the capture's instrumentation in both"
        } else {
            "mixed: plain replay ops vs profiled original ops"
        };
        serde_json::json!({
            "trace": trace,
            "kineto": linked.kineto.source,
            "linked": linked.link.linked(),
            "ops": n_ops,
            "original": {"iter_ms": self.orig_iter_ms, "ops_ms": self.orig_ops_ms, "gaps_ms": self.gaps_ms,
                         "uninstrumented_ms": self.uninstrumented.as_ref().map(|u| u.0)},
            "replay": {"iter_ms": r.iter_ms.median, "ops_ms": r.op_ms.median, "gaps_ms": r.gaps_ms, "gap_pace": r.gap_pace,
                       // Measured: the mean iteration less its mean time in ops.
                       "between_ops_ms": r.iter_ms.mean - r.op_ms.mean,
                       "instrumented_iter_ms": r.instrumented_iter_ms},
            "ratio_iter": self.ratio_iter,
            "basis_iter": self.basis_iter,
            "ratio_ops": self.ratio_ops,
            "basis_ops": basis_ops,
            "emulate_gaps": a.emulate_gaps,
            "device": r.device,
            "compared_by": if o.by_gpu { "gpu time per op" } else { "op time" },
            "device_mismatch": o.mismatch,
            "original_gpu": (o.gpu.events > 0).then_some(&o.gpu),
            "original_gpu_off_op": (o.gpu.events > 0).then_some(&o.off_op),
            "replay_gpu": r.gpu_activity,
            "gap_model": gap_model,
            "instrumented": self.instrumented(),
            "ops_failed": r.ops_failed,
            "failures": r.failures,
            "threads": r.threads,
            "top_differences": self.cmp.ops.iter().take(15).map(|r| {
                let failed = self.failed_calls(&r.op);
                serde_json::json!({
                    "op": r.op,
                    "calls": r.calls,
                    "failed_calls": failed,
                    "original_us": r.original_us,
                    "replay_us": r.replay_us,
                    // None where calls failed: the time is of the rest alone.
                    "ratio": (failed == 0).then(|| r.replay_us / r.original_us.max(1e-9)),
                    "replay_instrumented_us": r.profiled_us,
                    "ratio_instrumented": r.profiled_us.map(|p| p / r.original_us.max(1e-9)),
                })
            }).collect::<Vec<_>>(),
        })
    }

    /// `compare --svg`: the 20 largest differences per op, on the basis of the text's table
    /// (the profiled replay's op windows where it ran under the capture's instrumentation),
    /// headed by the card's iteration figure.
    fn plot(&self, out: &Path, name: &str, card: &Card) -> Result<()> {
        let profiled = self.cmp.profiled_ops > 0;
        let mut pairs: Vec<metrics::plot::Pair> = self
            .cmp
            .ops
            .iter()
            .take(20)
            .map(|r| {
                let replay = if self.failed_calls(&r.op) > 0 {
                    f64::NAN
                } else if profiled {
                    r.profiled_us.unwrap_or(f64::NAN)
                } else {
                    r.replay_us
                };
                metrics::plot::Pair {
                    label: format!("{} x{}", r.op, r.calls),
                    a: r.original_us / 1000.0,
                    b: replay / 1000.0,
                }
            })
            .collect();
        let unit = metrics::plot::time_per_iteration(&mut pairs);
        let it = card.figure("iteration_ms");
        let title = format!(
            "{name}: iteration {} original vs {} replay ({})",
            metrics::plot::human(it.and_then(|f| f.original).unwrap_or(f64::NAN), "ms"),
            metrics::plot::human(it.and_then(|f| f.replay).unwrap_or(f64::NAN), "ms"),
            self.basis_iter.split(':').next().unwrap_or(""),
        );
        let names = (
            "original (Kineto)",
            if profiled {
                "replay (same instrumentation)"
            } else {
                "replay (plain)"
            },
        );
        mystique_cli::output::write_plot(out, |f| {
            metrics::plot::pairs(
                f,
                &title,
                unit,
                names,
                "replay / original",
                metrics::plot::Shading::Closeness,
                &pairs,
            )
        })
    }

    /// The comparison as text.
    fn print(&self, out: &mut impl Write, linked: &calibrate::Linked, n_ops: usize) -> Result<()> {
        let (a, r, c) = (self.a, self.r, &self.cmp);
        let (orig_iter_ms, orig_ops_ms, gaps_ms) =
            (self.orig_iter_ms, self.orig_ops_ms, self.gaps_ms);
        writeln!(out, "linked     {} of {n_ops} ops", linked.link.linked())?;
        // The gaps are typical of the profile's iterations like this one (their least): this
        // iteration's own span may hold more.
        let rest = orig_iter_ms - orig_ops_ms - gaps_ms;
        let typical = if rest > 0.01 * orig_iter_ms {
            format!(" as typical of its iterations; {rest:.3} ms more in this one")
        } else if rest < -0.001 * orig_iter_ms {
            // Ops of other threads (autograd's, a collective's) run beside the main thread's:
            // their windows overlap, and their sum outruns the span.
            format!(
                "; {:.3} ms of the ops' time overlaps, on other threads",
                -rest
            )
        } else {
            String::new()
        };
        writeln!(out, "original   {orig_iter_ms:.3} ms per iteration profiled ({orig_ops_ms:.3} ms in ops, {gaps_ms:.3} ms between them{typical}){}",
            self.uninstrumented.as_ref().map(|(ms, from)| format!("; {ms:.3} ms uninstrumented ({from})")).unwrap_or_default())?;
        writeln!(
            out,
            "replay     {:.3} ms per iteration ({:.3} ms in ops{})",
            r.iter_ms.median,
            r.op_ms.median,
            if a.emulate_gaps {
                format!(", {:.3} ms emulated gaps", r.gaps_ms)
            } else {
                String::new()
            }
        )?;
        writeln!(
            out,
            "ratio      {:.3} per iteration, {}",
            self.ratio_iter, self.basis_iter
        )?;
        if c.profiled_ops > 0 {
            writeln!(
                out,
                "profiled   {:.3} ms in {} ops replayed under the capture's instrumentation vs {:.3} ms in the original: ratio {:.3}",
                c.profiled_ms,
                c.profiled_ops,
                c.profiled_original_ms,
                c.profiled_ms / c.profiled_original_ms.max(1e-9)
            )?;
        }
        if self.original.gpu.events > 0 {
            mystique_cli::graph_cmd::print_off_op(out, &self.original.off_op)?;
            mystique_cli::graph_cmd::print_gpu_activity(out, "original", &self.original.gpu)?;
        }
        if let Some(g) = &r.gpu_activity {
            mystique_cli::graph_cmd::print_gpu_activity(out, "replay", g)?;
        }
        Ok(())
    }

    /// The fidelity card: each figure of the original beside the replay's, on one basis.
    fn card(&self, linked: &calibrate::Linked) -> Card {
        let (r, o, c) = (self.r, self.original, &self.cmp);
        let meta = self.meta;
        let meta_f64 = |key: &str| {
            meta.and_then(|(v, _)| v[key].as_f64())
                .filter(|x| x.is_finite())
        };
        let meta_name = meta
            .map(|(_, p)| p.display().to_string())
            .unwrap_or_else(|| "the capture's meta file".into());
        let mut card = Card::default();
        // Time.
        let iteration = match (&self.uninstrumented, r.instrumented_iter_ms) {
            (Some((ms, _)), _) => Figure::new(Some(*ms), Some(r.iter_ms.median), &self.basis_iter),
            (None, Some(p)) => Figure::new(Some(self.orig_iter_ms), Some(p), &self.basis_iter),
            (None, None) => Figure::new(
                Some(self.orig_iter_ms),
                Some(r.iter_ms.median),
                &self.basis_iter,
            ),
        };
        card.push("iteration_ms", Unit::Ms, iteration);
        let ops = if o.by_gpu {
            Figure::new(
                Some(self.orig_ops_ms),
                Some(r.op_ms.median),
                "gpu: the original's kernel time under each op (Kineto) vs the replay's CUDA-event \
                 time per op",
            )
        } else if c.profiled_ops > 0 {
            Figure::new(
                Some(c.profiled_original_ms),
                Some(c.profiled_ms),
                format!(
                    "profiled: the {} linked ops' Kineto durations in the original vs their \
                     windows in the replay's iteration under the capture's instrumentation",
                    c.profiled_ops
                ),
            )
        } else {
            Figure::new(
                Some(self.orig_ops_ms),
                Some(r.op_ms.median),
                "mixed: the original's profiled op time vs the plain replay's (the instrumented \
                 iteration did not run)",
            )
        };
        card.push("op_ms", Unit::Ms, ops);
        // Between ops, like for like: both profiled where the replay's instrumented iteration
        // ran (its iteration less the windows of the ops linked to the original, so that a
        // replay-set op the original's profile did not show counts between ops on both sides,
        // and the replay's iteration less its `op_ms` is its `gap_ms`), else the plain replay's.
        let gap = match r.instrumented_iter_ms {
            Some(p) if c.profiled_ops > 0 && !o.by_gpu => Figure::new(
                Some(self.gaps_ms),
                Some((p - c.profiled_ms).max(0.0)),
                format!(
                    "profiled: the original's time between its linked ops (Kineto) vs the replay's \
                     iteration under the capture's instrumentation less the windows of the same \
                     ops{}",
                    if self.a.emulate_gaps {
                        ""
                    } else {
                        " (without --emulate-gaps the replay has none of the original's time \
                         outside ops)"
                    }
                ),
            ),
            _ => Figure::new(
                Some(self.gaps_ms),
                Some(r.iter_ms.mean - r.op_ms.mean),
                "mixed: the original's profiled time between ops vs the plain replay's mean \
                 iteration less its mean op time",
            ),
        };
        card.push("gap_ms", Unit::Ms, gap);
        // Memory: the allocator's bytes over the iteration's start, as profile_memory counts.
        let device_type = if o.by_gpu { 1 } else { 0 };
        let profiled_peak = linked
            .kineto
            .memory_peak_over_start(device_type, linked.link.span)
            .map(|b| b as f64);
        let (orig_peak, orig_basis) = match (profiled_peak, meta_f64("peak_over_start_bytes")) {
            (Some(b), _) => (
                Some(b),
                "the original's profile_memory events over the linked iteration (Total Allocated \
                 at its peak over its start)"
                    .to_string(),
            ),
            (None, Some(b)) => (
                Some(b),
                format!(
                    "the original's peak_over_start_bytes in {meta_name} (measured at capture: \
                     profile_memory on the CPU, torch.cuda.max_memory_allocated over the \
                     iteration's start on CUDA)"
                ),
            ),
            (None, None) => (
                None,
                "the original's: not recorded (profile with profile_memory=True, or a meta file \
                 with peak_over_start_bytes)"
                    .to_string(),
            ),
        };
        let (replay_peak, replay_basis) = match (&r.iteration_memory, &r.cuda_memory) {
            (Some(m), _) => (
                Some(m.peak_over_start_bytes as f64),
                "the replay's first measured iteration through the same allocator, counted the \
                 same way",
            ),
            (None, Some(m)) => (
                Some(m.allocator.peak_allocated_bytes as f64),
                "the replay's: the CUDA caching allocator's peak allocated over the run",
            ),
            (None, None) => (None, "the replay's: not measured"),
        };
        card.push(
            "peak_memory_bytes",
            Unit::Bytes,
            Figure::new(
                orig_peak,
                replay_peak,
                format!("{orig_basis}; {replay_basis}"),
            ),
        );
        // CPU: the replaying thread's user + system time per measured iteration.
        let cpu = r.cpu.as_ref();
        let replay_cpu = cpu.map(|c| c.per_iter.user_ms + c.per_iter.sys_ms);
        let orig_cpu = meta_f64("cpu_ms");
        card.push(
            "cpu_ms",
            Unit::Ms,
            Figure::new(
                orig_cpu,
                replay_cpu,
                format!(
                    "{}; the replay process's user + system CPU time per measured iteration \
                     (getrusage), as the original's is its process's",
                    if orig_cpu.is_some() {
                        format!("the original's cpu_ms in {meta_name}")
                    } else {
                        "the original's: not recorded (a meta file with cpu_ms, as mystique.capture \
                         writes)"
                            .into()
                    }
                ),
            ),
        );
        if let Some(hw) = cpu.and_then(|c| c.hw_per_iter.as_ref()) {
            for (name, key, v) in [
                ("instructions", "instructions", hw.instructions),
                ("cache_misses", "cache_misses", hw.cache_misses),
            ] {
                let orig = meta_f64(key);
                card.push(
                    name,
                    Unit::Count,
                    Figure::new(
                        orig,
                        Some(v as f64),
                        format!(
                            "{}; the replay's per measured iteration (perf counters, this \
                             process)",
                            if orig.is_some() {
                                format!("the original's {key} in {meta_name}")
                            } else {
                                "the original's: not recorded".into()
                            }
                        ),
                    ),
                );
            }
        }
        // GPU: busy time from both sides' GPU intervals; NVML's counters from the replay.
        if let Some(g) = r.gpu_activity.as_ref().filter(|g| g.events > 0) {
            card.push(
                "gpu_busy_ms",
                Unit::Ms,
                Figure::new(
                    (o.gpu.events > 0).then_some(o.gpu.busy_us / 1000.0),
                    Some(g.busy_us / 1000.0),
                    "GPU intervals: the original's Kineto kernels, copies and sets vs the \
                     replay's instrumented iteration's (CUPTI)",
                ),
            );
        }
        if let Some(gpu) = &r.gpu {
            for (name, metric, unit) in [
                ("gpu_sm_util_pct", "sm_util", Unit::Percent),
                ("gpu_mem_util_pct", "mem_util", Unit::Percent),
                ("gpu_power_w", "power", Unit::Watts),
            ] {
                if let Some(m) = gpu.measured.metrics.get(metric) {
                    card.push(
                        name,
                        unit,
                        Figure::new(
                            meta_f64(name),
                            Some(m.mean),
                            format!(
                                "NVML {metric}, the mean over the replay's measured iterations; \
                                 the original's {}",
                                if meta_f64(name).is_some() {
                                    format!("from {meta_name}")
                                } else {
                                    "not recorded".into()
                                }
                            ),
                        ),
                    );
                }
            }
        }
        card
    }

    fn failed_calls(&self, op: &str) -> usize {
        failed_calls(self.r, op)
    }

    /// The ops that failed, then the largest differences per op: 15 rows.
    pub(crate) fn print_differences(&self, out: &mut impl Write) -> Result<()> {
        writeln!(
            out,
            "largest differences (per iteration{})",
            if self.original.by_gpu {
                ", GPU time"
            } else {
                ""
            }
        )?;
        writeln!(
            out,
            "  {:>10} {:>10} {:>7} {:>10} {:>7} {:>6}  op",
            "orig us", "replay us", "ratio", "profiled", "ratio", "calls"
        )?;
        for r in self.cmp.ops.iter().take(15) {
            let o = r.original_us.max(1e-9);
            let (pu, pr) = match r.profiled_us {
                Some(p) => (format!("{p:.1}"), format!("{:.2}", p / o)),
                None => ("-".into(), "-".into()),
            };
            // Where calls failed, the time is the rest's alone: no ratio to the original's.
            let failed = self.failed_calls(&r.op);
            let (ru, rr) = match failed {
                0 => (
                    format!("{:.1}", r.replay_us),
                    format!("{:.2}", r.replay_us / o),
                ),
                n if n >= r.calls => ("failed".to_string(), "-".to_string()),
                _ => (format!("{:.1}", r.replay_us), "-".to_string()),
            };
            let note = match failed {
                n if n > 0 && n < r.calls => format!(" ({n} calls failed)"),
                _ => String::new(),
            };
            writeln!(
                out,
                "  {:>10.1} {ru:>10} {rr:>7} {pu:>10} {pr:>7} {:>6}  {}{note}",
                r.original_us, r.calls, r.op
            )?;
        }
        Ok(())
    }
}

/// How many of an op's calls failed in an iteration (the report counts a failure once, in the
/// first iteration).
fn failed_calls(r: &replay::Report, op: &str) -> usize {
    r.failures
        .iter()
        .filter(|f| f.op == op)
        .map(|f| f.count)
        .sum()
}
