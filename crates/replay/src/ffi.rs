//! Safe wrappers over the C++ boxed-dispatch shim (`csrc/shim.cpp`). Calls that can fail return
//! a code for the exception's type, turned into a typed [`CallError`] here.

use crate::error::{CallError, ErrorKind};
use std::ffi::{c_char, c_void, CStr, CString};
use std::ptr::NonNull;
use tch::Tensor;
use torch_sys::C_tensor;

#[repr(C)]
pub struct MqStack {
    _private: [u8; 0],
}

extern "C" {
    fn mq_last_error() -> *const c_char;
    fn mq_find_op(name: *const c_char, overload: *const c_char, code: *mut i32) -> *mut c_void;
    fn mq_op_free(op: *mut c_void);
    fn mq_op_schema(op: *mut c_void) -> *const c_char;
    fn mq_push_default(st: *mut MqStack, op: *mut c_void, i: i64) -> i32;
    fn mq_stack_new() -> *mut MqStack;
    fn mq_stack_free(st: *mut MqStack);
    fn mq_stack_clear(st: *mut MqStack);
    fn mq_stack_len(st: *mut MqStack) -> usize;
    fn mq_push_none(st: *mut MqStack);
    fn mq_push_tensor(st: *mut MqStack, t: *const C_tensor);
    fn mq_push_undefined_tensor(st: *mut MqStack);
    fn mq_push_int(st: *mut MqStack, v: i64);
    fn mq_push_double(st: *mut MqStack, v: f64);
    fn mq_push_bool(st: *mut MqStack, v: bool);
    fn mq_push_string(st: *mut MqStack, v: *const c_char);
    fn mq_push_scalar_int(st: *mut MqStack, v: i64);
    fn mq_push_scalar_double(st: *mut MqStack, v: f64);
    fn mq_push_scalar_bool(st: *mut MqStack, v: bool);
    fn mq_push_int_list(st: *mut MqStack, v: *const i64, n: usize);
    fn mq_push_double_list(st: *mut MqStack, v: *const f64, n: usize);
    fn mq_push_bool_list(st: *mut MqStack, v: *const u8, n: usize);
    fn mq_push_tensor_list(st: *mut MqStack, v: *const *const C_tensor, n: usize);
    fn mq_push_opt_tensor_list(st: *mut MqStack, v: *const *const C_tensor, n: usize);
    fn mq_push_tensor_lists(
        st: *mut MqStack,
        v: *const *const C_tensor,
        lens: *const usize,
        n: usize,
    );
    fn mq_stack_flat_len(st: *mut MqStack, i: usize) -> usize;
    fn mq_stack_flat_tensor(st: *mut MqStack, i: usize, k: usize) -> *mut C_tensor;
    fn mq_push_device(st: *mut MqStack, ty: i32, index: i32);
    fn mq_push_scalar_list(st: *mut MqStack, v: *const f64, n: usize);
    fn mq_call(op: *mut c_void, st: *mut MqStack, grad: i32) -> i32;
    fn mq_call_autocast(
        op: *mut c_void,
        st: *mut MqStack,
        grad: i32,
        device_type: i32,
        dtype: i32,
    ) -> i32;
    fn mq_set_requires_grad(t: *mut C_tensor) -> i32;
    fn mq_set_wrapped_number(t: *mut C_tensor) -> i32;
    fn mq_stack_kind(st: *mut MqStack, i: usize) -> i32;
    fn mq_stack_tensor(st: *mut MqStack, i: usize) -> *mut C_tensor;
    fn mq_stack_list_len(st: *mut MqStack, i: usize) -> usize;
    fn mq_stack_list_tensor(st: *mut MqStack, i: usize, k: usize) -> *mut C_tensor;
    fn mq_empty_strided(
        size: *const i64,
        stride: *const i64,
        ndim: usize,
        dtype: i32,
        dev_type: i32,
        dev_index: i32,
        code: *mut i32,
    ) -> *mut C_tensor;
    #[cfg(feature = "cuda")]
    fn mq_from_blob(
        data: *mut c_void,
        size: *const i64,
        stride: *const i64,
        ndim: usize,
        dtype: i32,
        dev_type: i32,
        dev_index: i32,
        ctx: *mut c_void,
        release: unsafe extern "C" fn(*mut c_void),
        code: *mut i32,
    ) -> *mut C_tensor;
    #[cfg(feature = "cuda")]
    fn mq_cuda_set_stream(stream: *mut c_void, device: i32) -> i32;
    fn mq_cuda_memory_stats(device: i32, out: *mut i64) -> i32;
    fn mq_cuda_reset_peak(device: i32) -> i32;
    fn mq_load_library(path: *const c_char) -> i32;
    fn mq_flush_denormal() -> i32;
    fn mq_alloc_count_install() -> i32;
    fn mq_alloc_count_reset();
    fn mq_record_function(on: i32) -> i32;
    fn mq_step_scope_begin(n: i64) -> *mut c_void;
    fn mq_step_scope_end(scope: *mut c_void);
    fn mq_alloc_count_read(now: *mut i64, peak: *mut i64);
    fn mq_storage_info(t: *const C_tensor, ptr: *mut usize, nbytes: *mut usize);
    fn mq_storage_use_count(t: *const C_tensor) -> usize;
    fn mq_has_grad_fn(t: *const C_tensor) -> i32;
    fn mq_instr_begin(
        et_path: *const c_char,
        cuda: i32,
        record_shapes: i32,
        profile_memory: i32,
    ) -> i32;
    fn mq_probe_record_function(n: i32, tensors: i32) -> f64;
    fn mq_probe_op(kernel_ns: *mut f64, unix_ns: *mut i64) -> f64;
    fn mq_probe_call(op: *mut c_void, st: *mut MqStack, seq: i64) -> f64;
    fn mq_probe_boxed_add(seq: i64) -> f64;
    fn mq_probe_nodes(k: i32) -> f64;
    fn mq_instr_end() -> *mut MqEvents;
    fn mq_events_len(ev: *const MqEvents) -> usize;
    fn mq_events_self_tid(ev: *const MqEvents) -> u64;
    fn mq_event(
        ev: *const MqEvents,
        i: usize,
        start_ns: *mut u64,
        end_ns: *mut u64,
        tid: *mut u64,
        gpu: *mut u8,
        seq: *mut i64,
    ) -> *const c_char;
    fn mq_events_free(ev: *mut MqEvents);
    fn mq_dist_init(
        host: *const c_char,
        local: *const c_char,
        port: i32,
        rank: i32,
        size: i32,
        timeout_ms: i64,
        cuda_mode: i32,
        serve: i32,
        prefix: *const c_char,
        code: *mut i32,
    ) -> *mut MqComm;
    fn mq_dist_new_group(c: *mut MqComm, name: *const c_char, ranks: *const i64, n: usize) -> i64;
    fn mq_dist_free(c: *mut MqComm);
    fn mq_push_group(st: *mut MqStack, c: *mut MqComm, g: i64) -> i32;
    fn mq_push_reduce_op(st: *mut MqStack, op: i32);
    fn mq_stack_wait_works(st: *mut MqStack, timeout_ms: i64) -> i32;
    fn mq_stack_take_works(st: *mut MqStack) -> *mut MqWorks;
    fn mq_works_wait(w: *mut MqWorks, timeout_ms: i64) -> i32;
    fn mq_works_free(w: *mut MqWorks);
}

