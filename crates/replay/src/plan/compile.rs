//! Compiling a replay set into a [`Plan`], one step per op.

use super::args::{build_arg, returns_view_of_first};
use super::collective::{collective_of, comms_seq, link_waits};
use super::fill::{
    consumer_fill, is_weight_like, needs_nonnegative, optimizer_decays, optimizer_state,
};
use super::slots::{arg_tensors, key_of, storage_region, Builder};
use super::*;
use std::collections::BTreeSet;

/// Which ops made an autograd graph node in the original. Under grad mode every op records the
/// thread's sequence counter, which moves on only when a node is made: so an op made one where
/// the next op of its thread outside its own subtree records a larger number, and, where none
/// does (the forward's last), where a backward record carries its number (autograd's
/// `XBackward0` records hold their forward op's, with the forward thread's id). Ops that made
/// none (no input required grad) leave their number to the next op.
pub(super) struct GraphNodes {
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

/// Compiles a replay set, without libtorch and for no device in particular. Ops that cannot
/// run (no schema, unsupported argument) are planned as failing steps with the reason; the run
/// goes on around them.
pub fn compile(g: &Graph, set: &ReplaySet) -> Plan {
    let mut c = Compiler::new(g, set.ops.len());
    for (step, &i) in set.ops.iter().enumerate() {
        c.step(step, i);
    }
    c.finish()
}

/// One compilation's state: the slots made so far and what the steps add up to.
struct Compiler<'g, 't> {
    b: Builder<'g, 't>,
    groups: Vec<GroupSpec>,
    graph_nodes: GraphNodes,
    steps: Vec<Step>,
    /// Float external inputs the replay makes require grad.
    grad_inputs: BTreeSet<Slot>,
    /// For a trace that recorded no graph (inference): the float external inputs an op reads
    /// as a weight or bias (directly or through views of them)...
    weight_like: BTreeSet<Slot>,
    /// ...and each view's root slot.
    view_root: HashMap<Slot, Slot>,
    restored: Vec<Restored>,
    /// (step, external) of the optimizer decays the trace does not record.
    decays: Vec<(usize, usize)>,
    /// The tensors autograd accumulates into parameters (each `AccumulateGrad` node's input)
    /// by key, with that node's id; and, keyed by each of those keys, each slot a step made
    /// under it, with the step's node id. Keys are reused along a trace, so a gradient is the
    /// slot its key named last before its `AccumulateGrad`.
    accumulated: Vec<(u64, TensorKey)>,
    made_under: HashMap<TensorKey, Vec<(u64, Slot)>>,
}

/// The op being compiled: its step, node index, name and schema.
struct OpAt<'a> {
    step: usize,
    node: u32,
    name: &'a str,
    schema: &'a OpSchema,
}

/// What one op's recorded inputs compiled to.
#[derive(Default)]
struct Inputs {
    op: Option<u32>,
    args: Vec<Arg>,
    /// Why the step cannot run, if it cannot.
    problem: Option<String>,
    /// The tensor versions the op read, with their slots (an output of the same key is the
    /// input written in place).
    keys: Vec<(TensorKey, Slot)>,
}

/// What one op's recorded outputs compiled to.
#[derive(Default)]
struct Outputs {
    outs: Vec<Out>,
    specs: Vec<(Slot, TensorSpec)>,
    /// (input slot, output slot) of tensors written in place.
    passthrough: Vec<(Slot, Slot)>,
}

impl<'g, 't> Compiler<'g, 't> {
    fn new(g: &'g Graph<'t>, n_steps: usize) -> Self {
        let t = g.trace;
        let accumulated = accumulated_grads(t);
        Compiler {
            b: Builder {
                g,
                current: HashMap::new(),
                n_slots: 0,
                externals: Vec::new(),
                external_index: HashMap::new(),
                last_use: Vec::new(),
                made_at: Vec::new(),
                slot_meta: Vec::new(),
                ops: indexmap::IndexSet::new(),
                written_over: HashMap::new(),
                by_storage: HashMap::new(),
                views: Vec::new(),
                producers: None,
                node: 0,
                step_of: HashMap::with_capacity(n_steps),
                first_rank: None,
                allocators: None,
                copies: Vec::new(),
                placed: Vec::new(),
                group: 0,
            },
            groups: process_groups(t),
            graph_nodes: GraphNodes::new(t),
            steps: Vec::with_capacity(n_steps),
            grad_inputs: BTreeSet::new(),
            weight_like: BTreeSet::new(),
            view_root: HashMap::new(),
            restored: Vec::new(),
            decays: Vec::new(),
            made_under: accumulated.iter().map(|&(_, k)| (k, Vec::new())).collect(),
            accumulated,
        }
    }

