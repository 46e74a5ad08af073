//! What a run prints and writes: the header, each set's table and summaries, the JSON and the
//! SVG.

use anyhow::Result;

use super::host::ReplayHost;
use super::references::{REFERENCE_HALVES, REFERENCE_ROUNDS, REFERENCE_SPREAD};
use super::rounds::{PROCESSES, ROUND_PARTS, SPREAD_MODELS};
use super::zoo::{Capture, HELD_OUT};
use super::Harness;

/// One model's line of the table.
pub(super) struct Row {
    pub(super) model: String,
    pub(super) set: String,
    pub(super) orig_ms: f64,
    pub(super) plain: f64,
    pub(super) quiet: f64,
    pub(super) busy: f64,
    /// The anchored gap model's, on the quiet and on the busy capture (each its own reference).
    pub(super) anch_quiet: f64,
    pub(super) anch_busy: f64,
    pub(super) rounds: Vec<[f64; PROCESSES - 1]>,
    /// The same ratios in CPU time (each block's time on a CPU), medians over the rounds, and
    /// each round's: what the programs take, without the share of a busy host's core the
    /// scheduler gave each process.
    pub(super) cpu: [f64; PROCESSES - 1],
    pub(super) rounds_cpu: Vec<[f64; PROCESSES - 1]>,
    /// The original's time per iteration in each round (ms): the host's phase.
    pub(super) round_original_ms: Vec<f64>,
    /// The original's CPU time per iteration in each round's block (ms): with the wall-clock
    /// time, how much of the core it had, and with the ratios in CPU time, each replay's.
    pub(super) round_original_cpu_ms: Vec<f64>,
    /// The time the original waited for a CPU per iteration, each round.
    pub(super) round_original_wait_ms: Vec<f64>,
    /// The plain, quiet-capture and busy-capture (or A/B), and the two anchored replay
    /// processes' own figures.
    pub(super) processes: [serde_json::Value; PROCESSES - 1],
    pub(super) busy_speed: f64,
    pub(super) busy_capture_over_orig: f64,
    /// Minor page faults per iteration: the original's, the plain replay's.
    pub(super) faults: (f64, f64),
    pub(super) failed: u64,
    pub(super) nonfinite: String,
    pub(super) peak_ratio: f64,
    /// How far the original's speed against the plain replay's moved since each reference (the
    /// quiet capture's, the busy one's) was timed
    /// ([`drift`](super::references::drift)): what no gap model sees.
    pub(super) drift: [f64; 2],
}

/// The finite values of `v`, sorted (for [`quantile`]).
pub(super) fn sorted_finite(v: impl Iterator<Item = f64>) -> Vec<f64> {
    let mut v: Vec<f64> = v.filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    v
}

/// The value at `q` (0 to 1) of the sorted `v`, the nearest rank; NaN where `v` is empty.
pub(super) fn quantile(v: &[f64], q: f64) -> f64 {
    v.get(((v.len() as f64 - 1.0) * q).round() as usize)
        .copied()
        .unwrap_or(f64::NAN)
}

/// Says what the run does: its rounds and blocks, what the ratios compare, the heap settings,
/// the capture the replays take and, for an A/B, what the busy-capture columns hold instead.
pub(super) fn print_header(h: &Harness) {
    let (rounds, block_ms) = (h.opts.rounds, h.opts.block_ms);
    // Paired blocks: the original and the three replays run side by side as four processes
    // that take turns, a block of iterations each (about `block_ms` of the original's), and a
    // round's ratio sets blocks run within a few hundred ms of each other against each other.
    // A quiet VM's speed moves by up to 2x in spells of 100-200 ms and drifts over minutes
    // (the same model's original took 3.2 ms and 2.6 ms half an hour apart here); timings
    // taken one after the other, a second each, sat in different spells, which left one
    // round's ratio +-20% off. A block is a sum over its iterations (a busy host preempts
    // some of them and not others: a sum counts both), and the median over many rounds drops
    // the rounds whose blocks straddled a change of speed.
    println!(
        "fidelity over the zoo ({}): {rounds} rounds of paired blocks; 1 thread. The original and five replays\n\
         run side by side and take turns, a block of about {block_ms} ms of iterations each, the order rotating;\n\
         models in groups of {SPREAD_MODELS}, a round of each in turn (references: groups of {REFERENCE_SPREAD}, {REFERENCE_ROUNDS} rounds in {REFERENCE_HALVES} halves of their own processes).\n\
         ratio = replay block / original block in the same round, median over rounds; gaps from the quiet\n\
         and from the busy capture (the host made busy while capturing only), from the profile alone and\n\
         anchored on each capture's reference (the original and the plain replay timed side by side as the\n\
         capture found the host: quiet, or beside CPU burners). peak ratio: the bytes an\n\
         iteration allocated and held at once, at most, replay over original (the CPU allocator's,\n\
         counted as profile_memory counts them).\n\
         heap: {}",
        h.dir.display(),
        if h.opts.glibc_heap_defaults {
            "the original under glibc's defaults (it may trim and refault its heap every iteration); \
             the replay and the captures keep freed memory"
        } else {
            "the original, the captures and the replay all keep freed memory (GLIBC_TUNABLES for the \
             zoo's Python, mallopt in the replay)"
        }
    );
    println!("gaps from: {}", h.opts.capture.name());
    if let Some(a) = &h.opts.against {
        let (against_args, against_zoo) = (&h.opts.against_args, &h.opts.against_zoo);
        println!(
            "A/B: the busy-capture columns (+gaps busy, busy gaps/orig, busy speed) are {}{} with gaps from the\n\
             quiet capture ({}{}), in the same rounds as this build",
            a.display(),
            if against_args.is_empty() {
                String::new()
            } else {
                format!(" {}", against_args.join(" "))
            },
            h.opts.against_capture.name(),
            against_zoo
                .as_ref()
                .map_or(String::new(), |d| format!(", of the zoo in {}", d.display())),
        );
    }
}