#[repr(C)]
pub struct MqWorks {
    _private: [u8; 0],
}

/// A collective's outstanding work, waited for where the trace waits.
pub struct Works(NonNull<MqWorks>);

// SAFETY: c10d Work handles are thread-safe; one owner at a time.
unsafe impl Send for Works {}

impl Works {
    pub fn wait(self, timeout: std::time::Duration) -> Result<(), CallError> {
        // SAFETY: a live handle list from mq_stack_take_works; freed once, in Drop.
        match unsafe { mq_works_wait(self.0.as_ptr(), timeout.as_millis() as i64) } {
            0 => Ok(()),
            code => Err(call_error(code)),
        }
    }
}

impl Drop for Works {
    fn drop(&mut self) {
        // SAFETY: allocated by mq_stack_take_works, freed once.
        unsafe { mq_works_free(self.0.as_ptr()) }
    }
}

#[repr(C)]
pub struct MqComm {
    _private: [u8; 0],
}

/// How collectives on CUDA tensors run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CudaComm {
    /// A CPU replay: Gloo for CPU tensors only.
    None,
    /// Gloo for CUDA tensors too (staged through the host): ranks may share a GPU.
    Gloo,
    /// NCCL for CUDA tensors: one GPU per rank.
    Nccl,
}

/// This rank's membership of the replay's process groups: a TCPStore rendezvous and one Gloo
/// process group per group of the trace (the world first), with NCCL or Gloo for CUDA tensors.
pub struct Comm {
    ptr: NonNull<MqComm>,
    pub rank: usize,
    pub size: usize,
    pub cuda: CudaComm,
}

// SAFETY: the process groups are thread-safe c10d objects; a Comm is used by one thread at a time.
unsafe impl Send for Comm {}

impl Comm {
    /// Joins the world at `host:port` (serving the store there where `serve`), its keys under
    /// `prefix`, its Gloo connections on this host's address `local`; blocks until every rank
    /// has.
    #[allow(clippy::too_many_arguments)]
    pub fn init(
        host: &str,
        local: &str,
        port: u16,
        rank: usize,
        size: usize,
        timeout: std::time::Duration,
        cuda: CudaComm,
        serve: bool,
        prefix: &str,
    ) -> Result<Comm, CallError> {
        let h = c_string(host)?;
        let l = c_string(local)?;
        let pre = c_string(prefix)?;
        let mut code = 0;
        // SAFETY: a valid C string; the shim returns null and sets code on failure.
        let p = unsafe {
            mq_dist_init(
                h.as_ptr(),
                l.as_ptr(),
                port as i32,
                rank as i32,
                size as i32,
                timeout.as_millis() as i64,
                cuda as i32,
                serve as i32,
                pre.as_ptr(),
                &mut code,
            )
        };
        NonNull::new(p)
            .map(|ptr| Comm {
                ptr,
                rank,
                size,
                cuda,
            })
            .ok_or_else(|| call_error(code))
    }

