//! What the CLI refuses and how it exits: outputs never overwrite inputs, paths are checked
//! before long work, absurd settings are refused, exit codes say what happened.

mod common;
use common::{bin, json, shared};

fn tmp(name: &str) -> std::path::PathBuf {
    let d = common::scratch("safety");
    d.join(name)
}

/// `-o INPUT` is refused for every command that writes a trace or a file, and the input is
/// left as it was.
#[test]
fn no_command_writes_over_its_input() {
    let input = tmp("in.et.json");
    std::fs::copy(shared("cpu/mlp.et.json"), &input).unwrap();
    let before = std::fs::read(&input).unwrap();
    let i = input.to_str().unwrap();
    for args in [
        vec!["compose", "repeat", i, "2", "-o", i],
        vec![
            "compose", "scale", i, "--dim", "64", "--factor", "2", "-o", i,
        ],
        vec!["select", i, "--name", "addmm", "-o", i],
        vec!["export", i, "--dot", "-o", i],
        vec![
            "replay",
            i,
            "--trace-out",
            i,
            "--iters",
            "1",
            "--warmup",
            "0",
        ],
    ] {
        let out = bin().args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("is also an input"), "{args:?}: {err}");
        assert_eq!(
            std::fs::read(&input).unwrap(),
            before,
            "{args:?} changed the input"
        );
    }
    // A replay whose --trace-out cannot be written fails at once, not after the replay.
    let out = bin()
        .args([
            "replay",
            i,
            "--json",
            "--trace-out",
            "/nonexistent-dir/x.json",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty(), "no replay ran");
}

#[test]
fn absurd_thread_counts_are_refused() {
    let out = bin()
        .arg("replay")
        .arg(shared("cpu/mlp.et.json"))
        .args(["--threads", "100000"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cores"));
}

/// 0: every selected op ran; 3: the replay completed with failed ops, its report printed.
#[test]
fn a_replay_with_failed_ops_exits_3_with_its_report() {
    // Alone, a rank's collectives have no peers: they fail, the rest runs.
    let out = bin()
        .arg("replay")
        .arg(shared("cpu/dist_mlp_w2.rank0.et.json"))
        .args(["--json", "--iters", "1", "--warmup", "0", "--only", "comm"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["ops_failed"], 6);
    assert_eq!(j["failures"][0]["kind"], "unsupported");
}

#[test]
fn env_and_export_speak_json() {
    let j = json(bin().args(["env", "--json"]));
    assert_eq!(j["libtorch"], "2.11.0");
    assert!(j["intra_op_threads"].as_i64().unwrap() > 0);
    let dot = tmp("g.dot");
    let j = json(
        bin()
            .arg("export")
            .arg(shared("cpu/mlp.et.json"))
            .args(["--dot", "--json", "-o"])
            .arg(&dot),
    );
    assert!(j["ops"].as_u64().unwrap() > 10, "{j}");
    assert!(std::fs::read_to_string(&dot)
        .unwrap()
        .starts_with("digraph"));
}

/// A mapped input truncated by another process while it is read raises SIGBUS on the next
/// read of a lost page: that is an exit 2 with a message, not a crash. (The signal is sent
/// here to a `mystique inspect -` waiting on its stdin: a truncation race would be flaky.)
#[test]
fn a_bus_error_is_an_exit_2_with_a_message() {
    let child = bin()
        .args(["inspect", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Let it get past start-up to the read of stdin.
    std::thread::sleep(std::time::Duration::from_millis(300));
    // SAFETY: signalling a child process we own and have not reaped.
    assert_eq!(
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGBUS) },
        0
    );
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("SIGBUS") && err.contains("truncated"), "{err}");
}

/// An edit that would change nothing, or remove everything, is refused with what it did not
/// find, and writes nothing; a reversed id range is named as such.
#[test]
fn edits_that_match_nothing_are_refused() {
    let mlp = shared("cpu/mlp.et.json");
    let m = mlp.to_str().unwrap();
    let out = tmp("edit.et.json");
    // A file of an earlier run of the same process id would read as written here.
    let _ = std::fs::remove_file(&out);
    let o = out.to_str().unwrap();
    for (args, why) in [
        (
            vec![
                "compose", "scale", m, "--dim", "7777", "--factor", "2", "-o", o,
            ],
            "holds 7777: nothing to scale",
        ),
        (
            vec![
                "compose", "dtype", m, "--from", "float16", "--to", "float32", "-o", o,
            ],
            "is float16: nothing to change",
        ),
        (
            vec!["compose", "remove", m, "-o", o],
            "remove needs a filter",
        ),
        (
            vec!["select", m, "--ids", "10..5", "-o", o],
            "the first id is after the last",
        ),
        // Edits that would change nothing whatever the trace holds, refused as such.
        (
            vec![
                "compose", "scale", m, "--dim", "64", "--factor", "1", "-o", o,
            ],
            "--factor 1 changes nothing",
        ),
        (
            vec![
                "compose", "dtype", m, "--from", "float32", "--to", "float32", "-o", o,
            ],
            "both float32",
        ),
    ] {
        let r = bin().args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(why), "{args:?}: {err}");
        assert!(!out.exists(), "{args:?} wrote {o}");
    }
    // The same edits that do match still write.
    let r = bin()
        .args([
            "compose", "scale", m, "--dim", "64", "--factor", "2", "-o", o,
        ])
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(out.exists());
    std::fs::remove_file(&out).unwrap();
}

/// Errors name what is wrong with what was given: an iteration with nothing in it, a Kineto
/// trace where an execution trace goes, paths that do not exist; an I/O error is said once.
#[test]
fn errors_say_what_is_wrong_with_the_input() {
    let fails = |args: &[&str]| {
        let o = bin().args(args).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    // GPT-2's profile ends with an empty ProfilerStep#1 (the profiler's last step() opens it).
    let gpt2 = shared("public/param_hf_gpt2_1.1.0.et.json.gz");
    let err = fails(&["replay", gpt2.to_str().unwrap(), "--iteration", "1"]);
    assert!(
        err.contains("ProfilerStep#1 holds no op to replay (the trace's replay set has"),
        "{err}"
    );
    let kineto = shared("cpu/mlp.kineto.json");
    let err = fails(&["inspect", kineto.to_str().unwrap()]);
    assert!(err.contains("a Kineto (profiler) trace"), "{err}");
    let err = fails(&["inspect", "/nonexistent/x.et.json"]);
    assert_eq!(err.matches("No such file").count(), 1, "{err}");
    let err = fails(&["run", "/nonexistent/pkg"]);
    assert!(err.contains("/nonexistent/pkg does not exist"), "{err}");
    let mlp = shared("cpu/mlp.et.json");
    let err = fails(&[
        "select",
        mlp.to_str().unwrap(),
        "--name",
        "addmm",
        "-o",
        "/nonexistent/x.json",
    ]);
    assert!(err.contains("/nonexistent does not exist"), "{err}");
    let err = fails(&[
        "export",
        mlp.to_str().unwrap(),
        "--dot",
        "--astra-sim",
        "-o",
        "-",
    ]);
    assert!(err.contains("it goes with --chakra"), "{err}");
}
