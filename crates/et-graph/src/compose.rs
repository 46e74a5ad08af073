//! Composition and what-if edits. Each produces a new, valid trace in the input's layout that
//! this project (and PyTorch's tools) re-read: extract a selection, repeat iterations, concatenate
//! traces, scale a dimension, change a dtype, remove ops; and DOT export.

use crate::class::{is_root_name, OpClass};
use crate::graph::{Graph, ReplaySet, TensorTable};
use et_schema::{DType, Trace, Value, ValueType};
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

/// A composition whose result would not be a valid trace.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ComposeError {
    /// An id, size or count would leave its integer range (the result would hold wrapped,
    /// duplicate or negative values).
    #[error("node {node}: {field} overflows (the composed trace would hold wrapped values)")]
    Overflow {
        /// The node whose field overflows.
        node: u64,
        /// The field.
        field: &'static str,
    },
    /// The result would have more than [`MAX_NODES`] nodes.
    #[error("the result would have {nodes} nodes, more than the limit of {limit}")]
    TooBig {
        /// Nodes the result would have.
        nodes: u128,
        /// The limit.
        limit: u64,
    },
    /// The result's nodes could not be allocated.
    #[error(
        "the result's {nodes} nodes need about {mib} MiB of memory, which could not be \
         allocated: make fewer copies"
    )]
    OutOfMemory {
        /// Nodes the result would have.
        nodes: u128,
        /// The memory they need (MiB), nodes alone.
        mib: u64,
    },
}

/// The most nodes a composition may produce (about 100 GB of trace).
pub const MAX_NODES: u64 = 200_000_000;

fn add(a: u64, b: u64, node: u64, field: &'static str) -> Result<u64, ComposeError> {
    a.checked_add(b)
        .ok_or(ComposeError::Overflow { node, field })
}

fn is_root(t: &Trace, i: usize) -> bool {
    is_root_name(t.name(&t.nodes[i]))
}

/// Keeps the selected ops with their whole subtrees, the annotations enclosing them, the roots
/// and the records that hold for the whole trace (its process groups, `## process_group:init
/// ##`, which the collectives of any iteration refer to); drops everything else.
pub fn extract(g: &Graph, set: &ReplaySet) -> Trace {
    let mut keep = vec![false; g.len()];
    let mut stack: Vec<u32> = set.ops.clone();
    while let Some(i) = stack.pop() {
        if !keep[i as usize] {
            keep[i as usize] = true;
            stack.extend_from_slice(g.children(i));
        }
    }
    for &i in &set.ops {
        for a in g.ancestors(i) {
            keep[a as usize] = true;
        }
    }
    for i in 0..g.len() {
        if g.class[i].contains(OpClass::ROOT) {
            keep[i] = true;
        }
        if g.trace.name(&g.trace.nodes[i]) == crate::summary::PROCESS_GROUP_INIT {
            keep[i] = true;
            for a in g.ancestors(i as u32) {
                keep[a as usize] = true;
            }
        }
    }
    retain(g.trace, &keep)
}

/// Removes the selected ops and their subtrees.
pub fn remove(g: &Graph, set: &ReplaySet) -> Trace {
    let mut keep = vec![true; g.len()];
    let mut stack: Vec<u32> = set.ops.clone();
    while let Some(i) = stack.pop() {
        if keep[i as usize] {
            keep[i as usize] = false;
            stack.extend_from_slice(g.children(i));
        }
    }
    retain(g.trace, &keep)
}

fn retain(t: &Trace, keep: &[bool]) -> Trace {
    let mut out = t.clone();
    let mut k = keep.iter();
    out.nodes.retain(|_| *k.next().unwrap_or(&false));
    out
}

fn max_id(t: &Trace) -> u64 {
    t.nodes.iter().map(|n| n.id).max().unwrap_or(0)
}

