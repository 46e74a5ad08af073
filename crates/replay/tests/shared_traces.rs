//! Real traces, real libtorch: every shared CPU trace replays completely on CPU.

mod common;
use common::{replay_with, shared};
use std::path::PathBuf;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The execution trace observer's callbacks are process-wide: while one test replays under
/// the instrumentation, the observer records every op that any other thread runs, and it is
/// not safe for that (it crashed in `recordOperatorStart` with another test's op). libtorch
/// also has one profiler session, and a second start is refused. So a test that replays under
/// the instrumentation runs alone in this binary ([`instrumented`]), and every other test
/// holds [`plain`] while it runs ops.
static INSTRUMENTATION: RwLock<()> = RwLock::new(());

fn plain() -> RwLockReadGuard<'static, ()> {
    INSTRUMENTATION.read().unwrap_or_else(|e| e.into_inner())
}

fn instrumented() -> RwLockWriteGuard<'static, ()> {
    INSTRUMENTATION.write().unwrap_or_else(|e| e.into_inner())
}

fn replay(rel: &str, only: et_graph::Kind) -> replay::Report {
    tch::set_num_threads(1);
    let sel = et_graph::Selection {
        kind: only,
        ..Default::default()
    };
    replay_selected(rel, &sel, 2, 1)
}

/// The compiled CPU plan of a shared trace's whole replay set.
fn cpu_plan(rel: &str) -> replay::plan::Plan {
    let t = et_schema::read_trace(&shared(rel)).unwrap();
    let g = et_graph::Graph::new(&t);
    let set = g.select(&Default::default()).unwrap();
    replay::plan::compile(&g, &set)
}

/// Replays the selected ops of a shared trace (with `sel.kind` as `--only`).
fn replay_selected(
    rel: &str,
    sel: &et_graph::Selection,
    iters: usize,
    warmup: usize,
) -> replay::Report {
    let opts = replay::ReplayOptions {
        iters,
        warmup,
        only: sel.kind,
        ..Default::default()
    };
    replay_with(rel, sel, &opts)
}

#[test]
fn every_single_rank_cpu_trace_replays_without_failures() {
    let _plain = plain();
    for m in [
        "mlp.et.json",
        "cnn.et.json.gz",
        "transformer.et.json.gz",
        "dlrm.et.json",
        "mlp.linked.et.json",
        "cnn.linked.et.json.gz",
        "transformer.linked.et.json.gz",
        "dlrm.linked.et.json.gz",
    ] {
        let r = replay(&format!("cpu/{m}"), et_graph::Kind::All);
        assert_eq!(r.ops_failed, 0, "{m}: {:?}", r.failures);
        assert_eq!(r.ops_replayed, r.ops_selected, "{m}");
        assert!(r.ops_selected > 40, "{m}");
        assert!(r.iter_ms.median > 0.0 && r.peak_bytes > 0, "{m}");
        // Every forward op the original recorded for autograd is recorded again.
        assert!(r.fallbacks.is_empty(), "{m}: {:?}", r.fallbacks);
    }
}

/// The forward runs as the original's did, recording a graph from parameters that require
/// grad; the trace's explicit backward and optimizer ops run without one.
#[test]
fn forward_ops_record_autograd_and_backward_ops_do_not() {
    let _plain = plain();
    let plan = cpu_plan("cpu/mlp.linked.et.json");
    assert!(!plan.grad_inputs.is_empty());
    let bound = replay::bind(&plan, &replay::Device::Cpu);
    let (slots, failures) = replay::executor::run_once_keep(&plan, &bound).unwrap();
    assert!(failures.is_empty(), "{failures:?}");
    let out = |name: &str| {
        let step = plan.steps.iter().find(|s| s.name == name).unwrap();
        assert_eq!(step.autograd, name == "aten::linear", "{name}");
        match &step.outs[0] {
            replay::plan::Out::Tensor(s) => slots[*s as usize].as_ref().unwrap().shallow_clone(),
            o => panic!("{o:?}"),
        }
    };
    assert!(out("aten::linear").requires_grad());
    assert!(!out("aten::threshold_backward").requires_grad());
}

