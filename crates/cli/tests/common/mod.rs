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
