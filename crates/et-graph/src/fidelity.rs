//! Fidelity: how the original run spent its time, and how a replay compares with it. The gap
//! model (time outside operators, corrected for the profiler's own cost) and the per-op
//! comparison live here, in one place and without libtorch; the replay crate only executes
//! what they compute (it spins the gaps, it profiles an instrumented iteration) and the CLI
//! only prints.

use crate::graph::{Graph, ReplaySet};
use crate::link::{is_cpu_event, link, Link};
use et_schema::kineto::{KinetoTrace, Lane};
use std::collections::{BTreeMap, HashMap, HashSet};

/// Timing of the original run, per replay-set op, from the linked Kineto events.
#[derive(Clone, Debug, Default)]
pub struct OriginalTiming {
    /// Kineto duration of each op (µs); `None` when unlinked.
    pub op_us: Vec<Option<f64>>,
    /// Time between the end of the previous op and the start of this one (µs), spent outside
    /// operators (Python, autograd bookkeeping); 0 when unlinked or overlapping. The first
    /// linked op's gap is the iteration's time before its first op and after its last (the
    /// iteration repeats, so both fall between two ops).
    pub gap_us: Vec<f64>,
    /// The iteration (µs): [`Link::span`] when known, else from the first op's start to the
    /// last op's end.
    pub span_us: f64,
    /// The `ProfilerStep#N` iterations these figures are typical of ([`typical_timing`]):
    /// empty for one iteration's own timing.
    pub iterations: Vec<u64>,
}

/// Durations and gaps of the original run along the replay set's execution order.
pub fn original_timing(l: &Link, k: &KinetoTrace) -> OriginalTiming {
    let mut out = OriginalTiming {
        op_us: Vec::with_capacity(l.event_of.len()),
        gap_us: Vec::with_capacity(l.event_of.len()),
        span_us: 0.0,
        iterations: Vec::new(),
    };
    let mut prev_end: Option<f64> = None;
    let (mut first, mut last) = (f64::INFINITY, f64::NEG_INFINITY);
    let mut first_pos = None;
    for (pos, e) in l.event_of.iter().enumerate() {
        match e {
            Some(e) => {
                let ev = &k.events[*e as usize];
                out.op_us.push(Some(ev.dur));
                out.gap_us
                    .push(prev_end.map_or(0.0, |p| (ev.ts - p).max(0.0)));
                prev_end = Some(prev_end.map_or(ev.ts + ev.dur, |p: f64| p.max(ev.ts + ev.dur)));
                first = first.min(ev.ts);
                last = last.max(ev.ts + ev.dur);
                first_pos.get_or_insert(pos);
            }
            None => {
                out.op_us.push(None);
                out.gap_us.push(0.0);
            }
        }
    }
    if let (Some((a, b)), Some(p)) = (l.span, first_pos) {
        out.gap_us[p] = (first - a).max(0.0) + (b - last).max(0.0);
        (first, last) = (first.min(a), last.max(b));
    }
    if last > first {
        out.span_us = last - first;
    }
    out
}

/// The original's timing typical of the trace's iterations like the one `set` holds.
///
/// A capture is one sample of each gap and op: the first profiled iteration carries the
/// instrumentation's one-time costs (its first op and the gap after it), a busy host's stalls
/// fall where they fell, and this VM's speed moves by up to 2x in spells of 100-200 ms. A
/// trace of several `ProfilerStep#N` iterations (a profiler schedule with `active` > 1) holds
/// more samples: where `set` is one of them, every other iteration that ran the same ops
/// (names in the same order) and links as fully is linked too, and each op's duration and
/// each gap is the least over them ([`least`]). Every sample is the time the work takes plus
/// what interfered with it (a time slice another process took, a slow spell, the profiler's
/// buffers), never less, so the least is the estimate of the work's own time, for gaps and ops
/// alike; the host's speed is then measured against op times of the same kind. Paired over the
/// tuning set's captures on a quiet and on a busy host (both profiled without the observer),
/// the gaps' share of the op time agreed within 0-12% between the two captures of each model
/// with the least, against -8% to +73% with the interquartile mean the model took before,
/// while a quiet capture's share moved by 0-3% for five of the seven (lstm_train 47%: its ops'
/// times swung 2.7x between its iterations and its gaps' did not).
///
/// A Kineto trace taken without the execution trace observer links by order
/// ([`crate::link::link_steps`]): each of its `ProfilerStep#N` iterations that links as fully
/// as any is a sample, whatever the ET holds. With one iteration (or several chosen),
/// `original_timing` of `l`.
pub fn typical_timing(g: &Graph, set: &ReplaySet, k: &KinetoTrace, l: &Link) -> OriginalTiming {
    let own = original_timing(l, k);
    if l.method == crate::link::Method::Alignment {
        let steps = crate::link::link_steps(g, set, k);
        if steps.len() < 2 {
            return own;
        }
        let like: Vec<(u64, OriginalTiming)> = steps
            .iter()
            .map(|(n, ls)| (*n, original_timing(ls, k)))
            .collect();
        return typical_of(like, set.ops.len());
    }
    let [(_, chosen)] = g.iterations_of(set)[..] else {
        return own;
    };
    let names: Vec<&str> = set.ops.iter().map(|&i| g.name(i)).collect();
    let mut like = vec![(chosen, own)];
    for (_, n) in g.iterations() {
        if n == chosen {
            continue;
        }
        let s = g.replay_set(Some(&[n]));
        if s.ops.len() != names.len() || s.ops.iter().zip(&names).any(|(&i, m)| g.name(i) != *m) {
            continue;
        }
        let Ok(ls) = link(g, &s, k) else { continue };
        if ls.linked() < l.linked() || ls.span.is_some() != l.span.is_some() {
            continue;
        }
        like.push((n, original_timing(&ls, k)));
    }
    if let [(_, own)] = &mut like[..] {
        return std::mem::take(own);
    }
    typical_of(like, names.len())
}

/// The least, op by op and gap by gap, of several iterations' timings of the same
/// `n` ops.
fn typical_of(mut like: Vec<(u64, OriginalTiming)>, n: usize) -> OriginalTiming {
    like.sort_by_key(|x| x.0);
    let timings: Vec<&OriginalTiming> = like.iter().map(|x| &x.1).collect();
    OriginalTiming {
        op_us: (0..n)
            .map(|p| least(timings.iter().filter_map(|t| t.op_us[p])))
            .collect(),
        gap_us: (0..n)
            .map(|p| least(timings.iter().map(|t| t.gap_us[p])).unwrap_or(0.0))
            .collect(),
        span_us: least(timings.iter().map(|t| t.span_us)).unwrap_or(0.0),
        iterations: like.iter().map(|x| x.0).collect(),
    }
}

/// The least of the finite values; `None` without any.
pub fn least(v: impl IntoIterator<Item = f64>) -> Option<f64> {
    v.into_iter()
        .filter(|x| x.is_finite())
        .min_by(f64::total_cmp)
}