#[test]
fn the_gloo_traces_replay_their_compute_on_cpu() {
    let _plain = plain();
    for m in ["dist_mlp_w2.rank0.et.json", "dist_mlp_w2.rank1.et.json"] {
        let r = replay(&format!("cpu/{m}"), et_graph::Kind::Compute);
        assert_eq!(r.ops_failed, 0, "{m}: {:?}", r.failures);
        assert_eq!(r.ops_replayed, r.ops_selected);
    }
}

#[test]
fn gpu_traces_replay_on_cpu_with_fallbacks() {
    let _plain = plain();
    // A DDP ResNet captured on a GPU: cudnn batch-norm backward runs as the native op on CPU.
    // (Only a window of it: the whole iteration takes tens of seconds on two cores.)
    let sel = et_graph::Selection {
        kind: et_graph::Kind::Compute,
        name: Some(regex::Regex::new("batch_norm|relu|threshold|add").unwrap()),
        ..Default::default()
    };
    let r = replay_selected("public/param_resnet_1.1.0.et.json.gz", &sel, 1, 0);
    assert_eq!(r.ops_failed, 0, "{:?}", r.failures);
    assert!(r
        .fallbacks
        .iter()
        .any(|f| f.op == "aten::cudnn_batch_norm_backward"
            && f.ran_as.contains("native_batch_norm_backward")));
}

/// The 8-rank DLRM trace (GPU, 2023) calls fbgemm_gpu operators; with fbgemm's CPU library
/// loaded all but the GPU-only fused Adagrad lookup replay on CPU. `cargo xtask test` installs
/// the library and sets MYSTIQUE_FBGEMM_DIR; without it this test only checks the rest.
#[test]
fn public_dlrm_rank_replays_on_cpu_with_fbgemm_loaded() {
    let _plain = plain();
    let dir = std::env::var_os("MYSTIQUE_FBGEMM_DIR").map(PathBuf::from);
    let mut loaded = false;
    if let Some(d) = &dir {
        let mut libs: Vec<PathBuf> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("fbgemm_gpu_")
                    && p.extension().is_some_and(|e| e == "so")
            })
            .collect();
        libs.sort();
        assert!(!libs.is_empty(), "no fbgemm_gpu_*.so in {}", d.display());
        for l in libs {
            replay::load_library(&l).unwrap();
        }
        loaded = true;
    }
    let sel = et_graph::Selection {
        kind: et_graph::Kind::Compute,
        ..Default::default()
    };
    let r = replay_selected("public/param_dlrm_8rank_1.0.1/rank3.et.json.gz", &sel, 1, 0);
    let non_fbgemm: Vec<_> = r
        .failures
        .iter()
        .filter(|f| !f.op.starts_with("fbgemm::"))
        .collect();
    assert!(non_fbgemm.is_empty(), "{non_fbgemm:?}");
    if loaded {
        assert!(
            r.ops_replayed * 100 >= r.ops_selected * 99,
            "{} of {}: {:?}",
            r.ops_replayed,
            r.ops_selected,
            r.failures
        );
        assert!(
            r.failures
                .iter()
                .all(|f| f.op == "fbgemm::split_embedding_codegen_lookup_adagrad_function"),
            "{:?}",
            r.failures
        );
    }
}

