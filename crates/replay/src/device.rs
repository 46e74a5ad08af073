//! The device seam: everything the executor needs from the machine it replays on, so the run
//! loop never matches on a device itself. A [`Device`] owns process set-up (allocator settings,
//! denormal mode), allocation of external inputs and synthesised outputs, the device argument
//! of ops, `synchronize`, a [`Timer`] whose marks are resolved after an iteration, a memory
//! snapshot, and the table of [`Rewrite`]s (ops without a kernel on this device and what runs
//! instead) that [`crate::bind()`] applies to a plan.
//!
//! `Cpu` times steps with the host clock. `Cuda` (see [`crate::cuda`]) runs the same kernels
//! through libtorch's CUDA build on a replay stream that Rust owns and libtorch uses as its
//! current stream, carves external inputs from one arena, and times steps with CUDA events on
//! that stream, resolved after each iteration (the host clock still gives each op's launch
//! time). Without the `cuda` feature, or without a driver or device, `Device::parse("cuda")`
//! says which is missing.

use crate::error::{CallError, ReplayError};
use crate::ffi;
use crate::plan::TensorSpec;
use tch::Tensor;

/// Where a replay runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Device {
    #[default]
    Cpu,
    Cuda(usize),
}

/// Memory use on a device at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MemorySnapshot {
    /// Bytes in use now (CPU: the process's resident memory).
    pub live_bytes: u64,
    /// The most in use so far (CPU: the process's peak resident memory).
    pub peak_bytes: u64,
}

impl Device {
    /// Parses `cpu`, `cuda`, `cuda:N`; CUDA must be present.
    pub fn parse(s: &str) -> Result<Device, ReplayError> {
        let d = match s {
            "cpu" => Device::Cpu,
            "cuda" => Device::Cuda(0),
            _ => match s.strip_prefix("cuda:").and_then(|i| i.parse().ok()) {
                Some(i) => Device::Cuda(i),
                None => {
                    return Err(ReplayError::Device(format!(
                        "unknown device {s:?} (cpu, cuda, cuda:N)"
                    )))
                }
            },
        };
        if let Device::Cuda(i) = d {
            // The driver first: cudarc must not be used without libcuda, and its message says
            // what is missing better than libtorch's "no device".
            crate::cuda::runtime(i)
                .map_err(|e| ReplayError::Device(format!("{e} (replay with --device cpu)")))?;
            if !tch::Cuda::is_available() {
                return Err(ReplayError::Device(
                    "no CUDA device: the driver sees a GPU but this libtorch cannot use it (a \
                     CPU-only libtorch, or a driver older than its CUDA); replay with --device cpu"
                        .into(),
                ));
            }
            if i >= tch::Cuda::device_count() as usize {
                return Err(ReplayError::Device(format!(
                    "cuda:{i} does not exist ({} CUDA devices)",
                    tch::Cuda::device_count()
                )));
            }
        }
        Ok(d)
    }

    /// The CUDA runtime of this device (`None` on CPU).
    pub(crate) fn cuda(&self) -> Option<std::sync::Arc<crate::cuda::Runtime>> {
        match self {
            Device::Cpu => None,
            Device::Cuda(i) => crate::cuda::runtime(*i).ok(),
        }
    }

    /// `cpu`, `cuda:N`.
    pub fn name(&self) -> String {
        match self {
            Device::Cpu => "cpu".into(),
            Device::Cuda(i) => format!("cuda:{i}"),
        }
    }

    pub(crate) fn tch(&self) -> tch::Device {
        match self {
            Device::Cpu => tch::Device::Cpu,
            Device::Cuda(i) => tch::Device::Cuda(*i),
        }
    }

    /// Sets the process up as a warm model's (glibc keeps freed memory, denormals flush to
    /// zero) and, on CUDA, makes the replay stream current on this thread.
    pub fn setup_process(&self) -> Result<(), ReplayError> {
        keep_freed_memory();
        if let Device::Cuda(i) = self {
            crate::cuda::runtime(*i)
                .and_then(|r| r.make_current())
                .map_err(ReplayError::Device)?;
        }
        // Synthetic values can decay into denormals the original's real ones never reached (an
        // optimizer's second moment under a stand-in beta): each op on them takes the CPU's
        // microcode path: one of AdamW's sqrt calls on the transformer took 950 us; all 24 take
        // 0.16 ms per iteration once flushed.
        ffi::flush_denormal();
        Ok(())
    }

    /// An uninitialised tensor of the given shape, strides and dtype on this device.
    pub fn empty_strided(&self, spec: &TensorSpec) -> Result<Tensor, CallError> {
        ffi::empty_strided(
            &spec.shape,
            &spec.strides,
            spec.dtype.scalar_type_code() as i32,
            self.tch(),
        )
    }

