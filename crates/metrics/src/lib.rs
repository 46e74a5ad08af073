//! # metrics
//!
//! Timing and reporting helpers: CPU timers, summary statistics over samples, and a
//! Chrome/Perfetto trace writer. Knows nothing about execution traces (architecture invariant):
//! callers hand it names and numbers.

use serde::Serialize;
use std::io::Write;
use std::time::Instant;

/// Median, min and max of a set of samples (milliseconds or any unit).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Stats {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub mean: f64,
    pub n: usize,
}

impl Stats {
    pub fn of(samples: &[f64]) -> Stats {
        if samples.is_empty() {
            return Stats::default();
        }
        let mut v = samples.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Stats {
            median,
            min: v[0],
            max: v[n - 1],
            mean: v.iter().sum::<f64>() / n as f64,
            n,
        }
    }
}

/// A monotonic CPU clock anchored at creation; `now_us` is microseconds since then.
#[derive(Clone, Copy, Debug)]
pub struct Clock(Instant);

impl Default for Clock {
    fn default() -> Self {
        Clock(Instant::now())
    }
}

impl Clock {
    pub fn now_us(&self) -> f64 {
        self.0.elapsed().as_nanos() as f64 / 1000.0
    }
}

/// One complete event ("X" phase) of a Chrome trace.
#[derive(Clone, Debug, Serialize)]
pub struct Slice {
    pub name: String,
    pub cat: &'static str,
    pub ts: f64,
    pub dur: f64,
    pub tid: u64,
    pub args: serde_json::Value,
}

/// Writes slices as a Chrome/Perfetto JSON trace (open in ui.perfetto.dev or chrome://tracing).
pub fn write_chrome_trace<W: Write>(w: W, process: &str, slices: &[Slice]) -> std::io::Result<()> {
    let mut events = Vec::with_capacity(slices.len() + 1);
    events.push(serde_json::json!({"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": process}}));
    for s in slices {
        events.push(serde_json::json!({
            "ph": "X", "name": s.name, "cat": s.cat, "pid": 1, "tid": s.tid, "ts": s.ts, "dur": s.dur, "args": s.args,
        }));
    }
    serde_json::to_writer(
        w,
        &serde_json::json!({"traceEvents": events, "displayTimeUnit": "ms"}),
    )
    .map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_of_odd_and_even_samples() {
        let s = Stats::of(&[3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        assert_eq!(Stats::of(&[1.0, 2.0, 3.0, 10.0]).median, 2.5);
        assert_eq!(Stats::of(&[]), Stats::default());
    }

    #[test]
    fn chrome_trace_is_valid_json_with_one_event_per_slice() {
        let mut out = Vec::new();
        let s = Slice {
            name: "aten::mm".into(),
            cat: "op",
            ts: 1.0,
            dur: 2.0,
            tid: 1,
            args: serde_json::json!({"id": 3}),
        };
        write_chrome_trace(&mut out, "replay", &[s.clone(), s]).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["traceEvents"].as_array().unwrap().len(), 3);
        assert_eq!(v["traceEvents"][1]["name"], "aten::mm");
    }
}