/// The replay's own timing, measured in the same run as the gap model is built: each step's
/// plain time, the replay's bookkeeping between steps, and each step's window in one iteration
/// run under the capture's instrumentation (execution trace observer + Kineto), in replay-set
/// order.
#[derive(Clone, Copy, Debug)]
pub struct ReplayTimes<'a> {
    /// Median plain time of each step (µs).
    pub plain_us: &'a [f64],
    /// The plain replay's time between steps (µs per step: its iteration minus its op time,
    /// over the steps).
    pub between_us: f64,
    /// Each step's profiled window (start, end µs on the profile's clock, events recorded
    /// inside it), `None` where the step was not found in the profile.
    pub profiled: &'a [Option<(f64, f64, u32)>],
    /// The instrumentation's cost of one event without arguments (µs), probed on this host
    /// under the same instrumentation (one event at a time, between the replay's ops): what an
    /// annotation or autograd wrapper in a gap costs.
    pub event_us: Option<f64>,
    /// The instrumentation's cost of an event such as autograd records for a backward node
    /// (`XBackward0`, its tensor inputs recorded), probed on this host: (µs per event, µs per
    /// tensor input).
    pub backward_event_us: Option<(f64, f64)>,
    /// What the instrumentation adds to an op called as the original's Python calls one (µs),
    /// probed on this host through the dispatcher (experimental, `--probed-costs`): where
    /// given, the cost charged at each boundary between two ops.
    pub op_event_us: Option<f64>,
    /// What it adds to autograd's engine per node it runs (µs), probed on this host with the
    /// engine itself: the cost of each backward node (its two events and the rest).
    pub node_us: Option<f64>,
}

/// The instrumentation a Kineto trace was taken under, as far as the trace shows: what the
/// calibration replay runs under to measure that instrumentation's cost on this host.
///
/// The execution trace observer records every op's arguments as it runs, and costs far more
/// than the profiler: on the zoo's CPU models an iteration under both took 3-20x its
/// uninstrumented time (DLRM: 18 ms against 1.4 ms), under the profiler alone 1.1-2x. A linked
/// pair (ET and Kineto of one iteration) carries the observer's cost in every gap, and the
/// model subtracts it; a profile taken without the observer, linked by order to an ET captured
/// in an iteration of its own, leaves far less to subtract.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Instrumentation {
    /// The execution trace observer was on.
    pub execution_trace: bool,
    /// The profiler recorded input shapes (`record_shapes`).
    pub record_shapes: bool,
}

impl Instrumentation {
    /// A linked ET + Kineto pair as `torch.profiler.profile(execution_trace_observer=...,
    /// record_shapes=True)` takes it.
    pub const LINKED: Instrumentation = Instrumentation {
        execution_trace: true,
        record_shapes: true,
    };

    /// What `k` was taken under: the observer unless its events carry record function ids of
    /// 0 (an older trace without the field was a linked pair: ids came later), and input
    /// shapes as the trace's flag (or its events) says.
    pub fn of(k: &KinetoTrace) -> Instrumentation {
        Instrumentation {
            execution_trace: k.execution_trace_observer != Some(false),
            record_shapes: k.record_shapes,
        }
    }
}

impl Default for Instrumentation {
    fn default() -> Self {
        Instrumentation::LINKED
    }
}

impl std::fmt::Display for Instrumentation {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(if self.execution_trace {
            "execution trace observer + profiler"
        } else {
            "profiler alone"
        })?;
        if self.record_shapes {
            f.write_str(" (record_shapes)")?;
        }
        Ok(())
    }
}

/// What the gap model emulates between ops, and every quantity it was computed from. Serialised
/// into the report, so a reader sees how much of a replay's time is emulated and why.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct GapModel {
    /// The gap to spin before each step (µs), in replay-set order.
    #[serde(skip)]
    pub gaps_us: Vec<f64>,
    /// What the capture was taken under (and the calibration replay ran under).
    pub instrumentation: Instrumentation,
    /// The capture's time between ops per iteration (ms), as profiled.
    pub capture_gaps_ms: f64,
    /// What is emulated per iteration (ms).
    pub emulated_ms: f64,
    /// The capture's iterations the gaps and op times are typical of ([`typical_timing`]):
    /// 1 for a one-iteration capture, or where the trace's other iterations ran other ops.
    pub capture_iterations: usize,
    /// This host's speed relative to the capture's, both under the same instrumentation: the
    /// replay's profiled op windows over the original's Kineto durations, summed over the ops
    /// found in both, less those in which the capture lost a time slice (`slices_in_ops`).
    /// The replay's windows are in running time (the calibration takes out the time its thread
    /// waited for a CPU), and so are the gaps the executor spins: a busy replay host slows
    /// them as it slows the ops, not through this factor.
    /// Below 1: this host (now) runs the ops faster than the capture did (a slower or busier
    /// capture host), so the capture's gaps shrink by the same factor. A busy host's capture
    /// loses whole time slices (milliseconds) in a few ops; with them, the sums took the zoo's
    /// busy captures for 1.9-3.6x slower hosts where their other ops say 1.0-1.4x.
    pub speed: f64,
    /// The same ratio with the replay's plain (uninstrumented) op times: `speed` less what the
    /// instrumentation adds to the replay's windows (NaN where there is no speed).
    pub plain_speed: f64,
    /// Ops the speed was measured on (found in both profiles).
    pub speed_ops: usize,
    /// The instrumentation's cost per recorded event on this host (µs): over the ops found in
    /// both, the sum of (profiled window - plain time) over the sum of events in the windows.
    pub per_event_us: f64,
    /// The instrumentation's cost between two ops on this host (µs): by default
    /// `replay_boundary_us`; with the op probed (`ReplayTimes::op_event_us`, experimental),
    /// what it adds to an op called as the original calls ops.
    pub per_boundary_us: f64,
    /// The mean of the instrumented replay's gaps less the plain replay's bookkeeping between
    /// steps (µs). More than the probed cost of an op's events (0.8-2.8 against 0.4-0.6 µs):
    /// it also holds how much the instrumentation's records slow the work between two ops, as
    /// they slow the original's Python and autograd engine there, which the zoo's paired runs
    /// favour (ARCHITECTURE.md, fifth session).
    pub replay_boundary_us: f64,
    /// The cost charged per backward node in a gap (µs): what the instrumentation adds per node
    /// to autograd's engine running a graph of nodes, probed on this host with and without it
    /// (1.4-3 µs, where the node's two record-function scopes timed alone cost 0.6). It covers
    /// the node's event and its `evaluate_function` wrapper. `None`: not probed, the two events
    /// charged one by one.
    pub per_node_us: Option<f64>,
    /// Profiled events the original recorded inside its gaps (annotations, autograd's
    /// `evaluate_function` wrappers), each charged `per_gap_event_us`.
    pub events_in_gaps: usize,
    /// Of `events_in_gaps`, those whose ET node records arguments (autograd's `XBackward0`
    /// nodes record their tensors): each charged `per_event_us`, like an op's events. In a
    /// profile without record function ids, the events that recorded tensors; without
    /// `record_shapes` either, the backward nodes their `evaluate_function` wrappers name.
    pub events_with_args: usize,
    /// The cost charged per argument-less event in a gap (µs): the probed cost of an event
    /// without arguments where measured, else `per_event_us`.
    pub per_gap_event_us: f64,
    /// The cost charged per event with arguments in a gap, as (µs per event, µs per tensor it
    /// records): probed on this host with events like autograd's backward nodes. `None`: not
    /// probed, each charged `per_event_us`.
    pub per_backward_event_us: Option<(f64, f64)>,
    /// The tensors the `events_with_args` record.
    pub tensors_in_gap_events: usize,
    /// Gaps capped at ten times the original's op time (a shifted event).
    pub capped: usize,
    /// Time slices the capturing process lost while inside an op (it was descheduled: a busy
    /// host): ops whose capture time exceeds the prediction of the ops' typical speed (the
    /// window-weighted median ratio) by [`SLICE_MIN_US`] or more.
    pub slices_in_ops: usize,
    /// The shortest of those losses (µs); gaps at least this long are taken to hold one too.
    pub shortest_slice_us: Option<f64>,
    /// Gaps taken to hold a lost time slice, emulated as the capture's median gap instead.
    pub slices_in_gaps: usize,
    /// Each gap was put on this host by the speed of the ops around it (`local_speed`), not
    /// by `speed`: the capture lost time slices, so its share of a CPU moved while it ran.
    pub local_speed: bool,
    /// The emulated total (ms) of each calibration the model was chosen from, in order (the
    /// model is the median one's by emulated total per unit of its plain op time, what the
    /// replay spins); empty where it came from one.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub calibrations_ms: Vec<f64>,
    /// Each step's plain time on this host (µs) when the gaps were calibrated: the time base
    /// the replay follows the host's speed from (empty: gaps spun as they are).
    #[serde(skip)]
    pub base_step_us: Vec<f64>,
    /// Where the gaps' total was anchored on a [`Reference`] ([`anchor`]): what it came from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub anchored: Option<Anchored>,
    /// Where [`GapModel::base_step_us`] was measured again with the gaps in place: the plain
    /// time base it replaced, and the new one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_base: Option<TimeBase>,
    /// How much slower the ops run between the spun gaps than back to back, measured on this
    /// host in runs of iterations that alternate ([`OpsBetweenGaps`]); the time base holds it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ops_between_gaps: Option<OpsBetweenGaps>,
}

