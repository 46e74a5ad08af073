//! How a replay runs.

use crate::device::Device;
use std::path::PathBuf;

#[derive(Clone, Debug)]
pub struct ReplayOptions {
    pub device: Device,
    pub warmup: usize,
    pub iters: usize,
    /// Which steps run (`--only`); the others are left out and pass their inputs through.
    pub only: et_graph::Kind,
    pub strict: bool,
    pub trace_out: Option<PathBuf>,
    /// Time to spend before each step (µs), reproducing the original run's time outside
    /// operators (from a linked Kineto trace).
    pub gaps_us: Option<Vec<f64>>,
    /// Each step's plain time (µs) on this host when `gaps_us` were calibrated. With it, the
    /// emulated gaps follow the host's speed since, as the replay's own ops show it (`GapPace`
    /// in the executor): the gaps stand for the original's Python and framework work, which a
    /// VM's slow spell slows as it slows the ops; spun for fixed times, they did not, and a
    /// calibration that fell in a spell of its own left a whole run's gaps off (the same
    /// build's two replays of one model read up to 0.2 apart in one run).
    pub gaps_base_us: Option<Vec<f64>>,
    /// With `gaps_us`: spin them in runs of [`ALTERNATION_RUN`] iterations, every other run
    /// (counting from the first warm-up iteration), the others back to back
    /// ([`ReplayOptions::alternation`]). The runs then tell how much slower the ops run between
    /// the gaps on this host (`et_graph::OpsBetweenGaps`).
    pub gaps_alternating: bool,
    /// Record the median time of every step in the report.
    pub per_step: bool,
    /// Report progress (materialisation, each iteration) on stderr.
    pub progress: bool,
    /// After the measured iterations, run one more under the instrumentation a linked ET +
    /// Kineto pair is captured with, and report each step's profiled window
    /// ([`crate::Report::profiled`]): what that instrumentation costs on these ops, measured.
    pub instrument: bool,
    /// How many instrumented iterations (with `instrument`): each step's window is the median
    /// over them, as is the time before it (one profiled iteration is noisy).
    pub instrument_iters: usize,
    /// The instrumentation those iterations run under: the capture's (a linked pair's, by
    /// default; [`et_graph::Instrumentation::of`] reads it off a Kineto trace).
    pub instrumentation: et_graph::Instrumentation,
    /// With `instrument`: a plain probe iteration before the instrumented ones, and in it and
    /// in the instrumented probe iteration autograd's engine running a few nodes timed
    /// ([`crate::Report::instrumented_node_us`]), and with `probe_op` an op called as Python
    /// calls one too ([`crate::Report::instrumented_op_us`]).
    pub probe_mechanisms: bool,
    /// With `probe_mechanisms`: probe the op call as well (some 256 calls in each probe
    /// iteration, about a millisecond; only `--probed-costs` charges what it measures).
    pub probe_op: bool,
    /// With `probe_op`, under the execution trace observer: probe each op's own call too, its
    /// record-function scope with the step's inputs before the call
    /// ([`crate::Report::instrumented_call_us`]), and the boxing of inputs
    /// ([`crate::Report::instrumented_boxing_us`]); `--call-probed-boundaries` charges them.
    pub probe_calls: bool,
    /// Time in running time: the time the replaying thread waited for a CPU (the kernel's run
    /// delay: another process had the core) is taken out of every step's time, every profiled
    /// window and every iteration. For a calibration, whose times stand for the ops' speed on
    /// this host: on a busy host, an op about a time slice long loses whole slices in most
    /// iterations, and its median would take them for a slower CPU. Costs two reads of the run
    /// delay (about 1 µs each) around every step, outside its time.
    pub running_time: bool,
    /// With `running_time`: the steps whose waits are read (`None`: every step). The reads
    /// are system calls between the ops, which slow the small ops after them (a calibration's
    /// plain op time read 4-20% above a plain replay's on small-op models): a measurement of the ops as the replay runs them reads the waits
    /// only around the steps long enough to lose a time slice in many iterations, and leaves
    /// the rare slice inside a short one to the steps' medians.
    pub running_time_steps: Option<Vec<bool>>,
    /// Replay the ops the original recorded for autograd (its forward) with autograd on, the
    /// parameters requiring grad: graph nodes are built and tensors saved as in the original,
    /// and composite ops take their differentiable paths.
    pub autograd: bool,
    /// Check every op's float outputs for NaN/Inf (slow; outside the timings) and report the
    /// first op that produced one ([`crate::Report::first_nonfinite`]).
    pub check_values: bool,
    /// Run even when the plan's estimated peak memory exceeds what the machine has available.
    pub force: bool,
    /// Run the collectives for real, as one rank of several (`None`: a single process, where
    /// collectives fail as unsupported).
    pub dist: Option<DistOptions>,
    /// CUDA: sample the GPU through NVML every this many ms (0: off).
    pub nvml_period_ms: u64,
    /// Run the measured iterations in blocks, each started and ended through a caller's
    /// [`Pacer`] (`None`: back to back).
    pub pace: Option<Pace>,
    /// Asked before anything is materialised, with the plan's estimated peak for the replay
    /// asked for and for a comm-only one (bytes): a launcher that starts several ranks on one
    /// machine checks their memory together, and `Err(why)` stops this one.
    pub memory_gate: Option<MemoryGate>,
    /// Bytes taken as the CPU's available memory in the check before materialising, instead of
    /// what this machine and its cgroup have (`None`: theirs): what a smaller machine would
    /// refuse.
    pub available_memory: Option<u64>,
    /// How the collectives run beyond the trace's order: blocking, paced, checked.
    pub comm: CommOptions,
    /// The original's allocations and where it freed them (a profile's memory events): the
    /// plan frees each tensor there rather than at its last use ([`crate::plan::Plan::follow_frees`]).
    pub original_allocs: Option<et_graph::OriginalAllocs>,
}

