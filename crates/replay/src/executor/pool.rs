//! The buffers of a communication-only replay (see `plan/pool.rs`): views of pooled buffers,
//! taken before a collective, handed back when no slot and no outstanding work holds them.

use super::*;
use crate::plan::{pool_key, PoolKey, Slot};

/// Buffers by [`PoolKey`]; one is free when nothing but the pool holds its storage.
pub(crate) struct Pool {
    specs: Vec<Option<TensorSpec>>,
    /// Per step, the slots to drop after it ([`Plan::comm_releases`]).
    releases: Vec<Vec<Slot>>,
    buffers: HashMap<PoolKey, Vec<Tensor>>,
    /// Bytes of every buffer made.
    pub bytes: u64,
    /// Buffers made.
    pub count: usize,
}

impl Pool {
    pub fn new(plan: &Plan) -> Self {
        Pool {
            specs: plan.slot_specs().into_iter().map(|s| s.cloned()).collect(),
            releases: plan.comm_releases(),
            buffers: HashMap::new(),
            bytes: 0,
            count: 0,
        }
    }

    /// Makes the buffers the plan says the pool needs ([`Plan::pooled_buffers`]) now, before
    /// any iteration: making them is not the original's work, and inside the first measured
    /// iteration it would count in that iteration's CPU time.
    pub fn prewarm(&mut self, plan: &Plan, device: &Device) {
        let mut need: Vec<(PoolKey, usize)> = plan.pooled_buffers().into_iter().collect();
        need.sort_unstable_by_key(|((d, n), _)| (d.name(), *n));
        for (key, count) in need {
            for _ in 0..count {
                if self.make(key, device).is_none() {
                    return;
                }
            }
        }
    }

    /// A new buffer of `key`, counted and kept; the pool's handle to it.
    fn make(&mut self, key: PoolKey, device: &Device) -> Option<Tensor> {
        let flat = TensorSpec::flat(key.0, key.1);
        let b = device.synthesise(&flat)?;
        self.bytes = self.bytes.saturating_add(flat.bytes());
        self.count += 1;
        self.buffers.entry(key).or_default().push(b.shallow_clone());
        Some(b)
    }

    /// Fills each empty slot of `wanted` with a view of a pooled buffer of its spec.
    pub fn fill(&mut self, wanted: &[Slot], slots: &mut [Option<Tensor>], device: &Device) {
        for &s in wanted {
            if slots.get(s as usize).is_some_and(Option::is_none) {
                slots[s as usize] = self.take(s, device);
            }
        }
    }

    /// The slots released after step `pos`.
    pub fn released(&self, pos: usize) -> &[Slot] {
        self.releases.get(pos).map_or(&[][..], Vec::as_slice)
    }

    /// Drops the slots released after step `pos`.
    pub fn release(&self, pos: usize, slots: &mut [Option<Tensor>]) {
        for &s in self.released(pos) {
            if let Some(x) = slots.get_mut(s as usize) {
                *x = None;
            }
        }
    }

    /// A view of a free buffer for slot `s` (a new buffer when none is free).
    fn take(&mut self, s: Slot, device: &Device) -> Option<Tensor> {
        let key = pool_key(self.specs.get(s as usize)?.as_ref()?);
        // The pool's own handle is the storage's only user: no slot views it, and no work
        // (an outstanding collective holds its tensors) uses it.
        let free = self
            .buffers
            .get(&key)
            .and_then(|list| list.iter().find(|b| ffi::storage_use_count(b) <= 1))
            .map(Tensor::shallow_clone);
        let base = match free {
            Some(b) => b,
            None => self.make(key, device)?,
        };
        let spec = self.specs[s as usize].as_ref()?;
        base.f_as_strided(spec.shape.as_slice(), spec.strides.as_slice(), 0)
            .ok()
    }
}
