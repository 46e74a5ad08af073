//! # replay
//!
//! The replay runtime: runs a trace's operators through libtorch. For now it reports the
//! libtorch it links and whether CUDA is usable; the runtime lands with the replay issue.

/// A one-line description of the libtorch runtime: version, threads, CUDA.
pub fn env_report() -> String {
    let cuda = if tch::Cuda::is_available() {
        format!("CUDA available, {} device(s)", tch::Cuda::device_count())
    } else {
        "no CUDA device".to_string()
    };
    format!(
        "libtorch 2.11.0 (tch 0.24.0), {} intra-op threads, {cuda}",
        tch::get_num_threads()
    )
}
