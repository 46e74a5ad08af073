//! The command-line grammar of `mystique`, shared by the `mystique` binary (which parses it and
//! runs every command that does not need libtorch) and `mystique-replay` (which runs `replay`,
//! `compare` and `env`), so that both accept exactly the same arguments.

use clap::{Parser, Subcommand};
use et_graph::Kind;
use std::path::PathBuf;

use crate::compose_cmd;

#[derive(Parser)]
#[command(
    name = "mystique",
    version,
    about = "Turn PyTorch execution traces into portable, faithful benchmarks"
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
    /// Print one JSON object instead of tables (every command).
    #[arg(long, global = true)]
    pub json: bool,
    /// Log what each stage does and how long it takes, on stderr (-vv: per iteration too).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Summarise an execution trace: schema, ops, tensors, devices, iterations, collectives.
    Inspect {
        /// ET file (.json or .json.gz), or - for stdin.
        trace: PathBuf,
        /// How many ops of the histogram to print in the table (all with --json).
        #[arg(long, default_value_t = 25)]
        top: usize,
    },
    /// Graph statistics: replay set, op classes, skipped nodes with reasons, tensors, peak memory.
    Graph {
        /// ET file (.json or .json.gz), or - for stdin.
        trace: PathBuf,
        /// Only these ProfilerStep#N iterations (comma-separated).
        #[arg(long, value_delimiter = ',')]
        iteration: Option<Vec<u64>>,
    },
    /// Link the replay-set ops of an ET to the events of its Kineto trace.
    Link {
        /// ET file (.json or .json.gz) captured together with the Kineto trace.
        et: PathBuf,
        /// Kineto (Chrome trace) JSON of the same run, as torch.profiler writes it (.json or
        /// .json.gz).
        kineto: PathBuf,
    },
    /// Extract a selection of ops (with their subtrees) into a new trace.
    Select {
        /// ET file (.json or .json.gz), or - for stdin.
        trace: PathBuf,
        #[command(flatten)]
        filters: compose_cmd::Filters,
        /// Output trace (.json, .json.gz, or - for stdout).
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Make new traces from existing ones: repeat, concat, scale, dtype, remove.
    Compose {
        #[command(subcommand)]
        op: ComposeOp,
    },
    /// Export a selection as Graphviz DOT (ops and data edges) or as an MLCommons Chakra
    /// protobuf execution trace (for simulators such as ASTRA-sim).
    #[command(group(clap::ArgGroup::new("format").required(true).args(["dot", "chakra"])))]
    Export {
        /// ET file (.json or .json.gz), or - for stdin.
        trace: PathBuf,
        /// Graphviz DOT: the selection's ops and data edges.
        #[arg(long)]
        dot: bool,
        /// Chakra protobuf execution trace (et_def.proto): one node per op, data and control
        /// dependencies, collectives with their type, size and process group.
        #[arg(long)]
        chakra: bool,
        /// With --chakra: also put each op's predecessor on its thread in `data_deps`, since
        /// ASTRA-sim's feeder follows `data_deps` only (otherwise it may reorder ops).
        #[arg(long, requires = "chakra")]
        astra_sim: bool,
        #[command(flatten)]
        filters: compose_cmd::Filters,
        /// Output file (- for stdout).
        #[arg(short, long, default_value = "-")]
        output: PathBuf,
    },
    /// Replay the trace's operators for real through libtorch and report coverage and timing.
    Replay(ReplayArgs),
    /// Replay a linked ET and compare it with its Kineto trace, per op and per iteration.
    ///
    /// After its measured iterations (--warmup, --iters) the replay runs under the capture's
    /// instrumentation: one iteration that warms the profiler up, unrecorded, then as many
    /// recorded ones as --iters, at most 3, whose op windows are set against the Kineto
    /// durations.
    Compare(CompareArgs),
    /// Print the libtorch build this binary runs on and whether CUDA is usable.
    Env,
    /// Package traces as a portable benchmark: the selected trace(s), their compiled replay
    /// plans and a manifest, runnable anywhere with `mystique run`.
    Generate(GenerateArgs),
    /// Run a benchmark package and write its result (format mystique-result/1).
    Run(RunPackageArgs),
    /// Compare two results of one package, per op signature and per iteration.
    Diff {
        /// The baseline result (a `mystique run` result file, mystique-result/1).
        a: PathBuf,
        /// The result to compare with the baseline (same package).
        b: PathBuf,
        /// Also plot the ops that changed most, either way: both results' time per iteration
        /// and B/A on a log axis (.svg or .png, by the extension).
        #[arg(long, value_name = "PATH")]
        svg: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
pub enum ComposeOp {
    /// Repeat the iteration N times (fresh node ids; parameters are shared across copies).
    Repeat {
        /// ET file (.json or .json.gz), or - for stdin.
        trace: PathBuf,
        /// How many copies of the iteration the new trace holds.
        n: usize,
        /// Output trace (.json, .json.gz, or - for stdout).
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Concatenate traces: ids of later ones shifted, their threads continuing the first's,
    /// their `ProfilerStep#N` numbered on where the numbers would repeat.
    Concat {
        /// Two or more ET files, in the order their ops run in the new trace.
        #[arg(required = true, num_args = 2..)]
        traces: Vec<PathBuf>,
        /// Output trace (.json, .json.gz, or - for stdout).
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Scale every dimension of size DIM by FACTOR (e.g. batch 64 -> 128), with the shape
    /// arguments that hold it (view, reshape, expand sizes). A width of the same size scales too,
    /// and a size flattened into another dimension (batch x sequence as rows) does not: the
    /// views that then no longer fit are named in a warning.
    Scale {
        /// ET file (.json or .json.gz), or - for stdin.
        trace: PathBuf,
        /// The dimension size to scale (every tensor dimension of exactly this size).
        #[arg(long)]
        dim: i64,
        /// What to multiply that size by (a whole number).
        #[arg(long)]
        factor: i64,
        /// Output trace (.json, .json.gz, or - for stdout).
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Change an element type everywhere (e.g. --from float32 --to bfloat16).
    Dtype {
        /// ET file (.json or .json.gz), or - for stdin.
        trace: PathBuf,
        /// The element type to replace, by its torch name (float32, bfloat16, int64, ...).
        #[arg(long)]
        from: String,
        /// The element type to put in its place.
        #[arg(long)]
        to: String,
        /// Output trace (.json, .json.gz, or - for stdout).
        #[arg(short, long)]
        output: PathBuf,
    },
    /// A job's rank traces with its data-parallel dimension grown to a larger world: every new
    /// rank made from the captured rank at the same place in the other parallel dimensions
    /// (tensor, pipeline), the process groups made again, each collective's sizes following its
    /// group by its kind. Every other command (inspect, replay --ranks, export, generate) takes
    /// the output as a captured job.
    World {
        /// Every rank's trace: a directory, a glob ('traces/rank*.et.json.gz') or the files.
        #[arg(required = true)]
        traces: Vec<PathBuf>,
        /// The world size to write (at least the captured one; whole replicas of the
        /// model-parallel dimensions).
        #[arg(long, value_name = "N")]
        world: usize,
        /// The data-parallel process groups, by their description (pg_desc) or one's pg_name,
        /// where the description does not say so (as `mesh_dp` or `DATA_PARALLEL_GROUP` do).
        /// Without subgroups the world is the data-parallel group.
        #[arg(long, value_name = "DESC")]
        data_parallel: Option<String>,
        /// The directory to create (new or empty): `worldN.rankR.et.json.gz` per rank.
        #[arg(short, long)]
        output: PathBuf,
        /// Write each rank's Chakra execution trace (`worldN.R.et`, as ASTRA-sim names them)
        /// instead of its ET: a large world for a simulator without writing its ETs.
        #[arg(long)]
        chakra: bool,
        /// With --chakra: order each rank's nodes as ASTRA-sim's feeder wants (as `export
        /// --astra-sim`).
        #[arg(long, requires = "chakra")]
        astra_sim: bool,
        /// Where neither the traces' records nor their file names tell the ranks apart, take
        /// the files in listed order as ranks 0..N-1.
        #[arg(long)]
        rank_order: bool,
    },
    /// Remove the selected ops and their subtrees.
    Remove {
        /// ET file (.json or .json.gz), or - for stdin.
        trace: PathBuf,
        #[command(flatten)]
        filters: compose_cmd::Filters,
        /// Output trace (.json, .json.gz, or - for stdout).
        #[arg(short, long)]
        output: PathBuf,
    },
}

#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    /// ET file (.json, .json.gz, or - for stdin). Under torchrun (RANK, WORLD_SIZE, MASTER_ADDR,
    /// MASTER_PORT set), this rank's trace, or a directory of every rank's (each rank takes its
    /// own, ranked as --ranks ranks them): its collectives run with the other ranks'.
    #[arg(required_unless_present = "ranks")]
    pub trace: Option<PathBuf>,
    /// Replay every rank together on this machine, one process per rank over loopback: a
    /// directory (every execution trace in it, recognised by its content), a glob
    /// ('traces/rank*.et.json.gz'), or the rank traces themselves (as an unquoted glob
    /// expands). Each trace's rank comes from its own records, else from a
    /// number in its file name (_0, -rank3, rank_7, .7.), else from --rank-order. Each rank
    /// runs one intra-op thread unless --threads or OMP_NUM_THREADS says otherwise (as
    /// torchrun sets it for several processes on one machine).
    #[arg(long, conflicts_with = "trace", num_args = 1.., value_name = "RANKS")]
    pub ranks: Option<Vec<String>>,
    /// With --ranks (or a directory under a launcher): where neither the traces' records nor
    /// their file names tell the ranks apart, take the files in listed (natural) order as ranks
    /// 0..N-1.
    #[arg(long)]
    pub rank_order: bool,
    /// Seconds a rank waits for the others (rendezvous, each collective) before it fails.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
    /// Where to replay: cpu, cuda or cuda:N. A trace captured on GPU replays on CPU and the
    /// reverse.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    #[command(flatten)]
    pub run: RunArgs,
    /// Only these ProfilerStep#N iterations (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub iteration: Option<Vec<u64>>,
    /// Stop at the first failing op (exit 2: the run did not complete).
    #[arg(long)]
    pub strict: bool,
    /// Write a Chrome/Perfetto trace of the last measured iteration (one slice per op; on CUDA
    /// launches and device times on two tracks, and NVML counter tracks).
    #[arg(long)]
    pub trace_out: Option<PathBuf>,
    /// CUDA: sample the GPU through NVML every MS milliseconds (0: off; default 20).
    #[arg(long, value_name = "MS")]
    pub nvml_period: Option<u64>,
    /// CUDA: write an SVG of the NVML timelines (SM and memory utilisation, power, clocks, ...).
    /// With --ranks, one per rank: out.svg -> out.rank3.svg.
    #[arg(long, value_name = "PATH")]
    pub gpu_svg: Option<PathBuf>,
    /// Load a library of custom operators first (repeatable), like torch.ops.load_library.
    #[arg(long)]
    pub load_library: Vec<PathBuf>,
    /// The Kineto trace captured with this ET: the gaps of --emulate-gaps, and, where it was
    /// profiled with profile_memory=True, where the original freed each tensor (the replay
    /// frees it there rather than at its last use, so that it holds what the original held).
    #[arg(long)]
    pub kineto: Option<PathBuf>,
    /// A profile of the same program taken with profile_memory=True (one iteration, in the
    /// process that recorded the ET, as `mystique.capture` writes NAME.memory.json): the
    /// replay frees each tensor where the original freed it. Without it, --kineto's memory
    /// events serve where it has them.
    #[arg(long, value_name = "FILE")]
    pub memory_profile: Option<PathBuf>,
    /// Free each tensor at its last use even where --kineto's profile recorded where the
    /// original freed it (without a profile the replay frees there anyway).
    #[arg(long, conflicts_with = "memory_profile", requires = "kineto")]
    pub frees_at_last_use: bool,
    /// Reproduce the original run's time outside operators (Python, autograd) between ops,
    /// from the --kineto profile. With one of a trace's several ProfilerStep#N iterations
    /// chosen (--iteration N), the
    /// gaps and op times are typical of all its iterations that ran the same ops (each the
    /// least over them), so one iteration's cold start or stalls do not count.
    #[arg(long, requires = "kineto")]
    pub emulate_gaps: bool,
    /// With --emulate-gaps on one of several iterations: that iteration's gaps alone.
    #[arg(long, requires = "emulate_gaps")]
    pub gaps_of_one_iteration: bool,
    /// With --emulate-gaps: charge each boundary between ops the calibration replay's own time
    /// between its steps under the instrumentation, instead of what the instrumentation adds to
    /// a real op call (an unboxed aten::add, probed on this host with and without it). The
    /// probe is the default because it is steady from one calibration to the next, where the
    /// replay's own boundary moves by several times; that boundary also holds the replay's
    /// own dispatch outside the op's event. For A/B runs.
    #[arg(long, requires = "emulate_gaps")]
    pub replay_boundary_costs: bool,
    /// With --emulate-gaps on a linked pair (the observer and the profiler together): charge
    /// each boundary its own op's call, probed with the op's own inputs (the record-function
    /// scope the dispatcher opens for it, without the call), plus the boxing of the inputs,
    /// instead of one probed op's cost. Steady from one calibration to the next, and it
    /// follows each op's inputs, but it leaves out how much the instrumentation slows the
    /// original's own work between ops: on held-out linked pairs it over-fills, the smallest
    /// models most. For A/B runs.
    #[arg(
        long,
        requires = "emulate_gaps",
        conflicts_with = "replay_boundary_costs"
    )]
    pub call_probed_boundaries: bool,
    /// With --emulate-gaps: measure the time base the gaps follow the host's speed from with
    /// the gaps in place (a short replay spinning them; an anchored model is anchored on it)
    /// instead of with the ops back to back. Not the default: on a busy replay host it brings
    /// the anchored model on quiet references closer to the original, but the model without a
    /// reference, and the anchored one on busy references, further from it. For A/B runs.
    #[arg(long, requires = "emulate_gaps")]
    pub time_base_with_gaps: bool,
    /// With --emulate-gaps: anchor the gaps' total on a reference timed on the capture host, a
    /// JSON file with `original_ms` (the original's uninstrumented iteration), `replay_ms` and
    /// `replay_op_ms` (this tool's plain replay of the same trace timed beside it: the
    /// `iter_ms` median of `mystique replay TRACE --json`, and that times the ops' share of
    /// the iteration by the means of `op_ms` and `iter_ms`): the replay with gaps
    /// then takes the original's time there put on this host by the plain replay's own ratio,
    /// with the gaps shaped as the profile shows them. No instrumentation cost enters the
    /// total. Optional `original_wait_ms` and `replay_wait_ms`, the time each waited for a CPU
    /// on a shared capture host, are taken out of its time (the anchor works in running time).
    #[arg(long, value_name = "FILE", requires = "emulate_gaps")]
    pub reference: Option<PathBuf>,
    /// On the capture host: write the reference that `--reference` reads, this plain replay's
    /// `iter_ms` median and its time in ops (the median times the ops' share by the means)
    /// beside the original's uninstrumented iteration
    /// (`--original-ms`, or `iter_ms_median` of a `NAME.meta.json` beside the trace). Time the
    /// original just before or after, on the same host in the same state: the reference is
    /// the pair's ratio there.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["emulate_gaps", "ranks"])]
    pub reference_out: Option<PathBuf>,
    /// With --reference-out: the original's uninstrumented iteration (ms) on this host.
    #[arg(long, value_name = "MS", requires = "reference_out")]
    pub original_ms: Option<f64>,
    /// With --reference-out, on a shared capture host: of the original's iteration, the time
    /// it waited for a CPU (ms per iteration; on Linux the second field of
    /// `/proc/thread-self/schedstat`, in ns, read before and after the timed iterations).
    /// The anchor then takes both programs in running time: the plain replay records its own
    /// wait. Omit it on a quiet host.
    #[arg(long, value_name = "MS", requires = "reference_out")]
    pub original_wait_ms: Option<f64>,
    /// For a harness that compares programs side by side: run the measured iterations in
    /// blocks of N, each when a line arrives on stdin (end of input: the rest run back to
    /// back), and answer each block with one JSON line on stdout (`block_ms`, `iters`,
    /// `minor_faults`, and `wait_ms`: the time the replay waited for a CPU in the block, where
    /// the kernel says) before the report.
    #[arg(long, value_name = "N", conflicts_with = "ranks")]
    pub paced: Option<usize>,
    #[command(flatten)]
    pub comm: CommArgs,
}

/// How `--rebalance` re-splits all-to-all(v) collectives.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rebalance {
    /// Every rank sends each rank of the group the same rows.
    Equal,
}

/// How the collectives run: PARAM comms-replay's modes and filters.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct CommArgs {
    /// A barrier on each collective's process group before and after it: the report gives
    /// the collective's own latency apart from the time ranks waited for each other at the
    /// barrier before it (skew_us) and its latency until every rank had it done
    /// (global_latency_us). Sends and receives run without barriers.
    #[arg(long)]
    pub blocking: bool,
    /// Issue each collective when the trace issued it, counted from the iteration's first op
    /// (a linked Kineto trace gives the times: --kineto, or with --ranks each rank's profile
    /// beside its trace, NAME.kineto.json[.gz]): with --only comm the compute left out is
    /// waited out as recorded, so the job's communication keeps its pattern in time.
    #[arg(long)]
    pub paced_by_trace: bool,
    /// Replay the communication on N ranks, fewer than captured (PARAM's auto-shrink; with
    /// --only comm): ranks 0..N-1 replay their own traces, each process group keeps its
    /// members among them, all-gather outputs and reduce-scatter inputs follow their group's
    /// size, all-to-all splits keep the kept ranks' entries. A collective whose root or peer
    /// is not kept is refused by name.
    #[arg(long, value_name = "N")]
    pub world: Option<usize>,
    /// With --world under a launcher: the capture's world size, where the trace does not
    /// record it (--ranks passes it to each rank).
    #[arg(long, value_name = "N", hide = true)]
    pub captured_world: Option<usize>,
    /// Known inputs through each collective (every rank puts its group rank + 1 in what it
    /// copies, 1 in what it reduces) and its result verified after it completes; a wrong
    /// result stops the replay naming the rank, collective and node. The check overwrites the
    /// collectives' values, so a full replay's compute after them reads those.
    #[arg(long)]
    pub check_collectives: bool,
    /// With --only comm: only collectives of these kinds (comma-separated: all_reduce,
    /// all_gather, reduce_scatter, all_to_all, broadcast, reduce, gather, scatter, send, recv,
    /// barrier; send and recv together); waits always run.
    #[arg(long, value_name = "KINDS", value_delimiter = ',')]
    pub allow_collectives: Option<Vec<String>>,
    /// With --only comm: re-balance all-to-all(v) splits. `equal` (PARAM's policy): every
    /// rank of the group sends each the same rows, the group's mean of what its ranks sent in
    /// the trace, agreed on with an all-reduce at the first call.
    #[arg(long, value_name = "POLICY")]
    pub rebalance: Option<Rebalance>,
    /// With --only comm: only the first N collectives of each process group in the iteration,
    /// and the first N sends to each peer and receives from each, per tag (refused on a rank
    /// that receives from any source).
    #[arg(long, value_name = "N")]
    pub max_collectives: Option<usize>,
}

