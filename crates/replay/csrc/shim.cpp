// Boxed operator dispatch for mystique's replay: find any registered operator by name and
// overload and call it with a stack of IValues built from trace values. tch's generated
// functions cannot do this (they drop defaulted scalars, omit _foreach/fused ops), so this
// small shim talks to c10::Dispatcher directly. Every entry point catches C++ exceptions and
// reports them through mq_last_error(): nothing unwinds into Rust.

#include <ATen/ATen.h>
#include <ATen/CPUFunctions.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/stack.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/ApproximateClock.h>
#include <dlfcn.h>
#include <mutex>
#include <kineto/ActivityType.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/profiler/standalone/execution_trace_observer.h>

#include <atomic>
#include <cstdlib>
#include <memory>

#include <cstring>
#include <chrono>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {
thread_local std::string last_error;

// Return codes, by the exception's type (Rust's replay::ErrorKind::from_code): 0 ok, 1 other,
// 2 out of memory, 3 not implemented (no kernel for a dtype/device), 4 invalid argument
// (type, value or index errors), 5 no such operator, 6 the device failed (a CUDA error such as
// a device-side assert: the context is unusable afterwards).
template <typename F>
int guarded(F&& f) {
  try {
    f();
    return 0;
  } catch (const c10::OutOfMemoryError& e) {
    last_error = e.what_without_backtrace();
    return 2;
  } catch (const c10::NotImplementedError& e) {
    last_error = e.what_without_backtrace();
    return 3;
  } catch (const c10::TypeError& e) {
    last_error = e.what_without_backtrace();
    return 4;
  } catch (const c10::ValueError& e) {
    last_error = e.what_without_backtrace();
    return 4;
  } catch (const c10::IndexError& e) {
    last_error = e.what_without_backtrace();
    return 4;
  } catch (const c10::AcceleratorError& e) {
    last_error = e.what_without_backtrace();
    return 6;
  } catch (const c10::Error& e) {
    last_error = e.what_without_backtrace();
  } catch (const std::bad_alloc& e) {
    last_error = std::string("out of memory: ") + e.what();
    return 2;
  } catch (const std::exception& e) {
    last_error = e.what();
  } catch (...) {
    last_error = "unknown C++ exception";
  }
  return 1;
}
}  // namespace

struct MqStack {
  torch::jit::Stack s;
};

// --- Counting the CPU allocator's bytes, as the profiler's memory events count them ---
//
// The original's peak memory on the CPU comes from torch.profiler(profile_memory=True): its
// `Total Allocated` counts the bytes allocated through c10's CPU allocator while the profiler
// ran and still held, so an iteration's peak over its start is the most it held at once of
// what it allocated (frees of what it held before do not count). This allocator counts the
// replay the same way without a profiler: it wraps the default CPU allocator, keeps each
// allocation's size and counting window in a header before the data, and counts an
// allocation from the current window until it is freed.
namespace {
constexpr size_t kHeader = 64;  // keeps the data 64-byte aligned, as alloc_cpu does
struct Header {
  size_t nbytes;
  uint64_t window;
};
std::atomic<int64_t> counted_now{0}, counted_peak{0};
std::atomic<uint64_t> counting_window{1};
at::Allocator* counted_inner = nullptr;

void counted_delete(void* data) {
  if (data == nullptr) return;
  auto* base = static_cast<char*>(data) - kHeader;
  const auto* h = reinterpret_cast<const Header*>(base);
  if (h->window == counting_window.load(std::memory_order_relaxed)) {
    counted_now.fetch_sub(static_cast<int64_t>(h->nbytes), std::memory_order_relaxed);
  }
  counted_inner->raw_deleter()(base);
}

struct CountingCPUAllocator final : at::Allocator {
  at::DataPtr allocate(size_t n) override {
    if (n == 0) return counted_inner->allocate(0);
    auto* base = static_cast<char*>(counted_inner->raw_allocate(n + kHeader));
    auto* h = reinterpret_cast<Header*>(base);
    h->nbytes = n;
    h->window = counting_window.load(std::memory_order_relaxed);
    const int64_t now = counted_now.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed) +
                        static_cast<int64_t>(n);
    int64_t peak = counted_peak.load(std::memory_order_relaxed);
    while (now > peak && !counted_peak.compare_exchange_weak(peak, now)) {
    }
    void* data = base + kHeader;
    return {data, data, &counted_delete, at::Device(at::DeviceType::CPU)};
  }
  at::DeleterFnPtr raw_deleter() const override { return &counted_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};
}  // namespace

