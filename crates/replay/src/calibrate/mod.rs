//! Calibrating the gap model: short replays of the same ops on this host, plain and under the
//! capture's instrumentation, measure this host's speed against the capture and what the
//! instrumentation costs here; the capture's gaps are scaled and corrected by those
//! (`et_graph::gap_model`), then anchored on a reference where one is given
//! (`et_graph::anchor`) and timed between the gaps as the replay spins them. `replay`,
//! `compare` and the package runner all make their model here, with [`calibrated_gaps`].
//!
//! [`reference`] reads and writes the reference files `--reference` and `--reference-out` use.

use crate::{Device, ReplayError, ReplayOptions};

pub mod reference;

pub use reference::{
    read_reference, read_reference_and_trace, reference_of_report, to_json, warn_shared_host,
    Reference, ReferenceError, ReferenceOriginal,
};

/// What each boundary between two ops is charged for the capture's instrumentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BoundaryCosts {
    /// The calibration replay's own time between its steps (`--replay-boundary-costs`).
    Replay,
    /// What the instrumentation adds to a probed op call (the default): under the observer,
    /// its part outside the op's window, or the replay's own time between steps where more.
    Probed,
    /// Under the observer, each op's own call probed with its own inputs, and the boxing of
    /// them (`--call-probed-boundaries`); otherwise as `Probed`.
    CallProbed,
}

/// How [`calibrated_gaps`] makes its model.
#[derive(Clone, Copy, Debug)]
pub struct GapChoices {
    /// What each boundary is charged.
    pub boundary_costs: BoundaryCosts,
    /// Anchor the gaps' total on it (`--reference`).
    pub reference: Option<et_graph::Reference>,
    /// `--time-base-with-gaps`.
    pub time_base_with_gaps: bool,
}

/// Gaps to emulate (`et_graph::gap_model`): a short calibration replay of the same ops on this
/// host, plain and then one iteration under the capture's instrumentation, measures this host's
/// speed relative to the capture and what the instrumentation costs here; the capture's gaps
/// are scaled and corrected by those. Returns the model (gaps and every quantity behind them).
pub fn calibrated_gaps(
    g: &et_graph::Graph,
    set: &et_graph::ReplaySet,
    kineto: &Linked,
    device: Device,
    autograd: bool,
    choices: GapChoices,
) -> Result<et_graph::GapModel, ReplayError> {
    let GapChoices {
        boundary_costs,
        reference,
        time_base_with_gaps,
    } = choices;
    let calib = calibration_options(kineto, device, autograd, boundary_costs);
    if calib.instrumentation.execution_trace && reference.is_none() {
        eprintln!(
            "note: the gaps come from a profile taken under the execution trace observer, whose \
             cost is most of each gap there: from that profile alone the replay's iteration can \
             be off the original's by tens of percent. A reference timed on the capture host \
             (`replay --reference`), or a profile taken without the observer, pins it \
             (docs/gap-model.md, \"Which to use\")"
        );
    }
    let mut model = median_calibration(g, set, kineto, &calib)?;
    // How much slower the ops run between the gaps, measured with the gaps as the replay will
    // spin them (anchored, where there is a reference), in iterations that alternate
    // (`et_graph::OpsBetweenGaps`); not with --time-base-with-gaps, which takes the base with
    // the gaps its own way.
    if !time_base_with_gaps {
        measure_ops_between_gaps(g, set, device, autograd, reference, &mut model);
    }
    let profiled = time_base_with_gaps.then(|| model.clone());
    if let Some(reference) = reference {
        et_graph::anchor(&mut model, reference);
    }
    if let Some(profiled) = profiled {
        model = rebased_with_gaps(g, set, device, autograd, reference, model, profiled);
    }
    if let Some(reference) = reference {
        report_anchor(&model, &reference);
    }
    Ok(model)
}