/// One extra iteration under the capture's instrumentation (execution trace observer + Kineto)
/// finds every dispatched op among the profiler's events, in order, and leaves no file behind.
#[test]
fn an_instrumented_iteration_profiles_every_op() {
    let _alone = instrumented();
    tch::set_num_threads(1);
    let t = et_schema::read_trace(&shared("cpu/mlp.linked.et.json")).unwrap();
    let g = et_graph::Graph::new(&t);
    let set = g.replay_set(None);
    let opts = replay::ReplayOptions {
        warmup: 1,
        iters: 2,
        instrument: true,
        ..Default::default()
    };
    // Twice: the observer and the profiler must be switched off cleanly after each.
    for _ in 0..2 {
        let r = replay::replay(&g, &set, &opts).unwrap().0;
        assert_eq!(r.ops_failed, 0);
        assert_eq!(r.profiled.len(), set.ops.len());
        let mut prev_end = f64::NEG_INFINITY;
        for (pos, p) in r.profiled.iter().enumerate() {
            let p =
                p.unwrap_or_else(|| panic!("step {pos} ({}) not profiled", g.name(set.ops[pos])));
            assert!(
                p.start_us >= prev_end && p.end_us >= p.start_us,
                "step {pos}"
            );
            prev_end = p.end_us;
        }
        // aten::linear runs aten::t and aten::addmm inside it: nested events are counted.
        let linear = set
            .ops
            .iter()
            .position(|&o| g.name(o) == "aten::linear")
            .unwrap();
        assert!(r.profiled[linear].unwrap().nested >= 2);
        // The measured iterations are the plain ones.
        assert_eq!(r.iters, 2);
        // The events' costs were timed one at a time between the steps of a last,
        // unrecorded iteration under the instrumentation.
        assert!(r.events_probed_in_context);
        let plain = r.instrumented_event_us.expect("probed");
        let (backward, per_tensor) = r.instrumented_backward_event_us.expect("probed");
        assert!(plain.is_finite() && plain > 0.0, "{plain}");
        // Two differences of timings floored at 0 (`backward_costs`): either may be 0 on a
        // noisy host (the four-tensor probe slow enough to take the whole one-tensor cost as
        // per tensor), not both.
        assert!(backward.is_finite() && backward >= 0.0, "{backward}");
        assert!(per_tensor.is_finite() && per_tensor >= 0.0, "{per_tensor}");
        assert!(backward + per_tensor > 0.0, "{backward} {per_tensor}");
    }
    let leftovers = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("mystique-calibration-{}-", std::process::id()))
        })
        .count();
    assert_eq!(leftovers, 0);
}

/// With the mechanisms probed, a plain probe iteration and the instrumented one time
/// autograd's engine running nodes, and an op called through the dispatcher where asked
/// (`probe_op`), and the report holds what the instrumentation adds to each; the measured
/// iterations stay the plain ones, and every op is still found in the profile (the probes'
/// events come after the recorded iterations'). Without, neither is timed.
#[test]
fn probing_the_mechanisms_measures_an_ops_and_a_nodes_instrumentation_cost() {
    let _alone = instrumented();
    tch::set_num_threads(1);
    let t = et_schema::read_trace(&shared("cpu/mlp.et.json")).unwrap();
    let g = et_graph::Graph::new(&t);
    let set = g.replay_set(None);
    let base = replay::ReplayOptions {
        warmup: 1,
        iters: 2,
        instrument: true,
        instrumentation: et_graph::Instrumentation {
            execution_trace: false,
            record_shapes: true,
            profile_memory: false,
        },
        ..Default::default()
    };
    let without = replay::replay(&g, &set, &base).unwrap().0;
    assert_eq!(without.instrumented_op_us, None);
    assert_eq!(without.instrumented_node_us, None);
    // The engine alone unless the op is asked for too.
    let nodes_only = replay::ReplayOptions {
        probe_mechanisms: true,
        ..base.clone()
    };
    let r = replay::replay(&g, &set, &nodes_only).unwrap().0;
    assert_eq!(r.instrumented_op_us, None);
    assert!(r.instrumented_node_us.is_some());
    let probed = replay::ReplayOptions {
        probe_mechanisms: true,
        probe_op: true,
        ..base
    };
    let r = replay::replay(&g, &set, &probed).unwrap().0;
    assert_eq!(r.ops_failed, 0);
    assert_eq!(r.iters, 2);
    assert!(r.profiled.iter().all(|p| p.is_some()));
    let op = r.instrumented_op_us.expect("op probed");
    let node = r.instrumented_node_us.expect("nodes probed");
    // On a trace this small (45 op probes, 23 node probes) the difference is noisy: on the
    // zoo's traces of hundreds of steps it is steady (0.42-0.49 µs an op over five
    // calibrations of gru_lm_adam), here it is only read back.
    assert!(op.is_finite() && op >= 0.0, "{op}");
    assert!(node.is_finite() && node >= 0.0, "{node}");
}