extern "C" {

const char* mq_last_error() { return last_error.c_str(); }

// Makes the counting allocator the CPU allocator (once; tensors allocated before keep their
// own deleters). Returns 0, or 1 with mq_last_error set.
int mq_alloc_count_install() {
  return guarded([&] {
    static CountingCPUAllocator counting;
    if (counted_inner == nullptr) {
      counted_inner = c10::GetCPUAllocator();
      c10::SetCPUAllocator(&counting, /*priority=*/100);
    }
    if (c10::GetCPUAllocator() != &counting) {
      throw std::runtime_error("another CPU allocator took precedence over the counting one");
    }
  });
}

// Switches RecordFunction on or off on this thread (the profiler's and the execution trace
// observer's callbacks see nothing while off); returns whether it was on.
int mq_record_function(int on) {
  bool was = at::isRecordFunctionEnabled();
  at::enableRecordFunction(on != 0);
  return was ? 1 : 0;
}

// The scope `torch.profiler.profile.step()` opens around each profiled iteration
// (`ProfilerStep#N`, a user scope), opened around each instrumented iteration of the replay:
// under the execution trace observer, an iteration's first gap and its tail (from the scope's
// start to the first op, from the last op to its end) cost several times a boundary between two
// ops, and the capture's edges held that. Null where no callback is active or on error.
void* mq_step_scope_begin(int64_t n) {
  try {
    auto* rf = new at::RecordFunction(at::RecordScope::USER_SCOPE);
    if (rf->isActive()) {
      rf->before("ProfilerStep#" + std::to_string(n));
      return rf;
    }
    delete rf;
  } catch (...) {
  }
  return nullptr;
}

// Ends (and frees) a scope `mq_step_scope_begin` opened.
void mq_step_scope_end(void* scope) {
  try {
    delete static_cast<at::RecordFunction*>(scope);
  } catch (...) {
  }
}

// Starts a counting window: from here, what is allocated counts until it is freed.
void mq_alloc_count_reset() {
  counting_window.fetch_add(1);
  counted_now.store(0);
  counted_peak.store(0);
}

// The window's bytes held now and at its peak.
void mq_alloc_count_read(int64_t* now, int64_t* peak) {
  *now = counted_now.load();
  *peak = counted_peak.load();
}

// The libraries loaded so far, for an operator none of them registered to name them.
static std::mutex loaded_mutex;
static std::vector<std::string> loaded_libraries;

// What to do about an operator no library registered: load its library, or (some were
// loaded) another one than those.
static std::string unregistered_hint() {
  std::lock_guard<std::mutex> lock(loaded_mutex);
  if (loaded_libraries.empty()) return "load its library with --load-library";
  std::string names;
  for (const auto& l : loaded_libraries) {
    if (!names.empty()) names += ", ";
    names += l;
  }
  return "none of the libraries loaded (" + names +
         ") registers it: load the one that does with --load-library";
}

// Returns an opaque handle (a heap c10::OperatorHandle), or null with the error set.
void* mq_find_op(const char* name, const char* overload, int* code) {
  void* out = nullptr;
  *code = 5;
  int rc = guarded([&] {
    auto h = c10::Dispatcher::singleton().findSchema({name, overload});
    if (!h.has_value()) {
      last_error = std::string("no operator ") + name + (overload[0] ? "." : "") + overload +
                   " is registered in this libtorch (" + unregistered_hint() + ")";
      return;
    }
    out = new c10::OperatorHandle(*h);
  });
  if (rc != 0) *code = rc;
  if (out) *code = 0;
  return out;
}

void mq_op_free(void* op) { delete static_cast<c10::OperatorHandle*>(op); }

// The registered schema as text (valid until the next call on this thread).
const char* mq_op_schema(void* op) {
  static thread_local std::string text;
  std::ostringstream os;
  os << static_cast<c10::OperatorHandle*>(op)->schema();
  text = os.str();
  return text.c_str();
}

// Pushes the schema's default for argument i; returns 1 if it has none.
int mq_push_default(MqStack* st, void* op, int64_t i) {
  const auto& args = static_cast<c10::OperatorHandle*>(op)->schema().arguments();
  if (i < 0 || static_cast<size_t>(i) >= args.size() || !args[i].default_value().has_value()) {
    last_error = "argument has no default";
    return 4;
  }
  st->s.push_back(*args[i].default_value());
  return 0;
}

MqStack* mq_stack_new() { return new MqStack(); }
void mq_stack_free(MqStack* st) { delete st; }
void mq_stack_clear(MqStack* st) { st->s.clear(); }
size_t mq_stack_len(MqStack* st) { return st->s.size(); }

void mq_push_none(MqStack* st) { st->s.emplace_back(); }
void mq_push_tensor(MqStack* st, const at::Tensor* t) { st->s.emplace_back(*t); }
void mq_push_undefined_tensor(MqStack* st) { st->s.emplace_back(at::Tensor()); }
void mq_push_int(MqStack* st, int64_t v) { st->s.emplace_back(v); }
void mq_push_double(MqStack* st, double v) { st->s.emplace_back(v); }
void mq_push_bool(MqStack* st, bool v) { st->s.emplace_back(v); }
void mq_push_string(MqStack* st, const char* v) { st->s.emplace_back(std::string(v)); }
void mq_push_scalar_int(MqStack* st, int64_t v) { st->s.emplace_back(c10::Scalar(v)); }
void mq_push_scalar_double(MqStack* st, double v) { st->s.emplace_back(c10::Scalar(v)); }
void mq_push_scalar_bool(MqStack* st, bool v) { st->s.emplace_back(c10::Scalar(v)); }
void mq_push_int_list(MqStack* st, const int64_t* v, size_t n) {
  st->s.emplace_back(std::vector<int64_t>(v, v + n));
}
void mq_push_double_list(MqStack* st, const double* v, size_t n) {
  st->s.emplace_back(std::vector<double>(v, v + n));
}
void mq_push_bool_list(MqStack* st, const uint8_t* v, size_t n) {
  c10::List<bool> l;
  for (size_t i = 0; i < n; i++) l.push_back(v[i] != 0);
  st->s.emplace_back(l);
}
void mq_push_tensor_list(MqStack* st, const at::Tensor* const* v, size_t n) {
  c10::List<at::Tensor> l;
  for (size_t i = 0; i < n; i++) l.push_back(v[i] ? *v[i] : at::Tensor());
  st->s.emplace_back(l);
}
void mq_push_opt_tensor_list(MqStack* st, const at::Tensor* const* v, size_t n) {
  c10::List<std::optional<at::Tensor>> l;
  for (size_t i = 0; i < n; i++) {
    if (v[i]) {
      l.push_back(std::optional<at::Tensor>(*v[i]));
    } else {
      l.push_back(std::optional<at::Tensor>());
    }
  }
  st->s.emplace_back(l);
}
// Tensor[][] (an allgather's outputs): `n` lists, list k of lens[k] tensors from `v` in order.
void mq_push_tensor_lists(MqStack* st, const at::Tensor* const* v, const size_t* lens, size_t n) {
  c10::List<c10::List<at::Tensor>> outer;
  size_t at = 0;
  for (size_t k = 0; k < n; k++) {
    c10::List<at::Tensor> inner;
    for (size_t i = 0; i < lens[k]; i++, at++) inner.push_back(v[at] ? *v[at] : at::Tensor());
    outer.push_back(inner);
  }
  st->s.emplace_back(outer);
}
// Scalar[] (e.g. _foreach_addcdiv_.ScalarList): a generic list of numbers.
void mq_push_scalar_list(MqStack* st, const double* v, size_t n) {
  c10::impl::GenericList l(c10::NumberType::get());
  for (size_t i = 0; i < n; i++) l.push_back(c10::IValue(c10::Scalar(v[i])));
  st->s.emplace_back(l);
}
// type: 0 cpu, 1 cuda; index -1 = current.
void mq_push_device(MqStack* st, int type, int index) {
  st->s.emplace_back(c10::Device(type == 1 ? c10::DeviceType::CUDA : c10::DeviceType::CPU,
                                 static_cast<c10::DeviceIndex>(index)));
}

// The stack must hold exactly the schema's arguments: the dispatcher reads them from its top
// without a bound check (a stack one short has it take the memory before the vector's start for
// a tensor), so a call built from a damaged plan is refused here as invalid.
static void check_arity(const c10::OperatorHandle& op, const torch::jit::Stack& s) {
  const size_t want = op.schema().arguments().size();
  TORCH_CHECK_VALUE(s.size() == want, "the call has ", s.size(), " arguments where ",
                    op.schema().name(), "'s schema takes ", want);
}

// Calls the operator on the stack (arguments in schema order); results replace them. With
// `grad`, autograd records the call as the original's forward did (the trace holds the backward
// ops as explicit calls, so nothing ever runs backward through what it records).
int mq_call(void* op, MqStack* st, int grad) {
  return guarded([&] {
    c10::AutoGradMode mode(grad != 0);
    const auto& h = *static_cast<c10::OperatorHandle*>(op);
    check_arity(h, st->s);
    h.callBoxed(&st->s);
  });
}

// mq_call under autocast to `dtype` on `device_type` (0 CPU, 1 CUDA), as the original ran the op
// inside `torch.autocast`: the op's autocast kernel casts its inputs, as it did there. The
// autocast state is restored afterwards (and its cast cache cleared, as leaving the outermost
// autocast region does), also when the call throws.
int mq_call_autocast(void* op, MqStack* st, int grad, int device_type, int dtype) {
  return guarded([&] {
    const auto dev = device_type == 1 ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
    struct Restore {
      c10::DeviceType dev;
      bool enabled;
      at::ScalarType dtype;
      ~Restore() {
        at::autocast::set_autocast_enabled(dev, enabled);
        at::autocast::set_autocast_dtype(dev, dtype);
        if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
      }
    } restore{dev, at::autocast::is_autocast_enabled(dev), at::autocast::get_autocast_dtype(dev)};
    at::autocast::increment_nesting();
    at::autocast::set_autocast_enabled(dev, true);
    at::autocast::set_autocast_dtype(dev, static_cast<at::ScalarType>(dtype));
    c10::AutoGradMode mode(grad != 0);
    const auto& h = *static_cast<c10::OperatorHandle*>(op);
    check_arity(h, st->s);
    h.callBoxed(&st->s);
  });
}

// Makes a leaf tensor require grad (a parameter of the original model).
int mq_set_requires_grad(at::Tensor* t) {
  return guarded([&] { t->set_requires_grad(true); });
}

// Marks a 0-dim tensor as a wrapped number: what a Python number passed to a Tensor overload
// becomes (`-0.5 * loss` calls `mul.Tensor(loss, <0-dim double>)`). Type promotion ignores a
// wrapped number's dtype; a plain 0-dim double beside a 0-dim float makes the result double.
int mq_set_wrapped_number(at::Tensor* t) {
  return guarded([&] {
    TORCH_CHECK(t->dim() == 0, "only a 0-dim tensor can be a wrapped number");
    t->unsafeGetTensorImpl()->set_wrapped_number(true);
  });
}

// 0 none, 1 tensor, 2 tensor list, 3 other, 4 list of tensor lists.
int mq_stack_kind(MqStack* st, size_t i) {
  const auto& v = st->s.at(i);
  if (v.isNone()) return 0;
  if (v.isTensor()) return 1;
  if (v.isTensorList()) return 2;
  if (v.isList()) {
    auto l = v.toListRef();
    bool nested = !l.empty();
    for (const auto& x : l) nested = nested && x.isTensorList();
    if (nested) return 4;
  }
  return 3;
}

// Tensors of a list of tensor lists, flattened: how many, and the k-th (a new owned tensor).
size_t mq_stack_flat_len(MqStack* st, size_t i) {
  size_t n = 0;
  for (const auto& x : st->s.at(i).toListRef()) n += x.toTensorList().size();
  return n;
}
at::Tensor* mq_stack_flat_tensor(MqStack* st, size_t i, size_t k) {
  for (const auto& x : st->s.at(i).toListRef()) {
    auto l = x.toTensorList();
    if (k < l.size()) return new at::Tensor(l.get(k));
    k -= l.size();
  }
  return new at::Tensor();
}

// A new owned at::Tensor for result i (caller frees through tch).
at::Tensor* mq_stack_tensor(MqStack* st, size_t i) { return new at::Tensor(st->s.at(i).toTensor()); }
size_t mq_stack_list_len(MqStack* st, size_t i) { return st->s.at(i).toTensorList().size(); }
at::Tensor* mq_stack_list_tensor(MqStack* st, size_t i, size_t k) {
  return new at::Tensor(st->s.at(i).toTensorList().get(k));
}

// Materialises a tensor view of a fresh storage: empty_strided on the device.
at::Tensor* mq_empty_strided(const int64_t* size, const int64_t* stride, size_t ndim, int dtype,
                             int device_type, int device_index, int* code) {
  at::Tensor* out = nullptr;
  *code = guarded([&] {
    auto opts = at::TensorOptions()
                    .dtype(static_cast<c10::ScalarType>(dtype))
                    .device(c10::Device(device_type == 1 ? c10::DeviceType::CUDA : c10::DeviceType::CPU,
                                        static_cast<c10::DeviceIndex>(device_index)));
    out = new at::Tensor(at::empty_strided(c10::IntArrayRef(size, ndim), c10::IntArrayRef(stride, ndim), opts));
  });
  return out;
}

// A tensor over memory the caller owns (a CUDA arena carved by Rust): `release(ctx)` runs when
// the last tensor sharing this storage is gone, so the memory outlives every view of it.
at::Tensor* mq_from_blob(void* data, const int64_t* size, const int64_t* stride, size_t ndim, int dtype,
                         int device_type, int device_index, void* ctx, void (*release)(void*), int* code) {
  at::Tensor* out = nullptr;
  // The maker owns `ctx` from here: whether it fails before or after building the storage,
  // `release` runs exactly once (by the maker, or by the storage when its last view dies).
  auto maker = at::for_blob(data, c10::IntArrayRef(size, ndim));
  maker.context(ctx, release);
  *code = guarded([&] {
    auto dev = c10::Device(device_type == 1 ? c10::DeviceType::CUDA : c10::DeviceType::CPU,
                           static_cast<c10::DeviceIndex>(device_index));
    auto opts = at::TensorOptions().dtype(static_cast<c10::ScalarType>(dtype)).device(dev);
    out = new at::Tensor(
        maker.strides(c10::IntArrayRef(stride, ndim)).options(opts).target_device(dev).make_tensor());
  });
  return out;
}

// Makes `stream` (a CUstream of device `device`'s primary context, created by Rust) the current
// CUDA stream of this thread for every libtorch op that follows. Through the generic
// DeviceGuardImpl and one symbol of libc10_cuda, so this file needs no CUDA headers (the wheel
// ships an incomplete set). getStreamFromExternal returns a c10::cuda::CUDAStream, whose only
// member is a c10::Stream: the same 16 bytes, returned in the same registers.
int mq_cuda_set_stream(void* stream, int device) {
  return guarded([&] {
    // exchangeStream is noexcept: whatever it could throw (a bad index, CUDA not initialised)
    // must throw here first, where it is caught, not terminate the process there.
    at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
    auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
    if (device < 0 || device >= impl->deviceCount())
      throw std::runtime_error("no CUDA device " + std::to_string(device));
    using Fn = c10::Stream (*)(void*, int8_t);
    static Fn from_external =
        reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "_ZN3c104cuda21getStreamFromExternalEP11CUstream_sta"));
    if (!from_external) throw std::runtime_error("libc10_cuda is not loaded: this libtorch has no CUDA");
    c10::Stream s = from_external(stream, static_cast<int8_t>(device));
    impl->exchangeStream(s);
  });
}

