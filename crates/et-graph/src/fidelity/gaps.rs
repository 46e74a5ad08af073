//! The gap model: the time outside operators to emulate before each op, from the capture's
//! gaps, this host's speed and what the instrumentation costs here.

use super::model::{GapModel, Instrumentation, ReplayTimes, MIN_SPEED_OPS};
use super::timing::OriginalTiming;
use crate::link::{is_cpu_event, Link};
use et_schema::kineto::{Event, KinetoTrace, Lane};
use std::collections::{HashMap, HashSet};

/// The least time a descheduled process loses (µs): Linux's minimum scheduling granularity is
/// 0.75 ms and up, so an op that ran longer than predicted by this much or more lost a time
/// slice to another process, rather than running slower. A property of the OS, not of a model.
pub const SLICE_MIN_US: f64 = 500.0;

/// The time outside operators to emulate before each op, as a formula of quantities measured
/// in this run (no fitted constants). For the gap before op `i`:
///
/// ```text
/// e_i   = speed * g_i - per_boundary - per_gap_event * n_i
///         - (per_backward_event * m_i + per_tensor * t_i)
/// gap_i = max(0, e_i) * sum(e) / sum(max(0, e))
/// ```
///
/// * `g_i`: the capture's (instrumented) gap before op `i`.
/// * `speed` puts it on this host under the same instrumentation: the replay's profiled op
///   windows over the original's, summed over the ops found in both that ran and launched no
///   GPU work, so a capture on a busy or slower host counts for what it is. For a capture that
///   lost time slices, the same ratio over the ops around the gap (`local_speed`), as such a
///   host's share of the CPU moved while it ran.
/// * `per_boundary`: what the instrumentation adds to an op called as Python calls one
///   (probed), less the part of that inside the op's profiled window; or unprobed, the
///   instrumented replay's own time between two ops, beyond its plain bookkeeping.
/// * `per_gap_event`: the probed cost of an event without arguments, for each of the `n_i`
///   events inside the gap that record none (annotations, autograd's `evaluate_function`
///   wrappers).
/// * `per_backward_event`, `per_tensor`: for the `m_i` events whose ET node records arguments
///   (autograd's `XBackward0` nodes, `t_i` tensors in all), the probed cost of such an event
///   and of each tensor; where not probed, `per_event` per event (the replay's mean cost per
///   op event, which ops recording many arguments make 3-4 times an autograd node's). Where
///   autograd's engine was probed (`node_us`), each such node and its argument-less wrapper
///   are charged the engine's cost per node instead: `per_gap_event * (n_i - m_i) + per_node *
///   m_i + per_tensor * t_i`.
///
/// The estimates are clipped at 0 and rescaled to add up to the unclipped total, so that what
/// the whole iteration emulates is not biased up by the gaps whose estimate is negative. Where
/// the replay has no profile (fewer than 3 ops found), `speed` is 1 and the costs are 0: the
/// capture's gaps are taken as they are, and the model says so by `speed_ops`.
pub fn gap_model(
    t: &et_schema::Trace,
    l: &Link,
    k: &KinetoTrace,
    orig: &OriginalTiming,
    r: &ReplayTimes,
) -> GapModel {
    let events = GapEvents::new(t, k);
    let mut ops = OpPairs::measure(l, orig, r);
    ops.take_out_slices();
    let costs = Costs::of(&ops, r, Instrumentation::of(k).execution_trace);
    let mut est = estimate_gaps(l, k, orig, &events, &ops, &costs);
    rescale_to_total(&mut est.gaps, est.total);
    let capped = cap_gaps(&mut est.gaps, orig);
    GapModel {
        instrumentation: Instrumentation::of(k),
        capture_gaps_ms: orig.gap_us.iter().sum::<f64>() / 1e3,
        emulated_ms: est.gaps.iter().sum::<f64>() / 1e3,
        capture_iterations: orig.iterations.len().max(1),
        gaps_us: est.gaps,
        speed: costs.speed,
        plain_speed: costs.plain_speed,
        speed_ops: ops.found(),
        per_event_us: costs.per_event_us,
        // With each op's call probed, the mean charge.
        per_boundary_us: match (&costs.calls, est.boundaries) {
            (Some(_), n) if n > 0 => est.boundary_sum / n as f64,
            _ => costs.per_boundary_us,
        },
        boundaries: est.boundaries,
        call_probed: est.call_probed,
        boxing_us: costs.calls.as_ref().map(|c| c.boxing),
        edge_us: est.edge,
        op_in_window_us: costs.op_in_window_us,
        replay_boundary_us: costs.replay_boundary_us,
        per_node_us: costs.per_node_us,
        events_in_gaps: est.events_in_gaps,
        events_with_args: est.events_with_args,
        per_gap_event_us: costs.per_gap_event_us,
        per_backward_event_us: costs.backward,
        tensors_in_gap_events: est.tensors_in_gap_events,
        capped,
        slices_in_ops: ops.slices.len(),
        shortest_slice_us: ops.shortest_slice(),
        slices_in_gaps: est.slices_in_gaps,
        local_speed: ops.shared_cpu(),
        calibrations_ms: Vec::new(),
        base_step_us: r.plain_us.to_vec(),
        anchored: None,
        time_base: None,
        ops_between_gaps: None,
    }
}

