use super::fill::sequence_lengths;
use super::*;
use et_schema::testkit::{tensor, TraceBuilder};
use serde_json::json;

#[test]
fn scalars_the_trace_rounded_to_zero_are_restored_only_where_zero_cannot_be_meant() {
    let arg = |schema: &str, k: usize| et_schema::OpSchema::parse(schema).unwrap().args[k].clone();
    let ln = "aten::layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, Tensor? bias=None, float eps=1e-05, bool cudnn_enable=True) -> Tensor";
    let fused = "aten::_fused_adamw_(Tensor(a!)[] self, Tensor(b!)[] grads, Tensor(c!)[] exp_avgs, Tensor(d!)[] exp_avg_sqs, Tensor(e!)[] max_exp_avg_sqs, Tensor[] state_steps, *, float lr, float beta1, float beta2, float weight_decay, float eps, bool amsgrad, bool maximize, Tensor? grad_scale=None, Tensor? found_inf=None) -> ()";
    let fadd = "aten::_foreach_add_.Scalar(Tensor(a!)[] self, Scalar scalar) -> ()";
    let dropout = "aten::dropout(Tensor input, float p, bool train) -> Tensor";
    let yes = || true;
    let no = || false;
    // eps recorded 0 was below 5e-7: not the default 1e-5, the optimizers' 1e-8.
    let (a, r) = restore_rounded("aten::layer_norm", &arg(ln, 4), Arg::Double(0.0), no);
    assert_eq!((a, r.map(|r| r.0)), (Arg::Double(1e-8), Some(1e-8)));
    let (a, r) = restore_rounded("aten::_fused_adamw_", &arg(fused, 10), Arg::Double(0.0), no);
    assert_eq!((a, r.is_some()), (Arg::Double(1e-8), true));
    // The optimizer's eps added to a denominator, inside Optimizer.step only.
    let (a, r) = restore_rounded(
        "aten::_foreach_add_",
        &arg(fadd, 1),
        Arg::ScalarDouble(0.0),
        yes,
    );
    assert_eq!((a, r.is_some()), (Arg::ScalarDouble(1e-8), true));
    let (a, r) = restore_rounded(
        "aten::_foreach_add_",
        &arg(fadd, 1),
        Arg::ScalarDouble(0.0),
        no,
    );
    assert_eq!((a, r), (Arg::ScalarDouble(0.0), None));
    // A 0 that means 0 stays (dropout p=0), and so does any non-zero value.
    let (a, r) = restore_rounded("aten::dropout", &arg(dropout, 1), Arg::Double(0.0), yes);
    assert_eq!((a, r), (Arg::Double(0.0), None));
    let (a, r) = restore_rounded("aten::layer_norm", &arg(ln, 4), Arg::Double(1e-3), no);
    assert_eq!((a, r), (Arg::Double(1e-3), None));
}

const ADD: &str = "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor";
const ADD_: &str =
    "aten::add_.Tensor(Tensor(a!) self, Tensor other, *, Scalar alpha=1) -> Tensor(a!)";

fn f32(id: u64, storage: u64, numel: u64) -> serde_json::Value {
    tensor(id, storage, 0, numel, 4, "cpu")
}

/// Appends `x + y -> out` on float32 vectors of `n` (each tensor on its own storage, of
/// the same id).
fn add_1d(b: &mut TraceBuilder, x: u64, y: u64, out: u64, n: u64) {
    b.op("aten::add", ADD)
        .input(f32(x, x, n), json!([n]), "Tensor(float)")
        .input(f32(y, y, n), json!([n]), "Tensor(float)")
        .input(json!(1), json!([]), "Int")
        .output(f32(out, out, n), json!([n]), "Tensor(float)")
        .done();
}

/// The fill of the external that argument `arg` of step `step` reads (it must read one).
fn fill_of(p: &Plan, step: usize, arg: usize) -> Fill {
    let Arg::Tensor(s) = p.steps[step].args[arg] else {
        panic!(
            "argument {arg} of step {step} is not a tensor: {:?}",
            p.steps[step].args
        )
    };
    p.externals
        .iter()
        .find(|e| e.0 == s)
        .unwrap_or_else(|| panic!("argument {arg} of step {step} is not an external"))
        .2
        .clone()
}

fn plan_of(b: &TraceBuilder) -> Plan {
    let t = b.build();
    let g = Graph::new(&t);
    compile(&g, &g.replay_set(None))
}

/// x (external) + y (external) -> z; z + y -> w: two externals, z freed after its last use,
/// w after the step that makes it (nothing reads it).
#[test]
fn slots_externals_and_frees_follow_the_data() {
    let mut b = TraceBuilder::new();
    add_1d(&mut b, 1, 2, 3, 4);
    add_1d(&mut b, 3, 2, 4, 4);
    let p = plan_of(&b);
    assert_eq!(p.steps.len(), 2);
    assert_eq!(p.externals.len(), 2, "{:?}", p.externals);
    let ext: Vec<Slot> = p.externals.iter().map(|e| e.0).collect();
    let (x, y) = (ext[0], ext[1]);
    let Out::Tensor(z) = p.steps[0].outs[0] else {
        panic!("{:?}", p.steps[0].outs)
    };
    assert_eq!(
        p.steps[0].args,
        vec![Arg::Tensor(x), Arg::Tensor(y), Arg::ScalarInt(1)]
    );
    assert_eq!(p.steps[1].args[0], Arg::Tensor(z));
    assert_eq!(
        p.steps[1].args[1],
        Arg::Tensor(y),
        "y is read again, same slot"
    );
    // Intermediates are freed at their last use; externals never are.
    assert!(p.steps[1].frees.contains(&z));
    assert!(p
        .steps
        .iter()
        .all(|s| !s.frees.contains(&x) && !s.frees.contains(&y)));
    assert_eq!(p.n_slots, 4);
    assert_eq!(p.ops.len(), 1, "one distinct operator");
    assert_eq!(p.steps[0].op, Some(0));
    assert_eq!(p.ops[0].overload, "Tensor");
    assert!(p.steps.iter().all(|s| s.problem.is_none()));
}

/// An in-place op's output is a new version of its input (passed through when the step is
/// skipped), and `sqrt` reading it makes the external it started from non-negative.
#[test]
fn in_place_chains_pass_through_and_mark_non_negative_inputs() {
    let mut b = TraceBuilder::new();
    b.op("aten::add_", ADD_)
        .input(f32(1, 1, 8), json!([8]), "Tensor(float)")
        .input(f32(2, 2, 8), json!([8]), "Tensor(float)")
        .input(json!(1), json!([]), "Int")
        .output(f32(1, 1, 8), json!([8]), "Tensor(float)")
        .done();
    b.op("aten::sqrt", "aten::sqrt(Tensor self) -> Tensor")
        .input(f32(1, 1, 8), json!([8]), "Tensor(float)")
        .output(f32(3, 3, 8), json!([8]), "Tensor(float)")
        .done();
    let p = plan_of(&b);
    let Arg::Tensor(first) = p.steps[0].args[0] else {
        panic!()
    };
    let Out::Tensor(written) = p.steps[0].outs[0] else {
        panic!()
    };
    assert_eq!(p.steps[0].passthrough, vec![(first, written)]);
    assert_eq!(p.steps[1].args[0], Arg::Tensor(written));
    assert_eq!(fill_of(&p, 0, 0), Fill::NonNegative);
    assert_eq!(fill_of(&p, 0, 1), Fill::Random);
}