/// Under the execution trace observer, with `probe_calls` the probe iterations also probe each
/// op's own call: its record-function scope with the step's inputs, without the call. Each
/// step gets what the instrumentation adds to its call outside the call's window, found by
/// the probe event's tag; the tagged events are not taken for the steps' own (every step is
/// still found), and the boxing that the probes' boxed inputs leave out is probed beside the
/// op. Unless asked for (`probe_calls`), and without the observer, no call is probed.
#[test]
fn under_the_observer_each_ops_call_is_probed_with_its_own_inputs() {
    let _alone = instrumented();
    tch::set_num_threads(1);
    let t = et_schema::read_trace(&shared("cpu/mlp.linked.et.json")).unwrap();
    let g = et_graph::Graph::new(&t);
    let set = g.replay_set(None);
    let opts = |execution_trace: bool, probe_calls: bool| replay::ReplayOptions {
        warmup: 1,
        iters: 2,
        instrument: true,
        instrumentation: et_graph::Instrumentation {
            execution_trace,
            record_shapes: true,
            profile_memory: false,
        },
        probe_mechanisms: true,
        probe_op: true,
        probe_calls,
        ..Default::default()
    };
    let r = replay::replay(&g, &set, &opts(true, true)).unwrap().0;
    assert_eq!(r.ops_failed, 0);
    assert!(r.profiled.iter().all(|p| p.is_some()));
    assert_eq!(r.instrumented_call_us.len(), set.ops.len());
    let costs: Vec<f64> = r.instrumented_call_us.iter().flatten().copied().collect();
    assert_eq!(costs.len(), set.ops.len(), "{:?}", r.instrumented_call_us);
    assert!(
        costs.iter().all(|c| c.is_finite() && *c >= 0.0),
        "{costs:?}"
    );
    // The observer's entry callback records every input: the calls cost something.
    assert!(costs.iter().sum::<f64>() > 0.0, "{costs:?}");
    let boxing = r.instrumented_boxing_us.expect("boxing probed");
    assert!(boxing.is_finite() && boxing >= 0.0, "{boxing}");
    // Not asked for, or without the observer: none.
    for (observer, calls) in [(true, false), (false, true)] {
        let r = replay::replay(&g, &set, &opts(observer, calls)).unwrap().0;
        assert!(r.instrumented_call_us.is_empty());
        assert_eq!(r.instrumented_boxing_us, None);
    }
}

/// Values stay finite across iterations: parameters carry their optimizer updates from one
/// iteration to the next, so synthetic inputs that are invalid for their consumer (a negative
/// second moment under Adam's sqrt, a random loss divisor, weights at a scale that grows
/// activations per layer) show up as NaN/Inf within tens of iterations, and NaN makes kernels
/// run at speeds the original never had (max_pool2d 2.5x faster on cnn).
#[test]
fn values_stay_finite_over_many_iterations() {
    let _plain = plain();
    tch::set_num_threads(1);
    let sel = et_graph::Selection::default();
    for (m, iters) in [
        ("cpu/mlp.linked.et.json", 60),
        ("cpu/cnn.linked.et.json.gz", 60),
        ("cpu/transformer.linked.et.json.gz", 20),
        ("cpu/dlrm.linked.et.json.gz", 60),
        ("public/param_linear_1.0.1.et.json.gz", 5),
    ] {
        let r = replay_selected(m, &sel, iters, 0);
        assert_eq!(r.ops_failed, 0, "{m}: {:?}", r.failures);
        assert_eq!(r.nonfinite_externals, 0, "{m}");
    }
}

/// Python numbers passed to Tensor overloads reach the trace as 0-dim doubles without their
/// value (Adam's `exp_avg_sq.mul_(beta2)`): in an optimizer's exponential average the decay is
/// 1 less the complement the next op adds (`addcmul_(g, g, value=1 - beta2)`, recorded), not a
/// random one that decays the state into denormals over a few tens of iterations, nor 1, which
/// never decays it.
#[test]
fn wrapped_python_numbers_in_optimizer_averages_are_their_decays() {
    let _plain = plain();
    let plan = cpu_plan("cpu/cnn.linked.et.json.gz");
    let mut wrapped = 0;
    for step in plan.steps.iter().filter(|s| s.name == "aten::mul_") {
        let replay::plan::Arg::Tensor(other) = &step.args[1] else {
            continue;
        };
        if let Some((_, spec, fill)) = plan.externals.iter().find(|e| e.0 == *other) {
            if spec.shape.is_empty() && spec.dtype == et_schema::DType::Float64 {
                let replay::plan::Fill::Value(v) = fill else {
                    panic!("{fill:?}")
                };
                // Adam's default beta2, to the precision the trace's six decimals leave of 0.001.
                assert!((v - 0.999).abs() < 1e-6, "{v}");
                wrapped += 1;
            }
        }
    }
    // One beta2 per parameter of the cnn's Adam step.
    assert_eq!(wrapped, 10);
}

