//! Per-op regression benchmarks: one criterion benchmark per op signature of a trace (operator,
//! overload, tensor dtypes, shapes and strides, scalar arguments; [`replay::plan::Plan::signature`]),
//! the signatures with the largest share of the time first. Each benchmark runs the op's first
//! step alone, again and again ([`replay::single::SingleStep`]), on inputs made by running the
//! steps before it once. Criterion keeps a baseline per signature, so a libtorch or driver
//! upgrade that slows one op shows up as that op's regression in its report.
//!
//! Configured by environment, so `cargo bench -p mystique-benches --bench ops` needs no edit
//! (`cargo xtask bench-ops TRACE [--top N] [--filter REGEX]` sets them):
//!
//! - `MYSTIQUE_BENCH_TRACE`: the trace (default `../shared/traces/cpu/mlp.et.json`; relative
//!   paths also against the workspace root);
//! - `MYSTIQUE_BENCH_KINETO`: its linked Kineto trace: the share of time is the original run's
//!   (op durations). Without it, a short replay of the trace (per-step medians) gives it;
//! - `MYSTIQUE_BENCH_TOP`: benchmark the N signatures with the most time (default 10; 0: all);
//! - `MYSTIQUE_BENCH_FILTER`: only signatures this regex finds (before the top N);
//! - `MYSTIQUE_BENCH_THREADS`: libtorch intra-op threads (default 1, as the shared traces were
//!   recorded);
//! - `MYSTIQUE_BENCH_SECS`: measurement time per benchmark in seconds (default 1).
//!
//! Benchmark ids are the signature made safe for criterion (`aten::` -> `aten.`, path
//! characters -> `_`), cut to fit criterion's 64-character directory names, and ended by a
//! stable hash of the whole signature, so every signature keeps its own baseline. The table
//! printed first gives each id's full signature, count and share.

use criterion::Criterion;
use replay::executor::{Executor, Outcome};
use replay::single::{OpSignature, SingleStep};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Characters of an id before its hash: criterion cuts directory names at 64.
const ID_TEXT: usize = 54;

struct Config {
    trace: PathBuf,
    kineto: Option<PathBuf>,
    top: usize,
    filter: Option<regex::Regex>,
    threads: i32,
    secs: f64,
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("benches lives in the workspace")
        .to_path_buf()
}

/// A path as given, else against the workspace root (cargo runs benches in `benches/`).
fn resolve(p: &str) -> PathBuf {
    let p = PathBuf::from(p);
    let p = if p.is_absolute() || p.exists() {
        p
    } else {
        workspace().join(p)
    };
    std::fs::canonicalize(&p).unwrap_or(p)
}

fn var(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.is_empty())
}

fn number<T: std::str::FromStr>(k: &str, default: T) -> T {
    match var(k) {
        None => default,
        Some(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{k}={v:?} is not a number")),
    }
}

impl Config {
    fn from_env() -> Config {
        Config {
            trace: resolve(
                &var("MYSTIQUE_BENCH_TRACE")
                    .unwrap_or_else(|| "../shared/traces/cpu/mlp.et.json".into()),
            ),
            kineto: var("MYSTIQUE_BENCH_KINETO").map(|k| resolve(&k)),
            top: number("MYSTIQUE_BENCH_TOP", 10),
            filter: var("MYSTIQUE_BENCH_FILTER").map(|f| {
                regex::Regex::new(&f).unwrap_or_else(|e| panic!("MYSTIQUE_BENCH_FILTER={f:?}: {e}"))
            }),
            threads: number("MYSTIQUE_BENCH_THREADS", 1),
            secs: number("MYSTIQUE_BENCH_SECS", 1.0),
        }
    }
}

/// FNV-1a: a hash that stays the same across builds and Rust versions (ids name baselines).
fn fnv1a(s: &str) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h ^ (h >> 32)) as u32
}

/// The signature as a criterion id: safe as a directory name, unique within its 64 characters.
fn bench_id(signature: &str) -> String {
    let mut text: String = signature
        .replace("::", ".")
        .chars()
        .map(|c| {
            if c.is_whitespace() || "?\"/\\*<>:|^".contains(c) {
                '_'
            } else {
                c
            }
        })
        .collect();
    if text.len() > ID_TEXT {
        let cut = (0..=ID_TEXT).rev().find(|&i| text.is_char_boundary(i));
        text.truncate(cut.unwrap_or(0));
    }
    format!("{text}~{:08x}", fnv1a(signature))
}

