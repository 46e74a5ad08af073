//! `select`, `compose` and `export`: argument plumbing around et-graph's selection/composition.

use anyhow::{Context, Result};
use clap::Args;
use et_graph::{Graph, Kind, Selection};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Filters shared by select, remove and export.
#[derive(Args, Clone, Debug, Default)]
pub struct Filters {
    /// Only these ProfilerStep#N iterations (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub iteration: Option<Vec<u64>>,
    /// Op name regex.
    #[arg(long)]
    pub name: Option<String>,
    /// Regex on an enclosing annotation (`Optimizer.step`, `## backward ##`, a module name).
    #[arg(long)]
    pub scope: Option<String>,
    /// Node id range `A..B` (inclusive).
    #[arg(long)]
    pub ids: Option<String>,
    /// all | compute | comm.
    #[arg(long, default_value = "all")]
    pub only: Kind,
    /// Also select the producers of inputs the selection needs (dependency closure).
    #[arg(long)]
    pub with_producers: bool,
}

impl Filters {
    pub fn selection(&self) -> Result<Selection> {
        let re = |s: &Option<String>| -> Result<Option<regex::Regex>> {
            s.as_deref()
                .map(|r| regex::Regex::new(r).with_context(|| format!("bad regex {r:?}")))
                .transpose()
        };
        let ids = match &self.ids {
            None => None,
            Some(s) => {
                let (a, b) = s
                    .split_once("..")
                    .with_context(|| format!("--ids wants A..B, got {s:?}"))?;
                let b = b.trim_start_matches('=');
                let (a, b) = (
                    a.parse::<u64>().with_context(|| format!("--ids: {a:?}"))?,
                    b.parse::<u64>().with_context(|| format!("--ids: {b:?}"))?,
                );
                anyhow::ensure!(a <= b, "--ids {s}: the first id is after the last");
                Some(a..=b)
            }
        };
        Ok(Selection {
            iterations: self.iteration.clone(),
            name: re(&self.name)?,
            scope: re(&self.scope)?,
            ids,
            kind: self.only,
            with_producers: self.with_producers,
        })
    }
}

/// Writes a trace to a file (`.gz` compresses; atomically) or stdout (`-`).
pub fn write_out(t: &et_schema::Trace, out: &Path) -> Result<()> {
    // Streamed: a composed trace's text can be many times the memory its model takes.
    crate::output::write_atomic_gz(out, |w| Ok(et_schema::write_trace(t, w)?))
}