/// Tensors an optimizer's step reads first are its state, made as zeros like torch makes
/// it; the parameters it updates (read first by the forward) stay random, and so do the
/// tensors read first outside a step.
#[test]
fn optimizer_state_starts_at_zero() {
    let sqrt = "aten::sqrt(Tensor self) -> Tensor";
    let mut b = TraceBuilder::new();
    // Forward: the parameter (1) and another input (2).
    add_1d(&mut b, 1, 2, 3, 8);
    b.node("Optimizer.step#Adagrad.step").done();
    let step = b.last_id();
    // The state (4) is first read in the step; the parameter is read again there.
    b.op("aten::sqrt", sqrt)
        .parent(step)
        .input(f32(4, 4, 8), json!([8]), "Tensor(float)")
        .output(f32(5, 5, 8), json!([8]), "Tensor(float)")
        .done();
    b.op("aten::add_", ADD_)
        .parent(step)
        .input(f32(1, 1, 8), json!([8]), "Tensor(float)")
        .input(f32(5, 5, 8), json!([8]), "Tensor(float)")
        .input(json!(1), json!([]), "Int")
        .output(f32(1, 1, 8), json!([8]), "Tensor(float)")
        .done();
    // Outside a step, a sqrt's first read stays non-negative random.
    b.op("aten::sqrt", sqrt)
        .input(f32(6, 6, 8), json!([8]), "Tensor(float)")
        .output(f32(7, 7, 8), json!([8]), "Tensor(float)")
        .done();
    let p = plan_of(&b);
    let names: Vec<&str> = p.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        ["aten::add", "aten::sqrt", "aten::add_", "aten::sqrt"]
    );
    assert_eq!(fill_of(&p, 0, 0), Fill::Random, "the parameter");
    assert_eq!(fill_of(&p, 1, 0), Fill::Zeros, "the optimizer's state");
    assert_eq!(fill_of(&p, 3, 0), Fill::NonNegative, "outside a step");
}

/// Integer inputs are filled for their consumer: embedding indices below the table size.
#[test]
fn embedding_indices_are_bounded_by_the_table() {
    let mut b = TraceBuilder::new();
    b.op(
        "aten::embedding",
        "aten::embedding(Tensor weight, Tensor indices, SymInt padding_idx=-1, bool scale_grad_by_freq=False, bool sparse=False) -> Tensor",
    )
    .input(f32(1, 1, 70), json!([10, 7]), "Tensor(float)")
    .input(tensor(2, 2, 0, 5, 8, "cpu"), json!([5]), "Tensor(long int)")
    .input(json!(-1), json!([]), "Int")
    .input(json!(false), json!([]), "Bool")
    .input(json!(false), json!([]), "Bool")
    .output(f32(3, 3, 35), json!([5, 7]), "Tensor(float)")
    .done();
    let p = plan_of(&b);
    let idx = p
        .externals
        .iter()
        .find(|e| e.1.dtype == DType::Int64)
        .unwrap();
    assert_eq!(idx.2, Fill::Indices(10));
    assert_eq!(idx.1.shape, vec![5]);
}

/// Bucket boundaries are filled sorted (random ones made indices the original's data
/// never did), and the values bucketized stay random.
#[test]
fn bucket_boundaries_are_sorted() {
    let mut b = TraceBuilder::new();
    b.op(
        "aten::bucketize",
        "aten::bucketize.Tensor(Tensor self, Tensor boundaries, *, bool out_int32=False, bool right=False) -> Tensor",
    )
    .input(f32(1, 1, 64), json!([64]), "Tensor(float)")
    .input(f32(2, 2, 17), json!([17]), "Tensor(float)")
    .input(json!(false), json!([]), "Bool")
    .input(json!(false), json!([]), "Bool")
    .output(tensor(3, 3, 0, 64, 8, "cpu"), json!([64]), "Tensor(long int)")
    .done();
    let p = plan_of(&b);
    assert_eq!(fill_of(&p, 0, 0), Fill::Random, "the values");
    assert_eq!(fill_of(&p, 0, 1), Fill::Sorted(8.0), "the boundaries");
}

/// What a normalisation's backward reads of the forward's statistics, which no replayed op
/// made (they were saved inside the composite): those of normalised activations, mean 0
/// and rstd 1, not random values whose sign and size scale every gradient through it. The
/// gradient and the input stay random.
#[test]
fn a_norms_saved_statistics_are_those_of_normalised_activations() {
    let mut b = TraceBuilder::new();
    b.op(
        "aten::native_layer_norm_backward",
        "aten::native_layer_norm_backward(Tensor grad_out, Tensor input, SymInt[] normalized_shape, Tensor mean, Tensor rstd, Tensor? weight, Tensor? bias, bool[3] output_mask) -> (Tensor, Tensor, Tensor)",
    )
    .input(f32(1, 1, 32), json!([4, 8]), "Tensor(float)")
    .input(f32(2, 2, 32), json!([4, 8]), "Tensor(float)")
    .input(json!([8]), json!([[]]), "GenericList[Int]")
    .input(f32(3, 3, 4), json!([4, 1]), "Tensor(float)")
    .input(f32(4, 4, 4), json!([4, 1]), "Tensor(float)")
    .input(f32(5, 5, 8), json!([8]), "Tensor(float)")
    .input(f32(6, 6, 8), json!([8]), "Tensor(float)")
    .input(json!([true, true, true]), json!([[], [], []]), "GenericList[Bool,Bool,Bool]")
    .output(f32(7, 7, 32), json!([4, 8]), "Tensor(float)")
    .output(f32(8, 8, 8), json!([8]), "Tensor(float)")
    .output(f32(9, 9, 8), json!([8]), "Tensor(float)")
    .done();
    let p = plan_of(&b);
    assert!(p.steps[0].problem.is_none(), "{:?}", p.steps[0].problem);
    assert_eq!(fill_of(&p, 0, 0), Fill::Random, "the gradient");
    assert_eq!(fill_of(&p, 0, 1), Fill::Random, "the input");
    assert_eq!(fill_of(&p, 0, 3), Fill::Value(0.0), "the mean");
    assert_eq!(fill_of(&p, 0, 4), Fill::Value(1.0), "the rstd");
}

/// A tensor divisor no replayed op made is 1, not random values around zero.
#[test]
fn an_unmade_divisor_is_one() {
    let mut b = TraceBuilder::new();
    b.op(
        "aten::div",
        "aten::div.Tensor(Tensor self, Tensor other) -> Tensor",
    )
    .input(f32(1, 1, 32), json!([32]), "Tensor(float)")
    .input(f32(2, 2, 32), json!([32]), "Tensor(float)")
    .output(f32(3, 3, 32), json!([32]), "Tensor(float)")
    .done();
    let p = plan_of(&b);
    assert_eq!(fill_of(&p, 0, 0), Fill::Random, "the dividend");
    assert_eq!(fill_of(&p, 0, 1), Fill::Value(1.0), "the divisor");
}

/// A consumer's constraint reaches the external through a view of all its elements
/// (`unsqueeze`, as `NormBackward1` divides by the saved norm), not through a view of
/// some (`select`), where a fill made for the view's shape would not fit.
#[test]
fn a_divisor_reaches_its_external_through_a_whole_view() {
    const UNSQUEEZE: &str = "aten::unsqueeze(Tensor(a) self, int dim) -> Tensor(a)";
    const SELECT: &str = "aten::select.int(Tensor(a) self, int dim, SymInt index) -> Tensor(a)";
    const DIV: &str = "aten::div.Tensor(Tensor self, Tensor other) -> Tensor";
    let mut b = TraceBuilder::new();
    // The saved norm (external 1, 32 values) made [32, 1], the divisor of a [32, 32].
    b.op("aten::unsqueeze", UNSQUEEZE)
        .input(f32(1, 1, 32), json!([32]), "Tensor(float)")
        .input(json!(1), json!([]), "Int")
        .output(f32(2, 1, 32), json!([32, 1]), "Tensor(float)")
        .done();
    b.op("aten::div", DIV)
        .input(f32(3, 3, 1024), json!([32, 32]), "Tensor(float)")
        .input(f32(2, 1, 32), json!([32, 1]), "Tensor(float)")
        .output(f32(4, 4, 1024), json!([32, 32]), "Tensor(float)")
        .done();
    // A row of external 5 (8 x 4) as a divisor: the rest of it stays as it was.
    b.op("aten::select", SELECT)
        .input(f32(5, 5, 32), json!([8, 4]), "Tensor(float)")
        .input(json!(0), json!([]), "Int")
        .input(json!(0), json!([]), "Int")
        .output(f32(6, 5, 4), json!([4]), "Tensor(float)")
        .done();
    b.op("aten::div", DIV)
        .input(f32(7, 7, 4), json!([4]), "Tensor(float)")
        .input(f32(6, 5, 4), json!([4]), "Tensor(float)")
        .output(f32(8, 8, 4), json!([4]), "Tensor(float)")
        .done();
    let p = plan_of(&b);
    assert_eq!(
        fill_of(&p, 0, 0),
        Fill::Value(1.0),
        "the norm, through unsqueeze"
    );
    assert_eq!(fill_of(&p, 1, 0), Fill::Random, "the dividend");
    assert_eq!(
        fill_of(&p, 2, 0),
        Fill::Random,
        "the matrix a row of which divides"
    );
}