/// The replay's ops between spun gaps against the same ops back to back, on this host, in one
/// replay whose iterations alternate in short runs (with the gaps, without; each run a few
/// milliseconds from the next, so a VM's slow spell moves both kinds): the ratio of the steps'
/// medians over the runs' settled iterations. The ops between gaps run slower (their caches
/// and predictors cool while the gap is spun, and on a busy host a core shared with another
/// process is taken more often inside them): 1.03-1.10 on a quiet host and up to 1.2 beside a
/// CPU burner in the harness's paced blocks. Part of it outlasts the iteration: single
/// iterations alternating read a median of 1.007 (0.94-1.14) over one busy-host run's replays
/// (ARCHITECTURE.md, nineteenth session), the back-to-back ones slowed by the gapped one before
/// them; hence runs (the replay's `ALTERNATION_RUN`, twenty-second session). The gap model's time base is multiplied by it, so that `GapPace` reads only the
/// host's own changes (not the gaps' effect on the ops as a slower host), and
/// an anchor ([`anchor`]) puts the reference on this host by the ops back to back, as the
/// reference's plain replay ran them, then fills the target with the ops as they run between
/// the gaps: the original's ops were as cold after its Python, and the reference's original
/// time holds that already; counting the replay's cooling on top would count it twice.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct OpsBetweenGaps {
    /// Op time between the gaps over op time back to back.
    pub factor: f64,
    /// The iterations of each kind (with the gaps, back to back) it was measured over.
    pub iterations: usize,
}

impl OpsBetweenGaps {
    /// A factor outside this is not the gaps' effect but a broken measurement (the replay's
    /// pace bounds its factor the same way).
    pub const BOUNDS: (f64, f64) = (0.5, 2.0);

    /// From each step's median time in the iterations that spun the gaps (`with_gaps_us`) and
    /// in those that ran back to back (`plain_us`), `iterations` of each, alternating: the
    /// ratio of the two sums over the steps timed in both. Per-step medians, so that the time
    /// slice another process took inside an op in a few iterations, or a VM's slow spell, is
    /// left out (both kinds of iteration sampled the same spells, one after the other), where a
    /// ratio of iterations' op sums kept it whenever one fell in an iteration (on a busy host,
    /// most iterations of a model with many small ops). `None` without a step timed in both,
    /// or where the ratio falls outside [`OpsBetweenGaps::BOUNDS`].
    pub fn of(with_gaps_us: &[f64], plain_us: &[f64], iterations: usize) -> Option<OpsBetweenGaps> {
        let ok = |x: f64| x.is_finite() && x >= 0.0;
        let (g, p) = with_gaps_us
            .iter()
            .zip(plain_us)
            .filter(|(g, p)| ok(**g) && ok(**p))
            .fold((0.0, 0.0), |(sg, sp), (g, p)| (sg + g, sp + p));
        if p <= 0.0 {
            return None;
        }
        let factor = g / p;
        (Self::BOUNDS.0..=Self::BOUNDS.1)
            .contains(&factor)
            .then_some(OpsBetweenGaps { factor, iterations })
    }
}

/// The time base a gap model's replay follows the host's speed from, taken with the model's
/// gaps spun between the ops rather than with the ops back to back. The replay measures its
/// ops' speed between spun gaps and sets it against the base (`GapPace`): against a plain
/// base, the difference between ops back to back and ops between gaps read as a change of
/// the host's speed, and stretched the gaps by it. On a busy host the difference is large
/// (the fifteenth session's runs beside CPU burners: ops between spun gaps 15-20% slower than
/// back to back, and the gaps stretched by a median 1.13-1.15 for it); measured the way the
/// replay runs, the base leaves only the host's own changes to follow.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct TimeBase {
    /// The plain base's op time per iteration (ms): the calibration's, ops back to back.
    pub plain_ms: f64,
    /// The op time per iteration with the gaps in place (ms): the base now.
    pub with_gaps_ms: f64,
    /// The iterations it was measured over (each step's median over them).
    pub iterations: usize,
}

/// The original's uninstrumented iteration and the plain replay's (no gaps), timed side by
/// side on the host that captured the trace (ms): what the original takes beyond the replay's
/// ops there, measured without any instrumentation.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Reference {
    pub original_ms: f64,
    /// The plain replay's iteration.
    pub replay_ms: f64,
    /// The time in its ops (the rest, `replay_ms - replay_op_ms`, its bookkeeping between them).
    pub replay_op_ms: f64,
}

/// How an anchored gap model ([`anchor`]) came out.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Anchored {
    /// The reference it was anchored on.
    pub reference: Reference,
    /// The plain replay's op time on this host now (ms; the calibration's plain iterations).
    pub replay_op_ms: f64,
    /// This host's speed against the reference's, like for like: `replay_op_ms` over the
    /// reference's (below 1: faster here).
    pub host_ratio: f64,
    /// The iteration the gaps make up to (ms): the reference original's, times `host_ratio`.
    pub target_ms: f64,
    /// What the gap model from the profile alone emulated (ms), before anchoring.
    pub profiled_ms: f64,
    /// The factor its gaps were scaled by (0: the plain replay already takes the target's
    /// time or more here; the gaps are then not spun).
    pub scale: f64,
}

impl GapModel {
    /// The time base's op time per iteration (µs): its steps' finite times summed (a step
    /// that failed in the calibration has none).
    pub fn base_op_us(&self) -> f64 {
        self.base_step_us.iter().filter(|b| b.is_finite()).sum()
    }

    /// Multiplies the time base by how much slower the ops run between the gaps
    /// ([`OpsBetweenGaps`]), and records it. Where the model was anchored, anchor it again
    /// ([`anchor`]): its host ratio then divides the factor back out.
    pub fn set_ops_between_gaps(&mut self, m: OpsBetweenGaps) {
        // Again on a model that has one: the base is the plain one times the new factor.
        let old = self.ops_between_gaps.map_or(1.0, |o| o.factor);
        for b in &mut self.base_step_us {
            *b *= m.factor / old;
        }
        self.ops_between_gaps = Some(m);
    }

