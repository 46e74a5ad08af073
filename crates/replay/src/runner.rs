//! Executing a [`Plan`]: materialise external inputs once, then run warm-up and measured
//! iterations, timing each op, recording failures and synthesising their outputs so that
//! dependants still run.

use crate::ffi::{self, Stack};
use crate::plan::{Arg, Fill, Out, Plan, Step, TensorSpec};
use crate::{Failure, OpTiming, ReplayError, ReplayOptions, Report};
use metrics::{Clock, Slice, Stats};
use std::collections::{BTreeMap, HashMap};
use tch::{Device, Kind, Tensor};

fn kind_of(d: et_schema::DType) -> Kind {
    use et_schema::DType as D;
    match d {
        D::UInt8 => Kind::Uint8,
        D::Int8 => Kind::Int8,
        D::Int16 => Kind::Int16,
        D::Int32 => Kind::Int,
        D::Int64 => Kind::Int64,
        D::Float16 => Kind::Half,
        D::Float64 => Kind::Double,
        D::Bool => Kind::Bool,
        D::BFloat16 => Kind::BFloat16,
        D::Complex64 => Kind::ComplexFloat,
        D::Complex128 => Kind::ComplexDouble,
        _ => Kind::Float,
    }
}

/// Allocates the external inputs: one allocation per trace storage, views into it, values
/// that suit their consumers (random floats; valid indices; sorted offsets).
pub fn materialise(plan: &Plan, device: Device) -> Result<Vec<Option<Tensor>>, ReplayError> {
    let mut slots: Vec<Option<Tensor>> = (0..plan.n_slots).map(|_| None).collect();
    // Group by (storage, dtype): views of one storage share one allocation.
    let mut groups: BTreeMap<(u64, et_schema::DType), Vec<usize>> = BTreeMap::new();
    for (k, (_, spec, _)) in plan.externals.iter().enumerate() {
        groups
            .entry((spec.storage, spec.dtype))
            .or_default()
            .push(k);
    }
    for ((_, dtype), members) in groups {
        let extent = members
            .iter()
            .map(|&k| plan.externals[k].1.extent())
            .max()
            .unwrap_or(0)
            .max(1);
        let mut base = ffi::empty_strided(&[extent], &[1], dtype.scalar_type_code() as i32, device)
            .map_err(ReplayError::Materialise)?;
        // Floats get standard normal values, scaled per view below; integers and bools start
        // at zero and index inputs are filled per view below.
        if dtype.is_floating_point() {
            if base.f_normal_(0.0, 1.0).is_err() {
                let _ = base.f_zero_();
            }
        } else {
            let _ = base.zero_();
        }
        for k in members {
            let (slot, spec, fill) = &plan.externals[k];
            let mut view = base
                .f_as_strided(spec.shape.as_slice(), spec.strides.as_slice(), spec.offset)
                .map_err(|e| ReplayError::Materialise(e.to_string()))?;
            fill_view(&mut view, spec, fill, device);
            slots[*slot as usize] = Some(view);
        }
    }
    Ok(slots)
}

/// Whether a float tensor a step touched holds NaN/Inf after it: its outputs, and its inputs,
/// which in-place ops write (`_foreach_add_` returns nothing). Allocating ops (`empty*`) are
/// skipped: their outputs hold whatever the memory held.
fn produced_nonfinite(step: &Step, slots: &[Option<Tensor>]) -> bool {
    let inputs = step.args.iter().flat_map(Arg::slots);
    !step.name.contains("empty")
        && step
            .out_specs
            .iter()
            .map(|(s, _)| *s)
            .chain(inputs)
            .any(|s| slots[s as usize].as_ref().is_some_and(nonfinite))
}

/// Whether a float tensor holds NaN or Inf.
fn nonfinite(t: &Tensor) -> bool {
    t.is_floating_point()
        && t.f_isfinite()
            .and_then(|f| f.f_all())
            .is_ok_and(|a| a.int64_value(&[]) == 0)
}

