//! Prints the replay set of a trace with each op's class and inputs' sources:
//! `cargo run -p et-graph --example replay_set -- TRACE`.

use et_graph::{Graph, OpClass};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("usage: replay_set TRACE")?;
    let trace = et_schema::read_trace(std::path::Path::new(&path))?;
    let graph = Graph::new(&trace);
    let set = graph.replay_set(None);
    let tensors = graph.tensors(&set);
    for (pos, &i) in set.ops.iter().enumerate() {
        let deps: Vec<u32> = tensors
            .edges
            .iter()
            .filter(|e| e.to == pos as u32)
            .map(|e| e.from)
            .collect();
        let inplace = if graph.class[i as usize].contains(OpClass::INPLACE) {
            " (in place)"
        } else {
            ""
        };
        println!(
            "{pos:>5} {:>7} {}{inplace} <- {deps:?}",
            graph.id(i),
            graph.name(i)
        );
    }
    println!(
        "{} ops, {} external inputs, peak {:?}",
        set.ops.len(),
        tensors.externals().count(),
        tensors.peak_bytes
    );
    Ok(())
}
