//! A communication-only replay's buffers. With `--only comm` the values a collective carries do
//! not matter (the compute that made and reads them is left out), only their sizes and dtypes:
//! each tensor a collective touches is a view of a buffer from a pool keyed by dtype and
//! element count, taken just before the collective and handed back after the last collective
//! (or the wait paired with it) that touches the slot. A rank then holds about the bytes of
//! the collectives in flight at once, not every collective's tensor of the iteration.

use super::*;

/// What a buffer of the pool is for: its dtype and element count.
pub type PoolKey = (DType, i64);

/// The pool key of a tensor spec: its dtype and the elements its sizes and strides reach from
/// its first element (the storage offset is not kept: the view starts at the buffer's start).
pub fn pool_key(spec: &TensorSpec) -> PoolKey {
    let reach = spec.extent().saturating_sub(spec.offset.max(0)).max(1);
    (spec.dtype, reach)
}

impl Plan {
    /// Per step, the slots a communication-only replay hands back to the pool after it: those
    /// whose last use among the collectives is that step, or the later step that waits for
    /// the collective's work (an asynchronous collective's buffers stay in use until then).
    /// Empty for the steps `--only comm` leaves out.
    pub fn comm_releases(&self) -> Vec<Vec<Slot>> {
        let mut last: HashMap<Slot, usize> = HashMap::new();
        for (pos, st) in self.steps.iter().enumerate() {
            let StepKind::Collective(c) = &st.kind else {
                continue;
            };
            let until = c.waits.iter().copied().filter(|&w| w > pos).max();
            let until = until.unwrap_or(pos).max(pos);
            for s in comm_touched(st) {
                let e = last.entry(s).or_insert(until);
                *e = (*e).max(until);
            }
        }
        let mut releases = vec![Vec::new(); self.steps.len()];
        for (slot, pos) in last {
            releases[pos].push(slot);
        }
        for r in &mut releases {
            r.sort_unstable();
        }
        releases
    }

    /// The bytes a communication-only replay's pool reaches ([`Plan::pooled_buffers`]).
    pub fn pooled_peak_bytes(&self) -> u64 {
        self.pooled_buffers()
            .iter()
            .map(|((dtype, n), count)| {
                (*n as u64)
                    .saturating_mul(dtype.size_bytes() as u64)
                    .saturating_mul(*count as u64)
            })
            .fold(0u64, u64::saturating_add)
    }

    /// The buffers a communication-only replay's pool needs, per key: the steps walked in
    /// order, a buffer taken for each slot a collective touches that holds none, returned at
    /// its release ([`Plan::comm_releases`]); per key, the most buffers in use at once, and
    /// one more where several collectives take one: the backend's thread lets go of a finished
    /// collective's tensors a moment after its wait returns, and the next collective may
    /// come before that.
    pub fn pooled_buffers(&self) -> HashMap<PoolKey, usize> {
        let specs = self.slot_specs();
        let releases = self.comm_releases();
        // Buffers by id: their key and how many held slots view them. An output the trace
        // records over an input's storage (an in-place collective) views the input's buffer.
        let mut bufs: Vec<(PoolKey, usize)> = Vec::new();
        let mut in_use: HashMap<PoolKey, usize> = HashMap::new();
        let mut most: HashMap<PoolKey, usize> = HashMap::new();
        let mut held: HashMap<Slot, usize> = HashMap::new();
        let mut takes: HashMap<PoolKey, usize> = HashMap::new();
        for (pos, st) in self.steps.iter().enumerate() {
            if st.kind.is_collective() {
                let mut by_storage: HashMap<u64, usize> = HashMap::new();
                for s in comm_touched(st) {
                    let Some(spec) = specs.get(s as usize).copied().flatten() else {
                        continue;
                    };
                    if let Some(&b) = held.get(&s) {
                        if spec.storage != 0 {
                            by_storage.insert(spec.storage, b);
                        }
                        continue;
                    }
                    let b = match by_storage.get(&spec.storage).filter(|_| spec.storage != 0) {
                        Some(&b) => b,
                        None => {
                            let key = pool_key(spec);
                            let n = in_use.entry(key).or_default();
                            *n += 1;
                            let m = most.entry(key).or_default();
                            *m = (*m).max(*n);
                            *takes.entry(key).or_default() += 1;
                            bufs.push((key, 0));
                            bufs.len() - 1
                        }
                    };
                    bufs[b].1 += 1;
                    if spec.storage != 0 {
                        by_storage.insert(spec.storage, b);
                    }
                    held.insert(s, b);
                }
            }
            for s in &releases[pos] {
                let Some(b) = held.remove(s) else { continue };
                let (key, refs) = &mut bufs[b];
                *refs = refs.saturating_sub(1);
                if *refs == 0 {
                    if let Some(n) = in_use.get_mut(key) {
                        *n = n.saturating_sub(1);
                    }
                }
            }
        }
        for (key, m) in &mut most {
            if takes.get(key).is_some_and(|&t| t > *m) {
                *m += 1;
            }
        }
        most
    }
}

/// The slots a collective step reads or writes: its tensor arguments, the bases of the views
/// it reads, and its outputs.
fn comm_touched(st: &Step) -> Vec<Slot> {
    let mut out: Vec<Slot> = st.args.iter().flat_map(Arg::slots).collect();
    out.extend(st.views.iter().map(|v| v.base));
    out.extend(st.out_specs.iter().map(|(s, _)| *s));
    out.sort_unstable();
    out.dedup();
    out
}