/// The calibration replay's options: a warm-up, plain iterations, then iterations under the
/// capture's instrumentation. [`median_calibration`] sizes the two counts to this host
/// ([`calibration_iterations`]).
fn calibration_options(
    kineto: &Linked,
    device: Device,
    autograd: bool,
    costs: BoundaryCosts,
) -> ReplayOptions {
    ReplayOptions {
        device,
        autograd,
        warmup: 1,
        per_step: true,
        instrument: true,
        // Autograd's engine is probed always: under the profiler a backward node costs it
        // 1.4-3 µs, its two events' scopes timed alone 0.6 (recurrent models' gaps, a node or
        // two each, came out 10-20% long). The op too, unless --replay-boundary-costs (which
        // charges the replay's own time between its steps instead).
        probe_mechanisms: true,
        probe_op: costs != BoundaryCosts::Replay,
        // Each op's own call only where it is charged: elsewhere it is work the calibration
        // would do for nothing.
        probe_calls: costs == BoundaryCosts::CallProbed,
        // What the capture was taken under: the observer's cost is the bulk of a linked
        // pair's gaps, and none of a profile's taken without it.
        instrumentation: et_graph::Instrumentation::of(&kineto.kineto),
        // The host's speed, not its other processes': an op about a time slice long loses
        // whole slices on a busy host in most iterations, and its median would read as a slower
        // CPU. The emulated gaps are spun in running time too.
        running_time: true,
        ..Default::default()
    }
}

/// Several calibrations, and the model of the median one by what the replay spins: the
/// emulated total per unit of the calibration's own plain op time (`base_step_us`), which the
/// gaps are scaled from as the host's speed moves (`GapPace`). A small model's gaps are the
/// capture's less what the instrumentation costs, two close quantities, and one calibration
/// that fell in a slow or fast spell of the host moved the emulated total by up to 3x
/// (tiny_ops: 0.05-0.07 ms over five processes, 0.16 ms in a sixth); the base is timed in the
/// plain iterations just before, not always in the same spell (dlrm_sgd: two processes of one
/// run spun 0.34 and 0.24 ms with the median by emulated total).
///
/// At least `CALIBRATIONS.0` of them, and on while they have taken less than
/// [`CALIBRATION_BUDGET`] (small models, a tenth of a second each: their gaps are most of their
/// time, and their five calibrations' emulated totals spread by 10-15%, the median's noise 4%
/// of the iteration), at most `CALIBRATIONS.1`; an odd count, so that the median is one.
fn median_calibration(
    g: &et_graph::Graph,
    set: &et_graph::ReplaySet,
    kineto: &Linked,
    calib: &ReplayOptions,
) -> Result<et_graph::GapModel, ReplayError> {
    let started = std::time::Instant::now();
    eprintln!(
        "[replay] calibrating the gap model: short replays under the capture's instrumentation \
         (at least {}; more, up to {}, while they take under {} s) ...",
        CALIBRATIONS.0,
        CALIBRATIONS.1,
        CALIBRATION_BUDGET.as_secs()
    );
    let mut models = Vec::with_capacity(CALIBRATIONS.1);
    // One plain iteration first (its first, so cold: long where anything is) sizes the
    // calibrations to this host where its iterations are longer than the capture's.
    let span_s = kineto.original.span_us / 1e6;
    let mut calib = calib.clone();
    let probe = ReplayOptions {
        warmup: 0,
        iters: 1,
        per_step: false,
        instrument: false,
        probe_mechanisms: false,
        probe_op: false,
        probe_calls: false,
        ..calib.clone()
    };
    let (r, _) = crate::replay(g, set, &probe)?;
    let plain_s = r.iter_ms.median / 1e3;
    (calib.iters, calib.instrument_iters) = calibration_iterations(span_s.max(plain_s), plain_s);
    while models.len() < CALIBRATIONS.0
        || (models.len() < CALIBRATIONS.1
            && (started.elapsed() < CALIBRATION_BUDGET || models.len() % 2 == 0))
    {
        let first = models.is_empty();
        let (model, host) = calibrate_once(g, set, kineto, &calib, first)?;
        models.push(model);
        if first {
            // The first calibration timed this host's iterations, instrumented ones too: the
            // others fit their counts to them.
            let instrumented_s = host.instrumented_s.unwrap_or(host.plain_s).max(span_s);
            (calib.iters, calib.instrument_iters) =
                calibration_iterations(instrumented_s, host.plain_s);
        }
    }
    eprintln!(
        "[replay] calibrated {} times in {:.1} s",
        models.len(),
        started.elapsed().as_secs_f64()
    );
    let all: Vec<f64> = models.iter().map(|m| m.emulated_ms).collect();
    let per_base = |m: &et_graph::GapModel| {
        let base = m.base_op_us();
        if base > 0.0 {
            m.emulated_ms / base
        } else {
            m.emulated_ms
        }
    };
    models.sort_by(|a, b| per_base(a).total_cmp(&per_base(b)));
    let mut model = models.swap_remove(models.len() / 2);
    model.calibrations_ms = all;
    Ok(model)
}

