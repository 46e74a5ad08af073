use super::*;

#[test]
fn a_probes_cost_is_the_difference_of_its_means_per_unit() {
    // Failed probes (negative) are left out, and the extremes of ten or more.
    let plain = [vec![1.0; 8], vec![0.1, 9.0]].concat();
    let instrumented = [vec![2.0; 4], vec![2.2; 4], vec![-1.0, 0.5, 30.0]].concat();
    let cost = probe_cost(&[plain, instrumented], 2).unwrap();
    assert!((cost - (2.1 - 1.0) / 2.0).abs() < 1e-12, "{cost}");
    // Cheaper under the instrumentation than without (noise): no cost, never negative.
    assert_eq!(probe_cost(&[vec![3.0], vec![2.0]], 1), Some(0.0));
    // Not timed on either side: none.
    assert_eq!(probe_cost(&[vec![], vec![2.0]], 1), None);
    assert_eq!(probe_cost(&[vec![1.0], vec![-1.0]], 1), None);
}

/// Each op probe's window is its own `aten::add` event's: the one inside its call's interval,
/// give or take the clock's slack, nearest the interval's middle (a step's `aten::add` just
/// before it is not taken); a probe whose event is missing has none. Of the probe's cost, the
/// part inside the window is the windows' mean less the kernel's.
#[test]
fn an_op_probe_takes_the_window_of_its_own_event() {
    let ev = |name: &str, start_ns: u64, end_ns: u64| crate::ffi::ProfiledEvent {
        name: name.into(),
        start_ns,
        end_ns,
        seq: -1,
    };
    let events = [
        // A step's add ending just before the first probe's call, and the probe's own.
        ev("aten::add", 1_006_000, 1_009_500),
        ev("aten::add", 1_010_500, 1_014_500),
        // The second probe's event, 1 µs off its call (the clock's fit).
        ev("aten::mul", 2_000_000, 2_003_000),
        ev("aten::add", 2_000_500, 2_004_000),
    ];
    let spans = [
        (1_010_000, 1_015_000),
        (2_001_500, 2_006_000),
        // No event there.
        (3_000_000, 3_005_000),
    ];
    assert_eq!(probe_windows(&events, &spans), vec![4.0, 3.5]);
    assert_eq!(finish::in_window(&[4.0, 3.5], &[0.5, 0.25]), Some(3.375));
    // Never below nothing; nothing without a window.
    assert_eq!(finish::in_window(&[0.2], &[0.5]), Some(0.0));
    assert_eq!(finish::in_window(&[], &[0.5]), None);
}

/// A profiled `aten::add` from `start_us` to `end_us`, its record-function scope tagged `seq`.
fn add_event(start_us: u64, end_us: u64, seq: i64) -> crate::ffi::ProfiledEvent {
    crate::ffi::ProfiledEvent {
        name: "aten::add".into(),
        start_ns: start_us * 1000,
        end_ns: end_us * 1000,
        seq,
    }
}

/// A trace of `n` chained `aten::add`s of four floats, each adding tensor 2 to the last sum.
fn add_chain(n: usize) -> et_schema::Trace {
    use et_schema::testkit::{tensor, TraceBuilder};
    let add = "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor";
    let f32 = |id| tensor(id, id, 0, 4, 4, "cpu");
    let mut b = TraceBuilder::new();
    for k in 0..n as u64 {
        let (x, out) = if k == 0 { (1, 3) } else { (k + 2, k + 3) };
        b.op("aten::add", add)
            .input(f32(x), serde_json::json!([4]), "Tensor(float)")
            .input(f32(2), serde_json::json!([4]), "Tensor(float)")
            .input(serde_json::json!(1), serde_json::json!([]), "Int")
            .output(f32(out), serde_json::json!([4]), "Tensor(float)")
            .done();
    }
    b.build()
}

