//! A one-pass summary of a trace, as `mystique inspect` prints it.

use et_schema::{KeyedState, Trace, Value};
use indexmap::IndexMap;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};

/// The tensors of a trace, counted over every node's arguments.
#[derive(Debug, Serialize, Default, PartialEq)]
pub struct TensorStats {
    /// Distinct tensors, keyed by (tensor id, storage id).
    pub count: usize,
    /// Distinct storages with a device (storage id 0 means none).
    pub storages: usize,
    /// Bytes of distinct storages (the largest extent seen of each), total.
    pub bytes: u64,
    /// `bytes` by device.
    pub bytes_by_device: BTreeMap<String, u64>,
    /// Bytes of distinct tensors' views by element type.
    pub bytes_by_dtype: BTreeMap<String, u64>,
}

/// What a trace holds, in figures a reader checks first.
#[derive(Debug, Serialize, PartialEq)]
pub struct Summary {
    /// Where the trace came from.
    pub source: String,
    /// Its schema version.
    pub schema: String,
    /// Its file layout (`flat` or `nested`).
    pub layout: String,
    /// Its nodes.
    pub nodes: usize,
    /// Node name -> count, over all nodes, most frequent first.
    pub ops: IndexMap<String, usize>,
    /// The devices tensors live on, sorted.
    pub devices: Vec<String>,
    /// The tensors.
    pub tensors: TensorStats,
    /// `ProfilerStep#N` annotations, in file order.
    pub iterations: Vec<String>,
    /// Process groups from `## process_group:init ##` (JSON objects as recorded).
    pub process_groups: Vec<serde_json::Value>,
    /// Collective name -> count (from `record_param_comms`, `c10d::*`, `nccl:*`).
    pub collectives: BTreeMap<String, usize>,
    /// The parser's warnings.
    pub warnings: Vec<String>,
}

/// The name of the record in which the observer writes the trace's process groups (as a JSON
/// string input), once, outside every iteration.
pub const PROCESS_GROUP_INIT: &str = "## process_group:init ##";

/// Collectives by the sequence number of their `record_param_comms` record, for PARAM's `wait`
/// records, which name the collective they wait for by that number. Each process group counts
/// its own collectives, so a number recurs across groups: a wait that records its group pairs
/// with the latest collective of its number on that group (or on one that records none); a
/// wait that records none, with the latest of its number.
#[derive(Debug)]
pub struct CollectivesBySeq<T> {
    by_seq: HashMap<i64, Vec<(Option<String>, T)>>,
}

impl<T> Default for CollectivesBySeq<T> {
    fn default() -> Self {
        CollectivesBySeq {
            by_seq: HashMap::new(),
        }
    }
}

impl<T> CollectivesBySeq<T> {
    /// A collective numbered `seq`, issued on `group` where its record names one.
    pub fn issued(&mut self, seq: i64, group: Option<String>, collective: T) {
        self.by_seq
            .entry(seq)
            .or_default()
            .push((group, collective));
    }

    /// The collective a wait for `seq` on `group` (where recorded) waits for.
    pub fn waited(&self, seq: i64, group: Option<&str>) -> Option<&T> {
        let issued = self.by_seq.get(&seq)?.iter().rev();
        let mut same = issued.filter(|(g, _)| match (g.as_deref(), group) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        });
        same.next().map(|(_, c)| c)
    }
}

/// The collective a node performs, if any.
pub fn collective_name(t: &Trace, n: &et_schema::Node) -> Option<String> {
    let name = t.name(n);
    if name == "record_param_comms" {
        // Newer traces carry a `collective_name` attr; older ones the 4th input.
        for e in t.extras(n) {
            if t.str(e.name) == "collective_name" {
                if let Value::Str(s) = e.value {
                    return Some(t.str(s).to_string());
                }
            }
        }
        // Older ones the first string input (its position moved between versions).
        let first_str = t.inputs(n).iter().find_map(|a| match a.value {
            Value::Str(s) if !t.str(s).starts_with('<') => Some(t.str(s).to_string()),
            _ => None,
        });
        return Some(first_str.unwrap_or_else(|| "unknown".into()));
    }
    if let Some(rest) = name.strip_prefix("c10d::") {
        return Some(rest.trim_end_matches('_').to_string());
    }
    // Functional collectives (torch.distributed._functional_collectives, torch.compile's):
    // `_c10d_functional::all_reduce`, `::wait_tensor`, ...
    if let Some(rest) = name
        .strip_prefix("_c10d_functional::")
        .or_else(|| name.strip_prefix("c10d_functional::"))
    {
        return Some(rest.trim_end_matches('_').to_string());
    }
    for backend in ["nccl:", "gloo:"] {
        if let Some(rest) = name.strip_prefix(backend) {
            return Some(rest.to_string());
        }
    }
    None
}

