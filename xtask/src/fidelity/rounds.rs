//! The fidelity rounds: each model's original and replays as paced processes taking turns,
//! models in groups, and each model's row from its rounds.

use anyhow::Result;
use std::path::{Path, PathBuf};

use super::harness::{
    balanced_groups, block_iters, replay, serve_original, serve_replay, turn_order, Block, Paced,
};
use super::references::drift;
use super::report::{quantile, sorted_finite, Row};
use super::zoo::{quiet_meta, read_json, Model};
use super::Harness;

/// In `--against-args`, replaced by each model's quiet capture's reference file.
const AGAINST_REFERENCE: &str = "{reference}";

/// Models whose rounds interleave (the fidelity rounds and the references): a round of each in
/// turn, so that each model's rounds spread over the group's time. Each model holds its
/// processes meanwhile (six for the rounds, 0.2-0.6 GB each), which bounds the group.
pub(super) const SPREAD_MODELS: usize = 4;

/// One model's fidelity processes and its rounds so far.
struct Run<'a> {
    m: &'a Model,
    /// Its quiet and busy captures' references ([`super::references::references`]).
    refs: [&'a Path; 2],
    iters: usize,
    /// How to start each of its [`PROCESSES`] (again for each part of its rounds).
    serve: Vec<Serve>,
    et_q: PathBuf,
    one: Vec<String>,
    meta: serde_json::Value,
    procs: Vec<Paced>,
    per_round: Vec<[f64; PROCESSES - 1]>,
    per_round_cpu: Vec<[f64; PROCESSES - 1]>,
    orig: Vec<f64>,
    orig_cpu: Vec<f64>,
    orig_wait: Vec<f64>,
    orig_faults: Vec<f64>,
}

/// How one of a model's fidelity processes is started.
enum Serve {
    /// The original, uninstrumented.
    Original,
    /// `bin replay et` (with the gaps from `kineto`) and `args`.
    Replay {
        bin: PathBuf,
        et: PathBuf,
        kineto: Option<PathBuf>,
        args: Vec<String>,
    },
}

