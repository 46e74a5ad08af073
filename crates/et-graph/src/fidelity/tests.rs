use super::*;

fn model(gaps: &[f64], base: &[f64]) -> GapModel {
    GapModel {
        gaps_us: gaps.to_vec(),
        emulated_ms: gaps.iter().sum::<f64>() / 1e3,
        base_step_us: base.to_vec(),
        ..Default::default()
    }
}

/// An iteration's time, ops included, as the executor spins `m`'s gaps with `between` µs of
/// bookkeeping before each op: the bookkeeping counts toward the gaps, and what outlasts one
/// gap the later ones give back.
fn iteration_us(m: &GapModel, between: f64) -> f64 {
    let n = m.gaps_us.len() as f64;
    m.base_step_us.iter().sum::<f64>() + m.gaps_us.iter().sum::<f64>().max(between * n)
}

#[test]
fn an_anchored_replay_takes_the_references_original_on_this_hosts_speed() {
    // Ops 100 µs here; at the reference 200 µs of ops in a 220 µs plain replay (20 µs of
    // bookkeeping over 4 steps) beside a 500 µs original: this host is twice as fast, so
    // the replay takes 250 µs, its gaps shaped 1:3 as the profile's.
    let mut m = model(&[0.0, 10.0, 0.0, 30.0], &[25.0; 4]);
    let r = Reference {
        original_ms: 0.5,
        replay_ms: 0.22,
        replay_op_ms: 0.2,
    };
    anchor(&mut m, r);
    let a = m.anchored.clone().expect("anchored");
    assert!((a.host_ratio - 0.5).abs() < 1e-12);
    assert!((a.target_ms - 0.25).abs() < 1e-12);
    assert!((a.profiled_ms - 0.04).abs() < 1e-12);
    // 2.5 µs of bookkeeping a step here.
    assert!((iteration_us(&m, 2.5) - 250.0).abs() < 1e-6, "{m:?}");
    assert!((m.gaps_us[3] / m.gaps_us[1] - 3.0).abs() < 1e-9);
    assert_eq!((m.gaps_us[0], m.gaps_us[2]), (0.0, 0.0));
    assert!((m.emulated_ms - m.gaps_us.iter().sum::<f64>() / 1e3).abs() < 1e-12);
}

#[test]
fn a_base_with_the_gaps_in_place_replaces_the_plain_one_and_moves_the_anchor() {
    // Ops 25 µs each back to back, 30 between the gaps (a busy host's cache): the anchor's
    // host ratio and target follow the ops as the replay will run them.
    let mut m = model(&[0.0, 10.0, 0.0, 30.0], &[25.0; 4]);
    // The third step failed in the run with the gaps: it keeps its plain time.
    assert!(m.rebase(&[30.0, 30.0, f64::NAN, 30.0], 7));
    assert_eq!(m.base_step_us, vec![30.0, 30.0, 25.0, 30.0]);
    let b = m.time_base.expect("a time base");
    assert!((b.plain_ms - 0.1).abs() < 1e-12 && (b.with_gaps_ms - 0.115).abs() < 1e-12);
    assert_eq!(b.iterations, 7);
    let r = Reference {
        original_ms: 0.5,
        replay_ms: 0.2,
        replay_op_ms: 0.2,
    };
    anchor(&mut m, r);
    let a = m.anchored.clone().expect("anchored");
    assert!((a.replay_op_ms - 0.115).abs() < 1e-12);
    assert!((a.target_ms - 0.5 * 0.115 / 0.2).abs() < 1e-12);
    assert!((iteration_us(&m, 0.0) - 287.5).abs() < 1e-6, "{m:?}");
}

#[test]
fn the_ops_slowdown_between_gaps_is_the_ratio_of_the_steps_medians() {
    // Three steps 10% slower between the gaps; the fourth failed in the plain iterations
    // (NaN) and is left out of both sums.
    let m = OpsBetweenGaps::of(
        &[11.0, 22.0, 110.0, 50.0],
        &[10.0, 20.0, 100.0, f64::NAN],
        8,
    )
    .expect("timed");
    assert!((m.factor - 1.1).abs() < 1e-12, "{m:?}");
    assert_eq!(m.iterations, 8);
    // Nothing timed in both, or a ratio out of bounds: no measurement.
    assert!(OpsBetweenGaps::of(&[1.0, f64::NAN], &[f64::NAN, 1.0], 8).is_none());
    assert!(OpsBetweenGaps::of(&[0.0], &[0.0], 8).is_none());
    assert!(OpsBetweenGaps::of(&[3.0, 3.0], &[1.0, 1.0], 8).is_none());
}

