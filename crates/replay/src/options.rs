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
    /// Record the median time of every step in the report.
    pub per_step: bool,
    /// Report progress (materialisation, each iteration) on stderr.
    pub progress: bool,
    /// After the measured iterations, run one more under the instrumentation a linked ET +
    /// Kineto pair is captured with, and report each step's profiled window
    /// ([`crate::Report::profiled`]): what that instrumentation costs on these ops, measured.
    pub instrument: bool,
    /// Replay the ops the original recorded for autograd (its forward) with autograd on, the
    /// parameters requiring grad: graph nodes are built and tensors saved as in the original,
    /// and composite ops take their differentiable paths.
    pub autograd: bool,
    /// Check every op's float outputs for NaN/Inf (slow; outside the timings) and report the
    /// first op that produced one ([`crate::Report::first_nonfinite`]).
    pub check_values: bool,
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
            per_step: false,
            progress: false,
            instrument: false,
            autograd: true,
            check_values: false,
        }
    }
}