/// Sequence lengths reach `pack_padded_sequence` through a copy (`lengths.to(int64)`): the
/// external they were copied from gets lengths that add up to the rows the trace's packed
/// data holds, the longest as long as its batch sizes say.
#[test]
fn packed_sequence_lengths_fit_the_packed_data() {
    let mut b = TraceBuilder::new();
    b.op(
        "aten::to",
        "aten::to.dtype(Tensor(a) self, ScalarType dtype, bool non_blocking=False, bool copy=False, MemoryFormat? memory_format=None) -> Tensor(a)",
    )
    .input(tensor(1, 1, 0, 4, 8, "cpu"), json!([4]), "Tensor(long int)")
    .input(json!(4), json!([]), "Int")
    .input(json!(false), json!([]), "Bool")
    .input(json!(false), json!([]), "Bool")
    .output(tensor(2, 2, 0, 4, 8, "cpu"), json!([4]), "Tensor(long int)")
    .done();
    b.op(
        "aten::_pack_padded_sequence",
        "aten::_pack_padded_sequence(Tensor input, Tensor lengths, bool batch_first) -> (Tensor, Tensor)",
    )
    .input(f32(3, 3, 4 * 10 * 2), json!([4, 10, 2]), "Tensor(float)")
    .input(tensor(2, 2, 0, 4, 8, "cpu"), json!([4]), "Tensor(long int)")
    .input(json!(true), json!([]), "Bool")
    .output(f32(4, 4, 23 * 2), json!([23, 2]), "Tensor(float)")
    .output(tensor(5, 5, 0, 10, 8, "cpu"), json!([10]), "Tensor(long int)")
    .done();
    let p = plan_of(&b);
    let lengths = p
        .externals
        .iter()
        .find(|e| e.1.dtype == DType::Int64)
        .unwrap();
    assert_eq!(lengths.2, Fill::Ints(vec![10, 5, 4, 4]));
}

#[test]
fn sequence_lengths_are_sorted_bounded_and_add_up() {
    for (n, total, longest) in [
        (8, 194, 40),
        (4, 23, 10),
        (3, 3, 1),
        (5, 200, 40),
        (1, 7, 7),
    ] {
        let v = sequence_lengths(n, total, longest);
        assert_eq!(v.len(), n as usize);
        assert_eq!(v[0], longest);
        assert!(v.windows(2).all(|w| w[0] >= w[1]), "{v:?}");
        assert!(v.iter().all(|&l| (1..=longest).contains(&l)), "{v:?}");
        assert_eq!(v.iter().sum::<i64>(), total, "{v:?}");
    }
    // More rows than the sequences can hold, or fewer than one each: clamped, never 0.
    assert_eq!(sequence_lengths(3, 100, 10), vec![10, 10, 10]);
    assert_eq!(sequence_lengths(3, 1, 10), vec![10, 1, 1]);
    assert!(sequence_lengths(0, 5, 5).is_empty());
}

/// Binary cross-entropy's target is a probability, not a class index.
#[test]
fn binary_cross_entropy_targets_are_probabilities() {
    let mut b = TraceBuilder::new();
    b.op(
        "aten::binary_cross_entropy",
        "aten::binary_cross_entropy(Tensor self, Tensor target, Tensor? weight=None, int reduction=Mean) -> Tensor",
    )
    .input(f32(1, 1, 8), json!([8]), "Tensor(float)")
    .input(f32(2, 2, 8), json!([8]), "Tensor(float)")
    .input(json!(null), json!([]), "None")
    .input(json!(1), json!([]), "Int")
    .output(f32(3, 3, 1), json!([]), "Tensor(float)")
    .done();
    let p = plan_of(&b);
    assert!(
        p.externals.iter().all(|e| e.2 == Fill::Probability),
        "{:?}",
        p.externals
    );
    // With logits: the target only (logits are any real).
    let mut b = TraceBuilder::new();
    b.op(
        "aten::binary_cross_entropy_with_logits",
        "aten::binary_cross_entropy_with_logits(Tensor self, Tensor target, Tensor? weight=None, Tensor? pos_weight=None, int reduction=Mean) -> Tensor",
    )
    .input(f32(1, 1, 8), json!([8]), "Tensor(float)")
    .input(f32(2, 2, 8), json!([8]), "Tensor(float)")
    .input(json!(null), json!([]), "None")
    .input(json!(null), json!([]), "None")
    .input(json!(1), json!([]), "Int")
    .output(f32(3, 3, 1), json!([]), "Tensor(float)")
    .done();
    let p = plan_of(&b);
    assert_ne!(fill_of(&p, 0, 0), Fill::Probability);
    assert_eq!(fill_of(&p, 0, 1), Fill::Probability);
}

/// Views of one storage are separate externals sharing the storage id, each with its own
/// offset and extent.
#[test]
fn views_keep_their_storage_and_offset() {
    let mut b = TraceBuilder::new();
    b.op("aten::add", ADD)
        .input(tensor(1, 9, 0, 4, 4, "cpu"), json!([4]), "Tensor(float)")
        .input(tensor(2, 9, 4, 4, 4, "cpu"), json!([4]), "Tensor(float)")
        .input(json!(1), json!([]), "Int")
        .output(f32(3, 3, 4), json!([4]), "Tensor(float)")
        .done();
    let p = plan_of(&b);
    let specs: Vec<&TensorSpec> = p.externals.iter().map(|e| &e.1).collect();
    assert_eq!(specs.len(), 2);
    assert!(specs.iter().all(|s| s.storage == 9));
    assert_eq!((specs[0].offset, specs[1].offset), (0, 4));
    assert_eq!((specs[0].extent(), specs[1].extent()), (4, 8));
    assert_eq!(p.external_bytes(), 32, "one allocation of 8 floats");
}

/// Ops that cannot be planned carry their reason; the plan goes on around them.
#[test]
fn unplannable_ops_carry_a_reason() {
    let mut b = TraceBuilder::new();
    b.op("aten::x", "aten::x(Dimname d) -> Tensor")
        .input(json!("n"), json!([]), "String")
        .done();
    b.node("aten::no_schema_here").done();
    let p = plan_of(&b);
    assert!(p.steps[0]
        .problem
        .as_deref()
        .unwrap()
        .contains("not supported"));
    assert!(p.steps.iter().all(|s| s.kind == StepKind::Compute));
}

/// Collectives are their own kind, with the group and sizes the trace recorded; `--only`
/// is decided by the kind.
#[test]
fn collectives_are_a_step_kind_with_their_group() {
    let mut b = TraceBuilder::new();
    b.op(
        "record_param_comms",
        "record_param_comms(Tensor[] input_tensors, int rank, str pg_name, str name) -> Tensor[]",
    )
    .input(
        json!([f32(1, 1, 4)]),
        json!([[4]]),
        "GenericList[Tensor(float)]",
    )
    .input(json!(0), json!([]), "Int")
    .input(json!("0"), json!([]), "String")
    .input(json!("allreduce"), json!([]), "String")
    .output(
        json!([f32(1, 1, 4)]),
        json!([[4]]),
        "GenericList[Tensor(float)]",
    )
    .attr("collective_name", "string", "allreduce")
    .attr("pg_name", "string", "0")
    .attr("pg_size", "uint64", 2)
    .attr("in_msg_nelems", "uint64", 4)
    .done();
    b.op("aten::relu", "aten::relu(Tensor self) -> Tensor")
        .input(f32(1, 1, 4), json!([4]), "Tensor(float)")
        .output(f32(2, 2, 4), json!([4]), "Tensor(float)")
        .done();
    let p = plan_of(&b);
    let StepKind::Collective(c) = &p.steps[0].kind else {
        panic!("{:?}", p.steps[0].kind)
    };
    assert_eq!(c.name, "allreduce");
    assert_eq!(c.pg_name.as_deref(), Some("0"));
    assert_eq!((c.pg_size, c.in_msg_nelems), (Some(2), Some(4)));
    assert!(!p.steps[0].autograd);
    assert_eq!(p.included(et_graph::Kind::All), 2);
    assert_eq!(p.included(et_graph::Kind::Compute), 1);
    assert_eq!(p.included(et_graph::Kind::Comm), 1);
}