/// The tuning set's table, each held-out set's, and each one's summaries, then the summaries
/// over all held-out sets; `rows`: each model's row and what it covers.
pub(super) fn print_tables(rows: &[(Row, String)]) {
    // The tuning set's table, each held-out set's, and a summary over all held-out sets: (name
    // in the summary, the zoo sets it covers, the table's title; none: summary only).
    let all_held_out: Vec<&str> = HELD_OUT.iter().map(|h| h.set).collect();
    let mut groups: Vec<(&str, &[&str], Option<&str>)> = vec![("tune", &["tune"], Some("tuning"))];
    groups.extend(
        HELD_OUT
            .iter()
            .map(|h| (h.set, std::slice::from_ref(&h.set), Some(h.title))),
    );
    groups.push(("all held-out", &all_held_out, None));
    for (set, sets, title) in groups {
        let in_set: Vec<&(Row, String)> = rows
            .iter()
            .filter(|(r, _)| sets.contains(&r.set.as_str()))
            .collect();
        if in_set.is_empty() {
            continue;
        }
        if let Some(title) = title {
            print_table(title, &in_set);
        }
        print_summaries(set, &in_set);
    }
}

/// One set's table: a line per model.
fn print_table(title: &str, in_set: &[&(Row, String)]) {
    // As wide as the longest name (autoencoder_nesterov ran into its figures at 18).
    let w = in_set
        .iter()
        .map(|(r, _)| r.model.len())
        .max()
        .unwrap_or(0)
        .max("model".len());
    println!(
        "\n{} set\n{:<w$} {:>8} {:>7} {:>7} {:>7} {:>8} {:>8} {:>9} {:>9} {:>6} {:>7} {:>11}  NaN/Inf",
        title,
        "model",
        "orig ms",
        "plain",
        "+gaps",
        "+gaps",
        "anchored",
        "anchored",
        "busy gaps",
        "busy",
        "failed",
        "peak",
        "page faults",
    );
    println!(
        "{:<w$} {:>8} {:>7} {:>7} {:>7} {:>8} {:>8} {:>9} {:>9} {:>6} {:>7} {:>11}",
        "",
        "",
        "ratio",
        "quiet",
        "busy",
        "quiet",
        "busy",
        "/orig",
        "speed",
        "ops",
        "ratio",
        "orig/replay"
    );
    for (r, _) in in_set {
        println!(
            "{:<w$} {:>8.3} {:>7.3} {:>7.3} {:>7.3} {:>8.3} {:>8.3} {:>9.2} {:>9.3} {:>6} {:>7.2} {:>11}  {}",
            r.model,
            r.orig_ms,
            r.plain,
            r.quiet,
            r.busy,
            r.anch_quiet,
            r.anch_busy,
            r.busy_capture_over_orig,
            r.busy_speed,
            r.failed,
            r.peak_ratio,
            format!("{:.0}/{:.0}", r.faults.0, r.faults.1),
            r.nonfinite
        );
    }
}