    /// Compiles the op at node index `i` as step `step`.
    fn step(&mut self, step: usize, i: u32) {
        let g = self.b.g;
        let t = g.trace;
        let node = &t.nodes[i as usize];
        self.b.node = i as usize;
        let name = t.name(node).to_string();
        let collective = g.class[i as usize].contains(OpClass::COLLECTIVE);
        let schema = g.schema[i as usize].clone();
        let coll = collective.then(|| {
            let mut c = collective_of(t, node, &name, &self.groups);
            c.seq = comms_seq(g, i);
            c
        });
        self.b.group = coll.as_ref().map_or(0, |c| c.group);
        let inputs = match &schema {
            None => Inputs {
                problem: Some(missing_schema(t, node, collective)),
                ..Inputs::default()
            },
            Some(s) => self.inputs(&OpAt {
                step,
                node: i,
                name: &name,
                schema: s,
            }),
        };
        let outputs = self.outputs(step, node, &inputs.keys);
        if !self.made_under.is_empty() {
            for a in t.outputs(node) {
                let Some(key) = key_of(t, a.value) else {
                    continue;
                };
                if let (Some(made), Some(&slot)) =
                    (self.made_under.get_mut(&key), self.b.current.get(&key))
                {
                    made.push((node.id, slot));
                }
            }
        }
        self.note_copy(&name, schema.as_deref(), &inputs.args, &outputs.outs);
        let autograd = node.seq_id.is_some_and(|s| s >= 0) && !collective;
        if let (true, Some(s)) = (autograd, &schema) {
            self.note_grad_inputs(i, s, &inputs.args);
        }
        if let Some(s) = &schema {
            self.note_views_and_weights(s, &inputs.args, &outputs.outs);
        }
        let kind = match coll {
            Some(c) => StepKind::Collective(Box::new(with_bytes(t, node, c))),
            None => StepKind::Compute,
        };
        self.steps.push(Step {
            node: i,
            id: node.id,
            name,
            kind,
            op: inputs.op,
            problem: inputs.problem,
            args: inputs.args,
            outs: outputs.outs,
            out_specs: outputs.specs,
            frees: Vec::new(),
            passthrough: outputs.passthrough,
            autograd,
            autocast: None,
            views: std::mem::take(&mut self.b.views),
        });
        self.b.step_of.insert(i, step);
        self.b.first_rank.get_or_insert(g.rank[i as usize]);
    }

    /// The op's arguments by its schema: each recorded input built into an [`Arg`] (what its
    /// external inputs are filled with adjusted to this consumer), the schema's default where
    /// the trace recorded fewer, and the first problem met.
    fn inputs(&mut self, op: &OpAt) -> Inputs {
        let (step, s) = (op.step, op.schema);
        let t = self.b.g.trace;
        let node = &t.nodes[op.node as usize];
        let recorded = t.inputs(node);
        let mut out = Inputs {
            op: Some(self.b.op_ref(s, t.op_schema_str(node).unwrap_or_default())),
            ..Inputs::default()
        };
        // Externals made so far: those an argument adds are first read by this op.
        let mut external_count = self.b.externals.len();
        for (k, sa) in s.args.iter().enumerate() {
            match recorded.get(k) {
                Some(a) => match build_arg(&mut self.b, step, &sa.ty, a) {
                    Ok(arg) => {
                        let first_read_here = external_count..self.b.externals.len();
                        external_count = self.b.externals.len();
                        let arg = self.consumed(op, k, arg, first_read_here);
                        out.args.push(arg);
                    }
                    Err(e) => {
                        out.problem.get_or_insert(format!(
                            "argument {k} ({}): {e}",
                            sa.name.as_deref().unwrap_or("?")
                        ));
                    }
                },
                None if sa.default.is_some() => out.args.push(Arg::Default(k)),
                None => {
                    out.problem.get_or_insert(format!(
                        "the trace records {} inputs, the schema needs argument {k}",
                        recorded.len()
                    ));
                }
            }
        }
        for a in recorded {
            for (v, _) in arg_tensors(t, a) {
                if let Some(key) = key_of(t, v) {
                    if let Some(&s) = self.b.current.get(&key) {
                        out.keys.push((key, s));
                    }
                }
            }
        }
        out
    }

