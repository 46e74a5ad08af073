//! The `mystique` command line: parses arguments, calls the crates, prints. No logic of its own.

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

mod compose_cmd;
mod graph_cmd;
mod inspect;
mod replay_cmd;

#[derive(Parser)]
#[command(
    name = "mystique",
    version,
    about = "Turn PyTorch execution traces into portable, faithful benchmarks"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// Print one JSON object instead of tables (every command).
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand)]
enum Cmd {
    /// Summarise an execution trace: schema, ops, tensors, devices, iterations, collectives.
    Inspect {
        /// ET file (.json or .json.gz), or - for stdin.
        trace: PathBuf,
        /// How many ops of the histogram to print in the table (all with --json).
        #[arg(long, default_value_t = 25)]
        top: usize,
    },
    /// Graph statistics: replay set, op classes, skipped nodes with reasons, tensors, peak memory.
    Graph {
        trace: PathBuf,
        /// Only these ProfilerStep#N iterations (comma-separated).
        #[arg(long, value_delimiter = ',')]
        iteration: Option<Vec<u64>>,
    },
    /// Link the replay-set ops of an ET to the events of its Kineto trace.
    Link { et: PathBuf, kineto: PathBuf },
    /// Extract a selection of ops (with their subtrees) into a new trace.
    Select {
        trace: PathBuf,
        #[command(flatten)]
        filters: compose_cmd::Filters,
        /// Output trace (.json, .json.gz, or - for stdout).
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Make new traces from existing ones: repeat, concat, scale, dtype, remove.
    Compose {
        #[command(subcommand)]
        op: ComposeOp,
    },
    /// Export a selection as Graphviz DOT (ops and data edges).
    Export {
        trace: PathBuf,
        /// DOT output (the only format for now).
        #[arg(long)]
        dot: bool,
        #[command(flatten)]
        filters: compose_cmd::Filters,
        #[arg(short, long, default_value = "-")]
        output: PathBuf,
    },
    /// Replay the trace's operators for real through libtorch and report coverage and timing.
    Replay(replay_cmd::ReplayArgs),
    /// Replay a linked ET and compare it with its Kineto trace, per op and per iteration.
    Compare(replay_cmd::CompareArgs),
    /// Print the libtorch build this binary runs on and whether CUDA is usable.
    Env,
}

#[derive(Subcommand)]
enum ComposeOp {
    /// Repeat the iteration N times (fresh node ids; parameters are shared across copies).
    Repeat {
        trace: PathBuf,
        n: usize,
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Concatenate traces (ids of later ones shifted).
    Concat {
        #[arg(required = true, num_args = 2..)]
        traces: Vec<PathBuf>,
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Scale every dimension of size DIM by FACTOR (e.g. batch 64 -> 128).
    Scale {
        trace: PathBuf,
        #[arg(long)]
        dim: i64,
        #[arg(long)]
        factor: i64,
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Change an element type everywhere (e.g. --from float32 --to bfloat16).
    Dtype {
        trace: PathBuf,
        #[arg(long)]
        from: String,
        #[arg(long)]
        to: String,
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Remove the selected ops and their subtrees.
    Remove {
        trace: PathBuf,
        #[command(flatten)]
        filters: compose_cmd::Filters,
        #[arg(short, long)]
        output: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // A closed stdout (e.g. `| head`) is not an error worth a message.
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) {
                return ExitCode::SUCCESS;
            }
            eprintln!("error: {e}");
            for cause in e.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    compose_cmd::set_json(cli.json);
    let json = cli.json;
    match cli.cmd {
        Cmd::Inspect { trace, top } => inspect::run(&trace, json, top),
        Cmd::Graph { trace, iteration } => graph_cmd::graph(&trace, json, iteration),
        Cmd::Link { et, kineto } => graph_cmd::link(&et, &kineto, json),
        Cmd::Select {
            trace,
            filters,
            output,
        } => compose_cmd::select(&trace, &filters, &output),
        Cmd::Export {
            trace,
            dot: _,
            filters,
            output,
        } => compose_cmd::export_dot(&trace, &filters, &output),
        Cmd::Compose { op } => match op {
            ComposeOp::Repeat { trace, n, output } => compose_cmd::repeat(&trace, n, &output),
            ComposeOp::Concat { traces, output } => compose_cmd::concat(&traces, &output),
            ComposeOp::Scale {
                trace,
                dim,
                factor,
                output,
            } => compose_cmd::scale(&trace, dim, factor, &output),
            ComposeOp::Dtype {
                trace,
                from,
                to,
                output,
            } => compose_cmd::dtype(&trace, &from, &to, &output),
            ComposeOp::Remove {
                trace,
                filters,
                output,
            } => compose_cmd::remove(&trace, &filters, &output),
        },
        Cmd::Replay(a) => replay_cmd::run(&a, json),
        Cmd::Compare(a) => replay_cmd::compare(&a, json),
        Cmd::Env => {
            println!("{}", replay::env_report());
            Ok(())
        }
    }
}
