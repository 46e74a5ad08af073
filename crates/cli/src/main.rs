//! The `mystique` command line: parses arguments, calls the crates, prints. No logic of its own.
//!
//! This binary does not link libtorch. `replay`, `compare`, `env`, `generate`, `run` and
//! `compose world` are run by `mystique-replay`, installed beside it, which this process
//! becomes (exec) with the same arguments, standard streams and exit status: users see one
//! command.

use anyhow::{Context, Result};
use clap::Parser;
use mystique_cli::args::Cli;
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    mystique_cli::exit_2_on_bus_error();
    mystique_cli::signals::install();
    mystique_cli::signals::end_on_closed_output();
    let cli = Cli::parse();
    match mystique_cli::run(cli) {
        Some(result) => mystique_cli::exit(result),
        None => mystique_cli::exit(exec_replay()),
    }
}

/// The `mystique-replay` executable: `$MYSTIQUE_REPLAY`, else beside this one.
fn replay_exe() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("MYSTIQUE_REPLAY") {
        let p = PathBuf::from(p);
        let me = std::env::current_exe().context("locating the mystique executable")?;
        if p.canonicalize().ok() == me.canonicalize().ok() {
            anyhow::bail!("MYSTIQUE_REPLAY={} is mystique itself", p.display());
        }
        return Ok(p);
    }
    let me = std::env::current_exe().context("locating the mystique executable")?;
    let exe = me.with_file_name(format!("mystique-replay{}", std::env::consts::EXE_SUFFIX));
    if exe.canonicalize().ok() == me.canonicalize().ok() {
        anyhow::bail!("{} is mystique itself, not mystique-replay", exe.display());
    }
    anyhow::ensure!(
        exe.exists(),
        "{} is missing: it runs replay, compare, env, generate and run (build both with \
         `cargo xtask setup`, or set MYSTIQUE_REPLAY)",
        exe.display()
    );
    Ok(exe)
}

/// Becomes `mystique-replay` with this process's arguments; returns only on failure.
fn exec_replay() -> Result<()> {
    let exe = replay_exe()?;
    let mut cmd = std::process::Command::new(&exe);
    cmd.args(std::env::args_os().skip(1))
        .env(mystique_cli::BUILD_ENV, mystique_cli::BUILD_ID);
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        // Usage and error messages name the command the user typed.
        let err = cmd.arg0("mystique").exec();
        Err(err).with_context(|| format!("starting {}", exe.display()))
    }
    #[cfg(not(unix))]
    {
        let status = cmd
            .status()
            .with_context(|| format!("starting {}", exe.display()))?;
        std::process::exit(status.code().unwrap_or(2))
    }
}
