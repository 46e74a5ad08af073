//! The trace as a graph: call tree, execution order, op classes, the replay set, tensor
//! versions and data dependencies.

use crate::class::{classify, OpClass};
use et_schema::{OpSchema, Trace};
use std::collections::HashMap;
use std::fmt;

/// Why a node is not in the replay set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Skip {
    /// The process/thread root.
    Root,
    /// A record_function annotation: it runs no operator itself.
    Annotation,
    /// Inside an op that is replayed (the op runs it).
    CoveredBy(u64),
    /// Outside the chosen iteration window.
    OutsideIteration,
    /// Excluded by a selection.
    NotSelected,
}

impl fmt::Display for Skip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Skip::Root => f.write_str("process/thread root"),
            Skip::Annotation => f.write_str("annotation"),
            Skip::CoveredBy(id) => write!(f, "covered by parent op {id}"),
            Skip::OutsideIteration => f.write_str("outside iteration"),
            Skip::NotSelected => f.write_str("not selected"),
        }
    }
}

/// A tensor as et-graph keys it: (tensor id, storage id). Ids are reused after free, so a key
/// has versions; storage id 0 means no storage.
pub type TensorKey = (u64, u64);

/// The graph over one trace. Node indices are positions in `trace.nodes`.
pub struct Graph<'t> {
    /// The trace this graph is over.
    pub trace: &'t Trace,
    /// Node indices in execution order (by node id: ids are assigned on entry).
    pub order: Vec<u32>,
    /// Parent node index (`None` for roots).
    pub parent: Vec<Option<u32>>,
    /// Children node indices in execution order: `children[child_start[i]..child_start[i+1]]`.
    child_start: Vec<u32>,
    child_list: Vec<u32>,
    /// Each node's classes ([`OpClass`]).
    pub class: Vec<OpClass>,
    /// Parsed op schemas, per node (None when absent or unparsable).
    pub schema: Vec<Option<std::sync::Arc<OpSchema>>>,
    /// Execution rank of each node (position in `order`).
    pub rank: Vec<u32>,
    /// Nodes on a parent cycle, which only a trace read without validation has; empty when
    /// there are none. Walks up the tree stop when they come round.
    on_cycle: Vec<bool>,
}

