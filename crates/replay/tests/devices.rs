//! The same checks on every device: CPU always, CUDA on a machine with a GPU (ignored
//! elsewhere; `cargo xtask gpu-check` runs it). See `replay::test_device!`.

mod common;
use common::replay_with;
use et_schema::testkit::{tensor, TraceBuilder};
use serde_json::json;

/// A shared CPU trace replays completely on the device, and the report names it.
fn mlp_replays_completely(device: &replay::Device) {
    let opts = replay::ReplayOptions {
        device: *device,
        warmup: 1,
        iters: 2,
        ..Default::default()
    };
    let r = replay_with("cpu/mlp.et.json", &Default::default(), &opts);
    assert_eq!(r.ops_failed, 0, "{:?}", r.failures);
    assert_eq!(r.ops_replayed, r.ops_selected);
    assert!(r.ops_selected > 40);
    assert_eq!(r.device, device.name());
    assert!(r.iter_ms.median > 0.0);
    // Every op has a launch time beside its (host or device) time.
    assert!(r.ops.iter().all(|o| o.launch_us > 0.0), "{:?}", r.ops);
    let cpu = r.cpu.as_ref().expect("CPU counters on every device");
    assert!(cpu.per_iter.user_ms + cpu.per_iter.sys_ms > 0.0, "{cpu:?}");
    // The first measured iteration's memory, counted by the device's allocator over its start:
    // an MLP's training step holds its activations at once, and its gradients after.
    let mem = r
        .iteration_memory
        .as_ref()
        .expect("the iteration's memory on every device");
    assert!(mem.peak_over_start_bytes > 0, "{mem:?}");
    assert!(mem.held_after_bytes <= mem.peak_over_start_bytes, "{mem:?}");
    match device {
        replay::Device::Cpu => {
            assert_eq!(r.timing, "host clock");
            assert!(r.cuda_memory.is_none() && r.gpu.is_none() && r.gpu_unavailable.is_none());
            // Host clock: an op's time is its launch time.
            for o in &r.ops {
                assert!((o.mean_us - o.launch_us).abs() < 1e-6, "{o:?}");
            }
        }
        replay::Device::Cuda(_) => {
            assert_eq!(r.timing, "cuda events", "{:?}", r.event_error);
            let m = r.cuda_memory.expect("allocator statistics on CUDA");
            assert!(m.arena_bytes >= r.external_bytes, "{m:?}");
            assert!(m.allocator.peak_allocated_bytes > 0, "{m:?}");
            assert!(r.gpu.is_some() || r.gpu_unavailable.is_some());
        }
    }
}

/// External inputs stay valid after the executor that made them is gone (on CUDA they live in
/// an arena that each storage keeps alive).
fn externals_outlive_their_executor(device: &replay::Device) {
    let t = et_schema::read_trace(&common::shared("cpu/mlp.et.json")).unwrap();
    let g = et_graph::Graph::new(&t);
    let set = g.select(&Default::default()).unwrap();
    let plan = replay::plan::compile(&g, &set);
    let bound = replay::bind(&plan, device);
    let (slots, failures) = replay::executor::run_once_keep(&plan, &bound).unwrap();
    assert!(failures.is_empty(), "{failures:?}");
    drop(bound);
    let mut seen = 0;
    for (slot, _, _) in &plan.externals {
        if let Some(t) = &slots[*slot as usize] {
            assert_eq!(t.device(), device_tch(device));
            let s = t.to_kind(tch::Kind::Double).sum(tch::Kind::Double);
            assert!(s.double_value(&[]).is_finite());
            seen += 1;
        }
    }
    assert!(seen > 5, "{seen} externals checked");
}

fn device_tch(d: &replay::Device) -> tch::Device {
    match d {
        replay::Device::Cpu => tch::Device::Cpu,
        replay::Device::Cuda(i) => tch::Device::Cuda(*i),
    }
}

/// `--trace-out`'s timeline: one op track on CPU; launches and device times on CUDA.
fn timeline_has_the_device_tracks(device: &replay::Device) {
    let out = std::env::temp_dir().join(format!("mq-timeline-{}.json", std::process::id()));
    let opts = replay::ReplayOptions {
        device: *device,
        warmup: 1,
        iters: 1,
        trace_out: Some(out),
        ..Default::default()
    };
    let t = et_schema::read_trace(&common::shared("cpu/mlp.et.json")).unwrap();
    let g = et_graph::Graph::new(&t);
    let set = g.select(&Default::default()).unwrap();
    let (r, timeline) = replay::replay(&g, &set, &opts).unwrap();
    let on = |tid| timeline.slices.iter().filter(|s| s.tid == tid).count();
    assert_eq!(on(1), r.ops_replayed, "one launch slice per op");
    match device {
        replay::Device::Cpu => assert_eq!((on(2), timeline.threads.len()), (0, 1)),
        replay::Device::Cuda(_) => assert_eq!((on(2), timeline.threads.len()), (on(1), 2)),
    }
}

