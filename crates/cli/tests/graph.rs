//! graph, link, select, compose and export through the real binary.

mod common;
use common::{bin, shared};

fn json(args: &[&std::ffi::OsStr]) -> serde_json::Value {
    common::json(bin().args(args))
}

#[test]
fn link_json_reports_ops_and_linked() {
    let j = json(&[
        "link".as_ref(),
        shared("cpu/cnn.linked.et.json.gz").as_os_str(),
        shared("cpu/cnn.kineto.json.gz").as_os_str(),
        "--json".as_ref(),
    ]);
    assert!(j["ops"].as_u64().unwrap() > 100);
    assert_eq!(j["ops"], j["linked"]);
    let out = bin()
        .arg("link")
        .arg(shared("cpu/cnn.et.json.gz"))
        .arg(shared("cpu/cnn.kineto.json.gz"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("another iteration"));
}

#[test]
fn link_reports_the_gpu_activity_of_a_gpu_trace_and_none_on_cpu() {
    let dir = "public/param_dlrm_8rank_1.0.1";
    let j = json(&[
        "link".as_ref(),
        shared(&format!("{dir}/rank0.et.json.gz")).as_os_str(),
        shared(&format!("{dir}/rank0.kineto.json.gz")).as_os_str(),
        "--json".as_ref(),
    ]);
    let gpu = &j["gpu"];
    let f = |k: &str| gpu[k].as_f64().unwrap();
    // DLRM's all_to_all / allreduce run NCCL kernels; embedding and MLP kernels compute.
    assert!(f("comm_us") > 0.0 && f("compute_us") > 0.0, "{gpu}");
    assert!(f("busy_us") <= f("span_us") + 1e-6, "{gpu}");
    assert!(
        f("overlap_us") <= f("comm_us").min(f("compute_us")) + 1e-6,
        "{gpu}"
    );
    // Exposed plus overlapped is the communication's union, at most the sum of its kernels.
    assert!(
        f("exposed_comm_us") + f("overlap_us") <= f("comm_us") + 1e-3,
        "{gpu}"
    );
    assert_eq!(gpu["top"][0]["work"], "Comm", "{gpu}");
    // fbgemm's backward kernels, launched under autograd's CppNode rather than an ATen op, are
    // in the count and given to the replayed ops inside it.
    let off = &j["gpu_off_op"];
    let attributed = off["attributed"].as_u64().unwrap();
    assert!(attributed > 0, "{off}");
    assert_eq!(
        off["under_ops"].as_u64().unwrap() + attributed + off["unattributed"].as_u64().unwrap(),
        gpu["events"].as_u64().unwrap(),
        "{off}"
    );
    assert!(off["by_launcher"][0]["launched_under"]
        .as_str()
        .unwrap()
        .contains("CppNode"));
    let text = bin()
        .arg("link")
        .arg(shared(&format!("{dir}/rank0.et.json.gz")))
        .arg(shared(&format!("{dir}/rank0.kineto.json.gz")))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&format!(
            "GPU events launched outside the linked ops: {attributed} ("
        )),
        "{text}"
    );
    let cpu = json(&[
        "link".as_ref(),
        shared("cpu/cnn.linked.et.json.gz").as_os_str(),
        shared("cpu/cnn.kineto.json.gz").as_os_str(),
        "--json".as_ref(),
    ]);
    assert_eq!(cpu["gpu"]["events"], 0, "{}", cpu["gpu"]);
}