/// Each thread's profiled CPU events, for counting those inside a gap (a gap is its thread's
/// time): their starts in order, with running counts of the events that record arguments and
/// of their tensors.
struct GapEvents {
    lanes: HashMap<Lane, LaneEvents>,
}

/// One thread's event starts in order, and before each (and after the last) the running count
/// of events with arguments and of their tensors.
type LaneEvents = (Vec<f64>, Vec<(usize, usize)>);

impl GapEvents {
    fn new(t: &et_schema::Trace, k: &KinetoTrace) -> GapEvents {
        let with_args = tensors_by_record_function(t);
        // A profile without `record_shapes` records no tensors: its backward nodes are told by
        // name (none are needed where the events' shapes say what they record).
        let nodes = if k.record_shapes {
            HashSet::new()
        } else {
            backward_node_names(k)
        };
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
        let lanes = starts
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
        GapEvents { lanes }
    }

    /// Events of `lane` starting in [a, b) (b inclusive with `upto`) as (without arguments,
    /// with, the latter's tensors); none when the interval is empty (two linked ops that
    /// overlap, from different threads).
    fn count_in(&self, lane: &Lane, a: f64, b: f64, upto: bool) -> (usize, usize, usize) {
        let Some((v, heavy)) = self.lanes.get(lane) else {
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
    }

    /// The events of op `ev`'s thread inside the gap before it: from the previous op's end
    /// (`prev_end`) to its start, or for the first op, the iteration's time (`span`) before it
    /// and after the last op (which ends at `last_end`).
    fn in_gap(
        &self,
        ev: &Event,
        prev_end: Option<f64>,
        span: Option<(f64, f64)>,
        last_end: f64,
    ) -> (usize, usize, usize) {
        match (prev_end, span) {
            (Some(p), _) => self.count_in(&ev.tid, p, ev.ts, false),
            (None, Some((a, b))) => {
                let (l1, h1, t1) = self.count_in(&ev.tid, a, ev.ts, false);
                let (l2, h2, t2) = self.count_in(&ev.tid, last_end, b, true);
                (l1 + l2, h1 + h2, t1 + t2)
            }
            (None, None) => (0, 0, 0),
        }
    }
}

/// Which events record arguments, by record function id, with how many tensors: the ET node
/// of the same id has inputs (an autograd `XBackward0` node records its tensors; its
/// `evaluate_function` wrapper, an annotation, nothing). Events the ET cannot name count as
/// argument-less.
fn tensors_by_record_function(t: &et_schema::Trace) -> HashMap<u64, usize> {
    t.nodes
        .iter()
        .filter(|n| !t.inputs(n).is_empty())
        .filter_map(|n| {
            let mut v = Vec::new();
            for a in t.inputs(n) {
                t.tensors_in(a.value, &mut v);
            }
            n.rf_id.map(|id| (id, v.len()))
        })
        .collect()
}

/// The ops found in both the capture and the replay's profile, and the sums that the speed and
/// the instrumentation's per-event cost are ratios of. Ratios of sums, not per-op medians: the
/// instrumentation's cost is heavy-tailed (an op recording large tensor lists costs a hundred
/// times a small one), and a capture's slow tail (a colder first iteration, page faults) is
/// the capture's, which its gaps share.
#[derive(Default)]
struct OpPairs {
    /// (replay window, capture duration) of each op found in both.
    pairs: Vec<(f64, f64)>,
    /// Each pair's position in the replay set.
    pos: Vec<usize>,
    /// Each pair's plain (uninstrumented) time: their sum over the capture's is the host's
    /// speed without the instrumentation (`plain_speed`, reported).
    plain: Vec<f64>,
    /// The pairs whose capture lost a time slice ([`OpPairs::take_out_slices`]).
    sliced: Vec<bool>,
    /// The time slices lost (µs).
    slices: Vec<f64>,
    window_sum: f64,
    original_sum: f64,
    excess_sum: f64,
    plain_sum: f64,
    events_sum: f64,
}

impl OpPairs {
    /// Pairs each op linked in the capture with its profiled window in the replay.
    fn measure(l: &Link, orig: &OriginalTiming, r: &ReplayTimes) -> OpPairs {
        let mut ops = OpPairs::default();
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
            ops.pairs.push((window, original.max(0.0)));
            ops.pos.push(pos);
            ops.plain.push(plain);
            ops.window_sum += window;
            ops.original_sum += original.max(0.0);
            ops.excess_sum += window - plain;
            ops.plain_sum += plain;
            ops.events_sum += *nested as f64 + 1.0;
        }
        ops.sliced = vec![false; ops.pairs.len()];
        ops
    }