    /// Creates a subgroup of global ranks (every rank calls this, in the same order); returns
    /// its index.
    pub fn new_group(&mut self, name: &str, ranks: &[i64]) -> Result<i64, CallError> {
        let n = c_string(name)?;
        // SAFETY: live comm, valid string and slice.
        match unsafe {
            mq_dist_new_group(self.ptr.as_ptr(), n.as_ptr(), ranks.as_ptr(), ranks.len())
        } {
            -1 => Err(call_error(1)),
            i => Ok(i),
        }
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // SAFETY: allocated by mq_dist_init, freed once.
        unsafe { mq_dist_free(self.ptr.as_ptr()) }
    }
}

#[repr(C)]
struct MqEvents {
    _private: [u8; 0],
}

/// The shim's view of a tensor list: a null pointer for `None`.
fn tensor_ptrs(v: &[Option<&Tensor>]) -> Vec<*const C_tensor> {
    v.iter()
        .map(|t| t.map_or(std::ptr::null(), |t| t.as_ptr()))
        .collect()
}

/// Flushes denormal floats to zero on the calling thread; false where the CPU cannot.
pub fn flush_denormal() -> bool {
    // SAFETY: no arguments; sets the calling thread's floating-point control flags.
    unsafe { mq_flush_denormal() != 0 }
}

/// Makes c10's CPU allocator count what it holds (see the shim): the replay's CPU memory on
/// the basis of the profiler's memory events. Idempotent; an error where another allocator
/// took precedence.
pub fn alloc_count_install() -> Result<(), String> {
    // SAFETY: no arguments; installs a process-wide allocator once.
    match unsafe { mq_alloc_count_install() } {
        0 => Ok(()),
        _ => Err(last_error()),
    }
}

/// Starts a counting window: what is allocated from now counts until it is freed.
pub fn alloc_count_reset() {
    // SAFETY: no arguments; resets atomic counters.
    unsafe { mq_alloc_count_reset() }
}

/// While it lives, this thread's ops run without RecordFunction: the profiler and the
/// execution trace observer do not see them. For the replay's own bookkeeping, which the
/// original did not dispatch (its autograd unpacked what it saved without an op).
pub struct Unrecorded {
    was: bool,
}

impl Unrecorded {
    pub fn new() -> Self {
        // SAFETY: sets a thread-local flag; no arguments to check.
        let was = unsafe { mq_record_function(0) } != 0;
        Unrecorded { was }
    }
}

impl Default for Unrecorded {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Unrecorded {
    fn drop(&mut self) {
        // SAFETY: as in `new`.
        unsafe { mq_record_function(i32::from(self.was)) };
    }
}

/// The name `torch.profiler.profile.step()` gives the scope around each profiled iteration,
/// less its number.
pub const STEP_SCOPE_PREFIX: &str = "ProfilerStep#";

/// While it lives, a `ProfilerStep#N` user scope is open, as `torch.profiler.profile.step()`
/// opens one around each profiled iteration: the instrumented iterations' edges (from its start
/// to the first op, from the last op to its end) then cost here what the capture's did.
pub struct StepScope(*mut c_void);

impl StepScope {
    pub fn open(n: usize) -> Self {
        // SAFETY: the shim catches every exception; null where no callback is active.
        StepScope(unsafe { mq_step_scope_begin(n as i64) })
    }
}

impl Drop for StepScope {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: a scope `mq_step_scope_begin` made, ended once.
            unsafe { mq_step_scope_end(self.0) };
        }
    }
}

/// The counting window's bytes held now and at its peak.
pub fn alloc_count_read() -> (i64, i64) {
    let (mut now, mut peak) = (0i64, 0i64);
    // SAFETY: the shim writes two integers.
    unsafe { mq_alloc_count_read(&mut now, &mut peak) };
    (now, peak)
}

/// (storage data pointer, storage bytes) of a tensor; (0, 0) when it has none.
pub fn storage_info(t: &Tensor) -> (usize, usize) {
    let (mut p, mut n) = (0usize, 0usize);
    // SAFETY: a live tensor; the shim writes two integers.
    unsafe { mq_storage_info(t.as_ptr(), &mut p, &mut n) };
    (p, n)
}

/// Whether `t` is the output of a recorded autograd node.
pub fn has_grad_fn(t: &Tensor) -> bool {
    // SAFETY: a live tensor; the shim only reads it.
    unsafe { mq_has_grad_fn(t.as_ptr()) != 0 }
}

/// How many holders `t`'s storage has (tensors viewing it, work holding them); 0 without one.
pub fn storage_use_count(t: &Tensor) -> usize {
    // SAFETY: a live tensor; the shim only reads its storage's reference count.
    unsafe { mq_storage_use_count(t.as_ptr()) }
}

/// A string for the shim; one with a NUL byte cannot be passed (an unsupported argument).
fn c_string(s: impl Into<Vec<u8>>) -> Result<CString, CallError> {
    CString::new(s).map_err(|e| CallError::unsupported(e.to_string()))
}

/// The error of the last failed shim call on this thread, typed by its return code.
fn call_error(code: i32) -> CallError {
    CallError::new(ErrorKind::from_code(code), last_error())
}

