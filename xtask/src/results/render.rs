//! The generated part of docs/results.md: a section per measurement with a saved output, each
//! under its stamp, then the measurements with none and the command that makes each. Every
//! figure comes from the saved JSON; the counts and medians are taken here, from each model's
//! ratios, with the fidelity report's bounds.

use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write;

use super::{stamp, Measurement, MEASUREMENTS};

/// The bounds the fidelity report counts models within: [0.90, 1.10] and [0.80, 1.25].
const TIGHT: (f64, f64) = (0.9, 1.1);
const LOOSE: (f64, f64) = (0.8, 1.25);

/// The generated part from the latest saved output of each measurement (by name).
pub(super) fn generated(saved: &BTreeMap<String, Value>) -> String {
    let mut out = String::new();
    for m in &MEASUREMENTS {
        let Some(v) = saved.get(m.name) else { continue };
        let body = match m.name {
            "parse" => parse(v),
            "dispatch" => dispatch(v),
            "fidelity-memory" => memory(v),
            _ => fidelity(v),
        };
        let _ = write!(
            out,
            "## {}\n\n{}\n\n{}\n\n",
            m.title,
            stamp::line(&v["stamp"]),
            body.trim_end()
        );
    }
    let missing: Vec<&Measurement> = MEASUREMENTS
        .iter()
        .filter(|m| !saved.contains_key(m.name))
        .collect();
    if !missing.is_empty() {
        out.push_str(&not_measured(&missing));
    }
    out
}

/// `cargo xtask fidelity --memory`: per set, the models within the bands, and those outside.
fn memory(v: &Value) -> String {
    let mut out = String::from(
        "Peak memory per iteration, replay over original: the bytes allocated through c10's \
         CPU allocator during an iteration and held at once, at most (the original's from a \
         `profile_memory` step of its quiet capture, the replay's counted by its allocator over \
         its first measured iteration). The replay frees each tensor where a `profile_memory` \
         profile of the model, taken with its ET in a process of their own, shows the original \
         freed it (`--memory-profile`); the last two columns free each at its last use \
         instead.\n\n\
         | set | models | within [0.90, 1.10] | within [0.80, 1.25] | median (range) | at last use: within [0.90, 1.10] | within [0.80, 1.25] |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for s in v["sets"].as_array().into_iter().flatten() {
        let f = |k: &str| s[k].as_f64().unwrap_or(f64::NAN);
        let last = |k: &str| {
            s["at_last_use"][k]
                .as_u64()
                .map_or("-".to_string(), |n| n.to_string())
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {:.3} ({:.3}-{:.3}) | {} | {} |",
            s["set"].as_str().unwrap_or(""),
            s["models"],
            s["within_10"],
            s["within_band"],
            f("median"),
            f("min"),
            f("max"),
            last("within_10"),
            last("within_band")
        );
    }
    let outside: Vec<String> = v["outside"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| {
            format!(
                "{} ({}) {:.3}",
                o["model"].as_str().unwrap_or(""),
                o["set"].as_str().unwrap_or(""),
                o["ratio"].as_f64().unwrap_or(f64::NAN)
            )
        })
        .collect();
    if !outside.is_empty() {
        let _ = write!(out, "\nOutside [0.90, 1.10]: {}.\n", outside.join(", "));
    }
    let failed: Vec<&str> = v["failed"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f.as_str())
        .collect();
    if !failed.is_empty() {
        let _ = write!(out, "\nNot measured: {}.\n", failed.join("; "));
    }
    out
}

/// The list of measurements without a saved output.
fn not_measured(missing: &[&Measurement]) -> String {
    let mut out = String::from(
        "## Not measured in this checkout yet\n\n\
         These have no saved output under `target/mystique-results/`. Run the command (or \
         `cargo xtask results --run NAME`), then `cargo xtask results`; until then the earlier \
         measurement below stands.\n\n",
    );
    for m in missing {
        let _ = writeln!(out, "- {} (`{}`): `{}`", m.title, m.name, m.command);
    }
    out
}

