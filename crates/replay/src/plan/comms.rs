//! A communication-only replay reshaped before it runs: collectives kept by kind or count, and
//! the job's communication replayed on fewer ranks than captured (PARAM's auto-shrink).
//!
//! Both make a new [`Plan`] from the compiled one; the plan that runs is still immutable.

use super::*;

/// The collective kinds, as PARAM and nccl-tests name them; a collective of another kind
/// keeps its own name.
pub const KINDS: &[&str] = &[
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "send",
    "recv",
    "barrier",
    "wait",
];

impl Collective {
    /// Its kind (see [`KINDS`]): `c10d::_allgather_base_` and `allgather_` are `all_gather`,
    /// `alltoall_base_` (all-to-all-v) `all_to_all`, and so on.
    pub fn kind(&self) -> String {
        let flat: String = self
            .name
            .rsplit("::")
            .next()
            .unwrap_or_default()
            .chars()
            .filter(|c| *c != '_')
            .collect::<String>()
            .to_ascii_lowercase();
        let by_part = [
            ("allreduce", "all_reduce"),
            ("allgather", "all_gather"),
            ("reducescatter", "reduce_scatter"),
            ("alltoall", "all_to_all"),
        ];
        if let Some((_, k)) = by_part.iter().find(|(p, _)| flat.contains(p)) {
            return k.to_string();
        }
        let by_start = [
            "broadcast",
            "barrier",
            "reduce",
            "gather",
            "scatter",
            "send",
            "recv",
            "wait",
        ];
        match by_start.iter().find(|p| flat.starts_with(*p)) {
            Some(k) => k.to_string(),
            None => self.name.clone(),
        }
    }
}

/// Which collectives a communication-only replay runs, and on how many ranks.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CommSelection {
    /// Only collectives of these kinds ([`KINDS`]); waits always run.
    pub kinds: Option<Vec<String>>,
    /// Only the first this many collectives of each process group in the iteration (waits
    /// not counted), and of the sends and receives the first this many to each peer and from
    /// each, per tag: every member of a group keeps the same ones, and each pair of peers the
    /// same. Refused where a rank receives from any source.
    pub max: Option<usize>,
    /// Replay on this many ranks, of `captured` (the trace's world size): ranks `0..world`
    /// replay their own traces, every process group keeps its members among them, and the
    /// collectives whose tensors follow the group's size are resized.
    pub world: Option<(usize, usize)>,
}

/// Why a plan cannot be reshaped as asked.
#[derive(Debug, thiserror::Error)]
pub enum CommSelectError {
    #[error("{0}: not a collective kind (kinds: {kinds})", kinds = KINDS.join(", "))]
    UnknownKind(String),
    #[error(
        "{op} (node {id}) cannot run on {world} ranks: {why} (--world keeps ranks 0..{world} \
         of the capture)"
    )]
    CannotShrink {
        op: String,
        id: u64,
        world: usize,
        why: String,
    },
    #[error(
        "--allow-collectives: send and recv go together (a send whose receive is left out \
         waits for ever)"
    )]
    OneSided,
    #[error("--world {world}: the capture has {captured} ranks; --world replays on 1 to {captured} of them (compose world makes a larger job)")]
    World { world: usize, captured: usize },
    #[error(
        "--max-collectives: node {id} receives from any source (c10d::recv_any_source_), and \
         the ranks that send to it cannot cap their sends to match; replay without \
         --max-collectives"
    )]
    AnySource { id: u64 },
}

impl Plan {
    /// This plan with only the selected collectives (the others become steps a
    /// communication-only replay leaves out) on the selected ranks. Unchanged where nothing
    /// is selected.
    pub fn select_comm(&self, sel: &CommSelection) -> Result<Plan, CommSelectError> {
        let mut plan = self.clone();
        if let Some(kinds) = &sel.kinds {
            for k in kinds {
                if !KINDS.contains(&k.as_str()) {
                    return Err(CommSelectError::UnknownKind(k.clone()));
                }
            }
            // A send whose receive is left out would wait for ever, and the reverse.
            let has = |k: &str| kinds.iter().any(|x| x == k);
            if has("send") != has("recv") {
                return Err(CommSelectError::OneSided);
            }
        }
        // Counted per process group: its members issue its collectives in the same order, so
        // each keeps the same ones (counted over the whole iteration, a rank of a subgroup
        // could keep a collective its peers left out, and wait for it until the timeout).
        // A send or a receive is counted apart, per peer and way: only the two ranks of a pair
        // issue those, in the same order, and a middle stage of a pipeline sends and receives
        // where its neighbours only send or only receive (counted with the group's collectives,
        // its cap would fall on other collectives than theirs).
        // Gloo pairs a send with its receive by peer and tag, so the tag is part of the count.
        let mut kept: HashMap<(u32, Option<PointToPoint>), usize> = HashMap::new();
        for st in &mut plan.steps {
            let StepKind::Collective(c) = &st.kind else {
                continue;
            };
            let kind = c.kind();
            if kind == "wait" {
                continue;
            }
            if sel.max.is_some() && st.name == "c10d::recv_any_source_" {
                return Err(CommSelectError::AnySource { id: st.id });
            }
            let wanted = sel.kinds.as_ref().is_none_or(|k| k.contains(&kind));
            let p2p = point_to_point(&kind, st);
            let n = kept.entry((c.group, p2p)).or_default();
            let under_cap = sel.max.is_none_or(|m| *n < m);
            if wanted && under_cap {
                *n += 1;
            } else {
                st.kind = StepKind::Compute;
            }
        }
        if let Some((world, captured)) = sel.world {
            if world > captured || world == 0 {
                return Err(CommSelectError::World { world, captured });
            }
            if world < captured {
                shrink(&mut plan, world, captured)?;
            }
        }
        Ok(plan)
    }
}