/// The device's timer resolves marks in order, and its memory snapshot reads.
fn timer_marks_are_ordered(device: &replay::Device) {
    // On CUDA the replay stream becomes current, so the matmul below is what the events time.
    device.setup_process().unwrap();
    let mut timer = device.timer();
    let a = timer.mark();
    let x = tch::Tensor::ones([64, 64], (tch::Kind::Float, device_tch(device)));
    let _y = x.matmul(&x);
    let b = timer.mark();
    timer.resolve();
    assert!(timer.us(b) >= timer.us(a));
    if *device == replay::Device::Cpu && cfg!(target_os = "linux") {
        let m = device.memory().expect("CPU memory reads on Linux");
        assert!(m.peak_bytes >= m.live_bytes && m.live_bytes > 0, "{m:?}");
    }
}

/// A CPU trace's own ops replay on every device: on CUDA an op with no kernel there
/// (`_scaled_dot_product_flash_attention_for_cpu`) runs on the CPU and is reported so, a packed
/// sequence's lengths stay on the CPU (libtorch requires them there), and a bf16 layer norm's
/// saved statistics are made float32, the dtype CUDA's kernel reads them in (the CPU's keeps
/// bf16). Each of the three failed on CUDA before (the first GPU check, zoo traces).
/// A CPU trace's ops that need a detour or a placement off the CPU: a CPU-only attention, a
/// packed sequence whose lengths come through `to(int64)`, a bf16 layer norm backward.
fn cpu_only_ops(b: &mut TraceBuilder) {
    let f = |id, numel| tensor(id, id, 0, numel, 4, "cpu");
    let h = |id, numel| tensor(id, id, 0, numel, 2, "cpu");
    b.op(
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_flash_attention_for_cpu(Tensor query, Tensor key, Tensor value, \
         float dropout_p=0., bool is_causal=False, *, Tensor? attn_mask=None, float? scale=None) \
         -> (Tensor output, Tensor logsumexp)",
    )
    .input(f(1, 64), json!([1, 2, 4, 8]), "Tensor(float)")
    .input(f(2, 64), json!([1, 2, 4, 8]), "Tensor(float)")
    .input(f(3, 64), json!([1, 2, 4, 8]), "Tensor(float)")
    .input(json!(0.0), json!([]), "Double")
    .input(json!(false), json!([]), "Bool")
    .input(json!("<None>"), json!([]), "None")
    .input(json!("<None>"), json!([]), "None")
    .output(f(4, 64), json!([1, 2, 4, 8]), "Tensor(float)")
    .output(f(5, 8), json!([1, 2, 4]), "Tensor(float)")
    .done();
    // `lengths.to(torch.int64)`: the lengths reach the packing through a copy.
    b.op(
        "aten::to",
        "aten::to.dtype(Tensor(a) self, ScalarType dtype, bool non_blocking=False, bool copy=False, \
         MemoryFormat? memory_format=None) -> Tensor(a)",
    )
    .input(tensor(7, 7, 0, 2, 4, "cpu"), json!([2]), "Tensor(int)")
    .input(json!(4), json!([]), "Int")
    .input(json!(false), json!([]), "Bool")
    .input(json!(false), json!([]), "Bool")
    .input(json!("<None>"), json!([]), "None")
    .output(tensor(19, 19, 0, 2, 8, "cpu"), json!([2]), "Tensor(long int)")
    .done();
    b.op(
        "aten::_pack_padded_sequence",
        "aten::_pack_padded_sequence(Tensor input, Tensor lengths, bool batch_first) -> (Tensor, Tensor)",
    )
    .input(f(6, 24), json!([3, 2, 4]), "Tensor(float)")
    .input(tensor(19, 19, 0, 2, 8, "cpu"), json!([2]), "Tensor(long int)")
    .input(json!(false), json!([]), "Bool")
    .output(f(8, 20), json!([5, 4]), "Tensor(float)")
    .output(tensor(9, 9, 0, 3, 8, "cpu"), json!([3]), "Tensor(long int)")
    .done();
    b.op(
        "aten::native_layer_norm_backward",
        "aten::native_layer_norm_backward(Tensor grad_out, Tensor input, SymInt[] normalized_shape, \
         Tensor mean, Tensor rstd, Tensor? weight, Tensor? bias, bool[3] output_mask) \
         -> (Tensor, Tensor, Tensor)",
    )
    .input(h(10, 16), json!([2, 8]), "Tensor(c10::BFloat16)")
    .input(h(11, 16), json!([2, 8]), "Tensor(c10::BFloat16)")
    .input(json!([8]), json!([[]]), "GenericList[Int]")
    .input(h(12, 2), json!([2, 1]), "Tensor(c10::BFloat16)")
    .input(h(13, 2), json!([2, 1]), "Tensor(c10::BFloat16)")
    .input(h(14, 8), json!([8]), "Tensor(c10::BFloat16)")
    .input(h(15, 8), json!([8]), "Tensor(c10::BFloat16)")
    .input(json!([true, true, true]), json!([[], [], []]), "GenericList[Bool]")
    .output(h(16, 16), json!([2, 8]), "Tensor(c10::BFloat16)")
    .output(h(17, 8), json!([8]), "Tensor(c10::BFloat16)")
    .output(h(18, 8), json!([8]), "Tensor(c10::BFloat16)")
    .done();
}