/// Repeats the trace's iteration `n` times: copies of every non-root node with fresh node ids
/// (and record-function ids) placed after the original, so that execution order is original,
/// copy 1, copy 2, ... Tensor ids stay: each copy re-produces its intermediates and updates the
/// same parameters, as consecutive iterations do.
pub fn repeat(t: &Trace, n: usize) -> Result<Trace, ComposeError> {
    let mut out = t.clone();
    if n <= 1 {
        return Ok(out);
    }
    let roots: HashSet<u64> = (0..t.nodes.len())
        .filter(|&i| is_root(t, i))
        .map(|i| t.nodes[i].id)
        .collect();
    let body: Vec<usize> = (0..t.nodes.len()).filter(|&i| !is_root(t, i)).collect();
    let total = t.nodes.len() as u128 + body.len() as u128 * (n as u128 - 1);
    if total > MAX_NODES as u128 {
        return Err(ComposeError::TooBig {
            nodes: total,
            limit: MAX_NODES,
        });
    }
    let lo = body.iter().map(|&i| t.nodes[i].id).min().unwrap_or(0);
    let span = max_id(t).saturating_sub(lo) + 1;
    let rf_span = t
        .nodes
        .iter()
        .filter_map(|n| n.rf_id)
        .max()
        .map_or(Some(0), |m| m.checked_add(1))
        .ok_or(ComposeError::Overflow {
            node: 0,
            field: "rf_id",
        })?;
    // Fallibly: a count that fits the limit may still need more memory than there is, and an
    // infallible reserve aborts the process.
    let more = body.len() * (n - 1);
    out.nodes
        .try_reserve_exact(more)
        .map_err(|_| ComposeError::OutOfMemory {
            nodes: total,
            mib: ((total * std::mem::size_of::<et_schema::Node>() as u128) >> 20) as u64,
        })?;
    for k in 1..n as u64 {
        for &i in &body {
            let mut node = t.nodes[i].clone();
            let id = node.id;
            let shift = k.checked_mul(span).ok_or(ComposeError::Overflow {
                node: id,
                field: "id",
            })?;
            node.id = add(node.id, shift, id, "id")?;
            node.parent = match node.parent {
                Some(p) if !(roots.contains(&p) || p == 0) => Some(add(p, shift, id, "parent")?),
                p => p,
            };
            node.rf_id = match node.rf_id {
                Some(r) => {
                    let rs = k.checked_mul(rf_span).ok_or(ComposeError::Overflow {
                        node: id,
                        field: "rf_id",
                    })?;
                    Some(add(r, rs, id, "rf_id")?)
                }
                None => None,
            };
            out.nodes.push(node);
        }
    }
    renumber_iterations(&mut out, t.nodes.len(), body.len());
    Ok(out)
}

/// Numbers the `ProfilerStep#N` labels of [`repeat`]'s copies on from the original's, so that
/// each copy is an iteration of its own and `--iteration` picks one: with iterations `lo..=hi`
/// in the original, copy `k`'s are `lo + k*(hi-lo+1) ..`. The copies are the nodes after the
/// first `original` of `out`, `per_copy` nodes each. A label whose number would overflow stays.
fn renumber_iterations(out: &mut Trace, original: usize, per_copy: usize) {
    let step = |t: &Trace, i: usize| step_number(t, &t.nodes[i]);
    let nums: Vec<u64> = (0..original).filter_map(|i| step(out, i)).collect();
    let (Some(&lo), Some(&hi)) = (nums.iter().min(), nums.iter().max()) else {
        return;
    };
    let Some(width) = (hi - lo).checked_add(1) else {
        return;
    };
    for i in original..out.nodes.len() {
        let k = ((i - original) / per_copy.max(1)) as u64 + 1;
        let Some(n) = step(out, i) else { continue };
        if let Some(new) = k.checked_mul(width).and_then(|d| d.checked_add(n)) {
            out.nodes[i].name = out.strings.intern(&format!("ProfilerStep#{new}"));
        }
    }
}