/// One set's summaries: how many models' ratios lie within bounds, by gap model and capture,
/// and the drift since the references.
fn print_summaries(set: &str, in_set: &[&(Row, String)]) {
    let within = |f: &dyn Fn(&Row) -> f64, lo: f64, hi: f64| {
        in_set
            .iter()
            .filter(|(r, _)| (lo..=hi).contains(&f(r)))
            .count()
    };
    let n = in_set.len();
    // (what, the ratio on the quiet capture, on the busy one): the profile's gap model and
    // the anchored one, in wall-clock time (the table's) and in CPU time.
    type Ratio = fn(&Row) -> f64;
    let lines: [(&str, Ratio, Ratio); 4] = [
        ("with gaps", |r| r.quiet, |r| r.busy),
        ("anchored", |r| r.anch_quiet, |r| r.anch_busy),
        ("with gaps, in CPU time", |r| r.cpu[1], |r| r.cpu[2]),
        ("anchored, in CPU time", |r| r.cpu[3], |r| r.cpu[4]),
    ];
    for (what, q, b) in lines {
        println!(
            "summary ({set}, {n} models): {what}, within [0.90, 1.10]: {} quiet, {} busy; within [0.80, 1.25]: {} quiet, {} busy",
            within(&q, 0.9, 1.1),
            within(&b, 0.9, 1.1),
            within(&q, 0.8, 1.25),
            within(&b, 0.8, 1.25),
        );
    }
    println!(
        "summary ({set}, {n} models): plain within [0.90, 1.10]: {} (in CPU time: {})",
        within(&|r| r.plain, 0.9, 1.1),
        within(&|r| r.cpu[0], 0.9, 1.1),
    );
    // What of the anchored ratio is the host's and what the gap model's: the original's
    // speed against the replay's since the references were timed, and the anchored ratio
    // (in CPU time, as the drift) over it.
    let spread = |f: &dyn Fn(&Row) -> f64| {
        let v = sorted_finite(in_set.iter().map(|(r, _)| f(r)));
        format!(
            "median {:.3}, p10-p90 {:.3}-{:.3}",
            quantile(&v, 0.5),
            quantile(&v, 0.1),
            quantile(&v, 0.9)
        )
    };
    let moved = |k: usize| {
        in_set
            .iter()
            .filter(|(r, _)| r.drift[k].is_finite() && !(1.0 / 1.1..=1.1).contains(&r.drift[k]))
            .count()
    };
    println!(
        "summary ({set}, {n} models): the original against the plain replay since the references \
         (T/O then over now, in CPU time): {} quiet, {} busy; {} and {} models moved by more than 10%",
        spread(&|r| r.drift[0]),
        spread(&|r| r.drift[1]),
        moved(0),
        moved(1),
    );
    println!(
        "summary ({set}, {n} models): anchored over that (the gap model's own error, in CPU time): {} quiet, {} busy; within [0.90, 1.10]: {} quiet, {} busy",
        spread(&|r| r.cpu[3] / r.drift[0]),
        spread(&|r| r.cpu[4] / r.drift[1]),
        within(&|r| r.cpu[3] / r.drift[0], 0.9, 1.1),
        within(&|r| r.cpu[4] / r.drift[1], 0.9, 1.1),
    );
}

/// Writes the rows as JSON and the ratios with gaps as an SVG plot (`--svg`, or beside the
/// JSON) under `target/fidelity/`, and says where.
pub(super) fn write_files(h: &Harness, rows: &[(Row, String)]) -> Result<()> {
    let json = rows_json(rows);
    let out = h.root.join("target/fidelity");
    std::fs::create_dir_all(&out)?;
    // A full run of this build has the plain name; an A/B or a few models' run one of its own,
    // so neither overwrites the full run's figures.
    let stem = format!(
        "{}{}{}",
        match h.opts.host {
            ReplayHost::Quiet => "zoo",
            ReplayHost::Busy => "zoo-busy-host",
            ReplayHost::Throttled => "zoo-throttled-host",
        },
        if h.opts.against.is_some() { "-ab" } else { "" },
        if h.opts.only.is_some() { "-subset" } else { "" }
    );
    std::fs::write(
        out.join(format!("{stem}.json")),
        serde_json::to_vec_pretty(&json)?,
    )?;
    let svg = h
        .opts
        .svg
        .clone()
        .unwrap_or_else(|| out.join(format!("{stem}.svg")));
    let plot = metrics::plot::ratios(
        metrics::plot::Format::of(&svg)?,
        "replay with gaps from the quiet capture / original iteration (1 = exact)",
        "replay / original",
        &plot_rows(rows),
    )?;
    std::fs::write(&svg, plot)?;
    println!(
        "\nwrote {} and {}",
        out.join(format!("{stem}.json")).display(),
        svg.display()
    );
    save_results(h, rows)
}

