//! Real libtorch, hand-written traces: every argument kind reaches the operator with its value,
//! views share storage, failures do not stop the run.

use et_graph::Graph;
use et_schema::testkit::TraceBuilder;
use replay::bind::Exec;
use replay::executor::run_once_keep;
use replay::plan::{compile, Arg, Out, Plan};
use serde_json::{json, Value as J};
use tch::Tensor;

/// One recorded value: (value, shape, type string).
type V<'a> = (J, J, &'a str);
/// One op: (name, schema, inputs, outputs).
type OpRec<'a> = (&'a str, &'a str, Vec<V<'a>>, Vec<V<'a>>);

fn trace(ops: &[OpRec]) -> et_schema::Trace {
    let mut b = TraceBuilder::new();
    for (name, schema, ins, outs) in ops {
        let mut n = b.op(name, schema);
        for (v, shape, ty) in ins {
            n = n.input(v.clone(), shape.clone(), ty);
        }
        for (v, shape, ty) in outs {
            n = n.output(v.clone(), shape.clone(), ty);
        }
        n.done();
    }
    b.build()
}

/// `aten::full([2], v)` producing tensor `id` (its own storage).
fn full(id: u64, v: f64) -> OpRec<'static> {
    (
        "aten::full",
        FULL,
        vec![
            (json!([2]), json!([[]]), "GenericList[Int]"),
            (json!(v), json!([]), "Double"),
            (json!("<None>"), json!([]), "None"),
            (json!("<None>"), json!([]), "None"),
            (json!("<None>"), json!([]), "None"),
            (json!("<None>"), json!([]), "None"),
        ],
        vec![(t(id, id, 2), json!([2]), "Tensor(float)")],
    )
}

fn t(id: u64, storage: u64, numel: u64) -> J {
    json!([id, storage, 0, numel, 4, "cpu"])
}

/// A compiled plan with its CPU binding.
struct Planned {
    plan: Plan,
    bound: replay::Bound,
}

impl std::ops::Deref for Planned {
    type Target = Plan;
    fn deref(&self) -> &Plan {
        &self.plan
    }
}

impl Planned {
    /// The arguments step `k` is called with on CPU (after rewrites and reconciliation).
    fn args(&self, k: usize) -> &[Arg] {
        self.bound.args(&self.plan, k)
    }
}

fn run(tr: &et_schema::Trace) -> (Vec<Option<Tensor>>, Vec<(String, String)>, Planned) {
    let g = Graph::new(tr);
    let set = g.replay_set(None);
    let plan = compile(&g, &set);
    let bound = replay::bind(&plan, &replay::Device::Cpu);
    let (slots, failures) = run_once_keep(&plan, &bound).unwrap();
    (slots, failures, Planned { plan, bound })
}

/// The slot step `step` reads as its `k`th argument, a tensor.
fn arg_slot(plan: &Planned, step: usize, k: usize) -> usize {
    match &plan.args(step)[k] {
        Arg::Tensor(s) => *s as usize,
        other => panic!("{other:?}"),
    }
}

fn out_slot(plan: &Plan, step: usize, k: usize) -> usize {
    match &plan.steps[step].outs[k] {
        Out::Tensor(s) => *s as usize,
        other => panic!("{other:?}"),
    }
}

fn values(t: &Tensor) -> Vec<f64> {
    let t = t.to_kind(tch::Kind::Double).flatten(0, -1);
    (0..t.size()[0]).map(|i| t.double_value(&[i])).collect()
}

const FULL: &str = "aten::full(SymInt[] size, Scalar fill_value, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor";

#[test]
fn scalars_int_lists_dtypes_layouts_devices_and_defaulted_alpha() {
    // full([2,3], 2.0, dtype=float(6), layout=strided(0), device="cuda:0" (remapped), pin=False)
    // then add.Tensor(x, x, alpha=3) = 2 + 3*2 = 8; then add.Tensor with alpha left to its default.
    let tr = trace(&[
        (
            "aten::full",
            FULL,
            vec![
                (json!([2, 3]), json!([[], []]), "GenericList[Int,Int]"),
                (json!(2.0), json!([]), "Double"),
                (json!(6), json!([]), "Int"),
                (json!(0), json!([]), "Int"),
                (json!("cuda:0"), json!([]), "Device"),
                (json!(false), json!([]), "Bool"),
            ],
            vec![(t(10, 20, 6), json!([2, 3]), "Tensor(float)")],
        ),
        (
            "aten::add",
            "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
            vec![
                (t(10, 20, 6), json!([2, 3]), "Tensor(float)"),
                (t(10, 20, 6), json!([2, 3]), "Tensor(float)"),
                (json!(3), json!([]), "Int"),
            ],
            vec![(t(11, 21, 6), json!([2, 3]), "Tensor(float)")],
        ),
        (
            "aten::add",
            "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
            vec![
                (t(11, 21, 6), json!([2, 3]), "Tensor(float)"),
                (t(10, 20, 6), json!([2, 3]), "Tensor(float)"),
            ],
            vec![(t(12, 22, 6), json!([2, 3]), "Tensor(float)")],
        ),
    ]);
    let (slots, failures, plan) = run(&tr);
    assert!(failures.is_empty(), "{failures:?}");
    assert!(matches!(plan.steps[1].args[2], Arg::ScalarInt(3)));
    assert!(matches!(plan.steps[2].args[2], Arg::Default(2)));
    let x = slots[out_slot(&plan, 0, 0)].as_ref().unwrap();
    assert_eq!(x.size(), vec![2, 3]);
    assert_eq!(x.kind(), tch::Kind::Float);
    assert_eq!(values(x), vec![2.0; 6]);
    assert_eq!(
        values(slots[out_slot(&plan, 1, 0)].as_ref().unwrap()),
        vec![8.0; 6]
    );
    assert_eq!(
        values(slots[out_slot(&plan, 2, 0)].as_ref().unwrap()),
        vec![10.0; 6]
    );
}

