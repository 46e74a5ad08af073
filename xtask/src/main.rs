//! Project automation: `cargo xtask setup | test | bench parse | inspect-example`.
//!
//! `setup` installs PyPI `torch==2.11.0` (the libtorch that `tch =0.24.0` expects) once into a
//! per-user cache, links it as `.libtorch` in the checkout (which `.cargo/config.toml` points
//! `LIBTORCH` at), and builds the release `mystique` binary with an rpath to it.

mod fidelity;
mod gpu_check;
mod results;
mod wheel;

use anyhow::{bail, Context, Result};
// The benches and the fidelity report (as `crate::median`) share the one definition.
use metrics::median;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

const TORCH: &str = "torch==2.11.0";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // `--help` asks for the usage, wherever it comes (`cargo xtask fidelity --help`), except
    // where the arguments go on to another program (replay's to mystique, test's to cargo).
    let help = args.first() == Some(&"help")
        || (!matches!(args.first(), Some(&"replay" | &"test"))
            && args.iter().any(|a| matches!(*a, "--help" | "-h")));
    if help {
        // Not `println!`: piped into `head`, a closed stdout is no error of the usage's.
        use std::io::Write;
        let _ = writeln!(std::io::stdout().lock(), "{}", usage());
        return Ok(());
    }
    match args.as_slice() {
        ["setup"] => setup().map(|_| ()),
        ["test", rest @ ..] => test(rest),
        ["bench", "parse", rest @ ..] => bench_parse(rest),
        ["bench", "comms", rest @ ..] => bench_comms(rest),
        ["bench", "world", rest @ ..] => bench_world(rest),
        ["example"] => example(),
        ["wheel"] => wheel::build().map(|_| ()),
        ["wheel", "--check"] => wheel::check(),
        ["replay", rest @ ..] => replay(rest),
        ["fidelity", rest @ ..] => fidelity(rest),
        ["bench-ops", rest @ ..] => bench_ops(rest),
        ["gpu-check", rest @ ..] => gpu_check::main(rest, &root(), &shared()),
        ["results", rest @ ..] => results::main(rest),
        _ => {
            eprintln!("{}", usage());
            std::process::exit(2)
        }
    }
}

/// What `cargo xtask` does, command by command.
fn usage() -> String {
    format!(
        "usage: cargo xtask <command>\n\n\
             setup          install libtorch (PyPI {TORCH}) into the user cache, build target/release/mystique\n\
             example        setup, then inspect and replay the bundled example trace\n\
             replay TRACE [ARGS]  setup, then mystique replay TRACE ARGS (e.g. --iters 20 --json)\n\
             test [ARGS]    setup, then run every test of the workspace (ARGS go to cargo test) and check the wheel\n\
             wheel [--check]  build the mystique-rs wheel (pip install target/wheels/mystique_rs-*.whl); --check: install it in a fresh venv and capture, replay, package there (part of test)\n\
             bench parse    parse throughput and peak RSS on a >= 200 MB trace vs Python json.load\n\
             bench comms [ROUNDS]  collectives replayed over Gloo vs the same issued by PyTorch, loopback\n\
             bench world [N...]  compose world --chakra: time and peak memory for N ranks (default 1024 8192) from small captures\n\
             fidelity --memory [--models a,b]  each zoo model's peak memory per iteration, replay over original (the CPU allocator's bytes over the iteration's start), frees following a profile_memory profile and at last use\n\
             fidelity [N] [--models a,b] [--block-ms MS] [--round-parts K] [--svg P] [--busy-host | --throttled-host] [--glibc-heap-defaults] [--capture timing|linked|linked-memory] [--against BIN [--against-capture timing|linked|linked-memory] [--against-zoo DIR]]  replay vs original over the model zoo (captured once, cached), N rounds of paired blocks of about MS ms (defaults: 100 rounds, 50 ms; --round-parts K: the rounds in K parts, each in processes started anew, default 1); gaps from the profile taken without the execution trace observer (--capture linked: from the linked pair; linked-memory: from a linked pair taken with profile_memory too, captured where missing); --busy-host: replay and time the original beside one CPU burner per core; --throttled-host: under a CPU quota of 5 ms per 10 ms (a cgroup, as a container's CPU limit); the zoo's Python runs with the replay's glibc heap settings (--glibc-heap-defaults: the original with glibc's defaults); --against BIN: A/B, another build's mystique (and capture) on the quiet captures in place of the busy ones, paired in the same rounds (--against-zoo DIR: its quiet captures from another zoo cache, e.g. one an older zoo.py captured; --against-args 'ARGS': its replays' extra arguments, {{reference}} standing for each model's quiet reference)\n\
             bench-ops TRACE [--top N] [--filter REGEX] [--kineto K]  a criterion benchmark per op signature (top 10)\n\
             gpu-check [prepare | run] [--dir DIR]  bundle (prepare) and run (run) the CUDA checks: GPU tests, public GPU traces on cuda, NVML\n\
             results [--run NAMES] [--rounds N]  write docs/results.md from the measurements saved under target/mystique-results/ (fidelity and bench parse save theirs); --run fidelity,fidelity-throttled,fidelity-busy,fidelity-memory,parse,dispatch: measure those first (dispatch: the criterion dispatch benchmark), --rounds N: the fidelity and parse rounds"
    )
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("MYSTIQUE_LIBTORCH_CACHE") {
        return PathBuf::from(d);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| root().join("target"));
    base.join("mystique")
}

fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("could not start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Installs libtorch once (idempotent), links `.libtorch`, returns the torch package dir.
fn install_libtorch() -> Result<PathBuf> {
    let dir = cache_dir().join("torch-2.11.0");
    let marker = dir.join(".mystique-complete");
    if marker.exists() {
        eprintln!("[setup] libtorch: {} (cached)", dir.display());
    } else {
        eprintln!(
            "[setup] installing PyPI {TORCH} into {} (about 4.5 GB, once per user)...",
            dir.display()
        );
        let t = Instant::now();
        pip_install_into(&dir, TORCH, &["--progress-bar", "on"]).context(
            "pip install of libtorch failed; is python3 with pip available and PyPI reachable?",
        )?;
        eprintln!(
            "[setup] libtorch installed in {:.0} s",
            t.elapsed().as_secs_f64()
        );
    }
    let torch = dir.join("torch");
    if !torch.join("lib").join("libtorch_cpu.so").exists() {
        bail!(
            "{} has no lib/libtorch_cpu.so; remove {} and run `cargo xtask setup` again",
            torch.display(),
            dir.display()
        );
    }
    let link = root().join(".libtorch");
    let current = std::fs::read_link(&link).ok();
    if current.as_deref() != Some(dir.as_path()) {
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&dir, &link)
            .with_context(|| format!("linking {}", link.display()))?;
    }
    Ok(torch)
}

/// fbgemm_gpu's CPU operators (PyPI `fbgemm-gpu-cpu`, the build that matches torch 2.11's ABI),
/// for replaying DLRM-style traces with `--load-library`. Installed once beside libtorch.
const FBGEMM: &str = "fbgemm-gpu-cpu==1.6.0";

fn install_fbgemm() -> Result<PathBuf> {
    let dir = cache_dir().join("fbgemm-gpu-cpu-1.6.0");
    let marker = dir.join(".mystique-complete");
    if !marker.exists() {
        eprintln!("[setup] installing PyPI {FBGEMM} (custom ops for DLRM traces)...");
        pip_install_into(&dir, FBGEMM, &["--no-deps", "-q"])?;
    }
    Ok(dir.join("fbgemm_gpu"))
}

