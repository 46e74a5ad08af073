//! Benchmark packages: generate, run, diff; anonymisation; refusal of tampered packages.

mod common;
use common::{bin, json, shared};
use std::path::{Path, PathBuf};

fn tmp(name: &str) -> PathBuf {
    let d = common::scratch("package");
    let p = d.join(name);
    let _ = std::fs::remove_dir_all(&p);
    let _ = std::fs::remove_file(&p);
    p
}

/// `generate TRACES EXTRA -o OUT`, which must succeed; its notes and warnings (stderr).
fn generate(traces: &[PathBuf], out: &Path, extra: &[&str]) -> String {
    let o = bin()
        .arg("generate")
        .args(traces)
        .args(extra)
        .arg("-o")
        .arg(out)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{err}");
    err
}

fn run(pkg: &Path, result: &Path) -> serde_json::Value {
    json(
        bin()
            .arg("run")
            .arg(pkg)
            .args([
                "--json",
                "--iters",
                "2",
                "--warmup",
                "1",
                "--threads",
                "1",
                "-o",
            ])
            .arg(result),
    )
}

/// A package from each shared CPU trace runs completely, twice, and the two results diff op
/// signature by op signature.
#[test]
fn packages_of_every_shared_cpu_trace_run_and_diff() {
    for m in [
        "mlp.et.json",
        "cnn.et.json.gz",
        "transformer.et.json.gz",
        "dlrm.et.json",
    ] {
        let pkg = tmp(&format!("{m}.pkg"));
        generate(&[shared(&format!("cpu/{m}"))], &pkg, &[]);
        let (ra, rb) = (tmp(&format!("{m}.a.json")), tmp(&format!("{m}.b.json")));
        let a = run(&pkg, &ra);
        run(&pkg, &rb);
        assert_eq!(a["format"], "mystique-result/1");
        let r0 = &a["ranks"][0];
        assert_eq!(
            r0["report"]["ops_failed"], 0,
            "{m}: {}",
            r0["report"]["failures"]
        );
        assert!(r0["signatures"].as_array().unwrap().len() > 5, "{m}");
        assert_eq!(r0["iterations_ms"].as_array().unwrap().len(), 2);
        let d = json(bin().arg("diff").arg(&ra).arg(&rb).arg("--json"));
        let ops = d["ops"].as_array().unwrap();
        assert_eq!(ops.len(), r0["signatures"].as_array().unwrap().len(), "{m}");
        for o in ops {
            let r = o["ratio"].as_f64().unwrap();
            assert!(r.is_finite() && r > 0.0, "{m}: {o}");
        }
        // Largest regression first.
        let deltas: Vec<f64> = ops
            .iter()
            .map(|o| o["delta_ms"].as_f64().unwrap())
            .collect();
        assert!(deltas.windows(2).all(|w| w[0] >= w[1]), "{m}: {deltas:?}");
        assert!(d["iteration"]["ratio"].as_f64().unwrap() > 0.0);
        if m == "mlp.et.json" {
            diff_text_and_plots(&ra, &rb, &d);
            // A manifest or another JSON file in place of a result is named for what it is; a
            // result edited to hold no iteration is not one a run wrote.
            let emptied = tmp("emptied.result.json");
            let mut e: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&ra).unwrap()).unwrap();
            e["ranks"][0]["iterations_ms"] = serde_json::json!([]);
            std::fs::write(&emptied, e.to_string()).unwrap();
            for (other, says) in [
                (pkg.join("manifest.json"), "is a package's manifest"),
                (
                    shared("cpu/mlp.meta.json"),
                    "is not a result of `mystique run`",
                ),
                (emptied, "rank 0's iterations_ms is []"),
            ] {
                let o = bin().arg("diff").arg(&ra).arg(&other).output().unwrap();
                assert_eq!(o.status.code(), Some(2));
                let err = String::from_utf8_lossy(&o.stderr);
                assert!(
                    err.contains(says) && !err.contains("missing field"),
                    "{err}"
                );
            }
        }
    }
}

