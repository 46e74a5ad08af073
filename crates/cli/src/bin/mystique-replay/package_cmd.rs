//! `mystique run`: a benchmark package replayed (formats and checks in `mystique_cli::package`;
//! `generate_cmd` makes packages). `diff` needs no libtorch and runs in `mystique` itself.

use anyhow::{bail, Context, Result};
use et_graph::Graph;
use mystique_cli::args::RunPackageArgs;
use mystique_cli::package::{
    self, Machine, Manifest, RankEntry, RankResult, RunResult, Signature, MANIFEST, RESULT_FORMAT,
};
use replay::plan::Plan;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

fn machine(device: &replay::Device) -> Machine {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.into());
    Machine {
        device: device.name(),
        threads: tch::get_num_threads() as i64,
        libtorch: "2.11.0".into(),
        cpu,
        cores: std::thread::available_parallelism().map_or(1, |c| c.get()),
    }
}

/// The most warm-up or measured iterations a manifest may ask for; more must be asked for on
/// the command line (`--warmup`, `--iters`), where whoever runs the package chose them.
const MANIFEST_ITERS_MAX: usize = 100_000;

/// The warm-up and measured iterations of a run: the command line's, else the manifest's
/// within [`MANIFEST_ITERS_MAX`].
fn iterations(m: &Manifest, a: &RunPackageArgs) -> Result<(usize, usize)> {
    let take = |given: Option<usize>, stored: usize, flag: &str| -> Result<usize> {
        match given {
            Some(n) => Ok(n),
            None if stored <= MANIFEST_ITERS_MAX => Ok(stored),
            None => bail!(
                "the manifest asks for {stored} {flag} iterations, more than the \
                 {MANIFEST_ITERS_MAX} a package may ask for: pass --{flag} N to run that many"
            ),
        }
    };
    Ok((
        take(a.warmup, m.warmup, "warmup")?,
        take(a.iters, m.iters, "iters")?,
    ))
}

/// Runs one rank's plan of a package (this process's rank under RANK/WORLD_SIZE).
fn run_rank(dir: &Path, m: &Manifest, a: &RunPackageArgs, rank: usize) -> Result<RankResult> {
    let entry = m
        .ranks
        .iter()
        .find(|r| r.rank == rank)
        .with_context(|| format!("the package has no rank {rank}"))?;
    let bytes = package::read_file(dir, m, &entry.plan)?;
    let plan: Plan = serde_json::from_slice(&bytes)
        .with_context(|| format!("the package's {} is not a replay plan", entry.plan))?;
    plan.validate()
        .map_err(|e| anyhow::anyhow!("the package's {}: {e}", entry.plan))?;
    // The plan is the one the manifest describes: as many steps as it says the rank has ops.
    anyhow::ensure!(
        plan.steps.len() == entry.ops && entry.ops > 0,
        "the package's {} has {} steps where the manifest says rank {rank} has {} ops: refused",
        entry.plan,
        plan.steps.len(),
        entry.ops
    );
    let (warmup, iters) = iterations(m, a)?;
    let device = replay::Device::parse(&a.device)?;
    tch::manual_seed(m.seed as i64);
    let gap_model = match (&m.gaps, a.no_gaps) {
        (Some(gaps), false) => Some(package_gaps(dir, m, entry, gaps, device, plan.steps.len())?),
        _ => None,
    };
    let bound = replay::bind(&plan, &device);
    let timeout = std::time::Duration::from_secs(a.timeout);
    let opts = replay::ReplayOptions {
        device,
        warmup,
        iters,
        per_step: true,
        progress: true,
        force: a.force,
        dist: replay::DistOptions::from_env(timeout).map_err(anyhow::Error::msg)?,
        gaps_us: gap_model.as_ref().map(|g| g.gaps_us.clone()),
        gaps_base_us: gap_model.as_ref().map(|g| g.base_step_us.clone()),
        memory_gate: crate::ranks::gate_from_env(),
        available_memory: crate::ranks::available_override()?,
        ..Default::default()
    };
    let (report, _) = replay::executor::run(&plan, &bound, &opts)?;
    let keys = plan.signatures();
    let mut sigs: BTreeMap<String, Signature> = BTreeMap::new();
    for (pos, st) in report.steps.iter().enumerate() {
        if !st.us.is_finite() {
            continue;
        }
        let key = keys[pos].clone();
        let e = sigs.entry(key.clone()).or_insert(Signature {
            signature: key,
            op: st.op.clone(),
            count: 0,
            total_ms: 0.0,
        });
        e.count += 1;
        e.total_ms += st.us / 1000.0;
    }
    let mut signatures: Vec<Signature> = sigs.into_values().collect();
    signatures.sort_by(|x, y| y.total_ms.total_cmp(&x.total_ms));
    let mut report_json = serde_json::to_value(&report)?;
    if let (Some(g), Some(o)) = (&gap_model, report_json.as_object_mut()) {
        o.insert("gap_model".into(), serde_json::to_value(g)?);
    }
    Ok(RankResult {
        rank,
        iterations_ms: report.iter_samples_ms.clone(),
        signatures,
        report: report_json,
    })
}

