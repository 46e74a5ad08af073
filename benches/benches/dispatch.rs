//! Replay dispatch overhead per op: a trace of 1000 tiny `aten::add` calls replayed through the
//! plan and the boxed dispatcher, against the same calls made directly through tch, in the same
//! run. The difference per op is what the replay adds (target: <= 2 us/op).

use criterion::{criterion_group, criterion_main, Criterion};
use et_schema::testkit::{tensor, TraceBuilder};
use serde_json::json;
use std::time::{Duration, Instant};

const N: usize = 1000;

fn tiny_add_trace() -> et_schema::Trace {
    let mut b = TraceBuilder::new();
    let t = |id: usize| tensor(id as u64, id as u64, 0, 4, 4, "cpu");
    for k in 0..N {
        // x_{k+1} = x_k + y, with x_0 and y external.
        let (x, y, out) = (if k == 0 { 1 } else { 10 + k }, 2, 11 + k);
        b.op(
            "aten::add",
            "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
        )
        .input(t(x), json!([4]), "Tensor(float)")
        .input(t(y), json!([4]), "Tensor(float)")
        .input(1, json!([]), "Int")
        .output(t(out), json!([4]), "Tensor(float)")
        .done();
    }
    b.build()
}

fn dispatch(c: &mut Criterion) {
    tch::set_num_threads(1);
    let trace = tiny_add_trace();
    let g = et_graph::Graph::new(&trace);
    let set = g.replay_set(None);
    let mut group = c.benchmark_group("dispatch_1000_tiny_adds");
    group.measurement_time(Duration::from_secs(5));
    group.bench_function("replay", |b| {
        b.iter_custom(|iters| {
            let opts = replay::ReplayOptions {
                warmup: 0,
                iters: iters as usize,
                ..Default::default()
            };
            let (r, _) = replay::replay(&g, &set, &opts).unwrap();
            assert_eq!(r.ops_failed, 0);
            Duration::from_secs_f64(r.iter_ms.mean * iters as f64 / 1000.0)
        })
    });
    group.bench_function("tch_direct", |b| {
        let x0 = tch::Tensor::randn([4], (tch::Kind::Float, tch::Device::Cpu));
        let y = tch::Tensor::randn([4], (tch::Kind::Float, tch::Device::Cpu));
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                let mut x = x0.shallow_clone();
                for _ in 0..N {
                    x = x.f_add(&y).unwrap();
                }
                std::hint::black_box(&x);
            }
            start.elapsed()
        })
    });
    group.finish();
}

criterion_group!(benches, dispatch);
criterion_main!(benches);
