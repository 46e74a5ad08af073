//! Executing a bound plan: materialise the external inputs once, then run one step at a time
//! (a boxed call with its slots, a float32 retry where the device lacks a half kernel, autograd
//! as the original recorded it), and the loop of warm-up, measured and instrumented iterations.
//! What happened is handed to a `Recorder`, which builds the [`Report`].

use crate::bind::{Bound, Exec};
use crate::device::{Device, Timer};
use crate::error::{CallError, ErrorKind, ReplayError};
use crate::ffi::{self, Comm, Stack};
use crate::options::ReplayOptions;
use crate::plan::{Arg, Fill, Out, Plan, TensorSpec, ViewKind};
use crate::recorder::{GpuSamples, Recorder, Timed};
use crate::report::{NonFinite, Report};
use metrics::Timeline;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use tch::{Kind, Tensor};

mod comms;
mod materialise;
mod pace;
mod pool;
mod run;
mod stack;
mod step;

pub use materialise::materialise;
pub(crate) use materialise::nonfinite;
pub(crate) use pace::GapPace;
pub use run::{run, run_once_keep, run_once_keep_as, Kept};

pub(crate) fn kind_of(d: et_schema::DType) -> Kind {
    use et_schema::DType as D;
    match d {
        D::UInt8 => Kind::Uint8,
        D::Int8 => Kind::Int8,
        D::Int16 => Kind::Int16,
        D::Int32 => Kind::Int,
        D::Int64 => Kind::Int64,
        D::Float16 => Kind::Half,
        D::Float64 => Kind::Double,
        D::Bool => Kind::Bool,
        D::BFloat16 => Kind::BFloat16,
        D::Complex64 => Kind::ComplexFloat,
        D::Complex128 => Kind::ComplexDouble,
        _ => Kind::Float,
    }
}

/// What one iteration is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Runs, not measured (caches, allocator, autograd state warm up).
    WarmUp,
    /// Timed and reported.
    Measured,
    /// Under the capture's instrumentation, in one profiling session, to warm it up (the
    /// profiler's and the observer's first events in a session cost more, as in the
    /// capture's first profiled iteration); not recorded.
    InstrumentedWarmUp,
    /// More iterations under the capture's instrumentation (ET observer + Kineto, or what the
    /// capture had), to read each step's profiled window; not timed.
    Instrumented,
    /// The last one under the instrumentation, not recorded: before each step, one event
    /// without arguments and two such as autograd records for a backward node are timed, each
    /// alone, between the replay's ops (what the capture's events in its gaps cost here). With
    /// `probe_mechanisms`, first an op called as Python calls one, and before some steps
    /// autograd's engine running a few nodes.
    InstrumentedProbe,
    /// With `probe_mechanisms`, a plain iteration just before the instrumented ones, not
    /// recorded: the op and the autograd nodes of the probe iteration timed where they are
    /// timed there, without the instrumentation (the probes' own time, which the difference
    /// takes out).
    PlainProbe,
}

impl Phase {
    /// Under the capture's instrumentation.
    pub fn instrumented(self) -> bool {
        matches!(
            self,
            Phase::InstrumentedWarmUp | Phase::Instrumented | Phase::InstrumentedProbe
        )
    }
}

impl Phase {
    /// The phase of iteration `it` of a run with `opts`.
    pub fn of(it: usize, opts: &ReplayOptions) -> Phase {
        let total = total_iterations(opts);
        let k = instrumented(opts);
        if it + k == total {
            Phase::InstrumentedWarmUp
        } else if k > 0 && opts.probe_mechanisms && it + k + 1 == total {
            Phase::PlainProbe
        } else if k > 0 && it + 1 == total {
            Phase::InstrumentedProbe
        } else if it + k > total {
            Phase::Instrumented
        } else if it >= opts.warmup {
            Phase::Measured
        } else {
            Phase::WarmUp
        }
    }
}

fn total_iterations(opts: &ReplayOptions) -> usize {
    let k = instrumented(opts);
    // The plain probe iteration before the instrumented ones.
    opts.warmup + opts.iters.max(1) + k + usize::from(k > 0 && opts.probe_mechanisms)
}

/// Instrumented iterations at the end of a run: the session's warm-up, the recorded ones and
/// the probe.
fn instrumented(opts: &ReplayOptions) -> usize {
    if opts.instrument {
        opts.instrument_iters.max(1) + 2
    } else {
        0
    }
}

/// How a step's op ran: as recorded, or by a detour the replay device needs (reported per op).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Via {
    /// The op's own kernel on the replay device.
    Kernel,
    /// In float32: the device has no half-precision kernel for it.
    Float32,
    /// On the CPU: the op has no kernel on the replay device at all (a CPU trace's
    /// `_scaled_dot_product_flash_attention_for_cpu_backward`, `mkldnn_rnn_layer_backward` on a
    /// CUDA replay). Its inputs are copied to the CPU, its outputs back, and what it writes in
    /// place is written back.
    Cpu,
    /// As `aten::reshape`: a `view` whose input the replay device's kernels laid out otherwise
    /// than the trace's device (attention outputs), where a view of those strides cannot exist.
    /// The original's `.contiguous()` before it was a no-op there and is not in the trace;
    /// here it copies, as it would have on this device.
    Reshape,
}

/// How one step went.
#[derive(Debug)]
pub enum Outcome {
    /// The op ran (`via`: how); `grad_refused`: plain, autograd having refused to record it
    /// (why).
    Ran {
        via: Via,
        grad_refused: Option<String>,
    },
    /// Passed through without a call (a no-op on this device, or left out by `--only`).
    PassedThrough,
    Failed(CallError),
}

