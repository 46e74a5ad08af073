//! Errors of this crate. Each names the source and, where known, the byte offset or node id.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: gzip stream is corrupt or truncated after {decompressed} decompressed bytes: {source}")]
    Gzip {
        path: String,
        decompressed: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not JSON at byte {offset}: {msg}")]
    Syntax {
        path: String,
        offset: u64,
        msg: String,
    },
    #[error("{path}: file ends at byte {offset} inside {context}; the trace is truncated (was the ExecutionTraceObserver unregistered before the process ended?) — {complete} complete nodes were read{last}")]
    Truncated {
        path: String,
        offset: u64,
        context: &'static str,
        complete: usize,
        /// ", the last one id N", or empty.
        last: String,
    },
    #[error("{path}: node {} at byte {offset}: {msg}", node_id.map_or_else(|| "?".to_string(), |i| i.to_string()))]
    Node {
        path: String,
        node_id: Option<u64>,
        offset: u64,
        msg: String,
    },
    #[error("{path}: not an execution trace: {msg}")]
    NotATrace { path: String, msg: String },
    #[error("{path}: duplicate node id {id} (bytes {first_offset} and {second_offset})")]
    DuplicateId {
        path: String,
        id: u64,
        first_offset: u64,
        second_offset: u64,
    },
    #[error("{path}: node {id} points to missing parent {parent}")]
    MissingParent { path: String, id: u64, parent: u64 },
    #[error("{path}: parent links form a cycle through node {id}")]
    Cycle { path: String, id: u64 },
    #[error("{path}: not a Kineto trace: {msg}")]
    NotKineto { path: String, msg: String },
    #[error("{path}: file ends at byte {offset} inside the Kineto trace; it is truncated (was the profiled process killed while the trace was written, or the copy cut short?)")]
    KinetoTruncated { path: String, offset: u64 },
    /// A gzip input inflates to more than the limit of [`crate::ReadOptions`].
    #[error("{path}: the gzip stream inflates to more than {limit} bytes ({}), {why}; raise the limit with {}=SIZE (bytes, or with a K/M/G/T suffix) or ReadOptions::max_decompressed", human_bytes(*.limit), crate::MAX_DECOMPRESSED_ENV)]
    DecompressedTooLarge {
        path: String,
        limit: u64,
        /// How the limit was chosen: the default's rule, or where the explicit value came from.
        why: String,
    },
    /// A limit given in the environment that is not a size.
    #[error("{path}: {source}")]
    TooLarge {
        path: String,
        source: crate::model::ArenaFull,
    },
    #[error("{var}={value:?} is not a size in bytes (examples: 17179869184, 16G, 512M)")]
    BadLimit { var: &'static str, value: String },
}

/// At most `max` bytes of `s` (cut at a character boundary) for quoting in a message, with the
/// full length said when it is cut: input strings can be gigabytes.
pub fn clip(s: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if s.len() <= max {
        return s.into();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &s[..end], s.len()).into()
}

/// How long quoted input and parser messages may be in errors and warnings.
pub(crate) const MSG_MAX: usize = 200;

pub(crate) fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
