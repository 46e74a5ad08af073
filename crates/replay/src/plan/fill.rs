//! Input-fill rules: the values an external input is made with, chosen from what its consumers
//! need (indices in range, positive lengths, sorted boundaries, probabilities), and scalars the
//! trace recorded rounded that the replay restores.

use super::codec::float;
use super::*;

/// External inputs first read inside an optimizer's step (`Optimizer.step#...` annotations) are
/// its state: Adam's moments, Adagrad's sums, momentum buffers. The trace records no values, and
/// torch creates that state as zeros (`zeros_like`, `full_like(p, initial_accumulator_value=0)`)
/// that the steps then fill: the replay does the same, and its own warm-up steps fill them as the
/// original's did. It matters for time, not only for health: rows that no step has touched stay
/// zero in the original (an embedding's rows outside the batch's indices, since their gradient is
/// zero), and kernels are not equally fast on every value (`sqrt` over zeros ran 6x slower than
/// over random values on the VM this was measured on; random state gave recsys_adagrad a third of
/// the original's time in that op). One-element inputs (hyper-parameters and step counts held as
/// tensors) keep their own fills, as do inputs whose consumer fixed their value.
pub(super) fn optimizer_state(externals: &mut [(Slot, TensorSpec, Fill)]) {
    for (_, spec, fill) in externals {
        let elements: i64 = spec.shape.iter().product();
        if spec.dtype.is_floating_point()
            && elements > 1
            && matches!(fill, Fill::Random | Fill::NonNegative)
        {
            *fill = Fill::Zeros;
        }
    }
}

/// Float arguments only valid when non-negative. Random signs there turn an optimizer's first
/// step into NaN (Adam's `exp_avg_sq.sqrt()`), and NaN flows into every parameter and later
/// iteration, where kernels take paths the original never ran.
pub(super) fn needs_nonnegative(op: &str, arg_name: Option<&str>) -> bool {
    const OPS: &[&str] = &[
        "aten::sqrt",
        "aten::sqrt_",
        "aten::rsqrt",
        "aten::rsqrt_",
        "aten::log",
        "aten::log_",
        "aten::log2",
        "aten::log10",
        "aten::_foreach_sqrt",
        "aten::_foreach_sqrt_",
        "aten::_foreach_rsqrt",
        "aten::_foreach_rsqrt_",
        "aten::_foreach_log",
        "aten::_foreach_log_",
    ];
    const ARGS: &[&str] = &[
        "running_var",
        "exp_avg_sqs",
        "max_exp_avg_sqs",
        "state_sums",
    ];
    // Arguments of one op: `kl_div`'s target is a distribution (its log where `log_target`;
    // a non-negative one is valid there too), and a negative one takes its log to NaN.
    const OP_ARGS: &[(&str, &str)] = &[("aten::kl_div", "target")];
    OPS.contains(&op) || arg_name.is_some_and(|a| ARGS.contains(&a) || OP_ARGS.contains(&(op, a)))
}

/// An argument an `nn.Module` passes its parameters as: `weight`, `bias`, `*_weight`,
/// `*_bias` (`in_proj_weight`, `qkv_bias`), an RNN's `params`.
pub(super) fn is_weight_like(name: &str) -> bool {
    matches!(name, "weight" | "bias" | "params")
        || name.ends_with("_weight")
        || name.ends_with("_bias")
}

/// Values for the decays optimizers multiply their state by in place, which the trace does not
/// record (a Python number reaches `mul_` as a wrapped 0-dim double, its value dropped; Kineto
/// drops it too). 1, the neutral factor, never decays the state: SGD's momentum buffer then
/// sums every gradient so far and its steps grow without bound (wide_deep_sgd went NaN after
/// 116 replayed iterations). Where the next op on that state adds the complement as a recorded
/// scalar, an exponential average (`exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)`:
/// Adam, RMSprop's alpha, Adadelta's rho), the decay is 1 less it, exact. Otherwise (SGD's
/// `buf.mul_(momentum).add_(grad, alpha=1 - dampening)`, whose alpha says nothing of the
/// momentum) 0.9, the usual momentum, which keeps the buffer bounded.
pub(super) fn optimizer_decays(
    steps: &[Step],
    decays: &[(usize, usize)],
    externals: &mut [(Slot, TensorSpec, Fill)],
) {
    for &(k, e) in decays {
        let Some(Out::Tensor(state)) = steps[k].outs.first() else {
            continue;
        };
        let next = steps[k + 1..]
            .iter()
            .find(|s| s.args.first() == Some(&Arg::Tensor(*state)));
        let complement = next
            .filter(|s| s.name == "aten::addcmul_")
            .and_then(|s| match s.args.get(3) {
                Some(Arg::ScalarDouble(v)) => Some(*v),
                _ => None,
            })
            .filter(|v| *v > 0.0 && *v < 1.0);
        externals[e].2 = Fill::Value(complement.map_or(0.9, |v| 1.0 - v));
    }
}

