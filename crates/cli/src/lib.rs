//! The `mystique` command line as a library: its grammar ([`args`]) and the commands that need
//! no libtorch (inspect, graph, link, select, compose, export to DOT or Chakra, diff).
//! `replay`, `compare`, `env`, `generate` and `run` run in the `mystique-replay` executable,
//! which `mystique` starts in its place, so that the other commands never load libtorch (0.8 s
//! and 470 MB before any work).

pub mod anonymize;
pub mod args;
pub mod chakra;
pub mod compose_cmd;
pub mod diff_cmd;
pub mod graph_cmd;
pub mod input;
pub mod inspect;
pub mod output;
pub mod package;
pub mod signals;

use anyhow::Result;
use args::{Cli, Cmd, ComposeOp};
use std::process::ExitCode;

/// This build's id: `mystique` passes it to `mystique-replay` in [`BUILD_ENV`], which refuses
/// to run for a `mystique` of another build.
pub const BUILD_ID: &str = env!("MYSTIQUE_BUILD_ID");
pub const BUILD_ENV: &str = "MYSTIQUE_BUILD_ID";

/// Logs on stderr with the time since start: `-v` info, `-vv` debug (the `log` facade the
/// crates write to).
struct StderrLog {
    start: std::time::Instant,
    level: log::LevelFilter,
}

impl log::Log for StderrLog {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= self.level
    }
    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) {
            eprintln!(
                "[{:8.3}s {:5} {}] {}",
                self.start.elapsed().as_secs_f64(),
                r.level(),
                r.target(),
                r.args()
            );
        }
    }
    fn flush(&self) {}
}

/// Turns on `-v` logging (once per process).
pub fn init_log(verbose: u8) {
    let level = match verbose {
        0 => return,
        1 => log::LevelFilter::Info,
        2 => log::LevelFilter::Debug,
        // -vvv: per-step detail (the allocator's count after each step of a measured iteration).
        _ => log::LevelFilter::Trace,
    };
    let logger = Box::new(StderrLog {
        start: std::time::Instant::now(),
        level,
    });
    if log::set_logger(Box::leak(logger)).is_ok() {
        log::set_max_level(level);
    }
}

/// Reads a trace, logging its size and the parse time, and warning on stderr about what the
/// parser found (an unknown schema, nodes whose parent the file does not hold).
pub fn read_trace(path: &std::path::Path) -> Result<et_schema::Trace> {
    let t0 = std::time::Instant::now();
    let t = et_schema::read_trace(path)?;
    for w in &t.warnings {
        eprintln!("warning: {}: {w}", path.display());
    }
    log::info!(
        "read {}: {} nodes, schema {} in {:.3} s",
        path.display(),
        t.nodes.len(),
        t.meta.schema,
        t0.elapsed().as_secs_f64()
    );
    Ok(t)
}

/// Refuses `-` (stdin) given more than once among `paths`: the first reading takes it all.
pub fn stdin_once(paths: &[std::path::PathBuf]) -> Result<()> {
    anyhow::ensure!(
        paths.iter().filter(|p| p.as_os_str() == "-").count() <= 1,
        "- (stdin) is given twice: it holds one trace; give the others as files"
    );
    Ok(())
}

/// Reads a Kineto trace, warning on stderr about the events it dropped (negative or absurd
/// times).
pub fn read_kineto(path: &std::path::Path) -> Result<et_schema::kineto::KinetoTrace> {
    let k = et_schema::kineto::read_kineto(path)?;
    for w in &k.warnings {
        eprintln!("warning: {}: {w}", path.display());
    }
    Ok(k)
}

/// Runs a command that needs no libtorch; `None` for `replay`, `compare` and `env`.
pub fn run(cli: Cli) -> Option<Result<()>> {
    compose_cmd::set_json(cli.json);
    init_log(cli.verbose);
    let json = cli.json;
    Some(match cli.cmd {
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
            chakra,
            astra_sim,
            filters,
            output,
        } => {
            if astra_sim && !chakra {
                // clap's `requires` takes a flag's default (false) as given: checked here.
                Err(anyhow::anyhow!(
                    "--astra-sim orders a Chakra export's nodes: it goes with --chakra"
                ))
            } else if chakra {
                chakra::export(&trace, &filters, &output, json, astra_sim)
            } else {
                compose_cmd::export_dot(&trace, &filters, &output)
            }
        }
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
            // Finding the ranks is mystique-replay's (as for `replay --ranks`).
            ComposeOp::World { .. } => return None,
        },
        Cmd::Diff { a, b, svg } => diff_cmd::run(&a, &b, svg.as_deref(), json),
        Cmd::Replay(_) | Cmd::Compare(_) | Cmd::Env | Cmd::Generate(_) | Cmd::Run(_) => {
            return None
        }
    })
}

