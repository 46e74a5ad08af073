//! The real `mystique` binary on the real shared traces.

mod common;
use common::{bin, json, shared};
use std::path::PathBuf;
use std::process::Command;

fn dom(p: &std::path::Path) -> serde_json::Value {
    let bytes = std::fs::read(p).unwrap();
    let text = if bytes.starts_with(&[0x1f, 0x8b]) {
        let out = Command::new("gzip").arg("-dc").arg(p).output().unwrap();
        out.stdout
    } else {
        bytes
    };
    serde_json::from_slice(&text).unwrap()
}

fn et_files() -> Vec<PathBuf> {
    let mut v = vec![];
    for d in [
        shared("cpu"),
        shared("public"),
        shared("public/param_dlrm_8rank_1.0.1"),
    ] {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.to_string_lossy().contains(".et.json") {
                v.push(p);
            }
        }
    }
    assert!(v.len() >= 20);
    v
}

#[test]
fn inspect_json_counts_match_an_independent_count() {
    for p in et_files() {
        let j = json(bin().arg("inspect").arg(&p).arg("--json"));
        let d = dom(&p);
        let nodes = d["nodes"].as_array().unwrap();
        assert_eq!(j["nodes"].as_u64().unwrap() as usize, nodes.len());
        assert_eq!(j["schema"], d["schema"]);
        let mut want = std::collections::HashMap::<String, u64>::new();
        for n in nodes {
            *want.entry(n["name"].as_str().unwrap().into()).or_default() += 1;
        }
        let got: std::collections::HashMap<String, u64> = j["ops"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
            .collect();
        assert_eq!(got, want, "{}", p.display());
        // Devices: every device string of a tensor tuple (6 fields, storage != 0).
        let mut devs = std::collections::BTreeSet::new();
        fn walk(v: &serde_json::Value, devs: &mut std::collections::BTreeSet<String>) {
            if let Some(a) = v.as_array() {
                if a.len() == 6 && a[..5].iter().all(|x| x.is_u64()) && a[5].is_string() {
                    if a[1].as_u64() != Some(0) && a[5] != "" {
                        devs.insert(a[5].as_str().unwrap().to_string());
                    }
                } else {
                    a.iter().for_each(|x| walk(x, devs));
                }
            }
        }
        for n in nodes {
            for io in ["inputs", "outputs"] {
                let vals = if n[io].is_array() {
                    &n[io]
                } else {
                    &n[io]["values"]
                };
                walk(vals, &mut devs);
            }
        }
        let got: std::collections::BTreeSet<String> = j["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_str().unwrap().to_string())
            .collect();
        assert_eq!(got, devs, "{}", p.display());
    }
}

#[test]
fn inspect_counts_the_six_gloo_collectives() {
    let j = json(
        bin()
            .arg("inspect")
            .arg(shared("cpu/dist_mlp_w2.rank0.et.json"))
            .arg("--json"),
    );
    let total: u64 = j["collectives"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(total, 6, "{}", j["collectives"]);
    assert_eq!(j["process_groups"].as_array().unwrap().len(), 1);
}

#[test]
fn inspect_reads_stdin_and_prints_a_table() {
    let p = shared("cpu/mlp.et.json");
    let out = bin()
        .arg("inspect")
        .arg("-")
        .stdin(std::fs::File::open(&p).unwrap())
        .output()
        .unwrap();
    assert!(out.status.success());
    let s = String::from_utf8(out.stdout).unwrap();
    assert!(s.contains("schema     1.1.1-chakra.0.0.4"), "{s}");
    assert!(s.contains("nodes      163"), "{s}");
}

#[test]
fn bad_input_exits_2_with_the_file_and_place() {
    let dir = common::scratch("bad");
    let full = std::fs::read(shared("cpu/mlp.et.json")).unwrap();
    let cut = dir.join("cut.json");
    std::fs::write(&cut, &full[..full.len() / 2]).unwrap();
    let garbage = dir.join("garbage.json");
    std::fs::write(&garbage, b"not json at all").unwrap();
    for (p, needle) in [
        (&cut, "truncated"),
        (&garbage, "not JSON at byte 0"),
        (&dir.join("missing.json"), "No such file"),
    ] {
        let out = bin().arg("inspect").arg(p).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{}", p.display());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(needle) && err.contains(&*p.file_name().unwrap().to_string_lossy()),
            "{err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `mystique` never loads libtorch for commands that do not replay (it starts in milliseconds
/// and a few MB); `replay`, `compare` and `env` run in `mystique-replay`, which it execs.
/// The dynamic loader's own log (glibc `LD_DEBUG=files`) says what each process loaded.
#[test]
fn commands_that_do_not_replay_never_load_libtorch() {
    let loaded = |args: &[&str]| {
        let out = bin().args(args).env("LD_DEBUG", "files").output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let mlp = shared("cpu/mlp.et.json");
    let mlp = mlp.to_str().unwrap();
    for args in [
        vec!["inspect", mlp],
        vec!["graph", mlp],
        vec!["--help"],
        vec!["--version"],
    ] {
        let log = loaded(&args);
        assert!(log.contains("libc.so"), "the loader logs here: {log}");
        assert!(!log.contains("libtorch"), "{args:?} loaded libtorch");
    }
    // The replay commands do load it, through mystique-replay: same command line, one command.
    let log = loaded(&["env"]);
    assert!(log.contains("libtorch_cpu"), "env runs in mystique-replay");
}
