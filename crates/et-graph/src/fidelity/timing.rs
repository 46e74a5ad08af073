//! The original run's timing along the replay set: each op's duration and the gap before it,
//! from one iteration or the least over several alike.

use crate::graph::{Graph, ReplaySet};
use crate::link::{link, Link};
use et_schema::kineto::KinetoTrace;

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
    /// The `ProfilerStep#N` iterations these figures are typical of ([`typical_timing`]):
    /// empty for one iteration's own timing.
    pub iterations: Vec<u64>,
}

/// Durations and gaps of the original run along the replay set's execution order.
pub fn original_timing(l: &Link, k: &KinetoTrace) -> OriginalTiming {
    let mut out = OriginalTiming {
        op_us: Vec::with_capacity(l.event_of.len()),
        gap_us: Vec::with_capacity(l.event_of.len()),
        span_us: 0.0,
        iterations: Vec::new(),
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

/// The original's timing typical of the trace's iterations like the one `set` holds.
///
/// A capture is one sample of each gap and op: the first profiled iteration carries the
/// instrumentation's one-time costs, a busy host's stalls fall where they fell, and a VM's
/// speed moves in spells of 100-200 ms. A trace of several `ProfilerStep#N` iterations (a
/// profiler schedule with `active` > 1) holds more samples: where `set` is one of them, every
/// other iteration that ran the same ops (names in the same order) and links as fully is
/// linked too, and each op's duration and each gap is the least over them ([`least`]). Every
/// sample is the work's own time plus what interfered with it (a time slice another process
/// took, a slow spell, the profiler's buffers), never less, so the least estimates the work's
/// own time, for gaps and ops alike; the host's speed is then measured against op times of
/// the same kind.
///
/// A Kineto trace taken without the execution trace observer links by order
/// ([`crate::link::link_steps`]): each of its `ProfilerStep#N` iterations that links as fully
/// as any is a sample, whatever the ET holds. With one iteration (or several chosen),
/// `original_timing` of `l`.
pub fn typical_timing(g: &Graph, set: &ReplaySet, k: &KinetoTrace, l: &Link) -> OriginalTiming {
    let own = original_timing(l, k);
    if l.method == crate::link::Method::Alignment {
        let steps = crate::link::link_steps(g, set, k);
        if steps.len() < 2 {
            return own;
        }
        let like: Vec<(u64, OriginalTiming)> = steps
            .iter()
            .map(|(n, ls)| (*n, original_timing(ls, k)))
            .collect();
        return typical_of(like, set.ops.len());
    }
    let [(_, chosen)] = g.iterations_of(set)[..] else {
        return own;
    };
    let names: Vec<&str> = set.ops.iter().map(|&i| g.name(i)).collect();
    let mut like = vec![(chosen, own)];
    for (_, n) in g.iterations() {
        if n == chosen {
            continue;
        }
        let s = g.replay_set(Some(&[n]));
        if s.ops.len() != names.len() || s.ops.iter().zip(&names).any(|(&i, m)| g.name(i) != *m) {
            continue;
        }
        let Ok(ls) = link(g, &s, k) else { continue };
        if ls.linked() < l.linked() || ls.span.is_some() != l.span.is_some() {
            continue;
        }
        like.push((n, original_timing(&ls, k)));
    }
    if let [(_, own)] = &mut like[..] {
        return std::mem::take(own);
    }
    typical_of(like, names.len())
}

/// The least, op by op and gap by gap, of several iterations' timings of the same
/// `n` ops.
fn typical_of(mut like: Vec<(u64, OriginalTiming)>, n: usize) -> OriginalTiming {
    like.sort_by_key(|x| x.0);
    let timings: Vec<&OriginalTiming> = like.iter().map(|x| &x.1).collect();
    OriginalTiming {
        op_us: (0..n)
            .map(|p| least(timings.iter().filter_map(|t| t.op_us[p])))
            .collect(),
        gap_us: (0..n)
            .map(|p| least(timings.iter().map(|t| t.gap_us[p])).unwrap_or(0.0))
            .collect(),
        span_us: least(timings.iter().map(|t| t.span_us)).unwrap_or(0.0),
        iterations: like.iter().map(|x| x.0).collect(),
    }
}

/// The least of the finite values; `None` without any.
pub fn least(v: impl IntoIterator<Item = f64>) -> Option<f64> {
    v.into_iter()
        .filter(|x| x.is_finite())
        .min_by(f64::total_cmp)
}
