//! A replay whose instrumentation cannot start, in a test binary of its own: it holds the
//! process-wide execution trace observer, which no other test may see.

mod common;

#[test]
fn a_replay_whose_instrumentation_cannot_start_keeps_its_measurements() {
    tch::set_num_threads(1);
    // Someone else (here: this test) is profiling already.
    let held = replay::Instrumentation::start(false, et_graph::Instrumentation::LINKED).unwrap();
    let opts = replay::ReplayOptions {
        iters: 2,
        warmup: 0,
        instrument: true,
        ..Default::default()
    };
    let r = common::replay_with("cpu/mlp.linked.et.json", &Default::default(), &opts);
    // The held instrumentation is intact: the replay did not take it over.
    held.finish().unwrap();
    assert!(r.instrument_error.is_some());
    assert!(r.profiled.is_empty());
    assert_eq!(r.iter_ms.n, 2);
    assert_eq!(r.ops_failed, 0);
}
