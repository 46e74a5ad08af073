//! `mystique diff A B`: two results of one package (two machines, two libtorch versions)
//! compared per op signature and per iteration, largest regressions first.

use crate::package::{RunResult, RESULT_FORMAT};
use anyhow::{bail, Context, Result};
use metrics::median;
use std::io::Write;
use std::path::Path;

fn read(p: &Path) -> Result<RunResult> {
    let bytes = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
    // What the file is, where it is not a result of this format: said before any field is
    // missed.
    let v: serde_json::Value = serde_json::from_slice(&bytes)
        .with_context(|| format!("{} is not a result: not JSON", p.display()))?;
    match v.get("format").and_then(|f| f.as_str()) {
        Some(RESULT_FORMAT) => {}
        Some(f) if f.starts_with("mystique-result/") => bail!(
            "{} is a result of format {f:?}; this build reads {RESULT_FORMAT:?}",
            p.display()
        ),
        Some(f) if f.starts_with("mystique-package/") => bail!(
            "{} is a package's manifest: diff compares two results of `mystique run PACKAGE -o \
             RESULT`",
            p.display()
        ),
        _ => bail!(
            "{} is not a result of `mystique run` (no \"format\": \"{RESULT_FORMAT}\"): diff \
             compares two results of `mystique run PACKAGE -o RESULT`",
            p.display()
        ),
    }
    let r: RunResult =
        serde_json::from_value(v).with_context(|| format!("{} is not a result", p.display()))?;
    // What a run writes: every rank with one measured iteration at least, each a time.
    if r.ranks.is_empty() {
        bail!("{} is not a result of a run: it holds no rank", p.display());
    }
    for x in &r.ranks {
        if x.iterations_ms.is_empty() || x.iterations_ms.iter().any(|t| !t.is_finite() || *t < 0.0)
        {
            bail!(
                "{} is not a result of a run: rank {}'s iterations_ms is {:?}, where a run \
                 records each measured iteration's time (one at least)",
                p.display(),
                x.rank,
                x.iterations_ms
            );
        }
    }
    Ok(r)
}

/// One op signature of one rank in both results.
struct Row {
    rank: usize,
    signature: String,
    op: String,
    count: usize,
    a_ms: f64,
    b_ms: f64,
}