    /// A zero tensor of the recorded shape, strides and dtype: the stand-in output of a failed
    /// or skipped op.
    pub fn synthesise(&self, spec: &TensorSpec) -> Option<Tensor> {
        let mut t = self.empty_strided(spec).ok()?;
        let _ = t.f_zero_();
        Some(t)
    }

    /// A 0-dim tensor on this device (for in-place arithmetic on device tensors).
    pub(crate) fn scalar(&self, v: f64) -> Tensor {
        Tensor::from(v).to_device(self.tch())
    }

    /// Pushes this device as an op's `Device` argument (trace devices are remapped to it).
    pub(crate) fn push_arg(&self, stack: &mut ffi::Stack) {
        stack.device(self.tch())
    }

    /// Waits until the work queued on this device is done.
    pub fn synchronize(&self) {
        if let Device::Cuda(i) = self {
            tch::Cuda::synchronize(*i as i64);
        }
    }

    /// A timer for steps on this device.
    pub fn timer(&self) -> Timer {
        Timer {
            clock: metrics::Clock::default(),
            marks: Vec::new(),
            device: *self,
            events: self.cuda().map(|r| r.timer()),
            resolved: Vec::new(),
            event_error: None,
        }
    }

    /// Memory in use on this device, where it can be read (CUDA: libtorch's caching allocator,
    /// allocated bytes; the external-input arena is not in it).
    pub fn memory(&self) -> Option<MemorySnapshot> {
        match self {
            Device::Cpu => metrics::process_memory().map(|m| MemorySnapshot {
                live_bytes: m.rss_bytes,
                peak_bytes: m.peak_rss_bytes,
            }),
            Device::Cuda(i) => ffi::cuda_memory_stats(*i).ok().map(|m| MemorySnapshot {
                live_bytes: m.allocated_bytes,
                peak_bytes: m.peak_allocated_bytes,
            }),
        }
    }

    /// Memory the replay can still have on this device (CPU: the host's available memory;
    /// CUDA: the device's free memory).
    pub fn available_memory(&self) -> Option<u64> {
        match self {
            Device::Cpu => metrics::available_memory(),
            Device::Cuda(_) => self.cuda()?.free_memory(),
        }
    }

    /// One allocation to carve `bytes` of external inputs from (CUDA), or `None` where they are
    /// allocated one by one (CPU; or CUDA when the arena cannot be had, which is logged).
    pub(crate) fn arena(&self, bytes: usize) -> Option<crate::cuda::Arena> {
        let rt = self.cuda()?;
        match rt.arena(bytes) {
            Ok(a) => Some(a),
            Err(e) => {
                log::warn!("{e}; external inputs go to libtorch's allocator instead");
                None
            }
        }
    }

    /// Ops without a kernel on this device and what runs instead.
    pub fn rewrites(&self) -> &'static [Rewrite] {
        match self {
            Device::Cpu => CPU_REWRITES,
            Device::Cuda(_) => CUDA_REWRITES,
        }
    }

    /// The rewrite for an op, by its node name or its schema's full name: this device's, else
    /// one every device takes ([`ANY_DEVICE_REWRITES`]).
    pub fn rewrite_for(&self, names: &[&str]) -> Option<&'static Rewrite> {
        self.rewrites()
            .iter()
            .chain(ANY_DEVICE_REWRITES)
            .find(|r| names.contains(&r.op))
    }
}

/// The first CUDA device, when this machine has one (for per-device tests).
pub fn cuda_if_present() -> Option<Device> {
    Device::parse("cuda").ok()
}

/// Defines a test module with one test per device, running `check(&Device)`: `cpu` always;
/// `cuda` is ignored by default, with its reason, since most machines that run the suite have
/// no GPU (`cargo xtask gpu-check` runs it with `--include-ignored` on one that does, where a
/// missing device fails it), as candle's `test_device!`.
///
/// ```ignore
/// fn replays(device: &replay::Device) { /* ... */ }
/// replay::test_device!(replays_everywhere, replays);
/// ```
#[macro_export]
macro_rules! test_device {
    ($name:ident, $check:ident) => {
        mod $name {
            #[test]
            fn cpu() {
                super::$check(&$crate::Device::Cpu)
            }

            #[test]
            #[ignore = "needs a CUDA device: cargo xtask gpu-check runs it"]
            fn cuda() {
                match $crate::device::cuda_if_present() {
                    Some(d) => super::$check(&d),
                    None => panic!("no CUDA device for {}", stringify!($name)),
                }
            }
        }
    };
}

