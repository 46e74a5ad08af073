//! Parent cycles: validation refuses them, but a trace read without validation can have them,
//! and every walk up the call tree must still end.

use et_graph::{compose, Graph, Selection, Summary};
use et_schema::testkit::TraceBuilder;
use et_schema::{parse_trace, Error, ParseOptions, Trace};
use std::sync::mpsc;
use std::time::Duration;

/// Root 1; `ProfilerStep#1` (2) under it; the ops 3 -> 5 -> 4 -> 3 (each `->` points to the
/// parent) on a cycle; op 6 and the collective 7 hanging off it; op 8 under the step.
fn cyclic() -> Vec<u8> {
    let mut b = TraceBuilder::new();
    b.node("ProfilerStep#1").id(2).parent(1).done();
    b.op("aten::a", "").id(3).parent(5).done();
    b.op("aten::b", "").id(4).parent(3).done();
    b.op("aten::c", "").id(5).parent(4).done();
    b.op("aten::d", "").id(6).parent(3).done();
    b.op("c10d::allreduce_", "").id(7).parent(4).done();
    b.op("aten::e", "").id(8).parent(2).done();
    b.to_bytes()
}

fn unvalidated(bytes: &[u8]) -> Trace {
    let opts = ParseOptions {
        validate: false,
        ..Default::default()
    };
    parse_trace(bytes, "cyclic", &opts).expect("parses without validation")
}

/// Runs `f` on a thread of its own and fails the test if it takes more than 30 s: a walk round
/// a cycle fails the test instead of hanging it.
fn ends<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("{what} did not end on a trace with a parent cycle"))
}

fn ancestor_ids(t: &Trace, id: u64) -> Vec<u64> {
    let g = Graph::new(t);
    let i = (0..g.len() as u32).find(|&i| g.id(i) == id).expect("node");
    g.ancestors(i).map(|a| g.id(a)).collect()
}

#[test]
fn validation_refuses_the_cycle_the_other_tests_read_without_it() {
    let err = parse_trace(&cyclic(), "cyclic", &ParseOptions::default()).unwrap_err();
    assert!(matches!(err, Error::Cycle { .. }), "{err}");
}

#[test]
fn ancestors_on_a_parent_cycle_give_each_node_once_and_end() {
    let t = unvalidated(&cyclic());
    // On the cycle: its other nodes, nearest first, never the node itself.
    let on = ends("ancestors", move || {
        [3, 4, 5].map(|id| (id, ancestor_ids(&t, id)))
    });
    assert_eq!(on, [(3, vec![5, 4]), (4, vec![3, 5]), (5, vec![4, 3])]);
    // Hanging off it: the whole cycle once, from where the chain meets it.
    let t = unvalidated(&cyclic());
    let off = ends("ancestors", move || {
        (ancestor_ids(&t, 6), ancestor_ids(&t, 7))
    });
    assert_eq!(off, (vec![3, 5, 4], vec![4, 3, 5]));
    // Outside the cycle nothing changes.
    let t = unvalidated(&cyclic());
    assert_eq!(ancestor_ids(&t, 8), vec![2, 1]);
}

#[test]
fn the_walks_up_the_tree_of_every_analysis_end_on_a_parent_cycle() {
    let t = unvalidated(&cyclic());
    let (all, step, iterations, scoped, extracted) = ends("the analyses", move || {
        let g = Graph::new(&t);
        let all = g.replay_set(None);
        let step = g.replay_set(Some(&[1]));
        let iterations = g.iterations_of(&step);
        let scoped = g
            .select(&Selection {
                scope: Some(regex::Regex::new("ProfilerStep").unwrap()),
                ..Default::default()
            })
            .map(|s| s.ops.len());
        let extracted = compose::extract(&g, &all).nodes.len();
        let ids = |ops: &[u32]| ops.iter().map(|&i| g.id(i)).collect::<Vec<_>>();
        (
            ids(&all.ops),
            ids(&step.ops),
            iterations.len(),
            scoped.ok(),
            extracted,
        )
    });
    // Every op on or under the cycle is covered by another op of it: only op 8 is replayed.
    assert_eq!(all, vec![8]);
    assert_eq!(step, vec![8]);
    assert_eq!(iterations, 1);
    assert_eq!(scoped, Some(1));
    // Op 8, the step and the root.
    assert_eq!(extracted, 3);
}

#[test]
fn the_summary_counts_a_collective_under_a_parent_cycle() {
    let t = unvalidated(&cyclic());
    let s = ends("the summary", move || Summary::of(&t));
    assert_eq!(s.nodes, 8);
    assert_eq!(s.collectives.get("allreduce"), Some(&1));
}