/// Sets `model`'s slowdown of the ops between its gaps ([`ops_between_gaps`], with the gaps
/// anchored on `reference` first where there is one); where it cannot be measured, says so
/// and leaves the gaps following the ops back to back.
fn measure_ops_between_gaps(
    g: &et_graph::Graph,
    set: &et_graph::ReplaySet,
    device: Device,
    autograd: bool,
    reference: Option<et_graph::Reference>,
    model: &mut et_graph::GapModel,
) {
    let mut spun = model.clone();
    if let Some(reference) = reference {
        et_graph::anchor(&mut spun, reference);
    }
    match ops_between_gaps(g, set, device, autograd, &spun) {
        Ok(Some(m)) => model.set_ops_between_gaps(m),
        Ok(None) => eprintln!(
            "warning: no pair of iterations with and without the gaps timed their ops \
             within x{:.1}-x{:.1} of each other: the gaps follow the ops back to back",
            et_graph::OpsBetweenGaps::BOUNDS.0,
            et_graph::OpsBetweenGaps::BOUNDS.1
        ),
        Err(e) => eprintln!(
            "warning: the replay alternating the gaps failed ({}): the gaps follow the \
             ops back to back",
            with_sources(&e)
        ),
    }
}

/// With --time-base-with-gaps (`et_graph::TimeBase`; opt-in), the time base again with the
/// gaps in place: the gaps spun for it are `model`'s as the replay will spin them (anchored on
/// the calibration's plain base where there is a reference); then the profile's model,
/// `profiled`, is anchored again on the new base (the ops' time between the gaps, as the
/// replay's pace reads it). Where that fails, `model` as it is.
fn rebased_with_gaps(
    g: &et_graph::Graph,
    set: &et_graph::ReplaySet,
    device: Device,
    autograd: bool,
    reference: Option<et_graph::Reference>,
    model: et_graph::GapModel,
    mut profiled: et_graph::GapModel,
) -> et_graph::GapModel {
    match base_with_gaps(g, set, device, autograd, &model) {
        Ok((steps_us, iterations)) if profiled.rebase(&steps_us, iterations) => {
            if let Some(reference) = reference {
                et_graph::anchor(&mut profiled, reference);
            }
            profiled
        }
        Ok(_) => {
            eprintln!(
                "warning: the replay with the gaps in place timed no op: the gaps follow the \
                 calibration's plain time base"
            );
            model
        }
        Err(e) => {
            eprintln!(
                "warning: the replay with the gaps in place failed ({}): the gaps follow the \
                 calibration's plain time base",
                with_sources(&e)
            );
            model
        }
    }
}

/// Logs how the model was anchored on `reference`, or warns that it could not be.
fn report_anchor(model: &et_graph::GapModel, reference: &et_graph::Reference) {
    // Hosts differ by a few times at most: an op time tens of times the reference's own is
    // another trace's reference (its model or its iterations), not this one's.
    if let Some(a) = model
        .anchored
        .as_ref()
        .filter(|a| !(0.2..=5.0).contains(&a.host_ratio))
    {
        eprintln!(
            "warning: this host's plain op time ({:.3} ms) is x{:.3} the reference's ({:.3} ms): \
             is the reference this trace's, over the same ops? The anchored gaps follow it",
            a.replay_op_ms, a.host_ratio, reference.replay_op_ms
        );
    }
    match &model.anchored {
        Some(a) => log::info!(
            "gap model anchored: {:.3} ms original over {:.3} ms of plain replay ops at the \
             reference, {:.3} ms of ops here (x{:.3}): {:.3} ms per iteration, {:.3} ms \
             emulated (the profile alone: {:.3} ms)",
            reference.original_ms,
            reference.replay_op_ms,
            a.replay_op_ms,
            a.host_ratio,
            a.target_ms,
            model.emulated_ms,
            a.profiled_ms
        ),
        None => eprintln!(
            "warning: the reference ({} ms original, {} ms replay, {} ms of it in ops) or \
             this host's plain op time is not a positive time: the gaps are the profile's \
             alone",
            reference.original_ms, reference.replay_ms, reference.replay_op_ms
        ),
    }
}

