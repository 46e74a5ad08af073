//! Frees placed where the original freed its tensors, from a profile's memory events
//! ([`et_graph::OriginalAllocs`]), rather than at each tensor's last use.

use super::*;
use std::collections::{HashMap, HashSet};

/// How a plan's frees followed the original's ([`Plan::follow_frees`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FreesFollowed {
    /// Storages the steps make: outputs on a storage that none of the step's inputs holds.
    pub storages: usize,
    /// Of those, matched to one of the original's allocations by op and size.
    pub matched: usize,
    /// Of the matched, freed later than at their last use.
    pub delayed: usize,
    /// Of the matched, held to the iteration's end, as the original held them past it.
    pub held: usize,
}

impl Plan {
    /// Moves the frees of the storages each step makes to where the original freed them: each
    /// is matched, in order, to an allocation of the same size the original's op made and held
    /// past its end (`allocs`, by position in `set`), and is freed after the step of the op
    /// the original freed it after, or with the iteration's last step where the original held
    /// it past the iteration. Never before its last use; storages not matched keep their free
    /// at last use.
    pub fn follow_frees(
        &mut self,
        set: &et_graph::ReplaySet,
        allocs: &et_graph::OriginalAllocs,
    ) -> FreesFollowed {
        let mut out = FreesFollowed::default();
        let n = self.steps.len();
        if n == 0 {
            return out;
        }
        let pos_of: HashMap<u32, usize> =
            set.ops.iter().enumerate().map(|(p, &i)| (i, p)).collect();
        // Each set position's step, else the nearest earlier position's.
        let mut step_of_pos: Vec<Option<usize>> = vec![None; set.ops.len()];
        for (si, st) in self.steps.iter().enumerate() {
            if let Some(&p) = pos_of.get(&st.node) {
                step_of_pos[p] = Some(si);
            }
        }
        let mut last = None;
        for s in step_of_pos.iter_mut() {
            if s.is_some() {
                last = *s;
            } else {
                *s = last;
            }
        }
        let storage: Vec<Option<(u64, u64)>> = self
            .slot_specs()
            .iter()
            .map(|s| s.map(|s| (s.storage, s.bytes())))
            .collect();
        let externals: HashSet<Slot> = self.externals.iter().map(|(s, _, _)| *s).collect();
        let mut free_step: HashMap<Slot, usize> = HashMap::new();
        for (si, st) in self.steps.iter().enumerate() {
            for &s in &st.frees {
                free_step.insert(s, si);
            }
        }
        let mut moves: Vec<(Slot, usize, usize)> = Vec::new();
        for (si, st) in self.steps.iter().enumerate() {
            let Some(&pos) = pos_of.get(&st.node) else {
                continue;
            };
            let Some(original) = allocs.per_op.get(pos) else {
                continue;
            };
            let of = |s: Slot| storage.get(s as usize).copied().flatten();
            let inputs: HashSet<u64> = st
                .args
                .iter()
                .flat_map(Arg::slots)
                .filter_map(|s| of(s).map(|(id, _)| id))
                .filter(|&id| id != 0)
                .collect();
            // The storages this step makes, in output order, with their slots and bytes.
            let mut made: Vec<(u64, u64, Vec<Slot>)> = Vec::new();
            for s in st.outs.iter().flat_map(Out::slots) {
                let Some((id, bytes)) = of(s) else { continue };
                if externals.contains(&s) || inputs.contains(&id) || bytes == 0 {
                    continue;
                }
                match made.iter_mut().find(|m| id != 0 && m.0 == id) {
                    Some(m) => {
                        m.1 = m.1.max(bytes);
                        m.2.push(s);
                    }
                    None => made.push((id, bytes, vec![s])),
                }
            }
            let mut used = vec![false; original.len()];
            for (_, bytes, slots) in made {
                out.storages += 1;
                let Some(k) = (0..original.len()).find(|&k| !used[k] && original[k].bytes == bytes)
                else {
                    continue;
                };
                used[k] = true;
                out.matched += 1;
                let target = match original[k].freed_after {
                    Some(p) => step_of_pos.get(p).copied().flatten().unwrap_or(si),
                    None => {
                        out.held += 1;
                        n - 1
                    }
                };
                let mut delayed = false;
                for s in slots {
                    if let Some(&cur) = free_step.get(&s) {
                        if target > cur {
                            moves.push((s, cur, target));
                            delayed = true;
                        }
                    }
                }
                out.delayed += usize::from(delayed);
            }
        }
        for (s, from, to) in moves {
            self.steps[from].frees.retain(|&x| x != s);
            self.steps[to].frees.push(s);
        }
        out
    }
}
