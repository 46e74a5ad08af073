//! Stored plans as a forger or a damaged disk hands them over: thousands of mutations of real
//! compiled plans (numbers replaced by extremes, entries dropped or duplicated, values swapped
//! between fields) read as a package's reader reads them. Each is refused by `Plan::validate`
//! with an error or, where valid, binds and sizes itself without a panic. A seeded mutator, not
//! coverage-guided fuzzing: every run tries the same mutants, so a failure reproduces.

use serde_json::Value;

/// A path under `../shared/traces`.
fn shared(rel: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/traces")
        .join(rel)
}

/// xorshift64*: small, seeded, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Every value of the tree, by its path of keys and indices.
fn paths(v: &Value, at: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    out.push(at.clone());
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                at.push(k.clone());
                paths(x, at, out);
                at.pop();
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                at.push(i.to_string());
                paths(x, at, out);
                at.pop();
            }
        }
        _ => {}
    }
}

fn at_mut<'a>(v: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    path.iter().try_fold(v, |v, k| match v {
        Value::Object(m) => m.get_mut(k),
        Value::Array(a) => a.get_mut(k.parse::<usize>().ok()?),
        _ => None,
    })
}

/// One mutation of `v` at a random place.
fn mutate(v: &mut Value, rng: &mut Rng, all: &[Vec<String>]) {
    let path = &all[rng.below(all.len())];
    let donor = {
        let other = &all[rng.below(all.len())];
        at_mut(&mut v.clone(), other)
            .cloned()
            .unwrap_or(Value::Null)
    };
    let Some(x) = at_mut(v, path) else { return };
    const EXTREMES: [i64; 8] = [
        -1,
        0,
        1,
        i32::MAX as i64,
        u32::MAX as i64,
        i64::MAX,
        i64::MIN,
        1 << 40,
    ];
    match rng.below(6) {
        0 => *x = Value::from(EXTREMES[rng.below(EXTREMES.len())]),
        1 => *x = donor,
        2 => match x {
            Value::Array(a) if !a.is_empty() => {
                let k = rng.below(a.len());
                a.remove(k);
            }
            _ => *x = Value::Null,
        },
        3 => match x {
            Value::Array(a) if !a.is_empty() => {
                let k = rng.below(a.len());
                let dup = a[k].clone();
                a.push(dup);
            }
            _ => *x = Value::Array(vec![]),
        },
        4 => *x = Value::from(f64::MAX),
        _ => *x = Value::from("\u{0}x"),
    }
}

#[test]
fn mutated_plans_are_refused_or_bind_without_a_panic() {
    tch::set_num_threads(1);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let (mut refused, mut unreadable, mut valid, mut ran) = (0usize, 0usize, 0usize, 0usize);
    for rel in [
        "cpu/mlp.et.json",
        "cpu/cnn.et.json.gz",
        "cpu/dist_mlp_w2.rank0.et.json",
    ] {
        let t = et_schema::read_trace(&shared(rel)).unwrap();
        let g = et_graph::Graph::new(&t);
        let plan = replay::plan::compile(&g, &g.replay_set(None));
        let base = serde_json::to_value(&plan).unwrap();
        let mut all = Vec::new();
        paths(&base, &mut Vec::new(), &mut all);
        for _ in 0..1500 {
            let mut v = base.clone();
            for _ in 0..1 + rng.below(3) {
                mutate(&mut v, &mut rng, &all);
            }
            let Ok(p) = serde_json::from_value::<replay::plan::Plan>(v) else {
                unreadable += 1;
                continue;
            };
            if p.validate().is_err() {
                refused += 1;
                continue;
            }
            valid += 1;
            // What `run` does with a plan before it allocates: bind it, size it, key it.
            let bound = replay::bind(&p, &replay::Device::Cpu);
            assert_eq!(bound.steps.len(), p.steps.len());
            let _ = p.peak_bytes_estimate(et_graph::Kind::All);
            let _ = p.peak_bytes_estimate(et_graph::Kind::Comm);
            let _ = p.signatures();
            // And one iteration of those that are small: an error or a report, never a panic.
            if p.peak_bytes_estimate(et_graph::Kind::All) < 64 << 20 {
                let opts = replay::ReplayOptions {
                    iters: 1,
                    warmup: 0,
                    ..Default::default()
                };
                let _ = replay::executor::run(&p, &bound, &opts);
                ran += 1;
            }
        }
    }
    eprintln!(
        "4500 mutants: {unreadable} unreadable, {refused} refused, {valid} valid ({ran} run)"
    );
    assert!(refused > 0 && valid > 0, "{unreadable} {refused} {valid}");
}

