//! A captured job at another world size: the rank traces of the job with its data-parallel
//! dimension grown to `N` ranks, synthesised from the ranks that were captured.
//!
//! The job's process groups give its ranks' layout ([`layout`]): the world, or a grid of
//! parallel dimensions (a device mesh's `mesh_dp` and `mesh_tp` groups), one of them data
//! parallel. A new rank is made from the captured rank at the same place in the other
//! dimensions (its data-parallel place the capture's last where the capture had fewer); the
//! groups are made again for `N` (the data-parallel groups and the world grown, the others
//! kept, more of them), and each collective follows its group by its kind: all-reduce,
//! broadcast, reduce and barrier keep their bytes; all-gather outputs and gather, scatter,
//! reduce-scatter and list all-to-all parts are one per group rank; the flat all-gather's
//! output and reduce-scatter's input scale their first dimension; all-to-all splits are
//! re-split evenly (the mean part over the capture's ranks and peers, the same on every rank);
//! send and receive peers keep their offset from the rank in its group. A per-rank output
//! buffer an op made right before an all-gather (a list of `torch.zeros` the model filled one
//! per rank), and the backend's copies into the parts after it, are made once per new part.
//! `record_param_comms` records (rank, group, sizes, splits) follow.
//!
//! Which group a collective runs on is read from its `pg_name` (on the node or on its
//! `record_param_comms` record, as NCCL traces record it). A job with subgroups whose
//! collectives do not name their group (PyTorch's Gloo traces name none), groups that do not
//! make a rank grid, a world that is not whole replicas of the other dimensions, a smaller
//! world, or a collective kind it does not know is refused by name.

mod layout;

pub use layout::GroupsScaled;
use layout::{Layout, Place};

use crate::Graph;
use et_schema::{Arg, Node, TensorRef, Trace, Value};
use std::collections::{BTreeMap, HashMap, HashSet};

/// Why a job cannot be scaled.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum WorldError {
    /// No trace was given.
    #[error("no traces")]
    Empty,
    /// A world of no rank.
    #[error("--world {0}: a world needs at least one rank")]
    Zero(usize),
    /// A process group that does not fit a layout of the ranks.
    #[error("process group {name:?} (ranks {ranks:?} of {world}): {why}")]
    Group {
        /// Its `pg_name`.
        name: String,
        /// Its ranks as recorded.
        ranks: Vec<i64>,
        /// The captured world size.
        world: usize,
        /// Why.
        why: String,
    },
    /// The ranks' layout does not scale as asked.
    #[error("{0}")]
    Layout(String),
    /// A world smaller than the capture's.
    #[error(
        "--world {world}: the capture has {captured} ranks; compose world writes larger worlds \
         (replay --ranks DIR --only comm --world N replays a job's communication on fewer)"
    )]
    Smaller {
        /// The world asked for.
        world: usize,
        /// The captured world.
        captured: usize,
    },
    /// A collective whose sizes or peers cannot follow the world size.
    #[error("{op} (node {id}, rank {rank}): {why}")]
    Collective {
        /// The op's name.
        op: String,
        /// Its node id.
        id: u64,
        /// The new rank being made.
        rank: usize,
        /// Why it cannot be scaled.
        why: String,
    },
}

/// A process group as `## process_group:init ##` records it (a JSON list in its first
/// input); other keys are kept as recorded.
#[derive(Clone, Debug, serde::Deserialize, serde::Serialize)]
pub struct PgInit {
    /// How collectives name the group.
    #[serde(default)]
    pub pg_name: String,
    /// `default_pg` for the world.
    #[serde(default)]
    pub pg_desc: String,
    /// E.g. `cpu:gloo,cuda:nccl`.
    #[serde(default)]
    pub backend_config: String,
    /// Global ranks in group-rank order; empty for the world.
    #[serde(default)]
    pub ranks: Vec<i64>,
    /// The group's size as recorded.
    #[serde(default)]
    pub group_size: i64,
    /// Other keys (`group_count`, ...).
    #[serde(flatten)]
    pub rest: serde_json::Map<String, serde_json::Value>,
}

/// The process groups a trace recorded (`## process_group:init ##`), where it recorded them
/// in a form that reads.
pub fn process_group_records(t: &Trace) -> Option<Vec<PgInit>> {
    pg_init(t).map(|(_, g)| g)
}

/// One collective kind's bytes per rank before and after (a rank's sum over its calls).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct KindScaled {
    /// Its calls.
    pub calls: usize,
    /// Bytes of their tensor arguments in the captured rank's trace.
    pub bytes_before: u64,
    /// And in the new rank's.
    pub bytes_after: u64,
    /// How its sizes followed the world.
    pub how: &'static str,
}

/// What a scaling did, for one new rank.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Scaled {
    /// The captured rank it was made from.
    pub from: usize,
    /// Per collective kind (as the trace names it), its calls and bytes.
    pub by_kind: BTreeMap<String, KindScaled>,
    /// Ops made again for the new ranks' parts (per-rank output buffers).
    pub ops_added: usize,
}

/// The captured job: its traces in rank order and how its ranks lie.
pub struct Job<'t> {
    traces: &'t [Trace],
    layout: Layout,
    /// Per all-to-all-v of the iteration (in order), the part each rank sends each rank at
    /// any world size: the mean over the capture's ranks and peers, so that every new rank
    /// agrees with every other on what it receives.
    a2a_parts: Vec<Option<i64>>,
}