pub fn run(a: &Path, b: &Path, svg: Option<&Path>, json: bool) -> Result<()> {
    if let Some(s) = svg {
        crate::output::check_plot(s, &[a, b])?;
    }
    let (ra, rb) = (read(a)?, read(b)?);
    if ra.package != rb.package {
        bail!(
            "{} and {} are results of different packages (manifests {} and {})",
            a.display(),
            b.display(),
            &ra.package[..12.min(ra.package.len())],
            &rb.package[..12.min(rb.package.len())]
        );
    }
    let mut rows = Vec::new();
    let (mut it_a, mut it_b) = (Vec::new(), Vec::new());
    for x in &ra.ranks {
        let Some(y) = rb.ranks.iter().find(|y| y.rank == x.rank) else {
            continue;
        };
        it_a.push(median(&x.iterations_ms));
        it_b.push(median(&y.iterations_ms));
        for s in &x.signatures {
            let other = y.signatures.iter().find(|t| t.signature == s.signature);
            rows.push(Row {
                rank: x.rank,
                signature: s.signature.clone(),
                op: s.op.clone(),
                count: s.count,
                a_ms: s.total_ms,
                b_ms: other.map_or(f64::NAN, |t| t.total_ms),
            });
        }
    }
    // Largest regressions (B slower than A, in time per iteration) first.
    let delta = |r: &Row| {
        let d = r.b_ms - r.a_ms;
        if d.is_finite() {
            d
        } else {
            f64::NEG_INFINITY
        }
    };
    rows.sort_by(|x, y| delta(y).total_cmp(&delta(x)));
    let (ia, ib) = (
        it_a.iter().copied().fold(0.0, f64::max),
        it_b.iter().copied().fold(0.0, f64::max),
    );
    if let Some(s) = svg {
        // The ops that changed most, either way, on the text's basis (time per iteration).
        let multi_rank = ra.ranks.len() > 1;
        let mut changed: Vec<&Row> = rows.iter().filter(|r| delta(r).is_finite()).collect();
        changed.sort_by(|x, y| delta(y).abs().total_cmp(&delta(x).abs()));
        changed.truncate(20);
        let mut pairs: Vec<metrics::plot::Pair> = changed
            .iter()
            .map(|r| metrics::plot::Pair {
                // Several ranks run the same ops: the rank tells their rows apart, as the
                // text's rank column does.
                label: if multi_rank {
                    format!("rank {}: {} x{}", r.rank, r.signature, r.count)
                } else {
                    format!("{} x{}", r.signature, r.count)
                },
                a: r.a_ms,
                b: r.b_ms,
            })
            .collect();
        let unit = metrics::plot::time_per_iteration(&mut pairs);
        let title = format!(
            "iteration {} (A) vs {} (B), B/A {:.3}: the {} ops that changed most",
            metrics::plot::human(ia, "ms"),
            metrics::plot::human(ib, "ms"),
            ib / ia,
            pairs.len()
        );
        crate::output::write_plot(s, |f| {
            metrics::plot::pairs(
                f,
                &title,
                unit,
                ("A", "B"),
                "B / A",
                metrics::plot::Shading::Direction,
                &pairs,
            )
        })?;
    }
    let (sa, sb) = (settings(&ra), settings(&rb));
    let mut out = std::io::stdout().lock();
    if json {
        let j = serde_json::json!({
            "package": ra.package,
            "a": {"path": a.display().to_string(), "machine": ra.machine, "settings": sa},
            "b": {"path": b.display().to_string(), "machine": rb.machine, "settings": sb},
            "iteration": {"a_ms": ia, "b_ms": ib, "ratio": ib / ia},
            "ops": rows.iter().map(|r| serde_json::json!({
                "rank": r.rank, "signature": r.signature, "op": r.op, "count": r.count,
                "a_ms": r.a_ms, "b_ms": r.b_ms, "delta_ms": r.b_ms - r.a_ms,
                "ratio": r.b_ms / r.a_ms,
            })).collect::<Vec<_>>(),
        });
        serde_json::to_writer(&mut out, &j)?;
        writeln!(out)?;
        return Ok(());
    }
    let m = |r: &RunResult| {
        format!(
            "{} ({} thread{}, {}), libtorch {}",
            r.machine.device,
            r.machine.threads,
            if r.machine.threads == 1 { "" } else { "s" },
            r.machine.cpu,
            r.machine.libtorch
        )
    };
    writeln!(out, "A          {}: {}; {sa}", a.display(), m(&ra))?;
    writeln!(out, "B          {}: {}; {sb}", b.display(), m(&rb))?;
    if sa != sb {
        writeln!(
            out,
            "note       A and B ran with different settings: the differences below include theirs"
        )?;
    }
    writeln!(
        out,
        "iteration  {ia:.3} ms -> {ib:.3} ms  (B/A {:.3}; slowest rank's median)",
        ib / ia
    )?;
    let table = |out: &mut std::io::StdoutLock, title: &str, part: &[&Row]| {
        if part.is_empty() {
            return Ok(());
        }
        writeln!(out, "{title}")?;
        writeln!(
            out,
            "  {:>9} {:>9} {:>7} {:>6} {:>4}  signature",
            "A ms", "B ms", "B/A", "calls", "rank"
        )?;
        for r in part {
            writeln!(
                out,
                "  {:>9.3} {:>9.3} {:>7.2} {:>6} {:>4}  {}",
                r.a_ms,
                r.b_ms,
                r.b_ms / r.a_ms,
                r.count,
                r.rank,
                r.signature
            )?;
        }
        Ok::<(), std::io::Error>(())
    };
    // Slower in B (largest first), then faster in B (largest first), then ops B did not run.
    let slower: Vec<&Row> = rows.iter().filter(|r| delta(r) > 0.0).take(15).collect();
    let mut faster: Vec<&Row> = rows.iter().filter(|r| delta(r) < 0.0).collect();
    faster.sort_by(|x, y| delta(x).total_cmp(&delta(y)));
    faster.truncate(10);
    let missing: Vec<&Row> = rows.iter().filter(|r| r.b_ms.is_nan()).take(10).collect();
    table(
        &mut out,
        "slower in B, per iteration (largest first)",
        &slower,
    )?;
    table(
        &mut out,
        "faster in B, per iteration (largest first)",
        &faster,
    )?;
    table(&mut out, "not run in B", &missing)?;
    if slower.is_empty() && faster.is_empty() {
        writeln!(out, "no op changed time")?;
    }
    Ok(())
}

/// How a result's run went, from its first rank's report: its iterations, and whether it spun
/// the original's gaps (anchored or not) or ran the ops back to back.
fn settings(r: &RunResult) -> String {
    let Some(rep) = r.ranks.first().map(|k| &k.report) else {
        return "no ranks".into();
    };
    let gaps = if rep["gap_model"].is_object() {
        if rep["gap_model"]["anchored"].is_object() {
            "gaps emulated, anchored"
        } else {
            "gaps emulated"
        }
    } else {
        "ops back to back"
    };
    format!(
        "{} warm-up + {} measured iterations, {gaps}",
        rep["warmup"], rep["iters"]
    )
}
