//! Any bytes as a stored replay plan, read as a package's reader reads it: parsed, validated,
//! and where valid bound to the CPU, sized and keyed. No panic, abort or hang; a valid plan's
//! estimate and signatures are computed without overflow.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(plan) = serde_json::from_slice::<replay::plan::Plan>(data) else {
        return;
    };
    if plan.validate().is_err() {
        return;
    }
    let bound = replay::bind(&plan, &replay::Device::Cpu);
    assert_eq!(bound.steps.len(), plan.steps.len());
    let _ = plan.peak_bytes_estimate(et_graph::Kind::All);
    let _ = plan.peak_bytes_estimate(et_graph::Kind::Comm);
    let _ = plan.signatures();
});