/// A calibration's plain and instrumented iterations: about half a second of instrumented ones
/// (3 to 15), each taken as long as the capture's instrumented iteration (`instrumented_s`) or
/// this host's where that is longer, and as many plain ones: 5 at least, where 5 plain
/// iterations of `plain_s` take under a second, else as many as take a second, 3 at least (a
/// GPU capture replayed on a CPU runs each many times slower than its capture, and at 15 + 5
/// of them param_linear's calibrations took 12 s each).
fn calibration_iterations(instrumented_s: f64, plain_s: f64) -> (usize, usize) {
    let instrumented = iterations_within(0.5, instrumented_s, (3, 15));
    let plain = if plain_s > 0.0 {
        iterations_within(1.0, plain_s, (3, 5))
    } else {
        5
    };
    (plain.max(instrumented), instrumented)
}

/// How many iterations of `each_s` seconds fit in `budget_s`, within `bounds`; the least
/// where an iteration's time is not known (not positive).
fn iterations_within(budget_s: f64, each_s: f64, bounds: (usize, usize)) -> usize {
    if each_s > 0.0 {
        ((budget_s / each_s) as usize).clamp(bounds.0, bounds.1)
    } else {
        bounds.0
    }
}

/// How much slower the ops run between `model`'s gaps than back to back on this host: a replay
/// of about half a second (2 to 40 pairs of runs of [`crate::ALTERNATION_RUN`] iterations)
/// that spins the gaps in every other run (no pace: as given), each step's median over the
/// settled iterations of each kind ([`et_graph::OpsBetweenGaps::of`]). A small model fills
/// the half second with many runs: 7 pairs, 14 iterations of each kind, took 17 ms of
/// hypernet_adam, and one such measurement read x1.317 where the model's others read
/// x1.01-1.11. The time the thread waited for a CPU is taken out
/// around the steps the calibration timed at a fifth of the least time slice or more
/// ([`et_graph::SLICE_MIN_US`]): a longer op loses whole slices on a busy host in many
/// iterations, which its median would keep; a shorter one has a slice's end inside it in few,
/// which its median leaves out, and the reads around it would cool it as the gaps do.
fn ops_between_gaps(
    g: &et_graph::Graph,
    set: &et_graph::ReplaySet,
    device: Device,
    autograd: bool,
    model: &et_graph::GapModel,
) -> Result<Option<et_graph::OpsBetweenGaps>, ReplayError> {
    let ops_s = model.base_op_us() / 1e6;
    let run = crate::ALTERNATION_RUN;
    let pair_s = run as f64 * (2.0 * ops_s + model.emulated_ms.max(0.0) / 1e3);
    let pairs = iterations_within(0.5, pair_s, (2, 40));
    // The warm-up ends inside the first run, which spins the gaps: measured, it is settled.
    let warmup = run - 1;
    let opts = ReplayOptions {
        device,
        autograd,
        warmup,
        iters: 2 * run * pairs,
        per_step: true,
        gaps_us: Some(model.gaps_us.clone()),
        gaps_alternating: true,
        running_time: true,
        running_time_steps: Some(
            model
                .base_step_us
                .iter()
                .map(|&b| b >= et_graph::SLICE_MIN_US / 5.0)
                .collect(),
        ),
        ..Default::default()
    };
    eprintln!(
        "[replay] timing the ops between the gaps and back to back ({} iterations, runs of \
         {run} alternating) ...",
        2 * run * pairs
    );
    let (r, _) = crate::replay(g, set, &opts)?;
    Ok(r.steps_alternating_us.and_then(|[with_gaps, plain]| {
        et_graph::OpsBetweenGaps::of(&with_gaps, &plain, (run - 1) * pairs)
    }))
}

