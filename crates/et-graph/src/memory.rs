//! Where the original freed what its ops allocated, from a profile's memory events
//! (`torch.profiler(profile_memory=True)`): each allocation paired with its free by address,
//! given to the linked op whose span made it, its free placed after the last linked op to start
//! before it. A replay that frees each tensor there holds what the original held, where
//! freeing at last use would not: Python keeps a named value until the name is bound again
//! (`h = tanh(h @ w)` holds the old `h` beside the product), and an expression's temporaries
//! live to its end.

use crate::link::Link;
use et_schema::kineto::KinetoTrace;
use std::collections::HashMap;

/// One allocation an op made that outlived the op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Alloc {
    /// Bytes allocated.
    pub bytes: u64,
    /// The replay-set op (by position) after which the original freed it: the last linked op
    /// to start before the free. `None` where it was held past the iteration's end.
    pub freed_after: Option<usize>,
}

/// The original's allocations per replay-set op (by position), in time order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OriginalAllocs {
    /// Per op, the allocations made inside its span that outlived it.
    pub per_op: Vec<Vec<Alloc>>,
    /// The device type whose allocator the events are of (0 the CPU, 1 CUDA).
    pub device_type: i64,
}

impl OriginalAllocs {
    /// Allocations in all.
    pub fn len(&self) -> usize {
        self.per_op.iter().map(Vec::len).sum()
    }