/// Appends trace `b` after trace `a`: `b`'s node ids follow `a`'s, its tensor and storage ids
/// are shifted past `a`'s (they are different tensors), its thread roots hang under `a`'s
/// process root, or are `a`'s where `a` has a thread of the same id; its `ProfilerStep#N`
/// iterations are numbered on from `a`'s where their numbers would repeat them. The result has
/// `a`'s schema and layout.
pub fn concat(a: &Trace, b: &Trace) -> Result<Trace, ComposeError> {
    // The model's arenas are indexed by u32: the joined arenas must stay within it (checked
    // before the copies below, which such traces could not afford).
    a.fits_with(b).map_err(|e| ComposeError::Overflow {
        node: 0,
        field: e.what,
    })?;
    if (a.nodes.len() + b.nodes.len()) as u64 > MAX_NODES {
        return Err(ComposeError::TooBig {
            nodes: (a.nodes.len() + b.nodes.len()) as u128,
            limit: MAX_NODES,
        });
    }
    let mut out = a.clone();
    let mut b = b.clone();
    let id_off = max_id(a);
    let next = |m: Option<u64>, field| {
        m.map_or(Some(0), |m| m.checked_add(1))
            .ok_or(ComposeError::Overflow { node: 0, field })
    };
    let t_off = next(a.tensors.iter().map(|x| x.id).max(), "tensor id")?;
    let s_off = next(a.tensors.iter().map(|x| x.storage).max(), "storage id")?;
    let rf_off = next(a.nodes.iter().filter_map(|n| n.rf_id).max(), "rf_id")?;
    let a_process = a.nodes.iter().find(|n| t_is_process(a, n)).map(|n| n.id);
    let b_process: Option<u64> = b.nodes.iter().find(|n| t_is_process(&b, n)).map(|n| n.id);
    // b's thread roots that a has too (by thread id) become a's: b's ops on a thread then
    // follow a's on it, so that an iteration of a closes where b's start rather than seeming
    // open to the end of the trace (and taking b's backward thread's ops in).
    let a_threads: HashMap<u64, u64> = a
        .nodes
        .iter()
        .filter(|n| t_is_thread(a, n))
        .filter_map(|n| Some((n.tid?, n.id)))
        .collect();
    let merged: HashMap<u64, u64> = b
        .nodes
        .iter()
        .filter(|n| t_is_thread(&b, n))
        .filter_map(|n| Some((n.id, *a_threads.get(&n.tid?)?)))
        .collect();
    let steps =
        |t: &Trace| -> Vec<u64> { t.nodes.iter().filter_map(|n| step_number(t, n)).collect() };
    // b's iterations numbered on from a's where their numbers would repeat a's (a trace
    // concatenated with itself), as `repeat` numbers its copies: `--iteration N` picks one.
    let renumber = match (steps(a).iter().max(), steps(&b).iter().min()) {
        (Some(&a_hi), Some(&b_lo)) if b_lo <= a_hi => a_hi.checked_add(1).map(|n| n - b_lo),
        _ => None,
    };
    for x in &mut b.tensors {
        x.id = add(x.id, t_off, 0, "tensor id")?;
        if x.storage != 0 {
            x.storage = add(x.storage, s_off, 0, "storage id")?;
        }
    }
    let mut nodes = Vec::with_capacity(b.nodes.len());
    for n in std::mem::take(&mut b.nodes) {
        if (Some(n.id) == b_process && a_process.is_some()) || merged.contains_key(&n.id) {
            continue;
        }
        let mut n = n;
        let id = n.id;
        n.parent = match n.parent {
            Some(p) if Some(p) == b_process => match a_process {
                Some(ap) => Some(ap),
                None => Some(add(p, id_off, id, "parent")?),
            },
            Some(p) if merged.contains_key(&p) => Some(merged[&p]),
            Some(0) => Some(0),
            Some(p) => Some(add(p, id_off, id, "parent")?),
            None => None,
        };
        n.id = add(n.id, id_off, id, "id")?;
        n.rf_id = match n.rf_id {
            Some(r) => Some(add(r, rf_off, id, "rf_id")?),
            None => None,
        };
        if let Some(shift) = renumber {
            if let Some(new) = step_number(&b, &n).and_then(|k| k.checked_add(shift)) {
                n.name = b.strings.intern(&format!("ProfilerStep#{new}"));
            }
        }
        nodes.push(n);
    }
    b.nodes = nodes;
    // Checked above (fits_with); absorb would refuse the same, changing nothing.
    out.absorb(b).map_err(|e| ComposeError::Overflow {
        node: 0,
        field: e.what,
    })?;
    Ok(out)
}

fn t_is_process(t: &Trace, n: &et_schema::Node) -> bool {
    let name = t.name(n);
    is_root_name(name) && name.ends_with("process]")
}

