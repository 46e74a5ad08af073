//! Property tests on generated traces: tree shape, data-edge direction, and that composition
//! outputs are valid traces that re-parse to the graphs they should be.

use et_graph::*;
use et_schema::testkit::{self, TraceBuilder};
use proptest::prelude::*;
use serde_json::json;

#[derive(Debug, Clone)]
struct GenNode {
    parent: usize,
    op: bool,
    inplace: bool,
    ins: Vec<u64>,
    out: u64,
    /// Under the second thread root instead of the first, where the layout has one and the node
    /// would hang off its thread (as the autograd engine's backward ops do).
    other_thread: bool,
}

fn gen() -> impl Strategy<Value = Vec<GenNode>> {
    prop::collection::vec(
        (
            any::<usize>(),
            prop::bool::weighted(0.7),
            prop::bool::weighted(0.2),
            prop::collection::vec(1u64..12, 0..3),
            1u64..12,
            prop::bool::weighted(0.3),
        )
            .prop_map(|(parent, op, inplace, ins, out, other_thread)| GenNode {
                parent,
                op,
                inplace,
                ins,
                out,
                other_thread,
            }),
        1..40,
    )
}

fn tensor(id: u64) -> serde_json::Value {
    testkit::tensor(id, id + 100, 0, 16, 4, "cpu")
}

/// What surrounds the generated nodes.
#[derive(Debug, Clone, Copy, Default)]
struct Layout {
    /// A second thread root, for the nodes marked `other_thread` that hang off their thread.
    second_thread: bool,
    /// A `ProfilerStep#N` on the first thread, which the first thread's nodes hang off.
    step: Option<u64>,
}

/// Node ids: 1 process root, 2 thread root, then 3.. in generation order (execution order).
fn document(nodes: &[GenNode]) -> Vec<u8> {
    document_in(nodes, Layout::default())
}

/// As [`document`], with ids after the first thread root: the second thread root, then the
/// `ProfilerStep#N`, where the layout has them, then the generated nodes.
fn document_in(nodes: &[GenNode], layout: Layout) -> Vec<u8> {
    // The observer writes children before parents: reverse the order in the file.
    let mut b = TraceBuilder::new().meta("pid", 1).children_first();
    let thread = b.node(testkit::THREAD_ROOT).done();
    let second = layout
        .second_thread
        .then(|| b.node(testkit::THREAD_ROOT).done());
    let top = match layout.step {
        Some(n) => b.node(&format!("ProfilerStep#{n}")).parent(thread).done(),
        None => thread,
    };
    let first = b.last_id() + 1;
    for (k, n) in nodes.iter().enumerate() {
        let id = k as u64 + first;
        let top = match second {
            Some(s) if n.other_thread => s,
            _ => top,
        };
        let parent = if k == 0 {
            top
        } else {
            [top, (n.parent % k) as u64 + first][n.parent % 2]
        };
        let (name, schema) = match (n.op, n.inplace) {
            (false, _) => (format!("## scope {k} ##"), ""),
            (true, false) => (
                "aten::mul".to_string(),
                "aten::mul.Tensor(Tensor self, Tensor other) -> Tensor",
            ),
            (true, true) => (
                "aten::add_".to_string(),
                "aten::add_.Tensor(Tensor(a!) self, Tensor other, *, Scalar alpha=1) -> Tensor(a!)",
            ),
        };
        let mut op = b.op(&name, schema).id(id).parent(parent).rf_id(id);
        for &t in &n.ins {
            op = op.input(tensor(t), json!([4, 4]), "Tensor(float)");
        }
        if n.op {
            let out = if n.inplace {
                n.ins.first().copied().unwrap_or(n.out)
            } else {
                n.out
            };
            op = op.output(tensor(out), json!([4, 4]), "Tensor(float)");
        }
        op.done();
    }
    b.to_bytes()
}

fn names(g: &Graph, set: &ReplaySet) -> Vec<String> {
    set.ops.iter().map(|&i| g.name(i).to_string()).collect()
}