fn cpu_trace_ops_replay_on_the_device(device: &replay::Device) {
    let mut b = TraceBuilder::new();
    cpu_only_ops(&mut b);
    let tr = b.build();
    let g = et_graph::Graph::new(&tr);
    let set = g.replay_set(None);
    let opts = replay::ReplayOptions {
        device: *device,
        warmup: 1,
        iters: 2,
        check_values: true,
        ..Default::default()
    };
    let (r, _) = replay::replay(&g, &set, &opts).unwrap();
    assert_eq!((r.ops_failed, r.ops_replayed), (0, 4), "{:?}", r.failures);
    assert!(r.first_nonfinite.is_none(), "{:?}", r.first_nonfinite);
    let on_cpu = r
        .fallbacks
        .iter()
        .any(|f| f.op.ends_with("_for_cpu") && f.ran_as.starts_with("on the CPU"));
    assert_eq!(on_cpu, *device != replay::Device::Cpu, "{:?}", r.fallbacks);
}

replay::test_device!(cpu_trace_ops, cpu_trace_ops_replay_on_the_device);

/// Off the CPU: packed-sequence lengths (made by `to(int64)` of an external) stay on the CPU,
/// a `gru.input`'s `hx` (second, as `gru.data`'s batch sizes are) does not, and a bf16 layer
/// norm backward's saved statistics become float32. The plan's analysis, checked without a GPU.
#[test]
fn device_placement_picks_host_lengths_and_float_statistics() {
    let f = |id, numel| tensor(id, id, 0, numel, 4, "cpu");
    let mut b = TraceBuilder::new();
    cpu_only_ops(&mut b);
    b.op(
        "aten::gru",
        "aten::gru.input(Tensor input, Tensor hx, Tensor[] params, bool has_biases, \
         int num_layers, float dropout, bool train, bool bidirectional, bool batch_first) \
         -> (Tensor, Tensor)",
    )
    .input(f(20, 24), json!([3, 2, 4]), "Tensor(float)")
    .input(f(21, 10), json!([1, 2, 5]), "Tensor(float)")
    .input(
        json!([f(22, 60), f(23, 75)]),
        json!([[15, 4], [15, 5]]),
        "GenericList[Tensor(float),Tensor(float)]",
    )
    .input(json!(false), json!([]), "Bool")
    .input(json!(1), json!([]), "Int")
    .input(json!(0.0), json!([]), "Double")
    .input(json!(false), json!([]), "Bool")
    .input(json!(false), json!([]), "Bool")
    .input(json!(false), json!([]), "Bool")
    .output(f(24, 30), json!([3, 2, 5]), "Tensor(float)")
    .output(f(25, 10), json!([1, 2, 5]), "Tensor(float)")
    .done();
    let tr = b.build();
    let g = et_graph::Graph::new(&tr);
    let plan = replay::plan::compile(&g, &g.replay_set(None));
    let step = |name: &str| {
        plan.steps
            .iter()
            .position(|s| s.name == name)
            .unwrap_or_else(|| panic!("no {name} step"))
    };
    let slot = |step: usize, k: usize| match plan.steps[step].args[k] {
        replay::plan::Arg::Tensor(s) => s as usize,
        ref a => panic!("step {step} argument {k}: {a:?}"),
    };
    let ext: std::collections::HashSet<usize> =
        plan.externals.iter().map(|(s, _, _)| *s as usize).collect();
    let (host, float) = plan.device_placement(&|s| ext.contains(&s));
    assert_eq!(
        host,
        vec![slot(step("aten::to"), 0)],
        "the lengths behind the to(int64) only"
    );
    let gru = step("aten::gru");
    assert!(
        !host.contains(&slot(gru, 1)),
        "gru.input's hx stays on the device"
    );
    let ln = step("aten::native_layer_norm_backward");
    assert_eq!(float, vec![slot(ln, 3), slot(ln, 4)]);
}
replay::test_device!(mlp_replays, mlp_replays_completely);
replay::test_device!(timer, timer_marks_are_ordered);
replay::test_device!(externals, externals_outlive_their_executor);
replay::test_device!(timeline, timeline_has_the_device_tracks);
