//! # metrics
//!
//! Timing and reporting helpers: CPU timers, CUDA events ([`cuda`]), GPU counters through NVML
//! ([`gpu`]), CPU counters ([`cpu`]), summary statistics over samples, and Chrome/Perfetto trace
//! and SVG writers. Knows nothing about execution traces (architecture invariant): callers hand
//! it names and numbers. Every GPU library is loaded at run time, so the crate builds and its
//! tests pass on a machine without a GPU, a driver or a CUDA toolkit.

pub mod cpu;
pub mod cuda;
mod error;
pub mod gpu;
pub mod plot;

pub use error::{Cause, Error};

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
    /// The statistics of every sample (non-finite ones included: a NaN sorts last, an infinity
    /// at its own end); all zero without samples.
    pub fn of(samples: &[f64]) -> Stats {
        if samples.is_empty() {
            return Stats::default();
        }
        let mut v = samples.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len();
        Stats {
            median: median_of_sorted(&v),
            min: v[0],
            max: v[n - 1],
            mean: v.iter().sum::<f64>() / n as f64,
            n,
        }
    }
}

/// The median of the finite values of `v`: the middle one, or the two middle ones averaged when
/// their count is even; NaN when there are none. NaNs and infinities are dropped rather than
/// sorted in, so that one failed sample (a NaN time) does not move the median.
pub fn median(v: &[f64]) -> f64 {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(|a, b| a.total_cmp(b));
    median_of_sorted(&v)
}

/// The middle value of sorted `v`, or the mean of its two middle ones; NaN when empty.
fn median_of_sorted(v: &[f64]) -> f64 {
    let n = v.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Minor page faults this process has taken so far (`getrusage`); `None` where the platform
/// does not count them. A fault per first touch of a fresh page: a replay that returns its
/// memory to the OS after every iteration pays them again each time, a warm model does not.
#[cfg(unix)]
pub fn minor_page_faults() -> Option<u64> {
    // SAFETY: getrusage only writes the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    (unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } == 0).then_some(u.ru_minflt as u64)
}

#[cfg(not(unix))]
pub fn minor_page_faults() -> Option<u64> {
    None
}

/// A monotonic CPU clock anchored at creation; `now_us` is microseconds since then.
#[derive(Clone, Copy, Debug)]
pub struct Clock(Instant, f64);

impl Default for Clock {
    fn default() -> Self {
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_nanos() as f64 / 1000.0);
        Clock(Instant::now(), unix)
    }
}

impl Clock {
    pub fn now_us(&self) -> f64 {
        self.0.elapsed().as_nanos() as f64 / 1000.0
    }

    /// The wall-clock time of its anchor (µs since the Unix epoch): what puts the timelines of
    /// several processes on one host on one axis.
    pub fn origin_unix_us(&self) -> f64 {
        self.1
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

/// One value of a counter track ("C" phase): e.g. an NVML metric at a sample's time.
#[derive(Clone, Debug, Serialize)]
pub struct Counter {
    pub track: String,
    pub ts: f64,
    pub value: f64,
}

/// What a timed run looked like: slices on named threads and counter tracks, on one clock (µs).
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    pub threads: Vec<(u64, String)>,
    pub slices: Vec<Slice>,
    pub counters: Vec<Counter>,
}

impl Timeline {
    /// Writes it as a Chrome/Perfetto JSON trace.
    pub fn write_chrome<W: Write>(&self, w: W, process: &str) -> std::io::Result<()> {
        let threads: Vec<(u64, &str)> =
            self.threads.iter().map(|(t, n)| (*t, n.as_str())).collect();
        write_chrome_trace_with(w, process, &threads, &self.slices, &self.counters)
    }

    /// The counter tracks as stacked line charts ([`gpu::svg_timelines`]), time from the first
    /// value in ms; `None` without counters. A track's unit is what its name ends with in
    /// parentheses (`sm_util (%)`).
    pub fn svg_counters(&self, title: &str) -> Option<String> {
        let t0 = self
            .counters
            .iter()
            .map(|c| c.ts)
            .fold(f64::INFINITY, f64::min);
        if !t0.is_finite() {
            return None;
        }
        let mut tracks: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
        for c in &self.counters {
            let pt = ((c.ts - t0) / 1000.0, c.value);
            match tracks.iter_mut().find(|t| t.0 == c.track) {
                Some(t) => t.1.push(pt),
                None => tracks.push((c.track.clone(), vec![pt])),
            }
        }
        let series: Vec<gpu::Series> = tracks
            .into_iter()
            .map(|(name, pts)| {
                let unit = name
                    .rsplit_once('(')
                    .map_or("", |(_, u)| u.trim_end_matches(')'));
                (name.clone(), known_unit(unit), pts)
            })
            .collect();
        Some(gpu::svg_timelines(title, &series))
    }
}

/// The unit as one of the static units of [`gpu::METRICS`] ("" for others).
fn known_unit(u: &str) -> &'static str {
    gpu::METRICS
        .iter()
        .map(|m| m.1)
        .find(|m| *m == u)
        .unwrap_or("")
}