/// How a replay runs, shared by `replay` and `compare`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Warm-up iterations, run before the measured ones and not timed (they bring caches, the
    /// allocator and lazily initialised kernels to a steady state).
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Seed of the synthetic input values (the same seed, the same values).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Measured iterations: the report's times are statistics over these (at least 1).
    #[arg(long, default_value_t = 10, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub iters: usize,
    /// Intra-op threads libtorch may use per op, at most 4x this machine's cores (default: the
    /// capture's, at most this machine's cores, where a NAME.meta.json beside the trace
    /// records them and OMP_NUM_THREADS is unset; else libtorch's own, usually one per
    /// physical core).
    #[arg(long)]
    pub threads: Option<i32>,
    /// Which ops to run: all, compute (everything but collectives) or comm (collectives only).
    /// Left-out ops pass their inputs through and are not timed.
    #[arg(long, default_value = "all")]
    pub only: Kind,
    /// Replay the forward ops without autograd recording (by default they record a graph, as
    /// the original's did: same nodes, saved tensors and differentiable kernel paths).
    #[arg(long)]
    pub no_autograd: bool,
    /// Check every op's outputs for NaN/Inf and name the first op that produced one (slow;
    /// kept out of the timings).
    #[arg(long)]
    pub check_values: bool,
    /// Run even when the replay's estimated peak memory exceeds the memory available.
    #[arg(long)]
    pub force: bool,
}

