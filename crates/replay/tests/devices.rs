//! The same checks on every device: CPU always, CUDA where a device is present (skipped, and
//! saying so, where not). See `replay::test_device!`.

mod common;
use common::replay_with;

/// A shared CPU trace replays completely on the device, and the report names it.
fn mlp_replays_completely(device: &replay::Device) {
    let opts = replay::ReplayOptions {
        device: *device,
        warmup: 1,
        iters: 2,
        ..Default::default()
    };
    let r = replay_with("cpu/mlp.et.json", &Default::default(), &opts);
    assert_eq!(r.ops_failed, 0, "{:?}", r.failures);
    assert_eq!(r.ops_replayed, r.ops_selected);
    assert!(r.ops_selected > 40);
    assert_eq!(r.device, device.name());
    assert!(r.iter_ms.median > 0.0);
}

/// The device's timer resolves marks in order, and its memory snapshot reads.
fn timer_marks_are_ordered(device: &replay::Device) {
    let mut timer = device.timer();
    let a = timer.mark();
    let x = tch::Tensor::ones([64, 64], (tch::Kind::Float, tch::Device::Cpu));
    let _y = x.matmul(&x);
    let b = timer.mark();
    timer.resolve();
    assert!(timer.us(b) >= timer.us(a));
    if *device == replay::Device::Cpu && cfg!(target_os = "linux") {
        let m = device.memory().expect("CPU memory reads on Linux");
        assert!(m.peak_bytes >= m.live_bytes && m.live_bytes > 0, "{m:?}");
    }
}

replay::test_device!(mlp_replays, mlp_replays_completely);
replay::test_device!(timer, timer_marks_are_ordered);
