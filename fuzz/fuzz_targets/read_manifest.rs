//! Any bytes as a package's manifest, in a package directory holding two plain files: read and
//! checked as `mystique run` reads it. No panic, abort or hang.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fn package() -> &'static std::path::Path {
    static DIR: OnceLock<std::path::PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("mystique-fuzz-manifest-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("rank0.et.json.gz"), b"t").unwrap();
        std::fs::write(d.join("rank0.plan.json.gz"), b"p").unwrap();
        d
    })
}

fuzz_target!(|data: &[u8]| {
    let dir = package();
    std::fs::write(dir.join("manifest.json"), data).unwrap();
    let _ = mystique_cli::package::read_manifest(dir);
});
