//! `cargo xtask fidelity --memory [--models a,b]`: each zoo model's peak memory, replay over
//! original, on one basis: the bytes an iteration allocated through c10's CPU allocator and held
//! at once, at most (the original's from its quiet capture's `profile_memory` step, the
//! replay's counted by its allocator, `iteration_memory`). Memory is not timing: one replay
//! per model, no rounds. Tables per set, as the timing harness reports them; the whole zoo's
//! figures are saved for `cargo xtask results`.

use anyhow::{Context, Result};
use serde_json::{json, Value};
use std::process::Command;

use super::zoo::{quiet_meta, Model, HELD_OUT};
use super::Harness;

/// One model's figures.
struct Row {
    name: String,
    set: String,
    original: f64,
    replay: f64,
}

impl Row {
    fn ratio(&self) -> f64 {
        self.replay / self.original
    }
}

pub(super) fn run(h: &Harness, models: &[Model]) -> Result<()> {
    let quiet = h.dir.join("quiet");
    let mut rows = Vec::new();
    let mut failed = Vec::new();
    for m in models {
        let meta = quiet_meta(&h.dir, &m.name);
        let original = meta["peak_over_start_bytes"].as_f64().unwrap_or(f64::NAN);
        let et = quiet.join(format!("{}.et.json", m.name));
        let out = Command::new(h.bin)
            .args(["replay"])
            .arg(&et)
            .args(["--json", "--threads", "1", "--iters", "2", "--warmup", "2"])
            .output()
            .with_context(|| format!("running {}", h.bin.display()))?;
        let j: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let replay = j["iteration_memory"]["peak_over_start_bytes"]
            .as_f64()
            .unwrap_or(f64::NAN);
        if !(original > 0.0 && replay.is_finite()) {
            let why = String::from_utf8_lossy(&out.stderr);
            failed.push(format!(
                "{}: original {original}, replay {replay} ({})",
                m.name,
                why.lines().last().unwrap_or("")
            ));
            continue;
        }
        eprintln!(
            "[memory] {:<26} {:>10.0} {:>10.0} {:>7.3}",
            m.name,
            original,
            replay,
            replay / original
        );
        rows.push(Row {
            name: m.name.clone(),
            set: m.set.clone(),
            original,
            replay,
        });
    }
    let mut sets = Vec::new();
    let mut out = String::new();
    let held_out: Vec<&Row> = rows.iter().filter(|r| r.set != "tune").collect();
    for (set, title) in std::iter::once(("tune", "TUNING"))
        .chain(HELD_OUT.iter().map(|s| (s.set, s.title)))
        .chain(std::iter::once(("held-out", "ALL HELD-OUT")))
    {
        let part: Vec<&Row> = if set == "held-out" {
            held_out.clone()
        } else {
            rows.iter().filter(|r| r.set == set).collect()
        };
        if part.is_empty() {
            continue;
        }
        let s = summary(&part);
        out.push_str(&format!(
            "{title:<18} {:>3} models: {:>3} within [0.90, 1.10], {:>3} within [0.80, 1.25], \
             median {:.3} ({:.3}-{:.3})\n",
            part.len(),
            s["within_10"],
            s["within_band"],
            s["median"].as_f64().unwrap_or(f64::NAN),
            s["min"].as_f64().unwrap_or(f64::NAN),
            s["max"].as_f64().unwrap_or(f64::NAN),
        ));
        let mut entry = s;
        entry["set"] = json!(set);
        sets.push(entry);
    }
    println!(
        "peak memory, replay / original (the CPU allocator's bytes over the iteration's start)"
    );
    print!("{out}");
    let outside: Vec<Value> = rows
        .iter()
        .filter(|r| !(0.9..=1.1).contains(&r.ratio()))
        .map(|r| json!({"model": r.name, "set": r.set, "ratio": r.ratio()}))
        .collect();
    for o in &outside {
        println!(
            "  outside [0.90, 1.10]: {} ({}) {:.3}",
            o["model"].as_str().unwrap_or(""),
            o["set"].as_str().unwrap_or(""),
            o["ratio"].as_f64().unwrap_or(f64::NAN)
        );
    }
    for f in &failed {
        println!("  not measured: {f}");
    }
    if h.opts.only.is_none() {
        let figures = json!({
            "measurement": "fidelity-memory",
            "sets": sets,
            "outside": outside,
            "failed": failed,
            "models": rows.iter().map(|r| json!({"model": r.name, "set": r.set,
                "original_bytes": r.original, "replay_bytes": r.replay, "ratio": r.ratio()}))
                .collect::<Vec<_>>(),
        });
        let path =
            crate::results::save("fidelity-memory", "cargo xtask fidelity --memory", figures)?;
        eprintln!("[memory] saved {}", path.display());
    }
    Ok(())
}

/// Within the bands, and the median and range of the ratios.
fn summary(rows: &[&Row]) -> Value {
    let mut r: Vec<f64> = rows.iter().map(|x| x.ratio()).collect();
    r.sort_by(f64::total_cmp);
    json!({
        "models": r.len(),
        "within_10": r.iter().filter(|x| (0.9..=1.1).contains(*x)).count(),
        "within_band": r.iter().filter(|x| (0.8..=1.25).contains(*x)).count(),
        "median": crate::median(&r),
        "min": r.first(),
        "max": r.last(),
    })
}