fn last_error() -> String {
    // SAFETY: mq_last_error returns a pointer into a thread-local std::string that lives until
    // the next shim call on this thread; it is copied at once.
    unsafe { CStr::from_ptr(mq_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// A resolved operator (a c10::OperatorHandle).
pub struct Op(NonNull<c_void>);

// SAFETY: an OperatorHandle is an immutable reference into the global dispatcher.
unsafe impl Send for Op {}
unsafe impl Sync for Op {}

impl Op {
    /// Finds `name.overload` (e.g. `aten::add`, `Tensor`) in the dispatcher.
    pub fn find(name: &str, overload: &str) -> Result<Op, CallError> {
        let n = c_string(name)?;
        let o = c_string(overload)?;
        let mut code = 0;
        // SAFETY: valid NUL-terminated strings; the shim returns null on failure and sets code.
        NonNull::new(unsafe { mq_find_op(n.as_ptr(), o.as_ptr(), &mut code) })
            .map(Op)
            .ok_or_else(|| call_error(code))
    }

    /// The schema this libtorch registered for the operator.
    pub fn schema(&self) -> String {
        // SAFETY: a thread-local string in the shim, copied at once.
        unsafe { CStr::from_ptr(mq_op_schema(self.0.as_ptr())) }
            .to_string_lossy()
            .into_owned()
    }
}

impl Drop for Op {
    fn drop(&mut self) {
        // SAFETY: allocated by mq_find_op, freed once.
        unsafe { mq_op_free(self.0.as_ptr()) }
    }
}

/// What a result on the stack is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    None,
    Tensor,
    TensorList,
    /// A list of tensor lists (`Tensor[][]`).
    TensorLists,
    Other,
}

/// A reusable IValue stack.
pub struct Stack(NonNull<MqStack>);

impl Default for Stack {
    fn default() -> Self {
        // SAFETY: the shim allocates a fresh stack.
        Stack(NonNull::new(unsafe { mq_stack_new() }).expect("allocating an IValue stack"))
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: allocated by mq_stack_new, freed once.
        unsafe { mq_stack_free(self.0.as_ptr()) }
    }
}

// All pushes copy their data into the C++ stack before returning.
impl Stack {
    fn p(&self) -> *mut MqStack {
        self.0.as_ptr()
    }
    pub fn clear(&mut self) {
        unsafe { mq_stack_clear(self.p()) }
    }
    pub fn len(&self) -> usize {
        unsafe { mq_stack_len(self.p()) }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn none(&mut self) {
        unsafe { mq_push_none(self.p()) }
    }
    pub fn tensor(&mut self, t: &Tensor) {
        unsafe { mq_push_tensor(self.p(), t.as_ptr()) }
    }
    pub fn undefined_tensor(&mut self) {
        unsafe { mq_push_undefined_tensor(self.p()) }
    }
    pub fn int(&mut self, v: i64) {
        unsafe { mq_push_int(self.p(), v) }
    }
    pub fn double(&mut self, v: f64) {
        unsafe { mq_push_double(self.p(), v) }
    }
    pub fn bool(&mut self, v: bool) {
        unsafe { mq_push_bool(self.p(), v) }
    }
    pub fn string(&mut self, v: &CStr) {
        unsafe { mq_push_string(self.p(), v.as_ptr()) }
    }
    pub fn scalar_int(&mut self, v: i64) {
        unsafe { mq_push_scalar_int(self.p(), v) }
    }
    pub fn scalar_double(&mut self, v: f64) {
        unsafe { mq_push_scalar_double(self.p(), v) }
    }
    pub fn scalar_bool(&mut self, v: bool) {
        unsafe { mq_push_scalar_bool(self.p(), v) }
    }
    pub fn int_list(&mut self, v: &[i64]) {
        unsafe { mq_push_int_list(self.p(), v.as_ptr(), v.len()) }
    }
    pub fn double_list(&mut self, v: &[f64]) {
        unsafe { mq_push_double_list(self.p(), v.as_ptr(), v.len()) }
    }
    pub fn bool_list(&mut self, v: &[u8]) {
        unsafe { mq_push_bool_list(self.p(), v.as_ptr(), v.len()) }
    }
    pub fn scalar_list(&mut self, v: &[f64]) {
        unsafe { mq_push_scalar_list(self.p(), v.as_ptr(), v.len()) }
    }
    /// `None` entries become undefined tensors.
    pub fn tensor_list(&mut self, v: &[Option<&Tensor>]) {
        let ptrs = tensor_ptrs(v);
        unsafe { mq_push_tensor_list(self.p(), ptrs.as_ptr(), ptrs.len()) }
    }
    /// Lists of tensors (`Tensor[][]`); `None` entries become undefined tensors.
    pub fn tensor_lists(&mut self, v: &[Vec<Option<&Tensor>>]) {
        let lens: Vec<usize> = v.iter().map(Vec::len).collect();
        let ptrs: Vec<*const C_tensor> = v.iter().flat_map(|l| tensor_ptrs(l)).collect();
        // SAFETY: `ptrs` holds sum(lens) live tensor pointers (or nulls); the shim copies them.
        unsafe { mq_push_tensor_lists(self.p(), ptrs.as_ptr(), lens.as_ptr(), lens.len()) }
    }

    /// The tensors of a list of tensor lists at `i`, flattened in order.
    pub fn take_flat(&self, i: usize) -> Vec<Tensor> {
        let n = unsafe { mq_stack_flat_len(self.p(), i) };
        (0..n)
            // SAFETY: each call returns a new heap at::Tensor that tch takes ownership of.
            .map(|k| unsafe { Tensor::from_ptr(mq_stack_flat_tensor(self.p(), i, k)) })
            .collect()
    }

    /// `None` entries stay None (`Tensor?[]`).
    pub fn opt_tensor_list(&mut self, v: &[Option<&Tensor>]) {
        let ptrs = tensor_ptrs(v);
        unsafe { mq_push_opt_tensor_list(self.p(), ptrs.as_ptr(), ptrs.len()) }
    }
    pub fn device(&mut self, d: tch::Device) {
        let (ty, idx) = match d {
            tch::Device::Cuda(i) => (1, i as i32),
            _ => (0, -1),
        };
        unsafe { mq_push_device(self.p(), ty, idx) }
    }
    /// Pushes process group `g` of `comm`.
    pub fn group(&mut self, comm: &Comm, g: i64) -> Result<(), CallError> {
        // SAFETY: live stack and comm.
        match unsafe { mq_push_group(self.p(), comm.ptr.as_ptr(), g) } {
            0 => Ok(()),
            code => Err(call_error(code)),
        }
    }

    pub fn reduce_op(&mut self, op: u8) {
        unsafe { mq_push_reduce_op(self.p(), op as i32) }
    }

    /// Takes the Work handles among the results, to wait for later (`None` when there are none).
    pub fn take_works(&mut self) -> Option<Works> {
        // SAFETY: live stack; the shim returns null or a list the Works owns.
        NonNull::new(unsafe { mq_stack_take_works(self.p()) }).map(Works)
    }

    /// Waits for the Work handles among the results (a collective's async work).
    pub fn wait_works(&mut self, timeout: std::time::Duration) -> Result<(), CallError> {
        // SAFETY: live stack; the shim catches every C++ exception.
        match unsafe { mq_stack_wait_works(self.p(), timeout.as_millis() as i64) } {
            0 => Ok(()),
            code => Err(call_error(code)),
        }
    }

    /// Pushes the schema default of argument `i` of `op`.
    pub fn default_of(&mut self, op: &Op, i: usize) -> Result<(), CallError> {
        match unsafe { mq_push_default(self.p(), op.0.as_ptr(), i as i64) } {
            0 => Ok(()),
            code => Err(call_error(code)),
        }
    }

    /// Calls `op` with the arguments on the stack; results replace them. `grad`: with autograd
    /// recording the call, as the original's forward ops were.
    pub fn call(&mut self, op: &Op, grad: bool) -> Result<(), CallError> {
        // SAFETY: live op and stack; the shim catches every C++ exception.
        match unsafe { mq_call(op.0.as_ptr(), self.p(), grad as i32) } {
            0 => Ok(()),
            code => Err(call_error(code)),
        }
    }

    /// The record-function scope that calling `op` on this stack opens, opened and closed with
    /// the stack's inputs but without the call (the stack is left as it is), timed (µs;
    /// negative if it could not be): under the instrumentation, what its callbacks cost this
    /// op with these inputs. Its event carries the tag `PROBE_SEQ + pos` ([`PROBE_SEQ`]).
    pub fn probe_call(&mut self, op: &Op, pos: usize) -> f64 {
        // SAFETY: live op and stack, read only; the shim catches every C++ exception.
        us_of(unsafe { mq_probe_call(op.0.as_ptr(), self.p(), PROBE_SEQ + pos as i64) })
    }

    /// [`Stack::call`] under autocast to `dtype` (a ScalarType code) on `device`, as the
    /// original ran the op inside `torch.autocast`.
    pub fn call_autocast(
        &mut self,
        op: &Op,
        grad: bool,
        device: tch::Device,
        dtype: i32,
    ) -> Result<(), CallError> {
        let ty = matches!(device, tch::Device::Cuda(_)) as i32;
        // SAFETY: as `call`; the shim restores the autocast state whatever happens.
        match unsafe { mq_call_autocast(op.0.as_ptr(), self.p(), grad as i32, ty, dtype) } {
            0 => Ok(()),
            code => Err(call_error(code)),
        }
    }

    pub fn kind(&self, i: usize) -> Kind {
        match unsafe { mq_stack_kind(self.p(), i) } {
            0 => Kind::None,
            1 => Kind::Tensor,
            2 => Kind::TensorList,
            4 => Kind::TensorLists,
            _ => Kind::Other,
        }
    }

    pub fn take_tensor(&self, i: usize) -> Tensor {
        // SAFETY: the shim returns a new heap at::Tensor that tch takes ownership of.
        unsafe { Tensor::from_ptr(mq_stack_tensor(self.p(), i)) }
    }

    pub fn take_list(&self, i: usize) -> Vec<Tensor> {
        let n = unsafe { mq_stack_list_len(self.p(), i) };
        (0..n)
            .map(|k| unsafe { Tensor::from_ptr(mq_stack_list_tensor(self.p(), i, k)) })
            .collect()
    }
}

/// Makes `t` require grad; fails for a tensor that is not a leaf.
pub fn set_requires_grad(t: &mut Tensor) -> Result<(), CallError> {
    // SAFETY: a live tensor; the shim catches every C++ exception.
    match unsafe { mq_set_requires_grad(t.as_mut_ptr()) } {
        0 => Ok(()),
        code => Err(call_error(code)),
    }
}

/// Marks a 0-dim tensor as a wrapped number (a Python number passed where a Tensor is taken),
/// which type promotion does not let decide the result's dtype.
pub fn set_wrapped_number(t: &mut Tensor) -> Result<(), CallError> {
    // SAFETY: a live tensor; the shim catches every C++ exception.
    match unsafe { mq_set_wrapped_number(t.as_mut_ptr()) } {
        0 => Ok(()),
        code => Err(call_error(code)),
    }
}

/// A fresh tensor with the given size and strides (c10 ScalarType code) on a device.
pub fn empty_strided(
    size: &[i64],
    stride: &[i64],
    dtype_code: i32,
    device: tch::Device,
) -> Result<Tensor, CallError> {
    let (ty, idx) = match device {
        tch::Device::Cuda(i) => (1, i as i32),
        _ => (0, -1),
    };
    let mut code = 0;
    // SAFETY: size and stride outlive the call; the shim copies them.
    let p = unsafe {
        mq_empty_strided(
            size.as_ptr(),
            stride.as_ptr(),
            size.len().min(stride.len()),
            dtype_code,
            ty,
            idx,
            &mut code,
        )
    };
    if p.is_null() {
        Err(call_error(code))
    } else {
        Ok(unsafe { Tensor::from_ptr(p) })
    }
}

/// Drops the `Box<T>` a [`from_blob`] tensor's storage kept alive.
#[cfg(feature = "cuda")]
unsafe extern "C" fn release_owner<T>(ctx: *mut c_void) {
    // SAFETY: ctx is the Box<T> from_blob leaked for exactly this call, released once.
    drop(unsafe { Box::from_raw(ctx.cast::<T>()) });
}

/// A tensor over `data`, which `owner` keeps valid: the storage holds `owner` and drops it when
/// its last view is gone (so tensors may outlive whatever handed the memory out).
///
/// # Safety
/// `data` must point to memory of the tensor's device that stays valid while `owner` lives and
/// spans the bytes the shape, strides and dtype address.
#[cfg(feature = "cuda")]
pub unsafe fn from_blob<T: Send + 'static>(
    data: *mut c_void,
    size: &[i64],
    stride: &[i64],
    dtype_code: i32,
    device: tch::Device,
    owner: T,
) -> Result<Tensor, CallError> {
    let (ty, idx) = match device {
        tch::Device::Cuda(i) => (1, i as i32),
        _ => (0, -1),
    };
    let ctx = Box::into_raw(Box::new(owner)).cast::<c_void>();
    let mut code = 0;
    // SAFETY: size/stride outlive the call and are copied; the shim calls release_owner exactly
    // once, on failure at once, else when the storage dies.
    let p = unsafe {
        mq_from_blob(
            data,
            size.as_ptr(),
            stride.as_ptr(),
            size.len().min(stride.len()),
            dtype_code,
            ty,
            idx,
            ctx,
            release_owner::<T>,
            &mut code,
        )
    };
    if p.is_null() {
        Err(call_error(code))
    } else {
        Ok(unsafe { Tensor::from_ptr(p) })
    }
}

/// Makes `stream` (a `CUstream` of the device's primary context) libtorch's current CUDA stream
/// on this thread.
///
/// # Safety
/// `stream` must be a live stream of device `device`'s primary context, alive while libtorch
/// may use it on this thread.
#[cfg(feature = "cuda")]
pub unsafe fn cuda_set_stream(stream: *mut c_void, device: usize) -> Result<(), CallError> {
    match unsafe { mq_cuda_set_stream(stream, device as i32) } {
        0 => Ok(()),
        c => Err(call_error(c)),
    }
}

/// libtorch's CUDA caching allocator statistics for a device (see [`CudaAllocatorStats`]).
pub fn cuda_memory_stats(device: usize) -> Result<CudaAllocatorStats, CallError> {
    let mut v = [0i64; 10];
    // SAFETY: the shim writes exactly 10 values.
    match unsafe { mq_cuda_memory_stats(device as i32, v.as_mut_ptr()) } {
        0 => {
            let u = |i: usize| v[i].max(0) as u64;
            Ok(CudaAllocatorStats {
                allocated_bytes: u(0),
                peak_allocated_bytes: u(1),
                reserved_bytes: u(2),
                peak_reserved_bytes: u(3),
                active_bytes: u(4),
                peak_active_bytes: u(5),
                inactive_split_bytes: u(6),
                peak_inactive_split_bytes: u(7),
                alloc_retries: u(8),
                ooms: u(9),
            })
        }
        c => Err(call_error(c)),
    }
}

/// Resets the peak figures of libtorch's CUDA caching allocator for a device: the next
/// [`cuda_memory_stats`]' peaks are those since (`torch.cuda.reset_peak_memory_stats`).
pub fn cuda_reset_peak(device: usize) -> Result<(), CallError> {
    // SAFETY: no pointers cross.
    match unsafe { mq_cuda_reset_peak(device as i32) } {
        0 => Ok(()),
        c => Err(call_error(c)),
    }
}

/// libtorch's CUDA caching allocator on one device (bytes; "inactive split" is memory cached in
/// blocks split for allocations that are gone: the allocator's fragmentation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CudaAllocatorStats {
    pub allocated_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub reserved_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub active_bytes: u64,
    pub peak_active_bytes: u64,
    pub inactive_split_bytes: u64,
    pub peak_inactive_split_bytes: u64,
    pub alloc_retries: u64,
    pub ooms: u64,
}

/// Loads a library of custom operators (like `torch.ops.load_library`).
pub fn load_library(path: &std::path::Path) -> Result<(), CallError> {
    let c = c_string(path.as_os_str().as_encoded_bytes())?;
    match unsafe { mq_load_library(c.as_ptr()) } {
        0 => Ok(()),
        code => Err(call_error(code)),
    }
}

/// The names of the probes' events (`mystique::probe`, `mystique::probe_backward`), which
/// land in the profile after the work they follow.
pub const PROBE_PREFIX: &str = "mystique::probe";

/// A CPU event recorded by the Kineto profiler during an instrumented iteration.
#[derive(Clone, Debug)]
pub struct ProfiledEvent {
    pub name: String,
    pub start_ns: u64,
    pub end_ns: u64,
    /// The sequence number its record-function scope carried (-1: none): autograd's, or a
    /// call probe's tag ([`PROBE_SEQ`]).
    pub seq: i64,
}

/// The instrumentation a capture was taken under (a linked ET + Kineto pair: the execution
/// trace observer and Kineto with input shapes; or Kineto alone, with or without shapes),
/// switched on around a piece of work. Only one can be active in a process;
/// [`Instrumentation::finish`] switches it off and removes the observer's file.
pub struct Instrumentation {
    et_path: Option<std::path::PathBuf>,
    active: bool,
}

/// Whether an [`Instrumentation`] is active: libtorch would let a second start replace the
/// first's observer and profiler session silently, and the first's `finish` then fail.
static INSTRUMENTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// What an instrumented piece of work recorded: the CPU events of the calling thread, and the
/// GPU's activity (with `cuda`).
#[derive(Clone, Debug, Default)]
pub struct Profile {
    pub cpu: Vec<ProfiledEvent>,
    pub gpu: Vec<ProfiledEvent>,
}

/// Why the capture's instrumentation could not start or stop.
#[derive(Debug, thiserror::Error)]
pub enum InstrumentError {
    /// Another [`Instrumentation`] is active: the profiler and the observer are process-wide.
    #[error(
        "another instrumentation is active in this process (the profiler and the execution \
         trace observer are process-wide)"
    )]
    Busy,
    /// The observer's temporary file has a path libtorch cannot take.
    #[error("the execution trace observer's file {0:?} has a NUL byte in its path")]
    Path(std::path::PathBuf),
    /// libtorch refused (its message).
    #[error("{0}")]
    Libtorch(String),
}

