//! et-graph on every real trace: replay sets, invariants of the tree and the data edges, and
//! Kineto linking rates.

use et_graph::*;
use et_schema::testkit::{tensor, TraceBuilder};
use serde_json::json;
use std::path::PathBuf;

fn shared() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces")
}

fn et_files() -> Vec<PathBuf> {
    let mut v = vec![];
    for d in [
        shared().join("cpu"),
        shared().join("public"),
        shared().join("public/param_dlrm_8rank_1.0.1"),
    ] {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.to_string_lossy().contains(".et.json") {
                v.push(p);
            }
        }
    }
    v.sort();
    assert!(v.len() >= 20);
    v
}

#[test]
fn replay_set_and_invariants_on_every_trace() {
    for p in et_files() {
        let t = et_schema::read_trace(&p).unwrap();
        let g = Graph::new(&t);
        let set = g.replay_set(None);
        assert!(!set.ops.is_empty(), "{}", p.display());
        // Every node is either replayed or has a reason; never both.
        for i in 0..g.len() as u32 {
            assert_eq!(
                set.ops.contains(&i),
                set.reason(i).is_none(),
                "{} node {}",
                p.display(),
                g.id(i)
            );
        }
        // Replay-set ops are ops, none has an op ancestor, and they are in execution order.
        for w in set.ops.windows(2) {
            assert!(g.id(w[0]) < g.id(w[1]));
        }
        for &i in &set.ops {
            assert!(g.class[i as usize].contains(OpClass::OP));
            assert!(g
                .ancestors(i)
                .all(|a| !g.class[a as usize].contains(OpClass::OP)));
        }
        // The tree is a forest whose roots are the observer's root nodes.
        for i in 0..g.len() as u32 {
            let top = g.ancestors(i).last().unwrap_or(i);
            assert!(
                g.class[top as usize].contains(OpClass::ROOT),
                "{}: node {} hangs off {}",
                p.display(),
                g.id(i),
                g.name(top)
            );
        }
        // Every data edge points backwards in execution order.
        let tt = g.tensors(&set);
        for e in &tt.edges {
            assert!(e.from < e.to, "{}: edge {e:?}", p.display());
        }
        // An external input is never produced before it is first read.
        for info in tt.externals() {
            assert!(!tt
                .edges
                .iter()
                .any(|e| !e.via_storage && e.tensor == info.key && e.to <= info.first_use));
        }
    }
}

#[test]
fn covered_ops_name_their_replayed_parent() {
    let t = et_schema::read_trace(&shared().join("cpu/mlp.et.json")).unwrap();
    let g = Graph::new(&t);
    let set = g.replay_set(None);
    let mut covered = 0;
    for i in 0..g.len() as u32 {
        if let Some(Skip::CoveredBy(pid)) = set.reason(i) {
            let parent_idx = (0..g.len() as u32).find(|&j| g.id(j) == *pid).unwrap();
            assert!(
                set.ops.contains(&parent_idx),
                "node {} covered by {} ({}) which is {:?}",
                g.id(i),
                pid,
                g.name(parent_idx),
                set.reason(parent_idx)
            );
            assert!(g.ancestors(i).any(|a| a == parent_idx));
            covered += 1;
        }
    }
    assert!(covered > 50);
    // aten::linear is replayed whole; its aten::addmm child is covered by it.
    let linear = set
        .ops
        .iter()
        .filter(|&&i| g.name(i) == "aten::linear")
        .count();
    assert_eq!(linear, 3);
    assert!(!set.ops.iter().any(|&i| g.name(i) == "aten::addmm"));
}

#[test]
fn inplace_optimizer_updates_version_parameters() {
    // SGD's add_ writes parameters in place: later readers depend on the writer.
    let t = et_schema::read_trace(&shared().join("cpu/mlp.et.json")).unwrap();
    let g = Graph::new(&t);
    let set = g.replay_set(None);
    let tt = g.tensors(&set);
    let inplace: Vec<u32> = set
        .ops
        .iter()
        .enumerate()
        .filter(|(_, &i)| g.class[i as usize].contains(OpClass::INPLACE))
        .map(|(p, _)| p as u32)
        .collect();
    assert!(!inplace.is_empty());
    assert!(
        tt.tensors.values().any(|x| x.external && x.versions > 0),
        "parameters are external and updated in place"
    );
    assert!(tt.peak_bytes["cpu"] > 0);
    // Views (t, as_strided) share their parameter's storage: some storages hold several tensors.
    let groups = tt.alias_groups();
    assert!(groups.values().any(|v| v.len() > 1));
    assert_eq!(
        groups.values().map(Vec::len).sum::<usize>(),
        tt.tensors.len()
    );
}

#[test]
fn iteration_windows_select_profiler_steps() {
    // Build a trace with two ProfilerStep annotations around ops.
    const RELU: &str = "aten::relu(Tensor self) -> Tensor";
    let t4 = |id| tensor(id, id, 0, 4, 4, "cpu");
    let mut b = TraceBuilder::new();
    let step7 = b.node("ProfilerStep#7").done();
    b.op("aten::relu", RELU)
        .parent(step7)
        .input(t4(1), json!([4]), "Tensor(float)")
        .output(t4(2), json!([4]), "Tensor(float)")
        .done();
    let step8 = b.node("ProfilerStep#8").done();
    let relu8 = b
        .op("aten::relu", RELU)
        .parent(step8)
        .input(t4(2), json!([4]), "Tensor(float)")
        .output(t4(3), json!([4]), "Tensor(float)")
        .done();
    assert_eq!((step7, step8, relu8), (2, 4, 5));
    let t = b.build();
    let g = Graph::new(&t);
    assert_eq!(
        g.iterations().iter().map(|x| x.1).collect::<Vec<_>>(),
        vec![7, 8]
    );
    let all = g.replay_set(None);
    assert_eq!(all.ops.len(), 2);
    let tt = g.tensors(&all);
    assert_eq!(
        tt.edges,
        vec![DataEdge {
            from: 0,
            to: 1,
            tensor: (2, 2),
            via_storage: false
        }]
    );
    assert_eq!(tt.externals().count(), 1);
    let eight = g.replay_set(Some(&[8]));
    assert_eq!(eight.ops.len(), 1);
    assert_eq!(g.id(eight.ops[0]), 5);
    assert_eq!(eight.reason(2), Some(&Skip::OutsideIteration));
    // With only step 8, tensor (2,2) is an external input.
    assert_eq!(g.tensors(&eight).externals().count(), 1);
}

/// Node index of `ProfilerStep#n`.
fn step(g: &Graph, n: u64) -> u32 {
    g.iterations().iter().find(|x| x.1 == n).unwrap().0
}

fn ids(g: &Graph, set: &ReplaySet) -> Vec<u64> {
    set.ops.iter().map(|&i| g.id(i)).collect()
}

fn scope(g: &Graph, re: &str) -> ReplaySet {
    g.select(&Selection {
        scope: Some(regex::Regex::new(re).unwrap()),
        ..Default::default()
    })
    .unwrap()
}

#[test]
fn iterations_and_scopes_hold_what_other_threads_ran_while_they_were_open() {
    // The shape of a GPU training step: `loss.backward()` inside `## backward ##` on the main
    // thread, the backward ops on the autograd engine's thread (its own thread root), numbered
    // from the same counter, so inside the step's and the scope's id windows.
    const MUL: &str = "aten::mul.Tensor(Tensor self, Tensor other) -> Tensor";
    let t4 = |id| tensor(id, id, 0, 4, 4, "cpu");
    let mut b = TraceBuilder::new();
    let op = |b: &mut TraceBuilder, parent: u64, x: u64| {
        b.op("aten::mul", MUL)
            .parent(parent)
            .input(t4(x), json!([4]), "Tensor(float)")
            .input(t4(x), json!([4]), "Tensor(float)")
            .output(t4(x + 1), json!([4]), "Tensor(float)")
            .done()
    };
    let main = b.node(et_schema::testkit::THREAD_ROOT).done();
    let step3 = b.node("ProfilerStep#3").parent(main).done();
    let fwd = b.node("## forward ##").parent(step3).done();
    let f3 = op(&mut b, fwd, 1);
    let bwd = b.node("## backward ##").parent(step3).done();
    let loss = op(&mut b, bwd, 2);
    let autograd = b.node(et_schema::testkit::THREAD_ROOT).done();
    let eval = "autograd::engine::evaluate_function: MulBackward0";
    let ev3 = b.node(eval).parent(autograd).done();
    let g3 = op(&mut b, ev3, 3);
    let opt = b.node("## optimizer ##").parent(step3).done();
    let o3 = op(&mut b, opt, 4);
    let step4 = b.node("ProfilerStep#4").parent(main).done();
    let f4 = op(&mut b, step4, 5);
    let ev4 = b.node(eval).parent(autograd).done();
    let g4 = op(&mut b, ev4, 6);
    let t = b.build();
    let g = Graph::new(&t);
    let th = g.threads();
    let idx = |id: u64| (0..g.len() as u32).find(|&i| g.id(i) == id).unwrap();
    assert_ne!(th.thread(idx(g3)), th.thread(idx(step3)));
    // Windows: to just before the next node of the scope's thread outside it; the last step's
    // to the end.
    assert_eq!(th.open_range(&g, idx(step3)), step3..=step4 - 1);
    assert_eq!(th.open_range(&g, idx(bwd)), bwd..=opt - 1);
    assert_eq!(th.open_range(&g, idx(step4)), step4..=u64::MAX);
    // Each iteration holds its backward op; neither holds the other's.
    assert_eq!(ids(&g, &g.replay_set(Some(&[3]))), vec![f3, loss, g3, o3]);
    let four = g.replay_set(Some(&[4]));
    assert_eq!(ids(&g, &four), vec![f4, g4]);
    assert_eq!(four.reason(idx(g3)), Some(&Skip::OutsideIteration));
    assert_eq!(
        ids(&g, &g.replay_set(Some(&[3, 4]))),
        ids(&g, &g.replay_set(None))
    );
    // `## backward ##` holds the loss and the backward op that ran inside it, not the next
    // step's; the other scopes are unchanged.
    assert_eq!(ids(&g, &scope(&g, "## backward ##")), vec![loss, g3]);
    assert_eq!(ids(&g, &scope(&g, "## forward ##")), vec![f3]);
    assert_eq!(ids(&g, &scope(&g, "## optimizer ##")), vec![o3]);
}

