//! Benchmarks link libtorch through replay: same rpath and `--no-as-needed -ltorch` as the CLI.
//! Only for bench targets: the parse-bench binary must not load libtorch, whose mapped
//! libraries would dominate its peak RSS.
fn main() {
    let lib =
        std::env::var("DEP_TCH_LIBTORCH_LIB").expect("torch-sys exports the libtorch lib dir");
    let lib = std::fs::canonicalize(&lib).unwrap_or_else(|_| lib.into());
    println!("cargo:rustc-link-arg-benches=-Wl,-rpath,{}", lib.display());
    println!("cargo:rustc-link-arg-benches=-Wl,--no-as-needed,-ltorch,--as-needed");
}
