//! Fidelity: how the original run spent its time, and how a replay compares with it. The gap
//! model (time outside operators, corrected for the profiler's own cost) and the per-op
//! comparison live here, in one place and without libtorch; the replay crate only executes
//! what they compute (it spins the gaps, it profiles an instrumented iteration) and the CLI
//! only prints.

use crate::link::{is_cpu_event, Link};
use et_schema::kineto::{KinetoTrace, Lane};
use std::collections::{BTreeMap, HashMap};

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
}

/// Durations and gaps of the original run along the replay set's execution order.
pub fn original_timing(l: &Link, k: &KinetoTrace) -> OriginalTiming {
    let mut out = OriginalTiming {
        op_us: Vec::with_capacity(l.event_of.len()),
        gap_us: Vec::with_capacity(l.event_of.len()),
        span_us: 0.0,
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

/// Gaps corrected for the profiler's own cost. Kineto with shapes and the execution trace
/// observer slow every recorded event down, so the time between ops in a profiled run
/// overstates the model's own time outside operators. The per-event cost `c` is fitted from
/// the ops themselves: an op's profiled duration exceeds its plain replayed duration by about
/// `c` times the events recorded inside it (itself included). Each gap then loses `c` per
/// event that starts in it, plus one for the op boundary. Returns the gaps (µs) and `c` (µs).
///
/// `c` is the median of the per-op ratios, not a ratio of sums: a few long ops carry most of
/// the absolute noise (a cold first call under the profiler, a large matmul whose replay
/// differs by more than the profiler's cost) and would otherwise set it.
pub fn corrected_gaps(
    l: &Link,
    k: &KinetoTrace,
    orig: &OriginalTiming,
    replay_us: &[f64],
) -> (Vec<f64>, f64) {
    let mut starts_by_tid: HashMap<Lane, Vec<f64>> = HashMap::new();
    let mut all_starts: Vec<f64> = Vec::new();
    for (i, e) in k.events.iter().enumerate() {
        if is_cpu_event(k, i) {
            starts_by_tid.entry(e.tid).or_default().push(e.ts);
            all_starts.push(e.ts);
        }
    }
    for v in starts_by_tid.values_mut() {
        v.sort_by(|a, b| a.total_cmp(b));
    }
    all_starts.sort_by(|a, b| a.total_cmp(b));
    let count_in =
        |v: &[f64], a: f64, b: f64| v.partition_point(|&x| x <= b) - v.partition_point(|&x| x < a);
    let mut per_op: Vec<f64> = l
        .event_of
        .iter()
        .zip(replay_us)
        .filter_map(|(e, &r)| {
            let ev = &k.events[(*e)? as usize];
            let events = starts_by_tid
                .get(&ev.tid)
                .map_or(1, |v| count_in(v, ev.ts, ev.ts + ev.dur).max(1));
            Some((ev.dur - r) / events as f64)
        })
        .collect();
    per_op.sort_by(|a, b| a.total_cmp(b));
    let c = median_sorted(&per_op).max(0.0);
    let last_end = l
        .event_of
        .iter()
        .flatten()
        .map(|&e| k.events[e as usize].ts + k.events[e as usize].dur)
        .fold(f64::NEG_INFINITY, f64::max);
    let mut prev_end: Option<f64> = None;
    let gaps = l
        .event_of
        .iter()
        .zip(&orig.gap_us)
        .map(|(e, &g)| {
            let Some(e) = e else { return 0.0 };
            let ev = &k.events[*e as usize];
            let in_gap = match (prev_end, l.span) {
                (Some(p), _) => count_in(&all_starts, p, ev.ts).saturating_sub(1),
                // The first op's gap: the iteration's time before it and after the last op.
                (None, Some((a, b))) => {
                    count_in(&all_starts, a, ev.ts).saturating_sub(1)
                        + count_in(&all_starts, last_end, b).saturating_sub(1)
                }
                (None, None) => 0,
            } as f64;
            prev_end = Some(prev_end.map_or(ev.ts + ev.dur, |p: f64| p.max(ev.ts + ev.dur)));
            (g - c * (in_gap + 1.0)).max(0.0)
        })
        .collect();
    (gaps, c)
}

fn median_sorted(v: &[f64]) -> f64 {
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
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

    #[test]
    fn implausible_gaps_are_capped() {
        let orig = OriginalTiming {
            op_us: vec![Some(1000.0), Some(2000.0), None],
            gap_us: vec![0.0; 3],
            span_us: 0.0,
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