/// Float inputs are made to require grad only for ops that made a graph node in the
/// original: `relu` of a batch under grad mode records a sequence number but takes none (the
/// next op records the same), a `linear` of a parameter takes one (its backward record
/// carries it, or a later op records a larger one).
#[test]
fn only_ops_that_made_a_graph_node_get_inputs_that_require_grad() {
    let mut b = TraceBuilder::new();
    // relu(x) under grad mode, no input requiring grad: seq 7, and so is the next op's.
    b.op("aten::relu", "aten::relu(Tensor self) -> Tensor")
        .seq_id(7)
        .input(f32(1, 1, 4), json!([4]), "Tensor(float)")
        .output(f32(2, 2, 4), json!([4]), "Tensor(float)")
        .done();
    // mul(w, y): w required grad, a node took 7.
    b.op(
        "aten::mul",
        "aten::mul.Tensor(Tensor self, Tensor other) -> Tensor",
    )
    .seq_id(7)
    .input(f32(3, 3, 4), json!([4]), "Tensor(float)")
    .input(f32(2, 2, 4), json!([4]), "Tensor(float)")
    .output(f32(4, 4, 4), json!([4]), "Tensor(float)")
    .done();
    // add(z, c): the counter moved on (8) and a later op records 9.
    b.op(
        "aten::add",
        "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
    )
    .seq_id(8)
    .input(f32(4, 4, 4), json!([4]), "Tensor(float)")
    .input(f32(5, 5, 4), json!([4]), "Tensor(float)")
    .input(json!(1), json!([]), "Int")
    .output(f32(6, 6, 4), json!([4]), "Tensor(float)")
    .done();
    b.op("aten::neg", "aten::neg(Tensor self) -> Tensor")
        .seq_id(9)
        .input(f32(7, 7, 4), json!([4]), "Tensor(float)")
        .output(f32(8, 8, 4), json!([4]), "Tensor(float)")
        .done();
    // The backward record of mul's node carries 7; neg's (9) has none and nothing later.
    b.node("MulBackward0")
        .seq_id(7)
        .attr("fw_tid", "uint64", 1)
        .done();
    let p = plan_of(&b);
    assert!(
        p.steps.iter().all(|s| s.autograd),
        "all ran under grad mode"
    );
    // Inputs by step: relu's x (slot of tensor 1), mul's w (3), add's c (5), neg's (7).
    let input_slot = |step: usize, k: usize| p.steps[step].args[k].slots()[0];
    let x = input_slot(0, 0);
    let w = input_slot(1, 0);
    let c = input_slot(2, 1);
    let n = input_slot(3, 0);
    assert!(!p.grad_inputs.contains(&x), "relu's batch");
    assert!(p.grad_inputs.contains(&w), "mul's parameter");
    assert!(p.grad_inputs.contains(&c), "add's input: 8 < 9");
    assert!(
        !p.grad_inputs.contains(&n),
        "neg: nothing shows 9 was taken"
    );
}

/// A tensor autograd saved from an op's output reaches the backward under a new tensor id
/// over the same storage: it is the output's slot, not a new external input (relu's mask,
/// random, had made every backward through it a gradient of nothing). Another view of that
/// storage (other strides) is a view of the slot (`t(weight)` saved inside `linear`).
#[test]
fn a_saved_output_under_a_new_tensor_id_is_the_output() {
    let mut b = TraceBuilder::new();
    b.op("aten::relu", "aten::relu(Tensor self) -> Tensor")
        .input(f32(1, 1, 4), json!([2, 2]), "Tensor(float)")
        .output(tensor(2, 9, 0, 4, 4, "cpu"), json!([2, 2]), "Tensor(float)")
        .done();
    b.op(
        "aten::threshold_backward",
        "aten::threshold_backward(Tensor grad_output, Tensor self, Scalar threshold) -> Tensor",
    )
    .input(f32(3, 3, 4), json!([2, 2]), "Tensor(float)")
    .input(tensor(7, 9, 0, 4, 4, "cpu"), json!([2, 2]), "Tensor(float)")
    .input(json!(0), json!([]), "Int")
    .output(f32(4, 4, 4), json!([2, 2]), "Tensor(float)")
    .done();
    // The same storage read transposed: a view of the output.
    b.op("aten::mm", "aten::mm(Tensor self, Tensor mat2) -> Tensor")
        .input_strided(
            tensor(8, 9, 0, 4, 4, "cpu"),
            json!([2, 2]),
            json!([1, 2]),
            "Tensor(float)",
        )
        .input(f32(5, 5, 4), json!([2, 2]), "Tensor(float)")
        .output(f32(6, 6, 4), json!([2, 2]), "Tensor(float)")
        .done();
    let p = plan_of(&b);
    let Out::Tensor(relu_out) = p.steps[0].outs[0] else {
        panic!("{:?}", p.steps[0].outs)
    };
    assert_eq!(p.steps[1].args[1], Arg::Tensor(relu_out));
    let Arg::Tensor(view) = p.steps[2].args[0] else {
        panic!("{:?}", p.steps[2].args)
    };
    assert_ne!(view, relu_out);
    assert!(!p.externals.iter().any(|e| e.0 == view));
    assert_eq!(p.steps[2].views.len(), 1);
    let v = &p.steps[2].views[0];
    assert_eq!((v.slot, v.base), (view, relu_out));
    assert_eq!(
        (v.spec.shape.as_slice(), v.spec.strides.as_slice()),
        (&[2, 2][..], &[1, 2][..])
    );
    // The output lives until the backward's last read of it, through the view too.
    assert!(!p.steps[0].frees.contains(&relu_out));
    assert!(!p.steps[1].frees.contains(&relu_out));
    assert!(p.steps[2].frees.contains(&relu_out));
    p.validate().unwrap();
    // A view reaching past its base's elements is not one: an external.
    let mut b = TraceBuilder::new();
    b.op("aten::relu", "aten::relu(Tensor self) -> Tensor")
        .input(f32(1, 1, 4), json!([2, 2]), "Tensor(float)")
        .output(tensor(2, 9, 0, 4, 4, "cpu"), json!([2, 2]), "Tensor(float)")
        .done();
    b.op("aten::mm", "aten::mm(Tensor self, Tensor mat2) -> Tensor")
        .input_strided(
            tensor(8, 9, 0, 4, 4, "cpu"),
            json!([2, 2]),
            json!([1, 4]),
            "Tensor(float)",
        )
        .input(f32(5, 5, 4), json!([2, 2]), "Tensor(float)")
        .output(f32(6, 6, 4), json!([2, 2]), "Tensor(float)")
        .done();
    let p = plan_of(&b);
    assert!(p.steps[1].views.is_empty());
    let Arg::Tensor(other) = p.steps[1].args[0] else {
        panic!("{:?}", p.steps[1].args)
    };
    assert!(p.externals.iter().any(|e| e.0 == other));
}