impl<'t> Job<'t> {
    /// The job of `traces` (rank order). `data_parallel` names its data-parallel groups (their
    /// `pg_desc`, or one's `pg_name`) where their description does not say so; a job without
    /// subgroups is data parallel over its world.
    pub fn new(traces: &'t [Trace], data_parallel: Option<&str>) -> Result<Job<'t>, WorldError> {
        if traces.is_empty() {
            return Err(WorldError::Empty);
        }
        let records: Vec<Vec<PgInit>> = traces
            .iter()
            .map(|t| pg_init(t).map(|(_, g)| g).unwrap_or_default())
            .collect();
        let layout = Layout::new(&records, traces.len(), data_parallel)?;
        Ok(Job {
            traces,
            layout,
            a2a_parts: a2a_parts(traces),
        })
    }

    /// The dimension sizes at world size `world` (innermost first), checked.
    fn sizes(&self, world: usize) -> Result<Vec<usize>, WorldError> {
        if world == 0 {
            return Err(WorldError::Zero(world));
        }
        if world < self.traces.len() {
            return Err(WorldError::Smaller {
                world,
                captured: self.traces.len(),
            });
        }
        self.layout.sizes_at(world)
    }

    /// The process groups before and after, per family (the world first).
    pub fn groups_scaled(&self, world: usize) -> Result<Vec<GroupsScaled>, WorldError> {
        Ok(self.layout.report(&self.sizes(world)?))
    }

    /// Rank `rank`'s trace at world size `world`, and what was scaled.
    pub fn rank_trace(&self, rank: usize, world: usize) -> Result<(Trace, Scaled), WorldError> {
        let sizes = self.sizes(world)?;
        let from = self.layout.template(rank, &sizes);
        let mut s = Synth {
            t: self.traces[from].clone(),
            rank,
            from,
            layout: &self.layout,
            sizes,
            scaled: Scaled {
                from,
                ..Default::default()
            },
            next_tensor: 0,
            next_storage: 0,
            a2a_parts: &self.a2a_parts,
            a2a_seen: 0,
            last_part: None,
        };
        s.init_ids();
        s.groups();
        s.collectives()?;
        Ok((s.t, s.scaled))
    }
}

/// Per `c10d::alltoall_base_` of the iteration (the k-th of every rank's), the mean rows a
/// rank sends a rank over the capture: every rank's rows sent, summed, over ranks x ranks.
/// `None` where the ranks do not hold the same number of them.
fn a2a_parts(traces: &[Trace]) -> Vec<Option<i64>> {
    // Per rank and call: the rows it sent, and its group's size (its splits' length; the
    // world where it recorded none).
    let per_rank: Vec<Vec<(i64, i64)>> = traces
        .iter()
        .map(|t| {
            let g = Graph::new(t);
            g.order
                .iter()
                .map(|&i| &t.nodes[i as usize])
                .filter(|n| t.name(n) == "c10d::alltoall_base_")
                .map(|n| {
                    let a = t.inputs(n);
                    let splits = a
                        .get(4)
                        .and_then(|x| t.int_list(x.value))
                        .unwrap_or_default();
                    if splits.is_empty() {
                        let rows = a
                            .get(1)
                            .and_then(|x| t.int_list(x.shape))
                            .and_then(|s| s.first().copied())
                            .unwrap_or(0);
                        (rows, traces.len() as i64)
                    } else {
                        (splits.iter().sum(), splits.len() as i64)
                    }
                })
                .collect()
        })
        .collect();
    let n = traces.len() as i64;
    let calls = per_rank.first().map_or(0, Vec::len);
    (0..calls)
        .map(|k| {
            let rows: Option<Vec<(i64, i64)>> =
                per_rank.iter().map(|r| r.get(k).copied()).collect();
            // Every rank sends each rank of its group the mean part: all rows sent over the
            // (sender, receiver) pairs.
            rows.map(|r| {
                let group = r.first().map_or(n, |x| x.1).max(1);
                r.iter().map(|x| x.0).sum::<i64>() / (n * group).max(1)
            })
        })
        .collect()
}

/// The `## process_group:init ##` node's index and its groups.
fn pg_init(t: &Trace) -> Option<(usize, Vec<PgInit>)> {
    let k = t
        .nodes
        .iter()
        .position(|n| t.name(n) == crate::summary::PROCESS_GROUP_INIT)?;
    let text = t.inputs(&t.nodes[k]).first().and_then(|a| match a.value {
        Value::Str(s) => Some(t.str(s).to_string()),
        _ => None,
    })?;
    let groups = serde_json::from_str(&text).ok()?;
    Some((k, groups))
}

/// A new part of a list: the captured part it copies, and its fresh tensor.
type Fresh = (TensorRef, TensorRef);

/// The synthesis of one rank's trace.
struct Synth<'j> {
    a2a_parts: &'j [Option<i64>],
    /// All-to-all-v calls re-split so far, and the last one's part (its record follows it).
    a2a_seen: usize,
    last_part: Option<i64>,
    t: Trace,
    rank: usize,
    from: usize,
    layout: &'j Layout,
    /// The grid's sizes at the new world.
    sizes: Vec<usize>,
    scaled: Scaled,
    next_tensor: u64,
    next_storage: u64,
}

/// A collective's group in the capture and at the new world size: its size in both, the
/// ranks' places in it, and its name now.
struct GroupShape {
    /// Its size in the capture, and the captured rank's group rank.
    n: usize,
    from: usize,
    /// Where it lies now (size, the new rank's group rank, its ranks, its name).
    now: Place,
    /// Its family; `None` for a group of every rank.
    family: Option<usize>,
}