/// Marks the plan's grad inputs (the parameters) as requiring grad, as the model's were.
fn require_grad(plan: &Plan, externals: &[Option<Tensor>]) {
    for &s in &plan.grad_inputs {
        if let Some(t) = &externals[s as usize] {
            // A view of a storage another input shares is a leaf too; one that is not (none
            // are made so) keeps running without a graph.
            let _ = ffi::set_requires_grad(&mut t.shallow_clone());
        }
    }
}

/// Shapes a view's values for its consumer. Best effort: libtorch refuses in-place writes to a
/// view whose elements overlap (an expanded input, stride 0), and such a view keeps the values
/// of its storage (standard normal floats, zero integers: valid indices). Only Tensor-argument
/// calls here: tch's Scalar-taking ones panic when libtorch reports an error.
fn fill_view(view: &mut Tensor, spec: &TensorSpec, fill: &Fill, device: Device) {
    let kind = kind_of(spec.dtype);
    let scalar = |v: f64| Tensor::from(v).to_device(device);
    // Random values at the scale of an initialised model (std 1/sqrt(fan-in), like PyTorch's
    // default inits): activations keep their magnitude through a deep stack of layers instead
    // of growing by sqrt(fan-in) x std per layer to Inf (a 30-layer 1024-wide MLP did at 0.1),
    // and no value is denormal.
    if matches!(fill, Fill::Random | Fill::NonNegative) && spec.dtype.is_floating_point() {
        let fan_in = match spec.shape.as_slice() {
            [] | [_] => 100,
            [rows, ..] => (spec.shape.iter().product::<i64>() / (*rows).max(1)).max(1),
        };
        let _ = view.f_mul_(&scalar(1.0 / (fan_in as f64).sqrt()));
    }
    let src = match fill {
        Fill::Random | Fill::Zeros => return,
        Fill::Value(v) => {
            let _ = view.f_fill_tensor_(&scalar(*v));
            return;
        }
        Fill::NonNegative => {
            let _ = view.f_abs_();
            return;
        }
        Fill::Indices(bound) => {
            Tensor::f_randint_low(0, (*bound).max(1), spec.shape.as_slice(), (kind, device))
        }
        Fill::Offsets(total) => {
            let n = spec.shape.iter().product::<i64>().max(1);
            let step = (*total / n).max(0);
            Tensor::f_arange(n, (kind, device))
                .and_then(|t| t.f_mul(&Tensor::from(step).to_device(device)))
                .and_then(|t| t.f_reshape(spec.shape.as_slice()))
        }
    };
    if let Ok(src) = src {
        let _ = view.f_copy_(&src);
    }
}

/// A zero tensor of the recorded shape, strides and dtype: the stand-in output of a failed op.
fn synthesise(spec: &TensorSpec, device: Device) -> Option<Tensor> {
    let mut t = ffi::empty_strided(
        &spec.shape,
        &spec.strides,
        spec.dtype.scalar_type_code() as i32,
        device,
    )
    .ok()?;
    let _ = t.f_zero_();
    Some(t)
}

fn push_args(
    stack: &mut Stack,
    step: &Step,
    slots: &[Option<Tensor>],
    device: Device,
) -> Result<(), String> {
    let op = step.op.as_ref().map_err(|e| e.clone())?;
    stack.clear();
    for a in &step.args {
        match a {
            Arg::Tensor(s) => match &slots[*s as usize] {
                Some(t) => stack.tensor(t),
                None => stack.undefined_tensor(),
            },
            Arg::UndefinedTensor => stack.undefined_tensor(),
            Arg::None => stack.none(),
            Arg::TensorList { slots: l, optional } => {
                let v: Vec<Option<&Tensor>> = l
                    .iter()
                    .map(|s| s.and_then(|s| slots[s as usize].as_ref()))
                    .collect();
                if *optional {
                    stack.opt_tensor_list(&v)
                } else {
                    stack.tensor_list(&v)
                }
            }
            Arg::Int(i) => stack.int(*i),
            Arg::Double(f) => stack.double(*f),
            Arg::Bool(b) => stack.bool(*b),
            Arg::Str(s) => stack.string(s),
            Arg::IntList(v) => stack.int_list(v),
            Arg::DoubleList(v) => stack.double_list(v),
            Arg::BoolList(v) => stack.bool_list(v),
            Arg::ScalarInt(i) => stack.scalar_int(*i),
            Arg::ScalarDouble(f) => stack.scalar_double(*f),
            Arg::ScalarBool(b) => stack.scalar_bool(*b),
            Arg::ScalarList(v) => stack.scalar_list(v),
            Arg::Device => stack.device(device),
            Arg::Default(k) => stack.default_of(op, *k)?,
        }
    }
    Ok(())
}

