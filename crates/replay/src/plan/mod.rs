//! Compiling a replay set into a [`Plan`]: for each op a reference to its operator (name,
//! overload, recorded schema), an argument template (which slots, which constants), the
//! outputs' slots, the slots to free after it, and the external inputs to materialise.
//! Everything that depends only on the trace is done here once, so the measured loop does one
//! boxed call plus slot moves per op.
//!
//! A Plan is pure data: it is built without libtorch, knows no device, and serialises with serde
//! (a benchmark package stores it). [`crate::bind()`] resolves its operators in a libtorch
//! process for one device. Architecture invariant: a Plan is immutable once built.

use et_graph::{Graph, OpClass, ReplaySet, TensorKey};
use et_schema::{DType, OpSchema, SchemaType, Trace, Value, ValueType};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::ffi::CString;

mod args;
mod autocast;
mod codec;
mod collective;
mod comms;
mod compile;
mod fill;
mod frees;
mod placement;
mod pool;
mod slots;
mod validate;

pub use autocast::autocast_of;
pub use collective::process_groups;
pub use comms::{CommSelectError, CommSelection, KINDS};
pub use compile::compile;
pub use fill::{restore_rounded, Restored};
pub use frees::FreesFollowed;
pub use pool::{pool_key, PoolKey};
pub use validate::InvalidPlan;

pub type Slot = u32;

/// How to make a tensor the trace does not produce.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorSpec {
    pub shape: Vec<i64>,
    pub strides: Vec<i64>,
    #[serde(with = "codec::dtype_name")]
    pub dtype: DType,
    /// Storage id in the trace (0: none); views of one storage share one allocation.
    pub storage: u64,
    /// Storage offset in elements.
    pub offset: i64,
}

impl TensorSpec {
    /// Whether an input no replayed op wrote is a Python number the original passed to a
    /// Tensor overload (`exp_avg_sq.mul_(beta2)`, `-0.5 * kl`): PyTorch wraps a float as a
    /// 0-dim double and an int as a 0-dim long, and the trace records neither the value nor
    /// the wrapping.
    pub fn is_wrapped_number(&self) -> bool {
        self.shape.is_empty() && matches!(self.dtype, DType::Float64 | DType::Int64)
    }

    /// Bytes of storage this view reaches (saturating).
    pub fn bytes(&self) -> u64 {
        (self.extent().max(0) as u64).saturating_mul(self.dtype.size_bytes() as u64)
    }

    /// A contiguous one-dimensional buffer of `n` elements of `dtype` (storage unknown).
    pub fn flat(dtype: DType, n: i64) -> TensorSpec {
        TensorSpec {
            shape: vec![n],
            strides: vec![1],
            dtype,
            storage: 0,
            offset: 0,
        }
    }

    /// Elements of storage this view reaches (offset included).
    /// Saturating: a hostile shape gives a huge extent (refused as too big), never an overflow.
    pub fn extent(&self) -> i64 {
        if self.shape.contains(&0) {
            return self.offset;
        }
        self.shape
            .iter()
            .zip(&self.strides)
            .map(|(s, st)| s.saturating_sub(1).saturating_mul(*st))
            .fold(self.offset, i64::saturating_add)
            .saturating_add(1)
    }
}

