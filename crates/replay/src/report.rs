//! What a replay reports.

use crate::device::MemorySnapshot;
use crate::error::ErrorKind;
use serde::Serialize;

#[derive(Clone, Debug, Serialize)]
pub struct Failure {
    pub op: String,
    pub count: usize,
    /// What kind of failure (from the C++ exception's type, or the replay's own planning).
    pub kind: ErrorKind,
    pub reason: String,
}

/// An op that ran as something else on this device (reported per op).
#[derive(Clone, Debug, Serialize)]
pub struct Fallback {
    pub op: String,
    pub count: usize,
    pub ran_as: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct OpTiming {
    pub op: String,
    /// Calls per iteration.
    pub count: usize,
    /// Milliseconds per iteration.
    pub total_ms: f64,
    pub mean_us: f64,
    /// Host time to launch one call (µs): on CPU the same as `mean_us`; on CUDA the CPU side of
    /// the op, beside its device time.
    pub launch_us: f64,
}

/// What a replay did. Op counts are per iteration of the replay set.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub trace: String,
    pub device: String,
    pub threads: i32,
    pub warmup: usize,
    pub iters: usize,
    pub ops_selected: usize,
    pub ops_replayed: usize,
    pub ops_failed: usize,
    /// Ops left out by `--only` (they pass their inputs through).
    pub ops_skipped: usize,
    pub failures: Vec<Failure>,
    /// What the op and iteration times were measured with: `host clock` (CPU), `cuda events`
    /// (device times on the replay stream; `launch_us` keeps the host side).
    pub timing: &'static str,
    /// Wall time per measured iteration.
    pub iter_ms: metrics::Stats,
    /// Each measured iteration's wall time (ms), in order.
    pub iter_samples_ms: Vec<f64>,
    /// Sum of op times per measured iteration.
    pub op_ms: metrics::Stats,
    /// Each measured iteration's op time (ms), in order (not in the JSON: `op_ms` sums them up).
    #[serde(skip)]
    pub op_samples_ms: Vec<f64>,
    /// Replay bookkeeping per op: (iteration - sum of ops) / ops.
    pub overhead_us_per_op: f64,
    /// Peak bytes of live storages during the first iteration.
    pub peak_bytes: u64,
    /// Tensors that let go of the autograd graph per iteration, after each forward's last
    /// recorded step: the replay runs the trace's backward ops itself, so the graph would
    /// only hold the forward's saved tensors through the whole backward. 0 without autograd.
    pub graph_released: usize,
    /// What the plan's estimate said the replay would hold at its peak (checked against the
    /// memory available before starting; [`crate::Plan::peak_bytes_estimate`]).
    pub estimated_peak_bytes: u64,
    /// Minor page faults of the process per measured iteration (`None`: not counted on this
    /// platform). A warm model takes about none; many mean the replay keeps re-touching fresh
    /// memory, which costs time the original does not spend.
    pub page_faults_per_iter: Option<f64>,
    /// External input tensors holding NaN or Inf after the run: the replay's values diverged
    /// (an in-place update fed by values the original never had), so its kernels may have run
    /// slow or fast paths the original did not. 0 for a faithful run.
    pub nonfinite_externals: usize,
    pub external_bytes: u64,
    pub externals: usize,
    /// A communication-only replay's buffers (`--only comm`): its collectives' tensors are
    /// views of these, reused once the collective using them completed, so their values are
    /// not the model's (nothing that reads them runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<PoolReport>,
    /// The device's memory after the run (CPU: the process's resident memory and its peak).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_memory: Option<MemorySnapshot>,
    /// CUDA: libtorch's caching allocator after the run (intermediates) and the arena holding
    /// the external inputs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cuda_memory: Option<CudaMemory>,
    /// CUDA: NVML counters over the measured iterations and per iteration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuReport>,
    /// CUDA: why there are no NVML counters (no driver library, sampling off, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_unavailable: Option<String>,
    /// CUDA: why op times fell back to the host clock, if they did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_error: Option<String>,
    /// CPU time, context switches, page faults and (where permitted) hardware counters per
    /// measured iteration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<metrics::cpu::CpuReport>,
    /// Per op name, most time first.
    pub ops: Vec<OpTiming>,
    /// Ops replayed through a device fallback.
    pub fallbacks: Vec<Fallback>,
    /// Scalars the trace rounded to 0 that the replay restored (an optimizer's eps), per op.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub restored_scalars: Vec<RestoredScalar>,
    /// This process's rank and the world size, when collectives ran for real.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub world_size: Option<usize>,
    /// How the collectives ran (backend, groups, and what was mapped), when they ran for real.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comm: Option<String>,
    /// Per collective op: calls, bytes and time per measured iteration.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub collectives: Vec<CollectiveTiming>,
    /// Emulated time outside operators per iteration (ms), as spun: the gap model's total at
    /// `gap_pace`; 0 without `--emulate-gaps`.
    pub gaps_ms: f64,
    /// The mean factor the measured iterations' gaps followed this host's speed by, against
    /// the calibration's (the executor's `GapPace`); absent where gaps were spun as given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gap_pace: Option<f64>,
    /// Median time of each step (with `per_step`), in replay-set order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<StepTiming>,
    /// With `per_step` and `gaps_every_other`: each step's median host time in the iterations
    /// that spun the gaps ([0]) and in those that ran back to back ([1]), in replay-set order
    /// (NaN where it has none).
    #[serde(skip)]
    pub steps_alternating_us: Option<[Vec<f64>; 2]>,
    /// With `instrument`: each step's profiled window, in replay-set order (`None` for steps
    /// not dispatched or not found among the profiler's events).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub profiled: Vec<Option<ProfiledStep>>,
    /// With `instrument`: why the instrumented iteration could not run or be read back (the
    /// measured iterations stand; `profiled` is then empty).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instrument_error: Option<String>,
    /// With `instrument`: the capture's instrumentation cost of one event without arguments on
    /// this host (µs), probed with empty record_function scopes, one at a time between the
    /// steps of the last instrumented iteration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instrumented_event_us: Option<f64>,
    /// With `instrument`: its cost of an event such as autograd records for a backward node
    /// (`XBackward0`, with its tensor inputs) on this host, as (µs per event, µs per tensor
    /// input): probed with 1 and with 4 tensors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instrumented_backward_event_us: Option<(f64, f64)>,
    /// Whether those costs were timed one event at a time between the replay's steps (the
    /// last instrumented iteration): with them, always in this build; a report of an earlier
    /// build, whose costs were timed in loops of back-to-back events, lacks it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub events_probed_in_context: bool,
    /// With `instrument`: what the instrumentation adds to an op called as the original's
    /// Python calls one (µs): an unboxed `aten::add` timed between the steps of a plain and of
    /// an instrumented probe iteration, the difference of the means.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instrumented_op_us: Option<f64>,
    /// With `instrument`: what it adds per node to autograd's engine (µs), timed the same way
    /// on a graph of nodes that only route their gradient.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instrumented_node_us: Option<f64>,
    /// With `instrument`: the instrumented iteration's wall time (ms), comparable with a
    /// profiled original's iteration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instrumented_iter_ms: Option<f64>,
    /// With `instrument` on CUDA: the GPU's activity in the instrumented iteration (busy time,
    /// compute vs communication, overlap, top kernels), as `link` reports the original's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_activity: Option<et_graph::GpuActivity>,
    /// With `check_values`: the first op whose output held NaN/Inf.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_nonfinite: Option<NonFinite>,
}