    /// Ops found in both profiles.
    fn found(&self) -> usize {
        self.pairs.len()
    }

    /// Whether enough ops were found in both for the replay's profile to count
    /// ([`MIN_SPEED_OPS`]).
    fn enough(&self) -> bool {
        self.found() >= MIN_SPEED_OPS
    }

    /// Finds the time slices the capture lost inside ops: what the ops' typical speed (the
    /// window-weighted median ratio, which a few slices do not move) cannot explain, when at
    /// least a slice long. Those ops leave the sums: the speed is a ratio of sums over the
    /// other ops.
    fn take_out_slices(&mut self) {
        let Some(c) = weighted_median_speed(&self.pairs).filter(|&c| self.enough() && c > 0.0)
        else {
            return;
        };
        for (k, &(w, o)) in self.pairs.iter().enumerate() {
            let lost = o - w / c;
            if lost >= SLICE_MIN_US {
                self.slices.push(lost);
                self.sliced[k] = true;
                self.window_sum -= w;
                self.original_sum -= o;
                self.plain_sum -= self.plain[k];
            }
        }
    }

    /// The shortest slice lost: how long a lost slice is on the capture host.
    fn shortest_slice(&self) -> Option<f64> {
        self.slices.iter().copied().reduce(f64::min)
    }

    /// A capture that lost time slices ran on a shared CPU, whose share moved over the
    /// capture: each gap is then put on this host by the speed of the ops around it
    /// ([`local_speed`]).
    fn shared_cpu(&self) -> bool {
        !self.slices.is_empty() && self.enough()
    }
}

