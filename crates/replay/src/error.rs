//! Replay's errors: typed, with their sources. A libtorch call fails with a [`CallError`] whose
//! [`ErrorKind`] comes from the C++ exception's type (the shim maps it to a code), so nothing
//! here classifies an error by its message.

use serde::{Deserialize, Serialize};

/// What kind of failure a libtorch call (or the planning of one) met.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The device (or host) ran out of memory (`c10::OutOfMemoryError`, `std::bad_alloc`).
    OutOfMemory,
    /// No kernel for this dtype or device (`c10::NotImplementedError`).
    NotImplemented,
    /// libtorch refused an argument's type or value (`c10::TypeError`, `ValueError`,
    /// `IndexError`).
    InvalidArgument,
    /// The replay cannot build the call: no op schema, an argument type it does not support, a
    /// recorded schema it cannot reconcile with the registered one.
    Unsupported,
    /// No operator of this name and overload is registered (a custom-op library not loaded).
    NoOperator,
    /// The device itself failed (`c10::AcceleratorError`: a CUDA device-side assert, an illegal
    /// address): its context is unusable from here on, so the replay stops.
    DeviceFault,
    /// Any other exception.
    Other,
}

impl ErrorKind {
    /// The kind for a shim return code (see `csrc/shim.cpp`).
    pub(crate) fn from_code(code: i32) -> ErrorKind {
        match code {
            2 => ErrorKind::OutOfMemory,
            3 => ErrorKind::NotImplemented,
            4 => ErrorKind::InvalidArgument,
            5 => ErrorKind::NoOperator,
            6 => ErrorKind::DeviceFault,
            _ => ErrorKind::Other,
        }
    }
}

/// A failed libtorch call or an op that cannot be called.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct CallError {
    pub kind: ErrorKind,
    pub message: String,
}

impl CallError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> CallError {
        CallError {
            kind,
            message: message.into(),
        }
    }

    pub(crate) fn unsupported(message: impl Into<String>) -> CallError {
        CallError::new(ErrorKind::Unsupported, message)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("materialising inputs")]
    Materialise(#[source] CallError),
    #[error("op {op} (node {id}) failed and --strict is set")]
    Strict {
        op: String,
        id: u64,
        #[source]
        source: CallError,
    },
    #[error("{0}")]
    Device(String),
    #[error(
        "the device failed at op {op} (node {id}); CUDA reports such faults late, so an earlier \
         op may have caused it (CUDA_LAUNCH_BLOCKING=1 pins it down)"
    )]
    DeviceFault {
        op: String,
        id: u64,
        #[source]
        source: CallError,
    },
    #[error(
        "the replay needs about {} of memory and {} is available (--force runs it anyway)",
        human(*needed),
        human(*available)
    )]
    Memory { needed: u64, available: u64 },
    /// Stopped before it started by whoever runs it ([`crate::MemoryGate`]), with why.
    #[error("{0}")]
    Stopped(String),
    #[error("rank {rank}: {what}")]
    Dist {
        rank: usize,
        what: String,
        #[source]
        source: CallError,
    },
    /// The members of a process group would issue different collectives: its name, and where.
    #[error(
        "rank {rank}: the ranks' traces disagree on process group {group}: {what}. Run \
         together, the ranks would fail there (Gloo aborts a rank on a collective whose sizes \
         differ between ranks, and waits for one a rank never issues); replay each rank's own \
         trace of one job"
    )]
    RanksDisagree {
        rank: usize,
        group: String,
        what: String,
    },
    #[error(transparent)]
    CommSelect(#[from] crate::plan::CommSelectError),
    /// `--check-collectives` found a collective whose result is not what its inputs make.
    #[error("rank {rank}: collective {op} (node {id}) returned wrong values: {what}")]
    CollectiveMismatch {
        rank: usize,
        op: String,
        id: u64,
        what: String,
    },
    #[error("loading {path}")]
    Library {
        path: String,
        #[source]
        source: CallError,
    },
}

fn human(b: u64) -> String {
    let gib = b as f64 / (1u64 << 30) as f64;
    if gib >= 1.0 {
        format!("{gib:.1} GiB")
    } else {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    }
}
