//! Kineto (torch.profiler chrome-trace) files: the events this project links ET nodes to.

use crate::error::{clip, Error, Result, MSG_MAX};
use crate::intern::{Interner, Sym};
use serde::Deserialize;
use std::path::Path;

/// Event categories that matter for linking and fidelity; others are `Other`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Category {
    /// An operator on the CPU (`cpu_op`): what ET nodes link to.
    CpuOp,
    /// A `record_function` annotation on the CPU.
    UserAnnotation,
    /// An annotation's span on a GPU stream.
    GpuUserAnnotation,
    /// A GPU kernel.
    Kernel,
    /// A GPU memory copy.
    GpuMemcpy,
    /// A GPU memory set.
    GpuMemset,
    /// A CUDA runtime call (a kernel launch, a synchronisation).
    CudaRuntime,
    /// A CUDA driver call.
    CudaDriver,
    /// A Python function (with the profiler's `with_stack`).
    PythonFunction,
    /// Flow events (`ac2g` for CPU->GPU, `fwdbwd`).
    Flow,
    /// The profiler's own spans (its `Spans` rows).
    Trace,
    /// Any other category.
    Other,
}

impl Category {
    fn from_str(s: &str) -> Category {
        match s {
            "cpu_op" | "Operator" => Category::CpuOp,
            "user_annotation" => Category::UserAnnotation,
            "gpu_user_annotation" => Category::GpuUserAnnotation,
            "kernel" | "Kernel" => Category::Kernel,
            "gpu_memcpy" | "Memcpy" => Category::GpuMemcpy,
            "gpu_memset" | "Memset" => Category::GpuMemset,
            "cuda_runtime" | "Runtime" => Category::CudaRuntime,
            "cuda_driver" => Category::CudaDriver,
            "python_function" => Category::PythonFunction,
            "ac2g" | "fwdbwd" | "async_cpu_to_gpu" => Category::Flow,
            "Trace" => Category::Trace,
            _ => Category::Other,
        }
    }
}

/// pid/tid are numbers for real threads and strings for Kineto's own rows ("Spans").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lane {
    /// A process or thread id.
    Id(i64),
    /// A named row.
    Name(Sym),
}

/// One event of a Kineto trace, its times in microseconds.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// The chrome-trace phase (`X` complete, `s`/`f` flow start/end, `i` instant...).
    pub ph: u8,
    /// The category, as far as this crate tells them apart.
    pub cat: Category,
    /// The category as written.
    pub cat_raw: Sym,
    /// The event's name (the operator's, the kernel's...).
    pub name: Sym,
    /// The process row.
    pub pid: Lane,
    /// The thread (or stream) row.
    pub tid: Lane,
    /// Microseconds (Kineto's unit).
    pub ts: f64,
    /// Duration (µs); 0 for events without one.
    pub dur: f64,
    /// `External id`: ties a CPU op to the runtime calls and kernels it launched.
    pub external_id: Option<u64>,
    /// `Record function id`; `None` where absent or 0 (torch assigns ids only while a callback
    /// asks for them, as the execution trace observer does: a profile taken without it records
    /// 0 for every event).
    pub record_function_id: Option<u64>,
    /// How many tensors the event recorded (`Input Dims` entries that are shapes of at least
    /// one dimension); `None` without `Input Dims` (a profile taken without `record_shapes`).
    pub input_tensors: Option<u32>,
    /// `correlation`: ties a runtime call to the GPU work it launched.
    pub correlation: Option<u64>,
    /// `Ev Idx`: the event's index in the profiler's own order.
    pub ev_idx: Option<u64>,
    /// `Sequence number`: autograd's, shared by a forward op and its backward.
    pub sequence_number: Option<i64>,
    /// `Fwd thread id`: the thread of a backward op's forward op.
    pub fwd_thread_id: Option<i64>,
    /// The GPU stream of GPU work.
    pub stream: Option<i64>,
    /// The GPU of GPU work.
    pub device: Option<i64>,
    /// Flow events' `id`.
    pub flow_id: Option<u64>,
}