/// What a send or a receive is counted by under `--max-collectives`: its way (`true`:
/// sends), its peer's group rank and its tag, read from `c10d::send(tensors, group, dst, tag)`
/// and `c10d::recv_(tensors, group, src, tag)` (`None` where the step records them otherwise:
/// counted apart from the pairs whose peer is known).
type PointToPoint = (bool, Option<i64>, Option<i64>);

/// [`PointToPoint`] of step `st` of kind `kind`; `None` for the group's collectives.
fn point_to_point(kind: &str, st: &Step) -> Option<PointToPoint> {
    let sends = match kind {
        "send" => true,
        "recv" => false,
        _ => return None,
    };
    let int = |k: usize| match st.args.get(k) {
        Some(Arg::Int(r)) if matches!(st.name.as_str(), "c10d::send" | "c10d::recv_") => Some(*r),
        _ => None,
    };
    Some((sends, int(2), int(3)))
}

/// Each group's members among ranks `0..world`, as (old group rank -> new group rank).
fn survivors(g: &GroupSpec, world: usize, captured: usize) -> Vec<Option<i64>> {
    let members: Vec<i64> = if g.ranks.is_empty() {
        (0..captured as i64).collect()
    } else {
        g.ranks.clone()
    };
    let mut next = 0;
    members
        .iter()
        .map(|&r| {
            (r < world as i64).then(|| {
                next += 1;
                next - 1
            })
        })
        .collect()
}

