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
}

fn gen() -> impl Strategy<Value = Vec<GenNode>> {
    prop::collection::vec(
        (
            any::<usize>(),
            prop::bool::weighted(0.7),
            prop::bool::weighted(0.2),
            prop::collection::vec(1u64..12, 0..3),
            1u64..12,
        )
            .prop_map(|(parent, op, inplace, ins, out)| GenNode {
                parent,
                op,
                inplace,
                ins,
                out,
            }),
        1..40,
    )
}

fn tensor(id: u64) -> serde_json::Value {
    testkit::tensor(id, id + 100, 0, 16, 4, "cpu")
}

/// Node ids: 1 process root, 2 thread root, then 3.. in generation order (execution order).
fn document(nodes: &[GenNode]) -> Vec<u8> {
    // The observer writes children before parents: reverse the order in the file.
    let mut b = TraceBuilder::new().meta("pid", 1).children_first();
    let thread = b.node(testkit::THREAD_ROOT).done();
    for (k, n) in nodes.iter().enumerate() {
        let id = k as u64 + 3;
        let parent = if k == 0 {
            thread
        } else {
            [thread, (n.parent % k) as u64 + 3][n.parent % 2]
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
    fn repeat_multiplies_the_op_multiset(nodes in gen(), n in 1usize..4) {
        let t = et_schema::parse_trace(&document(&nodes), "gen", &Default::default()).unwrap();
        let g = Graph::new(&t);
        let base = names(&g, &g.replay_set(None));
        let r = reparse(&compose::repeat(&t, n));
        let gr = Graph::new(&r);
        let rep = names(&gr, &gr.replay_set(None));
        let expect: Vec<String> = (0..n).flat_map(|_| base.clone()).collect();
        prop_assert_eq!(rep, expect);
        // Copies depend on the copy before them only through tensors, never forwards.
        for e in &gr.tensors(&gr.replay_set(None)).edges {
            prop_assert!(e.from < e.to);
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
        let c = reparse(&compose::concat(&t, &t));
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