// libtorch's caching allocator on CUDA device `device`: out[0..10] = allocated (current, peak),
// reserved (current, peak), active (current, peak), inactive split (current, peak) bytes,
// allocation retries, OOMs.
int mq_cuda_memory_stats(int device, int64_t* out) {
  return guarded([&] {
    auto st = c10::getDeviceAllocator(c10::DeviceType::CUDA)->getDeviceStats(static_cast<c10::DeviceIndex>(device));
    const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    out[0] = st.allocated_bytes[agg].current;
    out[1] = st.allocated_bytes[agg].peak;
    out[2] = st.reserved_bytes[agg].current;
    out[3] = st.reserved_bytes[agg].peak;
    out[4] = st.active_bytes[agg].current;
    out[5] = st.active_bytes[agg].peak;
    out[6] = st.inactive_split_bytes[agg].current;
    out[7] = st.inactive_split_bytes[agg].peak;
    out[8] = st.num_alloc_retries;
    out[9] = st.num_ooms;
  });
}

// Resets the CUDA caching allocator's peak figures for a device (as
// torch.cuda.reset_peak_memory_stats does), so that the next read's peak is the peak since.
int mq_cuda_reset_peak(int device) {
  return guarded([&] {
    c10::getDeviceAllocator(c10::DeviceType::CUDA)->resetPeakStats(static_cast<c10::DeviceIndex>(device));
  });
}

