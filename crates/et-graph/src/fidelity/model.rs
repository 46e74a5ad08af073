//! The gap model's result ([`GapModel`]) and its inputs from the replay ([`ReplayTimes`],
//! [`Instrumentation`]).

use super::base::{Anchored, OpsBetweenGaps, TimeBase};
use et_schema::kineto::KinetoTrace;

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
    /// given, the cost charged at each boundary between two ops, less `op_in_window_us`.
    pub op_event_us: Option<f64>,
    /// Of `op_event_us`, the part inside the op's own profiled window (µs): the probe's window
    /// less its kernel called without the dispatcher. The observer's exit callback runs before
    /// the profiler takes an op's end time, so most of the observer's cost is in the op's
    /// window, which the capture's op durations hold (and `speed` sets against the replay's),
    /// not in the gap after it.
    pub op_in_window_us: Option<f64>,
    /// What it adds to autograd's engine per node it runs (µs), probed on this host with the
    /// engine itself: the cost of each backward node (its two events and the rest).
    pub node_us: Option<f64>,
    /// Per step, what the instrumentation adds to its call outside the call's profiled window
    /// (µs), probed with the step's own op and inputs (empty: not probed; `None`: that step
    /// not).
    pub call_us: &'a [Option<f64>],
    /// What boxing an op's inputs for the instrumentation costs a call made as Python makes
    /// one (µs), which `call_us` (probed with boxed inputs) leaves out.
    pub boxing_us: Option<f64>,
    /// An instrumented iteration's edges (µs): from the start of the `ProfilerStep#N` scope it
    /// ran in to its first op's window, and from its last op's window to the scope's end.
    pub edges_us: Option<f64>,
    /// Per step, the plain replay's time from the previous step's end to its start (µs; NaN or
    /// missing where not timed): what its own bookkeeping takes there, which the instrumented
    /// replay's gap before the step holds too. Empty: `between_us` at every step.
    pub plain_leads_us: &'a [f64],
}

/// The instrumentation a Kineto trace was taken under, as far as the trace shows: what the
/// calibration replay runs under to measure that instrumentation's cost on this host.
///
/// The execution trace observer records every op's arguments as it runs, and costs far more than
/// the profiler: a CPU model's iteration under both can take 3-20x its uninstrumented time, under
/// the profiler alone 1.1-2x. A linked pair (ET and Kineto of one iteration) carries the observer's
/// cost in every gap, and the model subtracts it; a profile taken without the observer, linked by
/// order to an ET captured in an iteration of its own, leaves far less to subtract.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Instrumentation {
    /// The execution trace observer was on.
    pub execution_trace: bool,
    /// The profiler recorded input shapes (`record_shapes`).
    pub record_shapes: bool,
    /// The profiler recorded every allocation and free (`profile_memory`): a memory event per
    /// allocation, much of it in the gaps, where Python and autograd allocate.
    pub profile_memory: bool,
}

impl Instrumentation {
    /// A linked ET + Kineto pair as `torch.profiler.profile(execution_trace_observer=...,
    /// record_shapes=True)` takes it.
    pub const LINKED: Instrumentation = Instrumentation {
        execution_trace: true,
        record_shapes: true,
        profile_memory: false,
    };