/// Whether commands print a JSON summary instead of a message (`--json`).
static JSON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub fn set_json(on: bool) {
    JSON.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// `--json`'s summary of what was written to `out`: on stdout, or on stderr where the output
/// itself goes to stdout (`-o -`).
pub(crate) fn json_summary(out: &Path, j: &serde_json::Value) -> Result<()> {
    if out.as_os_str() == "-" {
        eprintln!("{j}");
    } else {
        writeln!(std::io::stdout(), "{j}")?;
    }
    Ok(())
}

fn report(t: &et_schema::Trace, out: &Path, what: &str) -> Result<()> {
    if JSON.load(std::sync::atomic::Ordering::Relaxed) {
        let g = Graph::new(t);
        let j = serde_json::json!({"output": out.display().to_string(), "what": what, "nodes": t.nodes.len(), "ops": g.replay_set(None).ops.len(), "schema": t.meta.schema});
        json_summary(out, &j)?;
    } else if out.as_os_str() != "-" {
        eprintln!("{what}: wrote {} nodes to {}", t.nodes.len(), out.display());
    }
    Ok(())
}

pub fn select(trace: &Path, f: &Filters, out: &Path) -> Result<()> {
    crate::output::check(out, &[trace])?;
    let t = crate::read_trace(trace)?;
    let g = Graph::new(&t);
    let set = g.select(&f.selection()?)?;
    let new = et_graph::compose::extract(&g, &set);
    write_out(&new, out)?;
    report(&new, out, &format!("selected {} ops", set.ops.len()))?;
    Ok(())
}

pub fn remove(trace: &Path, f: &Filters, out: &Path) -> Result<()> {
    crate::output::check(out, &[trace])?;
    let sel = f.selection()?;
    anyhow::ensure!(
        sel.narrows(),
        "remove needs a filter (--name, --scope, --ids, --iteration, --only): without one it \
         would remove every op"
    );
    let t = crate::read_trace(trace)?;
    let g = Graph::new(&t);
    let set = g.select(&sel)?;
    let all = g.replay_set(None).ops.len();
    anyhow::ensure!(
        set.ops.len() < all,
        "the filters select all {all} ops of the replay set: removing them would leave a trace \
         with no op to replay"
    );
    let new = et_graph::compose::remove(&g, &set);
    write_out(&new, out)?;
    report(&new, out, &format!("removed {} ops", set.ops.len()))?;
    Ok(())
}

pub fn repeat(trace: &Path, n: usize, out: &Path) -> Result<()> {
    crate::output::check(out, &[trace])?;
    anyhow::ensure!(n >= 1, "repeat count must be at least 1");
    let t = crate::read_trace(trace)?;
    let new = et_graph::compose::repeat(&t, n)?;
    write_out(&new, out)?;
    report(&new, out, &format!("repeated x{n}"))?;
    Ok(())
}

pub fn concat(traces: &[PathBuf], out: &Path) -> Result<()> {
    anyhow::ensure!(traces.len() >= 2, "concat needs at least two traces");
    crate::stdin_once(traces)?;
    let inputs: Vec<&Path> = traces.iter().map(PathBuf::as_path).collect();
    crate::output::check(out, &inputs)?;
    let mut acc = crate::read_trace(&traces[0])?;
    for p in &traces[1..] {
        let b = crate::read_trace(p)?;
        acc = et_graph::compose::concat(&acc, &b)?;
    }
    write_out(&acc, out)?;
    report(&acc, out, &format!("concatenated {} traces", traces.len()))?;
    Ok(())
}

pub fn scale(trace: &Path, dim: i64, factor: i64, out: &Path) -> Result<()> {
    crate::output::check(out, &[trace])?;
    anyhow::ensure!(dim > 0 && factor > 0, "--dim and --factor must be positive");
    anyhow::ensure!(factor != 1, "--factor 1 changes nothing");
    let t = crate::read_trace(trace)?;
    let new = et_graph::compose::scale_dim(&t, dim, factor)?;
    changed(&t, &new, || {
        format!("no tensor dimension or shape argument holds {dim}: nothing to scale")
    })?;
    warn_mismatched_reshapes(&t, &new, dim);
    write_out(&new, out)?;
    report(&new, out, &format!("scaled dimension {dim} x{factor}"))?;
    Ok(())
}

/// Warns where scaling `dim` left view-like ops of `new` whose output no longer holds their
/// input's elements (`old` had fewer such): a dimension of that size was flattened into
/// another, which scaling does not follow, and a replay fails those ops.
pub fn warn_mismatched_reshapes(old: &et_schema::Trace, new: &et_schema::Trace, dim: i64) {
    let before: std::collections::HashSet<u64> = et_graph::compose::reshapes_that_mismatch(old)
        .into_iter()
        .collect();
    let after: Vec<u64> = et_graph::compose::reshapes_that_mismatch(new)
        .into_iter()
        .filter(|id| !before.contains(id))
        .collect();
    if !after.is_empty() {
        let ids: Vec<String> = after.iter().take(5).map(|i| i.to_string()).collect();
        eprintln!(
            "warning: {} view/reshape ops no longer hold their input's elements (nodes {}{}): a \
             dimension of {dim} was flattened into another there, which scaling does not follow, \
             and a replay fails them; scale a size that is not flattened, or select the ops \
             before the flattening",
            after.len(),
            ids.join(", "),
            if after.len() > 5 { ", ..." } else { "" }
        );
    }
}

pub fn dtype(trace: &Path, from: &str, to: &str, out: &Path) -> Result<()> {
    crate::output::check(out, &[trace])?;
    let parse = |s: &str| {
        et_schema::DType::from_et_name(s)
            .with_context(|| format!("unknown dtype {s:?} (float32, bfloat16, float16, ...)"))
    };
    let (from, to) = (parse(from)?, parse(to)?);
    anyhow::ensure!(
        from != to,
        "--from and --to are both {from}: nothing to change"
    );
    let t = crate::read_trace(trace)?;
    let g = Graph::new(&t);
    let new = et_graph::compose::change_dtype(&g, from, to);
    changed(&t, &new, || {
        format!("no tensor or dtype argument is {from}: nothing to change")
    })?;
    write_out(&new, out)?;
    report(&new, out, &format!("{from} -> {to}"))?;
    Ok(())
}

/// An edit that left the trace as it was is an error (`why` says what it did not find), not a
/// copy written under a new name.
pub fn changed(
    old: &et_schema::Trace,
    new: &et_schema::Trace,
    why: impl FnOnce() -> String,
) -> Result<()> {
    if same(old, new) {
        anyhow::bail!(why());
    }
    Ok(())
}

/// Whether an edit left a trace's arguments, values and tensors as they were.
pub fn same(old: &et_schema::Trace, new: &et_schema::Trace) -> bool {
    old.args == new.args && old.items == new.items && old.tensors == new.tensors
}

pub fn export_dot(trace: &Path, f: &Filters, out: &Path) -> Result<()> {
    crate::output::check(out, &[trace])?;
    let t = crate::read_trace(trace)?;
    let g = Graph::new(&t);
    let set = g.select(&f.selection()?)?;
    let tensors = g.tensors(&set);
    let dot = et_graph::compose::to_dot(&g, &set, &tensors);
    crate::output::write_atomic_gz(out, |w| Ok(w.write_all(dot.as_bytes())?))?;
    let summary = serde_json::json!({"output": out.display().to_string(), "what": "dot", "ops": set.ops.len(), "edges": tensors.edges.len()});
    if JSON.load(std::sync::atomic::Ordering::Relaxed) {
        json_summary(out, &summary)?;
    } else if out.as_os_str() != "-" {
        eprintln!(
            "exported {} ops, {} edges to {}",
            set.ops.len(),
            tensors.edges.len(),
            out.display()
        );
    }
    Ok(())
}
