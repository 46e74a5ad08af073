//! The references of the anchored gap model: each capture's original and plain replay timed
//! side by side as the capture found the host.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

use super::harness::{
    balanced_groups, block_iters, serve_original, serve_replay, turn_order, Block, Paced,
};
use super::host::Burners;
use super::zoo::{quiet_meta, read_json, Model};
use super::Harness;

/// How far the original's speed against the plain replay's has moved since a reference was
/// timed: the plain replay's ratio to the original now (`plain_cpu`, in CPU time) over the
/// reference's (in running time, the anchor's terms: each program's time less its wait for a
/// CPU). Below 1, the original now runs slower against the replay than it did then, and every
/// gap model anchored on that reference reads low by as much: the anchor puts the reference's
/// original on this host by the plain replay's speed, and cannot see the original's own.
/// The anchored ratio over it is then the gap model's own error (through one throttled run
/// of the zoo the host slowed, the originals' CPU time by up to x1.33 and the plain replay's
/// x1.21, and the anchored ratios fell with it). NaN where the reference lacks a time.
pub(super) fn drift(reference: &serde_json::Value, plain_cpu: f64) -> f64 {
    let ms = |k: &str| reference[k].as_f64().unwrap_or(f64::NAN);
    let wait = |k: &str| reference[k].as_f64().unwrap_or(0.0);
    let original = ms("original_ms") - wait("original_wait_ms");
    let replay = ms("replay_ms") - wait("replay_wait_ms");
    if original > 0.0 && replay > 0.0 {
        plain_cpu * original / replay
    } else {
        f64::NAN
    }
}

/// Rounds of a reference (the original and the plain replay side by side).
pub(super) const REFERENCE_ROUNDS: usize = 30;

/// Models whose references are timed together, their rounds interleaved (two processes each).
pub(super) const REFERENCE_SPREAD: usize = 8;

/// A build's identity (a hash of its bytes): a reference holds the plain replay's time, which
/// a build that dispatches faster or slower changes. `mystique` runs `replay` in the
/// `mystique-replay` executable beside it, which holds the replay's code: both are hashed (the
/// front's bytes alone stay the same when only the replay changes, and would keep a reference
/// timed by another replay).
pub(super) fn build_id(bin: &Path) -> Result<String> {
    use std::hash::Hasher;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    // Where `mystique` finds it: `$MYSTIQUE_REPLAY`, else beside it.
    let replay = std::env::var_os("MYSTIQUE_REPLAY")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            bin.with_file_name(format!("mystique-replay{}", std::env::consts::EXE_SUFFIX))
        });
    for p in [bin, replay.as_path()] {
        let bytes = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
        h.write(&bytes);
    }
    Ok(format!("{:016x}", h.finish()))
}

/// Each model's references for the anchored gap model (`mystique replay --reference`), the
/// quiet capture's and the busy one's: `M.reference.json` beside the capture, timed now where
/// missing or made by another build or for other code of the model. A reference is what a
/// user records on the capture host: the original's uninstrumented iteration and this tool's
/// plain replay of the trace, side by side ([`REFERENCE_ROUNDS`] rounds of paired blocks, as
/// the fidelity rounds run them, in groups of [`REFERENCE_SPREAD`] models whose rounds
/// interleave). The busy capture's is timed beside a CPU burner on every
/// core, as that capture was made: a reference on a busier host than the replay's, which the
/// replay must put on its own host by its plain replay's speed. Each program's wait for a CPU
/// is recorded with its time (`original_wait_ms`, `replay_wait_ms`; read by each process for
/// its own thread): beside the burners the scheduler gave the original and the replay
/// different shares of the core (the originals slowed x1.9-3.0 against their quiet
/// references, the replays x1.8-2.4), and the anchor takes both in running time.
///
/// The rounds are timed in halves ([`REFERENCE_HALVES`]), each in processes of its own, the
/// second once every model's first is done (minutes apart), and the reference is the halves'
/// mean. Two causes made one pass's reference miss by 10% and more:
/// - the host's spells: one group of busy references fell in one, and six of its eight
///   models' `T / O` came out more than 10% off their quiet ones (every other model's but one
///   within);
/// - a process's own speed: one program's op time differs from one process to the next, with
///   the same values (bf16_cnn_infer's plain replay, 300 iterations each in ten processes one
///   after another: `max_pool2d` 168-284 µs, steady within each; with address randomisation
///   off, `setarch -R`, six processes still spread 224-270 µs).
///
/// Where the halves' `T / O` differ by more than [`HALVES_DISAGREE`], a third half is timed
/// after the rest and the reference takes the median of the three; each half is kept in the
/// file (`halves`), and the log says which models needed a third.
pub(super) fn references(
    h: &Harness,
    build: &str,
    models: &[Model],
    cores: &[usize],
) -> Result<Vec<(PathBuf, PathBuf)>> {
    for busy in [false, true] {
        time_stale(h, build, models, busy, cores)?;
    }
    let mut out = Vec::with_capacity(models.len());
    for m in models {
        let at = |kind: &str| h.dir.join(kind).join(format!("{}.reference.json", m.name));
        out.push((at("quiet"), at("busy")));
    }
    Ok(out)
}

