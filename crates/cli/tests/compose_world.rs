//! `mystique compose world`: a captured job written at another world size, checked against
//! captures made at that size. `tests/data/dist_mlp_w4` and `dist_mlp_w8` are the shared 2-rank
//! DDP job (`../shared/tools/gen_dist_traces.py DIR N mlp`) captured at 4 and 8 ranks;
//! `tpdp_w4` and `tpdp_w8` a tensor- x data-parallel MLP block on a ("dp", "tp") device mesh
//! with 2 tensor-parallel ranks (`xtask/scripts/tp_dp.py DIR N 2`) at 2 and 4 data-parallel
//! ranks.

mod common;
use common::{bin, json, shared};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn scratch(name: &str) -> PathBuf {
    let d = common::scratch(&format!("world-{name}"));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn two_ranks() -> String {
    shared("cpu")
        .join("dist_mlp_w2.rank*.et.json")
        .display()
        .to_string()
}

/// `compose world TRACES --world N -o OUT --json`.
fn world(traces: &str, n: usize, out: &Path, extra: &[&str]) -> serde_json::Value {
    json(
        bin()
            .args(["compose", "world", traces, "--world", &n.to_string(), "-o"])
            .arg(out)
            .arg("--json")
            .args(extra),
    )
}

/// One rank's trace: its nodes by name (every op and annotation, as `inspect` counts them),
/// and per collective op its calls and the bytes of its tensor arguments.
fn profile(path: &Path) -> (BTreeMap<String, usize>, BTreeMap<String, (usize, u64)>) {
    let t = mystique_cli::read_trace(path).unwrap();
    let mut ops = BTreeMap::new();
    let mut colls: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    for n in &t.nodes {
        *ops.entry(t.name(n).to_string()).or_default() += 1;
        if t.name(n).starts_with("c10d::") {
            let bytes: u64 = t.inputs(n).iter().map(|a| tensor_bytes(&t, a.value)).sum();
            let e = colls.entry(t.name(n).to_string()).or_default();
            e.0 += 1;
            e.1 += bytes;
        }
    }
    (ops, colls)
}

fn tensor_bytes(t: &et_schema::Trace, v: et_schema::Value) -> u64 {
    match v {
        et_schema::Value::Tensor(k) => {
            let x = &t.tensors[k as usize];
            x.numel * x.itemsize
        }
        et_schema::Value::List { start, len } => (start..start + len)
            .map(|k| tensor_bytes(t, t.items[k as usize]))
            .sum(),
        _ => 0,
    }
}

/// Synthesised from the 2-rank capture, the job at 4 and at 8 ranks has on every rank the
/// ops of the capture made at that size, by name and count (the per-rank output buffers of
/// its all-gather and the backend's copies into them included), and its collectives by op
/// with the same bytes; its process groups say the new size.
#[test]
fn synthesised_ranks_hold_what_a_capture_at_that_size_holds() {
    for n in [4usize, 8] {
        let out = scratch(&format!("w{n}"));
        let j = world(&two_ranks(), n, &out, &[]);
        assert_eq!(j["world"], n);
        assert_eq!(j["captured"], 2);
        let real = data(&format!("dist_mlp_w{n}"));
        for r in 0..n {
            let made = out.join(format!("world{n}.rank{r}.et.json.gz"));
            let captured = real.join(format!("dist_mlp_w{n}.rank{r}.et.json.gz"));
            let (ops, colls) = profile(&made);
            let (ops_real, colls_real) = profile(&captured);
            assert_eq!(ops, ops_real, "world {n}, rank {r}: ops by name");
            assert_eq!(
                colls, colls_real,
                "world {n}, rank {r}: collectives and bytes"
            );
            let t = mystique_cli::read_trace(&made).unwrap();
            let groups = replay::plan::process_groups(&t);
            assert_eq!(groups[0].size, n as i64, "world {n}, rank {r}");
        }
        let _ = std::fs::remove_dir_all(&out);
    }
}

/// The synthesised job is a captured job to every other command: at 4 ranks it replays with
/// every op on every rank, and the 4-rank job with every collective kind, at 8 ranks, runs
/// its communication with every result verified.
#[test]
fn a_synthesised_job_replays_on_every_rank() {
    let out = scratch("replay4");
    world(&two_ranks(), 4, &out, &[]);
    let j = json(bin().args(["replay", "--ranks"]).arg(&out).args([
        "--json",
        "--threads",
        "1",
        "--iters",
        "1",
        "--warmup",
        "0",
    ]));
    assert_eq!(j["world_size"], 4);
    for (k, r) in j["ranks"].as_array().unwrap().iter().enumerate() {
        assert_eq!(r["ops_failed"], 0, "rank {k}: {}", r["failures"]);
        assert_eq!(r["ops_replayed"], r["ops_selected"], "rank {k}");
    }
    // Replayed on 2 of its 4 ranks, its collectives' sizes are the 2-rank capture's (an
    // all-gather's message is its whole output list, which shrinks with the world).
    let comm = |ranks: &str, extra: &[&str]| {
        json(
            bin()
                .args(["replay", "--ranks", ranks, "--json", "--only", "comm"])
                .args(["--threads", "1", "--iters", "1", "--warmup", "0"])
                .args(extra),
        )["collectives"]
            .clone()
    };
    let (shrunk, captured) = (
        comm(out.to_str().unwrap(), &["--world", "2"]),
        comm(&two_ranks(), &[]),
    );
    for kind in ["all_gather", "all_reduce", "broadcast"] {
        for field in ["bytes", "size_bytes"] {
            assert_eq!(
                shrunk[kind][field], captured[kind][field],
                "{kind} {field}: {shrunk} vs {captured}"
            );
        }
    }
    let every = scratch("every8");
    let s = world(&data("every_w4").display().to_string(), 8, &every, &[]);
    for kind in [
        "allgather",
        "alltoall_base",
        "gather",
        "scatter",
        "send",
        "recv",
    ] {
        assert!(
            s["collectives"][kind]["calls"].as_u64().unwrap() > 0,
            "{kind}: {s}"
        );
    }
    let j = json(
        bin()
            .args(["replay", "--ranks"])
            .arg(&every)
            .args(["--json", "--threads", "1", "--iters", "1", "--warmup", "0"])
            .args(["--only", "comm", "--check-collectives"]),
    );
    assert_eq!(j["world_size"], 8);
    for (k, r) in j["ranks"].as_array().unwrap().iter().enumerate() {
        assert_eq!(r["ops_failed"], 0, "rank {k}: {}", r["failures"]);
        assert!(
            r["check"]["checked"].as_u64().unwrap() >= 13,
            "rank {k}: {}",
            r["check"]
        );
    }
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_dir_all(&every);
}

/// One rank's collectives by op and by the group they ran on (its description and global
/// ranks, from the rank's process group record and each collective's `pg_name`): calls and
/// tensor bytes; and the groups the rank recorded, by description and ranks.
#[allow(clippy::type_complexity)]
fn by_group(
    path: &Path,
) -> (
    BTreeMap<(String, String, Vec<i64>), (usize, u64)>,
    Vec<(String, Vec<i64>)>,
) {
    let t = mystique_cli::read_trace(path).unwrap();
    let records = et_graph::world::process_group_records(&t).unwrap_or_default();
    let mut groups: Vec<(String, Vec<i64>)> = records
        .iter()
        .map(|g| (g.pg_desc.clone(), g.ranks.clone()))
        .collect();
    groups.sort();
    let mut colls: BTreeMap<(String, String, Vec<i64>), (usize, u64)> = BTreeMap::new();
    for n in &t.nodes {
        if !t.name(n).starts_with("c10d::") {
            continue;
        }
        let pg = t
            .extras(n)
            .iter()
            .find(|e| t.str(e.name) == "pg_name")
            .and_then(|e| match e.value {
                et_schema::Value::Str(s) => Some(t.str(s).to_string()),
                _ => None,
            })
            .expect("every collective names its group");
        let g = records.iter().find(|g| g.pg_name == pg).unwrap_or_else(|| {
            panic!(
                "{}: group {pg:?} is not in the rank's record",
                path.display()
            )
        });
        let bytes: u64 = t.inputs(n).iter().map(|a| tensor_bytes(&t, a.value)).sum();
        let e = colls
            .entry((t.name(n).to_string(), g.pg_desc.clone(), g.ranks.clone()))
            .or_default();
        e.0 += 1;
        e.1 += bytes;
    }
    (colls, groups)
}

/// A tensor- x data-parallel job grows its data-parallel dimension: synthesised from the 2 x 2
/// capture, the 4 x 2 job has on every rank the ops of the capture made at 8 ranks, its
/// process groups (the "dp" groups grown to 4 ranks, twice as many "tp" groups of 2), and each
/// collective on the same group with the same bytes; and it replays on 8 ranks with every op
/// and every collective's result checked.
#[test]
fn a_tensor_and_data_parallel_job_grows_its_data_parallel_groups() {
    let out = scratch("tpdp8");
    let j = world(&data("tpdp_w4").display().to_string(), 8, &out, &[]);
    let groups = j["groups"].as_array().unwrap();
    let family = |desc: &str| {
        groups
            .iter()
            .find(|g| g["desc"] == desc)
            .unwrap_or_else(|| panic!("{desc}: {j}"))
    };
    let dp = family("mesh_dp");
    assert_eq!(dp["data_parallel"], true);
    assert_eq!(
        (dp["groups_before"].as_u64(), dp["size_before"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(
        (dp["groups_after"].as_u64(), dp["size_after"].as_u64()),
        (Some(2), Some(4))
    );
    let tp = family("mesh_tp");
    assert_eq!(tp["data_parallel"], false);
    assert_eq!(
        (tp["groups_after"].as_u64(), tp["size_after"].as_u64()),
        (Some(4), Some(2))
    );
    let real = data("tpdp_w8");
    for r in 0..8 {
        let made = out.join(format!("world8.rank{r}.et.json.gz"));
        let captured = real.join(format!("tpdp_w8.rank{r}.et.json.gz"));
        assert_eq!(
            profile(&made).0,
            profile(&captured).0,
            "rank {r}: ops by name"
        );
        let (colls, groups) = by_group(&made);
        let (colls_real, groups_real) = by_group(&captured);
        assert_eq!(groups, groups_real, "rank {r}: its process groups");
        assert_eq!(
            colls, colls_real,
            "rank {r}: collectives by group, and bytes"
        );
    }
    let j = json(bin().args(["replay", "--ranks"]).arg(&out).args([
        "--json",
        "--threads",
        "1",
        "--iters",
        "1",
        "--warmup",
        "0",
        "--check-collectives",
    ]));
    assert_eq!(j["world_size"], 8);
    for (k, r) in j["ranks"].as_array().unwrap().iter().enumerate() {
        assert_eq!(r["ops_failed"], 0, "rank {k}: {}", r["failures"]);
        assert_eq!(r["ops_replayed"], r["ops_selected"], "rank {k}");
        assert_eq!(r["check"]["checked"], 5, "rank {k}: {}", r["check"]);
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// `tests/data/tpdp_w4` rewritten into `dir` by `edit` (each rank's ET as JSON).
fn edited_tpdp(dir: &Path, edit: impl Fn(&mut serde_json::Value)) {
    use std::io::Read;
    std::fs::create_dir_all(dir).unwrap();
    for r in 0..4 {
        let path = data("tpdp_w4").join(format!("tpdp_w4.rank{r}.et.json.gz"));
        let mut text = String::new();
        flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
            .read_to_string(&mut text)
            .unwrap();
        let mut t: serde_json::Value = serde_json::from_str(&text).unwrap();
        edit(&mut t);
        std::fs::write(
            dir.join(format!("job.rank{r}.et.json")),
            serde_json::to_vec(&t).unwrap(),
        )
        .unwrap();
    }
}

fn refusal(dir: &Path, world: usize, extra: &[&str]) -> String {
    let o = bin()
        .args(["compose", "world"])
        .arg(dir)
        .args(["--world", &world.to_string(), "-o"])
        .arg(dir.join("out"))
        .args(extra)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "{err}");
    assert!(!dir.join("out").exists(), "nothing is written: {err}");
    err
}

/// A job with subgroups is refused where it cannot be told how it scales: collectives that
/// do not name their group (as Gloo records them), groups whose descriptions do not say which
/// are data parallel (until --data-parallel names them), a world that is not whole replicas
/// of the tensor-parallel groups.
#[test]
fn a_model_parallel_job_is_refused_where_its_layout_is_not_recorded() {
    let dir = scratch("unnamed");
    edited_tpdp(&dir, |t| {
        for n in t["nodes"].as_array_mut().unwrap() {
            if let Some(a) = n["attrs"].as_array_mut() {
                a.retain(|x| x["name"] != "pg_name");
            }
        }
    });
    let err = refusal(&dir, 8, &[]);
    assert!(
        err.contains("c10d::allreduce_") && err.contains("pg_name"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);

    let dir = scratch("undescribed");
    edited_tpdp(&dir, |t| {
        for n in t["nodes"].as_array_mut().unwrap() {
            if n["name"] == "## process_group:init ##" {
                let v = n["inputs"]["values"][0].as_str().unwrap();
                let v = v.replace("mesh_dp", "mesh_a").replace("mesh_tp", "mesh_b");
                n["inputs"]["values"][0] = serde_json::json!(v);
            }
        }
    });
    let err = refusal(&dir, 8, &[]);
    assert!(
        err.contains("--data-parallel") && err.contains("mesh_a"),
        "{err}"
    );
    let err = refusal(&dir, 7, &["--data-parallel", "mesh_a"]);
    assert!(err.contains("multiple of 2"), "{err}");
    let out = dir.join("named");
    let j = world(
        &dir.display().to_string(),
        8,
        &out,
        &["--data-parallel", "mesh_a"],
    );
    assert_eq!(j["world"], 8);
    assert!(out.join("world8.rank7.et.json.gz").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A job whose group does not tile the world is refused, naming the group; so is a world
/// smaller than the capture's.
#[test]
fn a_job_that_cannot_be_scaled_is_refused_by_name() {
    let dir = scratch("odd");
    std::fs::create_dir_all(&dir).unwrap();
    for r in 0..2 {
        let path = shared("cpu").join(format!("dist_mlp_w2.rank{r}.et.json"));
        let mut t: serde_json::Value =
            serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        for n in t["nodes"].as_array_mut().unwrap() {
            if n["name"] == "## process_group:init ##" {
                let groups = "[{\"pg_name\": \"0\", \"pg_desc\": \"default_pg\", \"ranks\": [], \
                    \"group_size\": 2}, {\"pg_name\": \"solo\", \"pg_desc\": \"odd\", \
                    \"ranks\": [1], \"group_size\": 1}]";
                n["inputs"]["values"][0] = serde_json::json!(groups);
            }
        }
        std::fs::write(
            dir.join(format!("job.rank{r}.et.json")),
            serde_json::to_vec(&t).unwrap(),
        )
        .unwrap();
    }
    let o = bin()
        .args(["compose", "world"])
        .arg(&dir)
        .args(["--world", "4", "-o"])
        .arg(dir.join("out"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("\"solo\"") && err.contains("[1]"), "{err}");
    assert!(!dir.join("out").exists(), "nothing is written");
    // A smaller world: its parts and buffers would have to go, not be made.
    let o = bin()
        .args(["compose", "world", &two_ranks(), "--world", "1", "-o"])
        .arg(dir.join("one"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("larger worlds"),
        "{err}"
    );
    // A job without subgroups has no family for --data-parallel to name.
    let o = bin()
        .args(["compose", "world", &two_ranks(), "--world", "4"])
        .args(["--data-parallel", "nope", "-o"])
        .arg(dir.join("dp"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("has no subgroups"),
        "{err}"
    );
    // Two single-process traces are no job: nothing records how it scales.
    let single = scratch("single");
    std::fs::create_dir_all(&single).unwrap();
    std::fs::copy(shared("cpu/mlp.et.json"), single.join("a.rank0.et.json")).unwrap();
    std::fs::copy(shared("cpu/dlrm.et.json"), single.join("a.rank1.et.json")).unwrap();
    let err = refusal(&single, 4, &[]);
    assert!(
        err.contains("record no collective and no process group"),
        "{err}"
    );
    // The same as files, or a directory, whose names tell no rank: that, not their order, is
    // refused.
    let unnamed = scratch("unnamed");
    std::fs::create_dir_all(&unnamed).unwrap();
    std::fs::copy(shared("cpu/mlp.et.json"), unnamed.join("mlp.et.json")).unwrap();
    std::fs::copy(shared("cpu/cnn.et.json.gz"), unnamed.join("cnn.et.json.gz")).unwrap();
    for inputs in [
        vec![unnamed.join("mlp.et.json"), unnamed.join("cnn.et.json.gz")],
        vec![unnamed.clone()],
    ] {
        let o = bin()
            .args(["compose", "world"])
            .args(&inputs)
            .args(["--world", "4", "-o"])
            .arg(dir.join("unnamed-out"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && err.contains("record no collective and no process group"),
            "{inputs:?}: {err}"
        );
    }
    let _ = std::fs::remove_dir_all(&unnamed);
    let _ = std::fs::remove_dir_all(&single);
    let _ = std::fs::remove_dir_all(&dir);
}

/// From a 2-rank capture (`tests/data/tp_w2`: `xtask/scripts/tp_allreduce.py DIR 2 4 1`, four
/// 1 MiB fp16 all-reduces), 1,024 ranks of Chakra traces for ASTRA-sim: a sample of ranks
/// decodes with the Chakra schema, each with the job's four all-reduces of 1 MiB. (The DDP
/// job's all-gather takes one buffer per rank: its 1,024 ranks write 1.4 GB, which `cargo xtask
/// bench world` measures instead.)
#[test]
fn a_thousand_rank_chakra_job_from_two_captured_ranks_decodes() {
    let out = scratch("chakra1024");
    let j = world(
        &data("tp_w2").display().to_string(),
        1024,
        &out,
        &["--chakra", "--astra-sim"],
    );
    assert_eq!(j["what"], "chakra");
    assert_eq!(j["captured"], 2);
    let files = std::fs::read_dir(&out).unwrap().count();
    assert_eq!(files, 1024);
    for r in [0usize, 1, 511, 1023] {
        let bytes = std::fs::read(out.join(format!("world1024.{r}.et"))).unwrap();
        let (meta, nodes) = mystique_cli::chakra::decode(&bytes).unwrap();
        assert!(!meta.version.is_empty(), "rank {r}");
        let comm: Vec<_> = nodes
            .iter()
            .filter(|n| n.name == "c10d::allreduce_")
            .collect();
        assert_eq!(comm.len(), 4, "rank {r}: the job's four all-reduces");
        for c in comm {
            let size = c
                .attr
                .iter()
                .find(|a| a.name == "comm_size")
                .and_then(|a| match a.value {
                    Some(mystique_cli::chakra::proto::AttrValue::Int64Val(v)) => Some(v),
                    _ => None,
                })
                .expect("its comm_size");
            assert_eq!(size, 1 << 20, "rank {r}");
        }
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// The `record_param_comms` records of schemas that keep them in their inputs (1.0.x: tensors,
/// sequence, group, rank, name, in and out splits, and from 1.0.2 the group's size) follow the
/// new world as the attributes of later schemas do: the DLRM's all-to-all records at 16 ranks
/// split over 16, its element types and shapes listed 16 times, its tensor its all-to-all's
/// as resized; a 1.0.2 all-gather record at 4 ranks records a group of 4.
#[test]
fn records_in_old_schemas_follow_the_new_world() {
    let out = scratch("dlrm16");
    world(
        &shared("public/param_dlrm_8rank_1.0.1")
            .display()
            .to_string(),
        16,
        &out,
        &[],
    );
    let rank0: serde_json::Value = serde_json::from_reader(flate2::read::GzDecoder::new(
        std::fs::File::open(out.join("world16.rank0.et.json.gz")).unwrap(),
    ))
    .unwrap();
    let nodes = rank0["nodes"].as_array().unwrap();
    let by_id: BTreeMap<u64, &serde_json::Value> = nodes
        .iter()
        .map(|n| (n["id"].as_u64().unwrap(), n))
        .collect();
    let mut splits = 0;
    for n in nodes {
        let v = &n["inputs"];
        if n["name"] != "record_param_comms" || v[4] != "all_to_allv" {
            continue;
        }
        // Its tensor is its all-to-all's, resized with it.
        let parent = by_id[&n["parent"].as_u64().unwrap()];
        assert!(
            parent["inputs"].as_array().unwrap().contains(&v[0])
                && parent["input_shapes"]
                    .as_array()
                    .unwrap()
                    .contains(&n["input_shapes"][0]),
            "{n} in {parent}"
        );
        for k in [5, 6] {
            assert_eq!(v[k].as_array().unwrap().len(), 16, "{v}");
            assert_eq!(n["input_shapes"][k].as_array().unwrap().len(), 16, "{n}");
            assert_eq!(
                n["input_types"][k].as_str().unwrap().matches("Int").count(),
                16
            );
        }
        splits += 1;
    }
    assert!(splits > 0);
    let _ = std::fs::remove_dir_all(&out);
    let ag = scratch("ag");
    std::fs::create_dir_all(&ag).unwrap();
    for r in 0..2 {
        std::fs::copy(
            shared("public/chakra_allgather_1.0.2.et.json"),
            ag.join(format!("ag.rank{r}.et.json")),
        )
        .unwrap();
    }
    let out = scratch("ag4");
    world(ag.to_str().unwrap(), 4, &out, &[]);
    let name = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().contains("rank0"))
        .unwrap();
    let bytes = std::fs::read(&name).unwrap();
    let text = if bytes.starts_with(b"\x1f\x8b") {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut s)
            .unwrap();
        s
    } else {
        String::from_utf8(bytes).unwrap()
    };
    let t: serde_json::Value = serde_json::from_str(&text).unwrap();
    let rec = t["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "record_param_comms" && n["inputs"]["values"][4] == "all_gather")
        .unwrap();
    assert_eq!(rec["inputs"]["values"][7], 4, "{rec}");
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_dir_all(&ag);
}

/// `compose world` and `generate` write a directory: `-o -`, an existing file and a directory
/// with files in it are refused, each by what it is, and nothing is written.
#[test]
fn directory_outputs_refuse_stdout_and_files() {
    let dir = scratch("dir-outputs");
    std::fs::create_dir_all(dir.join("full")).unwrap();
    std::fs::write(dir.join("full/x"), b"x").unwrap();
    std::fs::write(dir.join("file"), b"x").unwrap();
    for (out, says) in [
        ("-", "writes a directory of files"),
        ("file", "is a file"),
        ("full", "exists and is not an empty directory"),
    ] {
        let target = if out == "-" {
            PathBuf::from("-")
        } else {
            dir.join(out)
        };
        for cmd in [
            vec![
                "compose".to_string(),
                "world".into(),
                two_ranks(),
                "--world".into(),
                "4".into(),
            ],
            vec![
                "generate".to_string(),
                shared("cpu/mlp.et.json").display().to_string(),
            ],
        ] {
            let o = bin().args(&cmd).arg("-o").arg(&target).output().unwrap();
            assert_eq!(o.status.code(), Some(2), "{cmd:?} -o {out}");
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(err.contains(says), "{cmd:?} -o {out}: {err}");
        }
    }
    assert!(!PathBuf::from("-").exists());
    let _ = std::fs::remove_dir_all(&dir);
}