/// Puts the results of a call into their slots; returns false if they do not match the trace.
fn take_outputs(stack: &Stack, step: &Step, slots: &mut [Option<Tensor>]) -> bool {
    let mut ok = true;
    for (k, out) in step.outs.iter().enumerate() {
        if k >= stack.len() {
            ok &= matches!(out, Out::Ignore);
            continue;
        }
        match (out, stack.kind(k)) {
            (Out::Tensor(s), ffi::Kind::Tensor) => slots[*s as usize] = Some(stack.take_tensor(k)),
            (Out::List(ss), ffi::Kind::TensorList) => {
                for (s, t) in ss.iter().zip(stack.take_list(k)) {
                    if let Some(s) = s {
                        slots[*s as usize] = Some(t);
                    }
                }
            }
            (Out::Ignore, _) => {}
            _ => ok = false,
        }
    }
    ok
}

/// A step that is not run: outputs that are inputs of the same tensor pass through, the rest
/// are synthesised from the recorded specs.
fn pass_through(step: &Step, slots: &mut [Option<Tensor>], device: Device) {
    for (from, to) in &step.passthrough {
        slots[*to as usize] = slots[*from as usize].as_ref().map(|t| t.shallow_clone());
    }
    fill_missing_outputs(step, slots, device);
}

/// Whether an error says the device has no kernel for a half-precision dtype.
fn low_precision_gap(e: &str) -> bool {
    e.contains("not implemented for 'Half'")
        || e.contains("not implemented for 'BFloat16'")
        || e.contains("Low precision dtypes not supported")
}

/// Runs a step, with autograd when `grad`. Autograd refuses some calls the original made
/// without it (an in-place op on an input the replay made a parameter): those run plain, and the
/// refusal comes back (`Some`) so the caller runs that step plain from then on. A call that
/// fails plain too is a plain failure.
fn call_step_grad(
    stack: &mut Stack,
    step: &Step,
    slots: &mut [Option<Tensor>],
    device: Device,
    grad: bool,
) -> (Result<bool, String>, Option<String>) {
    match call_step(stack, step, slots, device, grad) {
        Err(e) if grad => {
            stack.clear();
            let plain = call_step(stack, step, slots, device, false);
            let refused = plain.is_ok().then(|| first_line(&e));
            (plain, refused)
        }
        res => (res, None),
    }
}

/// Runs one step. When the device lacks a half-precision kernel the op runs in float32 (its
/// half/bfloat16 tensor inputs cast up, its outputs cast back to the recorded dtype); returns
/// whether that fallback was used.
fn call_step(
    stack: &mut Stack,
    step: &Step,
    slots: &mut [Option<Tensor>],
    device: Device,
    grad: bool,
) -> Result<bool, String> {
    let first = push_args(stack, step, slots, device)
        .and_then(|()| stack.call(step.op.as_ref().map_err(|e| e.clone())?, grad));
    match first {
        Ok(()) => {
            if !take_outputs(stack, step, slots) {
                fill_missing_outputs(step, slots, device);
            }
            Ok(false)
        }
        Err(e) if low_precision_gap(&e) => {
            let up = |t: &Tensor| {
                if matches!(t.kind(), Kind::Half | Kind::BFloat16) {
                    t.to_kind(Kind::Float)
                } else {
                    t.shallow_clone()
                }
            };
            // Only this step's arguments are cast (it reads nothing else), not every live slot.
            let mut view: Vec<Option<Tensor>> = (0..slots.len()).map(|_| None).collect();
            for s in step.args.iter().flat_map(Arg::slots) {
                view[s as usize] = slots[s as usize].as_ref().map(up);
            }
            push_args(stack, step, &view, device)?;
            stack
                .call(step.op.as_ref().map_err(|e| e.clone())?, grad)
                .map_err(|e2| format!("{e} (and in float32: {e2})"))?;
            take_outputs(stack, step, &mut view);
            for (s, spec) in &step.out_specs {
                if let Some(t) = view[*s as usize].take() {
                    slots[*s as usize] = Some(t.to_kind(kind_of(spec.dtype)));
                }
            }
            fill_missing_outputs(step, slots, device);
            Ok(true)
        }
        Err(e) => Err(e),
    }
}