/// Two iterations selected apart and concatenated are each the iteration they were: the
/// second trace's threads continue the first's, so the first's iteration closes where the
/// second's begins (its backward thread's ops are not taken into the first), and a trace
/// concatenated with itself numbers the second copy's iterations on from the first's.
#[test]
fn concatenated_iterations_keep_their_own_ops() {
    let t = et_schema::read_trace(&shared().join("public/param_resnet_1.1.0.et.json.gz")).unwrap();
    let g = Graph::new(&t);
    let one = |n: u64| {
        let sel = Selection {
            iterations: Some(vec![n]),
            ..Default::default()
        };
        compose::extract(&g, &g.select(&sel).unwrap())
    };
    let reparse = |t: &et_schema::Trace| {
        let b = et_schema::write_trace_to_vec(t);
        et_schema::parse_trace(&b, "concat", &Default::default()).unwrap()
    };
    let c = reparse(&compose::concat(&one(6), &one(7)).unwrap());
    let gc = Graph::new(&c);
    assert_eq!(gc.replay_set(None).ops.len(), 2 * 1237);
    for n in [6, 7] {
        assert_eq!(gc.replay_set(Some(&[n])).ops.len(), 1237, "#{n}");
    }
    let twice = reparse(&compose::concat(&t, &t).unwrap());
    let g2 = Graph::new(&twice);
    let steps: Vec<u64> = g2.iterations().iter().map(|s| s.1).collect();
    assert_eq!(steps, vec![6, 7, 8, 9, 10, 11]);
    for n in steps {
        assert_eq!(g2.replay_set(Some(&[n])).ops.len(), 1237, "#{n}");
    }
}

