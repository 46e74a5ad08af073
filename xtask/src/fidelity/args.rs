//! `cargo xtask fidelity`'s arguments.

use anyhow::{Context, Result};
use std::path::PathBuf;

use super::host::ReplayHost;
use super::rounds::ROUND_PARTS;
use super::zoo::Capture;

/// A run's options, as parsed from its arguments.
pub(super) struct Options {
    /// Rounds of paired blocks per model (`N`).
    pub(super) rounds: usize,
    /// `--models a,b`: these zoo models alone (all of them without it).
    pub(super) only: Option<Vec<String>>,
    /// `--svg PATH`: where the plot goes (beside the JSON without it).
    pub(super) svg: Option<PathBuf>,
    /// `--busy-host` or `--throttled-host`: the host the rounds run on.
    pub(super) host: ReplayHost,
    /// `--glibc-heap-defaults`: the original under glibc's heap defaults ([`super::zoo`]'s
    /// `WARM_HEAP`).
    pub(super) glibc_heap_defaults: bool,
    /// `--against BIN`: another build's `mystique`, replayed in place of the busy capture.
    pub(super) against: Option<PathBuf>,
    /// The copy of `against` the replays run ([`super::run`] makes it; `None` until then).
    pub(super) against_copy: Option<PathBuf>,
    /// `--against-args 'ARGS'`: the `--against` build's replays' extra arguments.
    pub(super) against_args: Vec<String>,
    /// `--block-ms MS`: about how much of the original's time a block runs.
    pub(super) block_ms: f64,
    /// `--round-parts N`: the rounds in parts, each in processes started anew.
    pub(super) round_parts: usize,
    /// `--capture`: which capture this build's replays take their ops and gaps from.
    pub(super) capture: Capture,
    /// `--against-capture`: which capture the `--against` build's replays take.
    pub(super) against_capture: Capture,
    /// `--against-zoo DIR`: another zoo cache, whose quiet captures the `--against` build replays.
    pub(super) against_zoo: Option<PathBuf>,
    /// `--memory`: each model's peak memory instead of the timing rounds ([`super::memory`]).
    pub(super) memory: bool,
}

impl Options {
    /// Parses `cargo xtask fidelity`'s arguments (those after `fidelity`).
    pub(super) fn parse(args: &[&str]) -> Result<Options> {
        let mut rounds = 100usize;
        let mut only: Option<Vec<String>> = None;
        let mut svg: Option<PathBuf> = None;
        let mut host = ReplayHost::Quiet;
        let mut glibc_heap_defaults = false;
        let mut against: Option<PathBuf> = None;
        let mut against_args: Vec<String> = Vec::new();
        // 50 ms blocks. Every switch between the processes on the core costs the one coming in
        // its caches, TLB and branch history, which the model running on its own does not pay:
        // with 10 ms blocks the originals took up to 25% longer than with 200 ms, and the
        // replays not by as much. A round of four 50 ms blocks still
        // fits within one of the VM's speed spells (100-200 ms) more often than not, and the
        // median over rounds drops those that straddle a change.
        let mut block_ms = 50.0f64;
        let mut round_parts = ROUND_PARTS;
        let mut capture = Capture::Timing;
        let mut against_capture = Capture::Timing;
        let mut against_zoo: Option<PathBuf> = None;
        let mut memory = false;
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match *a {
                "--models" => {
                    only = Some(
                        it.next()
                            .context("--models a,b")?
                            .split(',')
                            .map(String::from)
                            .collect(),
                    )
                }
                "--svg" => svg = Some(PathBuf::from(it.next().context("--svg PATH")?)),
                flag @ ("--busy-host" | "--throttled-host") => {
                    let h = if flag == "--busy-host" {
                        ReplayHost::Busy
                    } else {
                        ReplayHost::Throttled
                    };
                    anyhow::ensure!(
                        host == ReplayHost::Quiet || host == h,
                        "--busy-host and --throttled-host are two replay hosts: run them one at a time"
                    );
                    host = h;
                }
                "--glibc-heap-defaults" => glibc_heap_defaults = true,
                "--memory" => memory = true,
                "--against" => {
                    let p = PathBuf::from(
                        it.next()
                            .context("--against PATH (another build's mystique)")?,
                    );
                    anyhow::ensure!(p.is_file(), "--against {}: no such file", p.display());
                    against = Some(p);
                }
                "--capture" => capture = Capture::parse(it.next().copied())?,
                "--against-capture" => against_capture = Capture::parse(it.next().copied())?,
                "--against-zoo" => {
                    let d = PathBuf::from(
                        it.next()
                            .context("--against-zoo DIR (another zoo cache: DIR/quiet)")?,
                    );
                    anyhow::ensure!(
                        d.join("quiet").is_dir(),
                        "--against-zoo {}: no quiet captures there",
                        d.display()
                    );
                    against_zoo = Some(d);
                }
                "--against-args" => {
                    against_args = it
                        .next()
                        .context("--against-args 'ARGS' (for the --against build's replays)")?
                        .split_whitespace()
                        .map(String::from)
                        .collect()
                }
                "--block-ms" => {
                    block_ms = it
                        .next()
                        .context("--block-ms MS")?
                        .parse()
                        .context("--block-ms MS")?;
                    anyhow::ensure!(
                        block_ms.is_finite() && block_ms > 0.0,
                        "--block-ms must be positive"
                    );
                }
                "--round-parts" => {
                    round_parts = it
                        .next()
                        .context("--round-parts N")?
                        .parse()
                        .context("--round-parts N")?;
                    anyhow::ensure!(round_parts >= 1, "--round-parts must be 1 or more");
                }
                n => rounds = n.parse().with_context(|| format!("rounds: {n:?}"))?,
            }
        }
        anyhow::ensure!(
            against.is_some() || against_args.is_empty(),
            "--against-args needs --against BIN (which may be this build's mystique)"
        );
        anyhow::ensure!(
            against.is_some() || against_zoo.is_none(),
            "--against-zoo needs --against BIN (which may be this build's mystique)"
        );
        anyhow::ensure!(
            against.is_some() || !args.contains(&"--against-capture"),
            "--against-capture needs --against BIN (which may be this build's mystique)"
        );
        Ok(Options {
            rounds,
            only,
            svg,
            host,
            glibc_heap_defaults,
            against,
            against_copy: None,
            against_args,
            block_ms,
            round_parts,
            capture,
            against_capture,
            against_zoo,
            memory,
        })
    }
}
