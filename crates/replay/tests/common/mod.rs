//! Helpers shared by the replay test binaries (each `tests/*.rs` is its own crate).

use std::path::PathBuf;

/// A path under `../shared/traces` (or `$MYSTIQUE_SHARED_TRACES`: the test binaries that
/// `cargo xtask gpu-check` carries to a GPU machine find their traces in its bundle).
pub fn shared(rel: &str) -> PathBuf {
    match std::env::var_os("MYSTIQUE_SHARED_TRACES") {
        Some(d) => PathBuf::from(d).join(rel),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../../shared/traces")
            .join(rel),
    }
}

/// Replays the ops of a shared trace that `sel` selects, with `opts`.
pub fn replay_with(
    rel: &str,
    sel: &et_graph::Selection,
    opts: &replay::ReplayOptions,
) -> replay::Report {
    let t = et_schema::read_trace(&shared(rel)).unwrap();
    let g = et_graph::Graph::new(&t);
    let set = g.select(sel).unwrap();
    replay::replay(&g, &set, opts).unwrap().0
}