/// Writes slices as a Chrome/Perfetto JSON trace (open in ui.perfetto.dev or chrome://tracing).
pub fn write_chrome_trace<W: Write>(w: W, process: &str, slices: &[Slice]) -> std::io::Result<()> {
    write_chrome_trace_with(w, process, &[], slices, &[])
}

/// [`write_chrome_trace`] with named threads (tid, name) and counter tracks.
pub fn write_chrome_trace_with<W: Write>(
    w: W,
    process: &str,
    threads: &[(u64, &str)],
    slices: &[Slice],
    counters: &[Counter],
) -> std::io::Result<()> {
    let mut events = Vec::with_capacity(slices.len() + counters.len() + threads.len() + 1);
    events.push(serde_json::json!({"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": process}}));
    for (tid, name) in threads {
        events.push(serde_json::json!({"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": name}}));
    }
    for s in slices {
        events.push(serde_json::json!({
            "ph": "X", "name": s.name, "cat": s.cat, "pid": 1, "tid": s.tid, "ts": s.ts, "dur": s.dur, "args": s.args,
        }));
    }
    for c in counters.iter().filter(|c| c.value.is_finite()) {
        events.push(serde_json::json!({
            "ph": "C", "name": c.track, "pid": 1, "ts": c.ts, "args": {"value": c.value},
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
    fn median_of_odd_and_even_counts_of_finite_values() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[10.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[7.0]), 7.0);
    }

    #[test]
    fn median_drops_nan_and_infinities_and_is_nan_without_finite_values() {
        let v = [f64::NAN, 4.0, f64::INFINITY, 1.0, f64::NEG_INFINITY, 2.0];
        assert_eq!(median(&v), 2.0);
        assert_eq!(median(&[f64::NAN, 1.0, 3.0]), 2.0);
        assert!(median(&[]).is_nan());
        assert!(median(&[f64::NAN, f64::INFINITY]).is_nan());
    }

    #[test]
    fn median_is_stats_median_on_finite_samples() {
        for v in [&[5.0, 1.0, 4.0][..], &[2.0, 8.0, 1.0, 9.0], &[0.5]] {
            assert_eq!(median(v), Stats::of(v).median, "{v:?}");
        }
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

    #[test]
    fn timeline_svg_has_one_chart_per_counter_track() {
        let c = |track: &str, ts, value| Counter {
            track: track.into(),
            ts,
            value,
        };
        let t = Timeline {
            counters: vec![
                c("sm_util (%)", 100.0, 1.0),
                c("power (W)", 100.0, 300.0),
                c("sm_util (%)", 2100.0, 80.0),
            ],
            ..Default::default()
        };
        let svg = t.svg_counters("gpu").unwrap();
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(
            svg.contains("max 80.0 %") && svg.contains("max 300.0 W"),
            "{svg}"
        );
        assert!(Timeline::default().svg_counters("x").is_none());
    }

    #[test]
    fn chrome_trace_names_threads_and_writes_finite_counters() {
        let mut out = Vec::new();
        let c = |value| Counter {
            track: "sm_util".into(),
            ts: 1.0,
            value,
        };
        write_chrome_trace_with(&mut out, "p", &[(2, "gpu")], &[], &[c(3.0), c(f64::NAN)]).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let ev = v["traceEvents"].as_array().unwrap();
        assert_eq!(ev.len(), 3, "NaN counter dropped: {ev:?}");
        assert_eq!(ev[1]["args"]["name"], "gpu");
        assert_eq!(
            (ev[2]["ph"].as_str(), ev[2]["args"]["value"].as_f64()),
            (Some("C"), Some(3.0))
        );
    }
}

/// Text for an SVG/XML text node.
pub(crate) fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Resident memory of this process: now and its peak (Linux `/proc/self/status`: VmRSS and
/// VmHWM); `None` elsewhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ProcessMemory {
    pub rss_bytes: u64,
    pub peak_rss_bytes: u64,
}

pub fn process_memory() -> Option<ProcessMemory> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    Some(ProcessMemory {
        rss_bytes: proc_bytes(&status, "VmRSS:")?,
        peak_rss_bytes: proc_bytes(&status, "VmHWM:")?,
    })
}

#[cfg(test)]
mod memory_tests {
    #[test]
    fn a_memory_cgroup_limit_bounds_what_is_available() {
        // v1: the memory controller's line; v2: the unified line.
        let v1 = "9:name=systemd:/\n4:cpu,cpuacct:/job\n3:memory:/slurm/job_7\n0::/";
        assert_eq!(
            super::memory_cgroup(v1),
            Some(("/slurm/job_7".to_string(), false))
        );
        let v2 = "0::/user.slice/session-2.scope";
        assert_eq!(
            super::memory_cgroup(v2),
            Some(("/user.slice/session-2.scope".to_string(), true))
        );
        assert_eq!(super::memory_cgroup("5:devices:/\n"), None);
        // A limit less its usage; no limit: none.
        assert_eq!(
            super::headroom("1073741824\n", "73741824\n"),
            Some(1_000_000_000)
        );
        assert_eq!(super::headroom("100", "150"), Some(0));
        assert_eq!(super::headroom("max\n", "5"), None);
        assert_eq!(super::headroom("9223372036854771712", "5"), None);
        // Whatever the cgroup says, never more than the host has.
        if let (Some(a), Some(info)) = (
            super::available_memory(),
            std::fs::read_to_string("/proc/meminfo").ok(),
        ) {
            let host = super::proc_bytes(&info, "MemAvailable:").unwrap();
            // The host's figure moves between the two reads: allow it a little.
            assert!(a <= host + (64 << 20), "{a} > {host}");
        }
    }

    #[test]
    fn process_memory_reads_a_plausible_rss() {
        let m = super::process_memory();
        if cfg!(target_os = "linux") {
            let m = m.expect("Linux has /proc/self/status");
            // A Rust test process holds at least a few hundred KiB and its peak is no lower.
            assert!(m.rss_bytes > 100 * 1024, "{m:?}");
            assert!(m.peak_rss_bytes >= m.rss_bytes, "{m:?}");
        }
    }
}

/// Memory the system can give this process now without swapping (Linux `MemAvailable`), or
/// less where its memory cgroup's limit leaves less (a container, a Slurm job); `None`
/// elsewhere.
pub fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let host = proc_bytes(&info, "MemAvailable:")?;
    Some(match cgroup_headroom() {
        Some(room) => host.min(room),
        None => host,
    })
}