#[derive(clap::Args, Debug)]
pub struct CompareArgs {
    /// The ET captured together with the Kineto trace (`*.linked.et.json`).
    pub trace: PathBuf,
    /// The Kineto (Chrome trace) JSON captured in the same run (.json or .json.gz): the
    /// original's per-op durations and the gaps between ops.
    pub kineto: PathBuf,
    /// Plot the ops that differ most: the original's and the replay's time per iteration on
    /// the table's basis, and replay/original on a log axis (.svg or .png, by the extension).
    #[arg(long, value_name = "PATH")]
    pub svg: Option<PathBuf>,
    /// Plot the fidelity card: each figure's replay/original on a log axis with both values
    /// (.svg or .png).
    #[arg(long, value_name = "PATH")]
    pub card_plot: Option<PathBuf>,
    /// Emulate the original's time outside operators (Python, autograd) from the Kineto
    /// trace's gaps between ops, as `replay --emulate-gaps` does.
    #[arg(long)]
    pub emulate_gaps: bool,
    /// The original's uninstrumented iteration time (ms): the iteration is then compared
    /// uninstrumented with uninstrumented. Default: `iter_ms_median` of a `NAME.meta.json`
    /// beside the trace (as the capture scripts write); without either, the instrumented
    /// replay is compared with the profiled original.
    #[arg(long, value_name = "MS")]
    pub original_ms: Option<f64>,
    /// Where to replay: cpu, cuda or cuda:N. On CUDA, ops compare by GPU time (the original's
    /// kernels under each op vs the replay's CUDA events) and the GPU activity of both is
    /// reported.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// With --emulate-gaps: the capture host's reference (`replay --reference-out`, or
    /// `NAME.reference.json` of `mystique.capture(..., reference=True)`), which the gaps' total
    /// is anchored on, as `replay --reference` anchors it.
    #[arg(long, value_name = "FILE", requires = "emulate_gaps")]
    pub reference: Option<PathBuf>,
    /// Compare this ProfilerStep#N iteration of a trace that holds several (a linked pair of
    /// several profiled steps); its gaps are still typical of all iterations like it.
    #[arg(long, value_name = "N")]
    pub iteration: Option<u64>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(clap::Args, Clone, Debug)]
