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

pub type Slot = u32;

/// How to make a tensor the trace does not produce.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorSpec {
    pub shape: Vec<i64>,
    pub strides: Vec<i64>,
    #[serde(with = "dtype_name")]
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

/// A dtype as its ET name (`float`, `c10::BFloat16`, ...): readable in a stored plan.
mod dtype_name {
    use et_schema::DType;
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &DType, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(d.et_name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DType, D::Error> {
        let name = String::deserialize(d)?;
        DType::from_et_name(&name)
            .ok_or_else(|| D::Error::custom(format!("unknown dtype {name:?}")))
    }

    /// The same for an optional dtype.
    pub mod opt {
        use et_schema::DType;
        use serde::{Deserialize, Deserializer, Serializer};

        pub fn serialize<S: Serializer>(d: &Option<DType>, s: S) -> Result<S::Ok, S::Error> {
            match d {
                Some(d) => super::serialize(d, s),
                None => s.serialize_none(),
            }
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DType>, D::Error> {
            match Option::<String>::deserialize(d)? {
                Some(name) => DType::from_et_name(&name)
                    .map(Some)
                    .ok_or_else(|| serde::de::Error::custom(format!("unknown dtype {name:?}"))),
                None => Ok(None),
            }
        }
    }
}

/// Doubles as JSON numbers, and the non-finite ones a trace can hold (`-inf` masks, `inf`
/// clamp bounds) as the strings `inf`, `-inf` and `nan`, which JSON numbers cannot express.
mod float {
    use serde::{de::Error, Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(untagged)]
    pub(super) enum Repr {
        Num(f64),
        Text(String),
    }

    pub(super) fn to_repr(v: f64) -> Repr {
        if v.is_finite() {
            Repr::Num(v)
        } else {
            Repr::Text(
                if v.is_nan() {
                    "nan"
                } else if v > 0.0 {
                    "inf"
                } else {
                    "-inf"
                }
                .into(),
            )
        }
    }

    pub(super) fn from_repr<E: Error>(r: Repr) -> Result<f64, E> {
        match r {
            Repr::Num(v) => Ok(v),
            Repr::Text(t) => match t.as_str() {
                "nan" => Ok(f64::NAN),
                "inf" => Ok(f64::INFINITY),
                "-inf" => Ok(f64::NEG_INFINITY),
                _ => Err(E::custom(format!("not a number: {t:?}"))),
            },
        }
    }

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        to_repr(*v).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        from_repr(Repr::deserialize(d)?)
    }
}

/// [`float`] for lists.
mod floats {
    use super::float::{from_repr, to_repr, Repr};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(v: &[f64], s: S) -> Result<S::Ok, S::Error> {
        v.iter()
            .map(|x| to_repr(*x))
            .collect::<Vec<_>>()
            .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
        Vec::<Repr>::deserialize(d)?
            .into_iter()
            .map(from_repr)
            .collect()
    }
}

/// Values for integer external inputs, by what consumes them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Fill {
    Random,
    /// Random and non-negative: a value some consumer needs so (a variance, a second moment).
    NonNegative,
    /// Every element this value.
    Value(#[serde(with = "float")] f64),
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
    Sorted(#[serde(with = "float")] f64),
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
    Double(#[serde(with = "float")] f64),
    Bool(bool),
    Str(CString),
    IntList(Vec<i64>),
    DoubleList(#[serde(with = "floats")] Vec<f64>),
    BoolList(Vec<u8>),
    ScalarInt(i64),
    ScalarDouble(#[serde(with = "float")] f64),
    ScalarBool(bool),
    ScalarList(#[serde(with = "floats")] Vec<f64>),
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
        with = "dtype_name::opt"
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
    /// Process groups, the world first (index 0). From the trace's `## process_group:init ##`;
    /// a trace without one (older schemas) has the world alone, its size unknown (0).
    pub groups: Vec<GroupSpec>,
}

impl Plan {
    /// The external inputs (by slot) a replay on a device other than the CPU keeps on the CPU
    /// (`HOST_ARGS`, or those they are made of through `KEEP_DEVICE` ops), and those it makes
    /// float32 (`ACC_STATS`); `is_external`: whether a slot holds an external input. The
    /// plan's analysis alone: the executor moves the tensors (`place_for_device`).
    pub fn device_placement(
        &self,
        is_external: &dyn Fn(usize) -> bool,
    ) -> (Vec<usize>, Vec<usize>) {
        let mut producer: HashMap<Slot, usize> = HashMap::new();
        for (pos, step) in self.steps.iter().enumerate() {
            for o in &step.outs {
                if let Out::Tensor(s) = o {
                    producer.insert(*s, pos);
                }
            }
        }
        // The external a slot is made of on its device, if any.
        let source = |mut slot: Slot| {
            for _ in 0..8 {
                if is_external(slot as usize) {
                    return Some(slot as usize);
                }
                let step = &self.steps[*producer.get(&slot)?];
                if !KEEP_DEVICE.contains(&step.name.as_str())
                    || step.args.iter().any(|a| matches!(a, Arg::Device))
                {
                    return None;
                }
                match step.args.first() {
                    Some(Arg::Tensor(s)) => slot = *s,
                    _ => return None,
                }
            }
            None
        };
        let mut to_host = Vec::new();
        let mut to_float = Vec::new();
        for step in &self.steps {
            let name = step.name.as_str();
            let at = |k: usize| match step.args.get(k) {
                Some(Arg::Tensor(s)) => Some(*s),
                _ => None,
            };
            let overload = self.op_of(step).map_or("", |o| o.overload.as_str());
            for (_, _, k) in HOST_ARGS
                .iter()
                .filter(|(n, o, _)| *n == name && *o == overload)
            {
                to_host.extend(at(*k).and_then(source));
            }
            for (_, ks) in ACC_STATS.iter().filter(|(n, _)| *n == name) {
                to_float.extend(
                    ks.iter()
                        .filter_map(|&k| at(k))
                        .map(|s| s as usize)
                        .filter(|&s| is_external(s)),
                );
            }
        }
        (to_host, to_float)
    }

    /// Whether the trace's collectives ran on NCCL (a GPU run): a CPU replay runs them on Gloo.
    pub fn recorded_nccl(&self) -> bool {
        self.groups.iter().any(|g| g.backend.contains("nccl"))
    }

    /// The version [`Plan::version`] has when compiled by this build.
    pub const VERSION: u32 = 5;
    /// The oldest format this build still runs. Format 5 only added [`ViewKind::WeightNormNorms`], as format 4 only added
    /// [`ViewKind::AttentionLogsumexp`] (an older plan has none, and compiled such a value as
    /// a random external input). Format 3 only added [`Step::views`] (absent, empty): a
    /// format-2 plan is a format-3 plan whose saved views were compiled as external inputs, and
    /// runs as the build that made it ran it. Format 1 restored rounded scalars and
    /// took autocast differently, so its plans would not replay as they were compiled.
    pub const OLDEST_READABLE: u32 = 2;

    /// Checks a plan that came from outside (a stored benchmark package): its version, and that
    /// every index in it points inside it, so that binding and running it cannot panic.
    pub fn validate(&self) -> Result<(), String> {
        if !(Plan::OLDEST_READABLE..=Plan::VERSION).contains(&self.version) {
            return Err(format!(
                "plan format {} (this build reads {} to {})",
                self.version,
                Plan::OLDEST_READABLE,
                Plan::VERSION
            ));
        }
        if self.version < 3 && self.steps.iter().any(|st| !st.views.is_empty()) {
            return Err(format!(
                "plan format {} with views (format 3)",
                self.version
            ));
        }
        if self.groups.is_empty() {
            return Err("no process group (the world is group 0)".into());
        }
        let n = self.n_slots;
        let slot = |s: Slot, what: &str, id: u64| {
            if (s as usize) < n {
                Ok(())
            } else {
                Err(format!("node {id}: {what} slot {s} of {n}"))
            }
        };
        for (s, spec, _) in &self.externals {
            slot(*s, "external", 0)?;
            if spec.shape.len() != spec.strides.len() || spec.shape.iter().any(|&d| d < 0) {
                return Err(format!("external slot {s}: bad shape {:?}", spec.shape));
            }
        }
        for s in &self.grad_inputs {
            slot(*s, "grad input", 0)?;
        }
        if let Some(st) = self.steps.iter().find(|st| {
            st.autocast.is_some_and(|d| {
                !matches!(d, et_schema::DType::BFloat16 | et_schema::DType::Float16)
            })
        }) {
            return Err(format!("node {}: autocast to {:?}", st.id, st.autocast));
        }
        if let Some(r) = self.restored.iter().find(|r| r.step >= self.steps.len()) {
            return Err(format!(
                "restored scalar of step {} of {}",
                r.step,
                self.steps.len()
            ));
        }
        for st in &self.steps {
            let id = st.id;
            if st.op.is_some_and(|o| o as usize >= self.ops.len()) {
                return Err(format!("node {id}: operator index out of range"));
            }
            for a in &st.args {
                for s in a.slots() {
                    slot(s, "argument", id)?;
                }
                if let Arg::ProcessGroup(g) = a {
                    if *g as usize >= self.groups.len() {
                        return Err(format!("node {id}: process group {g} out of range"));
                    }
                }
            }
            for o in &st.outs {
                let slots: Vec<Slot> = match o {
                    Out::Tensor(s) => vec![*s],
                    Out::List(v) => v.iter().flatten().copied().collect(),
                    Out::Ignore => vec![],
                };
                for s in slots {
                    slot(s, "output", id)?;
                }
            }
            for (s, _) in &st.out_specs {
                slot(*s, "output", id)?;
            }
            for s in &st.frees {
                slot(*s, "freed", id)?;
            }
            for (a, b) in &st.passthrough {
                slot(*a, "pass-through", id)?;
                slot(*b, "pass-through", id)?;
            }
            for v in &st.views {
                slot(v.slot, "view", id)?;
                slot(v.base, "view base", id)?;
                if let ViewKind::AttentionLogsumexp { key, .. } = v.kind {
                    slot(key, "view key", id)?;
                    if self.version < 4 {
                        return Err(format!(
                            "plan format {} with an attention log-sum-exp (format 4)",
                            self.version
                        ));
                    }
                }
                if let ViewKind::WeightNormNorms { g, .. } = v.kind {
                    slot(g, "view magnitude", id)?;
                    if self.version < 5 {
                        return Err(format!(
                            "plan format {} with weight-norm norms (format 5)",
                            self.version
                        ));
                    }
                }
                if v.spec.shape.len() != v.spec.strides.len()
                    || extent(&v.spec.shape, &v.spec.strides).is_none()
                {
                    return Err(format!(
                        "node {id}: view slot {}: bad shape {:?} strides {:?}",
                        v.slot, v.spec.shape, v.spec.strides
                    ));
                }
            }
            if let StepKind::Collective(c) = &st.kind {
                if c.group as usize >= self.groups.len()
                    || c.waits.iter().any(|&w| w >= self.steps.len())
                {
                    return Err(format!("node {id}: collective group or wait out of range"));
                }
            }
        }
        Ok(())
    }

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
    pub fn peak_bytes_estimate(&self, only: et_graph::Kind) -> u64 {
        // In-place updates of external inputs (parameters) are in the external bytes already.
        let external: std::collections::HashSet<u64> =
            self.externals.iter().map(|e| e.1.storage).collect();
        let mut storage_of: HashMap<Slot, (u64, u64)> = HashMap::new();
        let mut live: HashMap<u64, (u64, u32)> = HashMap::new();
        let (mut now, mut peak) = (0u64, 0u64);
        let mut used: std::collections::HashSet<Slot> = std::collections::HashSet::new();
        for st in &self.steps {
            if !st.kind.included(only) {
                continue;
            }
            used.extend(st.args.iter().flat_map(Arg::slots));
            for (slot, spec) in &st.out_specs {
                if spec.storage != 0 && external.contains(&spec.storage) {
                    continue;
                }
                // Storage 0 (unknown) is a storage of its own per slot.
                let key = if spec.storage == 0 {
                    u64::MAX - *slot as u64
                } else {
                    spec.storage
                };
                let e = live.entry(key).or_insert((0, 0));
                if e.1 == 0 {
                    now = now.saturating_add(spec.bytes());
                    e.0 = spec.bytes();
                }
                e.1 += 1;
                storage_of.insert(*slot, (key, spec.bytes()));
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

fn tensor_spec(
    t: &Trace,
    v: Value,
    shape: Value,
    strides: Option<Value>,
    ty: Option<DType>,
) -> Option<TensorSpec> {
    let Value::Tensor(ti) = v else { return None };
    let x = t.tensor(ti);
    let shape = t.int_list(shape).unwrap_or_default();
    let strides = strides
        .and_then(|s| t.int_list(s))
        .filter(|s| s.len() == shape.len())
        .unwrap_or_else(|| contiguous(&shape));
    // Without a dtype in the type string, guess from the element size.
    let dtype = ty.unwrap_or(match x.itemsize {
        8 => DType::Float64,
        2 => DType::Float16,
        1 => DType::UInt8,
        _ => DType::Float32,
    });
    Some(TensorSpec {
        shape,
        strides,
        dtype,
        storage: x.storage,
        offset: x.offset as i64,
    })
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

/// Tensors of one argument with their specs, in order (a list argument has several; a list of
/// lists, `Tensor[][]`, its inner lists' flattened). Elements that are not tensors keep their
/// place with no spec (`None` in a `Tensor?[]`).
fn arg_tensors(t: &Trace, a: &et_schema::Arg) -> Vec<(Value, Option<TensorSpec>)> {
    let mut out = Vec::new();
    collect_tensors(t, a.value, &t.arg_type(a), a.shape, a.strides, &mut out);
    out
}

/// A list argument's tensors grouped by inner list (`Tensor[][]`), in order.
fn nested_tensors(t: &Trace, a: &et_schema::Arg) -> Vec<Vec<(Value, Option<TensorSpec>)>> {
    let (Value::List { .. }, ValueType::List(elems)) = (a.value, t.arg_type(a)) else {
        return Vec::new();
    };
    let shapes = t.list(a.shape);
    let strides = a.strides.map(|s| t.list(s).to_vec()).unwrap_or_default();
    t.list(a.value)
        .iter()
        .enumerate()
        .map(|(k, &v)| {
            let mut out = Vec::new();
            let ty = elems.get(k).cloned().unwrap_or(ValueType::List(Vec::new()));
            let sh = shapes
                .get(k)
                .copied()
                .unwrap_or(Value::List { start: 0, len: 0 });
            collect_tensors(t, v, &ty, sh, strides.get(k).copied(), &mut out);
            out
        })
        .collect()
}

fn collect_tensors(
    t: &Trace,
    v: Value,
    ty: &ValueType,
    shape: Value,
    strides: Option<Value>,
    out: &mut Vec<(Value, Option<TensorSpec>)>,
) {
    match (v, ty) {
        (Value::Tensor(_), ValueType::Tensor { dtype, .. }) => {
            out.push((v, tensor_spec(t, v, shape, strides, *dtype)))
        }
        (Value::Tensor(_), _) => out.push((v, tensor_spec(t, v, shape, strides, None))),
        (Value::List { .. }, ValueType::List(elems) | ValueType::Tuple(elems)) => {
            let shapes = t.list(shape);
            let strides = strides.map(|s| t.list(s).to_vec()).unwrap_or_default();
            for (k, &x) in t.list(v).iter().enumerate() {
                let sh = shapes
                    .get(k)
                    .copied()
                    .unwrap_or(Value::List { start: 0, len: 0 });
                match (x, elems.get(k)) {
                    (
                        Value::List { .. },
                        Some(inner @ (ValueType::List(_) | ValueType::Tuple(_))),
                    ) => collect_tensors(t, x, inner, sh, strides.get(k).copied(), out),
                    (_, Some(ValueType::Tensor { dtype, .. })) => {
                        out.push((x, tensor_spec(t, x, sh, strides.get(k).copied(), *dtype)))
                    }
                    _ => out.push((x, tensor_spec(t, x, sh, strides.get(k).copied(), None))),
                }
            }
        }
        _ => {}
    }
}

/// A region of storage: (storage id, offset, elements, bytes each).
type Region = (u64, u64, u64, u64);

/// The region of storage a tensor value views.
fn storage_region(t: &Trace, v: Value) -> Option<Region> {
    match v {
        Value::Tensor(i) => {
            let x = t.tensor(i);
            (x.storage != 0).then_some((x.storage, x.offset, x.numel, x.itemsize))
        }
        _ => None,
    }
}

/// The elements a tensor of `shape` and `strides` reaches past its first (the largest offset
/// plus one), `None` for negative strides or an overflow; 0 when it has no element.
fn extent(shape: &[i64], strides: &[i64]) -> Option<i64> {
    if shape.contains(&0) {
        return Some(0);
    }
    let mut last = 0i64;
    for (&d, &st) in shape.iter().zip(strides) {
        if d < 0 || st < 0 {
            return None;
        }
        last = last.checked_add((d - 1).checked_mul(st)?)?;
    }
    last.checked_add(1)
}

fn key_of(t: &Trace, v: Value) -> Option<TensorKey> {
    match v {
        Value::Tensor(i) => {
            let x = t.tensor(i);
            (x.storage != 0).then_some((x.id, x.storage))
        }
        _ => None,
    }
}

struct Builder<'g, 't> {
    g: &'g Graph<'t>,
    current: HashMap<TensorKey, Slot>,
    n_slots: u32,
    externals: Vec<(Slot, TensorSpec, Fill)>,
    external_index: HashMap<Slot, usize>,
    last_use: Vec<usize>,
    /// Shape and dtype each slot holds, as the trace records it.
    slot_meta: Vec<Option<(Vec<i64>, DType)>>,
    /// Distinct operators and their index in [`Plan::ops`].
    ops: indexmap::IndexSet<OpRef>,
    /// The slot a value came from with its values unchanged: an in-place op's output was
    /// written over it (same tensor key), or a copy (`to`, `clone`, `contiguous`) was made of
    /// it. To find the external input whose values a consumer constrains.
    written_over: HashMap<Slot, Slot>,
    /// The slot last written to each region of storage (storage id, offset, elements,
    /// bytes each), with its strides: a tensor autograd saved from an op's output reaches the
    /// backward as a new TensorImpl over the same storage (`SavedVariable` keeps the output's
    /// data without its grad_fn), so under a new tensor id (relu's output, id 38 on storage 46,
    /// read by `threshold_backward` as id 120 on storage 46).
    by_storage: HashMap<Region, (Slot, Vec<i64>)>,
    /// Views the step being built reads ([`Step::views`]).
    views: Vec<View>,
    /// The nodes (their indices, in trace order) of the ops whose outputs [`Builder::derived`]
    /// can make again ((log-)softmax, a fused attention's log-sum-exp) that wrote each region
    /// of storage, found once when first asked.
    producers: Option<HashMap<Region, Vec<usize>>>,
    /// The trace node of the step being built (its index).
    node: usize,
    /// The process group of the step being built (its ProcessGroup arguments).
    group: u32,
}

impl Builder<'_, '_> {
    fn new_slot(&mut self, step: usize, meta: Option<(Vec<i64>, DType)>) -> Slot {
        self.n_slots += 1;
        self.last_use.push(step);
        self.slot_meta.push(meta);
        self.n_slots - 1
    }

    /// The slot holding a tensor input now, materialising it as external when unseen.
    fn input_slot(&mut self, step: usize, v: Value, spec: &Option<TensorSpec>) -> Option<Slot> {
        let key = key_of(self.g.trace, v)?;
        if let Some(&s) = self.current.get(&key) {
            // Tensor and storage ids are reused after a free (the storage id comes from the data
            // pointer): a recorded shape or dtype that differs from the current version's means
            // this is a new tensor that no recorded op produced, so it is an external input.
            let same = match (&self.slot_meta[s as usize], spec) {
                (Some((shape, dtype)), Some(sp)) => *shape == sp.shape && *dtype == sp.dtype,
                _ => true,
            };
            if same {
                self.last_use[s as usize] = step;
                return Some(s);
            }
        }
        let spec = spec.clone()?;
        // The same region of storage as the slot last written there, read as it was written
        // (shape, strides, dtype): the same values under another tensor id (a saved output).
        let region = storage_region(self.g.trace, v);
        if let Some((s, strides)) = region.and_then(|r| self.by_storage.get(&r)) {
            let (base, base_strides) = (*s, strides.clone());
            match &self.slot_meta[base as usize] {
                Some((shape, dtype)) if *dtype == spec.dtype => {
                    if *shape == spec.shape && base_strides == spec.strides {
                        self.last_use[base as usize] = step;
                        self.current.insert(key, base);
                        return Some(base);
                    }
                    // Other sizes or strides over the same elements: a view of it, if it
                    // reaches no element the base does not.
                    if spec.shape.len() == spec.strides.len()
                        && extent(&spec.shape, &spec.strides)
                            .zip(extent(shape, &base_strides))
                            .is_some_and(|(e, base_e)| e <= base_e)
                    {
                        self.last_use[base as usize] = step;
                        let s = self.new_slot(step, Some((spec.shape.clone(), spec.dtype)));
                        log::debug!(
                            "step {step}: {:?}/{:?} read as a view of slot {base}",
                            spec.shape,
                            spec.strides
                        );
                        self.views.push(View {
                            slot: s,
                            base,
                            spec: spec.clone(),
                            kind: ViewKind::Strided,
                        });
                        self.current.insert(key, s);
                        return Some(s);
                    }
                }
                _ => {}
            }
        }
        if let Some(s) = self.derived(step, region, &spec) {
            self.current.insert(key, s);
            return Some(s);
        }
        let s = self.new_slot(step, Some((spec.shape.clone(), spec.dtype)));
        let fill = if spec.dtype.is_integral() {
            Fill::Zeros
        } else if spec.is_wrapped_number() {
            // A float one (integral ones are zeros, above), its value unrecorded. 1 keeps
            // such factors neutral: a random 0.08 as beta2 decayed Adam's second moments to
            // denormals within 30 iterations.
            Fill::Value(1.0)
        } else if spec.shape.iter().product::<i64>() == 1 {
            // A one-element float input is most often a hyper-parameter held as a tensor (an
            // optimizer's lr, betas, step): a negative one turns `exp_avg_sq.mul_(beta2)`
            // negative and its sqrt NaN.
            Fill::NonNegative
        } else {
            Fill::Random
        };
        if let Some(r) = region {
            self.by_storage.insert(r, (s, spec.strides.clone()));
        }
        self.external_index.insert(s, self.externals.len());
        self.externals.push((s, spec, fill));
        self.current.insert(key, s);
        Some(s)
    }

    /// A value no replayed op wrote that an op inside a composite the replay runs whole made
    /// from a live slot, and that the replay can make again from it: the (log-)softmax of
    /// cross-entropy, saved for its backward. Filled uniform instead, its gradient was the same
    /// whatever the logits, so training on the replay's fixed batch never converged, and the
    /// weights drifted to Inf (mlp_sgd after 105 iterations). `None` when the region's
    /// producer is not such an op or its input is not live with its recorded shape and dtype.
    fn derived(&mut self, step: usize, region: Option<Region>, spec: &TensorSpec) -> Option<Slot> {
        let t = self.g.trace;
        if !spec.dtype.is_floating_point() {
            return None;
        }
        let producers = self.producers.get_or_insert_with(|| {
            let mut m = HashMap::new();
            for (k, n) in t.nodes.iter().enumerate() {
                let name = t.name(n);
                // Ops whose second output alone is such a value.
                let lse = is_fused_attention(name) || name == "aten::_weight_norm_interface";
                if lse
                    || matches!(
                        name,
                        "aten::_log_softmax"
                            | "aten::log_softmax"
                            | "aten::_softmax"
                            | "aten::softmax"
                    )
                {
                    for (i, a) in t.outputs(n).iter().enumerate() {
                        // A fused attention's second output, its log-sum-exp; weight norm's,
                        // its norms.
                        if lse && i != 1 {
                            continue;
                        }
                        for (v, _) in arg_tensors(t, a) {
                            if let Some(r) = storage_region(t, v) {
                                m.entry(r).or_insert_with(Vec::new).push(k);
                            }
                        }
                    }
                }
            }
            m
        });
        // The last such op before this step's node: the allocator reuses a region, and a
        // trace of several iterations holds one producer of it per iteration.
        let before = producers.get(&region?)?;
        let at = before.partition_point(|&k| k < self.node).checked_sub(1)?;
        let node = &t.nodes[before[at]];
        let name = t.name(node);
        let ins = t.inputs(node);
        if is_fused_attention(name) {
            return self.attention_logsumexp(step, node, spec);
        }
        if name == "aten::_weight_norm_interface" {
            return self.weight_norm_norms(step, node, spec);
        }
        let (base, in_spec) = self.live_input(node, 0)?;
        let dim = match ins.get(1)?.value {
            Value::Int(d) => d,
            _ => return None,
        };
        // Same shape and dtype as its input: what the op makes of it.
        if in_spec.shape != spec.shape || in_spec.dtype != spec.dtype {
            return None;
        }
        let kind = if name.contains("log_softmax") {
            ViewKind::LogSoftmax { dim }
        } else {
            ViewKind::Softmax { dim }
        };
        log::debug!("step {step}: {name} of slot {base} made again for its backward");
        Some(self.computed_view(step, base, &[], spec, kind))
    }

    /// Input `i` of `node` where it is live in a slot with the shape and dtype the trace
    /// recorded for it: the slot and that spec.
    fn live_input(&self, node: &et_schema::Node, i: usize) -> Option<(Slot, TensorSpec)> {
        let t = self.g.trace;
        let (v, sp) = arg_tensors(t, t.inputs(node).get(i)?).into_iter().next()?;
        let sp = sp?;
        let s = *self.current.get(&key_of(t, v)?)?;
        (self.slot_meta[s as usize] == Some((sp.shape.clone(), sp.dtype))).then_some((s, sp))
    }

    /// A new slot made at `step` of `base` (and the other slots it `reads`) as `kind` says,
    /// contiguous with `spec`'s shape and dtype: a value a composite run whole made inside it
    /// and saved for a backward, which no replayed op writes.
    fn computed_view(
        &mut self,
        step: usize,
        base: Slot,
        reads: &[Slot],
        spec: &TensorSpec,
        kind: ViewKind,
    ) -> Slot {
        for &r in std::iter::once(&base).chain(reads) {
            self.last_use[r as usize] = step;
        }
        let s = self.new_slot(step, Some((spec.shape.clone(), spec.dtype)));
        self.views.push(View {
            slot: s,
            base,
            spec: TensorSpec {
                strides: contiguous(&spec.shape),
                ..spec.clone()
            },
            kind,
        });
        s
    }

    /// The log-sum-exp a fused attention `node` returned (its second output, `spec`), made
    /// again from its query and key where both are live with their recorded shapes: `[B, H,
    /// L, E]` and `[B, H, S, E]`, the log-sum-exp `[B, H, L]` in a floating dtype, no
    /// attention mask (an additive or boolean one is not modelled). `None` otherwise.
    fn attention_logsumexp(
        &mut self,
        step: usize,
        node: &et_schema::Node,
        spec: &TensorSpec,
    ) -> Option<Slot> {
        let t = self.g.trace;
        let ins = t.inputs(node);
        let (q, qs) = self.live_input(node, 0)?;
        let (k, ks) = self.live_input(node, 1)?;
        let [b, h, l, e] = qs.shape[..] else {
            return None;
        };
        let [b2, h2, _, e2] = ks.shape[..] else {
            return None;
        };
        if (b, h, e) != (b2, h2, e2) || spec.shape != [b, h, l] || !spec.dtype.is_floating_point() {
            return None;
        }
        let causal = match ins.get(4).map(|a| a.value) {
            Some(Value::Bool(c)) => c,
            _ => return None,
        };
        // The CPU kernel's attn_mask (argument 5) must be None; the CUDA one's argument 5 is
        // return_debug_mask, a bool.
        if let Some(a) = ins.get(5) {
            if !(is_none(t, a.value) || matches!(a.value, Value::Bool(_))) {
                return None;
            }
        }
        let scale = match ins.get(6).map(|a| a.value) {
            Some(v) if !is_none(t, v) => Some(t.as_f64(v)?),
            _ => None,
        };
        log::debug!(
            "step {step}: the log-sum-exp of {} made again for its backward",
            t.name(node)
        );
        let kind = ViewKind::AttentionLogsumexp {
            key: k,
            causal,
            scale,
        };
        Some(self.computed_view(step, q, &[k], spec, kind))
    }

    /// The norms `_weight_norm_interface(v, g, dim)` (`node`) returned second (`spec`, `g`'s
    /// shape), made again from its `v` and `g` where both are live with their recorded shapes
    /// and dtypes. `None` otherwise.
    fn weight_norm_norms(
        &mut self,
        step: usize,
        node: &et_schema::Node,
        spec: &TensorSpec,
    ) -> Option<Slot> {
        let (v, _) = self.live_input(node, 0)?;
        let (g, gs) = self.live_input(node, 1)?;
        let dim = match self.g.trace.inputs(node).get(2)?.value {
            Value::Int(d) => d,
            _ => return None,
        };
        if spec.shape != gs.shape || !spec.dtype.is_floating_point() {
            return None;
        }
        log::debug!("step {step}: the weight norm's norms made again for its backward");
        Some(self.computed_view(step, v, &[g], spec, ViewKind::WeightNormNorms { g, dim }))
    }

    /// The slot is a floating-point external input (a parameter, if anything requires grad).
    fn is_float_external(&self, slot: Slot) -> bool {
        self.external_index
            .get(&slot)
            .is_some_and(|&e| self.externals[e].1.dtype.is_floating_point())
    }

    /// The external input a slot's values flow from (through in-place updates and copies), if
    /// they flow from one.
    fn external_of(&self, mut slot: Slot) -> Option<usize> {
        while let Some(&prev) = self.written_over.get(&slot) {
            slot = prev;
        }
        self.external_index.get(&slot).copied()
    }

    /// Makes the external input a value flows from (through in-place updates and copies)
    /// non-negative.
    fn mark_nonnegative(&mut self, slot: Slot) {
        if let Some(e) = self.external_of(slot) {
            let ext = &mut self.externals[e];
            if ext.1.dtype.is_floating_point() && matches!(ext.2, Fill::Random) {
                ext.2 = Fill::NonNegative;
            }
        }
    }

    fn op_ref(&mut self, schema: &OpSchema, text: &str) -> u32 {
        let (i, _) = self.ops.insert_full(OpRef {
            name: schema.name.clone(),
            overload: schema.overload.clone(),
            schema: text.to_string(),
        });
        i as u32
    }
}

/// A fused attention kernel that returns its log-sum-exp second, `[B, H, L]` (the memory-
/// efficient kernel pads it, and is not one).
fn is_fused_attention(name: &str) -> bool {
    matches!(
        name,
        "aten::_scaled_dot_product_flash_attention_for_cpu"
            | "aten::_scaled_dot_product_flash_attention"
    )
}

fn scalar_of(t: &Trace, v: Value) -> Option<Arg> {
    Some(match v {
        Value::Int(i) => Arg::ScalarInt(i),
        Value::Bool(b) => Arg::ScalarBool(b),
        Value::Float(f) => Arg::ScalarDouble(f),
        Value::Str(_) => Arg::ScalarDouble(t.as_f64(v)?),
        _ => return None,
    })
}

fn is_none(t: &Trace, v: Value) -> bool {
    match v {
        Value::Null => true,
        Value::Str(s) => t.str(s) == "<None>",
        _ => false,
    }
}

/// Builds one argument from its trace value as the schema types it.
fn build_arg(
    b: &mut Builder,
    step: usize,
    ty: &SchemaType,
    a: &et_schema::Arg,
) -> Result<Arg, String> {
    let t = b.g.trace;
    let v = a.value;
    if let SchemaType::Optional(inner) = ty {
        if is_none(t, v) {
            return Ok(Arg::None);
        }
        return build_arg(b, step, inner, a);
    }
    let unsupported = || {
        format!(
            "argument type {ty} (recorded as {:?}) with value {} is not supported",
            t.str(a.ty),
            t.value_text(a.value, 200)
        )
    };
    match ty {
        SchemaType::Named { name, .. } => match name.as_str() {
            "Tensor" => {
                if is_none(t, v) {
                    return Ok(Arg::UndefinedTensor);
                }
                let ts = arg_tensors(t, a);
                if let Some((_, Some(sp))) = ts.first() {
                    if sp.shape.iter().chain(&sp.strides).any(|&d| d < 0) {
                        return Err(format!(
                            "tensor with a negative size or stride (shape {:?}, strides {:?})",
                            sp.shape, sp.strides
                        ));
                    }
                }
                match ts.first() {
                    Some((tv, spec)) => match b.input_slot(step, *tv, spec) {
                        Some(s) => Ok(Arg::Tensor(s)),
                        None => Ok(Arg::UndefinedTensor),
                    },
                    None => Err(unsupported()),
                }
            }
            "int" | "SymInt" | "ScalarType" | "Layout" | "MemoryFormat" => match v {
                Value::Int(i) => Ok(Arg::Int(i)),
                Value::Bool(x) => Ok(Arg::Int(x as i64)),
                _ => Err(unsupported()),
            },
            "float" => t.as_f64(v).map(Arg::Double).ok_or_else(unsupported),
            "bool" => match v {
                Value::Bool(x) => Ok(Arg::Bool(x)),
                Value::Int(i) => Ok(Arg::Bool(i != 0)),
                _ => Err(unsupported()),
            },
            "str" => match v {
                Value::Str(s) => Ok(Arg::Str(CString::new(t.str(s)).map_err(|e| e.to_string())?)),
                _ => Err(unsupported()),
            },
            "Scalar" => scalar_of(t, v).ok_or_else(unsupported),
            "Device" => Ok(Arg::Device),
            "__torch__.torch.classes.c10d.ProcessGroup" => Ok(Arg::ProcessGroup(b.group)),
            "__torch__.torch.classes.c10d.ReduceOp" => Ok(Arg::ReduceOp(0)),
            "Generator" => Ok(Arg::None),
            _ => Err(unsupported()),
        },
        SchemaType::List { elem, size, .. } => {
            let base = elem.base_name().unwrap_or("");
            let items = t.list(v);
            if matches!(**elem, SchemaType::List { .. }) && base == "Tensor" {
                let lists = nested_tensors(t, a)
                    .into_iter()
                    .map(|inner| {
                        inner
                            .iter()
                            .map(|(tv, spec)| {
                                if is_none(t, *tv) {
                                    None
                                } else {
                                    b.input_slot(step, *tv, spec)
                                }
                            })
                            .collect()
                    })
                    .collect();
                return Ok(Arg::TensorLists(lists));
            }
            match (base, elem.is_optional()) {
                ("Tensor", optional) => {
                    let ts = arg_tensors(t, a);
                    let slots = ts
                        .iter()
                        .map(|(tv, spec)| {
                            if is_none(t, *tv) {
                                None
                            } else {
                                b.input_slot(step, *tv, spec)
                            }
                        })
                        .collect();
                    Ok(Arg::TensorList { slots, optional })
                }
                ("int" | "SymInt", _) => {
                    if let Value::Int(i) = v {
                        return Ok(Arg::IntList(vec![i; size.unwrap_or(1)]));
                    }
                    items
                        .iter()
                        .map(|x| {
                            if let Value::Int(i) = x {
                                Some(*i)
                            } else {
                                None
                            }
                        })
                        .collect::<Option<Vec<_>>>()
                        .map(Arg::IntList)
                        .ok_or_else(unsupported)
                }
                ("float", _) => items
                    .iter()
                    .map(|x| t.as_f64(*x))
                    .collect::<Option<Vec<_>>>()
                    .map(Arg::DoubleList)
                    .ok_or_else(unsupported),
                ("Scalar", _) => items
                    .iter()
                    .map(|x| t.as_f64(*x))
                    .collect::<Option<Vec<_>>>()
                    .map(Arg::ScalarList)
                    .ok_or_else(unsupported),
                ("bool", _) => items
                    .iter()
                    .map(|x| {
                        if let Value::Bool(b) = x {
                            Some(*b as u8)
                        } else {
                            None
                        }
                    })
                    .collect::<Option<Vec<_>>>()
                    .map(Arg::BoolList)
                    .ok_or_else(unsupported),
                _ => Err(unsupported()),
            }
        }
        _ => Err(unsupported()),
    }
}

/// External inputs first read inside an optimizer's step (`Optimizer.step#...` annotations) are
/// its state: Adam's moments, Adagrad's sums, momentum buffers. The trace records no values, and
/// torch creates that state as zeros (`zeros_like`, `full_like(p, initial_accumulator_value=0)`)
/// that the steps then fill: the replay does the same, and its own warm-up steps fill them as the
/// original's did. It matters for time, not only for health: rows that no step has touched stay
/// zero in the original (an embedding's rows outside the batch's indices, since their gradient is
/// zero), and kernels are not equally fast on every value (`sqrt` over zeros ran 6x slower than
/// over random values on the VM this was measured on; random state gave recsys_adagrad a third of
/// the original's time in that op). One-element inputs (hyper-parameters and step counts held as
/// tensors) keep their own fills, as do inputs whose consumer fixed their value.
fn optimizer_state(externals: &mut [(Slot, TensorSpec, Fill)]) {
    for (_, spec, fill) in externals {
        let elements: i64 = spec.shape.iter().product();
        if spec.dtype.is_floating_point()
            && elements > 1
            && matches!(fill, Fill::Random | Fill::NonNegative)
        {
            *fill = Fill::Zeros;
        }
    }
}

/// Float arguments only valid when non-negative. Random signs there turn an optimizer's first
/// step into NaN (Adam's `exp_avg_sq.sqrt()`), and NaN flows into every parameter and later
/// iteration, where kernels take paths the original never ran.
fn needs_nonnegative(op: &str, arg_name: Option<&str>) -> bool {
    const OPS: &[&str] = &[
        "aten::sqrt",
        "aten::sqrt_",
        "aten::rsqrt",
        "aten::rsqrt_",
        "aten::log",
        "aten::log_",
        "aten::log2",
        "aten::log10",
        "aten::_foreach_sqrt",
        "aten::_foreach_sqrt_",
        "aten::_foreach_rsqrt",
        "aten::_foreach_rsqrt_",
        "aten::_foreach_log",
        "aten::_foreach_log_",
    ];
    const ARGS: &[&str] = &[
        "running_var",
        "exp_avg_sqs",
        "max_exp_avg_sqs",
        "state_sums",
    ];
    OPS.contains(&op) || arg_name.is_some_and(|a| ARGS.contains(&a))
}

/// An argument an `nn.Module` passes its parameters as: `weight`, `bias`, `*_weight`,
/// `*_bias` (`in_proj_weight`, `qkv_bias`), an RNN's `params`.
fn is_weight_like(name: &str) -> bool {
    matches!(name, "weight" | "bias" | "params")
        || name.ends_with("_weight")
        || name.ends_with("_bias")
}

/// The alias set a schema argument or return reads (`Tensor(a)`), `None` where it has none or
/// is written (`Tensor(a!)`).
fn read_alias(ty: Option<&et_schema::SchemaType>) -> Option<&[String]> {
    ty?.alias()
        .filter(|a| !a.is_write)
        .map(|a| a.before.as_slice())
}

/// The op's first return is a view of its first argument: it reads the same alias set, and
/// neither is written (`t`, `view`, `split`, `expand`).
fn returns_view_of_first(s: &OpSchema) -> bool {
    let first = read_alias(s.args.first().map(|a| &a.ty));
    first.is_some() && first == read_alias(s.returns.first().map(|r| &r.ty))
}

/// Values for the decays optimizers multiply their state by in place, which the trace does not
/// record (a Python number reaches `mul_` as a wrapped 0-dim double, its value dropped; Kineto
/// drops it too). 1, the neutral factor, never decays the state: SGD's momentum buffer then
/// sums every gradient so far and its steps grow without bound (wide_deep_sgd went NaN after
/// 116 replayed iterations). Where the next op on that state adds the complement as a recorded
/// scalar, an exponential average (`exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)`:
/// Adam, RMSprop's alpha, Adadelta's rho), the decay is 1 less it, exact. Otherwise (SGD's
/// `buf.mul_(momentum).add_(grad, alpha=1 - dampening)`, whose alpha says nothing of the
/// momentum) 0.9, the usual momentum, which keeps the buffer bounded.
fn optimizer_decays(
    steps: &[Step],
    decays: &[(usize, usize)],
    externals: &mut [(Slot, TensorSpec, Fill)],
) {
    for &(k, e) in decays {
        let Some(Out::Tensor(state)) = steps[k].outs.first() else {
            continue;
        };
        let next = steps[k + 1..]
            .iter()
            .find(|s| s.args.first() == Some(&Arg::Tensor(*state)));
        let complement = next
            .filter(|s| s.name == "aten::addcmul_")
            .and_then(|s| match s.args.get(3) {
                Some(Arg::ScalarDouble(v)) => Some(*v),
                _ => None,
            })
            .filter(|v| *v > 0.0 && *v < 1.0);
        externals[e].2 = Fill::Value(complement.map_or(0.9, |v| 1.0 - v));
    }
}

/// Inputs whose values their consumer constrains: integers that index something get indices
/// valid for it; a loss's `total_weight` (saved by the forward op inside a composite the replay
/// does not look into) gets the target count it divides by, not a random divisor that scales
/// every gradient by up to 1e4 and drives SGD to Inf within a few iterations.
fn consumer_fill(
    op: &str,
    arg_name: &str,
    args: &[et_schema::Arg],
    outs: &[et_schema::Arg],
    t: &Trace,
    schema: &OpSchema,
) -> Option<Fill> {
    // The recorded value of the schema argument of this name.
    let arg = |name: &str| -> Option<&et_schema::Arg> {
        let k = schema
            .args
            .iter()
            .position(|a| a.name.as_deref() == Some(name))?;
        args.get(k)
    };
    let shape_of = |name: &str| t.int_list(arg(name)?.shape);
    let int_arg = |name: &str| match arg(name)?.value {
        Value::Int(i) => Some(i),
        _ => None,
    };
    let dim_size = |tensor: &str| -> Option<i64> {
        let shape = shape_of(tensor)?;
        let d = int_arg("dim").unwrap_or(0);
        let d = if d < 0 { d + shape.len() as i64 } else { d };
        shape.get(d as usize).copied()
    };
    let base = op.trim_start_matches("aten::");
    match (base, arg_name) {
        (b, "total_weight") if b.starts_with("nll_loss") => Some(Fill::Value(
            shape_of("target").map_or(1, |s| s.iter().product::<i64>().max(1)) as f64,
        )),
        // A (log-)softmax output saved for backward: uniform probabilities over the softmax
        // dim, so the gradient the backward forms sums to zero like the real one does.
        ("_log_softmax_backward_data" | "_softmax_backward_data", "output") => {
            let n = dim_size("output")?.max(1) as f64;
            Some(Fill::Value(if base.starts_with("_log") {
                -n.ln()
            } else {
                1.0 / n
            }))
        }
        // A normalisation's statistics, saved by the forward op inside the composite the replay
        // runs whole (`layer_norm` -> `native_layer_norm`'s mean and rstd, `batch_norm`'s
        // saved mean and inverse std) and read by its backward: filled at random, a negative
        // or near-zero rstd scaled every gradient through the norm by a random sign and size,
        // and the weights drifted to NaN (layernorm_adadelta after 92-342 replayed
        // iterations, vit_train after 257). The statistics of normalised activations (mean 0,
        // scale 1) keep the backward's gradients at their input's scale.
        (b, "mean" | "save_mean") if b.starts_with("native_") && b.contains("norm_backward") => {
            Some(Fill::Value(0.0))
        }
        (b, "rstd" | "save_invstd") if b.starts_with("native_") && b.contains("norm_backward") => {
            Some(Fill::Value(1.0))
        }
        // A divisor no replayed op made (the norm `pairwise_distance` computes inside
        // `triplet_margin_loss`, divided by in `NormBackward1`): random values around zero make
        // the quotient heavy-tailed, and the gradients through it drove triplet_mlp_sgd's
        // embeddings to NaN after 75 replayed iterations. 1 keeps the dividend's scale.
        ("div" | "div_", "other") => Some(Fill::Value(1.0)),
        (b, "indices") if b.contains("embedding") => {
            Some(Fill::Indices(shape_of("weight")?.first().copied()?))
        }
        (b, "offsets") if b.contains("embedding_bag") => {
            Some(Fill::Offsets(shape_of("indices")?.iter().product()))
        }
        (
            "index_select" | "gather" | "scatter" | "scatter_" | "scatter_add" | "scatter_add_"
            | "index_add" | "index_add_" | "index_copy" | "index_copy_",
            "index",
        ) => Some(Fill::Indices(dim_size("self")?)),
        // Binary cross-entropy takes probabilities, not class indices.
        (b, "self" | "target")
            if b.starts_with("binary_cross_entropy") && !b.contains("logits") =>
        {
            Some(Fill::Probability)
        }
        // With logits, its input is any real, its target still a probability: a target outside
        // [0, 1] has no logit that minimises the loss, so SGD drove the logits, and the
        // weights under them, to Inf (dlrm_sgd and wide_deep_sgd went NaN after 58-64
        // replayed iterations).
        (b, "target") if b.starts_with("binary_cross_entropy_with_logits") => {
            Some(Fill::Probability)
        }
        (b, "target") if b.contains("nll_loss") || b.contains("cross_entropy") => {
            let s = shape_of("self")?;
            Some(Fill::Indices(if s.len() > 1 {
                s[1]
            } else {
                s.first().copied()?
            }))
        }
        // Bucket boundaries are sorted. Random ones made `bucketize`'s indices arbitrary in
        // [0, n], and n (a value past the last boundary), which the original's data never
        // reached, overflowed the scatter it indexed, sized by the boundaries
        // (int_hash_infer's `scatter_add_`). Synthetic values are at most standard normal
        // (scaled down by their fan-in): boundaries spread over [-8, 8] hold every one inside,
        // so the indices stay in [1, n - 1].
        ("bucketize", "boundaries") | ("searchsorted", "sorted_sequence") => {
            Some(Fill::Sorted(8.0))
        }
        // Lengths of padded sequences, longest first: the packed data the trace records holds
        // their sum (rows), and its batch sizes their maximum (one per time step).
        ("_pack_padded_sequence", "lengths") => {
            let n = shape_of("lengths")?.iter().product::<i64>();
            let total = t.int_list(outs.first()?.shape)?.first().copied()?;
            let longest = t.int_list(outs.get(1)?.shape)?.first().copied()?;
            Some(Fill::Ints(sequence_lengths(n, total, longest)))
        }
        _ => None,
    }
}

/// `n` sequence lengths, non-increasing, in [1, longest], the first `longest`, adding up to
/// `total` where they can (spread as evenly as possible over the others).
fn sequence_lengths(n: i64, total: i64, longest: i64) -> Vec<i64> {
    let n = n.max(0) as usize;
    let longest = longest.max(1);
    if n == 0 {
        return Vec::new();
    }
    let rest = (total - longest).max(0);
    let others = (n - 1) as i64;
    let mut v = vec![longest];
    for i in 0..others {
        let share = rest / others + i64::from(i < rest % others);
        v.push(share.clamp(1, longest));
    }
    v
}

/// Compiles a replay set, without libtorch and for no device in particular. Ops that cannot
/// run (no schema, unsupported argument) are planned as failing steps with the reason; the run
/// goes on around them.
/// Which ops made an autograd graph node in the original. Under grad mode every op records the
/// thread's sequence counter, which moves on only when a node is made: so an op made one where
/// the next op of its thread outside its own subtree records a larger number, and, where none
/// does (the forward's last), where a backward record carries its number (autograd's
/// `XBackward0` records hold their forward op's, with the forward thread's id). Ops that made
/// none (no input required grad) leave their number to the next op.
struct GraphNodes {
    /// Per thread, the forward nodes recording a sequence number: (node index, number), in
    /// execution (id) order.
    forward: HashMap<u64, Vec<(u32, i64)>>,
    /// Each such node's place in its thread's list.
    place: HashMap<u32, usize>,
    /// Numbers a backward record carries.
    backward: std::collections::HashSet<i64>,
}

impl GraphNodes {
    fn new(t: &et_schema::Trace) -> GraphNodes {
        let mut g = GraphNodes {
            forward: HashMap::new(),
            place: HashMap::new(),
            backward: Default::default(),
        };
        let mut ids: HashMap<u64, Vec<(u64, u32, i64)>> = HashMap::new();
        for (i, n) in t.nodes.iter().enumerate() {
            let Some(s) = n.seq_id.filter(|&s| s >= 0) else {
                continue;
            };
            if n.fw_tid.is_some_and(|f| f != 0) {
                g.backward.insert(s);
            } else {
                ids.entry(n.tid.unwrap_or(0))
                    .or_default()
                    .push((n.id, i as u32, s));
            }
        }
        for (tid, mut v) in ids {
            v.sort_unstable();
            for (k, &(_, i, _)) in v.iter().enumerate() {
                g.place.insert(i, k);
            }
            g.forward
                .insert(tid, v.into_iter().map(|(_, i, s)| (i, s)).collect());
        }
        g
    }

    /// Whether the op at node index `i` made a graph node.
    fn made(&self, graph: &Graph, i: u32) -> bool {
        let n = &graph.trace.nodes[i as usize];
        let Some(s) = n.seq_id.filter(|&s| s >= 0) else {
            return false;
        };
        let (Some(list), Some(&k)) = (self.forward.get(&n.tid.unwrap_or(0)), self.place.get(&i))
        else {
            return self.backward.contains(&s);
        };
        let next = list[k + 1..]
            .iter()
            .find(|&&(j, _)| !graph.ancestors(j).any(|a| a == i));
        match next {
            Some(&(_, later)) if later > s => true,
            Some(&(_, later)) if later == s => false,
            _ => self.backward.contains(&s),
        }
    }
}

/// Tensor arguments libtorch requires on the CPU whatever the device, `(op, overload,
/// position)`: a packed sequence's lengths and batch sizes (`lstm.data` and its kin take the
/// batch sizes second; their `input` overloads have `hx` there, which stays on the device,
/// hence the overload). A CPU trace records them
/// on the CPU like everything else; on another device the external inputs in these places stay
/// there, as a model on that device keeps them (made on the device, the replay's
/// `_pack_padded_sequence` failed: "'lengths' argument should be a 1D CPU int64 tensor").
const HOST_ARGS: &[(&str, &str, usize)] = &[
    ("aten::_pack_padded_sequence", "", 1),
    ("aten::_pad_packed_sequence", "", 1),
    ("aten::_pack_padded_sequence_backward", "", 2),
    ("aten::lstm", "data", 1),
    ("aten::gru", "data", 1),
    ("aten::rnn_tanh", "data", 1),
    ("aten::rnn_relu", "data", 1),
];

/// A normalization's saved statistics, `(backward op, positions)`, which the CPU keeps in a
/// half-precision input's own dtype and CUDA in its accumulation type (float): a CPU trace's
/// bf16 `native_layer_norm_backward` stopped on CUDA at "expected scalar type Float but found
/// BFloat16" (gpt_bf16, the first GPU check). Such external inputs become float32 there.
const ACC_STATS: &[(&str, &[usize])] = &[
    ("aten::native_layer_norm_backward", &[3, 4]),
    ("aten::native_group_norm_backward", &[2, 3]),
    ("aten::native_batch_norm_backward", &[5, 6]),
];

/// Ops whose output is on their first argument's device when no device argument is given
/// (`lengths.to(torch.int64)` before `pack_padded_sequence`): a host argument made by them
/// stays on the CPU if their input does.
const KEEP_DEVICE: &[&str] = &[
    "aten::to",
    "aten::_to_copy",
    "aten::contiguous",
    "aten::clone",
    "aten::detach",
    "aten::alias",
    "aten::view",
    "aten::reshape",
];

pub fn compile(g: &Graph, set: &ReplaySet) -> Plan {
    let t = g.trace;
    let mut b = Builder {
        g,
        current: HashMap::new(),
        n_slots: 0,
        externals: Vec::new(),
        external_index: HashMap::new(),
        last_use: Vec::new(),
        slot_meta: Vec::new(),
        ops: indexmap::IndexSet::new(),
        written_over: HashMap::new(),
        by_storage: HashMap::new(),
        views: Vec::new(),
        producers: None,
        node: 0,
        group: 0,
    };
    let groups = process_groups(t);
    let graph_nodes = GraphNodes::new(t);
    let mut steps = Vec::with_capacity(set.ops.len());
    let mut grad_inputs = std::collections::BTreeSet::new();
    // For a trace that recorded no graph (inference): the float external inputs an op reads as
    // a weight or bias (directly or through views of them), and each view's root slot.
    let mut weight_like = std::collections::BTreeSet::new();
    let mut view_root: HashMap<Slot, Slot> = HashMap::new();
    let mut restored: Vec<Restored> = Vec::new();
    // (step, external) of the optimizer decays the trace does not record.
    let mut decays: Vec<(usize, usize)> = Vec::new();
    for (step, &i) in set.ops.iter().enumerate() {
        let node = &t.nodes[i as usize];
        b.node = i as usize;
        let name = t.name(node).to_string();
        let collective = g.class[i as usize].contains(OpClass::COLLECTIVE);
        let inputs = t.inputs(node);
        let schema = g.schema[i as usize].clone();
        let mut args = Vec::new();
        let mut problem: Option<String> = None;
        let mut input_keys: Vec<(TensorKey, Slot)> = Vec::new();
        let mut op = None;
        let mut coll = collective.then(|| {
            let mut c = collective_of(t, node, &name, &groups);
            c.seq = comms_seq(g, i);
            c
        });
        b.group = coll.as_ref().map_or(0, |c| c.group);
        match &schema {
            None => {
                problem = Some(if collective {
                    "collective without an op schema".into()
                } else if t.op_schema_str(node).is_some() {
                    "the trace's op schema does not parse".into()
                } else {
                    "no op schema in the trace".into()
                })
            }
            Some(s) => {
                op = Some(b.op_ref(s, t.op_schema_str(node).unwrap_or_default()));
                // Externals made so far: those an argument adds are first read by this op.
                let mut external_count = b.externals.len();
                for (k, sa) in s.args.iter().enumerate() {
                    match inputs.get(k) {
                        Some(a) => match build_arg(&mut b, step, &sa.ty, a) {
                            Ok(arg) => {
                                let first_read_here = external_count..b.externals.len();
                                external_count = b.externals.len();
                                if needs_nonnegative(&name, sa.name.as_deref()) {
                                    for s in arg.slots() {
                                        b.mark_nonnegative(s);
                                    }
                                }
                                if let (Some(n), Arg::Tensor(slot)) = (&sa.name, &arg) {
                                    if let Some(fill) =
                                        consumer_fill(&name, n, inputs, t.outputs(node), t, s)
                                    {
                                        if let Some(e) = b.external_of(*slot) {
                                            let ext = &b.externals[e].1;
                                            if ext.dtype.is_integral()
                                                || matches!(
                                                    fill,
                                                    Fill::Value(_)
                                                        | Fill::Probability
                                                        | Fill::Sorted(_)
                                                )
                                            {
                                                b.externals[e].2 = fill;
                                            }
                                        }
                                    }
                                }
                                let in_step = || {
                                    g.ancestors(i).any(|a| {
                                        t.name(&t.nodes[a as usize]).starts_with("Optimizer.step")
                                    })
                                };
                                // A decay an optimizer multiplies its state by in place
                                // (`buf.mul_(momentum)`, `exp_avg_sq.mul_(beta2)`), passed as a
                                // Python number: a wrapped 0-dim double whose value neither the
                                // trace nor Kineto records. Chosen once the whole plan is built
                                // (`optimizer_decays`).
                                if let (true, Some("other"), Arg::Tensor(slot)) =
                                    (name == "aten::mul_", sa.name.as_deref(), &arg)
                                {
                                    if let Some(e) = b.external_of(*slot) {
                                        let ext = &b.externals[e];
                                        if ext.1.shape.is_empty()
                                            && ext.1.dtype == DType::Float64
                                            && ext.2 == Fill::Value(1.0)
                                            && in_step()
                                        {
                                            decays.push((step, e));
                                        }
                                    }
                                }
                                if !first_read_here.is_empty() && in_step() {
                                    optimizer_state(&mut b.externals[first_read_here]);
                                }
                                let arg = match restore_rounded(&name, sa, arg, in_step) {
                                    (arg, Some((value, why))) => {
                                        restored.push(Restored {
                                            step,
                                            arg: sa.name.clone().unwrap_or_else(|| k.to_string()),
                                            value,
                                            why,
                                        });
                                        arg
                                    }
                                    (arg, None) => arg,
                                };
                                args.push(arg);
                            }
                            Err(e) => {
                                problem.get_or_insert(format!(
                                    "argument {k} ({}): {e}",
                                    sa.name.as_deref().unwrap_or("?")
                                ));
                            }
                        },
                        None if sa.default.is_some() => args.push(Arg::Default(k)),
                        None => {
                            problem.get_or_insert(format!(
                                "the trace records {} inputs, the schema needs argument {k}",
                                inputs.len()
                            ));
                        }
                    }
                }
                for a in inputs {
                    for (v, _) in arg_tensors(t, a) {
                        if let Some(key) = key_of(t, v) {
                            if let Some(&s) = b.current.get(&key) {
                                input_keys.push((key, s));
                            }
                        }
                    }
                }
            }
        }
        // Outputs: each trace output value becomes a new slot (a new version of its key).
        let mut outs = Vec::new();
        let mut out_specs = Vec::new();
        let mut passthrough = Vec::new();
        for a in t.outputs(node) {
            let ts = arg_tensors(t, a);
            let is_list = matches!(a.value, Value::List { .. });
            let mut slots = Vec::new();
            for (v, spec) in ts {
                let Some(key) = key_of(t, v) else {
                    slots.push(None);
                    continue;
                };
                let s = b.new_slot(step, spec.as_ref().map(|sp| (sp.shape.clone(), sp.dtype)));
                if let Some(&(_, prev)) = input_keys.iter().find(|(k, _)| *k == key) {
                    passthrough.push((prev, s));
                    b.written_over.insert(s, prev);
                }
                b.current.insert(key, s);
                if let (Some(r), Some(spec)) = (storage_region(t, v), &spec) {
                    b.by_storage.insert(r, (s, spec.strides.clone()));
                }
                if let Some(spec) = spec {
                    out_specs.push((s, spec));
                }
                slots.push(Some(s));
            }
            outs.push(match (is_list, slots.as_slice()) {
                (false, [Some(s)]) => Out::Tensor(*s),
                (false, _) => Out::Ignore,
                (true, _) => Out::List(slots),
            });
        }
        // A copy has its source's values: a consumer's constraint on them reaches the external
        // input they were copied from (lengths made int64 by `to` before `pack_padded_sequence`).
        // So has a view of all its input's elements (`unsqueeze`, `view`, `t`: the schema's
        // first return aliases its first argument, not written), whatever its shape: the norm
        // `triplet_margin_loss` saved reaches `NormBackward1`'s divisor through an `unsqueeze`.
        // Not a view of some elements (`select`, `expand`): a fill made for the view's shape
        // (offsets, lengths) would not fit the input's.
        if let (Some(Arg::Tensor(src)), Some(Out::Tensor(out))) = (args.first(), outs.first()) {
            let copy = matches!(
                name.as_str(),
                "aten::to" | "aten::_to_copy" | "aten::clone" | "aten::contiguous" | "aten::detach"
            );
            let whole_view = || {
                let numel = |slot: Slot| {
                    b.slot_meta[slot as usize]
                        .as_ref()
                        .map(|(shape, _)| shape.iter().product::<i64>())
                };
                schema.as_deref().is_some_and(returns_view_of_first)
                    && matches!((numel(*src), numel(*out)), (Some(a), Some(n)) if a == n)
            };
            if copy || whole_view() {
                b.written_over.entry(*out).or_insert(*src);
            }
        }
        let autograd = node.seq_id.is_some_and(|s| s >= 0) && !collective;
        // Its inputs required grad only if it made a graph node: under grad mode every op
        // records the sequence number, a node takes it. A float input that did not (a batch
        // through `torch.relu` under grad mode, no parameter in sight) made to require grad
        // had the replay build graph nodes the original did not: 1.5 µs more in each such op
        // of 16 floats.
        let made_node = graph_nodes.made(g, i);
        if let (true, true, Some(s)) = (autograd, made_node, &schema) {
            for (a, sa) in args.iter().zip(&s.args) {
                // Buffers a module updates without autograd (batch norm's running statistics).
                if matches!(
                    sa.name.as_deref(),
                    Some("running_mean" | "running_var" | "num_batches_tracked")
                ) {
                    continue;
                }
                for s in a.slots() {
                    if b.is_float_external(s) {
                        grad_inputs.insert(s);
                    }
                }
            }
        }
        // A view's output (the schema's first return aliases the first argument, not
        // written: `split`, `t`, `transpose`, `expand`) has its input's root; a weight or bias
        // argument names its root as the model's parameter.
        if let (Some(sch), Some(first)) = (&schema, args.first()) {
            if let ([src], true) = (first.slots().as_slice(), returns_view_of_first(sch)) {
                let root = view_root.get(src).copied().unwrap_or(*src);
                let views: Vec<Slot> = match outs.first() {
                    Some(Out::Tensor(s)) => vec![*s],
                    Some(Out::List(v)) => v.iter().flatten().copied().collect(),
                    _ => Vec::new(),
                };
                for s in views {
                    view_root.insert(s, root);
                }
            }
            for (a, sa) in args.iter().zip(&sch.args) {
                if sa.name.as_deref().is_some_and(is_weight_like) {
                    for s in a.slots() {
                        let root = view_root.get(&s).copied().unwrap_or(s);
                        if b.is_float_external(root) {
                            weight_like.insert(root);
                        }
                    }
                }
            }
        }
        let kind = match coll.take() {
            Some(mut c) => {
                c.bytes = t
                    .inputs(node)
                    .iter()
                    .flat_map(|a| arg_tensors(t, a))
                    .filter_map(|(_, spec)| spec)
                    .map(|s| {
                        s.shape.iter().product::<i64>().max(0) as u64 * s.dtype.size_bytes() as u64
                    })
                    .sum();
                StepKind::Collective(Box::new(c))
            }
            None => StepKind::Compute,
        };
        steps.push(Step {
            node: i,
            id: node.id,
            name,
            kind,
            op,
            problem,
            args,
            outs,
            out_specs,
            frees: Vec::new(),
            passthrough,
            autograd,
            autocast: None,
            views: std::mem::take(&mut b.views),
        });
    }
    // An inference trace (no op recorded a graph node) still ran on a model whose parameters
    // require grad (`nn.Parameter` under `torch.no_grad()`), and kernels read that flag:
    // `matmul` folds a batched input into one `mm` when an operand requires grad, and runs a
    // `bmm` otherwise (attention pooling's key projection, a [24, 4, 64] input with a split of
    // `in_proj_weight`: 19 us folded, 41-54 us as a bmm, called alone). The replay runs those
    // steps with grad mode off, so the flag builds no graph.
    if !steps.iter().any(|s| s.autograd) {
        grad_inputs.extend(weight_like);
    }
    link_waits(&mut steps);
    optimizer_decays(&steps, &decays, &mut b.externals);
    // Frees at last use, except external inputs, which persist across iterations (parameters
    // and optimizer state carry their in-place updates into the next iteration).
    let n = steps.len();
    for (slot, &last) in b.last_use.iter().enumerate() {
        if !b.external_index.contains_key(&(slot as u32)) && last < n {
            steps[last].frees.push(slot as u32);
        }
    }
    let mut plan = Plan {
        restored,
        version: Plan::VERSION,
        source: t.source.clone(),
        ops: b.ops.into_iter().collect(),
        steps,
        n_slots: b.n_slots as usize,
        externals: b.externals,
        grad_inputs: grad_inputs.into_iter().collect(),
        groups,
    };
    let dtypes: Vec<Option<et_schema::DType>> = plan
        .slot_specs()
        .iter()
        .map(|s| s.map(|s| s.dtype))
        .collect();
    for step in &mut plan.steps {
        step.autocast = autocast_of(step, &dtypes);
    }
    plan
}

/// A scalar argument the trace recorded as 0 and the replay restored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Restored {
    pub step: usize,
    /// The schema's name for the argument (or its position).
    pub arg: String,
    #[serde(with = "float")]
    pub value: f64,
    pub why: String,
}

/// PyTorch's optimizers' default epsilon (Adam, AdamW, RMSprop, NAdam, RAdam).
const OPTIMIZER_EPS: f64 = 1e-8;

/// The execution trace observer writes doubles with six decimals, so a scalar below 5e-7
/// arrives as 0: an optimizer's `eps=1e-8` among them (AdamW then divides 0 by 0 where a second
/// moment is 0). A recorded 0 is restored where it cannot have been meant:
/// - an argument named `eps`: to its schema default when that too is below 5e-7, else to the
///   optimizers' default 1e-8 (a recorded 0 says the value was below 5e-7);
/// - an argument whose schema default is itself below 5e-7 but non-zero (it would have been
///   written as 0 too);
/// - the scalar of an `add`/`_foreach_add` inside `Optimizer.step` (the optimizer adding its
///   eps to the denominator: adding 0 is no work a model asks for).
///
/// Returns the argument and, when restored, the value and why.
pub fn restore_rounded(
    op: &str,
    sa: &et_schema::SchemaArg,
    arg: Arg,
    in_optimizer_step: impl Fn() -> bool,
) -> (Arg, Option<(f64, String)>) {
    let zero = matches!(arg, Arg::Double(v) | Arg::ScalarDouble(v) if v == 0.0);
    if !zero {
        return (arg, None);
    }
    let default = sa
        .default
        .as_deref()
        .and_then(|d| d.parse::<f64>().ok())
        .filter(|d| *d != 0.0 && d.is_finite());
    let name = sa.name.as_deref().unwrap_or("");
    let value = if name == "eps" || name == "epsilon" {
        // A recorded 0 says the value was below 5e-7: the default only if it is too (a norm's
        // 1e-5 it cannot have been; BERT's layer_norm eps is 1e-12).
        let small_default = default.filter(|d| d.abs() < 5e-7);
        Some((
            small_default.unwrap_or(OPTIMIZER_EPS),
            format!(
                "`{name}` recorded as 0 (the trace keeps 6 decimals, so it was below 5e-7); restored to {}",
                if small_default.is_some() {
                    "its schema default"
                } else {
                    "1e-8"
                }
            ),
        ))
    } else if let Some(d) = default.filter(|d| d.abs() < 5e-7) {
        Some((
            d,
            format!("`{name}` recorded as 0, its default {d:e} rounds to 0 in the trace"),
        ))
    } else if matches!(
        op,
        "aten::_foreach_add_" | "aten::_foreach_add" | "aten::add_" | "aten::add"
    ) && matches!(name, "scalar" | "other")
        && in_optimizer_step()
    {
        Some((
            OPTIMIZER_EPS,
            "an optimizer step adds 0 (its eps, rounded to 0 in the trace); restored to 1e-8"
                .to_string(),
        ))
    } else {
        None
    };
    match value {
        Some((v, why)) => {
            let arg = match arg {
                Arg::Double(_) => Arg::Double(v),
                _ => Arg::ScalarDouble(v),
            };
            (arg, Some((v, why)))
        }
        None => (arg, None),
    }
}

/// Ops whose output dtype differs from their inputs' by their own doing (casts, explicit dtype
/// arguments), never a sign of autocast.
const CASTS: &[&str] = &[
    "aten::to",
    "aten::_to_copy",
    "aten::type_as",
    "aten::copy_",
    "aten::_autocast_to_reduced_precision",
    "aten::_autocast_to_full_precision",
    "aten::view",
    "aten::empty_like",
    "aten::zeros_like",
    "aten::ones_like",
    "aten::full_like",
    "aten::rand_like",
    "aten::randn_like",
];

/// The autocast dtype a step ran under in the original, read off the dtypes the trace recorded:
/// a float32 input with only half-precision outputs (autocast's lower-precision ops: linear,
/// matmul, conv), half-precision inputs with only float32 outputs and no float32 input
/// (autocast's float32 ops: softmax, losses), or float32 and half inputs together with a half
/// output (an op that could not take mixed inputs outside autocast). Autocast only changes the
/// ops on its lists, so a step wrongly marked runs as it would have anyway.
pub fn autocast_of(step: &Step, dtypes: &[Option<et_schema::DType>]) -> Option<et_schema::DType> {
    use et_schema::DType;
    if step.op.is_none() || CASTS.contains(&step.name.as_str()) {
        return None;
    }
    let half = |d: &DType| matches!(d, DType::BFloat16 | DType::Float16);
    let mut ins: Vec<DType> = step
        .args
        .iter()
        .flat_map(Arg::slots)
        .filter_map(|s| dtypes.get(s as usize).copied().flatten())
        .filter(|d| d.is_floating_point())
        .collect();
    ins.sort_by_key(|d| *d as u8);
    ins.dedup();
    let mut outs: Vec<DType> = step
        .out_specs
        .iter()
        .map(|(_, s)| s.dtype)
        .filter(|d| d.is_floating_point())
        .collect();
    outs.sort_by_key(|d| *d as u8);
    outs.dedup();
    let f32_in = ins.contains(&DType::Float32);
    let half_in = ins.iter().find(|d| half(d)).copied();
    let half_out = outs.iter().find(|d| half(d)).copied();
    let only_f32_out = !outs.is_empty() && outs.iter().all(|d| *d == DType::Float32);
    match (f32_in, half_in, half_out) {
        // float32 in, half out (and that half type not among the inputs)
        (true, None, Some(h)) if outs.iter().all(half) => Some(h),
        // float32 and half in, half out
        (true, Some(h), Some(o)) if h == o => Some(h),
        // half in, float32 out (autocast's float32 list: norms, losses); with float32 inputs too
        // (a norm's float32 weight), since outside autocast mixed inputs promote only where
        // autocast would leave them alone
        (_, Some(h), None) if only_f32_out => Some(h),
        _ => None,
    }
}

/// The process groups a trace created: the `## process_group:init ##` record's JSON list (the
/// world first), or the world alone.
pub fn process_groups(t: &Trace) -> Vec<GroupSpec> {
    #[derive(Deserialize)]
    struct Init {
        #[serde(default)]
        pg_name: String,
        #[serde(default)]
        pg_desc: String,
        #[serde(default)]
        backend_config: String,
        #[serde(default)]
        ranks: Vec<i64>,
        #[serde(default)]
        group_size: i64,
    }
    let world = GroupSpec {
        name: "0".into(),
        desc: "default_pg".into(),
        ..Default::default()
    };
    let Some(init) = t
        .nodes
        .iter()
        .find(|n| t.name(n) == "## process_group:init ##")
    else {
        // No record of the groups (older schemas): the backend shows in its annotations.
        let backend = ["nccl", "gloo"].into_iter().find(|b| {
            t.nodes
                .iter()
                .any(|n| t.name(n).starts_with(&format!("{b}:")))
        });
        return vec![GroupSpec {
            backend: backend.unwrap_or_default().into(),
            ..world
        }];
    };
    let text = t.inputs(init).first().and_then(|a| match a.value {
        Value::Str(s) => Some(t.str(s)),
        _ => None,
    });
    let Some(list) = text.and_then(|x| serde_json::from_str::<Vec<Init>>(x).ok()) else {
        return vec![world];
    };
    let mut out = vec![world];
    for g in list {
        let spec = GroupSpec {
            name: g.pg_name,
            desc: g.pg_desc,
            ranks: g.ranks,
            size: g.group_size,
            backend: g.backend_config,
        };
        // The default group is the world: every rank, whatever its ranks list says.
        if spec.desc == "default_pg" || (spec.name == "0" && spec.ranks.is_empty()) {
            out[0] = GroupSpec {
                ranks: Vec::new(),
                ..spec
            };
        } else {
            out.push(spec);
        }
    }
    out
}

/// A collective's recorded attributes (names as `record_param_comms` writes them).
/// The sequence number of the `record_param_comms` record at node `i` or among its children:
/// a collective's record holds its tensors then the number; a `wait` record the number first.
fn comms_seq(g: &Graph, i: u32) -> Option<i64> {
    let t = g.trace;
    let record = std::iter::once(i)
        .chain(g.children(i).iter().copied())
        .find(|&k| t.name(&t.nodes[k as usize]) == "record_param_comms")?;
    let inputs = t.inputs(&t.nodes[record as usize]);
    let int = |k: usize| match inputs.get(k)?.value {
        Value::Int(v) => Some(v),
        _ => None,
    };
    let is_wait = et_graph::summary::collective_name(t, &t.nodes[record as usize])
        .is_some_and(|n| n == "wait");
    if is_wait {
        int(0)
    } else {
        int(1)
    }
}

fn collective_of(
    t: &Trace,
    node: &et_schema::Node,
    name: &str,
    groups: &[GroupSpec],
) -> Collective {
    let mut c = Collective {
        name: et_graph::summary::collective_name(t, node).unwrap_or_else(|| name.to_string()),
        ..Default::default()
    };
    for e in t.extras(node) {
        let v = e.value;
        let int = || match v {
            Value::Int(i) => Some(i),
            _ => None,
        };
        let text = || match v {
            Value::Str(s) => Some(t.str(s).to_string()),
            _ => None,
        };
        match t.str(e.name) {
            "pg_name" => c.pg_name = text(),
            "pg_desc" => c.pg_desc = text(),
            "pg_size" => c.pg_size = int(),
            "global_rank_start" => c.global_rank_start = int(),
            "global_rank_stride" => c.global_rank_stride = int(),
            "in_msg_nelems" => c.in_msg_nelems = int(),
            "out_msg_nelems" => c.out_msg_nelems = int(),
            "in_split_size" => c.in_split_size = t.int_list(v).unwrap_or_default(),
            "out_split_size" => c.out_split_size = t.int_list(v).unwrap_or_default(),
            "dtype" => c.dtype = text(),
            _ => {}
        }
    }
    if let Some(pg) = &c.pg_name {
        if let Some(k) = groups.iter().position(|g| &g.name == pg) {
            c.group = k as u32;
        }
    }
    c
}

/// Later steps that wait on a collective (`c10d::wait`, `_wait_tensor`, ...) and read one of its
/// outputs: the waits that go with it.
fn link_waits(steps: &mut [Step]) {
    let mut produced_by: HashMap<Slot, usize> = HashMap::new();
    let mut waits: Vec<(usize, usize)> = Vec::new();
    // PARAM-style `record_param_comms` waits name the collective by sequence number.
    let mut by_seq: HashMap<i64, usize> = HashMap::new();
    for (k, s) in steps.iter().enumerate() {
        if let StepKind::Collective(c) = &s.kind {
            if let Some(seq) = c.seq {
                if c.name == "wait" {
                    if let Some(&from) = by_seq.get(&seq) {
                        waits.push((from, k));
                    }
                } else {
                    by_seq.insert(seq, k);
                }
            }
        }
        if s.name.contains("wait") {
            let from = s
                .args
                .iter()
                .flat_map(Arg::slots)
                .find_map(|x| produced_by.get(&x));
            if let Some(&c) = from {
                waits.push((c, k));
            }
        }
        if s.kind.is_collective() {
            for (slot, _) in &s.out_specs {
                produced_by.insert(*slot, k);
            }
            for o in &s.outs {
                if let Out::Tensor(x) = o {
                    produced_by.insert(*x, k);
                }
            }
        }
    }
    for (c, k) in waits {
        if let StepKind::Collective(col) = &mut steps[c].kind {
            col.waits.push(k);
        }
    }
}

/// The plan is pure data: these tests build plans from hand-written traces and check slots,
/// fills, frees and pass-throughs without a libtorch call.
#[cfg(test)]
mod tests {
    use super::*;
    use et_schema::testkit::{tensor, TraceBuilder};
    use serde_json::json;

    #[test]
    fn scalars_the_trace_rounded_to_zero_are_restored_only_where_zero_cannot_be_meant() {
        let arg =
            |schema: &str, k: usize| et_schema::OpSchema::parse(schema).unwrap().args[k].clone();
        let ln = "aten::layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, Tensor? bias=None, float eps=1e-05, bool cudnn_enable=True) -> Tensor";
        let fused = "aten::_fused_adamw_(Tensor(a!)[] self, Tensor(b!)[] grads, Tensor(c!)[] exp_avgs, Tensor(d!)[] exp_avg_sqs, Tensor(e!)[] max_exp_avg_sqs, Tensor[] state_steps, *, float lr, float beta1, float beta2, float weight_decay, float eps, bool amsgrad, bool maximize, Tensor? grad_scale=None, Tensor? found_inf=None) -> ()";
        let fadd = "aten::_foreach_add_.Scalar(Tensor(a!)[] self, Scalar scalar) -> ()";
        let dropout = "aten::dropout(Tensor input, float p, bool train) -> Tensor";
        let yes = || true;
        let no = || false;
        // eps recorded 0 was below 5e-7: not the default 1e-5, the optimizers' 1e-8.
        let (a, r) = restore_rounded("aten::layer_norm", &arg(ln, 4), Arg::Double(0.0), no);
        assert_eq!((a, r.map(|r| r.0)), (Arg::Double(1e-8), Some(1e-8)));
        let (a, r) = restore_rounded("aten::_fused_adamw_", &arg(fused, 10), Arg::Double(0.0), no);
        assert_eq!((a, r.is_some()), (Arg::Double(1e-8), true));
        // The optimizer's eps added to a denominator, inside Optimizer.step only.
        let (a, r) = restore_rounded(
            "aten::_foreach_add_",
            &arg(fadd, 1),
            Arg::ScalarDouble(0.0),
            yes,
        );
        assert_eq!((a, r.is_some()), (Arg::ScalarDouble(1e-8), true));
        let (a, r) = restore_rounded(
            "aten::_foreach_add_",
            &arg(fadd, 1),
            Arg::ScalarDouble(0.0),
            no,
        );
        assert_eq!((a, r), (Arg::ScalarDouble(0.0), None));
        // A 0 that means 0 stays (dropout p=0), and so does any non-zero value.
        let (a, r) = restore_rounded("aten::dropout", &arg(dropout, 1), Arg::Double(0.0), yes);
        assert_eq!((a, r), (Arg::Double(0.0), None));
        let (a, r) = restore_rounded("aten::layer_norm", &arg(ln, 4), Arg::Double(1e-3), no);
        assert_eq!((a, r), (Arg::Double(1e-3), None));
    }

    const ADD: &str = "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor";
    const ADD_: &str =
        "aten::add_.Tensor(Tensor(a!) self, Tensor other, *, Scalar alpha=1) -> Tensor(a!)";

    fn f32(id: u64, storage: u64, numel: u64) -> serde_json::Value {
        tensor(id, storage, 0, numel, 4, "cpu")
    }

    /// Appends `x + y -> out` on float32 vectors of `n` (each tensor on its own storage, of
    /// the same id).
    fn add_1d(b: &mut TraceBuilder, x: u64, y: u64, out: u64, n: u64) {
        b.op("aten::add", ADD)
            .input(f32(x, x, n), json!([n]), "Tensor(float)")
            .input(f32(y, y, n), json!([n]), "Tensor(float)")
            .input(json!(1), json!([]), "Int")
            .output(f32(out, out, n), json!([n]), "Tensor(float)")
            .done();
    }

    /// The fill of the external that argument `arg` of step `step` reads (it must read one).
    fn fill_of(p: &Plan, step: usize, arg: usize) -> Fill {
        let Arg::Tensor(s) = p.steps[step].args[arg] else {
            panic!(
                "argument {arg} of step {step} is not a tensor: {:?}",
                p.steps[step].args
            )
        };
        p.externals
            .iter()
            .find(|e| e.0 == s)
            .unwrap_or_else(|| panic!("argument {arg} of step {step} is not an external"))
            .2
            .clone()
    }

    fn plan_of(b: &TraceBuilder) -> Plan {
        let t = b.build();
        let g = Graph::new(&t);
        compile(&g, &g.replay_set(None))
    }

    /// x (external) + y (external) -> z; z + y -> w: two externals, z freed after its last use,
    /// w after the step that makes it (nothing reads it).
    #[test]
    fn slots_externals_and_frees_follow_the_data() {
        let mut b = TraceBuilder::new();
        add_1d(&mut b, 1, 2, 3, 4);
        add_1d(&mut b, 3, 2, 4, 4);
        let p = plan_of(&b);
        assert_eq!(p.steps.len(), 2);
        assert_eq!(p.externals.len(), 2, "{:?}", p.externals);
        let ext: Vec<Slot> = p.externals.iter().map(|e| e.0).collect();
        let (x, y) = (ext[0], ext[1]);
        let Out::Tensor(z) = p.steps[0].outs[0] else {
            panic!("{:?}", p.steps[0].outs)
        };
        assert_eq!(
            p.steps[0].args,
            vec![Arg::Tensor(x), Arg::Tensor(y), Arg::ScalarInt(1)]
        );
        assert_eq!(p.steps[1].args[0], Arg::Tensor(z));
        assert_eq!(
            p.steps[1].args[1],
            Arg::Tensor(y),
            "y is read again, same slot"
        );
        // Intermediates are freed at their last use; externals never are.
        assert!(p.steps[1].frees.contains(&z));
        assert!(p
            .steps
            .iter()
            .all(|s| !s.frees.contains(&x) && !s.frees.contains(&y)));
        assert_eq!(p.n_slots, 4);
        assert_eq!(p.ops.len(), 1, "one distinct operator");
        assert_eq!(p.steps[0].op, Some(0));
        assert_eq!(p.ops[0].overload, "Tensor");
        assert!(p.steps.iter().all(|s| s.problem.is_none()));
    }

    /// An in-place op's output is a new version of its input (passed through when the step is
    /// skipped), and `sqrt` reading it makes the external it started from non-negative.
    #[test]
    fn in_place_chains_pass_through_and_mark_non_negative_inputs() {
        let mut b = TraceBuilder::new();
        b.op("aten::add_", ADD_)
            .input(f32(1, 1, 8), json!([8]), "Tensor(float)")
            .input(f32(2, 2, 8), json!([8]), "Tensor(float)")
            .input(json!(1), json!([]), "Int")
            .output(f32(1, 1, 8), json!([8]), "Tensor(float)")
            .done();
        b.op("aten::sqrt", "aten::sqrt(Tensor self) -> Tensor")
            .input(f32(1, 1, 8), json!([8]), "Tensor(float)")
            .output(f32(3, 3, 8), json!([8]), "Tensor(float)")
            .done();
        let p = plan_of(&b);
        let Arg::Tensor(first) = p.steps[0].args[0] else {
            panic!()
        };
        let Out::Tensor(written) = p.steps[0].outs[0] else {
            panic!()
        };
        assert_eq!(p.steps[0].passthrough, vec![(first, written)]);
        assert_eq!(p.steps[1].args[0], Arg::Tensor(written));
        assert_eq!(fill_of(&p, 0, 0), Fill::NonNegative);
        assert_eq!(fill_of(&p, 0, 1), Fill::Random);
    }

    /// Tensors an optimizer's step reads first are its state, made as zeros like torch makes
    /// it; the parameters it updates (read first by the forward) stay random, and so do the
    /// tensors read first outside a step.
    #[test]
    fn optimizer_state_starts_at_zero() {
        let sqrt = "aten::sqrt(Tensor self) -> Tensor";
        let mut b = TraceBuilder::new();
        // Forward: the parameter (1) and another input (2).
        add_1d(&mut b, 1, 2, 3, 8);
        b.node("Optimizer.step#Adagrad.step").done();
        let step = b.last_id();
        // The state (4) is first read in the step; the parameter is read again there.
        b.op("aten::sqrt", sqrt)
            .parent(step)
            .input(f32(4, 4, 8), json!([8]), "Tensor(float)")
            .output(f32(5, 5, 8), json!([8]), "Tensor(float)")
            .done();
        b.op("aten::add_", ADD_)
            .parent(step)
            .input(f32(1, 1, 8), json!([8]), "Tensor(float)")
            .input(f32(5, 5, 8), json!([8]), "Tensor(float)")
            .input(json!(1), json!([]), "Int")
            .output(f32(1, 1, 8), json!([8]), "Tensor(float)")
            .done();
        // Outside a step, a sqrt's first read stays non-negative random.
        b.op("aten::sqrt", sqrt)
            .input(f32(6, 6, 8), json!([8]), "Tensor(float)")
            .output(f32(7, 7, 8), json!([8]), "Tensor(float)")
            .done();
        let p = plan_of(&b);
        let names: Vec<&str> = p.steps.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            ["aten::add", "aten::sqrt", "aten::add_", "aten::sqrt"]
        );
        assert_eq!(fill_of(&p, 0, 0), Fill::Random, "the parameter");
        assert_eq!(fill_of(&p, 1, 0), Fill::Zeros, "the optimizer's state");
        assert_eq!(fill_of(&p, 3, 0), Fill::NonNegative, "outside a step");
    }

    /// Integer inputs are filled for their consumer: embedding indices below the table size.
    #[test]
    fn embedding_indices_are_bounded_by_the_table() {
        let mut b = TraceBuilder::new();
        b.op(
            "aten::embedding",
            "aten::embedding(Tensor weight, Tensor indices, SymInt padding_idx=-1, bool scale_grad_by_freq=False, bool sparse=False) -> Tensor",
        )
        .input(f32(1, 1, 70), json!([10, 7]), "Tensor(float)")
        .input(tensor(2, 2, 0, 5, 8, "cpu"), json!([5]), "Tensor(long int)")
        .input(json!(-1), json!([]), "Int")
        .input(json!(false), json!([]), "Bool")
        .input(json!(false), json!([]), "Bool")
        .output(f32(3, 3, 35), json!([5, 7]), "Tensor(float)")
        .done();
        let p = plan_of(&b);
        let idx = p
            .externals
            .iter()
            .find(|e| e.1.dtype == DType::Int64)
            .unwrap();
        assert_eq!(idx.2, Fill::Indices(10));
        assert_eq!(idx.1.shape, vec![5]);
    }

    /// Bucket boundaries are filled sorted (random ones made indices the original's data
    /// never did), and the values bucketized stay random.
    #[test]
    fn bucket_boundaries_are_sorted() {
        let mut b = TraceBuilder::new();
        b.op(
            "aten::bucketize",
            "aten::bucketize.Tensor(Tensor self, Tensor boundaries, *, bool out_int32=False, bool right=False) -> Tensor",
        )
        .input(f32(1, 1, 64), json!([64]), "Tensor(float)")
        .input(f32(2, 2, 17), json!([17]), "Tensor(float)")
        .input(json!(false), json!([]), "Bool")
        .input(json!(false), json!([]), "Bool")
        .output(tensor(3, 3, 0, 64, 8, "cpu"), json!([64]), "Tensor(long int)")
        .done();
        let p = plan_of(&b);
        assert_eq!(fill_of(&p, 0, 0), Fill::Random, "the values");
        assert_eq!(fill_of(&p, 0, 1), Fill::Sorted(8.0), "the boundaries");
    }

    /// What a normalisation's backward reads of the forward's statistics, which no replayed op
    /// made (they were saved inside the composite): those of normalised activations, mean 0
    /// and rstd 1, not random values whose sign and size scale every gradient through it. The
    /// gradient and the input stay random.
    #[test]
    fn a_norms_saved_statistics_are_those_of_normalised_activations() {
        let mut b = TraceBuilder::new();
        b.op(
            "aten::native_layer_norm_backward",
            "aten::native_layer_norm_backward(Tensor grad_out, Tensor input, SymInt[] normalized_shape, Tensor mean, Tensor rstd, Tensor? weight, Tensor? bias, bool[3] output_mask) -> (Tensor, Tensor, Tensor)",
        )
        .input(f32(1, 1, 32), json!([4, 8]), "Tensor(float)")
        .input(f32(2, 2, 32), json!([4, 8]), "Tensor(float)")
        .input(json!([8]), json!([[]]), "GenericList[Int]")
        .input(f32(3, 3, 4), json!([4, 1]), "Tensor(float)")
        .input(f32(4, 4, 4), json!([4, 1]), "Tensor(float)")
        .input(f32(5, 5, 8), json!([8]), "Tensor(float)")
        .input(f32(6, 6, 8), json!([8]), "Tensor(float)")
        .input(json!([true, true, true]), json!([[], [], []]), "GenericList[Bool,Bool,Bool]")
        .output(f32(7, 7, 32), json!([4, 8]), "Tensor(float)")
        .output(f32(8, 8, 8), json!([8]), "Tensor(float)")
        .output(f32(9, 9, 8), json!([8]), "Tensor(float)")
        .done();
        let p = plan_of(&b);
        assert!(p.steps[0].problem.is_none(), "{:?}", p.steps[0].problem);
        assert_eq!(fill_of(&p, 0, 0), Fill::Random, "the gradient");
        assert_eq!(fill_of(&p, 0, 1), Fill::Random, "the input");
        assert_eq!(fill_of(&p, 0, 3), Fill::Value(0.0), "the mean");
        assert_eq!(fill_of(&p, 0, 4), Fill::Value(1.0), "the rstd");
    }

    /// A tensor divisor no replayed op made is 1, not random values around zero.
    #[test]
    fn an_unmade_divisor_is_one() {
        let mut b = TraceBuilder::new();
        b.op(
            "aten::div",
            "aten::div.Tensor(Tensor self, Tensor other) -> Tensor",
        )
        .input(f32(1, 1, 32), json!([32]), "Tensor(float)")
        .input(f32(2, 2, 32), json!([32]), "Tensor(float)")
        .output(f32(3, 3, 32), json!([32]), "Tensor(float)")
        .done();
        let p = plan_of(&b);
        assert_eq!(fill_of(&p, 0, 0), Fill::Random, "the dividend");
        assert_eq!(fill_of(&p, 0, 1), Fill::Value(1.0), "the divisor");
    }

    /// A consumer's constraint reaches the external through a view of all its elements
    /// (`unsqueeze`, as `NormBackward1` divides by the saved norm), not through a view of
    /// some (`select`), where a fill made for the view's shape would not fit.
    #[test]
    fn a_divisor_reaches_its_external_through_a_whole_view() {
        const UNSQUEEZE: &str = "aten::unsqueeze(Tensor(a) self, int dim) -> Tensor(a)";
        const SELECT: &str = "aten::select.int(Tensor(a) self, int dim, SymInt index) -> Tensor(a)";
        const DIV: &str = "aten::div.Tensor(Tensor self, Tensor other) -> Tensor";
        let mut b = TraceBuilder::new();
        // The saved norm (external 1, 32 values) made [32, 1], the divisor of a [32, 32].
        b.op("aten::unsqueeze", UNSQUEEZE)
            .input(f32(1, 1, 32), json!([32]), "Tensor(float)")
            .input(json!(1), json!([]), "Int")
            .output(f32(2, 1, 32), json!([32, 1]), "Tensor(float)")
            .done();
        b.op("aten::div", DIV)
            .input(f32(3, 3, 1024), json!([32, 32]), "Tensor(float)")
            .input(f32(2, 1, 32), json!([32, 1]), "Tensor(float)")
            .output(f32(4, 4, 1024), json!([32, 32]), "Tensor(float)")
            .done();
        // A row of external 5 (8 x 4) as a divisor: the rest of it stays as it was.
        b.op("aten::select", SELECT)
            .input(f32(5, 5, 32), json!([8, 4]), "Tensor(float)")
            .input(json!(0), json!([]), "Int")
            .input(json!(0), json!([]), "Int")
            .output(f32(6, 5, 4), json!([4]), "Tensor(float)")
            .done();
        b.op("aten::div", DIV)
            .input(f32(7, 7, 4), json!([4]), "Tensor(float)")
            .input(f32(6, 5, 4), json!([4]), "Tensor(float)")
            .output(f32(8, 8, 4), json!([4]), "Tensor(float)")
            .done();
        let p = plan_of(&b);
        assert_eq!(
            fill_of(&p, 0, 0),
            Fill::Value(1.0),
            "the norm, through unsqueeze"
        );
        assert_eq!(fill_of(&p, 1, 0), Fill::Random, "the dividend");
        assert_eq!(
            fill_of(&p, 2, 0),
            Fill::Random,
            "the matrix a row of which divides"
        );
    }

    /// Sequence lengths reach `pack_padded_sequence` through a copy (`lengths.to(int64)`): the
    /// external they were copied from gets lengths that add up to the rows the trace's packed
    /// data holds, the longest as long as its batch sizes say.
    #[test]
    fn packed_sequence_lengths_fit_the_packed_data() {
        let mut b = TraceBuilder::new();
        b.op(
            "aten::to",
            "aten::to.dtype(Tensor(a) self, ScalarType dtype, bool non_blocking=False, bool copy=False, MemoryFormat? memory_format=None) -> Tensor(a)",
        )
        .input(tensor(1, 1, 0, 4, 8, "cpu"), json!([4]), "Tensor(long int)")
        .input(json!(4), json!([]), "Int")
        .input(json!(false), json!([]), "Bool")
        .input(json!(false), json!([]), "Bool")
        .output(tensor(2, 2, 0, 4, 8, "cpu"), json!([4]), "Tensor(long int)")
        .done();
        b.op(
            "aten::_pack_padded_sequence",
            "aten::_pack_padded_sequence(Tensor input, Tensor lengths, bool batch_first) -> (Tensor, Tensor)",
        )
        .input(f32(3, 3, 4 * 10 * 2), json!([4, 10, 2]), "Tensor(float)")
        .input(tensor(2, 2, 0, 4, 8, "cpu"), json!([4]), "Tensor(long int)")
        .input(json!(true), json!([]), "Bool")
        .output(f32(4, 4, 23 * 2), json!([23, 2]), "Tensor(float)")
        .output(tensor(5, 5, 0, 10, 8, "cpu"), json!([10]), "Tensor(long int)")
        .done();
        let p = plan_of(&b);
        let lengths = p
            .externals
            .iter()
            .find(|e| e.1.dtype == DType::Int64)
            .unwrap();
        assert_eq!(lengths.2, Fill::Ints(vec![10, 5, 4, 4]));
    }

    #[test]
    fn sequence_lengths_are_sorted_bounded_and_add_up() {
        for (n, total, longest) in [
            (8, 194, 40),
            (4, 23, 10),
            (3, 3, 1),
            (5, 200, 40),
            (1, 7, 7),
        ] {
            let v = sequence_lengths(n, total, longest);
            assert_eq!(v.len(), n as usize);
            assert_eq!(v[0], longest);
            assert!(v.windows(2).all(|w| w[0] >= w[1]), "{v:?}");
            assert!(v.iter().all(|&l| (1..=longest).contains(&l)), "{v:?}");
            assert_eq!(v.iter().sum::<i64>(), total, "{v:?}");
        }
        // More rows than the sequences can hold, or fewer than one each: clamped, never 0.
        assert_eq!(sequence_lengths(3, 100, 10), vec![10, 10, 10]);
        assert_eq!(sequence_lengths(3, 1, 10), vec![10, 1, 1]);
        assert!(sequence_lengths(0, 5, 5).is_empty());
    }

    /// Binary cross-entropy's target is a probability, not a class index.
    #[test]
    fn binary_cross_entropy_targets_are_probabilities() {
        let mut b = TraceBuilder::new();
        b.op(
            "aten::binary_cross_entropy",
            "aten::binary_cross_entropy(Tensor self, Tensor target, Tensor? weight=None, int reduction=Mean) -> Tensor",
        )
        .input(f32(1, 1, 8), json!([8]), "Tensor(float)")
        .input(f32(2, 2, 8), json!([8]), "Tensor(float)")
        .input(json!(null), json!([]), "None")
        .input(json!(1), json!([]), "Int")
        .output(f32(3, 3, 1), json!([]), "Tensor(float)")
        .done();
        let p = plan_of(&b);
        assert!(
            p.externals.iter().all(|e| e.2 == Fill::Probability),
            "{:?}",
            p.externals
        );
        // With logits: the target only (logits are any real).
        let mut b = TraceBuilder::new();
        b.op(
            "aten::binary_cross_entropy_with_logits",
            "aten::binary_cross_entropy_with_logits(Tensor self, Tensor target, Tensor? weight=None, Tensor? pos_weight=None, int reduction=Mean) -> Tensor",
        )
        .input(f32(1, 1, 8), json!([8]), "Tensor(float)")
        .input(f32(2, 2, 8), json!([8]), "Tensor(float)")
        .input(json!(null), json!([]), "None")
        .input(json!(null), json!([]), "None")
        .input(json!(1), json!([]), "Int")
        .output(f32(3, 3, 1), json!([]), "Tensor(float)")
        .done();
        let p = plan_of(&b);
        assert_ne!(fill_of(&p, 0, 0), Fill::Probability);
        assert_eq!(fill_of(&p, 0, 1), Fill::Probability);
    }

    /// Views of one storage are separate externals sharing the storage id, each with its own
    /// offset and extent.
    #[test]
    fn views_keep_their_storage_and_offset() {
        let mut b = TraceBuilder::new();
        b.op("aten::add", ADD)
            .input(tensor(1, 9, 0, 4, 4, "cpu"), json!([4]), "Tensor(float)")
            .input(tensor(2, 9, 4, 4, 4, "cpu"), json!([4]), "Tensor(float)")
            .input(json!(1), json!([]), "Int")
            .output(f32(3, 3, 4), json!([4]), "Tensor(float)")
            .done();
        let p = plan_of(&b);
        let specs: Vec<&TensorSpec> = p.externals.iter().map(|e| &e.1).collect();
        assert_eq!(specs.len(), 2);
        assert!(specs.iter().all(|s| s.storage == 9));
        assert_eq!((specs[0].offset, specs[1].offset), (0, 4));
        assert_eq!((specs[0].extent(), specs[1].extent()), (4, 8));
        assert_eq!(p.external_bytes(), 32, "one allocation of 8 floats");
    }

    /// Ops that cannot be planned carry their reason; the plan goes on around them.
    #[test]
    fn unplannable_ops_carry_a_reason() {
        let mut b = TraceBuilder::new();
        b.op("aten::x", "aten::x(Dimname d) -> Tensor")
            .input(json!("n"), json!([]), "String")
            .done();
        b.node("aten::no_schema_here").done();
        let p = plan_of(&b);
        assert!(p.steps[0]
            .problem
            .as_deref()
            .unwrap()
            .contains("not supported"));
        assert!(p.steps.iter().all(|s| s.kind == StepKind::Compute));
    }

    /// Collectives are their own kind, with the group and sizes the trace recorded; `--only`
    /// is decided by the kind.
    #[test]
    fn collectives_are_a_step_kind_with_their_group() {
        let mut b = TraceBuilder::new();
        b.op(
            "record_param_comms",
            "record_param_comms(Tensor[] input_tensors, int rank, str pg_name, str name) -> Tensor[]",
        )
        .input(json!([f32(1, 1, 4)]), json!([[4]]), "GenericList[Tensor(float)]")
        .input(json!(0), json!([]), "Int")
        .input(json!("0"), json!([]), "String")
        .input(json!("allreduce"), json!([]), "String")
        .output(json!([f32(1, 1, 4)]), json!([[4]]), "GenericList[Tensor(float)]")
        .attr("collective_name", "string", "allreduce")
        .attr("pg_name", "string", "0")
        .attr("pg_size", "uint64", 2)
        .attr("in_msg_nelems", "uint64", 4)
        .done();
        b.op("aten::relu", "aten::relu(Tensor self) -> Tensor")
            .input(f32(1, 1, 4), json!([4]), "Tensor(float)")
            .output(f32(2, 2, 4), json!([4]), "Tensor(float)")
            .done();
        let p = plan_of(&b);
        let StepKind::Collective(c) = &p.steps[0].kind else {
            panic!("{:?}", p.steps[0].kind)
        };
        assert_eq!(c.name, "allreduce");
        assert_eq!(c.pg_name.as_deref(), Some("0"));
        assert_eq!((c.pg_size, c.in_msg_nelems), (Some(2), Some(4)));
        assert!(!p.steps[0].autograd);
        assert_eq!(p.included(et_graph::Kind::All), 2);
        assert_eq!(p.included(et_graph::Kind::Compute), 1);
        assert_eq!(p.included(et_graph::Kind::Comm), 1);
    }

    /// Float inputs are made to require grad only for ops that made a graph node in the
    /// original: `relu` of a batch under grad mode records a sequence number but takes none (the
    /// next op records the same), a `linear` of a parameter takes one (its backward record
    /// carries it, or a later op records a larger one).
    #[test]
    fn only_ops_that_made_a_graph_node_get_inputs_that_require_grad() {
        let mut b = TraceBuilder::new();
        // relu(x) under grad mode, no input requiring grad: seq 7, and so is the next op's.
        b.op("aten::relu", "aten::relu(Tensor self) -> Tensor")
            .seq_id(7)
            .input(f32(1, 1, 4), json!([4]), "Tensor(float)")
            .output(f32(2, 2, 4), json!([4]), "Tensor(float)")
            .done();
        // mul(w, y): w required grad, a node took 7.
        b.op(
            "aten::mul",
            "aten::mul.Tensor(Tensor self, Tensor other) -> Tensor",
        )
        .seq_id(7)
        .input(f32(3, 3, 4), json!([4]), "Tensor(float)")
        .input(f32(2, 2, 4), json!([4]), "Tensor(float)")
        .output(f32(4, 4, 4), json!([4]), "Tensor(float)")
        .done();
        // add(z, c): the counter moved on (8) and a later op records 9.
        b.op(
            "aten::add",
            "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
        )
        .seq_id(8)
        .input(f32(4, 4, 4), json!([4]), "Tensor(float)")
        .input(f32(5, 5, 4), json!([4]), "Tensor(float)")
        .input(json!(1), json!([]), "Int")
        .output(f32(6, 6, 4), json!([4]), "Tensor(float)")
        .done();
        b.op("aten::neg", "aten::neg(Tensor self) -> Tensor")
            .seq_id(9)
            .input(f32(7, 7, 4), json!([4]), "Tensor(float)")
            .output(f32(8, 8, 4), json!([4]), "Tensor(float)")
            .done();
        // The backward record of mul's node carries 7; neg's (9) has none and nothing later.
        b.node("MulBackward0")
            .seq_id(7)
            .attr("fw_tid", "uint64", 1)
            .done();
        let p = plan_of(&b);
        assert!(
            p.steps.iter().all(|s| s.autograd),
            "all ran under grad mode"
        );
        // Inputs by step: relu's x (slot of tensor 1), mul's w (3), add's c (5), neg's (7).
        let input_slot = |step: usize, k: usize| p.steps[step].args[k].slots()[0];
        let x = input_slot(0, 0);
        let w = input_slot(1, 0);
        let c = input_slot(2, 1);
        let n = input_slot(3, 0);
        assert!(!p.grad_inputs.contains(&x), "relu's batch");
        assert!(p.grad_inputs.contains(&w), "mul's parameter");
        assert!(p.grad_inputs.contains(&c), "add's input: 8 < 9");
        assert!(
            !p.grad_inputs.contains(&n),
            "neg: nothing shows 9 was taken"
        );
    }

    /// A tensor autograd saved from an op's output reaches the backward under a new tensor id
    /// over the same storage: it is the output's slot, not a new external input (relu's mask,
    /// random, had made every backward through it a gradient of nothing). Another view of that
    /// storage (other strides) is a view of the slot (`t(weight)` saved inside `linear`).
    #[test]
    fn a_saved_output_under_a_new_tensor_id_is_the_output() {
        let mut b = TraceBuilder::new();
        b.op("aten::relu", "aten::relu(Tensor self) -> Tensor")
            .input(f32(1, 1, 4), json!([2, 2]), "Tensor(float)")
            .output(tensor(2, 9, 0, 4, 4, "cpu"), json!([2, 2]), "Tensor(float)")
            .done();
        b.op(
            "aten::threshold_backward",
            "aten::threshold_backward(Tensor grad_output, Tensor self, Scalar threshold) -> Tensor",
        )
        .input(f32(3, 3, 4), json!([2, 2]), "Tensor(float)")
        .input(tensor(7, 9, 0, 4, 4, "cpu"), json!([2, 2]), "Tensor(float)")
        .input(json!(0), json!([]), "Int")
        .output(f32(4, 4, 4), json!([2, 2]), "Tensor(float)")
        .done();
        // The same storage read transposed: a view of the output.
        b.op("aten::mm", "aten::mm(Tensor self, Tensor mat2) -> Tensor")
            .input_strided(
                tensor(8, 9, 0, 4, 4, "cpu"),
                json!([2, 2]),
                json!([1, 2]),
                "Tensor(float)",
            )
            .input(f32(5, 5, 4), json!([2, 2]), "Tensor(float)")
            .output(f32(6, 6, 4), json!([2, 2]), "Tensor(float)")
            .done();
        let p = plan_of(&b);
        let Out::Tensor(relu_out) = p.steps[0].outs[0] else {
            panic!("{:?}", p.steps[0].outs)
        };
        assert_eq!(p.steps[1].args[1], Arg::Tensor(relu_out));
        let Arg::Tensor(view) = p.steps[2].args[0] else {
            panic!("{:?}", p.steps[2].args)
        };
        assert_ne!(view, relu_out);
        assert!(!p.externals.iter().any(|e| e.0 == view));
        assert_eq!(p.steps[2].views.len(), 1);
        let v = &p.steps[2].views[0];
        assert_eq!((v.slot, v.base), (view, relu_out));
        assert_eq!(
            (v.spec.shape.as_slice(), v.spec.strides.as_slice()),
            (&[2, 2][..], &[1, 2][..])
        );
        // The output lives until the backward's last read of it, through the view too.
        assert!(!p.steps[0].frees.contains(&relu_out));
        assert!(!p.steps[1].frees.contains(&relu_out));
        assert!(p.steps[2].frees.contains(&relu_out));
        p.validate().unwrap();
        // A view reaching past its base's elements is not one: an external.
        let mut b = TraceBuilder::new();
        b.op("aten::relu", "aten::relu(Tensor self) -> Tensor")
            .input(f32(1, 1, 4), json!([2, 2]), "Tensor(float)")
            .output(tensor(2, 9, 0, 4, 4, "cpu"), json!([2, 2]), "Tensor(float)")
            .done();
        b.op("aten::mm", "aten::mm(Tensor self, Tensor mat2) -> Tensor")
            .input_strided(
                tensor(8, 9, 0, 4, 4, "cpu"),
                json!([2, 2]),
                json!([1, 4]),
                "Tensor(float)",
            )
            .input(f32(5, 5, 4), json!([2, 2]), "Tensor(float)")
            .output(f32(6, 6, 4), json!([2, 2]), "Tensor(float)")
            .done();
        let p = plan_of(&b);
        assert!(p.steps[1].views.is_empty());
        let Arg::Tensor(other) = p.steps[1].args[0] else {
            panic!("{:?}", p.steps[1].args)
        };
        assert!(p.externals.iter().any(|e| e.0 == other));
    }

    /// A plan survives serde unchanged (a benchmark package stores it).
    #[test]
    fn plans_round_trip_through_json() {
        let mut b = TraceBuilder::new();
        b.op("aten::add", ADD)
            .input(
                tensor(1, 1, 0, 4, 2, "cpu"),
                json!([4]),
                "Tensor(c10::BFloat16)",
            )
            .input(tensor(2, 2, 0, 1, 8, "cpu"), json!([]), "Tensor(double)")
            .input(json!(2.5), json!([]), "Double")
            .output(
                tensor(3, 3, 0, 4, 2, "cpu"),
                json!([4]),
                "Tensor(c10::BFloat16)",
            )
            .done();
        let mut p = plan_of(&b);
        // Non-finite doubles (attention masks fill with -inf) survive too.
        p.steps[0]
            .args
            .push(Arg::DoubleList(vec![f64::NEG_INFINITY, 1.0, f64::INFINITY]));
        p.steps[0].args.push(Arg::ScalarDouble(f64::NEG_INFINITY));
        let text = serde_json::to_string(&p).unwrap();
        let back: Plan = serde_json::from_str(&text).unwrap();
        assert_eq!(back, p);
        assert!(text.contains("c10::BFloat16"), "dtypes by name: {text}");
        assert_eq!(p.version, Plan::VERSION);
        back.validate().unwrap();
    }

    /// A stored plan whose indices point outside it, or of another format, is refused before
    /// anything runs it.
    #[test]
    fn damaged_plans_are_refused() {
        let mut b = TraceBuilder::new();
        add_1d(&mut b, 1, 2, 3, 4);
        let p = plan_of(&b);
        p.validate().unwrap();
        let mut bad = p.clone();
        bad.steps[0].args[0] = Arg::Tensor(99);
        assert!(bad.validate().unwrap_err().contains("slot 99"));
        let mut bad = p.clone();
        bad.steps[0].op = Some(7);
        assert!(bad.validate().is_err());
        let mut bad = p.clone();
        bad.version += 1;
        assert!(bad.validate().unwrap_err().contains("format"));
        let mut bad = p.clone();
        bad.version = Plan::OLDEST_READABLE - 1;
        assert!(bad.validate().unwrap_err().contains("format"));
        let mut bad = p;
        bad.externals[0].1.shape = vec![-4];
        assert!(bad.validate().is_err());
    }

    /// A package stored by the build before views (format 2) still runs: its JSON has no
    /// `views`, and it validates as it is; format 2 claiming views does not.
    #[test]
    fn format_2_plans_without_views_still_run() {
        let mut b = TraceBuilder::new();
        add_1d(&mut b, 1, 2, 3, 4);
        let mut p = plan_of(&b);
        p.version = 2;
        let text = serde_json::to_string(&p).unwrap();
        assert!(!text.contains("views"), "{text}");
        let old: Plan = serde_json::from_str(&text).unwrap();
        old.validate().unwrap();
        let mut with_views = old;
        let spec = with_views.externals[0].1.clone();
        with_views.steps[0].views.push(View {
            slot: 0,
            base: 1,
            spec,
            kind: ViewKind::Strided,
        });
        assert!(with_views.validate().unwrap_err().contains("views"));
    }

    /// Steps with the same operator, dtypes, shapes, strides and scalars share a signature;
    /// a transposed view shows its strides, another alpha its value.
    #[test]
    fn signatures_key_on_operator_tensors_and_scalars() {
        let mut b = TraceBuilder::new();
        b.op("aten::add", ADD)
            .input(f32(1, 1, 6), json!([2, 3]), "Tensor(float)")
            .input(f32(2, 2, 6), json!([2, 3]), "Tensor(float)")
            .input(json!(1), json!([]), "Int")
            .output(f32(3, 3, 6), json!([2, 3]), "Tensor(float)")
            .done();
        b.op("aten::add", ADD)
            .input(f32(3, 3, 6), json!([2, 3]), "Tensor(float)")
            .input(f32(2, 2, 6), json!([2, 3]), "Tensor(float)")
            .input(json!(1), json!([]), "Int")
            .output(f32(4, 4, 6), json!([2, 3]), "Tensor(float)")
            .done();
        b.op("aten::add", ADD)
            .input_strided(f32(5, 1, 6), json!([3, 2]), json!([1, 3]), "Tensor(float)")
            .input(f32(6, 6, 6), json!([3, 2]), "Tensor(float)")
            .input(json!(2), json!([]), "Int")
            .output(f32(7, 7, 6), json!([3, 2]), "Tensor(float)")
            .done();
        let p = plan_of(&b);
        let sigs = p.signatures();
        assert_eq!(sigs[0], "aten::add.Tensor(float32[2,3],float32[2,3],1)");
        assert_eq!(sigs[1], sigs[0]);
        assert_eq!(
            sigs[2],
            "aten::add.Tensor(float32[3,2]@[1,3],float32[3,2],2)"
        );
        assert_eq!(p.signature(2), sigs[2]);
    }
}