/// A memory event (`[memory]`, recorded under `profile_memory=True`): one allocation (positive
/// bytes) or free (negative) through a device's allocator while the profiler ran.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemoryEvent {
    /// Microseconds, as the other events.
    pub ts: f64,
    /// Bytes allocated (positive) or freed (negative).
    pub bytes: i64,
    /// `Total Allocated`: what the allocator reported holding right after, as the profiler
    /// counts it (on the CPU, only what was allocated while it ran and is still held).
    pub total_allocated: i64,
    /// `Device Type` (0 the CPU, 1 CUDA, as `c10::DeviceType` numbers them).
    pub device_type: i64,
    /// `Device Id` (-1 for the CPU).
    pub device_id: i64,
    /// `Addr`: the block's address, which pairs an allocation with its free (0 where absent).
    pub addr: u64,
}

/// A parsed Kineto trace: its events in file order, strings interned.
#[derive(Clone, Debug, Default)]
pub struct KinetoTrace {
    /// Every string of the trace.
    pub strings: Interner,
    /// The events, in file order.
    pub events: Vec<Event>,
    /// The memory events (`profile_memory=True`), in file order; empty without them.
    pub memory: Vec<MemoryEvent>,
    /// `distributedInfo` as JSON text (rank, world_size, backend), when present.
    pub distributed_info: Option<String>,
    /// The rank in `distributedInfo`.
    pub rank: Option<i64>,
    /// The world size in `distributedInfo`.
    pub world_size: Option<i64>,
    /// `baseTimeNanoseconds`: the epoch time the events' timestamps count from.
    pub base_time_ns: Option<u64>,
    /// The top-level `record_shapes` flag (torch.profiler writes it), else whether any event
    /// recorded `Input Dims`.
    pub record_shapes: bool,
    /// Whether the execution trace observer was on while this was profiled: `Some(true)` when
    /// events carry record function ids, `Some(false)` when they carry the field as 0 (a
    /// profile taken without the observer: the ids it would link by were never assigned),
    /// `None` without the field (PyTorch before 2.1).
    pub execution_trace_observer: Option<bool>,
    /// Where the trace came from, for messages.
    pub source: String,
    /// Non-fatal findings: events dropped for impossible times (see [`parse_kineto`]).
    pub warnings: Vec<String>,
}

impl KinetoTrace {
    /// What the allocator of device type `device_type` (0 the CPU, 1 CUDA) held at its peak
    /// over what it held at the start, from the memory events between `from_us` and `to_us`
    /// (the whole trace with `None`): the profiler's own figure for an iteration's memory.
    /// `None` without memory events there.
    pub fn memory_peak_over_start(
        &self,
        device_type: i64,
        window: Option<(f64, f64)>,
    ) -> Option<i64> {
        let mut evs = self.memory.iter().filter(|m| {
            m.device_type == device_type && window.is_none_or(|(a, b)| m.ts >= a && m.ts <= b)
        });
        let first = evs.next()?;
        let start = first.total_allocated - first.bytes;
        let peak = evs.fold(first.total_allocated, |p, m| p.max(m.total_allocated));
        Some((peak - start).max(0))
    }
}

/// The largest timestamp or duration kept, in microseconds: 2^53, where f64 stops holding
/// every microsecond (about 285 years; epoch-based Kineto timestamps are near 1.7e15).
pub const MAX_TIME_US: f64 = 9_007_199_254_740_992.0;

impl KinetoTrace {
    /// The string of `s`.
    pub fn str(&self, s: Sym) -> &str {
        self.strings.get(s)
    }

    /// The process id that ran the CPU ops (the most common numeric pid of cpu_op events).
    pub fn main_pid(&self) -> Option<i64> {
        // std's keyed hash: the pids are the file's to choose (see `IdIndex::Sparse`).
        let mut counts: std::collections::HashMap<i64, usize> = Default::default();
        for e in self.events.iter().filter(|e| e.cat == Category::CpuOp) {
            if let Lane::Id(p) = e.pid {
                *counts.entry(p).or_default() += 1;
            }
        }
        counts
            .into_iter()
            .max_by_key(|&(p, c)| (c, -p))
            .map(|(p, _)| p)
    }
}