/// `pip install --target` into a temporary folder renamed into place, then marked complete: an
/// interrupted install is never mistaken for a finished one.
fn pip_install_into(dir: &std::path::Path, package: &str, extra: &[&str]) -> Result<()> {
    let tmp = dir.with_extension(format!("partial-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    run(Command::new(python())
        .args([
            "-m",
            "pip",
            "install",
            "--no-compile",
            "--disable-pip-version-check",
        ])
        .args(extra)
        .arg("--target")
        .arg(&tmp)
        .arg(package))?;
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::rename(&tmp, dir)?;
    std::fs::write(dir.join(".mystique-complete"), package)?;
    Ok(())
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

fn setup() -> Result<PathBuf> {
    install_libtorch()?;
    eprintln!(
        "[setup] building target/release/mystique (the first build compiles torch-sys: minutes)..."
    );
    run(cargo().args(["build", "--release", "-p", "mystique-cli"]))?;
    let bin = root().join("target/release/mystique");
    // The binary must start from anywhere with no environment: rpath, not LD_LIBRARY_PATH.
    let out = Command::new(&bin)
        .arg("env")
        .env_clear()
        .current_dir(std::env::temp_dir())
        .output()?;
    if !out.status.success() {
        bail!(
            "{} does not start without environment: {}",
            bin.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    eprintln!(
        "[setup] ok: {} ({})",
        bin.display(),
        String::from_utf8_lossy(&out.stdout).trim()
    );
    Ok(bin)
}

fn example() -> Result<()> {
    let bin = setup()?;
    let trace = root().join("examples/traces/mlp.et.json.gz");
    run(Command::new(&bin)
        .arg("inspect")
        .arg(&trace)
        .args(["--top", "8"]))?;
    println!();
    run(Command::new(&bin)
        .arg("replay")
        .arg(&trace)
        .args(["--threads", "1"]))
}

/// `cargo xtask replay TRACE [ARGS]`: libtorch set up if needed, the binary built, then the
/// replay run with the given arguments (relative paths are the caller's: cargo runs xtask from
/// the workspace root, so they are resolved against the directory cargo was started in).
fn replay(args: &[&str]) -> Result<()> {
    if args.is_empty() {
        bail!("usage: cargo xtask replay TRACE [ARGS]  (the arguments of `mystique replay`)");
    }
    let bin = setup()?;
    let cwd = std::env::current_dir()?;
    let status = Command::new(&bin)
        .arg("replay")
        .args(args)
        .current_dir(&cwd)
        .status()
        .with_context(|| format!("starting {}", bin.display()))?;
    std::process::exit(status.code().unwrap_or(2))
}

fn test(extra: &[&str]) -> Result<()> {
    setup()?;
    let t = Instant::now();
    run(cargo().args(["fmt", "--all", "--check"]))
        .context("cargo fmt --check: run `cargo fmt --all`")?;
    // The public DLRM trace's fbgemm ops replay with fbgemm's CPU library loaded: make that
    // test mandatory here, where the library is installed.
    let fbgemm = install_fbgemm()?;
    // Release profile: the release build of torch-sys from setup is reused, not rebuilt.
    run(cargo()
        .args(["test", "--workspace", "--release"])
        .args(extra)
        .env("MYSTIQUE_FBGEMM_DIR", &fbgemm))?;
    // The CUDA backend compiles away: the replay crate without its `cuda` feature (the stub
    // runtime) still builds.
    run(cargo().args([
        "check",
        "--release",
        "-p",
        "replay",
        "--no-default-features",
    ]))
    .context("the replay crate without its cuda feature")?;
    // The downstream example (et-graph alone) builds and answers on the bundled trace.
    let out = cargo()
        .args(["run", "-q", "--release", "-p", "et-graph-opmix", "--"])
        .arg(root().join("examples/traces/mlp.et.json.gz"))
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !text.contains("aten::") {
        bail!(
            "examples/opmix failed: {}{}",
            text,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The wheel: built, installed in a fresh environment, capturing and replaying there.
    wheel::check().context("the wheel's check")?;
    eprintln!(
        "[test] all tests passed in {:.0} s",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

fn shared() -> PathBuf {
    root().join("../shared")
}

/// `cargo xtask bench parse [ROUNDS]`: each scaled trace (one from the transformer, one from
/// DLRM: their op mixes differ) parsed by `parse-bench` (parser only, and its peak RSS), by
/// `mystique inspect` end to end (process start to summary printed, as a user runs it), and by
/// Python's `json.load`, alternating in each round; medians of the rounds. Also the parsers
/// per record on one thread (`record-bench`: the record reader, the serde_json visitors,
/// simd-json), and the goals of issue 10 checked on the end-to-end figures.
fn bench_parse(args: &[&str]) -> Result<()> {
    let rounds: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(3);
    run(cargo().args([
        "build",
        "--release",
        "-q",
        "-p",
        "mystique-benches",
        "--bin",
        "parse-bench",
        "--bin",
        "record-bench",
    ]))?;
    // End to end: the release CLI (built by `cargo xtask setup`, not here: it links libtorch).
    let cli = root().join("target/release/mystique");
    let cli = cli.exists().then_some(cli);
    let (mut failed, mut traces) = (Vec::new(), Vec::new());
    for (model, src) in [
        ("transformer", "traces/cpu/transformer.et.json.gz"),
        ("dlrm", "traces/cpu/dlrm.et.json"),
    ] {
        let big = root().join(format!("target/bench/scaled-210mb-{model}.et.json"));
        if !big.exists() {
            std::fs::create_dir_all(big.parent().unwrap())?;
            eprintln!(
                "[bench] making a 210 MB trace from {model} with shared/tools/scale_trace.py ..."
            );
            run(Command::new(python())
                .arg(shared().join("tools/scale_trace.py"))
                .arg(shared().join(src))
                .arg(&big)
                .arg("210"))?;
        }
        let (missed, figures) = bench_parse_one(&big, rounds, cli.as_deref())?;
        failed.extend(missed);
        traces.push(figures);
    }
    if failed.is_empty() {
        println!("\nall goals met (end to end: >= 300 MB/s, >= 25x json.load, peak RSS <= 1.5x the file)");
    } else {
        println!("\ngoals not met: {}", failed.join("; "));
    }
    let saved = results::save(
        "parse",
        &format!("cargo xtask bench parse {rounds}"),
        serde_json::json!({"measurement": "parse", "rounds": rounds, "traces": traces}),
    )?;
    eprintln!(
        "[bench] saved {} for `cargo xtask results`",
        saved.display()
    );
    Ok(())
}

/// One trace of [`bench_parse`]; returns the goals it missed and its figures
/// ([`ParseTimes::figures`]).
fn bench_parse_one(
    big: &std::path::Path,
    rounds: usize,
    cli: Option<&std::path::Path>,
) -> Result<(Vec<String>, serde_json::Value)> {
    let size = std::fs::metadata(big)?.len() as f64;
    let mut t = ParseTimes::default();
    for round in 0..rounds {
        // Alternate the order so that machine drift hits all alike.
        let mut steps: Vec<&str> = vec!["parser", "python", "cli", "records"];
        if round % 2 == 1 {
            steps.reverse();
        }
        let mut nodes = None;
        for step in steps {
            match step {
                "parser" => t.parser(big, &mut nodes)?,
                "python" => t.python(big, &mut nodes)?,
                "records" => t.records(big)?,
                _ => {
                    let Some(cli) = cli else { continue };
                    t.cli(cli, big, &mut nodes)?;
                }
            }
        }
        eprintln!(
            "[bench] {} round {}: parser {:.3} s, json.load {:.3} s{}",
            big.display(),
            round + 1,
            t.ours[round],
            t.py_s[round],
            t.e2e
                .get(round)
                .map(|e| format!(", mystique inspect {e:.3} s"))
                .unwrap_or_default()
        );
    }
    Ok((t.report(big, size, rounds, cli), t.figures(big, size)))
}

/// What [`bench_parse_one`]'s rounds measured, a value per round: seconds and peak RSS bytes.
#[derive(Default)]
struct ParseTimes {
    /// `parse-bench`: read + parse, its peak RSS, and graph building.
    ours: Vec<f64>,
    rss: Vec<f64>,
    graph: Vec<f64>,
    /// Python's `json.load` and its peak RSS.
    py_s: Vec<f64>,
    py_rss: Vec<f64>,
    /// `mystique inspect --json` end to end and its peak RSS (where GNU time measures it).
    e2e: Vec<f64>,
    e2e_rss: Vec<f64>,
    /// `record-bench`: each record parser's time.
    records: std::collections::BTreeMap<String, Vec<f64>>,
}

impl ParseTimes {
    /// One round of `parse-bench` (the parser alone).
    fn parser(
        &mut self,
        big: &std::path::Path,
        nodes: &mut Option<serde_json::Value>,
    ) -> Result<()> {
        let o = Command::new(root().join("target/release/parse-bench"))
            .arg(big)
            .output()?;
        if !o.status.success() {
            bail!("parse-bench failed: {}", String::from_utf8_lossy(&o.stderr));
        }
        let j: serde_json::Value = serde_json::from_slice(&o.stdout)?;
        self.ours
            .push(j["read_s"].as_f64().unwrap_or(0.0) + j["parse_s"].as_f64().unwrap_or(f64::NAN));
        self.rss.push(j["peak_rss"].as_f64().unwrap_or(0.0));
        self.graph.push(j["graph_s"].as_f64().unwrap_or(f64::NAN));
        check_nodes(nodes, &j["nodes"], "parse-bench")
    }

    /// One round of Python's `json.load`.
    fn python(
        &mut self,
        big: &std::path::Path,
        nodes: &mut Option<serde_json::Value>,
    ) -> Result<()> {
        let py = "import json,sys,time,resource\nt=time.perf_counter()\nd=json.load(open(sys.argv[1]))\ns=time.perf_counter()-t\nprint(json.dumps({'s':s,'rss':resource.getrusage(resource.RUSAGE_SELF).ru_maxrss*1024,'nodes':len(d['nodes'])}))";
        let p = Command::new(python()).arg("-c").arg(py).arg(big).output()?;
        if !p.status.success() {
            bail!(
                "python json.load failed: {}",
                String::from_utf8_lossy(&p.stderr)
            );
        }
        let pj: serde_json::Value = serde_json::from_slice(&p.stdout)?;
        self.py_s.push(pj["s"].as_f64().unwrap_or(f64::NAN));
        self.py_rss.push(pj["rss"].as_f64().unwrap_or(0.0));
        check_nodes(nodes, &pj["nodes"], "json.load")
    }

    /// One round of `record-bench` (each record parser on one thread).
    fn records(&mut self, big: &std::path::Path) -> Result<()> {
        let o = Command::new(root().join("target/release/record-bench"))
            .arg(big)
            .output()?;
        if !o.status.success() {
            bail!(
                "record-bench failed: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        let j: serde_json::Value = serde_json::from_slice(&o.stdout)?;
        for r in j["rows"].as_array().into_iter().flatten() {
            self.records
                .entry(r["mode"].as_str().unwrap_or("?").to_string())
                .or_default()
                .push(r["s"].as_f64().unwrap_or(f64::NAN));
        }
        Ok(())
    }

    /// One round of `mystique inspect --json` end to end, its peak RSS from GNU time's %M
    /// (KiB), written to a file apart from stderr, where `/usr/bin/time` exists.
    fn cli(
        &mut self,
        cli: &std::path::Path,
        big: &std::path::Path,
        nodes: &mut Option<serde_json::Value>,
    ) -> Result<()> {
        let gnu_time = std::path::Path::new("/usr/bin/time");
        let gnu_time = gnu_time.exists().then_some(gnu_time);
        let time_out = root().join("target/bench/inspect.time");
        let mut cmd = match gnu_time {
            Some(time) => {
                let _ = std::fs::remove_file(&time_out);
                let mut c = Command::new(time);
                c.args(["-f", "%e %M", "-o"]).arg(&time_out).arg(cli);
                c
            }
            None => Command::new(cli),
        };
        cmd.args(["inspect", "--json"]).arg(big);
        let t = Instant::now();
        let out = cmd.output()?;
        self.e2e.push(t.elapsed().as_secs_f64());
        if !out.status.success() {
            bail!(
                "{} inspect --json failed: {}",
                cli.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let j: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        check_nodes(nodes, &j["nodes"], "mystique inspect")?;
        if gnu_time.is_some() {
            let kib = std::fs::read_to_string(&time_out)
                .ok()
                .and_then(|s| s.split_whitespace().nth(1)?.parse::<f64>().ok());
            if let Some(kib) = kib {
                self.e2e_rss.push(kib * 1024.0);
            }
        }
        Ok(())
    }

    /// The medians of the rounds as JSON for `cargo xtask results` (seconds, bytes; null where
    /// not measured: no CLI, or no GNU time for its peak RSS), with the file's `size` in bytes.
    fn figures(&self, big: &std::path::Path, size: f64) -> serde_json::Value {
        let records: serde_json::Map<String, serde_json::Value> = self
            .records
            .iter()
            .map(|(mode, v)| (mode.clone(), serde_json::json!(median(v))))
            .collect();
        let e2e_rss = if self.e2e_rss.len() == self.e2e.len() {
            median(&self.e2e_rss)
        } else {
            f64::NAN
        };
        serde_json::json!({
            "trace": big.file_name().unwrap_or_default().to_string_lossy(),
            "bytes": size,
            "inspect_s": median(&self.e2e), "inspect_peak_rss": e2e_rss,
            "parser_s": median(&self.ours), "parser_peak_rss": median(&self.rss),
            "graph_s": median(&self.graph),
            "json_load_s": median(&self.py_s), "json_load_peak_rss": median(&self.py_rss),
            "records_s": records,
        })
    }

    /// Prints the medians of the rounds against the file's `size` (bytes) and `json.load`;
    /// returns the goals missed.
    fn report(
        &self,
        big: &std::path::Path,
        size: f64,
        rounds: usize,
        cli: Option<&std::path::Path>,
    ) -> Vec<String> {
        let (o, r, p, pr) = (
            median(&self.ours),
            median(&self.rss),
            median(&self.py_s),
            median(&self.py_rss),
        );
        let mb = size / 1e6;
        println!(
            "\nparse benchmark: {} ({mb:.0} MB), median of {rounds} rounds, order alternating",
            big.display()
        );
        let mut failed = vec![];
        let name = big
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        match cli {
            Some(_) => {
                let e = median(&self.e2e);
                println!(
                    "  mystique inspect, end to end   {e:>7.3} s  {:>5.0} MB/s  {:>5.1}x json.load",
                    mb / e,
                    p / e
                );
                if mb / e < 300.0 {
                    failed.push(format!("{name}: {:.0} MB/s end to end", mb / e));
                }
                if p / e < 25.0 {
                    failed.push(format!("{name}: {:.1}x json.load end to end", p / e));
                }
                if self.e2e_rss.len() == self.e2e.len() {
                    let r = median(&self.e2e_rss);
                    println!(
                        "    peak RSS                     {:>7.0} MB = {:.2}x the file",
                        r / 1e6,
                        r / size
                    );
                    if r / size > 1.5 {
                        failed.push(format!("{name}: peak RSS {:.2}x the file", r / size));
                    }
                } else {
                    println!("    peak RSS not measured (no /usr/bin/time)");
                }
            }
            None => println!(
                "  mystique inspect (end to end): skipped, {} is missing: run `cargo xtask setup`",
                root().join("target/release/mystique").display()
            ),
        }
        println!(
            "  et-schema read + parse         {o:>7.3} s  {:>5.0} MB/s  {:>5.1}x json.load   peak RSS {:.0} MB = {:.2}x the file",
            mb / o,
            p / o,
            r / 1e6,
            r / size
        );
        println!(
            "  python json.load               {p:>7.3} s  {:>5.0} MB/s                   peak RSS {:.0} MB = {:.2}x the file",
            mb / p,
            pr / 1e6,
            pr / size
        );
        let gs = median(&self.graph);
        println!(
            "  graph + replay set + tensor analysis {gs:.3} s = {:.2}x the parse time",
            gs / o
        );
        println!("  per node record, one thread, the same records (scan not included):");
        for (mode, v) in &self.records {
            let s = median(v);
            println!("    {mode:<32} {s:>7.3} s  {:>5.0} MB/s", mb / s);
        }
        failed
    }
}

/// The node count every reader of one file must agree on.
fn check_nodes(
    seen: &mut Option<serde_json::Value>,
    n: &serde_json::Value,
    who: &str,
) -> Result<()> {
    match seen {
        Some(s) if s != n => bail!("node counts differ: {who} read {n}, another {s}"),
        Some(_) => Ok(()),
        None => {
            *seen = Some(n.clone());
            Ok(())
        }
    }
}

fn fidelity(args: &[&str]) -> Result<()> {
    let bin = setup()?;
    fidelity::run(
        args,
        &root(),
        &cache_dir(),
        &bin,
        &cache_dir().join("torch-2.11.0"),
    )
}

/// `cargo xtask bench world [N ...]`: `mystique compose world --chakra --astra-sim` from small
/// captures to N ranks (by default 1,024 and 8,192): wall time, peak RSS (GNU time's %M, where
/// `/usr/bin/time` exists) and bytes written, for a job whose rank traces keep their size at
/// any world (the 8-rank tensor-parallel all-reduces of `tests/data/tp_w8`) and for the shared
/// 2-rank DDP job, whose all-gather takes one buffer per rank (each rank's trace grows with N,
/// so the job with N², and it is timed up to 2,048 ranks).
fn bench_world(args: &[&str]) -> Result<()> {
    setup()?;
    let sizes: Vec<usize> = if args.is_empty() {
        vec![1024, 8192]
    } else {
        args.iter()
            .map(|a| {
                a.parse()
                    .with_context(|| format!("{a:?} is not a number of ranks"))
            })
            .collect::<Result<_>>()?
    };
    let bin = root().join("target/release/mystique");
    let jobs = [
        (
            "tp_w8 (8 ranks, all-reduces)",
            root()
                .join("crates/cli/tests/data/tp_w8")
                .display()
                .to_string(),
            usize::MAX,
        ),
        (
            "dist_mlp_w2 (2 ranks, DDP with an all-gather)",
            shared()
                .join("traces/cpu/dist_mlp_w2.rank*.et.json")
                .display()
                .to_string(),
            2048,
        ),
    ];
    let gnu_time = std::path::Path::new("/usr/bin/time");
    println!(
        "{:<48} {:>6} {:>9} {:>12} {:>12} {:>12}",
        "capture", "ranks", "seconds", "ms per rank", "peak RSS MB", "written MB"
    );
    for (label, spec, most) in &jobs {
        for &n in sizes.iter().filter(|&&n| n <= *most) {
            let out = std::env::temp_dir()
                .join(format!("mystique-bench-world-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&out);
            let rss_file = out.with_extension("rss");
            let mut cmd = if gnu_time.exists() {
                let mut c = Command::new(gnu_time);
                c.args(["-f", "%M", "-o"]).arg(&rss_file).arg(&bin);
                c
            } else {
                Command::new(&bin)
            };
            cmd.args([
                "compose",
                "world",
                spec,
                "--world",
                &n.to_string(),
                "--chakra",
            ])
            .args(["--astra-sim", "--json", "-o"])
            .arg(&out);
            let t = Instant::now();
            let o = cmd.output()?;
            let secs = t.elapsed().as_secs_f64();
            if !o.status.success() {
                bail!(
                    "compose world {n} failed: {}",
                    String::from_utf8_lossy(&o.stderr)
                );
            }
            let j: serde_json::Value = serde_json::from_slice(&o.stdout)?;
            let rss = std::fs::read_to_string(&rss_file)
                .ok()
                .and_then(|s| s.trim().lines().last()?.parse::<f64>().ok())
                .map_or("-".to_string(), |k| format!("{:.0}", k / 1024.0));
            println!(
                "{label:<48} {n:>6} {secs:>9.2} {:>12.2} {rss:>12} {:>12.1}",
                secs * 1000.0 / n as f64,
                j["bytes_written"].as_f64().unwrap_or(0.0) / 1e6
            );
            let _ = std::fs::remove_dir_all(&out);
            let _ = std::fs::remove_file(&rss_file);
        }
    }
    Ok(())
}

/// `cargo xtask bench comms [ROUNDS]`: the collectives of a replay against the same collectives
/// issued by PyTorch (`xtask/scripts/comms_bench.py`: torch.distributed, gloo, 2 ranks on
/// loopback), per op and message size, in the same run, the order alternating each round. The
/// script also records the traces the replay runs (`mystique replay --ranks --only comm`).
fn bench_comms(args: &[&str]) -> Result<()> {
    let rounds: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(3);
    let bin = setup()?;
    let torch_py = cache_dir().join("torch-2.11.0");
    let script = root().join("xtask/scripts/comms_bench.py");
    let ops = [
        ("all_reduce", "c10d::allreduce_"),
        ("broadcast", "c10d::broadcast_"),
        ("all_gather", "c10d::allgather_"),
        ("all_to_all", "c10d::alltoall_base_"),
    ];
    let (world, iters) = (2, 20);
    println!(
        "comms benchmark: {world} ranks, gloo on loopback, {iters} timed calls per op; median over {rounds} rounds (order alternating)"
    );
    println!(
        "{:>9} {:<11} {:>11} {:>11} {:>10} {:>10} {:>7}",
        "size", "op", "pytorch us", "replay us", "pt busbw", "rp busbw", "ratio"
    );
    // nccl-tests' convention: the message size S (an all-gather's whole output, an
    // all-to-all's whole input) and the factor from algorithm to bus bandwidth.
    let w = world as f64;
    let convention = [
        (1.0, 2.0 * (w - 1.0) / w),
        (1.0, 1.0),
        (w, (w - 1.0) / w),
        (w, (w - 1.0) / w),
    ];
    for size in [64usize << 10, 1 << 20, 8 << 20] {
        let dir = root().join(format!("target/bench/comms-{size}"));
        let mut pt: Vec<Vec<f64>> = vec![Vec::new(); ops.len()];
        let mut ours: Vec<Vec<f64>> = vec![Vec::new(); ops.len()];
        // The replay's own busbw figure (GB/s), per op and round.
        let mut ours_bus: Vec<Vec<f64>> = vec![Vec::new(); ops.len()];
        let python = |pt: &mut Vec<Vec<f64>>| -> Result<()> {
            let o = Command::new(python())
                .arg(&script)
                .arg(&dir)
                .args([world.to_string(), size.to_string(), iters.to_string()])
                .env("PYTHONPATH", &torch_py)
                .stderr(std::process::Stdio::null())
                .output()?;
            let line = String::from_utf8_lossy(&o.stdout);
            let j: serde_json::Value = serde_json::from_str(line.lines().last().unwrap_or("{}"))
                .with_context(|| format!("comms_bench.py: {line}"))?;
            for (k, (name, _)) in ops.iter().enumerate() {
                pt[k].push(j["us"][name].as_f64().unwrap_or(f64::NAN));
            }
            Ok(())
        };
        let replay = |ours: &mut Vec<Vec<f64>>, bus: &mut Vec<Vec<f64>>| -> Result<()> {
            let o = Command::new(&bin)
                .args(["replay", "--ranks"])
                .arg(&dir)
                .args([
                    "--only",
                    "comm",
                    "--json",
                    "--threads",
                    "1",
                    "--warmup",
                    "3",
                ])
                .args(["--iters", &iters.to_string()])
                .stderr(std::process::Stdio::null())
                .output()?;
            if !o.status.success() {
                bail!("replay --ranks {} failed", dir.display());
            }
            let j: serde_json::Value = serde_json::from_slice(&o.stdout)?;
            for (k, (kind, _)) in ops.iter().enumerate() {
                let c = &j["collectives"][kind];
                let n = c["count"].as_f64().unwrap_or(0.0).max(1.0);
                ours[k].push(c["time_ms"].as_f64().unwrap_or(f64::NAN) * 1000.0 / n);
                bus[k].push(c["busbw_gbps"].as_f64().unwrap_or(f64::NAN));
            }
            Ok(())
        };
        // The first PyTorch run also writes the traces the replay needs.
        python(&mut pt)?;
        pt.iter_mut().for_each(Vec::clear);
        for round in 0..rounds {
            if round % 2 == 0 {
                python(&mut pt)?;
                replay(&mut ours, &mut ours_bus)?;
            } else {
                replay(&mut ours, &mut ours_bus)?;
                python(&mut pt)?;
            }
        }
        for (k, (name, _)) in ops.iter().enumerate() {
            let ratios: Vec<f64> = pt[k].iter().zip(&ours[k]).map(|(p, o)| p / o).collect();
            let (p, o) = (median(&pt[k]), median(&ours[k]));
            let (times, factor) = convention[k];
            let busbw = |us: f64| size as f64 * times * factor / us / 1e3;
            println!(
                "{:>9} {:<11} {:>11.1} {:>11.1} {:>10.3} {:>10.3} {:>7.2}",
                format!("{} KiB", size >> 10),
                name,
                p,
                o,
                busbw(p),
                median(&ours_bus[k]),
                median(&ratios)
            );
        }
    }
    println!("ratio: PyTorch's time / the replay's (above 1: the replay's collective is faster)");
    println!(
        "busbw: GB/s in nccl-tests' convention (S/t times 2(n-1)/n for all_reduce, (n-1)/n for \
         all_gather and all_to_all, 1 for broadcast); PyTorch's from its median time, the \
         replay's as its report gives it"
    );
    Ok(())
}

/// `cargo xtask bench-ops TRACE [--top N] [--filter REGEX] [--kineto K] [-- ARGS]`: libtorch set up
/// if needed, then `cargo bench -p mystique-benches --bench ops` with the trace and options in
/// its environment (see benches/benches/ops.rs); ARGS go to criterion (e.g. `--save-baseline
/// old`, `--baseline old`). Relative paths are the caller's.
fn bench_ops(args: &[&str]) -> Result<()> {
    const USAGE: &str =
        "usage: cargo xtask bench-ops TRACE [--top N] [--filter REGEX] [--kineto K] [-- CRITERION ARGS]";
    let (ours, criterion) = match args.iter().position(|a| *a == "--") {
        Some(k) => (&args[..k], &args[k + 1..]),
        None => (args, &[][..]),
    };
    let cwd = std::env::current_dir()?;
    let path = |p: &str| -> Result<PathBuf> {
        let p = cwd.join(p);
        std::fs::canonicalize(&p).with_context(|| format!("{}", p.display()))
    };
    let mut bench = cargo();
    bench.args(["bench", "-p", "mystique-benches", "--bench", "ops"]);
    // Only what this command says: no option inherited from the caller's environment.
    for k in [
        "MYSTIQUE_BENCH_TOP",
        "MYSTIQUE_BENCH_FILTER",
        "MYSTIQUE_BENCH_KINETO",
    ] {
        bench.env_remove(k);
    }
    let mut trace = None;
    let mut it = ours.iter();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .copied()
                .with_context(|| format!("{a} needs a value\n{USAGE}"))
        };
        match *a {
            "--top" => {
                let n = value()?;
                n.parse::<usize>()
                    .with_context(|| format!("--top {n}: not a number"))?;
                bench.env("MYSTIQUE_BENCH_TOP", n);
            }
            "--filter" => {
                bench.env("MYSTIQUE_BENCH_FILTER", value()?);
            }
            "--kineto" => {
                bench.env("MYSTIQUE_BENCH_KINETO", path(value()?)?);
            }
            t if trace.is_none() && !t.starts_with('-') => trace = Some(path(t)?),
            other => bail!("unexpected argument {other:?}\n{USAGE}"),
        }
    }
    let Some(trace) = trace else { bail!(USAGE) };
    install_libtorch()?;
    bench.env("MYSTIQUE_BENCH_TRACE", &trace);
    if !criterion.is_empty() {
        bench.arg("--").args(criterion);
    }
    run(&mut bench)
}
