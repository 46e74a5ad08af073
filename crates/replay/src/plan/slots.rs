//! Slot tracking while compiling: which slot holds each tensor version of the trace, the
//! external inputs (tensors read before any op wrote them), views of storages, last uses.

use super::args::{is_fused_attention, is_none};
use super::*;

pub(super) fn tensor_spec(
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

/// Tensors of one argument with their specs, in order (a list argument has several; a list of
/// lists, `Tensor[][]`, its inner lists' flattened). Elements that are not tensors keep their
/// place with no spec (`None` in a `Tensor?[]`).
pub(super) fn arg_tensors(t: &Trace, a: &et_schema::Arg) -> Vec<(Value, Option<TensorSpec>)> {
    let mut out = Vec::new();
    collect_tensors(t, a.value, &t.arg_type(a), a.shape, a.strides, &mut out);
    out
}

/// A list argument's tensors grouped by inner list (`Tensor[][]`), in order.
pub(super) fn nested_tensors(
    t: &Trace,
    a: &et_schema::Arg,
) -> Vec<Vec<(Value, Option<TensorSpec>)>> {
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

pub(super) fn collect_tensors(
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
pub(super) type Region = (u64, u64, u64, u64);

/// The region of storage a tensor value views.
pub(super) fn storage_region(t: &Trace, v: Value) -> Option<Region> {
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
pub(super) fn extent(shape: &[i64], strides: &[i64]) -> Option<i64> {
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

pub(super) fn key_of(t: &Trace, v: Value) -> Option<TensorKey> {
    match v {
        Value::Tensor(i) => {
            let x = t.tensor(i);
            (x.storage != 0).then_some((x.id, x.storage))
        }
        _ => None,
    }
}

pub(super) struct Builder<'g, 't> {
    pub(super) g: &'g Graph<'t>,
    pub(super) current: HashMap<TensorKey, Slot>,
    pub(super) n_slots: u32,
    pub(super) externals: Vec<(Slot, TensorSpec, Fill)>,
    pub(super) external_index: HashMap<Slot, usize>,
    pub(super) last_use: Vec<usize>,
    /// The step each slot was made for (by slot): an output's step, a view's or an external
    /// input's first reader.
    pub(super) made_at: Vec<usize>,
    /// Shape and dtype each slot holds, as the trace records it.
    pub(super) slot_meta: Vec<Option<(Vec<i64>, DType)>>,
    /// Distinct operators and their index in [`Plan::ops`].
    pub(super) ops: indexmap::IndexSet<OpRef>,
    /// The slot a value came from with its values unchanged: an in-place op's output was
    /// written over it (same tensor key), or a copy (`to`, `clone`, `contiguous`) was made of
    /// it. To find the external input whose values a consumer constrains.
    pub(super) written_over: HashMap<Slot, Slot>,
    /// The slot last written to each region of storage (storage id, offset, elements,
    /// bytes each), with its strides: a tensor autograd saved from an op's output reaches the
    /// backward as a new TensorImpl over the same storage (`SavedVariable` keeps the output's
    /// data without its grad_fn), so under a new tensor id (relu's output, id 38 on storage 46,
    /// read by `threshold_backward` as id 120 on storage 46).
    pub(super) by_storage: HashMap<Region, (Slot, Vec<i64>)>,
    /// Views the step being built reads ([`Step::views`]).
    pub(super) views: Vec<View>,
    /// The nodes (their indices, in trace order) of the ops whose outputs [`Builder::derived`]
    /// can make again ((log-)softmax, a fused attention's log-sum-exp) that wrote each region
    /// of storage, found once when first asked.
    pub(super) producers: Option<HashMap<Region, Vec<usize>>>,
    /// The trace node of the step being built (its index).
    pub(super) node: usize,
    /// The step of each trace node built into one so far (by node index), and the first
    /// step's execution rank.
    pub(super) step_of: HashMap<u32, usize>,
    pub(super) first_rank: Option<u32>,
    /// The nodes (their execution ranks and indices, in execution order) whose outputs made
    /// each storage: an output over a storage none of its inputs is over, found once when
    /// first asked.
    pub(super) allocators: Option<HashMap<u64, Vec<(u32, u32)>>>,
    /// Copies ([`ViewKind::Copy`]) of values made inside a composite: the step that ran it,
    /// the step that first reads the value, and the view (placed by `Compiler::finish`).
    pub(super) copies: Vec<(usize, usize, View)>,
    /// Values made again ([`Builder::derived`]) before an earlier step than the one that reads
    /// them first: that step and the view.
    pub(super) placed: Vec<(usize, View)>,
    /// The process group of the step being built (its ProcessGroup arguments).
    pub(super) group: u32,
}

impl Builder<'_, '_> {
    pub(super) fn new_slot(&mut self, step: usize, meta: Option<(Vec<i64>, DType)>) -> Slot {
        self.n_slots += 1;
        self.last_use.push(step);
        self.made_at.push(step);
        self.slot_meta.push(meta);
        self.n_slots - 1
    }

    /// The slot holding a tensor input now, materialising it as external when unseen.
    pub(super) fn input_slot(
        &mut self,
        step: usize,
        v: Value,
        spec: &Option<TensorSpec>,
    ) -> Option<Slot> {
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
        // Scalars are left out: their memory is nothing, and a copy would lose a wrapped
        // number's flag.
        let made_at = region
            .filter(|_| !spec.shape.is_empty())
            .and_then(|r| self.made_in_iteration(r.0));
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
        self.external_index.insert(s, self.externals.len());
        self.externals.push((s, spec.clone(), fill));
        // A value an op inside a composite made in this iteration (a recurrent cell's gates,
        // saved for the backward): the original held its memory from that composite's step to
        // the value's last use. The external holds its values across iterations; a copy of it,
        // freed after its last use, holds the memory where the original did (made where
        // `Compiler::finish` places it). Read from the external alone, grucell_loop_adam's
        // replay held 0.74 of the original's peak.
        let s = match made_at {
            Some(producer) => {
                let copy = self.new_slot(step, Some((spec.shape.clone(), spec.dtype)));
                let view = View {
                    slot: copy,
                    base: s,
                    spec: spec.clone(),
                    kind: ViewKind::Copy,
                };
                log::debug!(
                    "step {step}: slot {copy} ({:?} {:?}, storage region {region:?}) copied of \
                     external {s}, made by step {producer}",
                    spec.shape,
                    spec.dtype
                );
                self.copies.push((producer, step, view));
                // Its consumers' constraints (indices in bounds, a variance non-negative) are
                // the external's fill.
                self.written_over.insert(copy, s);
                copy
            }
            None => s,
        };
        if let Some(r) = region {
            self.by_storage.insert(r, (s, spec.strides.clone()));
        }
        self.current.insert(key, s);
        Some(s)
    }

    /// The step that ran the op which last made `storage` before the step being built, where
    /// that op ran since the iteration's first step inside the step (a composite the replay
    /// runs whole). `None` when no node since the iteration's first step made it, when a
    /// step made it itself, or when none of the steps ran the one that did.
    fn made_in_iteration(&mut self, storage: u64) -> Option<usize> {
        let (g, t) = (self.g, self.g.trace);
        let first = self.first_rank?;
        let allocators = self.allocators.get_or_insert_with(|| {
            let mut m: HashMap<u64, Vec<(u32, u32)>> = HashMap::new();
            let storages = |args: &[et_schema::Arg]| -> Vec<u64> {
                args.iter()
                    .flat_map(|a| arg_tensors(t, a))
                    .filter_map(|(v, _)| storage_region(t, v).map(|r| r.0))
                    .collect()
            };
            for &k in &g.order {
                let n = &t.nodes[k as usize];
                let ins = storages(t.inputs(n));
                for st in storages(t.outputs(n)) {
                    if !ins.contains(&st) {
                        let v = m.entry(st).or_default();
                        if v.last().map(|&(_, last)| last) != Some(k) {
                            v.push((g.rank[k as usize], k));
                        }
                    }
                }
            }
            m
        });
        // The last node that made it before this step's: the allocator reuses a storage.
        let made = allocators.get(&storage)?;
        let now = g.rank[self.node];
        let at = made.partition_point(|&(r, _)| r < now).checked_sub(1)?;
        let (rank, k) = made[at];
        // Made by a step itself, the value is a region of that step's output that a slot
        // holds already (read with sizes past its own: see `input_slot`).
        if rank < first || self.step_of.contains_key(&k) {
            return None;
        }
        self.step_of_node(k)
    }

    /// The step that ran node `k`: the step of `k` or of its nearest ancestor that is one.
    fn step_of_node(&self, k: u32) -> Option<usize> {
        std::iter::once(k)
            .chain(self.g.ancestors(k))
            .find_map(|a| self.step_of.get(&a).copied())
    }

    /// A value no replayed op wrote that an op inside a composite the replay runs whole made
    /// from a live slot, and that the replay can make again from it: the (log-)softmax of
    /// cross-entropy, saved for its backward. Filled uniform instead, its gradient was the same
    /// whatever the logits, so training on the replay's fixed batch never converged, and the
    /// weights drifted to Inf (mlp_sgd after 105 iterations). `None` when the region's
    /// producer is not such an op or its input is not live with its recorded shape and dtype.
    pub(super) fn derived(
        &mut self,
        step: usize,
        region: Option<Region>,
        spec: &TensorSpec,
    ) -> Option<Slot> {
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
        let made = before[at];
        let node = &t.nodes[made];
        let name = t.name(node);
        let ins = t.inputs(node);
        // Made right after the step that ran the op, as the original held its value from
        // there to the backward; made before the backward op instead, the replay held the
        // op's input there too (cross-entropy's logits, past the loss).
        let place = self
            .step_of_node(made as u32)
            .map_or(step, |p| (p + 1).min(step));
        if is_fused_attention(name) {
            return self.attention_logsumexp(step, place, node, spec);
        }
        if name == "aten::_weight_norm_interface" {
            return self.weight_norm_norms(step, place, node, spec);
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
        log::debug!(
            "step {step}: {name} of slot {base} made again for its backward, before step {place}"
        );
        Some(self.computed_view(step, place, base, &[], spec, kind))
    }

    /// Input `i` of `node` where it is live in a slot with the shape and dtype the trace
    /// recorded for it: the slot and that spec.
    pub(super) fn live_input(
        &self,
        node: &et_schema::Node,
        i: usize,
    ) -> Option<(Slot, TensorSpec)> {
        let t = self.g.trace;
        let (v, sp) = arg_tensors(t, t.inputs(node).get(i)?).into_iter().next()?;
        let sp = sp?;
        let s = *self.current.get(&key_of(t, v)?)?;
        (self.slot_meta[s as usize] == Some((sp.shape.clone(), sp.dtype))).then_some((s, sp))
    }

    /// A new slot that `step` reads, made before step `at` (at most `step`) of `base` (and
    /// the other slots it `reads`) as `kind` says, contiguous with `spec`'s shape and dtype: a
    /// value a composite run whole made inside it and saved for a backward, which no replayed
    /// op writes.
    pub(super) fn computed_view(
        &mut self,
        step: usize,
        at: usize,
        base: Slot,
        reads: &[Slot],
        spec: &TensorSpec,
        kind: ViewKind,
    ) -> Slot {
        // Where a slot it is made of is filled only later (the trace's ids were reused for
        // another tensor since), before the step that reads it, as the values there are.
        let ready =
            |b: &Self, r: Slot| b.external_index.contains_key(&r) || b.made_at[r as usize] < at;
        let at = if std::iter::once(&base).chain(reads).all(|&r| ready(self, r)) {
            at
        } else {
            step
        };
        for &r in std::iter::once(&base).chain(reads) {
            let last = &mut self.last_use[r as usize];
            *last = (*last).max(at);
        }
        let s = self.new_slot(step, Some((spec.shape.clone(), spec.dtype)));
        let view = View {
            slot: s,
            base,
            spec: TensorSpec {
                strides: contiguous(&spec.shape),
                ..spec.clone()
            },
            kind,
        };
        if at < step {
            self.placed.push((at, view));
        } else {
            self.views.push(view);
        }
        s
    }

    /// The log-sum-exp a fused attention `node` returned (its second output, `spec`), made
    /// again from its query and key where both are live with their recorded shapes: `[B, H,
    /// L, E]` and `[B, H, S, E]`, the log-sum-exp `[B, H, L]` in a floating dtype, no
    /// attention mask (an additive or boolean one is not modelled). `None` otherwise.
    pub(super) fn attention_logsumexp(
        &mut self,
        step: usize,
        at: usize,
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
        Some(self.computed_view(step, at, q, &[k], spec, kind))
    }

    /// The norms `_weight_norm_interface(v, g, dim)` (`node`) returned second (`spec`, `g`'s
    /// shape), made again from its `v` and `g` where both are live with their recorded shapes
    /// and dtypes. `None` otherwise.
    pub(super) fn weight_norm_norms(
        &mut self,
        step: usize,
        at: usize,
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
        let kind = ViewKind::WeightNormNorms { g, dim };
        Some(self.computed_view(step, at, v, &[g], spec, kind))
    }

    /// The slot is a floating-point external input (a parameter, if anything requires grad).
    pub(super) fn is_float_external(&self, slot: Slot) -> bool {
        self.external_index
            .get(&slot)
            .is_some_and(|&e| self.externals[e].1.dtype.is_floating_point())
    }

    /// The external input a slot's values flow from (through in-place updates and copies), if
    /// they flow from one.
    pub(super) fn external_of(&self, mut slot: Slot) -> Option<usize> {
        while let Some(&prev) = self.written_over.get(&slot) {
            slot = prev;
        }
        self.external_index.get(&slot).copied()
    }

    /// Makes the external input a value flows from (through in-place updates and copies)
    /// non-negative.
    pub(super) fn mark_nonnegative(&mut self, slot: Slot) {
        if let Some(e) = self.external_of(slot) {
            let ext = &mut self.externals[e];
            if ext.1.dtype.is_floating_point() && matches!(ext.2, Fill::Random) {
                ext.2 = Fill::NonNegative;
            }
        }
    }

    pub(super) fn op_ref(&mut self, schema: &OpSchema, text: &str) -> u32 {
        let (i, _) = self.ops.insert_full(OpRef {
            name: schema.name.clone(),
            overload: schema.overload.clone(),
            schema: text.to_string(),
        });
        i as u32
    }
}