/// "1 model", "3 models".
fn count_models(n: usize) -> String {
    format!("{n} {}", if n == 1 { "model" } else { "models" })
}

/// The notes under a table, a bullet each.
fn bullets(notes: &[String]) -> String {
    notes.iter().map(|n| format!("- {n}\n")).collect()
}

/// A figure of `v` (NaN where it is missing or null).
fn num(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(f64::NAN)
}

/// `x` to `d` decimals, or "-" where it was not measured.
fn fixed(x: f64, d: usize) -> String {
    if x.is_finite() {
        format!("{x:.d$}")
    } else {
        "-".into()
    }
}

/// How many of `models` have `key` within `(lo, hi)`, the bounds included.
fn within(models: &[&Value], key: &dyn Fn(&Value) -> f64, (lo, hi): (f64, f64)) -> usize {
    models
        .iter()
        .filter(|m| (lo..=hi).contains(&key(m)))
        .count()
}

/// "median (min-max)" of the finite values.
fn median_range(v: &[f64]) -> String {
    let finite: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    let (lo, hi) = finite
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        });
    if finite.is_empty() {
        return "-".into();
    }
    format!(
        "{} ({}-{})",
        fixed(crate::median(&finite), 3),
        fixed(lo, 3),
        fixed(hi, 3)
    )
}

/// The ratios of the held-out table: its line's label and the model's field.
const FIDELITY_LINES: [(&str, &str); 5] = [
    (
        "anchored on the quiet capture's reference",
        "anchored_quiet",
    ),
    ("anchored on the busy capture's reference", "anchored_busy"),
    ("gaps from the profile alone, quiet capture", "gaps_quiet"),
    ("gaps from the profile alone, busy capture", "gaps_busy"),
    ("plain replay (no gaps)", "plain"),
];

/// A fidelity run: what it ran, the held-out models' table, the tuning set, the value checks,
/// the models outside the tight bounds and the gap model's own error over the drift.
fn fidelity(v: &Value) -> String {
    let models: Vec<&Value> = v["models"].as_array().into_iter().flatten().collect();
    let held: Vec<&Value> = models
        .iter()
        .copied()
        .filter(|m| m["held_out"].as_bool() == Some(true))
        .collect();
    let tune: Vec<&Value> = models
        .iter()
        .copied()
        .filter(|m| m["set"].as_str() == Some("tune"))
        .collect();
    let mut out = fidelity_intro(&v["run"], models.len(), held.len(), tune.len());
    if !held.is_empty() {
        out.push_str(&held_out_table(&held));
    }
    let mut notes = Vec::new();
    if !tune.is_empty() {
        let n = tune.len();
        notes.push(format!(
            "Tuning set ({}), anchored within [0.90, 1.10]: {}/{n} on the quiet capture's reference, {}/{n} on the busy capture's.",
            count_models(n),
            within(&tune, &|m| num(m, "anchored_quiet"), TIGHT),
            within(&tune, &|m| num(m, "anchored_busy"), TIGHT),
        ));
    }
    notes.push(value_checks(&models));
    if !held.is_empty() {
        notes.push(outside(&held));
        notes.push(over_drift(&held));
    }
    out.push_str(&bullets(&notes));
    out
}

/// What a fidelity run measured, on which host, and what its ratios are.
fn fidelity_intro(run: &Value, n: usize, held: usize, tune: usize) -> String {
    let host = match run["host"].as_str() {
        Some("busy") => "beside a CPU burner on every core",
        Some("throttled") => "under a CPU quota of half a core (`--throttled-host`)",
        _ => "on a quiet host",
    };
    let capture = match run["capture"].as_str() {
        Some("linked") => "the linked pair's profile (`--capture linked`)",
        _ => "the profile taken without the execution trace observer",
    };
    format!(
        "{} ({held} held-out, {tune} tuning), one thread each, captured on this machine and \
         replayed {host}. Ratio = replay iteration / original iteration in paired blocks, the \
         median over {} rounds; gaps from {capture}. See [gap-model.md](gap-model.md) for the \
         method.\n\n",
        count_models(n),
        run["rounds"].as_u64().map_or("?".into(), |r| r.to_string()),
    )
}