impl<'a> Run<'a> {
    /// Model `m`'s processes, not started yet, and its rounds, none yet; `ref_q`, `ref_b`: its
    /// quiet and busy captures' references.
    fn new(h: &Harness, m: &'a Model, ref_q: &'a Path, ref_b: &'a Path) -> Run<'a> {
        let (bin, capture, rounds) = (h.bin, h.opts.capture, h.opts.rounds);
        let q = capture.dir(&h.dir, "quiet");
        let b = capture.dir(&h.dir, "busy");
        // The quiet capture's record: its timing and its peak memory.
        let meta = quiet_meta(&h.dir, &m.name);
        let one = capture.iteration_args(&meta);
        let (et_q, kin_q) = capture.files(&q, &m.name);
        let (et_b, kin_b) = capture.files(&b, &m.name);
        // The --against replays may take another zoo's captures (another capture procedure's).
        let against = h.opts.against_capture;
        let q_a = against.dir(h.opts.against_zoo.as_deref().unwrap_or(&h.dir), "quiet");
        let (et_a, kin_a) = against.files(&q_a, &m.name);
        // Iterations per block: about `block_ms` of the original's quiet iterations (its
        // capture's timing), the same count for all six so that a block's times compare as
        // they are.
        let iters = block_iters(&meta, h.opts.block_ms);
        let anchored = |r: &Path| -> Vec<String> {
            one.iter()
                .cloned()
                .chain(["--reference".into(), r.display().to_string()])
                .collect()
        };
        let replay =
            |bin: &Path, et: &Path, kineto: Option<&Path>, args: Vec<String>| Serve::Replay {
                bin: bin.to_path_buf(),
                et: et.to_path_buf(),
                kineto: kineto.map(Path::to_path_buf),
                args,
            };
        let serve = vec![
            Serve::Original,
            replay(bin, &et_q, None, one.clone()),
            replay(bin, &et_q, Some(&kin_q), one.clone()),
            // A/B: another build (or arguments) on the quiet capture, paired with this one
            // in the same rounds (two runs apart sit in different phases of the VM's speed).
            match &h.opts.against {
                Some(a) => replay(
                    h.opts.against_copy.as_deref().unwrap_or(a),
                    &et_a,
                    Some(&kin_a),
                    against_args(h, &meta, ref_q),
                ),
                None => replay(bin, &et_b, Some(&kin_b), one.clone()),
            },
            // The anchored gap model, on each capture and its own reference.
            replay(bin, &et_q, Some(&kin_q), anchored(ref_q)),
            replay(bin, &et_b, Some(&kin_b), anchored(ref_b)),
        ];
        Run {
            m,
            refs: [ref_q, ref_b],
            iters,
            serve,
            et_q,
            one,
            meta,
            procs: Vec::new(),
            per_round: Vec::with_capacity(rounds),
            per_round_cpu: Vec::with_capacity(rounds),
            orig: Vec::with_capacity(rounds),
            orig_cpu: Vec::with_capacity(rounds),
            orig_wait: Vec::with_capacity(rounds),
            orig_faults: Vec::with_capacity(rounds),
        }
    }

    /// Starts its processes for `blocks` blocks each, one at a time, each running its first
    /// block (start-up, calibration, warm-up; not counted) before the next starts, so that no
    /// calibration shares the host with another process's start.
    fn start(&self, h: &Harness, blocks: usize) -> Result<Vec<Paced>> {
        let mut procs = Vec::with_capacity(self.serve.len());
        for s in &self.serve {
            let mut p = match s {
                Serve::Original => serve_original(
                    h.root,
                    h.torch_py,
                    &self.m.name,
                    self.iters,
                    h.opts.glibc_heap_defaults,
                )?,
                Serve::Replay {
                    bin,
                    et,
                    kineto,
                    args,
                } => serve_replay(bin, et, kineto.as_deref(), self.iters, blocks, args)?,
            };
            p.block()?;
            procs.push(p);
        }
        Ok(procs)
    }

    /// Round `round` of the model: one block of each of its processes, in turn, and the
    /// round's times and ratios.
    fn round(&mut self, round: usize) -> Result<()> {
        // Each process starts a round in each place in turn, forwards and backwards, so
        // none always follows the same one (caches, the host's spells).
        let mut r = [Block {
            ms: f64::NAN,
            faults: f64::NAN,
            cpu_ms: f64::NAN,
            wait_ms: f64::NAN,
        }; PROCESSES];
        for which in turn_order(PROCESSES, round) {
            r[which] = self.procs[which].block()?;
        }
        let iters = self.iters as f64;
        self.orig.push(r[0].ms / iters);
        self.orig_cpu.push(r[0].cpu_ms / iters);
        self.orig_wait.push(r[0].wait_ms / iters);
        self.orig_faults.push(r[0].faults);
        self.per_round
            .push(std::array::from_fn(|k| r[k + 1].ms / r[0].ms));
        self.per_round_cpu
            .push(std::array::from_fn(|k| r[k + 1].cpu_ms / r[0].cpu_ms));
        Ok(())
    }

    /// The model's row, once its rounds are done: its replays run to their end and report,
    /// then one more replay checks the values.
    fn finish(self, h: &Harness) -> Result<Row> {
        let Run {
            m,
            refs,
            iters: _,
            serve: _,
            et_q,
            one,
            meta,
            procs,
            per_round,
            per_round_cpu,
            orig,
            orig_cpu,
            orig_wait,
            orig_faults,
        } = self;
        let [plain, quiet, busy, anch_q, anch_b] = reports(procs)?;
        let processes = [&plain, &quiet, &busy, &anch_q, &anch_b].map(process_figures);
        let (failed, nonfinite) = check_values(h.bin, &et_q, &one)?;
        let orig_ms = crate::median(&orig);
        let col = |k: usize| crate::median(&per_round.iter().map(|r| r[k]).collect::<Vec<_>>());
        let cpu: [f64; PROCESSES - 1] = std::array::from_fn(|k| {
            let v: Vec<f64> = per_round_cpu
                .iter()
                .map(|r| r[k])
                .filter(|x| x.is_finite())
                .collect();
            if v.is_empty() {
                f64::NAN
            } else {
                crate::median(&v)
            }
        });
        Ok(Row {
            model: m.name.clone(),
            set: m.set.clone(),
            orig_ms,
            plain: col(0),
            quiet: col(1),
            busy: col(2),
            anch_quiet: col(3),
            anch_busy: col(4),
            busy_speed: busy["gap_model"]["speed"].as_f64().unwrap_or(f64::NAN),
            busy_capture_over_orig: busy["gap_model"]["capture_gaps_ms"]
                .as_f64()
                .unwrap_or(f64::NAN)
                / orig_ms,
            faults: (
                crate::median(&orig_faults),
                plain["page_faults_per_iter"].as_f64().unwrap_or(f64::NAN),
            ),
            failed,
            nonfinite,
            // Like for like: the original's profile counts what was allocated while it ran
            // and is still held (its peak over its start: intermediates, grads, new optimizer
            // state), not the parameters and inputs that lived before; the replay counts its
            // first measured iteration's allocations through the same allocator the same way.
            peak_ratio: plain["iteration_memory"]["peak_over_start_bytes"]
                .as_f64()
                .unwrap_or(f64::NAN)
                / meta["peak_over_start_bytes"].as_f64().unwrap_or(f64::NAN),
            rounds: per_round,
            cpu,
            rounds_cpu: per_round_cpu,
            round_original_ms: orig,
            round_original_cpu_ms: orig_cpu,
            round_original_wait_ms: orig_wait,
            processes,
            drift: refs.map(|r| drift(&read_json(r), cpu[0])),
        })
    }
}

/// The parts a model's rounds are split into by default (`--round-parts N`), each part in
/// processes of its own (started anew). A program's speed differs by process (bf16_cnn_infer's
/// `max_pool2d` 168-284 µs over ten processes of its plain replay, each steady within itself),
/// so a ratio from one process of each side is one draw of each, and two parts halve that
/// draw's weight; but a process's start (its first block: Python's import, the replay's
/// calibrations) takes about 3 s on this VM (timing the references in two halves took their
/// quiet pass from about 12 to 21 minutes), more beside the burners, so two parts would add
/// half an hour or more to a run of the zoo: one by default.
pub(super) const ROUND_PARTS: usize = 1;

/// Processes per round: the original, the plain replay, the replays with gaps from the quiet
/// and the busy capture, and the anchored ones on each.
pub(super) const PROCESSES: usize = 6;

/// Every model's rounds and its row (with what the model covers); `refs`: each model's quiet
/// and busy references.
pub(super) fn run_all(
    h: &Harness,
    models: &[Model],
    refs: &[(PathBuf, PathBuf)],
) -> Result<Vec<(Row, String)>> {
    let mut rows = Vec::new();
    // Models take their rounds in groups of [`SPREAD_MODELS`], round-robin: a round of one
    // model, then one of the next, so a model's rounds spread over the group's whole time
    // rather than the few seconds its own would take. The host's spells (another tenant, the
    // vCPU's sibling) last tens of seconds, and the original's Python and the replay do not
    // slow alike in them: back to back, a model's rounds could all sit in one.
    let chosen: Vec<(&Model, &(PathBuf, PathBuf))> = models.iter().zip(refs).collect();
    for group in balanced_groups(&chosen, SPREAD_MODELS) {
        let mut runs: Vec<Run> = group
            .iter()
            .map(|&(m, (ref_q, ref_b))| Run::new(h, m, ref_q, ref_b))
            .collect();
        run_rounds(h, &mut runs)?;
        for run in runs {
            let covers = run.m.covers.clone();
            let row = run.finish(h)?;
            log_row(&row);
            rows.push((row, covers));
        }
    }
    Ok(rows)
}

/// The rounds of one group's models (`runs`), a round of each in turn.
fn run_rounds(h: &Harness, runs: &mut [Run]) -> Result<()> {
    let (rounds, round_parts) = (h.opts.rounds, h.opts.round_parts);
    // The rounds in parts ([`ROUND_PARTS`]), each part's processes started anew (the last
    // part's report what the replays ran). Each part: its rounds, one block of each process in
    // turn (each round of a model between one of each other model of its group). A replay
    // is given one block more than it runs here: on its last block it goes on to its end
    // (the report, its profiled iterations) at once, which shared the core with the next
    // process's block when that was the last round's (that round's original read 4.04 ms
    // against 1.5-1.7, and a model's only round with `fidelity 1` 1.9-3.3x); the spare
    // block runs when the harness closes its input, after every round.
    let parts = round_parts.clamp(1, rounds.max(1));
    let mut done = 0;
    for part in 0..parts {
        let n = (rounds - done) / (parts - part);
        for run in runs.iter_mut() {
            // The part before's processes end first (killed: their reports are not read).
            run.procs.clear();
        }
        for run in runs.iter_mut() {
            run.procs = run.start(h, n + 2)?;
        }
        for round in done..done + n {
            for at in turn_order(runs.len(), round) {
                runs[at].round(round)?;
            }
        }
        done += n;
    }
    Ok(())
}

/// The `--against` build's replay arguments for a model (`meta`: its quiet capture's record;
/// `ref_q`: its quiet reference).
fn against_args(h: &Harness, meta: &serde_json::Value, ref_q: &Path) -> Vec<String> {
    let against_args = &h.opts.against_args;
    // The --against build's arguments may choose another iteration.
    let b_args: Vec<String> = if against_args.iter().any(|a| a.starts_with("--iteration")) {
        against_args.clone()
    } else {
        h.opts
            .against_capture
            .iteration_args(meta)
            .iter()
            .chain(against_args)
            .cloned()
            .collect()
    };
    // `{reference}` stands for this model's quiet capture's reference, so that an A/B can
    // run the anchored model (`--against-args '--reference {reference} ...'`).
    b_args
        .into_iter()
        .map(|a| {
            if a == AGAINST_REFERENCE {
                ref_q.display().to_string()
            } else {
                a
            }
        })
        .collect()
}

/// The replays' reports, at their end: the plain replay's, those with gaps from the quiet and
/// from the busy capture (or the A/B's), and the anchored ones on each (`procs`: the model's
/// [`PROCESSES`], the original first, which is stopped).
fn reports(procs: Vec<Paced>) -> Result<[serde_json::Value; PROCESSES - 1]> {
    let [original, plain, quiet, busy, anch_q, anch_b]: [Paced; PROCESSES] = procs
        .try_into()
        .map_err(|_| anyhow::anyhow!("{PROCESSES} paced processes"))?;
    drop(original);
    let (plain, quiet, busy) = (plain.finish()?, quiet.finish()?, busy.finish()?);
    let (anch_q, anch_b) = (anch_q.finish()?, anch_b.finish()?);
    Ok([plain, quiet, busy, anch_q, anch_b])
}

/// What a replay process ran: its gap model's total (and its calibrations') and its own
/// medians of op and iteration time, to tell a model's ratio apart into ops and gaps.
fn process_figures(r: &serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "iter_ms": r["iter_ms"]["median"], "op_ms": r["op_ms"]["median"],
        "emulated_ms": r["gap_model"]["emulated_ms"],
        "calibrations_ms": r["gap_model"]["calibrations_ms"],
        "speed": r["gap_model"]["speed"], "gap_pace": r["gap_pace"],
        "anchored": r["gap_model"]["anchored"],
        "ops_between_gaps": r["gap_model"]["ops_between_gaps"],
    })
}