/// A package's gaps calibrated on this host, as `replay --emulate-gaps` calibrates them: its
/// own trace and profile, anchored on its reference when it carries one.
fn package_gaps(
    dir: &Path,
    m: &Manifest,
    entry: &RankEntry,
    gaps: &package::Gaps,
    device: replay::Device,
    steps: usize,
) -> Result<et_graph::GapModel> {
    let t = et_schema::parse_trace(
        &package::read_file(dir, m, &entry.trace)?,
        &entry.trace,
        &Default::default(),
    )?;
    let g = Graph::new(&t);
    let set = g.replay_set(None);
    let k =
        et_schema::kineto::parse_kineto(&package::read_file(dir, m, &gaps.profile)?, &gaps.profile)
            .with_context(|| format!("the package's {}", gaps.profile))?;
    for w in &k.warnings {
        eprintln!("warning: the package's {}: {w}", gaps.profile);
    }
    let linked = replay::calibrate::Linked::of(&g, &set, k, true)
        .with_context(|| format!("the package's {} does not link to its trace", gaps.profile))?;
    let reference = gaps.reference.map(et_graph::Reference::from);
    let model = replay::calibrate::calibrated_gaps(
        &g,
        &set,
        &linked,
        device,
        true,
        replay::calibrate::GapChoices {
            boundary_costs: replay::calibrate::BoundaryCosts::Probed,
            reference,
            time_base_with_gaps: false,
        },
    )?;
    anyhow::ensure!(
        model.gaps_us.len() == steps,
        "the package's gaps ({} boundaries) do not fit its plan ({steps} steps)",
        model.gaps_us.len()
    );
    Ok(model)
}

