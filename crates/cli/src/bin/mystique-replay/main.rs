//! `mystique-replay`: the part of `mystique` that runs libtorch (`replay`, `compare`, `env`,
//! `generate`, `run`).
//! `mystique` execs it with its own arguments; it parses the same grammar
//! ([`mystique_cli::args`]) so both accept exactly the same command lines.

use clap::Parser;
use mystique_cli::args::{Cli, Cmd};
use std::io::Write as _;
use std::process::ExitCode;

mod card;
mod comm_cmd;
mod compare_cmd;
mod generate_cmd;
mod package_cmd;
mod print;
mod rank_files;
mod ranks;
mod replay_cmd;
mod world_cmd;

fn main() -> ExitCode {
    mystique_cli::exit_2_on_bus_error();
    mystique_cli::signals::install();
    mystique_cli::signals::end_on_closed_output();
    // The observer's trace of an instrumented replay on this (the main) thread goes with the
    // process when a signal ends it mid-calibration (`timeout` sends SIGTERM): 8 MB a replay.
    let _observer_trace =
        mystique_cli::signals::Temp::make(replay::observer_trace_path(), |_| Ok(())).ok();
    if let Ok(id) = std::env::var(mystique_cli::BUILD_ENV) {
        if id != mystique_cli::BUILD_ID {
            eprintln!(
                "error: this mystique-replay is from another build than the mystique that started \
                 it: rebuild both (cargo build --release -p mystique-cli, or cargo xtask setup)"
            );
            return ExitCode::from(2);
        }
    }
    let cli = Cli::parse();
    let json = cli.json;
    mystique_cli::init_log(cli.verbose);
    let result = match cli.cmd {
        Cmd::Replay(a) => replay_cmd::run(&a, json),
        Cmd::Compare(a) => compare_cmd::compare(&a, json),
        Cmd::Generate(a) => generate_cmd::generate(&a, json),
        Cmd::Run(a) => package_cmd::run(&a, json),
        Cmd::Compose {
            op:
                mystique_cli::args::ComposeOp::World {
                    traces,
                    world,
                    data_parallel,
                    output,
                    chakra,
                    astra_sim,
                    rank_order,
                },
        } => world_cmd::run(
            &world_cmd::WorldArgs {
                traces,
                world,
                data_parallel,
                output,
                chakra,
                astra_sim,
                rank_order,
            },
            json,
        ),
        Cmd::Env => {
            let text = if json {
                replay::env_json().to_string()
            } else {
                replay::env_report()
            };
            writeln!(std::io::stdout(), "{text}").map_err(Into::into)
        }
        // The libtorch-free commands run in `mystique` itself.
        _ => match mystique_cli::run(cli) {
            Some(r) => r,
            None => unreachable!("replay commands are matched above"),
        },
    };
    mystique_cli::exit(result)
}
