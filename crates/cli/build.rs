//! Links `mystique-replay` against libtorch with an rpath, so it starts without
//! LD_LIBRARY_PATH, and forces libtorch (and through it libtorch_cuda) to be a real dependency
//! even though no symbol of it is referenced directly (tch-rs #980, #907). `mystique` itself
//! gets neither: it never loads libtorch.
fn main() {
    let lib =
        std::env::var("DEP_TCH_LIBTORCH_LIB").expect("torch-sys exports the libtorch lib dir");
    let lib = std::fs::canonicalize(&lib).unwrap_or_else(|_| lib.into());
    println!(
        "cargo:rustc-link-arg-bin=mystique-replay=-Wl,-rpath,{}",
        lib.display()
    );
    println!("cargo:rustc-link-arg-bin=mystique-replay=-Wl,--no-as-needed,-ltorch,--as-needed");
    // Test binaries start the executables and need no libtorch; an rpath in case one links it.
    println!("cargo:rustc-link-arg-tests=-Wl,-rpath,{}", lib.display());
    println!("cargo:libtorch_lib={}", lib.display());
    // One id per build of this package: `mystique` refuses to hand over to a `mystique-replay`
    // from another build (e.g. `cargo run` rebuilt only `mystique`).
    let id = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    println!("cargo:rustc-env=MYSTIQUE_BUILD_ID={id}");
}
