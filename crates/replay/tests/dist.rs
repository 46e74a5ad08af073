//! Collectives over real Gloo process groups on loopback: ranks as threads of this test, each
//! with its own c10d rendezvous client and process group, as separate processes would have.

use et_schema::testkit::{tensor, TraceBuilder};
use replay::plan::{compile, Out, StepKind};
use serde_json::json;
use std::time::Duration;

const FULL: &str = "aten::full(SymInt[] size, Scalar fill_value, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor";
const ALLREDUCE: &str = "c10d::allreduce_(Tensor[] tensors, __torch__.torch.classes.c10d.ProcessGroup process_group, __torch__.torch.classes.c10d.ReduceOp reduce_op, Tensor? sparse_indices, bool async_op=True, int timeout=-1) -> (Tensor[], __torch__.torch.classes.c10d.Work)";

/// `full([4], value)` then an allreduce of it: the trace of one rank.
fn rank_trace(value: f64) -> et_schema::Trace {
    sized_rank_trace(value, 4, 1)
}

/// A trace that starts with a world of `size` ranks over Gloo, as `init_process_group`
/// records it.
fn world_of(size: usize) -> TraceBuilder {
    world_with_groups(size, &[])
}

/// A trace that starts with a world of `size` ranks and the `groups` (name, description,
/// ranks) made after it, all over Gloo, as the process-group record lists them.
fn world_with_groups(size: usize, groups: &[(&str, &str, &[u64])]) -> TraceBuilder {
    let count = 1 + groups.len();
    let mut list = vec![format!(
        r#"{{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cpu:gloo", "ranks": [], "group_size": {size}, "group_count": {count}}}"#
    )];
    for (name, desc, ranks) in groups {
        list.push(format!(
            r#"{{"pg_name": "{name}", "pg_desc": "{desc}", "backend_config": "cpu:gloo", "ranks": {ranks:?}, "group_size": {}, "group_count": {count}}}"#,
            ranks.len()
        ));
    }
    let mut b = TraceBuilder::new();
    b.node("## process_group:init ##")
        .input(json!(format!("[{}]", list.join(", "))), json!([]), "String")
        .done();
    b
}

/// `full([n], value)` then `reduces` allreduces of it.
fn sized_rank_trace(value: f64, n: u64, reduces: usize) -> et_schema::Trace {
    let mut b = world_of(2);
    let t = tensor(5, 5, 0, n, 4, "cpu");
    full(&mut b, &t, n, value);
    for _ in 0..reduces {
        allreduce(&mut b, &t, n);
    }
    b.build()
}

/// `aten::full([n], value)` into `t` (`n` floats).
fn full(b: &mut TraceBuilder, t: &serde_json::Value, n: u64, value: f64) {
    let mut op = b
        .op("aten::full", FULL)
        .input(json!([n]), json!([[]]), "GenericList[Int]")
        .input(json!(value), json!([]), "Double");
    for _ in 0..4 {
        op = op.input(json!("<None>"), json!([]), "None");
    }
    op.output(t.clone(), json!([n]), "Tensor(float)").done();
}

/// `c10d::allreduce_` of `t` (`n` floats), in place.
fn allreduce(b: &mut TraceBuilder, t: &serde_json::Value, n: u64) {
    allreduce_on(b, t, n, "0");
}

/// `c10d::allreduce_` of `t` (`n` floats), in place, on the process group named `pg`.
fn allreduce_on(b: &mut TraceBuilder, t: &serde_json::Value, n: u64, pg: &str) {
    b.op("c10d::allreduce_", ALLREDUCE)
        .attr("pg_name", "string", pg)
        .input(json!([t]), json!([[n]]), "GenericList[Tensor(float)]")
        .input("<Object>", json!([]), "Object")
        .input("<Object>", json!([]), "Object")
        .input("<None>", json!([]), "None")
        .input(true, json!([]), "Bool")
        .input(-1, json!([]), "Int")
        .output(json!([t]), json!([[n]]), "GenericList[Tensor(float)]")
        .output("<Object>", json!([]), "Object")
        .done();
}