/// How a replay's collectives run, as PARAM's comms replay offers it.
#[derive(Clone, Debug, Default)]
pub struct CommOptions {
    /// A barrier on the collective's process group before and after each collective: the
    /// collective's own latency apart from the time the ranks waited for each other (the
    /// barrier before it) and from its completion on every rank (the barrier after it).
    /// Every collective completes before the next step, waits paired with it included (a send
    /// or receive at the first later step that is not one: its peer's matching call may come
    /// after that rank's next send or receive).
    pub blocking: bool,
    /// Per step, when the trace issued it (µs from the iteration's first op): each collective
    /// waits for its time, so a communication-only replay keeps the job's pattern in time
    /// (the compute left out waited out as recorded). `None` for steps issued at once.
    pub paced_us: Option<Vec<Option<f64>>>,
    /// The recorded iteration's span (ms), reported beside the paced iteration's.
    pub paced_span_ms: Option<f64>,
    /// Known inputs through each collective (this rank's group rank + 1 in every element of
    /// what it copies, 1 in what it reduces; outputs zeroed first) and its result verified
    /// after it completes; a mismatch stops the run naming the rank, collective and node.
    /// Collectives complete before the next step, as with `blocking`.
    pub check: bool,
    /// Which collectives run, on how many ranks ([`crate::plan::CommSelection`]; applied to
    /// the plan before it runs).
    pub select: crate::plan::CommSelection,
    /// All-to-all(v) splits re-balanced: every rank of the group sends each the same rows, the
    /// group's mean (PARAM's `equal` policy), agreed on at the first call.
    pub rebalance_equal: bool,
    /// Fault injection for the check: this rank's input to the collective at this node id is
    /// wrong (its value + 100), so that the check must find it.
    pub corrupt_node: Option<u64>,
}

/// See [`ReplayOptions::memory_gate`].
#[derive(Clone)]
pub struct MemoryGate(pub std::sync::Arc<dyn Fn(u64, u64) -> Result<(), String> + Send + Sync>);

impl std::fmt::Debug for MemoryGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MemoryGate")
    }
}

/// Measured iterations in blocks of `every`, each waiting for the caller's go: a harness stands
/// several replays (and the original model) side by side and runs them in turn, so that the
/// blocks it compares run within milliseconds of each other, in the same spells of the host's
/// speed (a VM's speed moves by up to 2x in spells of 100-200 ms and drifts over minutes, so
/// timings taken one after the other compare the spells as much as the programs).
#[derive(Clone)]
pub struct Pace {
    /// Measured iterations per block (the last one may be shorter).
    pub every: usize,
    pub pacer: std::sync::Arc<dyn Pacer>,
}

impl std::fmt::Debug for Pace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pace").field("every", &self.every).finish()
    }
}

/// The caller's side of [`Pace`]. Both calls happen outside every timing.
pub trait Pacer: Send + Sync {
    /// Returns when the next block may start; `false`: stop pacing (the remaining measured
    /// iterations run back to back).
    fn start(&self) -> bool;
    /// The block just ran `iters` measured iterations (the pacer times the block itself, from
    /// its `start` returning to this call: what a harness compares is the same span for every
    /// process it runs).
    fn end(&self, iters: usize);
}

/// This process's place among the ranks, and where they meet: what torchrun's `RANK`,
/// `WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT` say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DistOptions {
    pub rank: usize,
    pub world_size: usize,
    pub master_addr: String,
    pub master_port: u16,
    /// How long a rank waits for the others (rendezvous, each collective) before failing.
    pub timeout: std::time::Duration,
    /// This rank's place among the ranks on its machine (torchrun's `LOCAL_RANK`), when given:
    /// which GPU `cuda` means for it, and whether it has one of its own for NCCL.
    pub local_rank: Option<usize>,
    /// Where the ranks' store is: served by rank 0, or by torchrun's agent (its
    /// `TORCHELASTIC_USE_AGENT_STORE`), whose store rank 0 must join, not serve.
    pub store: Store,
}

/// Who serves the rendezvous store at `MASTER_ADDR:MASTER_PORT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Store {
    /// Rank 0 (`replay --ranks`, a launcher that starts no store).
    #[default]
    RankZero,
    /// torchrun's elastic agent; `attempt` is its restart count (`TORCHELASTIC_RESTART_COUNT`),
    /// which keys are kept under so that a restarted job does not read a failed one's keys.
    Agent { attempt: u32 },
}