/// Each step's time (µs, its median) with `model`'s gaps spun before it as a replay spins them
/// (no pace: as given; no run-delay reads around the steps, which the replay does not make
/// either), and the iterations it was taken over: about 0.3 s of them, 5 to 30.
fn base_with_gaps(
    g: &et_graph::Graph,
    set: &et_graph::ReplaySet,
    device: Device,
    autograd: bool,
    model: &et_graph::GapModel,
) -> Result<(Vec<f64>, usize), ReplayError> {
    let iter_s = (model.base_op_us() / 1e3 + model.emulated_ms.max(0.0)) / 1e3;
    let iters = iterations_within(0.3, iter_s, (5, 30));
    let opts = ReplayOptions {
        device,
        autograd,
        warmup: 1,
        iters,
        per_step: true,
        gaps_us: Some(model.gaps_us.clone()),
        ..Default::default()
    };
    eprintln!("[replay] timing the ops with the gaps in place ({iters} iterations) ...");
    let (r, _) = crate::replay(g, set, &opts)?;
    Ok((r.steps.iter().map(|s| s.launch_us).collect(), iters))
}

/// Calibrations per gap model: at least, at most (both odd: the median is one of them).
const CALIBRATIONS: (usize, usize) = (5, 25);

/// Calibrating goes on past the least count of [`CALIBRATIONS`] while it has taken less than
/// this in all (counted from the first), then stops at the next odd count.
const CALIBRATION_BUDGET: std::time::Duration = std::time::Duration::from_secs(2);

/// One calibration's iterations on this host (s): the plain ones' median, and the
/// instrumented one's where it ran.
struct HostIterations {
    plain_s: f64,
    instrumented_s: Option<f64>,
}

/// One calibration replay and the gap model it gives, with its iterations' times; `warn`: say
/// what went wrong (once for all calibrations).
fn calibrate_once(
    g: &et_graph::Graph,
    set: &et_graph::ReplaySet,
    kineto: &Linked,
    calib: &ReplayOptions,
    warn: bool,
) -> Result<(et_graph::GapModel, HostIterations), ReplayError> {
    let (r, _) = crate::replay(g, set, calib)?;
    let ran = HostIterations {
        plain_s: r.iter_ms.median / 1e3,
        instrumented_s: r.instrumented_iter_ms.map(|ms| ms / 1e3),
    };
    if let (Some(e), true) = (&r.instrument_error, warn) {
        eprintln!(
            "warning: the calibration replay could not run under the capture's instrumentation \
             ({e}): the capture's gaps are emulated uncorrected"
        );
    }
    // The profiled windows are on the host's clock: so are the plain times they are set
    // against (on CUDA, the launch times; the bookkeeping between steps is then not known
    // apart from the device's idle time, and counts as 0).
    let host = r.timing == "host clock";
    let plain: Vec<f64> = r.steps.iter().map(|s| s.launch_us).collect();
    let profiled: Vec<Option<(f64, f64, u32)>> = (0..plain.len())
        .map(|k| {
            r.profiled
                .get(k)
                .copied()
                .flatten()
                .map(|p| (p.start_us, p.end_us, p.nested))
        })
        .collect();
    let model = et_graph::gap_model(
        g.trace,
        &kineto.link,
        &kineto.kineto,
        &kineto.original,
        &et_graph::ReplayTimes {
            plain_us: &plain,
            between_us: if host { r.overhead_us_per_op } else { 0.0 },
            profiled: &profiled,
            event_us: r.instrumented_event_us,
            backward_event_us: r.instrumented_backward_event_us,
            // What `calib` probed, which `costs` chose (`calibration_options`): nothing else
            // is in the report.
            op_event_us: r.instrumented_op_us,
            op_in_window_us: r.instrumented_op_in_window_us,
            node_us: r.instrumented_node_us,
            call_us: &r.instrumented_call_us,
            boxing_us: r.instrumented_boxing_us,
            edges_us: r.instrumented_edges_us,
            plain_leads_us: if host { &r.step_leads_us } else { &[] },
        },
    );
    if !model.calibrated() && warn {
        eprintln!(
            "warning: {} of the replayed ops were found in both the capture's profile and the \
             calibration's to time this host against the capture, fewer than {} (an op that \
             launched GPU work in the original has only its launch in the capture's profile, \
             and counts for none): the capture's gaps are emulated as they stand, its \
             instrumentation and host not taken out. Replay more of the iteration, or anchor \
             the gaps on a reference (--reference)",
            model.speed_ops,
            et_graph::MIN_SPEED_OPS
        );
    }
    if model.capped > 0 && warn {
        eprintln!(
            "warning: {} gaps of the Kineto trace are longer than this model's iteration can \
             be (ten times its op time): capped (a shifted event?)",
            model.capped
        );
    }
    log::info!(
        "gap model: capture {:.3} ms of gaps -> {:.3} ms emulated over {:.3} ms of plain op time (speed {:.3} over {} ops, {:.2} us per event, {:.2} us per boundary; the calibration waited {:.3} ms per iteration for a CPU, taken out)",
        model.capture_gaps_ms,
        model.emulated_ms,
        model.base_op_us() / 1e3,
        model.speed,
        model.speed_ops,
        model.per_event_us,
        model.per_boundary_us,
        r.cpu.as_ref().and_then(|c| c.waited_for_cpu_ms).unwrap_or(0.0)
    );
    Ok((model, ran))
}