/// A call probe's event is found by its tag, not taken for its step's (which has the same
/// name and follows it): each step's cost outside its window is its probe's time less the
/// event's window less the plain probes' time. A step whose probe's event is missing has none.
/// The boxing is the op probe's cost outside its window less the boxed add's.
#[test]
fn a_call_probe_is_charged_outside_the_window_its_tag_finds() {
    let t = add_chain(3);
    let g = et_graph::Graph::new(&t);
    let plan = crate::plan::compile(&g, &g.replay_set(None));
    let opts = ReplayOptions::default();
    let ev = add_event;
    let tag = crate::ffi::PROBE_SEQ;
    let profile = Profile {
        cpu: vec![
            ev(0, 2, tag),
            ev(3, 13, -1),
            ev(15, 18, tag + 1),
            ev(20, 30, -1),
            // The third step's probe event is missing.
            ev(35, 45, -1),
            // The boxed add's.
            ev(50, 51, tag - 1),
        ],
        gpu: Vec::new(),
    };
    let mut rec = Recorder::new(&plan, &opts, 0, metrics::cpu::CpuSampler::new());
    rec.calls_probed(false, vec![(0, 0.5), (1, 0.5), (2, 0.5)]);
    rec.calls_probed(true, vec![(0, 6.0), (1, 5.0), (2, 4.0)]);
    rec.op_probed(
        false,
        crate::ffi::ProbedOp {
            us: 1.0,
            kernel_us: 0.5,
            unix_ns: (0, 0),
        },
    );
    rec.op_probed(
        true,
        crate::ffi::ProbedOp {
            us: 6.0,
            kernel_us: 0.5,
            unix_ns: (0, 0),
        },
    );
    rec.boxed_add_probed(false, 0.5);
    rec.boxed_add_probed(true, 3.0);
    let steps = vec![(0usize, 0.0), (1, 0.0), (2, 0.0)];
    rec.profiled(&profile, None, std::slice::from_ref(&steps));
    let windows: Vec<Option<f64>> = rec.profiled[0]
        .iter()
        .map(|p| p.map(|p| p.end_us - p.start_us))
        .collect();
    assert_eq!(windows, vec![Some(10.0), Some(10.0), Some(10.0)]);
    assert_eq!(rec.call_costs(), vec![Some(3.5), Some(1.5), None]);
    // The op probe's window is not found here (its span is empty): no boxing.
    let boxing = |rec: &Recorder| {
        let (op, inside) = rec.op_costs();
        rec.boxing_cost(op, inside)
    };
    assert_eq!(boxing(&rec), None);
    rec.op_probe_windows = vec![2.5];
    // Outside the op probe's window: 5 - (2.5 - 0.5) = 3; the boxed add's: 2.5 - 1 = 1.5.
    assert_eq!(boxing(&rec), Some(1.5));
}

fn w(start_us: f64, end_us: f64, nested: u32) -> Option<ProfiledStep> {
    Some(ProfiledStep {
        start_us,
        end_us,
        nested,
        waited_us: 0.0,
    })
}

/// The session's warm-up iteration opens the profile: its events are passed over, so the
/// recorded iteration's windows are its own (here 50 and 8 µs, not the warm-up's 10 and 8).
#[test]
fn the_warm_up_iterations_events_are_not_a_recorded_iterations() {
    let t = add_chain(2);
    let g = et_graph::Graph::new(&t);
    let plan = crate::plan::compile(&g, &g.replay_set(None));
    let opts = ReplayOptions::default();
    let ev = |start_us, end_us| add_event(start_us, end_us, -1);
    let profile = Profile {
        cpu: vec![ev(0, 10), ev(12, 20), ev(100, 150), ev(152, 160)],
        gpu: Vec::new(),
    };
    let both = vec![(0usize, 0.0), (1, 0.0)];
    let windows = |warm_up: Option<&[(usize, f64)]>| {
        let mut rec = Recorder::new(&plan, &opts, 0, metrics::cpu::CpuSampler::new());
        rec.profiled(&profile, warm_up, std::slice::from_ref(&both));
        rec.profiled[0]
            .iter()
            .map(|p| p.map(|p| p.end_us - p.start_us))
            .collect::<Vec<_>>()
    };
    assert_eq!(windows(Some(&both)), vec![Some(50.0), Some(8.0)]);
    // Without it, the warm-up's windows stood for the recorded iteration's.
    assert_eq!(windows(None), vec![Some(10.0), Some(8.0)]);
}

