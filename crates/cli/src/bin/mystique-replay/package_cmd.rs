//! `mystique generate` and `mystique run`: benchmark packages (formats and checks in
//! `mystique_cli::package`). Generating compiles replay plans, so it runs here, beside libtorch;
//! `diff` needs no libtorch and runs in `mystique` itself.

use anyhow::{bail, Context, Result};
use et_graph::Graph;
use mystique_cli::args::{GenerateArgs, RunPackageArgs};
use mystique_cli::package::{
    self, Machine, Manifest, Original, RankEntry, RankResult, RunResult, SelectionRecord,
    Signature, MANIFEST, PACKAGE_FORMAT, RESULT_FORMAT,
};
use replay::plan::Plan;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Namespaces of operators libtorch itself registers.
const LIBTORCH_NAMESPACES: &[&str] = &[
    "aten",
    "prims",
    "c10d",
    "_c10d_functional",
    "profiler",
    "cuda",
    "quantized",
    "sparse",
    "mkldnn",
    "inductor",
    "record_param_comms",
];

/// The packaged profile of `generate --emulate-gaps`.
const PROFILE: &str = "rank0.timing.json.gz";

fn gzip(bytes: &[u8]) -> Result<Vec<u8>> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(bytes)?;
    Ok(e.finish()?)
}

fn random_key() -> Vec<u8> {
    let mut k = vec![0u8; 32];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut k);
    } else {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        k[..16].copy_from_slice(&t.to_le_bytes());
    }
    k
}

