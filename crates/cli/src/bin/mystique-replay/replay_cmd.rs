//! `replay` and `compare`: argument plumbing around the replay crate, and printing.

use anyhow::{Context, Result};
use et_graph::{Graph, Selection};
use mystique_cli::args::{CompareArgs, ReplayArgs, RunArgs};
use mystique_cli::inspect::human_bytes;
use replay::calibrate;
use std::io::Write;
use std::path::Path;

/// What `RunArgs` mean to a replay.
trait RunOptions {
    fn apply(&self) -> Result<()>;
    fn options(&self) -> replay::ReplayOptions;
    fn warn_values(&self, r: &replay::Report);
}

impl RunOptions for RunArgs {
    /// Seeds libtorch's generator (the synthetic inputs' values) and sets its intra-op
    /// thread count when `--threads` is given.
    fn apply(&self) -> Result<()> {
        // Unseeded, the values differed from one replay to the next, and so could their
        // health: wide_deep_sgd's went NaN in one `--check-values` run of a dozen.
        tch::manual_seed(self.seed as i64);
        if let Some(n) = self.threads {
            anyhow::ensure!(n > 0, "--threads must be positive");
            // More threads than cores only adds contention; thousands take minutes to create.
            let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
            anyhow::ensure!(
                n as usize <= 4 * cores,
                "--threads {n} is more than 4x this machine's {cores} cores"
            );
            tch::set_num_threads(n);
        }
        Ok(())
    }

    /// The replay options these arguments set; the command sets the rest.
    fn options(&self) -> replay::ReplayOptions {
        replay::ReplayOptions {
            warmup: self.warmup,
            iters: self.iters,
            only: self.only,
            autograd: !self.no_autograd,
            check_values: self.check_values,
            force: self.force,
            ..Default::default()
        }
    }

    /// Warns when the replay's values went NaN/Inf (and where, with `--check-values`).
    fn warn_values(&self, r: &replay::Report) {
        if let Some(f) = &r.first_nonfinite {
            eprintln!(
                "warning: values went NaN/Inf first at {} (node {}) in iteration {}",
                f.op, f.id, f.iteration
            );
        }
        if r.nonfinite_externals > 0 {
            eprintln!(
                "warning: {} input tensors hold NaN/Inf after the replay: its values diverged, \
                 so kernels may have taken paths the original did not{}",
                r.nonfinite_externals,
                if self.check_values {
                    ""
                } else {
                    " (--check-values names the op where it started)"
                }
            );
        }
    }
}

/// A Kineto trace read from `path` and linked to `set` (`typical`: its timing typical of the
/// trace's iterations like the set's).
fn linked(
    g: &Graph,
    set: &et_graph::ReplaySet,
    path: &Path,
    typical: bool,
) -> Result<calibrate::Linked> {
    Ok(calibrate::Linked::of(
        g,
        set,
        mystique_cli::read_kineto(path)?,
        typical,
    )?)
}

/// `--reference-out`: the reference of this replay and the original, written atomically.
fn write_reference(
    p: &Path,
    r: &replay::Report,
    original: calibrate::ReferenceOriginal,
    source: &str,
) -> Result<()> {
    let written = calibrate::reference_of_report(r, &original)?;
    let j = calibrate::to_json(&written, &original.from, source, r.iters);
    calibrate::warn_shared_host(&written, &p.display().to_string());
    mystique_cli::output::write_atomic(p, |w| {
        serde_json::to_writer_pretty(&mut *w, &j)?;
        Ok(writeln!(w)?)
    })
}

