//! What a replay reports.

use crate::device::MemorySnapshot;
use crate::error::ErrorKind;
use serde::Serialize;
use std::collections::BTreeMap;

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
    /// What the first measured iteration allocated through the device's allocator (c10's CPU
    /// allocator, or libtorch's CUDA caching allocator with its peak reset at the iteration's
    /// start), counted as the profiler's memory events count the original's (see
    /// [`IterationMemory`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iteration_memory: Option<IterationMemory>,
    /// Where the frees followed the original's (a profile with memory events was given): the
    /// storages the steps make, those matched to the original's allocations, and of those the
    /// ones freed later than at last use or held to the iteration's end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frees_followed: Option<crate::plan::FreesFollowed>,
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
    /// Per collective kind: calls, bytes, time and latency statistics.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub collectives: std::collections::BTreeMap<String, CollectiveTiming>,
    /// Every collective step with each measured call's latency.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub collective_calls: Vec<CollectiveCall>,
    /// With `--paced-by-trace`: the trace's iteration beside this one's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paced: Option<PacedReport>,
    /// The wall-clock time (µs since the Unix epoch) of the timeline's zero: what puts
    /// several ranks' `--trace-out` timelines on one axis.
    pub timeline_origin_unix_us: f64,
    /// With `--check-collectives`: what was verified.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub check: Option<CheckReport>,
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
    /// With `per_step`: each step's median time from the previous step's end to its start (the
    /// replay's own bookkeeping between the two), in replay-set order (NaN where not timed).
    #[serde(skip)]
    pub step_leads_us: Vec<f64>,
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
    /// Of `instrumented_op_us`, the part inside the op's profiled window (µs): the probe's
    /// event found in the profile, its window less the add's kernel called without the
    /// dispatcher. The capture's op durations hold this part; its gaps hold the rest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instrumented_op_in_window_us: Option<f64>,
    /// With `instrument` and the op probed: per step, what the instrumentation adds to its
    /// call outside the call's profiled window (µs), probed with the step's own op and inputs
    /// (a record-function scope as the dispatcher opens one, without the call); `None` where
    /// not probed. Empty without the probes.
    #[serde(skip)]
    pub instrumented_call_us: Vec<Option<f64>>,
    /// What boxing the inputs for the instrumentation costs a call made as Python makes one
    /// (µs), which the probes of the replay's boxed calls leave out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instrumented_boxing_us: Option<f64>,
    /// With `instrument`: an instrumented iteration's edges (µs, the median): from the start of
    /// the `ProfilerStep#N` scope it runs in to its first op's window, and from its last op's
    /// window to the scope's end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instrumented_edges_us: Option<f64>,
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

/// The collectives of one kind (`all_reduce`, `all_to_all`, ...; [`crate::plan::KINDS`]) in a
/// replay: per measured iteration, and each call's latency over every measured iteration.
#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq)]
pub struct CollectiveTiming {
    /// The ops of this kind that ran (`c10d::allreduce_`, ...).
    pub ops: Vec<String>,
    /// Calls per iteration.
    pub count: usize,
    /// Calls measured (every measured iteration's).
    pub calls: usize,
    /// Bytes of the input tensors per iteration, as recorded.
    pub bytes: u64,
    /// The calls' message sizes per iteration as nccl-tests counts them (an all-gather's whole
    /// output, a reduce-scatter's whole input), summed.
    #[serde(default)]
    pub size_bytes: u64,
    /// Time in the collectives per iteration, waiting for their peers included (with
    /// `--blocking`, the collectives alone: the barrier before each took the waiting).
    pub total_ms: f64,
    /// Each call's latency (µs) over the measured calls.
    pub latency_us: Latency,
    /// With `--blocking`: each call's wait at the barrier before it, for the ranks that came
    /// later (the skew between ranks, apart from the collective's own latency).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skew_us: Option<Latency>,
    /// With `--blocking`: each call's latency until every rank had it done (its own latency
    /// and the barrier after it), as PARAM's global latency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_latency_us: Option<Latency>,
    /// Algorithm bandwidth, `size_bytes` over the time (GB/s, 10^9 bytes), as nccl-tests
    /// reports it; `None` for what moves no data (a barrier).
    #[serde(default)]
    pub algbw_gbps: Option<f64>,
    /// Bus bandwidth: the algorithm bandwidth times nccl-tests' factor for the kind and group
    /// size (2(n-1)/n for an all-reduce, (n-1)/n for all-gather, reduce-scatter and all-to-all,
    /// 1 for broadcast, reduce, send and recv), comparable across group sizes.
    #[serde(default)]
    pub busbw_gbps: Option<f64>,
    /// By message size: the calls whose message is at most `max_bytes` (a power of two) and
    /// above half of it.
    #[serde(default)]
    pub sizes: Vec<SizeBucket>,
}