/// diff's text lists slower ops apart from faster ones, and its plot draws as SVG and PNG.
fn diff_text_and_plots(ra: &Path, rb: &Path, d: &serde_json::Value) {
    let (svg, png) = (tmp("diff.svg"), tmp("diff.png"));
    let out = bin()
        .arg("diff")
        .arg(ra)
        .arg(rb)
        .arg("--svg")
        .arg(&svg)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    // Each section holds only the ops that moved its way.
    let ops = d["ops"].as_array().unwrap();
    let slower = ops
        .iter()
        .filter(|o| o["delta_ms"].as_f64().unwrap() > 0.0)
        .count();
    let faster = ops
        .iter()
        .filter(|o| o["delta_ms"].as_f64().unwrap() < 0.0)
        .count();
    let section = |title: &str| {
        text.split(title)
            .nth(1)
            .map(|rest| {
                rest.lines()
                    .skip(2)
                    .take_while(|l| l.starts_with("  "))
                    .map(|l| {
                        let f: Vec<f64> = l
                            .split_whitespace()
                            .take(2)
                            .map(|x| x.parse().unwrap())
                            .collect();
                        f[1] - f[0]
                    })
                    .collect::<Vec<f64>>()
            })
            .unwrap_or_default()
    };
    let (s, f) = (section("slower in B"), section("faster in B"));
    assert_eq!(s.len(), slower.min(15), "{text}");
    assert_eq!(f.len(), faster.min(10), "{text}");
    // Printed to 3 decimals: a row may read as equal, never the other way.
    assert!(
        s.iter().all(|d| *d >= 0.0) && f.iter().all(|d| *d <= 0.0),
        "{text}"
    );
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(
        plot.starts_with("<svg") && plot.contains("B / A (log scale)"),
        "{plot}"
    );
    assert!(!plot.contains("0.0 / 0.0"), "values in one unit");
    let out = bin()
        .arg("diff")
        .arg(ra)
        .arg(rb)
        .arg("--svg")
        .arg(&png)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let b = std::fs::read(&png).unwrap();
    assert_eq!(&b[..8], b"\x89PNG\r\n\x1a\n");
    let out = bin()
        .arg("diff")
        .arg(ra)
        .arg(rb)
        .arg("--svg")
        .arg(tmp("diff.pdf"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains(".svg or .png"));
}

/// Every file of the package, decompressed.
fn package_text(pkg: &Path) -> String {
    let mut all = String::new();
    for e in std::fs::read_dir(pkg).unwrap() {
        let p = e.unwrap().path();
        let raw = std::fs::read(&p).unwrap();
        let bytes = if raw.starts_with(&[0x1f, 0x8b]) {
            let mut v = Vec::new();
            std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&raw[..]), &mut v)
                .unwrap();
            v
        } else {
            raw
        };
        all.push_str(&String::from_utf8_lossy(&bytes));
    }
    all
}

/// `--anonymize` leaves no annotation, module or file name of the input in any file of the
/// package, compressed ones included; op names stay.
#[test]
fn anonymized_packages_hold_no_names_of_the_input() {
    for (trace, sel) in [
        (
            "public/param_resnet_1.1.0.et.json.gz",
            vec!["--iteration", "7"],
        ),
        ("cpu/transformer.et.json.gz", vec![]),
    ] {
        let pkg = tmp("anon.pkg");
        let map = tmp("anon.map.json");
        let mut extra = sel.clone();
        extra.extend(["--anonymize", "--map", map.to_str().unwrap()]);
        generate(&[shared(trace)], &pkg, &extra);
        let map: std::collections::BTreeMap<String, String> =
            serde_json::from_slice(&std::fs::read(&map).unwrap()).unwrap();
        assert!(!map.is_empty(), "{trace}: nothing was anonymised");
        let text = package_text(&pkg);
        for (name, hash) in &map {
            // Short names could occur inside others by chance; theirs hashes show they went.
            if name.len() >= 5 {
                assert!(
                    !text.contains(name.as_str()),
                    "{trace}: {name:?} is in the package"
                );
            }
            assert!(text.contains(hash.as_str()), "{trace}: {hash} for {name:?}");
        }
        assert!(text.contains("aten::"), "op names stay");
        let manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(pkg.join("manifest.json")).unwrap()).unwrap();
        assert!(manifest["anonymized"].is_object());
    }
}

/// A package is data: a path out of it, a manifest asking for a library, and a file whose
/// hash no longer matches are each refused before anything runs.
#[test]
fn tampered_packages_are_refused() {
    let good = tmp("good.pkg");
    generate(&[shared("cpu/mlp.et.json")], &good, &[]);
    let copy = |name: &str| {
        let d = tmp(name);
        std::fs::create_dir_all(&d).unwrap();
        for e in std::fs::read_dir(&good).unwrap() {
            let p = e.unwrap().path();
            std::fs::copy(&p, d.join(p.file_name().unwrap())).unwrap();
        }
        d
    };
    let edit_manifest = |d: &Path, f: &dyn Fn(&mut serde_json::Value)| {
        let p = d.join("manifest.json");
        let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        f(&mut m);
        std::fs::write(&p, serde_json::to_vec(&m).unwrap()).unwrap();
    };
    let refused = |d: &Path, what: &str| {
        let o = bin()
            .arg("run")
            .arg(d)
            .args(["--iters", "1"])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{}", d.display());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(what), "{}: {err}", d.display());
        assert!(!err.contains("materialising"), "nothing ran: {err}");
    };
    let escape = copy("escape.pkg");
    edit_manifest(&escape, &|m| {
        let plan = m["ranks"][0]["plan"].as_str().unwrap().to_string();
        let hash = m["files"][&plan].clone();
        m["ranks"][0]["plan"] = "../../etc/passwd".into();
        m["files"]["../../etc/passwd"] = hash;
    });
    refused(&escape, "not a file inside it");
    let library = copy("library.pkg");
    edit_manifest(&library, &|m| {
        m["load_library"] = serde_json::json!(["/tmp/evil.so"]);
    });
    refused(&library, "load_library");
    let tampered = copy("tampered.pkg");
    let plan = tampered.join("rank0.plan.json.gz");
    let mut bytes = std::fs::read(&plan).unwrap();
    bytes.push(0);
    std::fs::write(&plan, bytes).unwrap();
    refused(&tampered, "does not match its manifest");
}