pub fn run(a: &ReplayArgs, json: bool) -> Result<()> {
    if a.ranks.is_some() {
        return crate::ranks::run(a, json);
    }
    let Some(path) = &a.trace else {
        anyhow::bail!("a trace or --ranks is needed");
    };
    anyhow::ensure!(a.timeout > 0, "--timeout must be positive");
    // Outputs are checked before the long work, so a bad path does not lose the report.
    for p in [&a.trace_out, &a.gpu_svg, &a.reference_out]
        .into_iter()
        .flatten()
    {
        mystique_cli::output::check(p, &[path.as_path()])?;
    }
    // The original's time for --reference-out is known before the replay, or the replay is
    // not worth running.
    let reference_original = match (&a.reference_out, a.original_ms) {
        (None, _) => None,
        (Some(_), Some(ms)) => {
            anyhow::ensure!(
                ms.is_finite() && ms > 0.0,
                "--original-ms must be a positive number of ms (got {ms})"
            );
            Some((ms, "--original-ms".to_string()))
        }
        (Some(_), None) => Some(meta_original_ms(path).with_context(|| {
            format!(
                "--reference-out needs the original's uninstrumented iteration: --original-ms \
                 MS, or a NAME.meta.json with `iter_ms_median` beside {}",
                path.display()
            )
        })?),
    }
    .map(|(ms, from)| -> Result<calibrate::ReferenceOriginal> {
        if let Some(w) = a.original_wait_ms {
            anyhow::ensure!(
                w.is_finite() && w >= 0.0 && w < ms,
                "--original-wait-ms must be from 0 up to less than the original's iteration \
                 ({ms} ms from {from}; got {w})"
            );
        }
        Ok(calibrate::ReferenceOriginal {
            ms,
            from,
            wait_ms: a.original_wait_ms,
        })
    })
    .transpose()?;
    let timeout = std::time::Duration::from_secs(a.timeout);
    let dist = replay::DistOptions::from_env(timeout).map_err(anyhow::Error::msg)?;
    for lib in &a.load_library {
        replay::load_library(lib)?;
    }
    a.run.apply()?;
    let mut device = replay::Device::parse(&a.device)?;
    // Under torchrun (or --ranks), `cuda` is this rank's GPU, as PyTorch jobs pick it.
    if let (true, Some(lr)) = (a.device == "cuda", dist.as_ref().and_then(|d| d.local_rank)) {
        let n = tch::Cuda::device_count().max(1) as usize;
        // More local ranks than GPUs: they share them (and their collectives go through Gloo).
        device = replay::Device::parse(&format!("cuda:{}", lr % n))?;
    }
    let trace = mystique_cli::read_trace(path)?;
    let t0 = std::time::Instant::now();
    let g = Graph::new(&trace);
    log::info!("graph in {:.3} s", t0.elapsed().as_secs_f64());
    // Every op of the iterations; `--only` is the replay's to apply (it passes the others'
    // inputs through), in one place.
    let set = g.select(&Selection {
        iterations: a.iteration.clone(),
        ..Default::default()
    })?;
    let reference = a
        .reference
        .as_deref()
        .map(calibrate::read_reference)
        .transpose()?
        .map(et_graph::Reference::from);
    let gap_model = match (&a.kineto, a.emulate_gaps) {
        (Some(k), true) => {
            let linked = linked(&g, &set, k, !a.gaps_of_one_iteration)?;
            Some(calibrate::calibrated_gaps(
                &g,
                &set,
                &linked,
                device,
                !a.run.no_autograd,
                calibrate::GapChoices {
                    probed_costs: !a.replay_boundary_costs,
                    reference,
                    time_base_with_gaps: a.time_base_with_gaps,
                },
            )?)
        }
        _ => None,
    };
    let gaps_us = gap_model.as_ref().map(|m| m.gaps_us.clone());
    let gaps_base_us = gap_model.as_ref().map(|m| m.base_step_us.clone());
    let opts = replay::ReplayOptions {
        device,
        strict: a.strict,
        // The NVML timelines come from the timeline's counters.
        trace_out: a.trace_out.clone().or_else(|| a.gpu_svg.clone()),
        gaps_us,
        gaps_base_us,
        // On stderr, so with --json too.
        progress: true,
        dist,
        nvml_period_ms: a.nvml_period,
        pace: match a.paced {
            Some(0) => anyhow::bail!("--paced needs at least 1 iteration per block"),
            Some(every) => Some(replay::Pace {
                every,
                pacer: std::sync::Arc::new(StdioPacer::default()),
            }),
            None => None,
        },
        ..a.run.options()
    };
    if !json {
        eprintln!(
            "replaying {} ops x {} warm-up + {} measured iterations on {} ...",
            set.ops.len(),
            a.run.warmup,
            a.run.iters.max(1),
            a.device
        );
    }
    let (report, timeline) = replay::replay(&g, &set, &opts)?;
    if let Some(p) = &a.trace_out {
        mystique_cli::output::write_atomic(p, |w| {
            Ok(timeline.write_chrome(w, &format!("mystique replay of {}", trace.source))?)
        })?;
    }
    if let Some(p) = &a.gpu_svg {
        match timeline.svg_counters(&format!(
            "NVML timelines: {} on {}",
            trace.source, report.device
        )) {
            Some(svg) => {
                mystique_cli::output::write_atomic(p, |w| Ok(w.write_all(svg.as_bytes())?))?
            }
            None => log::warn!(
                "--gpu-svg: no NVML samples to draw ({})",
                report
                    .gpu_unavailable
                    .as_deref()
                    .unwrap_or("not a CUDA replay")
            ),
        }
    }
    a.run.warn_values(&report);
    if let (Some(p), Some(original)) = (&a.reference_out, reference_original) {
        write_reference(p, &report, original, &trace.source)?;
    }
    let mut out = std::io::stdout().lock();
    if json {
        let mut j = serde_json::to_value(&report)?;
        if let (Some(m), Some(o)) = (&gap_model, j.as_object_mut()) {
            o.insert("gap_model".into(), serde_json::to_value(m)?);
        }
        serde_json::to_writer(&mut out, &j)?;
        writeln!(out)?;
    } else {
        print_table(&mut out, &report, &trace.source)?;
        if let Some(m) = &gap_model {
            print_gap_model(&mut out, m)?;
        }
    }
    completed(&report)
}