/// The held-out models' table: how many lie within each bound and the ratios' median and
/// range, for each gap model and capture.
fn held_out_table(held: &[&Value]) -> String {
    let mut out = format!(
        "| {} held-out models | within [0.90, 1.10] | within [0.80, 1.25] | median (range) |\n\
         |---|---|---|---|\n",
        held.len()
    );
    for (label, key) in FIDELITY_LINES {
        let ratio = |m: &Value| num(m, key);
        let ratios: Vec<f64> = held.iter().map(|m| ratio(m)).collect();
        let _ = writeln!(
            out,
            "| {label} | {} | {} | {} |",
            within(held, &ratio, TIGHT),
            within(held, &ratio, LOOSE),
            median_range(&ratios)
        );
    }
    out.push('\n');
    out
}

/// The `--check-values` replays: models with failed ops, and with NaN/Inf in their inputs.
fn value_checks(models: &[&Value]) -> String {
    let failed: Vec<String> = models
        .iter()
        .filter(|m| m["failed_ops"].as_u64() != Some(0))
        .map(|m| {
            format!(
                "{} ({})",
                m["model"].as_str().unwrap_or("?"),
                m["failed_ops"]
                    .as_u64()
                    .map_or("not checked".into(), |n| n.to_string())
            )
        })
        .collect();
    let nonfinite: Vec<String> = models
        .iter()
        .filter(|m| m["nonfinite"].as_str() != Some("0"))
        .map(|m| {
            format!(
                "{} ({})",
                m["model"].as_str().unwrap_or("?"),
                m["nonfinite"].as_str().unwrap_or("not checked")
            )
        })
        .collect();
    match (failed.is_empty(), nonfinite.is_empty()) {
        (true, true) => {
            "Every model: 0 failed ops, no NaN/Inf in its inputs under `--check-values`.".into()
        }
        _ => format!(
            "Under `--check-values`: failed ops in {}; NaN/Inf inputs in {}.",
            if failed.is_empty() {
                "none".into()
            } else {
                failed.join(", ")
            },
            if nonfinite.is_empty() {
                "none".into()
            } else {
                nonfinite.join(", ")
            },
        ),
    }
}

/// The held-out models whose anchored ratio on either capture lies outside [0.90, 1.10].
fn outside(held: &[&Value]) -> String {
    let out: Vec<String> = held
        .iter()
        .filter(|m| {
            ["anchored_quiet", "anchored_busy"]
                .iter()
                .any(|k| !(TIGHT.0..=TIGHT.1).contains(&num(m, k)))
        })
        .map(|m| {
            format!(
                "{} {} / {}",
                m["model"].as_str().unwrap_or("?"),
                fixed(num(m, "anchored_quiet"), 3),
                fixed(num(m, "anchored_busy"), 3)
            )
        })
        .collect();
    if out.is_empty() {
        "Every held-out model's anchored ratio lies within [0.90, 1.10] on either capture.".into()
    } else {
        format!(
            "Outside [0.90, 1.10] anchored (quiet / busy capture): {}.",
            out.join(", ")
        )
    }
}

/// The anchored ratio in CPU time over the drift since the references: the gap model's own
/// error, without what the host changed since.
fn over_drift(held: &[&Value]) -> String {
    let n = held.len();
    let own = |side: &'static str| {
        move |m: &Value| num(m, &format!("anchored_cpu_{side}")) / num(m, &format!("drift_{side}"))
    };
    format!(
        "Anchored ratio in CPU time over the drift since the references (the gap model's own error), within [0.90, 1.10]: {}/{n} quiet, {}/{n} busy.",
        within(held, &own("quiet"), TIGHT),
        within(held, &own("busy"), TIGHT),
    )
}