// Flushes denormal floats to zero on this thread (FTZ/DAZ); false where the CPU cannot.
int mq_flush_denormal() { return at::globalContext().setFlushDenormal(true) ? 1 : 0; }

// The storage a tensor views (data pointer and bytes), to count live memory once per storage.
void mq_storage_info(const at::Tensor* t, uintptr_t* ptr, size_t* nbytes) {
  if (!t->defined() || !t->has_storage()) {
    *ptr = 0;
    *nbytes = 0;
    return;
  }
  const auto& st = t->storage();
  *ptr = reinterpret_cast<uintptr_t>(st.data_ptr().get());
  *nbytes = st.nbytes();
}

// Whether the tensor is the output of a recorded autograd node (not a leaf, not detached).
// A view whose base changed in place makes its node again here, which may throw: such a tensor
// counts as having one (detaching it is still right).
int mq_has_grad_fn(const at::Tensor* t) {
  if (!t->defined() || !t->requires_grad()) return 0;
  try {
    return t->is_leaf() ? 0 : 1;
  } catch (...) {
    return 1;
  }
}

// How many holders the tensor's storage has (tensors viewing it, outstanding work holding
// them): 1 when this tensor is its only user; 0 without a storage.
size_t mq_storage_use_count(const at::Tensor* t) {
  if (!t->defined() || !t->has_storage()) return 0;
  return t->storage().use_count();
}

// dlopen with RTLD_GLOBAL so that the library's operator registrations run.
int mq_load_library(const char* path) {
  void* h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  if (!h) {
    last_error = dlerror();
    return 1;
  }
  std::lock_guard<std::mutex> lock(loaded_mutex);
  loaded_libraries.emplace_back(path);
  return 0;
}

