//! Errors of this crate. Each names the source and, where known, the byte offset or node id.

use thiserror::Error;

/// Why a trace could not be read. Every variant names the input (`path`, as given to the
/// reader), and where it is known, the byte offset or node id.
#[derive(Debug, Error)]
pub enum Error {
    /// The input could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The input.
        path: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The input is not a regular file (a device such as `/dev/zero`, a FIFO, a directory):
    /// such an input can be endless, or block forever. Stdin is read when asked for by `-`.
    #[error("{path} is not a regular file ({kind}): refused (pass a trace file, or - for stdin)")]
    NotAFile {
        /// The input.
        path: String,
        /// What it is instead.
        kind: &'static str,
    },
    /// A gzip input is corrupt or cut short.
    #[error("{path}: gzip stream is corrupt or truncated after {decompressed} decompressed bytes: {source}")]
    Gzip {
        /// The input.
        path: String,
        /// Bytes inflated before the error.
        decompressed: u64,
        /// The decoder's error.
        #[source]
        source: std::io::Error,
    },
    /// The input is not well-formed JSON, or a top-level value has the wrong kind.
    #[error("{path}: not JSON at byte {offset}: {msg}")]
    Syntax {
        /// The input.
        path: String,
        /// Byte offset of the error in the (decompressed) input.
        offset: u64,
        /// The parser's message.
        msg: String,
    },
    /// The input ends inside the trace: the observer did not finish writing it.
    #[error("{path}: file ends at byte {offset} inside {context}; the trace is truncated (was the ExecutionTraceObserver unregistered before the process ended?) — {complete} complete nodes were read{last}")]
    Truncated {
        /// The input.
        path: String,
        /// Where the input ends.
        offset: u64,
        /// What it ends inside: the nodes array or the top-level object.
        context: &'static str,
        /// Node records complete before the end.
        complete: usize,
        /// ", the last one id N", or empty.
        last: String,
    },
    /// A node record is well-formed JSON but not a valid node (a field of the wrong kind,
    /// inputs and types of different lengths...).
    #[error("{path}: node {} at byte {offset}: {msg}", node_id.map_or_else(|| "?".to_string(), |i| i.to_string()))]
    Node {
        /// The input.
        path: String,
        /// The node's id, when it was read.
        node_id: Option<u64>,
        /// Byte offset of the error (or of the record).
        offset: u64,
        /// What is wrong.
        msg: String,
    },
    /// The input is JSON but not an execution trace (no `nodes` array, empty input).
    #[error("{path}: not an execution trace: {msg}")]
    NotATrace {
        /// The input.
        path: String,
        /// What is missing.
        msg: String,
    },
    /// Two nodes have the same id (validation).
    #[error("{path}: duplicate node id {id} (bytes {first_offset} and {second_offset})")]
    DuplicateId {
        /// The input.
        path: String,
        /// The id.
        id: u64,
        /// Byte offset of the first node with it.
        first_offset: u64,
        /// Byte offset of the second.
        second_offset: u64,
    },
    /// A node's parent id names no node (validation).
    #[error("{path}: node {id} points to missing parent {parent}")]
    MissingParent {
        /// The input.
        path: String,
        /// The node.
        id: u64,
        /// The parent id it names.
        parent: u64,
    },
    /// Parent links form a cycle (validation).
    #[error("{path}: parent links form a cycle through node {id}")]
    Cycle {
        /// The input.
        path: String,
        /// A node on the cycle.
        id: u64,
    },
    /// The input is JSON but not a Kineto trace.
    #[error("{path}: not a Kineto trace: {msg}")]
    NotKineto {
        /// The input.
        path: String,
        /// What is missing or wrong.
        msg: String,
    },
    /// The input ends inside the Kineto trace.
    #[error("{path}: file ends at byte {offset} inside the Kineto trace; it is truncated (was the profiled process killed while the trace was written, or the copy cut short?)")]
    KinetoTruncated {
        /// The input.
        path: String,
        /// Where the input ends.
        offset: u64,
    },
    /// A gzip input inflates to more than the limit of [`crate::ReadOptions`].
    #[error("{path}: the gzip stream inflates to more than {limit} bytes ({}), {why}; raise the limit with {}=SIZE (bytes, or with a K/M/G/T suffix) or ReadOptions::max_decompressed", human_bytes(*.limit), crate::MAX_DECOMPRESSED_ENV)]
    DecompressedTooLarge {
        /// The input.
        path: String,
        /// The limit (bytes).
        limit: u64,
        /// How the limit was chosen: the default's rule, or where the explicit value came from.
        why: String,
    },
    /// The trace holds more values than the model's 32-bit arena indices can address.
    #[error("{path}: {source}")]
    TooLarge {
        /// The input.
        path: String,
        /// Which arena is full.
        source: crate::model::ArenaFull,
    },
    /// A limit given in the environment that is not a size.
    #[error("{var}={value:?} is not a size in bytes (examples: 17179869184, 16G, 512M)")]
    BadLimit {
        /// The environment variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
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

/// A result whose error is this crate's [`Error`](enum@Error) by default.
pub type Result<T, E = Error> = std::result::Result<T, E>;
