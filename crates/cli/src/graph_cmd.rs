use crate::inspect::human_bytes;
use anyhow::Result;
use et_graph::{Graph, OpClass};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

pub fn graph(path: &Path, json: bool, iterations: Option<Vec<u64>>) -> Result<()> {
    let trace = crate::read_trace(path)?;
    let g = Graph::new(&trace);
    // The iterations checked as every command that selects checks them.
    let set = match iterations {
        Some(its) => g.select(&et_graph::Selection {
            iterations: Some(its),
            ..Default::default()
        })?,
        None => g.replay_set(None),
    };
    let tensors = g.tensors(&set);
    let mut classes: BTreeMap<&str, usize> = BTreeMap::new();
    let names = [
        (OpClass::OP, "op"),
        (OpClass::ATEN, "aten"),
        (OpClass::CUSTOM, "custom"),
        (OpClass::COLLECTIVE, "collective"),
        (OpClass::KERNEL, "kernel"),
        (OpClass::ANNOTATION, "annotation"),
        (OpClass::BACKWARD, "backward"),
        (OpClass::VIEW, "view"),
        (OpClass::INPLACE, "inplace"),
        (OpClass::CPU, "cpu"),
        (OpClass::CUDA, "cuda"),
    ];
    for &i in &set.ops {
        for (f, n) in names {
            if g.class[i as usize].contains(f) {
                *classes.entry(n).or_default() += 1;
            }
        }
    }
    let mut ops: BTreeMap<&str, usize> = BTreeMap::new();
    for &i in &set.ops {
        *ops.entry(g.name(i)).or_default() += 1;
    }
    let externals = tensors.externals().count();
    let external_bytes: u64 = tensors.externals().map(|t| t.numel * t.itemsize).sum();
    let j = serde_json::json!({
        "source": trace.source,
        "nodes": trace.nodes.len(),
        "iterations": g.iterations().iter().map(|x| x.1).collect::<Vec<_>>(),
        "replay_set": {
            "ops": set.ops.len(),
            "classes": classes,
            "skipped": set.skip_counts(),
            "by_name": ops,
        },
        "tensors": {
            "count": tensors.tensors.len(),
            "external_inputs": externals,
            "external_bytes": external_bytes,
            "data_edges": tensors.edges.len(),
            "storages": tensors.alias_groups().len(),
            "alias_groups": tensors.alias_groups().values().filter(|v| v.len() > 1).count(),
            "peak_live_bytes": tensors.peak_bytes,
        },
    });
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer(&mut out, &j)?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(out, "trace        {}", trace.source)?;
    writeln!(out, "nodes        {}", trace.nodes.len())?;
    writeln!(out, "replay set   {} ops", set.ops.len())?;
    for (k, v) in &classes {
        writeln!(out, "  {k:<12} {v:>7}")?;
    }
    writeln!(out, "not replayed")?;
    for (k, v) in set.skip_counts() {
        writeln!(out, "  {k:<22} {v:>7}")?;
    }
    writeln!(
        out,
        "tensors      {} ({} external inputs, {}), {} data edges",
        tensors.tensors.len(),
        externals,
        human_bytes(external_bytes),
        tensors.edges.len()
    )?;
    for (d, b) in &tensors.peak_bytes {
        writeln!(out, "  peak live on {d:<10} {:>12}", human_bytes(*b))?;
    }
    Ok(())
}

pub fn link(et: &Path, kineto: &Path, json: bool) -> Result<()> {
    let trace = crate::read_trace(et)?;
    let k = crate::read_kineto(kineto)?;
    let g = Graph::new(&trace);
    let set = g.replay_set(None);
    let l = et_graph::link(&g, &set, &k)?;
    let kernels: usize = l.gpu_events.iter().map(Vec::len).sum();
    let unlinked: Vec<serde_json::Value> = set
        .ops
        .iter()
        .zip(&l.event_of)
        .filter(|(_, e)| e.is_none())
        .take(20)
        .map(|(&i, _)| serde_json::json!({"id": g.id(i), "name": g.name(i)}))
        .collect();
    let cpu_us: f64 = l
        .event_of
        .iter()
        .flatten()
        .map(|&e| k.events[e as usize].dur)
        .sum();
    let (gpu, _) = et_graph::original_gpu(&l, &k);
    let off = et_graph::off_op_summary(&l, &k);
    let j = serde_json::json!({
        "et": trace.source,
        "kineto": k.source,
        "method": l.method,
        "ops": set.ops.len(),
        "linked": l.linked(),
        "fraction": l.fraction(),
        "gpu_events": kernels,
        "gpu": gpu,
        "gpu_off_op": off,
        "linked_cpu_us": cpu_us,
        "unlinked_sample": unlinked,
        "warnings": l.warnings,
    });
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer(&mut out, &j)?;
        writeln!(out)?;
        return Ok(());
    }
    for w in &l.warnings {
        eprintln!("warning: {w}");
    }
    writeln!(
        out,
        "linked {} of {} replay-set ops ({:.1}%) by {:?}",
        l.linked(),
        set.ops.len(),
        100.0 * l.fraction(),
        l.method
    )?;
    writeln!(
        out,
        "GPU events under linked ops: {kernels}; linked CPU time {:.3} ms",
        cpu_us / 1000.0
    )?;
    if gpu.events > 0 {
        print_off_op(&mut out, &off)?;
        print_gpu_activity(&mut out, "original", &gpu)?;
    }
    for u in unlinked {
        writeln!(out, "  unlinked: {} {}", u["id"], u["name"])?;
    }
    Ok(())
}

/// The iteration's GPU work that no linked op launched: what launched it, what it was
/// attributed to, what could not be.
pub fn print_off_op(out: &mut impl Write, s: &et_graph::OffOpSummary) -> std::io::Result<()> {
    if s.attributed + s.unattributed == 0 {
        return Ok(());
    }
    writeln!(
        out,
        "GPU events launched outside the linked ops: {} ({:.3} ms) attributed to the replayed \
         ops around their launch, {} ({:.3} ms) not attributed",
        s.attributed,
        s.attributed_us / 1e3,
        s.unattributed,
        s.unattributed_us / 1e3
    )?;
    for g in s.by_launcher.iter().take(8) {
        writeln!(
            out,
            "  {:>9.3} ms {:>6}x  under {}{}: {}",
            g.total_us / 1e3,
            g.events,
            g.launched_under,
            if g.attributed {
                ""
            } else {
                " (not attributed)"
            },
            g.kernels.join(", ")
        )?;
    }
    Ok(())
}

/// GPU busy time, the breakdown by kind of work, overlap and top kernels, as text.
pub fn print_gpu_activity(
    out: &mut impl Write,
    label: &str,
    a: &et_graph::GpuActivity,
) -> std::io::Result<()> {
    writeln!(
        out,
        "GPU ({label}): busy {:.3} ms of a {:.3} ms span; compute {:.3} ms, communication {:.3} ms \
         ({:.3} ms overlapped with compute, {:.3} ms exposed), memcpy {:.3} ms, memset {:.3} ms",
        a.busy_us / 1e3,
        a.span_us / 1e3,
        a.compute_us / 1e3,
        a.comm_us / 1e3,
        a.overlap_us / 1e3,
        a.exposed_comm_us / 1e3,
        a.memcpy_us / 1e3,
        a.memset_us / 1e3
    )?;
    for k in a.top.iter().take(8) {
        writeln!(
            out,
            "  {:>9.3} ms {:>6}x  {:?}  {}",
            k.total_us / 1e3,
            k.calls,
            k.work,
            k.kernel
        )?;
    }
    Ok(())
}