/// The parse benchmark: a table row per trace, then `json.load`, the graph's analysis and the
/// per-record parsers.
fn parse(v: &Value) -> String {
    let traces: Vec<&Value> = v["traces"].as_array().into_iter().flatten().collect();
    let mut out = format!(
        "Traces scaled from the shared ones (`../shared/tools/scale_trace.py`); medians of {} \
         rounds, the order alternating in each.\n\n\
         | trace | size | `mystique inspect` end to end | vs Python `json.load` | its peak RSS | parser alone |\n\
         |---|---|---|---|---|---|\n",
        v["rounds"].as_u64().map_or("?".into(), |r| r.to_string())
    );
    for t in &traces {
        out.push_str(&parse_row(t));
    }
    let per_trace = |f: &dyn Fn(&Value) -> String| {
        traces
            .iter()
            .map(|t| format!("{} {}", t["trace"].as_str().unwrap_or("?"), f(t)))
            .collect::<Vec<_>>()
            .join("; ")
    };
    let mut notes = vec![
        format!(
            "Python's `json.load`: {}.",
            per_trace(&|t| format!(
                "{} s, peak RSS {}x the file",
                fixed(num(t, "json_load_s"), 2),
                fixed(num(t, "json_load_peak_rss") / num(t, "bytes"), 1)
            ))
        ),
        format!(
            "Graph, replay set and tensor analysis after the parse: {}.",
            per_trace(&|t| format!(
                "{} s ({}x the parse)",
                fixed(num(t, "graph_s"), 3),
                fixed(num(t, "graph_s") / num(t, "parser_s"), 2)
            ))
        ),
    ];
    notes.extend(traces.iter().map(|t| record_parsers(t)));
    out.push('\n');
    out.push_str(&bullets(&notes));
    out
}

/// One trace's row of the parse table.
fn parse_row(t: &Value) -> String {
    let (bytes, json_load) = (num(t, "bytes"), num(t, "json_load_s"));
    let mb = bytes / 1e6;
    let inspect = num(t, "inspect_s");
    let (e2e, faster, rss) = if inspect.is_finite() {
        (
            format!("{} s = {} MB/s", fixed(inspect, 3), fixed(mb / inspect, 0)),
            format!("{}x faster", fixed(json_load / inspect, 1)),
            format!("{}x the file", fixed(num(t, "inspect_peak_rss") / bytes, 2)),
        )
    } else {
        let no = "not measured (no `target/release/mystique`)".to_string();
        (no, "-".into(), "-".into())
    };
    let parser = num(t, "parser_s");
    format!(
        "| {} | {} MB | {e2e} | {faster} | {rss} | {} s = {} MB/s, peak RSS {}x the file |\n",
        t["trace"].as_str().unwrap_or("?"),
        fixed(mb, 0),
        fixed(parser, 3),
        fixed(mb / parser, 0),
        fixed(num(t, "parser_peak_rss") / bytes, 2)
    )
}

/// One trace's record parsers on one thread.
fn record_parsers(t: &Value) -> String {
    let modes: Vec<String> = t["records_s"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(mode, s)| format!("{mode} {} s", fixed(s.as_f64().unwrap_or(f64::NAN), 3)))
        .collect();
    format!(
        "Per node record on one thread, the same records (scan not included), {}: {}.",
        t["trace"].as_str().unwrap_or("?"),
        if modes.is_empty() {
            "not measured".into()
        } else {
            modes.join(", ")
        }
    )
}

/// The dispatch benchmark: the replay's time and tch's for the same ops, and the difference
/// per op.
fn dispatch(v: &Value) -> String {
    let ops = v["ops"].as_f64().unwrap_or(f64::NAN);
    let (replay, direct) = (num(v, "replay_ns") / 1e3, num(v, "direct_ns") / 1e3);
    format!(
        "{} tiny `aten::add` calls replayed through the plan and the boxed dispatcher took {} µs, \
         the same calls made directly through tch {} µs: the replay adds **{} µs per op** \
         (criterion's estimate of each, `{}`).",
        fixed(ops, 0),
        fixed(replay, 1),
        fixed(direct, 1),
        fixed((replay - direct) / ops, 2),
        v["benchmark"].as_str().unwrap_or("?")
    )
}
