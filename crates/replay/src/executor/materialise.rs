//! Materialising the external inputs once, on the plan's device, filled by the plan's rules.

use super::*;

/// Applies [`Plan::device_placement`] to the materialised external inputs.
pub(super) fn place_for_device(plan: &Plan, externals: &mut [Option<Tensor>]) {
    let (to_host, to_float) =
        plan.device_placement(&|s| externals.get(s).is_some_and(Option::is_some));
    for s in to_host {
        if let Some(t) = externals[s].as_mut() {
            if let Ok(c) = t.f_to_device(tch::Device::Cpu) {
                *t = c;
            }
        }
    }
    for s in to_float {
        if let Some(t) = externals.get_mut(s).and_then(Option::as_mut) {
            if matches!(t.kind(), Kind::Half | Kind::BFloat16) {
                if let Ok(c) = t.f_to_kind(Kind::Float) {
                    *t = c;
                }
            }
        }
    }
}

/// Outputs of `empty*` ops small enough to be Python scalars made tensors
/// (`torch.tensor(1.0)` records `aten::empty`, then an untraced copy of the value, then
/// `aten::to`): the replay has no value to copy, and the memory's garbage (3.6e17 in a bf16
/// GPT's optimizer step counters) would flow on. They get ones, which no consumer divides by
/// zero or overflows with; large `empty` buffers are written by the ops that follow and are
/// left alone (filling them would cost time the original did not spend).
pub(super) fn small_empties(plan: &Plan) -> Vec<Vec<crate::plan::Slot>> {
    const EMPTY: &[&str] = &[
        "aten::empty",
        "aten::empty_strided",
        "aten::new_empty",
        "aten::new_empty_strided",
        "aten::empty_like",
    ];
    plan.steps
        .iter()
        .map(|s| {
            if !EMPTY.contains(&s.name.as_str()) {
                return Vec::new();
            }
            s.out_specs
                .iter()
                .filter(|(_, spec)| spec.shape.iter().product::<i64>() <= 64)
                .map(|(slot, _)| *slot)
                .collect()
        })
        .collect()
}

/// Allocates the external inputs (those `needed`, by slot; all when `None`): one allocation per
/// trace storage (on CUDA carved from one arena), views into it, values that suit their
/// consumers (random floats; valid indices; sorted offsets). Returns them by slot, and the
/// arena's size (0 without one).
pub fn materialise(
    plan: &Plan,
    device: &Device,
    needed: Option<&[bool]>,
) -> Result<(Vec<Option<Tensor>>, u64), ReplayError> {
    let mut slots: Vec<Option<Tensor>> = (0..plan.n_slots).map(|_| None).collect();
    // Group by (storage, dtype): views of one storage share one allocation.
    let mut groups: BTreeMap<(u64, et_schema::DType), Vec<usize>> = BTreeMap::new();
    for (k, (slot, spec, _)) in plan.externals.iter().enumerate() {
        if needed.is_some_and(|n| !n[*slot as usize]) {
            continue;
        }
        groups
            .entry((spec.storage, spec.dtype))
            .or_default()
            .push(k);
    }
    let flats: Vec<(TensorSpec, Vec<usize>)> = groups
        .into_iter()
        .map(|((_, dtype), members)| {
            let extent = members
                .iter()
                .map(|&k| plan.externals[k].1.extent())
                .max()
                .unwrap_or(0)
                .max(1);
            (TensorSpec::flat(dtype, extent), members)
        })
        .collect();
    // On CUDA, one arena for them all, each storage at a 256-byte boundary (what cudaMalloc
    // guarantees, and more than any kernel's vector loads need).
    let align = |b: u64| b.div_ceil(256).saturating_mul(256);
    let total = flats
        .iter()
        .map(|(f, _)| align(f.bytes()))
        .fold(0u64, u64::saturating_add);
    let arena = usize::try_from(total).ok().and_then(|t| device.arena(t));
    let mut offset = 0u64;
    for (flat, members) in flats {
        let dtype = flat.dtype;
        let mut base = match &arena {
            Some(a) => a.tensor(offset as usize, &flat),
            None => device.empty_strided(&flat),
        }
        .map_err(ReplayError::Materialise)?;
        offset += align(flat.bytes());
        // Floats get standard normal values, scaled per view below; integers and bools start
        // at zero and index inputs are filled per view below.
        if matches!(
            dtype,
            et_schema::DType::BFloat16 | et_schema::DType::Float16
        ) {
            // Drawn in float32 and rounded: libtorch's half-precision normal_ draws its uniforms
            // in half precision too, and about one value in 150 comes out exactly 0 (bf16). An
            // optimizer's second moment of 0 beside a non-zero first moment then divides by its
            // eps alone: a bf16 GPT's AdamW step blew its weights to 2e4 and its next backward
            // to NaN.
            // In chunks: a float32 copy of a whole large buffer would need twice its memory.
            const CHUNK: i64 = 1 << 24;
            let n = flat.shape[0];
            let mut at = 0;
            while at < n {
                let len = CHUNK.min(n - at);
                // At least 1e-3 away from 0: a float32 draw closer than 2^-25 rounds to an
                // exact half-precision 0, and scaling per view (1/sqrt(fan-in)) by more again.
                let drawn = Tensor::f_randn([len], (Kind::Float, base.device())).and_then(|r| {
                    let mag = r.f_abs()?.f_clamp_min(1e-3)?;
                    let r = mag.f_where_self(&r.f_ge(0.0)?, &mag.f_neg()?)?;
                    base.f_narrow(0, at, len)?.f_copy_(&r)
                });
                if let Err(e) = drawn {
                    log::warn!("random half-precision input: {e}; zeros instead");
                    let _ = base.f_narrow(0, at, n - at).and_then(|mut t| t.f_zero_());
                    break;
                }
                at += len;
            }
        } else if dtype.is_floating_point() {
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
                .map_err(|e| {
                    ReplayError::Materialise(CallError::new(ErrorKind::Other, e.to_string()))
                })?;
            fill_view(&mut view, spec, fill, device);
            // The trace records a Python number passed to a Tensor overload (`-0.5 * kl` is
            // `mul.Tensor(kl, <0-dim double>)`) as a plain tensor, but PyTorch wrapped it, and
            // type promotion ignores a wrapped number's dtype. Left plain, the 0-dim double made
            // the product of a 0-dim float double, and every op downstream failed on it
            // (a VAE's KL term: its backward's `mm`, `mse_loss_backward`, Adam's `lerp_`).
            if spec.is_wrapped_number() {
                if let Err(e) = ffi::set_wrapped_number(&mut view) {
                    log::warn!("a 0-dim input could not be marked a wrapped number: {e}");
                }
            }
            slots[*slot as usize] = Some(view);
        }
    }
    Ok((slots, arena.map_or(0, |a| a.bytes as u64)))
}

