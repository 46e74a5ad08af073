//! # replay
//!
//! Runs an execution trace's operators for real through libtorch. The data path:
//!
//! ```text
//! et_graph::ReplaySet --plan::compile--> Plan (pure data, serde; no libtorch)
//!                     --bind(&plan, &Device)--> Bound (resolved operators, device rewrites)
//!                     --executor::run--> Recorder --> Report
//! ```
//!
//! [`plan::compile`] turns a replay set into an immutable [`plan::Plan`] (operator references,
//! argument templates, tensor slots, frees, external inputs); [`bind::bind`] resolves it for a
//! [`Device`]; [`executor::run`] materialises the external inputs and runs warm-up, measured
//! and instrumented iterations, and a [`recorder`] builds the [`Report`]. [`single`] runs one
//! step on its own, repeatedly, for per-op benchmarks keyed by [`plan::Plan::signature`].
//!
//! Architecture invariant: everything that touches libtorch, CUDA or c10d lives in this crate;
//! `plan` does not touch libtorch.

pub mod bind;
pub mod device;
pub mod dist;
pub mod error;
pub mod executor;
pub mod ffi;
pub mod options;
pub mod plan;
mod recorder;
pub mod report;
pub mod single;

pub use bind::{bind, Bound};
pub use device::Device;
pub use error::{CallError, ErrorKind, ReplayError};
pub use options::{DistOptions, ReplayOptions};
pub use report::{
    CollectiveTiming, Failure, Fallback, NonFinite, OpTiming, ProfiledStep, Report, StepTiming,
};

/// Loads a custom-op library (like `torch.ops.load_library`).
pub fn load_library(path: &std::path::Path) -> Result<(), ReplayError> {
    ffi::load_library(path).map_err(|source| ReplayError::Library {
        path: path.display().to_string(),
        source,
    })
}

/// Compiles, binds and runs a replay of `set`; returns the report and (with `trace_out`) the op
/// slices.
pub fn replay(
    g: &et_graph::Graph,
    set: &et_graph::ReplaySet,
    opts: &ReplayOptions,
) -> Result<(Report, Vec<metrics::Slice>), ReplayError> {
    let plan = plan::compile(g, set);
    let bound = bind(&plan, &opts.device);
    executor::run(&plan, &bound, opts)
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

/// The libtorch runtime as JSON: version, threads, CUDA devices.
pub fn env_json() -> serde_json::Value {
    serde_json::json!({
        "libtorch": "2.11.0",
        "tch": "0.24.0",
        "intra_op_threads": tch::get_num_threads(),
        "cuda_available": tch::Cuda::is_available(),
        "cuda_devices": if tch::Cuda::is_available() { tch::Cuda::device_count() } else { 0 },
    })
}