/// A replay that completed with failed ops: its report was printed; the exit code says so (3).
#[derive(Debug)]
pub struct OpsFailed {
    pub failed: usize,
    pub selected: usize,
}

impl std::fmt::Display for OpsFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(
            f,
            "{} of {} ops failed (the report lists why)",
            self.failed, self.selected
        )
    }
}

impl std::error::Error for OpsFailed {}

impl OpsFailed {
    /// Ok when no op failed; otherwise the error that makes the exit code 3.
    pub fn check(failed: usize, selected: usize) -> Result<()> {
        if failed > 0 {
            return Err(OpsFailed { failed, selected }.into());
        }
        Ok(())
    }

    /// [`OpsFailed::check`] over the `--json` reports of several ranks.
    pub fn check_reports<'a>(reports: impl Iterator<Item = &'a serde_json::Value>) -> Result<()> {
        let (mut failed, mut selected) = (0, 0);
        for r in reports {
            failed += r["ops_failed"].as_u64().unwrap_or(0) as usize;
            selected += r["ops_selected"].as_u64().unwrap_or(0) as usize;
        }
        Self::check(failed, selected)
    }
}

/// Exit codes scripts can rely on: 0 every selected op ran; 3 the replay completed with failed
/// ops (report printed); 2 bad input or usage, or a run that could not complete.
pub const EXIT_OPS_FAILED: u8 = 3;

/// Makes a bus error (SIGBUS) a clean exit 2 with a message instead of a crash. Input trace
/// files are mapped (`et_schema::open_input`): if another process truncates one while it is
/// read, the next read of the lost pages raises SIGBUS. Call first thing in `main`.
pub fn exit_2_on_bus_error() {
    #[cfg(unix)]
    {
        extern "C" fn on_sigbus(_: libc::c_int) {
            const MSG: &[u8] = b"error: bus error (SIGBUS) reading a mapped input file: was it truncated or replaced while mystique read it? Run again once the file is complete.\n";
            // SAFETY: write(2) and _exit(2) are async-signal-safe; MSG is a static buffer.
            unsafe {
                libc::write(2, MSG.as_ptr() as *const libc::c_void, MSG.len());
                libc::_exit(2);
            }
        }
        // SAFETY: a zeroed sigaction with a handler and an empty mask is a valid argument; the
        // handler only calls async-signal-safe functions.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigbus as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// A command's result once it printed its report (`printed`): a closed stdout (`| head`) cuts
/// the report short but does not hide the command's own `outcome` (failed ops still exit 3).
pub fn printed_then(printed: Result<()>, outcome: Result<()>) -> Result<()> {
    match printed {
        Err(e) if is_broken_pipe(&e) => outcome.and(Err(e)),
        printed => printed.and(outcome),
    }
}

/// The process's exit for a command's result: errors print their chain and exit with 2.
/// Written so that a closed stderr (`2>&1 | head`) cannot turn it into a panic.
pub fn exit(result: Result<()>) -> ExitCode {
    use std::io::Write as _;
    let mut err = std::io::stderr().lock();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<OpsFailed>().is_some() => {
            let _ = writeln!(err, "warning: {e}");
            ExitCode::from(EXIT_OPS_FAILED)
        }
        // A closed stdout (e.g. `| head`) is not an error worth a message.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(err, "error: {e}");
            // A cause that the line above already quotes (an I/O error put in its context's
            // message) is not printed again.
            let mut said = e.to_string();
            for cause in e.chain().skip(1) {
                let text = cause.to_string();
                if !said.contains(&text) {
                    let _ = writeln!(err, "  caused by: {text}");
                }
                said = text;
            }
            ExitCode::from(2)
        }
    }
}
