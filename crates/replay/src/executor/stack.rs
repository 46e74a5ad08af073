//! Marshalling a step's arguments onto libtorch's stack and its outputs back into slots.

use super::*;

pub(super) fn push_args(
    stack: &mut Stack,
    args: &[Arg],
    slots: &[Option<Tensor>],
    op: &ffi::Op,
    device: &Device,
    comm: Option<&Comm>,
) -> Result<(), CallError> {
    // The stack is empty here: every call path clears it after use (`settle`) or before a
    // retry, so no FFI call is spent clearing it again.
    debug_assert!(stack.is_empty());
    for (k, a) in args.iter().enumerate() {
        match a {
            Arg::Tensor(s) => match &slots[*s as usize] {
                Some(t) => stack.tensor(t),
                // The trace recorded a tensor here: passed as undefined, an optional one reads
                // as None, and a kernel told by another argument that it is there (batch
                // norm's backward in training, its saved statistics) reads through a null
                // pointer. The step fails instead.
                None => {
                    stack.clear();
                    return Err(CallError::new(
                        ErrorKind::InvalidArgument,
                        format!(
                            "argument {k}: the tensor the trace recorded there (slot {s}) was \
                             not made"
                        ),
                    ));
                }
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
            Arg::TensorLists(lists) => {
                let v: Vec<Vec<Option<&Tensor>>> = lists
                    .iter()
                    .map(|l| {
                        l.iter()
                            .map(|s| s.and_then(|s| slots[s as usize].as_ref()))
                            .collect()
                    })
                    .collect();
                stack.tensor_lists(&v)
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
            Arg::Device => device.push_arg(stack),
            Arg::ProcessGroup(g) => match comm {
                Some(c) => stack.group(c, *g as i64)?,
                None => {
                    return Err(CallError::unsupported(
                        "a collective needs its peers: replay every rank together \
                         (mystique replay --ranks DIR) or this one under torchrun (RANK, WORLD_SIZE)",
                    ))
                }
            },
            Arg::ReduceOp(op) => stack.reduce_op(*op),
            Arg::Default(k) => stack.default_of(op, *k)?,
        }
    }
    Ok(())
}

/// Puts the results of a call into their slots; returns false if they do not match the trace.
pub(super) fn take_outputs(stack: &Stack, outs: &[Out], slots: &mut [Option<Tensor>]) -> bool {
    let mut ok = true;
    for (k, out) in outs.iter().enumerate() {
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
            (Out::List(ss), ffi::Kind::TensorLists) => {
                for (s, t) in ss.iter().zip(stack.take_flat(k)) {
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