impl<'t> Graph<'t> {
    /// Builds the call tree, execution order and classes of `trace`'s nodes.
    pub fn new(trace: &'t Trace) -> Graph<'t> {
        let n = trace.nodes.len();
        let index = trace.node_by_id();
        let mut order: Vec<u32> = (0..n as u32).collect();
        order.sort_by_key(|&i| trace.nodes[i as usize].id);
        let mut rank = vec![0u32; n];
        for (r, &i) in order.iter().enumerate() {
            rank[i as usize] = r as u32;
        }
        let parent: Vec<Option<u32>> = trace
            .nodes
            .iter()
            .map(|nd| {
                nd.parent
                    .filter(|&p| p != 0 && p != nd.id)
                    .and_then(|p| index.position(p))
                    .map(|i| i as u32)
            })
            .collect();
        // CSR children, in execution order.
        let mut counts = vec![0u32; n + 1];
        for p in parent.iter().flatten() {
            counts[*p as usize + 1] += 1;
        }
        for i in 0..n {
            counts[i + 1] += counts[i];
        }
        let mut fill = counts.clone();
        let mut child_list = vec![0u32; counts[n] as usize];
        for &i in &order {
            if let Some(p) = parent[i as usize] {
                child_list[fill[p as usize] as usize] = i;
                fill[p as usize] += 1;
            }
        }
        // Schemas are parsed once per distinct string.
        let mut cache: HashMap<et_schema::Sym, Option<std::sync::Arc<OpSchema>>> = HashMap::new();
        let schema: Vec<_> = trace
            .nodes
            .iter()
            .map(|nd| {
                nd.op_schema.and_then(|s| {
                    cache
                        .entry(s)
                        .or_insert_with(|| {
                            OpSchema::parse(trace.str(s)).ok().map(std::sync::Arc::new)
                        })
                        .clone()
                })
            })
            .collect();
        let mut class: Vec<OpClass> = trace
            .nodes
            .iter()
            .zip(&schema)
            .map(|(nd, s)| classify(trace, nd, s.as_deref()))
            .collect();
        // A namespaced record_function scope without a schema (`torch::distributed::reducer::
        // mul_out`) looks like an op by name; if an op with a schema runs inside it, it is a
        // scope, and the op inside is what a replay must run.
        let mut has_schema_child = vec![false; n];
        for (i, p) in parent.iter().enumerate() {
            if let Some(p) = p {
                if schema[i].is_some() || trace.op_schema_str(&trace.nodes[i]).is_some() {
                    has_schema_child[*p as usize] = true;
                }
            }
        }
        for i in 0..n {
            let c = class[i];
            let no_schema = trace.op_schema_str(&trace.nodes[i]).is_none();
            if c.contains(OpClass::OP)
                && no_schema
                && !c.intersects(OpClass::COLLECTIVE | OpClass::KERNEL)
                && has_schema_child[i]
            {
                class[i] = (c
                    - (OpClass::OP
                        | OpClass::ATEN
                        | OpClass::CUSTOM
                        | OpClass::VIEW
                        | OpClass::INPLACE))
                    | OpClass::ANNOTATION;
            }
        }
        // Backward-ness is inherited from ancestors (ops run by an autograd evaluate_function).
        for &i in &order {
            if let Some(p) = parent[i as usize] {
                if class[p as usize].contains(OpClass::BACKWARD) {
                    class[i as usize] |= OpClass::BACKWARD;
                }
            }
        }
        let on_cycle = nodes_on_cycles(&parent);
        Graph {
            trace,
            order,
            on_cycle,
            parent,
            child_start: counts,
            child_list,
            class,
            schema,
            rank,
        }
    }

    /// Nodes in the trace.
    pub fn len(&self) -> usize {
        self.trace.nodes.len()
    }

    /// Whether the trace has no nodes.
    pub fn is_empty(&self) -> bool {
        self.trace.nodes.is_empty()
    }

    /// Node `i`'s children, in execution order.
    pub fn children(&self, i: u32) -> &[u32] {
        &self.child_list
            [self.child_start[i as usize] as usize..self.child_start[i as usize + 1] as usize]
    }

    /// Node `i`'s ancestors, nearest first, each once. On a parent cycle (a trace read without
    /// validation) the walk stops where it comes round: it yields the cycle's other nodes, and
    /// never `i` itself.
    pub fn ancestors(&self, i: u32) -> impl Iterator<Item = u32> + '_ {
        let on_cycle = |k: u32| self.on_cycle.get(k as usize).copied().unwrap_or(false);
        // The first node on a cycle the walk meets (`i` itself where it is on one): every node
        // after it was yielded once when the walk is back there.
        let mut entry = on_cycle(i).then_some(i);
        let mut next = self.parent[i as usize];
        std::iter::from_fn(move || {
            let p = next?;
            if entry == Some(p) {
                return None;
            }
            if entry.is_none() && on_cycle(p) {
                entry = Some(p);
            }
            next = self.parent[p as usize];
            Some(p)
        })
    }

    /// Node `i`'s id.
    pub fn id(&self, i: u32) -> u64 {
        self.trace.nodes[i as usize].id
    }

    /// Node `i`'s name.
    pub fn name(&self, i: u32) -> &str {
        self.trace.name(&self.trace.nodes[i as usize])
    }

    /// `ProfilerStep#N` annotations in execution order: (node index, N).
    pub fn iterations(&self) -> Vec<(u32, u64)> {
        self.order
            .iter()
            .filter(|&&i| self.class[i as usize].contains(OpClass::ITERATION))
            .filter_map(|&i| {
                self.name(i)
                    .strip_prefix("ProfilerStep#")
                    .and_then(|s| s.parse().ok())
                    .map(|n| (i, n))
            })
            .collect()
    }

    /// The `ProfilerStep#N` iterations holding `set`'s ops (each op's nearest step ancestor),
    /// in execution order: (node index, N). Ops of other threads hold none of their own.
    pub fn iterations_of(&self, set: &ReplaySet) -> Vec<(u32, u64)> {
        let steps = self.iterations();
        let is_step: std::collections::HashSet<u32> = steps.iter().map(|s| s.0).collect();
        let held: std::collections::HashSet<u32> = set
            .ops
            .iter()
            .filter_map(|&i| self.ancestors(i).find(|a| is_step.contains(a)))
            .collect();
        steps.into_iter().filter(|s| held.contains(&s.0)).collect()
    }

