//! Communication replay as PARAM's comms replay offers it: latency statistics per collective
//! kind and message size, `--blocking`, `--paced-by-trace`, `--world` (auto-shrink),
//! `--check-collectives` and the filters, over real Gloo on loopback.
//!
//! `tests/data/every_w4` holds a 4-rank Gloo DDP step that also issues every collective kind
//! Gloo runs (`xtask/scripts/every_collective.py DIR 4`): an ET and its linked Kineto trace per
//! rank.

mod common;
use common::{bin, json, shared};
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

fn every_w4() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/every_w4")
}

fn dlrm() -> PathBuf {
    shared("public").join("param_dlrm_8rank_1.0.1")
}

/// `replay --ranks DIR --only comm --json`, quick, with `extra` arguments.
fn comm(dir: &std::path::Path, extra: &[&str]) -> Command {
    let mut c = bin();
    c.args(["replay", "--ranks"])
        .arg(dir)
        .args(["--only", "comm", "--json", "--threads", "1"])
        .args(["--iters", "3", "--warmup", "1", "--timeout", "60"])
        .args(extra);
    c
}

/// Latency statistics `l` are present, positive and ordered.
fn ordered(what: &str, l: &Value) {
    let x = |k: &str| {
        l[k].as_f64()
            .unwrap_or_else(|| panic!("{what}: no {k} in {l}"))
    };
    assert!(x("min") > 0.0, "{what}: {l}");
    assert!(x("min") <= x("p50"), "{what}: {l}");
    assert!(x("p50") <= x("p95"), "{what}: {l}");
    assert!(x("p95") <= x("max"), "{what}: {l}");
    assert!(x("total") >= x("max"), "{what}: {l}");
}

/// Every kind of the job has calls, bytes, bandwidth and latency statistics, over all and
/// per size bucket, and each rank lists every collective call with its latencies.
fn check_statistics(j: &Value, kinds: &[&str]) {
    let c = j["collectives"].as_object().expect("collectives by kind");
    let mut have: Vec<&str> = c.keys().map(String::as_str).collect();
    have.sort();
    let mut want = kinds.to_vec();
    want.sort();
    assert_eq!(have, want, "{}", j["collectives"]);
    for (kind, k) in c {
        assert!(k["calls"].as_u64().unwrap() > 0, "{kind}: {k}");
        assert!(k["bytes"].as_u64().is_some(), "{kind}: {k}");
        ordered(kind, &k["latency_us"]);
        if kind != "barrier" {
            assert!(k["algbw_gbps"].as_f64().unwrap() > 0.0, "{kind}: {k}");
            assert!(k["busbw_gbps"].as_f64().unwrap() > 0.0, "{kind}: {k}");
        }
        let buckets = k["sizes"].as_array().unwrap();
        let calls: u64 = buckets.iter().map(|b| b["calls"].as_u64().unwrap()).sum();
        assert_eq!(calls, k["calls"].as_u64().unwrap(), "{kind}: {k}");
        for b in buckets {
            ordered(&format!("{kind} <= {}", b["max_bytes"]), &b["latency_us"]);
        }
    }
    for (r, rank) in j["ranks"].as_array().unwrap().iter().enumerate() {
        assert_eq!(rank["ops_failed"], 0, "rank {r}: {}", rank["failures"]);
        let calls = rank["collective_calls"].as_array().unwrap();
        assert!(!calls.is_empty(), "rank {r}");
        for call in calls {
            assert_eq!(call["latency_us"].as_array().unwrap().len(), 3, "{call}");
        }
    }
}

/// PARAM's own 8-rank DLRM set and the 4-rank job with every kind: statistics for every
/// kind, in the job's JSON.
#[test]
fn every_collective_kind_reports_latency_statistics() {
    check_statistics(
        &json(&mut comm(&dlrm(), &[])),
        &["all_reduce", "all_to_all"],
    );
    check_statistics(
        &json(&mut comm(&every_w4(), &[])),
        &[
            "all_gather",
            "all_reduce",
            "all_to_all",
            "barrier",
            "broadcast",
            "gather",
            "recv",
            "reduce",
            "scatter",
            "send",
        ],
    );
}