fn fill_missing_outputs(step: &Step, slots: &mut [Option<Tensor>], device: Device) {
    for (s, spec) in &step.out_specs {
        if slots[*s as usize].is_none() {
            slots[*s as usize] = synthesise(spec, device);
        }
    }
}

fn live_bytes(slots: &[Option<Tensor>]) -> u64 {
    let mut seen: HashMap<usize, usize> = HashMap::new();
    for t in slots.iter().flatten() {
        let (p, n) = ffi::storage_info(t);
        if p != 0 {
            seen.insert(p, n);
        }
    }
    seen.values().map(|&n| n as u64).sum()
}

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

/// Sets the process up as a warm model's and materialises the external inputs (with
/// `autograd`, the parameters require grad). Every way of running a plan starts here.
fn prepare_inputs(
    plan: &Plan,
    device: Device,
    autograd: bool,
) -> Result<Vec<Option<Tensor>>, ReplayError> {
    keep_freed_memory();
    // Synthetic values can decay into denormals the original's real ones never reached (an
    // optimizer's second moment under a stand-in beta): each op on them takes the CPU's
    // microcode path: one of AdamW's sqrt calls on the transformer took 950 us; all 24 take
    // 0.16 ms per iteration once flushed.
    ffi::flush_denormal();
    let externals = materialise(plan, device)?;
    if autograd {
        require_grad(plan, &externals);
    }
    Ok(externals)
}

