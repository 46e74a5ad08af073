//! GPU activity of a run: busy time, the breakdown by kind of work (compute kernels, NCCL
//! kernels, memcpy, memset), the overlap of compute with communication, and the kernels that
//! took the most time. The same computation serves the original (its Kineto trace's GPU events,
//! tied to their CPU ops through correlation ids: [`crate::Link::gpu_events`]) and a CUDA replay
//! (the GPU events of its instrumented iteration), so both are measured alike.

use crate::link::Link;
use et_schema::kineto::{Category, KinetoTrace};
use serde::Serialize;
use std::collections::HashMap;

/// What a GPU interval was doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum GpuWork {
    /// A kernel that is not a collective's.
    Compute,
    /// A collective's kernel (NCCL).
    Comm,
    /// A memory copy.
    Memcpy,
    /// A memory set.
    Memset,
}

impl GpuWork {
    /// From a Kineto category and event name; `None` for events that are not GPU work.
    pub fn of(cat: Category, name: &str) -> Option<GpuWork> {
        match cat {
            Category::Kernel if is_comm_kernel(name) => Some(GpuWork::Comm),
            Category::Kernel => Some(GpuWork::Compute),
            Category::GpuMemcpy => Some(GpuWork::Memcpy),
            Category::GpuMemset => Some(GpuWork::Memset),
            _ => None,
        }
    }

    /// From an event name alone (a profile that carries no category: the replay's own).
    pub fn of_name(name: &str) -> GpuWork {
        if name.starts_with("Memcpy") {
            GpuWork::Memcpy
        } else if name.starts_with("Memset") {
            GpuWork::Memset
        } else if is_comm_kernel(name) {
            GpuWork::Comm
        } else {
            GpuWork::Compute
        }
    }
}

fn is_comm_kernel(name: &str) -> bool {
    name.starts_with("nccl") || name.starts_with("void nccl") || name.contains("ncclDevKernel")
}

/// One piece of GPU work (µs on any one clock).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GpuInterval<'a> {
    /// The kernel's (or copy's) name.
    pub name: &'a str,
    /// What it does.
    pub work: GpuWork,
    /// Its start.
    pub start_us: f64,
    /// Its duration.
    pub dur_us: f64,
}

/// A kernel name's total in a run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KernelTime {
    /// The kernel's name without its template and parameter lists.
    pub kernel: String,
    /// What it does.
    pub work: GpuWork,
    /// Its calls.
    pub calls: usize,
    /// Their total duration (µs).
    pub total_us: f64,
}

/// GPU activity over some intervals (µs).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GpuActivity {
    /// The intervals counted.
    pub events: usize,
    /// First start to last end.
    pub span_us: f64,
    /// Time with any GPU work running (the union of the intervals).
    pub busy_us: f64,
    /// Sums of durations by kind of work (concurrent work counts twice).
    pub compute_us: f64,
    /// Communication kernels' time.
    pub comm_us: f64,
    /// Memory copies' time.
    pub memcpy_us: f64,
    /// Memory sets' time.
    pub memset_us: f64,
    /// Time in which compute kernels and communication kernels both ran.
    pub overlap_us: f64,
    /// Communication time with no compute beside it.
    pub exposed_comm_us: f64,
    /// The kernels (and copies) with the most time, most first (at most 15).
    pub top: Vec<KernelTime>,
}