/// N of a `ProfilerStep#N` node.
fn step_number(t: &Trace, n: &et_schema::Node) -> Option<u64> {
    t.name(n).strip_prefix("ProfilerStep#")?.parse().ok()
}

fn t_is_thread(t: &Trace, n: &et_schema::Node) -> bool {
    let name = t.name(n);
    is_root_name(name) && name.ends_with("thread]")
}

/// Rewrites the types of one element type to another (e.g. float -> bfloat16): tensor type
/// strings, item sizes, and `ScalarType` arguments (by op schema).
pub fn change_dtype(g: &Graph, from: DType, to: DType) -> Trace {
    let t = g.trace;
    let mut out = t.clone();
    let mut retype: std::collections::HashMap<et_schema::Sym, Option<et_schema::Sym>> =
        Default::default();
    let mut seen_tensor = vec![false; out.tensors.len()];
    for (ni, node) in t.nodes.iter().enumerate() {
        for a in t.inputs(node).iter().chain(t.outputs(node)) {
            retype.entry(a.ty).or_insert_with(|| {
                let new = swap_dtype(&ValueType::parse(t.str(a.ty)).ok()?, from, to)?;
                Some(out.strings.intern(&new.to_string()))
            });
            let mut ts = Vec::new();
            t.tensors_typed(a.value, &t.arg_type(a), &mut ts);
            for (ti, d) in ts {
                if d == Some(from) && !seen_tensor[ti as usize] {
                    seen_tensor[ti as usize] = true;
                    out.tensors[ti as usize].itemsize = to.size_bytes() as u64;
                }
            }
        }
        // `ScalarType` arguments (`dtype=6`), found by the op schema's argument positions.
        if let Some(schema) = g.schema[ni].as_deref() {
            for (k, a) in t.inputs(node).iter().enumerate() {
                let is_dtype = schema
                    .args
                    .get(k)
                    .is_some_and(|sa| sa.ty.base_name() == Some("ScalarType"));
                if is_dtype && a.value == Value::Int(from.scalar_type_code()) {
                    out.args[node.inputs.start as usize + k].value =
                        Value::Int(to.scalar_type_code());
                }
            }
        }
    }
    for a in &mut out.args {
        if let Some(Some(n)) = retype.get(&a.ty) {
            a.ty = *n;
        }
    }
    out
}

fn swap_dtype(ty: &ValueType, from: DType, to: DType) -> Option<ValueType> {
    match ty {
        ValueType::Tensor { dtype: Some(d), .. } if *d == from => Some(ValueType::Tensor {
            dtype: Some(to),
            raw: to.et_name().to_string(),
        }),
        ValueType::List(v) | ValueType::Tuple(v) => {
            let mut changed = false;
            let items: Vec<ValueType> = v
                .iter()
                .map(|x| match swap_dtype(x, from, to) {
                    Some(n) => {
                        changed = true;
                        n
                    }
                    None => x.clone(),
                })
                .collect();
            if !changed {
                return None;
            }
            Some(if matches!(ty, ValueType::List(_)) {
                ValueType::List(items)
            } else {
                ValueType::Tuple(items)
            })
        }
        _ => None,
    }
}

/// The names of the int-list arguments that give a shape (`view(Tensor self, SymInt[] size)`,
/// `reshape(.., SymInt[] shape)`, `unflatten(.., SymInt[] sizes)`, a backward's
/// `input_sizes`, layer norm's `normalized_shape`): what [`scale_dim`] scales besides tensor
/// shapes. Kernel sizes, strides, paddings and output sizes of pooling are not shapes of a
/// tensor the trace holds.
const SHAPE_ARGS: [&str; 8] = [
    "size",
    "sizes",
    "shape",
    "input_sizes",
    "self_sizes",
    "input_size",
    "normalized_shape",
    "bias_sizes",
];

/// Ops whose first int-list argument is a shape, for traces that record no op schema.
const SHAPE_FIRST_OPS: [&str; 22] = [
    "aten::view",
    "aten::reshape",
    "aten::_unsafe_view",
    "aten::_reshape_alias",
    "aten::expand",
    "aten::broadcast_to",
    "aten::unflatten",
    "aten::as_strided",
    "aten::as_strided_",
    "aten::empty",
    "aten::empty_strided",
    "aten::zeros",
    "aten::ones",
    "aten::full",
    "aten::rand",
    "aten::randn",
    "aten::new_empty",
    "aten::new_empty_strided",
    "aten::new_zeros",
    "aten::new_ones",
    "aten::new_full",
    "aten::resize_",
];