/// Each recorded iteration's edges come from the `ProfilerStep#N` scope it ran in: from the
/// scope's start to its first op's window, and from its last op's window to the scope's end. The
/// scopes are not taken for ops (the steps' windows are their own), and the warm-up's scope,
/// the first, is passed over with its events.
#[test]
fn an_iterations_edges_are_measured_from_its_step_scope() {
    let t = add_chain(2);
    let g = et_graph::Graph::new(&t);
    let plan = crate::plan::compile(&g, &g.replay_set(None));
    let opts = ReplayOptions::default();
    let ev = |start_us, end_us| add_event(start_us, end_us, -1);
    let scope = |n: usize, start_us: u64, end_us: u64| crate::ffi::ProfiledEvent {
        name: format!("{}{n}", crate::ffi::STEP_SCOPE_PREFIX),
        start_ns: start_us * 1000,
        end_ns: end_us * 1000,
        seq: -1,
    };
    let profile = Profile {
        cpu: vec![
            // The warm-up: edges 2 + 5.
            scope(0, 0, 30),
            ev(2, 10),
            ev(12, 25),
            // Two recorded iterations: edges 3 + 4 and 5 + 6.
            scope(1, 100, 130),
            ev(103, 110),
            ev(112, 126),
            scope(2, 200, 240),
            ev(205, 220),
            ev(222, 234),
        ],
        gpu: Vec::new(),
    };
    let both = vec![(0usize, 0.0), (1, 0.0)];
    let mut rec = Recorder::new(&plan, &opts, 0, metrics::cpu::CpuSampler::new());
    rec.profiled(&profile, Some(&both), &[both.clone(), both.clone()]);
    assert_eq!(rec.step_edges_us, vec![7.0, 11.0]);
    let windows: Vec<Option<f64>> = rec.profiled[0]
        .iter()
        .map(|p| p.map(|p| p.end_us - p.start_us))
        .collect();
    assert_eq!(windows, vec![Some(7.0), Some(14.0)]);
    // Without scopes (an older profile, or instrumentation that recorded none): no edges.
    let bare = Profile {
        cpu: profile
            .cpu
            .iter()
            .filter(|e| !e.name.starts_with(crate::ffi::STEP_SCOPE_PREFIX))
            .cloned()
            .collect(),
        gpu: Vec::new(),
    };
    let mut rec = Recorder::new(&plan, &opts, 0, metrics::cpu::CpuSampler::new());
    rec.profiled(&bare, Some(&both), &[both.clone(), both.clone()]);
    assert!(rec.step_edges_us.is_empty());
}

#[test]
fn time_waited_for_a_cpu_leaves_the_windows_but_not_the_leads() {
    // The first step lost a 1500 µs slice in two runs of three: its running time is 10 µs
    // in each, and the next step's lead is still 2.
    let lost = |mut p: Option<ProfiledStep>, waited_us: f64| {
        if let Some(p) = &mut p {
            p.end_us += waited_us;
            p.waited_us = waited_us;
        }
        p
    };
    let runs = vec![
        vec![lost(w(0.0, 10.0, 0), 1500.0), w(1512.0, 1517.0, 0)],
        vec![lost(w(0.0, 10.0, 0), 1500.0), w(1512.0, 1517.0, 0)],
        vec![w(0.0, 10.0, 0), w(12.0, 17.0, 0)],
    ];
    let c = consolidate(&runs);
    let (a, b) = (c[0].unwrap(), c[1].unwrap());
    assert_eq!((a.start_us, a.end_us, a.waited_us), (0.0, 10.0, 0.0));
    assert_eq!((b.start_us, b.end_us), (12.0, 17.0));
}

#[test]
fn instrumented_windows_consolidate_to_means_of_durations_and_lead_times() {
    // Four runs of two steps: step 0 lasts 10 and 12 (the third run misses it), step 1
    // lasts 5, 5, 6 and, in the fourth run, 2005 (a lost time slice: left out); step 1
    // starts 2, 3 and 2 after step 0 ends.
    let runs = vec![
        vec![w(100.0, 110.0, 1), w(112.0, 117.0, 0)],
        vec![w(0.0, 12.0, 1), w(15.0, 20.0, 0)],
        vec![None, w(7.0, 13.0, 2)],
        vec![w(0.0, 11.0, 1), w(13.0, 2018.0, 0)],
    ];
    let c = consolidate(&runs);
    let (a, b) = (c[0].unwrap(), c[1].unwrap());
    assert_eq!((a.start_us, a.end_us, a.nested), (0.0, 11.0, 1));
    // lead: the mean of 2, 3 and 2; duration: the mean of 5, 5 and 6, without 2005.
    let lead = 7.0 / 3.0;
    assert!((b.start_us - (11.0 + lead)).abs() < 1e-9, "{b:?}");
    assert!((b.end_us - b.start_us - 16.0 / 3.0).abs() < 1e-9, "{b:?}");
    assert_eq!(consolidate(&[vec![None, None]]), vec![None, None]);
    // Neighbours found only in different runs: the typical lead (here 2), not 0.
    let runs = vec![
        vec![w(0.0, 10.0, 0), w(12.0, 14.0, 0), None],
        vec![None, None, w(50.0, 51.0, 0)],
    ];
    let c = consolidate(&runs);
    assert_eq!(c[2].unwrap().start_us, c[1].unwrap().end_us + 2.0);
}