#[derive(Deserialize)]
struct RawFile<'a> {
    #[serde(rename = "traceEvents", borrow)]
    trace_events: Option<Vec<RawEvent<'a>>>,
    #[serde(rename = "distributedInfo")]
    distributed_info: Option<serde_json::Value>,
    #[serde(rename = "baseTimeNanoseconds")]
    base_time_ns: Option<u64>,
    record_shapes: Option<serde_json::Value>,
    /// An execution trace's node array: present, the input is an ET given as the profile.
    nodes: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawLane<'a> {
    Id(i64),
    Name(#[serde(borrow)] std::borrow::Cow<'a, str>),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawId<'a> {
    Num(u64),
    Str(#[serde(borrow)] std::borrow::Cow<'a, str>),
}

impl RawId<'_> {
    fn get(&self) -> Option<u64> {
        match self {
            RawId::Num(n) => Some(*n),
            RawId::Str(s) => s
                .parse()
                .ok()
                .or_else(|| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok()),
        }
    }
}

#[derive(Deserialize)]
struct RawEvent<'a> {
    #[serde(borrow)]
    ph: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    cat: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    name: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    pid: Option<RawLane<'a>>,
    #[serde(borrow)]
    tid: Option<RawLane<'a>>,
    ts: Option<f64>,
    dur: Option<f64>,
    #[serde(borrow)]
    id: Option<RawId<'a>>,
    args: Option<RawArgs>,
}

/// The integer arguments are read leniently ([`lenient_int`]): profilers other than CUDA's
/// write some of them otherwise (ROCm's runtime events carry `"stream": "0x0"`), and one such
/// field is no reason to refuse the trace.
#[derive(Deserialize, Default)]
struct RawArgs {
    #[serde(rename = "External id", default, deserialize_with = "lenient_int")]
    external_id: Option<u64>,
    #[serde(
        rename = "Record function id",
        default,
        deserialize_with = "lenient_int"
    )]
    record_function_id: Option<u64>,
    #[serde(default, deserialize_with = "lenient_int")]
    correlation: Option<u64>,
    #[serde(rename = "Ev Idx", default, deserialize_with = "lenient_int")]
    ev_idx: Option<u64>,
    #[serde(rename = "Sequence number", default, deserialize_with = "lenient_int")]
    sequence_number: Option<i64>,
    #[serde(rename = "Fwd thread id", default, deserialize_with = "lenient_int")]
    fwd_thread_id: Option<i64>,
    #[serde(default, deserialize_with = "lenient_int")]
    stream: Option<i64>,
    #[serde(default, deserialize_with = "lenient_int")]
    device: Option<i64>,
    #[serde(rename = "Input Dims")]
    input_dims: Option<TensorCount>,
    #[serde(rename = "Total Allocated", default, deserialize_with = "lenient_int")]
    total_allocated: Option<i64>,
    #[serde(rename = "Bytes", default, deserialize_with = "lenient_int")]
    bytes: Option<i64>,
    #[serde(rename = "Device Type", default, deserialize_with = "lenient_int")]
    device_type: Option<i64>,
    #[serde(rename = "Device Id", default, deserialize_with = "lenient_int")]
    device_id: Option<i64>,
    #[serde(rename = "Addr")]
    addr: Option<Addr>,
}