/// With `--blocking`, each collective between two barriers: the wait at the first (skew) and
/// the latency to every rank's completion (global) come apart from the collective's own, which
/// the global latency bounds from below, call by call. Sends and receives take no barriers.
#[test]
fn blocking_separates_the_skew_from_the_collective_latency() {
    for dir in [every_w4(), dlrm()] {
        let j = json(&mut comm(&dir, &["--blocking"]));
        for (kind, k) in j["collectives"].as_object().unwrap() {
            if kind == "send" || kind == "recv" {
                assert!(k["skew_us"].is_null(), "{kind}: {k}");
                continue;
            }
            let (own, global) = (&k["latency_us"], &k["global_latency_us"]);
            assert!(k["skew_us"]["max"].as_f64().unwrap() >= 0.0, "{kind}: {k}");
            ordered(kind, global);
            for q in ["min", "p50", "p95", "max"] {
                assert!(global[q].as_f64() >= own[q].as_f64(), "{kind} {q}: {k}");
            }
        }
        for r in j["ranks"].as_array().unwrap() {
            for call in r["collective_calls"].as_array().unwrap() {
                let n = call["latency_us"].as_array().unwrap().len();
                if call["kind"] != "send" && call["kind"] != "recv" {
                    assert_eq!(call["skew_us"].as_array().unwrap().len(), n, "{call}");
                }
            }
        }
    }
}