/// Where the execution trace observer of an instrumented replay on this thread writes (the
/// calibration's linked instrumentation); removed when the instrumentation finishes. A
/// program that may be killed mid-replay registers it for removal on a signal.
pub fn observer_trace_path() -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "mystique-calibration-{}-{:?}.et.json",
        std::process::id(),
        std::thread::current().id()
    ))
}

impl Instrumentation {
    /// Starts the instrumentation `kind`; with `cuda`, Kineto records the GPU's activity too.
    pub fn start(
        cuda: bool,
        kind: et_graph::Instrumentation,
    ) -> Result<Instrumentation, InstrumentError> {
        use std::sync::atomic::Ordering;
        if INSTRUMENTED.swap(true, Ordering::AcqRel) {
            return Err(InstrumentError::Busy);
        }
        let started = Self::begin(cuda, kind);
        if started.is_err() {
            INSTRUMENTED.store(false, Ordering::Release);
        }
        started
    }

    fn begin(
        cuda: bool,
        kind: et_graph::Instrumentation,
    ) -> Result<Instrumentation, InstrumentError> {
        let et_path = kind.execution_trace.then(observer_trace_path);
        let c = et_path
            .as_ref()
            .map(|p| {
                CString::new(p.as_os_str().as_encoded_bytes())
                    .map_err(|_| InstrumentError::Path(p.clone()))
            })
            .transpose()?;
        // SAFETY: a valid C string or null (no observer); errors come back as a code.
        let rc = unsafe {
            mq_instr_begin(
                c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
                cuda as i32,
                kind.record_shapes as i32,
                kind.profile_memory as i32,
            )
        };
        if rc != 0 {
            if let Some(p) = &et_path {
                let _ = std::fs::remove_file(p);
            }
            return Err(InstrumentError::Libtorch(last_error()));
        }
        Ok(Instrumentation {
            et_path,
            active: true,
        })
    }

