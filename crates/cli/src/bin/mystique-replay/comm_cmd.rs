//! The collective modes of `replay` (`--blocking`, `--paced-by-trace`, `--world`,
//! `--check-collectives`, the filters), turned into [`replay::CommOptions`].

use anyhow::{bail, ensure, Context, Result};
use et_graph::{Graph, ReplaySet};
use mystique_cli::args::ReplayArgs;
use std::path::{Path, PathBuf};

/// Fault injection for `--check-collectives`: `RANK:NODE` makes that rank's input to the
/// collective at that ET node id wrong, so that the check must name it (tests use it).
pub const CORRUPT_ENV: &str = "MYSTIQUE_CORRUPT_COLLECTIVE";

/// The options that reshape the job's communication need `--only comm`: checked by each rank
/// and, before any rank starts, by `--ranks`' launcher.
pub fn check_reshaping(a: &ReplayArgs) -> Result<()> {
    let c = &a.comm;
    let comm_only = a.run.only == et_graph::Kind::Comm;
    for (flag, given) in [
        ("--world", c.world.is_some()),
        ("--allow-collectives", c.allow_collectives.is_some()),
        ("--max-collectives", c.max_collectives.is_some()),
        ("--rebalance", c.rebalance.is_some()),
    ] {
        ensure!(
            !given || comm_only,
            "{flag} reshapes the job's communication: it needs --only comm (the compute reads \
             the collectives' tensors at their captured sizes)"
        );
    }
    // Checked here, where the launcher checks the options once before any rank starts, as
    // the plan would check them in every rank.
    if let Some(kinds) = &c.allow_collectives {
        for k in kinds {
            ensure!(
                replay::plan::KINDS.contains(&k.as_str()),
                "--allow-collectives {k}: not a collective kind (kinds: {}; waits always run)",
                replay::plan::KINDS
                    .iter()
                    .filter(|&&x| x != "wait")
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    ensure!(
        c.max_collectives != Some(0),
        "--max-collectives 0 keeps no collective: --only comm would replay nothing"
    );
    Ok(())
}

/// The collective options of a one-rank replay of `set` (`path`: its trace; `in_dir`: the
/// number of rank traces where it was taken from a directory).
pub fn options(
    a: &ReplayArgs,
    g: &Graph,
    set: &ReplaySet,
    dist: Option<&replay::DistOptions>,
    in_dir: Option<usize>,
) -> Result<replay::CommOptions> {
    let c = &a.comm;
    check_reshaping(a)?;
    let world = match c.world {
        None => None,
        Some(n) => {
            let captured = c
                .captured_world
                .or(in_dir)
                .or_else(|| {
                    let groups = replay::plan::process_groups(g.trace);
                    groups
                        .first()
                        .map(|w| w.size)
                        .filter(|&s| s > 0)
                        .map(|s| s as usize)
                })
                .context(
                    "--world: the trace does not record its world size; replay the ranks' \
                     directory (--ranks DIR, or DIR under a launcher)",
                )?;
            if let Some(d) = dist {
                ensure!(
                    d.world_size == n,
                    "--world {n}, but this run has WORLD_SIZE={}",
                    d.world_size
                );
            }
            Some((n, captured))
        }
    };
    let (paced_us, paced_span_ms) = if c.paced_by_trace {
        let Some(k) = &a.kineto else {
            bail!(
                "--paced-by-trace takes the collectives' times from the Kineto trace captured \
                 with this ET: give it with --kineto"
            );
        };
        let (at, span) = issue_times(g, set, k)?;
        (Some(at), Some(span))
    } else {
        (None, None)
    };
    let corrupt_node = match (std::env::var(CORRUPT_ENV), dist) {
        (Ok(v), Some(d)) => {
            let (rank, node) = v
                .split_once(':')
                .and_then(|(r, n)| Some((r.parse::<usize>().ok()?, n.parse::<u64>().ok()?)))
                .with_context(|| format!("{CORRUPT_ENV}={v:?}: expected RANK:NODE"))?;
            (rank == d.rank).then_some(node)
        }
        _ => None,
    };
    if c.blocking && dist.is_none() {
        eprintln!(
            "note: --blocking puts barriers around each collective among the job's ranks; a \
             trace replayed alone has no other rank to wait for (use --ranks DIR, or run the \
             ranks under a launcher)"
        );
    }
    Ok(replay::CommOptions {
        blocking: c.blocking,
        paced_us,
        paced_span_ms,
        check: c.check_collectives,
        rebalance_equal: c.rebalance == Some(mystique_cli::args::Rebalance::Equal),
        corrupt_node,
        select: replay::plan::CommSelection {
            kinds: c
                .allow_collectives
                .as_ref()
                .map(|k| k.iter().map(|x| x.trim().to_ascii_lowercase()).collect()),
            max: c.max_collectives,
            world,
        },
    })
}

/// When the trace issued each op of `set` (µs from the iteration's first op), read from the
/// Kineto trace `path` captured with it, and the iteration's span (ms).
fn issue_times(g: &Graph, set: &ReplaySet, path: &Path) -> Result<(Vec<Option<f64>>, f64)> {
    let k = mystique_cli::read_kineto(path)?;
    let link = et_graph::timing_link(g, set, &k)
        .with_context(|| format!("--paced-by-trace: linking {}", path.display()))?;
    let starts: Vec<Option<(f64, f64)>> = link
        .event_of
        .iter()
        .map(|e| e.map(|e| (k.events[e as usize].ts, k.events[e as usize].dur)))
        .collect();
    let first = starts
        .iter()
        .flatten()
        .map(|s| s.0)
        .fold(f64::INFINITY, f64::min);
    let last = starts
        .iter()
        .flatten()
        .map(|s| s.0 + s.1)
        .fold(f64::NEG_INFINITY, f64::max);
    ensure!(
        first.is_finite(),
        "--paced-by-trace: no op of the trace links to an event of {}",
        path.display()
    );
    let (start, end) = link.span.unwrap_or((first, last));
    let at = starts
        .iter()
        .map(|s| s.map(|(ts, _)| (ts - start).max(0.0)))
        .collect();
    Ok((at, (end - start).max(0.0) / 1000.0))
}

/// The Kineto trace captured beside a rank's ET: the same name with `kineto` for `et`
/// (`rank3.et.json.gz` -> `rank3.kineto.json.gz`, `job.rank3.linked.et.json` ->
/// `job.rank3.kineto.json`), plain or gzipped.
pub fn kineto_beside(trace: &Path) -> Option<PathBuf> {
    let name = trace.file_name()?.to_str()?;
    let stem = name
        .strip_suffix(".gz")
        .unwrap_or(name)
        .strip_suffix(".json")?;
    let stem = stem
        .strip_suffix(".linked.et")
        .or_else(|| stem.strip_suffix(".et"))?;
    ["json.gz", "json"]
        .iter()
        .map(|ext| trace.with_file_name(format!("{stem}.kineto.{ext}")))
        .find(|p| p.is_file())
}