/// A fused attention's log-sum-exp ([`ViewKind::AttentionLogsumexp`]) over query `q` and key
/// `k` (`[B, H, L, E]`, `[B, H, S, E]`): on CPU the flash kernel's own, run with the key as the
/// values too (the log-sum-exp does not read them), in O(L) memory; elsewhere
/// `logsumexp((q @ k^T) * scale, -1)` in float, the upper triangle (key after query) masked
/// out when `causal`, as the CPU kernel masks it. An error (never a panic) for other shapes: a
/// stored plan may hold anything.
pub(super) fn attention_logsumexp(
    q: &Tensor,
    k: &Tensor,
    causal: bool,
    scale: Option<f64>,
) -> Result<Tensor, tch::TchError> {
    let (qs, ks) = (q.size(), k.size());
    if qs.len() != 4 || ks.len() != 4 || qs[0] != ks[0] || qs[1] != ks[1] || qs[3] != ks[3] {
        return Err(tch::TchError::Shape(format!(
            "attention log-sum-exp of query {qs:?} and key {ks:?}"
        )));
    }
    if q.device() == tch::Device::Cpu {
        let (_, lse) = Tensor::f_internal_scaled_dot_product_flash_attention_for_cpu(
            q,
            k,
            k,
            0.0,
            causal,
            None::<Tensor>,
            scale,
        )?;
        return Ok(lse);
    }
    let q = q.f_to_kind(tch::Kind::Float)?;
    let k = k.f_to_kind(tch::Kind::Float)?;
    let scores = q
        .f_matmul(&k.f_transpose(-2, -1)?)?
        .f_mul_scalar(scale.unwrap_or(1.0 / (qs[3].max(1) as f64).sqrt()))?;
    let scores = if causal {
        let above =
            Tensor::f_ones([qs[2], ks[2]], (tch::Kind::Bool, scores.device()))?.f_triu(1)?;
        scores.f_masked_fill(&above, f64::NEG_INFINITY)?
    } else {
        scores
    };
    scores.f_logsumexp([-1i64].as_slice(), false)
}