/// A plan survives serde unchanged (a benchmark package stores it).
#[test]
fn plans_round_trip_through_json() {
    let mut b = TraceBuilder::new();
    b.op("aten::add", ADD)
        .input(
            tensor(1, 1, 0, 4, 2, "cpu"),
            json!([4]),
            "Tensor(c10::BFloat16)",
        )
        .input(tensor(2, 2, 0, 1, 8, "cpu"), json!([]), "Tensor(double)")
        .input(json!(2.5), json!([]), "Double")
        .output(
            tensor(3, 3, 0, 4, 2, "cpu"),
            json!([4]),
            "Tensor(c10::BFloat16)",
        )
        .done();
    let mut p = plan_of(&b);
    // Non-finite doubles (attention masks fill with -inf) survive too.
    p.steps[0]
        .args
        .push(Arg::DoubleList(vec![f64::NEG_INFINITY, 1.0, f64::INFINITY]));
    p.steps[0].args.push(Arg::ScalarDouble(f64::NEG_INFINITY));
    let text = serde_json::to_string(&p).unwrap();
    let back: Plan = serde_json::from_str(&text).unwrap();
    assert_eq!(back, p);
    assert!(text.contains("c10::BFloat16"), "dtypes by name: {text}");
    assert_eq!(p.version, Plan::VERSION);
    back.validate().unwrap();
}

/// A stored plan whose indices point outside it, or of another format, is refused before
/// anything runs it.
#[test]
fn damaged_plans_are_refused() {
    let mut b = TraceBuilder::new();
    add_1d(&mut b, 1, 2, 3, 4);
    let p = plan_of(&b);
    p.validate().unwrap();
    let mut bad = p.clone();
    bad.steps[0].args[0] = Arg::Tensor(99);
    assert!(bad.validate().unwrap_err().to_string().contains("slot 99"));
    let mut bad = p.clone();
    bad.steps[0].op = Some(7);
    assert!(bad.validate().is_err());
    let mut bad = p.clone();
    bad.version += 1;
    assert!(bad.validate().unwrap_err().to_string().contains("format"));
    let mut bad = p.clone();
    bad.version = Plan::OLDEST_READABLE - 1;
    assert!(bad.validate().unwrap_err().to_string().contains("format"));
    let mut bad = p;
    bad.externals[0].1.shape = vec![-4];
    assert!(bad.validate().is_err());
}

/// A package stored by the build before views (format 2) still runs: its JSON has no
/// `views`, and it validates as it is; format 2 claiming views does not.
#[test]
fn format_2_plans_without_views_still_run() {
    let mut b = TraceBuilder::new();
    add_1d(&mut b, 1, 2, 3, 4);
    let mut p = plan_of(&b);
    p.version = 2;
    let text = serde_json::to_string(&p).unwrap();
    assert!(!text.contains("views"), "{text}");
    let old: Plan = serde_json::from_str(&text).unwrap();
    old.validate().unwrap();
    let mut with_views = old;
    let spec = with_views.externals[0].1.clone();
    with_views.steps[0].views.push(View {
        slot: 0,
        base: 1,
        spec,
        kind: ViewKind::Strided,
    });
    assert!(with_views
        .validate()
        .unwrap_err()
        .to_string()
        .contains("views"));
}

/// Steps with the same operator, dtypes, shapes, strides and scalars share a signature;
/// a transposed view shows its strides, another alpha its value.
#[test]
fn signatures_key_on_operator_tensors_and_scalars() {
    let mut b = TraceBuilder::new();
    b.op("aten::add", ADD)
        .input(f32(1, 1, 6), json!([2, 3]), "Tensor(float)")
        .input(f32(2, 2, 6), json!([2, 3]), "Tensor(float)")
        .input(json!(1), json!([]), "Int")
        .output(f32(3, 3, 6), json!([2, 3]), "Tensor(float)")
        .done();
    b.op("aten::add", ADD)
        .input(f32(3, 3, 6), json!([2, 3]), "Tensor(float)")
        .input(f32(2, 2, 6), json!([2, 3]), "Tensor(float)")
        .input(json!(1), json!([]), "Int")
        .output(f32(4, 4, 6), json!([2, 3]), "Tensor(float)")
        .done();
    b.op("aten::add", ADD)
        .input_strided(f32(5, 1, 6), json!([3, 2]), json!([1, 3]), "Tensor(float)")
        .input(f32(6, 6, 6), json!([3, 2]), "Tensor(float)")
        .input(json!(2), json!([]), "Int")
        .output(f32(7, 7, 6), json!([3, 2]), "Tensor(float)")
        .done();
    let p = plan_of(&b);
    let sigs = p.signatures();
    assert_eq!(sigs[0], "aten::add.Tensor(float32[2,3],float32[2,3],1)");
    assert_eq!(sigs[1], sigs[0]);
    assert_eq!(
        sigs[2],
        "aten::add.Tensor(float32[3,2]@[1,3],float32[3,2],2)"
    );
    assert_eq!(p.signature(2), sigs[2]);
}

const ALLREDUCE: &str = "c10d::allreduce_(Tensor[] tensors, __torch__.torch.classes.c10d.ProcessGroup process_group, __torch__.torch.classes.c10d.ReduceOp reduce_op, Tensor? sparse_indices, int timeout) -> (Tensor[], __torch__.torch.classes.c10d.Work)";
const ALLGATHER: &str = "c10d::allgather_(Tensor[][] output_tensors, Tensor[] input_tensors, __torch__.torch.classes.c10d.ProcessGroup process_group, int timeout) -> (Tensor[][], __torch__.torch.classes.c10d.Work)";

/// `c10d::allreduce_` of tensor `id` (float32, `n` elements, its own storage), in place.
fn allreduce(b: &mut TraceBuilder, id: u64, n: u64) {
    b.op("c10d::allreduce_", ALLREDUCE)
        .input(
            json!([f32(id, id, n)]),
            json!([[n]]),
            "GenericList[Tensor(float)]",
        )
        .input(json!("pg"), json!([]), "Object")
        .input(json!("op"), json!([]), "Object")
        .input(json!(null), json!([]), "None")
        .input(json!(-1), json!([]), "Int")
        .output(
            json!([f32(id, id, n)]),
            json!([[n]]),
            "GenericList[Tensor(float)]",
        )
        .output(json!("work"), json!([]), "Object")
        .done();
}

