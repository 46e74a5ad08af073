//! # et-graph
//!
//! Analysis of PyTorch execution traces on top of [`et_schema`]: trace summaries now; call tree,
//! data dependencies, op classes, tensor lifetimes, selection and composition as they land.
//!
//! Architecture invariant: depends on `et-schema` only, never on libtorch.

pub mod summary;

pub use summary::{Summary, TensorStats};
