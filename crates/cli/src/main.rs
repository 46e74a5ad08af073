//! The `mystique` command line: parses arguments, calls the crates, prints. No logic of its own.

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

mod graph_cmd;
mod inspect;

#[derive(Parser)]
#[command(
    name = "mystique",
    version,
    about = "Turn PyTorch execution traces into portable, faithful benchmarks"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Summarise an execution trace: schema, ops, tensors, devices, iterations, collectives.
    Inspect {
        /// ET file (.json or .json.gz), or - for stdin.
        trace: PathBuf,
        /// Print one JSON object instead of tables.
        #[arg(long)]
        json: bool,
        /// How many ops of the histogram to print in the table (all with --json).
        #[arg(long, default_value_t = 25)]
        top: usize,
    },
    /// Graph statistics: replay set, op classes, skipped nodes with reasons, tensors, peak memory.
    Graph {
        trace: PathBuf,
        #[arg(long)]
        json: bool,
        /// Only these ProfilerStep#N iterations (comma-separated).
        #[arg(long, value_delimiter = ',')]
        iteration: Option<Vec<u64>>,
    },
    /// Link the replay-set ops of an ET to the events of its Kineto trace.
    Link {
        et: PathBuf,
        kineto: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Print the libtorch build this binary runs on and whether CUDA is usable.
    Env,
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
    match cli.cmd {
        Cmd::Inspect { trace, json, top } => inspect::run(&trace, json, top),
        Cmd::Graph {
            trace,
            json,
            iteration,
        } => graph_cmd::graph(&trace, json, iteration),
        Cmd::Link { et, kineto, json } => graph_cmd::link(&et, &kineto, json),
        Cmd::Env => {
            println!("{}", replay::env_report());
            Ok(())
        }
    }
}
