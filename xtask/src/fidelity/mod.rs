//! `cargo xtask fidelity --memory [--models a,b]`: each model's peak memory, replay over
//! original ([`memory`]).
//!
//! `cargo xtask fidelity [ROUNDS] [--models a,b] [--block-ms MS] [--round-parts N] [--busy-host | --throttled-host] [--glibc-heap-defaults] [--capture timing|linked] [--against BIN [--against-capture timing|linked] [--against-zoo DIR] [--against-args 'ARGS', where {reference} is each model's quiet reference]] [--svg PATH]`:
//! replay vs original over the model zoo (`xtask/scripts/zoo.py`).
//!
//! Each zoo model is captured twice (cached under the user cache: a directory per version of the
//! capture machinery, and each model's capture kept while its own code is unchanged, so that a
//! model added captures alone): on a quiet host, and with the host made busy during the capture
//! only. Per model, six processes stand side by side and take turns, one block of iterations
//! each per round (about 50 ms of the original's by default, the order rotating; all pinned to
//! one core; 1 thread): the original timed uninstrumented (`zoo.py serve`), the plain replay,
//! the replays with gaps from the quiet and from the busy capture, and the anchored gap model on
//! each capture's reference (`mystique replay --paced`). Models take their rounds in groups of
//! four, a round of each in turn, so that a model's rounds spread over the group's time. The
//! replays replay the clean ET and take their gaps from the profile taken without the execution
//! trace observer (`--capture linked`: from the linked pair). Ratios are per round (replay block
//! / original block), then the median over rounds.
//!
//! Modules: `args` (the options), `zoo` (the models, their sets and cached captures),
//! `harness` (the paced processes and their turns), `references` (the anchored gap model's
//! references), `host` (the replay host's load: burners, a CPU quota, the cores), `rounds` (each
//! model's rounds and row), `report` (the tables, the JSON and the SVG).
//!
//! # Tuning and held-out sets
//!
//! The zoo's models come in sets (`zoo.py list`), each reported in a table of its own, with
//! summaries over all held-out sets. `tune` holds the models the replay and the harness may be
//! developed against. The held-out sets ([`zoo`]'s `HELD_OUT`) hold models no choice is made on,
//! so that their ratios measure the replay on programs it was not fitted to. The rule: a
//! held-out set is written, and committed, before any of its models is replayed, and its results
//! are never used to choose anything (a constant, a formula, the harness's block length or
//! grouping). A choice made with some sets' results in view is checked by a set written before
//! that choice was measured:
//! - `heldout`: the replay and its gap model as fitted on `tune`.
//! - `fresh`: what `heldout` checks, on models whose results no one has seen (`heldout`'s
//!   results have been read and its failures investigated).
//! - `fresh2`: what was changed for `fresh`'s misses, once they had been diagnosed.
//! - `fresh3`: the timing profile taken without the execution trace observer.
//! - `fresh4`: the timing profile's warm-up and the probed boundary costs (the boundary charge
//!   was chosen with `heldout` to `fresh3` in view).
//! - `fresh5`: a further set on the choices `fresh4` checks.
//! - `fresh6`: the harness's 50 ms blocks, chosen with `heldout` to `fresh5` in view.
//! - `fresh7`, `fresh8`: changes to the gap model tried after each was written.
//! - `fresh9`: the harness's grouped rounds and references (a change to the harness, not to
//!   the replay), chosen with the references of four held-out models (film_cnn_adam,
//!   perceiver_radam, mixer_adamw, lenet_nadam) in view.
//! - `fresh10`: peak memory on the allocator's basis and the gradients held to the
//!   iteration's end, chosen with the tuning set's and the earlier sets' peak ratios in view.
//! - `fresh11`: frees placed where a `profile_memory` profile shows the original freed,
//!   written before that was first measured, with every earlier set's peak ratios in view.
//! - `fresh12`: a linked pair's boundary charge (the probed op's cost inside its window left
//!   out; under the observer, the calibration replay's own time between its steps where that
//!   is more), written before either was first measured, with the tuning set's linked pairs
//!   and fresh11's in view.
//! - `fresh13`: how a linked pair's gaps are charged for the observer, per op, written before
//!   any change after fresh12's was first measured, with the tuning set's and fresh12's linked
//!   pairs in view.
//! - `fresh14`: changes to a linked pair's charges chosen with fresh13's results in view,
//!   written before any was measured.
//! - `fresh15`: the memory that ops inside composites hold for the backward (chosen with
//!   fresh5's grucell_loop_adam in view) and a linked pair's first gap (with fresh13's and
//!   fresh14's in view), written before either was measured.
//! - `fresh16`: saved values the replay makes again (cross-entropy's log-probabilities,
//!   attention's log-sum-exp) made after their composite, chosen with fresh15's memory in
//!   view, written before it was measured.
//! - `fresh17`: linked pairs' gaps, written after fresh16's linked pairs were measured and before
//!   any change chosen with them in view was.