/// Latency statistics over calls (µs): nearest-rank percentiles.
#[derive(Clone, Copy, Debug, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct Latency {
    pub min: f64,
    pub p50: f64,
    pub p95: f64,
    pub max: f64,
    /// The sum over the calls.
    pub total: f64,
}

impl Latency {
    /// Of these samples (all zero for none).
    pub fn of(samples: &[f64]) -> Latency {
        if samples.is_empty() {
            return Latency::default();
        }
        let mut v = samples.to_vec();
        v.sort_by(f64::total_cmp);
        let rank = |p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Latency {
            min: v[0],
            p50: rank(0.50),
            p95: rank(0.95),
            max: v[v.len() - 1],
            total: v.iter().sum(),
        }
    }
}

/// The calls of one kind whose message size falls in `(max_bytes / 2, max_bytes]`.
#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq)]
pub struct SizeBucket {
    /// A power of two (0: calls that move no data).
    pub max_bytes: u64,
    pub calls: usize,
    /// Their message bytes, summed over the measured calls.
    pub bytes: u64,
    pub latency_us: Latency,
}

impl SizeBucket {
    /// The bucket of a message of `bytes`.
    pub fn bound(bytes: u64) -> u64 {
        if bytes == 0 {
            0
        } else {
            bytes.next_power_of_two()
        }
    }
}

/// One collective step of the replay, every measured call of it: PARAM's per-op record.
#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq)]
pub struct CollectiveCall {
    /// The ET node id.
    pub id: u64,
    pub op: String,
    pub kind: String,
    /// Its process group's name as recorded (`0`: the world).
    pub group: String,
    /// Ranks in its group (0: not recorded, and not the default group).
    pub group_size: usize,
    /// Its message as nccl-tests counts it.
    pub size_bytes: u64,
    /// Bytes of its input tensors, as recorded.
    #[serde(default)]
    pub bytes: u64,
    /// Latency of each measured call (µs), in order.
    pub latency_us: Vec<f64>,
    /// With `--blocking`: the wait at the barrier before each call (µs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skew_us: Vec<f64>,
    /// With `--blocking`: the barrier after each call (µs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after_us: Vec<f64>,
}

/// How a `--paced-by-trace` replay kept to the trace's times.
#[derive(Clone, Copy, Debug, Serialize, serde::Deserialize, PartialEq)]
pub struct PacedReport {
    /// The iteration as the trace recorded it, from its first op's start to its last one's
    /// end (ms).
    pub trace_ms: f64,
    /// Collectives issued at their recorded time.
    pub collectives: usize,
    /// When the trace issued the last of them (ms from the iteration's first op): a paced
    /// iteration lasts at least this long.
    pub last_collective_ms: f64,
}

/// What `--check-collectives` checked.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct CheckReport {
    /// Collective calls per iteration whose results were verified (every one held what its
    /// inputs make; a mismatch stops the replay).
    pub checked: usize,
    /// Ops this check has no model of (their results are not verified), with their calls.
    pub unchecked: std::collections::BTreeMap<String, usize>,
}

/// An iteration's memory on the basis of `torch.profiler(profile_memory=True)`'s `Total
/// Allocated`: bytes allocated through the device's allocator during the iteration and not yet
/// freed, at their peak and at its end (what it left held: new optimizer state, gradients).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct IterationMemory {
    /// The most held at once, over the iteration's start.
    pub peak_over_start_bytes: u64,
    /// Still held when it ended.
    pub held_after_bytes: u64,
    /// How it was measured.
    pub basis: &'static str,
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

