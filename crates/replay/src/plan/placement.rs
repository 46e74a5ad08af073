//! Where a replay on a device other than the CPU keeps each external input, and which it
//! makes float32: the plan's analysis alone (the executor moves the tensors).

use super::*;

impl Plan {
    /// The external inputs (by slot) a replay on a device other than the CPU keeps on the CPU
    /// (`HOST_ARGS`, or those they are made of through `KEEP_DEVICE` ops), and those it makes
    /// float32 (`ACC_STATS`); `is_external`: whether a slot holds an external input. The
    /// plan's analysis alone: the executor moves the tensors (`place_for_device`).
    pub fn device_placement(
        &self,
        is_external: &dyn Fn(usize) -> bool,
    ) -> (Vec<usize>, Vec<usize>) {
        let mut producer: HashMap<Slot, usize> = HashMap::new();
        for (pos, step) in self.steps.iter().enumerate() {
            for o in &step.outs {
                if let Out::Tensor(s) = o {
                    producer.insert(*s, pos);
                }
            }
        }
        // The external a slot is made of on its device, if any.
        let source = |mut slot: Slot| {
            for _ in 0..8 {
                if is_external(slot as usize) {
                    return Some(slot as usize);
                }
                let step = &self.steps[*producer.get(&slot)?];
                if !KEEP_DEVICE.contains(&step.name.as_str())
                    || step.args.iter().any(|a| matches!(a, Arg::Device))
                {
                    return None;
                }
                match step.args.first() {
                    Some(Arg::Tensor(s)) => slot = *s,
                    _ => return None,
                }
            }
            None
        };
        let mut to_host = Vec::new();
        let mut to_float = Vec::new();
        for step in &self.steps {
            let name = step.name.as_str();
            let at = |k: usize| match step.args.get(k) {
                Some(Arg::Tensor(s)) => Some(*s),
                _ => None,
            };
            let overload = self.op_of(step).map_or("", |o| o.overload.as_str());
            for (_, _, k) in HOST_ARGS
                .iter()
                .filter(|(n, o, _)| *n == name && *o == overload)
            {
                to_host.extend(at(*k).and_then(source));
            }
            for (_, ks) in ACC_STATS.iter().filter(|(n, _)| *n == name) {
                to_float.extend(
                    ks.iter()
                        .filter_map(|&k| at(k))
                        .map(|s| s as usize)
                        .filter(|&s| is_external(s)),
                );
            }
        }
        (to_host, to_float)
    }
}

/// Tensor arguments libtorch requires on the CPU whatever the device, `(op, overload,
/// position)`: a packed sequence's lengths and batch sizes (`lstm.data` and its kin take the
/// batch sizes second; their `input` overloads have `hx` there, which stays on the device,
/// hence the overload). A CPU trace records them
/// on the CPU like everything else; on another device the external inputs in these places stay
/// there, as a model on that device keeps them (made on the device, the replay's
/// `_pack_padded_sequence` failed: "'lengths' argument should be a 1D CPU int64 tensor").
pub(super) const HOST_ARGS: &[(&str, &str, usize)] = &[
    ("aten::_pack_padded_sequence", "", 1),
    ("aten::_pad_packed_sequence", "", 1),
    ("aten::_pack_padded_sequence_backward", "", 2),
    ("aten::lstm", "data", 1),
    ("aten::gru", "data", 1),
    ("aten::rnn_tanh", "data", 1),
    ("aten::rnn_relu", "data", 1),
];

/// A normalization's saved statistics, `(backward op, positions)`, which the CPU keeps in a
/// half-precision input's own dtype and CUDA in its accumulation type (float): a CPU trace's
/// bf16 `native_layer_norm_backward` stopped on CUDA at "expected scalar type Float but found
/// BFloat16" (gpt_bf16, the first GPU check). Such external inputs become float32 there.
pub(super) const ACC_STATS: &[(&str, &[usize])] = &[
    ("aten::native_layer_norm_backward", &[3, 4]),
    ("aten::native_group_norm_backward", &[2, 3]),
    ("aten::native_batch_norm_backward", &[5, 6]),
];

/// Ops whose output is on their first argument's device when no device argument is given
/// (`lengths.to(torch.int64)` before `pack_padded_sequence`): a host argument made by them
/// stays on the CPU if their input does.
pub(super) const KEEP_DEVICE: &[&str] = &[
    "aten::to",
    "aten::_to_copy",
    "aten::contiguous",
    "aten::clone",
    "aten::detach",
    "aten::alias",
    "aten::view",
    "aten::reshape",
];