#[test]
fn an_anchor_sets_the_host_by_the_ops_back_to_back_and_fills_the_target_between_gaps() {
    // Back to back the ops take 100 µs here, as at the reference (host ratio 1); between
    // the gaps 110. The replay takes the reference's original, 500 µs: 390 µs of gaps,
    // not 450 (its ops' cooling is in the original's time already) nor 550 (the cooling
    // taken for a slower host).
    let mut m = model(&[0.0, 10.0, 0.0, 30.0], &[25.0; 4]);
    m.set_ops_between_gaps(OpsBetweenGaps {
        factor: 1.1,
        iterations: 9,
    });
    assert!((m.base_op_us() - 110.0).abs() < 1e-9);
    assert!((m.plain_op_us() - 100.0).abs() < 1e-9);
    let r = Reference {
        original_ms: 0.5,
        replay_ms: 0.1,
        replay_op_ms: 0.1,
    };
    anchor(&mut m, r);
    let a = m.anchored.clone().expect("anchored");
    assert!((a.host_ratio - 1.0).abs() < 1e-12, "{a:?}");
    assert!((a.replay_op_ms - 0.1).abs() < 1e-12);
    assert!((a.target_ms - 0.5).abs() < 1e-12);
    assert!((iteration_us(&m, 0.0) - 500.0).abs() < 1e-6, "{m:?}");
    assert!((m.emulated_ms - 0.39).abs() < 1e-9);
    // Set again: from the plain base, not on top of the first factor.
    m.set_ops_between_gaps(OpsBetweenGaps {
        factor: 1.2,
        iterations: 9,
    });
    assert!((m.base_op_us() - 120.0).abs() < 1e-9);
}

#[test]
fn a_base_that_does_not_fit_the_steps_or_holds_no_time_is_refused() {
    let mut m = model(&[1.0, 2.0], &[10.0, 10.0]);
    assert!(!m.rebase(&[10.0], 5));
    let mut zero = model(&[1.0, 2.0], &[0.0, 0.0]);
    assert!(!zero.rebase(&[f64::NAN, -1.0], 5));
    for m in [&m, &zero] {
        assert!(m.time_base.is_none());
    }
    assert_eq!(m.base_step_us, vec![10.0, 10.0]);
}

#[test]
fn an_anchored_model_spins_nothing_where_the_plain_replay_is_already_as_slow() {
    // The original took no longer than the plain replay at the reference.
    let mut m = model(&[5.0, 5.0], &[50.0, 50.0]);
    let r = Reference {
        original_ms: 0.1,
        replay_ms: 0.11,
        replay_op_ms: 0.1,
    };
    anchor(&mut m, r);
    assert_eq!(m.anchored.as_ref().map(|a| a.scale), Some(0.0));
    assert_eq!(m.gaps_us, vec![0.0, 0.0]);
    assert_eq!(m.emulated_ms, 0.0);
}

#[test]
fn an_anchored_model_without_profiled_gaps_spreads_its_time_evenly() {
    let mut m = model(&[0.0, 0.0, 0.0], &[10.0; 3]);
    let r = Reference {
        original_ms: 0.06,
        replay_ms: 0.03,
        replay_op_ms: 0.03,
    };
    anchor(&mut m, r);
    assert_eq!(m.gaps_us, vec![10.0, 10.0, 10.0]);
}

#[test]
fn a_reference_that_is_not_a_time_leaves_the_profiles_gaps() {
    for r in [
        Reference {
            original_ms: f64::NAN,
            replay_ms: 0.2,
            replay_op_ms: 0.1,
        },
        Reference {
            original_ms: 1.0,
            replay_ms: 0.2,
            replay_op_ms: 0.0,
        },
        // More in ops than in the whole iteration.
        Reference {
            original_ms: 1.0,
            replay_ms: 0.1,
            replay_op_ms: 0.2,
        },
    ] {
        let mut m = model(&[5.0, 7.0], &[10.0, 10.0]);
        anchor(&mut m, r);
        assert!(m.anchored.is_none());
        assert_eq!(m.gaps_us, vec![5.0, 7.0]);
    }
}

#[test]
fn least_skips_what_is_not_finite() {
    assert_eq!(least([]), None);
    assert_eq!(least([f64::NAN]), None);
    assert_eq!(least([4.0]), Some(4.0));
    // A cold first iteration's 90 and a stall's infinity do not count.
    assert_eq!(least([90.0, 1.0, f64::INFINITY, 2.0]), Some(1.0));
}

#[test]
fn implausible_gaps_are_capped() {
    let orig = OriginalTiming {
        op_us: vec![Some(1000.0), Some(2000.0), None],
        gap_us: vec![0.0; 3],
        span_us: 0.0,
        iterations: vec![],
    };
    // 10 x 3 ms of ops = 30 ms cap.
    let mut gaps = vec![5.0, 1e9, f64::NAN];
    assert_eq!(cap_gaps(&mut gaps, &orig), 2);
    assert_eq!(gaps, vec![5.0, 30_000.0, 0.0]);
}

#[test]
fn comparison_counts_linked_ops_and_sorts_by_difference() {
    let orig = OriginalTiming {
        op_us: vec![Some(10.0), Some(100.0), None, Some(12.0)],
        gap_us: vec![0.0; 4],
        span_us: 200.0,
        iterations: vec![],
    };
    let c = compare_ops(
        &orig,
        &["a", "b", "b", "a"],
        &[11.0, 150.0, 7.0, 13.0],
        &[Some(12.0), None, None, Some(14.0)],
    );
    // b: one linked call, no profile, +50; a: two calls, profiled 26 vs 22, +4.
    assert_eq!(c.ops.len(), 2);
    assert_eq!(c.ops[0].op, "b");
    assert_eq!((c.ops[0].calls, c.ops[0].profiled_us), (1, None));
    assert_eq!(c.ops[1].op, "a");
    assert_eq!(c.ops[1].calls, 2);
    assert_eq!(c.ops[1].profiled_us, Some(26.0));
    assert_eq!(c.ops[1].replay_us, 24.0);
    assert_eq!(c.profiled_ops, 2);
    assert!((c.profiled_ms - 0.026).abs() < 1e-12);
    assert!((c.profiled_original_ms - 0.022).abs() < 1e-12);
}