/// One measured iteration of `plan` on the CPU, no warm-up: its report.
fn replay_once(plan: &replay::plan::Plan) -> replay::Report {
    let bound = replay::bind(plan, &replay::Device::Cpu);
    let opts = replay::ReplayOptions {
        iters: 1,
        warmup: 0,
        ..Default::default()
    };
    replay::executor::run(plan, &bound, &opts).unwrap().0
}

/// A step one argument short of its schema is refused by the call, not dispatched: libtorch's
/// boxed dispatcher reads its arguments from the stack's top without a bound check, so it would
/// take the memory before the stack for the missing one (a crash, or a tensor of garbage).
#[test]
fn a_step_short_of_an_argument_fails_with_its_arity() {
    tch::set_num_threads(1);
    let t = et_schema::read_trace(&shared("cpu/mlp.et.json")).unwrap();
    let g = et_graph::Graph::new(&t);
    let mut plan = replay::plan::compile(&g, &g.replay_set(None));
    let pos = plan
        .steps
        .iter()
        .position(|s| s.name == "aten::linear")
        .expect("mlp has a linear layer");
    // Its first argument (the input) gone: the dispatcher would look for it below the stack.
    plan.steps[pos].args.remove(0);
    plan.validate().unwrap();
    let report = replay_once(&plan);
    let f = report
        .failures
        .iter()
        .find(|f| f.op == "aten::linear")
        .unwrap_or_else(|| panic!("linear did not fail: {:?}", report.failures));
    assert!(
        f.reason
            .contains("2 arguments where aten::linear's schema takes 3"),
        "{}",
        f.reason
    );
}

/// A batch norm's backward handed a per-channel tensor of fewer values than the input has
/// channels, or a gradient of another shape (what a damaged plan can say), fails with the
/// reason: its CPU kernel indexes them by the input's channels unchecked, and read past the
/// end of the tensor (a crash where the read crossed into an unmapped page).
#[test]
fn a_batch_norm_backward_with_disagreeing_inputs_fails_with_the_reason() {
    tch::set_num_threads(1);
    let t = et_schema::read_trace(&shared("cpu/cnn.et.json.gz")).unwrap();
    let g = et_graph::Graph::new(&t);
    let base = replay::plan::compile(&g, &g.replay_set(None));
    let pos = base
        .steps
        .iter()
        .position(|s| s.name == "aten::native_batch_norm_backward")
        .expect("cnn trains a batch norm");
    let specs = base.slot_specs();
    let replay::plan::Arg::Tensor(input) = base.steps[pos].args[1] else {
        panic!("the input is not a tensor: {:?}", base.steps[pos].args[1]);
    };
    let input = specs[input as usize].expect("the input's spec");
    let channels = input.shape[1];
    // A tensor of the input's dtype with fewer values than channels, and one of another shape
    // than the input.
    let slot_where = |f: &dyn Fn(&[i64]) -> bool| {
        specs
            .iter()
            .position(|s| s.is_some_and(|s| f(&s.shape) && s.dtype == input.dtype))
            .unwrap() as replay::plan::Slot
    };
    let fewer = slot_where(&|s| s.len() == 1 && s[0] < channels);
    let other = slot_where(&|s| s.len() == input.shape.len() && s != input.shape.as_slice());
    for (arg, slot, says) in [(5, fewer, "save_mean holds"), (0, other, "grad_out is")] {
        let mut plan = base.clone();
        plan.steps[pos].args[arg] = replay::plan::Arg::Tensor(slot);
        plan.validate().unwrap();
        let report = replay_once(&plan);
        let f = report
            .failures
            .iter()
            .find(|f| f.op == "aten::native_batch_norm_backward")
            .unwrap_or_else(|| panic!("ran with {says}: {:?}", report.failures));
        assert!(
            f.reason.contains(says) && f.reason.contains("would read out of bounds"),
            "{}",
            f.reason
        );
    }
    // A backward through a batch norm in evaluation (frozen statistics): the forward saved no
    // statistics, and the kernel reads the running ones; what stands for the saved ones is not
    // checked, and the call runs.
    let mut plan = base.clone();
    plan.steps[pos].args[5] = replay::plan::Arg::Tensor(fewer);
    plan.steps[pos].args[7] = replay::plan::Arg::Bool(false);
    let report = replay_once(&plan);
    assert!(
        report
            .failures
            .iter()
            .all(|f| f.op != "aten::native_batch_norm_backward"),
        "{:?}",
        report.failures
    );
}
