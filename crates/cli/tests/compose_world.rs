//! `mystique compose world`: a captured job written at another world size, checked against
//! captures made at that size. `tests/data/dist_mlp_w4` and `dist_mlp_w8` are the shared 2-rank
//! DDP job (`../shared/tools/gen_dist_traces.py DIR N mlp`) captured at 4 and 8 ranks.

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
    let d = std::env::temp_dir().join(format!("mystique-world-{name}-{}", std::process::id()));
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

/// A job with a subgroup is refused, naming the group (which group each collective runs on is
/// not in the trace); so is a world smaller than the capture's.
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
