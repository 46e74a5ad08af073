//! `mystique compose world TRACES --world N -o DIR`: a captured job's rank traces at another
//! world size (`et_graph::world`), written as ETs or as Chakra traces for a simulator.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use crate::rank_files;

/// The command's arguments (`ComposeOp::World`).
pub struct WorldArgs {
    pub traces: Vec<PathBuf>,
    pub world: usize,
    pub data_parallel: Option<String>,
    pub output: PathBuf,
    pub chakra: bool,
    pub astra_sim: bool,
    pub rank_order: bool,
}

pub fn run(a: &WorldArgs, json: bool) -> Result<()> {
    anyhow::ensure!(a.world > 0, "--world must be at least 1");
    // clap's `requires` takes a flag's default (false) as given: checked here.
    anyhow::ensure!(
        a.chakra || !a.astra_sim,
        "--astra-sim orders the Chakra traces' nodes: it goes with --chakra"
    );
    let read = match a.traces.as_slice() {
        [one] => rank_files::read(rank_files::list(&one.display().to_string())?)?,
        many => rank_files::read(many.to_vec())?,
    };
    // A job is scaled by its process groups and collectives: traces that record neither are
    // separate programs, not ranks of one (said before their ranks are ordered, which such
    // traces cannot be).
    anyhow::ensure!(
        read.iter().any(|t| t.distributed),
        "the traces record no collective and no process group: compose world scales a \
         distributed job's ranks"
    );
    let ranks = rank_files::order(read, a.rank_order)?.0;
    let files: Vec<PathBuf> = ranks.into_iter().map(|t| t.path).collect();
    let inputs: Vec<&std::path::Path> = files.iter().map(PathBuf::as_path).collect();
    mystique_cli::output::check_new_dir(&a.output)?;
    for p in &inputs {
        anyhow::ensure!(
            !mystique_cli::output::inside(p, &a.output),
            "{} is inside the output directory {}",
            p.display(),
            a.output.display()
        );
    }
    let t0 = Instant::now();
    let traces: Vec<et_schema::Trace> = files
        .iter()
        .map(|p| mystique_cli::read_trace(p))
        .collect::<Result<_>>()?;
    let job = et_graph::world::Job::new(&traces, a.data_parallel.as_deref())?;
    // Checked before anything is written.
    let groups = job.groups_scaled(a.world)?;
    let name = a
        .output
        .file_name()
        .with_context(|| format!("{} has no directory name", a.output.display()))?
        .to_string_lossy()
        .into_owned();
    let parent = match a.output.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let tmp_dir = mystique_cli::output::create_exclusive_dir(&parent, &name)?;
    let tmp = tmp_dir.path().to_path_buf();
    let n = a.world;
    let mut first = None;
    let mut last_progress = Instant::now();
    let mut bytes = 0u64;
    for rank in 0..n {
        let (t, scaled) = job.rank_trace(rank, n)?;
        let file = if a.chakra {
            let g = et_graph::Graph::new(&t);
            let set = g.replay_set(None);
            let x = mystique_cli::chakra::convert(&g, &set, a.astra_sim);
            let mut buf = Vec::new();
            x.write(&mut buf)?;
            let f = tmp.join(format!("world{n}.{rank}.et"));
            std::fs::write(&f, &buf)?;
            bytes += buf.len() as u64;
            f
        } else {
            let text = et_schema::write_trace_to_vec(&t);
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(&text)?;
            let gz = e.finish()?;
            let f = tmp.join(format!("world{n}.rank{rank}.et.json.gz"));
            std::fs::write(&f, &gz)?;
            bytes += gz.len() as u64;
            f
        };
        log::debug!("rank {rank}: {}", file.display());
        if first.is_none() {
            first = Some(scaled);
        }
        if !json && last_progress.elapsed().as_secs_f64() > 5.0 {
            eprintln!("[compose world] {} of {n} ranks written ...", rank + 1);
            last_progress = Instant::now();
        }
    }
    if a.output.exists() {
        std::fs::remove_dir(&a.output)?;
    }
    std::fs::rename(&tmp, &a.output).with_context(|| format!("creating {}", a.output.display()))?;
    tmp_dir.keep();
    let scaled = first.unwrap_or_default();
    let secs = t0.elapsed().as_secs_f64();
    let mut out = std::io::stdout().lock();
    if json {
        let j = serde_json::json!({
            "output": a.output.display().to_string(),
            "what": if a.chakra { "chakra" } else { "et" },
            "captured": traces.len(),
            "world": n,
            "rank0_from": scaled.from,
            "groups": groups,
            "ops_added_per_rank": scaled.ops_added,
            "collectives": scaled.by_kind,
            "bytes_written": bytes,
            "seconds": secs,
        });
        writeln!(out, "{j}")?;
    } else {
        writeln!(
            out,
            "world      {n} ranks from {} captured, {n} files in {} ({:.1} MB, {secs:.2} s)",
            traces.len(),
            a.output.display(),
            bytes as f64 / 1e6
        )?;
        writeln!(out, "process groups")?;
        writeln!(
            out,
            "  {:<24} {:>14} {:>14}",
            "description", "before", "after"
        )?;
        for g in &groups {
            let dp = if g.data_parallel {
                "  (data parallel)"
            } else {
                ""
            };
            writeln!(
                out,
                "  {:<24} {:>14} {:>14}{dp}",
                g.desc,
                format!("{} x {}", g.groups_before, g.size_before),
                format!("{} x {}", g.groups_after, g.size_after)
            )?;
        }
        writeln!(
            out,
            "collectives per rank (rank 0, made from captured rank {})",
            scaled.from
        )?;
        writeln!(
            out,
            "  {:>5} {:>12} {:>12}  {:<16} how",
            "calls", "bytes before", "bytes after", "kind"
        )?;
        for (kind, k) in &scaled.by_kind {
            writeln!(
                out,
                "  {:>5} {:>12} {:>12}  {kind:<16} {}",
                k.calls, k.bytes_before, k.bytes_after, k.how
            )?;
        }
        if scaled.ops_added > 0 {
            writeln!(
                out,
                "ops added  {} per rank: the per-rank output buffers an op made for an all-gather",
                scaled.ops_added
            )?;
        }
    }
    Ok(())
}