    /// Which thread each node ran on and how long scopes were open; see [`Threads`].
    pub fn threads(&self) -> Threads {
        Threads::new(self)
    }

    /// The replay set: outermost op nodes (no op ancestor), optionally only inside the given
    /// `ProfilerStep#N` iterations, in execution order; and the reason for every other node.
    ///
    /// An iteration holds the ops under its `ProfilerStep#N` node and the ops of other threads
    /// that ran while it was open (no `ProfilerStep` of their own, ids in its
    /// [`Threads::open_range`]): a training step's backward pass runs on the autograd engine's
    /// thread, outside the `ProfilerStep#N` node, but inside its window.
    pub fn replay_set(&self, iterations: Option<&[u64]>) -> ReplaySet {
        let n = self.len();
        let mut skip: Vec<Option<Skip>> = vec![None; n];
        let mut ops = Vec::new();
        let windows: Option<(Vec<u32>, Windows)> = iterations.map(|want| {
            let steps: Vec<u32> = self
                .iterations()
                .into_iter()
                .filter(|(_, k)| want.contains(k))
                .map(|(i, _)| i)
                .collect();
            let during = Windows::new(self, self.threads(), steps.iter().copied());
            (steps, during)
        });
        for &i in &self.order {
            let c = self.class[i as usize];
            let reason = if c.contains(OpClass::ROOT) {
                Some(Skip::Root)
            } else if let Some(p) = self
                .ancestors(i)
                .filter(|&a| self.class[a as usize].contains(OpClass::OP))
                .filter(|&a| !self.p2p_inside_p2p(i, a))
                .last()
            {
                Some(Skip::CoveredBy(self.id(p)))
            } else if !c.contains(OpClass::OP) {
                Some(Skip::Annotation)
            } else if let Some((steps, during)) = &windows {
                // Under a ProfilerStep: in if it is a chosen one. Under none: in if it ran on
                // another thread while a chosen one was open.
                let step = self
                    .ancestors(i)
                    .find(|&a| self.class[a as usize].contains(OpClass::ITERATION));
                let inside = match step {
                    Some(s) => steps.contains(&s),
                    None => during.contains(self, i),
                };
                if inside {
                    None
                } else {
                    Some(Skip::OutsideIteration)
                }
            } else {
                None
            };
            match reason {
                None => ops.push(i),
                Some(r) => skip[i as usize] = Some(r),
            }
        }
        ReplaySet { ops, skip }
    }
}

impl Graph<'_> {
    /// Whether node `i` and its op ancestor `a` are both point-to-point ops: then `i` is a call
    /// of its own, not part of `a` (see [`crate::summary::is_point_to_point`]).
    fn p2p_inside_p2p(&self, i: u32, a: u32) -> bool {
        let t = self.trace;
        crate::summary::is_point_to_point(t, &t.nodes[i as usize])
            && crate::summary::is_point_to_point(t, &t.nodes[a as usize])
    }
}

/// Marks the nodes on parent cycles; empty when there are none (a validated trace has none).
fn nodes_on_cycles(parent: &[Option<u32>]) -> Vec<bool> {
    // Each node has at most one parent: follow chains, colouring nodes (0 new, 1 on the current
    // chain, 2 done). A chain that comes back to a node of its own closes a cycle.
    let mut state = vec![0u8; parent.len()];
    let mut on_cycle = Vec::new();
    let mut chain = Vec::new();
    for start in 0..parent.len() {
        let mut i = start;
        while state[i] == 0 {
            state[i] = 1;
            chain.push(i);
            match parent[i] {
                Some(p) => i = p as usize,
                None => break,
            }
        }
        if state[i] == 1 && parent[i].is_some() {
            if on_cycle.is_empty() {
                on_cycle = vec![false; parent.len()];
            }
            let mut k = i;
            loop {
                on_cycle[k] = true;
                match parent[k] {
                    Some(p) if p as usize != i => k = p as usize,
                    _ => break,
                }
            }
        }
        for j in chain.drain(..) {
            state[j] = 2;
        }
    }
    on_cycle
}