/// Inputs whose values their consumer constrains: integers that index something get indices
/// valid for it; a loss's `total_weight` (saved by the forward op inside a composite the replay
/// does not look into) gets the target count it divides by, not a random divisor that scales
/// every gradient by up to 1e4 and drives SGD to Inf within a few iterations.
pub(super) fn consumer_fill(
    op: &str,
    arg_name: &str,
    args: &[et_schema::Arg],
    outs: &[et_schema::Arg],
    t: &Trace,
    schema: &OpSchema,
) -> Option<Fill> {
    // The recorded value of the schema argument of this name.
    let arg = |name: &str| -> Option<&et_schema::Arg> {
        let k = schema
            .args
            .iter()
            .position(|a| a.name.as_deref() == Some(name))?;
        args.get(k)
    };
    let shape_of = |name: &str| t.int_list(arg(name)?.shape);
    let int_arg = |name: &str| match arg(name)?.value {
        Value::Int(i) => Some(i),
        _ => None,
    };
    let dim_size = |tensor: &str| -> Option<i64> {
        let shape = shape_of(tensor)?;
        let d = int_arg("dim").unwrap_or(0);
        let d = if d < 0 { d + shape.len() as i64 } else { d };
        shape.get(d as usize).copied()
    };
    let base = op.trim_start_matches("aten::");
    match (base, arg_name) {
        (b, "total_weight") if b.starts_with("nll_loss") => Some(Fill::Value(
            shape_of("target").map_or(1, |s| s.iter().product::<i64>().max(1)) as f64,
        )),
        // A (log-)softmax output saved for backward: uniform probabilities over the softmax
        // dim, so the gradient the backward forms sums to zero like the real one does.
        ("_log_softmax_backward_data" | "_softmax_backward_data", "output") => {
            let n = dim_size("output")?.max(1) as f64;
            Some(Fill::Value(if base.starts_with("_log") {
                -n.ln()
            } else {
                1.0 / n
            }))
        }
        // A normalisation's statistics, saved by the forward op inside the composite the replay
        // runs whole (`layer_norm` -> `native_layer_norm`'s mean and rstd, `batch_norm`'s
        // saved mean and inverse std) and read by its backward: filled at random, a negative
        // or near-zero rstd scaled every gradient through the norm by a random sign and size,
        // and the weights drifted to NaN (layernorm_adadelta after 92-342 replayed
        // iterations, vit_train after 257). The statistics of normalised activations (mean 0,
        // scale 1) keep the backward's gradients at their input's scale.
        (b, "mean" | "save_mean") if b.starts_with("native_") && b.contains("norm_backward") => {
            Some(Fill::Value(0.0))
        }
        (b, "rstd" | "save_invstd") if b.starts_with("native_") && b.contains("norm_backward") => {
            Some(Fill::Value(1.0))
        }
        // A divisor no replayed op made (the norm `pairwise_distance` computes inside
        // `triplet_margin_loss`, divided by in `NormBackward1`): random values around zero make
        // the quotient heavy-tailed, and the gradients through it drove triplet_mlp_sgd's
        // embeddings to NaN after 75 replayed iterations. 1 keeps the dividend's scale.
        ("div" | "div_", "other") => Some(Fill::Value(1.0)),
        (b, "indices") if b.contains("embedding") => {
            Some(Fill::Indices(shape_of("weight")?.first().copied()?))
        }
        (b, "offsets") if b.contains("embedding_bag") => {
            Some(Fill::Offsets(shape_of("indices")?.iter().product()))
        }
        (
            "index_select" | "gather" | "scatter" | "scatter_" | "scatter_add" | "scatter_add_"
            | "index_add" | "index_add_" | "index_copy" | "index_copy_",
            "index",
        ) => Some(Fill::Indices(dim_size("self")?)),
        // Binary cross-entropy takes probabilities, not class indices.
        (b, "self" | "target")
            if b.starts_with("binary_cross_entropy") && !b.contains("logits") =>
        {
            Some(Fill::Probability)
        }
        // With logits, its input is any real, its target still a probability: a target outside
        // [0, 1] has no logit that minimises the loss, so SGD drove the logits, and the
        // weights under them, to Inf (dlrm_sgd and wide_deep_sgd went NaN after 58-64
        // replayed iterations).
        (b, "target") if b.starts_with("binary_cross_entropy_with_logits") => {
            Some(Fill::Probability)
        }
        (b, "target") if b.contains("nll_loss") || b.contains("cross_entropy") => {
            let s = shape_of("self")?;
            Some(Fill::Indices(if s.len() > 1 {
                s[1]
            } else {
                s.first().copied()?
            }))
        }
        // Bucket boundaries are sorted. Random ones made `bucketize`'s indices arbitrary in
        // [0, n], and n (a value past the last boundary), which the original's data never
        // reached, overflowed the scatter it indexed, sized by the boundaries
        // (int_hash_infer's `scatter_add_`). Synthetic values are at most standard normal
        // (scaled down by their fan-in): boundaries spread over [-8, 8] hold every one inside,
        // so the indices stay in [1, n - 1].
        ("bucketize", "boundaries") | ("searchsorted", "sorted_sequence") => {
            Some(Fill::Sorted(8.0))
        }
        // Lengths of padded sequences, longest first: the packed data the trace records holds
        // their sum (rows), and its batch sizes their maximum (one per time step).
        ("_pack_padded_sequence", "lengths") => {
            let n = shape_of("lengths")?.iter().product::<i64>();
            let total = t.int_list(outs.first()?.shape)?.first().copied()?;
            let longest = t.int_list(outs.get(1)?.shape)?.first().copied()?;
            Some(Fill::Ints(sequence_lengths(n, total, longest)))
        }
        _ => None,
    }
}