impl Synth<'_> {
    fn init_ids(&mut self) {
        self.next_tensor = self.t.tensors.iter().map(|x| x.id).max().unwrap_or(0) + 1;
        self.next_storage = self.t.tensors.iter().map(|x| x.storage).max().unwrap_or(0) + 1;
    }

    /// The groups made again for the new world: each group the captured rank recorded is
    /// the new rank's group of the same family (the world, the data-parallel groups grown, the
    /// others as they were, at the new rank's place).
    fn groups(&mut self) {
        let Some((k, captured)) = pg_init(&self.t) else {
            return;
        };
        let count = self.layout.group_count(&self.sizes);
        let out: Vec<PgInit> = captured
            .iter()
            .map(|g| {
                let mut w = g.clone();
                let family = self.layout.family(&g.pg_name);
                let p = self.layout.place(family, self.rank, &self.sizes);
                if family.is_some() {
                    w.pg_name = p.name;
                }
                w.group_size = p.size as i64;
                if family.is_some() || !w.ranks.is_empty() {
                    w.ranks = (0..p.size)
                        .map(|j| (p.start + j * p.stride) as i64)
                        .collect();
                }
                if let Some(c) = w.rest.get_mut("group_count") {
                    *c = count.into();
                }
                w
            })
            .collect();
        let text = serde_json::to_string(&out).unwrap_or_default();
        let sym = self.t.strings.intern(&text);
        let start = self.t.nodes[k].inputs.start as usize;
        self.t.args[start].value = Value::Str(sym);
    }

    /// The group collective `n` names (`pg_name`), captured and new; an unnamed one runs on
    /// the world, where the job has no other group.
    fn group(&self, n: &Node, name: Option<&str>) -> Result<GroupShape, WorldError> {
        let family =
            match name {
                Some(x) if self.layout.is_world_name(x) => None,
                Some(x) => Some(self.layout.family(x).ok_or_else(|| {
                    self.fail(
                        n,
                        format!("it names process group {x:?}, which the job did not record"),
                    )
                })?),
                None if self.layout.has_subgroups() => return Err(self.fail(
                    n,
                    "it does not name its process group (pg_name) and the job has groups besides \
                     the world: which one it runs on is not recorded",
                )),
                None => None,
            };
        let was = self.layout.place(family, self.from, self.layout.dims());
        let mut now = self.layout.place(family, self.rank, &self.sizes);
        if let (None, Some(x)) = (family, name) {
            // A group of every rank keeps its name.
            now.name = x.to_string();
        }
        Ok(GroupShape {
            n: was.size,
            from: was.me,
            now,
            family,
        })
    }

    fn fail(&self, n: &Node, why: impl Into<String>) -> WorldError {
        WorldError::Collective {
            op: self.t.name(n).to_string(),
            id: n.id,
            rank: self.rank,
            why: why.into(),
        }
    }

    /// Every collective node's sizes and peers for the new world.
    fn collectives(&mut self) -> Result<(), WorldError> {
        let g = Graph::new(&self.t);
        // Collective nodes in execution order (outermost and the records nested in them).
        let order: Vec<u32> = g.order.clone();
        // Each collective node's group name: its own `pg_name`, its record's, or (a record)
        // its op's.
        let t = &self.t;
        let own = |k: u32| {
            t.extra_str(&t.nodes[k as usize], "pg_name")
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        };
        let pg: Vec<Option<String>> = (0..t.nodes.len() as u32)
            .map(|i| {
                let name = t.name(&t.nodes[i as usize]);
                if name != "record_param_comms" && !name.starts_with("c10d::") {
                    return None;
                }
                own(i)
                    .or_else(|| {
                        g.children(i)
                            .iter()
                            .filter(|&&c| t.name(&t.nodes[c as usize]) == "record_param_comms")
                            .find_map(|&c| own(c))
                    })
                    .or_else(|| g.parent[i as usize].and_then(own))
            })
            .collect();
        drop(g);
        // Per-rank buffers made for new list entries are inserted after the run; collected here.
        let mut inserts: Vec<(u64, usize, Vec<Fresh>)> = Vec::new();
        // Per collective (by node id): its tensor arguments resized, by the tensor id each had
        // in the capture. Its `record_param_comms` record, nested in it, holds the same tensors.
        let mut resized_args: HashMap<u64, HashMap<u64, et_schema::Arg>> = HashMap::new();
        for i in order {
            let n = self.t.nodes[i as usize].clone();
            let name = self.t.name(&n).to_string();
            let group = pg[i as usize].as_deref();
            if name == "record_param_comms" {
                let shape = self.group(&n, group)?;
                // Its parent collective ran before it in this order: already resized.
                let resized = n.parent.and_then(|p| resized_args.get(&p));
                self.record(&n, &shape, resized)?;
                continue;
            }
            let Some(op) = name.strip_prefix("c10d::") else {
                if name.starts_with("_c10d_functional::") || name.starts_with("c10d_functional::") {
                    let kind = crate::summary::collective_name(&self.t, &n).unwrap_or_default();
                    if !matches!(kind.as_str(), "all_reduce" | "broadcast" | "wait_tensor") {
                        return Err(
                            self.fail(&n, "a functional collective --world does not resize")
                        );
                    }
                    if self.layout.has_subgroups() {
                        return Err(self.fail(
                            &n,
                            "a functional collective names its group by an argument, which \
                             compose world does not rewrite for a job with subgroups",
                        ));
                    }
                }
                continue;
            };
            let shape = self.group(&n, group)?;
            self.rename_group(&n, &shape);
            let captured: Vec<et_schema::Arg> = self.t.inputs(&n).to_vec();
            let added = self.c10d(&n, op, &shape)?;
            let now = self.t.inputs(&n);
            let by_id: HashMap<u64, et_schema::Arg> = captured
                .iter()
                .zip(now)
                .filter(|(a, b)| a != b)
                .filter_map(|(a, b)| match a.value {
                    Value::Tensor(k) => Some((self.t.tensors[k as usize].id, *b)),
                    _ => None,
                })
                .collect();
            if !by_id.is_empty() {
                resized_args.insert(n.id, by_id);
            }
            if !added.is_empty() {
                inserts.push((n.id, shape.n, added));
            }
        }
        // Latest first: what is inserted for one collective shifts the ids after it only;
        // per captured part its fresh copies (a collective of several lists has several).
        for (at, parts, tensors) in inserts.into_iter().rev() {
            let mut by_template: Vec<Vec<Fresh>> = Vec::new();
            for f in tensors {
                match by_template.iter_mut().find(|v| v[0].0 == f.0) {
                    Some(v) => v.push(f),
                    None => by_template.push(vec![f]),
                }
            }
            for group in by_template {
                self.make_part_copies(at, parts, &group);
                self.make_buffers(at, &group);
            }
        }
        Ok(())
    }

    /// Counts a collective's bytes before and after under its kind.
    fn count(&mut self, kind: &str, before: u64, after: u64, how: &'static str) {
        let e = self.scaled.by_kind.entry(kind.to_string()).or_default();
        e.calls += 1;
        e.bytes_before += before;
        e.bytes_after += after;
        e.how = how;
    }

    fn bytes(&self, v: Value) -> u64 {
        match v {
            Value::Tensor(k) => {
                let x = &self.t.tensors[k as usize];
                x.numel * x.itemsize
            }
            Value::List { start, len } => (start..start + len)
                .map(|k| self.bytes(self.t.items[k as usize]))
                .sum(),
            _ => 0,
        }
    }

    /// One c10d op; returns the tensors of new list entries whose buffers are to be made.
    fn c10d(&mut self, n: &Node, op: &str, g: &GroupShape) -> Result<Vec<Fresh>, WorldError> {
        let args: Vec<Arg> = self.t.inputs(n).to_vec();
        let arg = |k: usize| args.get(k).copied();
        let range = n.inputs.clone();
        let total = |s: &Synth| -> u64 {
            s.t.args[range.start as usize..range.end as usize]
                .iter()
                .map(|a| s.bytes(a.value))
                .sum()
        };
        let before = total(self);
        let mut added = Vec::new();
        let how = match op.trim_end_matches('_') {
            "allreduce" | "barrier" | "broadcast" | "reduce" => {
                "kept: its bytes do not depend on the group size"
            }
            "allgather" | "gather" => {
                // Outputs: one list of a part per group rank (on a gather's root only).
                if let Some(a) = arg(0) {
                    added = self.grow_nested(n, n.inputs.start, a, g)?;
                }
                "one output part per group rank (parts made by a factory op made again)"
            }
            "reduce_scatter" | "scatter" | "alltoall" => {
                let k = n.inputs.start + if op.starts_with("alltoall") { 0 } else { 1 };
                if op.starts_with("alltoall") {
                    if let Some(a) = arg(0) {
                        added = self.grow_flat(n, n.inputs.start, a, g)?;
                    }
                    if let Some(a) = arg(1) {
                        self.grow_flat(n, n.inputs.start + 1, a, g)?;
                    }
                } else if let Some(a) = self.t.args.get(k as usize).copied() {
                    self.grow_nested(n, k, a, g)?;
                }
                "one part per group rank"
            }
            "_allgather_base" | "allgather_into_tensor_coalesced" => {
                self.scale_dim0(n, n.inputs.start, g)?;
                "the output's first dimension follows the group size"
            }
            "_reduce_scatter_base" => {
                self.scale_dim0(n, n.inputs.start + 1, g)?;
                "the input's first dimension follows the group size"
            }
            "alltoall_base" => {
                self.resplit(n, g)?;
                "re-split evenly: every rank sends each the capture's mean part"
            }
            // Its input 2 is a tag: any source stays any source.
            "recv_any_source" => "kept: it receives from any rank",
            "send" | "recv" => {
                self.peer(n, n.inputs.start + 2, g, op == "send")?;
                "peer at the same offset from the rank"
            }
            other => {
                return Err(self.fail(
                    n,
                    format!("{other}: a collective kind --world does not know how to scale"),
                ))
            }
        };
        let after = total(self);
        let label = crate::summary::collective_name(&self.t, n).unwrap_or_else(|| op.into());
        self.count(&label, before, after, how);
        Ok(added)
    }

    /// A fresh tensor like `x` (new id and storage).
    fn fresh(&mut self, x: TensorRef) -> TensorRef {
        let t = TensorRef {
            id: self.next_tensor,
            storage: self.next_storage,
            offset: 0,
            ..x
        };
        self.next_tensor += 1;
        self.next_storage += 1;
        t
    }

    /// A list value of `n` parts made `n2` parts: kept ranks' parts as they are, new ones
    /// copies of the last part (fresh tensors for tensor parts). Returns the new list and the
    /// fresh tensors.
    fn regrow(&mut self, v: Value, n: usize, n2: usize) -> Option<(Value, Vec<Fresh>)> {
        let Value::List { start, len } = v else {
            return None;
        };
        if len as usize != n {
            return None;
        }
        let mut parts: Vec<Value> = (start..start + len)
            .map(|k| self.t.items[k as usize])
            .take(n2)
            .collect();
        let mut fresh = Vec::new();
        let last = *parts.last()?;
        while parts.len() < n2 {
            match last {
                Value::Tensor(k) => {
                    let template = self.t.tensors[k as usize];
                    let x = self.fresh(template);
                    self.t.tensors.push(x);
                    fresh.push((template, x));
                    parts.push(Value::Tensor(self.t.tensors.len() as u32 - 1));
                }
                other => parts.push(other),
            }
        }
        let s = self.t.items.len() as u32;
        self.t.items.extend(parts);
        Some((
            Value::List {
                start: s,
                len: n2 as u32,
            },
            fresh,
        ))
    }

    /// The type string of a list of `n2` elements like the first of `ty` (`GenericList[A,A]`).
    fn list_type(ty: &str, n2: usize) -> Option<String> {
        let inner = ty.strip_prefix("GenericList[")?.strip_suffix(']')?;
        let mut depth = 0;
        let mut first_end = inner.len();
        for (k, c) in inner.char_indices() {
            match c {
                '[' | '(' => depth += 1,
                ']' | ')' => depth -= 1,
                ',' if depth == 0 => {
                    first_end = k;
                    break;
                }
                _ => {}
            }
        }
        let first = &inner[..first_end];
        Some(format!("GenericList[{}]", vec![first; n2].join(",")))
    }

    /// Argument `at` (a `Tensor[]`) of `n`: one part per group rank.
    fn grow_flat(
        &mut self,
        n: &Node,
        at: u32,
        a: Arg,
        g: &GroupShape,
    ) -> Result<Vec<Fresh>, WorldError> {
        if g.n == g.now.size {
            return Ok(Vec::new());
        }
        let Value::List { len, .. } = a.value else {
            return Ok(Vec::new());
        };
        if len == 0 {
            return Ok(Vec::new());
        }
        let (value, fresh) = self
            .regrow(a.value, g.n, g.now.size)
            .ok_or_else(|| self.fail(n, format!("a list of {len} parts for a group of {}", g.n)))?;
        let shape = self
            .regrow(a.shape, g.n, g.now.size)
            .map(|x| x.0)
            .unwrap_or(a.shape);
        let strides = a
            .strides
            .map(|s| self.regrow(s, g.n, g.now.size).map(|x| x.0).unwrap_or(s));
        let ty = Self::list_type(self.t.str(a.ty), g.now.size)
            .map(|t| self.t.strings.intern(&t))
            .unwrap_or(a.ty);
        self.t.args[at as usize] = Arg {
            value,
            shape,
            ty,
            strides,
        };
        Ok(fresh)
    }

    /// Argument `at` (a `Tensor[][]`) of `n`: each inner list one part per group rank.
    fn grow_nested(
        &mut self,
        n: &Node,
        at: u32,
        a: Arg,
        g: &GroupShape,
    ) -> Result<Vec<Fresh>, WorldError> {
        if g.n == g.now.size {
            return Ok(Vec::new());
        }
        let (Value::List { start, len }, Value::List { start: s0, .. }) = (a.value, a.shape) else {
            return Ok(Vec::new());
        };
        let mut values = Vec::new();
        let mut shapes = Vec::new();
        let mut strides = Vec::new();
        let mut fresh = Vec::new();
        for k in 0..len {
            let (Some(&inner), Some(&inner_shape)) = (
                self.t.items.get((start + k) as usize),
                self.t.items.get((s0 + k) as usize),
            ) else {
                return Err(self.fail(n, "its shapes do not match its tensor lists"));
            };
            if let Value::List { len: 0, .. } = inner {
                // A gather's non-root: no outputs.
                values.push(inner);
                shapes.push(inner_shape);
                continue;
            }
            let (v, f) = self.regrow(inner, g.n, g.now.size).ok_or_else(|| {
                self.fail(
                    n,
                    format!("an output list that is not one part per rank of {}", g.n),
                )
            })?;
            fresh.extend(f);
            values.push(v);
            shapes.push(
                self.regrow(inner_shape, g.n, g.now.size)
                    .map_or(inner_shape, |x| x.0),
            );
            if let Some(Value::List { start: st, .. }) = a.strides {
                if let Some(&s) = self.t.items.get((st + k) as usize) {
                    strides.push(self.regrow(s, g.n, g.now.size).map_or(s, |x| x.0));
                }
            }
        }
        let list = |t: &mut Trace, v: Vec<Value>| {
            let s = t.items.len() as u32;
            let len = v.len() as u32;
            t.items.extend(v);
            Value::List { start: s, len }
        };
        let value = list(&mut self.t, values);
        let shape = list(&mut self.t, shapes);
        let strides = a.strides.map(|old| {
            if strides.is_empty() {
                old
            } else {
                list(&mut self.t, strides)
            }
        });
        let ty_text = self.t.str(a.ty).to_string();
        let ty = ty_text
            .strip_prefix("GenericList[")
            .and_then(|x| x.strip_suffix(']'))
            .and_then(|inner| Self::list_type(inner, g.now.size))
            .map(|inner| self.t.strings.intern(&format!("GenericList[{inner}]")))
            .unwrap_or(a.ty);
        self.t.args[at as usize] = Arg {
            value,
            shape,
            ty,
            strides,
        };
        Ok(fresh)
    }

    /// Argument `at` (a tensor): its first dimension times `n2 / n`.
    fn scale_dim0(&mut self, n: &Node, at: u32, g: &GroupShape) -> Result<(), WorldError> {
        if g.n == g.now.size {
            return Ok(());
        }
        let a = self.t.args[at as usize];
        let Value::Tensor(k) = a.value else {
            return Ok(());
        };
        let shape = self.t.int_list(a.shape).unwrap_or_default();
        let d0 = *shape
            .first()
            .ok_or_else(|| self.fail(n, "a tensor without dimensions"))?;
        if d0 % g.n as i64 != 0 {
            return Err(self.fail(
                n,
                format!("its first dimension {d0} does not split over {} ranks", g.n),
            ));
        }
        let d2 = d0 / g.n as i64 * g.now.size as i64;
        self.set_dim0(at, k, &shape, d2);
        Ok(())
    }

    /// Sets argument `at`'s tensor (`tensors[k]`, shape `shape`) to first dimension `d2`.
    fn set_dim0(&mut self, at: u32, k: u32, shape: &[i64], d2: i64) {
        let mut new = shape.to_vec();
        if new.is_empty() {
            return;
        }
        new[0] = d2;
        let s = self.t.items.len() as u32;
        self.t.items.extend(new.iter().map(|&d| Value::Int(d)));
        let numel: i64 = new.iter().product();
        let x = self.fresh(self.t.tensors[k as usize]);
        self.t.tensors.push(TensorRef {
            numel: numel.max(0) as u64,
            ..x
        });
        let a = &mut self.t.args[at as usize];
        a.value = Value::Tensor(self.t.tensors.len() as u32 - 1);
        a.shape = Value::List {
            start: s,
            len: new.len() as u32,
        };
    }

    /// An all-to-all-v: splits of one entry per group rank, each the capture's mean part.
    fn resplit(&mut self, n: &Node, g: &GroupShape) -> Result<(), WorldError> {
        let which = self.a2a_seen;
        self.a2a_seen += 1;
        if g.n == g.now.size {
            return Ok(());
        }
        let base = n.inputs.start;
        for (tensor, splits) in [(0u32, 3u32), (1, 4)] {
            let a = self.t.args[(base + tensor) as usize];
            let Value::Tensor(k) = a.value else { continue };
            let shape = self.t.int_list(a.shape).unwrap_or_default();
            let Some(&d0) = shape.first() else { continue };
            let sp = self.t.args[(base + splits) as usize];
            let recorded = self.t.int_list(sp.value).unwrap_or_default();
            if !recorded.is_empty() && recorded.len() != g.n {
                return Err(self.fail(
                    n,
                    format!("{} split sizes for a group of {}", recorded.len(), g.n),
                ));
            }
            if recorded.is_empty() && d0 % g.n as i64 != 0 {
                return Err(self.fail(
                    n,
                    format!("its {d0} rows do not split evenly over {} ranks", g.n),
                ));
            }
            let part = self
                .a2a_parts
                .get(which)
                .copied()
                .flatten()
                .ok_or_else(|| {
                    self.fail(
                        n,
                        "the captured ranks do not hold the same all-to-alls: their parts \
                         cannot be agreed",
                    )
                })?;
            if !recorded.is_empty() {
                let s = self.t.items.len() as u32;
                self.t
                    .items
                    .extend((0..g.now.size).map(|_| Value::Int(part)));
                let at = (base + splits) as usize;
                self.t.args[at].value = Value::List {
                    start: s,
                    len: g.now.size as u32,
                };
                // Its type and shapes name one entry per part (`GenericList[Int,Int]`).
                if let Some(ty) = Self::list_type(self.t.str(self.t.args[at].ty), g.now.size) {
                    self.t.args[at].ty = self.t.strings.intern(&ty);
                }
                if let Some((shape, _)) = self.regrow(sp.shape, g.n, g.now.size) {
                    self.t.args[at].shape = shape;
                }
            }
            self.set_dim0(base + tensor, k, &shape, part * g.now.size as i64);
            self.last_part = Some(part);
        }
        Ok(())
    }

    /// A send's or receive's peer (group rank) at the same offset from this rank: the offset
    /// taken the short way round the capture's ring (a receive from the rank before is -1, not
    /// n-1), a send's ties forward and a receive's backward, so that a ring stays a ring.
    fn peer(&mut self, n: &Node, at: u32, g: &GroupShape, send: bool) -> Result<(), WorldError> {
        let Value::Int(p) = self.t.args[at as usize].value else {
            return Err(self.fail(n, "its peer is not recorded"));
        };
        let peer = match g.family {
            // A global rank: the grid's other dimensions keep the peer's place.
            None if p >= 0 => {
                self.layout
                    .world_peer(self.from, self.rank, p as usize, &self.sizes, send)
                    as i64
            }
            _ => peer_at(g.from, g.now.me, g.n, g.now.size, p, send),
        };
        self.t.args[at as usize].value = Value::Int(peer);
        Ok(())
    }

    /// The new name of collective `n`'s group on its `pg_name`, where it has one.
    fn rename_group(&mut self, n: &Node, g: &GroupShape) {
        let sym = self.t.strings.intern(&g.now.name);
        for k in n.extra.start..n.extra.end {
            let e = self.t.extra_attrs[k as usize];
            if self.t.str(e.name) == "pg_name" && matches!(e.value, Value::Str(_)) {
                self.t.extra_attrs[k as usize].value = Value::Str(sym);
            }
        }
    }

    /// A `record_param_comms` record: its rank, group, message sizes and splits; in schemas
    /// that keep them in its inputs, its tensors too, as its collective now has them
    /// (`resized`: by the tensor id each had in the capture).
    fn record(
        &mut self,
        n: &Node,
        g: &GroupShape,
        resized: Option<&HashMap<u64, et_schema::Arg>>,
    ) -> Result<(), WorldError> {
        let kind = crate::summary::collective_name(&self.t, n).unwrap_or_default();
        let flat: String = kind.chars().filter(|c| *c != '_').collect();
        self.rename_group(n, g);
        let (n1, n2) = (g.n as i64, g.now.size as i64);
        for k in n.extra.start..n.extra.end {
            let e = self.t.extra_attrs[k as usize];
            let name = self.t.str(e.name).to_string();
            let int = match e.value {
                Value::Int(v) => Some(v),
                _ => None,
            };
            let new = match (name.as_str(), int) {
                // The rank in the collective's group, as ProcessGroupNCCL records it.
                ("rank", Some(_)) => Some(Value::Int(g.now.me as i64)),
                ("pg_size", Some(_)) => Some(Value::Int(n2)),
                ("global_rank_start", Some(_)) => Some(Value::Int(g.now.start as i64)),
                ("global_rank_stride", Some(_)) => Some(Value::Int(g.now.stride as i64)),
                ("out_msg_nelems", Some(v)) if flat.contains("allgather") || flat == "gather" => {
                    Some(Value::Int(v / n1.max(1) * n2))
                }
                ("in_msg_nelems", Some(v))
                    if flat.contains("reducescatter") || flat == "scatter" =>
                {
                    Some(Value::Int(v / n1.max(1) * n2))
                }
                ("in_msg_nelems" | "out_msg_nelems", Some(v)) if flat.contains("alltoall") => {
                    Some(Value::Int(v / n1.max(1) * n2))
                }
                ("in_split_size" | "out_split_size", _) if flat.contains("alltoall") => {
                    let v = self.t.int_list(e.value).unwrap_or_default();
                    if v.is_empty() {
                        None
                    } else {
                        // The part the all-to-all itself was re-split to, where it was.
                        let part = self
                            .last_part
                            .unwrap_or(v.iter().sum::<i64>() / v.len() as i64);
                        let s = self.t.items.len() as u32;
                        self.t.items.extend((0..n2).map(|_| Value::Int(part)));
                        Some(Value::List {
                            start: s,
                            len: n2 as u32,
                        })
                    }
                }
                _ => None,
            };
            if let Some(v) = new {
                self.t.extra_attrs[k as usize].value = v;
            }
        }
        // Its tensors (older schemas record them among its inputs) as its collective's, which
        // holds the same tensors, resized.
        if let Some(resized) = resized {
            for k in n.inputs.start..n.inputs.end {
                let a = self.t.args[k as usize];
                if let Value::Tensor(ti) = a.value {
                    if let Some(b) = resized.get(&self.t.tensors[ti as usize].id) {
                        self.t.args[k as usize].value = b.value;
                        self.t.args[k as usize].shape = b.shape;
                        self.t.args[k as usize].strides = b.strides;
                    }
                }
            }
        }
        // Older schemas record it in the inputs: `[tensors, seq, group, rank, name, in_splits,
        // out_splits, (1.0.2 on) group size]`. The rank is the integer input just before the
        // collective's name; the splits and the size follow it.
        let inputs = n.inputs.clone();
        for k in inputs.start..inputs.end {
            let a = self.t.args[k as usize];
            let next = self.t.args.get(k as usize + 1).map(|b| b.value);
            let (Value::Int(_), Some(Value::Str(s))) = (a.value, next) else {
                continue;
            };
            if self.t.str(s) != kind {
                continue;
            }
            self.t.args[k as usize].value = Value::Int(g.now.me as i64);
            let at =
                |off: usize| (k as usize + off < inputs.end as usize).then_some(k as usize + off);
            if flat.contains("alltoall") {
                for j in [at(2), at(3)].into_iter().flatten() {
                    let v = self.t.int_list(self.t.args[j].value).unwrap_or_default();
                    if v.len() as i64 != n1 || v.is_empty() {
                        continue;
                    }
                    let part = self
                        .last_part
                        .unwrap_or(v.iter().sum::<i64>() / v.len() as i64);
                    let start = self.t.items.len() as u32;
                    self.t.items.extend((0..n2).map(|_| Value::Int(part)));
                    self.t.args[j].value = Value::List {
                        start,
                        len: n2 as u32,
                    };
                    // Its type names each element: as many as the list now holds.
                    let ty = format!("GenericList[{}]", vec!["Int"; n2 as usize].join(","));
                    self.t.args[j].ty = self.t.strings.intern(&ty);
                    // Its shape, one (empty) entry per element, follows.
                    if let Value::List { start: s0, len } = self.t.args[j].shape {
                        if len as i64 == n1 && len > 0 {
                            let each = self.t.items[s0 as usize];
                            let s1 = self.t.items.len() as u32;
                            self.t.items.extend((0..n2).map(|_| each));
                            self.t.args[j].shape = Value::List {
                                start: s1,
                                len: n2 as u32,
                            };
                        }
                    }
                }
            }
            if let Some(j) = at(4) {
                if matches!(self.t.args[j].value, Value::Int(v) if v == n1) {
                    self.t.args[j].value = Value::Int(n2);
                }
            }
        }
        Ok(())
    }

    /// The buffers of new list entries that a factory op made right before collective
    /// `before` in the capture, one per part: that op's subtree made again for each fresh
    /// tensor, with ids right after the original subtree's.
    fn make_buffers(&mut self, before: u64, fresh: &[Fresh]) {
        // The producer of the part the fresh ones copy: the last outermost op before the
        // collective whose one output is that part and whose inputs hold no tensor (a factory:
        // `zeros`, `empty`).
        let Some(&(part, _)) = fresh.first() else {
            return;
        };
        let g = Graph::new(&self.t);
        let t = &self.t;
        let producer = g
            .order
            .iter()
            .rev()
            .copied()
            .skip_while(|&i| t.nodes[i as usize].id >= before)
            .find(|&i| {
                let n = &t.nodes[i as usize];
                let ins = t.inputs(n);
                top_op(&g, i)
                    && writes_only(t, n, part)
                    && !ins.iter().any(|a| matches!(a.value, Value::Tensor(_)))
            });
        drop(g);
        let Some(pi) = producer else { return };
        let parts = fresh
            .iter()
            .map(|(_, f)| {
                let mut remap = HashMap::new();
                remap.insert((part.id, part.storage), (f.id, f.storage));
                (remap, None)
            })
            .collect();
        self.clone_per_part(&[pi], parts);
    }

    /// The backend's copies into the parts of collective `after`'s output list (an all-gather
    /// over Gloo copies each part out of its flat result on its own thread: `select` of the
    /// flat result at the part's index, `copy_` into the part), made again for each new part:
    /// the ops after it whose output is the captured last part, with the ops after it that
    /// made their other inputs; a `select`'s index follows the part's.
    fn make_part_copies(&mut self, after: u64, captured_parts: usize, fresh: &[Fresh]) {
        let Some(&(part, _)) = fresh.first() else {
            return;
        };
        let g = Graph::new(&self.t);
        let t = &self.t;
        let later: Vec<u32> = g
            .order
            .iter()
            .copied()
            .filter(|&i| t.nodes[i as usize].id > after && top_op(&g, i))
            .collect();
        let writers: Vec<u32> = later
            .iter()
            .copied()
            .filter(|&i| writes_only(t, &t.nodes[i as usize], part))
            .collect();
        let mut chain = writers.clone();
        for &w in &writers {
            for a in t.inputs(&t.nodes[w as usize]) {
                let Value::Tensor(k) = a.value else { continue };
                let x = t.tensors[k as usize];
                if (x.id, x.storage) == (part.id, part.storage) {
                    continue;
                }
                let made = later.iter().copied().find(|&i| {
                    t.nodes[i as usize].id < t.nodes[w as usize].id
                        && writes_only(t, &t.nodes[i as usize], x)
                });
                chain.extend(made);
            }
        }
        chain.sort_by_key(|&i| t.nodes[i as usize].id);
        chain.dedup();
        if writers.is_empty() {
            return;
        }
        // The tensors the chain makes besides the part: fresh ones in each copy.
        let made: Vec<TensorRef> = chain
            .iter()
            .flat_map(|&i| t.outputs(&t.nodes[i as usize]).to_vec())
            .filter_map(|a| match a.value {
                Value::Tensor(k) => Some(t.tensors[k as usize]),
                _ => None,
            })
            .filter(|x| (x.id, x.storage) != (part.id, part.storage))
            .collect();
        drop(g);
        let last_index = captured_parts as i64 - 1;
        let parts = fresh
            .iter()
            .enumerate()
            .map(|(m, (_, f))| {
                let mut remap = HashMap::new();
                remap.insert((part.id, part.storage), (f.id, f.storage));
                for x in &made {
                    let y = self.fresh(*x);
                    remap.insert((x.id, x.storage), (y.id, y.storage));
                }
                (remap, Some((last_index, last_index + 1 + m as i64)))
            })
            .collect();
        self.clone_per_part(&chain, parts);
    }

    /// Copies of the subtrees of `roots` (outermost ops, in id order) once per entry of
    /// `parts`, with ids right after the last of them: each entry's tensors remapped and, for
    /// a `select`, its index `from` made `to`.
    #[allow(clippy::type_complexity)]
    fn clone_per_part(
        &mut self,
        roots: &[u32],
        parts: Vec<(HashMap<(u64, u64), (u64, u64)>, Option<(i64, i64)>)>,
    ) {
        let g = Graph::new(&self.t);
        let mut nodes: Vec<u32> = roots.to_vec();
        let mut k = 0;
        while k < nodes.len() {
            nodes.extend(g.children(nodes[k]).iter().copied());
            k += 1;
        }
        drop(g);
        nodes.sort_by_key(|&i| self.t.nodes[i as usize].id);
        nodes.dedup();
        let Some(last) = nodes.iter().map(|&i| self.t.nodes[i as usize].id).max() else {
            return;
        };
        renumber(&mut self.t, last, (nodes.len() * parts.len()) as u64);
        let mut next_id = last + 1;
        for (remap, index) in parts {
            let mut ids: HashMap<u64, u64> = HashMap::new();
            for &i in &nodes {
                ids.insert(self.t.nodes[i as usize].id, next_id);
                next_id += 1;
            }
            for &i in &nodes {
                let mut n = self.t.nodes[i as usize].clone();
                let select = self.t.name(&n) == "aten::select";
                n.id = ids[&n.id];
                n.parent = n.parent.map(|p| ids.get(&p).copied().unwrap_or(p));
                n.rf_id = None;
                n.inputs = self.copy_args(n.inputs.clone(), &remap);
                n.outputs = self.copy_args(n.outputs.clone(), &remap);
                if let (true, Some((from, to))) = (select, index) {
                    let at = n.inputs.start as usize + 2;
                    if n.inputs.len() > 2 && self.t.args[at].value == Value::Int(from) {
                        self.t.args[at].value = Value::Int(to);
                    }
                }
                self.t.nodes.push(n);
                self.scaled.ops_added += 1;
            }
        }
    }

    /// Copies of args `r` with their tensors remapped by `(id, storage)`.
    fn copy_args(
        &mut self,
        r: std::ops::Range<u32>,
        remap: &HashMap<(u64, u64), (u64, u64)>,
    ) -> std::ops::Range<u32> {
        let start = self.t.args.len() as u32;
        for k in r {
            let mut a = self.t.args[k as usize];
            a.value = self.copy_value(a.value, remap);
            self.t.args.push(a);
        }
        start..self.t.args.len() as u32
    }

    fn copy_value(&mut self, v: Value, remap: &HashMap<(u64, u64), (u64, u64)>) -> Value {
        match v {
            Value::Tensor(k) => {
                let x = self.t.tensors[k as usize];
                match remap.get(&(x.id, x.storage)) {
                    Some(&(id, storage)) => {
                        self.t.tensors.push(TensorRef { id, storage, ..x });
                        Value::Tensor(self.t.tensors.len() as u32 - 1)
                    }
                    None => v,
                }
            }
            Value::List { start, len } => {
                let parts: Vec<Value> = (start..start + len)
                    .map(|k| self.t.items[k as usize])
                    .collect();
                let copied: Vec<Value> = parts
                    .into_iter()
                    .map(|p| self.copy_value(p, remap))
                    .collect();
                let s = self.t.items.len() as u32;
                self.t.items.extend(copied);
                Value::List { start: s, len }
            }
            other => other,
        }
    }
}

