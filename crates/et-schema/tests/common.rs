#![allow(dead_code)]
use std::path::PathBuf;

/// `../shared/traces` beside the project root (also where CI lays it).
pub fn shared_traces() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces");
    assert!(p.is_dir(), "shared traces not found at {}", p.display());
    p
}

/// Files under shared/traces whose name contains `pattern`, sorted.
fn files_containing(pattern: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![shared_traces()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().unwrap().to_string_lossy().contains(pattern) {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Every ET file under shared/traces (not Kineto, not meta).
pub fn all_et_files() -> Vec<PathBuf> {
    let out = files_containing(".et.json");
    assert!(
        out.len() >= 20,
        "expected the shared traces, found {}",
        out.len()
    );
    out
}

pub fn all_kineto_files() -> Vec<PathBuf> {
    files_containing(".kineto.json")
}

/// Reads any file the independent way: flate2 by extension, serde_json DOM.
pub fn dom(p: &std::path::Path) -> serde_json::Value {
    let bytes = std::fs::read(p).unwrap();
    let text = if p.extension().is_some_and(|e| e == "gz") {
        let mut s = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut s).unwrap();
        s
    } else {
        bytes
    };
    serde_json::from_slice(&text).unwrap()
}
