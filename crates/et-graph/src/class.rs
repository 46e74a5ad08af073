//! Operator classes: what kind of node each trace node is.

use bitflags::bitflags;
use et_schema::{Node, OpSchema, Trace};

bitflags! {
    /// Classes of a node; several may hold at once (`ATEN | INPLACE | CPU`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct OpClass: u32 {
        /// An operator call (has an op schema, or is a collective record or a kernel).
        const OP = 1 << 0;
        /// `aten::` operator.
        const ATEN = 1 << 1;
        /// Operator of another namespace (`fbgemm::`, `c10d::`, `torchrec::`, ...).
        const CUSTOM = 1 << 2;
        /// Collective communication (`c10d::*`, `record_param_comms`, `nccl:*`, `gloo:*`, waits).
        const COLLECTIVE = 1 << 3;
        /// A PT2 / Triton kernel node.
        const KERNEL = 1 << 4;
        /// A record_function annotation (`## forward ##`, `ProfilerStep#3`, module names, ...).
        const ANNOTATION = 1 << 5;
        /// Runs in the backward pass (under an autograd engine evaluate_function, or `*Backward*`).
        const BACKWARD = 1 << 6;
        /// Returns an alias of an input and writes nothing (`view`, `t`, `as_strided`, ...).
        const VIEW = 1 << 7;
        /// Writes an input in place (`Tensor(a!)`, or a trailing `_`).
        const INPLACE = 1 << 8;
        /// Touches CPU tensors.
        const CPU = 1 << 9;
        /// Touches CUDA tensors.
        const CUDA = 1 << 10;
        /// The process or thread root node.
        const ROOT = 1 << 11;
        /// `ProfilerStep#N`.
        const ITERATION = 1 << 12;
    }
}

/// Whether a node name is one of the observer's process/thread roots.
pub fn is_root_name(name: &str) -> bool {
    name.starts_with("[pytorch|profiler|execution_")
}

pub(crate) fn is_collective(t: &Trace, n: &Node) -> bool {
    crate::summary::collective_name(t, n).is_some()
}

/// Classifies one node by itself (ancestry-dependent classes are added by the graph).
pub fn classify(t: &Trace, n: &Node, schema: Option<&OpSchema>) -> OpClass {
    let name = t.name(n);
    let mut c = OpClass::empty();
    if is_root_name(name) {
        return OpClass::ROOT;
    }
    let kernel =
        n.kernel_backend.is_some_and(|k| !t.str(k).is_empty()) || name.starts_with("triton_");
    let coll = is_collective(t, n);
    let has_schema = t.op_schema_str(n).is_some();
    // c10d ops carry no schema in older traces; record_param_comms is the collective's record.
    // Without a schema, a namespaced name is an op unless it is one of the autograd or profiler
    // record_function scopes (`torch::autograd::AccumulateGrad`, `autograd::engine::...`).
    let looks_op = name.contains("::")
        && !name.contains(' ')
        && ![
            "autograd::",
            "torch::autograd::",
            "profiler::",
            "cudaStream",
            "PyTorch Profiler",
        ]
        .iter()
        .any(|p| name.starts_with(p));
    if has_schema
        || kernel
        || (coll && (name == "record_param_comms" || name.starts_with("c10d::")))
        || (looks_op && !name.starts_with("##"))
    {
        c |= OpClass::OP;
        if name.starts_with("aten::") {
            c |= OpClass::ATEN;
        } else if name.contains("::") {
            c |= OpClass::CUSTOM;
        }
    } else {
        c |= OpClass::ANNOTATION;
        if name.starts_with("ProfilerStep#") {
            c |= OpClass::ITERATION;
        }
    }
    if coll {
        c |= OpClass::COLLECTIVE;
    }
    if kernel {
        c |= OpClass::KERNEL;
    }
    if name.contains("Backward") || name.starts_with("autograd::engine::evaluate_function") {
        c |= OpClass::BACKWARD;
    }
    if c.contains(OpClass::OP) {
        if let Some(s) = schema {
            let writes = s.mutates();
            let returns_alias = !s.returns.is_empty()
                && s.returns
                    .iter()
                    .all(|r| r.ty.alias().is_some_and(|a| !a.is_write));
            if writes {
                c |= OpClass::INPLACE;
            } else if returns_alias {
                c |= OpClass::VIEW;
            }
        } else if name.ends_with('_') && !name.ends_with("__") {
            c |= OpClass::INPLACE;
        }
    }
    let mut ts = Vec::new();
    for a in t.inputs(n).iter().chain(t.outputs(n)) {
        ts.clear();
        t.tensors_in(a.value, &mut ts);
        for &i in &ts {
            if let Some(d) = t.tensor(i).device {
                let d = t.str(d);
                if d.starts_with("cuda") {
                    c |= OpClass::CUDA;
                } else if d == "cpu" {
                    c |= OpClass::CPU;
                }
            }
        }
    }
    c
}