    /// Whether no op made an allocation that outlived it.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The allocations of the linked iteration that outlived the op that made them, from `k`'s
/// memory events of the device type with most of them (the one the model's tensors were on).
/// `None` where the profile has no memory events with addresses, or no op is linked.
pub fn original_allocs(l: &Link, k: &KinetoTrace) -> Option<OriginalAllocs> {
    let cuda = k.memory.iter().filter(|m| m.device_type == 1).count();
    let device_type = if cuda * 2 > k.memory.len() { 1 } else { 0 };
    let mut mem: Vec<_> = k
        .memory
        .iter()
        .filter(|m| m.device_type == device_type && m.addr != 0)
        .collect();
    mem.sort_by(|a, b| a.ts.total_cmp(&b.ts));
    // Linked ops in start order: (start, end, position).
    let mut ops: Vec<(f64, f64, usize)> = l
        .event_of
        .iter()
        .enumerate()
        .filter_map(|(pos, e)| {
            let e = &k.events[(*e)? as usize];
            Some((e.ts, e.ts + e.dur, pos))
        })
        .collect();
    if mem.is_empty() || ops.is_empty() {
        return None;
    }
    ops.sort_by(|a, b| a.0.total_cmp(&b.0));
    let iteration_end = l
        .span
        .map_or_else(|| ops.iter().map(|o| o.1).fold(f64::MIN, f64::max), |s| s.1);
    // The last op to start at or before `ts`.
    let before = |ts: f64| {
        ops.partition_point(|o| o.0 <= ts)
            .checked_sub(1)
            .map(|i| ops[i])
    };
    // Allocations paired with their frees by address: (allocated at, bytes, freed at).
    let mut open: HashMap<u64, usize> = HashMap::new();
    let mut lifetimes: Vec<(f64, u64, Option<f64>)> = Vec::new();
    for m in mem {
        if m.bytes > 0 {
            open.insert(m.addr, lifetimes.len());
            lifetimes.push((m.ts, m.bytes as u64, None));
        } else if m.bytes < 0 {
            if let Some(i) = open.remove(&m.addr) {
                lifetimes[i].2 = Some(m.ts);
            }
        }
    }
    let mut per_op = vec![Vec::new(); l.event_of.len()];
    for (at, bytes, freed) in lifetimes {
        // Made inside a linked op's span, and still held when it ended.
        let Some((_, end, pos)) = before(at).filter(|o| at <= o.1) else {
            continue;
        };
        if freed.is_some_and(|f| f <= end) {
            continue;
        }
        let freed_after = freed
            .filter(|&f| f <= iteration_end)
            .and_then(before)
            .map(|o| o.2);
        per_op[pos].push(Alloc { bytes, freed_after });
    }
    Some(OriginalAllocs {
        per_op,
        device_type,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::Method;

    /// Three ops on one thread: `a` [0, 10), `b` [20, 30), `c` [40, 50).
    fn profile(memory: &[(f64, i64, u64)]) -> KinetoTrace {
        let mut evs: Vec<serde_json::Value> = [("a", 0.0), ("b", 20.0), ("c", 40.0)]
            .iter()
            .map(|(n, ts)| {
                serde_json::json!({"ph": "X", "cat": "cpu_op", "name": n, "pid": 1, "tid": 1,
                                   "ts": ts, "dur": 10.0})
            })
            .collect();
        let mut total = 0;
        for &(ts, bytes, addr) in memory {
            total += bytes;
            evs.push(
                serde_json::json!({"ph": "i", "cat": "cpu_instant_event", "name": "[memory]",
                "pid": 1, "tid": 1, "ts": ts, "args": {"Bytes": bytes, "Total Allocated": total,
                "Addr": addr, "Device Type": 0, "Device Id": -1}}),
            );
        }
        let j = serde_json::json!({ "traceEvents": evs });
        et_schema::kineto::parse_kineto(j.to_string().as_bytes(), "k.json").unwrap()
    }

    fn link_of(k: &KinetoTrace) -> Link {
        Link {
            method: Method::Alignment,
            event_of: (0..3)
                .map(|i| {
                    (0..k.events.len() as u32)
                        .find(|&e| k.str(k.events[e as usize].name) == ["a", "b", "c"][i])
                })
                .collect(),
            gpu_events: vec![vec![]; 3],
            gpu_off_op: vec![],
            span: None,
            warnings: vec![],
        }
    }

    #[test]
    fn allocations_go_to_the_op_that_made_them_and_frees_after_the_op_before() {
        let k = profile(&[
            (2.0, 100, 1),   // a's output ...
            (3.0, 50, 2),    // ... and a temporary of a's,
            (5.0, -50, 2),   // freed inside it: not an allocation that outlived a
            (22.0, 200, 3),  // b's output ...
            (35.0, -100, 1), // a's output freed between b and c (Python rebound its name)
            (42.0, 100, 4),  // c's output, reusing nothing, never freed
            (45.0, -200, 3), // b's output freed inside c (its last use)
        ]);
        let l = link_of(&k);
        let a = original_allocs(&l, &k).unwrap();
        assert_eq!(a.device_type, 0);
        let at = |bytes, freed_after| Alloc { bytes, freed_after };
        assert_eq!(
            a.per_op,
            [
                vec![at(100, Some(1))],
                vec![at(200, Some(2))],
                vec![at(100, None)]
            ]
        );
        assert_eq!(a.len(), 3);
        // Without memory events, or with none linked, there is nothing to follow.
        assert!(original_allocs(&l, &profile(&[])).is_none());
    }

    #[test]
    fn a_free_after_the_iteration_is_held_past_it_and_an_address_reused_pairs_anew() {
        let mut k = profile(&[
            (2.0, 64, 7),
            (25.0, -64, 7), // freed after b started
            (42.0, 64, 7),  // the same block again, for c's output
            (80.0, -64, 7), // freed after the iteration's end
        ]);
        let mut l = link_of(&k);
        l.span = Some((0.0, 60.0));
        let a = original_allocs(&l, &k).unwrap();
        assert_eq!(
            a.per_op,
            [
                vec![Alloc {
                    bytes: 64,
                    freed_after: Some(1)
                }],
                vec![],
                vec![Alloc {
                    bytes: 64,
                    freed_after: None
                }]
            ]
        );
        // CUDA events, where most are, are the ones read.
        for m in &mut k.memory {
            m.device_type = 1;
        }
        assert_eq!(original_allocs(&l, &k).unwrap().device_type, 1);
    }
}
