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
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
