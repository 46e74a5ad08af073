//! `cargo xtask gpu-check`: one command that proves the CUDA path on a GPU machine.
//!
//! Two halves, because the device machine this project is lent has a GPU, PyTorch 2.11 and no
//! Rust toolchain, and sees only the checkout:
//!
//! - `prepare` (here, where cargo is): builds the release binaries and the GPU test binaries,
//!   copies them stripped, with the public GPU traces, into `.gpucheck/` (git-ignored; carry it).
//! - `run --dir .gpucheck` (there, through the carried `xtask` binary): finds that machine's
//!   libtorch through Python (`LD_LIBRARY_PATH`), then in about 8 minutes at most: the runtime
//!   (`mystique env`), the GPU tests (the CUDA variants of `test_device!`, CUDA events), the
//!   public GPU traces replayed on `cuda` (coverage of compute ops, CUDA-event times beside
//!   launch times, NVML summary, allocator figures), and `compare --device cuda` of a trace
//!   with its Kineto (per-op GPU event times vs the original's kernels), two ranks on cuda,
//!   a few models captured on that GPU in the same run (`scripts/gpu_zoo.py`) replayed there,
//!   plain and with the profile's gaps, each with its fidelity card (`compare`: original and
//!   replay figure by figure), and, where a zoo was captured on the preparing machine, every
//!   zoo trace replayed on cuda with its values checked (no failed op, no NaN/Inf), in the
//!   time left. `GPU_CHECK_BUDGET_S` bounds the whole run (480 s by default). One summary;
//!   with `$OUT` set, `gpu-check.json` and the NVML SVGs land there.
//!
//! Plain `cargo xtask gpu-check` on a GPU machine with cargo does both.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Public GPU traces replayed on CUDA (ET, optional Kineto).
const TRACES: [(&str, Option<&str>); 4] = [
    ("param_resnet_1.1.0.et.json.gz", None),
    ("param_hf_gpt2_1.1.0.et.json.gz", None),
    (
        "param_linear_1.0.1.et.json.gz",
        Some("param_linear_1.0.1.kineto.json.gz"),
    ),
    (
        "hta_simple_add_1.0.1.et.json.gz",
        Some("hta_simple_add_1.0.1.kineto.json.gz"),
    ),
];

/// Test binaries whose CUDA variants run there: (cargo target name, package).
const TESTS: [(&str, &str); 2] = [("devices", "replay"), ("metrics", "metrics")];

pub fn main(args: &[&str], root: &Path, shared: &Path) -> Result<()> {
    match args {
        ["prepare", rest @ ..] => prepare(root, &shared.join("traces"), dir_arg(rest, root)?),
        ["run", rest @ ..] => run(&dir_arg(rest, root)?),
        [] => {
            let dir = root.join(".gpucheck");
            prepare(root, &shared.join("traces"), dir.clone())?;
            run(&dir)
        }
        _ => bail!(
            "usage: cargo xtask gpu-check [prepare | run] [--dir DIR]  (DIR: .gpucheck by default)"
        ),
    }
}

fn dir_arg(rest: &[&str], root: &Path) -> Result<PathBuf> {
    match rest {
        [] => Ok(root.join(".gpucheck")),
        ["--dir", d] => Ok(PathBuf::from(d)),
        _ => bail!("expected --dir DIR, got {rest:?}"),
    }
}

fn strip_copy(from: &Path, to: &Path) -> Result<()> {
    let _ = std::fs::remove_file(to);
    let ok = Command::new("strip")
        .arg("-o")
        .arg(to)
        .arg(from)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        std::fs::copy(from, to).with_context(|| format!("copying {}", from.display()))?;
    }
    Ok(())
}

