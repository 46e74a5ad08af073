//! Real libtorch: one step of a plan run on its own, repeatedly (what the per-op benchmarks
//! time), and a plan's steps grouped by signature with their share of the time.

mod common;

use replay::bind::Exec;
use replay::executor::{Executor, Outcome};
use replay::plan::Plan;
use replay::single::{signatures, SingleStep};

fn mlp() -> (et_schema::Trace, Plan) {
    let t = et_schema::read_trace(&common::shared("cpu/mlp.et.json")).unwrap();
    let plan = {
        let g = et_graph::Graph::new(&t);
        replay::plan::compile(&g, &g.select(&Default::default()).unwrap())
    };
    (t, plan)
}

/// For the first step of every signature of mlp: its producers run once, then the step alone
/// five times; each run calls the op, and its outputs have the recorded shapes and dtypes.
#[test]
fn single_step_repeats_with_recorded_output_shapes() {
    let (_t, plan) = mlp();
    let bound = replay::bind(&plan, &replay::Device::Cpu);
    let mut ex = Executor::new(&plan, &bound, true).unwrap();
    let groups = signatures(&plan, &[]);
    let mut checked = 0;
    for sig in &groups {
        let pos = sig.steps[0];
        if !matches!(bound.steps[pos].exec, Exec::Call(_)) {
            continue;
        }
        let mut one = SingleStep::new(&mut ex, pos, true);
        assert_eq!(one.pos(), pos);
        for _ in 0..5 {
            let outcome = one.run();
            assert!(
                matches!(outcome, Outcome::Ran { .. }),
                "{}: {outcome:?}",
                sig.signature
            );
        }
        for (spec, t) in one.outputs() {
            let t = t.unwrap_or_else(|| panic!("{}: an output is missing", sig.signature));
            assert_eq!(t.size(), spec.shape, "{}", sig.signature);
            assert_eq!(
                t.kind(),
                replay::device::Device::Cpu
                    .synthesise(spec)
                    .expect("a spec synthesises")
                    .kind(),
                "{}",
                sig.signature
            );
        }
        checked += 1;
    }
    assert!(checked >= 5, "only {checked} signatures ran");
}

/// `prepare(pos)` leaves step `pos`'s inputs in the slots, with the recorded shapes.
#[test]
fn prepare_fills_the_step_inputs() {
    let (_t, plan) = mlp();
    let bound = replay::bind(&plan, &replay::Device::Cpu);
    let mut ex = Executor::new(&plan, &bound, true).unwrap();
    let specs = plan.slot_specs();
    let last = plan.steps.len() - 1;
    let slots = ex.prepare(last, true);
    for s in bound.args(&plan, last).iter().flat_map(|a| a.slots()) {
        let t = slots[s as usize].as_ref().expect("an input of the step");
        if let Some(spec) = specs[s as usize] {
            assert_eq!(t.size(), spec.shape, "slot {s}");
        }
    }
}

/// Every step is in exactly one signature; counts, times and shares add up; the most time
/// comes first. With equal times the share is the count's.
#[test]
fn signatures_partition_the_steps_and_their_time() {
    let (_t, plan) = mlp();
    let opts = replay::ReplayOptions {
        warmup: 1,
        iters: 2,
        per_step: true,
        ..Default::default()
    };
    // The same selection as `mlp()`'s plan: its steps are the plan's.
    let report = common::replay_with("cpu/mlp.et.json", &Default::default(), &opts);
    assert_eq!(report.steps.len(), plan.steps.len());
    let us: Vec<f64> = report.steps.iter().map(|s| s.us).collect();
    let groups = signatures(&plan, &us);
    let mut seen = vec![0; plan.steps.len()];
    for g in &groups {
        for &p in &g.steps {
            seen[p] += 1;
            assert_eq!(plan.signature(p), g.signature);
            assert_eq!(plan.steps[p].name, g.op);
        }
    }
    assert!(seen.iter().all(|&n| n == 1), "{seen:?}");
    assert!(groups.len() < plan.steps.len(), "some steps repeat");
    let share: f64 = groups.iter().map(|g| g.share).sum();
    assert!((share - 1.0).abs() < 1e-9, "{share}");
    assert!(groups.windows(2).all(|w| w[0].us >= w[1].us));
    let total: f64 = us.iter().filter(|t| t.is_finite()).sum();
    let grouped: f64 = groups.iter().map(|g| g.us).sum();
    assert!((total - grouped).abs() <= 1e-6 * total.max(1.0));

    let equal = signatures(&plan, &vec![1.0; plan.steps.len()]);
    for g in &equal {
        let expect = g.steps.len() as f64 / plan.steps.len() as f64;
        assert!((g.share - expect).abs() < 1e-12, "{}", g.signature);
    }
    assert!(equal
        .windows(2)
        .all(|w| w[0].steps.len() >= w[1].steps.len()));
}
