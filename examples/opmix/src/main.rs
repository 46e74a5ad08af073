//! What a downstream crate can do with `et-graph` alone (no libtorch, no replay): for each
//! iteration of a trace, its op mix (calls per op, compute vs collectives) and tensor memory
//! (external inputs, peak live bytes per device).
//!
//! ```sh
//! cargo run --release -p et-graph-opmix -- examples/traces/mlp.et.json.gz
//! ```

use et_graph::{et_schema, Graph, OpClass};
use std::collections::BTreeMap;

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: et-graph-opmix TRACE (.json or .json.gz)")?;
    let trace = et_schema::read_trace(std::path::Path::new(&path))?;
    let g = Graph::new(&trace);
    let iterations: Vec<Option<u64>> = match g.iterations() {
        v if v.is_empty() => vec![None],
        v => v.into_iter().map(|(_, n)| Some(n)).collect(),
    };
    println!(
        "{path}: {} nodes, schema {}",
        trace.nodes.len(),
        trace.meta.schema
    );
    for it in iterations {
        let set = match it {
            Some(n) => g.replay_set(Some(&[n])),
            None => g.replay_set(None),
        };
        let mut mix: BTreeMap<&str, usize> = BTreeMap::new();
        let mut collectives = 0;
        for &i in &set.ops {
            *mix.entry(g.name(i)).or_default() += 1;
            collectives += g.class[i as usize].contains(OpClass::COLLECTIVE) as usize;
        }
        let tensors = g.tensors(&set);
        let external: u64 = tensors
            .tensors
            .values()
            .filter(|t| t.external)
            .map(|t| t.numel * t.itemsize)
            .sum();
        let label = it.map_or("whole trace".to_string(), |n| format!("iteration {n}"));
        println!(
            "{label}: {} ops ({} compute, {collectives} collectives), {} distinct; external inputs {:.1} MiB",
            set.ops.len(),
            set.ops.len() - collectives,
            mix.len(),
            mib(external)
        );
        for (device, peak) in &tensors.peak_bytes {
            println!("  peak live tensors on {device}: {:.1} MiB", mib(*peak));
        }
        let mut top: Vec<(&str, usize)> = mix.into_iter().collect();
        top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        for (op, n) in top.iter().take(8) {
            println!("  {n:>6}  {op}");
        }
    }
    Ok(())
}