/// Merges intervals into disjoint ones, sorted.
fn union(mut v: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    v.retain(|(a, b)| a.is_finite() && b.is_finite() && b > a);
    v.sort_by(|x, y| x.0.total_cmp(&y.0));
    let mut out: Vec<(f64, f64)> = Vec::with_capacity(v.len());
    for (a, b) in v {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

fn length(v: &[(f64, f64)]) -> f64 {
    v.iter().map(|(a, b)| b - a).sum()
}

/// Total length of the intersection of two disjoint sorted interval lists.
fn intersection(x: &[(f64, f64)], y: &[(f64, f64)]) -> f64 {
    let (mut i, mut j, mut total) = (0, 0, 0.0);
    while i < x.len() && j < y.len() {
        let lo = x[i].0.max(y[j].0);
        let hi = x[i].1.min(y[j].1);
        if hi > lo {
            total += hi - lo;
        }
        if x[i].1 < y[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    total
}

/// `void at::native::(anonymous namespace)::foo<float, 4>(...)` -> `at::native::foo`;
/// `std::enable_if<...>::type internal::gemvx::kernel<...>(...)` -> `internal::gemvx::kernel`.
pub fn short_kernel_name(name: &str) -> String {
    let s = name.replace("(anonymous namespace)::", "");
    // The name without template arguments (depth 0 only) and up to its parameter list.
    let mut out = String::new();
    let mut depth = 0usize;
    for c in s.chars() {
        match c {
            '<' => depth += 1,
            '>' => depth = depth.saturating_sub(1),
            '(' if depth == 0 => break,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    // The last word: a return type (`void`, `std::enable_if::type`) comes before it.
    out.split_whitespace().last().unwrap_or("").to_string()
}

/// The activity of `intervals`.
pub fn gpu_activity(intervals: &[GpuInterval]) -> GpuActivity {
    let mut a = GpuActivity {
        events: intervals.len(),
        ..Default::default()
    };
    if intervals.is_empty() {
        return a;
    }
    let span = |w: Option<GpuWork>| {
        union(
            intervals
                .iter()
                .filter(|i| w.is_none_or(|w| i.work == w))
                .map(|i| (i.start_us, i.start_us + i.dur_us.max(0.0)))
                .collect(),
        )
    };
    let all = span(None);
    let compute = span(Some(GpuWork::Compute));
    let comm = span(Some(GpuWork::Comm));
    a.busy_us = length(&all);
    a.span_us = all.last().map_or(0.0, |l| l.1) - all.first().map_or(0.0, |f| f.0);
    a.overlap_us = intersection(&compute, &comm);
    a.exposed_comm_us = (length(&comm) - a.overlap_us).max(0.0);
    let mut by: HashMap<(String, GpuWork), (usize, f64)> = HashMap::new();
    for i in intervals {
        let d = i.dur_us.max(0.0);
        match i.work {
            GpuWork::Compute => a.compute_us += d,
            GpuWork::Comm => a.comm_us += d,
            GpuWork::Memcpy => a.memcpy_us += d,
            GpuWork::Memset => a.memset_us += d,
        }
        let e = by.entry((short_kernel_name(i.name), i.work)).or_default();
        e.0 += 1;
        e.1 += d;
    }
    let mut top: Vec<KernelTime> = by
        .into_iter()
        .map(|((kernel, work), (calls, total_us))| KernelTime {
            kernel,
            work,
            calls,
            total_us,
        })
        .collect();
    top.sort_by(|x, y| {
        y.total_us
            .total_cmp(&x.total_us)
            .then_with(|| x.kernel.cmp(&y.kernel))
    });
    top.truncate(15);
    a.top = top;
    a
}

/// The original's GPU activity over the iteration (the work launched under the linked ops and
/// the rest of the iteration's, [`Link::gpu_off_op`]), and each replay-set op's GPU time: the
/// sum of the GPU work it launched or was attributed (µs; `None` where it has none).
pub fn original_gpu(l: &Link, k: &KinetoTrace) -> (GpuActivity, Vec<Option<f64>>) {
    let interval = |e: u32| {
        let ev = &k.events[e as usize];
        let name = k.str(ev.name);
        GpuWork::of(ev.cat, name).map(|work| GpuInterval {
            name,
            work,
            start_us: ev.ts,
            dur_us: ev.dur,
        })
    };
    let per_op = l
        .gpu_events_attributed()
        .iter()
        .map(|evs| {
            evs.iter()
                .filter_map(|&e| interval(e))
                .map(|i| i.dur_us.max(0.0))
                .fold(None, |s: Option<f64>, d| Some(s.unwrap_or(0.0) + d))
        })
        .collect();
    let intervals: Vec<GpuInterval> = l
        .gpu_events
        .iter()
        .flatten()
        .copied()
        .chain(l.gpu_off_op.iter().map(|o| o.event))
        .filter_map(interval)
        .collect();
    (gpu_activity(&intervals), per_op)
}

/// The GPU work of the iteration that no linked op launched, by what launched it: the
/// annotations (or ops the replay does not run) it came under, with the replayed ops it is
/// attributed to, and what could not be attributed.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct OffOpSummary {
    /// GPU events launched under linked ops.
    pub under_ops: usize,
    /// GPU events attributed to a replayed op though launched outside its span.
    pub attributed: usize,
    /// Their time (µs).
    pub attributed_us: f64,
    /// GPU events no replayed op could be given.
    pub unattributed: usize,
    /// Their time (µs).
    pub unattributed_us: f64,
    /// By the CPU event they were launched under (`(none)` where none held the launch), most
    /// time first: attributed and not.
    pub by_launcher: Vec<OffOpGroup>,
}

/// GPU events launched under one CPU event name, outside the linked ops.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OffOpGroup {
    /// The CPU event (op or annotation) they were launched under.
    pub launched_under: String,
    /// Whether they were attributed to replayed ops.
    pub attributed: bool,
    /// Events.
    pub events: usize,
    /// Their time (µs).
    pub total_us: f64,
    /// Their kernels' short names, most time first (at most 3).
    pub kernels: Vec<String>,
}

/// Counts the iteration's GPU work that no linked op launched ([`Link::gpu_off_op`]).
pub fn off_op_summary(l: &Link, k: &KinetoTrace) -> OffOpSummary {
    let mut s = OffOpSummary {
        under_ops: l.gpu_events.iter().map(Vec::len).sum(),
        ..Default::default()
    };
    type Group = (usize, f64, HashMap<String, f64>);
    let mut groups: HashMap<(String, bool), Group> = HashMap::new();
    for o in &l.gpu_off_op {
        let ev = &k.events[o.event as usize];
        let d = ev.dur.max(0.0);
        let attributed = o.attributed_to.is_some();
        if attributed {
            s.attributed += 1;
            s.attributed_us += d;
        } else {
            s.unattributed += 1;
            s.unattributed_us += d;
        }
        let under = o.launched_under.map_or("(none)".to_string(), |c| {
            k.str(k.events[c as usize].name).to_string()
        });
        let g = groups.entry((under, attributed)).or_default();
        g.0 += 1;
        g.1 += d;
        *g.2.entry(short_kernel_name(k.str(ev.name))).or_default() += d;
    }
    let mut v: Vec<OffOpGroup> = groups
        .into_iter()
        .map(
            |((launched_under, attributed), (events, total_us, kernels))| {
                let mut ks: Vec<(String, f64)> = kernels.into_iter().collect();
                ks.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
                OffOpGroup {
                    launched_under,
                    attributed,
                    events,
                    total_us,
                    kernels: ks.into_iter().take(3).map(|k| k.0).collect(),
                }
            },
        )
        .collect();
    v.sort_by(|a, b| {
        b.total_us
            .total_cmp(&a.total_us)
            .then_with(|| a.launched_under.cmp(&b.launched_under))
    });
    s.by_launcher = v;
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iv(name: &str, work: GpuWork, start_us: f64, dur_us: f64) -> GpuInterval<'_> {
        GpuInterval {
            name,
            work,
            start_us,
            dur_us,
        }
    }

    #[test]
    fn busy_time_overlap_and_exposed_communication() {
        use GpuWork::*;
        // compute [0,10) and [20,30); comm [5,25); memcpy [40,42).
        let v = [
            iv("void at::native::gemm<float>(int)", Compute, 0.0, 10.0),
            iv("void at::native::gemm<half>(int)", Compute, 20.0, 10.0),
            iv("ncclKernel_AllReduce_RING", Comm, 5.0, 20.0),
            iv("Memcpy HtoD", Memcpy, 40.0, 2.0),
        ];
        let a = gpu_activity(&v);
        assert_eq!(a.events, 4);
        assert_eq!(a.span_us, 42.0);
        assert_eq!(a.busy_us, 32.0);
        assert_eq!((a.compute_us, a.comm_us, a.memcpy_us), (20.0, 20.0, 2.0));
        assert_eq!(a.overlap_us, 10.0);
        assert_eq!(a.exposed_comm_us, 10.0);
        assert_eq!(a.top[0].kernel, "at::native::gemm");
        assert_eq!((a.top[0].calls, a.top[0].total_us), (2, 20.0));
        assert_eq!(gpu_activity(&[]), GpuActivity::default());
    }

    #[test]
    fn work_is_classified_by_category_and_name() {
        assert_eq!(
            GpuWork::of(
                Category::Kernel,
                "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(x)"
            ),
            Some(GpuWork::Comm)
        );
        assert_eq!(
            GpuWork::of(Category::Kernel, "volta_sgemm_64x64_tn"),
            Some(GpuWork::Compute)
        );
        assert_eq!(GpuWork::of(Category::CpuOp, "aten::mm"), None);
        assert_eq!(GpuWork::of_name("Memset (Device)"), GpuWork::Memset);
        assert_eq!(
            short_kernel_name("void at::native::(anonymous namespace)::k<float>(int)"),
            "at::native::k"
        );
        assert_eq!(
            short_kernel_name(
                "std::enable_if<!(T7), void>::type internal::gemvx::kernel<int, float>(P<float>)"
            ),
            "internal::gemvx::kernel"
        );
        assert_eq!(
            short_kernel_name("volta_sgemm_64x64_tn"),
            "volta_sgemm_64x64_tn"
        );
        assert_eq!(
            GpuWork::of_name("ncclDevKernel_AllGather_RING_LL(x)"),
            GpuWork::Comm
        );
    }

    #[test]
    fn a_public_gpu_trace_has_gpu_time_under_its_ops() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces/public");
        let (et, kt) = (
            dir.join("param_dlrm_8rank_1.0.1/rank0.et.json.gz"),
            dir.join("param_dlrm_8rank_1.0.1/rank0.kineto.json.gz"),
        );
        if !et.exists() {
            eprintln!("skipped: {} is missing", et.display());
            return;
        }
        let t = et_schema::read_trace(&et).unwrap();
        let k = et_schema::kineto::read_kineto(&kt).unwrap();
        let g = crate::Graph::new(&t);
        let set = g.replay_set(None);
        let l = crate::link(&g, &set, &k).unwrap();
        let (a, per_op) = original_gpu(&l, &k);
        assert_eq!(per_op.len(), set.ops.len());
        assert!(a.events > 0 && a.busy_us > 0.0, "{a:?}");
        assert!(a.busy_us <= a.span_us + 1e-6);
        // DLRM's all_to_all and allreduce run NCCL kernels.
        assert!(a.comm_us > 0.0, "{a:?}");
        let launched: f64 = per_op.iter().flatten().sum();
        assert!((launched - (a.compute_us + a.comm_us + a.memcpy_us + a.memset_us)).abs() < 1e-6);
    }
}
