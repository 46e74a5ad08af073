//! `cargo xtask fidelity --memory [--models a,b]`: each zoo model's peak memory, replay over
//! original, on one basis: the bytes an iteration allocated through c10's CPU allocator and held
//! at once, at most (the original's from its quiet capture's `profile_memory` step, the
//! replay's counted by its allocator, `iteration_memory`). Two replays per model of an ET
//! captured with a `profile_memory` profile in a process of their own (`zoo.py memory`:
//! `memory/MODEL.memory.et.json` and `memory/MODEL.memory.json` in the zoo's directory, beside
//! `quiet/` and `busy/`, made where missing or older than the model's capture): one with
//! tensors freed at their last use, one given the profile through `--memory-profile`, whose
//! frees it follows. Memory is not timing: one replay of each per model, no rounds. Tables per
//! set, as the timing harness reports them; the whole zoo's figures are saved for
//! `cargo xtask results`.

use anyhow::{Context, Result};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

use super::zoo::{python_env, quiet_meta, zoo_script, Model, HELD_OUT};
use super::Harness;

/// One model's figures.
struct Row {
    name: String,
    set: String,
    original: f64,
    /// Freed at last use.
    last_use: f64,
    /// Freed where the memory profile freed.
    replay: f64,
}

impl Row {
    fn ratio(&self) -> f64 {
        self.replay / self.original
    }
}

/// Model `name`'s ET and memory profile, captured together (`zoo.py memory`).
fn memory_files(h: &Harness, name: &str) -> (PathBuf, PathBuf) {
    let d = h.dir.join("memory");
    (
        d.join(format!("{name}.memory.et.json")),
        d.join(format!("{name}.memory.json")),
    )
}

/// The models' ETs with memory profiles ([`memory_files`]), made where missing or older than
/// the model's quiet capture.
fn ensure_profiles(h: &Harness, models: &[Model]) -> Result<()> {
    let quiet = h.dir.join("quiet");
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let stale: Vec<&str> = models
        .iter()
        .filter(|m| {
            let (et, profile) = memory_files(h, &m.name);
            let (et, profile) = (modified(&et), modified(&profile));
            let capture = modified(&quiet.join(format!("{}.meta.json", m.name)));
            profile.is_none() || et.is_none() || profile < capture || et < capture
        })
        .map(|m| m.name.as_str())
        .collect();
    if stale.is_empty() {
        return Ok(());
    }
    eprintln!(
        "[memory] profiling {} model(s) under profile_memory ...",
        stale.len()
    );
    let mut c = Command::new(crate::python());
    c.arg(zoo_script(h.root))
        .arg("memory")
        .arg(h.dir.join("memory"))
        .args(&stale);
    python_env(&mut c, h.torch_py);
    let o = c.output()?;
    anyhow::ensure!(o.status.success(), "zoo.py memory failed ({})", o.status);
    Ok(())
}

/// One replay's peak over the iteration's start, and its report; with `profile`, following
/// that memory profile's frees.
fn replay_peak(h: &Harness, et: &Path, profile: Option<&Path>) -> Result<(f64, Value, String)> {
    let mut c = Command::new(h.bin);
    c.args(["replay"])
        .arg(et)
        .args(["--json", "--threads", "1", "--iters", "2", "--warmup", "2"]);
    if let Some(p) = profile {
        c.arg("--memory-profile").arg(p);
    }
    let out = c
        .output()
        .with_context(|| format!("running {}", h.bin.display()))?;
    let j: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let peak = j["iteration_memory"]["peak_over_start_bytes"]
        .as_f64()
        .unwrap_or(f64::NAN);
    let why = String::from_utf8_lossy(&out.stderr)
        .lines()
        .last()
        .unwrap_or("")
        .to_string();
    Ok((peak, j, why))
}

pub(super) fn run(h: &Harness, models: &[Model]) -> Result<()> {
    let mut rows = Vec::new();
    let mut failed = Vec::new();
    ensure_profiles(h, models)?;
    for m in models {
        let meta = quiet_meta(&h.dir, &m.name);
        let original = meta["peak_over_start_bytes"].as_f64().unwrap_or(f64::NAN);
        let (et, profile) = memory_files(h, &m.name);
        let (last_use, _, why_last) = replay_peak(h, &et, None)?;
        let (replay, j, why) = replay_peak(h, &et, Some(&profile))?;
        if !(original > 0.0 && replay.is_finite() && last_use.is_finite()) {
            failed.push(format!(
                "{}: original {original}, replay {replay} ({why}), at last use {last_use} \
                 ({why_last})",
                m.name
            ));
            continue;
        }
        let f = &j["frees_followed"];
        eprintln!(
            "[memory] {:<26} {:>10.0} {:>10.0} {:>7.3} at last use {:>7.3}  matched {}/{}",
            m.name,
            original,
            replay,
            replay / original,
            last_use / original,
            f["matched"],
            f["storages"],
        );
        rows.push(Row {
            name: m.name.clone(),
            set: m.set.clone(),
            original,
            last_use,
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
        let s = summary(&part, Row::ratio);
        let l = summary(&part, |r| r.last_use / r.original);
        out.push_str(&format!(
            "{title:<18} {:>3} models: {:>3} within [0.90, 1.10], {:>3} within [0.80, 1.25], \
             median {:.3} ({:.3}-{:.3}); freed at last use {:>3}, {:>3}\n",
            part.len(),
            s["within_10"],
            s["within_band"],
            s["median"].as_f64().unwrap_or(f64::NAN),
            s["min"].as_f64().unwrap_or(f64::NAN),
            s["max"].as_f64().unwrap_or(f64::NAN),
            l["within_10"],
            l["within_band"],
        ));
        let mut entry = s;
        entry["at_last_use"] = l;
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
                "original_bytes": r.original, "replay_bytes": r.replay, "ratio": r.ratio(),
                "at_last_use_bytes": r.last_use, "at_last_use_ratio": r.last_use / r.original}))
                .collect::<Vec<_>>(),
        });
        let path =
            crate::results::save("fidelity-memory", "cargo xtask fidelity --memory", figures)?;
        eprintln!("[memory] saved {}", path.display());
    }
    Ok(())
}

/// Within the bands, and the median and range of the ratios `ratio` reads.
fn summary(rows: &[&Row], ratio: impl Fn(&Row) -> f64) -> Value {
    let mut r: Vec<f64> = rows.iter().map(|x| ratio(x)).collect();
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