    /// What `k` was taken under: the observer unless the trace says it was off (a trace
    /// without the field, from PyTorch before 2.1, is taken for a linked pair), input shapes
    /// as the trace's flag (or its events) says, and memory where it holds memory events.
    pub fn of(k: &KinetoTrace) -> Instrumentation {
        Instrumentation {
            execution_trace: k.execution_trace_observer != Some(false),
            record_shapes: k.record_shapes,
            profile_memory: !k.memory.is_empty(),
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
        match (self.record_shapes, self.profile_memory) {
            (true, true) => f.write_str(" (record_shapes, profile_memory)")?,
            (true, false) => f.write_str(" (record_shapes)")?,
            (false, true) => f.write_str(" (profile_memory)")?,
            (false, false) => {}
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
    /// The capture's iterations the gaps and op times are typical of
    /// ([`typical_timing`](super::typical_timing)):
    /// 1 for a one-iteration capture, or where the trace's other iterations ran other ops.
    pub capture_iterations: usize,
    /// This host's speed relative to the capture's, both under the same instrumentation: the
    /// replay's profiled op windows over the original's Kineto durations, summed over the ops
    /// found in both, less those in which the capture lost a time slice (`slices_in_ops`).
    /// The replay's windows are in running time (the calibration takes out the time its thread
    /// waited for a CPU), and so are the gaps the executor spins: a busy replay host slows
    /// them as it slows the ops, not through this factor.
    /// Below 1: this host runs the ops faster than the capture did (a slower or busier
    /// capture host), so the capture's gaps shrink by the same factor. A busy host's capture
    /// loses whole time slices (milliseconds) in a few ops; left in the sums, they would make
    /// the capture host look several times slower than its other ops say.
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
    /// what it adds to an op called as the original calls ops, less the part of that inside the
    /// op's own window (`op_in_window_us`).
    pub per_boundary_us: f64,
    /// The gaps charged `per_boundary_us` each: one before every linked op.
    pub boundaries: usize,
    /// Of those, the boundaries charged the cost probed for their own op's call with its own
    /// inputs (`ReplayTimes::call_us`, under the observer), plus `boxing_us`;
    /// `per_boundary_us` is then the mean charge.
    pub call_probed: usize,
    /// The boxing of an op's inputs charged at each call-probed boundary (µs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boxing_us: Option<f64>,
    /// Under the observer, what the iteration's edges (its first gap and its tail, one gap of
    /// the model) are charged in place of a boundary (µs): the calibration's instrumented
    /// iterations' edges ([`ReplayTimes::edges_us`]) less the replay's bookkeeping there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub edge_us: Option<f64>,
    /// Of the probed op's cost, the part inside its profiled window, which `per_boundary_us`
    /// leaves out (µs; `None` where not probed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub op_in_window_us: Option<f64>,
    /// The mean of the instrumented replay's gaps less the plain replay's bookkeeping between
    /// steps (µs). More than the probed cost of an op's events: it also holds how much the
    /// instrumentation's records slow the work between two ops, as they slow the original's
    /// Python and autograd engine there.
    pub replay_boundary_us: f64,
    /// The cost charged per backward node in a gap (µs): what the instrumentation adds per node
    /// to autograd's engine running a graph of nodes, probed on this host with and without it
    /// (more than the node's two record-function scopes timed alone). It covers
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
    /// window-weighted median ratio) by [`SLICE_MIN_US`](super::SLICE_MIN_US) or more.
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
    /// Where the gaps' total was anchored on a [`Reference`](super::Reference)
    /// ([`anchor`](super::anchor)): what it came from.
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

/// The fewest ops found in both profiles that time this host against the capture: with fewer,
/// the calibration measures neither the speed nor the instrumentation's costs, and the gaps are
/// the capture's as they stand.
pub const MIN_SPEED_OPS: usize = 3;

impl GapModel {
    /// Whether the calibration measured this host against the capture ([`MIN_SPEED_OPS`]).
    pub fn calibrated(&self) -> bool {
        self.speed_ops >= MIN_SPEED_OPS
    }

    /// The time base's op time per iteration (µs): its steps' finite times summed (a step
    /// that failed in the calibration has none).
    pub fn base_op_us(&self) -> f64 {
        self.base_step_us.iter().filter(|b| b.is_finite()).sum()
    }

    /// Multiplies the time base by how much slower the ops run between the gaps
    /// ([`OpsBetweenGaps`]), and records it. Where the model was anchored, anchor it again
    /// ([`anchor`](super::anchor)): its host ratio then divides the factor back out.
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