/// Runs a bound plan's steps on slots of tensors. Holds the external inputs (materialised once;
/// they persist across iterations, carrying in-place updates as parameters do).
pub struct Executor<'a> {
    plan: &'a Plan,
    bound: &'a Bound,
    stack: Stack,
    /// Steps whose autograd recording libtorch refused: they run plain from then on.
    no_grad: Vec<bool>,
    /// Per step, the detour ([`Via::Cpu`], [`Via::Reshape`]) its first call needed: later calls
    /// take it at once instead of failing first.
    detour: Vec<Via>,
    /// `aten::reshape`, found on the first [`Via::Reshape`].
    reshape: Option<Arc<ffi::Op>>,
    /// Per step on the [`Via::Cpu`] detour, the argument positions its schema writes.
    cpu_writes: HashMap<usize, Vec<usize>>,
    externals: Vec<Option<Tensor>>,
    /// Outputs of steps left out by `--only`, synthesised once and kept like external inputs,
    /// so that leaving a step out costs its dependants nothing per iteration.
    stand_ins: Vec<Option<Tensor>>,
    /// This rank's process groups, when collectives run for real.
    comm: Option<Comm>,
    /// How long a collective's work may take.
    timeout: std::time::Duration,
    /// Bytes of the CUDA arena the external inputs live in (0: none).
    arena_bytes: u64,
    /// Per step, small outputs of `empty*` ops to fill with ones after the call (see
    /// [`small_empties`]).
    fill_ones: Vec<Vec<crate::plan::Slot>>,
    /// Collectives' outstanding work, by the step that waits for it: (the collective's
    /// step, its work).
    pending: HashMap<usize, Vec<(usize, ffi::Works)>>,
    /// With `--only comm`, the collectives' buffers ([`pool::Pool`]): nothing is materialised
    /// up front and left-out steps make no stand-ins.
    pool: Option<pool::Pool>,
    /// With autograd, per step: the slots let go of the graph after it
    /// ([`Plan::graph_releases`], [`Executor::release_graph`]).
    graph_release: Vec<bool>,
    /// Tensors that let go of the graph in the last iteration.
    graph_released: usize,
    /// Every collective completes before the next step (`--blocking`, `--check-collectives`):
    /// none is left outstanding until a later wait.
    complete_each: bool,
    /// With `--rebalance equal`: the all-to-all steps re-split so far.
    rebalanced: HashMap<usize, comms::Rebalanced>,
    /// `c10d::barrier`, found on the first `--blocking` barrier.
    barrier_op: Option<ffi::Op>,
    /// Per slot: it holds NaN/Inf by the trace's design (a mask filled with `-inf`), which
    /// `--check-values` does not report ([`Executor::produced_nonfinite`]).
    by_design: Vec<bool>,
    /// In a probe iteration: each called op's record-function scope probed before its call
    /// (its step, the probe), as [`ffi::Stack::probe_call`] probes it.
    probed_calls: Option<Vec<(usize, f64)>>,
    /// Per step, the checks of a kernel that trusts its caller ([`crate::guard`]).
    guards: Vec<Option<crate::guard::Guard>>,
    /// Per slot, whether a step writes it in place (its input passes through to its output).
    written_in_place: Vec<bool>,
}

/// The bytes of the distinct storages the slots hold, kept up to date slot by slot: the first
/// iteration's peak is read after every step, and a walk over every slot there made that
/// iteration quadratic in the trace (a 200,000-op replay spent 11 s on it).
pub(crate) struct LiveCounter {
    /// Per slot, the storage it holds (its data pointer; 0: none).
    ptr: Vec<usize>,
    /// Per storage, its bytes and how many slots hold it.
    by_ptr: HashMap<usize, (usize, u32)>,
    pub now: u64,
}

impl LiveCounter {
    /// Counted over every slot once.
    pub fn of(slots: &[Option<Tensor>]) -> LiveCounter {
        let mut c = LiveCounter {
            ptr: vec![0; slots.len()],
            by_ptr: HashMap::new(),
            now: 0,
        };
        for (s, t) in slots.iter().enumerate() {
            c.update(s, t.as_ref());
        }
        c
    }

    /// Slot `s` now holds `t` (or nothing).
    pub fn update(&mut self, s: usize, t: Option<&Tensor>) {
        let (p, n) = t.map_or((0, 0), ffi::storage_info);
        let Some(old) = self.ptr.get(s).copied() else {
            return;
        };
        if old == p {
            return;
        }
        if old != 0 {
            if let Some(e) = self.by_ptr.get_mut(&old) {
                e.1 -= 1;
                if e.1 == 0 {
                    self.now = self.now.saturating_sub(e.0 as u64);
                    self.by_ptr.remove(&old);
                }
            }
        }
        if p != 0 {
            let e = self.by_ptr.entry(p).or_insert((n, 0));
            if e.1 == 0 {
                self.now += n as u64;
            }
            e.1 += 1;
        }
        self.ptr[s] = p;
    }
}

/// Bytes of the distinct storages the slots hold.
pub(crate) fn live_bytes(slots: &[Option<Tensor>]) -> u64 {
    let mut seen: HashMap<usize, usize> = HashMap::new();
    for t in slots.iter().flatten() {
        let (p, n) = ffi::storage_info(t);
        if p != 0 {
            seen.insert(p, n);
        }
    }
    seen.values().map(|&n| n as u64).sum()
}

pub(crate) fn first_line(s: &str) -> String {
    let l = s.lines().next().unwrap_or("").trim();
    if l.len() > 300 {
        format!(
            "{}...",
            &l[..l.char_indices().nth(300).map_or(l.len(), |c| c.0)]
        )
    } else {
        l.to_string()
    }
}