#[test]
fn tensor_lists_optional_tensors_strings_bools_floats_and_none() {
    let tr = trace(&[
        full(1, 1.0),
        full(2, 6.0),
        // Tensor[]: cat([a, b]) = [1, 1, 6, 6]
        ("aten::cat", "aten::cat(Tensor[] tensors, int dim=0) -> Tensor", vec![(json!([t(1, 1, 2), t(2, 2, 2)]), json!([[2], [2]]), "GenericList[Tensor(float),Tensor(float)]"), (json!(0), json!([]), "Int")], vec![(t(3, 3, 4), json!([4]), "Tensor(float)")]),
        // str: div(b, a*4?) with rounding_mode "floor": floor(6 / 4) via div(cat, 4.0 scalar) is not
        // a Tensor op; use div.Tensor_mode(b, b2) where b2 = full(4)
        full(4, 4.0),
        ("aten::div", "aten::div.Tensor_mode(Tensor self, Tensor other, *, str? rounding_mode) -> Tensor", vec![(t(2, 2, 2), json!([2]), "Tensor(float)"), (t(4, 4, 2), json!([2]), "Tensor(float)"), (json!("floor"), json!([]), "String")], vec![(t(5, 5, 2), json!([2]), "Tensor(float)")]),
        // float + bool + optional tensor None: layer_norm-free check through clamp(min=0.5, max=None)
        ("aten::clamp", "aten::clamp(Tensor self, Scalar? min=None, Scalar? max=None) -> Tensor", vec![(t(5, 5, 2), json!([2]), "Tensor(float)"), (json!(1.5), json!([]), "Double"), (json!("<None>"), json!([]), "None")], vec![(t(6, 6, 2), json!([2]), "Tensor(float)")]),
        // Tensor?[]: index(cat, [None]) is invalid; use index with one index tensor from arange
        ("aten::arange", "aten::arange(Scalar end, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor", vec![(json!(2), json!([]), "Int"), (json!(4), json!([]), "Int"), (json!("<None>"), json!([]), "None"), (json!("cpu"), json!([]), "Device"), (json!(false), json!([]), "Bool")], vec![(json!([7, 7, 0, 2, 8, "cpu"]), json!([2]), "Tensor(long int)")]),
        ("aten::index", "aten::index.Tensor(Tensor self, Tensor?[] indices) -> Tensor", vec![(t(3, 3, 4), json!([4]), "Tensor(float)"), (json!([[7, 7, 0, 2, 8, "cpu"]]), json!([[2]]), "GenericList[Tensor(long int)]")], vec![(t(8, 8, 2), json!([2]), "Tensor(float)")]),
        // bool: sum(dim=[0], keepdim=True)
        ("aten::sum", "aten::sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor", vec![(t(3, 3, 4), json!([4]), "Tensor(float)"), (json!([0]), json!([[]]), "GenericList[Int]"), (json!(true), json!([]), "Bool"), (json!("<None>"), json!([]), "None")], vec![(t(9, 9, 1), json!([1]), "Tensor(float)")]),
        // memory format: contiguous(memory_format=0)
        ("aten::contiguous", "aten::contiguous(Tensor(a) self, *, MemoryFormat memory_format=contiguous_format) -> Tensor(a)", vec![(t(3, 3, 4), json!([4]), "Tensor(float)"), (json!(0), json!([]), "Int")], vec![(t(3, 3, 4), json!([4]), "Tensor(float)")]),
    ]);
    let (slots, failures, plan) = run(&tr);
    assert!(failures.is_empty(), "{failures:?}");
    assert_eq!(
        values(slots[out_slot(&plan, 2, 0)].as_ref().unwrap()),
        vec![1.0, 1.0, 6.0, 6.0]
    );
    assert_eq!(
        values(slots[out_slot(&plan, 4, 0)].as_ref().unwrap()),
        vec![1.0, 1.0]
    );
    assert_eq!(
        values(slots[out_slot(&plan, 5, 0)].as_ref().unwrap()),
        vec![1.5, 1.5]
    );
    let idx = slots[out_slot(&plan, 6, 0)].as_ref().unwrap();
    assert_eq!(idx.kind(), tch::Kind::Int64);
    assert_eq!(
        values(slots[out_slot(&plan, 7, 0)].as_ref().unwrap()),
        vec![1.0, 1.0]
    );
    assert_eq!(
        values(slots[out_slot(&plan, 8, 0)].as_ref().unwrap()),
        vec![14.0]
    );
    assert!(matches!(plan.steps[8].args[1], Arg::IntList(_)));
}

#[test]
fn foreach_ops_with_scalar_lists_run() {
    let tr = trace(&[(
        "aten::_foreach_mul_",
        "aten::_foreach_mul_.ScalarList(Tensor(a!)[] self, Scalar[] scalars) -> ()",
        vec![
            (
                json!([t(1, 1, 2), t(2, 2, 2)]),
                json!([[2], [2]]),
                "GenericList[Tensor(float),Tensor(float)]",
            ),
            (
                json!([2.0, 3.0]),
                json!([[], []]),
                "GenericList[Double,Double]",
            ),
        ],
        vec![],
    )]);
    let (slots, failures, plan) = run(&tr);
    assert!(failures.is_empty(), "{failures:?}");
    assert_eq!(plan.externals.len(), 2);
    assert!(slots.iter().flatten().count() == 2);
}

#[test]
fn views_of_one_storage_share_it() {
    // Two external views of storage 50: a = [0..4), b = [2..4). fill_(a, 5) must show in b.
    let a = json!([1, 50, 0, 4, 4, "cpu"]);
    let b = json!([2, 50, 2, 2, 4, "cpu"]);
    let tr = trace(&[
        (
            "aten::fill_",
            "aten::fill_.Scalar(Tensor(a!) self, Scalar value) -> Tensor(a!)",
            vec![
                (a.clone(), json!([4]), "Tensor(float)"),
                (json!(5.0), json!([]), "Double"),
            ],
            vec![(a, json!([4]), "Tensor(float)")],
        ),
        (
            "aten::neg",
            "aten::neg(Tensor self) -> Tensor",
            vec![(b, json!([2]), "Tensor(float)")],
            vec![(t(3, 51, 2), json!([2]), "Tensor(float)")],
        ),
    ]);
    let (slots, failures, plan) = run(&tr);
    assert!(failures.is_empty(), "{failures:?}");
    assert_eq!(plan.externals.len(), 2);
    assert_eq!(
        values(slots[out_slot(&plan, 1, 0)].as_ref().unwrap()),
        vec![-5.0, -5.0]
    );
}

