//! Autocast: the dtype a step's inputs were cast to by the original's autocast region.

use super::*;

/// Ops whose output dtype differs from their inputs' by their own doing (casts, explicit dtype
/// arguments), never a sign of autocast.
pub(super) const CASTS: &[&str] = &[
    "aten::to",
    "aten::_to_copy",
    "aten::type_as",
    "aten::copy_",
    "aten::_autocast_to_reduced_precision",
    "aten::_autocast_to_full_precision",
    "aten::view",
    "aten::empty_like",
    "aten::zeros_like",
    "aten::ones_like",
    "aten::full_like",
    "aten::rand_like",
    "aten::randn_like",
];

/// The autocast dtype a step ran under in the original, read off the dtypes the trace recorded:
/// a float32 input with only half-precision outputs (autocast's lower-precision ops: linear,
/// matmul, conv), half-precision inputs with only float32 outputs and no float32 input
/// (autocast's float32 ops: softmax, losses), or float32 and half inputs together with a half
/// output (an op that could not take mixed inputs outside autocast). Autocast only changes the
/// ops on its lists, so a step wrongly marked runs as it would have anyway.
pub fn autocast_of(step: &Step, dtypes: &[Option<et_schema::DType>]) -> Option<et_schema::DType> {
    use et_schema::DType;
    if step.op.is_none() || CASTS.contains(&step.name.as_str()) {
        return None;
    }
    let half = |d: &DType| matches!(d, DType::BFloat16 | DType::Float16);
    let mut ins: Vec<DType> = step
        .args
        .iter()
        .flat_map(Arg::slots)
        .filter_map(|s| dtypes.get(s as usize).copied().flatten())
        .filter(|d| d.is_floating_point())
        .collect();
    ins.sort_by_key(|d| *d as u8);
    ins.dedup();
    let mut outs: Vec<DType> = step
        .out_specs
        .iter()
        .map(|(_, s)| s.dtype)
        .filter(|d| d.is_floating_point())
        .collect();
    outs.sort_by_key(|d| *d as u8);
    outs.dedup();
    let f32_in = ins.contains(&DType::Float32);
    let half_in = ins.iter().find(|d| half(d)).copied();
    let half_out = outs.iter().find(|d| half(d)).copied();
    let only_f32_out = !outs.is_empty() && outs.iter().all(|d| *d == DType::Float32);
    match (f32_in, half_in, half_out) {
        // float32 in, half out (and that half type not among the inputs)
        (true, None, Some(h)) if outs.iter().all(half) => Some(h),
        // float32 and half in, half out
        (true, Some(h), Some(o)) if h == o => Some(h),
        // half in, float32 out (autocast's float32 list: norms, losses); with float32 inputs too
        // (a norm's float32 weight), since outside autocast mixed inputs promote only where
        // autocast would leave them alone
        (_, Some(h), None) if only_f32_out => Some(h),
        _ => None,
    }
}