/// A comm-only replay's pool holds what is in flight at once: three all-reduces of three
/// 1,000-element tensors, one after the other, take one buffer (and a spare for the backend's
/// late release), not three; a fourth of another size takes its own.
#[test]
fn the_pool_of_a_comm_only_replay_holds_what_is_in_flight_at_once() {
    let mut b = TraceBuilder::new();
    for id in [1, 2, 3] {
        allreduce(&mut b, id, 1000);
        add_1d(&mut b, id, id, 10 + id, 1000);
    }
    allreduce(&mut b, 4, 10);
    let p = plan_of(&b);
    let collectives = p.steps.iter().filter(|s| s.kind.is_collective()).count();
    assert_eq!(
        collectives,
        4,
        "{:?}",
        p.steps.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    let buffers = p.pooled_buffers();
    assert_eq!(
        buffers.get(&(DType::Float32, 1000)),
        Some(&2),
        "{buffers:?}"
    );
    assert_eq!(buffers.get(&(DType::Float32, 10)), Some(&1), "{buffers:?}");
    assert_eq!(p.pooled_peak_bytes(), 2 * 4000 + 40);
    assert_eq!(
        p.peak_bytes_estimate(et_graph::Kind::Comm),
        p.pooled_peak_bytes()
    );
    // Every slot a collective touches is released after it (no later collective reads it).
    let releases = p.comm_releases();
    for (pos, st) in p.steps.iter().enumerate() {
        if st.kind.is_collective() {
            assert!(!releases[pos].is_empty(), "step {pos}");
        } else {
            assert!(releases[pos].is_empty(), "step {pos}: {:?}", releases[pos]);
        }
    }
}

/// Bandwidth in nccl-tests' convention: an all-gather's message is its whole output (the
/// inputs it records include the output lists), an all-reduce's its buffer; the bus factors
/// by kind and group size.
#[test]
fn collectives_count_their_message_and_bus_factor_as_nccl_tests_does() {
    let mut b = TraceBuilder::new();
    allreduce(&mut b, 1, 100);
    b.op("c10d::allgather_", ALLGATHER)
        .input(
            json!([[
                f32(2, 2, 100),
                f32(3, 3, 100),
                f32(4, 4, 100),
                f32(5, 5, 100)
            ]]),
            json!([[[100], [100], [100], [100]]]),
            "GenericList[GenericList[Tensor(float),Tensor(float),Tensor(float),Tensor(float)]]",
        )
        .input(
            json!([f32(6, 6, 100)]),
            json!([[100]]),
            "GenericList[Tensor(float)]",
        )
        .input(json!("pg"), json!([]), "Object")
        .input(json!(-1), json!([]), "Int")
        .output(
            json!([[
                f32(2, 2, 100),
                f32(3, 3, 100),
                f32(4, 4, 100),
                f32(5, 5, 100)
            ]]),
            json!([[[100], [100], [100], [100]]]),
            "GenericList[GenericList[Tensor(float),Tensor(float),Tensor(float),Tensor(float)]]",
        )
        .output(json!("work"), json!([]), "Object")
        .done();
    let p = plan_of(&b);
    let coll = |k: usize| match &p.steps[k].kind {
        StepKind::Collective(c) => c.as_ref().clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(coll(0).message_bytes(), 400);
    assert_eq!(coll(1).bytes, 5 * 400, "inputs as recorded");
    assert_eq!(coll(1).message_bytes(), 4 * 400, "the whole output");
    let named = |name: &str| Collective {
        name: name.into(),
        ..Default::default()
    };
    assert_eq!(named("c10d::allreduce_").bus_factor(4), Some(1.5));
    assert_eq!(named("all_reduce").bus_factor(2), Some(1.0));
    assert_eq!(
        named("_c10d_functional::all_gather_into_tensor").bus_factor(4),
        Some(0.75)
    );
    assert_eq!(named("c10d::reduce_scatter_").bus_factor(2), Some(0.5));
    assert_eq!(named("c10d::alltoall_base_").bus_factor(8), Some(0.875));
    assert_eq!(named("c10d::broadcast_").bus_factor(8), Some(1.0));
    assert_eq!(named("c10d::reduce_").bus_factor(8), Some(1.0));
    assert_eq!(named("c10d::send").bus_factor(2), Some(1.0));
    assert_eq!(named("c10d::barrier").bus_factor(8), None);
    assert_eq!(named("wait").bus_factor(8), None);
}

/// The graph a forward builds is let go after its last recorded step, where a backward op
/// comes next: once per forward and backward (two here), not inside a forward.
#[test]
fn the_graph_is_let_go_after_each_forward_that_a_backward_follows() {
    let mut b = TraceBuilder::new();
    let relu = |b: &mut TraceBuilder, seq: i64, x: u64, y: u64| {
        b.op("aten::relu", "aten::relu(Tensor self) -> Tensor")
            .seq_id(seq)
            .input(f32(x, x, 4), json!([4]), "Tensor(float)")
            .output(f32(y, y, 4), json!([4]), "Tensor(float)")
            .done();
    };
    let backward = |b: &mut TraceBuilder, x: u64, y: u64| {
        let engine = b
            .node("autograd::engine::evaluate_function: ReluBackward0")
            .done();
        b.op("aten::neg", "aten::neg(Tensor self) -> Tensor")
            .parent(engine)
            .input(f32(x, x, 4), json!([4]), "Tensor(float)")
            .output(f32(y, y, 4), json!([4]), "Tensor(float)")
            .done();
    };
    relu(&mut b, 1, 1, 2);
    relu(&mut b, 2, 2, 3);
    backward(&mut b, 3, 4);
    relu(&mut b, 3, 5, 6);
    backward(&mut b, 6, 7);
    let p = plan_of(&b);
    let names: Vec<(&str, bool)> = p
        .steps
        .iter()
        .map(|s| (s.name.as_str(), s.autograd))
        .collect();
    assert_eq!(p.steps.len(), 5, "{names:?}");
    assert_eq!(p.graph_releases, vec![1, 3], "{names:?}");
    // Stored plans keep them, and a release past the steps is refused.
    let mut bad = p.clone();
    bad.graph_releases.push(5);
    assert!(matches!(
        bad.validate(),
        Err(InvalidPlan::ReleaseStep { step: 5, steps: 5 })
    ));
}

/// A value an op inside a composite made, and the backward reads (autograd saved it), is a
/// copy of its external input, made where the original held it from: after the forward's graph
/// is let go when the composite recorded one (the graph holds the replay's own until then),
/// after the composite's step otherwise; freed after its last use. A value no op of the
/// iteration made stays an external input.
#[test]
fn values_a_composite_made_for_the_backward_are_copied_where_the_original_held_them() {
    const RELU: &str = "aten::relu(Tensor self) -> Tensor";
    const SIGMOID: &str = "aten::sigmoid(Tensor self) -> Tensor";
    const NEG: &str = "aten::neg(Tensor self) -> Tensor";
    let trace = |autograd: bool| {
        let mut b = TraceBuilder::new();
        // Forward ops carry a sequence number where they recorded a graph node.
        let seq = |s: i64| if autograd { s } else { -1 };
        // The composite: relu(1) -> 2, inside it sigmoid(1) -> 40 on a storage of its own.
        let composite = b
            .op("aten::relu", RELU)
            .seq_id(seq(1))
            .input(f32(1, 1, 4), json!([4]), "Tensor(float)")
            .output(f32(2, 2, 4), json!([4]), "Tensor(float)")
            .done();
        b.op("aten::sigmoid", SIGMOID)
            .parent(composite)
            .input(f32(1, 1, 4), json!([4]), "Tensor(float)")
            .output(f32(40, 50, 4), json!([4]), "Tensor(float)")
            .done();
        b.op("aten::relu", RELU)
            .seq_id(seq(2))
            .input(f32(2, 2, 4), json!([4]), "Tensor(float)")
            .output(f32(3, 3, 4), json!([4]), "Tensor(float)")
            .done();
        let engine = b
            .node("autograd::engine::evaluate_function: ReluBackward0")
            .done();
        // The backward: neg(3), then neg of the sigmoid's value (tensor 41 over its storage),
        // then neg of a value no op made.
        for (x, storage, y) in [(3, 3, 4), (41, 50, 5), (60, 60, 6)] {
            b.op("aten::neg", NEG)
                .parent(engine)
                .input(f32(x, storage, 4), json!([4]), "Tensor(float)")
                .output(f32(y, y, 4), json!([4]), "Tensor(float)")
                .done();
        }
        plan_of(&b)
    };
    for autograd in [true, false] {
        let p = trace(autograd);
        let names: Vec<&str> = p.steps.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "aten::relu",
                "aten::relu",
                "aten::neg",
                "aten::neg",
                "aten::neg"
            ]
        );
        let copies: Vec<(usize, &View)> = p
            .steps
            .iter()
            .enumerate()
            .flat_map(|(i, s)| s.views.iter().map(move |v| (i, v)))
            .filter(|(_, v)| v.kind == ViewKind::Copy)
            .collect();
        assert_eq!(copies.len(), 1, "{autograd}: {:?}", p.steps);
        let (at, copy) = copies[0];
        // The graph is let go after step 1, the forward's last.
        assert_eq!(at, if autograd { 2 } else { 1 }, "{:?}", p.graph_releases);
        assert_eq!(p.steps[3].args[0], Arg::Tensor(copy.slot));
        assert!(p.externals.iter().any(|e| e.0 == copy.base));
        assert_eq!(copy.spec.shape, vec![4]);
        assert!(p.steps[3].frees.contains(&copy.slot), "{:?}", p.steps[3]);
        // The value no op made is read from its external input.
        let Arg::Tensor(other) = p.steps[4].args[0] else {
            panic!("{:?}", p.steps[4].args)
        };
        assert!(p.externals.iter().any(|e| e.0 == other));
        assert!(p.steps[4].views.is_empty());
    }
}