impl CollectiveTiming {
    /// Per kind, the timing of these calls (one rank's, or several ranks' for a job: then per
    /// iteration means per rank and iteration); `world`: the group size of a call whose group
    /// size is not recorded.
    pub fn by_kind<'c>(
        calls: impl Iterator<Item = &'c CollectiveCall>,
        iters: usize,
        world: usize,
    ) -> BTreeMap<String, CollectiveTiming> {
        let mut kinds: BTreeMap<String, Vec<&CollectiveCall>> = BTreeMap::new();
        for c in calls {
            kinds.entry(c.kind.clone()).or_default().push(c);
        }
        kinds
            .into_iter()
            .map(|(kind, list)| (kind, CollectiveTiming::of(&list, iters, world)))
            .collect()
    }

    /// The timing of one kind's calls (`list`: every step of the kind, each with its measured
    /// calls), per iteration of `iters`.
    pub fn of(list: &[&CollectiveCall], iters: usize, world: usize) -> CollectiveTiming {
        let factor = |c: &CollectiveCall| {
            let n = if c.group_size > 0 {
                c.group_size
            } else {
                world
            };
            crate::plan::Collective {
                name: c.op.clone(),
                ..Default::default()
            }
            .bus_factor(n)
        };
        let input_bytes = |c: &CollectiveCall| c.bytes;
        let iters = iters.max(1);
        let mut ops: Vec<String> = list.iter().map(|c| c.op.clone()).collect();
        ops.sort();
        ops.dedup();
        let all: Vec<f64> = list
            .iter()
            .flat_map(|c| c.latency_us.iter().copied())
            .collect();
        let calls = all.len();
        let total_us: f64 = all.iter().sum();
        let size_bytes: u64 = list
            .iter()
            .map(|c| c.size_bytes * c.latency_us.len() as u64)
            .sum::<u64>()
            / iters as u64;
        let bytes: u64 = list
            .iter()
            .map(|c| input_bytes(c) * c.latency_us.len() as u64)
            .sum::<u64>()
            / iters as u64;
        let bus: Option<f64> = list
            .iter()
            .filter_map(|c| {
                factor(c).map(|f| f * (c.size_bytes * c.latency_us.len() as u64) as f64)
            })
            .reduce(|a, b| a + b);
        let secs = total_us / 1e6;
        let moved = bus.is_some() && secs > 0.0;
        let mut buckets: BTreeMap<u64, (usize, u64, Vec<f64>)> = BTreeMap::new();
        for c in list {
            let b = buckets.entry(SizeBucket::bound(c.size_bytes)).or_default();
            b.0 += c.latency_us.len();
            b.1 += c.size_bytes * c.latency_us.len() as u64;
            b.2.extend(&c.latency_us);
        }
        let joined = |f: fn(&CollectiveCall) -> &Vec<f64>| {
            let v: Vec<f64> = list.iter().flat_map(|c| f(c).iter().copied()).collect();
            (!v.is_empty()).then(|| Latency::of(&v))
        };
        let skew_us = joined(|c| &c.skew_us);
        let after = joined(|c| &c.after_us);
        let global_latency_us = after.map(|_| {
            let v: Vec<f64> = list
                .iter()
                .flat_map(|c| c.latency_us.iter().zip(&c.after_us).map(|(a, b)| a + b))
                .collect();
            Latency::of(&v)
        });
        CollectiveTiming {
            ops,
            count: calls / iters,
            calls,
            bytes,
            size_bytes,
            total_ms: total_us / 1000.0 / iters as f64,
            latency_us: Latency::of(&all),
            skew_us,
            global_latency_us,
            algbw_gbps: moved.then(|| (size_bytes * iters as u64) as f64 / secs / 1e9),
            busbw_gbps: if moved {
                bus.map(|b| b / secs / 1e9)
            } else {
                None
            },
            sizes: buckets
                .into_iter()
                .map(|(max_bytes, (calls, bytes, lat))| SizeBucket {
                    max_bytes,
                    calls,
                    bytes,
                    latency_us: Latency::of(&lat),
                })
                .collect(),
        }
    }
}
