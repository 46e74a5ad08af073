//! Linking ET nodes to the Kineto events of the same run: durations, threads, GPU kernels.
//!
//! Exact join on `Record function id` (ET `rf_id`) when Kineto has it; otherwise on
//! `External id`; otherwise an order-preserving alignment of op names per thread, which links
//! traces whose ids are offset (older PyTorch). A Kineto file of another iteration or process is
//! reported, not mislinked.

use crate::class::OpClass;
use crate::graph::{Graph, ReplaySet};
use et_schema::kineto::{Category, KinetoTrace, Lane};
use std::collections::HashMap;

/// Why an ET and a Kineto trace do not link: they are not of the same run. `et` and `kineto`
/// name the two files.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// Record function ids that do not match: another iteration or process.
    #[error("the Kineto trace {kineto} has record function ids, but only {matched} of {total} ET ops match one by id and name: it was captured in another iteration or process than {et} ({})", if std::path::Path::new(et).file_name().is_some_and(|f| f.to_string_lossy().contains(".linked.")) { "is it this trace's profile?" } else { "a profile taken with the observer pairs with the ET captured with it, NAME.linked.et.json, not the clean NAME.et.json" })]
    OtherIteration {
        /// The ET.
        et: String,
        /// The Kineto trace.
        kineto: String,
        /// ET ops matched by id and name.
        matched: usize,
        /// ET ops to link.
        total: usize,
    },
    /// The two traces record different ranks.
    #[error("the Kineto trace {kineto} is rank {kineto_rank}'s, the ET {et} rank {et_rank}'s{}: not the same process", if *by_name { " (by its file name)" } else { "" })]
    OtherRank {
        /// The ET.
        et: String,
        /// The Kineto trace.
        kineto: String,
        /// The ET's rank.
        et_rank: u64,
        /// The Kineto trace's rank.
        kineto_rank: i64,
        /// The ET's rank is the one its file name gives (`NAME.rankR.et.json`), as it records
        /// none.
        by_name: bool,
    },
    /// The two traces record different process ids.
    #[error("the Kineto trace {kineto} was recorded by process {kineto_pid}, the ET {et} by process {et_pid}: not the same run (without record function ids, as in a profile taken without the execution trace observer, only op order and names link them, which holds within one process: capture the ET and the profile in the same process)")]
    OtherProcess {
        /// The ET.
        et: String,
        /// The Kineto trace.
        kineto: String,
        /// The ET's process id.
        et_pid: i64,
        /// The Kineto trace's process id.
        kineto_pid: i64,
    },
    /// Too few ops align by name and order.
    #[error("the Kineto trace {kineto} shares no op sequence with {et} (linked {linked} of {total}): not the same run")]
    Unrelated {
        /// The ET.
        et: String,
        /// The Kineto trace.
        kineto: String,
        /// ET ops linked.
        linked: usize,
        /// ET ops to link.
        total: usize,
    },
}

/// How a [`Link`] was made.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Method {
    /// An exact join on the record function id (ET `rf_id`, Kineto `Record function id`).
    RecordFunctionId,
    /// An exact join on Kineto's `External id`.
    ExternalId,
    /// An order-preserving alignment of op names per thread.
    Alignment,
}

/// A GPU event of the iteration launched outside every linked op's span.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffOpGpu {
    /// The GPU event (kernel, memcpy, memset).
    pub event: u32,
    /// The innermost CPU event (op or annotation) whose span holds the runtime call that
    /// launched it; `None` where no CPU event holds it.
    pub launched_under: Option<u32>,
    /// The replay-set op (by position) it is attributed to: of the CPU events holding the
    /// launch, innermost first, the first that holds linked ops of the same thread gives it
    /// to the last of them to start before the launch (else the first after it). `None`
    /// where no event holding the launch holds a linked op (the step annotation aside).
    pub attributed_to: Option<usize>,
}