fn reparse(t: &et_schema::Trace) -> et_schema::Trace {
    et_schema::parse_trace(&et_schema::write_trace_to_vec(t), "re", &Default::default())
        .expect("composed trace re-parses")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 150, ..ProptestConfig::default() })]

    #[test]
    fn graph_invariants(nodes in gen()) {
        let t = et_schema::parse_trace(&document(&nodes), "gen", &Default::default()).unwrap();
        let g = Graph::new(&t);
        // A forest under the process root.
        for i in 0..g.len() as u32 {
            let top = g.ancestors(i).last().unwrap_or(i);
            prop_assert_eq!(g.id(top), 1);
        }
        let set = g.replay_set(None);
        let tt = g.tensors(&set);
        for e in &tt.edges {
            prop_assert!(e.from < e.to);
        }
        // Exactly the ops with no op ancestor are replayed.
        let expect: Vec<u32> = g.order.iter().copied().filter(|&i| g.class[i as usize].contains(OpClass::OP) && !g.ancestors(i).any(|a| g.class[a as usize].contains(OpClass::OP))).collect();
        prop_assert_eq!(&set.ops, &expect);
    }

    #[test]
    fn repeat_multiplies_the_op_multiset(
        nodes in gen(),
        n in 1usize..4,
        second_thread in any::<bool>(),
        step in prop::option::of(0u64..1000),
    ) {
        let layout = Layout { second_thread, step };
        let t = et_schema::parse_trace(&document_in(&nodes, layout), "gen", &Default::default())
            .unwrap();
        let g = Graph::new(&t);
        let base = names(&g, &g.replay_set(None));
        let r = reparse(&compose::repeat(&t, n).unwrap());
        let gr = Graph::new(&r);
        let rep = names(&gr, &gr.replay_set(None));
        let expect: Vec<String> = (0..n).flat_map(|_| base.clone()).collect();
        prop_assert_eq!(rep, expect);
        // Copies depend on the copy before them only through tensors, never forwards.
        for e in &gr.tensors(&gr.replay_set(None)).edges {
            prop_assert!(e.from < e.to);
        }
        // Each copy is an iteration of its own, numbered on from the original's, holding the
        // ops of the copy on both threads (the second thread's ran while the step was open).
        if let Some(s) = step {
            prop_assert_eq!(names(&g, &g.replay_set(Some(&[s]))), base.clone());
            let its: Vec<u64> = gr.iterations().iter().map(|x| x.1).collect();
            prop_assert_eq!(its, (s..s + n as u64).collect::<Vec<_>>());
            for k in 0..n as u64 {
                prop_assert_eq!(names(&gr, &gr.replay_set(Some(&[s + k]))), base.clone());
            }
        }
    }

    #[test]
    fn extract_and_concat_re_parse_to_the_same_graph(nodes in gen(), pick in any::<u64>()) {
        let t = et_schema::parse_trace(&document(&nodes), "gen", &Default::default()).unwrap();
        let g = Graph::new(&t);
        let all = g.replay_set(None);
        prop_assume!(!all.ops.is_empty());
        // Extract a prefix of the replay set by id range.
        let last = g.id(all.ops[(pick as usize) % all.ops.len()]);
        let sel = Selection { ids: Some(0..=last), ..Default::default() };
        let set = g.select(&sel).unwrap();
        let x = reparse(&compose::extract(&g, &set));
        let gx = Graph::new(&x);
        prop_assert_eq!(names(&gx, &gx.replay_set(None)), names(&g, &set));
        prop_assert_eq!(gx.tensors(&gx.replay_set(None)).edges.len(), g.tensors(&set).edges.len());
        // Concatenation: the ops of both, in order; no tensor shared between the halves.
        let c = reparse(&compose::concat(&t, &t).unwrap());
        let gc = Graph::new(&c);
        let cs = gc.replay_set(None);
        let mut expect = names(&g, &all);
        expect.extend(names(&g, &all));
        prop_assert_eq!(names(&gc, &cs), expect);
        let tc = gc.tensors(&cs);
        let half = all.ops.len() as u32;
        prop_assert!(tc.edges.iter().all(|e| (e.from < half) == (e.to < half)));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Whatever the profile's gaps and the reference, an anchored replay's iteration (its ops
    /// and its spun gaps, the bookkeeping inside them, what outlasts a gap given back by the
    /// later ones) is the reference original's on this host's speed, or its plain time where
    /// that is already longer; no gap is negative, and the profile's shape is kept.
    #[test]
    fn an_anchored_iteration_is_the_references_original_on_this_hosts_speed(
        gaps in proptest::collection::vec(prop_oneof![Just(0.0), 0.0f64..500.0], 1..40),
        op_us in 1.0f64..200.0,
        original_ms in 0.01f64..50.0,
        replay_op_ms in 0.01f64..20.0,
        bookkeeping in 0.0f64..1.0,
    ) {
        let n = gaps.len();
        let mut m = et_graph::GapModel {
            gaps_us: gaps.clone(),
            base_step_us: vec![op_us; n],
            ..Default::default()
        };
        let r = et_graph::Reference {
            original_ms,
            replay_ms: replay_op_ms * (1.0 + bookkeeping),
            replay_op_ms,
        };
        et_graph::anchor(&mut m, r);
        let a = m.anchored.clone().unwrap();
        let ops = op_us * n as f64;
        let bookkeeping = (r.replay_ms - r.replay_op_ms) * 1e3 * a.host_ratio;
        let iteration = ops + m.gaps_us.iter().sum::<f64>().max(bookkeeping);
        let want = (a.target_ms * 1e3).max(ops + bookkeeping);
        prop_assert!((iteration - want).abs() <= 1e-6 * want.max(1.0), "{} vs {}", iteration, want);
        prop_assert!(m.gaps_us.iter().all(|g| *g >= 0.0 && g.is_finite()));
        let total: f64 = gaps.iter().sum();
        if total > 0.0 && a.scale > 0.0 {
            for (g, w) in m.gaps_us.iter().zip(&gaps) {
                prop_assert!((g - a.scale * w).abs() <= 1e-9 * g.abs().max(1.0));
            }
        }
    }
}
