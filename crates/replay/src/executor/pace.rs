//! Emulating the original's gaps between ops: spinning in running time, bookkeeping owed back
//! by later gaps, and the gaps' pace following the host's speed.

use super::*;

/// The gaps to emulate before each step, and how they follow the host's speed.
pub(super) struct Gaps<'a> {
    pub(super) us: &'a [f64],
    pub(super) pace: Option<GapPace>,
}

/// The host's speed now against when the gaps were calibrated, as the replay's own ops show
/// it: each iteration's weighted median (by the calibrated time) of its ops' time over their
/// calibrated time, and the median of those over the last iterations that hold at least
/// [`GapPace::WINDOW_US`] of calibrated op time. Medians, so that an op that lost a time slice
/// (a busy host) or a cold one does not move it; no system call (a read of the run delay
/// between iterations would be a point where a busy host's scheduler preempts the replay).
pub(crate) struct GapPace {
    base: Vec<f64>,
    /// (the iteration's ratio, its calibrated op time), oldest first.
    recent: std::collections::VecDeque<(f64, f64)>,
    /// What the gaps are multiplied by.
    pub factor: f64,
    scratch: Vec<(f64, f64)>,
}

impl GapPace {
    /// Calibrated op time the factor is taken over (µs): several of a VM's speed spells'
    /// worth of ops would lag them, a few ops are noise.
    const WINDOW_US: f64 = 20_000.0;
    const MAX_ITERATIONS: usize = 64;
    /// A factor outside this is not a host's speed but a broken calibration.
    const BOUNDS: (f64, f64) = (0.5, 2.0);

    pub(super) fn new(base: &[f64]) -> GapPace {
        GapPace {
            base: base.to_vec(),
            recent: std::collections::VecDeque::new(),
            factor: 1.0,
            scratch: Vec::new(),
        }
    }

    pub(super) fn update(&mut self, timer: &Timer, timed: &[Timed]) {
        self.scratch.clear();
        for t in timed {
            let base = self.base[t.pos];
            let live = timer.host_at(t.end) - timer.host_at(t.start) - t.waited_us;
            if base > 0.0 && live > 0.0 && live.is_finite() {
                self.scratch.push((live / base, base));
            }
        }
        let Some(ratio) = et_graph::weighted_median(&mut self.scratch) else {
            return;
        };
        let weight: f64 = self.scratch.iter().map(|&(_, w)| w).sum();
        self.push(ratio, weight);
    }

    pub(super) fn push(&mut self, ratio: f64, weight: f64) {
        self.recent.push_back((ratio, weight));
        // Drop the oldest while the rest still hold the window.
        let mut total: f64 = self.recent.iter().map(|&(_, w)| w).sum();
        while let Some(&(_, w)) = self.recent.front() {
            if self.recent.len() > Self::MAX_ITERATIONS || total - w >= Self::WINDOW_US {
                total -= w;
                self.recent.pop_front();
            } else {
                break;
            }
        }
        let ratios: Vec<f64> = self.recent.iter().map(|&(r, _)| r).collect();
        self.factor = metrics::Stats::of(&ratios)
            .median
            .clamp(Self::BOUNDS.0, Self::BOUNDS.1);
    }
}

/// Spins until `until` (µs on the timer's host clock) in running time: busy, like the Python and
/// autograd work an emulated gap stands for, and, like that work, not done while the thread is
/// descheduled. A poll that took a time slice or more ([`et_graph::SLICE_MIN_US`]: far longer
/// than an interrupt) means another process had the core, and the deadline moves by that
/// long; the original's Python, descheduled, would still have had its work to do after. So a
/// busy host slows the emulated gaps as it slows the ops, and the gaps are given in running
/// time (the gap model measures the host's speed without the time it waited for a CPU).
pub(super) fn spin_running(timer: &Timer, until: f64) -> Spin {
    spin_on(|| timer.host_us(), until)
}

/// [`spin_running`] on `clock` (µs), which the tests script.
fn spin_on(mut clock: impl FnMut() -> f64, mut until: f64) -> Spin {
    let began = clock();
    let (mut prev, mut moved) = (began, 0.0);
    while prev < until {
        std::hint::spin_loop();
        let now = clock();
        if now - prev >= et_graph::SLICE_MIN_US {
            until += now - prev;
            moved += now - prev;
        }
        prev = now;
    }
    Spin {
        began,
        ended: prev,
        moved,
    }
}

/// What [`spin_running`] did, on the timer's host clock (µs): when it began and ended (its own
/// first and last reads, so that no reads of the clock are added around it), and how far the
/// deadline moved for the time the thread was descheduled.
#[derive(Clone, Copy, Debug)]
pub(super) struct Spin {
    pub(super) began: f64,
    pub(super) ended: f64,
    pub(super) moved: f64,
}

/// The time outside the ops an iteration has spent beyond its emulated gaps so far (µs), owed
/// back by the gaps after. A gap is spun from the end of the op before, the replay's
/// bookkeeping in between (frees, its stacks) counting toward it; where the bookkeeping alone
/// takes longer than the gap (a large free before a short gap), the gap is over before the
/// spin starts, and each such step added its excess to the iteration: the outside time came
/// out as the sum over the steps of the larger of the two, where the model (the anchor's
/// total) is the larger of the two sums. Over the zoo's anchored replays the time outside
/// the ops ran a median 2.8% over what was meant (up to 14-18% for the recurrent models,
/// whose backward frees many tensors at a few steps). Owed back, the
/// iteration's total is the model's where a later gap has room for it.
#[derive(Debug, Default)]
pub(super) struct Owed(f64);

impl Owed {
    /// When the gap of `want` µs before an op, counted from `from` (the op before's end), ends.
    pub(super) fn deadline(&self, from: f64, want: f64) -> f64 {
        from + (want - self.0).max(0.0)
    }

    /// After a gap of `want`: `spent`, the running time from the op before's end to now, of
    /// which `before_spin` passed before the spin began. A stretch before the spin of a time
    /// slice or more was the thread waiting for a CPU (as the spin itself leaves out), not the
    /// replay's work: it owes nothing.
    pub(super) fn settle(&mut self, want: f64, spent: f64, before_spin: f64) {
        if before_spin < et_graph::SLICE_MIN_US {
            self.0 = (self.0 + spent - want).max(0.0);
        }
    }
}

#[cfg(test)]
mod tests;
