//! # replay
//!
//! Runs an execution trace's operators for real through libtorch. [`plan::compile`] turns an
//! et-graph replay set into an immutable [`plan::Plan`] (resolved dispatcher handles, argument
//! templates, tensor slots, frees); [`runner::run`] materialises the external inputs and
//! executes the plan for warm-up and measured iterations, timing every op.
//!
//! Architecture invariant: everything that touches libtorch, CUDA or c10d lives in this crate.

pub mod ffi;
pub mod plan;
pub mod runner;

use serde::Serialize;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("materialising inputs: {0}")]
    Materialise(String),
    #[error("op {op} (node {id}) failed and --strict is set: {reason}")]
    Strict { op: String, id: u64, reason: String },
    #[error("{0}")]
    Device(String),
    #[error("loading {path}: {reason}")]
    Library { path: String, reason: String },
}

#[derive(Clone, Debug)]
pub struct ReplayOptions {
    pub device: tch::Device,
    pub warmup: usize,
    pub iters: usize,
    pub only: et_graph::Kind,
    pub strict: bool,
    pub trace_out: Option<PathBuf>,
    /// Time to spend before each step (µs), reproducing the original run's time outside
    /// operators (from a linked Kineto trace).
    pub gaps_us: Option<Vec<f64>>,
    /// Record the median time of every step in the report.
    pub per_step: bool,
    /// Report progress (materialisation, each iteration) on stderr.
    pub progress: bool,
    /// After the measured iterations, run one more under the instrumentation a linked ET +
    /// Kineto pair is captured with, and report each step's profiled window
    /// ([`Report::profiled`]): what that instrumentation costs on these ops, measured.
    pub instrument: bool,
    /// Replay the ops the original recorded for autograd (its forward) with autograd on, the
    /// parameters requiring grad: graph nodes are built and tensors saved as in the original,
    /// and composite ops take their differentiable paths.
    pub autograd: bool,
    /// Check every op's float outputs for NaN/Inf (slow; outside the timings) and report the
    /// first op that produced one ([`Report::first_nonfinite`]).
    pub check_values: bool,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            device: tch::Device::Cpu,
            warmup: 2,
            iters: 10,
            only: et_graph::Kind::All,
            strict: false,
            trace_out: None,
            gaps_us: None,
            per_step: false,
            progress: false,
            instrument: false,
            autograd: true,
            check_values: false,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Failure {
    pub op: String,
    pub count: usize,
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
    /// Collectives left out by `--only compute`.
    pub ops_skipped: usize,
    pub failures: Vec<Failure>,
    /// Wall time per measured iteration.
    pub iter_ms: metrics::Stats,
    /// Sum of op times per measured iteration.
    pub op_ms: metrics::Stats,
    /// Replay bookkeeping per op: (iteration - sum of ops) / ops.
    pub overhead_us_per_op: f64,
    /// Peak bytes of live storages during the first iteration.
    pub peak_bytes: u64,
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
    /// Per op name, most time first.
    pub ops: Vec<OpTiming>,
    /// Ops replayed through a device fallback.
    pub fallbacks: Vec<Fallback>,
    /// Emulated time outside operators per iteration (ms), 0 without `--emulate-gaps`.
    pub gaps_ms: f64,
    /// Median time of each step (with `per_step`), in replay-set order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<StepTiming>,
    /// With `instrument`: each step's profiled window, in replay-set order (`None` for steps
    /// not dispatched or not found among the profiler's events).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub profiled: Vec<Option<ProfiledStep>>,
    /// With `instrument`: why the instrumented iteration could not run or be read back (the
    /// measured iterations stand; `profiled` is then empty).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instrument_error: Option<String>,
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

/// One step of the instrumented iteration (see [`ReplayOptions::instrument`]): its profiled
/// window on the profiler's clock (µs) and the events recorded inside it.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct ProfiledStep {
    pub start_us: f64,
    pub end_us: f64,
    pub nested: u32,
}

#[derive(Clone, Debug, Serialize)]
pub struct StepTiming {
    pub id: u64,
    pub op: String,
    pub us: f64,
}

/// Parses `cpu`, `cuda`, `cuda:N`; CUDA must be present.
pub fn parse_device(s: &str) -> Result<tch::Device, ReplayError> {
    let d = match s {
        "cpu" => tch::Device::Cpu,
        "cuda" => tch::Device::Cuda(0),
        _ => match s.strip_prefix("cuda:").and_then(|i| i.parse().ok()) {
            Some(i) => tch::Device::Cuda(i),
            None => {
                return Err(ReplayError::Device(format!(
                    "unknown device {s:?} (cpu, cuda, cuda:N)"
                )))
            }
        },
    };
    if let tch::Device::Cuda(i) = d {
        if !tch::Cuda::is_available() {
            return Err(ReplayError::Device(
                "no CUDA device: this machine has no usable GPU (replay with --device cpu)".into(),
            ));
        }
        if i >= tch::Cuda::device_count() as usize {
            return Err(ReplayError::Device(format!(
                "cuda:{i} does not exist ({} CUDA devices)",
                tch::Cuda::device_count()
            )));
        }
    }
    Ok(d)
}

/// Loads a custom-op library (like `torch.ops.load_library`).
pub fn load_library(path: &std::path::Path) -> Result<(), ReplayError> {
    ffi::load_library(path).map_err(|reason| ReplayError::Library {
        path: path.display().to_string(),
        reason,
    })
}

/// Plans and runs a replay of `set`; returns the report and (with `trace_out`) the op slices.
pub fn replay(
    g: &et_graph::Graph,
    set: &et_graph::ReplaySet,
    opts: &ReplayOptions,
) -> Result<(Report, Vec<metrics::Slice>), ReplayError> {
    let plan = plan::compile(g, set, opts.device);
    let selected = match opts.only {
        et_graph::Kind::Compute => plan.steps.iter().filter(|s| !s.collective).count(),
        _ => plan.steps.len(),
    };
    runner::run(&plan, opts, &g.trace.source, selected)
}

/// A one-line description of the libtorch runtime: version, threads, CUDA.
pub fn env_report() -> String {
    let cuda = if tch::Cuda::is_available() {
        format!("CUDA available, {} device(s)", tch::Cuda::device_count())
    } else {
        "no CUDA device".to_string()
    };
    format!(
        "libtorch 2.11.0 (tch 0.24.0), {} intra-op threads, {cuda}",
        tch::get_num_threads()
    )
}