impl DistOptions {
    /// From torchrun's variables; `None` when `WORLD_SIZE` is unset or 1.
    pub fn from_env(timeout: std::time::Duration) -> Result<Option<DistOptions>, String> {
        let var = |k: &str| std::env::var(k).ok();
        let Some(world) = var("WORLD_SIZE") else {
            return Ok(None);
        };
        let num = |k: &str, v: &str| -> Result<usize, String> {
            v.parse()
                .map_err(|_| format!("{k}={v:?} is not a non-negative integer"))
        };
        let world_size = num("WORLD_SIZE", &world)?;
        if world_size <= 1 {
            return Ok(None);
        }
        let rank = match var("RANK") {
            Some(r) => num("RANK", &r)?,
            None => return Err("WORLD_SIZE is set but RANK is not".into()),
        };
        if rank >= world_size {
            return Err(format!("RANK={rank} is not below WORLD_SIZE={world_size}"));
        }
        let master_port = match var("MASTER_PORT") {
            Some(p) => p
                .parse()
                .map_err(|_| format!("MASTER_PORT={p:?} is not a port"))?,
            None => 29500,
        };
        let local_rank = match var("LOCAL_RANK") {
            Some(v) => Some(num("LOCAL_RANK", &v)?),
            None => None,
        };
        let store = match var("TORCHELASTIC_USE_AGENT_STORE").as_deref() {
            Some("True" | "true" | "1") => Store::Agent {
                attempt: match var("TORCHELASTIC_RESTART_COUNT") {
                    Some(v) => num("TORCHELASTIC_RESTART_COUNT", &v)? as u32,
                    None => 0,
                },
            },
            _ => Store::RankZero,
        };
        Ok(Some(DistOptions {
            store,
            local_rank,
            rank,
            world_size,
            master_addr: var("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into()),
            master_port,
            timeout,
        }))
    }
}

/// Iterations in each run of [`ReplayOptions::gaps_alternating`]. Not one: the ops of an
/// iteration run back to back right after one with the gaps ran slower than in a run of such
/// iterations (the ops' data had the gaps' time to go cold: in pairs of single iterations, the
/// back-to-back ones 0.3-2.1% over a plain replay's in the same rounds, five models), so
/// single iterations read 1.0-2.0% between the gaps where whole runs read 2.3-6.2%. The first
/// iteration of a run is left out, so each kind's settled ones are compared.
pub const ALTERNATION_RUN: usize = 3;

impl ReplayOptions {
    /// With `gaps_alternating`: whether iteration `it` (from the first warm-up iteration) spins
    /// the gaps, and whether it is settled (not the first of its run, which follows the other
    /// kind). `None` otherwise.
    pub fn alternation(&self, it: usize) -> Option<(bool, bool)> {
        self.gaps_alternating.then_some((
            (it / ALTERNATION_RUN).is_multiple_of(2),
            !it.is_multiple_of(ALTERNATION_RUN),
        ))
    }
}

impl ReplayOptions {
    /// The probe iterations probe each op's own call ([`ReplayOptions::probe_calls`]): asked
    /// for, with the op probe it is set against, under the execution trace observer.
    pub(crate) fn probes_calls(&self) -> bool {
        self.probe_mechanisms
            && self.probe_op
            && self.probe_calls
            && self.instrumentation.execution_trace
    }
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            device: Device::Cpu,
            warmup: 2,
            iters: 10,
            only: et_graph::Kind::All,
            strict: false,
            trace_out: None,
            gaps_us: None,
            gaps_base_us: None,
            gaps_alternating: false,
            per_step: false,
            progress: false,
            instrument: false,
            instrument_iters: 3,
            instrumentation: et_graph::Instrumentation::LINKED,
            probe_mechanisms: false,
            probe_op: false,
            probe_calls: false,
            running_time: false,
            running_time_steps: None,
            autograd: true,
            check_values: false,
            dist: None,
            force: false,
            nvml_period_ms: 20,
            pace: None,
            memory_gate: None,
            available_memory: None,
            comm: CommOptions::default(),
            original_allocs: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gaps_alternate_in_runs_whose_first_iteration_is_left_out() {
        let off = ReplayOptions::default();
        assert_eq!(off.alternation(4), None);
        let on = ReplayOptions {
            gaps_alternating: true,
            ..Default::default()
        };
        let runs: Vec<(bool, bool)> = (0..2 * ALTERNATION_RUN)
            .map(|it| on.alternation(it).expect("alternating"))
            .collect();
        let spun: Vec<bool> = runs.iter().map(|r| r.0).collect();
        let settled: Vec<bool> = runs.iter().map(|r| r.1).collect();
        assert_eq!(spun, [true, true, true, false, false, false]);
        assert_eq!(settled, [false, true, true, false, true, true]);
        // Over whole pairs of runs, as many settled iterations of each kind.
        let count = |kind: bool| {
            (0..6 * ALTERNATION_RUN)
                .filter(|&it| on.alternation(it) == Some((kind, true)))
                .count()
        };
        assert_eq!(count(true), count(false));
    }
}