/// Whether node `n` is a point-to-point op (`c10d::send`, `c10d::recv_`,
/// `c10d::recv_any_source_`). The observer records an `irecv` issued while an `isend` is still
/// open inside the send's node, though it is a call of its own: nested in another
/// point-to-point op, it is still replayed and counted on its own (a send never calls a recv).
pub fn is_point_to_point(t: &Trace, n: &et_schema::Node) -> bool {
    matches!(
        t.name(n),
        "c10d::send" | "c10d::recv_" | "c10d::recv_any_source_"
    )
}

/// The rank a file name gives: a number after `rank` (`rank3`, `rank_7`, `-rank-2`), else the
/// last number standing alone between separators (`job_et_0.json`, `trace.7.json`). With it,
/// whether the name says `rank` before it (a name such as `model_1.0.2.json` gives a number by
/// the second reading that is no rank for certain).
pub fn rank_in_name(path: &std::path::Path) -> Option<(u64, bool)> {
    let name = path.file_name()?.to_str()?.to_ascii_lowercase();
    let stem = name
        .trim_end_matches(".gz")
        .trim_end_matches(".json")
        .trim_end_matches(".et");
    // Digit runs with what stands before and after them.
    let bytes = stem.as_bytes();
    let mut runs = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_digit() {
            let start = i;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
            runs.push((start, i));
        } else {
            i += 1;
        }
    }
    let number = |(s, e): (usize, usize)| stem[s..e].parse::<u64>().ok();
    let after_rank = runs.iter().rev().find(|&&(s, _)| {
        let before = stem[..s].trim_end_matches(['_', '-', '.']);
        before.ends_with("rank")
    });
    if let Some(&run) = after_rank {
        return number(run).map(|r| (r, true));
    }
    let alone = |&&(s, e): &&(usize, usize)| {
        let sep = |c: Option<u8>| c.is_none_or(|c| matches!(c, b'_' | b'-' | b'.'));
        sep(s.checked_sub(1).map(|k| bytes[k])) && sep(bytes.get(e).copied())
    };
    runs.iter()
        .rev()
        .find(alone)
        .copied()
        .and_then(number)
        .map(|r| (r, false))
}

/// The rank a trace was captured on, where it recorded one: a `record_param_comms` record's
/// `rank` attribute, or (older schemas) the integer input just before its collective's name.
/// Records of rooted and point-to-point collectives are passed over: in their slot
/// ProcessGroupNCCL records the root (`opts.rootRank`) or the peer, not the rank itself, and a
/// DDP job's every rank begins with a broadcast from rank 0.
pub fn recorded_rank(t: &Trace) -> Option<u64> {
    t.nodes
        .iter()
        .filter(|n| t.name(n) == "record_param_comms")
        .filter(|n| !collective_name(t, n).is_some_and(|c| names_another_rank(&c)))
        .find_map(|n| {
            let attr = t.extras(n).iter().find_map(|e| match e.value {
                Value::Int(r) if t.str(e.name) == "rank" && r >= 0 => Some(r as u64),
                _ => None,
            });
            attr.or_else(|| {
                let ins = t.inputs(n);
                let name_at = ins
                    .iter()
                    .position(|a| matches!(a.value, Value::Str(s) if !t.str(s).starts_with('<')))?;
                match ins.get(name_at.checked_sub(1)?)?.value {
                    Value::Int(r) if r >= 0 => Some(r as u64),
                    _ => None,
                }
            })
        })
}