/// Values for integer external inputs, by what consumes them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Fill {
    Random,
    /// Random and non-negative: a value some consumer needs so (a variance, a second moment).
    NonNegative,
    /// Every element this value.
    Value(#[serde(with = "codec::float")] f64),
    /// Indices into a dimension of this size: uniform in `[0, bound)`.
    Indices(i64),
    /// EmbeddingBag offsets over `total` indices: sorted, starting at 0.
    Offsets(i64),
    Zeros,
    /// Uniform in [0, 1): a probability (binary cross-entropy's input and target).
    Probability,
    /// These values, in order (sequence lengths for `pack_padded_sequence`).
    Ints(Vec<i64>),
    /// Sorted along the last dimension, evenly from `-x` to `x` (bucket boundaries): past the
    /// synthetic values' scale, so that each value falls strictly inside them.
    Sorted(#[serde(with = "codec::float")] f64),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Arg {
    Tensor(Slot),
    UndefinedTensor,
    None,
    TensorList {
        slots: Vec<Option<Slot>>,
        optional: bool,
    },
    /// `Tensor[][]` (an allgather's outputs): one list of slots per inner list.
    TensorLists(Vec<Vec<Option<Slot>>>),
    Int(i64),
    Double(#[serde(with = "codec::float")] f64),
    Bool(bool),
    Str(CString),
    IntList(Vec<i64>),
    DoubleList(#[serde(with = "codec::floats")] Vec<f64>),
    BoolList(Vec<u8>),
    ScalarInt(i64),
    ScalarDouble(#[serde(with = "codec::float")] f64),
    ScalarBool(bool),
    ScalarList(#[serde(with = "codec::floats")] Vec<f64>),
    /// The replay device (trace devices are remapped to it).
    Device,
    /// A process group: an index into [`Plan::groups`].
    ProcessGroup(u32),
    /// A reduction (`c10d::ReduceOp` code; the trace records the object, not its value, so it is
    /// SUM).
    ReduceOp(u8),
    /// The schema default of this argument position.
    Default(usize),
}

impl Arg {
    /// The tensor slots this argument passes (one, a list's, or none).
    pub fn slots(&self) -> Vec<Slot> {
        match self {
            Arg::Tensor(s) => vec![*s],
            Arg::TensorList { slots, .. } => slots.iter().flatten().copied().collect(),
            Arg::TensorLists(lists) => lists.iter().flatten().flatten().copied().collect(),
            _ => Vec::new(),
        }
    }

    /// Whether it passes a number for which `bad` holds (`f64::is_nan`, `f64::is_infinite`: a
    /// mask's `-inf` fill): the op's result may then hold such values by design.
    pub fn passes_number(&self, bad: fn(f64) -> bool) -> bool {
        match self {
            Arg::Double(v) | Arg::ScalarDouble(v) => bad(*v),
            Arg::DoubleList(v) | Arg::ScalarList(v) => v.iter().any(|x| bad(*x)),
            _ => false,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Out {
    Tensor(Slot),
    List(Vec<Option<Slot>>),
    Ignore,
}

impl Out {
    /// The tensor slots this output fills (one, a list's, or none).
    pub fn slots(&self) -> Vec<Slot> {
        match self {
            Out::Tensor(s) => vec![*s],
            Out::List(v) => v.iter().flatten().copied().collect(),
            Out::Ignore => Vec::new(),
        }
    }
}

/// An operator by name and overload, with the schema the trace recorded for it. Resolved in a
/// libtorch process by [`crate::bind()`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OpRef {
    pub name: String,
    pub overload: String,
    /// The recorded schema text: arguments are built against it, and reconciled by name with
    /// the registered one when they differ.
    pub schema: String,
}

/// What a step is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum StepKind {
    /// A compute operator.
    Compute,
    /// A collective: run by the distributed replay; in a single process it fails like an op
    /// without a kernel (its outputs are synthesised) or is left out with `--only compute`.
    Collective(Box<Collective>),
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Collective {
    /// The factor from algorithm bandwidth to bus bandwidth in nccl-tests' convention, for a
    /// group of `n` ranks: 2(n-1)/n for an all-reduce; (n-1)/n for all-gather, reduce-scatter,
    /// all-to-all, gather and scatter; 1 for broadcast, reduce, send and recv. `None` for
    /// what moves no data (a barrier) or a kind it does not know.
    pub fn bus_factor(&self, n: usize) -> Option<f64> {
        let n = n.max(1) as f64;
        match self.kind().as_str() {
            "all_reduce" => Some(2.0 * (n - 1.0) / n),
            "all_gather" | "reduce_scatter" | "all_to_all" | "gather" | "scatter" => {
                Some((n - 1.0) / n)
            }
            "broadcast" | "reduce" | "send" | "recv" => Some(1.0),
            _ => None,
        }
    }

    /// A send or a receive: its peer's matching call may come after further point-to-point
    /// calls of this rank (a ring's `isend` then `irecv`), so it completes only when the run
    /// reaches a step that is not one.
    pub fn is_point_to_point(&self) -> bool {
        matches!(self.name.as_str(), "send" | "recv" | "recv_any_source")
    }

    /// [`Collective::size_bytes`], or for a plan compiled without it the bytes of its inputs.
    pub fn message_bytes(&self) -> u64 {
        if self.size_bytes > 0 {
            self.size_bytes
        } else {
            self.bytes
        }
    }
}

impl StepKind {
    /// Whether `--only` runs this step. The one place that decides it.
    pub fn included(&self, only: et_graph::Kind) -> bool {
        match only {
            et_graph::Kind::All => true,
            et_graph::Kind::Compute => matches!(self, StepKind::Compute),
            et_graph::Kind::Comm => matches!(self, StepKind::Collective(_)),
        }
    }

    pub fn is_collective(&self) -> bool {
        matches!(self, StepKind::Collective(_))
    }
}

/// What the trace recorded of a collective: its process group, sizes and dtype (the attributes
/// `record_param_comms` writes; older traces have none), and the steps that wait for it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Collective {
    /// `allreduce`, `all_gather`, ...: the `collective_name` attribute, else the op name.
    pub name: String,
    pub pg_name: Option<String>,
    pub pg_desc: Option<String>,
    pub pg_size: Option<i64>,
    pub global_rank_start: Option<i64>,
    pub global_rank_stride: Option<i64>,
    pub in_msg_nelems: Option<i64>,
    pub out_msg_nelems: Option<i64>,
    pub in_split_size: Vec<i64>,
    pub out_split_size: Vec<i64>,
    pub dtype: Option<String>,
    /// Later steps (positions in the plan) that wait for this collective's work or tensors.
    pub waits: Vec<usize>,
    /// Its process group: an index into [`Plan::groups`] (0, the world, when unrecorded).
    pub group: u32,
    /// Bytes of its input tensors as recorded.
    pub bytes: u64,
    /// Its message size as nccl-tests counts it (`S` in algbw = S / t): the largest of its
    /// tensor arguments and outputs, so an all-gather's whole output, a reduce-scatter's whole
    /// input, an all-reduce's buffer. 0 in plans compiled before it was recorded.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub size_bytes: u64,
    /// The sequence number its `record_param_comms` record carries (the collective's, or for a
    /// `wait` record the one it waits for): how PARAM-style traces pair waits with collectives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<i64>,
}

/// A process group the trace created (`## process_group:init ##`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GroupSpec {
    /// `pg_name`: how collectives name their group.
    pub name: String,
    pub desc: String,
    /// Global ranks, in group-rank order; empty: every rank (the world).
    pub ranks: Vec<i64>,
    pub size: i64,
    /// `backend_config` as recorded, e.g. `cpu:gloo,cuda:nccl`.
    pub backend: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Step {
    pub node: u32,
    pub id: u64,
    pub name: String,
    pub kind: StepKind,
    /// The operator (an index into [`Plan::ops`]), `None` when the trace has no schema for it.
    pub op: Option<u32>,
    /// Why this step cannot run whatever the device (no schema, unsupported argument).
    pub problem: Option<String>,
    pub args: Vec<Arg>,
    pub outs: Vec<Out>,
    /// Specs of the output tensors, to synthesise them when the op fails.
    pub out_specs: Vec<(Slot, TensorSpec)>,
    /// Slots whose last use is this step.
    pub frees: Vec<Slot>,
    /// Input slots with the same tensor key as each output, to pass through when skipped.
    pub passthrough: Vec<(Slot, Slot)>,
    /// The original recorded this call for autograd (a forward op with a sequence number):
    /// replay it with autograd on, so it builds the same graph nodes and saves the same tensors
    /// and composite ops take the same (differentiable) paths.
    pub autograd: bool,
    /// The original ran this op inside `torch.autocast` to this dtype (see [`autocast_of`]):
    /// the replay calls it under autocast too, so it casts and computes as it did there.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "codec::dtype_name::opt"
    )]
    pub autocast: Option<et_schema::DType>,
    /// Views this step reads, made of their base slots' tensors just before it runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub views: Vec<View>,
}

/// A tensor the trace reads over the same region of storage as a slot, with other sizes and
/// strides: `slot` is `base` viewed so (`as_strided`, at the base's storage offset). Autograd
/// saves a view an op made inside a composite the replay runs whole (`linear`'s `t(weight)`,
/// read by `mm` in the backward): a random external there took the gradients below it through
/// a matrix that was not the weight.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct View {
    pub slot: Slot,
    pub base: Slot,
    /// Its sizes, strides and dtype as the trace recorded them.
    pub spec: TensorSpec,
    /// How it is made of the base.
    #[serde(default, skip_serializing_if = "ViewKind::is_strided")]
    pub kind: ViewKind,
}

impl View {
    /// The slots it is made of: its base, and the key or magnitude some kinds read too.
    pub fn reads(&self) -> impl Iterator<Item = Slot> + '_ {
        let other = match self.kind {
            ViewKind::AttentionLogsumexp { key, .. } => Some(key),
            ViewKind::WeightNormNorms { g, .. } => Some(g),
            _ => None,
        };
        std::iter::once(self.base).chain(other)
    }
}

/// What a [`View`] is of its base.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub enum ViewKind {
    /// The base's elements under the view's sizes and strides.
    #[default]
    Strided,
    /// `log_softmax(base, dim)`: a composite's (cross-entropy's) log-probabilities, saved for
    /// its backward, made of the logits it took.
    LogSoftmax { dim: i64 },
    /// `softmax(base, dim)`, likewise.
    Softmax { dim: i64 },
    /// The log-sum-exp over keys of the attention scores of query `base` and `key` (`(q @
    /// k^T) * scale`, `scale` by default 1/sqrt(head size), the upper triangle masked when
    /// `causal`): what a fused attention (`_scaled_dot_product_flash_attention_for_cpu`) run
    /// inside `scaled_dot_product_attention` returns beside its output and saves for its
    /// backward, which no replayed op writes. Filled random instead, a Perceiver-style model's
    /// attention gradients went NaN after 28 iterations (format 4).
    AttentionLogsumexp {
        key: Slot,
        causal: bool,
        scale: Option<f64>,
    },
    /// The norms of `base` (a weight-norm parametrization's direction `v`) over every dim but
    /// `dim`, in the shape of its magnitude `g`: what `_weight_norm_interface(v, g, dim)`,
    /// run inside `_weight_norm`, returns second and saves for its backward, which no replayed
    /// op writes. Filled random instead, `_weight_norm_interface_backward` divided by them and
    /// its gradients reached Inf (weightnorm_mlp_sgd, fresh8; format 5).
    WeightNormNorms { g: Slot, dim: i64 },
    /// A copy of `base` (an external input holding its values), with the view's sizes and
    /// strides: a value an op inside a composite the replay runs whole made in the iteration
    /// and a later step reads (saved for the backward), so its memory is held from the
    /// composite's step to its last use, as the original held it (format 7).
    Copy,
}

impl ViewKind {
    pub(crate) fn is_strided(&self) -> bool {
        matches!(self, ViewKind::Strided)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Format of this structure when stored (a benchmark package checks it).
    pub version: u32,
    /// The trace the plan was compiled from (its source name).
    pub source: String,
    /// Distinct operators of the steps.
    pub ops: Vec<OpRef>,
    pub steps: Vec<Step>,
    pub n_slots: usize,
    /// External inputs: slot, spec, fill.
    pub externals: Vec<(Slot, TensorSpec, Fill)>,
    /// External float inputs of autograd steps: the model's parameters (and inputs), made to
    /// require grad so the forward records a graph.
    pub grad_inputs: Vec<Slot>,
    /// Scalars the trace rounded to 0 that the replay restored (see [`restore_rounded`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restored: Vec<Restored>,
    /// Steps after which no step records into the autograd graph before a backward op runs
    /// (each forward's last): with autograd, the replay lets go of the graph there (see
    /// `Executor::release_graph`). Format 6; absent (none) in older plans.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub graph_releases: Vec<usize>,
    /// Process groups, the world first (index 0). From the trace's `## process_group:init ##`;
    /// a trace without one (older schemas) has the world alone, its size unknown (0).
    pub groups: Vec<GroupSpec>,
}

impl Plan {
    /// Whether the trace's collectives ran on NCCL (a GPU run): a CPU replay runs them on Gloo.
    pub fn recorded_nccl(&self) -> bool {
        self.groups.iter().any(|g| g.backend.contains("nccl"))
    }

    /// The version [`Plan::version`] has when compiled by this build.
    pub const VERSION: u32 = 7;
    /// The oldest format this build still runs. Format 7 only added [`ViewKind::Copy`] (an
    /// older plan has none, and read such a value from its external input throughout). Format
    /// 6 only added [`Plan::graph_releases`]
    /// (an older plan has none, and holds its forward's graph as the build that made it did).
    /// Format 5 only added [`ViewKind::WeightNormNorms`], as format 4 only added
    /// [`ViewKind::AttentionLogsumexp`] (an older plan has none, and compiled such a value as
    /// a random external input). Format 3 only added [`Step::views`] (absent, empty): a
    /// format-2 plan is a format-3 plan whose saved views were compiled as external inputs, and
    /// runs as the build that made it ran it. Format 1 restored rounded scalars and
    /// took autocast differently, so its plans would not replay as they were compiled.
    pub const OLDEST_READABLE: u32 = 2;

    /// The operator of a step.
    pub fn op_of(&self, step: &Step) -> Option<&OpRef> {
        step.op.map(|i| &self.ops[i as usize])
    }

    /// The spec of every slot (by slot): the external input's, or the output's that fills it.
    pub fn slot_specs(&self) -> Vec<Option<&TensorSpec>> {
        let mut specs = vec![None; self.n_slots];
        let slots = self.externals.iter().map(|(s, spec, _)| (s, spec));
        for (s, spec) in slots
            .chain(
                self.steps
                    .iter()
                    .flat_map(|st| st.out_specs.iter().map(|(s, spec)| (s, spec))),
            )
            .chain(
                self.steps
                    .iter()
                    .flat_map(|st| st.views.iter().map(|v| (&v.slot, &v.spec))),
            )
        {
            if let Some(x) = specs.get_mut(*s as usize) {
                *x = Some(spec);
            }
        }
        specs
    }

    /// The signature of step `pos`: what a per-op benchmark or a per-op comparison of two runs
    /// keys on. The operator with its overload, then each argument: a tensor as its dtype and
    /// shape, with `@` and its strides when not contiguous (`float32[64,128]`,
    /// `float32[128,64]@[1,128]`), lists of tensors in brackets, scalars by value, `_` for a
    /// schema default. E.g.
    /// `aten::addmm.default(float32[64],float32[32,128],float32[128,64]@[1,128],1,1)`.
    /// For every step at once, [`Plan::signatures`] builds the slot specs once.
    pub fn signature(&self, pos: usize) -> String {
        signature_of(self, &self.slot_specs(), pos)
    }

    /// [`Plan::signature`] of every step, in order.
    pub fn signatures(&self) -> Vec<String> {
        let specs = self.slot_specs();
        (0..self.steps.len())
            .map(|pos| signature_of(self, &specs, pos))
            .collect()
    }

    /// Steps `--only` runs.
    pub fn included(&self, only: et_graph::Kind) -> usize {
        self.steps.iter().filter(|s| s.kind.included(only)).count()
    }

    /// An estimate of the peak bytes a replay holds: the external inputs plus the most
    /// intermediates live at once along the steps (a storage counted once while any slot
    /// viewing it is live). Checked against the memory available before materialising.
    /// A communication-only replay takes its buffers from a pool ([`Plan::pooled_peak_bytes`]).
    pub fn peak_bytes_estimate(&self, only: et_graph::Kind) -> u64 {
        if only == et_graph::Kind::Comm {
            return self.pooled_peak_bytes();
        }
        // In-place updates of external inputs (parameters) are in the external bytes already.
        let external: std::collections::HashSet<u64> =
            self.externals.iter().map(|e| e.1.storage).collect();
        // Per slot: its allocation (a key) and the trace's storage id. An output over the
        // storage of one of its step's inputs (a view, an in-place result) is that input's
        // allocation; any other output is an allocation of its own, even where the trace's
        // storage id is one the original's allocator handed out before (a GPU trace's ids
        // follow addresses its caching allocator reused, while the replay may still hold the
        // tensor that had it).
        let mut storage_of: HashMap<Slot, (u64, u64)> = HashMap::new();
        let mut live: HashMap<u64, (u64, u32)> = HashMap::new();
        let (mut now, mut peak) = (0u64, 0u64);
        let mut used: std::collections::HashSet<Slot> = std::collections::HashSet::new();
        let mut next_key = 0u64;
        for st in &self.steps {
            if !st.kind.included(only) {
                continue;
            }
            used.extend(st.args.iter().flat_map(Arg::slots));
            let inputs: HashMap<u64, u64> = st
                .args
                .iter()
                .flat_map(Arg::slots)
                .filter_map(|s| storage_of.get(&s).map(|&(key, storage)| (storage, key)))
                .collect();
            for (slot, spec) in &st.out_specs {
                if spec.storage != 0 && external.contains(&spec.storage) {
                    continue;
                }
                let key = match inputs.get(&spec.storage).filter(|_| spec.storage != 0) {
                    Some(&key) => key,
                    None => {
                        next_key += 1;
                        next_key
                    }
                };
                let e = live.entry(key).or_insert((0, 0));
                if e.1 == 0 {
                    now = now.saturating_add(spec.bytes());
                    e.0 = spec.bytes();
                }
                e.1 += 1;
                storage_of.insert(*slot, (key, spec.storage));
            }
            peak = peak.max(now);
            for s in &st.frees {
                if let Some((key, _)) = storage_of.remove(s) {
                    if let Some(e) = live.get_mut(&key) {
                        e.1 = e.1.saturating_sub(1);
                        if e.1 == 0 {
                            now = now.saturating_sub(e.0);
                        }
                    }
                }
            }
        }
        // External inputs, those the included steps read.
        let externals =
            self.externals_bytes(|slot| only == et_graph::Kind::All || used.contains(&slot));
        peak.saturating_add(externals)
    }

    /// Bytes the external inputs take once materialised (one allocation per storage and dtype).
    pub fn external_bytes(&self) -> i64 {
        self.externals_bytes(|_| true).min(i64::MAX as u64) as i64
    }

    /// Bytes of the external inputs whose slots `keep` accepts: one allocation per storage and
    /// dtype, the largest extent among its views.
    fn externals_bytes(&self, keep: impl Fn(Slot) -> bool) -> u64 {
        let mut per_storage: HashMap<(u64, DType), u64> = HashMap::new();
        for (slot, spec, _) in &self.externals {
            if keep(*slot) {
                let e = per_storage.entry((spec.storage, spec.dtype)).or_default();
                *e = (*e).max(spec.bytes());
            }
        }
        per_storage.values().fold(0u64, |a, b| a.saturating_add(*b))
    }
}

pub fn contiguous(shape: &[i64]) -> Vec<i64> {
    let mut s = vec![1i64; shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        s[k] = s[k + 1] * shape[k + 1].max(1);
    }
    s
}

/// See [`Plan::signature`]; `specs` from [`Plan::slot_specs`].
fn signature_of(plan: &Plan, specs: &[Option<&TensorSpec>], pos: usize) -> String {
    use std::fmt::Write;
    let st = &plan.steps[pos];
    let ints = |v: &[i64]| {
        let v: Vec<String> = v.iter().map(i64::to_string).collect();
        format!("[{}]", v.join(","))
    };
    let tensor = |s: &Slot| match specs.get(*s as usize).copied().flatten() {
        None => "?".to_string(),
        Some(t) => {
            let mut out = format!("{}{}", t.dtype.name(), ints(&t.shape));
            if t.strides != contiguous(&t.shape) {
                let _ = write!(out, "@{}", ints(&t.strides));
            }
            out
        }
    };
    let list = |l: &[Option<Slot>]| {
        let v: Vec<String> = l
            .iter()
            .map(|s| s.as_ref().map_or("None".into(), tensor))
            .collect();
        format!("[{}]", v.join(","))
    };
    let doubles = |v: &[f64]| {
        let v: Vec<String> = v.iter().map(|f| format!("{f:?}")).collect();
        format!("[{}]", v.join(","))
    };
    let args: Vec<String> = st
        .args
        .iter()
        .map(|a| match a {
            Arg::Tensor(s) => tensor(s),
            Arg::TensorList { slots, .. } => list(slots),
            Arg::TensorLists(lists) => {
                let v: Vec<String> = lists.iter().map(|l| list(l)).collect();
                format!("[{}]", v.join(","))
            }
            Arg::Int(i) | Arg::ScalarInt(i) => i.to_string(),
            Arg::Double(f) | Arg::ScalarDouble(f) => format!("{f:?}"),
            Arg::Bool(b) | Arg::ScalarBool(b) => b.to_string(),
            Arg::Str(s) => format!("{:?}", s.to_string_lossy()),
            Arg::IntList(v) => ints(v),
            Arg::DoubleList(v) | Arg::ScalarList(v) => doubles(v),
            Arg::BoolList(v) => {
                let v: Vec<&str> = v
                    .iter()
                    .map(|b| if *b != 0 { "true" } else { "false" })
                    .collect();
                format!("[{}]", v.join(","))
            }
            Arg::None | Arg::UndefinedTensor => "None".into(),
            Arg::Device => "device".into(),
            Arg::ProcessGroup(g) => format!("group{g}"),
            Arg::ReduceOp(r) => format!("reduce{r}"),
            Arg::Default(_) => "_".into(),
        })
        .collect();
    let name = plan.op_of(st).map_or_else(
        || st.name.clone(),
        |o| {
            if o.overload.is_empty() {
                o.name.clone()
            } else {
                format!("{}.{}", o.name, o.overload)
            }
        },
    );
    format!("{name}({})", args.join(","))
}

/// The plan is pure data: these tests build plans from hand-written traces and check slots,
/// fills, frees and pass-throughs without a libtorch call.
#[cfg(test)]
mod tests;