/// An integer argument: a number, or a string of one in decimal or `0x` hexadecimal; anything
/// else (a float that is no integer, a number out of range, another type) reads as absent.
fn lenient_int<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: TryFrom<i64> + TryFrom<u64>,
{
    struct V<T>(std::marker::PhantomData<T>);
    impl<'de, T: TryFrom<i64> + TryFrom<u64>> serde::de::Visitor<'de> for V<T> {
        type Value = Option<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an integer")
        }
        fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
            Ok(T::try_from(v).ok())
        }
        fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
            Ok(T::try_from(v).ok())
        }
        fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
            let whole = v.fract() == 0.0 && v.abs() < 9.0e15;
            Ok(whole.then(|| T::try_from(v as i64).ok()).flatten())
        }
        fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
            let v = v.trim();
            let n = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
                Some(hex) => u64::from_str_radix(hex, 16)
                    .ok()
                    .map(|n| T::try_from(n).ok()),
                None => match v.parse::<i64>() {
                    Ok(n) => Some(T::try_from(n).ok()),
                    // Above i64's range, a u64 field's.
                    Err(_) => v.parse::<u64>().ok().map(|n| T::try_from(n).ok()),
                },
            };
            Ok(n.flatten())
        }
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D2: serde::Deserializer<'de>>(self, d: D2) -> Result<Self::Value, D2::Error> {
            d.deserialize_any(self)
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut a: A,
        ) -> Result<Self::Value, A::Error> {
            while a.next_element::<serde::de::IgnoredAny>()?.is_some() {}
            Ok(None)
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut a: A,
        ) -> Result<Self::Value, A::Error> {
            while a
                .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                .is_some()
            {}
            Ok(None)
        }
    }
    d.deserialize_any(V(std::marker::PhantomData))
}

/// `Addr` as the profiler writes it (a number); anything else reads as absent rather than
/// failing the event.
#[derive(Deserialize)]
#[serde(untagged)]
enum Addr {
    Number(u64),
    Other(serde::de::IgnoredAny),
}

/// The number of entries of a list that are non-empty lists (`Input Dims`: a tensor's shape
/// is a list of its sizes, a scalar or `None` argument an empty list), read without building
/// the lists.
#[derive(Clone, Copy, Default)]
struct TensorCount(u32);

impl<'de> Deserialize<'de> for TensorCount {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Outer;
        impl<'de> serde::de::Visitor<'de> for Outer {
            type Value = TensorCount;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list of shapes")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<TensorCount, A::Error> {
                let mut n = 0u32;
                while let Some(NonEmpty(yes)) = seq.next_element()? {
                    n += yes as u32;
                }
                Ok(TensorCount(n))
            }
            // Anything else (a string, a number) records no shapes.
            fn visit_str<E>(self, _: &str) -> std::result::Result<TensorCount, E> {
                Ok(TensorCount(0))
            }
            fn visit_u64<E>(self, _: u64) -> std::result::Result<TensorCount, E> {
                Ok(TensorCount(0))
            }
            fn visit_i64<E>(self, _: i64) -> std::result::Result<TensorCount, E> {
                Ok(TensorCount(0))
            }
            fn visit_f64<E>(self, _: f64) -> std::result::Result<TensorCount, E> {
                Ok(TensorCount(0))
            }
            fn visit_unit<E>(self) -> std::result::Result<TensorCount, E> {
                Ok(TensorCount(0))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<TensorCount, A::Error> {
                while map
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(TensorCount(0))
            }
        }
        d.deserialize_any(Outer)
    }
}

/// Whether one value is a non-empty list (its elements skipped).
struct NonEmpty(bool);

impl<'de> Deserialize<'de> for NonEmpty {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = NonEmpty;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a shape")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<NonEmpty, A::Error> {
                let mut any = false;
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                    any = true;
                }
                Ok(NonEmpty(any))
            }
            fn visit_str<E>(self, _: &str) -> std::result::Result<NonEmpty, E> {
                Ok(NonEmpty(false))
            }
            fn visit_u64<E>(self, _: u64) -> std::result::Result<NonEmpty, E> {
                Ok(NonEmpty(false))
            }
            fn visit_i64<E>(self, _: i64) -> std::result::Result<NonEmpty, E> {
                Ok(NonEmpty(false))
            }
            fn visit_f64<E>(self, _: f64) -> std::result::Result<NonEmpty, E> {
                Ok(NonEmpty(false))
            }
            fn visit_bool<E>(self, _: bool) -> std::result::Result<NonEmpty, E> {
                Ok(NonEmpty(false))
            }
            fn visit_unit<E>(self) -> std::result::Result<NonEmpty, E> {
                Ok(NonEmpty(false))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<NonEmpty, A::Error> {
                while map
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(NonEmpty(false))
            }
        }
        d.deserialize_any(V)
    }
}