/// The size of the world a trace was captured in, where its `record_param_comms` records of
/// the default group say and agree: their `pg_size` attribute, or (schemas that record no
/// attributes) the last of the three integers after the split sizes (`globalRankStart`,
/// `globalRankStride`, `worldSize`), read only where the record names its group
/// (`("0", "default_pg")`) and so has that layout. `wait` records are passed over. For traces
/// that recorded no `## process_group:init ##`, whose groups are otherwise unknown: a
/// single-GPU DDP job's trace says so here.
pub fn recorded_world_size(t: &Trace) -> Option<u64> {
    let mut sizes = t
        .nodes
        .iter()
        .filter(|n| t.name(n) == "record_param_comms")
        .filter(|n| collective_name(t, n).is_some_and(|c| c != "wait"))
        .filter_map(|n| {
            let attr = |name: &str| t.extras(n).iter().find(|e| t.str(e.name) == name);
            if let Some(e) = attr("pg_size") {
                let default = attr("pg_desc")
                    .is_some_and(|d| matches!(d.value, Value::Str(s) if t.str(s) == "default_pg"));
                return match e.value {
                    Value::Int(w) if w > 0 && default => Some(w as u64),
                    _ => None,
                };
            }
            let ins = t.inputs(n);
            let names_default = ins.iter().any(|a| {
                let items = t.list(a.value);
                items.len() == 2 && matches!(items[1], Value::Str(s) if t.str(s) == "default_pg")
            });
            let ints: Vec<i64> = ins
                .iter()
                .rev()
                .map_while(|a| match a.value {
                    Value::Int(v) => Some(v),
                    _ => None,
                })
                .collect();
            match (names_default, ints.as_slice()) {
                (true, [w, _, _]) if *w > 0 => Some(*w as u64),
                _ => None,
            }
        });
    let first = sizes.next()?;
    sizes.all(|w| w == first).then_some(first)
}

/// Whether a `record_param_comms` record of collective `name` records another rank than its
/// own in its rank slot: the root of a broadcast, reduce, gather or scatter, the peer of a send
/// or a receive (`_broadcast_oop`, `recvAnySource` and such spellings alike).
fn names_another_rank(name: &str) -> bool {
    let n = name.trim_start_matches('_').to_ascii_lowercase();
    let n = n.strip_suffix("_oop").unwrap_or(&n);
    matches!(
        n,
        "broadcast"
            | "reduce"
            | "gather"
            | "scatter"
            | "send"
            | "recv"
            | "isend"
            | "irecv"
            | "recvanysource"
            | "recv_any_source"
    )
}

/// Whether a node is a backend annotation (`nccl:all_reduce`, `gloo:broadcast`) rather than the
/// c10d op or `record_param_comms` record of a collective.
fn is_backend_annotation(name: &str) -> bool {
    name.starts_with("nccl:") || name.starts_with("gloo:")
}

