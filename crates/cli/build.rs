//! Links test binaries of this crate against libtorch with an rpath, so they start without
//! LD_LIBRARY_PATH, and forces libtorch (and through it libtorch_cuda) to be a real dependency
//! even though no symbol of it is referenced directly (tch-rs #980, #907).
fn main() {
    let lib =
        std::env::var("DEP_TCH_LIBTORCH_LIB").expect("torch-sys exports the libtorch lib dir");
    let lib = std::fs::canonicalize(&lib).unwrap_or_else(|_| lib.into());
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch,--as-needed");
    println!("cargo:libtorch_lib={}", lib.display());
}