/// A Kineto trace linked to a replay set, with the original run's timing.
pub struct Linked {
    /// The Kineto trace.
    pub kineto: et_schema::kineto::KinetoTrace,
    /// Its events linked to the replay set's ops.
    pub link: et_graph::Link,
    /// The original's op times and gaps read from it.
    pub original: et_graph::OriginalTiming,
}

impl Linked {
    /// Links `kineto` to `set`. `typical`: the timing typical of the trace's iterations
    /// like the set's (`et_graph::typical_timing`), else the set's own.
    pub fn of(
        g: &et_graph::Graph,
        set: &et_graph::ReplaySet,
        kineto: et_schema::kineto::KinetoTrace,
        typical: bool,
    ) -> Result<Linked, et_graph::LinkError> {
        // A profile of several iterations taken without the execution trace observer links
        // by order, one of its iterations at a time (its gaps typical of them all).
        let link = et_graph::timing_link(g, set, &kineto)?;
        let original = if typical {
            et_graph::typical_timing(g, set, &kineto, &link)
        } else {
            et_graph::original_timing(&link, &kineto)
        };
        Ok(Linked {
            kineto,
            link,
            original,
        })
    }
}

/// An error with its sources, `outer: inner: ...`, for a warning that does not stop the run.
fn with_sources(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_warning_carries_the_error_s_sources() {
        let e = ReplayError::Materialise(crate::CallError::new(
            crate::ErrorKind::OutOfMemory,
            "CPU: not enough memory",
        ));
        assert_eq!(
            with_sources(&e),
            "materialising inputs: CPU: not enough memory"
        );
    }

    #[test]
    fn iterations_fill_the_budget_within_their_bounds() {
        assert_eq!(iterations_within(1.0, 0.1, (3, 15)), 10);
        assert_eq!(iterations_within(1.0, 0.0, (3, 15)), 3);
        assert_eq!(iterations_within(1.0, 1e-6, (3, 15)), 15);
    }

    #[test]
    fn calibrations_of_long_iterations_run_fewer_of_them() {
        // A small model: as many plain iterations as instrumented ones, at least 5.
        assert_eq!(calibration_iterations(0.002, 0.001), (15, 15));
        assert_eq!(calibration_iterations(0.1, 0.02), (5, 5));
        // Before this host's iterations are known: the capture's decides.
        assert_eq!(calibration_iterations(0.03, 0.0), (15, 15));
        // Half a second an iteration here: 3 instrumented and 3 plain.
        assert_eq!(calibration_iterations(0.6, 0.5), (3, 3));
        assert_eq!(calibration_iterations(0.6, 0.25), (4, 3));
    }
}