impl Summary {
    /// Summarises `t` in one pass over its nodes.
    pub fn of(t: &Trace) -> Summary {
        // Counted by interned id, not by string: one array slot per distinct string, and each
        // distinct type string parsed once (a 200 MB trace has ~2M arguments, ~100 types).
        let mut counts = vec![0usize; t.strings.len()];
        // Keyed like the parser's maps: tensor and storage ids are the file's to choose.
        let mut types: HashMap<et_schema::Sym, et_schema::ValueType, KeyedState> =
            HashMap::default();
        let mut devices: HashSet<et_schema::Sym, KeyedState> = HashSet::default();
        let mut seen_tensors: HashSet<(u64, u64), KeyedState> = HashSet::default();
        let mut storages: HashMap<(u64, et_schema::Sym), u64, KeyedState> = HashMap::default();
        let mut by_dtype: BTreeMap<&'static str, u64> = BTreeMap::new();
        let mut iterations = Vec::new();
        let mut process_groups = Vec::new();
        let mut collectives = BTreeMap::new();
        let mut tids = Vec::new();
        for n in &t.nodes {
            if let Some(c) = counts.get_mut(n.name.0 as usize) {
                *c += 1;
            }
            let name = t.name(n);
            if name.starts_with("ProfilerStep#") {
                iterations.push(name.to_string());
            }
            if name == PROCESS_GROUP_INIT {
                for a in t.inputs(n) {
                    if let Value::Str(s) = a.value {
                        if let Ok(serde_json::Value::Array(v)) = serde_json::from_str(t.str(s)) {
                            process_groups.extend(v);
                        }
                    }
                }
            }

            for a in t.inputs(n).iter().chain(t.outputs(n)) {
                if !matches!(a.value, Value::Tensor(_) | Value::List { .. }) {
                    continue;
                }
                let ty = types.entry(a.ty).or_insert_with(|| t.arg_type(a));
                tids.clear();
                t.tensors_typed(a.value, ty, &mut tids);
                for &(ti, dtype) in &tids {
                    let x = t.tensor(ti);
                    let Some(dev) = x.device.filter(|&d| !t.str(d).is_empty()) else {
                        continue;
                    };
                    if x.storage == 0 {
                        continue;
                    }
                    devices.insert(dev);
                    let extent = (x.offset + x.numel) * x.itemsize;
                    let e = storages.entry((x.storage, dev)).or_default();
                    *e = (*e).max(extent);
                    if seen_tensors.insert((x.id, x.storage)) {
                        let dt = dtype.map_or("unknown", |d| d.name());
                        *by_dtype.entry(dt).or_default() += x.numel * x.itemsize;
                    }
                }
            }
        }
        let by_dtype: BTreeMap<String, u64> = by_dtype
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let devices: HashSet<&str> = devices.into_iter().map(|d| t.str(d)).collect();
        // Count each collective once: at its outermost collective node (record_param_comms sits
        // inside c10d::allgather_), and backend annotations only when nothing else records it.
        let index = t.node_by_id();
        let is_coll = |n: &et_schema::Node| collective_name(t, n).is_some();
        let has_ops = t
            .nodes
            .iter()
            .any(|n| is_coll(n) && !is_backend_annotation(t.name(n)));
        for n in &t.nodes {
            let Some(c) = collective_name(t, n) else {
                continue;
            };
            if has_ops && is_backend_annotation(t.name(n)) {
                continue;
            }
            let mut p = n.parent.filter(|&p| p != n.id);
            let mut nested = false;
            // A chain of the tree is shorter than the trace: the bound only stops a walk round a
            // parent cycle (a trace read without validation), after it has seen every node on it.
            let mut steps = 0;
            while let Some(pi) = p.and_then(|p| index.position(p)) {
                steps += 1;
                if steps > t.nodes.len() {
                    break;
                }
                let pn = &t.nodes[pi];
                if is_point_to_point(t, n) && is_point_to_point(t, pn) {
                    p = pn.parent.filter(|&q| q != pn.id);
                    continue;
                }
                if is_coll(pn) && !is_backend_annotation(t.name(pn)) {
                    nested = true;
                    break;
                }
                p = pn.parent.filter(|&q| q != pn.id);
            }
            if !nested {
                *collectives.entry(c).or_default() += 1;
            }
        }
        // By string after all: a hand-built trace may intern a name twice.
        let mut by_name: HashMap<&str, usize> = HashMap::new();
        for (sym, &c) in counts.iter().enumerate().filter(|&(_, &c)| c > 0) {
            *by_name
                .entry(t.strings.get(et_schema::Sym(sym as u32)))
                .or_default() += c;
        }
        let mut ops: Vec<(&str, usize)> = by_name.into_iter().collect();
        ops.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        let mut bytes_by_device = BTreeMap::new();
        for (&(_, dev), &b) in &storages {
            *bytes_by_device.entry(t.str(dev).to_string()).or_default() += b;
        }
        let mut devices: Vec<String> = devices.into_iter().map(String::from).collect();
        devices.sort();
        Summary {
            source: t.source.clone(),
            schema: t.meta.schema.clone(),
            layout: format!("{:?}", t.layout).to_lowercase(),
            nodes: t.nodes.len(),
            ops: ops.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            devices,
            tensors: TensorStats {
                count: seen_tensors.len(),
                storages: storages.len(),
                bytes: bytes_by_device.values().sum(),
                bytes_by_device,
                bytes_by_dtype: by_dtype,
            },
            iterations,
            process_groups,
            collectives,
            warnings: t.warnings.clone(),
        }
    }
}
