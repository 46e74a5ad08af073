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
//! four, a round of each in turn, so that a model's rounds spread over the group's time. The replays replay the clean ET and
//! take their gaps from the profile taken without the execution trace observer (`--capture
//! linked`: the linked pair, as before 2026-12-02). Ratios are per round (replay block /
//! original block), then the median over rounds. The tuning set and the held-out sets
//! (`heldout`; `fresh`, added once the first had been reported for several sessions; `fresh2`,
//! added once `fresh` had been; `fresh3`, added once `fresh2` had been; `fresh4`, once `fresh3`
//! had been; `fresh5`, in the tenth session; `fresh6`, in the twelfth, before the harness's block
//! length was decided; `fresh7`, in the thirteenth, before any change to the gap model was tried; `fresh8`, in the fourteenth, likewise; `fresh9`, in the twenty-first) are reported apart, with a summary over all
//! held-out sets. Held-out models are not used to choose anything, with one exception: the ninth
//! session's boundary charge was chosen with the first four held-out sets' results in view, and
//! `fresh4` was written after it as the check on it; and the harness's 50 ms blocks (the twelfth
//! session) were chosen with `heldout` to `fresh5` in view, and `fresh6` was written and
//! committed before that choice, as the check on it; `fresh7` was written and committed at the
//! start of the thirteenth session, before any change tried there, and `fresh8` at the start of the
//! fourteenth. The twenty-first session's grouped rounds and references (a change to the
//! harness, not to the replay) were chosen after five references of four held-out models
//! (film_cnn_adam, perceiver_radam, mixer_adamw, lenet_nadam) were timed back to back beside the
//! burners, and after its first full run; `fresh9` was written during that session, before any
//! of its models had been replayed, as the check on it.

mod args;
mod harness;
mod host;
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
    let opts = Options::parse(args)?;
    let (models, dir) = zoo::prepare(root, cache, torch_py, opts.only.as_deref())?;
    let h = Harness {
        root,
        torch_py,
        bin,
        dir,
        opts,
    };
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
