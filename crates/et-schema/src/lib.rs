//! # et-schema
//!
//! The file model of PyTorch execution traces (ET, written by
//! `torch.profiler.ExecutionTraceObserver`) and Kineto traces, with fast parsers.
//!
//! * every ET layout: flat 1.0.0/1.0.1 and nested 1.0.2-chakra.0.0.4 .. 1.1.1-chakra.0.0.4;
//! * `.json`, `.json.gz` (by magic bytes) and stdin;
//! * a compact model: interned strings, flat arenas ([`Trace`]);
//! * parsers for ET type strings ([`ValueType`]) and TorchScript operator schemas ([`OpSchema`]);
//! * a writer that round-trips the model ([`write_trace`]).
//!
//! Cargo features: `testkit` (the `testkit` module: builders for hand-written traces in tests),
//! `bench-hooks` (`records_read_by_visitors`, for tests of the parser) and `simd` (also
//! `record_bench`, the parse benchmark's per-record timings; needs simd-json).
//!
//! This crate never links libtorch and keeps its dependencies few: others build on it.
//!
//! Hostile input is refused, not obeyed: nesting deeper than [`MAX_NESTING`] is an error naming
//! where it is (the same on every thread), gzip input inflates only up to a limit
//! ([`ReadOptions`], `MYSTIQUE_MAX_DECOMPRESSED`), the parallel parser's probing is budgeted,
//! hash tables keyed by the file's strings and ids are keyed per process, input quoted in
//! messages is cut ([`clip`]), and Kineto events with impossible times are dropped with a
//! counted warning ([`kineto::parse_kineto`]).

#![warn(missing_docs)]

mod dtype;
mod error;
mod intern;
pub mod kineto;
mod model;
mod opschema;
mod parse;
mod scan;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
mod types;
mod write;

/// The deepest nesting any reader of this crate accepts: brackets in a type string
/// (`Tuple[Tuple[...]]`), wrappers in an op schema type (`(((Tensor)))`, `Tensor[][]`, `Tensor??`),
/// and JSON arrays/objects inside one node record or one Kineto event (serde_json's limit,
/// which is the same 128). Deeper input is an error naming where it is, never a stack overflow,
/// and the limit is the same on every parser thread (they run with [`PARSER_STACK`] bytes of
/// stack), so the model does not depend on the number of threads.
pub const MAX_NESTING: usize = 128;

/// Stack size of the parser's worker threads: the usual main-thread size, far more than
/// [`MAX_NESTING`] levels of any parser here need (tested unoptimised on 1 MiB, half of what
/// a spawned thread gets by default).
pub const PARSER_STACK: usize = 8 << 20;

pub use dtype::DType;
pub use error::{clip, Error, Result};
pub use intern::{Interner, KeyedState, Sym};
pub use model::{
    ArenaFull, Arg, ExtraAttr, IdIndex, Layout, Node, NodeFlags, TensorRef, Trace, TraceMeta,
    Value, ARENA_MAX, KNOWN_SCHEMAS,
};
pub use opschema::{AliasInfo, OpSchema, SchemaArg, SchemaParseError, SchemaType};
#[cfg(feature = "simd")]
pub use parse::record_bench;
#[cfg(feature = "bench-hooks")]
pub use parse::records_read_by_visitors;
pub use parse::{
    decompress, decompress_with, not_a_file, open_input, parse_input, parse_trace, read_input,
    read_input_with, read_trace, read_trace_with, validate, Input, ParseOptions, ReadOptions,
    DEFAULT_MAX_DECOMPRESSED, MAX_DECOMPRESSED_ENV,
};
pub use types::{TypeParseError, ValueType};
pub use write::{write_trace, write_trace_to_vec};
