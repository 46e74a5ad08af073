//! Linking by name and order to a profile of many unmarked iterations: each thread of the ET
//! is linked to the one iteration, not to a stretch of several.

use et_graph::{link, Graph, Method};
use et_schema::kineto::parse_kineto;
use et_schema::testkit::{tensor, TraceBuilder};
use serde_json::json;

const UNARY: &str = "(Tensor self) -> Tensor";

/// An ET of one iteration on two threads: the forward and optimizer on thread 1, the backward
/// on autograd's thread 2.
fn two_threads() -> et_schema::Trace {
    let mut b = TraceBuilder::new();
    for (name, tid) in [
        ("aten::relu", 1),
        ("aten::sigmoid", 1),
        ("aten::tanh", 1),
        ("aten::exp", 2),
        ("aten::log", 2),
        ("aten::neg", 1),
    ] {
        b.op(name, &format!("{name}{UNARY}"))
            .attr("tid", "uint64", tid)
            .input(tensor(1, 1, 0, 8, 4, "cpu"), json!([8]), "Tensor(float)")
            .output(tensor(2, 2, 0, 8, 4, "cpu"), json!([8]), "Tensor(float)")
            .done();
    }
    b.build()
}

/// A profile of three iterations of it, with no ProfilerStep marks and no ids to link by,
/// each iteration 1000 µs long with 20 events of other work between its ops on thread 1; the
/// first iteration's forward lacks its sigmoid (a warm-up path), its backward does not.
fn three_iterations() -> et_schema::kineto::KinetoTrace {
    let mut evs = Vec::new();
    let ev = |name: &str, tid: u64, ts: f64| {
        json!({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts,
               "dur": 1.0})
    };
    for it in 0..3 {
        let t0 = 1000.0 * it as f64;
        evs.push(ev("aten::relu", 1, t0));
        if it > 0 {
            evs.push(ev("aten::sigmoid", 1, t0 + 10.0));
        }
        evs.push(ev("aten::tanh", 1, t0 + 20.0));
        evs.push(ev("aten::exp", 2, t0 + 300.0));
        evs.push(ev("aten::log", 2, t0 + 310.0));
        for f in 0..20 {
            evs.push(ev("aten::empty", 1, t0 + 400.0 + f as f64));
        }
        evs.push(ev("aten::neg", 1, t0 + 900.0));
    }
    parse_kineto(
        json!({ "traceEvents": evs }).to_string().as_bytes(),
        "k.json",
    )
    .unwrap()
}

#[test]
fn every_thread_links_to_the_iteration_that_holds_all_its_ops() {
    let (t, k) = (two_threads(), three_iterations());
    let g = Graph::new(&t);
    let set = g.replay_set(None);
    assert_eq!(set.ops.len(), 6);
    let l = link(&g, &set, &k).unwrap();
    assert_eq!(l.method, Method::Alignment);
    assert_eq!(l.linked(), 6);
    // The first iteration lacks the sigmoid: taking its relu and the second's sigmoid would
    // link as many ops over a longer stretch. The forward is the second's, and the backward,
    // which every iteration holds, is the second's too rather than the first's.
    for (pos, e) in l.event_of.iter().enumerate() {
        let e = &k.events[e.unwrap() as usize];
        assert!(
            (1000.0..2000.0).contains(&e.ts),
            "{} linked to the event at {} µs",
            g.name(set.ops[pos]),
            e.ts
        );
    }
}

/// An ET of `ops` (name, thread) and a profile of three complete iterations of them, 1000 µs
/// apart, each thread's events in its own lane, the second thread's 300 µs into each.
fn pair(ops: &[(&str, u64)]) -> (et_schema::Trace, et_schema::kineto::KinetoTrace) {
    let mut b = TraceBuilder::new();
    for &(name, tid) in ops {
        b.op(name, &format!("{name}{UNARY}"))
            .attr("tid", "uint64", tid)
            .input(tensor(1, 1, 0, 8, 4, "cpu"), json!([8]), "Tensor(float)")
            .output(tensor(2, 2, 0, 8, 4, "cpu"), json!([8]), "Tensor(float)")
            .done();
    }
    let mut evs = Vec::new();
    for it in 0..3 {
        for (k, &(name, tid)) in ops.iter().enumerate() {
            let ts = 1000.0 * it as f64 + if tid == 1 { 0.0 } else { 300.0 } + k as f64;
            evs.push(
                json!({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid,
                            "ts": ts, "dur": 0.5}),
            );
        }
    }
    let k = parse_kineto(
        json!({ "traceEvents": evs }).to_string().as_bytes(),
        "k.json",
    )
    .unwrap();
    (b.build(), k)
}

/// Every op linked, all to events of one iteration.
fn one_iteration(t: &et_schema::Trace, k: &et_schema::kineto::KinetoTrace) {
    let g = Graph::new(t);
    let set = g.replay_set(None);
    let l = link(&g, &set, k).unwrap();
    assert_eq!(l.linked(), set.ops.len());
    let its: Vec<i64> = l
        .event_of
        .iter()
        .map(|e| (k.events[e.unwrap() as usize].ts / 1000.0).floor() as i64)
        .collect();
    assert!(its.iter().all(|&i| i == its[0]), "iterations {its:?}");
}

/// Autograd's thread holding more nodes than the thread that began the iteration: the anchor
/// is the thread that began it, not the largest, or the forward would be taken from the
/// iteration after the backward's.
#[test]
fn the_thread_that_began_the_iteration_anchors_the_others() {
    let (t, k) = pair(&[
        ("aten::relu", 1),
        ("aten::exp", 2),
        ("aten::log", 2),
        ("aten::sin", 2),
        ("aten::neg", 1),
    ]);
    one_iteration(&t, &k);
}

/// A thread whose first op's name its lane never holds (another thread's op, the trace's
/// first): its iteration is still the anchor's.
#[test]
fn a_thread_whose_first_name_its_lane_lacks_follows_the_anchor() {
    let (t, mut k) = pair(&[
        ("aten::relu", 1),
        ("aten::tanh", 2),
        ("aten::exp", 2),
        ("aten::log", 2),
        ("aten::neg", 1),
    ]);
    // The first iteration's forward is not whole: the anchor is the second.
    let first_relu = k
        .events
        .iter()
        .position(|e| k.strings.lookup("aten::relu") == Some(e.name))
        .unwrap();
    k.events.remove(first_relu);
    // tanh is on the first thread's lane only.
    let tanh = k.strings.lookup("aten::tanh").unwrap();
    let neg = k.strings.lookup("aten::neg").unwrap();
    let first_lane = k.events.iter().find(|e| e.name == neg).unwrap().tid;
    for e in k.events.iter_mut().filter(|e| e.name == tanh) {
        e.tid = first_lane;
    }
    let g = Graph::new(&t);
    let set = g.replay_set(None);
    let l = link(&g, &set, &k).unwrap();
    let by_name = |n: &str| {
        let pos = set.ops.iter().position(|&i| g.name(i) == n).unwrap();
        k.events[l.event_of[pos].unwrap() as usize].ts
    };
    let (relu, exp) = (by_name("aten::relu"), by_name("aten::exp"));
    assert!(
        (1000.0..2000.0).contains(&relu) && (1000.0..2000.0).contains(&exp),
        "relu at {relu} µs, exp at {exp} µs"
    );
}