/// The result: for each replay-set op (by position), its Kineto event index.
#[derive(Clone, Debug)]
pub struct Link {
    /// How the link was made.
    pub method: Method,
    /// Each replay-set op's Kineto event; `None` where unlinked.
    pub event_of: Vec<Option<u32>>,
    /// GPU events (kernels, memcpy, memset) launched under each linked op, via correlation.
    pub gpu_events: Vec<Vec<u32>>,
    /// The iteration's other GPU events: launched outside every linked op's span (under an
    /// annotation or an op the replay does not run, such as a custom autograd function's
    /// extension kernel), each attributed where it can be to a replayed op.
    pub gpu_off_op: Vec<OffOpGpu>,
    /// The captured iteration's extent on the Kineto clock (µs): from the first to the end of
    /// the last event of any ET node (annotations such as `Optimizer.zero_grad` included), or,
    /// where the set holds some of the trace's several `ProfilerStep#N` iterations, of those
    /// steps. Known when linked by record function ids.
    pub span: Option<(f64, f64)>,
    /// Non-fatal findings (process ids that differ where record function ids still link).
    pub warnings: Vec<String>,
}

impl Link {
    /// Ops linked to an event.
    pub fn linked(&self) -> usize {
        self.event_of.iter().filter(|e| e.is_some()).count()
    }

    /// The fraction of ops linked (1 for an empty set).
    pub fn fraction(&self) -> f64 {
        if self.event_of.is_empty() {
            1.0
        } else {
            self.linked() as f64 / self.event_of.len() as f64
        }
    }

    /// Each replay-set op's GPU events: those launched under it and those attributed to it.
    pub fn gpu_events_attributed(&self) -> Vec<Vec<u32>> {
        let mut v = self.gpu_events.clone();
        for o in &self.gpu_off_op {
            if let Some(p) = o.attributed_to {
                v[p].push(o.event);
            }
        }
        v
    }
}

pub(crate) fn is_cpu_event(k: &KinetoTrace, i: usize) -> bool {
    let e = &k.events[i];
    e.ph == b'X' && matches!(e.cat, Category::CpuOp | Category::UserAnnotation)
}

/// Links a replay set to a Kineto trace.
pub fn link(g: &Graph, set: &ReplaySet, k: &KinetoTrace) -> Result<Link, LinkError> {
    let t = g.trace;
    let cpu: Vec<usize> = (0..k.events.len())
        .filter(|&i| is_cpu_event(k, i))
        .collect();
    let total = set.ops.len();
    let mut warnings = Vec::new();
    // Every rank runs the same code: another rank's Kineto trace matches record function ids
    // and names one for one, so the recorded ranks must agree.
    // An ET that records no rank has it in its file name where it is one of a job's
    // (`NAME.rankR.et.json`, `rankR.et.json`): only a number the name calls a rank, not one
    // that may be a version.
    let recorded = crate::summary::recorded_rank(t);
    let et_rank = recorded.map(|r| (r, false)).or_else(|| {
        crate::summary::rank_in_name(std::path::Path::new(&t.source))
            .filter(|&(_, said)| said)
            .map(|(r, _)| (r, true))
    });
    if let (Some((et_rank, by_name)), Some(kineto_rank)) = (et_rank, k.rank) {
        if et_rank as i64 != kineto_rank {
            return Err(LinkError::OtherRank {
                et: t.source.clone(),
                kineto: k.source.clone(),
                et_rank,
                kineto_rank,
                by_name,
            });
        }
    }
    let pid_mismatch = match (t.meta.pid, k.main_pid()) {
        (Some(p), Some(kp)) if p != kp => Some((p, kp)),
        _ => None,
    };
    // 1. Exact join on an id, checked by name.
    let try_ids = |get: &dyn Fn(usize) -> Option<u64>| -> (Vec<Option<u32>>, usize) {
        let mut by_id: HashMap<u64, usize> = HashMap::new();
        for &i in &cpu {
            if let Some(id) = get(i) {
                by_id.entry(id).or_insert(i);
            }
        }
        let mut out = vec![None; total];
        let mut n = 0;
        for (pos, &op) in set.ops.iter().enumerate() {
            let node = &t.nodes[op as usize];
            if let Some(e) = node.rf_id.and_then(|r| by_id.get(&r)) {
                if k.str(k.events[*e].name) == t.name(node) {
                    out[pos] = Some(*e as u32);
                    n += 1;
                }
            }
        }
        (out, n)
    };
    let has_rf = cpu
        .iter()
        .any(|&i| k.events[i].record_function_id.is_some());
    let (event_of, method) = if has_rf {
        let (out, n) = try_ids(&|i| k.events[i].record_function_id);
        if total > 0 && n * 2 < total {
            return Err(LinkError::OtherIteration {
                et: t.source.clone(),
                kineto: k.source.clone(),
                matched: n,
                total,
            });
        }
        if let Some((p, kp)) = pid_mismatch {
            warnings.push(format!(
                "ET pid {p} differs from the Kineto pid {kp}; linked by record function ids"
            ));
        }
        (out, Method::RecordFunctionId)
    } else {
        // Without record function ids only names and order can link: a trace of another
        // process would be mislinked by name, so the pids must agree.
        if let Some((et_pid, kineto_pid)) = pid_mismatch {
            return Err(LinkError::OtherProcess {
                et: t.source.clone(),
                kineto: k.source.clone(),
                et_pid,
                kineto_pid,
            });
        }
        let (out, n) = try_ids(&|i| k.events[i].external_id);
        if total > 0 && n * 10 >= total * 9 {
            (out, Method::ExternalId)
        } else {
            let out = align(g, set, k, &cpu);
            let n = out.iter().filter(|e| e.is_some()).count();
            if total > 0 && n * 2 < total {
                return Err(LinkError::Unrelated {
                    et: t.source.clone(),
                    kineto: k.source.clone(),
                    linked: n,
                    total,
                });
            }
            (out, Method::Alignment)
        }
    };
    // The iteration is what the ET recorded: every node with a record function id, not only
    // the replayed ops, bounds it (the optimizer's zero_grad before the first op, its step
    // after the last).
    // With some of several `ProfilerStep#N` iterations chosen, it is theirs: the steps holding
    // the set's ops (their events span everything the steps ran, loop and optimizer included).
    let all_steps = g.iterations().len();
    let chosen = g.iterations_of(set);
    let span = (method == Method::RecordFunctionId)
        .then(|| {
            let ids: std::collections::HashSet<u64> =
                if !chosen.is_empty() && chosen.len() < all_steps {
                    chosen
                        .iter()
                        .filter_map(|&(i, _)| t.nodes[i as usize].rf_id)
                        .collect()
                } else {
                    t.nodes.iter().filter_map(|n| n.rf_id).collect()
                };
            let (mut a, mut b) = (f64::INFINITY, f64::NEG_INFINITY);
            for &i in &cpu {
                let e = &k.events[i];
                if e.record_function_id.is_some_and(|r| ids.contains(&r)) {
                    a = a.min(e.ts);
                    b = b.max(e.ts + e.dur);
                }
            }
            (a < b).then_some((a, b))
        })
        .flatten();
    let window = Window::of(k, &event_of, span);
    let (gpu_events, gpu_off_op) = gpu_of(k, &event_of, &window);
    Ok(Link {
        method,
        event_of,
        gpu_events,
        gpu_off_op,
        span,
        warnings,
    })
}