/// `n` sequence lengths, non-increasing, in [1, longest], the first `longest`, adding up to
/// `total` where they can (spread as evenly as possible over the others).
pub(super) fn sequence_lengths(n: i64, total: i64, longest: i64) -> Vec<i64> {
    let n = n.max(0) as usize;
    let longest = longest.max(1);
    if n == 0 {
        return Vec::new();
    }
    let rest = (total - longest).max(0);
    let others = (n - 1) as i64;
    let mut v = vec![longest];
    for i in 0..others {
        let share = rest / others + i64::from(i < rest % others);
        v.push(share.clamp(1, longest));
    }
    v
}

/// A scalar argument the trace recorded as 0 and the replay restored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Restored {
    pub step: usize,
    /// The schema's name for the argument (or its position).
    pub arg: String,
    #[serde(with = "float")]
    pub value: f64,
    pub why: String,
}

/// PyTorch's optimizers' default epsilon (Adam, AdamW, RMSprop, NAdam, RAdam).
pub(super) const OPTIMIZER_EPS: f64 = 1e-8;

/// The execution trace observer writes doubles with six decimals, so a scalar below 5e-7
/// arrives as 0: an optimizer's `eps=1e-8` among them (AdamW then divides 0 by 0 where a second
/// moment is 0). A recorded 0 is restored where it cannot have been meant:
/// - an argument named `eps`: to its schema default when that too is below 5e-7, else to the
///   optimizers' default 1e-8 (a recorded 0 says the value was below 5e-7);
/// - an argument whose schema default is itself below 5e-7 but non-zero (it would have been
///   written as 0 too);
/// - the scalar of an `add`/`_foreach_add` inside `Optimizer.step` (the optimizer adding its
///   eps to the denominator: adding 0 is no work a model asks for).
///
/// Returns the argument and, when restored, the value and why.
pub fn restore_rounded(
    op: &str,
    sa: &et_schema::SchemaArg,
    arg: Arg,
    in_optimizer_step: impl Fn() -> bool,
) -> (Arg, Option<(f64, String)>) {
    let zero = matches!(arg, Arg::Double(v) | Arg::ScalarDouble(v) if v == 0.0);
    if !zero {
        return (arg, None);
    }
    let default = sa
        .default
        .as_deref()
        .and_then(|d| d.parse::<f64>().ok())
        .filter(|d| *d != 0.0 && d.is_finite());
    let name = sa.name.as_deref().unwrap_or("");
    let value = if name == "eps" || name == "epsilon" {
        // A recorded 0 says the value was below 5e-7: the default only if it is too (a norm's
        // 1e-5 it cannot have been; BERT's layer_norm eps is 1e-12).
        let small_default = default.filter(|d| d.abs() < 5e-7);
        Some((
            small_default.unwrap_or(OPTIMIZER_EPS),
            format!(
                "`{name}` recorded as 0 (the trace keeps 6 decimals, so it was below 5e-7); restored to {}",
                if small_default.is_some() {
                    "its schema default"
                } else {
                    "1e-8"
                }
            ),
        ))
    } else if let Some(d) = default.filter(|d| d.abs() < 5e-7) {
        Some((
            d,
            format!("`{name}` recorded as 0, its default {d:e} rounds to 0 in the trace"),
        ))
    } else if matches!(
        op,
        "aten::_foreach_add_" | "aten::_foreach_add" | "aten::add_" | "aten::add"
    ) && matches!(name, "scalar" | "other")
        && in_optimizer_step()
    {
        Some((
            OPTIMIZER_EPS,
            "an optimizer step adds 0 (its eps, rounded to 0 in the trace); restored to 1e-8"
                .to_string(),
        ))
    } else {
        None
    };
    match value {
        Some((v, why)) => {
            let arg = match arg {
                Arg::Double(_) => Arg::Double(v),
                _ => Arg::ScalarDouble(v),
            };
            (arg, Some((v, why)))
        }
        None => (arg, None),
    }
}
