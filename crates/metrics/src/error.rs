//! Why a measurement cannot be taken here: a GPU library absent or failing, a backend left out of
//! the build, a hardware counter the kernel refuses.
//!
//! Each message is the text a user reads in a report (`gpu_unavailable`, `hw_unavailable`,
//! `mystique env`), so it includes its cause's text; a variant that carries the cause keeps it
//! as a field for callers that want it, not as [`std::error::Error::source`], which would print
//! it twice in a cause chain.

use crate::gpu::GpuSelect;

/// The error a driver library returned (cudarc's `DriverError`, nvml-wrapper's `NvmlError`),
/// boxed so that the variants do not depend on the cargo features that bring those libraries.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong taking a measurement.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Built without the `cuda` feature: no CUDA events, no driver check.
    #[error("this build has no CUDA support (cargo feature `cuda`)")]
    NoCudaSupport,
    /// Built without the `nvml` feature: no GPU counters.
    #[error("this build has no NVML support (cargo feature `nvml`)")]
    NoNvmlSupport,
    /// The CUDA driver library (`libcuda.so`) cannot be loaded.
    #[error("no CUDA driver: libcuda.so is not installed on this machine")]
    NoCudaDriver,
    /// The driver loads but its first call (the device count) fails.
    #[error("the CUDA driver is installed but reports {0}")]
    CudaDriver(Cause),
    /// A CUDA call of an event timer failed; `call` says which ("recording a CUDA event").
    #[error("{call}: {error}")]
    CudaCall { call: &'static str, error: Cause },
    /// NVML (`libnvidia-ml.so.1`) cannot be loaded or initialised.
    #[error("NVML is not available ({0}): no NVIDIA driver on this machine?")]
    NvmlUnavailable(Cause),
    /// NVML runs but has no device `gpu`.
    #[error("NVML has no device {gpu:?}: {error}")]
    NoSuchGpu { gpu: GpuSelect, error: Cause },
    /// The OS would not start the sampler's thread.
    #[error("cannot start the NVML sampler thread: {0}")]
    SamplerThread(std::io::Error),
    /// The sampler's thread ended before it reported whether sampling started (it panicked).
    #[error("the NVML sampler thread ended before it started")]
    SamplerEnded,
    /// `perf_event_open` found no PMU for `counter` (`ENOENT`, `EOPNOTSUPP`).
    #[error(
        "hardware counter {counter}: no hardware PMU is exposed here (a VM without a virtual PMU?)"
    )]
    NoPmu { counter: &'static str },
    /// The kernel refused `counter` (`EACCES`, `EPERM`: `kernel.perf_event_paranoid`).
    #[error(
        "hardware counter {counter}: not permitted (kernel.perf_event_paranoid; run with \
         CAP_PERFMON)"
    )]
    CounterNotPermitted { counter: &'static str },
    /// The kernel has no `perf_event_open` (`ENOSYS`).
    #[error("hardware counter {counter}: perf_event_open is not available")]
    NoPerfEventOpen { counter: &'static str },
    /// `perf_event_open` failed for `counter` in another way.
    #[error("hardware counter {counter}: {error}")]
    CounterOpen {
        counter: &'static str,
        error: std::io::Error,
    },
    /// Reading an open counter failed.
    #[error("reading hardware counter {counter}: {error}")]
    CounterRead {
        counter: &'static str,
        error: std::io::Error,
    },
    /// Not Linux: no perf events.
    #[error("hardware counters need Linux perf events")]
    NoPerfEvents,
}

#[cfg(test)]
mod tests {
    use super::Error;

    #[test]
    fn messages_are_the_texts_reports_show() {
        let io = || std::io::Error::other("bad file descriptor");
        let cases = [
            (
                Error::NoCudaDriver,
                "no CUDA driver: libcuda.so is not installed on this machine",
            ),
            (
                Error::NoCudaSupport,
                "this build has no CUDA support (cargo feature `cuda`)",
            ),
            (
                Error::NoNvmlSupport,
                "this build has no NVML support (cargo feature `nvml`)",
            ),
            (
                Error::NvmlUnavailable("libnvidia-ml.so.1: cannot open".into()),
                "NVML is not available (libnvidia-ml.so.1: cannot open): no NVIDIA driver on \
                 this machine?",
            ),
            (
                Error::NoSuchGpu {
                    gpu: crate::gpu::GpuSelect::Index(3),
                    error: "invalid argument".into(),
                },
                "NVML has no device Index(3): invalid argument",
            ),
            (
                Error::CudaCall {
                    call: "recording a CUDA event",
                    error: "not ready".into(),
                },
                "recording a CUDA event: not ready",
            ),
            (
                Error::NoPmu { counter: "cycles" },
                "hardware counter cycles: no hardware PMU is exposed here (a VM without a \
                 virtual PMU?)",
            ),
            (
                Error::CounterNotPermitted { counter: "cycles" },
                "hardware counter cycles: not permitted (kernel.perf_event_paranoid; run with \
                 CAP_PERFMON)",
            ),
            (
                Error::NoPerfEventOpen { counter: "cycles" },
                "hardware counter cycles: perf_event_open is not available",
            ),
            (
                Error::CounterRead {
                    counter: "instructions",
                    error: io(),
                },
                &format!("reading hardware counter instructions: {}", io()),
            ),
        ];
        for (e, text) in cases {
            assert_eq!(e.to_string(), text);
        }
    }
}