/// A position in a [`Timer`]'s record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark(u32);

/// Records marks around steps during an iteration and resolves them to times after it, so the
/// loop never waits on the device per op. CPU: a monotonic clock read per mark. CUDA: also an
/// event per mark on the replay stream; resolved marks are then the device's times, put on the
/// host clock at the round's first mark.
pub struct Timer {
    clock: metrics::Clock,
    marks: Vec<f64>,
    device: Device,
    events: Option<metrics::cuda::EventTimer>,
    /// Device times of the marks (µs after the first), once resolved.
    resolved: Vec<f64>,
    /// Why CUDA events stopped (the marks fall back to the host clock).
    pub event_error: Option<String>,
}

impl Timer {
    /// Records a mark now (in the device's order of work).
    #[inline]
    pub fn mark(&mut self) -> Mark {
        self.marks.push(self.clock.now_us());
        if let Some(ev) = &mut self.events {
            if let Err(e) = ev.record() {
                self.event_error = Some(e.to_string());
                self.events = None;
            }
        }
        Mark(self.marks.len() as u32 - 1)
    }

    /// Whether resolved marks are the device's times (CUDA events) rather than the host's.
    pub fn on_device(&self) -> bool {
        self.events.is_some()
    }

    /// The clock marks are read on (to put other samples, e.g. NVML's, on the same axis).
    pub fn clock(&self) -> metrics::Clock {
        self.clock
    }

    /// The host clock's time when mark `m` was recorded (valid at once, before [`Timer::resolve`]).
    #[inline]
    pub fn host_at(&self, m: Mark) -> f64 {
        self.marks[m.0 as usize]
    }

    /// The host clock in µs: for work that happens on the host (emulated gaps, bookkeeping).
    #[inline]
    pub fn host_us(&self) -> f64 {
        self.clock.now_us()
    }

    /// Waits for the device and makes every mark readable with [`Timer::us`].
    pub fn resolve(&mut self) {
        self.device.synchronize();
        self.resolved.clear();
        if let Some(ev) = &self.events {
            match ev.resolve() {
                Ok(v) => self.resolved = v,
                Err(e) => {
                    self.event_error = Some(e.to_string());
                    self.events = None;
                }
            }
        }
    }

    /// A resolved mark's time in µs: the device's where events timed every mark of this
    /// round, else the host's.
    pub fn us(&self, m: Mark) -> f64 {
        if self.resolved.len() == self.marks.len() && !self.marks.is_empty() {
            self.marks[0] + self.resolved[m.0 as usize]
        } else {
            self.marks[m.0 as usize]
        }
    }

    /// Forgets the marks (between iterations).
    pub fn clear(&mut self) {
        self.marks.clear();
        self.resolved.clear();
        if let Some(ev) = &mut self.events {
            ev.clear();
        }
    }
}

/// An op that has no kernel on a device, and what a replay there runs instead.
#[derive(Clone, Copy, Debug)]
pub struct Rewrite {
    /// The op's name (`aten::record_stream`) or its schema's full name (`name.overload`).
    pub op: &'static str,
    /// The recorded arguments the rewrite applies to.
    pub arity: Arity,
    pub to: RewriteTo,
}

#[derive(Clone, Copy, Debug)]
pub enum Arity {
    Any,
    Exactly(usize),
    AtLeast(usize),
}

