//! `mystique replay --ranks`: every rank of a distributed trace replayed together, one process
//! per rank, collectives over real Gloo on loopback.

mod common;
use common::{bin, json, shared};
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Both ranks of the Gloo trace run every op, their six collectives included.
#[test]
fn both_ranks_of_the_gloo_trace_run_every_collective() {
    let glob = shared("cpu").join("dist_mlp_w2.rank*.et.json");
    let j = json(bin().args([
        "replay",
        "--ranks",
        glob.to_str().unwrap(),
        "--json",
        "--threads",
        "1",
        "--iters",
        "2",
        "--warmup",
        "1",
    ]));
    assert_eq!(j["world_size"], 2);
    let ranks = j["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 2);
    for (k, r) in ranks.iter().enumerate() {
        assert_eq!(r["rank"], k, "{r}");
        assert_eq!(r["world_size"], 2);
        assert_eq!(r["ops_failed"], 0, "rank {k}: {}", r["failures"]);
        assert_eq!(r["ops_replayed"], r["ops_selected"]);
        let calls = collective_calls(r);
        assert_eq!(calls, 6, "rank {k}: {}", r["collectives"]);
    }
    for op in ["all_reduce", "broadcast", "all_gather", "barrier"] {
        let c = &j["collectives"][op];
        assert_eq!(c["ranks"], 2, "{op}: {c}");
        assert!(c["time_ms"].as_f64().unwrap() > 0.0, "{op}: {c}");
        assert!(c["wait_ms"].as_f64().unwrap() >= 0.0);
    }
    assert!(j["slowest_rank"].as_u64().unwrap() < 2);
}

/// `--ranks` takes the rank traces themselves, as an unquoted glob expands to (`job.rank*`
/// also names each rank's profile, meta file and linked trace, which are left out): given out
/// of rank order, each still runs as the rank it recorded. A directory among several values is
/// refused.
#[test]
fn ranks_takes_the_trace_files_as_the_shell_expands_a_glob() {
    let file = |name: &str| shared("cpu").join(format!("dist_mlp_w2.{name}"));
    let given = [
        "rank1.et.json",
        "rank1.meta.json",
        "rank1.kineto.json.gz",
        "rank0.linked.et.json.gz",
        "rank0.et.json",
    ];
    let j = json(
        bin()
            .args(["replay", "--ranks"])
            .args(given.map(file))
            .args(["--only", "comm", "--json", "--threads", "1"])
            .args(["--iters", "1", "--warmup", "0"]),
    );
    assert_eq!(j["world_size"], 2, "{j}");
    for (k, r) in j["ranks"].as_array().unwrap().iter().enumerate() {
        assert_eq!(r["rank"], k, "{r}");
        assert_eq!(r["ops_failed"], 0, "rank {k}: {}", r["failures"]);
        let trace = r["trace"].as_str().unwrap_or_default();
        assert!(
            trace.ends_with(&format!("rank{k}.et.json")),
            "rank {k}: {trace}"
        );
    }
    let o = bin()
        .args(["replay", "--ranks"])
        .arg(shared("cpu"))
        .arg(file("rank0.et.json"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("a directory or a glob goes alone"), "{err}");
    // The same glob given quoted (mystique expands it) takes in each rank's linked trace
    // beside its clean one: left out, with a note, as where the shell expands it.
    let glob = shared("cpu").join("dist_mlp_w2.rank*.et.json*");
    let o = bin()
        .args(["replay", "--ranks"])
        .arg(&glob)
        .args(["--only", "comm", "--json", "--threads", "1"])
        .args(["--iters", "1", "--warmup", "0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("matches 2 linked traces beside their clean ones, left out"),
        "{err}"
    );
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["world_size"], 2, "{j}");
    // A directory of linked traces alone (no clean twins): they are the ranks.
    let linked = common::scratch("ranks-linked-only");
    for k in 0..2 {
        let f = format!("dist_mlp_w2.rank{k}.linked.et.json.gz");
        std::fs::copy(shared(&format!("cpu/{f}")), linked.join(&f)).unwrap();
    }
    let j = json(
        bin()
            .args(["replay", "--ranks"])
            .arg(&linked)
            .args(["--only", "comm", "--json", "--threads", "1"])
            .args(["--iters", "1", "--warmup", "0"]),
    );
    assert_eq!(j["world_size"], 2, "{j}");
}

/// nccl-tests' bandwidth convention in the report: 2 ranks, so an all-reduce's bus bandwidth
/// is its algorithm bandwidth (2(n-1)/n = 1), an all-gather's half of it ((n-1)/n), whose
/// message is its whole output (2 x 64 floats); a barrier moves no data and has none.
#[test]
fn collectives_report_algorithm_and_bus_bandwidth_as_nccl_tests_does() {
    let glob = shared("cpu").join("dist_mlp_w2.rank*.et.json");
    let j = json(
        bin()
            .args([
                "replay",
                "--ranks",
                glob.to_str().unwrap(),
                "--only",
                "comm",
            ])
            .args(["--json", "--threads", "1", "--iters", "2", "--warmup", "1"]),
    );
    let c = &j["collectives"];
    let bw = |op: &str, k: &str| c[op][k].as_f64().unwrap_or_else(|| panic!("{op} {k}: {c}"));
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(1.0);
    assert!(bw("all_reduce", "algbw_gbps") > 0.0);
    assert!(close(
        bw("all_reduce", "busbw_gbps"),
        bw("all_reduce", "algbw_gbps")
    ));
    assert!(close(
        bw("all_gather", "busbw_gbps"),
        bw("all_gather", "algbw_gbps") / 2.0
    ));
    assert_eq!(c["all_gather"]["size_bytes"], 2 * 64 * 4, "{c}");
    assert!(c["barrier"]["busbw_gbps"].is_null(), "{c}");
    // Each rank's own figures: the same convention over its own time.
    for r in j["ranks"].as_array().unwrap() {
        for (kind, coll) in r["collectives"].as_object().unwrap() {
            if kind == "barrier" {
                assert!(coll["busbw_gbps"].is_null());
                continue;
            }
            let (t, s) = (
                coll["total_ms"].as_f64().unwrap(),
                coll["size_bytes"].as_f64().unwrap(),
            );
            assert!(
                close(coll["algbw_gbps"].as_f64().unwrap(), s / (t / 1e3) / 1e9),
                "{coll}"
            );
        }
    }
}

/// A comm-only replay holds about one collective's tensors at a time: eight ranks of a
/// tensor-parallel step, twelve 16 MiB fp16 all-reduces each (captured with
/// `xtask/scripts/tp_allreduce.py DIR 8 12 16`), take two pooled buffers per rank (one, and
/// a spare while the backend lets go of the last), where holding every collective's tensor
/// took 192 MiB; the resident peak beyond libtorch's own shows it.
#[test]
fn a_comm_only_replay_takes_its_collectives_from_a_pool_of_reused_buffers() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/tp_w8");
    let j = json(&mut replay_ranks(&dir, &[]));
    let own = common::libtorch_own();
    const MIB16: u64 = 16 << 20;
    let ranks = j["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 8);
    for (k, r) in ranks.iter().enumerate() {
        assert_eq!(r["ops_failed"], 0, "rank {k}: {}", r["failures"]);
        assert_eq!(collective_calls(r), 12, "rank {k}");
        assert_eq!(
            r["collectives"]["all_reduce"]["size_bytes"],
            12 * MIB16,
            "rank {k}"
        );
        let pool = &r["pool"];
        assert_eq!(pool["estimated_bytes"], 2 * MIB16, "rank {k}: {pool}");
        // Made up front; one more only where the backend held two finished collectives'
        // tensors at once.
        let bytes = pool["bytes"].as_u64().unwrap();
        assert!((2 * MIB16..=3 * MIB16).contains(&bytes), "rank {k}: {pool}");
        assert_eq!(r["estimated_peak_bytes"], pool["estimated_bytes"]);
        let peak = r["device_memory"]["peak_bytes"].as_u64().unwrap();
        assert!(
            peak.saturating_sub(own) < 6 * MIB16,
            "rank {k}: peak {} MiB, libtorch's own {} MiB",
            peak >> 20,
            own >> 20
        );
    }
}

/// Ranks that do not fit this machine's memory together are refused before any of them
/// materialises anything, with each rank's figure, the total and what would fit (exit 2); the
/// figures are the ranks' own plans' (each rank parses its trace once, the launcher only
/// probes them). `MYSTIQUE_AVAILABLE_MEMORY` stands in for the machine's available memory.
#[test]
fn ranks_that_do_not_fit_together_are_refused_before_any_starts() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/tp_w8");
    let available = (300u64 << 20).to_string();
    let out = bin()
        .args([
            "replay",
            "--ranks",
            dir.to_str().unwrap(),
            "--iters",
            "1",
            "--warmup",
            "0",
        ])
        .env("MYSTIQUE_AVAILABLE_MEMORY", &available)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    // A full replay: the 16 MiB activation, its all-reduce's and the weight, per rank.
    assert!(err.contains("the 8 ranks need about 384.0 MiB"), "{err}");
    assert!(err.contains("rank 7: 48.0 MiB"), "{err}");
    assert!(err.contains("300.0 MiB is available"), "{err}");
    assert!(
        err.contains("--only comm would need about 256.0 MiB"),
        "{err}"
    );
    assert!(!err.contains("iteration 1/"), "a rank started: {err}");
    // What it suggests fits, and runs.
    let j = json(
        bin()
            .args([
                "replay",
                "--ranks",
                dir.to_str().unwrap(),
                "--only",
                "comm",
                "--json",
            ])
            .args(["--iters", "1", "--warmup", "0"])
            .env("MYSTIQUE_AVAILABLE_MEMORY", &available),
    );
    assert_eq!(j["world_size"], 8);
}

/// The 8-rank DLRM (a 2023 GPU trace, NCCL) replays its communication alone on CPU: every
/// all_to_all and allreduce on all eight ranks, in the order of the rank each trace recorded.
#[test]
fn the_eight_rank_dlrm_replays_its_communication_over_gloo() {
    let j = json(bin().args([
        "replay",
        "--ranks",
        shared("public/param_dlrm_8rank_1.0.1").to_str().unwrap(),
        "--only",
        "comm",
        "--json",
        "--iters",
        "1",
        "--warmup",
        "0",
    ]));
    let ranks = j["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 8);
    for (k, r) in ranks.iter().enumerate() {
        assert_eq!(r["rank"], k);
        assert_eq!(r["ops_failed"], 0, "rank {k}: {}", r["failures"]);
        assert_eq!(r["ops_replayed"], r["ops_selected"], "rank {k}");
        assert!(
            r["comm"].as_str().unwrap().contains("NCCL"),
            "{}",
            r["comm"]
        );
        assert!(
            j["traces"][k]
                .as_str()
                .unwrap()
                .contains(&format!("rank{k}.")),
            "ordered by recorded rank"
        );
    }
    assert_eq!(j["collectives"]["all_to_all"]["count"], 5);
    assert_eq!(j["collectives"]["all_reduce"]["count"], 3);
    assert_eq!(j["collectives"]["all_to_all"]["ranks"], 8);
}

/// Sets that cannot be one run are refused before anything starts: a rank twice, a rank
/// missing.
#[test]
fn mismatched_rank_sets_are_refused() {
    let dir = common::scratch("ranks");
    let dlrm = shared("public/param_dlrm_8rank_1.0.1");
    let refused = |files: &[(&str, &str)], what: &str| {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (from, to) in files {
            std::fs::copy(dlrm.join(from), dir.join(to)).unwrap();
        }
        let out = bin()
            .args(["replay", "--ranks", dir.to_str().unwrap()])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(what), "{err}");
        assert!(!err.contains("[ranks] rank"), "nothing started: {err}");
    };
    refused(
        &[
            ("rank0.et.json.gz", "a.et.json.gz"),
            ("rank1.et.json.gz", "b.et.json.gz"),
            ("rank1.et.json.gz", "c.et.json.gz"),
        ],
        "rank 1",
    );
    refused(
        &[
            ("rank0.et.json.gz", "a.et.json.gz"),
            ("rank3.et.json.gz", "b.et.json.gz"),
        ],
        "rank 1 is missing",
    );
    // Ranks 0-2 of the 8: the set orders, but its all-to-alls split over 8 ranks (the traces
    // record no process group to tell the world size by).
    refused(
        &[
            ("rank0.et.json.gz", "rank0.et.json.gz"),
            ("rank1.et.json.gz", "rank1.et.json.gz"),
            ("rank2.et.json.gz", "rank2.et.json.gz"),
        ],
        "splits an all-to-all over 8 ranks, but 3 rank traces were given",
    );
    // Another program's trace (no collective, no process group) beside a rank of a job would
    // end without joining it, and rank 0 would wait for it until the timeout.
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(dlrm.join("rank0.et.json.gz"), dir.join("rank0.et.json.gz")).unwrap();
    std::fs::copy(shared("cpu/mlp.et.json"), dir.join("rank1.et.json")).unwrap();
    let out = bin()
        .args(["replay", "--ranks", dir.to_str().unwrap(), "--timeout", "5"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("records no collective and no process group"),
        "{err}"
    );
    assert!(!err.contains("[ranks] rank"), "nothing started: {err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Usage errors of `--ranks` are refused by the launcher, once, before any rank starts: a
/// pattern that takes in a profile, an option that needs `--only comm`, an unknown collective
/// kind, a cap of no collective, a timeline with nowhere to go.
#[test]
fn ranks_usage_errors_are_refused_before_any_rank_starts() {
    let dir = common::scratch("ranks-usage");
    let dlrm = shared("public/param_dlrm_8rank_1.0.1");
    for (from, to) in [
        ("rank0.et.json.gz", "rank0.et.json.gz"),
        ("rank1.et.json.gz", "rank1.et.json.gz"),
        ("rank1.kineto.json.gz", "rank2.json.gz"),
    ] {
        std::fs::copy(dlrm.join(from), dir.join(to)).unwrap();
    }
    let glob = dir.join("*");
    let dlrm_dir = dlrm.to_str().unwrap();
    for (args, what) in [
        (
            vec!["--ranks", glob.to_str().unwrap(), "--only", "comm"],
            "rank2.json.gz, a Kineto (profiler) trace",
        ),
        (
            vec!["--ranks", dlrm_dir, "--world", "4"],
            "--world reshapes the job's communication: it needs --only comm",
        ),
        (
            vec![
                "--ranks",
                dlrm_dir,
                "--only",
                "comm",
                "--allow-collectives",
                "all_reduce,foo",
            ],
            "--allow-collectives foo: not a collective kind",
        ),
        (
            vec![
                "--ranks",
                dlrm_dir,
                "--only",
                "comm",
                "--max-collectives",
                "0",
            ],
            "--max-collectives 0 keeps no collective",
        ),
        (
            vec![
                "--ranks",
                dlrm_dir,
                "--trace-out",
                "/nonexistent-dir/t.json",
            ],
            "/nonexistent-dir does not exist",
        ),
    ] {
        let out = bin().arg("replay").args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(what), "{args:?}: {err}");
        assert!(!err.contains("[ranks] rank"), "nothing started: {err}");
        assert_eq!(err.matches("error:").count(), 1, "said once: {err}");
    }
    // One file given twice is not two ranks.
    let rank0 = dlrm.join("rank0.et.json.gz");
    let out = bin()
        .arg("generate")
        .args([&rank0, &rank0])
        .arg("-o")
        .arg(dir.join("twice.pkg"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is given twice"), "{err}");
    // The same to replay --ranks, however spelled, alone or among other ranks.
    let rank1 = dlrm.join("rank1.et.json.gz");
    let respelled = dlrm.join(".").join("rank0.et.json.gz");
    for files in [
        vec![&rank0, &rank1, &rank0],
        vec![&rank0, &rank1, &respelled],
        vec![&rank0, &rank0],
    ] {
        let out = bin()
            .arg("replay")
            .arg("--ranks")
            .args(&files)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{files:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("is given twice"), "{files:?}: {err}");
        assert!(!err.contains("[ranks] rank"), "nothing started: {err}");
    }
}

/// A rank that fails before it starts (its trace cut short) is named as the one that failed;
/// its peer, waiting for the launcher's go, says it stopped because of it, not for memory.
#[test]
fn a_rank_that_fails_to_load_is_named_and_its_peers_say_why_they_stopped() {
    let dir = common::scratch("ranks-cut");
    std::fs::copy(
        shared("cpu/dist_mlp_w2.rank0.et.json"),
        dir.join("dist_mlp_w2.rank0.et.json"),
    )
    .unwrap();
    let full = std::fs::read(shared("cpu/dist_mlp_w2.rank1.et.json")).unwrap();
    std::fs::write(
        dir.join("dist_mlp_w2.rank1.et.json"),
        &full[..full.len() / 2],
    )
    .unwrap();
    let out = bin()
        .args(["replay", "--ranks", dir.to_str().unwrap()])
        .args(["--iters", "1", "--warmup", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("rank 1 failed first"), "{err}");
    assert!(err.contains("truncated"), "{err}");
    assert!(!err.contains("memory together"), "{err}");
    assert!(
        err.contains("[rank 0] error: stopped before starting: another rank ended first"),
        "{err}"
    );
}

/// A rank killed mid-replay makes the run fail within the timeout, naming the rank, and leaves
/// no process behind.
#[test]
fn a_killed_rank_fails_the_run_and_leaves_no_process() {
    let log = signal_rank_1_mid_replay(libc::SIGKILL);
    assert!(log.contains("rank 1 failed first"), "{log}");
    assert!(log.contains("signal 9"), "{log}");
}

/// A rank stopped mid-replay (SIGSTOP) is named as the one that stopped responding, not the
/// healthy rank whose collective timed out waiting for it, and the run ends with no process
/// left (a stopped one included).
#[test]
fn a_stopped_rank_is_named_as_the_one_that_stopped() {
    let log = signal_rank_1_mid_replay(libc::SIGSTOP);
    assert!(log.contains("rank 1 stopped responding"), "{log}");
    assert!(!log.contains("rank 0 failed first"), "{log}");
}

/// Starts both ranks of the Gloo job for a long replay, sends rank 1 `signal` once they run
/// their collectives, and returns the launcher's stderr once it ended (exit 2, checked), every
/// rank's process gone.
fn signal_rank_1_mid_replay(signal: libc::c_int) -> String {
    let glob = shared("cpu").join("dist_mlp_w2.rank*.et.json");
    let mut child = bin()
        .args([
            "replay",
            "--ranks",
            glob.to_str().unwrap(),
            "--threads",
            "1",
        ])
        .args(["--iters", "1000000", "--warmup", "0", "--timeout", "10"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut pids = Vec::new();
    let mut log = String::new();
    while pids.len() < 2 {
        let mut line = String::new();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "launcher ended: {log}"
        );
        log.push_str(&line);
        if let Some(rest) = line.strip_prefix("[ranks] rank ") {
            let pid: u32 = rest
                .split("pid ")
                .nth(1)
                .unwrap()
                .split(' ')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            pids.push(pid);
        }
    }
    // Let the ranks get into their collectives, then signal rank 1.
    std::thread::sleep(Duration::from_secs(2));
    assert!(std::path::Path::new(&format!("/proc/{}", pids[0])).exists());
    // SAFETY: a signal to a rank process this test started.
    unsafe { libc::kill(pids[1] as i32, signal) };
    let started = Instant::now();
    let mut rest = String::new();
    let reader = std::thread::spawn(move || {
        let _ = std::io::Read::read_to_string(&mut err, &mut rest);
        rest
    });
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("the launcher did not end within 60 s of signal {signal} to a rank");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    log.push_str(&reader.join().unwrap());
    assert_eq!(status.code(), Some(2), "{log}");
    for pid in pids {
        // Reaped by the launcher: no process (not even a zombie) under that pid.
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                    .map(|c| !c.contains("mystique"))
                    .unwrap_or(true),
            "rank process {pid} is still there: {log}"
        );
    }
    log
}

/// A scratch directory of its own for one test.
fn scratch(name: &str) -> std::path::PathBuf {
    let d = common::scratch(&format!("ranks-{name}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Rank `k` of the shared 2-rank Gloo job as JSON, with `rank` (where given) recorded in a
/// `record_param_comms` record nested in its first allreduce, as PyTorch records it.
fn gloo_rank(k: usize, rank: Option<i64>) -> serde_json::Value {
    let path = shared("cpu").join(format!("dist_mlp_w2.rank{k}.et.json"));
    let t: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    match rank {
        Some(r) => with_rank_records(t, &[(None, r)]),
        None => t,
    }
}

/// `t` with `record_param_comms` records under its first all-reduce, each recording a rank
/// (and, where given, its collective's name).
fn with_rank_records(
    mut t: serde_json::Value,
    records: &[(Option<&str>, i64)],
) -> serde_json::Value {
    let nodes = t["nodes"].as_array_mut().unwrap();
    let mut id = nodes
        .iter()
        .map(|n| n["id"].as_u64().unwrap())
        .max()
        .unwrap();
    let parent = nodes
        .iter()
        .find(|n| n["name"] == "c10d::allreduce_")
        .map(|n| n["id"].clone())
        .unwrap();
    let empty = serde_json::json!({"values": [], "shapes": [], "types": [], "strides": []});
    for &(collective, rank) in records {
        id += 1;
        let mut attrs = vec![serde_json::json!({"name": "rank", "type": "int64", "value": rank})];
        if let Some(c) = collective {
            attrs
                .push(serde_json::json!({"name": "collective_name", "type": "string", "value": c}));
        }
        nodes.push(serde_json::json!({
            "id": id, "name": "record_param_comms", "ctrl_deps": parent,
            "inputs": empty, "outputs": empty, "attrs": attrs,
        }));
    }
    t
}

/// Every rank ran every op and its six collectives, and rank k replayed `expect[k]`.
fn check_every_collective(j: &serde_json::Value, expect: &[&str]) {
    assert_eq!(j["world_size"], 2, "{j}");
    for (k, r) in j["ranks"].as_array().unwrap().iter().enumerate() {
        assert_eq!(r["ops_failed"], 0, "rank {k}: {}", r["failures"]);
        let calls = collective_calls(r);
        assert_eq!(calls, 6, "rank {k}: {}", r["collectives"]);
        let trace = j["traces"][k].as_str().unwrap();
        assert!(trace.ends_with(expect[k]), "rank {k} replayed {trace}");
    }
}

/// Collective calls per iteration in one rank's report.
fn collective_calls(r: &serde_json::Value) -> u64 {
    r["collectives"]
        .as_object()
        .unwrap()
        .values()
        .map(|c| c["count"].as_u64().unwrap())
        .sum()
}

/// `replay --ranks DIR --only comm` for one quick iteration, with `extra` arguments.
fn replay_ranks(dir: &std::path::Path, extra: &[&str]) -> std::process::Command {
    let mut c = bin();
    c.args(["replay", "--ranks"])
        .arg(dir)
        .args(["--json", "--threads", "1", "--iters", "1", "--warmup", "0"])
        .args(["--only", "comm"])
        .args(extra);
    c
}

/// A directory of traces named `<job>_et_<rank>.json` that record no rank, beside a Kineto
/// trace and another JSON file: the traces are found by their content and ranked by their
/// file names, whatever order the directory lists them in.
#[test]
fn ranks_named_like_et_0_that_record_none_are_ranked_by_file_name() {
    let d = scratch("by-name");
    for k in [1, 0] {
        let t = gloo_rank(k, None);
        std::fs::write(d.join(format!("job_et_{k}.json")), t.to_string()).unwrap();
    }
    std::fs::copy(
        shared("cpu").join("dist_mlp_w2.rank0.kineto.json.gz"),
        d.join("job_kineto_0.json.gz"),
    )
    .unwrap();
    std::fs::write(d.join("job.meta.json"), r#"{"iter_ms_median": 3.0}"#).unwrap();
    let j = json(&mut replay_ranks(&d, &[]));
    assert_eq!(j["ranks_from"], "file name");
    check_every_collective(&j, &["job_et_0.json", "job_et_1.json"]);
    std::fs::remove_dir_all(&d).unwrap();
}

/// Both traces record rank 0 (as a public 2-rank job does): no evidence; the file names decide,
/// with a warning, and every collective runs on both ranks.
#[test]
fn traces_that_all_record_rank_0_fall_back_to_their_file_names() {
    let d = scratch("shared-record");
    for k in [0, 1] {
        let p = d.join(format!("gpt_et_{k}.json"));
        std::fs::write(&p, gloo_rank(k, Some(0)).to_string()).unwrap();
        // The fixture records what it says it does.
        let t = et_schema::read_trace(&p).unwrap();
        assert_eq!(et_graph::summary::recorded_rank(&t), Some(0));
    }
    let out = replay_ranks(&d, &[]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("do not tell them apart") && err.contains("gpt_et_1.json: 0"),
        "{err}"
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["ranks_from"], "file name");
    check_every_collective(&j, &["gpt_et_0.json", "gpt_et_1.json"]);
    std::fs::remove_dir_all(&d).unwrap();
}

/// Each rank's first record is a broadcast from rank 0, as DDP's first collective is: in that
/// record's rank slot ProcessGroupNCCL writes the root, not the rank. The records of the
/// all-reduces after it tell the ranks apart, named against their listed order.
#[test]
fn a_broadcasts_root_is_not_taken_for_the_traces_rank() {
    let d = scratch("broadcast-root");
    for (k, name) in [(0, "b.json"), (1, "a.json")] {
        let t = with_rank_records(
            gloo_rank(k, None),
            &[(Some("broadcast"), 0), (Some("allreduce"), k as i64)],
        );
        let p = d.join(name);
        std::fs::write(&p, t.to_string()).unwrap();
        let read = et_schema::read_trace(&p).unwrap();
        assert_eq!(et_graph::summary::recorded_rank(&read), Some(k as u64));
    }
    let out = replay_ranks(&d, &[]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("do not tell them apart"), "{err}");
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["ranks_from"], "recorded");
    check_every_collective(&j, &["b.json", "a.json"]);
    std::fs::remove_dir_all(&d).unwrap();
}

/// Traces whose records and names give no rank are refused before anything starts, naming the
/// files and the way out; with `--rank-order` they run as listed.
#[test]
fn traces_nothing_tells_apart_need_rank_order() {
    let d = scratch("listed");
    std::fs::write(d.join("a.json"), gloo_rank(0, None).to_string()).unwrap();
    std::fs::write(d.join("b.json"), gloo_rank(1, None).to_string()).unwrap();
    let out = replay_ranks(&d, &[]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--rank-order")
            && err.contains("give no rank to a.json, b.json")
            && !err.contains("[ranks] rank"),
        "{err}"
    );
    let j = json(&mut replay_ranks(&d, &["--rank-order"]));
    assert_eq!(j["ranks_from"], "listed order");
    check_every_collective(&j, &["a.json", "b.json"]);
    std::fs::remove_dir_all(&d).unwrap();
}

/// A trace whose process group has one rank (a single-GPU DDP job) replays alone, no launcher:
/// its collectives are the identity, said as such, and none fails.
#[test]
fn collectives_in_a_group_of_one_run_as_the_identity() {
    let d = scratch("group-of-one");
    let mut t = gloo_rank(0, None);
    for n in t["nodes"].as_array_mut().unwrap() {
        if n["name"] == "## process_group:init ##" {
            let groups = n["inputs"]["values"][0].as_str().unwrap();
            assert!(groups.contains("\"group_size\": 2"), "{groups}");
            n["inputs"]["values"][0] = groups
                .replace("\"group_size\": 2", "\"group_size\": 1")
                .into();
        }
    }
    let p = d.join("ddp_1gpu.et.json");
    std::fs::write(&p, t.to_string()).unwrap();
    let j = json(bin().arg("replay").arg(&p).args([
        "--json",
        "--threads",
        "1",
        "--iters",
        "1",
        "--warmup",
        "0",
    ]));
    assert_eq!(j["ops_failed"], 0, "{}", j["failures"]);
    assert_eq!(j["ops_replayed"], j["ops_selected"]);
    let identity: u64 = j["fallbacks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["ran_as"].as_str().unwrap().contains("one rank"))
        .map(|f| f["count"].as_u64().unwrap())
        .sum();
    assert_eq!(identity, 6, "{}", j["fallbacks"]);
    std::fs::remove_dir_all(&d).unwrap();
}

/// The same command on every rank, as clusters launch: PyTorch's own torchrun (from the
/// libtorch wheel `cargo xtask setup` installed) starts two ranks of `mystique replay DIR`,
/// each replays the trace of its own RANK, and both join the store torchrun's agent serves
/// (rank 0 serving one too would fail to bind).
#[test]
fn torchrun_starts_each_rank_on_its_own_trace_of_one_directory() {
    let wheel = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.libtorch");
    assert!(
        wheel.join("torch").is_dir(),
        "{}: no torch wheel (cargo xtask setup installs it)",
        wheel.display()
    );
    let d = scratch("torchrun");
    let traces = d.join("traces");
    std::fs::create_dir_all(&traces).unwrap();
    for k in [0, 1] {
        let t = gloo_rank(k, None);
        std::fs::write(traces.join(format!("job_et_{k}.json")), t.to_string()).unwrap();
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let logs = d.join("logs");
    let out = std::process::Command::new("python3")
        .env("PYTHONPATH", &wheel)
        .args(["-m", "torch.distributed.run", "--nproc-per-node", "2"])
        .args(["--master-port", &port.to_string(), "--redirects", "1"])
        .arg("--log-dir")
        .arg(&logs)
        .arg("--no-python")
        .arg(env!("CARGO_BIN_EXE_mystique"))
        .arg("replay")
        .arg(&traces)
        .args(["--only", "comm", "--json", "--iters", "1", "--warmup", "0"])
        .args(["--threads", "1", "--timeout", "30"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // torchrun keeps each rank's stdout: LOG_DIR/RUN/attempt_0/RANK/stdout.log.
    let mut reports = std::collections::BTreeMap::new();
    let mut dirs = vec![logs];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.file_name().is_some_and(|n| n == "stdout.log") {
                let rank: usize = p
                    .parent()
                    .unwrap()
                    .file_name()
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                let j: serde_json::Value =
                    serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
                reports.insert(rank, j);
            }
        }
    }
    assert_eq!(reports.len(), 2, "{reports:?}");
    for (k, r) in &reports {
        assert_eq!(r["rank"], *k as u64, "{r}");
        assert_eq!(r["world_size"], 2);
        assert!(
            r["trace"]
                .as_str()
                .unwrap()
                .ends_with(&format!("job_et_{k}.json")),
            "rank {k} replayed {}",
            r["trace"]
        );
        assert_eq!(r["ops_failed"], 0, "rank {k}: {}", r["failures"]);
        let calls = collective_calls(r);
        assert_eq!(calls, 6, "rank {k}: {}", r["collectives"]);
    }
    std::fs::remove_dir_all(&d).unwrap();
}

/// Two network hosts made on this machine: two network namespaces joined by a veth pair.
/// Dropped, it deletes both (and the pair with them).
struct TwoHosts {
    names: [String; 2],
    links: [String; 2],
    addrs: [String; 2],
}

impl TwoHosts {
    /// Made with `ip`, or why not (not root, no `ip`, namespaces not allowed here).
    fn make() -> Result<TwoHosts, String> {
        let id = std::process::id();
        let hosts = TwoHosts {
            names: [format!("mq{id}a"), format!("mq{id}b")],
            links: [format!("mq{id}x"), format!("mq{id}y")],
            addrs: [0, 1].map(|k| format!("10.213.{}.{}", id % 250, k + 1)),
        };
        let [a, b] = &hosts.names;
        let [x, y] = &hosts.links;
        let steps: Vec<Vec<&str>> = vec![
            vec!["netns", "add", a],
            vec!["netns", "add", b],
            vec!["link", "add", x, "type", "veth", "peer", "name", y],
            vec!["link", "set", x, "netns", a],
            vec!["link", "set", y, "netns", b],
        ];
        let run = |args: &[&str]| -> Result<(), String> {
            let out = std::process::Command::new("ip")
                .args(args)
                .output()
                .map_err(|e| format!("ip: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "ip {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        };
        for s in &steps {
            run(s)?;
        }
        for (k, (ns, link)) in [(a, x), (b, y)].into_iter().enumerate() {
            let cidr = format!("{}/24", hosts.addrs[k]);
            run(&["-n", ns, "addr", "add", &cidr, "dev", link])?;
            run(&["-n", ns, "link", "set", link, "up"])?;
            run(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(hosts)
    }

    /// Bytes host `k`'s end of the pair has sent.
    fn tx_bytes(&self, k: usize) -> u64 {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &self.names[k], "cat"])
            .arg(format!(
                "/sys/class/net/{}/statistics/tx_bytes",
                self.links[k]
            ))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or(0)
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        for ns in &self.names {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", ns])
                .output();
        }
    }
}

/// Two ranks on two network hosts, as a cluster's nodes run them: each rank in a network
/// namespace of its own, joined by a veth pair, `MASTER_ADDR` the first host's address. The
/// rendezvous and Gloo's traffic cross a real network stack (the second rank's Gloo binds its
/// own host's address, not the master's), and every collective runs on both. Where namespaces
/// cannot be made (not root, no `ip`), it says why and checks nothing.
#[test]
fn two_ranks_on_two_network_hosts_run_every_collective() {
    let hosts = match TwoHosts::make() {
        Ok(h) => h,
        Err(why) => {
            eprintln!("skipped: two network namespaces cannot be made here: {why}");
            return;
        }
    };
    let sent_before = hosts.tx_bytes(1);
    let port = 29400 + (std::process::id() % 500) as u16;
    let ranks: Vec<std::process::Child> = (0..2)
        .map(|k| {
            let trace = shared("cpu").join(format!("dist_mlp_w2.rank{k}.et.json"));
            std::process::Command::new("ip")
                .args(["netns", "exec", &hosts.names[k]])
                .arg(env!("CARGO_BIN_EXE_mystique"))
                .arg("replay")
                .arg(&trace)
                .args(["--only", "comm", "--json", "--iters", "2", "--warmup", "1"])
                .args(["--threads", "1", "--timeout", "30"])
                .env("RANK", k.to_string())
                .env("WORLD_SIZE", "2")
                .env("MASTER_ADDR", &hosts.addrs[0])
                .env("MASTER_PORT", port.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (k, child) in ranks.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "rank {k}: {err}");
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            (r["rank"].as_u64(), r["world_size"].as_u64()),
            (Some(k as u64), Some(2))
        );
        assert_eq!(r["ops_failed"], 0, "rank {k}: {}", r["failures"]);
        assert_eq!(collective_calls(&r), 6, "rank {k}: {}", r["collectives"]);
    }
    // The second host sent its part of every collective over the pair: at least its share of
    // the all-reduces' 400 KB per iteration, three iterations.
    let sent = hosts.tx_bytes(1) - sent_before;
    assert!(
        sent > 3 * 400_000 / 2,
        "{sent} bytes sent by the second host"
    );
}

/// A GPU job replays whole on the CPU where it fits: compute and collectives of every rank
/// (chakra's NCCL all-gather job, its trace as both of its ranks: every op, the ten
/// all-gathers over Gloo). Where it does not, the memory check says so before any rank
/// starts: the 8-rank DLRM's embedding tables need about 4.8 GiB on each of five ranks.
#[test]
fn a_gpu_job_replays_whole_on_the_cpu_where_it_fits() {
    let d = scratch("gpu-whole");
    for k in [0, 1] {
        std::fs::copy(
            shared("public/chakra_allgather_1.0.2.et.json"),
            d.join(format!("allgather_et_{k}.json")),
        )
        .unwrap();
    }
    let j = json(
        bin()
            .args(["replay", "--ranks", d.to_str().unwrap(), "--json"])
            .args(["--iters", "1", "--warmup", "0"]),
    );
    for (k, r) in j["ranks"].as_array().unwrap().iter().enumerate() {
        assert_eq!(r["ops_failed"], 0, "rank {k}: {}", r["failures"]);
        assert_eq!(r["ops_replayed"], r["ops_selected"], "rank {k}");
        assert_eq!(r["ops_skipped"], 0, "rank {k}: the whole job");
        assert_eq!(collective_calls(r), 10, "rank {k}: {}", r["collectives"]);
        assert!(
            r["comm"].as_str().unwrap().contains("NCCL"),
            "{}",
            r["comm"]
        );
    }
    let out = bin()
        .args([
            "replay",
            "--ranks",
            shared("public/param_dlrm_8rank_1.0.1").to_str().unwrap(),
        ])
        .args(["--iters", "1", "--warmup", "0"])
        .env("MYSTIQUE_AVAILABLE_MEMORY", (16u64 << 30).to_string())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("rank 0: 4.8 GiB") && err.contains("--only comm would need"),
        "{err}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

/// Ranks sharing this machine take one intra-op thread each unless told otherwise, as torchrun
/// sets OMP_NUM_THREADS=1 for several processes per node; `--threads` still decides.
#[test]
fn ranks_run_one_thread_each_unless_told_otherwise() {
    let glob = shared("cpu").join("dist_mlp_w2.rank*.et.json");
    let run = |extra: &[&str]| {
        json(
            bin()
                .args(["replay", "--ranks", glob.to_str().unwrap(), "--json"])
                .args(["--iters", "1", "--warmup", "0", "--only", "comm"])
                .args(extra)
                .env_remove("OMP_NUM_THREADS"),
        )
    };
    for r in run(&[])["ranks"].as_array().unwrap() {
        assert_eq!(r["threads"], 1, "{}", r["threads"]);
    }
    for r in run(&["--threads", "2"])["ranks"].as_array().unwrap() {
        assert_eq!(r["threads"], 2, "{}", r["threads"]);
    }
}

/// The text report of a multi-rank replay says, rank by rank, why ops failed and which ran
/// otherwise than recorded, as a single replay's does: both ranks' integer inputs made 32-bit
/// fail the loss (it wants 64-bit labels); a world of one runs the collectives as the
/// identity.
#[test]
fn a_multi_rank_report_lists_each_ranks_failures_and_fallbacks() {
    let dir = common::scratch("i32");
    for r in 0..2 {
        let out = bin()
            .args(["compose", "dtype"])
            .arg(shared(&format!("cpu/dist_mlp_w2.rank{r}.et.json")))
            .args(["--from", "int64", "--to", "int32", "-o"])
            .arg(dir.join(format!("dist_mlp_w2.rank{r}.et.json")))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    let run = |extra: &[&str]| {
        bin()
            .arg("replay")
            .arg("--ranks")
            .arg(&dir)
            .args(["--threads", "1", "--iters", "1", "--warmup", "0"])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    for r in 0..2 {
        assert!(
            text.contains(&format!("failed     rank {r}: 1x aten::cross_entropy_loss")),
            "{text}"
        );
    }
    let out = run(&["--only", "comm", "--world", "1"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("fallback   rank 0: 3x c10d::allreduce_: ran as the identity"),
        "{text}"
    );
}

/// A one-GPU DDP job's trace that recorded no process group (schema 1.0.3) still records its
/// world of one rank in its collectives' records: its collectives run as the identity, with
/// no launcher, as the job with a process-group record does.
#[test]
fn a_one_rank_job_without_a_group_record_runs_its_collectives_as_the_identity() {
    let out = bin()
        .arg("replay")
        .arg(shared("public/param_resnet_1gpu_1.0.3.et.json.gz"))
        .args(["--only", "comm", "--iters", "1", "--warmup", "0"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("0 failed"), "{text}");
    assert!(
        text.contains("15x c10d::allreduce_: ran as the identity"),
        "{text}"
    );
}