/// Builds and bundles everything `run` needs into `dir`.
fn prepare(root: &Path, shared: &Path, dir: PathBuf) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!("[gpu-check] building release binaries and GPU test binaries ...");
    let status = Command::new(&cargo)
        .current_dir(root)
        .args(["build", "--release", "-p", "mystique-cli", "-p", "xtask"])
        .status()?;
    if !status.success() {
        bail!("cargo build failed");
    }
    // The test executables' paths, from cargo's own report.
    let mut cmd = Command::new(&cargo);
    cmd.current_dir(root)
        .args(["test", "--release", "--no-run", "--message-format=json"]);
    for (name, pkg) in TESTS {
        cmd.args(["-p", pkg]);
        if name != "metrics" {
            cmd.args(["--test", name]);
        } else {
            cmd.arg("--lib");
        }
    }
    let out = cmd.stderr(Stdio::inherit()).output()?;
    if !out.status.success() {
        bail!("cargo test --no-run failed");
    }
    let mut tests = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(exe), Some(name)) = (v["executable"].as_str(), v["target"]["name"].as_str())
        else {
            continue;
        };
        if TESTS.iter().any(|(n, _)| *n == name) {
            tests.push((name.to_string(), PathBuf::from(exe)));
        }
    }
    if tests.len() != TESTS.len() {
        bail!(
            "expected {} test binaries, cargo reported {tests:?}",
            TESTS.len()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    for sub in ["bin", "tests", "traces/public", "traces/cpu"] {
        std::fs::create_dir_all(dir.join(sub))?;
    }
    for b in ["mystique", "mystique-replay", "xtask"] {
        strip_copy(
            &root.join("target/release").join(b),
            &dir.join("bin").join(b),
        )?;
    }
    for (name, exe) in &tests {
        strip_copy(exe, &dir.join("tests").join(name))?;
    }
    for (et, kineto) in TRACES {
        for f in std::iter::once(et).chain(kineto) {
            std::fs::copy(
                shared.join("public").join(f),
                dir.join("traces/public").join(f),
            )
            .with_context(|| format!("copying {f} from {}", shared.display()))?;
        }
    }
    // What the device tests replay, and the two ranks of stage 4.
    for f in [
        "mlp.et.json",
        "dist_mlp_w2.rank0.et.json",
        "dist_mlp_w2.rank1.et.json",
    ] {
        std::fs::copy(shared.join("cpu").join(f), dir.join("traces/cpu").join(f))
            .with_context(|| format!("copying {f} from {}", shared.display()))?;
    }
    // Stage 6's capture script.
    std::fs::create_dir_all(dir.join("scripts"))?;
    std::fs::copy(
        root.join("xtask/scripts/gpu_zoo.py"),
        dir.join("scripts/gpu_zoo.py"),
    )?;
    // The zoo's quiet captures (CPU traces, bf16/fp16, attention, optimizers), gzipped: stage 7
    // replays each on cuda with its values checked. Only where a zoo was captured here.
    match zoo_captures() {
        Some(zoo) => {
            std::fs::create_dir_all(dir.join("traces/zoo"))?;
            let mut n = 0;
            for et in walk(&zoo) {
                let name = et.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                if !name.ends_with(".et.json") || name.ends_with(".linked.et.json") {
                    continue;
                }
                let gz = std::fs::File::create(dir.join("traces/zoo").join(format!("{name}.gz")))?;
                let ok = Command::new("gzip")
                    .arg("-c")
                    .arg(&et)
                    .stdout(gz)
                    .status()
                    .is_ok_and(|s| s.success());
                anyhow::ensure!(ok, "gzip -c {} failed", et.display());
                n += 1;
            }
            eprintln!("[gpu-check] {n} zoo traces from {}", zoo.display());
        }
        None => eprintln!(
            "[gpu-check] no zoo captured here (cargo xtask fidelity captures it): stage 7 will not run"
        ),
    }
    let size: u64 = walk(&dir)
        .iter()
        .map(|p| p.metadata().map_or(0, |m| m.len()))
        .sum();
    let rel = dir.strip_prefix(root).unwrap_or(&dir).display().to_string();
    eprintln!(
        "[gpu-check] {} ready ({:.1} MiB). On the device machine, carry it and run:\n  \
         {rel}/bin/xtask gpu-check run --dir {rel}",
        dir.display(),
        size as f64 / (1 << 20) as f64
    );
    if size > 60 << 20 {
        bail!("the bundle is over 60 MiB: it will not travel (64 MiB with the checkout)");
    }
    Ok(())
}

/// The newest zoo capture's quiet directory in this user's cache, if any holds traces.
fn zoo_captures() -> Option<PathBuf> {
    let zoo = crate::cache_dir().join("zoo");
    std::fs::read_dir(zoo)
        .ok()?
        .flatten()
        .map(|e| e.path().join("quiet"))
        .filter(|q| {
            walk(q)
                .iter()
                .any(|p| p.to_string_lossy().ends_with(".et.json"))
        })
        .max_by_key(|q| q.metadata().and_then(|m| m.modified()).ok())
}

fn walk(d: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(d) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// The machine's libtorch (and its CUDA libraries, found by libtorch's own RUNPATH): the
/// bundle's `.libtorch`-free binaries load it through `LD_LIBRARY_PATH`.
fn torch_lib_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("MYSTIQUE_TORCH_LIB") {
        return Some(PathBuf::from(d));
    }
    for py in ["python3", "python"] {
        let out = Command::new(py)
            .args([
                "-c",
                "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))",
            ])
            .output();
        if let Ok(o) = out {
            if o.status.success() {
                let p = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
                if p.join("libtorch_cpu.so").exists() {
                    return Some(p);
                }
            }
        }
    }
    None
}

/// Runs a command with a time limit; (exit code or None when killed, stdout, stderr).
fn run_limited(cmd: &mut Command, limit: Duration) -> Result<(Option<i32>, String, String)> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting a check")?;
    // Both pipes drained on threads of their own, so neither can fill and stall the child.
    fn drain<R: std::io::Read + Send + 'static>(r: Option<R>) -> std::thread::JoinHandle<String> {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut r) = r {
                let _ = r.read_to_string(&mut s);
            }
            s
        })
    }
    let o = drain(child.stdout.take());
    let e = drain(child.stderr.take());
    let t = Instant::now();
    let code = loop {
        if let Some(st) = child.try_wait()? {
            break st.code();
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    Ok((
        code,
        o.join().unwrap_or_default(),
        e.join().unwrap_or_default(),
    ))
}

fn tail(s: &str, lines: usize) -> String {
    let v: Vec<&str> = s.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

/// Runs every check from the bundle in `dir`, one stage after another; fails when one fails.
fn run(dir: &Path) -> Result<()> {
    let mut check = Check::new(dir)?;
    check.runtime()?;
    check.tests()?;
    let cuda = check.cuda();
    check.public_traces(cuda)?;
    check.two_ranks(cuda)?;
    check.compares(cuda)?;
    // The fidelity cards before the zoo: the zoo's batches take whatever time is left, and
    // are reported as not run where none is.
    check.captured_here(cuda);
    check.zoo(cuda);
    check.finish()
}

/// A check's exit code (None when killed), stdout and stderr ([`run_limited`]).
type Outcome = (Option<i32>, String, String);

/// The checks' bundle, their time budget, and what they found so far.
struct Check {
    t0: Instant,
    /// When the budget runs out ([`Check::limit`]).
    deadline: Instant,
    /// The bundle (canonical).
    dir: PathBuf,
    /// `LD_LIBRARY_PATH` for the bundle's binaries: this machine's libtorch first.
    ld: String,
    /// `$OUT`, where `gpu-check.json` and the NVML SVGs go.
    out_dir: Option<PathBuf>,
    bin: PathBuf,
    traces: PathBuf,
    failures: Vec<String>,
    /// Checks not run for want of time: reported, not failed (the budget is the lending
    /// machine's, not the GPU's fault).
    skipped: Vec<String>,
    summary: serde_json::Map<String, serde_json::Value>,
}

impl Check {
    fn new(dir: &Path) -> Result<Check> {
        let t0 = Instant::now();
        // One budget for everything (a device call may run 10 minutes in all): each step gets what
        // it needs at most and what is left at least; steps past the budget are reported, not run.
        let deadline = t0
            + Duration::from_secs(
                std::env::var("GPU_CHECK_BUDGET_S")
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(480),
            );
        let dir = dir
            .canonicalize()
            .with_context(|| format!("no bundle at {}", dir.display()))?;
        let lib = torch_lib_dir().context(
            "no libtorch found: install PyTorch 2.11 (python3 -c 'import torch') or set MYSTIQUE_TORCH_LIB",
        )?;
        let ld = match std::env::var("LD_LIBRARY_PATH") {
            Ok(p) if !p.is_empty() => format!("{}:{p}", lib.display()),
            _ => lib.display().to_string(),
        };
        Ok(Check {
            t0,
            deadline,
            bin: dir.join("bin/mystique"),
            traces: dir.join("traces"),
            dir,
            ld,
            out_dir: std::env::var_os("OUT").map(PathBuf::from),
            failures: Vec::new(),
            skipped: Vec::new(),
            summary: serde_json::Map::new(),
        })
    }

    /// A step's time limit: `secs` at most, what is left of the budget at least.
    fn limit(&self, secs: u64) -> Duration {
        Duration::from_secs(secs).min(self.deadline.saturating_duration_since(Instant::now()))
    }

    /// The environment the bundle's binaries run in.
    fn with_env(&self, c: &mut Command) {
        c.env("LD_LIBRARY_PATH", &self.ld)
            .env("MYSTIQUE_SHARED_TRACES", &self.traces);
    }

    /// Writes what was found so far to `$OUT/gpu-check.json`, after every stage: a run cut short
    /// still leaves what it found.
    fn save(&self) {
        let _ = self.write_summary();
    }

    /// `$OUT/gpu-check.json` (nothing without `$OUT`): what was found, failed and skipped so
    /// far, and the seconds taken.
    fn write_summary(&self) -> Result<()> {
        let Some(o) = &self.out_dir else {
            return Ok(());
        };
        let mut s = self.summary.clone();
        s.insert("failures".into(), serde_json::json!(self.failures));
        s.insert("skipped".into(), serde_json::json!(self.skipped));
        s.insert(
            "seconds".into(),
            serde_json::json!(self.t0.elapsed().as_secs_f64()),
        );
        let path = o.join("gpu-check.json");
        std::fs::write(&path, serde_json::to_vec_pretty(&s)?)
            .with_context(|| format!("writing {}", path.display()))
    }

    /// Whether the runtime reported CUDA available (stage 1).
    fn cuda(&self) -> bool {
        self.summary["env"]["cuda_available"] == true
    }

    /// Stage 1: the runtime (`mystique env`).
    fn runtime(&mut self) -> Result<()> {
        let mut c = Command::new(&self.bin);
        c.args(["env", "--json"]);
        self.with_env(&mut c);
        let (code, stdout, stderr) = run_limited(&mut c, self.limit(60))?;
        let env: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap_or_default();
        println!("== env: {}", stdout.trim());
        if code != Some(0) || env["cuda_available"] != true {
            self.failures.push(format!(
                "env: CUDA not available: {} {}",
                stdout.trim(),
                tail(&stderr, 5)
            ));
        }
        self.summary.insert("env".into(), env);
        Ok(())
    }

    /// Stage 2: the GPU tests, their CUDA variants included (ignored by default elsewhere).
    fn tests(&mut self) -> Result<()> {
        let mut tests = serde_json::Map::new();
        for (name, _) in TESTS {
            let mut c = Command::new(self.dir.join("tests").join(name));
            // The CUDA variants are ignored by default (most machines have no GPU): included
            // here, where a missing device fails them.
            c.args(["--test-threads=1", "--nocapture", "--include-ignored"]);
            self.with_env(&mut c);
            let (code, out, err) = run_limited(&mut c, self.limit(120))?;
            let result = out
                .lines()
                .find(|l| l.starts_with("test result"))
                .unwrap_or("(no result)")
                .to_string();
            let skipped = format!("{out}{err}").matches("skipped").count();
            println!("== tests/{name}: {result}; {skipped} skipped");
            if code != Some(0) {
                self.failures.push(format!(
                    "tests/{name}: {}",
                    tail(&format!("{out}\n{err}"), 30)
                ));
            }
            if skipped > 0 {
                self.failures.push(format!(
                    "tests/{name}: {skipped} CUDA checks skipped (no device seen)"
                ));
            }
            tests.insert(
                name.into(),
                serde_json::json!({"result": result, "skipped": skipped}),
            );
        }
        self.summary
            .insert("tests".into(), serde_json::Value::Object(tests));
        self.save();
        Ok(())
    }

    /// Stage 3: the public GPU traces on cuda.
    fn public_traces(&mut self, cuda: bool) -> Result<()> {
        let mut replays = Vec::new();
        for (et, _) in TRACES.iter().filter(|_| cuda) {
            let path = self.traces.join("public").join(et);
            let stem = et.trim_end_matches(".et.json.gz");
            let mut c = Command::new(&self.bin);
            c.arg("replay")
                .arg(&path)
                .args(["--device", "cuda", "--json", "--only", "compute"])
                .args(["--warmup", "1", "--iters", "3", "--nvml-period", "20"]);
            if let Some(o) = &self.out_dir {
                c.arg("--gpu-svg").arg(o.join(format!("{stem}.nvml.svg")));
            }
            self.with_env(&mut c);
            let t = Instant::now();
            if self.limit(150) < Duration::from_secs(20) {
                self.skipped.push(format!("{stem}: not run, out of time"));
                continue;
            }
            let (code, out, err) = run_limited(&mut c, self.limit(150))?;
            let r: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_default();
            let (sel, ran) = (
                r["ops_selected"].as_u64().unwrap_or(0),
                r["ops_replayed"].as_u64().unwrap_or(0),
            );
            let coverage = ran as f64 / sel.max(1) as f64;
            print_replay(
                stem,
                t.elapsed().as_secs_f64(),
                code,
                &r,
                (ran, sel, coverage),
            );
            if r.is_null() {
                self.failures.push(format!(
                    "{stem}: no report (exit {code:?}): {}",
                    tail(&err, 15)
                ));
            } else {
                if coverage < 0.99 {
                    self.failures.push(format!(
                        "{stem}: {:.1}% of compute ops ran (< 99%)",
                        100.0 * coverage
                    ));
                }
                if r["timing"] != "cuda events" {
                    self.failures.push(format!(
                        "{stem}: timed by {} ({})",
                        r["timing"], r["event_error"]
                    ));
                }
                if r["gpu"].is_null() {
                    self.failures
                        .push(format!("{stem}: no NVML summary: {}", r["gpu_unavailable"]));
                }
            }
            replays.push(serde_json::json!({"trace": stem, "exit": code, "seconds": t.elapsed().as_secs_f64(), "report": r}));
            self.summary
                .insert("replays".into(), serde_json::Value::Array(replays.clone()));
            self.save();
        }
        self.summary
            .insert("replays".into(), serde_json::Value::Array(replays));
        Ok(())
    }

    /// Stage 4: two ranks on cuda: collectives on CUDA tensors (NCCL with a GPU per rank, else
    /// Gloo).
    fn two_ranks(&mut self, cuda: bool) -> Result<()> {
        if cuda && self.limit(120) >= Duration::from_secs(20) {
            let mut c = Command::new(&self.bin);
            c.arg("replay")
                .arg("--ranks")
                .arg(self.traces.join("cpu/dist_mlp_w2.rank*.et.json"))
                .args([
                    "--device", "cuda", "--json", "--warmup", "1", "--iters", "2",
                ]);
            self.with_env(&mut c);
            let (code, out, err) = run_limited(&mut c, self.limit(120))?;
            let j: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_default();
            let ranks = j["ranks"].as_array().cloned().unwrap_or_default();
            let all_ran = ranks.len() == 2
                && ranks
                    .iter()
                    .all(|r| r["ops_failed"] == 0 && r["ops_replayed"] == r["ops_selected"]);
            println!(
                "== 2 ranks on cuda (exit {code:?}): {}; {}",
                ranks
                    .iter()
                    .map(|r| format!(
                        "rank {}: {}/{} ops",
                        r["rank"], r["ops_replayed"], r["ops_selected"]
                    ))
                    .collect::<Vec<_>>()
                    .join(", "),
                ranks
                    .first()
                    .and_then(|r| r["comm"].as_str())
                    .unwrap_or("?")
            );
            if !all_ran {
                self.failures.push(format!(
                    "2 ranks on cuda: {}",
                    tail(&format!("{out}\n{err}"), 15)
                ));
            }
            self.summary.insert("ranks".into(), j);
            self.save();
        }
        Ok(())
    }

    /// Stage 5: compare on cuda: the replay's CUDA-event GPU time per op vs the original's
    /// kernels.
    fn compares(&mut self, cuda: bool) -> Result<()> {
        let mut compares = Vec::new();
        for (et, kineto) in TRACES.iter().filter(|_| cuda) {
            let Some(k) = kineto else { continue };
            let stem = et.trim_end_matches(".et.json.gz");
            let mut c = Command::new(&self.bin);
            c.arg("compare")
                .arg(self.traces.join("public").join(et))
                .arg(self.traces.join("public").join(k))
                .args([
                    "--device", "cuda", "--json", "--warmup", "1", "--iters", "3",
                ]);
            self.with_env(&mut c);
            if self.limit(120) < Duration::from_secs(20) {
                self.skipped
                    .push(format!("compare {stem}: not run, out of time"));
                continue;
            }
            let (code, out, err) = run_limited(&mut c, self.limit(120))?;
            let j: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_default();
            println!(
                "== compare {stem} on cuda (exit {code:?}): by {}; ops ratio {:.3}; original GPU busy {:.3} ms, replay GPU busy {:.3} ms",
                j["compared_by"].as_str().unwrap_or("?"),
                j["ratio_ops"].as_f64().unwrap_or(f64::NAN),
                j["original_gpu"]["busy_us"].as_f64().unwrap_or(f64::NAN) / 1e3,
                j["replay_gpu"]["busy_us"].as_f64().unwrap_or(f64::NAN) / 1e3,
            );
            for d in j["top_differences"]
                .as_array()
                .into_iter()
                .flatten()
                .take(6)
            {
                println!(
                    "   orig {:>9.1} us  replay {:>9.1} us  ratio {:>6.2}  {}",
                    d["original_us"].as_f64().unwrap_or(0.0),
                    d["replay_us"].as_f64().unwrap_or(0.0),
                    d["ratio"].as_f64().unwrap_or(0.0),
                    d["op"].as_str().unwrap_or("")
                );
            }
            if j.is_null() {
                self.failures.push(format!(
                    "compare {stem}: no report (exit {code:?}): {}",
                    tail(&err, 15)
                ));
            } else if j["compared_by"] != "gpu time per op" {
                self.failures
                    .push(format!("compare {stem}: compared by {}", j["compared_by"]));
            }
            compares.push(serde_json::json!({"trace": stem, "exit": code, "report": j}));
        }
        self.summary
            .insert("compares".into(), serde_json::Value::Array(compares));
        self.save();
        Ok(())
    }

    /// Stage 7: the zoo on cuda, in the time left: CPU captures (bf16 and fp16 paths, fused
    /// attention, every optimizer) replayed on the GPU with their values checked: no failed op,
    /// no NaN/Inf.
    fn zoo(&mut self, cuda: bool) {
        let mut zoo: Vec<PathBuf> = walk(&self.traces.join("zoo"));
        zoo.sort();
        if cuda && !zoo.is_empty() {
            let t = Instant::now();
            let mut rows = Vec::new();
            // A few at a time: one GPU, many cores, and each process spends most of its time
            // starting CUDA and materialising inputs.
            for batch in zoo.chunks(4) {
                if self.limit(60) < Duration::from_secs(30) {
                    self.skipped.push(format!(
                        "zoo on cuda: {} of {} traces not run, out of time",
                        zoo.len() - rows.len(),
                        zoo.len()
                    ));
                    break;
                }
                let results: Vec<_> = std::thread::scope(|s| {
                    let handles: Vec<_> = batch
                        .iter()
                        .map(|et| {
                            let mut c = Command::new(&self.bin);
                            c.arg("replay").arg(et).args([
                                "--device",
                                "cuda",
                                "--json",
                                "--check-values",
                                "--warmup",
                                "1",
                                "--iters",
                                "2",
                                "--nvml-period",
                                "0",
                            ]);
                            self.with_env(&mut c);
                            let l = self.limit(60);
                            s.spawn(move || run_limited(&mut c, l))
                        })
                        .collect();
                    handles.into_iter().map(|h| h.join()).collect()
                });
                for (et, res) in batch.iter().zip(results) {
                    rows.push(self.zoo_result(et, res));
                }
                self.summary
                    .insert("zoo".into(), serde_json::Value::Array(rows.clone()));
                self.save();
            }
            let clean = rows
                .iter()
                .filter(|r| r["ops_failed"] == 0 && r["first_nonfinite"].is_null())
                .count();
            println!(
                "== zoo on cuda ({:.0} s): {clean} of {} traces with no failed op and no NaN/Inf",
                t.elapsed().as_secs_f64(),
                zoo.len()
            );
        }
        self.save();
    }

    /// One zoo trace's replay on cuda (stage 7), `res` as it ran: its line, its failures, its row.
    fn zoo_result(
        &mut self,
        et: &Path,
        res: std::thread::Result<Result<Outcome>>,
    ) -> serde_json::Value {
        let name = et
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .trim_end_matches(".et.json.gz")
            .to_string();
        let (code, out, err) = match res {
            Ok(Ok(r)) => r,
            _ => (None, String::new(), "could not run".into()),
        };
        let r: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_default();
        let failed = r["ops_failed"].as_u64();
        let nonfinite = &r["first_nonfinite"];
        let reasons: Vec<String> = r["failures"]
            .as_array()
            .into_iter()
            .flatten()
            .take(3)
            .map(|f| {
                format!(
                    "{}x {}: {}",
                    f["count"],
                    f["op"].as_str().unwrap_or(""),
                    f["reason"].as_str().unwrap_or("")
                )
            })
            .collect();
        println!(
            "   {name:<28} {}/{} ops, {} failed, iter {:.2} ms{}{}",
            r["ops_replayed"],
            r["ops_selected"],
            failed.map_or("?".into(), |f| f.to_string()),
            r["iter_ms"]["median"].as_f64().unwrap_or(f64::NAN),
            if nonfinite.is_null() {
                String::new()
            } else {
                format!(", NaN/Inf first at {nonfinite}")
            },
            if reasons.is_empty() {
                String::new()
            } else {
                format!("\n      {}", reasons.join("\n      "))
            }
        );
        if r.is_null() {
            self.failures.push(format!(
                "zoo {name} on cuda: no report (exit {code:?}): {}",
                tail(&err, 8)
            ));
        } else if failed != Some(0) || !nonfinite.is_null() {
            self.failures.push(format!(
                "zoo {name} on cuda: {} failed ops{}",
                failed.unwrap_or(0),
                if nonfinite.is_null() { "" } else { ", NaN/Inf" }
            ));
        }
        serde_json::json!({
            "model": name, "exit": code, "ops_failed": failed,
            "ops_replayed": r["ops_replayed"], "ops_selected": r["ops_selected"],
            "first_nonfinite": nonfinite, "iter_ms": r["iter_ms"]["median"],
            "failures": reasons,
        })
    }

    /// Stage 6: captured on this GPU, replayed on it: a few models (`scripts/gpu_zoo.py`, tuned
    /// on by nothing) captured as a user captures them, their uninstrumented iteration timed in
    /// the same run, then replayed plain and `compare`d with the profile's gaps: each model's
    /// fidelity card (iteration, op and gap time, peak memory, CPU time, GPU busy time and
    /// NVML's figures, original beside replay). Ratios are reported, not judged; failed ops
    /// and missing reports fail the check. (`GPU_ZOO_DEVICE=cpu` runs the
    /// script's captures on the CPU, to check the script without a GPU.)
    fn captured_here(&mut self, cuda: bool) {
        let script = self.dir.join("scripts/gpu_zoo.py");
        if !(cuda && script.exists()) {
            return;
        }
        if self.limit(240) < Duration::from_secs(60) {
            self.skipped
                .push("captured on this GPU: not run, out of time".into());
            self.save();
            return;
        }
        let cap = std::env::temp_dir().join("mq-gpu-zoo");
        let _ = std::fs::remove_dir_all(&cap);
        let mut c = Command::new("python3");
        c.arg(&script).arg(&cap).env("PYTHONWARNINGS", "ignore");
        let t = Instant::now();
        let (code, out, err) = run_limited(&mut c, self.limit(150))
            .unwrap_or_else(|e| (None, String::new(), format!("{e:#}")));
        let metas: Vec<serde_json::Value> = out
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        println!(
            "== captured on this GPU ({:.0} s, exit {code:?}): {} models",
            t.elapsed().as_secs_f64(),
            metas.len()
        );
        // A model that failed is named on stderr (the others are captured all the same).
        if metas.is_empty() || code != Some(0) {
            self.failures.push(format!(
                "gpu_zoo.py (exit {code:?}, {} models captured): {}",
                metas.len(),
                tail(&err, 10)
            ));
        }
        let mut rows = Vec::new();
        for meta in &metas {
            rows.push(self.replay_captured(&cap, meta));
            // Saved after each model: a run cut short keeps the cards it printed.
            self.summary.insert(
                "captured_here".into(),
                serde_json::Value::Array(rows.clone()),
            );
            self.save();
        }
    }

    /// One model captured on this GPU (stage 6; `meta`: its capture's record, its files in
    /// `cap`): replayed plain, then `compare`d with the profile's gaps, whose fidelity card sets
    /// the original's figures beside the replay's. Its lines, its failures, its row.
    fn replay_captured(&mut self, cap: &Path, meta: &serde_json::Value) -> serde_json::Value {
        let name = meta["model"].as_str().unwrap_or_default().to_string();
        let original = meta["iter_ms_median"].as_f64().unwrap_or(f64::NAN);
        let common = [
            "--device", "cuda", "--json", "--warmup", "5", "--iters", "30",
        ];
        let r = self.captured_report(&name, "plain", |c| {
            c.arg("replay")
                .arg(cap.join(format!("{name}.et.json")))
                .args(common)
                .args(["--nvml-period", "0"]);
        });
        let ms = r["iter_ms"]["median"].as_f64().unwrap_or(f64::NAN);
        let plain = (!r.is_null()).then(|| {
            serde_json::json!({
                "iter_ms": ms, "ratio": ms / original, "ops_failed": r["ops_failed"],
                "ops_replayed": r["ops_replayed"], "fallbacks": r["fallbacks"],
            })
        });
        let r = self.captured_report(&name, "card", |c| {
            c.arg("compare")
                .arg(cap.join(format!("{name}.linked.et.json")))
                .arg(cap.join(format!("{name}.kineto.json")))
                .args(common)
                .arg("--emulate-gaps");
        });
        let card = (!r.is_null()).then(|| {
            serde_json::json!({
                "card": r["card"], "ops_failed": r["ops_failed"],
                "gap_model": r["gap_model"], "original_gpu_off_op": r["original_gpu_off_op"],
            })
        });
        println!(
            "   {name:<18} original {original:>8.3} ms   replay/original plain {:>6.3}",
            ms / original,
        );
        for line in card_lines(&r["card"]) {
            println!("     {line}");
        }
        serde_json::json!({
            "model": name, "original_ms": original, "plain": plain, "card": card,
        })
    }

    /// The JSON report of one run of a model captured here (`label` names it in failures),
    /// its command's arguments set by `args`; null where it was not run (out of time) or wrote
    /// none. A run that wrote none, or failed ops, is a failure.
    fn captured_report(
        &mut self,
        name: &str,
        label: &str,
        args: impl FnOnce(&mut Command),
    ) -> serde_json::Value {
        if self.limit(90) < Duration::from_secs(15) {
            self.skipped
                .push(format!("{name} {label} on cuda: not run, out of time"));
            return serde_json::Value::Null;
        }
        let mut c = Command::new(&self.bin);
        args(&mut c);
        self.with_env(&mut c);
        // compare calibrates the gaps (several short replays) before its own iterations.
        let (code, out, err) = run_limited(&mut c, self.limit(90))
            .unwrap_or_else(|e| (None, String::new(), format!("{e:#}")));
        let r: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_default();
        if r.is_null() || r["ops_failed"] != 0 {
            self.failures.push(format!(
                "{name} {label} on cuda (exit {code:?}): {} failed ops {}",
                r["ops_failed"],
                tail(&err, 6)
            ));
        }
        r
    }

    /// The summary, written to `$OUT` and printed with every failure; an error where a check
    /// failed.
    fn finish(self) -> Result<()> {
        let failures = &self.failures;
        println!(
            "== gpu-check: {} in {:.0} s",
            match (failures.len(), self.skipped.len()) {
                (0, 0) => "all checks passed".to_string(),
                (0, k) => format!("all checks run passed, {k} not run for want of time"),
                (n, _) => format!("{n} failed"),
            },
            self.t0.elapsed().as_secs_f64()
        );
        for f in failures {
            println!("  FAILED {f}");
        }
        for s in &self.skipped {
            println!("  SKIPPED {s}");
        }
        // Written after the summary is printed: a failed write loses neither.
        if let Err(e) = self.write_summary() {
            println!("  could not write the summary: {e:#}");
        }
        if failures.is_empty() {
            Ok(())
        } else {
            bail!("{} GPU checks failed", failures.len())
        }
    }
}

/// A fidelity card (`compare --json`'s `card`) as aligned lines: figure, original, replay,
/// ratio; a side not measured reads `-`.
fn card_lines(card: &serde_json::Value) -> Vec<String> {
    let Some(figures) = card.as_object() else {
        return vec!["no card (compare did not report)".into()];
    };
    let num = |v: &serde_json::Value| match v.as_f64() {
        Some(x) if x.abs() >= 1e6 => format!("{x:.4e}"),
        Some(x) => format!("{x:.3}"),
        None => "-".into(),
    };
    let mut out = vec![format!(
        "{:<20} {:>12} {:>12} {:>7}",
        "card", "original", "replay", "ratio"
    )];
    for (name, f) in figures {
        out.push(format!(
            "{name:<20} {:>12} {:>12} {:>7}",
            num(&f["original"]),
            num(&f["replay"]),
            num(&f["ratio"])
        ));
    }
    out
}

/// Prints one public trace's replay on cuda (stage 3): its coverage, time, memory and NVML
/// figures, its costliest ops and its failures; `secs`: how long it ran.
fn print_replay(
    stem: &str,
    secs: f64,
    code: Option<i32>,
    r: &serde_json::Value,
    (ran, sel, coverage): (u64, u64, f64),
) {
    let gpu = &r["gpu"]["measured"]["metrics"];
    let m = |k: &str, f: &str| gpu[k][f].as_f64().unwrap_or(f64::NAN);
    println!(
        "== {stem} on cuda ({:.0} s, exit {code:?}): {ran}/{sel} compute ops ({:.1}%), \
         iteration {:.3} ms by {}, peak allocated {:.1} MiB (arena {:.1} MiB, {:.0}% fragmented)",
        secs,
        100.0 * coverage,
        r["iter_ms"]["median"].as_f64().unwrap_or(f64::NAN),
        r["timing"].as_str().unwrap_or("?"),
        r["cuda_memory"]["allocator"]["peak_allocated_bytes"]
            .as_f64()
            .unwrap_or(0.0)
            / 1048576.0,
        r["cuda_memory"]["arena_bytes"].as_f64().unwrap_or(0.0) / 1048576.0,
        100.0 * r["cuda_memory"]["fragmentation"].as_f64().unwrap_or(0.0),
    );
    println!(
        "   NVML: {} samples, {} in the measured iterations (a short run may have none: \
         NaN); SM util mean {:.0}% max {:.0}%; power mean {:.0} W max {:.0} W; \
         SM clock p50 {:.0} MHz; memory used max {:.0} MiB{}",
        r["gpu"]["samples"].as_u64().unwrap_or(0),
        r["gpu"]["measured"]["samples"].as_u64().unwrap_or(0),
        m("sm_util", "mean"),
        m("sm_util", "max"),
        m("power", "mean"),
        m("power", "max"),
        m("sm_clock", "p50"),
        m("mem_used", "max"),
        r["gpu_unavailable"]
            .as_str()
            .map(|s| format!(" (unavailable: {s})"))
            .unwrap_or_default()
    );
    for o in r["ops"].as_array().into_iter().flatten().take(5) {
        println!(
            "   {:>10.3} ms {:>5}x  gpu {:>9.1} us  launch {:>8.1} us  {}",
            o["total_ms"].as_f64().unwrap_or(0.0),
            o["count"],
            o["mean_us"].as_f64().unwrap_or(0.0),
            o["launch_us"].as_f64().unwrap_or(0.0),
            o["op"].as_str().unwrap_or("")
        );
    }
    for f in r["failures"].as_array().into_iter().flatten().take(5) {
        println!(
            "   failed {}x {}: {}",
            f["count"],
            f["op"].as_str().unwrap_or(""),
            f["reason"].as_str().unwrap_or("")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::card_lines;

    #[test]
    fn a_card_prints_one_line_per_figure_with_unmeasured_sides_as_dashes() {
        let card = serde_json::json!({
            "iteration_ms": {"original": 2.5, "replay": 2.0, "ratio": 0.8, "basis": "b"},
            "peak_memory_bytes": {"original": 3.0e8, "replay": null, "ratio": null, "basis": "b"},
        });
        let lines = card_lines(&card);
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("card"));
        let it = lines
            .iter()
            .find(|l| l.starts_with("iteration_ms"))
            .unwrap();
        assert!(it.contains("2.500") && it.contains("0.800"), "{it}");
        let mem = lines.iter().find(|l| l.starts_with("peak_memory")).unwrap();
        assert!(
            mem.contains("3.0000e8") && mem.trim_end().ends_with('-'),
            "{mem}"
        );
        assert_eq!(card_lines(&serde_json::Value::Null).len(), 1);
    }
}