    /// Stops the instrumentation; returns the CPU events recorded on this thread and the GPU
    /// events.
    pub fn finish(mut self) -> Result<Profile, InstrumentError> {
        self.active = false;
        // SAFETY: started by `start` on this process; null means an error was recorded.
        let ev = unsafe { mq_instr_end() };
        INSTRUMENTED.store(false, std::sync::atomic::Ordering::Release);
        if let Some(p) = &self.et_path {
            let _ = std::fs::remove_file(p);
        }
        if ev.is_null() {
            return Err(InstrumentError::Libtorch(last_error()));
        }
        let mut out = Profile::default();
        // SAFETY: `ev` is a live event list until mq_events_free; names are copied out.
        unsafe {
            let me = mq_events_self_tid(ev);
            for i in 0..mq_events_len(ev) {
                let (mut s, mut e, mut tid, mut gpu, mut seq) = (0, 0, 0, 0u8, -1i64);
                let name = mq_event(ev, i, &mut s, &mut e, &mut tid, &mut gpu, &mut seq);
                let event = || ProfiledEvent {
                    name: CStr::from_ptr(name).to_string_lossy().into_owned(),
                    start_ns: s,
                    end_ns: e,
                    seq,
                };
                if gpu != 0 {
                    out.gpu.push(event());
                } else if tid == me {
                    out.cpu.push(event());
                }
            }
            mq_events_free(ev);
        }
        Ok(out)
    }
}