pub fn run(
    plan: &Plan,
    opts: &ReplayOptions,
    source: &str,
    ops_selected: usize,
) -> Result<(Report, Vec<Slice>), ReplayError> {
    let device = opts.device;
    if opts.progress {
        let mut per_storage: HashMap<(u64, et_schema::DType), i64> = HashMap::new();
        for (_, s, _) in &plan.externals {
            let e = per_storage.entry((s.storage, s.dtype)).or_default();
            *e = (*e).max(s.extent() * s.dtype.size_bytes() as i64);
        }
        let bytes: i64 = per_storage.values().sum();
        eprintln!(
            "[replay] materialising {} external inputs (about {:.1} MiB) ...",
            plan.externals.len(),
            bytes as f64 / (1 << 20) as f64
        );
    }
    let externals = prepare_inputs(plan, device, opts.autograd)?;
    let mut no_grad = vec![false; plan.steps.len()];
    let mut grad_refused: BTreeMap<String, (usize, String)> = BTreeMap::new();
    let external_bytes = live_bytes(&externals);
    let mut stack = Stack::default();
    let clock = Clock::default();
    let total_iters = opts.warmup + opts.iters.max(1) + opts.instrument as usize;
    let mut profiled = Vec::new();
    let mut instrument_error = None;
    let mut first_nonfinite = None;
    let mut iter_ms = Vec::new();
    let mut op_ms = Vec::new();
    let mut faults: Option<u64> = Some(0);
    let mut failures: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut per_op: HashMap<&str, (usize, f64)> = HashMap::new();
    let mut peak = 0u64;
    let mut slices = Vec::new();
    let mut step_us: Vec<Vec<f64>> = if opts.per_step {
        vec![Vec::new(); plan.steps.len()]
    } else {
        Vec::new()
    };
    let gaps = opts
        .gaps_us
        .as_deref()
        .filter(|g| g.len() == plan.steps.len());
    let mut dtype_fallbacks: BTreeMap<String, usize> = BTreeMap::new();
    let (mut replayed, mut failed, mut skipped) = (0, 0, 0);
    for it in 0..total_iters {
        let instrumented = opts.instrument && it + 1 == total_iters;
        let measured = it >= opts.warmup && !instrumented;
        let last = it + 1 + opts.instrument as usize == total_iters;
        // Steps dispatched in the instrumented iteration, to find their profiler events.
        let mut dispatched: Vec<(usize, &str)> = Vec::new();
        let instr = if instrumented {
            match ffi::Instrumentation::start() {
                Ok(i) => Some(i),
                // The measured iterations stand; only the profiled windows are missing.
                Err(e) => {
                    instrument_error = Some(e);
                    break;
                }
            }
        } else {
            None
        };
        // External slots persist (in-place updates carry over); intermediates start empty.
        let mut slots: Vec<Option<Tensor>> = externals
            .iter()
            .map(|t| t.as_ref().map(|t| t.shallow_clone()))
            .collect();
        let (mut it_replayed, mut it_failed, mut it_skipped) = (0, 0, 0);
        let faults_before = metrics::minor_page_faults().filter(|_| measured);
        let mut sum_ops = 0.0;
        let mut excluded_us = 0.0;
        let t_iter = clock.now_us();
        // A gap is the time from the previous op's end to this op's start: the replay's own
        // bookkeeping in between (frees, stack handling) counts toward it, as the original's
        // tensor frees count toward its gaps.
        let mut last_op_end = t_iter;
        for (pos, step) in plan.steps.iter().enumerate() {
            if let Some(g) = gaps {
                // Busy, like the Python and autograd work it stands for.
                let until = last_op_end + g[pos];
                while clock.now_us() < until {
                    std::hint::spin_loop();
                }
            }
            if step.elide || (step.collective && opts.only == et_graph::Kind::Compute) {
                pass_through(step, &mut slots, device);
                if step.elide {
                    it_replayed += 1;
                } else {
                    it_skipped += 1;
                }
                for s in &step.frees {
                    slots[*s as usize] = None;
                }
                continue;
            }
            if instrumented {
                dispatched.push((pos, step.name.as_str()));
            }
            let t0 = clock.now_us();
            let grad = opts.autograd && step.autograd && !no_grad[pos];
            let (res, refused) = call_step_grad(&mut stack, step, &mut slots, device, grad);
            if let Some(why) = refused {
                no_grad[pos] = true;
                grad_refused
                    .entry(step.name.clone())
                    .or_insert_with(|| (0, why))
                    .0 += 1;
            }
            let t1 = clock.now_us();
            last_op_end = t1;
            match res {
                Ok(upcast) => {
                    if upcast && it == 0 {
                        *dtype_fallbacks.entry(step.name.clone()).or_default() += 1;
                    }
                    it_replayed += 1;
                }
                Err(reason) => {
                    if opts.strict {
                        return Err(ReplayError::Strict {
                            op: step.name.clone(),
                            id: step.id,
                            reason,
                        });
                    }
                    if it == 0 {
                        *failures
                            .entry((step.name.clone(), first_line(&reason)))
                            .or_default() += 1;
                    }
                    fill_missing_outputs(step, &mut slots, device);
                    it_failed += 1;
                }
            }
            stack.clear();
            // Kept out of the timings: value checks read every output, and counting live
            // storages (first iteration) walks every slot. Not in the instrumented iteration:
            // the checks' own ops would be among the profiler's events.
            let check = opts.check_values && !instrumented && first_nonfinite.is_none();
            if check || it == 0 {
                let t_untimed = clock.now_us();
                if check && produced_nonfinite(step, &slots) {
                    first_nonfinite = Some(crate::NonFinite {
                        op: step.name.clone(),
                        id: step.id,
                        iteration: it,
                    });
                }
                if it == 0 {
                    peak = peak.max(live_bytes(&slots));
                }
                let spent = clock.now_us() - t_untimed;
                excluded_us += spent;
                last_op_end += spent;
            }
            for s in &step.frees {
                slots[*s as usize] = None;
            }
            if measured {
                let d = t1 - t0;
                sum_ops += d;
                if opts.per_step {
                    step_us[pos].push(d);
                }
                let e = per_op.entry(step.name.as_str()).or_default();
                e.0 += 1;
                e.1 += d;
                if last && opts.trace_out.is_some() {
                    slices.push(Slice {
                        name: step.name.clone(),
                        cat: "op",
                        ts: t0,
                        dur: d,
                        tid: 1,
                        args: serde_json::json!({"id": step.id}),
                    });
                }
            }
        }
        let t_end = clock.now_us();
        if let Some(instr) = instr {
            match instr.finish() {
                Ok(events) => profiled = match_profiled(&events, &dispatched, plan.steps.len()),
                Err(e) => instrument_error = Some(e),
            }
        }
        // Long iterations (big traces, slow devices) report as they finish; short ones stay quiet.
        if opts.progress && t_end - t_iter >= 500_000.0 {
            let kind = if measured { "measured" } else { "warm-up" };
            eprintln!(
                "[replay] iteration {}/{total_iters} ({kind}): {:.3} ms, {it_failed} failed",
                it + 1,
                (t_end - t_iter - excluded_us) / 1000.0
            );
        }
        if measured {
            faults = match (faults, faults_before, metrics::minor_page_faults()) {
                (Some(sum), Some(a), Some(b)) => Some(sum + b.saturating_sub(a)),
                _ => None,
            };
            iter_ms.push((t_end - t_iter - excluded_us) / 1000.0);
            op_ms.push(sum_ops / 1000.0);
        }
        if !instrumented {
            (replayed, failed, skipped) = (it_replayed, it_failed, it_skipped);
        }
    }
    // Values that diverged (NaN/Inf) send later iterations down kernel paths the original
    // never ran (e.g. max_pool2d 2.5x faster on NaN): count them for the report.
    let nonfinite_externals = externals.iter().flatten().filter(|t| nonfinite(t)).count();
    let n_iters = opts.iters.max(1) as f64;
    let mut ops: Vec<OpTiming> = per_op
        .into_iter()
        .map(|(name, (count, us))| OpTiming {
            op: name.to_string(),
            count: count / opts.iters.max(1),
            total_ms: us / 1000.0 / n_iters,
            mean_us: us / count.max(1) as f64,
        })
        .collect();
    ops.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms));
    let iter = Stats::of(&iter_ms);
    let opsum = Stats::of(&op_ms);
    let steps = (replayed + failed).max(1) as f64;
    let report = Report {
        trace: source.to_string(),
        device: format!("{device:?}").to_lowercase(),
        threads: tch::get_num_threads(),
        warmup: opts.warmup,
        iters: opts.iters.max(1),
        ops_selected,
        ops_replayed: replayed,
        ops_failed: failed,
        ops_skipped: skipped,
        failures: failures
            .into_iter()
            .map(|((op, reason), count)| Failure { op, count, reason })
            .collect(),
        iter_ms: iter,
        op_ms: opsum,
        overhead_us_per_op: ((iter.median
            - opsum.median
            - gaps.map_or(0.0, |g| g.iter().sum::<f64>() / 1000.0))
            * 1000.0
            / steps)
            .max(0.0),
        peak_bytes: peak,
        page_faults_per_iter: faults.map(|f| f as f64 / n_iters),
        nonfinite_externals,
        external_bytes,
        externals: plan.externals.len(),
        ops,
        fallbacks: fallbacks(plan)
            .into_iter()
            .chain(
                dtype_fallbacks
                    .into_iter()
                    .map(|(op, count)| crate::Fallback {
                        op,
                        count,
                        ran_as: format!(
                            "in float32: no half-precision kernel on {}",
                            format!("{device:?}").to_lowercase()
                        ),
                    }),
            )
            .chain(
                grad_refused
                    .into_iter()
                    .map(|(op, (count, reason))| crate::Fallback {
                        op,
                        count,
                        ran_as: format!("without autograd recording: {reason}"),
                    }),
            )
            .collect(),
        gaps_ms: gaps.map_or(0.0, |g| g.iter().sum::<f64>() / 1000.0),
        steps: plan
            .steps
            .iter()
            .zip(&step_us)
            .map(|(s, v)| crate::StepTiming {
                id: s.id,
                op: s.name.clone(),
                us: Stats::of(v).median,
            })
            .collect(),
        profiled,
        instrument_error,
        first_nonfinite,
    };
    Ok((report, slices))
}

