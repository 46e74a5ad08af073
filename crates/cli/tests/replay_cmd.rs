//! `mystique replay` and `compare` through the real binary on real traces.

mod common;
use common::{bin, json, shared};

#[test]
fn replay_json_has_the_documented_fields_and_writes_a_perfetto_trace() {
    let out_trace = common::scratch("files").join("replay.json");
    let j = json(
        bin()
            .arg("replay")
            .arg(shared("cpu/dlrm.et.json"))
            .args([
                "--json",
                "--threads",
                "1",
                "--iters",
                "3",
                "--warmup",
                "1",
                "--trace-out",
            ])
            .arg(&out_trace),
    );
    for k in [
        "ops_selected",
        "ops_replayed",
        "ops_failed",
        "failures",
        "iter_ms",
        "peak_bytes",
    ] {
        assert!(j.get(k).is_some(), "missing {k}: {j}");
    }
    assert_eq!(j["ops_failed"], 0, "{}", j["failures"]);
    assert_eq!(j["ops_selected"], j["ops_replayed"]);
    for k in ["median", "min", "max"] {
        assert!(j["iter_ms"][k].as_f64().unwrap() > 0.0);
    }
    let t: serde_json::Value = serde_json::from_slice(&std::fs::read(&out_trace).unwrap()).unwrap();
    let slices = t["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .count();
    assert_eq!(slices as u64, j["ops_replayed"].as_u64().unwrap());
    // The memory timeline: the allocator's count after each step, its most the reported peak.
    let counts: Vec<f64> = t["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "C" && e["name"] == "allocated (bytes)")
        .map(|e| e["args"]["value"].as_f64().unwrap())
        .collect();
    assert_eq!(counts.len() as u64, j["ops_replayed"].as_u64().unwrap());
    let peak = j["iteration_memory"]["peak_over_start_bytes"]
        .as_f64()
        .unwrap();
    assert!(peak > 0.0);
    assert!(counts.iter().all(|&c| c <= peak), "{counts:?} over {peak}");
    std::fs::remove_file(&out_trace).unwrap();
}

#[test]
fn replay_reports_missing_cuda_and_bad_devices_cleanly() {
    let refused = |device: &str, why: &str| {
        let out = bin()
            .arg("replay")
            .arg(shared("cpu/mlp.et.json"))
            .args(["--device", device])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains(why));
    };
    refused("tpu", "unknown device");
    if !tch::Cuda::is_available() {
        // Says which is missing (driver, device), never panics (cudarc would without libcuda).
        refused("cuda", "no CUDA");
        refused("cuda:3", "no CUDA");
    }
}

#[test]
fn compare_of_a_gpu_original_on_cpu_says_the_devices_differ() {
    let j = json(
        bin()
            .arg("compare")
            .arg(shared("public/hta_simple_add_1.0.1.et.json.gz"))
            .arg(shared("public/hta_simple_add_1.0.1.kineto.json.gz"))
            .args(["--json", "--iters", "1", "--warmup", "0"]),
    );
    assert!(
        j["device_mismatch"].as_str().unwrap().contains("GPU"),
        "{}",
        j["device_mismatch"]
    );
    assert_eq!(j["compared_by"], "op time");
    assert!(j["original_gpu"]["events"].as_u64().unwrap() > 0);
    assert!(j["replay_gpu"].is_null(), "no GPU activity on a CPU replay");
}

#[test]
fn compare_without_the_originals_time_compares_profiled_with_profiled() {
    // A copy of the pair without its meta file.
    let dir = common::scratch("cmp");
    for f in ["mlp.linked.et.json", "mlp.kineto.json"] {
        std::fs::copy(shared(&format!("cpu/{f}")), dir.join(f)).unwrap();
    }
    let run = |extra: &[&str]| {
        json(
            bin()
                .arg("compare")
                .arg(dir.join("mlp.linked.et.json"))
                .arg(dir.join("mlp.kineto.json"))
                .args(["--json", "--threads", "1", "--iters", "2", "--warmup", "1"])
                .args(extra),
        )
    };
    let j = run(&[]);
    assert!(
        j["basis_iter"].as_str().unwrap().starts_with("profiled"),
        "{}",
        j["basis_iter"]
    );
    let p = j["replay"]["instrumented_iter_ms"].as_f64().unwrap();
    let o = j["original"]["iter_ms"].as_f64().unwrap();
    assert!((j["ratio_iter"].as_f64().unwrap() - p / o).abs() < 1e-9);
    let j = run(&["--original-ms", "2.5"]);
    assert_eq!(j["original"]["uninstrumented_ms"], 2.5);
    assert!(j["basis_iter"].as_str().unwrap().contains("--original-ms"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn compare_reports_ratios_and_an_svg() {
    let svg = common::scratch("files").join("compare.svg");
    let j = json(
        bin()
            .arg("compare")
            .arg(shared("cpu/mlp.linked.et.json"))
            .arg(shared("cpu/mlp.kineto.json"))
            .args([
                "--json",
                "--threads",
                "1",
                "--iters",
                "3",
                "--emulate-gaps",
                // Value checks stay out of the instrumented iteration's profile.
                "--check-values",
                "--svg",
            ])
            .arg(&svg),
    );
    assert_eq!(j["linked"], j["ops"]);
    assert!(j["ratio_iter"].as_f64().unwrap() > 0.0);
    // mlp.meta.json beside the trace holds the original's uninstrumented time: the iteration
    // compares uninstrumented with uninstrumented, and says so.
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(shared("cpu/mlp.meta.json")).unwrap()).unwrap();
    assert_eq!(j["original"]["uninstrumented_ms"], meta["iter_ms_median"]);
    assert!(
        j["basis_iter"]
            .as_str()
            .unwrap()
            .starts_with("uninstrumented"),
        "{}",
        j["basis_iter"]
    );
    let expect =
        j["replay"]["iter_ms"].as_f64().unwrap() / meta["iter_ms_median"].as_f64().unwrap();
    assert!((j["ratio_iter"].as_f64().unwrap() - expect).abs() < 1e-9);
    assert!(j["basis_ops"].as_str().unwrap().starts_with("profiled"));
    assert!(j["replay"]["gaps_ms"].as_f64().unwrap() >= 0.0);
    // The replay spins what it says: each gap counts from the previous op's end, so the time
    // between ops is at least the gaps as spun (a spin that ran short of them, as work whose
    // rate depends on what the ops left in the caches did, fails this). They are the model's,
    // at the factor they followed the host's speed by since the calibration.
    let emulated = j["gap_model"]["emulated_ms"].as_f64().unwrap();
    let pace = j["replay"]["gap_pace"].as_f64().unwrap();
    let spun = j["replay"]["gaps_ms"].as_f64().unwrap();
    let between = j["replay"]["between_ops_ms"].as_f64().unwrap();
    assert!(emulated > 0.0, "{emulated}");
    assert!((0.5..=2.0).contains(&pace), "{pace}");
    // Calibrated at least five times, on for a time budget, an odd count (the model is the
    // median one's, so one of them).
    let calibrations: Vec<f64> = j["gap_model"]["calibrations_ms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_f64().unwrap())
        .collect();
    assert!(
        (5..=25).contains(&calibrations.len()) && calibrations.len() % 2 == 1,
        "{calibrations:?}"
    );
    assert!(
        calibrations.iter().any(|&c| (c - emulated).abs() < 1e-12),
        "{emulated} not among {calibrations:?}"
    );
    assert!(
        (spun - emulated * pace).abs() <= 1e-9 * spun.max(1.0),
        "{spun} {emulated} {pace}"
    );
    assert!(
        between >= spun * 0.999,
        "{between} ms between ops < {spun} ms spun"
    );
    assert!(!j["top_differences"].as_array().unwrap().is_empty());
    // The extra iteration under the capture's instrumentation profiled every linked op, and
    // compares like for like with the original's profiled durations.
    assert_eq!(j["instrumented"]["ops"], j["linked"]);
    assert!(j["instrumented"]["ratio_ops"].as_f64().unwrap() > 0.0);
    assert!(
        j["top_differences"][0]["replay_instrumented_us"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(s.starts_with("<svg") && s.contains("aten::"));
    // Headed by the card's iteration figure and its basis, the file's name only.
    assert!(s.contains("mlp.linked.et.json: iteration") && s.contains("(uninstrumented)"));
    assert!(
        !s.contains(&*shared("cpu").to_string_lossy()),
        "an absolute path in the plot"
    );
    assert!(s.contains("replay / original (log scale; green within 10% of 1)"));
    std::fs::remove_file(&svg).unwrap();
}

#[test]
fn a_malformed_local_rank_is_refused_before_any_work() {
    // torchrun's variables are read once (replay::DistOptions::from_env); a LOCAL_RANK that is
    // not a number is an error there, whatever the device, not a silent fallback.
    let out = bin()
        .arg("replay")
        .arg(shared("cpu/mlp.linked.et.json"))
        .env("WORLD_SIZE", "2")
        .env("RANK", "0")
        .env("LOCAL_RANK", "first")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("LOCAL_RANK"), "{err}");
}

/// `--paced N`: each block of N measured iterations waits for a line on stdin and is answered
/// by one JSON line before the report; when the input ends, the rest run back to back.
#[test]
fn a_paced_replay_runs_a_block_per_line_and_answers_each() {
    use std::io::{BufRead, Write};
    let run = |lines: usize| -> (Vec<serde_json::Value>, serde_json::Value) {
        let mut child = bin()
            .arg("replay")
            .arg(shared("cpu/mlp.linked.et.json"))
            .args(["--json", "--threads", "1", "--warmup", "1", "--iters", "5"])
            .args(["--paced", "2"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut blocks = Vec::new();
        for _ in 0..lines {
            writeln!(stdin, "go").unwrap();
            stdin.flush().unwrap();
            // The answer comes before the next line is sent: a block runs on its own line.
            let mut l = String::new();
            out.read_line(&mut l).unwrap();
            blocks.push(serde_json::from_str::<serde_json::Value>(&l).unwrap());
        }
        drop(stdin);
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
        assert!(child.wait().unwrap().success());
        (blocks, serde_json::from_str(rest.trim()).unwrap())
    };
    // Blocks of 2, 2 and the last 1 of the 5 measured iterations.
    let (blocks, report) = run(3);
    let iters: Vec<u64> = blocks
        .iter()
        .map(|b| b["iters"].as_u64().unwrap())
        .collect();
    assert_eq!(iters, [2, 2, 1]);
    for b in &blocks {
        assert!(b["block_ms"].as_f64().unwrap() > 0.0, "{b}");
        assert!(b["minor_faults"].as_u64().is_some(), "{b}");
        // The time the replay waited for a CPU in the block: part of it (Linux accounts it).
        if cfg!(target_os = "linux") {
            let w = b["wait_ms"].as_f64().unwrap();
            assert!(w >= 0.0 && w <= b["block_ms"].as_f64().unwrap(), "{b}");
        }
    }
    assert_eq!(report["iter_ms"]["n"], 5);
    // One line, then the end of input: the other three run unpaced, and the report is whole.
    let (blocks, report) = run(1);
    assert_eq!(blocks.len(), 1);
    assert_eq!(report["iter_ms"]["n"], 5);
    assert_eq!(report["ops_failed"], 0);
}

/// No measured iteration is refused, not run as one; a machine too small for the replay (as
/// `MYSTIQUE_AVAILABLE_MEMORY` makes this one) refuses it before it allocates.
#[test]
fn a_replay_needs_an_iteration_and_the_memory_it_estimates() {
    let replay = |args: &[&str], available: Option<&str>| {
        let mut c = bin();
        c.arg("replay").arg(shared("cpu/mlp.et.json")).args(args);
        if let Some(bytes) = available {
            c.env("MYSTIQUE_AVAILABLE_MEMORY", bytes);
        }
        let out = c.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = replay(&["--iters", "0"], None);
    assert_eq!(code, Some(2));
    assert!(err.contains("--iters"), "{err}");
    let (code, err) = replay(&["--iters", "1", "--warmup", "0"], Some("1000"));
    assert_eq!(code, Some(2));
    assert!(err.contains("0.0 MiB is available"), "{err}");
    let (code, err) = replay(&["--iters", "1", "--warmup", "0"], Some("banana"));
    assert_eq!(code, Some(2));
    assert!(err.contains("is not a number of bytes"), "{err}");
    let (code, err) = replay(&["--iters", "1", "--warmup", "0", "--force"], Some("1000"));
    assert_eq!(code, Some(0), "{err}");
}

/// `compare` sets one iteration against one: a trace of several profiled steps is refused
/// unless `--iteration` picks one, which then compares as a single step.
#[test]
fn compare_takes_one_iteration_of_several() {
    let data = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../et-graph/tests/data");
    let compare = |extra: &[&str]| {
        let mut c = bin();
        c.arg("compare")
            .arg(data.join("steps.linked.et.json.gz"))
            .arg(data.join("steps.kineto.json.gz"))
            .args(["--iters", "1", "--warmup", "0", "--threads", "1"])
            .args(extra);
        c
    };
    let o = compare(&[]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("holds 4 iterations") && err.contains("--iteration N"),
        "{err}"
    );
    let j = json(&mut compare(&["--iteration", "2", "--json"]));
    let all = json(
        bin()
            .args(["graph", "--json"])
            .arg(data.join("steps.linked.et.json.gz")),
    );
    // One of the four steps' ops, all linked to the profile.
    let ops = j["ops"].as_u64().unwrap();
    let total = all["replay_set"]["ops"].as_u64().unwrap();
    assert!(ops > 0 && 3 * ops < total, "{ops} of {total}");
    assert_eq!(j["linked"], ops, "{}", j["linked"]);
}

/// A trace of `torch.compile`d code says what it does not hold: the fused kernels of its
/// compiled region are not ops of the trace, and the replay runs only the rest (here the two
/// matmuls Inductor left to libtorch, and the optimizer's add).
#[test]
fn a_compiled_region_is_named_with_what_the_replay_leaves_out() {
    let data = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/compiled");
    let o = bin()
        .arg("replay")
        .arg(data.join("compiled.et.json.gz"))
        .args(["--iters", "1", "--warmup", "0", "--threads", "1", "--json"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("1 torch.compile region") && err.contains("not ops of the trace"),
        "{err}"
    );
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["ops_failed"], 0, "{j}");
    let plain = bin()
        .arg("replay")
        .arg(shared("cpu/mlp.et.json"))
        .args(["--iters", "1", "--warmup", "0", "--threads", "1"])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&plain.stderr).contains("torch.compile"));
}

/// A replay runs as many intra-op threads as the capture's meta file records, at most this
/// machine's cores, unless `--threads` or `OMP_NUM_THREADS` says otherwise.
#[test]
fn a_replay_runs_the_captures_thread_count_unless_told() {
    let dir = common::scratch("threads");
    let et = dir.join("mlp.et.json");
    std::fs::copy(shared("cpu/mlp.et.json"), &et).unwrap();
    let meta = |n: i64| {
        std::fs::write(
            dir.join("mlp.meta.json"),
            format!(r#"{{"iter_ms_median": 1.0, "threads": {n}}}"#),
        )
        .unwrap()
    };
    let cores = std::thread::available_parallelism().unwrap().get() as i64;
    let threads = |args: &[&str], omp: Option<&str>| {
        let mut c = bin();
        c.arg("replay")
            .arg(&et)
            .args(["--iters", "1", "--warmup", "0", "--json"])
            .args(args)
            .env_remove("OMP_NUM_THREADS");
        if let Some(n) = omp {
            c.env("OMP_NUM_THREADS", n);
        }
        json(&mut c)["threads"].as_i64().unwrap()
    };
    // A capture on a bigger host: this one's cores.
    meta(1000);
    assert_eq!(threads(&[], None), cores);
    // One thread, where libtorch would take every core.
    meta(1);
    assert_eq!(threads(&[], None), 1);
    assert_eq!(threads(&["--threads", "2"], None), 2);
    assert_eq!(threads(&[], Some("2")), 2);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn paced_blocks_need_an_iteration() {
    let out = bin()
        .arg("replay")
        .arg(shared("cpu/mlp.linked.et.json"))
        .args(["--paced", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--paced"));
}

/// One of a trace's four profiled iterations replays with gaps typical of all four (the report
/// says how many), or of its own with --gaps-of-one-iteration; options that would do nothing
/// are refused.
#[test]
fn gaps_of_one_of_several_iterations_are_typical_of_them_all() {
    let data = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../et-graph/tests/data");
    let run = |extra: &[&str]| {
        json(
            bin()
                .arg("replay")
                .arg(data.join("steps.linked.et.json.gz"))
                .arg("--kineto")
                .arg(data.join("steps.kineto.json.gz"))
                .args([
                    "--emulate-gaps",
                    "--iteration",
                    "2",
                    "--json",
                    "--threads",
                    "1",
                    "--iters",
                    "2",
                ])
                .args(extra),
        )
    };
    let typical = run(&[]);
    assert_eq!(typical["ops_failed"], 0, "{}", typical["failures"]);
    assert_eq!(typical["gap_model"]["capture_iterations"], 4);
    // A training step's backward nodes in the gaps, charged at the cost probed on this host.
    let m = &typical["gap_model"];
    assert!(m["events_with_args"].as_u64().unwrap() > 0, "{m}");
    let probed = m["per_backward_event_us"].as_array().expect("probed");
    assert!(probed.iter().all(|x| x.as_f64().unwrap() >= 0.0), "{m}");
    assert!(probed[0].as_f64().unwrap() > 0.0, "{m}");
    let own = run(&["--gaps-of-one-iteration"]);
    assert_eq!(own["gap_model"]["capture_iterations"], 1);
    assert_eq!(typical["ops_selected"], own["ops_selected"]);
    // Options that would do nothing are refused before the replay: the gaps of one iteration
    // without one picked; gaps with --only comm (spun before the ops it leaves out). --only
    // comm of a trace with no collective replays nothing, and says so.
    for (extra, says) in [
        (
            &["--emulate-gaps", "--gaps-of-one-iteration"][..],
            "the one iteration --iteration N picks",
        ),
        (
            &["--emulate-gaps", "--only", "comm"],
            "--emulate-gaps with --only comm",
        ),
    ] {
        let out = bin()
            .arg("replay")
            .arg(data.join("steps.linked.et.json.gz"))
            .arg("--kineto")
            .arg(data.join("steps.kineto.json.gz"))
            .args(extra)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{extra:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{extra:?}: {err}");
    }
    let out = bin()
        .arg("replay")
        .arg(data.join("steps.linked.et.json.gz"))
        .args(["--only", "comm", "--iters", "1", "--warmup", "0"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("holds no collective): nothing is replayed"),
        "{err}"
    );
}

/// `replay` of the bundled four-step trace with gaps from its profile (taken without the
/// observer), on one thread for two measured iterations; the caller adds the rest.
fn steps_with_gaps() -> std::process::Command {
    let data = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../et-graph/tests/data");
    let mut c = bin();
    c.arg("replay")
        .arg(data.join("steps.et.json.gz"))
        .arg("--kineto")
        .arg(data.join("steps.timing.json.gz"))
        .arg("--emulate-gaps")
        .args(["--threads", "1", "--iters", "2"]);
    c
}

/// A clean ET replayed with gaps from a profile taken without the execution trace observer:
/// linked by order, gaps the least over its four steps, and the calibration run under what the
/// profile was taken with (the profiler alone, with shapes), which the report says. `compare`
/// instruments the same way.
#[test]
fn gaps_from_a_profile_taken_without_the_observer() {
    let data = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../et-graph/tests/data");
    let args = ["--json", "--threads", "1", "--iters", "2"];
    let r = json(steps_with_gaps().arg("--json"));
    assert_eq!(r["ops_failed"], 0, "{}", r["failures"]);
    let m = &r["gap_model"];
    assert_eq!(
        m["instrumentation"],
        serde_json::json!({"execution_trace": false, "record_shapes": true, "profile_memory": false})
    );
    assert_eq!(m["capture_iterations"], 4);
    // Every op linked and timed in both profiles, but for the odd one on a loaded host: an op
    // whose whole window the thread spent waiting for a CPU has no window left in running time
    // in that calibration, and the median calibration may be one that lost it.
    let (found, selected) = (
        m["speed_ops"].as_u64().unwrap(),
        r["ops_selected"].as_u64().unwrap(),
    );
    assert!(found <= selected && found + 2 >= selected, "{m}");
    assert!(m["emulated_ms"].as_f64().unwrap() > 0.0, "{m}");
    assert!(m["events_with_args"].as_u64().unwrap() > 0, "{m}");
    // The linked pair of the same model says it had the observer on.
    let l = json(
        bin()
            .arg("replay")
            .arg(data.join("steps.linked.et.json.gz"))
            .arg("--kineto")
            .arg(data.join("steps.kineto.json.gz"))
            .args(["--emulate-gaps", "--iteration", "2"])
            .args(args),
    );
    assert_eq!(
        l["gap_model"]["instrumentation"],
        serde_json::json!({"execution_trace": true, "record_shapes": true, "profile_memory": false})
    );
    let c = json(
        bin()
            .arg("compare")
            .arg(data.join("steps.et.json.gz"))
            .arg(data.join("steps.timing.json.gz"))
            .args(args),
    );
    assert_eq!(c["linked"], c["ops"]);
    // Every linked op found again in the replay's own profile.
    assert_eq!(c["instrumented"]["ops"], c["linked"]);
}

/// A linked pair's gaps, taken under the execution trace observer, come with a note that a
/// reference or a profile taken without the observer pins them, and the gap that holds the
/// iteration's edges is charged what the calibration measured there (`edge_us`). A profile
/// taken without the observer gets neither.
#[test]
fn a_linked_pairs_edges_are_charged_and_its_gaps_come_with_a_note() {
    let data = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../et-graph/tests/data");
    let note = "taken under the execution trace observer";
    let out = bin()
        .arg("replay")
        .arg(data.join("steps.linked.et.json.gz"))
        .arg("--kineto")
        .arg(data.join("steps.kineto.json.gz"))
        .args(["--emulate-gaps", "--iteration", "2"])
        .args(["--json", "--threads", "1", "--iters", "2"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains(note), "{stderr}");
    let l: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let edge = l["gap_model"]["edge_us"].as_f64();
    assert!(
        edge.is_some_and(|e| e.is_finite() && e >= 0.0),
        "{}",
        l["gap_model"]
    );
    let out = steps_with_gaps().arg("--json").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains(note), "{stderr}");
    let c: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(c["gap_model"]["edge_us"].is_null(), "{}", c["gap_model"]);
}

/// On a linked pair, `--call-probed-boundaries` charges each boundary its own op's probed call
/// and the boxing of its inputs (all but the iteration's edges), and the report says how many
/// boundaries were probed; by default none is. Beside `--replay-boundary-costs` it is refused.
#[test]
fn each_ops_call_is_charged_only_when_asked() {
    let data = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../et-graph/tests/data");
    let linked = || {
        let mut c = bin();
        c.arg("replay")
            .arg(data.join("steps.linked.et.json.gz"))
            .arg("--kineto")
            .arg(data.join("steps.kineto.json.gz"))
            .args(["--emulate-gaps", "--iteration", "2"])
            .args(["--json", "--threads", "1", "--iters", "2"]);
        c
    };
    let d = json(&mut linked());
    assert_eq!(d["gap_model"]["call_probed"], 0, "{}", d["gap_model"]);
    assert!(d["gap_model"]["boxing_us"].is_null());
    let r = json(linked().arg("--call-probed-boundaries"));
    assert_eq!(r["ops_failed"], 0, "{}", r["failures"]);
    let m = &r["gap_model"];
    let boundaries = m["boundaries"].as_u64().unwrap_or(0);
    assert!(boundaries > 0, "{m}");
    // Every boundary but the one that holds the iteration's edges, which is charged what the
    // calibration measured there.
    let edge = u64::from(m["edge_us"].is_number());
    assert_eq!(m["call_probed"].as_u64(), Some(boundaries - edge), "{m}");
    let boxing = m["boxing_us"].as_f64().unwrap_or(f64::NAN);
    assert!(boxing.is_finite() && boxing >= 0.0, "{m}");
    let out = linked()
        .args(["--call-probed-boundaries", "--replay-boundary-costs"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

/// `--time-base-with-gaps` measures the pace's time base with the gaps spun and says so in the
/// report (the plain base beside it); by default the base is the calibration's times how much
/// slower the ops ran between the gaps in runs of iterations that alternated (`ops_between_gaps`), and
/// the report has no `time_base`.
#[test]
fn the_time_base_is_taken_with_the_gaps_only_when_asked() {
    let plain = json(steps_with_gaps().arg("--json"));
    let m = &plain["gap_model"];
    assert!(m["time_base"].is_null(), "{m}");
    let between = &m["ops_between_gaps"];
    let factor = between["factor"].as_f64().unwrap_or(f64::NAN);
    assert!((0.5..=2.0).contains(&factor), "{m}");
    assert!(between["iterations"].as_u64().unwrap_or(0) >= 4, "{m}");
    let r = json(steps_with_gaps().args(["--json", "--time-base-with-gaps"]));
    assert_eq!(r["ops_failed"], 0, "{}", r["failures"]);
    assert!(r["gap_model"]["ops_between_gaps"].is_null());
    let b = &r["gap_model"]["time_base"];
    let ms = |k: &str| b[k].as_f64().unwrap_or(f64::NAN);
    assert!(ms("with_gaps_ms") > 0.0 && ms("plain_ms") > 0.0, "{b}");
    assert!(b["iterations"].as_u64().unwrap_or(0) >= 5, "{b}");
    // Without --emulate-gaps the flag has nothing to act on: refused.
    let data = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../et-graph/tests/data");
    let out = bin()
        .arg("replay")
        .arg(data.join("steps.et.json.gz"))
        .arg("--time-base-with-gaps")
        .output()
        .unwrap();
    assert!(!out.status.success());
}

/// With a reference (`--reference`), the gaps' total is anchored on it: the report says from
/// what, and the gap replay's iteration is the reference original's on this host's speed. A
/// reference that is not one is refused, naming the file and the field.
#[test]
fn gaps_anchored_on_a_reference() {
    let dir = common::scratch("reference");
    let reference = dir.join("ref.json");
    let replay = |r: &std::path::Path| {
        let mut c = steps_with_gaps();
        c.arg("--reference").arg(r).arg("--json");
        c
    };
    std::fs::write(
        &reference,
        r#"{"original_ms": 5.0, "replay_ms": 1.1, "replay_op_ms": 1.0}"#,
    )
    .unwrap();
    let r = json(&mut replay(&reference));
    assert_eq!(r["ops_failed"], 0, "{}", r["failures"]);
    let a = &r["gap_model"]["anchored"];
    let f = |v: &serde_json::Value| v.as_f64().unwrap();
    // The target is 5x the plain replay's op time here, the gaps most of it.
    assert!(
        (f(&a["target_ms"]) - 5.0 * f(&a["replay_op_ms"])).abs() < 1e-9,
        "{a}"
    );
    assert!(f(&a["scale"]) > 0.0, "{a}");
    assert!(
        f(&r["gap_model"]["emulated_ms"]) > 3.0 * f(&a["replay_op_ms"]),
        "{a}"
    );
    // The host is set by the ops back to back (`replay_op_ms`); the target is filled with them
    // as they run between the gaps, `factor` times slower: the gaps hold no more than the rest.
    let factor = f(&r["gap_model"]["ops_between_gaps"]["factor"]);
    assert!(
        f(&r["gap_model"]["emulated_ms"])
            <= f(&a["target_ms"]) - factor * f(&a["replay_op_ms"]) + 1e-9,
        "{}",
        r["gap_model"]
    );
    // Timed on a shared host: taken in running time (the original's 5 ms less the 2.5 it
    // waited), with a warning that a quiet host's reference is the better one.
    std::fs::write(
        &reference,
        r#"{"original_ms": 5.0, "replay_ms": 1.1, "replay_op_ms": 1.0, "original_wait_ms": 2.5, "replay_wait_ms": 0.0}"#,
    )
    .unwrap();
    let out = replay(&reference).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shared: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let a = &shared["gap_model"]["anchored"];
    assert_eq!(a["reference"]["original_ms"], 2.5, "{a}");
    assert!(
        (f(&a["target_ms"]) - 2.5 * f(&a["replay_op_ms"])).abs() < 1e-9,
        "{a}"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("shared host") && err.contains("50%"), "{err}");
    let big = format!("[{}0]", "0, ".repeat(400_000));
    for (text, field) in [
        (r#"{"original_ms": 5.0, "replay_ms": 1.1}"#, "replay_op_ms"),
        (
            r#"{"original_ms": -1, "replay_ms": 1.1, "replay_op_ms": 1.0}"#,
            "original_ms",
        ),
        (
            r#"{"original_ms": 5.0, "replay_ms": 1.0, "replay_op_ms": 1.1}"#,
            "replay_op_ms",
        ),
        (
            r#"{"original_ms": 5.0, "replay_ms": 1.1, "replay_op_ms": 1.0, "replay_wait_ms": "x"}"#,
            "replay_wait_ms",
        ),
        (
            r#"{"original_ms": 5.0, "replay_ms": 1.1, "replay_op_ms": 1.0, "original_wait_ms": 5.0}"#,
            "original_wait_ms",
        ),
        ("not json", "not JSON"),
        // A trace given where the reference goes: refused by its size, not read whole.
        (big.as_str(), "not a reference file"),
    ] {
        std::fs::write(&reference, text).unwrap();
        let out = replay(&reference).output().unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("ref.json") && err.contains(field),
            "{text}: {err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--reference-out` writes, from a plain replay and the original's time, the reference that
/// `--reference` reads back; without the original's time it refuses before replaying and
/// writes nothing.
#[test]
fn a_reference_is_written_on_the_capture_host() {
    let data = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../et-graph/tests/data");
    let dir = common::scratch("reference-out");
    let reference = dir.join("ref.json");
    let r = json(
        bin()
            .arg("replay")
            .arg(data.join("steps.et.json.gz"))
            .arg("--reference-out")
            .arg(&reference)
            .args([
                "--original-ms",
                "7.5",
                "--json",
                "--threads",
                "1",
                "--iters",
                "3",
            ]),
    );
    let w: serde_json::Value = serde_json::from_slice(&std::fs::read(&reference).unwrap()).unwrap();
    assert_eq!(w["original_ms"], 7.5);
    assert_eq!(w["original_from"], "--original-ms");
    // The replay's own medians, as its report gives them.
    assert_eq!(w["replay_ms"], r["iter_ms"]["median"], "{w}");
    let op = w["replay_op_ms"].as_f64().unwrap();
    assert!(op > 0.0 && op <= w["replay_ms"].as_f64().unwrap(), "{w}");
    // Its time in ops: the median iteration times the ops' share of it by the means (which
    // add up; the medians' ratio does not where waits fall in some iterations only).
    let share = r["op_ms"]["mean"].as_f64().unwrap() / r["iter_ms"]["mean"].as_f64().unwrap();
    let want = w["replay_ms"].as_f64().unwrap() * share.min(1.0);
    assert!((op - want).abs() <= 1e-9 * want, "{w}: want {want}");
    // What the replay waited for a CPU, part of its iteration (Linux accounts it); the
    // original's only when given.
    if cfg!(target_os = "linux") {
        let wait = w["replay_wait_ms"].as_f64().unwrap();
        assert!(
            wait >= 0.0 && wait < w["replay_ms"].as_f64().unwrap(),
            "{w}"
        );
    }
    assert!(w.get("original_wait_ms").is_none(), "{w}");
    // Read back by --reference: the anchored report names it.
    let a = json(
        steps_with_gaps()
            .arg("--reference")
            .arg(&reference)
            .arg("--json"),
    );
    assert_eq!(
        a["gap_model"]["anchored"]["reference"]["original_ms"], 7.5,
        "{}",
        a["gap_model"]
    );
    // The table says so too, with the reference's original.
    let out = steps_with_gaps()
        .arg("--reference")
        .arg(&reference)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        table.contains("anchored   on the reference") && table.contains("original's 7.500 ms"),
        "{table}"
    );
    // compare anchors on it too, the table and --json saying so.
    let compare = |extra: &[&str]| {
        let o = bin()
            .arg("compare")
            .arg(data.join("steps.et.json.gz"))
            .arg(data.join("steps.timing.json.gz"))
            .args(["--emulate-gaps", "--reference"])
            .arg(&reference)
            .args(["--threads", "1", "--iters", "2"])
            .args(extra)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let c: serde_json::Value = serde_json::from_str(compare(&["--json"]).trim()).unwrap();
    assert_eq!(
        c["gap_model"]["anchored"]["reference"]["original_ms"], 7.5,
        "{}",
        c["gap_model"]
    );
    // With no meta file beside the trace, the reference's original is the iteration's basis:
    // uninstrumented with uninstrumented, not the profiled original.
    let basis = c["card"]["iteration_ms"]["basis"]
        .as_str()
        .unwrap_or_default();
    assert!(
        basis.starts_with("uninstrumented") && basis.contains("the reference"),
        "{basis}"
    );
    assert_eq!(c["card"]["iteration_ms"]["original"], 7.5, "{}", c["card"]);
    let table = compare(&[]);
    assert!(
        table.contains("anchored   on the reference") && table.contains("original's 7.500 ms"),
        "{table}"
    );
    // On a shared capture host, the original's wait for a CPU: the anchor takes the original
    // in running time.
    let waited = dir.join("waited.json");
    let base = || {
        let mut c = bin();
        c.arg("replay")
            .arg(data.join("steps.et.json.gz"))
            .arg("--reference-out")
            .arg(&waited)
            .args(["--original-ms", "7.5", "--threads", "1", "--iters", "3"]);
        c
    };
    let out = base().args(["--original-wait-ms", "2.5"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let a = json(
        steps_with_gaps()
            .arg("--reference")
            .arg(&waited)
            .arg("--json"),
    );
    assert_eq!(
        a["gap_model"]["anchored"]["reference"]["original_ms"], 5.0,
        "{}",
        a["gap_model"]
    );
    // A wait as long as the original's iteration is refused, and nothing written.
    std::fs::remove_file(&waited).unwrap();
    let out = base().args(["--original-wait-ms", "7.5"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--original-wait-ms"), "{err}");
    assert!(!waited.exists());
    // A part of the iteration is no reference for the whole: refused before the replay.
    let out = base().args(["--only", "compute"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not with --only"), "{err}");
    // No original time: refused up front, nothing written.
    let missing = dir.join("none.json");
    let out = bin()
        .arg("replay")
        .arg(data.join("steps.et.json.gz"))
        .arg("--reference-out")
        .arg(&missing)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--original-ms"), "{err}");
    assert!(!missing.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `compare --json`'s fidelity card has each figure with both sides, their ratio and the basis
/// they were measured on; figures a capture did not record are null on its side, and say so.
#[test]
fn compare_writes_a_fidelity_card_with_each_figures_basis() {
    let plot = common::scratch("files").join("card.png");
    let j = json(
        bin()
            .arg("compare")
            .arg(shared("cpu/cnn.linked.et.json.gz"))
            .arg(shared("cpu/cnn.kineto.json.gz"))
            .args(["--json", "--threads", "1", "--iters", "2", "--warmup", "1"])
            .arg("--card-plot")
            .arg(&plot),
    );
    // The card's plot, as PNG: one row per figure.
    let b = std::fs::read(&plot).unwrap();
    std::fs::remove_file(&plot).unwrap();
    assert_eq!(&b[..8], b"\x89PNG\r\n\x1a\n");
    let height = u32::from_be_bytes(b[20..24].try_into().unwrap());
    let figures = j["card"].as_object().unwrap().len() as u32;
    assert!(height >= 34 * figures, "{height} px for {figures} figures");
    let card = &j["card"];
    for name in [
        "iteration_ms",
        "op_ms",
        "gap_ms",
        "peak_memory_bytes",
        "cpu_ms",
    ] {
        let f = &card[name];
        for key in ["original", "replay", "ratio", "basis"] {
            assert!(f.get(key).is_some(), "{name}.{key}: {card}");
        }
        assert!(f["replay"].as_f64().unwrap() > 0.0, "{name}: {f}");
        assert!(!f["basis"].as_str().unwrap().is_empty(), "{name}");
    }
    // cnn.meta.json holds the original's uninstrumented time: the iteration compares with it.
    assert!(card["iteration_ms"]["basis"]
        .as_str()
        .unwrap()
        .starts_with("uninstrumented"));
    let ratio = card["iteration_ms"]["ratio"].as_f64().unwrap();
    assert!((ratio - j["ratio_iter"].as_f64().unwrap()).abs() < 1e-9);
    assert!(card["op_ms"]["basis"]
        .as_str()
        .unwrap()
        .starts_with("profiled"));
    card_adds_up(&j);
    // Its profile recorded no memory and its meta no peak: the original's side is null.
    let mem = &card["peak_memory_bytes"];
    assert!(mem["original"].is_null() && mem["ratio"].is_null(), "{mem}");
    assert!(
        mem["basis"].as_str().unwrap().contains("not recorded"),
        "{mem}"
    );
    assert!(card["cpu_ms"]["original"].is_null());
    // CPU time is the measured iterations' alone: a process of `threads` busy threads spends
    // at most that many times the wall time (the profiler's set-up after them is not theirs).
    let threads = j["threads"].as_f64().unwrap();
    let wall = j["replay"]["iter_ms"].as_f64().unwrap();
    let cpu = card["cpu_ms"]["replay"].as_f64().unwrap();
    assert!(
        cpu <= (threads + 1.0) * wall,
        "{cpu} ms of CPU in {wall} ms"
    );
}

/// An op of the replay set that the original's profile does not show (here cnn's first
/// `aten::batch_norm`, its event dropped) is unlinked: the original's time in it lies between
/// its linked ops, so the card counts the replay's window of it between ops too, and the
/// replay's `op_ms` and `gap_ms` still add up to its instrumented iteration.
#[test]
fn compare_card_counts_an_unlinked_op_as_time_between_ops() {
    let k = common::scratch("files").join("cnn.unlinked.kineto.json");
    let mut profile: serde_json::Value = serde_json::from_reader(flate2::read::GzDecoder::new(
        std::fs::File::open(shared("cpu/cnn.kineto.json.gz")).unwrap(),
    ))
    .unwrap();
    let events = profile["traceEvents"].as_array_mut().unwrap();
    let first = events
        .iter()
        .position(|e| e["name"] == "aten::batch_norm")
        .unwrap();
    events.remove(first);
    std::fs::write(&k, profile.to_string()).unwrap();
    let j = json(
        bin()
            .arg("compare")
            .arg(shared("cpu/cnn.linked.et.json.gz"))
            .arg(&k)
            .args(["--json", "--threads", "1", "--iters", "2", "--warmup", "1"]),
    );
    let _ = std::fs::remove_file(&k);
    let linked = j["linked"].as_u64().unwrap();
    let ops = j["ops"].as_u64().unwrap();
    assert_eq!(linked + 1, ops, "{} of {}", j["linked"], j["ops"]);
    card_adds_up(&j);
}

/// On the profiled basis the card's replay time between ops is its instrumented iteration less
/// its time in the same ops, so the two add up to that iteration.
fn card_adds_up(j: &serde_json::Value) {
    let card = &j["card"];
    let instrumented = j["replay"]["instrumented_iter_ms"].as_f64().unwrap();
    let (op, gap) = (
        card["op_ms"]["replay"].as_f64().unwrap(),
        card["gap_ms"]["replay"].as_f64().unwrap(),
    );
    assert!(
        (op + gap - instrumented).abs() < 1e-6,
        "{op} + {gap} vs {instrumented}: {card}"
    );
}

/// A linked pair whose profile recorded memory (`tests/data/mlp_mem`:
/// `xtask/scripts/memory_pair.py`, an MLP step with Adam under profile_memory): the original's
/// peak comes from its memory events, and the replay's, counted the same way, matches it
/// (the gradients the original held in `.grad` to the iteration's end held too).
#[test]
fn compare_sets_the_replays_peak_memory_against_the_profiles() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/mlp_mem");
    let j = json(
        bin()
            .arg("compare")
            .arg(dir.join("mlp_mem.et.json.gz"))
            .arg(dir.join("mlp_mem.kineto.json.gz"))
            .args(["--json", "--threads", "1", "--iters", "2", "--warmup", "1"]),
    );
    let mem = &j["card"]["peak_memory_bytes"];
    assert!(
        mem["basis"]
            .as_str()
            .unwrap()
            .contains("profile_memory events"),
        "{mem}"
    );
    let (o, r) = (
        mem["original"].as_f64().unwrap(),
        mem["replay"].as_f64().unwrap(),
    );
    // The weights' gradients alone are 1.6 MB.
    assert!(o > 1.6e6, "{mem}");
    let ratio = r / o;
    assert!(
        (0.9..=1.1).contains(&ratio),
        "replay {r} vs original {o}: {mem}"
    );
}

/// `h = tanh(h @ w)` in a loop holds the old `h` and the product beside the new `h` (Python
/// rebinds the name after the call; the product lives to the expression's end). Freed at last
/// use, the replay holds less than the original; given the profile_memory profile through
/// `--kineto`, it frees each tensor where the original did and holds what it held.
#[test]
fn a_memory_profile_places_the_frees_where_the_original_freed() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/loop_mem");
    let (et, k) = (
        dir.join("loop_mem.et.json.gz"),
        dir.join("loop_mem.kineto.json.gz"),
    );
    let replay = |extra: &[&str]| {
        json(
            bin()
                .arg("replay")
                .arg(&et)
                .arg("--kineto")
                .arg(&k)
                .args(["--json", "--threads", "1", "--iters", "2", "--warmup", "1"])
                .args(extra),
        )
    };
    let peak = |j: &serde_json::Value| {
        j["iteration_memory"]["peak_over_start_bytes"]
            .as_f64()
            .unwrap()
    };
    let followed = replay(&[]);
    let at_last_use = replay(&["--frees-at-last-use"]);
    // The same profile as --memory-profile, beside no --kineto.
    let by_option = json(
        bin()
            .arg("replay")
            .arg(&et)
            .arg("--memory-profile")
            .arg(&k)
            .args(["--json", "--threads", "1", "--iters", "2", "--warmup", "1"]),
    );
    assert_eq!(by_option["frees_followed"], followed["frees_followed"]);
    // A --memory-profile without memory events is refused by name.
    let plain = common::scratch("files").join("nomem.json");
    let mut profile: serde_json::Value = serde_json::from_reader(flate2::read::GzDecoder::new(
        std::fs::File::open(&k).unwrap(),
    ))
    .unwrap();
    profile["traceEvents"]
        .as_array_mut()
        .unwrap()
        .retain(|e| e["name"] != "[memory]");
    std::fs::write(&plain, profile.to_string()).unwrap();
    let out = bin()
        .arg("replay")
        .arg(&et)
        .arg("--memory-profile")
        .arg(&plain)
        .args(["--iters", "1", "--warmup", "0"])
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&plain);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no memory events"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let f = &followed["frees_followed"];
    assert!(f["matched"].as_u64().unwrap() > 0, "{f}");
    assert_eq!(f["matched"], f["storages"], "{f}");
    assert!(f["delayed"].as_u64().unwrap() > 0, "{f}");
    assert!(at_last_use["frees_followed"].is_null());
    // One activation is 128 KiB: at last use the replay holds one fewer at its peak.
    assert!(
        peak(&followed) >= peak(&at_last_use) + 131072.0,
        "{} vs {}",
        peak(&followed),
        peak(&at_last_use)
    );
    // compare follows the profile too, and sets the replay's peak against the original's;
    // its gap model calibrates under the profile's instrumentation, memory events included.
    let j = json(bin().arg("compare").arg(&et).arg(&k).args([
        "--json",
        "--threads",
        "1",
        "--iters",
        "2",
        "--warmup",
        "1",
        "--emulate-gaps",
    ]));
    let mem = &j["card"]["peak_memory_bytes"];
    let ratio = mem["ratio"].as_f64().unwrap();
    assert!((0.9..=1.1).contains(&ratio), "{mem}");
    let instr = &j["gap_model"]["instrumentation"];
    assert_eq!(instr["profile_memory"], true, "{instr}");
    assert_eq!(instr["execution_trace"], true, "{instr}");
}

/// `compare --only compute` of a rank's linked pair compares the compute it ran, not the
/// collectives it passed through (they ran no time); and without --threads it runs at the
/// thread count the capture's meta file recorded.
#[test]
fn compare_leaves_out_what_only_left_out_and_takes_the_captures_threads() {
    let j = json(
        bin()
            .arg("compare")
            .arg(shared("cpu/dist_mlp_w2.rank0.linked.et.json.gz"))
            .arg(shared("cpu/dist_mlp_w2.rank0.kineto.json.gz"))
            .args([
                "--json", "--iters", "2", "--warmup", "1", "--only", "compute",
            ])
            .env_remove("OMP_NUM_THREADS"),
    );
    let ops: Vec<&str> = j["top_differences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["op"].as_str().unwrap())
        .collect();
    assert!(!ops.is_empty());
    assert!(ops.iter().all(|op| !op.starts_with("c10d::")), "{ops:?}");
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(shared("cpu/dist_mlp_w2.rank0.meta.json")).unwrap())
            .unwrap();
    assert_eq!(j["threads"], meta["threads"]);
    assert_eq!(j["ops_failed"], 0, "{}", j["failures"]);
}

/// `compare`'s per-op table does not show an op whose calls all failed as taking no time:
/// on the DLRM's rank 7 (its collectives cannot run alone), the row says `failed`, with no
/// ratio, in the text and in `--json`; the failed ops' rows come first, whatever the other
/// ops' differences on a busy host.
#[test]
fn compare_shows_failed_ops_as_failed_not_as_zero_time() {
    let d = shared("public/param_dlrm_8rank_1.0.1");
    let args = |json: bool| {
        let mut c = bin();
        c.arg("compare")
            .arg(d.join("rank7.et.json.gz"))
            .arg(d.join("rank7.kineto.json.gz"))
            .args(["--iters", "1", "--warmup", "0"]);
        if json {
            c.arg("--json");
        }
        c
    };
    // Failed ops make the command exit 3, after its report.
    let out = args(false).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let row = text
        .lines()
        .find(|l| l.trim_end().ends_with("c10d::alltoall_base_"))
        .unwrap_or_else(|| panic!("no alltoall row: {text}"));
    assert!(row.contains("failed"), "{row}");
    assert!(!row.contains(" 0.0 "), "{row}");
    let out = args(true).output().unwrap();
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let d = j["top_differences"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["op"] == "c10d::alltoall_base_")
        .unwrap();
    assert_eq!(d["failed_calls"], d["calls"], "{d}");
    assert!(d["ratio"].is_null(), "{d}");
    let failed: Vec<bool> = j["top_differences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["failed_calls"].as_u64().unwrap() > 0)
        .collect();
    assert!(failed.windows(2).all(|w| w[0] >= w[1]), "{failed:?}");
}

/// `--blocking` on a trace replayed alone says that it has no rank to wait for.
#[test]
fn blocking_alone_says_it_has_no_rank_to_wait_for() {
    let out = bin()
        .arg("replay")
        .arg(shared("public/chakra_allgather_1.0.2.et.json"))
        .args(["--blocking", "--iters", "1", "--warmup", "0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no other rank to wait for"), "{err}");
}

/// A replay whose stdout is closed before its report (`| head`) still exits 3 where ops failed,
/// and a command whose stderr is closed exits with its own status, or the closed pipe's,
/// rather than a panic's.
#[test]
fn a_closed_output_does_not_hide_failed_ops() {
    // The transformer's batch of 4 scaled: its flattened views no longer fit, and fail.
    let scaled = common::scratch("files").join("transformer.batch8.json");
    let out = bin()
        .args(["compose", "scale"])
        .arg(shared("cpu/transformer.et.json.gz"))
        .args(["--dim", "4", "--factor", "2", "-o"])
        .arg(&scaled)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("view/reshape ops no longer hold"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A pipe whose reading end is closed before the command starts: every write to it fails.
    let closed = || {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        writer
    };
    let status = bin()
        .arg("replay")
        .arg(&scaled)
        .args(["--threads", "1", "--iters", "1", "--warmup", "0"])
        .stdout(closed())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    let _ = std::fs::remove_file(&scaled);
    assert_eq!(status.code(), Some(3), "{status:?}");
    let status = bin()
        .args(["inspect", "/nonexistent/trace.json"])
        .stdout(std::process::Stdio::null())
        .stderr(closed())
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(2), "{status:?}");
    // A replay whose stderr closes while it reports progress is cut short as a closed pipe
    // cuts a program short (128 + SIGPIPE), not by a panic's 101.
    let status = bin()
        .arg("replay")
        .arg(shared("cpu/mlp.et.json"))
        .args(["--threads", "1", "--iters", "1", "--warmup", "0"])
        .stdout(std::process::Stdio::null())
        .stderr(closed())
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(141), "{status:?}");
}

/// `compare`'s line for the original accounts for its iteration: ops and gaps add up to it,
/// else the line says what the difference is (more in this iteration than typical, or ops of
/// other threads overlapping, as on the two-rank job's rank 0).
#[test]
fn compares_original_line_accounts_for_its_iteration() {
    let out = bin()
        .arg("compare")
        .arg(shared("cpu/dist_mlp_w2.rank0.linked.et.json.gz"))
        .arg(shared("cpu/dist_mlp_w2.rank0.kineto.json.gz"))
        .args(["--threads", "1", "--iters", "1", "--warmup", "0"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with("original")).unwrap();
    let ms: Vec<f64> = line
        .split_whitespace()
        .filter_map(|w| w.trim_start_matches('(').parse().ok())
        .collect();
    let (iter, ops, gaps) = (ms[0], ms[1], ms[2]);
    let adds_up = (iter - ops - gaps).abs() <= 0.001 * iter + 0.0015;
    assert!(
        adds_up || line.contains("more in this one") || line.contains("overlaps"),
        "{line}"
    );
}

/// A plot named with an extension plots are not written in is refused before the replay
/// whose results it would draw, and says which extensions are.
#[test]
fn a_plots_format_is_checked_before_the_replay() {
    for flag in ["--card-plot", "--svg"] {
        let out = bin()
            .arg("compare")
            .arg(shared("cpu/mlp.linked.et.json"))
            .arg(shared("cpu/mlp.kineto.json"))
            .args([flag, "/tmp/mystique-plot-format-check.pdf"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{flag}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(".svg or .png"), "{flag}: {err}");
        assert!(
            !err.contains("[replay]"),
            "{flag}: refused before the replay: {err}"
        );
    }
}

/// A reference written for one capture and given with another's is named in a warning; the
/// same capture's linked ET takes its clean ET's reference without one.
#[test]
fn another_captures_reference_is_warned_of() {
    let reference = common::scratch("files").join("mlp.reference.json");
    let out = bin()
        .arg("replay")
        .arg(shared("cpu/mlp.et.json"))
        .arg("--reference-out")
        .arg(&reference)
        .args(["--threads", "1", "--iters", "2", "--warmup", "1"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let anchored = |et: &str, kineto: &str| {
        let out = bin()
            .arg("replay")
            .arg(shared(et))
            .arg("--kineto")
            .arg(shared(kineto))
            .arg("--emulate-gaps")
            .arg("--reference")
            .arg(&reference)
            .args(["--threads", "1", "--iters", "1", "--warmup", "0"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let other = anchored("cpu/cnn.linked.et.json.gz", "cpu/cnn.kineto.json.gz");
    assert!(other.contains("is the reference of"), "{other}");
    let same = anchored("cpu/mlp.linked.et.json", "cpu/mlp.kineto.json");
    assert!(!same.contains("is the reference of"), "{same}");
}

/// `compare --only comm` of a trace with no collective has nothing to set beside the
/// original, and is refused before the replay rather than printing a card of nothing.
#[test]
fn compare_refuses_an_only_that_leaves_nothing() {
    let out = bin()
        .arg("compare")
        .arg(shared("cpu/mlp.linked.et.json"))
        .arg(shared("cpu/mlp.kineto.json"))
        .args(["--only", "comm"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("holds no collective"), "{err}");
}

/// Options that would do nothing where they are given are refused before the replay, rather
/// than accepted without a word: NVML's sampling and plot on the CPU, a rank order for one
/// trace, frees at last use with no profile that places them, and with --ranks the one-rank
/// memory profile. The NVML options with --ranks are checked by the launcher too.
#[test]
fn options_that_would_do_nothing_here_are_refused() {
    let svg = common::scratch("do-nothing").join("nvml.svg");
    let mlp = shared("cpu/mlp.et.json");
    let glob = shared("cpu").join("dist_mlp_w2.rank*.et.json");
    let glob = glob.to_str().unwrap();
    let svg_arg = svg.to_str().unwrap();
    let mlp_arg = mlp.to_str().unwrap();
    for (args, says) in [
        (
            vec![mlp_arg, "--nvml-period", "5"],
            "--nvml-period samples a CUDA device",
        ),
        (
            vec![mlp_arg, "--gpu-svg", svg_arg],
            "--gpu-svg samples a CUDA device",
        ),
        (vec![mlp_arg, "--rank-order"], "is one trace"),
        (vec![mlp_arg, "--frees-at-last-use"], "--kineto"),
        (
            vec!["--ranks", glob, "--memory-profile", mlp_arg],
            "--memory-profile take one rank's profile",
        ),
        (
            vec!["--ranks", glob, "--gpu-svg", svg_arg],
            "--gpu-svg samples a CUDA device",
        ),
    ] {
        let out = bin().arg("replay").args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!err.contains("replaying"), "{args:?} started: {err}");
        assert!(!svg.exists(), "{args:?} drew {}", svg.display());
    }
    // Sampling turned off is what the CPU does anyway.
    let out = bin()
        .arg("replay")
        .args([
            mlp_arg,
            "--nvml-period",
            "0",
            "--iters",
            "1",
            "--warmup",
            "0",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// A selection of a GPU trace whose every op launched GPU work (an optimizer step) leaves the
/// calibration no op to time this host against the capture by: it says so, rather than
/// emulating the capture's gaps uncorrected without a word.
#[test]
fn gaps_the_calibration_cannot_measure_are_warned_of() {
    let sel = common::scratch("uncalibrated").join("opt.et.json");
    let s = bin()
        .arg("select")
        .arg(shared("public/param_linear_1.0.1.et.json.gz"))
        .args(["--scope", "Optimizer", "-o"])
        .arg(&sel)
        .status()
        .unwrap();
    assert!(s.success());
    let out = bin()
        .arg("replay")
        .arg(&sel)
        .arg("--kineto")
        .arg(shared("public/param_linear_1.0.1.kineto.json.gz"))
        .args([
            "--emulate-gaps",
            "--iters",
            "1",
            "--warmup",
            "0",
            "--threads",
            "1",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("0 of the replayed ops were found in both") && err.contains("--reference"),
        "{err}"
    );
}

/// A linked ET with another model's linked profile: the error says they are not one capture's,
/// without pointing at a linked twin that was given already.
#[test]
fn a_linked_trace_with_another_models_profile_is_named_so() {
    let o = bin()
        .arg("compare")
        .arg(shared("cpu/mlp.linked.et.json"))
        .arg(shared("cpu/cnn.kineto.json.gz"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("is it this trace's profile?"), "{err}");
    assert!(!err.contains("not the clean"), "{err}");
}

/// An operator no library registered (the DLRM rank's fbgemm ops, here without fbgemm): the
/// failure says to load its library, and once libraries were loaded that none of those is it.
#[test]
fn an_unregistered_operator_names_the_libraries_loaded() {
    let trace = shared("public/param_dlrm_8rank_1.0.1/rank6.et.json.gz");
    let run = |extra: &[&str]| {
        let o = bin()
            .arg("replay")
            .arg(&trace)
            .args(["--only", "compute", "--iters", "1", "--warmup", "0"])
            .args(extra)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(3), "{o:?}");
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let bare = run(&[]);
    assert!(
        bare.contains("fbgemm::bounds_check_indices is registered in this libtorch (load its library with --load-library)"),
        "{bare}"
    );
    // A library that registers no operator (the C maths library, present on every glibc
    // system).
    let libm = [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/usr/lib64/libm.so.6",
        "/lib64/libm.so.6",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists());
    let Some(libm) = libm else { return };
    let loaded = run(&["--load-library", libm]);
    assert!(
        loaded.contains(&format!(
            "none of the libraries loaded ({libm}) registers it"
        )),
        "{loaded}"
    );
}
