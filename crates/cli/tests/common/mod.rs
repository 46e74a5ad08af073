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