/// Reads a Kineto trace (`.json`, `.json.gz`, or `-`) within the default
/// [`ReadOptions`](crate::ReadOptions).
pub fn read_kineto(path: &Path) -> Result<KinetoTrace> {
    read_kineto_with(path, &crate::ReadOptions::default())
}

/// [`read_kineto`] within the limits of `ropts`.
pub fn read_kineto_with(path: &Path, ropts: &crate::ReadOptions) -> Result<KinetoTrace> {
    let bytes = crate::read_input_with(path, ropts)?;
    parse_kineto(&bytes, &path.display().to_string())
}

/// Parses a Kineto trace. Events whose `ts` or `dur` is negative, not finite or over
/// [`MAX_TIME_US`] are dropped, and counted in one warning naming the first: a few glitched
/// device events should not refuse a whole trace, and none of them may reach the gap and ratio
/// arithmetic downstream. A missing `ts` or `dur` is 0.
pub fn parse_kineto(bytes: &[u8], source: &str) -> Result<KinetoTrace> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(Error::NotKineto {
            path: source.into(),
            msg: "the input is empty".into(),
        });
    }
    let raw: RawFile = serde_json::from_slice(bytes).map_err(|e| {
        if e.is_eof() {
            Error::KinetoTruncated {
                path: source.into(),
                offset: bytes.len() as u64,
            }
        } else if e.is_syntax() {
            Error::Syntax {
                path: source.into(),
                offset: line_col_offset(bytes, e.line(), e.column()),
                msg: crate::parse::serde_message(&e.to_string()),
            }
        } else {
            // A value of the wrong kind (`"dur": "x"`): where it is, since there is no other
            // offset in this error.
            Error::NotKineto {
                path: source.into(),
                msg: format!(
                    "{} at byte {}",
                    crate::parse::serde_message(&e.to_string()),
                    line_col_offset(bytes, e.line(), e.column())
                ),
            }
        }
    })?;
    let events = raw.trace_events.ok_or_else(|| Error::NotKineto {
        path: source.into(),
        msg: if raw.nodes.is_some() {
            "it is an execution trace (a \"nodes\" array, no \"traceEvents\"): give the \
             profiler's trace here, the execution trace where the command takes it"
                .into()
        } else {
            "no \"traceEvents\" array".into()
        },
    })?;
    let mut k = KinetoTrace {
        source: source.to_string(),
        base_time_ns: raw.base_time_ns,
        ..Default::default()
    };
    let flag = raw.record_shapes.as_ref().and_then(|v| match v {
        serde_json::Value::Bool(b) => Some(*b),
        serde_json::Value::Number(n) => n.as_f64().map(|x| x != 0.0),
        _ => None,
    });
    let (mut any_dims, mut ids, mut nonzero_ids) = (false, false, false);
    if let Some(d) = raw.distributed_info {
        k.rank = d.get("rank").and_then(|v| v.as_i64());
        k.world_size = d.get("world_size").and_then(|v| v.as_i64());
        k.distributed_info = Some(d.to_string());
    }
    k.events.reserve(events.len());
    let (mut dropped, mut first_dropped) = (0usize, None);
    let time_ok = |t: f64| t.is_finite() && (0.0..=MAX_TIME_US).contains(&t);
    for (index, e) in events.into_iter().enumerate() {
        let (ts, dur) = (e.ts.unwrap_or(0.0), e.dur.unwrap_or(0.0));
        if !(time_ok(ts) && time_ok(dur) && time_ok(ts + dur)) {
            dropped += 1;
            first_dropped.get_or_insert_with(|| {
                format!(
                    "{:?} at index {index} (ts {ts}, dur {dur})",
                    clip(e.name.as_deref().unwrap_or(""), MSG_MAX)
                )
            });
            continue;
        }
        let mut lane = |l: Option<RawLane>| match l {
            Some(RawLane::Id(i)) => Lane::Id(i),
            Some(RawLane::Name(s)) => Lane::Name(k.strings.intern(&s)),
            None => Lane::Id(0),
        };
        let pid = lane(e.pid);
        let tid = lane(e.tid);
        let cat_s = e.cat.as_deref().unwrap_or("");
        let a = e.args.unwrap_or_default();
        any_dims |= a.input_dims.is_some();
        ids |= a.record_function_id.is_some();
        nonzero_ids |= a.record_function_id.is_some_and(|id| id != 0);
        if let (Some(bytes), Some(total)) = (a.bytes, a.total_allocated) {
            if e.name.as_deref() == Some("[memory]") {
                k.memory.push(MemoryEvent {
                    ts,
                    bytes,
                    total_allocated: total,
                    device_type: a.device_type.unwrap_or(0),
                    device_id: a.device_id.unwrap_or(-1),
                    addr: match a.addr {
                        Some(Addr::Number(n)) => n,
                        _ => 0,
                    },
                });
            }
        }
        k.events.push(Event {
            ph: e
                .ph
                .as_deref()
                .and_then(|p| p.bytes().next())
                .unwrap_or(b'?'),
            cat: Category::from_str(cat_s),
            cat_raw: k.strings.intern(cat_s),
            name: k.strings.intern(e.name.as_deref().unwrap_or("")),
            pid,
            tid,
            ts,
            dur,
            external_id: a.external_id,
            record_function_id: a.record_function_id.filter(|&id| id != 0),
            input_tensors: a.input_dims.map(|c| c.0),
            correlation: a.correlation,
            ev_idx: a.ev_idx,
            sequence_number: a.sequence_number,
            fwd_thread_id: a.fwd_thread_id,
            stream: a.stream,
            device: a.device,
            flow_id: e.id.and_then(|i| i.get()),
        });
    }
    k.record_shapes = flag.unwrap_or(any_dims);
    k.execution_trace_observer = ids.then_some(nonzero_ids);
    if let Some(first) = first_dropped {
        k.warnings.push(format!(
            "{dropped} events with a negative, non-finite or absurd (over {MAX_TIME_US} us) timestamp or duration were dropped; the first: {first}"
        ));
    }
    Ok(k)
}