/// Finds each dispatched step's event among the profiler's: the outermost events of this
/// thread, in order, matched by name. Extra outermost events (the casts of a float32
/// fallback, tensors made for a failed op) are skipped; a step whose name does not come up
/// within a few events is left unmatched rather than shifting every later match.
fn match_profiled(
    events: &[ffi::ProfiledEvent],
    dispatched: &[(usize, &str)],
    n_steps: usize,
) -> Vec<Option<crate::ProfiledStep>> {
    const LOOKAHEAD: usize = 8;
    let mut order: Vec<usize> = (0..events.len()).collect();
    order.sort_by_key(|&i| (events[i].start_ns, std::cmp::Reverse(events[i].end_ns)));
    // Outermost events with the number of events that start inside each.
    let mut top: Vec<(usize, u32)> = Vec::new();
    let mut open_end = 0u64;
    for &i in &order {
        let e = &events[i];
        if top.is_empty() || e.start_ns >= open_end {
            top.push((i, 0));
            open_end = e.end_ns;
        } else if let Some(t) = top.last_mut() {
            t.1 += 1;
        }
    }
    let t0 = top.first().map_or(0, |&(i, _)| events[i].start_ns);
    let us = |ns: u64| (ns.saturating_sub(t0)) as f64 / 1000.0;
    let mut out = vec![None; n_steps];
    let mut j = 0;
    for &(pos, name) in dispatched {
        let found = top[j.min(top.len())..]
            .iter()
            .take(LOOKAHEAD)
            .position(|&(i, _)| events[i].name == name);
        if let Some(k) = found {
            let (i, nested) = top[j + k];
            out[pos] = Some(crate::ProfiledStep {
                start_us: us(events[i].start_ns),
                end_us: us(events[i].end_ns),
                nested,
            });
            j += k + 1;
        }
    }
    out
}

