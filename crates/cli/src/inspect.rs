//! `mystique inspect`: a one-page summary of a trace (et-graph's `Summary`), as a table whose
//! figures each say what they count, or as JSON (`--json`, the `Summary` as it is).

use anyhow::Result;
use et_graph::{Summary, TensorStats};
use std::io::Write;
use std::path::Path;

pub fn run(path: &Path, json: bool, top: usize) -> Result<()> {
    let trace = crate::read_trace(path)?;
    let s = Summary::of(&trace);
    // The process ends after this: handing the model's pages back one by one (tens of ms on a
    // 200 MB trace, ~5% of the command) buys nothing the exit does not do at once.
    std::mem::forget(trace);
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer(&mut out, &s)?;
        writeln!(out)?;
        return Ok(());
    }
    print_table(&mut out, &s, top)
}

/// The summary as a table whose every figure says what it counts: a trace's tensors are
/// counted two ways (storages once each, and every distinct tensor view), which differ a lot.
fn print_table(out: &mut impl Write, s: &Summary, top: usize) -> Result<()> {
    writeln!(out, "trace      {}", s.source)?;
    writeln!(out, "schema     {} ({} layout)", s.schema, s.layout)?;
    writeln!(
        out,
        "nodes      {} (ops and annotations, all threads)",
        s.nodes
    )?;
    let devices = if s.devices.is_empty() {
        "-".into()
    } else {
        s.devices.join(", ")
    };
    writeln!(out, "devices    {devices}")?;
    let iterations = if s.iterations.is_empty() {
        "- (no ProfilerStep#N)".into()
    } else {
        s.iterations.join(", ")
    };
    writeln!(out, "iterations {iterations}")?;
    print_tensors(out, &s.tensors)?;
    if !s.process_groups.is_empty() {
        writeln!(out, "process groups {}", s.process_groups.len())?;
        for pg in &s.process_groups {
            writeln!(out, "  {pg}")?;
        }
    }
    if !s.collectives.is_empty() {
        writeln!(out, "collectives (calls of each)")?;
        for (c, n) in &s.collectives {
            writeln!(out, "  {c:<24} {n:>6}")?;
        }
    }
    print_names(out, s, top)
}

/// Tensors: how many, the memory their storages take, and the bytes of their views by type.
fn print_tensors(out: &mut impl Write, t: &TensorStats) -> Result<()> {
    writeln!(
        out,
        "tensors    {} distinct (tensor id, storage id) pairs over {} storages",
        t.count, t.storages
    )?;
    writeln!(
        out,
        "storage    {:<10} every storage once, at the largest extent a tensor reaches in it; \
         by device below (peak live bytes: `mystique graph`)",
        human_bytes(t.bytes)
    )?;
    for (d, b) in &t.bytes_by_device {
        writeln!(out, "  {d:<18} {:>12}", human_bytes(*b))?;
    }
    if !t.bytes_by_dtype.is_empty() {
        writeln!(
            out,
            "views      by element type: each distinct tensor's elements x item size; views \
             sharing a storage each count, so these can exceed the storage total"
        )?;
    }
    for (d, b) in &t.bytes_by_dtype {
        writeln!(out, "  {d:<18} {:>12}", human_bytes(*b))?;
    }
    Ok(())
}

/// The node-name histogram, most frequent first, `top` of them.
fn print_names(out: &mut impl Write, s: &Summary, top: usize) -> Result<()> {
    writeln!(
        out,
        "node names ({} distinct; ops and annotations alike)",
        s.ops.len()
    )?;
    writeln!(out, "  {:>7}  name", "nodes")?;
    for (name, n) in s.ops.iter().take(top) {
        writeln!(out, "  {n:>7}  {name}")?;
    }
    if s.ops.len() > top {
        writeln!(
            out,
            "  ... {} more (--top N, or --json for all)",
            s.ops.len() - top
        )?;
    }
    Ok(())
}

/// Bytes in binary units (KiB, MiB, ...), one decimal.
pub fn human_bytes(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}