/// Which of `n`'s inputs are shape arguments ([`SHAPE_ARGS`]) by its op schema, else the first
/// int list of a [`SHAPE_FIRST_OPS`] op.
fn shape_inputs(t: &Trace, n: &et_schema::Node, schema: Option<&et_schema::OpSchema>) -> Vec<bool> {
    let inputs = t.inputs(n);
    if let Some(schema) = schema {
        return (0..inputs.len())
            .map(|k| {
                schema.args.get(k).is_some_and(|a| {
                    a.name
                        .as_deref()
                        .is_some_and(|name| SHAPE_ARGS.contains(&name))
                })
            })
            .collect();
    }
    let mut first = SHAPE_FIRST_OPS.contains(&t.name(n));
    inputs
        .iter()
        .map(|a| {
            let list = matches!(a.value, Value::List { .. }) && t.int_list(a.value).is_some();
            let shape = first && list;
            first &= !list;
            shape
        })
        .collect()
}

/// The view-like ops (`view`, `reshape`, `flatten`, ...) whose output holds another number of
/// bytes than their input: after [`scale_dim`], where the scaled size was flattened into
/// another dimension (a batch of 4 sequences of 32 viewed as 128 rows), which no longer
/// matches and which a replay fails. Their node ids. (Bytes, not elements: a view as another
/// dtype changes the count of elements.)
pub fn reshapes_that_mismatch(t: &Trace) -> Vec<u64> {
    const VIEWS: [&str; 6] = [
        "aten::view",
        "aten::reshape",
        "aten::_unsafe_view",
        "aten::_reshape_alias",
        "aten::flatten",
        "aten::unflatten",
    ];
    let bytes = |a: &et_schema::Arg| -> Option<i64> {
        let Value::Tensor(ti) = a.value else {
            return None;
        };
        let numel: i64 = t.int_list(a.shape)?.iter().product();
        Some(numel.saturating_mul(t.tensors[ti as usize].itemsize as i64))
    };
    t.nodes
        .iter()
        .filter(|n| VIEWS.contains(&t.name(n)))
        .filter(|n| {
            let (i, o) = (t.inputs(n).first(), t.outputs(n).first());
            matches!((i.and_then(bytes), o.and_then(bytes)), (Some(a), Some(b)) if a != b)
        })
        .map(|n| n.id)
        .collect()
}