pub struct GenerateArgs {
    /// One trace per rank, ordered as `replay --ranks` orders them: by the rank each recorded,
    /// else by the number in its file name. Or a capture (`mystique.capture`'s files, or their
    /// directory): its `NAME.et.json`, with `NAME.kineto.json` (the original's timing and
    /// gaps, as --kineto --emulate-gaps; else `NAME.timing.json`, a profile taken without the
    /// observer), `NAME.reference.json` (as --reference) and
    /// `NAME.meta.json` (the uninstrumented iteration, as --original-ms) where present.
    #[arg(required = true)]
    pub traces: Vec<PathBuf>,
    #[command(flatten)]
    pub filters: compose_cmd::Filters,
    /// The package directory to create (must not exist, or be empty).
    #[arg(short, long)]
    pub output: PathBuf,
    /// The Kineto trace captured with the ET: the original's timing goes in the manifest. For
    /// a multi-rank package, one per rank (repeat the option): each rank keeps its own, matched
    /// by the rank the profile recorded (`distributedInfo`), else the number in its file name,
    /// else the order given (that of the traces).
    #[arg(long)]
    pub kineto: Vec<PathBuf>,
    /// The original's iteration time (ms), when no Kineto trace is at hand.
    #[arg(long)]
    pub original_ms: Option<f64>,
    /// Where `original_ms` came from when not from the command line (a capture's meta file).
    #[arg(skip)]
    pub original_from: Option<String>,
    /// The threads a capture's meta file says the original ran with.
    #[arg(skip)]
    pub original_threads: Option<i64>,
    /// The meta files among the inputs of a multi-rank capture: each rank's original iteration,
    /// uninstrumented, beside its trace.
    #[arg(skip)]
    pub rank_metas: Vec<PathBuf>,
    /// Package the --kineto profile (taken as `replay --emulate-gaps` takes it) so that `run`
    /// reproduces the original's time between ops, calibrated on the host that runs it. Its
    /// event names are the model's own: not with --anonymize.
    #[arg(long, requires = "kineto", conflicts_with = "anonymize")]
    pub emulate_gaps: bool,
    /// With --emulate-gaps: the capture host's reference (`replay --reference-out`), which the
    /// gaps' total is anchored on wherever the package runs.
    #[arg(long, value_name = "FILE", requires = "emulate_gaps")]
    pub reference: Option<PathBuf>,
    /// Replace annotation, module, file and attribute names by keyed hashes.
    #[arg(long)]
    pub anonymize: bool,
    /// Write the anonymisation's mapping (original name -> hash) here, outside the package.
    #[arg(long, requires = "anonymize")]
    pub map: Option<PathBuf>,
    /// What-if: scale every dimension of size DIM by FACTOR before packaging (`64:2`).
    #[arg(long, value_name = "DIM:FACTOR")]
    pub scale: Option<String>,
    /// What-if: change an element type everywhere before packaging (`float32:bfloat16`).
    #[arg(long, value_name = "FROM:TO")]
    pub dtype: Option<String>,
    /// Seed of the synthetic input values, stored in the package.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Warm-up iterations (not timed) that `run` does by default, stored in the package.
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Measured iterations that `run` does by default, stored in the package (at least 1).
    #[arg(long, default_value_t = 10, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub iters: usize,
}

#[derive(clap::Args, Debug)]
pub struct RunPackageArgs {
    /// A package directory made by `mystique generate`.
    pub package: PathBuf,
    /// Where to run: cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// The result file (default: <package>.result.json beside the package).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Warm-up iterations, not timed (default: the package's, set by `generate --warmup`).
    #[arg(long)]
    pub warmup: Option<usize>,
    /// Measured iterations (default: the package's, set by `generate --iters`; at least 1).
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub iters: Option<usize>,
    /// Intra-op threads libtorch may use per op (default, unless OMP_NUM_THREADS is set: the
    /// original's that a single-rank package records, at most this machine's cores; one per
    /// rank for several; else libtorch's own). The result records the count used.
    #[arg(long)]
    pub threads: Option<i32>,
    /// Load a library of custom operators first (the package lists the namespaces it needs;
    /// it never loads anything itself).
    #[arg(long)]
    pub load_library: Vec<PathBuf>,
    /// Run even when the estimated peak memory exceeds what is available.
    #[arg(long)]
    pub force: bool,
    /// Seconds a rank waits for the others (multi-rank packages).
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
    /// Run the ops back to back, without the gaps a package generated with --emulate-gaps
    /// carries.
    #[arg(long)]
    pub no_gaps: bool,
}