/// Turns off c10d's flight recorder for this test process, before its first process group.
/// The recorder is one per process, and its first record of a process group inserts into a
/// map before taking its lock (`FlightRecorder::recordWithResetEnabled`, libtorch 2.11): these
/// tests run their ranks as threads of one process, whose process groups' first collectives
/// race there and corrupted the map (a SIGSEGV in about 1 run in 17 of this binary). A rank
/// of a real job is a process of its own, as `replay --ranks` runs them.
fn no_flight_recorder() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    // SAFETY (of the environment's use): every test of this binary that starts threads or
    // process groups passes here first, and the Once holds the others back until it is set.
    ONCE.call_once(|| std::env::set_var("TORCH_FR_BUFFER_SIZE", "0"));
}

/// Rank `rank` of `world` ranks as threads of this test: the store on rank 0 at
/// 127.0.0.1:`port`, collectives timing out after `timeout_s` seconds.
fn loopback(rank: usize, world: usize, port: u16, timeout_s: u64) -> replay::DistOptions {
    replay::DistOptions {
        rank,
        world_size: world,
        master_addr: "127.0.0.1".into(),
        master_port: port,
        timeout: Duration::from_secs(timeout_s),
        local_rank: Some(rank),
        store: replay::Store::RankZero,
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs two ranks as threads over Gloo on loopback: rank r replays `trace(r + 1)`, `check`
/// sees its plan first; returns each rank's four values of the tensor `out` names.
fn two_ranks(
    trace: fn(f64) -> et_schema::Trace,
    check: fn(&replay::plan::Plan),
    out: fn(&replay::plan::Plan) -> usize,
) -> Vec<Vec<f64>> {
    no_flight_recorder();
    let port = free_port();
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            std::thread::spawn(move || {
                let tr = trace(rank as f64 + 1.0);
                let g = et_graph::Graph::new(&tr);
                let plan = compile(&g, &g.replay_set(None));
                check(&plan);
                let bound = replay::bind(&plan, &replay::Device::Cpu);
                let d = loopback(rank, 2, port, 30);
                let (slots, failures) =
                    replay::executor::run_once_keep_as(&plan, &bound, Some(&d)).unwrap();
                assert!(failures.is_empty(), "rank {rank}: {failures:?}");
                let t = slots[out(&plan)].as_ref().unwrap();
                (0..4).map(|i| t.double_value(&[i])).collect::<Vec<f64>>()
            })
        })
        .collect();
    ranks.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Rank r contributes r + 1: after the allreduce both hold 1 + 2 = 3.
#[test]
fn an_allreduce_of_known_inputs_gives_their_sum_on_every_rank() {
    let values = two_ranks(
        rank_trace,
        |plan| assert_eq!(plan.groups[0].size, 2),
        |plan| {
            let Out::List(out) = &plan.steps[1].outs[0] else {
                panic!("{:?}", plan.steps[1].outs)
            };
            out[0].unwrap() as usize
        },
    );
    for (rank, v) in values.into_iter().enumerate() {
        assert_eq!(v, vec![3.0; 4], "rank {rank}");
    }
}

/// Without its peers a collective fails as unsupported, saying how to run it, and the run goes
/// on around it.
#[test]
fn a_collective_without_peers_fails_clearly() {
    no_flight_recorder();
    let tr = rank_trace(1.0);
    let g = et_graph::Graph::new(&tr);
    let plan = compile(&g, &g.replay_set(None));
    let bound = replay::bind(&plan, &replay::Device::Cpu);
    let (_, failures) = replay::executor::run_once_keep(&plan, &bound).unwrap();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(failures[0].1.contains("--ranks"), "{failures:?}");
}

const F_ALLREDUCE: &str =
    "_c10d_functional::all_reduce(Tensor input, str reduce_op, str group_name) -> Tensor";
const F_WAIT: &str = "_c10d_functional::wait_tensor(Tensor tensor) -> Tensor";

/// `full([4], value)`, a functional all_reduce (the group named, not passed) and its wait, as
/// torch.compile and torch.distributed._functional_collectives record them.
fn functional_trace(value: f64) -> et_schema::Trace {
    let mut b = TraceBuilder::new();
    let t = tensor(5, 5, 0, 4, 4, "cpu");
    let r = tensor(6, 6, 0, 4, 4, "cpu");
    full(&mut b, &t, 4, value);
    b.op("_c10d_functional::all_reduce", F_ALLREDUCE)
        .input(t, json!([4]), "Tensor(float)")
        .input("sum", json!([]), "String")
        .input("0", json!([]), "String")
        .output(r.clone(), json!([4]), "Tensor(float)")
        .done();
    b.op("_c10d_functional::wait_tensor", F_WAIT)
        .input(r.clone(), json!([4]), "Tensor(float)")
        .output(r, json!([4]), "Tensor(float)")
        .done();
    b.build()
}

/// Functional collectives are collectives: they find their group by name in c10d's registry
/// (each rank thread its own) and the wait completes them; rank r contributes r + 1.
#[test]
fn functional_collectives_run_with_their_named_group_and_wait() {
    let values = two_ranks(
        functional_trace,
        |plan| {
            assert!(
                plan.steps[1].kind.is_collective(),
                "{:?}",
                plan.steps[1].kind
            );
            assert!(
                plan.steps[2].kind.is_collective(),
                "the wait counts as communication"
            );
        },
        |plan| {
            let Out::Tensor(out) = plan.steps[2].outs[0] else {
                panic!("{:?}", plan.steps[2].outs)
            };
            out as usize
        },
    );
    for (rank, v) in values.into_iter().enumerate() {
        assert_eq!(v, vec![3.0; 4], "rank {rank}");
    }
}

/// A rank's trace, made from the value it contributes.
type RankTrace = fn(f64) -> et_schema::Trace;

/// `full([4], value)`, an asynchronous allreduce of it whose `record_param_comms` holds
/// sequence number 7, and PARAM's `wait` record naming that number.
fn param_wait_trace(value: f64) -> et_schema::Trace {
    let mut b = world_of(2);
    let t = tensor(5, 5, 0, 4, 4, "cpu");
    full(&mut b, &t, 4, value);
    allreduce(&mut b, &t, 4);
    let issued = b.last_id();
    b.node("record_param_comms")
        .parent(issued)
        .input(json!([t]), json!([[4]]), "GenericList[Tensor(float)]")
        .input(7, json!([]), "Int")
        .input("allreduce", json!([]), "String")
        .done();
    b.node("record_param_comms")
        .input(7, json!([]), "Int")
        .input(0, json!([]), "Int")
        .input(0, json!([]), "Int")
        .input("wait", json!([]), "String")
        .done();
    b.build()
}

/// A collective's failure surfaces where the trace waits for it, and the error names the
/// collective: rank 1 never issues the allreduce rank 0 waits for (its trace is the same but
/// for the collective and its wait), and rank 0 fails at the wait naming the allreduce's node.
/// Both kinds of wait: an op that waits (functional collectives' `wait_tensor`), and PARAM's
/// `wait` records, where the replay holds the collective's work until the trace waits.
#[test]
fn a_failed_wait_names_the_collective_it_waited_for() {
    no_flight_recorder();
    let cases: [(RankTrace, &str, &str); 2] = [
        (
            functional_trace,
            "_c10d_functional::all_reduce",
            "_c10d_functional::wait_tensor",
        ),
        (param_wait_trace, "c10d::allreduce_", "record_param_comms"),
    ];
    for (trace, collective, wait) in cases {
        let port = free_port();
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                std::thread::spawn(move || {
                    let mut tr = trace(1.0);
                    if rank == 1 {
                        let keep: Vec<bool> = (tr.nodes.iter())
                            .map(|n| {
                                let name = tr.name(n);
                                name != collective && name != wait
                            })
                            .collect();
                        let mut keep = keep.into_iter();
                        tr.nodes.retain(|_| keep.next().unwrap_or(true));
                    }
                    let g = et_graph::Graph::new(&tr);
                    let plan = compile(&g, &g.replay_set(None));
                    let issued = plan.steps.iter().find(|s| s.name == collective);
                    let issued = issued.map(|s| s.id);
                    let bound = replay::bind(&plan, &replay::Device::Cpu);
                    let d = loopback(rank, 2, port, 3);
                    let failures = replay::executor::run_once_keep_as(&plan, &bound, Some(&d))
                        .map(|(_, f)| f)
                        .map_err(|e| e.to_string());
                    (issued, failures)
                })
            })
            .collect();
        let out: Vec<_> = ranks.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(out[1].0, None, "{collective}: rank 1 issues none");
        assert_eq!(out[1].1.as_ref().map(Vec::len), Ok(0), "{:?}", out[1]);
        let (issued, failures) = &out[0];
        let id = issued.expect("rank 0 issues the collective");
        let failures = failures.as_ref().unwrap();
        let (at, message) = failures.first().expect("rank 0's wait fails");
        assert_eq!(at, wait, "{failures:?}");
        assert!(
            message.starts_with(&format!("{collective} (node {id}): ")),
            "{failures:?}"
        );
    }
}

