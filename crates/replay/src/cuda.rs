//! The CUDA backend's runtime (cargo feature `cuda`): cudarc bound to the device's primary
//! context (the one libtorch uses), a replay stream made libtorch's current stream on the replay
//! thread, CUDA events on that stream, and an arena for the external inputs.
//!
//! Why an arena for the external inputs: they live for the whole replay, like a model's
//! parameters and batch, so one stream-ordered allocation (`cuMemAllocAsync` from the device's
//! default pool, where supported) holds them all, carved at 256-byte boundaries and wrapped with
//! `from_blob`; none of them sits in, or fragments, libtorch's caching allocator, which serves
//! the intermediates as it served the original model's. The arena outlives every tensor over it:
//! each storage holds a reference.
//!
//! libcuda is loaded at run time; [`runtime`] checks for it before the first driver call
//! (cudarc panics otherwise) and says what is missing.

use crate::error::CallError;
use crate::ffi;
use crate::plan::TensorSpec;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use std::sync::{Arc, Mutex, OnceLock};
use tch::Tensor;

/// One device's context and replay stream, for the life of the process.
pub struct Runtime {
    pub ordinal: usize,
    /// The device's name (`NVIDIA H200`).
    pub name: String,
    /// `GPU-xxxxxxxx-...`, as NVML names the same device.
    pub uuid: String,
    stream: Arc<CudaStream>,
}

/// The runtime of device `ordinal`, created once.
pub fn runtime(ordinal: usize) -> Result<Arc<Runtime>, String> {
    static RUNTIMES: OnceLock<Mutex<Vec<Option<Arc<Runtime>>>>> = OnceLock::new();
    let mut all = RUNTIMES
        .get_or_init(|| Mutex::new(Vec::new()))
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(Some(r)) = all.get(ordinal) {
        return Ok(r.clone());
    }
    // Loads libcuda (by name) and asks the driver: only when a runtime is first made.
    let n = metrics::cuda::driver_devices().map_err(|e| e.to_string())?;
    if ordinal >= n {
        return Err(format!(
            "cuda:{ordinal} does not exist (the driver sees {n} CUDA devices)"
        ));
    }
    if all.len() <= ordinal {
        all.resize(ordinal + 1, None);
    }
    let ctx = CudaContext::new(ordinal).map_err(|e| format!("cuda:{ordinal}: {e}"))?;
    // One stream does all the work; cudarc's cross-stream event tracking would only add events.
    // SAFETY: nothing of this context is used from another stream.
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx
        .new_stream()
        .map_err(|e| format!("cuda:{ordinal}: creating the replay stream: {e}"))?;
    let uuid = ctx
        .uuid()
        .map(|u| {
            let b: Vec<u8> = u.bytes.iter().map(|&c| c as u8).collect();
            let h = |r: std::ops::Range<usize>| {
                b[r].iter().map(|x| format!("{x:02x}")).collect::<String>()
            };
            format!(
                "GPU-{}-{}-{}-{}-{}",
                h(0..4),
                h(4..6),
                h(6..8),
                h(8..10),
                h(10..16)
            )
        })
        .unwrap_or_default();
    let rt = Arc::new(Runtime {
        ordinal,
        name: ctx.name().unwrap_or_else(|_| "CUDA device".into()),
        uuid,
        stream,
    });
    all[ordinal] = Some(rt.clone());
    Ok(rt)
}

impl Runtime {
    /// Makes the replay stream libtorch's current stream on this thread (per thread in libtorch).
    pub fn make_current(&self) -> Result<(), String> {
        self.stream
            .context()
            .bind_to_thread()
            .map_err(|e| format!("cuda:{}: {e}", self.ordinal))?;
        // SAFETY: the stream lives in a process-wide runtime that is never dropped.
        unsafe { ffi::cuda_set_stream(self.stream.cu_stream().cast(), self.ordinal) }.map_err(|e| {
            format!(
                "cuda:{}: making the replay stream current: {e}",
                self.ordinal
            )
        })
    }

    /// Free device memory (bytes), as the driver reports it.
    pub fn free_memory(&self) -> Option<u64> {
        self.stream
            .context()
            .mem_get_info()
            .ok()
            .map(|(free, _)| free as u64)
    }

    /// CUDA events on the replay stream.
    pub fn timer(&self) -> metrics::cuda::EventTimer {
        metrics::cuda::EventTimer::new(self.stream.clone())
    }

    /// One allocation of `bytes` on the replay stream, to carve external inputs from.
    pub fn arena(&self, bytes: usize) -> Result<Arena, String> {
        // SAFETY: the memory is uninitialised; every view over it is filled before use.
        let slice = unsafe { self.stream.alloc::<u8>(bytes.max(1)) }
            .map_err(|e| format!("cuda:{}: allocating {bytes} bytes: {e}", self.ordinal))?;
        // Event tracking is off, so the guard records nothing.
        let ptr = slice.device_ptr(&self.stream).0;
        Ok(Arena {
            mem: Arc::new(ArenaMem { _slice: slice, ptr }),
            ordinal: self.ordinal,
            bytes,
        })
    }
}

struct ArenaMem {
    /// Freed (stream-ordered) when the last tensor over it is gone.
    _slice: CudaSlice<u8>,
    ptr: u64,
}

impl Drop for ArenaMem {
    fn drop(&mut self) {
        // The last tensor may die on a thread without a current context: cudarc's free would
        // then fail and leave its error to surface at the next unrelated call (a CUDA event),
        // silently switching the timer to the host clock.
        let ctx = self._slice.context().clone();
        let _ = ctx.bind_to_thread();
        // `_slice` is freed after this returns; check for an error it left then.
        let _ = ctx.check_err();
    }
}

/// Device memory that external inputs are carved from.
pub struct Arena {
    mem: Arc<ArenaMem>,
    ordinal: usize,
    pub bytes: usize,
}

impl Arena {
    /// A tensor of `spec`'s shape, strides and dtype at `offset` bytes into the arena.
    pub fn tensor(&self, offset: usize, spec: &TensorSpec) -> Result<Tensor, CallError> {
        // A view past the arena would read and write memory that is not the input's: refused
        // (the materialiser sizes the arena from the same specs, so this is a bug's guard).
        if offset as u64 + spec.bytes() > self.bytes as u64 {
            return Err(CallError::new(
                crate::error::ErrorKind::Other,
                format!(
                    "arena overrun: an input of {} bytes at offset {offset} of a {}-byte arena",
                    spec.bytes(),
                    self.bytes
                ),
            ));
        }
        // SAFETY: the view lies inside the arena (checked above), whose memory the storage keeps
        // alive through its Arc.
        unsafe {
            ffi::from_blob(
                (self.mem.ptr + offset as u64) as *mut std::ffi::c_void,
                &spec.shape,
                &spec.strides,
                spec.dtype.scalar_type_code() as i32,
                tch::Device::Cuda(self.ordinal),
                self.mem.clone(),
            )
        }
    }
}