// --- The capture's instrumentation, reproduced around a replayed iteration ---
//
// A linked ET + Kineto pair is captured with the execution trace observer and the Kineto
// profiler (record_shapes) both on, and their per-op cost lands partly inside op windows and
// partly in the gaps between them. Replaying one iteration under the same instrumentation
// measures that cost for these very ops, so the gaps can be corrected by measurement rather
// than by a model of the profiler. Order as torch.profiler.profile: the ET observer is added,
// the profiler prepared, the observer enabled, then the profiler enabled.

struct MqEvents {
  std::vector<std::string> names;
  std::vector<uint64_t> start_ns, end_ns, tid;
  std::vector<int64_t> seq;
  std::vector<uint8_t> gpu;
  uint64_t self_tid = 0;
};

static int saved_log_level = 0;
static bool observer_on = false;

// With `cuda`, Kineto also records the GPU's activity (kernels, memcpy, memset) through CUPTI.
// `et_path` null: the profiler alone (a Kineto trace taken without the observer);
// `record_shapes` and `profile_memory` as the capture's profiler had them.
int mq_instr_begin(const char* et_path, int cuda, int record_shapes, int profile_memory) {
  return guarded([&] {
    // Kineto logs an error per missing GPU and the observer a warning per start/stop: the
    // calibration is internal, keep stderr for the user's messages.
    setenv("KINETO_LOG_LEVEL", "5", /*overwrite=*/0);
    saved_log_level = FLAGS_caffe2_log_level;
    FLAGS_caffe2_log_level = std::max(FLAGS_caffe2_log_level, 2);
    using namespace torch::profiler::impl;
    if (et_path != nullptr && !torch::profiler::impl::addExecutionTraceObserver(et_path)) {
      FLAGS_caffe2_log_level = saved_log_level;
      throw std::runtime_error(std::string("cannot start the execution trace observer on ") +
                               et_path);
    }
    observer_on = et_path != nullptr;
    ProfilerConfig cfg(ProfilerState::KINETO, /*report_input_shapes=*/record_shapes != 0,
                       /*profile_memory=*/profile_memory != 0);
    std::set<ActivityType> acts{ActivityType::CPU};
    if (cuda) acts.insert(ActivityType::CUDA);
    torch::autograd::profiler::prepareProfiler(cfg, acts);
    if (observer_on) torch::profiler::impl::enableExecutionTraceObserver();
    torch::autograd::profiler::enableProfiler(cfg, acts);
  });
}

// The instrumentation's cost of one event (enter and exit), in nanoseconds: `n` scopes timed
// back to back while the instrumentation is on. With `tensors` 0, an empty user scope (a
// record_function annotation such as autograd's `evaluate_function` wrappers); else what
// autograd's engine records for a backward node (`XBackward0`, `Node::operator()`): a
// BACKWARD_FUNCTION scope with a sequence number and `tensors` tensor inputs, which the
// observer and the profiler's shapes record.
//
// The inputs are made once, on the first call: a probe of one scope between two steps (in
// context, `n` 1) then times the scope alone, and adds no op of its own to the profile.
double mq_probe_record_function(int n, int tensors) {
  try {
    static std::vector<c10::IValue> made;
    while (static_cast<int>(made.size()) < tensors) made.emplace_back(at::ones({8, 8}));
    const std::vector<c10::IValue> inputs(made.begin(), made.begin() + std::max(tensors, 0));
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; i++) {
      if (tensors == 0) {
        at::RecordFunction guard(at::RecordScope::USER_SCOPE);
        if (guard.isActive()) guard.before("mystique::probe");
      } else {
        at::RecordFunction guard(at::RecordScope::BACKWARD_FUNCTION);
        if (guard.isActive()) {
          if (guard.needsInputs()) {
            guard.before("mystique::probe_backward",
                         c10::ArrayRef<const c10::IValue>(inputs.data(), inputs.size()), i);
          } else {
            guard.before("mystique::probe_backward", i);
          }
        }
      }
    }
    auto t1 = std::chrono::steady_clock::now();
    return std::chrono::duration<double, std::nano>(t1 - t0).count() / std::max(n, 1);
  } catch (...) {
    return -1.0;
  }
}

// The instrumentation's cost through the real mechanisms, timed once without it and once under
// it (the difference is its cost): an op called as Python calls ops (unboxed, through the
// dispatcher: an `aten::add` of two 16-float tensors, whose event nests none), and autograd's
// engine running `k` nodes (a chain of `AddBackward0`, each only routing its gradient, so no op
// runs inside: what the engine records per node, its `evaluate_function` wrapper and the node's
// own event with its gradient, and whatever else it does per node while a profiler is on).
// The replay's own calls are boxed and its bookkeeping between them is not Python's; these
// time what the original's gaps paid.
//
// Not all of an op's instrumentation cost lands in the gaps: the observer's exit callback runs
// before the profiler takes the op's end time, so it is inside the op's profiled window, which
// the capture's op durations hold. So the probe also gives the call's wall-clock interval
// (`unix_ns`, the clock the profiler's event times are put on) for its event to be found in the
// profile, and the add's kernel called without the dispatcher (`kernel_ns`): what the window
// holds without any instrumentation.
// The op probe's two 16-float inputs, made once: `mq_probe_op` adds them unboxed,
// `mq_probe_boxed_add` probes the same add with them boxed.
static const std::pair<at::Tensor, at::Tensor>& probe_add_inputs() {
  static const std::pair<at::Tensor, at::Tensor> ab{at::ones({16}), at::ones({16})};
  return ab;
}

double mq_probe_op(double* kernel_ns, int64_t* unix_ns) {
  try {
    const auto& [a, b] = probe_add_inputs();
    auto k0 = std::chrono::steady_clock::now();
    { auto c = at::cpu::add(a, b); }
    auto k1 = std::chrono::steady_clock::now();
    *kernel_ns = std::chrono::duration<double, std::nano>(k1 - k0).count();
    unix_ns[0] = c10::getTime();
    auto t0 = std::chrono::steady_clock::now();
    { auto c = at::add(a, b); }
    auto t1 = std::chrono::steady_clock::now();
    unix_ns[1] = c10::getTime();
    return std::chrono::duration<double, std::nano>(t1 - t0).count();
  } catch (...) {
    return -1.0;
  }
}

