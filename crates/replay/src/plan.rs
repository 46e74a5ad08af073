//! Compiling a replay set into a [`Plan`]: for each op a resolved dispatcher handle and an
//! argument template (which slots, which constants), the outputs' slots, the slots to free
//! after it, and the external inputs to materialise. Everything that depends only on the trace
//! is done here once, so the measured loop does one boxed call plus slot moves per op.
//! Architecture invariant: a Plan is immutable once built.

use crate::ffi::Op;
use et_graph::{Graph, OpClass, ReplaySet, TensorKey};
use et_schema::{DType, OpSchema, SchemaType, Trace, Value, ValueType};
use std::collections::HashMap;
use std::ffi::CString;
use std::sync::Arc;

pub type Slot = u32;

/// How to make a tensor the trace does not produce.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorSpec {
    pub shape: Vec<i64>,
    pub strides: Vec<i64>,
    pub dtype: DType,
    /// Storage id in the trace (0: none); views of one storage share one allocation.
    pub storage: u64,
    /// Storage offset in elements.
    pub offset: i64,
}

impl TensorSpec {
    /// Elements of storage this view reaches (offset included).
    pub fn extent(&self) -> i64 {
        if self.shape.contains(&0) {
            return self.offset;
        }
        self.offset
            + self
                .shape
                .iter()
                .zip(&self.strides)
                .map(|(s, st)| (s - 1) * st)
                .sum::<i64>()
            + 1
    }
}

/// Values for integer external inputs, by what consumes them.
#[derive(Clone, Debug, PartialEq)]
pub enum Fill {
    Random,
    /// Random and non-negative: a value some consumer needs so (a variance, a second moment).
    NonNegative,
    /// Every element this value.
    Value(f64),
    /// Indices into a dimension of this size: uniform in `[0, bound)`.
    Indices(i64),
    /// EmbeddingBag offsets over `total` indices: sorted, starting at 0.
    Offsets(i64),
    Zeros,
}

#[derive(Clone, Debug)]
pub enum Arg {
    Tensor(Slot),
    UndefinedTensor,
    None,
    TensorList {
        slots: Vec<Option<Slot>>,
        optional: bool,
    },
    Int(i64),
    Double(f64),
    Bool(bool),
    Str(CString),
    IntList(Vec<i64>),
    DoubleList(Vec<f64>),
    BoolList(Vec<u8>),
    ScalarInt(i64),
    ScalarDouble(f64),
    ScalarBool(bool),
    ScalarList(Vec<f64>),
    /// The replay device (trace devices are remapped to it).
    Device,
    /// The schema default of this argument position.
    Default(usize),
}

impl Arg {
    /// The tensor slots this argument passes (one, a list's, or none).
    pub fn slots(&self) -> Vec<Slot> {
        match self {
            Arg::Tensor(s) => vec![*s],
            Arg::TensorList { slots, .. } => slots.iter().flatten().copied().collect(),
            _ => Vec::new(),
        }
    }
}

#[derive(Clone, Debug)]
pub enum Out {
    Tensor(Slot),
    List(Vec<Option<Slot>>),
    Ignore,
}

#[derive(Clone)]
pub struct Step {
    pub node: u32,
    pub id: u64,
    pub name: String,
    /// The resolved operator, or why it cannot run.
    pub op: Result<Arc<Op>, String>,
    pub args: Vec<Arg>,
    pub outs: Vec<Out>,
    /// Specs of the output tensors, to synthesise them when the op fails.
    pub out_specs: Vec<(Slot, TensorSpec)>,
    /// Slots whose last use is this step.
    pub frees: Vec<Slot>,
    pub collective: bool,
    /// Input slots with the same tensor key as each output, to pass through when skipped.
    pub passthrough: Vec<(Slot, Slot)>,
    /// The op has no kernel on the replay device and runs as another op (or as a no-op).
    pub fallback: Option<String>,
    /// Run nothing: outputs pass through (a no-op on this device, e.g. record_stream on CPU).
    pub elide: bool,
    /// The original recorded this call for autograd (a forward op with a sequence number):
    /// replay it with autograd on, so it builds the same graph nodes and saves the same tensors
    /// and composite ops take the same (differentiable) paths.
    pub autograd: bool,
}

