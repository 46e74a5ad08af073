//! How collectives run beyond the trace's order (`CommOptions`): a barrier around each one
//! (`--blocking`), and known inputs through each one with its result verified
//! (`--check-collectives`).

use super::*;
use crate::plan::StepKind;

/// What a checked collective's outputs must hold: per output tensor (with the rows of its
/// first dimension to compare, `None`: all of it), the value of every element.
pub(crate) type Expected = Vec<(Tensor, Option<(i64, i64)>, f64)>;

/// The value group rank `j` puts in every element of its inputs to a collective that copies
/// (all-gather, all-to-all, broadcast, gather, scatter, send): where it lands tells whose it is.
fn value_of(j: i64) -> f64 {
    (j + 1) as f64
}

/// What reduction `code` (`c10d::ReduceOp`) makes of `n` ranks' inputs of ones (a reduction's
/// inputs are ones: a sum of `n` ones stays exact where a sum of the ranks' numbers would not,
/// in bfloat16 from 23 ranks); `None` for one this check does not model (bitwise,
/// pre-multiplied).
fn reduced(code: u8, n: i64) -> Option<f64> {
    match code {
        0 => Some(n as f64),
        1..=4 => Some(1.0),
        _ => None,
    }
}

/// The largest integer every smaller one of which `kind` holds exactly (0: none is checked).
fn exact_up_to(kind: Kind) -> f64 {
    match kind {
        Kind::Bool => 0.0,
        Kind::Int8 => 127.0,
        Kind::Uint8 => 255.0,
        Kind::BFloat16 => 256.0,
        Kind::Half => 2048.0,
        Kind::Int16 => 32767.0,
        _ => 16_777_216.0,
    }
}

/// What fault injection adds to a rank's inputs.
const CORRUPTION: f64 = 100.0;

/// An all-to-all's equal re-split (`--rebalance equal`): its arguments with the split sizes
/// replaced, and its output and input tensors of the new size.
pub(crate) struct Rebalanced {
    pub args: Vec<Arg>,
    out: Tensor,
    input: Tensor,
}