// An op's call as the dispatcher records it, without the call: a RecordFunction scope with the
// op's schema and its boxed inputs (`args`), as `callBoxed` opens one around the kernel, timed.
// Its event carries the sequence number `seq`, a tag no real op's event has (autograd numbers
// ops from 0 up), for it to be found in the profile. Under the instrumentation, the time less
// the event's window is what the callbacks add to a call outside its window (the observer's
// entry callback recording these inputs, the profiler's bookkeeping on either side): for each of
// the trace's own ops, with the inputs the original recorded.
static double probe_scope_of(const c10::OperatorHandle& op, const torch::jit::Stack& args,
                             int64_t seq) {
  auto t0 = std::chrono::steady_clock::now();
  {
    at::RecordFunction guard(at::RecordScope::FUNCTION);
    if (guard.isActive()) {
      auto schema = std::reference_wrapper<const c10::FunctionSchema>(op.schema());
      if (guard.needsInputs()) {
        guard.before(schema, c10::ArrayRef<const c10::IValue>(args.data(), args.size()), seq);
      } else {
        guard.before(schema, seq);
      }
    }
  }
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count();
}

double mq_probe_call(void* op, MqStack* st, int64_t seq) {
  try {
    return probe_scope_of(*static_cast<c10::OperatorHandle*>(op), st->s, seq);
  } catch (...) {
    return -1.0;
  }
}

// The op probe's `aten::add` probed as `mq_probe_call` probes a replayed op (boxed inputs): its
// cost outside the window against the unboxed probe's is the boxing of the inputs that the
// dispatcher does for the callbacks on the path Python's calls take, which the replay's boxed
// calls skip.
double mq_probe_boxed_add(int64_t seq) {
  try {
    const auto& [a, b] = probe_add_inputs();
    static const c10::OperatorHandle op =
        c10::Dispatcher::singleton().findSchemaOrThrow("aten::add", "Tensor");
    const torch::jit::Stack args{a, b, c10::Scalar(1)};
    return probe_scope_of(op, args, seq);
  } catch (...) {
    return -1.0;
  }
}

// The nodes' forward is built outside the timing; `k` at most 64.
double mq_probe_nodes(int k) {
  try {
    c10::InferenceMode no_inference(false);
    at::AutoGradMode grad(true);
    static const at::Tensor x0 = at::ones({16}).requires_grad_(true);
    static const at::Tensor g = at::ones({16});
    static std::vector<at::Tensor> cs;
    while (static_cast<int>(cs.size()) < k) cs.push_back(at::ones({16}));
    at::Tensor y = x0;
    for (int i = 0; i < k; i++) y = y + cs[i];
    auto t0 = std::chrono::steady_clock::now();
    { auto r = torch::autograd::grad({y}, {x0}, {g}); }
    auto t1 = std::chrono::steady_clock::now();
    return std::chrono::duration<double, std::nano>(t1 - t0).count();
  } catch (...) {
    return -1.0;
  }
}

// Stops both (profiler first, then the observer, which writes and closes its file) and returns
// the CPU events, or null with mq_last_error set.
MqEvents* mq_instr_end() {
  MqEvents* out = nullptr;
  int rc = guarded([&] {
    auto result = torch::autograd::profiler::disableProfiler();
    if (observer_on) {
      torch::profiler::impl::disableExecutionTraceObserver();
      torch::profiler::impl::removeExecutionTraceObserver();
      observer_on = false;
    }
    FLAGS_caffe2_log_level = saved_log_level;
    auto ev = std::make_unique<MqEvents>();
    ev->self_tid = at::RecordFunction::currentThreadId();
    for (const auto& e : result->events()) {
      // By activity, not device type: Kineto files CUDA runtime/driver calls and CUPTI's
      // overhead under the CPU, and GPU annotations and syncs under CUDA.
      using KT = libkineto::ActivityType;
      const auto t = static_cast<KT>(e.activityType());
      const bool gpu = t == KT::CONCURRENT_KERNEL || t == KT::GPU_MEMCPY || t == KT::GPU_MEMSET;
      const bool cpu = t == KT::CPU_OP || t == KT::USER_ANNOTATION;
      if (!(gpu || cpu) || e.isAsync()) continue;
      ev->names.push_back(e.name());
      ev->start_ns.push_back(e.startNs());
      ev->end_ns.push_back(e.endNs());
      ev->tid.push_back(gpu ? 0 : e.startThreadId());
      ev->seq.push_back(gpu ? -1 : e.sequenceNr());
      ev->gpu.push_back(gpu ? 1 : 0);
    }
    out = ev.release();
  });
  return rc == 0 ? out : nullptr;
}

size_t mq_events_len(const MqEvents* ev) { return ev->names.size(); }
uint64_t mq_events_self_tid(const MqEvents* ev) { return ev->self_tid; }
const char* mq_event(const MqEvents* ev, size_t i, uint64_t* start_ns, uint64_t* end_ns,
                     uint64_t* tid, uint8_t* gpu, int64_t* seq) {
  *gpu = ev->gpu[i];
  *seq = ev->seq[i];
  *start_ns = ev->start_ns[i];
  *end_ns = ev->end_ns[i];
  *tid = ev->tid[i];
  return ev->names[i].c_str();
}
void mq_events_free(MqEvents* ev) { delete ev; }

}  // extern "C"

// --- Process groups: Gloo over a TCPStore rendezvous, for replaying collectives ---
//
// The wheel ships c10d's headers but not gloo's, which ProcessGroupGloo.hpp includes. The three
// entry points needed are looked up by their mangled names at run time (a libtorch built without
// Gloo then gives a clear error instead of failing to load), and ProcessGroupGloo::Options is read
// through a mirror of its leading fields, which follow Backend::Options in the header:
// `std::vector<std::shared_ptr<gloo::transport::Device>> devices; int threads;`.