    /// The time base's op time per iteration as the ops run back to back (µs):
    /// [`GapModel::base_op_us`] without the gaps' effect on them.
    pub fn plain_op_us(&self) -> f64 {
        self.base_op_us() / self.ops_between_gaps.map_or(1.0, |o| o.factor)
    }

    /// Takes `with_gaps_us` (each step's time measured with the gaps in place, over
    /// `iterations`) as the time base the replay follows the host's speed from ([`TimeBase`]).
    /// A step without a usable time there (not finite, negative: it failed or was left out)
    /// keeps its plain time. Returns false, changing nothing, where the two do not cover the
    /// same steps or the new base holds no time.
    pub fn rebase(&mut self, with_gaps_us: &[f64], iterations: usize) -> bool {
        if with_gaps_us.len() != self.base_step_us.len() {
            return false;
        }
        let usable = |x: f64| x.is_finite() && x >= 0.0;
        let base: Vec<f64> = with_gaps_us
            .iter()
            .zip(&self.base_step_us)
            .map(|(&w, &p)| if usable(w) { w } else { p })
            .collect();
        let total = |v: &[f64]| v.iter().filter(|x| usable(**x)).sum::<f64>() / 1e3;
        let with_gaps_ms = total(&base);
        // A sum of finite times: never NaN.
        if with_gaps_ms <= 0.0 {
            return false;
        }
        self.time_base = Some(TimeBase {
            plain_ms: total(&self.base_step_us),
            with_gaps_ms,
            iterations,
        });
        self.base_step_us = base;
        true
    }
}

/// Anchors `model`'s gaps on a `reference`: their shape (which gap holds how much) stays the
/// profile's, their total becomes what the original took beyond the plain replay on the
/// capture host, put on this host by the plain replay's own ratio. With `O` the reference's
/// plain replay's op time, `T` its original and `o` this host's plain op time (the model's
/// `base_step_us`, the time base its gaps follow), the replay with gaps takes `T * o / O`
/// (op times, not iterations: a calibration's plain iterations hold its per-step timing,
/// about 1 µs a step, where a replay's hold 0.1). The instrumentation never enters (both
/// references are uninstrumented), and neither does how slow a profiled capture ran, nor how
/// the capture's cold ops set against the replay's warm ones (ARCHITECTURE.md, fourteenth
/// session). Where the model knows how much slower its ops run between the gaps
/// ([`OpsBetweenGaps`]), `o` is the ops back to back (as the reference's `O` ran), and the
/// target is filled with the ops as they run between the gaps (nineteenth session). What the
/// ratio assumes is the bottom-up model's own: that the original's time outside ops follows
/// this host's speed as its ops do. The executor spins each gap from the
/// end of the op before, the replay's bookkeeping inside it (the reference's, `R - O`, put on
/// this host), and where the bookkeeping before one op outlasts its gap, the gaps after give
/// the excess back (the executor's `Owed`), so the time outside the ops is the larger of the
/// gaps' total and the bookkeeping's: the scale solves `max(scale * sum(e_i), R - O) = target -
/// o`. A model with no gaps to shape it spreads the time over every step evenly.
/// Nothing is spun where the plain replay is already as slow as the target; above, the
/// reference's total is taken as it is (no cap), and `Anchored::scale` reports the factor.
pub fn anchor(model: &mut GapModel, reference: Reference) {
    let ops_us = model.base_op_us();
    let ok = |x: f64| x.is_finite() && x > 0.0;
    let r = reference;
    if !(ok(r.original_ms) && ok(r.replay_op_ms) && ok(ops_us) && r.replay_ms >= r.replay_op_ms) {
        return;
    }
    let n = model.gaps_us.len();
    // Like for like: the reference's plain replay ran its ops back to back.
    let host_ratio = model.plain_op_us() / (r.replay_op_ms * 1e3);
    let target_us = r.original_ms * 1e3 * host_ratio;
    let bookkeeping = (r.replay_ms - r.replay_op_ms) * 1e3 * host_ratio;
    let mut shape: Vec<f64> = model.gaps_us.iter().map(|g| g.max(0.0)).collect();
    if shape.iter().sum::<f64>() <= 0.0 {
        shape.iter_mut().for_each(|g| *g = 1.0);
    }
    let outside = target_us - ops_us;
    let scale = if n == 0 || outside <= bookkeeping {
        0.0
    } else {
        outside / shape.iter().sum::<f64>()
    };
    let profiled_ms = model.emulated_ms;
    model.gaps_us = shape.iter().map(|w| scale * w).collect();
    model.emulated_ms = model.gaps_us.iter().sum::<f64>() / 1e3;
    model.anchored = Some(Anchored {
        reference,
        replay_op_ms: model.plain_op_us() / 1e3,
        host_ratio,
        target_ms: target_us / 1e3,
        profiled_ms,
        scale,
    });
}

/// The least time a descheduled process loses (µs): Linux's minimum scheduling granularity is
/// 0.75 ms and up, so an op that ran longer than predicted by this much or more lost a time
/// slice to another process, rather than running slower. A property of the OS, not of a model.
pub const SLICE_MIN_US: f64 = 500.0;