/// Whether a float tensor holds NaN, and whether it holds an infinity.
pub(super) fn nan_inf(t: &Tensor) -> (bool, bool) {
    if !t.is_floating_point() {
        return (false, false);
    }
    let any = |m: Result<Tensor, tch::TchError>| {
        m.and_then(|m| m.f_any())
            .is_ok_and(|a| a.int64_value(&[]) != 0)
    };
    (any(t.f_isnan()), any(t.f_isinf()))
}

/// Whether a float tensor holds NaN or Inf.
pub(crate) fn nonfinite(t: &Tensor) -> bool {
    let (nan, inf) = nan_inf(t);
    nan || inf
}

/// Marks the plan's grad inputs (the parameters) as requiring grad, as the model's were, each
/// its own autograd base as an `nn.Parameter` is: a leaf detached from the storage's arena
/// tensor it was made a view of (it shares the storage). A view of the arena passes the arena's
/// flag (no grad) to the views ops take of it under no-grad mode, where a parameter's views
/// require grad, and kernels read the flag: `matmul` folds a batched input into one `mm` when
/// an operand requires grad, and runs a `bmm` otherwise (attention pooling's key projection
/// with a split of `in_proj_weight`: 19-20 us folded, 41-54 us as a bmm).
pub(super) fn require_grad(plan: &Plan, externals: &mut [Option<Tensor>]) {
    for &s in &plan.grad_inputs {
        if let Some(t) = &mut externals[s as usize] {
            let Ok(mut own) = t.f_detach() else { continue };
            if ffi::set_requires_grad(&mut own).is_ok() {
                *t = own;
            }
        }
    }
}

/// Shapes a view's values for its consumer. Best effort: libtorch refuses in-place writes to a
/// view whose elements overlap (an expanded input, stride 0), and such a view keeps the values
/// of its storage (standard normal floats, zero integers: valid indices). Only Tensor-argument
/// calls here: tch's Scalar-taking ones panic when libtorch reports an error.
pub(super) fn fill_view(view: &mut Tensor, spec: &TensorSpec, fill: &Fill, device: &Device) {
    let kind = kind_of(spec.dtype);
    let dev = device.tch();
    // Random values at the scale of an initialised model (std 1/sqrt(fan-in), like PyTorch's
    // default inits): activations keep their magnitude through a deep stack of layers instead
    // of growing by sqrt(fan-in) x std per layer to Inf (a 30-layer 1024-wide MLP did at 0.1),
    // and no value is denormal.
    if matches!(fill, Fill::Random | Fill::NonNegative) && spec.dtype.is_floating_point() {
        let fan_in = match spec.shape.as_slice() {
            [] | [_] => 100,
            [rows, ..] => (spec.shape.iter().product::<i64>() / (*rows).max(1)).max(1),
        };
        let _ = view.f_mul_(&device.scalar(1.0 / (fan_in as f64).sqrt()));
    }
    let src = match fill {
        Fill::Random => return,
        // Integer storages start at zero; float ones are random.
        Fill::Zeros => {
            if spec.dtype.is_floating_point() {
                let _ = view.f_zero_();
            }
            return;
        }
        Fill::Value(v) => {
            let _ = view.f_fill_tensor_(&device.scalar(*v));
            return;
        }
        Fill::NonNegative => {
            let _ = view.f_abs_();
            return;
        }
        Fill::Indices(bound) => {
            Tensor::f_randint_low(0, (*bound).max(1), spec.shape.as_slice(), (kind, dev))
        }
        Fill::Probability => {
            let _ = view.f_uniform_(0.0, 1.0);
            return;
        }
        Fill::Ints(values) => Tensor::f_from_slice(values)
            .and_then(|t| t.f_reshape(spec.shape.as_slice()))
            .and_then(|t| t.f_to_device(dev))
            .and_then(|t| t.f_to_kind(kind)),
        Fill::Sorted(x) => {
            // Each row (along the last dimension) from -x to x.
            let n = spec.shape.last().copied().unwrap_or(1).max(1);
            Tensor::f_linspace(-*x, *x, n, (kind, dev))
                .and_then(|t| t.f_expand(spec.shape.as_slice(), false))
                .and_then(|t| t.f_contiguous())
        }
        Fill::Offsets(total) => {
            let n = spec.shape.iter().product::<i64>().max(1);
            let step = (*total / n).max(0);
            Tensor::f_arange(n, (kind, dev))
                .and_then(|t| t.f_mul(&Tensor::from(step).to_device(dev)))
                .and_then(|t| t.f_reshape(spec.shape.as_slice()))
        }
    };
    if let Ok(src) = src {
        let _ = view.f_copy_(&src);
    }
}
