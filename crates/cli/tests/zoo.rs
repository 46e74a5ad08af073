//! Every trace of the fidelity zoo (captured by `cargo xtask fidelity` into the user cache, or
//! `$MYSTIQUE_ZOO_DIR`) replays with no failed op and no NaN/Inf in any op's output: the clean
//! ETs the fidelity replays and the linked ones (the iteration their capture names).

#[allow(dead_code)]
mod common;
use common::{bin, json};
use std::path::PathBuf;

fn zoo_dirs() -> Vec<PathBuf> {
    let root = std::env::var_os("MYSTIQUE_ZOO_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/mystique/zoo")));
    let Some(root) = root else { return vec![] };
    // The newest capture of the zoo script (one directory per script version).
    let mut versions: Vec<PathBuf> = std::fs::read_dir(&root)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("quiet").is_dir())
        .collect();
    versions.sort_by_key(|p| p.metadata().and_then(|m| m.modified()).ok());
    versions
        .last()
        .map(|v| vec![v.join("quiet"), v.join("busy")])
        .unwrap_or_default()
}

#[test]
fn every_zoo_trace_replays_without_failures_or_nonfinite_values() {
    let dirs = zoo_dirs();
    if dirs.is_empty() {
        eprintln!("skipped: no zoo captured (cargo xtask fidelity captures it)");
        return;
    }
    let mut seen = 0;
    for d in dirs.iter().filter(|d| d.is_dir()) {
        for e in std::fs::read_dir(d).unwrap().flatten() {
            let p = e.path();
            let name = p.to_string_lossy().to_string();
            let iteration: Vec<String> = if let Some(stem) = name.strip_suffix(".linked.et.json") {
                // A capture of several profiled iterations: the one its meta names.
                std::fs::read(format!("{stem}.meta.json"))
                    .ok()
                    .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                    .and_then(|m| m["replay_iteration"].as_u64())
                    .map(|n| vec!["--iteration".into(), n.to_string()])
                    .unwrap_or_default()
            } else if name.ends_with(".et.json") {
                // A clean ET: one iteration.
                Vec::new()
            } else {
                continue;
            };
            let j = json(
                bin()
                    .arg("replay")
                    .arg(&p)
                    .args([
                        "--json",
                        "--threads",
                        "1",
                        "--warmup",
                        "1",
                        "--iters",
                        "2",
                        "--check-values",
                    ])
                    .args(&iteration),
            );
            assert_eq!(j["ops_failed"], 0, "{}: {}", p.display(), j["failures"]);
            assert!(
                j["first_nonfinite"].is_null(),
                "{}: {}",
                p.display(),
                j["first_nonfinite"]
            );
            assert_eq!(j["nonfinite_externals"], 0, "{}", p.display());
            seen += 1;
        }
    }
    // Each captured model (its meta) has a clean ET and a linked one: all of them replayed, so
    // a capture the loop failed to recognise fails here rather than going unchecked.
    let models = captured_models(&dirs);
    assert!(
        models > 0 && seen >= 2 * models,
        "{seen} zoo traces replayed for {models} captured models in {dirs:?}"
    );
}

/// The model's state stays finite over a long replay, as the original's does over its training
/// run: each clean ET of the quiet captures replayed 300 iterations (the fidelity's timings run
/// about a hundred), and no external input (parameter, optimizer state) ends NaN/Inf. Values the
/// trace does not record (statistics saved inside a norm, a divisor saved inside a loss) had
/// sent three models' weights to NaN after 75 to 257 iterations.
#[test]
fn every_zoo_model_stays_finite_over_a_long_replay() {
    let Some(quiet) = zoo_dirs().into_iter().find(|d| d.is_dir()) else {
        eprintln!("skipped: no zoo captured (cargo xtask fidelity captures it)");
        return;
    };
    let mut seen = 0;
    for e in std::fs::read_dir(&quiet).unwrap().flatten() {
        let p = e.path();
        let name = p.to_string_lossy().to_string();
        if !name.ends_with(".et.json") || name.ends_with(".linked.et.json") {
            continue;
        }
        let j = json(bin().arg("replay").arg(&p).args([
            "--json",
            "--threads",
            "1",
            "--warmup",
            "0",
            "--iters",
            "300",
        ]));
        assert_eq!(j["ops_failed"], 0, "{}: {}", p.display(), j["failures"]);
        let model = p
            .file_name()
            .and_then(|f| f.to_str())
            .and_then(|f| f.strip_suffix(".et.json"))
            .unwrap_or_default();
        match DIVERGES.iter().find(|(m, _)| *m == model) {
            Some((_, why)) => assert!(
                j["nonfinite_externals"].as_u64().unwrap_or(0) > 0,
                "{}: stays finite now ({why}): take it off DIVERGES",
                p.display()
            ),
            None => assert_eq!(
                j["nonfinite_externals"],
                0,
                "{}: state went NaN/Inf within 300 iterations",
                p.display()
            ),
        }
        seen += 1;
    }
    let models = captured_models(std::slice::from_ref(&quiet));
    assert!(
        models > 0 && seen >= models,
        "{seen} clean zoo ETs replayed for {models} captured models in {}",
        quiet.display()
    );
}

/// Zoo models whose state the replay cannot keep finite, with why. Each must still go NaN/Inf
/// in the long replay: once one stays finite, the test fails until it is taken off the list.
const DIVERGES: &[(&str, &str)] = &[(
    "mixture_density_sgd",
    "its loss multiplies by -0.5 given as a Python number: a wrapped 0-dim double whose value \
     neither the trace nor Kineto records, replayed as 1, the neutral factor; the Gaussian \
     log-likelihood's sign flips, and SGD drives the log-scales to Inf in 5-11 iterations",
)];

/// The models captured in `dirs`: one meta file each (`cargo xtask fidelity --models` captures
/// some of the zoo, a full run all of it).
fn captured_models(dirs: &[std::path::PathBuf]) -> usize {
    dirs.iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flat_map(|r| r.flatten())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".meta.json"))
        .count()
}