impl Executor<'_> {
    /// This rank's place in step `pos`'s process group: (group rank, group size).
    fn place_in_group(&self, pos: usize) -> Option<(i64, i64)> {
        let comm = self.comm.as_ref()?;
        let StepKind::Collective(c) = &self.plan.steps[pos].kind else {
            return None;
        };
        let g = self.plan.groups.get(c.group as usize)?;
        if g.ranks.is_empty() {
            Some((comm.rank as i64, comm.size as i64))
        } else {
            let me = g.ranks.iter().position(|&r| r == comm.rank as i64)?;
            Some((me as i64, g.ranks.len() as i64))
        }
    }

    /// A barrier on step `pos`'s process group (`--blocking`), waited for.
    pub(super) fn barrier(&mut self, pos: usize) -> Result<(), CallError> {
        let Some(comm) = self.comm.as_ref() else {
            return Ok(());
        };
        let StepKind::Collective(c) = &self.plan.steps[pos].kind else {
            return Ok(());
        };
        if self.barrier_op.is_none() {
            self.barrier_op = Some(ffi::Op::find("c10d::barrier", "")?);
        }
        let op = self.barrier_op.as_ref().expect("found above");
        let token = Tensor::zeros([1], (Kind::Uint8, tch::Device::Cpu));
        let st = &mut self.stack;
        st.tensor(&token);
        let pushed = st
            .group(comm, c.group as i64)
            .and_then(|()| {
                st.int_list(&[]);
                st.bool(false);
                st.default_of(op, 4)
            })
            .and_then(|()| st.call(op, false))
            .and_then(|()| st.wait_works(self.timeout));
        st.clear();
        pushed
    }

    /// With `--check-collectives`, before step `pos` (a collective) runs: fills its inputs with
    /// known values (each group rank's value, [`value_of`]) and returns what its outputs must
    /// hold after it; `None` for a step it does not check. `corrupt`: this rank's inputs are
    /// off by 1000 (fault injection, to see the check fail).
    pub(super) fn check_inputs(
        &self,
        pos: usize,
        slots: &mut [Option<Tensor>],
        corrupt: bool,
    ) -> Option<Expected> {
        let (me, n) = self.place_in_group(pos)?;
        let args = match self.rebalanced.get(&pos) {
            Some(r) => r.args.as_slice(),
            None => self.bound.args(self.plan, pos),
        };
        let tensor = |k: usize| match args.get(k) {
            Some(Arg::Tensor(s)) => slots[*s as usize].as_ref().map(Tensor::shallow_clone),
            _ => None,
        };
        let list = |k: usize| -> Vec<Tensor> {
            match args.get(k) {
                Some(Arg::TensorList { slots: l, .. }) => l
                    .iter()
                    .flatten()
                    .filter_map(|s| slots[*s as usize].as_ref().map(Tensor::shallow_clone))
                    .collect(),
                _ => Vec::new(),
            }
        };
        let lists = |k: usize| -> Vec<Tensor> {
            match args.get(k) {
                Some(Arg::TensorLists(ls)) => ls
                    .first()
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter_map(|s| slots[*s as usize].as_ref().map(Tensor::shallow_clone))
                    .collect(),
                _ => Vec::new(),
            }
        };
        let int = |k: usize| match args.get(k) {
            Some(Arg::Int(v)) => Some(*v),
            _ => None,
        };
        let reduce_op = |k: usize| match args.get(k) {
            Some(Arg::ReduceOp(c)) => *c,
            _ => 0,
        };
        let off = if corrupt { CORRUPTION } else { 0.0 };
        // Values the tensors' dtype cannot hold exactly are not checked (reported unchecked).
        let kind = args
            .iter()
            .flat_map(Arg::slots)
            .find_map(|s| slots[s as usize].as_ref().map(Tensor::kind))?;
        if n as f64 + off > exact_up_to(kind) {
            return None;
        }
        let mine = value_of(me) + off;
        let one = 1.0 + off;
        let fill = |ts: &[Tensor], v: f64| {
            for t in ts {
                let mut t = t.shallow_clone();
                let _ = t.f_fill_(v);
            }
        };
        let whole = |ts: Vec<Tensor>, v: f64| -> Expected {
            ts.into_iter().map(|t| (t, None, v)).collect()
        };
        // Chunks of the first dimension: one per group rank, each from its rank.
        let chunks = |t: Tensor, rows: &[i64]| -> Expected {
            let mut at = 0;
            rows.iter()
                .enumerate()
                .map(|(j, &r)| {
                    let e = (t.shallow_clone(), Some((at, r)), value_of(j as i64));
                    at += r;
                    e
                })
                .collect()
        };
        let equal_rows = |t: &Tensor| -> Vec<i64> {
            let d0 = t.size().first().copied().unwrap_or(0);
            vec![d0 / n.max(1); n as usize]
        };
        // Outputs start as zeros, which no input holds: a collective that wrote nothing fails.
        let zero = |ts: &[Tensor]| fill(ts, 0.0);
        let name = self.plan.steps[pos].name.as_str();
        let expected = match name {
            "c10d::allreduce_" => {
                let ts = list(0);
                fill(&ts, one);
                whole(ts, reduced(reduce_op(2), n)?)
            }
            "c10d::broadcast_" => {
                let ts = list(0);
                fill(&ts, mine);
                whole(ts, value_of(int(2)?))
            }
            "c10d::reduce_" => {
                let ts = list(0);
                fill(&ts, one);
                let root = int(3)?;
                if me == root {
                    whole(ts, reduced(reduce_op(2), n)?)
                } else {
                    Vec::new()
                }
            }
            "c10d::allgather_" => {
                let outs = lists(0);
                zero(&outs);
                fill(&list(1), mine);
                outs.into_iter()
                    .enumerate()
                    .map(|(j, t)| (t, None, value_of(j as i64)))
                    .collect()
            }
            "c10d::_allgather_base_" => {
                let (out, input) = (tensor(0)?, tensor(1)?);
                zero(std::slice::from_ref(&out));
                fill(std::slice::from_ref(&input), mine);
                let rows = equal_rows(&out);
                chunks(out, &rows)
            }
            "c10d::reduce_scatter_" => {
                zero(&list(0));
                fill(&lists(1), one);
                whole(list(0), reduced(reduce_op(3), n)?)
            }
            "c10d::_reduce_scatter_base_" => {
                let (out, input) = (tensor(0)?, tensor(1)?);
                zero(std::slice::from_ref(&out));
                fill(std::slice::from_ref(&input), one);
                whole(vec![out], reduced(reduce_op(3), n)?)
            }
            "c10d::alltoall_base_" => {
                let (out, input) = (tensor(0)?, tensor(1)?);
                zero(std::slice::from_ref(&out));
                fill(std::slice::from_ref(&input), mine);
                let rows = match args.get(3) {
                    Some(Arg::IntList(v)) if v.len() == n as usize => v.clone(),
                    _ => equal_rows(&out),
                };
                chunks(out, &rows)
            }
            "c10d::alltoall_" => {
                zero(&list(0));
                fill(&list(1), mine);
                list(0)
                    .into_iter()
                    .enumerate()
                    .map(|(j, t)| (t, None, value_of(j as i64)))
                    .collect()
            }
            "c10d::gather_" => {
                zero(&lists(0));
                fill(&list(1), mine);
                if me == int(3)? {
                    lists(0)
                        .into_iter()
                        .enumerate()
                        .map(|(j, t)| (t, None, value_of(j as i64)))
                        .collect()
                } else {
                    Vec::new()
                }
            }
            "c10d::scatter_" => {
                zero(&list(0));
                // The root sends group rank k the value of k.
                for (k, t) in lists(1).iter().enumerate() {
                    fill(std::slice::from_ref(t), value_of(k as i64) + off);
                }
                whole(list(0), value_of(me))
            }
            "c10d::send" => {
                fill(&list(0), mine);
                Vec::new()
            }
            "c10d::recv_" => {
                zero(&list(0));
                whole(list(0), value_of(int(2)?))
            }
            // Nothing to verify: it completed on every rank.
            "c10d::barrier" => Vec::new(),
            _ => return None,
        };
        Some(expected)
    }

    /// After a checked collective completed: where an output does not hold what its inputs
    /// make, what it held.
    pub(super) fn check_outputs(&self, expected: &Expected) -> Result<(), String> {
        for (k, (t, rows, want)) in expected.iter().enumerate() {
            let t = match rows {
                Some((at, n)) if *n > 0 => match t.f_narrow(0, *at, *n) {
                    Ok(x) => x,
                    Err(e) => return Err(format!("output {k}: {e}")),
                },
                Some(_) => continue,
                None => t.shallow_clone(),
            };
            if t.numel() == 0 || t.kind() == Kind::Bool {
                continue;
            }
            let as_f64 = |x: Result<Tensor, tch::TchError>| {
                x.and_then(|x| x.f_to_kind(Kind::Double))
                    .ok()
                    .and_then(|x| x.f_double_value(&[]).ok())
            };
            let (lo, hi) = (as_f64(t.f_min()), as_f64(t.f_max()));
            let close =
                |v: Option<f64>| v.is_some_and(|v| (v - want).abs() <= 1e-3 * want.abs().max(1.0));
            if !close(lo) || !close(hi) {
                let rows = rows.map_or(String::new(), |(a, n)| format!(" rows {a}..{}", a + n));
                return Err(format!(
                    "output {k}{rows} should hold {want} in every element (each rank's inputs \
                     hold its group rank + 1, or 1 for a reduction), it holds {} to {}",
                    lo.map_or("?".into(), |v| v.to_string()),
                    hi.map_or("?".into(), |v| v.to_string())
                ));
            }
        }
        Ok(())
    }

    /// With `--rebalance equal`, before all-to-all step `pos` (`c10d::alltoall_base_`): every
    /// rank of its group sends each the same rows, the mean of what the group's ranks sent in
    /// the trace split evenly (PARAM's `equal` policy). The first call agrees on it with an
    /// all-reduce of the ranks' rows over the group; later calls reuse it. Puts the step's
    /// tensors in `slots`. Returns the message bytes when it first re-split the step.
    pub(super) fn rebalance(
        &mut self,
        pos: usize,
        slots: &mut [Option<Tensor>],
    ) -> Result<Option<u64>, CallError> {
        if self.plan.steps[pos].name != "c10d::alltoall_base_" {
            return Ok(None);
        }
        let args = self.bound.args(self.plan, pos).to_vec();
        let (Some(Arg::Tensor(out)), Some(Arg::Tensor(input))) = (args.first(), args.get(1)) else {
            return Ok(None);
        };
        let (out, input) = (*out as usize, *input as usize);
        let mut first = None;
        if !self.rebalanced.contains_key(&pos) {
            // Every member of the group agrees below: none may leave it without a word.
            let missing = |what: &str| CallError::unsupported(format!("--rebalance: {what}"));
            let (_, n) = self
                .place_in_group(pos)
                .ok_or_else(|| missing("this rank is not in the all-to-all's group"))?;
            let t = slots[input]
                .as_ref()
                .map(Tensor::shallow_clone)
                .ok_or_else(|| missing("the all-to-all's input has no tensor"))?;
            if args.len() < 5 {
                return Err(missing("the all-to-all has no split sizes"));
            }
            let shape = t.size();
            let rows = shape.first().copied().unwrap_or(0);
            let total = self.group_sum(pos, rows)?;
            // As PARAM rounds it: the group's rows over n x n, times n per rank.
            let per_rank = ((total as f64 / (n * n) as f64).round() as i64) * n;
            let split = vec![per_rank / n; n as usize];
            let mut new_shape = shape.clone();
            if new_shape.is_empty() {
                new_shape.push(per_rank);
            } else {
                new_shape[0] = per_rank;
            }
            let opts = (t.kind(), t.device());
            let make = || Tensor::f_zeros(new_shape.as_slice(), opts);
            let (o, i) = (make().map_err(tch_error)?, make().map_err(tch_error)?);
            let bytes = (i.numel() * i.kind().elt_size_in_bytes()) as u64;
            let mut new_args = args.clone();
            new_args[3] = Arg::IntList(split.clone());
            new_args[4] = Arg::IntList(split);
            first = Some(bytes);
            self.rebalanced.insert(
                pos,
                Rebalanced {
                    args: new_args,
                    out: o,
                    input: i,
                },
            );
        }
        let r = &self.rebalanced[&pos];
        slots[out] = Some(r.out.shallow_clone());
        slots[input] = Some(r.input.shallow_clone());
        Ok(first)
    }

    /// Before the first iteration, over each process group this rank is in (in the plan's
    /// order, which every rank takes): its members' collectives must be the same kinds in the
    /// same order, of the same message size where every member gives the same (all-reduce,
    /// broadcast, reduce, all-gather, reduce-scatter, barrier). Gloo aborts a rank's process on
    /// a collective whose sizes differ between ranks ("Received data size doesn't match
    /// expected size"), and waits until the timeout for one a member never issues; this finds
    /// either before, and names it. Per group, three all-reduces: how many collectives each
    /// member has, then one code per collective, its largest and its smallest over the group
    /// (equal where all agree). Every group is compared before any rank stops, and a last
    /// all-reduce over the world stops every rank where any group's members disagree (a rank
    /// outside that group would otherwise run on into a collective that never completes).
    /// Sends and receives (a pair's, not the group's) and waits are left out. On the CPU
    /// (Gloo) only.
    pub(super) fn agree_on_collectives(&mut self, only: et_graph::Kind) -> Result<(), ReplayError> {
        let Some(comm) = self.comm.as_ref() else {
            return Ok(());
        };
        if !matches!(self.bound.device, crate::Device::Cpu) {
            return Ok(());
        }
        let me = comm.rank;
        let mut first: Option<ReplayError> = None;
        // Group 0 is the world, also where the trace recorded no group; another group has
        // the members it lists, as `dist::connect` made it (none where it lists none).
        for gi in 0..self.plan.groups.len().max(1) {
            let g = self.plan.groups.get(gi);
            let name = g.map_or("the world".to_string(), |g| {
                format!("{:?} ({})", g.name, g.desc)
            });
            if gi > 0 && !g.is_some_and(|g| g.ranks.contains(&(me as i64))) {
                continue;
            }
            let seq: Vec<(i64, usize)> = self
                .plan
                .steps
                .iter()
                .enumerate()
                .filter(|(_, st)| st.kind.included(only))
                .filter_map(|(pos, st)| match &st.kind {
                    StepKind::Collective(c) if c.group as usize == gi => {
                        collective_code(c).map(|code| (code, pos))
                    }
                    _ => None,
                })
                .collect();
            let fail = |e: CallError| ReplayError::Dist {
                rank: me,
                what: format!("comparing process group {name}'s collectives"),
                source: e,
            };
            let n = self
                .group_all_reduce(gi as u32, &[seq.len() as i64], MAX)
                .map_err(fail)?[0] as usize;
            let mut codes: Vec<i64> = seq.iter().map(|s| s.0).collect();
            codes.resize(n, 0);
            let hi = self
                .group_all_reduce(gi as u32, &codes, MAX)
                .map_err(fail)?;
            let lo = self
                .group_all_reduce(gi as u32, &codes, MIN)
                .map_err(fail)?;
            let Some(i) = (0..n).find(|&i| hi[i] != lo[i]) else {
                continue;
            };
            if first.is_some() {
                continue;
            }
            let other = if hi[i] != codes[i] { hi[i] } else { lo[i] };
            let what = match seq.get(i) {
                Some(&(code, pos)) => format!(
                    "its collective #{} is {} here (node {}) and {} on another rank",
                    i + 1,
                    describe_code(code),
                    self.plan.steps[pos].id,
                    describe_code(other)
                ),
                None => format!(
                    "this rank issues {} collectives on it, another rank more: its #{} is {}",
                    seq.len(),
                    i + 1,
                    describe_code(other)
                ),
            };
            first = Some(ReplayError::RanksDisagree {
                rank: me,
                group: name,
                what,
            });
        }
        let found = self
            .group_all_reduce(0, &[first.is_some() as i64], MAX)
            .map_err(|e| ReplayError::Dist {
                rank: me,
                what: "telling the ranks whether their collectives agree".into(),
                source: e,
            })?[0];
        match first {
            Some(e) => Err(e),
            None if found > 0 => Err(ReplayError::RanksDisagree {
                rank: me,
                group: "of other ranks".into(),
                what: "this rank's own groups agree; another rank's error names the collective"
                    .into(),
            }),
            None => Ok(()),
        }
    }

    /// The sum of `value` over step `pos`'s process group.
    fn group_sum(&mut self, pos: usize, value: i64) -> Result<i64, CallError> {
        let StepKind::Collective(c) = &self.plan.steps[pos].kind else {
            return Ok(value);
        };
        Ok(self.group_all_reduce(c.group, &[value], SUM)?[0])
    }

    /// `values` reduced element by element with `c10d::ReduceOp` `reduction` over process
    /// group `group` (an all-reduce of int64s, waited for); as they are without one.
    fn group_all_reduce(
        &mut self,
        group: u32,
        values: &[i64],
        reduction: u8,
    ) -> Result<Vec<i64>, CallError> {
        let Some(comm) = self.comm.as_ref() else {
            return Ok(values.to_vec());
        };
        if values.is_empty() {
            return Ok(Vec::new());
        }
        let op = ffi::Op::find("c10d::allreduce_", "")?;
        let t = Tensor::from_slice(values);
        let st = &mut self.stack;
        st.tensor_list(&[Some(&t)]);
        let done = st
            .group(comm, group as i64)
            .and_then(|()| {
                st.reduce_op(reduction);
                st.none();
                st.bool(false);
                st.default_of(&op, 5)
            })
            .and_then(|()| st.call(&op, false))
            .and_then(|()| st.wait_works(self.timeout));
        st.clear();
        done?;
        Vec::<i64>::try_from(&t).map_err(tch_error)
    }
}

