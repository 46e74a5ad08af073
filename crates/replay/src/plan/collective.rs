//! Process groups and collectives: the groups the trace recorded, each collective's group,
//! sequence number and peers, and the waits paired with asynchronous collectives.

use super::*;

/// The process groups a trace created: the `## process_group:init ##` record's JSON list (the
/// world first), or the world alone.
pub fn process_groups(t: &Trace) -> Vec<GroupSpec> {
    let world = GroupSpec {
        name: "0".into(),
        desc: "default_pg".into(),
        ..Default::default()
    };
    let recorded = t
        .nodes
        .iter()
        .any(|n| t.name(n) == et_graph::summary::PROCESS_GROUP_INIT);
    if !recorded {
        // No record of the groups (older schemas): the backend shows in its annotations.
        let backend = ["nccl", "gloo"].into_iter().find(|b| {
            t.nodes
                .iter()
                .any(|n| t.name(n).starts_with(&format!("{b}:")))
        });
        // Nor of the world's size, unless its collectives' records say it.
        let size = et_graph::summary::recorded_world_size(t).map_or(0, |w| w as i64);
        return vec![GroupSpec {
            backend: backend.unwrap_or_default().into(),
            size,
            ..world
        }];
    }
    let Some(list) = et_graph::world::process_group_records(t) else {
        return vec![world];
    };
    let mut out = vec![world];
    for g in list {
        let spec = GroupSpec {
            name: g.pg_name,
            desc: g.pg_desc,
            ranks: g.ranks,
            size: g.group_size,
            backend: g.backend_config,
        };
        // The default group is the world: every rank, whatever its ranks list says.
        if spec.desc == "default_pg" || (spec.name == "0" && spec.ranks.is_empty()) {
            out[0] = GroupSpec {
                ranks: Vec::new(),
                ..spec
            };
        } else {
            out.push(spec);
        }
    }
    out
}

/// A collective's recorded attributes (names as `record_param_comms` writes them).
/// The sequence number of the `record_param_comms` record at node `i` or among its children:
/// a collective's record holds its tensors then the number; a `wait` record the number first.
pub(super) fn comms_seq(g: &Graph, i: u32) -> Option<i64> {
    let t = g.trace;
    let record = std::iter::once(i)
        .chain(g.children(i).iter().copied())
        .find(|&k| t.name(&t.nodes[k as usize]) == "record_param_comms")?;
    let inputs = t.inputs(&t.nodes[record as usize]);
    let int = |k: usize| match inputs.get(k)?.value {
        Value::Int(v) => Some(v),
        _ => None,
    };
    let is_wait = et_graph::summary::collective_name(t, &t.nodes[record as usize])
        .is_some_and(|n| n == "wait");
    if is_wait {
        int(0)
    } else {
        int(1)
    }
}

pub(super) fn collective_of(
    t: &Trace,
    node: &et_schema::Node,
    name: &str,
    groups: &[GroupSpec],
) -> Collective {
    let mut c = Collective {
        name: et_graph::summary::collective_name(t, node).unwrap_or_else(|| name.to_string()),
        ..Default::default()
    };
    for e in t.extras(node) {
        let v = e.value;
        let int = || match v {
            Value::Int(i) => Some(i),
            _ => None,
        };
        let text = || match v {
            Value::Str(s) => Some(t.str(s).to_string()),
            _ => None,
        };
        match t.str(e.name) {
            "pg_name" => c.pg_name = text(),
            "pg_desc" => c.pg_desc = text(),
            "pg_size" => c.pg_size = int(),
            "global_rank_start" => c.global_rank_start = int(),
            "global_rank_stride" => c.global_rank_stride = int(),
            "in_msg_nelems" => c.in_msg_nelems = int(),
            "out_msg_nelems" => c.out_msg_nelems = int(),
            "in_split_size" => c.in_split_size = t.int_list(v).unwrap_or_default(),
            "out_split_size" => c.out_split_size = t.int_list(v).unwrap_or_default(),
            "dtype" => c.dtype = text(),
            _ => {}
        }
    }
    if let Some(pg) = &c.pg_name {
        if let Some(k) = groups.iter().position(|g| &g.name == pg) {
            c.group = k as u32;
        }
    }
    c
}

/// Later steps that wait on a collective (`c10d::wait`, `_wait_tensor`, ...) and read one of its
/// outputs: the waits that go with it.
pub(super) fn link_waits(steps: &mut [Step]) {
    let mut produced_by: HashMap<Slot, usize> = HashMap::new();
    let mut waits: Vec<(usize, usize)> = Vec::new();
    // PARAM-style `record_param_comms` waits name the collective by sequence number, counted
    // per process group.
    let mut by_seq = et_graph::summary::CollectivesBySeq::default();
    for (k, s) in steps.iter().enumerate() {
        if let StepKind::Collective(c) = &s.kind {
            if let Some(seq) = c.seq {
                if c.name == "wait" {
                    if let Some(&from) = by_seq.waited(seq, c.pg_name.as_deref()) {
                        waits.push((from, k));
                    }
                } else {
                    by_seq.issued(seq, c.pg_name.clone(), k);
                }
            }
        }
        if s.name.contains("wait") {
            let from = s
                .args
                .iter()
                .flat_map(Arg::slots)
                .find_map(|x| produced_by.get(&x));
            if let Some(&c) = from {
                waits.push((c, k));
            }
        }
        if s.kind.is_collective() {
            for (slot, _) in &s.out_specs {
                produced_by.insert(*slot, k);
            }
            for o in &s.outs {
                if let Out::Tensor(x) = o {
                    produced_by.insert(*x, k);
                }
            }
        }
    }
    for (c, k) in waits {
        if let StepKind::Collective(col) = &mut steps[c].kind {
            col.waits.push(k);
        }
    }
}