/// Cross-entropy's log-probabilities, saved inside the composite and read by the backward, are
/// made again of the logits right after the composite's step, where the original's were made:
/// the logits are let go there, not held to the backward.
#[test]
fn a_value_made_again_is_made_after_its_composite_and_its_input_let_go() {
    const CE: &str = "aten::cross_entropy_loss(Tensor self, Tensor target, Tensor? weight=None, int reduction=1, SymInt ignore_index=-100, float label_smoothing=0.0) -> Tensor";
    const LSM: &str = "aten::_log_softmax(Tensor self, int dim, bool half_to_float) -> Tensor";
    const BWD: &str = "aten::_log_softmax_backward_data(Tensor grad_output, Tensor output, int dim, ScalarType input_dtype) -> Tensor";
    const RELU: &str = "aten::relu(Tensor self) -> Tensor";
    let mut b = TraceBuilder::new();
    // Logits [2, 3] from a replayed op.
    b.op("aten::relu", RELU)
        .input(f32(1, 1, 6), json!([2, 3]), "Tensor(float)")
        .output(f32(2, 2, 6), json!([2, 3]), "Tensor(float)")
        .done();
    let ce = b
        .op("aten::cross_entropy_loss", CE)
        .input(f32(2, 2, 6), json!([2, 3]), "Tensor(float)")
        .input(json!([3, 3, 0, 2, 8, "cpu"]), json!([2]), "Tensor(long)")
        .input(json!("<None>"), json!([]), "None")
        .input(json!(1), json!([]), "Int")
        .input(json!(-100), json!([]), "Int")
        .input(json!(0.0), json!([]), "Double")
        .output(f32(4, 4, 1), json!([]), "Tensor(float)")
        .done();
    b.op("aten::_log_softmax", LSM)
        .parent(ce)
        .input(f32(2, 2, 6), json!([2, 3]), "Tensor(float)")
        .input(json!(1), json!([]), "Int")
        .input(json!(false), json!([]), "Bool")
        .output(f32(5, 5, 6), json!([2, 3]), "Tensor(float)")
        .done();
    // Something else between the loss and its backward.
    b.op("aten::relu", RELU)
        .input(f32(4, 4, 1), json!([]), "Tensor(float)")
        .output(f32(7, 7, 1), json!([]), "Tensor(float)")
        .done();
    b.op("aten::_log_softmax_backward_data", BWD)
        .input(f32(8, 8, 6), json!([2, 3]), "Tensor(float)")
        .input(f32(9, 5, 6), json!([2, 3]), "Tensor(float)")
        .input(json!(1), json!([]), "Int")
        .input(json!(6), json!([]), "Int")
        .output(f32(10, 10, 6), json!([2, 3]), "Tensor(float)")
        .done();
    let p = plan_of(&b);
    let names: Vec<&str> = p.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names[1], "aten::cross_entropy_loss", "{names:?}");
    assert_eq!(names[3], "aten::_log_softmax_backward_data", "{names:?}");
    assert!(p.steps[3].views.is_empty(), "{:?}", p.steps[3]);
    assert_eq!(p.steps[2].views.len(), 1, "{:?}", p.steps[2]);
    let v = &p.steps[2].views[0];
    assert_eq!(v.kind, ViewKind::LogSoftmax { dim: 1 });
    let Out::Tensor(logits) = p.steps[0].outs[0] else {
        panic!("{:?}", p.steps[0].outs)
    };
    assert_eq!(v.base, logits);
    assert_eq!(p.steps[3].args[1], Arg::Tensor(v.slot));
    assert!(p.steps[2].frees.contains(&logits), "{:?}", p.steps[2]);
    assert!(p.steps[3].frees.contains(&v.slot), "{:?}", p.steps[3]);
}

/// `kl_div`'s target is a distribution: its external input is filled non-negative, so the
/// divergence's log of it is finite (random signs made a fresh16 model's loss NaN).
#[test]
fn a_kl_divergences_target_is_non_negative() {
    const KL: &str = "aten::kl_div(Tensor self, Tensor target, int reduction=1, *, bool log_target=False) -> Tensor";
    let mut b = TraceBuilder::new();
    b.op("aten::kl_div", KL)
        .input(f32(1, 1, 6), json!([2, 3]), "Tensor(float)")
        .input(f32(2, 2, 6), json!([2, 3]), "Tensor(float)")
        .input(json!(1), json!([]), "Int")
        .input(json!(false), json!([]), "Bool")
        .output(f32(3, 3, 1), json!([]), "Tensor(float)")
        .done();
    let p = plan_of(&b);
    assert_eq!(fill_of(&p, 0, 0), Fill::Random);
    assert_eq!(fill_of(&p, 0, 1), Fill::NonNegative);
}

/// Collective kinds as PARAM and nccl-tests name them, whatever op or record carries them.
#[test]
fn collectives_have_the_kinds_param_names() {
    let kind = |name: &str| {
        Collective {
            name: name.into(),
            ..Default::default()
        }
        .kind()
    };
    assert_eq!(kind("c10d::allreduce_"), "all_reduce");
    assert_eq!(kind("allreduce"), "all_reduce");
    assert_eq!(kind("c10d::_allgather_base_"), "all_gather");
    assert_eq!(
        kind("_c10d_functional::all_gather_into_tensor"),
        "all_gather"
    );
    assert_eq!(kind("c10d::_reduce_scatter_base_"), "reduce_scatter");
    assert_eq!(kind("c10d::alltoall_base_"), "all_to_all");
    assert_eq!(kind("all_to_allv"), "all_to_all");
    assert_eq!(kind("c10d::reduce_"), "reduce");
    assert_eq!(kind("c10d::recv_"), "recv");
    assert_eq!(kind("wait"), "wait");
    assert_eq!(kind("something_else"), "something_else");
    // nccl-tests' bus factors follow the kind: gather and scatter move (n-1)/n of the message.
    let four = |name: &str| {
        Collective {
            name: name.into(),
            ..Default::default()
        }
        .bus_factor(4)
    };
    assert_eq!(four("c10d::gather_"), Some(0.75));
    assert_eq!(four("c10d::broadcast_"), Some(1.0));
    assert_eq!(four("c10d::barrier"), None);
}

/// A 4-rank job shrunk to 2: the world and the groups keep their kept members, an
/// all-to-all keeps the kept ranks' splits with tensors to match, an all-gather's output
/// follows the group's size; unknown kinds in a filter, and peers not kept, are refused.
#[test]
fn a_job_shrinks_to_fewer_ranks_with_its_tensors_resized() {
    let mut b = TraceBuilder::new();
    let pg = "__torch__.torch.classes.c10d.ProcessGroup process_group";
    b.op(
        "c10d::alltoall_base_",
        &format!(
            "c10d::alltoall_base_(Tensor output, Tensor input, {pg}, int[] output_split_sizes, \
             int[] input_split_sizes, int timeout) -> __torch__.torch.classes.c10d.Work"
        ),
    )
    .input(f32(1, 1, 10), json!([10, 8]), "Tensor(float)")
    .input(f32(2, 2, 10), json!([10, 8]), "Tensor(float)")
    .input(json!("<Object>"), json!([]), "Object")
    .input(json!([1, 2, 3, 4]), json!([]), "GenericList[Int]")
    .input(json!([4, 3, 2, 1]), json!([]), "GenericList[Int]")
    .input(json!(-1), json!([]), "Int")
    .output(json!("<Object>"), json!([]), "Object")
    .done();
    b.op(
        "c10d::_allgather_base_",
        &format!(
            "c10d::_allgather_base_(Tensor output_tensor, Tensor input_tensor, {pg}, \
             bool async_op=True, int timeout=-1) -> (Tensor, __torch__.torch.classes.c10d.Work)"
        ),
    )
    .input(f32(3, 3, 16), json!([16]), "Tensor(float)")
    .input(f32(4, 4, 4), json!([4]), "Tensor(float)")
    .input(json!("<Object>"), json!([]), "Object")
    .input(json!(false), json!([]), "Bool")
    .input(json!(-1), json!([]), "Int")
    .output(json!("<Object>"), json!([]), "Object")
    .done();
    let mut p = plan_of(&b);
    p.groups[0].size = 4;
    let sel = |world| CommSelection {
        world: Some((world, 4)),
        ..Default::default()
    };
    let q = p.select_comm(&sel(2)).unwrap();
    assert_eq!(q.groups[0].size, 2);
    let specs = q.slot_specs();
    let shape = |a: &Arg| match a {
        Arg::Tensor(s) => specs[*s as usize].unwrap().shape.clone(),
        other => panic!("{other:?}"),
    };
    let a2a = &q.steps[0].args;
    assert_eq!(a2a[3], Arg::IntList(vec![1, 2]));
    assert_eq!(a2a[4], Arg::IntList(vec![4, 3]));
    assert_eq!(shape(&a2a[0]), [3, 8]);
    assert_eq!(shape(&a2a[1]), [7, 8]);
    assert_eq!(shape(&q.steps[1].args[0]), [8]);
    assert_eq!(shape(&q.steps[1].args[1]), [4]);
    // Unchanged on the captured world; refused on more ranks or an unknown kind.
    assert_eq!(p.select_comm(&sel(4)).unwrap(), p);
    assert!(p.select_comm(&sel(5)).is_err());
    let bad = CommSelection {
        kinds: Some(vec!["allreduce".into()]),
        ..Default::default()
    };
    assert!(p
        .select_comm(&bad)
        .unwrap_err()
        .to_string()
        .contains("not a collective kind"));
    // Filters: the first collective only; the other is left out of a comm-only replay.
    let first = CommSelection {
        max: Some(1),
        ..Default::default()
    };
    let f = p.select_comm(&first).unwrap();
    assert_eq!(f.included(et_graph::Kind::Comm), 1);
}