/// Which thread each node ran on, and until when scopes were open, in node ids.
///
/// The observer numbers nodes on entry from one counter for the whole process, so node ids order
/// the nodes of all threads in time. A scope (an annotation such as `ProfilerStep#N` or
/// `## backward ##`) was open from its own id until just before the next node its thread entered
/// outside it (the end of the trace when its thread entered none); a node of another thread
/// entered in that range ran while it was open. That is how the backward pass relates to the
/// step that ran it: `loss.backward()` blocks inside `## backward ##` and `ProfilerStep#N` on the
/// main thread while the autograd engine runs the backward ops on a thread of its own, under its
/// own thread root.
pub struct Threads {
    /// The thread root of each node: its nearest root ancestor (the process root in traces
    /// without thread roots; a root is its own thread).
    thread: Vec<u32>,
    /// The largest node id in each node's subtree.
    last: Vec<u64>,
    /// Per thread root, the ids of its nodes in execution order.
    ids: HashMap<u32, Vec<u64>>,
}

impl Threads {
    fn new(g: &Graph) -> Threads {
        let n = g.len();
        let mut thread: Vec<u32> = (0..n as u32).collect();
        let mut last: Vec<u64> = (0..n as u32).map(|i| g.id(i)).collect();
        // Parents before children, from every node without a parent (nodes on a parent cycle,
        // which validation refuses, stay their own thread).
        let mut down: Vec<u32> = g
            .order
            .iter()
            .copied()
            .filter(|&i| g.parent[i as usize].is_none())
            .collect();
        let mut k = 0;
        while k < down.len() {
            let i = down[k];
            if !g.class[i as usize].contains(OpClass::ROOT) {
                if let Some(p) = g.parent[i as usize] {
                    thread[i as usize] = thread[p as usize];
                }
            }
            down.extend_from_slice(g.children(i));
            k += 1;
        }
        for &i in down.iter().rev() {
            if let Some(p) = g.parent[i as usize] {
                last[p as usize] = last[p as usize].max(last[i as usize]);
            }
        }
        let mut ids: HashMap<u32, Vec<u64>> = HashMap::new();
        for &i in &g.order {
            if thread[i as usize] != i {
                ids.entry(thread[i as usize]).or_default().push(g.id(i));
            }
        }
        Threads { thread, last, ids }
    }

    /// The thread root node `i` ran under.
    pub fn thread(&self, i: u32) -> u32 {
        self.thread[i as usize]
    }

    /// The node ids entered while node `i` was open: from its own id to just before the next
    /// node its thread entered outside it, or to `u64::MAX` when its thread entered none.
    pub fn open_range(&self, g: &Graph, i: u32) -> std::ops::RangeInclusive<u64> {
        let end = self.ids.get(&self.thread(i)).and_then(|ids| {
            let after = ids.partition_point(|&x| x <= self.last[i as usize]);
            ids.get(after).map(|&next| next - 1)
        });
        g.id(i)..=end.unwrap_or(u64::MAX)
    }
}

/// The id ranges during which some scopes were open, per thread, merged: a node of another
/// thread inside one ran while that scope was open.
pub(crate) struct Windows {
    /// Per thread root, disjoint sorted (first, last) id ranges.
    ranges: Vec<(u32, Vec<(u64, u64)>)>,
    threads: Threads,
}

impl Windows {
    pub(crate) fn new(g: &Graph, threads: Threads, scopes: impl Iterator<Item = u32>) -> Windows {
        let mut per: HashMap<u32, Vec<(u64, u64)>> = HashMap::new();
        for s in scopes {
            let r = threads.open_range(g, s);
            per.entry(threads.thread(s))
                .or_default()
                .push((*r.start(), *r.end()));
        }
        let ranges = per
            .into_iter()
            .map(|(t, mut v)| {
                v.sort_unstable();
                let mut merged: Vec<(u64, u64)> = Vec::with_capacity(v.len());
                for (a, b) in v {
                    match merged.last_mut() {
                        Some(m) if a <= m.1 => m.1 = m.1.max(b),
                        _ => merged.push((a, b)),
                    }
                }
                (t, merged)
            })
            .collect();
        Windows { ranges, threads }
    }