impl Drop for Instrumentation {
    fn drop(&mut self) {
        if self.active {
            // SAFETY: as in `finish`; the events are not needed.
            let ev = unsafe { mq_instr_end() };
            if !ev.is_null() {
                unsafe { mq_events_free(ev) };
            }
            if let Some(p) = &self.et_path {
                let _ = std::fs::remove_file(p);
            }
            INSTRUMENTED.store(false, std::sync::atomic::Ordering::Release);
        }
    }
}

/// A probe's nanoseconds in µs, or -1 where the shim could not time it (negative).
fn us_of(ns: f64) -> f64 {
    if ns >= 0.0 {
        ns / 1e3
    } else {
        -1.0
    }
}

/// The instrumentation's cost of one event (µs), timed alone, while it is on (it lands in the
/// profile as `mystique::probe` or `mystique::probe_backward`, which the matching skips): with
/// `tensors` 0 an empty record_function scope, else a backward-function scope with that many
/// tensor inputs, as autograd's engine records a backward node (`XBackward0`); negative if it
/// could not be timed.
pub fn probe_scope_us(tensors: usize) -> f64 {
    // SAFETY: a plain call into libtorch; the shim catches every exception.
    let ns = unsafe { mq_probe_record_function(1, tensors.min(64) as i32) };
    us_of(ns)
}