/// `--paced`: a block starts when a line arrives on stdin and is answered by a JSON line on
/// stdout with its wall time, the page faults taken in it and the time the replaying thread
/// waited for a CPU in it (`wait_ms`, where the kernel accounts it: a harness on a shared host
/// reads the replay in running time, as the calibration does).
#[derive(Default)]
struct StdioPacer {
    started: std::sync::Mutex<Option<Block>>,
}

/// A running block: when it started, the page faults and the replaying thread's wait by then.
struct Block {
    at: std::time::Instant,
    faults: Option<u64>,
    waited: Option<(metrics::cpu::RunDelay, f64)>,
}

impl replay::Pacer for StdioPacer {
    fn start(&self) -> bool {
        let mut line = String::new();
        match std::io::stdin().read_line(&mut line) {
            Ok(n) if n > 0 => {
                // Opened here, on the thread that replays (a thread's own counter).
                let waited = metrics::cpu::RunDelay::of_this_thread()
                    .and_then(|d| d.read_us().map(|us| (d, us)));
                let faults = metrics::minor_page_faults();
                *self.started.lock().unwrap_or_else(|e| e.into_inner()) = Some(Block {
                    at: std::time::Instant::now(),
                    faults,
                    waited,
                });
                true
            }
            _ => false,
        }
    }

    fn end(&self, iters: usize) {
        let Some(Block { at, faults, waited }) = self
            .started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        else {
            return;
        };
        let ms = at.elapsed().as_secs_f64() * 1e3;
        let wait_ms = waited
            .and_then(|(d, us)| d.read_us().map(|now| (now - us).max(0.0) / 1e3))
            .map(|w| w.min(ms));
        let faults = faults.zip(metrics::minor_page_faults()).map(|(a, b)| b - a);
        let mut out = std::io::stdout().lock();
        // A harness that went away leaves nothing to tell; the replay still ends normally.
        let _ = writeln!(
            out,
            "{}",
            serde_json::json!({
                "block_ms": ms, "iters": iters, "minor_faults": faults, "wait_ms": wait_ms
            })
        )
        .and_then(|_| out.flush());
    }
}