/// The part of the trace whose GPU launches count as the iteration's.
enum Window {
    /// One extent for every thread: the iteration the record function ids bound, or the
    /// `ProfilerStep#N` steps holding the linked ops.
    All(f64, f64),
    /// Per thread, from its first linked op's start to its last one's end: a trace of many
    /// unmarked iterations, each thread linked by order to a stretch of its own. Only launches
    /// under an event that holds linked ops count: the ops between are not all the ET's.
    PerThread(HashMap<Lane, (f64, f64)>),
}

impl Window {
    fn of(k: &KinetoTrace, event_of: &[Option<u32>], span: Option<(f64, f64)>) -> Window {
        if let Some((a, b)) = span {
            return Window::All(a, b);
        }
        let mut lanes: HashMap<Lane, (f64, f64)> = HashMap::new();
        for &e in event_of.iter().flatten() {
            let e = &k.events[e as usize];
            let w = lanes
                .entry(e.tid)
                .or_insert((f64::INFINITY, f64::NEG_INFINITY));
            w.0 = w.0.min(e.ts);
            w.1 = w.1.max(e.ts + e.dur);
        }
        let (a, b) = lanes
            .values()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(x, y), w| {
                (x.min(w.0), y.max(w.1))
            });
        let steps: Vec<(f64, f64)> = profiler_steps(k)
            .into_iter()
            .filter(|&(_, s, t)| s < b && t > a)
            .map(|(_, s, t)| (s, t))
            .collect();
        if steps.is_empty() {
            Window::PerThread(lanes)
        } else {
            let (a, b) = steps
                .iter()
                .fold((a, b), |(x, y), &(s, t)| (x.min(s), y.max(t)));
            Window::All(a, b)
        }
    }

    fn holds(&self, lane: &Lane, ts: f64) -> bool {
        match self {
            Window::All(a, b) => (*a..=*b).contains(&ts),
            Window::PerThread(m) => m.get(lane).is_some_and(|(a, b)| (*a..=*b).contains(&ts)),
        }
    }
}