/// Times again the references of the quiet captures (or the `busy` ones, beside a burner on
/// each of `cores`) that are missing or stale ([`is_stale`]), and writes them.
///
/// In an A/B run (`--against`) a busy reference that another build timed is kept: the two
/// builds are compared on the quiet capture, and only this build's figures on the busy
/// capture take it (its anchored column and the busy drift, whose `O`, another build's plain
/// op time, is off by as much as the builds' dispatch differs). Timing them again took 10-15
/// minutes of every A/B run.
fn time_stale(
    h: &Harness,
    build: &str,
    models: &[Model],
    busy: bool,
    cores: &[usize],
) -> Result<()> {
    let kind = if busy { "busy" } else { "quiet" };
    let d = h.dir.join(kind);
    let any_build = busy && h.opts.against.is_some();
    let stale: Vec<&Model> = models
        .iter()
        .filter(|m| is_stale(&d, m, (!any_build).then_some(build)))
        .collect();
    let kept = models
        .iter()
        .filter(|m| any_build && is_stale(&d, m, Some(build)) && !is_stale(&d, m, None))
        .count();
    if kept > 0 {
        eprintln!(
            "[fidelity] A/B: {kept} busy references another build timed are kept (the \
             anchored column and the drift on the busy capture take them)"
        );
    }
    if stale.is_empty() {
        return Ok(());
    }
    eprintln!(
        "[fidelity] timing {} {kind} references (the original and the plain replay side by side, \
         {REFERENCE_ROUNDS} rounds in {REFERENCE_HALVES} halves of their own processes{}) ...",
        stale.len(),
        if busy {
            ", beside a CPU burner on every core"
        } else {
            ""
        }
    );
    let _burners = if busy {
        Some(Burners::start(cores)?)
    } else {
        None
    };
    let halves = time_halves(h, &stale, busy)?;
    for (m, hs) in stale.iter().zip(&halves) {
        write_reference(&d, m, hs, busy, build)?;
    }
    Ok(())
}

/// Whether model `m`'s reference in the capture directory `d` must be timed again: missing,
/// made by another build than `build` (where one is given) or for other code of the model, or
/// in another form.
pub(super) fn is_stale(d: &Path, m: &Model, build: Option<&str>) -> bool {
    let j = read_json(&d.join(format!("{}.reference.json", m.name)));
    build.is_some_and(|b| j["replay_build"].as_str() != Some(b))
        || j["model_key"].as_str() != Some(&m.key)
        || j["rounds"].as_u64() != Some(REFERENCE_ROUNDS as u64)
        || !j["halves"].is_array()
        || j["op_share"].as_str() != Some(OP_SHARE)
}

/// The halves of each of `stale`'s references: [`REFERENCE_HALVES`] of each, in groups of
/// [`REFERENCE_SPREAD`] models, then a third of those whose halves disagree.
fn time_halves(h: &Harness, stale: &[&Model], busy: bool) -> Result<Vec<Vec<Half>>> {
    let kind = if busy { "busy" } else { "quiet" };
    // One half more of each of the models `at` (indices into `stale`), in groups.
    let more = |at: &[usize], halves: &mut [Vec<Half>]| -> Result<()> {
        for group in balanced_groups(at, REFERENCE_SPREAD) {
            let ms: Vec<&Model> = group.iter().map(|&i| stale[i]).collect();
            for (&i, half) in group.iter().zip(reference_half(h, &ms, busy)?) {
                halves[i].push(half);
            }
        }
        Ok(())
    };
    let mut halves: Vec<Vec<Half>> = (0..stale.len()).map(|_| Vec::new()).collect();
    let at: Vec<usize> = (0..stale.len()).collect();
    for _ in 0..REFERENCE_HALVES {
        more(&at, &mut halves)?;
    }
    let split: Vec<usize> = at
        .iter()
        .copied()
        .filter(|&i| halves_disagree(&halves[i]))
        .collect();
    if !split.is_empty() {
        eprintln!(
            "[fidelity] {} of the {kind} references' halves differ by more than {:.0}% in T/O ({}): a third half each",
            split.len(),
            HALVES_DISAGREE * 100.0,
            split.iter().map(|&i| stale[i].name.as_str()).collect::<Vec<_>>().join(", ")
        );
        more(&split, &mut halves)?;
    }
    Ok(halves)
}