/// `--trace-out` shows a collective the trace waits for later on a row of its own, from its
/// call's end to the wait's completion: PARAM's allreduce held until its `wait` record, on
/// both ranks.
#[test]
fn a_collective_in_flight_has_a_slice_until_its_wait() {
    no_flight_recorder();
    let port = free_port();
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            std::thread::Builder::new()
                .stack_size(16 << 20)
                .spawn(move || {
                    let tr = param_wait_trace(rank as f64 + 1.0);
                    let g = et_graph::Graph::new(&tr);
                    let opts = replay::ReplayOptions {
                        warmup: 1,
                        iters: 2,
                        trace_out: Some(std::env::temp_dir().join("unused-in-flight.json")),
                        dist: Some(loopback(rank, 2, port, 20)),
                        ..Default::default()
                    };
                    let (_, timeline) = replay::replay(&g, &g.replay_set(None), &opts).unwrap();
                    timeline
                })
                .unwrap()
        })
        .collect();
    for (rank, h) in ranks.into_iter().enumerate() {
        let timeline = h.join().unwrap();
        let row = timeline
            .threads
            .iter()
            .find(|(_, name)| name == "collectives in flight")
            .map(|(tid, _)| *tid);
        let row = row.unwrap_or_else(|| panic!("rank {rank}: {:?}", timeline.threads));
        let in_flight: Vec<_> = timeline.slices.iter().filter(|s| s.tid == row).collect();
        assert_eq!(in_flight.len(), 1, "rank {rank}: {:?}", timeline.slices);
        let s = in_flight[0];
        assert_eq!((s.name.as_str(), s.cat), ("c10d::allreduce_", "in flight"));
        assert_eq!(s.args["kind"], "all_reduce", "rank {rank}");
        // It starts where the allreduce's own slice ends.
        let call = timeline
            .slices
            .iter()
            .find(|c| c.tid != row && c.name == "c10d::allreduce_")
            .unwrap();
        assert!(
            (s.ts - (call.ts + call.dur)).abs() < 1.0 && s.dur >= 0.0,
            "rank {rank}: {s:?} after {call:?}"
        );
    }
}

