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
    let s = et_graph::compose::scale_dim(&t, 64, 2);
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

#[test]
fn gap_correction_subtracts_only_the_profilers_measured_excess() {
    let t = et_schema::read_trace(&shared().join("cpu/transformer.linked.et.json.gz")).unwrap();
    let kt =
        et_schema::kineto::read_kineto(&shared().join("cpu/transformer.kineto.json.gz")).unwrap();
    let g = Graph::new(&t);
    let set = g.replay_set(None);
    let l = link(&g, &set, &kt).unwrap();
    let o = original_timing(&l, &kt);
    // Replayed exactly as long as profiled: no excess, so no cost per event, gaps unchanged.
    let same: Vec<f64> = o.op_us.iter().map(|d| d.unwrap()).collect();
    let (gaps, c) = corrected_gaps(&l, &kt, &o, &same);
    assert_eq!(c, 0.0);
    assert_eq!(gaps, o.gap_us);
    // Replayed in a tenth of the time: a positive cost, and every gap shrinks, none below 0.
    let fast: Vec<f64> = same.iter().map(|d| d / 10.0).collect();
    let (gaps, c) = corrected_gaps(&l, &kt, &o, &fast);
    assert!(c > 0.0);
    assert!(gaps.iter().zip(&o.gap_us).all(|(g, o)| *g >= 0.0 && g <= o));
    assert!(gaps.iter().sum::<f64>() < o.gap_us.iter().sum::<f64>());
    // The cost is a typical op's, not a sum's: one op made hugely slower in the original
    // (a cold first call) leaves it unchanged.
    let mut one_slow = fast.clone();
    one_slow[0] = -1e6;
    let (_, c2) = corrected_gaps(&l, &kt, &o, &one_slow);
    assert!((c2 - c).abs() < 0.05 * c, "{c2} vs {c}");
}