const SEND: &str = "c10d::send(Tensor[] tensors, __torch__.torch.classes.c10d.ProcessGroup process_group, int dst, int tag) -> __torch__.torch.classes.c10d.Work";
const RECV: &str = "c10d::recv_(Tensor[] tensors, __torch__.torch.classes.c10d.ProcessGroup process_group, int src, int tag) -> __torch__.torch.classes.c10d.Work";

/// `c10d::send` (`op` of SEND) or `c10d::recv_` (RECV) of tensor `id` to or from `peer`.
fn p2p(b: &mut TraceBuilder, op: &str, schema: &str, id: u64, peer: i64) {
    b.op(op, schema)
        .input(
            json!([f32(id, id, 4)]),
            json!([[4]]),
            "GenericList[Tensor(float)]",
        )
        .input(json!("pg"), json!([]), "Object")
        .input(json!(peer), json!([]), "Int")
        .input(json!(0), json!([]), "Int")
        .output(json!("work"), json!([]), "Object")
        .done();
}

/// `--max-collectives 1` on a three-stage pipeline that all-reduces over the world after
/// its sends: each stage keeps its all-reduce, and each pair of neighbours the same send and
/// receive. Counted with the group's collectives, the middle stage (a receive and a send
/// before its all-reduce) would keep only its receive, and the others would wait in their
/// all-reduce for it.
#[test]
fn a_collective_cap_keeps_each_pairs_sends_and_the_groups_collectives() {
    let stage = |recv_from: Option<i64>, send_to: Option<i64>| {
        let mut b = TraceBuilder::new();
        if let Some(r) = recv_from {
            p2p(&mut b, "c10d::recv_", RECV, 1, r);
            p2p(&mut b, "c10d::recv_", RECV, 2, r);
        }
        if let Some(s) = send_to {
            p2p(&mut b, "c10d::send", SEND, 3, s);
            p2p(&mut b, "c10d::send", SEND, 4, s);
        }
        allreduce(&mut b, 5, 8);
        plan_of(&b)
    };
    let cap = CommSelection {
        max: Some(1),
        ..Default::default()
    };
    // What each stage keeps: (op, its peer) in order.
    let kept = |p: &Plan| -> Vec<(String, Option<i64>)> {
        let q = p.select_comm(&cap).unwrap();
        q.steps
            .iter()
            .filter(|s| s.kind.included(et_graph::Kind::Comm))
            .map(|s| {
                let peer = match s.args.get(2) {
                    Some(Arg::Int(r)) if s.name != "c10d::allreduce_" => Some(*r),
                    _ => None,
                };
                (s.name.clone(), peer)
            })
            .collect()
    };
    let (first, middle, last) = (
        stage(None, Some(1)),
        stage(Some(0), Some(2)),
        stage(Some(1), None),
    );
    let (send, recv, all) = ("c10d::send", "c10d::recv_", "c10d::allreduce_");
    let s = |n: &str, p: Option<i64>| (n.to_string(), p);
    assert_eq!(kept(&first), [s(send, Some(1)), s(all, None)]);
    assert_eq!(
        kept(&middle),
        [s(recv, Some(0)), s(send, Some(2)), s(all, None)]
    );
    assert_eq!(kept(&last), [s(recv, Some(1)), s(all, None)]);
    // A receive from any source: its senders cannot cap theirs to match, so the cap is refused.
    let mut b = TraceBuilder::new();
    b.op(
        "c10d::recv_any_source_",
        "c10d::recv_any_source_(Tensor[] tensors, __torch__.torch.classes.c10d.ProcessGroup \
         process_group, int tag) -> __torch__.torch.classes.c10d.Work",
    )
    .input(
        json!([f32(1, 1, 4)]),
        json!([[4]]),
        "GenericList[Tensor(float)]",
    )
    .input(json!("pg"), json!([]), "Object")
    .input(json!(0), json!([]), "Int")
    .output(json!("work"), json!([]), "Object")
    .done();
    let err = plan_of(&b).select_comm(&cap).unwrap_err().to_string();
    assert!(err.contains("any source"), "{err}");
}

/// Latency statistics: nearest-rank percentiles, and zeros for no samples.
#[test]
fn latency_statistics_take_nearest_rank_percentiles() {
    let v: Vec<f64> = (1..=20).map(f64::from).collect();
    let l = crate::report::Latency::of(&v);
    assert_eq!((l.min, l.p50, l.p95, l.max), (1.0, 10.0, 19.0, 20.0));
    assert_eq!(l.total, 210.0);
    assert_eq!(crate::report::Latency::of(&[]).max, 0.0);
}

/// z = x + y; w = z + y; v = w + y; u = v + y (16 bytes each). The original held z (a Python
/// name) until after the third op; w's free it recorded before w's last use, which the replay
/// cannot honour; v's allocation has another size and matches nothing; u it held past the
/// iteration.
#[test]
fn frees_follow_the_originals_where_they_come_later_than_last_use() {
    let mut b = TraceBuilder::new();
    add_1d(&mut b, 1, 2, 3, 4);
    add_1d(&mut b, 3, 2, 4, 4);
    add_1d(&mut b, 4, 2, 5, 4);
    add_1d(&mut b, 5, 2, 6, 4);
    let t = b.build();
    let g = Graph::new(&t);
    let set = g.replay_set(None);
    let mut p = compile(&g, &set);
    let out = |s: usize| match p.steps[s].outs[0] {
        Out::Tensor(x) => x,
        ref o => panic!("{o:?}"),
    };
    let (z, w, v, u) = (out(0), out(1), out(2), out(3));
    let freed_at = |p: &Plan, s: Slot| p.steps.iter().position(|st| st.frees.contains(&s));
    assert_eq!(
        [z, w, v, u].map(|s| freed_at(&p, s)),
        [Some(1), Some(2), Some(3), Some(3)]
    );
    let at = |bytes, freed_after| et_graph::Alloc { bytes, freed_after };
    let allocs = et_graph::OriginalAllocs {
        per_op: vec![
            vec![at(16, Some(2))],
            vec![at(16, Some(1))],
            vec![at(999, Some(3))],
            vec![at(16, None)],
        ],
        device_type: 0,
    };
    let f = p.follow_frees(&set, &allocs);
    assert_eq!(
        f,
        FreesFollowed {
            storages: 4,
            matched: 3,
            delayed: 1,
            held: 1
        }
    );
    assert_eq!(
        [z, w, v, u].map(|s| freed_at(&p, s)),
        [Some(2), Some(2), Some(3), Some(3)]
    );
    // Each slot is freed once.
    let frees: Vec<Slot> = p.steps.iter().flat_map(|s| s.frees.clone()).collect();
    let mut unique = frees.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(frees.len(), unique.len());
}