/// Writes model `m`'s reference from its halves `hs` into the capture directory `d`, and logs it.
fn write_reference(d: &Path, m: &Model, hs: &[Half], busy: bool, build: &str) -> Result<()> {
    let kind = if busy { "busy" } else { "quiet" };
    let mid = |f: fn(&Half) -> f64| crate::median(&hs.iter().map(f).collect::<Vec<_>>());
    let (original_ms, replay_ms) = (mid(|h| h.original.0), mid(|h| h.replay.0));
    // As within a half, the wait is the wall time less the running time, each the
    // halves' median, so that the reference's running time is theirs (with three
    // halves, the median wall less the median wait is not).
    let original_wait_ms =
        (original_ms - mid(|h| h.original.0 - h.original.1)).clamp(0.0, 0.99 * original_ms);
    let replay_wait_ms =
        (replay_ms - mid(|h| h.replay.0 - h.replay.1)).clamp(0.0, 0.99 * replay_ms);
    let share = mid(|h| h.share);
    let j = serde_json::json!({
        "original_ms": original_ms, "replay_ms": replay_ms,
        "replay_op_ms": replay_ms * share.min(1.0),
        "original_wait_ms": original_wait_ms, "replay_wait_ms": replay_wait_ms,
        "rounds": REFERENCE_ROUNDS, "spread_over": REFERENCE_SPREAD, "busy": busy,
        "replay_build": build, "model_key": m.key,
        "halves": hs.iter().map(Half::json).collect::<Vec<_>>(), "op_share": OP_SHARE,
    });
    std::fs::write(
        d.join(format!("{}.reference.json", m.name)),
        serde_json::to_vec_pretty(&j)?,
    )?;
    let t_o: Vec<String> = hs.iter().map(|h| format!("{:.3}", h.t_over_o())).collect();
    eprintln!(
        "[fidelity] {:<18} {kind} reference: original {original_ms:.3} ms (waited \
         {original_wait_ms:.3}), plain replay {replay_ms:.3} ms (waited {replay_wait_ms:.3}); \
         T/O by half {}",
        m.name,
        t_o.join(", ")
    );
    Ok(())
}

/// Halves of a reference ([`references`]), each in processes of its own.
pub(super) const REFERENCE_HALVES: usize = 2;

/// How a reference's plain replay's share of its iteration in ops was taken ([`reference_half`]);
/// a reference that took it otherwise is timed again.
pub(super) const OP_SHARE: &str = "ratio of the means";

/// Halves whose `T / O` differ by more than this (relative to the lower) get a third: below
/// the 10% and more by which a spell or a slow process moved a reference ([`references`]).
pub(super) const HALVES_DISAGREE: f64 = 0.08;

/// One half of a reference: each program's time and wait per iteration (ms), the medians of
/// its rounds, and the plain replay's share of its iteration in ops (its own report).
pub(super) struct Half {
    pub(super) original: (f64, f64),
    pub(super) replay: (f64, f64),
    pub(super) share: f64,
    pub(super) rounds: [Vec<f64>; 2],
}

impl Half {
    pub(super) fn t_over_o(&self) -> f64 {
        self.original.0 / self.replay.0
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "original_ms": self.original.0, "original_wait_ms": self.original.1,
            "replay_ms": self.replay.0, "replay_wait_ms": self.replay.1,
            "t_over_o": self.t_over_o(), "op_share": self.share,
            "original_rounds_ms": self.rounds[0], "replay_rounds_ms": self.rounds[1],
        })
    }
}