/// PARAM-style traces record `wait` as a `record_param_comms` naming the collective's sequence
/// number: the plan pairs them, so the work stays outstanding until the trace waits (the DLRM's
/// all_to_allv 152 overlaps allreduce 153 and is waited for after it).
#[test]
fn param_wait_records_are_paired_with_their_collectives_by_sequence_number() {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/traces/public/param_dlrm_8rank_1.0.1/rank0.et.json.gz");
    let t = et_schema::read_trace(&p).unwrap();
    let g = et_graph::Graph::new(&t);
    let plan = compile(&g, &g.replay_set(None));
    let colls: Vec<(usize, &replay::plan::Collective)> = plan
        .steps
        .iter()
        .enumerate()
        .filter_map(|(k, s)| match &s.kind {
            replay::plan::StepKind::Collective(c) => Some((k, &**c)),
            _ => None,
        })
        .collect();
    let waited: Vec<(usize, usize)> = colls
        .iter()
        .filter(|(_, c)| c.name != "wait")
        .flat_map(|(k, c)| c.waits.iter().map(move |w| (*k, *w)))
        .collect();
    assert!(waited.len() >= 3, "{waited:?}");
    for &(k, w) in &waited {
        let StepKind::Collective(wc) = &plan.steps[w].kind else {
            panic!()
        };
        let StepKind::Collective(kc) = &plan.steps[k].kind else {
            panic!()
        };
        assert!(w > k);
        assert_eq!(
            (wc.name.as_str(), wc.seq),
            ("wait", kc.seq),
            "step {k} -> {w}"
        );
    }
    // One collective is issued between another and its wait: they overlap.
    assert!(
        waited.iter().any(|&(k, w)| colls
            .iter()
            .any(|(m, c)| *m > k && *m < w && c.name != "wait")),
        "{waited:?}"
    );
}