/// A tensor read under a new id over bytes an op of the set wrote is that op's data (a saved
/// output): no input to supply. Over a storage id an op the selection left out reused (an
/// allocation at a freed address) after the set wrote or read it, it is an input; made there
/// before, it is the data known there. An op that writes part of a storage it read (in place)
/// keeps the bytes known there.
#[test]
fn new_ids_over_known_bytes_are_inputs_only_where_an_unselected_op_made_them() {
    const RELU: &str = "aten::relu(Tensor self) -> Tensor";
    const FILL: &str = "aten::fill_.Scalar(Tensor(a!) self, Scalar value) -> Tensor(a!)";
    let t = |id, storage, offset, numel| tensor(id, storage, offset, numel, 4, "cpu");
    let mut b = TraceBuilder::new();
    // relu writes storage 10 (8 floats) as tensor 2.
    b.op("aten::relu", RELU)
        .input(t(1, 1, 0, 8), json!([8]), "Tensor(float)")
        .output(t(2, 10, 0, 8), json!([8]), "Tensor(float)")
        .done();
    // fill_ writes the first half of it in place, through a view (tensor 3).
    b.op("aten::fill_", FILL)
        .input(t(3, 10, 0, 4), json!([4]), "Tensor(float)")
        .input(json!(0), json!([]), "Int")
        .output(t(3, 10, 0, 4), json!([4]), "Tensor(float)")
        .done();
    // A saved output: all of storage 10 under a new id.
    b.op("aten::relu", RELU)
        .input(t(4, 10, 0, 8), json!([8]), "Tensor(float)")
        .output(t(5, 11, 0, 8), json!([8]), "Tensor(float)")
        .done();
    // An op left out by the selection makes tensor 6 at storage 11's freed address.
    b.op("aten::sigmoid", "aten::sigmoid(Tensor self) -> Tensor")
        .input(t(1, 1, 0, 8), json!([8]), "Tensor(float)")
        .output(t(6, 11, 0, 8), json!([8]), "Tensor(float)")
        .done();
    b.op("aten::relu", RELU)
        .input(t(6, 11, 0, 8), json!([8]), "Tensor(float)")
        .output(t(7, 12, 0, 8), json!([8]), "Tensor(float)")
        .done();
    // Storage 20 read as an input (tensor 8); a left-out op then makes tensor 10 at its
    // address, which the set reads: other data, an input of its own.
    b.op("aten::relu", RELU)
        .input(t(8, 20, 0, 8), json!([8]), "Tensor(float)")
        .output(t(9, 21, 0, 8), json!([8]), "Tensor(float)")
        .done();
    b.op("aten::sigmoid", "aten::sigmoid(Tensor self) -> Tensor")
        .input(t(1, 1, 0, 8), json!([8]), "Tensor(float)")
        .output(t(10, 20, 0, 8), json!([8]), "Tensor(float)")
        .done();
    b.op("aten::relu", RELU)
        .input(t(10, 20, 0, 8), json!([8]), "Tensor(float)")
        .output(t(11, 22, 0, 8), json!([8]), "Tensor(float)")
        .done();
    // A left-out op made tensor 12 over storage 30 before the set first read that storage
    // (as tensor 13): another version of the same input (a weight an earlier iteration
    // updated), its storage's.
    b.op("aten::sigmoid", "aten::sigmoid(Tensor self) -> Tensor")
        .input(t(1, 1, 0, 8), json!([8]), "Tensor(float)")
        .output(t(12, 30, 0, 8), json!([8]), "Tensor(float)")
        .done();
    b.op("aten::relu", RELU)
        .input(t(13, 30, 0, 8), json!([8]), "Tensor(float)")
        .output(t(14, 31, 0, 8), json!([8]), "Tensor(float)")
        .done();
    b.op("aten::relu", RELU)
        .input(t(12, 30, 0, 8), json!([8]), "Tensor(float)")
        .output(t(15, 32, 0, 8), json!([8]), "Tensor(float)")
        .done();
    let tr = b.build();
    let g = Graph::new(&tr);
    let set = g
        .select(&Selection {
            name: Some(regex::Regex::new("relu|fill").unwrap()),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(set.ops.len(), 8);
    let tt = g.tensors(&set);
    let mut externals: Vec<u64> = tt.externals().map(|x| x.key.0).collect();
    externals.sort();
    assert_eq!(externals, vec![1, 6, 8, 10, 13]);
    // The saved output depends on the last write of its bytes (fill_'s), through the storage.
    assert!(
        tt.edges
            .iter()
            .any(|e| e.from == 1 && e.to == 2 && e.tensor == (4, 10) && e.via_storage),
        "{:?}",
        tt.edges
    );
}

#[test]
fn an_iteration_of_a_public_gpu_training_trace_includes_its_backward_pass() {
    for (file, steps) in [
        ("public/param_resnet_1.1.0.et.json.gz", [6, 7, 8]),
        ("public/param_resnet_1gpu_1.0.3.et.json.gz", [4, 5, 6]),
    ] {
        let t = et_schema::read_trace(&shared().join(file)).unwrap();
        let g = Graph::new(&t);
        let th = g.threads();
        let all = g.replay_set(None);
        assert_eq!(all.ops.len(), 3711, "{file}");
        let mut seen = vec![false; g.len()];
        for n in steps {
            let set = g.replay_set(Some(&[n]));
            let s = step(&g, n);
            // Forward, backward (on autograd's thread) and optimizer.
            assert_eq!(set.ops.len(), 1237, "{file} #{n}");
            let named = |name: &str| set.ops.iter().filter(|&&i| g.name(i) == name).count();
            assert_eq!(named("aten::convolution_backward"), 53, "{file} #{n}");
            assert_eq!(named("aten::cudnn_batch_norm_backward"), 53, "{file} #{n}");
            let backward = set
                .ops
                .iter()
                .filter(|&&i| g.class[i as usize].contains(OpClass::BACKWARD))
                .count();
            assert_eq!(backward, 515, "{file} #{n}");
            // The ops outside the ProfilerStep node ran on another thread inside its window.
            let outside: Vec<u32> = set
                .ops
                .iter()
                .copied()
                .filter(|&i| !g.ancestors(i).any(|a| a == s))
                .collect();
            assert_eq!(outside.len(), 837, "{file} #{n}");
            for &i in &outside {
                assert_ne!(th.thread(i), th.thread(s));
                assert!(th.open_range(&g, s).contains(&g.id(i)));
            }
            for &i in &set.ops {
                assert!(
                    !seen[i as usize],
                    "{file}: node {} in two iterations",
                    g.id(i)
                );
                seen[i as usize] = true;
            }
        }
        // The iterations split the trace's ops between them.
        assert_eq!(seen.iter().filter(|&&x| x).count(), all.ops.len(), "{file}");
    }
    // GPT-2: one iteration with every op of the trace, its backward pass included.
    let t = et_schema::read_trace(&shared().join("public/param_hf_gpt2_1.1.0.et.json.gz")).unwrap();
    let g = Graph::new(&t);
    let zero = g.replay_set(Some(&[0]));
    assert_eq!(ids(&g, &zero), ids(&g, &g.replay_set(None)));
    assert_eq!(zero.ops.len(), 8581);
    let backward = zero
        .ops
        .iter()
        .filter(|&&i| g.class[i as usize].contains(OpClass::BACKWARD))
        .count();
    assert_eq!(backward, 3227);
}

#[test]
fn scope_backward_selects_the_autograd_threads_ops_on_a_public_gpu_trace() {
    let t = et_schema::read_trace(&shared().join("public/param_resnet_1.1.0.et.json.gz")).unwrap();
    let g = Graph::new(&t);
    let sel = |re: &str, it: Option<u64>| {
        g.select(&Selection {
            scope: Some(regex::Regex::new(re).unwrap()),
            iterations: it.map(|n| vec![n]),
            ..Default::default()
        })
        .unwrap()
    };
    // The whole backward pass, not only the loss (cross_entropy_loss and ones_like).
    let b7 = sel("## backward ##", Some(7));
    assert_eq!(b7.ops.len(), 839);
    let under_scope = b7
        .ops
        .iter()
        .filter(|&&i| g.ancestors(i).any(|a| g.name(a) == "## backward ##"))
        .count();
    assert_eq!(under_scope, 2);
    let named = |name: &str| b7.ops.iter().filter(|&&i| g.name(i) == name).count();
    assert_eq!(named("aten::convolution_backward"), 53);
    assert_eq!(named("aten::threshold_backward"), 49);
    // Nothing of the forward pass or the optimizer, which ran before and after it.
    for &i in &b7.ops {
        assert!(g
            .ancestors(i)
            .all(|a| !matches!(g.name(a), "## forward ##" | "## optimizer ##")));
    }
    assert_eq!(sel("## backward ##", None).ops.len(), 3 * 839);
    // Scopes no other thread ran inside select what they enclose.
    assert_eq!(sel("## forward ##", None).ops.len(), 3 * 395);
    assert_eq!(sel("## optimizer ##", None).ops.len(), 9);
}

#[test]
fn repeat_numbers_the_copies_iterations_on() {
    let t = et_schema::read_trace(&shared().join("public/param_resnet_1.1.0.et.json.gz")).unwrap();
    let r = et_graph::compose::repeat(&t, 2).unwrap();
    let r = et_schema::parse_trace(&et_schema::write_trace_to_vec(&r), "r", &Default::default())
        .unwrap();
    let (g, gr) = (Graph::new(&t), Graph::new(&r));
    let its: Vec<u64> = gr.iterations().iter().map(|x| x.1).collect();
    assert_eq!(its, vec![6, 7, 8, 9, 10, 11]);
    let names = |g: &Graph, set: &ReplaySet| -> Vec<String> {
        set.ops.iter().map(|&i| g.name(i).to_string()).collect()
    };
    for (orig, copy) in [(6, 9), (7, 10), (8, 11)] {
        let a = g.replay_set(Some(&[orig]));
        let b = gr.replay_set(Some(&[copy]));
        assert_eq!(b.ops.len(), 1237);
        assert_eq!(names(&g, &a), names(&gr, &b));
        // The copy's, not the original's.
        assert!(b
            .ops
            .iter()
            .all(|&i| gr.id(i) > g.id(*a.ops.last().unwrap())));
    }
}

fn link_pair(et: &str, k: &str) -> (usize, usize, Method) {
    let t = et_schema::read_trace(&shared().join(et)).unwrap();
    let kt = et_schema::kineto::read_kineto(&shared().join(k)).unwrap();
    let g = Graph::new(&t);
    let set = g.replay_set(None);
    let l = link(&g, &set, &kt).unwrap_or_else(|e| panic!("{e}"));
    // Every link joins ops of the same name.
    for (pos, e) in l.event_of.iter().enumerate() {
        if let Some(e) = e {
            assert_eq!(kt.str(kt.events[*e as usize].name), g.name(set.ops[pos]));
        }
    }
    (l.linked(), set.ops.len(), l.method)
}

#[test]
fn cpu_pairs_link_completely_by_record_function_id() {
    for m in [
        "mlp",
        "cnn",
        "dlrm",
        "transformer",
        "dist_mlp_w2.rank0",
        "dist_mlp_w2.rank1",
    ] {
        let et = format!(
            "cpu/{m}.linked.et.json{}",
            if m == "mlp" { "" } else { ".gz" }
        );
        let k = format!("cpu/{m}.kineto.json{}", if m == "mlp" { "" } else { ".gz" });
        let (linked, total, method) = link_pair(&et, &k);
        assert_eq!(linked, total, "{m}");
        assert_eq!(method, Method::RecordFunctionId);
    }
}

#[test]
fn public_pairs_link_at_least_95_percent() {
    let mut pairs = vec![
        (
            "public/param_linear_1.0.1.et.json.gz".to_string(),
            "public/param_linear_1.0.1.kineto.json.gz".to_string(),
        ),
        (
            "public/hta_simple_add_1.0.1.et.json.gz".to_string(),
            "public/hta_simple_add_1.0.1.kineto.json.gz".to_string(),
        ),
    ];
    for r in 0..8 {
        pairs.push((
            format!("public/param_dlrm_8rank_1.0.1/rank{r}.et.json.gz"),
            format!("public/param_dlrm_8rank_1.0.1/rank{r}.kineto.json.gz"),
        ));
    }
    for (et, k) in pairs {
        let (linked, total, _) = link_pair(&et, &k);
        assert!(linked * 100 >= total * 95, "{et}: {linked}/{total}");
    }
}

#[test]
fn a_kineto_file_of_another_run_is_refused() {
    let t = et_schema::read_trace(&shared().join("cpu/mlp.et.json")).unwrap();
    let k = et_schema::kineto::read_kineto(&shared().join("cpu/mlp.kineto.json")).unwrap();
    let g = Graph::new(&t);
    let set = g.replay_set(None);
    // mlp.et.json is another iteration than the one the Kineto trace profiled.
    assert!(matches!(
        link(&g, &set, &k),
        Err(LinkError::OtherIteration { .. })
    ));
    let other = et_schema::kineto::read_kineto(
        &shared().join("public/param_dlrm_8rank_1.0.1/rank0.kineto.json.gz"),
    )
    .unwrap();
    assert!(link(&g, &set, &other).is_err());
}

#[test]
fn selection_by_scope_kind_and_producers() {
    let t = et_schema::read_trace(&shared().join("cpu/transformer.et.json.gz")).unwrap();
    let g = Graph::new(&t);
    let opt = g
        .select(&Selection {
            scope: Some(regex::Regex::new("^Optimizer.step").unwrap()),
            ..Default::default()
        })
        .unwrap();
    assert!(!opt.ops.is_empty());
    for &i in &opt.ops {
        assert!(g
            .ancestors(i)
            .any(|a| g.name(a).starts_with("Optimizer.step")));
    }
    // Producers pull in the forward ops that produce what a backward op reads.
    let mm = Selection {
        name: Some(regex::Regex::new("^aten::mm$").unwrap()),
        ..Default::default()
    };
    let plain = g.select(&mm).unwrap();
    let closed = g
        .select(&Selection {
            with_producers: true,
            ..mm
        })
        .unwrap();
    assert!(closed.ops.len() > plain.ops.len());
    assert!(plain.ops.iter().all(|i| closed.ops.contains(i)));
    assert!(matches!(
        g.select(&Selection {
            name: Some(regex::Regex::new("no_such_op").unwrap()),
            ..Default::default()
        }),
        Err(SelectError::Empty { .. })
    ));
    // comm / compute split on the Gloo trace.
    let d = et_schema::read_trace(&shared().join("cpu/dist_mlp_w2.rank0.et.json")).unwrap();
    let gd = Graph::new(&d);
    let comm = gd
        .select(&Selection {
            kind: Kind::Comm,
            ..Default::default()
        })
        .unwrap();
    let compute = gd
        .select(&Selection {
            kind: Kind::Compute,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(
        comm.ops.len() + compute.ops.len(),
        gd.replay_set(None).ops.len()
    );
    assert_eq!(
        comm.ops.len(),
        6,
        "{:?}",
        comm.ops.iter().map(|&i| gd.name(i)).collect::<Vec<_>>()
    );
}

/// Scaling rewrites tensor dimensions and shape arguments only: cnn's pooling kernels and
/// strides of 2 are not shapes, so scaling 2 finds nothing; a transformer's batch of 4, viewed
/// as batch x sequence rows, leaves views that no longer fit, and they are found.
#[test]
fn scale_rewrites_shapes_only_and_finds_the_views_it_breaks() {
    let cnn = et_schema::read_trace(&shared().join("cpu/cnn.et.json.gz")).unwrap();
    let same = |a: &et_schema::Trace, b: &et_schema::Trace| {
        et_schema::write_trace_to_vec(a) == et_schema::write_trace_to_vec(b)
    };
    assert!(same(&cnn, &compose::scale_dim(&cnn, 2, 2).unwrap()));
    let mlp = et_schema::read_trace(&shared().join("cpu/mlp.et.json")).unwrap();
    // mlp's batch of 64: every view follows it.
    let batch = compose::scale_dim(&mlp, 64, 2).unwrap();
    assert!(!same(&mlp, &batch));
    assert!(compose::reshapes_that_mismatch(&batch).is_empty());
    let t = et_schema::read_trace(&shared().join("cpu/transformer.et.json.gz")).unwrap();
    assert!(compose::reshapes_that_mismatch(&t).is_empty());
    let scaled = compose::scale_dim(&t, 4, 2).unwrap();
    let broken = compose::reshapes_that_mismatch(&scaled);
    assert!(!broken.is_empty());
    for id in broken {
        let n = scaled.nodes.iter().find(|n| n.id == id).unwrap();
        assert!(
            [
                "aten::view",
                "aten::reshape",
                "aten::_unsafe_view",
                "aten::_reshape_alias"
            ]
            .contains(&scaled.name(n)),
            "{}",
            scaled.name(n)
        );
    }
}

#[test]
fn dtype_and_scale_rewrite_consistently() {
    let t = et_schema::read_trace(&shared().join("cpu/mlp.et.json")).unwrap();
    let g = Graph::new(&t);
    let bf =
        et_graph::compose::change_dtype(&g, et_schema::DType::Float32, et_schema::DType::BFloat16);
    let bf = et_schema::parse_trace(
        &et_schema::write_trace_to_vec(&bf),
        "bf",
        &Default::default(),
    )
    .unwrap();
    let mut floats = 0;
    for a in &bf.args {
        if let et_schema::Value::Tensor(i) = a.value {
            let d = bf.dtype_of(a);
            assert_ne!(d, Some(et_schema::DType::Float32));
            if d == Some(et_schema::DType::BFloat16) {
                assert_eq!(bf.tensor(i).itemsize, 2);
                floats += 1;
            }
        }
    }
    assert!(floats > 100);
    let s = et_graph::compose::scale_dim(&t, 64, 2).unwrap();
    let s = et_schema::parse_trace(&et_schema::write_trace_to_vec(&s), "s", &Default::default())
        .unwrap();
    for a in &s.args {
        if let et_schema::Value::Tensor(i) = a.value {
            let shape = s.int_list(a.shape).unwrap();
            assert!(!shape.contains(&64), "{shape:?}");
            if shape.contains(&128) {
                assert_eq!(s.tensor(i).numel as i64, shape.iter().product::<i64>());
            }
        }
    }
}

#[test]
fn the_iteration_spans_every_et_node_and_its_edges_count_as_a_gap() {
    let t = et_schema::read_trace(&shared().join("cpu/dlrm.linked.et.json.gz")).unwrap();
    let kt = et_schema::kineto::read_kineto(&shared().join("cpu/dlrm.kineto.json.gz")).unwrap();
    let g = Graph::new(&t);
    let set = g.replay_set(None);
    let l = link(&g, &set, &kt).unwrap();
    let (a, b) = l.span.expect("linked by record function ids");
    // The optimizer's zero_grad runs before the first op and its step ends after the last:
    // both are ET nodes, so the iteration reaches them.
    let ev = |name: &str| {
        kt.events
            .iter()
            .find(|e| kt.str(e.name) == name)
            .unwrap_or_else(|| panic!("{name}"))
    };
    let zero = ev("Optimizer.zero_grad#SGD.zero_grad");
    let step = ev("Optimizer.step#SGD.step");
    assert_eq!(a, zero.ts);
    assert_eq!(b, step.ts + step.dur);
    let ops: Vec<_> = l
        .event_of
        .iter()
        .map(|e| &kt.events[e.unwrap() as usize])
        .collect();
    let first = ops[0].ts;
    let last = ops.iter().map(|e| e.ts + e.dur).fold(0.0, f64::max);
    assert!(a < first && last <= b);
    let o = original_timing(&l, &kt);
    assert!((o.gap_us[0] - ((first - a) + (b - last))).abs() < 1e-6);
    assert!((o.span_us - (b - a)).abs() < 1e-6);
    // Ops and gaps add up to the iteration where ops do not overlap.
    let total: f64 = o.op_us.iter().flatten().sum::<f64>() + o.gap_us.iter().sum::<f64>();
    assert!((total - o.span_us).abs() < 1.0, "{total} vs {}", o.span_us);
}

/// The replay's times with nothing probed: the plain step times, the plain replay's time
/// between steps and the profiled windows; each test sets the probes it needs.
fn unprobed<'a>(
    plain_us: &'a [f64],
    between_us: f64,
    profiled: &'a [Option<(f64, f64, u32)>],
) -> ReplayTimes<'a> {
    ReplayTimes {
        plain_us,
        between_us,
        profiled,
        event_us: None,
        backward_event_us: None,
        op_event_us: None,
        op_in_window_us: None,
        node_us: None,
        call_us: &[],
        boxing_us: None,
        edges_us: None,
        plain_leads_us: &[],
    }
}

/// As `unprobed` with no bookkeeping between steps, and the events and the op probed as under
/// the observer: an event 0.5 µs, a backward event 1 µs and 0.25 µs a tensor, the op 5 µs with
/// 3.5 µs of it inside its window.
fn probed<'a>(plain_us: &'a [f64], profiled: &'a [Option<(f64, f64, u32)>]) -> ReplayTimes<'a> {
    ReplayTimes {
        event_us: Some(0.5),
        backward_event_us: Some((1.0, 0.25)),
        op_event_us: Some(5.0),
        op_in_window_us: Some(3.5),
        ..unprobed(plain_us, 0.0, profiled)
    }
}

/// The replay's times for `gap_model`: each op's plain time and its profiled window, the
/// windows laid back to back `between` µs apart (no instrumentation cost between ops).
fn replay_times(windows: &[f64], plain: &[f64], between: f64) -> Vec<Option<(f64, f64, u32)>> {
    let mut t = 0.0;
    windows
        .iter()
        .zip(plain)
        .map(|(w, _)| {
            let s = t;
            t += w + between;
            Some((s, s + w, 0))
        })
        .collect()
}

#[test]
fn the_gap_model_scales_the_captures_gaps_by_the_measured_host_speed() {
    let (t, kt) = transformer_pair();
    let g = Graph::new(&t);
    let set = g.replay_set(None);
    let l = link(&g, &set, &kt).unwrap();
    let o = original_timing(&l, &kt);
    let orig: Vec<f64> = o.op_us.iter().map(|d| d.unwrap()).collect();
    // The replay's plain times and profiled windows, and the probed cost of backward nodes.
    let model = |plain: &[f64], profiled: &[Option<(f64, f64, u32)>], backward| {
        gap_model(
            &t,
            &l,
            &kt,
            &o,
            &ReplayTimes {
                backward_event_us: backward,
                ..unprobed(plain, 0.3, profiled)
            },
        )
    };
    // No profile of the replay: the capture's gaps as they are.
    let none = vec![None; orig.len()];
    let m = model(&orig, &none, None);
    assert_eq!((m.speed, m.speed_ops, m.per_event_us), (1.0, 0, 0.0));
    assert_eq!(m.gaps_us, o.gap_us);
    // This host runs the same instrumented ops in a third of the time (the capture host was
    // busy), with no instrumentation cost: every gap is a third of the capture's.
    let fast: Vec<f64> = orig.iter().map(|d| d / 3.0).collect();
    let fast_prof = replay_times(&fast, &fast, 0.3);
    let m = model(&fast, &fast_prof, None);
    assert!((m.speed - 1.0 / 3.0).abs() < 1e-9, "{}", m.speed);
    assert!(
        m.per_event_us.abs() < 1e-9 && m.per_boundary_us.abs() < 1e-9,
        "{m:?}"
    );
    for (g, o) in m.gaps_us.iter().zip(&o.gap_us) {
        assert!((g - o / 3.0).abs() < 1e-6, "{g} vs {o}/3");
    }
    assert!((m.emulated_ms - m.capture_gaps_ms / 3.0).abs() < 1e-6);
    let fast_model = m;
    // The instrumentation costs 2 µs per op window here and 5 µs between ops: gaps lose it.
    let plain: Vec<f64> = fast.iter().map(|d| (d - 2.0).max(0.1)).collect();
    let prof = replay_times(&fast, &plain, 5.3);
    let m = model(&plain, &prof, None);
    assert!(
        (m.per_boundary_us - 5.0).abs() < 1e-6,
        "{}",
        m.per_boundary_us
    );
    assert!(
        m.per_event_us > 1.0 && m.per_event_us <= 2.0 + 1e-9,
        "{}",
        m.per_event_us
    );
    for (g, o) in m.gaps_us.iter().zip(&o.gap_us) {
        assert!(*g >= 0.0 && *g <= o / 3.0 + 1e-9);
    }
    assert!(m.emulated_ms < m.capture_gaps_ms / 3.0);
    // Autograd's backward nodes in the gaps, probed at 0.5 µs + 0.25 µs per tensor (where
    // the ops' mean cost per event was 0 on the fast host above): each gap loses that (the
    // estimates' total is what the gaps add up to, clipped ones included).
    let m = fast_model;
    let probed = model(&fast, &fast_prof, Some((0.5, 0.25)));
    assert_eq!(probed.per_backward_event_us, Some((0.5, 0.25)));
    assert!(m.events_with_args > 0, "a training step's backward nodes");
    assert_eq!(probed.events_with_args, m.events_with_args);
    assert!(probed.tensors_in_gap_events >= probed.events_with_args);
    let kept = (m.per_event_us - 0.5) * m.events_with_args as f64
        - 0.25 * probed.tensors_in_gap_events as f64;
    assert!(
        (probed.emulated_ms - m.emulated_ms - kept / 1e3).abs() < 1e-6,
        "{} vs {} + {kept} us",
        probed.emulated_ms,
        m.emulated_ms
    );
}

/// Ranks run the same code, so another rank's Kineto trace would link one for one by record
/// function id: the recorded ranks must agree, and another rank's trace is refused.
#[test]
fn a_kineto_trace_of_another_rank_is_refused() {
    let dir = "public/param_dlrm_8rank_1.0.1";
    let et = et_schema::read_trace(&shared().join(format!("{dir}/rank3.et.json.gz"))).unwrap();
    let g = Graph::new(&et);
    let set = g.replay_set(None);
    let own = et_schema::kineto::read_kineto(&shared().join(format!("{dir}/rank3.kineto.json.gz")))
        .unwrap();
    assert_eq!(own.rank, Some(3));
    assert!(et_graph::link(&g, &set, &own).is_ok());
    let other =
        et_schema::kineto::read_kineto(&shared().join(format!("{dir}/rank5.kineto.json.gz")))
            .unwrap();
    let e = et_graph::link(&g, &set, &other).unwrap_err().to_string();
    assert!(e.contains("rank 5") && e.contains("rank 3"), "{e}");
}

/// Composition never writes wrapped, duplicate or negative values: overflowing sizes and ids,
/// and absurd repeat counts, are errors naming the node and field.
#[test]
fn composition_refuses_what_would_overflow() {
    use et_graph::compose::{self, ComposeError};
    let mut b = TraceBuilder::new();
    b.op("aten::relu", "aten::relu(Tensor self) -> Tensor")
        .input(tensor(1, 1, 0, 64, 4, "cpu"), json!([64]), "Tensor(float)")
        .output(tensor(2, 2, 0, 64, 4, "cpu"), json!([64]), "Tensor(float)")
        .done();
    let t = b.build();
    // 64 * 2^60 overflows i64: no negative shape comes out.
    match compose::scale_dim(&t, 64, 1 << 60) {
        Err(ComposeError::Overflow { .. }) => {}
        other => panic!("{other:?}"),
    }
    // A shape whose bytes overflow.
    match compose::scale_dim(&t, 64, 1 << 55) {
        Err(ComposeError::Overflow { node: 2, .. }) => {}
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        compose::repeat(&t, usize::MAX / 2),
        Err(ComposeError::TooBig { .. })
    ));
    // Ids near the top of u64 cannot be shifted past another trace's.
    let mut big = TraceBuilder::new();
    big.op("aten::relu", "aten::relu(Tensor self) -> Tensor")
        .id(u64::MAX - 1)
        .input(tensor(1, 1, 0, 64, 4, "cpu"), json!([64]), "Tensor(float)")
        .output(tensor(2, 2, 0, 64, 4, "cpu"), json!([64]), "Tensor(float)")
        .done();
    let big = big.build();
    assert!(matches!(
        compose::concat(&big, &t),
        Err(ComposeError::Overflow { .. })
    ));
    assert!(matches!(
        compose::repeat(&big, 3),
        Err(ComposeError::Overflow { .. })
    ));
    // What fits still composes.
    assert_eq!(compose::repeat(&t, 3).unwrap().nodes.len(), 4);
}

/// The shared CPU transformer's linked ET and its Kineto trace.
fn transformer_pair() -> (et_schema::Trace, et_schema::kineto::KinetoTrace) {
    let t = et_schema::read_trace(&shared().join("cpu/transformer.linked.et.json.gz")).unwrap();
    let k =
        et_schema::kineto::read_kineto(&shared().join("cpu/transformer.kineto.json.gz")).unwrap();
    (t, k)
}

/// Replay-set positions linked to a Kineto event.
fn linked_positions(l: &Link) -> Vec<usize> {
    (0..l.event_of.len())
        .filter(|&i| l.event_of[i].is_some())
        .collect()
}

/// `d` µs lost at moment `at` of a capture: what contains the moment grows, what starts after
/// it moves.
fn steal(k: &mut et_schema::kineto::KinetoTrace, at: f64, d: f64) {
    for e in &mut k.events {
        if e.ts > at {
            e.ts += d;
        } else if e.ts + e.dur > at {
            e.dur += d;
        }
    }
}

/// A capture on a busy host loses whole time slices to other processes: one op and one gap
/// each hold a few milliseconds the model never spent. The gap model's speed is not fooled by
/// the op's (a weighted median, not a ratio of sums), and the gap as long as the lost slice is
/// emulated as the capture's median gap, not as the slice.
#[test]
fn time_slices_a_busy_capture_lost_are_not_emulated() {
    let (t, quiet) = transformer_pair();
    let g = Graph::new(&t);
    let set = g.replay_set(None);
    let l = link(&g, &set, &quiet).unwrap();
    let o = original_timing(&l, &quiet);
    let orig: Vec<f64> = o.op_us.iter().map(|d| d.unwrap()).collect();
    // This host runs the ops as the quiet capture did, with no instrumentation cost.
    let prof = replay_times(&orig, &orig, 0.0);
    let times = unprobed(&orig, 0.0, &prof);
    let before = gap_model(&t, &l, &quiet, &o, &times);
    assert!((before.speed - 1.0).abs() < 1e-9, "{}", before.speed);
    assert_eq!((before.slices_in_ops, before.slices_in_gaps), (0, 0));
    // Steal 3 ms inside op `a` and 4 ms inside the gap before op `b`.
    let mut busy = quiet.clone();
    let found = linked_positions(&l);
    let a = found[found.len() / 3];
    let ea = quiet.events[l.event_of[a].unwrap() as usize].clone();
    steal(&mut busy, ea.ts + ea.dur / 2.0, 3000.0);
    let b = found
        .iter()
        .copied()
        .filter(|&i| i > a + 1 && o.gap_us[i] > 1.0)
        .nth(5)
        .unwrap();
    let eb = busy.events[l.event_of[b].unwrap() as usize].clone();
    steal(&mut busy, eb.ts - 0.5, 4000.0);
    let ob = original_timing(&l, &busy);
    assert!((ob.gap_us[b] - o.gap_us[b] - 4000.0).abs() < 1e-6);
    let m = gap_model(&t, &l, &busy, &ob, &times);
    assert!((m.speed - 1.0).abs() < 1e-9, "speed {}", m.speed);
    assert_eq!(m.slices_in_ops, 1);
    assert!((m.shortest_slice_us.unwrap() - 3000.0).abs() < 1e-6);
    assert_eq!(m.slices_in_gaps, 1);
    let mut med: Vec<f64> = found.iter().map(|&i| ob.gap_us[i]).collect();
    med.sort_by(f64::total_cmp);
    assert!((m.gaps_us[b] - med[med.len() / 2].min(ob.gap_us[b])).abs() < 1e-6);
    // Every other gap the steals left alone is emulated as from the quiet capture.
    let untouched = |i: usize| i != b && (ob.gap_us[i] - o.gap_us[i]).abs() < 1e-9;
    assert!(found.iter().filter(|&&i| untouched(i)).count() > found.len() / 2);
    for i in found.iter().copied().filter(|&i| untouched(i)) {
        assert!(
            (m.gaps_us[i] - before.gaps_us[i]).abs() < 1e-6,
            "gap {i}: {} vs {} (capture {} / {})",
            m.gaps_us[i],
            before.gaps_us[i],
            ob.gap_us[i],
            o.gap_us[i]
        );
    }
}

/// A busy capture host shares its CPU, and the share moves while the capture runs: here a
/// stretch of the iteration ran 12x slow (its ops and the gaps between them), and one op lost a
/// whole slice, which marks the capture as made on a shared CPU. Each gap is put on this host
/// by the ops around it: the stretch's gaps come out as the quiet capture's, and so do the gaps
/// elsewhere, where one speed for the whole iteration would shrink every gap outside the
/// stretch and leave the stretch's too long.
#[test]
fn a_busy_captures_slow_stretch_is_put_on_this_host_by_the_ops_around_each_gap() {
    let (t, quiet) = transformer_pair();
    let g = Graph::new(&t);
    let set = g.replay_set(None);
    let l = link(&g, &set, &quiet).unwrap();
    let o = original_timing(&l, &quiet);
    let orig: Vec<f64> = o.op_us.iter().map(|d| d.unwrap()).collect();
    let prof = replay_times(&orig, &orig, 0.0);
    let times = unprobed(&orig, 0.0, &prof);
    let before = gap_model(&t, &l, &quiet, &o, &times);
    assert!(!before.local_speed);
    let found = linked_positions(&l);
    let ev = |k: &et_schema::kineto::KinetoTrace, i: usize| {
        k.events[l.event_of[i].unwrap() as usize].clone()
    };
    // Time from t0 to t1 runs 12x slow (as busy captures' stretches did, 3-16x); what follows
    // moves by the difference.
    let (s, e) = (found[found.len() / 2], found[found.len() * 3 / 4]);
    let (t0, t1) = (ev(&quiet, s).ts - 0.5, ev(&quiet, e).ts - 0.5);
    let dilate = |x: f64| {
        if x <= t0 {
            x
        } else if x <= t1 {
            t0 + 12.0 * (x - t0)
        } else {
            x + 11.0 * (t1 - t0)
        }
    };
    let mut busy = quiet.clone();
    for e in &mut busy.events {
        let end = dilate(e.ts + e.dur);
        e.ts = dilate(e.ts);
        e.dur = end - e.ts;
    }
    // And one op early on lost a 3 ms slice.
    let a = found[found.len() / 8];
    let at = ev(&busy, a);
    steal(&mut busy, at.ts + at.dur / 2.0, 3000.0);
    // Linked afresh: the iteration's span (the first gap's edges) is the busy capture's.
    let l = link(&g, &set, &busy).unwrap();
    let ob = original_timing(&l, &busy);
    let m = gap_model(&t, &l, &busy, &ob, &times);
    // The slice, and the stretch's longer ops, which overran a slice's length too.
    assert!(m.slices_in_ops >= 1);
    assert!(m.local_speed);
    let shortest = m.shortest_slice_us.unwrap();
    // The iteration's speed mixes the stretch with the rest: neither's.
    assert!(m.speed < 0.9 && m.speed > 0.2, "{}", m.speed);
    // Gaps whose nearest ops on both sides (half a slice of their time each way) lie on one
    // side of the stretch's edges, and away from the sliced op, come out as the quiet ones.
    let quiet_time = |from: usize, to: usize| -> f64 {
        found
            .iter()
            .filter(|&&i| i >= from && i < to)
            .map(|&i| orig[i])
            .sum()
    };
    let clear = |i: usize| {
        let near = |edge: usize| {
            let (lo, hi) = if i < edge { (i, edge) } else { (edge, i) };
            quiet_time(lo, hi) < 2.0 * et_graph::SLICE_MIN_US
        };
        !near(s) && !near(e) && !near(a) && !near(a + 1)
    };
    let (mut inside, mut outside, mut slice_long) = (0, 0, 0);
    // (A gap that holds a lost slice is the capture's median gap instead, tested above; the
    // stretch's gaps that it made as long as a slice hold none, and are here.)
    for &i in found.iter().filter(|&&i| {
        clear(i) && o.gap_us[i] > 0.0 && (ob.gap_us[i] < shortest || o.gap_us[i] < shortest / 5.0)
    }) {
        if i > s && i < e {
            inside += 1;
            slice_long += (ob.gap_us[i] >= shortest) as usize;
        } else {
            outside += 1;
        }
        assert!(
            (m.gaps_us[i] - before.gaps_us[i]).abs() < 1e-4 * before.gaps_us[i].max(1.0),
            "gap {i} ({}): {} vs {} quiet (capture {} / {})",
            if i > s && i < e {
                "in the stretch"
            } else {
                "outside"
            },
            m.gaps_us[i],
            before.gaps_us[i],
            ob.gap_us[i],
            o.gap_us[i]
        );
    }
    assert!(
        inside > 5 && outside > 5 && slice_long > 0,
        "{inside} inside ({slice_long} of them a slice long), {outside} outside"
    );
}

/// The bundled capture of 4 profiled iterations (`tests/data/gen_steps.py`).
fn steps_pair() -> (et_schema::Trace, et_schema::kineto::KinetoTrace) {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let t = et_schema::read_trace(&d.join("steps.linked.et.json.gz")).unwrap();
    let kt = et_schema::kineto::read_kineto(&d.join("steps.kineto.json.gz")).unwrap();
    (t, kt)
}

fn own_timing(g: &Graph, n: u64, kt: &et_schema::kineto::KinetoTrace) -> OriginalTiming {
    let s = g.replay_set(Some(&[n]));
    original_timing(&link(g, &s, kt).unwrap(), kt)
}

/// One of several profiled iterations: its span is its `ProfilerStep#N`, and its ops' times and
/// gaps are typical of all the iterations that ran the same ops (the least over
/// them), so a stall in one iteration does not move them, and an iteration of other ops does
/// not count.
#[test]
fn one_iterations_timing_is_typical_of_its_like_iterations() {
    let (mut t, mut kt) = steps_pair();
    let g = Graph::new(&t);
    let steps: Vec<u64> = g.iterations().iter().map(|s| s.1).collect();
    assert_eq!(steps, [1, 2, 3, 4]);
    let set2 = g.replay_set(Some(&[2]));
    let l2 = link(&g, &set2, &kt).unwrap();
    assert_eq!(l2.linked(), set2.ops.len());
    let step2 = kt
        .events
        .iter()
        .find(|e| kt.str(e.name) == "ProfilerStep#2")
        .unwrap();
    assert_eq!(l2.span, Some((step2.ts, step2.ts + step2.dur)));
    let whole = link(&g, &g.replay_set(None), &kt).unwrap().span.unwrap();
    assert!(whole.1 - whole.0 > 3.0 * step2.dur);

    let typical = typical_timing(&g, &set2, &kt, &l2);
    assert_eq!(typical.iterations, [1, 2, 3, 4]);
    let per: Vec<OriginalTiming> = steps.iter().map(|&n| own_timing(&g, n, &kt)).collect();
    assert_eq!(typical.gap_us.len(), set2.ops.len());
    for p in 0..set2.ops.len() {
        let gaps: Vec<f64> = per.iter().map(|o| o.gap_us[p]).collect();
        assert_eq!(Some(typical.gap_us[p]), least(gaps));
        let ops: Vec<f64> = per.iter().map(|o| o.op_us[p].unwrap()).collect();
        assert_eq!(typical.op_us[p], least(ops));
    }
    // Its one-iteration timing is what `gaps_of_one_iteration` gives.
    let own2 = original_timing(&l2, &kt);
    assert!(own2.iterations.is_empty());
    assert_eq!(own2.gap_us, per[1].gap_us);

    // A 5 ms stall in iteration 1, inside the gap before its op at `pos`.
    let set1 = g.replay_set(Some(&[1]));
    let l1 = link(&g, &set1, &kt).unwrap();
    let pos = (1..set1.ops.len())
        .find(|&p| per[0].gap_us[p] > 2.0)
        .expect("a gap");
    let e = &kt.events[l1.event_of[pos].unwrap() as usize];
    let at = e.ts - per[0].gap_us[pos] / 2.0;
    steal(&mut kt, at, 5000.0);
    assert!(own_timing(&g, 1, &kt).gap_us[pos] > per[0].gap_us[pos] + 4999.0);
    let l2 = link(&g, &set2, &kt).unwrap();
    let stalled = typical_timing(&g, &set2, &kt, &l2);
    // The stall is the largest sample and is dropped: the typical gap is bounded by the
    // other iterations' (where a mean over all four would hold a quarter of the stall).
    let others = per[1..].iter().map(|o| o.gap_us[pos]).fold(0.0, f64::max);
    assert!(
        stalled.gap_us[pos] <= others + 0.5 && stalled.gap_us[pos] < 1000.0,
        "{} vs the others' {others}",
        stalled.gap_us[pos]
    );
    // Iteration 3 with one op renamed ran other ops: left out.
    drop(g);
    let renamed = t.strings.intern("aten::not_the_same");
    let g = Graph::new(&t);
    let third = g.replay_set(Some(&[3])).ops[4];
    drop(g);
    t.nodes[third as usize].name = renamed;
    let g = Graph::new(&t);
    let set2 = g.replay_set(Some(&[2]));
    let l2 = link(&g, &set2, &kt).unwrap();
    assert_eq!(typical_timing(&g, &set2, &kt, &l2).iterations, [1, 2, 4]);
    // The whole trace (all four) is its own timing.
    let all = g.replay_set(None);
    let la = link(&g, &all, &kt).unwrap();
    assert!(typical_timing(&g, &all, &kt, &la).iterations.is_empty());
}

/// The bundled clean ET (one iteration under the observer alone) and the profile of 4
/// iterations taken without the observer, in the same process (`tests/data/gen_steps.py`).
fn timing_pair() -> (et_schema::Trace, et_schema::kineto::KinetoTrace) {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let t = et_schema::read_trace(&d.join("steps.et.json.gz")).unwrap();
    let kt = et_schema::kineto::read_kineto(&d.join("steps.timing.json.gz")).unwrap();
    (t, kt)
}

/// Linked by name and order, a trace of the first ops of a step links to the whole step's
/// profile (an inference trace to a training step's): the link says the profile holds far
/// more than the trace. Its own profile links without a word.
#[test]
fn a_profile_of_more_than_the_trace_links_with_a_warning() {
    let (t, kt) = timing_pair();
    let g = Graph::new(&t);
    let set = g.replay_set(None);
    assert!(timing_link(&g, &set, &kt).unwrap().warnings.is_empty());
    let first = ReplaySet {
        ops: set.ops[..3].to_vec(),
        skip: set.skip.clone(),
    };
    let part = et_graph::compose::extract(&g, &first);
    let pg = Graph::new(&part);
    let pset = pg.replay_set(None);
    assert_eq!(pset.ops.len(), 3);
    let l = timing_link(&pg, &pset, &kt).unwrap();
    assert_eq!(l.linked(), 3);
    assert!(
        l.warnings
            .iter()
            .any(|w| w.contains("is it this trace's profile?")),
        "{:?}",
        l.warnings
    );
}

/// A profile taken without the execution trace observer has no record function ids to link
/// by: the clean ET links to each of its `ProfilerStep#N` iterations by order and name, each
/// step's extent is that iteration's span, and the timing is the least of each op and gap
/// over the steps. The trace says what it was taken under, so the calibration reproduces
/// that (the profiler alone, with shapes), not a linked pair's instrumentation.
#[test]
fn a_profile_without_the_observer_links_step_by_step_by_order() {
    let (t, kt) = timing_pair();
    assert_eq!(kt.execution_trace_observer, Some(false));
    assert_eq!(
        Instrumentation::of(&kt),
        Instrumentation {
            execution_trace: false,
            record_shapes: true,
            profile_memory: false,
        }
    );
    // The linked pair's says otherwise.
    assert_eq!(
        Instrumentation::of(&steps_pair().1),
        Instrumentation::LINKED
    );
    let g = Graph::new(&t);
    assert!(g.iterations().is_empty(), "a clean ET has no ProfilerStep");
    let set = g.replay_set(None);
    assert!(set.ops.len() > 10);
    let l = link(&g, &set, &kt).unwrap();
    assert_eq!(l.method, Method::Alignment);
    assert_eq!(l.linked(), set.ops.len());

    let steps = profiler_steps(&kt);
    assert_eq!(steps.iter().map(|s| s.0).collect::<Vec<_>>(), [1, 2, 3, 4]);
    let per = link_steps(&g, &set, &kt);
    assert_eq!(per.iter().map(|s| s.0).collect::<Vec<_>>(), [1, 2, 3, 4]);
    for ((n, ls), (m, a, b)) in per.iter().zip(&steps) {
        assert_eq!(n, m);
        assert_eq!(ls.span, Some((*a, *b)));
        assert_eq!(ls.linked(), set.ops.len());
        // Each op to an event of its name, inside its step, in order.
        let mut prev = f64::NEG_INFINITY;
        for (pos, e) in ls.event_of.iter().enumerate() {
            let e = &kt.events[e.unwrap() as usize];
            assert_eq!(kt.str(e.name), g.name(set.ops[pos]));
            assert!(e.ts >= *a && e.ts + e.dur <= *b && e.ts >= prev);
            prev = e.ts;
        }
    }
    // For timing: the middle step, its gaps and op times the least over all four.
    let tl = timing_link(&g, &set, &kt).unwrap();
    assert_eq!(tl.span, per[2].1.span);
    let typical = typical_timing(&g, &set, &kt, &tl);
    assert_eq!(typical.iterations, [1, 2, 3, 4]);
    let own: Vec<OriginalTiming> = per.iter().map(|(_, l)| original_timing(l, &kt)).collect();
    for p in 0..set.ops.len() {
        assert_eq!(
            Some(typical.gap_us[p]),
            least(own.iter().map(|o| o.gap_us[p]))
        );
        assert_eq!(
            typical.op_us[p],
            least(own.iter().map(|o| o.op_us[p].unwrap()))
        );
    }
    // The iteration's edges (zero_grad before the first op, the step's end) are a gap.
    assert!(own.iter().all(|o| o.gap_us[0] > 0.0));

    // A profile of another process links by name alone, which would mislink: refused.
    let mut other = kt.clone();
    for e in &mut other.events {
        if let et_schema::kineto::Lane::Id(p) = &mut e.pid {
            *p += 1;
        }
    }
    assert!(matches!(
        link(&g, &set, &other),
        Err(LinkError::OtherProcess { .. })
    ));
    assert!(link_steps(&g, &set, &other).is_empty());
    // And a linked pair's profile is linked by ids, never step by step.
    let (lt, lk) = steps_pair();
    let lg = Graph::new(&lt);
    assert!(link_steps(&lg, &lg.replay_set(Some(&[2])), &lk).is_empty());
}

/// Under the execution trace observer, a boundary is charged the part of the probed op's cost
/// outside its window (the observer's exit callback runs inside it, before the profiler takes
/// the op's end time), or the calibration replay's own time between its steps where that is
/// more: the observer's entry callback costs by the op's inputs, which the probe's are the least
/// of.
#[test]
fn under_the_observer_a_boundary_is_charged_the_probed_cost_outside_the_window() {
    let (t, kt) = steps_pair();
    assert!(Instrumentation::of(&kt).execution_trace);
    let g = Graph::new(&t);
    let set = g.replay_set(Some(&[2]));
    let l = link(&g, &set, &kt).unwrap();
    let o = original_timing(&l, &kt);
    let windows: Vec<f64> = o.op_us.iter().map(|d| d.unwrap()).collect();
    let doubled: Vec<f64> = windows.iter().map(|w| 2.0 * w).collect();
    let model = |between: f64, op: Option<f64>, inside: Option<f64>| {
        // The replay's own time between its steps is `between` beyond its plain bookkeeping.
        let profiled = replay_times(&doubled, &windows, between);
        gap_model(
            &t,
            &l,
            &kt,
            &o,
            &ReplayTimes {
                op_event_us: op,
                op_in_window_us: inside,
                ..probed(&windows, &profiled)
            },
        )
    };
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    // A probe of 5 µs with 3.5 inside its window: 1.5 outside, more than the replay's 0.5.
    let split = model(0.5, Some(5.0), Some(3.5));
    assert!(close(split.per_boundary_us, 1.5), "{split:?}");
    assert_eq!(split.op_in_window_us, Some(3.5));
    // The whole probe charged instead: the emulated time moves by 3.5 µs a gap.
    let whole = model(0.5, Some(5.0), None);
    assert!(close(whole.per_boundary_us, 5.0));
    // The replay's own 2.5 µs between steps, more than the probe's 1.5 outside its window.
    let replays = model(2.5, Some(5.0), Some(3.5));
    assert!(close(replays.per_boundary_us, 2.5), "{replays:?}");
    assert!(close(replays.replay_boundary_us, 2.5));
    // Never below the replay's; a window without the op probed is not charged.
    assert!(close(model(0.5, Some(3.0), Some(3.5)).per_boundary_us, 0.5));
    let unprobed = model(0.5, None, Some(3.5));
    assert!(close(unprobed.per_boundary_us, 0.5));
    assert_eq!(unprobed.op_in_window_us, None);
    assert!(split.emulated_ms > replays.emulated_ms && replays.emulated_ms > whole.emulated_ms);
}

/// Under the observer, the gap that holds the iteration's edges (from the profiler's step to
/// the first op, and from the last op to the step's end) is charged what the calibration's
/// iterations measured there, less the replay's bookkeeping, in place of a boundary: the
/// emulated time moves by the difference, and the report gives the charge.
#[test]
fn under_the_observer_the_iterations_edges_are_charged_what_the_calibration_measured() {
    let (t, kt) = steps_pair();
    let g = Graph::new(&t);
    let set = g.replay_set(Some(&[2]));
    let l = link(&g, &set, &kt).unwrap();
    assert!(l.span.is_some());
    let o = original_timing(&l, &kt);
    let windows: Vec<f64> = o.op_us.iter().map(|d| d.unwrap()).collect();
    let profiled = replay_times(&windows, &windows, 0.5);
    let model = |edges: Option<f64>| {
        gap_model(
            &t,
            &l,
            &kt,
            &o,
            &ReplayTimes {
                edges_us: edges,
                ..probed(&windows, &profiled)
            },
        )
    };
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    let boundary = model(None);
    assert_eq!(boundary.edge_us, None);
    assert!(close(boundary.per_boundary_us, 1.5), "{boundary:?}");
    // The replay's bookkeeping between steps is 0 here (`unprobed`'s `between_us`).
    let edges = model(Some(6.0));
    assert_eq!(edges.edge_us, Some(6.0));
    assert_eq!(edges.boundaries, boundary.boundaries);
    let moved = (boundary.emulated_ms - edges.emulated_ms) * 1e3;
    assert!(close(moved, 6.0 - 1.5), "{moved}");
    // A measurement that is not a time is not charged.
    assert_eq!(model(Some(f64::NAN)).edge_us, None);
}

/// Under the observer, where each op's own call was probed with its inputs, its boundary is
/// charged that and the boxing of its inputs instead of one cost for all: the emulated time
/// moves by the difference, an op not probed is charged the probed ones' mean, and the report
/// gives the mean charge.
#[test]
fn under_the_observer_each_boundary_is_charged_its_own_ops_probed_call() {
    let (t, kt) = steps_pair();
    let g = Graph::new(&t);
    let set = g.replay_set(Some(&[2]));
    let l = link(&g, &set, &kt).unwrap();
    let o = original_timing(&l, &kt);
    let n = set.ops.len();
    let windows: Vec<f64> = o.op_us.iter().map(|d| d.unwrap()).collect();
    let profiled = replay_times(&windows, &windows, 0.5);
    let model = |calls: &[Option<f64>], boxing: Option<f64>| {
        gap_model(
            &t,
            &l,
            &kt,
            &o,
            &ReplayTimes {
                call_us: calls,
                boxing_us: boxing,
                ..probed(&windows, &profiled)
            },
        )
    };
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    let probe = model(&[], None);
    assert_eq!(probe.call_probed, 0);
    assert!(close(probe.per_boundary_us, 1.5), "{probe:?}");
    // Every op's call 1 µs outside its window, and 0.25 µs of boxing.
    let calls = model(&vec![Some(1.0); n], Some(0.25));
    assert_eq!(calls.call_probed, calls.boundaries);
    assert!(calls.boundaries > 0);
    assert!(close(calls.per_boundary_us, 1.25), "{calls:?}");
    assert_eq!(calls.boxing_us, Some(0.25));
    let moved = (calls.emulated_ms - probe.emulated_ms) * 1e3;
    assert!(close(moved, 0.25 * calls.boundaries as f64), "{moved}");
    // One op's call not probed: charged the others' mean (here the same 1 µs).
    let mut one_missing = vec![Some(1.0); n];
    one_missing[0] = None;
    let m = model(&one_missing, Some(0.25));
    assert_eq!(m.call_probed, m.boundaries - 1);
    assert!(close(m.emulated_ms, calls.emulated_ms));
    // Heavier calls charge more.
    let heavy = model(&vec![Some(2.0); n], Some(0.25));
    assert!(close(
        (calls.emulated_ms - heavy.emulated_ms) * 1e3,
        calls.boundaries as f64
    ));
}

/// Without record function ids, what an event in a gap records is read off the profile itself:
/// the backward nodes autograd runs between the ops record their tensors' shapes, and are
/// charged as events with arguments.
#[test]
fn a_profile_without_the_observer_counts_its_gap_events_tensors() {
    let (t, kt) = timing_pair();
    let g = Graph::new(&t);
    let set = g.replay_set(None);
    let l = timing_link(&g, &set, &kt).unwrap();
    let o = typical_timing(&g, &set, &kt, &l);
    let n = set.ops.len();
    let windows: Vec<f64> = o.op_us.iter().map(|d| d.unwrap()).collect();
    let profiled = replay_times(&windows, &windows, 0.0);
    let times = ReplayTimes {
        event_us: Some(0.5),
        backward_event_us: Some((1.0, 0.25)),
        ..unprobed(&windows, 0.0, &profiled)
    };
    let m = gap_model(&t, &l, &kt, &o, &times);
    assert_eq!(m.instrumentation, Instrumentation::of(&kt));
    assert_eq!(m.gaps_us.len(), n);
    assert_eq!(m.speed_ops, n);
    assert!(m.events_with_args > 0, "{m:?}");
    assert!(m.tensors_in_gap_events >= m.events_with_args, "{m:?}");
    assert!(m.events_in_gaps > m.events_with_args, "{m:?}");

    // Taken without `record_shapes`, the profile records no tensors, and the backward nodes
    // are the events their `evaluate_function` wrappers name: the same nodes, charged without
    // tensors, and the loss's `MeanBackward0` too, whose one recorded input (a 0-dim gradient)
    // the shapes do not count as a tensor.
    let mut bare = kt.clone();
    for e in &mut bare.events {
        e.input_tensors = None;
    }
    bare.record_shapes = false;
    let b = gap_model(&t, &l, &bare, &o, &times);
    assert!(!b.instrumentation.record_shapes);
    assert_eq!(b.events_in_gaps, m.events_in_gaps);
    assert_eq!(b.events_with_args, m.events_with_args + 1, "{b:?}");
    assert_eq!(b.tensors_in_gap_events, 0);
}

/// Probed through the real mechanisms, an op's boundary costs what the op probe says (not the
/// replay's own boxed calls and bookkeeping), and a backward node in a gap what the engine
/// probe says per node, its `evaluate_function` wrapper included: the emulated time moves by
/// exactly those charges' differences.
#[test]
fn probed_op_and_node_costs_replace_the_boundary_and_the_nodes_events() {
    let (t, kt) = timing_pair();
    let g = Graph::new(&t);
    let set = g.replay_set(None);
    let l = timing_link(&g, &set, &kt).unwrap();
    let o = typical_timing(&g, &set, &kt, &l);
    let windows: Vec<f64> = o.op_us.iter().map(|d| d.unwrap()).collect();
    // The replay's windows twice the capture's: its gaps are the capture's doubled, so none
    // comes out negative and the charges' differences show in the total as they are.
    let doubled: Vec<f64> = windows.iter().map(|w| 2.0 * w).collect();
    let profiled = replay_times(&doubled, &windows, 0.0);
    let (e, p, q) = (0.5, 1.0, 0.25);
    let windowed = |op: Option<f64>, in_window: Option<f64>, node: Option<f64>| ReplayTimes {
        event_us: Some(e),
        backward_event_us: Some((p, q)),
        op_event_us: op,
        op_in_window_us: in_window,
        node_us: node,
        ..unprobed(&windows, 0.0, &profiled)
    };
    let times = |op: Option<f64>, node: Option<f64>| windowed(op, None, node);
    let base = gap_model(&t, &l, &kt, &o, &times(None, None));
    assert_eq!(base.per_node_us, None);
    assert_eq!(base.per_boundary_us, base.replay_boundary_us);
    let h = base.events_with_args as f64;
    assert!(
        h > 0.0 && base.events_in_gaps >= 2 * base.events_with_args,
        "{base:?}"
    );
    assert_eq!(base.capped, 0);
    // Every linked op has a gap before it (the first, the iteration's edges).
    let gaps = l.event_of.iter().filter(|e| e.is_some()).count() as f64;

    let op = gap_model(&t, &l, &kt, &o, &times(Some(0.1), None));
    assert_eq!(op.per_boundary_us, 0.1);
    assert_eq!(op.replay_boundary_us, base.replay_boundary_us);
    let moved = (op.emulated_ms - base.emulated_ms) * 1e3;
    let expected = (base.replay_boundary_us - 0.1) * gaps;
    assert!(
        (moved - expected).abs() < 1e-6 * expected.abs().max(1.0),
        "{moved} vs {expected}"
    );
    // Taken without the observer, the probe's whole cost, whatever of it was inside its window.
    let whole = gap_model(&t, &l, &kt, &o, &windowed(Some(0.1), Some(0.05), None));
    assert_eq!((whole.per_boundary_us, whole.op_in_window_us), (0.1, None));

    let c = 3.0;
    let node = gap_model(&t, &l, &kt, &o, &times(None, Some(c)));
    assert_eq!(node.per_node_us, Some(c));
    // Without the engine probed, each node costs its wrapper's e and its own p; with it, c for
    // both.
    let moved = (base.emulated_ms - node.emulated_ms) * 1e3;
    let expected = (c - e - p) * h;
    assert!(
        (moved - expected).abs() < 1e-6 * expected.abs().max(1.0),
        "{moved} vs {expected}"
    );
}

/// The world a trace was captured in, from its collectives' records: the one-GPU DDP job's
/// (schema 1.0.3, no process-group record, no attributes: its records' trailing integers) is 1,
/// as its schema 1.1.0 sibling's attributes say; the 8-rank DLRM job's 1.0.1 records, which
/// hold no world size, and a trace without collectives give none.
#[test]
fn world_size_from_the_collectives_records() {
    let world = |f: &str| {
        let t = et_schema::read_trace(&shared().join(f)).unwrap();
        summary::recorded_world_size(&t)
    };
    assert_eq!(world("public/param_resnet_1gpu_1.0.3.et.json.gz"), Some(1));
    assert_eq!(world("public/param_resnet_1.1.0.et.json.gz"), Some(1));
    assert_eq!(
        world("public/param_dlrm_8rank_1.0.1/rank3.et.json.gz"),
        None
    );
    assert_eq!(world("cpu/mlp.et.json"), None);
}