/// Whether a reference's first two halves differ by more than [`HALVES_DISAGREE`] in `T / O`
/// (or either is not a number).
pub(super) fn halves_disagree(hs: &[Half]) -> bool {
    match hs {
        [a, b, ..] => {
            let (x, y) = (a.t_over_o(), b.t_over_o());
            !(x.is_finite() && y.is_finite() && x.max(y) / x.min(y) - 1.0 <= HALVES_DISAGREE)
        }
        _ => false,
    }
}

/// Times one half of each of `group`'s references ([`references`]): the original and the
/// plain replay of each model started anew, then `REFERENCE_ROUNDS / REFERENCE_HALVES` rounds,
/// round-robin over the group (as the fidelity rounds): each model's rounds spread over the
/// group's time, half a minute or more, not the few seconds of its own. Back to back, one
/// model's `T / O` beside the burners moved by up to 16% from one reference to the next a
/// minute apart (film_cnn_adam 0.84-1.01 of its quiet one): the host's spells, in which the
/// original's Python and the replay do not slow alike, last tens of seconds.
fn reference_half(h: &Harness, group: &[&Model], busy: bool) -> Result<Vec<Half>> {
    let rounds = REFERENCE_ROUNDS / REFERENCE_HALVES;
    struct Timing {
        iters: usize,
        orig: Paced,
        plain: Paced,
        // Per round, each program's time per iteration and the part of it it waited for a
        // CPU (each process reads its own thread's wait).
        o: Vec<(f64, f64)>,
        r: Vec<(f64, f64)>,
    }
    let (dir, capture) = (&h.dir, h.opts.capture);
    let d = capture.dir(dir, if busy { "busy" } else { "quiet" });
    let mut t = Vec::with_capacity(group.len());
    for m in group {
        let meta = quiet_meta(dir, &m.name);
        // As the fidelity rounds' plain replay replays it.
        let (et, _) = capture.files(&d, &m.name);
        let one = capture.iteration_args(&meta);
        let iters = block_iters(&meta, h.opts.block_ms);
        let mut orig = serve_original(
            h.root,
            h.torch_py,
            &m.name,
            iters,
            h.opts.glibc_heap_defaults,
        )?;
        orig.block()?;
        let mut plain = serve_replay(h.bin, &et, None, iters, rounds + 2, &one)?;
        plain.block()?;
        t.push(Timing {
            iters,
            orig,
            plain,
            o: Vec::with_capacity(rounds),
            r: Vec::with_capacity(rounds),
        });
    }
    for round in 0..rounds {
        for at in turn_order(t.len(), round) {
            let x = &mut t[at];
            let per_iter = |b: Block| (b.ms / x.iters as f64, b.wait_ms / x.iters as f64);
            // Alternating which goes first.
            if round % 2 == 0 {
                x.o.push(per_iter(x.orig.block()?));
                x.r.push(per_iter(x.plain.block()?));
            } else {
                x.r.push(per_iter(x.plain.block()?));
                x.o.push(per_iter(x.orig.block()?));
            }
        }
    }
    let mut out = Vec::with_capacity(t.len());
    for x in t {
        drop(x.orig);
        let report = x.plain.finish()?;
        // The medians of the wall time and of the running time (the wall time less the wait):
        // the wait recorded is their difference, so that the reference's running time is the
        // rounds' median.
        let medians = |v: &[(f64, f64)]| {
            let wall: Vec<f64> = v.iter().map(|x| x.0).collect();
            let running: Vec<f64> = v.iter().map(|x| x.0 - x.1).collect();
            let (w, run) = (crate::median(&wall), crate::median(&running));
            ((w, (w - run).clamp(0.0, 0.99 * w)), wall)
        };
        let (original, o) = medians(&x.o);
        let (replay, r) = medians(&x.r);
        // Its share of the iteration in ops, from its own report, on the blocks' time: the
        // ratio of the means, which add up (an iteration is its ops and what lies between
        // them), not of the medians, which do not: beside the burners the waits fall in some
        // iterations and not others, and gru_lm_adam's busy reference read a share of 0.46
        // (its quiet one 0.90), which made its anchored replay's host ratio 2.3 and its
        // iteration 1.8x the original's.
        let share = report["op_ms"]["mean"].as_f64().unwrap_or(f64::NAN)
            / report["iter_ms"]["mean"].as_f64().unwrap_or(f64::NAN);
        out.push(Half {
            original,
            replay,
            share,
            rounds: [o, r],
        });
    }
    Ok(out)
}