/// A PARAM wait record pairs with the collective of its sequence number on its own group:
/// groups count their collectives apart, so the number recurs on another group (here after
/// the one waited for), whose collective the wait must not hold.
#[test]
fn param_waits_pair_with_their_own_groups_collective() {
    let mut b = world_with_groups(2, &[("1", "dp", &[0, 1])]);
    let t = tensor(5, 5, 0, 4, 4, "cpu");
    full(&mut b, &t, 4, 1.0);
    let mut issued = Vec::new();
    for pg in ["0", "1"] {
        allreduce_on(&mut b, &t, 4, pg);
        let op = b.last_id();
        issued.push(op);
        b.node("record_param_comms")
            .parent(op)
            .attr("pg_name", "string", pg)
            .input(json!([t]), json!([[4]]), "GenericList[Tensor(float)]")
            .input(7, json!([]), "Int")
            .input("allreduce", json!([]), "String")
            .done();
    }
    b.node("record_param_comms")
        .attr("pg_name", "string", "0")
        .input(7, json!([]), "Int")
        .input(0, json!([]), "Int")
        .input(0, json!([]), "Int")
        .input("wait", json!([]), "String")
        .done();
    let tr = b.build();
    let g = et_graph::Graph::new(&tr);
    let plan = compile(&g, &g.replay_set(None));
    let waits_of = |id: u64| {
        let s = plan.steps.iter().find(|s| s.id == id).unwrap();
        let StepKind::Collective(c) = &s.kind else {
            panic!("{:?}", s.kind)
        };
        c.waits.clone()
    };
    let wait = plan.steps.len() - 1;
    assert_eq!(plan.steps[wait].name, "record_param_comms");
    assert_eq!(waits_of(issued[0]), vec![wait], "group 0's allreduce");
    assert!(waits_of(issued[1]).is_empty(), "group 1's allreduce");
}

const SEND: &str = "c10d::send(Tensor[] tensors, __torch__.torch.classes.c10d.ProcessGroup process_group, int dst, int tag) -> __torch__.torch.classes.c10d.Work";
const RECV: &str = "c10d::recv_(Tensor[] tensors, __torch__.torch.classes.c10d.ProcessGroup process_group, int src, int tag) -> __torch__.torch.classes.c10d.Work";

/// Stage `rank` of a three-stage pipeline: two receives from the stage before, two sends to
/// the stage after, then an all-reduce over the three.
fn pipeline_stage(rank: i64) -> et_schema::Trace {
    let mut b = world_of(3);
    let mut p2p = |op: &str, schema: &str, id: u64, peer: i64| {
        let t = tensor(id, id, 0, 4, 4, "cpu");
        b.op(op, schema)
            .input(json!([t]), json!([[4]]), "GenericList[Tensor(float)]")
            .input("<Object>", json!([]), "Object")
            .input(peer, json!([]), "Int")
            .input(0, json!([]), "Int")
            .output("<Object>", json!([]), "Object")
            .done();
    };
    for id in [1, 2] {
        if rank > 0 {
            p2p("c10d::recv_", RECV, id, rank - 1);
        }
    }
    for id in [3, 4] {
        if rank < 2 {
            p2p("c10d::send", SEND, id, rank + 1);
        }
    }
    allreduce(&mut b, &tensor(5, 5, 0, 4, 4, "cpu"), 4);
    b.build()
}

/// Replays `traces[r]` as rank r of them all over Gloo on loopback, each rank a thread with a
/// process's stack (a whole replay overflows a spawned thread's 2 MB), under `opts` with
/// `dist` set here: each rank's report, or its error in words.
fn replay_ranks(
    traces: Vec<et_schema::Trace>,
    opts: replay::ReplayOptions,
) -> Vec<Result<replay::Report, String>> {
    no_flight_recorder();
    let port = free_port();
    let world = traces.len();
    let ranks: Vec<_> = traces
        .into_iter()
        .enumerate()
        .map(|(rank, tr)| {
            let mut opts = opts.clone();
            opts.dist = Some(loopback(rank, world, port, 20));
            std::thread::Builder::new()
                .stack_size(16 << 20)
                .spawn(move || {
                    let g = et_graph::Graph::new(&tr);
                    replay::replay(&g, &g.replay_set(None), &opts)
                        .map(|(report, _)| report)
                        .map_err(|e| e.to_string())
                })
                .unwrap()
        })
        .collect();
    ranks.into_iter().map(|h| h.join().unwrap()).collect()
}

