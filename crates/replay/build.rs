//! Compiles the boxed-dispatch shim against the libtorch torch-sys found, and links test
//! binaries of this crate with an rpath to it and `--no-as-needed -ltorch`, so they start
//! without LD_LIBRARY_PATH and load libtorch_cuda when the wheel has it (tch-rs #980, #907).
use std::path::PathBuf;

fn main() {
    let lib =
        std::env::var("DEP_TCH_LIBTORCH_LIB").expect("torch-sys exports the libtorch lib dir");
    let lib = std::fs::canonicalize(&lib).unwrap_or_else(|_| PathBuf::from(&lib));
    let root = lib
        .parent()
        .expect("libtorch lib dir has a parent")
        .to_path_buf();
    println!("cargo:rerun-if-changed=csrc/shim.cpp");
    cc::Build::new()
        .cpp(true)
        .pic(true)
        .warnings(false)
        .include(root.join("include"))
        .include(root.join("include/torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .flag("-DUSE_DISTRIBUTED")
        .flag("-DUSE_C10D_GLOO")
        .file("csrc/shim.cpp")
        .compile("mystique_shim");
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch,--as-needed");
    println!("cargo:libtorch_lib={}", lib.display());
}