/// Scales every tensor dimension of size `size` by `factor` (say batch 64 -> 128), with the
/// shape arguments that carry it ([`SHAPE_ARGS`]: `view`/`reshape`/`expand` sizes) so that ops
/// whose schemas tie shapes together stay consistent; element counts and contiguous strides
/// follow. A size flattened into another dimension is not followed:
/// [`reshapes_that_mismatch`] finds the ops that then no longer match.
pub fn scale_dim(t: &Trace, size: i64, factor: i64) -> Result<Trace, ComposeError> {
    let mut out = t.clone();
    let scaled = size.checked_mul(factor).ok_or(ComposeError::Overflow {
        node: 0,
        field: "scaled dimension",
    })?;
    // The node of each argument, for errors, and whether it is a shape argument.
    let mut node_of = vec![0u64; out.args.len()];
    let mut is_shape = vec![false; out.args.len()];
    let mut schemas: HashMap<et_schema::Sym, Option<et_schema::OpSchema>> = HashMap::new();
    for n in &out.nodes {
        for k in n.inputs.start..n.inputs.end {
            node_of[k as usize] = n.id;
        }
        for k in n.outputs.start..n.outputs.end {
            node_of[k as usize] = n.id;
        }
        let schema = n.op_schema.and_then(|sym| {
            schemas
                .entry(sym)
                .or_insert_with(|| et_schema::OpSchema::parse(out.str(sym)).ok())
                .as_ref()
        });
        for (k, shape) in shape_inputs(&out, n, schema).into_iter().enumerate() {
            is_shape[n.inputs.start as usize + k] = shape;
        }
    }
    let int_list = |out: &Trace, v: Value| -> Option<Vec<i64>> { out.int_list(v) };
    let mut done_items: HashSet<u32> = HashSet::new();
    for (ai, &node) in node_of.iter().enumerate() {
        let a = out.args[ai];
        let ty = out.arg_type(&a);
        match (a.value, &ty) {
            (Value::Tensor(ti), _) => {
                let Some(shape) = int_list(&out, a.shape) else {
                    continue;
                };
                if !shape.contains(&size) {
                    continue;
                }
                let new: Vec<i64> = shape
                    .iter()
                    .map(|&d| if d == size { scaled } else { d })
                    .collect();
                let overflow = |field| ComposeError::Overflow { node, field };
                let numel = new
                    .iter()
                    .try_fold(1i64, |a, &d| a.checked_mul(d))
                    .ok_or(overflow("shape (element count)"))?;
                if numel
                    .checked_mul(out.tensors[ti as usize].itemsize.max(1) as i64)
                    .is_none()
                {
                    return Err(overflow("shape (bytes)"));
                }
                let Value::List { start, .. } = a.shape else {
                    continue;
                };
                if done_items.insert(start) {
                    for (k, d) in new.iter().enumerate() {
                        out.items[start as usize + k] = Value::Int(*d);
                    }
                }
                let old_numel: i64 = shape.iter().fold(1i64, |a, &d| a.saturating_mul(d));
                let x = &mut out.tensors[ti as usize];
                if x.numel as i64 == old_numel {
                    x.numel = numel.max(0) as u64;
                }
                if let Some(Value::List { start: s0, .. }) = a.strides {
                    if let Some(strides) = int_list(&out, a.strides.unwrap_or(Value::Null)) {
                        if strides == contiguous(&shape) && done_items.insert(s0) {
                            for (k, d) in contiguous(&new).iter().enumerate() {
                                out.items[s0 as usize + k] = Value::Int(*d);
                            }
                        }
                    }
                }
            }
            (Value::List { start, len }, ValueType::List(elems))
                if is_shape[ai] && elems.iter().all(|e| *e == ValueType::Int) && len > 0 =>
            {
                for k in 0..len {
                    if out.items[(start + k) as usize] == Value::Int(size) {
                        out.items[(start + k) as usize] = Value::Int(scaled);
                    }
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

fn contiguous(shape: &[i64]) -> Vec<i64> {
    let mut s = vec![1i64; shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        s[k] = s[k + 1].saturating_mul(shape[k + 1].max(1));
    }
    s
}

/// `name` inside a DOT double-quoted label: quotes and backslashes escaped (a backslash
/// starts Graphviz's `\l`, `\n`, `\N` escapes), line breaks as `\n`.
fn dot_escape(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => {}
            c => out.push(c),
        }
    }
    out
}

/// Graphviz DOT of a replay set: one box per op, data edges labelled with the tensor id.
pub fn to_dot(g: &Graph, set: &ReplaySet, tensors: &TensorTable) -> String {
    let mut s = String::from("digraph trace {\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\", fontsize=10];\n");
    for (pos, &i) in set.ops.iter().enumerate() {
        let c = g.class[i as usize];
        let color = if c.contains(OpClass::COLLECTIVE) {
            "lightsalmon"
        } else if c.contains(OpClass::BACKWARD) {
            "lightblue"
        } else {
            "white"
        };
        let _ = writeln!(
            s,
            "  n{pos} [label=\"{} #{}\", style=filled, fillcolor={color}];",
            dot_escape(g.name(i)),
            g.id(i)
        );
    }
    for e in &tensors.edges {
        let style = if e.via_storage { ", style=dashed" } else { "" };
        let _ = writeln!(
            s,
            "  n{} -> n{} [label=\"t{}\"{style}];",
            e.from, e.to, e.tensor.0
        );
    }
    s.push_str("}\n");
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn labels_escape_quotes_backslashes_and_line_breaks() {
        assert_eq!(
            super::dot_escape("re\\lu \"x\"\nnext\r"),
            "re\\\\lu \\\"x\\\"\\nnext"
        );
    }
}
