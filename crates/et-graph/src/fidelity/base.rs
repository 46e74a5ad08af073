//! Where a gap model's replay takes its time base and total from: the ops' slowdown between
//! gaps ([`OpsBetweenGaps`]), a base measured with the gaps in place ([`TimeBase`]), and an
//! uninstrumented reference the gaps' total is anchored on ([`anchor`]).

use super::model::GapModel;

/// How much slower the replay's ops run between spun gaps than back to back on this host:
/// the ratio of the steps' medians over one replay whose iterations alternate in short runs
/// (with the gaps, without), so that a VM's slow spell moves both kinds alike. Ops between
/// gaps run slower because their caches and predictors cool while a gap is spun, and on a busy
/// host a shared core is taken more often inside them. The effect outlasts an iteration (a
/// back-to-back iteration right after a gapped one is still slowed), hence runs rather than
/// single iterations.
///
/// The gap model's time base is multiplied by it, so that `GapPace` follows only the host's
/// own changes, not the gaps' effect on the ops. An [`anchor`] sets the host ratio by the ops
/// back to back, as the reference's plain replay ran them, and fills the target with the ops
/// as they run between the gaps: the original's ops are as cold after its Python, and the
/// reference's original time holds that already.
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

/// The time base a gap model's replay follows the host's speed from, measured with the
/// model's gaps spun between the ops rather than with the ops back to back. The replay sets
/// its ops' speed between spun gaps against the base (`GapPace`): against a plain base, the
/// ops' slowdown between gaps (large on a busy host) would read as a slower host and stretch
/// the gaps; measured the way the replay runs, the base leaves only the host's own changes.
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
    /// The original's iteration.
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

/// Anchors `model`'s gaps on a `reference`: their shape (which gap holds how much) stays the
/// profile's, their total becomes what the original took beyond the plain replay on the
/// capture host, put on this host by the plain replay's own ratio.
///
/// With `O` the reference's plain replay's op time, `T` its original and `o` this host's plain
/// op time (the model's `base_step_us`, the time base its gaps follow), the replay with gaps
/// takes `T * o / O`. Op times, not iterations: a calibration's plain iterations hold its
/// per-step timing, about 1 µs a step, where a replay's hold 0.1. The instrumentation never
/// enters (both references are uninstrumented), nor does how slow a profiled capture ran or
/// how its cold ops compare with the replay's warm ones. Where the model knows how much slower
/// its ops run between the gaps ([`OpsBetweenGaps`]), `o` is the ops back to back (as `O`
/// ran), and the target is filled with the ops as they run between the gaps. The ratio
/// assumes what the bottom-up model assumes: that the original's time outside ops follows this
/// host's speed as its ops do.
///
/// The executor spins each gap from the end of the op before, the replay's bookkeeping inside
/// it (the reference's `R - O`, put on this host), and where the bookkeeping before one op
/// outlasts its gap, the gaps after give the excess back (the executor's `Owed`). So the time
/// outside the ops is the larger of the gaps' total and the bookkeeping's, and the scale
/// solves `max(scale * sum(e_i), R - O) = target - o`. A model with no gaps to shape it
/// spreads the time over every step evenly. Nothing is spun where the plain replay is already
/// as slow as the target; above, the reference's total is taken as it is (no cap), and
/// [`Anchored::scale`] reports the factor.
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