/// The terms of the gap formula measured on this host: its speed against the capture's and
/// what the instrumentation costs here.
struct Costs {
    speed: f64,
    plain_speed: f64,
    per_event_us: f64,
    replay_boundary_us: f64,
    per_boundary_us: f64,
    op_in_window_us: Option<f64>,
    per_node_us: Option<f64>,
    per_gap_event_us: f64,
    /// Events that record arguments (autograd's backward nodes) at their probed cost with
    /// their tensor count, where probed (else the replay's mean cost per op event).
    backward: Option<(f64, f64)>,
    /// Under the observer, with the calls probed: each boundary's charge is its own op's.
    calls: Option<CallCosts>,
    /// Under the observer, the charge of the iteration's edges (its first gap and its tail).
    edge: Option<f64>,
}

/// What the instrumentation adds outside each op's window, probed with the op's own call and
/// inputs ([`ReplayTimes::call_us`]), and the boxing of the inputs those probes leave out.
struct CallCosts {
    /// Per replay position, the probed cost where it was timed (finite, not negative).
    us: Vec<Option<f64>>,
    /// The mean of the probed ones: the charge of an op not probed.
    mean: f64,
    boxing: f64,
}

impl Costs {
    /// The speed and the costs from the ops found in both profiles, the instrumented replay's
    /// gaps and the probed costs. Without enough ops found, speed 1 and no costs.
    /// `observer`: the capture was taken under the execution trace observer.
    fn of(ops: &OpPairs, r: &ReplayTimes, observer: bool) -> Costs {
        let enough = ops.enough() && ops.original_sum > 0.0;
        let plain_speed = if enough {
            ops.plain_sum / ops.original_sum
        } else {
            f64::NAN
        };
        let (speed, per_event_us, replay_boundary_us) = if enough {
            (
                ops.window_sum / ops.original_sum,
                (ops.excess_sum / ops.events_sum).max(0.0),
                replay_boundary(r),
            )
        } else {
            (1.0, 0.0, 0.0)
        };
        // A probed cost counts where it was timed (finite, not negative) and the replay has a
        // profile to set it against.
        let probed = |c: Option<f64>| c.filter(|e| ops.enough() && e.is_finite() && *e >= 0.0);
        let backward = r.backward_event_us.filter(|(a, b)| {
            ops.enough() && a.is_finite() && b.is_finite() && *a >= 0.0 && *b >= 0.0
        });
        // Under the observer, of the probed op's cost only what falls outside its window is in
        // a gap: its exit callback runs before the profiler takes the op's end time. What is
        // outside, its entry callback recording the op's inputs, costs by the inputs: the
        // probe's add of two small tensors is the least of it, and the calibration replay's
        // own time between its steps holds it for the trace's own ops (less the boxing of
        // their arguments, which its boxed calls skip): the larger of the two. Under the
        // profiler alone the probe's whole cost, as the clean captures' held-out sets were
        // measured with (leaving its small part inside the window out moved fresh12's eight
        // models 1-6% longer, none closer).
        let op_in_window_us = probed(r.op_event_us)
            .and(probed(r.op_in_window_us))
            .filter(|_| observer);
        let per_boundary_us = match (probed(r.op_event_us), op_in_window_us) {
            (Some(op), Some(inside)) => (op - inside).max(0.0).max(replay_boundary_us),
            (Some(op), None) => op,
            (None, _) => replay_boundary_us,
        };
        // Under the observer, what its entry callback costs an op depends on the op's inputs
        // (the more inputs, the more): where each op's own call was probed with its inputs, its
        // boundary is charged that, and the boxing of the inputs the original's unboxed calls
        // paid (which the probes' boxed inputs leave out).
        let us: Vec<Option<f64>> = r
            .call_us
            .iter()
            .map(|c| c.filter(|c| c.is_finite() && *c >= 0.0))
            .collect();
        let probed_calls: Vec<f64> = us.iter().flatten().copied().collect();
        let calls = (observer && ops.enough() && probed_calls.len() >= 3).then(|| CallCosts {
            mean: probed_calls.iter().sum::<f64>() / probed_calls.len() as f64,
            us,
            boxing: probed(r.boxing_us).unwrap_or(0.0),
        });
        // Under the observer an iteration's edges cost several times a boundary (the capture's
        // first gap and tail held 25-65 µs of it on the zoo's small inference models, where a
        // boundary held 4-8 µs): the calibration's iterations, in the scope the profiler opens
        // around each, measure it. A profile taken without the observer is charged a boundary
        // there, as its held-out sets were measured with.
        let edge = r
            .edges_us
            .filter(|e| observer && ops.enough() && e.is_finite() && *e >= 0.0)
            .map(|e| (e - r.between_us).max(0.0));
        Costs {
            edge,
            speed,
            plain_speed,
            per_event_us,
            replay_boundary_us,
            per_boundary_us,
            op_in_window_us,
            per_node_us: probed(r.node_us),
            per_gap_event_us: probed(r.event_us).unwrap_or(per_event_us),
            backward,
            calls,
        }
    }

