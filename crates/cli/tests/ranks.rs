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
        let calls: u64 = r["collectives"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["count"].as_u64().unwrap())
            .sum();
        assert_eq!(calls, 6, "rank {k}: {}", r["collectives"]);
    }
    for op in [
        "c10d::allreduce_",
        "c10d::broadcast_",
        "c10d::allgather_",
        "c10d::barrier",
    ] {
        let c = &j["collectives"][op];
        assert_eq!(c["ranks"], 2, "{op}: {c}");
        assert!(c["time_ms"].as_f64().unwrap() > 0.0, "{op}: {c}");
        assert!(c["wait_ms"].as_f64().unwrap() >= 0.0);
    }
    assert!(j["slowest_rank"].as_u64().unwrap() < 2);
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
    assert_eq!(j["collectives"]["c10d::alltoall_base_"]["count"], 5);
    assert_eq!(j["collectives"]["c10d::allreduce_"]["count"], 3);
    assert_eq!(j["collectives"]["c10d::alltoall_base_"]["ranks"], 8);
}

/// Sets that cannot be one run are refused before anything starts: a rank twice, a rank
/// missing.
#[test]
fn mismatched_rank_sets_are_refused() {
    let dir = std::env::temp_dir().join(format!("mystique-ranks-{}", std::process::id()));
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
        "unexpected rank 3",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A rank killed mid-replay makes the run fail within the timeout, naming the rank, and leaves
/// no process behind.
#[test]
fn a_killed_rank_fails_the_run_and_leaves_no_process() {
    let glob = shared("cpu").join("dist_mlp_w2.rank*.et.json");
    let mut child = bin()
        .args([
            "replay",
            "--ranks",
            glob.to_str().unwrap(),
            "--threads",
            "1",
            "--iters",
            "1000000",
            "--warmup",
            "0",
            "--timeout",
            "10",
        ])
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
    // Let the ranks get into their collectives, then kill rank 1.
    std::thread::sleep(Duration::from_secs(2));
    assert!(std::path::Path::new(&format!("/proc/{}", pids[0])).exists());
    unsafe { libc::kill(pids[1] as i32, libc::SIGKILL) };
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
            panic!("the launcher did not end within 60 s of a rank's death");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    log.push_str(&reader.join().unwrap());
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(log.contains("rank 1 failed first"), "{log}");
    assert!(log.contains("signal 9"), "{log}");
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
}