mod args;
mod harness;
mod host;
mod memory;
mod references;
mod report;
mod rounds;
#[cfg(test)]
mod tests;
mod zoo;

use anyhow::Result;
use std::path::{Path, PathBuf};

use args::Options;

/// What the phases of a run share: where the checkout, torch, the binary and the zoo's
/// captures are, and the options.
struct Harness<'a> {
    root: &'a Path,
    torch_py: &'a Path,
    bin: &'a Path,
    /// The zoo's captures for this capture machinery ([`zoo::prepare`]): `quiet/`, `busy/`.
    dir: PathBuf,
    opts: Options,
}

/// `cargo xtask fidelity ARGS`: parse the options, make the zoo (captured where missing), say
/// what the run does, pin to one core, time the references that are missing, put the replay
/// host's load on, run every model's rounds, then print the tables and write the JSON and SVG.
pub fn run(args: &[&str], root: &Path, cache: &Path, bin: &Path, torch_py: &Path) -> Result<()> {
    let mut opts = Options::parse(args)?;
    // The run starts replay processes for tens of minutes. A build in the meantime (a test
    // run, say) relinks target/release's binaries under it, and the next process it starts
    // dies or runs another build's code: it runs copies, of this build and of --against's.
    let copies = BinCopies::new(root)?;
    let bin = &copy_build(bin, &copies.dir)?;
    if let Some(a) = &opts.against {
        opts.against_copy = Some(copy_build(a, &copies.dir.join("against"))?);
    }
    let (models, dir) = zoo::prepare(root, cache, torch_py, opts.only.as_deref())?;
    let h = Harness {
        root,
        torch_py,
        bin,
        dir,
        opts,
    };
    if h.opts.memory {
        return memory::run(&h, &models);
    }
    if [h.opts.capture, h.opts.against_capture].contains(&zoo::Capture::LinkedMemory) {
        zoo::ensure_linked_memory(root, &h.dir, torch_py, &models)?;
    }
    // Before anything pins this process to one core.
    let cores = host::allowed_cores();
    report::print_header(&h);
    host::pin_to_one_core();
    // Each capture's reference for the anchored gap model, timed on the host as the capture
    // found it: quiet for the quiet capture, beside the burners for the busy one. Before the
    // busy host's burners, which would make every reference busy.
    let build = references::build_id(bin)?;
    let refs = references::references(&h, &build, &models, &cores)?;
    let _load = host::Load::start(h.opts.host, &cores)?;
    let rows = rounds::run_all(&h, &models, &refs)?;
    report::print_tables(&rows);
    report::write_files(&h, &rows)
}

/// A folder of this process's under target/fidelity for the builds' copies; removed on drop.
struct BinCopies {
    dir: PathBuf,
}

impl BinCopies {
    fn new(root: &Path) -> Result<BinCopies> {
        let parent = root.join("target/fidelity");
        // Copies left by runs that were killed (Drop does not run then): 170 MB each.
        for e in std::fs::read_dir(&parent).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let dead = name
                .strip_prefix("bin-")
                .and_then(|pid| pid.parse::<u32>().ok())
                .is_some_and(|pid| !Path::new("/proc").join(pid.to_string()).exists());
            if dead {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        Ok(BinCopies {
            dir: parent.join(format!("bin-{}", std::process::id())),
        })
    }
}

impl Drop for BinCopies {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Copies the build `bin` (`mystique` and, where there is one, the `mystique-replay` beside it)
/// into `dir`; returns the copy of `bin`. Their runpath is absolute: the copies run from
/// anywhere.
fn copy_build(bin: &Path, dir: &Path) -> Result<PathBuf> {
    use anyhow::Context;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let replay = format!("mystique-replay{}", std::env::consts::EXE_SUFFIX);
    let to = |from: &Path| dir.join(from.file_name().unwrap_or_default());
    for from in [bin.to_path_buf(), bin.with_file_name(&replay)] {
        if from == bin || from.exists() {
            std::fs::copy(&from, to(&from))
                .with_context(|| format!("copying {} to {}", from.display(), dir.display()))?;
        }
    }
    Ok(to(bin))
}
