//! The CUDA backend when the `cuda` feature is off: the same types, and [`runtime`] says the
//! build has no CUDA backend, so every caller compiles and fails cleanly (candle's dummy
//! backend).

use crate::error::CallError;
use crate::plan::TensorSpec;
use std::convert::Infallible;
use std::sync::Arc;
use tch::Tensor;

pub struct Runtime {
    pub ordinal: usize,
    pub name: String,
    pub uuid: String,
    never: Infallible,
}

pub fn runtime(_ordinal: usize) -> Result<Arc<Runtime>, String> {
    Err("this build has no CUDA backend (cargo feature `cuda` of the replay crate)".into())
}

impl Runtime {
    pub fn make_current(&self) -> Result<(), String> {
        match self.never {}
    }

    pub fn free_memory(&self) -> Option<u64> {
        match self.never {}
    }

    pub fn timer(&self) -> metrics::cuda::EventTimer {
        match self.never {}
    }

    pub fn arena(&self, _bytes: usize) -> Result<Arena, String> {
        match self.never {}
    }
}

pub struct Arena {
    pub bytes: usize,
    never: Infallible,
}

impl Arena {
    pub fn tensor(&self, _offset: usize, _spec: &TensorSpec) -> Result<Tensor, CallError> {
        match self.never {}
    }
}