    /// Whether node `i` was entered, on another thread, while one of the scopes was open.
    pub(crate) fn contains(&self, g: &Graph, i: u32) -> bool {
        let (t, id) = (self.threads.thread(i), g.id(i));
        self.ranges.iter().any(|(st, v)| {
            *st != t && {
                let k = v.partition_point(|r| r.1 < id);
                v.get(k).is_some_and(|r| r.0 <= id)
            }
        })
    }
}

/// The operators a replay runs once per iteration, in execution order.
#[derive(Clone, Debug)]
pub struct ReplaySet {
    /// The ops' node indices, in execution order.
    pub ops: Vec<u32>,
    /// For every node not in `ops`, why.
    pub skip: Vec<Option<Skip>>,
}

impl ReplaySet {
    /// Why `node` is not in the set; `None` for the set's ops.
    pub fn reason(&self, node: u32) -> Option<&Skip> {
        self.skip[node as usize].as_ref()
    }

    /// Counts of skip reasons, by kind.
    pub fn skip_counts(&self) -> std::collections::BTreeMap<&'static str, usize> {
        let mut m = std::collections::BTreeMap::new();
        for s in self.skip.iter().flatten() {
            let k = match s {
                Skip::Root => "root",
                Skip::Annotation => "annotation",
                Skip::CoveredBy(_) => "covered by parent op",
                Skip::OutsideIteration => "outside iteration",
                Skip::NotSelected => "not selected",
            };
            *m.entry(k).or_default() += 1;
        }
        m
    }
}

/// A data dependency between two replay-set ops (positions in `ReplaySet::ops`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataEdge {
    /// The op that produced (or last wrote) the tensor.
    pub from: u32,
    /// The op that reads it.
    pub to: u32,
    /// The tensor.
    pub tensor: TensorKey,
    /// The edge follows the storage rather than this tensor version's producer: a read after
    /// an in-place write to another view of the same storage, or a read of the bytes an op
    /// wrote under another tensor id (autograd's saved outputs are new tensors).
    pub via_storage: bool,
}

/// Tensor facts over a replay set.
#[derive(Clone, Debug, Default)]
pub struct TensorTable {
    /// Per tensor key, in first-seen order: facts of its first version.
    pub tensors: indexmap::IndexMap<TensorKey, TensorInfo>,
    /// The data dependencies between the set's ops.
    pub edges: Vec<DataEdge>,
    /// Estimated live bytes after each op of the replay set, per device.
    pub peak_bytes: std::collections::BTreeMap<String, u64>,
    /// Position in the replay set where each device's peak occurs.
    pub peak_at: std::collections::BTreeMap<String, u32>,
}

/// What a replay set does with one tensor, and what it is.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// The tensor.
    pub key: TensorKey,
    /// Read before any op of the set produced it, and not over bytes of a storage already
    /// produced or read under another id: an input the replay must supply.
    pub external: bool,
    /// First replay-set position that uses it (read or write).
    pub first_use: u32,
    /// Last replay-set position that uses it.
    pub last_use: u32,
    /// Number of elements.
    pub numel: u64,
    /// Bytes per element.
    pub itemsize: u64,
    /// Offset into its storage (elements).
    pub offset: u64,
    /// Its device (`cpu`, `cuda:0`).
    pub device: String,
    /// How many times an op produced (or wrote in place) a new version of it.
    pub versions: u32,
}

impl TensorTable {
    /// The external inputs ([`TensorInfo::external`]).
    pub fn externals(&self) -> impl Iterator<Item = &TensorInfo> {
        self.tensors.values().filter(|t| t.external)
    }

    /// Tensors grouped by the storage they view: groups of more than one are aliases (views of
    /// one allocation), which a replay must materialise as one storage.
    pub fn alias_groups(&self) -> std::collections::BTreeMap<(u64, &str), Vec<TensorKey>> {
        let mut m: std::collections::BTreeMap<(u64, &str), Vec<TensorKey>> = Default::default();
        for t in self.tensors.values() {
            m.entry((t.key.1, t.device.as_str()))
                .or_default()
                .push(t.key);
        }
        m
    }
}

fn tensors_of(t: &Trace, args: &[et_schema::Arg], out: &mut Vec<u32>) {
    out.clear();
    for a in args {
        t.tensors_in(a.value, out);
    }
}