/// Values: every op runs and nothing goes NaN/Inf (checked on every op's outputs), in a
/// replay of the quiet capture `et_q` (`one`: the iteration it replays). Its failed ops and
/// where the first NaN/Inf came from.
fn check_values(bin: &Path, et_q: &Path, one: &[String]) -> Result<(u64, String)> {
    let check: Vec<String> = one
        .iter()
        .cloned()
        .chain(["--check-values".into()])
        .collect();
    let checked = replay(bin, et_q, 30, &check)?;
    let nonfinite = match &checked["first_nonfinite"] {
        serde_json::Value::Null => format!("{}", checked["nonfinite_externals"]),
        v => format!(
            "{} ({})",
            v["op"].as_str().unwrap_or("?"),
            checked["nonfinite_externals"]
        ),
    };
    Ok((
        checked["ops_failed"].as_u64().unwrap_or(u64::MAX),
        nonfinite,
    ))
}

/// Logs a model's row: its ratios, their rounds' quartiles, and the ratios in CPU time.
fn log_row(row: &Row) {
    let quartiles = |k: usize| {
        let v = sorted_finite(row.rounds.iter().map(|r| r[k]));
        format!("{:.2}-{:.2}", quantile(&v, 0.25), quantile(&v, 0.75))
    };
    eprintln!(
        "[fidelity] {:<18} orig {:.3} ms: plain {:.3}, +gaps {:.3} (quiet) {:.3} (busy), anchored {:.3} {:.3}; rounds' quartiles {}, {}, {}, {}, {}; in CPU time {:.3}, {:.3} {:.3}, {:.3} {:.3}",
        row.model, row.orig_ms, row.plain, row.quiet, row.busy, row.anch_quiet, row.anch_busy,
        quartiles(0), quartiles(1), quartiles(2), quartiles(3), quartiles(4),
        row.cpu[0], row.cpu[1], row.cpu[2], row.cpu[3], row.cpu[4]
    );
}