fn first_line(s: &str) -> String {
    let l = s.lines().next().unwrap_or("").trim();
    if l.len() > 300 {
        format!(
            "{}...",
            &l[..l.char_indices().nth(300).map_or(l.len(), |c| c.0)]
        )
    } else {
        l.to_string()
    }
}

fn fallbacks(plan: &Plan) -> Vec<crate::Fallback> {
    let mut m: BTreeMap<(String, String), usize> = BTreeMap::new();
    for s in &plan.steps {
        if let Some(f) = &s.fallback {
            *m.entry((s.name.clone(), f.clone())).or_default() += 1;
        }
    }
    m.into_iter()
        .map(|((op, ran_as), count)| crate::Fallback { op, count, ran_as })
        .collect()
}

/// Every slot after a run, and the (op, reason) of each failure.
pub type Kept = (Vec<Option<Tensor>>, Vec<(String, String)>);

/// Runs the plan once without freeing anything and returns every slot and the failures: for
/// tests and tools that inspect the values a replay produced.
pub fn run_once_keep(plan: &Plan, device: Device) -> Result<Kept, ReplayError> {
    let mut slots = prepare_inputs(plan, device, true)?;
    let mut stack = Stack::default();
    let mut failures = Vec::new();
    for step in &plan.steps {
        if step.elide {
            pass_through(step, &mut slots, device);
            continue;
        }
        match call_step_grad(&mut stack, step, &mut slots, device, step.autograd).0 {
            Ok(_) => {}
            Err(e) => {
                failures.push((step.name.clone(), e));
                fill_missing_outputs(step, &mut slots, device);
            }
        }
        stack.clear();
    }
    Ok((slots, failures))
}