    /// The instrumentation's charge at the boundary before the op at replay position `pos`,
    /// and whether it was that op's own probed call.
    fn boundary(&self, pos: usize) -> (f64, bool) {
        match &self.calls {
            Some(c) => match c.us.get(pos).copied().flatten() {
                Some(us) => (us + c.boxing, true),
                None => (c.mean + c.boxing, false),
            },
            None => (self.per_boundary_us, false),
        }
    }

    /// The formula for one gap: `g` put on this host at `speed`, less the instrumentation's
    /// cost between two ops and that of the `light` argument-less events and the `heavy`
    /// events with arguments (recording `tensors` tensors) inside the gap.
    fn estimate(
        &self,
        speed: f64,
        g: f64,
        boundary: f64,
        (light, heavy, tensors): (usize, usize, usize),
    ) -> f64 {
        // A backward node's cost covers its `evaluate_function` wrapper too: one
        // argument-less event per node is in it.
        let (light, heavy_cost) = match (self.per_node_us, self.backward) {
            (Some(node), b) => (
                light.saturating_sub(heavy),
                node * heavy as f64 + b.map_or(0.0, |(_, t)| t * tensors as f64),
            ),
            (None, Some((per, per_tensor))) => {
                (light, per * heavy as f64 + per_tensor * tensors as f64)
            }
            (None, None) => (light, self.per_event_us * heavy as f64),
        };
        speed * g - boundary - self.per_gap_event_us * light as f64 - heavy_cost
    }
}

/// The mean of the instrumented replay's gaps (µs) less its plain bookkeeping between steps:
/// from one found step's end to the next found step's start, where the two are consecutive,
/// less the plain replay's own time before that step where it was timed (its bookkeeping
/// differs by step: a step that releases the autograd graph or makes copies before it takes
/// hundreds of µs there, plain or instrumented, which is no cost of the instrumentation), else
/// the mean bookkeeping. 0 without such a pair.
fn replay_boundary(r: &ReplayTimes) -> f64 {
    let (mut boundary_sum, mut boundaries) = (0.0, 0usize);
    for (k, w) in r.profiled.windows(2).enumerate() {
        if let [Some((_, end, _)), Some((start, _, _))] = w {
            let lead = r
                .plain_leads_us
                .get(k + 1)
                .copied()
                .filter(|l| l.is_finite())
                .unwrap_or(r.between_us);
            let g = start - end - lead;
            if g.is_finite() {
                boundary_sum += g.max(0.0);
                boundaries += 1;
            }
        }
    }
    if boundaries > 0 {
        boundary_sum / boundaries as f64
    } else {
        0.0
    }
}

/// Each gap's own estimate (clipped at 0), the sum of the unclipped ones, and what they
/// counted.
#[derive(Default)]
struct Estimates {
    gaps: Vec<f64>,
    total: f64,
    boundaries: usize,
    boundary_sum: f64,
    call_probed: usize,
    events_in_gaps: usize,
    events_with_args: usize,
    tensors_in_gap_events: usize,
    slices_in_gaps: usize,
    /// What the iteration's edges were charged ([`Costs::edge`]), where they were.
    edge: Option<f64>,
}