/// The original's uninstrumented iteration (ms) from a capture script's `NAME.meta.json`
/// beside the trace (`NAME.et.json`, `NAME.linked.et.json`, optionally `.gz`), and where from.
fn meta_original_ms(trace: &Path) -> Option<(f64, String)> {
    let file = trace.file_name()?.to_str()?;
    let stem = [
        ".linked.et.json.gz",
        ".linked.et.json",
        ".et.json.gz",
        ".et.json",
    ]
    .iter()
    .find_map(|s| file.strip_suffix(s))?;
    let meta = trace.with_file_name(format!("{stem}.meta.json"));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&meta).ok()?).ok()?;
    let ms = v["iter_ms_median"]
        .as_f64()
        .filter(|m| m.is_finite() && *m > 0.0)?;
    Some((ms, meta.display().to_string()))
}

/// Where the emulated gaps come from.
fn print_gap_model(out: &mut impl Write, m: &et_graph::GapModel) -> Result<()> {
    writeln!(
        out,
        "gap model  {:.3} ms emulated of the capture's {:.3} ms: this host at {:.3}x the capture's \
         op time ({} ops), instrumentation {:.2} us per op event, {} events with arguments in gaps, {:.2} us per event without ({} in gaps) and {:.2} us per op boundary",
        m.emulated_ms,
        m.capture_gaps_ms,
        m.speed,
        m.speed_ops,
        m.per_event_us,
        m.events_with_args,
        m.per_gap_event_us,
        m.events_in_gaps - m.events_with_args,
        m.per_boundary_us
    )?;
    if let Some(a) = &m.anchored {
        // The total is the reference's, not the line above's: say so first.
        writeln!(
            out,
            "anchored   on the reference: {:.3} ms per iteration, the original's {:.3} ms there \
             x this host's op time {:.3} ms{} / the plain replay's {:.3} ms there (x{:.3}); the \
             gaps x{:.3} of the profile's shape ({:.3} ms from the profile alone)",
            a.target_ms,
            a.reference.original_ms,
            a.replay_op_ms,
            if m.time_base.is_some() {
                " (between the gaps)"
            } else {
                ""
            },
            a.reference.replay_op_ms,
            a.host_ratio,
            a.scale,
            a.profiled_ms
        )?;
    }
    if let Some(b) = &m.ops_between_gaps {
        writeln!(
            out,
            "time base  the ops run x{:.3} their time back to back between the gaps here \
             ({} settled iterations of each, in alternating runs; each step's median): the gaps \
             follow this host's speed from there",
            b.factor, b.iterations
        )?;
    }
    if let Some(b) = &m.time_base {
        writeln!(
            out,
            "time base  the ops take {:.3} ms per iteration between the gaps, {:.3} ms back to \
             back (median of {} iterations each step): the gaps follow this host's speed from \
             the first",
            b.with_gaps_ms, b.plain_ms, b.iterations
        )?;
    }
    writeln!(
        out,
        "           captured under the {}: the calibration replay ran under the same",
        m.instrumentation
    )?;
    if let Some((per, per_tensor)) = m.per_backward_event_us {
        writeln!(
            out,
            "           events with arguments (autograd's backward nodes, {} tensors) probed at {per:.2} us + {per_tensor:.2} us per tensor",
            m.tensors_in_gap_events
        )?;
    }
    if m.calibrations_ms.len() > 1 {
        let each: Vec<String> = m
            .calibrations_ms
            .iter()
            .map(|ms| format!("{ms:.3}"))
            .collect();
        writeln!(
            out,
            "           calibrated {} times on this host: {} ms emulated; the model is the median one's by emulated time per unit of its op time",
            m.calibrations_ms.len(),
            each.join(", ")
        )?;
    }
    if m.capture_iterations > 1 {
        writeln!(
            out,
            "           gaps and op times typical of the capture's {} like iterations (the least of each)",
            m.capture_iterations
        )?;
    }
    if m.slices_in_ops > 0 {
        writeln!(
            out,
            "           the capture lost {} time slices in ops (a shared CPU; {} gaps held one): {}",
            m.slices_in_ops,
            m.slices_in_gaps,
            if m.local_speed {
                "each gap put on this host by the speed of the ops around it"
            } else {
                "gaps put on this host by the iteration's speed"
            }
        )?;
    }
    Ok(())
}