/// GPU events (kernels, memcpy, memset) by the runtime calls that launched them: those under
/// each linked op's time span and thread, and the window's others ([`OffOpGpu`]).
fn gpu_of(
    k: &KinetoTrace,
    event_of: &[Option<u32>],
    window: &Window,
) -> (Vec<Vec<u32>>, Vec<OffOpGpu>) {
    let mut by_corr: HashMap<u64, Vec<u32>> = HashMap::new();
    for (i, e) in k.events.iter().enumerate() {
        if matches!(
            e.cat,
            Category::Kernel | Category::GpuMemcpy | Category::GpuMemset
        ) {
            if let Some(c) = e.correlation {
                by_corr.entry(c).or_default().push(i as u32);
            }
        }
    }
    if by_corr.is_empty() {
        return (vec![vec![]; event_of.len()], vec![]);
    }
    let mut runtime: HashMap<Lane, Vec<usize>> = HashMap::new();
    for (i, e) in k.events.iter().enumerate() {
        if matches!(e.cat, Category::CudaRuntime | Category::CudaDriver) {
            runtime.entry(e.tid).or_default().push(i);
        }
    }
    for v in runtime.values_mut() {
        v.sort_by(|&a, &b| k.events[a].ts.total_cmp(&k.events[b].ts));
    }
    let launched = |r: usize| {
        k.events[r]
            .correlation
            .and_then(|c| by_corr.get(&c))
            .into_iter()
            .flatten()
            .copied()
    };
    let under: Vec<Vec<u32>> = event_of
        .iter()
        .map(|e| {
            let Some(e) = e else { return vec![] };
            let ev = &k.events[*e as usize];
            let Some(rt) = runtime.get(&ev.tid) else {
                return vec![];
            };
            let start = rt.partition_point(|&r| k.events[r].ts < ev.ts);
            rt[start..]
                .iter()
                .take_while(|&&r| k.events[r].ts <= ev.ts + ev.dur)
                .flat_map(|&r| launched(r))
                .collect()
        })
        .collect();
    let seen: std::collections::HashSet<u32> = under.iter().flatten().copied().collect();
    // Built at the first launch outside the linked ops: a trace whose launches all fall under
    // them (most GPU traces, each of a multi-step profile's steps) sorts no CPU events for it.
    let mut nest: Option<Nesting> = None;
    // Linked ops by thread, in start order: (start, position).
    let mut linked: HashMap<Lane, Vec<(f64, usize)>> = HashMap::new();
    for (pos, e) in event_of.iter().enumerate() {
        if let Some(e) = e {
            let ev = &k.events[*e as usize];
            linked.entry(ev.tid).or_default().push((ev.ts, pos));
        }
    }
    for v in linked.values_mut() {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    let mut off = Vec::new();
    let mut lanes: Vec<&Lane> = runtime.keys().collect();
    lanes.sort_by_key(|l| format!("{l:?}"));
    for lane in lanes {
        for &r in &runtime[lane] {
            let ts = k.events[r].ts;
            if !window.holds(lane, ts) {
                continue;
            }
            let mut evs = launched(r).filter(|g| !seen.contains(g)).peekable();
            if evs.peek().is_none() {
                continue;
            }
            let holders = nest
                .get_or_insert_with(|| Nesting::new(k))
                .holding(k, lane, ts);
            let attributed_to = holders
                .iter()
                .take_while(|&&h| !k.str(k.events[h].name).starts_with("ProfilerStep#"))
                .find_map(|&h| {
                    let (a, b) = (k.events[h].ts, k.events[h].ts + k.events[h].dur);
                    let ops = linked.get(lane)?;
                    let before = ops.partition_point(|o| o.0 <= ts);
                    let last = before.checked_sub(1).map(|i| ops[i]).filter(|o| o.0 >= a);
                    let next = ops.get(before).copied().filter(|o| o.0 <= b);
                    last.or(next).map(|o| o.1)
                });
            // Without a bound on the iteration (a trace of unmarked iterations, linked by order)
            // a launch under no event holding linked ops may be another iteration's.
            if attributed_to.is_none() && matches!(window, Window::PerThread(_)) {
                continue;
            }
            for event in evs {
                off.push(OffOpGpu {
                    event,
                    launched_under: holders.first().map(|&h| h as u32),
                    attributed_to,
                });
            }
        }
    }
    (under, off)
}

/// CPU events (ops and annotations) per thread in start order, each with the event that holds
/// it: the nesting Kineto's spans imply.
struct Nesting {
    by_lane: HashMap<Lane, (Vec<usize>, Vec<Option<usize>>)>,
}

impl Nesting {
    fn new(k: &KinetoTrace) -> Nesting {
        let mut by_lane: HashMap<Lane, Vec<usize>> = HashMap::new();
        for i in 0..k.events.len() {
            if is_cpu_event(k, i) {
                by_lane.entry(k.events[i].tid).or_default().push(i);
            }
        }
        let by_lane = by_lane
            .into_iter()
            .map(|(lane, mut v)| {
                // Start order; of two starting together the longer holds the other.
                v.sort_by(|&a, &b| {
                    let (x, y) = (&k.events[a], &k.events[b]);
                    x.ts.total_cmp(&y.ts).then(y.dur.total_cmp(&x.dur))
                });
                let mut parent = vec![None; v.len()];
                let mut stack: Vec<usize> = Vec::new();
                for j in 0..v.len() {
                    let e = &k.events[v[j]];
                    while let Some(&top) = stack.last() {
                        let t = &k.events[v[top]];
                        if e.ts >= t.ts + t.dur {
                            stack.pop();
                        } else {
                            break;
                        }
                    }
                    parent[j] = stack.last().copied();
                    stack.push(j);
                }
                (lane, (v, parent))
            })
            .collect();
        Nesting { by_lane }
    }

    /// The events of `lane` whose span holds `ts`, innermost first.
    fn holding(&self, k: &KinetoTrace, lane: &Lane, ts: f64) -> Vec<usize> {
        let Some((v, parent)) = self.by_lane.get(lane) else {
            return vec![];
        };
        let mut j = v.partition_point(|&i| k.events[i].ts <= ts).checked_sub(1);
        let mut out = Vec::new();
        while let Some(i) = j {
            let e = &k.events[v[i]];
            if e.ts + e.dur >= ts {
                out.push(v[i]);
            }
            j = parent[i];
        }
        out
    }
}

/// The `ProfilerStep#N` annotations of a Kineto trace, in time order: (N, start, end) in µs.
pub fn profiler_steps(k: &KinetoTrace) -> Vec<(u64, f64, f64)> {
    let mut v: Vec<(u64, f64, f64)> = (0..k.events.len())
        .filter(|&i| is_cpu_event(k, i))
        .filter_map(|i| {
            let e = &k.events[i];
            let n = k.str(e.name).strip_prefix("ProfilerStep#")?.parse().ok()?;
            Some((n, e.ts, e.ts + e.dur))
        })
        .collect();
    v.sort_by(|a, b| a.1.total_cmp(&b.1));
    v
}

/// Links `set` to each `ProfilerStep#N` iteration of `k` on its own, by order and name (N and
/// the link, whose span is the step's extent), for a Kineto trace that cannot link by record
/// function ids: a profile taken without the execution trace observer (the ET captured in an
/// iteration of its own) holds several iterations of the same ops, and each is one sample of
/// the original's timing. Steps that link fewer ops than the best one are left out. Empty
/// where the trace has no steps, links by ids, or the pids differ.
pub fn link_steps(g: &Graph, set: &ReplaySet, k: &KinetoTrace) -> Vec<(u64, Link)> {
    if k.execution_trace_observer == Some(true) {
        return Vec::new();
    }
    if let (Some(p), Some(kp)) = (g.trace.meta.pid, k.main_pid()) {
        if p != kp {
            return Vec::new();
        }
    }
    let cpu: Vec<usize> = (0..k.events.len())
        .filter(|&i| is_cpu_event(k, i))
        .collect();
    let mut out: Vec<(u64, Link)> = profiler_steps(k)
        .into_iter()
        .map(|(n, a, b)| {
            let inside: Vec<usize> = cpu
                .iter()
                .copied()
                .filter(|&i| {
                    let e = &k.events[i];
                    e.ts >= a && e.ts + e.dur <= b && !k.str(e.name).starts_with("ProfilerStep#")
                })
                .collect();
            let event_of = align(g, set, k, &inside);
            let (gpu_events, gpu_off_op) = gpu_of(k, &event_of, &Window::All(a, b));
            (
                n,
                Link {
                    method: Method::Alignment,
                    event_of,
                    gpu_events,
                    gpu_off_op,
                    span: Some((a, b)),
                    warnings: Vec::new(),
                },
            )
        })
        .collect();
    let best = out.iter().map(|(_, l)| l.linked()).max().unwrap_or(0);
    // Half the set at least, as `link` asks of an alignment.
    out.retain(|(_, l)| l.linked() == best && best * 2 >= set.ops.len() && best > 0);
    out
}

/// [`link`] for timing: where the trace links by order and holds several `ProfilerStep#N`
/// iterations ([`link_steps`]), the middle one of those that link as fully as any, with its
/// step's extent as the span; else [`link`]'s.
pub fn timing_link(g: &Graph, set: &ReplaySet, k: &KinetoTrace) -> Result<Link, LinkError> {
    let l = link(g, set, k)?;
    if l.method != Method::Alignment {
        return Ok(l);
    }
    let mut steps = link_steps(g, set, k);
    if steps.is_empty() {
        return Ok(l);
    }
    let mid = steps.len() / 2;
    let (n, mut chosen) = steps.swap_remove(mid);
    chosen.warnings = l.warnings;
    // Names in order link a trace to any profile that begins with its ops (an inference
    // step's to its training step's): a step holding far more events than the trace has
    // nodes is most likely another model's or another step's.
    if let Some((a, b)) = chosen.span {
        let events = (0..k.events.len())
            .filter(|&i| is_cpu_event(k, i))
            .filter(|&i| {
                let e = &k.events[i];
                e.ts >= a && e.ts + e.dur <= b && !k.str(e.name).starts_with("ProfilerStep#")
            })
            .count();
        let nodes = g
            .order
            .iter()
            .filter(|&&i| !g.class[i as usize].contains(OpClass::ROOT))
            .count();
        if events > 2 * nodes && events - nodes >= 10 {
            chosen.warnings.push(format!(
                "{}'s ProfilerStep#{n} holds {events} events where {} has {nodes} nodes: is it \
                 this trace's profile? Its ops were linked by name and order, and their times \
                 may be another step's",
                k.source, g.trace.source
            ));
        }
    }
    Ok(chosen)
}

/// Order-preserving alignment by name, per thread. ET threads are paired with the Kineto
/// thread whose name sequence matches them best.
fn align(g: &Graph, set: &ReplaySet, k: &KinetoTrace, cpu: &[usize]) -> Vec<Option<u32>> {
    let t = g.trace;
    // All ET nodes that Kineto would record (ops and annotations), by ET thread, in order.
    let mut et_threads: HashMap<u64, Vec<u32>> = HashMap::new();
    for &i in &g.order {
        let c = g.class[i as usize];
        if c.contains(OpClass::ROOT) {
            continue;
        }
        et_threads
            .entry(t.nodes[i as usize].tid.unwrap_or(0))
            .or_default()
            .push(i);
    }
    let mut k_threads: HashMap<Lane, Vec<usize>> = HashMap::new();
    for &i in cpu {
        k_threads.entry(k.events[i].tid).or_default().push(i);
    }
    for v in k_threads.values_mut() {
        // Parents before children: by start time, longer first.
        v.sort_by(|&a, &b| {
            k.events[a]
                .ts
                .total_cmp(&k.events[b].ts)
                .then(k.events[b].dur.total_cmp(&k.events[a].dur))
        });
    }
    let mut node_event: HashMap<u32, u32> = HashMap::new();
    let mut used_k: Vec<Lane> = Vec::new();
    // The thread that began the iteration first, then the others, largest first. Where the
    // first one's ops were found anchors the others: they ran after it began (autograd's
    // thread runs the backward between the forward and the optimizer), so of their
    // iterations in a profile of many, the first at or after it is theirs.
    let first_tid = g
        .order
        .iter()
        .find(|&&i| !g.class[i as usize].contains(OpClass::ROOT))
        .map(|&i| t.nodes[i as usize].tid.unwrap_or(0));
    let mut et_list: Vec<(&u64, &Vec<u32>)> = et_threads.iter().collect();
    et_list.sort_by_key(|(tid, v)| (Some(**tid) != first_tid, std::cmp::Reverse(v.len()), **tid));
    let mut near: Option<f64> = None;
    for (_, nodes) in et_list {
        // (matched count, Kineto thread, node -> event pairs)
        type Best = (usize, Lane, Vec<(u32, u32)>);
        let mut best: Option<Best> = None;
        for (lane, evs) in &k_threads {
            if used_k.contains(lane) {
                continue;
            }
            let pairs = greedy(g, nodes, k, evs, near);
            if best.as_ref().is_none_or(|b| pairs.len() > b.0) {
                best = Some((pairs.len(), *lane, pairs));
            }
        }
        if let Some((n, lane, pairs)) = best {
            if n > 0 {
                used_k.push(lane);
                near = near.or_else(|| {
                    pairs
                        .iter()
                        .map(|&(_, e)| k.events[e as usize].ts)
                        .min_by(f64::total_cmp)
                });
                node_event.extend(pairs);
            }
        }
    }
    set.ops
        .iter()
        .map(|op| node_event.get(op).copied())
        .collect()
}

/// Greedy in-order matching with a bounded look-ahead, from the best starting event: a Kineto
/// trace may hold several iterations and the ET only one, or start mid-iteration. Of the starts
/// that match the most, the first at or after `near` (µs) where given, else the one whose
/// matches span the fewest events: from an iteration that lacks one of the ET's ops, the
/// look-ahead takes it from the next iteration and carries on there, matching as many over a
/// longer stretch. The matches are then kept to one stretch of the lane ([`one_stretch`]).
fn greedy(
    g: &Graph,
    nodes: &[u32],
    k: &KinetoTrace,
    evs: &[usize],
    near: Option<f64>,
) -> Vec<(u32, u32)> {
    const WINDOW: usize = 64;
    const MAX_STARTS: usize = 4096;
    // Compare interned ids, not strings: names absent from Kineto can never match.
    let want: Vec<Option<et_schema::Sym>> =
        nodes.iter().map(|&n| k.strings.lookup(g.name(n))).collect();
    let have: Vec<et_schema::Sym> = evs.iter().map(|&e| k.events[e].name).collect();
    // Pairs of (index into `nodes`, position in `evs`); returns the count and the position
    // after the last match.
    let run = |start: usize, out: Option<&mut Vec<(usize, usize)>>| -> (usize, usize) {
        let mut j = start;
        let mut count = 0;
        let mut out = out;
        for (n, w) in want.iter().enumerate() {
            if j >= have.len() {
                break;
            }
            let Some(w) = w else { continue };
            if let Some(off) = have[j..].iter().take(WINDOW).position(|h| h == w) {
                if let Some(o) = out.as_deref_mut() {
                    o.push((n, j + off));
                }
                count += 1;
                j += off + 1;
            }
        }
        (count, j)
    };
    // Where the runs may start: at or after `near` (the anchor thread's iteration), else
    // anywhere (the lane's events are in time order).
    let from = near.map_or(0, |t| evs.partition_point(|&e| k.events[e].ts < t));
    let mut best = (run(from, None).0, from);
    // The first of the thread's names this lane holds.
    let first = want.iter().flatten().find(|w| have[from..].contains(w));
    if let Some(f) = first {
        // (count, span, start)
        let starts: Vec<(usize, usize, usize)> = (from..have.len())
            .filter(|&p| have[p] == *f)
            .take(MAX_STARTS)
            .map(|p| {
                let (c, end) = run(p, None);
                (c, end - p, p)
            })
            .collect();
        let most = starts.iter().map(|s| s.0).max().unwrap_or(0);
        let mut most_of = starts.iter().filter(|s| s.0 == most);
        // Every start is at or after `near` already: the first of them where it is given.
        let chosen = if near.is_some() {
            most_of.next()
        } else {
            most_of.min_by_key(|s| s.1)
        };
        if let Some(&(c, _, p)) = chosen.filter(|s| s.0 >= best.0) {
            best = (c, p);
        }
    }
    // Refine with an exact longest-common-subsequence alignment over a window of events from
    // the best start: it recovers from runs that the greedy look-ahead cannot skip. First over
    // about one iteration's events (the thread's nodes and a margin for events the ET does not
    // record): over a wider window, a profile of many unmarked iterations lets it take an op
    // the iteration at the start lacks from the next one, and the next from the one after,
    // and the ops linked then span several iterations. The wider window only where the narrow
    // one links fewer than the greedy run (a profile with many more events than the ET has
    // nodes). Each kept to one stretch ([`one_stretch`]) before they are compared.
    let lo = best.1;
    let window = |len: usize| {
        let hi = (lo + len).min(have.len());
        ((hi - lo) * nodes.len() <= 64 << 20).then(|| {
            let mut p: Vec<(usize, usize)> = lcs(&want, &have[lo..hi])
                .into_iter()
                .map(|(a, b)| (a, lo + b))
                .collect();
            one_stretch(&mut p);
            p
        })
    };
    let mut greedy_run = Vec::with_capacity(best.0);
    run(best.1, Some(&mut greedy_run));
    one_stretch(&mut greedy_run);
    let mut out = greedy_run;
    for len in [nodes.len() + nodes.len() / 4 + 64, nodes.len() * 2 + 256] {
        if let Some(p) = window(len).filter(|p| p.len() > out.len()) {
            out = p;
            break;
        }
    }
    if out.is_empty() && near.is_some() {
        // Nothing of this lane at or after the anchor: the lane's own best, wherever it is.
        return greedy(g, nodes, k, evs, None);
    }
    out.into_iter()
        .map(|(a, b)| (nodes[a], evs[b] as u32))
        .collect()
}

/// Keeps, of in-order matches (node index, event position), the longest run in which no two
/// consecutive matches have more than [`STRETCH_GAP`] unmatched events between them. The
/// look-ahead and the alignment may take an op that the iteration at hand lacks from the next
/// iteration of a profile of many, and carry on there: the ops linked then span iterations,
/// and their times and GPU work mix them. A gap of hundreds of unmatched events is such a
/// jump, not one iteration's events the ET did not record.
fn one_stretch(pairs: &mut Vec<(usize, usize)>) {
    let mut best = (0, 0);
    let mut start = 0;
    for i in 1..=pairs.len() {
        if i == pairs.len() || pairs[i].1 - pairs[i - 1].1 > STRETCH_GAP + 1 {
            if i - start > best.1 - best.0 {
                best = (start, i);
            }
            start = i;
        }
    }
    pairs.truncate(best.1);
    pairs.drain(..best.0);
}

/// The most unmatched events between two consecutive matches of one stretch: four times the
/// greedy look-ahead.
const STRETCH_GAP: usize = 256;

/// Longest common subsequence of two id sequences: matched index pairs, in order.
fn lcs(a: &[Option<et_schema::Sym>], b: &[et_schema::Sym]) -> Vec<(usize, usize)> {
    let (n, m) = (a.len(), b.len());
    let w = m + 1;
    let mut dp = vec![0u32; (n + 1) * w];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            dp[i * w + j] = if a[i] == Some(b[j]) {
                dp[(i + 1) * w + j + 1] + 1
            } else {
                dp[(i + 1) * w + j].max(dp[i * w + j + 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < n && j < m {
        if a[i] == Some(b[j]) {
            out.push((i, j));
            i += 1;
            j += 1;
        } else if dp[(i + 1) * w + j] >= dp[i * w + j + 1] {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Matches that jump hundreds of unmatched events (into the next iteration of a profile of
    /// many) keep the longer stretch; matches close together are kept whole.
    #[test]
    fn matches_are_kept_to_their_longest_stretch() {
        let mut jumped = vec![(0, 5), (1, 600), (2, 610), (3, 615)];
        one_stretch(&mut jumped);
        assert_eq!(jumped, [(1, 600), (2, 610), (3, 615)]);
        // STRETCH_GAP unmatched events between two matches: one stretch; one more: two.
        let mut close = vec![(0, 5), (1, 6 + STRETCH_GAP), (2, 7 + STRETCH_GAP)];
        let whole = close.clone();
        one_stretch(&mut close);
        assert_eq!(close, whole);
        let mut apart = vec![(0, 5), (1, 7 + STRETCH_GAP), (2, 8 + STRETCH_GAP)];
        one_stretch(&mut apart);
        assert_eq!(apart, [(1, 7 + STRETCH_GAP), (2, 8 + STRETCH_GAP)]);
        let mut none: Vec<(usize, usize)> = Vec::new();
        one_stretch(&mut none);
        assert!(none.is_empty());
    }
}
