//! Packages and outputs as a hostile world sees them: names planted in shared directories,
//! inputs that are devices, FIFOs or links, outputs aimed at inputs, stored plans and manifests
//! that lie, and interrupted commands. One test per class of defect.

mod common;
use common::{bin, json, shared};
use std::path::{Path, PathBuf};
use std::process::Command;

fn scratch(name: &str) -> PathBuf {
    let d = common::scratch(&format!("hostile-{name}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `mystique generate TRACE -o PKG`, which must succeed.
fn generate(trace: &Path, pkg: &Path) {
    let g = bin()
        .arg("generate")
        .arg(trace)
        .arg("-o")
        .arg(pkg)
        .output()
        .unwrap();
    assert!(g.status.success(), "{}", String::from_utf8_lossy(&g.stderr));
}

/// `sh -c 'PLANT; exec mystique ARGS'`: the planting shell's PID is the command's (exec keeps
/// it), so a name made of the PID can be planted before the command runs.
fn planted(plant: &str, args: &[&str]) -> std::process::Output {
    let mut script = format!("{plant}; exec '{}'", env!("CARGO_BIN_EXE_mystique"));
    for a in args {
        script += &format!(" '{a}'");
    }
    Command::new("sh").args(["-c", &script]).output().unwrap()
}

/// Links planted at the names a command writes through (its temporary file, its probe of the
/// output directory, the output itself) never redirect a write: the files they point to stay
/// as they were, and the output is a regular file.
#[test]
fn links_planted_in_the_output_directory_redirect_no_write() {
    let d = scratch("links");
    let victim = d.join("victim.txt");
    std::fs::write(&victim, "precious").unwrap();
    let out = d.join("out.json");
    let mlp = shared("cpu/mlp.et.json");
    // The temporary file's and the probe's names as a PID makes them, and the output itself.
    let v = victim.display();
    let plant = format!(
        "ln -s {v} {dir}/.out.json.tmp-$$ && ln -s {v} {dir}/.mystique-probe-$$ && ln -s {v} {o}",
        dir = d.display(),
        o = out.display()
    );
    let o = planted(
        &plant,
        &[
            "select",
            mlp.to_str().unwrap(),
            "--name",
            "mm",
            "-o",
            out.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    let meta = std::fs::symlink_metadata(&out).unwrap();
    assert!(meta.file_type().is_file(), "out.json is still a link");
    et_schema::read_trace(&out).unwrap();
    // `run -o` probes its output directory: a link at the probe's name truncates nothing.
    let pkg = d.join("pkg");
    generate(&mlp, &pkg);
    let result = d.join("result.json");
    let plant = format!("ln -sf {v} {}/.mystique-probe-$$", d.display());
    let o = planted(
        &plant,
        &[
            "run",
            pkg.to_str().unwrap(),
            "--iters",
            "1",
            "--warmup",
            "0",
            "-o",
            result.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    std::fs::remove_dir_all(&d).unwrap();
}

/// Inputs that are not regular files are refused at once, never read without end or waited
/// on: a trace that is `/dev/zero` or a FIFO, a package whose manifest is a link to
/// `/dev/zero`, a FIFO or a directory.
#[test]
fn devices_fifos_and_links_are_refused_as_inputs() {
    let d = scratch("devices");
    let fifo = d.join("trace.json");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid path; mkfifo only creates the node.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let started = std::time::Instant::now();
    for trace in [
        Path::new("/dev/zero"),
        Path::new("/dev/urandom"),
        fifo.as_path(),
    ] {
        let o = bin()
            .args(["inspect", trace.to_str().unwrap()])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{}", trace.display());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("not a regular file"),
            "{}: {err}",
            trace.display()
        );
    }
    let mlp = shared("cpu/mlp.et.json");
    let pkg = d.join("pkg");
    generate(&mlp, &pkg);
    let manifest = pkg.join("manifest.json");
    let swap = |make: &dyn Fn(&Path)| {
        std::fs::remove_file(&manifest).ok();
        std::fs::remove_dir(&manifest).ok();
        make(&manifest);
        let o = bin().args(["run", pkg.to_str().unwrap()]).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert_eq!(o.status.code(), Some(2), "{err}");
        err
    };
    let err = swap(&|m| std::os::unix::fs::symlink("/dev/zero", m).unwrap());
    assert!(err.contains("symbolic link"), "{err}");
    let err = swap(&|m| {
        let c = std::ffi::CString::new(m.to_str().unwrap()).unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    });
    assert!(err.contains("a FIFO"), "{err}");
    let err = swap(&|m| std::fs::create_dir(m).unwrap());
    assert!(err.contains("a directory"), "{err}");
    // Refused, not read: well under the time /dev/zero takes to fill memory.
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
    std::fs::remove_dir_all(&d).unwrap();
}

/// No output lands on an input or inside a package: `--trace-out` over the Kineto trace or the
/// reference, `run -o` inside the package it runs, `--map` inside the package it anonymises.
#[test]
fn outputs_never_land_on_inputs_or_inside_a_package() {
    let d = scratch("outputs");
    let et = shared("cpu/mlp.et.json");
    let kineto = d.join("mlp.kineto.json");
    std::fs::copy(shared("cpu/mlp.kineto.json"), &kineto).unwrap();
    let before = std::fs::read(&kineto).unwrap();
    let reference = d.join("ref.json");
    std::fs::write(&reference, "{}").unwrap();
    for args in [
        vec![
            "--kineto",
            kineto.to_str().unwrap(),
            "--trace-out",
            kineto.to_str().unwrap(),
        ],
        vec![
            "--kineto",
            kineto.to_str().unwrap(),
            "--emulate-gaps",
            "--reference",
            reference.to_str().unwrap(),
            "--trace-out",
            reference.to_str().unwrap(),
        ],
    ] {
        let o = bin().arg("replay").arg(&et).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("is also an input"), "{args:?}: {err}");
    }
    assert_eq!(std::fs::read(&kineto).unwrap(), before);
    assert_eq!(std::fs::read_to_string(&reference).unwrap(), "{}");
    // Beside its inputs, the same output is written.
    let beside = d.join("replay.trace.json");
    let r = json(
        bin()
            .arg("replay")
            .arg(&et)
            .args(["--json", "--iters", "1", "--warmup", "0", "--trace-out"])
            .arg(&beside),
    );
    assert_eq!(r["ops_failed"], 0);
    assert!(beside.is_file());
    let pkg = d.join("pkg");
    generate(&et, &pkg);
    let plan = pkg.join("rank0.plan.json.gz");
    let plan_before = std::fs::read(&plan).unwrap();
    let o = bin()
        .args(["run", pkg.to_str().unwrap(), "-o", plan.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("inside the package"), "{err}");
    assert_eq!(std::fs::read(&plan).unwrap(), plan_before);
    let anon = d.join("anon");
    let map = anon.join("map.json");
    let o = bin()
        .args([
            "generate",
            et.to_str().unwrap(),
            "--anonymize",
            "--map",
            map.to_str().unwrap(),
        ])
        .args(["-o", anon.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("would ship with it"), "{err}");
    assert!(!anon.exists(), "nothing written");
    std::fs::remove_dir_all(&d).unwrap();
}

/// A package whose manifest and plan lie is refused before anything is allocated: a slot
/// count no compile makes, a plan without the steps the manifest counts, iterations beyond
/// what a package may ask for (run anyway when asked on the command line), a file named twice.
#[test]
fn plans_and_manifests_that_lie_are_refused() {
    let d = scratch("lies");
    let et = shared("cpu/mlp.et.json");
    let fresh = |name: &str| {
        let pkg = d.join(name);
        generate(&et, &pkg);
        pkg
    };
    let run = |pkg: &Path, extra: &[&str]| {
        let o = bin()
            .arg("run")
            .arg(pkg)
            .args(["-o", d.join("r.json").to_str().unwrap()])
            .args(extra)
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).to_string(),
        )
    };
    // Edits the plan (as JSON) and rehashes it in the manifest, as a forger would.
    let forge_plan = |pkg: &Path, edit: &dyn Fn(&mut serde_json::Value)| {
        let path = pkg.join("rank0.plan.json.gz");
        let mut plan: serde_json::Value =
            serde_json::from_slice(&et_schema::read_input(&path).unwrap()).unwrap();
        edit(&mut plan);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, plan.to_string().as_bytes()).unwrap();
        let bytes = gz.finish().unwrap();
        std::fs::write(&path, &bytes).unwrap();
        forge_manifest(pkg, &|m| {
            m["files"]["rank0.plan.json.gz"] = sha256(&bytes).into();
        });
    };
    let pkg = fresh("slots");
    forge_plan(&pkg, &|p| {
        p["n_slots"] = serde_json::json!(1_000_000_000_000u64)
    });
    let (code, err) = run(&pkg, &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("slots for"), "{err}");
    let pkg = fresh("nosteps");
    forge_plan(&pkg, &|p| {
        // Consistent in itself: no steps, so no slots, inputs or releases either.
        for empty in [
            "steps",
            "graph_releases",
            "externals",
            "grad_inputs",
            "restored",
        ] {
            p[empty] = serde_json::json!([]);
        }
        p["n_slots"] = serde_json::json!(0);
    });
    let (code, err) = run(&pkg, &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("0 steps where the manifest says"), "{err}");
    let pkg = fresh("iters");
    forge_manifest(&pkg, &|m| {
        m["iters"] = serde_json::json!(1_000_000_000_000u64)
    });
    let (code, err) = run(&pkg, &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("pass --iters N"), "{err}");
    let (code, err) = run(&pkg, &["--iters", "1", "--warmup", "0"]);
    assert_eq!(code, Some(0), "{err}");
    // Ranks that are not 0..N-1, each once: refused by what they are, before any rank starts.
    for (name, rank) in [("rank1", 1), ("rank7", 7)] {
        let pkg = fresh(name);
        forge_manifest(&pkg, &|m| m["ranks"][0]["rank"] = serde_json::json!(rank));
        let (code, err) = run(&pkg, &[]);
        assert_eq!(code, Some(2), "{err}");
        assert!(
            err.contains(&format!("the manifest's ranks are [{rank}]")),
            "{err}"
        );
    }
    // A file named twice: the manifest's text holds the key twice, the last one a forgery.
    let pkg = fresh("twice");
    let path = pkg.join("manifest.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let twice = text.replacen(
        "\"files\": {",
        "\"files\": {\n    \"rank0.plan.json.gz\": \"00\",",
        1,
    );
    assert_ne!(twice, text);
    std::fs::write(&path, twice).unwrap();
    let (code, err) = run(&pkg, &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("named twice"), "{err}");
    std::fs::remove_dir_all(&d).unwrap();
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Edits a package's manifest as JSON.
fn forge_manifest(pkg: &Path, edit: &dyn Fn(&mut serde_json::Value)) {
    let path = pkg.join("manifest.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut m);
    std::fs::write(&path, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
}

/// An interrupted command leaves nothing behind: SIGINT while `generate` writes its package,
/// SIGTERM while `select` writes its output, each once its temporary is on disk; the command
/// ends by the signal.
#[test]
fn interrupted_commands_leave_no_temporary_behind() {
    let gpt2 = shared("public/param_hf_gpt2_1.1.0.et.json.gz");
    for (signal, args) in [
        (
            libc::SIGINT,
            vec!["generate", gpt2.to_str().unwrap(), "-o", "pkg"],
        ),
        (
            libc::SIGTERM,
            vec!["select", gpt2.to_str().unwrap(), "-o", "out.json"],
        ),
    ] {
        let d = scratch(&format!("signal{signal}"));
        let mut child = bin().args(&args).current_dir(&d).spawn().unwrap();
        let started = std::time::Instant::now();
        let temporary = || {
            std::fs::read_dir(&d)
                .unwrap()
                .flatten()
                .any(|e| e.file_name().to_string_lossy().contains(".tmp-"))
        };
        while !temporary() {
            assert!(child.try_wait().unwrap().is_none(), "{args:?} ended first");
            assert!(
                started.elapsed().as_secs() < 120,
                "{args:?}: no temporary appeared"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(child.id() as i32, signal) };
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(signal), "{args:?}: {status:?}");
        let left: Vec<String> = std::fs::read_dir(&d)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(left.is_empty(), "{args:?} left {left:?}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}

/// A replay ended by SIGTERM while it calibrates under a linked pair's instrumentation (as
/// `timeout` ends one) leaves no observer trace behind in the temporary directory.
#[test]
fn a_replay_ended_mid_calibration_leaves_no_observer_trace() {
    let d = scratch("observer-trace");
    let mut child = bin()
        .arg("replay")
        .arg(shared("cpu/cnn.linked.et.json.gz"))
        .arg("--kineto")
        .arg(shared("cpu/cnn.kineto.json.gz"))
        .args(["--emulate-gaps", "--threads", "1"])
        .env("TMPDIR", &d)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    let observer_trace = || {
        std::fs::read_dir(&d).unwrap().flatten().any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("mystique-calibration-")
        })
    };
    while !observer_trace() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the replay ended first"
        );
        assert!(
            started.elapsed().as_secs() < 120,
            "no observer trace appeared"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    let left: Vec<String> = std::fs::read_dir(&d)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(left.is_empty(), "left {left:?}");
    std::fs::remove_dir_all(&d).unwrap();
}