    /// Argument `k` of the op as this consumer needs it: its external inputs' fills adjusted
    /// (non-negative, a consumer's constraint, optimizer state), an optimizer decay noted, a
    /// scalar the trace recorded rounded restored.
    fn consumed(
        &mut self,
        op: &OpAt,
        k: usize,
        arg: Arg,
        first_read_here: std::ops::Range<usize>,
    ) -> Arg {
        let (step, i, name, s) = (op.step, op.node, op.name, op.schema);
        let g = self.b.g;
        let t = g.trace;
        let node = &t.nodes[i as usize];
        let sa = &s.args[k];
        if needs_nonnegative(name, sa.name.as_deref()) {
            for s in arg.slots() {
                self.b.mark_nonnegative(s);
            }
        }
        if let (Some(n), Arg::Tensor(slot)) = (&sa.name, &arg) {
            if let Some(fill) = consumer_fill(name, n, t.inputs(node), t.outputs(node), t, s) {
                if let Some(e) = self.b.external_of(*slot) {
                    let ext = &self.b.externals[e].1;
                    if ext.dtype.is_integral()
                        || matches!(fill, Fill::Value(_) | Fill::Probability | Fill::Sorted(_))
                    {
                        self.b.externals[e].2 = fill;
                    }
                }
            }
        }
        let in_step = || {
            g.ancestors(i)
                .any(|a| t.name(&t.nodes[a as usize]).starts_with("Optimizer.step"))
        };
        // A decay an optimizer multiplies its state by in place (`buf.mul_(momentum)`,
        // `exp_avg_sq.mul_(beta2)`), passed as a Python number: a wrapped 0-dim double whose
        // value neither the trace nor Kineto records. Chosen once the whole plan is built
        // (`optimizer_decays`).
        if let (true, Some("other"), Arg::Tensor(slot)) =
            (name == "aten::mul_", sa.name.as_deref(), &arg)
        {
            if let Some(e) = self.b.external_of(*slot) {
                let ext = &self.b.externals[e];
                if ext.1.shape.is_empty()
                    && ext.1.dtype == DType::Float64
                    && ext.2 == Fill::Value(1.0)
                    && in_step()
                {
                    self.decays.push((step, e));
                }
            }
        }
        if !first_read_here.is_empty() && in_step() {
            optimizer_state(&mut self.b.externals[first_read_here]);
        }
        match restore_rounded(name, sa, arg, in_step) {
            (arg, Some((value, why))) => {
                self.restored.push(Restored {
                    step,
                    arg: sa.name.clone().unwrap_or_else(|| k.to_string()),
                    value,
                    why,
                });
                arg
            }
            (arg, None) => arg,
        }
    }