/// Ok when every selected op ran; the exit code says when some failed.
fn completed(r: &replay::Report) -> Result<()> {
    mystique_cli::OpsFailed::check(r.ops_failed, r.ops_selected)
}

fn print_table(out: &mut impl Write, r: &replay::Report, source: &str) -> Result<()> {
    writeln!(out, "trace      {source}")?;
    writeln!(out, "device     {} ({} threads)", r.device, r.threads)?;
    if let (Some(rank), Some(world)) = (r.rank, r.world_size) {
        writeln!(
            out,
            "rank       {rank} of {world} (Gloo over the c10d rendezvous)"
        )?;
    }
    writeln!(
        out,
        "coverage   {} of {} ops replayed, {} failed{}",
        r.ops_replayed,
        r.ops_selected,
        r.ops_failed,
        if r.ops_skipped > 0 {
            format!(", {} left out by --only", r.ops_skipped)
        } else {
            String::new()
        }
    )?;
    writeln!(
        out,
        "iteration  median {:.3} ms  (min {:.3}, max {:.3}; {} measured)",
        r.iter_ms.median, r.iter_ms.min, r.iter_ms.max, r.iters
    )?;
    writeln!(out, "timing     {}", r.timing)?;
    if let Some(e) = &r.event_error {
        writeln!(out, "           (CUDA events failed, host clock used: {e})")?;
    }
    writeln!(
        out,
        "overhead   {:.2} us/op of replay bookkeeping",
        r.overhead_us_per_op
    )?;
    if r.gaps_ms > 0.0 {
        writeln!(
            out,
            "gaps       {:.3} ms per iteration emulated between ops (from Kineto){}",
            r.gaps_ms,
            match r.gap_pace {
                Some(p) =>
                    format!(", at {p:.3}x the calibration's (they follow this host's speed)"),
                None => String::new(),
            }
        )?;
    }
    writeln!(
        out,
        "memory     peak {} live, {} in {} external inputs",
        human_bytes(r.peak_bytes),
        human_bytes(r.external_bytes),
        r.externals
    )?;
    if let Some(f) = r.page_faults_per_iter {
        writeln!(out, "faults     {f:.1} minor page faults per iteration")?;
    }
    if let Some(m) = &r.cuda_memory {
        writeln!(
            out,
            "cuda mem   allocator peak {} allocated, {} reserved ({:.0}% fragmented); inputs arena {}",
            human_bytes(m.allocator.peak_allocated_bytes),
            human_bytes(m.allocator.peak_reserved_bytes),
            m.fragmentation * 100.0,
            human_bytes(m.arena_bytes)
        )?;
    }
    if let Some(c) = &r.cpu {
        let u = &c.per_iter;
        writeln!(
            out,
            "cpu        {:.2} ms user + {:.2} ms sys per iteration, {} + {} context switches, {} major faults",
            u.user_ms, u.sys_ms, u.voluntary_switches, u.involuntary_switches, u.major_faults
        )?;
        if let Some(w) = c.waited_for_cpu_ms {
            let iter = &r.iter_ms;
            // Worth a line when the host was busy: time the replay lost to other processes.
            if w > 0.01 * iter.mean {
                writeln!(
                    out,
                    "           waited {w:.2} ms per iteration for a CPU ({:.0}% of it): a busy host",
                    100.0 * w / iter.mean
                )?;
            }
        }
        match (&c.hw_per_iter, &c.hw_unavailable) {
            (Some(h), _) => writeln!(
                out,
                "           {} cycles, {} instructions (IPC {:.2}), {} cache misses per iteration",
                h.cycles,
                h.instructions,
                h.ipc(),
                h.cache_misses
            )?,
            (None, Some(why)) => writeln!(out, "           no hardware counters: {why}")?,
            (None, None) => {}
        }
    }
    if let Some(g) = &r.gpu {
        writeln!(
            out,
            "gpu        {} ({} NVML samples every {} ms{})",
            g.device,
            g.samples,
            g.period_ms,
            if g.gpm { ", GPM" } else { "" }
        )?;
        for (name, m) in &g.measured.metrics {
            writeln!(
                out,
                "  {name:<18} mean {:>8.1}  p50 {:>8.1}  p99 {:>8.1}  max {:>8.1} {}",
                m.mean, m.p50, m.p99, m.max, m.unit
            )?;
        }
        if let Some(e) = g.measured.energy_j {
            writeln!(
                out,
                "  energy             {e:.2} J over the measured iterations"
            )?;
        }
        if !g.measured.throttle_reasons.is_empty() {
            writeln!(
                out,
                "  throttled by       {}",
                g.measured.throttle_reasons.join(", ")
            )?;
        }
    } else if let Some(why) = &r.gpu_unavailable {
        writeln!(out, "gpu        no NVML counters: {why}")?;
    }
    if !r.failures.is_empty() {
        writeln!(out, "failures")?;
        for f in &r.failures {
            writeln!(
                out,
                "  {:>4}x {}: [{:?}] {}",
                f.count, f.op, f.kind, f.reason
            )?;
        }
    }
    if !r.restored_scalars.is_empty() {
        writeln!(out, "restored scalars (rounded to 0 in the trace)")?;
        for x in &r.restored_scalars {
            writeln!(
                out,
                "  {:>4}x {} `{}` = {:e}: {}",
                x.count, x.op, x.arg, x.value, x.why
            )?;
        }
    }
    if !r.fallbacks.is_empty() {
        writeln!(out, "device fallbacks")?;
        for f in &r.fallbacks {
            writeln!(out, "  {:>4}x {}: {}", f.count, f.op, f.ran_as)?;
        }
    }
    if !r.collectives.is_empty() {
        writeln!(out, "collectives per iteration")?;
        writeln!(out, "  {:>9} {:>6} {:>12}  op", "ms", "calls", "bytes")?;
        for c in &r.collectives {
            writeln!(
                out,
                "  {:>9.3} {:>6} {:>12}  {}",
                c.total_ms,
                c.count,
                human_bytes(c.bytes),
                c.op
            )?;
        }
    }
    writeln!(out, "top ops by time per iteration")?;
    let gpu = r.timing == "cuda events";
    if gpu {
        writeln!(
            out,
            "  {:>9} {:>6} {:>9} {:>9}  op",
            "ms", "calls", "us/call", "launch us"
        )?;
    } else {
        writeln!(out, "  {:>9} {:>6} {:>9}  op", "ms", "calls", "us/call")?;
    }
    for o in r.ops.iter().take(15) {
        if gpu {
            writeln!(
                out,
                "  {:>9.3} {:>6} {:>9.1} {:>9.1}  {}",
                o.total_ms, o.count, o.mean_us, o.launch_us, o.op
            )?;
        } else {
            writeln!(
                out,
                "  {:>9.3} {:>6} {:>9.1}  {}",
                o.total_ms, o.count, o.mean_us, o.op
            )?;
        }
    }
    Ok(())
}