namespace gloo {
namespace transport {
class Device;
}
}  // namespace gloo

namespace {
struct GlooOptionsMirror : c10d::Backend::Options {
  std::vector<std::shared_ptr<::gloo::transport::Device>> devices;
  int threads;
};
using CreateDefault = c10::intrusive_ptr<GlooOptionsMirror> (*)(std::chrono::milliseconds);
using DeviceForHost = std::shared_ptr<::gloo::transport::Device> (*)(const std::string&, bool);
using GlooCtor = void (*)(void*, const c10::intrusive_ptr<c10d::Store>&, int, int,
                          c10::intrusive_ptr<GlooOptionsMirror>);
// Runs a constructor `ctor(mem)` on `bytes` of zeroed memory reserved here (the classes built
// by symbol have no header to size them); the memory is released if the constructor throws.
template <typename F>
void* construct_zeroed(size_t bytes, F&& ctor) {
  void* mem = ::operator new(bytes);
  std::memset(mem, 0, bytes);
  try {
    ctor(mem);
  } catch (...) {
    ::operator delete(mem);
    throw;
  }
  return mem;
}
// Bytes reserved for a ProcessGroupGloo (its real size is a few hundred; it is destroyed through
// its virtual destructor, which frees this block).
constexpr size_t kGlooBytes = 1 << 16;

template <typename F>
F gloo_symbol(const char* name) {
  void* p = dlsym(RTLD_DEFAULT, name);
  if (!p) throw std::runtime_error(std::string("this libtorch has no Gloo backend (") + name + ")");
  return reinterpret_cast<F>(p);
}

c10::intrusive_ptr<c10d::Backend> new_gloo(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                           int size, std::chrono::milliseconds timeout,
                                           const std::string& host) {
  auto create_default = gloo_symbol<CreateDefault>(
      "_ZN4c10d16ProcessGroupGloo7Options14create_defaultENSt6chrono8durationIlSt5ratioILl1ELl1000EEEE");
  auto device_for_host = gloo_symbol<DeviceForHost>(
      "_ZN4c10d16ProcessGroupGloo23createDeviceForHostnameERKNSt7__cxx1112basic_stringIcSt11char_"
      "traitsIcESaIcEEEb");
  auto ctor = gloo_symbol<GlooCtor>(
      "_ZN4c10d16ProcessGroupGlooC1ERKN3c1013intrusive_ptrINS_5StoreENS1_6detail34intrusive_"
      "target_default_null_typeIS3_EEEEiiNS2_INS0_7OptionsENS5_ISA_EEEE");
  auto opts = create_default(timeout);
  // Loopback or the given address only: never whatever the host name resolves to.
  opts->devices.clear();
  opts->devices.push_back(device_for_host(host, false));
  void* mem = construct_zeroed(kGlooBytes,
                               [&](void* m) { ctor(m, store, rank, size, std::move(opts)); });
  return c10::intrusive_ptr<c10d::Backend>::unsafe_steal_from_new(
      static_cast<c10d::Backend*>(mem));
}
// NCCL, likewise by symbol from libtorch_cuda (its header needs CUDA's, which the wheel ships
// incomplete): the Options constructor and the ProcessGroupNCCL constructor, both on memory
// reserved here; default options (no high-priority stream, no split).
using NcclOptionsCtor = void (*)(void*, bool);
using NcclCtor = void (*)(void*, c10::intrusive_ptr<c10d::Store>, int, int,
                          c10::intrusive_ptr<c10d::Backend::Options>);
constexpr size_t kNcclBytes = 1 << 20;
constexpr size_t kNcclOptionsBytes = 1 << 16;

c10::intrusive_ptr<c10d::Backend> new_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                           int size) {
  auto nccl_symbol = [](const char* name) {
    void* p = dlsym(RTLD_DEFAULT, name);
    if (!p) throw std::runtime_error(std::string("this libtorch has no NCCL backend (") + name + ")");
    return p;
  };
  auto opts_ctor = reinterpret_cast<NcclOptionsCtor>(nccl_symbol("_ZN4c10d16ProcessGroupNCCL7OptionsC1Eb"));
  auto ctor = reinterpret_cast<NcclCtor>(nccl_symbol(
      "_ZN4c10d16ProcessGroupNCCLC1EN3c1013intrusive_ptrINS_5StoreENS1_6detail34intrusive_"
      "target_default_null_typeIS3_EEEEiiNS2_INS0_7OptionsENS5_IS8_EEEE"));
  void* omem = construct_zeroed(kNcclOptionsBytes, [&](void* m) { opts_ctor(m, false); });
  auto opts = c10::intrusive_ptr<c10d::Backend::Options>::unsafe_steal_from_new(
      static_cast<c10d::Backend::Options*>(omem));
  void* mem = construct_zeroed(kNcclBytes,
                               [&](void* m) { ctor(m, store, rank, size, std::move(opts)); });
  return c10::intrusive_ptr<c10d::Backend>::unsafe_steal_from_new(static_cast<c10d::Backend*>(mem));
}
}  // namespace

struct MqComm {
  c10::intrusive_ptr<c10d::Store> store;
  int rank = 0, size = 1;
  // CUDA tensors' collectives: 0 none (a CPU replay), 1 through Gloo (ranks sharing a GPU), 2
  // through NCCL (one GPU per rank).
  int cuda_mode = 0;
  std::chrono::milliseconds timeout{60000};
  // This host's address for Gloo's connections.
  std::string host;
  // Where this job's keys live in the store: `mystique`, or `mystique/attempt_N` in an agent's.
  std::string prefix;
  // Groups by index; a null entry is a group this rank is not a member of.
  std::vector<c10::intrusive_ptr<c10d::ProcessGroup>> groups;
  // Names registered in c10d's group registry (functional collectives find groups by name).
  std::vector<std::string> registered;
  ~MqComm() {
    for (const auto& n : registered) {
      try {
        c10d::unregister_process_group(n);
      } catch (...) {
      }
    }
  }
  void register_group(const std::string& name, const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
    // A name left by an earlier Comm in this process is replaced.
    try {
      c10d::unregister_process_group(name);
    } catch (...) {
    }
    c10d::register_process_group(name, pg);
    registered.push_back(name);
  }
};

