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
//! and instrumented iterations, and a `recorder` builds the [`Report`]. [`single`] runs one
//! step on its own, repeatedly, for per-op benchmarks keyed by [`plan::Plan::signature`].
//!
//! Architecture invariant: everything that touches libtorch, CUDA or c10d lives in this crate;
//! `plan` does not touch libtorch.

pub mod bind;
pub mod calibrate;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(not(feature = "cuda"))]
#[path = "cuda_stub.rs"]
pub mod cuda;
pub mod device;
pub mod dist;
pub mod error;
pub mod executor;
pub(crate) mod ffi;
pub mod guard;
pub mod options;
pub mod plan;
mod recorder;
pub mod report;
pub mod single;

pub use bind::{bind, Bound};
pub use device::Device;
pub use error::{CallError, ErrorKind, ReplayError};
pub use ffi::observer_trace_path;
pub use ffi::{flush_denormal, InstrumentError, Instrumentation, Profile, ProfiledEvent};
pub use options::{
    CommOptions, DistOptions, MemoryGate, Pace, Pacer, ReplayOptions, Store, ALTERNATION_RUN,
};
pub use report::{
    CheckReport, CollectiveCall, CollectiveTiming, CudaMemory, Failure, Fallback, GpuReport,
    Latency, NonFinite, OpTiming, PacedReport, PoolReport, ProfiledStep, Report, SizeBucket,
    StepTiming,
};

/// Loads a custom-op library (like `torch.ops.load_library`).
pub fn load_library(path: &std::path::Path) -> Result<(), ReplayError> {
    ffi::load_library(path).map_err(|source| ReplayError::Library {
        path: path.display().to_string(),
        source,
    })
}

/// Compiles, binds and runs a replay of `set`; returns the report and (with `trace_out`) the
/// timeline: op slices (on CUDA, launches and device times) and NVML counter tracks.
pub fn replay(
    g: &et_graph::Graph,
    set: &et_graph::ReplaySet,
    opts: &ReplayOptions,
) -> Result<(Report, metrics::Timeline), ReplayError> {
    let mut plan = plan::compile(g, set);
    let frees = opts
        .original_allocs
        .as_ref()
        .map(|a| plan.follow_frees(set, a));
    let plan = if opts.comm.select == plan::CommSelection::default() {
        plan
    } else {
        plan.select_comm(&opts.comm.select)?
    };
    let bound = bind(&plan, &opts.device);
    let (mut report, timeline) = executor::run(&plan, &bound, opts)?;
    report.frees_followed = frees;
    Ok((report, timeline))
}

/// A description of the runtime: libtorch version and threads, the CUDA driver and devices,
/// NVML.
pub fn env_report() -> String {
    let cuda = match metrics::cuda::driver_devices() {
        Err(e) => e.to_string(),
        Ok(_) if !tch::Cuda::is_available() => {
            "a CUDA driver, but libtorch cannot use it (CPU-only build or an old driver)".into()
        }
        Ok(_) => format!("CUDA available, {} device(s)", tch::Cuda::device_count()),
    };
    let nvml = match metrics::gpu::nvml_status() {
        Ok((v, n)) => format!("NVML {v}, {n} device(s)"),
        Err(e) => e.to_string(),
    };
    let (torch, libs) = torch_in_use();
    format!(
        "libtorch 2.11.0 (tch 0.24.0), {} intra-op threads; {cuda}; {nvml}\n{torch}\n\
         libraries: {}",
        tch::get_num_threads(),
        if libs.is_empty() {
            "(not listed: no /proc/self/maps)".to_string()
        } else {
            libs.join(", ")
        }
    )
}

/// Which torch this process uses, in words (the Python environment's, as the wheel's launcher
/// found it, or the one it was built with), and the libtorch libraries it loaded (their paths,
/// from `/proc/self/maps`).
fn torch_in_use() -> (String, Vec<String>) {
    let libs = loaded_libtorch();
    let torch = match (
        std::env::var("MYSTIQUE_TORCH_VERSION"),
        std::env::var("MYSTIQUE_TORCH"),
    ) {
        (Ok(v), Ok(dir)) => format!("torch {v} of the Python environment, at {dir}"),
        _ => format!(
            "torch 2.11.0 libraries as linked at build time{}",
            libs.first()
                .and_then(|l| std::path::Path::new(l).parent())
                .map_or(String::new(), |d| format!(", from {}", d.display()))
        ),
    };
    (torch, libs)
}

/// The libtorch and c10 libraries mapped into this process.
fn loaded_libtorch() -> Vec<String> {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return Vec::new();
    };
    let mut libs: Vec<String> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| {
            let name = p.rsplit('/').next().unwrap_or_default();
            name.starts_with("libtorch") || name.starts_with("libc10")
        })
        .map(str::to_string)
        .collect();
    libs.sort();
    libs.dedup();
    libs
}

/// The runtime as JSON: libtorch version and threads, CUDA devices, NVML.
pub fn env_json() -> serde_json::Value {
    let driver = metrics::cuda::driver_devices();
    let usable = driver.is_ok() && tch::Cuda::is_available();
    let nvml = metrics::gpu::nvml_status();
    serde_json::json!({
        "libtorch": "2.11.0",
        "tch": "0.24.0",
        "intra_op_threads": tch::get_num_threads(),
        "cuda_backend": cfg!(feature = "cuda"),
        "cuda_available": usable,
        "cuda_devices": if usable { tch::Cuda::device_count() } else { 0 },
        "cuda_unavailable": driver.err().map(|e| e.to_string()),
        "nvml_driver": nvml.as_ref().ok().map(|n| n.0.clone()),
        "nvml_unavailable": nvml.err().map(|e| e.to_string()),
        "torch": torch_in_use().0,
        "libraries": loaded_libtorch(),
    })
}