/// One probe of an op called as Python calls it ([`probe_op`]).
#[derive(Clone, Copy, Debug)]
pub struct ProbedOp {
    /// The call (µs; negative if it could not be timed).
    pub us: f64,
    /// The op's kernel called without the dispatcher (µs): what its profiled window would hold
    /// without any instrumentation.
    pub kernel_us: f64,
    /// The call's interval on the clock the profiler's event times are on (Unix ns), to find
    /// its event in the profile.
    pub unix_ns: (u64, u64),
}

/// One op called as Python calls it (unboxed, `aten::add` of two 16-float tensors), timed:
/// under the instrumentation and without, the difference is what one op's events cost the
/// original; the part of it inside the op's profiled window ([`ProbedOp::unix_ns`] finds the
/// window) is in the original's op durations rather than in its gaps.
pub fn probe_op() -> ProbedOp {
    let (mut kernel_ns, mut unix_ns) = (0.0f64, [0i64; 2]);
    // SAFETY: a plain call into libtorch (the shim catches every exception), writing one f64
    // and two i64 through pointers to locals that outlive it.
    let ns = unsafe { mq_probe_op(&mut kernel_ns, unix_ns.as_mut_ptr()) };
    ProbedOp {
        us: us_of(ns),
        kernel_us: us_of(kernel_ns),
        unix_ns: (unix_ns[0].max(0) as u64, unix_ns[1].max(0) as u64),
    }
}

/// The sequence numbers that tag the call probes' events: [`Stack::probe_call`]'s for step
/// `pos` is `PROBE_SEQ + pos`, [`probe_boxed_add`]'s `PROBE_SEQ - 1`. Autograd numbers the
/// ops it records from 0, one per op, so none of a real op's events comes near.
pub const PROBE_SEQ: i64 = 1 << 50;

/// The op probe's `aten::add` with its inputs boxed, probed as [`Stack::probe_call`] probes a
/// replayed op (µs; negative if it could not be timed): set against [`probe_op`], what boxing
/// the inputs for the instrumentation costs a call made as Python makes one, which the
/// replay's boxed calls do not pay. Its event is tagged `PROBE_SEQ - 1`.
pub fn probe_boxed_add() -> f64 {
    // SAFETY: a plain call into libtorch; the shim catches every exception.
    us_of(unsafe { mq_probe_boxed_add(PROBE_SEQ - 1) })
}

/// Nodes of a probe's autograd graph: the engine runs these and its root.
pub const PROBE_NODES: usize = 16;

/// Autograd's engine running a graph of [`PROBE_NODES`] nodes that each only route their
/// gradient (and its root), timed (µs; negative if it could not be): under the instrumentation
/// and without, the difference over the nodes is what a backward node cost the original.
pub fn probe_nodes_us() -> f64 {
    // SAFETY: a plain call into libtorch; the shim catches every exception.
    let ns = unsafe { mq_probe_nodes(PROBE_NODES as i32) };
    us_of(ns)
}