/// Saves the run's figures for `cargo xtask results` ([`crate::results::save`]): the command
/// that repeats it and each model's medians. An A/B run compares two builds, not the replay
/// with the original, and is not saved.
fn save_results(h: &Harness, rows: &[(Row, String)]) -> Result<()> {
    if h.opts.against.is_some() {
        return Ok(());
    }
    let (name, host) = match h.opts.host {
        ReplayHost::Quiet => ("fidelity", "quiet"),
        ReplayHost::Busy => ("fidelity-busy", "busy"),
        ReplayHost::Throttled => ("fidelity-throttled", "throttled"),
    };
    let figures = serde_json::json!({
        "measurement": name,
        "run": {
            "rounds": h.opts.rounds, "host": host, "subset": h.opts.only.is_some(),
            "block_ms": h.opts.block_ms, "round_parts": h.opts.round_parts,
            "capture": h.opts.capture.arg(),
            "glibc_heap_defaults": h.opts.glibc_heap_defaults,
        },
        "models": rows.iter().map(|(r, _)| serde_json::json!({
            "model": r.model, "set": r.set,
            "held_out": HELD_OUT.iter().any(|s| s.set == r.set),
            "original_ms": r.orig_ms, "plain": r.plain,
            "gaps_quiet": r.quiet, "gaps_busy": r.busy,
            "anchored_quiet": r.anch_quiet, "anchored_busy": r.anch_busy,
            "anchored_cpu_quiet": r.cpu[3], "anchored_cpu_busy": r.cpu[4],
            "drift_quiet": r.drift[0], "drift_busy": r.drift[1],
            "failed_ops": r.failed, "nonfinite": r.nonfinite,
        })).collect::<Vec<_>>(),
    });
    let file = format!(
        "{name}{}",
        if h.opts.only.is_some() { "-subset" } else { "" }
    );
    let path = crate::results::save(&file, &command_line(h), figures)?;
    eprintln!(
        "[fidelity] saved {} for `cargo xtask results`",
        path.display()
    );
    Ok(())
}

/// The `cargo xtask fidelity` command line that repeats the run (the options that change its
/// figures; `--block-ms` and `--round-parts` where they differ from their defaults).
fn command_line(h: &Harness) -> String {
    let o = &h.opts;
    let mut c = format!("cargo xtask fidelity {}", o.rounds);
    if let Some(models) = &o.only {
        c += &format!(" --models {}", models.join(","));
    }
    if o.block_ms != DEFAULT_BLOCK_MS {
        c += &format!(" --block-ms {}", o.block_ms);
    }
    if o.round_parts != ROUND_PARTS {
        c += &format!(" --round-parts {}", o.round_parts);
    }
    c += match o.host {
        ReplayHost::Quiet => "",
        ReplayHost::Busy => " --busy-host",
        ReplayHost::Throttled => " --throttled-host",
    };
    if o.glibc_heap_defaults {
        c += " --glibc-heap-defaults";
    }
    if o.capture != Capture::Timing {
        c += &format!(" --capture {}", o.capture.arg());
    }
    c
}

/// `--block-ms`'s default ([`super::args`]).
const DEFAULT_BLOCK_MS: f64 = 50.0;

/// Each model's row as JSON, with what it covers.
fn rows_json(rows: &[(Row, String)]) -> serde_json::Value {
    serde_json::json!(rows
        .iter()
        .map(|(r, covers)| serde_json::json!({
            "model": r.model, "set": r.set, "covers": covers, "original_ms": r.orig_ms,
            "ratio_plain": r.plain, "ratio_gaps_quiet": r.quiet, "ratio_gaps_busy": r.busy,
            "ratio_anchored_quiet": r.anch_quiet, "ratio_anchored_busy": r.anch_busy,
            "ratio_cpu": {"plain": r.cpu[0], "gaps_quiet": r.cpu[1], "gaps_busy": r.cpu[2],
                "anchored_quiet": r.cpu[3], "anchored_busy": r.cpu[4]},
            "rounds_cpu": r.rounds_cpu,
            "rounds": r.rounds, "round_original_ms": r.round_original_ms, "round_original_cpu_ms": r.round_original_cpu_ms, "round_original_wait_ms": r.round_original_wait_ms, "processes": r.processes, "busy_speed": r.busy_speed, "failed_ops": r.failed,
            "nonfinite": r.nonfinite, "peak_ratio": r.peak_ratio,
            "page_faults_per_iter": {"original": r.faults.0, "replay": r.faults.1},
            "drift": {"quiet": r.drift[0], "busy": r.drift[1]},
        }))
        .collect::<Vec<_>>())
}

/// The plot's bars: each model (its held-out set's label beside it) and its ratios with gaps
/// from the quiet and the busy capture.
fn plot_rows(rows: &[(Row, String)]) -> Vec<metrics::plot::Ratio> {
    rows.iter()
        .map(|(r, _)| metrics::plot::Ratio {
            label: format!(
                "{}{}",
                r.model,
                HELD_OUT
                    .iter()
                    .find(|h| h.set == r.set)
                    .map_or(String::new(), |h| format!(" ({})", h.label)),
            ),
            ratio: r.quiet,
            note: format!("busy capture's gaps {:.3}", r.busy),
        })
        .collect()
}
