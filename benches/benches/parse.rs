//! Criterion benchmarks of the parsers on the real shared traces (small and medium).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::path::PathBuf;

fn shared(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/traces")
        .join(rel)
}

fn parse(c: &mut Criterion) {
    let mut g = c.benchmark_group("parse");
    for rel in [
        "public/param_hf_gpt2_1.1.0.et.json.gz",
        "public/param_resnet_1.1.0.et.json.gz",
        "cpu/transformer.et.json.gz",
    ] {
        let bytes = et_schema::read_input(&shared(rel)).expect("shared trace");
        g.throughput(Throughput::Bytes(bytes.len() as u64));
        g.bench_function(format!("et-schema/{rel}"), |b| {
            b.iter(|| {
                et_schema::parse_trace(&bytes, rel, &et_schema::ParseOptions::default()).unwrap()
            })
        });
        g.bench_function(format!("serde_json::Value/{rel}"), |b| {
            b.iter(|| serde_json::from_slice::<serde_json::Value>(&bytes).unwrap())
        });
    }
    g.finish();
}

fn schema(c: &mut Criterion) {
    let s = "aten::native_layer_norm_backward(Tensor grad_out, Tensor input, SymInt[] normalized_shape, Tensor mean, Tensor rstd, Tensor? weight, Tensor? bias, bool[3] output_mask) -> (Tensor, Tensor, Tensor)";
    c.bench_function("op_schema", |b| {
        b.iter(|| et_schema::OpSchema::parse(s).unwrap())
    });
}

criterion_group!(benches, parse, schema);
criterion_main!(benches);