fn shrink(plan: &mut Plan, world: usize, captured: usize) -> Result<(), CommSelectError> {
    let maps: Vec<Vec<Option<i64>>> = plan
        .groups
        .iter()
        .map(|g| survivors(g, world, captured))
        .collect();
    for (g, map) in plan.groups.iter_mut().zip(&maps) {
        if g.ranks.is_empty() {
            g.size = world as i64;
        } else {
            g.ranks.retain(|&r| r < world as i64);
            g.size = g.ranks.len() as i64;
        }
        debug_assert_eq!(g.size as usize, map.iter().flatten().count());
    }
    let specs: Vec<Option<TensorSpec>> =
        plan.slot_specs().into_iter().map(|s| s.cloned()).collect();
    let mut next_slot = plan.n_slots as Slot;
    let mut new_externals = Vec::new();
    for st in &mut plan.steps {
        let StepKind::Collective(c) = &mut st.kind else {
            continue;
        };
        if c.kind() == "wait" {
            // A PARAM `wait` record moves nothing.
            continue;
        }
        let map = &maps[c.group as usize];
        let (n, n2) = (map.len(), map.iter().flatten().count());
        if n2 == 0 {
            // No replaying rank is in its group: no replaying rank's trace holds it.
            continue;
        }
        c.pg_size = Some(n2 as i64);
        if n2 == n {
            continue;
        }
        let (name, id) = (st.name.clone(), st.id);
        let fail = |why: String| CommSelectError::CannotShrink {
            op: name.clone(),
            id,
            world,
            why,
        };
        let peer = |args: &mut [Arg], k: usize, what: &str| -> Result<(), CommSelectError> {
            if let Some(Arg::Int(r)) = args.get_mut(k) {
                match map.get(*r as usize).copied().flatten() {
                    Some(to) => *r = to,
                    None => {
                        return Err(fail(format!(
                            "its {what} is group rank {r}, not among the ranks kept"
                        )))
                    }
                }
            }
            Ok(())
        };
        let mut resized = |slot: Slot, rows: Option<i64>| -> Result<Slot, CommSelectError> {
            let spec = specs
                .get(slot as usize)
                .cloned()
                .flatten()
                .ok_or_else(|| fail("a tensor of unknown size".into()))?;
            let dim0 = spec.shape.first().copied().unwrap_or(1);
            let rows = match rows {
                Some(r) => r,
                None if dim0 % n as i64 == 0 => dim0 / n as i64 * n2 as i64,
                None => {
                    return Err(fail(format!(
                        "its tensor's first dimension ({dim0}) does not split over {n} ranks"
                    )))
                }
            };
            let mut shape = spec.shape.clone();
            if shape.is_empty() {
                shape.push(rows);
            } else {
                shape[0] = rows;
            }
            let strides = contiguous_strides(&shape);
            let s = next_slot;
            next_slot += 1;
            new_externals.push((
                s,
                TensorSpec {
                    shape,
                    strides,
                    dtype: spec.dtype,
                    storage: 0,
                    offset: 0,
                },
                Fill::Zeros,
            ));
            Ok(s)
        };
        let keep = |list: &mut Vec<Option<Slot>>| {
            if list.len() == n {
                *list = list
                    .iter()
                    .zip(map)
                    .filter(|(_, m)| m.is_some())
                    .map(|(s, _)| *s)
                    .collect();
            }
        };
        match name.as_str() {
            "c10d::allreduce_" | "c10d::barrier" => {}
            "c10d::broadcast_" => peer(&mut st.args, 2, "root")?,
            "c10d::reduce_" => peer(&mut st.args, 3, "root")?,
            "c10d::send" => peer(&mut st.args, 2, "destination")?,
            "c10d::recv_" => peer(&mut st.args, 2, "source")?,
            "c10d::allgather_" | "c10d::reduce_scatter_" | "c10d::gather_" | "c10d::scatter_" => {
                let k = if name == "c10d::allgather_" || name == "c10d::gather_" {
                    0
                } else {
                    1
                };
                if let Some(Arg::TensorLists(lists)) = st.args.get_mut(k) {
                    lists.iter_mut().for_each(keep);
                }
                if name == "c10d::gather_" || name == "c10d::scatter_" {
                    peer(&mut st.args, 3, "root")?;
                }
            }
            "c10d::alltoall_" => {
                for k in 0..2 {
                    if let Some(Arg::TensorList { slots, .. }) = st.args.get_mut(k) {
                        keep(slots);
                    }
                }
            }
            "c10d::_allgather_base_" | "c10d::_reduce_scatter_base_" => {
                let k = usize::from(name == "c10d::_reduce_scatter_base_");
                if let Some(Arg::Tensor(s)) = st.args.get(k).cloned() {
                    st.args[k] = Arg::Tensor(resized(s, None)?);
                }
            }
            "c10d::alltoall_base_" => {
                // Splits (rows to and from each group rank) keep the kept ranks' entries.
                for (tensor, splits) in [(0usize, 3usize), (1, 4)] {
                    let rows = match st.args.get_mut(splits) {
                        Some(Arg::IntList(v)) if v.len() == n => {
                            *v = v
                                .iter()
                                .zip(map)
                                .filter(|(_, m)| m.is_some())
                                .map(|(x, _)| *x)
                                .collect();
                            Some(v.iter().sum())
                        }
                        Some(Arg::IntList(v)) if v.is_empty() => None,
                        _ => return Err(fail("its split sizes are not one per group rank".into())),
                    };
                    if let Some(Arg::Tensor(s)) = st.args.get(tensor).cloned() {
                        st.args[tensor] = Arg::Tensor(resized(s, rows)?);
                    }
                }
            }
            other => {
                return Err(fail(format!(
                    "{other} is not a collective whose tensors --world knows how to resize"
                )))
            }
        }
        c.in_split_size.clear();
        c.out_split_size.clear();
        // Its message as nccl-tests counts it, of the resized tensors.
        let bytes_of = |s: Slot| -> u64 {
            new_externals
                .iter()
                .find(|(x, _, _)| *x == s)
                .map(|(_, spec, _)| spec)
                .or_else(|| specs.get(s as usize).and_then(Option::as_ref))
                .map_or(0, TensorSpec::bytes)
        };
        // Per argument, as compiling counts them: a tensor list is one argument, its
        // tensors' bytes summed (an all-gather's output list is its message).
        let arg_bytes = |a: &Arg| -> u64 { a.slots().into_iter().map(bytes_of).sum() };
        c.size_bytes = st.args.iter().map(arg_bytes).max().unwrap_or(0);
        c.bytes = st.args.iter().map(arg_bytes).sum();
    }
    plan.externals.extend(new_externals);
    plan.n_slots = next_slot as usize;
    Ok(())
}

fn contiguous_strides(shape: &[i64]) -> Vec<i64> {
    let mut strides = vec![1; shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        strides[k] = strides[k + 1] * shape[k + 1].max(1);
    }
    strides
}