/// `--paced-by-trace` issues each collective at its recorded time from the iteration's start
/// (each rank's Kineto trace beside its ET): an iteration lasts at least until the last one
/// was issued in the trace.
#[test]
fn a_paced_replay_issues_each_collective_at_its_recorded_time() {
    for dir in [every_w4(), dlrm()] {
        let j = json(&mut comm(&dir, &["--paced-by-trace"]));
        for (r, rank) in j["ranks"].as_array().unwrap().iter().enumerate() {
            let p = &rank["paced"];
            let collectives = rank["collective_calls"].as_array().unwrap().len();
            assert_eq!(p["collectives"], collectives, "rank {r}: {p}");
            let last = p["last_collective_ms"].as_f64().unwrap();
            assert!(last > 0.0 && last <= p["trace_ms"].as_f64().unwrap(), "{p}");
            for t in rank["iter_samples_ms"].as_array().unwrap() {
                assert!(t.as_f64().unwrap() >= last, "rank {r}: {t} ms < {last} ms");
            }
        }
    }
    // Without a profile to read the times from, it says so.
    let o = bin()
        .args(["replay", "--ranks"])
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/tp_w8"))
        .args(["--only", "comm", "--paced-by-trace"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("no Kineto trace beside"),
        "{err}"
    );
}

/// `--world 2` replays the 8-rank DLRM's communication on 2 ranks: ranks 0 and 1 on their own
/// traces, every collective in a group of 2, the all-to-all splits those of the kept ranks.
#[test]
fn world_2_replays_the_eight_rank_dlrm_communication_on_two_ranks() {
    let j = json(&mut comm(&dlrm(), &["--world", "2", "--check-collectives"]));
    assert_eq!(j["world_size"], 2);
    assert_eq!(
        j["collectives"]["all_reduce"]["count"], 3,
        "{}",
        j["collectives"]
    );
    assert_eq!(j["collectives"]["all_to_all"]["count"], 5);
    for (k, r) in j["ranks"].as_array().unwrap().iter().enumerate() {
        assert_eq!(r["world_size"], 2);
        assert_eq!(r["ops_failed"], 0, "rank {k}: {}", r["failures"]);
        for call in r["collective_calls"].as_array().unwrap() {
            assert_eq!(call["group_size"], 2, "{call}");
        }
        assert!(j["traces"][k]
            .as_str()
            .unwrap()
            .contains(&format!("rank{k}.")));
    }
    // Fewer than captured only; and a collective whose peer is not kept is refused by name.
    let o = comm(&dlrm(), &["--world", "9"]).output().unwrap();
    assert!(!o.status.success());
    // tpdp_w4 on two ranks: each compares its collectives over the world and its two
    // subgroups (the data-parallel one down to itself) before it runs.
    let tpdp = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/tpdp_w4");
    let j = json(&mut comm(&tpdp, &["--world", "2", "--check-collectives"]));
    assert_eq!(j["world_size"], 2, "{j}");
    let o = comm(&every_w4(), &["--world", "2"]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("c10d::send") && err.contains("not among the ranks"),
        "{err}"
    );
    let o = bin()
        .args(["replay", "--ranks"])
        .arg(dlrm())
        .args(["--world", "2"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--only comm"), "{err}");
}

/// `--check-collectives` passes on every multi-rank set at hand, each rank verifying its
/// collectives' results.
#[test]
fn checked_collectives_hold_what_their_inputs_make_on_every_set() {
    let data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let sets = [
        shared("cpu").join("dist_mlp_w2.rank*.et.json"),
        dlrm(),
        every_w4(),
        data.join("tp_w8"),
    ];
    for set in sets {
        let j = json(&mut comm(&set, &["--check-collectives"]));
        for (k, r) in j["ranks"].as_array().unwrap().iter().enumerate() {
            let checked = r["check"]["checked"].as_u64().unwrap();
            assert!(checked > 0, "{}: rank {k}: {}", set.display(), r["check"]);
            assert!(
                r["check"]["unchecked"].as_object().unwrap().is_empty(),
                "{}: rank {k}: {}",
                set.display(),
                r["check"]
            );
        }
    }
}

/// One rank's input corrupted (the fault injection `MYSTIQUE_CORRUPT_COLLECTIVE=RANK:NODE`):
/// the check stops the run naming the collective whose result went wrong.
#[test]
fn a_corrupted_input_fails_the_check_naming_the_collective() {
    let rank1 = every_w4().join("every_w4.rank1.et.json.gz");
    let t = mystique_cli::read_trace(&rank1).unwrap();
    let node = t
        .nodes
        .iter()
        .find(|n| t.name(n) == "c10d::allgather_")
        .map(|n| n.id)
        .unwrap();
    let o = comm(&every_w4(), &["--check-collectives"])
        .env("MYSTIQUE_CORRUPT_COLLECTIVE", format!("1:{node}"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("collective c10d::allgather_") && err.contains("returned wrong values"),
        "{err}"
    );
    // The wrong value is rank 1's (its group rank + 1, off by 100).
    assert!(err.contains("102"), "{err}");
}

/// The filters: only the kinds asked for run (waits always), or only the first N collectives.
#[test]
fn filters_keep_the_kinds_and_the_number_of_collectives_asked() {
    let j = json(&mut comm(
        &every_w4(),
        &["--allow-collectives", "all_reduce,broadcast"],
    ));
    let kinds: Vec<&String> = j["collectives"].as_object().unwrap().keys().collect();
    assert_eq!(kinds, ["all_reduce", "broadcast"]);
    // The group's first four collectives; sends and receives are capped per peer apart (one
    // of each per rank here, under the cap).
    let j = json(&mut comm(&every_w4(), &["--max-collectives", "4"]));
    for r in j["ranks"].as_array().unwrap() {
        let kinds: Vec<&str> = r["collective_calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["kind"].as_str().unwrap())
            .collect();
        let p2p = kinds
            .iter()
            .filter(|k| ["send", "recv"].contains(k))
            .count();
        assert_eq!(kinds.len() - p2p, 4, "{r}");
        assert_eq!(r["ops_failed"], 0, "{r}");
    }
    let o = comm(&every_w4(), &["--allow-collectives", "allreduce"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("not a collective kind"),
        "{err}"
    );
    // A send without its receive would wait for ever: refused.
    let o = comm(&every_w4(), &["--allow-collectives", "send,all_reduce"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("send and recv go together"),
        "{err}"
    );
}

/// `--trace-out` with `--ranks`: one timeline, a process row per rank, every rank's
/// collectives on one axis: a barrier's slices overlap on every rank (none leaves it before
/// the last one arrived), up to the reading of each rank's two clocks (microseconds).
#[test]
fn the_ranks_collectives_share_one_timeline() {
    let dir = common::scratch("comm-tl");
    let out = dir.join("job.json");
    let j = json(comm(&every_w4(), &["--trace-out"]).arg(&out));
    let t: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let events = t["traceEvents"].as_array().unwrap();
    let world = j["world_size"].as_u64().unwrap();
    let mut barriers = Vec::new();
    for pid in 1..=world {
        let mine: Vec<&Value> = events
            .iter()
            .filter(|e| e["pid"] == pid && e["cat"] == "collective")
            .collect();
        let calls = j["ranks"][(pid - 1) as usize]["collective_calls"]
            .as_array()
            .unwrap()
            .len();
        assert_eq!(mine.len(), calls, "rank {}", pid - 1);
        let b = mine
            .iter()
            .find(|e| e["args"]["kind"] == "barrier")
            .unwrap();
        let ts = b["ts"].as_f64().unwrap();
        barriers.push((ts, ts + b["dur"].as_f64().unwrap()));
    }
    let last_in = barriers.iter().map(|b| b.0).fold(f64::MIN, f64::max);
    let first_out = barriers.iter().map(|b| b.1).fold(f64::MAX, f64::min);
    assert!(last_in <= first_out + 100.0, "{barriers:?}");
    // Each collective slice names its group: the recorded one, or the world's where the
    // trace records none (the DLRM's).
    let groups = |t: &Value| -> Vec<Value> {
        t["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["cat"] == "collective")
            .map(|e| e["args"]["group"].clone())
            .collect()
    };
    let g = groups(&t);
    assert!(!g.is_empty() && g.iter().all(Value::is_string), "{g:?}");
    let out = dir.join("dlrm.json");
    json(comm(&dlrm(), &["--trace-out"]).arg(&out));
    let t: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let g = groups(&t);
    assert!(!g.is_empty() && g.iter().all(|g| g == "0"), "{g:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--rebalance equal`: the DLRM's all-to-alls, whose splits differ from rank to rank as
/// recorded, send the same rows to every rank once re-split (on 8 ranks, and on 2 with
/// `--world`), and still carry what their inputs make.
#[test]
fn equal_rebalancing_gives_every_rank_the_same_all_to_all() {
    let sizes = |j: &Value| -> Vec<Vec<u64>> {
        j["ranks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                r["collective_calls"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|c| c["kind"] == "all_to_all")
                    .map(|c| c["size_bytes"].as_u64().unwrap())
                    .collect()
            })
            .collect()
    };
    let recorded = sizes(&json(&mut comm(&dlrm(), &[])));
    assert!(recorded.iter().any(|s| s != &recorded[0]), "{recorded:?}");
    for extra in [&[][..], &["--world", "2"][..]] {
        let mut args = vec!["--rebalance", "equal", "--check-collectives"];
        args.extend(extra);
        let j = json(&mut comm(&dlrm(), &args));
        let even = sizes(&j);
        assert_eq!(even[0].len(), 5, "{even:?}");
        assert!(even.iter().all(|s| s == &even[0]), "{extra:?}: {even:?}");
        for r in j["ranks"].as_array().unwrap() {
            assert_eq!(r["check"]["checked"], 8, "{}", r["check"]);
        }
    }
}