/// Replays a linked ET and compares it op by op with its Kineto trace.
pub fn compare(a: &CompareArgs, json: bool) -> Result<()> {
    if let Some(svg) = &a.svg {
        mystique_cli::output::check(svg, &[a.trace.as_path(), a.kineto.as_path()])?;
    }
    a.run.apply()?;
    let device = replay::Device::parse(&a.device)?;
    let trace = mystique_cli::read_trace(&a.trace)?;
    let g = Graph::new(&trace);
    // Every op; `--only` is the replay's to apply, as for `replay`.
    let set = g.select(&Selection::default())?;
    let linked = linked(&g, &set, &a.kineto, true)?;
    let (kt, l) = (&linked.kineto, &linked.link);
    let (original_gpu, gpu_per_op) = et_graph::original_gpu(l, kt);
    // Like for like: a GPU original on CUDA compares GPU time per op; on CPU it is compared
    // with CPU op times that include the work its GPU did asynchronously, which says so.
    let by_gpu = matches!(device, replay::Device::Cuda(_)) && original_gpu.events > 0;
    let mismatch = match (device, original_gpu.events > 0) {
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
    if let (Some(m), false) = (mismatch, json) {
        eprintln!("warning: {m}");
    }
    let gpu_orig;
    let orig = if by_gpu {
        gpu_orig = et_graph::OriginalTiming {
            op_us: gpu_per_op,
            ..linked.original.clone()
        };
        &gpu_orig
    } else {
        &linked.original
    };
    let gap_model = if a.emulate_gaps {
        Some(calibrate::calibrated_gaps(
            &g,
            &set,
            &linked,
            device,
            !a.run.no_autograd,
            calibrate::GapChoices {
                probed_costs: false,
                reference: None,
                time_base_with_gaps: false,
            },
        )?)
    } else {
        None
    };
    // One more iteration runs under the capture's instrumentation: its op windows compare
    // with the original's Kineto durations like for like (both carry the profiler's cost).
    let opts = replay::ReplayOptions {
        device,
        gaps_us: gap_model.as_ref().map(|m| m.gaps_us.clone()),
        gaps_base_us: gap_model.as_ref().map(|m| m.base_step_us.clone()),
        per_step: true,
        instrument: true,
        instrumentation: et_graph::Instrumentation::of(kt),
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
    // Per op name, linked ops only: the original (Kineto), the plain replay, and the replay
    // under the capture's instrumentation (like for like).
    let names: Vec<&str> = r.steps.iter().map(|s| s.op.as_str()).collect();
    let plain: Vec<f64> = r.steps.iter().map(|s| s.us).collect();
    // Profiled windows are host time: not comparable with GPU kernel time per op.
    let profiled: Vec<Option<f64>> = (0..r.steps.len())
        .map(|k| {
            r.profiled
                .get(k)
                .copied()
                .flatten()
                .filter(|_| !by_gpu)
                .map(|p| p.end_us - p.start_us)
        })
        .collect();
    let cmp = et_graph::compare_ops(orig, &names, &plain, &profiled);
    let rows = &cmp.ops;
    let (prof_ms, prof_orig_ms, found) =
        (cmp.profiled_ms, cmp.profiled_original_ms, cmp.profiled_ops);
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
        None => meta_original_ms(&a.trace),
    };
    let (ratio_iter, basis) = match (&uninstrumented, r.instrumented_iter_ms) {
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
    let ratio_ops = if found > 0 {
        prof_ms / prof_orig_ms.max(1e-9)
    } else {
        r.op_ms.median / orig_ops_ms.max(1e-9)
    };
    let instrumented = (found > 0).then(|| {
        serde_json::json!({
            "ops": found,
            "ops_ms": prof_ms,
            "original_ops_ms": prof_orig_ms,
            "ratio_ops": prof_ms / prof_orig_ms.max(1e-9),
        })
    });
    let j = serde_json::json!({
        "trace": trace.source,
        "kineto": kt.source,
        "linked": l.linked(),
        "ops": set.ops.len(),
        "original": {"iter_ms": orig_iter_ms, "ops_ms": orig_ops_ms, "gaps_ms": gaps_ms,
                     "uninstrumented_ms": uninstrumented.as_ref().map(|u| u.0)},
        "replay": {"iter_ms": r.iter_ms.median, "ops_ms": r.op_ms.median, "gaps_ms": r.gaps_ms, "gap_pace": r.gap_pace,
                   // Measured: the mean iteration less its mean time in ops.
                   "between_ops_ms": r.iter_ms.mean - r.op_ms.mean,
                   "instrumented_iter_ms": r.instrumented_iter_ms},
        "ratio_iter": ratio_iter,
        "basis_iter": basis,
        "ratio_ops": ratio_ops,
        "basis_ops": if by_gpu { "gpu: the replay's CUDA-event time per op vs the original's kernel time under each op" } else if found > 0 { "profiled: linked ops under the capture's instrumentation in both" } else { "mixed: plain replay ops vs profiled original ops" },
        "emulate_gaps": a.emulate_gaps,
        "device": r.device,
        "compared_by": if by_gpu { "gpu time per op" } else { "op time" },
        "device_mismatch": mismatch,
        "original_gpu": (original_gpu.events > 0).then_some(&original_gpu),
        "replay_gpu": r.gpu_activity,
        "gap_model": gap_model,
        "instrumented": instrumented,
        "top_differences": rows.iter().take(15).map(|r| serde_json::json!({
            "op": r.op,
            "calls": r.calls,
            "original_us": r.original_us,
            "replay_us": r.replay_us,
            "ratio": r.replay_us / r.original_us.max(1e-9),
            "replay_instrumented_us": r.profiled_us,
            "ratio_instrumented": r.profiled_us.map(|p| p / r.original_us.max(1e-9)),
        })).collect::<Vec<_>>(),
    });
    if let Some(svg) = &a.svg {
        let bars: Vec<(String, f64, f64)> = rows
            .iter()
            .take(20)
            .map(|r| {
                (
                    format!("{} x{}", r.op, r.calls),
                    r.original_us / 1000.0,
                    r.profiled_us.unwrap_or(r.replay_us) / 1000.0,
                )
            })
            .collect();
        let title = format!(
            "{}: original {:.2} ms vs replay {:.2} ms per iteration",
            trace.source, orig_iter_ms, r.iter_ms.median
        );
        let label = if instrumented.is_some() {
            "replay (same instrumentation)"
        } else {
            "replay"
        };
        let plot = metrics::svg_bars(&title, "ms", ("original (Kineto)", label), &bars);
        mystique_cli::output::write_atomic(svg, |w| Ok(w.write_all(plot.as_bytes())?))?;
    }
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer(&mut out, &j)?;
        writeln!(out)?;
        return completed(&r);
    }
    writeln!(out, "linked     {} of {} ops", l.linked(), set.ops.len())?;
    writeln!(out, "original   {orig_iter_ms:.3} ms per iteration profiled ({orig_ops_ms:.3} ms in ops, {gaps_ms:.3} ms between them){}",
        uninstrumented.as_ref().map(|(ms, from)| format!("; {ms:.3} ms uninstrumented ({from})")).unwrap_or_default())?;
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
    writeln!(out, "ratio      {ratio_iter:.3} per iteration, {basis}")?;
    if found > 0 {
        writeln!(
            out,
            "profiled   {prof_ms:.3} ms in {found} ops replayed under the capture's instrumentation vs {prof_orig_ms:.3} ms in the original: ratio {:.3}",
            prof_ms / prof_orig_ms.max(1e-9)
        )?;
    }
    if original_gpu.events > 0 {
        mystique_cli::graph_cmd::print_gpu_activity(&mut out, "original", &original_gpu)?;
    }
    if let Some(g) = &r.gpu_activity {
        mystique_cli::graph_cmd::print_gpu_activity(&mut out, "replay", g)?;
    }
    writeln!(
        out,
        "largest differences (per iteration{})",
        if by_gpu { ", GPU time" } else { "" }
    )?;
    writeln!(
        out,
        "  {:>10} {:>10} {:>7} {:>10} {:>7} {:>6}  op",
        "orig us", "replay us", "ratio", "profiled", "ratio", "calls"
    )?;
    for r in rows.iter().take(15) {
        let o = r.original_us.max(1e-9);
        let (pu, pr) = match r.profiled_us {
            Some(p) => (format!("{p:.1}"), format!("{:.2}", p / o)),
            None => ("-".into(), "-".into()),
        };
        writeln!(
            out,
            "  {:>10.1} {:>10.1} {:>7.2} {pu:>10} {pr:>7} {:>6}  {}",
            r.original_us,
            r.replay_us,
            r.replay_us / o,
            r.calls,
            r.op
        )?;
    }
    completed(&r)
}
