//! GPU work launched outside the ops the replay runs: counted, attributed to the replayed ops
//! around its launch, and named where it cannot be.

use et_graph::{link, off_op_summary, original_gpu, Graph, Method};
use et_schema::kineto::parse_kineto;
use et_schema::testkit::{tensor, TraceBuilder};
use serde_json::json;

/// A forward step in the shape of Megatron's: a custom autograd function whose extension
/// kernel is launched under its own annotation beside one ATen op the replay runs, a plain ATen
/// op, and a fused softmax whose kernel is launched under an annotation holding no ATen op.
fn megatron_like() -> (et_schema::Trace, et_schema::kineto::KinetoTrace) {
    let mut b = TraceBuilder::new();
    let ln = b.node("FusedLayerNormAffineFunction").rf_id(100).done();
    b.op(
        "aten::empty_like",
        "aten::empty_like(Tensor self) -> Tensor",
    )
    .parent(ln)
    .rf_id(101)
    .input(tensor(1, 1, 0, 8, 4, "cuda:0"), json!([8]), "Tensor(float)")
    .output(tensor(2, 2, 0, 8, 4, "cuda:0"), json!([8]), "Tensor(float)")
    .done();
    b.op("aten::relu", "aten::relu(Tensor self) -> Tensor")
        .rf_id(102)
        .input(tensor(2, 2, 0, 8, 4, "cuda:0"), json!([8]), "Tensor(float)")
        .output(tensor(3, 3, 0, 8, 4, "cuda:0"), json!([8]), "Tensor(float)")
        .done();
    b.node("ScaledMaskedSoftmax").rf_id(103).done();
    let cpu = |name: &str, ts: f64, dur: f64, rf: u64| {
        json!({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
               "args": {"Record function id": rf, "External id": rf}})
    };
    let launch = |ts: f64, corr: u64| {
        json!({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
               "ts": ts, "dur": 4, "args": {"correlation": corr}})
    };
    let kernel = |name: &str, ts: f64, dur: f64, corr: u64| {
        json!({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts,
               "dur": dur, "args": {"correlation": corr, "stream": 7, "device": 0}})
    };
    let k = json!({"traceEvents": [
        cpu("FusedLayerNormAffineFunction", 0.0, 100.0, 100),
        cpu("aten::empty_like", 10.0, 10.0, 101),
        launch(50.0, 1),
        kernel("void cuApplyLayerNorm<float>(float*)", 200.0, 30.0, 1),
        cpu("aten::relu", 120.0, 20.0, 102),
        launch(125.0, 2),
        kernel("void at::native::vectorized_elementwise_kernel<4>(int)", 240.0, 5.0, 2),
        cpu("ScaledMaskedSoftmax", 150.0, 30.0, 103),
        launch(160.0, 3),
        kernel("void scaled_masked_softmax_warp_forward<half>(half*)", 250.0, 7.0, 3),
        // The next iteration's launch, outside the one the ET recorded.
        launch(1000.0, 4),
        kernel("void at::native::vectorized_elementwise_kernel<4>(int)", 1010.0, 5.0, 4),
    ]});
    let k = parse_kineto(k.to_string().as_bytes(), "k.json").unwrap();
    (b.build(), k)
}