/// The time outside operators to emulate before each op, as a formula of quantities measured
/// in this run (no fitted constants):
///
/// `e_i = speed * g_i - per_boundary - per_gap_event * n_i - (per_backward_event * m_i + per_tensor * t_i)` (with the engine probed, `per_gap_event * (n_i - m_i) + per_node * m_i + per_tensor * t_i` for the events), `gap_i = max(0, e_i) * sum(e) / sum(max(0, e))`
///
/// (the per-gap estimates clipped at 0, rescaled so that they add up to the unclipped total:
/// what the whole iteration emulates is not biased up by the gaps whose estimate is negative),
/// where `g_i` is the capture's (instrumented) gap before op `i`, `speed` puts it on this host
/// under the same instrumentation (the replay's profiled op windows over the original's, summed
/// over the ops found in both that ran and launched no GPU work, so a capture on a busy or
/// slower host counts for what it is; for a capture that lost time slices, the same ratio over
/// the ops around the gap, `local_speed`, as such a host's share of the CPU moved while it
/// ran), and the two subtractions remove what that instrumentation costs here: the instrumented replay's own
/// time between two ops, beyond its plain bookkeeping (`per_boundary`), and one event's cost
/// for each event the original recorded inside the gap: `per_gap_event` (the probed cost of an
/// event without arguments) for the `n_i` that record none (annotations, autograd's
/// `evaluate_function` wrappers), and for the `m_i` whose ET node records arguments
/// (autograd's `XBackward0` nodes) the probed cost of such an event with its tensor count
/// (`per_backward_event`, where probed; else `per_event`, the replay's mean cost per op
/// event, which ops recording many arguments make 3-4 times an autograd node's); where
/// autograd's engine was probed (`node_us`), each such node and its argument-less wrapper are
/// charged the engine's probed cost per node instead (`per_node`). Where the
/// replay has no profile (fewer than 3 ops found), `speed` is 1 and the costs are 0: the
/// capture's gaps are taken as they are, and the model says so by `speed_ops`.
pub fn gap_model(
    t: &et_schema::Trace,
    l: &Link,
    k: &KinetoTrace,
    orig: &OriginalTiming,
    r: &ReplayTimes,
) -> GapModel {
    // Which events record arguments: the ET node of the same record-function id has inputs (an
    // autograd `XBackward0` node records its tensors; its `evaluate_function` wrapper, an
    // annotation, nothing). Events the ET cannot name count as argument-less.
    // (and how many tensors it records).
    let with_args: HashMap<u64, usize> = t
        .nodes
        .iter()
        .filter(|n| !t.inputs(n).is_empty())
        .filter_map(|n| {
            let mut v = Vec::new();
            for a in t.inputs(n) {
                t.tensors_in(a.value, &mut v);
            }
            n.rf_id.map(|id| (id, v.len()))
        })
        .collect();
    // A profile without `record_shapes` records no tensors: its backward nodes are told by
    // name (none are needed where the events' shapes say what they record).
    let nodes = if k.record_shapes {
        HashSet::new()
    } else {
        backward_node_names(k)
    };
    // Event starts per thread (a gap is this thread's time), each with running counts of the
    // events that record arguments and of their tensors.
    let mut starts: HashMap<Lane, Vec<(f64, Option<usize>)>> = HashMap::new();
    for i in (0..k.events.len()).filter(|&i| is_cpu_event(k, i)) {
        let e = &k.events[i];
        // Without record function ids (a profile taken without the observer), what the
        // profiler itself recorded: the tensors among the event's `Input Dims`.
        let args = match e.record_function_id {
            Some(id) => with_args.get(&id).copied(),
            None => match e.input_tensors {
                Some(n) => (n > 0).then_some(n as usize),
                // Without shapes, a backward node is still the event its `evaluate_function`
                // wrapper names, charged as a node without tensors. (With shapes, an event
                // without them records none.)
                None => nodes.contains(k.strings.get(e.name)).then_some(0),
            },
        };
        starts.entry(e.tid).or_default().push((e.ts, args));
    }
    type Counts = (Vec<f64>, Vec<(usize, usize)>);
    let starts: HashMap<Lane, Counts> = starts
        .into_iter()
        .map(|(lane, mut v)| {
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
            let mut heavy = Vec::with_capacity(v.len() + 1);
            heavy.push((0, 0));
            for (_, a) in &v {
                let (n, tensors) = heavy.last().copied().unwrap_or((0, 0));
                heavy.push(match a {
                    Some(k) => (n + 1, tensors + k),
                    None => (n, tensors),
                });
            }
            (lane, (v.into_iter().map(|x| x.0).collect(), heavy))
        })
        .collect();
    // Events starting in [a, b) (b inclusive with `upto`) as (without arguments, with, the
    // latter's tensors); none when the interval is empty (two linked ops that overlap, from
    // different threads).
    let count_in = |lane: &Lane, a: f64, b: f64, upto: bool| -> (usize, usize, usize) {
        let Some((v, heavy)) = starts.get(lane) else {
            return (0, 0, 0);
        };
        if a.is_nan() || b.is_nan() || b <= a {
            return (0, 0, 0);
        }
        let hi = if upto {
            v.partition_point(|&x| x <= b)
        } else {
            v.partition_point(|&x| x < b)
        };
        let lo = v.partition_point(|&x| x < a).min(hi);
        let with = heavy[hi].0 - heavy[lo].0;
        (hi - lo - with, with, heavy[hi].1 - heavy[lo].1)
    };
    // Speed and per-event cost over the ops found in both profiles, as ratios of sums: the
    // instrumentation's cost is heavy-tailed (an op recording large tensor lists costs a
    // hundred times a small one), and a capture's slow tail (a colder first iteration, page
    // faults) is the capture's, which its gaps share; per-op medians would miss it. Time
    // slices a busy capture host lost are taken out below.
    let (mut window_sum, mut original_sum, mut excess_sum, mut events_sum) = (0.0, 0.0, 0.0, 0.0);
    let mut speed_ops = 0;
    let mut plain_sum = 0.0;
    // (replay window, capture duration) of each op found in both, and its position.
    let mut pairs: Vec<(f64, f64)> = Vec::new();
    let mut pair_pos: Vec<usize> = Vec::new();
    // Each pair's plain (uninstrumented) time: the sum of those over the capture's is the
    // host's speed without the instrumentation (`plain_speed`, reported).
    let mut pair_plain: Vec<f64> = Vec::new();
    for (pos, e) in l.event_of.iter().enumerate() {
        let (Some(_), Some(Some((a, b, nested)))) = (e, r.profiled.get(pos)) else {
            continue;
        };
        let window = b - a;
        let Some(original) = orig.op_us.get(pos).copied().flatten() else {
            continue;
        };
        let Some(&plain) = r.plain_us.get(pos) else {
            continue;
        };
        // A step that failed was never timed (plain 0); an op that launched GPU work in the
        // original has a launch for its CPU window there, not the work the replay's window
        // may hold (a GPU trace replayed on CPU, or a CUDA op that synchronises).
        let launched = l.gpu_events.get(pos).is_some_and(|g| !g.is_empty());
        if !(window.is_finite() && original.is_finite() && plain.is_finite())
            || window <= 0.0
            || plain <= 0.0
            || launched
        {
            continue;
        }
        speed_ops += 1;
        pairs.push((window, original.max(0.0)));
        pair_pos.push(pos);
        pair_plain.push(plain);
        window_sum += window;
        original_sum += original.max(0.0);
        excess_sum += window - plain;
        plain_sum += plain;
        events_sum += *nested as f64 + 1.0;
    }
    // The instrumented replay's gaps: from one found step's end to the next found step's start,
    // where the two are consecutive.
    let (mut boundary_sum, mut boundaries) = (0.0, 0usize);
    for w in r.profiled.windows(2) {
        if let [Some((_, end, _)), Some((start, _, _))] = w {
            let g = start - end - r.between_us;
            if g.is_finite() {
                boundary_sum += g.max(0.0);
                boundaries += 1;
            }
        }
    }
    // Time slices the capture lost inside ops: what the ops' typical speed (the window-weighted
    // median ratio, which a few slices do not move) cannot explain, when at least a slice long.
    // Those ops leave the speed's sums: it is a ratio of sums over the other ops.
    let mut slices: Vec<f64> = Vec::new();
    let mut sliced = vec![false; pairs.len()];
    if let Some(c) = weighted_median_speed(&pairs).filter(|&c| speed_ops >= 3 && c > 0.0) {
        for (k, &(w, o)) in pairs.iter().enumerate() {
            let lost = o - w / c;
            if lost >= SLICE_MIN_US {
                slices.push(lost);
                sliced[k] = true;
                window_sum -= w;
                original_sum -= o;
                plain_sum -= pair_plain[k];
            }
        }
    }
    let plain_speed = if speed_ops >= 3 && original_sum > 0.0 {
        plain_sum / original_sum
    } else {
        f64::NAN
    };
    let (speed, per_event_us, replay_boundary_us) = if speed_ops >= 3 && original_sum > 0.0 {
        (
            window_sum / original_sum,
            (excess_sum / events_sum).max(0.0),
            if boundaries > 0 {
                boundary_sum / boundaries as f64
            } else {
                0.0
            },
        )
    } else {
        (1.0, 0.0, 0.0)
    };
    // A probed cost counts where it was timed (finite, not negative) and the replay has a
    // profile to set it against.
    let probed = |c: Option<f64>| c.filter(|e| speed_ops >= 3 && e.is_finite() && *e >= 0.0);
    let per_boundary_us = probed(r.op_event_us).unwrap_or(replay_boundary_us);
    let per_node_us = probed(r.node_us);
    let per_gap_event_us = probed(r.event_us).unwrap_or(per_event_us);
    // Events that record arguments (autograd's backward nodes) at their probed cost with their
    // tensor count, where probed (else the replay's mean cost per op event).
    let backward = r.backward_event_us.filter(|(a, b)| {
        speed_ops >= 3 && a.is_finite() && b.is_finite() && *a >= 0.0 && *b >= 0.0
    });
    // The shortest slice lost says how long a lost slice is on the capture host.
    let shortest_slice_us = slices.iter().copied().reduce(f64::min);
    let median_gap = {
        let mut v: Vec<f64> = l
            .event_of
            .iter()
            .zip(&orig.gap_us)
            .filter(|(e, g)| e.is_some() && g.is_finite())
            .map(|(_, &g)| g)
            .collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    let mut slices_in_gaps = 0;
    let last_end = l
        .event_of
        .iter()
        .flatten()
        .map(|&e| k.events[e as usize].ts + k.events[e as usize].dur)
        .fold(f64::NEG_INFINITY, f64::max);
    let mut prev_end: Option<f64> = None;
    let mut events_in_gaps = 0;
    let mut events_with_args = 0;
    let mut tensors_in_gap_events = 0;
    // Each gap's own estimate (clipped at 0) gives the shape; the total is the sum of the
    // unclipped estimates, so clipping the gaps that come out negative does not bias it up.
    let mut total = 0.0;
    // A capture that lost time slices ran on a shared CPU, whose share moved over the capture:
    // each gap is put on this host by the speed of the ops around it (`local_speed`).
    let shared_cpu = !slices.is_empty() && speed_ops >= 3;
    let mut gaps: Vec<f64> = l
        .event_of
        .iter()
        .zip(&orig.gap_us)
        .enumerate()
        .map(|(pos, (e, &g))| {
            let Some(e) = e else { return 0.0 };
            let speed = if shared_cpu {
                local_speed(&pairs, &pair_pos, &sliced, pos).unwrap_or(speed)
            } else {
                speed
            };
            let ev = &k.events[*e as usize];
            // Events of this op's thread that start inside the gap (before the op's start).
            let (light, heavy, tensors) = match (prev_end, l.span) {
                (Some(p), _) => count_in(&ev.tid, p, ev.ts, false),
                // The first op's gap: the iteration's time before it and after the last op.
                (None, Some((a, b))) => {
                    let (l1, h1, t1) = count_in(&ev.tid, a, ev.ts, false);
                    let (l2, h2, t2) = count_in(&ev.tid, last_end, b, true);
                    (l1 + l2, h1 + h2, t1 + t2)
                }
                (None, None) => (0, 0, 0),
            };
            events_in_gaps += light + heavy;
            events_with_args += heavy;
            tensors_in_gap_events += tensors;
            prev_end = Some(prev_end.map_or(ev.ts + ev.dur, |p: f64| p.max(ev.ts + ev.dur)));
            // A gap as long as a slice the capture demonstrably lost in an op is taken to hold
            // one: only the capture's median gap of it is the model's. Unless, put on this host
            // by the ops around it, it is shorter than any slice: then the whole stretch ran
            // slow, gap and ops alike (mlp_sgd's busy capture: its optimizer's first gap 786 µs
            // among ops 3-16x their quiet times, 154 µs when captured quiet), and its speed
            // says so; replaced by the median, such gaps had taken a third to a half of the
            // emulated time off three of the tuning set's busy captures.
            let g = match shortest_slice_us {
                Some(sl) if g >= sl && speed * g >= SLICE_MIN_US => {
                    slices_in_gaps += 1;
                    median_gap.min(g)
                }
                _ => g,
            };
            // A backward node's cost covers its `evaluate_function` wrapper too: one
            // argument-less event per node is in it.
            let (light, heavy_cost) = match (per_node_us, backward) {
                (Some(node), b) => (
                    light.saturating_sub(heavy),
                    node * heavy as f64 + b.map_or(0.0, |(_, t)| t * tensors as f64),
                ),
                (None, Some((per, per_tensor))) => {
                    (light, per * heavy as f64 + per_tensor * tensors as f64)
                }
                (None, None) => (light, per_event_us * heavy as f64),
            };
            let estimate =
                speed * g - per_boundary_us - per_gap_event_us * light as f64 - heavy_cost;
            total += estimate;
            estimate.max(0.0)
        })
        .collect();
    let clipped: f64 = gaps.iter().sum();
    let scale = if clipped > 0.0 {
        total.max(0.0) / clipped
    } else {
        0.0
    };
    for g in gaps.iter_mut() {
        *g *= scale;
    }
    let capped = cap_gaps(&mut gaps, orig);
    GapModel {
        instrumentation: Instrumentation::of(k),
        capture_gaps_ms: orig.gap_us.iter().sum::<f64>() / 1e3,
        emulated_ms: gaps.iter().sum::<f64>() / 1e3,
        capture_iterations: orig.iterations.len().max(1),
        gaps_us: gaps,
        speed,
        plain_speed,
        speed_ops,
        per_event_us,
        per_boundary_us,
        replay_boundary_us,
        per_node_us,
        events_in_gaps,
        events_with_args,
        per_gap_event_us,
        per_backward_event_us: backward,
        tensors_in_gap_events,
        capped,
        slices_in_ops: slices.len(),
        shortest_slice_us,
        slices_in_gaps,
        local_speed: shared_cpu,
        calibrations_ms: Vec::new(),
        base_step_us: r.plain_us.to_vec(),
        anchored: None,
        time_base: None,
        ops_between_gaps: None,
    }
}

/// The names of the backward nodes autograd's engine ran in `k`: each node's event comes with
/// an `evaluate_function` wrapper that names it (`autograd::engine::evaluate_function:
/// AddmmBackward0` around `AddmmBackward0`, and around `torch::autograd::AccumulateGrad`, which
/// carries no `Fwd thread id`).
fn backward_node_names(k: &KinetoTrace) -> HashSet<&str> {
    const WRAPPER: &str = "autograd::engine::evaluate_function: ";
    k.events
        .iter()
        .filter_map(|e| k.strings.get(e.name).strip_prefix(WRAPPER))
        .collect()
}

/// The capture's speed around the gap before position `pos`: the replay's windows over the
/// capture's durations, summed over the ops found in both nearest to it on either side (taken
/// in turn, nearest first) until they hold a time slice ([`SLICE_MIN_US`]) of the capture's
/// time, ops that lost a slice left out. A busy capture host shares its CPU with other work,
/// and the share moves over the capture (the zoo's busy DLRM capture: its backward's ops and the
/// gaps between them up to 10x their quiet times, its forward's about 1.3x), so a gap slowed in
/// such a stretch is put on this host's speed by the ops around it rather than by the whole
/// iteration's. `None` without such ops.
fn local_speed(pairs: &[(f64, f64)], pos_of: &[usize], sliced: &[bool], pos: usize) -> Option<f64> {
    let k = pos_of.partition_point(|&p| p < pos);
    let (mut left, mut right) = (k, k);
    let (mut w, mut o) = (0.0, 0.0);
    let mut take_left = true;
    while o < SLICE_MIN_US && (left > 0 || right < pairs.len()) {
        let next = if (take_left && left > 0) || right >= pairs.len() {
            left -= 1;
            left
        } else {
            right += 1;
            right - 1
        };
        take_left = !take_left;
        if !sliced[next] {
            w += pairs[next].0;
            o += pairs[next].1;
        }
    }
    (o > 0.0 && w > 0.0).then(|| w / o)
}

/// The median of `window / original` over `(window, original)` pairs, weighted by the window
/// (the replay's time is the reference: a long op counts for more than a short one); `None`
/// without pairs of positive weight.
fn weighted_median_speed(pairs: &[(f64, f64)]) -> Option<f64> {
    let mut v: Vec<(f64, f64)> = pairs
        .iter()
        .filter(|(w, o)| *w > 0.0 && *o > 0.0 && w.is_finite() && o.is_finite())
        .map(|&(w, o)| (w / o, w))
        .collect();
    weighted_median(&mut v)
}

/// The median of `(value, weight)` pairs by weight (sorts them by value); `None` without
/// positive total weight.
pub fn weighted_median(v: &mut [(f64, f64)]) -> Option<f64> {
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total: f64 = v.iter().map(|&(_, w)| w).sum();
    if total <= 0.0 {
        return None;
    }
    let mut acc = 0.0;
    for &(x, w) in v.iter() {
        acc += w;
        if acc >= total / 2.0 {
            return Some(x);
        }
    }
    v.last().map(|&(x, _)| x)
}

/// Caps gaps no iteration of this model can have: each at ten times the original's total op
/// time (at least 10 ms). A Kineto event shifted by 1000 s would otherwise have the replay spin
/// for hours per iteration. Returns how many were capped.
pub fn cap_gaps(gaps: &mut [f64], orig: &OriginalTiming) -> usize {
    let ops_us: f64 = orig.op_us.iter().flatten().filter(|d| d.is_finite()).sum();
    let cap = (10.0 * ops_us).max(10_000.0);
    let mut n = 0;
    for g in gaps.iter_mut() {
        if !g.is_finite() || *g > cap {
            *g = if g.is_finite() { cap } else { 0.0 };
            n += 1;
        }
    }
    n
}

/// One op name in a comparison of a replay with its original: per iteration, over its linked
/// calls (µs).
#[derive(Clone, Debug, PartialEq)]
pub struct OpComparison {
    pub op: String,
    pub calls: usize,
    /// The original's Kineto time.
    pub original_us: f64,
    /// The plain replay's time.
    pub replay_us: f64,
    /// The replay under the capture's instrumentation, when every call of the name was found
    /// in its profile: like for like with `original_us`.
    pub profiled_us: Option<f64>,
}

impl OpComparison {
    /// Replay minus original, like for like where the profiled replay exists.
    pub fn difference(&self) -> f64 {
        self.profiled_us.unwrap_or(self.replay_us) - self.original_us
    }
}

/// A replay compared with its original, op by op.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Comparison {
    /// Per op name, largest difference first.
    pub ops: Vec<OpComparison>,
    /// Linked ops found in the instrumented replay's profile, and their totals (ms): the
    /// profiled replay and the original over those same ops.
    pub profiled_ops: usize,
    pub profiled_ms: f64,
    pub profiled_original_ms: f64,
}