impl Arity {
    pub fn accepts(self, n: usize) -> bool {
        match self {
            Arity::Any => true,
            Arity::Exactly(k) => n == k,
            Arity::AtLeast(k) => n >= k,
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub enum RewriteTo {
    /// Nothing to do on this device: outputs pass through (whatever the arguments, a Stream
    /// included).
    Elide,
    /// The call cannot be made from what the trace holds, but its outputs can: nothing runs,
    /// and its outputs are made at their recorded specs, as a failed op's are (`why` says
    /// what is missing, for the report).
    MadeAsRecorded { why: &'static str },
    /// Another operator, its arguments taken from the recorded ones or constants.
    Call {
        name: &'static str,
        overload: &'static str,
        args: &'static [ArgFrom],
    },
}

/// Where an argument of a rewritten call comes from.
#[derive(Clone, Copy, Debug)]
pub enum ArgFrom {
    Recorded(usize),
    Bool(bool),
    BoolList(&'static [u8]),
}

/// Operators a CUDA replay need not run: it issues every op on one stream, so telling the
/// caching allocator that a tensor is used on another stream has nothing to protect (and the
/// trace's stream handle does not exist in this process).
const CUDA_REWRITES: &[Rewrite] = &[Rewrite {
    op: "aten::record_stream",
    arity: Arity::Any,
    to: RewriteTo::Elide,
}];

/// Operators no device can call as recorded.
pub const ANY_DEVICE_REWRITES: &[Rewrite] = &[
    // A DataLoader with workers hands each batch over in shared memory: the main process's
    // unpickling sets an empty tensor to that storage, which the ET records as "<Storage>".
    // The batch's size, strides and dtype are recorded: it is made at them, zero-filled, once
    // (the workers made the original's in other processes, off the iteration's time).
    Rewrite {
        op: "aten::set_.source_Storage_storage_offset",
        arity: Arity::Any,
        to: RewriteTo::MadeAsRecorded {
            why: "the storage it was set to (a DataLoader worker's shared memory) is not in \
                  the trace",
        },
    },
];

/// CUDA-only operators on a CPU replay.
const CPU_REWRITES: &[Rewrite] = &[
    // Stream bookkeeping that has no effect on a CPU replay.
    Rewrite {
        op: "aten::record_stream",
        arity: Arity::Any,
        to: RewriteTo::Elide,
    },
    Rewrite {
        op: "cuda::synchronize",
        arity: Arity::Any,
        to: RewriteTo::Elide,
    },
    Rewrite {
        op: "aten::_cuda_synchronize",
        arity: Arity::Any,
        to: RewriteTo::Elide,
    },
    // (input, grad_output, weight, running_mean, running_var, save_mean, save_var, eps,
    // reserve) -> native_batch_norm_backward(grad_out, input, weight, running_mean,
    // running_var, save_mean, save_invstd, train, eps, output_mask)
    Rewrite {
        op: "aten::cudnn_batch_norm_backward",
        arity: Arity::Exactly(9),
        to: RewriteTo::Call {
            name: "aten::native_batch_norm_backward",
            overload: "",
            args: &[
                ArgFrom::Recorded(1),
                ArgFrom::Recorded(0),
                ArgFrom::Recorded(2),
                ArgFrom::Recorded(3),
                ArgFrom::Recorded(4),
                ArgFrom::Recorded(5),
                ArgFrom::Recorded(6),
                ArgFrom::Bool(true),
                ArgFrom::Recorded(7),
                ArgFrom::BoolList(&[1, 1, 1]),
            ],
        },
    },
    Rewrite {
        op: "aten::pin_memory",
        arity: Arity::AtLeast(1),
        to: RewriteTo::Call {
            name: "aten::alias",
            overload: "",
            args: &[ArgFrom::Recorded(0)],
        },
    },
];

/// Makes glibc keep freed memory in the process instead of handing it back to the OS.
///
/// A model's process in its steady state re-uses its heap: the shared CPU models fault about one
/// fresh page per training iteration. With glibc's defaults a replay does not: it frees every
/// intermediate at the end of an iteration, the top of the heap is trimmed (and blocks above the
/// dynamic mmap threshold are unmapped), so the next iteration faults its tensors in again
/// (cnn: ~400 faults, a third of its op time). Fixed thresholds at the values glibc's dynamic
/// ones reach in a long-running process: blocks up to 32 MiB come from the heap, which is never
/// trimmed. Process-wide and idempotent; other allocators are left alone.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        // SAFETY: mallopt only changes allocator parameters; any value is accepted or refused.
        ONCE.call_once(|| unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        });
    }
}

/// Grows the heap by `bytes` of pages already faulted in, kept for the allocations that follow
/// (with [`keep_freed_memory`], nothing trims them). The profiler (and the execution trace
/// observer) keep every event of a session in memory, so under the capture's instrumentation
/// the heap grows all the time, the replay's intermediates land on fresh pages, and every
/// iteration faults them in: DLRM's calibration took ~190 page faults per instrumented
/// iteration against none plain, its embedding-bag gradients' `zero_` 72 µs instead of 5, which
/// read as a host 1.8x slower than the capture's. A warm Python process, the capture's, had a
/// heap to spare. In pieces below the mmap threshold, so they come from the heap and return to
/// it when freed.
pub fn warm_heap(bytes: usize) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        keep_freed_memory();
        const PIECE: usize = 4 << 20;
        let pieces: Vec<Vec<u8>> = (0..bytes.div_ceil(PIECE))
            .map(|_| {
                let mut v: Vec<u8> = Vec::with_capacity(PIECE);
                // Touch every page (the spare capacity is the allocator's memory, written
                // through the raw pointer without reading it).
                let p = v.as_mut_ptr();
                for off in (0..PIECE).step_by(4096) {
                    // SAFETY: within the allocation of PIECE bytes.
                    unsafe { p.add(off).write_volatile(0) };
                }
                v
            })
            .collect();
        drop(pieces);
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = bytes;
}