/// Estimates each gap by the formula ([`Costs::estimate`]), at the speed of the ops around it
/// where the capture ran on a shared CPU.
fn estimate_gaps(
    l: &Link,
    k: &KinetoTrace,
    orig: &OriginalTiming,
    events: &GapEvents,
    ops: &OpPairs,
    costs: &Costs,
) -> Estimates {
    let median_gap = median_gap(l, orig);
    let last_end = l
        .event_of
        .iter()
        .flatten()
        .map(|&e| k.events[e as usize].ts + k.events[e as usize].dur)
        .fold(f64::NEG_INFINITY, f64::max);
    let (shortest_slice_us, shared_cpu) = (ops.shortest_slice(), ops.shared_cpu());
    let mut est = Estimates::default();
    let mut prev_end: Option<f64> = None;
    for (pos, (e, &g)) in l.event_of.iter().zip(&orig.gap_us).enumerate() {
        let Some(e) = e else {
            est.gaps.push(0.0);
            continue;
        };
        let speed = if shared_cpu {
            local_speed(&ops.pairs, &ops.pos, &ops.sliced, pos).unwrap_or(costs.speed)
        } else {
            costs.speed
        };
        let ev = &k.events[*e as usize];
        // The gap before the first op holds the iteration's edges: its start and its tail
        // (`GapEvents::in_gap` counts the events of both).
        let edges = prev_end.is_none() && l.span.is_some();
        let (light, heavy, tensors) = events.in_gap(ev, prev_end, l.span, last_end);
        est.events_in_gaps += light + heavy;
        est.events_with_args += heavy;
        est.tensors_in_gap_events += tensors;
        prev_end = Some(prev_end.map_or(ev.ts + ev.dur, |p: f64| p.max(ev.ts + ev.dur)));
        // A gap as long as a slice the capture demonstrably lost in an op is taken to hold
        // one: only the capture's median gap of it is the model's. Unless, put on this host
        // by the ops around it, it is shorter than any slice: then the whole stretch ran
        // slow, gap and ops alike (a busy capture's optimizer step, its first gap several
        // times its quiet length among ops 3-16x their quiet times), and its speed says so.
        let g = match shortest_slice_us {
            Some(sl) if g >= sl && speed * g >= SLICE_MIN_US => {
                est.slices_in_gaps += 1;
                median_gap.min(g)
            }
            _ => g,
        };
        let (boundary, own) = match costs.edge.filter(|_| edges) {
            Some(edge) => {
                est.edge = Some(edge);
                (edge, false)
            }
            None => costs.boundary(pos),
        };
        let estimate = costs.estimate(speed, g, boundary, (light, heavy, tensors));
        est.boundaries += 1;
        est.boundary_sum += boundary;
        est.call_probed += usize::from(own);
        est.total += estimate;
        est.gaps.push(estimate.max(0.0));
    }
    est
}

/// The capture's median gap before a linked op (the upper median, unweighted).
fn median_gap(l: &Link, orig: &OriginalTiming) -> f64 {
    let mut v: Vec<f64> = l
        .event_of
        .iter()
        .zip(&orig.gap_us)
        .filter(|(e, g)| e.is_some() && g.is_finite())
        .map(|(_, &g)| g)
        .collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Scales the clipped estimates so that they add up to the unclipped `total` (nothing where
/// that is negative): what the whole iteration emulates is not biased up by the gaps whose
/// estimate is negative.
fn rescale_to_total(gaps: &mut [f64], total: f64) {
    let clipped: f64 = gaps.iter().sum();
    let scale = if clipped > 0.0 {
        total.max(0.0) / clipped
    } else {
        0.0
    };
    for g in gaps.iter_mut() {
        *g *= scale;
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
/// and the share moves over the capture (one stretch, its ops and the gaps between them, can run
/// up to 10x its quiet time while the rest runs near it), so a gap slowed in
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