namespace {
c10::intrusive_ptr<c10d::ProcessGroup> make_group(MqComm* c, c10::intrusive_ptr<c10d::Store> store,
                                                  int rank, int size, const std::string& name) {
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
  auto backend = new_gloo(store, rank, size, c->timeout, c->host);
  backend->setGroupUid(name);
  pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, backend);
  pg->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  if (c->cuda_mode == 1) {
    // Gloo stages CUDA tensors through the host: slower than NCCL, but ranks may share a GPU.
    pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::GLOO, backend);
  } else if (c->cuda_mode == 2) {
    auto nccl = new_nccl(c10::make_intrusive<c10d::PrefixStore>("nccl", store), rank, size);
    nccl->setGroupUid(name);
    pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, nccl);
    pg->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
  }
  pg->setGroupName(name);
  return pg;
}
}  // namespace

extern "C" {

// Joins the world: a TCPStore at host:port (served by this process where `serve`: rank 0,
// unless a launcher's agent serves it) and the world group (group 0); every group's keys are
// under `prefix` (`prefix/world`, `prefix/NAME`). Gloo's connections use this host's address
// `local` (the master's address is another host's on every other node).
MqComm* mq_dist_init(const char* host, const char* local, int port, int rank, int size,
                     int64_t timeout_ms, int cuda_mode, int serve, const char* prefix, int* code) {
  MqComm* out = nullptr;
  *code = guarded([&] {
    auto c = std::make_unique<MqComm>();
    c->cuda_mode = cuda_mode;
    c->rank = rank;
    c->size = size;
    c->host = local;
    c->prefix = prefix;
    c->timeout = std::chrono::milliseconds(timeout_ms);
    c10d::TCPStoreOptions o;
    o.port = static_cast<uint16_t>(port);
    o.isServer = serve != 0;
    o.numWorkers = size;
    o.waitWorkers = true;
    o.timeout = c->timeout;
    o.useLibUV = false;
    c->store = c10::make_intrusive<c10d::TCPStore>(std::string(host), o);
    auto world = c10::make_intrusive<c10d::PrefixStore>(c->prefix + "/world", c->store);
    // Each replay thread resolves group names in its own registry: ranks run as threads of
    // one process in tests, and a functional collective must find its own rank's group.
    c10d::set_thread_isolation_mode(true);
    c->groups.push_back(make_group(c.get(), world, rank, size, "0"));
    c->register_group("0", c->groups.back());
    out = c.release();
  });
  return out;
}

// A subgroup of global ranks (every rank calls this in the same order, members or not). Returns
// its index, or -1 with the error set.
int64_t mq_dist_new_group(MqComm* c, const char* name, const int64_t* ranks, size_t n) {
  int64_t idx = -1;
  int rc = guarded([&] {
    int me = -1;
    for (size_t i = 0; i < n; i++)
      if (ranks[i] == c->rank) me = static_cast<int>(i);
    c10::intrusive_ptr<c10d::ProcessGroup> pg;
    if (me >= 0) {
      auto store = c10::make_intrusive<c10d::PrefixStore>(c->prefix + "/" + name, c->store);
      pg = make_group(c, store, me, static_cast<int>(n), name);
      c->register_group(name, pg);
    }
    c->groups.push_back(pg);
    idx = static_cast<int64_t>(c->groups.size()) - 1;
  });
  return rc == 0 ? idx : -1;
}

void mq_dist_free(MqComm* c) { delete c; }

// Pushes group `g` as a ProcessGroup argument; 1 if this rank is not a member (or no group).
int mq_push_group(MqStack* st, MqComm* c, int64_t g) {
  if (!c || g < 0 || static_cast<size_t>(g) >= c->groups.size() || !c->groups[g]) {
    last_error = "this rank is not a member of the collective's process group";
    return 4;
  }
  st->s.emplace_back(c->groups[g]);
  return 0;
}

// Pushes a ReduceOp (c10d::ReduceOp::RedOpType code).
void mq_push_reduce_op(MqStack* st, int op) {
  st->s.emplace_back(c10::make_intrusive<c10d::ReduceOp>(static_cast<c10d::ReduceOp::RedOpType>(op)));
}

// The Work handles among the results on the stack, kept to wait for later (where the trace
// waits). Null when there are none.
struct MqWorks {
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
};

MqWorks* mq_stack_take_works(MqStack* st) {
  auto w = std::make_unique<MqWorks>();
  for (auto& v : st->s) {
    if (!v.isObject()) continue;
    auto obj = v.toObject();
    if (obj->type()->name() &&
        obj->type()->name()->qualifiedName() == "__torch__.torch.classes.c10d.Work") {
      w->works.push_back(v.toCustomClass<c10d::Work>());
    }
  }
  return w->works.empty() ? nullptr : w.release();
}

int mq_works_wait(MqWorks* w, int64_t timeout_ms) {
  return guarded([&] {
    for (auto& work : w->works) work->wait(std::chrono::milliseconds(timeout_ms));
  });
}

void mq_works_free(MqWorks* w) { delete w; }

// Waits for every Work handle among the results on the stack (a collective's async work).
int mq_stack_wait_works(MqStack* st, int64_t timeout_ms) {
  return guarded([&] {
    for (auto& v : st->s) {
      if (!v.isObject() && !v.isCapsule()) continue;
      if (!v.isObject()) continue;
      auto obj = v.toObject();
      if (obj->type()->name() && obj->type()->name()->qualifiedName() ==
                                     "__torch__.torch.classes.c10d.Work") {
        v.toCustomClass<c10d::Work>()->wait(std::chrono::milliseconds(timeout_ms));
      }
    }
  });
}

}  // extern "C"