pub fn run(a: &RunPackageArgs, json: bool) -> Result<()> {
    let dir = &a.package;
    let (m, manifest_hash) = package::read_manifest(dir)?;
    anyhow::ensure!(!m.ranks.is_empty(), "the package has no ranks");
    if let Some(n) = a.threads {
        anyhow::ensure!(n > 0, "--threads must be positive");
        tch::set_num_threads(n);
    }
    // A rank of a multi-rank run started below: run it and print its result.
    if std::env::var("MYSTIQUE_PACKAGE_RANK").is_ok() {
        let rank: usize = std::env::var("RANK")?.parse()?;
        let r = run_rank(dir, &m, a, rank)?;
        writeln!(std::io::stdout(), "{}", serde_json::to_string(&r)?)?;
        return Ok(());
    }
    let out = a.output.clone().unwrap_or_else(|| {
        let name = dir
            .file_name()
            .map_or("package".into(), |n| n.to_string_lossy().into_owned());
        dir.with_file_name(format!("{name}.result.json"))
    });
    mystique_cli::output::check(&out, &[dir.join(MANIFEST).as_path()])?;
    // The default name is the same on every run: an earlier run's result there (the A side of
    // a `diff`, say) is replaced, and said so before the run.
    if a.output.is_none() && out.exists() {
        eprintln!(
            "note: this run's result replaces {} when it ends (-o FILE writes elsewhere)",
            out.display()
        );
    }
    if mystique_cli::output::inside(&out, dir) {
        bail!(
            "{} is inside the package {}: write the result elsewhere (a package is not \
             changed by running it)",
            out.display(),
            dir.display()
        );
    }
    for lib in &a.load_library {
        replay::load_library(lib)?;
    }
    if !m.ops_from.is_empty() && a.load_library.is_empty() {
        eprintln!(
            "note: the package's ops come also from {:?}: without their libraries (--load-library) those fail",
            m.ops_from
        );
    }
    let device = replay::Device::parse(&a.device)?;
    // The original's threads, where a single-rank package records them and nothing here chose.
    if m.ranks.len() == 1 {
        if let Some(n) = crate::replay_cmd::original_threads(a.threads, || m.threads) {
            eprintln!(
                "threads    {n}, as the original ran (the package's; --threads sets another)"
            );
        }
    }
    let ranks = if m.ranks.len() == 1 {
        vec![run_rank(dir, &m, a, 0)?]
    } else {
        let timeout = std::time::Duration::from_secs(a.timeout);
        // On the CPU the ranks share this machine's memory: checked together, as --ranks does.
        let gate = crate::ranks::MemoryGate::here(et_graph::Kind::All, a.force)?;
        let gate = (a.device == "cpu").then_some(&gate);
        let outs = crate::ranks::launch(m.ranks.len(), timeout, gate, |_| {
            let mut cmd = std::process::Command::new(std::env::current_exe()?);
            cmd.arg("run")
                .arg(dir)
                .args(["--device", &a.device, "--timeout", &a.timeout.to_string()])
                .env("MYSTIQUE_PACKAGE_RANK", "1");
            crate::ranks::one_thread_unless_told(&mut cmd, a.threads);
            for (flag, v) in [("--warmup", a.warmup), ("--iters", a.iters)] {
                if let Some(v) = v {
                    cmd.args([flag, &v.to_string()]);
                }
            }
            if let Some(t) = a.threads {
                cmd.args(["--threads", &t.to_string()]);
            }
            if a.force {
                cmd.arg("--force");
            }
            if a.no_gaps {
                cmd.arg("--no-gaps");
            }
            for l in &a.load_library {
                cmd.arg("--load-library").arg(l);
            }
            Ok((cmd, dir.display().to_string()))
        })?;
        outs.iter()
            .map(|o| serde_json::from_slice(o).context("a rank's result is not JSON"))
            .collect::<Result<Vec<RankResult>>>()?
    };
    let mut machine = machine(&device);
    // The ranks' own thread count, where they ran in processes of their own (all alike).
    let threads: Vec<i64> = ranks
        .iter()
        .filter_map(|r| r.report["threads"].as_i64())
        .collect();
    if m.ranks.len() > 1 && threads.len() == ranks.len() && threads.windows(2).all(|w| w[0] == w[1])
    {
        machine.threads = threads[0];
    }
    let result = RunResult {
        format: RESULT_FORMAT.into(),
        package: manifest_hash,
        machine,
        ranks,
    };
    let text = serde_json::to_vec_pretty(&result)?;
    mystique_cli::output::write_atomic(&out, |w| Ok(w.write_all(&text)?))?;
    let printed = (|| -> Result<()> {
        if json {
            writeln!(std::io::stdout(), "{}", serde_json::to_string(&result)?)?;
        } else {
            let mut o = std::io::stdout().lock();
            writeln!(
                o,
                "package    {} ({})",
                dir.display(),
                &result.package[..12]
            )?;
            writeln!(o, "result     {}", out.display())?;
            // The original's time is its whole iteration's, unedited: a package of a part of
            // it (its communication, some ops) or of a what-if edit of it is not compared
            // with it.
            let sel = &m.selection;
            let part = (sel.only != "all")
                .then(|| format!("replays a part (--only {})", sel.only))
                .or_else(|| {
                    [
                        ("--name", &sel.name),
                        ("--scope", &sel.scope),
                        ("--ids", &sel.ids),
                    ]
                    .into_iter()
                    .find_map(|(flag, v)| {
                        v.as_ref().map(|v| format!("replays a part ({flag} {v})"))
                    })
                })
                .or_else(|| {
                    (!m.what_if.is_empty())
                        .then(|| format!("replays it edited ({})", m.what_if.join(", ")))
                });
            for r in &result.ranks {
                // A rank's own original, else (one rank) the package's.
                let original = m
                    .ranks
                    .get(r.rank)
                    .and_then(|e| e.original.as_ref())
                    .or(m.original.as_ref().filter(|_| m.ranks.len() == 1))
                    .filter(|_| part.is_none())
                    .map_or(String::new(), |o| {
                        let ms = r.report["iter_ms"]["median"].as_f64().unwrap_or(f64::NAN);
                        format!("; original {:.3} ms ({:.2}x)", o.iter_ms, ms / o.iter_ms)
                    });
                writeln!(
                    o,
                    "rank {:<4}  {} of {} ops, {} failed; iteration median {:.3} ms{}{original}",
                    r.rank,
                    r.report["ops_replayed"],
                    r.report["ops_selected"],
                    r.report["ops_failed"],
                    r.report["iter_ms"]["median"].as_f64().unwrap_or(f64::NAN),
                    match r.report["gap_model"]["emulated_ms"].as_f64() {
                        Some(ms) => format!(
                            " ({ms:.3} ms of it the original's time between ops, emulated{})",
                            if r.report["gap_model"]["anchored"].is_object() {
                                ", anchored on the capture's reference"
                            } else {
                                ""
                            }
                        ),
                        None => String::new(),
                    }
                )?;
            }
            if let Some(o2) = &m.original {
                writeln!(
                    o,
                    "original   {:.3} ms per iteration (from {}){}",
                    o2.iter_ms,
                    o2.from,
                    part.as_ref().map_or(String::new(), |p| format!(
                        ": its whole iteration as captured, of which the package {p}, so no \
                         ratio"
                    ))
                )?;
            }
        }
        Ok(())
    })();
    mystique_cli::printed_then(
        printed,
        mystique_cli::OpsFailed::check_reports(result.ranks.iter().map(|r| &r.report)),
    )
}