impl Graph<'_> {
    /// The tensors output by ops outside `set` and outside every op of it (ops a selection left
    /// out; none where the set is the whole replay set), each with the places in execution
    /// order (indices into `order`) where such an op output it.
    fn outputs_outside(&self, set: &ReplaySet) -> HashMap<TensorKey, Vec<u32>> {
        let t = self.trace;
        let mut covered = vec![false; self.len()];
        let mut stack: Vec<u32> = set.ops.clone();
        while let Some(i) = stack.pop() {
            if !std::mem::replace(&mut covered[i as usize], true) {
                stack.extend_from_slice(self.children(i));
            }
        }
        let mut out: HashMap<TensorKey, Vec<u32>> = HashMap::new();
        let mut tensors = Vec::new();
        for (at, &i) in self.order.iter().enumerate() {
            if covered[i as usize] || !self.class[i as usize].contains(OpClass::OP) {
                continue;
            }
            tensors_of(t, t.outputs(&t.nodes[i as usize]), &mut tensors);
            for &ti in &tensors {
                let x = t.tensor(ti);
                out.entry((x.id, x.storage)).or_default().push(at as u32);
            }
        }
        out
    }

    /// Tensor versions, data edges, external inputs, lifetimes and live bytes over a replay set.
    pub fn tensors(&self, set: &ReplaySet) -> TensorTable {
        let t = self.trace;
        let mut table = TensorTable::default();
        // Current version of each key: the producing op position (None = external).
        let mut current: HashMap<TensorKey, Option<u32>> = HashMap::new();
        // Last in-place writer of each storage, so views of one storage order after writes.
        let mut storage_writer: HashMap<u64, u32> = HashMap::new();
        // Per storage, the last op of the set that allocated or wrote it (None: read as an
        // input), the bytes known there, their element size (a storage id met again with
        // another dtype is a new allocation at a reused address), and since when they are
        // known (that op, or the first read of the input).
        let mut known: HashMap<u64, (Option<u32>, u64, u64, u32)> = HashMap::new();
        // Tensors an op outside the set made (an op the selection left out, not one nested in
        // the set's): read by the set over bytes known since one of its ops wrote them or read
        // them as an input, and made outside after that, they are inputs of their own (the
        // storage id was reused for other data). Made before (a persistent buffer another
        // iteration also wrote, another iteration's version of a weight), they are the data
        // known there: the write's, or the input's storage, which the replay allocates once.
        let outside = self.outputs_outside(set);
        let mut order_of = vec![0u32; self.len()];
        for (at, &i) in self.order.iter().enumerate() {
            order_of[i as usize] = at as u32;
        }
        let at = |pos: u32| order_of[set.ops[pos as usize] as usize];
        let made_outside_between = |key: &TensorKey, after: u32, before: u32| {
            outside
                .get(key)
                .is_some_and(|v| v.iter().any(|&o| o > at(after) && o < at(before)))
        };
        let (mut ins, mut outs) = (Vec::new(), Vec::new());
        for (pos, &i) in set.ops.iter().enumerate() {
            let pos = pos as u32;
            let node = &t.nodes[i as usize];
            let inplace = self.class[i as usize].contains(OpClass::INPLACE);
            tensors_of(t, t.inputs(node), &mut ins);
            tensors_of(t, t.outputs(node), &mut outs);
            let touch = |x: &et_schema::TensorRef, table: &mut TensorTable, external: bool| {
                let key = (x.id, x.storage);
                let e = table.tensors.entry(key).or_insert_with(|| TensorInfo {
                    key,
                    external,
                    first_use: pos,
                    last_use: pos,
                    numel: x.numel,
                    itemsize: x.itemsize,
                    offset: x.offset,
                    device: x.device.map_or(String::new(), |d| t.str(d).to_string()),
                    versions: 0,
                });
                e.last_use = pos;
            };
            for &ti in &ins {
                let x = t.tensor(ti);
                if x.storage == 0 {
                    continue;
                }
                let key = (x.id, x.storage);
                match current.get(&key) {
                    Some(Some(p)) => {
                        if *p != pos {
                            table.edges.push(DataEdge {
                                from: *p,
                                to: pos,
                                tensor: key,
                                via_storage: false,
                            });
                        }
                        touch(x, &mut table, false);
                    }
                    Some(None) => touch(x, &mut table, true),
                    None => match known
                        .get(&x.storage)
                        .filter(|k| !made_outside_between(&key, k.3, pos))
                    {
                        // A tensor under a new id over bytes an earlier op of the set wrote, or
                        // an input already read: the same data (autograd's saved outputs are
                        // new tensors, and so is a weight's alias taken outside the set), not
                        // another input to supply.
                        Some(&(w, bytes, size, _))
                            if size == x.itemsize && (x.offset + x.numel) * x.itemsize <= bytes =>
                        {
                            current.insert(key, w);
                            if let Some(w) = w.filter(|&w| w != pos) {
                                table.edges.push(DataEdge {
                                    from: w,
                                    to: pos,
                                    tensor: key,
                                    via_storage: true,
                                });
                            }
                            touch(x, &mut table, false);
                        }
                        _ => {
                            current.insert(key, None);
                            let bytes = (x.offset + x.numel) * x.itemsize;
                            let e = known.entry(x.storage).or_insert((None, 0, x.itemsize, pos));
                            if e.0.is_none() && e.2 == x.itemsize {
                                e.1 = e.1.max(bytes);
                            } else {
                                *e = (None, bytes, x.itemsize, pos);
                            }
                            touch(x, &mut table, true);
                        }
                    },
                }
                if let Some(&w) = storage_writer.get(&x.storage) {
                    if w != pos
                        && !table
                            .edges
                            .last()
                            .is_some_and(|e| e.from == w && e.to == pos)
                    {
                        table.edges.push(DataEdge {
                            from: w,
                            to: pos,
                            tensor: key,
                            via_storage: true,
                        });
                    }
                }
            }
            for &ti in &outs {
                let x = t.tensor(ti);
                if x.storage == 0 {
                    continue;
                }
                let key = (x.id, x.storage);
                let was_input = ins.iter().any(|&j| {
                    let y = t.tensor(j);
                    (y.id, y.storage) == key
                });
                touch(x, &mut table, false);
                if let Some(info) = table.tensors.get_mut(&key) {
                    info.versions += 1;
                }
                current.insert(key, Some(pos));
                // An output over a storage the op also read (in place, or a view of an input)
                // writes into what was there: the bytes known stay. Otherwise the op allocated
                // it anew, and only its outputs are known there.
                let bytes = (x.offset + x.numel) * x.itemsize;
                let into_input = ins.iter().any(|&j| t.tensor(j).storage == x.storage);
                let e = known
                    .entry(x.storage)
                    .or_insert((Some(pos), 0, x.itemsize, pos));
                let kept = if e.0 == Some(pos) || into_input {
                    e.1
                } else {
                    0
                };
                *e = (Some(pos), kept.max(bytes), x.itemsize, pos);
                if inplace || was_input {
                    storage_writer.insert(x.storage, pos);
                }
            }
        }
        // Live bytes: storages live from first to last use; external ones from the start.
        let mut storages: HashMap<(u64, &str), (u32, u32, u64)> = HashMap::new();
        for info in table.tensors.values() {
            let e = storages
                .entry((info.key.1, info.device.as_str()))
                .or_insert((u32::MAX, 0, 0));
            let first = if info.external { 0 } else { info.first_use };
            e.0 = e.0.min(first);
            e.1 = e.1.max(info.last_use);
            e.2 = e.2.max((info.offset + info.numel) * info.itemsize);
        }
        let n = set.ops.len();
        let mut delta: HashMap<&str, Vec<i64>> = HashMap::new();
        for (&(_, dev), &(a, b, bytes)) in &storages {
            let d = delta.entry(dev).or_insert_with(|| vec![0; n + 1]);
            d[a as usize] += bytes as i64;
            d[(b as usize + 1).min(n)] -= bytes as i64;
        }
        for (dev, d) in delta {
            let (mut cur, mut peak, mut at) = (0i64, 0i64, 0u32);
            for (k, x) in d.iter().enumerate().take(n) {
                cur += x;
                if cur > peak {
                    peak = cur;
                    at = k as u32;
                }
            }
            table.peak_bytes.insert(dev.to_string(), peak as u64);
            table.peak_at.insert(dev.to_string(), at);
        }
        table
    }
}