/// The peer of new rank `to` (made from captured rank `from`) whose captured peer was `p`, in
/// a group of `n` ranks captured and `n2` now: the same offset, taken the short way round.
pub(super) fn peer_at(from: usize, to: usize, n: usize, n2: usize, p: i64, send: bool) -> i64 {
    let size = n as i64;
    let mut offset = (p - from as i64).rem_euclid(size);
    let half = size / 2;
    if offset > half || (offset == half && !send && size % 2 == 0) {
        offset -= size;
    }
    (to as i64 + offset).rem_euclid(n2 as i64)
}

/// Whether node `i` is an op no op encloses.
fn top_op(g: &Graph, i: u32) -> bool {
    g.class[i as usize].contains(crate::OpClass::OP)
        && g.parent[i as usize].is_none_or(|p| !g.class[p as usize].contains(crate::OpClass::OP))
}

/// Whether node `n`'s one output is tensor `x` (by id and storage).
fn writes_only(t: &Trace, n: &Node, x: TensorRef) -> bool {
    let outs = t.outputs(n);
    outs.len() == 1
        && matches!(outs[0].value, Value::Tensor(k)
            if (t.tensors[k as usize].id, t.tensors[k as usize].storage) == (x.id, x.storage))
}

/// Shifts every node id above `after` (and the references to them) by `by`.
fn renumber(t: &mut Trace, after: u64, by: u64) {
    let shift = |x: u64| if x > after { x + by } else { x };
    let ids: HashSet<u64> = t.nodes.iter().map(|n| n.id).collect();
    for n in &mut t.nodes {
        n.id = shift(n.id);
        n.parent = n
            .parent
            .map(|p| if ids.contains(&p) { shift(p) } else { p });
        n.fw_parent = n
            .fw_parent
            .map(|p| if ids.contains(&p) { shift(p) } else { p });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_types_take_one_element_per_part() {
        assert_eq!(
            Synth::list_type("GenericList[Tensor(float),Tensor(float)]", 4).as_deref(),
            Some("GenericList[Tensor(float),Tensor(float),Tensor(float),Tensor(float)]")
        );
        assert_eq!(
            Synth::list_type("GenericList[GenericList[Int,Int],GenericList[Int,Int]]", 3)
                .as_deref(),
            Some("GenericList[GenericList[Int,Int],GenericList[Int,Int],GenericList[Int,Int]]")
        );
        assert_eq!(Synth::list_type("Tensor(float)", 2), None);
    }

    /// A ring of sends to the next rank and receives from the previous one stays one at any
    /// world size, whichever captured rank a new rank copies (the short way round; a 2-rank
    /// ring's tie forward for a send, backward for a receive).
    #[test]
    fn rings_stay_rings() {
        for captured in [2usize, 3, 4] {
            for world in [2usize, 5, 8] {
                for rank in 0..world {
                    let from = rank.min(captured - 1);
                    let next = (from + 1) % captured;
                    let prev = (from + captured - 1) % captured;
                    let send = peer_at(from, rank, captured, world, next as i64, true);
                    let recv = peer_at(from, rank, captured, world, prev as i64, false);
                    assert_eq!(
                        send,
                        ((rank + 1) % world) as i64,
                        "{captured}->{world} r{rank}"
                    );
                    assert_eq!(
                        recv,
                        ((rank + world - 1) % world) as i64,
                        "{captured}->{world} r{rank}"
                    );
                }
            }
        }
    }
}