/// Where a replay's values first went NaN/Inf.
#[derive(Clone, Debug, Serialize)]
pub struct NonFinite {
    pub op: String,
    /// The op's ET node id.
    pub id: u64,
    /// The iteration (warm-up ones included) it happened in.
    pub iteration: usize,
}

/// One step of the instrumented iteration (see [`crate::ReplayOptions::instrument`]): its profiled
/// window on the profiler's clock (µs) and the events recorded inside it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ProfiledStep {
    pub start_us: f64,
    pub end_us: f64,
    pub nested: u32,
    /// Time the replaying thread waited for a CPU inside the window (µs; with
    /// [`crate::ReplayOptions::running_time`]). [`crate::Report::profiled`]'s windows have it
    /// taken out already (0 there).
    pub waited_us: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct StepTiming {
    pub id: u64,
    pub op: String,
    /// Median time (device time on CUDA).
    pub us: f64,
    /// Median host (launch) time: the same as `us` on CPU.
    pub launch_us: f64,
}

/// The buffers of a communication-only replay.
#[derive(Clone, Copy, Debug, Serialize, serde::Deserialize, PartialEq)]
pub struct PoolReport {
    /// Buffers made (the most tensors of one dtype and size in use at once, per dtype and size).
    pub buffers: usize,
    pub bytes: u64,
    /// What the plan's estimate said the pool would reach.
    pub estimated_bytes: u64,
}

/// One collective op of a replay, per measured iteration.
#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq)]
pub struct CollectiveTiming {
    pub op: String,
    pub count: usize,
    /// Bytes of the input tensors, as recorded.
    pub bytes: u64,
    /// The calls' message sizes as nccl-tests counts them (an all-gather's whole output, a
    /// reduce-scatter's whole input), summed.
    #[serde(default)]
    pub size_bytes: u64,
    /// Time in the collective, waiting for its peers included.
    pub total_ms: f64,
    /// Algorithm bandwidth, `size_bytes` over the time (GB/s, 10^9 bytes), as nccl-tests
    /// reports it; `None` for what moves no data (a barrier).
    #[serde(default)]
    pub algbw_gbps: Option<f64>,
    /// Bus bandwidth: the algorithm bandwidth times nccl-tests' factor for the kind and group
    /// size (2(n-1)/n for an all-reduce, (n-1)/n for all-gather, reduce-scatter and all-to-all,
    /// 1 for broadcast, reduce, send and recv), comparable across group sizes.
    #[serde(default)]
    pub busbw_gbps: Option<f64>,
}

/// Device memory of a CUDA replay.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct CudaMemory {
    /// libtorch's caching allocator (the intermediates, and anything libtorch allocated).
    pub allocator: crate::ffi::CudaAllocatorStats,
    /// Cached but split blocks no allocation uses, over reserved bytes (0..1).
    pub fragmentation: f64,
    /// The arena the external inputs were carved from (0: they went to libtorch's allocator).
    pub arena_bytes: u64,
}

/// NVML counters of a CUDA replay.
#[derive(Clone, Debug, Serialize)]
pub struct GpuReport {
    pub device: String,
    pub period_ms: f64,
    /// GPM metrics (SM occupancy, DRAM bandwidth, tensor activity) were read.
    pub gpm: bool,
    /// Samples taken over the whole run.
    pub samples: usize,
    /// Over all measured iterations.
    pub measured: metrics::gpu::GpuSummary,
    /// Per measured iteration (short iterations may hold no sample at all).
    pub per_iteration: Vec<metrics::gpu::GpuSummary>,
}

/// Scalars of one op and argument the trace rounded to 0, restored.
#[derive(Clone, Debug, Serialize)]
pub struct RestoredScalar {
    pub op: String,
    pub arg: String,
    pub value: f64,
    pub count: usize,
    pub why: String,
}
