//! Helpers shared by the CLI test binaries (each `tests/*.rs` is its own crate).

use std::path::PathBuf;
use std::process::Command;

/// The `mystique` binary cargo built for these tests.
pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mystique"))
}

/// A path under `../shared/traces`.
pub fn shared(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/traces")
        .join(rel)
}

/// Runs a command that must succeed and returns the JSON object it printed.
pub fn json(cmd: &mut Command) -> serde_json::Value {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Resident bytes of libtorch's own, in a replay that holds nothing: a trace without
/// collectives, replayed comm only (not every test binary needs it).
#[allow(dead_code)]
pub fn libtorch_own() -> u64 {
    json(bin().args([
        "replay",
        shared("cpu/mlp.et.json").to_str().unwrap(),
        "--only",
        "comm",
        "--json",
        "--iters",
        "1",
        "--warmup",
        "0",
    ]))["device_memory"]["peak_bytes"]
        .as_u64()
        .unwrap()
}

/// Directories [`scratch`] made in this process, removed when it exits.
static SCRATCH: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

extern "C" {
    fn atexit(f: extern "C" fn()) -> std::os::raw::c_int;
}

extern "C" fn remove_scratch() {
    if std::env::var_os("MYSTIQUE_KEEP_TEST_FILES").is_some() {
        return;
    }
    let dirs = SCRATCH.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for d in dirs {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// This process's scratch directory `<tmp>/mystique-NAME-<pid>`, made on first use and
/// removed when the test binary exits (the harness ends through `exit`, which runs `atexit`
/// handlers), so test runs leave nothing behind in the temporary directory. Set
/// `MYSTIQUE_KEEP_TEST_FILES` to keep them for a look after a failure.
#[allow(dead_code)]
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mystique-{name}-{}", std::process::id()));
    {
        let mut dirs = SCRATCH.lock().unwrap_or_else(|e| e.into_inner());
        if !dirs.contains(&d) {
            if dirs.is_empty() {
                // SAFETY: registers a plain function with no captured state.
                unsafe { atexit(remove_scratch) };
            }
            dirs.push(d.clone());
        }
    }
    std::fs::create_dir_all(&d).unwrap();
    d
}