pub fn generate(a: &GenerateArgs, json: bool) -> Result<()> {
    let out = &a.output;
    let inputs: Vec<&Path> = a.traces.iter().map(PathBuf::as_path).collect();
    if out.exists() {
        let empty = out.is_dir() && out.read_dir()?.next().is_none();
        if !empty {
            bail!("{} exists and is not an empty directory", out.display());
        }
    }
    if let Some(m) = &a.map {
        mystique_cli::output::check(m, &inputs)?;
    }
    anyhow::ensure!(
        a.kineto.is_none() || a.traces.len() == 1,
        "--kineto takes the Kineto trace of a single-rank package"
    );
    let reference = a
        .reference
        .as_deref()
        .map(replay::calibrate::read_reference)
        .transpose()?;
    let sel = a.filters.selection()?;
    // What-if edits, checked before any work.
    let scale = a
        .scale
        .as_deref()
        .map(|s| -> Result<(i64, i64)> {
            let (d, f) = s
                .split_once(':')
                .context("--scale wants DIM:FACTOR, e.g. 64:2")?;
            let (d, f): (i64, i64) = (d.parse()?, f.parse()?);
            anyhow::ensure!(d > 0 && f > 0, "--scale: DIM and FACTOR must be positive");
            Ok((d, f))
        })
        .transpose()?;
    let dtype = a
        .dtype
        .as_deref()
        .map(|s| -> Result<(et_schema::DType, et_schema::DType)> {
            let (x, y) = s
                .split_once(':')
                .context("--dtype wants FROM:TO, e.g. float32:bfloat16")?;
            let p = |n: &str| {
                et_schema::DType::from_et_name(n).with_context(|| format!("unknown dtype {n:?}"))
            };
            Ok((p(x)?, p(y)?))
        })
        .transpose()?;
    let mut what_if = Vec::new();
    if let Some((d, f)) = scale {
        what_if.push(format!("scale dimension {d} x{f}"));
    }
    if let Some((x, y)) = dtype {
        what_if.push(format!("dtype {x} -> {y}"));
    }
    // Read every trace; order them by the rank each recorded (given order otherwise).
    let mut loaded = Vec::new();
    for p in &a.traces {
        let raw = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
        let t = mystique_cli::read_trace(p)?;
        loaded.push((p.clone(), package::sha256_hex(&raw), t));
    }
    if loaded.len() > 1 {
        let order = crate::ranks::order(
            loaded
                .iter()
                .map(|(p, _, t)| crate::ranks::RankTrace {
                    path: p.clone(),
                    recorded: et_graph::summary::recorded_rank(t),
                    world: replay::plan::process_groups(t)
                        .first()
                        .map(|g| g.size)
                        .filter(|&s| s > 0),
                })
                .collect(),
        )?;
        let pos: Vec<usize> = order
            .iter()
            .map(|r| {
                loaded
                    .iter()
                    .position(|(p, _, _)| *p == r.path)
                    .unwrap_or(0)
            })
            .collect();
        let mut taken: Vec<Option<_>> = loaded.into_iter().map(Some).collect();
        loaded = pos.into_iter().filter_map(|k| taken[k].take()).collect();
    }
    let name = out
        .file_name()
        .with_context(|| format!("{} has no directory name", out.display()))?
        .to_string_lossy()
        .into_owned();
    let tmp = out.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let built = (|| -> Result<(Manifest, mystique_cli::anonymize::Anonymized)> {
        let key = random_key();
        let mut anon = mystique_cli::anonymize::Anonymized::default();
        let mut files = BTreeMap::new();
        let mut ranks = Vec::new();
        let mut ops_from = BTreeSet::new();
        let mut devices = BTreeSet::new();
        let mut original = None;
        let mut gaps = None;
        let mut schema = String::new();
        for (rank, (path, sha, t)) in loaded.iter().enumerate() {
            let g = Graph::new(t);
            let set = g.select(&sel)?;
            // Rank 0's profile, read once: its timing here, its gaps' link below.
            let mut kineto = match (rank, &a.kineto) {
                (0, Some(k)) => Some((k, mystique_cli::read_kineto(k)?)),
                _ => None,
            };
            if let Some((_, kt)) = &kineto {
                let link = et_graph::link(&g, &set, kt)?;
                let o = et_graph::typical_timing(&g, &set, kt, &link);
                original = Some(Original {
                    iter_ms: o.span_us / 1000.0,
                    ops_ms: Some(o.op_us.iter().flatten().sum::<f64>() / 1000.0),
                    from: "kineto".into(),
                });
            }
            for tr in &t.tensors {
                if let Some(d) = tr.device.map(|d| t.str(d)).filter(|d| !d.is_empty()) {
                    devices.insert(d.to_string());
                }
            }
            let mut new = et_graph::compose::extract(&g, &set);
            if let Some((d, f)) = scale {
                new = et_graph::compose::scale_dim(&new, d, f)?;
            }
            if let Some((x, y)) = dtype {
                new = et_graph::compose::change_dtype(&Graph::new(&new), x, y);
            }
            if a.anonymize {
                let an = mystique_cli::anonymize::anonymize(&mut new, &key);
                for (k, n) in an.replaced {
                    *anon.replaced.entry(k).or_default() += n;
                }
                anon.map.extend(an.map);
            }
            schema = new.meta.schema.clone();
            let trace_name = format!("rank{rank}.et.json.gz");
            new.source = trace_name.clone();
            let text = et_schema::write_trace_to_vec(&new);
            // The plan is compiled from the packaged trace itself, as `run` will read it.
            let packaged = et_schema::parse_trace(&text, &trace_name, &Default::default())?;
            let pg = Graph::new(&packaged);
            let plan = replay::plan::compile(&pg, &pg.replay_set(None));
            for op in &plan.ops {
                let ns = op.name.split("::").next().unwrap_or("");
                if op.name.contains("::") && !LIBTORCH_NAMESPACES.contains(&ns) {
                    ops_from.insert(ns.to_string());
                }
            }
            if let (true, Some((k, kt))) = (a.emulate_gaps, kineto.take()) {
                // `run` links the profile to the packaged trace, as here: a profile that would
                // not link there is refused now.
                replay::calibrate::Linked::of(&pg, &pg.replay_set(None), kt, true).with_context(
                    || {
                        format!(
                            "--emulate-gaps: the profile {} does not link to the packaged ops \
                         (package whole iterations of the ET it was taken with)",
                            k.display()
                        )
                    },
                )?;
                let raw = std::fs::read(k).with_context(|| format!("reading {}", k.display()))?;
                let bytes = if raw.starts_with(&[0x1f, 0x8b]) {
                    raw
                } else {
                    gzip(&raw)?
                };
                files.insert(PROFILE.to_string(), package::sha256_hex(&bytes));
                std::fs::write(tmp.join(PROFILE), &bytes)?;
                gaps = Some(package::Gaps {
                    profile: PROFILE.into(),
                    reference,
                });
            }
            let plan_name = format!("rank{rank}.plan.json.gz");
            for (file, bytes) in [
                (&trace_name, gzip(&text)?),
                (&plan_name, gzip(&serde_json::to_vec(&plan)?)?),
            ] {
                files.insert(file.clone(), package::sha256_hex(&bytes));
                std::fs::write(tmp.join(file), &bytes)?;
            }
            eprintln!(
                "[generate] rank {rank}: {} ops from {}",
                plan.steps.len(),
                path.display()
            );
            ranks.push(RankEntry {
                rank,
                trace: trace_name,
                plan: plan_name,
                source_sha256: sha.clone(),
                ops: plan.steps.len(),
            });
        }
        if let Some(r) = reference {
            // The original's iteration uninstrumented, where the profile's was not.
            original = Some(Original {
                iter_ms: r.original_ms,
                ops_ms: original.and_then(|o: Original| o.ops_ms),
                from: "reference".into(),
            });
        }
        if let Some(ms) = a.original_ms {
            anyhow::ensure!(ms > 0.0 && ms.is_finite(), "--original-ms must be positive");
            original = Some(Original {
                iter_ms: ms,
                ops_ms: None,
                from: "--original-ms".into(),
            });
        }
        let f = &a.filters;
        let manifest = Manifest {
            format: PACKAGE_FORMAT.into(),
            created_by: format!("mystique {}", env!("CARGO_PKG_VERSION")),
            libtorch: "2.11.0".into(),
            schema,
            ranks,
            selection: SelectionRecord {
                iterations: f.iteration.clone(),
                name: f.name.clone(),
                scope: f.scope.clone(),
                ids: f.ids.clone(),
                only: format!("{:?}", f.only).to_lowercase(),
            },
            what_if: what_if.clone(),
            devices_recorded: devices.into_iter().collect(),
            seed: a.seed,
            warmup: a.warmup,
            iters: a.iters,
            ops_from: ops_from.into_iter().collect(),
            original,
            gaps,
            anonymized: a.anonymize.then(|| anon.replaced.clone()),
            files,
        };
        std::fs::write(tmp.join(MANIFEST), serde_json::to_vec_pretty(&manifest)?)?;
        Ok((manifest, anon))
    })();
    let (manifest, anon) = match built {
        Ok(x) => x,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
    };
    if out.exists() {
        std::fs::remove_dir(out)?;
    }
    std::fs::rename(&tmp, out).with_context(|| format!("creating {}", out.display()))?;
    if let Some(m) = &a.map {
        let text = serde_json::to_vec_pretty(&anon.map)?;
        mystique_cli::output::write_atomic(m, |w| Ok(w.write_all(&text)?))?;
    }
    let summary = serde_json::json!({
        "package": out.display().to_string(),
        "ranks": manifest.ranks.len(),
        "ops": manifest.ranks.iter().map(|r| r.ops).sum::<usize>(),
        "ops_from": manifest.ops_from,
        "anonymized": manifest.anonymized,
        "original": manifest.original,
    });
    if json {
        println!("{summary}");
    } else {
        eprintln!(
            "generated {} ({} rank(s), {} ops){}",
            out.display(),
            manifest.ranks.len(),
            summary["ops"],
            match &manifest.anonymized {
                Some(r) => format!("; anonymised: {r:?}"),
                None => String::new(),
            }
        );
        if !manifest.ops_from.is_empty() {
            eprintln!(
                "note: its ops need libraries from {:?}: `mystique run` takes them with --load-library",
                manifest.ops_from
            );
        }
    }
    Ok(())
}

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