/// Compares a replay with its original per op name: `names[k]`, `replay_us[k]` (plain replay)
/// and `profiled_us[k]` (the instrumented replay's window, if found) for each replay-set op
/// `k`; only ops linked to the original count.
pub fn compare_ops(
    orig: &OriginalTiming,
    names: &[&str],
    replay_us: &[f64],
    profiled_us: &[Option<f64>],
) -> Comparison {
    let mut by: BTreeMap<&str, (usize, f64, f64, Option<f64>)> = BTreeMap::new();
    let mut c = Comparison::default();
    for (k, name) in names.iter().enumerate() {
        let Some(o) = orig.op_us.get(k).copied().flatten() else {
            continue;
        };
        let e = by.entry(name).or_insert((0, 0.0, 0.0, Some(0.0)));
        e.0 += 1;
        e.1 += o;
        e.2 += replay_us.get(k).copied().unwrap_or(0.0);
        let prof = profiled_us.get(k).copied().flatten();
        e.3 = e.3.zip(prof).map(|(acc, p)| acc + p);
        if let Some(p) = prof {
            c.profiled_ms += p / 1000.0;
            c.profiled_original_ms += o / 1000.0;
            c.profiled_ops += 1;
        }
    }
    c.ops = by
        .into_iter()
        .map(
            |(op, (calls, original_us, replay_us, profiled_us))| OpComparison {
                op: op.to_string(),
                calls,
                original_us,
                replay_us,
                profiled_us,
            },
        )
        .collect();
    c.ops
        .sort_by(|x, y| y.difference().abs().total_cmp(&x.difference().abs()));
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(gaps: &[f64], base: &[f64]) -> GapModel {
        GapModel {
            gaps_us: gaps.to_vec(),
            emulated_ms: gaps.iter().sum::<f64>() / 1e3,
            base_step_us: base.to_vec(),
            ..Default::default()
        }
    }

    /// What the executor spins over an iteration for `gaps` (each from the end of the op
    /// before, `between` of bookkeeping inside it), ops included.
    /// As the executor spins `m`'s gaps with `between` µs of bookkeeping before each op: the
    /// bookkeeping counts toward the gaps, and what outlasts one gap the later ones give back.
    fn iteration_us(m: &GapModel, between: f64) -> f64 {
        let n = m.gaps_us.len() as f64;
        m.base_step_us.iter().sum::<f64>() + m.gaps_us.iter().sum::<f64>().max(between * n)
    }

    #[test]
    fn an_anchored_replay_takes_the_references_original_on_this_hosts_speed() {
        // Ops 100 µs here; at the reference 200 µs of ops in a 220 µs plain replay (20 µs of
        // bookkeeping over 4 steps) beside a 500 µs original: this host is twice as fast, so
        // the replay takes 250 µs, its gaps shaped 1:3 as the profile's.
        let mut m = model(&[0.0, 10.0, 0.0, 30.0], &[25.0; 4]);
        let r = Reference {
            original_ms: 0.5,
            replay_ms: 0.22,
            replay_op_ms: 0.2,
        };
        anchor(&mut m, r);
        let a = m.anchored.clone().expect("anchored");
        assert!((a.host_ratio - 0.5).abs() < 1e-12);
        assert!((a.target_ms - 0.25).abs() < 1e-12);
        assert!((a.profiled_ms - 0.04).abs() < 1e-12);
        // 2.5 µs of bookkeeping a step here.
        assert!((iteration_us(&m, 2.5) - 250.0).abs() < 1e-6, "{m:?}");
        assert!((m.gaps_us[3] / m.gaps_us[1] - 3.0).abs() < 1e-9);
        assert_eq!((m.gaps_us[0], m.gaps_us[2]), (0.0, 0.0));
        assert!((m.emulated_ms - m.gaps_us.iter().sum::<f64>() / 1e3).abs() < 1e-12);
    }

    #[test]
    fn a_base_with_the_gaps_in_place_replaces_the_plain_one_and_moves_the_anchor() {
        // Ops 25 µs each back to back, 30 between the gaps (a busy host's cache): the anchor's
        // host ratio and target follow the ops as the replay will run them.
        let mut m = model(&[0.0, 10.0, 0.0, 30.0], &[25.0; 4]);
        // The third step failed in the run with the gaps: it keeps its plain time.
        assert!(m.rebase(&[30.0, 30.0, f64::NAN, 30.0], 7));
        assert_eq!(m.base_step_us, vec![30.0, 30.0, 25.0, 30.0]);
        let b = m.time_base.expect("a time base");
        assert!((b.plain_ms - 0.1).abs() < 1e-12 && (b.with_gaps_ms - 0.115).abs() < 1e-12);
        assert_eq!(b.iterations, 7);
        let r = Reference {
            original_ms: 0.5,
            replay_ms: 0.2,
            replay_op_ms: 0.2,
        };
        anchor(&mut m, r);
        let a = m.anchored.clone().expect("anchored");
        assert!((a.replay_op_ms - 0.115).abs() < 1e-12);
        assert!((a.target_ms - 0.5 * 0.115 / 0.2).abs() < 1e-12);
        assert!((iteration_us(&m, 0.0) - 287.5).abs() < 1e-6, "{m:?}");
    }

    #[test]
    fn the_ops_slowdown_between_gaps_is_the_ratio_of_the_steps_medians() {
        // Three steps 10% slower between the gaps; the fourth failed in the plain iterations
        // (NaN) and is left out of both sums.
        let m = OpsBetweenGaps::of(
            &[11.0, 22.0, 110.0, 50.0],
            &[10.0, 20.0, 100.0, f64::NAN],
            8,
        )
        .expect("timed");
        assert!((m.factor - 1.1).abs() < 1e-12, "{m:?}");
        assert_eq!(m.iterations, 8);
        // Nothing timed in both, or a ratio out of bounds: no measurement.
        assert!(OpsBetweenGaps::of(&[1.0, f64::NAN], &[f64::NAN, 1.0], 8).is_none());
        assert!(OpsBetweenGaps::of(&[0.0], &[0.0], 8).is_none());
        assert!(OpsBetweenGaps::of(&[3.0, 3.0], &[1.0, 1.0], 8).is_none());
    }

    #[test]
    fn an_anchor_sets_the_host_by_the_ops_back_to_back_and_fills_the_target_between_gaps() {
        // Back to back the ops take 100 µs here, as at the reference (host ratio 1); between
        // the gaps 110. The replay takes the reference's original, 500 µs: 390 µs of gaps,
        // not 450 (its ops' cooling is in the original's time already) nor 550 (the cooling
        // taken for a slower host).
        let mut m = model(&[0.0, 10.0, 0.0, 30.0], &[25.0; 4]);
        m.set_ops_between_gaps(OpsBetweenGaps {
            factor: 1.1,
            iterations: 9,
        });
        assert!((m.base_op_us() - 110.0).abs() < 1e-9);
        assert!((m.plain_op_us() - 100.0).abs() < 1e-9);
        let r = Reference {
            original_ms: 0.5,
            replay_ms: 0.1,
            replay_op_ms: 0.1,
        };
        anchor(&mut m, r);
        let a = m.anchored.clone().expect("anchored");
        assert!((a.host_ratio - 1.0).abs() < 1e-12, "{a:?}");
        assert!((a.replay_op_ms - 0.1).abs() < 1e-12);
        assert!((a.target_ms - 0.5).abs() < 1e-12);
        assert!((iteration_us(&m, 0.0) - 500.0).abs() < 1e-6, "{m:?}");
        assert!((m.emulated_ms - 0.39).abs() < 1e-9);
        // Set again: from the plain base, not on top of the first factor.
        m.set_ops_between_gaps(OpsBetweenGaps {
            factor: 1.2,
            iterations: 9,
        });
        assert!((m.base_op_us() - 120.0).abs() < 1e-9);
    }

    #[test]
    fn a_base_that_does_not_fit_the_steps_or_holds_no_time_is_refused() {
        let mut m = model(&[1.0, 2.0], &[10.0, 10.0]);
        assert!(!m.rebase(&[10.0], 5));
        let mut zero = model(&[1.0, 2.0], &[0.0, 0.0]);
        assert!(!zero.rebase(&[f64::NAN, -1.0], 5));
        for m in [&m, &zero] {
            assert!(m.time_base.is_none());
        }
        assert_eq!(m.base_step_us, vec![10.0, 10.0]);
    }

    #[test]
    fn an_anchored_model_spins_nothing_where_the_plain_replay_is_already_as_slow() {
        // The original took no longer than the plain replay at the reference.
        let mut m = model(&[5.0, 5.0], &[50.0, 50.0]);
        let r = Reference {
            original_ms: 0.1,
            replay_ms: 0.11,
            replay_op_ms: 0.1,
        };
        anchor(&mut m, r);
        assert_eq!(m.anchored.as_ref().map(|a| a.scale), Some(0.0));
        assert_eq!(m.gaps_us, vec![0.0, 0.0]);
        assert_eq!(m.emulated_ms, 0.0);
    }

    #[test]
    fn an_anchored_model_without_profiled_gaps_spreads_its_time_evenly() {
        let mut m = model(&[0.0, 0.0, 0.0], &[10.0; 3]);
        let r = Reference {
            original_ms: 0.06,
            replay_ms: 0.03,
            replay_op_ms: 0.03,
        };
        anchor(&mut m, r);
        assert_eq!(m.gaps_us, vec![10.0, 10.0, 10.0]);
    }

    #[test]
    fn a_reference_that_is_not_a_time_leaves_the_profiles_gaps() {
        for r in [
            Reference {
                original_ms: f64::NAN,
                replay_ms: 0.2,
                replay_op_ms: 0.1,
            },
            Reference {
                original_ms: 1.0,
                replay_ms: 0.2,
                replay_op_ms: 0.0,
            },
            // More in ops than in the whole iteration.
            Reference {
                original_ms: 1.0,
                replay_ms: 0.1,
                replay_op_ms: 0.2,
            },
        ] {
            let mut m = model(&[5.0, 7.0], &[10.0, 10.0]);
            anchor(&mut m, r);
            assert!(m.anchored.is_none());
            assert_eq!(m.gaps_us, vec![5.0, 7.0]);
        }
    }

    #[test]
    fn least_skips_what_is_not_finite() {
        assert_eq!(least([]), None);
        assert_eq!(least([f64::NAN]), None);
        assert_eq!(least([4.0]), Some(4.0));
        // A cold first iteration's 90 and a stall's infinity do not count.
        assert_eq!(least([90.0, 1.0, f64::INFINITY, 2.0]), Some(1.0));
    }

    #[test]
    fn implausible_gaps_are_capped() {
        let orig = OriginalTiming {
            op_us: vec![Some(1000.0), Some(2000.0), None],
            gap_us: vec![0.0; 3],
            span_us: 0.0,
            iterations: vec![],
        };
        // 10 x 3 ms of ops = 30 ms cap.
        let mut gaps = vec![5.0, 1e9, f64::NAN];
        assert_eq!(cap_gaps(&mut gaps, &orig), 2);
        assert_eq!(gaps, vec![5.0, 30_000.0, 0.0]);
    }

    #[test]
    fn comparison_counts_linked_ops_and_sorts_by_difference() {
        let orig = OriginalTiming {
            op_us: vec![Some(10.0), Some(100.0), None, Some(12.0)],
            gap_us: vec![0.0; 4],
            span_us: 200.0,
            iterations: vec![],
        };
        let c = compare_ops(
            &orig,
            &["a", "b", "b", "a"],
            &[11.0, 150.0, 7.0, 13.0],
            &[Some(12.0), None, None, Some(14.0)],
        );
        // b: one linked call, no profile, +50; a: two calls, profiled 26 vs 22, +4.
        assert_eq!(c.ops.len(), 2);
        assert_eq!(c.ops[0].op, "b");
        assert_eq!((c.ops[0].calls, c.ops[0].profiled_us), (1, None));
        assert_eq!(c.ops[1].op, "a");
        assert_eq!(c.ops[1].calls, 2);
        assert_eq!(c.ops[1].profiled_us, Some(26.0));
        assert_eq!(c.ops[1].replay_us, 24.0);
        assert_eq!(c.profiled_ops, 2);
        assert!((c.profiled_ms - 0.026).abs() < 1e-12);
        assert!((c.profiled_original_ms - 0.022).abs() < 1e-12);
    }
}