/// A compiled plan is pure data that a benchmark package stores: for every shared trace (the
/// public ones too, but the largest) it survives a serde round trip (compared as re-serialised
/// JSON, since NaN != NaN), passes the checks a package's reader makes, and binds to the same
/// operators.
#[test]
fn compiled_plans_of_every_shared_cpu_trace_round_trip_through_serde() {
    let _plain = plain();
    let mut names: Vec<String> = ["cpu", "public"]
        .iter()
        .flat_map(|d| {
            std::fs::read_dir(shared(d))
                .unwrap()
                .map(move |e| format!("{d}/{}", e.unwrap().file_name().to_string_lossy()))
        })
        .filter(|n| n.contains(".et.json") && !n.contains("gpt2"))
        .collect();
    names.sort();
    assert!(names.len() >= 15, "{names:?}");
    for n in names {
        let plan = cpu_plan(&n);
        let text = serde_json::to_string(&plan).unwrap();
        let back: replay::plan::Plan = serde_json::from_str(&text).unwrap();
        assert_eq!(serde_json::to_string(&back).unwrap(), text, "{n}");
        assert_eq!(back.steps.len(), plan.steps.len(), "{n}");
        assert!(!back.steps.is_empty(), "{n}");
        // What a package's reader checks holds for every compiled plan (slot count included).
        back.validate().unwrap_or_else(|e| panic!("{n}: {e}"));
        // The stored plan binds to the same operators as the one compiled here.
        let (a, b) = (
            replay::bind(&plan, &replay::Device::Cpu),
            replay::bind(&back, &replay::Device::Cpu),
        );
        let ok = |x: &replay::Bound| {
            x.steps
                .iter()
                .filter(|s| matches!(s.exec, replay::bind::Exec::Call(_)))
                .count()
        };
        assert_eq!(ok(&a), ok(&b), "{n}");
        if n.starts_with("cpu/") && !plan.steps.iter().any(|s| s.kind.is_collective()) {
            assert_eq!(ok(&a), plan.steps.len(), "{n}: every op resolves");
        }
    }
}

/// `--only` is the replay's decision: with every op of a Gloo trace planned, `compute` leaves
/// the collectives out (their outputs pass through or get stand-ins) and everything that
/// depends on them still runs; `comm` leaves the compute out.
#[test]
fn only_leaves_steps_out_and_their_dependants_still_run() {
    let _plain = plain();
    tch::set_num_threads(1);
    let opts = |only| replay::ReplayOptions {
        only,
        iters: 2,
        warmup: 1,
        ..Default::default()
    };
    let all = et_graph::Selection::default();
    let rel = "cpu/dist_mlp_w2.rank0.et.json";
    let r = replay_with(rel, &all, &opts(et_graph::Kind::Compute));
    assert_eq!(r.ops_failed, 0, "{:?}", r.failures);
    assert_eq!(r.ops_skipped, 6, "the six Gloo collectives");
    assert_eq!(r.ops_replayed, r.ops_selected);
    let c = replay_with(rel, &all, &opts(et_graph::Kind::Comm));
    assert_eq!(c.ops_selected, 6);
    assert_eq!(c.ops_skipped, r.ops_selected);
    // Collectives run with the distributed replay; in one process they fail, typed.
    assert!(c
        .failures
        .iter()
        .all(|f| f.kind == replay::ErrorKind::Unsupported));
}

/// A training step's replay lets go of the autograd graph after each forward's last recorded
/// step (it runs the trace's backward ops itself; held, the graph kept every saved tensor
/// through the backward, a public ResNet step at twice its memory); a replay without
/// autograd has no graph to let go of.
#[test]
fn training_replays_let_go_of_the_forward_graph_before_the_backward() {
    let _plain = plain();
    for m in ["cpu/cnn.et.json.gz", "cpu/transformer.et.json.gz"] {
        let plan = cpu_plan(m);
        assert!(!plan.graph_releases.is_empty(), "{m}");
        let r = replay(m, et_graph::Kind::All);
        assert_eq!(r.ops_failed, 0, "{m}: {:?}", r.failures);
        assert!(r.graph_released > 0, "{m}");
        let opts = replay::ReplayOptions {
            iters: 1,
            warmup: 0,
            autograd: false,
            ..Default::default()
        };
        let plain = replay_with(m, &Default::default(), &opts);
        assert_eq!(plain.graph_released, 0, "{m}");
    }
}