/// A two-rank package runs both ranks together, collectives included.
#[test]
fn a_two_rank_package_runs_its_ranks_together() {
    let pkg = tmp("dist.pkg");
    generate(
        &[
            shared("cpu/dist_mlp_w2.rank1.et.json"),
            shared("cpu/dist_mlp_w2.rank0.et.json"),
        ],
        &pkg,
        &[],
    );
    let r = run(&pkg, &tmp("dist.result.json"));
    let ranks = r["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 2);
    for (k, rk) in ranks.iter().enumerate() {
        assert_eq!(rk["rank"], k);
        assert_eq!(
            rk["report"]["ops_failed"], 0,
            "{}",
            rk["report"]["failures"]
        );
        assert_eq!(rk["report"]["world_size"], 2);
        // The trace records no process group: its collectives are the world's, of 2 ranks.
        for c in rk["report"]["collective_calls"].as_array().unwrap() {
            assert_eq!(c["group_size"], 2, "{c}");
        }
    }
    // Each rank runs in a process of its own with the threads asked for, or one as
    // `replay --ranks` runs them; the result says what they ran with.
    for (extra, want) in [
        (&["--threads", "1"][..], 1),
        (&[], 1),
        (&["--threads", "2"], 2),
    ] {
        let r = json(
            bin()
                .arg("run")
                .arg(&pkg)
                .args(["--json", "--iters", "1", "--warmup", "0"])
                .args(extra)
                .arg("-o")
                .arg(tmp(&format!("dist-threads{want}.result.json")))
                .env_remove("OMP_NUM_THREADS"),
        );
        for rk in r["ranks"].as_array().unwrap() {
            assert_eq!(rk["report"]["threads"], want, "{extra:?}");
        }
        assert_eq!(r["machine"]["threads"], want, "{extra:?}");
    }
    // The diff's plot of a multi-rank job says which rank each row is, as its text does.
    let svg = tmp("dist-diff.svg");
    let d = bin()
        .arg("diff")
        .arg(common::scratch("package").join("dist-threads1.result.json"))
        .arg(common::scratch("package").join("dist-threads2.result.json"))
        .arg("--svg")
        .arg(&svg)
        .output()
        .unwrap();
    assert!(d.status.success(), "{}", String::from_utf8_lossy(&d.stderr));
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(
        plot.contains("rank 0: ") || plot.contains("rank 1: "),
        "no rank in the labels: {plot}"
    );
}

/// A job's directory whose ranks are named `rankR.*` alone (PARAM's and HTA's public sets)
/// is packaged as its ranks, Kineto traces beside them, as `replay --ranks DIR` takes it.
#[test]
fn a_job_directory_of_rank_files_is_packaged_as_its_ranks() {
    let pkg = tmp("dlrm-dir.pkg");
    generate(
        &[shared("public/param_dlrm_8rank_1.0.1")],
        &pkg,
        &["--only", "comm"],
    );
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(pkg.join("manifest.json")).unwrap()).unwrap();
    let ranks: Vec<u64> = m["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["rank"].as_u64().unwrap())
        .collect();
    assert_eq!(ranks, (0..8).collect::<Vec<u64>>());
}

/// A multi-rank package keeps each rank's original timing from its own Kineto trace, matched
/// to its rank by the rank the profile recorded (here given in the opposite order of the
/// traces, and the traces themselves out of rank order); the job's step is its slowest
/// rank's. A profile count that is not one per rank is refused.
#[test]
fn a_multi_rank_package_keeps_each_rank_s_original_timing() {
    let pkg = tmp("dist-timed.pkg");
    // The pairs without their meta files (which would give each rank's original instead):
    // each rank's original is its profile's.
    let pairs = tmp("dist-timed-pairs");
    std::fs::create_dir_all(&pairs).unwrap();
    for k in [0, 1] {
        for kind in ["linked.et", "kineto"] {
            let f = format!("dist_mlp_w2.rank{k}.{kind}.json.gz");
            std::fs::copy(shared(&format!("cpu/{f}")), pairs.join(&f)).unwrap();
        }
    }
    let et = |k: usize| pairs.join(format!("dist_mlp_w2.rank{k}.linked.et.json.gz"));
    let kineto = |k: usize| pairs.join(format!("dist_mlp_w2.rank{k}.kineto.json.gz"));
    let (k0, k1) = (kineto(0), kineto(1));
    generate(
        &[et(1), et(0)],
        &pkg,
        &[
            "--kineto",
            k0.to_str().unwrap(),
            "--kineto",
            k1.to_str().unwrap(),
        ],
    );
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(pkg.join("manifest.json")).unwrap()).unwrap();
    let ms = |k: usize| m["ranks"][k]["original"]["iter_ms"].as_f64().unwrap();
    // Each rank's own: what a single-rank package of that pair records.
    for k in [0, 1] {
        let one = tmp(&format!("dist-rank{k}.pkg"));
        generate(&[et(k)], &one, &["--kineto", kineto(k).to_str().unwrap()]);
        let m1: serde_json::Value =
            serde_json::from_slice(&std::fs::read(one.join("manifest.json")).unwrap()).unwrap();
        let original = m1["original"]["iter_ms"].as_f64().unwrap();
        assert!(
            (ms(k) - original).abs() < 1e-9,
            "rank {k}: {} vs {original}",
            ms(k)
        );
    }
    assert!(ms(0) != ms(1), "{m}");
    assert_eq!(m["original"]["iter_ms"].as_f64().unwrap(), ms(0).max(ms(1)));
    assert_eq!(m["original"]["from"], "kineto (slowest of 2 ranks)");
    let r = run(&pkg, &tmp("dist-timed.result.json"));
    assert_eq!(r["ranks"].as_array().unwrap().len(), 2);
    // One profile for two ranks: refused before anything is written.
    let o = bin()
        .arg("generate")
        .args([et(0), et(1)])
        .args(["--kineto", k0.to_str().unwrap(), "-o"])
        .arg(tmp("dist-one-profile.pkg"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("one profile per rank"));
    // Two profiles of one rank: refused naming both and the rank they record, where matching
    // them by order would link rank 0's profile to rank 1's trace.
    let o = bin()
        .arg("generate")
        .args([et(0), et(1)])
        .args([
            "--kineto",
            k0.to_str().unwrap(),
            "--kineto",
            k0.to_str().unwrap(),
            "-o",
        ])
        .arg(tmp("dist-one-rank-twice.pkg"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("both record rank 0"), "{err}");
    // The original's time is its whole step: the full package's ranks are set against it,
    // a package of its communication alone is not.
    let text = |pkg: &Path, result: &str| {
        let o = bin()
            .arg("run")
            .arg(pkg)
            .args(["--iters", "1", "--warmup", "0", "-o"])
            .arg(tmp(result))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let full = text(&pkg, "dist-timed-text.result.json");
    assert!(full.contains("; original "), "{full}");
    let comm = tmp("dist-comm.pkg");
    generate(
        &[et(0), et(1)],
        &comm,
        &[
            "--kineto",
            k0.to_str().unwrap(),
            "--kineto",
            k1.to_str().unwrap(),
            "--only",
            "comm",
        ],
    );
    let part = text(&comm, "dist-comm.result.json");
    assert!(!part.contains("; original "), "{part}");
    assert!(
        part.contains("replays a part (--only comm), so no ratio"),
        "{part}"
    );
    // One rank's meta file beside its trace, not the other's: the originals stay the
    // profiles', not a mix, and a note says why.
    std::fs::copy(
        shared("cpu/dist_mlp_w2.rank0.meta.json"),
        pairs.join("dist_mlp_w2.rank0.meta.json"),
    )
    .unwrap();
    let mixed = tmp("dist-mixed.pkg");
    let err = generate(
        &[et(0), et(1)],
        &mixed,
        &[
            "--kineto",
            k0.to_str().unwrap(),
            "--kineto",
            k1.to_str().unwrap(),
        ],
    );
    assert!(
        err.contains("1 of the 2 traces have their capture's meta file"),
        "{err}"
    );
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(mixed.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(m["original"]["from"], "kineto (slowest of 2 ranks)", "{m}");
}

/// A trace with its capture's meta file beside it packages the original as `replay` takes it:
/// the meta's uninstrumented iteration and threads, the time in ops still the profile's, and
/// `run` sets its median against that iteration. Without the meta beside it, the profile's.
#[test]
fn a_meta_file_beside_the_trace_gives_the_package_s_original() {
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(shared("cpu/mlp.meta.json")).unwrap()).unwrap();
    let median = meta["iter_ms_median"].as_f64().unwrap();
    let (et, kineto) = (
        shared("cpu/mlp.linked.et.json"),
        shared("cpu/mlp.kineto.json"),
    );
    let manifest = |pkg: &Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(pkg.join("manifest.json")).unwrap()).unwrap()
    };
    let pkg = tmp("beside-meta.pkg");
    let err = generate(
        std::slice::from_ref(&et),
        &pkg,
        &["--kineto", kineto.to_str().unwrap()],
    );
    assert!(
        err.contains("mlp.meta.json, the capture's meta file"),
        "{err}"
    );
    let m = manifest(&pkg);
    assert_eq!(m["original"]["iter_ms"].as_f64(), Some(median), "{m}");
    assert_eq!(m["original"]["from"], "mlp.meta.json (iter_ms_median)");
    assert!(m["original"]["ops_ms"].as_f64().unwrap_or(0.0) > 0.0, "{m}");
    assert_eq!(m["threads"], meta["threads"], "{m}");
    let o = bin()
        .arg("run")
        .arg(&pkg)
        .args(["--iters", "2", "--warmup", "1", "-o"])
        .arg(tmp("beside-meta.result.json"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains(&format!("; original {median:.3} ms (")),
        "{text}"
    );

    // The same pair without the meta file: the original is the profile's iteration.
    let bare = tmp("no-meta");
    std::fs::create_dir_all(&bare).unwrap();
    for f in [&et, &kineto] {
        std::fs::copy(f, bare.join(f.file_name().unwrap())).unwrap();
    }
    let pkg = tmp("no-meta.pkg");
    generate(
        &[bare.join("mlp.linked.et.json")],
        &pkg,
        &["--kineto", bare.join("mlp.kineto.json").to_str().unwrap()],
    );
    let m = manifest(&pkg);
    assert_eq!(m["original"]["from"], "kineto", "{m}");
    assert!(m["threads"].is_null(), "{m}");
    assert!(m["original"]["iter_ms"].as_f64().unwrap() != median, "{m}");

    // A gzipped meta file beside the trace counts the same, and so in the directory.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(
        &mut gz,
        &std::fs::read(shared("cpu/mlp.meta.json")).unwrap(),
    )
    .unwrap();
    std::fs::write(bare.join("mlp.meta.json.gz"), gz.finish().unwrap()).unwrap();
    let k = bare.join("mlp.kineto.json");
    for (inputs, extra) in [
        (
            vec![bare.join("mlp.linked.et.json")],
            vec!["--kineto", k.to_str().unwrap()],
        ),
        (vec![bare.clone()], vec![]),
    ] {
        let pkg = tmp("gz-meta.pkg");
        generate(&inputs, &pkg, &extra);
        let m = manifest(&pkg);
        assert_eq!(m["original"]["iter_ms"].as_f64(), Some(median), "{m}");
        assert_eq!(m["original"]["from"], "mlp.meta.json.gz (iter_ms_median)");
    }
}

/// Gaps packaged with a part of the iteration hold the time of the ops it leaves out: generate
/// says so, and how much; a whole iteration's package does not.
#[test]
fn gaps_of_a_part_of_the_iteration_are_warned_of() {
    let (et, kineto) = (
        shared("cpu/mlp.linked.et.json"),
        shared("cpu/mlp.kineto.json"),
    );
    let k = kineto.to_str().unwrap();
    let gen = |extra: &[&str], name: &str| {
        let args = [&["--kineto", k, "--emulate-gaps"], extra].concat();
        generate(std::slice::from_ref(&et), &tmp(name), &args)
    };
    let part = gen(&["--name", "aten::mm"], "part-gaps.pkg");
    assert!(
        part.contains("--emulate-gaps with a part of the iteration (5 of its 45 ops)"),
        "{part}"
    );
    let whole = gen(&[], "whole-gaps.pkg");
    assert!(!whole.contains("a part of the iteration"), "{whole}");
}

/// `run` without `-o` writes `DIR.result.json` each time: a second run says, before it runs,
/// that it replaces the first's; the first run, with nothing there, does not.
#[test]
fn a_run_that_replaces_an_earlier_result_says_so() {
    let pkg = tmp("again.pkg");
    generate(&[shared("cpu/mlp.et.json")], &pkg, &[]);
    let result = pkg.with_file_name("again.pkg.result.json");
    let _ = std::fs::remove_file(&result);
    let run_default = || {
        let o = bin()
            .arg("run")
            .arg(&pkg)
            .args(["--iters", "1", "--warmup", "0"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{o:?}");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let first = run_default();
    assert!(result.exists());
    assert!(!first.contains("replaces"), "{first}");
    let second = run_default();
    assert!(
        second.contains("result replaces") && second.contains("again.pkg.result.json"),
        "{second}"
    );
}

/// A multi-rank capture's directory: each rank's original is its own meta file's iteration,
/// timed uninstrumented (as a single rank's capture is), not its instrumented profile's; the
/// job's step is the slowest rank's.
#[test]
fn a_multi_rank_capture_takes_each_rank_s_original_from_its_meta() {
    let caps = tmp("dist-caps");
    std::fs::create_dir_all(&caps).unwrap();
    let mut medians = Vec::new();
    for k in 0..2 {
        for kind in ["linked.et.json.gz", "kineto.json.gz", "meta.json"] {
            let name = format!("dist_mlp_w2.rank{k}.{kind}");
            std::fs::copy(shared(&format!("cpu/{name}")), caps.join(&name)).unwrap();
        }
        let meta: serde_json::Value = serde_json::from_slice(
            &std::fs::read(caps.join(format!("dist_mlp_w2.rank{k}.meta.json"))).unwrap(),
        )
        .unwrap();
        medians.push(meta["iter_ms_median"].as_f64().unwrap());
    }
    let pkg = tmp("dist-caps.pkg");
    generate(std::slice::from_ref(&caps), &pkg, &[]);
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(pkg.join("manifest.json")).unwrap()).unwrap();
    for (k, median) in medians.iter().enumerate() {
        let o = &m["ranks"][k]["original"];
        assert_eq!(o["iter_ms"].as_f64(), Some(*median), "rank {k}: {o}");
        assert_eq!(
            o["from"],
            format!("dist_mlp_w2.rank{k}.meta.json (iter_ms_median)")
        );
        // The time in ops is still the profile's.
        assert!(o["ops_ms"].as_f64().unwrap_or(0.0) > 0.0, "rank {k}: {o}");
    }
    assert_eq!(
        m["original"]["iter_ms"].as_f64(),
        Some(medians[0].max(medians[1]))
    );
    assert_eq!(m["original"]["from"], "meta files (slowest of 2 ranks)");
    // Anonymised, the originals say where they came from without the model's file names.
    let anon = tmp("dist-caps-anon.pkg");
    generate(std::slice::from_ref(&caps), &anon, &["--anonymize"]);
    let text = std::fs::read_to_string(anon.join("manifest.json")).unwrap();
    assert!(!text.contains("dist_mlp"), "{text}");
    let m: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(m["original"]["from"], "meta files (slowest of 2 ranks)");
    assert_eq!(
        m["ranks"][1]["original"]["from"],
        "the capture's meta file (iter_ms_median)"
    );
}

/// What-if edits go into the package (and its manifest says which); the package still runs.
#[test]
fn what_if_packages_record_their_edits_and_run() {
    let pkg = tmp("whatif.pkg");
    generate(
        &[shared("cpu/mlp.et.json")],
        &pkg,
        &["--scale", "64:2", "--dtype", "float32:bfloat16"],
    );
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(pkg.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(
        m["what_if"].as_array().unwrap().len(),
        2,
        "{}",
        m["what_if"]
    );
    let r = run(&pkg, &tmp("whatif.result.json"));
    let rep = &r["ranks"][0]["report"];
    assert_eq!(rep["ops_failed"], 0, "{}", rep["failures"]);
    // The signatures carry the edited shapes and dtype.
    let sigs = r["ranks"][0]["signatures"].to_string();
    assert!(sigs.contains("bfloat16[128,"), "{sigs}");
    // The original (mlp.meta.json beside the trace) ran unedited: no ratio against it.
    assert!(m["original"].is_object(), "{m}");
    let o = bin()
        .arg("run")
        .arg(&pkg)
        .args(["--iters", "1", "--warmup", "0", "-o"])
        .arg(tmp("whatif-text.result.json"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(!text.contains("; original "), "{text}");
    assert!(
        text.contains("replays it edited (") && text.contains("so no ratio"),
        "{text}"
    );
    let out = bin()
        .args(["generate", "--scale", "64", "-o"])
        .arg(tmp("bad.pkg"))
        .arg(shared("cpu/mlp.et.json"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("DIM:FACTOR"));
}

/// `generate --emulate-gaps` packages the profile (and the reference, when given); `run`
/// calibrates the gaps on its host from them, anchored on the reference, unless `--no-gaps`.
/// A changed profile is refused; the profile's names cannot be anonymised, so `--anonymize`
/// with it is refused.
#[test]
fn packages_with_gaps_emulate_them_where_they_run() {
    let data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../et-graph/tests/data");
    let reference = tmp("gaps.ref.json");
    std::fs::write(
        &reference,
        r#"{"original_ms": 5.0, "replay_ms": 1.1, "replay_op_ms": 1.0}"#,
    )
    .unwrap();
    let pkg = tmp("gaps.pkg");
    let profile = data.join("steps.timing.json.gz");
    generate(
        &[data.join("steps.et.json.gz")],
        &pkg,
        &[
            "--kineto",
            profile.to_str().unwrap(),
            "--emulate-gaps",
            "--reference",
            reference.to_str().unwrap(),
        ],
    );
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(pkg.join("manifest.json")).unwrap()).unwrap();
    let name = m["gaps"]["profile"].as_str().unwrap();
    assert!(m["files"][name].is_string(), "{m}");
    assert_eq!(m["gaps"]["reference"]["original_ms"], 5.0, "{m}");
    assert_eq!(m["original"]["iter_ms"], 5.0, "{m}");
    assert_eq!(m["original"]["from"], "reference", "{m}");

    let with_gaps = tmp("gaps.result.json");
    let r = run(&pkg, &with_gaps);
    let rep = &r["ranks"][0]["report"];
    assert_eq!(rep["ops_failed"], 0, "{}", rep["failures"]);
    let gm = &rep["gap_model"];
    let a = &gm["anchored"];
    assert_eq!(a["reference"]["original_ms"], 5.0, "{gm}");
    let f = |v: &serde_json::Value| v.as_f64().unwrap();
    // Anchored: 5x this host's plain op time, the gaps most of it.
    assert!(
        (f(&a["target_ms"]) - 5.0 * f(&a["replay_op_ms"])).abs() < 1e-9,
        "{a}"
    );
    assert!(f(&gm["emulated_ms"]) > 3.0 * f(&a["replay_op_ms"]), "{gm}");

    let without = tmp("gaps.plain.json");
    let plain = json(
        bin()
            .arg("run")
            .arg(&pkg)
            .args([
                "--json",
                "--iters",
                "2",
                "--threads",
                "1",
                "--no-gaps",
                "-o",
            ])
            .arg(&without),
    );
    assert!(plain["ranks"][0]["report"]["gap_model"].is_null());
    // `diff` of the two says how each ran, and that they ran differently.
    let d = json(
        bin()
            .arg("diff")
            .arg(&with_gaps)
            .arg(&without)
            .arg("--json"),
    );
    let settings = |k: &str| d[k]["settings"].as_str().unwrap().to_string();
    assert!(settings("a").ends_with("gaps emulated, anchored"), "{d}");
    assert!(settings("b").ends_with("ops back to back"), "{d}");
    let o = bin()
        .arg("diff")
        .arg(&with_gaps)
        .arg(&without)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("A and B ran with different settings"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );

    // Anonymising would leave the profile's names: refused.
    let o = bin()
        .arg("generate")
        .arg(data.join("steps.et.json.gz"))
        .args(["--kineto", profile.to_str().unwrap(), "--emulate-gaps"])
        .arg("--anonymize")
        .arg("-o")
        .arg(tmp("gaps.anon.pkg"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--anonymize"));
    // A capture's profile given among the inputs (which stands for --emulate-gaps) is left out
    // of an anonymised package, and a note says so.
    let anon = tmp("capture.anon.pkg");
    let o = bin()
        .arg("generate")
        .arg(shared("cpu/mlp.linked.et.json"))
        .arg(shared("cpu/mlp.kineto.json"))
        .arg("--anonymize")
        .arg("-o")
        .arg(&anon)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("left out of the package's gaps"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(anon.join("manifest.json")).unwrap()).unwrap();
    assert!(manifest["gaps"].is_null(), "{manifest}");

    // A profile changed after packaging is refused.
    std::fs::write(pkg.join(name), b"{}").unwrap();
    let o = bin()
        .arg("run")
        .arg(&pkg)
        .arg("-o")
        .arg(tmp("gaps.tampered.json"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains(name));
}

/// A capture made by hand as capturing.md shows (`NAME.timing.json`, the profile taken without
/// the observer) packages its gaps too.
#[test]
fn a_hand_made_capture_directory_packages_its_timing_profile() {
    let data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../et-graph/tests/data");
    let cap = tmp("hand-capture");
    std::fs::create_dir_all(&cap).unwrap();
    for f in ["steps.et.json.gz", "steps.timing.json.gz"] {
        std::fs::copy(data.join(f), cap.join(f)).unwrap();
    }
    let pkg = tmp("hand-capture.pkg");
    generate(std::slice::from_ref(&cap), &pkg, &[]);
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(pkg.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(m["gaps"]["profile"], "rank0.timing.json.gz", "{m}");
    assert_eq!(m["original"]["from"], "kineto", "{m}");
    // The same profile given as --kineto too is the one profile, not two.
    let timing = cap.join("steps.timing.json.gz");
    generate(
        std::slice::from_ref(&cap),
        &tmp("hand-capture-k.pkg"),
        &["--kineto", timing.to_str().unwrap()],
    );
}

/// A capture's directory (`mystique.capture`'s files: `NAME.et.json`, `.kineto.json`,
/// `.meta.json`) packages with no further flag: its timing profile as the gaps, its meta's
/// uninstrumented iteration as the original's time. A reference among the files anchors it
/// and the original's time is the reference's; a profile given twice is refused.
#[test]
fn a_capture_directory_packages_with_everything_it_holds() {
    let cap = tmp("capture");
    std::fs::create_dir_all(&cap).unwrap();
    let cpu = shared("cpu");
    // The linked pair's ET stands for the capture's (its profile links to it).
    for (from, to) in [
        ("mlp.linked.et.json", "mlp.et.json"),
        ("mlp.kineto.json", "mlp.kineto.json"),
        ("mlp.meta.json", "mlp.meta.json"),
    ] {
        std::fs::copy(cpu.join(from), cap.join(to)).unwrap();
    }
    // A leftover of an interrupted capture is not part of it.
    std::fs::write(cap.join(".mlp.et.json.partial-1"), b"{").unwrap();
    let pkg = tmp("capture.pkg");
    generate(std::slice::from_ref(&cap), &pkg, &[]);
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(pkg.join("manifest.json")).unwrap()).unwrap();
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(cap.join("mlp.meta.json")).unwrap()).unwrap();
    assert_eq!(
        m["original"]["from"], "mlp.meta.json (iter_ms_median)",
        "{m}"
    );
    assert_eq!(m["original"]["iter_ms"], meta["iter_ms_median"]);
    // The threads the original ran with are the package's, and `run`'s unless told.
    assert_eq!(m["threads"], meta["threads"], "{m}");
    let r = json(
        bin()
            .arg("run")
            .arg(&pkg)
            .args(["--json", "--iters", "1", "--warmup", "0", "--no-gaps", "-o"])
            .arg(tmp("capture-threads.result.json"))
            .env_remove("OMP_NUM_THREADS"),
    );
    assert_eq!(r["ranks"][0]["report"]["threads"], meta["threads"], "{r}");
    // Its format says it records them; a count that is not positive is refused.
    assert_eq!(m["format"], "mystique-package/2", "{m}");
    let mut bad = m.clone();
    bad["threads"] = 0.into();
    std::fs::write(pkg.join("manifest.json"), bad.to_string()).unwrap();
    let o = bin().arg("run").arg(&pkg).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("threads (0) must be positive"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!m["gaps"].is_null(), "{m}");

    // With a reference (as `replay --reference-out` writes it): anchored on it.
    let reference = cap.join("mlp.reference.json");
    let o = bin()
        .args(["replay"])
        .arg(cap.join("mlp.et.json"))
        .args(["--iters", "2", "--warmup", "1", "--threads", "1"])
        .arg("--reference-out")
        .arg(&reference)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let files: Vec<PathBuf> = ["et", "kineto", "meta", "reference"]
        .iter()
        .map(|k| cap.join(format!("mlp.{k}.json")))
        .collect();
    let anchored = tmp("capture-ref.pkg");
    generate(&files, &anchored, &[]);
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(anchored.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(m["original"]["from"], "reference", "{m}");
    assert!(!m["gaps"]["reference"].is_null(), "{m}");
    let o = bin()
        .arg("generate")
        .arg(&cap)
        .arg("--kineto")
        .arg(cap.join("mlp.kineto.json"))
        .arg("-o")
        .arg(tmp("twice.pkg"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("give it once"), "{err}");
    // Two models' captures side by side are not one job.
    std::fs::copy(cap.join("mlp.et.json"), cap.join("other.et.json")).unwrap();
    let o = bin()
        .arg("generate")
        .arg(&cap)
        .arg("-o")
        .arg(tmp("two.pkg"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("several models (mlp, other)"),
        "{err}"
    );
}

/// `generate -` packages the trace on stdin (gzipped or not), as every command takes `-`; stdin
/// given twice is refused, as by `compose concat`.
#[test]
fn generate_reads_a_trace_from_stdin_once() {
    let pkg = tmp("stdin.pkg");
    let gz = {
        use std::io::Write as _;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(&std::fs::read(shared("cpu/mlp.et.json")).unwrap())
            .unwrap();
        e.finish().unwrap()
    };
    let mut child = bin()
        .args(["--json", "generate", "-", "-o"])
        .arg(&pkg)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write as _;
        child.stdin.take().unwrap().write_all(&gz).unwrap();
    }
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{o:?}");
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(summary["ops"], 45, "{summary}");
    let r = json(
        bin()
            .arg("run")
            .arg(&pkg)
            .arg("-o")
            .arg(tmp("stdin.result.json"))
            .args(["--json", "--iters", "1", "--warmup", "0"]),
    );
    assert_eq!(r["ranks"][0]["report"]["ops_failed"], 0, "{r}");
    for cmd in [
        &["generate", "-", "-", "-o"][..],
        &["compose", "concat", "-", "-", "-o"],
    ] {
        let o = bin()
            .args(cmd)
            .arg(tmp("stdin.twice"))
            .stdin(std::fs::File::open(shared("cpu/mlp.et.json")).unwrap())
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{cmd:?}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("given twice"),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

/// A package in a directory that does not exist is refused by that directory's name, as the
/// other commands' outputs are, before anything is read.
#[test]
fn generate_into_a_missing_directory_says_which() {
    let missing = tmp("no-such-dir").join("pkg");
    let o = bin()
        .arg("generate")
        .arg(shared("cpu/mlp.et.json"))
        .arg("-o")
        .arg(&missing)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no-such-dir does not exist"), "{err}");
    assert!(!err.contains(".tmp-"), "{err}");
}

/// A capture's directory with both its clean and its linked trace (as `gen_traces.py` writes
/// one) packages the one its profile pairs with, the linked trace beside the linked profile,
/// and says which it left out; without a profile, the clean one.
#[test]
fn generate_takes_the_trace_a_captures_profile_pairs_with() {
    let cap = tmp("mlp-capture");
    std::fs::create_dir_all(&cap).unwrap();
    for f in [
        "mlp.et.json",
        "mlp.linked.et.json",
        "mlp.kineto.json",
        "mlp.meta.json",
    ] {
        std::fs::copy(shared(&format!("cpu/{f}")), cap.join(f)).unwrap();
    }
    let pkg = tmp("mlp-capture.pkg");
    let o = bin()
        .arg("generate")
        .arg(&cap)
        .arg("-o")
        .arg(&pkg)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("mlp.et.json left out"), "{err}");
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(pkg.join("manifest.json")).unwrap()).unwrap();
    assert!(!manifest["gaps"].is_null(), "{manifest}");
    let linked = std::fs::read(cap.join("mlp.linked.et.json")).unwrap();
    assert_eq!(
        manifest["ranks"][0]["source_sha256"],
        mystique_cli::package::sha256_hex(&linked).as_str(),
        "{manifest}"
    );
    // The two traces alone: the clean one.
    let pkg = tmp("mlp-clean.pkg");
    let o = bin()
        .arg("generate")
        .arg(cap.join("mlp.et.json"))
        .arg(cap.join("mlp.linked.et.json"))
        .arg("-o")
        .arg(&pkg)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("mlp.linked.et.json left out"), "{err}");
}

/// A package of a job's collectives alone (`--only comm`) records the original's whole
/// iteration, as its profile bounds it, not the span of the collectives: param's DLRM links
/// by order, and its collectives span 3.6 ms less than its iteration.
#[test]
fn a_partial_packages_original_is_the_whole_iteration() {
    let dir = "public/param_dlrm_8rank_1.0.1";
    let iter_ms = |extra: &[&str]| {
        let pkg = tmp(&format!("dlrm{}.pkg", extra.len()));
        let mut args = vec!["--kineto"];
        let k = shared(&format!("{dir}/rank0.kineto.json.gz"));
        args.push(k.to_str().unwrap());
        args.extend(extra);
        generate(&[shared(&format!("{dir}/rank0.et.json.gz"))], &pkg, &args);
        let m: serde_json::Value =
            serde_json::from_slice(&std::fs::read(pkg.join("manifest.json")).unwrap()).unwrap();
        m["original"]["iter_ms"].as_f64().unwrap()
    };
    let whole = iter_ms(&[]);
    let comm = iter_ms(&["--only", "comm"]);
    assert_eq!(comm, whole);
}

/// A package of one rank of a two-rank job warns that its collectives need the other rank
/// (they fail at `run`); one of its compute alone, or of a job of one rank, does not.
#[test]
fn a_package_of_one_rank_of_a_job_warns_of_its_collectives() {
    let generate_err = |trace: &str, extra: &[&str]| {
        let pkg = tmp("one-rank.pkg");
        let o = bin()
            .arg("generate")
            .arg(shared(trace))
            .args(extra)
            .arg("-o")
            .arg(&pkg)
            .output()
            .unwrap();
        assert!(o.status.success(), "{o:?}");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let err = generate_err("cpu/dist_mlp_w2.rank1.et.json", &[]);
    assert!(
        err.contains("is one rank of a job: its 6 collectives") && err.contains("--only compute"),
        "{err}"
    );
    for (trace, extra) in [
        ("cpu/dist_mlp_w2.rank1.et.json", &["--only", "compute"][..]),
        (
            "public/param_resnet_1.1.0.et.json.gz",
            &["--iteration", "7"],
        ),
    ] {
        let err = generate_err(trace, extra);
        assert!(!err.contains("one rank of a job"), "{trace}: {err}");
    }
}
