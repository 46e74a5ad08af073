//! A replay compared with its original op by op.

use super::timing::OriginalTiming;
use std::collections::BTreeMap;

/// One op name in a comparison of a replay with its original: per iteration, over its linked
/// calls (µs).
#[derive(Clone, Debug, PartialEq)]
pub struct OpComparison {
    /// The op name.
    pub op: String,
    /// Its linked calls per iteration.
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
    /// Linked ops found in the instrumented replay's profile.
    pub profiled_ops: usize,
    /// The profiled replay's time in those ops (ms).
    pub profiled_ms: f64,
    /// The original's time in the same ops (ms).
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
