use crate::inspect::human_bytes;
use anyhow::{Context, Result};
use et_graph::{Graph, Kind, Selection};
use std::io::Write;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    /// ET file (.json, .json.gz, or - for stdin).
    pub trace: PathBuf,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
    /// cpu, cuda or cuda:N. A trace captured on GPU replays on CPU and the reverse.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    #[arg(long, default_value_t = 10)]
    pub iters: usize,
    /// Intra-op threads (default: libtorch's own default).
    #[arg(long)]
    pub threads: Option<i32>,
    /// all | compute | comm.
    #[arg(long, default_value = "all")]
    pub only: Kind,
    /// Only these ProfilerStep#N iterations (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub iteration: Option<Vec<u64>>,
    /// Stop at the first failing op.
    #[arg(long)]
    pub strict: bool,
    /// Write a Chrome/Perfetto trace of the last measured iteration (one slice per op).
    #[arg(long)]
    pub trace_out: Option<PathBuf>,
    /// Load a library of custom operators first (repeatable), like torch.ops.load_library.
    #[arg(long)]
    pub load_library: Vec<PathBuf>,
}

pub fn run(a: &ReplayArgs) -> Result<()> {
    for lib in &a.load_library {
        replay::load_library(lib)?;
    }
    if let Some(n) = a.threads {
        anyhow::ensure!(n > 0, "--threads must be positive");
        tch::set_num_threads(n);
    }
    let device = replay::parse_device(&a.device)?;
    let trace = et_schema::read_trace(&a.trace)?;
    let g = Graph::new(&trace);
    let all = g.select(&Selection {
        iterations: a.iteration.clone(),
        ..Default::default()
    })?;
    let set = g.select(&Selection {
        iterations: a.iteration.clone(),
        kind: a.only,
        ..Default::default()
    })?;
    let opts = replay::ReplayOptions {
        device,
        warmup: a.warmup,
        iters: a.iters,
        only: a.only,
        strict: a.strict,
        trace_out: a.trace_out.clone(),
    };
    if !a.json {
        eprintln!(
            "replaying {} ops x {} warm-up + {} measured iterations on {} ...",
            set.ops.len(),
            a.warmup,
            a.iters.max(1),
            a.device
        );
    }
    let (mut report, slices) = replay::replay(&g, &set, &opts)?;
    report.ops_skipped = all.ops.len() - set.ops.len();
    if let Some(p) = &a.trace_out {
        let f = std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?;
        metrics::write_chrome_trace(
            std::io::BufWriter::new(f),
            &format!("mystique replay of {}", trace.source),
            &slices,
        )?;
    }
    let mut out = std::io::stdout().lock();
    if a.json {
        serde_json::to_writer(&mut out, &report)?;
        writeln!(out)?;
        return Ok(());
    }
    print_table(&mut out, &report, &trace.source)
}

fn print_table(out: &mut impl Write, r: &replay::Report, source: &str) -> Result<()> {
    writeln!(out, "trace      {source}")?;
    writeln!(out, "device     {} ({} threads)", r.device, r.threads)?;
    writeln!(
        out,
        "coverage   {} of {} ops replayed, {} failed{}",
        r.ops_replayed,
        r.ops_selected,
        r.ops_failed,
        if r.ops_skipped > 0 {
            format!(", {} collectives left out", r.ops_skipped)
        } else {
            String::new()
        }
    )?;
    writeln!(
        out,
        "iteration  median {:.3} ms  (min {:.3}, max {:.3}; {} measured)",
        r.iter_ms.median, r.iter_ms.min, r.iter_ms.max, r.iters
    )?;
    writeln!(
        out,
        "overhead   {:.2} us/op of replay bookkeeping",
        r.overhead_us_per_op
    )?;
    writeln!(
        out,
        "memory     peak {} live, {} in {} external inputs",
        human_bytes(r.peak_bytes),
        human_bytes(r.external_bytes),
        r.externals
    )?;
    if !r.failures.is_empty() {
        writeln!(out, "failures")?;
        for f in &r.failures {
            writeln!(out, "  {:>4}x {}: {}", f.count, f.op, f.reason)?;
        }
    }
    if !r.fallbacks.is_empty() {
        writeln!(out, "device fallbacks")?;
        for f in &r.fallbacks {
            writeln!(out, "  {:>4}x {}: {}", f.count, f.op, f.ran_as)?;
        }
    }
    writeln!(out, "top ops by time per iteration")?;
    writeln!(out, "  {:>9} {:>6} {:>9}  op", "ms", "calls", "us/call")?;
    for o in r.ops.iter().take(15) {
        writeln!(
            out,
            "  {:>9.3} {:>6} {:>9.1}  {}",
            o.total_ms, o.count, o.mean_us, o.op
        )?;
    }
    Ok(())
}
