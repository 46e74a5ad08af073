//! The replay's own memory behaviour, in a test binary of its own: page faults are counted per
//! process, so no other test may run beside this one.

mod common;

/// A warm model re-uses its heap (the shared cnn faults about one page per training iteration
/// in Python); a replay that hands freed memory back to the OS after every iteration faults
/// its tensors in again each time (~400 pages per cnn iteration with glibc's defaults).
#[test]
fn a_warm_replay_does_not_fault_its_tensors_in_again() {
    tch::set_num_threads(1);
    let opts = replay::ReplayOptions {
        iters: 20,
        warmup: 3,
        ..Default::default()
    };
    let r = common::replay_with("cpu/cnn.linked.et.json.gz", &Default::default(), &opts);
    let pages = r.peak_bytes as f64 / 4096.0;
    let faults = r.page_faults_per_iter.expect("Linux counts page faults");
    assert!(
        faults < pages / 10.0,
        "{faults} page faults per iteration for {pages} pages of live tensors"
    );
}
