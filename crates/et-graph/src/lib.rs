//! # et-graph
//!
//! Analysis of PyTorch execution traces on top of [`et_schema`]: the call tree and execution
//! order, operator classes ([`OpClass`]), the replay set (the ops a replay must run once, with
//! the reason for every other node), tensor versions, data dependencies, lifetimes and live
//! bytes ([`TensorTable`]), and links to Kineto events ([`link()`]).
//!
//! ```no_run
//! let trace = et_schema::read_trace(std::path::Path::new("model.et.json.gz"))?;
//! let graph = et_graph::Graph::new(&trace);
//! let set = graph.replay_set(None);
//! let tensors = graph.tensors(&set);
//! println!("{} ops to replay, {} external inputs", set.ops.len(), tensors.externals().count());
//! # Ok::<(), et_schema::Error>(())
//! ```
//!
//! Architecture invariant: depends on `et-schema` only, never on libtorch.

#![warn(missing_docs)]

/// The file model this crate analyses: a crate downstream of et-graph needs no other dependency.
pub use et_schema;

pub mod class;
pub mod compose;
pub mod fidelity;
pub mod gpu;
pub mod graph;
pub mod link;
pub mod memory;
pub mod select;
pub mod summary;
pub mod world;

pub use class::OpClass;
pub use fidelity::{
    anchor, cap_gaps, compare_ops, gap_model, least, original_timing, typical_timing,
    weighted_median, Anchored, CaptureReference, Comparison, GapModel, Instrumentation,
    InvalidReference, OpComparison, OpsBetweenGaps, OriginalTiming, Reference, ReplayTimes,
    TimeBase, MIN_SPEED_OPS, SLICE_MIN_US,
};
pub use gpu::{
    gpu_activity, off_op_summary, original_gpu, GpuActivity, GpuInterval, GpuWork, KernelTime,
    OffOpGroup, OffOpSummary,
};
pub use graph::{DataEdge, Graph, ReplaySet, Skip, TensorInfo, TensorKey, TensorTable, Threads};
pub use link::{link, link_steps, profiler_steps, timing_link, Link, LinkError, Method, OffOpGpu};
pub use memory::{original_allocs, Alloc, OriginalAllocs};
pub use select::{Kind, SelectError, Selection};
pub use summary::{Summary, TensorStats};