/// The trace's name without its extensions: the benchmark group.
fn stem(p: &Path) -> String {
    let name = p
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let name = name.split('.').next().unwrap_or("trace");
    format!("ops-{name}")
}

fn main() {
    let cfg = Config::from_env();
    tch::set_num_threads(cfg.threads);
    let trace = et_schema::read_trace(&cfg.trace)
        .unwrap_or_else(|e| panic!("reading {}: {e}", cfg.trace.display()));
    let g = et_graph::Graph::new(&trace);
    let set = g
        .select(&et_graph::Selection::default())
        .expect("the whole trace is a selection");
    let plan = replay::plan::compile(&g, &set);
    let bound = replay::bind(&plan, &replay::Device::Cpu);

    // Each step's time: the original's (Kineto), else a short replay's.
    let (step_us, source) = match &cfg.kineto {
        Some(k) => {
            let kt = et_schema::kineto::read_kineto(k)
                .unwrap_or_else(|e| panic!("reading {}: {e}", k.display()));
            let link = et_graph::link(&g, &set, &kt)
                .unwrap_or_else(|e| panic!("linking {}: {e}", k.display()));
            let orig = et_graph::original_timing(&link, &kt);
            let us: Vec<f64> = orig.op_us.iter().map(|t| t.unwrap_or(0.0)).collect();
            let linked = orig.op_us.iter().flatten().count();
            (
                us,
                format!(
                    "the original's op durations ({}, {linked} of {} ops linked)",
                    k.display(),
                    plan.steps.len()
                ),
            )
        }
        None => {
            let opts = replay::ReplayOptions {
                warmup: 2,
                iters: 5,
                per_step: true,
                ..Default::default()
            };
            let (report, _) =
                replay::executor::run(&plan, &bound, &opts).expect("the timing replay runs");
            let us = report.steps.iter().map(|s| s.us).collect();
            (
                us,
                format!(
                    "a replay ({} iterations, per-step medians, {} failed ops)",
                    opts.iters, report.ops_failed
                ),
            )
        }
    };

    let all = replay::single::signatures(&plan, &step_us);
    let n_all = all.len();
    let mut chosen: Vec<OpSignature> = all
        .into_iter()
        .filter(|s| cfg.filter.as_ref().is_none_or(|f| f.is_match(&s.signature)))
        .collect();
    if cfg.top > 0 {
        chosen.truncate(cfg.top);
    }
    let group_name = stem(&cfg.trace);
    println!(
        "[bench-ops] {}: {} steps, {n_all} signatures; share of time from {source}; \
         benchmarking {} ({} intra-op thread(s), {} s each)",
        cfg.trace.display(),
        plan.steps.len(),
        chosen.len(),
        cfg.threads,
        cfg.secs
    );
    println!(
        "{:>4} {:>7} {:>6} {:>10}  benchmark {group_name}/<id>, then its signature",
        "#", "share", "count", "total us"
    );
    for (k, s) in chosen.iter().enumerate() {
        println!(
            "{:>4} {:>6.2}% {:>6} {:>10.1}  {}\n{:>31}{}",
            k + 1,
            100.0 * s.share,
            s.steps.len(),
            s.us,
            bench_id(&s.signature),
            "",
            s.signature
        );
    }
    println!();

    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs_f64((cfg.secs / 2.0).max(0.1)))
        .measurement_time(Duration::from_secs_f64(cfg.secs.max(0.1)))
        .sample_size(20)
        .configure_from_args();
    let mut ex = Executor::new(&plan, &bound, true).expect("the external inputs materialise");
    let mut group = c.benchmark_group(&group_name);
    for s in &chosen {
        let id = bench_id(&s.signature);
        let mut one = SingleStep::new(&mut ex, s.steps[0], true);
        match one.run() {
            Outcome::Ran { .. } => {}
            other => {
                println!("[bench-ops] {id}: not benchmarked, the op does not run here: {other:?}");
                continue;
            }
        }
        group.bench_function(&id, |b| b.iter(|| std::hint::black_box(one.run())));
    }
    group.finish();
    c.final_summary();
}