/// Runs one rank's plan of a package (this process's rank under RANK/WORLD_SIZE).
fn run_rank(dir: &Path, m: &Manifest, a: &RunPackageArgs, rank: usize) -> Result<RankResult> {
    let entry = m
        .ranks
        .iter()
        .find(|r| r.rank == rank)
        .with_context(|| format!("the package has no rank {rank}"))?;
    let bytes = package::read_file(dir, &entry.plan)?;
    let plan: Plan = serde_json::from_slice(&bytes)
        .with_context(|| format!("the package's {} is not a replay plan", entry.plan))?;
    plan.validate()
        .map_err(|e| anyhow::anyhow!("the package's {}: {e}", entry.plan))?;
    let device = replay::Device::parse(&a.device)?;
    tch::manual_seed(m.seed as i64);
    let gap_model = match (&m.gaps, a.no_gaps) {
        (Some(gaps), false) => Some(package_gaps(dir, entry, gaps, device, plan.steps.len())?),
        _ => None,
    };
    let bound = replay::bind(&plan, &device);
    let timeout = std::time::Duration::from_secs(a.timeout);
    let opts = replay::ReplayOptions {
        device,
        warmup: a.warmup.unwrap_or(m.warmup),
        iters: a.iters.unwrap_or(m.iters),
        per_step: true,
        progress: true,
        force: a.force,
        dist: replay::DistOptions::from_env(timeout).map_err(anyhow::Error::msg)?,
        gaps_us: gap_model.as_ref().map(|g| g.gaps_us.clone()),
        gaps_base_us: gap_model.as_ref().map(|g| g.base_step_us.clone()),
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
    entry: &RankEntry,
    gaps: &package::Gaps,
    device: replay::Device,
    steps: usize,
) -> Result<et_graph::GapModel> {
    let t = et_schema::parse_trace(
        &package::read_file(dir, &entry.trace)?,
        &entry.trace,
        &Default::default(),
    )?;
    let g = Graph::new(&t);
    let set = g.replay_set(None);
    let k =
        et_schema::kineto::parse_kineto(&package::read_file(dir, &gaps.profile)?, &gaps.profile)
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
            probed_costs: true,
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
    // A rank of a multi-rank run started below: run it and print its result.
    if std::env::var("MYSTIQUE_PACKAGE_RANK").is_ok() {
        let rank: usize = std::env::var("RANK")?.parse()?;
        let r = run_rank(dir, &m, a, rank)?;
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    let out = a.output.clone().unwrap_or_else(|| {
        let name = dir
            .file_name()
            .map_or("package".into(), |n| n.to_string_lossy().into_owned());
        dir.with_file_name(format!("{name}.result.json"))
    });
    mystique_cli::output::check(&out, &[dir.join(MANIFEST).as_path()])?;
    for lib in &a.load_library {
        replay::load_library(lib)?;
    }
    if let Some(n) = a.threads {
        anyhow::ensure!(n > 0, "--threads must be positive");
        tch::set_num_threads(n);
    }
    if !m.ops_from.is_empty() && a.load_library.is_empty() {
        eprintln!(
            "note: the package's ops come also from {:?}: without their libraries (--load-library) those fail",
            m.ops_from
        );
    }
    let device = replay::Device::parse(&a.device)?;
    let ranks = if m.ranks.len() == 1 {
        vec![run_rank(dir, &m, a, 0)?]
    } else {
        let timeout = std::time::Duration::from_secs(a.timeout);
        let outs = crate::ranks::launch(m.ranks.len(), timeout, |_| {
            let mut cmd = std::process::Command::new(std::env::current_exe()?);
            cmd.arg("run")
                .arg(dir)
                .args(["--device", &a.device, "--timeout", &a.timeout.to_string()])
                .env("MYSTIQUE_PACKAGE_RANK", "1");
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
    let result = RunResult {
        format: RESULT_FORMAT.into(),
        package: manifest_hash,
        machine: machine(&device),
        ranks,
    };
    let text = serde_json::to_vec_pretty(&result)?;
    mystique_cli::output::write_atomic(&out, |w| Ok(w.write_all(&text)?))?;
    if json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        let mut o = std::io::stdout().lock();
        writeln!(
            o,
            "package    {} ({})",
            dir.display(),
            &result.package[..12]
        )?;
        writeln!(o, "result     {}", out.display())?;
        for r in &result.ranks {
            writeln!(
                o,
                "rank {:<4}  {} of {} ops, {} failed; iteration median {:.3} ms{}",
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
                "original   {:.3} ms per iteration (from {})",
                o2.iter_ms, o2.from
            )?;
        }
    }
    mystique_cli::OpsFailed::check_reports(result.ranks.iter().map(|r| &r.report))
}