#[test]
fn kernels_launched_under_annotations_are_counted_and_attributed() {
    let (t, k) = megatron_like();
    let g = Graph::new(&t);
    let set = g.replay_set(None);
    let names: Vec<&str> = set.ops.iter().map(|&i| g.name(i)).collect();
    assert_eq!(names, ["aten::empty_like", "aten::relu"]);
    let l = link(&g, &set, &k).unwrap();
    assert_eq!(l.method, Method::RecordFunctionId);
    assert_eq!(
        l.gpu_events.iter().map(Vec::len).collect::<Vec<_>>(),
        [0, 1]
    );
    let off: Vec<(&str, Option<&str>, Option<usize>)> = l
        .gpu_off_op
        .iter()
        .map(|o| {
            (
                k.str(k.events[o.event as usize].name),
                o.launched_under.map(|c| k.str(k.events[c as usize].name)),
                o.attributed_to,
            )
        })
        .collect();
    assert_eq!(
        off,
        [
            (
                "void cuApplyLayerNorm<float>(float*)",
                Some("FusedLayerNormAffineFunction"),
                Some(0)
            ),
            (
                "void scaled_masked_softmax_warp_forward<half>(half*)",
                Some("ScaledMaskedSoftmax"),
                None
            ),
        ]
    );
    // The iteration's GPU work is all three kernels; the layer norm's counts for empty_like.
    let (a, per_op) = original_gpu(&l, &k);
    assert_eq!(a.events, 3);
    assert_eq!(a.compute_us, 42.0);
    assert_eq!(per_op, [Some(30.0), Some(5.0)]);
    let s = off_op_summary(&l, &k);
    assert_eq!((s.under_ops, s.attributed, s.unattributed), (1, 1, 1));
    assert_eq!((s.attributed_us, s.unattributed_us), (30.0, 7.0));
    assert_eq!(
        s.by_launcher[0].launched_under,
        "FusedLayerNormAffineFunction"
    );
    assert_eq!(s.by_launcher[0].kernels, ["cuApplyLayerNorm"]);
    assert!(!s.by_launcher[1].attributed);
}

#[test]
fn every_gpu_event_of_a_public_iteration_is_counted_once() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/traces/public/param_dlrm_8rank_1.0.1");
    let (et, kt) = (
        dir.join("rank0.et.json.gz"),
        dir.join("rank0.kineto.json.gz"),
    );
    if !et.exists() {
        eprintln!("skipped: {} is missing", et.display());
        return;
    }
    let t = et_schema::read_trace(&et).unwrap();
    let k = et_schema::kineto::read_kineto(&kt).unwrap();
    let g = Graph::new(&t);
    let set = g.replay_set(None);
    let l = link(&g, &set, &k).unwrap();
    // Independently: the GPU events whose runtime call lies in the trace's one profiler step.
    let step = et_graph::profiler_steps(&k);
    assert_eq!(step.len(), 1);
    let (_, a, b) = step[0];
    let in_step: std::collections::BTreeSet<u32> = {
        use et_schema::kineto::Category::*;
        let calls: std::collections::HashSet<u64> = k
            .events
            .iter()
            .filter(|e| matches!(e.cat, CudaRuntime | CudaDriver) && e.ts >= a && e.ts <= b)
            .filter_map(|e| e.correlation)
            .collect();
        (0..k.events.len() as u32)
            .filter(|&i| {
                let e = &k.events[i as usize];
                matches!(e.cat, Kernel | GpuMemcpy | GpuMemset)
                    && e.correlation.is_some_and(|c| calls.contains(&c))
            })
            .collect()
    };
    let mut counted: Vec<u32> = l.gpu_events.iter().flatten().copied().collect();
    counted.extend(l.gpu_off_op.iter().map(|o| o.event));
    let n = counted.len();
    let counted: std::collections::BTreeSet<u32> = counted.into_iter().collect();
    assert_eq!(n, counted.len(), "an event counted twice");
    assert_eq!(counted, in_step);
    // fbgemm's backward kernels run under autograd's CppNode, outside the linked ops, and are
    // given to the replayed ops it holds.
    assert!(!l.gpu_off_op.is_empty());
    for o in &l.gpu_off_op {
        let under = &k.events[o.launched_under.expect("launched under an event") as usize];
        assert!(
            k.str(under.name).contains("CppNode"),
            "{}",
            k.str(under.name)
        );
        let op = l.event_of[o.attributed_to.expect("attributed")].unwrap();
        let op = &k.events[op as usize];
        assert!(op.tid == under.tid && op.ts >= under.ts && op.ts <= under.ts + under.dur);
    }
    let (act, per_op) = original_gpu(&l, &k);
    assert_eq!(act.events, in_step.len());
    let total: f64 = per_op.iter().flatten().sum();
    assert!((total - (act.compute_us + act.comm_us + act.memcpy_us + act.memset_us)).abs() < 1e-6);
}
