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
//! This crate never links libtorch and keeps its dependencies few: others build on it.

mod dtype;
mod error;
mod intern;
pub mod kineto;
mod model;
mod opschema;
mod parse;
mod scan;
/// Builders for hand-written traces in tests; only with the cargo feature `testkit`.
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
mod types;
mod write;

pub use dtype::DType;
pub use error::{Error, Result};
pub use intern::{Interner, Sym};
pub use model::*;
pub use opschema::{AliasInfo, OpSchema, SchemaArg, SchemaParseError, SchemaType};
pub use parse::{
    decompress, parse_trace, read_input, read_trace, read_trace_with, validate, ParseOptions,
};
pub use types::{TypeParseError, ValueType};
pub use write::{write_trace, write_trace_to_vec};
