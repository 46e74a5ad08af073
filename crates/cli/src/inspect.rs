use anyhow::Result;
use et_graph::Summary;
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
    for w in &s.warnings {
        eprintln!("warning: {w}");
    }
    writeln!(out, "trace      {}", s.source)?;
    writeln!(out, "schema     {} ({} layout)", s.schema, s.layout)?;
    writeln!(out, "nodes      {}", s.nodes)?;
    writeln!(
        out,
        "devices    {}",
        if s.devices.is_empty() {
            "-".into()
        } else {
            s.devices.join(", ")
        }
    )?;
    writeln!(
        out,
        "iterations {}",
        if s.iterations.is_empty() {
            "- (no ProfilerStep#N)".into()
        } else {
            s.iterations.join(", ")
        }
    )?;
    writeln!(
        out,
        "tensors    {} distinct, {} storages, {}",
        s.tensors.count,
        s.tensors.storages,
        human_bytes(s.tensors.bytes)
    )?;
    for (d, b) in &s.tensors.bytes_by_device {
        writeln!(out, "  {d:<18} {:>12}", human_bytes(*b))?;
    }
    for (d, b) in &s.tensors.bytes_by_dtype {
        writeln!(out, "  {d:<18} {:>12}  (views)", human_bytes(*b))?;
    }
    if !s.process_groups.is_empty() {
        writeln!(out, "process groups {}", s.process_groups.len())?;
        for pg in &s.process_groups {
            writeln!(out, "  {pg}")?;
        }
    }
    if !s.collectives.is_empty() {
        writeln!(out, "collectives")?;
        for (c, n) in &s.collectives {
            writeln!(out, "  {c:<24} {n:>6}")?;
        }
    }
    writeln!(out, "ops ({} distinct names)", s.ops.len())?;
    writeln!(out, "  {:>7}  name", "count")?;
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