/// `c10d::ReduceOp::SUM`.
const SUM: u8 = 0;

/// `c10d::ReduceOp::MIN`.
const MIN: u8 = 3;

/// `c10d::ReduceOp::MAX`.
const MAX: u8 = 4;

/// Bits of a [`collective_code`] below its kind: its size in bytes.
const SIZE_BITS: u32 = 48;

/// What every member of a collective's group must agree on, as one number: its kind (its
/// place in [`crate::plan::KINDS`] + 1, or one past them for a kind not listed) above
/// [`SIZE_BITS`], and below it its message size where every member has the same one (0 for
/// the kinds whose sizes differ by rank: all-to-all's splits, gather's and scatter's root).
/// The message size ([`crate::plan::Collective::message_bytes`]: an all-gather's whole
/// output, a reduce-scatter's whole input) is the same on every rank where the inputs are
/// not (an uneven all-gather's). `None` for those not the group's: sends, receives, waits.
fn collective_code(c: &crate::plan::Collective) -> Option<i64> {
    let kind = c.kind();
    if matches!(kind.as_str(), "send" | "recv" | "wait") {
        return None;
    }
    let kinds = crate::plan::KINDS;
    let k = kinds.iter().position(|x| *x == kind).unwrap_or(kinds.len()) as i64 + 1;
    let same = matches!(
        kind.as_str(),
        "all_reduce" | "broadcast" | "reduce" | "all_gather" | "reduce_scatter" | "barrier"
    );
    let bytes = if same {
        (c.message_bytes() as i64) & ((1 << SIZE_BITS) - 1)
    } else {
        0
    };
    Some((k << SIZE_BITS) | bytes)
}

/// A [`collective_code`] in words.
fn describe_code(code: i64) -> String {
    let kinds = crate::plan::KINDS;
    let kind = match (code >> SIZE_BITS) as usize {
        0 => return "none".into(),
        k => kinds
            .get(k - 1)
            .copied()
            .unwrap_or("a collective of another kind"),
    };
    match code & ((1 << SIZE_BITS) - 1) {
        0 => kind.to_string(),
        b => format!("{kind} of {b} bytes"),
    }
}

fn tch_error(e: tch::TchError) -> CallError {
    CallError::new(ErrorKind::Other, e.to_string())
}