#[test]
fn a_failing_op_is_recorded_and_its_dependants_still_run() {
    let tr = trace(&[
        // mm of mismatched shapes fails; its output is synthesised from the recorded shape.
        (
            "aten::mm",
            "aten::mm(Tensor self, Tensor mat2) -> Tensor",
            vec![
                (t(1, 1, 6), json!([2, 3]), "Tensor(float)"),
                (t(2, 2, 8), json!([2, 4]), "Tensor(float)"),
            ],
            vec![(t(3, 3, 8), json!([2, 4]), "Tensor(float)")],
        ),
        (
            "aten::relu",
            "aten::relu(Tensor self) -> Tensor",
            vec![(t(3, 3, 8), json!([2, 4]), "Tensor(float)")],
            vec![(t(4, 4, 8), json!([2, 4]), "Tensor(float)")],
        ),
        (
            "aten::no_such_op",
            "aten::no_such_op(Tensor self) -> Tensor",
            vec![(t(4, 4, 8), json!([2, 4]), "Tensor(float)")],
            vec![(t(5, 5, 8), json!([2, 4]), "Tensor(float)")],
        ),
    ]);
    let (slots, failures, plan) = run(&tr);
    assert_eq!(failures.len(), 2, "{failures:?}");
    assert!(
        failures[0]
            .1
            .contains("mat1 and mat2 shapes cannot be multiplied"),
        "{}",
        failures[0].1
    );
    assert!(
        failures[1].1.contains("no operator aten::no_such_op"),
        "{}",
        failures[1].1
    );
    assert_eq!(
        slots[out_slot(&plan, 1, 0)].as_ref().unwrap().size(),
        vec![2, 4]
    );
    // Through the public API: strict mode stops at the first failure.
    let g = Graph::new(&tr);
    let set = g.replay_set(None);
    let opts = replay::ReplayOptions {
        strict: true,
        iters: 1,
        warmup: 0,
        ..Default::default()
    };
    assert!(matches!(
        replay::replay(&g, &set, &opts),
        Err(replay::ReplayError::Strict { .. })
    ));
    let (report, _) = replay::replay(
        &g,
        &set,
        &replay::ReplayOptions {
            iters: 2,
            warmup: 0,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(
        (report.ops_selected, report.ops_replayed, report.ops_failed),
        (3, 1, 2)
    );
    assert_eq!(report.failures.len(), 2);
    // Typed by the exception: a shape error is libtorch's refusal of an argument, a missing
    // operator its own kind.
    assert_eq!(report.failures[0].kind, replay::ErrorKind::Other);
    assert_eq!(report.failures[1].kind, replay::ErrorKind::NoOperator);
    // Failed ops are not timed as if they ran.
    assert_eq!(
        report.ops.iter().map(|o| o.op.as_str()).collect::<Vec<_>>(),
        vec!["aten::relu"]
    );
}

/// A negative shape (a damaged or hostile trace) fails that op, named, and the run goes on: no
/// C++ abort, no lost report.
#[test]
fn negative_shapes_fail_their_op_not_the_replay() {
    let tr = trace(&[
        (
            "aten::relu",
            "aten::relu(Tensor self) -> Tensor",
            vec![(t(1, 1, 8), json!([2, -4]), "Tensor(float)")],
            vec![(t(2, 2, 8), json!([2, 4]), "Tensor(float)")],
        ),
        (
            "aten::neg",
            "aten::neg(Tensor self) -> Tensor",
            vec![(t(2, 2, 8), json!([2, 4]), "Tensor(float)")],
            vec![(t(3, 3, 8), json!([2, 4]), "Tensor(float)")],
        ),
    ]);
    let (_, failures, _) = run(&tr);
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(failures[0].1.contains("negative"), "{failures:?}");
}

/// A replay that cannot fit in memory is refused before it allocates anything, unless forced.
#[test]
fn a_replay_bigger_than_memory_is_refused_before_allocating() {
    let huge = 1i64 << 42; // 16 TiB of floats
    let tr = trace(&[(
        "aten::relu",
        "aten::relu(Tensor self) -> Tensor",
        vec![(t(1, 1, huge as u64), json!([huge]), "Tensor(float)")],
        vec![(t(2, 2, huge as u64), json!([huge]), "Tensor(float)")],
    )]);
    let g = Graph::new(&tr);
    let plan = compile(&g, &g.replay_set(None));
    assert!(plan.peak_bytes_estimate(et_graph::Kind::All) >= 2 * 4 * huge as u64);
    let e = replay::replay(&g, &g.replay_set(None), &replay::ReplayOptions::default());
    match e {
        Err(replay::ReplayError::Memory { needed, available }) => {
            assert!(needed > available);
            assert!(replay::ReplayError::Memory { needed, available }
                .to_string()
                .contains("--force"));
        }
        other => panic!("{:?}", other.map(|r| r.0.ops_failed)),
    }
}

#[test]
fn unsupported_argument_types_are_reported_not_panicked() {
    let tr = trace(&[(
        "aten::record_stream",
        "aten::record_stream(Tensor(a!) self, Stream s) -> ()",
        vec![
            (t(1, 1, 2), json!([2]), "Tensor(float)"),
            (json!("<Stream>"), json!([]), "Stream"),
        ],
        vec![],
    )]);
    // On CPU it is a no-op by design; the plan says so.
    let (_, failures, plan) = run(&tr);
    assert!(failures.is_empty());
    assert!(matches!(plan.bound.steps[0].exec, Exec::PassThrough));
    assert!(plan.bound.steps[0]
        .fallback
        .as_deref()
        .unwrap()
        .contains("no-op on CPU"));
    let tr = trace(&[(
        "aten::x",
        "aten::x(Dimname d) -> Tensor",
        vec![(json!("n"), json!([]), "String")],
        vec![],
    )]);
    let (_, failures, _) = run(&tr);
    assert!(failures[0].1.contains("not supported"), "{failures:?}");
}

#[test]
fn traces_recorded_with_another_schema_are_reconciled_by_name() {
    // An older PyTorch recorded add.Tensor without alpha, and clamp with its optional bounds in
    // the other order: arguments are matched to this libtorch's schema by name.
    let tr = trace(&[
        full(1, 3.0),
        (
            "aten::add",
            "aten::add.Tensor(Tensor self, Tensor other) -> Tensor",
            vec![
                (t(1, 1, 2), json!([2]), "Tensor(float)"),
                (t(1, 1, 2), json!([2]), "Tensor(float)"),
            ],
            vec![(t(2, 2, 2), json!([2]), "Tensor(float)")],
        ),
        (
            "aten::clamp",
            "aten::clamp(Tensor self, Scalar? max=None, Scalar? min=None) -> Tensor",
            vec![
                (t(2, 2, 2), json!([2]), "Tensor(float)"),
                (json!(5.0), json!([]), "Double"),
                (json!("<None>"), json!([]), "None"),
            ],
            vec![(t(3, 3, 2), json!([2]), "Tensor(float)")],
        ),
    ]);
    let (slots, failures, plan) = run(&tr);
    assert!(failures.is_empty(), "{failures:?}");
    assert!(matches!(
        plan.args(1),
        [Arg::Tensor(_), Arg::Tensor(_), Arg::Default(2)]
    ));
    assert_eq!(
        values(slots[out_slot(&plan, 1, 0)].as_ref().unwrap()),
        vec![6.0, 6.0]
    );
    // max=5 applied, not min=5.
    assert_eq!(
        values(slots[out_slot(&plan, 2, 0)].as_ref().unwrap()),
        vec![5.0, 5.0]
    );
}

#[test]
fn ops_without_a_half_kernel_on_cpu_run_in_float32() {
    // cdist has no CPU kernel for Half in libtorch 2.11: replayed in float32, the output cast
    // back to the recorded dtype, and reported as a fallback.
    let h = |id: u64| json!([id, id, 0, 12, 2, "cpu"]);
    let tr = trace(&[(
        "aten::_cdist_forward",
        "aten::_cdist_forward(Tensor x1, Tensor x2, float p, int? compute_mode) -> Tensor",
        vec![
            (h(1), json!([4, 3]), "Tensor(c10::Half)"),
            (h(2), json!([4, 3]), "Tensor(c10::Half)"),
            (json!(2.0), json!([]), "Double"),
            (json!("<None>"), json!([]), "None"),
        ],
        vec![(
            json!([3, 3, 0, 16, 2, "cpu"]),
            json!([4, 4]),
            "Tensor(c10::Half)",
        )],
    )]);
    let (slots, failures, plan) = run(&tr);
    assert!(failures.is_empty(), "{failures:?}");
    let out = slots[out_slot(&plan, 0, 0)].as_ref().unwrap();
    assert_eq!(out.kind(), tch::Kind::Half);
    assert_eq!(out.size(), vec![4, 4]);
    let g = Graph::new(&tr);
    let (r, _) = replay::replay(
        &g,
        &g.replay_set(None),
        &replay::ReplayOptions {
            iters: 1,
            warmup: 0,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(r.ops_failed, 0);
    assert!(
        r.fallbacks
            .iter()
            .any(|f| f.op == "aten::_cdist_forward" && f.ran_as.contains("float32")),
        "{:?}",
        r.fallbacks
    );
}

/// The replay flushes denormals (synthetic values can decay into them; the original's real
/// ones did not): after `flush_denormal`, a denormal input reads as zero.
#[test]
fn denormals_flush_to_zero() {
    if !replay::flush_denormal() {
        return; // a CPU without FTZ/DAZ
    }
    let t = Tensor::from_slice(&[1e-39f32, 1.0]);
    assert_eq!(values(&t.f_mul_scalar(1.0).unwrap()), vec![0.0, 1.0]);
}

/// External inputs of every kind materialise: bool and complex ones too (bool masks are
/// neither integers nor floats; scaling them like weights must not be tried).
#[test]
fn bool_and_complex_external_inputs_materialise() {
    let tr = trace(&[
        (
            "aten::logical_not",
            "aten::logical_not(Tensor self) -> Tensor",
            vec![(json!([1, 1, 0, 4, 1, "cpu"]), json!([4]), "Tensor(bool)")],
            vec![(json!([2, 2, 0, 4, 1, "cpu"]), json!([4]), "Tensor(bool)")],
        ),
        (
            "aten::abs",
            "aten::abs(Tensor self) -> Tensor",
            vec![(
                json!([3, 3, 0, 4, 8, "cpu"]),
                json!([4]),
                "Tensor(c10::complex<float>)",
            )],
            vec![(json!([4, 4, 0, 4, 4, "cpu"]), json!([4]), "Tensor(float)")],
        ),
    ]);
    let (slots, failures, plan) = run(&tr);
    assert!(failures.is_empty(), "{failures:?}");
    assert_eq!(
        values(slots[out_slot(&plan, 0, 0)].as_ref().unwrap()),
        vec![1.0; 4]
    );
}

/// `check_values` names the first op whose output went NaN (0/0 here), for a user chasing a
/// diverging replay; without it nothing is checked.
#[test]
fn check_values_names_the_first_op_that_produced_nan() {
    let tr = trace(&[
        full(1, 0.0),
        full(2, 0.0),
        (
            "aten::div",
            "aten::div.Tensor(Tensor self, Tensor other) -> Tensor",
            vec![
                (t(1, 1, 2), json!([2]), "Tensor(float)"),
                (t(2, 2, 2), json!([2]), "Tensor(float)"),
            ],
            vec![(t(3, 3, 2), json!([2]), "Tensor(float)")],
        ),
        (
            "aten::neg",
            "aten::neg(Tensor self) -> Tensor",
            vec![(t(3, 3, 2), json!([2]), "Tensor(float)")],
            vec![(t(4, 4, 2), json!([2]), "Tensor(float)")],
        ),
    ]);
    let g = Graph::new(&tr);
    let set = g.replay_set(None);
    let run = |check_values| {
        let opts = replay::ReplayOptions {
            iters: 1,
            warmup: 0,
            check_values,
            ..Default::default()
        };
        replay::replay(&g, &set, &opts).unwrap().0
    };
    let f = run(true).first_nonfinite.expect("0/0 is NaN");
    assert_eq!((f.op.as_str(), f.id, f.iteration), ("aten::div", 4, 0));
    assert!(run(false).first_nonfinite.is_none());
}

/// External inputs recorded as expanded views (stride 0: elements share one memory location)
/// materialise: libtorch refuses in-place scaling or filling of such a view, and the refusal
/// must not become a panic (tch's Scalar-taking calls panic on errors).
#[test]
fn expanded_external_inputs_materialise() {
    let mut b = TraceBuilder::new();
    // One input scaled like a weight, one also folded non-negative (a sqrt input).
    for (id, name) in [(2u64, "aten::neg"), (3, "aten::sqrt")] {
        b.node(name)
            .id(id)
            .attr(
                "op_schema",
                "string",
                format!("{name}(Tensor self) -> Tensor"),
            )
            .input_strided(
                t(id * 10, id * 10, 1),
                json!([4]),
                json!([0]),
                "Tensor(float)",
            )
            .output(t(id * 10 + 1, id * 10 + 1, 4), json!([4]), "Tensor(float)")
            .done();
    }
    let tr = b.build();
    let (slots, failures, plan) = run(&tr);
    assert!(failures.is_empty(), "{failures:?}");
    assert!(slots[out_slot(&plan, 0, 0)].is_some());
}

/// A bf16 tensor reference (2-byte elements).
fn t16(id: u64, storage: u64, numel: u64) -> J {
    json!([id, storage, 0, numel, 2, "cpu"])
}

#[test]
fn ops_recorded_under_autocast_replay_under_autocast_with_the_recorded_dtypes() {
    // Inside torch.autocast("cpu", bfloat16): linear(x f32, w f32) -> bf16, then mm(bf16, bf16).
    // Called plainly, linear would give float32 and mm would refuse the mixed dtypes.
    const LINEAR: &str = "aten::linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor";
    const MM: &str = "aten::mm(Tensor self, Tensor mat2) -> Tensor";
    let tr = trace(&[
        (
            "aten::linear",
            LINEAR,
            vec![
                (t(1, 1, 8), json!([2, 4]), "Tensor(float)"),
                (t(2, 2, 12), json!([3, 4]), "Tensor(float)"),
                (json!("<None>"), json!([]), "None"),
            ],
            vec![(t16(3, 3, 6), json!([2, 3]), "Tensor(c10::BFloat16)")],
        ),
        (
            "aten::mm",
            MM,
            vec![
                (t16(3, 3, 6), json!([2, 3]), "Tensor(c10::BFloat16)"),
                (t16(4, 4, 6), json!([3, 2]), "Tensor(c10::BFloat16)"),
            ],
            vec![(t16(5, 5, 4), json!([2, 2]), "Tensor(c10::BFloat16)")],
        ),
        // Not autocast: same dtypes in and out.
        (
            "aten::mm",
            MM,
            vec![
                (t(1, 1, 8), json!([2, 4]), "Tensor(float)"),
                (t(6, 6, 8), json!([4, 2]), "Tensor(float)"),
            ],
            vec![(t(7, 7, 4), json!([2, 2]), "Tensor(float)")],
        ),
    ]);
    let (slots, failures, plan) = run(&tr);
    assert!(failures.is_empty(), "{failures:?}");
    assert_eq!(plan.steps[0].autocast, Some(et_schema::DType::BFloat16));
    assert_eq!(
        (plan.steps[1].autocast, plan.steps[2].autocast),
        (None, None)
    );
    let y = slots[out_slot(&plan, 0, 0)].as_ref().unwrap();
    assert_eq!(y.kind(), tch::Kind::BFloat16, "linear ran under autocast");
    assert_eq!(
        slots[out_slot(&plan, 1, 0)].as_ref().unwrap().kind(),
        tch::Kind::BFloat16
    );
    // The autocast state did not leak into later calls.
    assert_eq!(
        slots[out_slot(&plan, 2, 0)].as_ref().unwrap().kind(),
        tch::Kind::Float
    );
}

#[test]
fn half_precision_external_inputs_hold_no_exact_zeros() {
    // libtorch's bf16 normal_ returns exactly 0 for about one value in 150; an optimizer's
    // second moment of 0 then meets a non-zero first moment and the step divides by eps alone.
    const ABS: &str = "aten::abs(Tensor self) -> Tensor";
    for ty in ["Tensor(c10::BFloat16)", "Tensor(c10::Half)"] {
        let tr = trace(&[(
            "aten::abs",
            ABS,
            vec![(t16(1, 1, 65536), json!([256, 256]), ty)],
            vec![(t16(2, 2, 65536), json!([256, 256]), ty)],
        )]);
        let g = Graph::new(&tr);
        let plan = compile(&g, &g.replay_set(None));
        let bound = replay::bind(&plan, &replay::Device::Cpu);
        let ex = replay::executor::Executor::new(&plan, &bound, false).unwrap();
        let (slot, _, _) = &plan.externals[0];
        let x = ex.externals()[*slot as usize].as_ref().unwrap();
        assert_ne!(x.kind(), tch::Kind::Float, "{ty}");
        let zeros = x.eq(0.0).sum(tch::Kind::Int64).int64_value(&[]);
        assert_eq!(zeros, 0, "{ty}: {zeros} exact zeros");
    }
}

#[test]
fn small_empty_outputs_hold_ones_not_garbage() {
    // torch.tensor(1.0) records aten::empty, an untraced copy of the value, then its use: the
    // replay's empty tensor gets ones, so what reads it is finite (here 1 + 1 = 2).
    const EMPTY: &str = "aten::empty.memory_format(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor";
    let none = || (json!("<None>"), json!([]), "None");
    let tr = trace(&[
        (
            "aten::empty",
            EMPTY,
            vec![
                (json!([2]), json!([[]]), "GenericList[Int]"),
                none(),
                none(),
                none(),
                none(),
                none(),
            ],
            vec![(t(1, 1, 2), json!([2]), "Tensor(float)")],
        ),
        (
            "aten::add",
            "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
            vec![
                (t(1, 1, 2), json!([2]), "Tensor(float)"),
                (t(1, 1, 2), json!([2]), "Tensor(float)"),
            ],
            vec![(t(2, 2, 2), json!([2]), "Tensor(float)")],
        ),
    ]);
    let g = Graph::new(&tr);
    let plan = compile(&g, &g.replay_set(None));
    let bound = replay::bind(&plan, &replay::Device::Cpu);
    let mut ex = replay::executor::Executor::new(&plan, &bound, false).unwrap();
    let mut slots = ex.fresh_slots();
    for pos in 0..plan.steps.len() {
        let o = ex.step(pos, &mut slots, false);
        ex.settle(pos, &mut slots, &o);
    }
    assert_eq!(
        values(slots[out_slot(&plan, 1, 0)].as_ref().unwrap()),
        vec![2.0, 2.0]
    );
}

/// `arange(0, 6, dtype=float).view(2, 3)` as two replayed ops: tensor 2 on storage 1 holds
/// [[0, 1, 2], [3, 4, 5]] (step 1's output).
fn arange_2x3(b: &mut TraceBuilder) {
    const ARANGE: &str = "aten::arange.start(Scalar start, Scalar end, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor";
    let mut n = b
        .op("aten::arange", ARANGE)
        .input(json!(0), json!([]), "Int")
        .input(json!(6), json!([]), "Int")
        .input(json!(6), json!([]), "Int");
    for _ in 0..3 {
        n = n.input(json!("<None>"), json!([]), "None");
    }
    n.output(t(1, 1, 6), json!([6]), "Tensor(float)").done();
    b.op(
        "aten::view",
        "aten::view(Tensor(a) self, SymInt[] size) -> Tensor(a)",
    )
    .input(t(1, 1, 6), json!([6]), "Tensor(float)")
    .input(json!([2, 3]), json!([[], []]), "GenericList[Int,Int]")
    .output(t(2, 1, 6), json!([2, 3]), "Tensor(float)")
    .done();
}

/// A tensor read over the storage an op wrote, with other strides (autograd's saved `t(weight)`
/// inside `linear`, read by the backward's `mm`), is that op's output viewed so: `mm` then
/// multiplies by the transpose of the values written, not by a random matrix.
#[test]
fn a_transposed_read_of_an_output_is_a_view_of_it() {
    const MM: &str = "aten::mm(Tensor self, Tensor mat2) -> Tensor";
    let mut b = TraceBuilder::new();
    // w = arange(0, 6).view(2, 3): [[0, 1, 2], [3, 4, 5]]
    arange_2x3(&mut b);
    // ones(2, 2) @ w^T, w^T read as a new tensor id over w's storage with strides [1, 3].
    b.op("aten::mm", MM)
        .input(t(3, 3, 4), json!([2, 2]), "Tensor(float)")
        .input(t(2, 1, 6), json!([2, 3]), "Tensor(float)")
        .output(t(4, 4, 6), json!([2, 3]), "Tensor(float)")
        .done();
    b.op("aten::mm", MM)
        .input(t(4, 4, 6), json!([2, 3]), "Tensor(float)")
        .input_strided(t(5, 1, 6), json!([3, 2]), json!([1, 3]), "Tensor(float)")
        .output(t(6, 6, 4), json!([2, 2]), "Tensor(float)")
        .done();
    let tr = b.build();
    let (slots, failures, plan) = run(&tr);
    assert!(failures.is_empty(), "{failures:?}");
    assert_eq!(plan.steps[3].views.len(), 1, "{:?}", plan.steps[3]);
    let w = slots[out_slot(&plan, 1, 0)].as_ref().unwrap();
    let x = slots[out_slot(&plan, 2, 0)].as_ref().unwrap();
    let y = slots[out_slot(&plan, 3, 0)].as_ref().unwrap();
    // Whatever the first mm's left operand held, the second multiplies by w^T exactly.
    let want = x.mm(&w.tr());
    assert_eq!(values(y), values(&want));
    assert_eq!(values(w), vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
}

/// Values an op inside a composite made and a later op reads (saved for a backward) are
/// copies of their external inputs, each a tensor of its own holding the external's values:
/// with the recorded strides where they are dense, dense where the value is a chunk of a
/// wider storage (a gate of three over its row).
#[test]
fn a_value_made_inside_a_composite_is_read_from_a_copy_of_its_external() {
    const RELU: &str = "aten::relu(Tensor self) -> Tensor";
    const ADDMM: &str = "aten::addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1) -> Tensor";
    const NEG: &str = "aten::neg(Tensor self) -> Tensor";
    let mut b = TraceBuilder::new();
    let composite = b
        .op("aten::relu", RELU)
        .input(t(1, 1, 6), json!([2, 3]), "Tensor(float)")
        .output(t(2, 2, 6), json!([2, 3]), "Tensor(float)")
        .done();
    // Inside it, [2, 3] gates on storage 50, made by an op the replay does not run.
    b.op("aten::addmm", ADDMM)
        .parent(composite)
        .input(t(3, 3, 3), json!([3]), "Tensor(float)")
        .input(t(1, 1, 6), json!([2, 3]), "Tensor(float)")
        .input(t(4, 4, 9), json!([3, 3]), "Tensor(float)")
        .input(json!(1), json!([]), "Int")
        .input(json!(1), json!([]), "Int")
        .output(t(40, 50, 6), json!([2, 3]), "Tensor(float)")
        .done();
    // Read whole, then its middle column alone (offset 1, stride 3: not dense).
    b.op("aten::neg", NEG)
        .input(t(41, 50, 6), json!([2, 3]), "Tensor(float)")
        .output(t(5, 5, 6), json!([2, 3]), "Tensor(float)")
        .done();
    b.op("aten::neg", NEG)
        .input_strided(
            json!([42, 50, 1, 2, 4, "cpu"]),
            json!([2, 1]),
            json!([3, 1]),
            "Tensor(float)",
        )
        .output(t(6, 6, 2), json!([2, 1]), "Tensor(float)")
        .done();
    let tr = b.build();
    let (slots, failures, plan) = run(&tr);
    assert!(failures.is_empty(), "{failures:?}");
    let copies: Vec<&replay::plan::View> = plan
        .steps
        .iter()
        .flat_map(|s| &s.views)
        .filter(|v| v.kind == replay::plan::ViewKind::Copy)
        .collect();
    assert_eq!(copies.len(), 2, "{:?}", plan.steps);
    for (k, copy) in copies.iter().enumerate() {
        let step = 1 + k;
        assert_eq!(arg_slot(&plan, step, 0), copy.slot as usize);
        let made = slots[copy.slot as usize].as_ref().unwrap();
        let external = slots[copy.base as usize].as_ref().unwrap();
        assert_ne!(made.data_ptr(), external.data_ptr());
        assert_eq!(values(made), values(external));
        assert!(made.is_contiguous(), "{:?}", made.stride());
        let out = slots[out_slot(&plan, step, 0)].as_ref().unwrap();
        assert_eq!(values(out), values(&-external));
    }
}

/// Cross-entropy's log-probabilities, made by a `_log_softmax` inside the composite the replay
/// runs whole and read by the backward under a new tensor id, are made again of the logits:
/// the backward's gradient is softmax less the target's one-hot, as in the original, not the
/// same whatever the logits (a uniform fill, which left training to drift to Inf).
#[test]
fn a_log_softmax_saved_inside_a_composite_is_made_again_of_its_input() {
    const CE: &str = "aten::cross_entropy_loss(Tensor self, Tensor target, Tensor? weight=None, int reduction=1, SymInt ignore_index=-100, float label_smoothing=0.0) -> Tensor";
    const LSM: &str = "aten::_log_softmax(Tensor self, int dim, bool half_to_float) -> Tensor";
    const BWD: &str = "aten::_log_softmax_backward_data(Tensor grad_output, Tensor output, int dim, ScalarType input_dtype) -> Tensor";
    let mut b = TraceBuilder::new();
    // Logits [2, 3] from a replayed op: arange(0, 6).view(2, 3) in float.
    arange_2x3(&mut b);
    let ce = b
        .op("aten::cross_entropy_loss", CE)
        .input(t(2, 1, 6), json!([2, 3]), "Tensor(float)")
        .input(json!([3, 3, 0, 2, 8, "cpu"]), json!([2]), "Tensor(long)")
        .input(json!("<None>"), json!([]), "None")
        .input(json!(1), json!([]), "Int")
        .input(json!(-100), json!([]), "Int")
        .input(json!(0.0), json!([]), "Double")
        .output(t(4, 4, 1), json!([]), "Tensor(float)")
        .done();
    // Inside it: the log-probabilities on storage 5.
    b.op("aten::_log_softmax", LSM)
        .parent(ce)
        .input(t(2, 1, 6), json!([2, 3]), "Tensor(float)")
        .input(json!(1), json!([]), "Int")
        .input(json!(false), json!([]), "Bool")
        .output(t(5, 5, 6), json!([2, 3]), "Tensor(float)")
        .done();
    // The backward reads them as tensor 9 on storage 5.
    b.op("aten::_log_softmax_backward_data", BWD)
        .input(t(8, 8, 6), json!([2, 3]), "Tensor(float)")
        .input(t(9, 5, 6), json!([2, 3]), "Tensor(float)")
        .input(json!(1), json!([]), "Int")
        .input(json!(6), json!([]), "Int")
        .output(t(10, 10, 6), json!([2, 3]), "Tensor(float)")
        .done();
    let tr = b.build();
    let (slots, failures, plan) = run(&tr);
    assert!(failures.is_empty(), "{failures:?}");
    let bwd = plan.steps.len() - 1;
    assert_eq!(plan.steps[bwd].name, "aten::_log_softmax_backward_data");
    assert_eq!(plan.steps[bwd].views.len(), 1, "{:?}", plan.steps[bwd]);
    assert_eq!(
        plan.steps[bwd].views[0].kind,
        replay::plan::ViewKind::LogSoftmax { dim: 1 }
    );
    // The gradient the step made is grad - softmax(logits) * sum(grad) over dim 1, whatever
    // the incoming gradient held.
    let logits = slots[out_slot(&plan, 1, 0)].as_ref().unwrap();
    let Arg::Tensor(g) = plan.steps[bwd].args[0] else {
        panic!("{:?}", plan.steps[bwd].args)
    };
    let grad = slots[g as usize].as_ref().unwrap();
    let want = grad
        - logits.softmax(1, tch::Kind::Float) * grad.sum_dim_intlist(1, true, tch::Kind::Float);
    let got = slots[out_slot(&plan, bwd, 0)].as_ref().unwrap();
    let (got, want) = (values(got), values(&want));
    assert!(
        got.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-5),
        "{got:?} {want:?}"
    );
}

/// An inference trace (no op recorded a graph node) ran on a model whose parameters require
/// grad, under no-grad mode: the weights and biases its ops read, directly or through views
/// (`in_proj_weight.split(...)`), require grad in the replay and so do the views ops take of
/// them, as a parameter's do under `torch.no_grad()`; the batch does not, and nothing records
/// a graph. Kernels read the flag: `matmul` folds a batched input into one `mm` when an operand
/// requires grad, and runs a `bmm` otherwise.
#[test]
fn an_inference_traces_parameters_and_their_views_require_grad() {
    const SPLIT: &str = "aten::split_with_sizes(Tensor(a -> *) self, SymInt[] split_sizes, int dim=0) -> Tensor(a)[]";
    const LINEAR: &str = "aten::linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor";
    let part = |id: u64, offset: u64, numel: u64| json!([id, 1, offset, numel, 4, "cpu"]);
    let tr = trace(&[
        (
            "aten::split_with_sizes",
            SPLIT,
            vec![
                (t(1, 1, 24), json!([6, 4]), "Tensor(float)"),
                (json!([2, 4]), json!([[], []]), "GenericList[Int,Int]"),
                (json!(0), json!([]), "Int"),
            ],
            vec![(
                json!([part(2, 0, 8), part(3, 8, 16)]),
                json!([[2, 4], [4, 4]]),
                "GenericList[Tensor(float),Tensor(float)]",
            )],
        ),
        (
            "aten::linear",
            LINEAR,
            vec![
                (t(4, 4, 12), json!([3, 4]), "Tensor(float)"),
                (part(3, 8, 16), json!([4, 4]), "Tensor(float)"),
                (t(5, 5, 4), json!([4]), "Tensor(float)"),
            ],
            vec![(t(6, 6, 12), json!([3, 4]), "Tensor(float)")],
        ),
    ]);
    let (slots, failures, plan) = run(&tr);
    assert!(failures.is_empty(), "{failures:?}");
    assert!(plan.steps.iter().all(|s| !s.autograd), "an inference trace");
    let arg = |step: usize, k: usize| plan.steps[step].args[k].slots()[0];
    let (w, x, bias) = (arg(0, 0), arg(1, 0), arg(1, 2));
    assert!(plan.grad_inputs.contains(&w), "W, read through its split");
    assert!(plan.grad_inputs.contains(&bias));
    assert!(!plan.grad_inputs.contains(&x), "the batch");
    let slot = |s: u32| slots[s as usize].as_ref().unwrap();
    assert!(slot(w).requires_grad() && slot(bias).requires_grad());
    assert!(!slot(x).requires_grad());
    // The split's views of W require grad, as a parameter's views under no-grad mode do (a view
    // of the storage's arena tensor would not).
    let Out::List(parts) = &plan.steps[0].outs[0] else {
        panic!("{:?}", plan.steps[0].outs[0])
    };
    for p in parts.iter().flatten() {
        assert!(slot(*p).requires_grad(), "split part {p}");
    }
    // No graph: linear ran under no-grad mode.
    let y = slot(out_slot(&plan, 1, 0) as u32);
    assert!(!y.requires_grad());
}

#[test]
fn python_numbers_passed_as_tensors_do_not_promote_the_result() {
    // `-0.5 * kl` with a 0-dim float `kl` calls `mul.Tensor(kl, <0-dim double>)`: PyTorch wraps
    // the Python number, so the product stays float. The trace records the number as a plain
    // 0-dim double no op wrote; replayed as one, the product came out double and every op after
    // it failed on the mixed dtypes (a VAE's backward `mm`, Adam's `lerp_`).
    let scalar = |id: u64| json!([id, id, 0, 1, 4, "cpu"]);
    let tr = trace(&[
        (
            "aten::full",
            FULL,
            vec![
                (json!([]), json!([]), "GenericList[]"),
                (json!(2.0), json!([]), "Double"),
                (json!("<None>"), json!([]), "None"),
                (json!("<None>"), json!([]), "None"),
                (json!("<None>"), json!([]), "None"),
                (json!("<None>"), json!([]), "None"),
            ],
            vec![(scalar(1), json!([]), "Tensor(float)")],
        ),
        (
            "aten::mul",
            "aten::mul.Tensor(Tensor self, Tensor other) -> Tensor",
            vec![
                (scalar(1), json!([]), "Tensor(float)"),
                (json!([2, 2, 0, 1, 8, "cpu"]), json!([]), "Tensor(double)"),
            ],
            vec![(scalar(3), json!([]), "Tensor(float)")],
        ),
        // A float op on the product, as the KL term's sum with the reconstruction loss.
        full(4, 1.0),
        (
            "aten::add",
            "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
            vec![
                (t(4, 4, 2), json!([2]), "Tensor(float)"),
                (scalar(3), json!([]), "Tensor(float)"),
            ],
            vec![(t(5, 5, 2), json!([2]), "Tensor(float)")],
        ),
    ]);
    let (slots, failures, plan) = run(&tr);
    assert!(failures.is_empty(), "{failures:?}");
    let product = slots[out_slot(&plan, 1, 0)].as_ref().unwrap();
    assert_eq!(product.kind(), tch::Kind::Float, "the recorded dtype");
    assert_eq!(
        slots[out_slot(&plan, 3, 0)].as_ref().unwrap().kind(),
        tch::Kind::Float
    );
}

/// `check_values` does not report infinities the trace asked for (a causal mask filled with
/// `-inf`, and what is made of it while it still holds them), and still reports a NaN made
/// from them (`-inf + inf`): an overflow that meets a mask is a divergence. A transformer
/// decoder's mask made every replay of it report NaN/Inf at its first op.
#[test]
fn check_values_leaves_the_infinities_the_trace_asked_for() {
    // full([2], -inf) as the observer records it: the number as a string.
    let mut mask = full(1, 0.0);
    mask.2[1] = (json!("-inf"), json!([]), "Double");
    let neg: OpRec = (
        "aten::neg",
        "aten::neg(Tensor self) -> Tensor",
        vec![(t(1, 1, 2), json!([2]), "Tensor(float)")],
        vec![(t(2, 2, 2), json!([2]), "Tensor(float)")],
    );
    let add: OpRec = (
        "aten::add",
        "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
        vec![
            (t(1, 1, 2), json!([2]), "Tensor(float)"),
            (t(2, 2, 2), json!([2]), "Tensor(float)"),
            (json!(1), json!([]), "Int"),
        ],
        vec![(t(3, 3, 2), json!([2]), "Tensor(float)")],
    );
    let first_nonfinite = |tr: &et_schema::Trace| {
        let g = Graph::new(tr);
        let set = g.replay_set(None);
        let opts = replay::ReplayOptions {
            iters: 2,
            warmup: 0,
            check_values: true,
            ..Default::default()
        };
        let (r, _) = replay::replay(&g, &set, &opts).unwrap();
        assert_eq!(r.ops_failed, 0);
        r.first_nonfinite
    };
    // -inf, then +inf made of it: as asked.
    let asked = first_nonfinite(&trace(&[mask.clone(), neg.clone()]));
    assert!(asked.is_none(), "{asked:?}");
    // Then -inf + inf: NaN, reported at the add.
    let f = first_nonfinite(&trace(&[mask, neg, add])).expect("-inf + inf is NaN");
    assert_eq!(f.op, "aten::add", "{f:?}");
}

const SDPA: &str = "aten::scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, float dropout_p=0.0, bool is_causal=False, *, float? scale=None, bool enable_gqa=False) -> Tensor";
const FLASH: &str = "aten::_scaled_dot_product_flash_attention_for_cpu(Tensor query, Tensor key, Tensor value, float dropout_p=0.0, bool is_causal=False, *, Tensor? attn_mask=None, float? scale=None) -> (Tensor output, Tensor logsumexp)";
const FLASH_BACKWARD: &str = "aten::_scaled_dot_product_flash_attention_for_cpu_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, Tensor out, Tensor logsumexp, float dropout_p, bool is_causal, *, Tensor? attn_mask=None, float? scale=None) -> (Tensor grad_query, Tensor grad_key, Tensor grad_value)";

/// The log-sum-exp a fused attention returns inside `scaled_dot_product_attention` (which the
/// replay runs whole) is made again from its query and key for the attention's backward, not
/// filled random: the backward's gradients are the kernel's own. Random, a Perceiver-style
/// model's gradients went NaN after 28 iterations.
#[test]
fn a_fused_attentions_log_sum_exp_is_made_again_for_its_backward() {
    // [B, H, L, E] = [1, 2, 4, 8], causal.
    let q4 = |id: u64| (t(id, id, 64), json!([1, 2, 4, 8]), "Tensor(float)");
    let lse = (t(5, 5, 8), json!([1, 2, 4]), "Tensor(float)");
    let mut b = TraceBuilder::new();
    let sdpa = b
        .op("aten::scaled_dot_product_attention", SDPA)
        .input(q4(1).0, q4(1).1, q4(1).2)
        .input(q4(2).0, q4(2).1, q4(2).2)
        .input(q4(3).0, q4(3).1, q4(3).2)
        .input(json!("<None>"), json!([]), "None")
        .input(json!(0.0), json!([]), "Double")
        .input(json!(true), json!([]), "Bool")
        .input(json!("<None>"), json!([]), "None")
        .input(json!(false), json!([]), "Bool")
        .output(q4(4).0, q4(4).1, q4(4).2)
        .done();
    b.op("aten::_scaled_dot_product_flash_attention_for_cpu", FLASH)
        .parent(sdpa)
        .input(q4(1).0, q4(1).1, q4(1).2)
        .input(q4(2).0, q4(2).1, q4(2).2)
        .input(q4(3).0, q4(3).1, q4(3).2)
        .input(json!(0.0), json!([]), "Double")
        .input(json!(true), json!([]), "Bool")
        .input(json!("<None>"), json!([]), "None")
        .input(json!("<None>"), json!([]), "None")
        .output(q4(4).0, q4(4).1, q4(4).2)
        .output(lse.0.clone(), lse.1.clone(), lse.2)
        .done();
    b.op(
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
        FLASH_BACKWARD,
    )
    .input(q4(6).0, q4(6).1, q4(6).2)
    .input(q4(1).0, q4(1).1, q4(1).2)
    .input(q4(2).0, q4(2).1, q4(2).2)
    .input(q4(3).0, q4(3).1, q4(3).2)
    .input(q4(4).0, q4(4).1, q4(4).2)
    .input(lse.0, lse.1, lse.2)
    .input(json!(0.0), json!([]), "Double")
    .input(json!(true), json!([]), "Bool")
    .input(json!("<None>"), json!([]), "None")
    .input(json!("<None>"), json!([]), "None")
    .output(q4(7).0, q4(7).1, q4(7).2)
    .output(q4(8).0, q4(8).1, q4(8).2)
    .output(q4(9).0, q4(9).1, q4(9).2)
    .done();
    let tr = b.build();
    let (slots, failures, plan) = run(&tr);
    assert!(failures.is_empty(), "{failures:?}");
    assert_eq!(
        plan.steps.len(),
        2,
        "the attention whole, then its backward"
    );
    let arg = |k: usize| arg_slot(&plan, 1, k);
    let (grad_out, q, k, v, out, lse) = (arg(0), arg(1), arg(2), arg(3), arg(4), arg(5));
    assert!(
        plan.externals.iter().all(|e| e.0 as usize != lse),
        "the log-sum-exp is not an external input"
    );
    let s = |i: usize| slots[i].as_ref().unwrap();
    let (_, want) = Tensor::internal_scaled_dot_product_flash_attention_for_cpu(
        s(q),
        s(k),
        s(v),
        0.0,
        true,
        None::<Tensor>,
        None,
    );
    let got = s(lse);
    assert!(
        got.allclose(&want, 1e-4, 1e-5, false),
        "{got:?} vs the kernel's {want:?}"
    );
    let (gq, _, _) = Tensor::internal_scaled_dot_product_flash_attention_for_cpu_backward(
        s(grad_out),
        s(q),
        s(k),
        s(v),
        s(out),
        &want,
        0.0,
        true,
        None::<Tensor>,
        None,
    );
    let replayed = s(out_slot(&plan, 1, 0));
    assert!(replayed.allclose(&gq, 1e-4, 1e-5, false));
}

const WEIGHT_NORM: &str = "aten::_weight_norm(Tensor v, Tensor g, int dim=0) -> Tensor";
const WEIGHT_NORM_INTERFACE: &str =
    "aten::_weight_norm_interface(Tensor v, Tensor g, int dim=0) -> (Tensor, Tensor)";
const WEIGHT_NORM_BACKWARD: &str = "aten::_weight_norm_interface_backward(Tensor grad_w, Tensor saved_v, Tensor saved_g, Tensor saved_norms, int dim) -> (Tensor, Tensor)";

/// The norms `_weight_norm_interface` returns inside `_weight_norm` (which the replay runs
/// whole) are made again from its `v` and `g` for the backward, not filled random: the
/// backward's gradients are the kernel's own. Random, a weight-norm MLP's gradients reached
/// Inf (fresh8's weightnorm_mlp_sgd).
#[test]
fn weight_norms_norms_are_made_again_for_its_backward() {
    let v = (t(1, 1, 24), json!([4, 6]), "Tensor(float)");
    let g = (t(2, 2, 4), json!([4, 1]), "Tensor(float)");
    let w = (t(3, 3, 24), json!([4, 6]), "Tensor(float)");
    let norms = (t(4, 4, 4), json!([4, 1]), "Tensor(float)");
    let grad_w = (t(5, 5, 24), json!([4, 6]), "Tensor(float)");
    let dim = || (json!(0), json!([]), "Int");
    let mut b = TraceBuilder::new();
    let outer = b
        .op("aten::_weight_norm", WEIGHT_NORM)
        .input(v.0.clone(), v.1.clone(), v.2)
        .input(g.0.clone(), g.1.clone(), g.2)
        .input(dim().0, dim().1, dim().2)
        .output(w.0.clone(), w.1.clone(), w.2)
        .done();
    b.op("aten::_weight_norm_interface", WEIGHT_NORM_INTERFACE)
        .parent(outer)
        .input(v.0.clone(), v.1.clone(), v.2)
        .input(g.0.clone(), g.1.clone(), g.2)
        .input(dim().0, dim().1, dim().2)
        .output(w.0.clone(), w.1.clone(), w.2)
        .output(norms.0.clone(), norms.1.clone(), norms.2)
        .done();
    b.op(
        "aten::_weight_norm_interface_backward",
        WEIGHT_NORM_BACKWARD,
    )
    .input(grad_w.0, grad_w.1, grad_w.2)
    .input(v.0, v.1, v.2)
    .input(g.0, g.1, g.2)
    .input(norms.0, norms.1, norms.2)
    .input(dim().0, dim().1, dim().2)
    .output(t(6, 6, 24), json!([4, 6]), "Tensor(float)")
    .output(t(7, 7, 4), json!([4, 1]), "Tensor(float)")
    .done();
    let tr = b.build();
    let (slots, failures, plan) = run(&tr);
    assert!(failures.is_empty(), "{failures:?}");
    assert_eq!(
        plan.steps.len(),
        2,
        "the weight norm whole, then its backward"
    );
    let arg = |k: usize| arg_slot(&plan, 1, k);
    let (grad_w, v, g, norms) = (arg(0), arg(1), arg(2), arg(3));
    assert!(
        plan.externals.iter().all(|e| e.0 as usize != norms),
        "the norms are not an external input"
    );
    let s = |i: usize| slots[i].as_ref().unwrap();
    let (_, want) = Tensor::internal_weight_norm_interface(s(v), s(g), 0);
    let got = s(norms);
    assert!(
        got.allclose(&want, 1e-5, 1e-6, false),
        "{got:?} vs the kernel's {want:?}"
    );
    let (gv, gg) = Tensor::internal_weight_norm_interface_backward(s(grad_w), s(v), s(g), &want, 0);
    assert!(s(out_slot(&plan, 1, 0)).allclose(&gv, 1e-5, 1e-6, false));
    assert!(s(out_slot(&plan, 1, 1)).allclose(&gg, 1e-5, 1e-6, false));
}

/// A `view` whose input is laid out so that no view has the recorded sizes (another device's
/// kernels made it: a CPU trace's attention output on CUDA) runs as `reshape`, reported as a
/// fallback, instead of failing: the original's `.contiguous()` before it was a no-op on the
/// capture's device and is not in the trace.
#[test]
fn a_view_the_layout_cannot_make_runs_as_reshape() {
    let mut b = TraceBuilder::new();
    b.node("aten::view")
        .id(2)
        .attr(
            "op_schema",
            "string",
            "aten::view(Tensor(a) self, SymInt[] size) -> Tensor(a)".to_string(),
        )
        // A transposed [2, 3]: strides (1, 2).
        .input_strided(t(10, 10, 6), json!([2, 3]), json!([1, 2]), "Tensor(float)")
        .input(json!([6]), json!([[]]), "GenericList[Int]")
        .output(t(11, 10, 6), json!([6]), "Tensor(float)")
        .done();
    let tr = b.build();
    let g = Graph::new(&tr);
    let set = g.replay_set(None);
    let opts = replay::ReplayOptions {
        iters: 2,
        warmup: 1,
        ..Default::default()
    };
    let report = replay::replay(&g, &set, &opts).unwrap().0;
    assert_eq!(report.ops_failed, 0, "{:?}", report.failures);
    let f = report
        .fallbacks
        .iter()
        .find(|f| f.op == "aten::view")
        .expect("the view is reported as a fallback");
    assert!(f.ran_as.contains("reshape"), "{}", f.ran_as);
    // Without the detour the same call fails: the test would catch its loss.
    let x = Tensor::from_slice(&[0f32, 1., 2., 3., 4., 5.])
        .reshape([3, 2])
        .transpose(0, 1);
    assert!(x.f_view([6]).is_err());
    // The output holds the input's elements in its logical order.
    let (slots, failures, plan) = run(&tr);
    assert!(failures.is_empty(), "{failures:?}");
    let input = slots[arg_slot(&plan, 0, 0)].as_ref().unwrap();
    assert_eq!(input.stride(), vec![1, 2], "the recorded layout");
    assert_eq!(
        values(slots[out_slot(&plan, 0, 0)].as_ref().unwrap()),
        values(&input.reshape([6]))
    );
}

/// A DataLoader batch of floats, [2, 3], unpickled from a worker's shared memory: `set_` of an
/// empty tensor to a `Storage` the ET records as "<Storage>", making tensor 6 over storage 9.
fn batch_from_a_worker() -> OpRec<'static> {
    (
        "aten::set_",
        "aten::set_.source_Storage_storage_offset(Tensor(a!) self, Storage source, SymInt \
         storage_offset, SymInt[] size, SymInt[] stride=[]) -> Tensor(a!)",
        vec![
            (json!([6, 7, 0, 0, 4, "cpu"]), json!([0]), "Tensor(float)"),
            (json!("<Storage>"), json!([]), "Storage"),
            (json!(0), json!([]), "Int"),
            (json!([2, 3]), json!([[], []]), "GenericList[Int,Int]"),
            (json!([3, 1]), json!([[], []]), "GenericList[Int,Int]"),
        ],
        vec![(
            json!([6, 9, 0, 6, 4, "cpu"]),
            json!([2, 3]),
            "Tensor(float)",
        )],
    )
}

/// A DataLoader batch unpickled from a worker's shared memory (`set_` to a `Storage` the ET
/// records as "<Storage>"): not run, its output made at its recorded size and kept across
/// iterations, so that the op reading the batch runs; reported as a fallback, not a failure.
#[test]
fn a_batch_set_to_a_workers_storage_is_made_at_its_recorded_size() {
    let tr = trace(&[
        batch_from_a_worker(),
        (
            "aten::relu",
            "aten::relu(Tensor self) -> Tensor",
            vec![(
                json!([6, 9, 0, 6, 4, "cpu"]),
                json!([2, 3]),
                "Tensor(float)",
            )],
            vec![(t(10, 10, 6), json!([2, 3]), "Tensor(float)")],
        ),
    ]);
    let (slots, failures, plan) = run(&tr);
    assert!(failures.is_empty(), "{failures:?}");
    assert!(matches!(plan.bound.steps[0].exec, Exec::PassThrough));
    assert!(plan.bound.steps[0]
        .fallback
        .as_deref()
        .unwrap()
        .contains("DataLoader worker's shared memory"));
    let batch = slots[arg_slot(&plan, 1, 0)]
        .as_ref()
        .expect("the batch was made");
    assert_eq!(batch.size(), [2, 3]);
    let relu = slots[out_slot(&plan, 1, 0)].as_ref().expect("relu ran");
    assert_eq!(relu.size(), [2, 3]);
}

/// A made batch that a later step writes in place is made anew each iteration: kept, the
/// writes would build up (here x = (x + 1) * 10 each iteration, past float32's range within 40
/// iterations), where the original's batch was new each iteration.
#[test]
fn a_made_batch_written_in_place_does_not_build_up_over_iterations() {
    const ADD: &str =
        "aten::add_.Scalar(Tensor(a!) self, Scalar other, Scalar alpha=1) -> Tensor(a!)";
    const MUL: &str = "aten::mul_.Scalar(Tensor(a!) self, Scalar other) -> Tensor(a!)";
    let batch = || json!([6, 9, 0, 6, 4, "cpu"]);
    let tr = trace(&[
        batch_from_a_worker(),
        (
            "aten::add_",
            ADD,
            vec![
                (batch(), json!([2, 3]), "Tensor(float)"),
                (json!(1.0), json!([]), "Double"),
                (json!(1), json!([]), "Int"),
            ],
            vec![(batch(), json!([2, 3]), "Tensor(float)")],
        ),
        (
            "aten::mul_",
            MUL,
            vec![
                (batch(), json!([2, 3]), "Tensor(float)"),
                (json!(10.0), json!([]), "Double"),
            ],
            vec![(batch(), json!([2, 3]), "Tensor(float)")],
        ),
    ]);
    let g = Graph::new(&tr);
    let set = g.replay_set(None);
    let plan = compile(&g, &set);
    let bound = replay::bind(&plan, &replay::Device::Cpu);
    let opts = replay::ReplayOptions {
        iters: 60,
        warmup: 0,
        check_values: true,
        ..Default::default()
    };
    let (report, _) = replay::executor::run(&plan, &bound, &opts).unwrap();
    assert_eq!(report.ops_failed, 0, "{:?}", report.failures);
    assert!(
        report.first_nonfinite.is_none(),
        "{:?}",
        report.first_nonfinite
    );
}