/// `--only comm --max-collectives 1 --check-collectives` on three pipeline stages over Gloo:
/// every stage keeps its all-reduce and each pair of neighbours one send and its receive, so
/// all complete with the values checked. (Capped with the group's collectives, the middle
/// stage would keep its receive alone and the others wait in their all-reduce until the
/// timeout.)
#[test]
fn a_capped_pipeline_keeps_matching_sends_and_completes() {
    let opts = replay::ReplayOptions {
        only: et_graph::Kind::Comm,
        warmup: 0,
        iters: 1,
        comm: replay::CommOptions {
            check: true,
            select: replay::plan::CommSelection {
                max: Some(1),
                ..Default::default()
            },
            ..Default::default()
        },
        ..Default::default()
    };
    let done: Vec<(usize, usize)> = replay_ranks((0..3).map(pipeline_stage).collect(), opts)
        .into_iter()
        .enumerate()
        .map(|(rank, r)| {
            let r = r.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
            (r.ops_failed, r.ops_replayed)
        })
        .collect();
    // Failed none; ran its all-reduce and one send or receive per neighbour.
    assert_eq!(done, [(0, 2), (0, 3), (0, 2)]);
}

/// Ranks whose traces all-reduce 4 and 8 floats (Gloo would abort both processes), or one
/// all-reduce and two: each rank stops before its first iteration, naming the collective and
/// what each side has.
#[test]
fn ranks_whose_collectives_differ_stop_before_running_naming_them() {
    let opts = replay::ReplayOptions {
        warmup: 0,
        iters: 1,
        ..Default::default()
    };
    let sizes = replay_ranks(
        vec![sized_rank_trace(1.0, 4, 1), sized_rank_trace(2.0, 8, 1)],
        opts.clone(),
    );
    for (rank, r) in sizes.iter().enumerate() {
        let e = r
            .as_ref()
            .err()
            .unwrap_or_else(|| panic!("rank {rank} ran"));
        assert!(
            e.contains("disagree on process group")
                && e.contains("collective #1 is all_reduce of")
                && e.contains("all_reduce of 16 bytes")
                && e.contains("all_reduce of 32 bytes"),
            "rank {rank}: {e}"
        );
    }
    let counts = replay_ranks(
        vec![sized_rank_trace(1.0, 4, 2), sized_rank_trace(2.0, 4, 1)],
        opts,
    );
    let errors: Vec<String> = counts
        .into_iter()
        .map(|r| r.expect_err("a rank ran"))
        .collect();
    assert!(
        errors[0].contains("collective #2 is all_reduce of 16 bytes here")
            && errors[0].contains("and none on another rank"),
        "{}",
        errors[0]
    );
    assert!(
        errors[1].contains("this rank issues 1 collectives on it, another rank more"),
        "{}",
        errors[1]
    );
}

/// Three ranks; ranks 0 and 1 form group "1" too, on which they all-reduce 4 and 8 floats,
/// then all three all-reduce over the world. The two in the group stop naming it, and rank 2,
/// whose own groups agree, stops too rather than run on into a world all-reduce the others
/// never reach.
#[test]
fn a_subgroups_disagreement_stops_every_rank() {
    let rank = |r: usize| {
        let mut b = world_with_groups(3, &[("1", "pair", &[0, 1])]);
        if r < 2 {
            let n = 4 * (r as u64 + 1);
            allreduce_on(&mut b, &tensor(1, 1, 0, n, 4, "cpu"), n, "1");
        }
        allreduce(&mut b, &tensor(2, 2, 0, 4, 4, "cpu"), 4);
        b.build()
    };
    let opts = replay::ReplayOptions {
        warmup: 0,
        iters: 1,
        ..Default::default()
    };
    let errors: Vec<String> = replay_ranks((0..3).map(rank).collect(), opts)
        .into_iter()
        .map(|r| r.expect_err("a rank ran"))
        .collect();
    for e in &errors[..2] {
        assert!(
            e.contains(r#"process group "1" (pair)"#) && e.contains("all_reduce of 32 bytes"),
            "{e}"
        );
    }
    assert!(
        errors[2].contains("another rank's error names"),
        "{}",
        errors[2]
    );
}