pub struct Plan {
    pub steps: Vec<Step>,
    pub n_slots: usize,
    /// External inputs: slot, spec, fill.
    pub externals: Vec<(Slot, TensorSpec, Fill)>,
    /// External float inputs of autograd steps: the model's parameters (and inputs), made to
    /// require grad so the forward records a graph.
    pub grad_inputs: Vec<Slot>,
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

/// Tensors of one argument with their specs, in order (a list argument has several).
fn arg_tensors(t: &Trace, a: &et_schema::Arg) -> Vec<(Value, Option<TensorSpec>)> {
    let ty = t.arg_type(a);
    match (a.value, &ty) {
        (Value::Tensor(_), ValueType::Tensor { dtype, .. }) => {
            vec![(a.value, tensor_spec(t, a.value, a.shape, a.strides, *dtype))]
        }
        (Value::Tensor(_), _) => vec![(a.value, tensor_spec(t, a.value, a.shape, a.strides, None))],
        (Value::List { .. }, ValueType::List(elems) | ValueType::Tuple(elems)) => {
            let shapes = t.list(a.shape);
            let strides = a.strides.map(|s| t.list(s).to_vec()).unwrap_or_default();
            t.list(a.value)
                .iter()
                .enumerate()
                .map(|(k, &v)| {
                    let dt = match elems.get(k) {
                        Some(ValueType::Tensor { dtype, .. }) => *dtype,
                        _ => None,
                    };
                    let sh = shapes
                        .get(k)
                        .copied()
                        .unwrap_or(Value::List { start: 0, len: 0 });
                    (v, tensor_spec(t, v, sh, strides.get(k).copied(), dt))
                })
                .collect()
        }
        _ => vec![],
    }
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
    ops: HashMap<(String, String), Result<Arc<Op>, String>>,
    /// The slot an in-place op's output was written over (same tensor key), to find the
    /// external input an in-place chain started from.
    written_over: HashMap<Slot, Slot>,
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
        let s = self.new_slot(step, Some((spec.shape.clone(), spec.dtype)));
        let fill = if spec.dtype.is_integral() {
            Fill::Zeros
        } else if spec.shape.is_empty() && spec.dtype == DType::Float64 {
            // A 0-dim double is how a Python number passed to a Tensor overload reaches the op
            // (a "wrapped number": `exp_avg_sq.mul_(beta2)`), its value unrecorded. 1 keeps
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
        self.external_index.insert(s, self.externals.len());
        self.externals.push((s, spec, fill));
        self.current.insert(key, s);
        Some(s)
    }

    /// Makes the external input a value flows from (through in-place updates) non-negative.
    fn mark_nonnegative(&mut self, mut slot: Slot) {
        while let Some(&prev) = self.written_over.get(&slot) {
            slot = prev;
        }
        if let Some(&e) = self.external_index.get(&slot) {
            let ext = &mut self.externals[e];
            if ext.1.dtype.is_floating_point() && matches!(ext.2, Fill::Random) {
                ext.2 = Fill::NonNegative;
            }
        }
    }

    fn resolve(&mut self, schema: &OpSchema) -> Result<Arc<Op>, String> {
        self.ops
            .entry((schema.name.clone(), schema.overload.clone()))
            .or_insert_with(|| Op::find(&schema.name, &schema.overload).map(Arc::new))
            .clone()
    }
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
            "argument type {ty} with value {:?} is not supported",
            t.str(a.ty)
        )
    };
    match ty {
        SchemaType::Named { name, .. } => match name.as_str() {
            "Tensor" => {
                if is_none(t, v) {
                    return Ok(Arg::UndefinedTensor);
                }
                let ts = arg_tensors(t, a);
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
            "Generator" => Ok(Arg::None),
            _ => Err(unsupported()),
        },
        SchemaType::List { elem, size, .. } => {
            let base = elem.base_name().unwrap_or("");
            let items = t.list(v);
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

/// Inputs whose values their consumer constrains: integers that index something get indices
/// valid for it; a loss's `total_weight` (saved by the forward op inside a composite the replay
/// does not look into) gets the target count it divides by, not a random divisor that scales
/// every gradient by up to 1e4 and drives SGD to Inf within a few iterations.
fn consumer_fill(
    op: &str,
    arg_name: &str,
    args: &[et_schema::Arg],
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
        (b, "target") if b.contains("nll_loss") || b.contains("cross_entropy") => {
            let s = shape_of("self")?;
            Some(Fill::Indices(if s.len() > 1 {
                s[1]
            } else {
                s.first().copied()?
            }))
        }
        _ => None,
    }
}

/// Compiles a replay set. Ops that cannot run (no schema, unknown operator, unsupported
/// argument) are planned as failing steps with the reason; the run goes on around them.
pub fn compile(g: &Graph, set: &ReplaySet, device: tch::Device) -> Plan {
    let t = g.trace;
    let mut b = Builder {
        g,
        current: HashMap::new(),
        n_slots: 0,
        externals: Vec::new(),
        external_index: HashMap::new(),
        last_use: Vec::new(),
        slot_meta: Vec::new(),
        ops: HashMap::new(),
        written_over: HashMap::new(),
    };
    let mut steps = Vec::with_capacity(set.ops.len());
    let mut grad_inputs = std::collections::BTreeSet::new();
    for (step, &i) in set.ops.iter().enumerate() {
        let node = &t.nodes[i as usize];
        let name = t.name(node).to_string();
        let collective = g.class[i as usize].contains(OpClass::COLLECTIVE);
        let inputs = t.inputs(node);
        let schema = g.schema[i as usize].clone();
        let mut args = Vec::new();
        let mut problem: Option<String> = None;
        let mut input_keys: Vec<(TensorKey, Slot)> = Vec::new();
        match &schema {
            None => {
                problem = Some(if collective {
                    "collective without an op schema".into()
                } else {
                    "no op schema in the trace".into()
                })
            }
            Some(s) => {
                for (k, sa) in s.args.iter().enumerate() {
                    match inputs.get(k) {
                        Some(a) => match build_arg(&mut b, step, &sa.ty, a) {
                            Ok(arg) => {
                                if needs_nonnegative(&name, sa.name.as_deref()) {
                                    for s in arg.slots() {
                                        b.mark_nonnegative(s);
                                    }
                                }
                                if let (Some(n), Arg::Tensor(slot)) = (&sa.name, &arg) {
                                    if let Some(fill) = consumer_fill(&name, n, inputs, t, s) {
                                        if let Some(&e) = b.external_index.get(slot) {
                                            let ext = &b.externals[e].1;
                                            if ext.dtype.is_integral()
                                                || matches!(fill, Fill::Value(_))
                                            {
                                                b.externals[e].2 = fill;
                                            }
                                        }
                                    }
                                }
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
        let mut fallback = None;
        let mut fallback_op = None;
        let mut elide = false;
        // Ops that do nothing without a GPU are elided whatever their arguments (a Stream).
        if device == tch::Device::Cpu && CPU_NOOPS.contains(&name.as_str()) {
            problem = None;
            elide = true;
            fallback = Some(format!("no-op on CPU ({name})"));
        }
        if device == tch::Device::Cpu && problem.is_none() && !elide {
            if let Some(s) = &schema {
                if let Some((name, overload)) = cpu_fallback(s, &mut args) {
                    fallback = Some(format!(
                        "ran as {name} (no CPU kernel for {})",
                        s.full_name()
                    ));
                    let target = OpSchema {
                        name: name.into(),
                        overload: overload.into(),
                        args: vec![],
                        returns: vec![],
                        is_vararg: false,
                        is_varret: false,
                    };
                    fallback_op = Some(b.resolve(&target));
                }
            }
        }
        let mut op = match (&problem, &schema, fallback_op.take()) {
            (Some(p), _, _) => Err(p.clone()),
            (None, _, Some(op)) => op,
            (None, _, None) if elide => Err("elided: a no-op on this device".into()),
            (None, Some(s), None) => b.resolve(s),
            (None, None, None) => Err("no op schema".into()),
        };
        // A trace from another PyTorch version may record an older schema of the operator:
        // rebuild the arguments against the registered schema, by name, with its defaults.
        if let (Ok(o), Some(s), None) = (&op, &schema, &fallback) {
            if let Ok(reg) = OpSchema::parse(&o.schema()) {
                if reg
                    .args
                    .iter()
                    .map(|a| (&a.name, a.ty.to_string()))
                    .ne(s.args.iter().map(|a| (&a.name, a.ty.to_string())))
                {
                    match reconcile(&mut b, step, &reg, s, inputs) {
                        Ok(a) => args = a,
                        Err(e) => {
                            op = Err(format!(
                                "recorded schema differs from this libtorch's ({}): {e}",
                                o.schema()
                            ))
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
        let autograd = node.seq_id.is_some_and(|s| s >= 0) && !collective;
        if let (true, Some(s)) = (autograd, &schema) {
            for (a, sa) in args.iter().zip(&s.args) {
                // Buffers a module updates without autograd (batch norm's running statistics).
                if matches!(
                    sa.name.as_deref(),
                    Some("running_mean" | "running_var" | "num_batches_tracked")
                ) {
                    continue;
                }
                for s in a.slots() {
                    if let Some(&e) = b.external_index.get(&s) {
                        if b.externals[e].1.dtype.is_floating_point() {
                            grad_inputs.insert(s);
                        }
                    }
                }
            }
        }
        steps.push(Step {
            node: i,
            id: node.id,
            name,
            op,
            args,
            outs,
            out_specs,
            frees: Vec::new(),
            collective,
            passthrough,
            fallback,
            elide,
            autograd,
        });
    }
    // Frees at last use, except external inputs, which persist across iterations (parameters
    // and optimizer state carry their in-place updates into the next iteration).
    let n = steps.len();
    for (slot, &last) in b.last_use.iter().enumerate() {
        if !b.external_index.contains_key(&(slot as u32)) && last < n {
            steps[last].frees.push(slot as u32);
        }
    }
    Plan {
        steps,
        n_slots: b.n_slots as usize,
        externals: b.externals,
        grad_inputs: grad_inputs.into_iter().collect(),
    }
}

/// Stream bookkeeping that has no effect on a CPU replay.
const CPU_NOOPS: &[&str] = &[
    "aten::record_stream",
    "cuda::synchronize",
    "aten::_cuda_synchronize",
];

/// CUDA-only operators that a CPU replay runs as their CPU equivalent (arguments rearranged
/// here).
fn cpu_fallback(s: &OpSchema, args: &mut Vec<Arg>) -> Option<(&'static str, &'static str)> {
    match s.full_name().as_str() {
        "aten::cudnn_batch_norm_backward" if args.len() == 9 => {
            // (input, grad_output, weight, running_mean, running_var, save_mean, save_var, eps,
            // reserve) -> native_batch_norm_backward(grad_out, input, weight, running_mean,
            // running_var, save_mean, save_invstd, train, eps, output_mask)
            let a = std::mem::take(args);
            let mut it = a.into_iter();
            let (input, grad, weight, rm, rv, sm, sv, eps) = (
                it.next()?,
                it.next()?,
                it.next()?,
                it.next()?,
                it.next()?,
                it.next()?,
                it.next()?,
                it.next()?,
            );
            *args = vec![
                grad,
                input,
                weight,
                rm,
                rv,
                sm,
                sv,
                Arg::Bool(true),
                eps,
                Arg::BoolList(vec![1, 1, 1]),
            ];
            Some(("aten::native_batch_norm_backward", ""))
        }
        "aten::pin_memory" if !args.is_empty() => {
            args.truncate(1);
            Some(("aten::alias", ""))
        }
        _ => None,
    }
}

/// Builds arguments for the registered schema from a trace recorded with another one, matching
/// arguments by name and using the registered defaults for arguments the trace does not have.
fn reconcile(
    b: &mut Builder,
    step: usize,
    reg: &OpSchema,
    recorded: &OpSchema,
    inputs: &[et_schema::Arg],
) -> Result<Vec<Arg>, String> {
    let mut out = Vec::with_capacity(reg.args.len());
    for (k, ra) in reg.args.iter().enumerate() {
        let pos = recorded
            .args
            .iter()
            .position(|a| a.name.is_some() && a.name == ra.name);
        match pos.and_then(|p| inputs.get(p)) {
            Some(a) => out.push(
                build_arg(b, step, &ra.ty, a)
                    .map_err(|e| format!("argument {}: {e}", ra.name.as_deref().unwrap_or("?")))?,
            ),
            None if ra.default.is_some() => out.push(Arg::Default(k)),
            None if ra.ty.is_optional() => out.push(Arg::None),
            None => {
                return Err(format!(
                    "argument {} has no recorded value and no default",
                    ra.name.as_deref().unwrap_or("?")
                ))
            }
        }
    }
    Ok(out)
}