#[test]
fn graph_select_compose_and_export_round_trip() {
    let dir = common::scratch("compose");
    let t = shared("cpu/transformer.et.json.gz");
    let g = json(&["graph".as_ref(), t.as_os_str(), "--json".as_ref()]);
    let ops = g["replay_set"]["ops"].as_u64().unwrap();
    assert!(g["tensors"]["peak_live_bytes"]["cpu"].as_u64().unwrap() > 0);

    let rep = dir.join("rep.json.gz");
    let s = bin()
        .args(["compose", "repeat"])
        .arg(&t)
        .arg("2")
        .arg("-o")
        .arg(&rep)
        .status()
        .unwrap();
    assert!(s.success());
    let g2 = json(&["graph".as_ref(), rep.as_os_str(), "--json".as_ref()]);
    assert_eq!(g2["replay_set"]["ops"].as_u64().unwrap(), 2 * ops);

    let sel = dir.join("sel.json");
    let s = bin()
        .arg("select")
        .arg(&t)
        .args(["--scope", "Optimizer", "-o"])
        .arg(&sel)
        .status()
        .unwrap();
    assert!(s.success());
    let g3 = json(&["graph".as_ref(), sel.as_os_str(), "--json".as_ref()]);
    assert!(g3["replay_set"]["ops"].as_u64().unwrap() < ops);
    let i = json(&["inspect".as_ref(), sel.as_os_str(), "--json".as_ref()]);
    assert_eq!(i["schema"], "1.1.1-chakra.0.0.4");

    let out = bin()
        .arg("export")
        .arg(&t)
        .args(["--dot", "--name", "aten::linear"])
        .output()
        .unwrap();
    let dot = String::from_utf8(out.stdout).unwrap();
    assert!(dot.starts_with("digraph") && dot.contains("aten::linear"));

    let out = bin()
        .arg("select")
        .arg(&t)
        .args(["--name", "zzz", "-o"])
        .arg(dir.join("none.json"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("matches no op"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `graph`'s external inputs are what a replay must supply: a saved output or a weight's
/// alias read under a new tensor id over bytes already produced or read is the same data, so
/// `graph` and `replay` agree on the inputs' bytes (within the few a replay derives, such as a
/// log-softmax's saved output, rather than supplies).
#[test]
fn graph_counts_the_external_bytes_a_replay_supplies() {
    for t in [
        "cpu/mlp.et.json",
        "cpu/transformer.et.json.gz",
        "cpu/dlrm.et.json",
    ] {
        let g = json(&["graph".as_ref(), shared(t).as_os_str(), "--json".as_ref()]);
        let r = common::json(bin().arg("replay").arg(shared(t)).args([
            "--json",
            "--threads",
            "1",
            "--iters",
            "1",
            "--warmup",
            "0",
        ]));
        let graph = g["tensors"]["external_bytes"].as_f64().unwrap();
        let replay = r["external_bytes"].as_f64().unwrap();
        assert!(
            (graph / replay - 1.0).abs() < 0.005,
            "{t}: graph {graph} bytes, replay {replay}"
        );
    }
}

/// `compose remove` whose filters select every op (a CPU trace has no collective, so `--only
/// compute` is all of it) is refused, as a remove without filters is, and writes nothing.
#[test]
fn compose_remove_refuses_to_remove_every_op() {
    let out = common::scratch("files").join("none-left.json");
    let o = bin()
        .args(["compose", "remove"])
        .arg(shared("cpu/mlp.et.json"))
        .args(["--only", "compute", "-o"])
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no op to replay"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!out.exists());
}

/// Outputs named `.gz`, in any case, are gzipped: traces, DOT and Chakra files and replay
/// timelines alike.
#[test]
fn outputs_named_gz_are_compressed() {
    let dir = common::scratch("files");
    let cases: [(&str, &[&str]); 3] = [
        ("sel.JSON.GZ", &["select"]),
        ("g.dot.gz", &["export", "--dot"]),
        ("c.et.Gz", &["export", "--chakra"]),
    ];
    for (name, cmd) in cases {
        let out = dir.join(name);
        let o = bin()
            .args(cmd)
            .arg(shared("cpu/mlp.et.json"))
            .arg("-o")
            .arg(&out)
            .output()
            .unwrap();
        assert!(o.status.success(), "{name}: {o:?}");
        let b = std::fs::read(&out).unwrap();
        assert_eq!(&b[..2], b"\x1f\x8b", "{name} is not gzipped");
    }
    // A replay's timeline too.
    let timeline = dir.join("timeline.json.gz");
    let o = bin()
        .arg("replay")
        .arg(shared("cpu/mlp.et.json"))
        .args([
            "--threads",
            "1",
            "--iters",
            "1",
            "--warmup",
            "0",
            "--trace-out",
        ])
        .arg(&timeline)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    assert_eq!(&std::fs::read(&timeline).unwrap()[..2], b"\x1f\x8b");
    // The gzipped trace reads back as the selection.
    let g = json(&[
        "graph".as_ref(),
        dir.join("sel.JSON.GZ").as_os_str(),
        "--json".as_ref(),
    ]);
    assert_eq!(g["replay_set"]["ops"], 45);
}

/// `graph --iteration` checks the iterations as `select` and `export` do: one the trace does
/// not hold, or one with no op to replay, is refused by every command alike.
#[test]
fn graph_refuses_iterations_as_select_does() {
    let cases = [
        (
            "public/param_resnet_1.1.0.et.json.gz",
            "1",
            "iterations present: [6, 7, 8]",
        ),
        ("cpu/mlp.et.json", "1", "has no ProfilerStep#N iteration"),
        (
            "public/param_hf_gpt2_1.1.0.et.json.gz",
            "1",
            "holds no op to replay",
        ),
    ];
    for (trace, n, says) in cases {
        for cmd in [&["graph"][..], &["select", "-o", "-"], &["export", "--dot"]] {
            let o = bin()
                .args(cmd)
                .arg(shared(trace))
                .args(["--iteration", n])
                .output()
                .unwrap();
            assert_eq!(o.status.code(), Some(2), "{cmd:?} {trace}");
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(err.contains(says), "{cmd:?} {trace}: {err}");
        }
    }
}

/// Another rank's profile links one for one (every rank runs the same code), so an ET that
/// records no rank is held to the one its file name gives: rank 0's ET with rank 1's profile
/// is refused by `link` and `compare` alike.
#[test]
fn another_ranks_profile_is_refused_by_the_ets_file_name() {
    for cmd in ["link", "compare"] {
        let o = bin()
            .arg(cmd)
            .arg(shared("cpu/dist_mlp_w2.rank0.linked.et.json.gz"))
            .arg(shared("cpu/dist_mlp_w2.rank1.kineto.json.gz"))
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{cmd}: {o:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("is rank 1's") && err.contains("rank 0's (by its file name)"),
            "{cmd}: {err}"
        );
    }
}

/// One iteration selected from a single-GPU DDP trace keeps the trace's process groups (its
/// `## process_group:init ##` record, outside every iteration): its all-reduces still run as
/// the identity of a one-rank group, where without the record they need peers and fail. The
/// compute ops that `--only comm` leaves out take no fallback in the report.
#[test]
fn an_iteration_selected_keeps_the_traces_process_groups() {
    let dir = common::scratch("select-pg");
    let sel = dir.join("it6.et.json.gz");
    let s = bin()
        .arg("select")
        .arg(shared("public/param_resnet_1.1.0.et.json.gz"))
        .args(["--iteration", "6", "-o"])
        .arg(&sel)
        .status()
        .unwrap();
    assert!(s.success());
    let i = json(&["inspect".as_ref(), sel.as_os_str(), "--json".as_ref()]);
    assert_eq!(i["process_groups"].as_array().map(Vec::len), Some(1), "{i}");
    let r = common::json(
        bin()
            .arg("replay")
            .arg(&sel)
            .args(["--json", "--only", "comm", "--iters", "1", "--warmup", "0"]),
    );
    assert_eq!(r["ops_failed"], 0, "{}", r["failures"]);
    assert!(r["ops_selected"].as_u64().unwrap() > 0, "{r}");
    let fallbacks = r["fallbacks"].as_array().unwrap();
    assert!(
        fallbacks
            .iter()
            .all(|f| f["ran_as"].as_str().unwrap().contains("identity")),
        "{fallbacks:?}"
    );
}

/// `graph --iteration N` describes the tensors of that iteration as `graph` of the iteration
/// selected into a file of its own does: tensors the other iterations also wrote (DDP's
/// persistent buckets) or read (the weights) are not inputs of their own there.
#[test]
fn an_iterations_tensors_are_those_of_the_iteration_selected() {
    let dir = common::scratch("graph-iteration");
    let trace = shared("public/param_resnet_1.1.0.et.json.gz");
    for it in ["6", "7"] {
        let sel = dir.join(format!("it{it}.et.json.gz"));
        let s = bin()
            .arg("select")
            .arg(&trace)
            .args(["--iteration", it, "-o"])
            .arg(&sel)
            .status()
            .unwrap();
        assert!(s.success());
        let within = json(&[
            "graph".as_ref(),
            trace.as_os_str(),
            "--json".as_ref(),
            "--iteration".as_ref(),
            it.as_ref(),
        ]);
        let alone = json(&["graph".as_ref(), sel.as_os_str(), "--json".as_ref()]);
        assert_eq!(within["replay_set"]["ops"], alone["replay_set"]["ops"]);
        assert_eq!(within["tensors"], alone["tensors"], "iteration {it}");
    }
}