fn line_col_offset(b: &[u8], line: usize, col: usize) -> u64 {
    let mut off = 0;
    for _ in 1..line {
        match memchr::memchr(b'\n', &b[off..]) {
            Some(k) => off += k + 1,
            None => break,
        }
    }
    (off + col.saturating_sub(1)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_events_args_and_string_lanes() {
        let j = br#"{"distributedInfo": {"backend": "nccl", "rank": 3, "world_size": 8},
          "traceEvents": [
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 5, "tid": 6, "ts": 10.5, "dur": 2,
             "args": {"External id": 7, "Record function id": 9, "Ev Idx": 1, "Input Dims": [[1]]}},
            {"ph": "X", "cat": "Trace", "name": "x", "pid": "Spans", "tid": "PyTorch Profiler", "ts": 1},
            {"ph": "s", "cat": "ac2g", "id": 44, "pid": 5, "tid": 6, "ts": 11}
          ]}"#;
        let k = parse_kineto(j, "t").unwrap();
        assert_eq!(k.events.len(), 3);
        assert_eq!(k.rank, Some(3));
        assert_eq!(k.world_size, Some(8));
        let e = &k.events[0];
        assert_eq!(e.cat, Category::CpuOp);
        assert_eq!(k.str(e.name), "aten::mm");
        assert_eq!(
            (e.external_id, e.record_function_id, e.ev_idx),
            (Some(7), Some(9), Some(1))
        );
        assert_eq!(e.input_tensors, Some(1));
        assert_eq!(k.events[1].input_tensors, None);
        assert!(k.record_shapes);
        assert_eq!(k.execution_trace_observer, Some(true));
        assert!(matches!(k.events[1].pid, Lane::Name(_)));
        assert_eq!(k.events[2].flow_id, Some(44));
        assert_eq!(k.main_pid(), Some(5));
    }

    #[test]
    fn a_profile_without_the_observer_has_no_record_function_ids() {
        // torch.profiler without the execution trace observer writes `Record function id: 0`
        // for every event: no id to link by, and the trace says how it was taken.
        let j = br#"{"record_shapes": 0, "traceEvents": [
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 5, "tid": 5, "ts": 1, "dur": 2,
             "args": {"External id": 3, "Record function id": 0,
                      "Input Dims": [[4, 8], [], [8], "x", [[]], 7, null, {"a": 1}]}},
            {"ph": "X", "cat": "cpu_op", "name": "aten::t", "pid": 5, "tid": 5, "ts": 4, "dur": 1,
             "args": {"Record function id": 0, "Input Dims": "odd"}}
          ]}"#;
        let k = parse_kineto(j, "t").unwrap();
        assert_eq!(k.events[0].record_function_id, None);
        assert_eq!(k.events[0].external_id, Some(3));
        assert_eq!(k.execution_trace_observer, Some(false));
        // The flag wins over the events' `Input Dims`.
        assert!(!k.record_shapes);
        // [4, 8], [8] and [[]] are lists with elements; [], "x", 7, null and a map are not.
        assert_eq!(k.events[0].input_tensors, Some(3));
        assert_eq!(k.events[1].input_tensors, Some(0));
        // No field at all: an older PyTorch, which says nothing of the observer.
        let k = parse_kineto(
            br#"{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": 1}]}"#,
            "t",
        )
        .unwrap();
        assert_eq!(k.execution_trace_observer, None);
        assert!(!k.record_shapes);
    }

    #[test]
    fn rejects_non_kineto() {
        // An execution trace given as the profile says so; an empty input is empty, not cut.
        let e = parse_kineto(br#"{"nodes": [], "schema": "1.1.1"}"#, "t").unwrap_err();
        assert!(
            matches!(&e, Error::NotKineto { msg, .. } if msg.contains("an execution trace")),
            "{e}"
        );
        let e = parse_kineto(b"{}", "t").unwrap_err();
        assert!(e.to_string().contains("no \"traceEvents\""), "{e}");
        for empty in [&b""[..], b"\n  "] {
            let e = parse_kineto(empty, "t").unwrap_err();
            assert!(e.to_string().contains("the input is empty"), "{e}");
        }
        assert!(matches!(
            parse_kineto(br#"{"traceEvents": [{"ph": "X""#, "t"),
            Err(Error::KinetoTruncated { .. })
        ));
    }

    /// Integer arguments written otherwise than as numbers (ROCm's `"stream": "0x0"`, a float,
    /// a decimal string) are read where they hold an integer and absent where they do not:
    /// the event and the trace stand.
    #[test]
    fn integer_arguments_written_as_strings_or_floats_are_read() {
        let k = parse_kineto(
            br#"{"traceEvents": [
              {"ph": "X", "cat": "cuda_runtime", "name": "hipMemcpyWithStream", "ts": 1, "dur": 2,
               "args": {"stream": "0x1f", "correlation": "12", "device": 1.0,
                        "External id": [3], "Ev Idx": "n/a", "Sequence number": -4}}]}"#,
            "t",
        )
        .unwrap();
        let e = &k.events[0];
        assert_eq!(e.stream, Some(31));
        assert_eq!(e.correlation, Some(12));
        assert_eq!(e.device, Some(1));
        assert_eq!(e.external_id, None);
        assert_eq!(e.ev_idx, None);
        assert_eq!(e.sequence_number, Some(-4));
        let k = parse_kineto(
            br#"{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": 1,
               "args": {"External id": "18446744073709551615"}}]}"#,
            "t",
        )
        .unwrap();
        assert_eq!(k.events[0].external_id, Some(u64::MAX));
    }
}
