//! Fidelity: how the original run spent its time, and how a replay compares with it. The gap
//! model (time outside operators, corrected for the profiler's own cost) and the per-op
//! comparison live here, in one place and without libtorch; the replay crate only executes
//! what they compute (it spins the gaps, it profiles an instrumented iteration) and the CLI
//! only prints.

mod base;
mod capture;
mod compare;
mod gaps;
mod model;
#[cfg(test)]
mod tests;
mod timing;

pub use base::{anchor, Anchored, OpsBetweenGaps, Reference, TimeBase};
pub use capture::{CaptureReference, InvalidReference};
pub use compare::{compare_ops, Comparison, OpComparison};
pub use gaps::{cap_gaps, gap_model, weighted_median, SLICE_MIN_US};
pub use model::{GapModel, Instrumentation, ReplayTimes, MIN_SPEED_OPS};
pub use timing::{least, original_timing, typical_timing, OriginalTiming};
