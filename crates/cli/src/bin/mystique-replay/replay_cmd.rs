//! `replay` and `compare`: argument plumbing around the replay crate, and printing.

use anyhow::{Context, Result};
use et_graph::{Graph, Selection};
use mystique_cli::args::{ReplayArgs, RunArgs};
use replay::calibrate;
use std::io::Write;
use std::path::{Path, PathBuf};

/// What `RunArgs` mean to a replay.
pub(crate) trait RunOptions {
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
pub(crate) fn linked(
    g: &Graph,
    set: &et_graph::ReplaySet,
    path: &Path,
    typical: bool,
) -> Result<calibrate::Linked> {
    let l = calibrate::Linked::of(g, set, mystique_cli::read_kineto(path)?, typical)?;
    for w in &l.link.warnings {
        eprintln!("warning: {w}");
    }
    Ok(l)
}

/// Where the original freed its tensors, from the linked profile's memory events; `None`
/// (with a note at -v) where it recorded none.
pub(crate) fn original_allocs(linked: &calibrate::Linked) -> Option<et_graph::OriginalAllocs> {
    let a = et_graph::original_allocs(&linked.link, &linked.kineto);
    if a.is_none() {
        log::info!(
            "{} has no memory events with addresses: tensors are freed at their last use",
            linked.kineto.source
        );
    }
    a
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
    // Every input of the command, the profile and the reference included: no output may be
    // one of them, nor two outputs the same file.
    let mut inputs: Vec<&Path> = vec![path.as_path()];
    inputs.extend(a.kineto.as_deref());
    inputs.extend(a.memory_profile.as_deref());
    inputs.extend(a.reference.as_deref());
    inputs.extend(a.load_library.iter().map(PathBuf::as_path));
    let outputs: Vec<&PathBuf> = [&a.trace_out, &a.gpu_svg, &a.reference_out]
        .into_iter()
        .flatten()
        .collect();
    for (k, p) in outputs.iter().enumerate() {
        mystique_cli::output::check(p, &inputs)?;
        if outputs[..k]
            .iter()
            .any(|q| mystique_cli::output::same_path(p, q))
        {
            anyhow::bail!("{} is given for two outputs", p.display());
        }
    }
    anyhow::ensure!(
        !a.gaps_of_one_iteration || a.iteration.as_ref().is_some_and(|i| i.len() == 1),
        "--gaps-of-one-iteration takes the gaps of the one iteration --iteration N picks: give \
         one"
    );
    // The gaps are the original's time between its compute ops: a replay of its collectives
    // alone spins none of them (--paced-by-trace paces collectives by the capture instead).
    anyhow::ensure!(
        !(a.emulate_gaps && a.run.only == et_graph::Kind::Comm),
        "--emulate-gaps with --only comm: the gaps are spun before the ops --only comm leaves \
         out, so none would be; --paced-by-trace paces the collectives as the capture issued \
         them"
    );
    let reference_original = reference_original(a, path)?;
    let timeout = std::time::Duration::from_secs(a.timeout);
    let dist = replay::DistOptions::from_env(timeout).map_err(anyhow::Error::msg)?;
    let own;
    let mut in_dir = None;
    let path = match (&dist, path.is_dir()) {
        (Some(d), true) => {
            let (p, n) = own_rank_trace(a, path, d)?;
            own = p;
            in_dir = Some(n);
            &own
        }
        (None, true) => anyhow::bail!(
            "{} is a directory: replay one trace, every rank of a job together with --ranks \
             DIR, or one rank each under a launcher (torchrun: RANK, WORLD_SIZE)",
            path.display()
        ),
        (_, false) => path,
    };
    anyhow::ensure!(
        !a.rank_order || in_dir.is_some(),
        "--rank-order ranks the trace files of --ranks, or of a directory under a launcher: \
         {} is one trace",
        path.display()
    );
    for lib in &a.load_library {
        replay::load_library(lib)?;
    }
    a.run.apply()?;
    let mut meta_file = None;
    let recorded = || {
        let (v, p) = meta_of(path)?;
        meta_file = Some(p);
        v["threads"].as_i64()
    };
    if let (Some(n), Some(p)) = (original_threads(a.run.threads, recorded), &meta_file) {
        eprintln!(
            "threads    {n}, as the capture's {} records (--threads sets another)",
            p.display()
        );
    }
    let device = replay_device(a, dist.as_ref())?;
    gpu_options_need_cuda(a, device)?;
    let trace = mystique_cli::read_trace(path)?;
    let t0 = std::time::Instant::now();
    let g = Graph::new(&trace);
    if let Some(n) = compiled_regions(&g) {
        eprintln!("note: {n}");
    }
    log::info!("graph in {:.3} s", t0.elapsed().as_secs_f64());
    // Every op of the iterations; `--only` is the replay's to apply (it passes the others'
    // inputs through), in one place.
    let set = g.select(&Selection {
        iterations: a.iteration.clone(),
        ..Default::default()
    })?;
    // A replay of nothing (what the tests take as libtorch's own memory) runs, said so.
    if let Err(e) = only_keeps_some(&g, &set, a.run.only, path) {
        eprintln!("note: {e}: nothing is replayed");
    }
    let comm = crate::comm_cmd::options(a, &g, &set, dist.as_ref(), in_dir)?;
    let profile = a
        .kineto
        .as_deref()
        .map(|k| linked(&g, &set, k, !a.gaps_of_one_iteration))
        .transpose()?;
    let original_allocs = match (&a.memory_profile, a.frees_at_last_use) {
        (_, true) => None,
        (Some(p), false) => {
            let l = linked(&g, &set, p, false)?;
            Some(original_allocs(&l).with_context(|| {
                format!(
                    "--memory-profile {}: no memory events with addresses (profile with \
                     profile_memory=True)",
                    p.display()
                )
            })?)
        }
        (None, false) => profile.as_ref().and_then(original_allocs),
    };
    let gap_model = gap_model(a, &g, &set, profile.as_ref(), device)?;
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
        nvml_period_ms: a.nvml_period.unwrap_or(NVML_PERIOD_MS),
        pace: match a.paced {
            Some(0) => anyhow::bail!("--paced needs at least 1 iteration per block"),
            Some(every) => Some(replay::Pace {
                every,
                pacer: std::sync::Arc::new(StdioPacer::default()),
            }),
            None => None,
        },
        memory_gate: crate::ranks::gate_from_env(),
        available_memory: crate::ranks::available_override()?,
        comm,
        original_allocs,
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
    write_timelines(a, &report, &timeline, &trace.source)?;
    a.run.warn_values(&report);
    if let (Some(p), Some(original)) = (&a.reference_out, reference_original) {
        write_reference(p, &report, original, &trace.source)?;
    }
    mystique_cli::printed_then(
        print_report(&report, gap_model.as_ref(), &trace.source, json),
        completed(&report),
    )
}

/// Under a launcher, the trace in `dir` that is this rank's (ranked as `--ranks` ranks them),
/// so that every node runs the same command line.
fn own_rank_trace(
    a: &ReplayArgs,
    dir: &Path,
    d: &replay::DistOptions,
) -> Result<(std::path::PathBuf, usize)> {
    // Which file is this rank's, from probes of the traces: each rank parses only its own.
    let (traces, from) = crate::rank_files::discover(&dir.display().to_string(), a.rank_order)?;
    // With --world, ranks 0..WORLD_SIZE-1 of a larger capture replay.
    let fits = match a.comm.world {
        Some(_) => traces.len() >= d.world_size,
        None => traces.len() == d.world_size,
    };
    anyhow::ensure!(
        fits,
        "{} holds {} rank traces, but WORLD_SIZE={}",
        dir.display(),
        traces.len(),
        d.world_size
    );
    let own = traces[d.rank].path.clone();
    log::info!(
        "rank {}: {} (ranks: {})",
        d.rank,
        own.display(),
        from.phrase()
    );
    Ok((own, traces.len()))
}

/// The original's side of `--reference-out`, checked before the replay (without it the
/// replay is not worth running): `--original-ms`, or the capture's `NAME.meta.json`.
fn reference_original(a: &ReplayArgs, path: &Path) -> Result<Option<calibrate::ReferenceOriginal>> {
    // A reference sets the original's whole iteration beside the replay's: both whole.
    anyhow::ensure!(
        a.reference_out.is_none() || a.run.only == et_graph::Kind::All,
        "--reference-out times the whole iteration beside the original's: not with --only"
    );
    match (&a.reference_out, a.original_ms) {
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
    .transpose()
}

/// The device to replay on: `--device`, where under a launcher `cuda` is this rank's GPU.
fn replay_device(a: &ReplayArgs, dist: Option<&replay::DistOptions>) -> Result<replay::Device> {
    let mut device = replay::Device::parse(&a.device)?;
    // Under torchrun (or --ranks), `cuda` is this rank's GPU, as PyTorch jobs pick it.
    if let (true, Some(lr)) = (a.device == "cuda", dist.and_then(|d| d.local_rank)) {
        let n = tch::Cuda::device_count().max(1) as usize;
        // More local ranks than GPUs: they share them (and their collectives go through Gloo).
        device = replay::Device::parse(&format!("cuda:{}", lr % n))?;
    }
    Ok(device)
}

/// NVML's sampling period where `--nvml-period` does not set one.
const NVML_PERIOD_MS: u64 = 20;

/// `--nvml-period` and `--gpu-svg` sample and draw a CUDA device through NVML: on the CPU
/// they would do nothing (or draw an empty timeline), so they are refused before the replay.
pub fn gpu_options_need_cuda(a: &ReplayArgs, device: replay::Device) -> Result<()> {
    if device != replay::Device::Cpu {
        return Ok(());
    }
    // `--nvml-period 0` turns the sampling off: on the CPU it is off anyway.
    for (flag, given) in [
        ("--nvml-period", a.nvml_period.is_some_and(|ms| ms > 0)),
        ("--gpu-svg", a.gpu_svg.is_some()),
    ] {
        anyhow::ensure!(
            !given,
            "{flag} samples a CUDA device through NVML, and this replay runs on the CPU \
             (--device cuda; --trace-out writes the CPU replay's timeline)"
        );
    }
    Ok(())
}

/// `--emulate-gaps` with `--kineto`: the calibrated gap model (anchored on `--reference`).
fn gap_model(
    a: &ReplayArgs,
    g: &Graph,
    set: &et_graph::ReplaySet,
    linked: Option<&calibrate::Linked>,
    device: replay::Device,
) -> Result<Option<et_graph::GapModel>> {
    let read = a
        .reference
        .as_deref()
        .map(calibrate::read_reference_and_trace)
        .transpose()?;
    if let (Some(r), Some((_, Some(recorded))), Some(t)) = (&a.reference, &read, &a.trace) {
        warn_other_traces_reference(r, recorded, t);
    }
    let reference = read.map(|(r, _)| et_graph::Reference::from(r));
    Ok(match (linked, a.emulate_gaps) {
        (Some(linked), true) => Some(calibrate::calibrated_gaps(
            g,
            set,
            linked,
            device,
            !a.run.no_autograd,
            calibrate::GapChoices {
                boundary_costs: if a.replay_boundary_costs {
                    calibrate::BoundaryCosts::Replay
                } else if a.call_probed_boundaries {
                    calibrate::BoundaryCosts::CallProbed
                } else {
                    calibrate::BoundaryCosts::Probed
                },
                reference,
                time_base_with_gaps: a.time_base_with_gaps,
            },
        )?),
        _ => None,
    })
}

/// `--trace-out` (the op slices as a Chrome trace) and `--gpu-svg` (NVML's timelines).
fn write_timelines(
    a: &ReplayArgs,
    report: &replay::Report,
    timeline: &metrics::Timeline,
    source: &str,
) -> Result<()> {
    if let Some(p) = &a.trace_out {
        mystique_cli::output::write_atomic_gz(p, |w| {
            Ok(timeline.write_chrome(w, &format!("mystique replay of {}", source))?)
        })?;
    }
    if let Some(p) = &a.gpu_svg {
        match timeline.svg_counters(&format!("NVML timelines: {} on {}", source, report.device)) {
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
    Ok(())
}

/// The report on stdout, as text or JSON, with the gap model where there is one.
fn print_report(
    report: &replay::Report,
    gap_model: Option<&et_graph::GapModel>,
    source: &str,
    json: bool,
) -> Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        let mut j = serde_json::to_value(report)?;
        if let (Some(m), Some(o)) = (gap_model, j.as_object_mut()) {
            o.insert("gap_model".into(), serde_json::to_value(m)?);
        }
        serde_json::to_writer(&mut out, &j)?;
        writeln!(out)?;
    } else {
        crate::print::print_table(&mut out, report, source)?;
        if let Some(m) = gap_model {
            crate::print::print_gap_model(&mut out, m)?;
        }
    }
    Ok(())
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
pub(crate) fn meta_original_ms(trace: &Path) -> Option<(f64, String)> {
    original_ms_in(&meta_of(trace)?)
}

/// The original's uninstrumented iteration (ms) in a meta file read ([`meta_of`]), and where.
pub(crate) fn original_ms_in(
    (v, meta): &(serde_json::Value, std::path::PathBuf),
) -> Option<(f64, String)> {
    let ms = v["iter_ms_median"]
        .as_f64()
        .filter(|m| m.is_finite() && *m > 0.0)?;
    Some((ms, meta.display().to_string()))
}

/// What a trace of `torch.compile`d code does not hold, said where it has such regions: the
/// kernels Inductor fused inside them are not ops of the trace (only the regions' annotations
/// and the ops left outside the fusion are), so the replay runs none of their work.
pub(crate) fn compiled_regions(g: &Graph) -> Option<String> {
    let count = |f: &dyn Fn(&str) -> bool| g.order.iter().filter(|&&i| f(g.name(i))).count();
    // A region's `CompiledFunction` (its autograd function) sits inside its annotation.
    let n = match count(&|n| n.starts_with("Torch-Compiled Region")) {
        0 => count(&|n| n == "CompiledFunction"),
        n => n,
    };
    // On a GPU the ET may record Inductor's Triton kernels as nodes of their own.
    let kernels = g
        .order
        .iter()
        .filter(|&&i| g.class[i as usize].contains(et_graph::OpClass::KERNEL))
        .count();
    (n > 0).then(|| {
        let work = if kernels > 0 {
            format!(
                "the {kernels} compiled kernel calls the trace records are not libtorch ops, and \
                 fail here"
            )
        } else {
            "the kernels compiled inside them are not ops of the trace, so the replay runs none \
             of their work (with --emulate-gaps their time is spun as gaps)"
                .to_string()
        };
        format!(
            "the trace holds {n} torch.compile region{} (`Torch-Compiled Region`, \
             `CompiledFunction`): {work}",
            if n == 1 { "" } else { "s" }
        )
    })
}

/// Sets libtorch's intra-op threads to the original's (`recorded`: a capture's meta file, a
/// package's manifest), at most this host's cores, where neither `--threads` (`given`) nor
/// `OMP_NUM_THREADS` chose: an op's time compares like for like only at the same parallelism,
/// and libtorch's default (one thread per core) is rarely what a capture ran with; a default
/// capture records its own host's cores. Returns the count set. `recorded` is not asked for
/// where the count is chosen otherwise.
pub(crate) fn original_threads(
    given: Option<i32>,
    recorded: impl FnOnce() -> Option<i64>,
) -> Option<i64> {
    if given.is_some() || std::env::var_os("OMP_NUM_THREADS").is_some() {
        return None;
    }
    let n = recorded().filter(|&n| n > 0)?;
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get()) as i64;
    let n = n.min(cores);
    (i64::from(tch::get_num_threads()) != n).then(|| {
        tch::set_num_threads(n as i32);
        n
    })
}

/// Warns where the trace a reference names (`recorded`: `--reference-out` writes it) is another
/// capture than `trace` (by file name, the clean and the linked ET of one capture alike).
pub(crate) fn warn_other_traces_reference(reference: &Path, recorded: &str, trace: &Path) {
    // The capture's name, else (a trace not named as captures are) the file's.
    let name = |p: &Path| -> Option<String> {
        capture_stem(p)
            .map(|(stem, _)| stem.to_string())
            .or_else(|| Some(p.file_name()?.to_str()?.to_string()))
    };
    if name(Path::new(recorded)) != name(trace) {
        eprintln!(
            "warning: {} is the reference of {recorded}, not of {}: its original and replay \
             times are another capture's",
            reference.display(),
            trace.display()
        );
    }
}

/// Refuses a selection that `--only` empties (a trace with no collective replayed `--only
/// comm`): nothing would be replayed, and a report of nothing reads as a result.
pub(crate) fn only_keeps_some(
    g: &Graph,
    set: &et_graph::ReplaySet,
    only: et_graph::Kind,
    path: &Path,
) -> Result<()> {
    if only == et_graph::Kind::All {
        return Ok(());
    }
    let comm = only == et_graph::Kind::Comm;
    let kept = set
        .ops
        .iter()
        .filter(|&&i| g.class[i as usize].contains(et_graph::OpClass::COLLECTIVE) == comm)
        .count();
    anyhow::ensure!(
        kept > 0,
        "--only {}: none of the {} ops selected is one ({} holds {})",
        if comm { "comm" } else { "compute" },
        set.ops.len(),
        path.display(),
        if comm {
            "no collective"
        } else {
            "collectives only"
        }
    );
    Ok(())
}

/// The capture an execution trace's file name is of, `NAME` of `NAME.et.json[.gz]` and of
/// `NAME.linked.et.json[.gz]` alike, and whether it is the linked one.
pub(crate) fn capture_stem(trace: &Path) -> Option<(&str, bool)> {
    let file = trace.file_name()?.to_str()?;
    let et = file
        .strip_suffix(".gz")
        .unwrap_or(file)
        .strip_suffix(".et.json")?;
    Some(match et.strip_suffix(".linked") {
        Some(stem) => (stem, true),
        None => (et, false),
    })
}

/// The capture's `STEM.meta.json` (or `.meta.json.gz`) beside the trace, read, and its path.
pub(crate) fn meta_of(trace: &Path) -> Option<(serde_json::Value, std::path::PathBuf)> {
    let (stem, _) = capture_stem(trace)?;
    ["json", "json.gz"].into_iter().find_map(|ext| {
        let meta = trace.with_file_name(format!("{stem}.meta.{ext}"));
        Some((read_meta(&meta).ok()?, meta))
    })
}

/// A capture's meta file, read as JSON (gunzipped where it is gzip, as every input is read).
pub(crate) fn read_meta(path: &Path) -> Result<serde_json::Value> {
    let bytes =
        et_schema::read_input(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_slice(&bytes).with_context(|| format!("{} is not JSON", path.display()))
}

/// Ok when every selected op ran; the exit code says when some failed.
pub(crate) fn completed(r: &replay::Report) -> Result<()> {
    mystique_cli::OpsFailed::check(r.ops_failed, r.ops_selected)
}