/// What this process's memory cgroup still allows (its limit less its usage): cgroup v2's
/// `memory.max` and `memory.current`, or v1's `memory.limit_in_bytes` and
/// `memory.usage_in_bytes`; `None` without a limit.
fn cgroup_headroom() -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let (path, v2) = memory_cgroup(&own)?;
    let read = |name: &str| {
        let dir = if v2 {
            format!("/sys/fs/cgroup{path}")
        } else {
            format!("/sys/fs/cgroup/memory{path}")
        };
        std::fs::read_to_string(format!("{dir}/{name}")).ok()
    };
    let (limit, usage) = if v2 {
        (read("memory.max")?, read("memory.current")?)
    } else {
        (
            read("memory.limit_in_bytes")?,
            read("memory.usage_in_bytes")?,
        )
    };
    headroom(&limit, &usage)
}

/// The memory cgroup's path in `/proc/self/cgroup`, and whether it is cgroup v2's (`0::PATH`);
/// v1's `N:memory:PATH` (or `N:...,memory,...:PATH`) where the memory controller has one.
fn memory_cgroup(own: &str) -> Option<(String, bool)> {
    let mut v2 = None;
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        if controllers.split(',').any(|c| c == "memory") {
            return Some((path.to_string(), false));
        }
        if controllers.is_empty() {
            v2 = Some((path.to_string(), true));
        }
    }
    v2
}

/// A limit less a usage, both as the cgroup files hold them; `None` for no limit (`max`, or
/// v1's page-rounded `i64::MAX`).
fn headroom(limit: &str, usage: &str) -> Option<u64> {
    let limit: u64 = limit.trim().parse().ok()?;
    let usage: u64 = usage.trim().parse().ok()?;
    (limit < 1 << 62).then(|| limit.saturating_sub(usage))
}

/// The bytes of a `KEY:   1234 kB` line of a Linux `/proc` file.
fn proc_bytes(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line[key.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}