    /// Outputs: each trace output value becomes a new slot (a new version of its key).
    fn outputs(
        &mut self,
        step: usize,
        node: &et_schema::Node,
        input_keys: &[(TensorKey, Slot)],
    ) -> Outputs {
        let t = self.b.g.trace;
        let b = &mut self.b;
        let mut out = Outputs::default();
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
                    out.passthrough.push((prev, s));
                    b.written_over.insert(s, prev);
                }
                b.current.insert(key, s);
                if let (Some(r), Some(spec)) = (storage_region(t, v), &spec) {
                    b.by_storage.insert(r, (s, spec.strides.clone()));
                }
                if let Some(spec) = spec {
                    out.specs.push((s, spec));
                }
                slots.push(Some(s));
            }
            out.outs.push(match (is_list, slots.as_slice()) {
                (false, [Some(s)]) => Out::Tensor(*s),
                (false, _) => Out::Ignore,
                (true, _) => Out::List(slots),
            });
        }
        out
    }

    /// A copy has its source's values: a consumer's constraint on them reaches the external
    /// input they were copied from (lengths made int64 by `to` before `pack_padded_sequence`).
    /// So has a view of all its input's elements (`unsqueeze`, `view`, `t`: the schema's
    /// first return aliases its first argument, not written), whatever its shape: the norm
    /// `triplet_margin_loss` saved reaches `NormBackward1`'s divisor through an `unsqueeze`.
    /// Not a view of some elements (`select`, `expand`): a fill made for the view's shape
    /// (offsets, lengths) would not fit the input's.
    fn note_copy(&mut self, name: &str, schema: Option<&OpSchema>, args: &[Arg], outs: &[Out]) {
        let b = &mut self.b;
        if let (Some(Arg::Tensor(src)), Some(Out::Tensor(out))) = (args.first(), outs.first()) {
            let copy = matches!(
                name,
                "aten::to" | "aten::_to_copy" | "aten::clone" | "aten::contiguous" | "aten::detach"
            );
            let whole_view = || {
                let numel = |slot: Slot| {
                    b.slot_meta[slot as usize]
                        .as_ref()
                        .map(|(shape, _)| shape.iter().product::<i64>())
                };
                schema.is_some_and(returns_view_of_first)
                    && matches!((numel(*src), numel(*out)), (Some(a), Some(n)) if a == n)
            };
            if copy || whole_view() {
                b.written_over.entry(*out).or_insert(*src);
            }
        }
    }

    /// An op's float external inputs require grad only if it made a graph node: under grad
    /// mode every op records the sequence number, a node takes it. A float input that did not
    /// (a batch through `torch.relu` under grad mode, no parameter in sight) made to require
    /// grad had the replay build graph nodes the original did not: 1.5 µs more in each such op
    /// of 16 floats.
    fn note_grad_inputs(&mut self, i: u32, s: &OpSchema, args: &[Arg]) {
        if !self.graph_nodes.made(self.b.g, i) {
            return;
        }
        for (a, sa) in args.iter().zip(&s.args) {
            // Buffers a module updates without autograd (batch norm's running statistics).
            if matches!(
                sa.name.as_deref(),
                Some("running_mean" | "running_var" | "num_batches_tracked")
            ) {
                continue;
            }
            for s in a.slots() {
                if self.b.is_float_external(s) {
                    self.grad_inputs.insert(s);
                }
            }
        }
    }

    /// A view's output (the schema's first return aliases the first argument, not written:
    /// `split`, `t`, `transpose`, `expand`) has its input's root; a weight or bias argument
    /// names its root as the model's parameter.
    fn note_views_and_weights(&mut self, sch: &OpSchema, args: &[Arg], outs: &[Out]) {
        let Some(first) = args.first() else {
            return;
        };
        if let ([src], true) = (first.slots().as_slice(), returns_view_of_first(sch)) {
            let root = self.view_root.get(src).copied().unwrap_or(*src);
            let views: Vec<Slot> = outs.first().map(Out::slots).unwrap_or_default();
            for s in views {
                self.view_root.insert(s, root);
            }
        }
        for (a, sa) in args.iter().zip(&sch.args) {
            if sa.name.as_deref().is_some_and(is_weight_like) {
                for s in a.slots() {
                    let root = self.view_root.get(&s).copied().unwrap_or(s);
                    if self.b.is_float_external(root) {
                        self.weight_like.insert(root);
                    }
                }
            }
        }
    }

    /// The slots of the gradients autograd accumulated into parameters (each
    /// `torch::autograd::AccumulateGrad` node's input): `param.grad` held them after the
    /// backward, to the optimizer's step and past the iteration's end.
    fn gradients_held(&self) -> std::collections::HashSet<Slot> {
        self.accumulated
            .iter()
            .filter_map(|(at, key)| {
                self.made_under
                    .get(key)?
                    .iter()
                    .rev()
                    .find(|(id, _)| id < at)
                    .map(|&(_, slot)| slot)
            })
            .collect()
    }

    /// The plan from the compiled steps: grad inputs settled, waits paired, optimizer decays
    /// chosen, frees placed, autocast read off the dtypes.
    fn finish(mut self) -> Plan {
        let t = self.b.g.trace;
        // An inference trace (no op recorded a graph node) still ran on a model whose
        // parameters require grad (`nn.Parameter` under `torch.no_grad()`), and kernels read
        // that flag: `matmul` folds a batched input into one `mm` when an operand requires
        // grad, and runs a `bmm` otherwise (attention pooling's key projection, a [24, 4, 64]
        // input with a split of `in_proj_weight`: 19 us folded, 41-54 us as a bmm, called
        // alone). The replay runs those steps with grad mode off, so the flag builds no graph.
        if !self.steps.iter().any(|s| s.autograd) {
            self.grad_inputs
                .extend(std::mem::take(&mut self.weight_like));
        }
        link_waits(&mut self.steps);
        optimizer_decays(&self.steps, &self.decays, &mut self.b.externals);
        // Frees at last use, except external inputs, which persist across iterations
        // (parameters and optimizer state carry their in-place updates into the next
        // iteration), and parameters' gradients made in the iteration, which the original
        // held in `.grad` past its end: they go with the iteration's last step.
        let n = self.steps.len();
        let held = self.gradients_held();
        for (slot, &last) in self.b.last_use.iter().enumerate() {
            if !self.b.external_index.contains_key(&(slot as u32)) && last < n {
                let at = if held.contains(&(slot as u32)) {
                    n - 1
                } else {
                    last
                };
                self.steps[at].frees.push(slot as u32);
            }
        }
        let graph_releases = graph_releases(self.b.g, &self.steps);
        // A value made inside a composite is copied before the step after the composite's; but
        // where the composite recorded a graph, the graph holds the replay's own value until
        // it is let go, and a copy made before that held both (lstm_train at 1.55 of the
        // original's peak): it is made after the release. First among the step's views, which
        // may read it.
        let mut first: Vec<Vec<View>> = vec![Vec::new(); self.steps.len()];
        for (producer, consumer, view) in std::mem::take(&mut self.b.copies) {
            let released = graph_releases
                .iter()
                .find(|&&r| r >= producer)
                .filter(|_| self.steps[producer].autograd);
            let at = released
                .map_or(producer, |&r| r)
                .saturating_add(1)
                .min(consumer);
            first[at].push(view);
        }
        // Values made again after their composite's step (no copy reads them).
        for (at, view) in std::mem::take(&mut self.b.placed) {
            first[at].push(view);
        }
        for (step, mut views) in self.steps.iter_mut().zip(first) {
            if !views.is_empty() {
                views.append(&mut step.views);
                step.views = views;
            }
        }
        let mut plan = Plan {
            graph_releases,
            restored: self.restored,
            version: Plan::VERSION,
            source: t.source.clone(),
            ops: self.b.ops.into_iter().collect(),
            steps: self.steps,
            n_slots: self.b.n_slots as usize,
            externals: self.b.externals,
            grad_inputs: self.grad_inputs.into_iter().collect(),
            groups: self.groups,
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
}

/// The steps after which a backward op comes before any step that records into the autograd
/// graph: each forward's last recorded step, where the graph it built is no longer grown.
fn graph_releases(g: &Graph, steps: &[Step]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut backward_next = false;
    for (pos, st) in steps.iter().enumerate().rev() {
        let backward = g
            .class
            .get(st.node as usize)
            .is_some_and(|c| c.contains(OpClass::BACKWARD));
        if backward {
            backward_next = true;
        } else if st.autograd {
            if backward_next {
                out.push(pos);
            }
            backward_next = false;
        }
    }
    out.reverse();
    out
}

/// Why an op without a usable schema cannot run.
fn missing_schema(t: &Trace, node: &et_schema::Node, collective: bool) -> String {
    if collective {
        "collective without an op schema".into()
    } else if t.op_schema_str(node).is_some() {
        "the trace's op schema does not parse".into()
    } else {
        "no op schema in the trace".into()
    }
}

/// A collective with the bytes of its recorded input tensors, and its message size as
/// nccl-tests counts it ([`Collective::size_bytes`]).
fn with_bytes(t: &Trace, node: &et_schema::Node, mut c: Collective) -> Collective {
    let bytes = |a: &et_schema::Arg| -> u64 {
        arg_tensors(t, a)
            .into_iter()
            .filter_map(|(_, spec)| spec)
            .map(|s| s.shape.iter().product::<i64>().max(0) as u64 * s.dtype.size_bytes() as u64)
            .sum()
    };
    c.bytes = t.inputs(node).iter().map(bytes).sum();
    // The largest argument, input or output: an all-gather's output list (or the output of a
    // functional all-gather), a reduce-scatter's input list, an all-reduce's one buffer.
    c.size_bytes = t
        .inputs(node)
        .iter()
        .chain(t.outputs(node))
        .map(bytes)
        .max()
        .unwrap_or(0);
    c
}

/// Each `torch::autograd::AccumulateGrad` node's id and its input's key: the gradients autograd
/// accumulated into parameters.
fn accumulated_grads(t: &et_schema::Trace) -> Vec<(u64, TensorKey)> {
    t.nodes
        .iter()
        .filter(|n| t.name(n) == "torch::autograd::AccumulateGrad")
        .filter_map(|n| Some((n.id, key_of(t, t.inputs(n).first()?.value)?)))
        .collect()
}
